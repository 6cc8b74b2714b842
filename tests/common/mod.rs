//! Shared integration-test harness for heatshield.
//!
//! This module owns every external process an integration test needs and
//! guarantees they are torn down again:
//!
//! * **Ports** – [`free_port`] is a process-wide registry handing out ports in
//!   `20000..=29999` on `127.0.0.1` (never twice per process), verified by
//!   binding both `P` and the cluster-bus port `P + 10000`.
//! * **Redis servers** – [`RedisServer`] is one non-daemonized `redis-server`
//!   child with its config, data and log in a private [`TempDir`].
//!   [`RedisStandalone`] wraps a single server, [`RedisCluster`] builds a
//!   3-master / 3-replica cluster and offers live topology queries
//!   (`masters`, `master_for_slot`, `replica_of`, ...), fault injection
//!   (`kill`) and convergence waits (`wait_ok`).
//! * **The proxy** – [`Proxy`] spawns the `heatshield` binary built by cargo,
//!   waits until it answers `PING`, and captures its stdout/stderr in a log.
//!   Unless the arguments already contain `--metrics`, it is given
//!   `--metrics 127.0.0.1:<free port>` ([`Proxy::metrics_addr`]), so proxies
//!   never collide on the default 127.0.0.1:9180.
//! * **HTTP** – [`http_get`] is a minimal HTTP/1.0 GET over a `TcpStream`
//!   (for `/metrics` and the Prometheus API).
//! * **Wire helpers** – [`cli`] shells out to `redis-cli`; [`raw_cmd`] /
//!   [`cmd`] speak RESP over a fresh `TcpStream`, with a small RESP2 parser
//!   ([`parse_resp`]) that also serves as the reply-completeness scanner.
//! * **Slots** – [`crc16`] / [`key_slot`] implement Redis Cluster hashing.
//!
//! Every process is killed with SIGKILL (and reaped) on `Drop`. If the drop
//! happens while the test thread is panicking, the tail of the process log is
//! printed to stderr so failures are diagnosable from `cargo test` output.
//!
//! The binaries used can be overridden with the `REDIS_SERVER` and
//! `REDIS_CLI` environment variables (defaults: `redis-server`, `redis-cli`).

#![allow(dead_code)]

pub mod client;

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Number of log lines printed when a process is dropped during a panic.
const LOG_TAIL_LINES: usize = 40;
/// Timeout for connects / reads / writes done by [`raw_cmd`] and friends.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Number of hash slots in Redis Cluster.
pub const SLOTS: u16 = 16384;

// ---------------------------------------------------------------------------
// Port registry
// ---------------------------------------------------------------------------

const PORT_LO: u16 = 20000;
const PORT_HI: u16 = 29999;
const PORT_SPAN: u32 = (PORT_HI - PORT_LO + 1) as u32;
/// Offset of the cluster-bus port Redis derives from the client port.
const BUS_OFFSET: u16 = 10000;

/// Process-wide state of [`free_port`].
struct PortRegistry {
    /// Next candidate, as an offset from `PORT_LO`. `None` until first use,
    /// then seeded from the process id so parallel test binaries start far
    /// apart from each other.
    cursor: Option<u32>,
    /// Every port ever handed out by this process.
    handed_out: BTreeSet<u16>,
}

static PORTS: Mutex<PortRegistry> = Mutex::new(PortRegistry { cursor: None, handed_out: BTreeSet::new() });

/// Locks a mutex, ignoring poisoning (a panicking test must not break the
/// teardown or the port registry for the other tests in the binary).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Returns a port `P` in `20000..=29999` such that `127.0.0.1:P` and
/// `127.0.0.1:P+10000` (the Redis cluster bus) are bindable right now.
///
/// A port is never returned twice within one process. The scan starts at an
/// offset derived from the process id so concurrently running test binaries
/// rarely probe the same ports; binding is still verified because other
/// processes may hold any of them. (There is an unavoidable race between the
/// check and the real bind; [`RedisServer`] and [`Proxy`] retry on
/// "Address already in use".)
pub fn free_port() -> u16 {
    let mut reg = lock(&PORTS);
    let start = *reg.cursor.get_or_insert_with(|| std::process::id().wrapping_mul(7919) % PORT_SPAN);
    for i in 0..PORT_SPAN {
        let offset = (start + i) % PORT_SPAN;
        let port = PORT_LO + offset as u16;
        if port == 6379 || reg.handed_out.contains(&port) {
            continue;
        }
        if bindable(port) && bindable(port + BUS_OFFSET) {
            reg.handed_out.insert(port);
            reg.cursor = Some((offset + 1) % PORT_SPAN);
            return port;
        }
    }
    panic!("free_port: no free port left in {PORT_LO}..={PORT_HI}");
}

// ---------------------------------------------------------------------------
// Generic helpers
// ---------------------------------------------------------------------------

/// Polls `f` every 20 ms until it returns true; panics mentioning `what` if
/// that does not happen within `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    poll(timeout, Duration::from_millis(20), what, || if f() { Ok(()) } else { Err("condition false".into()) });
}

/// Like [`wait_until`] but with a configurable interval, and the closure
/// explains *why* it is not done yet; the last reason ends up in the panic.
fn poll(timeout: Duration, interval: Duration, what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + timeout;
    loop {
        let reason = match f() {
            Ok(()) => return,
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what} (last state: {reason})");
        }
        thread::sleep(interval);
    }
}

/// Last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn read_lossy(path: &Path) -> String {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// `addr` string for a local port.
fn local(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// Kills (SIGKILL) and reaps a child; a no-op if it already exited.
fn kill_child(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = child.kill();
    child.wait().ok()
}

/// Maps an exit status to a shell-style code (128 + signal if signalled).
fn exit_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(-1)
}

// ---------------------------------------------------------------------------
// redis-cli and raw RESP
// ---------------------------------------------------------------------------

/// Runs `redis-cli -h 127.0.0.1 -p PORT args...` and returns its trimmed
/// stdout. Panics (showing stderr) if redis-cli fails. Note that redis-cli
/// exits 0 on error *replies*; those come back as text on stdout.
pub fn cli(port: u16, args: &[&str]) -> String {
    let port = port.to_string();
    let mut full = vec!["-h", "127.0.0.1", "-p", port.as_str()];
    full.extend_from_slice(args);
    cli_raw(&full)
}

/// Runs `redis-cli` with exactly `args`; trimmed stdout, panics on failure.
pub fn cli_raw(args: &[&str]) -> String {
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

/// Encodes one command as a RESP array of bulk strings.
pub fn encode_cmd(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A parsed RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `+...`
    Simple(String),
    /// `-...`
    Error(String),
    /// `:...`
    Int(i64),
    /// `$...`; `None` is the null bulk string `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*...`; `None` is the null array `*-1`.
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// Bulk or simple string payload as UTF-8 (lossy); `None` otherwise.
    pub fn text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Elements of a non-null array; `None` otherwise.
    pub fn items(&self) -> Option<&[Resp]> {
        match self {
            Resp::Array(Some(v)) => Some(v),
            _ => None,
        }
    }
}

/// Parses one RESP2 reply at the start of `buf`.
///
/// Returns the reply and the number of bytes it occupies, or `None` if `buf`
/// does not yet hold a complete reply (so this doubles as the completeness
/// scanner for socket reads). Panics on malformed input, since a test talking
/// to a broken peer should fail loudly rather than hang until a timeout.
pub fn parse_resp(buf: &[u8]) -> Option<(Resp, usize)> {
    let kind = *buf.first()?;
    let cr = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = &buf[1..cr];
    let after = cr + 2;
    let malformed =
        || -> ! { panic!("malformed RESP reply: {:?}", String::from_utf8_lossy(&buf[..buf.len().min(200)])) };
    let text = || String::from_utf8_lossy(line).into_owned();
    let int = || -> i64 { std::str::from_utf8(line).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| malformed()) };
    match kind {
        b'+' => Some((Resp::Simple(text()), after)),
        b'-' => Some((Resp::Error(text()), after)),
        b':' => Some((Resp::Int(int()), after)),
        b'$' => {
            let len = int();
            if len < 0 {
                return Some((Resp::Bulk(None), after));
            }
            let end = after + len as usize;
            if buf.len() < end + 2 {
                return None;
            }
            if &buf[end..end + 2] != b"\r\n" {
                malformed();
            }
            Some((Resp::Bulk(Some(buf[after..end].to_vec())), end + 2))
        }
        b'*' => {
            let count = int();
            if count < 0 {
                return Some((Resp::Array(None), after));
            }
            let mut items = Vec::with_capacity(count.min(1024) as usize);
            let mut pos = after;
            for _ in 0..count {
                let (item, used) = parse_resp(&buf[pos..])?;
                items.push(item);
                pos += used;
            }
            Some((Resp::Array(Some(items)), pos))
        }
        _ => malformed(),
    }
}

/// Length of the first complete RESP2 reply in `buf`, if there is one.
pub fn resp_reply_len(buf: &[u8]) -> Option<usize> {
    parse_resp(buf).map(|(_, len)| len)
}

/// Sends `payload` over a fresh connection to `127.0.0.1:port` and reads
/// exactly one complete reply (extra bytes, if any, are discarded).
fn exchange(port: u16, payload: &[u8], timeout: Duration) -> io::Result<Vec<u8>> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(payload)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(len) = resp_reply_len(&buf) {
            buf.truncate(len);
            return Ok(buf);
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("connection closed after partial reply {:?}", String::from_utf8_lossy(&buf)),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sends one command (RESP array) over a fresh connection and returns the
/// raw bytes of exactly one complete reply. I/O errors are returned.
pub fn try_raw_cmd(port: u16, args: &[&[u8]]) -> io::Result<Vec<u8>> {
    exchange(port, &encode_cmd(args), IO_TIMEOUT)
}

/// Like [`try_raw_cmd`] but panics on I/O errors (10 s timeouts).
pub fn raw_cmd(port: u16, args: &[&[u8]]) -> Vec<u8> {
    try_raw_cmd(port, args).unwrap_or_else(|e| panic!("raw_cmd to port {port} {:?} failed: {e}", lossy_args(args)))
}

fn lossy_args(args: &[&[u8]]) -> Vec<String> {
    args.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// Sends a command of string arguments and returns the parsed reply.
pub fn try_cmd(port: u16, args: &[&str]) -> io::Result<Resp> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let raw = try_raw_cmd(port, &args)?;
    Ok(parse_resp(&raw).expect("exchange returns complete replies").0)
}

/// [`try_cmd`] that panics on I/O errors.
pub fn cmd(port: u16, args: &[&str]) -> Resp {
    try_cmd(port, args).unwrap_or_else(|e| panic!("cmd to port {port} {args:?} failed: {e}"))
}

/// Writes `text` as heatshield.toml in a fresh temp dir; keep the dir alive while used.
pub fn config_file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new().prefix("heatshield-conf-").tempdir().expect("tempdir");
    let path = dir.path().join("heatshield.toml");
    std::fs::write(&path, text).expect("write config");
    let p = path.to_str().expect("utf-8 temp path").to_string();
    (dir, p)
}

/// What most test files start once and share: a cluster, a proxy in front of it (with a
/// configuration file when `config` is given) and who owns each slot.
pub struct ClusterEnv {
    pub cluster: RedisCluster,
    pub proxy: Proxy,
    pub owners: client::SlotOwners,
    _conf: Option<tempfile::TempDir>,
}

impl ClusterEnv {
    pub fn start(config: Option<&str>) -> ClusterEnv {
        let cluster = RedisCluster::start();
        let (conf, proxy) = match config {
            Some(text) => {
                let (dir, path) = config_file(text);
                (Some(dir), Proxy::start_cluster(&cluster, &["--config", &path]))
            }
            None => (None, Proxy::start_cluster(&cluster, &[])),
        };
        let owners = client::SlotOwners::read(&cluster);
        ClusterEnv { cluster, proxy, owners, _conf: conf }
    }
}

/// `calls=` of `cmdstat_<name>` on a Redis node (0 if the command never ran there).
pub fn cmdstat_calls(port: u16, name: &str) -> u64 {
    let info = cli(port, &["INFO", "commandstats"]);
    match info_field(&info, &format!("cmdstat_{name}")) {
        None => 0,
        Some(line) => line
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("bad cmdstat_{name} line {line:?}")),
    }
}

/// Tests of one binary that send data commands through a shared cluster hold the read
/// side; a test that reads the masters' counters (`INFO commandstats`, cache statistics)
/// holds the write side, so those count only its own commands.
static QUIET: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub fn shared_traffic() -> std::sync::RwLockReadGuard<'static, ()> {
    QUIET.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive_traffic() -> std::sync::RwLockWriteGuard<'static, ()> {
    QUIET.write().unwrap_or_else(|e| e.into_inner())
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
        Ok(r) => r.text().ok_or_else(|| format!("{port}: unexpected {args:?} reply {r:?}")),
        Err(e) => Err(format!("{port}: {args:?} failed: {e}")),
    }
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

/// `GET path` over HTTP/1.0 to `addr` (`HOST:PORT`) on a plain `TcpStream`
/// with 10 s connect/read/write timeouts. Returns the status code and the
/// body (lossy UTF-8; a chunked body is decoded). Panics on I/O errors or a
/// malformed response; use [`try_http_get`] to handle them.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    try_http_get(addr, path).unwrap_or_else(|e| panic!("GET http://{addr}{path} failed: {e}"))
}

/// [`http_get`] returning I/O errors and malformed responses as `Err`.
pub fn try_http_get(addr: &str, path: &str) -> io::Result<(u16, String)> {
    use std::net::ToSocketAddrs;
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let sock = addr.to_socket_addrs()?.next().ok_or_else(|| bad(format!("cannot resolve {addr}")))?;
    let mut stream = TcpStream::connect_timeout(&sock, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;

    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad(format!("no end of headers in {:?}", String::from_utf8_lossy(&raw))))?;
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let body = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked { dechunk(body).map_err(bad)? } else { body.to_vec() };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Decodes an HTTP/1.1 chunked body (trailers are ignored).
fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n").ok_or("chunk size line not terminated")?;
        let size_text = String::from_utf8_lossy(&data[..eol]).into_owned();
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|e| format!("bad chunk size {size_hex:?}: {e}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

// ---------------------------------------------------------------------------
// Hash slots
// ---------------------------------------------------------------------------

/// CRC16-XMODEM (poly 0x1021, init 0), as used by Redis Cluster.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// Redis Cluster hash slot of `key`, honouring hash tags: if the key contains
/// `{` followed later by `}` with non-empty content in between, only that
/// content (between the first `{` and the first `}` after it) is hashed.
pub fn key_slot(key: &[u8]) -> u16 {
    let mut hashed = key;
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        hashed = &key[open + 1..open + 1 + len];
    }
    crc16(hashed) % SLOTS
}

// ---------------------------------------------------------------------------
// RedisServer
// ---------------------------------------------------------------------------

/// One `redis-server` child process (not daemonized) with a private tempdir
/// holding its config, data directory and log.
pub struct RedisServer {
    child: Mutex<Child>,
    pid: std::sync::atomic::AtomicU32,
    port: u16,
    dir: TempDir,
}

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
        Self::spawn(false, extra)
    }

    /// Starts a cluster-enabled server that is not yet part of any cluster.
    pub fn cluster_node(extra: &[&str]) -> RedisServer {
        Self::spawn(true, extra)
    }

    fn spawn(cluster: bool, extra: &[&str]) -> RedisServer {
        // Retry a couple of times in case another process grabbed the port
        // between free_port()'s check and redis-server's bind.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let server = Self::spawn_once(cluster, extra);
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

    fn spawn_once(cluster: bool, extra: &[&str]) -> RedisServer {
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
        conf.extend(extra.iter().map(|s| s.to_string()));
        let conf_path = path.join("redis.conf");
        fs::write(&conf_path, conf.join("\n") + "\n").expect("write redis.conf");

        let child = Self::spawn_child(path);
        RedisServer { pid: child.id().into(), child: Mutex::new(child), port, dir }
    }

    /// Runs `redis-server` on the `redis.conf` in `dir`, its output in `dir/stdio.log`.
    fn spawn_child(dir: &Path) -> Child {
        // Config errors are reported on stderr before the logfile is opened.
        let stdio = File::create(dir.join("stdio.log")).expect("create stdio.log");
        Command::new(redis_server_bin())
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
            if let Ok(reply) = exchange(self.port, b"PING\r\n", Duration::from_secs(1))
                && reply == b"+PONG\r\n"
            {
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
        self.kill();
        let child = Self::spawn_child(self.dir.path());
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
        if thread::panicking() {
            eprintln!(
                "----- redis-server {} (pid {}) log tail -----\n{}\n-----",
                self.port,
                self.pid(),
                tail(&self.log(), LOG_TAIL_LINES)
            );
        }
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

/// One slot range of a `CLUSTER SLOTS` reply: `(first, last, master_port)`.
type SlotRange = (u16, u16, u16);

/// A 6-node Redis Cluster (3 masters, 3 replicas) on 127.0.0.1.
///
/// Topology queries (`masters`, `master_for_slot`, `replica_of`) ask the live
/// nodes, so they reflect failovers.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Node ids, same order as `nodes` (ids never change, so they are cached
    /// and remain available for killed nodes).
    ids: Vec<String>,
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
        // Locals are dropped (killed) on unwind if anything below panics.
        let nodes: Vec<RedisServer> = (0..Self::NODES).map(|_| RedisServer::cluster_node(extra)).collect();

        let addrs: Vec<String> = nodes.iter().map(|n| n.addr()).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(|a| a.as_str()));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        cli_raw(&args);

        let ids = nodes
            .iter()
            .map(|n| match cmd(n.port(), &["CLUSTER", "MYID"]).text() {
                Some(id) => id,
                None => panic!("CLUSTER MYID on {} failed", n.port()),
            })
            .collect();
        let cluster = RedisCluster { nodes, ids };
        poll(Duration::from_secs(60), Duration::from_millis(50), "cluster formation", || cluster.check_formed());
        cluster
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
            if known.as_deref() != Some("6") {
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
        if masters != Self::MASTERS {
            return Err(format!("{masters} masters"));
        }
        Ok(())
    }
}

/// `CLUSTER SLOTS` of the node on `port` as sorted `(first, last, master)`.
fn slot_view(port: u16) -> Result<Vec<SlotRange>, String> {
    let reply = try_cmd(port, &["CLUSTER", "SLOTS"]).map_err(|e| format!("{port}: CLUSTER SLOTS failed: {e}"))?;
    let bad = || format!("{port}: unexpected CLUSTER SLOTS reply {reply:?}");
    let mut view = Vec::new();
    for entry in reply.items().ok_or_else(bad)? {
        match entry.items().ok_or_else(bad)? {
            [Resp::Int(lo), Resp::Int(hi), master, ..] => {
                let master_port = match master.items() {
                    Some([_, Resp::Int(p), ..]) => *p as u16,
                    _ => return Err(bad()),
                };
                view.push((*lo as u16, *hi as u16, master_port));
            }
            _ => return Err(bad()),
        }
    }
    view.sort_unstable();
    Ok(view)
}

/// Checks that sorted ranges cover `0..16384` exactly once.
fn check_coverage(view: &[SlotRange]) -> Result<(), String> {
    let mut next = 0u32;
    for &(lo, hi, _) in view {
        if lo as u32 != next || hi < lo {
            return Err(format!("slot gap/overlap at {next}: range {lo}-{hi}"));
        }
        next = hi as u32 + 1;
    }
    if next != SLOTS as u32 {
        return Err(format!("slots covered only up to {next}"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Proxy
// ---------------------------------------------------------------------------

/// A running heatshield process listening on `127.0.0.1:port()`, with
/// stdout+stderr captured in `<tempdir>/proxy.log`.
pub struct Proxy {
    child: Mutex<Child>,
    pid: u32,
    port: u16,
    /// Metrics listen address; `None` when `--metrics off` was passed.
    metrics: Option<String>,
    dir: TempDir,
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
    /// `PING` to return `+PONG`. Panics with the log if the process exits
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
        let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
        let child = Command::new(bin)
            .arg("--listen")
            .arg(local(port))
            .args(&metrics_args)
            .args(args)
            .env("RUST_LOG", rust_log)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone proxy.log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn proxy {bin}: {e}"));
        Proxy { pid: child.id(), child: Mutex::new(child), port, metrics, dir }
    }

    fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = lock(&self.child).try_wait() {
                return Err(format!("exited early with {status}"));
            }
            let ping = encode_cmd(&[b"PING"]);
            if let Ok(reply) = exchange(self.port, &ping, Duration::from_secs(1))
                && reply == b"+PONG\r\n"
            {
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
        if thread::panicking() {
            eprintln!(
                "----- heatshield proxy {} (pid {}) log tail -----\n{}\n-----",
                self.port,
                self.pid,
                tail(&self.log(), LOG_TAIL_LINES)
            );
        }
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
