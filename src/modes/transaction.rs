//! Transactions: MULTI, the commands queued after it, EXEC and DISCARD, answered as a
//! single Redis would (docs/transactions.md).
//!
//! After MULTI the connection is in [`Mode::Multi`]: each command is checked as it comes
//! (known, right arity, allowed in a transaction, its keys in the transaction's one slot,
//! within its rate limits) and answered `+QUEUED`, or refused with an error that makes
//! EXEC answer `EXECABORT`. EXEC sends `MULTI`, the queued commands and `EXEC` to the
//! slot's master as one message on the usual shared connection (a native transaction:
//! atomic there, and no connection is set aside for it); [`crate::path::pending`] follows a
//! migration or failover met at queue time by sending it again whole. The hot-key cache
//! drops the keys of the queued writes when EXEC is sent and again before its reply
//! reaches the client, as for the same writes sent alone.
//!
//! WATCH pins the client to a dedicated connection to the watched keys' master
//! ([`crate::conn::Watch`]) and runs there; commands for that slot travel on it until
//! EXEC (sent there too, then the connection goes back to the pool), DISCARD, UNWATCH,
//! RESET or disconnect (it is closed). A watch the cluster voided (the slot moved, the
//! connection broke) makes EXEC answer nil, as a changed key would.

use bytes::{BufMut, BytesMut};
use smallvec::SmallVec;

use crate::command::{Command, Local, Route, Split, TxCmd, checked_keys_of};
use crate::conn::multi::TxSplit;
use crate::conn::{Mode, Queued, Watch};
use crate::errors;
use crate::path::pending::{Ctx, Outcome, Target, TxPart, start_transaction};
use crate::protocol::Request;
use crate::proxy::Proxy;
use crate::upstream::cluster::slot;

/// MULTI, EXEC, DISCARD, WATCH or UNWATCH.
pub fn run(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command, t: TxCmd) -> Outcome {
    let queuing = matches!(ctx.client.modes.multi, Mode::Multi(_));
    match (t, queuing) {
        (TxCmd::Multi, false) => {
            // the transaction's keys share the watched keys' slot
            let slot = ctx.client.modes.watch.as_ref().map(|w| w.slot);
            ctx.client.modes.multi = Mode::Multi(Box::new(Queued { slot, ..Queued::default() }));
            ctx.reply(|w| w.ok())
        }
        // Redis answers this without failing the transaction
        (TxCmd::Watch, true) => ctx.error(errors::WATCH_IN_MULTI),
        (TxCmd::Watch, false) => watch(proxy, ctx, cmd),
        // queued, as in Redis (it changes nothing there: EXEC unwatches anyway)
        (TxCmd::Unwatch, true) => queue(proxy, ctx, cmd),
        (TxCmd::Unwatch, false) => {
            ctx.client.unwatch();
            ctx.reply(|w| w.ok())
        }
        // Redis answers this without failing the transaction
        (TxCmd::Multi, true) => ctx.error(errors::NESTED_MULTI),
        (TxCmd::Exec, false) => ctx.error(errors::EXEC_WITHOUT_MULTI),
        (TxCmd::Discard, false) => ctx.error(errors::DISCARD_WITHOUT_MULTI),
        (TxCmd::Discard, true) => {
            ctx.client.modes.multi = Mode::Normal;
            ctx.client.unwatch();
            ctx.reply(|w| w.ok())
        }
        (TxCmd::Exec, true) => {
            let Mode::Multi(q) = std::mem::take(&mut ctx.client.modes.multi) else {
                return ctx.error(errors::EXECABORT);
            };
            exec(proxy, ctx, *q)
        }
    }
}

/// EXEC refused before it runs (wrong number of arguments; `text` is the EXECABORT): as
/// Redis, the transaction (if any) is discarded and the watch dropped.
pub fn exec_refused(ctx: &mut Ctx, text: &str) -> Outcome {
    ctx.client.modes.multi = Mode::Normal;
    ctx.client.unwatch();
    ctx.error(text)
}

/// A refusal while a transaction is being queued: the error now, EXECABORT at EXEC.
pub fn refuse(ctx: &mut Ctx, text: &str) -> Outcome {
    if let Mode::Multi(q) = &mut ctx.client.modes.multi {
        q.failed = true;
    }
    ctx.error(text)
}

/// A command sent after MULTI: checked and queued.
pub fn queue(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command) -> Outcome {
    let req = ctx.req;
    if cmd.route == Route::Transaction(TxCmd::Watch) {
        // Redis answers this without failing the transaction
        return ctx.error(errors::WATCH_IN_MULTI);
    }
    let allowed = match cmd.route {
        Route::Forward | Route::Split(_) | Route::AnyMaster | Route::Transaction(TxCmd::Unwatch) => true,
        // (inside a transaction: the master's answer, unfiltered)
        Route::FanOut(crate::command::FanOut::Commands) => true,
        // Redis commands heatshield answers alone; inside a transaction Redis answers them
        Route::Local(Local::Ping | Local::Echo | Local::Time) => true,
        // a blocking command inside a transaction does not block (Redis runs it at once)
        Route::Block => true,
        _ => false,
    };
    if !allowed && cmd.flags & crate::command::flags::NO_MULTI != 0 {
        return refuse(ctx, errors::NO_MULTI);
    }
    if !allowed {
        let name = if cmd.name.contains('|') { cmd.name.replace('|', " ") } else { cmd.name.clone() };
        return refuse(ctx, &errors::not_in_transaction(&name));
    }
    if cmd.route == Route::Split(Split::Mset) && !(req.argc() - 1).is_multiple_of(2) {
        return refuse(ctx, &errors::wrong_arity(&cmd.lower));
    }
    let keys = match checked_keys_of(cmd, req) {
        Ok(k) => k,
        Err(e) => return refuse(ctx, e),
    };
    let cluster = proxy.cluster.is_cluster();
    // and the transaction's earlier keys (unless it may run per slot; never under WATCH)
    let watching = ctx.client.modes.watch.is_some();
    let per_slot = proxy.config.transactions.per_node() && !watching;
    // the command's own keys share one slot (per slot, a command Redis Cluster clients
    // split, MGET, MSET, DEL, ..., is queued as one command per slot)
    let mut cs = None;
    for &k in &keys {
        let ks = slot(req.arg(k as usize));
        match cs {
            Some(t) if t != ks && cluster => {
                return match cmd.route {
                    Route::Split(kind) if per_slot => queue_split(proxy, ctx, cmd, kind, &keys),
                    _ => refuse(ctx, errors::CROSSSLOT),
                };
            }
            _ => cs = Some(ks),
        }
    }
    let Mode::Multi(q) = &ctx.client.modes.multi else { return ctx.error(errors::EXECABORT) };
    let s = match (q.slot, cs) {
        (Some(t), Some(c)) if t != c && cluster && !per_slot => {
            return refuse(ctx, if watching { errors::CROSSSLOT } else { errors::CROSSSLOT_TX });
        }
        (None, c) => c,
        (t, _) => t,
    };
    // An EVALSHA of a script heatshield knows is queued as EVAL: a NOSCRIPT inside a
    // transaction cannot be repaired (the transaction has run when it comes back).
    let queued = match cmd.has(crate::command::traits::BY_DIGEST) {
        true => proxy.scripts.eval_form(req.raw()).and_then(|e| Request::parse(&e)),
        false => None,
    };
    let queued = queued.as_ref().unwrap_or(req);
    // what queuing it holds: its bytes, its parsed form, and the keys of a write
    let cost = queued.raw().len()
        + std::mem::size_of::<Request>()
        + std::mem::size_of::<Option<u16>>()
        + if cmd.is_write() { keys.len() * std::mem::size_of::<bytes::Bytes>() } else { 0 };
    let queued = queued.clone();
    if let Some(refused) = admit(proxy, ctx, cmd, &keys, cost) {
        return refused;
    }
    let Mode::Multi(q) = &mut ctx.client.modes.multi else { return ctx.error(errors::EXECABORT) };
    q.slot = s;
    q.slots.push(cs);
    q.bytes += queued.raw().len();
    q.commands.push(queued);
    proxy.scripts.note(&cmd.name, req);
    ctx.reply(|w| w.simple("QUEUED"))
}

/// What queuing a command (its `keys`, holding `cost` bytes) takes: room within the
/// transaction's byte bound, and the rate limits, which count it as if it were sent
/// alone; the keys of a write are noted for the hot-key cache. `Some`: the refusal.
fn admit(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command, keys: &[u32], cost: usize) -> Option<Outcome> {
    let req = ctx.req;
    let limit = proxy.limits.load().max_inflight_request_bytes as usize;
    let Mode::Multi(q) = &ctx.client.modes.multi else { return Some(ctx.error(errors::EXECABORT)) };
    if q.held + cost > limit {
        return Some(refuse(ctx, &errors::transaction_too_large(limit)));
    }
    // (the same steps, on the client's names, as a command sent alone)
    crate::path::policy::note_keys(proxy, ctx, keys);
    if let Err(t) = crate::path::policy::charge(proxy, ctx, cmd, keys, crate::path::policy::Cached::None) {
        return Some(refuse(ctx, &t.message()));
    }
    let Mode::Multi(q) = &mut ctx.client.modes.multi else { return Some(ctx.error(errors::EXECABORT)) };
    if cmd.is_write() {
        q.write_keys.extend(keys.iter().map(|&k| req.arg_bytes(k as usize)));
    }
    q.held += cost;
    None
}

/// A cross-slot MGET, MSET, DEL, UNLINK, EXISTS or TOUCH in a per-node transaction:
/// queued as one command per slot (its keys grouped by slot, in the order each slot first
/// appears), each to run in its slot's native transaction; EXEC's reply merges theirs into
/// one, in its place (crate::conn::multi::TxSplit).
fn queue_split(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command, kind: Split, keys: &[u32]) -> Outcome {
    let req = ctx.req;
    let step = if kind == Split::Mset { 2 } else { 1 };
    let mut groups: Vec<(u16, SmallVec<[u32; 4]>)> = Vec::new();
    for (n, &k) in keys.iter().enumerate() {
        let s = slot(req.arg(k as usize));
        match groups.iter_mut().find(|g| g.0 == s) {
            Some(g) => g.1.push(n as u32),
            None => groups.push((s, smallvec::smallvec![n as u32])),
        }
    }
    let parts: Vec<Request> = groups
        .iter()
        .map(|(_, ns)| {
            let mut args: Vec<&[u8]> = vec![req.arg(0)];
            for &n in ns {
                let k = keys[n as usize] as usize;
                args.extend((k..k + step).map(|i| req.arg(i)));
            }
            Request::from_args(&args)
        })
        .collect();
    let bytes: usize = parts.iter().map(|r| r.raw().len()).sum();
    let cost = bytes
        + parts.len() * (std::mem::size_of::<Request>() + std::mem::size_of::<Option<u16>>())
        + if cmd.is_write() { keys.len() * std::mem::size_of::<bytes::Bytes>() } else { 0 };
    if let Some(refused) = admit(proxy, ctx, cmd, keys, cost) {
        return refused;
    }
    let Mode::Multi(q) = &mut ctx.client.modes.multi else { return ctx.error(errors::EXECABORT) };
    if q.slot.is_none() {
        q.slot = groups.first().map(|g| g.0);
    }
    let first = q.commands.len() as u32;
    for ((s, _), r) in groups.iter().zip(parts) {
        q.slots.push(Some(*s));
        q.bytes += r.raw().len();
        q.commands.push(r);
    }
    let count = groups.len() as u32;
    let nkeys = keys.len() as u32;
    q.splits.push(TxSplit { first, count, kind, keys: groups.into_iter().map(|g| g.1).collect(), nkeys });
    ctx.reply(|w| w.simple("QUEUED"))
}

/// WATCH: its keys share one slot (the slot of any keys watched already); the first
/// WATCH leases a dedicated connection to that slot's master and pins the client to it.
fn watch(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command) -> Outcome {
    let req = ctx.req;
    let keys = match checked_keys_of(cmd, req) {
        Ok(k) => k,
        Err(e) => return ctx.error(e),
    };
    let s = slot(req.arg(keys[0] as usize));
    let cluster = proxy.cluster.is_cluster();
    if cluster && keys.iter().any(|&k| slot(req.arg(k as usize)) != s) {
        return ctx.error(errors::CROSSSLOT);
    }
    match &ctx.client.modes.watch {
        Some(w) if cluster && w.slot != s => return ctx.error(errors::CROSSSLOT),
        // void already: EXEC will answer nil whatever is watched now
        Some(w) if w.void() => return ctx.reply(|w| w.ok()),
        Some(_) => {}
        None => {
            let Some(node) = proxy.cluster.topology().master_for_slot(s).cloned() else {
                return ctx.error(&errors::slot_not_served(s));
            };
            let Some(lease) = node.lease(ctx.client.proto) else {
                return ctx.error(&errors::no_dedicated(&node.addr, node.options().dedicated_max));
            };
            ctx.client.modes.watch = Some(Box::new(Watch { slot: s, lease: Some(lease), voided: false }));
        }
    }
    // on the pinned connection (crate::path::pending::start_in)
    crate::path::route::to_slot(proxy, ctx, s)
}

/// EXEC: the queued commands as one native transaction on the slot's master (under
/// WATCH: on the pinned connection).
fn exec(proxy: &Proxy, ctx: &mut Ctx, q: Queued) -> Outcome {
    let watch = ctx.client.modes.watch.take();
    if q.failed {
        // Redis unwatches here too
        if let Some(l) = watch.and_then(|w| w.lease) {
            l.release(true);
        }
        return ctx.error(errors::EXECABORT);
    }
    let pinned = match watch {
        Some(w) if w.void() => return ctx.reply(|w| w.nil_array()),
        Some(w) => w.lease,
        None => None,
    };
    if q.commands.is_empty() && pinned.is_none() {
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
    let total = q.commands.len() as u32;
    let parts = match per_slot(&q) {
        // one native transaction per slot (`transactions.cross_slot = "per-node"`)
        Some(groups) => groups
            .into_iter()
            .map(|(s, positions)| {
                let cmds = positions.iter().map(|&i| &q.commands[i as usize]);
                let data = native(cmds, q.bytes);
                TxPart { data, queued: positions.len() as u32, target: Target::Slot(s), positions }
            })
            .collect(),
        None => {
            let data = native(q.commands.iter(), q.bytes);
            vec![TxPart { data, queued: total, target, positions: Vec::new() }]
        }
    };
    // the cache plan of the writes, as for the same writes sent alone
    let cache = &proxy.cache;
    if (cache.enabled || proxy.migration.on()) && !q.write_keys.is_empty() {
        ctx.write_hot_generation = Some(cache.hot_generation());
        if cache.active() {
            for k in &q.write_keys {
                if cache.tracked(k) {
                    cache.invalidate(k, crate::services::cache::Cause::Write);
                    ctx.invalidate.push(k.clone());
                }
            }
        }
    }
    start_transaction(proxy, ctx, parts, total, q.write_keys, q.splits, pinned)
}

/// `MULTI`, the commands, `EXEC`, as one message.
fn native<'a>(cmds: impl Iterator<Item = &'a Request>, bytes: usize) -> bytes::Bytes {
    const MULTI: &[u8] = b"*1\r\n$5\r\nMULTI\r\n";
    const EXEC: &[u8] = b"*1\r\n$4\r\nEXEC\r\n";
    let mut data = BytesMut::with_capacity(bytes + MULTI.len() + EXEC.len());
    data.put_slice(MULTI);
    for c in cmds {
        data.put_slice(c.raw());
    }
    data.put_slice(EXEC);
    data.freeze()
}

/// A transaction whose commands span slots (only queued so under `cross_slot =
/// "per-node"`): its commands grouped by slot, in the order each slot first appears, each
/// with the positions of its commands; keyless commands join the first group. `None`
/// when one slot holds every key.
fn per_slot(q: &Queued) -> Option<Vec<(u16, Vec<u32>)>> {
    let first = q.slot?;
    if q.slots.iter().all(|s| s.is_none_or(|s| s == first)) {
        return None;
    }
    let mut groups: Vec<(u16, Vec<u32>)> = Vec::new();
    let mut at: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
    for (i, s) in q.slots.iter().enumerate() {
        let s = s.unwrap_or(first);
        let g = *at.entry(s).or_insert_with(|| {
            groups.push((s, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i as u32);
    }
    Some(groups)
}
