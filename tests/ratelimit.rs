//! Per-key rate limits (docs/ratelimit.md) against a real cluster: rate and burst over a
//! few seconds of pressure (and refused requests never reach Redis), per-key vs shared
//! budgets, command filters, first matching rule wins, multi-key commands refused whole
//! without charging the other keys, PROXY RATELIMIT LIST / SET / DEL, SIGHUP reload (a bad
//! file keeps the old rules), and invalid rules rejected at start-up.
//!
//! Tests 2-5 share one cluster and one proxy whose configuration holds every rule they
//! need (distinct patterns per test). The rate/burst test reads `INFO commandstats` from a
//! master, so it takes the write side of the harness's traffic lock while the others hold the read side
//! around their data commands.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, V, args, encode};
use common::{
    ClusterEnv, Proxy, Shared, cmd_text, cmdstat_calls, config_file, exclusive_traffic, free_port, shared_traffic,
    wait_until,
};

/// Rules for the shared proxy, in this order.
const RULES: &str = r#"
# the hot-key cache would answer the hammered keys itself (tests/cache.rs covers that)
[cache]
enabled = false

[ratelimit]
max_tracked_keys = 100000

[[ratelimit.rules]]
name = "one"
pattern = "rl:one:*"
commands = "all"
rate = 100
burst = 10
scope = "per-key"

[[ratelimit.rules]]
name = "perkey"
pattern = "rl:pk:*"
commands = "all"
rate = 1
burst = 5
scope = "per-key"

# one shared budget per protocol pass (the passes run back to back, well within 1 s)
[[ratelimit.rules]]
name = "shared-r2"
pattern = "rl:sh:r2:*"
commands = "all"
rate = 1
burst = 5
scope = "shared"

[[ratelimit.rules]]
name = "shared-r3"
pattern = "rl:sh:r3:*"
commands = "all"
rate = 1
burst = 5
scope = "shared"

[[ratelimit.rules]]
name = "readsonly"
pattern = "rl:ro:*"
commands = "reads"
rate = 1
burst = 2
scope = "per-key"

[[ratelimit.rules]]
name = "narrow"
pattern = "rl:fm:hot*"
commands = "all"
rate = 1
burst = 1
scope = "per-key"

[[ratelimit.rules]]
name = "wide"
pattern = "rl:fm:*"
commands = "all"
rate = 1
burst = 100
scope = "per-key"

[[ratelimit.rules]]
name = "multikey"
pattern = "rl:mk:*"
commands = "all"
rate = 1
burst = 3
scope = "per-key"
"#;

const RULE_NAMES: [&str; 8] = ["one", "perkey", "shared-r2", "shared-r3", "readsonly", "narrow", "wide", "multikey"];

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(Some(RULES)))
}

/// The exact error text of docs/ratelimit.md (without the leading `-`).
fn throttled(key: &str, rate: u64, rule: &str) -> String {
    format!("THROTTLED key '{key}' is over {rate} requests/s (rule '{rule}')")
}

/// A reply that went through to Redis (a value or OK, not an error).
fn admitted(v: &V) -> bool {
    !v.is_err()
}

/// `n` copies of one command, pipelined.
fn repeat(c: &mut Conn, n: usize, cmd: &[&str]) -> Vec<V> {
    let cmds: Vec<Vec<Vec<u8>>> = (0..n).map(|_| args(cmd)).collect();
    c.pipeline(&cmds)
}

/// A scalar LIST field as text (integers, doubles and strings alike; arrays joined by ",").
fn as_text(v: &V) -> String {
    match v {
        V::Str(_) => v.text(),
        V::Int(i) => i.to_string(),
        V::Double(d) if d.fract() == 0.0 => format!("{}", *d as i64),
        V::Double(d) => d.to_string(),
        V::Arr(a) | V::Set(a) => a.iter().map(as_text).collect::<Vec<_>>().join(","),
        other => panic!("unexpected LIST field value {other:?}"),
    }
}

/// `PROXY RATELIMIT LIST` as one `(field, text)` list per rule, checking the entry shape
/// (a map in RESP3, a flat array in RESP2).
fn list(c: &mut Conn) -> Vec<Vec<(String, String)>> {
    let r = c.cmd(&["PROXY", "RATELIMIT", "LIST"]);
    assert!(matches!(r, V::Arr(_)), "{:?}: PROXY RATELIMIT LIST is not an array: {r:?}", c.proto);
    r.items()
        .iter()
        .map(|e| {
            match c.proto {
                Proto::Resp3 => assert!(matches!(e, V::Map(_)), "RESP3 LIST entry is not a map: {e:?}"),
                Proto::Resp2 => assert!(matches!(e, V::Arr(_)), "RESP2 LIST entry is not a flat array: {e:?}"),
            }
            e.pairs().into_iter().map(|(k, v)| (k.text(), as_text(&v))).collect()
        })
        .collect()
}

fn field<'a>(entry: &'a [(String, String)], name: &str) -> &'a str {
    entry
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("LIST entry has no field {name:?}: {entry:?}"))
}

fn names(rules: &[Vec<(String, String)>]) -> Vec<String> {
    rules.iter().map(|e| field(e, "name").to_string()).collect()
}

// ---------------------------------------------------------------------------
// 1. rate and burst
// ---------------------------------------------------------------------------

#[test]
fn rate_and_burst_are_honoured() {
    let env = env();
    let _quiet = exclusive_traffic();
    let key = "rl:one:k";
    let master = env.owners.of_key(key.as_bytes());
    // the value is written directly on the master: no GET, nothing charged
    assert_eq!(cmd_text(master, &["SET", key, "v"]), "OK");
    let want = throttled(key, 100, "one");

    let mut c = Conn::connect(env.proxy.port());
    assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
    const BATCH: usize = 50;
    let batch: Vec<u8> = (0..BATCH).flat_map(|_| encode(&["GET", key])).collect();
    let before = cmdstat_calls(master, "get");

    let (mut ok, mut refused) = (0u64, 0u64);
    let start = Instant::now();
    let elapsed = loop {
        c.send_raw(&batch);
        for _ in 0..BATCH {
            match c.read_reply() {
                V::Str(s) => {
                    assert_eq!(s, b"v");
                    ok += 1;
                }
                V::Err(e) => {
                    assert_eq!(e, want, "refused reply");
                    refused += 1;
                }
                other => panic!("unexpected GET reply {other:?}"),
            }
        }
        let elapsed = start.elapsed();
        if elapsed >= Duration::from_secs(3) {
            break elapsed;
        }
    };
    let after = cmdstat_calls(master, "get");

    let secs = elapsed.as_secs_f64();
    let expected = 10.0 + 100.0 * secs;
    eprintln!(
        "rate 100 burst 10: {ok} admitted, {refused} refused in {secs:.3} s \
         (expected {expected:.1} admitted, {:.0} requests/s offered)",
        (ok + refused) as f64 / secs
    );
    assert!(refused > 0, "nothing was refused ({ok} admitted in {secs:.3} s)");
    assert!(
        (ok as f64 - expected).abs() <= expected * 0.05,
        "admitted {ok} in {secs:.3} s, expected {expected:.1} ± 5% (10 + 100 × t)"
    );
    assert_eq!(
        after - before,
        ok,
        "GETs that reached master {master} (cmdstat_get delta) differ from the admitted count"
    );
}

// ---------------------------------------------------------------------------
// 2. per-key vs shared
// ---------------------------------------------------------------------------

#[test]
fn per_key_vs_shared_scope() {
    let env = env();
    let _quiet = shared_traffic();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);

        // per-key: each key has its own 5
        let (x, y) = (format!("rl:pk:{t}:x"), format!("rl:pk:{t}:y"));
        let mut cmds: Vec<Vec<Vec<u8>>> = (0..6).map(|_| args(&["GET", x.as_str()])).collect();
        cmds.extend((0..6).map(|_| args(&["GET", y.as_str()])));
        let r = c.pipeline(&cmds);
        for (i, v) in r.iter().enumerate() {
            let key = if i < 6 { &x } else { &y };
            if i % 6 < 5 {
                assert!(admitted(v), "{proto:?} per-key: GET #{} of {key} refused: {v:?} (all: {r:?})", i % 6 + 1);
            } else {
                assert_eq!(v, &V::Err(throttled(key, 1, "perkey")), "{proto:?} per-key: 6th GET of {key}");
            }
        }

        // shared: both keys together get 5
        let shared = format!("shared-{t}");
        let (x, y) = (format!("rl:sh:{t}:x"), format!("rl:sh:{t}:y"));
        let cmds: Vec<Vec<Vec<u8>>> =
            (0..10).map(|i| args(&["GET", if i % 2 == 0 { x.as_str() } else { y.as_str() }])).collect();
        let r = c.pipeline(&cmds);
        let n_ok = r.iter().filter(|v| admitted(v)).count();
        assert_eq!(n_ok, 5, "{proto:?} shared: admitted {n_ok} of 10 GETs over two keys: {r:?}");
        assert!(r[..5].iter().all(admitted), "{proto:?} shared: the first 5 should pass: {r:?}");
        for (i, v) in r.iter().enumerate().skip(5) {
            let key = if i % 2 == 0 { &x } else { &y };
            assert_eq!(v, &V::Err(throttled(key, 1, &shared)), "{proto:?} shared: GET #{} ({key})", i + 1);
        }
    }
}

/// Pipelined requests are checked as a batch whose key hashes are computed once, ahead of
/// the checks: requests without a key in between must not shift which key each hash is
/// charged to.
#[test]
fn pipelined_batch_charges_the_right_keys() {
    let env = env();
    let _quiet = shared_traffic();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let (a, b) = (format!("rl:pk:{t}:batch:a"), format!("rl:pk:{t}:batch:b"));
        let (a, b) = (a.as_str(), b.as_str());
        let mut cmds = vec![args(&["PING"]), args(&["GET", a]), args(&["PING"])];
        cmds.extend((0..4).map(|_| args(&["GET", a])));
        cmds.push(args(&["ECHO", "x"]));
        cmds.extend((0..3).map(|_| args(&["GET", b])));
        cmds.push(args(&["GET", a]));
        let r = c.pipeline(&cmds);
        let seen: Vec<String> =
            r.iter().map(|v| if let Some(e) = v.err() { e.to_string() } else { "ok".into() }).collect();
        let mut want = vec!["ok".to_string(); cmds.len()];
        want[cmds.len() - 1] = throttled(a, 1, "perkey"); // a's 6th GET: its budget of 5 is spent
        assert_eq!(seen, want, "{proto:?}: replies {r:?}");
    }
}

// ---------------------------------------------------------------------------
// 3. command filter
// ---------------------------------------------------------------------------

#[test]
fn reads_only_rule_leaves_writes_alone() {
    let env = env();
    let _quiet = shared_traffic();
    for proto in Proto::BOTH {
        let key = format!("rl:ro:{}:k", proto.tag());
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let r = repeat(&mut c, 3, &["GET", &key]);
        assert!(admitted(&r[0]) && admitted(&r[1]), "{proto:?}: first two GETs: {r:?}");
        assert_eq!(r[2], V::Err(throttled(&key, 1, "readsonly")), "{proto:?}: third GET");
        // writes are not limited by a reads rule
        let sets: Vec<Vec<Vec<u8>>> = (0..20).map(|i| args(&["SET", key.as_str(), &format!("v{i}")])).collect();
        let r = c.pipeline(&sets);
        assert!(r.iter().all(V::is_ok), "{proto:?}: SETs under a reads-only rule: {r:?}");
        let r = repeat(&mut c, 5, &["INCR", &format!("{key}:ctr")]);
        assert!(r.iter().all(admitted), "{proto:?}: INCRs under a reads-only rule: {r:?}");
        let master = env.owners.of_key(key.as_bytes());
        assert_eq!(cmd_text(master, &["GET", &key]), "v19", "{proto:?}: the SETs reached Redis");
    }
}

// ---------------------------------------------------------------------------
// 4. rule order
// ---------------------------------------------------------------------------

#[test]
fn first_matching_rule_wins() {
    let env = env();
    let _quiet = shared_traffic();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        // LIST keeps the configuration's order
        assert_eq!(names(&list(&mut c)), RULE_NAMES, "{proto:?}: PROXY RATELIMIT LIST order");

        let hot = format!("rl:fm:hot-{t}");
        let r = repeat(&mut c, 2, &["GET", &hot]);
        assert!(admitted(&r[0]), "{proto:?}: first GET of {hot}: {r:?}");
        assert_eq!(r[1], V::Err(throttled(&hot, 1, "narrow")), "{proto:?}: second GET of {hot}");

        let cold = format!("rl:fm:cold-{t}");
        let r = repeat(&mut c, 50, &["GET", &cold]);
        let refused: Vec<(usize, &V)> = r.iter().enumerate().filter(|(_, v)| v.is_err()).collect();
        assert!(refused.is_empty(), "{proto:?}: {cold} (rule 'wide', burst 100) refused: {refused:?}");
    }
}

// ---------------------------------------------------------------------------
// 5. multi-key commands
// ---------------------------------------------------------------------------

#[test]
fn multi_key_refused_whole_and_charges_nothing() {
    let env = env();
    let _quiet = shared_traffic();
    let owners = &env.owners;
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect_proto(env.proxy.port(), proto);

        // MGET: a (over budget) on one master, b (untouched) on another
        let (ma, a) = owners.key_per_master(&format!("rl:mk:{t}:a"))[0].clone();
        let (mb, b) = owners.key_per_master(&format!("rl:mk:{t}:b"))[1].clone();
        assert_ne!(ma, mb);
        let mget_before = (cmdstat_calls(ma, "mget"), cmdstat_calls(mb, "mget"));
        let mut cmds: Vec<Vec<Vec<u8>>> = (0..3).map(|_| args(&["GET", a.as_str()])).collect();
        cmds.push(args(&["MGET", a.as_str(), b.as_str()]));
        let r = c.pipeline(&cmds);
        assert!(r[..3].iter().all(admitted), "{proto:?}: 3 GETs of {a}: {r:?}");
        assert_eq!(r[3], V::Err(throttled(&a, 1, "multikey")), "{proto:?}: MGET {a} {b}");
        assert_eq!(
            (cmdstat_calls(ma, "mget"), cmdstat_calls(mb, "mget")),
            mget_before,
            "{proto:?}: the refused MGET reached a master (cmdstat_mget on {ma}, on {mb})"
        );
        // b was not charged by the refused MGET: its full burst of 3 is left
        let r = repeat(&mut c, 4, &["GET", &b]);
        assert!(r[..3].iter().all(admitted), "{proto:?}: {b} lost budget to the refused MGET: {r:?}");
        assert_eq!(r[3], V::Err(throttled(&b, 1, "multikey")), "{proto:?}: 4th GET of {b}");

        // MSET and DEL: nothing written, nothing deleted, d not charged
        let (mc, key_c) = owners.key_per_master(&format!("rl:mk:{t}:c"))[0].clone();
        let (md, key_d) = owners.key_per_master(&format!("rl:mk:{t}:d"))[2].clone();
        assert_ne!(mc, md);
        assert_eq!(cmd_text(mc, &["SET", &key_c, "orig-c"]), "OK");
        assert_eq!(cmd_text(md, &["SET", &key_d, "orig-d"]), "OK");
        let mut cmds: Vec<Vec<Vec<u8>>> = (0..3).map(|_| args(&["GET", key_c.as_str()])).collect();
        cmds.push(args(&["MSET", key_c.as_str(), "new-c", key_d.as_str(), "new-d"]));
        cmds.push(args(&["DEL", key_d.as_str(), key_c.as_str()]));
        let r = c.pipeline(&cmds);
        assert_eq!(r[..3].to_vec(), vec![V::s("orig-c"); 3], "{proto:?}: 3 GETs of {key_c}");
        assert_eq!(r[3], V::Err(throttled(&key_c, 1, "multikey")), "{proto:?}: MSET {key_c} {key_d}");
        assert_eq!(r[4], V::Err(throttled(&key_c, 1, "multikey")), "{proto:?}: DEL {key_d} {key_c}");
        assert_eq!(cmd_text(mc, &["GET", &key_c]), "orig-c", "{proto:?}: refused MSET/DEL changed {key_c}");
        assert_eq!(cmd_text(md, &["GET", &key_d]), "orig-d", "{proto:?}: refused MSET/DEL changed {key_d}");
        let r = repeat(&mut c, 4, &["GET", &key_d]);
        assert_eq!(
            r[..3].to_vec(),
            vec![V::s("orig-d"); 3],
            "{proto:?}: {key_d} lost budget to the refused MSET/DEL: {r:?}"
        );
        assert_eq!(r[3], V::Err(throttled(&key_d, 1, "multikey")), "{proto:?}: 4th GET of {key_d}");
    }
}

// ---------------------------------------------------------------------------
// 6. runtime management and SIGHUP
// ---------------------------------------------------------------------------

/// Waits until the proxy log, beyond its first `from` bytes, satisfies `f`; returns the new
/// part.
fn wait_log(proxy: &Proxy, from: usize, what: &str, f: impl Fn(&str) -> bool) -> String {
    wait_until(Duration::from_secs(5), what, || f(proxy.log().get(from..).unwrap_or("")));
    proxy.log().get(from..).unwrap_or("").to_string()
}

#[test]
fn runtime_set_del_and_sighup_reload() {
    let env = env();
    let _quiet = shared_traffic();
    let (_dir, path) = config_file("[ratelimit]\nmax_tracked_keys = 100000\n");
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let mut c3 = Conn::connect_proto(proxy.port(), Proto::Resp3);
    let mut c2 = Conn::connect_proto(proxy.port(), Proto::Resp2);
    assert!(list(&mut c3).is_empty(), "no rules configured");
    assert!(list(&mut c2).is_empty(), "no rules configured");

    // SET with the defaults (per-key, all)
    assert_eq!(c3.cmd(&["PROXY", "RATELIMIT", "SET", "r1", "rl:rt:*", "1", "2"]), V::ok());
    let key = "rl:rt:k1";
    let r = repeat(&mut c3, 3, &["GET", key]);
    assert!(admitted(&r[0]) && admitted(&r[1]), "first two GETs under r1: {r:?}");
    assert_eq!(r[2], V::Err(throttled(key, 1, "r1")));
    for c in [&mut c3, &mut c2] {
        let rules = list(c);
        assert_eq!(names(&rules), ["r1"], "{:?}: {rules:?}", c.proto);
        let e = &rules[0];
        let want = [
            ("pattern", "rl:rt:*"),
            ("rate", "1"),
            ("burst", "2"),
            ("scope", "per-key"),
            ("allowed", "2"),
            ("throttled", "1"),
        ];
        for (f, v) in want {
            assert_eq!(field(e, f), v, "{:?}: LIST field {f} of {e:?}", c.proto);
        }
        assert!(field(e, "commands").eq_ignore_ascii_case("all"), "{:?}: LIST field commands of {e:?}", c.proto);
    }

    // a second rule with explicit scope and command list; replacing r1 keeps its place
    assert_eq!(c2.cmd(&["PROXY", "RATELIMIT", "SET", "r2", "rl:rt2:*", "5", "7", "shared", "GET,MGET"]), V::ok());
    assert_eq!(c2.cmd(&["PROXY", "RATELIMIT", "SET", "r1", "rl:rt:*", "1", "3"]), V::ok());
    let rules = list(&mut c3);
    assert_eq!(names(&rules), ["r1", "r2"], "{rules:?}");
    assert_eq!(field(&rules[0], "burst"), "3", "{rules:?}");
    assert_eq!(field(&rules[1], "scope"), "shared", "{rules:?}");
    assert_eq!(field(&rules[1], "rate"), "5", "{rules:?}");
    assert_eq!(field(&rules[1], "burst"), "7", "{rules:?}");
    assert_eq!(field(&rules[1], "commands").to_ascii_uppercase(), "GET,MGET", "{rules:?}");
    // the replaced r1 starts fresh: 3 more GETs of the throttled key pass
    let r = repeat(&mut c3, 4, &["GET", key]);
    assert!(r[..3].iter().all(admitted), "replaced r1 did not start fresh: {r:?}");
    assert_eq!(r[3], V::Err(throttled(key, 1, "r1")));
    // r2 only limits GET and MGET: SETs pass
    let r = repeat(&mut c3, 10, &["SET", "rl:rt2:w", "x"]);
    assert!(r.iter().all(V::is_ok), "SET under a GET,MGET rule: {r:?}");
    // an invalid rule is refused and changes nothing
    let r = c3.cmd(&["PROXY", "RATELIMIT", "SET", "bad", "rl:bad:*", "0", "5"]);
    assert!(r.is_err(), "SET with rate 0 accepted: {r:?}");
    assert_eq!(names(&list(&mut c3)), ["r1", "r2"]);

    // DEL
    assert_eq!(c3.cmd(&["PROXY", "RATELIMIT", "DEL", "r1"]), V::Int(1));
    assert_eq!(c2.cmd(&["PROXY", "RATELIMIT", "DEL", "r2"]), V::Int(1));
    let r = repeat(&mut c3, 50, &["GET", key]);
    assert!(r.iter().all(admitted), "GETs after DEL r1: {r:?}");
    assert_eq!(c3.cmd(&["PROXY", "RATELIMIT", "DEL", "r1"]), V::Int(0));
    assert_eq!(c2.cmd(&["PROXY", "RATELIMIT", "DEL", "r1"]), V::Int(0));
    assert!(list(&mut c3).is_empty());

    // SIGHUP reloads the file
    let good = "[ratelimit]\nmax_tracked_keys = 100000\n\n[[ratelimit.rules]]\nname = \"fromfile\"\n\
                pattern = \"rl:rt:*\"\ncommands = \"all\"\nrate = 1\nburst = 1\nscope = \"per-key\"\n";
    std::fs::write(&path, good).unwrap();
    proxy.signal("HUP");
    wait_until(Duration::from_secs(5), "SIGHUP to load rule 'fromfile'", || names(&list(&mut c3)) == ["fromfile"]);
    let k2 = "rl:rt:k2";
    let r = repeat(&mut c3, 2, &["GET", k2]);
    assert!(admitted(&r[0]), "{r:?}");
    assert_eq!(r[1], V::Err(throttled(k2, 1, "fromfile")));

    // a file that does not parse is rejected; the old rules stay
    let from = proxy.log().len();
    std::fs::write(&path, "[[ratelimit.rules]\nname = \"broken\nthis is not toml\n").unwrap();
    proxy.signal("HUP");
    let new = wait_log(&proxy, from, "a log line rejecting the unparsable file", |l| {
        let l = l.to_ascii_lowercase();
        ["reject", "invalid", "error", "fail"].iter().any(|w| l.contains(w))
    });
    eprintln!("log after the unparsable file:\n{new}");
    assert!(proxy.is_alive(), "the proxy died on SIGHUP with an unparsable file");
    assert_eq!(c3.cmd(&["PING"]), V::s("PONG"));
    assert_eq!(names(&list(&mut c3)), ["fromfile"]);
    let k3 = "rl:rt:k3";
    let r = repeat(&mut c3, 2, &["GET", k3]);
    assert!(admitted(&r[0]), "{r:?}");
    assert_eq!(r[1], V::Err(throttled(k3, 1, "fromfile")), "old rule no longer applied");

    // a file that parses but does not validate (rate = 0) is rejected too
    let from = proxy.log().len();
    std::fs::write(&path, good.replace("rate = 1", "rate = 0")).unwrap();
    proxy.signal("HUP");
    let new = wait_log(&proxy, from, "a log line naming ratelimit.rules", |l| l.contains("ratelimit.rules"));
    eprintln!("log after the rate = 0 file:\n{new}");
    assert!(proxy.is_alive(), "the proxy died on SIGHUP with an invalid rule");
    assert_eq!(c2.cmd(&["PING"]), V::s("PONG"));
    let rules = list(&mut c2);
    assert_eq!(names(&rules), ["fromfile"]);
    assert_eq!(field(&rules[0], "rate"), "1", "the rejected rate = 0 was applied: {rules:?}");
    let k4 = "rl:rt:k4";
    let r = repeat(&mut c2, 2, &["GET", k4]);
    assert!(admitted(&r[0]), "{r:?}");
    assert_eq!(r[1], V::Err(throttled(k4, 1, "fromfile")), "old rule no longer applied");
}

// ---------------------------------------------------------------------------
// 7. invalid rules at start-up
// ---------------------------------------------------------------------------

fn rule(name: &str, rate: &str, scope: &str) -> String {
    format!(
        "[[ratelimit.rules]]\nname = \"{name}\"\npattern = \"rl:{name}:*\"\ncommands = \"all\"\n\
         rate = {rate}\nburst = 5\nscope = \"{scope}\"\n\n"
    )
}

#[test]
fn invalid_rules_are_rejected_at_start() {
    // a valid file with rules passes --check (so a rejection below is about the rule)
    let valid =
        format!("[ratelimit]\nmax_tracked_keys = 1000\n\n{}{}", rule("a", "10", "per-key"), rule("b", "1", "shared"));
    let (_d, path) = config_file(&valid);
    let (code, stdout, stderr) = common::run_bin(&["--config", &path, "--cluster", "127.0.0.1:7000", "--check"]);
    assert_eq!(code, 0, "a valid ratelimit configuration was rejected: {stderr}");
    assert!(stdout.contains("configuration ok"), "{stdout}");

    let listen = format!("127.0.0.1:{}", free_port());
    let cases: Vec<(&str, String, &[&str])> = vec![
        ("rate = 0", rule("zero", "0", "per-key"), &["ratelimit.rules", "rate"]),
        ("unknown scope", rule("odd", "10", "sideways"), &["ratelimit.rules", "scope"]),
        (
            "duplicate name",
            format!("{}{}", rule("twice", "10", "per-key"), rule("twice", "20", "shared")),
            &["ratelimit.rules", "twice"],
        ),
    ];
    for (what, toml, words) in &cases {
        let (_dir, path) = config_file(toml);
        for check in [true, false] {
            let mut a = vec!["--config", path.as_str(), "--listen", listen.as_str(), "--cluster", "127.0.0.1:7000"];
            if check {
                a.push("--check");
            }
            let (code, stdout, stderr) = common::run_bin(&a);
            assert_ne!(code, 0, "{what} (check={check}) was accepted; stdout {stdout:?} stderr {stderr:?}");
            for w in *words {
                assert!(stderr.contains(w), "{what} (check={check}): stderr does not name {w:?}:\n{stderr}");
            }
            assert!(!stdout.contains("configuration ok"), "{what}: {stdout}");
        }
    }
}
