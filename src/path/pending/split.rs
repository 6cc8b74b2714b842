//! A multi-key part that met TRYAGAIN (its keys are being migrated and not all are on
//! one node yet) split into one command per key ([`per_key`]), whose replies become the
//! part's again ([`piece_done`]).

use bytes::Bytes;
use smallvec::SmallVec;

use super::send::{send_later, send_part};
use super::{Ctx, Full, Part, Pieces, Target, complete};
use crate::command::{Route, Split};
use crate::errors;
use crate::path::merge::{Merge, merge_replies};
use crate::protocol::Request;
use crate::proxy::Proxy;

/// The split command `req` is, if it is one (MGET, MSET, DEL, UNLINK, EXISTS, TOUCH).
pub(super) fn splittable(proxy: &Proxy, req: &Request) -> Option<Split> {
    match proxy.commands.lookup(req).ok()?.route {
        Route::Split(kind) => Some(kind),
        _ => None,
    }
}

/// Splits part `idx` (a multi-key command of one slot that met TRYAGAIN) into one
/// command per key, sent now; their replies become the part's (see [`piece_done`]). A
/// part with one key, or not a command, is retried as any other TRYAGAIN.
pub(super) fn per_key(proxy: &Proxy, ctx: &mut Ctx, p: &mut Full, idx: usize, kind: Split) -> Option<Bytes> {
    let step = if kind == Split::Mset { 2 } else { 1 };
    let first = p.parts.len() as u32;
    let part = &mut p.parts[idx];
    let cmd = Request::parse(part.data(ctx.req)).filter(|r| r.argc() > 1 + step);
    let Some(cmd) = cmd else {
        part.retries += 1;
        proxy.cluster.request_refresh();
        send_later(proxy, ctx, false, part, idx as u32, 1);
        return None;
    };
    crate::metrics::global().tryagain_per_key.increment(1);
    let count = ((cmd.argc() - 1) / step) as u32;
    part.rare().pieces = Some(Pieces::Whole { first, count, left: count, kind });
    // the part is complete when its pieces are: it counts as one of them until then
    p.remaining += count;
    for k in 0..count as usize {
        let a = 1 + k * step;
        let mut args: SmallVec<[&[u8]; 3]> = smallvec::smallvec![cmd.arg(0)];
        args.extend((a..a + step).map(|i| cmd.arg(i)));
        let key = cmd.arg(a);
        let mut piece =
            Part::new(Request::from_args(&args).raw().clone(), Target::Slot(crate::upstream::cluster::slot(key)));
        piece.rare().pieces = Some(Pieces::Of(idx as u32));
        p.parts.push(piece);
    }
    for k in first as usize..p.parts.len() {
        if let Err(e) = send_part(proxy, ctx, &mut p.dedicated, &p.parts[k], k as u32, 1)
            && let Some(done) = complete(proxy, ctx, p, k, e)
        {
            return Some(done);
        }
    }
    None
}

/// One piece of part `parent` is in: once all are, their replies merged are the part's
/// (the first error among them, if any).
pub(super) fn piece_done(proxy: &Proxy, ctx: &mut Ctx, p: &mut Full, parent: usize) -> Option<Bytes> {
    let Some(Pieces::Whole { first, count, left, kind }) =
        p.parts[parent].rare.as_mut().and_then(|r| r.pieces.as_mut())
    else {
        return None;
    };
    *left -= 1;
    if *left > 0 {
        return None;
    }
    let (first, count, kind) = (*first as usize, *count as usize, *kind);
    let replies: Vec<Bytes> =
        p.parts[first..first + count].iter_mut().map(|x| x.reply.take().unwrap_or_default()).collect();
    let merged = match replies.iter().find(|r| r.first() == Some(&b'-')) {
        Some(e) => e.clone(),
        None => {
            let merge = match kind {
                Split::Mget => Merge::Mget(Box::new(crate::path::merge::Mget {
                    positions: (0..count as u32).map(|j| smallvec::smallvec![j]).collect(),
                    total: count,
                    cached: Vec::new(),
                })),
                Split::Mset => Merge::Mset,
                Split::Sum => Merge::Sum,
            };
            match merge_replies(&merge, &replies, ctx.client.proto, ctx.scratch) {
                Ok(b) => b,
                Err(what) => errors::resp(&errors::merge_failed(what)),
            }
        }
    };
    complete(proxy, ctx, p, parent, merged)
}
