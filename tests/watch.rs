//! WATCH through heatshield, against a real 3-master cluster: from WATCH to EXEC the
//! client is pinned to a dedicated connection to the watched keys' master, so a write by
//! anyone else in between (straight to the master, or through the proxy) makes EXEC
//! answer nil, exactly as on one Redis; and the seeds' flash sale (WATCH the stock, read
//! it, MULTI / DECR / EXEC, retry on nil) sells exactly the stock.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::client::{Conn, Proto, V};
use common::{ClusterEnv, Shared, cmd_text, cmdstat_calls, exclusive_traffic, info_field, key_slot, shared_traffic};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";

fn err(text: &str) -> V {
    V::Err(text.into())
}

/// A key whose slot differs from `key`'s.
fn other_slot(key: &str) -> String {
    (0..).map(|i| format!("other{i}")).find(|o| key_slot(o.as_bytes()) != key_slot(key.as_bytes())).unwrap()
}

#[test]
fn watch_guards_its_keys_as_on_one_redis() {
    let _t = shared_traffic();
    let env = env();
    for proto in Proto::BOTH {
        let k = format!("{{w:{proto:?}}}k");
        let owner = env.owners.of_key(k.as_bytes());
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let nil_array = {
            // what Redis answers an EXEC whose watched key changed, in this protocol
            let mut d = Conn::connect_proto(owner, proto);
            let mut e = Conn::connect(owner);
            assert_eq!(d.cmd(&["WATCH", &k]), V::ok());
            assert_eq!(e.cmd(&["SET", &k, "x"]), V::ok());
            assert_eq!(d.cmd(&["MULTI"]), V::ok());
            assert_eq!(d.cmd(&["GET", &k]), V::s("QUEUED"));
            d.cmd_full(&["EXEC"]).raw
        };

        // nothing changed: EXEC runs
        assert_eq!(c.cmd(&["SET", &k, "1"]), V::ok());
        assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
        assert_eq!(c.cmd(&["GET", &k]), V::s("1"));
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["INCR", &k]), V::s("QUEUED"));
        assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::Int(2)]), "{proto:?}");

        // a write straight to the master in between: EXEC answers nil, nothing ran
        assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
        assert_eq!(Conn::connect(owner).cmd(&["SET", &k, "10"]), V::ok());
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["INCR", &k]), V::s("QUEUED"));
        assert_eq!(c.cmd_full(&["EXEC"]).raw, nil_array, "{proto:?}");
        assert_eq!(c.cmd(&["GET", &k]), V::s("10"));

        // a write by another client of the proxy in between: the same
        assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
        assert_eq!(Conn::connect(env.proxy.port()).cmd(&["SET", &k, "20"]), V::ok());
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["INCR", &k]), V::s("QUEUED"));
        assert_eq!(c.cmd_full(&["EXEC"]).raw, nil_array, "{proto:?}");
        assert_eq!(c.cmd(&["GET", &k]), V::s("20"));

        // the client's own write in between counts too (as in Redis)
        assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
        assert_eq!(c.cmd(&["SET", &k, "30"]), V::ok());
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["INCR", &k]), V::s("QUEUED"));
        assert_eq!(c.cmd_full(&["EXEC"]).raw, nil_array);

        // UNWATCH, DISCARD and RESET end the watch: a later write does not abort EXEC
        for end in [&["UNWATCH"][..], &["MULTI"], &["RESET"]] {
            assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
            match end[0] {
                "MULTI" => {
                    assert_eq!(c.cmd(&["MULTI"]), V::ok());
                    assert_eq!(c.cmd(&["DISCARD"]), V::ok());
                }
                "RESET" => {
                    assert_eq!(c.cmd(end), V::s("RESET"));
                    c.set_proto(Proto::Resp2);
                    if proto == Proto::Resp3 {
                        c.hello3();
                    }
                }
                _ => assert_eq!(c.cmd(end), V::ok()),
            }
            assert_eq!(Conn::connect(owner).cmd(&["SET", &k, "40"]), V::ok());
            assert_eq!(c.cmd(&["MULTI"]), V::ok());
            assert_eq!(c.cmd(&["INCR", &k]), V::s("QUEUED"));
            assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::Int(41)]), "after {end:?}");
        }

        // keys watched together share a slot; a transaction's keys share the watched slot
        let other = other_slot(&k);
        assert_eq!(c.cmd(&["WATCH", &k, &other]), err(CROSSSLOT));
        assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
        assert_eq!(c.cmd(&["WATCH", &other]), err(CROSSSLOT));
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["SET", &other, "v"]), err(CROSSSLOT));
        assert_eq!(c.cmd(&["EXEC"]), err(EXECABORT));
        // a command for another slot while watching goes the usual way
        assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
        assert!(c.cmd(&["GET", &other]).is_nil());
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd(&["GET", &k]), V::s("QUEUED"));
        assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::s("41")]));
        // an empty transaction under WATCH still checks the watched keys
        assert_eq!(c.cmd(&["WATCH", &k]), V::ok());
        assert_eq!(Conn::connect(owner).cmd(&["SET", &k, "50"]), V::ok());
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert_eq!(c.cmd_full(&["EXEC"]).raw, nil_array);
        assert_eq!(c.cmd(&["UNWATCH"]), V::ok());
        assert_eq!(c.cmd(&["DEL", &k]), V::Int(1));
    }
}

#[test]
fn watch_never_reads_from_the_hot_key_cache() {
    let _t = exclusive_traffic();
    let env = env();
    // a proxy whose cache holds every key it sees at once
    let (_dir, path) = common::config_file("[cache]\npin = [\"{wcache}*\"]\n");
    let proxy = common::Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let k = "{wcache}k";
    let owner = env.owners.of_key(k.as_bytes());
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["SET", k, "1"]), V::ok());
    assert_eq!(c.cmd(&["GET", k]), V::s("1"));
    common::wait_until(Duration::from_secs(5), "the pinned key to be served from the cache", || {
        let gets = cmdstat_calls(owner, "get");
        c.cmd(&["GET", k]) == V::s("1") && cmdstat_calls(owner, "get") == gets
    });
    assert_eq!(c.cmd(&["WATCH", k]), V::ok());
    let gets = cmdstat_calls(owner, "get");
    assert_eq!(c.cmd(&["GET", k]), V::s("1"));
    assert_eq!(cmdstat_calls(owner, "get"), gets + 1, "a read under WATCH must reach the master");
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["SET", k, "2"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::ok()]));
    assert_eq!(c.cmd(&["GET", k]), V::s("2"));
    assert_eq!(c.cmd(&["DEL", k]), V::Int(1));
}

/// The seeds' flash sale (shared/seeds 004): 50 buyers each WATCH the stock, read it, and
/// if some is left MULTI / DECR / EXEC, retrying on nil.
#[test]
fn the_flash_sale_sells_exactly_the_stock() {
    let _t = exclusive_traffic();
    let env = env();
    let stock = "{sale}stock";
    let owner = env.owners.of_key(stock.as_bytes());
    assert_eq!(Conn::connect(owner).cmd(&["SET", stock, "100"]), V::ok());
    let execs_before = cmdstat_calls(owner, "exec");
    let port = env.proxy.port();
    let buyers: Vec<_> = (0..50)
        .map(|_| {
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                let (mut bought, mut retries) = (0, 0);
                loop {
                    assert_eq!(c.cmd(&["WATCH", stock]), V::ok());
                    let left: i64 = c.cmd(&["GET", stock]).text().parse().unwrap();
                    assert!(left >= 0, "stock went negative: {left}");
                    if left == 0 {
                        assert_eq!(c.cmd(&["UNWATCH"]), V::ok());
                        return (bought, retries);
                    }
                    assert_eq!(c.cmd(&["MULTI"]), V::ok());
                    assert_eq!(c.cmd(&["DECR", stock]), V::s("QUEUED"));
                    match c.cmd(&["EXEC"]) {
                        V::Arr(r) => {
                            assert!(r[0].int() >= 0, "sold below zero: {r:?}");
                            bought += 1;
                        }
                        V::Nil => retries += 1,
                        other => panic!("EXEC answered {other:?}"),
                    }
                }
            })
        })
        .collect();
    let results: Vec<(i64, i64)> = buyers.into_iter().map(|b| b.join().unwrap()).collect();
    let bought: i64 = results.iter().map(|r| r.0).sum();
    let retries: i64 = results.iter().map(|r| r.1).sum();
    eprintln!("flash sale: {bought} bought, {retries} EXECs answered nil and retried");
    assert_eq!(bought, 100, "purchases");
    assert_eq!(cmd_text(owner, &["GET", stock]), "0");
    let execs = cmdstat_calls(owner, "exec") - execs_before;
    assert!(execs >= 100, "the owning master ran {execs} EXECs");
    assert!(retries > 0, "50 buyers never collided: the test proves nothing about WATCH");
    let info = cmd_text(owner, &["INFO", "stats"]);
    eprintln!("owner total_commands_processed {:?}", info_field(&info, "total_commands_processed"));
    assert_eq!(Conn::connect(owner).cmd(&["DEL", stock]), V::Int(1));
}

#[test]
fn a_watch_voided_by_a_moved_slot_makes_exec_answer_nil() {
    // a cluster of its own: this test moves a slot
    let env = ClusterEnv::start(None);
    let k = "{wmoved}k";
    let s = key_slot(k.as_bytes());
    let old = env.owners.of_slot(s);
    let new = env.owners.masters().into_iter().find(|&m| m != old).unwrap();
    let mut c = Conn::connect(env.proxy.port());
    assert_eq!(c.cmd(&["WATCH", k]), V::ok());
    assert!(c.cmd(&["GET", k]).is_nil());
    let new_id = env.cluster.node_id(new);
    for m in env.owners.masters() {
        assert_eq!(cmd_text(m, &["CLUSTER", "SETSLOT", &s.to_string(), "NODE", &new_id]), "OK", "on {m}");
    }
    thread::sleep(Duration::from_millis(200));
    // the watched master no longer owns the key: the watch guards nothing, so EXEC
    // answers nil (the client retries, as after a conflicting write) and nothing ran
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["SET", k, "v"]), V::s("QUEUED"));
    assert!(c.cmd(&["EXEC"]).is_nil());
    assert!(c.cmd(&["GET", k]).is_nil());
    // the retry runs on the new owner
    assert_eq!(c.cmd(&["WATCH", k]), V::ok());
    assert_eq!(c.cmd(&["MULTI"]), V::ok());
    assert_eq!(c.cmd(&["SET", k, "v"]), V::s("QUEUED"));
    assert_eq!(c.cmd(&["EXEC"]), V::Arr(vec![V::ok()]));
    assert_eq!(cmd_text(new, &["GET", k]), "v");
}
