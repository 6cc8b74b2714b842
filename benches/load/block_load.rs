//! Load generator for the blocking-command benchmark (scripts/bench-blocking.py).
//!
//! cargo run --release --example block_load -- --addr HOST:PORT [--clients N] [--pushes P]
//!     [--rate R] [--tag T]
//!
//! N clients each block in `BLPOP {T}:i 0` on a list of their own (all lists carry the
//! hash tag T, so they live on one master and the same load can go straight to it). Once
//! all of them are blocked, a pusher `LPUSH`es P elements, R per second, each to a list
//! picked at random; the blocked client gets it, and blocks again. The handoff latency is
//! the time from just before the LPUSH is written to the client's reply being read.
//!
//! Prints one line of `name=value` pairs: the clients, the pushes served, and the handoff
//! latency's p50, p99 and max in microseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use heatshield::protocol::{ReplyScanner, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// One command, as heatshield's own protocol module writes it.
fn encode(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(Request::from_args(args).raw());
}

/// Length of the complete reply at the start of `b`, if it is complete.
fn reply_len(b: &[u8]) -> Option<usize> {
    ReplyScanner::new().scan(b).ok().flatten()
}

/// Reads one whole reply.
async fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    let mut tmp = [0u8; 1024];
    loop {
        if let Some(len) = reply_len(buf) {
            return buf.drain(..len).collect();
        }
        let got = s.read(&mut tmp).await.expect("read");
        assert!(got > 0, "connection closed");
        buf.extend_from_slice(&tmp[..got]);
    }
}

/// One blocked client: BLPOP on its list, report each handoff's latency, block again.
async fn client(
    addr: String,
    key: String,
    pushed_at: Arc<Vec<AtomicU64>>,
    i: usize,
    start: Instant,
    blocked: mpsc::UnboundedSender<()>,
    done: mpsc::UnboundedSender<u64>,
) {
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    s.set_nodelay(true).ok();
    let mut blpop = Vec::new();
    encode(&mut blpop, &["BLPOP", &key, "0"]);
    let mut buf = Vec::new();
    let mut first = true;
    loop {
        s.write_all(&blpop).await.expect("write");
        if first {
            let _ = blocked.send(());
            first = false;
        }
        let r = read_reply(&mut s, &mut buf).await;
        let now = start.elapsed().as_nanos() as u64;
        assert!(r[0] == b'*', "unexpected reply {}", String::from_utf8_lossy(&r));
        let at = pushed_at[i].load(Ordering::SeqCst);
        if done.send(now.saturating_sub(at) / 1000).is_err() {
            return;
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut addr = String::from("127.0.0.1:6380");
    let (mut clients, mut pushes, mut rate, mut tag) = (5000usize, 5000usize, 1000u64, String::from("blk"));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--addr" => addr = v,
            "--clients" => clients = v.parse().expect("--clients N"),
            "--pushes" => pushes = v.parse().expect("--pushes P"),
            "--rate" => rate = v.parse().expect("--rate R"),
            "--tag" => tag = v,
            other => panic!("unknown argument {other}"),
        }
    }
    let start = Instant::now();
    let pushed_at: Arc<Vec<AtomicU64>> = Arc::new((0..clients).map(|_| AtomicU64::new(0)).collect());
    let (btx, mut brx) = mpsc::unbounded_channel();
    let (dtx, mut drx) = mpsc::unbounded_channel();
    let keys: Vec<String> = (0..clients).map(|i| format!("{{{tag}}}:{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        tokio::spawn(client(addr.clone(), k.clone(), pushed_at.clone(), i, start, btx.clone(), dtx.clone()));
        if i % 200 == 199 {
            tokio::task::yield_now().await; // do not open every connection in one burst
        }
    }
    for _ in 0..clients {
        brx.recv().await.expect("a client");
    }
    // the last BLPOPs were written; let them reach Redis
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut pusher = TcpStream::connect(&addr).await.expect("connect");
    pusher.set_nodelay(true).ok();
    let mut buf = Vec::new();
    let mut lat = Vec::with_capacity(pushes);
    let every = Duration::from_nanos(1_000_000_000 / rate.max(1));
    let mut next = Instant::now();
    let mut seed: u64 = 0x9E3779B97F4A7C15;
    let mut waiting = 0usize;
    for _ in 0..pushes {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let i = (seed % clients as u64) as usize;
        let mut cmd = Vec::new();
        encode(&mut cmd, &["LPUSH", &keys[i], "x"]);
        pushed_at[i].store(start.elapsed().as_nanos() as u64, Ordering::SeqCst);
        pusher.write_all(&cmd).await.expect("write");
        let _ = read_reply(&mut pusher, &mut buf).await;
        waiting += 1;
        while let Ok(us) = drx.try_recv() {
            lat.push(us);
            waiting -= 1;
        }
        next += every;
        tokio::time::sleep_until(next.into()).await;
    }
    while waiting > 0 {
        match tokio::time::timeout(Duration::from_secs(10), drx.recv()).await {
            Ok(Some(us)) => {
                lat.push(us);
                waiting -= 1;
            }
            _ => break,
        }
    }
    lat.sort_unstable();
    let q = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p) as usize).copied().unwrap_or(0);
    println!(
        "clients={clients} pushes={} served={} p50_us={} p99_us={} max_us={}",
        pushes,
        lat.len(),
        q(0.5),
        q(0.99),
        lat.last().copied().unwrap_or(0)
    );
    std::process::exit(0);
}
