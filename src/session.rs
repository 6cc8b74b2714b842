//! One client connection: read requests, hand each to the request path, and write the
//! replies back strictly in request order.
//!
//! The session is one task. While a per-key rate-limit rule exists, what a client
//! pipelined is parsed as one batch (up to 32 requests), the rate limiter prefetches the
//! batch's budgets (hashing each first key once for the prefetch and the check), and the
//! requests are then dispatched in order; otherwise each request is dispatched as soon as
//! it is parsed. Either way commands for different nodes are in flight together. Each
//! takes a place in the reply queue, and backend replies arrive on the session's own
//! channel tagged with that place. Whenever the front of the queue is complete, every
//! complete reply at the front moves to the output, which is written without ever
//! waiting on the client: a client that does not read stalls only itself, and the session
//! keeps taking replies off its channel and watching its limits meanwhile.
//!
//! Bounds (`[limits]`, README "Security"): a client is not read from while it has
//! `max_pipeline` commands unanswered, more than `max_inflight_request_bytes` of requests
//! in flight, or more than `output_soft_bytes` of replies held; its commands then wait in
//! the socket, not in memory. How many commands it may have in flight also shrinks with
//! the size of its replies (the soft limit divided by their running average), so a
//! pipeline of large replies cannot pile up in a backend either. Held above the soft
//! limit for `output_soft_seconds`, above `output_hard_bytes`, or past the process-wide
//! `output_total_over_soft_bytes`, the client is disconnected. Every request is answered
//! within [`Proxy::reply_deadline`]: a request still waiting then gets an error.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::WriteHalf;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::backend::BackendReply;
use crate::client::{ClientState, Mode};
use crate::pending::{Ctx, Outcome, Pending};
use crate::protocol::request::{Limits, Request};
use crate::protocol::{Next, Proto, RequestReader, Writer};
use crate::proxy::{Answered, Proxy, ReplySummary};

enum Reply {
    Ready(Bytes),
    Waiting(Pending),
}

/// One request's place in the reply queue.
struct Entry {
    reply: Reply,
    /// The connection closes after this reply (QUIT, protocol error).
    last: bool,
    meta: Meta,
}

/// What is recorded about a request once its reply has been written.
struct Meta {
    /// Command id (for statistics).
    cmd: usize,
    /// When the request had been read.
    started: Instant,
    /// When its reply was ready.
    ready_at: Instant,
    redirected: bool,
    /// Answered from the hot-key cache.
    cached: bool,
    /// The request (its context on the reply path; the slow log and big-key log).
    req: Option<Request>,
    /// The argument that is the request's first key (0: none).
    first_key: u32,
    /// The node that served it, noted only when it was slow to answer.
    node: Option<Arc<str>>,
    /// Milliseconds the request may wait on purpose (LOCK.ACQUIRE ... WAIT) on top of
    /// the reply deadline.
    wait_ms: u32,
}

impl Meta {
    fn new(cmd: usize, read_at: Instant, req: Option<Request>) -> Meta {
        Meta {
            cmd,
            started: read_at,
            ready_at: read_at,
            redirected: false,
            cached: false,
            req,
            first_key: 0,
            node: None,
            wait_ms: 0,
        }
    }

    /// When a request still waiting for its reply is answered with an error.
    fn deadline(&self, reply_deadline: Duration) -> Instant {
        self.started + reply_deadline + Duration::from_millis(self.wait_ms as u64)
    }
}

/// The in-order reply queue.
struct Queue {
    entries: VecDeque<Entry>,
    /// Sequence number of `entries[0]`.
    head: u64,
}

impl Queue {
    fn next_seq(&self) -> u64 {
        self.head + self.entries.len() as u64
    }
    fn get_mut(&mut self, seq: u64) -> Option<&mut Entry> {
        let i = seq.checked_sub(self.head)?;
        self.entries.get_mut(i as usize)
    }
}

/// A reply moved to the output, kept (as a summary) until its bytes are written, to
/// record it.
struct Done {
    reply: ReplySummary,
    meta: Meta,
    /// When it moved to the output.
    write_start: Instant,
}

/// Replies on their way to the client: large ones as they are (no copy), small ones
/// coalesced into `tail`, which always comes after every chunk.
#[derive(Default)]
struct Output {
    chunks: VecDeque<Bytes>,
    tail: BytesMut,
}

impl Output {
    fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.tail.is_empty()
    }

    fn push(&mut self, b: Bytes) {
        if b.len() > 64 * 1024 {
            if !self.tail.is_empty() {
                self.chunks.push_back(self.tail.split().freeze());
            }
            self.chunks.push_back(b);
        } else {
            self.tail.extend_from_slice(&b);
        }
    }

    /// Writes what the socket takes now, without waiting. Returns the bytes written and
    /// whether the socket would block.
    fn write(&mut self, wr: &WriteHalf<'_>) -> std::io::Result<(usize, bool)> {
        let mut total = 0;
        while !self.is_empty() {
            let r = if self.chunks.is_empty() {
                wr.try_write(&self.tail)
            } else {
                let mut slices: [IoSlice<'_>; 17] = [IoSlice::new(&[]); 17];
                let mut n = 0;
                for c in self.chunks.iter().take(16) {
                    slices[n] = IoSlice::new(c);
                    n += 1;
                }
                if n < 16 {
                    slices[n] = IoSlice::new(&self.tail);
                    n += 1;
                }
                wr.try_write_vectored(&slices[..n])
            };
            let mut n = match r {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok((total, true)),
                Err(e) => return Err(e),
            };
            total += n;
            while n > 0 {
                match self.chunks.front_mut() {
                    Some(c) if c.len() <= n => {
                        n -= c.len();
                        self.chunks.pop_front();
                    }
                    Some(c) => {
                        c.advance(n);
                        n = 0;
                    }
                    None => {
                        self.tail.advance(n);
                        n = 0;
                    }
                }
            }
        }
        self.tail.clear();
        if self.tail.capacity() > 1024 * 1024 {
            self.tail = BytesMut::new();
        }
        Ok((total, false))
    }
}

/// Why a client was disconnected by its limits (the metric's `reason` label).
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Over `output_hard_bytes`.
    Hard,
    /// Over `output_soft_bytes` for `output_soft_seconds`.
    Soft,
    /// The process-wide `output_total_over_soft_bytes` is spent.
    Total,
}

impl Cut {
    fn reason(self) -> &'static str {
        match self {
            Cut::Hard => "output_hard",
            Cut::Soft => "output_soft",
            Cut::Total => "output_total",
        }
    }
}

/// The bytes one client holds, against its limits.
struct Held {
    /// Reply bytes: complete replies in the queue plus unwritten output.
    replies: usize,
    /// Request bytes read and not yet answered (their replies not yet written).
    requests: usize,
    /// Running average size of this client's replies (1/8 weight for each new one).
    avg_reply: usize,
    /// Commands this client may have unanswered: `max_pipeline`, fewer when its replies
    /// are large (the soft limit divided by `avg_reply`).
    window: usize,
    /// Since when the client has been above the soft limit.
    over_soft_since: Option<Instant>,
    /// What this client added to the process-wide bytes above soft limits.
    counted_over_soft: u64,
}

impl Held {
    fn reply_ready(&mut self, len: usize, soft: usize, max_pipeline: usize) {
        self.replies += len;
        self.avg_reply = self.avg_reply - self.avg_reply / 8 + len / 8;
        self.window = (soft / self.avg_reply.max(1)).clamp(1, max_pipeline);
    }
}

/// Serves one client until it disconnects, sends QUIT, breaks the protocol, exceeds its
/// limits, or the proxy shuts down.
pub async fn run(proxy: Arc<Proxy>, mut stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
    let id = proxy.stats.next_client_id.fetch_add(1, Ordering::Relaxed) + 1;
    let addr = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let laddr = stream.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let _ = stream.set_nodelay(true);
    info!(client = id, %addr, "client connected");
    let mut client = ClientState {
        id,
        proto: Proto::Resp2,
        authed: proxy.config.server.password.is_none(),
        name: None,
        lib_name: String::new(),
        lib_ver: String::new(),
        addr,
        laddr,
        created: Instant::now(),
        quit: false,
        mode: Mode::Normal,
        admin: false,
        inflight: 0,
        used_locks: false,
        keepalive_locks: false,
        rl: proxy.ratelimit.view(),
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<BackendReply>();
    let limits = &proxy.config.limits;
    let mut reader = RequestReader::new(Limits { max_request_bytes: limits.max_request_bytes as usize });
    // Buffers start small, so idle clients cost little, and grow with the traffic.
    let mut rbuf = BytesMut::new();
    let mut out = Output::default();
    let mut scratch = BytesMut::with_capacity(1024);
    // How much room each read gets: doubles (up to 64 KiB) whenever a read fills it.
    let mut read_room = 4 * 1024;
    let mut queue = Queue { entries: VecDeque::with_capacity(64), head: 0 };
    let max_pipeline = limits.max_pipeline;
    let soft = limits.output_soft_bytes as usize;
    let hard = limits.output_hard_bytes as usize;
    let request_budget = limits.max_inflight_request_bytes as usize;
    let reply_deadline = proxy.reply_deadline();
    // Until replies say otherwise, assume each may be 1/32 of the soft limit.
    let mut held = Held {
        replies: 0,
        requests: 0,
        avg_reply: soft / 32,
        window: 32.min(max_pipeline),
        over_soft_since: None,
        counted_over_soft: 0,
    };
    let mut reading = true; // false after EOF, QUIT, a protocol error, or shutdown
    let mut closing = false; // the connection's last reply has moved to the output
    let mut blocked = false; // the last write found the socket full
    let mut read_hint = 0usize;
    let (mut rd, mut wr) = stream.split();

    let mut done: Vec<Done> = Vec::with_capacity(64);
    let mut batch: Vec<Request> = Vec::with_capacity(BATCH);
    // the hash of each batched request's first key (see Limiter::prefetch)
    let mut hashes = [0u64; BATCH];
    let mut read_at = Instant::now();
    let gm = crate::metrics::global();
    // One timer for the request deadlines and the soft limit's duration; armed only while
    // something may expire, so idle clients cost no timer.
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;

    let cut = 'session: loop {
        let room = |queue: &Queue, done: &Vec<Done>, held: &Held| {
            queue.entries.len() + done.len() < held.window && held.replies <= soft && held.requests <= request_budget
        };
        let can_read = reading && room(&queue, &done, &held);
        tokio::select! {
            biased;
            Some(r) = rx.recv() => {
                let mut next = Some(r);
                // one clock read for every reply that completes in this batch
                let mut now: Option<Instant> = None;
                while let Some(r) = next.take() {
                    let seq = r.tag.seq;
                    if let Some(e) = queue.get_mut(seq)
                        && let Reply::Waiting(p) = &mut e.reply
                        && let Some(req) = &e.meta.req
                    {
                        let mut ctx = Ctx::new(&mut client, seq, &tx, &mut scratch, req, e.meta.started);
                        ctx.cmd = e.meta.cmd;
                        if let Some(reply) = crate::pending::on_reply(&proxy, &mut ctx, p, r) {
                            client.inflight -= 1;
                            let m = &mut e.meta;
                            m.ready_at = *now.get_or_insert_with(Instant::now);
                            m.redirected = p.redirected;
                            let slow_us = proxy.live.slowlog_slower_than_us.load(Ordering::Relaxed);
                            if (m.ready_at - m.started).as_micros() as u64 >= slow_us / 4 {
                                m.node = p.node(&proxy.cluster);
                            }
                            held.reply_ready(reply.len(), soft, max_pipeline);
                            e.reply = Reply::Ready(reply);
                        }
                    }
                    next = rx.try_recv().ok();
                }
            }
            res = wr.writable(), if blocked => {
                if res.is_err() {
                    break None;
                }
                blocked = false;
            }
            res = async {
                let want = read_hint.clamp(read_room, 4 * 1024 * 1024);
                if rbuf.capacity() - rbuf.len() < want {
                    rbuf.reserve(want);
                }
                let room = rbuf.capacity() - rbuf.len();
                let n = rd.read_buf(&mut rbuf).await;
                if matches!(n, Ok(n) if n == room) {
                    read_room = (read_room * 2).min(64 * 1024);
                }
                n
            }, if can_read => {
                match res {
                    Ok(n) if n > 0 => {
                        gm.bytes_in.increment(n as u64);
                        read_at = Instant::now();
                    }
                    _ => {
                        debug!(client = id, "client closed its side");
                        reading = false;
                    }
                }
            }
            _ = shutdown.changed(), if reading => {
                reading = false;
            }
            _ = &mut timer, if armed.is_some() => {
                let now = Instant::now();
                if let Some(since) = held.over_soft_since
                    && limits.output_soft_seconds > 0
                    && now >= since + Duration::from_secs(limits.output_soft_seconds)
                {
                    break Some(Cut::Soft);
                }
                armed = expire(&proxy, &mut queue, &mut client, &mut held, &mut scratch, now, reply_deadline, soft, max_pipeline);
                if let Some(t) = armed {
                    timer.as_mut().reset(t.into());
                }
            }
        }

        // Dispatch what is buffered (while the client has room) and write every complete
        // reply at the front of the queue; repeat while that makes progress.
        loop {
            let mut parsed = 0;
            while reading && room(&queue, &done, &held) && !rbuf.is_empty() {
                // Parse what a pipelining client sent as one batch (up to BATCH), let the
                // rate limiter bring the batch's budgets into the cache together, then
                // dispatch the requests in order, each one's check reusing the key hash the
                // prefetch computed. (One at a time without a per-key rule: nothing to
                // prefetch.)
                let batch_max = if proxy.ratelimit.prefetching() { BATCH } else { 1 };
                let space = (held.window - (queue.entries.len() + done.len()).min(held.window)).min(batch_max);
                let mut failed = None;
                while batch.len() < space && !rbuf.is_empty() {
                    match reader.next(&mut rbuf) {
                        Ok(Next::Incomplete { hint }) => {
                            read_hint = hint;
                            break;
                        }
                        Ok(Next::Request(req)) => batch.push(req),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                let more = batch.len() == space && failed.is_none();
                let hashed = if batch.len() > 1 {
                    let first = batch.iter().map(|r| if r.argc() > 1 { r.arg(1) } else { &[][..] });
                    proxy.ratelimit.prefetch(first, &mut hashes)
                } else {
                    0
                };
                for (i, req) in batch.drain(..).enumerate() {
                    if !reading {
                        break; // after QUIT: the rest is never run
                    }
                    if i < hashed && req.argc() > 1 {
                        client.rl.expect(req.arg(1), hashes[i]);
                    }
                    let seq = queue.next_seq();
                    let mut ctx = Ctx::new(&mut client, seq, &tx, &mut scratch, &req, read_at);
                    let outcome = crate::dispatch::dispatch(&proxy, &mut ctx);
                    let mut meta = Meta::new(ctx.cmd, read_at, None);
                    (meta.cached, meta.wait_ms, meta.first_key) = (ctx.cached, ctx.wait_ms, ctx.first_key);
                    let wait_ms = meta.wait_ms;
                    client.rl.forget();
                    let reply = match outcome {
                        Outcome::Ready(b) => {
                            held.reply_ready(b.len(), soft, max_pipeline);
                            Reply::Ready(b)
                        }
                        Outcome::Waiting(p) => {
                            client.inflight += 1;
                            Reply::Waiting(p)
                        }
                    };
                    if matches!(reply, Reply::Waiting(_)) {
                        // armed already for an earlier request (deadlines grow with the
                        // read time), unless this one waits less than a LOCK.ACQUIRE WAIT
                        let deadline = read_at + reply_deadline + Duration::from_millis(wait_ms as u64);
                        if armed.is_none_or(|t| deadline < t) {
                            armed = Some(deadline);
                            timer.as_mut().reset(deadline.into());
                        }
                    }
                    held.requests += req.raw().len();
                    meta.req = Some(req);
                    push(&mut queue, &mut client, &mut reading, reply, meta);
                    parsed += 1;
                }
                if let Some(e) = failed {
                    if reading {
                        info!(client = id, error = %e, "protocol error; closing");
                        Writer::new(&mut scratch, client.proto).error(&crate::errors::protocol(&e));
                        client.quit = true;
                        let b = scratch.split().freeze();
                        held.reply_ready(b.len(), soft, max_pipeline);
                        let reply = Reply::Ready(b);
                        let meta = Meta::new(proxy.unknown_id(), read_at, None);
                        push(&mut queue, &mut client, &mut reading, reply, meta);
                        parsed += 1;
                    }
                    break;
                }
                if !more {
                    break;
                }
            }
            // complete replies at the front of the queue move to the output
            // (the clock is read only when something moves)
            let mut now: Option<Instant> = None;
            let mut moved = 0;
            while !closing && matches!(queue.entries.front(), Some(Entry { reply: Reply::Ready(_), .. })) {
                let e = queue.entries.pop_front().expect("front exists");
                queue.head += 1;
                let Reply::Ready(b) = e.reply else { unreachable!("checked above") };
                let write_start = *now.get_or_insert_with(Instant::now);
                done.push(Done { reply: ReplySummary::of(&b), meta: e.meta, write_start });
                out.push(b);
                closing = e.last;
                moved += 1;
            }
            let mut wrote = 0;
            if !blocked && !out.is_empty() {
                match out.write(&wr) {
                    Ok((n, would_block)) => {
                        wrote = n;
                        blocked = would_block;
                        held.replies -= n;
                        if n > 0 {
                            gm.bytes_out.increment(n as u64);
                        }
                    }
                    Err(_) => break 'session None,
                }
            }
            if out.is_empty() && !done.is_empty() {
                let written = Instant::now();
                for Done { reply, meta: m, write_start } in done.drain(..) {
                    held.requests -= m.req.as_ref().map_or(0, |r| r.raw().len());
                    let stages = crate::stats::Stages {
                        backend: m.ready_at - m.started,
                        queued: write_start.saturating_duration_since(m.ready_at),
                        write: written - write_start,
                    };
                    proxy.observe(
                        &client,
                        Answered {
                            cmd: m.cmd,
                            took: written - m.started,
                            reply,
                            redirected: m.redirected,
                            cached: m.cached,
                            req: m.req.as_ref(),
                            first_key: m.first_key,
                            node: m.node.as_deref(),
                            stages,
                        },
                    );
                }
            }
            // Stop when nothing moved; writing replies frees room in the queue, so after a
            // write, requests already buffered are parsed even if none were this round.
            if closing || (parsed == 0 && moved == 0 && wrote == 0) || !room(&queue, &done, &held) {
                break;
            }
        }

        // the limits
        // A single reply is always delivered, however large (the client asked for it and it
        // is in memory already); the hard limit and the soft limit's duration apply once a
        // client holds more than one. The process-wide total applies to every byte.
        let several = done.len() + queue.entries.len() - client.inflight as usize > 1;
        if held.replies > hard && several {
            break Some(Cut::Hard);
        }
        if let Some(c) = over_soft(&proxy, &mut held, soft, several, limits.output_total_over_soft_bytes) {
            break Some(c);
        }
        if let Some(since) = held.over_soft_since
            && limits.output_soft_seconds > 0
        {
            let at = since + Duration::from_secs(limits.output_soft_seconds);
            if armed.is_none_or(|t| at < t) {
                armed = Some(at);
                timer.as_mut().reset(at.into());
            }
        }
        if (closing && out.is_empty()) || (!reading && queue.entries.is_empty() && out.is_empty()) {
            break None;
        }
    };
    if held.counted_over_soft > 0 {
        proxy.stats.output_over_soft.fetch_sub(held.counted_over_soft, Ordering::Relaxed);
    }
    match cut {
        Some(c) => {
            warn!(
                client = id,
                addr = %client.addr,
                reason = c.reason(),
                reply_bytes = held.replies,
                "client disconnected: over its output limit"
            );
            crate::metrics::global().disconnect(c.reason());
        }
        None => {
            let _ = wr.shutdown().await;
        }
    }
    finish(&proxy, &client);
}

/// Keeps the client's share of the process-wide bytes above soft limits current; says
/// whether the client must go because that total is over its limit.
fn over_soft(proxy: &Proxy, held: &mut Held, soft: usize, several: bool, total_limit: u64) -> Option<Cut> {
    if held.replies <= soft {
        held.over_soft_since = None;
        if held.counted_over_soft > 0 {
            proxy.stats.output_over_soft.fetch_sub(held.counted_over_soft, Ordering::Relaxed);
            held.counted_over_soft = 0;
        }
        return None;
    }
    if several {
        held.over_soft_since.get_or_insert_with(Instant::now);
    } else {
        held.over_soft_since = None;
    }
    let over = (held.replies - soft) as u64;
    let total = if over >= held.counted_over_soft {
        let add = over - held.counted_over_soft;
        proxy.stats.output_over_soft.fetch_add(add, Ordering::Relaxed) + add
    } else {
        let sub = held.counted_over_soft - over;
        proxy.stats.output_over_soft.fetch_sub(sub, Ordering::Relaxed) - sub
    };
    held.counted_over_soft = over;
    (total > total_limit).then_some(Cut::Total)
}

/// Answers every request whose deadline has passed with an error; returns the next
/// deadline of a request still waiting.
#[allow(clippy::too_many_arguments)]
fn expire(
    proxy: &Proxy,
    queue: &mut Queue,
    client: &mut ClientState,
    held: &mut Held,
    scratch: &mut BytesMut,
    now: Instant,
    reply_deadline: Duration,
    soft: usize,
    max_pipeline: usize,
) -> Option<Instant> {
    let mut next: Option<Instant> = None;
    for e in queue.entries.iter_mut() {
        let Reply::Waiting(_) = e.reply else { continue };
        let deadline = e.meta.deadline(reply_deadline);
        if now < deadline {
            next = Some(next.map_or(deadline, |t| t.min(deadline)));
        } else {
            let ms = (deadline - e.meta.started).as_millis();
            Writer::new(scratch, client.proto).error(&crate::errors::expired(ms));
            let b = scratch.split().freeze();
            warn!(
                client = client.id,
                command = proxy.command_name(e.meta.cmd),
                "no reply within the deadline; answered with an error"
            );
            crate::metrics::global().expired.increment(1);
            held.reply_ready(b.len(), soft, max_pipeline);
            client.inflight -= 1;
            e.meta.ready_at = now;
            e.reply = Reply::Ready(b);
        }
    }
    next
}

/// How many pipelined requests are parsed before they are dispatched.
const BATCH: usize = 32;

/// Queues a request's reply (or its place for one); a reply that ends the connection stops
/// the reading.
fn push(queue: &mut Queue, client: &mut ClientState, reading: &mut bool, reply: Reply, meta: Meta) {
    let last = client.quit;
    if last {
        *reading = false;
    }
    queue.entries.push_back(Entry { reply, last, meta });
}

fn finish(proxy: &Proxy, client: &ClientState) {
    let id = client.id;
    if client.used_locks {
        proxy.locks.closed(id);
    }
    info!(client = id, "client disconnected");
}
