//! MULTI / EXEC / DISCARD through heatshield, against a real 3-master cluster: the replies
//! are Redis's own (compared with the same commands sent straight to the owning master),
//! queue-time errors abort EXEC, every key shares one slot, the transaction runs on the
//! slot's master as one native transaction, and one that meets a moved slot is sent again
//! to the new owner instead of failing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::client::{Conn, Proto, V};
use common::{ClusterEnv, Proxy, Shared, cmd_text, config_file, info_field, key_slot, wait_until};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

fn err(text: &str) -> V {
    V::Err(text.into())
}

const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";
const CROSSSLOT_TX: &str = "CROSSSLOT Keys in request don't hash to the same slot (a transaction's keys must share one slot; transactions.cross_slot = \"per-node\" runs it as one transaction per slot)";

/// The same commands through heatshield, then straight to `direct`: the same replies
/// (the commands leave the keys as they found them).
fn same_as_redis(proxy: &mut Conn, direct: &mut Conn, cmds: &[&[&str]]) {
    let got: Vec<V> = cmds.iter().map(|c| proxy.cmd(c)).collect();
    let want: Vec<V> = cmds.iter().map(|c| direct.cmd(c)).collect();
    assert_eq!(got, want, "{cmds:?}");
}

#[test]
fn a_transaction_answers_as_redis_does() {
    let env = env();
    for proto in Proto::BOTH {
        let tag = format!("{{tx:{proto:?}}}");
        let (a, b) = (format!("{tag}a"), format!("{tag}b"));
        let owner = env.owners.of_key(a.as_bytes());
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let mut d = Conn::connect_proto(owner, proto);
        for round in 0..2 {
            let p = if round == 0 { "p" } else { "d" };
            let (a, b) = (format!("{a}{p}"), format!("{b}{p}"));
            let conn = if round == 0 { &mut c } else { &mut d };
            assert_eq!(conn.cmd(&["MULTI"]), V::ok());
            for cmd in [
                vec!["SET", &a, "1"],
                vec!["INCR", &a],
                vec!["RPUSH", &b, "x", "y"],
                vec!["LRANGE", &b, "0", "-1"],
                vec!["GET", &a],
                vec!["PING"],
                vec!["ECHO", "hi"],
            ] {
                assert_eq!(conn.cmd(&cmd), V::s("QUEUED"), "{proto:?} {cmd:?}");
            }
            let got = conn.cmd(&["EXEC"]);
            assert_eq!(
                got,
                V::Arr(vec![V::ok(), V::Int(2), V::Int(2), V::strs(&["x", "y"]), V::s("2"), V::s("PONG"), V::s("hi"),]),
                "{proto:?} round {round}"
            );
            assert_eq!(conn.cmd(&["DEL", &a, &b]), V::Int(2));
        }
        // a command that fails when it runs: the others still run (Redis has no rollback)
        same_as_redis(
            &mut c,
            &mut d,
            &[
                &["SET", &a, "text"],
                &["MULTI"],
                &["INCR", &a],
                &["SET", &b, "v"],
                &["EXEC"],
                &["GET", &b],
                &["DEL", &a, &b],
            ],
        );
        // the error replies outside and inside a transaction
        same_as_redis(
            &mut c,
            &mut d,
            &[
                &["EXEC"],
                &["DISCARD"],
                &["MULTI"],
                &["MULTI"],
                &["WATCH", &a],
                &["SET", &a, "1"],
                &["DISCARD"],
                &["GET", &a],
                &["MULTI"],
                &["EXEC"],
            ],
        );
    }
}

#[test]
fn queue_time_errors_abort_exec_and_nothing_runs() {
    let env = env();
    for proto in Proto::BOTH {
        let k = format!("{{txerr:{proto:?}}}k");
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let mut d = Conn::connect_proto(env.owners.of_key(k.as_bytes()), proto);
        // unknown command and wrong arity: Redis's texts, and EXECABORT
        for bad in [vec!["NOSUCHCOMMAND", "x"], vec!["GET"], vec!["SET", &k]] {
            for conn in [&mut c, &mut d] {
                assert_eq!(conn.cmd(&["MULTI"]), V::ok());
                assert_eq!(conn.cmd(&["SET", &k, "1"]), V::s("QUEUED"));
                assert!(conn.cmd(&bad).is_err(), "{bad:?}");
                assert_eq!(conn.cmd(&["EXEC"]), err(EXECABORT), "{proto:?} {bad:?}");
                assert!(conn.cmd(&["GET", &k]).is_nil(), "{proto:?} {bad:?}: part of an aborted transaction ran");
            }
            let (mut pc, mut dc) = (c.cmd(&["MULTI"]), d.cmd(&["MULTI"]));
            assert_eq!(pc, dc);
            (pc, dc) = (c.cmd(&bad), d.cmd(&bad));
            assert_eq!(pc, dc, "{bad:?}");
            assert_eq!(c.cmd(&["DISCARD"]), d.cmd(&["DISCARD"]));
        }
        // keys in two slots: CROSSSLOT when queued, then EXECABORT
        let other = (0..)
            .map(|i| format!("txother:{i}"))
            .find(|o| key_slot(o.as_bytes()) != key_slot(k.as_bytes()))
            .unwrap_or_default();
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["SET", &k, "1"]), V::s("QUEUED"));
        // (the text names the option that would run it)
        assert_eq!(c.cmd(&["SET", &other, "1"]), err(CROSSSLOT_TX));
        // one command's own keys in two slots: Redis Cluster's text
        assert_eq!(
            c.cmd(&["MSET", &k, "1", &other, "2"]),
            err("CROSSSLOT Keys in request don't hash to the same slot")
        );
        assert_eq!(c.cmd(&["EXEC"]), err(EXECABORT));
        assert!(c.cmd(&["GET", &k]).is_nil());
        assert!(c.cmd(&["GET", &other]).is_nil());
        // a command that spans every master, or that heatshield answers itself
        for refused in [vec!["KEYS", "*"], vec!["CLIENT", "SETNAME", "x"]] {
            assert_eq!(c.cmd(&["MULTI"]), V::ok());
            assert!(c.cmd(&refused).is_err(), "{refused:?}");
            assert_eq!(c.cmd(&["EXEC"]), err(EXECABORT), "{refused:?}");
        }
        // WATCH inside MULTI: Redis's error, and the transaction goes on
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["WATCH", &k]), err("ERR WATCH inside MULTI is not allowed"));
        assert_eq!(c.cmd(&["SET", &k, "w"]), V::s("QUEUED"));
        assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::ok()]));
        assert_eq!(c.cmd(&["DEL", &k]), V::Int(1));
        // RESET leaves a transaction; the connection works as before
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["SET", &k, "queued"]), V::s("QUEUED"));
        assert_eq!(c.cmd(&["RESET"]), V::s("RESET"));
        // RESET also goes back to RESP2, as in Redis
        c.set_proto(Proto::Resp2);
        assert!(c.cmd(&["GET", &k]).is_nil());
        assert_eq!(c.cmd(&["EXEC"]), err("ERR EXEC without MULTI"));
    }
}

#[test]
fn empty_and_keyless_transactions() {
    let env = env();
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![]), "{proto:?}");
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["PING"]), V::s("QUEUED"));
        assert_eq!(c.cmd(&["TIME"]), V::s("QUEUED"));
        assert_eq!(c.cmd(&["ECHO", "e"]), V::s("QUEUED"));
        let r = c.cmd(&["EXEC"]);
        let items = r.items();
        assert_eq!(items.len(), 3, "{proto:?} {r:?}");
        assert_eq!(items[0], V::s("PONG"));
        assert_eq!(items[1].items().len(), 2, "TIME is [seconds, microseconds]: {r:?}");
        assert_eq!(items[2], V::s("e"));
    }
}

fn exec_calls(port: u16) -> i64 {
    let info = cmd_text(port, &["INFO", "commandstats"]);
    info_field(&info, "cmdstat_exec")
        .and_then(|v| v.split(',').next().and_then(|c| c.strip_prefix("calls=")).map(|n| n.parse().unwrap_or(0)))
        .unwrap_or(0)
}

#[test]
fn the_transaction_runs_on_the_slots_master_as_one_native_transaction() {
    let env = env();
    let k = "{txwhere}k";
    let owner = env.owners.of_key(k.as_bytes());
    let before: Vec<(u16, i64)> = env.owners.masters().iter().map(|&m| (m, exec_calls(m))).collect();
    let mut c = Conn::connect(env.proxy.port());
    for i in 0..5 {
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["INCR", k]), V::s("QUEUED"));
        assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::Int(i + 1)]));
    }
    assert_eq!(c.cmd(&["DEL", k]), V::Int(1));
    for (m, n) in before {
        let grew = exec_calls(m) - n;
        if m == owner {
            assert!(grew >= 5, "the owner {m} ran {grew} EXECs");
        }
    }
    // pipelined: a client that sends MULTI ... EXEC in one write gets every reply in order
    let k2 = "{txwhere}p";
    let replies = c.pipeline(&[
        vec![b"MULTI".to_vec()],
        vec![b"SET".to_vec(), k2.into(), b"1".to_vec()],
        vec![b"INCRBY".to_vec(), k2.into(), b"9".to_vec()],
        vec![b"EXEC".to_vec()],
        vec![b"GET".to_vec(), k2.into()],
    ]);
    assert_eq!(replies, vec![V::ok(), V::s("QUEUED"), V::s("QUEUED"), V::Arr(vec![V::ok(), V::Int(10)]), V::s("10")]);
    assert_eq!(c.cmd(&["DEL", k2]), V::Int(1));
}

#[test]
fn a_transaction_whose_slot_moved_is_sent_to_the_new_owner() {
    // a cluster of its own: this test moves a slot
    let env = ClusterEnv::start(None);
    let k = "{txmoved}k";
    let s = key_slot(k.as_bytes());
    let old = env.owners.of_slot(s);
    let new = env.owners.masters().into_iter().find(|&m| m != old).unwrap_or(old);
    let mut c = Conn::connect(env.proxy.port());
    // the proxy learns the slot's owner
    assert!(c.cmd(&["GET", k]).is_nil());
    // the (empty) slot moves to another master behind the proxy's back
    let new_id = env.cluster.node_id(new);
    for m in env.owners.masters() {
        assert_eq!(cmd_text(m, &["CLUSTER", "SETSLOT", &s.to_string(), "NODE", &new_id]), "OK", "on {m}");
    }
    wait_until(Duration::from_secs(10), "the old owner to redirect", || {
        cmd_text(old, &["GET", k]).starts_with("MOVED")
    });
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["SET", k, "v"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["INCR", "{txmoved}n"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::ok(), V::Int(1)]), "the client must not see the move");
    assert_eq!(cmd_text(new, &["GET", k]), "v");
    assert!(env.proxy.is_alive());
}

#[test]
fn a_queued_transaction_is_bounded_in_memory() {
    let env = env();
    let (_dir, path) = config_file("[limits]\nmax_inflight_request_bytes = 4096\n");
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let mut c = Conn::connect(proxy.port());
    let k = "{txbig}k";
    let value = "x".repeat(1000);
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    let mut queued = 0;
    let refused = loop {
        let r = c.cmd(&["APPEND", k, &value]);
        if r != V::s("QUEUED") {
            break r;
        }
        queued += 1;
        assert!(queued < 5, "4096 bytes took {queued} commands of 1 KiB");
    };
    assert!(queued >= 2, "only {queued} commands of 1 KiB fit in 4096 bytes");
    assert_eq!(refused, err("ERR heatshield: the transaction is over limits.max_inflight_request_bytes (4096 bytes)"));
    assert_eq!(c.cmd(&["EXEC"]), err(EXECABORT));
    assert!(c.cmd(&["GET", k]).is_nil(), "part of an aborted transaction ran");
    // a transaction within the bound runs
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["APPEND", k, &value]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::Int(1000)]));
    assert_eq!(c.cmd(&["DEL", k]), V::Int(1));
}

#[test]
fn per_node_runs_a_cross_slot_transaction_as_one_per_slot() {
    let env = env();
    let (_dir, path) = config_file("[transactions]\ncross_slot = \"per-node\"\n");
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let masters = env.owners.masters();
    // keys on two different masters, and a third key in another slot of the first
    let a = env.owners.tag_on(masters[0], "pn:a");
    let b = env.owners.tag_on(masters[1], "pn:b");
    let a2 = (0..)
        .map(|i| format!("pn:a2:{i}"))
        .find(|k| env.owners.of_key(k.as_bytes()) == masters[0] && key_slot(k.as_bytes()) != key_slot(a.as_bytes()))
        .unwrap();
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        let execs: Vec<u64> = masters.iter().map(|&m| common::cmdstat_calls(m, "exec")).collect();
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        for cmd in [
            vec!["SET", &a, "1"],
            vec!["SET", &b, "x"],
            vec!["PING"],
            vec!["INCR", &a],
            vec!["INCR", &b],
            vec!["SET", &a2, "z"],
            vec!["GET", &b],
        ] {
            assert_eq!(c.cmd(&cmd), V::s("QUEUED"), "{proto:?} {cmd:?}");
        }
        // the replies in the client's order; a command that fails when it runs has its
        // error in its place (Redis has no rollback), the others ran
        let got = c.cmd(&["EXEC"]);
        let items = got.items().to_vec();
        assert_eq!(items.len(), 7, "{proto:?} {got:?}");
        assert_eq!(items[0], V::ok());
        assert_eq!(items[1], V::ok());
        assert_eq!(items[2], V::s("PONG"));
        assert_eq!(items[3], V::Int(2));
        assert!(items[4].err().is_some_and(|e| e.starts_with("ERR value is not an integer")), "{items:?}");
        assert_eq!(items[5], V::ok());
        assert_eq!(items[6], V::s("x"));
        assert_eq!(cmd_text(masters[0], &["GET", &a]), "2");
        assert_eq!(cmd_text(masters[1], &["GET", &b]), "x");
        assert_eq!(cmd_text(masters[0], &["GET", &a2]), "z");
        // each slot's part ran as a native transaction on its master
        assert!(common::cmdstat_calls(masters[0], "exec") >= execs[0] + 2, "two slots of the first master");
        assert!(common::cmdstat_calls(masters[1], "exec") > execs[1]);
        // a queue-time error still aborts all of it, and the keys of one command that is
        // not split (RENAME, SUNIONSTORE, ...) share a slot
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["SET", &a, "3"]), V::s("QUEUED"));
        assert_eq!(c.cmd(&["RENAME", &a, &b]), err("CROSSSLOT Keys in request don't hash to the same slot"));
        assert_eq!(c.cmd(&["EXEC"]), err(EXECABORT));
        assert_eq!(c.cmd(&["DEL", &a, &b, &a2]), V::Int(3));
    }
}

/// `per-node`: an MGET, MSET, DEL, UNLINK, EXISTS or TOUCH whose keys span slots is
/// queued as one command per slot, each in its slot's transaction, and EXEC's reply has
/// the one merged reply in its place (as a single Redis answers it).
#[test]
fn per_node_splits_a_cross_slot_multi_key_command_in_its_place() {
    let env = env();
    let (_dir, path) = config_file("[transactions]\ncross_slot = \"per-node\"\n");
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let masters = env.owners.masters();
    for proto in Proto::BOTH {
        let k: Vec<String> = masters.iter().map(|&m| env.owners.tag_on(m, &format!("sp:{proto:?}"))).collect();
        let (a, b, c3) = (&k[0], &k[1], &k[2]);
        let mut c = Conn::connect_proto(proxy.port(), proto);
        let execs: Vec<u64> = masters.iter().map(|&m| common::cmdstat_calls(m, "exec")).collect();
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        for cmd in [
            vec!["MSET", a, "1", b, "2", c3, "3"],
            vec!["INCR", b],
            vec!["MGET", c3, "sp:missing", a, b, a],
            vec!["EXISTS", a, b, a, "sp:missing", c3],
            vec!["TOUCH", c3, a],
            vec!["DEL", a, b],
            vec!["UNLINK", c3, a],
            vec!["MGET", a, b, c3],
        ] {
            assert_eq!(c.cmd(&cmd), V::s("QUEUED"), "{proto:?} {cmd:?}");
        }
        let got = c.cmd(&["EXEC"]);
        assert_eq!(
            got,
            V::Arr(vec![
                V::ok(),
                V::Int(3),
                V::Arr(vec![V::s("3"), V::Nil, V::s("1"), V::s("3"), V::s("1")]),
                V::Int(4),
                V::Int(2),
                V::Int(2),
                V::Int(1),
                V::Arr(vec![V::Nil, V::Nil, V::Nil]),
            ]),
            "{proto:?}"
        );
        // every master ran its part as a native transaction
        for (m, before) in masters.iter().zip(execs) {
            assert!(common::cmdstat_calls(*m, "exec") > before, "{m}");
        }
        // under WATCH it is one transaction on one master: refused, as before
        assert_eq!(c.cmd(&["WATCH", a]), V::ok());
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["MSET", a, "1", b, "2"]), err("CROSSSLOT Keys in request don't hash to the same slot"));
        assert_eq!(c.cmd(&["EXEC"]), err(EXECABORT));
    }
    // at the default, refused as before
    let mut c = Conn::connect(env.proxy.port());
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    let (a, b) = (env.owners.tag_on(masters[0], "sp:d"), env.owners.tag_on(masters[1], "sp:d"));
    assert_eq!(c.cmd(&["MSET", &a, "1", &b, "2"]), err("CROSSSLOT Keys in request don't hash to the same slot"));
    assert_eq!(c.cmd(&["DISCARD"]), V::ok());
}

/// Django's Redis cache: `set_many` is a MULTI holding one MSET across slots (and an
/// EXPIRE per key); with `per-node` it works through heatshield as against one Redis.
#[test]
fn django_cache_set_many_get_many_delete_many_with_per_node() {
    let env = env();
    let (_dir, path) = config_file("[transactions]\ncross_slot = \"per-node\"\n");
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let reference = common::RedisStandalone::start();
    const SCRIPT: &str = r#"
import json, sys
import django
from django.conf import settings
settings.configure(CACHES={"default": {
    "BACKEND": "django.core.cache.backends.redis.RedisCache",
    "LOCATION": "redis://127.0.0.1:%s" % sys.argv[1],
    "KEY_PREFIX": "dj",
}})
django.setup()
from django.core.cache import cache
out = {}
data = {"user:%d" % i: {"n": i, "name": "u%d" % i} for i in range(40)}
out["set_many"] = cache.set_many(data, timeout=300)
got = cache.get_many(list(data) + ["user:missing"])
out["get_many"] = sorted((k, v["n"]) for k, v in got.items())
out["ttl_ok"] = all(0 < cache.ttl(k) <= 300 for k in data) if hasattr(cache, "ttl") else True
cache.set_many({"a": 1, "b": 2})
out["incr"] = cache.incr("a", 10)
out["delete_many"] = cache.delete_many(list(data) + ["a", "b"])
out["after"] = cache.get_many(list(data) + ["a", "b"])
print(json.dumps(out, sort_keys=True))
"#;
    let run = |port: u16| {
        let out = std::process::Command::new("python3")
            .args(["-c", SCRIPT, &port.to_string()])
            .output()
            .expect("run python3 (scripts/ensure-deps.sh installs Django)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let ours = run(proxy.port());
    assert_eq!(ours, run(reference.port()), "heatshield vs one Redis");
    assert!(ours.contains(r#""set_many": []"#) && ours.contains(r#""incr": 11"#), "{ours}");
}

/// EXEC with a wrong number of arguments: Redis's EXECABORT, and the transaction is gone
/// (in or out of MULTI).
#[test]
fn exec_with_arguments_discards_the_transaction() {
    let env = env();
    let abort =
        V::Err("EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command".into());
    let mut c = Conn::connect(env.proxy.port());
    assert_eq!(c.cmd(&["EXEC", "x"]), abort);
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["SET", "tx:execargs", "1"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC", "x"]), abort);
    assert_eq!(c.cmd(&["EXEC"]), V::Err("ERR EXEC without MULTI".into()));
    assert_eq!(c.cmd(&["EXISTS", "tx:execargs"]), V::Int(0));
}

/// A command Redis never runs in a transaction (SAVE, SHUTDOWN: `no-multi`) gets Redis's
/// text, and the transaction aborts at EXEC, as in Redis.
#[test]
fn no_multi_commands_are_refused_with_redis_text() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    let direct = {
        let mut m = Conn::connect(env.owners.masters()[0]);
        assert_eq!(m.cmd(&["MULTI"]), V::ok());
        let e = m.cmd(&["SAVE"]);
        m.cmd(&["DISCARD"]);
        e
    };
    for cmd in [&["SAVE"][..], &["SHUTDOWN"][..]] {
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(cmd), direct, "{cmd:?}");
        assert!(c.cmd(&["EXEC"]).err().is_some_and(|e| e.starts_with("EXECABORT")));
    }
}
