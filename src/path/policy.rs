//! Policy: the one admission step every request bound for Redis passes, whatever its
//! route, always in this order:
//!
//! 1. **keys**: found once, as argument positions (a lock command is parsed here), and
//!    which features' key patterns may see them under the client's names, one load for
//!    all features ([`note_keys`], [`crate::glob::KeyFeatures`]);
//! 2. **cache lookup**: for a read while keys are hot, which of its keys the hot-key cache
//!    answers (it must be known before charging: a key answered from the cache draws only
//!    on rules with `count_cached`);
//! 3. **rate limits**: every key checked, then all charged or none (`-THROTTLED`);
//! 4. **cache plan**: the answer from the cache, or a write's invalidation plan (hot keys
//!    dropped now and again when its reply comes), or a flush's;
//!
//! then the request goes to its [`crate::path::route`].

use std::sync::atomic::Ordering;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::command::{Command, FanOut, Route, Split, checked_keys_of};
use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::path::route;
use crate::proxy::Proxy;
use crate::upstream::cluster::slot;

/// What the cache lookup found for a read.
enum Lookup {
    /// Not a cacheable read of hot keys: Redis answers.
    None,
    /// One hot key, not in the cache: Redis answers, as the cache's fill.
    Fill(std::sync::Arc<crate::upstream::cluster::NodePool>),
    /// One hot key, answered from the cache.
    Hit(Bytes),
    /// MGET: these keys (by position among the keys) are answered from the cache.
    Some(Vec<(u32, Bytes)>),
}

/// Admits a request with a `Forward`, `Split`, `FanOut`, `AnyMaster` or `Lock` route, and
/// routes it.
pub fn admit(proxy: &Proxy, ctx: &mut Ctx, cmd: &Command, route: Route) -> Outcome {
    let req = ctx.req;
    // 1. keys
    let mut lock = None;
    let keys: SmallVec<[u32; 4]> = match route {
        Route::FanOut(_) | Route::AnyMaster => SmallVec::new(),
        Route::Split(Split::Mset) if !(req.argc() - 1).is_multiple_of(2) => {
            return ctx.error(&errors::wrong_arity(&cmd.lower));
        }
        Route::Lock(_) if crate::command::reserved(req.arg(1)) => return ctx.error(errors::RESERVED_KEY),
        Route::Lock(kind) => match crate::services::locks::parse(kind, &cmd.lower, req) {
            Ok(r) => {
                lock = Some(r);
                SmallVec::from_slice(&[1])
            }
            Err(e) => return ctx.error(&e),
        },
        _ => match checked_keys_of(cmd, req) {
            Ok(k) => k,
            Err(e) => return ctx.error(e),
        },
    };
    note_keys(proxy, ctx, &keys);
    let key = |k: u32| req.arg(k as usize);

    // 2. cache lookup
    let cache = &proxy.cache;
    let mget = route == Route::Split(Split::Mget);
    let mut found = Lookup::None;
    // (under WATCH reads go to the master, on the pinned connection)
    if cache.enabled && !keys.is_empty() && cmd.is_readonly() && lock.is_none() && ctx.client.modes.watch.is_none() {
        if mget {
            for &k in &keys {
                cache.sample(key(k));
            }
        } else {
            cache.sample(key(keys[0]));
        }
        // Only a client with nothing in flight may be answered out of band: its earlier
        // commands (a write to this key, say) must have been applied.
        if ctx.client.inflight == 0 && cache.active() {
            if mget {
                found = Lookup::Some(hits(proxy, ctx, &keys));
            } else if keys.len() == 1 && cache.may_answer(cmd, req, false) && cache.tracked(key(keys[0])) {
                // (not under WATCH: the test above)
                let s = slot(key(keys[0]));
                let Some(owner) = ctx.topology(proxy).master_for_slot(s).cloned() else {
                    // no master serves the slot now: a stale answer, if a rule allows one
                    if let Some(r) = crate::path::pending::stale_answer(proxy, ctx, cmd) {
                        return Outcome::Ready(r);
                    }
                    return ctx.error(&errors::slot_not_served(s));
                };
                found = match cache.lookup(cmd.id, ctx.client.proto, ctx.client.db, req, key(keys[0]), &owner, ctx.now)
                {
                    Some(reply) => Lookup::Hit(reply),
                    None => Lookup::Fill(owner),
                };
            }
        }
    }

    // 3. rate limits: all keys charged, or none
    let cached = match &found {
        Lookup::Some(cached) => Cached::These(cached),
        Lookup::Hit(_) => Cached::All,
        _ => Cached::None,
    };
    if let Err(t) = charge(proxy, ctx, cmd, &keys, cached) {
        return ctx.error(&t.message());
    }
    match &found {
        Lookup::Hit(_) => cache.answered(1, 0),
        Lookup::Fill(_) => cache.answered(0, 1),
        Lookup::Some(cached) => cache.answered(cached.len() as u64, 0),
        Lookup::None => {}
    }

    let key = |k: u32| req.arg(k as usize);

    // 4. cache plan
    if cache.enabled && cmd.is_write() && cmd.flags & crate::command::flags::MODULE != 0 {
        ctx.flush = crate::path::pending::Drops::ItsNodes;
    }
    // (and, while dual-write is on, what has the write's keys noted for their copy once
    // it has run: crate::path::pending::finish)
    if (cache.enabled || proxy.migration.on()) && cmd.is_write() && !keys.is_empty() {
        ctx.write_hot_generation = Some(cache.hot_generation());
        if cache.active() {
            // dropped now, so no fill started from here on is kept, and again when the
            // write's reply comes (see crate::path::pending::Pending)
            for &k in &keys {
                if cache.tracked(key(k)) {
                    cache.invalidate_sent(key(k));
                    ctx.invalidate.push(req.arg_bytes(k as usize));
                }
            }
        }
    }
    if route == Route::FanOut(FanOut::Flush) {
        if !proxy.live.allow_flush.load(Ordering::Relaxed) {
            return ctx.error(&errors::flush_disabled(&cmd.name));
        }
        ctx.flush = crate::path::pending::Drops::Everything;
    }

    if let Some(r) = lock {
        // (the lock task writes to the key's master: WAIT answers for it)
        if let Some(m) = ctx.topology(proxy).master_for_slot(crate::upstream::cluster::slot::slot(key(1))) {
            ctx.client.wrote |= m.bit;
        }
        return route::lock(proxy, ctx, r);
    }
    // (the cache's answers first, then the route alone: a match on both moved them into
    // a pair first)
    let cached = match found {
        Lookup::None => Vec::new(),
        Lookup::Hit(reply) => {
            ctx.cached = true;
            return Outcome::Ready(reply);
        }
        Lookup::Fill(owner) => return route::fill(proxy, ctx, cmd, keys[0], owner),
        Lookup::Some(cached) => cached,
    };
    match route {
        Route::Forward if !cmd.keys.is_script() => route::forward(proxy, ctx, &keys),
        Route::Split(kind) => route::split(proxy, ctx, kind, cached),
        Route::FanOut(kind) => route::fan_out(proxy, ctx, kind),
        Route::AnyMaster => route::any_master(proxy, ctx),
        Route::Block => route::block(proxy, ctx, cmd, &keys),
        _ if cmd.keys.is_script() => route::script(proxy, ctx, &keys),
        _ => route::forward(proxy, ctx, &keys),
    }
}

/// Which of a command's keys the hot-key cache answers (they count only for rules with
/// `count_cached`).
pub enum Cached<'c> {
    None,
    All,
    /// By position among the keys.
    These(&'c [(u32, Bytes)]),
}

/// Admission's note of the request's keys (`keys`: argument positions), for every path
/// that admits keys (a request sent now, through [`admit`], and a command queued in a
/// transaction, [`crate::modes::transaction`]): the first key, for the big-key log, and
/// which features' patterns may see some key under its client name (`ctx.facts`), one
/// load for all of them (most requests name one key), which [`charge`] and the route's
/// read policy look at.
#[inline(always)]
pub fn note_keys(proxy: &Proxy, ctx: &mut Ctx, keys: &[u32]) {
    ctx.first_key = keys.first().copied().unwrap_or(0);
    ctx.facts = match proxy.features.some() {
        0 => 0,
        _ => keys.iter().fold(0, |f, &k| f | proxy.features.of(ctx.asked.arg(k as usize))),
    };
}

/// Admission's rate-limit step, the one every path that admits keys takes (a request
/// sent now, through [`admit`], and a command queued in a transaction,
/// [`crate::modes::transaction`]): every key of `keys` (argument positions of the
/// request) checked under the client's name (`ctx.asked`, and a stored name the client
/// sent itself taken back to the name it stores), a rule's pattern and a key's budget
/// being written for the names the client knows ([`crate::services::colocate`]), then
/// all charged, or none; after [`note_keys`], whose `ctx.facts` skips it when no rule
/// may see the keys. (Inlined: a call cost more than the check without rules.)
#[inline(always)]
pub fn charge(
    proxy: &Proxy,
    ctx: &mut Ctx,
    cmd: &Command,
    keys: &[u32],
    cached: Cached,
) -> Result<(), crate::services::ratelimit::Throttled> {
    if ctx.facts & crate::glob::feature::RATE == 0 {
        return Ok(());
    }
    let req = ctx.asked;
    let colocated = proxy.colocate.active();
    let key = |k: u32| {
        let n = req.arg(k as usize);
        // (a stored name starts with its tag)
        match colocated && n.first() == Some(&b'{') {
            true => proxy.colocate.client_key(n),
            false => n,
        }
    };
    let (rl, now) = (&mut ctx.client.rl, ctx.now);
    if let ([k], Cached::None) = (keys, &cached) {
        return proxy.ratelimit.check_in(rl, cmd, std::iter::once(key(*k)), now, false);
    }
    match cached {
        Cached::These(these) => {
            let is_cached = |i: usize| these.iter().any(|(p, _)| *p as usize == i);
            let keys = keys.iter().enumerate().map(|(i, &k)| (key(k), is_cached(i)));
            proxy.ratelimit.check_mixed(rl, cmd, keys, now)
        }
        Cached::All => proxy.ratelimit.check_in(rl, cmd, keys.iter().map(|&k| key(k)), now, true),
        Cached::None => proxy.ratelimit.check_in(rl, cmd, keys.iter().map(|&k| key(k)), now, false),
    }
}

/// MGET while keys are hot: the keys (by position among `keys`) the cache answers.
fn hits(proxy: &Proxy, ctx: &Ctx, keys: &[u32]) -> Vec<(u32, Bytes)> {
    let mut cached = Vec::new();
    let topo = ctx.topology(proxy);
    for (i, &k) in keys.iter().enumerate() {
        let key = ctx.req.arg(k as usize);
        if proxy.cache.tracked(key)
            && let Some(owner) = topo.master_for_slot(slot(key))
            && let Some(r) = proxy.cache.lookup_get(ctx.client.proto, ctx.client.db, key, owner, ctx.now)
        {
            cached.push((i as u32, r));
        }
    }
    cached
}
