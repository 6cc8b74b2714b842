//! Dispatch: the first step of every request. Looks the command up, applies the
//! connection's gates (authentication, the connection's [`Mode`], forms heatshield does
//! not serve), and hands the request on: answered here by heatshield (`local`, `admin`),
//! or admitted ([`crate::policy`]) and routed to Redis ([`crate::route`]).

use std::sync::atomic::Ordering;

use crate::client::Mode;
use crate::command::Route;
use crate::errors;
use crate::local;
use crate::pending::{Ctx, Outcome};
use crate::policy;
use crate::proxy::Proxy;

/// Handles one request.
pub fn dispatch(proxy: &Proxy, ctx: &mut Ctx) -> Outcome {
    let req = ctx.req;
    proxy.stats.commands.fetch_add(1, Ordering::Relaxed);
    ctx.cmd = proxy.unknown_id();
    let cmd = match proxy.commands.lookup(req) {
        Ok(c) => c,
        Err(e) => {
            // a known command used wrongly still counts as that command
            if let Some(c) = proxy.commands.get(req.arg(0)) {
                ctx.cmd = c.id;
            }
            return ctx.error(e.message());
        }
    };
    ctx.cmd = cmd.id;
    if !ctx.client.authed && !matches!(cmd.route, Route::Local(l) if l.auth_free()) {
        return ctx.error(errors::NOAUTH);
    }
    match (ctx.client.mode, cmd.name.as_str()) {
        (Mode::Normal, "MULTI") => ctx.client.mode = Mode::RefusedMulti, // and refused below
        (Mode::Normal, _) => {}
        (Mode::RefusedMulti, "MULTI") => return ctx.error(errors::NESTED_MULTI),
        (Mode::RefusedMulti, "EXEC") => {
            ctx.client.mode = Mode::Normal;
            return ctx.error(errors::EXECABORT);
        }
        (Mode::RefusedMulti, "DISCARD") => {
            ctx.client.mode = Mode::Normal;
            return ctx.reply(|w| w.ok());
        }
        (Mode::RefusedMulti, "RESET") => {} // leaves every mode (local::run)
        (Mode::RefusedMulti, _) => return ctx.error(errors::AFTER_REFUSED_MULTI),
    }
    match cmd.route {
        Route::Local(l) => local::run(proxy, ctx, l, req),
        Route::Unsupported(why) => {
            let name = if cmd.name.contains('|') { cmd.name.replace('|', " ") } else { cmd.name.clone() };
            ctx.error(&errors::unsupported(&name, why))
        }
        _ if matches!(cmd.name.as_str(), "XREAD" | "XREADGROUP")
            && req.args().any(|a| a.eq_ignore_ascii_case(b"BLOCK")) =>
        {
            ctx.error(&errors::blocking_unsupported(&cmd.name))
        }
        route => policy::admit(proxy, ctx, cmd, route),
    }
}
