//! Backend connections: a few pipelined connections per Redis node, shared by all clients.
//!
//! A [`Backend`] is a handle to one connection task. Sessions hand it [`BackendRequest`]s
//! (the RESP bytes plus where the reply must go); the task writes everything queued in one
//! syscall, remembers the order in a FIFO, and sends each reply (the exact bytes Redis sent,
//! split off the read buffer without copying or decoding) back to the session that asked.
//!
//! When the connection breaks, requests already written fail with
//! [`BackendError::Lost`] (they may have run), queued ones (including one taken off the
//! queue and not yet written) are sent on the next connection, and while the node cannot
//! be reached new requests fail at once with [`BackendError::NotSent`] (safe to retry
//! elsewhere). It reconnects with backoff, and only while it has something to send, so a
//! connection to a node that went away is not retried while nobody needs it. A reply
//! that does not come within the command timeout breaks the connection the same way.
//! This module knows nothing about slots or commands.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use crate::mailbox::{BackendError, Delivery, ReplyTx, Tag};
use crate::metrics::NodeMetrics;
use crate::protocol::reply::{ReplyScanner, error_text};
use crate::protocol::request::Request;
use crate::tls::Link;

/// A request for one backend connection.
pub struct BackendRequest {
    /// One command, or `count` commands back to back.
    pub data: Bytes,
    /// Commands in `data`; their replies are tagged `tag.part`, `tag.part + 1`, ...
    pub count: u32,
    /// A command sent first whose `+OK` is swallowed.
    pub prefix: Prefix,
    /// Opaque to the backend: identifies the request to its session.
    pub tag: Tag,
    pub reply_to: ReplyTx,
    /// A blocking command's place in its node's send order (see [`SendOrder`]).
    pub order: Option<Box<OrderTicket>>,
    /// The database the commands run in: not 0, they are written between `SELECT db` and
    /// `SELECT 0`, whose replies are dropped, so the connection is always left in 0.
    /// (u16: the request fits in 72 bytes; SELECT accepts at most 65,536 databases)
    pub db: u16,
}

/// Blocking commands for one node reach it in the order heatshield took them from its
/// clients, as on one Redis, where the first client to block on a key is the first
/// served. Each is written on a dedicated connection of its own, and those connections
/// are separate tasks (one may still be connecting), so nothing else orders them: each
/// takes a ticket here and its connection writes it only once the one before has been
/// written (or given up), waiting at most [`ORDER_WAIT`] so a stalled connection cannot
/// hold up the rest.
#[derive(Default)]
pub struct SendOrder {
    /// Resolved when the newest ticket's command has been written.
    tail: parking_lot::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

/// How long a blocking command waits for the one taken before it to be written. (250 ms
/// was once too short on a loaded 2-core machine, where the one before was still making
/// its connection: `tests/blocking.rs` saw two clients served the other way round.)
pub const ORDER_WAIT: Duration = Duration::from_secs(1);

impl SendOrder {
    /// The next place in the order.
    pub fn ticket(&self) -> Box<OrderTicket> {
        let (done, rx) = tokio::sync::oneshot::channel();
        let prev = self.tail.lock().replace(rx);
        Box::new(OrderTicket { prev, _done: done })
    }
}

/// One place in a [`SendOrder`]: dropping it (once its command is written, or when the
/// command is dropped unsent) lets the next one go.
pub struct OrderTicket {
    prev: Option<tokio::sync::oneshot::Receiver<()>>,
    _done: tokio::sync::oneshot::Sender<()>,
}

impl OrderTicket {
    /// Until the command taken before this one has been written (or [`ORDER_WAIT`]).
    async fn turn(&mut self) {
        if let Some(prev) = self.prev.take() {
            let _ = tokio::time::timeout(ORDER_WAIT, prev).await;
        }
    }
}

/// A command sent just before a request, on the same connection, whose reply the client
/// never sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    None,
    /// `ASKING` (after an ASK redirection).
    Asking,
    /// `CLIENT CACHING yes`: the read that follows is tracked (see [`NodeTracking`]).
    CachingYes,
}

impl Prefix {
    fn bytes(self) -> &'static [u8] {
        match self {
            Prefix::None => b"",
            Prefix::Asking => b"*1\r\n$6\r\nASKING\r\n",
            Prefix::CachingYes => b"*3\r\n$6\r\nCLIENT\r\n$7\r\nCACHING\r\n$3\r\nyes\r\n",
        }
    }
}

/// Server-assisted client-side caching state shared by one node's connections
/// (the hot-key cache owns the policy). Every connection to the node turns on
/// `CLIENT TRACKING on REDIRECT <redirect> OPTIN` when it connects (if `redirect` is set),
/// so reads sent with [`Prefix::CachingYes`] are tracked and their invalidations go to
/// the node's invalidation connection.
/// Bumps of a node's tracking generation remembered (every connection to a dead node
/// closes: a few per worker).
const BUMPS: usize = 64;

#[derive(Debug)]
pub struct NodeTracking {
    /// Client id of the node's invalidation connection; 0 while there is none.
    pub redirect: AtomicU64,
    /// Bumped whenever invalidations from this node may have been lost: a connection
    /// whose reads were tracked closed, or the invalidation connection broke (through
    /// [`NodeTracking::lost`]), or everything read from it changed (a flush, a module's
    /// write: through [`NodeTracking::void`]).
    pub generation: AtomicU64,
    /// What was read from the node under a generation below this one is void: it may
    /// not be served even as a stale answer (crate::services::cache, `stale_if_error`).
    pub void_below: AtomicU64,
    /// When the generation was last bumped for a lost connection, and to what
    /// (the last [`BUMPS`]): how long ago an entry read under an older generation stopped being
    /// known current.
    bumps: parking_lot::Mutex<[(u64, Option<Instant>); BUMPS]>,
}

impl Default for NodeTracking {
    fn default() -> Self {
        NodeTracking {
            redirect: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            void_below: AtomicU64::new(0),
            bumps: parking_lot::Mutex::new([(0, None); BUMPS]),
        }
    }
}

impl NodeTracking {
    /// Invalidations from the node may have been lost from now on (its values were
    /// current until now).
    pub fn lost(&self) {
        let mut b = self.bumps.lock();
        let g = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        b[(g % BUMPS as u64) as usize] = (g, Some(Instant::now()));
    }

    /// Everything read from the node so far is void (the node was flushed, or a module's
    /// write may have changed any key).
    pub fn void(&self) {
        let g = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.void_below.fetch_max(g, Ordering::SeqCst);
    }

    /// When a value read under generation `g` stopped being known current: the first
    /// bump after it, if that was a lost connection still remembered.
    pub fn current_until(&self, g: u64) -> Option<Instant> {
        if g < self.void_below.load(Ordering::SeqCst) {
            return None;
        }
        let b = self.bumps.lock();
        let (at, t) = b[((g + 1) % BUMPS as u64) as usize];
        (at == g + 1).then_some(t).flatten()
    }
}

/// Protocol and credentials used on backend connections.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    pub connect_timeout: Duration,
    pub command_timeout: Duration,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Negotiate RESP3 (`HELLO 3`) on connect.
    pub resp3: bool,
    /// Time one backend request in this many for the latency histogram.
    pub latency_sample_every: u32,
    /// The node's tracking state, when the hot-key cache is on.
    pub tracking: Option<Arc<NodeTracking>>,
    /// A dedicated connection (leased to one client at a time, see
    /// [`crate::upstream::cluster::Lease`]): it connects once and never again, has no command
    /// timeout of its own (its lessee bounds the wait), starts with small buffers (there
    /// may be thousands), and closes at once when its last handle is dropped, even with
    /// a request in flight (a blocked command must not outlive its client).
    pub dedicated: bool,
    /// Dedicated connections one node may have at once (leased and idle).
    pub dedicated_max: usize,
    /// Idle dedicated connections kept per node and protocol for the next lessee.
    pub dedicated_idle: usize,
    /// TLS to every node (`backend.tls`): the handshake's configuration and names.
    pub tls: Option<Arc<crate::tls::Connector>>,
    /// Sends `READONLY` on connect: a connection to a replica that reads the slots of its
    /// master (crate::upstream::cluster, replica reads).
    pub readonly: bool,
    /// A shared connection to a node with nothing in flight holds its write this long
    /// (`backend.flush_delay_ms`; zero: never).
    pub flush_delay: Duration,
}

impl BackendOptions {
    /// Plain connections with `timeout` for connecting and for each request, RESP2, no
    /// credentials, tracking or TLS (unit tests, which start no node).
    #[cfg(test)]
    pub(crate) fn plain(timeout: Duration) -> BackendOptions {
        BackendOptions {
            connect_timeout: timeout,
            command_timeout: timeout,
            username: None,
            password: None,
            resp3: false,
            latency_sample_every: 1,
            tracking: None,
            dedicated: false,
            dedicated_max: 1,
            dedicated_idle: 1,
            tls: None,
            readonly: false,
            flush_delay: Duration::ZERO,
        }
    }
}

/// Connection state, for admin views.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnState {
    Connecting = 0,
    Up = 1,
    Down = 2,
}

/// Shared counters of one connection.
#[derive(Debug, Default)]
pub struct ConnStats {
    state: AtomicU8,
    /// Requests written whose reply has not come yet.
    pub inflight: AtomicUsize,
    /// The invalidation connection this connection's tracked reads report to (0: none).
    pub tracking_id: AtomicU64,
    /// The connection's own address (as the node's `CLIENT LIST` shows it: `addr=`), set
    /// when it connects, so a blocked command on it can be ended at the node (`CLIENT
    /// UNBLOCK`), which answers it with what it took if it took something first.
    pub local_addr: parking_lot::Mutex<Option<std::net::SocketAddr>>,
    /// Scripts sent on this connection whose reply has not come (see [`ConnStats::held`]).
    scripts: AtomicUsize,
    /// While `scripts` > 0: when the connection last saw one sent first or answered, in
    /// milliseconds of [`clock_ms`] (0: no script out).
    script_since: AtomicU64,
    /// Why the last attempt to connect failed, until one succeeds (`PROXY NODES`).
    error: parking_lot::Mutex<Option<Arc<str>>>,
}

/// A connection whose script has been running this long without a reply holds up the
/// requests behind it: Redis reads nothing more from a connection whose script runs.
pub const SCRIPT_HOLDS_AFTER: Duration = Duration::from_millis(50);

/// Milliseconds since the process's first call (at least 1), for timestamps in atomics.
pub fn clock_ms(now: Instant) -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    now.saturating_duration_since(base).as_millis() as u64 + 1
}

impl ConnStats {
    pub fn state(&self) -> ConnState {
        match self.state.load(Ordering::Relaxed) {
            1 => ConnState::Up,
            2 => ConnState::Down,
            _ => ConnState::Connecting,
        }
    }
    fn set(&self, s: ConnState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// Why the last attempt to connect failed, if the connection has not been up since.
    pub fn error(&self) -> Option<Arc<str>> {
        self.error.lock().clone()
    }

    /// A script was sent on this connection.
    pub fn script_sent(&self, now: Instant) {
        if self.scripts.fetch_add(1, Ordering::Relaxed) == 0 {
            self.script_since.store(clock_ms(now), Ordering::Relaxed);
        }
    }

    /// A script sent on this connection was answered (or its client left).
    pub fn script_done(&self) {
        let left = self.scripts.fetch_sub(1, Ordering::Relaxed) - 1;
        // the scripts still out were sent after this one: count from now
        let since = if left == 0 { 0 } else { clock_ms(Instant::now()) };
        self.script_since.store(since, Ordering::Relaxed);
    }

    /// A script sent on this connection has gone unanswered for [`SCRIPT_HOLDS_AFTER`]:
    /// a request written behind it waits until the script ends, where on one Redis it
    /// would wait only until `busy-reply-threshold` and then be answered BUSY. One
    /// relaxed load when no script is out.
    #[inline]
    pub fn held(&self, now: Instant) -> bool {
        let since = self.script_since.load(Ordering::Relaxed);
        since != 0 && clock_ms(now).saturating_sub(since) >= SCRIPT_HOLDS_AFTER.as_millis() as u64
    }
}

/// A handle to one backend connection task. Dropping every handle ends the task.
#[derive(Clone)]
pub struct Backend {
    tx: crate::queue::Sender<BackendRequest>,
    pub stats: Arc<ConnStats>,
}

impl Backend {
    /// Starts a connection task to `addr`. Must be called inside a tokio runtime.
    pub fn spawn(addr: Arc<str>, opts: BackendOptions, metrics: Arc<NodeMetrics>) -> Backend {
        let (tx, rx) = crate::queue::channel();
        let stats = Arc::new(ConnStats::default());
        tokio::spawn(run(addr, opts, rx, stats.clone(), metrics));
        Backend { tx, stats }
    }

    /// Queues a request. If the task is gone the request is answered `NotSent` at once.
    #[inline]
    pub fn send(&self, req: BackendRequest) {
        if let Err(req) = self.tx.send(req) {
            fail_all(req.tag, req.count, &req.reply_to, &BackendError::NotSent(Arc::from("closed backend")));
        }
    }
}

/// What the FIFO remembers about a written request.
struct Inflight {
    /// The tag of the first reply (a multi-command request's next ones are `tag.part + 1`,
    /// ...).
    tag: Tag,
    /// Replies expected for this request.
    count: u32,
    reply_to: ReplyTx,
    /// A prefix's reply precedes this request's reply.
    prefix: Prefix,
    sent: Instant,
    /// A `SELECT` written around a request in another database: its reply is dropped.
    select: bool,
}

impl Inflight {
    /// The entry of a `SELECT` written around a request for `reply_to`.
    fn select(reply_to: &ReplyTx, now: Instant) -> Inflight {
        let tag = Tag { seq: 0, part: u32::MAX };
        Inflight { tag, count: 1, reply_to: reply_to.clone(), prefix: Prefix::None, sent: now, select: true }
    }
}

/// Writes `req` (in database `req.db`, not 0) between `SELECT db` and `SELECT 0`, with
/// its FIFO entries: the replies it adds.
#[cold]
fn in_db(wbuf: &mut BytesMut, batch: &mut Vec<Inflight>, req: BackendRequest, now: Instant) -> usize {
    select(wbuf, req.db);
    batch.push(Inflight::select(&req.reply_to, now));
    wbuf.extend_from_slice(req.prefix.bytes());
    wbuf.extend_from_slice(&req.data);
    let count = req.count.max(1);
    select(wbuf, 0);
    let back = Inflight::select(&req.reply_to, now);
    batch.push(Inflight { tag: req.tag, count, reply_to: req.reply_to, prefix: req.prefix, sent: now, select: false });
    batch.push(back);
    count as usize + 2
}

/// `SELECT db`, as written before a request in database `db`.
fn select(wbuf: &mut BytesMut, db: u16) {
    let mut n = itoa::Buffer::new();
    let n = n.format(db);
    wbuf.extend_from_slice(b"*2\r\n$6\r\nSELECT\r\n$");
    wbuf.extend_from_slice(itoa::Buffer::new().format(n.len()).as_bytes());
    wbuf.extend_from_slice(b"\r\n");
    wbuf.extend_from_slice(n.as_bytes());
    wbuf.extend_from_slice(b"\r\n");
}

const BATCH_BYTES: usize = 256 * 1024;

/// A reply of `n` bytes taken from the front of the read buffer. The commonest short
/// replies come back as static bytes: the buffer is shared by every reply cut from it, and
/// a static reply neither takes a count on it nor gives one back when it is dropped (two
/// atomic operations a reply; SET's `+OK` is every reply at SET -P16).
#[inline]
fn take_frame(rbuf: &mut BytesMut, n: usize) -> Bytes {
    let fixed: Option<&'static [u8]> = match &rbuf[..n] {
        b"+OK\r\n" => Some(b"+OK\r\n"),
        b":1\r\n" => Some(b":1\r\n"),
        b":0\r\n" => Some(b":0\r\n"),
        b"$-1\r\n" => Some(b"$-1\r\n"),
        _ => None,
    };
    match fixed {
        Some(f) => {
            rbuf.advance(n);
            Bytes::from_static(f)
        }
        None => rbuf.split_to(n).freeze(),
    }
}
/// At most this many more turns of the event loop gather requests for an idle node
/// before they are written (16 measured the same as 4 at GET -P1).
const GATHER_TURNS: usize = 4;

/// Requests queued for a connection at or above which `backend.flush_delay_ms` does not
/// hold its write (a batch's worth is there already).
const FLUSH_HOLD_BELOW: usize = 128;

async fn run(
    addr: Arc<str>,
    opts: BackendOptions,
    mut rx: crate::queue::Receiver<BackendRequest>,
    stats: Arc<ConnStats>,
    metrics: Arc<NodeMetrics>,
) {
    let mut backoff = Duration::from_millis(20);
    // A request taken from the queue but not written when the connection failed: it goes
    // first on the next connection (it never reached the node).
    let carry: parking_lot::Mutex<Option<BackendRequest>> = parking_lot::Mutex::new(None);
    loop {
        // Connect only when there is something to send: a connection to a node that went
        // away (or left the topology) is not retried while nobody needs it.
        if carry.lock().is_none() {
            match rx.recv().await {
                Some(req) => *carry.lock() = Some(req),
                None => return,
            }
        }
        stats.set(ConnState::Connecting);
        match connect(&addr, &opts).await {
            Ok((stream, tracking_id, local)) => {
                stats.tracking_id.store(tracking_id, Ordering::SeqCst);
                *stats.local_addr.lock() = local;
                *stats.error.lock() = None;
                info!(node = %addr, tls = opts.tls.is_some(), "backend connected");
                if !opts.dedicated {
                    // (SeqCst: a lock command built after this request's reply sees it)
                    metrics.connects.fetch_add(1, Ordering::SeqCst);
                }
                stats.set(ConnState::Up);
                backoff = Duration::from_millis(20);
                let closed = serve(stream, &addr, &opts, &mut rx, &carry, &stats, &metrics).await;
                stats.set(ConnState::Down);
                // Redis forgets what a closed connection tracked: nothing cached from this
                // node can be trusted to be invalidated any more.
                if stats.tracking_id.swap(0, Ordering::SeqCst) != 0
                    && let Some(t) = &opts.tracking
                {
                    t.lost();
                }
                if closed || opts.dedicated {
                    // a dedicated connection's state (WATCH, a blocked command) died with
                    // it: requests sent from now on fail at once (NotSent), and so does
                    // one taken but not written yet (it broke while that one waited for
                    // its turn), which would otherwise go unanswered
                    if let Some(req) = carry.lock().take() {
                        fail_all(req.tag, req.count, &req.reply_to, &BackendError::NotSent(addr.clone()));
                    }
                    fail_queued(&mut rx, &addr);
                    return;
                }
            }
            Err(e) => {
                stats.set(ConnState::Down);
                warn!(node = %addr, error = %e, "backend connect failed");
                *stats.error.lock() = Some(Arc::from(e.to_string()));
                if opts.dedicated {
                    if let Some(req) = carry.lock().take() {
                        metrics.err_connect.increment(req.count.max(1) as u64);
                        fail_all(req.tag, req.count, &req.reply_to, &BackendError::NotSent(addr.clone()));
                    }
                    fail_queued(&mut rx, &addr);
                    return;
                }
                // Fail what is queued now and whatever arrives while we wait.
                if let Some(req) = carry.lock().take() {
                    metrics.err_connect.increment(req.count.max(1) as u64);
                    fail_all(req.tag, req.count, &req.reply_to, &BackendError::NotSent(addr.clone()));
                }
                let deadline = tokio::time::sleep(backoff);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut deadline => break,
                        r = rx.recv() => match r {
                            Some(req) => {
                                metrics.err_connect.increment(req.count.max(1) as u64);
                                fail_all(req.tag, req.count, &req.reply_to, &BackendError::NotSent(addr.clone()))
                            }
                            None => return,
                        }
                    }
                }
                backoff = (backoff * 2).min(Duration::from_millis(1000));
            }
        }
    }
}

/// Moves the batch's entries into the FIFO under one lock, and counts them in flight.
fn hand_over(
    fifo: &parking_lot::Mutex<VecDeque<Inflight>>,
    batch: &mut Vec<Inflight>,
    added: &mut usize,
    stats: &ConnStats,
) {
    if !batch.is_empty() {
        fifo.lock().extend(batch.drain(..));
        stats.inflight.fetch_add(std::mem::take(added), Ordering::Relaxed);
    }
}

/// Closes the queue (later sends are answered `NotSent` by [`Backend::send`]) and answers
/// what was still queued `NotSent`: this task ends without writing it.
fn fail_queued(rx: &mut crate::queue::Receiver<BackendRequest>, addr: &Arc<str>) {
    for req in rx.close() {
        fail_all(req.tag, req.count, &req.reply_to, &BackendError::NotSent(addr.clone()));
    }
}

/// Answers every command of a request with `e`.
fn fail_all(tag: Tag, count: u32, reply_to: &ReplyTx, e: &BackendError) {
    for k in 0..count.max(1) {
        let tag = Tag { seq: tag.seq, part: tag.part + k };
        let _ = reply_to.send(Delivery::reply(tag, Err(e.clone())));
    }
}

/// Opens a connection and runs the handshake (AUTH, HELLO 3, CLIENT TRACKING). Returns the
/// stream and the invalidation connection its tracking reports to (0: none).
///
/// With `opts.tls`, the TLS handshake comes first; one that fails is an error naming
/// TLS and the reason (an unverified certificate, a node that does not speak TLS), never
/// a plain connection instead.
pub async fn connect(addr: &str, opts: &BackendOptions) -> std::io::Result<(Link, u64, Option<std::net::SocketAddr>)> {
    // (the handshake's own timeout fires first, with its reason)
    let deadline = tokio::time::Instant::now() + opts.connect_timeout;
    let fut = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let local = tcp.local_addr().ok();
        let mut s = match &opts.tls {
            Some(tls) => match tokio::time::timeout_at(deadline, tls.connect(tcp, addr)).await {
                Ok(Ok(s)) => Link::Tls(Box::new(s)),
                Ok(Err(e)) => return Err(std::io::Error::new(e.kind(), format!("TLS handshake failed: {e}"))),
                // a plain-text port takes the ClientHello for the start of a command
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "TLS handshake failed: no answer (a plain-text port? backend.tls is on)",
                    ));
                }
            },
            None => Link::Plain(tcp),
        };
        let mut hs: Vec<Request> = Vec::new();
        if opts.resp3 {
            let mut args: Vec<&[u8]> = vec![b"HELLO", b"3"];
            if let Some(p) = &opts.password {
                args.extend([
                    b"AUTH".as_slice(),
                    opts.username.as_deref().unwrap_or("default").as_bytes(),
                    p.as_bytes(),
                ]);
            }
            hs.push(Request::from_args(&args));
        } else if let Some(p) = &opts.password {
            match &opts.username {
                Some(u) => hs.push(Request::from_args(&[b"AUTH".as_slice(), u.as_bytes(), p.as_bytes()])),
                None => hs.push(Request::from_args(&[b"AUTH".as_slice(), p.as_bytes()])),
            }
        }
        if opts.readonly {
            hs.push(Request::from_args(&["READONLY"]));
        }
        if hs.is_empty() && !opts.dedicated {
            // nothing to say first: a PING, so that a node this connection cannot talk to
            // (a TLS-only port; over TLS, one that wants a client certificate) fails it
            // here, with the reason, and not its first request
            hs.push(Request::from_args(&["PING"]));
        }
        for req in hs {
            let reply = roundtrip(&mut s, req.raw()).await?;
            if let Some(e) = error_text(&reply) {
                return Err(std::io::Error::other(format!("handshake refused: {}", String::from_utf8_lossy(e))));
            }
        }
        let mut redirect = opts.tracking.as_ref().map(|t| t.redirect.load(Ordering::SeqCst)).unwrap_or(0);
        if redirect != 0 {
            let id = redirect.to_string();
            let req = Request::from_args(&["CLIENT", "TRACKING", "on", "REDIRECT", &id, "OPTIN"]);
            let reply = roundtrip(&mut s, req.raw()).await?;
            if let Some(e) = error_text(&reply) {
                // the invalidation connection just went away: serve without tracking
                debug!(node = %addr, error = %String::from_utf8_lossy(e), "CLIENT TRACKING refused");
                redirect = 0;
            }
        }
        Ok((s, redirect, local))
    };
    match tokio::time::timeout_at(deadline + Duration::from_millis(50), fut).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timeout")),
    }
}

/// Sends one handshake request on a fresh connection and reads its reply (nothing else
/// has been sent, so nothing follows it; heatshield's own connections read replies
/// through [`crate::upstream::side::Side`]).
async fn roundtrip(s: &mut Link, req: &[u8]) -> std::io::Result<Bytes> {
    // A node that speaks only TLS closes (or resets) a plain connection at its first
    // bytes: said so, rather than left as a bare "connection reset".
    let plain = matches!(s, Link::Plain(_));
    let hint = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::BrokenPipe
            if plain =>
        {
            std::io::Error::new(e.kind(), format!("{e}, before any reply (a TLS-only port? backend.tls is off)"))
        }
        _ => e,
    };
    s.write_all(req).await.map_err(hint)?;
    s.flush().await.map_err(hint)?;
    let mut buf = BytesMut::with_capacity(4096);
    let mut sc = ReplyScanner::new();
    loop {
        let n = s.read_buf(&mut buf).await.map_err(|e| if buf.is_empty() { hint(e) } else { e })?;
        if n == 0 {
            let e = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed");
            return Err(if buf.is_empty() { hint(e) } else { e });
        }
        if let Some(n) = sc.scan(&buf).map_err(std::io::Error::other)? {
            return Ok(buf.split_to(n).freeze());
        }
    }
}

/// Serves one live connection until it fails (false) or every handle is dropped (true).
/// `carry` holds a request taken from the queue and not yet written: it is written first,
/// and if the connection fails before that it stays there for the next connection.
async fn serve(
    mut stream: Link,
    addr: &Arc<str>,
    opts: &BackendOptions,
    rx: &mut crate::queue::Receiver<BackendRequest>,
    carry: &parking_lot::Mutex<Option<BackendRequest>>,
    stats: &ConnStats,
    metrics: &NodeMetrics,
) -> bool {
    let (mut rd, mut wr) = stream.split();
    let plain = matches!(rd, crate::tls::LinkRead::Plain(_));
    // The writer and reader futures run in this one task, never at the same instant, so
    // the FIFO's lock is never contended (it is there because the task must be Send).
    // A dedicated connection serves one client: small buffers, grown as needed.
    let (fifo_cap, buf_cap) = if opts.dedicated { (2, 512) } else { (256, 64 * 1024) };
    let fifo: parking_lot::Mutex<VecDeque<Inflight>> = parking_lot::Mutex::new(VecDeque::with_capacity(fifo_cap));
    let mut closed = false;

    let writer = async {
        let mut wbuf = BytesMut::with_capacity(buf_cap);
        let mut batch: Vec<Inflight> = Vec::with_capacity(if opts.dedicated { 1 } else { 64 });
        loop {
            if carry.lock().is_none() {
                let Some(first) = rx.recv().await else {
                    // Every handle is gone (the node left the topology): let the replies
                    // already on their way arrive (the watchdog bounds this), then stop.
                    closed = true;
                    while !opts.dedicated && !fifo.lock().is_empty() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    return Ok::<(), std::io::Error>(());
                };
                // Parked where a failure of the connection finds it: while this task
                // yields, the reader may end the connection, and a request held only by
                // this future would be dropped without a reply.
                *carry.lock() = Some(first);
                // Let the sessions that are ready right now run first: their requests join
                // this batch, so one write (and one read of the replies) serves many clients.
                // (Not on a dedicated connection: it has one client, and tokio wakes tasks
                // that yielded together last-first, which would turn two blocking commands
                // for one key around.)
                if !opts.dedicated {
                    tokio::task::yield_now().await;
                    // A node with nothing in flight has answered everything and gone to
                    // sleep: this write will wake it, which costs the waker more than the
                    // write (docs/design/profile.md, "The floor at -P1"). While each turn of the
                    // event loop brings more requests for it, give the sessions another
                    // turn, so that more of them share the wake-up. A client alone waits
                    // no longer than before (nothing came: write now).
                    let mut queued = rx.len();
                    for _ in 0..GATHER_TURNS {
                        if queued == 0 || !fifo.lock().is_empty() {
                            break;
                        }
                        tokio::task::yield_now().await;
                        let now = rx.len();
                        if now == queued {
                            break;
                        }
                        queued = now;
                    }
                    // `backend.flush_delay_ms`: a node with nothing in flight is asleep, and
                    // this write wakes it; held a little, it carries the requests of every
                    // client that sends meanwhile, and the node wakes once for all of them
                    // (latency traded for the masters' CPU). Not once a batch's worth waits:
                    // the hold gathers, it never slows a busy connection down.
                    if !opts.flush_delay.is_zero() && fifo.lock().is_empty() && rx.len() < FLUSH_HOLD_BELOW {
                        tokio::time::sleep(opts.flush_delay).await;
                    }
                }
            }
            // a blocking command goes after those taken before it for this node
            let mut order = carry.lock().as_mut().and_then(|r| r.order.take());
            if let Some(t) = order.as_mut() {
                t.turn().await;
            }
            let now = Instant::now();
            let mut next = carry.lock().take();
            // entries for the FIFO, handed over under one lock before anything is written
            // (a reply can only follow the write)
            let mut added = 0usize;
            while let Some(req) = next.take() {
                if req.db != 0 {
                    // (another database: written whole, however big, between SELECTs)
                    added += in_db(&mut wbuf, &mut batch, req, now);
                } else {
                    wbuf.extend_from_slice(req.prefix.bytes());
                    let big = req.data.len() > 64 * 1024;
                    if !big {
                        wbuf.extend_from_slice(&req.data);
                    }
                    let count = req.count.max(1);
                    batch.push(Inflight {
                        tag: req.tag,
                        count,
                        reply_to: req.reply_to,
                        prefix: req.prefix,
                        sent: now,
                        select: false,
                    });
                    added += count as usize;
                    if big {
                        // large values go straight from the client's buffer to the socket
                        hand_over(&fifo, &mut batch, &mut added, stats);
                        wr.write_all(&wbuf).await?;
                        wbuf.clear();
                        wr.write_all(&req.data).await?;
                    }
                }
                if wbuf.len() < BATCH_BYTES {
                    next = rx.try_recv();
                    if next.as_ref().is_some_and(|r| r.order.is_some()) {
                        // it waits for its turn first: it starts the next batch
                        *carry.lock() = next.take();
                    }
                }
            }
            hand_over(&fifo, &mut batch, &mut added, stats);
            if !wbuf.is_empty() {
                wr.write_all(&wbuf).await?;
                wbuf.clear();
                if wbuf.capacity() > 4 * BATCH_BYTES {
                    wbuf = BytesMut::with_capacity(buf_cap);
                }
            }
            // (TLS: records the socket did not take yet; plain: nothing to do)
            wr.flush().await?;
            drop(order); // written: the next blocking command for this node may go
        }
    };

    // Of the front request, if it has several commands (a transaction), the replies handed
    // over already: if the connection breaks, only the others fail. (Kept beside the FIFO,
    // not in each entry, which a plain request would pay for.)
    let partial = AtomicU32::new(0);
    let reader = async {
        let mut rbuf = BytesMut::with_capacity(buf_cap);
        let mut scanner = ReplyScanner::new();
        // The front request's replies handed over so far: each reply of a multi-command
        // request (a transaction's) goes to its session as a message of its own as soon as
        // it is scanned, so nobody scans it again; those of one read go in one batch.
        let mut got = 0u32;
        // replies of this read not yet handed over, all for `out_to`
        let (mut out, mut out_to): (VecDeque<Delivery>, Option<ReplyTx>) = (VecDeque::new(), None);
        loop {
            if rbuf.capacity() - rbuf.len() < buf_cap / 4 {
                rbuf.reserve(buf_cap);
            }
            if rd.read_buf(&mut rbuf).await? == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed by peer"));
            }
            // one lock for every reply of this read (the writer does not run meanwhile)
            let mut q = fifo.lock();
            let mut answered = 0usize;
            // an error ends the connection, but only after the replies already taken from
            // the FIFO have been handed over (the rest are failed by the caller)
            let mut failed = None;
            loop {
                let n = match scanner.scan(&rbuf) {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(e) => {
                        failed = Some(std::io::Error::other(e));
                        break;
                    }
                };
                if rbuf[0] == b'>' {
                    // a RESP3 push we did not ask for: dropped
                    rbuf.advance(n);
                    continue;
                }
                let Some(front) = q.front_mut() else {
                    failed = Some(std::io::Error::other("reply with no request"));
                    break;
                };
                if front.select {
                    let frame = rbuf.split_to(n);
                    if frame.first() == Some(&b'-') {
                        warn!(node = %addr, reply = %String::from_utf8_lossy(&frame).trim_end(), "SELECT refused");
                    }
                    q.pop_front();
                    answered += 1;
                    continue;
                }
                if front.prefix != Prefix::None {
                    let frame = rbuf.split_to(n);
                    if front.prefix == Prefix::CachingYes
                        && frame.first() == Some(&b'-')
                        && let Some(t) = &opts.tracking
                    {
                        // the read that follows is not tracked: nothing filled from it may be kept
                        warn!(node = %addr, reply = %String::from_utf8_lossy(&frame).trim_end(), "CLIENT CACHING refused");
                        t.void();
                    }
                    front.prefix = Prefix::None; // this was the prefix's reply
                    continue;
                }
                got += 1;
                if got < front.count {
                    // a reply of a multi-command request, more of its replies to come
                    let tag = Tag { seq: front.tag.seq, part: front.tag.part.wrapping_add(got - 1) };
                    partial.store(got, Ordering::Relaxed);
                    if !out_to.as_ref().is_some_and(|t| Arc::ptr_eq(t, &front.reply_to))
                        && let Some(t) = out_to.replace(front.reply_to.clone())
                    {
                        t.send_all(&mut out);
                    }
                    out.push_back(Delivery::reply(tag, Ok(take_frame(&mut rbuf, n))));
                    continue;
                }
                let inf = q.pop_front().expect("front exists");
                answered += got as usize;
                if got > 1 {
                    partial.store(0, Ordering::Relaxed);
                }
                if crate::metrics::sampled(1, metrics.sample_every) {
                    metrics.duration.record(inf.sent.elapsed().as_secs_f64());
                }
                // consecutive replies for one session (its pipelined requests, written
                // back to back) go to it as one batch: one lock and one wake-up
                if !out_to.as_ref().is_some_and(|t| Arc::ptr_eq(t, &inf.reply_to))
                    && let Some(t) = out_to.replace(inf.reply_to)
                {
                    t.send_all(&mut out);
                }
                // (`got - 1` first: a reply nobody awaits is tagged `u32::MAX`)
                let tag = Tag { seq: inf.tag.seq, part: inf.tag.part.wrapping_add(got - 1) };
                out.push_back(Delivery::reply(tag, Ok(take_frame(&mut rbuf, n))));
                got = 0;
            }
            drop(q);
            if let Some(t) = out_to.take() {
                t.send_all(&mut out);
            }
            if answered > 0 {
                stats.inflight.fetch_sub(answered, Ordering::Relaxed);
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
    };

    // The watchdog: every quarter of the command timeout, the oldest request in flight is
    // looked at. Polled by hand, with the writer and the reader, not as a third branch of
    // `tokio::select!`: its timer is polled once after each reset (which leaves this task's
    // waker with it) and again only once it has fired, where a branch was polled at every
    // wake-up of the connection (about 60 instructions a request at GET -P1, for the
    // timer's registration alone).
    let timeout = opts.command_timeout;
    let tick = (timeout / 4).max(Duration::from_millis(10));
    // (a block: the writer and the reader, which borrow `closed`, end with it)
    let mut timed_out = false;
    let result = {
        let timer = tokio::time::sleep(tick);
        let (mut writer, mut reader, mut timer) =
            (std::pin::pin!(writer), std::pin::pin!(reader), std::pin::pin!(timer));
        let mut timer_polled = false;
        let mut noted = crate::wake::Noted::new();
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = writer.as_mut().poll(cx) {
                return Poll::Ready(r);
            }
            // (on a plain connection the reader is polled only once its socket woke the
            // task: it is not at each of the writer's wake-ups, crate::wake)
            let w = match plain {
                true => noted.to_poll(cx.waker()),
                false => Some(cx.waker()),
            };
            if let Some(w) = w {
                let p = reader.as_mut().poll(&mut std::task::Context::from_waker(w));
                if plain {
                    noted.polled(p.is_pending());
                }
                if let Poll::Ready(r) = p {
                    return Poll::Ready(r);
                }
            }
            // (a dedicated connection has none: its lessee bounds the wait, and a blocked
            // command may wait for ever)
            while !opts.dedicated && (!timer_polled || timer.is_elapsed()) {
                timer_polled = true;
                // (outside the task budget, so that the poll always registers)
                if std::pin::pin!(tokio::task::unconstrained(timer.as_mut())).poll(cx).is_pending() {
                    break;
                }
                if let Some(f) = fifo.lock().front()
                    && f.sent.elapsed() > timeout
                {
                    timed_out = true;
                    return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "command timeout")));
                }
                timer.as_mut().reset(tokio::time::Instant::now() + tick);
                timer_polled = false;
            }
            Poll::Pending
        })
        .await
    };
    if let Err(e) = &result {
        warn!(node = %addr, error = %e, pending = fifo.lock().len(), "backend connection failed");
    } else {
        debug!(node = %addr, "backend connection closing");
    }
    let mut handed = partial.load(Ordering::Relaxed);
    for inf in fifo.lock().drain(..) {
        // (the front request's replies handed over already are not failed)
        let got = std::mem::take(&mut handed);
        stats.inflight.fetch_sub(inf.count as usize, Ordering::Relaxed);
        if inf.select {
            continue;
        }
        let e = if timed_out {
            metrics.err_timeout.increment(inf.count as u64);
            BackendError::Timeout(addr.clone())
        } else {
            metrics.err_lost.increment(inf.count as u64);
            BackendError::Lost(addr.clone())
        };
        let tag = Tag { seq: inf.tag.seq, part: inf.tag.part.wrapping_add(got) };
        fail_all(tag, inf.count - got, &inf.reply_to, &e);
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_taken_whole_and_the_buffer_moves_past_it() {
        let mut rbuf = BytesMut::from(&b"+OK\r\n:1\r\n$3\r\nabc\r\n$-1\r\n:0\r\n+OKAY\r\n"[..]);
        let read = rbuf.as_ptr_range();
        let got: Vec<Bytes> = [5, 4, 9, 5, 4, 7].into_iter().map(|n| take_frame(&mut rbuf, n)).collect();
        let want: [&[u8]; 6] = [b"+OK\r\n", b":1\r\n", b"$3\r\nabc\r\n", b"$-1\r\n", b":0\r\n", b"+OKAY\r\n"];
        assert_eq!(got.iter().map(|b| &b[..]).collect::<Vec<_>>(), want);
        assert!(rbuf.is_empty());
        // the short fixed ones are static, outside the read buffer; the others are cut from it
        let cut: Vec<bool> = got.iter().map(|b| read.contains(&b.as_ptr())).collect();
        assert_eq!(cut, [false, false, true, false, false, true]);
    }
}
