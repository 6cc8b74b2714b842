//! Failovers behind the proxy, each test with its own cluster: a manual `CLUSTER FAILOVER`
//! and a `kill -9` of a master. The proxy must find the new master by itself (no
//! restart), serve the data written before (acknowledged, replicated), and send new
//! writes to the promoted replica.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, V};
use common::{Proxy, RedisCluster, SlotOwners, cmd_text, info_field, wait_until};

const KEYS: usize = 60;

fn key(i: usize) -> String {
    format!("fo:k{i}")
}

fn role(port: u16) -> Option<String> {
    common::try_cmd(port, &["INFO", "replication"]).ok().and_then(|r| r.as_text()).and_then(|t| info_field(&t, "role"))
}

/// Writes KEYS keys through the proxy and checks they cover all masters.
fn write_keys(proxy: &Proxy, owners: &SlotOwners) {
    let mut c = Conn::connect(proxy.port());
    for i in 0..KEYS {
        assert_eq!(c.cmd(&["SET", &key(i), &format!("v{i}")]), V::ok());
    }
    let mut masters: Vec<u16> = (0..KEYS).map(|i| owners.of_key(key(i).as_bytes())).collect();
    masters.sort_unstable();
    masters.dedup();
    assert_eq!(masters.len(), 3);
}

/// Waits until every live node's `CLUSTER NODES` lists `replica` as a replica of
/// `master` (right after cluster creation some nodes may not know yet, and then a manual
/// failover times out and votes are refused).
fn wait_replica_known(cluster: &RedisCluster, master: u16, replica: u16) {
    let (mid, rid) = (cluster.node_id(master), cluster.node_id(replica));
    wait_until(Duration::from_secs(20), "every node to see the replica of the master", || {
        cluster.live_ports().iter().all(|&p| {
            common::try_cmd(p, &["CLUSTER", "NODES"])
                .ok()
                .and_then(|r| r.as_text())
                .is_some_and(|t| t.lines().any(|l| l.starts_with(&rid) && l.contains("slave") && l.contains(&mid)))
        })
    });
}

/// Makes sure everything written to `master` so far has reached a replica.
fn wait_replicated(master: u16, probe_key: &str) {
    let mut m = Conn::connect(master);
    assert_eq!(m.cmd(&["SET", probe_key, "sync"]), V::ok());
    assert_eq!(m.cmd(&["WAIT", "1", "2000"]), V::Int(1), "replica of {master} did not acknowledge");
}

/// Retries SET+GET of `k` through the proxy until both work or `deadline` passes;
/// returns the time it took and the errors seen on the way.
fn poll_until_serving(port: u16, proto: Proto, k: &str, deadline: Duration) -> (Duration, Vec<String>) {
    let start = Instant::now();
    let mut seen = vec![];
    let mut n = 0;
    loop {
        n += 1;
        let v = format!("poll-{}-{n}", proto.tag());
        let attempt = Conn::try_connect(port).and_then(|mut c| {
            if proto == Proto::Resp3 {
                c.hello3();
            }
            let set = c.try_cmd(&["SET", k, &v])?;
            let get = c.try_cmd(&["GET", k])?;
            Ok((set, get))
        });
        match attempt {
            Ok((set, get)) if set.is_ok() && get == V::s(&v) => return (start.elapsed(), seen),
            other => seen.push(format!("{:?}: {other:?}", start.elapsed())),
        }
        assert!(
            start.elapsed() < deadline,
            "{proto:?}: proxy did not serve {k} again within {deadline:?}; attempts: {seen:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// A client doing SET/GET on `keys` in a loop; records every failure with its time.
struct Background {
    stop: Arc<AtomicBool>,
    failures: Arc<Mutex<Vec<(Instant, String)>>>,
    handle: thread::JoinHandle<usize>,
}

impl Background {
    fn start(port: u16, keys: Vec<String>) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(Mutex::new(vec![]));
        let (s, f) = (stop.clone(), failures.clone());
        let handle = thread::spawn(move || {
            let mut c = Conn::connect(port);
            let mut ops = 0;
            while !s.load(Ordering::Relaxed) {
                let k = &keys[ops % keys.len()];
                let v = format!("bg{ops}");
                let r = c.try_cmd(&["SET", k, &v]).and_then(|set| Ok((set, c.try_cmd(&["GET", k])?)));
                match r {
                    Ok((set, get)) if set.is_ok() && get == V::s(&v) => {}
                    Ok(other) => f.lock().unwrap().push((Instant::now(), format!("{k}: {other:?}"))),
                    Err(e) => {
                        f.lock().unwrap().push((Instant::now(), format!("{k}: io {e}")));
                        thread::sleep(Duration::from_millis(50));
                        if let Ok(n) = Conn::try_connect(port) {
                            c = n;
                        }
                    }
                }
                ops += 1;
                thread::sleep(Duration::from_millis(2));
            }
            ops
        });
        Background { stop, failures, handle }
    }

    fn stop(self) -> (usize, Vec<(Instant, String)>) {
        self.stop.store(true, Ordering::Relaxed);
        let ops = self.handle.join().expect("background client");
        let f = self.failures.lock().unwrap().clone();
        (ops, f)
    }
}

fn check_all_keys(port: u16, skip: &str) {
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(port, proto);
        for i in 0..KEYS {
            if key(i) == skip {
                continue;
            }
            assert_eq!(c.cmd(&["GET", &key(i)]), V::s(format!("v{i}")), "{proto:?} {} after failover", key(i));
        }
        let keys: Vec<String> = (0..KEYS).map(key).filter(|k| k != skip).collect();
        let mut mget = vec!["MGET"];
        mget.extend(keys.iter().map(String::as_str));
        let r = c.cmd(&mget);
        assert!(r.items().iter().all(|v| matches!(v, V::Str(_))), "{proto:?} MGET after failover: {r:?}");
    }
}

/// A cluster with data written through the proxy, and the master owning `key(0)` (`old`)
/// with its replica (`new`) known to every node and in sync.
struct Setup {
    cluster: RedisCluster,
    proxy: Proxy,
    owners: SlotOwners,
    k0: String,
    old: u16,
    new: u16,
}

fn setup() -> Setup {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let owners = SlotOwners::read(&cluster);
    write_keys(&proxy, &owners);

    let k0 = key(0);
    let old = owners.of_key(k0.as_bytes());
    let new = cluster.replica_of(old);
    wait_replica_known(&cluster, old, new);
    wait_replicated(old, &owners.tag_on(old, "fo:probe"));
    Setup { cluster, proxy, owners, k0, old, new }
}

#[test]
fn manual_cluster_failover() {
    let Setup { cluster, proxy, owners, k0, old, new } = setup();
    let bg_keys: Vec<String> =
        (0..200).map(|i| format!("fo:bg{i}")).filter(|k| owners.of_key(k.as_bytes()) == old).collect();
    let bg = Background::start(proxy.port(), bg_keys);
    thread::sleep(Duration::from_millis(200));

    let started = Instant::now();
    assert_eq!(cmd_text(new, &["CLUSTER", "FAILOVER"]), "OK");
    wait_until(Duration::from_secs(15), "replica to become master", || {
        role(new).as_deref() == Some("master") && role(old).as_deref() == Some("slave")
    });
    let promoted = started.elapsed();
    for proto in Proto::BOTH {
        let (took, errors) = poll_until_serving(proxy.port(), proto, &k0, Duration::from_secs(15));
        eprintln!("{proto:?}: serving {took:?} after the promotion ({} failed attempts)", errors.len());
    }
    thread::sleep(Duration::from_millis(500));
    let settled = Instant::now();
    thread::sleep(Duration::from_millis(500));
    let (ops, failures) = bg.stop();
    eprintln!(
        "manual failover: promoted after {promoted:?}; background client {ops} ops, {} failures: {:?}",
        failures.len(),
        failures.iter().take(5).map(|(_, e)| e).collect::<Vec<_>>()
    );
    let late: Vec<_> = failures.iter().filter(|(t, _)| *t > settled).collect();
    assert!(late.is_empty(), "errors after the proxy was serving again: {late:?}");
    // a graceful failover is invisible: the old master answers MOVED, the proxy follows
    assert!(
        failures.is_empty(),
        "a client of the proxy saw errors during a manual failover: {:?}",
        failures.iter().map(|(_, e)| e).collect::<Vec<_>>()
    );
    assert!(ops > 50, "background client made little progress ({ops} ops)");

    // data survived, new writes land on the promoted replica
    check_all_keys(proxy.port(), &k0);
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["SET", &k0, "after-failover"]), V::ok());
    assert_eq!(cmd_text(new, &["GET", &k0]), "after-failover");
    cluster.wait_ok(Duration::from_secs(30));
    assert_eq!(cluster.master_for_key(k0.as_bytes()), new);
    assert!(proxy.is_alive());
}

#[test]
fn master_killed_with_sigkill() {
    let Setup { cluster, proxy, owners, k0, old, new } = setup();

    cluster.kill(old);
    let killed = Instant::now();
    let mut first = None;
    for proto in Proto::BOTH {
        let (took, errors) = poll_until_serving(proxy.port(), proto, &k0, Duration::from_secs(15));
        first.get_or_insert(took);
        eprintln!(
            "{proto:?}: serving again {:?} after kill -9 ({} failed attempts, first: {:?})",
            killed.elapsed(),
            errors.len(),
            errors.first()
        );
    }
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(15), "proxy served again only after {took:?}");

    // every acknowledged write before the kill is readable; writes go to the new master
    check_all_keys(proxy.port(), &k0);
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["SET", &k0, "after-kill"]), V::ok());
    assert_eq!(cmd_text(new, &["GET", &k0]), "after-kill");
    // keys of the other masters were never affected
    for i in 0..KEYS {
        if owners.of_key(key(i).as_bytes()) != old {
            assert_eq!(c.cmd(&["GET", &key(i)]), V::s(format!("v{i}")));
        }
    }
    cluster.wait_ok(Duration::from_secs(30));
    assert_eq!(cluster.master_for_key(k0.as_bytes()), new);
    assert!(proxy.is_alive());
}

/// Transactions in a loop and a client blocked in BLPOP on the failing master: no
/// transaction fails or runs twice, and the blocked client, re-issued to the promoted
/// replica, gets an element pushed after the failover.
#[test]
fn transactions_and_a_blocked_client_ride_out_a_manual_failover() {
    let Setup { cluster, proxy, owners, old, new, .. } = setup();
    let t = owners.tag_on(old, "fo:tx");
    let (counter, list) = (format!("{t}n"), format!("{t}q"));
    let port = proxy.port();
    let mut blocked = Conn::connect(port);
    blocked.send(&["BLPOP", &list, "0"]);
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let c2 = counter.clone();
    let tx = thread::spawn(move || {
        let mut c = Conn::connect(port);
        let (mut ok, mut failures) = (0i64, Vec::new());
        while !s.load(Ordering::Relaxed) {
            let replies = c.pipeline(&[
                common::client::args(&["MULTI"]),
                common::client::args(&["INCR", &c2]),
                common::client::args(&["EXEC"]),
            ]);
            match &replies[2] {
                V::Arr(items) if items.len() == 1 && matches!(items[0], V::Int(_)) => ok += 1,
                other => failures.push(format!("{other:?}")),
            }
            thread::sleep(Duration::from_millis(2));
        }
        (ok, failures)
    });
    thread::sleep(Duration::from_millis(300));
    assert_eq!(cmd_text(new, &["CLUSTER", "FAILOVER"]), "OK");
    wait_until(Duration::from_secs(15), "replica to become master", || {
        role(new).as_deref() == Some("master") && role(old).as_deref() == Some("slave")
    });
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let (ok, failures) = tx.join().expect("transaction loop");
    eprintln!("transactions during the failover: {ok} ran, failures {failures:?}");
    assert!(failures.is_empty(), "a client saw transactions fail during a manual failover: {failures:?}");
    assert!(ok > 50, "only {ok} transactions ran");
    // each ran once: the counter is the number of successful EXECs
    assert_eq!(cmd_text(new, &["GET", &counter]), ok.to_string());
    // the blocked client waits on the new master now
    assert_eq!(Conn::connect(port).cmd(&["RPUSH", &list, "after"]), V::Int(1));
    blocked.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(blocked.read_reply(), V::strs(&[list.as_str(), "after"]));
    cluster.wait_ok(Duration::from_secs(30));
    assert!(proxy.is_alive());
}

/// A keyless write goes to every master as the proxy's map names them. Right after a
/// failover (before any refresh) the old master is a replica and answers READONLY; the
/// proxy finds the replica promoted in its place and sends the write there instead.
#[test]
fn a_keyless_write_right_after_a_failover_reaches_the_new_master() {
    let cluster = RedisCluster::start();
    // no periodic refresh during the test: only the READONLY itself can teach the proxy
    let (_d, conf) = common::config_file("[backend]\nrefresh_interval_ms = 600000\n");
    let proxy = Proxy::start_cluster(&cluster, &["--config", &conf]);
    let owners = SlotOwners::read(&cluster);
    let old = owners.masters()[0];
    let new = cluster.replica_of(old);
    wait_replica_known(&cluster, old, new);
    let lib = |v: u32| format!("#!lua name=folib\nredis.register_function('fo_v', function() return {v} end)");
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", "REPLACE", &lib(1)]), V::s("folib"));
    wait_until(Duration::from_secs(10), "the library on the replica", || {
        cmd_text(new, &["FUNCTION", "LIST"]).contains("folib")
    });

    assert_eq!(cmd_text(new, &["CLUSTER", "FAILOVER"]), "OK");
    wait_until(Duration::from_secs(15), "replica to become master", || {
        role(new).as_deref() == Some("master") && role(old).as_deref() == Some("slave")
    });
    // the proxy's map still names `old`, which refuses writes now
    let direct = cmd_text(old, &["FUNCTION", "LOAD", "REPLACE", &lib(2)]);
    assert!(direct.starts_with("READONLY"), "the old master should refuse the write, got {direct:?}");
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        let t = Instant::now();
        assert_eq!(c.cmd(&["FUNCTION", "LOAD", "REPLACE", &lib(2)]), V::s("folib"), "{proto:?}");
        eprintln!("{proto:?}: FUNCTION LOAD right after the failover answered in {:?}", t.elapsed());
    }
    cluster.wait_ok(Duration::from_secs(30));
    for m in cluster.masters() {
        assert_eq!(cmd_text(m, &["FCALL", "fo_v", "0"]), "2", "the new library on master {m}");
    }
    let readonly =
        common::http::scrape_series(&proxy.metrics_addr().unwrap(), "heatshield_retries_total{reason=\"readonly\"}");
    assert!(readonly.is_some_and(|n| n >= 1.0), "writes sent again after READONLY: {readonly:?}");
    assert!(proxy.is_alive());
}
