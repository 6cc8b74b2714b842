//! Load generator for the lock benchmark (scripts/bench-locks.py).
//!
//! cargo run --release --example lock_load -- --addr HOST:PORT --mode MODE [--clients N] [--seconds S]
//!
//! Modes:
//! - `pairs`: each client takes and releases its own lock in a loop with
//!   `LOCK.ACQUIRE k owner 10000` + `LOCK.RELEASE k owner` (through heatshield);
//! - `plain`: the same with `SET k token NX PX 10000` + an EVAL compare-and-delete, the
//!   idiom clients run directly on Redis;
//! - `contended`: every client loops on one key with `LOCK.ACQUIRE ... WAIT 5000`, then
//!   `LOCK.RELEASE`; reports acquisitions/s and the wake-up latency (from a release's reply
//!   to the next holder's token) at p50 and p99.
//!
//! Prints one line of `name=value` pairs.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heatshield::protocol::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// One command, as heatshield's own protocol module writes it.
fn encode(args: &[&str]) -> Vec<u8> {
    Request::from_args(args).raw().to_vec()
}

/// Sends one command and returns its (simple) reply line, e.g. `:12`, `+OK`, `$-1`.
async fn call(s: &mut TcpStream, buf: &mut Vec<u8>, args: &[&str]) -> String {
    s.write_all(&encode(args)).await.unwrap();
    loop {
        if let Some(nl) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&buf[..nl]).into_owned();
            let mut end = nl + 2;
            if let Some(n) = line.strip_prefix('$').and_then(|n| n.parse::<i64>().ok())
                && n >= 0
            {
                end += n as usize + 2;
                if buf.len() < end {
                    read_more(s, buf).await;
                    continue;
                }
            }
            buf.drain(..end);
            return line;
        }
        read_more(s, buf).await;
    }
}

async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut tmp = [0u8; 4096];
    let n = s.read(&mut tmp).await.unwrap();
    assert!(n > 0, "server closed the connection");
    buf.extend_from_slice(&tmp[..n]);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // without --addr (run by hand with no flags) there is nothing to load: say what this is
    if !args.iter().any(|a| a == "--addr") {
        println!("lock_load: a load generator for scripts/bench-locks.py");
        return;
    }
    let get = |flag: &str, default: &str| -> String {
        args.iter().position(|a| a == flag).map(|i| args[i + 1].clone()).unwrap_or_else(|| default.to_string())
    };
    let addr = get("--addr", "127.0.0.1:6380");
    let mode = get("--mode", "pairs");
    let clients: usize = get("--clients", "50").parse().unwrap();
    let seconds: f64 = get("--seconds", "5").parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(run(addr, mode, clients, seconds));
}

async fn run(addr: String, mode: String, clients: usize, seconds: f64) {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    // (time, is_release) events of the contended mode
    let events: Arc<Mutex<Vec<(Duration, bool)>>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (addr, mode, events) = (addr.clone(), mode.clone(), events.clone());
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            let mut buf = Vec::new();
            let owner = format!("owner-{c}");
            let key = format!("bench:lock:{c}");
            let mut done = 0u64;
            let mut i = 0u64;
            while Instant::now() < deadline {
                i += 1;
                match mode.as_str() {
                    "pairs" => {
                        let t = call(&mut s, &mut buf, &["LOCK.ACQUIRE", &key, &owner, "10000"]).await;
                        assert!(t.starts_with(':'), "ACQUIRE: {t}");
                        let r = call(&mut s, &mut buf, &["LOCK.RELEASE", &key, &owner]).await;
                        assert_eq!(r, ":1", "RELEASE");
                    }
                    "plain" => {
                        let token = format!("{owner}-{i}");
                        let r = call(&mut s, &mut buf, &["SET", &key, &token, "NX", "PX", "10000"]).await;
                        assert_eq!(r, "+OK", "SET NX");
                        let r = call(&mut s, &mut buf, &["EVAL", UNLOCK, "1", &key, &token]).await;
                        assert_eq!(r, ":1", "unlock");
                    }
                    "contended" => {
                        let t = call(
                            &mut s,
                            &mut buf,
                            &["LOCK.ACQUIRE", "bench:lock:hot", &owner, "10000", "WAIT", "5000"],
                        )
                        .await;
                        if !t.starts_with(':') {
                            continue; // timed out: try again
                        }
                        let got = start.elapsed();
                        let r = call(&mut s, &mut buf, &["LOCK.RELEASE", "bench:lock:hot", &owner]).await;
                        assert_eq!(r, ":1", "RELEASE");
                        let rel = start.elapsed();
                        let mut ev = events.lock().unwrap();
                        ev.push((got, false));
                        ev.push((rel, true));
                    }
                    other => panic!("unknown mode {other}"),
                }
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let mut line = format!("mode={mode} ops={total} seconds={secs:.2} per_sec={:.0}", total as f64 / secs);
    if mode == "contended" {
        let mut ev = events.lock().unwrap().clone();
        ev.sort();
        let mut waits: Vec<Duration> = Vec::new();
        let mut last_release: Option<Duration> = None;
        for (t, is_release) in ev {
            if is_release {
                last_release = Some(t);
            } else if let Some(r) = last_release.take() {
                waits.push(t.saturating_sub(r));
            }
        }
        waits.sort();
        let q = |p: f64| {
            waits
                .get(((waits.len() as f64 * p) as usize).min(waits.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        line += &format!(" wake_p50_us={} wake_p99_us={}", q(0.5).as_micros(), q(0.99).as_micros());
    }
    println!("{line}");
}
