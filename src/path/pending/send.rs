//! How a part of a pending request reaches a node: now ([`send_part`], on a shared
//! connection or a dedicated one), again after a redirection or a failover ([`resend`],
//! [`send_later`] after [`RETRY_DELAY`]), or once a refresh of the slot map has confirmed
//! or refuted what a node said ([`recheck_later`]). Only nodes the cluster announced are
//! followed ([`follow`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;

use super::blocking::remaining;
use super::{Ctx, Dedicated, Full, Part, Target, Via, complete};
use crate::errors;
use crate::mailbox::{BackendError, Delivery, Tag};
use crate::protocol::reply::Redirect;
use crate::proxy::Proxy;
use crate::upstream::backend::{BackendRequest, Prefix};
use crate::upstream::cluster::{NodePool, Topology};
use crate::upstream::retry::{self, RETRY_DELAY};

/// The node a part goes to in slot map `topo` (borrowed from it), and whether ASKING must
/// precede it; an error reply when its slot is not served.
pub(super) fn resolve_in<'a>(topo: &'a Topology, target: &'a Target) -> Result<(&'a Arc<NodePool>, bool), Bytes> {
    match target {
        Target::Slot(s) => match topo.master_for_slot(*s) {
            Some(n) => Ok((n, false)),
            None => Err(errors::resp(&errors::slot_not_served(*s))),
        },
        Target::Node(n) | Target::Replica(n, ..) => Ok((n, false)),
        Target::Ask(n, _) => Ok((n, true)),
    }
}

/// [`resolve_in`] the current slot map, the pool held.
pub(super) fn resolve(proxy: &Proxy, target: &Target) -> Result<(Arc<NodePool>, bool), Bytes> {
    resolve_in(&proxy.cluster.topology(), target).map(|(n, asking)| (n.clone(), asking))
}

/// Sends part `idx` again now; completes it with the error if its slot is not served.
/// A blocking command waits only what remains of its timeout.
pub(super) fn resend(proxy: &Proxy, ctx: &mut Ctx, p: &mut Full, idx: usize) -> Option<Bytes> {
    if let Some(b) = p.dedicated.as_ref().and_then(|d| d.block.as_ref()) {
        p.parts[idx].set_data(remaining(ctx.req, b, Instant::now()));
    }
    if let Err(e) = send_part(proxy, ctx, &mut p.dedicated, &p.parts[idx], idx as u32, 1) {
        return complete(proxy, ctx, p, idx, e);
    }
    None
}

/// Sends part `idx` now, on a shared connection or the dedicated one `dedicated` says:
/// `count` commands whose replies are tagged `idx`, `idx + 1`, ... (a transaction is one
/// part of `queued + 2`). After an ASK, ASKING goes first; before a transaction's MULTI
/// it holds for the whole transaction.
pub(super) fn send_part(
    proxy: &Proxy,
    ctx: &mut Ctx,
    dedicated: &mut Option<Box<Dedicated>>,
    part: &Part,
    idx: u32,
    count: u32,
) -> Result<(), Bytes> {
    let (node, asking) = resolve(proxy, &part.target)?;
    if ctx.writes {
        ctx.client.wrote |= node.bit;
    }
    let req = BackendRequest {
        data: part.data(ctx.req).clone(),
        count,
        prefix: if asking { Prefix::Asking } else { Prefix::None },
        tag: Tag { seq: ctx.seq, part: idx },
        reply_to: ctx.reply_to.clone(),
        order: None,
        db: ctx.client.db,
    };
    let Some(d) = dedicated else {
        node.conn(ctx.client.proto, ctx.client.id).send(req);
        return Ok(());
    };
    let mut req = req;
    if d.block.is_some() {
        // blocked clients are served first-come: this one reaches the node after those
        // heatshield took before it
        req.order = Some(node.order.ticket());
    }
    if matches!(d.via, Via::Watch) {
        match ctx.client.modes.watch.as_ref().filter(|w| !w.voided).and_then(|w| w.lease.as_ref()) {
            Some(l) if Arc::ptr_eq(l.node(), &node) && !l.broken() => {
                l.conn().send(req);
                return Ok(());
            }
            // the slot moved or the pinned connection broke: the watch is void, and the
            // command goes the usual way (a blocking one on a connection of its own)
            _ => void_watch(ctx),
        }
        if d.block.is_none() {
            *dedicated = None;
            node.conn(ctx.client.proto, ctx.client.id).send(req);
            return Ok(());
        }
        d.via = Via::Own(None);
    }
    match &mut d.via {
        Via::Watch => {}
        Via::Own(lease) => {
            if lease.as_ref().is_none_or(|l| !Arc::ptr_eq(l.node(), &node) || l.broken()) {
                // after a redirection or a failover: a connection to the new owner
                if let Some(old) = lease.take() {
                    old.release(false);
                }
                let Some(l) = node.lease(ctx.client.proto) else {
                    return Err(errors::resp(&errors::no_dedicated(&node.addr, node.options().dedicated_max)));
                };
                *lease = Some(l);
            }
            if let Some(l) = lease {
                l.conn().send(req);
            }
        }
    }
    Ok(())
}

/// The client's WATCH no longer guards its keys: EXEC will answer nil.
pub(super) fn void_watch(ctx: &mut Ctx) {
    if let Some(w) = &mut ctx.client.modes.watch {
        w.voided = true;
    }
}

/// Sends one part again after [`RETRY_DELAY`], to whichever node owns its slot by then.
/// A part on a dedicated connection is handed back to its request then
/// ([`BackendError::Resend`]), which sends it on a connection it holds.
pub(super) fn send_later(proxy: &Proxy, ctx: &Ctx, dedicated: bool, part: &mut Part, idx: u32, count: u32) {
    // an ASK holds for the one query it answered: by the time this one goes again the
    // slot may have moved on, and ASKING there would create the key on a node that is
    // importing it while it still lives elsewhere
    if let Target::Ask(_, s) = part.target {
        part.target = Target::Slot(s);
    }
    if dedicated {
        let reply_to = ctx.reply_to.clone();
        let tag = Tag { seq: ctx.seq, part: idx };
        tokio::spawn(async move {
            tokio::time::sleep(RETRY_DELAY).await;
            let _ = reply_to.send(Delivery::reply(tag, Err(BackendError::Resend)));
        });
        return;
    }
    let wanted = part.rare().wanted.get_or_insert_with(|| Arc::new(AtomicBool::new(true))).clone();
    let cluster = proxy.cluster.clone();
    let target = part.target.clone();
    let data = part.data(ctx.req).clone();
    let reply_to = ctx.reply_to.clone();
    let (proto, affinity, db) = (ctx.client.proto, ctx.client.id, ctx.client.db);
    let tag = Tag { seq: ctx.seq, part: idx };
    tokio::spawn(async move {
        tokio::time::sleep(RETRY_DELAY).await;
        // the request was answered meanwhile (it expired: "no reply within the deadline")
        // or its client is gone: a retry now would run it after the client went on
        if !wanted.load(Ordering::Relaxed) || reply_to.is_closed() {
            return;
        }
        let node = match &target {
            Target::Slot(s) => cluster.topology().master_for_slot(*s).cloned(),
            Target::Node(n) | Target::Ask(n, _) | Target::Replica(n, ..) => Some(n.clone()),
        };
        match node {
            Some(n) => n.conn(proto, affinity).send(BackendRequest {
                data,
                count,
                prefix: if matches!(target, Target::Ask(..)) { Prefix::Asking } else { Prefix::None },
                tag,
                reply_to,
                order: None,
                db,
            }),
            None => {
                for k in 0..count {
                    let tag = Tag { part: tag.part + k, ..tag };
                    let _ = reply_to.send(Delivery::reply(tag, Err(BackendError::NotSent(Arc::from("unserved slot")))));
                }
            }
        }
    });
}

/// Points `part` at a redirection's target if the cluster announced that node (see
/// [`retry::follow`]); false, changing nothing, otherwise.
pub(super) fn follow(proxy: &Proxy, part: &mut Part, r: &Redirect) -> bool {
    let Some(pool) = retry::follow(&proxy.cluster, r) else { return false };
    match r {
        Redirect::Moved { .. } => {
            // a slot's part follows the slot map, which the MOVED patched (after an ASK
            // too: the slot is known)
            if let Target::Ask(_, s) = part.target {
                part.target = Target::Slot(s);
            } else if !matches!(part.target, Target::Slot(_)) {
                part.target = Target::Node(pool);
            }
            crate::metrics::global().moved.increment(1);
        }
        Redirect::Ask { slot, .. } => {
            part.target = Target::Ask(pool, *slot);
            crate::metrics::global().ask.increment(1);
        }
        // a keyless command: to that node, the slot map unchanged
        Redirect::Keyless { .. } => {
            part.target = Target::Node(pool);
            crate::metrics::global().moved.increment(1);
        }
    }
    true
}

/// Answers part `idx` with [`BackendError::Recheck`] once the topology has been
/// refreshed (see [`Cluster::fresh_topology`]); after [`RETRY_DELAY`] first if `wait`.
pub(super) fn recheck_later(proxy: &Proxy, ctx: &Ctx, idx: u32, wait: bool) {
    let cluster = proxy.cluster.clone();
    let reply_to = ctx.reply_to.clone();
    let tag = Tag { seq: ctx.seq, part: idx };
    tokio::spawn(async move {
        if wait {
            tokio::time::sleep(RETRY_DELAY).await;
        }
        cluster.fresh_topology().await;
        let _ = reply_to.send(Delivery::reply(tag, Err(BackendError::Recheck)));
    });
}
