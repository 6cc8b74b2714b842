//! Dispatch: the first step of every request. Looks the command up, applies the
//! connection's gates (authentication, the connection's [`Mode`]: after MULTI commands
//! are queued by [`crate::modes::transaction`]; forms heatshield does not serve), and hands the
//! request on: answered here by heatshield (`local`, `admin`), or admitted
//! ([`crate::path::policy`]) and routed to Redis ([`crate::path::route`]).

use crate::command::{Command, FanOut, Local, Route, TxCmd, keys_of, traits};
use crate::conn::Mode;
use crate::conn::order;
use crate::errors;
use crate::face::local;
use crate::modes::subscribe;
use crate::modes::transaction;
use crate::path::pending::{Ctx, Outcome};
use crate::path::policy;
use crate::proxy::Proxy;

/// Handles one request (inlined into the session's one call: it was before the
/// ordering rule made it larger, and a call here cost about 40 instructions a request).
#[inline(always)]
pub fn dispatch(proxy: &Proxy, ctx: &mut Ctx) -> Outcome {
    let req = ctx.req;
    let looked = proxy.commands.lookup(req);
    // the ordering rule, before anything about the request happens (crate::conn::order)
    if let Ok(cmd) = looked {
        let mut lane = order::lane(ctx.client, cmd, req);
        // PING while a script runs asks the busy masters on connections of its own
        if !cmd.shared_lane && cmd.route == Route::Local(Local::Ping) && local::scripts_running(proxy) {
            lane = order::Lane::Own;
        }
        // a read replicas may answer: on the replicas' lane, unless the client's requests
        // in flight are on the shared one (after a write, say: it reads from the master)
        if proxy.reads.active()
            && lane == order::Lane::shared(ctx.client.proto)
            && crate::services::reads::Reads::eligible(cmd)
            && !(ctx.client.inflight > 0 && ctx.client.lane == lane)
        {
            lane = order::Lane::Replica;
        }
        // the slot map changed since the requests in flight were routed: a request for
        // the same slot could go to another node, on another connection
        let map = proxy.cluster.version();
        let c = &mut ctx.client;
        if c.inflight == 0 {
            c.map_version = map;
        } else if order::must_wait(c.inflight, c.lane, lane) || (map != c.map_version && lane != order::Lane::Local) {
            return Outcome::Later;
        }
        ctx.lane = lane;
    }
    proxy.stats.commands.add(1);
    ctx.cmd = proxy.unknown_id();
    let cmd = match looked {
        Ok(c) => c,
        Err(e) => {
            // a known command used wrongly still counts as that command
            if let Some(c) = proxy.commands.get(req.arg(0)) {
                ctx.cmd = c.id;
                if c.route == Route::Transaction(TxCmd::Exec) {
                    return transaction::exec_refused(ctx, e.message());
                }
            }
            return transaction::refuse(ctx, e.message());
        }
    };
    ctx.cmd = cmd.id;
    ctx.writes = !cmd.is_read();
    // (Redis turns a refused EXEC into EXECABORT, and discards the transaction)
    if !ctx.client.authed && !matches!(cmd.route, Route::Local(l) if l.auth_free()) {
        if cmd.route == Route::Transaction(TxCmd::Exec) {
            return transaction::exec_refused(ctx, &errors::exec_aborted_because(errors::NOAUTH));
        }
        return transaction::refuse(ctx, errors::NOAUTH);
    }
    // ACL: only once some user may not do everything (one relaxed load otherwise)
    if proxy.users.restricted()
        && let Some(denied) = acl_denied(proxy, ctx, cmd)
    {
        use crate::services::acl::Denied;
        let text = match denied {
            Denied::Command => errors::noperm_command(&cmd.lower),
            Denied::Key => errors::NOPERM_KEY.to_string(),
            Denied::Channel => errors::NOPERM_CHANNEL.to_string(),
        };
        crate::metrics::acl_denied(&ctx.client.user.name, denied.reason());
        if cmd.route == Route::Transaction(TxCmd::Exec) && matches!(ctx.client.modes.multi, Mode::Multi(_)) {
            return transaction::exec_refused(ctx, &errors::exec_aborted_because(&text));
        }
        return transaction::refuse(ctx, &text);
    }
    // a RESP2 connection with subscriptions takes only the subscription commands
    if ctx.client.subscribed_resp2() && !subscribe::allowed_while_subscribed(cmd) {
        let text = subscribe::not_allowed(cmd);
        if cmd.route == Route::Transaction(TxCmd::Exec) {
            // (Redis words this one without its ERR code)
            let why = text.strip_prefix("ERR ").unwrap_or(&text);
            return transaction::exec_refused(ctx, &errors::exec_aborted_because(why));
        }
        return transaction::refuse(ctx, &text);
    }
    // an instance whose colocation rules differ from its fleet's serves no key the two
    // would store under different names, nor, while the fleet switches its rules, a key
    // the old and the new name differently (docs/fleet.md)
    if proxy.fleet.refusing()
        && let Some((key, switching)) = stored_otherwise(proxy, ctx, cmd)
    {
        let e = if switching { errors::fleet_switching(&key) } else { errors::fleet_names_differ(&key) };
        return transaction::refuse(ctx, &e);
    }
    if proxy.client_side.active() {
        track(proxy, ctx, cmd);
    }
    // the connection's mode
    let queuing = matches!(ctx.client.modes.multi, Mode::Multi(_));
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
        Route::Forward if cmd.blocks_with(req) => policy::admit(proxy, ctx, cmd, Route::Block),
        Route::Transaction(t) => transaction::run(proxy, ctx, cmd, t),
        Route::Subscribe(kind, sub) => subscribe::run(proxy, ctx, kind, sub),
        Route::Forward if cmd.has(traits::PUBLISH) => subscribe::publish(proxy, ctx, cmd.has(traits::SHARD)),
        route => {
            // only scripts and SCRIPT / FUNCTION subcommands sent to every master are noted:
            // two comparisons, not one per name, for every other command
            if cmd.keys.is_script() || route == Route::FanOut(FanOut::AllSame) {
                proxy.scripts.note(&cmd.name, req);
            }
            policy::admit(proxy, ctx, cmd, route)
        }
    }
}

/// Whether the client's user may run `cmd` with these keys and channels (the first
/// refusal, as Redis finds it: crate::services::acl::Perms::check); a refusal is
/// logged (`ACL LOG`). Runs only while some user is restricted. Most requests of a
/// restricted user are decided by the quick look, inlined here; a refusal, and
/// anything the look cannot decide, by the whole check, out of line.
#[inline(always)]
fn acl_denied(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command) -> Option<crate::services::acl::Denied> {
    let client = &mut *ctx.client;
    let perms = client.user.perms_cached(&mut client.perms_seen);
    if perms.unrestricted() || perms.allows_quickly(cmd, ctx.asked, proxy.colocate.active()) {
        return None;
    }
    acl_checked(proxy, ctx, cmd)
}

/// [`acl_denied`] past the quick look: the whole check.
#[inline(never)]
fn acl_checked(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command) -> Option<crate::services::acl::Denied> {
    let client = &mut *ctx.client;
    let perms = client.user.perms_cached(&mut client.perms_seen);
    // key patterns are written for the client's names (crate::services::colocate): the
    // request as the client sent it, and a stored name it sent itself (it starts with its
    // tag) taken back to the name it stores
    let restored = match proxy.colocate.active() && ctx.asked.args().skip(1).any(|a| a.first() == Some(&b'{')) {
        true => proxy.colocate.restore_request(cmd, ctx.asked),
        false => None,
    };
    let req = restored.as_ref().unwrap_or(ctx.asked);
    let denial = perms.check(cmd, req).err()?;
    let object = match denial.why {
        crate::services::acl::Denied::Command => cmd.lower.as_bytes(),
        _ => req.arg(denial.arg),
    };
    let context = if matches!(client.modes.multi, Mode::Multi(_)) { "multi" } else { "toplevel" };
    let line = crate::face::client::line(proxy, &client.info);
    proxy.users.log.add(denial.why.reason(), context, object, &client.user.name, line);
    Some(denial.why)
}

/// The first key of the request (as the client sent it) that this instance's colocation
/// rules store under another name than the fleet's, or than its next rules while it is
/// closing for them (then `true`).
#[cold]
fn stored_otherwise(proxy: &Proxy, ctx: &Ctx, cmd: &Command) -> Option<(Vec<u8>, bool)> {
    let mine = proxy.colocate.rules();
    let next = if proxy.fleet.closing() { proxy.colocate.next() } else { None };
    let differ = proxy.fleet.names_differ();
    let keys = crate::command::keys_of(cmd, ctx.asked).ok()?;
    keys.iter().map(|&k| ctx.asked.arg(k as usize)).find_map(|k| {
        if differ && proxy.fleet.stored_otherwise(&mine, k) {
            return Some((k.to_vec(), false));
        }
        next.as_ref().filter(|n| n.stored_name(k) != mine.stored_name(k)).map(|_| (k.to_vec(), true))
    })
}

/// While some client tracks keys (CLIENT TRACKING): a tracking client's read registers
/// its keys before it is sent, so no change after it goes untold; its write is marked so
/// it hears of the write's keys right after the reply. CLIENT CACHING applies to the next
/// command only.
fn track(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command) {
    let id = ctx.client.id;
    if let Some(t) = ctx.client.modes.tracking.as_deref_mut() {
        if t.mode.noloop
            && cmd.is_write()
            && let Ok(keys) = keys_of(cmd, ctx.req)
        {
            let keys: Vec<&[u8]> = keys.iter().map(|&k| ctx.req.arg(k as usize)).collect();
            proxy.client_side.forget(&keys, id);
        }
        if cmd.is_read()
            && t.tracks_reads()
            && let Ok(keys) = keys_of(cmd, ctx.req)
            && !keys.is_empty()
        {
            proxy.client_side.read(id, keys.iter().map(|&k| ctx.req.arg(k as usize)));
        }
        // (as Redis: any CLIENT subcommand, and the commands of a transaction, keep it)
        if !cmd.name.starts_with("CLIENT|") && !matches!(ctx.client.modes.multi, Mode::Multi(_)) {
            t.caching = None;
        }
    }
    ctx.tracked_write =
        ctx.client.modes.tracking.is_some() && (cmd.is_write() || cmd.route == Route::Transaction(TxCmd::Exec));
}
