//! The feature × path matrix (issue: every feature on every path): each feature a row,
//! each way a request can take through heatshield a column, every cell tried against a
//! real 3+3 cluster through one heatshield that has everything configured at once
//! (colocation, rate rules, ACL users, a read rule, pinned keys). A cell that does not
//! apply is a line in docs/architecture.md's table, not a test.
//!
//! Every row is tried on two families of keys: `pl:*`, stored under its own name, and
//! `mx:*`, which a colocation rule stores under the tag `{mx}`. A feature whose rules are
//! written for the client's names (rate limits, ACL key patterns, read rules, pins) must
//! answer the same for both: the seam this file exists for is a path that sees the stored
//! name where the others see the client's.
//!
//! Columns: single command, pipeline, split multi-key command, MULTI / EXEC, WATCH + EXEC,
//! EVAL, EVALSHA, FCALL, blocking command, lock command, replica read, cache hit.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::client::{Conn, V, args};
use common::{Proxy, RedisCluster, Shared, cmdstat_calls, config_file, key_slot, wait_until};

const CONF: &str = r#"
[server]
users = [
  "mxu on >mxpw %R~pl:ro:* %R~mx:ro:* ~pl:rw:* ~mx:rw:* +@all",
  "cmdu on >cmdpw ~* &* +@all -set -mset -eval -evalsha -fcall -blpop -blmove -lock.acquire -get -publish -subscribe",
  "chu on >chpw ~* resetchannels &news:* +@all",
]

[cache]
pin = ["*:pin:*"]

# the big-key row: requests of 2 KiB or more are noted under their first key
[admin]
bigkey_bytes = 2048
# the slow log's row: every command is logged, and enough of them kept
slowlog_slower_than_us = 0
slowlog_max_len = 100000

[[colocate]]
name = "mx"
keys = ["mx:*"]
tag = "mx"

[[backend.read_rules]]
pattern = "*:rr:*"
read_from = "replica"
max_lag_ms = 5000

# the cache-hit column: reads answered from the cache count here
[[ratelimit.rules]]
name = "pins"
pattern = "*:rl:pin:*"
commands = "reads"
rate = 1
burst = 1
count_cached = true

[[ratelimit.rules]]
name = "mx"
pattern = "mx:rl:*"
commands = "all"
rate = 1
burst = 1

[[ratelimit.rules]]
name = "pl"
pattern = "pl:rl:*"
commands = "all"
rate = 1
burst = 1
"#;

struct Env {
    cluster: RedisCluster,
    proxy: Proxy,
    _dir: tempfile::TempDir,
}

static ENV: Shared<Env> = Shared::new();

fn env() -> Arc<Env> {
    ENV.get(|| {
        let cluster = RedisCluster::start();
        let (dir, path) = config_file(CONF);
        let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
        let mut c = Conn::connect(proxy.port());
        let lib = "#!lua name=mxlib\nredis.register_function('mxset', function(keys, args) return redis.call('SET', keys[1], args[1]) end)";
        assert_eq!(c.cmd(&["FUNCTION", "LOAD", "REPLACE", lib]), V::s("mxlib"));
        Env { cluster, proxy, _dir: dir }
    })
}

/// The two families: stored under its own name, and colocated under `{mx}`.
const FAMILIES: [&str; 2] = ["pl", "mx"];

/// A key unique to this run and cell.
fn key(family: &str, area: &str, cell: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{family}:{area}:{cell}:{}:{n}", std::process::id())
}

/// Where a key lives: its own slot, or its tag's under the colocation rule.
fn stored_slot(k: &str) -> u16 {
    if k.starts_with("mx:") { key_slot(b"mx") } else { key_slot(k.as_bytes()) }
}

/// A key of no rule in another slot than `k`'s, for a split command.
fn elsewhere(k: &str) -> String {
    (0..).map(|i| format!("zz:{{{i}}}")).find(|o| key_slot(o.as_bytes()) != stored_slot(k)).unwrap()
}

/// The tests share the cluster's replicas, and three of them count a replica's GETs
/// (`INFO commandstats`) around their own reads: a count is taken with no other test's
/// replica read (of a `*:rr:*` key) in flight. Every replica read of these tests holds
/// [`replica_reads`]; a count holds [`replica_count`]. (Without it a count once saw
/// another test's read: 2 GETs, not 1.)
static REPLICA_GETS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn replica_reads() -> std::sync::RwLockReadGuard<'static, ()> {
    REPLICA_GETS.read().unwrap_or_else(|e| e.into_inner())
}

fn replica_count() -> std::sync::RwLockWriteGuard<'static, ()> {
    REPLICA_GETS.write().unwrap_or_else(|e| e.into_inner())
}

fn throttled(v: &V) -> bool {
    v.err().is_some_and(|e| e.starts_with("THROTTLED"))
}

/// The ways one write of `k` can take; each runs `n` attempts on `c` and returns each
/// attempt's reply (the transaction's EXEC for the transaction columns, and for those the
/// QUEUED-time refusal when there was one).
#[derive(Clone, Copy, Debug)]
enum Path {
    Single,
    Pipeline,
    Split,
    Multi,
    Watch,
    Eval,
    Evalsha,
    Fcall,
    Blocking,
    Lock,
}

const WRITE_PATHS: [Path; 10] = [
    Path::Single,
    Path::Pipeline,
    Path::Split,
    Path::Multi,
    Path::Watch,
    Path::Eval,
    Path::Evalsha,
    Path::Fcall,
    Path::Blocking,
    Path::Lock,
];

const SET_SCRIPT: &str = "return redis.call('SET', KEYS[1], ARGV[1])";

/// Runs `n` attempts of a command on `k` by `path`; each attempt's outcome: the reply a
/// client reads as the command's result (for a transaction: the refusal at queue time,
/// else EXEC's reply).
fn attempts(c: &mut Conn, path: Path, k: &str, n: usize) -> Vec<V> {
    writes(c, path, k, "v", n)
}

/// [`attempts`] writing `v` (the blocking path moves an element onto list `k`; the lock
/// path takes lock `k`).
fn writes(c: &mut Conn, path: Path, k: &str, v: &str, n: usize) -> Vec<V> {
    match path {
        Path::Single => (0..n).map(|_| c.cmd(&["SET", k, v])).collect(),
        Path::Pipeline => {
            let cmds: Vec<Vec<Vec<u8>>> = (0..n).map(|_| args(&["SET", k, v])).collect();
            c.pipeline(&cmds)
        }
        Path::Split => {
            let other = elsewhere(k);
            (0..n).map(|_| c.cmd(&["MSET", k, v, &other, v])).collect()
        }
        Path::Multi | Path::Watch => (0..n)
            .map(|_| {
                if matches!(path, Path::Watch) {
                    assert_eq!(c.cmd(&["WATCH", k]), V::ok());
                }
                assert_eq!(c.cmd(&["MULTI"]), V::ok());
                let queued = c.cmd(&["SET", k, v]);
                let exec = c.cmd(&["EXEC"]);
                if queued == V::s("QUEUED") { exec } else { queued }
            })
            .collect(),
        Path::Eval => (0..n).map(|_| c.cmd(&["EVAL", SET_SCRIPT, "1", k, v])).collect(),
        Path::Evalsha => {
            let sha = c.cmd(&["SCRIPT", "LOAD", SET_SCRIPT]).text();
            (0..n).map(|_| c.cmd(&["EVALSHA", &sha, "1", k, v])).collect()
        }
        Path::Fcall => (0..n).map(|_| c.cmd(&["FCALL", "mxset", "1", k, v])).collect(),
        // (a list key; BLPOP times out at once: an admitted attempt answers nil)
        Path::Blocking => (0..n).map(|_| c.cmd(&["BLPOP", k, "0.01"])).collect(),
        Path::Lock => (0..n).map(|_| c.cmd(&["LOCK.ACQUIRE", k, v, "10000"])).collect(),
    }
}

/// Five attempts made within `took` against a rule of 1/s with a burst of 1: exactly one
/// admitted, the others refused with THROTTLED and nothing else (not judged when the
/// attempts took long enough for the budget to refill).
fn one_admitted(cell: &str, replies: &[V], took: Duration, failures: &mut Vec<String>) {
    assert!(replies.iter().all(|v| !v.is_err() || throttled(v)), "{cell}: {replies:?}");
    if took >= Duration::from_millis(900) {
        eprintln!("{cell}: took {took:?}, the budget may have refilled; not judged");
        return;
    }
    let admitted = replies.iter().filter(|v| !throttled(v)).count();
    if admitted != 1 {
        failures.push(format!("{cell}: {admitted} of 5 admitted: {replies:?}"));
    }
}

/// Per-key rate limit (1/s, burst 1) × every write path, for a key stored under its own
/// name and one colocated: five attempts within a second, exactly one admitted. Before the
/// admission step was one, MULTI and WATCH admitted all five colocated ones (the queued
/// command's check saw the stored name `{mx}mx:...`, which the rule does not match).
#[test]
fn rate_limit_on_every_write_path() {
    let env = env();
    let mut failures = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let k = key(family, "rl", &format!("{path:?}"));
            let mut c = Conn::connect(env.proxy.port());
            let started = Instant::now();
            let replies = attempts(&mut c, path, &k, 5);
            one_admitted(&format!("{family} {path:?}"), &replies, started.elapsed(), &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Per-key rate limit × replica read and cache hit: a read rule sends `*:rr:*` to the
/// replicas (checked on the replica's own counters), and a pinned key is answered from the
/// cache (checked in `PROXY CACHE STATS`); the rule on both counts the reads.
#[test]
fn rate_limit_on_replica_reads_and_cache_hits() {
    let env = env();
    let port = env.proxy.port();
    for family in FAMILIES {
        // replica reads: a key of a slot whose replica is known to be in sync
        let reads = replica_reads();
        let k = key(family, "rr", "rl");
        let warm = format!("{k}:warm");
        let (k, warm) = match family {
            // (one slot for both, so one replica serves both)
            "pl" => (format!("{{{k}}}:k"), format!("{{{k}}}:warm")),
            _ => (k, warm),
        };
        let mut c = Conn::connect(port);
        assert_eq!(c.cmd(&["SET", &k, "v"]), V::ok());
        assert_eq!(c.cmd(&["SET", &warm, "v"]), V::ok());
        // (reads of a client that wrote wait for its write to reach the replica: the
        // reads here are another client's)
        let mut r = Conn::connect(port);
        wait_until(Duration::from_secs(20), "a replica in sync", || r.cmd(&["GET", &warm]) == V::s("v"));
        let replica = env.cluster.replica_of(env.cluster.master_for_slot(stored_slot(&k)));
        // (the read rule is "replica": without a replica in sync the read would fail)
        let rule = format!("rr-{family}");
        assert_eq!(c.cmd(&["PROXY", "RATELIMIT", "SET", &rule, &k, "1", "1", "per-key", "all"]), V::ok());
        drop(reads);
        let alone = replica_count();
        let before = cmdstat_calls(replica, "get");
        let replies: Vec<V> = (0..5).map(|_| r.cmd(&["GET", &k])).collect();
        let admitted = replies.iter().filter(|v| **v == V::s("v")).count();
        assert_eq!(admitted, 1, "{family} replica read: {replies:?}");
        assert!(replies.iter().filter(|v| **v != V::s("v")).all(throttled), "{replies:?}");
        let gets = cmdstat_calls(replica, "get") - before;
        drop(alone);
        assert_eq!(gets, 1, "{family}: the admitted read on the replica");
        assert_eq!(c.cmd(&["PROXY", "RATELIMIT", "DEL", &rule]), V::Int(1));

        // cache hits: the first read fills the pinned key's entry, a second later (one
        // more in the budget) five reads: one answered from the cache, four refused
        let k = key(family, "rl:pin", "hit");
        assert_eq!(c.cmd(&["SET", &k, "v"]), V::ok());
        assert_eq!(c.cmd(&["GET", &k]), V::s("v"));
        std::thread::sleep(Duration::from_millis(1100));
        let hits = |c: &mut Conn| {
            let stats = c.cmd(&["PROXY", "CACHE", "STATS"]);
            stats.get("hits").map(|v| v.int()).unwrap_or(0)
        };
        let before = hits(&mut c);
        let replies: Vec<V> = (0..5).map(|_| c.cmd(&["GET", &k])).collect();
        let admitted = replies.iter().filter(|v| **v == V::s("v")).count();
        assert_eq!(admitted, 1, "{family} cache hit: {replies:?}");
        assert_eq!(hits(&mut c) - before, 1, "{family}: the admitted read was a cache hit");
    }
}

/// ACL key rules (`%R~` read-only, `~` read-write) × every write path: a write of a key
/// the user may only read is refused (NOPERM) on each path, a write of a key it may write
/// is not, for both families (the patterns are the client's names).
#[test]
fn acl_key_rules_on_every_write_path() {
    let env = env();
    let mut failures = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let mut c = Conn::connect(env.proxy.port());
            assert_eq!(c.cmd(&["AUTH", "mxu", "mxpw"]), V::ok());
            let ro = key(family, "ro", &format!("{path:?}"));
            let rw = key(family, "rw", &format!("{path:?}"));
            let refused = attempts(&mut c, path, &ro, 1).remove(0);
            // (a transaction's refusal at queue time is NOPERM; EXEC then aborts)
            if !refused.err().is_some_and(|e| e.starts_with("NOPERM")) {
                failures.push(format!("{family} {path:?}: a read-only key written: {refused:?}"));
            }
            if matches!(path, Path::Multi | Path::Watch) {
                // the transaction was aborted whole
                assert_eq!(c.cmd(&["GET", &ro]), V::Nil, "{family} {path:?}");
            }
            // Split names a key of no pattern: refused too, as on one Redis
            if !matches!(path, Path::Split) {
                let allowed = attempts(&mut c, path, &rw, 1).remove(0);
                if allowed.is_err() {
                    failures.push(format!("{family} {path:?}: a writable key refused: {allowed:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// ACL key rules × read paths: a read of a key the user may only read is allowed on the
/// replica read and the cache hit, and a key of no pattern is refused there too.
#[test]
fn acl_key_rules_on_replica_reads_and_cache_hits() {
    let env = env();
    let port = env.proxy.port();
    let mut admin = Conn::connect(port);
    for family in FAMILIES {
        for area in ["ro:rr", "ro:pin"] {
            let _reads = (area == "ro:rr").then(replica_reads);
            let k = key(family, area, "acl");
            assert_eq!(admin.cmd(&["SET", &k, "v"]), V::ok());
            let mut c = Conn::connect(port);
            assert_eq!(c.cmd(&["AUTH", "mxu", "mxpw"]), V::ok());
            wait_until(Duration::from_secs(20), "the read answered", || c.cmd(&["GET", &k]) == V::s("v"));
            // (a second read of a pinned key is a cache hit)
            assert_eq!(c.cmd(&["GET", &k]), V::s("v"), "{family} {area}");
            let other = key("zz", area, "acl");
            assert!(c.cmd(&["GET", &other]).err().is_some_and(|e| e.starts_with("NOPERM")), "{family} {area}");
        }
    }
}

/// The command a write by `path` ([`change`]) sends, as Redis names it in lower case.
fn command_of(path: Path) -> &'static str {
    match path {
        Path::Single | Path::Pipeline | Path::Multi | Path::Watch => "set",
        Path::Split => "mset",
        Path::Eval => "eval",
        Path::Evalsha => "evalsha",
        Path::Fcall => "fcall",
        Path::Blocking => "blmove",
        Path::Lock => "lock.acquire",
    }
}

/// Reads that show what a write by `path` changed, and a write of `v` by it: a string
/// read with GET for the string paths, LLEN of the list a BLMOVE feeds for the blocking
/// path, EXISTS for the lock path (every one of them a cacheable read).
fn read_of(path: Path, k: &str) -> Vec<String> {
    match path {
        Path::Blocking => vec!["LLEN".into(), k.into()],
        Path::Lock => vec!["EXISTS".into(), k.into()],
        _ => vec!["GET".into(), k.into()],
    }
}

/// One write by `path` that changes what [`read_of`] answers for `k`: `Ok` the reply.
fn change(c: &mut Conn, path: Path, k: &str, v: &str) -> V {
    match path {
        // (BLMOVE from a list of the same slot, so it moves at once: `k` is colocated or
        // a hash tag, see changed_key)
        Path::Blocking => {
            let src = format!("{k}:src");
            assert_eq!(c.cmd(&["RPUSH", &src, v]), V::Int(1));
            c.cmd(&["BLMOVE", &src, k, "LEFT", "RIGHT", "1"])
        }
        _ => writes(c, path, k, v, 1).remove(0),
    }
}

/// The key [`change`] writes for `k` (the blocking path's list shares a slot with its
/// source).
fn changed_key(path: Path, k: &str) -> String {
    match path {
        Path::Blocking if !k.starts_with("mx:") => format!("{{{k}}}"),
        _ => k.to_string(),
    }
}

/// Hot-key cache × every write path: a pinned key's read is cached (a hit proves it), then
/// written by the path: the next read through heatshield, from the writer and from another
/// client, shows the write (never the cached reply), for both families.
#[test]
fn cache_is_never_stale_after_a_write_on_any_path() {
    let env = env();
    let port = env.proxy.port();
    let mut failures = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let k = changed_key(path, &key(family, "pin", &format!("{path:?}")));
            let mut w = Conn::connect(port);
            let mut r = Conn::connect(port);
            let read = read_of(path, &k);
            let before = r.cmd(&read);
            // (a fill may be refused while a connection is still being made: read until
            // one read is a hit)
            wait_until(Duration::from_secs(5), "a cache hit", || {
                let hits = cache_hits(&mut r);
                assert_eq!(r.cmd(&read), before, "{family} {path:?}");
                cache_hits(&mut r) - hits == 1
            });
            let reply = change(&mut w, path, &k, "new");
            assert!(!reply.is_err() && !reply.is_nil(), "{family} {path:?}: {reply:?}");
            for (who, c) in [("writer", &mut w), ("reader", &mut r)] {
                let after = c.cmd(&read);
                if after == before {
                    failures.push(format!("{family} {path:?}: the {who} read {after:?} after the write"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn cache_hits(c: &mut Conn) -> i64 {
    c.cmd(&["PROXY", "CACHE", "STATS"]).get("hits").map(|v| v.int()).unwrap_or(0)
}

/// CLIENT TRACKING × every write path: a RESP3 client that read a key is told of a write
/// by another client on each path, under the name it read (a colocated key's client
/// name, never the stored one).
#[test]
fn tracking_clients_hear_of_writes_on_every_path() {
    let env = env();
    let port = env.proxy.port();
    let mut failures = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let k = changed_key(path, &key(family, "trk", &format!("{path:?}")));
            let mut t = Conn::connect_proto(port, common::client::Proto::Resp3);
            assert!(t.cmd(&["CLIENT", "TRACKING", "on"]).is_ok());
            let read = read_of(path, &k);
            t.cmd(&read);
            let mut w = Conn::connect(port);
            let reply = change(&mut w, path, &k, "new");
            assert!(!reply.is_err() && !reply.is_nil(), "{family} {path:?}: {reply:?}");
            let want = format!(">2\r\n$10\r\ninvalidate\r\n*1\r\n${}\r\n{k}\r\n", k.len()).into_bytes();
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut got = Vec::new();
            let heard = loop {
                if Instant::now() > deadline {
                    break false;
                }
                t.stream().set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                if let Ok(r) = t.try_read_full() {
                    if r.raw == want {
                        break true;
                    }
                    got.push(String::from_utf8_lossy(&r.raw).into_owned());
                }
            };
            if !heard {
                failures.push(format!("{family} {path:?}: no invalidation of {k}; got {got:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Colocation on the way out × the paths whose replies name keys: the client sees only
/// the names it sent (never `{mx}...`) in a blocking pop's reply (alone, pipelined,
/// inside MULTI and after WATCH), a script returning its key, a lock's refusal, and KEYS.
#[test]
fn colocated_names_never_reach_the_client_on_any_path() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    let k = key("mx", "out", "list");
    let push = |c: &mut Conn, n: usize| {
        for _ in 0..n {
            assert!(c.cmd(&["RPUSH", &k, "x"]).int() > 0);
        }
    };
    let popped = V::Arr(vec![V::s(&k), V::s("x")]);
    push(&mut c, 1);
    assert_eq!(c.cmd(&["BLPOP", &k, "1"]), popped, "blocking");
    push(&mut c, 2);
    let pipe = vec![args(&["BLPOP", &k, "1"]), args(&["BLPOP", &k, "1"])];
    assert_eq!(c.pipeline(&pipe), vec![popped.clone(), popped.clone()], "pipeline");
    push(&mut c, 1);
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["BLPOP", &k, "1"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![popped.clone()]), "MULTI");
    push(&mut c, 1);
    assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["BLPOP", &k, "1"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![popped.clone()]), "WATCH");
    assert_eq!(c.cmd(&["EVAL", "return KEYS[1]", "1", &k]), V::s(&k), "EVAL");
    let lock = key("mx", "out", "lock");
    assert!(c.cmd(&["LOCK.ACQUIRE", &lock, "a", "10000"]).int() > 0);
    assert_eq!(
        c.cmd(&["LOCK.RELEASE", &lock, "b"]),
        V::Err(format!("NOTOWNER lock '{lock}' is not held by 'b'")),
        "lock"
    );
    assert_eq!(c.cmd(&["EXISTS", &lock]), V::Int(1), "the lock is the key of its client name");
    assert_eq!(c.cmd(&["LOCK.RELEASE", &lock, "a"]), V::Int(1));
    assert_eq!(c.cmd(&["EXISTS", &lock]), V::Int(0));
    // (the fencing counter outlives the lock; under the rule it is `{mx}<lock>:lock-fence`)
    let fence = format!("{lock}:lock-fence");
    assert_eq!(c.cmd(&["KEYS", &format!("{lock}*")]), V::Arr(vec![V::s(&fence)]), "KEYS");
    assert!(c.cmd(&["LOCK.ACQUIRE", &lock, "a", "10000"]).int() > 0);
    assert_eq!(c.cmd(&["KEYS", &lock]), V::Arr(vec![V::s(&lock)]), "KEYS");
    // stored under the rule's tag, with its fencing counter
    let m = env.cluster.master_for_slot(key_slot(b"mx"));
    assert_eq!(common::cmd(m, &["EXISTS", &format!("{{mx}}{lock}")]), V::Int(1));
    assert_eq!(common::cmd(m, &["EXISTS", &format!("{{mx}}{lock}:lock-fence")]), V::Int(1));
}

/// ACL command rules × every path: a user without `SET` (and the other write paths'
/// commands) is refused with NOPERM on each path, for both families; a refused command
/// inside MULTI aborts the transaction. (What a script does inside Redis is not checked:
/// docs/architecture.md, note 1; the script command itself is.)
#[test]
fn acl_command_rules_on_every_path() {
    let env = env();
    let port = env.proxy.port();
    let mut admin = Conn::connect(port);
    let mut failures = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let k = changed_key(path, &key(family, "cmd", &format!("{path:?}")));
            let mut c = Conn::connect(port);
            assert_eq!(c.cmd(&["AUTH", "cmdu", "cmdpw"]), V::ok());
            let reply = change(&mut c, path, &k, "v");
            let want = command_of(path);
            let text = format!("NOPERM this user has no permissions to run the '{want}' command");
            if reply != V::Err(text.clone()) {
                failures.push(format!("{family} {path:?}: {reply:?}, not {text}"));
            }
            // nothing was written
            let written = admin.cmd(&read_of(path, &k));
            if !(written.is_nil() || written == V::Int(0)) {
                failures.push(format!("{family} {path:?}: written anyway: {written:?}"));
            }
        }
        // reads: a replica read and a cache hit of GET are refused as well
        for area in ["rr", "pin"] {
            let _reads = (area == "rr").then(replica_reads);
            let k = key(family, area, "cmd");
            assert_eq!(admin.cmd(&["SET", &k, "v"]), V::ok());
            // (the replica read waits for a replica in sync; the pinned key is cached)
            wait_until(Duration::from_secs(20), "the key readable", || admin.cmd(&["GET", &k]) == V::s("v"));
            assert_eq!(admin.cmd(&["GET", &k]), V::s("v"));
            let mut c = Conn::connect(port);
            assert_eq!(c.cmd(&["AUTH", "cmdu", "cmdpw"]), V::ok());
            let reply = c.cmd(&["GET", &k]);
            if reply != V::Err("NOPERM this user has no permissions to run the 'get' command".into()) {
                failures.push(format!("{family} GET ({area}): {reply:?}"));
            }
        }
    }
    // pub/sub
    let mut c = Conn::connect(port);
    assert_eq!(c.cmd(&["AUTH", "cmdu", "cmdpw"]), V::ok());
    for (cmd, name) in [(vec!["PUBLISH", "news:1", "m"], "publish"), (vec!["SUBSCRIBE", "news:1"], "subscribe")] {
        let reply = c.cmd(&cmd);
        if reply != V::Err(format!("NOPERM this user has no permissions to run the '{name}' command")) {
            failures.push(format!("{name}: {reply:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// ACL channel rules × the paths a channel takes: PUBLISH alone, pipelined and queued in
/// MULTI, SUBSCRIBE, PSUBSCRIBE and SSUBSCRIBE: a channel outside the user's `&news:*` is
/// refused with Redis's text, one inside is not.
#[test]
fn acl_channel_rules_on_every_path() {
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    assert_eq!(c.cmd(&["AUTH", "chu", "chpw"]), V::ok());
    let denied = V::Err("NOPERM this user has no permissions to access one of the channels used as arguments".into());
    assert_eq!(c.cmd(&["PUBLISH", "other", "m"]), denied, "single");
    assert_eq!(c.cmd(&["PUBLISH", "news:1", "m"]), V::Int(0), "single, allowed");
    let pipe = vec![args(&["PUBLISH", "other", "m"]), args(&["PUBLISH", "news:1", "m"])];
    assert_eq!(c.pipeline(&pipe), vec![denied.clone(), V::Int(0)], "pipeline");
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["PUBLISH", "other", "m"]), denied, "MULTI");
    assert!(c.cmd(&["EXEC"]).err().is_some_and(|e| e.starts_with("EXECABORT")), "MULTI aborted");
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["PUBLISH", "news:2", "m"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::Int(0)]), "MULTI, allowed");
    assert_eq!(c.cmd(&["SSUBSCRIBE", "other"]), denied, "SSUBSCRIBE");
    assert_eq!(c.cmd(&["PSUBSCRIBE", "oth*"]), denied, "PSUBSCRIBE");
    assert_eq!(c.cmd(&["SUBSCRIBE", "other"]), denied, "SUBSCRIBE");
    assert_eq!(c.cmd(&["SUBSCRIBE", "news:1"]), V::Arr(vec![V::s("subscribe"), V::s("news:1"), V::Int(1)]));
}

/// Shared rate limits × every write path: a shared rule (1/s, burst 1) over two keys of
/// one path, written alternately five times within a second: one write admitted in all,
/// for both families (the budget is the rule's, whichever key and path draws on it).
#[test]
fn shared_rate_limit_on_every_write_path() {
    let env = env();
    let port = env.proxy.port();
    let mut admin = Conn::connect(port);
    let mut failures = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let cell = format!("{path:?}{}", std::process::id());
            let rule = format!("sh-{family}-{cell}");
            let pattern = format!("{family}:sh:{cell}:*");
            assert_eq!(admin.cmd(&["PROXY", "RATELIMIT", "SET", &rule, &pattern, "1", "1", "shared", "all"]), V::ok());
            let keys = [format!("{family}:sh:{cell}:a"), format!("{family}:sh:{cell}:b")];
            let mut c = Conn::connect(port);
            let started = Instant::now();
            let replies: Vec<V> = (0..5).map(|i| attempts(&mut c, path, &keys[i % 2], 1).remove(0)).collect();
            let took = started.elapsed();
            assert_eq!(admin.cmd(&["PROXY", "RATELIMIT", "DEL", &rule]), V::Int(1));
            one_admitted(&format!("{family} {path:?}"), &replies, took, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Shared rate limits × replica read and cache hit: a shared rule (1/s, burst 1, reads,
/// `count-cached`) over two keys, read alternately five times within a second, by a
/// replica (a read rule) and from the cache (pinned keys): one read admitted in all, for
/// both families, and that read was the replica's (its own counters) or a cache hit.
#[test]
fn shared_rate_limit_on_replica_reads_and_cache_hits() {
    let env = env();
    let port = env.proxy.port();
    let mut admin = Conn::connect(port);
    let mut failures = Vec::new();
    for family in FAMILIES {
        for area in ["rr", "pin"] {
            let reads = (area == "rr").then(replica_reads);
            let cell = format!("{area}{}", std::process::id());
            // (the pl family's two keys share a hash tag, so one replica serves both)
            let keys = match family {
                "pl" => [format!("pl:{area}:sh{cell}:{{t}}a"), format!("pl:{area}:sh{cell}:{{t}}b")],
                _ => [format!("mx:{area}:sh{cell}:a"), format!("mx:{area}:sh{cell}:b")],
            };
            let mut r = Conn::connect(port);
            for k in &keys {
                assert_eq!(admin.cmd(&["SET", k, "v"]), V::ok());
                // in sync on the replica, or in the cache (a second read is a hit)
                wait_until(Duration::from_secs(20), "the read answered", || r.cmd(&["GET", k]) == V::s("v"));
            }
            let rule = format!("sh-{family}-{cell}");
            let pattern = format!("{family}:{area}:sh{cell}:*");
            assert_eq!(
                admin.cmd(&["PROXY", "RATELIMIT", "SET", &rule, &pattern, "1", "1", "shared", "reads", "count-cached"]),
                V::ok()
            );
            let replica = env.cluster.replica_of(env.cluster.master_for_slot(stored_slot(&keys[0])));
            drop(reads);
            let alone = (area == "rr").then(replica_count);
            let (gets, hits) = (cmdstat_calls(replica, "get"), cache_hits(&mut admin));
            let started = Instant::now();
            let replies: Vec<V> = (0..5).map(|i| r.cmd(&["GET", &keys[i % 2]])).collect();
            let took = started.elapsed();
            let (gets, hits) = (cmdstat_calls(replica, "get") - gets, cache_hits(&mut admin) - hits);
            drop(alone);
            assert_eq!(admin.cmd(&["PROXY", "RATELIMIT", "DEL", &rule]), V::Int(1));
            let cell = format!("{family} {area}");
            one_admitted(&cell, &replies, took, &mut failures);
            match area {
                "rr" if gets != 1 => failures.push(format!("{cell}: {gets} reads on the replica")),
                "pin" if hits != 1 => failures.push(format!("{cell}: {hits} cache hits")),
                _ => {}
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The big-key log × every write path: a 4 KiB value written by each path is noted under
/// the request's first key by the client's name (never `{mx}...`): the written key, or for
/// the blocking path the list the value was pushed to and moved from.
#[test]
fn big_keys_are_noted_under_the_clients_names_on_every_write_path() {
    let env = env();
    let port = env.proxy.port();
    let big = "x".repeat(4096);
    let mut failures = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let k = changed_key(path, &key(family, "big", &format!("{path:?}")));
            let mut c = Conn::connect(port);
            let reply = change(&mut c, path, &k, &big);
            assert!(!reply.is_err() && !reply.is_nil(), "{family} {path:?}: {reply:?}");
            let noted = match path {
                Path::Blocking => format!("{k}:src"),
                _ => k.clone(),
            };
            let log = c.cmd(&["PROXY", "BIGKEYS", "1000"]);
            let keys: Vec<V> = log.items().iter().filter_map(|e| e.get("key")).collect();
            if !keys.contains(&V::s(&noted)) {
                failures.push(format!("{family} {path:?}: {noted} not in the big-key log"));
            }
            if keys.iter().any(|n| n.bytes().starts_with(b"{mx}")) {
                failures.push(format!("{family} {path:?}: a stored name in the big-key log: {keys:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The slow log (`PROXY SLOWLOG`) × every path: each write is logged with the arguments
/// the client sent (its key's client name, never `{mx}...`) under the command the client
/// sent, whether alone, pipelined, split, queued in MULTI (the queued command and EXEC
/// each have their entry), under WATCH, in a script, blocking or a lock command; and so
/// is a read sent to a replica and a read answered from the cache.
#[test]
fn the_slow_log_shows_the_clients_commands_on_every_path() {
    let env = env();
    let port = env.proxy.port();
    let mut failures = Vec::new();
    let logged = |c: &mut Conn, k: &str| -> Vec<Vec<String>> {
        let log = c.cmd(&["PROXY", "SLOWLOG", "GET", "-1"]);
        log.items()
            .iter()
            .map(|e| e.items()[3].items().iter().map(|a| a.text()).collect::<Vec<String>>())
            .filter(|args| args.iter().any(|a| a.contains(k)))
            .collect()
    };
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let k = changed_key(path, &key(family, "slow", &format!("{path:?}")));
            let mut c = Conn::connect(port);
            let reply = change(&mut c, path, &k, "v");
            assert!(!reply.is_err() && !reply.is_nil(), "{family} {path:?}: {reply:?}");
            let want = command_of(path);
            let entries = logged(&mut c, &k);
            if !entries.iter().any(|a| a[0].eq_ignore_ascii_case(want) && a.contains(&k)) {
                failures.push(format!("{family} {path:?}: no {want} entry naming {k}: {entries:?}"));
            }
            if entries.iter().flatten().any(|a| a.contains("{mx}")) {
                failures.push(format!("{family} {path:?}: a stored name in the slow log: {entries:?}"));
            }
        }
        // a stored name the client sends itself is logged as sent (and judged by the
        // rules as the name it stores: colocation.rs)
        if family == "mx" {
            let k = key(family, "slow", "literal");
            let sent = format!("{{mx}}{k}");
            let mut c = Conn::connect(port);
            assert_eq!(c.cmd(&["SET", &sent, "v"]), V::ok());
            assert_eq!(c.cmd(&["GET", &k]), V::s("v"), "the stored name is the same key");
            let entries = logged(&mut c, &sent);
            if !entries.iter().any(|a| a[0].eq_ignore_ascii_case("SET") && a[1] == sent) {
                failures.push(format!("a stored name sent by the client not logged as sent: {entries:?}"));
            }
        }
        // reads: by a replica (a read rule) and from the cache (a pinned key, read twice)
        for (area, what) in [("rr", "replica"), ("pin", "cache hit")] {
            let _reads = (area == "rr").then(replica_reads);
            let k = key(family, area, "slow");
            let mut c = Conn::connect(port);
            assert_eq!(c.cmd(&["SET", &k, "v"]), V::ok());
            let mut r = Conn::connect(port);
            wait_until(Duration::from_secs(20), "the read answered", || r.cmd(&["GET", &k]) == V::s("v"));
            assert_eq!(r.cmd(&["GET", &k]), V::s("v"));
            // (a command is logged once its reply is written; the connection's next reply
            // comes after that)
            assert_eq!(r.cmd(&["PING"]), V::s("PONG"));
            let entries = logged(&mut c, &k);
            let gets = entries.iter().filter(|a| a[0].eq_ignore_ascii_case("GET") && a[1] == k).count();
            if gets < 2 {
                failures.push(format!("{family} {what}: {gets} GET entries naming {k}: {entries:?}"));
            }
            if entries.iter().flatten().any(|a| a.contains("{mx}")) {
                failures.push(format!("{family} {what}: a stored name in the slow log: {entries:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Command statistics (`INFO commandstats`) and `HOTKEYS` × every path, on a heatshield
/// of their own in front of the same cluster (so only this test's commands count): each
/// path's command counts once under the name the client sent (a split MSET once, not per
/// part), and its key is listed by `HOTKEYS` under the client's name (never `{mx}...`);
/// so are a read by a replica and a cache hit.
#[test]
fn command_statistics_and_hotkeys_on_every_path() {
    let env = env();
    let (_dir, path) = config_file(CONF);
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let port = proxy.port();
    let mut admin = Conn::connect(port);
    assert_eq!(admin.cmd(&["HOTKEYS", "START", "METRICS", "1", "NET", "COUNT", "64"]), V::ok());
    let mut failures = Vec::new();
    let mut keys = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let k = changed_key(path, &key(family, "stats", &format!("{path:?}")));
            let want = command_of(path);
            let before = cmdstat_calls(port, want);
            let mut c = Conn::connect(port);
            let reply = change(&mut c, path, &k, "v");
            assert!(!reply.is_err() && !reply.is_nil(), "{family} {path:?}: {reply:?}");
            // (a command is recorded once its reply is written; the connection's next
            // reply comes after that)
            assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
            let counted = cmdstat_calls(port, want) - before;
            if counted != 1 {
                failures.push(format!("{family} {path:?}: {want} counted {counted} times"));
            }
            // (a command is counted under its first key: BLMOVE's is the list moved from)
            let first = if matches!(path, Path::Blocking) { format!("{k}:src") } else { k };
            keys.push((format!("{family} {path:?}"), first));
        }
        for (area, what) in [("rr", "replica"), ("pin", "cache hit")] {
            let _reads = (area == "rr").then(replica_reads);
            let k = key(family, area, "stats");
            assert_eq!(admin.cmd(&["SET", &k, "v"]), V::ok());
            let mut r = Conn::connect(port);
            wait_until(Duration::from_secs(20), "the read answered", || r.cmd(&["GET", &k]) == V::s("v"));
            assert_eq!(r.cmd(&["PING"]), V::s("PONG"));
            let before = cmdstat_calls(port, "get");
            assert_eq!(r.cmd(&["GET", &k]), V::s("v"));
            assert_eq!(r.cmd(&["PING"]), V::s("PONG"));
            let counted = cmdstat_calls(port, "get") - before;
            if counted != 1 {
                failures.push(format!("{family} {what}: get counted {counted} times"));
            }
            keys.push((format!("{family} {what}"), k));
        }
    }
    let s = admin.cmd(&["HOTKEYS", "GET"]);
    let listed: Vec<String> =
        s.items()[0].get("by-net-bytes").expect("by-net-bytes").items().chunks(2).map(|p| p[0].text()).collect();
    for (cell, k) in &keys {
        if !listed.contains(k) {
            failures.push(format!("{cell}: {k} not listed by HOTKEYS"));
        }
    }
    if let Some(stored) = listed.iter().find(|k| k.starts_with("{mx}")) {
        failures.push(format!("a stored name listed by HOTKEYS: {stored}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Fleet rate limits × every write path: two heatshields of one fleet in front of the
/// matrix's cluster divide a per-key rule of 2/s (burst 2) into 1/s (burst 1) each (a
/// rule's part, docs/fleet.md). Five attempts on one instance within a second, each on a
/// key of its own: one admitted on every path, for both families, and so for five reads
/// by a replica and five cache hits. A path that skipped the fleet's part would admit
/// two (the whole burst). (No key is watched, `max_watched_keys = 0`: a watched key
/// draws on tokens from the fleet's bucket, asked for as it is used, which makes what a
/// burst of five admits depend on how soon an ask comes back. Watched keys are checked in
/// the same step as these, `Limiter::check_one` and `check_many`, on every path, and
/// their budgets in tests/fleet.rs.)
#[test]
fn fleet_rate_limit_on_every_write_path() {
    let env = env();
    let conf = format!(
        "{CONF}\n[fleet]\nname = \"matrix\"\nmax_watched_keys = 0\n\n[[ratelimit.rules]]\nname = \"fl\"\npattern = \"*:fl:*\"\ncommands = \"all\"\nrate = 2\nburst = 2\ncount_cached = true\n"
    );
    let (_dir, path) = config_file(&conf);
    let a = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let b = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let members = |port: u16| {
        let list = Conn::connect(port).cmd(&["PROXY", "RATELIMIT", "LIST"]);
        let rule = list.items().iter().find(|r| r.get("name") == Some(V::s("fl"))).cloned().expect("rule fl");
        rule.get("fleet_members").map(|v| v.int()).unwrap_or(0)
    };
    wait_until(Duration::from_secs(10), "two members", || members(a.port()) == 2 && members(b.port()) == 2);
    let mut c = Conn::connect(a.port());
    let lib = "#!lua name=mxlib\nredis.register_function('mxset', function(keys, args) return redis.call('SET', keys[1], args[1]) end)";
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", "REPLACE", lib]), V::s("mxlib"));
    let mut failures = Vec::new();
    for family in FAMILIES {
        for path in WRITE_PATHS {
            let k = key(family, "fl", &format!("{path:?}"));
            let mut c = Conn::connect(a.port());
            let started = Instant::now();
            let replies = attempts(&mut c, path, &k, 5);
            one_admitted(&format!("{family} {path:?}"), &replies, started.elapsed(), &mut failures);
        }
        // a replica read (a read rule) and a cache hit (a pinned key; the rule counts
        // cached reads), each key written through the matrix's own heatshield (no fleet)
        let mut writer = Conn::connect(env.proxy.port());
        for (area, what) in [("fl:rr", "replica"), ("fl:pin", "cache hit")] {
            let k = key(family, area, "fleet");
            assert_eq!(writer.cmd(&["SET", &k, "v"]), V::ok());
            let mut r = Conn::connect(a.port());
            let cell = format!("{family} {what}");
            // (the cache hit's cell is tried again when the one admitted read was not a hit:
            // on a loaded machine the entry was once dropped before it, and the cell then
            // tested the miss path, not this one)
            for attempt in 1..=3 {
                let reads = (what == "replica").then(replica_reads);
                // in sync on the replica, or filled into the cache; then a fresh budget
                wait_until(Duration::from_secs(20), "the read answered", || r.cmd(&["GET", &k]) == V::s("v"));
                std::thread::sleep(Duration::from_millis(1100));
                let replica = env.cluster.replica_of(env.cluster.master_for_slot(stored_slot(&k)));
                drop(reads);
                let alone = (what == "replica").then(replica_count);
                let (gets, hits) = (cmdstat_calls(replica, "get"), cache_hits(&mut r));
                let started = Instant::now();
                let replies: Vec<V> = (0..5).map(|_| r.cmd(&["GET", &k])).collect();
                let (gets, hits) = (cmdstat_calls(replica, "get") - gets, cache_hits(&mut r) - hits);
                drop(alone);
                if what == "cache hit" && hits == 0 && attempt < 3 {
                    continue;
                }
                one_admitted(&cell, &replies, started.elapsed(), &mut failures);
                match what {
                    "replica" if gets != 1 => failures.push(format!("{cell}: {gets} reads on the replica")),
                    "cache hit" if hits != 1 => failures.push(format!("{cell}: {hits} cache hits in {attempt} tries")),
                    _ => {}
                }
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
