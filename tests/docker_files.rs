//! The Docker demo stack in docker/: the compose file, the shared heatshield.toml, the
//! HAProxy configuration, the Prometheus and Grafana provisioning, the Grafana dashboard,
//! the Dockerfile and the Kubernetes manifests in docker/k8s/ are checked without Docker or
//! Kubernetes (they parse, and they agree with each other, with the ports and drain times of
//! the configuration files they run, and with docs/metrics.md); both configuration files
//! pass `heatshield --check`; and every metric the dashboard queries is looked up in the
//! /metrics exposition of a real heatshield in front of a real cluster, after traffic that
//! moves each of them (including a MOVED, a backend timeout and a refused client).
//!
//! When `promtool` is on PATH, the Prometheus configuration and every dashboard query are
//! also checked with it (`promtool check config` / `check rules`); otherwise that part is
//! skipped with a note on stderr.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

use common::client::{Conn, V};
use common::{Proxy, RedisCluster, SlotOwners, cmd_text, free_port, key_slot};

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// docker/: compose resolves the compose file's relative paths from here.
fn docker_dir() -> PathBuf {
    repo().join("docker")
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The one YAML document in `rel` (relative to the repository root).
fn yaml(rel: &str) -> Yaml {
    let docs = YamlLoader::load_from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: invalid YAML: {e}"));
    assert_eq!(docs.len(), 1, "{rel}: expected one YAML document");
    docs.into_iter().next().unwrap()
}

fn dashboard() -> Value {
    let rel = "docker/grafana/dashboards/heatshield.json";
    serde_json::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: invalid JSON: {e}"))
}

// ---------------------------------------------------------------------------
// YAML helpers
// ---------------------------------------------------------------------------

/// A scalar as text (compose accepts numbers and booleans where it means strings).
fn scalar(y: &Yaml, what: &str) -> String {
    match y {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        other => panic!("{what}: expected a scalar, got {other:?}"),
    }
}

fn text<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str().unwrap_or_else(|| panic!("{what}: expected a string, got {y:?}"))
}

/// A compose string-or-list (`command`, `healthcheck.test`, `ports`, ...) as a list.
fn strings(y: &Yaml, what: &str) -> Vec<String> {
    match y {
        Yaml::Array(items) => items.iter().map(|i| scalar(i, what)).collect(),
        Yaml::String(s) => s.split_whitespace().map(String::from).collect(),
        other => panic!("{what}: expected a string or a list, got {other:?}"),
    }
}

fn keys(y: &Yaml, what: &str) -> BTreeSet<String> {
    y.as_hash()
        .unwrap_or_else(|| panic!("{what}: expected a mapping, got {y:?}"))
        .keys()
        .map(|k| scalar(k, what))
        .collect()
}

/// The argument after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

/// The `depends_on` condition of `svc` on `dep` (short syntax means `service_started`).
fn depends_condition(svc: &Yaml, dep: &str) -> Option<String> {
    match &svc["depends_on"] {
        Yaml::Array(items) => items.iter().any(|i| i.as_str() == Some(dep)).then(|| "service_started".into()),
        Yaml::Hash(_) => {
            let d = &svc["depends_on"][dep];
            if d.is_badvalue() { None } else { Some(d["condition"].as_str().unwrap_or("service_started").to_string()) }
        }
        _ => None,
    }
}

/// Short-syntax volume mounts `SRC:DST[:MODE]` as `(SRC, DST)`.
fn mounts(svc: &Yaml, what: &str) -> Vec<(String, String)> {
    let Some(items) = svc["volumes"].as_vec() else {
        return vec![];
    };
    items
        .iter()
        .map(|v| {
            let v = scalar(v, what);
            let mut parts = v.split(':');
            let src = parts.next().unwrap_or_default().to_string();
            let dst = parts.next().unwrap_or_else(|| panic!("{what}: volume {v:?} has no target")).to_string();
            (src, dst)
        })
        .collect()
}

/// A service's environment variable (mapping or `KEY=VALUE` list syntax).
fn env_var(svc: &Yaml, key: &str) -> Option<String> {
    match &svc["environment"] {
        Yaml::Hash(_) => {
            let v = &svc["environment"][key];
            (!v.is_badvalue()).then(|| scalar(v, key))
        }
        Yaml::Array(items) => items.iter().find_map(|i| {
            let i = i.as_str()?;
            i.strip_prefix(key)?.strip_prefix('=').map(String::from)
        }),
        _ => None,
    }
}

/// Compose short-syntax port mappings `[IP:]HOST:CONTAINER[/PROTO]` as (HOST, CONTAINER);
/// HOST is empty when only the container port is given.
fn port_mappings(svc: &Yaml, what: &str) -> Vec<(String, String)> {
    if svc["ports"].is_badvalue() {
        return vec![];
    }
    strings(&svc["ports"], what)
        .iter()
        .map(|p| {
            let p = p.split('/').next().unwrap_or_default();
            match p.rsplit_once(':') {
                Some((rest, container)) => {
                    (rest.rsplit(':').next().unwrap_or_default().to_string(), container.to_string())
                }
                None => (String::new(), p.to_string()),
            }
        })
        .collect()
}

/// The host file (resolved from docker/) of the short-syntax volume mounted at `dst`.
fn mount_source(svc: &Yaml, dst: &str, what: &str) -> PathBuf {
    let all = mounts(svc, what);
    let (src, _) =
        all.iter().find(|(_, d)| d == dst).unwrap_or_else(|| panic!("{what}: nothing mounted at {dst}: {all:?}"));
    docker_dir().join(src)
}

/// Whether the short-syntax volume mounted at `dst` is read-only (`SRC:DST:ro`).
fn mounted_read_only(svc: &Yaml, dst: &str, what: &str) -> bool {
    svc["volumes"].as_vec().into_iter().flatten().map(|v| scalar(v, what)).any(|v| {
        let parts: Vec<&str> = v.split(':').collect();
        parts.get(1) == Some(&dst) && parts.get(2).is_some_and(|mode| mode.split(',').any(|m| m == "ro"))
    })
}

/// A string-or-list that may be absent (compose `entrypoint` / `command`).
fn optional_strings(y: &Yaml, what: &str) -> Option<Vec<String>> {
    (!y.is_badvalue() && !y.is_null()).then(|| strings(y, what))
}

/// The argv a container of docker/Dockerfile's image runs. `entrypoint` (Compose
/// `entrypoint`, Kubernetes `command`) replaces the image's ENTRYPOINT and drops its CMD;
/// `cmd` (Compose `command`, Kubernetes `args`) replaces CMD.
fn container_argv(entrypoint: Option<Vec<String>>, cmd: Option<Vec<String>>) -> Vec<String> {
    let (image_entrypoint, image_cmd) = image_entrypoint_and_cmd();
    let replaced = entrypoint.is_some();
    let mut argv = entrypoint.unwrap_or(image_entrypoint);
    argv.extend(cmd.unwrap_or(if replaced { vec![] } else { image_cmd }));
    argv
}

/// The argv a compose service built from docker/Dockerfile runs.
fn compose_argv(svc: &Yaml, name: &str) -> Vec<String> {
    container_argv(optional_strings(&svc["entrypoint"], name), optional_strings(&svc["command"], name))
}

/// Asserts that `argv` runs heatshield with `--config` once (it refuses it twice) and no
/// flag that would override the file; returns the file's path.
fn config_only_argv<'a>(argv: &'a [String], what: &str) -> &'a str {
    assert_eq!(argv.first().map(String::as_str), Some("heatshield"), "{what}: {argv:?}");
    let configs = argv.iter().filter(|a| *a == "--config" || *a == "-c").count();
    assert_eq!(configs, 1, "{what}: --config exactly once (heatshield refuses it twice): {argv:?}");
    for f in ["--listen", "--metrics", "--cluster", "--standalone", "--threads"] {
        assert!(
            !argv.iter().any(|a| a == f || a.starts_with(&format!("{f}="))),
            "{what}: {f} would override the configuration file: {argv:?}"
        );
    }
    flag(argv, "--config").or_else(|| flag(argv, "-c")).unwrap_or_else(|| panic!("{what}: --config FILE: {argv:?}"))
}

/// The configuration file a compose heatshield service runs with: the host file mounted
/// where its `--config` points, and its contents.
fn compose_heatshield_config(svc: &Yaml, name: &str) -> (PathBuf, toml::Table) {
    let argv = compose_argv(svc, name);
    let target = config_only_argv(&argv, name);
    let path = mount_source(svc, target, name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: cannot read {}: {e}", path.display()));
    let table = toml_table(&text, &path.display().to_string());
    (path, table)
}

// ---------------------------------------------------------------------------
// TOML helpers (heatshield.toml)
// ---------------------------------------------------------------------------

fn toml_table(text: &str, what: &str) -> toml::Table {
    text.parse::<toml::Table>().unwrap_or_else(|e| panic!("{what}: invalid TOML: {e}"))
}

/// The value of `section.key`.
fn toml_get<'a>(t: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let (section, key) = key.split_once('.').expect("section.key");
    t.get(section)?.get(key)
}

fn toml_text(t: &toml::Table, key: &str, what: &str) -> String {
    toml_get(t, key)
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("{what}: {key} is not set to a string"))
        .to_string()
}

/// An integer `section.key`, or the default conf/heatshield.toml documents for it.
fn toml_ms(t: &toml::Table, key: &str, what: &str) -> i64 {
    let documented = toml_table(&read("conf/heatshield.toml"), "conf/heatshield.toml");
    let v = toml_get(t, key)
        .or_else(|| toml_get(&documented, key))
        .unwrap_or_else(|| panic!("{what}: {key} is neither set nor documented in conf/heatshield.toml"));
    v.as_integer().unwrap_or_else(|| panic!("{what}: {key} = {v:?} is not an integer"))
}

/// The port of the `IP:PORT` at `key`, which must listen on every interface (in a
/// container or a pod, 127.0.0.1 cannot be reached from outside).
fn listen_port(t: &toml::Table, key: &str, what: &str) -> i64 {
    let addr = toml_text(t, key, what);
    let sock: SocketAddr = addr.parse().unwrap_or_else(|e| panic!("{what}: {key} = {addr:?}: {e}"));
    assert!(sock.ip().is_unspecified(), "{what}: {key} = {addr} cannot be reached from outside; listen on 0.0.0.0");
    i64::from(sock.port())
}

/// A duration as Compose (`10s`, `1m30s`) and HAProxy (`1s`, `500ms`) write them, in
/// milliseconds; a bare number counts `bare_unit_ms`.
fn duration_ms(text: &str, bare_unit_ms: i64) -> i64 {
    let text = text.trim();
    if let Ok(n) = text.parse::<i64>() {
        return n * bare_unit_ms;
    }
    let mut total = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let after = &rest[digits..];
        let unit_len = after.len() - after.trim_start_matches(|c: char| c.is_ascii_alphabetic()).len();
        assert!(digits > 0 && unit_len > 0, "bad duration {text:?}");
        let n: i64 = rest[..digits].parse().unwrap();
        let unit = match &after[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            other => panic!("bad duration unit {other:?} in {text:?}"),
        };
        total += n * unit;
        rest = &after[unit_len..];
    }
    total
}

fn promtool() -> Option<&'static str> {
    let ok = Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("note: promtool not found on PATH; skipping the promtool checks");
    }
    ok.then_some("promtool")
}

const REDIS_NODES: [&str; 6] = ["redis-1", "redis-2", "redis-3", "redis-4", "redis-5", "redis-6"];
/// The heatshield services and the host port each one's metrics port is published on.
const PROXIES: [(&str, &str); 3] = [("heatshield-1", "9180"), ("heatshield-2", "9181"), ("heatshield-3", "9182")];
/// The configuration file all of them mount.
const HEATSHIELD_TOML: &str = "docker/heatshield/heatshield.toml";
/// HAProxy's configuration, and where the official image reads it (its CMD is
/// `haproxy -f /usr/local/etc/haproxy/haproxy.cfg`).
const HAPROXY_CFG: &str = "docker/haproxy/haproxy.cfg";
const HAPROXY_CFG_IN_IMAGE: &str = "/usr/local/etc/haproxy/haproxy.cfg";
/// The host port clients connect to (HAProxy's).
const CLIENT_PORT: &str = "6380";

/// The compose services that run heatshield (built from docker/Dockerfile, or named so),
/// in file order.
fn heatshield_services(compose: &Yaml) -> Vec<String> {
    compose["services"]
        .as_hash()
        .expect("services is a mapping")
        .iter()
        .filter(|(name, svc)| {
            name.as_str().is_some_and(|n| n.starts_with("heatshield"))
                || svc["build"]["dockerfile"].as_str() == Some("docker/Dockerfile")
        })
        .map(|(name, _)| scalar(name, "service"))
        .collect()
}

// ---------------------------------------------------------------------------
// (a) docker-compose.yml, Prometheus, Grafana provisioning, Dockerfile
// ---------------------------------------------------------------------------

#[test]
fn compose_file_defines_the_demo_stack() {
    let compose = yaml("docker/docker-compose.yml");
    let services = &compose["services"];

    let mut expected: BTreeSet<String> = REDIS_NODES.iter().map(|s| s.to_string()).collect();
    for s in ["redis-cluster-init", "haproxy", "prometheus", "grafana"] {
        expected.insert(s.to_string());
    }
    expected.extend(PROXIES.map(|(name, _)| name.to_string()));
    assert_eq!(keys(services, "services"), expected, "compose services");
    assert_eq!(heatshield_services(&compose), PROXIES.map(|(name, _)| name.to_string()), "the heatshield services");

    // Fixed node addresses inside the subnet, outside the range handed out dynamically.
    let ipam = &compose["networks"]["default"]["ipam"]["config"][0];
    let subnet = text(&ipam["subnet"], "networks.default.ipam.config[0].subnet");
    let (net, bits) = subnet.split_once('/').expect("subnet is ADDR/BITS");
    assert_eq!(bits, "24", "the checks below assume a /24 subnet");
    let prefix = format!("{}.", net.rsplit_once('.').unwrap().0);
    let ip_range = text(&ipam["ip_range"], "networks.default.ipam.config[0].ip_range");
    let (range_net, range_bits) = ip_range.split_once('/').expect("ip_range is ADDR/BITS");
    assert!(range_net.starts_with(&prefix), "ip_range {ip_range} is inside {subnet}");
    let dynamic_from: u32 = range_net.rsplit_once('.').unwrap().1.parse().unwrap();
    assert_eq!((dynamic_from, range_bits), (128, "25"), "dynamic addresses come from .128/25");

    let mut node_ips = Vec::new();
    for name in REDIS_NODES {
        let svc = &services[name];
        assert_eq!(text(&svc["image"], name), "redis:7.0", "{name}");
        let cmd = strings(&svc["command"], name);
        assert_eq!(cmd.first().map(String::as_str), Some("redis-server"), "{name}: {cmd:?}");
        for (f, v) in [
            ("--cluster-enabled", "yes"),
            ("--cluster-config-file", "nodes.conf"),
            ("--cluster-node-timeout", "5000"),
            ("--appendonly", "no"),
            ("--save", ""),
        ] {
            assert_eq!(flag(&cmd, f), Some(v), "{name}: {f} in {cmd:?}");
        }
        let ip = text(&svc["networks"]["default"]["ipv4_address"], name);
        assert_eq!(flag(&cmd, "--cluster-announce-ip"), Some(ip), "{name} must announce its fixed address");
        let host: u32 =
            ip.strip_prefix(&prefix).unwrap_or_else(|| panic!("{name}: {ip} is outside {subnet}")).parse().unwrap();
        assert!((2..dynamic_from).contains(&host), "{name}: {ip} must be below the dynamic range {ip_range}");
        assert!(!strings(&svc["healthcheck"]["test"], name).is_empty(), "{name}: healthcheck");
        node_ips.push(ip.to_string());
    }
    let distinct: BTreeSet<_> = node_ips.iter().collect();
    assert_eq!(distinct.len(), 6, "node addresses must differ: {node_ips:?}");

    let init = &services["redis-cluster-init"];
    assert_eq!(text(&init["image"], "redis-cluster-init"), "redis:7.0");
    let script = strings(&init["command"], "redis-cluster-init").join(" ");
    for needle in ["--cluster create", "--cluster-replicas 1", "--cluster-yes", "cluster_state:ok"] {
        assert!(script.contains(needle), "redis-cluster-init must run {needle:?}: {script}");
    }
    for ip in &node_ips {
        assert!(script.contains(&format!("{ip}:6379")), "redis-cluster-init must create the cluster with {ip}:6379");
    }
    for name in REDIS_NODES {
        assert_eq!(
            depends_condition(init, name).as_deref(),
            Some("service_healthy"),
            "redis-cluster-init waits for {name}"
        );
    }

    // The proxies run the one shared configuration file, and nothing overrides it.
    let shared = repo().join(HEATSHIELD_TOML).canonicalize().unwrap_or_else(|e| panic!("{HEATSHIELD_TOML}: {e}"));
    for (name, metrics_host_port) in PROXIES {
        let svc = &services[name];
        let context = text(&svc["build"]["context"], name);
        let dockerfile = text(&svc["build"]["dockerfile"], name);
        assert_eq!((context, dockerfile), ("..", "docker/Dockerfile"), "{name}: build");
        assert!(docker_dir().join(context).join(dockerfile).is_file(), "{name}: Dockerfile exists");
        let argv = compose_argv(svc, name);
        let target = config_only_argv(&argv, name);
        assert!(mounted_read_only(svc, target, name), "{name}: {target} is mounted read-only");
        let (path, config) = compose_heatshield_config(svc, name);
        assert_eq!(path.canonicalize().ok().as_ref(), Some(&shared), "{name}: --config {target} is {HEATSHIELD_TOML}");

        assert_eq!(toml_text(&config, "backend.mode", name), "cluster", "{name}");
        let seeds = toml_get(&config, "backend.seeds")
            .and_then(|v| v.as_array())
            .unwrap_or_else(|| panic!("{name}: backend.seeds is a list"));
        assert!(!seeds.is_empty(), "{name}: backend.seeds");
        for seed in seeds {
            let seed = seed.as_str().unwrap_or_else(|| panic!("{name}: seed {seed:?} is a string"));
            let host = seed.split(':').next().unwrap();
            assert!(REDIS_NODES.contains(&host), "{name}: seed {seed} is a compose service");
        }
        assert!(!toml_text(&config, "fleet.name", name).is_empty(), "{name}: the proxies form a fleet");

        // Clients reach the proxies only through HAProxy; each one's metrics are published.
        let listen = listen_port(&config, "server.listen", name).to_string();
        let metrics = listen_port(&config, "metrics.listen", name).to_string();
        let ports = port_mappings(svc, name);
        assert!(
            !ports.iter().any(|(_, container)| *container == listen),
            "{name}: the client port {listen} is not published (clients go through haproxy): {ports:?}"
        );
        assert!(
            ports.contains(&(metrics_host_port.to_string(), metrics.clone())),
            "{name}: metrics port {metrics} published on {metrics_host_port}: {ports:?}"
        );

        // Docker sends SIGKILL stop_grace_period after SIGTERM: a draining heatshield may
        // take drain_grace_ms + shutdown_timeout_ms.
        let grace = &svc["stop_grace_period"];
        assert!(!grace.is_badvalue(), "{name}: stop_grace_period is set (Docker's default is 10 s)");
        let grace_ms = duration_ms(&scalar(grace, name), 1);
        let drain = toml_ms(&config, "server.drain_grace_ms", name);
        let shutdown = toml_ms(&config, "server.shutdown_timeout_ms", name);
        assert!(
            grace_ms >= drain + shutdown,
            "{name}: stop_grace_period {grace_ms} ms < drain_grace_ms {drain} + shutdown_timeout_ms {shutdown}"
        );
        assert_eq!(
            depends_condition(svc, "redis-cluster-init").as_deref(),
            Some("service_completed_successfully"),
            "{name} starts after the cluster is created"
        );
    }

    let haproxy = &services["haproxy"];
    let image = text(&haproxy["image"], "haproxy");
    assert!(image.starts_with("haproxy:"), "haproxy: the official image, got {image}");
    let cfg = mount_source(haproxy, HAPROXY_CFG_IN_IMAGE, "haproxy").canonicalize().ok();
    let want_cfg = repo().join(HAPROXY_CFG).canonicalize().unwrap_or_else(|e| panic!("{HAPROXY_CFG}: {e}"));
    assert_eq!(cfg, Some(want_cfg), "haproxy mounts {HAPROXY_CFG}");
    assert!(mounted_read_only(haproxy, HAPROXY_CFG_IN_IMAGE, "haproxy"), "haproxy: {HAPROXY_CFG} read-only");
    let haproxy_ports = port_mappings(haproxy, "haproxy");
    assert!(
        haproxy_ports.iter().any(|(host, _)| host == CLIENT_PORT),
        "haproxy publishes the client port {CLIENT_PORT}: {haproxy_ports:?}"
    );
    for (name, _) in PROXIES {
        assert!(depends_condition(haproxy, name).is_some(), "haproxy depends on {name}");
    }

    let prom = &services["prometheus"];
    assert!(text(&prom["image"], "prometheus").starts_with("prom/prometheus"));
    assert!(
        mounts(prom, "prometheus")
            .contains(&("./prometheus/prometheus.yml".to_string(), "/etc/prometheus/prometheus.yml".to_string())),
        "prometheus mounts docker/prometheus/prometheus.yml"
    );
    assert!(strings(&prom["ports"], "prometheus").contains(&"9090:9090".to_string()));
    for (name, _) in PROXIES {
        assert!(depends_condition(prom, name).is_some(), "prometheus depends on {name}");
    }

    let grafana = &services["grafana"];
    assert!(text(&grafana["image"], "grafana").starts_with("grafana/grafana"));
    assert_eq!(env_var(grafana, "GF_AUTH_ANONYMOUS_ENABLED").as_deref(), Some("true"));
    assert_eq!(env_var(grafana, "GF_AUTH_ANONYMOUS_ORG_ROLE").as_deref(), Some("Viewer"));
    assert!(strings(&grafana["ports"], "grafana").contains(&"3000:3000".to_string()));

    // Every bind-mount source exists (compose resolves them from docker/).
    for (name, svc) in services.as_hash().unwrap() {
        let name = scalar(name, "service");
        for (src, _) in mounts(svc, &name) {
            if src.starts_with('.') || src.starts_with('/') {
                assert!(docker_dir().join(&src).exists(), "{name}: mount source {src} does not exist");
            }
        }
    }

    // Compose interpolates $VAR and ${VAR} in values; this file uses none, so every $
    // meant for a shell must be written $$.
    fn check_dollars(y: &Yaml, path: &str) {
        match y {
            Yaml::String(s) => {
                let mut rest = s.as_str();
                while let Some(i) = rest.find('$') {
                    assert!(
                        rest[i + 1..].starts_with('$'),
                        "{path}: a single $ would be interpolated by compose; write $$: {s}"
                    );
                    rest = &rest[i + 2..];
                }
            }
            Yaml::Array(items) => items.iter().enumerate().for_each(|(i, v)| check_dollars(v, &format!("{path}[{i}]"))),
            Yaml::Hash(h) => h.iter().for_each(|(k, v)| check_dollars(v, &format!("{path}.{}", scalar(k, path)))),
            _ => {}
        }
    }
    check_dollars(&compose, "docker-compose.yml");
}

#[test]
fn prometheus_scrapes_every_heatshield_instance() {
    let rel = "docker/prometheus/prometheus.yml";
    let prom = yaml(rel);
    let jobs = prom["scrape_configs"].as_vec().expect("scrape_configs is a list");
    let job =
        jobs.iter().find(|j| j["job_name"].as_str() == Some("heatshield")).expect("a scrape job named heatshield");
    let interval = job["scrape_interval"].as_str().or(prom["global"]["scrape_interval"].as_str());
    assert_eq!(interval, Some("5s"), "heatshield is scraped every 5 s");
    let path = job["metrics_path"].as_str().unwrap_or("/metrics");
    assert_eq!(path, "/metrics");
    let targets: BTreeSet<String> = job["static_configs"]
        .as_vec()
        .expect("static_configs")
        .iter()
        .flat_map(|sc| strings(&sc["targets"], "targets"))
        .collect();
    // Exactly the compose heatshield services, each at the metrics port of the file it runs.
    let compose = yaml("docker/docker-compose.yml");
    let want: BTreeSet<String> = heatshield_services(&compose)
        .iter()
        .map(|name| {
            let (_, config) = compose_heatshield_config(&compose["services"][name.as_str()], name);
            format!("{name}:{}", listen_port(&config, "metrics.listen", name))
        })
        .collect();
    assert_eq!(want.len(), PROXIES.len(), "{want:?}");
    assert_eq!(targets, want);

    if let Some(promtool) = promtool() {
        let out = Command::new(promtool).args(["check", "config"]).arg(repo().join(rel)).output().unwrap();
        assert!(
            out.status.success(),
            "promtool check config {rel}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// haproxy.cfg as sections ("global", "defaults", "frontend redis", ...), each with its
/// lines split into words, comments dropped.
type HaproxySections = Vec<(String, Vec<Vec<String>>)>;

fn haproxy_sections(text: &str) -> HaproxySections {
    const SECTIONS: [&str; 12] = [
        "global",
        "defaults",
        "frontend",
        "backend",
        "listen",
        "resolvers",
        "peers",
        "userlist",
        "mailers",
        "program",
        "http-errors",
        "ring",
    ];
    let mut out: HaproxySections = Vec::new();
    for raw in text.lines() {
        let words: Vec<String> =
            raw.split('#').next().unwrap_or_default().split_whitespace().map(String::from).collect();
        let Some(first) = words.first() else { continue };
        if SECTIONS.contains(&first.as_str()) {
            out.push((words.join(" "), Vec::new()));
        } else {
            out.last_mut().unwrap_or_else(|| panic!("haproxy.cfg: {raw:?} is outside a section")).1.push(words);
        }
    }
    out
}

/// The lines of the section named `name` ("backend heatshield").
fn haproxy_section<'a>(sections: &'a HaproxySections, name: &str) -> &'a [Vec<String>] {
    sections
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, lines)| lines.as_slice())
        .unwrap_or_else(|| panic!("haproxy.cfg: no section {name:?}"))
}

/// The words after `keyword` (one or more words) on the first line that starts with it.
fn haproxy_directive<'a>(lines: &'a [Vec<String>], keyword: &[&str]) -> Option<&'a [String]> {
    lines
        .iter()
        .find(|l| l.len() >= keyword.len() && l.iter().zip(keyword).all(|(a, b)| a == b))
        .map(|l| &l[keyword.len()..])
}

#[test]
fn haproxy_balances_the_heatshield_instances() {
    let compose = yaml("docker/docker-compose.yml");
    let services = &compose["services"];
    let frontend_port = port_mappings(&services["haproxy"], "haproxy")
        .into_iter()
        .find(|(host, _)| host == CLIENT_PORT)
        .map(|(_, container)| container)
        .unwrap_or_else(|| panic!("haproxy does not publish the client port {CLIENT_PORT}"));

    let sections = haproxy_sections(&read(HAPROXY_CFG));
    let defaults: &[Vec<String>] = sections
        .iter()
        .find(|(n, _)| n.split_whitespace().next() == Some("defaults"))
        .map(|(_, lines)| lines.as_slice())
        .unwrap_or_default();
    let mode = |lines: &[Vec<String>]| -> Option<String> {
        haproxy_directive(lines, &["mode"]).or_else(|| haproxy_directive(defaults, &["mode"]))?.first().cloned()
    };

    // The frontend clients reach (the published port), in TCP mode.
    let (front_name, front) = sections
        .iter()
        .find(|(name, lines)| {
            (name.starts_with("frontend ") || name.starts_with("listen "))
                && lines.iter().any(|l| {
                    l[0] == "bind" && l.get(1).is_some_and(|a| a.rsplit(':').next() == Some(frontend_port.as_str()))
                })
        })
        .unwrap_or_else(|| panic!("{HAPROXY_CFG}: no frontend binds port {frontend_port}"));
    assert_eq!(mode(front.as_slice()).as_deref(), Some("tcp"), "{front_name}: mode tcp (Redis is not HTTP)");
    let back: &[Vec<String>] = if front_name.starts_with("listen ") {
        front.as_slice()
    } else {
        let name = haproxy_directive(front, &["default_backend"])
            .and_then(|w| w.first())
            .unwrap_or_else(|| panic!("{front_name}: no default_backend"));
        haproxy_section(&sections, &format!("backend {name}"))
    };
    assert_eq!(mode(back).as_deref(), Some("tcp"), "the backend runs in mode tcp");
    let balance = haproxy_directive(back, &["balance"]).and_then(|w| w.first()).map(String::as_str);
    assert!(matches!(balance, Some("leastconn" | "roundrobin")), "balance leastconn or roundrobin, got {balance:?}");

    // Health checks: GET /ready on each instance's metrics port.
    let httpchk = haproxy_directive(back, &["option", "httpchk"]).map(|w| w.join(" "));
    assert_eq!(httpchk.as_deref(), Some("GET /ready"), "option httpchk GET /ready");
    let expect = haproxy_directive(back, &["http-check", "expect"]).map(|w| w.join(" "));
    assert_eq!(expect.as_deref(), Some("status 200"), "http-check expect status 200");

    let default_server: Vec<String> = [back, defaults]
        .iter()
        .filter_map(|lines| haproxy_directive(lines, &["default-server"]))
        .flatten()
        .cloned()
        .collect();
    let servers: Vec<&Vec<String>> = back.iter().filter(|l| l[0] == "server").collect();
    let names = heatshield_services(&compose);
    assert_eq!(servers.len(), names.len(), "one server line per heatshield service: {servers:?}");
    for name in &names {
        let (_, config) = compose_heatshield_config(&services[name.as_str()], name);
        let address = format!("{name}:{}", listen_port(&config, "server.listen", name));
        let server = servers
            .iter()
            .find(|l| l.get(2) == Some(&address))
            .unwrap_or_else(|| panic!("{HAPROXY_CFG}: no `server ... {address}` line: {servers:?}"));
        let opts = &server[3..];
        assert!(opts.iter().any(|o| o == "check"), "{address}: health-checked: {server:?}");
        let metrics = listen_port(&config, "metrics.listen", name).to_string();
        assert_eq!(flag(opts, "port"), Some(metrics.as_str()), "{address}: checked on the metrics port: {server:?}");

        // HAProxy stops sending new clients after `fall` failed checks `inter` apart; the
        // instance must still accept that long after SIGTERM. (HAProxy's defaults: 2s, 3.)
        let option = |key: &str| flag(opts, key).or_else(|| flag(&default_server, key)).map(String::from);
        let inter = option("inter").map_or(2000, |v| duration_ms(&v, 1));
        let fall: i64 = option("fall").map_or(3, |v| v.parse().unwrap_or_else(|e| panic!("fall {v}: {e}")));
        let drain = toml_ms(&config, "server.drain_grace_ms", name);
        assert!(
            drain >= fall * inter,
            "{name}: drain_grace_ms {drain} < {fall} checks x {inter} ms, the time HAProxy takes to see /ready fail"
        );
    }

    // Every resolvers section a server line names exists.
    for line in sections.iter().flat_map(|(_, lines)| lines) {
        if matches!(line[0].as_str(), "server" | "default-server")
            && let Some(r) = flag(line, "resolvers")
        {
            haproxy_section(&sections, &format!("resolvers {r}"));
        }
    }
}

#[test]
fn grafana_provisioning_matches_the_compose_file() {
    let compose = yaml("docker/docker-compose.yml");
    let grafana = &compose["services"]["grafana"];
    let grafana_mounts = mounts(grafana, "grafana");
    let mounted_at = |dst: &str| -> PathBuf {
        let (src, _) = grafana_mounts
            .iter()
            .find(|(_, d)| d == dst)
            .unwrap_or_else(|| panic!("grafana: nothing mounted at {dst}: {grafana_mounts:?}"));
        docker_dir().join(src)
    };

    let ds_dir = mounted_at("/etc/grafana/provisioning/datasources");
    assert_eq!(ds_dir, docker_dir().join("./grafana/provisioning/datasources"));
    let ds = yaml("docker/grafana/provisioning/datasources/prometheus.yml");
    assert_eq!(ds["apiVersion"].as_i64(), Some(1));
    let source = &ds["datasources"][0];
    assert_eq!(source["type"].as_str(), Some("prometheus"));
    assert_eq!(source["uid"].as_str(), Some("prometheus"));
    let url = text(&source["url"], "datasource url");
    assert_eq!(url, "http://prometheus:9090", "the compose service prometheus");

    let dash_prov_dir = mounted_at("/etc/grafana/provisioning/dashboards");
    assert!(dash_prov_dir.join("heatshield.yml").is_file());
    let prov = yaml("docker/grafana/provisioning/dashboards/heatshield.yml");
    assert_eq!(prov["apiVersion"].as_i64(), Some(1));
    let provider = &prov["providers"][0];
    assert_eq!(provider["type"].as_str(), Some("file"));
    let path = text(&provider["options"]["path"], "providers[0].options.path");
    let dashboards = mounted_at(path);
    assert!(
        dashboards.join("heatshield.json").is_file(),
        "{path} is mounted from {} and holds heatshield.json",
        dashboards.display()
    );
    if let Some(home) = env_var(grafana, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH") {
        assert_eq!(home, format!("{path}/heatshield.json"));
    }
}

/// Dockerfile instructions as (KEYWORD, arguments), continuation lines joined.
fn dockerfile_instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (kw, rest) = current.split_once(char::is_whitespace).unwrap_or((current.as_str(), ""));
        out.push((kw.to_ascii_uppercase(), rest.trim().to_string()));
        current.clear();
    }
    out
}

fn json_args(what: &str, args: &str) -> Vec<String> {
    serde_json::from_str(args).unwrap_or_else(|e| panic!("{what} should be a JSON array ({e}): {args}"))
}

/// The runtime stage's ENTRYPOINT and CMD in docker/Dockerfile (exec form).
fn image_entrypoint_and_cmd() -> (Vec<String>, Vec<String>) {
    let instrs = dockerfile_instructions(&read("docker/Dockerfile"));
    let runtime_from = instrs.iter().rposition(|(k, _)| k == "FROM").expect("docker/Dockerfile: FROM");
    let runtime = &instrs[runtime_from..];
    let last =
        |kw: &str| runtime.iter().rev().find(|(k, _)| k == kw).map(|(_, a)| json_args(kw, a)).unwrap_or_default();
    (last("ENTRYPOINT"), last("CMD"))
}

/// The uid docker/Dockerfile gives the image's user (`useradd --uid N`).
fn dockerfile_uid() -> i64 {
    dockerfile_instructions(&read("docker/Dockerfile"))
        .iter()
        .filter(|(k, _)| k == "RUN")
        .find_map(|(_, a)| {
            let words: Vec<&str> = a.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "--uid" || *w == "-u")?;
            words.get(i + 1)?.parse().ok()
        })
        .expect("docker/Dockerfile: useradd --uid N")
}

#[test]
fn dockerfile_is_multi_stage_non_root_with_healthcheck() {
    let instrs = dockerfile_instructions(&read("docker/Dockerfile"));
    let froms: Vec<usize> = instrs.iter().enumerate().filter(|(_, (k, _))| k == "FROM").map(|(i, _)| i).collect();
    assert_eq!(froms.len(), 2, "two stages (build, runtime)");
    let (build, runtime) = instrs.split_at(froms[1]);

    // The build stage copies only files that exist.
    for (_, args) in build.iter().filter(|(k, _)| k == "COPY") {
        let parts: Vec<&str> = args.split_whitespace().filter(|a| !a.starts_with("--")).collect();
        for src in &parts[..parts.len() - 1] {
            assert!(repo().join(src).exists(), "COPY source {src} does not exist");
        }
    }

    let user =
        runtime.iter().rev().find(|(k, _)| k == "USER").map(|(_, a)| a.as_str()).expect("the runtime stage sets USER");
    assert!(!["root", "0", "0:0", "root:root"].contains(&user), "USER {user} is root");
    assert!(runtime.iter().any(|(k, _)| k == "HEALTHCHECK"), "HEALTHCHECK");
    assert!(
        runtime.iter().any(|(k, a)| k == "COPY"
            && a.split_whitespace().collect::<Vec<_>>() == ["conf/heatshield.toml", "/etc/heatshield/heatshield.toml"]),
        "conf/heatshield.toml is copied to /etc/heatshield/heatshield.toml"
    );
    let exposed: BTreeSet<&str> = runtime
        .iter()
        .filter(|(k, _)| k == "EXPOSE")
        .flat_map(|(_, a)| a.split_whitespace())
        .map(|p| p.trim_end_matches("/tcp"))
        .collect();
    assert!(exposed.contains("6380") && exposed.contains("9180"), "EXPOSE 6380 9180: {exposed:?}");

    let last =
        |kw: &str| runtime.iter().rev().find(|(k, _)| k == kw).map(|(_, a)| json_args(kw, a)).unwrap_or_default();
    let mut argv = last("ENTRYPOINT");
    argv.extend(last("CMD"));
    assert_eq!(argv.first().map(String::as_str), Some("heatshield"), "{argv:?}");
    assert_eq!(flag(&argv, "--config"), Some("/etc/heatshield/heatshield.toml"), "{argv:?}");
    assert_eq!(flag(&argv, "--listen"), Some("0.0.0.0:6380"), "{argv:?}");
    assert_eq!(flag(&argv, "--metrics"), Some("0.0.0.0:9180"), "metrics reachable from outside: {argv:?}");
}

// ---------------------------------------------------------------------------
// (b) the dashboard
// ---------------------------------------------------------------------------

/// Every panel, including those inside collapsed rows.
fn all_panels(v: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    if let Some(panels) = v["panels"].as_array() {
        for p in panels {
            out.push(p);
            out.extend(all_panels(p));
        }
    }
    out
}

/// Every PromQL text of the dashboard: panel target `expr`s and template variable queries.
fn dashboard_queries(dash: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for p in all_panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push(e.to_string());
            }
        }
    }
    for var in dash["templating"]["list"].as_array().into_iter().flatten() {
        for q in [&var["query"], &var["query"]["query"], &var["definition"]] {
            if let Some(q) = q.as_str() {
                out.push(q.to_string());
            }
        }
    }
    out
}

/// Metric names in a PromQL text: `heatshield_[a-z_]+`.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("heatshield_") {
        let tail = &rest[i..];
        let len = "heatshield_".len()
            + tail["heatshield_".len()..].bytes().take_while(|b| b.is_ascii_lowercase() || *b == b'_').count();
        out.insert(tail[..len].to_string());
        rest = &tail[len..];
    }
    out
}

/// Metric names the dashboard queries (exactly as written, so histograms with `_bucket`).
fn dashboard_metrics() -> BTreeSet<String> {
    dashboard_queries(&dashboard()).iter().flat_map(|q| metric_names(q)).collect()
}

/// docs/metrics.md's table: name -> type.
fn documented_metrics() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in read("docs/metrics.md").lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() > 3
            && let Some(name) = cells[1].strip_prefix("`heatshield_").and_then(|n| n.strip_suffix('`'))
        {
            out.insert(format!("heatshield_{name}"), cells[2].to_string());
        }
    }
    assert!(out.len() >= 10, "docs/metrics.md: found only {out:?}");
    out
}

/// The documented metric a queried/exposed series name belongs to: the name itself, or a
/// histogram's name with `_bucket`, `_sum` or `_count`. `None` if undocumented (or a
/// histogram queried without its suffix).
fn documented_family(name: &str, docs: &BTreeMap<String, String>) -> Option<String> {
    if let Some(kind) = docs.get(name) {
        return (kind != "histogram").then(|| name.to_string());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        (docs.get(base)? == "histogram").then(|| base.to_string())
    })
}

#[test]
fn dashboard_uses_only_documented_metrics() {
    let dash = dashboard();
    assert_eq!(dash["uid"].as_str(), Some("heatshield"));
    let schema = dash["schemaVersion"].as_i64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    assert!(dash["id"].is_null(), "a provisioned dashboard has no fixed id");

    let panels = all_panels(&dash);
    let mut ids = BTreeSet::new();
    for p in &panels {
        let id = p["id"].as_i64().unwrap_or_else(|| panic!("panel without id: {}", p["title"]));
        assert!(ids.insert(id), "duplicate panel id {id}");
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "panel {id} has a title");
        assert_eq!(p["datasource"]["uid"].as_str(), Some("prometheus"), "{title}: datasource");
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{title}: no targets"));
        assert!(!targets.is_empty(), "{title}: no targets");
        for t in targets {
            assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "{title}: empty expr");
            if !t["datasource"].is_null() {
                assert_eq!(t["datasource"]["uid"].as_str(), Some("prometheus"), "{title}: target datasource");
            }
        }
    }

    let docs = documented_metrics();
    let queries = dashboard_queries(&dash);
    let mut families = BTreeSet::new();
    for q in &queries {
        for name in metric_names(q) {
            let family = documented_family(&name, &docs).unwrap_or_else(|| {
                panic!("{name} (in {q}) is not in docs/metrics.md (histograms need _bucket/_sum/_count)")
            });
            families.insert(family);
        }
        if q.contains("histogram_quantile") {
            assert!(q.contains("_bucket"), "histogram_quantile needs a _bucket series: {q}");
        }
        if q.contains("$instance") {
            let vars = dash["templating"]["list"].as_array().cloned().unwrap_or_default();
            assert!(vars.iter().any(|v| v["name"] == "instance"), "$instance is used but not defined");
        }
    }
    for want in [
        "heatshield_commands_total",
        "heatshield_command_duration_seconds",
        "heatshield_redirections_total",
        "heatshield_backend_request_duration_seconds",
        "heatshield_backend_errors_total",
        "heatshield_backend_connections",
        "heatshield_client_connections",
        "heatshield_topology_refreshes_total",
        "heatshield_slot_map_epoch",
        "heatshield_client_bytes_received_total",
        "heatshield_client_bytes_sent_total",
    ] {
        assert!(families.contains(want), "the dashboard has no panel for {want}");
    }
    for q in ["histogram_quantile(0.5,", "histogram_quantile(0.99,", "outcome=\"error\""] {
        assert!(queries.iter().any(|e| e.contains(q)), "no query contains {q}");
    }

    // Each query is valid PromQL (template variables replaced by what Grafana sends).
    if let Some(promtool) = promtool() {
        let dir = tempfile::tempdir().unwrap();
        let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
        for (i, q) in queries.iter().enumerate() {
            if q.starts_with("label_values(") {
                continue; // a Grafana function, not PromQL
            }
            let q = q.replace("$instance", ".*").replace("$__rate_interval", "1m");
            rules.push_str(&format!(
                "      - record: dashboard:query_{i}\n        expr: {}\n",
                serde_json::to_string(&q).unwrap()
            ));
        }
        let path = dir.path().join("dashboard-rules.yml");
        std::fs::write(&path, &rules).unwrap();
        let out = Command::new(promtool).args(["check", "rules"]).arg(&path).output().unwrap();
        assert!(
            out.status.success(),
            "promtool check rules on the dashboard queries:\n{}{}\n{rules}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------------------
// (c) the dashboard's metrics in a live exposition
// ---------------------------------------------------------------------------

/// One sample line of the Prometheus text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the text exposition format: samples, and `# TYPE` lines (name -> type).
fn parse_exposition(text: &str) -> (Vec<Sample>, BTreeMap<String, String>) {
    let mut samples = Vec::new();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut w = rest.split_whitespace();
            if w.next() == Some("TYPE")
                && let (Some(n), Some(t)) = (w.next(), w.next())
            {
                types.insert(n.to_string(), t.to_string());
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("bad sample line {line:?}"));
        let name = line[..name_end].to_string();
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let mut end = None;
            loop {
                while chars.next_if(|&(_, c)| c == ',' || c == ' ').is_some() {}
                match chars.peek() {
                    Some(&(i, '}')) => {
                        end = Some(i);
                        break;
                    }
                    None => break,
                    _ => {}
                }
                let mut key = String::new();
                for (_, c) in chars.by_ref() {
                    if c == '=' {
                        break;
                    }
                    key.push(c);
                }
                assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "label value must be quoted: {line:?}");
                let mut value = String::new();
                while let Some((_, c)) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next().map(|(_, c)| c) {
                            Some('n') => value.push('\n'),
                            Some(other) => value.push(other),
                            None => break,
                        },
                        c => value.push(c),
                    }
                }
                labels.insert(key.trim().to_string(), value);
            }
            let end = end.unwrap_or_else(|| panic!("unterminated labels: {line:?}"));
            rest = &body[end + 1..];
        }
        let value_text = rest.split_whitespace().next().unwrap_or_else(|| panic!("no value: {line:?}"));
        let value = value_text.parse::<f64>().unwrap_or_else(|e| panic!("bad value {value_text:?} in {line:?}: {e}"));
        samples.push(Sample { name, labels, value });
    }
    (samples, types)
}

/// `GET /metrics` over HTTP/1.0 on a plain TcpStream: (status, content-type, body).
fn get_metrics(addr: &str) -> io::Result<(u16, String, String)> {
    let sock: SocketAddr = addr.parse().expect("metrics address is IP:PORT");
    let mut stream = TcpStream::connect_timeout(&sock, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n").as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no end of headers: {raw:?}")))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line in {head:?}")))?;
    let content_type = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    Ok((status, content_type, body.to_string()))
}

/// Sum of the samples named `name` whose labels include all of `labels`.
fn total(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

#[test]
fn dashboard_metrics_exist_in_a_live_exposition() {
    let wanted = dashboard_metrics();
    let docs = documented_metrics();

    let cluster = RedisCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("heatshield.toml");
    // A small client limit (to see a refusal), a short command timeout (to see a backend
    // timeout), a slow periodic refresh (so the slot moved below is found by MOVED), and a
    // rate-limit rule that never refuses (so its per-rule counters exist).
    std::fs::write(
        &conf,
        "[server]\nthreads = 1\nmax_clients = 8\n\n[backend]\ncommand_timeout_ms = 300\nrefresh_interval_ms = 60000\n\n[metrics]\nlatency_sample_every = 1\n\n[[ratelimit.rules]]\nname = \"docker\"\npattern = \"hs:docker:*\"\nrate = 1000000\nburst = 1000000\n",
    )
    .unwrap();
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let proxy = Proxy::start_cluster(&cluster, &["--config", conf.to_str().unwrap(), "--metrics", &metrics_addr]);
    let owners = SlotOwners::read(&cluster);
    let mut c = Conn::connect(proxy.port());

    // Reads, writes and split multi-key commands on every master.
    let keys = owners.key_per_master("hs:docker:");
    for (_, k) in &keys {
        assert_eq!(c.cmd(&["SET", k, k]), V::ok());
        assert_eq!(c.cmd(&["GET", k]), V::s(k));
    }
    let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    let mut mget = vec!["MGET"];
    mget.extend(&names);
    assert_eq!(c.cmd(&mget), V::strs(&names));
    // An error reply from Redis.
    assert_eq!(c.cmd(&["SET", "hs:docker:str", "abc"]), V::ok());
    assert!(c.cmd(&["INCR", "hs:docker:str"]).is_err());

    // A MOVED: hand an empty slot to another master behind the proxy's back.
    let moved_key = "{hs:docker:moved}:k";
    let slot = key_slot(moved_key.as_bytes());
    let src = owners.of_slot(slot);
    let dst = *owners.masters().iter().find(|&&m| m != src).unwrap();
    let dst_id = cluster.node_id(dst);
    for m in [dst, src].into_iter().chain(owners.masters().into_iter().filter(|&m| m != src && m != dst)) {
        assert_eq!(cmd_text(m, &["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &dst_id]), "OK", "SETSLOT on {m}");
    }
    assert!(cmd_text(src, &["GET", moved_key]).starts_with("MOVED"), "the old owner answers MOVED");
    assert_eq!(c.cmd(&["SET", moved_key, "v"]), V::ok());
    assert_eq!(c.cmd(&["GET", moved_key]), V::s("v"));

    // A backend timeout: one master sleeps longer than command_timeout_ms.
    let (slow_port, slow_key) = keys[0].clone();
    let sleeper = thread::spawn(move || Conn::connect(slow_port).cmd(&["DEBUG", "SLEEP", "1"]));
    thread::sleep(Duration::from_millis(150));
    let v = c.cmd(&["GET", &slow_key]);
    assert!(v.is_err(), "GET on a sleeping master should time out, got {v:?}");
    assert_eq!(sleeper.join().unwrap(), V::ok());
    common::wait_until(Duration::from_secs(10), "the slow master to serve again", || {
        c.cmd(&["GET", &slow_key]) == V::s(&slow_key)
    });

    // A refused client: open connections until max_clients is reached.
    let mut held = Vec::new();
    let mut refused = false;
    for _ in 0..40 {
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(0) => refused = true,
            Ok(n) => {
                let reply = String::from_utf8_lossy(&buf[..n]);
                assert!(reply.contains("max number of clients"), "unexpected greeting {reply:?}");
                refused = true;
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(_) => refused = true,
        }
        if refused {
            break;
        }
        held.push(s);
    }
    assert!(refused, "no connection was refused with max_clients = 8 ({} held)", held.len());
    drop(held);

    // Scrape.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, content_type, body) = loop {
        match get_metrics(&metrics_addr) {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline => {
                eprintln!("GET http://{metrics_addr}/metrics: {e}; retrying");
                thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("GET http://{metrics_addr}/metrics failed: {e} (is the metrics endpoint implemented?)"),
        }
    };
    assert_eq!(status, 200, "GET /metrics:\n{body}");
    // Prometheus 3 refuses a scrape without a Content-Type it knows.
    assert!(content_type.starts_with("text/plain"), "Content-Type {content_type:?}");
    let (samples, types) = parse_exposition(&body);
    let exposed: BTreeSet<&str> = samples.iter().map(|s| s.name.as_str()).collect();

    // Every metric the dashboard queries has samples.
    let missing: Vec<&String> = wanted.iter().filter(|m| !exposed.contains(m.as_str())).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics missing from /metrics: {missing:?}\n# TYPE lines: {types:?}\n{body}"
    );

    // Everything exported is documented, with the documented type.
    for name in &exposed {
        if !name.starts_with("heatshield_") {
            continue;
        }
        let family =
            documented_family(name, &docs).unwrap_or_else(|| panic!("{name} is exported but not in docs/metrics.md"));
        if let Some(t) = types.get(&family) {
            assert_eq!(t, &docs[&family], "{family}: # TYPE {t}, docs/metrics.md says {}", docs[&family]);
        }
    }

    // Histogram buckets are the documented ones.
    let want_le: Vec<f64> = vec![
        0.0001,
        0.00025,
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
        10.0,
        f64::INFINITY,
    ];
    for hist in ["heatshield_command_duration_seconds_bucket", "heatshield_backend_request_duration_seconds_bucket"] {
        let mut le: Vec<f64> = samples
            .iter()
            .filter(|s| s.name == hist)
            .map(|s| s.labels.get("le").and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN))
            .collect();
        le.sort_by(f64::total_cmp);
        le.dedup();
        assert_eq!(le, want_le, "{hist}: bucket boundaries");
    }

    // The traffic above shows up where docs/metrics.md says it does.
    let at_least = |name: &str, labels: &[(&str, &str)], min: f64| {
        let v = total(&samples, name, labels);
        assert!(v >= min, "{name}{labels:?} = {v}, expected at least {min}\n{body}");
    };
    at_least("heatshield_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    at_least("heatshield_commands_total", &[("command", "GET"), ("outcome", "ok")], 1.0);
    at_least("heatshield_commands_total", &[("command", "MGET"), ("outcome", "ok")], 1.0);
    at_least("heatshield_commands_total", &[("command", "INCR"), ("outcome", "error")], 1.0);
    at_least("heatshield_commands_total", &[("outcome", "redirected")], 1.0);
    at_least("heatshield_command_duration_seconds_count", &[("command", "GET")], 1.0);
    at_least("heatshield_redirections_total", &[("kind", "moved")], 1.0);
    at_least("heatshield_backend_errors_total", &[("kind", "timeout")], 1.0);
    at_least("heatshield_backend_request_duration_seconds_count", &[], 1.0);
    at_least("heatshield_backend_connections", &[("state", "up")], 1.0);
    at_least("heatshield_client_connections", &[], 1.0);
    at_least("heatshield_client_connections_accepted_total", &[], 2.0);
    at_least("heatshield_client_connections_rejected_total", &[], 1.0);
    at_least("heatshield_topology_refreshes_total", &[("result", "ok")], 1.0);
    at_least("heatshield_client_bytes_received_total", &[], 1.0);
    at_least("heatshield_client_bytes_sent_total", &[], 1.0);
    assert!(proxy.is_alive());
}

// ---------------------------------------------------------------------------
// (d) docker/k8s/, and heatshield --check on both configuration files
// ---------------------------------------------------------------------------

/// docker/k8s/: file, kind, apiVersion. One resource per file.
const K8S: [(&str, &str, &str); 4] = [
    ("configmap.yaml", "ConfigMap", "v1"),
    ("deployment.yaml", "Deployment", "apps/v1"),
    ("service.yaml", "Service", "v1"),
    ("pdb.yaml", "PodDisruptionBudget", "policy/v1"),
];

fn k8s(file: &str) -> Yaml {
    yaml(&format!("docker/k8s/{file}"))
}

/// The configuration file the ConfigMap holds (`data."heatshield.toml"`), as text.
fn configmap_toml_text() -> String {
    let cm = k8s("configmap.yaml");
    text(&cm["data"]["heatshield.toml"], "configmap.yaml: data.heatshield.toml").to_string()
}

fn configmap_toml() -> toml::Table {
    toml_table(&configmap_toml_text(), "configmap.yaml: heatshield.toml")
}

/// The Deployment's container named heatshield.
fn heatshield_container(deploy: &Yaml) -> &Yaml {
    deploy["spec"]["template"]["spec"]["containers"]
        .as_vec()
        .expect("deployment.yaml: spec.template.spec.containers")
        .iter()
        .find(|c| c["name"].as_str() == Some("heatshield"))
        .expect("deployment.yaml: a container named heatshield")
}

/// A container's ports: name -> containerPort.
fn container_ports(container: &Yaml) -> BTreeMap<String, i64> {
    container["ports"]
        .as_vec()
        .expect("deployment.yaml: container ports")
        .iter()
        .map(|p| {
            let name = text(&p["name"], "ports[].name").to_string();
            let port = p["containerPort"].as_i64().unwrap_or_else(|| panic!("{name}: containerPort: {p:?}"));
            (name, port)
        })
        .collect()
}

/// A port reference (a number, or the name of a container port) as a number.
fn resolve_port(port: &Yaml, ports: &BTreeMap<String, i64>, what: &str) -> i64 {
    match port {
        Yaml::Integer(n) => *n,
        Yaml::String(name) => {
            *ports.get(name).unwrap_or_else(|| panic!("{what}: no container port named {name}: {ports:?}"))
        }
        other => panic!("{what}: expected a port number or name, got {other:?}"),
    }
}

/// Asserts that `selector` (labels) is not empty and that `labels` has each of them.
fn assert_selects(selector: &Yaml, labels: &Yaml, what: &str) {
    let selector = selector.as_hash().unwrap_or_else(|| panic!("{what}: selector is a mapping, got {selector:?}"));
    assert!(!selector.is_empty(), "{what}: an empty selector selects every pod");
    for (k, v) in selector.iter() {
        let k = scalar(k, what);
        assert_eq!(&labels[k.as_str()], v, "{what}: the pods' label {k}");
    }
}

/// Seconds the container's preStop hook sleeps: the `sleep` action or `exec: sleep N`.
fn pre_stop_sleep_seconds(container: &Yaml) -> i64 {
    let hook = &container["lifecycle"]["preStop"];
    if let Some(s) = hook["sleep"]["seconds"].as_i64() {
        return s;
    }
    let cmd = optional_strings(&hook["exec"]["command"], "preStop.exec.command").unwrap_or_default();
    let i = cmd.iter().position(|a| a == "sleep" || a == "/bin/sleep");
    i.and_then(|i| cmd.get(i + 1)).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// A securityContext field of the container, or else of the pod.
fn security(pod_spec: &Yaml, container: &Yaml, key: &str) -> Yaml {
    let c = &container["securityContext"][key];
    if c.is_badvalue() { pod_spec["securityContext"][key].clone() } else { c.clone() }
}

#[test]
fn k8s_manifests_are_one_resource_per_file() {
    let dir = repo().join("docker/k8s");
    let mut files: BTreeSet<String> = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json") {
            files.insert(name);
        }
    }
    let want: BTreeSet<String> = K8S.iter().map(|(f, _, _)| f.to_string()).collect();
    assert_eq!(files, want, "the manifests kubectl apply -f docker/k8s/ reads");
    assert!(dir.join("README.md").is_file(), "docker/k8s/README.md");

    for (file, kind, api_version) in K8S {
        let doc = k8s(file); // exactly one YAML document
        assert_eq!(doc["kind"].as_str(), Some(kind), "{file}: kind");
        assert_eq!(doc["apiVersion"].as_str(), Some(api_version), "{file}: apiVersion");
        assert!(!text(&doc["metadata"]["name"], file).is_empty(), "{file}: metadata.name");
    }
    // The ConfigMap's file is TOML, with the sections the other checks read.
    let config = configmap_toml();
    for section in ["server", "backend", "metrics", "fleet"] {
        assert!(config.contains_key(section), "configmap.yaml: heatshield.toml has [{section}]");
    }
}

#[test]
fn k8s_deployment_runs_the_configmap() {
    let cm = k8s("configmap.yaml");
    let deploy = k8s("deployment.yaml");
    let pod = &deploy["spec"]["template"];
    let pod_spec = &pod["spec"];
    let container = heatshield_container(&deploy);
    let config = configmap_toml();

    // argv: the image's, with Kubernetes' command/args semantics; --config once, no flag
    // overriding the file.
    let argv = container_argv(
        optional_strings(&container["command"], "command"),
        optional_strings(&container["args"], "args"),
    );
    let config_path = config_only_argv(&argv, "deployment.yaml");

    // --config points into a read-only mount of the ConfigMap, at its key.
    let (dir, file) = config_path.rsplit_once('/').unwrap_or_else(|| panic!("--config {config_path}: absolute path"));
    let mount = container["volumeMounts"]
        .as_vec()
        .expect("deployment.yaml: volumeMounts")
        .iter()
        .find(|m| m["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(dir))
        .unwrap_or_else(|| panic!("deployment.yaml: nothing mounted at {dir} (--config {config_path})"));
    assert!(mount["subPath"].is_badvalue(), "a subPath mount never sees ConfigMap updates");
    assert_eq!(mount["readOnly"].as_bool(), Some(true), "{dir} is mounted read-only");
    let volume_name = text(&mount["name"], "volumeMounts[].name");
    let volume = pod_spec["volumes"]
        .as_vec()
        .expect("deployment.yaml: volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some(volume_name))
        .unwrap_or_else(|| panic!("deployment.yaml: no volume {volume_name}"));
    assert_eq!(volume["configMap"]["name"].as_str(), cm["metadata"]["name"].as_str(), "volume {volume_name}");
    let key = match volume["configMap"]["items"].as_vec() {
        Some(items) => {
            let item = items.iter().find(|i| i["path"].as_str() == Some(file));
            let item = item.unwrap_or_else(|| panic!("volume {volume_name}: no item with path {file}"));
            text(&item["key"], "items[].key").to_string()
        }
        None => file.to_string(),
    };
    assert!(!cm["data"][key.as_str()].is_badvalue(), "configmap.yaml: data.{key} (read as {config_path})");

    // The container ports are the file's listen ports.
    let ports = container_ports(container);
    assert_eq!(ports.get("redis"), Some(&listen_port(&config, "server.listen", "configmap")), "port redis: {ports:?}");
    let metrics = listen_port(&config, "metrics.listen", "configmap");
    assert_eq!(ports.get("metrics"), Some(&metrics), "port metrics: {ports:?}");

    // Prometheus finds the pods' metrics port.
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"].as_str(), Some("true"), "prometheus.io/scrape");
    let scrape_port = annotations["prometheus.io/port"].as_str().and_then(|p| p.parse::<i64>().ok());
    assert_eq!(scrape_port, Some(metrics), "prometheus.io/port is the metrics port");

    // The image's non-root user, by uid (Kubernetes cannot check a USER given by name).
    assert_eq!(security(pod_spec, container, "runAsNonRoot").as_bool(), Some(true), "runAsNonRoot");
    assert_eq!(security(pod_spec, container, "runAsUser").as_i64(), Some(dockerfile_uid()), "runAsUser");

    assert!(!toml_text(&config, "fleet.name", "configmap").is_empty(), "the replicas form a fleet");
    let requests = &container["resources"]["requests"];
    assert!(!requests["cpu"].is_badvalue() && !requests["memory"].is_badvalue(), "resource requests");
}

#[test]
fn k8s_probes_and_termination_cover_the_drain() {
    let deploy = k8s("deployment.yaml");
    let pod_spec = &deploy["spec"]["template"]["spec"];
    let container = heatshield_container(&deploy);
    let config = configmap_toml();
    let ports = container_ports(container);
    let metrics = listen_port(&config, "metrics.listen", "configmap");

    for (probe, path) in [("readinessProbe", "/ready"), ("livenessProbe", "/live")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}: path");
        assert_eq!(resolve_port(&get["port"], &ports, probe), metrics, "{probe}: on the metrics port");
    }

    let drain = toml_ms(&config, "server.drain_grace_ms", "configmap");
    let shutdown = toml_ms(&config, "server.shutdown_timeout_ms", "configmap");
    assert!(drain > 0, "server.drain_grace_ms: give endpoints and load balancers time to stop sending clients");

    // A load balancer that follows the readiness probe sees the 503 within
    // periodSeconds x failureThreshold (Kubernetes' defaults: 10, 3): within the drain.
    let readiness = &container["readinessProbe"];
    let period = readiness["periodSeconds"].as_i64().unwrap_or(10);
    let failures = readiness["failureThreshold"].as_i64().unwrap_or(3);
    assert!(
        period * failures * 1000 <= drain,
        "readiness fails after {period} s x {failures} = more than drain_grace_ms {drain}"
    );

    // The kubelet sends SIGKILL terminationGracePeriodSeconds after termination began,
    // preStop included.
    let pre_stop = pre_stop_sleep_seconds(container);
    assert!(pre_stop >= 1, "a preStop sleep lets the endpoints catch up before SIGTERM");
    let grace = pod_spec["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("terminationGracePeriodSeconds is set (the default is 30 s)");
    assert!(
        grace * 1000 >= pre_stop * 1000 + drain + shutdown,
        "terminationGracePeriodSeconds {grace} < preStop {pre_stop} s + drain_grace_ms {drain} + shutdown_timeout_ms {shutdown}"
    );

    // Rolling updates: a new pod is ready before an old one drains.
    let strategy = &deploy["spec"]["strategy"];
    assert_eq!(strategy["type"].as_str(), Some("RollingUpdate"), "strategy");
    assert_eq!(strategy["rollingUpdate"]["maxUnavailable"].as_i64(), Some(0), "maxUnavailable");
    assert!(strategy["rollingUpdate"]["maxSurge"].as_i64().is_some_and(|n| n >= 1), "maxSurge");
}

#[test]
fn k8s_service_and_pdb_select_the_pods() {
    let deploy = k8s("deployment.yaml");
    let labels = &deploy["spec"]["template"]["metadata"]["labels"];
    assert_selects(&deploy["spec"]["selector"]["matchLabels"], labels, "deployment.yaml");
    let container = heatshield_container(&deploy);
    let ports = container_ports(container);
    let replicas = deploy["spec"]["replicas"].as_i64().expect("deployment.yaml: replicas");
    assert!(replicas >= 2, "more than one heatshield: {replicas}");

    let svc = k8s("service.yaml");
    assert_selects(&svc["spec"]["selector"], labels, "service.yaml");
    let kind = svc["spec"]["type"].as_str().unwrap_or("ClusterIP");
    assert_eq!(kind, "ClusterIP", "service.yaml: type");
    let service_ports = svc["spec"]["ports"].as_vec().expect("service.yaml: ports");
    let target = |port: i64| -> Option<i64> {
        let p = service_ports.iter().find(|p| p["port"].as_i64() == Some(port))?;
        let t = &p["targetPort"];
        Some(if t.is_badvalue() { port } else { resolve_port(t, &ports, "service.yaml: targetPort") })
    };
    assert_eq!(target(6379), ports.get("redis").copied(), "service port 6379 -> the redis container port");
    assert_eq!(target(9180), ports.get("metrics").copied(), "service port 9180 -> the metrics container port");

    let pdb = k8s("pdb.yaml");
    assert_selects(&pdb["spec"]["selector"]["matchLabels"], labels, "pdb.yaml");
    let spec = &pdb["spec"];
    match (spec["minAvailable"].as_i64(), spec["maxUnavailable"].as_i64()) {
        (Some(min), None) => assert!((1..replicas).contains(&min), "minAvailable {min} with {replicas} replicas"),
        (None, Some(max)) => assert!((1..replicas).contains(&max), "maxUnavailable {max} with {replicas} replicas"),
        other => panic!("pdb.yaml: one of minAvailable / maxUnavailable as a number, got {other:?}"),
    }
}

fn assert_check_ok(path: &Path) {
    let path = path.to_str().expect("a UTF-8 path");
    let (code, out, err) = common::run_bin(&["--check", "--config", path]);
    assert_eq!(code, 0, "heatshield --check --config {path}:\n{out}{err}");
    assert!(out.contains("configuration ok"), "heatshield --check --config {path}:\n{out}{err}");
}

#[test]
fn heatshield_check_accepts_the_docker_and_k8s_configs() {
    assert_check_ok(&repo().join(HEATSHIELD_TOML));

    let dir = tempfile::tempdir().unwrap();
    let configmap = dir.path().join("heatshield.toml");
    std::fs::write(&configmap, configmap_toml_text()).unwrap();
    assert_check_ok(&configmap);

    // --check does read the file: a misspelt key fails it.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, configmap_toml_text().replace("drain_grace_ms", "drain_grace_msx")).unwrap();
    let (code, out, _) = common::run_bin(&["--check", "--config", bad.to_str().unwrap()]);
    assert_ne!(code, 0, "heatshield --check accepted an unknown key:\n{out}");
}
