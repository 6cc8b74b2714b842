//! Commands heatshield answers itself, about the client connection or the proxy: PING,
//! ECHO, QUIT, SELECT, HELLO, AUTH, TIME, RESET, CLIENT SETNAME/GETNAME/ID/SETINFO/INFO and
//! INFO (whose keyspace part is gathered from the masters). Replies follow Redis's texts.

use bytes::Bytes;

use crate::command::Local;
use crate::errors;
use crate::pending::{Ctx, Outcome};
use crate::protocol::request::parse_i64;
use crate::protocol::{Proto, Request};
use crate::proxy::Proxy;

pub fn run(proxy: &Proxy, ctx: &mut Ctx, l: Local, req: &Request) -> Outcome {
    match l {
        Local::Ping => match req.argc() {
            1 => ctx.reply(|w| w.simple("PONG")),
            2 => ctx.reply(|w| w.bulk(req.arg(1))),
            _ => ctx.error(&crate::errors::wrong_arity("ping")),
        },
        Local::Echo => ctx.reply(|w| w.bulk(req.arg(1))),
        Local::Quit => {
            ctx.client.quit = true;
            ctx.reply(|w| w.ok())
        }
        Local::Ok => ctx.reply(|w| w.ok()),
        Local::Select => match parse_i64(req.arg(1)) {
            Some(0) => ctx.reply(|w| w.ok()),
            Some(_) => ctx.error(errors::DB_OUT_OF_RANGE),
            None => ctx.error(crate::errors::NOT_AN_INTEGER),
        },
        Local::Time => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            ctx.reply(|w| {
                w.array(2);
                w.bulk(itoa::Buffer::new().format(now.as_secs()).as_bytes());
                w.bulk(itoa::Buffer::new().format(now.subsec_micros()).as_bytes());
            })
        }
        Local::Reset => {
            ctx.client.mode = crate::client::Mode::Normal;
            ctx.client.proto = Proto::Resp2;
            ctx.client.name = None;
            ctx.client.authed = proxy.config.server.password.is_none();
            ctx.reply(|w| w.simple("RESET"))
        }
        Local::Auth => {
            let (user, pass) = match req.argc() {
                2 => (None, req.arg(1)),
                3 => (Some(req.arg(1)), req.arg(2)),
                _ => return ctx.error(crate::errors::SYNTAX),
            };
            match check_auth(proxy, user, pass) {
                Ok(()) => {
                    ctx.client.authed = true;
                    ctx.reply(|w| w.ok())
                }
                Err(e) => ctx.error(e),
            }
        }
        Local::Hello => hello(proxy, ctx, req),
        Local::ClientSetName => match set_name(ctx, req.arg(2)) {
            Ok(()) => ctx.reply(|w| w.ok()),
            Err(e) => ctx.error(e),
        },
        Local::ClientGetName => match ctx.client.name.clone() {
            Some(n) => ctx.reply(|w| w.bulk(&n)),
            None => ctx.reply(|w| w.nil()),
        },
        Local::ClientId => {
            let id = ctx.client.id as i64;
            ctx.reply(|w| w.int(id))
        }
        Local::ClientSetInfo => {
            let attr = req.arg(2);
            let val = req.arg(3);
            if val.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
                return ctx.error(errors::LIB_INFO_CHARS);
            }
            if attr.eq_ignore_ascii_case(b"LIB-NAME") {
                ctx.client.lib_name = String::from_utf8_lossy(val).into_owned();
            } else if attr.eq_ignore_ascii_case(b"LIB-VER") {
                ctx.client.lib_ver = String::from_utf8_lossy(val).into_owned();
            } else {
                return ctx.error(&errors::unrecognized_option(&String::from_utf8_lossy(attr)));
            }
            ctx.reply(|w| w.ok())
        }
        Local::ClientInfo => {
            let line = client_info_line(ctx);
            ctx.reply(|w| w.verbatim(line.as_bytes()))
        }
        Local::Proxy => crate::admin::proxy_command(proxy, ctx, req),
        Local::Cluster => crate::cluster_face::run(proxy, ctx, req),
        Local::Info => {
            let sections: Vec<String> =
                req.args().skip(1).map(|a| String::from_utf8_lossy(a).to_ascii_lowercase()).collect();
            crate::route::info(proxy, ctx, sections, crate::info::info_text)
        }
    }
}

fn check_auth(proxy: &Proxy, user: Option<&[u8]>, pass: &[u8]) -> Result<(), &'static str> {
    match &proxy.config.server.password {
        Some(p) => {
            if user.is_none_or(|u| u == b"default") && pass == p.as_bytes() {
                Ok(())
            } else {
                Err(errors::WRONGPASS)
            }
        }
        None => match user {
            None => Err(errors::AUTH_WITHOUT_PASSWORD),
            Some(b"default") => Ok(()),
            Some(_) => Err(errors::WRONGPASS),
        },
    }
}

fn set_name(ctx: &mut Ctx, name: &[u8]) -> Result<(), &'static str> {
    if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return Err(errors::CLIENT_NAME_CHARS);
    }
    ctx.client.name = if name.is_empty() { None } else { Some(Bytes::copy_from_slice(name)) };
    Ok(())
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
        if let Err(e) = check_auth(proxy, Some(u), p) {
            return ctx.error(e);
        }
        ctx.client.authed = true;
    }
    if !ctx.client.authed {
        return ctx.error(errors::HELLO_NOAUTH);
    }
    if let Some(n) = name
        && let Err(e) = set_name(ctx, n)
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

fn client_info_line(ctx: &Ctx) -> String {
    let c = &*ctx.client;
    format!(
        "id={} addr={} laddr={} fd=-1 name={} age={} idle=0 flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 resp={} lib-name={} lib-ver={}\n",
        c.id,
        c.addr,
        c.laddr,
        c.name.as_deref().map(String::from_utf8_lossy).unwrap_or_default(),
        c.created.elapsed().as_secs(),
        c.proto.version(),
        c.lib_name,
        c.lib_ver,
    )
}
