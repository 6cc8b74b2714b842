//! Dispatch: the first step of every request. Looks the command up, applies the
//! connection's gates (authentication, the connection's [`Mode`]: after MULTI commands
//! are queued by [`crate::transaction`]; forms heatshield does not serve), and hands the
//! request on: answered here by heatshield (`local`, `admin`), or admitted
//! ([`crate::policy`]) and routed to Redis ([`crate::route`]).

use std::sync::atomic::Ordering;

use crate::client::Mode;
use crate::command::{Local, Route};
use crate::errors;
use crate::local;
use crate::pending::{Ctx, Outcome};
use crate::policy;
use crate::protocol::Proto;
use crate::proxy::Proxy;
use crate::subscribe;
use crate::transaction;

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
            return transaction::refuse(ctx, e.message());
        }
    };
    ctx.cmd = cmd.id;
    if !ctx.client.authed && !matches!(cmd.route, Route::Local(l) if l.auth_free()) {
        return transaction::refuse(ctx, errors::NOAUTH);
    }
    // a RESP2 connection with subscriptions takes only the subscription commands
    if ctx.client.subs.is_some() && ctx.client.proto == Proto::Resp2 && !subscribe::allowed_while_subscribed(cmd) {
        return ctx.error(&subscribe::not_allowed(cmd));
    }
    // the connection's mode
    let queuing = matches!(ctx.client.mode, Mode::Multi(_));
    match (queuing, cmd.route) {
        (_, Route::Transaction(t)) => return transaction::run(proxy, ctx, cmd, t),
        (false, _) => {}
        // RESET leaves the transaction (local::run) and QUIT ends the connection: both run
        // at once, as in Redis
        (true, Route::Local(Local::Reset | Local::Quit)) => {}
        (true, _) => return transaction::queue(proxy, ctx, cmd),
    }
    match cmd.route {
        Route::Local(l) => local::run(proxy, ctx, l, req),
        Route::Unsupported(why) => {
            let name = if cmd.name.contains('|') { cmd.name.replace('|', " ") } else { cmd.name.clone() };
            ctx.error(&errors::unsupported(&name, why))
        }
        Route::Forward
            if matches!(cmd.name.as_str(), "XREAD" | "XREADGROUP")
                && req.args().any(|a| a.eq_ignore_ascii_case(b"BLOCK")) =>
        {
            policy::admit(proxy, ctx, cmd, Route::Block)
        }
        Route::Transaction(t) => transaction::run(proxy, ctx, cmd, t),
        Route::Subscribe(kind, sub) => subscribe::run(proxy, ctx, kind, sub),
        Route::Forward if matches!(cmd.name.as_str(), "PUBLISH" | "SPUBLISH") => {
            subscribe::publish(proxy, ctx, cmd.name == "SPUBLISH")
        }
        route => {
            proxy.scripts.note(&cmd.name, req);
            policy::admit(proxy, ctx, cmd, route)
        }
    }
}
