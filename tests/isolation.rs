//! A slow node delays only the requests routed to it: while one master is stuck in
//! `DEBUG SLEEP` (sent to it directly, not through the proxy), clients of the proxy keep
//! getting prompt replies from the other masters, and the stuck master's requests complete
//! once it wakes. With a short `backend.command_timeout_ms`, the stuck node's requests
//! fail with a timeout error instead, others are unaffected, and the node serves again
//! after it wakes (the connection is rebuilt).

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, V};
use common::{Proxy, RedisCluster, SlotOwners};

fn stall(port: u16, seconds: &str) -> thread::JoinHandle<()> {
    let seconds = seconds.to_string();
    thread::spawn(move || {
        let mut c = Conn::connect(port);
        assert_eq!(c.cmd(&["DEBUG", "SLEEP", &seconds]), V::ok());
    })
}

#[test]
fn a_slow_master_delays_only_its_own_requests() {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let owners = SlotOwners::read(&cluster);
    let keys = owners.key_per_master("iso:");
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        for (_, k) in &keys {
            assert_eq!(c.cmd(&["SET", k, k]), V::ok());
        }
        let (slow_port, slow_key) = keys[0].clone();
        let sleeper = stall(slow_port, "1.5");
        thread::sleep(Duration::from_millis(150));

        // A request for the stuck master, on its own connection, waits for it...
        let waiting = {
            let port = proxy.port();
            let k = slow_key.clone();
            thread::spawn(move || {
                let mut c = Conn::connect_proto(port, proto);
                let t = Instant::now();
                let v = c.cmd(&["GET", &k]);
                (v, t.elapsed())
            })
        };
        thread::sleep(Duration::from_millis(50));
        // ...while the other masters answer at once, through the same proxy and even on
        // the same client connection.
        for (_, k) in &keys[1..] {
            let t = Instant::now();
            assert_eq!(c.cmd(&["GET", k]), V::s(k), "{proto:?}");
            assert!(
                t.elapsed() < Duration::from_millis(300),
                "{proto:?}: GET {k} took {:?} while another master slept",
                t.elapsed()
            );
        }
        let (v, took) = waiting.join().unwrap();
        assert_eq!(v, V::s(&slow_key), "{proto:?}");
        assert!(took >= Duration::from_millis(800), "{proto:?}: the stuck master answered after only {took:?}");
        sleeper.join().unwrap();
    }
    assert!(proxy.is_alive());
}

#[test]
fn command_timeout_fails_only_the_stuck_node_and_it_recovers() {
    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("h.toml");
    std::fs::write(&conf, "[backend]\ncommand_timeout_ms = 400\n").unwrap();
    let proxy = Proxy::start_cluster(&cluster, &["--config", conf.to_str().unwrap()]);
    let owners = SlotOwners::read(&cluster);
    let keys = owners.key_per_master("iso:t:");
    let mut c = Conn::connect(proxy.port());
    for (_, k) in &keys {
        assert_eq!(c.cmd(&["SET", k, k]), V::ok());
    }
    let (slow_port, slow_key) = keys[0].clone();
    let sleeper = stall(slow_port, "2");
    thread::sleep(Duration::from_millis(150));
    let t = Instant::now();
    let v = c.cmd(&["GET", &slow_key]);
    let took = t.elapsed();
    assert!(
        v.err().is_some_and(|e| e.starts_with("ERR heatshield: timeout waiting for")),
        "expected a timeout error, got {v:?}"
    );
    assert!(took < Duration::from_millis(1500), "timeout took {took:?}");
    for (_, k) in &keys[1..] {
        assert_eq!(c.cmd(&["GET", k]), V::s(k));
    }
    sleeper.join().unwrap();
    // the node is awake again: its requests work on a rebuilt connection
    common::wait_until(Duration::from_secs(5), "the slow master to serve again", || {
        c.cmd(&["GET", &slow_key]) == V::s(&slow_key)
    });
    assert!(proxy.is_alive());
}
