//! The operator's view of heatshield itself: `PROXY INFO | NODES | CONFIG | SLOWLOG |
//! BIGKEYS | HOTKEYS | CACHE | RATELIMIT | COLOCATE | FLEET | MIGRATION | AUTH | HELP`
//! (docs/admin.md). This file parses the subcommands; `config` lists and changes
//! settings, `ratelimit` edits the rate-limit rules, `colocate` the key colocation rules,
//! `fleet` shows the fleet, `migration` the move to another cluster, `views` renders what
//! the other subcommands show.
//!
//! It only reads the rest of the proxy (topology, counters, configuration); what it
//! changes is the live settings ([`crate::config::Live`]), the rate-limit and colocation
//! rules and the cache (`PROXY CACHE FLUSH`).

mod colocate;
mod config;
mod fleet;
mod migration;
mod ratelimit;
mod views;

use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::protocol::Request;
use crate::proxy::Proxy;

pub use views::cache_stats;

/// `PROXY <subcommand> ...`
pub fn proxy_command(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    if !proxy.config.admin.enabled {
        return ctx.error(errors::ADMIN_DISABLED);
    }
    let sub = String::from_utf8_lossy(req.arg(1)).to_ascii_uppercase();
    if sub == "AUTH" {
        if req.argc() != 3 {
            return ctx.error(&errors::wrong_arity("proxy|auth"));
        }
        return match &proxy.config.admin.password {
            Some(p) if p.as_bytes() == req.arg(2) => {
                ctx.client.admin = true;
                ctx.reply(|w| w.ok())
            }
            Some(_) => ctx.error(errors::ADMIN_WRONGPASS),
            None => ctx.error(errors::ADMIN_NO_PASSWORD),
        };
    }
    if proxy.config.admin.password.is_some() && !ctx.client.admin {
        return ctx.error(errors::ADMIN_NOPERM);
    }
    let argc = req.argc();
    let arity_err =
        |ctx: &mut Ctx, s: &str| ctx.error(&errors::wrong_arity(&format!("proxy|{}", s.to_ascii_lowercase())));
    match sub.as_str() {
        "INFO" => {
            let text = views::proxy_info(proxy);
            ctx.reply(|w| w.verbatim(text.as_bytes()))
        }
        "NODES" => {
            let text = views::proxy_nodes(proxy);
            ctx.reply(|w| w.verbatim(text.as_bytes()))
        }
        "CONFIG" if argc >= 3 => {
            let op = String::from_utf8_lossy(req.arg(2)).to_ascii_uppercase();
            match op.as_str() {
                "GET" if argc == 4 => {
                    let pat = req.arg(3).to_vec();
                    let pairs: Vec<(String, String)> = config::config_pairs(proxy).into_iter().filter(|(k, _)| crate::glob::matches(&pat, k.as_bytes(), false)).collect();
                    ctx.reply(|w| {
                        w.map(pairs.len());
                        for (k, v) in &pairs {
                            w.bulk(k.as_bytes());
                            w.bulk(v.as_bytes());
                        }
                    })
                }
                "SET" if argc == 5 => match config::config_set(proxy, req.arg(3), req.arg(4)) {
                    Ok(()) => ctx.reply(|w| w.ok()),
                    Err(e) => ctx.error(&e),
                },
                "RELOAD" if argc == 3 => match crate::reload::from_file(proxy) {
                    Ok(r) => ctx.reply(|w| {
                        w.map(2);
                        for (k, keys) in [("applied", &r.applied), ("needs_restart", &r.restart)] {
                            w.bulk(k.as_bytes());
                            w.array(keys.len());
                            for key in keys.iter() {
                                w.bulk(key.as_bytes());
                            }
                        }
                    }),
                    Err(e) => ctx.error(&errors::config_rejected(&e)),
                },
                "GET" | "SET" | "RELOAD" => arity_err(ctx, &format!("config|{op}")),
                _ => ctx.error(&errors::unknown_subcommand(&format!("CONFIG {op}"), "PROXY")),
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
                            _ => return ctx.error(errors::COUNT_AT_LEAST_MINUS_ONE),
                        },
                        _ => return arity_err(ctx, "slowlog|get"),
                    };
                    views::slowlog_reply(proxy, ctx, n)
                }
                _ => ctx.error(&errors::unknown_subcommand(&format!("SLOWLOG {op}"), "PROXY")),
            }
        }
        "BIGKEYS" => {
            let n = match req.argc() {
                2 => 10,
                3 => match crate::protocol::request::parse_i64(req.arg(2)) {
                    Some(n) if n > 0 => n as usize,
                    _ => return ctx.error(errors::COUNT_POSITIVE),
                },
                _ => return arity_err(ctx, "bigkeys"),
            };
            views::bigkeys_reply(proxy, ctx, n)
        }
        "HELP" => ctx.reply(|w| {
            let lines = [
                "PROXY <subcommand> [<arg> ...]. Subcommands are:",
                "INFO -- heatshield's version, uptime, configuration file, backend, connections, slot-map epoch.",
                "NODES -- the topology as heatshield sees it: nodes, roles, slots, connections, in-flight requests.",
                "CONFIG GET <pattern> -- settings whose name matches the glob pattern.",
                "CONFIG SET <name> <value> -- change a live setting (admin.slowlog_slower_than_us, admin.slowlog_max_len, admin.bigkey_bytes, server.allow_flush, server.max_clients).",
                "CONFIG RELOAD -- reload the configuration file, as SIGHUP: what changed is applied or reported as needing a restart.",
                "SLOWLOG GET [<count>] | LEN | RESET -- commands slower than admin.slowlog_slower_than_us.",
                "BIGKEYS [<count>] -- the largest requests and replies seen, by key.",
                "AUTH <password> -- unlock PROXY commands when admin.password is set.",
                "RATELIMIT LIST | SET <name> <pattern> <rate> <burst> [per-key|shared] [reads|writes|all|CMD,CMD...] [count-cached] | DEL <name> -- per-key rate-limit rules.",
                "COLOCATE LIST | SET <name> <tag> <pattern> [<pattern> ...] | DEL <name> -- key colocation rules: keys matching a pattern get the hash tag (plain text, $1 for what the first * matched).",
                "HOTKEYS [COUNT <n>] -- keys read hot enough to cache: estimated reads/s, and whether a reply is cached.",
                "CACHE STATS | FLUSH -- hot-key cache counters, or drop every cached reply.",
                "MIGRATION STATUS | DUAL-WRITE | OFF | BACKFILL [RESTART] [RATE <keys/s>] | VERIFY -- the move to the [migration] target: its phase, dual-write's copies, a backfill or verify run here and its progress.",
                "FLEET -- the fleet: members, their versions and digests of colocation rules, users and rate rules, what differs, this instance's part of each rule.",
            ];
            w.lines(&lines);
        }),
        "RATELIMIT" if argc >= 3 => ratelimit::ratelimit_command(proxy, ctx, req),
        "FLEET" if argc == 2 => fleet::fleet_command(proxy, ctx),
        "MIGRATION" if argc >= 3 => migration::migration_command(proxy, ctx, req),
        "COLOCATE" if argc >= 3 => colocate::colocate_command(proxy, ctx, req),
        "HOTKEYS" => {
            let n = match argc {
                2 => 10,
                4 if req.arg(2).eq_ignore_ascii_case(b"COUNT") => match crate::protocol::request::parse_i64(req.arg(3)) {
                    Some(n) if n > 0 => n as usize,
                    _ => return ctx.error(errors::COUNT_POSITIVE),
                },
                4 => return ctx.error(errors::SYNTAX),
                _ => return arity_err(ctx, "hotkeys"),
            };
            let keys = proxy.cache.hot_keys(n);
            ctx.reply(|w| {
                w.array(keys.len());
                for (k, rate, cached) in &keys {
                    w.map(3);
                    w.bulk(b"key");
                    w.bulk(proxy.colocate.client_key(k));
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
                    let pairs = views::cache_stats(proxy);
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
                _ => ctx.error(&errors::unknown_subcommand(&format!("CACHE {op}"), "PROXY")),
            }
        }
        "CONFIG" | "SLOWLOG" | "RATELIMIT" | "COLOCATE" | "CACHE" | "MIGRATION" => arity_err(ctx, &sub),
        _ => ctx.error(&errors::unknown_subcommand(&String::from_utf8_lossy(req.arg(1)), "PROXY")),
    }
}
