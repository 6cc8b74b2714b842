//! Commands heatshield answers itself, about the client connection or the proxy: PING,
//! ECHO, QUIT, SELECT, HELLO, AUTH, TIME, RESET, CLIENT (crate::face::client) and
//! INFO (whose keyspace part is gathered from the masters). Replies follow Redis's texts.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::command::Local;
use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::protocol::request::parse_i64;
use crate::protocol::{Proto, Request};
use crate::proxy::Proxy;

/// PINGs asking busy masters at once, proxy-wide, at most: each holds a dedicated
/// connection per master it asks, and a client pipelining PINGs while a script runs must
/// not open connections without bound (past it, heatshield answers PONG itself).
const MAX_PING_PROBES: usize = 8;
static PING_PROBES: AtomicUsize = AtomicUsize::new(0);

/// One of [`MAX_PING_PROBES`], given back when dropped.
struct PingProbe;

impl Drop for PingProbe {
    fn drop(&mut self) {
        PING_PROBES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// PING while some master runs a script: asked of those masters (on connections the
/// script cannot hold up), so a master busy with a script answers BUSY, as one Redis
/// does. `None` (heatshield answers PONG itself) when no script is out, or no probe or
/// connection to spare.
/// Some master runs a script now (PING is asked of it: see [`ping_busy`]).
pub fn scripts_running(proxy: &Proxy) -> bool {
    proxy.cluster.topology().masters.iter().any(|m| m.scripts.load(Ordering::Relaxed) > 0)
}

fn ping_busy(proxy: &Proxy, ctx: &mut Ctx) -> Option<Outcome> {
    let running: Vec<_> = {
        let topo = proxy.cluster.topology();
        let busy = |m: &&std::sync::Arc<crate::upstream::cluster::NodePool>| m.scripts.load(Ordering::Relaxed) > 0;
        if !topo.masters.iter().any(|m| busy(&m)) {
            return None; // the usual case: no allocation
        }
        topo.masters.iter().filter(busy).cloned().collect()
    };
    if PING_PROBES.fetch_add(1, Ordering::Relaxed) >= MAX_PING_PROBES {
        PING_PROBES.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    crate::path::route::while_busy(proxy, ctx, &running, crate::path::merge::ping_reply, PingProbe).ok()
}

/// WAIT numreplicas timeout, WAITAOF numlocal numreplicas timeout: after the client's
/// earlier commands have their replies (its lane waits for them), asked of the masters it
/// wrote to on connections of heatshield's own ([`crate::services::wait`]).
fn wait(proxy: &Proxy, ctx: &mut Ctx, req: &Request, kind: crate::services::wait::Kind) -> Outcome {
    // (arguments the server refuses are its to refuse, in its words: an ask with them
    // answers its error; only the timeout is read here, to keep the request alive)
    let timeout = parse_i64(req.arg(req.argc() - 1)).filter(|&t| t >= 0).unwrap_or(0);
    let topo = proxy.cluster.topology();
    let (asks, lost) = crate::services::wait::asks(&topo, ctx.client.wrote);
    // (a node that is no master any more is answered for once, then forgotten)
    ctx.client.wrote &= topo.masters.iter().fold(0, |m, n| m | n.bit);
    let Some(first) = asks.first().map(|a| a.node.clone()).or_else(|| topo.masters.first().cloned()) else {
        return ctx.error(errors::NO_SLOT_MAP);
    };
    let deadline = (timeout > 0).then(|| ctx.now + std::time::Duration::from_millis(timeout as u64));
    // its own timeout, not the proxy's reply deadline (0: for ever)
    ctx.wait_ms = if timeout == 0 { u32::MAX } else { timeout.min(u32::MAX as i64) as u32 };
    let tag = crate::mailbox::Tag { seq: ctx.seq, part: 0 };
    crate::services::wait::spawn(asks, kind, req.clone(), lost, deadline, ctx.reply_to.clone(), tag);
    crate::path::pending::answered_elsewhere(ctx, crate::path::pending::Target::Node(first))
}

pub fn run(proxy: &Proxy, ctx: &mut Ctx, l: Local, req: &Request) -> Outcome {
    match l {
        // RESP2 with subscriptions: Redis answers PING as a message-shaped array
        Local::Ping if ctx.client.subscribed_resp2() => {
            if req.argc() > 2 {
                return ctx.error(&crate::errors::wrong_arity("ping"));
            }
            ctx.reply(|w| {
                w.array(2);
                w.bulk(b"pong");
                w.bulk(if req.argc() == 2 { req.arg(1) } else { b"" });
            })
        }
        Local::Ping
            if req.argc() <= 2
                && let Some(o) = ping_busy(proxy, ctx) =>
        {
            o
        }
        Local::Ping => match req.argc() {
            1 => ctx.reply(|w| w.simple("PONG")),
            2 => ctx.reply(|w| w.bulk(req.arg(1))),
            _ => ctx.error(&crate::errors::wrong_arity("ping")),
        },
        Local::Echo => ctx.reply(|w| w.bulk(req.arg(1))),
        Local::Acl => acl(proxy, ctx, req),
        Local::Wait => wait(proxy, ctx, req, crate::services::wait::Kind::Wait),
        Local::WaitAof => wait(proxy, ctx, req, crate::services::wait::Kind::WaitAof),
        Local::Quit => {
            ctx.client.quit = true;
            ctx.reply(|w| w.ok())
        }
        Local::Ok => ctx.reply(|w| w.ok()),
        Local::Select => {
            // (at most 65,536: see crate::upstream::backend::BackendRequest::db)
            let dbs = proxy.databases.load(std::sync::atomic::Ordering::Relaxed).min(1 << 16);
            match parse_i64(req.arg(1)) {
                Some(n) if (0..dbs as i64).contains(&n) => {
                    ctx.client.db = n as u16;
                    ctx.client.info.db.store(n as u32, std::sync::atomic::Ordering::Relaxed);
                    ctx.reply(|w| w.ok())
                }
                Some(_) if dbs > 1 => ctx.error(errors::DB_INDEX_OUT_OF_RANGE),
                Some(_) => ctx.error(errors::DB_OUT_OF_RANGE),
                None => ctx.error(crate::errors::NOT_AN_INTEGER),
            }
        }
        Local::Time => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            ctx.reply(|w| {
                w.array(2);
                w.bulk(itoa::Buffer::new().format(now.as_secs()).as_bytes());
                w.bulk(itoa::Buffer::new().format(now.subsec_micros()).as_bytes());
            })
        }
        Local::Reset => {
            ctx.client.leave_modes(&proxy.pubsub, &proxy.client_side);
            ctx.client.proto = Proto::Resp2;
            ctx.client.db = 0;
            ctx.client.info.db.store(0, std::sync::atomic::Ordering::Relaxed);
            ctx.client.info.names.lock().name = None;
            (ctx.client.no_evict, ctx.client.no_touch) = (false, false);
            // back to the `default` user, logged in only if it needs no password (Redis's
            // clientSetDefaultAuth)
            let default = proxy.users.default_user();
            let p = default.perms();
            let authed = p.enabled && p.nopass;
            drop(p);
            log_in(ctx, default);
            ctx.client.authed = authed;
            ctx.reply(|w| w.simple("RESET"))
        }
        Local::Auth => {
            let (user, pass) = match req.argc() {
                2 => (None, req.arg(1)),
                3 => (Some(req.arg(1)), req.arg(2)),
                _ => return ctx.error(crate::errors::SYNTAX),
            };
            match check_auth(proxy, ctx, user, pass) {
                Ok(u) => {
                    log_in(ctx, u);
                    ctx.reply(|w| w.ok())
                }
                Err(e) => ctx.error(e),
            }
        }
        Local::Hello => hello(proxy, ctx, req),
        Local::Client => crate::face::client::run(proxy, ctx, req),
        Local::Proxy => crate::face::admin::proxy_command(proxy, ctx, req),
        Local::Hotkeys => {
            // (what changes the session needs PROXY AUTH where admin.password is set)
            let reads = matches!(req.arg(1).to_ascii_uppercase().as_slice(), b"GET" | b"HELP");
            if !reads && proxy.config.admin.password.is_some() && !ctx.client.admin {
                return ctx.error(errors::ADMIN_NOPERM);
            }
            ctx.reply(|w| proxy.hotkeys.command(req, w))
        }
        Local::Cluster => crate::face::cluster::run(proxy, ctx, req),
        Local::Config => crate::face::config::run(proxy, ctx, req),
        // the masters' INFO for the same sections, aggregated (crate::face::info)
        Local::Info => crate::path::route::to_masters(proxy, ctx, req.raw().clone(), crate::face::info::info_text),
    }
}

/// The user `user` (`default` when not given) logged in with `pass`, or why not, in
/// Redis's words. A failure is counted, logged (`ACL LOG`) and taken from the client
/// address's bucket; an address whose bucket is empty is refused unchecked
/// (crate::services::acl::AuthLimiter).
fn check_auth(
    proxy: &Proxy,
    ctx: &Ctx,
    user: Option<&[u8]>,
    pass: &[u8],
) -> Result<std::sync::Arc<crate::services::acl::User>, &'static str> {
    let name = String::from_utf8_lossy(user.unwrap_or(b"default"));
    let found = proxy.users.get(&name);
    let addr = ctx.client.info.addr.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
    let fail = |reason: &'static str| {
        crate::metrics::acl_denied(found.as_ref().map_or("(unknown)", |u| u.name.as_str()), reason);
        let context = if matches!(ctx.client.modes.multi, crate::conn::Mode::Multi(_)) { "multi" } else { "toplevel" };
        let line = crate::face::client::line(proxy, &ctx.client.info);
        proxy.users.log.add("auth", context, ctx.req.arg(0), &name, line);
        Err(errors::WRONGPASS)
    };
    if !proxy.auth_limiter.may_try(addr) {
        tracing::warn!(client = %ctx.client.info.addr, "AUTH refused: too many failed logins from this address");
        return fail("auth_rate");
    }
    let Some(u) = found.clone() else {
        proxy.auth_limiter.failed(addr);
        return fail("auth");
    };
    let p = u.perms();
    if user.is_none() && p.nopass && p.enabled {
        return Err(errors::AUTH_WITHOUT_PASSWORD);
    }
    if !p.accepts(pass) {
        drop(p);
        proxy.auth_limiter.failed(addr);
        return fail("auth");
    }
    drop(p);
    Ok(u)
}

/// The connection is `u`'s from now on.
fn log_in(ctx: &mut Ctx, u: std::sync::Arc<crate::services::acl::User>) {
    ctx.client.info.names.lock().user = (u.name != "default").then(|| u.name.clone());
    ctx.client.user = u;
    ctx.client.authed = true;
}

fn hello(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    let mut proto = ctx.client.proto;
    if req.argc() >= 2 {
        match parse_i64(req.arg(1)) {
            Some(2) => proto = Proto::Resp2,
            Some(3) => proto = Proto::Resp3,
            Some(_) => return ctx.error(errors::NOPROTO),
            None => return ctx.error(errors::PROTO_NOT_AN_INTEGER),
        }
    }
    let mut i = 2;
    let mut auth = None;
    let mut name = None;
    while i < req.argc() {
        let more = req.argc() - i - 1;
        if req.arg(i).eq_ignore_ascii_case(b"AUTH") && more >= 2 {
            auth = Some((req.arg(i + 1), req.arg(i + 2)));
            i += 3;
        } else if req.arg(i).eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
            name = Some(req.arg(i + 1));
            i += 2;
        } else {
            return ctx.error(&errors::hello_syntax(&String::from_utf8_lossy(req.arg(i))));
        }
    }
    if let Some((u, p)) = auth {
        match check_auth(proxy, ctx, Some(u), p) {
            Ok(u) => log_in(ctx, u),
            Err(e) => return ctx.error(e),
        }
    }
    if !ctx.client.authed {
        return ctx.error(errors::HELLO_NOAUTH);
    }
    if let Some(n) = name
        && let Err(e) = crate::face::client::set_name(ctx, n)
    {
        return ctx.error(e);
    }
    ctx.client.proto = proto;
    let version = proxy.redis_version.read().clone();
    let id = ctx.client.id as i64;
    ctx.reply(|w| {
        w.map(7);
        w.bulk(b"server");
        w.bulk(b"redis");
        w.bulk(b"version");
        w.bulk(version.as_bytes());
        w.bulk(b"proto");
        w.int(proto.version());
        w.bulk(b"id");
        w.int(id);
        w.bulk(b"mode");
        w.bulk(b"standalone");
        w.bulk(b"role");
        w.bulk(b"master");
        w.bulk(b"modules");
        w.array(0);
    })
}

/// The ACL subcommands heatshield answers: its own users (WHOAMI, USERS, LIST, GETUSER,
/// SETUSER, DELUSER) and categories (CAT), never a master's: forwarded, they would show
/// or change the backend user heatshield logs in as. (Who may run which is checked
/// before, like any command: SETUSER and the others are `@admin`.)
fn acl(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    use crate::command::cat;
    let sub = req.arg(1).to_ascii_uppercase();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match sub.as_slice() {
        b"WHOAMI" => {
            let name = ctx.client.user.name.clone();
            ctx.reply(|w| w.bulk(name.as_bytes()))
        }
        b"USERS" => {
            let names = proxy.users.names();
            ctx.reply(|w| {
                w.array(names.len());
                for n in &names {
                    w.bulk(n.as_bytes());
                }
            })
        }
        b"LIST" => {
            let lines: Vec<String> = proxy
                .users
                .all()
                .iter()
                .map(|u| format!("user {} {}", u.name, u.perms().describe(&proxy.commands)))
                .collect();
            ctx.reply(|w| {
                w.array(lines.len());
                for l in &lines {
                    w.bulk(l.as_bytes());
                }
            })
        }
        b"GETUSER" => {
            let Some(u) = proxy.users.get(&text(req.arg(2))) else { return ctx.reply(|w| w.nil()) };
            let p = u.perms();
            let flags = p.flags();
            let passwords: Vec<String> = p.passwords.iter().map(crate::services::acl::hex).collect();
            let rules =
                |p: &crate::services::acl::Perms| [p.command_rules(&proxy.commands), p.key_rules(), p.channel_rules()];
            let root = rules(&p);
            let selectors: Vec<[String; 3]> = p.selectors.iter().map(rules).collect();
            // (the root's command, key and channel rules, and each selector's, alike)
            let three = |w: &mut crate::protocol::encode::Writer<'_>, r: &[String; 3]| {
                for (name, text) in [&b"commands"[..], b"keys", b"channels"].into_iter().zip(r) {
                    w.bulk(name);
                    w.bulk(text.as_bytes());
                }
            };
            ctx.reply(|w| {
                w.map(6);
                w.bulk(b"flags");
                w.array(flags.len());
                for f in &flags {
                    w.bulk(f.as_bytes());
                }
                w.bulk(b"passwords");
                w.array(passwords.len());
                for h in &passwords {
                    w.bulk(h.as_bytes());
                }
                three(w, &root);
                w.bulk(b"selectors");
                w.array(selectors.len());
                for s in &selectors {
                    w.map(3);
                    three(w, s);
                }
            })
        }
        b"SETUSER" => {
            let rules: Vec<&[u8]> = (3..req.argc()).map(|i| req.arg(i)).collect();
            match proxy.users.set_user(&text(req.arg(2)), &rules, &proxy.commands) {
                Ok(u) => {
                    crate::metrics::acl_user(&u.name);
                    ctx.reply(|w| w.ok())
                }
                Err(e) => ctx.error(&e),
            }
        }
        b"DRYRUN" => {
            let name = text(req.arg(2));
            let Some(u) = proxy.users.get(&name) else {
                return ctx.error(&format!("ERR User '{name}' not found"));
            };
            // the command as it would be run: its own request, resolved as dispatch does
            let args: Vec<bytes::Bytes> = (3..req.argc()).map(|i| bytes::Bytes::copy_from_slice(req.arg(i))).collect();
            let probe = Request::from_args(&args);
            let cmd = match proxy.commands.lookup(&probe) {
                Ok(c) => c,
                Err(crate::command::LookupError::Arity(e)) => return ctx.error(&e),
                Err(_) => return ctx.error(&format!("ERR Command '{}' not found", text(req.arg(3)))),
            };
            let verdict = match u.perms().check(cmd, &probe) {
                Ok(()) => None,
                Err(d) => Some(match d.why {
                    crate::services::acl::Denied::Command => {
                        format!("This user has no permissions to run the '{}' command", cmd.lower)
                    }
                    crate::services::acl::Denied::Key => {
                        format!("This user has no permissions to access the '{}' key", text(probe.arg(d.arg)))
                    }
                    crate::services::acl::Denied::Channel => {
                        format!("This user has no permissions to access the '{}' channel", text(probe.arg(d.arg)))
                    }
                }),
            };
            match verdict {
                None => ctx.reply(|w| w.ok()),
                Some(v) => ctx.reply(|w| w.bulk(v.as_bytes())),
            }
        }
        b"LOG" => {
            let n = match req.argc() {
                2 => None,
                3 if req.arg(2).eq_ignore_ascii_case(b"RESET") => {
                    proxy.users.log.reset();
                    return ctx.reply(|w| w.ok());
                }
                3 => match parse_i64(req.arg(2)) {
                    Some(n) => Some(n.max(0) as usize),
                    None => return ctx.error(crate::errors::NOT_AN_INTEGER),
                },
                _ => return ctx.error(&crate::errors::subcommand_arity(&text(req.arg(1)), "ACL")),
            };
            let entries = proxy.users.log.newest(n);
            let now = std::time::Instant::now();
            ctx.reply(|w| {
                w.array(entries.len());
                for e in &entries {
                    w.map(7);
                    w.bulk(b"count");
                    w.int(e.count as i64);
                    w.bulk(b"reason");
                    w.bulk(e.reason.as_bytes());
                    w.bulk(b"context");
                    w.bulk(e.context.as_bytes());
                    w.bulk(b"object");
                    w.bulk(&e.object);
                    w.bulk(b"username");
                    w.bulk(e.username.as_bytes());
                    w.bulk(b"age-seconds");
                    w.double(now.duration_since(e.at).as_secs_f64());
                    w.bulk(b"client-info");
                    w.bulk(e.client_info.as_bytes());
                }
            })
        }
        b"GENPASS" => {
            let bits = match req.argc() {
                2 => 256,
                _ => match parse_i64(req.arg(2)) {
                    Some(b) if (1..=4096).contains(&b) => b as usize,
                    Some(_) => return ctx.error(crate::errors::GENPASS_BITS),
                    None => return ctx.error(crate::errors::NOT_AN_INTEGER),
                },
            };
            let mut bytes = vec![0u8; bits.div_ceil(8)];
            if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).is_err() {
                return ctx.error("ERR no random bytes");
            }
            let mut hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            hex.truncate(bits.div_ceil(4));
            ctx.reply(|w| w.bulk(hex.as_bytes()))
        }
        b"DELUSER" => {
            let names: Vec<String> = (2..req.argc()).map(|i| text(req.arg(i))).collect();
            if names.iter().any(|n| n == "default") {
                return ctx.error(crate::errors::DELUSER_DEFAULT);
            }
            let gone = proxy.users.delete(&names.iter().map(String::as_str).collect::<Vec<_>>());
            // as on Redis, the connections logged in as a deleted user are closed
            let me = ctx.client.id;
            for c in proxy.clients.all() {
                if gone.iter().any(|u| u.name == c.user()) {
                    if c.id == me {
                        ctx.client.quit = true;
                    } else {
                        c.send(crate::conn::Control::Kill);
                        proxy.clients.remove(c.id);
                    }
                }
            }
            let n = gone.len() as i64;
            ctx.reply(|w| w.int(n))
        }
        _ => match req.argc() {
            2 => ctx.reply(|w| {
                w.array(cat::NAMES.len());
                for n in cat::NAMES {
                    w.bulk(n.as_bytes());
                }
            }),
            3 => match cat::of(req.arg(2)) {
                Some(bit) => {
                    let names = proxy.commands.in_category(bit);
                    ctx.reply(|w| {
                        w.array(names.len());
                        for n in &names {
                            w.bulk(n.as_bytes());
                        }
                    })
                }
                None => ctx.error(&crate::errors::unknown_category(req.arg(2))),
            },
            _ => ctx.error(&crate::errors::subcommand_arity(&String::from_utf8_lossy(req.arg(1)), "ACL")),
        },
    }
}
