//! Statistics of answered commands: the slow log, the big-key log, per-command calls and
//! latency histograms (for INFO's `# Commandstats` and `# Latencystats`), and the stages
//! of a slow command. Filled by the request path when a reply has been written; read by
//! the admin commands and INFO.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::metrics::bump;
use crate::protocol::Request;

/// Time spent in each stage of a slow command.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stages {
    /// From the whole request being read until its reply was ready (the backend round trip,
    /// including redirections and retries; ~0 for commands answered by heatshield).
    pub backend: Duration,
    /// From the reply being ready until its turn to be written (replies to earlier
    /// commands of the same client go first).
    pub queued: Duration,
    /// The write to the client.
    pub write: Duration,
}

pub(crate) struct SlowEntry {
    pub(crate) id: u64,
    pub(crate) at: u64,
    pub(crate) total: Duration,
    pub(crate) args: Vec<Bytes>,
    pub(crate) client: String,
    pub(crate) name: String,
    pub(crate) node: String,
    pub(crate) stages: Stages,
}

/// The slow log: the most recent commands slower than the threshold.
#[derive(Default)]
pub struct SlowLog {
    pub(crate) entries: Mutex<VecDeque<SlowEntry>>,
    pub(crate) next_id: AtomicU64,
}

/// One request or reply in the big-key log.
pub(crate) struct BigEntry {
    pub(crate) key: Bytes,
    pub(crate) command: String,
    /// "request" or "reply".
    pub(crate) kind: &'static str,
    pub(crate) bytes: u64,
    pub(crate) at: u64,
}

/// The big-key log: the largest requests and replies seen, by key.
#[derive(Default)]
pub struct BigKeys {
    pub(crate) entries: Mutex<Vec<BigEntry>>,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// The arguments of a request's RESP bytes (only done for the rare logged command).
pub fn args_of(raw: &Bytes) -> Vec<Bytes> {
    Request::parse(raw).map(|req| (0..req.argc()).map(|i| req.arg_bytes(i)).collect()).unwrap_or_default()
}

impl SlowLog {
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        max_len: usize,
        total: Duration,
        raw: &Bytes,
        client: &str,
        name: &str,
        node: &str,
        stages: Stages,
    ) {
        if max_len == 0 {
            return;
        }
        let mut args = args_of(raw);
        // as Redis: at most 32 arguments, each at most 128 bytes
        if args.len() > 32 {
            let more = args.len() - 31;
            args.truncate(31);
            args.push(Bytes::from(format!("... ({more} more arguments)")));
        }
        for a in &mut args {
            if a.len() > 128 {
                let more = a.len() - 128;
                let mut v = a[..128].to_vec();
                v.extend_from_slice(format!("... ({more} more bytes)").as_bytes());
                *a = Bytes::from(v);
            }
        }
        let e = SlowEntry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            at: unix_now(),
            total,
            args,
            client: client.to_string(),
            name: name.to_string(),
            node: node.to_string(),
            stages,
        };
        let mut q = self.entries.lock();
        q.push_front(e);
        q.truncate(max_len);
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn reset(&self) {
        self.entries.lock().clear();
    }
}

impl BigKeys {
    /// Notes a request or reply of `bytes` for `key` (keeps the largest per key and kind).
    pub fn record(&self, max_len: usize, key: &[u8], command: &str, kind: &'static str, bytes: u64) {
        if max_len == 0 {
            return;
        }
        let mut v = self.entries.lock();
        if let Some(e) = v.iter_mut().find(|e| e.kind == kind && e.key == key) {
            e.at = unix_now();
            if bytes >= e.bytes {
                e.bytes = bytes;
                e.command = command.to_string();
            }
            return;
        }
        if v.len() >= max_len {
            // replace the smallest if this one is larger
            let (i, smallest) =
                v.iter().enumerate().min_by_key(|(_, e)| e.bytes).map(|(i, e)| (i, e.bytes)).unwrap_or((0, 0));
            if bytes <= smallest {
                return;
            }
            v.swap_remove(i);
        }
        v.push(BigEntry {
            key: Bytes::copy_from_slice(key),
            command: command.to_string(),
            kind,
            bytes,
            at: unix_now(),
        });
    }
}

/// Per-command statistics for INFO (calls, time, failures, a latency histogram), kept per
/// worker thread: each slot has one writer, so updates are plain loads and stores.
pub struct CommandStats {
    /// `[worker][command id]`
    workers: Box<[Box<[CmdStat]>]>,
}

/// Latency buckets: 4 per power of two of microseconds, up to ~2^26 µs.
const HIST_BUCKETS: usize = 4 * 27;

/// One command's (calls, usec, failed, latency histogram), summed over workers.
pub type Totals = (u64, u64, u64, [u64; HIST_BUCKETS]);

struct CmdStat {
    calls: AtomicU64,
    usec: AtomicU64,
    failed: AtomicU64,
    hist: [AtomicU64; HIST_BUCKETS],
}

impl Default for CmdStat {
    fn default() -> Self {
        CmdStat {
            calls: AtomicU64::new(0),
            usec: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            hist: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Bucket of a latency in microseconds: log-linear, 4 sub-buckets per power of two.
fn bucket_of(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let p = 63 - us.leading_zeros() as usize; // floor(log2)
    let sub = ((us >> (p - 2)) & 3) as usize;
    (4 * (p - 1) + sub).min(HIST_BUCKETS - 1)
}

/// Upper bound (µs) of bucket `b`.
fn bucket_upper(b: usize) -> u64 {
    if b < 4 {
        return b as u64 + 1;
    }
    let p = b / 4 + 1;
    let sub = (b % 4) as u64;
    (1u64 << p) + ((sub + 1) << (p - 2))
}

impl CommandStats {
    pub fn new(workers: usize, commands: usize) -> CommandStats {
        CommandStats {
            workers: (0..workers.max(1)).map(|_| (0..commands).map(|_| CmdStat::default()).collect()).collect(),
        }
    }

    #[inline]
    pub fn record(&self, worker: usize, cmd: usize, took: Duration, failed: bool) {
        let w = &self.workers[worker % self.workers.len()];
        let Some(s) = w.get(cmd) else { return };
        let us = took.as_micros() as u64;
        bump(&s.calls, 1);
        bump(&s.usec, us);
        if failed {
            bump(&s.failed, 1);
        }
        bump(&s.hist[bucket_of(us)], 1);
    }

    /// (calls, usec, failed, histogram) summed over workers.
    pub(crate) fn total(&self, cmd: usize) -> Totals {
        let mut t = (0, 0, 0, [0u64; HIST_BUCKETS]);
        for w in self.workers.iter() {
            let s = &w[cmd];
            t.0 += s.calls.load(Ordering::Relaxed);
            t.1 += s.usec.load(Ordering::Relaxed);
            t.2 += s.failed.load(Ordering::Relaxed);
            for (a, b) in t.3.iter_mut().zip(s.hist.iter()) {
                *a += b.load(Ordering::Relaxed);
            }
        }
        t
    }
}

pub fn percentile(hist: &[u64; HIST_BUCKETS], total: u64, q: f64) -> u64 {
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (b, &n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return bucket_upper(b);
        }
    }
    bucket_upper(HIST_BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for us in [0u64, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 100, 1000, 12_345, 1_000_000, 60_000_000] {
            let b = bucket_of(us);
            assert!(b >= last, "{us}");
            last = b;
            let up = bucket_upper(b);
            assert!(up > us || b == HIST_BUCKETS - 1, "{us} -> bucket {b} upper {up}");
            // within 25% (+1 µs) of the value
            assert!(b == HIST_BUCKETS - 1 || up as f64 <= us as f64 * 1.25 + 1.0, "{us} -> {up}");
        }
    }

    #[test]
    fn percentiles_from_histogram() {
        let s = CommandStats::new(2, 1);
        for i in 0..100u64 {
            s.record((i % 2) as usize, 0, Duration::from_micros(100 + i * 10), false);
        }
        let (calls, usec, _, hist) = s.total(0);
        assert_eq!(calls, 100);
        assert_eq!(usec, (0..100u64).map(|i| 100 + i * 10).sum::<u64>());
        let p50 = percentile(&hist, calls, 0.5);
        assert!((580..=740).contains(&p50), "{p50}");
        assert!(percentile(&hist, calls, 0.99) >= 1090);
    }

    #[test]
    fn bigkeys_keep_the_largest() {
        let b = BigKeys::default();
        for i in 0..10u64 {
            b.record(3, format!("k{i}").as_bytes(), "SET", "request", 100 + i);
        }
        let mut sizes: Vec<u64> = b.entries.lock().iter().map(|e| e.bytes).collect();
        sizes.sort();
        assert_eq!(sizes, vec![107, 108, 109]);
        b.record(3, b"k9", "GET", "request", 5000);
        assert!(b.entries.lock().iter().any(|e| e.key == "k9" && e.bytes == 5000 && e.command == "GET"));
    }
}
