//! `dual-write`: while it is on, every key a client's write names is copied to the target
//! after the source's reply ([`super::copy`]: versioned, so copies applied in any order,
//! by any heatshield of a fleet or by a backfill running beside, leave the target with
//! the source's latest value, never an older one).
//!
//! - The request path only notes the keys ([`DualWrite::wrote`]: one relaxed load when
//!   it is off); the copier ([`DualWrite::run`], one task) takes them in batches, each key
//!   once per batch however often it was written, and copies them with one pipelined
//!   read per source master and one pipelined write per target master.
//! - What is noted: the keys of every write, on every path that sends one (single
//!   commands, pipelines, the parts of a split command, the writes queued in a
//!   transaction, a script's declared keys, blocking commands that move elements, lock
//!   commands). A `FLUSHALL` / `FLUSHDB` is counted (`flushes`), not copied: the target
//!   then needs `backfill --restart` and `verify`.
//! - Bounded: at most `max_pending` keys and [`PENDING_BYTES`] of names wait, copied out of
//!   the requests; past either, keys are dropped and counted
//!   (`overflowed`), and the target needs a `backfill` (run with `--restart`) to catch up.
//! - A copy that fails (the target refused it, or could not be reached) is counted and its
//!   key noted again after a pause, so it is retried; the target is never ahead of the
//!   source, only behind until its copies land.
//! - **Every heatshield with this target follows one switch**: `PROXY MIGRATION
//!   DUAL-WRITE | OFF` at any of them writes the phase, with its time, to a key of the
//!   source cluster ([`PHASE_KEY`]), which each reads every [`PHASE_POLL`] and follows
//!   when it is newer than its own last change.
//! - It also runs a backfill or a verify inside heatshield (`PROXY MIGRATION BACKFILL |
//!   VERIFY`), one at a time, and shows its progress in `PROXY MIGRATION STATUS`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::warn;

use super::copy::{Copied, copy_batch};
use super::{Clusters, Nodes};
use crate::upstream::backend::BackendOptions;
use crate::upstream::cluster::Cluster;

/// Keys copied per read and write round trip.
const BATCH: usize = 500;

/// The dual-write phase: its switch, the keys waiting, what the copies did.
pub struct DualWrite {
    on: AtomicBool,
    /// A target is configured (dual-write can be turned on).
    configured: bool,
    queue: Mutex<Queue>,
    wake: tokio::sync::Notify,
    max_pending: usize,
    /// Keys taken by the copier and not yet copied.
    in_flight: AtomicU64,
    pub noted: AtomicU64,
    pub applied: AtomicU64,
    pub kept: AtomicU64,
    pub gone: AtomicU64,
    pub failed: AtomicU64,
    pub overflowed: AtomicU64,
    pub flushes: AtomicU64,
    /// The source and the target with their connection options, once the copier started.
    sides: OnceLock<Clusters>,
    /// The backfill or verify run from `PROXY MIGRATION BACKFILL | VERIFY`, the last one.
    job: Arc<Mutex<Job>>,
    /// When the phase last changed (ms since the epoch), here or at another heatshield.
    phase_at: AtomicU64,
}

/// Keys noted and not yet taken by the copier.
#[derive(Default)]
struct Queue {
    keys: Vec<Bytes>,
    /// Their bytes.
    bytes: usize,
}

/// The bytes of key names that may wait for the copier (beside `max_pending` keys); the
/// copier's batch in hand is at most as much again.
pub const PENDING_BYTES: usize = 256 << 20;

/// The source cluster's key that holds the phase the heatshields with this target follow:
/// `"dual-write <ms>"` or `"off <ms>"`.
pub const PHASE_KEY: &[u8] = b"{heatshield:migration}phase";

/// How often each heatshield reads [`PHASE_KEY`].
pub const PHASE_POLL: Duration = Duration::from_millis(500);

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A backfill or verify run inside heatshield, as `PROXY MIGRATION STATUS` shows it.
#[derive(Debug, Default, Clone)]
struct Job {
    /// "backfill" or "verify"; empty: none run yet.
    kind: &'static str,
    running: bool,
    started: Option<Instant>,
    done: u64,
    total: u64,
    bytes: u64,
    /// The run's report when it ended (its first line), or its error.
    result: String,
    /// Whether it ended with every key copied, or no difference.
    ok: bool,
}

/// The options of a verify run inside heatshield.
pub struct VerifyOptions {
    pub ttl_tolerance: Duration,
    pub rechecks: u32,
    pub recheck_delay: Duration,
}

impl DualWrite {
    pub fn new(configured: bool, on: bool, max_pending: usize) -> DualWrite {
        DualWrite {
            on: AtomicBool::new(configured && on),
            configured,
            queue: Mutex::new(Queue::default()),
            wake: tokio::sync::Notify::new(),
            max_pending,
            in_flight: AtomicU64::new(0),
            noted: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            gone: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            overflowed: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            sides: OnceLock::new(),
            job: Arc::new(Mutex::new(Job::default())),
            phase_at: AtomicU64::new(0),
        }
    }

    /// Starts a backfill (`PROXY MIGRATION BACKFILL`) as a task of the calling runtime;
    /// refused while one runs, or before the copier knows the two sides.
    pub fn start_backfill(&self, restart: bool, rate: u64) -> Result<(), String> {
        let (sides, job) = self.claim("backfill")?;
        let shown = job.clone();
        let progress = Box::new(move |done: u64, of: u64, bytes: u64| {
            let mut j = shown.lock().unwrap_or_else(|e| e.into_inner());
            (j.done, j.total, j.bytes) = (done, of, bytes);
        });
        let o = super::backfill::Options { restart, rate, max_keys: 0, progress };
        tokio::spawn(async move {
            let r = super::backfill::run(sides, o).await;
            let mut j = job.lock().unwrap_or_else(|e| e.into_inner());
            j.running = false;
            (j.result, j.ok) = match r {
                Ok(r) => (first_line(r.render()), r.complete && r.copied.failed == 0),
                Err(e) => (e, false),
            };
        });
        Ok(())
    }

    /// Starts a verify (`PROXY MIGRATION VERIFY`), as [`DualWrite::start_backfill`].
    pub fn start_verify(&self, v: VerifyOptions) -> Result<(), String> {
        let (sides, job) = self.claim("verify")?;
        let shown = job.clone();
        let progress = Box::new(move |done: u64, of: u64| {
            let mut j = shown.lock().unwrap_or_else(|e| e.into_inner());
            (j.done, j.total) = (done, of);
        });
        let o = super::verify::Options {
            ttl_tolerance: v.ttl_tolerance,
            rechecks: v.rechecks,
            recheck_delay: v.recheck_delay,
            first: 5,
            progress,
        };
        tokio::spawn(async move {
            let r = super::verify::run(sides, o).await;
            let mut j = job.lock().unwrap_or_else(|e| e.into_inner());
            j.running = false;
            (j.result, j.ok) = match r {
                Ok(r) => (r.render().trim_end().replace('\n', "; "), r.differences() == 0),
                Err(e) => (e, false),
            };
        });
        Ok(())
    }

    /// Marks a run of `kind` as started, if none is running.
    fn claim(&self, kind: &'static str) -> Result<(Clusters, Arc<Mutex<Job>>), String> {
        let Some(sides) = self.sides.get().cloned() else { return Err(crate::errors::NO_MIGRATION_TARGET.into()) };
        let mut j = self.job.lock().unwrap_or_else(|e| e.into_inner());
        if j.running {
            return Err(format!("ERR a {} is running (PROXY MIGRATION STATUS)", j.kind));
        }
        *j = Job { kind, running: true, started: Some(Instant::now()), ..Job::default() };
        Ok((sides, self.job.clone()))
    }

    /// Whether writes are copied to the target now.
    #[inline]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Turns dual-write on or off; refused without a target.
    pub fn set(&self, on: bool) -> Result<(), &'static str> {
        if on && !self.configured {
            return Err(crate::errors::NO_MIGRATION_TARGET);
        }
        self.on.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Turns dual-write on or off here and, through the source cluster
    /// ([`PHASE_KEY`]), at every heatshield with this target (each follows within
    /// [`PHASE_POLL`]).
    pub fn switch(&self, on: bool) -> Result<(), &'static str> {
        self.set(on)?;
        let at = now_ms();
        self.phase_at.store(at, Ordering::Relaxed);
        if let Some(sides) = self.sides.get().cloned() {
            tokio::spawn(async move {
                let mut src = Nodes::new(sides.source, sides.source_opts, "migration-phase");
                let value = format!("{} {at}", if on { "dual-write" } else { "off" });
                if let Err(e) = src.ask_for(PHASE_KEY, vec![b"SET", PHASE_KEY, value.as_bytes()]).await {
                    warn!(error = %e, "migration: the phase could not be told to the other heatshields");
                }
            });
        }
        Ok(())
    }

    /// Follows the phase the other heatshields set ([`PHASE_KEY`]), if newer than the
    /// last change made here.
    async fn follow(&self, src: &mut Nodes) {
        let Ok(r) = src.ask_for(PHASE_KEY, vec![b"GET", PHASE_KEY]).await else { return };
        let Ok((crate::protocol::reply::Value::Bulk(v), _)) = crate::protocol::reply::Value::parse(&r) else { return };
        let text = String::from_utf8_lossy(v);
        let Some((phase, at)) = text.split_once(' ') else { return };
        let Ok(at) = at.parse::<u64>() else { return };
        if at > self.phase_at.load(Ordering::Relaxed) {
            self.phase_at.store(at, Ordering::Relaxed);
            let on = phase == "dual-write";
            if self.set(on).is_ok() {
                tracing::info!(phase, "migration phase changed by another heatshield");
            }
        }
    }

    /// Notes the keys a write named (in the cluster's names), to be copied.
    /// (Copied: a slice of a request would keep its whole read buffer alive.)
    pub fn wrote<K: AsRef<[u8]>>(&self, keys: impl IntoIterator<Item = K>) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let before = q.keys.len();
        for k in keys {
            let k = k.as_ref();
            if crate::command::reserved(k) {
                continue;
            }
            if q.keys.len() >= self.max_pending || q.bytes + k.len() > PENDING_BYTES {
                self.overflowed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            q.bytes += k.len();
            q.keys.push(Bytes::copy_from_slice(k));
        }
        let added = q.keys.len() - before;
        drop(q);
        if added > 0 {
            self.noted.fetch_add(added as u64, Ordering::Relaxed);
            self.wake.notify_one();
        }
    }

    /// A FLUSHALL or FLUSHDB reached the source while dual-write was on.
    pub fn flushed(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    /// Keys noted and not yet copied.
    pub fn pending(&self) -> u64 {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).keys.len() as u64 + self.in_flight.load(Ordering::Relaxed)
    }

    /// `PROXY MIGRATION STATUS`'s fields of this phase.
    pub fn status(&self) -> Vec<(&'static str, String)> {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        vec![
            ("dual_write", if self.on() { "on" } else { "off" }.into()),
            ("dual_write_pending", self.pending().to_string()),
            ("dual_write_noted", n(&self.noted)),
            ("dual_write_applied", n(&self.applied)),
            ("dual_write_kept", n(&self.kept)),
            ("dual_write_gone", n(&self.gone)),
            ("dual_write_failed", n(&self.failed)),
            ("dual_write_overflowed", n(&self.overflowed)),
            ("dual_write_flushes", n(&self.flushes)),
        ]
        .into_iter()
        .chain(self.job_status())
        .collect()
    }

    /// Publishes the `heatshield_migration_*` metrics (docs/metrics.md), once a second.
    pub fn publish_metrics(&self) {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        metrics::gauge!("heatshield_migration_dual_write").set(if self.on() { 1.0 } else { 0.0 });
        metrics::gauge!("heatshield_migration_pending_keys").set(self.pending() as f64);
        for (outcome, v) in [
            ("applied", n(&self.applied)),
            ("kept", n(&self.kept)),
            ("gone", n(&self.gone)),
            ("failed", n(&self.failed)),
            ("overflowed", n(&self.overflowed)),
        ] {
            metrics::counter!("heatshield_migration_copies_total", "outcome" => outcome).absolute(v);
        }
        let j = self.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        metrics::gauge!("heatshield_migration_job_running").set(if j.running { 1.0 } else { 0.0 });
        metrics::gauge!("heatshield_migration_job_keys_done").set(j.done as f64);
        metrics::gauge!("heatshield_migration_job_source_keys").set(j.total as f64);
        metrics::gauge!("heatshield_migration_job_bytes").set(j.bytes as f64);
    }

    /// The last backfill or verify run inside heatshield: what, its state, keys done out
    /// of the source's, bytes, rate, the time left, and its result.
    fn job_status(&self) -> Vec<(&'static str, String)> {
        let j = self.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let secs = j.started.map_or(0.0, |t| t.elapsed().as_secs_f64()).max(1e-3);
        let rate = j.done as f64 / secs;
        let left = if rate > 0.0 { j.total.saturating_sub(j.done) as f64 / rate } else { 0.0 };
        let state = match (j.kind, j.running, j.ok) {
            ("", ..) => "none",
            (_, true, _) => "running",
            (_, false, true) => "done",
            (_, false, false) => "failed",
        };
        vec![
            ("job", j.kind.to_string()),
            ("job_state", state.into()),
            ("job_keys_done", j.done.to_string()),
            ("job_keys_total", j.total.to_string()),
            ("job_bytes", j.bytes.to_string()),
            ("job_keys_per_sec", format!("{rate:.0}")),
            ("job_seconds_left", if j.running { format!("{left:.0}") } else { "0".into() }),
            ("job_result", j.result),
        ]
    }

    /// The copier: takes the noted keys and copies them, for as long as the process runs.
    pub async fn run(
        self: Arc<Self>,
        source: Arc<Cluster>,
        source_opts: BackendOptions,
        target: Arc<Cluster>,
        target_opts: BackendOptions,
    ) {
        let _ = self.sides.set(Clusters {
            source: source.clone(),
            source_opts: source_opts.clone(),
            target: target.clone(),
            target_opts: target_opts.clone(),
        });
        if target.is_cluster() {
            target.spawn_refresher(Duration::from_secs(5));
            let _ = target.refresh().await;
        }
        {
            // the phase the other heatshields set, followed
            let me = self.clone();
            let mut src = Nodes::new(source.clone(), source_opts.clone(), "migration-phase");
            tokio::spawn(async move {
                loop {
                    me.follow(&mut src).await;
                    tokio::time::sleep(PHASE_POLL).await;
                }
            });
        }
        let mut src = Nodes::new(source, source_opts, "dual-write");
        let mut dst = Nodes::new(target, target_opts, "dual-write");
        loop {
            let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner())).keys;
            if batch.is_empty() {
                self.wake.notified().await;
                continue;
            }
            // each key once, in the order first noted
            let mut seen: HashSet<Bytes, ahash::RandomState> =
                HashSet::with_capacity_and_hasher(batch.len(), Default::default());
            let keys: Vec<Bytes> = batch.into_iter().filter(|k| seen.insert(k.clone())).collect();
            self.in_flight.store(keys.len() as u64, Ordering::Relaxed);
            let mut by_master: Vec<(Arc<str>, Vec<Vec<u8>>)> = Vec::new();
            let mut failed = Vec::new();
            for k in &keys {
                match src.owner(k) {
                    Ok(m) => match by_master.iter_mut().find(|(a, _)| Arc::ptr_eq(a, &m)) {
                        Some((_, v)) => v.push(k.to_vec()),
                        None => by_master.push((m, vec![k.to_vec()])),
                    },
                    Err(_) => failed.push(k.clone()),
                }
            }
            for (m, keys) in &by_master {
                for chunk in keys.chunks(BATCH) {
                    let mut c = Copied::default();
                    match copy_batch(&mut src, &mut dst, m, chunk, &mut c).await {
                        Ok(()) => {
                            self.applied.fetch_add(c.applied, Ordering::Relaxed);
                            self.kept.fetch_add(c.kept, Ordering::Relaxed);
                            self.gone.fetch_add(c.gone, Ordering::Relaxed);
                            self.failed.fetch_add(c.failed, Ordering::Relaxed);
                            failed.extend(c.first_failures.iter().map(|(k, _)| Bytes::copy_from_slice(k)));
                            if let Some((k, why)) = c.first_failures.first() {
                                warn!(key = %crate::protocol::reply::quoted(k), error = %why, failed = c.failed, "dual-write: copies refused by the target; retried");
                            }
                        }
                        Err(e) => {
                            warn!(error = %e, keys = chunk.len(), "dual-write: copies failed; retried");
                            self.failed.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            failed.extend(chunk.iter().map(|k| Bytes::copy_from_slice(k)));
                        }
                    }
                    self.in_flight.fetch_sub(chunk.len() as u64, Ordering::Relaxed);
                }
            }
            self.in_flight.store(0, Ordering::Relaxed);
            if keys.len() < BATCH {
                // a short batch: let the next gather for a moment (fewer wake-ups and
                // round trips a key, the target a millisecond further behind)
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if !failed.is_empty() {
                // again after a pause (a node restarting, a slot moving)
                tokio::time::sleep(Duration::from_millis(200)).await;
                for c in [&src.cluster, &dst.cluster] {
                    if c.is_cluster() {
                        c.request_refresh();
                    }
                }
                self.wrote(failed);
            }
        }
    }
}

/// The first line of a report.
fn first_line(s: String) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_noted_only_within_the_bound_and_never_heatshields_own() {
        let d = DualWrite::new(true, false, 3);
        assert!(!d.on());
        d.set(true).unwrap();
        d.wrote([Bytes::from_static(b"a"), Bytes::from_static(b"{heatshield:fleet}x"), Bytes::from_static(b"b")]);
        assert_eq!(d.pending(), 2);
        d.wrote([Bytes::from_static(b"c"), Bytes::from_static(b"d")]);
        assert_eq!(d.pending(), 3);
        assert_eq!(d.overflowed.load(Ordering::Relaxed), 1);
        // names are bounded by bytes too
        let d = DualWrite::new(true, true, 10);
        d.wrote([vec![b'k'; PENDING_BYTES / 2], vec![b'l'; PENDING_BYTES / 2 + 1]]);
        assert_eq!((d.pending(), d.overflowed.load(Ordering::Relaxed)), (1, 1));
        let none = DualWrite::new(false, true, 3);
        assert!(!none.on(), "without a target it cannot be on");
        assert!(none.set(true).is_err());
    }
}
