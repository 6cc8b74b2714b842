//! Route: where an admitted request's parts go, as [`Part`]s for [`crate::path::pending`] to
//! send. One part to the master owning the keys' slot (keyless: the master the client's
//! id picks); a multi-key command whose keys span slots as one part per slot; a fan-out
//! command as one part per master (SCAN: the master its cursor names); a lock command as
//! its script, or parked with the lock task.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use smallvec::{SmallVec, smallvec};

use crate::command::{Command, FanOut, Split};
use crate::conn::order::Lane;
use crate::errors;
use crate::mailbox::{Delivery, Tag};
use crate::path::merge::{Merge, scan_cursor};
use crate::path::pending::{
    Ctx, Finish, MastersBuilder, Outcome, Part, ScriptRun, Target, answered_elsewhere, start, start_in, start_whole,
};
use crate::protocol::Request;
use crate::protocol::request::{parse_i64, write_array_header, write_bulk};
use crate::proxy::Proxy;
use crate::services::locks::{LockCmd, LockRequest, Waiter};
use crate::upstream::backend::{BackendRequest, Prefix};
use crate::upstream::cluster::{NodePool, slot};

/// The whole request to one node.
fn pass(proxy: &Proxy, ctx: &mut Ctx, target: Target) -> Outcome {
    start_whole(proxy, ctx, target)
}

/// A keyless command for any master: the one the client's id picks, so one client's
/// keyless commands go to one master.
pub fn any_master(proxy: &Proxy, ctx: &mut Ctx) -> Outcome {
    let topo = ctx.topology(proxy);
    let Some(node) = topo.masters.get((ctx.client.id % topo.masters.len().max(1) as u64) as usize) else {
        return ctx.error(errors::NO_SLOT_MAP);
    };
    let node = node.clone();
    drop(topo);
    pass(proxy, ctx, Target::Node(node))
}

/// The whole request to the master owning slot `s` (a command about a slot).
pub fn to_slot(proxy: &Proxy, ctx: &mut Ctx, s: u16) -> Outcome {
    pass(proxy, ctx, Target::Slot(s))
}

/// A command whose keys (`keys`: argument positions) all hash to one slot: to the master
/// owning it. CROSSSLOT, as Redis Cluster says, when they do not.
pub fn forward(proxy: &Proxy, ctx: &mut Ctx, keys: &[u32]) -> Outcome {
    let Some(&k0) = keys.first() else { return any_master(proxy, ctx) };
    match one_slot(proxy, ctx.req, k0, keys) {
        // (a key the read policies leave on the master, the common case, needs no more)
        Some(s)
            if ctx.lane == Lane::Replica
                && ctx.facts & crate::glob::feature::READS != 0
                && proxy.reads.policy(ctx.asked.arg(k0 as usize)).0 != crate::services::reads::ReadFrom::Master =>
        {
            match read_target(proxy, ctx, s, k0) {
                Ok(t) => pass(proxy, ctx, t),
                Err(e) => ctx.error(&e),
            }
        }
        Some(s) => pass(proxy, ctx, Target::Slot(s)),
        None => ctx.error(errors::CROSSSLOT),
    }
}

/// Where a read of slot `s` (its first key at `k0`) on the replicas' lane goes, as the
/// read policies say (crate::services::reads): a replica in sync, or the master.
fn read_target(proxy: &Proxy, ctx: &Ctx, s: u16, k0: u32) -> Result<Target, String> {
    use crate::services::reads::{Choice, ReadFrom};
    // (the key's policy first: a key the rules leave on the master needs no more)
    let policy = proxy.reads.policy(ctx.asked.arg(k0 as usize));
    if policy.0 == ReadFrom::Master {
        return Ok(Target::Slot(s));
    }
    let topo = ctx.topology(proxy);
    let now = crate::upstream::backend::clock_ms(ctx.now);
    match proxy.reads.choose(&topo, s, policy, ctx.client.id, ctx.client.last_write_ms, now) {
        Choice::Master => Ok(Target::Slot(s)),
        Choice::Replica(r, strict) => Ok(Target::Replica(r, s, strict)),
        Choice::NoReplica => Err(errors::no_replica(s)),
    }
}

/// The slot of the keys at `keys` (the first at `k0`), if they share one (any slot is one
/// outside a cluster).
fn one_slot(proxy: &Proxy, req: &Request, k0: u32, keys: &[u32]) -> Option<u16> {
    let s = slot(req.arg(k0 as usize));
    if proxy.cluster.is_cluster() && keys[1..].iter().any(|&k| slot(req.arg(k as usize)) != s) {
        return None;
    }
    Some(s)
}

/// EVAL, EVALSHA, FCALL and their read-only forms: to the master of their keys' slot; a
/// keyless script has one home for every client, the master owning slot 0. (A script
/// that touches keys it did not declare then behaves the same on every call: it works
/// for keys of that master's slots, and fails for others, with a hint added to Redis's
/// error: see [`Finish::Script`].)
pub fn script(proxy: &Proxy, ctx: &mut Ctx, keys: &[u32]) -> Outcome {
    let s = match keys.first() {
        None => 0,
        Some(&k0) => match one_slot(proxy, ctx.req, k0, keys) {
            Some(s) => s,
            None => return ctx.error(errors::CROSSSLOT),
        },
    };
    let target = match keys.first() {
        // EVAL_RO, FCALL_RO: a read the read policies may send to a replica
        Some(&k0) if ctx.lane == Lane::Replica => match read_target(proxy, ctx, s, k0) {
            Ok(t) => t,
            Err(e) => return ctx.error(&e),
        },
        _ => Target::Slot(s),
    };
    let run = match &target {
        Target::Replica(r, ..) => Some(ScriptRun::new(r.clone())),
        _ => ctx.topology(proxy).master_for_slot(s).cloned().map(ScriptRun::new),
    };
    start(proxy, ctx, Finish::Script(run), smallvec![Part::whole(target)])
}

/// A blocking command: its keys share one slot (CROSSSLOT otherwise, as Redis Cluster
/// says), and it waits on a dedicated connection to that slot's master for as long as its
/// own timeout says (the rules: `pending::blocking`).
pub fn block(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command, keys: &[u32]) -> Outcome {
    let req = ctx.req;
    let Some(&k0) = keys.first() else { return ctx.error(&errors::wrong_arity(&cmd.lower)) };
    let s = slot(req.arg(k0 as usize));
    if proxy.cluster.is_cluster() && keys[1..].iter().any(|&k| slot(req.arg(k as usize)) != s) {
        return ctx.error(errors::CROSSSLOT);
    }
    let (block, wait_ms) = crate::path::pending::Block::of(cmd, req, ctx.now);
    ctx.wait_ms = wait_ms;
    crate::path::pending::start_blocking(proxy, ctx, s, block)
}

/// A read of one hot key the cache could not answer: sent as the cache's fill (whose
/// reply the cache keeps), or, when the node's invalidations are not flowing, as usual.
pub fn fill(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command, k: u32, owner: std::sync::Arc<NodePool>) -> Outcome {
    let req = ctx.req;
    let key = req.arg(k as usize);
    let tag = Tag { seq: ctx.seq, part: 0 };
    let (proto, id) = (ctx.client.proto, ctx.client.id);
    let conn = owner.conn(proto, id);
    if proxy.cache.fill(cmd.id, proto, ctx.client.db, req, key, &owner, conn, ctx.reply_to, tag) {
        return answered_elsewhere(ctx, Target::Slot(slot(key)));
    }
    let part = Part::new(req.raw().clone(), Target::Slot(slot(key)));
    start(proxy, ctx, Finish::Merge(Merge::Pass), smallvec![part])
}

/// MGET / MSET / DEL-like (keys at 1, 1 + step, ...): forwarded whole when one slot holds
/// every key, else one part per slot. `cached`: MGET keys (by position among the keys)
/// answered from the hot-key cache, which are not asked of Redis.
pub fn split(proxy: &Proxy, ctx: &mut Ctx, kind: Split, cached: Vec<(u32, Bytes)>) -> Outcome {
    let req = ctx.req;
    let step = if kind == Split::Mset { 2 } else { 1 };
    let nkeys = (req.argc() - 1) / step;
    let replica = ctx.lane == Lane::Replica;
    if cached.is_empty() {
        let s0 = slot(req.arg(1));
        if !proxy.cluster.is_cluster() || (1..nkeys).all(|i| slot(req.arg(1 + i * step)) == s0) {
            if replica {
                return match read_target(proxy, ctx, s0, 1) {
                    Ok(t) => pass(proxy, ctx, t),
                    Err(e) => ctx.error(&e),
                };
            }
            return pass(proxy, ctx, Target::Slot(s0));
        }
    }
    ctx.cached = cached.len() == nkeys;
    let is_cached = |i: u32| cached.iter().any(|(p, _)| *p == i);
    let wanted = (0..nkeys as u32).filter(|&i| cached.is_empty() || !is_cached(i));
    let (buffer, groups) = groups(req, step, nkeys, wanted);
    // (sized at once: growing them one slot at a time was about 4,000 instructions of an
    // MSET of 10 keys across slots, most of them in realloc)
    let mut parts: SmallVec<[Part; 1]> = SmallVec::with_capacity(groups.len());
    let mut positions: Vec<SmallVec<[u32; 4]>> = Vec::with_capacity(groups.len());
    for group in groups {
        let target = match replica {
            // (each slot's part goes where the policy of its first key says)
            true => match read_target(proxy, ctx, group.slot, 1 + group.positions[0] * step as u32) {
                Ok(t) => t,
                Err(e) => return ctx.error(&e),
            },
            false => Target::Slot(group.slot),
        };
        parts.push(Part::new(group.data, target));
        positions.push(group.positions);
    }
    let merge = match kind {
        Split::Mget => Merge::Mget(Box::new(crate::path::merge::Mget { positions, total: nkeys, cached })),
        Split::Mset => Merge::Mset,
        Split::Sum => Merge::Sum,
    };
    start_in(proxy, ctx, Finish::Merge(merge), parts, Some(buffer))
}

/// Commands that go to every master (or, for SCAN, the master the cursor names).
pub fn fan_out(proxy: &Proxy, ctx: &mut Ctx, kind: FanOut) -> Outcome {
    let req = ctx.req;
    let topo = ctx.topology(proxy);
    if topo.masters.is_empty() {
        return ctx.error(errors::NO_SLOT_MAP);
    }
    let all = |data: &Bytes| -> SmallVec<[Part; 1]> {
        topo.masters.iter().map(|n| Part::new(data.clone(), Target::Node(n.clone()))).collect()
    };
    let (merge, parts) = match kind {
        FanOut::Keys => (Merge::Keys, all(req.raw())),
        FanOut::RandomKey => (Merge::RandomKey, all(req.raw())),
        FanOut::Dbsize => (Merge::Dbsize, all(req.raw())),
        FanOut::AllSame | FanOut::Flush => (Merge::AllSame, all(req.raw())),
        FanOut::ScriptExists => {
            // 1 for a script every master has, or one heatshield can send whole
            let known = req.args().skip(2).map(|sha| proxy.scripts.knows(sha)).collect();
            (Merge::ScriptExists { known }, all(req.raw()))
        }
        FanOut::Channels => (Merge::Union, all(req.raw())),
        FanOut::NumSub(kind) => {
            let channels: Vec<&[u8]> = req.args().skip(2).collect();
            (Merge::NumSub { adjust: proxy.pubsub.numsub_adjust(kind, &channels) }, all(req.raw()))
        }
        FanOut::NumPat => (Merge::SumPlus(proxy.pubsub.numpat_adjust()), all(req.raw())),
        FanOut::Log => {
            // SLOWLOG GET [count] (10), COMMANDLOG GET count type; -1: all. A count the
            // masters refuse is answered by their error.
            let count = match (req.argc() > 2).then(|| parse_i64(req.arg(2))) {
                None => Some(10),
                Some(Some(n)) if n >= 0 => Some(n as usize),
                Some(_) => None,
            };
            (Merge::Log { count }, all(req.raw()))
        }
        FanOut::LogReset => {
            if proxy.config.admin.password.is_some() && !ctx.client.admin {
                return ctx.error(errors::ADMIN_NOPERM);
            }
            (Merge::AllSame, all(req.raw()))
        }
        FanOut::SlotStats => (Merge::SlotStats { order: slot_stats_order(req).map(Box::new) }, all(req.raw())),
        FanOut::Commands => {
            let node = topo.masters[(ctx.client.id % topo.masters.len() as u64) as usize].clone();
            let (merge, data) = commands_view(proxy, req);
            (Merge::Commands(Box::new(merge)), smallvec![Part::new(data, Target::Node(node))])
        }
        FanOut::Kill => {
            let masters = topo.masters.clone();
            drop(topo);
            return kill(proxy, ctx, &masters);
        }
        FanOut::Scan => {
            let Some((node, backend_cursor)) = scan_cursor(req.arg(1), topo.masters.len()) else {
                return ctx.error(errors::INVALID_CURSOR);
            };
            let backend_cursor = backend_cursor.to_string();
            let mut args: Vec<&[u8]> = req.args().collect();
            args[1] = backend_cursor.as_bytes();
            let data = Request::from_args(&args).raw().clone();
            let nodes = topo.masters.len();
            (Merge::Scan { node, nodes }, smallvec![Part::new(data, Target::Node(topo.masters[node].clone()))])
        }
    };
    drop(topo);
    start(proxy, ctx, Finish::Merge(merge), parts)
}

/// COMMAND and its COUNT / INFO / LIST / DOCS as heatshield answers them (see
/// [`crate::path::merge::Commands`]), and what to ask the master.
fn commands_view(proxy: &Proxy, req: &Request) -> (crate::path::merge::Commands, Bytes) {
    use crate::path::merge::{Commands, CommandsKind, OwnCommand};
    let sub = if req.argc() > 1 { req.arg(1).to_ascii_uppercase() } else { Vec::new() };
    let (kind, data) = match sub.as_slice() {
        b"COUNT" => (CommandsKind::Count, Request::from_args(&["COMMAND"]).raw().clone()),
        b"INFO" => {
            (CommandsKind::Info(req.args().skip(2).map(<[u8]>::to_ascii_lowercase).collect()), req.raw().clone())
        }
        b"LIST" => {
            let filter = (req.argc() >= 5 && req.arg(2).eq_ignore_ascii_case(b"FILTERBY")).then(|| req.arg(3));
            let own = filter.is_none_or(|f| f.eq_ignore_ascii_case(b"PATTERN"));
            let pattern = filter.map(|_| req.arg(4).to_vec());
            (CommandsKind::List { own, pattern }, req.raw().clone())
        }
        b"DOCS" => (CommandsKind::Docs, req.raw().clone()),
        _ => (CommandsKind::All, req.raw().clone()),
    };
    let own = proxy
        .commands
        .own()
        .into_iter()
        .map(|c| OwnCommand {
            name: c.lower.clone(),
            arity: c.arity(),
            flags: match (c.is_write(), c.is_read()) {
                (true, _) => &["write"],
                (false, true) => &["readonly"],
                _ => &["admin", "noscript", "loading", "stale"],
            },
            key: matches!(c.route, crate::command::Route::Lock(_)),
        })
        .collect();
    let (refused, refused_subs) = (proxy.commands.refused_names(), proxy.commands.refused_subs());
    (Commands { kind, refused, refused_subs, own }, data)
}

/// CLUSTER SLOT-STATS ORDERBY metric [LIMIT n] [ASC|DESC]: the metric, the limit (16)
/// and whether descending (the default); `None` for SLOTSRANGE (by slot).
fn slot_stats_order(req: &Request) -> Option<(Vec<u8>, usize, bool)> {
    if !req.arg(2).eq_ignore_ascii_case(b"ORDERBY") || req.argc() < 4 {
        return None;
    }
    let (mut limit, mut desc) = (16usize, true);
    let mut i = 4;
    while i < req.argc() {
        let a = req.arg(i);
        if a.eq_ignore_ascii_case(b"LIMIT") && i + 1 < req.argc() {
            limit = parse_i64(req.arg(i + 1)).map_or(limit, |n| n.max(0) as usize);
            i += 1;
        } else if a.eq_ignore_ascii_case(b"ASC") {
            desc = false;
        } else if a.eq_ignore_ascii_case(b"DESC") {
            desc = true;
        }
        i += 1;
    }
    Some((req.arg(3).to_vec(), limit, desc))
}

/// SCRIPT KILL / FUNCTION KILL / FUNCTION STATS to every master, on connections no busy
/// script holds up (see [`while_busy`]): `+OK` if one was killed
/// ([`crate::path::merge::kill_reply`]), the running function's STATS
/// ([`crate::path::merge::stats_reply`]).
fn kill(proxy: &Proxy, ctx: &mut Ctx, masters: &[Arc<NodePool>]) -> Outcome {
    let merge = if ctx.req.arg(1).eq_ignore_ascii_case(b"STATS") {
        crate::path::merge::stats_reply
    } else {
        crate::path::merge::kill_reply
    };
    match while_busy(proxy, ctx, masters, merge, ()) {
        Ok(o) => o,
        Err(e) => ctx.error(&e),
    }
}

/// The request to each of `masters`, each on a connection leased for it: the connection a
/// busy script came on is not read until the script ends, and a shared connection may be
/// that one, so commands Redis answers while a script is busy (the KILLs, FUNCTION STATS,
/// PING) go this way. A task sends them and hands the request `merge` of the replies; the
/// leases go back (or close) when it is done, and `hold` is dropped then. The error when
/// a master has no dedicated connection to spare.
pub fn while_busy<H: Send + 'static>(
    proxy: &Proxy,
    ctx: &mut Ctx,
    masters: &[Arc<NodePool>],
    merge: fn(&[Bytes]) -> Bytes,
    hold: H,
) -> Result<Outcome, String> {
    let mut leases = Vec::with_capacity(masters.len());
    for m in masters {
        match m.lease(ctx.client.proto) {
            Some(l) => leases.push(l),
            None => {
                for l in leases {
                    l.release(false);
                }
                return Err(errors::no_dedicated(&m.addr, m.options().dedicated_max));
            }
        }
    }
    let data = ctx.req.raw().clone();
    let (reply_to, tag) = (ctx.reply_to.clone(), Tag { seq: ctx.seq, part: 0 });
    let timeout = Duration::from_millis(proxy.config.backend.command_timeout_ms);
    tokio::spawn(async move {
        let _hold = hold;
        let (tx, mut rx) = crate::mailbox::reply_channel();
        for (i, l) in leases.iter().enumerate() {
            l.conn().send(BackendRequest {
                data: data.clone(),
                count: 1,
                prefix: Prefix::None,
                tag: Tag { seq: 0, part: i as u32 },
                reply_to: tx.clone(),
                order: None,
                db: 0,
            });
        }
        drop(tx);
        let mut replies = vec![Bytes::new(); leases.len()];
        let collect = async {
            while let Some(r) = rx.recv().await {
                let Some(r) = r.into_reply() else { continue };
                replies[r.tag.part as usize] = match r.result {
                    Ok(b) => b,
                    Err(e) => errors::resp(&errors::backend_failed(&e)),
                };
            }
        };
        let answered = tokio::time::timeout(timeout, collect).await.is_ok();
        for l in leases {
            if answered {
                l.release(false);
            } // else dropped: closed
        }
        let reply = if answered {
            merge(&replies)
        } else {
            errors::resp(&errors::backend_failed(&crate::mailbox::BackendError::Timeout("a master".into())))
        };
        let _ = reply_to.send(Delivery::reply(tag, Ok(reply)));
    });
    Ok(answered_elsewhere(ctx, Target::Node(masters[0].clone())))
}

/// Sends `data` to every master and builds the reply from all of theirs (INFO, CONFIG).
pub fn to_masters(proxy: &Proxy, ctx: &mut Ctx, data: Bytes, build: MastersBuilder) -> Outcome {
    let topo = ctx.topology(proxy);
    let parts: SmallVec<[Part; 1]> =
        topo.masters.iter().map(|n| Part::new(data.clone(), Target::Node(n.clone()))).collect();
    drop(topo);
    if parts.is_empty() {
        return Outcome::Ready(build(proxy, ctx, &[]));
    }
    start(proxy, ctx, Finish::Masters(build), parts)
}

/// LOCK.ACQUIRE / RELEASE / EXTEND / INFO ([`crate::services::locks`]): the lock's script to the
/// master owning the key, or, for an ACQUIRE that may wait, parked with the lock task
/// (which answers it).
pub fn lock(proxy: &Proxy, ctx: &mut Ctx, r: LockRequest) -> Outcome {
    let s = slot(&r.key);
    if r.cmd == LockCmd::Acquire && r.wait_ms > 0 {
        ctx.wait_ms = r.wait_ms.min(u32::MAX as u64) as u32;
        let deadline = ctx.now + Duration::from_millis(r.wait_ms);
        let w = Waiter {
            req: r,
            client: ctx.client.id,
            proto: ctx.client.proto,
            reply_to: ctx.reply_to.clone(),
            tag: Tag { seq: ctx.seq, part: 0 },
            deadline,
        };
        ctx.client.used_locks = true;
        ctx.client.keepalive_locks |= w.req.keepalive;
        if !proxy.locks.park(w) {
            return ctx.error(errors::LOCK_SERVICE_DOWN);
        }
        return answered_elsewhere(ctx, Target::Slot(s));
    }
    let data = proxy.locks.command(&r, false, ctx.topology(proxy).master_for_slot(s).map(|n| &**n)).raw().clone();
    start(proxy, ctx, Finish::Lock(Box::new(r)), smallvec![Part::new(data, Target::Slot(s))])
}

/// One slot's share of a split multi-key command.
pub struct SlotGroup {
    pub slot: u16,
    /// The command for this slot's keys (and values), in request order.
    pub data: Bytes,
    /// Positions (0-based, in keys) of this group's keys in the original request.
    pub positions: SmallVec<[u32; 4]>,
}

/// Splits a MGET/MSET/DEL-like request (`step` 2 for key/value pairs) into one command per
/// slot, keeping request order inside each.
pub fn split_by_slot(req: &Request, step: usize) -> Vec<SlotGroup> {
    let n = (req.argc() - 1) / step;
    groups(req, step, n, 0..n as u32).1
}

/// [`split_by_slot`] for the keys at positions `wanted` (0-based, in keys) only. Every
/// group's command is written into one buffer, in group order, so groups that travel
/// together to one node are one slice of it (see [`crate::path::pending::start`]): the
/// arguments are copied once. At most `most` keys are wanted.
fn groups(req: &Request, step: usize, most: usize, wanted: impl Iterator<Item = u32>) -> (Bytes, Vec<SlotGroup>) {
    let mut order: Vec<(u16, u32)> = Vec::with_capacity(most);
    order.extend(wanted.map(|i| (slot(req.arg(1 + i as usize * step)), i)));
    order.sort_by_key(|&(s, _)| s);
    let name = req.arg(0);
    let size = order.len() * (16 + name.len()) + req.raw().len();
    let mut buf = BytesMut::with_capacity(size);
    let mut bounds: Vec<(u16, usize, SmallVec<[u32; 4]>)> = Vec::with_capacity(order.len());
    let mut i = 0;
    while i < order.len() {
        let s = order[i].0;
        let j = i + order[i..].iter().take_while(|(x, _)| *x == s).count();
        write_array_header(&mut buf, 1 + (j - i) * step);
        write_bulk(&mut buf, name);
        let mut positions = SmallVec::new();
        for &(_, k) in &order[i..j] {
            let a = 1 + k as usize * step;
            for arg in a..a + step {
                write_bulk(&mut buf, req.arg(arg));
            }
            positions.push(k);
        }
        bounds.push((s, buf.len(), positions));
        i = j;
    }
    let all = buf.freeze();
    let mut start = 0;
    let groups = bounds
        .into_iter()
        .map(|(slot, end, positions)| {
            let data = all.slice(start..end);
            start = end;
            SlotGroup { slot, data, positions }
        })
        .collect();
    (all, groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_groups_are_commands_in_one_buffer() {
        let keys = ["a", "b", "c", "{a}x", "d"];
        let mut args: Vec<&[u8]> = vec![b"MSET"];
        for k in &keys {
            args.push(k.as_bytes());
            args.push(b"v");
        }
        let req = Request::from_args(&args);
        let (all, groups) = groups(&req, 2, keys.len(), 0..keys.len() as u32);
        let mut end = all.as_ptr() as usize;
        let mut seen = 0;
        for g in &groups {
            // each group is the next slice of the one buffer (no copy of its own) ...
            assert_eq!(g.data.as_ptr() as usize, end);
            end += g.data.len();
            // ... and a whole command: MSET with this slot's pairs, in request order
            let sub = Request::parse(&g.data).expect("a whole command");
            assert_eq!(sub.arg(0), b"MSET");
            assert_eq!(sub.argc(), 1 + 2 * g.positions.len());
            for (n, &p) in g.positions.iter().enumerate() {
                assert_eq!(sub.arg(1 + 2 * n), keys[p as usize].as_bytes());
                assert_eq!(slot(sub.arg(1 + 2 * n)), g.slot);
            }
            assert!(g.positions.windows(2).all(|w| w[0] < w[1]));
            seen += g.positions.len();
        }
        assert_eq!(end, all.as_ptr() as usize + all.len());
        assert_eq!(seen, keys.len());
        // "a" and "{a}x" share a slot
        assert!(groups.iter().any(|g| g.positions.as_slice() == [0, 3]));
    }
}
