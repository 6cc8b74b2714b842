//! heatshield's Prometheus metrics, end to end: a real 3+3 cluster, a heatshield with
//! its metrics endpoint on a free port, and a real `prometheus` server (its own config,
//! storage and port in a tempdir) scraping it every second.
//!
//! A known amount of traffic goes through the proxy on a known number of connections;
//! once Prometheus has scraped after the traffic (and two consecutive scrapes agree),
//! its HTTP API must report exactly those counts, sane latency quantiles, the accepted
//! connections, and the bytes moved. The exposition itself is checked too: every metric
//! of docs/metrics.md with its type, label names and buckets, nothing undocumented, no
//! unbounded label values, and `promtool check metrics` without complaints.
//!
//! Needs `prometheus` and `promtool` on PATH (scripts/ensure-deps.sh installs them);
//! `PROMETHEUS` / `PROMTOOL` override the binaries.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::client::encode;
use common::{Proxy, RedisCluster, Resp, SlotOwners, free_port, http_get, parse_resp, try_http_get};
use tempfile::TempDir;

// ---------------------------------------------------------------------------
// What docs/metrics.md promises
// ---------------------------------------------------------------------------

/// `(name, type, label names)` of every documented metric.
const DOCUMENTED: &[(&str, &str, &[&str])] = &[
    ("heatshield_build_info", "gauge", &["version"]),
    ("heatshield_uptime_seconds", "gauge", &[]),
    ("heatshield_commands_total", "counter", &["command", "outcome"]),
    ("heatshield_command_duration_seconds", "histogram", &["command"]),
    ("heatshield_backend_request_duration_seconds", "histogram", &["node"]),
    ("heatshield_backend_errors_total", "counter", &["node", "kind"]),
    ("heatshield_backend_connections", "gauge", &["node", "state"]),
    ("heatshield_client_connections", "gauge", &[]),
    ("heatshield_blocked_clients", "gauge", &[]),
    ("heatshield_backend_dedicated_connections", "gauge", &["node"]),
    ("heatshield_client_connections_accepted_total", "counter", &[]),
    ("heatshield_client_connections_rejected_total", "counter", &[]),
    ("heatshield_tls_handshakes_failed_total", "counter", &[]),
    ("heatshield_tls_reloads_total", "counter", &[]),
    ("heatshield_tls_cert_logins_total", "counter", &["result"]),
    ("heatshield_audit_records_total", "counter", &[]),
    ("heatshield_audit_dropped_total", "counter", &[]),
    ("heatshield_acl_denied_total", "counter", &["user", "reason"]),
    ("heatshield_redirections_total", "counter", &["kind"]),
    ("heatshield_redirections_refused_total", "counter", &[]),
    ("heatshield_retries_total", "counter", &["reason"]),
    ("heatshield_script_detours_total", "counter", &[]),
    ("heatshield_replica_reads_total", "counter", &[]),
    ("heatshield_replica_fallbacks_total", "counter", &["reason"]),
    ("heatshield_replica_lag_seconds", "gauge", &["node"]),
    ("heatshield_requests_expired_total", "counter", &[]),
    ("heatshield_client_disconnects_total", "counter", &["reason"]),
    ("heatshield_topology_refreshes_total", "counter", &["result"]),
    ("heatshield_slot_map_epoch", "gauge", &[]),
    ("heatshield_client_bytes_received_total", "counter", &[]),
    ("heatshield_client_bytes_sent_total", "counter", &[]),
    ("heatshield_ratelimit_allowed_total", "counter", &["rule"]),
    ("heatshield_ratelimit_throttled_total", "counter", &["rule"]),
    ("heatshield_ratelimit_tracked_keys", "gauge", &[]),
    ("heatshield_ratelimit_share", "gauge", &["rule"]),
    ("heatshield_fleet_members", "gauge", &[]),
    ("heatshield_fleet_watched_keys", "gauge", &[]),
    ("heatshield_fleet_sync_age_seconds", "gauge", &[]),
    ("heatshield_fleet_syncs_total", "counter", &["result"]),
    ("heatshield_fleet_token_asks_total", "counter", &["result"]),
    ("heatshield_fleet_tokens_taken_total", "counter", &[]),
    ("heatshield_cache_hits_total", "counter", &[]),
    ("heatshield_cache_misses_total", "counter", &[]),
    ("heatshield_cache_fills_total", "counter", &[]),
    ("heatshield_cache_fills_coalesced_total", "counter", &[]),
    ("heatshield_cache_stale_answers_total", "counter", &["rule"]),
    ("heatshield_cache_fills_discarded_total", "counter", &["reason"]),
    ("heatshield_cache_invalidations_total", "counter", &["cause"]),
    ("heatshield_cache_hot_keys", "gauge", &[]),
    ("heatshield_cache_entries", "gauge", &[]),
    ("heatshield_cache_bytes", "gauge", &[]),
    ("heatshield_lock_waiters", "gauge", &[]),
    ("heatshield_lock_keepalive_locks", "gauge", &[]),
    ("heatshield_lock_waits_total", "counter", &["result"]),
    ("heatshield_migration_cut_over", "gauge", &[]),
    ("heatshield_migration_dual_write", "gauge", &[]),
    ("heatshield_migration_shadow", "gauge", &[]),
    ("heatshield_migration_shadow_total", "counter", &["outcome"]),
    ("heatshield_migration_pending_keys", "gauge", &[]),
    ("heatshield_migration_copies_total", "counter", &["outcome"]),
    ("heatshield_migration_job_running", "gauge", &[]),
    ("heatshield_migration_job_keys_done", "gauge", &[]),
    ("heatshield_migration_job_source_keys", "gauge", &[]),
    ("heatshield_migration_job_bytes", "gauge", &[]),
    ("heatshield_migration_job_slots_done", "gauge", &[]),
    ("heatshield_pubsub_messages_total", "counter", &[]),
    ("heatshield_pubsub_resubscribes_total", "counter", &[]),
];

/// The documented latency buckets (upper bounds, seconds), `+Inf` not included.
const BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Fixed label values the documentation lists.
const LABEL_VALUES: &[(&str, &str, &[&str])] = &[
    ("heatshield_commands_total", "outcome", &["ok", "error", "redirected", "throttled", "cached"]),
    ("heatshield_cache_fills_discarded_total", "reason", &["raced", "too_big"]),
    ("heatshield_cache_invalidations_total", "cause", &["write", "tracking", "flush", "connection", "cooled"]),
    ("heatshield_lock_waits_total", "result", &["acquired", "timeout"]),
    ("heatshield_migration_copies_total", "outcome", &["applied", "kept", "gone", "failed", "overflowed"]),
    ("heatshield_backend_errors_total", "kind", &["connect", "lost", "timeout"]),
    ("heatshield_backend_connections", "state", &["up", "connecting", "down"]),
    ("heatshield_redirections_total", "kind", &["moved", "ask"]),
    (
        "heatshield_client_disconnects_total",
        "reason",
        &["output_hard", "output_soft", "output_total", "pubsub_hard", "pubsub_soft"],
    ),
    ("heatshield_topology_refreshes_total", "result", &["ok", "error"]),
];

// ---------------------------------------------------------------------------
// The traffic
// ---------------------------------------------------------------------------

/// Client connections the traffic is spread over.
const CONNS: usize = 8;
const SETS: usize = 300;
const GETS: usize = 500;
const MGETS: usize = 40;
/// INCR on a key holding a non-integer string: an error reply from Redis.
const INCR_ERRORS: usize = 10;
/// LPUSH with one argument: heatshield's own arity error.
const ARITY_ERRORS: usize = 5;
/// Unknown commands; their names must never become label values.
const UNKNOWN: usize = 5;
const UNKNOWN_PREFIX: &str = "HSNOSUCHCMD";

/// Bytes and connections the test itself moved through the proxy.
#[derive(Default)]
struct Moved {
    sent: u64,
    received: u64,
}

/// Sends `cmds` pipelined on each connection (`per_conn[i]` on `conns[i]`), then reads
/// exactly one reply per command. Returns the replies per connection; counts bytes.
fn pipeline(conns: &mut [TcpStream], per_conn: &[Vec<Vec<String>>], moved: &mut Moved) -> Vec<Vec<Resp>> {
    for (conn, cmds) in conns.iter_mut().zip(per_conn) {
        let mut out = Vec::new();
        for c in cmds {
            let args: Vec<&[u8]> = c.iter().map(|a| a.as_bytes()).collect();
            out.extend_from_slice(&encode(&args));
        }
        conn.write_all(&out).expect("write pipeline to proxy");
        moved.sent += out.len() as u64;
    }
    let mut all = Vec::new();
    for (conn, cmds) in conns.iter_mut().zip(per_conn) {
        let mut buf = Vec::new();
        let mut replies = Vec::new();
        let mut chunk = [0u8; 64 * 1024];
        while replies.len() < cmds.len() {
            while let Some((r, used)) = parse_resp(&buf) {
                buf.drain(..used);
                moved.received += used as u64;
                replies.push(r);
                if replies.len() == cmds.len() {
                    break;
                }
            }
            if replies.len() == cmds.len() {
                break;
            }
            let n = conn.read(&mut chunk).expect("read replies from proxy");
            assert!(n > 0, "proxy closed a connection after {} of {} replies", replies.len(), cmds.len());
            buf.extend_from_slice(&chunk[..n]);
        }
        assert!(buf.is_empty(), "unexpected extra bytes after the replies: {:?}", String::from_utf8_lossy(&buf));
        all.push(replies);
    }
    all
}

fn strs(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------
// The exposition format
// ---------------------------------------------------------------------------

/// One sample line of the text exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => v.parse().ok(),
    }
}

/// Parses the text format: `# TYPE` lines and samples (timestamps ignored).
fn parse_exposition(text: &str) -> (BTreeMap<String, String>, Vec<Sample>, Vec<String>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    let mut bad = Vec::new();
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(n), Some(t)) = (it.next(), it.next()) {
                types.insert(n.to_string(), t.to_string());
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        match parse_sample(line) {
            Some(s) => samples.push(s),
            None => bad.push(line.to_string()),
        }
    }
    (types, samples, bad)
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let end = loop {
            // label name
            while let Some(&(_, c)) = chars.peek() {
                if c == ',' || c == ' ' {
                    chars.next();
                } else {
                    break;
                }
            }
            let &(start, c) = chars.peek()?;
            if c == '}' {
                break start + 1;
            }
            let mut key_end = start;
            while let Some(&(i, c)) = chars.peek() {
                if c == '=' {
                    key_end = i;
                    chars.next();
                    break;
                }
                chars.next();
            }
            let key = after[start..key_end].trim().to_string();
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                let (_, c) = chars.next()?;
                match c {
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    '"' => break,
                    other => value.push(other),
                }
            }
            labels.insert(key, value);
        };
        rest = &after[end..];
    }
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample { name, labels, value })
}

/// The metric family a sample belongs to (`X_bucket` etc. of histogram `X`).
fn family<'a>(types: &BTreeMap<String, String>, sample: &'a str) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = sample.strip_suffix(suffix)
            && matches!(types.get(base).map(String::as_str), Some("histogram" | "summary"))
        {
            return base;
        }
    }
    sample
}

/// The value of the single unlabelled sample `name` in an exposition.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    let (_, samples, _) = parse_exposition(text);
    samples.iter().find(|s| s.name == name && s.labels.is_empty()).map(|s| s.value)
}

fn scrape(addr: &str) -> String {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "GET http://{addr}/metrics: status {status}, body:\n{body}");
    body
}

/// Checks an exposition against docs/metrics.md; returns the problems found.
fn check_exposition(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let (types, samples, bad) = parse_exposition(text);
    for line in bad {
        problems.push(format!("/metrics: unparsable line {line:?}"));
    }
    let documented: BTreeMap<&str, (&str, &[&str])> = DOCUMENTED.iter().map(|&(n, t, l)| (n, (t, l))).collect();

    // Types: every documented metric, with the documented type; nothing undocumented.
    for (&name, &(ty, _)) in &documented {
        match types.get(name) {
            None => problems.push(format!("{name}: documented as {ty}, not exported (no # TYPE line)")),
            Some(t) if t != ty => problems.push(format!("{name}: documented as {ty}, exported as {t}")),
            Some(_) => {}
        }
    }
    for (name, ty) in &types {
        if !documented.contains_key(name.as_str()) {
            problems.push(format!("{name}: exported ({ty}) but not in docs/metrics.md"));
        }
    }

    // Label names per family, and bucket bounds of histograms.
    let mut label_sets: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    #[allow(clippy::type_complexity)]
    let mut les: BTreeMap<(String, Vec<(String, String)>), Vec<f64>> = BTreeMap::new();
    let mut has_samples: BTreeSet<String> = BTreeSet::new();
    for s in &samples {
        let fam = family(&types, &s.name).to_string();
        has_samples.insert(fam.clone());
        if !types.contains_key(&fam) {
            problems.push(format!("{}: sample without a # TYPE line", s.name));
        }
        let mut names: Vec<String> = s.labels.keys().filter(|k| k.as_str() != "le").cloned().collect();
        names.sort();
        label_sets.entry(fam.clone()).or_default().insert(names);
        if s.name.ends_with("_bucket") && fam != s.name {
            let key: Vec<(String, String)> =
                s.labels.iter().filter(|(k, _)| k.as_str() != "le").map(|(k, v)| (k.clone(), v.clone())).collect();
            match s.labels.get("le").and_then(|v| parse_value(v)) {
                Some(le) => les.entry((fam.clone(), key)).or_default().push(le),
                None => problems.push(format!("{}: bucket without a numeric le: {:?}", s.name, s.labels)),
            }
        }
    }
    for (&name, &(_, labels)) in &documented {
        if types.contains_key(name) && !has_samples.contains(name) {
            problems.push(format!("{name}: # TYPE line but no samples"));
        }
        let mut want: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        want.sort();
        for got in label_sets.get(name).into_iter().flatten() {
            if *got != want {
                problems.push(format!("{name}: documented labels {want:?}, a series has {got:?}"));
            }
        }
    }
    for ((fam, series), got) in &les {
        let mut want: Vec<f64> = BUCKETS.to_vec();
        want.push(f64::INFINITY);
        let mut got = got.clone();
        got.sort_by(|a, b| a.partial_cmp(b).unwrap());
        if got != want {
            problems.push(format!("{fam}{series:?}: buckets {got:?}, documented {want:?}"));
        }
    }

    // Fixed label values.
    for &(name, label, allowed) in LABEL_VALUES {
        for s in samples.iter().filter(|s| family(&types, &s.name) == name) {
            if let Some(v) = s.labels.get(label)
                && !allowed.contains(&v.as_str())
            {
                problems.push(format!("{name}: {label}={v:?} is not one of the documented {allowed:?}"));
            }
        }
    }
    // Bounded labels: no client-chosen text (the unknown command names) anywhere.
    for s in &samples {
        for (k, v) in &s.labels {
            if v.to_ascii_uppercase().contains(UNKNOWN_PREFIX) {
                problems.push(format!("{}: label {k}={v:?} carries an unknown command's name", s.name));
            }
        }
    }
    problems
}

/// Runs `promtool check metrics` on `text`; returns problems (exit status or any output).
fn promtool_check(text: &str) -> Vec<String> {
    let bin = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = Command::new(&bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin} (run scripts/ensure-deps.sh): {e}"));
    let mut stdin = child.stdin.take().expect("promtool stdin");
    let input = text.to_string();
    let writer = thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("wait for promtool");
    writer.join().expect("promtool stdin writer").expect("write /metrics to promtool");
    let mut problems = Vec::new();
    if !out.status.success() {
        problems.push(format!("promtool check metrics exited with {}", out.status));
    }
    for line in String::from_utf8_lossy(&out.stdout).lines().chain(String::from_utf8_lossy(&out.stderr).lines()) {
        if !line.trim().is_empty() {
            problems.push(format!("promtool check metrics: {line}"));
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// A prometheus server
// ---------------------------------------------------------------------------

/// A `prometheus` child process on `127.0.0.1:port` scraping one target every second,
/// with its config, storage and log in a private tempdir. Killed on drop; its log tail
/// is printed if the test is panicking.
struct Prometheus {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        for attempt in 1..=3 {
            let mut prom = Self::spawn_once(target);
            match prom.wait_ready(Duration::from_secs(30)) {
                Ok(()) => return prom,
                Err(_) if attempt < 3 && prom.log().contains("address already in use") => continue,
                Err(why) => {
                    // `why` holds the log tail; kill before panicking so it is not printed twice
                    let msg = format!("prometheus on port {} failed to start: {why}", prom.port);
                    drop(prom);
                    panic!("{msg}");
                }
            }
        }
        unreachable!()
    }

    fn spawn_once(target: &str) -> Prometheus {
        let dir =
            tempfile::Builder::new().prefix("heatshield-prometheus-").tempdir().expect("create prometheus tempdir");
        let port = free_port();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: heatshield\n    metrics_path: /metrics\n    \
             static_configs:\n      - targets: [\"{target}\"]\n"
        );
        let config_path = dir.path().join("prometheus.yml");
        fs::write(&config_path, config).expect("write prometheus.yml");
        let log = File::create(dir.path().join("prometheus.log")).expect("create prometheus.log");
        let bin = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone prometheus.log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {bin} (run scripts/ensure-deps.sh): {e}"));
        Prometheus { child, port, dir }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        fs::read(self.dir.path().join("prometheus.log"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited early with {status}\n{}", self.log_tail()));
            }
            let last = match try_http_get(&self.addr(), "/-/ready") {
                Ok((200, _)) => return Ok(()),
                Ok((s, body)) => format!("/-/ready: {s} {}", body.trim()),
                Err(e) => format!("/-/ready: {e}"),
            };
            if Instant::now() >= deadline {
                return Err(format!("not ready within {timeout:?} ({last})\n{}", self.log_tail()));
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs an instant query; returns `(labels, value)` per series. Panics on API errors.
    fn query(&self, q: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let path = format!("/api/v1/query?query={}", percent_encode(q));
        let (status, body) = http_get(&self.addr(), &path);
        let json: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("query {q:?}: status {status}, not JSON ({e}): {body}"));
        assert!(status == 200 && json["status"] == "success", "query {q:?}: status {status}: {body}");
        let data = &json["data"];
        let value_of = |v: &serde_json::Value| -> f64 {
            let text = v[1].as_str().unwrap_or_else(|| panic!("query {q:?}: bad value {v}"));
            parse_value(text).unwrap_or_else(|| panic!("query {q:?}: bad number {text:?}"))
        };
        match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .expect("vector result")
                .iter()
                .map(|r| {
                    let labels = r["metric"]
                        .as_object()
                        .map(|m| {
                            m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect()
                        })
                        .unwrap_or_default();
                    (labels, value_of(&r["value"]))
                })
                .collect(),
            Some("scalar") => vec![(BTreeMap::new(), value_of(&data["result"]))],
            other => panic!("query {q:?}: unexpected result type {other:?}: {body}"),
        }
    }

    /// The value of a query that yields at most one series (`None` when empty).
    fn value(&self, q: &str) -> Option<f64> {
        let r = self.query(q);
        assert!(r.len() <= 1, "query {q:?} returned {} series: {r:?}", r.len());
        r.first().map(|(_, v)| *v)
    }

    /// Timestamp (unix seconds) of the latest scrape of the heatshield target.
    fn last_scrape(&self) -> Option<f64> {
        self.value("timestamp(up{job=\"heatshield\"})")
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!(
                "----- prometheus {} (pid {}) log tail -----\n{}\n-----",
                self.port,
                self.child.id(),
                self.log_tail()
            );
        }
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_secs_f64()
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[test]
fn prometheus_scrapes_exact_counts() {
    let started = Instant::now();
    let cluster = RedisCluster::start();
    let owners = SlotOwners::read(&cluster);
    // Time every command, so the histograms' counts are exact too (the default times one
    // command in 8).
    let conf_dir = tempfile::tempdir().unwrap();
    let conf = conf_dir.path().join("heatshield.toml");
    // one rate-limit rule and one replica read rule that match no key the test uses, so
    // the per-rule counters and the replicas' lag gauges are exported too
    fs::write(
        &conf,
        "[metrics]\nlatency_sample_every = 1\n\n[[ratelimit.rules]]\nname = \"idle\"\npattern = \"prom:never:*\"\nrate = 1\nburst = 1\n\n[[backend.read_rules]]\npattern = \"prom:never:*\"\nread_from = \"prefer-replica\"\n",
    )
    .unwrap();
    let proxy = Proxy::start_cluster(&cluster, &["--config", conf.to_str().unwrap()]);
    let metrics = proxy.metrics_addr().expect("the harness gives every proxy a metrics address");
    let prom = Prometheus::start(&metrics);

    // The target must be up before the traffic, so the first scrape is not the only one.
    let deadline = Instant::now() + Duration::from_secs(30);
    while prom.value("up{job=\"heatshield\"}") != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped heatshield at {metrics} successfully; up = {:?}, targets: {}",
            prom.query("up"),
            http_get(&prom.addr(), "/api/v1/targets").1
        );
        thread::sleep(Duration::from_millis(200));
    }

    // Baselines straight from /metrics, once the readiness PING's connection is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let before = loop {
        let text = scrape(&metrics);
        if metric_value(&text, "heatshield_client_connections") == Some(0.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "heatshield_client_connections never 0 before the traffic:\n{text}");
        thread::sleep(Duration::from_millis(50));
    };
    let base = |name: &str| metric_value(&before, name).unwrap_or(0.0);
    let accepted0 = base("heatshield_client_connections_accepted_total");
    let received0 = base("heatshield_client_bytes_received_total");
    let sent0 = base("heatshield_client_bytes_sent_total");

    // ---- traffic ----
    let mut moved = Moved::default();
    let mut conns: Vec<TcpStream> = (0..CONNS)
        .map(|_| {
            let c = TcpStream::connect(proxy.addr()).expect("connect to proxy");
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
            c
        })
        .collect();
    let key = |i: usize| format!("pm:{i}");
    let spread = |cmds: Vec<Vec<String>>| -> Vec<Vec<Vec<String>>> {
        let mut per = vec![Vec::new(); CONNS];
        for (i, c) in cmds.into_iter().enumerate() {
            per[i % CONNS].push(c);
        }
        per
    };

    // Phase 1: SETs (string values, so INCR on them fails later).
    let sets: Vec<Vec<String>> = (0..SETS).map(|i| strs(&["SET", &key(i), &format!("v{i}")])).collect();
    for replies in pipeline(&mut conns, &spread(sets), &mut moved) {
        for r in replies {
            assert_eq!(r, Resp::Simple("OK".into()), "SET reply");
        }
    }

    // Every connection is open and has done a round trip.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = scrape(&metrics);
        let now = metric_value(&text, "heatshield_client_connections");
        if now == Some(CONNS as f64) {
            break;
        }
        assert!(Instant::now() < deadline, "heatshield_client_connections = {now:?} with {CONNS} clients connected");
        thread::sleep(Duration::from_millis(50));
    }

    // Phase 2: GETs, cross-slot MGETs (one key on every master), errors.
    let mget_keys: Vec<String> = owners.key_per_master("pm:").into_iter().map(|(_, k)| k).collect();
    assert_eq!(mget_keys.len(), 3, "one MGET key per master");
    let mut cmds: Vec<Vec<String>> = Vec::new();
    cmds.extend((0..GETS).map(|i| strs(&["GET", &key(i % SETS)])));
    cmds.extend((0..MGETS).map(|_| {
        let mut c = vec!["MGET".to_string()];
        c.extend(mget_keys.iter().cloned());
        c
    }));
    cmds.extend((0..INCR_ERRORS).map(|i| strs(&["INCR", &key(i)])));
    cmds.extend((0..ARITY_ERRORS).map(|_| strs(&["LPUSH", "pm:list"])));
    cmds.extend((0..UNKNOWN).map(|i| strs(&[&format!("{UNKNOWN_PREFIX}{i}"), "a"])));
    let per_conn = spread(cmds);
    let replies = pipeline(&mut conns, &per_conn, &mut moved);
    let (mut gets, mut mgets, mut incr_err, mut arity_err, mut unknown_err) = (0, 0, 0, 0, 0);
    for (cmds, replies) in per_conn.iter().zip(&replies) {
        for (c, r) in cmds.iter().zip(replies) {
            match (c[0].as_str(), r) {
                ("GET", Resp::Bulk(Some(v))) if v.starts_with(b"v") => gets += 1,
                ("MGET", Resp::Array(Some(items))) if items.len() == 3 => mgets += 1,
                ("INCR", Resp::Error(e)) if e.contains("not an integer") => incr_err += 1,
                ("LPUSH", Resp::Error(e)) if e.contains("wrong number of arguments") => arity_err += 1,
                (name, Resp::Error(e)) if name.starts_with(UNKNOWN_PREFIX) && e.contains("unknown command") => {
                    unknown_err += 1
                }
                _ => panic!("unexpected reply to {c:?}: {r:?}"),
            }
        }
    }
    assert_eq!((gets, mgets, incr_err, arity_err, unknown_err), (GETS, MGETS, INCR_ERRORS, ARITY_ERRORS, UNKNOWN));
    drop(conns);

    // All clients gone (so the gauge and the byte counters are final).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(&metrics);
        let now = metric_value(&text, "heatshield_client_connections");
        if now == Some(0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "heatshield_client_connections = {now:?} after all clients closed");
        thread::sleep(Duration::from_millis(50));
    }
    let traffic_done = unix_now();

    // ---- wait for Prometheus: a scrape after the traffic, then a stable second one ----
    let version = env!("CARGO_PKG_VERSION");
    let queries: Vec<String> = vec![
        r#"sum(heatshield_commands_total{command="GET"})"#.into(),
        r#"sum(heatshield_commands_total{command="GET",outcome="ok"})"#.into(),
        r#"sum(heatshield_commands_total{command="SET"})"#.into(),
        r#"sum(heatshield_commands_total{command="SET",outcome="ok"})"#.into(),
        r#"sum(heatshield_commands_total{command="MGET"})"#.into(),
        r#"sum(heatshield_commands_total{command="MGET",outcome="ok"})"#.into(),
        r#"sum(heatshield_commands_total{command="INCR",outcome="error"})"#.into(),
        r#"sum(heatshield_commands_total{command="INCR",outcome!="error"})"#.into(),
        r#"sum(heatshield_commands_total{command!~"GET|SET|MGET|INCR|PING",outcome="error"})"#.into(),
        r#"sum(heatshield_command_duration_seconds_count{command="GET"})"#.into(),
        r#"sum(heatshield_command_duration_seconds_count{command="MGET"})"#.into(),
        r#"histogram_quantile(0.5, sum by (le) (heatshield_command_duration_seconds_bucket{command="GET"}))"#.into(),
        r#"histogram_quantile(0.99, sum by (le) (heatshield_command_duration_seconds_bucket{command="GET"}))"#.into(),
        "sum(heatshield_client_connections_accepted_total)".into(),
        "sum(heatshield_client_connections_rejected_total)".into(),
        "sum(heatshield_client_connections)".into(),
        "sum(heatshield_client_bytes_received_total)".into(),
        "sum(heatshield_client_bytes_sent_total)".into(),
        "max(heatshield_slot_map_epoch)".into(),
        r#"sum(heatshield_topology_refreshes_total{result="ok"})"#.into(),
        format!(r#"max(heatshield_build_info{{version="{version}"}})"#),
        "max(heatshield_uptime_seconds)".into(),
        "sum(heatshield_backend_errors_total)".into(),
        "count(count by (node) (heatshield_backend_request_duration_seconds_count))".into(),
    ];
    let snapshot = || -> Vec<Option<f64>> { queries.iter().map(|q| prom.value(q)).collect() };
    // Values that move on by themselves: uptime, the periodic slot-map refresh (every
    // backend.refresh_interval_ms) and the nodes it may talk to. Everything else must be
    // identical in two consecutive scrapes.
    let volatile = |q: &str| q.contains("uptime") || q.contains("refreshes") || q.contains("by (node)");
    let same = |a: &[Option<f64>], b: &[Option<f64>]| {
        a.iter().zip(b).zip(&queries).all(|((x, y), q)| volatile(q) || x.map(f64::to_bits) == y.map(f64::to_bits))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut prev: Option<(f64, Vec<Option<f64>>)> = None;
    let values = loop {
        assert!(Instant::now() < deadline, "prometheus did not scrape stable values after the traffic; last: {prev:?}");
        let ts = prom.last_scrape();
        let Some(ts) = ts.filter(|&t| t > traffic_done) else {
            thread::sleep(Duration::from_millis(200));
            continue;
        };
        let snap = snapshot();
        // the snapshot must belong to one scrape: no scrape in between
        if prom.last_scrape() != Some(ts) {
            continue;
        }
        match &prev {
            Some((prev_ts, prev_snap)) if *prev_ts < ts && same(prev_snap, &snap) => break snap,
            Some((prev_ts, _)) if *prev_ts == ts => {}
            _ => prev = Some((ts, snap)),
        }
        thread::sleep(Duration::from_millis(200));
    };
    let v: BTreeMap<&str, Option<f64>> = queries.iter().map(String::as_str).zip(values).collect();
    let get = |q: &str| -> Option<f64> { v[q] };

    // ---- assertions (collected, so one run shows every discrepancy) ----
    let mut problems: Vec<String> = Vec::new();
    let mut exact = |q: &str, want: f64| {
        let got = get(q);
        if got != Some(want) {
            problems.push(format!("{q} = {got:?}, expected {want}"));
        }
    };
    // Arity and unknown-command errors are error replies from heatshield (docs: `error` =
    // "the reply was an error, from Redis or from heatshield"); which `command` label they
    // get is not documented, so only their total is checked.
    exact(
        r#"sum(heatshield_commands_total{command!~"GET|SET|MGET|INCR|PING",outcome="error"})"#,
        (ARITY_ERRORS + UNKNOWN) as f64,
    );
    exact(r#"sum(heatshield_commands_total{command="GET"})"#, GETS as f64);
    exact(r#"sum(heatshield_commands_total{command="GET",outcome="ok"})"#, GETS as f64);
    exact(r#"sum(heatshield_commands_total{command="SET"})"#, SETS as f64);
    exact(r#"sum(heatshield_commands_total{command="SET",outcome="ok"})"#, SETS as f64);
    exact(r#"sum(heatshield_commands_total{command="MGET"})"#, MGETS as f64);
    exact(r#"sum(heatshield_commands_total{command="MGET",outcome="ok"})"#, MGETS as f64);
    exact(r#"sum(heatshield_commands_total{command="INCR",outcome="error"})"#, INCR_ERRORS as f64);
    exact(r#"sum(heatshield_command_duration_seconds_count{command="GET"})"#, GETS as f64);
    exact(r#"sum(heatshield_command_duration_seconds_count{command="MGET"})"#, MGETS as f64);
    exact("sum(heatshield_client_connections_accepted_total)", accepted0 + CONNS as f64);
    exact("sum(heatshield_client_connections_rejected_total)", 0.0);
    exact("sum(heatshield_client_connections)", 0.0);
    exact("sum(heatshield_client_bytes_received_total)", received0 + moved.sent as f64);
    exact("sum(heatshield_client_bytes_sent_total)", sent0 + moved.received as f64);
    exact(&format!(r#"max(heatshield_build_info{{version="{version}"}})"#), 1.0);
    exact("sum(heatshield_backend_errors_total)", 0.0);
    // every master served requests (replicas may be asked for the slot map)
    let nodes = get("count(count by (node) (heatshield_backend_request_duration_seconds_count))");
    if !nodes.is_some_and(|n| n >= RedisCluster::MASTERS as f64) {
        problems.push(format!("backend request histograms for {nodes:?} nodes, expected >= 3"));
    }
    let incr_other = get(r#"sum(heatshield_commands_total{command="INCR",outcome!="error"})"#);
    if incr_other.is_some_and(|x| x != 0.0) {
        problems.push(format!("INCR counted with an outcome other than error: {incr_other:?}"));
    }

    let p50 =
        get(r#"histogram_quantile(0.5, sum by (le) (heatshield_command_duration_seconds_bucket{command="GET"}))"#);
    let p99 =
        get(r#"histogram_quantile(0.99, sum by (le) (heatshield_command_duration_seconds_bucket{command="GET"}))"#);
    match (p50, p99) {
        (Some(p50), Some(p99)) => {
            for (name, q) in [("p50", p50), ("p99", p99)] {
                if !(q.is_finite() && q > 0.0 && q < 1.0) {
                    problems.push(format!("GET {name} = {q}, expected finite, > 0 and < 1 s"));
                }
            }
            if p50 > p99 {
                problems.push(format!("GET p50 {p50} > p99 {p99}"));
            }
            eprintln!("GET latency via prometheus: p50 {:.6} s, p99 {:.6} s", p50, p99);
        }
        other => problems.push(format!("GET quantiles missing: {other:?}")),
    }
    match get("max(heatshield_slot_map_epoch)") {
        Some(e) if e >= 1.0 => {}
        other => problems.push(format!("heatshield_slot_map_epoch = {other:?}, expected >= 1")),
    }
    match get(r#"sum(heatshield_topology_refreshes_total{result="ok"})"#) {
        Some(n) if n >= 1.0 => {}
        other => problems.push(format!("topology refreshes ok = {other:?}, expected >= 1")),
    }
    match get("max(heatshield_uptime_seconds)") {
        Some(u) if u > 0.0 => {}
        other => problems.push(format!("heatshield_uptime_seconds = {other:?}, expected > 0")),
    }

    // ---- the exposition itself ----
    let text = scrape(&metrics);
    problems.extend(check_exposition(&text));
    problems.extend(promtool_check(&text));

    eprintln!("prometheus test: {} problem(s), {:.1} s", problems.len(), started.elapsed().as_secs_f64());
    assert!(
        problems.is_empty(),
        "{} problem(s):\n  {}\n----- /metrics -----\n{text}",
        problems.len(),
        problems.join("\n  ")
    );
    drop(prom);
    drop(proxy);
    drop(cluster);
}

#[test]
fn http_helpers_work() {
    assert_eq!(percent_encode(r#"sum(x{a="b"})"#), "sum%28x%7Ba%3D%22b%22%7D%29");
    let s = parse_sample(r#"m_bucket{command="CLIENT|SETNAME",le="0.00025"} 12"#).unwrap();
    assert_eq!(s.name, "m_bucket");
    assert_eq!(s.labels["command"], "CLIENT|SETNAME");
    assert_eq!(s.labels["le"], "0.00025");
    assert_eq!(s.value, 12.0);
    let s = parse_sample(r#"m{a="x\"y,z"} +Inf"#).unwrap();
    assert_eq!(s.labels["a"], "x\"y,z");
    assert!(s.value.is_infinite());
    let s = parse_sample("plain 3.5 1700000000").unwrap();
    assert!(s.labels.is_empty());
    assert_eq!(s.value, 3.5);
}
