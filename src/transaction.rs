//! Transactions: MULTI, the commands queued after it, EXEC and DISCARD, answered as a
//! single Redis would (docs/transactions.md).
//!
//! After MULTI the connection is in [`Mode::Multi`]: each command is checked as it comes
//! (known, right arity, allowed in a transaction, its keys in the transaction's one slot,
//! within its rate limits) and answered `+QUEUED`, or refused with an error that makes
//! EXEC answer `EXECABORT`. EXEC sends `MULTI`, the queued commands and `EXEC` to the
//! slot's master as one message on the usual shared connection (a native transaction:
//! atomic there, and no connection is set aside for it); [`crate::pending`] follows a
//! migration or failover met at queue time by sending it again whole. The hot-key cache
//! drops the keys of the queued writes when EXEC is sent and again before its reply
//! reaches the client, as for the same writes sent alone.

use bytes::{BufMut, BytesMut};

use crate::client::{Mode, Queued};
use crate::cluster::slot;
use crate::command::{Command, Local, Route, Split, TxCmd, keys_of};
use crate::errors;
use crate::pending::{Ctx, Outcome, Target, start_transaction};
use crate::protocol::Request;
use crate::proxy::Proxy;

/// MULTI, EXEC or DISCARD.
pub fn run(proxy: &Proxy, ctx: &mut Ctx, t: TxCmd) -> Outcome {
    let queuing = matches!(ctx.client.mode, Mode::Multi(_));
    match (t, queuing) {
        (TxCmd::Multi, false) => {
            ctx.client.mode = Mode::Multi(Box::default());
            ctx.reply(|w| w.ok())
        }
        // Redis answers this without failing the transaction
        (TxCmd::Multi, true) => ctx.error(errors::NESTED_MULTI),
        (TxCmd::Exec, false) => ctx.error(errors::EXEC_WITHOUT_MULTI),
        (TxCmd::Discard, false) => ctx.error(errors::DISCARD_WITHOUT_MULTI),
        (TxCmd::Discard, true) => {
            ctx.client.mode = Mode::Normal;
            ctx.reply(|w| w.ok())
        }
        (TxCmd::Exec, true) => {
            let Mode::Multi(q) = std::mem::take(&mut ctx.client.mode) else { return ctx.error(errors::EXECABORT) };
            exec(proxy, ctx, *q)
        }
    }
}

/// A refusal while a transaction is being queued: the error now, EXECABORT at EXEC.
pub fn refuse(ctx: &mut Ctx, text: &str) -> Outcome {
    if let Mode::Multi(q) = &mut ctx.client.mode {
        q.failed = true;
    }
    ctx.error(text)
}

/// A command sent after MULTI: checked and queued.
pub fn queue(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command) -> Outcome {
    let req = ctx.req;
    if cmd.name == "WATCH" {
        // Redis answers this without failing the transaction
        return ctx.error(errors::WATCH_IN_MULTI);
    }
    let allowed = match cmd.route {
        Route::Forward | Route::Split(_) | Route::AnyMaster => true,
        // Redis commands heatshield answers alone; inside a transaction Redis answers them
        Route::Local(Local::Ping | Local::Echo | Local::Time) => true,
        // a blocking command inside a transaction does not block (Redis runs it at once)
        Route::Unsupported(_) => cmd.is_blocking(),
        _ => false,
    };
    if !allowed {
        let name = if cmd.name.contains('|') { cmd.name.replace('|', " ") } else { cmd.name.clone() };
        return refuse(ctx, &errors::not_in_transaction(&name));
    }
    if cmd.route == Route::Split(Split::Mset) && !(req.argc() - 1).is_multiple_of(2) {
        return refuse(ctx, &errors::wrong_arity(&cmd.lower));
    }
    let keys = match keys_of(cmd, req) {
        Ok(k) => k,
        Err(e) => return refuse(ctx, e),
    };
    let Mode::Multi(q) = &ctx.client.mode else { return ctx.error(errors::EXECABORT) };
    let mut s = q.slot;
    for &k in &keys {
        let ks = slot(req.arg(k as usize));
        match s {
            Some(t) if t != ks && proxy.cluster.is_cluster() => return refuse(ctx, errors::CROSSSLOT),
            _ => s = Some(ks),
        }
    }
    // what queuing it holds: its bytes, its parsed form, and the keys of a write
    let cost = req.raw().len()
        + std::mem::size_of::<Request>()
        + if cmd.is_write() { keys.len() * std::mem::size_of::<bytes::Bytes>() } else { 0 };
    let limit = proxy.config.limits.max_inflight_request_bytes as usize;
    if q.held + cost > limit {
        return refuse(ctx, &errors::transaction_too_large(limit));
    }
    // counted by the rate limits as if sent alone
    let keys_iter = keys.iter().map(|&k| req.arg(k as usize));
    if let Err(t) = proxy.ratelimit.check_in(&mut ctx.client.rl, cmd, keys_iter, ctx.now, false) {
        return refuse(ctx, &t.message());
    }
    ctx.first_key = keys.first().copied().unwrap_or(0);
    let Mode::Multi(q) = &mut ctx.client.mode else { return ctx.error(errors::EXECABORT) };
    if cmd.is_write() {
        q.write_keys.extend(keys.iter().map(|&k| req.arg_bytes(k as usize)));
    }
    q.slot = s;
    q.bytes += req.raw().len();
    q.held += cost;
    q.commands.push(req.clone());
    ctx.reply(|w| w.simple("QUEUED"))
}

/// EXEC: the queued commands as one native transaction on the slot's master.
fn exec(proxy: &Proxy, ctx: &mut Ctx, q: Queued) -> Outcome {
    if q.failed {
        return ctx.error(errors::EXECABORT);
    }
    if q.commands.is_empty() {
        return ctx.reply(|w| w.array(0));
    }
    let target = match q.slot {
        Some(s) => Target::Slot(s),
        None => {
            // keyless (PING, TIME, ...): the master the client's id picks
            let topo = proxy.cluster.topology();
            match topo.masters.get((ctx.client.id % topo.masters.len().max(1) as u64) as usize) {
                Some(n) => Target::Node(n.clone()),
                None => return ctx.error(errors::NO_SLOT_MAP),
            }
        }
    };
    const MULTI: &[u8] = b"*1\r\n$5\r\nMULTI\r\n";
    const EXEC: &[u8] = b"*1\r\n$4\r\nEXEC\r\n";
    let mut data = BytesMut::with_capacity(q.bytes + MULTI.len() + EXEC.len());
    data.put_slice(MULTI);
    for c in &q.commands {
        data.put_slice(c.raw());
    }
    data.put_slice(EXEC);
    // the cache plan of the writes, as for the same writes sent alone
    let cache = &proxy.cache;
    if cache.enabled && !q.write_keys.is_empty() {
        ctx.write_hot_generation = Some(cache.hot_generation());
        if cache.active() {
            for k in &q.write_keys {
                if cache.tracked(k) {
                    cache.invalidate(k, crate::cache::Cause::Write);
                    ctx.invalidate.push(k.clone());
                }
            }
        }
    }
    start_transaction(proxy, ctx, data.freeze(), q.commands.len() as u32, target, q.write_keys)
}
