//! INFO as one Redis would answer it: every section the masters give for the sections
//! asked, aggregated field by field over the masters (the rules are [`rule`] and
//! docs/info.md), with heatshield's own figures where the client's view is the proxy's
//! (`# Clients`, the process and port in `# Server`, connections and commands in `# Stats`,
//! `# Commandstats`, `# Latencystats`), and heatshield's `# Proxy` section.

use std::fmt::Write as _;

use bytes::Bytes;

use crate::path::pending::Ctx;
use crate::protocol::Value;
use crate::proxy::Proxy;
use crate::services::stats::{Totals, percentile};

/// How one field's values on the masters become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Counters, sizes, rates: added up.
    Sum,
    /// States and ratios (`loading`, `*_in_progress`, `*_ratio`, offsets): the highest, so
    /// a master that is loading or fragmented shows.
    Max,
    /// `rdb_last_save_time`: the oldest, the one that matters for data at risk.
    Min,
    /// Settings and names: the value the masters share; when they differ, the first
    /// master's, and the field is named in `# Proxy`'s `info_fields_differ` (a `*_status`
    /// field: the first that is not `ok`).
    Common,
    /// `*_human`: recomputed from the aggregated byte count it shows.
    Human,
    /// `avg_ttl` of a keyspace line: the mean over the masters that have one (not 0).
    Mean,
}

/// The rule for a field (`key` of a `key:value` line, or of one `k=v` inside a value).
pub fn rule(key: &str, value: &str) -> Rule {
    if key.ends_with("_human") {
        return Rule::Human;
    }
    if key == "avg_ttl" {
        return Rule::Mean;
    }
    if key == "rdb_last_save_time" {
        return Rule::Min;
    }
    if matches!(
        key,
        "loading"
            | "async_loading"
            | "lru_clock"
            | "server_time_usec"
            | "number_of_cached_scripts"
            | "total_system_memory"
    ) || key.ends_with("_in_progress")
        || key.ends_with("_ratio")
        || key.ends_with("_perc")
        || key.ends_with("_offset")
        || key.ends_with("_time_sec")
        || key.ends_with("_lag")
        || key.starts_with("mem_fragmentation")
    {
        return Rule::Max;
    }
    let settings = matches!(
        key,
        "arch_bits"
            | "hz"
            | "configured_hz"
            | "io_threads_active"
            | "redis_git_dirty"
            | "aof_enabled"
            | "cluster_enabled"
            | "maxmemory_policy"
            | "redis_git_sha1"
            | "repl_backlog_active"
    ) || key.ends_with("_enabled")
        || key.ends_with("_id")
        || key.contains("replid")
        || key.ends_with("_version")
        || key.ends_with("_status");
    if settings || number(value).is_none() {
        return Rule::Common;
    }
    Rule::Sum
}

/// A field's value as a number (`12.5`, `93.45%` as 93.45).
fn number(v: &str) -> Option<f64> {
    let v = v.strip_suffix('%').unwrap_or(v);
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-')) {
        return None;
    }
    v.parse().ok()
}

/// Redis's `bytesToHuman`.
fn human(n: f64) -> String {
    const UNITS: [(f64, &str); 5] =
        [(1024.0, "K"), (1048576.0, "M"), (1073741824.0, "G"), (1099511627776.0, "T"), (1125899906842624.0, "P")];
    if n < 1024.0 {
        return format!("{}B", n as u64);
    }
    let mut out = String::new();
    for (i, (size, unit)) in UNITS.iter().enumerate() {
        if i + 1 == UNITS.len() || n < size * 1024.0 {
            out = format!("{:.2}{unit}", n / size);
            break;
        }
    }
    out
}

/// Formats an aggregated number as the masters wrote theirs: an integer stays one.
fn show(n: f64, like: &str) -> String {
    let pct = like.ends_with('%');
    let digits = like.trim_end_matches('%').split_once('.').map(|(_, f)| f.len());
    let body = match digits {
        Some(d) => format!("{n:.d$}"),
        None => format!("{}", n.round() as i64),
    };
    if pct { body + "%" } else { body }
}

/// Values of one field on each master (`None`: that master has no such field).
fn combine(key: &str, values: &[Option<&str>], differ: &mut Vec<String>, done: &[(String, String)]) -> String {
    let present: Vec<&str> = values.iter().flatten().copied().collect();
    let Some(first) = present.first().copied() else { return String::new() };
    if first.contains('=') && first.contains(',') || first.starts_with("count=") {
        return combine_list(key, &present, differ);
    }
    match rule(key, first) {
        Rule::Human => {
            let base = &key[..key.len() - "_human".len()];
            match done.iter().find(|(k, _)| k == base).and_then(|(_, v)| number(v)) {
                Some(n) => human(n),
                None => first.to_string(),
            }
        }
        Rule::Common => {
            if present.iter().any(|v| *v != first) {
                if key.ends_with("_status") {
                    return present.iter().find(|v| **v != "ok").unwrap_or(&first).to_string();
                }
                differ.push(key.to_string());
            }
            first.to_string()
        }
        r => {
            let nums: Vec<f64> = present.iter().filter_map(|v| number(v)).collect();
            if nums.is_empty() {
                return first.to_string();
            }
            let n = match r {
                Rule::Max => nums.iter().copied().fold(f64::MIN, f64::max),
                Rule::Min => nums.iter().copied().fold(f64::MAX, f64::min),
                Rule::Mean => {
                    let set: Vec<f64> = nums.iter().copied().filter(|n| *n != 0.0).collect();
                    if set.is_empty() { 0.0 } else { set.iter().sum::<f64>() / set.len() as f64 }
                }
                _ => nums.iter().sum(),
            };
            show(n, first)
        }
    }
}

/// A `k=v,k=v` value (`db0`, `errorstat_*`): combined component by component.
fn combine_list(key: &str, present: &[&str], differ: &mut Vec<String>) -> String {
    let mut keys: Vec<&str> = Vec::new();
    for v in present {
        for kv in v.split(',') {
            let k = kv.split_once('=').map_or(kv, |(k, _)| k);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    let mut out = String::new();
    for k in keys {
        let vals: Vec<Option<&str>> = present
            .iter()
            .map(|v| v.split(',').find_map(|kv| kv.split_once('=').filter(|(x, _)| *x == k).map(|(_, v)| v)))
            .collect();
        let mut sub = Vec::new();
        let v = combine(k, &vals, &mut sub, &[]);
        if !sub.is_empty() {
            differ.push(format!("{key}.{k}"));
        }
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "{k}={v}");
    }
    out
}

/// A section of one master's INFO: its name and its `key:value` lines, in order.
type Section<'a> = (String, Vec<(&'a str, &'a str)>);

/// One master's INFO text as its sections.
fn sections_of(text: &str) -> Vec<Section<'_>> {
    let mut out: Vec<Section<'_>> = Vec::new();
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(name) = line.strip_prefix("# ") {
            out.push((name.to_string(), Vec::new()));
        } else if let Some((k, v)) = line.split_once(':')
            && let Some(last) = out.last_mut()
        {
            last.1.push((k, v));
        }
    }
    out
}

/// The masters' INFO texts aggregated: sections in the first master's order (sections or
/// fields only some masters have come after), each field by its [`rule`]; `slaveN` lines of
/// `# Replication` renumbered across masters.
pub fn aggregate(texts: &[&str], differ: &mut Vec<String>) -> Vec<(String, Vec<(String, String)>)> {
    let parsed: Vec<Vec<Section<'_>>> = texts.iter().map(|t| sections_of(t)).collect();
    let mut names: Vec<&str> = Vec::new();
    for p in &parsed {
        for (n, _) in p {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    let mut out = Vec::new();
    for name in names {
        let per: Vec<Option<&Vec<(&str, &str)>>> =
            parsed.iter().map(|p| p.iter().find(|(n, _)| n == name).map(|(_, f)| f)).collect();
        let mut keys: Vec<&str> = Vec::new();
        for f in per.iter().flatten() {
            for (k, _) in f.iter() {
                if !keys.contains(k) && !is_replica_line(k) {
                    keys.push(k);
                }
            }
        }
        let mut fields: Vec<(String, String)> = Vec::new();
        for k in keys {
            let vals: Vec<Option<&str>> =
                per.iter().map(|f| f.and_then(|f| f.iter().find(|(x, _)| *x == k).map(|(_, v)| *v))).collect();
            let v = combine(k, &vals, differ, &fields);
            fields.push((k.to_string(), v));
        }
        if name == "Replication" {
            let mut i = 0;
            for f in per.iter().flatten() {
                for (_, v) in f.iter().filter(|(k, _)| is_replica_line(k)) {
                    fields.push((format!("slave{i}"), v.to_string()));
                    i += 1;
                }
            }
        }
        out.push((name.to_string(), fields));
    }
    out
}

fn is_replica_line(k: &str) -> bool {
    k.strip_prefix("slave").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The INFO reply: the masters' INFO for the same sections, aggregated, with heatshield's
/// own figures put in (see the module comment).
pub fn info_text(proxy: &Proxy, ctx: &mut Ctx, replies: &[(&str, &Bytes)]) -> Bytes {
    let sections: Vec<String> =
        ctx.req.args().skip(1).map(|a| String::from_utf8_lossy(a).to_ascii_lowercase()).collect();
    let default =
        sections.is_empty() || sections.iter().any(|s| matches!(s.as_str(), "all" | "default" | "everything"));
    let everything = sections.iter().any(|s| matches!(s.as_str(), "all" | "everything"));
    let want = |s: &str| default || sections.iter().any(|x| x == s);
    // as in Redis, command statistics come only with "all", "everything" or by name
    let want_extra = |s: &str| everything || sections.iter().any(|x| x == s);
    let texts: Vec<&str> = replies
        .iter()
        .filter_map(|(_, r)| Value::parse(r).ok())
        .filter_map(|(v, _)| v.as_bytes())
        .map(|b| std::str::from_utf8(b).unwrap_or(""))
        .collect();
    let mut differ = Vec::new();
    let mut agg = aggregate(&texts, &mut differ);
    if let Some(v) =
        agg.iter().find(|(n, _)| n == "Server").and_then(|(_, f)| f.iter().find(|(k, _)| k == "redis_version"))
    {
        *proxy.redis_version.write() = v.1.clone();
    }
    let up = proxy.started.elapsed().as_secs();
    let st = &proxy.stats;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    for (name, fields) in agg.iter_mut() {
        let mut set = |k: &str, v: String| match fields.iter_mut().find(|(x, _)| x == k) {
            Some(f) => f.1 = v,
            None => fields.push((k.to_string(), v)),
        };
        match name.as_str() {
            "Server" => {
                set("process_id", std::process::id().to_string());
                set("tcp_port", proxy.config.server.listen.rsplit_once(':').map_or("0", |(_, p)| p).to_string());
                set("uptime_in_seconds", up.to_string());
                set("uptime_in_days", (up / 86400).to_string());
                set("executable", std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default());
                set("config_file", proxy.config_file.clone().unwrap_or_default());
                set("heatshield_version", env!("CARGO_PKG_VERSION").to_string());
                set("run_id", run_id(proxy));
            }
            "Stats" => {
                set("total_connections_received", load(&st.accepted).to_string());
                set("rejected_connections", load(&st.rejected).to_string());
                set("total_commands_processed", st.commands.sum().to_string());
            }
            _ => {}
        }
    }
    // heatshield's own values do not differ
    differ.retain(|k| !OWN.contains(&k.as_str()));
    let masters = replies.len();
    let answered = texts.len();
    let mut s = String::new();
    if want("proxy") {
        let topo = proxy.cluster.topology();
        let (user, sys) = own_cpu();
        let _ = write!(
            s,
            "# Proxy\r\nheatshield_version:{}\r\nuptime_in_seconds:{up}\r\nconfig_file:{}\r\nbackend_mode:{}\r\nmasters:{}\r\nmasters_answered:{answered}\r\nslot_map_epoch:{}\r\ntopology_refreshes:{}\r\ntotal_commands_processed:{}\r\nused_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\ninfo_fields_differ:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            proxy.config_file.as_deref().unwrap_or(""),
            if proxy.cluster.is_cluster() { "cluster" } else { "standalone" },
            topo.masters.len().max(masters),
            topo.version,
            proxy.cluster.refreshes.load(std::sync::atomic::Ordering::Relaxed),
            st.commands.sum(),
            differ.join(","),
        );
    }
    // a section Redis has but no master answered with (none reachable): ours alone
    if want("clients") && !agg.iter().any(|(n, _)| n == "Clients") {
        agg.insert(agg.iter().position(|(n, _)| n == "Server").map_or(0, |i| i + 1), ("Clients".into(), vec![]));
    }
    for (name, fields) in &agg {
        match name.as_str() {
            "Commandstats" | "Latencystats" => continue, // heatshield's own, below
            "Clients" => {
                let _ = write!(
                    s,
                    "# Clients\r\nconnected_clients:{}\r\ncluster_connections:0\r\nmaxclients:{}\r\nblocked_clients:{}\r\ntracking_clients:{}\r\nclients_in_timeout_table:{}\r\ntotal_connections_received:{}\r\nrejected_connections:{}\r\n\r\n",
                    st.clients.load(std::sync::atomic::Ordering::Relaxed),
                    proxy.live.max_clients.load(std::sync::atomic::Ordering::Relaxed),
                    crate::path::pending::BLOCKED.load(std::sync::atomic::Ordering::Relaxed),
                    proxy.client_side.clients(),
                    crate::path::pending::BLOCKED_TIMED.load(std::sync::atomic::Ordering::Relaxed),
                    load(&st.accepted),
                    load(&st.rejected),
                );
            }
            _ => {
                let _ = write!(s, "# {name}\r\n");
                for (k, v) in fields {
                    let _ = write!(s, "{k}:{v}\r\n");
                }
                s.push_str("\r\n");
            }
        }
    }
    command_sections(proxy, want_extra("commandstats"), want_extra("latencystats"), &mut s);
    let text = s.trim_end_matches("\r\n").to_string() + if s.is_empty() { "" } else { "\r\n" };
    let mut w = crate::protocol::Writer::new(ctx.scratch, ctx.client.proto);
    w.verbatim(text.as_bytes());
    ctx.scratch.split().freeze()
}

/// Fields whose value is heatshield's own (set over the masters' in [`info_text`]).
const OWN: [&str; 11] = [
    "process_id",
    "tcp_port",
    "uptime_in_seconds",
    "uptime_in_days",
    "executable",
    "config_file",
    "run_id",
    "total_connections_received",
    "rejected_connections",
    "total_commands_processed",
    "connected_clients",
];

/// This heatshield process's run id: 40 hex digits, new for every start, as Redis's.
fn run_id(proxy: &Proxy) -> String {
    let started = std::time::SystemTime::now() - proxy.started.elapsed();
    let nanos = started.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    sha1_smol::Sha1::from(format!("heatshield {} {nanos}", std::process::id())).digest().to_string()
}

/// heatshield's own CPU time (user, system) in seconds (see [`crate::services::stats::own_cpu`]).
fn own_cpu() -> (f64, f64) {
    crate::services::stats::own_cpu()
}

/// INFO's `# Commandstats` and `# Latencystats` sections for the proxy (Redis's format;
/// times are as clients see them through heatshield).
fn command_sections(proxy: &Proxy, commandstats: bool, latencystats: bool, out: &mut String) {
    let table = &proxy.commands;
    let rows: Vec<(String, Totals)> = (0..table.count())
        .map(|id| (table.name_of(id).to_ascii_lowercase(), proxy.command_stats.total(id)))
        .filter(|(_, t)| t.0 > 0)
        .collect();
    if commandstats {
        out.push_str("# Commandstats\r\n");
        for (name, (calls, usec, failed, _)) in &rows {
            let _ = write!(
                out,
                "cmdstat_{name}:calls={calls},usec={usec},usec_per_call={:.2},rejected_calls=0,failed_calls={failed}\r\n",
                *usec as f64 / *calls as f64
            );
        }
        out.push_str("\r\n");
    }
    if latencystats {
        out.push_str("# Latencystats\r\n");
        for (name, (calls, _, _, hist)) in &rows {
            let p = |q| percentile(hist, *calls, q) as f64;
            let _ = write!(
                out,
                "latency_percentiles_usec_{name}:p50={:.3},p99={:.3},p99.9={:.3}\r\n",
                p(0.5),
                p(0.99),
                p(0.999)
            );
        }
        out.push_str("\r\n");
    }
}

/// Extracts `redis_version` from an INFO reply (used at start-up).
pub fn redis_version_of(info_reply: &[u8]) -> Option<String> {
    let (v, _) = Value::parse(info_reply).ok()?;
    let text = v.as_bytes()?;
    std::str::from_utf8(text).ok()?.lines().find_map(|l| l.strip_prefix("redis_version:").map(|v| v.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_aggregate_by_their_rule() {
        let a = "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\nmaxmemory_policy:noeviction\r\nmem_fragmentation_ratio:1.50\r\n\r\n# Persistence\r\nloading:0\r\nrdb_last_save_time:200\r\n\r\n# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=127.0.0.1,port=7003,state=online,offset=10,lag=0\r\n\r\n# Keyspace\r\ndb0:keys=10,expires=2,avg_ttl=100\r\n";
        let b = "# Memory\r\nused_memory:2097152\r\nused_memory_human:2.00M\r\nmaxmemory_policy:allkeys-lru\r\nmem_fragmentation_ratio:2.25\r\n\r\n# Persistence\r\nloading:1\r\nrdb_last_save_time:100\r\n\r\n# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=127.0.0.1,port=7004,state=online,offset=20,lag=0\r\n\r\n# Keyspace\r\ndb0:keys=5,expires=0,avg_ttl=0\r\n";
        let mut differ = Vec::new();
        let agg = aggregate(&[a, b], &mut differ);
        let get = |s: &str, k: &str| {
            agg.iter().find(|(n, _)| n == s).unwrap().1.iter().find(|(x, _)| x == k).map(|(_, v)| v.clone())
        };
        assert_eq!(get("Memory", "used_memory").as_deref(), Some("3145728"));
        assert_eq!(get("Memory", "used_memory_human").as_deref(), Some("3.00M"));
        assert_eq!(get("Memory", "maxmemory_policy").as_deref(), Some("noeviction"));
        assert_eq!(get("Memory", "mem_fragmentation_ratio").as_deref(), Some("2.25"));
        assert_eq!(get("Persistence", "loading").as_deref(), Some("1"));
        assert_eq!(get("Persistence", "rdb_last_save_time").as_deref(), Some("100"));
        assert_eq!(get("Replication", "connected_slaves").as_deref(), Some("2"));
        assert_eq!(
            get("Replication", "slave1").as_deref(),
            Some("ip=127.0.0.1,port=7004,state=online,offset=20,lag=0")
        );
        assert_eq!(get("Keyspace", "db0").as_deref(), Some("keys=15,expires=2,avg_ttl=100"));
        assert_eq!(differ, vec!["maxmemory_policy".to_string()]);
    }

    #[test]
    fn human_is_redis_bytes_to_human() {
        assert_eq!(human(512.0), "512B");
        assert_eq!(human(1536.0), "1.50K");
        assert_eq!(human(3.0 * 1048576.0), "3.00M");
    }
}
