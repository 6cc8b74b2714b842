//! WAIT through heatshield (docs/commands.md): after the client's earlier writes have
//! their replies, the least number, over the masters it wrote to, of replicas that
//! acknowledged them, counted by those masters on connections of heatshield's own, so no
//! other client waits behind it. Against a 3+3 cluster of its own (replicas are paused
//! here). WAITAOF is in tests/valkey.rs (Redis 7.0 has none).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::client::{Conn, V, encode};
use common::{Proxy, RedisCluster, cmd};

fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill").args(["-s", sig, &pid.to_string()]).status().unwrap().success());
}

/// The pid of the server on `port` (its `INFO server`).
fn pid_of(port: u16) -> u32 {
    let info = cmd(port, &["INFO", "server"]).text();
    common::info_field(&info, "process_id").unwrap().parse().unwrap()
}

#[test]
fn wait_counts_the_replicas_that_have_every_write() {
    let cluster = RedisCluster::start();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let mut c = Conn::connect(proxy.port());
    // a write, then WAIT in the same pipeline: the WAIT answers after the write, and each
    // master's one replica has it
    c.send_raw(&[encode(&["SET", "w:k", "v"]), encode(&["WAIT", "1", "5000"]), encode(&["GET", "w:k"])].concat());
    let began = Instant::now();
    assert_eq!(c.read_reply(), V::ok());
    assert_eq!(c.read_reply(), V::Int(1));
    assert!(began.elapsed() < Duration::from_secs(1), "WAIT 1 took {:?}", began.elapsed());
    assert_eq!(c.read_reply(), V::s("v"));
    // a client that wrote nothing: the replicas connected to every master (one each,
    // once all have synchronized)
    assert_eq!(Conn::connect(proxy.port()).cmd(&["WAIT", "1", "5000"]), V::Int(1));
    // more replicas than there are: the count there is when the timeout ends
    let began = Instant::now();
    assert_eq!(c.cmd(&["WAIT", "2", "300"]), V::Int(1));
    assert!(began.elapsed() >= Duration::from_millis(290), "WAIT 2 300 took {:?}", began.elapsed());
    // Redis's errors, as the master gives them
    let master = cluster.masters()[0];
    for bad in [&["WAIT", "x", "0"][..], &["WAIT", "1", "x"], &["WAIT", "1", "-1"], &["WAIT", "1"]] {
        assert_eq!(c.cmd(bad), cmd(master, bad), "{bad:?}");
    }
    // a replica that cannot acknowledge (paused): a write to its master is not on it, and
    // WAIT says so; another client meanwhile is not held up
    let owner = cluster.master_for_key(b"w:paused");
    let replica = cluster.replica_of(owner);
    let pid = pid_of(replica);
    signal(pid, "STOP");
    assert_eq!(c.cmd(&["SET", "w:paused", "v"]), V::ok());
    let mut other = Conn::connect(proxy.port());
    let waiting = std::thread::spawn(move || {
        let began = Instant::now();
        let n = c.cmd(&["WAIT", "1", "700"]);
        (n, began.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    let began = Instant::now();
    assert_eq!(other.cmd(&["SET", "w:paused", "w"]), V::ok());
    assert!(
        began.elapsed() < Duration::from_millis(200),
        "a SET behind another client's WAIT took {:?}",
        began.elapsed()
    );
    let (n, took) = waiting.join().unwrap();
    signal(pid, "CONT");
    assert_eq!(n, V::Int(0), "the paused replica was counted");
    assert!(took >= Duration::from_millis(690), "WAIT 1 700 took {took:?}");
    // once it runs again it catches up, and WAIT counts it
    assert_eq!(other.cmd(&["WAIT", "1", "5000"]), V::Int(1));
    // WAIT answers for the masters the client wrote to: a paused replica elsewhere does
    // not hold it up (nor does a lock's master it never wrote to)
    let other_master = cluster.masters().into_iter().find(|&m| m != owner).unwrap();
    let far = cluster.replica_of(other_master);
    let far_pid = pid_of(far);
    signal(far_pid, "STOP");
    let mut w = Conn::connect(proxy.port());
    assert_eq!(w.cmd(&["SET", "w:paused", "x"]), V::ok());
    let began = Instant::now();
    let n = w.cmd(&["WAIT", "1", "3000"]);
    let took = began.elapsed();
    // a lock taken through heatshield is a write WAIT answers for
    let far_key =
        (0..).map(|i| format!("w:lock{i}")).find(|k| cluster.master_for_key(k.as_bytes()) == other_master).unwrap();
    let mut l = Conn::connect(proxy.port());
    assert!(l.cmd(&["LOCK.ACQUIRE", &far_key, "o", "10000"]).err().is_none());
    let lock_wait = l.cmd(&["WAIT", "1", "300"]);
    signal(far_pid, "CONT");
    assert_eq!(n, V::Int(1));
    assert!(took < Duration::from_secs(1), "WAIT 1 behind another master's paused replica took {took:?}");
    assert_eq!(lock_wait, V::Int(0), "a lock on a master whose replica is paused was counted");
    // nothing of heatshield's is left in the keyspace
    assert_eq!(c_keys(&proxy), vec!["w:k".to_string(), far_key, "w:paused".to_string()].into_iter().collect());
}

/// Every key through heatshield but the lock's fencing counters.
fn c_keys(proxy: &Proxy) -> std::collections::BTreeSet<String> {
    let keys = Conn::connect(proxy.port()).cmd(&["KEYS", "*"]);
    keys.items().iter().map(|k| k.text()).filter(|k| !k.ends_with(":lock-fence")).collect()
}

/// WAIT's written nodes × every write path: after a write by each path, WAIT asks the
/// master the client wrote to, and no other, for keys stored under their own names and
/// for colocated ones (stored on the tag's master, not their own names'). Another master's
/// replica is paused: a write not noted makes WAIT ask every master, and one noted under
/// the client's name asks the paused replica's master; either answers 0.
#[test]
fn wait_answers_for_the_master_each_write_path_wrote_to() {
    let cluster = RedisCluster::start();
    let (_dir, path) = common::config_file("[[colocate]]\nname = \"wc\"\nkeys = [\"wc:*\"]\ntag = \"wc\"\n");
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let owner = cluster.master_for_key(b"wc");
    let masters = cluster.masters();
    let paused = masters.iter().copied().find(|&m| m != owner).unwrap();
    let third = masters.iter().copied().find(|&m| m != owner && m != paused).unwrap();
    let mut c = Conn::connect(proxy.port());
    let lib = "#!lua name=wclib\nredis.register_function('wcset', function(keys, args) return redis.call('SET', keys[1], args[1]) end)";
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", "REPLACE", lib]), V::s("wclib"));
    let script = "return redis.call('SET', KEYS[1], ARGV[1])";
    let sha = c.cmd(&["SCRIPT", "LOAD", script]).text();
    let on = |m: u16, prefix: &str| {
        (0..).map(|i| format!("{prefix}{i}")).find(|k| cluster.master_for_key(k.as_bytes()) == m).unwrap()
    };
    // a hash tag of the colocation tag's master, for the keys under their own names; a
    // colocated name whose own slot is the paused replica's master's; the split's other key
    let tag = on(owner, "wt");
    let elsewhere = on(third, "we");
    let pid = pid_of(cluster.replica_of(paused));
    // (WAIT for everything so far, then pause)
    assert_eq!(c.cmd(&["WAIT", "1", "5000"]), V::Int(1));
    signal(pid, "STOP");
    let mut failures = Vec::new();
    for family in ["plain", "colocated"] {
        for cell in ["single", "pipeline", "split", "multi", "watch", "eval", "evalsha", "fcall", "blocking", "lock"] {
            let k = match family {
                "plain" => format!("{{{tag}}}:{cell}"),
                _ => on(paused, &format!("wc:{cell}:")),
            };
            let mut w = Conn::connect(proxy.port());
            let reply = match cell {
                "single" => w.cmd(&["SET", &k, "v"]),
                "pipeline" => w.pipeline(&vec![common::client::args(&["SET", &k, "v"]); 2]).remove(1),
                "split" => w.cmd(&["MSET", &k, "v", &elsewhere, "v"]),
                "multi" | "watch" => {
                    if cell == "watch" {
                        assert_eq!(w.cmd(&["WATCH", &k]), V::ok());
                    }
                    assert_eq!(w.cmd(&["MULTI"]), V::ok());
                    assert_eq!(w.cmd(&["SET", &k, "v"]), V::s("QUEUED"));
                    w.cmd(&["EXEC"])
                }
                "eval" => w.cmd(&["EVAL", script, "1", &k, "v"]),
                "evalsha" => w.cmd(&["EVALSHA", &sha, "1", &k, "v"]),
                "fcall" => w.cmd(&["FCALL", "wcset", "1", &k, "v"]),
                "blocking" => {
                    // (the source shares the destination's slot: colocated, or the tag)
                    let src = if family == "plain" { format!("{{{tag}}}:src") } else { format!("{k}:src") };
                    assert_eq!(c.cmd(&["RPUSH", &src, "x"]), V::Int(1));
                    w.cmd(&["BLMOVE", &src, &k, "LEFT", "RIGHT", "1"])
                }
                _ => w.cmd(&["LOCK.ACQUIRE", &k, "o", "10000"]),
            };
            assert!(!reply.is_err() && !reply.is_nil(), "{family} {cell}: {reply:?}");
            let n = w.cmd(&["WAIT", "1", "300"]);
            if n != V::Int(1) {
                failures.push(format!(
                    "{family} {cell}: WAIT 1 answered {n:?}: it asked another master than the one written"
                ));
            }
        }
    }
    // the control: a client that wrote nothing is answered for every master, the paused
    // replica's too. (The paused replica's master must have moved past what the replica
    // acknowledged: a write straight to it, or the master's replication ping, which comes
    // every 10 s and made this control pass only when one fell in the test.)
    let mut direct = Conn::connect(paused);
    let k = on(paused, "wait-control:");
    assert_eq!(direct.cmd(&["SET", &k, "v"]), V::ok());
    let idle = Conn::connect(proxy.port()).cmd(&["WAIT", "1", "300"]);
    signal(pid, "CONT");
    assert_eq!(idle, V::Int(0));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
