//! The `heatshield` binary: command line, logging, runtime, signals.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use tracing::{error, info, warn};

use heatshield::config::{Config, Overrides};
use heatshield::protocol::Request;
use heatshield::proxy::Proxy;
use heatshield::upstream::backend::{self, BackendOptions};
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
    if let Some(Tool::ColocateMigrate { rule, dry_run, max_keys }) = cli.command {
        std::process::exit(colocate_migrate(config, rule, dry_run, max_keys));
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
    let bar = indicatif::ProgressBar::hidden();
    let shown = bar.clone();
    let progress = Box::new(move |done: u64, of: u64| {
        if shown.length().is_none() {
            shown.set_length(of);
            shown.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            shown.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} keys {per_sec} eta {eta}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
        }
        shown.set_position(done);
    });
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

/// The options of heatshield's connections to the nodes, from the configuration.
fn backend_options(config: &Config) -> Result<BackendOptions, String> {
    let mut opts = BackendOptions {
        connect_timeout: config.connect_timeout(),
        command_timeout: config.command_timeout(),
        username: config.backend.username.clone(),
        password: config.backend.password.clone(),
        resp3: false,
        latency_sample_every: config.metrics.latency_sample_every,
        tracking: None,
        dedicated: false,
        dedicated_max: config.backend.dedicated_max_per_node,
        dedicated_idle: config.backend.dedicated_idle_per_node,
        tls: None,
        readonly: false,
    };
    if let Some(files) = config.backend.tls_files() {
        let c = heatshield::tls::Connector::new(files)
            .map_err(|e| format!("backend TLS: cannot load the certificates: {e}"))?;
        opts.tls = Some(Arc::new(c));
    }
    Ok(opts)
}

async fn run(config: Config, config_path: Option<PathBuf>, overrides: Overrides) -> i32 {
    let config_file = config_path.as_ref().map(|p| p.display().to_string());
    let opts = match backend_options(&config) {
        Ok(o) => o,
        Err(e) => {
            error!("{e}");
            return 1;
        }
    };
    let acceptor = match config.tls.files().map(heatshield::tls::Acceptor::new) {
        Some(Ok(a)) => Some(Arc::new(a)),
        Some(Err(e)) => {
            error!(error = %e, "TLS listener: cannot load the certificates");
            return 1;
        }
        None => None,
    };
    let workers = heatshield::worker::count(config.server.threads);
    let Some(bound) = listen(&config, workers).await else { return 1 };
    let Bound { listeners, http, offer, confirm } = bound;
    let cluster = Cluster::new(config.backing(), opts.clone(), config.backend.connections_per_node, workers);
    let b = &config.backend;
    let reads = heatshield::services::reads::Reads::new(b.read_from, b.replica_max_lag_ms, &b.read_rules, true);
    if reads.active() {
        // (before the first slot map: each carries the replicas' pools)
        cluster.read_replicas();
        heatshield::upstream::lag::spawn(
            cluster.clone(),
            std::time::Duration::from_millis(b.replica_check_interval_ms),
            std::time::Duration::from_millis(reads.max_lag_ms()),
        );
    }
    if cluster.is_cluster() {
        // Wait briefly for a first slot map; without one, requests get CLUSTERDOWN until
        // the refresher finds a node.
        match tokio::time::timeout(std::time::Duration::from_secs(5), cluster.refresh()).await {
            Ok(Ok(())) => info!(masters = cluster.topology().masters.len(), "slot map loaded"),
            Ok(Err(e)) => warn!(error = %e, "no seed node answered; will keep trying"),
            Err(_) => warn!("seed nodes did not answer in time; will keep trying"),
        }
    }
    cluster.spawn_refresher(config.refresh_interval());
    let proxy = Arc::new(Proxy::new(config, cluster.clone(), config_file, workers));
    let http = http.map(|l| {
        info!(listen = ?l.local_addr().ok(), "metrics at /metrics, health at /live and /ready");
        tokio::spawn(heatshield::front::http::serve(proxy.clone(), l))
    });
    spawn_gauges(proxy.clone());
    heatshield::services::cache::tracking::start(proxy.cache.clone(), proxy.client_side.clone(), proxy.cluster.clone());
    heatshield::services::locks::start(proxy.locks.clone(), proxy.cluster.clone());
    heatshield::services::pubsub::start(proxy.pubsub.clone());
    spawn_reloader(proxy.clone(), config_path, overrides);
    // (waits for the first sync, so the first clients meet the fleet's parts)
    heatshield::services::fleet::start(proxy.fleet.clone(), proxy.ratelimit.clone(), proxy.cluster.clone()).await;
    spawn_tls_reloader(acceptor.clone(), opts.tls.clone());
    // what the masters' command tables add to heatshield's (before the first client)
    heatshield::learn::start(proxy.clone()).await;
    // Learn the backends' version for HELLO/INFO; a node that does not answer in time
    // only leaves the default in place.
    let probe = async {
        let node = cluster.topology().masters.first()?.addr.clone();
        let (mut s, _) = backend::connect(&node, &opts).await.ok()?;
        let reply = backend::roundtrip(&mut s, Request::from_args(&["INFO", "server"]).raw()).await.ok()?;
        heatshield::face::info::redis_version_of(&reply)
    };
    if let Ok(Some(v)) = tokio::time::timeout(opts.command_timeout, probe).await {
        *proxy.redis_version.write() = v;
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let threads = match heatshield::front::server::spawn_workers(proxy.clone(), listeners, acceptor, stop_rx) {
        Ok(t) => t,
        Err(e) => {
            error!(error = %e, "cannot start worker threads");
            return 1;
        }
    };
    info!(listen = %proxy.config.server.listen, tls = ?proxy.config.tls.listen, workers, "heatshield ready");
    if let Some(c) = confirm {
        // (the workers accept: the old heatshield may drain now)
        let _ = tokio::task::spawn_blocking(move || c.serving()).await;
    }
    // the listeners, offered to a heatshield started with --takeover
    let taken = Arc::new(tokio::sync::Notify::new());
    let offer = offer
        .map(|(path, addrs, dups)| tokio::spawn(heatshield::front::handoff::offer(path, addrs, dups, taken.clone())));
    let handed = tokio::select! {
        _ = shutdown_signal() => false,
        _ = taken.notified() => true,
    };
    if handed {
        // the new heatshield accepts on these very sockets now: no grace
        proxy.health.draining.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = &http {
            h.abort();
        }
    } else {
        drain(&proxy).await;
    }
    // (the offer's copies of the sockets close with it, before the workers close theirs)
    if let Some(o) = offer {
        o.abort();
        let _ = o.await;
    }
    heatshield::services::fleet::leave(&proxy.fleet, &proxy.cluster).await;
    let _ = stop_tx.send(true);
    // Keep refreshing the topology while the workers drain.
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    0
}

/// What [`listen`] made: each worker's listeners, the HTTP port's, and what to offer a
/// heatshield started with `--takeover` (the handoff path, the addresses, copies of the
/// sockets).
struct Bound {
    listeners: Vec<heatshield::front::server::Listeners>,
    http: Option<tokio::net::TcpListener>,
    offer: Option<(PathBuf, heatshield::front::handoff::Addresses, heatshield::front::handoff::Sockets)>,
    /// After a takeover: to tell the old heatshield that this one serves.
    confirm: Option<heatshield::front::handoff::Confirm>,
}

/// Binds the clients' ports and the HTTP port, or, with `--takeover`, receives them from
/// the heatshield serving them (docs/fleet.md); None after logging why it cannot.
async fn listen(config: &Config, workers: usize) -> Option<Bound> {
    use heatshield::front::{handoff, server};
    let addrs = handoff::Addresses {
        plain: Some(config.server.listen.clone()).filter(|l| l != "off"),
        tls: config.tls.listen.clone(),
        http: Some(config.metrics.listen.clone()).filter(|l| l != "off"),
    };
    let path =
        handoff::path(&config.server.handoff_socket, addrs.plain.as_deref().or(addrs.tls.as_deref()).unwrap_or("none"));
    let mut got = handoff::Sockets::default();
    let mut received = false;
    let mut confirm = None;
    if config.server.takeover {
        match &path {
            Some(p) => match handoff::receive(p, &addrs) {
                Ok(Some((s, c))) => {
                    info!(path = %p.display(), plain = s.plain.len(), tls = s.tls.len(), "took over the listeners of the heatshield serving them");
                    got = s;
                    received = true;
                    confirm = Some(c);
                }
                Ok(None) => {
                    info!(path = %p.display(), "--takeover: no heatshield answers at the handoff socket; binding as usual")
                }
                Err(e) => {
                    error!(path = %p.display(), error = %e, "--takeover failed");
                    return None;
                }
            },
            None => warn!("--takeover with server.handoff_socket = \"off\": binding as usual"),
        }
    }
    // each worker's listeners: the received ones spread over the workers (one more
    // bound beside them for a worker left without), or freshly bound
    let spread =
        |given: Vec<std::net::TcpListener>, addr: Option<&String>| -> Option<Vec<Vec<std::net::TcpListener>>> {
            let Some(addr) = addr else { return Some((0..workers).map(|_| vec![]).collect()) };
            let fail = |e: std::io::Error| {
                let hint = if e.kind() == std::io::ErrorKind::AddrInUse && !config.server.takeover {
                    " (a heatshield serving it? start the new one with --takeover)"
                } else {
                    ""
                };
                error!(listen = %addr, error = %e, "cannot listen{hint}");
            };
            let mut out: Vec<Vec<std::net::TcpListener>> = (0..workers).map(|_| vec![]).collect();
            if !received {
                for (i, l) in server::bind(addr, workers).map_err(fail).ok()?.into_iter().enumerate() {
                    out[i % workers].push(l);
                }
                return Some(out);
            }
            for (i, l) in given.into_iter().enumerate() {
                out[i % workers].push(l);
            }
            let at: std::net::SocketAddr = addr.parse().ok()?;
            for w in out.iter_mut().filter(|w| w.is_empty()) {
                w.push(server::bind_beside(at).map_err(fail).ok()?);
            }
            Some(out)
        };
    let plain = spread(std::mem::take(&mut got.plain), addrs.plain.as_ref())?;
    let tls = spread(std::mem::take(&mut got.tls), addrs.tls.as_ref())?;
    // Before anything binds a metric handle: handles made earlier would stay no-ops.
    let http = match config.metrics_addr() {
        Some(addr) => {
            if let Err(e) = heatshield::metrics::install() {
                error!(error = %e, "cannot record metrics");
                return None;
            }
            let l = match got.http.take() {
                Some(l) => tokio::net::TcpListener::from_std(l),
                None => tokio::net::TcpListener::bind(addr).await,
            };
            match l {
                Ok(l) => Some(l),
                Err(e) => {
                    error!(listen = %addr, error = %e, "cannot serve metrics");
                    return None;
                }
            }
        }
        None => None,
    };
    // copies of every socket, for the next heatshield
    let dup = |ls: &[Vec<std::net::TcpListener>]| ls.iter().flatten().filter_map(|l| l.try_clone().ok()).collect();
    let dups = handoff::Sockets {
        plain: dup(&plain),
        tls: dup(&tls),
        http: http.as_ref().and_then(|l| {
            use std::os::fd::AsFd;
            l.as_fd().try_clone_to_owned().ok().map(std::net::TcpListener::from)
        }),
    };
    let listeners =
        plain.into_iter().zip(tls).map(|(plain, tls)| heatshield::front::server::Listeners { plain, tls }).collect();
    Some(Bound { listeners, http, offer: path.map(|p| (p, addrs, dups)), confirm })
}

/// The first step of a shutdown: `/ready` answers 503 at once, and clients are still
/// accepted and served for `server.drain_grace_ms`, so that a load balancer has time to
/// stop sending new ones (a second signal cuts it short). Then the workers close their
/// listeners and drain (`front::server::serve`).
async fn drain(proxy: &Proxy) {
    proxy.health.draining.store(true, std::sync::atomic::Ordering::Relaxed);
    let grace = std::time::Duration::from_millis(proxy.config.server.drain_grace_ms);
    if grace.is_zero() {
        return;
    }
    info!(
        grace_ms = grace.as_millis() as u64,
        "draining: /ready answers 503; still accepting clients for server.drain_grace_ms"
    );
    tokio::select! {
        _ = tokio::time::sleep(grace) => {}
        _ = shutdown_signal() => info!("a second signal: closing the listener now"),
    }
}

/// On SIGHUP, reloads the configuration file (`heatshield::reload`): what can change
/// live is applied, the rest is logged as needing a restart, and a file with any problem
/// is rejected whole.
fn spawn_reloader(proxy: Arc<Proxy>, path: Option<PathBuf>, overrides: Overrides) {
    if let Some(p) = path {
        let _ = proxy.reload_from.set((p, overrides));
    }
    #[cfg(unix)]
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
        while hup.recv().await.is_some() {
            info!("SIGHUP: reloading the configuration");
            if let Err(e) = heatshield::reload::from_file(&proxy) {
                warn!(error = %e, "SIGHUP: nothing reloaded");
            }
        }
    });
}

/// Reloads the certificates of the TLS listener and of backend TLS when their files
/// change (checked every second) and on SIGHUP; connections already open keep theirs.
fn spawn_tls_reloader(
    acceptor: Option<Arc<heatshield::tls::Acceptor>>,
    connector: Option<Arc<heatshield::tls::Connector>>,
) {
    use heatshield::tls::Reloadable;
    if acceptor.is_none() && connector.is_none() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let force = tokio::select! {
                _ = tick.tick() => false,
                Some(_) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            };
            #[cfg(not(unix))]
            let force = {
                tick.tick().await;
                false
            };
            let sides: [(&str, Option<&dyn Reloadable>); 2] = [
                ("TLS listener", acceptor.as_deref().map(|a| a as _)),
                ("backend TLS", connector.as_deref().map(|c| c as _)),
            ];
            for (side, r) in sides {
                let Some(r) = r else { continue };
                match r.reload(force) {
                    Ok(true) => {
                        heatshield::metrics::global().tls_reloads.increment(1);
                        info!(side, "certificates reloaded")
                    }
                    Ok(false) => {}
                    Err(e) => error!(side, error = %e, "certificates not reloaded; keeping the old ones"),
                }
            }
        }
    });
}

/// Refreshes the gauges that are sampled rather than counted, every second.
fn spawn_gauges(proxy: Arc<Proxy>) {
    tokio::spawn(async move {
        let g = heatshield::metrics::global();
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            g.uptime.set(proxy.started.elapsed().as_secs_f64());
            g.clients.set(proxy.stats.clients.load(std::sync::atomic::Ordering::Relaxed) as f64);
            g.slot_map_version.set(proxy.cluster.version() as f64);
            proxy.ratelimit.reclaim();
            proxy.ratelimit.publish_metrics();
            let fleet = proxy.fleet.view();
            g.fleet_members.set(fleet.members as f64);
            if let Some(at) = fleet.synced.filter(|_| proxy.fleet.enabled()) {
                g.fleet_sync_age.set(at.elapsed().as_secs_f64());
            }
            g.ratelimit_keys.set(proxy.ratelimit.tracked_keys() as f64);
            proxy.cache.publish_metrics();
            proxy.locks.publish_metrics();
            for node in proxy.cluster.pools() {
                let (mut up, mut connecting, mut down) = (0, 0, 0);
                for (_, b) in node.connections() {
                    match b.stats.state() {
                        heatshield::upstream::backend::ConnState::Up => up += 1,
                        heatshield::upstream::backend::ConnState::Connecting => connecting += 1,
                        heatshield::upstream::backend::ConnState::Down => down += 1,
                    }
                }
                heatshield::metrics::set_backend_connections(&node.addr, up, connecting, down);
            }
        }
    });
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    info!("shutdown signal received");
}
