//! A node's reply for a request in flight: the usual one taken at once
//! ([`plain_reply`]), any other acted on as the reaction table of `upstream::retry` says
//! ([`on_reply`]), or taken as it is ([`answer_as_is`]) when the ordering rule says a
//! retry would run out of the client's order.

use super::*;

/// The usual reply, taken before anything else is set up for [`on_reply`]: the one part
/// of a command passed on as it is, not an error (so nothing to retry or follow), and
/// nothing to do around it (no write to invalidate for, no dedicated connection to give
/// back): what `complete` would end with. `Err` gives the reply back for `on_reply`.
#[inline(always)]
pub fn plain_reply(proxy: &Proxy, p: &mut Pending, reply: BackendReply) -> Result<Bytes, BackendReply> {
    if reply.tag.part != 0 || !p.plain(proxy) {
        return Err(reply);
    }
    match reply.result {
        Ok(data) if data.first() != Some(&b'-') => {
            if let Inner::Full(p) = &mut p.0 {
                p.remaining = 0;
            }
            Ok(data)
        }
        result => Err(BackendReply { result, ..reply }),
    }
}

/// A backend reply for part `idx` of `p`. Returns the final reply once every part is in.
/// Any reply may come here; the session offers it to [`plain_reply`] first, which gives
/// the usual one the same answer without the work.
pub fn on_reply(proxy: &Proxy, ctx: &mut Ctx, p: &mut Pending, reply: BackendReply) -> Option<Bytes> {
    let p = p.full();
    if let Finish::Transaction(_) = p.finish {
        return on_transaction_reply(proxy, ctx, p, reply);
    }
    let idx = reply.tag.part as usize;
    if p.parts.get(idx)?.reply.is_some() {
        return None;
    }
    // A reply that is no error (each part of a split MSET or MGET, usually) takes the
    // reaction table's "answer" row whatever the attempt (`retry::react`): completed at
    // once, without classifying it and building the attempt (about 150 instructions a
    // part). Not a blocking command's: its own rows decide (`retry::classify_blocked`).
    if !p.blocking() && matches!(&reply.result, Ok(d) if d.first() != Some(&b'-')) {
        let Ok(d) = reply.result else { return None };
        return complete(proxy, ctx, p, idx, d);
    }
    let cluster = proxy.cluster.is_cluster();
    let verdict = if p.blocking() {
        retry::classify_blocked(&reply.result, cluster)
    } else {
        retry::classify(&reply.result, cluster)
    };
    if let Some(Target::Replica(_, s, strict)) = p.parts.get(idx).map(|x| &x.target)
        && let Some(step) = retry::react_on_replica(&verdict, &reply.result, *strict)
    {
        // (crate::services::reads)
        let s = *s;
        if let Step::NoReplica = step {
            return complete(proxy, ctx, p, idx, errors::resp(&errors::no_replica(s)));
        }
        crate::metrics::global().replica_fallback_failed.increment(1);
        p.parts[idx].target = Target::Slot(s);
        return resend(proxy, ctx, p, idx);
    }
    if p.pinned() && verdict.leaves_node() {
        // the watched keys' master is not where the WATCH ran any more
        void_watch(ctx);
        match &mut p.dedicated {
            Some(d) if d.block.is_some() => d.via = Via::Own(None),
            _ => p.dedicated = None,
        }
        if proxy.commands.lookup(ctx.req).is_ok_and(|c| c.route == Route::Transaction(TxCmd::Watch)) {
            // Redis answers WATCH +OK; the void watch makes EXEC answer nil
            return complete(proxy, ctx, p, idx, Bytes::from_static(b"+OK\r\n"));
        }
    }
    let block = p.dedicated.as_ref().and_then(|d| d.block.as_ref());
    // (not through WATCH: docs/cache.md#stale-if-error)
    let may_stale = proxy.cache.serves_stale()
        && !ctx.writes
        && block.is_none()
        && !p.pinned()
        && p.parts.len() == 1
        && matches!(p.finish, Finish::Merge(Merge::Pass));
    let part = p.parts.get_mut(idx)?;
    let attempt = Attempt {
        redirects: part.redirects,
        retries: part.retries,
        behind_retry: ctx.behind_retry,
        blocked: block.is_some(),
        expired: block.is_some_and(|b| b.deadline.is_some_and(|t| t <= Instant::now())),
        dedicated: p.dedicated.is_some(),
        by_slot: matches!(part.target, Target::Slot(_)),
        asked: matches!(part.target, Target::Ask(..)),
        may_stale,
    };
    let step = match retry::react(verdict, &reply.result, &attempt) {
        Step::Stale(otherwise) => {
            // the master cannot answer now: the read's last value, as a rule allows
            if let Ok(cmd) = proxy.commands.lookup(ctx.req)
                && let Some(r) = stale_answer(proxy, ctx, cmd)
            {
                return complete(proxy, ctx, p, idx, r);
            }
            *otherwise
        }
        step => step,
    };
    let part = p.parts.get_mut(idx)?;
    let dedicated = p.dedicated.is_some();
    let data = match step {
        Step::Reload => {
            // a script that is not loaded there (yet): one of heatshield's lock scripts,
            // or one seen in EVAL or SCRIPT LOAD (crate::services::scripts): sent whole, once
            let data_now = part.data(ctx.req);
            match proxy.locks.eval_form(data_now).or_else(|| proxy.scripts.eval_form(data_now)) {
                Some(eval) => {
                    part.redirects += 1;
                    part.set_data(eval);
                    return resend(proxy, ctx, p, idx);
                }
                None => reply.result.ok()?,
            }
        }
        Step::AskOwner(slot) => {
            part.redirects += 1;
            part.target = Target::Slot(slot);
            return resend(proxy, ctx, p, idx);
        }
        Step::Follow(r) => {
            part.redirects += 1;
            if !follow(proxy, part, &r) {
                // The address is not one the cluster announced (a script can return any
                // error text): refresh the topology, then look again.
                part.rare().held = reply.result.ok();
                recheck_later(proxy, ctx, idx as u32, false);
                return None;
            }
            p.redirected = true;
            if part.redirects > 2 {
                // Sent back and forth: the nodes disagree about the slot while a move or a
                // failover spreads (a slot's new owner not told yet, say). Following at
                // once would spend the redirections in a millisecond and hand the client
                // a MOVED; from the third on, each waits RETRY_DELAY for them to agree.
                proxy.cluster.request_refresh();
                send_later(proxy, ctx, dedicated, part, idx as u32, 1);
                return None;
            }
            return resend(proxy, ctx, p, idx);
        }
        Step::Busy { tryagain } => {
            if tryagain
                && part.pieces().is_none()
                && let Some(kind) = splittable(proxy, ctx.req)
            {
                // some of the keys have moved with their slot, some not yet: Redis would
                // answer TRYAGAIN for as long as the migration lasts; one key at a time,
                // each is served where it is (ASK for the moved ones)
                return per_key(proxy, ctx, p, idx, kind);
            }
            part.retries += 1;
            proxy.cluster.request_refresh();
            send_later(proxy, ctx, dedicated, part, idx as u32, 1);
            return None;
        }
        Step::NewMaster => {
            part.retries += 1;
            crate::metrics::global().readonly_retried.increment(1);
            if attempt.by_slot {
                proxy.cluster.request_refresh();
                send_later(proxy, ctx, dedicated, part, idx as u32, 1);
            } else {
                part.rare().held = reply.result.ok();
                recheck_later(proxy, ctx, idx as u32, true);
            }
            return None;
        }
        Step::Reissue => {
            part.retries += 1;
            proxy.cluster.request_refresh();
            send_later(proxy, ctx, dedicated, part, idx as u32, 1);
            return None;
        }
        Step::Recheck => {
            let held = Ok(part.take_held()?);
            let verdict = retry::classify(&held, cluster);
            let Ok(held) = held else { return None };
            match verdict {
                Verdict::ReadOnly => {
                    let promoted = match &part.target {
                        Target::Node(n) | Target::Ask(n, _) => proxy.cluster.topology().promoted_for(&n.addr),
                        Target::Slot(_) | Target::Replica(..) => None,
                    };
                    if let Some(n) = promoted {
                        part.target = Target::Node(n);
                        return resend(proxy, ctx, p, idx);
                    }
                    if part.retries < MAX_RETRIES {
                        // the map does not show the new master yet
                        part.retries += 1;
                        part.rare().held = Some(held);
                        recheck_later(proxy, ctx, idx as u32, true);
                        return None;
                    }
                    return complete(proxy, ctx, p, idx, held);
                }
                Verdict::Redirect(r) if follow(proxy, part, &r) => {
                    p.redirected = true;
                    return resend(proxy, ctx, p, idx);
                }
                _ => {}
            }
            // Not confirmed: the client gets the reply as Redis sent it, and nothing else
            // changes.
            crate::metrics::global().redirect_refused.increment(1);
            tracing::warn!(
                reply = %String::from_utf8_lossy(&held).trim_end(),
                client = ctx.client.id,
                "redirection to an address the cluster does not announce; passed to the client as it is"
            );
            held
        }
        // a shared cache fill could not answer for this request: send it ourselves
        Step::Resend => {
            // once, it joins (or starts) the next fill of the same read, so the readers
            // a raced fill gives back read Redis once together, not once each
            if part.retries == 0 && refill(proxy, ctx) {
                part.retries += 1;
                return None;
            }
            return resend(proxy, ctx, p, idx);
        }
        Step::Unreachable { addr, retry } => {
            proxy.cluster.request_refresh();
            if retry {
                part.retries += 1;
                send_later(proxy, ctx, dedicated, part, idx as u32, 1);
                return None;
            }
            tracing::warn!(node = %addr, command = proxy.command_name(ctx.cmd), client = ctx.client.id, "node unreachable; request failed");
            errors::resp(&errors::node_unreachable(&addr))
        }
        Step::Fail(e) => {
            proxy.cluster.request_refresh();
            tracing::warn!(error = %e, command = proxy.command_name(ctx.cmd), client = ctx.client.id, "backend request failed");
            errors::resp(&errors::backend_failed(&e))
        }
        // FCALL of a function this master lacks (it joined later, or its functions were
        // flushed): the library heatshield saw register it is loaded there first, on the
        // connection the call goes on again, so it runs before it; once
        Step::LoadFunction => {
            let data = reply.result.ok()?;
            let load = proxy.scripts.function_load(part.data(ctx.req));
            match (load, resolve(proxy, &part.target)) {
                (Some(load), Ok((node, _))) => {
                    part.redirects = MAX_REDIRECTS;
                    crate::metrics::global().function_loaded.increment(1);
                    node.conn(ctx.client.proto, ctx.client.id).send(BackendRequest {
                        data: load,
                        count: 1,
                        prefix: Prefix::None,
                        // no part has this tag: its reply is dropped (the call's reply says
                        // whether it worked)
                        tag: Tag { seq: ctx.seq, part: u32::MAX },
                        reply_to: ctx.reply_to.clone(),
                        order: None,
                        db: 0,
                    });
                    return resend(proxy, ctx, p, idx);
                }
                _ => data,
            }
        }
        Step::TimedOut => {
            let mut w = Writer::new(ctx.scratch, ctx.client.proto);
            if block.is_some_and(|b| b.nil_string) {
                w.nil();
            } else {
                w.nil_array();
            }
            ctx.scratch.split().freeze()
        }
        // an answer, or a redirection or retry past its limit: passed on as it is (a
        // replica's and a stale answer's rows were taken above)
        Step::Answer | Step::Stale(_) | Step::ToMaster | Step::NoReplica => reply.result.ok()?,
    };
    complete(proxy, ctx, p, idx, data)
}

/// A backend reply for part `reply.tag.part` of `p` taken as that part's answer, however
/// it reads (a TRYAGAIN that cannot be retried in the client's order: see
/// [`crate::conn::order`]). Returns the final reply once every part is in.
pub fn answer_as_is(proxy: &Proxy, ctx: &mut Ctx, p: &mut Pending, reply: BackendReply) -> Option<Bytes> {
    let p = p.full();
    if let Finish::Transaction(tx) = &p.finish {
        // a queued command's TRYAGAIN: the native transaction was aborted, nothing ran.
        // Under WATCH the client is told as when a watched key changed (it retries);
        // otherwise EXEC is refused as Redis refuses one at EXEC time.
        let k = tx.part_of(reply.tag.part)?;
        if p.parts[k].reply.is_some() {
            return None;
        }
        let answer = if p.dedicated.is_some() {
            let mut w = Writer::new(ctx.scratch, ctx.client.proto);
            w.nil_array();
            ctx.scratch.split().freeze()
        } else {
            let why = match &reply.result {
                Ok(d) => String::from_utf8_lossy(error_text(d).unwrap_or_default()).into_owned(),
                Err(e) => e.to_string(),
            };
            errors::resp(&errors::exec_aborted_because(&why))
        };
        return complete(proxy, ctx, p, k, answer);
    }
    let idx = reply.tag.part as usize;
    if p.parts.get(idx)?.reply.is_some() {
        return None;
    }
    let data = match reply.result {
        Ok(d) => d,
        Err(e) => errors::resp(&errors::backend_failed(&e)),
    };
    complete(proxy, ctx, p, idx, data)
}

/// The hot-key cache's stale answer for the request (a cacheable read of one key) while
/// its master cannot answer, if a `cache.stale_if_error` rule allows one
/// ([`crate::services::cache::HotCache::lookup_stale`]). Never once a write of the key
/// was sent through heatshield, by any client: admission dropped the entry then.
pub fn stale_answer(proxy: &Proxy, ctx: &mut Ctx, cmd: &crate::command::Command) -> Option<Bytes> {
    let cache = &proxy.cache;
    if !cache.serves_stale() || !cache.may_answer(cmd, ctx.req, ctx.client.modes.watch.is_some()) {
        return None;
    }
    let req = ctx.req;
    let r = cache.lookup_stale(cmd.id, ctx.client.proto, ctx.client.db, req, req.arg(1))?;
    ctx.cached = true;
    Some(r)
}

/// Sends a read a shared cache fill gave back as a fill again (joining one in flight):
/// false when it cannot be one now (the caller sends it itself).
fn refill(proxy: &Proxy, ctx: &mut Ctx) -> bool {
    let cache = &proxy.cache;
    let Ok(cmd) = proxy.commands.lookup(ctx.req) else { return false };
    if !cache.enabled || !cache.may_answer(cmd, ctx.req, ctx.client.modes.watch.is_some()) {
        return false;
    }
    let key = ctx.req.arg(1);
    if !cache.tracked(key) {
        return false;
    }
    let Some(owner) = proxy.cluster.topology().master_for_slot(crate::upstream::cluster::slot(key)).cloned() else {
        return false;
    };
    let conn = owner.conn(ctx.client.proto, ctx.client.id);
    let tag = Tag { seq: ctx.seq, part: 0 };
    cache.fill(cmd.id, ctx.client.proto, ctx.client.db, ctx.req, key, &owner, conn, ctx.reply_to, tag)
}
