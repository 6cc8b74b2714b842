//! Reloading the configuration while clients run (docs/admin.md, "Reloading the
//! configuration"): SIGHUP and `PROXY CONFIG RELOAD` apply what can change live (rate
//! limits, users, limits, cache thresholds, admin settings), report and keep what needs a
//! restart, reject an invalid file whole, log what changed without secrets, and drop no
//! connection but those of a user the file no longer has.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V};
use common::{Proxy, RedisCluster, Shared, config_file};

static CLUSTER: Shared<RedisCluster> = Shared::new();

fn cluster() -> Arc<RedisCluster> {
    CLUSTER.get(RedisCluster::start)
}

fn file(max_clients: u32, slowlog: u32, alice: &str, bob: bool, rate: &str, soft: u32, extra: &str) -> String {
    let bob = if bob { ", \"bob on >bobpw ~* +@all\"" } else { "" };
    format!(
        "[server]\nmax_clients = {max_clients}\nusers = [\"alice on >{alice} ~* +@all\"{bob}]\n{extra}\n\
         [admin]\nslowlog_slower_than_us = {slowlog}\n\n[limits]\noutput_soft_bytes = {soft}\n\n\
         [[ratelimit.rules]]\nname = \"r\"\npattern = \"reload:rl:*\"\nrate = {rate}\nburst = 1\n"
    )
}

fn get(c: &mut Conn, key: &str) -> String {
    let v = c.cmd(&["PROXY", "CONFIG", "GET", key]);
    v.get(key).unwrap_or_else(|| panic!("{key} in {v:?}")).text()
}

/// The log from byte `from` on, without terminal colours.
fn log_from(proxy: &Proxy, from: usize) -> String {
    let raw = proxy.log().get(from..).unwrap_or("").to_string();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn wait_log(proxy: &Proxy, from: usize, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = log_from(proxy, from);
        if log.contains(what) {
            return log;
        }
        assert!(Instant::now() < deadline, "no '{what}' in the log:\n{log}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_and_proxy_config_reload_apply_what_is_live_and_drop_no_client() {
    let cluster = cluster();
    let (dir, path) = config_file(&file(100, 10000, "alicepw", true, "1000", 262144, ""));
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    // clients writing all along, on connections that must stay
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let (stop, done, port) = (stop.clone(), done.clone(), proxy.port());
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                let key = format!("reload:w{i}");
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    assert_eq!(c.try_cmd(&["INCR", &key]).expect("a writer's connection dropped"), V::Int(n));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut admin = Conn::connect(proxy.port());
    let mut bob = Conn::connect(proxy.port());
    assert_eq!(bob.cmd(&["AUTH", "bob", "bobpw"]), V::ok());
    let mut alice = Conn::connect(proxy.port());
    assert_eq!(alice.cmd(&["AUTH", "alice", "alicepw"]), V::ok());

    // a valid file: live keys applied, server.announce needs a restart
    let from = proxy.log().len();
    let valid =
        file(50, 5, "alicepw2", false, "1", 131072, "announce = \"10.0.0.1:6380\"\nauth_failures_per_minute = 7");
    std::fs::write(&path, valid).unwrap();
    proxy.signal("HUP");
    let log = wait_log(&proxy, from, "reload done");
    assert_eq!(get(&mut admin, "server.max_clients"), "50");
    assert_eq!(get(&mut admin, "admin.slowlog_slower_than_us"), "5");
    assert_eq!(get(&mut admin, "limits.output_soft_bytes"), "131072");
    assert_eq!(get(&mut admin, "server.announce"), "", "needs a restart: the running value stays");
    assert_eq!(get(&mut admin, "server.auth_failures_per_minute"), "7");
    let mut c = Conn::connect(proxy.port());
    assert!(!c.cmd(&["INCR", "reload:rl:a"]).is_err());
    assert!(c.cmd(&["INCR", "reload:rl:a"]).err().unwrap().starts_with("THROTTLED"), "the new rate of 1/s");
    // users: alice's new password, bob gone and his connection closed
    assert_eq!(c.cmd(&["AUTH", "alice", "alicepw2"]), V::ok());
    assert!(c.cmd(&["AUTH", "alice", "alicepw"]).is_err());
    assert!(c.cmd(&["AUTH", "bob", "bobpw"]).is_err());
    assert!(bob.expect_closed(Duration::from_secs(3)), "bob's connection survived his removal");
    assert_eq!(alice.cmd(&["PING"]), V::s("PONG"), "alice stays, with her new permissions");
    for key in ["server.max_clients", "server.users", "ratelimit.rules", "limits.output_soft_bytes"] {
        assert!(log.contains(&format!("key={key}")) && log.contains("reload: applied"), "{key} not logged:\n{log}");
    }
    assert!(log.contains("needs a restart") && log.contains("key=server.announce"), "{log}");
    assert!(!log.contains("alicepw2") && !log.contains("bobpw"), "a password in the log:\n{log}");

    // an invalid file (a user rule Redis would refuse): nothing changes
    let from = proxy.log().len();
    let bad = file(20, 1, "alicepw3", false, "1", 131072, "").replace("+@all", "+@nosuchcategory");
    std::fs::write(&path, bad).unwrap();
    proxy.signal("HUP");
    let log = wait_log(&proxy, from, "rejected whole");
    assert!(log.contains("nosuchcategory"), "{log}");
    assert_eq!(get(&mut admin, "server.max_clients"), "50");
    assert_eq!(c.cmd(&["AUTH", "alice", "alicepw2"]), V::ok());
    // PROXY CONFIG RELOAD says the same, and what it did
    let e = admin.cmd(&["PROXY", "CONFIG", "RELOAD"]);
    assert!(
        e.err().is_some_and(|e| e.starts_with("ERR heatshield: configuration not reloaded, nothing changed")),
        "{e:?}"
    );
    let more =
        file(60, 5, "alicepw2", false, "1", 131072, "announce = \"10.0.0.1:6380\"\nauth_failures_per_minute = 7");
    std::fs::write(&path, more).unwrap();
    let r = admin.cmd(&["PROXY", "CONFIG", "RELOAD"]);
    assert_eq!(r.get("applied"), Some(V::strs(&["server.max_clients"])), "{r:?}");
    assert_eq!(r.get("needs_restart"), Some(V::strs(&["server.announce"])), "{r:?}");
    assert_eq!(get(&mut admin, "server.max_clients"), "60");

    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().expect("a writer failed");
    }
    assert!(done.load(Ordering::Relaxed) > 100, "the writers hardly wrote");
    drop(dir);
}
