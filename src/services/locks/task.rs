//! The lock task (on the control runtime) and the release subscriber: parked `WAIT`
//! requests (a FIFO per key, tried when a release is seen or published, or after a
//! jittered fallback timed to the holder's TTL), KEEPALIVE renewals and releases on close.
//! They get narrow handles (the lock service and the cluster view), not the proxy.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::{CHANNEL, Event, FALLBACK_RETRY, LockCmd, LockRequest, Locks, Waiter, client_reply};
use crate::mailbox::{BackendError, BackendReply, Delivery, ReplyTx, Tag};
use crate::protocol::reply::{Redirect, Value};
use crate::protocol::{Proto, Writer};
use crate::upstream::backend::{BackendRequest, Prefix};
use crate::upstream::cluster::slot;
use crate::upstream::retry::{self, Attempt, RETRY_DELAY, Step};
use crate::upstream::side::Side;

/// What the lock task and the subscriber use: the lock service and the cluster view,
/// nothing else of the proxy.
pub struct Handles {
    locks: Arc<Locks>,
    cluster: Arc<crate::upstream::cluster::Cluster>,
}

/// Starts the lock task and the release subscriber on the current runtime.
pub fn start(locks: Arc<Locks>, cluster: Arc<crate::upstream::cluster::Cluster>) {
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
    let mut attempt = 0usize;
    let mut backoff = crate::upstream::side::Backoff::default();
    loop {
        let masters = h.cluster.topology().masters.clone();
        if let Some(node) = masters.get(attempt % masters.len().max(1)) {
            let mut s = Side::new(node.addr.clone(), node.options(), "locks");
            if s.call(&["SUBSCRIBE", CHANNEL]).await.is_ok() {
                debug!(node = %node.addr, "lock release subscriber up");
                backoff.reset();
                // until the connection fails (closed, bytes that are no reply)
                while let Ok(frame) = s.frame().await {
                    if let Ok((Value::Array(items), _)) = Value::parse(&frame)
                        && items.len() == 3
                        && items[0].as_bytes() == Some(b"message")
                        && let Some(key) = items[2].as_bytes()
                        && tx.send(Event::Wake(Bytes::copy_from_slice(key))).is_err()
                    {
                        return;
                    }
                }
            }
        }
        attempt += 1;
        backoff.wait().await;
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
    let (rtx, mut rrx) = crate::mailbox::reply_channel();
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
            Some(r) = rrx.recv() => {
                if let Some(r) = r.into_reply() {
                    on_reply(&h, &mut st, &rtx, r);
                }
            }
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        tick(&h, &mut st, &rtx);
    }
}

/// Acts on everything that has come due: timed-out waiters, queue heads that may try,
/// KEEPALIVE renewals.
fn tick(h: &Handles, st: &mut State, rtx: &ReplyTx) {
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
fn start_attempt(h: &Handles, st: &mut State, rtx: &ReplyTx, key: &Bytes, now: Instant) {
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
    let data = h.locks.command(&r, false, owner(h, &r.key).as_deref()).raw().clone();
    st.inflight.insert(id, Flight::Attempt { key: r.key.clone(), data: data.clone() });
    send_to(h, &r.key, data, id, rtx, Prefix::None, None);
}

/// Sends a request whose reply only matters for NOSCRIPT and redirections (and, for a
/// renewal of `renewal_of`'s lock, whether the lock is still held).
fn fire(h: &Handles, st: &mut State, rtx: &ReplyTx, r: &LockRequest, force: bool, renewal_of: Option<u64>) {
    let id = h.locks.next_id.fetch_add(1, Ordering::Relaxed);
    let data = h.locks.command(r, force, owner(h, &r.key).as_deref()).raw().clone();
    st.inflight.insert(id, Flight::Other { key: r.key.clone(), data: data.clone(), renewal_of });
    send_to(h, &r.key, data, id, rtx, Prefix::None, None);
}

/// The master owning `key`'s slot now, if one does.
fn owner(h: &Handles, key: &[u8]) -> Option<std::sync::Arc<crate::upstream::cluster::NodePool>> {
    h.cluster.topology().master_for_slot(crate::upstream::cluster::slot(key)).cloned()
}

fn send_to(
    h: &Handles,
    key: &[u8],
    data: Bytes,
    id: u64,
    rtx: &ReplyTx,
    prefix: Prefix,
    node: Option<std::sync::Arc<crate::upstream::cluster::NodePool>>,
) {
    let tag = Tag { seq: id, part: 0 };
    let node = node.or_else(|| h.cluster.topology().master_for_slot(slot(key)).cloned());
    match node {
        Some(n) => n.conn(Proto::Resp2, id).send(BackendRequest {
            data,
            count: 1,
            prefix,
            tag,
            reply_to: rtx.clone(),
            order: None,
            db: 0,
        }),
        None => {
            let _ = rtx.send(Delivery::reply(tag, Err(BackendError::NotSent("unserved slot".into()))));
        }
    }
}

fn on_reply(h: &Handles, st: &mut State, rtx: &ReplyTx, r: BackendReply) {
    let id = r.tag.seq;
    let Some(flight) = st.inflight.remove(&id) else { return };
    let (key, data) = match &flight {
        Flight::Attempt { key, data, .. } | Flight::Other { key, data, .. } => (key.clone(), data.clone()),
    };
    // transport trouble and cluster redirections: try again (crate::upstream::retry decides which)
    // a lock script is safe to send again whatever became of it (its owner decides), so
    // the limits of a client's request do not apply: the WAIT's deadline ends the tries
    let verdict = retry::classify(&r.result, h.cluster.is_cluster());
    let retry_after = match retry::react(verdict, &r.result, &Attempt { by_slot: true, ..Attempt::default() }) {
        Step::Reload => {
            if let Some(eval) = h.locks.eval_form(&data) {
                send_to(h, &key, eval, id, rtx, Prefix::None, None);
                st.inflight.insert(id, flight);
                return;
            }
            None
        }
        Step::Follow(redirect) => match (retry::follow(&h.cluster, &redirect), &redirect) {
            // moved: once more, at once, to the slot's new owner
            (Some(_), Redirect::Moved { .. } | Redirect::Keyless { .. }) => Some(Duration::ZERO),
            (Some(pool), Redirect::Ask { .. }) => {
                send_to(h, &key, data, id, rtx, Prefix::Asking, Some(pool));
                st.inflight.insert(id, flight);
                return;
            }
            // a node the topology does not announce (yet): refresh, try later
            (None, _) => {
                h.cluster.request_refresh();
                Some(RETRY_DELAY)
            }
        },
        // a master that a failover has just made a replica: to the new one, once known
        Step::NewMaster => {
            h.cluster.request_refresh();
            Some(RETRY_DELAY)
        }
        // (the lock task reads no cache and no replica)
        Step::Answer | Step::LoadFunction | Step::TimedOut | Step::Stale(_) | Step::ToMaster | Step::NoReplica => None,
        Step::AskOwner(_)
        | Step::Busy { .. }
        | Step::Reissue
        | Step::Recheck
        | Step::Resend
        | Step::Unreachable { .. }
        | Step::Fail(_) => Some(RETRY_DELAY),
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
        if p.failures == u32::from(retry::MAX_RETRIES) {
            warn!(key = %String::from_utf8_lossy(&key), tries = p.failures, "lock acquire keeps failing; still retrying until the WAIT ends");
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
    w.reply_to.send(Delivery::reply(w.tag, Ok(bytes))).is_ok()
}
