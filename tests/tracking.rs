//! Client-side caching through heatshield (CLIENT TRACKING) against a real 3-master
//! cluster, with a standalone Redis answering the same commands for the exact bytes: the
//! tracking commands and their errors, invalidations for the client's own writes, OPTIN,
//! OPTOUT, NOLOOP, BCAST prefixes and a RESP2 redirect; invalidations for writes made
//! elsewhere (another client of heatshield, a client connected to a master directly);
//! node-redis's `clientSideCache`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, Reply, V};
use common::{ClusterEnv, RedisStandalone, Shared};

static ENV: Shared<ClusterEnv> = Shared::new();

/// The shared cluster and proxy, with client-side caching already switched on in
/// heatshield (every master's invalidation connection in BCAST mode), so a test's own
/// CLIENT TRACKING is not followed by the one-off "drop everything" that comes when it is
/// switched on.
fn env() -> Arc<ClusterEnv> {
    ENV.get(|| {
        let env = ClusterEnv::start(None);
        let mut c = Conn::connect_proto(env.proxy.port(), Proto::Resp3);
        assert!(c.cmd(&["CLIENT", "TRACKING", "on"]).is_ok());
        common::wait_until(Duration::from_secs(10), "every master to report every key", || {
            env.owners.masters().iter().all(|&m| {
                common::cmd_text(m, &["CLIENT", "LIST"])
                    .lines()
                    .any(|l| l.contains("name=heatshield-invalidations") && l.contains("flags=tB"))
            })
        });
        env
    })
}

/// What one command got: its replies (exact bytes), and the pushes that came before the
/// next command (invalidations).
#[derive(Default)]
struct Got {
    replies: Vec<Vec<u8>>,
    pushes: Vec<Vec<u8>>,
}

/// Sends `args`, reads its `replies` and then the pushes that follow within 50 ms.
fn step(c: &mut Conn, args: &[&str], replies: usize, raw: &mut Vec<Got>) {
    c.send(args);
    let mut got = Got::default();
    while got.replies.len() < replies {
        match c.try_read_full() {
            Ok(r) if r.raw.first() == Some(&b'>') => got.pushes.push(r.raw),
            Ok(r) => got.replies.push(r.raw),
            Err(e) => panic!("port {}: {args:?}: {e}", c.port),
        }
    }
    while let Some(r) = next_within(c, 50) {
        got.pushes.push(r.raw);
    }
    raw.push(got);
}

/// The next reply (or push) within `ms`, if one comes.
fn next_within(c: &mut Conn, ms: u64) -> Option<Reply> {
    c.stream().set_read_timeout(Some(Duration::from_millis(ms))).unwrap();
    let r = c.try_read_full().ok();
    c.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    r
}

/// Every reply as Redis's; every invalidation Redis sent after a command, heatshield sent
/// after it too (heatshield may send one more: see docs/pubsub.md).
fn compare(what: &str, got: &[Vec<Got>]) {
    let (want, proxied) = (&got[0], &got[1]);
    assert_eq!(want.len(), proxied.len(), "{what}");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    for (i, (w, p)) in want.iter().zip(proxied).enumerate() {
        let (wr, pr): (Vec<String>, Vec<String>) =
            (w.replies.iter().map(|b| text(b)).collect(), p.replies.iter().map(|b| text(b)).collect());
        assert_eq!(pr, wr, "{what}: step {i}: replies differ from Redis's");
        // the keys Redis invalidated after this command, heatshield did too (maybe with more
        // keys in one message: a key the write did not change)
        let keys = |pushes: &[Vec<u8>]| -> Vec<Option<String>> {
            pushes
                .iter()
                .flat_map(|b| {
                    let (r, _) = common::client::decode_reply(b, Proto::Resp3).unwrap().unwrap();
                    match r.v.items().get(1) {
                        Some(V::Arr(ks)) => ks.iter().map(|k| k.as_text()).collect::<Vec<_>>(),
                        _ => vec![None],
                    }
                })
                .collect()
        };
        let (wk, pk) = (keys(&w.pushes), keys(&p.pushes));
        for k in &wk {
            assert!(
                pk.contains(k),
                "{what}: step {i}: Redis invalidated {k:?}, heatshield {pk:?} ({:?})",
                p.pushes.iter().map(|b| text(b)).collect::<Vec<_>>()
            );
        }
        if w.pushes.is_empty() && !p.pushes.is_empty() {
            eprintln!(
                "{what}: step {i}: heatshield also sent {:?}",
                p.pushes.iter().map(|b| text(b)).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn tracking_commands_and_own_invalidations_are_byte_for_byte_redis() {
    let env = env();
    let redis = RedisStandalone::start();
    let mut got = Vec::new();
    for port in [redis.port(), env.proxy.port()] {
        let mut c = Conn::connect_proto(port, Proto::Resp3);
        let mut raw = Vec::new();
        let r = &mut raw;
        // the commands and their errors
        step(&mut c, &["CLIENT", "GETREDIR"], 1, r);
        step(&mut c, &["CLIENT", "TRACKINGINFO"], 1, r);
        step(&mut c, &["CLIENT", "CACHING", "yes"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "maybe"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "bogus"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "prefix", "a"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "bcast", "optin"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "optin", "optout"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "bcast", "prefix", "a", "prefix", "ab"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "redirect", "x"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "redirect", "987654"], 1, r);
        // default mode: a key read is told of once, after the write's reply
        step(&mut c, &["CLIENT", "TRACKING", "on"], 1, r);
        step(&mut c, &["CLIENT", "GETREDIR"], 1, r);
        step(&mut c, &["CLIENT", "TRACKINGINFO"], 1, r);
        step(&mut c, &["CLIENT", "CACHING", "yes"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "bcast"], 1, r);
        step(&mut c, &["GET", "{t}a"], 1, r);
        step(&mut c, &["SET", "{t}a", "1"], 1, r);
        step(&mut c, &["SET", "{t}a", "2"], 1, r);
        step(&mut c, &["MGET", "{t}a", "{t}b"], 1, r);
        step(&mut c, &["DEL", "{t}a", "{t}b"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "optin"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "off"], 1, r);
        // OPTIN: only after CLIENT CACHING yes, for the next command
        step(&mut c, &["CLIENT", "TRACKING", "on", "optin"], 1, r);
        step(&mut c, &["CLIENT", "CACHING", "no"], 1, r);
        step(&mut c, &["GET", "{t}k1"], 1, r);
        step(&mut c, &["CLIENT", "CACHING", "yes"], 1, r);
        step(&mut c, &["CLIENT", "TRACKINGINFO"], 1, r);
        step(&mut c, &["GET", "{t}k2"], 1, r);
        step(&mut c, &["SET", "{t}k1", "1"], 1, r);
        step(&mut c, &["SET", "{t}k2", "1"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "off"], 1, r);
        // OPTOUT: every read but the one after CLIENT CACHING no
        step(&mut c, &["CLIENT", "TRACKING", "on", "optout"], 1, r);
        step(&mut c, &["CLIENT", "CACHING", "no"], 1, r);
        step(&mut c, &["GET", "{t}k1"], 1, r);
        step(&mut c, &["GET", "{t}k2"], 1, r);
        step(&mut c, &["DEL", "{t}k1"], 1, r);
        step(&mut c, &["DEL", "{t}k2"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "off"], 1, r);
        // NOLOOP: not told of its own writes
        step(&mut c, &["CLIENT", "TRACKING", "on", "noloop"], 1, r);
        step(&mut c, &["GET", "{t}q"], 1, r);
        step(&mut c, &["SET", "{t}q", "1"], 1, r);
        step(&mut c, &["CLIENT", "TRACKINGINFO"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "off"], 1, r);
        // BCAST with prefixes: every key written under them, read or not
        step(&mut c, &["CLIENT", "TRACKING", "on", "bcast", "prefix", "{t}pre:"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "bcast", "prefix", "{t}pr"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "on", "bcast", "prefix", "{t}other:"], 1, r);
        step(&mut c, &["CLIENT", "TRACKINGINFO"], 1, r);
        step(&mut c, &["SET", "{t}pre:x", "1"], 1, r);
        step(&mut c, &["SET", "{t}elsewhere", "1"], 1, r);
        step(&mut c, &["CLIENT", "TRACKING", "off"], 1, r);
        step(&mut c, &["DEL", "{t}pre:x", "{t}elsewhere", "{t}q"], 1, r);
        while let Some(extra) = next_within(&mut c, 200) {
            assert_eq!(extra.raw.first(), Some(&b'>'), "port {port}: nothing but a late invalidation: {extra:?}");
        }
        got.push(raw);
    }
    compare("RESP3", &got);
}

#[test]
fn a_resp2_client_redirects_its_invalidations_to_a_subscriber() {
    let env = env();
    let redis = RedisStandalone::start();
    let mut got = Vec::new();
    for port in [redis.port(), env.proxy.port()] {
        let mut r = Conn::connect(port);
        let id = r.cmd(&["CLIENT", "ID"]).int().to_string();
        let mut raw: Vec<Vec<u8>> = Vec::new();
        r.send(&["SUBSCRIBE", "__redis__:invalidate"]);
        raw.push(r.read_full().raw);
        let mut c = Conn::connect(port);
        raw.push(c.cmd_full(&["CLIENT", "TRACKING", "on", "redirect", &id]).raw);
        raw.push(c.cmd_full(&["CLIENT", "TRACKINGINFO"]).raw.iter().filter(|b| !b.is_ascii_digit()).copied().collect());
        raw.push(c.cmd_full(&["GET", "{t2}k"]).raw);
        raw.push(c.cmd_full(&["SET", "{t2}k", "v"]).raw);
        raw.push(r.read_full().raw);
        // and from another client's write
        raw.push(c.cmd_full(&["GET", "{t2}k"]).raw);
        Conn::connect(port).cmd(&["DEL", "{t2}k"]);
        raw.push(r.read_full().raw);
        // (a second report of the same write, from Redis, is allowed; nothing else)
        while let Some(extra) = next_within(&mut r, 100) {
            assert_eq!(extra.raw, raw[5], "port {port}");
        }
        got.push(raw);
    }
    let (want, proxied) = (&got[0], &got[1]);
    for (i, (w, p)) in want.iter().zip(proxied).enumerate() {
        assert_eq!(String::from_utf8_lossy(p), String::from_utf8_lossy(w), "RESP2 redirect: {i}");
    }
}

#[test]
fn writes_made_anywhere_reach_a_tracking_client() {
    let env = env();
    let masters = env.owners.masters();
    let mut c = Conn::connect_proto(env.proxy.port(), Proto::Resp3);
    assert!(c.cmd(&["CLIENT", "TRACKING", "on"]).is_ok());
    let mut worst = Duration::ZERO;
    let mut other = Conn::connect(env.proxy.port());
    for round in 0..30 {
        for &m in &masters {
            let key = env.owners.tag_on(m, &format!("tr{round}"));
            assert!(c.cmd(&["GET", &key]).is_nil());
            // written on the master directly: heatshield learns it from Redis
            let mut direct = Conn::connect(m);
            let t0 = Instant::now();
            assert!(direct.cmd(&["SET", &key, "x"]).is_ok());
            let r = next_within(&mut c, 2000).expect("an invalidation for a direct write");
            worst = worst.max(t0.elapsed());
            assert_eq!(r.raw, invalidate(&[&key]));
            // written by another client of heatshield: told before that write's reply
            assert_eq!(c.cmd(&["GET", &key]).text(), "x");
            assert_eq!(other.cmd(&["DEL", &key]).int(), 1);
            let r = next_within(&mut c, 2000).expect("an invalidation for a write through heatshield");
            assert_eq!(r.raw, invalidate(&[&key]));
            // and once only: the key is forgotten until read again
            assert!(next_within(&mut c, 20).is_none(), "told once");
        }
    }
    eprintln!("worst delay from a direct write's reply to the invalidation: {worst:?}");
    let info = c.cmd(&["INFO", "clients"]).text();
    let n: i64 = common::info_field(&info, "tracking_clients").unwrap().parse().unwrap();
    assert!(n >= 1, "{info}");
}

fn invalidate(keys: &[&str]) -> Vec<u8> {
    let mut b = format!(">2\r\n$10\r\ninvalidate\r\n*{}\r\n", keys.len());
    for k in keys {
        b.push_str(&format!("${}\r\n{k}\r\n", k.len()));
    }
    b.into_bytes()
}

#[test]
fn client_list_shows_tracking() {
    let env = env();
    let mut c = Conn::connect_proto(env.proxy.port(), Proto::Resp3);
    assert!(c.cmd(&["CLIENT", "TRACKING", "on", "bcast"]).is_ok());
    let line = c.cmd(&["CLIENT", "INFO"]).text();
    assert!(line.contains(" flags=tB ") && line.contains(" redir=0 "), "{line}");
    assert!(c.cmd(&["RESET"]).text() == "RESET");
    let line = c.cmd(&["CLIENT", "INFO"]).text();
    assert!(line.contains(" flags=N ") && line.contains(" redir=-1 "), "{line}");
    let _ = V::Nil;
}

#[test]
fn node_redis_client_side_cache_never_reads_back_an_older_value() {
    let have = |bin: &str| std::process::Command::new(bin).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(have("node"), "node is required for this test: run scripts/ensure-deps.sh");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node");
    assert!(
        std::path::Path::new(dir).join("node_modules/redis/package.json").exists(),
        "tests/node/node_modules is installed by tests/node_clients.rs (or: npm install --prefix tests/node)"
    );
    let env = env();
    let pairs: Vec<String> =
        env.owners.masters().iter().map(|&m| format!("{}={m}", env.owners.tag_on(m, "csc"))).collect();
    let out = std::process::Command::new("node")
        .arg(format!("{dir}/csc.js"))
        .arg(env.proxy.port().to_string())
        .args(&pairs)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success() && stdout.starts_with("ok "), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains(" own_stale=0 "), "the client read back an older value than it wrote: {stdout}");
    let hits: u64 = stdout.split_whitespace().find_map(|f| f.strip_prefix("hits=")).unwrap().parse().unwrap();
    assert!(hits >= 40 * 3, "the cache served reads ({hits} hits)");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn expiry_and_another_heatshield_are_told_and_tracked_keys_are_bounded() {
    // a proxy of its own, with a small table, on the shared cluster
    let env = env();
    let (_dir, path) = common::config_file("[limits]\ntracking_max_keys = 1000\n");
    let proxy = common::Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let mut c = Conn::connect_proto(proxy.port(), Proto::Resp3);
    assert!(c.cmd(&["CLIENT", "TRACKING", "on"]).is_ok());
    common::wait_until(Duration::from_secs(10), "client-side caching on in the new proxy", || {
        while next_within(&mut c, 10).is_some() {}
        env.owners.masters().iter().all(|&m| {
            common::cmd_text(m, &["CLIENT", "LIST"])
                .lines()
                .filter(|l| l.contains("name=heatshield-invalidations"))
                .count()
                >= 2
        })
    });
    std::thread::sleep(Duration::from_millis(200));
    while next_within(&mut c, 50).is_some() {}
    // a key that expires
    assert!(Conn::connect(proxy.port()).cmd(&["SET", "{exp}k", "v", "PX", "100"]).is_ok());
    assert_eq!(c.cmd(&["GET", "{exp}k"]).text(), "v");
    let r = next_within(&mut c, 3000).expect("an invalidation when the key expires");
    assert_eq!(r.raw, invalidate(&["{exp}k"]));
    // a write through another heatshield (the shared one)
    assert!(c.cmd(&["GET", "{other}k"]).is_nil());
    assert!(Conn::connect(env.proxy.port()).cmd(&["SET", "{other}k", "v"]).is_ok());
    let r = next_within(&mut c, 3000).expect("an invalidation for a write through another heatshield");
    assert_eq!(r.raw, invalidate(&["{other}k"]));
    // past tracking_max_keys, keys are invalidated to make room: the table stays bounded
    let keys: Vec<String> = (0..3000).map(|i| format!("{{bound}}k{i}")).collect();
    for chunk in keys.chunks(100) {
        let mut args = vec!["MGET"];
        args.extend(chunk.iter().map(|s| s.as_str()));
        c.send(&args);
    }
    let (mut replies, mut evicted) = (0, 0);
    while replies < 30 {
        let r = c.read_full();
        if r.raw.first() == Some(&b'>') {
            evicted += r.v.items()[1].items().len();
        } else {
            replies += 1;
        }
    }
    while let Some(r) = next_within(&mut c, 100) {
        evicted += r.v.items()[1].items().len();
    }
    assert!(evicted >= 2000, "{evicted} keys invalidated to keep 1,000");
    let info = c.cmd(&["INFO", "clients"]).text();
    assert!(info.contains("tracking_clients:1"), "{info}");
    drop(c);
    // memory per tracked key, with the bound out of the way
    let (_dir2, path2) = common::config_file("[limits]\ntracking_max_keys = 1000000\n");
    let big = common::Proxy::start_cluster(&env.cluster, &["--config", &path2]);
    let mut c = Conn::connect_proto(big.port(), Proto::Resp3);
    assert!(c.cmd(&["CLIENT", "TRACKING", "on"]).is_ok());
    let before = rss_kib(big.pid());
    let n = 100_000;
    for b in 0..n / 100 {
        let mut args = vec!["MGET".to_string()];
        args.extend((0..100).map(|i| format!("{{mem}}key:{}", b * 100 + i)));
        c.send(&args);
    }
    let mut replies = 0;
    while replies < n / 100 {
        if c.read_full().raw.first() != Some(&b'>') {
            replies += 1;
        }
    }
    let per_key = (rss_kib(big.pid()).saturating_sub(before)) as f64 * 1024.0 / n as f64;
    eprintln!("{n} tracked keys: {per_key:.0} bytes of heatshield RSS per key");
    assert!(per_key < 1024.0, "{per_key:.0} bytes per tracked key");
}

#[test]
fn the_first_tracking_client_is_answered_once_every_master_reports() {
    // a proxy of its own: nobody has tracked through it yet
    let env = env();
    let proxy = common::Proxy::start_cluster(&env.cluster, &[]);
    let mut c = Conn::connect_proto(proxy.port(), Proto::Resp3);
    // one master slow to start reporting (paused for a moment)
    let slow = env.owners.masters()[1];
    assert!(Conn::connect(slow).cmd(&["CLIENT", "PAUSE", "500", "ALL"]).is_ok());
    let t0 = Instant::now();
    assert!(c.cmd(&["CLIENT", "TRACKING", "on"]).is_ok());
    eprintln!("CLIENT TRACKING on answered after {:?}", t0.elapsed());
    // read at once, then written on the master directly: the report is the key itself,
    // not a "drop everything" because reporting started after the read
    let key = env.owners.tag_on(env.owners.masters()[0], "first");
    assert!(c.cmd(&["GET", &key]).is_nil());
    assert!(Conn::connect(env.owners.masters()[0]).cmd(&["SET", &key, "v"]).is_ok());
    let r = next_within(&mut c, 3000).expect("an invalidation");
    assert_eq!(r.raw, invalidate(&[&key]));
    // and no "drop everything" when the slow master starts reporting
    if let Some(r) = next_within(&mut c, 1000) {
        panic!("nothing more expected, got {r:?}");
    }
}
