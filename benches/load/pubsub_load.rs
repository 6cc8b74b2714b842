//! Load generator for the pub/sub benchmark (scripts/bench-pubsub.py).
//!
//! cargo run --release --example pubsub_load -- --addr HOST:PORT [--pub-addr HOST:PORT]
//!     [--subscribers N] [--seconds S] [--rate R] [--channel C]
//!
//! N subscribers connect to `--addr` and SUBSCRIBE to one channel; one publisher (on
//! `--pub-addr`, default `--addr`) PUBLISHes to it: R messages a second (0: as fast as
//! it can, 16 PUBLISHes in flight). Each message carries the microsecond it was sent at,
//! and each subscriber notes how long it took to reach it.
//!
//! Prints one line of `name=value` pairs: messages published per second, messages
//! delivered per second (all subscribers together), and delivery latency p50 / p99 / max
//! in microseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use heatshield::protocol::{ReplyScanner, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Latency buckets of 10 µs up to 2 s (the last bucket takes the rest).
const BUCKETS: usize = 200_000;

struct Shared {
    start: Instant,
    delivered: AtomicU64,
    hist: Vec<AtomicU64>,
    measuring: AtomicBool,
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

async fn subscriber(addr: String, channel: String, sh: Arc<Shared>, ready: tokio::sync::mpsc::Sender<()>) {
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    s.set_nodelay(true).ok();
    s.write_all(Request::from_args(&["SUBSCRIBE", &channel]).raw()).await.expect("write");
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut tmp = vec![0u8; 64 * 1024];
    let mut confirmed = false;
    loop {
        let got = match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&tmp[..got]);
        let now = sh.start.elapsed().as_micros() as u64;
        let mut at = 0;
        while let Ok(Some(n)) = ReplyScanner::new().scan(&buf[at..]) {
            let frame = &buf[at..at + n];
            at += n;
            if !confirmed {
                confirmed = true;
                let _ = ready.send(()).await;
                continue;
            }
            // the payload (the last bulk string) is the send time in µs
            let body = frame.rsplit(|&b| b == b'\n').nth(1).unwrap_or_default();
            let body = body.strip_suffix(b"\r").unwrap_or(body);
            let sent: u64 = std::str::from_utf8(body).ok().and_then(|t| t.parse().ok()).unwrap_or(now);
            if sh.measuring.load(Ordering::Relaxed) {
                let b = ((now.saturating_sub(sent)) / 10).min(BUCKETS as u64 - 1) as usize;
                sh.hist[b].fetch_add(1, Ordering::Relaxed);
                sh.delivered.fetch_add(1, Ordering::Relaxed);
            }
        }
        buf.drain(..at);
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr = arg(&args, "--addr").expect("--addr HOST:PORT");
    let pub_addr = arg(&args, "--pub-addr").unwrap_or_else(|| addr.clone());
    let subscribers: usize = arg(&args, "--subscribers").map_or(1000, |v| v.parse().unwrap());
    let seconds: f64 = arg(&args, "--seconds").map_or(5.0, |v| v.parse().unwrap());
    let rate: u64 = arg(&args, "--rate").map_or(0, |v| v.parse().unwrap());
    let channel = arg(&args, "--channel").unwrap_or_else(|| "bench-pubsub".into());
    let sh = Arc::new(Shared {
        start: Instant::now(),
        delivered: AtomicU64::new(0),
        hist: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        measuring: AtomicBool::new(false),
    });
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(subscribers);
    for _ in 0..subscribers {
        tokio::spawn(subscriber(addr.clone(), channel.clone(), sh.clone(), ready_tx.clone()));
    }
    for _ in 0..subscribers {
        ready_rx.recv().await.expect("a subscriber failed");
    }
    let mut p = TcpStream::connect(&pub_addr).await.expect("connect publisher");
    p.set_nodelay(true).ok();
    sh.measuring.store(true, Ordering::Relaxed);
    let began = Instant::now();
    let until = began + Duration::from_secs_f64(seconds);
    let window = if rate == 0 { 16 } else { 1 };
    let mut published = 0u64;
    let mut buf = Vec::with_capacity(4096);
    let mut tmp = [0u8; 4096];
    while Instant::now() < until {
        if rate > 0 {
            let due = began + Duration::from_secs_f64(published as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        let mut out = Vec::new();
        for _ in 0..window {
            let now = sh.start.elapsed().as_micros().to_string();
            out.extend_from_slice(Request::from_args(&["PUBLISH", &channel, &now]).raw());
        }
        p.write_all(&out).await.expect("publish");
        let mut replies = 0;
        while replies < window {
            match ReplyScanner::new().scan(&buf) {
                Ok(Some(n)) => {
                    assert!(buf[0] == b':', "PUBLISH answered {}", String::from_utf8_lossy(&buf[..n]));
                    buf.drain(..n);
                    replies += 1;
                }
                _ => {
                    let got = p.read(&mut tmp).await.expect("read");
                    assert!(got > 0, "publisher connection closed");
                    buf.extend_from_slice(&tmp[..got]);
                }
            }
        }
        published += window as u64;
    }
    // let the last messages arrive
    tokio::time::sleep(Duration::from_millis(300)).await;
    sh.measuring.store(false, Ordering::Relaxed);
    let took = began.elapsed().as_secs_f64() - 0.3;
    let counts: Vec<u64> = sh.hist.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let total: u64 = counts.iter().sum();
    let pct = |q: f64| {
        let want = (total as f64 * q).ceil() as u64;
        let mut acc = 0;
        for (i, c) in counts.iter().enumerate() {
            acc += c;
            if acc >= want.max(1) {
                return i as u64 * 10;
            }
        }
        0
    };
    let max = counts.iter().rposition(|&c| c > 0).unwrap_or(0) as u64 * 10;
    println!(
        "published_per_s={:.0} delivered_per_s={:.0} expected={} delivered={} p50_us={} p99_us={} max_us={}",
        published as f64 / took,
        sh.delivered.load(Ordering::Relaxed) as f64 / took,
        published * subscribers as u64,
        sh.delivered.load(Ordering::Relaxed),
        pct(0.5),
        pct(0.99),
        max
    );
}
