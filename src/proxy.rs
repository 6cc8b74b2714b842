//! The request path: for one parsed request, decide what happens (answer locally, forward,
//! split, fan out), send the parts to the backends, and when their replies come back act
//! on redirections and retries and merge them into the one reply a single Redis would give.
//!
//! [`Proxy`] is the shared context (config, command table, cluster view, counters).
//! [`Pending`] is the state of one request waiting for backend replies; it lives in the
//! session's reply queue, so nothing here spawns a task per request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use smallvec::{SmallVec, smallvec};

use crate::backend::{BackendError, BackendReply, BackendRequest, Prefix, ReplyTx, Tag};
use crate::client::ClientState;
use crate::cluster::{Cluster, NodePool, slot};
use crate::command::{Command, CommandTable, FanOut, Split, keys_of};
use crate::config::Config;
use crate::errors;
use crate::protocol::reply::{Redirect, Value, error_text, parse_redirect, reply_len};
use crate::protocol::request::parse_i64;
use crate::protocol::{Proto, Request, Writer};

/// Redirections followed for one part before the error is passed to the client.
const MAX_REDIRECTS: u16 = 5;
/// Retries (100 ms apart) of a part whose node could not be reached or answered
/// TRYAGAIN / CLUSTERDOWN, e.g. while a failover promotes a replica.
const MAX_RETRIES: u16 = 50;
const RETRY_DELAY: Duration = Duration::from_millis(100);
/// What [`Proxy::reply_deadline`] adds to the command timeout.
pub const REPLY_GRACE: Duration = Duration::from_secs(10);
/// Bits of a proxy SCAN cursor that name the master.
const SCAN_NODE_BITS: u32 = 10;

/// Process-wide counters.
#[derive(Debug, Default)]
pub struct Stats {
    pub clients: AtomicUsize,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    pub commands: AtomicU64,
    pub next_client_id: AtomicU64,
    /// Reply bytes all clients hold above their `output_soft_bytes`.
    pub output_over_soft: AtomicU64,
}

/// Shared by every session.
pub struct Proxy {
    pub config: Config,
    pub commands: CommandTable,
    pub cluster: Arc<Cluster>,
    pub stats: Stats,
    pub started: Instant,
    /// `redis_version` of the backends, learned at start-up (reported by HELLO and INFO).
    pub redis_version: parking_lot::RwLock<String>,
    pub config_file: Option<String>,
    /// Number of worker threads.
    pub workers: usize,
    /// Settings that `PROXY CONFIG SET` may change.
    pub live: crate::config::Live,
    pub slowlog: crate::stats::SlowLog,
    pub bigkeys: crate::stats::BigKeys,
    /// Per-command statistics for INFO (per worker).
    pub command_stats: crate::stats::CommandStats,
    /// Per-command Prometheus handles.
    pub command_metrics: crate::metrics::CommandsMetrics,
    /// Per-key rate limits.
    pub ratelimit: crate::ratelimit::Limiter,
    /// Hot-key detection and cache.
    pub cache: Arc<crate::cache::HotCache>,
    /// Lock scripts, parked ACQUIREs and KEEPALIVE locks.
    pub locks: Arc<crate::locks::Locks>,
}

/// Builds the INFO reply from the requested sections and the masters' INFO texts.
pub type InfoBuilder = fn(&Proxy, &mut Ctx, &[String], &[&[u8]]) -> Bytes;

/// Where a part goes.
#[derive(Clone)]
enum Target {
    /// Whichever master owns the slot now.
    Slot(u16),
    /// This node (fan-out parts).
    Node(Arc<NodePool>),
    /// After an ASK: this node, with ASKING first.
    Ask(Arc<NodePool>),
}

struct Part {
    data: Bytes,
    target: Target,
    /// MOVED / ASK / NOSCRIPT followed so far (at most `MAX_REDIRECTS`).
    redirects: u16,
    /// Sends retried after an unreachable node, TRYAGAIN or CLUSTERDOWN (at most
    /// `MAX_RETRIES`): counted apart, so a request that waited out a failover may still
    /// follow the redirections that come after it.
    retries: u16,
    reply: Option<Bytes>,
    /// A redirection to an address the topology does not announce, held while a refresh
    /// confirms or refutes it (see [`Proxy::on_reply`]).
    held: Option<Box<Bytes>>,
}

/// How the parts' replies become one.
enum Merge {
    /// One part; its reply is the reply.
    Pass,
    /// Split MGET: for each part, the positions of its keys in the request.
    Mget {
        positions: Vec<SmallVec<[u32; 4]>>,
        total: usize,
        /// Keys answered from the hot-key cache: position and `GET` reply.
        cached: Vec<(u32, Bytes)>,
    },
    Mset,
    Sum,
    Keys,
    Scan {
        node: usize,
        nodes: usize,
    },
    RandomKey,
    Dbsize,
    AllSame,
    ScriptExists,
    Info {
        sections: Vec<String>,
        /// Builds INFO's text from the masters' replies (the caller's; this module does
        /// not know INFO's sections).
        build: InfoBuilder,
    },
    /// A lock script: its reply becomes the command's.
    Lock(Box<crate::locks::LockRequest>),
}

/// A request waiting for backend replies.
pub struct Pending {
    merge: Merge,
    parts: SmallVec<[Part; 1]>,
    remaining: u32,
    /// A MOVED or ASK was followed for some part.
    pub redirected: bool,
    /// Keys of a write whose cached replies are dropped (again) before its reply is passed on.
    invalidate: Vec<Bytes>,
    /// FLUSHALL / FLUSHDB: empty the cache before the reply is passed on.
    flush: bool,
    /// A write: the cache's hot generation when it was sent (see [`crate::cache::HotCache::hot_generation`]).
    write_hot_generation: Option<u64>,
}

impl Pending {
    /// The node serving the first part now (for the slow log; computed only when needed).
    pub fn node(&self, cluster: &Cluster) -> Option<Arc<str>> {
        match &self.parts.first()?.target {
            Target::Slot(s) => cluster.topology().master_for_slot(*s).map(|n| n.addr.clone()),
            Target::Node(n) | Target::Ask(n) => Some(n.addr.clone()),
        }
    }
}

/// What dispatching a request produced.
pub enum Outcome {
    /// The reply is known now.
    Ready(Bytes),
    /// Parts were sent; replies will come through the session's channel.
    Waiting(Pending),
}

/// Context a session passes with each call.
pub struct Ctx<'a> {
    pub client: &'a mut ClientState,
    pub seq: u64,
    pub reply_to: &'a ReplyTx,
    pub scratch: &'a mut BytesMut,
    /// Set by [`Proxy::dispatch`]: the command's id (for statistics).
    pub cmd: usize,
    /// When the request had been read (saves clock reads on the request path).
    pub now: Instant,
    /// Set by [`Proxy::dispatch`]: the reply came from the hot-key cache.
    pub cached: bool,
    /// Set by [`Proxy::dispatch`]: hot keys a write will change (see [`Pending`]).
    pub invalidate: Vec<Bytes>,
    /// Set by [`Proxy::dispatch`]: the request empties the databases.
    pub flush: bool,
    /// Set by [`Proxy::dispatch`] for writes while the cache is on (see [`Pending`]).
    pub write_hot_generation: Option<u64>,
    /// Set by [`Proxy::dispatch`]: milliseconds the request may wait on purpose
    /// (LOCK.ACQUIRE ... WAIT), on top of [`Proxy::reply_deadline`].
    pub wait_ms: u32,
}

impl<'a> Ctx<'a> {
    pub fn new(
        client: &'a mut ClientState,
        seq: u64,
        reply_to: &'a ReplyTx,
        scratch: &'a mut BytesMut,
        now: Instant,
    ) -> Ctx<'a> {
        Ctx {
            client,
            seq,
            reply_to,
            scratch,
            cmd: 0,
            now,
            cached: false,
            invalidate: Vec::new(),
            flush: false,
            write_hot_generation: None,
            wait_ms: 0,
        }
    }
}

/// What statistics need of a reply once it has been written (the reply itself is gone).
#[derive(Debug, Clone, Copy)]
pub struct ReplySummary {
    pub len: usize,
    /// An error reply.
    pub failed: bool,
    /// Refused by the rate limiter.
    pub throttled: bool,
}

/// One answered command, as the session reports it once the reply has been written.
pub struct Answered<'a> {
    /// Command id (statistics).
    pub cmd: usize,
    /// From the request being read to its reply being written.
    pub took: Duration,
    pub reply: ReplySummary,
    /// A MOVED or ASK was followed for it.
    pub redirected: bool,
    /// Answered from the hot-key cache.
    pub cached: bool,
    /// The request's bytes (for the slow log and the big-key log).
    pub raw: Option<&'a Bytes>,
    /// The node that served it, when it was noted.
    pub node: Option<&'a str>,
    pub stages: crate::stats::Stages,
}

impl ReplySummary {
    pub fn of(reply: &[u8]) -> ReplySummary {
        ReplySummary {
            len: reply.len(),
            failed: matches!(reply.first(), Some(b'-' | b'!')),
            throttled: reply.starts_with(b"-THROTTLED "),
        }
    }
}

impl Ctx<'_> {
    /// Builds a reply with a [`Writer`] in the client's protocol.
    pub fn reply(&mut self, f: impl FnOnce(&mut Writer)) -> Outcome {
        let mut w = Writer::new(self.scratch, self.client.proto);
        f(&mut w);
        Outcome::Ready(self.scratch.split().freeze())
    }

    pub fn error(&mut self, e: &str) -> Outcome {
        self.reply(|w| w.error(e))
    }
}

impl Proxy {
    pub fn new(config: Config, cluster: Arc<Cluster>, config_file: Option<String>, workers: usize) -> Proxy {
        let commands = CommandTable::new();
        // validated with the configuration, so compiling cannot fail here
        let rules = crate::ratelimit::compile(&config.ratelimit.rules, &commands).unwrap_or_default();
        let ratelimit = crate::ratelimit::Limiter::new(
            rules,
            config.ratelimit.max_tracked_keys,
            Duration::from_millis(config.ratelimit.idle_reclaim_ms),
        );
        // one extra id for requests that match no command
        let ids = commands.count() + 1;
        let cache = Arc::new(crate::cache::HotCache::new(&config.cache, &commands));
        Proxy {
            cache,
            locks: Arc::default(),
            live: crate::config::Live::new(&config),
            ratelimit,
            command_stats: crate::stats::CommandStats::new(workers, ids),
            command_metrics: crate::metrics::CommandsMetrics::new(ids),
            slowlog: Default::default(),
            bigkeys: Default::default(),
            workers,
            config,
            commands,
            cluster,
            stats: Stats::default(),
            started: Instant::now(),
            redis_version: parking_lot::RwLock::new("7.0.0".into()),
            config_file,
        }
    }

    /// How long after it was read a request is answered at the latest: its node's
    /// `command_timeout_ms` plus the window in which a failed part is retried
    /// (`MAX_RETRIES` × `RETRY_DELAY`) and a redirection confirmed. A request still
    /// waiting then is answered with [`errors::expired`](crate::errors::expired).
    pub fn reply_deadline(&self) -> Duration {
        Duration::from_millis(self.config.backend.command_timeout_ms) + REPLY_GRACE
    }

    /// The id used for requests that match no command.
    pub fn unknown_id(&self) -> usize {
        self.commands.count()
    }

    /// The metric/statistics name of command `id`.
    pub fn command_name(&self, id: usize) -> &str {
        if id < self.commands.count() { self.commands.name_of(id) } else { "unknown" }
    }

    /// Records one answered command (called when its reply has been written).
    pub fn observe(&self, client: &ClientState, a: Answered) {
        let Answered { cmd, took, reply, redirected, cached, raw, node, stages } = a;
        let failed = reply.failed;
        let outcome = if reply.throttled {
            crate::metrics::CommandOutcome::Throttled
        } else if cached {
            crate::metrics::CommandOutcome::Cached
        } else if failed {
            crate::metrics::CommandOutcome::Error
        } else if redirected {
            crate::metrics::CommandOutcome::Redirected
        } else {
            crate::metrics::CommandOutcome::Ok
        };
        let timed = crate::metrics::sampled(0, self.config.metrics.latency_sample_every);
        self.command_metrics.get(cmd, self.command_name(cmd)).record(outcome, took, timed);
        self.command_stats.record(crate::worker::current(), cmd, took, failed);
        let Some(raw) = raw else { return };
        if took.as_micros() as u64 >= self.live.slowlog_slower_than_us.load(Ordering::Relaxed) {
            let name = client.name.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
            self.slowlog.record(
                self.live.slowlog_max_len.load(Ordering::Relaxed),
                took,
                raw,
                &client.addr,
                &name,
                node.unwrap_or(""),
                stages,
            );
        }
        let big = self.live.bigkey_bytes.load(Ordering::Relaxed);
        if raw.len() as u64 >= big || reply.len as u64 >= big {
            let args = crate::stats::args_of(raw);
            if let Some(key) = self.first_key(&args) {
                let name = self.command_name(cmd);
                let max = self.config.admin.bigkeys_max_len;
                if raw.len() as u64 >= big {
                    self.bigkeys.record(max, &key, name, "request", raw.len() as u64);
                }
                if reply.len as u64 >= big {
                    self.bigkeys.record(max, &key, name, "reply", reply.len as u64);
                }
            }
        }
    }

    /// The first key of a request given as arguments (for the big-key log).
    fn first_key(&self, args: &[Bytes]) -> Option<Bytes> {
        let req = Request::from_args(args);
        let cmd = self.commands.lookup(&req).ok()?;
        let k = *keys_of(cmd, &req).ok()?.first()?;
        Some(req.arg_bytes(k as usize))
    }

    /// A keyless command for any master: the one the client's id picks, so one client's
    /// keyless commands go to one master.
    pub(crate) fn any_master(&self, ctx: &mut Ctx, req: Request) -> Outcome {
        let topo = self.cluster.topology();
        let Some(node) = topo.masters.get((ctx.client.id % topo.masters.len().max(1) as u64) as usize) else {
            return ctx.error(errors::NO_SLOT_MAP);
        };
        let node = node.clone();
        drop(topo);
        self.start(ctx, Merge::Pass, smallvec![Part::new(req.raw().clone(), Target::Node(node))])
    }

    /// Sends a command to the master owning its keys (all in one slot).
    /// The rate limits (docs/ratelimit.md) for these keys of one command: the `-THROTTLED`
    /// reply when one is over budget. `cached`: answered from the hot-key cache.
    fn throttle<'k>(
        &self,
        ctx: &mut Ctx,
        cmd: &Command,
        keys: impl Iterator<Item = &'k [u8]>,
        cached: bool,
    ) -> Option<Outcome> {
        let t = self.ratelimit.check_in(&mut ctx.client.rl, cmd, keys, ctx.now, cached).err()?;
        Some(ctx.error(&t.message()))
    }

    pub(crate) fn forward(&self, ctx: &mut Ctx, cmd: &Command, req: Request) -> Outcome {
        if matches!(cmd.name.as_str(), "XREAD" | "XREADGROUP") && req.args().any(|a| a.eq_ignore_ascii_case(b"BLOCK")) {
            return ctx.error(&errors::blocking_unsupported(&cmd.name));
        }
        let keys = match keys_of(cmd, &req) {
            Ok(k) => k,
            Err(e) => return ctx.error(e),
        };
        if self.cache.enabled
            && let Some(&k0) = keys.first()
        {
            if cmd.is_readonly() {
                let key = req.arg(k0 as usize);
                self.cache.sample(key);
                // Only a client with nothing in flight may be answered out of band: its
                // earlier commands (a write to this key, say) must have been applied.
                if keys.len() == 1
                    && ctx.client.inflight == 0
                    && self.cache.active()
                    && self.cache.is_cacheable(cmd)
                    && self.cache.tracked(key)
                {
                    return self.cached_read(ctx, cmd, &req, k0 as usize);
                }
            } else if cmd.is_write() {
                ctx.write_hot_generation = Some(self.cache.hot_generation());
                if self.cache.active() {
                    self.note_writes(ctx, keys.iter().map(|&k| (&req, k as usize)));
                }
            }
        }
        if let Some(o) = self.throttle(ctx, cmd, keys.iter().map(|&k| req.arg(k as usize)), false) {
            return o;
        }
        let target = match keys.first() {
            None => {
                let topo = self.cluster.topology();
                match topo.masters.get((ctx.client.id % topo.masters.len().max(1) as u64) as usize) {
                    Some(n) => Target::Node(n.clone()),
                    None => return ctx.error(errors::NO_SLOT_MAP),
                }
            }
            Some(&k0) => {
                let s = slot(req.arg(k0 as usize));
                if self.cluster.is_cluster() && keys[1..].iter().any(|&k| slot(req.arg(k as usize)) != s) {
                    return ctx.error(errors::CROSSSLOT);
                }
                Target::Slot(s)
            }
        };
        self.start(ctx, Merge::Pass, smallvec![Part::new(req.raw().clone(), target)])
    }

    /// LOCK.ACQUIRE / RELEASE / EXTEND / INFO (crate::locks).
    pub(crate) fn lock_command(
        &self,
        ctx: &mut Ctx,
        cmd: &Command,
        req: Request,
        kind: crate::locks::LockCmd,
    ) -> Outcome {
        use crate::locks::{LockCmd, Waiter};
        let r = match crate::locks::parse(kind, &cmd.lower, &req) {
            Ok(r) => r,
            Err(e) => return ctx.error(&e),
        };
        if let Some(o) = self.throttle(ctx, cmd, std::iter::once(&r.key[..]), false) {
            return o;
        }
        if kind != LockCmd::Info && self.cache.enabled {
            ctx.write_hot_generation = Some(self.cache.hot_generation());
            if self.cache.active() {
                self.note_writes(ctx, std::iter::once((&req, 1)));
            }
        }
        let s = slot(&r.key);
        if kind == LockCmd::Acquire && r.wait_ms > 0 {
            ctx.wait_ms = r.wait_ms.min(u32::MAX as u64) as u32;
            let deadline = ctx.now + Duration::from_millis(r.wait_ms);
            let w = Waiter {
                req: r,
                client: ctx.client.id,
                proto: ctx.client.proto,
                reply_to: ctx.reply_to.clone(),
                tag: Tag { seq: ctx.seq, part: 0 },
                deadline,
            };
            ctx.client.used_locks = true;
            ctx.client.keepalive_locks |= w.req.keepalive;
            if !self.locks.park(w) {
                return ctx.error(errors::LOCK_SERVICE_DOWN);
            }
            return Outcome::Waiting(Pending {
                merge: Merge::Pass,
                parts: smallvec![Part::new(req.raw().clone(), Target::Slot(s))],
                remaining: 1,
                redirected: false,
                invalidate: std::mem::take(&mut ctx.invalidate),
                flush: false,
                write_hot_generation: ctx.write_hot_generation.take(),
            });
        }
        let data = self.locks.command(&r, false, false).raw().clone();
        self.start(ctx, Merge::Lock(Box::new(r)), smallvec![Part::new(data, Target::Slot(s))])
    }

    /// A cacheable read of a hot key: answered from the cache, or sent as a fill (or, when
    /// the node's invalidations are not flowing, sent as usual).
    fn cached_read(&self, ctx: &mut Ctx, cmd: &Command, req: &Request, k: usize) -> Outcome {
        let key = req.arg(k);
        let s = slot(key);
        let Some(owner) = self.cluster.topology().master_for_slot(s).cloned() else {
            return ctx.error(&errors::slot_not_served(s));
        };
        let proto = ctx.client.proto;
        if let Some(reply) = self.cache.lookup(cmd.id, proto, req, key, &owner) {
            if let Some(o) = self.throttle(ctx, cmd, std::iter::once(key), true) {
                return o;
            }
            ctx.cached = true;
            return Outcome::Ready(reply);
        }
        // a miss reaches Redis: the limits apply as to any read
        if let Some(o) = self.throttle(ctx, cmd, std::iter::once(key), false) {
            return o;
        }
        let part = Part::new(req.raw().clone(), Target::Slot(s));
        let tag = Tag { seq: ctx.seq, part: 0 };
        let conn = owner.conn(proto, ctx.client.id);
        if self.cache.fill(cmd.id, proto, req, key, &owner, conn, ctx.reply_to, tag) {
            return Outcome::Waiting(Pending {
                merge: Merge::Pass,
                parts: smallvec![part],
                remaining: 1,
                redirected: false,
                invalidate: Vec::new(),
                flush: false,
                write_hot_generation: None,
            });
        }
        self.start(ctx, Merge::Pass, smallvec![part])
    }

    /// Drops the cached replies of the hot keys of a command given as its RESP bytes (the
    /// rare path of [`Pending::write_hot_generation`]).
    fn invalidate_keys_of(&self, data: &Bytes) {
        let Some(req) = Request::parse(data) else { return };
        if let Ok(cmd) = self.commands.lookup(&req)
            && let Ok(keys) = keys_of(cmd, &req)
        {
            for k in keys {
                let key = req.arg(k as usize);
                if self.cache.tracked(key) {
                    self.cache.invalidate(key, crate::cache::Cause::Write);
                }
            }
        }
    }

    /// A write to keys that may be cached: drop them now (so no fill started from here on
    /// is kept) and again when the write's reply comes (see [`Pending::invalidate`]).
    fn note_writes<'r>(&self, ctx: &mut Ctx, keys: impl Iterator<Item = (&'r Request, usize)>) {
        for (req, k) in keys {
            let key = req.arg(k);
            if self.cache.tracked(key) {
                self.cache.invalidate(key, crate::cache::Cause::Write);
                ctx.invalidate.push(req.arg_bytes(k));
            }
        }
    }

    /// MGET / MSET / DEL-like: forwarded whole when one slot holds every key, else split by slot.
    pub(crate) fn split(&self, ctx: &mut Ctx, cmd: &Command, req: Request, kind: Split) -> Outcome {
        let step = if kind == Split::Mset { 2 } else { 1 };
        if kind == Split::Mset && !(req.argc() - 1).is_multiple_of(2) {
            return ctx.error(&errors::wrong_arity(&cmd.lower));
        }
        let nkeys = (req.argc() - 1) / step;
        if self.cache.enabled {
            if kind == Split::Mget {
                for i in 0..nkeys {
                    self.cache.sample(req.arg(1 + i));
                }
                if ctx.client.inflight == 0 && self.cache.active() {
                    return self.cached_mget(ctx, cmd, req);
                }
            } else if cmd.is_readonly() {
                let key = req.arg(1);
                self.cache.sample(key);
                if nkeys == 1
                    && ctx.client.inflight == 0
                    && self.cache.active()
                    && self.cache.is_cacheable(cmd)
                    && self.cache.tracked(key)
                {
                    return self.cached_read(ctx, cmd, &req, 1);
                }
            } else if cmd.is_write() {
                ctx.write_hot_generation = Some(self.cache.hot_generation());
                if self.cache.active() {
                    self.note_writes(ctx, (0..nkeys).map(|i| (&req, 1 + i * step)));
                }
            }
        }
        if let Some(o) = self.throttle(ctx, cmd, (0..nkeys).map(|i| req.arg(1 + i * step)), false) {
            return o;
        }
        let s0 = slot(req.arg(1));
        let one_slot = !self.cluster.is_cluster() || (1..nkeys).all(|i| slot(req.arg(1 + i * step)) == s0);
        if one_slot {
            return self.start(ctx, Merge::Pass, smallvec![Part::new(req.raw().clone(), Target::Slot(s0))]);
        }
        let mut parts: SmallVec<[Part; 1]> = SmallVec::new();
        let mut positions: Vec<SmallVec<[u32; 4]>> = Vec::new();
        for group in split_by_slot(&req, step) {
            parts.push(Part::new(group.data, Target::Slot(group.slot)));
            positions.push(group.positions);
        }
        let merge = match kind {
            Split::Mget => Merge::Mget { positions, total: nkeys, cached: Vec::new() },
            Split::Mset => Merge::Mset,
            Split::Sum => Merge::Sum,
        };
        self.start(ctx, merge, parts)
    }

    /// MGET while keys are hot: hot keys come from the cache, the rest from Redis.
    fn cached_mget(&self, ctx: &mut Ctx, cmd: &Command, req: Request) -> Outcome {
        let nkeys = req.argc() - 1;
        let proto = ctx.client.proto;
        let mut cached: Vec<(u32, Bytes)> = Vec::new();
        {
            let topo = self.cluster.topology();
            for i in 0..nkeys {
                let key = req.arg(1 + i);
                if self.cache.tracked(key)
                    && let Some(owner) = topo.master_for_slot(slot(key))
                    && let Some(r) = self.cache.lookup_get(proto, key, owner)
                {
                    cached.push((i as u32, r));
                }
            }
        }
        let is_cached = |i: usize| cached.iter().any(|(p, _)| *p as usize == i);
        let rest: Vec<usize> = (0..nkeys).filter(|&i| !is_cached(i)).collect();
        // one check for all the keys, cached or not: all charged, or none
        let keys = (0..nkeys).map(|i| (req.arg(1 + i), is_cached(i)));
        if let Err(t) = self.ratelimit.check_mixed(&mut ctx.client.rl, cmd, keys, ctx.now) {
            return ctx.error(&t.message());
        }
        if cached.is_empty() {
            // nothing from the cache: the usual path (one slot: forwarded whole)
            let s0 = slot(req.arg(1));
            if !self.cluster.is_cluster() || (2..=nkeys).all(|i| slot(req.arg(i)) == s0) {
                return self.start(ctx, Merge::Pass, smallvec![Part::new(req.raw().clone(), Target::Slot(s0))]);
            }
        }
        ctx.cached = rest.is_empty();
        let sub = if cached.is_empty() {
            req
        } else {
            let mut args: Vec<&[u8]> = vec![req.arg(0)];
            args.extend(rest.iter().map(|&i| req.arg(1 + i)));
            Request::from_args(&args)
        };
        let mut parts: SmallVec<[Part; 1]> = SmallVec::new();
        let mut positions: Vec<SmallVec<[u32; 4]>> = Vec::new();
        if !rest.is_empty() {
            for group in split_by_slot(&sub, 1) {
                parts.push(Part::new(group.data, Target::Slot(group.slot)));
                positions.push(group.positions.iter().map(|&p| rest[p as usize] as u32).collect());
            }
        }
        self.start(ctx, Merge::Mget { positions, total: nkeys, cached }, parts)
    }

    /// Commands that go to every master (or, for SCAN, the master the cursor names).
    pub(crate) fn fan_out(&self, ctx: &mut Ctx, cmd: &Command, req: Request, kind: FanOut) -> Outcome {
        let topo = self.cluster.topology();
        if topo.masters.is_empty() {
            return ctx.error(errors::NO_SLOT_MAP);
        }
        let all = |data: &Bytes| -> SmallVec<[Part; 1]> {
            topo.masters.iter().map(|n| Part::new(data.clone(), Target::Node(n.clone()))).collect()
        };
        let (merge, parts) = match kind {
            FanOut::Keys => (Merge::Keys, all(req.raw())),
            FanOut::RandomKey => (Merge::RandomKey, all(req.raw())),
            FanOut::Dbsize => (Merge::Dbsize, all(req.raw())),
            FanOut::AllSame => (Merge::AllSame, all(req.raw())),
            FanOut::ScriptExists => (Merge::ScriptExists, all(req.raw())),
            FanOut::Flush => {
                if !self.live.allow_flush.load(Ordering::Relaxed) {
                    return ctx.error(&errors::flush_disabled(&cmd.name));
                }
                ctx.flush = true;
                (Merge::AllSame, all(req.raw()))
            }
            FanOut::Scan => {
                let Some(cursor) = std::str::from_utf8(req.arg(1)).ok().and_then(|s| s.parse::<u64>().ok()) else {
                    return ctx.error(errors::INVALID_CURSOR);
                };
                let node = (cursor & ((1 << SCAN_NODE_BITS) - 1)) as usize;
                if node >= topo.masters.len() {
                    return ctx.error(errors::INVALID_CURSOR);
                }
                let backend_cursor = (cursor >> SCAN_NODE_BITS).to_string();
                let mut args: Vec<&[u8]> = req.args().collect();
                args[1] = backend_cursor.as_bytes();
                let data = Request::from_args(&args).raw().clone();
                let nodes = topo.masters.len();
                (Merge::Scan { node, nodes }, smallvec![Part::new(data, Target::Node(topo.masters[node].clone()))])
            }
        };
        drop(topo);
        self.start(ctx, merge, parts)
    }

    /// Sends INFO to every master and builds the proxy's INFO from the replies.
    pub(crate) fn info_fan_out(&self, ctx: &mut Ctx, sections: Vec<String>, build: InfoBuilder) -> Outcome {
        let topo = self.cluster.topology();
        let data = Request::from_args(&["INFO", "server", "keyspace"]).raw().clone();
        let parts: SmallVec<[Part; 1]> =
            topo.masters.iter().map(|n| Part::new(data.clone(), Target::Node(n.clone()))).collect();
        drop(topo);
        if parts.is_empty() {
            return Outcome::Ready(build(self, ctx, &sections, &[]));
        }
        self.start(ctx, Merge::Info { sections, build }, parts)
    }

    fn start(&self, ctx: &mut Ctx, merge: Merge, parts: SmallVec<[Part; 1]>) -> Outcome {
        let mut p = Pending {
            remaining: parts.len() as u32,
            merge,
            parts,
            redirected: false,
            invalidate: std::mem::take(&mut ctx.invalidate),
            flush: std::mem::take(&mut ctx.flush),
            write_hot_generation: ctx.write_hot_generation.take(),
        };
        let n = p.parts.len();
        let mut i = 0;
        while i < n {
            let (node, asking) = match self.resolve(&p.parts[i].target) {
                Ok(t) => t,
                Err(e) => {
                    // not routable now (slot unserved): answer that part with the error at once
                    p.parts[i].reply = Some(e);
                    p.remaining -= 1;
                    i += 1;
                    continue;
                }
            };
            // Consecutive parts for the same node (a split command's slots of one master)
            // travel as one message; their replies still come back one per part.
            let mut j = i + 1;
            while j < n && !asking && self.resolve(&p.parts[j].target).is_ok_and(|(m, a)| !a && Arc::ptr_eq(&m, &node))
            {
                j += 1;
            }
            let data = if j - i == 1 {
                p.parts[i].data.clone()
            } else {
                let mut b = BytesMut::with_capacity(p.parts[i..j].iter().map(|x| x.data.len()).sum());
                for x in &p.parts[i..j] {
                    b.extend_from_slice(&x.data);
                }
                b.freeze()
            };
            node.conn(ctx.client.proto, ctx.client.id).send(BackendRequest {
                data,
                count: (j - i) as u32,
                prefix: if asking { Prefix::Asking } else { Prefix::None },
                tag: Tag { seq: ctx.seq, part: i as u32 },
                reply_to: ctx.reply_to.clone(),
            });
            i = j;
        }
        if p.remaining == 0 {
            return Outcome::Ready(self.finish(ctx, &mut p));
        }
        Outcome::Waiting(p)
    }

    /// The node a part goes to now, and whether ASKING must precede it; an error reply
    /// when its slot is not served.
    fn resolve(&self, target: &Target) -> Result<(Arc<NodePool>, bool), Bytes> {
        match target {
            Target::Slot(s) => match self.cluster.topology().master_for_slot(*s) {
                Some(n) => Ok((n.clone(), false)),
                None => Err(errors::resp(&errors::slot_not_served(*s))),
            },
            Target::Node(n) => Ok((n.clone(), false)),
            Target::Ask(n) => Ok((n.clone(), true)),
        }
    }

    /// Sends one part to its node now.
    fn send(&self, ctx: &Ctx, part: &Part, idx: u32) -> Result<(), Bytes> {
        let (node, asking) = self.resolve(&part.target)?;
        node.conn(ctx.client.proto, ctx.client.id).send(BackendRequest {
            data: part.data.clone(),
            count: 1,
            prefix: if asking { Prefix::Asking } else { Prefix::None },
            tag: Tag { seq: ctx.seq, part: idx },
            reply_to: ctx.reply_to.clone(),
        });
        Ok(())
    }

    /// Sends one part again after `RETRY_DELAY`, to whichever node owns its slot by then.
    fn send_later(&self, ctx: &Ctx, part: &Part, idx: u32) {
        let cluster = self.cluster.clone();
        let target = part.target.clone();
        let data = part.data.clone();
        let reply_to = ctx.reply_to.clone();
        let (proto, affinity) = (ctx.client.proto, ctx.client.id);
        let tag = Tag { seq: ctx.seq, part: idx };
        tokio::spawn(async move {
            tokio::time::sleep(RETRY_DELAY).await;
            let node = match &target {
                Target::Slot(s) => cluster.topology().master_for_slot(*s).cloned(),
                Target::Node(n) | Target::Ask(n) => Some(n.clone()),
            };
            match node {
                Some(n) => n.conn(proto, affinity).send(BackendRequest {
                    data,
                    count: 1,
                    prefix: if matches!(target, Target::Ask(_)) { Prefix::Asking } else { Prefix::None },
                    tag,
                    reply_to,
                }),
                None => {
                    let _ = reply_to
                        .send(BackendReply { tag, result: Err(BackendError::NotSent(Arc::from("unserved slot"))) });
                }
            }
        });
    }

    /// Points `part` at a redirection's target if the cluster announced that node (MOVED
    /// also patches the slot map); false, changing nothing, otherwise.
    fn follow(&self, part: &mut Part, r: &Redirect) -> bool {
        match r {
            Redirect::Moved { slot, addr } => {
                if !self.cluster.moved(*slot, addr) {
                    return false;
                }
                if let Target::Ask(_) | Target::Node(_) = part.target {
                    let Some(pool) = self.cluster.announced_pool(addr) else { return false };
                    part.target = Target::Node(pool);
                }
                crate::metrics::global().moved.increment(1);
            }
            Redirect::Ask { addr, .. } => {
                let Some(pool) = self.cluster.announced_pool(addr) else { return false };
                part.target = Target::Ask(pool);
                crate::metrics::global().ask.increment(1);
            }
        }
        true
    }

    /// Answers part `idx` with [`BackendError::Recheck`] once the topology has been
    /// refreshed (see [`Cluster::fresh_topology`]).
    fn recheck_later(&self, ctx: &Ctx, idx: u32) {
        let cluster = self.cluster.clone();
        let reply_to = ctx.reply_to.clone();
        let tag = Tag { seq: ctx.seq, part: idx };
        tokio::spawn(async move {
            cluster.fresh_topology().await;
            let _ = reply_to.send(BackendReply { tag, result: Err(BackendError::Recheck) });
        });
    }

    /// A backend reply for part `idx` of `p`. Returns the final reply once every part is in.
    pub fn on_reply(&self, ctx: &mut Ctx, p: &mut Pending, reply: BackendReply) -> Option<Bytes> {
        let idx = reply.tag.part as usize;
        let part = p.parts.get_mut(idx)?;
        if part.reply.is_some() {
            return None;
        }
        let data = match reply.result {
            Ok(data) => {
                // one of heatshield's lock scripts is not loaded there (yet): send it whole
                if data.starts_with(b"-NOSCRIPT")
                    && part.redirects < MAX_REDIRECTS
                    && let Some(eval) = self.locks.eval_form(&part.data)
                {
                    part.redirects += 1;
                    part.data = eval;
                    let part = &p.parts[idx];
                    if let Err(e) = self.send(ctx, part, idx as u32) {
                        return self.complete(ctx, p, idx, e);
                    }
                    return None;
                }
                if let Some(err) = error_text(&data)
                    && self.cluster.is_cluster()
                {
                    if let Some(r) = parse_redirect(err)
                        && part.redirects < MAX_REDIRECTS
                    {
                        part.redirects += 1;
                        if !self.follow(part, &r) {
                            // The address is not one the cluster announced (a script can
                            // return any error text): refresh the topology, then look again.
                            part.held = Some(Box::new(data));
                            self.recheck_later(ctx, idx as u32);
                            return None;
                        }
                        p.redirected = true;
                        let part = &p.parts[idx];
                        if let Err(e) = self.send(ctx, part, idx as u32) {
                            return self.complete(ctx, p, idx, e);
                        }
                        return None;
                    }
                    if (err.starts_with(b"TRYAGAIN") || err.starts_with(b"CLUSTERDOWN")) && part.retries < MAX_RETRIES {
                        part.retries += 1;
                        self.cluster.request_refresh();
                        let part = &p.parts[idx];
                        self.send_later(ctx, part, idx as u32);
                        return None;
                    }
                }
                data
            }
            Err(BackendError::Recheck) => {
                let held = *part.held.take()?;
                let redirect = error_text(&held).and_then(parse_redirect);
                if redirect.is_some_and(|r| self.follow(part, &r)) {
                    p.redirected = true;
                    let part = &p.parts[idx];
                    if let Err(e) = self.send(ctx, part, idx as u32) {
                        return self.complete(ctx, p, idx, e);
                    }
                    return None;
                }
                // Not confirmed: the client gets the reply as Redis sent it, and nothing
                // else changes.
                crate::metrics::global().redirect_refused.increment(1);
                tracing::warn!(
                    reply = %String::from_utf8_lossy(&held).trim_end(),
                    client = ctx.client.id,
                    "redirection to an address the cluster does not announce; passed to the client as it is"
                );
                held
            }
            Err(BackendError::Resend) => {
                // a shared cache fill could not answer for this request: send it ourselves
                let part = &p.parts[idx];
                if let Err(e) = self.send(ctx, part, idx as u32) {
                    return self.complete(ctx, p, idx, e);
                }
                return None;
            }
            Err(BackendError::NotSent(addr)) => {
                self.cluster.request_refresh();
                if matches!(part.target, Target::Slot(_)) && part.retries < MAX_RETRIES {
                    part.retries += 1;
                    let part = &p.parts[idx];
                    self.send_later(ctx, part, idx as u32);
                    return None;
                }
                tracing::warn!(node = %addr, command = self.command_name(ctx.cmd), client = ctx.client.id, "node unreachable; request failed");
                errors::resp(&errors::node_unreachable(&addr))
            }
            Err(e) => {
                self.cluster.request_refresh();
                tracing::warn!(error = %e, command = self.command_name(ctx.cmd), client = ctx.client.id, "backend request failed");
                errors::resp(&errors::backend_failed(&e))
            }
        };
        self.complete(ctx, p, idx, data)
    }

    fn complete(&self, ctx: &mut Ctx, p: &mut Pending, idx: usize, data: Bytes) -> Option<Bytes> {
        p.parts[idx].reply = Some(data);
        p.remaining -= 1;
        if p.remaining > 0 {
            return None;
        }
        // The write has happened: whatever was filled meanwhile must not outlive this
        // moment, which comes before its reply reaches the client.
        for k in p.invalidate.drain(..) {
            self.cache.invalidate(&k, crate::cache::Cause::Write);
        }
        if p.flush {
            self.cache.flush(crate::cache::Cause::Flush);
        }
        if let Some(e) = p.write_hot_generation
            && e != self.cache.hot_generation()
        {
            // keys turned hot while the write was out: it may have raced their first fill
            for part in &p.parts {
                self.invalidate_keys_of(&part.data);
            }
        }
        Some(self.finish(ctx, p))
    }

    /// Merges the replies of a finished request.
    fn finish(&self, ctx: &mut Ctx, p: &mut Pending) -> Bytes {
        if let Merge::Pass = p.merge {
            return p.parts[0].reply.take().unwrap_or_default();
        }
        if let Merge::Lock(r) = &p.merge {
            use crate::locks::LockCmd;
            let reply = p.parts[0].reply.take().unwrap_or_default();
            match (r.cmd, Value::parse(&reply)) {
                (LockCmd::Acquire, Ok((Value::Int(t), _))) if t > 0 && r.keepalive => {
                    ctx.client.used_locks = true;
                    ctx.client.keepalive_locks = true;
                    self.locks.acquired(ctx.client.id, r);
                }
                (LockCmd::Release, Ok((Value::Int(1), _))) => {
                    self.locks.released(ctx.client.id, &r.key, ctx.client.keepalive_locks)
                }
                _ => {}
            }
            return crate::locks::client_reply(r, &reply, ctx.client.proto, ctx.scratch);
        }
        let replies: Vec<Bytes> = p.parts.iter_mut().map(|x| x.reply.take().unwrap_or_default()).collect();
        // Any error among the parts is the answer (Redis would have failed the whole command).
        let first_error = replies.iter().find(|r| r.first() == Some(&b'-')).cloned();
        if let Merge::Info { sections, build } = &p.merge {
            let texts: Vec<&[u8]> =
                replies.iter().filter_map(|r| Value::parse(r).ok()).filter_map(|(v, _)| v.as_bytes()).collect();
            return build(self, ctx, sections, &texts);
        }
        if let Some(e) = first_error {
            return e;
        }
        let merged = merge_replies(&p.merge, &replies, ctx.client.proto, ctx.scratch);
        match merged {
            Ok(b) => b,
            Err(what) => {
                let mut w = Writer::new(ctx.scratch, ctx.client.proto);
                w.error(&errors::merge_failed(what));
                ctx.scratch.split().freeze()
            }
        }
    }
}

/// One slot's share of a split multi-key command.
pub struct SlotGroup {
    pub slot: u16,
    /// The command for this slot's keys (and values), in request order.
    pub data: Bytes,
    /// Positions (0-based, in keys) of this group's keys in the original request.
    pub positions: SmallVec<[u32; 4]>,
}

/// Splits a MGET/MSET/DEL-like request (`step` 2 for key/value pairs) into one command per
/// slot, keeping request order inside each.
pub fn split_by_slot(req: &Request, step: usize) -> Vec<SlotGroup> {
    use crate::protocol::request::{write_array_header, write_bulk};
    let nkeys = (req.argc() - 1) / step;
    let mut order: Vec<(u16, u32)> = (0..nkeys).map(|i| (slot(req.arg(1 + i * step)), i as u32)).collect();
    order.sort_by_key(|&(s, _)| s);
    let mut out = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let s = order[i].0;
        let j = i + order[i..].iter().take_while(|(x, _)| *x == s).count();
        let mut buf = BytesMut::with_capacity(16 + (j - i) * 32);
        write_array_header(&mut buf, 1 + (j - i) * step);
        write_bulk(&mut buf, req.arg(0));
        let mut positions = SmallVec::new();
        for &(_, k) in &order[i..j] {
            let a = 1 + k as usize * step;
            for arg in a..a + step {
                write_bulk(&mut buf, req.arg(arg));
            }
            positions.push(k);
        }
        out.push(SlotGroup { slot: s, data: buf.freeze(), positions });
        i = j;
    }
    out
}

/// Merges the array replies of a split MGET (one per [`SlotGroup`], in group order) and
/// the values answered from the cache into one array in request order. Elements are
/// copied as the bytes Redis sent.
pub fn merge_mget(
    replies: &[Bytes],
    groups: &[SmallVec<[u32; 4]>],
    total: usize,
    cached: &[(u32, Bytes)],
    out: &mut BytesMut,
) -> Result<(), &'static str> {
    let mut slots: Vec<&[u8]> = vec![&[]; total];
    for (p, v) in cached {
        slots[*p as usize] = v;
    }
    for (r, pos) in replies.iter().zip(groups) {
        let (n, elems) = array_elements(r)?;
        if n != pos.len() {
            return Err("MGET part returned the wrong number of values");
        }
        for (e, &p) in elems.into_iter().zip(pos.iter()) {
            slots[p as usize] = e;
        }
    }
    crate::protocol::request::write_array_header(out, total);
    for e in slots {
        out.extend_from_slice(e);
    }
    Ok(())
}

impl Part {
    fn new(data: Bytes, target: Target) -> Part {
        Part { data, target, redirects: 0, retries: 0, reply: None, held: None }
    }
}

/// The elements of an array reply, as raw byte slices.
fn array_elements(r: &[u8]) -> Result<(usize, Vec<&[u8]>), &'static str> {
    let nl = memchr::memchr(b'\n', r).ok_or("truncated")?;
    if !matches!(r.first(), Some(b'*' | b'~')) {
        return Err("expected an array");
    }
    let n = parse_i64(&r[1..nl - 1]).ok_or("bad array length")?;
    let mut pos = nl + 1;
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for _ in 0..n.max(0) {
        let len = reply_len(&r[pos..]).map_err(|e| e.0)?.ok_or("truncated element")?;
        out.push(&r[pos..pos + len]);
        pos += len;
    }
    Ok((n.max(0) as usize, out))
}

fn int_of(r: &[u8]) -> Result<i64, &'static str> {
    Value::parse(r).map_err(|e| e.0)?.0.as_int().ok_or("expected an integer")
}

/// Merges part replies (none of which is an error) into the reply for the client.
fn merge_replies(
    merge: &Merge,
    replies: &[Bytes],
    proto: Proto,
    scratch: &mut BytesMut,
) -> Result<Bytes, &'static str> {
    let mut w = Writer::new(scratch, proto);
    match merge {
        Merge::Pass | Merge::Info { .. } | Merge::Lock(_) => unreachable!("handled by finish"),
        Merge::Mget { positions, total, cached } => merge_mget(replies, positions, *total, cached, w.buf)?,
        Merge::Mset => w.ok(),
        Merge::Sum | Merge::Dbsize => {
            let mut sum = 0i64;
            for r in replies {
                sum += int_of(r)?;
            }
            w.int(sum);
        }
        Merge::Keys => {
            let mut all = Vec::new();
            for r in replies {
                all.extend(array_elements(r)?.1);
            }
            w.array(all.len());
            for e in all {
                w.raw(e);
            }
        }
        Merge::Scan { node, nodes } => {
            let (v, _) = Value::parse(&replies[0]).map_err(|e| e.0)?;
            let Value::Array(items) = v else {
                return Err("SCAN reply is not an array");
            };
            let (Some(c), Some(Value::Array(keys))) = (items.first().and_then(|c| c.as_bytes()), items.get(1)) else {
                return Err("SCAN reply has an unexpected shape");
            };
            let backend: u64 = std::str::from_utf8(c).ok().and_then(|s| s.parse().ok()).ok_or("bad SCAN cursor")?;
            let next = if backend != 0 {
                if backend >= 1 << (64 - SCAN_NODE_BITS) {
                    return Err("backend SCAN cursor too large");
                }
                (backend << SCAN_NODE_BITS) | *node as u64
            } else if node + 1 < *nodes {
                (node + 1) as u64
            } else {
                0
            };
            w.array(2);
            w.bulk(itoa::Buffer::new().format(next).as_bytes());
            w.array(keys.len());
            for k in keys {
                w.bulk(k.as_bytes().unwrap_or_default());
            }
        }
        Merge::RandomKey => {
            let found: Vec<&Bytes> =
                replies.iter().filter(|r| !matches!(Value::parse(r), Ok((Value::Nil, _)))).collect();
            if found.is_empty() {
                w.nil();
            } else {
                let pick = (std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .subsec_nanos() as usize)
                    % found.len();
                w.raw(found[pick]);
            }
        }
        Merge::AllSame => w.raw(&replies[0]),
        Merge::ScriptExists => {
            let mut acc: Vec<i64> = Vec::new();
            for (i, r) in replies.iter().enumerate() {
                let (v, _) = Value::parse(r).map_err(|e| e.0)?;
                let Value::Array(items) = v else {
                    return Err("SCRIPT EXISTS reply is not an array");
                };
                let vals: Vec<i64> = items.iter().map(|x| x.as_int().unwrap_or(0)).collect();
                if i == 0 {
                    acc = vals;
                } else {
                    for (a, b) in acc.iter_mut().zip(vals) {
                        *a = (*a != 0 && b != 0) as i64;
                    }
                }
            }
            w.array(acc.len());
            for a in acc {
                w.int(a);
            }
        }
    }
    Ok(scratch.split().freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &[u8]) -> Bytes {
        Bytes::copy_from_slice(s)
    }

    #[test]
    fn mget_merge_restores_order() {
        let m = Merge::Mget { positions: vec![smallvec![0, 2], smallvec![1]], total: 3, cached: vec![] };
        let replies = vec![b(b"*2\r\n$1\r\na\r\n$-1\r\n"), b(b"*1\r\n$1\r\nb\r\n")];
        let mut s = BytesMut::new();
        let out = merge_replies(&m, &replies, Proto::Resp2, &mut s).unwrap();
        assert_eq!(&out[..], b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n");
        let replies3 = vec![b(b"*2\r\n$1\r\na\r\n_\r\n"), b(b"*1\r\n$1\r\nb\r\n")];
        let out = merge_replies(&m, &replies3, Proto::Resp3, &mut s).unwrap();
        assert_eq!(&out[..], b"*3\r\n$1\r\na\r\n$1\r\nb\r\n_\r\n");
    }

    #[test]
    fn sums_and_keys() {
        let mut s = BytesMut::new();
        let out = merge_replies(&Merge::Sum, &[b(b":2\r\n"), b(b":3\r\n")], Proto::Resp2, &mut s).unwrap();
        assert_eq!(&out[..], b":5\r\n");
        let out = merge_replies(
            &Merge::Keys,
            &[b(b"*1\r\n$1\r\na\r\n"), b(b"*0\r\n"), b(b"*1\r\n$1\r\nb\r\n")],
            Proto::Resp2,
            &mut s,
        )
        .unwrap();
        assert_eq!(&out[..], b"*2\r\n$1\r\na\r\n$1\r\nb\r\n");
        let out = merge_replies(
            &Merge::ScriptExists,
            &[b(b"*2\r\n:1\r\n:1\r\n"), b(b"*2\r\n:1\r\n:0\r\n")],
            Proto::Resp2,
            &mut s,
        )
        .unwrap();
        assert_eq!(&out[..], b"*2\r\n:1\r\n:0\r\n");
    }

    #[test]
    fn scan_cursor_walks_nodes() {
        let mut s = BytesMut::new();
        let page = |node, nodes, r: &[u8], s: &mut BytesMut| {
            merge_replies(&Merge::Scan { node, nodes }, &[b(r)], Proto::Resp2, s).unwrap()
        };
        // backend has more: cursor keeps the node
        let out = page(1, 3, b"*2\r\n$2\r\n17\r\n*1\r\n$1\r\nk\r\n", &mut s);
        assert_eq!(
            &out[..],
            format!("*2\r\n${}\r\n{}\r\n*1\r\n$1\r\nk\r\n", ((17u64 << 10) | 1).to_string().len(), (17u64 << 10) | 1)
                .as_bytes()
        );
        // backend done: next node
        let out = page(1, 3, b"*2\r\n$1\r\n0\r\n*0\r\n", &mut s);
        assert_eq!(&out[..], b"*2\r\n$1\r\n2\r\n*0\r\n");
        // last node done: 0
        let out = page(2, 3, b"*2\r\n$1\r\n0\r\n*0\r\n", &mut s);
        assert_eq!(&out[..], b"*2\r\n$1\r\n0\r\n*0\r\n");
    }
}
