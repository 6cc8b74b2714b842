//! A client's MULTI ... EXEC as native transactions ([`start_transaction`]): one per
//! transaction, or one per slot (`transactions.cross_slot = "per-node"`), each sent as one
//! message and answered by its EXEC; a part that met a redirection, TRYAGAIN or
//! CLUSTERDOWN while queueing ran nothing and is sent again whole.

use bytes::Bytes;
use smallvec::SmallVec;

use super::send::{follow, send_later, send_part};
use super::{Ctx, Dedicated, Finish, Full, Outcome, Part, Target, Via, complete};
use crate::conn::multi::TxSplit;
use crate::errors;
use crate::mailbox::BackendReply;
use crate::protocol::Writer;
use crate::protocol::reply::Redirect;
use crate::proxy::Proxy;
use crate::upstream::cluster::Lease;
use crate::upstream::retry::{self, MAX_REDIRECTS, MAX_RETRIES, Verdict};

/// A client's transaction as native transactions: one, or one per slot.
pub struct Tx {
    /// One per part, in part order.
    parts: Vec<TxReplies>,
    /// Per part, the positions of its commands in the client's transaction (empty: one
    /// part, its reply is the reply).
    pub(super) positions: Vec<Vec<u32>>,
    /// Commands in the client's transaction.
    pub(super) total: u32,
    /// Keys of its writes (for the rare path of [`Full::write_hot_generation`]).
    pub(super) write_keys: Vec<Bytes>,
    /// Cross-slot commands queued as one command per slot, merged back in EXEC's reply.
    pub(super) splits: Vec<TxSplit>,
}

impl Tx {
    /// The native transaction whose replies include the one tagged `idx`.
    pub(super) fn part_of(&self, idx: u32) -> Option<usize> {
        self.parts.iter().position(|t| idx >= t.base && idx < t.base + t.queued + 2)
    }
}

/// One native transaction of a [`Tx`] (`data`: `MULTI`, the commands, `EXEC`).
pub struct TxPart {
    pub data: Bytes,
    pub queued: u32,
    pub target: Target,
    /// The positions of its commands in the client's transaction.
    pub positions: Vec<u32>,
}

/// What the `queued + 2` replies of one native transaction sent as one message (`MULTI`,
/// the queued commands, `EXEC`) said so far. Its replies are tagged `base`, `base + 1`, ...
pub struct TxReplies {
    base: u32,
    queued: u32,
    got: u32,
    exec: Option<Bytes>,
    /// The first redirection a queued command met (EXEC then aborts: nothing ran).
    redirect: Option<Redirect>,
    /// A queued command met TRYAGAIN or CLUSTERDOWN.
    busy: bool,
    /// Never written to the node.
    unsent: bool,
    /// The connection failed once it was written: it may have run.
    failed: Option<String>,
}

impl TxReplies {
    fn clear(&mut self) {
        (self.got, self.exec, self.redirect, self.busy, self.unsent) = (0, None, None, false, false);
    }
}

/// Sends a transaction: each part (`MULTI`, its commands, `EXEC`) to its target; the
/// EXEC replies (merged in the client's order when there are several parts) are the
/// client's. A part that met a redirection, TRYAGAIN or CLUSTERDOWN at queue time ran
/// nothing (EXEC aborts), so it is sent again whole, like a single command would be.
///
/// Under WATCH (`pinned`: the client's WATCH connection, handed over; one part) it is
/// sent there, and never again: if it met a redirection, TRYAGAIN, CLUSTERDOWN or could
/// not be sent, the watch guarded nothing, so EXEC answers nil (the client retries, as
/// after a conflicting write).
pub fn start_transaction(
    proxy: &Proxy,
    ctx: &mut Ctx,
    tx_parts: Vec<TxPart>,
    total: u32,
    write_keys: Vec<Bytes>,
    splits: Vec<TxSplit>,
    pinned: Option<Lease>,
) -> Outcome {
    let mut replies = Vec::with_capacity(tx_parts.len());
    let mut positions = Vec::new();
    let mut parts: SmallVec<[Part; 1]> = SmallVec::new();
    let mut base = 0;
    let several = tx_parts.len() > 1;
    for t in tx_parts {
        replies.push(TxReplies {
            base,
            queued: t.queued,
            got: 0,
            exec: None,
            redirect: None,
            busy: false,
            unsent: false,
            failed: None,
        });
        base += t.queued + 2;
        if several {
            positions.push(t.positions);
        }
        parts.push(Part::new(t.data, t.target));
    }
    let tx = Tx { parts: replies, positions, total, write_keys, splits };
    let mut p = Full::new(ctx, Finish::Transaction(Box::new(tx)), parts);
    if pinned.is_some() {
        p.dedicated = Some(Box::new(Dedicated { via: Via::Own(pinned), block: None }));
    }
    for k in 0..p.parts.len() {
        let Finish::Transaction(tx) = &p.finish else { break };
        let (base, count) = (tx.parts[k].base, tx.parts[k].queued + 2);
        if let Err(e) = send_part(proxy, ctx, &mut p.dedicated, &p.parts[k], base, count)
            && let Some(done) = complete(proxy, ctx, &mut p, k, e)
        {
            return Outcome::Ready(done);
        }
    }
    Outcome::Waiting(p.into())
}

/// One of a transaction's replies; once all of a part's are in, its EXEC's reply is that
/// part's answer, or the part is sent again (see [`start_transaction`]).
pub(super) fn on_transaction_reply(proxy: &Proxy, ctx: &mut Ctx, p: &mut Full, reply: BackendReply) -> Option<Bytes> {
    let Full { finish: Finish::Transaction(tx), parts, .. } = p else { return None };
    let idx = reply.tag.part;
    let k = tx.part_of(idx)?;
    let t = &mut tx.parts[k];
    if parts[k].reply.is_some() {
        return None;
    }
    let i = idx - t.base;
    match (retry::classify(&reply.result, proxy.cluster.is_cluster()), reply.result) {
        (Verdict::Unsent, _) => t.unsent = true,
        (_, Err(e)) if t.failed.is_none() => {
            tracing::warn!(error = %e, client = ctx.client.id, "backend request failed during a transaction");
            t.failed = Some(errors::backend_failed(&e));
        }
        // EXEC itself checks every key of the transaction (Redis Cluster does at EXEC):
        // a redirection or TRYAGAIN there discarded the transaction, as one at queue time
        (verdict, Ok(data)) if i == t.queued + 1 => {
            match verdict {
                // (an ASK that waited behind an earlier retry is out of date: ask again later)
                Verdict::Redirect(Redirect::Ask { .. }) if ctx.behind_retry => t.busy = true,
                Verdict::Redirect(r) => {
                    t.redirect.get_or_insert(r);
                }
                Verdict::Busy => t.busy = true,
                _ => {}
            }
            t.exec = Some(data);
        }
        (Verdict::Redirect(Redirect::Ask { .. }), Ok(_)) if i > 0 && ctx.behind_retry => t.busy = true,
        (Verdict::Redirect(r), Ok(_)) if i > 0 => {
            t.redirect.get_or_insert(r);
        }
        (Verdict::Busy, Ok(_)) if i > 0 => t.busy = true,
        _ => {}
    }
    t.got += 1;
    if t.got < t.queued + 2 {
        return None;
    }
    let part = &mut parts[k];
    let (base, count) = (t.base, t.queued + 2);
    if let Some(e) = t.failed.take() {
        proxy.cluster.request_refresh();
        return complete(proxy, ctx, p, k, errors::resp(&e));
    }
    let exec_aborted = t.exec.as_ref().is_some_and(|e| retry::exec_aborted(e, t.redirect.is_some() || t.busy));
    if p.dedicated.is_some() && (t.unsent || (exec_aborted && (t.redirect.is_some() || t.busy))) {
        // under WATCH: nothing ran, and the watch guarded nothing where it is sent now
        proxy.cluster.request_refresh();
        let mut w = Writer::new(ctx.scratch, ctx.client.proto);
        w.nil_array();
        let nil = ctx.scratch.split().freeze();
        return complete(proxy, ctx, p, k, nil);
    }
    if t.unsent {
        proxy.cluster.request_refresh();
        if part.retries < MAX_RETRIES && matches!(part.target, Target::Slot(_)) {
            part.retries += 1;
            t.clear();
            send_later(proxy, ctx, false, part, base, count);
            return None;
        }
        return complete(proxy, ctx, p, k, errors::resp(&errors::node_unreachable("the transaction's master")));
    }
    let exec = t.exec.take().unwrap_or_default();
    if exec_aborted {
        // a slot migrating with the transaction's keys on both sides: the source sends
        // the moved ones on (ASK), the target refuses what it lacks (TRYAGAIN)
        let migrating = t.busy || matches!(t.redirect, Some(Redirect::Ask { .. }));
        if let Some(r) = t.redirect.take()
            && part.redirects < MAX_REDIRECTS
        {
            part.redirects += 1;
            if follow(proxy, part, &r) {
                t.clear();
                p.redirected = true;
                if let Err(e) = send_part(proxy, ctx, &mut p.dedicated, &p.parts[k], base, count) {
                    return complete(proxy, ctx, p, k, e);
                }
                return None;
            }
        } else if migrating && part.retries < MAX_RETRIES {
            // later, from the slot's owner again; each round is a retry, so the way
            // there (an ASK again) is not a redirection more
            part.retries += 1;
            part.redirects = 0;
            t.clear();
            proxy.cluster.request_refresh();
            send_later(proxy, ctx, false, part, base, count);
            return None;
        } else if migrating {
            // the migration outlasted the retries: nothing ran, as Redis says of a
            // transaction whose keys a migration splits
            let why = "TRYAGAIN Multiple keys request during rehashing of slot";
            return complete(proxy, ctx, p, k, errors::resp(&errors::exec_aborted_because(why)));
        }
    }
    complete(proxy, ctx, p, k, exec)
}
