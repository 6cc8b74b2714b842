//! Live slot migration behind the proxy. While a slot is half-moved (IMPORTING on the
//! target, MIGRATING on the source, some keys already MIGRATEd) the source answers ASK for
//! the moved keys; after the slot is assigned to the target, the source answers MOVED.
//! The proxy must follow both, so its clients get correct values and never see MOVED,
//! ASK or TRYAGAIN — including a client hammering the slot during the whole migration.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use common::client::{Conn, Proto, V};
use common::{Proxy, RedisCluster, SlotOwners, cmd_text, key_slot};

fn is_redirect(v: &V) -> bool {
    v.err().is_some_and(|e| e.starts_with("MOVED") || e.starts_with("ASK") || e.starts_with("TRYAGAIN"))
}

/// A client doing single-key reads and writes on `keys` until stopped; it is the only
/// writer of those keys, so it knows every value. Returns (operations, problems).
fn hammer(
    port: u16,
    keys: Vec<String>,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicUsize>,
) -> thread::JoinHandle<Vec<String>> {
    thread::spawn(move || {
        let mut problems = vec![];
        let mut c = Conn::connect(port);
        let mut model: HashMap<String, String> = HashMap::new();
        let mut i = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let k = &keys[i % keys.len()];
            if i.is_multiple_of(3) {
                let v = format!("bg-{i}");
                match c.try_cmd(&["SET", k, &v]) {
                    Ok(r) if r.is_ok() => {
                        model.insert(k.clone(), v);
                    }
                    other => problems.push(format!("SET {k}: {other:?}")),
                }
            } else {
                let want = model.get(k).map(V::s).unwrap_or(V::Nil);
                match c.try_cmd(&["GET", k]) {
                    Ok(r) if r == want => {}
                    other => problems.push(format!("GET {k}: {other:?}, expected {want:?}")),
                }
            }
            if problems.len() > 20 {
                break;
            }
            ops.fetch_add(1, Ordering::Relaxed);
            i += 1;
        }
        problems
    })
}

#[test]
fn reads_and_writes_follow_ask_and_moved_during_a_live_migration() {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let owners = SlotOwners::read(&cluster);

    let tag = "{mig}";
    let slot = key_slot(tag.as_bytes());
    let src = owners.of_slot(slot);
    let dst = *owners.masters().iter().find(|&&m| m != src).unwrap();
    let (src_id, dst_id) = (cluster.node_id(src), cluster.node_id(dst));
    let key = |i: usize| format!("{tag}:k{i}");
    let n = 20;

    // data in the slot, written through the proxy
    let mut c = Conn::connect(proxy.port());
    for i in 0..n {
        assert_eq!(c.cmd(&["SET", &key(i), &format!("v{i}")]), V::ok());
    }
    let ctr = format!("{tag}:ctr");
    let hash = format!("{tag}:hash");
    c.cmd(&["SET", &ctr, "10"]);
    c.cmd(&["HSET", &hash, "f", "1", "g", "2"]);
    assert_eq!(cmd_text(src, &["GET", &key(3)]), "v3", "keys must start on the source");
    // per protocol, two keys that will move and two that will stay, for multi-key
    // commands whose keys end up on both sides
    let split_key = |side: &str, i: usize, proto: Proto| format!("{tag}:{side}{i}-{}", proto.tag());
    let mut movers = vec![];
    for proto in Proto::BOTH {
        for i in 0..2 {
            for side in ["moves", "stays"] {
                assert_eq!(c.cmd(&["SET", &split_key(side, i, proto), "old"]), V::ok());
            }
            movers.push(split_key("moves", i, proto));
        }
    }

    // a client working on the slot for the whole migration
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let bg_keys: Vec<String> = (0..10).map(|i| format!("{tag}:bg{i}")).collect();
    for k in &bg_keys {
        c.cmd(&["DEL", k]);
    }
    let bg = hammer(proxy.port(), bg_keys.clone(), stop.clone(), ops.clone());

    // --- start the migration: half of the keys move ---
    assert_eq!(cmd_text(dst, &["CLUSTER", "SETSLOT", &slot.to_string(), "IMPORTING", &src_id]), "OK");
    assert_eq!(cmd_text(src, &["CLUSTER", "SETSLOT", &slot.to_string(), "MIGRATING", &dst_id]), "OK");
    let mut first: Vec<String> = (0..n / 2).map(key).collect();
    first.push(ctr.clone());
    first.push(hash.clone());
    first.extend(bg_keys[..5].iter().cloned());
    first.extend(movers.iter().cloned());
    let dst_port = dst.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", dst_port.as_str(), "", "0", "5000", "KEYS"];
    migrate.extend(first.iter().map(String::as_str));
    assert_eq!(cmd_text(src, &migrate), "OK", "MIGRATE of the first half");
    // the source now redirects for moved keys
    let direct = cmd_text(src, &["GET", &key(0)]);
    assert!(direct.starts_with("ASK"), "source should answer ASK for a moved key, got {direct:?}");
    assert_eq!(cmd_text(src, &["GET", &key(15)]), "v15");

    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        for i in 0..n {
            let r = c.cmd(&["GET", &key(i)]);
            assert!(!is_redirect(&r), "{proto:?}: client saw a redirect: {r:?}");
            let want = if i == 1 && proto == Proto::Resp3 { "updated-1".to_string() } else { format!("v{i}") };
            assert_eq!(
                r,
                V::s(&want),
                "{proto:?} GET {} while half-moved ({})",
                key(i),
                if i < n / 2 { "moved" } else { "not moved" }
            );
        }
        // writes to moved keys go to the target (ASK), to unmoved keys to the source
        let incr = c.cmd(&["INCR", &ctr]);
        let want_ctr = if proto == Proto::Resp2 { 11 } else { 12 };
        assert_eq!(incr, V::Int(want_ctr), "{proto:?} INCR of a moved key");
        if proto == Proto::Resp2 {
            assert_eq!(c.cmd(&["SET", &key(1), "updated-1"]), V::ok());
        }
        assert_eq!(c.cmd(&["GET", &key(1)]), V::s("updated-1"));
        let new_key = format!("{tag}:new-{}", proto.tag());
        assert_eq!(c.cmd(&["SET", &new_key, "fresh"]), V::ok(), "{proto:?} SET of a new key in a migrating slot");
        assert_eq!(c.cmd(&["GET", &new_key]), V::s("fresh"));
        assert_eq!(c.cmd(&["HGET", &hash, "g"]), V::s("2"));
        // multi-key commands whose keys are all on one side work
        assert_eq!(
            c.cmd(&["MGET", &key(2), &key(3), &key(4)]),
            V::strs(&["v2", "v3", "v4"]),
            "{proto:?} MGET of moved keys"
        );
        assert_eq!(c.cmd(&["MGET", &key(12), &key(13)]), V::strs(&["v12", "v13"]), "{proto:?} MGET of unmoved keys");
        // ... and so do those whose keys are on both sides, which Redis itself refuses
        // with TRYAGAIN while the slot moves: heatshield completes them key by key
        let (m0, s0) = (split_key("moves", 0, proto), split_key("stays", 0, proto));
        let (m1, s1) = (split_key("moves", 1, proto), split_key("stays", 1, proto));
        let none = format!("{tag}:none");
        assert!(
            cmd_text(src, &["MGET", &m0, &s0]).starts_with("TRYAGAIN"),
            "Redis itself must answer TRYAGAIN here, or this tests nothing"
        );
        let t = std::time::Instant::now();
        let mixed = c.cmd(&["MGET", &key(2), &key(12), &none, &key(3)]);
        eprintln!("{proto:?}: MGET across a migrating slot answered in {:?}", t.elapsed());
        assert_eq!(mixed, V::Arr(vec![V::s("v2"), V::s("v12"), V::Nil, V::s("v3")]), "{proto:?} MGET across the move");
        assert_eq!(c.cmd(&["EXISTS", &m0, &s0, &none, &m0]), V::Int(3), "{proto:?} EXISTS across the move");
        assert_eq!(c.cmd(&["TOUCH", &m0, &s0, &none]), V::Int(2), "{proto:?} TOUCH across the move");
        assert_eq!(c.cmd(&["MSET", &m0, "new-m", &s0, "new-s"]), V::ok(), "{proto:?} MSET across the move");
        assert_eq!(c.cmd(&["MGET", &s0, &m0]), V::strs(&["new-s", "new-m"]));
        let mut on_dst = Conn::connect(dst);
        assert_eq!(on_dst.cmd(&["ASKING"]), V::ok());
        assert_eq!(on_dst.cmd(&["GET", &m0]), V::s("new-m"), "the moved key was written where it lives");
        assert_eq!(cmd_text(src, &["GET", &s0]), "new-s", "the unmoved key was written where it lives");
        assert_eq!(c.cmd(&["DEL", &m0, &s0, &none]), V::Int(2), "{proto:?} DEL across the move");
        assert_eq!(c.cmd(&["UNLINK", &s1, &m1]), V::Int(2), "{proto:?} UNLINK across the move");
        assert_eq!(c.cmd(&["EXISTS", &m0, &s0, &m1, &s1]), V::Int(0));
    }
    let per_key = common::http::scrape_series(
        &proxy.metrics_addr().unwrap(),
        "heatshield_retries_total{reason=\"tryagain_per_key\"}",
    );
    assert!(per_key.is_some_and(|n| n >= 12.0), "parts split key by key: {per_key:?}");
    // the new keys really are on the target
    let on_dst: usize = cmd_text(dst, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]).parse().unwrap();
    assert!(on_dst >= n / 2 + 4, "target holds {on_dst} keys of the slot (moved + new)");

    // --- finish: move the rest, assign the slot to the target everywhere ---
    thread::sleep(Duration::from_millis(200));
    let rest = cmd_text(src, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "1000"]);
    let rest: Vec<&str> = rest.lines().collect();
    assert!(rest.len() >= n / 2, "keys left on the source: {rest:?}");
    let mut migrate = vec!["MIGRATE", "127.0.0.1", dst_port.as_str(), "", "0", "5000", "KEYS"];
    migrate.extend(rest.iter().copied());
    assert_eq!(cmd_text(src, &migrate), "OK");
    assert_eq!(cmd_text(src, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]), "0");
    for m in [dst, src].into_iter().chain(owners.masters().into_iter().filter(|&m| m != src && m != dst)) {
        assert_eq!(
            cmd_text(m, &["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &dst_id]),
            "OK",
            "SETSLOT NODE on {m}"
        );
    }
    let direct = cmd_text(src, &["GET", &key(15)]);
    assert!(direct.starts_with("MOVED"), "source should answer MOVED now, got {direct:?}");

    // the proxy still believes the source owns the slot: the MOVED path
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        for i in 0..n {
            let want = match i {
                1 => "updated-1".to_string(),
                15 if proto == Proto::Resp3 => "after-r2".to_string(),
                _ => format!("v{i}"),
            };
            let r = c.cmd(&["GET", &key(i)]);
            assert!(!is_redirect(&r), "{proto:?}: client saw a redirect: {r:?}");
            assert_eq!(r, V::s(&want), "{proto:?} GET {} after the migration", key(i));
        }
        let v = format!("after-{}", proto.tag());
        assert_eq!(c.cmd(&["SET", &key(15), &v]), V::ok());
        assert_eq!(cmd_text(dst, &["GET", &key(15)]), v, "write after the migration must land on the target");
        assert_eq!(c.cmd(&["INCR", &ctr]), V::Int(if proto == Proto::Resp2 { 13 } else { 14 }));
        assert_eq!(c.cmd(&["GET", &format!("{tag}:new-r2")]), V::s("fresh"));
        assert_eq!(c.cmd(&["MGET", &key(0), &key(19), &format!("{tag}:new-r3")]), V::strs(&["v0", "v19", "fresh"]));
    }
    cluster.wait_ok(Duration::from_secs(30));
    assert_eq!(cluster.master_for_slot(slot), dst);

    // the background client never noticed
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let problems = bg.join().expect("background client");
    assert!(problems.is_empty(), "background client saw: {problems:?}");
    assert!(ops.load(Ordering::Relaxed) > 100, "background client made little progress");
    assert!(proxy.is_alive());
}
