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
use super::{Clusters, Nodes, int, scan_reply};
use crate::upstream::backend::BackendOptions;
use crate::upstream::cluster::Cluster;

/// Keys copied per read and write round trip.
const BATCH: usize = 500;

/// The dual-write phase: its switch, the keys waiting, what the copies did.
pub struct DualWrite {
    on: AtomicBool,
    /// Cut over: the target serves, and writes are copied back to the source.
    reversed: AtomicBool,
    /// Holds requests while the serving cluster changes ([`super::gate`]).
    pub gate: super::gate::Gate,
    /// Requests also asked of the target, its replies compared ([`super::shadow`]).
    pub shadow: Arc<super::shadow::Shadow>,
    /// What a cutover needs of the rest of heatshield, and the cluster requests go to.
    hooks: OnceLock<(Box<dyn Hooks>, Arc<Cluster>)>,
    /// One cutover or rollback at a time.
    switching: tokio::sync::Mutex<()>,
    /// How the last cutover or rollback asked here ended (`PROXY MIGRATION STATUS`).
    last_switch: Mutex<String>,
    /// A copy of a dump was refused as of another server's version: in that direction
    /// (false: to the target; true: back to the source) keys are copied by their values.
    logical: [AtomicBool; 2],
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
    /// Finished: the target serves, nothing is copied, the source is left alone.
    finished: AtomicBool,
    /// Instances with this target heard of lately ([`MEMBERS_KEY`]), this one included.
    instances: AtomicU64,
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
/// `"<phase> <ms>"`, the phase `off`, `dual-write`, `cutover`, or `hold` (a cutover or
/// rollback is being made: hold requests, and say so in [`HELD_KEY`]).
pub const PHASE_KEY: &[u8] = b"{heatshield:migration}phase";

/// Where each instance of the fleet says it holds its requests: fleet id → the `hold`'s ms.
pub const HELD_KEY: &[u8] = b"{heatshield:migration}held";

/// How often each heatshield reads [`PHASE_KEY`] (and while it holds requests for
/// another's cutover, every [`HELD_POLL`]).
pub const PHASE_POLL: Duration = Duration::from_millis(100);
pub const HELD_POLL: Duration = Duration::from_millis(5);

/// How long an instance with a target holds requests at start while it cannot read the
/// phase (then it serves the configured `[backend]`).
pub const PHASE_AT_START: Duration = Duration::from_secs(5);

/// What a cutover needs of the rest of heatshield (crate::life::start provides it).
pub trait Hooks: Send + Sync {
    /// Ends every blocked client's command as if it timed out.
    fn unblock_all(&self);
    /// Wakes every session, to dispatch what it holds.
    fn resume_all(&self);
    /// Drops what the hot-key cache holds, and tells CLIENT TRACKING clients to drop what
    /// they cached (it was read from the other cluster).
    fn forget_cache(&self);
    /// This instance's id (its fleet id, with or without a `[fleet]`).
    fn id(&self) -> String;
}

/// Removes the keys copies keep beside the data (`{heatshield:mv:N}...`: versions, and
/// big keys' pieces) from every master of `n`'s cluster; how many.
async fn remove_own_keys(n: &mut Nodes) -> Result<u64, String> {
    let mut removed = 0;
    for m in n.masters() {
        let mut cursor = b"0".to_vec();
        loop {
            let r = n.ask(&m, vec![b"SCAN", &cursor, b"MATCH", b"{heatshield:mv:*", b"COUNT", b"1000"]).await?;
            let (next, keys) = scan_reply(&r)?;
            if !keys.is_empty() {
                let cmds: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"UNLINK"[..], k.as_slice()]).collect();
                removed += n.pipe(&m, &cmds).await?.iter().filter(|r| int(r) == Some(1)).count() as u64;
            }
            cursor = next;
            if cursor == b"0" {
                break;
            }
        }
    }
    Ok(removed)
}

/// Where every instance with this target says it is there, every [`HERE_EVERY`]: id → ms.
pub const MEMBERS_KEY: &[u8] = b"{heatshield:migration}members";
pub const HERE_EVERY: Duration = Duration::from_secs(1);
/// An instance not heard of for this long is not waited for (and is forgotten after 60 s).
pub const GONE_AFTER: Duration = Duration::from_secs(3);

/// The instances heard of within [`GONE_AFTER`].
async fn members(src: &mut Nodes) -> Vec<String> {
    let Ok(r) = src.ask_for(MEMBERS_KEY, vec![b"HGETALL", MEMBERS_KEY]).await else { return Vec::new() };
    let Ok((crate::protocol::reply::Value::Array(v), _)) = crate::protocol::reply::Value::parse(&r) else {
        return Vec::new();
    };
    let since = now_ms().saturating_sub(GONE_AFTER.as_millis() as u64);
    v.chunks(2)
        .filter_map(|p| match p {
            [id, at] => {
                let at: u64 = String::from_utf8_lossy(at.as_bytes()?).parse().ok()?;
                let id = String::from_utf8_lossy(id.as_bytes()?).into_owned();
                (at >= since).then_some(id)
            }
            _ => None,
        })
        .collect()
}

/// Says this instance is there ([`MEMBERS_KEY`]), forgets those gone a minute, and
/// returns how many are there now.
async fn here(src: &mut Nodes, me: &str) -> usize {
    let now = now_ms().to_string();
    let _ = src.ask_for(MEMBERS_KEY, vec![b"HSET", MEMBERS_KEY, me.as_bytes(), now.as_bytes()]).await;
    if let Ok(r) = src.ask_for(MEMBERS_KEY, vec![b"HGETALL", MEMBERS_KEY]).await
        && let Ok((crate::protocol::reply::Value::Array(v), _)) = crate::protocol::reply::Value::parse(&r)
    {
        let old = now_ms().saturating_sub(60_000);
        for p in v.chunks(2) {
            if let [id, at] = p
                && let (Some(id), Some(at)) = (id.as_bytes(), at.as_bytes())
                && String::from_utf8_lossy(at).parse::<u64>().is_ok_and(|a| a < old)
            {
                let _ = src.ask_for(MEMBERS_KEY, vec![b"HDEL", MEMBERS_KEY, id]).await;
            }
        }
    }
    members(src).await.len()
}

/// Writes the phase to [`PHASE_KEY`].
async fn tell(src: &mut Nodes, phase: &str, at: u64) -> Result<(), String> {
    let value = format!("{phase} {at}");
    src.ask_for(PHASE_KEY, vec![b"SET", PHASE_KEY, value.as_bytes()]).await.map(|_| ())
}

/// The phase in [`PHASE_KEY`] and its time.
async fn read_phase(src: &mut Nodes) -> Option<(&'static str, u64)> {
    let r = src.ask_for(PHASE_KEY, vec![b"GET", PHASE_KEY]).await.ok()?;
    let Ok((crate::protocol::reply::Value::Bulk(v), _)) = crate::protocol::reply::Value::parse(&r) else { return None };
    let text = String::from_utf8_lossy(v);
    let (phase, at) = text.split_once(' ')?;
    let phase = ["off", "shadow", "dual-write", "cutover", "hold", "finished"].into_iter().find(|p| *p == phase)?;
    Some((phase, at.parse().ok()?))
}

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
    /// How long it ran, once it ended.
    took: Option<Duration>,
    /// A backfill's slots done (of 16384): those of the masters it has copied whole.
    slots: u64,
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
            reversed: AtomicBool::new(false),
            gate: super::gate::Gate::default(),
            shadow: Arc::new(super::shadow::Shadow::new(max_pending)),
            hooks: OnceLock::new(),
            switching: tokio::sync::Mutex::new(()),
            last_switch: Mutex::new(String::new()),
            logical: [AtomicBool::new(false), AtomicBool::new(false)],
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
            finished: AtomicBool::new(false),
            instances: AtomicU64::new(0),
        }
        .held_until_phase_known()
    }

    /// Starts with shadow on (`migration.phase = "shadow"`).
    pub fn shadowing(self, on: bool) -> DualWrite {
        self.shadow.set(on);
        self
    }

    /// With a target, requests are held from the start until the phase the fleet is in
    /// has been read ([`DualWrite::run`]): an instance started (or restarted) after a
    /// cutover serves the target from its first request, never the source.
    fn held_until_phase_known(self) -> DualWrite {
        if self.configured {
            self.gate.close();
        }
        self
    }

    /// Starts a backfill (`PROXY MIGRATION BACKFILL`) as a task of the calling runtime;
    /// refused while one runs, or before the copier knows the two sides.
    pub fn start_backfill(&self, restart: bool, rate: u64) -> Result<(), String> {
        let (sides, job) = self.claim("backfill")?;
        let shown = job.clone();
        let progress = Box::new(move |done: u64, of: u64, bytes: u64, slots: u64| {
            let mut j = shown.lock().unwrap_or_else(|e| e.into_inner());
            (j.done, j.total, j.bytes, j.slots) = (done, of, bytes, slots);
        });
        let o = super::backfill::Options { restart, rate, max_keys: 0, progress };
        tokio::spawn(async move {
            let r = super::backfill::run(sides, o).await;
            let mut j = job.lock().unwrap_or_else(|e| e.into_inner());
            j.running = false;
            j.took = j.started.map(|t| t.elapsed());
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
            j.took = j.started.map(|t| t.elapsed());
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

    /// Whether writes are copied to the other cluster now (to the target, or back to the
    /// source once cut over).
    #[inline]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// A migration target is configured.
    #[inline]
    pub fn configured(&self) -> bool {
        self.configured
    }

    /// Requests are held while the serving cluster changes ([`super::gate`]).
    #[inline]
    pub fn held(&self) -> bool {
        self.gate.held()
    }

    /// Finished: the target serves for good, nothing is copied.
    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::Relaxed)
    }

    /// Whether the target serves (cut over).
    pub fn cut_over(&self) -> bool {
        self.reversed.load(Ordering::Relaxed)
    }

    /// The phase: `off`, `dual-write` or `cutover`.
    pub fn phase(&self) -> &'static str {
        if self.finished() {
            return "finished";
        }
        if self.shadow.on() {
            return "shadow";
        }
        match (self.cut_over(), self.on()) {
            (true, _) => "cutover",
            (false, true) => "dual-write",
            (false, false) => "off",
        }
    }

    /// Sets what crate::life::start provides: the hooks, and the cluster requests go to.
    pub fn set_hooks(&self, hooks: Box<dyn Hooks>, serving: Arc<Cluster>) {
        let _ = self.hooks.set((hooks, serving));
    }

    /// Turns dual-write on or off; refused without a target, and off once cut over (the
    /// source would fall behind: roll back first).
    pub fn set(&self, on: bool) -> Result<(), &'static str> {
        if on && !self.configured {
            return Err(crate::errors::NO_MIGRATION_TARGET);
        }
        if !on && self.cut_over() {
            return Err(crate::errors::MIGRATION_CUT_OVER);
        }
        self.on.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Turns dual-write on or off here and, through the source cluster
    /// ([`PHASE_KEY`]), at every heatshield with this target (each follows within
    /// [`PHASE_POLL`]).
    pub fn switch(&self, on: bool) -> Result<(), &'static str> {
        self.switch_to(if on { "dual-write" } else { "off" })
    }

    /// Sets the phase `off`, `shadow` or `dual-write` here and at every heatshield with
    /// this target (as [`DualWrite::switch`]).
    pub fn switch_to(&self, phase: &'static str) -> Result<(), &'static str> {
        if self.finished() {
            return Err(crate::errors::MIGRATION_FINISHED);
        }
        if self.cut_over() {
            return Err(crate::errors::MIGRATION_CUT_OVER);
        }
        if phase != "off" && !self.configured {
            return Err(crate::errors::NO_MIGRATION_TARGET);
        }
        self.set(phase == "dual-write")?;
        self.shadow.set(phase == "shadow");
        let at = now_ms();
        self.phase_at.store(at, Ordering::Relaxed);
        if let Some(sides) = self.sides.get().cloned() {
            tokio::spawn(async move {
                let mut src = Nodes::new(sides.source, sides.source_opts, "migration-phase");
                if let Err(e) = tell(&mut src, phase, at).await {
                    warn!(error = %e, "migration: the phase could not be told to the other heatshields");
                }
            });
        }
        Ok(())
    }

    /// Finished here: the target serves for good, writes are no longer copied back.
    fn finish_here(&self) {
        self.on.store(false, Ordering::Relaxed);
        self.finished.store(true, Ordering::Relaxed);
    }

    /// `PROXY MIGRATION FINISH`: once cut over, the source is released. The copies back
    /// still pending land; every instance (told through [`PHASE_KEY`], which says
    /// `finished` from then on) stops copying back; then heatshield's own keys are removed
    /// from both clusters (the copies' versions and pieces, the backfill's progress), but
    /// the phase and hold keys on the source. Runs as a task; `switch_result` tells the end.
    pub fn start_finish(self: &Arc<Self>) -> Result<(), String> {
        let Some(sides) = self.sides.get().cloned() else { return Err(crate::errors::NO_MIGRATION_TARGET.into()) };
        if !self.cut_over() || self.finished() {
            return Err("ERR migration: finish needs the target serving (PROXY MIGRATION CUTOVER first)".into());
        }
        let me = self.clone();
        *self.last_switch.lock().unwrap_or_else(|e| e.into_inner()) = "running".into();
        tokio::spawn(async move {
            let r = me.finish(sides).await;
            *me.last_switch.lock().unwrap_or_else(|e| e.into_inner()) =
                r.unwrap_or_else(|e| format!("finish failed: {e}"));
        });
        Ok(())
    }

    async fn finish(&self, sides: Clusters) -> Result<String, String> {
        let t = Instant::now();
        {
            let _one = self.switching.lock().await;
            super::gate::Gate::until(super::gate::SETTLE, || self.pending() == 0).await;
            self.finish_here();
            let at = now_ms();
            self.phase_at.store(at, Ordering::Relaxed);
            let mut src = Nodes::new(sides.source.clone(), sides.source_opts.clone(), "migration-phase");
            tell(&mut src, "finished", at).await?;
        }
        // (the other instances stop copying back within a poll)
        tokio::time::sleep(PHASE_POLL * 5).await;
        let mut dst = Nodes::new(sides.target.clone(), sides.target_opts.clone(), "migration-finish");
        let on_target = remove_own_keys(&mut dst).await?;
        let _ = dst.ask_for(super::backfill::PROGRESS_KEY, vec![b"DEL", super::backfill::PROGRESS_KEY]).await;
        let mut src = Nodes::new(sides.source, sides.source_opts, "migration-finish");
        let on_source = remove_own_keys(&mut src).await?;
        tracing::info!(on_target, on_source, "migration finished: the target serves, the source is released");
        Ok(format!(
            "finish done in {} ms: {on_target} keys of heatshield removed from the target, {on_source} from the source",
            t.elapsed().as_millis()
        ))
    }

    /// Starts [`DualWrite::cut`] as a task (its requests are held meanwhile, the asking
    /// client's too, so it cannot wait for the end): `PROXY MIGRATION STATUS` shows how it
    /// ended (`switch_result`).
    pub fn start_cut(self: &Arc<Self>, to_target: bool) -> Result<(), String> {
        if !self.configured || self.sides.get().is_none() {
            return Err(crate::errors::NO_MIGRATION_TARGET.into());
        }
        if self.finished() {
            return Err(crate::errors::MIGRATION_FINISHED.into());
        }
        if to_target && !self.on() {
            return Err(crate::errors::MIGRATION_NOT_DUAL.into());
        }
        if !to_target && !self.cut_over() {
            return Err("ERR migration: not cut over; nothing to roll back".into());
        }
        let me = self.clone();
        *self.last_switch.lock().unwrap_or_else(|e| e.into_inner()) = "running".into();
        tokio::spawn(async move {
            let t = Instant::now();
            let what = if to_target { "cutover" } else { "rollback" };
            let r = match me.cut(to_target).await {
                Ok(()) => format!("{what} done in {} ms", t.elapsed().as_millis()),
                Err(e) => format!("{what} failed: {e}"),
            };
            *me.last_switch.lock().unwrap_or_else(|e| e.into_inner()) = r;
        });
        Ok(())
    }

    /// Cuts over (`to_target`: the target serves, and writes are copied back to the
    /// source) or rolls back (the source serves again, writes copied to the target), here
    /// and at every member of the fleet, together: every instance first holds its
    /// requests until those in flight are answered and their copies landed, then all
    /// change, so that no two instances ever write to different clusters.
    pub async fn cut(&self, to_target: bool) -> Result<(), String> {
        let _one = self.switching.lock().await;
        let sides = self.sides.get().cloned().ok_or(crate::errors::NO_MIGRATION_TARGET)?;
        if self.finished() {
            return Err(crate::errors::MIGRATION_FINISHED.into());
        }
        if to_target == self.cut_over() {
            return Ok(());
        }
        if to_target && !self.on() {
            return Err(crate::errors::MIGRATION_NOT_DUAL.into());
        }
        let Some((hooks, _)) = self.hooks.get() else { return Err(crate::errors::NO_MIGRATION_TARGET.into()) };
        let me = hooks.id();
        let mut src = Nodes::new(sides.source.clone(), sides.source_opts.clone(), "migration-phase");
        let peers: Vec<String> = members(&mut src).await.into_iter().filter(|m| *m != me).collect();
        let before = self.phase();
        let at = now_ms();
        self.phase_at.store(at, Ordering::Relaxed);
        if !peers.is_empty() {
            tell(&mut src, "hold", at).await?;
        }
        let undo = async |src: &mut Nodes, why: String| {
            let at = now_ms();
            self.phase_at.store(at, Ordering::Relaxed);
            if !peers.is_empty() {
                let _ = tell(src, before, at).await;
            }
            self.release();
            Err(why)
        };
        if let Err(e) = self.hold().await {
            return undo(&mut src, e).await;
        }
        if !peers.is_empty() {
            let _ = src.ask_for(HELD_KEY, vec![b"HSET", HELD_KEY, me.as_bytes(), at.to_string().as_bytes()]).await;
            let mut missing = peers.clone();
            let end = Instant::now() + super::gate::SETTLE;
            while !missing.is_empty() {
                if Instant::now() >= end {
                    let why = format!(
                        "ERR migration: fleet members {} did not hold their requests; nothing changed",
                        missing.join(", ")
                    );
                    return undo(&mut src, why).await;
                }
                let mut cmd: Vec<&[u8]> = vec![b"HMGET", HELD_KEY];
                cmd.extend(missing.iter().map(|m| m.as_bytes()));
                if let Ok(r) = src.ask_for(HELD_KEY, cmd).await
                    && let Ok((crate::protocol::reply::Value::Array(v), _)) = crate::protocol::reply::Value::parse(&r)
                {
                    let held: Vec<bool> = v.iter().map(|x| x.as_bytes() == Some(at.to_string().as_bytes())).collect();
                    let mut i = 0;
                    missing.retain(|_| {
                        i += 1;
                        !held.get(i - 1).copied().unwrap_or(false)
                    });
                }
                tokio::time::sleep(HELD_POLL).await;
            }
        }
        if let Err(e) = self.retarget(to_target).await {
            return undo(&mut src, e).await;
        }
        let at = now_ms();
        self.phase_at.store(at, Ordering::Relaxed);
        if let Err(e) = tell(&mut src, self.phase(), at).await {
            warn!(error = %e, "migration: the phase could not be told to the other heatshields");
        }
        self.release();
        tracing::info!(phase = self.phase(), "migration: the serving cluster changed");
        Ok(())
    }

    /// Holds requests here until those in flight are answered and every copy landed;
    /// gives up (and lets them go on) after [`super::gate::SETTLE`].
    async fn hold(&self) -> Result<(), String> {
        use super::gate::{Gate, SETTLE};
        self.gate.close();
        let unblock = || {
            if let Some((hooks, _)) = self.hooks.get() {
                hooks.unblock_all();
            }
        };
        unblock();
        // (again now and then: a blocking command dispatched as the hold began)
        let mut looks = 0u32;
        if !Gate::until(SETTLE, || {
            looks += 1;
            if looks.is_multiple_of(50) {
                unblock();
            }
            self.gate.busy_sessions() <= 0
        })
        .await
        {
            self.release();
            return Err("ERR migration: requests still in flight after 5 s; nothing changed".into());
        }
        if !Gate::until(SETTLE, || self.pending() == 0).await {
            self.release();
            return Err("ERR migration: copies still pending after 5 s; nothing changed".into());
        }
        Ok(())
    }

    /// Lets held requests go on.
    fn release(&self) {
        self.gate.open();
        if let Some((hooks, _)) = self.hooks.get() {
            hooks.resume_all();
        }
    }

    /// Points the serving cluster at the target (or back at the source), with requests
    /// held and nothing pending.
    async fn retarget(&self, to_target: bool) -> Result<(), String> {
        let sides = self.sides.get().ok_or(crate::errors::NO_MIGRATION_TARGET)?;
        let Some((hooks, serving)) = self.hooks.get() else { return Err(crate::errors::NO_MIGRATION_TARGET.into()) };
        let (to, opts) = match to_target {
            true => (sides.target.backing(), sides.target_opts.clone()),
            false => (sides.source.backing(), sides.source_opts.clone()),
        };
        let (back, back_opts) = (serving.backing(), serving.options());
        if let Err(e) = serving.retarget(to, opts).await {
            // (the slot map in force was not replaced: the old nodes' settings back)
            let _ = serving.retarget(back, back_opts).await;
            return Err(format!("ERR migration: the other cluster's slot map: {e}"));
        }
        self.on.store(true, Ordering::Relaxed);
        self.reversed.store(to_target, Ordering::Relaxed);
        hooks.forget_cache();
        Ok(())
    }

    /// Follows the phase the other heatshields set ([`PHASE_KEY`]), if newer than the
    /// last change made here. Told to hold, it holds its requests, says so
    /// ([`HELD_KEY`]), and waits for the phase that follows.
    async fn follow(&self, src: &mut Nodes) {
        let Some((phase, at)) = read_phase(src).await else { return };
        if at <= self.phase_at.load(Ordering::Relaxed) {
            return;
        }
        let _one = self.switching.lock().await;
        self.phase_at.store(at, Ordering::Relaxed);
        let mut next = Some((phase, at));
        if phase == "hold" {
            if self.hold().await.is_err() {
                return;
            }
            if let Some((hooks, _)) = self.hooks.get() {
                let me = hooks.id();
                let _ = src.ask_for(HELD_KEY, vec![b"HSET", HELD_KEY, me.as_bytes(), at.to_string().as_bytes()]).await;
            }
            // the phase that follows (the one who holds gives up after twice the settle time)
            next = None;
            let end = Instant::now() + 2 * super::gate::SETTLE + Duration::from_secs(1);
            while Instant::now() < end {
                tokio::time::sleep(HELD_POLL).await;
                if let Some((p, a)) = read_phase(src).await
                    && a > at
                {
                    next = Some((p, a));
                    break;
                }
            }
        }
        match next {
            Some((phase, at)) => {
                self.phase_at.store(at, Ordering::Relaxed);
                let to_target = matches!(phase, "cutover" | "finished");
                if to_target != self.cut_over() {
                    if !self.held() && self.hold().await.is_err() {
                        return;
                    }
                    if let Err(e) = self.retarget(to_target).await {
                        warn!(error = %e, "migration: could not follow the other heatshields' change of cluster");
                    }
                } else if phase != "finished" && self.set(matches!(phase, "dual-write" | "cutover")).is_err() {
                    return;
                }
                self.shadow.set(phase == "shadow");
                if phase == "finished" && self.cut_over() {
                    self.finish_here();
                }
                tracing::info!(phase, "migration phase changed by another heatshield");
            }
            None => warn!("migration: held requests for another heatshield's cutover that never came; going on"),
        }
        if self.held() {
            self.release();
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
            ("serving", if self.cut_over() { "target" } else { "source" }.into()),
            ("instances", n(&self.instances)),
            ("held", if self.held() { "yes" } else { "no" }.into()),
            ("switch_result", self.last_switch.lock().unwrap_or_else(|e| e.into_inner()).clone()),
            ("shadow", if self.shadow.on() { "on" } else { "off" }.into()),
            ("shadow_pending", self.shadow.pending().to_string()),
            ("shadow_matched", n(&self.shadow.matched)),
            ("shadow_differed", n(&self.shadow.differed)),
            ("shadow_failed", n(&self.shadow.failed)),
            ("shadow_dropped", n(&self.shadow.dropped)),
            ("shadow_skipped", n(&self.shadow.skipped)),
            ("shadow_differences", self.shadow.differences()),
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
        metrics::gauge!("heatshield_migration_cut_over").set(if self.cut_over() { 1.0 } else { 0.0 });
        metrics::gauge!("heatshield_migration_shadow").set(if self.shadow.on() { 1.0 } else { 0.0 });
        let s = &self.shadow;
        for (outcome, v) in [
            ("matched", n(&s.matched)),
            ("differed", n(&s.differed)),
            ("failed", n(&s.failed)),
            ("dropped", n(&s.dropped)),
            ("skipped", n(&s.skipped)),
        ] {
            metrics::counter!("heatshield_migration_shadow_total", "outcome" => outcome).absolute(v);
        }
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
        metrics::gauge!("heatshield_migration_job_slots_done").set(j.slots as f64);
    }

    /// The last backfill or verify run inside heatshield: what, its state, keys done out
    /// of the source's, bytes, rate, the time left, and its result.
    fn job_status(&self) -> Vec<(&'static str, String)> {
        let j = self.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let secs = j.took.or(j.started.map(|t| t.elapsed())).map_or(0.0, |d| d.as_secs_f64()).max(1e-3);
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
            ("job_slots_done", j.slots.to_string()),
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
        if source.is_cluster() {
            source.spawn_refresher(Duration::from_secs(5));
            let _ = source.refresh().await;
        }
        {
            // the phase the other heatshields set, followed: first before any request is
            // served (requests are held until then, at most PHASE_AT_START), then every
            // PHASE_POLL until the migration is finished
            let me = self.clone();
            let mut src = Nodes::new(source.clone(), source_opts.clone(), "migration-phase");
            let end = Instant::now() + PHASE_AT_START;
            while read_phase(&mut src).await.is_none() && Instant::now() < end {
                if src.ask_for(PHASE_KEY, vec![b"EXISTS", PHASE_KEY]).await.is_ok_and(|r| int(&r) == Some(0)) {
                    break; // no phase set yet: the configured one
                }
                tokio::time::sleep(PHASE_POLL).await;
            }
            me.follow(&mut src).await;
            // (nothing else can hold yet: every request, an admin's too, waits for this)
            if me.held() {
                me.release();
            }
            let id = me.hooks.get().map(|(h, _)| h.id()).unwrap_or_default();
            let mut said = Instant::now() - HERE_EVERY;
            tokio::spawn(async move {
                while !me.finished() {
                    if said.elapsed() >= HERE_EVERY {
                        said = Instant::now();
                        let n = here(&mut src, &id).await;
                        me.instances.store(n as u64, Ordering::Relaxed);
                    }
                    tokio::time::sleep(PHASE_POLL).await;
                    me.follow(&mut src).await;
                }
            });
        }
        if target.is_cluster() {
            target.spawn_refresher(Duration::from_secs(5));
            let _ = target.refresh().await;
        }
        tokio::spawn(self.shadow.clone().run(Nodes::new(target.clone(), target_opts.clone(), "shadow")));
        let mut a = Nodes::new(source, source_opts, "dual-write");
        let mut b = Nodes::new(target, target_opts, "dual-write");
        loop {
            let batch = {
                // (counted in flight as it is taken: `pending` never sees it in neither)
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                self.in_flight.store(q.keys.len() as u64, Ordering::Relaxed);
                q.bytes = 0;
                std::mem::take(&mut q.keys)
            };
            if batch.is_empty() {
                self.wake.notified().await;
                continue;
            }
            // (the direction changes only while nothing is pending: crate::services::migration::gate)
            let back = self.cut_over();
            let logical = &self.logical[back as usize];
            let (src, dst) = if back { (&mut b, &mut a) } else { (&mut a, &mut b) };
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
                    match copy_batch(src, dst, m, chunk, logical.load(Ordering::Relaxed), &mut c).await {
                        Ok(()) => {
                            self.applied.fetch_add(c.applied, Ordering::Relaxed);
                            self.kept.fetch_add(c.kept, Ordering::Relaxed);
                            self.gone.fetch_add(c.gone, Ordering::Relaxed);
                            self.failed.fetch_add(c.failed, Ordering::Relaxed);
                            failed.extend(c.retry.iter().map(|k| Bytes::copy_from_slice(k)));
                            if c.incompatible && !logical.swap(true, Ordering::Relaxed) {
                                warn!(
                                    back,
                                    "dual-write: the other cluster cannot restore this one's dumps; copying values from now on"
                                );
                            }
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
            // (keys to try again stay pending until noted again)
            self.in_flight.store(failed.len() as u64, Ordering::Relaxed);
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
            self.in_flight.store(0, Ordering::Relaxed);
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
