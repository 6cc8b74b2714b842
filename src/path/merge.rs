//! Merge: how the replies of a request's parts become the one reply a single Redis would
//! give (split MGET in request order, sums, KEYS, SCAN cursors across masters, ...).
//! Pure functions of reply bytes; no I/O and no shared state.

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use crate::protocol::reply::{Value, reply_len};
use crate::protocol::request::parse_i64;
use crate::protocol::{Proto, Writer};

/// Bits of a proxy SCAN cursor that name the master.
pub const SCAN_NODE_BITS: u32 = 10;

/// How the parts' replies become one.
pub enum Merge {
    /// One part; its reply is the reply.
    Pass,
    /// Split MGET: for each part, the positions of its keys in the request.
    /// (Boxed, as the other large variants: every request carries a [`Merge`], and its
    /// size is copied with it.)
    Mget(Box<Mget>),
    Mset,
    Sum,
    Keys,
    Scan {
        node: usize,
        nodes: usize,
    },
    RandomKey,
    Dbsize,
    AllSame,
    /// SCRIPT EXISTS; `known`: the scripts heatshield can send whole ([`crate::services::scripts`]).
    ScriptExists {
        known: Vec<bool>,
    },
    /// Integers summed, plus a correction (PUBLISH, PUBSUB NUMPAT: see crate::services::pubsub).
    SumPlus(i64),
    /// Arrays merged without repeats, in first-seen order (PUBSUB CHANNELS).
    Union,
    /// PUBSUB NUMSUB: `[channel, count, ...]` from each master, counts summed per channel,
    /// plus a correction per channel.
    NumSub {
        adjust: Vec<i64>,
    },
    /// SLOWLOG GET / COMMANDLOG GET: every master's entries, newest first (by time, then
    /// id), the first `count` (`None`: all).
    Log {
        count: Option<usize>,
    },
    /// CLUSTER SLOT-STATS: every master's slots; by slot (SLOTSRANGE), or by a statistic
    /// (`ORDERBY`: its name, how many, descending), ties by slot, as one node orders them.
    SlotStats {
        order: Option<Box<(Vec<u8>, usize, bool)>>,
    },
    /// COMMAND and COMMAND COUNT / INFO / LIST / DOCS from one master: see [`Commands`].
    Commands(Box<Commands>),
}

/// A split MGET's merge: for each part, the positions of its keys in the request.
pub struct Mget {
    pub positions: Vec<SmallVec<[u32; 4]>>,
    pub total: usize,
    /// Keys answered from the hot-key cache: position and `GET` reply.
    pub cached: Vec<(u32, Bytes)>,
}

/// One master's description of its commands made heatshield's: the commands heatshield
/// refuses left out, its own added.
pub struct Commands {
    pub kind: CommandsKind,
    /// Lowercase names of the top-level commands heatshield refuses.
    pub refused: std::collections::HashSet<Vec<u8>>,
    /// Lowercase `parent|sub` names of the subcommands it refuses of the others.
    pub refused_subs: std::collections::HashSet<Vec<u8>>,
    pub own: Vec<OwnCommand>,
}

/// Which COMMAND form.
pub enum CommandsKind {
    /// `COMMAND`: every command's entry.
    All,
    /// `COMMAND COUNT`, asked of the master as `COMMAND` (its count would include what
    /// heatshield refuses, and `COMMAND LIST` names subcommands too).
    Count,
    /// `COMMAND INFO name ...`: an entry (or nil) per name asked, lowercase.
    Info(Vec<Vec<u8>>),
    /// `COMMAND LIST [FILTERBY ...]`: heatshield's own names only without a filter, or
    /// those a `PATTERN` filter matches.
    List { own: bool, pattern: Option<Vec<u8>> },
    /// `COMMAND DOCS [name ...]`: name / docs pairs (heatshield's own have none).
    Docs,
}

/// One of heatshield's own commands, as `COMMAND` describes it.
pub struct OwnCommand {
    /// Lowercase.
    pub name: String,
    pub arity: i32,
    pub flags: &'static [&'static str],
    /// Its one key is argument 1 (the lock commands).
    pub key: bool,
}

/// A client's SCAN cursor: which master (by index) and that master's own cursor; `None`
/// when it names no master of `masters`.
pub fn scan_cursor(arg: &[u8], masters: usize) -> Option<(usize, u64)> {
    let cursor = std::str::from_utf8(arg).ok()?.parse::<u64>().ok()?;
    let node = (cursor & ((1 << SCAN_NODE_BITS) - 1)) as usize;
    (node < masters).then_some((node, cursor >> SCAN_NODE_BITS))
}

/// Merges the array replies of a split MGET (one per [`SlotGroup`], in group order) and
/// the values answered from the cache into one array in request order. Elements are
/// copied as the bytes Redis sent.
pub fn merge_mget(
    replies: &[Bytes],
    groups: &[SmallVec<[u32; 4]>],
    total: usize,
    cached: &[(u32, Bytes)],
    out: &mut BytesMut,
) -> Result<(), &'static str> {
    let mut slots: Vec<&[u8]> = vec![&[]; total];
    for (p, v) in cached {
        slots[*p as usize] = v;
    }
    for (r, pos) in replies.iter().zip(groups) {
        let (n, elems) = array_elements(r)?;
        if n != pos.len() {
            return Err("MGET part returned the wrong number of values");
        }
        for (e, &p) in elems.into_iter().zip(pos.iter()) {
            slots[p as usize] = e;
        }
    }
    crate::protocol::request::write_array_header(out, total);
    for e in slots {
        out.extend_from_slice(e);
    }
    Ok(())
}

/// Merges the EXEC replies of a transaction run as one native transaction per slot
/// (`transactions.cross_slot = "per-node"`) into one array in the client's order: an
/// array's elements go to their commands' positions; a part that did not run (or may not
/// have: EXECABORT, an error) gives each of its commands its reply, so the client sees
/// which commands ran. A command queued as one command per slot (`splits`) gets one
/// reply: its parts' merged as outside a transaction (the first error, if any).
pub fn merge_exec(
    replies: &[Bytes],
    positions: &[Vec<u32>],
    total: usize,
    splits: &[crate::conn::multi::TxSplit],
    proto: Proto,
    out: &mut BytesMut,
) {
    let mut slots: Vec<&[u8]> = vec![&[]; total];
    for (r, pos) in replies.iter().zip(positions) {
        match array_elements(r) {
            Ok((n, elems)) if n == pos.len() => {
                for (e, &p) in elems.into_iter().zip(pos) {
                    slots[p as usize] = e;
                }
            }
            _ => {
                for &p in pos {
                    slots[p as usize] = r;
                }
            }
        }
    }
    if splits.is_empty() {
        crate::protocol::request::write_array_header(out, total);
        for e in slots {
            out.extend_from_slice(e);
        }
        return;
    }
    let extra: usize = splits.iter().map(|s| s.count as usize - 1).sum();
    crate::protocol::request::write_array_header(out, total - extra);
    let mut i = 0;
    let mut next = splits.iter().peekable();
    while i < total {
        match next.peek() {
            Some(s) if s.first as usize == i => {
                let end = (i + s.count as usize).min(total);
                out.extend_from_slice(&merge_split(s, &slots[i..end], proto));
                i = end;
                next.next();
            }
            _ => {
                out.extend_from_slice(slots[i]);
                i += 1;
            }
        }
    }
}

/// The one reply of a command split per slot inside a transaction, from its parts'.
fn merge_split(s: &crate::conn::multi::TxSplit, parts: &[&[u8]], proto: Proto) -> Bytes {
    if let Some(e) = parts.iter().find(|p| p.first() == Some(&b'-')) {
        return Bytes::copy_from_slice(e);
    }
    let replies: Vec<Bytes> = parts.iter().map(|p| Bytes::copy_from_slice(p)).collect();
    let merge = match s.kind {
        crate::command::Split::Mget => {
            Merge::Mget(Box::new(Mget { positions: s.keys.clone(), total: s.nkeys as usize, cached: vec![] }))
        }
        crate::command::Split::Mset => Merge::Mset,
        crate::command::Split::Sum => Merge::Sum,
    };
    let mut scratch = BytesMut::new();
    match merge_replies(&merge, &replies, proto, &mut scratch) {
        Ok(b) => b,
        Err(what) => crate::errors::resp(&crate::errors::merge_failed(what)),
    }
}

/// SCRIPT KILL / FUNCTION KILL sent to every master, answered as one Redis would: `+OK`
/// if one of them killed its script; else an error that is not NOTBUSY (UNKILLABLE: the
/// script wrote), if a master gave one; else the first master's NOTBUSY.
pub fn kill_reply(replies: &[Bytes]) -> Bytes {
    if let Some(ok) = replies.iter().find(|r| r.first() == Some(&b'+')) {
        return ok.clone();
    }
    replies.iter().find(|r| !r.starts_with(b"-NOTBUSY")).or(replies.first()).cloned().unwrap_or_default()
}

/// FUNCTION STATS sent to every master, answered as one Redis would: the reply of the
/// master running a function (`running_script` not nil), else the first master's.
pub fn stats_reply(replies: &[Bytes]) -> Bytes {
    let running = |r: &Bytes| {
        let named = |k: &Value, v: &Value| {
            matches!(k, Value::Bulk(k) | Value::Simple(k) if k.eq_ignore_ascii_case(b"running_script"))
                && !matches!(v, Value::Nil)
        };
        match Value::parse(r) {
            Ok((Value::Array(items), _)) => items.chunks(2).any(|kv| matches!(kv, [k, v] if named(k, v))),
            Ok((Value::Map(pairs), _)) => pairs.iter().any(|(k, v)| named(k, v)),
            _ => false,
        }
    };
    replies.iter().find(|r| running(r)).or(replies.first()).cloned().unwrap_or_default()
}

/// PING sent to the masters running a script: a master's BUSY if one is busy (as one
/// Redis answers while a script runs too long), else the first master's reply.
pub fn ping_reply(replies: &[Bytes]) -> Bytes {
    replies.iter().find(|r| r.starts_with(b"-BUSY")).or(replies.first()).cloned().unwrap_or_default()
}

/// The elements of an array reply, as raw byte slices.
fn array_elements(r: &[u8]) -> Result<(usize, Vec<&[u8]>), &'static str> {
    let nl = memchr::memchr(b'\n', r).ok_or("truncated")?;
    if !matches!(r.first(), Some(b'*' | b'~')) {
        return Err("expected an array");
    }
    let n = parse_i64(&r[1..nl - 1]).ok_or("bad array length")?;
    let mut pos = nl + 1;
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for _ in 0..n.max(0) {
        let len = reply_len(&r[pos..]).map_err(|e| e.0)?.ok_or("truncated element")?;
        out.push(&r[pos..pos + len]);
        pos += len;
    }
    Ok((n.max(0) as usize, out))
}

fn int_of(r: &[u8]) -> Result<i64, &'static str> {
    Value::parse(r).map_err(|e| e.0)?.0.as_int().ok_or("expected an integer")
}

/// [`Merge::Commands`].
fn merge_commands(c: &Commands, reply: &[u8], w: &mut Writer) -> Result<(), &'static str> {
    let name_of = |e: &[u8]| -> Option<Vec<u8>> {
        match Value::parse(e).ok()?.0 {
            Value::Array(f) => Some(f.first()?.as_bytes()?.to_ascii_lowercase()),
            Value::Bulk(n) | Value::Simple(n) => Some(n.to_ascii_lowercase()),
            _ => None,
        }
    };
    // (COMMAND LIST names subcommands too, `parent|sub`: a refused parent's go with it,
    // and a refused subcommand)
    let kept = |e: &[u8]| {
        name_of(e).is_none_or(|n| {
            !c.refused.contains(n.split(|&b| b == b'|').next().unwrap_or_default()) && !c.refused_subs.contains(&n)
        })
    };
    // an entry with its refused subcommands left out of its tenth element
    let entry = |w: &mut Writer, e: &[u8]| {
        if c.refused_subs.is_empty() {
            return w.raw(e);
        }
        let Ok((n, fields)) = array_elements(e) else { return w.raw(e) };
        let Some(Ok((_, subs))) = fields.get(9).map(|s| array_elements(s)) else { return w.raw(e) };
        let left: Vec<&[u8]> = subs.iter().copied().filter(|s| kept(s)).collect();
        if left.len() == subs.len() {
            return w.raw(e);
        }
        w.raw(&e[..memchr::memchr(b'\n', e).map_or(0, |p| p + 1)]);
        for (i, f) in fields.iter().enumerate().take(n) {
            if i != 9 {
                w.raw(f);
                continue;
            }
            w.raw(&f[..1]);
            w.raw(itoa::Buffer::new().format(left.len()).as_bytes());
            w.raw(b"\r\n");
            for s in &left {
                w.raw(s);
            }
        }
    };
    match &c.kind {
        CommandsKind::All => {
            let (_, es) = array_elements(reply)?;
            let kept: Vec<&[u8]> = es.into_iter().filter(|e| kept(e)).collect();
            w.array(kept.len() + c.own.len());
            for e in kept {
                entry(w, e);
            }
            for o in &c.own {
                own_entry(w, o);
            }
        }
        CommandsKind::Count => {
            let (_, es) = array_elements(reply)?;
            w.int((es.into_iter().filter(|e| kept(e)).count() + c.own.len()) as i64);
        }
        CommandsKind::List { own, pattern } => {
            let (_, es) = array_elements(reply)?;
            let kept: Vec<&[u8]> = es.into_iter().filter(|e| kept(e)).collect();
            let mine: Vec<&OwnCommand> = c
                .own
                .iter()
                .filter(|o| *own && pattern.as_ref().is_none_or(|p| crate::glob::matches(p, o.name.as_bytes(), true)))
                .collect();
            w.array(kept.len() + mine.len());
            for e in kept {
                w.raw(e);
            }
            for o in mine {
                w.bulk(o.name.as_bytes());
            }
        }
        CommandsKind::Info(names) => {
            let (_, es) = array_elements(reply)?;
            w.array(es.len());
            for (i, e) in es.into_iter().enumerate() {
                let asked = names.get(i).map(Vec::as_slice).unwrap_or_default();
                if let Some(o) = c.own.iter().find(|o| o.name.as_bytes() == asked) {
                    own_entry(w, o);
                } else if c.refused.contains(asked) || c.refused_subs.contains(asked) {
                    w.nil();
                } else {
                    entry(w, e);
                }
            }
        }
        CommandsKind::Docs => {
            // name / docs pairs: a RESP2 array, a RESP3 map
            let (v, _) = Value::parse(reply).map_err(|e| e.0)?;
            let mut pairs: Vec<(&[u8], &[u8])> = Vec::new();
            let mut rest = &reply[reply.iter().position(|&b| b == b'\n').ok_or("truncated")? + 1..];
            let n = match v {
                Value::Array(items) => items.len() / 2,
                Value::Map(items) => items.len(),
                _ => return Err("COMMAND DOCS reply is not a map"),
            };
            for _ in 0..n {
                let kl = reply_len(rest).map_err(|e| e.0)?.ok_or("truncated")?;
                let vl = reply_len(&rest[kl..]).map_err(|e| e.0)?.ok_or("truncated")?;
                pairs.push((&rest[..kl], &rest[kl..kl + vl]));
                rest = &rest[kl + vl..];
            }
            let kept: Vec<(&[u8], &[u8])> = pairs.into_iter().filter(|(k, _)| kept(k)).collect();
            w.map(kept.len());
            for (k, v) in kept {
                w.raw(k);
                w.raw(v);
            }
        }
    }
    Ok(())
}

/// A `COMMAND` entry for one of heatshield's own commands, as Redis 7 writes one.
fn own_entry(w: &mut Writer, o: &OwnCommand) {
    let (first, last, step) = if o.key { (1, 1, 1) } else { (0, 0, 0) };
    w.array(10);
    w.bulk(o.name.as_bytes());
    w.int(o.arity as i64);
    w.set(o.flags.len());
    for f in o.flags {
        w.simple(f);
    }
    w.int(first);
    w.int(last);
    w.int(step);
    w.set(0);
    w.set(0);
    if o.key {
        let write = o.flags.contains(&"write");
        w.array(1);
        w.map(3);
        w.bulk(b"flags");
        w.set(2);
        w.simple(if write { "RW" } else { "RO" });
        w.simple(if write { "update" } else { "access" });
        // the lock key: argument 1 (Redis's `begin_search` index, `find_keys` range)
        let search = |w: &mut Writer, name: &[u8], kind: &[u8], spec: &[(&[u8], i64)]| {
            w.bulk(name);
            w.map(2);
            w.bulk(b"type");
            w.bulk(kind);
            w.bulk(b"spec");
            w.map(spec.len());
            for (k, v) in spec {
                w.bulk(k);
                w.int(*v);
            }
        };
        search(w, b"begin_search", b"index", &[(b"index", 1)]);
        search(w, b"find_keys", b"range", &[(b"lastkey", 0), (b"keystep", 1), (b"limit", 0)]);
    } else {
        w.array(0);
    }
    w.array(0);
}

/// An entry of an array reply: its fields, decoded, and its bytes.
type Entry<'a> = (Vec<Value<'a>>, &'a [u8]);

/// The entries of every part's array reply; `what` says what is wrong with an entry that
/// is not an array.
fn entries<'a>(replies: &'a [Bytes], what: &'static str) -> Result<Vec<Entry<'a>>, &'static str> {
    let mut out = Vec::new();
    for r in replies {
        for e in array_elements(r)?.1 {
            match Value::parse(e).map_err(|e| e.0)?.0 {
                Value::Array(f) => out.push((f, e)),
                _ => return Err(what),
            }
        }
    }
    Ok(out)
}

/// Statistic `name` (any case) of a CLUSTER SLOT-STATS entry's statistics (a RESP2 flat
/// array of name, value, ... or a RESP3 map); 0 when missing.
fn stat_of(stats: Option<&Value>, name: &[u8]) -> i64 {
    let found = match stats {
        Some(Value::Array(kv)) => {
            kv.chunks_exact(2).find(|p| p[0].as_bytes().is_some_and(|k| k.eq_ignore_ascii_case(name))).map(|p| &p[1])
        }
        Some(Value::Map(kv)) => {
            kv.iter().find(|(k, _)| k.as_bytes().is_some_and(|k| k.eq_ignore_ascii_case(name))).map(|(_, v)| v)
        }
        _ => None,
    };
    found.and_then(Value::as_int).unwrap_or(0)
}

/// Merges part replies (none of which is an error) into the reply for the client.
pub fn merge_replies(
    merge: &Merge,
    replies: &[Bytes],
    proto: Proto,
    scratch: &mut BytesMut,
) -> Result<Bytes, &'static str> {
    let mut w = Writer::new(scratch, proto);
    match merge {
        Merge::Pass => w.raw(&replies[0]),
        Merge::Mget(m) => merge_mget(replies, &m.positions, m.total, &m.cached, w.buf)?,
        Merge::Mset => w.ok(),
        Merge::Sum | Merge::Dbsize => {
            let mut sum = 0i64;
            for r in replies {
                sum += int_of(r)?;
            }
            w.int(sum);
        }
        Merge::Keys => {
            let mut all = Vec::new();
            for r in replies {
                all.extend(array_elements(r)?.1);
            }
            w.array(all.len());
            for e in all {
                w.raw(e);
            }
        }
        Merge::Scan { node, nodes } => {
            let (v, _) = Value::parse(&replies[0]).map_err(|e| e.0)?;
            let Value::Array(items) = v else {
                return Err("SCAN reply is not an array");
            };
            let (Some(c), Some(Value::Array(keys))) = (items.first().and_then(|c| c.as_bytes()), items.get(1)) else {
                return Err("SCAN reply has an unexpected shape");
            };
            let backend: u64 = std::str::from_utf8(c).ok().and_then(|s| s.parse().ok()).ok_or("bad SCAN cursor")?;
            let next = if backend != 0 {
                if backend >= 1 << (64 - SCAN_NODE_BITS) {
                    return Err("backend SCAN cursor too large");
                }
                (backend << SCAN_NODE_BITS) | *node as u64
            } else if node + 1 < *nodes {
                (node + 1) as u64
            } else {
                0
            };
            w.array(2);
            w.bulk(itoa::Buffer::new().format(next).as_bytes());
            w.array(keys.len());
            for k in keys {
                w.bulk(k.as_bytes().unwrap_or_default());
            }
        }
        Merge::RandomKey => {
            let found: Vec<&Bytes> =
                replies.iter().filter(|r| !matches!(Value::parse(r), Ok((Value::Nil, _)))).collect();
            if found.is_empty() {
                w.nil();
            } else {
                let pick = (std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos() as usize)
                    % found.len();
                w.raw(found[pick]);
            }
        }
        Merge::AllSame => w.raw(&replies[0]),
        Merge::SumPlus(by) => {
            let mut sum = *by;
            for r in replies {
                sum += int_of(r)?;
            }
            w.int(sum.max(0));
        }
        Merge::Union => {
            let mut seen = std::collections::HashSet::new();
            let mut all = Vec::new();
            for r in replies {
                for e in array_elements(r)?.1 {
                    if seen.insert(e) {
                        all.push(e);
                    }
                }
            }
            w.array(all.len());
            for e in all {
                w.raw(e);
            }
        }
        Merge::NumSub { adjust } => {
            let mut names: Vec<&[u8]> = Vec::new();
            let mut counts: Vec<i64> = adjust.clone();
            for (i, r) in replies.iter().enumerate() {
                let (v, _) = Value::parse(r).map_err(|e| e.0)?;
                let Value::Array(items) = v else {
                    return Err("PUBSUB NUMSUB reply is not an array");
                };
                for (j, pair) in items.chunks(2).enumerate() {
                    if i == 0 {
                        names.push(pair[0].as_bytes().unwrap_or_default());
                    }
                    let n = pair.get(1).and_then(|x| x.as_int()).ok_or("expected an integer")?;
                    *counts.get_mut(j).ok_or("PUBSUB NUMSUB replies differ in length")? += n;
                }
            }
            w.array(names.len() * 2);
            for (name, n) in names.iter().zip(counts) {
                w.bulk(name);
                w.int(n.max(0));
            }
        }
        Merge::Log { count } => {
            let mut all = Vec::new();
            for (f, e) in entries(replies, "log entry is not an array")? {
                let at = |i: usize| f.get(i).and_then(Value::as_int).unwrap_or(0);
                all.push(((at(1), at(0)), e));
            }
            all.sort_by_key(|e| std::cmp::Reverse(e.0));
            all.truncate(count.unwrap_or(usize::MAX));
            w.array(all.len());
            for (_, e) in all {
                w.raw(e);
            }
        }
        Merge::SlotStats { order } => {
            let mut all = Vec::new();
            for (f, e) in entries(replies, "slot statistics entry is not an array")? {
                let slot = f.first().and_then(Value::as_int).ok_or("slot statistics entry has no slot")?;
                let stat = match order {
                    Some(o) => stat_of(f.get(1), &o.0),
                    None => 0,
                };
                all.push((slot, stat, e));
            }
            match order {
                None => all.sort_by_key(|&(slot, ..)| slot),
                Some(o) => {
                    let (limit, desc) = (&o.1, &o.2);
                    all.sort_by(|a, b| if *desc { b.1.cmp(&a.1) } else { a.1.cmp(&b.1) }.then(a.0.cmp(&b.0)));
                    all.truncate(*limit);
                }
            }
            w.array(all.len());
            for (.., e) in all {
                w.raw(e);
            }
        }
        Merge::Commands(c) => merge_commands(c, &replies[0], &mut w)?,
        Merge::ScriptExists { known } => {
            let mut acc: Vec<i64> = Vec::new();
            for (i, r) in replies.iter().enumerate() {
                let (v, _) = Value::parse(r).map_err(|e| e.0)?;
                let Value::Array(items) = v else {
                    return Err("SCRIPT EXISTS reply is not an array");
                };
                let vals: Vec<i64> = items.iter().map(|x| x.as_int().unwrap_or(0)).collect();
                if i == 0 {
                    acc = vals;
                } else {
                    for (a, b) in acc.iter_mut().zip(vals) {
                        *a = (*a != 0 && b != 0) as i64;
                    }
                }
            }
            w.array(acc.len());
            for (i, a) in acc.into_iter().enumerate() {
                w.int((a != 0 || known.get(i) == Some(&true)) as i64);
            }
        }
    }
    Ok(scratch.split().freeze())
}

#[cfg(test)]
mod tests {
    use smallvec::smallvec;

    use super::*;

    fn b(s: &[u8]) -> Bytes {
        Bytes::copy_from_slice(s)
    }

    #[test]
    fn logs_merge_newest_first_and_slot_stats_by_slot_or_statistic() {
        let entry =
            |id: i64, t: i64| format!("*6\r\n:{id}\r\n:{t}\r\n:5\r\n*1\r\n$3\r\nGET\r\n$3\r\na:1\r\n$0\r\n\r\n");
        let log = |es: &[(i64, i64)]| {
            b(format!("*{}\r\n{}", es.len(), es.iter().map(|&(i, t)| entry(i, t)).collect::<String>()).as_bytes())
        };
        let replies = vec![log(&[(2, 100), (1, 90)]), log(&[(7, 95), (6, 100)])];
        let mut s = BytesMut::new();
        let out = merge_replies(&Merge::Log { count: Some(3) }, &replies, Proto::Resp2, &mut s).unwrap();
        assert_eq!(out, log(&[(6, 100), (2, 100), (7, 95)]));
        let out = merge_replies(&Merge::Log { count: None }, &replies, Proto::Resp2, &mut s).unwrap();
        assert_eq!(out, log(&[(6, 100), (2, 100), (7, 95), (1, 90)]));
        let stat = |slot: i64, keys: i64| format!("*2\r\n:{slot}\r\n*2\r\n$9\r\nkey-count\r\n:{keys}\r\n");
        let stats = |es: &[(i64, i64)]| {
            b(format!("*{}\r\n{}", es.len(), es.iter().map(|&(sl, k)| stat(sl, k)).collect::<String>()).as_bytes())
        };
        let replies = vec![stats(&[(9, 1), (3, 4)]), stats(&[(5, 4), (1, 0)])];
        let by_slot = merge_replies(&Merge::SlotStats { order: None }, &replies, Proto::Resp2, &mut s).unwrap();
        assert_eq!(by_slot, stats(&[(1, 0), (3, 4), (5, 4), (9, 1)]));
        let top = Merge::SlotStats { order: Some(Box::new((b"KEY-COUNT".to_vec(), 3, true))) };
        assert_eq!(merge_replies(&top, &replies, Proto::Resp2, &mut s).unwrap(), stats(&[(3, 4), (5, 4), (9, 1)]));
        let low = Merge::SlotStats { order: Some(Box::new((b"key-count".to_vec(), 2, false))) };
        assert_eq!(merge_replies(&low, &replies, Proto::Resp2, &mut s).unwrap(), stats(&[(1, 0), (9, 1)]));
    }

    #[test]
    fn mget_merge_restores_order() {
        let m =
            Merge::Mget(Box::new(Mget { positions: vec![smallvec![0, 2], smallvec![1]], total: 3, cached: vec![] }));
        let replies = vec![b(b"*2\r\n$1\r\na\r\n$-1\r\n"), b(b"*1\r\n$1\r\nb\r\n")];
        let mut s = BytesMut::new();
        let out = merge_replies(&m, &replies, Proto::Resp2, &mut s).unwrap();
        assert_eq!(&out[..], b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n");
        let replies3 = vec![b(b"*2\r\n$1\r\na\r\n_\r\n"), b(b"*1\r\n$1\r\nb\r\n")];
        let out = merge_replies(&m, &replies3, Proto::Resp3, &mut s).unwrap();
        assert_eq!(&out[..], b"*3\r\n$1\r\na\r\n$1\r\nb\r\n_\r\n");
    }

    #[test]
    fn sums_and_keys() {
        let mut s = BytesMut::new();
        let out = merge_replies(&Merge::Sum, &[b(b":2\r\n"), b(b":3\r\n")], Proto::Resp2, &mut s).unwrap();
        assert_eq!(&out[..], b":5\r\n");
        let out = merge_replies(
            &Merge::Keys,
            &[b(b"*1\r\n$1\r\na\r\n"), b(b"*0\r\n"), b(b"*1\r\n$1\r\nb\r\n")],
            Proto::Resp2,
            &mut s,
        )
        .unwrap();
        assert_eq!(&out[..], b"*2\r\n$1\r\na\r\n$1\r\nb\r\n");
        let out = merge_replies(
            &Merge::ScriptExists { known: vec![false, false, false] },
            &[b(b"*3\r\n:1\r\n:1\r\n:0\r\n"), b(b"*3\r\n:1\r\n:0\r\n:0\r\n")],
            Proto::Resp2,
            &mut s,
        )
        .unwrap();
        assert_eq!(&out[..], b"*3\r\n:1\r\n:0\r\n:0\r\n");
        // a script heatshield can send whole counts as present
        let out = merge_replies(
            &Merge::ScriptExists { known: vec![false, true, true] },
            &[b(b"*3\r\n:1\r\n:1\r\n:0\r\n"), b(b"*3\r\n:1\r\n:0\r\n:0\r\n")],
            Proto::Resp2,
            &mut s,
        )
        .unwrap();
        assert_eq!(&out[..], b"*3\r\n:1\r\n:1\r\n:1\r\n");
    }

    #[test]
    fn pubsub_merges() {
        let mut s = BytesMut::new();
        let out = merge_replies(
            &Merge::Union,
            &[b(b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"), b(b"*2\r\n$1\r\nb\r\n$1\r\nc\r\n")],
            Proto::Resp2,
            &mut s,
        )
        .unwrap();
        assert_eq!(&out[..], b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n");
        let out = merge_replies(
            &Merge::NumSub { adjust: vec![2, -1] },
            &[b(b"*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n:0\r\n"), b(b"*4\r\n$1\r\na\r\n:0\r\n$1\r\nb\r\n:3\r\n")],
            Proto::Resp2,
            &mut s,
        )
        .unwrap();
        assert_eq!(&out[..], b"*4\r\n$1\r\na\r\n:3\r\n$1\r\nb\r\n:2\r\n");
        let out = merge_replies(&Merge::SumPlus(2), &[b(b":1\r\n")], Proto::Resp2, &mut s).unwrap();
        assert_eq!(&out[..], b":3\r\n");
    }

    #[test]
    fn scan_cursor_walks_nodes() {
        let mut s = BytesMut::new();
        let page = |node, nodes, r: &[u8], s: &mut BytesMut| {
            merge_replies(&Merge::Scan { node, nodes }, &[b(r)], Proto::Resp2, s).unwrap()
        };
        // backend has more: cursor keeps the node
        let out = page(1, 3, b"*2\r\n$2\r\n17\r\n*1\r\n$1\r\nk\r\n", &mut s);
        assert_eq!(
            &out[..],
            format!("*2\r\n${}\r\n{}\r\n*1\r\n$1\r\nk\r\n", ((17u64 << 10) | 1).to_string().len(), (17u64 << 10) | 1)
                .as_bytes()
        );
        // backend done: next node
        let out = page(1, 3, b"*2\r\n$1\r\n0\r\n*0\r\n", &mut s);
        assert_eq!(&out[..], b"*2\r\n$1\r\n2\r\n*0\r\n");
        // last node done: 0
        let out = page(2, 3, b"*2\r\n$1\r\n0\r\n*0\r\n", &mut s);
        assert_eq!(&out[..], b"*2\r\n$1\r\n0\r\n*0\r\n");
    }
}
