//! No request left without a reply: `kill -9` of a master under 20 writing clients,
//! three times in a row (each killed node restarted as a replica before the next kill).
//! Every request gets its reply or a Redis-style error well within the proxy's reply
//! deadline, and no acknowledged write is lost beyond what Redis itself lost (an async
//! replica promoted without the master's last writes, seen as a counter going back).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V};
use common::{Proxy, RedisCluster, SlotOwners, cmd_text, info_field};

const WRITERS: usize = 20;
const KILLS: usize = 3;
/// What a request may take at most here: the default command timeout (5 s) plus the 5 s
/// retry window. The proxy's own safety net answers at 15 s, so a stranded request shows
/// as a wait beyond this, not as a hang.
const BOUND: Duration = Duration::from_secs(10);

struct Outcome {
    ops: u64,
    errors: u64,
    slowest: Duration,
    /// increments Redis acknowledged and then lost (the counter went back)
    redis_lost: i64,
    last_acked: i64,
    problems: Vec<String>,
}

fn writer(port: u16, key: String, stop: Arc<AtomicBool>) -> thread::JoinHandle<Outcome> {
    thread::spawn(move || {
        let mut o =
            Outcome { ops: 0, errors: 0, slowest: Duration::ZERO, redis_lost: 0, last_acked: 0, problems: vec![] };
        let mut c = Conn::connect(port);
        c.stream().set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let r = c.try_cmd(&["INCR", &key]);
            let took = t.elapsed();
            o.slowest = o.slowest.max(took);
            match r {
                Ok(V::Int(v)) => {
                    if v <= o.last_acked {
                        o.redis_lost += o.last_acked - v + 1;
                    }
                    o.last_acked = v;
                    o.ops += 1;
                }
                Ok(V::Err(e)) => {
                    o.errors += 1;
                    // the errors a failover may show: the node is gone, or a written
                    // request lost its connection (it may have run)
                    if !(e.starts_with("CLUSTERDOWN") || e.starts_with("ERR heatshield: connection to")) {
                        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                        o.problems.push(format!("INCR {key}: unexpected error {e:?} at {:.3}", at.as_secs_f64()));
                    }
                    thread::sleep(Duration::from_millis(20));
                }
                Ok(other) => o.problems.push(format!("INCR {key}: {other:?}")),
                Err(e) => {
                    o.problems.push(format!("INCR {key}: no reply after {took:?}: {e}"));
                    return o;
                }
            }
            if took > BOUND {
                o.problems.push(format!("INCR {key}: reply after {took:?}"));
            }
        }
        o
    })
}

fn role(port: u16) -> Option<String> {
    info_field(&cmd_text(port, &["INFO", "replication"]), "role")
}

#[test]
fn kill_9_of_masters_under_write_load_leaves_no_request_unanswered() {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let owners = SlotOwners::read(&cluster);
    let port = proxy.port();
    // writers spread over every master
    let keys: Vec<String> =
        (0..WRITERS).map(|i| owners.tag_on(owners.masters()[i % RedisCluster::MASTERS], &format!("kl:w{i}"))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = keys.iter().map(|k| writer(port, k.clone(), stop.clone())).collect();
    thread::sleep(Duration::from_millis(300));

    for round in 0..KILLS {
        let masters = cluster.masters();
        let victim = masters[round % masters.len()];
        let replica = cluster.replica_of(victim);
        // the replica has caught up on the link before the kill
        common::wait_until(Duration::from_secs(15), "replica link up", || {
            info_field(&cmd_text(replica, &["INFO", "replication"]), "master_link_status").as_deref() == Some("up")
        });
        let t = Instant::now();
        cluster.kill(victim);
        cluster.wait_ok(Duration::from_secs(30));
        let failed_over = t.elapsed();
        cluster.restart(victim);
        common::wait_until(Duration::from_secs(30), "killed master to rejoin as a replica", || {
            role(victim).as_deref() == Some("slave")
                && info_field(&cmd_text(victim, &["INFO", "replication"]), "master_link_status").as_deref()
                    == Some("up")
        });
        eprintln!(
            "round {round}: killed {victim}, {replica} promoted after {failed_over:?}, {victim} back as a replica"
        );
    }
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);

    let mut problems = Vec::new();
    let (mut ops, mut errors, mut lost, mut slowest) = (0, 0, 0, Duration::ZERO);
    let mut c = Conn::connect(port);
    for (h, key) in writers.into_iter().zip(&keys) {
        let o = h.join().expect("writer");
        ops += o.ops;
        errors += o.errors;
        lost += o.redis_lost;
        slowest = slowest.max(o.slowest);
        problems.extend(o.problems);
        // every write acknowledged since Redis last lost some is there
        let now = c.cmd(&["GET", key]);
        if now != V::s(o.last_acked.to_string()) {
            problems.push(format!("{key}: last acknowledged {} but the key holds {now:?}", o.last_acked));
        }
    }
    eprintln!(
        "{KILLS} kills: {ops} INCRs acknowledged, {errors} errors, slowest reply {slowest:?}, \
         {lost} acknowledged increments lost by Redis (async replication)"
    );
    if !problems.is_empty() {
        for l in proxy.log().lines().filter(|l| l.contains("topology") || l.contains("WARN")) {
            eprintln!("proxy: {l}");
        }
    }
    assert!(problems.is_empty(), "{} problems: {:#?}", problems.len(), &problems[..problems.len().min(20)]);
    assert!(ops > 1000, "little progress: {ops} INCRs");
    assert!(proxy.is_alive());
}
