//! `PROXY RATELIMIT LIST | SET | DEL`: the rate-limit rules, changed while heatshield runs.

use std::sync::atomic::Ordering;

use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::protocol::Request;
use crate::proxy::Proxy;

/// `PROXY RATELIMIT LIST | SET ... | DEL name`
pub(super) fn ratelimit_command(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    use crate::services::ratelimit::{CommandsSpec, RuleConfig, compile};
    let op = String::from_utf8_lossy(req.arg(2)).to_ascii_uppercase();
    let text = |i: usize| String::from_utf8_lossy(req.arg(i)).into_owned();
    match op.as_str() {
        "LIST" if req.argc() == 3 => {
            let rules = proxy.ratelimit.rules();
            let fleet = proxy.fleet.view();
            let leases = proxy.ratelimit.leases_by_rule();
            ctx.reply(|w| {
                w.array(rules.len());
                for r in rules.iter() {
                    let s = &r.spec;
                    let commands = match &s.commands {
                        CommandsSpec::Kind(k) => k.clone(),
                        CommandsSpec::List(l) => l.join(","),
                    };
                    w.map(14);
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
                    fleet_part(w, r, &fleet, &leases, "fleet_members");
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
                return ctx.error(errors::RATE_AND_BURST);
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
                Err(p) => ctx.error(&errors::invalid_rule(&p)),
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
                Err(p) => ctx.error(&errors::err(&p.join("; "))),
            }
        }
        "LIST" | "SET" | "DEL" => {
            ctx.error(&errors::wrong_arity(&format!("proxy|ratelimit|{}", op.to_ascii_lowercase())))
        }
        _ => ctx.error(&errors::unknown_subcommand(&format!("RATELIMIT {op}"), "PROXY")),
    }
}

/// A rule's part in the fleet (docs/fleet.md), five fields of a map: members with the rule
/// (under `members_field`), this instance's share, the fleet's demand and this instance's
/// (requests/s at the last sync), keys divided by demand.
pub(super) fn fleet_part(
    w: &mut crate::protocol::Writer,
    r: &crate::services::ratelimit::Rule,
    fleet: &crate::services::fleet::View,
    leases: &std::collections::HashMap<String, usize>,
    members_field: &str,
) {
    let name = &r.spec.name;
    let (fleet_demand, own_demand, members) = fleet.rules.get(name).copied().unwrap_or((0.0, 0.0, fleet.members));
    w.bulk(members_field.as_bytes());
    w.int(members as i64);
    w.bulk(b"share");
    w.bulk(format!("{:.4}", r.share()).as_bytes());
    w.bulk(b"fleet_demand");
    w.bulk(format!("{fleet_demand:.1}").as_bytes());
    w.bulk(b"demand");
    w.bulk(format!("{own_demand:.1}").as_bytes());
    w.bulk(b"watched_keys");
    w.int(leases.get(name).copied().unwrap_or(0) as i64);
}
