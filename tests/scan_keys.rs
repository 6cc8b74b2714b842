//! Keyspace iteration across masters: SCAN walks every master (the proxy encodes the
//! master in the cursor) and returns each key exactly once, with MATCH, COUNT and TYPE
//! passed through; KEYS merges every master's answer; RANDOMKEY returns an existing key,
//! or nil when the whole cluster is empty.

mod common;

use std::collections::{HashMap, HashSet};

use common::client::{Conn, Kind, Proto, V, args};
use common::{Proxy, RedisCluster, SlotOwners};

const N: usize = 10_000;

fn key(i: usize) -> String {
    format!("scan:{i}")
}

/// Every 10th key is a hash, the rest strings.
fn is_hash(i: usize) -> bool {
    i % 10 == 7
}

/// Runs a full SCAN with `extra` options; returns keys in the order received and the
/// number of round trips. Checks the reply shape and that cursors are numbers.
fn scan_all(c: &mut Conn, extra: &[&str]) -> (Vec<String>, usize) {
    let mut cursor = "0".to_string();
    let mut keys = vec![];
    let mut calls = 0;
    loop {
        let mut a = vec!["SCAN", cursor.as_str()];
        a.extend_from_slice(extra);
        let r = c.cmd_full(&a);
        calls += 1;
        assert_eq!(r.shape.kinds(), [Kind::Bulk, Kind::Array], "SCAN reply shape: {r:?}");
        let items = r.v.items();
        cursor = items[0].text();
        assert!(cursor.parse::<u64>().is_ok(), "cursor {cursor:?}");
        keys.extend(items[1].items().iter().map(V::text));
        if cursor == "0" {
            return (keys, calls);
        }
        assert!(calls < 100_000, "SCAN does not terminate");
    }
}

fn exactly_once(keys: &[String], what: &str) -> HashSet<String> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for k in keys {
        *counts.entry(k).or_default() += 1;
    }
    let dups: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(dups.is_empty(), "{what}: keys returned more than once: {dups:?}");
    counts.keys().map(|k| k.to_string()).collect()
}

#[test]
fn scan_keys_randomkey_over_all_masters() {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let owners = SlotOwners::read(&cluster);

    // --- empty cluster ---
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        let r = c.cmd_full(&["RANDOMKEY"]);
        assert_eq!(r.v, V::Nil, "RANDOMKEY on an empty cluster");
        let nil_kind = if proto == Proto::Resp3 { Kind::Null } else { Kind::NullBulk };
        assert_eq!(r.kind(), nil_kind, "{r:?}");
        assert_eq!(c.cmd(&["KEYS", "*"]), V::Arr(vec![]));
        assert_eq!(c.cmd(&["DBSIZE"]), V::Int(0));
        let (keys, calls) = scan_all(&mut c, &[]);
        assert!(keys.is_empty());
        assert!(calls >= 3, "SCAN must visit every master (took {calls} calls)");
    }

    // --- 10,000 keys over all masters ---
    let mut c = Conn::connect(proxy.port());
    let mut cmds = Vec::with_capacity(N);
    for i in 0..N {
        if is_hash(i) {
            cmds.push(args(&["HSET", &key(i), "f", "v"]));
        } else {
            cmds.push(args(&["SET", &key(i), "v"]));
        }
    }
    for chunk in cmds.chunks(2000) {
        let replies = c.pipeline(chunk);
        assert!(replies.iter().all(|r| !r.is_err()), "writes failed: {:?}", replies.iter().find(|r| r.is_err()));
    }
    let all: HashSet<String> = (0..N).map(key).collect();
    let mut per_master: HashMap<u16, usize> = HashMap::new();
    for k in &all {
        *per_master.entry(owners.of_key(k.as_bytes())).or_default() += 1;
    }
    assert_eq!(per_master.len(), 3, "keys must be spread over the 3 masters: {per_master:?}");
    assert_eq!(c.cmd(&["DBSIZE"]), V::Int(N as i64));

    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);

        // plain SCAN: each key exactly once
        let (keys, calls) = scan_all(&mut c, &[]);
        let got = exactly_once(&keys, "SCAN");
        assert_eq!(got.len(), N, "{proto:?} SCAN returned {} distinct keys", got.len());
        assert_eq!(got, all);
        assert!(calls > 3, "default COUNT should need several pages, got {calls}");

        // COUNT is passed through: bigger pages, fewer calls
        let (keys, big_calls) = scan_all(&mut c, &["COUNT", "1000"]);
        assert_eq!(exactly_once(&keys, "SCAN COUNT 1000"), all);
        assert!(big_calls * 3 < calls, "COUNT 1000 took {big_calls} calls vs {calls} by default");

        // MATCH is passed through
        let (keys, _) = scan_all(&mut c, &["MATCH", "scan:12*", "COUNT", "500"]);
        let want: HashSet<String> = all.iter().filter(|k| k.starts_with("scan:12")).cloned().collect();
        assert_eq!(exactly_once(&keys, "SCAN MATCH"), want);
        assert_eq!(want.len(), 111);

        // TYPE is passed through
        let (keys, _) = scan_all(&mut c, &["COUNT", "700", "TYPE", "hash"]);
        let hashes: HashSet<String> = (0..N).filter(|&i| is_hash(i)).map(key).collect();
        assert_eq!(exactly_once(&keys, "SCAN TYPE hash"), hashes);

        // invalid cursors
        assert_eq!(c.cmd(&["SCAN", "abc"]), V::Err("ERR invalid cursor".into()));
        assert_eq!(c.cmd(&["SCAN", "1023"]), V::Err("ERR invalid cursor".into()));

        // KEYS merges every master
        let keys = c.cmd(&["KEYS", "*"]);
        let keys: Vec<String> = keys.items().iter().map(V::text).collect();
        assert_eq!(exactly_once(&keys, "KEYS *"), all);
        let keys = c.cmd(&["KEYS", "scan:99*"]);
        let keys: Vec<String> = keys.items().iter().map(V::text).collect();
        let want: HashSet<String> = all.iter().filter(|k| k.starts_with("scan:99")).cloned().collect();
        assert_eq!(exactly_once(&keys, "KEYS scan:99*"), want);
        assert_eq!(c.cmd(&["KEYS", "nomatch*"]), V::Arr(vec![]));

        // RANDOMKEY returns existing keys, from more than one master
        let mut seen_masters = HashSet::new();
        for _ in 0..60 {
            let r = c.cmd_full(&["RANDOMKEY"]);
            assert_eq!(r.kind(), Kind::Bulk, "{r:?}");
            let k = r.v.text();
            assert!(all.contains(&k), "RANDOMKEY returned unknown key {k:?}");
            seen_masters.insert(owners.of_key(k.as_bytes()));
        }
        assert!(seen_masters.len() >= 2, "RANDOMKEY always picked one master: {seen_masters:?}");
    }

    // RANDOMKEY with only one master holding keys still finds it
    let (m, k) = owners.key_per_master("scan:lonely:")[1].clone();
    let mut c = Conn::connect(proxy.port());
    let mut dels = vec![];
    for chunk in (0..N).map(key).collect::<Vec<_>>().chunks(1000) {
        let mut a = vec!["DEL".to_string()];
        a.extend(chunk.iter().cloned());
        dels.push(args(&a));
    }
    let total: i64 = c.pipeline(&dels).iter().map(V::int).sum();
    assert_eq!(total, N as i64);
    assert_eq!(c.cmd(&["SET", &k, "1"]), V::ok());
    for _ in 0..10 {
        assert_eq!(c.cmd(&["RANDOMKEY"]), V::s(&k), "only key lives on master {m}");
    }
    assert!(proxy.is_alive());
}
