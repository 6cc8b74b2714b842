//! heatshield's view of itself: PROXY INFO / NODES / CONFIG / SLOWLOG / BIGKEYS / AUTH,
//! INFO commandstats and latencystats, and the counters behind /metrics, against a real
//! cluster. RESP2 and RESP3.

mod common;

use std::time::Duration;

use common::client::{Conn, Proto, V};
use common::{Proxy, RedisCluster, SlotOwners, config_file, http_get};

fn field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(&format!("{name}:")).map(|v| v.trim().to_string()))
}

/// The value of one sample line of the Prometheus exposition.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
}

#[test]
fn proxy_info_nodes_and_config() {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let owners = SlotOwners::read(&cluster);
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        let info = c.cmd(&["PROXY", "INFO"]).text();
        assert_eq!(field(&info, "backend_mode").as_deref(), Some("cluster"), "{info}");
        assert_eq!(field(&info, "backend_masters").as_deref(), Some("3"), "{info}");
        assert!(field(&info, "slot_map_epoch").unwrap().parse::<u64>().unwrap() >= 1);
        assert_eq!(field(&info, "version").as_deref(), Some(env!("CARGO_PKG_VERSION")));

        // NODES: every master with exactly its slots, and its replica
        let nodes = c.cmd(&["PROXY", "NODES"]).text();
        let masters: Vec<&str> = nodes.lines().filter(|l| l.contains(" master ")).collect();
        assert_eq!(masters.len(), 3, "{nodes}");
        let mut covered = 0;
        for line in &masters {
            let port: u16 = line.split_whitespace().next().unwrap().rsplit(':').next().unwrap().parse().unwrap();
            let slots = line.split("slots=").nth(1).unwrap().split_whitespace().next().unwrap();
            for range in slots.split(',') {
                let (a, b) = range
                    .split_once('-')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .unwrap_or((range.to_string(), range.to_string()));
                let (a, b): (u16, u16) = (a.parse().unwrap(), b.parse().unwrap());
                for s in [a, b] {
                    assert_eq!(owners.of_slot(s), port, "{line}");
                }
                covered += (b - a) as usize + 1;
            }
        }
        assert_eq!(covered, 16384, "{nodes}");
        // replicas appear once the slot map lists them (right after the cluster is created
        // it may not yet: the next refresh picks them up)
        common::wait_until(Duration::from_secs(15), "PROXY NODES to list 3 replicas", || {
            let nodes = c.cmd(&["PROXY", "NODES"]).text();
            nodes.lines().filter(|l| l.contains(" replica of=")).count() == 3
        });

        // CONFIG GET with a glob, CONFIG SET of a live key, and of a key that is not live
        let got = c.cmd(&["PROXY", "CONFIG", "GET", "admin.slowlog*"]).pairs();
        let keys: Vec<String> = got.iter().map(|(k, _)| k.text()).collect();
        assert_eq!(keys, ["admin.slowlog_max_len", "admin.slowlog_slower_than_us"]);
        let got = c.cmd(&["PROXY", "CONFIG", "GET", "cache.*"]).pairs();
        assert_eq!(got.len(), 14, "every [cache] key: {got:?}");
        assert!(got.iter().any(|(k, v)| k.text() == "cache.hot_threshold" && v.text() == "1000"), "{got:?}");
        assert!(c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_max_len", "7"]).is_ok());
        let got = c.cmd(&["PROXY", "CONFIG", "GET", "admin.slowlog_max_len"]).pairs();
        assert_eq!(got[0].1, V::s("7"));
        let r = c.cmd(&["PROXY", "CONFIG", "SET", "server.listen", "127.0.0.1:1"]);
        assert!(r.err().is_some_and(|e| e.contains("cannot be changed while heatshield runs")), "{r:?}");
        let r = c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_max_len", "lots"]);
        assert!(r.err().is_some_and(|e| e.contains("Invalid argument")), "{r:?}");
        let r = c.cmd(&["PROXY", "NOSUCH"]);
        assert_eq!(r, V::Err("ERR unknown subcommand 'NOSUCH'. Try PROXY HELP.".into()));
        assert!(c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_max_len", "128"]).is_ok());

        // allow_flush is live: FLUSHALL refused, then allowed
        let r = c.cmd(&["FLUSHALL"]);
        assert!(r.err().is_some_and(|e| e.contains("allow_flush")), "{r:?}");
        assert!(c.cmd(&["PROXY", "CONFIG", "SET", "server.allow_flush", "true"]).is_ok());
        assert!(c.cmd(&["FLUSHALL"]).is_ok());
        assert!(c.cmd(&["PROXY", "CONFIG", "SET", "server.allow_flush", "false"]).is_ok());
    }
}

#[test]
fn slowlog_records_stages_and_bigkeys_find_big_values() {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let owners = SlotOwners::read(&cluster);
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        assert!(c.cmd(&["PROXY", "SLOWLOG", "RESET"]).is_ok());
        assert_eq!(c.cmd(&["PROXY", "SLOWLOG", "LEN"]), V::Int(0));
        // nothing is slower than 10 ms here...
        let key = format!("adm:{proto:?}:k");
        assert!(c.cmd(&["SET", &key, "v"]).is_ok());
        assert_eq!(c.cmd(&["PROXY", "SLOWLOG", "LEN"]), V::Int(0));
        // ...but everything is slower than 0 µs
        assert!(c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_slower_than_us", "0"]).is_ok());
        assert!(c.cmd(&["CLIENT", "SETNAME", "slowpoke"]).is_ok());
        assert_eq!(c.cmd(&["GET", &key]), V::s("v"));
        assert!(c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_slower_than_us", "1000000"]).is_ok());
        let log = c.cmd(&["PROXY", "SLOWLOG", "GET", "-1"]);
        let entry = log
            .items()
            .iter()
            .find(|e| e.items()[3] == V::strs(&["GET", key.as_str()]))
            .unwrap_or_else(|| panic!("{proto:?}: no GET entry in {log:?}"));
        let e = entry.items();
        assert!(e[2].int() >= 0);
        assert!(e[4].text().starts_with("127.0.0.1:"), "{entry:?}");
        assert_eq!(e[5], V::s("slowpoke"));
        let stages: Vec<(String, V)> = e[6].pairs().into_iter().map(|(k, v)| (k.text(), v)).collect();
        let get = |n: &str| stages.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()).unwrap();
        let master = owners.of_key(key.as_bytes());
        assert_eq!(get("node"), V::s(format!("127.0.0.1:{master}")), "{entry:?}");
        // the stages add up to (at most) the total
        let sum: i64 = ["backend_us", "queued_us", "write_us"].iter().map(|n| get(n).int()).sum();
        assert!(sum <= e[2].int() + 2, "{entry:?}");
        assert!(get("backend_us").int() > 0, "{entry:?}");
        // GET 1 returns the newest only
        assert_eq!(c.cmd(&["PROXY", "SLOWLOG", "GET", "1"]).items().len(), 1);

        // big keys: a 100 KB value is seen on the way in and on the way out
        let big = format!("adm:{proto:?}:big");
        let value = "x".repeat(100_000);
        assert!(c.cmd(&["SET", &big, &value]).is_ok());
        assert_eq!(c.cmd(&["GET", &big]).bytes().len(), 100_000);
        let small = format!("adm:{proto:?}:small");
        assert!(c.cmd(&["SET", &small, "tiny"]).is_ok());
        let list = c.cmd(&["PROXY", "BIGKEYS"]);
        let entries: Vec<Vec<(String, V)>> =
            list.items().iter().map(|e| e.pairs().into_iter().map(|(k, v)| (k.text(), v)).collect()).collect();
        let find = |kind: &str| {
            entries
                .iter()
                .find(|e| {
                    e.iter().any(|(k, v)| k == "key" && *v == V::s(&big))
                        && e.iter().any(|(k, v)| k == "kind" && *v == V::s(kind))
                })
                .unwrap_or_else(|| panic!("{proto:?}: no {kind} entry for {big} in {list:?}"))
        };
        let req = find("request");
        assert!(req.iter().any(|(k, v)| k == "bytes" && v.int() >= 100_000));
        assert!(req.iter().any(|(k, v)| k == "command" && *v == V::s("SET")));
        let rep = find("reply");
        assert!(rep.iter().any(|(k, v)| k == "command" && *v == V::s("GET")));
        assert!(!entries.iter().any(|e| e.iter().any(|(k, v)| k == "key" && *v == V::s(&small))));
    }
}

#[test]
fn info_commandstats_and_metrics_count_what_was_sent() {
    let cluster = RedisCluster::start();
    let (_d, path) = config_file("[metrics]\nlatency_sample_every = 1\n");
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let addr = proxy.metrics_addr().expect("the harness gives every proxy a metrics port");
    let mut c = Conn::connect(proxy.port());
    for i in 0..25 {
        assert!(c.cmd(&["SET", &format!("adm:m:{i}"), "v"]).is_ok());
    }
    for i in 0..40 {
        c.cmd(&["GET", &format!("adm:m:{i}")]);
    }
    for _ in 0..3 {
        assert!(c.cmd(&["INCR", "adm:m:0"]).is_err()); // "v" is not an integer
    }
    let info = c.cmd(&["INFO", "commandstats"]).text();
    let line = |name: &str| field(&info, &format!("cmdstat_{name}")).unwrap_or_else(|| panic!("no {name} in {info}"));
    assert!(line("set").starts_with("calls=25,"), "{info}");
    assert!(line("get").starts_with("calls=40,"), "{info}");
    assert!(line("incr").starts_with("calls=3,") && line("incr").ends_with("failed_calls=3"), "{info}");
    let lat = c.cmd(&["INFO", "latencystats"]).text();
    let get = field(&lat, "latency_percentiles_usec_get").unwrap_or_else(|| panic!("{lat}"));
    let p: Vec<f64> = get.split(',').map(|kv| kv.split('=').nth(1).unwrap().parse().unwrap()).collect();
    assert!(p[0] > 0.0 && p[0] <= p[1] && p[1] <= p[2], "{get}");
    // the default INFO has neither section
    let default = c.cmd(&["INFO"]).text();
    assert!(!default.contains("# Commandstats") && default.contains("# Proxy"), "{default}");

    let (status, body) = http_get(&addr, "/metrics");
    assert_eq!(status, 200);
    let want = [
        ("heatshield_commands_total{command=\"SET\",outcome=\"ok\"}", 25.0),
        ("heatshield_commands_total{command=\"GET\",outcome=\"ok\"}", 40.0),
        ("heatshield_commands_total{command=\"INCR\",outcome=\"error\"}", 3.0),
        ("heatshield_command_duration_seconds_count{command=\"GET\"}", 40.0),
    ];
    for (series, n) in want {
        assert_eq!(sample(&body, series), Some(n), "{series} in\n{body}");
    }
    common::wait_until(Duration::from_secs(5), "the sampled gauges", || {
        let (_, body) = http_get(&addr, "/metrics");
        sample(&body, "heatshield_client_connections").is_some_and(|v| v >= 1.0)
            && sample(&body, "heatshield_slot_map_epoch").is_some_and(|v| v >= 1.0)
    });
}

#[test]
fn admin_password_and_disabled_admin() {
    let cluster = RedisCluster::start();
    let (_d, path) = config_file(
        "[admin]\npassword = \"sesame\"\n[migration]\ntarget = [\"127.0.0.1:1\"]\ntarget_password = \"hunter2\"\n",
    );
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["PROXY", "INFO"]), V::Err("NOPERM PROXY commands need PROXY AUTH <password> first".into()));
    assert!(c.cmd(&["PROXY", "AUTH", "wrong"]).err().is_some_and(|e| e.starts_with("WRONGPASS")));
    assert!(c.cmd(&["PROXY", "AUTH", "sesame"]).is_ok());
    assert!(c.cmd(&["PROXY", "INFO"]).text().contains("backend_mode:cluster"));
    // the password is never shown
    let cfg = c.cmd(&["PROXY", "CONFIG", "GET", "admin.password"]).pairs();
    assert_eq!(cfg[0].1, V::s("(set)"));
    // nor the migration target's
    let cfg = c.cmd(&["PROXY", "CONFIG", "GET", "migration.target_password"]).pairs();
    assert_eq!(cfg[0].1, V::s("(set)"));
    assert!(!format!("{:?}", c.cmd(&["PROXY", "CONFIG", "GET", "*"])).contains("hunter2"));
    // another connection is still locked
    let mut other = Conn::connect(proxy.port());
    assert!(other.cmd(&["PROXY", "NODES"]).err().is_some_and(|e| e.starts_with("NOPERM")));

    let (_d2, path2) = config_file("[admin]\nenabled = false\n");
    let off = Proxy::start_cluster(&cluster, &["--config", &path2]);
    let mut c = Conn::connect(off.port());
    assert_eq!(c.cmd(&["PROXY", "INFO"]), V::Err("ERR PROXY commands are disabled (admin.enabled = false)".into()));
    assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
}
