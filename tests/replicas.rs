//! Replica reads (docs/replicas.md) on a real 3+3 cluster: where reads and writes land
//! (each node's own `INFO commandstats`), a replica killed or paused, read-your-writes,
//! and the `replica` and `any` policies.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V, args};
use common::{Proxy, RedisCluster, SlotOwners, cmdstat_calls, info_field, wait_until};

/// No hot-key cache (its answers never reach a node), replicas read.
fn conf(read_from: &str, extra: &str) -> String {
    format!(
        "[cache]\nenabled = false\n[backend]\nread_from = \"{read_from}\"\nreplica_max_lag_ms = 500\ncommand_timeout_ms = 1000\n{extra}"
    )
}

fn calls(port: u16, cmd: &str) -> u64 {
    cmdstat_calls(port, cmd)
}

/// `errorstat_<code>` count of a node.
fn errors(port: u16, code: &str) -> u64 {
    let info = common::cmd_text(port, &["INFO", "errorstats"]);
    info_field(&info, &format!("errorstat_{code}"))
        .and_then(|l| l.strip_prefix("count=").and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// Waits until heatshield reads `key`'s slot from a replica: `GET` until the replica's
/// count of GETs grows.
fn wait_replica_serving(port: u16, replica: u16, key: &str) {
    wait_until(Duration::from_secs(10), "reads to reach the replica", || {
        let before = calls(replica, "get");
        Conn::connect(port).cmd(&["GET", key]);
        calls(replica, "get") > before
    });
}

struct Setup {
    cluster: RedisCluster,
    owners: SlotOwners,
    proxy: Proxy,
    _dir: tempfile::TempDir,
}

fn setup(read_from: &str, extra: &str) -> Setup {
    let cluster = RedisCluster::start();
    let owners = SlotOwners::read(&cluster);
    let (dir, path) = common::config_file(&conf(read_from, extra));
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    Setup { cluster, owners, proxy, _dir: dir }
}

/// One key per master, written through heatshield.
fn keys(s: &Setup, prefix: &str) -> Vec<(u16, String)> {
    let keys = s.owners.key_per_master(prefix);
    let mut c = Conn::connect(s.proxy.port());
    for (_, k) in &keys {
        assert_eq!(c.cmd(&["SET", k, "v"]), V::ok());
    }
    keys
}

#[test]
fn prefer_replica_sends_reads_to_replicas_and_never_a_write() {
    let s = setup("prefer-replica", "");
    let port = s.proxy.port();
    let keys = keys(&s, "rr:k");
    let masters: Vec<u16> = keys.iter().map(|(m, _)| *m).collect();
    let replicas: Vec<u16> = masters.iter().map(|&m| s.cluster.replica_of(m)).collect();
    for ((_, k), &r) in keys.iter().zip(&replicas) {
        wait_replica_serving(port, r, k);
    }
    let before: Vec<(u64, u64)> =
        masters.iter().zip(&replicas).map(|(&m, &r)| (calls(m, "get"), calls(r, "get"))).collect();
    // 3,000 reads: one at a time, pipelined, and MGET across the three masters
    let mut c = Conn::connect(port);
    for i in 0..1000 {
        assert_eq!(c.cmd(&["GET", &keys[i % 3].1]), V::s("v"));
    }
    let pipe: Vec<Vec<Vec<u8>>> = (0..1000).map(|i| args(&["GET", &keys[i % 3].1])).collect();
    assert!(c.pipeline(&pipe).iter().all(|v| *v == V::s("v")));
    let mget_before: u64 = replicas.iter().map(|&r| calls(r, "mget")).sum();
    for _ in 0..100 {
        let r = c.cmd(&["MGET", &keys[0].1, &keys[1].1, &keys[2].1]);
        assert_eq!(r, V::strs(&["v", "v", "v"]));
    }
    let after: Vec<(u64, u64)> =
        masters.iter().zip(&replicas).map(|(&m, &r)| (calls(m, "get"), calls(r, "get"))).collect();
    let nodes = c.cmd(&["PROXY", "NODES"]).text();
    assert_eq!(nodes.lines().filter(|l| l.contains(" replica of=") && l.contains(" lag_ms=")).count(), 3, "{nodes}");
    let on_masters: u64 = before.iter().zip(&after).map(|(b, a)| a.0 - b.0).sum();
    let on_replicas: u64 = before.iter().zip(&after).map(|(b, a)| a.1 - b.1).sum();
    let mget: u64 = replicas.iter().map(|&r| calls(r, "mget")).sum::<u64>() - mget_before;
    eprintln!("GET on the masters {on_masters}, on the replicas {on_replicas}; MGET parts on the replicas {mget}");
    assert_eq!(on_masters, 0, "reads reached the masters");
    assert_eq!(on_replicas, 2000);
    assert_eq!(mget, 300, "each MGET's three parts on the replicas");
    // every replica took its share
    assert!(before.iter().zip(&after).all(|(b, a)| a.1 - b.1 >= 600));

    // read-only scripts too
    let ro: u64 = replicas.iter().map(|&r| calls(r, "eval_ro")).sum();
    for (_, k) in &keys {
        assert_eq!(c.cmd(&["EVAL_RO", "return redis.call('GET', KEYS[1])", "1", k]), V::s("v"));
    }
    assert_eq!(replicas.iter().map(|&r| calls(r, "eval_ro")).sum::<u64>() - ro, 3, "EVAL_RO on the replicas");
    assert_eq!(masters.iter().map(|&m| calls(m, "eval_ro")).sum::<u64>(), 0);

    // writes, transactions, WATCH and blocking commands: never on a replica
    let replica_gets: Vec<u64> = replicas.iter().map(|&r| calls(r, "get")).collect();
    let moved: Vec<u64> = replicas.iter().map(|&r| errors(r, "MOVED")).collect();
    for i in 0..300 {
        let k = &keys[i % 3].1;
        assert_eq!(c.cmd(&["SET", k, &format!("w{i}")]), V::ok());
        assert_eq!(c.cmd(&["INCR", &format!("{k}:n")]), V::Int(i as i64 / 3 + 1));
    }
    let tx = c.pipeline(&[args(&["MULTI"]), args(&["GET", &keys[0].1]), args(&["EXEC"])]);
    assert_eq!(tx[2], V::Arr(vec![V::s("w297")]));
    assert_eq!(c.cmd(&["WATCH", &keys[1].1]), V::ok());
    assert_eq!(c.cmd(&["GET", &keys[1].1]), V::s("w298"));
    let tx = c.pipeline(&[args(&["MULTI"]), args(&["SET", &keys[1].1, "tx"]), args(&["EXEC"])]);
    assert_eq!(tx[2], V::Arr(vec![V::ok()]));
    assert_eq!(c.cmd(&["BLPOP", &format!("{}:list", keys[2].1), "0.1"]), V::Nil);
    let blocked: u64 = replicas.iter().map(|&r| calls(r, "blpop")).sum();
    assert_eq!(blocked, 0, "BLPOP on a replica");
    assert_eq!(replicas.iter().map(|&r| errors(r, "MOVED")).collect::<Vec<_>>(), moved, "a write reached a replica");
    assert_eq!(
        replicas.iter().map(|&r| calls(r, "get")).collect::<Vec<_>>(),
        replica_gets,
        "the GETs in MULTI / under WATCH"
    );
    // what the replicas ran of those writes came from their masters
    for (&m, &r) in masters.iter().zip(&replicas) {
        wait_until(Duration::from_secs(5), "the replica to apply the writes", || calls(r, "set") == calls(m, "set"));
    }
    assert!(s.proxy.is_alive());
}

/// A client's read right after its own write sees it, 1,000 times in a row and 200
/// times pipelined; and how long after a write its reads go back to the replica.
#[test]
fn a_client_reads_its_own_writes() {
    let s = setup("prefer-replica", "replica_check_interval_ms = 50\n");
    let port = s.proxy.port();
    let keys = keys(&s, "ryw:k");
    let (m, k) = keys[0].clone();
    let r = s.cluster.replica_of(m);
    wait_replica_serving(port, r, &k);
    let mut c = Conn::connect(port);
    let (master_before, replica_before) = (calls(m, "get"), calls(r, "get"));
    for i in 0..1000 {
        assert_eq!(c.cmd(&["SET", &k, &format!("x{i}")]), V::ok());
        assert_eq!(c.cmd(&["GET", &k]), V::s(format!("x{i}")), "read after its own write, round {i}");
    }
    for i in 0..200 {
        let v = format!("p{i}");
        let r = c.pipeline(&[args(&["SET", &k, &v]), args(&["GET", &k])]);
        assert_eq!(r[1], V::s(&v), "pipelined read after its own write, round {i}");
    }
    eprintln!(
        "1200 reads right after their own write: {} on the master, {} on the replica",
        calls(m, "get") - master_before,
        calls(r, "get") - replica_before
    );
    // the window: from a write's reply until this client's reads go to the replica again
    let mut windows = vec![];
    for i in 0..10 {
        assert_eq!(c.cmd(&["SET", &k, &format!("w{i}")]), V::ok());
        let wrote = Instant::now();
        loop {
            let before = calls(r, "get");
            assert_eq!(c.cmd(&["GET", &k]), V::s(format!("w{i}")));
            if calls(r, "get") > before {
                windows.push(wrote.elapsed());
                break;
            }
            assert!(wrote.elapsed() < Duration::from_secs(5), "reads never went back to the replica");
            thread::sleep(Duration::from_millis(2));
        }
    }
    windows.sort();
    eprintln!(
        "read-your-writes window (replica_check_interval_ms = 50): median {:?}, max {:?}",
        windows[5], windows[9]
    );
    assert!(windows[9] < Duration::from_secs(1));
    // another client, which wrote nothing, reads from the replica at once
    let before = calls(r, "get");
    assert_eq!(c.cmd(&["SET", &k, "last"]), V::ok());
    let mut other = Conn::connect(port);
    let got = other.cmd(&["GET", &k]);
    assert!(got == V::s("last") || got == V::s("w9"), "{got:?}");
    assert_eq!(calls(r, "get"), before + 1, "a client that wrote nothing waits for no one");
}

/// A killed replica: reads go on, on the master, with no error; the promoted
/// replica of a killed master takes writes at once.
#[test]
fn a_killed_replica_or_master_costs_no_read() {
    let s = setup("prefer-replica", "");
    let port = s.proxy.port();
    let keys = keys(&s, "kr:k");
    let (m, k) = keys[1].clone();
    let r = s.cluster.replica_of(m);
    wait_replica_serving(port, r, &k);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (k, stop) = (k.clone(), stop.clone());
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                let (mut n, mut failed, mut slowest) = (0u64, vec![], Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match c.try_cmd(&["GET", &k]) {
                        Ok(V::Str(_)) => n += 1,
                        other => failed.push(format!("{other:?}")),
                    }
                    slowest = slowest.max(t.elapsed());
                }
                (n, failed, slowest)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    let master_before = calls(m, "get");
    s.cluster.kill(r);
    thread::sleep(Duration::from_millis(1000));
    let on_master = calls(m, "get") - master_before;
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<(u64, Vec<String>, Duration)> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    let failed: Vec<&String> = seen.iter().flat_map(|x| &x.1).collect();
    let slowest = seen.iter().map(|x| x.2).max().unwrap();
    eprintln!(
        "replica killed: {} reads, {} failed, slowest {slowest:?}; {on_master} on the master in the second after",
        seen.iter().map(|x| x.0).sum::<u64>(),
        failed.len()
    );
    assert!(failed.is_empty(), "reads failed when a replica died: {failed:?}");
    assert!(on_master > 100, "reads did not move to the master");
    assert!(slowest < Duration::from_millis(1000), "a read waited {slowest:?}");

    // a master killed: its replica is promoted and takes writes; reads follow
    let (m2, k2) = keys[2].clone();
    let r2 = s.cluster.replica_of(m2);
    wait_replica_serving(port, r2, &k2);
    s.cluster.kill(m2);
    s.cluster.wait_ok(Duration::from_secs(30));
    let mut c = Conn::connect(port);
    wait_until(Duration::from_secs(10), "writes to the promoted replica", || {
        c.try_cmd(&["SET", &k2, "promoted"]).is_ok_and(|v| v.is_ok())
    });
    assert_eq!(common::cmd_text(r2, &["GET", &k2]), "promoted");
    assert_eq!(c.cmd(&["GET", &k2]), V::s("promoted"));
    assert!(s.proxy.is_alive());
}

/// A paused replica (SIGSTOP: it answers nothing while its master goes on) falls behind
/// the lag limit and is skipped; once resumed and caught up, it is read again.
#[test]
fn a_replica_behind_the_lag_limit_is_skipped() {
    let s = setup("prefer-replica", "");
    let port = s.proxy.port();
    let keys = keys(&s, "lag:k");
    let (m, k) = keys[0].clone();
    let r = s.cluster.replica_of(m);
    wait_replica_serving(port, r, &k);
    let pid = s.cluster.nodes().iter().find(|n| n.port() == r).unwrap().pid();
    let signal = |sig: &str| {
        assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
    };
    signal("-STOP");
    let paused = Instant::now();
    let mut c = Conn::connect(port);
    // writes go on on the master, reads too, with no error
    let master_before = calls(m, "get");
    let mut slowest = Duration::ZERO;
    let mut n = 0;
    while paused.elapsed() < Duration::from_millis(2500) {
        assert_eq!(Conn::connect(port).cmd(&["SET", &k, &format!("p{n}")]), V::ok());
        let t = Instant::now();
        assert_eq!(c.cmd(&["GET", &k]), V::s(format!("p{n}")));
        slowest = slowest.max(t.elapsed());
        n += 1;
        thread::sleep(Duration::from_millis(5));
    }
    let on_master = calls(m, "get") - master_before;
    let lag = common::http::scrape_series(
        &s.proxy.metrics_addr().unwrap(),
        &format!("heatshield_replica_lag_seconds{{node=\"127.0.0.1:{r}\"}}"),
    );
    signal("-CONT");
    eprintln!("replica paused: {n} reads, {on_master} on the master, slowest {slowest:?}; lag gauge {lag:?}");
    assert!(on_master as f64 >= n as f64 * 0.9, "reads stayed on the paused replica");
    assert!(slowest < Duration::from_millis(1500), "a read waited {slowest:?}");
    // resumed, it catches up and serves reads again
    wait_replica_serving(port, r, &keys[0].1);
}

/// `replica`: reads only from a replica in sync, else an error; `any`: the masters and
/// the replicas both serve.
#[test]
fn replica_and_any_policies() {
    let rules = "[[backend.read_rules]]\npattern = \"only:*\"\nread_from = \"replica\"\n\
                 [[backend.read_rules]]\npattern = \"master:*\"\nread_from = \"master\"\n";
    let s = setup("any", rules);
    let port = s.proxy.port();
    let only = keys(&s, "only:k");
    let spread = keys(&s, "any:k");
    let pinned = keys(&s, "master:k");
    let (m, k) = only[0].clone();
    let r = s.cluster.replica_of(m);
    wait_replica_serving(port, r, &k);
    // any: spread by client over the master and its replica (once heatshield knows it)
    wait_replica_serving(port, s.cluster.replica_of(spread[1].0), &spread[1].1);
    let (mb, rb) = (calls(spread[1].0, "get"), calls(s.cluster.replica_of(spread[1].0), "get"));
    for _ in 0..40 {
        assert_eq!(Conn::connect(port).cmd(&["GET", &spread[1].1]), V::s("v"));
    }
    let (md, rd) = (calls(spread[1].0, "get") - mb, calls(s.cluster.replica_of(spread[1].0), "get") - rb);
    eprintln!("any: 40 clients, {md} reads on the master, {rd} on the replica");
    assert!(md > 5 && rd > 5, "any did not spread: master {md}, replica {rd}");
    // master: a rule keeps its keys on the master
    let rb = calls(s.cluster.replica_of(pinned[2].0), "get");
    for _ in 0..20 {
        assert_eq!(Conn::connect(port).cmd(&["GET", &pinned[2].1]), V::s("v"));
    }
    assert_eq!(calls(s.cluster.replica_of(pinned[2].0), "get"), rb);
    // replica: once the replica is gone, its keys are refused, the others served
    s.cluster.kill(r);
    let mut c = Conn::connect(port);
    wait_until(Duration::from_secs(5), "the dead replica to be skipped", || {
        c.cmd(&["GET", &k]).err().is_some_and(|e| e.contains("no replica in sync"))
    });
    let e = c.cmd(&["GET", &k]);
    assert!(e.err().is_some_and(|e| e.starts_with("ERR no replica in sync serves slot")), "{e:?}");
    assert_eq!(c.cmd(&["GET", &only[1].1]), V::s("v"));
    assert_eq!(c.cmd(&["GET", &spread[0].1]), V::s("v"));
    // writes to its keys still go to the master
    assert_eq!(c.cmd(&["SET", &k, "w"]), V::ok());
    assert!(s.proxy.is_alive());
}

/// A manual failover (`CLUSTER FAILOVER`) while clients read and write through a
/// `prefer-replica` heatshield: the replica read from becomes the master, the master a
/// replica; reads and writes go on with no error, and each client reads its own writes.
#[test]
fn a_manual_failover_under_replica_reads() {
    let s = setup("prefer-replica", "");
    let port = s.proxy.port();
    let keys = keys(&s, "mf:k");
    let (m, k) = keys[0].clone();
    let r = s.cluster.replica_of(m);
    wait_replica_serving(port, r, &k);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            let k = format!("{k}:{i}");
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                let (mut n, mut failed) = (0u64, vec![]);
                while !stop.load(Ordering::Relaxed) {
                    let v = format!("v{n}");
                    let set = c.try_cmd(&["SET", &k, &v]);
                    // a read of another client's key (may go to a replica), then its own
                    let other = c.try_cmd(&["GET", &format!("{}:{}", &k[..k.len() - 2], (i + 1) % 4)]);
                    let get = c.try_cmd(&["GET", &k]);
                    match (set, other, get) {
                        (Ok(s), Ok(o), Ok(g)) if s.is_ok() && !o.is_err() && g == V::s(&v) => {}
                        other => failed.push(format!("{other:?}")),
                    }
                    n += 1;
                    thread::sleep(Duration::from_millis(1));
                }
                (n, failed)
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    assert_eq!(common::cmd_text(r, &["CLUSTER", "FAILOVER"]), "OK");
    wait_until(Duration::from_secs(15), "the replica to become master", || {
        common::try_cmd(r, &["ROLE"]).ok().is_some_and(|v| v.items().first() == Some(&V::s("master")))
    });
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<(u64, Vec<String>)> = clients.into_iter().map(|h| h.join().unwrap()).collect();
    let failed: Vec<&String> = seen.iter().flat_map(|x| &x.1).collect();
    eprintln!(
        "manual failover under replica reads: {} rounds, {} failed",
        seen.iter().map(|x| x.0).sum::<u64>(),
        failed.len()
    );
    assert!(failed.is_empty(), "{:?}", &failed[..failed.len().min(5)]);
    // the old master is a replica now, and serves reads
    wait_replica_serving(port, m, &k);
}

/// A read rule's pattern matches a key's client name under a colocation rule, as every
/// other rule's pattern does: `col:*` keys, stored as `{col}col:...`, stay on the masters.
#[test]
fn read_rules_match_the_client_names_of_colocated_keys() {
    let extra = "[[backend.read_rules]]\npattern = \"col:*\"\nread_from = \"master\"\n\n\
                 [[colocate]]\nname = \"c\"\nkeys = [\"col:*\"]\ntag = \"col\"\n";
    let s = setup("prefer-replica", extra);
    let port = s.proxy.port();
    let mut c = Conn::connect(port);
    assert_eq!(c.cmd(&["SET", "col:a", "1"]), V::ok());
    let m = s.cluster.master_for_key(b"{col}col:a");
    let r = s.cluster.replica_of(m);
    // another key of that master is read from its replica
    let other = s.owners.tag_on(m, "x");
    assert_eq!(c.cmd(&["SET", &other, "2"]), V::ok());
    wait_replica_serving(port, r, &other);
    let (mb, rb) = (calls(m, "get"), calls(r, "get"));
    for _ in 0..50 {
        assert_eq!(Conn::connect(port).cmd(&["GET", "col:a"]), V::s("1"));
    }
    assert_eq!((calls(m, "get") - mb, calls(r, "get") - rb), (50, 0));
}
