//! INFO as heatshield answers it: its own sections (`# Proxy`, `# Server`, `# Clients`,
//! `# Keyspace` summed over the masters, `# Commandstats`, `# Latencystats`), in Redis's
//! format, built from the shared state and the masters' `INFO server keyspace`.

use std::fmt::Write as _;

use bytes::Bytes;

use crate::pending::Ctx;
use crate::protocol::Value;
use crate::proxy::Proxy;
use crate::stats::{Totals, percentile};

/// Builds the INFO reply from the proxy's own state and the masters' `INFO server keyspace`.
pub fn info_text(proxy: &Proxy, ctx: &mut Ctx, sections: &[String], backend: &[&[u8]]) -> Bytes {
    let default =
        sections.is_empty() || sections.iter().any(|s| matches!(s.as_str(), "all" | "default" | "everything"));
    let everything = sections.iter().any(|s| matches!(s.as_str(), "all" | "everything"));
    let want = |s: &str| default || sections.iter().any(|x| x == s);
    // as in Redis, command statistics come only with "all", "everything" or by name
    let want_extra = |s: &str| everything || sections.iter().any(|x| x == s);
    let mut keys = 0i64;
    let mut expires = 0i64;
    for text in backend {
        for line in text.split(|&c| c == b'\n') {
            let line = std::str::from_utf8(line).unwrap_or("").trim_end();
            if let Some(rest) = line.strip_prefix("db0:") {
                for kv in rest.split(',') {
                    match kv.split_once('=') {
                        Some(("keys", v)) => keys += v.parse::<i64>().unwrap_or(0),
                        Some(("expires", v)) => expires += v.parse::<i64>().unwrap_or(0),
                        _ => {}
                    }
                }
            } else if let Some(v) = line.strip_prefix("redis_version:") {
                *proxy.redis_version.write() = v.to_string();
            }
        }
    }
    let up = proxy.started.elapsed().as_secs();
    let topo = proxy.cluster.topology();
    let mut s = String::new();
    if want("proxy") {
        let _ = write!(
            s,
            "# Proxy\r\nheatshield_version:{}\r\nuptime_in_seconds:{up}\r\nconfig_file:{}\r\nbackend_mode:{}\r\nmasters:{}\r\nslot_map_epoch:{}\r\ntopology_refreshes:{}\r\ntotal_commands_processed:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            proxy.config_file.as_deref().unwrap_or(""),
            if proxy.cluster.is_cluster() { "cluster" } else { "standalone" },
            topo.masters.len(),
            topo.version,
            proxy.cluster.refreshes.load(std::sync::atomic::Ordering::Relaxed),
            proxy.stats.commands.load(std::sync::atomic::Ordering::Relaxed),
        );
    }
    if want("server") {
        let _ = write!(
            s,
            "# Server\r\nredis_version:{}\r\nredis_mode:standalone\r\nheatshield_version:{}\r\nos:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{up}\r\nuptime_in_days:{}\r\n\r\n",
            proxy.redis_version.read(),
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            proxy.config.server.listen.rsplit(':').next().unwrap_or(""),
            up / 86400,
        );
    }
    if want("clients") {
        let st = &proxy.stats;
        let _ = write!(
            s,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nblocked_clients:{}\r\ntracking_clients:{}\r\nclients_in_timeout_table:{}\r\ntotal_connections_received:{}\r\nrejected_connections:{}\r\n\r\n",
            st.clients.load(std::sync::atomic::Ordering::Relaxed),
            proxy.config.server.max_clients,
            crate::pending::BLOCKED.load(std::sync::atomic::Ordering::Relaxed),
            proxy.client_side.clients(),
            crate::pending::BLOCKED_TIMED.load(std::sync::atomic::Ordering::Relaxed),
            st.accepted.load(std::sync::atomic::Ordering::Relaxed),
            st.rejected.load(std::sync::atomic::Ordering::Relaxed),
        );
    }
    if want("keyspace") {
        s.push_str("# Keyspace\r\n");
        if keys > 0 {
            let _ = write!(s, "db0:keys={keys},expires={expires},avg_ttl=0\r\n");
        }
        s.push_str("\r\n");
    }
    command_sections(proxy, want_extra("commandstats"), want_extra("latencystats"), &mut s);
    let text = s.trim_end_matches("\r\n").to_string() + if s.is_empty() { "" } else { "\r\n" };
    let mut w = crate::protocol::Writer::new(ctx.scratch, ctx.client.proto);
    w.verbatim(text.as_bytes());
    ctx.scratch.split().freeze()
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
