//! Distributed-lock commands (docs/locks.md): LOCK.ACQUIRE / RELEASE / EXTEND / INFO,
//! each one Lua script run atomically on the master that owns the lock key.
//!
//! A lock is a hash at the lock key (`owner`, `count`, `token`) with the lock's TTL; its
//! fencing counter is a companion key in the same slot that never expires, so tokens keep
//! increasing across releases and expiries. Scripts go whole (EVAL, which loads them) the
//! first time to each master, after that as EVALSHA, and, on NOSCRIPT, as EVAL again.
//!
//! Rooms: this file has the scripts (`scripts/*.lua`, compiled in), the argument parser,
//! the [`Locks`] service handle the request path uses, and the client's replies;
//! `task.rs` has the background task and the release subscriber.
//!
//! The lock task (on the control runtime) owns everything that outlives one request:
//! clients parked by `WAIT` (a FIFO per key, woken when a release is published on
//! `heatshield:lock-released` or seen through this proxy, with a jittered retry timed to
//! the holder's TTL in case a notification is lost), and `KEEPALIVE` locks (renewed every
//! TTL/3 while their client's connection lives, released when it closes).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::mailbox::{ReplyTx, Tag};
use crate::protocol::reply::{Value, error_text};
use crate::protocol::request::parse_i64;
use crate::protocol::{Proto, Request, Writer};
use crate::upstream::cluster::{NodePool, slot};

/// The channel releases are published on (the payload is the lock key).
pub const CHANNEL: &str = "heatshield:lock-released";
/// Longest a parked ACQUIRE waits for a notification before trying again anyway.
const FALLBACK_RETRY: Duration = Duration::from_millis(250);

/// KEYS: lock, fence. ARGV: owner, ttl-ms, wait ("1": the caller will wait, so the release
/// must be published). Returns the token, or -1 - PTTL when another owner holds the lock.
const ACQUIRE: &str = include_str!("scripts/acquire.lua");

/// KEYS: lock. ARGV: owner, force ("1": release whatever the count), channel. Returns 1
/// (now free; published when someone waits), 0 (still held by the owner), -1 (not held by
/// the owner).
const RELEASE: &str = include_str!("scripts/release.lua");

/// KEYS: lock. ARGV: owner, ttl-ms. Returns 1 (extended) or 0 (not held by the owner).
const EXTEND: &str = include_str!("scripts/extend.lua");

/// KEYS: lock. Returns {owner, count, pttl, token}, or nil when free.
const INFO: &str = include_str!("scripts/info.lua");

pub use crate::command::LockCmd;
pub use task::start;

mod task;

struct Script {
    body: &'static str,
    sha: String,
    /// Its bit in [`NodePool::first_send_of_own_script`].
    bit: u32,
}

impl Script {
    fn new(body: &'static str, bit: u32) -> Script {
        Script { body, sha: sha1_smol::Sha1::from(body).digest().to_string(), bit }
    }
}

/// The name of the key holding `key`'s fencing counter: in the same slot, hash tags
/// included.
pub fn fence_key(key: &[u8]) -> Vec<u8> {
    const SUFFIX: &[u8] = b":lock-fence";
    if slot::hash_tag(key).len() != key.len() {
        // the key's own tag stays the first one
        return [key, SUFFIX].concat();
    }
    if !key.is_empty() && !key.contains(&b'}') {
        // tag the whole key
        return [b"{".as_slice(), key, b"}", SUFFIX].concat();
    }
    // A key with a `}` but no tag (or an empty key) cannot be a tag itself: a short tag
    // known to land in its slot goes first (one table look-up, no search per command).
    let tag = slot_tag(slot(key));
    [b"{".as_slice(), tag.as_bytes(), b"}", key, SUFFIX].concat()
}

/// The smallest decimal number whose text hashes to `slot`, made once for every slot.
fn slot_tag(slot: u16) -> String {
    static TAGS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; crate::upstream::cluster::SLOTS];
        let (mut left, mut n) = (tags.len(), 0u32);
        let mut buf = itoa::Buffer::new();
        while left > 0 {
            let t = &mut tags[slot::slot(buf.format(n).as_bytes()) as usize];
            if *t == u32::MAX {
                *t = n;
                left -= 1;
            }
            n += 1;
        }
        tags
    });
    tags[slot as usize].to_string()
}

/// A parsed lock command.
#[derive(Debug, Clone)]
pub struct LockRequest {
    pub cmd: LockCmd,
    pub key: Bytes,
    pub owner: Bytes,
    pub ttl_ms: u64,
    /// ACQUIRE ... WAIT: how long to wait (0: try once).
    pub wait_ms: u64,
    pub keepalive: bool,
}

/// Parses LOCK.* arguments (arity was checked by the command table).
pub fn parse(cmd: LockCmd, name: &str, req: &Request) -> Result<LockRequest, String> {
    let arity = || crate::errors::wrong_arity(name);
    let ttl = |i: usize| -> Result<u64, String> {
        match parse_i64(req.arg(i)) {
            Some(n) if n > 0 => Ok(n as u64),
            Some(_) => Err(crate::errors::lock_invalid("ttl-ms", name, "must be greater than 0")),
            None => Err(crate::errors::NOT_AN_INTEGER.into()),
        }
    };
    let mut r =
        LockRequest { cmd, key: req.arg_bytes(1), owner: Bytes::new(), ttl_ms: 0, wait_ms: 0, keepalive: false };
    match cmd {
        LockCmd::Acquire => {
            r.owner = req.arg_bytes(2);
            r.ttl_ms = ttl(3)?;
            let mut i = 4;
            while i < req.argc() {
                let a = req.arg(i);
                if a.eq_ignore_ascii_case(b"WAIT") {
                    let Some(v) = (i + 1 < req.argc()).then(|| req.arg(i + 1)) else {
                        return Err(crate::errors::SYNTAX.into());
                    };
                    r.wait_ms = match parse_i64(v) {
                        Some(n) if n >= 0 => n as u64,
                        Some(_) => {
                            return Err(crate::errors::lock_invalid("timeout-ms", name, "must not be negative"));
                        }
                        None => return Err(crate::errors::NOT_AN_INTEGER.into()),
                    };
                    i += 2;
                } else if a.eq_ignore_ascii_case(b"KEEPALIVE") {
                    r.keepalive = true;
                    i += 1;
                } else {
                    return Err(crate::errors::SYNTAX.into());
                }
            }
        }
        LockCmd::Release => {
            if req.argc() != 3 {
                return Err(arity());
            }
            r.owner = req.arg_bytes(2);
        }
        LockCmd::Extend => {
            if req.argc() != 4 {
                return Err(arity());
            }
            r.owner = req.arg_bytes(2);
            r.ttl_ms = ttl(3)?;
        }
        LockCmd::Info => {
            if req.argc() != 2 {
                return Err(arity());
            }
        }
    }
    Ok(r)
}

/// The scripts, and the channel to the lock task.
pub struct Locks {
    acquire: Script,
    release: Script,
    extend: Script,
    info: Script,
    tx: OnceLock<mpsc::UnboundedSender<Event>>,
    next_id: AtomicU64,
    /// Requests parked now: releases through this proxy wake the lock task only if some are.
    parked: AtomicUsize,
    /// KEEPALIVE locks being renewed now.
    held: AtomicUsize,
    /// Parked requests that got the lock / that timed out.
    pub granted_after_wait: AtomicU64,
    pub wait_timeouts: AtomicU64,
}

impl Default for Locks {
    fn default() -> Self {
        Locks {
            acquire: Script::new(ACQUIRE, 0),
            release: Script::new(RELEASE, 1),
            extend: Script::new(EXTEND, 2),
            info: Script::new(INFO, 3),
            tx: OnceLock::new(),
            next_id: AtomicU64::new(1),
            parked: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            granted_after_wait: AtomicU64::new(0),
            wait_timeouts: AtomicU64::new(0),
        }
    }
}

/// Something the lock task must act on.
pub enum Event {
    /// A client parks an ACQUIRE ... WAIT.
    Park(Waiter),
    /// `key` may be free now.
    Wake(Bytes),
    /// A KEEPALIVE lock was acquired on a client's connection.
    Hold { client: u64, key: Bytes, owner: Bytes, ttl_ms: u64 },
    /// A lock was released through this proxy (stop renewing it).
    Released { client: u64, key: Bytes },
    /// A client's connection closed.
    Closed(u64),
}

/// A parked ACQUIRE.
pub struct Waiter {
    pub req: LockRequest,
    pub client: u64,
    pub proto: Proto,
    pub reply_to: ReplyTx,
    pub tag: Tag,
    pub deadline: Instant,
}

impl Locks {
    /// The EVALSHA command for `r`, or EVAL the first time its script goes to `node` (the
    /// master owning the key, when known).
    pub fn command(&self, r: &LockRequest, force: bool, node: Option<&NodePool>) -> Request {
        let (script, keys, args): (&Script, Vec<&[u8]>, Vec<Vec<u8>>) = match r.cmd {
            LockCmd::Acquire => (
                &self.acquire,
                vec![&r.key[..], &[]],
                vec![
                    r.owner.to_vec(),
                    r.ttl_ms.to_string().into_bytes(),
                    if r.wait_ms > 0 { b"1".to_vec() } else { b"0".to_vec() },
                ],
            ),
            LockCmd::Release => (
                &self.release,
                vec![&r.key[..]],
                vec![r.owner.to_vec(), if force { b"1".to_vec() } else { b"0".to_vec() }, CHANNEL.as_bytes().to_vec()],
            ),
            LockCmd::Extend => {
                (&self.extend, vec![&r.key[..]], vec![r.owner.to_vec(), r.ttl_ms.to_string().into_bytes()])
            }
            LockCmd::Info => (&self.info, vec![&r.key[..]], vec![]),
        };
        let full = node.is_some_and(|n| n.first_send_of_own_script(script.bit));
        let fence = if r.cmd == LockCmd::Acquire { fence_key(&r.key) } else { Vec::new() };
        let nkeys = keys.len().to_string();
        let mut a: Vec<&[u8]> = Vec::with_capacity(4 + keys.len() + args.len());
        if full {
            a.extend([b"EVAL".as_slice(), script.body.as_bytes()]);
        } else {
            a.extend([b"EVALSHA".as_slice(), script.sha.as_bytes()]);
        }
        a.push(nkeys.as_bytes());
        for (i, k) in keys.iter().enumerate() {
            a.push(if r.cmd == LockCmd::Acquire && i == 1 { &fence } else { k });
        }
        a.extend(args.iter().map(|v| v.as_slice()));
        Request::from_args(&a)
    }

    /// For a request that got NOSCRIPT: the same call as EVAL, if it is one of ours.
    pub fn eval_form(&self, data: &[u8]) -> Option<Bytes> {
        let req = Request::parse(data)?;
        if req.argc() < 3 || !req.arg(0).eq_ignore_ascii_case(b"EVALSHA") {
            return None;
        }
        let script = [&self.acquire, &self.release, &self.extend, &self.info]
            .into_iter()
            .find(|s| s.sha.as_bytes() == req.arg(1))?;
        let mut a: Vec<&[u8]> = vec![b"EVAL", script.body.as_bytes()];
        a.extend(req.args().skip(2));
        Some(Request::from_args(&a).raw().clone())
    }

    fn send(&self, e: Event) {
        if let Some(tx) = self.tx.get() {
            let _ = tx.send(e);
        }
    }

    /// Parks a WAIT request; false when the lock task is not running.
    pub fn park(&self, w: Waiter) -> bool {
        let Some(tx) = self.tx.get() else { return false };
        self.parked.fetch_add(1, Ordering::SeqCst);
        if tx.send(Event::Park(w)).is_err() {
            self.parked.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// A lock was acquired (`keepalive`: bound to the client's connection).
    pub fn acquired(&self, client: u64, r: &LockRequest) {
        if r.keepalive {
            self.send(Event::Hold { client, key: r.key.clone(), owner: r.owner.clone(), ttl_ms: r.ttl_ms });
        }
    }

    /// A lock was released through this proxy: wake its waiters here at once
    /// (`keepalive`: the client holds KEEPALIVE locks, which may include this one).
    pub fn released(&self, client: u64, key: &Bytes, keepalive: bool) {
        if keepalive {
            self.send(Event::Released { client, key: key.clone() });
        }
        if self.parked.load(Ordering::SeqCst) > 0 {
            self.send(Event::Wake(key.clone()));
        }
    }

    /// Publishes the lock gauges and counters (called periodically).
    pub fn publish_metrics(&self) {
        metrics::gauge!("heatshield_lock_waiters").set(self.parked.load(Ordering::Relaxed) as f64);
        metrics::gauge!("heatshield_lock_keepalive_locks").set(self.held.load(Ordering::Relaxed) as f64);
        metrics::counter!("heatshield_lock_waits_total", "result" => "acquired")
            .absolute(self.granted_after_wait.load(Ordering::Relaxed));
        metrics::counter!("heatshield_lock_waits_total", "result" => "timeout")
            .absolute(self.wait_timeouts.load(Ordering::Relaxed));
    }

    /// A client's connection closed: its parked requests go, its KEEPALIVE locks are
    /// released.
    pub fn closed(&self, client: u64) {
        self.send(Event::Closed(client));
    }
}

/// The client's reply for a script's reply. `Err` carries an error text for the client.
pub fn client_reply(r: &LockRequest, reply: &[u8], proto: Proto, scratch: &mut bytes::BytesMut) -> Bytes {
    let mut w = Writer::new(scratch, proto);
    if let Some(e) = error_text(reply) {
        // (a client of a lock command sends no script: it cannot answer NOSCRIPT)
        match e.starts_with(b"NOSCRIPT") {
            true => w.error(crate::errors::LOCK_SCRIPT_UNLOADED),
            false => w.error(&String::from_utf8_lossy(e)),
        }
        return scratch.split().freeze();
    }
    let v = match Value::parse(reply) {
        Ok((v, _)) => v,
        Err(_) => {
            w.error(crate::errors::LOCK_SCRIPT_REPLY);
            return scratch.split().freeze();
        }
    };
    match (r.cmd, v) {
        (LockCmd::Acquire, Value::Int(t)) if t > 0 => w.int(t),
        (LockCmd::Acquire, Value::Int(_)) => w.nil(),
        (LockCmd::Release, Value::Int(-1)) => w.error(&crate::errors::not_owner(&r.key, &r.owner)),
        (LockCmd::Release | LockCmd::Extend, Value::Int(n)) => w.int(n),
        (LockCmd::Info, Value::Nil) => w.nil(),
        (LockCmd::Info, Value::Array(items)) if items.len() == 4 => {
            w.map(4);
            w.bulk(b"owner");
            w.bulk(items[0].as_bytes().unwrap_or_default());
            w.bulk(b"count");
            w.int(items[1].as_int().unwrap_or(0));
            w.bulk(b"ttl_ms");
            w.int(items[2].as_int().unwrap_or(-1));
            w.bulk(b"token");
            w.int(items[3].as_int().unwrap_or(0));
        }
        _ => w.error(crate::errors::LOCK_SCRIPT_REPLY),
    }
    scratch.split().freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_key_shares_the_slot() {
        for key in [&b"order:42"[..], b"{user:1}:lock", b"a}b", b"a{}b", b"x{y", b"", b"}{", b"{a}{b}"] {
            let f = fence_key(key);
            assert_eq!(slot(&f), slot(key), "{:?} -> {:?}", String::from_utf8_lossy(key), String::from_utf8_lossy(&f));
            assert_ne!(f, key);
        }
    }

    #[test]
    fn fence_key_of_a_huge_key_with_a_brace_costs_no_search() {
        // before: a search of ~16,384 suffixes, each hashing the whole key again
        let key = [vec![b'k'; 1 << 20], b"}".to_vec()].concat();
        let _ = fence_key(b"}"); // the table is made once
        let t = std::time::Instant::now();
        for _ in 0..10 {
            assert_eq!(slot(&fence_key(&key)), slot(&key));
        }
        // a search would hash the 1 MiB key thousands of times (minutes); 30 hashes of it in
        // a debug build on a loaded machine took up to half a second
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{:?} for 10 fence keys", t.elapsed());
    }

    #[test]
    fn arguments_are_checked() {
        let p = |args: &[&str]| parse(LockCmd::Acquire, "lock.acquire", &Request::from_args(args));
        assert!(p(&["LOCK.ACQUIRE", "k", "o", "1000"]).is_ok());
        let r = p(&["LOCK.ACQUIRE", "k", "o", "1000", "wait", "50", "KEEPALIVE"]).unwrap();
        assert_eq!((r.wait_ms, r.keepalive), (50, true));
        assert_eq!(
            p(&["LOCK.ACQUIRE", "k", "o", "0"]).unwrap_err(),
            "ERR invalid ttl-ms in 'lock.acquire' command: must be greater than 0"
        );
        assert_eq!(p(&["LOCK.ACQUIRE", "k", "o", "x"]).unwrap_err(), "ERR value is not an integer or out of range");
        assert_eq!(p(&["LOCK.ACQUIRE", "k", "o", "10", "WAIT"]).unwrap_err(), "ERR syntax error");
        assert_eq!(p(&["LOCK.ACQUIRE", "k", "o", "10", "NOPE"]).unwrap_err(), "ERR syntax error");
    }
}
