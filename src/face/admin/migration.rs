//! `PROXY MIGRATION STATUS | DUAL-WRITE | OFF`: the move to another cluster as this
//! instance runs it (docs/migration.md): the target, the phase, and what dual-write's
//! copies did.

use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::protocol::Request;
use crate::proxy::Proxy;

/// `PROXY MIGRATION <op>`
pub(super) fn migration_command(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    let op = String::from_utf8_lossy(req.arg(2)).to_ascii_uppercase();
    match (op.as_str(), req.argc()) {
        ("STATUS", 3) => {
            let m = &proxy.config.migration;
            let mut fields: Vec<(&str, String)> = vec![
                ("target", m.target.join(",")),
                ("phase", if proxy.migration.on() { "dual-write" } else { "off" }.into()),
            ];
            fields.extend(proxy.migration.status());
            ctx.reply(|w| {
                w.map(fields.len());
                for (k, v) in &fields {
                    w.bulk(k.as_bytes());
                    w.bulk(v.as_bytes());
                }
            })
        }
        ("DUAL-WRITE" | "OFF", 3) => match proxy.migration.set(op == "DUAL-WRITE") {
            Ok(()) => {
                tracing::info!(phase = %op.to_ascii_lowercase(), "migration phase changed");
                ctx.reply(|w| w.ok())
            }
            Err(e) => ctx.error(e),
        },
        ("STATUS" | "DUAL-WRITE" | "OFF", _) => {
            ctx.error(&errors::wrong_arity(&format!("proxy|migration|{}", op.to_ascii_lowercase())))
        }
        _ => ctx.error(&errors::unknown_subcommand(&format!("MIGRATION {op}"), "PROXY")),
    }
}
