//! A connection's subscriptions: SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE and their
//! UNSUBSCRIBEs answered as Redis answers them (one confirmation per name, counting the
//! connection's own subscriptions), with the backend side left to the shared
//! [`crate::services::pubsub::Hub`]; PUBLISH and SPUBLISH, whose counts include this heatshield's
//! subscribers as one Redis would count them.
//!
//! In RESP2 a subscribed connection may send only (P|S)SUBSCRIBE, (P|S)UNSUBSCRIBE,
//! PING, QUIT and RESET (see [`allowed_while_subscribed`]); in RESP3 anything, with
//! messages interleaved as push replies.

use bytes::Bytes;
use smallvec::smallvec;

use crate::command::{Command, Local, Route};
use crate::mailbox::Tag;
use crate::path::merge::Merge;
use crate::path::pending::{Ctx, Finish, Outcome, Part, Target, answered_elsewhere, start};
use crate::protocol::{Proto, Writer};
use crate::proxy::Proxy;
use crate::services::pubsub::{Kind, Subscriptions};

/// SUBSCRIBE / PSUBSCRIBE / SSUBSCRIBE (`sub`) or their UNSUBSCRIBE.
pub fn run(proxy: &Proxy, ctx: &mut Ctx, kind: Kind, sub: bool) -> Outcome {
    ctx.pushing = true;
    if sub { subscribe(proxy, ctx, kind) } else { unsubscribe(proxy, ctx, kind) }
}

fn subscribe(proxy: &Proxy, ctx: &mut Ctx, kind: Kind) -> Outcome {
    let req = ctx.req;
    let names: Vec<Bytes> = (1..req.argc()).map(|i| req.arg_bytes(i)).collect();
    if let Err(limit) = proxy.pubsub.room(names.len()) {
        return ctx.error(&crate::errors::too_many_subscriptions(limit));
    }
    let subs = ctx.client.modes.subs.get_or_insert_with(Box::default);
    let mut w = Writer::new(ctx.scratch, ctx.client.proto);
    for name in &names {
        subs.sets[kind as usize].insert(name.clone());
        w.push(3);
        w.bulk(kind.subscribed().as_bytes());
        w.bulk(name);
        w.int(subs.count(kind) as i64);
    }
    let reply = ctx.scratch.split().freeze();
    show(ctx);
    let tag = Tag { seq: ctx.seq, part: 0 };
    let resp3 = ctx.client.proto == Proto::Resp3;
    match proxy.pubsub.subscribe(ctx.client.id, ctx.reply_to, resp3, kind, &names, tag, reply) {
        Some(reply) => Outcome::Ready(reply),
        // the hub sends the confirmations once the backend confirmed
        None => answered_elsewhere(ctx, Target::Slot(0)),
    }
}

fn unsubscribe(proxy: &Proxy, ctx: &mut Ctx, kind: Kind) -> Outcome {
    let req = ctx.req;
    let empty = Subscriptions::default();
    let subs = ctx.client.modes.subs.as_deref().unwrap_or(&empty);
    // no names: every one of this kind
    let names: Vec<Bytes> = if req.argc() > 1 {
        (1..req.argc()).map(|i| req.arg_bytes(i)).collect()
    } else {
        subs.sets[kind as usize].iter().cloned().collect()
    };
    let mut w = Writer::new(ctx.scratch, ctx.client.proto);
    let mut removed = Vec::with_capacity(names.len());
    match ctx.client.modes.subs.as_deref_mut() {
        Some(subs) => {
            for name in names {
                let gone = subs.sets[kind as usize].remove(&name);
                w.push(3);
                w.bulk(kind.unsubscribed().as_bytes());
                w.bulk(&name);
                w.int(subs.count(kind) as i64);
                if gone {
                    removed.push(name);
                }
            }
            if subs.sets[kind as usize].is_empty() && req.argc() == 1 && removed.is_empty() {
                // subscribed to nothing of this kind: one reply all the same
                w.push(3);
                w.bulk(kind.unsubscribed().as_bytes());
                w.nil();
                w.int(subs.count(kind) as i64);
            }
        }
        None => {
            for name in names.iter().map(|n| &n[..]).chain((req.argc() == 1).then_some(&b""[..])) {
                w.push(3);
                w.bulk(kind.unsubscribed().as_bytes());
                if req.argc() == 1 {
                    w.nil()
                } else {
                    w.bulk(name)
                }
                w.int(0);
            }
        }
    }
    let reply = ctx.scratch.split().freeze();
    proxy.pubsub.unsubscribe(ctx.client.id, kind, &removed);
    if ctx.client.modes.subs.as_ref().is_some_and(|s| s.is_empty()) {
        ctx.client.modes.subs = None;
    }
    show(ctx);
    Outcome::Ready(reply)
}

/// What CLIENT LIST shows of the connection's subscriptions.
fn show(ctx: &mut Ctx) {
    for kind in Kind::ALL {
        let n = ctx.client.modes.subs.as_ref().map_or(0, |s| s.sets[kind as usize].len());
        ctx.client.info.subs[kind as usize].store(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// PUBLISH to the home master (the one the subscriptions of every heatshield live on),
/// SPUBLISH to the channel's owner; the count Redis answers is corrected to count this
/// heatshield's subscribers instead of its shared subscription.
pub fn publish(proxy: &Proxy, ctx: &mut Ctx, shard: bool) -> Outcome {
    let channel = ctx.req.arg(1);
    let (adjust, target) = if shard {
        (proxy.pubsub.spublish_adjust(channel), Target::Slot(crate::upstream::cluster::slot(channel)))
    } else {
        (proxy.pubsub.publish_adjust(channel), Target::Slot(0))
    };
    start(proxy, ctx, Finish::Merge(Merge::SumPlus(adjust)), smallvec![Part::new(ctx.req.raw().clone(), target)])
}

/// What a RESP2 connection with subscriptions may send (Redis's list).
pub fn allowed_while_subscribed(cmd: &Command) -> bool {
    matches!(cmd.route, Route::Subscribe(..) | Route::Local(Local::Ping | Local::Quit | Local::Reset))
}

/// Redis's refusal of any other command.
pub fn not_allowed(cmd: &Command) -> String {
    crate::errors::not_while_subscribed(&cmd.lower)
}
