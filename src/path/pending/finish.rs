//! A part's answer in: the write's cache invalidation applied (before the client can see
//! the reply), and once every part is in, the replies merged into the client's one.

use super::*;

pub(super) fn complete(proxy: &Proxy, ctx: &mut Ctx, p: &mut Full, idx: usize, data: Bytes) -> Option<Bytes> {
    p.parts[idx].reply = Some(data);
    p.remaining -= 1;
    if let Some(parent) = p.parts[idx].parent() {
        return piece_done(proxy, ctx, p, parent as usize);
    }
    if p.remaining > 0 {
        return None;
    }
    if let Some(d) = &mut p.dedicated
        && let Via::Own(lease) = &mut d.via
        && let Some(l) = lease.take()
    {
        l.release(false);
    }
    // The write has happened: whatever was filled meanwhile must not outlive this moment,
    // which comes before its reply reaches the client.
    for k in p.invalidate.drain(..) {
        proxy.cache.invalidate(&k, crate::services::cache::Cause::Write);
    }
    if (p.write_hot_generation.is_some() || p.flush == Drops::Everything) && proxy.migration.on() {
        migrated(proxy, ctx, p);
    }
    match p.flush {
        Drops::Nothing => {}
        Drops::Everything => proxy.cache.flush(crate::services::cache::Cause::Flush),
        Drops::ItsNodes => {
            let topo = proxy.cluster.topology();
            for part in &p.parts {
                if let Ok((node, _)) = resolve_in(&topo, &part.target) {
                    proxy.cache.drop_node(node, crate::services::cache::Cause::Write);
                }
            }
        }
    }
    // a tracking client hears of its own write right after the reply (everyone else from
    // Redis), so its own cache never gives it back what it overwrote
    let mut notice = None;
    if p.tracked_write {
        match &p.finish {
            Finish::Transaction(tx) => {
                let keys: Vec<&[u8]> = tx.write_keys.iter().map(|k| &k[..]).collect();
                notice = proxy.client_side.wrote(&keys, ctx.client.id);
            }
            _ => {
                if let Ok(cmd) = proxy.commands.lookup(ctx.req)
                    && let Ok(keys) = keys_of(cmd, ctx.req)
                {
                    let keys: Vec<&[u8]> = keys.iter().map(|&k| ctx.req.arg(k as usize)).collect();
                    notice = proxy.client_side.wrote(&keys, ctx.client.id);
                }
            }
        }
    }
    if let Some(g) = p.write_hot_generation
        && g != proxy.cache.hot_generation()
    {
        // keys turned hot while the write was out: it may have raced their first fill
        match &p.finish {
            Finish::Transaction(tx) => {
                for k in &tx.write_keys {
                    if proxy.cache.tracked(k) {
                        proxy.cache.invalidate(k, crate::services::cache::Cause::Write);
                    }
                }
            }
            _ => invalidate_keys(proxy, ctx.req),
        }
    }
    let reply = assemble(proxy, ctx, p);
    if proxy.colocate.active()
        && let Some(n) = &notice
        && let Some(restored) = proxy.colocate.restore_push(n)
    {
        notice = Some(restored);
    }
    match notice {
        // the notice follows the reply in the same place of the client's reply order
        Some(n) => Some([reply, n].concat().into()),
        None => Some(reply),
    }
}

/// Drops the cached replies of the request's hot keys (the rare path of
/// [`Full::write_hot_generation`]).
pub(super) fn invalidate_keys(proxy: &Proxy, req: &Request) {
    let Ok(cmd) = proxy.commands.lookup(req) else { return };
    let Ok(keys) = keys_of(cmd, req) else { return };
    for k in keys {
        let key = req.arg(k as usize);
        if proxy.cache.tracked(key) {
            proxy.cache.invalidate(key, crate::services::cache::Cause::Write);
        }
    }
}

/// A write while dual-write is on has run: its keys (in the cluster's names) are noted for
/// their copy to the target (crate::services::migration::dual).
fn migrated(proxy: &Proxy, ctx: &Ctx, p: &Full) {
    if p.flush == Drops::Everything {
        proxy.migration.flushed();
    }
    match &p.finish {
        Finish::Transaction(tx) => proxy.migration.wrote(tx.write_keys.iter()),
        _ => {
            if let Ok(cmd) = proxy.commands.lookup(ctx.req)
                && let Ok(keys) = keys_of(cmd, ctx.req)
            {
                proxy.migration.wrote(keys.iter().map(|&k| ctx.req.arg(k as usize)));
                // a lock's fencing counter lives beside its key
                if cmd.lower.starts_with("lock.")
                    && let Some(&k) = keys.first()
                {
                    proxy.migration.wrote([crate::services::locks::fence_key(ctx.req.arg(k as usize))]);
                }
            }
        }
    }
}

/// Merges the replies of a finished request.
pub(super) fn assemble(proxy: &Proxy, ctx: &mut Ctx, p: &mut Full) -> Bytes {
    match &p.finish {
        Finish::Merge(Merge::Pass) => p.parts[0].reply.take().unwrap_or_default(),
        Finish::Script(_) => {
            let reply = p.parts[0].reply.take().unwrap_or_default();
            match errors::with_undeclared_key_hint(&reply) {
                Some(mut hinted) if proxy.colocate.active() => {
                    let more = colocation_hint(proxy, ctx.req);
                    hinted.splice(hinted.len() - 2..hinted.len() - 2, more.into_bytes());
                    Bytes::from(hinted)
                }
                Some(hinted) => Bytes::from(hinted),
                None => reply,
            }
        }
        Finish::Transaction(tx) if tx.positions.is_empty() => p.parts[0].reply.take().unwrap_or_default(),
        Finish::Transaction(tx) => {
            let replies: Vec<Bytes> = p.parts.iter_mut().map(|x| x.reply.take().unwrap_or_default()).collect();
            let (proto, total) = (ctx.client.proto, tx.total as usize);
            crate::path::merge::merge_exec(&replies, &tx.positions, total, &tx.splits, proto, ctx.scratch);
            ctx.scratch.split().freeze()
        }
        Finish::Lock(r) => {
            use crate::services::locks::LockCmd;
            let reply = p.parts[0].reply.take().unwrap_or_default();
            match (r.cmd, Value::parse(&reply)) {
                (LockCmd::Acquire, Ok((Value::Int(t), _))) if t > 0 && r.keepalive => {
                    ctx.client.used_locks = true;
                    ctx.client.keepalive_locks = true;
                    proxy.locks.acquired(ctx.client.id, r);
                }
                (LockCmd::Release, Ok((Value::Int(1), _))) => {
                    proxy.locks.released(ctx.client.id, &r.key, ctx.client.keepalive_locks)
                }
                _ => {}
            }
            crate::services::locks::client_reply(r, &reply, ctx.client.proto, ctx.scratch)
        }
        Finish::Masters(build) => {
            let replies: Vec<(String, Bytes)> = p
                .parts
                .iter_mut()
                .map(|x| {
                    let addr = match &x.target {
                        Target::Node(n) => n.addr.to_string(),
                        _ => String::new(),
                    };
                    (addr, x.reply.take().unwrap_or_default())
                })
                .collect();
            let each: Vec<(&str, &Bytes)> = replies.iter().map(|(a, r)| (a.as_str(), r)).collect();
            build(proxy, ctx, &each)
        }
        Finish::Merge(merge) => {
            // the pieces of a part split after TRYAGAIN come after every part: not replies
            // of their own (one allocation, of the exact size: a filter would lose it)
            let whole = p.parts.iter().position(|x| x.parent().is_some()).unwrap_or(p.parts.len());
            let replies: Vec<Bytes> = p.parts[..whole].iter_mut().map(|x| x.reply.take().unwrap_or_default()).collect();
            // Any error among the parts is the answer (Redis would have failed the whole command).
            if let Some(e) = replies.iter().find(|r| r.first() == Some(&b'-')) {
                return e.clone();
            }
            match merge_replies(merge, &replies, ctx.client.proto, ctx.scratch) {
                Ok(b) => b,
                Err(what) => {
                    let mut w = Writer::new(ctx.scratch, ctx.client.proto);
                    w.error(&errors::merge_failed(what));
                    ctx.scratch.split().freeze()
                }
            }
        }
    }
}

/// For a script Redis refused an undeclared key: the colocation rule its declared keys
/// are under, and the `ARGV` arguments that are key names a rule covers (what a script
/// building names from them reaches is the name without the tag).
#[cold]
fn colocation_hint(proxy: &Proxy, req: &Request) -> String {
    let rules = proxy.colocate.rules();
    let Ok(cmd) = proxy.commands.lookup(req) else { return String::new() };
    let keys = keys_of(cmd, req).unwrap_or_default();
    let declared = keys.iter().find_map(|&k| {
        let name = rules.client_name(req.arg(k as usize))?;
        let rule = rules.rule_of(name)?;
        let stored = req.arg(k as usize);
        let tag = &stored[1..stored.len() - name.len() - 1];
        Some((rule.spec.name.clone(), String::from_utf8_lossy(tag).into_owned()))
    });
    let first_argv = keys.iter().max().map_or(3, |&k| k as usize + 1);
    let argv: Vec<(usize, String, String)> = (first_argv..req.argc())
        .filter_map(|i| {
            let rule = rules.rule_of(req.arg(i))?;
            Some((i + 1 - first_argv, String::from_utf8_lossy(req.arg(i)).into_owned(), rule.spec.name.clone()))
        })
        .collect();
    errors::undeclared_key_rule_hint(declared.as_ref().map(|(r, t)| (r.as_str(), t.as_str())), &argv)
}
