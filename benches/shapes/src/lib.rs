//! Two minimal Redis Cluster forwarders, to measure designs rather than features
//! (docs/design/performance.md, "One connection a node by default; two minimal proxies").
//! `shape-tasks` is heatshield's design at its barest (a task a client, a task a node
//! connection), `shape-loop` predixy's (one event loop owning every socket). They route
//! GET, SET and friends by their first key's slot and everything else to the first master;
//! no MOVED, no errors handled, no limits: benchmark tools, not proxies. Both take
//! heatshield's `--cluster HOST:PORT --listen HOST:PORT` (other arguments ignored), so
//! `scripts/bench-ab.sh` runs them beside heatshield or a peer. A package of its own
//! (`cargo build --release --manifest-path benches/shapes/Cargo.toml`), outside
//! heatshield's build.
//!
//! This file: what both share (RESP scanning, the slot of a key, the slot map, arguments).
use std::io::{Read, Write};

/// Length of one complete RESP value at the start of `b`, or None if incomplete.
pub fn scan(b: &[u8]) -> Option<usize> {
    let (end, line) = line(b)?;
    match b[0] {
        b'+' | b'-' | b':' => Some(end),
        b'$' => {
            let n = num(line);
            if n < 0 {
                return Some(end);
            }
            let total = end + n as usize + 2;
            (b.len() >= total).then_some(total)
        }
        b'*' => {
            let n = num(line);
            let mut at = end;
            for _ in 0..n.max(0) {
                at += scan(&b[at..])?;
            }
            Some(at)
        }
        _ => panic!("bad resp"),
    }
}

fn line(b: &[u8]) -> Option<(usize, &[u8])> {
    let i = memchr(b)?;
    Some((i + 2, &b[1..i]))
}

fn memchr(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

fn num(s: &[u8]) -> i64 {
    let (neg, s) = if s.first() == Some(&b'-') { (true, &s[1..]) } else { (false, s) };
    let mut n = 0i64;
    for &c in s {
        n = n * 10 + (c - b'0') as i64;
    }
    if neg { -n } else { n }
}

/// A request at the start of `b`: (its length, the slot of its key, or None without one).
pub fn request(b: &[u8]) -> Option<(usize, Option<u16>)> {
    if b.is_empty() {
        return None;
    }
    if b[0] != b'*' {
        // inline command: up to \n, keyless
        let i = b.iter().position(|&c| c == b'\n')?;
        return Some((i + 1, None));
    }
    let (mut at, l) = line(b)?;
    let n = num(l);
    let mut key = None;
    for i in 0..n {
        let (e, l) = line(&b[at..])?;
        let len = num(l) as usize;
        let s = at + e;
        if b.len() < s + len + 2 {
            return None;
        }
        if i == 1 {
            key = Some(slot(&b[s..s + len]));
        }
        at = s + len + 2;
    }
    Some((at, key))
}

pub fn slot(key: &[u8]) -> u16 {
    let k = match key.iter().position(|&c| c == b'{') {
        Some(s) => match key[s + 1..].iter().position(|&c| c == b'}') {
            Some(e) if e > 0 => &key[s + 1..s + 1 + e],
            _ => key,
        },
        None => key,
    };
    crc16(k) % 16384
}

/// Redis Cluster's CRC16 (XMODEM), from the `crc` crate as in heatshield.
const XMODEM: crc::Crc<u16, crc::Table<16>> = crc::Crc::<u16, crc::Table<16>>::new(&crc::CRC_16_XMODEM);

fn crc16(b: &[u8]) -> u16 {
    XMODEM.checksum(b)
}

/// --cluster and --listen from the command line (other arguments ignored).
pub fn args() -> (String, String) {
    let a: Vec<String> = std::env::args().collect();
    let get = |k: &str| a.iter().position(|x| x == k).map(|i| a[i + 1].clone()).expect(k);
    (get("--cluster"), get("--listen"))
}

/// The masters' addresses and the slot table (slot -> index into the addresses).
pub fn slot_map(seed: &str) -> (Vec<String>, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(seed).unwrap();
    s.write_all(b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n").unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    while scan(&buf).is_none() {
        let n = s.read(&mut chunk).unwrap();
        buf.extend_from_slice(&chunk[..n]);
    }
    // *N of [start, end, [host, port, id, ...], ...]
    let mut p = Parser { b: &buf, at: 0 };
    let mut addrs: Vec<String> = Vec::new();
    let mut table = vec![0u8; 16384];
    let n = p.head(b'*');
    for _ in 0..n {
        let m = p.head(b'*');
        let start = p.head(b':') as usize;
        let end = p.head(b':') as usize;
        let k = p.head(b'*');
        let host = p.bulk();
        let port = p.head(b':');
        for _ in 2..k {
            p.skip();
        }
        for _ in 3..m {
            p.skip();
        }
        let addr = format!("{}:{}", if host.is_empty() { "127.0.0.1".into() } else { host }, port);
        let i = addrs.iter().position(|a| *a == addr).unwrap_or_else(|| {
            addrs.push(addr);
            addrs.len() - 1
        });
        for t in &mut table[start..=end] {
            *t = i as u8;
        }
    }
    (addrs, table)
}

struct Parser<'a> {
    b: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn head(&mut self, t: u8) -> i64 {
        assert_eq!(self.b[self.at], t);
        let (e, l) = line(&self.b[self.at..]).unwrap();
        self.at += e;
        num(l)
    }
    fn bulk(&mut self) -> String {
        let n = self.head(b'$') as usize;
        let s = String::from_utf8_lossy(&self.b[self.at..self.at + n]).into_owned();
        self.at += n + 2;
        s
    }
    fn skip(&mut self) {
        self.at += scan(&self.b[self.at..]).unwrap();
    }
}
