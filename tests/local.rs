//! Commands the proxy answers itself (PING, ECHO, SELECT, HELLO, CLIENT ..., INFO, TIME,
//! QUIT, AUTH), commands answered by fanning out (DBSIZE, INFO keyspace, COMMAND ...),
//! Redis's error texts for unknown commands and wrong arity, the refusal text of
//! unsupported commands, password protection, and FLUSHALL's opt-in.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::client::{Conn, Kind, Proto, V};
use common::{ClusterEnv, Proxy, RedisCluster, Shared, cmd_text, info_field};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

/// The FLUSHALL test empties the shared cluster; tests that count or keep keys take the
/// read side so they never overlap with it.
static KEYS_LOCK: RwLock<()> = RwLock::new(());

fn keys_stable() -> RwLockReadGuard<'static, ()> {
    KEYS_LOCK.read().unwrap_or_else(|e| e.into_inner())
}

fn keys_exclusive() -> RwLockWriteGuard<'static, ()> {
    KEYS_LOCK.write().unwrap_or_else(|e| e.into_inner())
}

/// Writes `text` to a fresh temp dir as heatshield.toml; keep the dir alive while used.
fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new().prefix("heatshield-conf-").tempdir().expect("tempdir");
    let path = dir.path().join("heatshield.toml");
    std::fs::write(&path, text).expect("write config");
    (dir, path)
}

fn proxy_with_config(cluster: &RedisCluster, toml: &str) -> (Proxy, tempfile::TempDir) {
    let (dir, path) = config_file(toml);
    let path = path.to_str().unwrap().to_string();
    let proxy = Proxy::start_cluster(cluster, &["--config", &path]);
    (proxy, dir)
}

fn err(text: &str) -> V {
    V::Err(text.to_string())
}

fn sum_dbsize(env: &ClusterEnv) -> i64 {
    env.owners.masters().iter().map(|&m| cmd_text(m, &["DBSIZE"]).parse::<i64>().expect("DBSIZE")).sum()
}

#[test]
fn ping_echo_select() {
    let env = env();
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let pong = c.cmd_full(&["PING"]);
        assert_eq!((pong.kind(), pong.raw.as_slice()), (Kind::Simple, &b"+PONG\r\n"[..]));
        let msg = c.cmd_full(&["PING", "hello world"]);
        assert_eq!((msg.kind(), msg.v), (Kind::Bulk, V::s("hello world")));
        assert_eq!(c.cmd(&["PING", "a", "b"]), err("ERR wrong number of arguments for 'ping' command"));
        assert_eq!(c.cmd(&["ECHO", "bin\r\n\u{0}"]), V::s("bin\r\n\u{0}"));
        assert_eq!(c.cmd(&["echo", ""]), V::s(""));
        assert_eq!(c.cmd(&["SELECT", "0"]), V::ok());
        let e = c.cmd(&["SELECT", "1"]);
        assert!(
            e.err().is_some_and(|e| e.starts_with("ERR DB index is out of range")),
            "SELECT 1 must be refused: {e:?}"
        );
        assert_eq!(c.cmd(&["SELECT", "x"]), err("ERR value is not an integer or out of range"));
        // still on db 0 and usable
        assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
    }
}

#[test]
fn hello_negotiates_the_protocol() {
    let env = env();
    let master = env.owners.masters()[0];
    let redis_version = info_field(&cmd_text(master, &["INFO", "server"]), "redis_version").expect("redis_version");

    let mut c = Conn::connect(env.proxy.port());
    let r = {
        c.send(&["HELLO", "3"]);
        c.set_proto(Proto::Resp3);
        c.read_full()
    };
    assert_eq!(r.kind(), Kind::Map, "HELLO 3 must reply with a RESP3 map: {r:?}");
    let keys: Vec<String> = r.v.pairs().iter().map(|(k, _)| k.text()).collect();
    for k in ["server", "version", "proto", "id", "mode", "role", "modules"] {
        assert!(keys.iter().any(|x| x == k), "HELLO 3 map lacks {k}: {r:?}");
    }
    assert_eq!(r.v.get("server"), Some(V::s("redis")));
    assert_eq!(r.v.get("version"), Some(V::s(&redis_version)));
    assert_eq!(r.v.get("proto"), Some(V::Int(3)));
    assert_eq!(r.v.get("role"), Some(V::s("master")));
    assert!(matches!(r.v.get("mode"), Some(V::Str(_))));
    assert_eq!(r.v.get("modules"), Some(V::Arr(vec![])));
    let id = r.v.get("id").expect("id").int();
    assert_eq!(c.cmd(&["CLIENT", "ID"]), V::Int(id));
    // now RESP3 on the wire: a missing key is `_`
    let nil = c.cmd_full(&["GET", "local:hello:missing"]);
    assert_eq!((nil.kind(), nil.raw.as_slice()), (Kind::Null, &b"_\r\n"[..]));
    // HELLO without a version reports the current one
    assert_eq!(c.cmd(&["HELLO"]).get("proto"), Some(V::Int(3)));
    // unsupported versions
    assert_eq!(c.cmd(&["HELLO", "4"]), err("NOPROTO unsupported protocol version"));
    assert_eq!(c.cmd(&["HELLO", "1"]), err("NOPROTO unsupported protocol version"));
    assert_eq!(c.cmd(&["HELLO", "three"]), err("ERR Protocol version is not an integer or out of range"));
    // still RESP3 after the failed attempts
    assert_eq!(c.cmd_full(&["GET", "local:hello:missing"]).kind(), Kind::Null);

    // back to RESP2: the HELLO 2 reply itself is a flat array
    c.send(&["HELLO", "2", "SETNAME", "back-to-two"]);
    c.set_proto(Proto::Resp2);
    let r2 = c.read_full();
    assert_eq!(r2.kind(), Kind::Array, "HELLO 2 reply: {r2:?}");
    assert_eq!(r2.v.items().len(), 14);
    assert_eq!(r2.v.get("proto"), Some(V::Int(2)));
    assert_eq!(r2.v.get("id"), Some(V::Int(id)), "HELLO must not change the client id");
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]), V::s("back-to-two"));
    let nil = c.cmd_full(&["GET", "local:hello:missing"]);
    assert_eq!(nil.raw, b"$-1\r\n");
    // syntax errors
    let e = c.cmd(&["HELLO", "3", "BOGUS"]);
    assert!(e.err().is_some_and(|e| e.starts_with("ERR Syntax error in HELLO option 'BOGUS'")), "{e:?}");
    assert_eq!(c.cmd_full(&["PING"]).raw, b"+PONG\r\n", "failed HELLO must not switch protocols");
}

#[test]
fn client_subcommands_answered_locally() {
    let env = env();
    for proto in Proto::BOTH {
        let mut a = Conn::connect_proto(env.proxy.port(), proto);
        let mut b = Conn::connect_proto(env.proxy.port(), proto);
        let (ida, idb) = (a.cmd(&["CLIENT", "ID"]).int(), b.cmd(&["CLIENT", "ID"]).int());
        assert!(ida > 0 && idb > 0 && ida != idb, "client ids {ida} {idb}");
        assert_eq!(a.cmd(&["CLIENT", "ID"]), V::Int(ida), "id is stable");

        assert_eq!(a.cmd(&["CLIENT", "GETNAME"]), V::Nil);
        assert_eq!(a.cmd(&["CLIENT", "SETNAME", "worker-1"]), V::ok());
        assert_eq!(a.cmd(&["client", "getname"]), V::s("worker-1"));
        assert_eq!(b.cmd(&["CLIENT", "GETNAME"]), V::Nil, "names are per connection");
        assert_eq!(
            a.cmd(&["CLIENT", "SETNAME", "has space"]),
            err("ERR Client names cannot contain spaces, newlines or special characters.")
        );
        assert_eq!(a.cmd(&["CLIENT", "GETNAME"]), V::s("worker-1"));
        assert_eq!(a.cmd(&["CLIENT", "SETNAME"]), err("ERR wrong number of arguments for 'client|setname' command"));

        let info = a.cmd_full(&["CLIENT", "INFO"]);
        let expected_kind = if proto == Proto::Resp3 { Kind::Verbatim } else { Kind::Bulk };
        assert_eq!(info.kind(), expected_kind, "{info:?}");
        let line = info.v.text();
        for field in [format!("id={ida} "), "name=worker-1 ".to_string(), format!("resp={} ", proto.version())] {
            assert!(line.contains(&field), "CLIENT INFO {line:?} lacks {field:?}");
        }
        // other CLIENT subcommands would act on the shared backend connections
        let e = a.cmd(&["CLIENT", "PAUSE", "10"]);
        assert!(e.err().is_some_and(|e| e.starts_with("ERR heatshield does not support 'CLIENT PAUSE'")), "{e:?}");
        let e = a.cmd(&["CLIENT", "NOPE"]);
        assert_eq!(e, err("ERR unknown subcommand 'NOPE'. Try CLIENT HELP."));
    }
}

#[test]
fn client_setinfo_is_accepted_and_shown_by_client_info() {
    // CLIENT SETINFO is what redis-py (and other current clients) send on connect.
    let env = env();
    for proto in Proto::BOTH {
        let mut a = Conn::connect_proto(env.proxy.port(), proto);
        assert_eq!(
            a.cmd(&["CLIENT", "SETINFO", "LIB-NAME", "heatshield-tests"]),
            V::ok(),
            "{proto:?} CLIENT SETINFO LIB-NAME"
        );
        assert_eq!(a.cmd(&["CLIENT", "SETINFO", "lib-ver", "1.2.3"]), V::ok());
        assert_eq!(
            a.cmd(&["CLIENT", "SETINFO", "lib-name", "has space"]),
            err("ERR lib-name and lib-ver cannot contain spaces, newlines or special characters.")
        );
        assert_eq!(a.cmd(&["CLIENT", "SETINFO", "bogus", "x"]), err("ERR Unrecognized option 'bogus'"));
        let line = a.cmd(&["CLIENT", "INFO"]).text();
        assert!(line.contains("lib-name=heatshield-tests"), "{line:?}");
        assert!(line.contains("lib-ver=1.2.3"), "{line:?}");
    }
}

#[test]
fn info_sections_and_keyspace_sums_over_masters() {
    let env = env();
    let _guard = keys_stable();
    let master = env.owners.masters()[0];
    let redis_version = info_field(&cmd_text(master, &["INFO", "server"]), "redis_version").unwrap();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let _other = Conn::connect(env.proxy.port());
        // 300 keys over all masters, 20 of them with a TTL
        let mut cmds = vec![];
        for i in 0..300 {
            cmds.push(common::client::args(&["SET", &format!("local:{t}:ks:{i}"), "v"]));
        }
        for i in 0..20 {
            cmds.push(common::client::args(&["EXPIRE", &format!("local:{t}:ks:{i}"), "1000"]));
        }
        assert!(c.pipeline(&cmds).iter().all(|v| !v.is_err()));

        let full = c.cmd_full(&["INFO"]);
        let expected_kind = if proto == Proto::Resp3 { Kind::Verbatim } else { Kind::Bulk };
        assert_eq!(full.kind(), expected_kind);
        let text = full.v.text();
        for section in ["# Proxy", "# Server", "# Clients", "# Keyspace"] {
            assert!(text.contains(section), "INFO lacks {section}:\n{text}");
        }
        assert_eq!(info_field(&text, "redis_version").as_deref(), Some(redis_version.as_str()));
        assert_eq!(info_field(&text, "masters").as_deref(), Some("3"));
        let clients: i64 = info_field(&text, "connected_clients").unwrap().parse().unwrap();
        assert!(clients >= 2, "connected_clients {clients}");

        let server_only = c.cmd(&["INFO", "server"]).text();
        assert!(server_only.contains("# Server") && !server_only.contains("# Keyspace"), "{server_only}");

        // INFO keyspace = the masters' key counts summed (retry if another test writes)
        let mut checked = false;
        for _ in 0..20 {
            let before = sum_dbsize(&env);
            let ks = c.cmd(&["INFO", "KEYSPACE"]).text();
            let dbsize = c.cmd(&["DBSIZE"]);
            let after = sum_dbsize(&env);
            if before != after {
                continue;
            }
            assert!(before >= 300, "masters hold {before} keys");
            assert!(ks.starts_with("# Keyspace"), "{ks}");
            let db0 = info_field(&ks, "db0").unwrap_or_else(|| panic!("no db0 line in {ks:?}"));
            let keys: i64 = db0
                .split(',')
                .find_map(|kv| kv.strip_prefix("keys="))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("bad db0 line {db0:?}"));
            assert_eq!(keys, before, "INFO keyspace db0 keys vs sum of masters' DBSIZE");
            let expires: i64 =
                db0.split(',').find_map(|kv| kv.strip_prefix("expires=")).and_then(|v| v.parse().ok()).unwrap();
            assert!(expires >= 20, "expires {expires}");
            assert_eq!(dbsize, V::Int(before), "DBSIZE vs sum of masters' DBSIZE");
            checked = true;
            break;
        }
        assert!(checked, "key counts never stable");
    }
}

#[test]
fn time_and_command_introspection() {
    let env = env();
    let master = env.owners.masters()[0];
    let master_count: i64 = cmd_text(master, &["COMMAND", "COUNT"]).parse().unwrap();
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let time = c.cmd_full(&["TIME"]);
        assert_eq!(time.shape.kinds(), [Kind::Bulk, Kind::Bulk], "{time:?}");
        let secs: u64 = time.v.items()[0].text().parse().unwrap();
        let micros: u64 = time.v.items()[1].text().parse().unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert!(secs.abs_diff(now) <= 5, "TIME {secs} vs now {now}");
        assert!(micros < 1_000_000);

        // the commands heatshield accepts: the master's, less those it refuses, plus its own
        let count = c.cmd(&["COMMAND", "COUNT"]).int();
        let list: Vec<String> = c.cmd(&["COMMAND", "LIST"]).items().iter().map(V::text).collect();
        let all = c.cmd(&["COMMAND"]);
        let names: Vec<String> = all.items().iter().map(|e| e.items()[0].text()).collect();
        let tops: Vec<&String> = list.iter().filter(|n| !n.contains('|')).collect();
        assert_eq!((count as usize, tops.len()), (names.len(), names.len()));
        // a subcommand is listed only with its command
        for n in &list {
            let top = n.split('|').next().unwrap().to_string();
            assert!(names.contains(&top), "{n} listed without {top}");
        }
        for n in ["get", "mset", "cluster", "client", "config", "proxy", "hotkeys", "lock.acquire", "lock.info"] {
            assert!(names.contains(&n.to_string()) && list.contains(&n.to_string()), "{n} missing");
        }
        for n in ["monitor", "debug", "shutdown", "swapdb", "migrate"] {
            assert!(!names.contains(&n.to_string()) && !list.contains(&n.to_string()), "{n} listed");
        }
        // a refused subcommand is not listed, nor among its command's subcommands
        assert!(list.contains(&"cluster|info".to_string()), "cluster|info missing");
        assert!(!list.contains(&"cluster|failover".to_string()) && !list.contains(&"client|pause".to_string()));
        let cluster = c.cmd(&["COMMAND", "INFO", "cluster", "cluster|failover"]);
        let subs: Vec<String> = cluster.items()[0].items()[9].items().iter().map(|s| s.items()[0].text()).collect();
        assert!(
            subs.contains(&"cluster|info".to_string()) && !subs.contains(&"cluster|failover".to_string()),
            "{subs:?}"
        );
        assert!(cluster.items()[1].is_nil(), "{cluster:?}");
        let info = c.cmd(&["COMMAND", "INFO", "monitor", "lock.acquire", "get"]);
        assert!(info.items()[0].is_nil(), "{info:?}");
        assert_eq!(info.items()[1].items()[0], V::s("lock.acquire"));
        assert_eq!(info.items()[1].items()[3..6], [V::Int(1), V::Int(1), V::Int(1)]);
        assert_eq!(info.items()[2].items()[0], V::s("get"));
        let locks = c.cmd(&["COMMAND", "LIST", "FILTERBY", "PATTERN", "lock*"]);
        assert_eq!(locks.items().len(), 4, "{locks:?}");
        let info = c.cmd(&["COMMAND", "INFO", "GET"]);
        let entry = &info.items()[0];
        assert_eq!(entry.items()[0], V::s("get"), "{info:?}");
        assert_eq!(entry.items()[1], V::Int(2));
        let docs = c.cmd_full(&["COMMAND", "DOCS", "GET"]);
        match proto {
            Proto::Resp2 => assert_eq!(docs.v.items()[0], V::s("get"), "{docs:?}"),
            Proto::Resp3 => {
                assert_eq!(docs.kind(), Kind::Map, "{docs:?}");
                let doc = docs.v.get("get").expect("docs of get");
                assert!(doc.get("summary").is_some(), "{doc:?}");
            }
        }
        assert!(count < master_count, "{count} of the master's {master_count}: nothing refused left out");
    }
}

#[test]
fn unknown_commands_and_wrong_arity_use_redis_texts() {
    let env = env();
    let master = env.owners.masters()[0];
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let mut direct = Conn::connect_proto(master, proto);
        assert_eq!(c.cmd(&["foo", "a"]), err("ERR unknown command 'foo', with args beginning with: 'a' "));
        let cases: &[&[&str]] = &[
            &["foo", "a"],
            &["nosuchcommand"],
            &["FOO", "a", "b c", ""],
            &["GET"],
            &["SET", "k"],
            &["HSET", "k", "f"],
            &["get", "a", "b"],
        ];
        for args in cases {
            let want = direct.cmd(args);
            assert!(want.is_err(), "redis accepted {args:?}");
            assert_eq!(c.cmd(args), want, "{proto:?} {args:?}");
        }
        assert_eq!(c.cmd(&["GET"]), err("ERR wrong number of arguments for 'get' command"));
        assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
    }
}

#[test]
fn unsupported_commands_are_refused_by_name() {
    let env = env();
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        // (EXEC and DISCARD without MULTI: tests/transactions.rs; pub/sub: tests/pubsub.rs)
        let cases: &[(&[&str], &str)] = &[
            (&["MONITOR"], "MONITOR"),
            (&["CLUSTER", "FAILOVER"], "CLUSTER FAILOVER"),
            (&["CLUSTER", "ADDSLOTS", "1"], "CLUSTER ADDSLOTS"),
            (&["LATENCY", "RESET"], "LATENCY RESET"),
            (&["SHUTDOWN"], "SHUTDOWN"),
            (&["DEBUG", "SLEEP", "0"], "DEBUG"),
        ];
        for (args, name) in cases {
            let r = c.cmd(args);
            let prefix = format!("ERR heatshield does not support '{name}'");
            assert!(
                r.err().is_some_and(|e| e.starts_with(&prefix)),
                "{proto:?} {args:?}: expected an error starting with {prefix:?}, got {r:?}"
            );
            // the connection is not left in a subscribed/blocked/transaction state
            assert_eq!(c.cmd(&["PING"]), V::s("PONG"), "after {args:?}");
        }
        assert!(env.proxy.is_alive());
    }
}

#[test]
fn password_protects_the_proxy() {
    let env = env();
    let _guard = keys_stable();
    let (proxy, _dir) = proxy_with_config(&env.cluster, "[server]\npassword = \"pw\"\n");
    let port = proxy.port();
    const NOAUTH: &str = "NOAUTH Authentication required.";
    const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

    // RESP2: AUTH <password>
    let mut c = Conn::connect(port);
    assert_eq!(c.cmd(&["GET", "local:auth:k"]), err(NOAUTH));
    assert_eq!(c.cmd(&["SET", "local:auth:k", "v"]), err(NOAUTH));
    assert_eq!(c.cmd(&["MGET", "local:auth:k", "x"]), err(NOAUTH));
    assert_eq!(c.cmd(&["INFO"]), err(NOAUTH));
    assert_eq!(c.cmd(&["PING"]), err(NOAUTH), "PING is no exception, as on Redis");
    assert_eq!(c.cmd(&["RESET"]), V::s("RESET"), "RESET is one");
    assert_eq!(c.cmd(&["AUTH", "nope"]), err(WRONGPASS));
    assert_eq!(c.cmd(&["AUTH", "someone", "pw"]), err(WRONGPASS));
    assert_eq!(c.cmd(&["GET", "local:auth:k"]), err(NOAUTH), "a failed AUTH must not authenticate");
    assert_eq!(c.cmd(&["AUTH", "pw"]), V::ok());
    assert_eq!(c.cmd(&["SET", "local:auth:k", "v"]), V::ok());
    assert_eq!(c.cmd(&["GET", "local:auth:k"]), V::s("v"));
    assert_eq!(c.cmd(&["AUTH", "default", "pw"]), V::ok());
    // RESET forgets the authentication, as in Redis
    assert_eq!(c.cmd(&["RESET"]), V::s("RESET"));
    assert_eq!(c.cmd(&["GET", "local:auth:k"]), err(NOAUTH));

    // HELLO before AUTH is refused; HELLO 3 AUTH authenticates and switches at once
    let mut h = Conn::connect(port);
    let e = h.cmd(&["HELLO", "3"]);
    assert!(
        e.err().is_some_and(|e| e.starts_with("NOAUTH HELLO must be called with the client already authenticated")),
        "{e:?}"
    );
    assert_eq!(h.cmd(&["HELLO", "3", "AUTH", "default", "wrong"]), err(WRONGPASS));
    assert_eq!(h.cmd_full(&["PING"]).raw, b"-NOAUTH Authentication required.\r\n");
    h.send(&["HELLO", "3", "AUTH", "default", "pw"]);
    h.set_proto(Proto::Resp3);
    let r = h.read_full();
    assert_eq!(r.kind(), Kind::Map, "{r:?}");
    assert_eq!(r.v.get("proto"), Some(V::Int(3)));
    assert_eq!(h.cmd(&["GET", "local:auth:k"]), V::s("v"));
    assert_eq!(h.cmd_full(&["GET", "local:auth:missing"]).kind(), Kind::Null);
    assert_eq!(h.cmd(&["HSET", "local:auth:h", "f", "1"]), V::Int(1));
    assert_eq!(h.cmd_full(&["HGETALL", "local:auth:h"]).kind(), Kind::Map);

    // QUIT works unauthenticated
    let mut q = Conn::connect(port);
    assert_eq!(q.cmd(&["QUIT"]), V::ok());
    assert!(q.expect_closed(Duration::from_secs(5)));

    // with no password configured, AUTH is an error like Redis's
    let mut plain = Conn::connect(env.proxy.port());
    let e = plain.cmd(&["AUTH", "pw"]);
    assert!(
        e.err().is_some_and(|e| e.starts_with("ERR AUTH <password> called without any password configured")),
        "{e:?}"
    );
    assert!(proxy.is_alive());
}

#[test]
fn flushall_is_refused_unless_allowed() {
    let env = env();
    let _guard = keys_exclusive();
    let keys = env.owners.key_per_master("local:flush:");
    // refused by default, nothing deleted
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        for (_, k) in &keys {
            assert_eq!(c.cmd(&["SET", k, "1"]), V::ok());
        }
        for args in [&["FLUSHALL"][..], &["FLUSHALL", "ASYNC"], &["FLUSHDB"], &["flushall", "SYNC"]] {
            let r = c.cmd(args);
            assert!(
                r.err().is_some_and(|e| e.starts_with("ERR") && e.contains("allow_flush")),
                "{args:?} must be refused mentioning allow_flush, got {r:?}"
            );
        }
        for (m, k) in &keys {
            assert_eq!(cmd_text(*m, &["GET", k]), "1", "refused FLUSHALL deleted {k}");
        }
    }

    // allowed: every master is emptied
    let (proxy, _dir) = proxy_with_config(&env.cluster, "[server]\nallow_flush = true\n");
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        for i in 0..60 {
            c.cmd(&["SET", &format!("local:flush:{}:{i}", proto.tag()), "x"]);
        }
        for m in env.owners.masters() {
            assert_ne!(cmd_text(m, &["DBSIZE"]), "0", "test keys should be on every master");
        }
        let cmd: &[&str] = if proto == Proto::Resp2 { &["FLUSHALL"] } else { &["FLUSHDB"] };
        assert_eq!(c.cmd(cmd), V::ok(), "{cmd:?}");
        for m in env.owners.masters() {
            assert_eq!(cmd_text(m, &["DBSIZE"]), "0", "{cmd:?} left keys on master {m}");
        }
        assert_eq!(c.cmd(&["DBSIZE"]), V::Int(0));
        assert_eq!(c.cmd(&["RANDOMKEY"]), V::Nil);
    }
}

#[test]
fn quit_closes_after_ok() {
    let env = env();
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let r = c.cmd_full(&["QUIT"]);
        assert_eq!(r.raw, b"+OK\r\n");
        assert!(c.expect_closed(Duration::from_secs(5)), "connection still open after QUIT");

        // commands pipelined after QUIT are not answered
        let mut p = Conn::connect_proto(env.proxy.port(), proto);
        p.send_raw(b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nQUIT\r\n*1\r\n$4\r\nPING\r\n");
        let (bytes, closed) = p.read_until_close(Duration::from_secs(5));
        assert_eq!(String::from_utf8_lossy(&bytes), "+PONG\r\n+OK\r\n");
        assert!(closed);
    }
}
