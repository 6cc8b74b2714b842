//! CONFIG as one Redis would answer it (docs/info.md): `CONFIG GET` asks every master and
//! answers each parameter once (`maxmemory` summed, heatshield's own `maxclients`, `port`
//! and `bind`, secrets blanked, everything else the masters' common value: the first
//! master's when they differ); `CONFIG SET`, `RESETSTAT` and `REWRITE` change every
//! master, so they need the admin (`admin.password` set and `PROXY AUTH` done), and the
//! reply says which masters did not apply them.

use bytes::Bytes;

use crate::errors;
use crate::path::pending::{Ctx, Outcome};
use crate::path::route;
use crate::protocol::{Request, Value};
use crate::proxy::Proxy;

/// `CONFIG GET | SET | RESETSTAT | REWRITE ...`
pub fn run(proxy: &Proxy, ctx: &mut Ctx, req: &Request) -> Outcome {
    if req.arg(1).eq_ignore_ascii_case(b"GET") {
        return route::to_masters(proxy, ctx, req.raw().clone(), get_reply);
    }
    if proxy.config.admin.password.is_none() || !ctx.client.admin {
        return ctx.error(errors::CONFIG_NOPERM);
    }
    if req.arg(1).eq_ignore_ascii_case(b"RESETSTAT") {
        // heatshield's own statistics in INFO (commandstats, latencystats) too
        proxy.command_stats.reset();
    }
    route::to_masters(proxy, ctx, req.raw().clone(), each_reply)
}

/// Parameters whose value is heatshield's, not the masters'.
fn own(proxy: &Proxy, name: &str) -> Option<String> {
    let listen = &proxy.config.server.listen;
    let tls = &proxy.config.tls;
    let port = |a: &str| a.rsplit_once(':').map_or("0", |(_, p)| p).to_string();
    let file = |f: &Option<String>| f.clone().unwrap_or_default();
    Some(match name {
        "maxclients" => proxy.live.max_clients.load(std::sync::atomic::Ordering::Relaxed).to_string(),
        "port" => port(listen),
        "bind" => {
            let a = if listen == "off" { tls.listen.as_deref().unwrap_or("") } else { listen };
            a.rsplit_once(':').map_or("", |(h, _)| h).trim_matches(['[', ']']).to_string()
        }
        // heatshield's TLS listener, not the masters'
        "tls-port" => tls.listen.as_deref().map_or("0".into(), port),
        "tls-cert-file" => file(&tls.cert_file),
        "tls-key-file" => file(&tls.key_file),
        "tls-ca-cert-file" => file(&tls.ca_cert_file),
        "tls-auth-clients" => tls.auth_clients().to_string(),
        "requirepass" => proxy.config.server.password.clone().unwrap_or_default(),
        // the backends' credentials never reach a client
        "masterauth" | "masteruser" | "tls-key-file-pass" | "tls-client-key-file-pass" => String::new(),
        _ => return None,
    })
}

/// `CONFIG GET`: every parameter any master gave, once, in the first master's order.
fn get_reply(proxy: &Proxy, ctx: &mut Ctx, replies: &[(&str, &Bytes)]) -> Bytes {
    let mut names: Vec<String> = Vec::new();
    let mut values: Vec<Vec<String>> = Vec::new();
    let mut first_error = None;
    for (_, r) in replies {
        let pairs = match Value::parse(r) {
            Ok((Value::Array(items), _)) => {
                items.chunks(2).map(|c| (c[0].clone(), c.get(1).cloned().unwrap_or(Value::Nil))).collect()
            }
            Ok((Value::Map(pairs), _)) => pairs,
            _ => {
                first_error.get_or_insert(*r);
                continue;
            }
        };
        for (k, v) in pairs {
            let text = |v: &Value| String::from_utf8_lossy(v.as_bytes().unwrap_or_default()).into_owned();
            let (k, v) = (text(&k), text(&v));
            match names.iter().position(|n| *n == k) {
                Some(i) => values[i].push(v),
                None => {
                    names.push(k);
                    values.push(vec![v]);
                }
            }
        }
    }
    if names.is_empty()
        && let Some(e) = first_error
    {
        return e.clone(); // every master refused it (a wrong pattern count, ...)
    }
    let mut w = crate::protocol::Writer::new(ctx.scratch, ctx.client.proto);
    w.map(names.len());
    for (name, vals) in names.iter().zip(&values) {
        let v = own(proxy, name).unwrap_or_else(|| match name.as_str() {
            "maxmemory" => vals.iter().filter_map(|v| v.parse::<u64>().ok()).sum::<u64>().to_string(),
            _ => vals[0].clone(),
        });
        w.bulk(name.as_bytes());
        w.bulk(v.as_bytes());
    }
    ctx.scratch.split().freeze()
}

/// `CONFIG SET | RESETSTAT | REWRITE`: `+OK` when every master applied it; the masters'
/// error when all of them refused it alike; else an error naming the masters that did not.
fn each_reply(_proxy: &Proxy, ctx: &mut Ctx, replies: &[(&str, &Bytes)]) -> Bytes {
    let failed: Vec<&(&str, &Bytes)> = replies.iter().filter(|(_, r)| r.first() != Some(&b'+')).collect();
    if failed.is_empty() {
        return Bytes::from_static(b"+OK\r\n");
    }
    if failed.len() == replies.len() && failed.iter().all(|(_, r)| *r == failed[0].1) {
        return failed[0].1.clone();
    }
    let detail: Vec<String> = failed
        .iter()
        .map(|(addr, r)| {
            let text = crate::protocol::reply::error_text(r).map(String::from_utf8_lossy);
            format!("{addr}: {}", text.as_deref().unwrap_or("no reply"))
        })
        .collect();
    let text = crate::errors::applied_on_some(replies.len() - failed.len(), replies.len(), &detail.join("; "));
    let mut w = crate::protocol::Writer::new(ctx.scratch, ctx.client.proto);
    w.error(&text);
    ctx.scratch.split().freeze()
}
