//! Bounds: what one client can make heatshield hold. A client that pipelines large reads
//! and never reads its replies is held (not read from) and then disconnected, within the
//! documented memory, without slowing anyone else; a client that parks large requests on a
//! stalled backend is held by its in-flight request budget; idle clients cost little.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V};
use common::{ClusterEnv, cmd_text, http_get};

const MIB: u64 = 1024 * 1024;

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// Samples the proxy's RSS every 20 ms until stopped; returns the peak (KiB).
fn sample_peak(pid: u32, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            peak = peak.max(rss_kib(pid));
            thread::sleep(Duration::from_millis(20));
        }
        peak
    })
}

fn disconnects(env: &ClusterEnv, reason: &str) -> u64 {
    let (_, body) = http_get(&env.proxy.metrics_addr().expect("metrics"), "/metrics");
    let want = format!("heatshield_client_disconnects_total{{reason=\"{reason}\"}} ");
    body.lines().find_map(|l| l.strip_prefix(want.as_str())?.trim().parse().ok()).unwrap_or(0)
}

/// A raw client that pipelines `cmd` as fast as the socket takes it and never reads.
/// Returns (bytes it managed to send, when the proxy cut it off, if it did).
fn never_reads(port: u16, cmd: Vec<u8>, for_how_long: Duration) -> thread::JoinHandle<(u64, Option<Instant>)> {
    thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_nonblocking(true).expect("nonblocking");
        let chunk: Vec<u8> = cmd.repeat(200);
        let (mut sent, mut pos) = (0u64, 0usize);
        let end = Instant::now() + for_how_long;
        while Instant::now() < end {
            match s.write(&chunk[pos..]) {
                Ok(n) => {
                    sent += n as u64;
                    pos = (pos + n) % chunk.len();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    // nobody reads: is the connection still there?
                    let mut b = [0u8; 1];
                    if let Ok(0) = s.peek(&mut b) {
                        return (sent, Some(Instant::now()));
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return (sent, Some(Instant::now())),
            }
        }
        (sent, None)
    })
}

/// Three clients doing SET/GET round trips until stopped; returns (ops, slowest reply).
fn bystanders(port: u16, stop: Arc<AtomicBool>) -> Vec<thread::JoinHandle<(u64, Duration)>> {
    (0..3)
        .map(|i| {
            let stop = stop.clone();
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                let (mut ops, mut worst) = (0u64, Duration::ZERO);
                let key = format!("bystander:{i}");
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    assert_eq!(c.cmd(&["SET", &key, &ops.to_string()]), V::ok());
                    assert_eq!(c.cmd(&["GET", &key]), V::s(ops.to_string()));
                    worst = worst.max(t.elapsed() / 2);
                    ops += 1;
                }
                (ops, worst)
            })
        })
        .collect()
}

#[test]
fn a_client_that_never_reads_is_held_then_cut_and_bystanders_are_not_slowed() {
    // defaults but for a shorter soft-limit duration, so the test sees the cut
    let env = ClusterEnv::start(Some("[limits]\noutput_soft_seconds = 5\n"));
    let port = env.proxy.port();
    let big = "x".repeat(MIB as usize);
    let mut c = Conn::connect(port);
    assert_eq!(c.cmd(&["SET", "big", &big]), V::ok());
    thread::sleep(Duration::from_millis(300));
    let pid = env.proxy.pid();
    let base = rss_kib(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let peak = sample_peak(pid, stop.clone());
    let others = bystanders(port, stop.clone());
    let started = Instant::now();
    let attacker = never_reads(port, common::client::encode(&["GET", "big"]), Duration::from_secs(10));
    let (sent, cut_at) = attacker.join().expect("attacker");
    stop.store(true, Ordering::Relaxed);
    let peak = peak.join().expect("sampler");
    let grew_mib = peak.saturating_sub(base) as f64 / 1024.0;
    eprintln!(
        "attacker sent {} KiB of GETs; cut after {:?}; proxy RSS {} MiB -> peak {} MiB (+{grew_mib:.1} MiB)",
        sent / 1024,
        cut_at.map(|t| t - started),
        base / 1024,
        peak / 1024
    );
    for h in others {
        let (ops, worst) = h.join().expect("bystander");
        eprintln!("bystander: {ops} round trips, slowest reply {worst:?}");
        assert!(ops > 50, "a bystander made only {ops} round trips in 10 s");
        assert!(worst < Duration::from_secs(1), "a bystander waited {worst:?} for a reply");
    }
    // Held: the proxy stopped reading it long before it could send gigabytes.
    assert!(sent < 64 * MIB, "the proxy kept reading a client that does not read ({sent} bytes)");
    // Cut once it had been over its soft limit for output_soft_seconds (5 s).
    let cut = cut_at.expect("the client that never reads was not disconnected") - started;
    assert!(cut >= Duration::from_secs(4) && cut < Duration::from_secs(9), "cut after {cut:?}");
    // Memory: at most the first 32 replies in flight (a new client's window) plus the hard
    // limit, and far less than the gigabyte it took before.
    assert!(grew_mib < 128.0, "RSS grew by {grew_mib:.1} MiB");
    assert_eq!(disconnects(&env, "output_soft"), 1);
    assert!(env.proxy.log().contains("client disconnected: over its output limit"));
}

#[test]
fn past_the_hard_limit_a_client_is_cut_at_once_but_one_large_reply_is_always_delivered() {
    let env = ClusterEnv::start(Some("[limits]\noutput_soft_bytes = 1048576\noutput_hard_bytes = 8388608\n"));
    let port = env.proxy.port();
    let mut c = Conn::connect(port);
    let big = "y".repeat(MIB as usize);
    assert_eq!(c.cmd(&["SET", "big", &big]), V::ok());
    let huge = "z".repeat(12 * MIB as usize);
    assert_eq!(c.cmd(&["SET", "huge", &huge]), V::ok());
    // one reply larger than the hard limit: delivered whole
    assert_eq!(c.cmd(&["GET", "huge"]).bytes().len(), huge.len());
    let started = Instant::now();
    let attacker = never_reads(port, common::client::encode(&["GET", "big"]), Duration::from_secs(5));
    let (_, cut_at) = attacker.join().expect("attacker");
    let cut = cut_at.expect("not cut") - started;
    assert!(cut < Duration::from_secs(2), "cut after {cut:?}");
    assert_eq!(disconnects(&env, "output_hard"), 1);
    // the reading client was not touched
    assert_eq!(c.cmd(&["GET", "huge"]).bytes().len(), huge.len());
}

#[test]
fn requests_parked_on_a_stalled_backend_are_bounded_by_the_request_budget() {
    let env = ClusterEnv::start(Some("[limits]\nmax_inflight_request_bytes = 8388608\n"));
    let port = env.proxy.port();
    let pid = env.proxy.pid();
    let base = rss_kib(pid);
    // writes stall on every master for a few seconds
    for m in env.owners.masters() {
        assert_eq!(cmd_text(m, &["CLIENT", "PAUSE", "4000", "WRITE"]).trim(), "OK");
    }
    let value = "v".repeat(4 * MIB as usize);
    let stop = Arc::new(AtomicBool::new(false));
    let peak = sample_peak(pid, stop.clone());
    let sent = Arc::new(AtomicU64::new(0));
    let s2 = sent.clone();
    let writer = thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_write_timeout(Some(Duration::from_secs(2))).expect("timeout");
        let cmd = common::client::encode(&["SET", "parked", value.as_str()]);
        for _ in 0..64 {
            if s.write_all(&cmd).is_err() {
                break; // the proxy stopped reading: the rest waits in the socket
            }
            s2.fetch_add(cmd.len() as u64, Ordering::Relaxed);
        }
        s
    });
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let peak = peak.join().expect("sampler");
    let grew_mib = peak.saturating_sub(base) as f64 / 1024.0;
    let sent = sent.load(Ordering::Relaxed);
    eprintln!("client sent {} MiB of SETs into a stalled cluster; proxy RSS +{grew_mib:.1} MiB", sent / MIB);
    // 8 MiB budget + the request that crossed it + the read buffer and socket buffers
    assert!(grew_mib < 48.0, "RSS grew by {grew_mib:.1} MiB while writes were stalled");
    // once the pause ends the parked requests complete and the client is read again
    let mut s = writer.join().expect("writer");
    s.set_read_timeout(Some(Duration::from_secs(15))).expect("timeout");
    let mut got = vec![0u8; 5];
    s.read_exact(&mut got).expect("first reply after the pause");
    assert_eq!(&got, b"+OK\r\n");
}

#[test]
fn idle_clients_cost_little_memory() {
    let env = ClusterEnv::start(None);
    let port = env.proxy.port();
    let pid = env.proxy.pid();
    let _ = Conn::connect(port).cmd(&["PING"]);
    thread::sleep(Duration::from_millis(200));
    let base = rss_kib(pid);
    const N: usize = 5000;
    let mut conns = Vec::with_capacity(N);
    for _ in 0..N {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.write_all(b"PING\r\n").expect("ping");
        conns.push(s);
    }
    for s in &mut conns {
        let mut b = [0u8; 7];
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        s.read_exact(&mut b).expect("pong");
        assert_eq!(&b, b"+PONG\r\n");
    }
    thread::sleep(Duration::from_millis(300));
    let after = rss_kib(pid);
    let per_client = (after.saturating_sub(base) * 1024) as f64 / N as f64;
    eprintln!(
        "{N} idle clients: RSS {} MiB -> {} MiB, {:.1} KiB per client",
        base / 1024,
        after / 1024,
        per_client / 1024.0
    );
    assert!(per_client < 40.0 * 1024.0, "{per_client:.0} bytes per idle client");
}

/// A MGET refused by the rate limiter after part of it was found in the hot-key cache
/// charges no key: rules promise all-or-nothing.
#[test]
fn a_refused_mget_with_cached_keys_charges_no_key() {
    let env = ClusterEnv::start(Some(
        r#"
[cache]
pin = ["mx:p*"]

[[ratelimit.rules]]
name = "pinned"
pattern = "mx:p*"
commands = "reads"
rate = 1
burst = 2
scope = "per-key"
count_cached = true

[[ratelimit.rules]]
name = "plain"
pattern = "mx:q*"
commands = "reads"
rate = 1
burst = 1
scope = "per-key"
"#,
    ));
    for (k, v) in [("mx:p", "pv"), ("mx:q", "qv")] {
        assert_eq!(cmd_text(env.owners.of_key(k.as_bytes()), &["SET", k, v]).trim(), "OK");
    }
    let mut c = Conn::connect(env.proxy.port());
    // until mx:p's reply is in the cache (its budget refills at 1/s meanwhile)
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "mx:p never got cached");
        let _ = c.cmd(&["GET", "mx:p"]);
        let stats = c.cmd(&["PROXY", "CACHE", "STATS"]);
        if stats.get("entries").is_some_and(|e| e.int() >= 1) {
            break;
        }
        thread::sleep(Duration::from_millis(1100));
    }
    thread::sleep(Duration::from_millis(2100)); // mx:p's burst is whole again
    // spend mx:p's budget on cached reads
    let mut spent = false;
    for _ in 0..5 {
        if c.cmd(&["GET", "mx:p"]).err().is_some_and(|e| e.starts_with("THROTTLED")) {
            spent = true;
            break;
        }
    }
    assert!(spent, "cached reads of mx:p were never throttled");
    // mx:q is within budget, mx:p (cached) is over: the whole MGET is refused...
    let r = c.cmd(&["MGET", "mx:q", "mx:p"]);
    assert!(r.err().is_some_and(|e| e.starts_with("THROTTLED key 'mx:p'")), "{r:?}");
    // ...and mx:q was not charged for it: its one-request burst is still there
    assert_eq!(c.cmd(&["GET", "mx:q"]), V::s("qv"));
}

/// `server.max_clients` holds exactly when several workers accept at the same moment.
#[test]
fn max_clients_holds_exactly_across_workers() {
    let server = common::RedisStandalone::start();
    let (_dir, conf) = common::config_file("[server]\nmax_clients = 40\n");
    let proxy = common::Proxy::start_standalone(&server, &["--threads", "2", "--config", &conf]);
    let port = proxy.port();
    for round in 0..5 {
        let go = Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let go = go.clone();
                thread::spawn(move || {
                    go.wait();
                    let mut kept = Vec::new();
                    for _ in 0..25 {
                        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
                        s.write_all(b"PING\r\n").expect("write");
                        let mut b = [0u8; 7];
                        match s.read_exact(&mut b) {
                            Ok(()) if &b == b"+PONG\r\n" => kept.push(s),
                            Ok(()) => assert_eq!(&b, b"-ERR ma", "unexpected reply"),
                            Err(_) => {}
                        }
                    }
                    kept
                })
            })
            .collect();
        let kept: Vec<TcpStream> = handles.into_iter().flat_map(|h| h.join().expect("client")).collect();
        assert_eq!(kept.len(), 40, "round {round}: {} clients served with max_clients = 40", kept.len());
        drop(kept);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = Conn::connect(port).cmd(&["INFO", "clients"]);
            if r.err().is_none() && common::info_field(&r.text(), "connected_clients").as_deref() == Some("1") {
                break;
            }
            assert!(Instant::now() < deadline, "clients did not go away");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Client limits × the paths a reply comes by: a client that pipelines reads of 300 KiB
/// (each above the soft limit) and never reads is held and cut (past `output_hard_bytes`,
/// or over `output_soft_bytes` for `output_soft_seconds`, whichever comes first) whether
/// its replies come from one node, from the parts of a split MGET, from EXEC (under WATCH
/// or not), from a script or from a replica. A blocking command is read one at a time and
/// a cache hit is answered at once, so a client of those stops being read once it holds
/// one reply above the soft limit, which is always delivered: it is held, not cut. (So is
/// a client that waits for each reply: docs/architecture.md.)
#[test]
fn a_client_that_never_reads_is_held_and_cut_whatever_path_its_replies_take() {
    let env = ClusterEnv::start(Some(
        "[limits]\noutput_soft_bytes = 262144\noutput_soft_seconds = 1\noutput_hard_bytes = 1048576\n\n[cache]\npin = [\"pin:*\"]\nmax_entry_bytes = 1048576\n\n\
         [[backend.read_rules]]\npattern = \"rr:*\"\nread_from = \"replica\"\nmax_lag_ms = 5000\n",
    ));
    let port = env.proxy.port();
    let mut c = Conn::connect(port);
    let value = "v".repeat(300 * 1024);
    for k in ["{b}a", "other", "pin:k", "rr:k"] {
        assert_eq!(c.cmd(&["SET", k, &value]), V::ok());
    }
    assert_eq!(c.cmd(&["RPUSH", "{b}list", &value]), V::Int(1));
    // the pinned key is answered from the cache from its second read; the replica has
    // the value (another client's read, which waits for no write of its own)
    assert_eq!(c.cmd(&["GET", "pin:k"]).bytes().len(), value.len());
    let mut r = Conn::connect(port);
    common::wait_until(Duration::from_secs(20), "the replica in sync", || {
        let v = r.cmd(&["GET", "rr:k"]);
        !v.is_err() && !v.is_nil() && v.bytes().len() == value.len()
    });
    let enc = |cmds: &[&[&str]]| cmds.iter().flat_map(|a| common::client::encode(a)).collect::<Vec<u8>>();
    let cells: [(&str, Vec<u8>); 5] = [
        ("pipeline", enc(&[&["GET", "{b}a"]])),
        ("split", enc(&[&["MGET", "{b}a", "other"]])),
        ("MULTI", enc(&[&["MULTI"], &["GET", "{b}a"], &["EXEC"]])),
        ("script", enc(&[&["EVAL", "return redis.call('GET', KEYS[1])", "1", "{b}a"]])),
        ("replica", enc(&[&["GET", "rr:k"]])),
    ];
    let hits = |c: &mut Conn| c.cmd(&["PROXY", "CACHE", "STATS"]).get("hits").map(|v| v.int()).unwrap_or(0);
    let replica = env.cluster.replica_of(env.cluster.master_for_key(b"rr:k"));
    let cuts = || disconnects(&env, "output_hard") + disconnects(&env, "output_soft");
    for (cell, bytes) in cells {
        let before = cuts();
        let replica_before = common::cmdstat_calls(replica, "get");
        let started = Instant::now();
        let (_, cut_at) = never_reads(port, bytes, Duration::from_secs(5)).join().expect("client");
        let cut = cut_at.unwrap_or_else(|| panic!("{cell}: a client that never reads was not cut")) - started;
        assert!(cut < Duration::from_secs(4), "{cell}: cut after {cut:?}");
        common::wait_until(Duration::from_secs(2), "the disconnect counted", || cuts() == before + 1);
        if cell == "replica" {
            assert!(common::cmdstat_calls(replica, "get") > replica_before, "the reads went to the replica");
        }
    }
    // WATCH: the ordering rule runs a watching client's transactions one after another (a
    // transaction waits for the one before it), so it holds one reply at a time: cut when
    // the socket buffers took so little that two are held, else held, read no more, with
    // a bounded number of transactions sent to Redis (where a client read on would have
    // sent thousands)
    let owner = env.cluster.master_for_key(b"{b}a");
    let before = common::cmdstat_calls(owner, "exec");
    let watch = enc(&[&["WATCH", "{b}a"], &["MULTI"], &["GET", "{b}a"], &["EXEC"]]);
    let (_, cut_at) = never_reads(port, watch, Duration::from_secs(3)).join().expect("client");
    let execs = common::cmdstat_calls(owner, "exec") - before;
    assert!(execs < 100, "{execs} EXECs reached the node for a watching client that never reads (cut: {cut_at:?})");
    // blocking: once a reply above the soft limit is held, nothing more is read from the
    // client (the socket buffers took a few replies first); Redis's node saw a bounded
    // number of BLMOVEs, where a client read on would have sent thousands
    // a cache hit is answered at once, so the same holds: one reply above the soft limit
    let before = hits(&mut c);
    let (_, cut_at) = never_reads(port, enc(&[&["GET", "pin:k"]]), Duration::from_secs(2)).join().expect("client");
    assert!(cut_at.is_none(), "a client of cache hits holding one reply was cut");
    let answered = hits(&mut c) - before;
    assert!(answered > 0 && answered < 100, "{answered} cache hits answered to a client that never reads");
    let owner = env.cluster.master_for_key(b"{b}list");
    let before = common::cmdstat_calls(owner, "blmove");
    let blmove = enc(&[&["BLMOVE", "{b}list", "{b}list", "LEFT", "RIGHT", "1"]]);
    let (_, cut_at) = never_reads(port, blmove, Duration::from_secs(2)).join().expect("client");
    assert!(cut_at.is_none(), "a client of blocking commands holding one reply was cut");
    let moved = common::cmdstat_calls(owner, "blmove") - before;
    assert!(moved < 100, "{moved} BLMOVEs reached the node for a client that never reads");
    // the reading client was not touched
    assert_eq!(c.cmd(&["GET", "{b}a"]).bytes().len(), value.len());
}
