//! Pending: one request from dispatch until its reply.
//!
//! [`Ctx`] is the request's context, built once by the session and carried through
//! dispatch, the reply path and observation: the client, the request itself (its bytes
//! and where each argument is), the command, the time it was read, and what admission
//! decided about the cache. [`Outcome`] is what dispatch produced: a reply now, or a
//! [`Pending`] request waiting for backend replies.
//!
//! A [`Pending`] holds its parts (what goes where), sends them, and acts on each backend
//! reply as the reaction table of [`crate::upstream::retry`] says: follow a redirection
//! the cluster announced, hold one it did not until a refresh confirms it, retry after a
//! failover, or pass the reply on. When every part is in, the write's cache invalidation
//! is applied (before the client can see the reply) and the replies are merged
//! ([`crate::path::merge`]). It lives in the session's reply queue: nothing here spawns a
//! task per request (only a retry's delay and a redirection's recheck).
//!
//! Its rooms (a part's completion and its sending call each other: one request's life,
//! not layers): [`blocking`] (a blocking command's
//! timeout rules), [`send`] (how a part reaches a node, now, again or later), [`finish`]
//! (invalidation, then the merge), [`split`] (a multi-key part taken
//! key by key after TRYAGAIN), [`tx`] (a client's transaction as native transactions),
//! [`reply`] (a node's reply acted on).

mod blocking;
mod finish;
mod reply;
mod send;
mod split;
mod tx;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use crate::command::{Route, Split, TxCmd, keys_of};
use crate::conn::ClientState;
use crate::errors;
use crate::mailbox::{BackendReply, ReplyTx, Tag};
use crate::path::merge::{Merge, merge_replies};
use crate::protocol::reply::{Value, error_text};
use crate::protocol::{Request, Writer};
use crate::proxy::Proxy;
use crate::services::locks::LockRequest;
use crate::upstream::backend::{BackendRequest, ConnStats, Prefix};
use crate::upstream::cluster::{Cluster, Lease, NodePool, Topology, TopologyView};
use crate::upstream::retry::{self, Attempt, MAX_REDIRECTS, MAX_RETRIES, Step, Verdict};

pub use blocking::{BLOCKED, BLOCKED_TIMED, Block};
use finish::{assemble, complete};
pub use reply::{answer_as_is, on_reply, plain_reply, stale_answer};
use send::{follow, recheck_later, resend, resolve, resolve_in, send_later, send_part, void_watch};
use split::{per_key, piece_done, splittable};
use tx::on_transaction_reply;
pub use tx::{Tx, TxPart, TxReplies, start_transaction};

/// Builds the reply to a command every master answered (INFO, CONFIG) from each master's
/// address and reply, errors included, in the order of the masters.
pub type MastersBuilder = fn(&Proxy, &mut Ctx, &[(&str, &Bytes)]) -> Bytes;

/// One request's context (see the module comment).
pub struct Ctx<'a> {
    pub client: &'a mut ClientState,
    /// The request's place in the client's reply order.
    pub seq: u64,
    pub reply_to: &'a ReplyTx,
    pub scratch: &'a mut BytesMut,
    /// The request: its bytes and where each argument is (nothing is parsed twice), in
    /// the cluster's names (colocation's stored names, a script's shim).
    pub req: &'a Request,
    /// The request as the client sent it: `req` itself unless colocation renamed it.
    /// Admission (ACL, rate limits, read rules) and the records judge this one.
    pub asked: &'a Request,
    /// Set by dispatch: the command's id (statistics).
    pub cmd: usize,
    /// When the request had been read (saves clock reads on the request path).
    pub now: Instant,
    /// Set by admission: the argument that is the first key (0: none), for the big-key log.
    pub first_key: u32,
    /// Set by admission: which features' patterns may see some key of the request under
    /// the client's names ([`crate::glob::KeyFeatures`]; 0 without keys, and every bit,
    /// "look", before admission).
    pub facts: u8,
    /// Set by admission: the reply came from the hot-key cache.
    pub cached: bool,
    /// Set by admission: hot keys a write will change (see [`Pending`]).
    pub invalidate: Vec<Bytes>,
    /// Set by admission: what of the hot-key cache the reply drops beyond the request's
    /// keys (FLUSHALL: everything).
    pub flush: Drops,
    /// Set by admission for writes while the cache is on (see [`Pending`]).
    pub write_hot_generation: Option<u64>,
    /// Set by admission: milliseconds the request may wait on purpose (LOCK.ACQUIRE ...
    /// WAIT), on top of [`Proxy::reply_deadline`].
    pub wait_ms: u32,
    /// Set by dispatch: a write by a client with CLIENT TRACKING on, which is told of its
    /// keys once Redis answered.
    pub tracked_write: bool,
    /// Set by the subscription commands: their confirmations are written even under
    /// CLIENT REPLY OFF / SKIP, as Redis writes pub/sub pushes.
    pub pushing: bool,
    /// Set by the session: the reply being handed over waited behind an earlier request's
    /// retry ([`crate::conn::order`]), so a redirection in it may be out of date.
    pub behind_retry: bool,
    /// Set by dispatch: the way to Redis the request takes ([`crate::conn::order`]).
    pub lane: crate::conn::order::Lane,
    /// Set by dispatch: the command may write (not `readonly`): the nodes it is sent to
    /// are noted for WAIT ([`ClientState::wrote`]).
    pub writes: bool,
    /// Set by the session: its look at the slot map for the requests of one wake-up
    /// ([`Ctx::topology`]).
    pub topo: Option<&'a Topology>,
}

/// The slot map a request is routed by: the session's look for the requests of one
/// wake-up (a pipeline of 16 GETs took and gave back the thread's view 16 times, about
/// 90 instructions each), or a look of its own.
pub enum TopoRef<'a> {
    Held(&'a Topology),
    Own(TopologyView),
}

impl std::ops::Deref for TopoRef<'_> {
    type Target = Topology;
    #[inline]
    fn deref(&self) -> &Topology {
        match self {
            TopoRef::Held(t) => t,
            TopoRef::Own(v) => v,
        }
    }
}

/// What of the hot-key cache a request's reply drops, beyond the request's own keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Drops {
    #[default]
    Nothing,
    /// FLUSHALL / FLUSHDB.
    Everything,
    /// A module's write: what was read from the nodes it ran on (it may have changed keys
    /// it does not declare, as RediSearch's FT.ADD does its documents, and the servers'
    /// invalidations of them may arrive after its reply).
    ItsNodes,
}

impl<'a> Ctx<'a> {
    pub fn new(
        client: &'a mut ClientState,
        seq: u64,
        reply_to: &'a ReplyTx,
        scratch: &'a mut BytesMut,
        req: &'a Request,
        asked: &'a Request,
        now: Instant,
    ) -> Ctx<'a> {
        Ctx {
            client,
            seq,
            reply_to,
            scratch,
            req,
            asked,
            cmd: 0,
            now,
            first_key: 0,
            facts: u8::MAX,
            cached: false,
            invalidate: Vec::new(),
            flush: Drops::Nothing,
            write_hot_generation: None,
            wait_ms: 0,
            tracked_write: false,
            pushing: false,
            behind_retry: false,
            lane: crate::conn::order::Lane::Local,
            writes: false,
            topo: None,
        }
    }

    /// The slot map to route by (see [`TopoRef`]).
    #[inline]
    pub fn topology(&self, proxy: &Proxy) -> TopoRef<'a> {
        match self.topo {
            Some(t) => TopoRef::Held(t),
            None => TopoRef::Own(proxy.cluster.topology()),
        }
    }

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

/// What dispatching a request produced.
pub enum Outcome {
    /// The reply is known now.
    Ready(Bytes),
    /// Parts were sent; replies will come through the session's channel.
    Waiting(Pending),
    /// Not dispatched: it takes another way to Redis than the client's requests in flight
    /// ([`crate::conn::order`]); nothing about it has happened yet, and it is dispatched again
    /// once they have their replies.
    Later,
}

/// Where a part goes.
#[derive(Clone)]
pub enum Target {
    /// Whichever master owns the slot now.
    Slot(u16),
    /// This node (fan-out parts).
    Node(Arc<NodePool>),
    /// After an ASK: this node, with ASKING first.
    /// (`.1`: the slot, whose owner a later retry asks again: an ASK holds for one query.)
    Ask(Arc<NodePool>, u16),
    /// A read sent to a replica of the master serving slot `.1` (crate::services::reads);
    /// `.2`: a `replica` policy's (no master to fall back on when it fails).
    Replica(Arc<NodePool>, u16, bool),
}

/// A request that travels on a dedicated connection, not the node's shared pipelined
/// ones (boxed in [`Pending`], so a usual request carries one empty pointer).
pub struct Dedicated {
    pub via: Via,
    /// A blocking command's timeout.
    pub block: Option<Block>,
}

/// Which dedicated connection.
pub enum Via {
    /// A dedicated connection the request holds: leased from the node when first sent (or
    /// handed over, a transaction under WATCH), given back when the request completes,
    /// closed if the request is dropped unanswered (its client went away). A blocking
    /// command; a transaction under WATCH.
    Own(Option<Lease>),
    /// The client's WATCH connection ([`crate::conn::Watch`]).
    Watch,
}

/// One command sent for a request (a split command has one per slot).
pub struct Part {
    /// The command (empty when `whole`).
    data: Bytes,
    /// The command is the client's request itself ([`Ctx::req`]), which its entry keeps:
    /// not held again here, which saves a reference count taken and dropped per request.
    whole: bool,
    target: Target,
    /// MOVED / ASK / NOSCRIPT followed so far (at most [`MAX_REDIRECTS`]).
    redirects: u16,
    /// Sends retried after an unreachable node, TRYAGAIN or CLUSTERDOWN (at most
    /// [`MAX_RETRIES`]): counted apart, so a request that waited out a failover may still
    /// follow the redirections that come after it.
    retries: u16,
    reply: Option<Bytes>,
    /// What only the rare paths need, boxed: every request has a part, and its size is
    /// copied with it.
    rare: Option<Box<Rare>>,
}

/// The rarely used state of a [`Part`].
#[derive(Default)]
struct Rare {
    /// A redirection to an address the topology does not announce, held while a refresh
    /// confirms or refutes it; or READONLY from a node, held while a refresh finds the
    /// replica promoted in its place (see [`on_reply`]).
    held: Option<Bytes>,
    /// Split key by key after TRYAGAIN (see [`per_key`]): the part's pieces, or the part
    /// a piece belongs to.
    pieces: Option<Pieces>,
    /// While its retry waits out its delay ([`send::send_later`]): still wanted. Cleared
    /// when the part is dropped (its request answered, expired, or its client gone), so
    /// the retry is not sent after the client was answered and went on.
    wanted: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Drop for Rare {
    fn drop(&mut self) {
        if let Some(w) = &self.wanted {
            w.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Part {
    pub fn new(data: Bytes, target: Target) -> Part {
        Part { data, whole: false, target, redirects: 0, retries: 0, reply: None, rare: None }
    }

    /// A part that is the client's whole request (`ctx.req` wherever the part is handled).
    pub fn whole(target: Target) -> Part {
        Part { whole: true, ..Part::new(Bytes::new(), target) }
    }

    /// The command, given the request (`ctx.req`) the part belongs to.
    #[inline]
    fn data<'a>(&'a self, req: &'a Request) -> &'a Bytes {
        if self.whole { req.raw() } else { &self.data }
    }

    fn set_data(&mut self, data: Bytes) {
        (self.data, self.whole) = (data, false);
    }

    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    fn take_held(&mut self) -> Option<Bytes> {
        self.rare.as_mut()?.held.take()
    }

    fn pieces(&self) -> Option<&Pieces> {
        self.rare.as_ref()?.pieces.as_ref()
    }
}

/// A multi-key part split into one-key commands after TRYAGAIN, seen from either side.
enum Pieces {
    /// The part: its pieces are parts `first..first + count` of the request, merged into
    /// its reply as `kind` says.
    Whole { first: u32, count: u32, left: u32, kind: Split },
    /// A piece of part `.0`.
    Of(u32),
}

impl Part {
    /// The part this one is a piece of.
    fn parent(&self) -> Option<u32> {
        match self.pieces() {
            Some(Pieces::Of(i)) => Some(*i),
            _ => None,
        }
    }
}

/// How a finished request's replies become the client's reply.
pub enum Finish {
    Merge(Merge),
    /// INFO: the caller's builder turns the masters' INFO texts into the proxy's.
    /// Sent to every master; `build` makes the reply from all of theirs.
    Masters(MastersBuilder),
    /// A lock script: its reply becomes the command's.
    Lock(Box<LockRequest>),
    /// A transaction sent as one message (or, `transactions.cross_slot = "per-node"`, one
    /// per slot); its reply is EXEC's.
    Transaction(Box<Tx>),
    /// EVAL, EVALSHA, FCALL and their read-only forms: one part, its reply is the reply,
    /// with a hint added to Redis's error when the script touched an undeclared key.
    /// Counted in its master's [`NodePool::scripts`] meanwhile.
    Script(Option<ScriptRun>),
}

/// A script counted in its master's [`NodePool::scripts`] for as long as it exists (until
/// its reply, or its client, is gone).
/// Also counted in its shared connection's [`ConnStats`] once sent on one, so requests
/// of other clients do not queue behind it there once it runs long (see [`start_in`]).
pub struct ScriptRun(Arc<NodePool>, Option<Arc<ConnStats>>);

impl ScriptRun {
    pub fn new(node: Arc<NodePool>) -> ScriptRun {
        node.scripts.fetch_add(1, Ordering::Relaxed);
        ScriptRun(node, None)
    }

    fn sent_on(&mut self, conn: &Arc<ConnStats>, now: Instant) {
        if self.1.is_none() {
            conn.script_sent(now);
            self.1 = Some(conn.clone());
        }
    }
}

impl Drop for ScriptRun {
    fn drop(&mut self) {
        self.0.scripts.fetch_sub(1, Ordering::Relaxed);
        if let Some(c) = &self.1 {
            c.script_done();
        }
    }
}

/// A request waiting for backend replies: [`Light`] while it is the usual one, its whole
/// self ([`Full`]) once it needs more (made so at its first reply that needs it).
pub struct Pending(Inner);

enum Inner {
    Light(Light),
    /// (boxed: a waiting request's state sits in its place of the session's reply queue,
    /// and the usual one's is [`Light`]'s 32 bytes, not these 200)
    Full(Box<Full>),
}

/// The usual request while it waits: sent whole to one node on a shared connection, with
/// nothing to do when its answer comes but pass it on ([`start_whole`]). What it stands
/// for is the [`Full`] that [`Pending::full`] makes of it: one [`Part::whole`] to
/// `target`, passed on as it is ([`Merge::Pass`]), with no keys to invalidate, no
/// dedicated connection and no tracked write. Nothing is dropped with it but its target:
/// a [`Full`]'s drop was 146 instructions of a GET's 3,640 (callgrind, -P16).
struct Light {
    target: Target,
    /// A write's [`Full::write_hot_generation`].
    write_hot_generation: Option<u64>,
}

impl From<Full> for Pending {
    fn from(p: Full) -> Pending {
        Pending(Inner::Full(Box::new(p)))
    }
}

impl Pending {
    /// Its whole self, made from the [`Light`] form the first time it is needed.
    #[inline(always)]
    pub(super) fn full(&mut self) -> &mut Full {
        if let Inner::Light(_) = &self.0 {
            self.make_full();
        }
        match &mut self.0 {
            Inner::Full(p) => p,
            Inner::Light(_) => unreachable!("made full above"),
        }
    }

    /// [`Pending::full`]'s rare step, out of line (a split request's parts' replies, every
    /// one of which asks for its whole self, stay short).
    #[cold]
    #[inline(never)]
    fn make_full(&mut self) {
        if let Inner::Light(l) = &mut self.0 {
            let target = std::mem::replace(&mut l.target, Target::Slot(0));
            let p = Full {
                finish: Finish::Merge(Merge::Pass),
                parts: smallvec::smallvec![Part::whole(target)],
                remaining: 1,
                redirected: false,
                invalidate: Vec::new(),
                flush: Drops::Nothing,
                write_hot_generation: l.write_hot_generation,
                dedicated: None,
                tracked_write: false,
            };
            self.0 = Inner::Full(Box::new(p));
        }
    }

    /// See [`Full::plain`].
    #[inline]
    fn plain(&self, proxy: &Proxy) -> bool {
        match &self.0 {
            Inner::Light(l) => {
                l.write_hot_generation.is_none_or(|g| g == proxy.cache.hot_generation() && !proxy.migration.on())
            }
            Inner::Full(p) => p.plain(proxy),
        }
    }

    /// A MOVED or ASK was followed for some part.
    pub fn redirected(&self) -> bool {
        matches!(&self.0, Inner::Full(p) if p.redirected)
    }

    /// See [`Full::tracked_write`].
    pub fn tracked_write(&self) -> bool {
        matches!(&self.0, Inner::Full(p) if p.tracked_write())
    }

    /// See [`Full::blocking`].
    pub fn blocking(&self) -> bool {
        matches!(&self.0, Inner::Full(p) if p.blocking())
    }

    /// See [`Full::blocked_at`].
    pub fn blocked_at(&self) -> Option<(Arc<crate::upstream::cluster::NodePool>, std::net::SocketAddr)> {
        match &self.0 {
            Inner::Full(p) => p.blocked_at(),
            Inner::Light(_) => None,
        }
    }

    /// See [`Full::nil_string_on_timeout`].
    pub fn nil_string_on_timeout(&self) -> bool {
        matches!(&self.0, Inner::Full(p) if p.nil_string_on_timeout())
    }

    /// See [`Full::pinned`].
    pub fn pinned(&self) -> bool {
        matches!(&self.0, Inner::Full(p) if p.pinned())
    }

    /// See [`Full::node`].
    pub fn node(&self, cluster: &Cluster) -> Option<Arc<str>> {
        match &self.0 {
            Inner::Full(p) => p.node(cluster),
            Inner::Light(l) => target_node(&l.target, cluster),
        }
    }
}

/// A request waiting for backend replies, whole (see [`Pending`]).
pub struct Full {
    finish: Finish,
    parts: SmallVec<[Part; 1]>,
    remaining: u32,
    /// A MOVED or ASK was followed for some part.
    pub redirected: bool,
    /// Keys of a write whose cached replies are dropped (again) before its reply is passed on.
    invalidate: Vec<Bytes>,
    /// FLUSHALL / FLUSHDB, a module's write: what of the cache is dropped before the
    /// reply is passed on.
    flush: Drops,
    /// A write: the cache's hot generation when it was sent (see
    /// [`crate::services::cache::HotCache::hot_generation`]). Set for every write with
    /// keys while the cache is on or dual-write is (its keys are then noted for their
    /// copy once it has run: crate::services::migration::dual).
    write_hot_generation: Option<u64>,
    /// `None`: its parts travel on the node's shared connections.
    dedicated: Option<Box<Dedicated>>,
    /// Its client is told of its keys once it has run (see [`Ctx::tracked_write`]).
    tracked_write: bool,
}

impl Full {
    /// A request whose parts are sent by someone else (a cache fill, the lock task); it
    /// takes the write's invalidation plan from `ctx`.
    fn new(ctx: &mut Ctx, finish: Finish, parts: SmallVec<[Part; 1]>) -> Full {
        Full {
            remaining: parts.len() as u32,
            finish,
            parts,
            redirected: false,
            invalidate: std::mem::take(&mut ctx.invalidate),
            flush: std::mem::take(&mut ctx.flush),
            write_hot_generation: ctx.write_hot_generation.take(),
            dedicated: None,
            tracked_write: ctx.tracked_write,
        }
    }

    /// One part, still waiting, passed on as it is, with nothing to do when its reply
    /// comes (see [`on_reply`]; a write whose keys turned hot while it was out is not).
    fn plain(&self, proxy: &Proxy) -> bool {
        matches!(self.finish, Finish::Merge(Merge::Pass))
            && self.remaining == 1
            && self.parts.len() == 1
            && self.parts[0].reply.is_none()
            && self.parts[0].rare.is_none()
            && self.dedicated.is_none()
            && self.invalidate.is_empty()
            && self.flush == Drops::Nothing
            && !self.tracked_write
            && self.write_hot_generation.is_none_or(|g| g == proxy.cache.hot_generation() && !proxy.migration.on())
    }

    /// A write of a client with CLIENT TRACKING on (see [`Ctx::tracked_write`]).
    pub fn tracked_write(&self) -> bool {
        self.tracked_write
    }

    /// A blocking command waiting for its reply.
    pub fn blocking(&self) -> bool {
        self.dedicated.as_ref().is_some_and(|d| d.block.is_some())
    }

    /// Where a blocking command waits: its node and its connection's own address (None:
    /// not sent on a connection of its own yet, or it is not connected).
    pub fn blocked_at(&self) -> Option<(Arc<crate::upstream::cluster::NodePool>, std::net::SocketAddr)> {
        let d = self.dedicated.as_ref().filter(|d| d.block.is_some())?;
        let Via::Own(Some(lease)) = &d.via else { return None };
        let local = (*lease.conn().stats.local_addr.lock())?;
        (!lease.broken()).then(|| (lease.node().clone(), local))
    }

    /// A blocking command whose timeout reply is a nil string (BRPOPLPUSH, BLMOVE), not
    /// a nil array.
    pub fn nil_string_on_timeout(&self) -> bool {
        self.dedicated.as_ref().and_then(|d| d.block.as_ref()).is_some_and(|b| b.nil_string)
    }

    /// Travels on the client's WATCH connection.
    pub fn pinned(&self) -> bool {
        self.dedicated.as_ref().is_some_and(|d| matches!(d.via, Via::Watch))
    }

    /// The node serving the first part now (for the slow log; computed only when needed).
    pub fn node(&self, cluster: &Cluster) -> Option<Arc<str>> {
        target_node(&self.parts.first()?.target, cluster)
    }
}

/// The address of the node `target` is (or that serves its slot now).
fn target_node(target: &Target, cluster: &Cluster) -> Option<Arc<str>> {
    match target {
        Target::Slot(s) => cluster.topology().master_for_slot(*s).map(|n| n.addr.clone()),
        Target::Node(n) | Target::Ask(n, _) | Target::Replica(n, ..) => Some(n.addr.clone()),
    }
}

/// Sends a request's parts; the reply now if none could be sent (no slot map, say).
/// A request whose one reply a task of heatshield's own sends (the pub/sub hub, the lock
/// task, a shared cache fill, WAIT's task, a fan-out on dedicated connections), tagged as
/// its part 0. The part stands for the request: its bytes, sent only if that task gives
/// the request back ([`crate::mailbox::BackendError::Resend`]), and its node, for the slow
/// log. The one constructor of such placeholders.
pub fn answered_elsewhere(ctx: &mut Ctx, target: Target) -> Outcome {
    let part = Part::new(ctx.req.raw().clone(), target);
    Outcome::Waiting(Full::new(ctx, Finish::Merge(Merge::Pass), smallvec::smallvec![part]).into())
}

/// [`start`] for the whole request to one target, passed on as it is: sent here as
/// [`start_in`] would, and kept [`Light`], when nothing but passing its answer on is
/// left to do (no keys to invalidate or drop, no tracked write, no WATCH connection, no
/// script holding the shared connection); [`start`] otherwise.
pub fn start_whole(proxy: &Proxy, ctx: &mut Ctx, target: Target) -> Outcome {
    if ctx.client.modes.watch.is_none()
        && ctx.invalidate.is_empty()
        && ctx.flush == Drops::Nothing
        && !ctx.tracked_write
    {
        let topo = ctx.topology(proxy);
        if let Ok((node, asking)) = resolve_in(&topo, &target) {
            let conn = node.conn(ctx.client.proto, ctx.client.id);
            // (a script holding the connection: `start_in` may take another one)
            if asking || ctx.client.inflight != 0 || !conn.stats.held(ctx.now) {
                if ctx.writes {
                    ctx.client.wrote |= node.bit;
                }
                conn.send(BackendRequest {
                    data: ctx.req.raw().clone(),
                    count: 1,
                    prefix: if asking { Prefix::Asking } else { Prefix::None },
                    tag: Tag { seq: ctx.seq, part: 0 },
                    reply_to: ctx.reply_to.clone(),
                    order: None,
                    db: ctx.client.db,
                });
                let write_hot_generation = ctx.write_hot_generation.take();
                return Outcome::Waiting(Pending(Inner::Light(Light { target, write_hot_generation })));
            }
        }
    }
    start(proxy, ctx, Finish::Merge(Merge::Pass), smallvec::smallvec![Part::whole(target)])
}

pub fn start(proxy: &Proxy, ctx: &mut Ctx, finish: Finish, parts: SmallVec<[Part; 1]>) -> Outcome {
    start_in(proxy, ctx, finish, parts, None)
}

/// [`start`] for parts that are slices, in order, of `buffer` (a split command).
pub fn start_in(
    proxy: &Proxy,
    ctx: &mut Ctx,
    finish: Finish,
    parts: SmallVec<[Part; 1]>,
    buffer: Option<Bytes>,
) -> Outcome {
    let mut p = Full::new(ctx, finish, parts);
    if let Some(w) = &ctx.client.modes.watch
        && p.parts.len() == 1
        && matches!(p.parts[0].target, Target::Slot(s) if s == w.slot)
    {
        p.dedicated = Some(Box::new(Dedicated { via: Via::Watch, block: None }));
        return match send_part(proxy, ctx, &mut p.dedicated, &p.parts[0], 0, 1) {
            Ok(()) => Outcome::Waiting(p.into()),
            Err(e) => Outcome::Ready(e),
        };
    }
    let n = p.parts.len();
    let mut i = 0;
    // one look at the slot map for every part, and the pools borrowed from it
    let topo = ctx.topology(proxy);
    while i < n {
        let (node, asking) = match resolve_in(&topo, &p.parts[i].target) {
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
        while j < n && !asking && resolve_in(&topo, &p.parts[j].target).is_ok_and(|(m, a)| !a && Arc::ptr_eq(m, node)) {
            j += 1;
        }
        let data = if j - i == 1 {
            p.parts[i].data(ctx.req).clone()
        } else {
            joined(buffer.as_ref(), ctx.req, &p.parts[i..j])
        };
        if ctx.writes {
            ctx.client.wrote |= node.bit;
        }
        let conn = node.conn(ctx.client.proto, ctx.client.id);
        if n == 1 && conn.stats.held(ctx.now) && ctx.client.inflight == 0 && !asking {
            // A script has held this shared connection for a while: Redis reads nothing
            // behind it until it ends. A client with nothing else on its way can take
            // another connection without reordering its own commands, and gets what one
            // Redis would answer (the wait until busy-reply-threshold, then BUSY).
            if let Some(lease) = node.lease(ctx.client.proto) {
                crate::metrics::global().script_detours.increment(1);
                p.dedicated = Some(Box::new(Dedicated { via: Via::Own(Some(lease)), block: None }));
                return match send_part(proxy, ctx, &mut p.dedicated, &p.parts[0], 0, 1) {
                    Ok(()) => Outcome::Waiting(p.into()),
                    Err(e) => Outcome::Ready(e),
                };
            }
        }
        if let Finish::Script(Some(run)) = &mut p.finish {
            run.sent_on(&conn.stats, ctx.now);
        }
        conn.send(BackendRequest {
            data,
            count: (j - i) as u32,
            prefix: if asking { Prefix::Asking } else { Prefix::None },
            tag: Tag { seq: ctx.seq, part: i as u32 },
            reply_to: ctx.reply_to.clone(),
            order: None,
            db: ctx.client.db,
        });
        i = j;
    }
    if p.remaining == 0 {
        return Outcome::Ready(assemble(proxy, ctx, &mut p));
    }
    Outcome::Waiting(p.into())
}

/// The commands of consecutive parts as one message. A split command's parts are slices,
/// in order, of one buffer (`buffer`, see [`crate::path::route::split_by_slot`]), so this is
/// one more slice of it, not a copy; other parts are copied together.
fn joined(buffer: Option<&Bytes>, req: &Request, parts: &[Part]) -> Bytes {
    let len: usize = parts.iter().map(|x| x.data(req).len()).sum();
    if let Some(buf) = buffer {
        let base = buf.as_ptr() as usize;
        let at = parts[0].data(req).as_ptr() as usize;
        let mut end = at;
        let adjacent = parts.iter().all(|x| {
            let next = x.data(req).as_ptr() as usize == end;
            end += x.data(req).len();
            next
        });
        if adjacent && at >= base && end <= base + buf.len() {
            return buf.slice(at - base..end - base);
        }
    }
    let mut b = BytesMut::with_capacity(len);
    for x in parts {
        b.extend_from_slice(x.data(req));
    }
    b.freeze()
}

/// Sends a blocking command to the master owning slot `s`, on a dedicated connection of
/// its own (on the client's WATCH connection if it watches that slot): a shared
/// connection is never blocked. The connection goes back to the pool with the reply, and
/// is closed if the client leaves first (Redis then forgets the blocked client, so it
/// takes no element meant for another).
pub fn start_blocking(proxy: &Proxy, ctx: &mut Ctx, s: u16, block: Block) -> Outcome {
    let part = Part::whole(Target::Slot(s));
    let mut p = Full::new(ctx, Finish::Merge(Merge::Pass), smallvec::smallvec![part]);
    let via = match &ctx.client.modes.watch {
        Some(w) if w.slot == s => Via::Watch,
        _ => Via::Own(None),
    };
    p.dedicated = Some(Box::new(Dedicated { via, block: Some(block) }));
    match send_part(proxy, ctx, &mut p.dedicated, &p.parts[0], 0, 1) {
        Ok(()) => Outcome::Waiting(p.into()),
        Err(e) => Outcome::Ready(e),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_parts_travel_as_one_slice() {
        let buf = Bytes::from_static(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*2\r\n$3\r\nGET\r\n$1\r\nb\r\n");
        let req = Request::from_args(&["MGET", "a", "b"]);
        let part = |r: std::ops::Range<usize>| Part::new(buf.slice(r), Target::Slot(0));
        let (a, b) = (part(0..20), part(20..40));
        let one = joined(Some(&buf), &req, &[a, b]);
        assert_eq!(one, buf);
        assert_eq!(one.as_ptr(), buf.as_ptr(), "a slice of the buffer, not a copy");
        // not in order: copied together
        let (a, b) = (part(0..20), part(20..40));
        let two = joined(Some(&buf), &req, &[b, a]);
        assert_eq!(&two[..20], &buf[20..40]);
        assert_eq!(&two[20..], &buf[..20]);
        // no buffer: copied together
        let (a, b) = (part(0..20), part(20..40));
        assert_eq!(joined(None, &req, &[a, b]), buf);
    }

    #[test]
    fn a_whole_part_is_its_request_until_given_a_command_of_its_own() {
        let req = Request::from_args(&["GET", "k"]);
        let mut p = Part::whole(Target::Slot(0));
        assert!(p.data.is_empty(), "holds nothing of its own");
        assert_eq!(p.data(&req).as_ptr(), req.raw().as_ptr(), "the request's bytes, not a copy");
        // with other parts: the request's bytes are joined like any part's
        let other = Part::new(Bytes::from_static(b"*1\r\n$4\r\nPING\r\n"), Target::Slot(0));
        let both = joined(None, &req, &[Part::whole(Target::Slot(0)), other]);
        assert_eq!(&both[..], &[&req.raw()[..], &b"*1\r\n$4\r\nPING\r\n"[..]].concat()[..]);
        // a command of its own (a blocking command's remaining timeout, EVAL for EVALSHA)
        p.set_data(Bytes::from_static(b"*1\r\n$4\r\nPING\r\n"));
        assert_eq!(&p.data(&req)[..], b"*1\r\n$4\r\nPING\r\n");
    }
}
