//! Pub/sub through heatshield against a real 3-master cluster (and, for the exact bytes,
//! a standalone Redis answering the same commands): subscription replies, messages from
//! every master, patterns, keyspace notifications, sharded channels on several shards
//! from one connection, the PUBSUB introspection counts, RESP3 interleaving, and the
//! slow-subscriber limit.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, Reply, V};
use common::{ClusterEnv, Proxy, RedisStandalone, Shared, config_file, key_slot, wait_until};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

/// The next reply (or message) within `ms`, if one comes.
fn next_within(c: &mut Conn, ms: u64) -> Option<Reply> {
    c.stream().set_read_timeout(Some(Duration::from_millis(ms))).unwrap();
    let r = c.try_read_full().ok();
    c.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    r
}

fn strs(v: &V) -> Vec<String> {
    v.items().iter().map(|x| x.as_text().unwrap_or_else(|| format!("{}", x.int()))).collect()
}

/// Sends `args` and keeps the bytes of the `replies` that follow.
fn step(c: &mut Conn, args: &[&str], replies: usize, raw: &mut Vec<Vec<u8>>) {
    c.send(args);
    for _ in 0..replies {
        raw.push(c.read_full().raw);
    }
}

/// A channel name whose slot lives on master `port`.
fn channel_on(env: &ClusterEnv, port: u16, prefix: &str) -> String {
    (0..).map(|i| format!("{prefix}{i}")).find(|c| env.owners.of_key(c.as_bytes()) == port).unwrap()
}

#[test]
fn subscription_replies_are_byte_for_byte_redis() {
    let env = env();
    let redis = RedisStandalone::start();
    for proto in Proto::BOTH {
        let mut got: Vec<Vec<Vec<u8>>> = Vec::new();
        for port in [redis.port(), env.proxy.port()] {
            let mut c = Conn::connect_proto(port, proto);
            let mut p = Conn::connect(port);
            let mut raw = Vec::new();
            step(&mut c, &["SUBSCRIBE", "pa", "pb"], 2, &mut raw);
            step(&mut c, &["PSUBSCRIBE", "p*"], 1, &mut raw);
            step(&mut c, &["SUBSCRIBE", "pa"], 1, &mut raw);
            step(&mut c, &["UNSUBSCRIBE", "nope"], 1, &mut raw);
            step(&mut c, &["PING"], 1, &mut raw);
            step(&mut c, &["PING", "hi"], 1, &mut raw);
            step(&mut c, &["GET", "k"], 1, &mut raw);
            step(&mut c, &["CLIENT", "LIST"], 0, &mut raw);
            if proto == Proto::Resp2 {
                raw.push(c.read_full().raw); // the refusal
            } else {
                c.read_full();
            }
            // a message on a channel and on the pattern
            assert_eq!(p.cmd(&["PUBLISH", "pa", "hello"]).int(), 2, "port {port}");
            raw.push(c.read_full().raw);
            raw.push(c.read_full().raw);
            assert_eq!(p.cmd(&["PUBLISH", "zz", "x"]).int(), 0);
            step(&mut c, &["UNSUBSCRIBE", "pa"], 1, &mut raw);
            step(&mut c, &["PUNSUBSCRIBE"], 1, &mut raw);
            step(&mut c, &["UNSUBSCRIBE"], 1, &mut raw);
            step(&mut c, &["UNSUBSCRIBE"], 1, &mut raw);
            step(&mut c, &["PUNSUBSCRIBE"], 1, &mut raw);
            step(&mut c, &["SSUBSCRIBE", "s{1}", "s{1}x"], 2, &mut raw);
            step(&mut c, &["SUNSUBSCRIBE", "s{1}"], 1, &mut raw);
            assert_eq!(p.cmd(&["SPUBLISH", "s{1}x", "m"]).int(), 1);
            raw.push(c.read_full().raw);
            step(&mut c, &["SUNSUBSCRIBE"], 1, &mut raw);
            step(&mut c, &["SUNSUBSCRIBE"], 1, &mut raw);
            // pipelined around subscriptions, in one write: the same replies in the same order
            let mut pipe = Vec::new();
            for cmd in [
                &["SUBSCRIBE", "pipe1"][..],
                &["PING", "x"],
                &["PSUBSCRIBE", "pipe*"],
                &["UNSUBSCRIBE", "pipe1"],
                &["PING"],
                &["PUNSUBSCRIBE", "pipe*"],
            ] {
                pipe.extend_from_slice(&common::client::encode(cmd));
            }
            c.send_raw(&pipe);
            for _ in 0..6 {
                raw.push(c.read_full().raw);
            }
            // confirmations and messages are written under CLIENT REPLY OFF too
            c.send(&["CLIENT", "REPLY", "OFF"]);
            step(&mut c, &["SUBSCRIBE", "quiet"], 1, &mut raw);
            assert_eq!(p.cmd(&["PUBLISH", "quiet", "m"]).int(), 1);
            raw.push(c.read_full().raw);
            step(&mut c, &["UNSUBSCRIBE", "quiet"], 1, &mut raw);
            step(&mut c, &["CLIENT", "REPLY", "ON"], 1, &mut raw);
            // out of subscribe mode: everything again
            step(&mut c, &["PING"], 1, &mut raw);
            step(&mut c, &["SET", "{pubsub}k", "v"], 1, &mut raw);
            step(&mut c, &["UNSUBSCRIBE", "a", "b"], 2, &mut raw);
            got.push(raw);
        }
        let (want, proxied) = (&got[0], &got[1]);
        assert_eq!(want.len(), proxied.len());
        for (i, (w, p)) in want.iter().zip(proxied).enumerate() {
            assert_eq!(
                String::from_utf8_lossy(p),
                String::from_utf8_lossy(w),
                "{proto:?} reply {i} differs from Redis's"
            );
        }
    }
}

#[test]
fn messages_published_on_any_master_reach_subscribers_once() {
    let env = env();
    let mut sub = Conn::connect(env.proxy.port());
    sub.cmd(&["SUBSCRIBE", "news"]);
    sub.send(&["PSUBSCRIBE", "ne*"]);
    sub.read_full();
    for (i, &port) in env.owners.masters().iter().enumerate() {
        let mut direct = Conn::connect(port);
        direct.cmd(&["PUBLISH", "news", &format!("m{i}")]);
        let a = sub.read_reply();
        let b = sub.read_reply();
        let mut kinds = [strs(&a), strs(&b)];
        kinds.sort();
        assert_eq!(kinds[0], ["message", "news", &format!("m{i}")]);
        assert_eq!(kinds[1], ["pmessage", "ne*", "news", &format!("m{i}")]);
    }
    // each once: nothing else arrives
    assert!(next_within(&mut sub, 300).is_none());
    // PUBLISH through heatshield counts this heatshield's subscribers as one Redis would
    let mut other = Conn::connect(env.proxy.port());
    other.cmd(&["SUBSCRIBE", "news"]);
    let mut p = Conn::connect(env.proxy.port());
    assert_eq!(p.cmd(&["PUBLISH", "news", "x"]).int(), 3, "two channel subscribers and one pattern");
    assert_eq!(p.cmd(&["PUBLISH", "nobody-listens", "x"]).int(), 0);
    assert_eq!(strs(&other.read_reply()), ["message", "news", "x"]);
}

#[test]
fn keyspace_notifications_arrive_from_every_master() {
    let env = env();
    for &port in &env.owners.masters() {
        Conn::connect(port).cmd(&["CONFIG", "SET", "notify-keyspace-events", "K$"]);
    }
    let mut sub = Conn::connect(env.proxy.port());
    sub.cmd(&["PSUBSCRIBE", "__keyspace@0__:ksn*"]);
    let mut c = Conn::connect(env.proxy.port());
    let keys: Vec<String> = env.owners.masters().iter().map(|&p| channel_on(&env, p, "ksn")).collect();
    for k in &keys {
        assert!(c.cmd(&["SET", k, "v"]).is_ok());
    }
    let mut seen: Vec<String> = (0..keys.len()).map(|_| strs(&sub.read_reply())[2].clone()).collect();
    seen.sort();
    let mut want: Vec<String> = keys.iter().map(|k| format!("__keyspace@0__:{k}")).collect();
    want.sort();
    assert_eq!(seen, want);
    // an ordinary message on a pattern that also sees notifications comes once
    let mut all = Conn::connect(env.proxy.port());
    all.cmd(&["PSUBSCRIBE", "*plain-once"]);
    Conn::connect(env.owners.masters()[1]).cmd(&["PUBLISH", "plain-once", "once"]);
    assert_eq!(strs(&all.read_reply()), ["pmessage", "*plain-once", "plain-once", "once"]);
    assert!(next_within(&mut all, 300).is_none());
    // a PSUBSCRIBE that can see notifications is confirmed once every master subscribed
    // it: with another master than the home one stalled by a script for 600 ms, the
    // confirmation waits for it, and its notification then arrives
    let home = env.owners.of_slot(0);
    let slow = *env.owners.masters().iter().find(|&&m| m != home).unwrap();
    let stall = "local t0 = redis.call('TIME') \
        while true do local t = redis.call('TIME') \
        if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 600000 then break end end";
    let mut staller = Conn::connect(slow);
    staller.send(&["EVAL", stall, "0"]);
    std::thread::sleep(Duration::from_millis(100));
    let mut late = Conn::connect(env.proxy.port());
    let started = Instant::now();
    late.cmd(&["PSUBSCRIBE", "__keyspace@0__:ksl*"]);
    let waited = started.elapsed();
    let _ = staller.read_reply();
    assert!(waited >= Duration::from_millis(300), "confirmed after {waited:?}, before the stalled master subscribed");
    let key = channel_on(&env, slow, "ksl");
    assert!(c.cmd(&["SET", &key, "v"]).is_ok());
    assert_eq!(strs(&late.read_reply())[2], format!("__keyspace@0__:{key}"));
    for &port in &env.owners.masters() {
        Conn::connect(port).cmd(&["CONFIG", "SET", "notify-keyspace-events", ""]);
    }
}

#[test]
fn one_connection_subscribes_to_shard_channels_on_every_shard() {
    let env = env();
    let masters = env.owners.masters();
    let chans: Vec<String> = masters.iter().map(|&p| channel_on(&env, p, "shard")).collect();
    let mut sub = Conn::connect(env.proxy.port());
    // one at a time, and (unlike Redis Cluster, as one Redis allows) several slots at once
    sub.cmd(&["SSUBSCRIBE", &chans[0]]);
    sub.send(&["SSUBSCRIBE", &chans[1], &chans[2]]);
    assert_eq!(strs(&sub.read_reply()), ["ssubscribe", &chans[1], "2"]);
    assert_eq!(strs(&sub.read_reply()), ["ssubscribe", &chans[2], "3"]);
    for (ch, &port) in chans.iter().zip(&masters) {
        // published on the channel's owner, directly
        assert_eq!(Conn::connect(port).cmd(&["SPUBLISH", ch, "direct"]).int(), 1);
        assert_eq!(strs(&sub.read_reply()), ["smessage", ch, "direct"]);
        // and through heatshield
        assert_eq!(Conn::connect(env.proxy.port()).cmd(&["SPUBLISH", ch, "proxied"]).int(), 1);
        assert_eq!(strs(&sub.read_reply()), ["smessage", ch, "proxied"]);
    }
    let mut q = Conn::connect(env.proxy.port());
    let mut listed = strs(&q.cmd(&["PUBSUB", "SHARDCHANNELS", "shard*"]));
    listed.sort();
    let mut want = chans.clone();
    want.sort();
    assert_eq!(listed, want);
    let n = q.cmd(&["PUBSUB", "SHARDNUMSUB", &chans[0], "none"]);
    assert_eq!(strs(&n), [chans[0].as_str(), "1", "none", "0"]);
    sub.send(&["SUNSUBSCRIBE"]);
    for _ in 0..3 {
        assert_eq!(strs(&sub.read_reply())[0], "sunsubscribe");
    }
    assert_eq!(sub.cmd(&["PING"]).text(), "PONG", "subscribed to nothing: out of subscribe mode");
}

#[test]
fn introspection_counts_every_subscriber_once() {
    let env = env();
    let mut a = Conn::connect(env.proxy.port());
    let mut b = Conn::connect(env.proxy.port());
    a.cmd(&["SUBSCRIBE", "intro"]);
    b.cmd(&["SUBSCRIBE", "intro"]);
    b.send(&["PSUBSCRIBE", "intro-pat*"]);
    b.read_full();
    // a subscriber connected to a master directly counts too
    let mut d = Conn::connect(env.owners.masters()[2]);
    d.cmd(&["SUBSCRIBE", "intro"]);
    let mut q = Conn::connect(env.proxy.port());
    assert_eq!(strs(&q.cmd(&["PUBSUB", "NUMSUB", "intro", "none"])), ["intro", "3", "none", "0"]);
    // CLIENT LIST shows them as Redis does: flag P, the counts, TYPE pubsub
    let list = q.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]).text();
    assert!(list.lines().any(|l| l.contains(" flags=P ") && l.contains(" sub=1 psub=1 ssub=0 ")), "{list}");
    assert!(!list.contains("cmd=client|list"), "the asking client is not a subscriber: {list}");
    let normal = q.cmd(&["CLIENT", "LIST", "TYPE", "normal"]).text();
    assert!(normal.contains("cmd=client|list") && !normal.contains(" flags=P "), "{normal}");
    assert!(strs(&q.cmd(&["PUBSUB", "CHANNELS", "intro*"])) == ["intro"]);
    assert!(q.cmd(&["PUBSUB", "NUMPAT"]).int() >= 1);
    drop(a);
    wait_until(Duration::from_secs(5), "NUMSUB counts 2 after one left", || {
        strs(&q.cmd(&["PUBSUB", "NUMSUB", "intro"])) == ["intro", "2"]
    });
}

#[test]
fn resp3_messages_interleave_with_replies_in_order() {
    let env = env();
    let mut c = Conn::connect_proto(env.proxy.port(), Proto::Resp3);
    c.cmd(&["SUBSCRIBE", "r3"]);
    let mut p = Conn::connect(env.proxy.port());
    // replies keep their order; messages come between them, as pushes
    for i in 0..50 {
        let k = format!("{{r3}}k{i}");
        c.send(&["SET", &k, &i.to_string()]);
        p.cmd(&["PUBLISH", "r3", &format!("m{i}")]);
        c.send(&["GET", &k]);
    }
    let (mut replies, mut messages) = (Vec::new(), Vec::new());
    while replies.len() < 100 {
        let r = c.read_full();
        if r.raw.first() == Some(&b'>') {
            messages.push(strs(&r.v)[2].clone());
        } else {
            replies.push(r.v);
        }
    }
    while messages.len() < 50 {
        let r = c.read_full();
        assert_eq!(r.raw.first(), Some(&b'>'));
        messages.push(strs(&r.v)[2].clone());
    }
    for i in 0..50 {
        assert!(replies[2 * i].is_ok());
        assert_eq!(replies[2 * i + 1].text(), i.to_string());
        assert_eq!(messages[i], format!("m{i}"));
    }
}

#[test]
fn a_subscriber_that_does_not_read_is_cut_off_alone() {
    let env = env();
    let (_dir, path) = config_file(
        "[limits]\npubsub_output_soft_bytes = 1048576\npubsub_output_soft_seconds = 1\npubsub_output_hard_bytes = 4194304\n",
    );
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let mut slow = Conn::connect(proxy.port());
    slow.cmd(&["SUBSCRIBE", "flood"]);
    let mut fast = Conn::connect(proxy.port());
    fast.cmd(&["SUBSCRIBE", "flood"]);
    let payload = "x".repeat(16 * 1024);
    let mut p = Conn::connect(proxy.port());
    let n = 2000; // 32 MiB
    let got = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = got.clone();
    let reader = std::thread::spawn(move || {
        for _ in 0..n {
            let v = fast.read_reply();
            assert_eq!(strs(&v)[0], "message");
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let started = Instant::now();
    // in batches of 32 (512 KiB) the fast subscriber keeps up with
    for sent in (0..n).step_by(32) {
        wait_until(Duration::from_secs(20), "the fast subscriber keeps up", || {
            got.load(std::sync::atomic::Ordering::Relaxed) + 32 >= sent
        });
        for _ in sent..(sent + 32).min(n) {
            p.send(&["PUBLISH", "flood", &payload]);
        }
        for _ in sent..(sent + 32).min(n) {
            p.read_reply();
        }
    }
    reader.join().unwrap();
    // what the slow subscriber finds in its socket ends with the disconnect, long before
    // the 32 MiB published
    let (bytes, closed) = slow.read_until_close(Duration::from_secs(10));
    assert!(closed, "the slow subscriber was disconnected");
    assert!(bytes.len() < 16 << 20, "it got {} bytes", bytes.len());
    let log = proxy.log();
    assert!(log.contains("pubsub_"), "the reason is logged: {log}");
    eprintln!("flood of {n} messages took {:?}", started.elapsed());
}

#[test]
fn subscribe_commands_inside_multi_are_refused_at_queue_time() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    c.cmd(&["MULTI"]);
    assert!(c.cmd(&["SUBSCRIBE", "tx"]).is_err());
    assert!(c.cmd(&["EXEC"]).err().unwrap().starts_with("EXECABORT"));
    // the connection is not subscribed
    assert!(c.cmd(&["SET", "{tx}k", "v"]).is_ok());
}

fn role(port: u16) -> Option<String> {
    common::try_cmd(port, &["INFO", "replication"])
        .ok()
        .and_then(|r| r.as_text())
        .and_then(|t| common::info_field(&t, "role"))
}

/// What one subscriber saw of a numbered stream per channel: per channel, the numbers.
fn collect(sub: &mut Conn, until: Instant) -> std::collections::HashMap<String, Vec<u64>> {
    let mut seen: std::collections::HashMap<String, Vec<u64>> = Default::default();
    while Instant::now() < until {
        let Some(r) = next_within(sub, 200) else { continue };
        let v = strs(&r.v);
        if v[0] == "smessage" || v[0] == "message" {
            seen.entry(v[1].clone()).or_default().push(v[2].parse().unwrap());
        }
    }
    seen
}

/// Numbers missing from `got` up to the highest one.
fn gaps(got: &[u64]) -> usize {
    let max = got.iter().max().copied().unwrap_or(0) as usize;
    let set: std::collections::HashSet<u64> = got.iter().copied().collect();
    (1..=max).filter(|i| !set.contains(&(*i as u64))).count()
}

#[test]
fn subscriptions_follow_a_slot_migration_and_a_failover() {
    // a cluster of its own: this test moves a slot and fails a master over
    let env = ClusterEnv::start(None);
    let masters = env.owners.masters();
    let home = env.owners.of_slot(0);
    let others: Vec<u16> = masters.iter().copied().filter(|&m| m != home).collect();
    // one shard channel on the home master (it fails over), one on a master whose slot
    // moves, and a plain channel (it lives on the home master)
    let on_home = channel_on(&env, home, "fo-shard");
    let moving = channel_on(&env, others[0], "mv-shard");
    let (plain, all) = ("fo-plain".to_string(), [on_home.clone(), moving.clone()]);
    let mut sub = Conn::connect(env.proxy.port());
    sub.send(&["SSUBSCRIBE", &on_home, &moving]);
    sub.read_full();
    sub.read_full();
    sub.cmd(&["SUBSCRIBE", &plain]);
    let replica = env.cluster.replica_of(home);
    // a steady publisher through heatshield: every 5 ms a numbered message on each channel
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (port, flag) = (env.proxy.port(), stop.clone());
    let (chans, plain2) = (all.clone(), plain.clone());
    let publisher = std::thread::spawn(move || {
        let mut p = Conn::connect(port);
        let mut n = 0u64;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            n += 1;
            for ch in &chans {
                let _ = p.try_cmd(&["SPUBLISH", ch, &n.to_string()]);
            }
            let _ = p.try_cmd(&["PUBLISH", &plain2, &n.to_string()]);
            std::thread::sleep(Duration::from_millis(5));
        }
        n
    });
    let mut seen = collect(&mut sub, Instant::now() + Duration::from_millis(500));
    // the moving channel's slot goes to the third master
    let s = key_slot(moving.as_bytes()).to_string();
    let new_id = env.cluster.node_id(others[1]);
    for &m in &masters {
        assert_eq!(common::cmd_text(m, &["CLUSTER", "SETSLOT", &s, "NODE", &new_id]), "OK", "on {m}");
    }
    let moved_at = Instant::now();
    merge(&mut seen, collect(&mut sub, Instant::now() + Duration::from_secs(2)));
    // the home master fails over to its replica
    assert_eq!(common::cmd_text(replica, &["CLUSTER", "FAILOVER"]), "OK");
    wait_until(Duration::from_secs(20), "the replica to take over", || role(replica).as_deref() == Some("master"));
    let failed_over_at = Instant::now();
    merge(&mut seen, collect(&mut sub, Instant::now() + Duration::from_secs(3)));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let published = publisher.join().unwrap();
    merge(&mut seen, collect(&mut sub, Instant::now() + Duration::from_millis(500)));
    for ch in all.iter().chain([&plain]) {
        let got = seen.get(ch).cloned().unwrap_or_default();
        let last = got.iter().max().copied().unwrap_or(0);
        eprintln!(
            "{ch}: {} of {published} messages, {} missing (moved {:?} ago, failed over {:?} ago)",
            got.len(),
            gaps(&got),
            moved_at.elapsed(),
            failed_over_at.elapsed()
        );
        // the stream resumed after both events and runs to the end
        assert!(last + 3 >= published, "{ch}: last message {last} of {published}");
        // and nothing arrived twice
        let mut dedup = got.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), got.len(), "{ch}: duplicates");
    }
}

fn merge(into: &mut std::collections::HashMap<String, Vec<u64>>, more: std::collections::HashMap<String, Vec<u64>>) {
    for (k, v) in more {
        into.entry(k).or_default().extend(v);
    }
}

/// The soft limit on open files of this process (the proxy inherits the same).
fn open_files_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn connected_clients(port: u16) -> i64 {
    let info = common::cmd_text(port, &["INFO", "clients"]);
    common::info_field(&info, "connected_clients").unwrap().parse().unwrap()
}

#[test]
fn ten_thousand_subscribers_cost_redis_one_connection_per_master() {
    let env = env();
    // 10,000 where the open-file limit allows it (both processes need one per client)
    let n = 10_000.min(open_files_limit().saturating_sub(600)) / 100 * 100;
    let (_dir, path) = config_file("[server]\nmax_clients = 20000\n");
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let masters = env.owners.masters();
    let before: Vec<i64> = masters.iter().map(|&m| connected_clients(m)).collect();
    let rss_before = rss_kib(proxy.pid());
    let mut subs: Vec<Conn> = (0..n).map(|_| Conn::connect(proxy.port())).collect();
    for (i, c) in subs.iter_mut().enumerate() {
        c.send(&["SUBSCRIBE", &format!("many:{}", i % 100)]);
    }
    for c in subs.iter_mut() {
        assert_eq!(strs(&c.read_reply())[0], "subscribe");
    }
    let rss_after = rss_kib(proxy.pid());
    let per_sub = (rss_after.saturating_sub(rss_before)) as f64 / n as f64;
    let added: Vec<i64> = masters.iter().zip(&before).map(|(&m, b)| connected_clients(m) - b).collect();
    eprintln!(
        "{n} subscribers on 100 channels: {per_sub:.1} KiB RSS each; backend connections added per master: {added:?}"
    );
    // one shared subscription connection per master (and the usual shared connections),
    // not one per subscriber
    assert!(added.iter().all(|&a| a <= 8), "backend connections added: {added:?}");
    assert!(per_sub < 64.0, "{per_sub:.1} KiB per subscriber");
    let mut p = Conn::connect(proxy.port());
    for ch in 0..100 {
        assert_eq!(p.cmd(&["PUBLISH", &format!("many:{ch}"), "hi"]).int(), (n / 100) as i64);
    }
    for (i, c) in subs.iter_mut().enumerate() {
        assert_eq!(strs(&c.read_reply()), ["message", &format!("many:{}", i % 100), "hi"]);
    }
    drop(subs);
    wait_until(Duration::from_secs(10), "every subscriber gone", || {
        p.cmd(&["PUBSUB", "NUMSUB", "many:0"]).items()[1].int() == 0
    });
}

#[test]
fn subscriptions_are_bounded_for_the_whole_proxy() {
    let env = env();
    let (_dir, path) = config_file("[limits]\nmax_subscriptions = 3\n");
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let mut a = Conn::connect(proxy.port());
    a.send(&["SUBSCRIBE", "b1", "b2"]);
    a.read_full();
    a.read_full();
    let mut b = Conn::connect(proxy.port());
    // two more would pass the bound: refused whole, and the client is not subscribed
    let r = b.cmd(&["PSUBSCRIBE", "p1*", "p2*"]);
    assert_eq!(r.err(), Some("ERR heatshield: subscriptions are at limits.max_subscriptions (3)"));
    assert_eq!(b.cmd(&["PING"]).text(), "PONG");
    assert_eq!(strs(&b.cmd(&["SUBSCRIBE", "b3"])), ["subscribe", "b3", "1"]);
    // room again once a client leaves
    drop(a);
    wait_until(Duration::from_secs(5), "room again", || {
        !Conn::connect(proxy.port()).cmd(&["SUBSCRIBE", "b4"]).is_err()
    });
}

/// Right after its subscriber left (UNSUBSCRIBE, PUNSUBSCRIBE), a PUBLISH counts nobody,
/// also while heatshield's own unsubscription is still on its way to Redis.
#[test]
fn publish_right_after_the_last_unsubscribe_counts_nobody() {
    let env = env();
    let port = env.proxy.port();
    let mut publisher = Conn::connect(port);
    for round in 0..20 {
        let chans: Vec<String> = (0..3).map(|i| format!("gone:{round}:{i}")).collect();
        let pattern = format!("gonep:{round}:*");
        let mut sub = Conn::connect(port);
        let mut args = vec!["SUBSCRIBE"];
        args.extend(chans.iter().map(String::as_str));
        sub.send(&args);
        for _ in 0..3 {
            sub.read_reply();
        }
        sub.send(&["PSUBSCRIBE", &pattern]);
        sub.read_reply();
        sub.send(&["UNSUBSCRIBE"]);
        for _ in 0..3 {
            sub.read_reply();
        }
        sub.send(&["PUNSUBSCRIBE"]);
        sub.read_reply();
        for ch in &chans {
            assert_eq!(publisher.cmd(&["PUBLISH", ch, "m"]), V::Int(0), "round {round}, {ch}");
        }
        assert_eq!(publisher.cmd(&["PUBLISH", &format!("gonep:{round}:x"), "m"]), V::Int(0), "round {round}");
    }
}

/// A client that subscribes to a channel others keep live gets only what is published
/// after its SUBSCRIBE, as from Redis: a message published (and answered) before it was
/// still on its way to heatshield's shared link must not reach it.
#[test]
fn a_new_subscriber_gets_nothing_published_before_its_subscribe() {
    let env = env();
    let port = env.proxy.port();
    let ch = "before:live";
    // keeps the channel live on heatshield's link
    let mut keeper = Conn::connect(port);
    keeper.send(&["SUBSCRIBE", ch]);
    keeper.read_reply();
    let mut publisher = Conn::connect(port);
    for round in 0..200 {
        let before = format!("before-{round}");
        assert!(publisher.cmd(&["PUBLISH", ch, &before]).int() >= 1);
        let mut late = Conn::connect(port);
        late.send(&["SUBSCRIBE", ch]);
        late.read_reply();
        let after = format!("after-{round}");
        assert!(publisher.cmd(&["PUBLISH", ch, &after]).int() >= 2);
        let first = late.read_reply();
        assert_eq!(first, V::strs(&["message", ch, &after]), "round {round}");
    }
}
