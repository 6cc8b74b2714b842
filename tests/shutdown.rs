//! Process lifecycle: SIGTERM drains in-flight replies and exits 0 within
//! `server.shutdown_timeout_ms`; a reply that never comes does not hold the exit beyond
//! that timeout, and a client blocked in a blocking command is closed at once; an invalid configuration makes the binary exit non-zero naming the key
//! (also with `--check`); a backend that never answers does not keep the proxy from
//! starting.

mod common;

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, V, args};
use common::{Proxy, RedisCluster, RedisStandalone, Shared, free_port};

static CLUSTER: Shared<RedisCluster> = Shared::new();

fn cluster() -> Arc<RedisCluster> {
    CLUSTER.get(RedisCluster::start)
}

fn config(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new().prefix("heatshield-conf-").tempdir().unwrap();
    let path = dir.path().join("heatshield.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path.to_str().unwrap().to_string())
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args(["-s", sig, &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill -s {sig} {pid}");
}

fn refused(port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)), Duration::from_secs(1)).is_err()
}

#[test]
fn sigterm_during_a_pipelined_batch_drains_and_exits_zero() {
    let cluster = cluster();
    let (_dir, path) = config("[server]\nshutdown_timeout_ms = 3000\n");
    for proto in Proto::BOTH {
        let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
        let t = proto.tag();
        let ctr = format!("shut:{t}:ctr");
        let big = format!("shut:{t}:big");
        let value = "x".repeat(1024);
        let mut c = Conn::connect_proto(proxy.port(), proto);
        c.cmd(&["DEL", &ctr]);
        assert_eq!(c.cmd(&["SET", &big, &value]), V::ok());

        // 40,000 commands: INCR (numbered replies) and 1 KiB GETs, written from a thread
        let mut bytes = vec![];
        for i in 0..40_000 {
            let a = if i % 2 == 0 { args(&["INCR", &ctr]) } else { args(&["GET", &big]) };
            bytes.extend(common::client::encode(&a));
        }
        let writer = c.send_raw_bg(bytes);
        // the batch is in flight once the first reply is back
        assert_eq!(c.read_reply(), V::Int(1));
        proxy.signal("TERM");
        let signalled = Instant::now();

        // every reply that still arrives is the right one, in order, and the stream ends
        // on a reply boundary
        let mut got = 1;
        loop {
            match c.try_read_full() {
                Ok(r) => {
                    let want = if got % 2 == 0 { V::Int(got / 2 + 1) } else { V::s(&value) };
                    assert_eq!(r.v, want, "{proto:?} reply #{got} after SIGTERM");
                    got += 1;
                }
                Err(e) => {
                    assert!(
                        matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset),
                        "{proto:?}: stream did not end cleanly: {e}"
                    );
                    break;
                }
            }
        }
        let _ = writer.join();
        let code = proxy.wait_exit(Duration::from_secs(5));
        assert_eq!(code, Some(0), "{proto:?}: exit status after SIGTERM (log:\n{})", proxy.log());
        assert!(
            signalled.elapsed() < Duration::from_secs(4),
            "exit took {:?} (shutdown_timeout_ms = 3000)",
            signalled.elapsed()
        );
        assert!(got < 40_000, "the whole batch was answered; shutdown did not interrupt anything");
        eprintln!("{proto:?}: {got} replies before the connection was closed");
        assert!(proxy.log().contains("shutdown complete"), "{}", proxy.log());
        assert!(refused(proxy.port()), "still accepting connections after exit");
        // whatever ran was acknowledged in order: the counter is at least what we saw
        let mut direct = Conn::connect(cluster.master_for_key(ctr.as_bytes()));
        let n = direct.cmd(&["GET", &ctr]).text().parse::<i64>().unwrap();
        assert!(n >= (got + 1) / 2, "counter {n} < replies seen");
    }
}

#[test]
fn idle_clients_are_closed_and_exit_is_prompt() {
    let cluster = cluster();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let mut idle: Vec<Conn> = (0..5).map(|_| Conn::connect(proxy.port())).collect();
    let mut r3 = Conn::connect_proto(proxy.port(), Proto::Resp3);
    assert_eq!(r3.cmd(&["SET", "shut:idle", "1"]), V::ok());
    let start = Instant::now();
    proxy.signal("TERM");
    assert_eq!(proxy.wait_exit(Duration::from_secs(3)), Some(0));
    assert!(start.elapsed() < Duration::from_secs(2), "idle shutdown took {:?}", start.elapsed());
    for c in idle.iter_mut().chain(std::iter::once(&mut r3)) {
        assert!(c.expect_closed(Duration::from_secs(2)), "idle client not closed");
    }
}

#[test]
fn a_client_blocked_in_blpop_is_closed_at_once_on_shutdown() {
    // Its reply may never come: the proxy does not wait out shutdown_timeout_ms for it.
    let cluster = cluster();
    let (_dir, path) = config("[server]\nshutdown_timeout_ms = 8000\n");
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let mut blocked = Conn::connect(proxy.port());
    blocked.send(&["BLPOP", "shut:blocked:list", "0"]);
    let mut other = Conn::connect(proxy.port());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !other.cmd(&["CLIENT", "LIST"]).text().contains("cmd=blpop") {
        assert!(Instant::now() < deadline, "the client never blocked");
        thread::sleep(Duration::from_millis(20));
    }
    let start = Instant::now();
    proxy.signal("TERM");
    assert!(blocked.expect_closed(Duration::from_secs(3)), "the blocked client was not closed");
    assert_eq!(proxy.wait_exit(Duration::from_secs(5)), Some(0));
    assert!(start.elapsed() < Duration::from_secs(4), "shutdown with a blocked client took {:?}", start.elapsed());
}

#[test]
fn shutdown_timeout_bounds_a_reply_that_never_comes() {
    // A standalone Redis that is frozen (SIGSTOP) after the proxy started: a GET sent to it
    // never gets a reply. SIGTERM must still end the proxy after shutdown_timeout_ms.
    let redis = RedisStandalone::start();
    let (_dir, path) = config("[server]\nshutdown_timeout_ms = 1000\n[backend]\ncommand_timeout_ms = 60000\n");
    let proxy = Proxy::start_standalone(&redis, &["--config", &path]);
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["SET", "shut:frozen", "1"]), V::ok());
    signal(redis.server().pid(), "STOP");
    c.send(&["GET", "shut:frozen"]);
    thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    proxy.signal("TERM");
    let code = proxy.wait_exit(Duration::from_secs(5));
    let took = start.elapsed();
    signal(redis.server().pid(), "CONT");
    assert_eq!(code, Some(0), "exit status (log:\n{})", proxy.log());
    assert!(
        took >= Duration::from_millis(800),
        "the proxy exited after {took:?}, without waiting for the in-flight reply"
    );
    assert!(took < Duration::from_secs(3), "exit took {took:?} with shutdown_timeout_ms = 1000");
}

#[test]
fn proxy_starts_even_if_the_backend_never_answers() {
    // The backend accepts connections but is frozen (SIGSTOP) when the proxy starts. The
    // proxy must still come up: PING is answered locally, data commands fail or wait.
    let redis = RedisStandalone::start();
    signal(redis.server().pid(), "STOP");
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_heatshield"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--standalone", &redis.addr()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut answered = false;
    while Instant::now() < deadline {
        if let Ok(mut c) = Conn::try_connect(port) {
            c.stream().set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            if c.try_cmd(&["PING"]).is_ok_and(|v| v == V::s("PONG")) {
                answered = true;
                break;
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    signal(redis.server().pid(), "CONT");
    assert!(
        answered,
        "the proxy did not answer PING within 8 s while its backend was unresponsive \
         (start-up waits for the backend's INFO reply without a timeout)"
    );
}

#[test]
fn invalid_configuration_exits_nonzero_naming_the_key() {
    let listen = format!("127.0.0.1:{}", free_port());
    let cases: &[(&str, &[&str])] = &[
        ("[server]\nlisten_on = \"127.0.0.1:1\"\n", &["listen_on"]),
        ("[server]\nmax_clients = \"many\"\n", &["max_clients"]),
        ("[backend]\nconnections_per_node = 0\n", &["backend.connections_per_node"]),
        ("[limits]\nmax_request_bytes = 10\n", &["limits.max_request_bytes"]),
        ("[bogus]\nx = 1\n", &["bogus"]),
        (
            "[server]\nmax_clients = 0\n[backend]\ncommand_timeout_ms = 0\n",
            &["server.max_clients", "backend.command_timeout_ms"],
        ),
        ("[server]\npassword = \"\"\n", &["server.password"]),
        ("this is not toml", &[]),
    ];
    for (toml, keys) in cases {
        let (_dir, path) = config(toml);
        for check in [false, true] {
            let mut a = vec!["--config", path.as_str(), "--listen", listen.as_str(), "--cluster", "127.0.0.1:7000"];
            if check {
                a.push("--check");
            }
            let (code, stdout, stderr) = common::run_bin(&a);
            assert_ne!(code, 0, "config {toml:?} (check={check}) was accepted; stdout {stdout:?}");
            for k in *keys {
                assert!(stderr.contains(k), "config {toml:?} (check={check}): stderr does not name {k}:\n{stderr}");
            }
            assert!(stderr.contains(&path), "the error should name the file: {stderr}");
            assert!(!stdout.contains("configuration ok"));
        }
    }
    // a missing file is an error too
    let (code, _, stderr) =
        common::run_bin(&["--config", "/nonexistent/heatshield.toml", "--cluster", "127.0.0.1:7000"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("/nonexistent/heatshield.toml"), "{stderr}");
    // no seeds at all
    let (code, _, stderr) = common::run_bin(&["--listen", &listen]);
    assert_ne!(code, 0);
    assert!(stderr.contains("backend.seeds"), "{stderr}");
}

#[test]
fn check_mode_accepts_a_valid_configuration() {
    let (_dir, path) = config(
        "[server]\nlisten = \"127.0.0.1:7777\"\nallow_flush = true\nshutdown_timeout_ms = 100\n\
         [backend]\nseeds = [\"127.0.0.1:7000\"]\n[limits]\nmax_pipeline = 10\n",
    );
    let (code, stdout, stderr) = common::run_bin(&["--config", &path, "--check"]);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.contains("configuration ok"), "{stdout}");
    // the shipped example configuration is valid
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/heatshield.toml");
    let (code, stdout, stderr) = common::run_bin(&["--config", shipped, "--check"]);
    assert_eq!(code, 0, "conf/heatshield.toml: {stderr}");
    assert!(stdout.contains("configuration ok"));
}

#[test]
fn a_second_heatshield_on_a_served_address_fails_to_start_unless_it_takes_over() {
    let cluster = cluster();
    let first = Proxy::start_cluster(&cluster, &[]);
    let listen = format!("127.0.0.1:{}", first.port());
    let metrics = first.metrics_addr().unwrap();
    let seeds = cluster.seeds();
    let run = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_heatshield"));
        cmd.args(["--listen", &listen, "--cluster", &seeds]).args(extra);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    };
    // by mistake: refused, as Redis refuses a port in use, and the first keeps every client
    let second = run(&["--metrics", "off"]);
    let out = second.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("Address already in use") && log.contains("--takeover"), "{log}");
    for _ in 0..20 {
        assert_eq!(Conn::connect(first.port()).cmd(&["PING"]), V::s("PONG"));
    }
    // a takeover asking for other addresses (no metrics port) is refused; the first serves on
    let wrong = run(&["--takeover", "--metrics", "off"]).wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&wrong.stderr).to_string();
    assert_eq!(wrong.status.code(), Some(1), "{log}");
    assert!(log.contains("refused") && log.contains("takeover"), "{log}");
    assert_eq!(Conn::connect(first.port()).cmd(&["PING"]), V::s("PONG"));
    assert!(first.is_alive());
    // asked for: the new one receives the sockets, the first drains and exits
    let mut client = Conn::connect(first.port());
    assert_eq!(client.cmd(&["SET", "takeover:k", "1"]), V::ok());
    let mut third = Reaped(run(&["--takeover", "--metrics", &metrics]));
    assert_eq!(first.wait_exit(Duration::from_secs(10)), Some(0), "{}", first.log());
    assert!(first.log().contains("listeners handed to a new heatshield"), "{}", first.log());
    assert!(client.expect_closed(Duration::from_secs(2)), "the old one's idle client was not closed");
    assert!(third.0.try_wait().unwrap().is_none(), "--takeover must serve on");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = Conn::connect(first.port());
        if c.cmd(&["GET", "takeover:k"]) == V::s("1") && common::http::http_get(&metrics, "/ready").0 == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the new heatshield does not serve the port and /ready");
        thread::sleep(Duration::from_millis(50));
    }
    signal(third.0.id(), "TERM");
    let _ = third.0.wait();
}

/// A child process killed when the test ends, passed or not.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(proxy: &Proxy, path: &str) -> (u16, String) {
    common::http::http_get(&proxy.metrics_addr().expect("metrics on"), path)
}

#[test]
fn ready_turns_503_at_sigterm_and_clients_are_accepted_through_the_grace() {
    let cluster = cluster();
    let (_dir, path) = config("[server]\ndrain_grace_ms = 2000\nshutdown_timeout_ms = 3000\n");
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    assert_eq!(get(&proxy, "/live"), (200, "live\n".into()));
    assert_eq!(get(&proxy, "/ready"), (200, "ready\n".into()));
    assert_eq!(get(&proxy, "/nope").0, 404);
    let mut before = Conn::connect(proxy.port());
    assert_eq!(before.cmd(&["SET", "drain:k", "0"]), V::ok());
    let start = Instant::now();
    proxy.signal("TERM");
    // not ready at once, still live
    let deadline = start + Duration::from_millis(500);
    while get(&proxy, "/ready").0 != 503 {
        assert!(Instant::now() < deadline, "/ready still 200 500 ms after SIGTERM");
        thread::sleep(Duration::from_millis(10));
    }
    let unready = start.elapsed();
    assert_eq!(get(&proxy, "/ready"), (503, "not ready: draining\n".into()));
    assert_eq!(get(&proxy, "/live").0, 200);
    // through the grace: old clients served, new ones accepted and served
    for i in 0..5 {
        assert_eq!(before.cmd(&["INCR", "drain:k"]), V::Int(i + 1));
        let mut fresh = Conn::connect(proxy.port());
        assert_eq!(fresh.cmd(&["GET", "drain:k"]), V::s((i + 1).to_string()));
        thread::sleep(Duration::from_millis(200));
    }
    assert!(start.elapsed() < Duration::from_millis(1900), "the test was too slow to be in the grace");
    // then the listener closes, the idle client is closed, and the process exits
    let deadline = start + Duration::from_secs(4);
    while !refused(proxy.port()) {
        assert!(Instant::now() < deadline, "still accepting 4 s after SIGTERM (grace 2 s)");
        thread::sleep(Duration::from_millis(20));
    }
    let closed = start.elapsed();
    assert!(closed >= Duration::from_millis(1900), "the listener closed after {closed:?}, before the grace");
    assert!(unready < closed, "/ready turned 503 after the listener closed");
    assert!(before.expect_closed(Duration::from_secs(3)), "the idle client was not closed");
    assert_eq!(proxy.wait_exit(Duration::from_secs(5)), Some(0), "{}", proxy.log());
    eprintln!("/ready 503 after {unready:?}, listener closed after {closed:?}");
}

#[test]
fn not_ready_without_a_slot_map() {
    // seeds where nothing listens: heatshield starts, lives, and is not ready
    let nothing = free_port();
    let seeds = format!("127.0.0.1:{nothing}");
    let proxy = Proxy::start(&["--cluster", &seeds]);
    assert_eq!(get(&proxy, "/live").0, 200);
    assert_eq!(get(&proxy, "/ready"), (503, "not ready: no slot map\n".into()));
}
