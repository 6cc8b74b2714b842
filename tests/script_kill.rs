//! SCRIPT KILL and FUNCTION KILL reach the master whose script is busy, whichever it is
//! and whichever shared connection the busy script came on: heatshield sends them to
//! every master, each on a connection leased for it, and answers as one Redis would
//! (`+OK` if a script was killed, `NOTBUSY` if none ran). A cluster of its own: its
//! masters are made busy on purpose.

mod common;

use std::time::Duration;

use common::client::{Conn, Proto, V};
use common::{ClusterEnv, wait_until};

const NOTBUSY: &str = "NOTBUSY No scripts in execution right now.";

/// Waits until `port` answers BUSY: a script has run past the busy threshold there.
fn wait_busy(port: u16) {
    wait_until(Duration::from_secs(10), "the master to be busy", || {
        Conn::connect(port).cmd(&["PING"]).err().is_some_and(|e| e.starts_with("BUSY"))
    });
}

#[test]
fn script_kill_and_function_kill_reach_the_busy_master() {
    let env = ClusterEnv::start(None);
    let port = env.proxy.port();
    for m in env.owners.masters() {
        // a script counts as busy (and can be killed) after 100 ms, not 5 s
        assert_eq!(Conn::connect(m).cmd(&["CONFIG", "SET", "busy-reply-threshold", "100"]), V::ok());
    }
    let mut killer = Conn::connect(port);
    assert_eq!(killer.cmd(&["SCRIPT", "KILL"]), V::Err(NOTBUSY.into()));
    assert_eq!(killer.cmd(&["FUNCTION", "KILL"]), V::Err(NOTBUSY.into()));

    // a busy script on each master in turn, started by a new client each time (so on
    // whichever shared connection its id picks), killed by another new client
    let keys = env.owners.key_per_master("kill:");
    for round in 0..2 {
        for (master, key) in &keys {
            let mut busy = Conn::connect(port);
            busy.send(&["EVAL", "while true do end", "1", key.as_str()]);
            wait_busy(*master);
            // PING says BUSY while a script is busy, as one Redis does, in either form
            let direct = Conn::connect(*master).cmd(&["PING"]);
            assert_eq!(Conn::connect(port).cmd(&["PING"]), direct, "round {round}, master {master}");
            assert_eq!(Conn::connect(port).cmd(&["PING", "hi"]), direct);
            let reply = Conn::connect(port).cmd(&["SCRIPT", "KILL"]);
            assert_eq!(reply, V::ok(), "round {round}, master {master}");
            let e = busy.read_reply();
            assert!(e.err().is_some_and(|e| e.contains("Script killed by user")), "{e:?}");
            // the master serves again, through heatshield too
            assert_eq!(Conn::connect(port).cmd(&["SET", key.as_str(), "after"]), V::ok());
            assert_eq!(Conn::connect(port).cmd(&["PING"]), V::s("PONG"));
            assert_eq!(Conn::connect(port).cmd(&["PING", "hi"]), V::s("hi"));
        }
    }
    assert_eq!(killer.cmd(&["SCRIPT", "KILL"]), V::Err(NOTBUSY.into()));

    // FUNCTION KILL: a read-only endless function (loaded on every master by heatshield)
    let lib = "#!lua name=spin\nredis.register_function{function_name='spin', \
               callback=function() while true do end end, flags={'no-writes'}}";
    assert_eq!(killer.cmd(&["FUNCTION", "LOAD", lib]), V::s("spin"));
    for (master, key) in &keys {
        let mut busy = Conn::connect(port);
        busy.send(&["FCALL_RO", "spin", "1", key.as_str()]);
        wait_busy(*master);
        // FUNCTION STATS, allowed while busy, names the running function whichever
        // master runs it, as one Redis would
        for proto in Proto::BOTH {
            let stats = Conn::connect_proto(port, proto).cmd(&["FUNCTION", "STATS"]);
            let running = stats.get("running_script").unwrap_or(V::Nil);
            assert_eq!(running.get("name"), Some(V::s("spin")), "{proto:?} master {master}: {stats:?}");
        }
        assert_eq!(Conn::connect(port).cmd(&["FUNCTION", "KILL"]), V::ok(), "master {master}");
        let e = busy.read_reply();
        assert!(e.err().is_some_and(|e| e.contains("killed by user")), "{e:?}");
    }
    assert_eq!(killer.cmd(&["FUNCTION", "KILL"]), V::Err(NOTBUSY.into()));
    // a script that wrote cannot be killed: the master says so, and heatshield passes it on
    let (master, key) = &keys[0];
    let mut busy = Conn::connect(port);
    busy.send(&["EVAL", "redis.call('SET', KEYS[1], 'x'); while true do end", "1", key.as_str()]);
    wait_busy(*master);
    let reply = killer.cmd(&["SCRIPT", "KILL"]);
    assert!(reply.err().is_some_and(|e| e.starts_with("UNKILLABLE")), "{reply:?}");
    // only SHUTDOWN NOSAVE would end it; the cluster is this test's own and goes with it
    drop(busy);
}

/// SCRIPT FLUSH through heatshield empties every master's cache and heatshield's own
/// memory of the bodies: EVALSHA then says NOSCRIPT, as on one Redis (a flush behind
/// heatshield's back is repaired instead: tests/routing.rs). A cluster of its own: the
/// flush would empty the scripts of other tests.
#[test]
fn script_flush_through_heatshield_forgets_every_script() {
    let env = ClusterEnv::start(None);
    let mut c = Conn::connect(env.proxy.port());
    let (_, key) = &env.owners.key_per_master("flush:")[0];
    let sha = c.cmd(&["SCRIPT", "LOAD", "return 'loaded'"]).text();
    assert_eq!(c.cmd(&["EVALSHA", &sha, "1", key.as_str()]), V::s("loaded"));
    assert_eq!(c.cmd(&["SCRIPT", "FLUSH"]), V::ok());
    let e = c.cmd(&["EVALSHA", &sha, "1", key.as_str()]);
    assert!(e.err().is_some_and(|e| e.starts_with("NOSCRIPT")), "{e:?}");
    assert_eq!(c.cmd(&["SCRIPT", "EXISTS", &sha]), V::Arr(vec![V::Int(0)]));
}

/// A client pipelining PINGs while a script keeps a master busy cannot make heatshield
/// open backend connections without bound: only a few PINGs ask the masters at once (the
/// rest are answered by heatshield), and every PING is answered.
#[test]
fn pipelined_pings_during_a_busy_script_open_few_connections() {
    let env = ClusterEnv::start(None);
    let port = env.proxy.port();
    let (master, key) = env.owners.key_per_master("pingflood:").remove(0);
    assert_eq!(Conn::connect(master).cmd(&["CONFIG", "SET", "busy-reply-threshold", "100"]), V::ok());
    let received = || -> i64 {
        let info = common::cmd_text(master, &["INFO", "stats"]);
        common::info_field(&info, "total_connections_received").unwrap().parse().unwrap()
    };
    // counted before the script: a busy master answers INFO only once it is over
    let before = received();
    let mut busy = Conn::connect(port);
    busy.send(&["EVAL", "while true do end", "1", key.as_str()]);
    let mut direct = Conn::connect(master);
    wait_until(Duration::from_secs(10), "the master to be busy", || {
        direct.cmd(&["PING"]).err().is_some_and(|e| e.starts_with("BUSY"))
    });
    let mut c = Conn::connect(port);
    let pings: Vec<Vec<Vec<u8>>> = (0..500).map(|_| common::client::args(&["PING"])).collect();
    let replies = c.pipeline(&pings);
    assert_eq!(replies.len(), 500);
    let busy_replies = replies.iter().filter(|r| r.err().is_some_and(|e| e.starts_with("BUSY"))).count();
    assert!(replies.iter().all(|r| *r == V::s("PONG") || r.err().is_some_and(|e| e.starts_with("BUSY"))));
    assert!(busy_replies >= 1, "some PING asked the busy master");
    assert_eq!(Conn::connect(port).cmd(&["SCRIPT", "KILL"]), V::ok());
    let _ = busy.read_reply();
    // ours: the direct one, and this INFO's; the KILL's, one per master at most
    let opened = received() - before - 2 - env.owners.masters().len() as i64;
    eprintln!("500 pipelined PINGs: {busy_replies} BUSY, at most {opened} backend connections opened for them");
    assert!(opened <= 8, "{opened} connections opened for 500 PINGs");
}

#[test]
fn other_clients_are_answered_busy_not_held_behind_a_busy_script() {
    // one worker and one shared connection per master: every client's commands to a
    // master travel on the connection the busy script came on
    let env = ClusterEnv::start(Some("[server]\nthreads = 1\n[backend]\nconnections_per_node = 1\n"));
    let port = env.proxy.port();
    let (master, key) = env.owners.key_per_master("held:").remove(0);
    let other = key.clone(); // the script's own key: its value is read around the script
    assert_eq!(Conn::connect(port).cmd(&["SET", other.as_str(), "v"]), V::ok());
    assert_eq!(Conn::connect(master).cmd(&["CONFIG", "SET", "busy-reply-threshold", "100"]), V::ok());
    let mut busy = Conn::connect(port);
    busy.send(&["EVAL", "while true do end", "1", key.as_str()]);
    wait_busy(master);
    let direct = Conn::connect(master).cmd(&["GET", other.as_str()]);
    assert!(direct.err().is_some_and(|e| e.starts_with("BUSY")), "{direct:?}");
    // another client's GET gets Redis's BUSY at once, in either protocol, several times
    // (the dedicated connections it takes go back to the pool)
    for proto in [Proto::Resp2, Proto::Resp3, Proto::Resp2] {
        let mut c = Conn::connect_proto(port, proto);
        c.stream().set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let started = std::time::Instant::now();
        let got = c.try_cmd(&["GET", other.as_str()]).expect("an answer, not a wait behind the script");
        assert_eq!(got, direct, "{proto:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    }
    assert_eq!(Conn::connect(port).cmd(&["SCRIPT", "KILL"]), V::ok());
    let e = busy.read_reply();
    assert!(e.err().is_some_and(|e| e.contains("Script killed by user")), "{e:?}");
    // and once it is over, the value, on the shared connection again
    assert_eq!(Conn::connect(port).cmd(&["GET", other.as_str()]), V::s("v"));
    if let Some(m) = env.proxy.metrics_addr() {
        let detours = common::http::scrape_series(&m, "heatshield_script_detours_total").unwrap_or(0.0);
        // the two RESP2 GETs (a RESP3 client's shared connection is another one, which
        // the script does not hold: Redis answers BUSY there directly)
        assert!(detours >= 2.0, "{detours} detours counted");
    }
}
