//! Key colocation (docs/colocation.md) through heatshield in front of a real 3+3 cluster:
//! a rule's keys share one slot, so the multi-key commands, transactions and scripts of
//! frameworks written for one Redis run unchanged; the client sees only its own key
//! names, in replies and pushes alike, compared byte for byte with a standalone Redis
//! that has no rules at all.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, V};
use common::{Proxy, RedisCluster, RedisStandalone, Shared, cmd_text, config_file, key_slot};

const RULES: &str = r#"
[[colocate]]
name = "rq"
keys = ["rq:*"]
tag = "rq"

[[colocate]]
name = "redis-lock"
keys = ["lock:*", "lock-signal:*"]
tag = "$1"

[[colocate]]
name = "celery"
keys = ["_kombu.*", "unacked*", "celery*", "q1*", "q2*"]
tag = "celery"

[[colocate]]
name = "bullmq"
keys = ["bull:*:*"]
tag = "bull:$1"

[[colocate]]
name = "fam"
keys = ["fam:*:*"]
tag = "fam-$1"

[cache]
pin = ["rq:pin:*"]
"#;

struct Env {
    cluster: RedisCluster,
    proxy: Proxy,
    reference: RedisStandalone,
    _dir: tempfile::TempDir,
}

static ENV: Shared<Env> = Shared::new();

fn env() -> Arc<Env> {
    ENV.get(|| {
        let cluster = RedisCluster::start();
        let (dir, path) = config_file(RULES);
        let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
        Env { cluster, proxy, reference: RedisStandalone::start(), _dir: dir }
    })
}

/// The same commands through heatshield and to the reference, one connection each: the
/// same reply bytes.
fn same(env: &Env, proto: Proto, cmds: &[&[&str]]) -> Vec<String> {
    let mut p = Conn::connect_proto(env.proxy.port(), proto);
    let mut r = Conn::connect_proto(env.reference.port(), proto);
    let mut out = Vec::new();
    for c in cmds {
        let (a, b) = (p.cmd_full(c), r.cmd_full(c));
        let (a, b) = (String::from_utf8_lossy(&a.raw).into_owned(), String::from_utf8_lossy(&b.raw).into_owned());
        assert_eq!(a, b, "{proto:?} {c:?}");
        out.push(a);
    }
    out
}

/// The master that owns `key`'s slot, asked directly.
fn stored(env: &Env, key: &str) -> String {
    cmd_text(env.cluster.master_for_key(key.as_bytes()), &["GET", key])
}

#[test]
fn a_rules_keys_share_a_slot_under_their_own_names() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let (a, b, c) = (format!("rq:a{t}"), format!("rq:job:b{t}"), format!("fam:x:{t}"));
        same(
            &env,
            proto,
            &[
                &["MSET", &a, "1", &b, "2"],
                &["MGET", &a, &b],
                &["RENAME", &a, &format!("rq:renamed{t}")],
                &["EXISTS", &a, &format!("rq:renamed{t}"), &b],
                &["SET", &c, "fam"],
                &["COPY", &c, &format!("fam:x:copy{t}")],
                &["DEL", &format!("rq:renamed{t}"), &b, &c, &format!("fam:x:copy{t}")],
            ],
        );
    }
    // stored under the rule's tag, first, on the tag's master
    let mut p = Conn::connect(env.proxy.port());
    assert_eq!(p.cmd(&["SET", "rq:stored", "v"]), V::ok());
    assert_eq!(stored(&env, "{rq}rq:stored"), "v");
    assert_eq!(p.cmd(&["SET", "lock-signal:o1", "s"]), V::ok());
    assert_eq!(stored(&env, "{o1}lock-signal:o1"), "s");
    assert_eq!(p.cmd(&["SET", "fam:q7:wait", "w"]), V::ok());
    assert_eq!(stored(&env, "{fam-q7}fam:q7:wait"), "w");
    // a key with a hash tag of its own, or that no rule matches, is left alone
    assert_eq!(p.cmd(&["SET", "{own}rq:x", "1"]), V::ok());
    assert_eq!(stored(&env, "{own}rq:x"), "1");
    assert_eq!(p.cmd(&["SET", "plain:key", "1"]), V::ok());
    assert_eq!(stored(&env, "plain:key"), "1");
    // without the rule those keys are in different slots: the cluster refuses them
    assert_ne!(key_slot(b"rq:a"), key_slot(b"rq:job:b"));
    let direct = env.cluster.master_for_key(b"rq:a");
    assert!(common::cmd(direct, &["MSET", "rq:a", "1", "rq:job:b", "2"]).is_err());
}

#[test]
fn keys_scan_and_randomkey_show_the_clients_names() {
    let env = env();
    let mut p = Conn::connect(env.proxy.port());
    let mut r = Conn::connect(env.reference.port());
    let names: Vec<String> = (0..150).map(|i| format!("rq:list:{i}")).collect();
    for c in [&mut p, &mut r] {
        for n in &names {
            assert_eq!(c.cmd(&["SET", n, "1"]), V::ok());
        }
        assert_eq!(c.cmd(&["SET", "{rq}notarule", "1"]), V::ok());
    }
    let sorted = |v: V| {
        let mut s: Vec<String> = v.items().iter().map(V::text).collect();
        s.sort();
        s
    };
    for pattern in ["rq:list:*", "rq:list:1?", "*list:14*", "{rq}*"] {
        assert_eq!(sorted(p.cmd(&["KEYS", pattern])), sorted(r.cmd(&["KEYS", pattern])), "KEYS {pattern}");
        let scan = |c: &mut Conn| {
            let (mut cursor, mut all) = ("0".to_string(), Vec::new());
            loop {
                let v = c.cmd(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "50"]);
                cursor = v.items()[0].text();
                all.extend(v.items()[1].items().iter().map(V::text));
                if cursor == "0" {
                    break;
                }
            }
            all.sort();
            all.dedup();
            all
        };
        assert_eq!(scan(&mut p), scan(&mut r), "SCAN MATCH {pattern}");
    }
    // an unfiltered SCAN and RANDOMKEY never show a stored name (a SCAN may return a
    // name twice, as Redis's may while a table grows: other tests write meanwhile)
    let (mut cursor, mut seen) = ("0".to_string(), std::collections::HashSet::new());
    loop {
        let v = p.cmd(&["SCAN", &cursor, "COUNT", "100"]);
        cursor = v.items()[0].text();
        for k in v.items()[1].items() {
            assert!(!k.text().starts_with("{rq}rq:"), "{}", k.text());
            if k.text().starts_with("rq:list:") {
                seen.insert(k.text());
            }
        }
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen.len(), names.len());
    // (until it picked one of the rule's keys: the other tests' keys on that master make
    // that rarer, so a fixed number of tries failed now and then)
    let (mut rq, mut tries) = (0, 0);
    while rq < 3 && tries < 20_000 {
        let k = p.cmd(&["RANDOMKEY"]).text();
        assert!(!k.starts_with("{rq}rq:"), "{k}");
        rq += k.starts_with("rq:") as usize;
        tries += 1;
    }
    assert!(rq > 0, "RANDOMKEY never picked the rule's keys in {tries} tries");
    for n in &names {
        p.cmd(&["DEL", n]);
        r.cmd(&["DEL", n]);
    }
}

#[test]
fn blocking_pops_and_streams_name_the_clients_keys() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let (l, z, s) = (format!("rq:l{t}"), format!("rq:z{t}"), format!("rq:s{t}"));
        same(
            &env,
            proto,
            &[
                &["DEL", &l, &z, &s],
                &["RPUSH", &l, "a", "b", "c", "d", "e"],
                &["BLPOP", "rq:empty", &l, "1"],
                &["BRPOP", &l, "1"],
                &["LMPOP", "2", "rq:empty", &l, "LEFT"],
                &["BLMPOP", "1", "1", &l, "RIGHT", "COUNT", "5"],
                &["ZADD", &z, "1", "m1", "2", "m2", "3", "m3", "4", "m4"],
                &["BZPOPMIN", &z, "1"],
                &["BZPOPMAX", &z, "1"],
                &["ZMPOP", "1", &z, "MIN"],
                &["BZMPOP", "1", "1", &z, "MAX"],
                &["XADD", &s, "1-1", "f", "v"],
                &["XREAD", "COUNT", "5", "STREAMS", &s, "0"],
                &["XGROUP", "CREATE", &s, "g", "0"],
                &["XREADGROUP", "GROUP", "g", "c", "STREAMS", &s, ">"],
                &["DEL", &l, &z, &s],
            ],
        );
    }
}

#[test]
fn transactions_and_scripts_span_a_family() {
    let env = env();
    let body =
        "redis.call('SET', KEYS[1] .. ':copy', redis.call('GET', KEYS[1])) return redis.call('MGET', KEYS[1], KEYS[2])";
    for proto in Proto::BOTH {
        let t = proto.tag();
        let (a, b, q) = (format!("rq:tx:a{t}"), format!("rq:tx:b{t}"), format!("rq:tx:q{t}"));
        same(
            &env,
            proto,
            &[
                &["MULTI"],
                &["SET", &a, "1"],
                &["INCRBY", &b, "5"],
                &["LPUSH", &q, "job"],
                &["MGET", &a, &b],
                &["EXEC"],
                &["WATCH", &a, &b],
                &["MULTI"],
                &["RPOPLPUSH", &q, &format!("rq:tx:done{t}")],
                &["EXEC"],
                &["EVAL", body, "2", &a, &b],
                // the script built its name from KEYS[1]: the tag came along
                &["GET", &format!("{a}:copy")],
                &["DEL", &a, &b, &q, &format!("rq:tx:done{t}"), &format!("{a}:copy")],
            ],
        );
    }
}

#[test]
fn a_tracking_client_hears_of_its_keys_by_their_names() {
    let env = env();
    for (i, k) in ["rq:track", "lock:track"].iter().enumerate() {
        let mut p = Conn::connect_proto(env.proxy.port(), Proto::Resp3);
        let mut r = Conn::connect_proto(env.reference.port(), Proto::Resp3);
        for c in [&mut p, &mut r] {
            assert_eq!(c.cmd(&["SET", k, "old"]), V::ok());
            assert_eq!(c.cmd(&["CLIENT", "TRACKING", "ON"]), V::ok());
            assert_eq!(c.cmd(&["GET", k]), V::s("old"));
        }
        // a write of another client: the invalidation names the client's key
        assert_eq!(common::cmd(env.proxy.port(), &["SET", k, "new"]), V::ok());
        assert_eq!(common::cmd(env.reference.port(), &["SET", k, "new"]), V::ok());
        let (a, b) = (p.read_full(), r.read_full());
        assert_eq!(String::from_utf8_lossy(&a.raw), String::from_utf8_lossy(&b.raw), "{i}: another's write");
        // its own write: the notice right after its reply, with its name
        for c in [&mut p, &mut r] {
            assert_eq!(c.cmd(&["GET", k]), V::s("new"));
        }
        let (a, b) = (p.cmd_full(&["SET", k, "mine"]), r.cmd_full(&["SET", k, "mine"]));
        assert_eq!(a.raw, b.raw);
        let (a, b) = (p.read_full(), r.read_full());
        assert_eq!(String::from_utf8_lossy(&a.raw), String::from_utf8_lossy(&b.raw), "{i}: its own write");
    }
}

#[test]
fn rules_change_at_runtime() {
    let env = env();
    let mut p = Conn::connect(env.proxy.port());
    let (a, b) = ("rt:a", "rt:bb");
    assert_ne!(key_slot(a.as_bytes()), key_slot(b.as_bytes()));
    let crossslot = V::Err("CROSSSLOT Keys in request don't hash to the same slot".into());
    assert_eq!(p.cmd(&["RPOPLPUSH", a, b]), crossslot);
    // other tests of this file add rules of their own to the shared proxy at any time:
    // look only at the configured ones and this test's own
    let names = |p: &mut Conn| -> Vec<String> {
        let list = p.cmd(&["PROXY", "COLOCATE", "LIST"]);
        list.items().iter().map(|r| r.get("name").unwrap().text()).filter(|n| n != "mig").collect()
    };
    assert_eq!(p.cmd(&["PROXY", "COLOCATE", "SET", "runtime", "rt", "rt:*"]), V::ok());
    assert_eq!(names(&mut p), ["rq", "redis-lock", "celery", "bullmq", "fam", "runtime"]);
    assert_eq!(p.cmd(&["RPUSH", a, "1"]), V::Int(1));
    assert_eq!(p.cmd(&["RPOPLPUSH", a, b]), V::s("1"));
    assert_eq!(common::cmd(env.cluster.master_for_key(b"rt"), &["LRANGE", "{rt}rt:bb", "0", "-1"]), V::strs(&["1"]));
    // a bad rule is refused with its reason, and nothing changes
    let e = p.cmd(&["PROXY", "COLOCATE", "SET", "bad", "$3", "x:*"]);
    assert!(e.err().is_some_and(|e| e.starts_with("ERR invalid rule") && e.contains("$3")), "{e:?}");
    assert_eq!(names(&mut p), ["rq", "redis-lock", "celery", "bullmq", "fam", "runtime"]);
    assert_eq!(p.cmd(&["DEL", a, b]), V::Int(1));
    assert_eq!(p.cmd(&["PROXY", "COLOCATE", "DEL", "runtime"]), V::Int(1));
    assert_eq!(p.cmd(&["PROXY", "COLOCATE", "DEL", "runtime"]), V::Int(0));
    assert_eq!(p.cmd(&["RPOPLPUSH", a, b]), crossslot);
}

#[test]
fn acl_rules_and_rate_limits_see_the_clients_names() {
    let env = env();
    let mut admin = Conn::connect(env.proxy.port());
    assert_eq!(admin.cmd(&["ACL", "SETUSER", "colo", "on", ">pw", "~rq:acl:*", "+@all"]), V::ok());
    let mut u = Conn::connect(env.proxy.port());
    assert_eq!(u.cmd(&["AUTH", "colo", "pw"]), V::ok());
    assert_eq!(u.cmd(&["SET", "rq:acl:1", "v"]), V::ok());
    assert_eq!(u.cmd(&["GET", "rq:acl:1"]), V::s("v"));
    let noperm = V::Err("NOPERM this user has no permissions to access one of the keys used as arguments".into());
    assert_eq!(u.cmd(&["GET", "rq:other"]), noperm);
    // the stored name is the same key, checked by the client's name
    assert_eq!(u.cmd(&["GET", "{rq}rq:acl:1"]), V::s("v"));
    assert_eq!(u.cmd(&["GET", "{rq}rq:other"]), noperm);
    // a rate limit on the client's names
    let rule = ["PROXY", "RATELIMIT", "SET", "colo", "rq:rl:*", "1", "2", "per-key", "writes"];
    assert_eq!(admin.cmd(&rule), V::ok());
    let replies: Vec<V> = (0..4).map(|_| admin.cmd(&["SET", "rq:rl:k", "v"])).collect();
    assert!(replies[..2].iter().all(V::is_ok), "{replies:?}");
    assert!(replies[2].err().is_some_and(|e| e.starts_with("THROTTLED")), "{replies:?}");
    // the stored name sent by the client draws on the same budget, and a key's stored
    // name alone is limited by the rule on its client name (a key starting with '{' is
    // never skipped by admission's first-byte look)
    let stored = admin.cmd(&["SET", "{rq}rq:rl:k", "v"]);
    assert!(stored.err().is_some_and(|e| e.starts_with("THROTTLED")), "{stored:?}");
    let replies: Vec<V> = (0..4).map(|_| admin.cmd(&["SET", "{rq}rq:rl:j", "v"])).collect();
    assert!(replies[..2].iter().all(V::is_ok), "{replies:?}");
    assert!(replies[2].err().is_some_and(|e| e.starts_with("THROTTLED")), "{replies:?}");
    assert_eq!(admin.cmd(&["PROXY", "RATELIMIT", "DEL", "colo"]), V::Int(1));
    assert_eq!(admin.cmd(&["ACL", "DELUSER", "colo"]), V::Int(1));
}

/// Runs tests/python/`script` with the port and `args`; its one line of JSON.
fn python(script: &str, port: u16, args: &[&str]) -> String {
    let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("python3")
        .arg(&path)
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("run python3 (scripts/ensure-deps.sh installs rq and python-redis-lock)");
    assert!(out.status.success(), "{script} on {port}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string()
}

/// Runs `tests/node/SCRIPT PORT ARGS...` (90 s at most): its exit status and output.
fn node(script: &str, port: u16, args: &[&str]) -> (bool, String) {
    common::fixtures::node_clients_installed();
    let mut child = std::process::Command::new("node")
        .arg(format!("{}/{script}", common::fixtures::NODE_DIR))
        .arg(port.to_string())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run node (scripts/ensure-deps.sh installs it)");
    let started = Instant::now();
    while child.try_wait().expect("wait for node").is_none() {
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("node output");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// bullmq with its default prefix: its scripts build a job's key from the prefix they
/// are passed in ARGV, which no rewrite of a command's keys reaches; the shim heatshield
/// puts in front of a script whose keys a rule colocates renames those too. A queue, a
/// worker, queue events, a delayed, a prioritized and a retried job, and a flow.
#[test]
fn bullmq_with_its_default_prefix_runs_through_a_colocation_rule() {
    let env = env();
    let (ok, ours) = node("bullmq_default.js", env.proxy.port(), &["colo"]);
    assert!(ok, "{ours}");
    let (ok, theirs) = node("bullmq_default.js", env.reference.port(), &["colo"]);
    assert!(ok, "{theirs}");
    assert_eq!(ours, theirs, "heatshield vs one Redis");
    assert!(ours.contains("completed events 7") && ours.contains("return values 2 4 6 8"), "{ours}");
    // nothing was left under a plain name (obliterate removed what it knew of)
    for port in env.cluster.masters() {
        assert_eq!(common::cmd(port, &["KEYS", "bull:colo:*"]), V::Arr(vec![]), "on {port}");
    }
    // without the rule, bullmq fails on the cluster
    let p = Proxy::start_cluster(&env.cluster, &[]);
    let (ok, plain) = node("bullmq_default.js", p.port(), &["colo-plain"]);
    assert!(!ok && plain.contains("CROSSSLOT"), "{plain}");
}

/// rq: jobs enqueued on two queues, a burst worker runs them (its BLPOP over both queues
/// names the queue it took a job from), results read back.
#[test]
fn rq_runs_its_jobs_through_a_colocation_rule() {
    let env = env();
    let ours = python("rq_check.py", env.proxy.port(), &[]);
    assert_eq!(ours, python("rq_check.py", env.reference.port(), &[]), "heatshield vs one Redis");
    assert!(ours.contains(r#""results": [5, 30, 2]"#), "{ours}");
    // and without the rule rq fails on the cluster (its transactions span slots)
    let plain = Proxy::start_cluster(&env.cluster, &[]);
    let path = format!("{}/tests/python/rq_check.py", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("python3").arg(&path).arg(plain.port().to_string()).output().unwrap();
    assert!(!out.status.success() || !String::from_utf8_lossy(&out.stdout).contains(r#""results": [5, 30, 2]"#));
}

/// python-redis-lock: acquire, extend, release, and a waiter woken by the release's
/// signal (a BLPOP on `lock-signal:NAME`, which its script fills with `lock:NAME`).
#[test]
fn python_redis_lock_works_through_a_colocation_rule() {
    let env = env();
    let start = Instant::now();
    let ours = python("lock_check.py", env.proxy.port(), &["hs"]);
    assert_eq!(ours, python("lock_check.py", env.reference.port(), &["hs"]), "heatshield vs one Redis");
    assert!(ours.contains(r#""waiter_woken_by_signal": true"#), "{ours}");
    assert!(start.elapsed() < Duration::from_secs(60));
}

/// Keyspace notifications from the rule's master: the key in a `__keyspace@0__:` channel
/// and in a `__keyevent@0__:` message is the client's, in both protocols.
#[test]
fn keyspace_notifications_name_the_clients_keys() {
    let env = env();
    for port in env.cluster.masters().into_iter().chain([env.reference.port()]) {
        assert_eq!(common::cmd(port, &["CONFIG", "SET", "notify-keyspace-events", "KE$"]), V::ok());
    }
    for proto in Proto::BOTH {
        let key = format!("rq:ks{}", proto.tag());
        let subs: Vec<(Conn, Vec<String>)> = [env.proxy.port(), env.reference.port()]
            .iter()
            .map(|&port| {
                let mut s = Conn::connect_proto(port, proto);
                // the key's own channel, and a pattern of its family's (only this test
                // writes such keys: nothing comes between their confirmations)
                let own = format!("__keyspace@0__:{key}");
                let mut confirmations = Vec::new();
                for c in [&["SUBSCRIBE", &own][..], &["PSUBSCRIBE", "__keyspace@0__:rq:ks*"], &["UNSUBSCRIBE", &own]]
                    .into_iter()
                    .chain([&["SUBSCRIBE", &own][..]])
                {
                    confirmations.push(String::from_utf8_lossy(&s.cmd_full(c).raw).into_owned());
                }
                s.send(&["PSUBSCRIBE", "__keyspace@0__:*"]);
                s.send(&["SUBSCRIBE", "__keyevent@0__:set"]);
                // both confirmed (other tests' notices may come between)
                let mut confirmed = 0;
                while confirmed < 2 {
                    let f = String::from_utf8_lossy(&s.read_full().raw).into_owned();
                    confirmed += f.contains("subscribe\r\n") as usize;
                }
                (s, confirmations)
            })
            .collect();
        assert_eq!(subs[0].1, subs[1].1, "{proto:?}: the confirmations of a key's channel");
        assert!(subs[1].1[0].contains(&format!(":{key}\r\n")), "{:?}", subs[1].1);
        let mut subs: Vec<Conn> = subs.into_iter().map(|(s, _)| s).collect();
        assert_eq!(common::cmd(env.proxy.port(), &["SET", &key, "v"]), V::ok());
        assert_eq!(common::cmd(env.reference.port(), &["SET", &key, "v"]), V::ok());
        let mut got: Vec<Vec<String>> = subs
            .iter_mut()
            .map(|s| {
                // (other tests write keys meanwhile: only this key's four notices count:
                // its channel, the two patterns, and the keyevent channel)
                let mut four = Vec::new();
                for _ in 0..10_000 {
                    let f = String::from_utf8_lossy(&s.read_full().raw).into_owned();
                    if f.contains(&format!("{key}\r\n")) && f.contains("message") {
                        four.push(f);
                    }
                    if four.len() == 4 {
                        break;
                    }
                }
                four.sort();
                four
            })
            .collect();
        let reference = got.pop().unwrap();
        assert_eq!(got[0], reference, "{proto:?}");
        assert!(reference[0].contains(&key), "{reference:?}");
    }
    // every master's notices: a family per master (a lock's name is its tag)
    let masters = env.cluster.masters();
    let locks: Vec<String> = masters
        .iter()
        .map(|&m| {
            let tag = (0..).map(|i| format!("ks{i}")).find(|t| env.cluster.master_for_key(t.as_bytes()) == m).unwrap();
            format!("lock:{tag}")
        })
        .collect();
    let heard: Vec<Vec<String>> = [env.proxy.port(), env.reference.port()]
        .iter()
        .map(|&port| {
            let mut s = Conn::connect_proto(port, Proto::Resp3);
            s.cmd(&["PSUBSCRIBE", "__keyspace@0__:*"]);
            for l in &locks {
                assert_eq!(common::cmd(port, &["SET", l, "v"]), V::ok());
            }
            let mut heard = Vec::new();
            for _ in 0..10_000 {
                let f = String::from_utf8_lossy(&s.read_full().raw).into_owned();
                if let Some(l) = locks.iter().find(|l| f.contains(&format!("__keyspace@0__:{l}\r\n"))) {
                    heard.push(l.clone());
                }
                if heard.len() == locks.len() {
                    break;
                }
            }
            heard.sort();
            heard
        })
        .collect();
    assert_eq!(heard[0], heard[1], "the notices of every master's keys");
    assert_eq!(heard[0].len(), masters.len());
    for port in masters.into_iter().chain([env.reference.port()]) {
        common::cmd(port, &["CONFIG", "SET", "notify-keyspace-events", ""]);
    }
}

/// Inside a transaction, the names in EXEC's array are the client's; so are SORT's STORE
/// destination, the keys an error quotes, BCAST tracking prefixes, the hot-key cache's pin
/// patterns and CLUSTER GETKEYSINSLOT's names.
#[test]
fn transactions_sort_errors_bcast_and_pins_see_the_clients_names() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let (l, s, z) = (format!("rq:tx:l{t}"), format!("rq:tx:s{t}"), format!("rq:tx:z{t}"));
        same(
            &env,
            proto,
            &[
                &["RPUSH", &l, "a", "b", "c"],
                &["XADD", &s, "1-1", "f", "v"],
                &["ZADD", &z, "1", "m"],
                &["MULTI"],
                &["LMPOP", "1", &l, "LEFT"],
                &["BLPOP", &l, "0"],
                &["XREAD", "STREAMS", &s, "0"],
                &["BZPOPMIN", &z, "0"],
                &["XREADGROUP", "GROUP", "g", "c", "STREAMS", &s, ">"],
                &["GET", &l],
                &["EXEC"],
                &["XPENDING", &s, "g"],
                &["XGROUP", "CREATECONSUMER", &s, "g", "c"],
                &["DEL", &l, &s, &z],
            ],
        );
        // SORT ... STORE: the destination is the family's too (SORT's BY and GET, which
        // Redis 7.0 refuses in cluster mode whatever the pattern, are tested on Valkey 9.1)
        let sl = format!("rq:sort{t}");
        same(
            &env,
            proto,
            &[
                &["RPUSH", &sl, "3", "1", "2"],
                &["SORT", &sl, "DESC", "STORE", &format!("rq:sorted{t}")],
                &["LRANGE", &format!("rq:sorted{t}"), "0", "-1"],
                &["DEL", &sl, &format!("rq:sorted{t}")],
            ],
        );
    }
    // BCAST tracking with a prefix of a family: told of the family's keys by their names
    let mut p = Conn::connect_proto(env.proxy.port(), Proto::Resp3);
    let mut r = Conn::connect_proto(env.reference.port(), Proto::Resp3);
    for c in [&mut p, &mut r] {
        assert_eq!(c.cmd(&["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "rq:bcast:"]), V::ok());
    }
    assert_eq!(common::cmd(env.proxy.port(), &["SET", "rq:bcast:1", "v"]), V::ok());
    assert_eq!(common::cmd(env.reference.port(), &["SET", "rq:bcast:1", "v"]), V::ok());
    // (heatshield may first tell it to drop everything: the invalidation connections
    // turn BCAST on when the first client tracks, and what was written before is unknown)
    let flushed = ">2\r\n$10\r\ninvalidate\r\n_\r\n";
    let a = std::iter::repeat_with(|| String::from_utf8_lossy(&p.read_full().raw).into_owned())
        .find(|f| f != flushed)
        .unwrap();
    assert_eq!(a, String::from_utf8_lossy(&r.read_full().raw), "a BCAST prefix");
    assert_eq!(common::cmd(env.proxy.port(), &["DEL", "rq:bcast:1"]), V::Int(1));
    // a pinned family key is cached (cache.pin = ["rq:pin:*"]) though stored as {rq}rq:pin:1
    // (through a heatshield of its own with the same rules: the shared one's hit counter
    // also counts the other tests' hits, which once passed for this key's)
    let (_pin_dir, pin_config) = config_file(RULES);
    let own = Proxy::start_cluster(&env.cluster, &["--config", &pin_config]);
    let mut c = Conn::connect(own.port());
    assert_eq!(c.cmd(&["SET", "rq:pin:1", "blob"]), V::ok());
    assert_eq!(c.cmd(&["GET", "rq:pin:1"]), V::s("blob")); // fills
    let stats = |c: &mut Conn| c.cmd(&["PROXY", "CACHE", "STATS"]);
    let hits = |c: &mut Conn| stats(c).get("hits").unwrap().int();
    // (a fill is refused while the worker's connection to the node is still being made:
    // read until one read is a hit, then every read is)
    common::wait_until(Duration::from_secs(5), "the pinned key cached", || {
        let before = hits(&mut c);
        assert_eq!(c.cmd(&["GET", "rq:pin:1"]), V::s("blob"));
        hits(&mut c) > before
    });
    let (before, before_stats) = (hits(&mut c), stats(&mut c));
    for _ in 0..10 {
        assert_eq!(c.cmd(&["GET", "rq:pin:1"]), V::s("blob"));
    }
    assert!(
        hits(&mut c) == before + 10,
        "a pinned family key was not served from the cache: before {before_stats:?}, after {:?}",
        stats(&mut c)
    );
    assert_eq!(c.cmd(&["DEL", "rq:pin:1"]), V::Int(1));
    assert_eq!(c.cmd(&["GET", "rq:pin:1"]), V::Nil);
    drop(own);
    let mut c = Conn::connect(env.proxy.port());
    // CLUSTER GETKEYSINSLOT of the family's slot: the client's names
    assert_eq!(c.cmd(&["SET", "rq:inslot", "v"]), V::ok());
    let slot = key_slot(b"rq").to_string();
    let inslot = c.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100000"]);
    assert!(inslot.items().contains(&V::s("rq:inslot")), "{inslot:?}");
    assert!(!inslot.items().iter().any(|k| k.text().starts_with("{rq}rq:")), "{inslot:?}");
    assert_eq!(c.cmd(&["DEL", "rq:inslot"]), V::Int(1));
}

/// celery: a worker consuming two queues (its BRPOP over both, and every priority's list,
/// names the list it took a task from), a task sent to each, results read back through
/// the Redis result backend.
#[test]
fn celery_runs_tasks_from_two_queues_through_a_colocation_rule() {
    let env = env();
    let ours = python("celery_check.py", env.proxy.port(), &[]);
    assert_eq!(ours, python("celery_check.py", env.reference.port(), &[]), "heatshield vs one Redis");
    assert!(ours.contains(r#""results": [5, 30, 2]"#), "{ours}");
}

/// `heatshield colocate-migrate`: runs the binary with `args` after `--config FILE
/// --cluster SEEDS colocate-migrate`; (exit code, stdout).
fn migrate(env: &Env, config: &str, args: &[&str]) -> (i32, String) {
    let seeds = env.cluster.seeds();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_heatshield"))
        .args(["--config", config, "--cluster", &seeds, "colocate-migrate"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Keys matching `pattern` under their plain names, on any master.
fn plain_keys(env: &Env, pattern: &str) -> usize {
    env.cluster
        .masters()
        .iter()
        .map(|&m| cmd_text(m, &["KEYS", pattern]).lines().filter(|l| !l.is_empty()).count())
        .sum()
}

/// 10,000 keys written before their rule: the dry run changes nothing, a run stopped
/// after 4,000 keys, one killed mid-way and one to the end move them all, with their
/// values and expiry times; a key copied by a run that stopped before the delete is
/// finished, and a colocated name that exists with other contents is a conflict.
#[test]
fn colocate_migrate_moves_existing_keys_resumably() {
    let env = env();
    let (_dir, config) = config_file("[[colocate]]\nname = \"mig\"\nkeys = [\"mig:*\"]\ntag = \"mig\"\n");
    let mut p = Conn::connect(env.proxy.port());
    // written through heatshield before the rule: under their plain names
    let n = 10_000;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let cmds: Vec<Vec<Vec<u8>>> = chunk
            .iter()
            .map(|i| {
                let (k, v) = (format!("mig:{i}"), format!("value-{i}"));
                let mut c = vec![b"SET".to_vec(), k.into_bytes(), v.into_bytes()];
                if i % 3 == 0 {
                    c.extend([b"EX".to_vec(), b"3600".to_vec()]);
                }
                c
            })
            .collect();
        assert!(p.pipeline(&cmds).iter().all(V::is_ok));
    }
    assert_eq!(plain_keys(&env, "mig:*"), n);
    // a key a run copied and did not delete yet, and a conflicting one
    let half = env.cluster.master_for_key(b"mig:half");
    assert_eq!(p.cmd(&["SET", "mig:half", "h"]), V::ok());
    let dump = common::cmd(half, &["DUMP", "mig:half"]);
    let tagged = env.cluster.master_for_key(b"mig");
    assert_eq!(common::cmd(tagged, &[&b"RESTORE"[..], b"{mig}mig:half", b"0", dump.bytes()]), V::ok());
    assert_eq!(p.cmd(&["SET", "mig:clash", "mine"]), V::ok());
    assert_eq!(common::cmd(tagged, &["SET", "{mig}mig:clash", "theirs"]), V::ok());

    let (code, out) = migrate(&env, &config, &["--rule", "mig", "--dry-run"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("{} keys under their plain names; would move {n}; finished 1", n + 2)), "{out}");
    assert!(out.contains("conflict: mig:clash -> {mig}mig:clash"), "{out}");
    assert_eq!(plain_keys(&env, "mig:*"), n + 2, "a dry run moved keys");

    let (_, out) = migrate(&env, &config, &["--rule", "mig", "--max-keys", "4000"]);
    assert!(out.contains("moved 4000") || out.contains("moved 3999"), "{out}");
    assert_eq!(plain_keys(&env, "mig:*"), n + 2 - 4000);
    // killed mid-way: nothing lost, whatever it had done
    let seeds = env.cluster.seeds();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_heatshield"))
        .args(["--config", &config, "--cluster", &seeds, "colocate-migrate", "--rule", "mig"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let _ = child.kill();
    let _ = child.wait();
    let (code, out) = migrate(&env, &config, &["--rule", "mig"]);
    assert_eq!(code, 1, "the conflict stays: {out}");
    assert!(out.contains("1 conflicts"), "{out}");
    assert_eq!(plain_keys(&env, "mig:*"), 1, "only the conflicting key keeps its plain name");
    // through heatshield with the rule: every key, its value and its expiry
    assert_eq!(p.cmd(&["PROXY", "COLOCATE", "SET", "mig", "mig", "mig:*"]), V::ok());
    let mut seen = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let cmds: Vec<Vec<Vec<u8>>> = chunk
            .iter()
            .flat_map(|i| {
                [
                    common::client::args(&["GET", &format!("mig:{i}")]),
                    common::client::args(&["TTL", &format!("mig:{i}")]),
                ]
            })
            .collect();
        let got = p.pipeline(&cmds);
        for (j, i) in chunk.iter().enumerate() {
            assert_eq!(got[2 * j], V::s(format!("value-{i}")), "mig:{i}");
            let ttl = got[2 * j + 1].int();
            assert!(if i % 3 == 0 { (3500..=3600).contains(&ttl) } else { ttl == -1 }, "mig:{i} ttl {ttl}");
            seen += 1;
        }
    }
    assert_eq!(seen, n);
    assert_eq!(p.cmd(&["GET", "mig:half"]), V::s("h"));
    assert_eq!(p.cmd(&["GET", "mig:clash"]), V::s("theirs"));
    assert_eq!(common::cmd(env.cluster.master_for_key(b"mig:clash"), &["GET", "mig:clash"]), V::s("mine"));
    // tidy up (the rule stays only for this test's keys)
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let cmds: Vec<Vec<Vec<u8>>> =
            chunk.iter().map(|i| common::client::args(&["DEL", &format!("mig:{i}")])).collect();
        p.pipeline(&cmds);
    }
    assert_eq!(p.cmd(&["PROXY", "COLOCATE", "DEL", "mig"]), V::Int(1));
}

/// A script that builds a key name from ARGV reaches the name without the rule's tag:
/// Redis's refusal comes with the rule's name, and the ARGV that is a key name.
#[test]
fn a_script_building_names_from_argv_is_shimmed_or_told_which_rule() {
    let env = env();
    // a name the script makes from ARGV is stored as heatshield stores it; the script's
    // SHA1, in SCRIPT LOAD's reply and in an error, is the client's
    let body = "redis.call('SET', ARGV[1], ARGV[2]); return redis.call('GET', ARGV[1])";
    let failing = "return redis.call('NOSUCHCOMMAND', KEYS[1])";
    let sha = sha1_hex(body);
    same(
        &env,
        Proto::Resp2,
        &[
            &["EVAL", body, "1", "rq:declared", "rq:built-from-argv", "v1"],
            &["GET", "rq:built-from-argv"],
            &["SCRIPT", "LOAD", body],
            &["EVALSHA", &sha, "1", "rq:declared", "rq:built-from-argv", "v2"],
            &["EVALSHA_RO", &sha1_hex("return redis.call('GET', ARGV[1])"), "1", "rq:declared", "rq:x"],
            &["SCRIPT", "EXISTS", &sha, &sha1_hex(failing)],
            &["EVAL", failing, "1", "rq:declared"],
            &["MGET", "rq:declared", "rq:built-from-argv"],
            &["DEL", "rq:built-from-argv"],
        ],
    );
    assert_eq!(common::cmd(env.cluster.master_for_key(b"rq"), &["EXISTS", "{rq}rq:built-from-argv"]), V::Int(0));
    // a name no rule covers lives in another slot: Redis refuses it, and heatshield says
    // which rule the declared keys are under
    let mut p = Conn::connect(env.proxy.port());
    let rq = env.cluster.master_for_key(b"rq");
    let other = (0..).map(|i| format!("plain:{i}")).find(|k| env.cluster.master_for_key(k.as_bytes()) != rq).unwrap();
    let e = p.cmd(&["EVAL", "return redis.call('GET', ARGV[1])", "1", "rq:declared", &other]);
    let e = e.err().unwrap_or_default().to_string();
    assert!(e.contains("colocation rule \"rq\""), "{e}");
}

/// The shim's Lua, run by a real Redis, names keys exactly as heatshield does: the same
/// rule wins, the same tag, and the same names left alone.
#[test]
fn the_shims_lua_names_keys_as_heatshield_does() {
    use heatshield::services::colocate::{RuleConfig, compile};
    let env = env();
    let rule = |name: &str, keys: &[&str], tag: &str| RuleConfig {
        name: name.into(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        tag: tag.into(),
    };
    // (with a pattern that may start with any byte, and without: then the shim passes
    // over an argument by its first byte)
    let all = [
        rule("fixed", &["rq:*", "q.%-x*"], "rq"),
        rule("first", &["lock:*", "lock-signal:*"], "$1"),
        rule("second", &["bull:*:*"], "b-$2-$1"),
        rule("any", &["?a*b*"], "ab$1"),
        rule("tail", &["*.tmp"], "t"),
    ];
    for rules in [compile(&all).unwrap(), compile(&all[..3]).unwrap()] {
        let names = [
            "rq:1",
            "rq:",
            "rq",
            "q.%-xyz",
            "q.%-",
            "lock:a",
            "lock:",
            "lock-signal:a:b",
            "lock:a}b",
            "bull:q:1",
            "bull:q:1:lock",
            "bull:q",
            "xaYbZ",
            "ab",
            "aab",
            "x.tmp",
            ".tmp",
            "{t}rq:1",
            "rq:{x}",
            "rq:{}y",
            "é:rq",
            "rq:é",
            "lock:[x]",
            "bull::",
            "a\\b",
            "plain",
        ];
        let body = rules.shim(b"local out = {} for i, a in ipairs(ARGV) do out[i] = __hs_n(a) or '' end return out");
        let mut r = Conn::connect(env.reference.port());
        let mut args: Vec<&[u8]> = vec![b"EVAL", &body, b"0"];
        args.extend(names.iter().map(|n| n.as_bytes()));
        let got = r.cmd(&args);
        let want: Vec<V> = names.iter().map(|n| V::Str(rules.stored_name(n.as_bytes()).unwrap_or_default())).collect();
        assert_eq!(got, V::Arr(want), "{names:?}");
    }
}

fn sha1_hex(s: &str) -> String {
    sha1_smol::Sha1::from(s).digest().to_string()
}

/// The slow log and the big-key log show the client's names.
#[test]
fn the_slow_log_and_big_keys_show_the_clients_names() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    // (the other tests' commands are logged too while every command is: room for them, so
    // that they do not push this one out of a log of 128 on a loaded machine)
    assert!(c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_max_len", "100000"]).is_ok());
    assert!(c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_slower_than_us", "0"]).is_ok());
    assert_eq!(c.cmd(&["GET", "rq:slowlog"]), V::Nil);
    assert!(c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_slower_than_us", "1000000"]).is_ok());
    let log = c.cmd(&["PROXY", "SLOWLOG", "GET", "-1"]);
    assert!(c.cmd(&["PROXY", "CONFIG", "SET", "admin.slowlog_max_len", "128"]).is_ok());
    let ours = V::strs(&["GET", "rq:slowlog"]);
    assert!(log.items().iter().any(|e| e.items()[3] == ours), "{} entries, none {ours:?}", log.items().len());
    let value = "x".repeat(100_000);
    assert!(c.cmd(&["SET", "rq:bigkey", &value]).is_ok());
    let list = c.cmd(&["PROXY", "BIGKEYS", "1000"]);
    let keys: Vec<String> =
        list.items().iter().flat_map(|e| e.pairs()).filter(|(k, _)| k.text() == "key").map(|(_, v)| v.text()).collect();
    assert!(keys.iter().any(|k| k == "rq:bigkey"), "{keys:?}");
    assert!(!keys.iter().any(|k| k.starts_with("{rq}")), "{keys:?}");
    assert_eq!(c.cmd(&["DEL", "rq:bigkey"]), V::Int(1));
}

/// A pipeline read as one batch (colocation rules make the session parse several requests
/// before dispatching them): what follows QUIT in it is never run, renamed or not, and
/// the requests before it are.
#[test]
fn nothing_after_quit_in_a_batch_runs() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    assert!(c.cmd(&["DEL", "rq:quit", "plain:quit"]).int() >= 0);
    let mut p = Conn::connect(env.proxy.port());
    p.send_raw(
        b"*3\r\n$3\r\nSET\r\n$7\r\nrq:quit\r\n$1\r\n1\r\n*1\r\n$4\r\nQUIT\r\n\
          *3\r\n$3\r\nSET\r\n$7\r\nrq:quit\r\n$1\r\n2\r\n*3\r\n$3\r\nSET\r\n$10\r\nplain:quit\r\n$1\r\n2\r\n",
    );
    let (bytes, closed) = p.read_until_close(Duration::from_secs(5));
    assert_eq!(String::from_utf8_lossy(&bytes), "+OK\r\n+OK\r\n");
    assert!(closed);
    assert_eq!(c.cmd(&["GET", "rq:quit"]), V::s("1"));
    assert_eq!(c.cmd(&["GET", "plain:quit"]), V::Nil);
}
