//! The proxy process: [`Proxy`] spawns the `heatshield` binary built by cargo, waits
//! until it answers `PING`, and captures its stdout/stderr in a log. Unless the arguments
//! already contain `--metrics`, it is given `--metrics 127.0.0.1:<free port>`
//! ([`Proxy::metrics_addr`]), so proxies never collide on the default 127.0.0.1:9180.
//! [`run_bin`] runs the binary to completion (for invalid configurations, `--help`...),
//! [`config_file`] writes a configuration for it.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::client::ping_raw;
use super::ports::{free_port, local};
use super::process::{LOG_TAIL_LINES, exit_code, kill_child, lock, read_lossy, report_if_panicking, tail};
use super::{RedisCluster, RedisStandalone};

/// Writes `text` as heatshield.toml in a fresh temp dir; keep the dir alive while used.
pub fn config_file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new().prefix("heatshield-conf-").tempdir().expect("tempdir");
    let path = dir.path().join("heatshield.toml");
    std::fs::write(&path, text).expect("write config");
    let p = path.to_str().expect("utf-8 temp path").to_string();
    (dir, p)
}

/// A running heatshield process listening on `127.0.0.1:port()`, with
/// stdout+stderr captured in `<tempdir>/proxy.log`.
pub struct Proxy {
    child: Mutex<Child>,
    pid: u32,
    port: u16,
    /// Metrics listen address; `None` when `--metrics off` was passed.
    metrics: Option<String>,
    dir: TempDir,
    /// The Unix socket a heatshield offers its listeners on (`server.handoff_socket`'s
    /// default, made from the harness's listen address): a killed one leaves it behind.
    handoff: Option<PathBuf>,
}

/// `--threads 2` unless `args` (or the configuration file they name) set the worker count:
/// the default on a 2-core machine is one worker, and the tests should exercise what is
/// shared between workers (client lists, statistics, the pub/sub hub) as well.
fn threads_arg(args: &[String]) -> Vec<String> {
    let set_in_file = args.windows(2).any(|w| {
        (w[0] == "--config" || w[0] == "-c")
            && std::fs::read_to_string(&w[1]).is_ok_and(|t| t.lines().any(|l| l.trim_start().starts_with("threads")))
    });
    if set_in_file || args.iter().any(|a| a == "--threads" || a.starts_with("--threads=")) {
        return Vec::new();
    }
    vec!["--threads".to_string(), "2".to_string()]
}

/// The value of `--metrics` in `args` (`--metrics ADDR` or `--metrics=ADDR`),
/// if present. `Some(None)` means the flag is present without a value.
fn metrics_arg(args: &[String]) -> Option<Option<String>> {
    let mut iter = args.iter();
    while let Some(a) = iter.next() {
        if a == "--metrics" {
            return Some(iter.next().cloned());
        }
        if let Some(v) = a.strip_prefix("--metrics=") {
            return Some(Some(v.to_string()));
        }
    }
    None
}

/// The log file of every proxy this process started, by its port: a client whose
/// connection fails names what the proxy logged (a proxy shared by a binary's tests is a
/// static, never dropped, so its log is not printed by [`Drop`]).
static LOGS: Mutex<Vec<(u16, PathBuf)>> = Mutex::new(Vec::new());

/// The tail of the log of the heatshield listening on `port`, as a paragraph to append to
/// a failure's message; empty when no proxy of this process listens there.
pub fn log_tail_for(port: u16) -> String {
    let path = lock(&LOGS).iter().find(|(p, _)| *p == port).map(|(_, l)| l.clone());
    match path {
        Some(l) => {
            format!("\n----- heatshield {port} log tail -----\n{}\n-----", tail(&read_lossy(&l), LOG_TAIL_LINES))
        }
        None => String::new(),
    }
}

impl Proxy {
    /// Starts the heatshield binary built by cargo with `args` (in addition
    /// to `--listen 127.0.0.1:PORT`).
    pub fn start(args: &[&str]) -> Proxy {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Self::spawn_with(env!("CARGO_BIN_EXE_heatshield"), &args)
    }

    /// Starts a proxy in front of `cluster` (`--cluster <seeds>`).
    pub fn start_cluster(cluster: &RedisCluster, extra: &[&str]) -> Proxy {
        let seeds = cluster.seeds();
        let mut args = vec!["--cluster", seeds.as_str()];
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// Starts a proxy in front of a standalone server
    /// (`--standalone 127.0.0.1:P`).
    pub fn start_standalone(server: &RedisStandalone, extra: &[&str]) -> Proxy {
        let addr = server.addr();
        let mut args = vec!["--standalone", addr.as_str()];
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// Spawns `bin --listen 127.0.0.1:PORT args...` with `RUST_LOG=info`
    /// (unless RUST_LOG is set in the environment) and waits up to 20 s for
    /// `PING` to return `+PONG` (or, with a password, Redis's NOAUTH: it answers). Panics
    /// with the log if the process exits
    /// first or never answers.
    ///
    /// Unless `args` already contain `--metrics` (`--metrics ADDR` or
    /// `--metrics=ADDR`), `--metrics 127.0.0.1:<free_port()>` is added, which
    /// also overrides a `[metrics] listen` from a `--config` file; pass
    /// `--metrics` explicitly to test that key. The address is recorded in
    /// [`Proxy::metrics_addr`].
    pub fn spawn_with(bin: &str, args: &[String]) -> Proxy {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let proxy = Self::spawn_once(bin, args);
            match proxy.wait_ready(Duration::from_secs(20)) {
                Ok(()) => return proxy,
                Err(_) if attempt < 3 && proxy.log().contains("Address already in use") => {
                    continue; // `proxy` is dropped (and killed) here
                }
                Err(why) => {
                    let msg = format!(
                        "proxy {bin} {args:?} on port {} failed to start: {why}\n\
                         ----- proxy log -----\n{}\n-----",
                        proxy.port,
                        tail(&proxy.log(), LOG_TAIL_LINES),
                    );
                    drop(proxy); // kill before panicking: no duplicate log tail
                    panic!("{msg}");
                }
            }
        }
    }

    fn spawn_once(bin: &str, args: &[String]) -> Proxy {
        let dir = tempfile::Builder::new().prefix("heatshield-proxy-").tempdir().expect("create proxy tempdir");
        let port = free_port();
        let (metrics_args, metrics) = match metrics_arg(args) {
            Some(given) => (Vec::new(), given.filter(|v| !v.eq_ignore_ascii_case("off"))),
            None => {
                let addr = local(free_port());
                (vec!["--metrics".to_string(), addr.clone()], Some(addr))
            }
        };
        let log = File::create(dir.path().join("proxy.log")).expect("create proxy.log");
        lock(&LOGS).push((port, dir.path().join("proxy.log")));
        let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
        // `--listen` among the arguments (`--listen off`: TLS only) replaces the harness's
        let listen =
            if args.iter().any(|a| a == "--listen") { vec![] } else { vec!["--listen".to_string(), local(port)] };
        let child = Command::new(bin)
            .args(&listen)
            .args(&metrics_args)
            .args(threads_arg(args))
            .args(args)
            .env("RUST_LOG", rust_log)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone proxy.log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn proxy {bin}: {e}"));
        let handoff =
            (!listen.is_empty()).then(|| std::env::temp_dir().join(format!("heatshield-127-0-0-1-{port}.sock")));
        Proxy { pid: child.id(), child: Mutex::new(child), port, metrics, dir, handoff }
    }

    fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = lock(&self.child).try_wait() {
                return Err(format!("exited early with {status}"));
            }
            if matches!(ping_raw(self.port).as_deref(), Some(b"+PONG\r\n" | b"-NOAUTH Authentication required.\r\n")) {
                return Ok(());
            }
            // (started with a listener of its own: ready when it says so)
            if self.log().contains("heatshield ready") && ping_raw(self.port).is_none() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no +PONG within {timeout:?}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        local(self.port)
    }

    /// The address the metrics endpoint listens on (`http://ADDR/metrics`):
    /// the one added automatically or the one passed with `--metrics`;
    /// `None` when `--metrics off` was passed.
    pub fn metrics_addr(&self) -> Option<String> {
        self.metrics.clone()
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The CPU time the proxy process has used so far (user and system), in clock ticks
    /// (`/proc/PID/stat`): for ratios of work done, which other processes' load on the
    /// machine moves far less than it moves wall time.
    pub fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).expect("the proxy's /proc stat");
        // after the command name's closing parenthesis: state is field 3, utime 14, stime 15
        let rest = &stat[stat.rfind(')').expect("a /proc stat line") + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
    }

    /// Everything the proxy wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log_path())
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("proxy.log")
    }

    /// Sends a signal by name or number (`"TERM"`, `"HUP"`, `"9"`) via
    /// `kill -s SIG PID`. Panics if `kill` fails.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill").args(["-s", sig, &self.pid.to_string()]).status().expect("run kill");
        assert!(status.success(), "kill -s {sig} {} failed: {status}", self.pid);
    }

    /// Waits up to `timeout` for the process to exit. Returns its exit code
    /// (128 + N if killed by signal N), or `None` if it is still running.
    pub fn wait_exit(&self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = lock(&self.child).try_wait() {
                return Some(exit_code(status));
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// True while the process is running.
    pub fn is_alive(&self) -> bool {
        matches!(lock(&self.child).try_wait(), Ok(None))
    }

    /// SIGKILLs the proxy and reaps it. Idempotent.
    pub fn kill(&self) {
        kill_child(&mut lock(&self.child));
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
        // (SIGKILL gives no chance to remove it; left alone while a heatshield that took
        // over the port answers there)
        if let Some(path) = &self.handoff
            && std::os::unix::net::UnixStream::connect(path)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            let _ = std::fs::remove_file(path);
        }
        report_if_panicking("heatshield proxy", self.port, self.pid, || self.log());
    }
}

/// Runs the binary with `args`; returns (exit code, stdout, stderr). Fails if it does not
/// exit within 10 s (an invalid config must not start a server).
pub fn run_bin(args: &[&str]) -> (i32, String, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_heatshield"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("heatshield {args:?} did not exit within 10 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
