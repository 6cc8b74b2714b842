//! heatshield's own connections to the nodes (src/upstream/side.rs): each says what it is
//! for in `CLIENT LIST` (`heatshield-<purpose>`), and none of them carries the data
//! connections' settings (tracking redirected to the invalidation connection, READONLY).
//! Against a 3+3 cluster of its own, with the cache, a read rule (the lag probe), a
//! fleet (its sync) and pub/sub in use, and a WAIT blocked while the nodes are looked at.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::client::{Conn, V};
use common::{Proxy, RedisCluster, cmd, config_file};

const CONF: &str = r#"
[fleet]
name = "side"

[[backend.read_rules]]
pattern = "rr:*"
read_from = "replica"
max_lag_ms = 5000

[[ratelimit.rules]]
name = "side"
pattern = "side:*"
rate = 1000
burst = 1000
"#;

/// `CLIENT LIST` of a node: (name, flags) of every connection but the asker's.
fn clients(port: u16) -> Vec<(String, String)> {
    let text = cmd(port, &["CLIENT", "LIST"]).text();
    text.lines()
        .filter(|l| !l.contains(" cmd=client|list "))
        .map(|l| {
            let field =
                |f: &str| l.split(' ').find_map(|p| p.strip_prefix(&format!("{f}="))).unwrap_or_default().to_string();
            (field("name"), field("flags"))
        })
        .collect()
}

#[test]
fn every_side_connection_is_named_and_carries_no_tracking() {
    let cluster = RedisCluster::start();
    let (_dir, path) = config_file(CONF);
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let mut c = Conn::connect(proxy.port());
    // a subscriber (the pub/sub link; the lock task's release subscriber is up from the start)
    let mut sub = Conn::connect(proxy.port());
    assert_eq!(sub.cmd(&["SUBSCRIBE", "side:news"]).items()[0], V::s("subscribe"));
    assert_eq!(c.cmd(&["SET", "side:k", "v"]), V::ok());

    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut tracked: Vec<String> = Vec::new();
    // the lag probes connect one by one: every other side connection is up first (a
    // WAIT's are only while it waits)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lag: usize =
            cluster.ports().into_iter().map(|p| clients(p).iter().filter(|(n, _)| n == "heatshield-lag").count()).sum();
        if lag >= 6 {
            break;
        }
        assert!(Instant::now() < deadline, "{lag} lag probes after 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    // a WAIT that blocks (two replicas asked, one per master): its connections are open
    // on every master while the nodes are looked at
    let port = proxy.port();
    let waiting = std::thread::spawn(move || Conn::connect(port).cmd(&["WAIT", "2", "3000"]));
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        seen.clear();
        tracked.clear();
        for port in cluster.ports() {
            for (name, flags) in clients(port) {
                if let Some(purpose) = name.strip_prefix("heatshield-") {
                    *seen.entry(purpose.to_string()).or_default() += 1;
                    // tracking ('t') and READONLY ('r') are the data connections' alone; the
                    // invalidation connection is where their tracking reports
                    if purpose != "invalidations" && (flags.contains('t') || flags.contains('r')) {
                        tracked.push(format!("{port} {name} flags={flags}"));
                    }
                }
            }
        }
        let all = ["invalidations", "lag", "fleet", "pubsub", "locks", "wait"].iter().all(|p| seen.contains_key(*p));
        if all && seen["wait"] >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "side connections seen: {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(tracked.is_empty(), "side connections with the data connections' settings: {tracked:?}");
    // one invalidation connection per master, one lag probe on each replica and its master
    assert_eq!(seen["invalidations"], 3, "{seen:?}");
    assert_eq!(seen["lag"], 6, "{seen:?}");
    assert_eq!(waiting.join().unwrap(), V::Int(1));
}
