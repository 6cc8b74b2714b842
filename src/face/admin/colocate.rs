//! `PROXY COLOCATE LIST | SET | DEL`: the key colocation rules, changed while heatshield
//! runs (docs/colocation.md).

use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::protocol::Request;
use crate::proxy::Proxy;
use crate::services::colocate::{RuleConfig, compile};

/// `PROXY COLOCATE LIST | SET <name> <tag> <pattern> [<pattern> ...] | DEL <name>`
pub(super) fn colocate_command(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    let op = String::from_utf8_lossy(req.arg(2)).to_ascii_uppercase();
    let text = |i: usize| String::from_utf8_lossy(req.arg(i)).into_owned();
    let specs = || -> Vec<RuleConfig> { proxy.colocate.rules().list.iter().map(|r| r.spec.clone()).collect() };
    match op.as_str() {
        "LIST" if req.argc() == 3 => {
            let rules = specs();
            ctx.reply(|w| {
                w.array(rules.len());
                for r in &rules {
                    w.map(3);
                    w.bulk(b"name");
                    w.bulk(r.name.as_bytes());
                    w.bulk(b"tag");
                    w.bulk(r.tag.as_bytes());
                    w.bulk(b"keys");
                    w.array(r.keys.len());
                    for k in &r.keys {
                        w.bulk(k.as_bytes());
                    }
                }
            })
        }
        "SET" if req.argc() >= 6 => {
            let new = RuleConfig { name: text(3), tag: text(4), keys: (5..req.argc()).map(text).collect() };
            let mut all = specs();
            match all.iter_mut().find(|s| s.name == new.name) {
                Some(s) => *s = new,
                None => all.push(new),
            }
            match compile(&all) {
                Ok(rules) => {
                    proxy.colocate.replace(rules);
                    ctx.reply(|w| w.ok())
                }
                Err(p) => ctx.error(&errors::invalid_rule(&p)),
            }
        }
        "DEL" if req.argc() == 4 => {
            let name = text(3);
            let all = specs();
            let kept: Vec<RuleConfig> = all.iter().filter(|s| s.name != name).cloned().collect();
            if kept.len() == all.len() {
                return ctx.reply(|w| w.int(0));
            }
            match compile(&kept) {
                Ok(rules) => {
                    proxy.colocate.replace(rules);
                    ctx.reply(|w| w.int(1))
                }
                Err(p) => ctx.error(&errors::invalid_rule(&p)),
            }
        }
        "LIST" | "SET" | "DEL" => {
            ctx.error(&errors::wrong_arity(&format!("proxy|colocate|{}", op.to_ascii_lowercase())))
        }
        _ => ctx.error(&errors::unknown_subcommand(&format!("COLOCATE {op}"), "PROXY")),
    }
}
