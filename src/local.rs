//! Commands heatshield answers itself, about the client connection or the proxy: PING,
//! ECHO, QUIT, SELECT, HELLO, AUTH, TIME, RESET, CLIENT SETNAME/GETNAME/ID/SETINFO/INFO and
//! INFO (whose keyspace part is gathered from the masters). Replies follow Redis's texts.

use bytes::Bytes;

use crate::command::Local;
use crate::protocol::request::parse_i64;
use crate::protocol::{Proto, Request, Value};
use crate::proxy::{Ctx, Outcome, Proxy};

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

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
            Some(_) => ctx.error("ERR DB index is out of range (heatshield serves database 0 only)"),
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
                return ctx.error("ERR lib-name and lib-ver cannot contain spaces, newlines or special characters.");
            }
            if attr.eq_ignore_ascii_case(b"LIB-NAME") {
                ctx.client.lib_name = String::from_utf8_lossy(val).into_owned();
            } else if attr.eq_ignore_ascii_case(b"LIB-VER") {
                ctx.client.lib_ver = String::from_utf8_lossy(val).into_owned();
            } else {
                return ctx.error(&format!("ERR Unrecognized option '{}'", String::from_utf8_lossy(attr)));
            }
            ctx.reply(|w| w.ok())
        }
        Local::ClientInfo => {
            let line = client_info_line(ctx);
            ctx.reply(|w| w.verbatim(line.as_bytes()))
        }
        Local::Proxy => crate::admin::proxy_command(proxy, ctx, req),
        Local::Info => {
            let sections: Vec<String> =
                req.args().skip(1).map(|a| String::from_utf8_lossy(a).to_ascii_lowercase()).collect();
            proxy.info_fan_out(ctx, sections, info_text)
        }
    }
}

fn check_auth(proxy: &Proxy, user: Option<&[u8]>, pass: &[u8]) -> Result<(), &'static str> {
    match &proxy.config.server.password {
        Some(p) => {
            if user.is_none_or(|u| u == b"default") && pass == p.as_bytes() {
                Ok(())
            } else {
                Err(WRONGPASS)
            }
        }
        None => match user {
            None => Err(
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            ),
            Some(b"default") => Ok(()),
            Some(_) => Err(WRONGPASS),
        },
    }
}

fn set_name(ctx: &mut Ctx, name: &[u8]) -> Result<(), &'static str> {
    if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return Err("ERR Client names cannot contain spaces, newlines or special characters.");
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
            Some(_) => return ctx.error("NOPROTO unsupported protocol version"),
            None => return ctx.error("ERR Protocol version is not an integer or out of range"),
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
            return ctx.error(&format!("ERR Syntax error in HELLO option '{}'", String::from_utf8_lossy(req.arg(i))));
        }
    }
    if let Some((u, p)) = auth {
        if let Err(e) = check_auth(proxy, Some(u), p) {
            return ctx.error(e);
        }
        ctx.client.authed = true;
    }
    if !ctx.client.authed {
        return ctx.error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        );
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

/// Builds the INFO reply from the proxy's own state and the masters' `INFO server keyspace`.
pub fn info_text(proxy: &Proxy, ctx: &mut Ctx, sections: &[String], backend: &[&[u8]]) -> Bytes {
    use std::fmt::Write;
    let default =
        sections.is_empty() || sections.iter().any(|s| matches!(s.as_str(), "all" | "default" | "everything"));
    let everything = sections.iter().any(|s| matches!(s.as_str(), "all" | "everything"));
    let want = |s: &str| default || sections.iter().any(|x| x == s);
    // as in Redis, command statistics come only with "all", "everything" or by name
    let want_extra = |s: &str| everything || sections.iter().any(|x| x == s);
    let mut keys = 0i64;
    let mut expires = 0i64;
    for text in backend {
        for line in text.split(|&c| c == b'\n') {
            let line = std::str::from_utf8(line).unwrap_or("").trim_end();
            if let Some(rest) = line.strip_prefix("db0:") {
                for kv in rest.split(',') {
                    match kv.split_once('=') {
                        Some(("keys", v)) => keys += v.parse::<i64>().unwrap_or(0),
                        Some(("expires", v)) => expires += v.parse::<i64>().unwrap_or(0),
                        _ => {}
                    }
                }
            } else if let Some(v) = line.strip_prefix("redis_version:") {
                *proxy.redis_version.write() = v.to_string();
            }
        }
    }
    let up = proxy.started.elapsed().as_secs();
    let topo = proxy.cluster.topology();
    let mut s = String::new();
    if want("proxy") {
        let _ = write!(
            s,
            "# Proxy\r\nheatshield_version:{}\r\nuptime_in_seconds:{up}\r\nconfig_file:{}\r\nbackend_mode:{}\r\nmasters:{}\r\nslot_map_epoch:{}\r\ntopology_refreshes:{}\r\ntotal_commands_processed:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            proxy.config_file.as_deref().unwrap_or(""),
            if proxy.cluster.is_cluster() { "cluster" } else { "standalone" },
            topo.masters.len(),
            topo.version,
            proxy.cluster.refreshes.load(std::sync::atomic::Ordering::Relaxed),
            proxy.stats.commands.load(std::sync::atomic::Ordering::Relaxed),
        );
    }
    if want("server") {
        let _ = write!(
            s,
            "# Server\r\nredis_version:{}\r\nredis_mode:standalone\r\nheatshield_version:{}\r\nos:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{up}\r\nuptime_in_days:{}\r\n\r\n",
            proxy.redis_version.read(),
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            proxy.config.server.listen.rsplit(':').next().unwrap_or(""),
            up / 86400,
        );
    }
    if want("clients") {
        let st = &proxy.stats;
        let _ = write!(
            s,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\ntotal_connections_received:{}\r\nrejected_connections:{}\r\n\r\n",
            st.clients.load(std::sync::atomic::Ordering::Relaxed),
            proxy.config.server.max_clients,
            st.accepted.load(std::sync::atomic::Ordering::Relaxed),
            st.rejected.load(std::sync::atomic::Ordering::Relaxed),
        );
    }
    if want("keyspace") {
        s.push_str("# Keyspace\r\n");
        if keys > 0 {
            let _ = write!(s, "db0:keys={keys},expires={expires},avg_ttl=0\r\n");
        }
        s.push_str("\r\n");
    }
    crate::admin::info_sections(proxy, want_extra("commandstats"), want_extra("latencystats"), &mut s);
    let text = s.trim_end_matches("\r\n").to_string() + if s.is_empty() { "" } else { "\r\n" };
    let mut w = crate::protocol::Writer::new(ctx.scratch, ctx.client.proto);
    w.verbatim(text.as_bytes());
    ctx.scratch.split().freeze()
}

/// Extracts `redis_version` from an INFO reply (used at start-up).
pub fn redis_version_of(info_reply: &[u8]) -> Option<String> {
    let (v, _) = Value::parse(info_reply).ok()?;
    let text = v.as_bytes()?;
    std::str::from_utf8(text).ok()?.lines().find_map(|l| l.strip_prefix("redis_version:").map(|v| v.trim().to_string()))
}
