//! CLIENT subcommands about heatshield's own clients (never the backend connections, which
//! clients share): SETNAME, GETNAME, ID, SETINFO, INFO, LIST, KILL, REPLY, UNBLOCK,
//! NO-EVICT and NO-TOUCH, with Redis's replies, field names and error texts. Another
//! connection is reached through the proxy's [`crate::conn::Registry`].

use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::conn::{ClientInfo, Control, ReplyMode, flag};
use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::protocol::Request;
use crate::protocol::request::parse_i64;
use crate::proxy::Proxy;

/// `CLIENT <sub> ...` (the command table checked the subcommand and its arity).
pub fn run(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    // this command is the client's last one already (CLIENT LIST shows it so)
    ctx.client.info.last_cmd.store(ctx.cmd, Ordering::Relaxed);
    ctx.client.info.last_ms.store(proxy.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    let sub = req.arg(1).to_ascii_uppercase();
    match sub.as_slice() {
        b"SETNAME" => match set_name(ctx, req.arg(2)) {
            Ok(()) => ctx.reply(|w| w.ok()),
            Err(e) => ctx.error(e),
        },
        b"GETNAME" => {
            let name = ctx.client.info.names.lock().name.clone();
            match name {
                Some(n) => ctx.reply(|w| w.bulk(&n)),
                None => ctx.reply(|w| w.nil()),
            }
        }
        b"ID" => {
            let id = ctx.client.id as i64;
            ctx.reply(|w| w.int(id))
        }
        b"SETINFO" => set_info(ctx, req.arg(2), req.arg(3)),
        b"INFO" => {
            let mut line = line(proxy, &ctx.client.info);
            line.push('\n');
            ctx.reply(|w| w.verbatim(line.as_bytes()))
        }
        b"LIST" => list(proxy, ctx, req),
        b"TRACKING" => crate::modes::tracking::tracking(proxy, ctx, req),
        b"CACHING" => crate::modes::tracking::caching(ctx, req),
        b"GETREDIR" => crate::modes::tracking::getredir(ctx),
        b"TRACKINGINFO" => crate::modes::tracking::trackinginfo(ctx),
        b"KILL" => kill(proxy, ctx, req),
        b"UNBLOCK" => unblock(proxy, ctx, req),
        b"REPLY" => {
            let mode = match req.arg(2).to_ascii_uppercase().as_slice() {
                b"ON" => ReplyMode::On,
                b"OFF" => ReplyMode::Off,
                b"SKIP" => ReplyMode::Skip,
                _ => return ctx.error(errors::SYNTAX),
            };
            // the session leaves OFF and SKIP's own reply unwritten
            ctx.client.reply = mode;
            ctx.reply(|w| w.ok())
        }
        // Valkey 8's capabilities (`redirect`: -REDIRECT from a replica): heatshield
        // sends none of them, and takes note of none, as Valkey does with unknown ones
        b"CAPA" => ctx.reply(|w| w.ok()),
        b"NO-EVICT" | b"NO-TOUCH" => {
            let on = match req.arg(2).to_ascii_uppercase().as_slice() {
                b"ON" => true,
                b"OFF" => false,
                _ => return ctx.error(errors::SYNTAX),
            };
            if sub == b"NO-EVICT" {
                ctx.client.no_evict = on;
            } else {
                ctx.client.no_touch = on;
            }
            ctx.reply(|w| w.ok())
        }
        _ => {
            let name = String::from_utf8_lossy(req.arg(1)).into_owned();
            ctx.error(&errors::unsupported(&format!("CLIENT {name}"), "backend connections are shared between clients"))
        }
    }
}

/// CLIENT SETNAME, HELLO ... SETNAME.
pub fn set_name(ctx: &mut Ctx, name: &[u8]) -> Result<(), &'static str> {
    if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return Err(errors::CLIENT_NAME_CHARS);
    }
    ctx.client.info.names.lock().name = if name.is_empty() { None } else { Some(Bytes::copy_from_slice(name)) };
    Ok(())
}

fn set_info(ctx: &mut Ctx, attr: &[u8], val: &[u8]) -> Outcome {
    if val.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return ctx.error(errors::LIB_INFO_CHARS);
    }
    let v = String::from_utf8_lossy(val).into_owned();
    let mut names = ctx.client.info.names.lock();
    if attr.eq_ignore_ascii_case(b"LIB-NAME") {
        names.lib_name = v;
    } else if attr.eq_ignore_ascii_case(b"LIB-VER") {
        names.lib_ver = v;
    } else {
        drop(names);
        return ctx.error(&errors::unrecognized_option(&String::from_utf8_lossy(attr)));
    }
    drop(names);
    ctx.reply(|w| w.ok())
}

/// One client's line, with Redis's field names in Redis's order. heatshield keeps no
/// per-client query or output buffer accounting of Redis's kind: those fields are 0.
pub fn line(proxy: &Proxy, c: &ClientInfo) -> String {
    let names = c.names.lock();
    let f = c.flags.load(Ordering::Relaxed);
    let mut flags = String::new();
    for (bit, ch) in
        [(flag::BLOCKED, 'b'), (flag::NO_EVICT, 'e'), (flag::PUBSUB, 'P'), (flag::NO_TOUCH, 'T'), (flag::MULTI, 'x')]
    {
        if f & bit != 0 {
            flags.push(ch);
        }
    }
    for (bit, ch) in crate::modes::tracking::FLAGS {
        if f & bit != 0 {
            flags.push(ch);
        }
    }
    if flags.is_empty() {
        flags.push('N');
    }
    let now_ms = proxy.started.elapsed().as_millis() as u64;
    let idle = now_ms.saturating_sub(c.last_ms.load(Ordering::Relaxed)) / 1000;
    let cmd = proxy.commands.name_of(c.last_cmd.load(Ordering::Relaxed)).to_ascii_lowercase();
    format!(
        "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags={} db={} sub={} psub={} ssub={} multi={} \
         qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} \
         user={} redir={} resp={} lib-name={} lib-ver={}",
        c.id,
        c.addr,
        c.laddr,
        names.name.as_deref().map(String::from_utf8_lossy).unwrap_or_default(),
        c.created.elapsed().as_secs(),
        idle,
        flags,
        c.db.load(Ordering::Relaxed),
        c.subs[0].load(Ordering::Relaxed),
        c.subs[1].load(Ordering::Relaxed),
        c.subs[2].load(Ordering::Relaxed),
        c.multi.load(Ordering::Relaxed),
        cmd,
        names.user.as_deref().unwrap_or("default"),
        c.redir.load(Ordering::Relaxed),
        c.resp.load(Ordering::Relaxed),
        names.lib_name,
        names.lib_ver,
    )
}

/// CLIENT LIST [TYPE normal|master|replica|slave|pubsub] [ID id [id ...]]
fn list(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    let mut ids: Option<Vec<u64>> = None;
    let mut normal = Some(Type::Any);
    let mut i = 2;
    while i < req.argc() {
        let opt = req.arg(i).to_ascii_uppercase();
        if opt == b"TYPE" && i + 1 < req.argc() {
            match kind(req.arg(i + 1)) {
                Ok(n) => normal = n,
                Err(e) => return ctx.error(&e),
            }
            i += 2;
        } else if opt == b"ID" && i + 1 < req.argc() {
            let mut v = Vec::new();
            for a in req.args().skip(i + 1) {
                match parse_i64(a) {
                    Some(id) if id > 0 => v.push(id as u64),
                    _ => return ctx.error(errors::INVALID_CLIENT_ID),
                }
            }
            ids = Some(v);
            i = req.argc();
        } else {
            return ctx.error(errors::SYNTAX);
        }
    }
    let mut text = String::new();
    if let Some(t) = normal {
        for c in proxy.clients.all() {
            if ids.as_ref().is_none_or(|v| v.contains(&c.id)) && t.has(&c) {
                text.push_str(&line(proxy, &c));
                text.push('\n');
            }
        }
    }
    ctx.reply(|w| w.verbatim(text.as_bytes()))
}

/// The clients a CLIENT LIST / KILL `TYPE` names.
#[derive(Clone, Copy)]
enum Type {
    Any,
    Normal,
    /// With subscriptions (Redis's `pubsub` type).
    Pubsub,
}

impl Type {
    fn has(self, c: &ClientInfo) -> bool {
        match self {
            Type::Any => true,
            Type::Normal => !c.has(flag::PUBSUB),
            Type::Pubsub => c.has(flag::PUBSUB),
        }
    }
}

/// A CLIENT LIST / KILL `TYPE`: `None` for a type no heatshield client has (replicas).
fn kind(t: &[u8]) -> Result<Option<Type>, String> {
    match t.to_ascii_lowercase().as_slice() {
        b"normal" => Ok(Some(Type::Normal)),
        b"pubsub" => Ok(Some(Type::Pubsub)),
        b"master" | b"replica" | b"slave" => Ok(None),
        _ => Err(errors::unknown_client_type(&String::from_utf8_lossy(t))),
    }
}

/// CLIENT KILL ip:port, or CLIENT KILL <filter> <value> ... (ID, ADDR, LADDR, USER, TYPE,
/// SKIPME): closes the matching clients.
fn kill(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    let me = ctx.client.id;
    if req.argc() == 3 {
        // the old form: one address, +OK or an error
        let addr = String::from_utf8_lossy(req.arg(2)).into_owned();
        let Some(c) = proxy.clients.all().into_iter().find(|c| c.addr == addr) else {
            return ctx.error(errors::NO_SUCH_CLIENT);
        };
        close(proxy, ctx, &c, me);
        return ctx.reply(|w| w.ok());
    }
    let (mut id, mut addr, mut laddr, mut normal, mut skipme) = (None, None, None, Some(Type::Any), true);
    let mut user: Option<String> = None;
    let mut i = 2;
    while i < req.argc() {
        if i + 1 >= req.argc() {
            return ctx.error(errors::SYNTAX);
        }
        let (opt, val) = (req.arg(i).to_ascii_uppercase(), req.arg(i + 1));
        match opt.as_slice() {
            b"ID" => match parse_i64(val) {
                Some(n) if n > 0 => id = Some(n as u64),
                _ => return ctx.error(errors::CLIENT_ID_POSITIVE),
            },
            b"ADDR" => addr = Some(String::from_utf8_lossy(val).into_owned()),
            b"LADDR" => laddr = Some(String::from_utf8_lossy(val).into_owned()),
            b"TYPE" => match kind(val) {
                Ok(n) => normal = n,
                Err(e) => return ctx.error(&e),
            },
            b"USER" => {
                let name = String::from_utf8_lossy(val).into_owned();
                if proxy.users.get(&name).is_none() {
                    return ctx.error(&errors::no_such_user(&name));
                }
                user = Some(name);
            }
            b"SKIPME" => match val.to_ascii_lowercase().as_slice() {
                b"yes" => skipme = true,
                b"no" => skipme = false,
                _ => return ctx.error(errors::SYNTAX),
            },
            _ => return ctx.error(errors::SYNTAX),
        }
        i += 2;
    }
    let mut killed = 0;
    for c in proxy.clients.all() {
        let matches = normal.is_some_and(|t| t.has(&c))
            && id.is_none_or(|x| x == c.id)
            && addr.as_ref().is_none_or(|a| *a == c.addr)
            && laddr.as_ref().is_none_or(|a| *a == c.laddr)
            && user.as_ref().is_none_or(|u| *u == c.user())
            && !(skipme && c.id == me);
        if matches {
            close(proxy, ctx, &c, me);
            killed += 1;
        }
    }
    ctx.reply(|w| w.int(killed))
}

/// Closes client `c`: another at once (gone from CLIENT LIST and KILL at once too, as on
/// Redis, though its session ends a moment later), this one once the reply is written.
fn close(proxy: &Proxy, ctx: &mut Ctx, c: &ClientInfo, me: u64) {
    if c.id == me {
        ctx.client.quit = true;
    } else {
        c.send(Control::Kill);
        proxy.clients.remove(c.id);
    }
}

/// CLIENT UNBLOCK id [TIMEOUT|ERROR]: 1 if that client was blocked (its blocking command
/// then answers as if it timed out, or `-UNBLOCKED ...`), else 0.
fn unblock(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    let Some(id) = parse_i64(req.arg(2)) else { return ctx.error(errors::NOT_AN_INTEGER) };
    let how = match req.argc() {
        3 => Control::UnblockTimeout,
        4 if req.arg(3).eq_ignore_ascii_case(b"TIMEOUT") => Control::UnblockTimeout,
        4 if req.arg(3).eq_ignore_ascii_case(b"ERROR") => Control::UnblockError,
        4 => return ctx.error(errors::UNBLOCK_REASON),
        _ => return ctx.error(errors::SYNTAX),
    };
    let done = match proxy.clients.get(id as u64) {
        Some(c) if c.has(flag::BLOCKED) => c.send(how),
        _ => false,
    };
    ctx.reply(|w| w.int(done as i64))
}
