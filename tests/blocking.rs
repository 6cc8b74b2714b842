//! Blocking commands through heatshield, against a real 3-master cluster: each waits on a
//! dedicated connection of its own (never a shared one), for as long as its own timeout
//! says (not the proxy's command timeout), answers as Redis does, keeps a client's later
//! commands waiting behind it as Redis does, gives its connection back to the pool, and
//! a client that leaves while blocked takes no element meant for another.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, V, args};
use common::{ClusterEnv, Proxy, Shared, cmd_text, config_file, info_field, key_slot, wait_until};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The number of clients connected to a Redis node.
fn connected(port: u16) -> i64 {
    info_field(&cmd_text(port, &["INFO", "clients"]), "connected_clients").unwrap().parse().unwrap()
}

/// Clients blocked on a Redis node.
fn blocked_on(port: u16) -> i64 {
    info_field(&cmd_text(port, &["INFO", "clients"]), "blocked_clients").unwrap().parse().unwrap()
}

#[test]
fn blocking_commands_answer_as_redis_does() {
    // blocks clients on the shared masters (see exclusive_traffic)
    let _traffic = common::shared_traffic();
    let env = env();
    for proto in Proto::BOTH {
        let t = format!("{{blk:{proto:?}}}");
        let k = |s: &str| format!("{t}{s}");
        let owner = env.owners.of_key(k("l").as_bytes());
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let mut d = Conn::connect_proto(owner, proto);
        let (l, l2, z, s) = (k("l"), k("l2"), k("z"), k("s"));
        // with data there: answered at once; without: the command's own timeout reply
        let cmds: Vec<Vec<&str>> = vec![
            vec!["RPUSH", &l, "a", "b", "c", "d", "e", "f"],
            vec!["BLPOP", &l, "0"],
            vec!["BRPOP", &l2, &l, "1"],
            vec!["BRPOPLPUSH", &l, &l2, "0"],
            vec!["BLMOVE", &l2, &l, "LEFT", "RIGHT", "0"],
            vec!["BLMPOP", "0", "2", &l2, &l, "LEFT", "COUNT", "2"],
            vec!["ZADD", &z, "1", "m1", "2", "m2", "3", "m3"],
            vec!["BZPOPMIN", &z, "0"],
            vec!["BZPOPMAX", &z, "0"],
            vec!["BZMPOP", "0", "1", &z, "MIN"],
            vec!["XADD", &s, "1-1", "f", "v"],
            vec!["XREAD", "BLOCK", "0", "STREAMS", &s, "0"],
            vec!["XGROUP", "CREATE", &s, "g", "0"],
            vec!["XREADGROUP", "GROUP", "g", "c1", "BLOCK", "0", "STREAMS", &s, ">"],
            vec!["DEL", &l, &l2, &z, &s],
            vec!["BLPOP", &l, "0.1"],
            vec!["BRPOPLPUSH", &l, &l2, "0.1"],
            vec!["BLMOVE", &l, &l2, "LEFT", "LEFT", "0.1"],
            vec!["BLMPOP", "0.1", "1", &l, "LEFT"],
            vec!["BZPOPMIN", &z, "0.1"],
            vec!["BZMPOP", "0.1", "1", &z, "MAX"],
            vec!["XREAD", "BLOCK", "100", "STREAMS", &s, "$"],
            // Redis's own errors
            vec!["BLPOP", &l, "-1"],
            vec!["BLPOP", &l, "soon"],
            vec!["BLMPOP", "0", "0", &l, "LEFT"],
        ];
        // the whole sequence through heatshield, then straight to the owner (it leaves
        // no key behind)
        let got: Vec<String> = cmds.iter().map(|cmd| text(&c.cmd_full(cmd).raw)).collect();
        let want: Vec<String> = cmds.iter().map(|cmd| text(&d.cmd_full(cmd).raw)).collect();
        for ((cmd, g), w) in cmds.iter().zip(&got).zip(&want) {
            assert_eq!(g, w, "{proto:?} {cmd:?}");
        }
        // keys of one blocking command share a slot, as in Redis Cluster
        let other =
            (0..).map(|i| format!("other{i}")).find(|o| key_slot(o.as_bytes()) != key_slot(l.as_bytes())).unwrap();
        assert_eq!(
            c.cmd(&["BLPOP", &l, &other, "0.1"]),
            V::Err("CROSSSLOT Keys in request don't hash to the same slot".into())
        );
        // inside MULTI a blocking command does not block (Redis runs it at once)
        let tx = [args(&["MULTI"]), args(&["BLPOP", &l, "0"]), args(&["EXEC"])];
        let raw = |r: Vec<common::client::Reply>| r.iter().map(|x| text(&x.raw)).collect::<Vec<_>>();
        assert_eq!(c.cmd(&["RPUSH", &l, "x"]), V::Int(1));
        let got = raw(c.pipeline_full(&tx));
        assert_eq!(d.cmd(&["RPUSH", &l, "x"]), V::Int(1));
        assert_eq!(got, raw(d.pipeline_full(&tx)), "{proto:?}");
    }
}

#[test]
fn a_blocked_client_is_served_by_a_later_push() {
    // blocks clients on the shared masters (see exclusive_traffic)
    let _traffic = common::shared_traffic();
    let env = env();
    let port = env.proxy.port();
    for proto in Proto::BOTH {
        let l = format!("{{wake:{proto:?}}}l");
        let mut c = Conn::connect_proto(port, proto);
        c.send(&["BLPOP", &l, "0"]);
        thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        assert_eq!(Conn::connect(port).cmd(&["RPUSH", &l, "job"]), V::Int(1));
        assert_eq!(c.read_reply(), V::strs(&[l.as_str(), "job"]), "{proto:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
        // the same for XREAD BLOCK on a stream
        let s = format!("{{wake:{proto:?}}}s");
        c.send(&["XREAD", "BLOCK", "0", "STREAMS", &s, "$"]);
        thread::sleep(Duration::from_millis(200));
        let id = Conn::connect(port).cmd(&["XADD", &s, "*", "f", "v"]);
        let got = c.read_reply();
        assert!(format!("{got:?}").contains(&id.text()), "{proto:?}: {got:?} lacks {id:?}");
        assert_eq!(c.cmd(&["DEL", &s]), V::Int(1));
    }
}

#[test]
fn a_blocking_command_waits_past_the_command_timeout() {
    // a cluster of its own: its client stays blocked for 11 s, which on the shared masters
    // would hold back the tests that count their blocked clients (exclusive_traffic)
    let cluster = common::RedisCluster::start();
    let (_dir, path) = config_file("[backend]\ncommand_timeout_ms = 300\n");
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let mut c = Conn::connect(proxy.port());
    let l = "{late}l";
    // its own timeout, 2 s, not the proxy's 300 ms (+ grace): Redis's timeout reply
    let started = Instant::now();
    assert!(c.cmd(&["BLPOP", l, "2"]).is_nil());
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(4), "took {took:?}");
    // 0 waits for ever: still waiting well past the reply deadline (300 ms + 10 s grace
    // would be the reply deadline of a command), then served by a push
    c.send(&["BLPOP", l, "0"]);
    thread::sleep(Duration::from_millis(11_000));
    assert_eq!(Conn::connect(proxy.port()).cmd(&["RPUSH", l, "x"]), V::Int(1));
    assert_eq!(c.read_reply(), V::strs(&[l, "x"]));
    assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
}

#[test]
fn replies_before_a_blocked_command_are_not_held() {
    // blocks clients on the shared masters (see exclusive_traffic)
    let _traffic = common::shared_traffic();
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    let l = "{before}l";
    // one write: the SET's reply comes at once, while the BLPOP after it waits
    let mut both = common::client::encode(&["SET", "{before}k", "v"]);
    both.extend(common::client::encode(&["BLPOP", l, "0"]));
    c.send_raw(&both);
    let started = Instant::now();
    assert_eq!(c.read_reply(), V::ok());
    assert!(started.elapsed() < Duration::from_secs(2), "the SET's reply waited for the BLPOP");
    assert_eq!(Conn::connect(env.proxy.port()).cmd(&["RPUSH", l, "x"]), V::Int(1));
    assert_eq!(c.read_reply(), V::strs(&[l, "x"]));
    assert_eq!(c.cmd(&["DEL", "{before}k"]), V::Int(1));
}

#[test]
fn later_commands_wait_behind_a_blocked_one() {
    // blocks clients on the shared masters (see exclusive_traffic)
    let _traffic = common::shared_traffic();
    let env = env();
    let mut c = Conn::connect(env.proxy.port());
    let l = "{order}l";
    // as in Redis: the RPUSH runs after the BLPOP timed out, so the BLPOP gets nothing
    let replies = c.pipeline(&[args(&["BLPOP", l, "0.3"]), args(&["RPUSH", l, "v"]), args(&["LPOP", l])]);
    assert_eq!(replies, vec![V::Nil, V::Int(1), V::s("v")]);
}

#[test]
fn a_client_that_leaves_while_blocked_takes_nothing() {
    // counts the masters' blocked clients: no other test of this binary blocks meanwhile
    let _traffic = common::exclusive_traffic();
    let env = env();
    let port = env.proxy.port();
    let l = "{leave}l";
    let owner = env.owners.of_key(l.as_bytes());
    let before = blocked_on(owner);
    // the first waiter leaves; the element goes to the second
    let mut first = Conn::connect(port);
    first.send(&["BLPOP", l, "0"]);
    wait_until(Duration::from_secs(5), "the first waiter to block", || blocked_on(owner) == before + 1);
    let mut second = Conn::connect(port);
    second.send(&["BLPOP", l, "0"]);
    wait_until(Duration::from_secs(5), "the second waiter to block", || blocked_on(owner) == before + 2);
    drop(first);
    wait_until(Duration::from_secs(5), "Redis to forget the first waiter", || blocked_on(owner) == before + 1);
    assert_eq!(Conn::connect(port).cmd(&["RPUSH", l, "e1"]), V::Int(1));
    assert_eq!(second.read_reply(), V::strs(&[l, "e1"]));
    // alone: the element stays in the list
    let mut only = Conn::connect(port);
    only.send(&["BLPOP", l, "0"]);
    wait_until(Duration::from_secs(5), "the waiter to block", || blocked_on(owner) == before + 1);
    only.shutdown_write();
    drop(only);
    wait_until(Duration::from_secs(5), "Redis to forget the waiter", || blocked_on(owner) == before);
    assert_eq!(Conn::connect(port).cmd(&["RPUSH", l, "e2"]), V::Int(1));
    assert_eq!(Conn::connect(port).cmd(&["LRANGE", l, "0", "-1"]), V::strs(&["e2"]));
    assert_eq!(Conn::connect(port).cmd(&["DEL", l]), V::Int(1));
}

#[test]
fn a_thousand_blocked_clients_are_served_then_their_connections_return() {
    // counts the masters' blocked clients: no other test of this binary blocks meanwhile
    let _traffic = common::exclusive_traffic();
    // a proxy of its own: its dedicated connections are counted
    let env = env();
    let proxy = Proxy::start_cluster(&env.cluster, &[]);
    let port = proxy.port();
    let masters = env.owners.masters();
    let before: Vec<i64> = masters.iter().map(|&m| connected(m)).collect();
    let rss_before = rss_kib(proxy.pid());
    const N: usize = 1000;
    let keys: Vec<String> = (0..N).map(|i| format!("many:{i}")).collect();
    let mut conns: Vec<Conn> = (0..N).map(|_| Conn::connect(port)).collect();
    for (c, k) in conns.iter_mut().zip(&keys) {
        c.send(&["BLPOP", k, "0"]);
    }
    let total_blocked = || masters.iter().map(|&m| blocked_on(m)).sum::<i64>();
    wait_until(Duration::from_secs(20), "1000 clients to block", || total_blocked() >= N as i64);
    let during: Vec<i64> = masters.iter().map(|&m| connected(m)).collect();
    let added: i64 = during.iter().zip(&before).map(|(d, b)| d - b).sum();
    let rss_during = rss_kib(proxy.pid());
    eprintln!(
        "1000 blocked: {added} more backend connections; proxy RSS {rss_before} KiB -> {rss_during} KiB ({} KiB per blocked client)",
        (rss_during.saturating_sub(rss_before)) / N as u64
    );
    // one dedicated connection each (plus the proxy's own shared ones, made on first use)
    assert!(added >= N as i64 && added <= N as i64 + 24, "{added} backend connections for {N} blocked clients");
    // INFO through heatshield counts its own blocked clients, as Redis counts its own
    // (BLPOP ... 0 waits for ever: none is in the timeout table)
    let info = cmd_text(port, &["INFO", "clients"]);
    assert_eq!(info_field(&info, "blocked_clients").as_deref(), Some("1000"), "{info}");
    assert_eq!(info_field(&info, "clients_in_timeout_table").as_deref(), Some("0"), "{info}");
    assert!(rss_during.saturating_sub(rss_before) < 64 * N as u64, "RSS grew {rss_before} -> {rss_during} KiB");
    // pushes wake every one of them, each with its own element
    let mut pusher = Conn::connect(port);
    let pushes: Vec<Vec<Vec<u8>>> = keys.iter().map(|k| args(&["RPUSH", k.as_str(), k.as_str()])).collect();
    assert!(pusher.pipeline(&pushes).iter().all(|r| *r == V::Int(1)));
    for (c, k) in conns.iter_mut().zip(&keys) {
        assert_eq!(c.read_reply(), V::strs(&[k.as_str(), k.as_str()]));
    }
    assert_eq!(info_field(&cmd_text(port, &["INFO", "clients"]), "blocked_clients").as_deref(), Some("0"));
    // the dedicated connections went back to the pool: at most the idle ones stay open
    // once the clients leave (16 per node by default)
    drop(conns);
    wait_until(Duration::from_secs(10), "dedicated connections to close", || {
        let now: i64 = masters.iter().map(|&m| connected(m)).sum();
        now - before.iter().sum::<i64>() <= 3 * 16 + 24
    });
    assert!(proxy.is_alive());
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines().find(|l| l.starts_with("VmRSS:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_blocked_client_follows_its_slot_to_the_new_owner() {
    // a cluster of its own: this test moves a slot
    let env = ClusterEnv::start(None);
    let port = env.proxy.port();
    let l = "{blkmoved}l";
    let s = key_slot(l.as_bytes());
    let old = env.owners.of_slot(s);
    let new = env.owners.masters().into_iter().find(|&m| m != old).unwrap();
    let mut c = Conn::connect(port);
    c.send(&["BLPOP", l, "30"]);
    wait_until(Duration::from_secs(5), "the client to block", || blocked_on(old) == 1);
    // the (empty) slot moves: Redis answers the blocked client MOVED, heatshield sends
    // the command again to the new owner with what remains of its timeout. The old owner
    // is told 100 ms before the others: meanwhile the two send the command back and forth
    // (the new owner does not know yet), which heatshield waits out rather than handing
    // the client a MOVED once its five redirections are spent (they take a millisecond).
    let new_id = env.cluster.node_id(new);
    let mut order = env.owners.masters();
    order.sort_by_key(|&m| m != old);
    for (i, m) in order.into_iter().enumerate() {
        assert_eq!(cmd_text(m, &["CLUSTER", "SETSLOT", &s.to_string(), "NODE", &new_id]), "OK", "on {m}");
        if i == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    wait_until(Duration::from_secs(10), "the client to block on the new owner", || blocked_on(new) == 1);
    assert_eq!(blocked_on(old), 0);
    assert_eq!(Conn::connect(port).cmd(&["RPUSH", l, "moved"]), V::Int(1));
    assert_eq!(c.read_reply(), V::strs(&[l, "moved"]));
}

#[test]
fn clients_blocked_on_one_key_are_served_in_the_order_they_blocked() {
    // counts the masters' blocked clients: no other test of this binary blocks meanwhile
    let _traffic = common::exclusive_traffic();
    let env = env();
    // one worker reads both clients, so the order heatshield took them in is their send
    // order (across workers it is the order the workers took them; see docs/transactions.md)
    let proxy = Proxy::start_cluster(&env.cluster, &["--threads", "1"]);
    let mut reversed = Vec::new();
    for round in 0..30 {
        let l = format!("{{order}}l{round}");
        let owner = env.owners.of_key(l.as_bytes());
        let before = blocked_on(owner);
        let (mut first, mut second) = (Conn::connect(proxy.port()), Conn::connect(proxy.port()));
        // back to back, as a test suite's deferred clients send them; the first rounds
        // find no idle dedicated connection (both connect), later ones reuse them
        let (a, b) = (format!("{{order}}a{round}"), format!("{{order}}b{round}"));
        if round % 2 == 0 {
            first.send(&["BLPOP", &l, "0"]);
            second.send(&["BLPOP", &l, "0"]);
        } else {
            first.send(&["BRPOPLPUSH", &l, &a, "0"]);
            second.send(&["BRPOPLPUSH", &l, &b, "0"]);
        }
        wait_until(Duration::from_secs(5), "both to block", || blocked_on(owner) == before + 2);
        let mut d = Conn::connect(owner);
        assert_eq!(d.cmd(&["RPUSH", &l, "one"]), V::Int(1));
        // Redis serves the client that blocked first
        first.stream().set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        match first.try_read_full() {
            Ok(_) => {
                assert_eq!(d.cmd(&["RPUSH", &l, "two"]), V::Int(1));
                second.read_reply();
            }
            Err(_) => {
                reversed.push(round);
                second.read_reply();
                assert_eq!(d.cmd(&["RPUSH", &l, "two"]), V::Int(1));
                first.read_reply();
            }
        }
        d.cmd(&["DEL", &l, &a, &b]);
    }
    assert!(reversed.is_empty(), "the second client was served first in rounds {reversed:?}");
}
