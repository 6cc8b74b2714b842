//! `shadow`: while it is on, every request a client sends through heatshield that names
//! keys of one slot is also sent to the target once the source has answered, and the
//! target's reply is compared with the source's. The target's replies never reach a
//! client, and its slowness or errors never slow one.
//!
//! - The session hands over the request and the source's reply after answering the
//!   client ([`Shadow::offer`]: one relaxed load when shadow is off). Both are copied (a
//!   slice would keep a whole read buffer alive) into a queue bounded by
//!   `migration.max_pending` entries and [`QUEUE_BYTES`]; past either, requests are
//!   dropped and counted (`dropped`).
//! - One task sends them to the target's master for their slot, pipelined per node, in
//!   the order they were answered, and compares: `matched`, `differed` (counted by
//!   command, the first differences of each command logged with both replies), or
//!   `failed` (the target could not be asked; nothing retried).
//! - Not shadowed: commands without keys, or with keys in several slots (the target would
//!   refuse them as one command), transactions, blocking commands, pub/sub, and
//!   heatshield's own (`PROXY`, `LOCK.*`): they are counted as `skipped`.
//! - Writes are applied on the target too (that is what is compared), so the target
//!   diverges from the source wherever a write's effect depends on what the target held:
//!   before dual-write, `backfill --restart` copies every key again.
//! - Two servers may answer one request alike in meaning and not in bytes (Redis 7.0
//!   prints a score of 0.1 as `0.10000000000000001`, Valkey 9 as `0.1`), and a read on
//!   the target comes a moment after the source's, so a key written meanwhile differs:
//!   differences are what a person reads (with the samples), not a verdict.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tracing::{info, warn};

use super::Nodes;
use crate::command::Command;
use crate::protocol::Request;
use crate::upstream::cluster::slot;

/// The bytes of requests and replies that may wait for the target.
pub const QUEUE_BYTES: usize = 64 << 20;

/// Differences of one command logged with both replies, at most.
const SAMPLES_PER_COMMAND: u64 = 5;

/// One request answered by the source, to be asked of the target.
struct Item {
    command: Arc<str>,
    /// The request's slot.
    slot: u16,
    request: Bytes,
    reply: Bytes,
}

/// The shadow phase's switch, queue and counts.
pub struct Shadow {
    on: AtomicBool,
    queue: Mutex<(VecDeque<Item>, usize)>,
    wake: tokio::sync::Notify,
    max: usize,
    pub matched: AtomicU64,
    pub differed: AtomicU64,
    pub failed: AtomicU64,
    pub dropped: AtomicU64,
    pub skipped: AtomicU64,
    /// Differences by command (lower case).
    by_command: Mutex<HashMap<Arc<str>, u64>>,
}

impl Shadow {
    pub fn new(max: usize) -> Shadow {
        Shadow {
            on: AtomicBool::new(false),
            queue: Mutex::new((VecDeque::new(), 0)),
            wake: tokio::sync::Notify::new(),
            max,
            matched: AtomicU64::new(0),
            differed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            by_command: Mutex::new(HashMap::new()),
        }
    }

    /// Whether requests are shadowed now.
    #[inline]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub(super) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// A request the source answered with `reply` (`cmd`: what it is), to be asked of the
    /// target too, if it can be.
    pub fn offer(&self, cmd: &Command, req: &Request, reply: &Bytes) {
        let skip = || {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        };
        use crate::command::Route;
        if !matches!(cmd.route, Route::Forward | Route::Split(_)) || cmd.is_blocking() {
            return skip();
        }
        let Ok(keys) = crate::command::keys_of(cmd, req) else { return skip() };
        let Some(&first) = keys.first() else { return skip() };
        let s = slot(req.arg(first as usize));
        if keys.iter().any(|&k| slot(req.arg(k as usize)) != s) {
            return skip();
        }
        let size = req.raw().len() + reply.len();
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.0.len() >= self.max || q.1 + size > QUEUE_BYTES {
            drop(q);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.1 += size;
        q.0.push_back(Item {
            command: Arc::from(cmd.lower.as_str()),
            slot: s,
            request: Bytes::copy_from_slice(req.raw()),
            reply: Bytes::copy_from_slice(reply),
        });
        drop(q);
        self.wake.notify_one();
    }

    /// Requests waiting to be asked of the target.
    pub fn pending(&self) -> u64 {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).0.len() as u64
    }

    /// Differences by command, most first: `get:3,zscore:1`.
    pub fn differences(&self) -> String {
        let mut v: Vec<(Arc<str>, u64)> =
            self.by_command.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, n)| (k.clone(), *n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.iter().map(|(k, n)| format!("{k}:{n}")).collect::<Vec<_>>().join(",")
    }

    /// The task that asks the target, for as long as the process runs.
    pub async fn run(self: Arc<Self>, mut dst: Nodes) {
        loop {
            let batch: Vec<Item> = {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.1 = 0;
                q.0.drain(..).collect()
            };
            if batch.is_empty() {
                self.wake.notified().await;
                continue;
            }
            // by target master, each node's requests in their order
            let mut by_node: Vec<(Arc<str>, Vec<&Item>)> = Vec::new();
            for it in &batch {
                let Some(owner) = dst.cluster.topology().master_for_slot(it.slot).map(|m| m.addr.clone()) else {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                match by_node.iter_mut().find(|(a, _)| Arc::ptr_eq(a, &owner)) {
                    Some((_, v)) => v.push(it),
                    None => by_node.push((owner, vec![it])),
                }
            }
            for (node, items) in by_node {
                for chunk in items.chunks(500) {
                    let mut data = Vec::with_capacity(chunk.iter().map(|i| i.request.len()).sum());
                    for it in chunk {
                        data.extend_from_slice(&it.request);
                    }
                    match dst.pipe_raw(&node, &data, chunk.len()).await {
                        Ok(replies) => {
                            for (it, r) in chunk.iter().zip(replies) {
                                self.compare(it, &r, &node);
                            }
                        }
                        Err(e) => {
                            warn!(error = %e, requests = chunk.len(), "shadow: the target could not be asked");
                            self.failed.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            dst.cluster.request_refresh();
                        }
                    }
                }
            }
        }
    }

    fn compare(&self, it: &Item, target: &[u8], node: &str) {
        if it.reply[..] == *target {
            self.matched.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if target.starts_with(b"-MOVED") || target.starts_with(b"-ASK") {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.differed.fetch_add(1, Ordering::Relaxed);
        let n = {
            let mut m = self.by_command.lock().unwrap_or_else(|e| e.into_inner());
            let n = m.entry(it.command.clone()).or_default();
            *n += 1;
            *n
        };
        if n <= SAMPLES_PER_COMMAND {
            let show = |b: &[u8]| crate::protocol::reply::quoted(&b[..b.len().min(200)]);
            let req = Request::parse(&it.request);
            let key = req.as_ref().filter(|r| r.argc() > 1).map(|r| show(r.arg(1))).unwrap_or_default();
            info!(command = %it.command, key = %key, source = %show(&it.reply), target = %show(target), node, "shadow: the target answered otherwise");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_bounded_and_keyless_or_cross_slot_requests_are_skipped() {
        let table = crate::command::CommandTable::new();
        let s = Shadow::new(2);
        let get = Request::from_args(&["GET", "k"]);
        let cmd = table.lookup(&get).unwrap();
        for _ in 0..3 {
            s.offer(cmd, &get, &Bytes::from_static(b"$1\r\nv\r\n"));
        }
        assert_eq!((s.pending(), s.dropped.load(Ordering::Relaxed)), (2, 1));
        let ping = Request::from_args(&["PING"]);
        s.offer(table.lookup(&ping).unwrap(), &ping, &Bytes::from_static(b"+PONG\r\n"));
        let mset = Request::from_args(&["MSET", "a", "1", "b", "2"]);
        s.offer(table.lookup(&mset).unwrap(), &mset, &Bytes::from_static(b"+OK\r\n"));
        assert_eq!(s.skipped.load(Ordering::Relaxed), 2);
    }
}
