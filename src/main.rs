//! The `heatshield` binary: the command line, logging and the runtime; the process's life
//! itself (start-up, take-over, drain, reloads) is [`heatshield::life`].

use std::path::PathBuf;

use clap::Parser;

use heatshield::config::{Config, Overrides};
use heatshield::life::start::{backend_options, run};
use heatshield::upstream::cluster::Cluster;

/// A Redis-protocol proxy for Redis Cluster.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Configuration file (TOML); see conf/heatshield.toml.
    #[arg(long, short = 'c', global = true)]
    config: Option<PathBuf>,
    /// Address to listen on (overrides server.listen).
    #[arg(long)]
    listen: Option<String>,
    /// Redis Cluster seed nodes, HOST:PORT[,HOST:PORT...] (overrides [backend]).
    #[arg(long, conflicts_with = "standalone", global = true)]
    cluster: Option<String>,
    /// One standalone Redis server, HOST:PORT (overrides [backend]).
    #[arg(long, global = true)]
    standalone: Option<String>,
    /// Worker threads, 0 = one per core but one, at least one (overrides server.threads).
    #[arg(long)]
    threads: Option<usize>,
    /// Prometheus metrics listener, ADDR or "off" (overrides [metrics] listen).
    #[arg(long)]
    metrics: Option<String>,
    /// Log format.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Validate the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Take the listening sockets of the heatshield serving the address, which then drains (sets server.takeover).
    #[arg(long)]
    takeover: bool,
    #[command(subcommand)]
    command: Option<Tool>,
}

#[derive(clap::Subcommand, Debug)]
enum Tool {
    /// Move the keys a colocation rule covers that were written before it to their
    /// colocated names (docs/colocation.md); run it while the application is stopped.
    ColocateMigrate {
        /// The rule's name, as in the configuration's [[colocate]] tables.
        #[arg(long)]
        rule: String,
        /// Count the keys to move and list conflicts; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Stop after moving this many keys (0: all); run again to go on.
        #[arg(long, default_value_t = 0)]
        max_keys: u64,
    },
    /// Move the data to the cluster of [migration] (docs/migration.md).
    Migrate {
        #[command(subcommand)]
        phase: Phase,
    },
}

#[derive(clap::Subcommand, Debug)]
enum Phase {
    /// Compare every key of the source ([backend]) with the target ([migration]): exit
    /// code 0 when they hold the same data, 1 when keys differ, 2 when it could not run.
    Verify {
        /// How many differing keys to list (all are counted).
        #[arg(long, default_value_t = 20)]
        first: usize,
    },
    /// Copy every key of the source to the target, never over a newer copy; resumes where
    /// the last run stopped: exit code 0 when every key was copied, 1 when some failed or
    /// the run stopped early, 2 when it could not run.
    Backfill {
        /// Forget the progress of earlier runs and start over.
        #[arg(long)]
        restart: bool,
        /// Keys a second at most (0: no limit).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Stop after this many keys (0: all); run again to go on.
        #[arg(long, default_value_t = 0)]
        max_keys: u64,
    },
    /// Ask a running heatshield for a phase (PROXY MIGRATION <PHASE>): every instance
    /// with the target follows. A cutover, rollback or finish is waited for; exit code 0
    /// when it is done, 1 when it was refused or failed (nothing changed), 2 when the
    /// heatshield could not be asked.
    #[command(name = "phase")]
    Ask {
        /// status, shadow, dual-write, off, cutover, rollback or finish.
        #[arg(value_parser = ["status", "shadow", "dual-write", "off", "cutover", "rollback", "finish"])]
        phase: String,
        /// The running heatshield (default: server.listen of the configuration).
        #[arg(long)]
        proxy: Option<String>,
        /// A user and password to AUTH with first, as USER:PASSWORD.
        #[arg(long)]
        auth: Option<String>,
        /// How long to wait for a cutover, rollback or finish, in seconds.
        #[arg(long, default_value_t = 30)]
        wait: u64,
    },
}

fn main() {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    let ov = Overrides {
        listen: cli.listen.clone(),
        cluster: cli.cluster.clone(),
        standalone: cli.standalone.clone(),
        threads: cli.threads,
        metrics: cli.metrics.clone(),
        takeover: cli.takeover,
    };
    let config = match Config::load(cli.config.as_deref(), &ov) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("heatshield: {e}");
            std::process::exit(2);
        }
    };
    if cli.check {
        println!("configuration ok");
        return;
    }
    match cli.command {
        Some(Tool::ColocateMigrate { rule, dry_run, max_keys }) => {
            std::process::exit(colocate_migrate(config, rule, dry_run, max_keys));
        }
        Some(Tool::Migrate { phase }) => std::process::exit(migrate(config, phase)),
        None => {}
    }
    // The control runtime runs start-up, topology refreshes and signal handling; clients
    // are served by the worker threads (see heatshield::worker).
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("heatshield: cannot start runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(run(config, cli.config.clone(), ov));
    rt.shutdown_timeout(std::time::Duration::from_millis(200));
    std::process::exit(code);
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if format == "json" {
        b.json().init();
    } else {
        b.init();
    }
}

/// A progress bar on standard error, shown from the first report of a length.
fn progress_bar(unit: &'static str) -> (indicatif::ProgressBar, Box<dyn FnMut(u64, u64) + Send>) {
    let bar = indicatif::ProgressBar::hidden();
    let shown = bar.clone();
    let progress = Box::new(move |done: u64, of: u64| {
        if shown.length().is_none() {
            shown.set_length(of);
            shown.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            shown.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{{bar:40}} {{pos}}/{{len}} {unit} {{per_sec}} eta {{eta}}"
                ))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
        }
        shown.set_length(of.max(done));
        shown.set_position(done);
    });
    (bar, progress)
}

/// `heatshield migrate verify | backfill`: runs the phase with a progress bar and prints
/// its report.
fn migrate(config: Config, phase: Phase) -> i32 {
    use heatshield::services::migration::{backfill, verify};
    use std::time::Duration;
    if let Phase::Ask { phase, proxy, auth, wait } = &phase {
        let addr = proxy.clone().unwrap_or_else(|| config.server.listen.clone());
        let auth = auth.as_deref().map(|a| a.split_once(':').unwrap_or(("default", a)));
        let asked = heatshield::services::migration::ask::run(
            &addr,
            auth,
            &phase.to_ascii_uppercase(),
            Duration::from_secs(*wait),
        );
        let (out, ok) = match asked {
            Ok(r) => r,
            Err(e) => {
                eprintln!("heatshield migrate phase: {e}");
                return 2;
            }
        };
        print!("{}", if out.ends_with('\n') { out } else { out + "\n" });
        return if ok { 0 } else { 1 };
    }
    let m = &config.migration;
    if !m.configured() {
        eprintln!("heatshield migrate: no [migration] target in the configuration (docs/migration.md)");
        return 2;
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return 2 };
    let (topts, sopts) = match backend_options(&config).and_then(|s| Ok((m.options(&s)?, s))) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("heatshield: {e}");
            return 2;
        }
    };
    let clusters = heatshield::services::migration::Clusters {
        source: Cluster::new(config.backing(), sopts.clone(), 1, 1),
        source_opts: sopts,
        target: Cluster::new(m.backing(), topts.clone(), 1, 1),
        target_opts: topts,
    };
    let (bar, mut progress) = progress_bar("keys");
    let result = match phase {
        Phase::Verify { first } => {
            let o = verify::Options {
                ttl_tolerance: Duration::from_millis(m.ttl_tolerance_ms),
                rechecks: m.verify_rechecks,
                recheck_delay: Duration::from_millis(m.verify_recheck_delay_ms),
                first,
                progress,
            };
            rt.block_on(verify::run(clusters, o)).map(|r| (r.render(), r.differences() > 0))
        }
        // (asked of a running heatshield: above)
        Phase::Ask { .. } => return 2,
        Phase::Backfill { restart, rate, max_keys } => {
            let shown = bar.clone();
            let progress = Box::new(move |done: u64, of: u64, bytes: u64, slots: u64| {
                progress(done, of);
                shown.set_message(format!("{:.1} MB, {slots} of 16384 slots done", bytes as f64 / 1e6));
            });
            let o = backfill::Options { restart, rate, max_keys, progress };
            rt.block_on(backfill::run(clusters, o)).map(|r| (r.render(), !r.complete || r.copied.failed > 0))
        }
    };
    bar.finish_and_clear();
    match result {
        Ok((text, bad)) => {
            print!("{text}");
            i32::from(bad)
        }
        Err(e) => {
            eprintln!("heatshield migrate: {e}");
            2
        }
    }
}

/// `heatshield colocate-migrate`: runs [`heatshield::migrate`] with a progress bar (on a
/// terminal) and prints what it did; exit code 0 when every key moved, 1 on conflicts or
/// an error.
fn colocate_migrate(config: Config, rule: String, dry_run: bool, max_keys: u64) -> i32 {
    let opts = match backend_options(&config) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("heatshield: {e}");
            return 1;
        }
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return 1 };
    let rules = heatshield::services::colocate::compile(&config.colocate).unwrap_or_default();
    let cluster = Cluster::new(config.backing(), opts.clone(), 1, 1);
    let (bar, progress) = progress_bar("keys");
    let o = heatshield::migrate::Options { rule: rule.clone(), dry_run, max_keys, progress };
    let result = rt.block_on(heatshield::migrate::run(cluster, opts, rules, o));
    bar.finish_and_clear();
    match result {
        Ok(out) => {
            let verb = if dry_run { "would move" } else { "moved" };
            println!(
                "rule {rule}: {} keys under their plain names; {verb} {}; finished {} copied earlier; {} gone meanwhile; {} conflicts",
                out.found,
                if dry_run { out.found - out.conflicts.len() as u64 - out.finished } else { out.moved },
                out.finished,
                out.gone,
                out.conflicts.len()
            );
            for (old, new) in out.conflicts.iter().take(20) {
                println!(
                    "conflict: {} -> {} exists with other contents; both left alone",
                    String::from_utf8_lossy(old),
                    String::from_utf8_lossy(new)
                );
            }
            i32::from(!out.conflicts.is_empty())
        }
        Err(e) => {
            eprintln!("heatshield colocate-migrate: {e} (nothing is lost: run it again to go on)");
            1
        }
    }
}
