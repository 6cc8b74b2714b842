//! `backend.flush_delay_ms`: a shared connection to a node with nothing in flight holds
//! its write, so that one wake-up of the node serves every client that sends meanwhile.
//! Each path that reaches a node over a shared connection waits the hold once (a pipeline
//! or a split command once for all of its requests, not once each) and is answered as
//! without it; the paths on a dedicated connection (WATCH, blocking commands), a
//! connection busy with a batch's worth and a start with a hold above the limit are the
//! other cells (docs/architecture.md, "Every feature on every path"). The shared paths
//! are tried on Redis 7.0 and on Valkey 9.1.

mod common;

use std::time::{Duration, Instant};

use common::client::{Conn, V, args};
use common::{Proxy, RedisCluster, SlotOwners, run_bin, wait_until};

/// The longest hold there is: long enough to tell apart from a round trip on a loaded
/// machine.
const HOLD: Duration = Duration::from_millis(100);

struct Setup {
    _cluster: RedisCluster,
    owners: SlotOwners,
    /// Reads from the masters.
    proxy: Proxy,
    /// Reads from the replicas.
    replica_proxy: Proxy,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn setup(cluster: RedisCluster) -> Setup {
    let owners = SlotOwners::read(&cluster);
    let conf = |read_from: &str| {
        format!(
            "[cache]\nenabled = false\n[backend]\nflush_delay_ms = {}\nread_from = \"{read_from}\"\n",
            HOLD.as_millis()
        )
    };
    let (d1, p1) = common::config_file(&conf("master"));
    let (d2, p2) = common::config_file(&conf("replica"));
    let proxy = Proxy::start_cluster(&cluster, &["--config", &p1]);
    let replica_proxy = Proxy::start_cluster(&cluster, &["--config", &p2]);
    Setup { _cluster: cluster, owners, proxy, replica_proxy, _dirs: (d1, d2) }
}

/// How long `f` took, with what it returned.
fn timed<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t = Instant::now();
    let r = f();
    (t.elapsed(), r)
}

/// Held once: at least the hold, and well under two of them.
fn held_once(what: &str, took: Duration) {
    eprintln!("{what}: {took:?}");
    assert!(took >= HOLD, "{what} took {took:?}: not held ({HOLD:?})");
    assert!(took < HOLD * 2 + Duration::from_millis(200), "{what} took {took:?}: held more than once");
}

fn not_held(what: &str, took: Duration) {
    eprintln!("{what}: {took:?}");
    assert!(took < HOLD, "{what} took {took:?}: held ({HOLD:?})");
}

#[test]
fn every_shared_path_waits_the_hold_once_and_is_answered_as_without_it() {
    shared_paths_hold_once(&setup(RedisCluster::start()));
}

#[test]
fn on_valkey_every_shared_path_waits_the_hold_once() {
    shared_paths_hold_once(&setup(RedisCluster::start_valkey(&[])));
}

fn shared_paths_hold_once(s: &Setup) {
    let port = s.proxy.port();
    let keys = s.owners.key_per_master("fd:k");
    let (k0, k1, k2) = (&keys[0].1, &keys[1].1, &keys[2].1);
    let mut c = Conn::connect(port);
    for (_, k) in &keys {
        assert_eq!(c.cmd(&["SET", k, "v"]), V::ok());
    }

    // single
    let (took, r) = timed(|| c.cmd(&["GET", k0]));
    assert_eq!(r, V::s("v"));
    held_once("GET", took);

    // pipeline: eight requests to one node wait one hold
    let pipe: Vec<Vec<Vec<u8>>> = (0..8).map(|i| args(&["INCR", &format!("{{{k0}}}:n{i}")])).collect();
    let (took, r) = timed(|| c.pipeline(&pipe));
    assert!(r.iter().all(|v| *v == V::Int(1)), "{r:?}");
    held_once("a pipeline of 8 INCRs", took);

    // split: the three nodes hold at once
    let (took, r) = timed(|| c.cmd(&["MSET", k0, "a", k1, "b", k2, "c"]));
    assert_eq!(r, V::ok());
    held_once("MSET across three masters", took);
    assert_eq!(c.cmd(&["MGET", k0, k1, k2]), V::strs(&["a", "b", "c"]));

    // MULTI / EXEC: queued here, sent at EXEC
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["SET", k1, "tx"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["GET", k1]), V::s("QUEUED"));
    let (took, r) = timed(|| c.cmd(&["EXEC"]));
    assert_eq!(r, V::Arr(vec![V::ok(), V::s("tx")]));
    held_once("EXEC", took);

    // scripts
    let (took, r) = timed(|| c.cmd(&["EVAL", "return redis.call('GET', KEYS[1])", "1", k2]));
    assert_eq!(r, V::s("c"));
    held_once("EVAL", took);

    // locks
    let lock = format!("{k1}:lock");
    let (took, r) = timed(|| c.cmd(&["LOCK.ACQUIRE", &lock, "me", "10000"]));
    assert!(matches!(r, V::Int(t) if t > 0), "{r:?}");
    held_once("LOCK.ACQUIRE", took);
    let (took, r) = timed(|| c.cmd(&["LOCK.RELEASE", &lock, "me"]));
    assert_eq!(r, V::Int(1));
    held_once("LOCK.RELEASE", took);

    // pub/sub: PUBLISH goes to a node like any command; the subscriber's own connection
    // (a side connection of heatshield's) is not held
    let mut sub = Conn::connect(port);
    sub.cmd(&["SUBSCRIBE", "fd:chan"]);
    let (took, r) = timed(|| c.cmd(&["PUBLISH", "fd:chan", "hello"]));
    assert_eq!(r, V::Int(1));
    held_once("PUBLISH", took);
    assert_eq!(sub.read_reply(), V::strs(&["message", "fd:chan", "hello"]));

    // replica reads: a replica's connection is held as a master's
    let mut rc = Conn::connect(s.replica_proxy.port());
    wait_until(Duration::from_secs(10), "the replicas to have the key", || rc.cmd(&["GET", k2]) == V::s("c"));
    let (took, r) = timed(|| rc.cmd(&["GET", k2]));
    assert_eq!(r, V::s("c"));
    held_once("GET from a replica", took);
}

#[test]
fn dedicated_and_busy_connections_are_not_held() {
    let s = setup(RedisCluster::start());
    let port = s.proxy.port();
    let keys = s.owners.key_per_master("fd:d");
    let (k0, k1) = (&keys[0].1, &keys[1].1);
    let mut c = Conn::connect(port);
    assert_eq!(c.cmd(&["RPUSH", k0, "x"]), V::Int(1));
    assert_eq!(c.cmd(&["SET", k1, "v"]), V::ok());

    // blocking: a dedicated connection, one client's (warmed once: its first use connects)
    assert_eq!(c.cmd(&["BLPOP", k0, "1"]), V::strs(&[k0.as_str(), "x"]));
    assert_eq!(c.cmd(&["RPUSH", k0, "y"]), V::Int(1));
    let (took, r) = timed(|| c.cmd(&["BLPOP", k0, "1"]));
    assert_eq!(r, V::strs(&[k0.as_str(), "y"]));
    not_held("BLPOP on a dedicated connection", took);

    // WATCH: the transaction runs on the watched keys' dedicated connection
    let mut w = Conn::connect(port);
    assert_eq!(w.cmd(&["WATCH", k1]), V::ok());
    let (took, r) = timed(|| w.cmd(&["GET", k1]));
    assert_eq!(r, V::s("v"));
    not_held("GET under WATCH", took);
    assert_eq!(w.cmd(&["MULTI"]), V::ok());
    assert_eq!(w.cmd(&["SET", k1, "w"]), V::s("QUEUED"));
    let (took, r) = timed(|| w.cmd(&["EXEC"]));
    assert_eq!(r, V::Arr(vec![V::ok()]));
    not_held("EXEC under WATCH", took);

    // a connection with requests in flight, or a batch's worth queued, writes at once:
    // a long pipeline waits at most the one hold of its first batch (held for each of
    // its batches, 2,000 GETs would wait more than ten)
    let pipe: Vec<Vec<Vec<u8>>> = (0..2000).map(|_| args(&["GET", k1])).collect();
    let (took, r) = timed(|| c.pipeline(&pipe));
    assert!(r.iter().all(|v| *v == V::s("w")));
    eprintln!("a pipeline of 2,000 GETs: {took:?}");
    assert!(took < HOLD * 2 + Duration::from_millis(200), "a pipeline of 2,000 GETs took {took:?}");
}

#[test]
fn a_hold_above_the_limit_is_refused_at_start() {
    let (_dir, path) = common::config_file("[backend]\nflush_delay_ms = 101\n");
    let (code, _out, err) = run_bin(&["--config", &path, "--check"]);
    assert_ne!(code, 0);
    assert!(err.contains("backend.flush_delay_ms: must be at most 100"), "{err}");
}
