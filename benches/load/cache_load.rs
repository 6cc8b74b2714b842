//! Load generator for the hot-key cache benchmark (scripts/bench-cache.py): 50 clients
//! (one tokio task each, on one thread) sending GETs as fast as they can, either all of
//! one key or keys drawn from a Zipf distribution over a keyspace. redis-benchmark has
//! no Zipf mode, so both workloads use this generator, against every target alike.
//!
//! cargo run --release --example cache_load -- --addr 127.0.0.1:7410 [--mode hot|zipf|prefill]
//!     [--clients 50] [--seconds 5] [--keys 100000] [--zipf 1.1] [--pipeline 1]
//!
//! Prints one line: `ops=<n> seconds=<s> ops_per_sec=<r> errors=<e>`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use heatshield::protocol::ReplyScanner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Opts {
    addr: String,
    mode: String,
    clients: usize,
    seconds: f64,
    keys: usize,
    zipf: f64,
    pipeline: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        addr: "127.0.0.1:6380".into(),
        mode: "hot".into(),
        clients: 50,
        seconds: 5.0,
        keys: 100_000,
        zipf: 1.1,
        pipeline: 1,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.chunks(2);
    for pair in &mut it {
        let [k, v] = pair else { panic!("flags come in pairs: {args:?}") };
        match k.as_str() {
            "--addr" => o.addr = v.clone(),
            "--mode" => o.mode = v.clone(),
            "--clients" => o.clients = v.parse().expect("--clients"),
            "--seconds" => o.seconds = v.parse().expect("--seconds"),
            "--keys" => o.keys = v.parse().expect("--keys"),
            "--zipf" => o.zipf = v.parse().expect("--zipf"),
            "--pipeline" => o.pipeline = v.parse().expect("--pipeline"),
            other => panic!("unknown flag {other}"),
        }
    }
    o
}

fn get(key: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*2\r\n$3\r\nGET\r\n${}\r\n", key.len()).as_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(b"\r\n");
}

fn set(key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*3\r\n$3\r\nSET\r\n${}\r\n", key.len()).as_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(format!("\r\n${}\r\n", value.len()).as_bytes());
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Length of one complete reply at the start of `b`, if it is complete.
fn reply_len(b: &[u8]) -> Option<usize> {
    ReplyScanner::new().scan(b).ok().flatten()
}

struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn main() {
    // without --addr (run by hand with no flags) there is nothing to load: say what this is
    if !std::env::args().any(|a| a == "--addr") {
        println!("cache_load: a load generator for scripts/bench-cache.py; see its --help");
        return;
    }
    let o = opts();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(run(o));
}

async fn run(o: Opts) {
    let keys: Arc<Vec<Vec<u8>>> = Arc::new((1..=o.keys).map(|i| format!("item:{i}").into_bytes()).collect());
    if o.mode == "prefill" {
        let mut s = TcpStream::connect(&o.addr).await.unwrap();
        let value = vec![b'v'; 100];
        for chunk in keys.chunks(1000) {
            let mut out = Vec::new();
            for k in chunk {
                set(k, &value, &mut out);
            }
            set(b"hotkey", &value, &mut out);
            s.write_all(&out).await.unwrap();
            let mut buf = Vec::new();
            let mut got = 0;
            while got < chunk.len() + 1 {
                let mut tmp = [0u8; 65536];
                let n = s.read(&mut tmp).await.unwrap();
                assert!(n > 0, "closed");
                buf.extend_from_slice(&tmp[..n]);
                while let Some(l) = reply_len(&buf) {
                    assert_eq!(buf[0], b'+', "SET failed: {}", String::from_utf8_lossy(&buf[..l]));
                    buf.drain(..l);
                    got += 1;
                }
            }
        }
        println!("prefilled {} keys and hotkey", o.keys);
        return;
    }
    // Zipf CDF over ranks 1..=keys
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=o.keys)
        .map(|r| {
            acc += 1.0 / (r as f64).powf(o.zipf);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    let cdf = Arc::new(cdf);
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(o.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..o.clients {
        let (keys, cdf, ops, errors) = (keys.clone(), cdf.clone(), ops.clone(), errors.clone());
        let (addr, mode, pipeline) = (o.addr.clone(), o.mode.clone(), o.pipeline);
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (c as u64 + 1).wrapping_mul(0x1234_5678_9ABC_DEF1));
            let mut out = Vec::with_capacity(4096);
            let mut buf = Vec::with_capacity(65536);
            let mut tmp = vec![0u8; 65536];
            while Instant::now() < deadline {
                out.clear();
                for _ in 0..pipeline {
                    if mode == "hot" {
                        get(b"hotkey", &mut out);
                    } else {
                        let u = rng.next_f64();
                        let r = cdf.partition_point(|&x| x < u).min(keys.len() - 1);
                        get(&keys[r], &mut out);
                    }
                }
                s.write_all(&out).await.unwrap();
                let mut got = 0;
                while got < pipeline {
                    if let Some(l) = reply_len(&buf) {
                        if buf[0] == b'-' {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                        buf.drain(..l);
                        got += 1;
                        continue;
                    }
                    let n = s.read(&mut tmp).await.unwrap();
                    assert!(n > 0, "server closed the connection");
                    buf.extend_from_slice(&tmp[..n]);
                }
                ops.fetch_add(pipeline as u64, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let n = ops.load(Ordering::Relaxed);
    println!("ops={n} seconds={secs:.2} ops_per_sec={:.0} errors={}", n as f64 / secs, errors.load(Ordering::Relaxed));
}
