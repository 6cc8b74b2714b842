//! CLIENT commands about heatshield's own clients, against a real cluster: LIST and INFO
//! with Redis's fields, KILL by each filter, REPLY ON/OFF/SKIP, UNBLOCK of a blocked
//! client, NO-EVICT / NO-TOUCH, and RESET leaving every mode.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::client::{Conn, Proto, V};
use common::{ClusterEnv, Shared, cmd_text, wait_until};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

fn err(text: &str) -> V {
    V::Err(text.into())
}

/// `field=value` pairs of one CLIENT LIST line.
fn fields(line: &str) -> Vec<(String, String)> {
    line.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn field(line: &str, name: &str) -> String {
    fields(line).into_iter().find(|(k, _)| k == name).map(|(_, v)| v).unwrap_or_default()
}

/// The line of client `id` in CLIENT LIST as seen from `c`.
fn line_of(c: &mut Conn, id: i64) -> Option<String> {
    let list = c.cmd(&["CLIENT", "LIST"]).text();
    list.lines().find(|l| field(l, "id") == id.to_string()).map(str::to_string)
}

/// idle= counts the seconds since the client's last command, as Redis's does: a client
/// that was quiet shows them, and one that just sent a command shows 0.
#[test]
fn client_list_idle_counts_from_the_last_command() {
    let env = env();
    let port = env.proxy.port();
    let mut quiet = Conn::connect(port);
    let mut watcher = Conn::connect(port);
    let id = quiet.cmd(&["CLIENT", "ID"]).int();
    for _ in 0..50 {
        assert_eq!(quiet.cmd(&["PING"]), V::s("PONG"));
    }
    thread::sleep(Duration::from_millis(2200));
    let line = line_of(&mut watcher, id).expect("the quiet client in CLIENT LIST");
    assert_eq!(field(&line, "idle"), "2", "{line}");
    let me = watcher.cmd(&["CLIENT", "ID"]).int();
    assert_eq!(field(&line_of(&mut watcher, me).unwrap(), "idle"), "0");
    assert_eq!(quiet.cmd(&["PING"]), V::s("PONG"));
    let line = line_of(&mut watcher, id).expect("the quiet client in CLIENT LIST");
    assert_eq!(field(&line, "idle"), "0", "{line}");
    assert_eq!(field(&line, "cmd"), "ping", "{line}");
}

#[test]
fn client_list_shows_every_client_with_redis_fields() {
    let env = env();
    let port = env.proxy.port();
    let mut a = Conn::connect(port);
    let mut b = Conn::connect_proto(port, Proto::Resp3);
    assert_eq!(a.cmd(&["CLIENT", "SETNAME", "alpha"]), V::ok());
    assert_eq!(b.cmd(&["CLIENT", "SETINFO", "LIB-NAME", "mylib"]), V::ok());
    let (ida, idb) = (a.cmd(&["CLIENT", "ID"]).int(), b.cmd(&["CLIENT", "ID"]).int());
    assert_eq!(b.cmd(&["MULTI"]), V::ok());
    assert_eq!(b.cmd(&["SET", "{cl}k", "v"]), V::s("QUEUED"));

    let la = line_of(&mut a, ida).expect("a in CLIENT LIST");
    let lb = line_of(&mut a, idb).expect("b in CLIENT LIST");
    assert_eq!(field(&la, "name"), "alpha");
    assert_eq!(field(&la, "flags"), "N");
    assert_eq!(field(&la, "cmd"), "client|list");
    assert_eq!(field(&la, "resp"), "2");
    assert_eq!(field(&lb, "lib-name"), "mylib");
    assert_eq!(field(&lb, "flags"), "x");
    assert_eq!(field(&lb, "multi"), "1");
    assert_eq!(field(&lb, "resp"), "3");
    assert_eq!(field(&la, "addr"), a.stream().local_addr().unwrap().to_string());
    // every field Redis's own CLIENT LIST has, in Redis's order
    let owner = env.owners.masters()[0];
    let redis_line = cmd_text(owner, &["CLIENT", "INFO"]);
    let redis_names: Vec<String> = fields(&redis_line).into_iter().map(|(k, _)| k).collect();
    let ours: Vec<String> = fields(&la).into_iter().map(|(k, _)| k).collect();
    let common_order: Vec<&String> = ours.iter().filter(|k| redis_names.contains(k)).collect();
    assert_eq!(common_order, redis_names.iter().collect::<Vec<_>>(), "{la}\nvs Redis: {redis_line}");
    // CLIENT INFO is this client's line
    let info = a.cmd(&["CLIENT", "INFO"]).text();
    assert_eq!(field(&info, "id"), ida.to_string());
    // filters
    let only_b = a.cmd(&["CLIENT", "LIST", "ID", &idb.to_string()]).text();
    assert_eq!(only_b.lines().count(), 1, "{only_b}");
    assert_eq!(a.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]).text(), "");
    assert!(a.cmd(&["CLIENT", "LIST", "TYPE", "normal"]).text().lines().count() >= 2);
    assert_eq!(a.cmd(&["CLIENT", "LIST", "TYPE", "bogus"]), err("ERR Unknown client type 'bogus'"));
    assert_eq!(a.cmd(&["CLIENT", "LIST", "ID", "x"]), err("ERR Invalid client ID"));
    assert_eq!(b.cmd(&["DISCARD"]), V::ok());
}

#[test]
fn client_kill_closes_the_matching_clients() {
    let env = env();
    let port = env.proxy.port();
    let mut admin = Conn::connect(port);
    let mut victim = Conn::connect(port);
    let id = victim.cmd(&["CLIENT", "ID"]).int();
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]), V::Int(1));
    assert!(victim.expect_closed(Duration::from_secs(5)), "killed client still connected");
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]), V::Int(0));

    // the old form: by address, +OK or an error
    let mut victim = Conn::connect(port);
    assert_eq!(victim.cmd(&["PING"]), V::s("PONG"));
    let addr = victim.stream().local_addr().unwrap().to_string();
    assert_eq!(admin.cmd(&["CLIENT", "KILL", &addr]), V::ok());
    assert_eq!(admin.cmd(&["CLIENT", "KILL", &addr]), err("ERR No such client"));
    // ADDR with USER default, and LADDR; SKIPME yes (the default) spares the caller
    let mut victim = Conn::connect(port);
    assert_eq!(victim.cmd(&["PING"]), V::s("PONG"));
    let addr = victim.stream().local_addr().unwrap().to_string();
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "ADDR", &addr, "USER", "default"]), V::Int(1));
    assert!(victim.expect_closed(Duration::from_secs(5)));
    let me = admin.stream().local_addr().unwrap().to_string();
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "ADDR", &me]), V::Int(0));
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "TYPE", "master"]), V::Int(0));
    // errors, in Redis's words
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "ID", "0"]), err("ERR client-id should be greater than 0"));
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "USER", "nobody"]), err("ERR No such user 'nobody'"));
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "SKIPME", "maybe"]), err("ERR syntax error"));
    assert_eq!(admin.cmd(&["CLIENT", "KILL", "TYPE", "bogus"]), err("ERR Unknown client type 'bogus'"));
    // SKIPME no: the caller itself goes, after its reply
    let mut me_conn = Conn::connect(port);
    let my = me_conn.stream().local_addr().unwrap().to_string();
    assert_eq!(me_conn.cmd(&["CLIENT", "KILL", "ADDR", &my, "SKIPME", "no"]), V::Int(1));
    assert!(me_conn.expect_closed(Duration::from_secs(5)));
    assert_eq!(admin.cmd(&["PING"]), V::s("PONG"));
}

#[test]
fn client_reply_off_on_and_skip() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    let k = "{reply}k";
    // OFF: no reply until ON, whose +OK is written
    for cmd in
        [&["CLIENT", "REPLY", "OFF"][..], &["SET", k, "1"], &["INCR", k], &["CLIENT", "REPLY", "ON"], &["GET", k]]
    {
        c.send(cmd);
    }
    assert_eq!(c.read_reply(), V::ok());
    assert_eq!(c.read_reply(), V::s("2"));
    // SKIP: neither its own reply nor the next command's
    c.send(&["CLIENT", "REPLY", "SKIP"]);
    c.send(&["INCR", k]);
    assert_eq!(c.cmd(&["GET", k]), V::s("3"));
    assert_eq!(c.cmd(&["CLIENT", "REPLY", "MAYBE"]), err("ERR syntax error"));
    assert_eq!(c.cmd(&["DEL", k]), V::Int(1));
}

#[test]
fn client_unblock_ends_a_blocking_command() {
    let env = env();
    let port = env.proxy.port();
    let mut admin = Conn::connect(port);
    for proto in Proto::BOTH {
        let mut w = Conn::connect_proto(port, proto);
        let id = w.cmd(&["CLIENT", "ID"]).int().to_string();
        // not blocked: 0
        assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &id]), V::Int(0));
        // blocked: 1, and the command answers as if it timed out
        w.send(&["BLPOP", "{unblock}l", "0"]);
        wait_until(Duration::from_secs(5), "the client to block", || {
            line_of(&mut admin, id.parse().unwrap()).is_some_and(|l| field(&l, "flags") == "b")
        });
        assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &id]), V::Int(1));
        assert!(w.read_reply().is_nil(), "{proto:?}");
        // ERROR: -UNBLOCKED
        w.send(&["BRPOPLPUSH", "{unblock}l", "{unblock}m", "0"]);
        thread::sleep(Duration::from_millis(200));
        assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &id, "ERROR"]), V::Int(1));
        assert_eq!(w.read_reply(), err("UNBLOCKED client unblocked via CLIENT UNBLOCK"));
        assert_eq!(w.cmd(&["PING"]), V::s("PONG"));
        // the connection Redis held for it is gone: a push stays in the list
        assert_eq!(w.cmd(&["RPUSH", "{unblock}l", "x"]), V::Int(1));
        assert_eq!(w.cmd(&["LPOP", "{unblock}l"]), V::s("x"));
    }
    assert_eq!(
        admin.cmd(&["CLIENT", "UNBLOCK", "1", "LATER"]),
        err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR")
    );
    assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", "abc"]), err("ERR value is not an integer or out of range"));
}

#[test]
fn no_evict_no_touch_and_reset() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    let id = c.cmd(&["CLIENT", "ID"]).int();
    assert_eq!(c.cmd(&["CLIENT", "NO-EVICT", "on"]), V::ok());
    assert_eq!(c.cmd(&["CLIENT", "NO-TOUCH", "on"]), V::ok());
    assert_eq!(c.cmd(&["CLIENT", "NO-EVICT", "sometimes"]), err("ERR syntax error"));
    assert_eq!(field(&line_of(&mut c, id).unwrap(), "flags"), "eT");
    // RESET leaves every mode: name, transaction, WATCH, NO-EVICT/NO-TOUCH, REPLY
    assert_eq!(c.cmd(&["CLIENT", "SETNAME", "n"]), V::ok());
    assert_eq!(c.cmd(&["WATCH", "{reset}k"]), V::ok());
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["RESET"]), V::s("RESET"));
    let l = line_of(&mut c, id).unwrap();
    assert_eq!((field(&l, "flags"), field(&l, "name"), field(&l, "multi")), ("N".into(), "".into(), "-1".into()));
    assert_eq!(c.cmd(&["EXEC"]), err("ERR EXEC without MULTI"));
}
