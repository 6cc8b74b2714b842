//! `PROXY MIGRATION STATUS | SHADOW | DUAL-WRITE | OFF | CUTOVER | ROLLBACK | FINISH |
//! BACKFILL [RESTART] [RATE n] | VERIFY`:
//! the move to another cluster as this instance runs it (docs/migration.md): the target,
//! the phase, what dual-write's copies did, and a backfill or verify run here.

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
            let mut fields: Vec<(&str, String)> =
                vec![("target", m.target.join(",")), ("phase", proxy.migration.phase().into())];
            fields.extend(proxy.migration.status());
            ctx.reply(|w| {
                w.map(fields.len());
                for (k, v) in &fields {
                    w.bulk(k.as_bytes());
                    w.bulk(v.as_bytes());
                }
            })
        }
        ("SHADOW" | "DUAL-WRITE" | "OFF", 3) => match proxy.migration.switch_to(match op.as_str() {
            "SHADOW" => "shadow",
            "DUAL-WRITE" => "dual-write",
            _ => "off",
        }) {
            Ok(()) => {
                tracing::info!(phase = %op.to_ascii_lowercase(), "migration phase changed");
                ctx.reply(|w| w.ok())
            }
            Err(e) => ctx.error(e),
        },
        ("CUTOVER" | "ROLLBACK", 3) => match proxy.migration.start_cut(op == "CUTOVER") {
            Ok(()) => ctx.reply(|w| w.ok()),
            Err(e) => ctx.error(&e),
        },
        ("FINISH", 3) => match proxy.migration.start_finish() {
            Ok(()) => ctx.reply(|w| w.ok()),
            Err(e) => ctx.error(&e),
        },
        ("BACKFILL", n) => {
            let (mut restart, mut rate) = (false, 0u64);
            let mut i = 3;
            while i < n {
                match req.arg(i).to_ascii_uppercase().as_slice() {
                    b"RESTART" => restart = true,
                    b"RATE" if i + 1 < n => {
                        let Some(r) = crate::protocol::request::parse_i64(req.arg(i + 1)).filter(|&r| r >= 0) else {
                            return ctx.error(errors::SYNTAX);
                        };
                        rate = r as u64;
                        i += 1;
                    }
                    _ => return ctx.error(errors::SYNTAX),
                }
                i += 1;
            }
            match proxy.migration.start_backfill(restart, rate) {
                Ok(()) => ctx.reply(|w| w.ok()),
                Err(e) => ctx.error(&e),
            }
        }
        ("VERIFY", 3) => {
            let m = &proxy.config.migration;
            let v = crate::services::migration::dual::VerifyOptions {
                ttl_tolerance: std::time::Duration::from_millis(m.ttl_tolerance_ms),
                rechecks: m.verify_rechecks,
                recheck_delay: std::time::Duration::from_millis(m.verify_recheck_delay_ms),
            };
            match proxy.migration.start_verify(v) {
                Ok(()) => ctx.reply(|w| w.ok()),
                Err(e) => ctx.error(&e),
            }
        }
        ("STATUS" | "SHADOW" | "DUAL-WRITE" | "OFF" | "VERIFY" | "CUTOVER" | "ROLLBACK" | "FINISH", _) => {
            ctx.error(&errors::wrong_arity(&format!("proxy|migration|{}", op.to_ascii_lowercase())))
        }
        _ => ctx.error(&errors::unknown_subcommand(&format!("MIGRATION {op}"), "PROXY")),
    }
}
