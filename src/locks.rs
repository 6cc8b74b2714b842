//! Distributed-lock commands (docs/locks.md): LOCK.ACQUIRE / RELEASE / EXTEND / INFO,
//! each one Lua script run atomically on the master that owns the lock key.
//!
//! A lock is a hash at the lock key (`owner`, `count`, `token`) with the lock's TTL; its
//! fencing counter is a companion key in the same slot that never expires, so tokens keep
//! increasing across releases and expiries. Scripts go as EVALSHA and, on NOSCRIPT, as
//! EVAL (which loads them again).
//!
//! The [`Locks`] task (on the control runtime) owns everything that outlives one request:
//! clients parked by `WAIT` (a FIFO per key, woken when a release is published on
//! `heatshield:lock-released` or seen through this proxy, with a jittered retry timed to
//! the holder's TTL in case a notification is lost), and `KEEPALIVE` locks (renewed every
//! TTL/3 while their client's connection lives, released when it closes).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::backend::{BackendError, BackendReply, BackendRequest, Prefix, ReplyTx, Tag};
use crate::cluster::slot;
use crate::protocol::reply::{Redirect, Value, error_text, parse_redirect};
use crate::protocol::request::parse_i64;
use crate::protocol::{Proto, Request, Writer};

/// The channel releases are published on (the payload is the lock key).
pub const CHANNEL: &str = "heatshield:lock-released";
/// Longest a parked ACQUIRE waits for a notification before trying again anyway.
const FALLBACK_RETRY: Duration = Duration::from_millis(250);

/// KEYS: lock, fence. ARGV: owner, ttl-ms, wait ("1": the caller will wait, so the release
/// must be published). Returns the token, or -1 - PTTL when another owner holds the lock.
const ACQUIRE: &str = r#"local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', token)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return token
end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'count', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'token'))
end
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'waiting', 1) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = 0 end
return -1 - ttl
"#;

/// KEYS: lock. ARGV: owner, force ("1": release whatever the count), channel. Returns 1
/// (now free; published when someone waits), 0 (still held by the owner), -1 (not held by
/// the owner).
const RELEASE: &str = r#"local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return -1 end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
if ARGV[2] ~= '1' and redis.call('HINCRBY', KEYS[1], 'count', -1) > 0 then return 0 end
local waiting = redis.call('HEXISTS', KEYS[1], 'waiting')
redis.call('DEL', KEYS[1])
if waiting == 1 then redis.call('PUBLISH', ARGV[3], KEYS[1]) end
return 1
"#;

/// KEYS: lock. ARGV: owner, ttl-ms. Returns 1 (extended) or 0 (not held by the owner).
const EXTEND: &str = r#"local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return 0 end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

/// KEYS: lock. Returns {owner, count, pttl, token}, or nil when free.
const INFO: &str = r#"local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then return false end
if t ~= 'hash' or redis.call('HEXISTS', KEYS[1], 'owner') == 0 then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
local v = redis.call('HMGET', KEYS[1], 'owner', 'count', 'token')
return {v[1], tonumber(v[2]), redis.call('PTTL', KEYS[1]), tonumber(v[3])}
"#;

pub use crate::command::LockCmd;

struct Script {
    body: &'static str,
    sha: String,
}

impl Script {
    fn new(body: &'static str) -> Script {
        Script { body, sha: sha1_smol::Sha1::from(body).digest().to_string() }
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
        let mut tags = vec![u32::MAX; crate::cluster::SLOTS];
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
    let arity = || format!("ERR wrong number of arguments for '{name}' command");
    let ttl = |i: usize| -> Result<u64, String> {
        match parse_i64(req.arg(i)) {
            Some(n) if n > 0 => Ok(n as u64),
            Some(_) => Err(format!("ERR invalid ttl-ms in '{name}' command: must be greater than 0")),
            None => Err("ERR value is not an integer or out of range".into()),
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
                        return Err("ERR syntax error".into());
                    };
                    r.wait_ms = match parse_i64(v) {
                        Some(n) if n >= 0 => n as u64,
                        Some(_) => {
                            return Err(format!("ERR invalid timeout-ms in '{name}' command: must not be negative"));
                        }
                        None => return Err("ERR value is not an integer or out of range".into()),
                    };
                    i += 2;
                } else if a.eq_ignore_ascii_case(b"KEEPALIVE") {
                    r.keepalive = true;
                    i += 1;
                } else {
                    return Err("ERR syntax error".into());
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
            acquire: Script::new(ACQUIRE),
            release: Script::new(RELEASE),
            extend: Script::new(EXTEND),
            info: Script::new(INFO),
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
    /// The EVALSHA command for `r` (or EVAL when `full`).
    pub fn command(&self, r: &LockRequest, full: bool, force: bool) -> Request {
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
        w.error(&String::from_utf8_lossy(e));
        return scratch.split().freeze();
    }
    let v = match Value::parse(reply) {
        Ok((v, _)) => v,
        Err(_) => {
            w.error("ERR heatshield: unexpected reply from the lock script");
            return scratch.split().freeze();
        }
    };
    match (r.cmd, v) {
        (LockCmd::Acquire, Value::Int(t)) if t > 0 => w.int(t),
        (LockCmd::Acquire, Value::Int(_)) => w.nil(),
        (LockCmd::Release, Value::Int(-1)) => w.error(&format!(
            "NOTOWNER lock '{}' is not held by '{}'",
            String::from_utf8_lossy(&r.key),
            String::from_utf8_lossy(&r.owner)
        )),
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
        _ => w.error("ERR heatshield: unexpected reply from the lock script"),
    }
    scratch.split().freeze()
}

/// What the lock task and the subscriber use: the lock service and the cluster view,
/// nothing else of the proxy.
pub struct Handles {
    locks: Arc<Locks>,
    cluster: Arc<crate::cluster::Cluster>,
}

/// Starts the lock task and the release subscriber on the current runtime.
pub fn start(locks: Arc<Locks>, cluster: Arc<crate::cluster::Cluster>) {
    let h = Arc::new(Handles { locks, cluster });
    let (tx, rx) = mpsc::unbounded_channel();
    if h.locks.tx.set(tx.clone()).is_err() {
        return;
    }
    tokio::spawn(run(h.clone(), rx));
    tokio::spawn(subscriber(h, tx));
}

/// Listens for releases published anywhere in the cluster (PUBLISH reaches every node).
async fn subscriber(h: Arc<Handles>, tx: mpsc::UnboundedSender<Event>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut attempt = 0usize;
    loop {
        let masters = h.cluster.topology().masters.clone();
        if let Some(node) = masters.get(attempt % masters.len().max(1)) {
            let opts = crate::backend::BackendOptions { resp3: false, tracking: None, ..node.options().clone() };
            if let Ok((mut s, _)) = crate::backend::connect(&node.addr, &opts).await {
                let sub = Request::from_args(&["SUBSCRIBE", CHANNEL]);
                if s.write_all(sub.raw()).await.is_ok() {
                    debug!(node = %node.addr, "lock release subscriber up");
                    let mut buf = bytes::BytesMut::with_capacity(4096);
                    let mut sc = crate::protocol::reply::ReplyScanner::new();
                    'read: while let Ok(n) = s.read_buf(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        while let Ok(Some(len)) = sc.scan(&buf) {
                            let frame = buf.split_to(len);
                            if let Ok((Value::Array(items), _)) = Value::parse(&frame)
                                && items.len() == 3
                                && items[0].as_bytes() == Some(b"message")
                                && let Some(key) = items[2].as_bytes()
                                && tx.send(Event::Wake(Bytes::copy_from_slice(key))).is_err()
                            {
                                break 'read;
                            }
                        }
                    }
                }
            }
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A lock renewed while its client's connection lives.
struct Held {
    key: Bytes,
    owner: Bytes,
    ttl_ms: u64,
    next: Instant,
}

/// The lock task's state. Nothing here is scanned whole per event: what comes due (a
/// waiter's deadline, a queue head's next try, a renewal) sits in `timers`, and each
/// event touches only its own key's queue or its own client's locks, so 10,000 parked
/// waiters cost O(log n) per event, not O(n).
struct State {
    queues: HashMap<Bytes, VecDeque<Parked>>,
    /// KEEPALIVE locks, by client.
    held: HashMap<u64, Vec<Held>>,
    /// Requests in flight from this task, by id.
    inflight: HashMap<u64, Flight>,
    /// When something may be due. Entries can be stale (the waiter left, the head moved
    /// on); each is checked against the state when it comes up.
    timers: BinaryHeap<Reverse<(Instant, Due)>>,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// Parked request `id` on `key` times out.
    Deadline(Bytes, u64),
    /// The head of `key`'s queue may try again.
    Try(Bytes),
    /// A KEEPALIVE lock of this client may need renewing.
    Renew(u64),
}

struct Parked {
    w: Waiter,
    /// Increasing in queue order (ids are handed out in parking order).
    id: u64,
    trying: bool,
    /// Attempts that met transport trouble or a redirection (for the warning).
    failures: u32,
    /// A wake-up came while an attempt was in flight: if that attempt finds the lock
    /// held, try again at once (the release may have come after the attempt ran).
    woken: bool,
    next_try: Instant,
}

enum Flight {
    /// An ACQUIRE attempt for the head waiter of `key`.
    Attempt { key: Bytes, data: Bytes },
    /// A KEEPALIVE renewal, a release on close, or the release of a lock taken for a
    /// client that left: fire and forget, retried on NOSCRIPT.
    Other { key: Bytes, data: Bytes, renewal_of: Option<u64> },
}

impl State {
    fn at(&mut self, when: Instant, due: Due) {
        self.timers.push(Reverse((when, due)));
    }

    /// The head of `key`'s queue tries at `when` (or later, if it is trying now).
    fn try_at(&mut self, key: &Bytes, when: Instant) {
        if let Some(p) = self.queues.get_mut(key).and_then(|q| q.front_mut()) {
            p.next_try = when;
            self.timers.push(Reverse((when, Due::Try(key.clone()))));
        }
    }

    /// A KEEPALIVE lock to renew for `client`.
    fn hold(&mut self, client: u64, lock: Held, locks: &Locks) {
        let next = lock.next;
        let l = self.held.entry(client).or_default();
        if l.iter().any(|x| x.key == lock.key) {
            return;
        }
        l.push(lock);
        locks.held.fetch_add(1, Ordering::Relaxed);
        self.at(next, Due::Renew(client));
    }

    /// Stops renewing `client`'s lock on `key` (every lock of the client with `None`);
    /// returns what was renewed.
    fn unhold(&mut self, client: u64, key: Option<&Bytes>, locks: &Locks) -> Vec<Held> {
        let Some(l) = self.held.get_mut(&client) else { return Vec::new() };
        let gone: Vec<Held> = match key {
            Some(k) => {
                let (gone, kept) = std::mem::take(l).into_iter().partition(|l| l.key == *k);
                *l = kept;
                gone
            }
            None => std::mem::take(l),
        };
        if l.is_empty() {
            self.held.remove(&client);
        }
        locks.held.fetch_sub(gone.len(), Ordering::Relaxed);
        gone
    }
}

async fn run(h: Arc<Handles>, mut rx: mpsc::UnboundedReceiver<Event>) {
    let (rtx, mut rrx) = mpsc::unbounded_channel::<BackendReply>();
    let mut st =
        State { queues: HashMap::new(), held: HashMap::new(), inflight: HashMap::new(), timers: BinaryHeap::new() };
    let locks = &h.locks;
    loop {
        let next = st.timers.peek().map_or(Instant::now() + Duration::from_secs(1), |Reverse((t, _))| *t);
        tokio::select! {
            e = rx.recv() => {
                let Some(e) = e else { return };
                match e {
                    Event::Park(w) => {
                        let id = locks.next_id.fetch_add(1, Ordering::Relaxed);
                        let key = w.req.key.clone();
                        let deadline = w.deadline;
                        let q = st.queues.entry(key.clone()).or_default();
                        let head = q.is_empty();
                        q.push_back(Parked { w, id, trying: false, failures: 0, woken: false, next_try: Instant::now() });
                        st.at(deadline, Due::Deadline(key.clone(), id));
                        if head {
                            st.try_at(&key, Instant::now());
                        }
                    }
                    Event::Wake(key) => {
                        if let Some(p) = st.queues.get_mut(&key).and_then(|q| q.front_mut()) {
                            p.woken |= p.trying;
                            st.try_at(&key, Instant::now());
                        }
                    }
                    Event::Hold { client, key, owner, ttl_ms } => {
                        let next = Instant::now() + Duration::from_millis(ttl_ms / 3);
                        st.hold(client, Held { key, owner, ttl_ms, next }, locks);
                    }
                    Event::Released { client, key } => {
                        st.unhold(client, Some(&key), locks);
                    }
                    Event::Closed(client) => {
                        // Its parked requests leave when they come up (their reply channel
                        // is closed): at the head of their queue, or at their deadline.
                        for lock in st.unhold(client, None, locks) {
                            let r = LockRequest { cmd: LockCmd::Release, key: lock.key, owner: lock.owner, ttl_ms: 0, wait_ms: 0, keepalive: false };
                            fire(&h, &mut st, &rtx, &r, true, None);
                        }
                    }
                }
            }
            Some(r) = rrx.recv() => on_reply(&h, &mut st, &rtx, r),
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        tick(&h, &mut st, &rtx);
    }
}

/// Acts on everything that has come due: timed-out waiters, queue heads that may try,
/// KEEPALIVE renewals.
fn tick(h: &Handles, st: &mut State, rtx: &mpsc::UnboundedSender<BackendReply>) {
    let now = Instant::now();
    while let Some(Reverse((when, _))) = st.timers.peek() {
        if *when > now {
            break;
        }
        let Some(Reverse((_, due))) = st.timers.pop() else { break };
        match due {
            Due::Deadline(key, id) => {
                let Some(q) = st.queues.get_mut(&key) else { continue };
                let Ok(pos) = q.binary_search_by_key(&id, |p| p.id) else { continue };
                if q[pos].trying {
                    continue; // its attempt's reply decides
                }
                let Some(p) = q.remove(pos) else { continue };
                h.locks.parked.fetch_sub(1, Ordering::SeqCst);
                if deliver(&p.w, None) {
                    h.locks.wait_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                if q.is_empty() {
                    st.queues.remove(&key);
                } else if pos == 0 {
                    let at = q[0].next_try.max(now);
                    st.try_at(&key, at);
                }
            }
            Due::Try(key) => start_attempt(h, st, rtx, &key, now),
            Due::Renew(client) => {
                let Some(locks) = st.held.get_mut(&client) else { continue };
                let mut due = Vec::new();
                for lock in locks.iter_mut().filter(|l| now >= l.next) {
                    lock.next = now + Duration::from_millis((lock.ttl_ms / 3).max(1));
                    due.push((
                        lock.next,
                        LockRequest {
                            cmd: LockCmd::Extend,
                            key: lock.key.clone(),
                            owner: lock.owner.clone(),
                            ttl_ms: lock.ttl_ms,
                            wait_ms: 0,
                            keepalive: true,
                        },
                    ));
                }
                for (next, r) in due {
                    st.at(next, Due::Renew(client));
                    fire(h, st, rtx, &r, false, Some(client));
                }
            }
        }
    }
}

/// Sends the ACQUIRE attempt of `key`'s queue head if it is due, dropping heads whose
/// client has left.
fn start_attempt(h: &Handles, st: &mut State, rtx: &mpsc::UnboundedSender<BackendReply>, key: &Bytes, now: Instant) {
    let Some(q) = st.queues.get_mut(key) else { return };
    // heads whose client left, or whose wait is over, go first
    while let Some(p) = q.front()
        && !p.trying
        && (p.w.reply_to.is_closed() || now >= p.w.deadline)
    {
        let Some(p) = q.pop_front() else { break };
        h.locks.parked.fetch_sub(1, Ordering::SeqCst);
        if deliver(&p.w, None) {
            h.locks.wait_timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }
    let Some(p) = q.front_mut() else {
        st.queues.remove(key);
        return;
    };
    if p.trying || now < p.next_try {
        return;
    }
    p.trying = true;
    p.woken = false;
    let (id, r) = (p.id, p.w.req.clone());
    let data = h.locks.command(&r, false, false).raw().clone();
    st.inflight.insert(id, Flight::Attempt { key: r.key.clone(), data: data.clone() });
    send_to(h, &r.key, data, id, rtx, Prefix::None, None);
}

/// Sends a request whose reply only matters for NOSCRIPT and redirections (and, for a
/// renewal of `renewal_of`'s lock, whether the lock is still held).
fn fire(
    h: &Handles,
    st: &mut State,
    rtx: &mpsc::UnboundedSender<BackendReply>,
    r: &LockRequest,
    force: bool,
    renewal_of: Option<u64>,
) {
    let id = h.locks.next_id.fetch_add(1, Ordering::Relaxed);
    let data = h.locks.command(r, false, force).raw().clone();
    st.inflight.insert(id, Flight::Other { key: r.key.clone(), data: data.clone(), renewal_of });
    send_to(h, &r.key, data, id, rtx, Prefix::None, None);
}

fn send_to(
    h: &Handles,
    key: &[u8],
    data: Bytes,
    id: u64,
    rtx: &mpsc::UnboundedSender<BackendReply>,
    prefix: Prefix,
    node: Option<std::sync::Arc<crate::cluster::NodePool>>,
) {
    let tag = Tag { seq: id, part: 0 };
    let node = node.or_else(|| h.cluster.topology().master_for_slot(slot(key)).cloned());
    match node {
        Some(n) => n.conn(Proto::Resp2, id).send(BackendRequest { data, count: 1, prefix, tag, reply_to: rtx.clone() }),
        None => {
            let _ = rtx.send(BackendReply { tag, result: Err(BackendError::NotSent("unserved slot".into())) });
        }
    }
}

fn on_reply(h: &Handles, st: &mut State, rtx: &mpsc::UnboundedSender<BackendReply>, r: BackendReply) {
    let id = r.tag.seq;
    let Some(flight) = st.inflight.remove(&id) else { return };
    let (key, data) = match &flight {
        Flight::Attempt { key, data, .. } | Flight::Other { key, data, .. } => (key.clone(), data.clone()),
    };
    // transport trouble and cluster redirections: try again
    let retry_after = match &r.result {
        Err(_) => Some(Duration::from_millis(20)),
        Ok(d) => match error_text(d) {
            Some(e) if e.starts_with(b"NOSCRIPT") => {
                if let Some(eval) = h.locks.eval_form(&data) {
                    send_to(h, &key, eval, id, rtx, Prefix::None, None);
                    st.inflight.insert(id, flight);
                    return;
                }
                None
            }
            Some(e) => match parse_redirect(e) {
                Some(Redirect::Moved { slot, addr }) => {
                    if h.cluster.moved(slot, &addr) {
                        Some(Duration::ZERO)
                    } else {
                        // a node the topology does not announce (yet): refresh, try later
                        h.cluster.request_refresh();
                        Some(Duration::from_millis(50))
                    }
                }
                Some(Redirect::Ask { addr, .. }) => match h.cluster.announced_pool(&addr) {
                    Some(pool) => {
                        send_to(h, &key, data, id, rtx, Prefix::Asking, Some(pool));
                        st.inflight.insert(id, flight);
                        return;
                    }
                    None => {
                        h.cluster.request_refresh();
                        Some(Duration::from_millis(50))
                    }
                },
                None if e.starts_with(b"TRYAGAIN") || e.starts_with(b"CLUSTERDOWN") => Some(Duration::from_millis(50)),
                None => None,
            },
            None => None,
        },
    };
    let Flight::Attempt { .. } = flight else {
        let Flight::Other { renewal_of, .. } = flight else { return };
        // a renewal that found the lock no longer ours: stop renewing it
        if let (Some(client), Ok(d)) = (renewal_of, &r.result)
            && &d[..] == b":0\r\n"
        {
            st.unhold(client, Some(&key), &h.locks);
        }
        match retry_after {
            // moved: once more, to the new owner
            Some(Duration::ZERO) => {
                st.inflight.insert(id, Flight::Other { key: key.clone(), data: data.clone(), renewal_of });
                send_to(h, &key, data, id, rtx, Prefix::None, None);
            }
            Some(_) => {
                debug!(key = %String::from_utf8_lossy(&key), "lock maintenance request failed; the TTL bounds the lock")
            }
            None => {}
        }
        return;
    };
    let Some(q) = st.queues.get_mut(&key) else { return };
    let Ok(pos) = q.binary_search_by_key(&id, |p| p.id) else { return };
    if let Some(d) = retry_after {
        let p = &mut q[pos];
        p.trying = false;
        p.failures += 1;
        if p.failures == 50 {
            warn!(key = %String::from_utf8_lossy(&key), "lock acquire keeps failing (50 tries); still retrying until the WAIT ends");
        }
        let at = (Instant::now() + d).min(p.w.deadline);
        st.try_at(&key, at);
        return;
    }
    let reply = r.result.unwrap_or_default();
    match Value::parse(&reply) {
        Ok((Value::Int(held), _)) if held < 0 => {
            // someone else holds it: wait for its release, or its TTL, whichever first
            let remaining = Duration::from_millis((-1 - held) as u64);
            let p = &mut q[pos];
            p.trying = false;
            let jitter = Duration::from_micros(id.wrapping_mul(0x9E37_79B9) % 5_000);
            let at = if std::mem::take(&mut p.woken) {
                Instant::now()
            } else {
                (Instant::now() + remaining.min(FALLBACK_RETRY) + jitter).min(p.w.deadline)
            };
            st.try_at(&key, at);
        }
        _ => {
            // a token, or an error for the client
            let Some(p) = q.remove(pos) else { return };
            h.locks.parked.fetch_sub(1, Ordering::SeqCst);
            let token = matches!(Value::parse(&reply), Ok((Value::Int(t), _)) if t > 0);
            let delivered = deliver(&p.w, Some(&reply));
            if token {
                h.locks.granted_after_wait.fetch_add(1, Ordering::Relaxed);
            }
            if token {
                if !delivered {
                    // the client left while we waited: give the lock back
                    fire(h, st, rtx, &p.w.req.clone(), true, None);
                } else if p.w.req.keepalive {
                    let r = &p.w.req;
                    let next = Instant::now() + Duration::from_millis(r.ttl_ms / 3);
                    let lock = Held { key: r.key.clone(), owner: r.owner.clone(), ttl_ms: r.ttl_ms, next };
                    st.hold(p.w.client, lock, &h.locks);
                }
            }
            if let Some(q) = st.queues.get_mut(&key) {
                if let Some(next) = q.front() {
                    let at = if token { next.next_try.max(Instant::now() + FALLBACK_RETRY) } else { Instant::now() };
                    st.try_at(&key, at);
                } else {
                    st.queues.remove(&key);
                }
            }
        }
    }
}

/// Answers a parked request (`None`: timed out, nil). Returns false if the client is gone.
fn deliver(w: &Waiter, reply: Option<&[u8]>) -> bool {
    let mut scratch = bytes::BytesMut::new();
    let bytes = match reply {
        Some(r) => client_reply(&w.req, r, w.proto, &mut scratch),
        None => {
            Writer::new(&mut scratch, w.proto).nil();
            scratch.split().freeze()
        }
    };
    w.reply_to.send(BackendReply { tag: w.tag, result: Ok(bytes) }).is_ok()
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
        assert!(t.elapsed() < std::time::Duration::from_millis(500), "{:?} for 10 fence keys", t.elapsed());
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
