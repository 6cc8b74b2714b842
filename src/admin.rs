//! The operator's view of heatshield itself: `PROXY INFO | NODES | CONFIG | SLOWLOG |
//! BIGKEYS | HOTKEYS | CACHE | RATELIMIT | AUTH`, and INFO's `# Commandstats` and
//! `# Latencystats` sections from the statistics in [`crate::stats`].
//!
//! It only reads the rest of the proxy (topology, counters, configuration); what it
//! changes is the live settings ([`crate::config::Live`]), the rate-limit rules and the
//! cache (`PROXY CACHE FLUSH`).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::backend::ConnState;
use crate::config::LIVE_KEYS;
use crate::protocol::{Request, Writer};
use crate::proxy::{Ctx, Outcome, Proxy};
use crate::stats::{Totals, percentile};

/// INFO's `# Commandstats` and `# Latencystats` sections for the proxy (Redis's format;
/// times are as clients see them through heatshield).
pub fn info_sections(proxy: &Proxy, commandstats: bool, latencystats: bool, out: &mut String) {
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

/// `PROXY <subcommand> ...`
pub fn proxy_command(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    if !proxy.config.admin.enabled {
        return ctx.error("ERR PROXY commands are disabled (admin.enabled = false)");
    }
    let sub = String::from_utf8_lossy(req.arg(1)).to_ascii_uppercase();
    if sub == "AUTH" {
        if req.argc() != 3 {
            return ctx.error(&crate::errors::wrong_arity("proxy|auth"));
        }
        return match &proxy.config.admin.password {
            Some(p) if p.as_bytes() == req.arg(2) => {
                ctx.client.admin = true;
                ctx.reply(|w| w.ok())
            }
            Some(_) => ctx.error("WRONGPASS invalid admin password"),
            None => ctx.error("ERR PROXY AUTH called without admin.password configured"),
        };
    }
    if proxy.config.admin.password.is_some() && !ctx.client.admin {
        return ctx.error("NOPERM PROXY commands need PROXY AUTH <password> first");
    }
    let argc = req.argc();
    let arity_err =
        |ctx: &mut Ctx, s: &str| ctx.error(&crate::errors::wrong_arity(&format!("proxy|{}", s.to_ascii_lowercase())));
    match sub.as_str() {
        "INFO" => {
            let text = proxy_info(proxy);
            ctx.reply(|w| w.verbatim(text.as_bytes()))
        }
        "NODES" => {
            let text = proxy_nodes(proxy);
            ctx.reply(|w| w.verbatim(text.as_bytes()))
        }
        "CONFIG" if argc >= 3 => {
            let op = String::from_utf8_lossy(req.arg(2)).to_ascii_uppercase();
            match op.as_str() {
                "GET" if argc == 4 => {
                    let pat = req.arg(3).to_vec();
                    let pairs: Vec<(String, String)> = config_pairs(proxy).into_iter().filter(|(k, _)| crate::glob::matches(&pat, k.as_bytes(), false)).collect();
                    ctx.reply(|w| {
                        w.map(pairs.len());
                        for (k, v) in &pairs {
                            w.bulk(k.as_bytes());
                            w.bulk(v.as_bytes());
                        }
                    })
                }
                "SET" if argc == 5 => match config_set(proxy, req.arg(3), req.arg(4)) {
                    Ok(()) => ctx.reply(|w| w.ok()),
                    Err(e) => ctx.error(&e),
                },
                "GET" | "SET" => arity_err(ctx, &format!("config|{op}")),
                _ => ctx.error(&format!("ERR unknown subcommand 'CONFIG {op}'. Try PROXY HELP.")),
            }
        }
        "SLOWLOG" if argc >= 3 => {
            let op = String::from_utf8_lossy(req.arg(2)).to_ascii_uppercase();
            match op.as_str() {
                "LEN" => {
                    let n = proxy.slowlog.len() as i64;
                    ctx.reply(|w| w.int(n))
                }
                "RESET" => {
                    proxy.slowlog.reset();
                    ctx.reply(|w| w.ok())
                }
                "GET" => {
                    let n = match req.argc() {
                        3 => 10,
                        4 => match crate::protocol::request::parse_i64(req.arg(3)) {
                            Some(n) if n >= -1 => n,
                            _ => return ctx.error("ERR count should be greater than or equal to -1"),
                        },
                        _ => return arity_err(ctx, "slowlog|get"),
                    };
                    slowlog_reply(proxy, ctx, n)
                }
                _ => ctx.error(&format!("ERR unknown subcommand 'SLOWLOG {op}'. Try PROXY HELP.")),
            }
        }
        "BIGKEYS" => {
            let n = match req.argc() {
                2 => 10,
                3 => match crate::protocol::request::parse_i64(req.arg(2)) {
                    Some(n) if n > 0 => n as usize,
                    _ => return ctx.error("ERR count must be a positive integer"),
                },
                _ => return arity_err(ctx, "bigkeys"),
            };
            bigkeys_reply(proxy, ctx, n)
        }
        "HELP" => ctx.reply(|w| {
            let lines = [
                "PROXY <subcommand> [<arg> ...]. Subcommands are:",
                "INFO -- heatshield's version, uptime, configuration file, backend, connections, slot-map epoch.",
                "NODES -- the topology as heatshield sees it: nodes, roles, slots, connections, in-flight requests.",
                "CONFIG GET <pattern> -- settings whose name matches the glob pattern.",
                "CONFIG SET <name> <value> -- change a live setting (admin.slowlog_slower_than_us, admin.slowlog_max_len, admin.bigkey_bytes, server.allow_flush, server.max_clients).",
                "SLOWLOG GET [<count>] | LEN | RESET -- commands slower than admin.slowlog_slower_than_us.",
                "BIGKEYS [<count>] -- the largest requests and replies seen, by key.",
                "AUTH <password> -- unlock PROXY commands when admin.password is set.",
                "RATELIMIT LIST | SET <name> <pattern> <rate> <burst> [per-key|shared] [reads|writes|all|CMD,CMD...] [count-cached] | DEL <name> -- per-key rate-limit rules.",
                "HOTKEYS [COUNT <n>] -- keys read hot enough to cache: estimated reads/s, and whether a reply is cached.",
                "CACHE STATS | FLUSH -- hot-key cache counters, or drop every cached reply.",
            ];
            w.array(lines.len());
            for l in lines {
                w.simple(l);
            }
        }),
        "RATELIMIT" if argc >= 3 => ratelimit_command(proxy, ctx, req),
        "HOTKEYS" => {
            let n = match argc {
                2 => 10,
                4 if req.arg(2).eq_ignore_ascii_case(b"COUNT") => match crate::protocol::request::parse_i64(req.arg(3)) {
                    Some(n) if n > 0 => n as usize,
                    _ => return ctx.error("ERR count must be a positive integer"),
                },
                4 => return ctx.error(crate::errors::SYNTAX),
                _ => return arity_err(ctx, "hotkeys"),
            };
            let keys = proxy.cache.hot_keys(n);
            ctx.reply(|w| {
                w.array(keys.len());
                for (k, rate, cached) in &keys {
                    w.map(3);
                    w.bulk(b"key");
                    w.bulk(k);
                    w.bulk(b"reads_per_sec");
                    w.int(rate.round() as i64);
                    w.bulk(b"cached");
                    w.int(*cached as i64);
                }
            })
        }
        "CACHE" if argc == 3 => {
            let op = String::from_utf8_lossy(req.arg(2)).to_ascii_uppercase();
            match op.as_str() {
                "STATS" => {
                    let pairs = cache_stats(proxy);
                    ctx.reply(|w| {
                        w.map(pairs.len());
                        for (k, v) in &pairs {
                            w.bulk(k.as_bytes());
                            w.int(*v);
                        }
                    })
                }
                "FLUSH" => {
                    proxy.cache.admin_flush();
                    ctx.reply(|w| w.ok())
                }
                _ => ctx.error(&format!("ERR unknown subcommand 'CACHE {op}'. Try PROXY HELP.")),
            }
        }
        "CONFIG" | "SLOWLOG" | "RATELIMIT" | "CACHE" => arity_err(ctx, &sub),
        _ => ctx.error(&format!("ERR unknown subcommand '{}'. Try PROXY HELP.", String::from_utf8_lossy(req.arg(1)))),
    }
}

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
    ];
    for (i, cause) in crate::cache::CAUSES.iter().enumerate() {
        v.push((format!("invalidations_{cause}"), get(&st.invalidations[i])));
    }
    v
}

/// `PROXY RATELIMIT LIST | SET ... | DEL name`
fn ratelimit_command(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    use crate::ratelimit::{CommandsSpec, RuleConfig, compile};
    let op = String::from_utf8_lossy(req.arg(2)).to_ascii_uppercase();
    let text = |i: usize| String::from_utf8_lossy(req.arg(i)).into_owned();
    match op.as_str() {
        "LIST" if req.argc() == 3 => {
            let rules = proxy.ratelimit.rules();
            ctx.reply(|w| {
                w.array(rules.len());
                for r in rules.iter() {
                    let s = &r.spec;
                    let commands = match &s.commands {
                        CommandsSpec::Kind(k) => k.clone(),
                        CommandsSpec::List(l) => l.join(","),
                    };
                    w.map(9);
                    for (k, v) in [
                        ("name", s.name.clone()),
                        ("pattern", s.pattern.clone()),
                        ("commands", commands),
                        ("rate", s.rate.to_string()),
                        ("burst", s.burst.to_string()),
                        ("scope", s.scope.clone()),
                        ("count_cached", if s.count_cached { "yes" } else { "no" }.to_string()),
                    ] {
                        w.bulk(k.as_bytes());
                        w.bulk(v.as_bytes());
                    }
                    w.bulk(b"allowed");
                    w.int(r.allowed() as i64);
                    w.bulk(b"throttled");
                    w.int(r.throttled.load(Ordering::Relaxed) as i64);
                }
            })
        }
        "SET" if (7..=10).contains(&req.argc()) => {
            let mut scope = "per-key".to_string();
            let mut commands = CommandsSpec::default();
            let mut count_cached = false;
            for i in 7..req.argc() {
                let a = text(i);
                match a.to_ascii_lowercase().as_str() {
                    "per-key" | "shared" => scope = a.to_ascii_lowercase(),
                    "count-cached" => count_cached = true,
                    "reads" | "writes" | "all" => commands = CommandsSpec::Kind(a.to_ascii_lowercase()),
                    _ => commands = CommandsSpec::List(a.split(',').map(str::to_string).collect()),
                }
            }
            let (Ok(rate), Ok(burst)) = (text(5).parse::<f64>(), text(6).parse::<u64>()) else {
                return ctx.error("ERR rate must be a number and burst an integer");
            };
            let new = RuleConfig { name: text(3), pattern: text(4), commands, rate, burst, scope, count_cached };
            let mut specs: Vec<RuleConfig> = proxy.ratelimit.rules().iter().map(|r| r.spec.clone()).collect();
            match specs.iter_mut().find(|s| s.name == new.name) {
                Some(s) => *s = new,
                None => specs.push(new),
            }
            match compile(&specs, &proxy.commands) {
                Ok(rules) => {
                    proxy.ratelimit.replace(rules);
                    ctx.reply(|w| w.ok())
                }
                Err(p) => ctx.error(&format!("ERR invalid rule: {}", p.join("; "))),
            }
        }
        "DEL" if req.argc() == 4 => {
            let name = text(3);
            let specs: Vec<RuleConfig> = proxy.ratelimit.rules().iter().map(|r| r.spec.clone()).collect();
            let kept: Vec<RuleConfig> = specs.iter().filter(|s| s.name != name).cloned().collect();
            if kept.len() == specs.len() {
                return ctx.reply(|w| w.int(0));
            }
            match compile(&kept, &proxy.commands) {
                Ok(rules) => {
                    proxy.ratelimit.replace(rules);
                    ctx.reply(|w| w.int(1))
                }
                Err(p) => ctx.error(&format!("ERR {}", p.join("; "))),
            }
        }
        "LIST" | "SET" | "DEL" => {
            ctx.error(&crate::errors::wrong_arity(&format!("proxy|ratelimit|{}", op.to_ascii_lowercase())))
        }
        _ => ctx.error(&format!("ERR unknown subcommand 'RATELIMIT {op}'. Try PROXY HELP.")),
    }
}

fn proxy_info(proxy: &Proxy) -> String {
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
    )
}

fn proxy_nodes(proxy: &Proxy) -> String {
    let topo = proxy.cluster.topology();
    let mut s = String::new();
    for (i, n) in topo.masters.iter().enumerate() {
        let ranges: Vec<String> =
            topo.ranges_of(i).iter().map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
        let (mut up, mut connecting, mut down, mut inflight) = (0, 0, 0, 0);
        for (_, b) in n.connections() {
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
        for r in &topo.replicas[i] {
            let _ = write!(s, "{r} replica of={}\r\n", n.addr);
        }
    }
    s
}

fn config_pairs(proxy: &Proxy) -> Vec<(String, String)> {
    let l = &proxy.live;
    crate::config::entries(&proxy.config)
        .into_iter()
        .filter_map(|(k, v)| {
            let v = match k.as_str() {
                // live settings: their current value
                "admin.bigkey_bytes" => l.bigkey_bytes.load(Ordering::Relaxed).to_string(),
                "admin.slowlog_max_len" => l.slowlog_max_len.load(Ordering::Relaxed).to_string(),
                "admin.slowlog_slower_than_us" => l.slowlog_slower_than_us.load(Ordering::Relaxed).to_string(),
                "server.allow_flush" => l.allow_flush.load(Ordering::Relaxed).to_string(),
                "server.max_clients" => l.max_clients.load(Ordering::Relaxed).to_string(),
                // secrets: only whether they are set
                "admin.password" | "backend.password" | "server.password" => {
                    if v.is_some_and(|v| !v.is_empty()) {
                        "(set)".into()
                    } else {
                        String::new()
                    }
                }
                _ => v?, // None: the rate-limit rules (PROXY RATELIMIT LIST)
            };
            Some((k, v))
        })
        .collect()
}

fn config_set(proxy: &Proxy, key: &[u8], value: &[u8]) -> Result<(), String> {
    let key = String::from_utf8_lossy(key).to_ascii_lowercase();
    let v = String::from_utf8_lossy(value).to_string();
    let num = || {
        v.parse::<u64>()
            .map_err(|_| format!("ERR Invalid argument '{v}' for PROXY CONFIG SET '{key}': not a non-negative integer"))
    };
    let l = &proxy.live;
    match key.as_str() {
        "admin.slowlog_slower_than_us" => l.slowlog_slower_than_us.store(num()?, Ordering::Relaxed),
        "admin.slowlog_max_len" => {
            let n = num()?;
            if n > 100_000 {
                return Err(format!("ERR Invalid argument '{v}' for PROXY CONFIG SET '{key}': at most 100000"));
            }
            l.slowlog_max_len.store(n as usize, Ordering::Relaxed)
        }
        "admin.bigkey_bytes" => l.bigkey_bytes.store(num()?, Ordering::Relaxed),
        "server.max_clients" => {
            let n = num()?;
            if n == 0 {
                return Err(format!("ERR Invalid argument '{v}' for PROXY CONFIG SET '{key}': must be at least 1"));
            }
            l.max_clients.store(n as usize, Ordering::Relaxed)
        }
        "server.allow_flush" => match v.to_ascii_lowercase().as_str() {
            "true" | "yes" | "1" => l.allow_flush.store(true, Ordering::Relaxed),
            "false" | "no" | "0" => l.allow_flush.store(false, Ordering::Relaxed),
            _ => return Err(format!("ERR Invalid argument '{v}' for PROXY CONFIG SET '{key}': not a boolean")),
        },
        _ if config_pairs(proxy).iter().any(|(k, _)| *k == key) => {
            return Err(format!(
                "ERR '{key}' cannot be changed while heatshield runs (live settings: {}); edit the configuration file and restart",
                LIVE_KEYS.join(", ")
            ));
        }
        _ => return Err(format!("ERR Unknown option or number of arguments for PROXY CONFIG SET - '{key}'")),
    }
    Ok(())
}

fn slowlog_reply(proxy: &Proxy, ctx: &mut Ctx, n: i64) -> Outcome {
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

fn bigkeys_reply(proxy: &Proxy, ctx: &mut Ctx, n: usize) -> Outcome {
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
