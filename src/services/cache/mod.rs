//! The hot-key cache (docs/cache.md): notices keys read often enough to hurt their shard
//! and answers their reads from memory, never serving a value older than a write some
//! client was already told had succeeded.
//!
//! - Detection ([`detect`]): 1 in N reads' keys go into a top-k sketch; at the end of each
//!   window the hot set is republished as an immutable snapshot the request path reads
//!   without locking. Patterns can pin keys hot or keep them out of the cache.
//! - Storage: a moka cache keyed by data key, bounded by bytes, LRU, with a maximum age as
//!   a last resort. An entry holds, for each command variant read of that key (command,
//!   protocol, arguments), the reply exactly as Redis sent it.
//! - Freshness: a read that fills the cache is sent on the client's own backend connection
//!   (so the client's pipeline keeps its order) prefixed with `CLIENT CACHING yes`; every
//!   backend connection has `CLIENT TRACKING on REDIRECT <id> OPTIN`, so Redis tracks
//!   exactly those reads and reports changes to the node's invalidation connection
//!   ([`tracking`]). Writes through the proxy drop their keys when sent and again before
//!   their reply is passed on. Generations (per key stripe, per node, whole cache) are
//!   taken when a fill starts and checked when it lands, so a fill that raced an
//!   invalidation is never kept; a hit also checks that its node still owns the slot.
//! - Single flight: concurrent misses of one variant wait for the one fill in flight.

pub mod clients;
pub mod detect;
pub mod tracking;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::command::{Command, CommandTable, KeySpec, Route};
use crate::mailbox::{BackendError, BackendReply, Delivery, ReplyTx, Tag};
use crate::protocol::{Proto, Request};
use crate::upstream::backend::{BackendRequest, Prefix};
use crate::upstream::cluster::NodePool;
use detect::{Detector, DetectorConfig};

/// Generation stripes for keys: an invalidation bumps its key's stripe.
const STRIPES: usize = 4096;

/// `[cache]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    pub enabled: bool,
    /// One read in this many is counted by the detector.
    pub sample_every: u32,
    /// Length of a detection window.
    pub window_ms: u64,
    /// Estimated reads per second at which a key becomes hot.
    pub hot_threshold: f64,
    /// Windows in a row below half the threshold before a hot key stops being hot.
    pub cool_windows: u32,
    /// Hot keys tracked at most.
    pub max_hot_keys: usize,
    /// Memory for cached replies (keys, arguments and reply bytes).
    pub max_bytes: u64,
    /// Replies larger than this are not cached.
    pub max_entry_bytes: u64,
    /// An entry older than this is dropped even if no invalidation came (a safety net).
    pub max_age_ms: u64,
    /// Commands whose replies may be cached (read-only, one key, deterministic).
    pub commands: Vec<String>,
    /// Keys matching these globs are cached whenever read, hot or not.
    pub pin: Vec<String>,
    /// Keys matching these globs are never cached (they can still be reported hot).
    pub never: Vec<String>,
    /// Keys whose last cached value answers their reads while their master cannot
    /// (`[[cache.stale_if_error]]`), the first matching rule deciding.
    pub stale_if_error: Vec<StaleRule>,
    /// Keys whose last value answers their reads for a while after their TTL ends in
    /// Redis, while one read goes to Redis (`[[cache.revalidate]]`: stale-while-revalidate).
    pub revalidate: Vec<StaleRule>,
}

/// One `[[cache.stale_if_error]]` or `[[cache.revalidate]]` rule.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StaleRule {
    /// A glob of keys (their client names, under colocation rules).
    pub pattern: String,
    /// The oldest value served: how long ago it stopped being known current (for
    /// `stale_if_error`: its node's invalidations stopped coming, or it was read; for
    /// `revalidate`: its TTL ended).
    pub max_stale_ms: u64,
}

/// The commands cached by default.
pub const DEFAULT_COMMANDS: &[&str] = &[
    "GET",
    "HGET",
    "HMGET",
    "HGETALL",
    "HEXISTS",
    "HLEN",
    "HSTRLEN",
    "STRLEN",
    "GETRANGE",
    "EXISTS",
    "TYPE",
    "LRANGE",
    "LINDEX",
    "LLEN",
    "SMEMBERS",
    "SISMEMBER",
    "SMISMEMBER",
    "SCARD",
    "ZSCORE",
    "ZMSCORE",
    "ZRANGE",
    "ZREVRANGE",
    "ZRANGEBYSCORE",
    "ZRANK",
    "ZREVRANK",
    "ZCARD",
    "ZCOUNT",
];

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: true,
            sample_every: 8,
            window_ms: 1_000,
            hot_threshold: 1_000.0,
            cool_windows: 3,
            max_hot_keys: 1_024,
            max_bytes: 64 * 1024 * 1024,
            max_entry_bytes: 64 * 1024,
            max_age_ms: 10_000,
            commands: DEFAULT_COMMANDS.iter().map(|s| s.to_string()).collect(),
            pin: vec![],
            never: vec![],
            stale_if_error: vec![],
            revalidate: vec![],
        }
    }
}

impl CacheConfig {
    /// Every problem, each naming its key.
    pub fn validate(&self, table: &CommandTable) -> Vec<String> {
        let mut p = Vec::new();
        if !(1..=1_000_000).contains(&self.sample_every) {
            p.push("cache.sample_every: must be between 1 and 1000000".into());
        }
        if !(10..=3_600_000).contains(&self.window_ms) {
            p.push("cache.window_ms: must be between 10 and 3600000".into());
        }
        if !(self.hot_threshold.is_finite() && self.hot_threshold > 0.0) {
            p.push("cache.hot_threshold: must be greater than 0 (reads per second)".into());
        }
        if self.cool_windows == 0 {
            p.push("cache.cool_windows: must be at least 1".into());
        }
        if !(1..=1_000_000).contains(&self.max_hot_keys) {
            p.push("cache.max_hot_keys: must be between 1 and 1000000".into());
        }
        if self.max_bytes < 1024 {
            p.push("cache.max_bytes: must be at least 1024".into());
        }
        if self.max_entry_bytes == 0
            || self.max_entry_bytes > self.max_bytes
            || self.max_entry_bytes > u32::MAX as u64 / 2
        {
            p.push("cache.max_entry_bytes: must be at least 1 and at most cache.max_bytes".into());
        }
        if self.max_age_ms == 0 {
            p.push("cache.max_age_ms: must be greater than 0".into());
        }
        for name in &self.commands {
            if let Err(why) = cacheable(table, name) {
                p.push(format!("cache.commands: '{name}' {why}"));
            }
        }
        for (k, list) in [("cache.pin", &self.pin), ("cache.never", &self.never)] {
            if list.iter().any(|s| s.is_empty()) {
                p.push(format!("{k}: patterns must not be empty"));
            }
        }
        for (name, rules) in [("stale_if_error", &self.stale_if_error), ("revalidate", &self.revalidate)] {
            for (i, r) in rules.iter().enumerate() {
                if r.pattern.is_empty() {
                    p.push(format!("cache.{name}[{i}].pattern: must not be empty"));
                }
                if !(1..=3_600_000).contains(&r.max_stale_ms) {
                    p.push(format!("cache.{name}[{i}].max_stale_ms: must be between 1 and 3600000"));
                }
            }
        }
        p
    }
}

/// Whether `name` can be cached: a known read-only command with its key first.
fn cacheable<'t>(table: &'t CommandTable, name: &str) -> Result<&'t Command, &'static str> {
    let upper = name.to_ascii_uppercase();
    let cmd = match upper.split_once(' ') {
        Some((a, b)) => table.get(a.as_bytes()).and_then(|c| c.sub(b.as_bytes())),
        None => table.get(upper.as_bytes()),
    }
    .ok_or("is not a known command")?;
    if !cmd.is_readonly() {
        return Err("is not a read-only command");
    }
    if cmd.has(crate::command::traits::VOLATILE) {
        return Err("has a reply that changes without a write (time or randomness)");
    }
    match (cmd.route, &cmd.keys) {
        (Route::Forward, KeySpec::Range { first: 1, .. }) => Ok(cmd),
        // EXISTS: cached when it names one key
        (Route::Split(crate::command::Split::Sum), _) => Ok(cmd),
        _ => Err("does not take its key as the first argument"),
    }
}

/// Why entries were dropped (the `cause` label of the invalidation metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A write through this proxy.
    Write = 0,
    /// An invalidation message from Redis (a write elsewhere, expiry, eviction).
    Tracking = 1,
    /// FLUSHALL / FLUSHDB (through the proxy or reported by Redis), or PROXY CACHE FLUSH.
    Flush = 2,
    /// A connection whose reads were tracked, or the invalidation connection, broke.
    Connection = 3,
    /// The key stopped being hot.
    Cooled = 4,
}

pub const CAUSES: [&str; 5] = ["write", "tracking", "flush", "connection", "cooled"];

/// Counters (exported periodically, so the request path touches plain atomics).
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub fills: AtomicU64,
    /// Misses that waited for a fill already in flight.
    pub coalesced: AtomicU64,
    /// Fills not kept because an invalidation raced them.
    pub raced: AtomicU64,
    /// Fills not kept because the reply was larger than `max_entry_bytes`.
    pub too_big: AtomicU64,
    pub invalidations: [AtomicU64; 5],
    /// Reads answered with a stale value while their master could not answer.
    pub stale: AtomicU64,
    /// Reads answered with the last value of a key whose TTL ended, while one read
    /// refreshes it (`revalidate`).
    pub revalidated: AtomicU64,
    /// Keys held past the end of their TTL (`revalidate`).
    pub held: AtomicU64,
}

/// A hot key as the request path sees it.
#[derive(Debug, Clone, Copy)]
pub struct HotInfo {
    /// Estimated reads per second in the last window.
    pub rate: f64,
    /// Not excluded by `cache.never`.
    pub cacheable: bool,
}

type HotSet = HashMap<Bytes, HotInfo, ahash::RandomState>;

/// One cached reply.
struct Variant {
    cmd: usize,
    proto: Proto,
    /// The database it was read in (SELECT).
    db: u16,
    /// The arguments after the command name.
    args: Vec<Bytes>,
    reply: Bytes,
    /// When it was read, and until when it is served (`max_age_ms` later).
    filled: Instant,
    fresh_until: Instant,
    /// Where it was read, and that node's tracking generation then.
    pool: Arc<NodePool>,
    node_generation: u64,
    /// The cache-wide generation then.
    generation: u64,
}

impl Variant {
    fn matches(&self, cmd: usize, proto: Proto, db: u16, req: &Request) -> bool {
        self.cmd == cmd
            && self.proto == proto
            && self.db == db
            && self.args.len() + 1 == req.argc()
            && self.args.iter().enumerate().all(|(i, a)| a[..] == *req.arg(i + 1))
    }

    fn size(&self) -> usize {
        self.reply.len() + self.args.iter().map(|a| a.len() + 32).sum::<usize>() + 96
    }
}

/// The cached variants of one key.
struct KeyEntry {
    variants: Vec<Variant>,
    /// When the key's TTL ends in Redis (`backend::clock_ms`; 0: none or not known),
    /// learned by fills of keys under a `revalidate` rule.
    expires_at: AtomicU64,
    /// When its TTL ended and the entry was held for stale-while-revalidate (0: not).
    held: AtomicU64,
    /// A held entry's refresh (one read sent to Redis) has been started.
    refreshing: std::sync::atomic::AtomicBool,
}

impl KeyEntry {
    fn new(variants: Vec<Variant>, expires_at: u64) -> KeyEntry {
        KeyEntry {
            variants,
            expires_at: AtomicU64::new(expires_at),
            held: AtomicU64::new(0),
            refreshing: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// How early an invalidation may come before the end of a key's TTL as heatshield
/// estimated it (the estimate is early by up to a round trip, and counts whole ms) and
/// still be taken for the expiry.
const EXPIRY_SLACK_MS: u64 = 2;

/// Whether a reply says the key does not exist: nil, an empty collection, 0.
fn missing(reply: &[u8]) -> bool {
    matches!(reply, b"$-1\r\n" | b"*-1\r\n" | b"_\r\n" | b"*0\r\n" | b"%0\r\n" | b"~0\r\n" | b":0\r\n")
}

/// Generations a fill saw when it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snap {
    stripe: u64,
    node: u64,
    generation: u64,
}

/// A read in flight that will fill the cache.
struct Fill {
    key: Bytes,
    cmd: usize,
    proto: Proto,
    db: u16,
    args: Vec<Bytes>,
    pool: Arc<NodePool>,
    snap: Snap,
    sent: Instant,
    /// The refresh of a held entry (`revalidate`).
    refresh: bool,
    /// The client whose request was sent, then clients waiting for the same reply.
    waiters: Vec<(ReplyTx, Tag)>,
    req: (Proto, u16, Bytes),
}

#[derive(Default)]
struct Fills {
    by_id: HashMap<u64, Fill>,
    by_req: HashMap<(Proto, u16, Bytes), u64>,
}

/// The shared hot-key cache.
pub struct HotCache {
    pub cfg: CacheConfig,
    pub enabled: bool,
    /// By command id.
    cacheable: Vec<bool>,
    get_id: usize,
    pins: Vec<Vec<u8>>,
    never: Vec<Vec<u8>>,
    /// `stale_if_error`: glob, limit.
    stale: Vec<(Vec<u8>, Duration)>,
    /// `revalidate`: glob, limit.
    revalidate: Vec<(Vec<u8>, Duration)>,
    /// PTTLs asked by fills (`revalidate`): fill id -> key, when the read was sent.
    ttl_asks: Mutex<HashMap<u64, (Bytes, Instant)>>,
    /// `max_age_ms`: older entries are not served (but kept for stale answers).
    max_age: Duration,
    /// Colocation rules: `pin` and `never` match a key's client name too.
    names: Arc<crate::services::colocate::Colocate>,
    detector: Mutex<Detector>,
    /// The detector's window and door period ([`detect::Door`]), for the doors.
    door: (AtomicU64, std::sync::atomic::AtomicU32),
    /// Samples the doors took and have not told the detector of yet.
    sampled: AtomicU64,
    hot: ArcSwap<HotSet>,
    hot_count: AtomicUsize,
    /// Bumped whenever keys become hot (see [`HotCache::hot_generation`]).
    hot_generation: AtomicU64,
    entries: moka::sync::Cache<Bytes, Arc<KeyEntry>>,
    stripes: Box<[AtomicU64]>,
    hasher: ahash::RandomState,
    generation: AtomicU64,
    fills: Mutex<Fills>,
    next_fill: AtomicU64,
    fill_tx: std::sync::OnceLock<ReplyTx>,
    pub stats: CacheStats,
}

impl HotCache {
    /// Builds the cache (the configuration was validated). Fills need [`tracking::start`].
    pub fn new(cfg: &CacheConfig, table: &CommandTable, names: Arc<crate::services::colocate::Colocate>) -> HotCache {
        let mut cacheable = vec![false; table.count() + 1];
        for name in &cfg.commands {
            if let Ok(c) = self::cacheable(table, name) {
                cacheable[c.id] = true;
            }
        }
        let stale: Vec<(Vec<u8>, Duration)> = cfg
            .stale_if_error
            .iter()
            .map(|r| (r.pattern.as_bytes().to_vec(), Duration::from_millis(r.max_stale_ms)))
            .collect();
        let revalidate: Vec<(Vec<u8>, Duration)> = cfg
            .revalidate
            .iter()
            .map(|r| (r.pattern.as_bytes().to_vec(), Duration::from_millis(r.max_stale_ms)))
            .collect();
        let max_age = Duration::from_millis(cfg.max_age_ms.max(1));
        // an entry is kept past its age for as long as it may answer as a stale value
        let keep = max_age + stale.iter().chain(&revalidate).map(|s| s.1).max().unwrap_or_default();
        let entries = moka::sync::Cache::builder()
            .max_capacity(cfg.max_bytes)
            .weigher(|k: &Bytes, v: &Arc<KeyEntry>| {
                (k.len() + 64 + v.variants.iter().map(Variant::size).sum::<usize>()).min(u32::MAX as usize) as u32
            })
            .time_to_live(keep)
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .build();
        HotCache {
            enabled: cfg.enabled,
            cacheable,
            get_id: table.get(b"GET").map(|c| c.id).unwrap_or(usize::MAX),
            pins: cfg.pin.iter().map(|p| p.as_bytes().to_vec()).collect(),
            never: cfg.never.iter().map(|p| p.as_bytes().to_vec()).collect(),
            stale,
            revalidate,
            ttl_asks: Mutex::new(HashMap::new()),
            max_age,
            names,
            detector: Mutex::new(Detector::new(DetectorConfig {
                sample_every: cfg.sample_every.max(1),
                threshold: cfg.hot_threshold,
                cool_windows: cfg.cool_windows.max(1),
                max_hot_keys: cfg.max_hot_keys.max(1),
            })),
            door: (AtomicU64::new(0), std::sync::atomic::AtomicU32::new(detect::Detector::first_period())),
            sampled: AtomicU64::new(0),
            hot: ArcSwap::from_pointee(HotSet::default()),
            hot_count: AtomicUsize::new(0),
            hot_generation: AtomicU64::new(0),
            entries,
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            hasher: ahash::RandomState::new(),
            generation: AtomicU64::new(0),
            fills: Mutex::new(Fills::default()),
            next_fill: AtomicU64::new(1),
            fill_tx: std::sync::OnceLock::new(),
            stats: CacheStats::default(),
            cfg: cfg.clone(),
        }
    }

    /// New detection thresholds (a reload; the other settings need a restart).
    pub fn retune(&self, threshold: f64, cool_windows: u32, max_hot_keys: usize) {
        self.detector.lock().retune(threshold, cool_windows, max_hot_keys);
    }

    /// Counts a read of `key` for detection: one in `sample_every` is a sample, which the
    /// worker thread's door ([`detect::Door`]) holds or lets into the detector (under its
    /// lock); the others cost a thread-local increment.
    #[inline]
    pub fn sample(&self, key: &[u8]) {
        thread_local! {
            static N: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        // (the count inlined into admission; the sample, one read in `sample_every`, not:
        // a call that saves the registers a sample needs cost most of the count)
        let hit = N.with(|n| {
            let v = n.get() + 1;
            let hit = v >= self.cfg.sample_every;
            n.set(if hit { 0 } else { v });
            hit
        });
        if hit {
            self.take_sample(key);
        }
    }

    #[inline(never)]
    fn take_sample(&self, key: &[u8]) {
        thread_local! {
            static DOOR: std::cell::RefCell<detect::Door> = std::cell::RefCell::new(detect::Door::default());
        }
        let at = (self as *const HotCache as usize, self.door.0.load(Ordering::Relaxed));
        let period = self.door.1.load(Ordering::Relaxed);
        let seen = DOOR.with(|d| {
            let mut d = d.borrow_mut();
            d.take(key, at, period, |k, n| self.detector.lock().record(k, n));
            d.take_seen(256)
        });
        if seen > 0 {
            self.sampled.fetch_add(seen, Ordering::Relaxed);
        }
    }

    /// Whether anything may be cached now (some key is hot, or keys are pinned).
    #[inline]
    pub fn active(&self) -> bool {
        self.enabled && (self.hot_count.load(Ordering::Relaxed) > 0 || !self.pins.is_empty())
    }

    /// Whether the reply to `req` (a `cmd`) may come from the cache or fill it: a
    /// cacheable read naming its key, not under WATCH (reads under WATCH go to the
    /// master, on the pinned connection). The one test of each place the cache answers
    /// (admission, stale-if-error) or fills (admission, a fill sent again).
    #[inline]
    pub fn may_answer(&self, cmd: &Command, req: &crate::protocol::Request, watching: bool) -> bool {
        self.cacheable[cmd.id] && req.argc() >= 2 && !watching
    }

    /// Whether reads of `key` are cached: hot (or pinned) and not excluded.
    pub fn tracked(&self, key: &[u8]) -> bool {
        if let Some(h) = self.hot.load().get(key) {
            return h.cacheable;
        }
        !self.pins.is_empty() && self.matches(&self.pins, key) && !self.matches(&self.never, key)
    }

    /// Whether one of `globs` matches `key`, or its client name if colocation rules
    /// stored it under another (crate::services::colocate).
    fn matches(&self, globs: &[Vec<u8>], key: &[u8]) -> bool {
        if globs.iter().any(|p| crate::glob::matches(p, key, false)) {
            return true;
        }
        let client = self.names.client_key(key);
        client.len() != key.len() && globs.iter().any(|p| crate::glob::matches(p, client, false))
    }

    fn stripe(&self, key: &[u8]) -> &AtomicU64 {
        &self.stripes[(self.hasher.hash_one(key) as usize) % STRIPES]
    }

    fn snap(&self, key: &[u8], pool: &NodePool) -> Snap {
        Snap {
            stripe: self.stripe(key).load(Ordering::SeqCst),
            node: pool.tracking.generation.load(Ordering::SeqCst),
            generation: self.generation.load(Ordering::SeqCst),
        }
    }

    /// Whether `v` may still be served at `now` for a key whose slot `owner` serves now:
    /// read from that node, with no invalidation of the node or the whole cache since,
    /// and younger than `max_age_ms`.
    fn valid(&self, v: &Variant, owner: &Arc<NodePool>, now: Instant) -> bool {
        Arc::ptr_eq(&v.pool, owner)
            && v.node_generation == owner.tracking.generation.load(Ordering::SeqCst)
            && v.generation == self.generation.load(Ordering::SeqCst)
            && now < v.fresh_until
    }

    /// A cached reply for this read, if one is valid: `owner` is the master serving the
    /// key's slot now. Counted as a hit or miss by [`HotCache::answered`], once the read
    /// is admitted.
    #[allow(clippy::too_many_arguments)]
    pub fn lookup(
        &self,
        cmd: usize,
        proto: Proto,
        db: u16,
        req: &Request,
        key: &[u8],
        owner: &Arc<NodePool>,
        now: Instant,
    ) -> Option<Bytes> {
        self.entries.get(key).and_then(|e| {
            let v = e.variants.iter().find(|v| v.matches(cmd, proto, db, req))?;
            let held = e.held.load(Ordering::Relaxed);
            if held != 0 {
                // (its age is bounded by the rule, not max_age_ms)
                return (self.valid(v, owner, v.filled) && self.held(key, &e, held, now)).then(|| v.reply.clone());
            }
            self.valid(v, owner, now).then(|| v.reply.clone())
        })
    }

    /// Counts an admitted read's lookups: `hits` answered from the cache, `misses` sent to
    /// Redis as the cache's fill (a read refused by a rate limit is neither).
    #[inline]
    pub fn answered(&self, hits: u64, misses: u64) {
        if hits > 0 {
            self.stats.hits.fetch_add(hits, Ordering::Relaxed);
        }
        if misses > 0 {
            self.stats.misses.fetch_add(misses, Ordering::Relaxed);
        }
    }

    /// A read of a held entry (its TTL ended: `revalidate`): answered with its last value
    /// (true), unless the hold is over (the entry goes) or no read has been sent to
    /// Redis yet (this one is: it becomes the refresh).
    #[cold]
    fn held(&self, key: &[u8], e: &KeyEntry, held: u64, now: Instant) -> bool {
        let limit = self.rule_limit(&self.revalidate, key).unwrap_or_default();
        if crate::upstream::backend::clock_ms(now).saturating_sub(held) > limit.as_millis() as u64 {
            self.entries.invalidate(key);
            return false;
        }
        if !e.refreshing.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.stats.revalidated.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The limit of the first rule of `rules` that covers `key`.
    fn rule_limit(&self, rules: &[(Vec<u8>, Duration)], key: &[u8]) -> Option<Duration> {
        rules.iter().find(|(p, _)| self.matches(std::slice::from_ref(p), key)).map(|r| r.1)
    }

    /// The cached `GET key` reply (for MGET), if valid (counted by [`HotCache::answered`]).
    pub fn lookup_get(&self, proto: Proto, db: u16, key: &[u8], owner: &Arc<NodePool>, now: Instant) -> Option<Bytes> {
        let e = self.entries.get(key)?;
        let v =
            e.variants.iter().find(|v| v.cmd == self.get_id && v.proto == proto && v.db == db && v.args.len() == 1)?;
        if self.valid(v, owner, now) && e.held.load(Ordering::Relaxed) == 0 { Some(v.reply.clone()) } else { None }
    }

    /// Whether some `stale_if_error` rule exists.
    #[inline]
    pub fn serves_stale(&self) -> bool {
        !self.stale.is_empty()
    }

    /// A stale answer for a read whose master cannot answer now (`stale_if_error`): the
    /// reply cached for exactly this read, if a rule covers `key` and the value stopped
    /// being known current at most the rule's limit ago. Known current means: read from
    /// its node, whose invalidations kept coming since (a write through heatshield or one
    /// Redis reported dropped the entry, and a flush voided it). Counted in `stale`.
    pub fn lookup_stale(&self, cmd: usize, proto: Proto, db: u16, req: &Request, key: &[u8]) -> Option<Bytes> {
        let limit = self.rule_limit(&self.stale, key)?;
        let e = self.entries.get(key)?;
        let v = e.variants.iter().find(|v| v.matches(cmd, proto, db, req))?;
        // (a held entry may have a write of its key in flight: see invalidate_sent)
        if v.generation != self.generation.load(Ordering::SeqCst)
            || !self.tracked(key)
            || e.held.load(Ordering::SeqCst) != 0
        {
            return None;
        }
        let t = &v.pool.tracking;
        let since = if v.node_generation == t.generation.load(Ordering::SeqCst) {
            // its node still reports changes, but does not serve the slot any more (or
            // the entry outlived max_age_ms): known current when it was read
            v.filled
        } else {
            t.current_until(v.node_generation)?
        };
        if since.elapsed() > limit {
            return None;
        }
        self.stats.stale.fetch_add(1, Ordering::Relaxed);
        Some(v.reply.clone())
    }

    /// Starts (or joins) the fill of a missed read. The request goes on `conn` (the
    /// client's own connection to `owner`) prefixed with `CLIENT CACHING yes`; its reply
    /// reaches the client as `tag` on `reply_to`. Returns false when the read cannot fill
    /// the cache now (the caller sends it as usual).
    #[allow(clippy::too_many_arguments)]
    pub fn fill(
        &self,
        cmd: usize,
        proto: Proto,
        db: u16,
        req: &Request,
        key: &[u8],
        owner: &Arc<NodePool>,
        conn: &crate::upstream::backend::Backend,
        reply_to: &ReplyTx,
        tag: Tag,
    ) -> bool {
        let Some(fill_tx) = self.fill_tx.get() else { return false };
        let redirect = owner.tracking.redirect.load(Ordering::SeqCst);
        if redirect == 0 || conn.stats.tracking_id.load(Ordering::SeqCst) != redirect {
            return false; // invalidations from this connection would not reach us
        }
        let mut fills = self.fills.lock();
        if let Some(id) = fills.by_req.get(&(proto, db, req.raw().clone())).copied()
            && let Some(f) = fills.by_id.get_mut(&id)
        {
            f.waiters.push((reply_to.clone(), tag));
            self.stats.coalesced.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let id = self.next_fill.fetch_add(1, Ordering::Relaxed);
        let raw = Bytes::copy_from_slice(req.raw());
        let refresh =
            !self.revalidate.is_empty() && self.entries.get(key).is_some_and(|e| e.held.load(Ordering::SeqCst) != 0);
        fills.by_req.insert((proto, db, raw.clone()), id);
        fills.by_id.insert(
            id,
            Fill {
                key: Bytes::copy_from_slice(key),
                cmd,
                proto,
                db,
                args: req.args().skip(1).map(Bytes::copy_from_slice).collect(),
                pool: owner.clone(),
                snap: self.snap(key, owner),
                sent: Instant::now(),
                refresh,
                waiters: vec![(reply_to.clone(), tag)],
                req: (proto, db, raw.clone()),
            },
        );
        drop(fills);
        self.stats.fills.fetch_add(1, Ordering::Relaxed);
        conn.send(BackendRequest {
            data: raw,
            count: 1,
            prefix: Prefix::CachingYes,
            tag: Tag { seq: id, part: 0 },
            reply_to: fill_tx.clone(),
            order: None,
            db,
        });
        if !self.revalidate.is_empty() && self.rule_limit(&self.revalidate, key).is_some() {
            // the key's TTL, read right after it on the same connection (revalidate)
            self.ttl_asks.lock().insert(id, (Bytes::copy_from_slice(key), Instant::now()));
            conn.send(BackendRequest {
                data: Request::from_args(&[b"PTTL".as_slice(), key]).raw().clone(),
                count: 1,
                prefix: Prefix::None,
                tag: Tag { seq: id, part: 1 },
                reply_to: fill_tx.clone(),
                order: None,
                db,
            });
        }
        true
    }

    /// The PTTL read after a fill: when the key's TTL ends.
    fn ttl_done(&self, reply: BackendReply) {
        let Some((key, sent)) = self.ttl_asks.lock().remove(&reply.tag.seq) else { return };
        let Ok(data) = reply.result else { return };
        let ms = match crate::protocol::reply::Value::parse(&data) {
            Ok((crate::protocol::reply::Value::Int(ms), _)) if ms > 0 => ms as u64,
            _ => 0,
        };
        if let Some(e) = self.entries.get(&key)
            && e.held.load(Ordering::SeqCst) == 0
        {
            let at = if ms == 0 { 0 } else { crate::upstream::backend::clock_ms(sent) + ms };
            e.expires_at.store(at, Ordering::SeqCst);
        }
    }

    /// A fill's reply: keep it if nothing invalidated the key meanwhile, and answer the
    /// waiters. The first waiter (whose request it was) always gets the reply; the others
    /// get it only if it is still current, else they send their own read.
    pub fn fill_done(&self, reply: BackendReply) {
        if reply.tag.part == 1 {
            return self.ttl_done(reply);
        }
        let Some(f) = ({
            let mut fills = self.fills.lock();
            let f = fills.by_id.remove(&reply.tag.seq);
            if let Some(f) = &f {
                fills.by_req.remove(&f.req);
            }
            f
        }) else {
            return;
        };
        let mut waiters = f.waiters.into_iter();
        let Some((first_tx, first_tag)) = waiters.next() else { return };
        let data = match reply.result {
            Ok(d) if !matches!(d.first(), Some(b'-' | b'!')) => d,
            other => {
                // errors (redirections included) are the asking client's; the others retry
                let _ = first_tx.send(Delivery::reply(first_tag, other));
                for (tx, tag) in waiters {
                    let _ = tx.send(Delivery::reply(tag, Err(BackendError::Resend)));
                }
                return;
            }
        };
        let current = self.snap(&f.key, &f.pool) == f.snap && self.tracked(&f.key);
        if f.refresh && missing(&data) && self.entries.get(&f.key).is_some_and(|e| e.held.load(Ordering::SeqCst) != 0) {
            // the key is still gone: the held value keeps answering the others until it
            // is written (Redis tracks the key again for this read) or the hold ends
            let _ = first_tx.send(Delivery::reply(first_tag, Ok(data.clone())));
            for (tx, tag) in waiters {
                let _ = tx.send(Delivery::reply(tag, Err(BackendError::Resend)));
            }
            return;
        }
        if !current {
            self.stats.raced.fetch_add(1, Ordering::Relaxed);
        } else if data.len() as u64 > self.cfg.max_entry_bytes {
            self.stats.too_big.fetch_add(1, Ordering::Relaxed);
        } else {
            let v = Variant {
                cmd: f.cmd,
                proto: f.proto,
                db: f.db,
                args: f.args,
                reply: data.clone(),
                filled: f.sent,
                fresh_until: f.sent + self.max_age,
                node_generation: f.snap.node,
                generation: f.snap.generation,
                pool: f.pool.clone(),
            };
            self.insert(f.key.clone(), v);
            // An invalidation that slipped in between the check and the insert must not
            // leave the entry behind: look again now that it is visible.
            if self.snap(&f.key, &f.pool) != f.snap {
                self.entries.invalidate(&f.key);
                self.stats.raced.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = first_tx.send(Delivery::reply(first_tag, Ok(data.clone())));
        for (tx, tag) in waiters {
            let result = if current { Ok(data.clone()) } else { Err(BackendError::Resend) };
            let _ = tx.send(Delivery::reply(tag, result));
        }
    }

    /// Caches `reply` for `cmd args...` on `key` as a fill read from `owner` just now would
    /// (for benchmarks and tests; the request path fills through [`HotCache::fill`]).
    pub fn prime(&self, key: &[u8], cmd: usize, proto: Proto, args: &[&[u8]], reply: Bytes, owner: &Arc<NodePool>) {
        let v = Variant {
            cmd,
            proto,
            db: 0,
            args: args.iter().map(|a| Bytes::copy_from_slice(a)).collect(),
            reply,
            filled: Instant::now(),
            fresh_until: Instant::now() + self.max_age,
            pool: owner.clone(),
            node_generation: owner.tracking.generation.load(Ordering::SeqCst),
            generation: self.generation.load(Ordering::SeqCst),
        };
        self.insert(Bytes::copy_from_slice(key), v);
    }

    /// Adds a variant to a key's entry (replacing the same variant, dropping stale ones).
    fn insert(&self, key: Bytes, v: Variant) {
        let mut variants: Vec<Variant> = Vec::new();
        if let Some(old) = self.entries.get(&key) {
            for o in &old.variants {
                let same = o.cmd == v.cmd && o.proto == v.proto && o.db == v.db && o.args == v.args;
                if !same && self.valid(o, &v.pool, v.filled) {
                    variants.push(Variant {
                        cmd: o.cmd,
                        proto: o.proto,
                        db: o.db,
                        args: o.args.clone(),
                        reply: o.reply.clone(),
                        filled: o.filled,
                        fresh_until: o.fresh_until,
                        pool: o.pool.clone(),
                        node_generation: o.node_generation,
                        generation: o.generation,
                    });
                }
            }
        }
        variants.push(v);
        // the key's TTL is the same for every variant (a new one is read with the fill)
        let expires_at = self
            .entries
            .get(&key)
            .filter(|e| e.held.load(Ordering::SeqCst) == 0)
            .map_or(0, |e| e.expires_at.load(Ordering::SeqCst));
        self.entries.insert(key, Arc::new(KeyEntry::new(variants, expires_at)));
    }

    /// Drops every cached reply of `key` and voids fills of it in flight. Redis's word
    /// that the key changed, at the end of its TTL, holds it instead if a `revalidate`
    /// rule covers it ([`HotCache::hold`]).
    pub fn invalidate(&self, key: &[u8], cause: Cause) {
        if cause == Cause::Tracking && !self.revalidate.is_empty() && self.hold(key) {
            return;
        }
        self.stripe(key).fetch_add(1, Ordering::SeqCst);
        self.entries.invalidate(key);
        self.stats.invalidations[cause as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A write of `key` is being sent: fills in flight and from now on are void, and its
    /// entry goes ([`HotCache::invalidate`]) unless it is held after its TTL ended: then
    /// the others keep its last value until the write's reply drops it (the write, a
    /// reload, is not acknowledged yet; its own client's reads wait for it).
    pub fn invalidate_sent(&self, key: &[u8]) {
        if !self.revalidate.is_empty() && self.entries.get(key).is_some_and(|e| e.held.load(Ordering::SeqCst) != 0) {
            self.stripe(key).fetch_add(1, Ordering::SeqCst);
            return;
        }
        self.invalidate(key, Cause::Write);
    }

    /// Stale-while-revalidate: `key`'s TTL ended in Redis (its invalidation came at the
    /// time heatshield learned it would), and a `revalidate` rule covers it: the entry
    /// stays, held, and answers every read but one, which goes to Redis; the hold ends
    /// with the rule's limit, with any other invalidation (a write anywhere: the refresh
    /// read is tracked), or when the refresh finds a value.
    fn hold(&self, key: &[u8]) -> bool {
        let Some(e) = self.entries.get(key) else { return false };
        let expires = e.expires_at.load(Ordering::SeqCst);
        let now = crate::upstream::backend::clock_ms(Instant::now());
        if e.held.load(Ordering::SeqCst) != 0 || expires == 0 || now + EXPIRY_SLACK_MS < expires {
            return false;
        }
        if self.rule_limit(&self.revalidate, key).is_none() {
            return false;
        }
        // (fills in flight read the key before it expired: void)
        self.stripe(key).fetch_add(1, Ordering::SeqCst);
        e.held.store(now, Ordering::SeqCst);
        self.stats.held.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Drops everything.
    pub fn flush(&self, cause: Cause) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.entries.invalidate_all();
        self.stats.invalidations[cause as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Drops everything read from `pool`: its invalidations may have been lost
    /// ([`Cause::Connection`]: what was read from it may still answer as a stale value,
    /// see [`HotCache::lookup_stale`]), or everything there may have changed (any other
    /// cause: void).
    pub fn drop_node(&self, pool: &NodePool, cause: Cause) {
        match cause {
            Cause::Connection => pool.tracking.lost(),
            _ => pool.tracking.void(),
        }
        self.stats.invalidations[cause as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Ends a detection window: republishes the hot set and drops keys that cooled.
    pub fn roll(&self, elapsed: Duration) {
        let (changes, set) = {
            let mut d = self.detector.lock();
            d.note_samples(self.sampled.swap(0, Ordering::Relaxed));
            let changes = d.roll(elapsed);
            self.door.1.store(d.period(), Ordering::Relaxed);
            self.door.0.store(d.window(), Ordering::Relaxed);
            let set: HotSet = d
                .hot()
                .map(|(k, st)| {
                    let cacheable = !self.matches(&self.never, k);
                    (Bytes::copy_from_slice(k), HotInfo { rate: st.rate, cacheable })
                })
                .collect();
            (changes, set)
        };
        // A key entering the hot set voids fills that started before it left it last time.
        for k in &changes.became_hot {
            self.stripe(k).fetch_add(1, Ordering::SeqCst);
        }
        self.hot_count.store(set.len(), Ordering::Relaxed);
        self.hot.store(Arc::new(set));
        if !changes.became_hot.is_empty() {
            self.hot_generation.fetch_add(1, Ordering::SeqCst);
        }
        for k in &changes.cooled {
            if !self.pins.is_empty() && self.tracked(k) {
                continue; // still pinned
            }
            self.invalidate(k, Cause::Cooled);
        }
    }

    /// Hot keys by estimated rate, highest first, with whether a reply of each is cached.
    pub fn hot_keys(&self, n: usize) -> Vec<(Bytes, f64, bool)> {
        let set = self.hot.load();
        let mut v: Vec<(Bytes, f64, bool)> =
            set.iter().map(|(k, h)| (k.clone(), h.rate, self.entries.contains_key(&k[..]))).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Entries (keys) and weighted bytes now.
    pub fn usage(&self) -> (u64, u64) {
        self.entries.run_pending_tasks();
        (self.entries.entry_count(), self.entries.weighted_size())
    }

    /// Changes whenever keys become hot. A write sent while none of its keys was hot, and
    /// answered after this changed, may have raced a fill of a key that turned hot in
    /// between: its keys are dropped before its reply is passed on.
    #[inline]
    pub fn hot_generation(&self) -> u64 {
        self.hot_generation.load(Ordering::SeqCst)
    }

    /// Publishes the cache's counters and gauges (called periodically).
    pub fn publish_metrics(&self) {
        use metrics::{counter, gauge};
        let st = &self.stats;
        counter!("heatshield_cache_hits_total").absolute(st.hits.load(Ordering::Relaxed));
        counter!("heatshield_cache_misses_total").absolute(st.misses.load(Ordering::Relaxed));
        counter!("heatshield_cache_fills_total").absolute(st.fills.load(Ordering::Relaxed));
        counter!("heatshield_cache_fills_coalesced_total").absolute(st.coalesced.load(Ordering::Relaxed));
        counter!("heatshield_cache_fills_discarded_total", "reason" => "raced")
            .absolute(st.raced.load(Ordering::Relaxed));
        counter!("heatshield_cache_fills_discarded_total", "reason" => "too_big")
            .absolute(st.too_big.load(Ordering::Relaxed));
        for (i, cause) in CAUSES.iter().enumerate() {
            counter!("heatshield_cache_invalidations_total", "cause" => *cause)
                .absolute(st.invalidations[i].load(Ordering::Relaxed));
        }
        counter!("heatshield_cache_stale_answers_total", "rule" => "stale_if_error")
            .absolute(st.stale.load(Ordering::Relaxed));
        counter!("heatshield_cache_stale_answers_total", "rule" => "revalidate")
            .absolute(st.revalidated.load(Ordering::Relaxed));
        let (entries, bytes) = self.usage();
        gauge!("heatshield_cache_hot_keys").set(self.hot_count() as f64);
        gauge!("heatshield_cache_entries").set(entries as f64);
        gauge!("heatshield_cache_bytes").set(bytes as f64);
    }

    /// Hot keys now.
    pub fn hot_count(&self) -> usize {
        self.hot_count.load(Ordering::Relaxed)
    }

    /// Drops every cached reply (PROXY CACHE FLUSH); hot keys stay hot.
    pub fn admin_flush(&self) {
        self.flush(Cause::Flush);
    }

    /// Fills in flight.
    pub fn fills_in_flight(&self) -> usize {
        self.fills.lock().by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_commands_are_cacheable_and_bad_ones_named() {
        let t = CommandTable::new();
        assert!(CacheConfig::default().validate(&t).is_empty());
        let cfg = CacheConfig {
            commands: vec!["SET".into(), "TTL".into(), "NOPE".into(), "MGET".into()],
            ..Default::default()
        };
        let p = cfg.validate(&t);
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[0].contains("'SET' is not a read-only command"), "{p:?}");
        assert!(p[1].contains("'TTL' has a reply that changes"), "{p:?}");
        assert!(p[2].contains("'NOPE' is not a known command"), "{p:?}");
        assert!(p[3].contains("'MGET' does not take its key"), "{p:?}");
    }
}
