//! The hot-key cache (docs/cache.md) against a real cluster: hot reads stay off Redis,
//! writes through the proxy are seen at once, writes made elsewhere (directly on the
//! master, through a second proxy, FLUSHALL) are seen within milliseconds, a killed
//! invalidation connection leaves nothing stale, big values are not cached, nil replies
//! are, MGET mixes cached and uncached keys, and rate limits skip cached reads unless a
//! rule says `count_cached`.
//!
//! The shared proxy uses a short detection window (200 ms) and a low threshold (500
//! reads/s) so keys turn hot quickly. Tests that read a master's `INFO commandstats` take
//! the write side of the harness's traffic lock; the others hold the read side.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, V};
use common::{ClusterEnv, Proxy, Shared, cmd_text, cmdstat_calls, config_file, exclusive_traffic, shared_traffic};

const CONFIG: &str = r#"
[cache]
window_ms = 200
hot_threshold = 500
never = ["hc:never:*"]
pin = ["hc:pin:*"]

[ratelimit]
[[ratelimit.rules]]
name = "free"
pattern = "hc:rl:free"
commands = "reads"
rate = 5
burst = 5

[[ratelimit.rules]]
name = "tx"
pattern = "hc:rl:tx"
commands = "writes"
rate = 1
burst = 2

[[ratelimit.rules]]
name = "counted"
pattern = "hc:rl:counted"
commands = "reads"
rate = 5
burst = 5
count_cached = true
"#;

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(Some(CONFIG)))
}

/// `PROXY CACHE STATS` field.
fn stat(c: &mut Conn, name: &str) -> i64 {
    let r = c.cmd(&["PROXY", "CACHE", "STATS"]);
    r.get(name).unwrap_or_else(|| panic!("no {name} in {r:?}")).int()
}

/// Whether `PROXY HOTKEYS` lists `key`, and with a cached reply.
fn hot_state(c: &mut Conn, key: &str) -> Option<bool> {
    let r = c.cmd(&["PROXY", "HOTKEYS", "COUNT", "1000"]);
    r.items()
        .iter()
        .find(|e| e.get("key").map(|k| k.text()) == Some(key.to_string()))
        .map(|e| e.get("cached").unwrap().int() == 1)
}

/// Reads `cmd` through `c` until `key` is hot and a reply of it is cached.
fn make_hot(c: &mut Conn, key: &str, cmd: &[&str]) {
    let start = Instant::now();
    loop {
        for _ in 0..200 {
            c.cmd(cmd);
        }
        if hot_state(c, key) == Some(true) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{key} never became hot and cached");
    }
}

#[test]
fn hot_key_reads_stay_off_redis() {
    let e = env();
    let _q = exclusive_traffic();
    let key = "hc:hot:1";
    let master = e.owners.of_key(key.as_bytes());
    let mut c = Conn::connect(e.proxy.port());
    assert_eq!(c.cmd(&["SET", key, "v1"]), V::ok());
    make_hot(&mut c, key, &["GET", key]);
    let before = cmdstat_calls(master, "get");
    let hits_before = stat(&mut c, "hits");
    for _ in 0..20_000 {
        assert_eq!(c.cmd(&["GET", key]), V::s("v1"));
    }
    let reached = cmdstat_calls(master, "get") - before;
    let hits = stat(&mut c, "hits") - hits_before;
    println!("20000 GETs of a hot key: {reached} reached the master, {hits} cache hits");
    assert!(reached <= 5, "{reached} GETs reached the master");
    assert!(hits >= 19_995, "{hits} hits");
}

#[test]
fn writes_through_the_proxy_are_seen_at_once() {
    let e = env();
    let _q = shared_traffic();
    let key = "hc:w:1";
    let mut w = Conn::connect(e.proxy.port());
    let mut r = Conn::connect(e.proxy.port());
    assert_eq!(w.cmd(&["SET", key, "0"]), V::ok());
    make_hot(&mut r, key, &["GET", key]);
    // every kind of write invalidates, not just SET
    let steps: Vec<(Vec<&str>, &str)> = vec![
        (vec!["SET", key, "10"], "10"),
        (vec!["INCR", key], "11"),
        (vec!["INCRBY", key, "5"], "16"),
        (vec!["APPEND", key, "x"], "16x"),
        (vec!["SETRANGE", key, "0", "9"], "96x"),
        (vec!["GETSET", key, "a"], "a"),
        (vec!["MSET", key, "b", "hc:w:other", "z"], "b"),
        (vec!["EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", key, "lua"], "lua"),
        (vec!["SET", key, "c"], "c"),
    ];
    for (cmd, want) in steps {
        // the reader's cached value is current before each write
        let _ = r.cmd(&["GET", key]);
        let reply = w.cmd(&cmd);
        assert!(!reply.is_err(), "{cmd:?}: {reply:?}");
        assert_eq!(r.cmd(&["GET", key]), V::s(want), "after {cmd:?}");
        assert_eq!(w.cmd(&["GET", key]), V::s(want), "writer after {cmd:?}");
    }
    // pipelined SET then GET on one connection: the GET sees the SET
    for i in 0..200 {
        let v = format!("p{i}");
        w.send(&["SET", key, &v]);
        w.send(&["GET", key]);
        assert_eq!(w.read_reply(), V::ok());
        assert_eq!(w.read_reply(), V::s(&v), "pipelined GET after SET {v}");
        assert_eq!(r.cmd(&["GET", key]), V::s(&v));
    }
    // DEL and EXPIRE
    assert_eq!(w.cmd(&["DEL", key]).int(), 1);
    assert!(r.cmd(&["GET", key]).is_nil());
}

#[test]
fn writes_inside_a_transaction_are_seen_at_once() {
    let e = env();
    // alone: the write invalidations counted below are this test's
    let _q = exclusive_traffic();
    let key = "hc:tx:1";
    let mut w = Conn::connect(e.proxy.port());
    let mut r = Conn::connect(e.proxy.port());
    assert_eq!(w.cmd(&["SET", key, "0"]), V::ok());
    make_hot(&mut r, key, &["GET", key]);
    let hits = stat(&mut r, "hits");
    let dropped = stat(&mut r, "invalidations_write");
    for i in 1..=100 {
        // the reader's cached value is current before each transaction
        assert_eq!(r.cmd(&["GET", key]), V::s((i - 1).to_string()));
        assert_eq!(w.cmd(&["MULTI"]), V::ok());
        assert_eq!(w.cmd(&["INCR", key]), V::s("QUEUED"));
        assert_eq!(w.cmd(&["EXEC"]), V::Arr(vec![V::Int(i)]));
        // a read that starts after EXEC's reply sees the write, from any connection
        assert_eq!(r.cmd(&["GET", key]), V::s(i.to_string()), "reader after transaction {i}");
    }
    assert!(stat(&mut r, "hits") > hits, "the reads were not served from the cache at all");
    // heatshield itself dropped the key for each transaction, when EXEC was sent and again
    // before its reply (not only Redis's tracking message, which comes on another connection)
    let dropped = stat(&mut r, "invalidations_write") - dropped;
    assert!(dropped >= 200, "{dropped} write invalidations for 100 transactions");
    assert_eq!(w.cmd(&["DEL", key]).int(), 1);
}

#[test]
fn commands_queued_in_a_transaction_are_rate_limited_as_if_sent_alone() {
    let e = env();
    let key = "hc:rl:tx";
    let mut c = Conn::connect(e.proxy.port());
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    // burst 2: two writes are queued, the third is over the rule's budget
    assert_eq!(c.cmd(&["SET", key, "a"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["SET", key, "b"]), V::s("QUEUED"));
    let r = c.cmd(&["SET", key, "c"]);
    assert!(r.err().is_some_and(|t| t.starts_with("THROTTLED key 'hc:rl:tx'")), "{r:?}");
    assert_eq!(c.cmd(&["EXEC"]), V::Err("EXECABORT Transaction discarded because of previous errors.".into()));
    assert!(c.cmd(&["GET", key]).is_nil(), "part of an aborted transaction ran");
}

/// Several readers through the proxy while a writer increments the key every 50 ms,
/// alternating between the proxy and the master directly. A read that starts after a
/// write through the proxy was acknowledged must see it; for direct writes the delay until
/// the proxy serves them is measured, and must stay well under the 50 ms until the next
/// write (which would hide a lost invalidation).
#[test]
fn stale_read_torture() {
    let e = env();
    let _q = shared_traffic();
    let key = "hc:torture";
    let master = e.owners.of_key(key.as_bytes());
    let mut w = Conn::connect(e.proxy.port());
    assert_eq!(w.cmd(&["SET", key, "0"]), V::ok());
    make_hot(&mut w, key, &["GET", key]);
    let hits_before = stat(&mut w, "hits");

    const WRITES: i64 = 100;
    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..4 {
        let (stop, port) = (stop.clone(), e.proxy.port());
        readers.push(thread::spawn(move || {
            let mut c = Conn::connect(port);
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = epoch.elapsed();
                let v: i64 = c.cmd(&["GET", key]).text().parse().unwrap();
                seen.push((t, v));
            }
            seen
        }));
    }
    // (value, acknowledged at, direct) for every write
    let mut acks: Vec<(i64, Duration, bool)> = Vec::new();
    let mut direct = Conn::connect(master);
    for i in 1..=WRITES {
        let is_direct = i % 2 == 0;
        let c = if is_direct { &mut direct } else { &mut w };
        assert_eq!(c.cmd(&["INCR", key]).int(), i);
        acks.push((i, epoch.elapsed(), is_direct));
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let reads: Vec<(Duration, i64)> = readers.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let mut proxy_violations = 0;
    let mut worst_direct = Duration::ZERO;
    for &(t, v) in &reads {
        // writes acknowledged before this read started that it did not see
        for &(n, at, is_direct) in acks.iter().filter(|(n, at, _)| *at <= t && *n > v) {
            if is_direct {
                worst_direct = worst_direct.max(t - at);
            } else {
                proxy_violations += 1;
                eprintln!("read at {t:?} saw {v}, but write {n} was acknowledged through the proxy at {at:?}");
            }
        }
    }
    let hits = stat(&mut w, "hits") - hits_before;
    println!(
        "torture: {} reads by 4 readers, {WRITES} writes (half direct, 50 ms apart); stale after a proxy write: {proxy_violations}; worst delay before a direct write was served: {worst_direct:?}; cache hits {hits}",
        reads.len()
    );
    assert_eq!(proxy_violations, 0, "reads missed writes acknowledged through the proxy");
    assert!(worst_direct < Duration::from_millis(35), "a direct write took {worst_direct:?} to be served");
    assert!(hits > 1000, "only {hits} reads were answered from the cache: not a test of the cache");
}

#[test]
fn a_second_proxy_sees_writes_through_the_first() {
    let e = env();
    let _q = shared_traffic();
    let (conf, path) = config_file(CONFIG);
    let other = Proxy::start_cluster(&e.cluster, &["--config", &path]);
    let key = "hc:two";
    let mut a = Conn::connect(e.proxy.port());
    let mut b = Conn::connect(other.port());
    assert_eq!(a.cmd(&["SET", key, "0"]), V::ok());
    make_hot(&mut b, key, &["GET", key]);
    let mut worst = Duration::ZERO;
    for i in 1..=50 {
        let v = i.to_string();
        assert_eq!(a.cmd(&["SET", key, &v]), V::ok());
        let t = Instant::now();
        while b.cmd(&["GET", key]) != V::s(&v) {
            assert!(t.elapsed() < Duration::from_secs(1), "proxy B still stale 1 s after write {i}");
        }
        worst = worst.max(t.elapsed());
    }
    println!("second proxy: worst delay before a write through the first was served: {worst:?}");
    assert!(worst < Duration::from_millis(100));
    drop(conf);
}

#[test]
fn killed_invalidation_connection_leaves_nothing_stale() {
    let e = env();
    let _q = shared_traffic();
    let key = "hc:kill";
    let master = e.owners.of_key(key.as_bytes());
    let mut c = Conn::connect(e.proxy.port());
    let mut direct = Conn::connect(master);
    assert_eq!(c.cmd(&["SET", key, "before"]), V::ok());
    make_hot(&mut c, key, &["GET", key]);
    let list = direct.cmd(&["CLIENT", "LIST"]).text();
    let ids: Vec<&str> = list
        .lines()
        .filter(|l| l.contains("name=heatshield-invalidations"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .collect();
    assert_eq!(ids.len(), 1, "one invalidation connection per proxy on the master: {list}");
    assert_eq!(direct.cmd(&["CLIENT", "KILL", "ID", ids[0]]).int(), 1);
    // give the proxy a moment to notice the closed socket
    thread::sleep(Duration::from_millis(50));
    assert_eq!(direct.cmd(&["SET", key, "after"]), V::ok());
    for _ in 0..2000 {
        assert_eq!(c.cmd(&["GET", key]), V::s("after"), "stale read after the invalidation connection was killed");
    }
    // tracking comes back: the key is cached again and direct writes are still seen
    make_hot(&mut c, key, &["GET", key]);
    assert_eq!(direct.cmd(&["SET", key, "again"]), V::ok());
    let t = Instant::now();
    while c.cmd(&["GET", key]) != V::s("again") {
        assert!(t.elapsed() < Duration::from_secs(1), "direct write not seen after tracking was restored");
    }
}

#[test]
fn big_values_are_not_cached_and_nil_is() {
    let e = env();
    let _q = shared_traffic();
    let mut c = Conn::connect(e.proxy.port());
    let big = "x".repeat(100 * 1024);
    assert_eq!(c.cmd(&["SET", "hc:big", &big]), V::ok());
    let too_big = stat(&mut c, "fills_too_big");
    let start = Instant::now();
    while hot_state(&mut c, "hc:big").is_none() {
        for _ in 0..100 {
            assert_eq!(c.cmd(&["GET", "hc:big"]).bytes().len(), big.len());
        }
        assert!(start.elapsed() < Duration::from_secs(20), "big key never hot");
    }
    for _ in 0..200 {
        assert_eq!(c.cmd(&["GET", "hc:big"]).bytes().len(), big.len());
    }
    assert_eq!(hot_state(&mut c, "hc:big"), Some(false), "a 100 KiB value was cached");
    assert!(stat(&mut c, "fills_too_big") > too_big);

    // a missing key: nil is cached, then a SET (through the proxy, then directly) replaces it
    let key = "hc:nil";
    assert!(c.cmd(&["GET", key]).is_nil());
    make_hot(&mut c, key, &["GET", key]);
    let hits = stat(&mut c, "hits");
    for _ in 0..100 {
        assert!(c.cmd(&["GET", key]).is_nil());
    }
    assert!(stat(&mut c, "hits") >= hits + 100, "nil replies were not served from the cache");
    assert_eq!(c.cmd(&["SET", key, "now"]), V::ok());
    assert_eq!(c.cmd(&["GET", key]), V::s("now"));
    make_hot(&mut c, key, &["GET", key]);
    let mut direct = Conn::connect(e.owners.of_key(key.as_bytes()));
    assert_eq!(direct.cmd(&["DEL", key]).int(), 1);
    let t = Instant::now();
    while !c.cmd(&["GET", key]).is_nil() {
        assert!(t.elapsed() < Duration::from_secs(1), "direct DEL not seen");
    }
}

#[test]
fn mget_mixes_cached_and_uncached_keys() {
    let e = env();
    let _q = shared_traffic();
    let mut c = Conn::connect(e.proxy.port());
    let keys = ["hc:mg:hot", "hc:mg:a", "hc:mg:b", "hc:mg:c", "hc:mg:missing"];
    for k in &keys[..4] {
        assert_eq!(c.cmd(&["SET", k, &format!("v-{k}")]), V::ok());
    }
    make_hot(&mut c, keys[0], &["GET", keys[0]]);
    let hits = stat(&mut c, "hits");
    let want = V::Arr(vec![V::s("v-hc:mg:hot"), V::s("v-hc:mg:a"), V::s("v-hc:mg:b"), V::s("v-hc:mg:c"), V::Nil]);
    for _ in 0..50 {
        assert_eq!(c.cmd(&["MGET", keys[0], keys[1], keys[2], keys[3], keys[4]]), want);
    }
    assert!(stat(&mut c, "hits") >= hits + 50, "MGET did not use the cached key");
    // a write to the hot key through the proxy is seen by the next MGET
    assert_eq!(c.cmd(&["SET", keys[0], "new"]), V::ok());
    assert_eq!(c.cmd(&["MGET", keys[0], keys[1]]), V::Arr(vec![V::s("new"), V::s("v-hc:mg:a")]));
}

#[test]
fn resp3_and_resp2_clients_get_their_own_protocol_from_the_cache() {
    let e = env();
    let _q = shared_traffic();
    let key = "hc:h";
    let mut c2 = Conn::connect(e.proxy.port());
    let mut c3 = Conn::connect_proto(e.proxy.port(), Proto::Resp3);
    assert_eq!(c2.cmd(&["HSET", key, "f", "1", "g", "2"]).int(), 2);
    make_hot(&mut c2, key, &["HGETALL", key]);
    make_hot(&mut c3, key, &["HGETALL", key]);
    let r2 = c2.cmd_full(&["HGETALL", key]);
    let r3 = c3.cmd_full(&["HGETALL", key]);
    assert!(r2.raw.starts_with(b"*4\r\n"), "RESP2 HGETALL from the cache: {:?}", String::from_utf8_lossy(&r2.raw));
    assert!(r3.raw.starts_with(b"%2\r\n"), "RESP3 HGETALL from the cache: {:?}", String::from_utf8_lossy(&r3.raw));
    assert_eq!(c2.cmd(&["HSET", key, "f", "9"]).int(), 0);
    assert_eq!(c3.cmd(&["HGET", key, "f"]), V::s("9"));
    assert_eq!(c3.cmd(&["HGETALL", key]).get("f"), Some(V::s("9")));
}

#[test]
fn flushall_on_the_master_empties_the_cache() {
    let e = env();
    let _q = exclusive_traffic();
    let key = "hc:flush";
    let master = e.owners.of_key(key.as_bytes());
    let mut c = Conn::connect(e.proxy.port());
    assert_eq!(c.cmd(&["SET", key, "v"]), V::ok());
    make_hot(&mut c, key, &["GET", key]);
    assert_eq!(cmd_text(master, &["FLUSHALL"]).trim(), "OK");
    let t = Instant::now();
    while !c.cmd(&["GET", key]).is_nil() {
        assert!(t.elapsed() < Duration::from_secs(1), "FLUSHALL on the master not seen");
    }
    println!("FLUSHALL on the master seen after {:?}", t.elapsed());
}

#[test]
fn never_patterns_are_not_cached() {
    let e = env();
    let _q = shared_traffic();
    let key = "hc:never:1";
    let mut c = Conn::connect(e.proxy.port());
    assert_eq!(c.cmd(&["SET", key, "v"]), V::ok());
    let start = Instant::now();
    while hot_state(&mut c, key).is_none() {
        for _ in 0..200 {
            c.cmd(&["GET", key]);
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never-cached key not reported hot");
    }
    for _ in 0..200 {
        c.cmd(&["GET", key]);
    }
    assert_eq!(hot_state(&mut c, key), Some(false));
}

#[test]
fn rate_limits_skip_cached_reads_unless_count_cached() {
    let e = env();
    let _q = shared_traffic();
    let mut c = Conn::connect(e.proxy.port());
    for key in ["hc:rl:free", "hc:rl:counted"] {
        assert_eq!(c.cmd(&["SET", key, "v"]), V::ok());
    }
    // 5/s burst 5: reads that reach Redis are limited; once the key is cached, they are not
    let key = "hc:rl:free";
    let start = Instant::now();
    let mut ok_after_hot = 0;
    while ok_after_hot < 1000 {
        let r = c.cmd(&["GET", key]);
        if hot_state(&mut c, key) == Some(true) {
            assert_eq!(r, V::s("v"), "a cached read was throttled");
            ok_after_hot += 1;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "free key never cached");
    }
    // count_cached: the same pressure is throttled even from the cache
    let key = "hc:rl:counted";
    let start = Instant::now();
    let (mut ok, mut throttled) = (0, 0);
    while start.elapsed() < Duration::from_secs(2) {
        match c.cmd(&["GET", key]) {
            V::Err(e) if e.starts_with("THROTTLED") => throttled += 1,
            v => {
                assert_eq!(v, V::s("v"));
                ok += 1
            }
        }
    }
    // rate 5/s burst 5 over 2 s: about 15 admitted, though the key is cached by now
    assert!((10..=20).contains(&ok), "{ok} admitted, {throttled} throttled");
    // a count, not a speed: a loaded 2-core machine may manage only a few hundred round trips
    assert!(throttled >= 100, "{ok} admitted, only {throttled} throttled");
    assert_eq!(hot_state(&mut c, key), Some(true), "the counted key was never cached");
}

#[test]
fn pinned_keys_are_cached_without_being_hot_and_flush_drops_them() {
    let e = env();
    // exclusive: the cache's counters must be this test's alone
    let _q = exclusive_traffic();
    let key = "hc:pin:config";
    let mut c = Conn::connect(e.proxy.port());
    assert_eq!(c.cmd(&["SET", key, "blob"]), V::ok());
    assert_eq!(c.cmd(&["GET", key]), V::s("blob")); // fills
    let hits = stat(&mut c, "hits");
    for _ in 0..10 {
        assert_eq!(c.cmd(&["GET", key]), V::s("blob"));
    }
    assert_eq!(stat(&mut c, "hits"), hits + 10, "a pinned key read 10 times was not served from the cache");
    assert_eq!(hot_state(&mut c, key), None, "10 reads do not make a key hot");
    // PROXY CACHE FLUSH drops it: the next read misses
    assert_eq!(c.cmd(&["PROXY", "CACHE", "FLUSH"]), V::ok());
    let misses = stat(&mut c, "misses");
    assert_eq!(c.cmd(&["GET", key]), V::s("blob"));
    assert_eq!(stat(&mut c, "misses"), misses + 1);
}

/// A hot key whose slot moves to another master: after the move, a write made directly on
/// the new owner is what the proxy serves.
#[test]
fn slot_migration_drops_entries_of_the_moved_slot() {
    let e = env();
    let _q = shared_traffic();
    let key = "hc:{migrating}:k";
    let slot = common::key_slot(key.as_bytes()).to_string();
    let src = e.owners.of_key(key.as_bytes());
    let dst = *e.owners.masters().iter().find(|&&p| p != src).unwrap();
    let (src_id, dst_id) = (e.cluster.node_id(src), e.cluster.node_id(dst));
    let mut c = Conn::connect(e.proxy.port());
    assert_eq!(c.cmd(&["SET", key, "on-source"]), V::ok());
    make_hot(&mut c, key, &["GET", key]);

    assert_eq!(cmd_text(dst, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]), "OK");
    assert_eq!(cmd_text(src, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]), "OK");
    let dst_port = dst.to_string();
    assert_eq!(cmd_text(src, &["MIGRATE", "127.0.0.1", &dst_port, "", "0", "5000", "KEYS", key]), "OK");
    for m in e.owners.masters() {
        assert_eq!(cmd_text(m, &["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]), "OK");
    }
    assert_eq!(cmd_text(dst, &["SET", key, "on-target"]), "OK");
    for _ in 0..500 {
        assert_eq!(c.cmd(&["GET", key]), V::s("on-target"), "stale read after the slot moved");
    }
    // and it is cached again from its new owner, still invalidated by direct writes there
    make_hot(&mut c, key, &["GET", key]);
    assert_eq!(cmd_text(dst, &["SET", key, "again"]), "OK");
    let t = Instant::now();
    while c.cmd(&["GET", key]) != V::s("again") {
        assert!(t.elapsed() < Duration::from_secs(1), "direct write on the new owner not seen");
    }
}
