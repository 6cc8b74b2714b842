//! Routing: single-key commands reach the master owning the key's slot (checked directly
//! on that master), hash tags keep multi-key commands in one slot, cross-slot commands the
//! proxy cannot split are refused with Redis Cluster's CROSSSLOT error, scripts are routed
//! by their keys, and the usual lock idiom works. Every scenario runs over RESP2 and RESP3.

mod common;

use std::sync::Arc;

use common::client::{Conn, Kind, Proto, V};
use common::{ClusterEnv, Shared, cmd_text, key_slot};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

fn crossslot() -> V {
    V::Err(CROSSSLOT.into())
}

/// Output lines of `args` run directly on `port`, as redis-cli would print them.
fn on_master(port: u16, args: &[&str]) -> Vec<String> {
    let out = cmd_text(port, args);
    if out.is_empty() { vec![] } else { out.lines().map(str::to_string).collect() }
}

#[test]
fn single_key_commands_land_on_the_owning_master() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let keys = |kind: &str| env.owners.key_per_master(&format!("route:{t}:{kind}:"));
        assert_eq!(keys("str").len(), 3, "expected 3 masters");

        for (master, k) in keys("str") {
            assert_eq!(c.cmd(&["SET", &k, "hello"]), V::ok(), "{proto:?} SET {k}");
            assert_eq!(c.cmd(&["APPEND", &k, " world"]), V::Int(11));
            assert_eq!(c.cmd(&["GET", &k]), V::s("hello world"));
            assert_eq!(c.cmd(&["STRLEN", &k]), V::Int(11));
            assert_eq!(c.cmd(&["TYPE", &k]), V::s("string"));
            assert_eq!(cmd_text(master, &["GET", &k]), "hello world", "{proto:?} {k} not on its master {master}");
            assert_eq!(c.cmd(&["EXPIRE", &k, "1000"]), V::Int(1));
            let ttl = c.cmd(&["TTL", &k]).int();
            assert!((990..=1000).contains(&ttl), "TTL {ttl}");
        }

        for (master, k) in keys("ctr") {
            c.cmd(&["DEL", &k]);
            assert_eq!(c.cmd(&["INCR", &k]), V::Int(1));
            assert_eq!(c.cmd(&["INCRBY", &k, "41"]), V::Int(42));
            assert_eq!(c.cmd(&["DECR", &k]), V::Int(41));
            let f = c.cmd_full(&["INCRBYFLOAT", &k, "0.5"]);
            assert_eq!(f.v, V::s("41.5"));
            assert_eq!(f.kind(), Kind::Bulk);
            assert_eq!(cmd_text(master, &["GET", &k]), "41.5");
            assert_eq!(c.cmd(&["INCR", &k]), V::Err("ERR value is not an integer or out of range".into()));
        }

        for (master, k) in keys("hash") {
            c.cmd(&["DEL", &k]);
            assert_eq!(c.cmd(&["HSET", &k, "f1", "a", "f2", "b"]), V::Int(2));
            assert_eq!(c.cmd(&["HGET", &k, "f2"]), V::s("b"));
            assert_eq!(c.cmd(&["HGET", &k, "nope"]), V::Nil);
            let all = c.cmd_full(&["HGETALL", &k]);
            match proto {
                Proto::Resp2 => {
                    assert_eq!(all.kind(), Kind::Array);
                    assert_eq!(all.v, V::strs(&["f1", "a", "f2", "b"]));
                }
                Proto::Resp3 => {
                    assert_eq!(all.kind(), Kind::Map, "HGETALL in RESP3 must be a map: {all:?}");
                    assert_eq!(all.v, V::Map(vec![(V::s("f1"), V::s("a")), (V::s("f2"), V::s("b"))]));
                }
            }
            assert_eq!(on_master(master, &["HGETALL", &k]), ["f1", "a", "f2", "b"]);
        }

        for (master, k) in keys("zset") {
            c.cmd(&["DEL", &k]);
            assert_eq!(c.cmd(&["ZADD", &k, "1", "a", "2.5", "b", "3", "c"]), V::Int(3));
            assert_eq!(c.cmd(&["ZRANGE", &k, "0", "-1"]), V::strs(&["a", "b", "c"]));
            let score = c.cmd_full(&["ZSCORE", &k, "b"]);
            let ws = c.cmd_full(&["ZRANGE", &k, "0", "1", "WITHSCORES"]);
            match proto {
                Proto::Resp2 => {
                    assert_eq!((score.kind(), &score.v), (Kind::Bulk, &V::s("2.5")));
                    assert_eq!(ws.v, V::strs(&["a", "1", "b", "2.5"]));
                }
                Proto::Resp3 => {
                    assert_eq!(score.kind(), Kind::Double, "ZSCORE in RESP3 must be a double: {score:?}");
                    assert_eq!(score.v, V::Double(2.5));
                    assert_eq!(
                        ws.v,
                        V::Arr(vec![V::Arr(vec![V::s("a"), V::Double(1.0)]), V::Arr(vec![V::s("b"), V::Double(2.5)]),])
                    );
                }
            }
            assert_eq!(on_master(master, &["ZRANGE", &k, "0", "-1"]), ["a", "b", "c"]);
        }

        for (master, k) in keys("list") {
            c.cmd(&["DEL", &k]);
            assert_eq!(c.cmd(&["LPUSH", &k, "a", "b", "c"]), V::Int(3));
            assert_eq!(c.cmd(&["RPUSH", &k, "z"]), V::Int(4));
            assert_eq!(c.cmd(&["LRANGE", &k, "0", "-1"]), V::strs(&["c", "b", "a", "z"]));
            assert_eq!(c.cmd(&["LPOP", &k]), V::s("c"));
            assert_eq!(on_master(master, &["LRANGE", &k, "0", "-1"]), ["b", "a", "z"]);
        }

        for (master, k) in keys("set") {
            c.cmd(&["DEL", &k]);
            assert_eq!(c.cmd(&["SADD", &k, "x", "y", "x"]), V::Int(2));
            let m = c.cmd_full(&["SMEMBERS", &k]);
            let expected_kind = if proto == Proto::Resp3 { Kind::Set } else { Kind::Array };
            assert_eq!(m.kind(), expected_kind, "SMEMBERS {m:?}");
            let mut got: Vec<String> = m.v.items().iter().map(V::text).collect();
            got.sort();
            assert_eq!(got, ["x", "y"]);
            assert_eq!(cmd_text(master, &["SCARD", &k]), "2");
        }
    }
}

#[test]
fn hash_tags_keep_multi_key_commands_in_one_slot() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        for master in env.owners.masters() {
            let tag = env.owners.tag_on(master, &format!("route:{t}:{master}:"));
            let k = |s: &str| format!("{tag}:{s}");
            let (a, b, d) = (k("a"), k("b"), k("dst"));
            assert_eq!(key_slot(a.as_bytes()), key_slot(d.as_bytes()));
            c.cmd(&["DEL", &a, &b, &d]);

            // strings: whole MSET/MGET/MSETNX in one slot
            assert_eq!(c.cmd(&["MSET", &a, "1", &b, "2"]), V::ok());
            assert_eq!(c.cmd(&["MGET", &a, &b, &d]), V::Arr(vec![V::s("1"), V::s("2"), V::Nil]));
            assert_eq!(c.cmd(&["MSETNX", &a, "x", &d, "y"]), V::Int(0));
            assert_eq!(c.cmd(&["RENAME", &a, &d]), V::ok());
            assert_eq!(c.cmd(&["EXISTS", &a, &d]), V::Int(1));
            assert_eq!(cmd_text(master, &["GET", &d]), "1");
            assert_eq!(c.cmd(&["COPY", &d, &a]), V::Int(1));
            assert_eq!(c.cmd(&["DEL", &a, &b, &d]), V::Int(3));

            // sets
            c.cmd(&["SADD", &a, "1", "2", "3"]);
            c.cmd(&["SADD", &b, "3", "4"]);
            let sorted = |v: V| {
                let mut s: Vec<String> = v.items().iter().map(V::text).collect();
                s.sort();
                s
            };
            assert_eq!(sorted(c.cmd(&["SUNION", &a, &b])), ["1", "2", "3", "4"]);
            assert_eq!(sorted(c.cmd(&["SINTER", &a, &b])), ["3"]);
            assert_eq!(sorted(c.cmd(&["SDIFF", &a, &b])), ["1", "2"]);
            assert_eq!(c.cmd(&["SUNIONSTORE", &d, &a, &b]), V::Int(4));
            assert_eq!(c.cmd(&["SMOVE", &a, &b, "1"]), V::Int(1));
            assert_eq!(cmd_text(master, &["SCARD", &d]), "4");
            assert_eq!(cmd_text(master, &["SCARD", &b]), "3");
            c.cmd(&["DEL", &a, &b, &d]);

            // lists
            c.cmd(&["RPUSH", &a, "x", "y"]);
            assert_eq!(c.cmd(&["LMOVE", &a, &b, "LEFT", "RIGHT"]), V::s("x"));
            assert_eq!(c.cmd(&["RPOPLPUSH", &a, &b]), V::s("y"));
            assert_eq!(on_master(master, &["LRANGE", &b, "0", "-1"]), ["y", "x"]);
            c.cmd(&["DEL", &a, &b]);

            // sorted sets: numkeys-style keys
            c.cmd(&["ZADD", &a, "1", "m"]);
            c.cmd(&["ZADD", &b, "2", "m", "5", "n"]);
            assert_eq!(c.cmd(&["ZUNIONSTORE", &d, "2", &a, &b]), V::Int(2));
            assert_eq!(c.cmd(&["ZINTERCARD", "2", &a, &b]), V::Int(1));
            assert_eq!(on_master(master, &["ZRANGE", &d, "0", "-1", "WITHSCORES"]), ["m", "3", "n", "5"]);
            c.cmd(&["DEL", &a, &b, &d]);
        }
    }
}

#[test]
fn cross_slot_commands_are_refused_with_crossslot() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let per_master = env.owners.key_per_master(&format!("route:{t}:x:"));
        // two keys on different masters, and two keys on the same master but in different slots
        let a = per_master[0].1.clone();
        let b = per_master[1].1.clone();
        let m0 = per_master[0].0;
        let same_master = (0..)
            .map(|n| format!("route:{t}:y:{n}"))
            .find(|k| env.owners.of_key(k.as_bytes()) == m0 && key_slot(k.as_bytes()) != key_slot(a.as_bytes()))
            .unwrap();
        for (x, y) in [(a.clone(), b.clone()), (a.clone(), same_master.clone())] {
            assert_ne!(key_slot(x.as_bytes()), key_slot(y.as_bytes()));
            c.cmd(&["DEL", &x, &y]);
            c.cmd(&["SET", &x, "vx"]);
            let cases: Vec<Vec<&str>> = vec![
                vec!["SUNION", &x, &y],
                vec!["SINTER", &x, &y],
                vec!["SDIFF", &x, &y],
                vec!["SUNIONSTORE", &x, &x, &y],
                vec!["SMOVE", &x, &y, "m"],
                vec!["RENAME", &x, &y],
                vec!["RENAMENX", &x, &y],
                vec!["COPY", &x, &y],
                vec!["MSETNX", &x, "1", &y, "2"],
                vec!["LMOVE", &x, &y, "LEFT", "RIGHT"],
                vec!["RPOPLPUSH", &x, &y],
                vec!["ZUNIONSTORE", &x, "2", &x, &y],
                vec!["ZINTERCARD", "2", &x, &y],
                vec!["BITOP", "AND", &x, &x, &y],
                vec!["PFCOUNT", &x, &y],
                vec!["PFMERGE", &x, &y],
                vec!["SINTERCARD", "2", &x, &y],
                vec!["EVAL", "return 1", "2", &x, &y],
            ];
            for args in &cases {
                assert_eq!(c.cmd(args), crossslot(), "{proto:?} {args:?}");
            }
            // Redis Cluster itself says exactly the same when both keys are on one node.
            if env.owners.of_key(y.as_bytes()) == env.owners.of_key(x.as_bytes()) {
                assert_eq!(cmd_text(m0, &["SUNION", &x, &y]), CROSSSLOT);
            }
            // nothing happened
            assert_eq!(c.cmd(&["GET", &x]), V::s("vx"));
            assert_eq!(c.cmd(&["EXISTS", &y]), V::Int(0));
            // and the connection is still fine
            assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
        }
    }
}

#[test]
fn scripts_are_routed_by_their_keys() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        for (master, k) in env.owners.key_per_master(&format!("route:{t}:eval:")) {
            let set = c.cmd(&["EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", &k, "from-lua"]);
            assert_eq!(set, V::ok(), "{proto:?} EVAL SET {k}");
            assert_eq!(cmd_text(master, &["GET", &k]), "from-lua");
            assert_eq!(c.cmd(&["EVAL", "return redis.call('GET', KEYS[1])", "1", &k]), V::s("from-lua"));
            // EVAL_RO is routed the same way
            assert_eq!(c.cmd(&["EVAL_RO", "return redis.call('STRLEN', KEYS[1])", "1", &k]), V::Int(8));
        }
        // keyless scripts run on some master
        assert_eq!(c.cmd(&["EVAL", "return 40 + 2", "0"]), V::Int(42));
        assert_eq!(
            c.cmd(&["EVAL", "return {1, 'a', ARGV[1]}", "0", "x"]),
            V::Arr(vec![V::Int(1), V::s("a"), V::s("x")])
        );
        // the reply keeps the client's protocol: a Lua double is a RESP3 double
        let d = c.cmd_full(&["EVAL", "return {double = 3.5}", "0"]);
        match proto {
            Proto::Resp2 => assert_eq!((d.kind(), d.v), (Kind::Bulk, V::s("3.5"))),
            Proto::Resp3 => assert_eq!((d.kind(), d.v), (Kind::Double, V::Double(3.5))),
        }
        // two keys of one slot
        let tag = env.owners.tag_on(env.owners.masters()[1], &format!("route:{t}:evaltag:"));
        let (a, b) = (format!("{tag}a"), format!("{tag}b"));
        c.cmd(&["SET", &a, "A"]);
        assert_eq!(
            c.cmd(&[
                "EVAL",
                "redis.call('SET', KEYS[2], redis.call('GET', KEYS[1])); return redis.call('GET', KEYS[2])",
                "2",
                &a,
                &b
            ]),
            V::s("A")
        );
        // numkeys errors use Redis's words
        assert_eq!(
            c.cmd(&["EVAL", "return 1", "3", "a"]),
            V::Err("ERR Number of keys can't be greater than number of args".into())
        );
        assert_eq!(c.cmd(&["EVAL", "return 1", "x"]), V::Err("ERR value is not an integer or out of range".into()));
        assert_eq!(c.cmd(&["EVAL", "return 1", "-1"]), V::Err("ERR Number of keys can't be negative".into()));
        // a script error comes back as an error reply
        let e = c.cmd(&["EVAL", "return redis.call('INCR', KEYS[1])", "1", &a]);
        assert!(e.err().is_some_and(|e| e.contains("value is not an integer")), "{e:?}");
    }
}

#[test]
fn script_load_then_evalsha_on_every_master() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let body = format!("return redis.call('INCRBY', KEYS[1], ARGV[1]) -- {t}");
        let sha = c.cmd(&["SCRIPT", "LOAD", &body]).text();
        assert_eq!(sha.len(), 40, "SCRIPT LOAD returned {sha:?}");
        assert!(sha.chars().all(|ch| ch.is_ascii_hexdigit()));
        // loaded on every master
        for m in env.owners.masters() {
            assert_eq!(cmd_text(m, &["SCRIPT", "EXISTS", &sha]), "1", "script not loaded on master {m}");
        }
        let missing = "0000000000000000000000000000000000000000";
        assert_eq!(c.cmd(&["SCRIPT", "EXISTS", &sha, missing]), V::Arr(vec![V::Int(1), V::Int(0)]));
        for (master, k) in env.owners.key_per_master(&format!("route:{t}:sha:")) {
            c.cmd(&["DEL", &k]);
            assert_eq!(c.cmd(&["EVALSHA", &sha, "1", &k, "5"]), V::Int(5), "{proto:?} EVALSHA on {master}");
            assert_eq!(c.cmd(&["EVALSHA", &sha, "1", &k, "2"]), V::Int(7));
            assert_eq!(cmd_text(master, &["GET", &k]), "7");
        }
        let e = c.cmd(&["EVALSHA", missing, "0"]);
        assert!(e.err().is_some_and(|e| e.starts_with("NOSCRIPT")), "EVALSHA of an unknown script: {e:?}");
    }
}

#[test]
fn lock_idiom_set_nx_px_and_compare_and_delete() {
    const RELEASE: &str =
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut a = Conn::connect_proto(env.proxy.port(), proto);
        let mut b = Conn::connect_proto(env.proxy.port(), proto);
        for (master, lock) in env.owners.key_per_master(&format!("route:{t}:lock:")) {
            a.cmd(&["DEL", &lock]);
            assert_eq!(a.cmd(&["SET", &lock, "token-a", "NX", "PX", "30000"]), V::ok());
            // someone else cannot take it
            assert_eq!(b.cmd(&["SET", &lock, "token-b", "NX", "PX", "30000"]), V::Nil);
            let pttl = a.cmd(&["PTTL", &lock]).int();
            assert!((1..=30000).contains(&pttl), "PTTL {pttl}");
            assert_eq!(cmd_text(master, &["GET", &lock]), "token-a");
            // the wrong token does not release it
            assert_eq!(b.cmd(&["EVAL", RELEASE, "1", &lock, "token-b"]), V::Int(0));
            assert_eq!(a.cmd(&["GET", &lock]), V::s("token-a"));
            // the owner releases it
            assert_eq!(a.cmd(&["EVAL", RELEASE, "1", &lock, "token-a"]), V::Int(1));
            assert_eq!(a.cmd(&["GET", &lock]), V::Nil);
            assert_eq!(cmd_text(master, &["EXISTS", &lock]), "0");
            // and now the other client gets it
            assert_eq!(b.cmd(&["SET", &lock, "token-b", "NX", "PX", "30000"]), V::ok());
            assert_eq!(a.cmd(&["EVAL", RELEASE, "1", &lock, "token-a"]), V::Int(0));
            assert_eq!(b.cmd(&["EVAL", RELEASE, "1", &lock, "token-b"]), V::Int(1));
        }
    }
}

/// XREADGROUP whose consumer is literally named STREAMS: the key is the one after the
/// second STREAMS, as Redis's key spec and `COMMAND GETKEYS` have it, and the reply is
/// Redis's (nil: nothing new for the group).
#[test]
fn xreadgroup_with_a_consumer_named_streams() {
    let e = env();
    let key = "rt:stream{x}";
    let owner = e.owners.of_key(key.as_bytes());
    let args = ["XREADGROUP", "GROUP", "g", "STREAMS", "COUNT", "1", "STREAMS", key, ">"];
    assert_eq!(
        on_master(
            owner,
            &["COMMAND", "GETKEYS", args[0], args[1], args[2], args[3], args[4], args[5], args[6], key, ">"]
        ),
        vec![key.to_string()]
    );
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(e.proxy.port(), proto);
        let _ = c.cmd(&["DEL", key]);
        assert!(c.cmd(&["XGROUP", "CREATE", key, "g", "$", "MKSTREAM"]).is_ok());
        assert_eq!(c.cmd(&args), V::Nil, "{proto:?}");
        assert_eq!(c.cmd(&["DEL", key]), V::Int(1));
    }
}

/// A bad `numkeys` gets the error of the command's own family, as a master answers it
/// (LMPOP's family and SINTERCARD say "numkeys should be greater than 0", the sorted-set
/// operations "at least 1 input key", EVAL "can't be negative", FCALL whatever the master
/// says, as it looks the function up first): each case is sent through heatshield and
/// straight to a master, and the replies must match.
#[test]
fn bad_numkeys_get_each_commands_own_error() {
    let env = env();
    let master = env.owners.masters()[0];
    let mut direct = Conn::connect(master);
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("LMPOP", &[], &["LEFT"]),
        ("BLMPOP", &["0"], &["LEFT"]),
        ("ZMPOP", &[], &["MIN"]),
        ("BZMPOP", &["0"], &["MIN"]),
        ("SINTERCARD", &[], &[]),
        ("ZUNION", &[], &[]),
        ("ZINTER", &[], &[]),
        ("ZDIFF", &[], &[]),
        ("ZINTERCARD", &[], &[]),
        ("ZUNIONSTORE", &["d"], &[]),
        ("ZINTERSTORE", &["d"], &[]),
        ("ZDIFFSTORE", &["d"], &[]),
        ("EVAL", &["return 1"], &[]),
        ("EVALSHA", &["0000000000000000000000000000000000000000"], &[]),
        // a function that does not exist, then one that does
        ("FCALL", &["nosuch"], &[]),
        ("FCALL", &["numkeys_probe"], &[]),
        ("FCALL_RO", &["numkeys_probe"], &[]),
        // a count that leaves no LEFT/RIGHT (MIN/MAX) after the keys
        ("ZMPOP", &[], &["z2"]),
        ("LMPOP", &[], &["l2"]),
    ];
    // the library on every master, so whichever answers knows the function
    for m in env.owners.masters() {
        let lib = "#!lua name=numkeys_probe\nredis.register_function{function_name='numkeys_probe', \
                   callback=function() return 1 end, flags={'no-writes'}}";
        let loaded = Conn::connect(m).cmd(&["FUNCTION", "LOAD", "REPLACE", lib]);
        assert_eq!(loaded, V::s("numkeys_probe"));
    }
    let mut checked = 0;
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        for (cmd, before, after) in cases {
            for n in ["a", "-1", "0", "2", "9"] {
                let mut args: Vec<&str> = vec![cmd];
                args.extend_from_slice(before);
                args.push(n);
                args.push("k");
                args.extend_from_slice(after);
                let mut want = direct.cmd(&args);
                if want == crossslot() {
                    // a master in cluster mode takes LEFT (MIN) for a key of another slot
                    // before the command runs; one Redis, which heatshield stands for,
                    // answers what the command itself says
                    assert!(cmd.contains("MPOP") && n == "2", "{args:?}");
                    want = V::Err("ERR syntax error".into());
                }
                if n == "0" && (*cmd == "EVAL" || before == &["numkeys_probe"]) {
                    assert_eq!(want, V::Int(1));
                } else {
                    assert!(want.err().is_some(), "{args:?} is an error on Redis: {want:?}");
                }
                assert_eq!(c.cmd(&args), want, "{proto:?} {args:?}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 2 * 19 * 5);
}

/// A keyless script has one home for every client (the master owning slot 0), so a
/// script that touches a key it did not declare works or fails the same way every time.
#[test]
fn keyless_scripts_run_on_one_home_for_every_client() {
    let env = env();
    let home = env.owners.of_slot(0);
    let keys = env.owners.key_per_master("route:home:");
    let script = "return redis.pcall('SET', ARGV[1], 'v')";
    for (master, key) in &keys {
        let replies: Vec<V> =
            (0..12).map(|_| Conn::connect(env.proxy.port()).cmd(&["EVAL", script, "0", key.as_str()])).collect();
        if *master == home {
            assert!(replies.iter().all(|r| *r == V::ok()), "{replies:?}");
        } else {
            // one answer for all twelve clients: the home master refuses a key of another
            assert!(replies.iter().all(|r| r.err().is_some() && *r == replies[0]), "{replies:?}");
            // Redis's refusal, with heatshield's hint after it
            let e = replies[0].err().unwrap();
            assert!(e.starts_with("ERR Script attempted to access a non local key in a cluster node"), "{e}");
            assert!(e.ends_with(heatshield::errors::UNDECLARED_KEY_HINT), "{e}");
        }
    }
}

/// A script run with EVAL on one master, or loaded with SCRIPT LOAD, runs with EVALSHA on
/// any master, also after the masters' script caches were flushed behind heatshield's
/// back; SCRIPT EXISTS says 1 for it.
#[test]
fn evalsha_runs_on_any_master_after_eval_on_one() {
    let env = env();
    let keys = env.owners.key_per_master("route:sha:");
    let body = "return 'sha:' .. KEYS[1]";
    let mut c = Conn::connect(env.proxy.port());
    // run on the first key's master only
    assert_eq!(c.cmd(&["EVAL", body, "1", &keys[0].1]), V::s(format!("sha:{}", keys[0].1)));
    // its SHA1, as Redis computes it (the master has it cached already)
    let sha = cmd_text(keys[0].0, &["SCRIPT", "LOAD", body]);
    assert_eq!(sha.len(), 40);
    for (master, _) in &keys[1..] {
        assert_eq!(cmd_text(*master, &["SCRIPT", "EXISTS", &sha]), "0", "master {master} has not seen it");
    }
    assert_eq!(c.cmd(&["SCRIPT", "EXISTS", &sha]), V::Arr(vec![V::Int(1)]));
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        for (_, key) in &keys {
            assert_eq!(c.cmd(&["EVALSHA", &sha, "1", key.as_str()]), V::s(format!("sha:{key}")), "{proto:?}");
            assert_eq!(c.cmd(&["EVALSHA_RO", &sha, "1", key.as_str()]), V::s(format!("sha:{key}")));
        }
        // every master's cache emptied behind heatshield's back
        for (master, _) in &keys {
            assert_eq!(cmd_text(*master, &["SCRIPT", "FLUSH"]), "OK");
        }
        for (_, key) in &keys {
            assert_eq!(c.cmd(&["EVALSHA", &sha, "1", key.as_str()]), V::s(format!("sha:{key}")), "{proto:?}");
        }
    }
    // a script heatshield never saw stays unknown
    let unknown = "0123456789abcdef0123456789abcdef01234567";
    assert_eq!(c.cmd(&["SCRIPT", "EXISTS", unknown, &sha]), V::Arr(vec![V::Int(0), V::Int(1)]));
    let e = c.cmd(&["EVALSHA", unknown, "1", &keys[0].1]);
    assert!(e.err().is_some_and(|e| e.starts_with("NOSCRIPT")), "{e:?}");
}

/// FUNCTION RESTORE reaches every master, as FUNCTION LOAD does, so a restored library's
/// functions run whichever master a key is on.
#[test]
fn function_restore_reaches_every_master() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    let lib = "#!lua name=restorelib\nredis.register_function{function_name='restore_get', \
               callback=function(keys) return redis.call('GET', keys[1]) end, flags={'no-writes'}}";
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", "REPLACE", lib]), V::s("restorelib"));
    let dump = c.cmd(&["FUNCTION", "DUMP"]).bytes().to_vec();
    assert_eq!(c.cmd(&["FUNCTION", "DELETE", "restorelib"]), V::ok());
    for m in env.owners.masters() {
        let e = Conn::connect(m).cmd(&["FCALL", "restore_get", "0"]);
        assert!(e.err().is_some_and(|e| e.contains("Function not found")), "{e:?}");
    }
    // REPLACE: the dump holds the other tests' libraries too
    let restore: Vec<&[u8]> = vec![b"FUNCTION", b"RESTORE", &dump, b"REPLACE"];
    assert_eq!(c.cmd(&restore), V::ok());
    for (master, k) in env.owners.key_per_master("route:restore:") {
        assert_eq!(c.cmd(&["SET", &k, &format!("v{master}")]), V::ok());
        assert_eq!(c.cmd(&["FCALL", "restore_get", "1", &k]), V::s(format!("v{master}")), "master {master}");
    }
}

/// A library loaded through heatshield is loaded again where a master lost it (its
/// functions flushed behind heatshield's back, as after a failover to a replica that never
/// had it): FCALL works there, unseen by the client.
#[test]
fn fcall_reloads_a_library_a_master_lost() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    let lib =
        "#!lua name=lostlib\nredis.register_function('lost_get', function(keys) return redis.call('GET', keys[1]) end)";
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", "REPLACE", lib]), V::s("lostlib"));
    let keys = env.owners.key_per_master("route:lost:");
    let (victim, key) = &keys[0];
    assert_eq!(c.cmd(&["SET", key, "there"]), V::ok());
    assert_eq!(cmd_text(*victim, &["FUNCTION", "DELETE", "lostlib"]), "OK");
    let direct = cmd_text(*victim, &["FCALL", "lost_get", "1", key]);
    assert!(direct.contains("Function not found"), "the master lost it: {direct}");
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        assert_eq!(c.cmd(&["FCALL", "lost_get", "1", key]), V::s("there"), "{proto:?}");
    }
    assert!(cmd_text(*victim, &["FUNCTION", "LIST"]).contains("lostlib"), "loaded again on the master");
    // a function heatshield never saw loaded stays unknown
    let e = c.cmd(&["FCALL", "never_loaded", "1", key]);
    assert!(e.err().is_some_and(|e| e.contains("Function not found")), "{e:?}");
}

/// Inside MULTI an EVALSHA of a script heatshield knows goes as EVAL: a NOSCRIPT in EXEC's
/// reply could not be repaired (the transaction has run by then).
#[test]
fn evalsha_inside_multi_runs_where_the_script_was_never_loaded() {
    let env = env();
    let keys = env.owners.key_per_master("route:txsha:");
    let body = "return 'tx:' .. KEYS[1]";
    let mut c = Conn::connect(env.proxy.port());
    assert_eq!(c.cmd(&["EVAL", body, "1", &keys[0].1]), V::s(format!("tx:{}", keys[0].1)));
    let sha = cmd_text(keys[0].0, &["SCRIPT", "LOAD", body]);
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        for (master, key) in &keys[1..] {
            assert_eq!(cmd_text(*master, &["SCRIPT", "FLUSH"]), "OK");
            assert_eq!(c.cmd(&["MULTI"]), V::ok());
            assert_eq!(c.cmd(&["EVALSHA", &sha, "1", key.as_str()]), V::s("QUEUED"));
            assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::s(format!("tx:{key}"))]), "{proto:?} master {master}");
        }
    }
}

#[test]
fn sort_patterns_are_not_destinations() {
    // the word after BY (or GET) is a pattern, even when it reads STORE: one key, as
    // `COMMAND GETKEYS` says, so no CROSSSLOT
    let env = env();
    let l = "{sortby}l";
    let owner = env.owners.of_key(l.as_bytes());
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let mut m = Conn::connect_proto(owner, proto);
        c.cmd(&["DEL", l]);
        assert_eq!(c.cmd(&["RPUSH", l, "b", "a", "c"]), V::Int(3));
        assert_eq!(m.cmd(&["COMMAND", "GETKEYS", "SORT", l, "BY", "STORE", "ALPHA"]), V::strs(&[l]));
        for args in [
            vec!["SORT", l, "BY", "STORE", "ALPHA"],
            vec!["SORT", l, "GET", "STORE", "ALPHA"],
            vec!["SORT", l, "BY", "nosort", "GET", "#", "ALPHA", "LIMIT", "0", "2"],
        ] {
            assert_eq!(c.cmd_full(&args).raw, m.cmd_full(&args).raw, "{proto:?} {args:?}");
        }
        // the last STORE names the destination
        let dest = "{sortby}d";
        assert_eq!(c.cmd(&["SORT", l, "ALPHA", "STORE", "elsewhere", "STORE", dest]), V::Int(3));
        assert_eq!(c.cmd(&["LRANGE", dest, "0", "-1"]), V::strs(&["a", "b", "c"]));
    }
}
