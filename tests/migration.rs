//! Moving the data to another cluster (docs/migration.md): `heatshield migrate verify`
//! between a Redis 7.0 cluster of 3 masters (the source) and a Valkey 9.1 cluster of 4
//! (the target), both filled through a heatshield of their own.
//!
//! - Equal data of every type (a 20,000-field hash, a 2,500-element list and stream,
//!   sorted-set scores that the two servers print differently, keys with times to live
//!   set a moment apart) verify as equal.
//! - Each kind of difference is found and reported with its key: a missing key, an extra
//!   one, another type, another value in a later piece of a list, a hash and a sorted set,
//!   another time to live.
//! - Keys that reach the target only while the check runs settle on a recheck and are not
//!   reported.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V, cmd_text};
use common::redis::{redis_server_bin, valkey_server_required};
use common::{Proxy, RedisCluster, config_file};

struct Env {
    source: RedisCluster,
    target: RedisCluster,
    src: Proxy,
    dst: Proxy,
}

fn start() -> Env {
    let source = RedisCluster::start_shaped(&redis_server_bin(), 3, 0, &[]);
    let target = RedisCluster::start_shaped(&valkey_server_required(), 4, 0, &[]);
    let src = Proxy::start_cluster(&source, &["--metrics", "off"]);
    let dst = Proxy::start_cluster(&target, &["--metrics", "off"]);
    Env { source, target, src, dst }
}

/// Sends `cmds` pipelined and checks none was refused.
fn pipe(c: &mut Conn, cmds: &[Vec<String>]) {
    for a in cmds {
        c.send(a);
    }
    for a in cmds {
        let r = c.read_reply();
        assert!(!r.is_err(), "{a:?}: {r:?}");
    }
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// The same data of every type, written to a side through its heatshield.
fn fill(port: u16) {
    let mut c = Conn::connect(port);
    let strings: Vec<Vec<String>> = (0..2000).map(|i| args(&["SET", &format!("s:{i}"), &format!("v{i}")])).collect();
    pipe(&mut c, &strings);
    let ttls: Vec<Vec<String>> =
        (0..200).map(|i| args(&["SET", &format!("t:{i}"), "x", "EX", &(100 + i).to_string()])).collect();
    pipe(&mut c, &ttls);
    let list: Vec<String> = (0..2500).map(|i| format!("e{i}")).collect();
    let mut cmd = args(&["RPUSH", "l:1"]);
    cmd.extend(list);
    pipe(&mut c, &[cmd]);
    let hash: Vec<Vec<String>> = (0..20)
        .map(|b| {
            let mut cmd = args(&["HSET", "h:big"]);
            for f in b * 1000..(b + 1) * 1000 {
                cmd.extend([format!("f{f}"), format!("value-{f}")]);
            }
            cmd
        })
        .collect();
    pipe(&mut c, &hash);
    let mut cmd = args(&["SADD", "set:1"]);
    cmd.extend((0..1500).map(|i| format!("m{i}")));
    pipe(&mut c, &[cmd]);
    let mut cmd = args(&["ZADD", "z:1"]);
    for i in 0..1200 {
        // 0.1 is printed 0.10000000000000001 by Redis 7.0 and 0.1 by Valkey
        cmd.extend([format!("{}", i as f64 * 0.1), format!("m{i}")]);
    }
    pipe(&mut c, &[cmd]);
    let stream: Vec<Vec<String>> =
        (1..=2500).map(|i| args(&["XADD", "x:1", &format!("{i}-1"), "n", &i.to_string()])).collect();
    pipe(&mut c, &stream);
}

/// `heatshield migrate verify` from source to target: (exit code, what it printed).
fn verify(env: &Env, extra_conf: &str, first: &str) -> (i32, String) {
    let text = format!("[migration]\ntarget = [\"{}\"]\n{extra_conf}", env.target.nodes()[0].addr());
    let (_dir, conf) = config_file(&text);
    let seeds = env.source.seeds();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_heatshield"))
        .args(["--config", &conf, "--cluster", &seeds, "migrate", "verify", "--first", first])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn verify_finds_equal_data_equal_and_every_kind_of_difference_by_key() {
    let env = start();
    fill(env.src.port());
    // a moment later on the target: the times to live differ by that moment, within 1 s
    thread::sleep(Duration::from_millis(150));
    fill(env.dst.port());

    let (code, out) = verify(&env, "", "20");
    assert_eq!(code, 0, "{out}");
    // 2,000 strings, 200 with a time to live, a list, a hash, a set, a sorted set, a stream
    assert!(out.contains("verify: 2205 source keys compared (2205 equal"), "{out}");
    assert!(out.contains("2205 target keys looked at"), "{out}");
    assert!(out.contains(": 0 differences"), "{out}");

    // one difference of each kind, made on the target
    let mut t = Conn::connect(env.dst.port());
    for c in [
        args(&["DEL", "s:5"]),
        args(&["SET", "extra:1", "x"]),
        args(&["DEL", "s:7"]),
        args(&["LPUSH", "s:7", "x"]),
        args(&["EXPIRE", "s:6", "500"]),
        args(&["LSET", "l:1", "2400", "changed"]),
        args(&["HSET", "h:big", "f19999", "changed"]),
        args(&["ZADD", "z:1", "7", "m3"]),
        args(&["SREM", "set:1", "m1499"]),
        args(&["SADD", "set:1", "other"]),
    ] {
        assert!(!t.cmd(&c).is_err(), "{c:?}");
    }
    let (code, out) = verify(&env, "verify_recheck_delay_ms = 50\n", "20");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(": 8 differences"), "{out}");
    assert!(out.contains("by kind: missing 1, extra 1, type 1, value 4, ttl 1, unreadable 0"), "{out}");
    for line in [
        "difference: missing \"s:5\"",
        "difference: extra \"extra:1\"",
        "difference: type \"s:7\"",
        "string on the source, list on the target",
        "difference: ttl \"s:6\"",
        // (500 s set a moment ago: 499, or less on a machine slow enough)
        "no expiry on the source, 49",
        "difference: value \"l:1\"",
        "elements 2000 to 2999 differs",
        "difference: value \"h:big\"",
        "field \"f19999\" differs",
        "difference: value \"z:1\"",
        "member's score \"m3\" differs",
        "difference: value \"set:1\"",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
    // the list of keys is cut at --first, the counts are not
    let (code, out) = verify(&env, "verify_recheck_delay_ms = 50\n", "2");
    assert_eq!(code, 1);
    assert_eq!(out.lines().filter(|l| l.starts_with("difference: ")).count(), 2, "{out}");
    assert!(out.contains(": 8 differences"), "{out}");
}

#[test]
fn keys_that_reach_the_target_during_the_check_settle_and_are_not_reported() {
    let env = start();
    fill(env.src.port());
    fill(env.dst.port());
    let mut s = Conn::connect(env.src.port());
    for i in 0..50 {
        assert!(s.cmd(&["SET", &format!("late:{i}"), "v"]).is_ok());
    }
    // Once the check has compared every source key (it then asks the source whether the
    // target's keys exist: its connections' last command is EXISTS), the late keys are
    // written to the target: they were missing at the first comparison, and are equal at
    // the recheck.
    let masters = env.source.masters();
    let dst = env.dst.port();
    let writer = thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            let listing: String = masters.iter().map(|&m| cmd_text(m, &["CLIENT", "LIST"])).collect();
            if listing.lines().any(|l| l.contains("name=heatshield-verify") && l.contains("cmd=exists")) {
                let mut t = Conn::connect(dst);
                for i in 0..50 {
                    assert!(t.cmd(&["SET", &format!("late:{i}"), "v"]).is_ok());
                }
                return true;
            }
            thread::sleep(Duration::from_millis(5));
        }
        false
    });
    let (code, out) = verify(&env, "verify_recheck_delay_ms = 1500\n", "20");
    assert!(writer.join().unwrap(), "the check never reached the target's keys:\n{out}");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("(2205 equal, 50 settled on a recheck"), "{out}");
    assert!(out.contains(": 0 differences"), "{out}");
}

/// `heatshield migrate backfill` with `args`, run to its end: (exit code, what it printed).
fn backfill(env: &Env, args: &[&str]) -> (i32, String) {
    let (_dir, conf) = target_conf(env);
    let seeds = env.source.seeds();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_heatshield"))
        .args(["--config", &conf, "--cluster", &seeds, "migrate", "backfill"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn target_conf(env: &Env) -> (tempfile::TempDir, String) {
    config_file(&format!("[migration]\ntarget = [\"{}\"]\n", env.target.nodes()[0].addr()))
}

/// A field of the backfill's progress, read on the target master that holds it.
fn progress(env: &Env, field: &str) -> i64 {
    let key = "{heatshield:migration}backfill";
    let port = env.target.master_for_key(key.as_bytes());
    cmd_text(port, &["HGET", key, field]).trim().parse().unwrap_or(0)
}

#[test]
fn backfill_copies_every_key_resumes_after_a_sigkill_and_never_replaces_a_newer_copy() {
    let env = start();
    fill(env.src.port());

    // a paced run, killed once it has copied 600 keys
    let (_dir, conf) = target_conf(&env);
    let seeds = env.source.seeds();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_heatshield"))
        .args(["--config", &conf, "--cluster", &seeds, "migrate", "backfill", "--rate", "1000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while progress(&env, "keys") < 600 {
        assert!(Instant::now() < until, "the paced backfill never reached 600 keys");
        thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = progress(&env, "keys");
    assert!(before < 2205, "the run was to be killed midway, and copied {before} keys");

    // the next run resumes: it looks at the keys left (and at most a batch again)
    let (code, out) = backfill(&env, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("backfill: complete"), "{out}");
    let again: i64 = out.split(" keys looked at").next().and_then(|s| s.rsplit(' ').next()).unwrap().parse().unwrap();
    assert!(again <= 2205 - before + 500, "resumed, it looked at {again} keys after {before}:\n{out}");
    assert!(!out.contains("this run resumed 0 of"), "{out}");
    assert!(out.contains(" 0 failed"), "{out}");
    let (code, out) = verify(&env, "", "20");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("(2205 equal"), "{out}");

    // A copy never replaces a newer one: the target's copy of s:1 is made to look newer
    // than any the source's clock can give, and the source's s:1 changes.
    let s1 = env.target.master_for_key(b"s:1");
    let vkey = format!("{{{}}}v", heatshield::services::migration::slot_tag(RedisCluster::slot(b"s:1")));
    assert_eq!(cmd_text(s1, &["HSET", &vkey, "s:1", "9000000000000000"]).trim(), "0");
    assert!(Conn::connect(env.src.port()).cmd(&["SET", "s:1", "changed"]).is_ok());
    // a run from the start copies everything again (newer versions), the 20,000-field
    // hash in pieces, and keeps the target's s:1
    let (code, out) = backfill(&env, &["--restart"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("2205 keys looked at"), "{out}");
    assert!(out.contains("2204 copied, 1 kept"), "{out}");
    assert!(out.contains("1 big keys in pieces"), "{out}");
    assert_eq!(cmd_text(s1, &["GET", "s:1"]).trim(), "v1");
    let (code, out) = verify(&env, "verify_recheck_delay_ms = 50\n", "20");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("difference: value \"s:1\""), "{out}");
    assert!(out.contains(": 1 differences"), "{out}");
}

/// `PROXY MIGRATION STATUS` as a map.
fn status(c: &mut Conn) -> std::collections::HashMap<String, String> {
    c.cmd(&["PROXY", "MIGRATION", "STATUS"]).pairs().into_iter().map(|(k, v)| (k.text(), v.text())).collect()
}

/// `PROXY MIGRATION STATUS` once the backfill or verify run inside heatshield ended.
fn job_end(c: &mut Conn) -> std::collections::HashMap<String, String> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(c);
        if s["job_state"] != "running" {
            return s;
        }
        assert!(Instant::now() < until, "the run never ended: {s:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn dual_write_copies_every_paths_writes_and_with_a_backfill_beside_the_target_ends_equal() {
    let env = start();
    fill(env.src.port());
    let (_dir, conf) = config_file(&format!(
        "[migration]\ntarget = [\"{}\"]\n[transactions]\ncross_slot = \"per-node\"\n",
        env.target.nodes()[0].addr()
    ));
    let mig = Proxy::start_cluster(&env.source, &["--config", &conf]);
    // a second heatshield with the same target follows the switch made at the first
    let mig2 = Proxy::start_cluster(&env.source, &["--config", &conf, "--metrics", "off"]);
    let mut admin = Conn::connect(mig.port());
    let mut admin2 = Conn::connect(mig2.port());
    assert_eq!(status(&mut admin)["phase"], "off");
    // off: nothing is noted
    assert!(admin.cmd(&["SET", "before:1", "x"]).is_ok());
    assert_eq!(status(&mut admin)["dual_write_noted"], "0");
    assert!(admin.cmd(&["PROXY", "MIGRATION", "DUAL-WRITE"]).is_ok());
    assert_eq!(status(&mut admin)["phase"], "dual-write");
    common::wait_until(Duration::from_secs(3), "the second heatshield to follow", || {
        status(&mut admin2)["phase"] == "dual-write"
    });

    // every path's writes, from several clients (the last one's through the second
    // heatshield), for two seconds; the backfill runs beside
    let ports = [mig.port(), mig.port(), mig2.port()];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for (t, port) in ports.into_iter().enumerate() {
        let stop = stop.clone();
        load.push(thread::spawn(move || {
            let mut c = Conn::connect(port);
            let mut acked = std::collections::HashMap::<String, i64>::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                // single command
                let k = format!("cnt:{t}:{}", i % 20);
                assert!(!c.cmd(&["INCR", &k]).is_err());
                *acked.entry(k).or_default() += 1;
                // pipeline
                for j in 0..5 {
                    c.send(&["RPUSH", &format!("lst:{t}:{}", (i + j) % 7), "x"]);
                }
                for _ in 0..5 {
                    assert!(!c.read_reply().is_err());
                }
                // split across slots
                assert!(
                    c.cmd(&["MSET", &format!("ms:{t}:a"), &i.to_string(), &format!("ms:{t}:b"), &i.to_string()])
                        .is_ok()
                );
                // transaction (one slot) and WATCH
                c.cmd(&["WATCH", &format!("{{tx{t}}}w")]);
                c.cmd(&["MULTI"]);
                c.cmd(&["HSET", &format!("{{tx{t}}}h"), &format!("f{}", i % 50), &i.to_string()]);
                c.cmd(&["INCR", &format!("{{tx{t}}}c")]);
                c.cmd(&["SET", &format!("{{tx{t}}}w"), &i.to_string()]);
                assert!(!c.cmd(&["EXEC"]).is_err());
                // a script's declared key
                let r = c.cmd(&["EVAL", "return redis.call('INCRBY', KEYS[1], 2)", "1", &format!("sc:{t}")]);
                assert!(!r.is_err(), "{r:?}");
                // blocking: an element moved
                c.cmd(&["RPUSH", &format!("{{q{t}}}src"), &i.to_string()]);
                let r = c.cmd(&["BLMOVE", &format!("{{q{t}}}src"), &format!("{{q{t}}}dst"), "LEFT", "RIGHT", "1"]);
                assert!(!r.is_err(), "{r:?}");
                // a time to live, and a key deleted again
                c.cmd(&["SET", &format!("ttl:{t}:{}", i % 10), "v", "EX", "100"]);
                c.cmd(&["SET", &format!("gone:{t}"), "v"]);
                c.cmd(&["DEL", &format!("gone:{t}")]);
                // a lock taken and released
                let r = c.cmd(&["LOCK.ACQUIRE", &format!("lk:{t}"), "me", "5000"]);
                assert!(!r.is_err(), "{r:?}");
                c.cmd(&["LOCK.RELEASE", &format!("lk:{t}"), "me"]);
            }
            acked
        }));
    }
    // the backfill, run inside heatshield this time, beside the load
    thread::sleep(Duration::from_millis(300));
    let r = admin.cmd(&["PROXY", "MIGRATION", "BACKFILL"]);
    assert!(r.is_ok(), "{r:?}");
    let err = admin.cmd(&["PROXY", "MIGRATION", "VERIFY"]);
    assert!(
        err == V::Err("ERR a backfill is running (PROXY MIGRATION STATUS)".into())
            || status(&mut admin)["job_state"] == "done",
        "{err:?}"
    );
    let s = job_end(&mut admin);
    assert_eq!(s["job"], "backfill");
    assert_eq!(s["job_state"], "done", "{s:?}");
    assert!(s["job_result"].starts_with("backfill: complete"), "{s:?}");
    assert!(s["job_keys_done"].parse::<u64>().unwrap() >= 2205, "{s:?}");
    thread::sleep(Duration::from_millis(1000));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked: Vec<_> = load.into_iter().map(|h| h.join().unwrap()).collect();
    // the copies land
    let until = Instant::now() + Duration::from_secs(20);
    for a in [&mut admin, &mut admin2] {
        loop {
            let s = status(a);
            if s["dual_write_pending"] == "0" {
                assert_eq!(s["dual_write_failed"], "0", "{s:?}");
                assert!(s["dual_write_applied"].parse::<u64>().unwrap() > 100, "{s:?}");
                break;
            }
            assert!(Instant::now() < until, "copies still pending: {s:?}");
            thread::sleep(Duration::from_millis(50));
        }
    }
    // the two clusters hold the same data (verify inside heatshield, then from the
    // command line), and every acknowledged INCR is on the target
    assert!(admin.cmd(&["PROXY", "MIGRATION", "VERIFY"]).is_ok());
    let s = job_end(&mut admin);
    assert_eq!((s["job"].as_str(), s["job_state"].as_str()), ("verify", "done"), "{s:?}");
    assert!(s["job_result"].contains(": 0 differences"), "{s:?}");
    let (code, out) = verify(&env, "", "20");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": 0 differences"), "{out}");
    let mut dst = Conn::connect(env.dst.port());
    let mut total = 0;
    for a in &acked {
        for (k, n) in a {
            assert_eq!(dst.cmd(&["GET", k]).text(), n.to_string(), "{k}");
            total += n;
        }
    }
    assert!(total > 50, "the load ran: {total} INCRs");
    assert!(dst.cmd(&["EXISTS", "gone:0"]).int() == 0);
    // and the metrics say so (sampled every second)
    let addr = mig.metrics_addr().unwrap();
    common::wait_until(Duration::from_secs(5), "the migration's metrics", || {
        let (_, body) = common::http_get(&addr, "/metrics");
        let v = |series: &str| {
            body.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        v("heatshield_migration_dual_write ") == Some(1.0)
            && v("heatshield_migration_pending_keys ") == Some(0.0)
            && v("heatshield_migration_copies_total{outcome=\"applied\"}").is_some_and(|n| n > 100.0)
            && v("heatshield_migration_job_keys_done ").is_some_and(|n| n >= 2205.0)
    });
    // off again, at the second heatshield this time: the first follows, and writes are
    // no longer noted
    assert!(admin2.cmd(&["PROXY", "MIGRATION", "OFF"]).is_ok());
    common::wait_until(Duration::from_secs(3), "the first heatshield to follow", || {
        status(&mut admin)["phase"] == "off"
    });
    let noted = status(&mut admin)["dual_write_noted"].clone();
    assert!(admin.cmd(&["SET", "after:1", "x"]).is_ok());
    assert_eq!(status(&mut admin)["dual_write_noted"], noted);
}

/// `PROXY MIGRATION STATUS` once the cutover or rollback asked ended.
fn switched(c: &mut Conn, serving: &str) -> std::collections::HashMap<String, String> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status(c);
        if s["switch_result"] != "running" && !s["switch_result"].is_empty() {
            assert_eq!(s["serving"], serving, "{s:?}");
            return s;
        }
        assert!(Instant::now() < until, "the change never ended: {s:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cutover_and_rollback_under_load_of_two_instances_lose_no_acknowledged_write() {
    let env = start();
    fill(env.src.port());
    // and a hash of 200,000 fields
    let mut c = Conn::connect(env.src.port());
    let huge: Vec<Vec<String>> = (0..200)
        .map(|b| {
            let mut cmd = args(&["HSET", "h:huge"]);
            for f in b * 1000..(b + 1) * 1000 {
                cmd.extend([format!("f{f}"), f.to_string()]);
            }
            cmd
        })
        .collect();
    pipe(&mut c, &huge);
    // (no [fleet]: the instances with a target know of each other through the source)
    let (_dir, conf) = config_file(&format!("[migration]\ntarget = [\"{}\"]\n", env.target.nodes()[0].addr()));
    let mut a = Proxy::start_cluster(&env.source, &["--config", &conf, "--metrics", "off"]);
    let b = Proxy::start_cluster(&env.source, &["--config", &conf, "--metrics", "off"]);
    let mut admin = Conn::connect(a.port());
    let mut admin_b = Conn::connect(b.port());
    common::wait_until(Duration::from_secs(5), "both instances known", || status(&mut admin)["instances"] == "2");

    // shadow: requests asked of the (empty) target too, compared, never returned
    assert!(admin.cmd(&["PROXY", "MIGRATION", "SHADOW"]).is_ok());
    common::wait_until(Duration::from_secs(3), "the second heatshield to shadow", || {
        status(&mut admin_b)["phase"] == "shadow"
    });
    for i in 0..50 {
        assert_eq!(admin_b.cmd(&["GET", &format!("s:{i}")]).text(), format!("v{i}"));
    }
    common::wait_until(Duration::from_secs(3), "the shadow to compare", || {
        let s = status(&mut admin_b);
        s["shadow_pending"] == "0" && s["shadow_differed"] == "50"
    });
    // a cutover before dual-write is refused
    let r = admin.cmd(&["PROXY", "MIGRATION", "CUTOVER"]);
    assert!(r.is_err(), "{r:?}");
    assert!(admin.cmd(&["PROXY", "MIGRATION", "DUAL-WRITE"]).is_ok());
    common::wait_until(Duration::from_secs(3), "the second heatshield to follow", || {
        status(&mut admin_b)["phase"] == "dual-write"
    });

    // the backfill, paced, and the instance running it SIGKILLed midway: one started
    // again resumes it from the progress kept in the target
    assert!(admin.cmd(&["PROXY", "MIGRATION", "BACKFILL", "RATE", "1000"]).is_ok());
    common::wait_until(Duration::from_secs(20), "the backfill to be midway", || {
        status(&mut admin)["job_keys_done"].parse::<u64>().unwrap() >= 600
    });
    a.kill();
    a = Proxy::start_cluster(&env.source, &["--config", &conf, "--metrics", "off"]);
    admin = Conn::connect(a.port());
    assert_eq!(status(&mut admin)["phase"], "dual-write", "started again, it follows the phase");
    assert!(admin.cmd(&["PROXY", "MIGRATION", "BACKFILL"]).is_ok());
    let s = job_end(&mut admin);
    assert_eq!(s["job_state"], "done", "{s:?}");
    let looked: u64 =
        s["job_result"].split(" keys looked at").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(looked < 2206, "it resumed, and looked at {looked} keys: {s:?}");
    assert_eq!(s["job_slots_done"], "16384", "{s:?}");
    // verify: the target holds what the source holds
    assert!(admin.cmd(&["PROXY", "MIGRATION", "VERIFY"]).is_ok());
    let s = job_end(&mut admin);
    assert!(s["job_result"].contains(": 0 differences"), "{s:?}");
    common::wait_until(Duration::from_secs(5), "the killed instance forgotten", || {
        status(&mut admin)["instances"] == "2"
    });

    // clients of both instances: counters, appends, keys with a time to live, a consumer
    // blocked in BLPOP; each remembers what was acknowledged
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for (t, port) in [a.port(), b.port(), a.port(), b.port()].into_iter().enumerate() {
        let stop = stop.clone();
        load.push(thread::spawn(move || {
            let mut c = Conn::connect(port);
            let (mut incrs, mut appends, mut errors) = (0i64, 0i64, Vec::new());
            let (mut piped, mut txs, mut evals, mut watched, mut aborted) = (0i64, 0i64, 0i64, 0i64, 0i64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // a pipeline
                for j in 0..3 {
                    c.send(&["RPUSH", &format!("plog:{t}"), &(piped + j).to_string()]);
                }
                for _ in 0..3 {
                    match c.read_reply() {
                        V::Int(n) if n == piped + 1 => piped = n,
                        r => errors.push(format!("pipelined RPUSH after {piped}: {r:?}")),
                    }
                }
                // a transaction, and one under WATCH (voided by a change: EXEC nil)
                c.cmd(&["MULTI"]);
                c.cmd(&["INCR", &format!("{{tx:{t}}}c")]);
                c.cmd(&["HSET", &format!("{{tx:{t}}}h"), &format!("f{}", txs % 10), &txs.to_string()]);
                match c.cmd(&["EXEC"]) {
                    V::Arr(v) if v.first() == Some(&V::Int(txs + 1)) => txs += 1,
                    r => errors.push(format!("EXEC after {txs}: {r:?}")),
                }
                c.cmd(&["WATCH", &format!("{{w:{t}}}k")]);
                c.cmd(&["MULTI"]);
                c.cmd(&["SET", &format!("{{w:{t}}}k"), &(watched + 1).to_string()]);
                match c.cmd(&["EXEC"]) {
                    V::Arr(_) => watched += 1,
                    V::Nil => aborted += 1,
                    r => errors.push(format!("EXEC under WATCH: {r:?}")),
                }
                // a command split across slots, and a lock taken and given back
                let (ka, kb) = (format!("ms:{t}:a"), format!("ms:{t}:b"));
                if !c.cmd(&["MSET", &ka, &evals.to_string(), &kb, &evals.to_string()]).is_ok() {
                    errors.push("MSET".into());
                }
                match c.cmd(&["LOCK.ACQUIRE", &format!("lk:{t}"), "me", "5000"]) {
                    V::Err(e) => errors.push(format!("LOCK.ACQUIRE: {e}")),
                    _ => {
                        if c.cmd(&["LOCK.RELEASE", &format!("lk:{t}"), "me"]).is_err() {
                            errors.push("LOCK.RELEASE".into());
                        }
                    }
                }
                // a script
                match c.cmd(&["EVAL", "return redis.call('INCRBY', KEYS[1], 2)", "1", &format!("sc:{t}")]) {
                    V::Int(n) if n == 2 * (evals + 1) => evals += 1,
                    r => errors.push(format!("EVAL after {evals}: {r:?}")),
                }
                match c.cmd(&["INCR", &format!("cnt:{t}")]) {
                    V::Int(n) if n == incrs + 1 => incrs = n,
                    r => errors.push(format!("INCR after {incrs}: {r:?}")),
                }
                match c.cmd(&["RPUSH", &format!("log:{t}"), &appends.to_string()]) {
                    V::Int(n) if n == appends + 1 => appends = n,
                    r => errors.push(format!("RPUSH after {appends}: {r:?}")),
                }
                if !c.cmd(&["SET", &format!("ttl:{t}"), &incrs.to_string(), "EX", "300"]).is_ok() {
                    errors.push("SET EX".into());
                }
                // read your writes, whichever cluster serves
                let r = c.cmd(&["GET", &format!("cnt:{t}")]);
                if r.text() != incrs.to_string() {
                    errors.push(format!("GET cnt:{t} {r:?} after {incrs}"));
                }
            }
            (incrs, appends, errors, [piped, txs, evals, watched, aborted])
        }));
    }
    let consumer = {
        let port = a.port();
        thread::spawn(move || {
            let mut c = Conn::connect(port);
            let (mut got, mut nils) = (Vec::new(), 0);
            let until = Instant::now() + Duration::from_secs(8);
            while Instant::now() < until {
                match c.cmd(&["BLPOP", "jobs", "1"]) {
                    V::Arr(v) => got.push(v[1].text()),
                    V::Nil => nils += 1,
                    r => panic!("BLPOP: {r:?}"),
                }
            }
            (got, nils)
        })
    };
    // a subscriber (through the first instance), told by the second
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let subscriber = {
        let mut c = Conn::connect(a.port());
        assert_eq!(
            c.cmd(&["SUBSCRIBE", "news"]),
            V::Arr(vec![V::Str(b"subscribe".to_vec()), V::Str(b"news".to_vec()), V::Int(1)])
        );
        let heard = heard.clone();
        thread::spawn(move || {
            c.stream().set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            loop {
                match c.read_reply() {
                    V::Arr(m) if m.len() == 3 => {
                        let text = m[2].text();
                        heard.lock().unwrap().push(text.clone());
                        if text.starts_with("stop") {
                            return;
                        }
                    }
                    r => panic!("subscriber: {r:?}"),
                }
            }
        })
    };
    let mut publisher = Conn::connect(b.port());
    // (PUBLISH's count is of the node it reached only: the message reaches the others by
    // the cluster's bus, so what the subscriber heard is what is checked.) Pub/sub is at
    // most once, as on Redis: while a subscription moves to the other cluster, a message
    // may be missed, so each is published again, numbered, until it is heard.
    let mut publish = |what: &str| {
        let until = Instant::now() + Duration::from_secs(10);
        for n in 0.. {
            let m = format!("{what} #{n}");
            assert!(matches!(publisher.cmd(&["PUBLISH", "news", &m]), V::Int(_)), "{m}");
            thread::sleep(Duration::from_millis(100));
            if heard.lock().unwrap().iter().any(|h| h.starts_with(what)) {
                return n;
            }
            assert!(Instant::now() < until, "the subscriber never heard {what:?}: {:?}", heard.lock().unwrap());
        }
        unreachable!()
    };
    let mut republished: Vec<(&str, i32)> = Vec::new();
    republished.push(("before", publish("before")));
    let mut producer = Conn::connect(b.port());
    let mut pushed = 0;
    let mut push = |n: usize| {
        for _ in 0..n {
            assert!(producer.cmd(&["RPUSH", "jobs", &pushed.to_string()]).int() > 0);
            pushed += 1;
        }
    };
    thread::sleep(Duration::from_millis(500));
    push(10);

    // cut over: both instances serve the target, and their writes are copied back
    assert!(admin.cmd(&["PROXY", "MIGRATION", "CUTOVER"]).is_ok());
    let s = switched(&mut admin, "target");
    assert!(s["switch_result"].starts_with("cutover done"), "{s:?}");
    let mut changes = vec![s["switch_result"].clone()];
    common::wait_until(Duration::from_secs(3), "the second heatshield to serve the target", || {
        status(&mut admin_b)["serving"] == "target"
    });
    assert_eq!(status(&mut admin)["phase"], "cutover");
    push(10);
    thread::sleep(Duration::from_millis(500));
    republished.push(("after cutover", publish("after cutover")));
    // a big hash changed: copied back to Redis 7.0 by value, in pieces
    let r = admin.cmd(&["HSET", "h:big", "f0", "changed"]);
    assert_eq!(r, V::Int(0), "{r:?}");
    thread::sleep(Duration::from_millis(700));
    // written through heatshield now: on the target, and copied back to the source
    assert!(admin.cmd(&["SET", "after-cutover", "1"]).is_ok());
    let t = env.target.master_for_key(b"after-cutover");
    assert_eq!(cmd_text(t, &["GET", "after-cutover"]).trim(), "1");
    common::wait_until(Duration::from_secs(3), "the write copied back to the source", || {
        cmd_text(env.source.master_for_key(b"after-cutover"), &["GET", "after-cutover"]).trim() == "1"
    });
    // dual-write cannot be turned off while the target serves
    assert!(admin.cmd(&["PROXY", "MIGRATION", "OFF"]).is_err());

    // roll back, from the second instance this time
    assert!(admin_b.cmd(&["PROXY", "MIGRATION", "ROLLBACK"]).is_ok());
    let s = switched(&mut admin_b, "source");
    assert!(s["switch_result"].starts_with("rollback done"), "{s:?}");
    changes.push(s["switch_result"].clone());
    let ms: u64 = s["switch_result"].split(" in ").nth(1).unwrap().trim_end_matches(" ms").parse().unwrap();
    assert!(ms < 1000, "a rollback of {ms} ms");
    common::wait_until(Duration::from_secs(3), "the first heatshield to serve the source", || {
        status(&mut admin)["serving"] == "source"
    });
    push(10);
    thread::sleep(Duration::from_millis(500));
    republished.push(("after rollback", publish("after rollback")));
    thread::sleep(Duration::from_millis(700));
    // and over again, from the command line this time (it waits for the end)
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_heatshield"))
        .args(["--config", &conf, "--cluster", &env.source.seeds(), "migrate", "phase", "cutover"])
        .args(["--proxy", &a.addr()])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{printed}");
    assert!(printed.starts_with("cutover done in ") && printed.contains("serving: target"), "{printed}");
    changes.push(switched(&mut admin, "target")["switch_result"].clone());
    // (scripts/check-migration.sh shows them)
    eprintln!("migration changes: {}", changes.join("; "));
    push(10);
    thread::sleep(Duration::from_millis(500));
    republished.push(("stop", publish("stop")));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    subscriber.join().unwrap();
    // each heard once, in the order published; how many were published again is shown
    let heard = heard.lock().unwrap().clone();
    let mut want = Vec::new();
    for what in ["before", "after cutover", "after rollback", "stop"] {
        let n = republished.iter().find(|(w, _)| *w == what).map_or(0, |(_, n)| *n);
        want.extend((0..=n).map(|i| format!("{what} #{i}")));
    }
    let mut seen = heard.clone();
    seen.dedup();
    assert_eq!(seen, heard, "a message heard twice: {heard:?}");
    assert!(heard.iter().all(|h| want.contains(h)), "{heard:?}");
    let order: Vec<usize> = heard.iter().map(|h| want.iter().position(|w| w == h).unwrap()).collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "heard out of order: {heard:?}");
    eprintln!("pub/sub: heard {heard:?}");
    let done: Vec<_> = load.into_iter().map(|h| h.join().unwrap()).collect();
    let (got, _nils) = consumer.join().unwrap();

    // every acknowledged write is on both clusters once the copies back have landed
    for c in [&mut admin, &mut admin_b] {
        common::wait_until(Duration::from_secs(10), "the copies to land", || status(c)["dual_write_pending"] == "0");
    }
    let side = |cluster: &RedisCluster, key: &str, cmd: &[&str]| cmd_text(cluster.master_for_key(key.as_bytes()), cmd);
    for (t, (incrs, appends, errors, [piped, txs, evals, watched, _aborted])) in done.iter().enumerate() {
        assert!(errors.is_empty(), "client {t}: {errors:?}");
        assert!(*incrs > 20, "client {t} ran {incrs} INCRs");
        let k = format!("cnt:{t}");
        let l = format!("log:{t}");
        for cluster in [&env.source, &env.target] {
            let get = |key: String| side(cluster, &key, &["GET", &key]).trim().to_string();
            assert_eq!(get(format!("{{tx:{t}}}c")), txs.to_string(), "transactions of client {t}");
            assert_eq!(get(format!("sc:{t}")), (2 * evals).to_string(), "scripts of client {t}");
            // (the MSET before the last script's INCRBY wrote the count of scripts before it)
            assert_eq!(get(format!("ms:{t}:a")), (evals - 1).to_string(), "MSET of client {t}");
            assert_eq!(get(format!("ms:{t}:b")), (evals - 1).to_string(), "MSET of client {t}");
            assert_eq!(get(format!("{{w:{t}}}k")), watched.to_string(), "WATCHed SETs of client {t}");
            let pl = format!("plog:{t}");
            let list = side(cluster, &pl, &["LRANGE", &pl, "0", "-1"]);
            let want: Vec<String> = (0..*piped).map(|i| i.to_string()).collect();
            assert_eq!(list.split_whitespace().collect::<Vec<_>>(), want, "{pl}: every pipelined append once");
            assert_eq!(side(cluster, &k, &["GET", &k]).trim(), incrs.to_string(), "{k}");
            let list = side(cluster, &l, &["LRANGE", &l, "0", "-1"]);
            let want: Vec<String> = (0..*appends).map(|i| i.to_string()).collect();
            assert_eq!(list.split_whitespace().collect::<Vec<_>>(), want, "{l}: every append once, in order");
            let ttl: i64 = side(cluster, &format!("ttl:{t}"), &["TTL", &format!("ttl:{t}")]).trim().parse().unwrap();
            assert!((290..=300).contains(&ttl), "ttl:{t} {ttl}");
        }
    }
    // every job pushed was taken once (a BLPOP waiting at a change returns nil and asks again)
    let mut rest = Conn::connect(a.port());
    let mut all: Vec<i64> = got.iter().map(|s| s.parse().unwrap()).collect();
    while let V::Str(v) = rest.cmd(&["LPOP", "jobs"]) {
        all.push(String::from_utf8_lossy(&v).parse().unwrap());
    }
    all.sort();
    assert_eq!(all, (0..pushed as i64).collect::<Vec<_>>(), "every job once");
    // the big hash's change reached the source whole
    let h = env.source.master_for_key(b"h:big");
    assert_eq!(cmd_text(h, &["HGET", "h:big", "f0"]), "changed");
    assert_eq!(cmd_text(h, &["HLEN", "h:big"]), "20000");
    // and the two clusters are equal
    let (code, out) = verify(&env, "", "20");
    assert_eq!(code, 0, "{out}");

    // finish: the source is released, heatshield's keys removed from both clusters
    assert!(admin.cmd(&["PROXY", "MIGRATION", "FINISH"]).is_ok());
    let s = switched(&mut admin, "target");
    assert!(s["switch_result"].starts_with("finish done"), "{s:?}");
    assert_eq!(s["phase"], "finished");
    common::wait_until(Duration::from_secs(3), "the second heatshield to finish", || {
        status(&mut admin_b)["phase"] == "finished"
    });
    for cluster in [&env.source, &env.target] {
        for node in cluster.masters() {
            let left = Conn::connect(node).cmd(&["SCAN", "0", "MATCH", "{heatshield:mv:*", "COUNT", "100000"]);
            assert!(matches!(&left, V::Arr(v) if v[1] == V::Arr(vec![])), "heatshield's keys left on {node}: {left:?}");
        }
    }
    let r = admin.cmd(&["PROXY", "MIGRATION", "ROLLBACK"]);
    assert!(r.is_err(), "{r:?}");
    // writes now reach the target alone
    assert!(admin.cmd(&["SET", "after-finish", "1"]).is_ok());
    thread::sleep(Duration::from_millis(300));
    assert_eq!(cmd_text(env.source.master_for_key(b"after-finish"), &["EXISTS", "after-finish"]), "0");
    // an instance started now with the same configuration serves the target from its
    // first request
    let c = Proxy::start_cluster(&env.source, &["--config", &conf, "--metrics", "off"]);
    let mut cc = Conn::connect(c.port());
    assert_eq!(cc.cmd(&["GET", "after-finish"]).text(), "1");
    assert_eq!(status(&mut cc)["phase"], "finished");
}

#[test]
fn shadow_compares_the_targets_replies_by_command_and_never_returns_them() {
    let env = start();
    fill(env.src.port());
    fill(env.dst.port());
    let (_dir, conf) =
        config_file(&format!("[migration]\ntarget = [\"{}\"]\nphase = \"shadow\"\n", env.target.nodes()[0].addr()));
    let mig = Proxy::start_cluster(&env.source, &["--config", &conf]);
    let mut c = Conn::connect(mig.port());
    assert_eq!(status(&mut c)["phase"], "shadow");
    // equal data: equal replies
    for i in 0..200 {
        assert_eq!(c.cmd(&["GET", &format!("s:{i}")]).text(), format!("v{i}"));
    }
    // a key changed on the target alone: the client gets the source's value, and the
    // difference is counted for GET
    let t7 = env.target.master_for_key(b"s:7");
    assert_eq!(cmd_text(t7, &["SET", "s:7", "other"]), "OK");
    assert_eq!(c.cmd(&["GET", "s:7"]).text(), "v7");
    // the same score printed otherwise by the two servers: a difference of ZSCORE
    assert_eq!(c.cmd(&["ZSCORE", "z:1", "m1"]).text(), "0.10000000000000001");
    // a write is made on the target too
    assert!(c.cmd(&["SET", "shadowed", "x"]).is_ok());
    common::wait_until(Duration::from_secs(3), "the write on the target", || {
        cmd_text(env.target.master_for_key(b"shadowed"), &["GET", "shadowed"]) == "x"
    });
    // keyless, and across slots: not shadowed (a PING heatshield answers itself is not
    // even looked at)
    assert_eq!(c.cmd(&["PING"]).text(), "PONG");
    assert!(c.cmd(&["DBSIZE"]).int() > 0);
    assert!(c.cmd(&["MSET", "a:1", "1", "b:2", "2"]).is_ok());
    common::wait_until(Duration::from_secs(3), "the shadow queue to drain", || status(&mut c)["shadow_pending"] == "0");
    let s = status(&mut c);
    assert_eq!(s["shadow_differed"], "2", "{s:?}");
    assert_eq!(s["shadow_differences"], "get:1,zscore:1", "{s:?}");
    assert!(s["shadow_matched"].parse::<u64>().unwrap() >= 201, "{s:?}");
    // a pipeline, and a script with its declared key: shadowed too
    let before: u64 = s["shadow_matched"].parse().unwrap();
    for i in 0..10 {
        c.send(&["GET", &format!("s:{}", 100 + i)]);
    }
    for i in 0..10 {
        assert_eq!(c.read_reply().text(), format!("v{}", 100 + i));
    }
    assert_eq!(c.cmd(&["EVAL", "return redis.call('GET', KEYS[1])", "1", "s:3"]).text(), "v3");
    common::wait_until(Duration::from_secs(3), "the pipeline and the script compared", || {
        status(&mut c)["shadow_matched"].parse::<u64>().unwrap() == before + 11
    });
    assert_eq!((s["shadow_failed"].as_str(), s["shadow_dropped"].as_str()), ("0", "0"), "{s:?}");
    assert!(s["shadow_skipped"].parse::<u64>().unwrap() >= 2, "{s:?}");
    let addr = mig.metrics_addr().unwrap();
    common::wait_until(Duration::from_secs(5), "the shadow's metrics", || {
        let (_, body) = common::http_get(&addr, "/metrics");
        body.contains("heatshield_migration_shadow 1")
            && body.contains("heatshield_migration_shadow_total{outcome=\"differed\"} 2")
    });
    // off: nothing more is shadowed
    assert!(c.cmd(&["PROXY", "MIGRATION", "OFF"]).is_ok());
    let matched = status(&mut c)["shadow_matched"].clone();
    assert_eq!(c.cmd(&["GET", "s:1"]).text(), "v1");
    thread::sleep(Duration::from_millis(200));
    let s = status(&mut c);
    assert_eq!((s["phase"].as_str(), s["shadow_matched"].as_str()), ("off", matched.as_str()));
}

#[test]
fn after_a_cutover_replica_reads_and_cache_hits_come_from_the_target() {
    // a source with a replica per master, read from the replicas; a pinned key cached
    let source = RedisCluster::start_shaped(&redis_server_bin(), 3, 1, &[]);
    let target = RedisCluster::start_shaped(&valkey_server_required(), 4, 0, &[]);
    let (_dir, conf) = config_file(&format!(
        "[backend]\nread_from = \"prefer-replica\"\n[cache]\npin = [\"pin:*\"]\n\
         [migration]\ntarget = [\"{}\"]\nphase = \"dual-write\"\n",
        target.nodes()[0].addr()
    ));
    let p = Proxy::start_cluster(&source, &["--config", &conf, "--metrics", "off"]);
    let mut c = Conn::connect(p.port());
    for k in ["pin:1", "r:1"] {
        assert!(c.cmd(&["SET", k, "source"]).is_ok());
    }
    // the replicas have it, and the pinned key is in the cache
    common::wait_until(Duration::from_secs(5), "reads of the written values", || {
        c.cmd(&["GET", "r:1"]).text() == "source" && c.cmd(&["GET", "pin:1"]).text() == "source"
    });
    for _ in 0..3 {
        assert_eq!(c.cmd(&["GET", "pin:1"]).text(), "source");
    }
    common::wait_until(Duration::from_secs(5), "the copies", || status(&mut c)["dual_write_pending"] == "0");
    // the target's values changed behind heatshield's back
    for k in ["pin:1", "r:1"] {
        assert_eq!(cmd_text(target.master_for_key(k.as_bytes()), &["SET", k, "target"]), "OK");
    }
    assert!(c.cmd(&["PROXY", "MIGRATION", "CUTOVER"]).is_ok());
    switched(&mut c, "target");
    // a read once sent to a source replica, and a key the cache held, now answer the
    // target's values; and a client reads its own write at once
    assert_eq!(c.cmd(&["GET", "r:1"]).text(), "target");
    assert_eq!(c.cmd(&["GET", "pin:1"]).text(), "target");
    assert!(c.cmd(&["SET", "r:2", "written"]).is_ok());
    assert_eq!(c.cmd(&["GET", "r:2"]).text(), "written");
}
