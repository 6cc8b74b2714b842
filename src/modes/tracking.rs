//! CLIENT TRACKING, CACHING, GETREDIR and TRACKINGINFO: a client's client-side caching
//! mode, parsed and refused with Redis's texts; the keys and invalidations themselves are
//! [`crate::services::cache::clients`]'s.

use bytes::Bytes;

use crate::conn::flag;
use crate::errors;
use crate::mailbox::{Delivery, Tag};
use crate::path::pending::{Ctx, Outcome, Target, answered_elsewhere};
use crate::protocol::request::parse_i64;
use crate::protocol::{Proto, Request};
use crate::proxy::Proxy;
use crate::services::cache::clients::{ClientTracking, TrackingOptions};

/// `CLIENT TRACKING on|off [REDIRECT id] [PREFIX p ...] [BCAST] [OPTIN] [OPTOUT] [NOLOOP]`.
pub fn tracking(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    let mut m = TrackingOptions::default();
    let mut prefixes: Vec<Bytes> = Vec::new();
    let mut j = 3;
    while j < req.argc() {
        let more = j + 1 < req.argc();
        let opt = req.arg(j).to_ascii_lowercase();
        match opt.as_slice() {
            b"redirect" if more => {
                j += 1;
                if m.redirect != 0 {
                    return ctx.error(errors::REDIRECT_ONE);
                }
                let Some(id) = parse_i64(req.arg(j)) else { return ctx.error(errors::NOT_AN_INTEGER) };
                if id <= 0 || proxy.clients.get(id as u64).is_none() {
                    return ctx.error(errors::REDIRECT_GONE);
                }
                m.redirect = id as u64;
            }
            b"bcast" => m.bcast = true,
            b"optin" => m.optin = true,
            b"optout" => m.optout = true,
            b"noloop" => m.noloop = true,
            b"prefix" if more => {
                j += 1;
                prefixes.push(req.arg_bytes(j));
            }
            _ => return ctx.error(errors::SYNTAX),
        }
        j += 1;
    }
    match req.arg(2).to_ascii_lowercase().as_slice() {
        b"on" => {}
        b"off" => {
            if ctx.client.modes.tracking.take().is_some() {
                proxy.client_side.disable(ctx.client.id);
            }
            ctx.client.info.redir.store(-1, std::sync::atomic::Ordering::Relaxed);
            ctx.client.info.flags.store(ctx.client.flags(false), std::sync::atomic::Ordering::Relaxed);
            return ctx.reply(|w| w.ok());
        }
        _ => return ctx.error(errors::SYNTAX),
    }
    if !m.bcast && !prefixes.is_empty() {
        return ctx.error(errors::PREFIX_NEEDS_BCAST);
    }
    let old = ctx.client.modes.tracking.as_ref().map(|t| t.mode.clone());
    if let Some(o) = &old
        && o.bcast != m.bcast
    {
        return ctx.error(errors::BCAST_SWITCH);
    }
    if m.bcast && (m.optin || m.optout) {
        return ctx.error(errors::OPT_WITH_BCAST);
    }
    if m.optin && m.optout {
        return ctx.error(errors::OPTIN_AND_OPTOUT);
    }
    if let Some(o) = &old
        && ((m.optin && o.optout) || (m.optout && o.optin))
    {
        return ctx.error(errors::OPT_SWITCH);
    }
    // prefixes must not overlap: with the client's own, then with each other
    let existing: &[Bytes] = old.as_ref().map_or(&[], |o| &o.prefixes);
    for (i, p) in prefixes.iter().enumerate() {
        for e in existing {
            if p != e && (p.starts_with(e) || e.starts_with(p)) {
                return ctx.error(&errors::prefix_overlaps(p, e, true));
            }
        }
        for q in &prefixes[i + 1..] {
            if p.starts_with(q) || q.starts_with(p) {
                return ctx.error(&errors::prefix_overlaps(p, q, false));
            }
        }
    }
    // on again: the new options replace the old, prefixes add up
    m.prefixes = existing.to_vec();
    for p in prefixes {
        if !m.prefixes.contains(&p) {
            m.prefixes.push(p);
        }
    }
    // (Redis keeps them sorted, and lists them so)
    m.prefixes.sort();
    // where the invalidations go: the client itself, or its redirect target
    let (tx, resp3) = if m.redirect != 0 {
        match proxy.clients.get(m.redirect) {
            Some(target) => (target.reply_tx(), target.resp.load(std::sync::atomic::Ordering::Relaxed) >= 3),
            None => return ctx.error(errors::REDIRECT_GONE),
        }
    } else {
        (ctx.reply_to.clone(), ctx.client.proto == Proto::Resp3)
    };
    // RESP2 with no redirect: Redis accepts it and has nowhere to send the invalidations
    let deliver = resp3 || m.redirect != 0;
    proxy.client_side.enable(ctx.client.id, tx, resp3, deliver, &m);
    ctx.client.info.redir.store(m.redirect as i64, std::sync::atomic::Ordering::Relaxed);
    ctx.client.modes.tracking = Some(Box::new(ClientTracking { mode: m, caching: None }));
    ctx.client.info.flags.store(ctx.client.flags(false), std::sync::atomic::Ordering::Relaxed);
    let masters = proxy.cluster.topology().masters.len();
    if proxy.client_side.reporting() >= masters {
        return ctx.reply(|w| w.ok());
    }
    // The first client to track: every master's invalidation connection is asked to report
    // every key. +OK once they do (at most 3 s), so nothing this client reads goes
    // unreported (and it is not told to drop everything when they start).
    let (cs, tx, tag) = (proxy.client_side.clone(), ctx.reply_to.clone(), Tag { seq: ctx.seq, part: 0 });
    tokio::spawn(async move {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while cs.reporting() < masters && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let _ = tx.send(Delivery::reply(tag, Ok(Bytes::from_static(b"+OK\r\n"))));
    });
    answered_elsewhere(ctx, Target::Slot(0))
}

/// `CLIENT CACHING yes|no`: whether the next command's keys are tracked (OPTIN / OPTOUT).
pub fn caching(ctx: &mut Ctx, req: &Request) -> Outcome {
    let Some(t) = ctx.client.modes.tracking.as_deref_mut() else {
        return ctx.error(errors::CACHING_NOT_OPT);
    };
    match req.arg(2).to_ascii_lowercase().as_slice() {
        b"yes" if t.mode.optin => t.caching = Some(true),
        b"yes" => return ctx.error(errors::CACHING_YES_NOT_OPTIN),
        b"no" if t.mode.optout => t.caching = Some(false),
        b"no" => return ctx.error(errors::CACHING_NO_NOT_OPTOUT),
        _ => return ctx.error(errors::SYNTAX),
    }
    ctx.reply(|w| w.ok())
}

/// `CLIENT GETREDIR`: -1 when not tracking, 0 without a redirect, else the target's id.
pub fn getredir(ctx: &mut Ctx) -> Outcome {
    let r = ctx.client.modes.tracking.as_ref().map_or(-1, |t| t.mode.redirect as i64);
    ctx.reply(|w| w.int(r))
}

/// `CLIENT TRACKINGINFO`: flags, redirect and prefixes, in Redis's order.
pub fn trackinginfo(ctx: &mut Ctx) -> Outcome {
    let t = ctx.client.modes.tracking.clone();
    ctx.reply(|w| {
        w.map(3);
        w.bulk(b"flags");
        match &t {
            None => {
                w.set(1);
                w.bulk(b"off");
            }
            Some(t) => {
                let m = &t.mode;
                let flags: Vec<&[u8]> = [
                    (true, &b"on"[..]),
                    (m.bcast, b"bcast"),
                    (m.optin, b"optin"),
                    (m.optout, b"optout"),
                    (m.optin && t.caching == Some(true), b"caching-yes"),
                    (m.optout && t.caching == Some(false), b"caching-no"),
                    (m.noloop, b"noloop"),
                ]
                .into_iter()
                .filter_map(|(on, f)| on.then_some(f))
                .collect();
                w.set(flags.len());
                for f in flags {
                    w.bulk(f);
                }
            }
        }
        w.bulk(b"redirect");
        w.int(t.as_ref().map_or(-1, |t| t.mode.redirect as i64));
        w.bulk(b"prefixes");
        let prefixes = t.as_ref().map(|t| t.mode.prefixes.clone()).unwrap_or_default();
        w.array(prefixes.len());
        for p in prefixes {
            w.bulk(&p);
        }
    })
}

/// CLIENT LIST's tracking flags (`t`, `B`) are kept with the other flags.
pub const FLAGS: [(u8, char); 2] = [(flag::TRACKING, 't'), (flag::BCAST, 'B')];
