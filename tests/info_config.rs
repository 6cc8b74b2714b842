//! INFO and CONFIG as one Redis would answer them (docs/info.md), against a real 3+3
//! cluster: every section Redis has, aggregated over the masters by the documented rules;
//! CONFIG GET from the masters; CONFIG SET only for the admin, applied to every master;
//! and the real `prometheus-redis-exporter` (`PROMETHEUS_REDIS_EXPORTER` overrides the
//! binary; scripts/ensure-deps.sh installs it) scraping heatshield without errors.

mod common;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::client::{Conn, Proto, V};
use common::{ClusterEnv, Shared, cmd, cmd_text, free_port, info_field, try_http_get, wait_until};

static ENV: Shared<ClusterEnv> = Shared::new();
/// Tests here change the masters' settings: one at a time.
static SETTINGS: Mutex<()> = Mutex::new(());

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(Some("[admin]\npassword = \"adm-secret\"\n")))
}

fn sum_field(env: &ClusterEnv, section: &str, field: &str) -> i64 {
    env.owners
        .masters()
        .iter()
        .map(|&m| info_field(&cmd_text(m, &["INFO", section]), field).unwrap().parse::<i64>().unwrap())
        .sum()
}

#[test]
fn info_has_every_redis_section_aggregated_over_the_masters() {
    let env = env();
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let port = env.proxy.port();
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(port, proto);
        let text = c.cmd(&["INFO", "everything"]).text();
        for s in [
            "Proxy",
            "Server",
            "Clients",
            "Memory",
            "Persistence",
            "Stats",
            "Replication",
            "CPU",
            "Modules",
            "Errorstats",
            "Cluster",
            "Keyspace",
            "Commandstats",
            "Latencystats",
        ] {
            assert!(text.contains(&format!("# {s}\r\n")), "INFO everything lacks # {s}:\n{text}");
        }
        // counters summed: each master has one replica
        assert_eq!(info_field(&text, "connected_slaves").as_deref(), Some("3"), "{text}");
        let replica_lines = text
            .lines()
            .filter(|l| l.strip_prefix("slave").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit())))
            .count();
        assert_eq!(replica_lines, 3, "one slaveN line per replica:\n{text}");
        // memory summed, between the masters' sums just before and just after
        let before = sum_field(&env, "memory", "used_memory");
        let mem: i64 = c
            .cmd(&["INFO", "memory"])
            .text()
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let after = sum_field(&env, "memory", "used_memory");
        assert!(
            mem as f64 >= before.min(after) as f64 * 0.9 && mem as f64 <= before.max(after) as f64 * 1.1,
            "{mem} vs {before}..{after}"
        );
        // settings: the masters' common value
        let policy = info_field(&cmd_text(env.owners.masters()[0], &["INFO", "memory"]), "maxmemory_policy");
        assert_eq!(info_field(&text, "maxmemory_policy"), policy);
        assert_eq!(info_field(&text, "loading").as_deref(), Some("0"));
        assert_eq!(info_field(&text, "role").as_deref(), Some("master"));
        // heatshield's own: its clients, its process, its CPU
        let clients: i64 = info_field(&text, "connected_clients").unwrap().parse().unwrap();
        assert!(clients >= 1);
        assert_eq!(info_field(&text, "tcp_port"), Some(port.to_string()));
        assert!(info_field(&text, "used_cpu_user").is_some());
        // one section asked: only it
        let mem_only = c.cmd(&["INFO", "memory"]).text();
        assert!(mem_only.starts_with("# Memory\r\n") && !mem_only.contains("# Server"), "{mem_only}");
    }
}

#[test]
fn info_names_settings_the_masters_disagree_on() {
    let env = env();
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let masters = env.owners.masters();
    assert_eq!(cmd(masters[1], &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]), V::ok());
    let text = cmd_text(env.proxy.port(), &["INFO"]);
    cmd(masters[1], &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let differ = info_field(&text, "info_fields_differ").unwrap();
    assert!(differ.split(',').any(|f| f == "maxmemory_policy"), "{differ}");
    // the value shown is a master's (the first that answered)
    let shown = info_field(&text, "maxmemory_policy").unwrap();
    assert!(shown == "noeviction" || shown == "allkeys-lru", "{shown}");
}

#[test]
fn config_get_answers_from_the_masters() {
    let env = env();
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let port = env.proxy.port();
    let masters = env.owners.masters();
    for &m in &masters {
        assert_eq!(cmd(m, &["CONFIG", "SET", "maxmemory", "1mb"]), V::ok());
    }
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(port, proto);
        let got: Vec<(String, String)> = c
            .cmd(&["CONFIG", "GET", "maxmemory", "maxmemory-policy", "port", "masterauth", "maxclients"])
            .pairs()
            .into_iter()
            .map(|(k, v)| (k.text(), v.text()))
            .collect();
        let get = |k: &str| {
            got.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("{k} in {got:?}"))
        };
        assert_eq!(get("maxmemory"), (3 * 1048576).to_string(), "summed over the masters");
        let direct = cmd(masters[0], &["CONFIG", "GET", "maxmemory-policy"]).items()[1].text();
        assert_eq!(get("maxmemory-policy"), direct);
        assert_eq!(get("port"), port.to_string(), "heatshield's own port");
        assert_eq!(get("masterauth"), "", "backend credentials never shown");
        assert_eq!(get("maxclients"), "10000");
        // a pattern, as Redis: every matching parameter once
        let all = c.cmd(&["CONFIG", "GET", "maxmemory*"]).pairs();
        let direct_all = cmd(masters[0], &["CONFIG", "GET", "maxmemory*"]).pairs();
        assert_eq!(all.len(), direct_all.len());
        assert_eq!(c.cmd(&["CONFIG", "GET", "no-such-parameter"]).pairs().len(), 0);
    }
    for &m in &masters {
        cmd(m, &["CONFIG", "SET", "maxmemory", "0"]);
    }
}

#[test]
fn config_set_needs_the_admin_and_reaches_every_master() {
    let env = env();
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Conn::connect(env.proxy.port());
    let refused = c.cmd(&["CONFIG", "SET", "maxmemory-samples", "7"]);
    assert!(refused.err().is_some_and(|e| e.starts_with("NOPERM")), "{refused:?}");
    assert!(c.cmd(&["CONFIG", "RESETSTAT"]).is_err());
    assert_eq!(c.cmd(&["PROXY", "AUTH", "adm-secret"]), V::ok());
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory-samples", "7"]), V::ok());
    for m in env.owners.masters() {
        assert_eq!(cmd(m, &["CONFIG", "GET", "maxmemory-samples"]).items()[1].text(), "7", "master {m}");
    }
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory-samples", "5"]), V::ok());
    // a parameter every master refuses: Redis's own error text
    let direct = cmd(env.owners.masters()[0], &["CONFIG", "SET", "no-such-parameter", "1"]);
    assert_eq!(c.cmd(&["CONFIG", "SET", "no-such-parameter", "1"]), direct);
    assert_eq!(c.cmd(&["CONFIG", "RESETSTAT"]), V::ok());
    // heatshield's own command statistics count from zero again too
    assert!(c.cmd(&["SET", "cfg:after-reset", "1"]).is_ok());
    let info = c.cmd(&["INFO", "commandstats"]).text();
    assert!(info.contains("cmdstat_set:calls=1,"), "{info}");

    // one master refuses, the others apply it: that master's default user (the one
    // heatshield connects as) may not CONFIG SET for a while
    let masters = env.owners.masters();
    assert_eq!(cmd(masters[1], &["ACL", "SETUSER", "default", "-config|set"]), V::ok());
    let mixed = c.cmd(&["CONFIG", "SET", "maxmemory-samples", "6"]);
    assert_eq!(cmd(masters[1], &["ACL", "SETUSER", "default", "+config|set"]), V::ok());
    let e = mixed.err().unwrap_or_else(|| panic!("a partial CONFIG SET must be an error: {mixed:?}"));
    let applied = format!("ERR heatshield: applied on {} of {} masters; not on ", masters.len() - 1, masters.len());
    assert!(e.starts_with(&applied), "{e}");
    assert!(e.contains(&format!("127.0.0.1:{}: NOPERM", masters[1])), "{e}");
    for m in [masters[0], masters[2]] {
        assert!(!e.contains(&format!("127.0.0.1:{m}")), "{e}");
        assert_eq!(cmd(m, &["CONFIG", "GET", "maxmemory-samples"]).items()[1].text(), "6", "master {m}");
    }
    assert_eq!(c.cmd(&["CONFIG", "SET", "maxmemory-samples", "5"]), V::ok());
}

#[test]
fn prometheus_redis_exporter_scrapes_heatshield() {
    let env = env();
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let port = env.proxy.port();
    for i in 0..50 {
        cmd(port, &["SET", &format!("exporter:{i}"), "v"]);
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("exporter.log")).unwrap();
    let bin = std::env::var("PROMETHEUS_REDIS_EXPORTER").unwrap_or_else(|_| "prometheus-redis-exporter".into());
    let mut child = Command::new(bin)
        .args(["-redis.addr", &format!("redis://127.0.0.1:{port}"), "-web.listen-address", &listen])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("prometheus-redis-exporter (scripts/ensure-deps.sh installs it)");
    let mut body = String::new();
    wait_until(Duration::from_secs(20), "the exporter's /metrics", || match try_http_get(&listen, "/metrics") {
        Ok((200, b)) if b.contains("redis_up") => {
            body = b;
            true
        }
        _ => false,
    });
    let _ = child.kill();
    let _ = child.wait();
    let exporter_log = std::fs::read_to_string(dir.path().join("exporter.log")).unwrap();
    let sample = |name: &str| -> f64 {
        body.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in\n{body}"))
    };
    assert_eq!(sample("redis_up"), 1.0);
    assert!(body.contains("redis_exporter_last_scrape_error{err=\"\"} 0"), "{body}");
    assert!(!exporter_log.contains("level=error"), "the exporter complained:\n{exporter_log}");
    let keys: i64 = env.owners.masters().iter().map(|&m| cmd(m, &["DBSIZE"]).int()).sum();
    assert!(sample("redis_db_keys") >= 50.0 && sample("redis_db_keys") <= keys as f64 + 50.0, "{body}");
    assert_eq!(sample("redis_connected_slaves"), 3.0);
    assert!(sample("redis_memory_used_bytes") > 3.0 * 1e6, "three masters' memory: {body}");
    assert_eq!(sample("redis_config_maxclients"), 10000.0);
    assert!(sample("redis_connected_clients") >= 1.0);
    assert!(body.contains("redis_version=\"7."), "{body}");
}
