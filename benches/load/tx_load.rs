//! Load generator for the transaction benchmark (scripts/bench-tx.py).
//!
//! cargo run --release --example tx_load -- --addr HOST:PORT [--clients N] [--seconds S] [--tag T]
//!
//! Each client loops on one same-slot 3-command transaction, sent in one write as a client
//! library pipelines it: `MULTI`, `INCR {T}:i:n`, `SET {T}:i:k v`, `GET {T}:i:k`, `EXEC`,
//! and reads the five replies. Every key has the hash tag T (`--tag`), so all of them are
//! in one slot and the same load can go straight to that slot's master.
//!
//! Prints one line of `name=value` pairs: transactions per second.

use std::time::{Duration, Instant};

use heatshield::protocol::{ReplyScanner, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One command, as heatshield's own protocol module writes it.
fn encode(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(Request::from_args(args).raw());
}

/// Length of the complete reply at the start of `b`, if it is complete.
fn reply_len(b: &[u8]) -> Option<usize> {
    ReplyScanner::new().scan(b).ok().flatten()
}

async fn client(addr: String, tag: String, i: usize, until: Instant) -> u64 {
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    s.set_nodelay(true).ok();
    let (n, k) = (format!("{{{tag}}}:{i}:n"), format!("{{{tag}}}:{i}:k"));
    let mut tx = Vec::new();
    encode(&mut tx, &["MULTI"]);
    encode(&mut tx, &["INCR", &n]);
    encode(&mut tx, &["SET", &k, "v"]);
    encode(&mut tx, &["GET", &k]);
    encode(&mut tx, &["EXEC"]);
    let mut buf = Vec::with_capacity(4096);
    let mut tmp = [0u8; 4096];
    let mut done = 0;
    while Instant::now() < until {
        s.write_all(&tx).await.expect("write");
        let mut replies = 0;
        while replies < 5 {
            match reply_len(&buf) {
                Some(len) => {
                    assert!(buf[0] != b'-', "error reply: {}", String::from_utf8_lossy(&buf[..len]));
                    buf.drain(..len);
                    replies += 1;
                }
                None => {
                    let got = s.read(&mut tmp).await.expect("read");
                    assert!(got > 0, "connection closed");
                    buf.extend_from_slice(&tmp[..got]);
                }
            }
        }
        done += 1;
    }
    done
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut addr = String::from("127.0.0.1:6380");
    let (mut clients, mut seconds, mut tag) = (50usize, 5u64, String::from("tx"));
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--addr" => addr = v,
            "--clients" => clients = v.parse().expect("--clients N"),
            "--seconds" => seconds = v.parse().expect("--seconds S"),
            "--tag" => tag = v,
            other => panic!("unknown argument {other}"),
        }
    }
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..clients).map(|i| tokio::spawn(client(addr.clone(), tag.clone(), i, until))).collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("client task");
    }
    let took = start.elapsed().as_secs_f64();
    println!("transactions={total} seconds={took:.2} tps={:.0}", total as f64 / took);
}
