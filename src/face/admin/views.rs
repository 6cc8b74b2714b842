//! What `PROXY INFO`, `NODES`, `SLOWLOG GET`, `BIGKEYS` and `CACHE STATS` show.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::path::pending::{Ctx, Outcome};
use crate::protocol::Writer;
use crate::proxy::Proxy;
use crate::upstream::backend::ConnState;

/// The counters of `PROXY CACHE STATS` (and INFO's cache section).
pub fn cache_stats(proxy: &Proxy) -> Vec<(String, i64)> {
    let c = &proxy.cache;
    let st = &c.stats;
    let (entries, bytes) = c.usage();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as i64;
    let mut v = vec![
        ("enabled".to_string(), c.enabled as i64),
        ("hot_keys".into(), c.hot_count() as i64),
        ("entries".into(), entries as i64),
        ("bytes".into(), bytes as i64),
        ("max_bytes".into(), c.cfg.max_bytes as i64),
        ("hits".into(), get(&st.hits)),
        ("misses".into(), get(&st.misses)),
        ("fills".into(), get(&st.fills)),
        ("fills_coalesced".into(), get(&st.coalesced)),
        ("fills_raced".into(), get(&st.raced)),
        ("fills_too_big".into(), get(&st.too_big)),
        ("fills_in_flight".into(), c.fills_in_flight() as i64),
        ("stale_answers".into(), get(&st.stale)),
        ("revalidate_answers".into(), get(&st.revalidated)),
        ("revalidate_holds".into(), get(&st.held)),
    ];
    for (i, cause) in crate::services::cache::CAUSES.iter().enumerate() {
        v.push((format!("invalidations_{cause}"), get(&st.invalidations[i])));
    }
    v
}

pub(super) fn proxy_info(proxy: &Proxy) -> String {
    let topo = proxy.cluster.topology();
    let (mut up, mut total, mut inflight) = (0, 0, 0);
    for n in &topo.masters {
        for (_, b) in n.connections() {
            total += 1;
            up += (b.stats.state() == ConnState::Up) as usize;
            inflight += b.stats.inflight.load(Ordering::Relaxed);
        }
    }
    format!(
        "version:{}\r\nuptime_in_seconds:{}\r\nconfig_file:{}\r\nbackend_mode:{}\r\nworkers:{}\r\nconnected_clients:{}\r\nbackend_masters:{}\r\nbackend_connections:{total}\r\nbackend_connections_up:{up}\r\nbackend_inflight:{inflight}\r\nslot_map_epoch:{}\r\ntopology_refreshes:{}\r\nlisten:{}\r\nmetrics:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        proxy.started.elapsed().as_secs(),
        proxy.config_file.as_deref().unwrap_or(""),
        if proxy.cluster.is_cluster() { "cluster" } else { "standalone" },
        proxy.workers,
        proxy.stats.clients.load(Ordering::Relaxed),
        topo.masters.len(),
        topo.version,
        proxy.cluster.refreshes.load(Ordering::Relaxed),
        proxy.config.server.listen,
        proxy.config.metrics.listen,
    ) + &colocate_info(proxy)
        + &learned_info(proxy)
}

/// `PROXY INFO`'s lines about the key colocation rules (crate::services::colocate).
fn colocate_info(proxy: &Proxy) -> String {
    let rules = proxy.colocate.rules();
    format!("colocate_rules:{}\r\ncolocate_digest:{}\r\n", rules.list.len(), rules.digest())
}

/// `PROXY INFO`'s lines about the command table learned from the masters (crate::learn).
fn learned_info(proxy: &Proxy) -> String {
    let Some(l) = proxy.commands.learning() else { return "commands_learned:no\r\n".into() };
    format!(
        "commands_learned:yes\r\ncommands_servers:{}\r\ncommands_added:{}\r\ncommands_arity_from_servers:{}\r\ncommands_refused:{}\r\ncommands_masters_disagree:{}\r\n",
        l.servers.join(","),
        l.added.join(" ").to_ascii_lowercase(),
        l.arity_changed.join(",").to_ascii_lowercase(),
        l.refused.join(",").to_ascii_lowercase(),
        l.disagreed.join(" ").to_ascii_lowercase(),
    )
}

pub(super) fn proxy_nodes(proxy: &Proxy) -> String {
    let topo = proxy.cluster.topology();
    let mut s = String::new();
    if let Some(e) = proxy.cluster.refresh_error() {
        // (no slot map at all, or an old one: the reason is what an operator needs)
        let _ = write!(s, "# topology refresh failed: {e}\r\n");
    }
    for (i, n) in topo.masters.iter().enumerate() {
        let ranges: Vec<String> =
            topo.ranges_of(i).iter().map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
        let (mut up, mut connecting, mut down, mut inflight) = (0, 0, 0, 0);
        let mut error = None;
        for (_, b) in n.connections() {
            error = error.or_else(|| b.stats.error());
            match b.stats.state() {
                ConnState::Up => up += 1,
                ConnState::Connecting => connecting += 1,
                ConnState::Down => down += 1,
            }
            inflight += b.stats.inflight.load(Ordering::Relaxed);
        }
        let _ = write!(
            s,
            "{} master slots={} connections=up:{up},connecting:{connecting},down:{down} inflight={inflight}\r\n",
            n.addr,
            if ranges.is_empty() { "-".to_string() } else { ranges.join(",") }
        );
        if let Some(e) = error {
            // inside the line, before its end
            s.truncate(s.len() - 2);
            let _ = write!(s, " error=\"{}\"\r\n", e.replace('"', "'"));
        }
        let now = crate::upstream::backend::clock_ms(std::time::Instant::now());
        for r in &topo.replicas[i] {
            let _ = write!(s, "{r} replica of={}", n.addr);
            // while replicas serve reads: how far behind it is (docs/replicas.md)
            if let Some(p) = topo.readers.get(i).and_then(|l| l.iter().find(|p| &*p.addr == r.as_str())) {
                match p.synced_at.load(Ordering::Relaxed) {
                    0 => s.push_str(" lag_ms=-"),
                    t => {
                        let _ = write!(s, " lag_ms={}", now.saturating_sub(t));
                    }
                }
            }
            s.push_str("\r\n");
        }
    }
    s
}

pub(super) fn slowlog_reply(proxy: &Proxy, ctx: &mut Ctx, n: i64) -> Outcome {
    let q = proxy.slowlog.entries.lock();
    let take = if n < 0 { q.len() } else { (n as usize).min(q.len()) };
    ctx.reply(|w: &mut Writer| {
        w.array(take);
        for e in q.iter().take(take) {
            w.array(7);
            w.int(e.id as i64);
            w.int(e.at as i64);
            w.int(e.total.as_micros() as i64);
            w.array(e.args.len());
            for a in &e.args {
                w.bulk(a);
            }
            w.bulk(e.client.as_bytes());
            w.bulk(e.name.as_bytes());
            w.map(4);
            w.bulk(b"node");
            w.bulk(e.node.as_bytes());
            w.bulk(b"backend_us");
            w.int(e.stages.backend.as_micros() as i64);
            w.bulk(b"queued_us");
            w.int(e.stages.queued.as_micros() as i64);
            w.bulk(b"write_us");
            w.int(e.stages.write.as_micros() as i64);
        }
    })
}

pub(super) fn bigkeys_reply(proxy: &Proxy, ctx: &mut Ctx, n: usize) -> Outcome {
    let mut v: Vec<(Bytes, String, &'static str, u64, u64)> = proxy
        .bigkeys
        .entries
        .lock()
        .iter()
        .map(|e| (e.key.clone(), e.command.clone(), e.kind, e.bytes, e.at))
        .collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.3));
    v.truncate(n);
    ctx.reply(|w| {
        w.array(v.len());
        for (key, command, kind, bytes, at) in &v {
            w.map(5);
            w.bulk(b"key");
            w.bulk(key);
            w.bulk(b"command");
            w.bulk(command.as_bytes());
            w.bulk(b"kind");
            w.bulk(kind.as_bytes());
            w.bulk(b"bytes");
            w.int(*bytes as i64);
            w.bulk(b"last_seen");
            w.int(*at as i64);
        }
    })
}
