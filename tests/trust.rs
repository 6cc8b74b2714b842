//! Trust: nothing a client sends may steer heatshield's connections. A script (EVAL,
//! FCALL) can return any error text, including `MOVED <slot> <host:port>` or `ASK ...`
//! naming an address of the client's choosing; heatshield must not connect there (it
//! would send the backend credentials), must not patch its slot map for other clients, and
//! must hand the client the error as Redis sent it. Redirection-triggered refreshes are
//! rate-limited, so fake redirections in a loop cannot become a refresh storm.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, V};
use common::{ClusterEnv, cmd_text, http_get, key_slot};

/// A TCP listener on a free loopback port that stands for "a host of the attacker's
/// choosing": it accepts whatever connects and counts connections and bytes received.
struct Trap {
    port: u16,
    connections: Arc<AtomicUsize>,
    bytes: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Trap {
    fn start() -> Trap {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind trap");
        l.set_nonblocking(true).expect("nonblocking");
        let port = l.local_addr().expect("addr").port();
        let (connections, bytes, stop) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (c, b, s) = (connections.clone(), bytes.clone(), stop.clone());
        thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut sock, _)) => {
                        c.fetch_add(1, Ordering::SeqCst);
                        let b = b.clone();
                        thread::spawn(move || {
                            let _ = sock.set_read_timeout(Some(Duration::from_secs(5)));
                            let mut buf = [0u8; 4096];
                            while let Ok(n) = sock.read(&mut buf) {
                                if n == 0 {
                                    break;
                                }
                                b.fetch_add(n, Ordering::SeqCst);
                            }
                        });
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Trap { port, connections, bytes, stop }
    }

    fn contacted(&self) -> (usize, usize) {
        (self.connections.load(Ordering::SeqCst), self.bytes.load(Ordering::SeqCst))
    }
}

impl Drop for Trap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The value of an unlabelled counter in heatshield's /metrics (0 when absent).
fn counter(env: &ClusterEnv, name: &str) -> f64 {
    let addr = env.proxy.metrics_addr().expect("metrics on");
    let (_, body) = http_get(&addr, "/metrics");
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const LIB: &str = "#!lua name=trustlib\n\
    redis.register_function('trust_err', function(keys, args) return redis.error_reply(args[1]) end)\n\
    redis.register_function{function_name='trust_err_ro', callback=function(keys, args) return redis.error_reply(args[1]) end, flags={'no-writes'}}";

#[test]
fn redirections_returned_by_scripts_never_reach_an_unannounced_address() {
    let env = ClusterEnv::start(None);
    let port = env.proxy.port();
    let trap = Trap::start();
    let mut c = Conn::connect(port);
    assert_eq!(c.cmd(&["FUNCTION", "LOAD", "REPLACE", LIB]), V::s("trustlib"));

    let key = "trust:victim";
    let slot = key_slot(key.as_bytes());
    let fake = format!("127.0.0.1:{}", trap.port);
    let refused_before = counter(&env, "heatshield_redirections_refused_total");
    let mut sent = 0;
    // (pipelined: each reply waits for a refresh of the slot map that confirms the
    // address is not announced, and refreshes are at least a second apart, so one by one
    // they took a second each)
    let mut forms: Vec<(Vec<Vec<u8>>, String)> = vec![];
    for redirect in [format!("MOVED {slot} {fake}"), format!("ASK {slot} {fake}")] {
        let eval = format!("return redis.error_reply('{redirect}')");
        for args in [
            vec!["EVAL", &eval, "0"],
            vec!["EVAL", &eval, "1", key],
            vec!["EVAL_RO", &eval, "1", key],
            vec!["FCALL", "trust_err", "0", &redirect],
            vec!["FCALL", "trust_err", "1", key, &redirect],
            vec!["FCALL_RO", "trust_err_ro", "1", key, &redirect],
        ] {
            forms.push((common::client::args(&args), redirect.clone()));
        }
    }
    let replies = c.pipeline(&forms.iter().map(|(args, _)| args.clone()).collect::<Vec<_>>());
    assert_eq!(replies.len(), forms.len());
    for ((args, redirect), reply) in forms.iter().zip(replies) {
        // the client gets the error exactly as the script returned it
        assert_eq!(reply, V::Err(redirect.clone()), "{:?}", String::from_utf8_lossy(&args.concat()));
        sent += 1;
    }
    // a burst of them, pipelined, from several clients at once
    let eval = format!("return redis.error_reply('MOVED {slot} {fake}')");
    let burst: Vec<_> = (0..4)
        .map(|_| {
            let eval = eval.clone();
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                let cmds: Vec<Vec<Vec<u8>>> =
                    (0..25).map(|_| common::client::args(&["EVAL", eval.as_str(), "0"])).collect();
                c.pipeline(&cmds)
            })
        })
        .collect();
    for h in burst {
        for r in h.join().expect("burst client") {
            assert!(r.err().is_some_and(|e| e.starts_with("MOVED ")), "{r:?}");
            sent += 1;
        }
    }

    // Every confirmation refresh has run by now (they wait at most a few seconds).
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(trap.contacted(), (0, 0), "heatshield connected to an address no cluster node announced");
    let refused = counter(&env, "heatshield_redirections_refused_total") - refused_before;
    assert_eq!(refused as usize, sent, "every fake redirection is counted as refused");

    // The slot map was not patched: the slot's key lands on its real master.
    assert_eq!(c.cmd(&["SET", key, "landed"]), V::ok());
    let owner = env.owners.of_key(key.as_bytes());
    assert_eq!(cmd_text(owner, &["GET", key]).trim(), "landed");
    assert_eq!(c.cmd(&["GET", key]), V::s("landed"));
    assert!(env.proxy.log().contains("redirection to an address the cluster does not announce"));
}

#[test]
fn fake_redirections_in_a_loop_do_not_become_a_refresh_storm() {
    let env = ClusterEnv::start(None);
    let port = env.proxy.port();
    let trap = Trap::start();
    let slot = key_slot(b"storm");
    let eval = format!("return redis.error_reply('MOVED {slot} 127.0.0.1:{}')", trap.port);
    let refreshes = || counter(&env, "heatshield_topology_refreshes_total");
    let before = refreshes();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (eval, stop, sent) = (eval.clone(), stop.clone(), sent.clone());
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                while !stop.load(Ordering::Relaxed) {
                    let r = c.cmd(&["EVAL", eval.as_str(), "0"]);
                    assert!(r.err().is_some_and(|e| e.starts_with("MOVED ")), "{r:?}");
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    for h in clients {
        h.join().expect("client");
    }
    let secs = started.elapsed().as_secs_f64();
    let done = refreshes() - before;
    let sent = sent.load(Ordering::Relaxed);
    eprintln!("{sent} fake redirections in {secs:.1} s caused {done} topology refreshes");
    assert!(sent >= 8, "the clients kept sending ({sent})");
    // one confirmation refresh a second, plus the periodic one every 5 s, plus slack
    assert!(done <= secs.ceil() + 3.0, "{done} refreshes in {secs:.1} s for {sent} fake redirections");
    assert_eq!(trap.contacted(), (0, 0));
}
