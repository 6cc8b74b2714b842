//! Per-command statistics for INFO: calls, time, failures and a latency histogram per
//! command, kept per worker thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics::bump;

/// Per-command statistics for INFO (calls, time, failures, a latency histogram), kept per
/// worker thread: each slot has one writer, so updates are plain loads and stores.
pub struct CommandStats {
    /// `[worker][command id]`
    workers: Box<[Box<[CmdStat]>]>,
    /// What the counters held at the last CONFIG RESETSTAT (subtracted when read): a
    /// worker's counters are written by that worker alone, with plain stores, so another
    /// thread cannot zero them safely.
    base: parking_lot::Mutex<Vec<Totals>>,
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
            base: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// CONFIG RESETSTAT: every command counts from zero again.
    pub fn reset(&self) {
        let n = self.workers.first().map_or(0, |w| w.len());
        let now: Vec<Totals> = (0..n).map(|c| self.raw_total(c)).collect();
        *self.base.lock() = now;
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

    /// (calls, usec, failed, histogram) summed over workers, since the last reset.
    pub(crate) fn total(&self, cmd: usize) -> Totals {
        let mut t = self.raw_total(cmd);
        if let Some(b) = self.base.lock().get(cmd) {
            t.0 = t.0.saturating_sub(b.0);
            t.1 = t.1.saturating_sub(b.1);
            t.2 = t.2.saturating_sub(b.2);
            for (a, x) in t.3.iter_mut().zip(b.3.iter()) {
                *a = a.saturating_sub(*x);
            }
        }
        t
    }

    fn raw_total(&self, cmd: usize) -> Totals {
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
}
