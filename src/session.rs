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
//! complete reply at the front is written in one syscall. A client with `max_pipeline`
//! unanswered commands is not read from until replies drain (its commands wait in the
//! socket, not in memory).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info};

use crate::backend::BackendReply;
use crate::protocol::request::{Limits, Request};
use crate::protocol::{Next, Proto, RequestReader, Writer};
use crate::proxy::{Ctx, Outcome, Pending, Proxy};

/// What the proxy knows about a client connection.
pub struct ClientState {
    pub id: u64,
    pub proto: Proto,
    pub authed: bool,
    pub name: Option<Bytes>,
    pub lib_name: String,
    pub lib_ver: String,
    pub addr: String,
    pub laddr: String,
    pub created: Instant,
    /// QUIT was received: close once its reply is written.
    pub quit: bool,
    /// MULTI was refused: until EXEC or DISCARD, commands are refused too, so what the
    /// client meant as a transaction never half-runs.
    pub refused_multi: bool,
    /// `PROXY AUTH` succeeded on this connection.
    pub admin: bool,
    /// Requests dispatched whose replies are not complete yet.
    pub inflight: u32,
    /// The client parked a LOCK.ACQUIRE ... WAIT or holds KEEPALIVE locks: the lock task
    /// must hear when it leaves.
    pub used_locks: bool,
    /// The client acquired a lock with KEEPALIVE.
    pub keepalive_locks: bool,
    /// This session's handle on the rate limiter.
    pub rl: crate::ratelimit::View,
}

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
    /// The request (for the slow log and big-key log).
    raw: Option<Bytes>,
    /// The node that served it, noted only when it was slow to answer.
    node: Option<Arc<str>>,
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

/// A reply written to the client, kept until the write finished to record it.
struct Done {
    reply: Bytes,
    meta: Meta,
}

/// Serves one client until it disconnects, sends QUIT, breaks the protocol, or the proxy
/// shuts down.
pub async fn run(proxy: Arc<Proxy>, mut stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
    let id = proxy.stats.next_client_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
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
        refused_multi: false,
        admin: false,
        inflight: 0,
        used_locks: false,
        keepalive_locks: false,
        rl: proxy.ratelimit.view(),
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<BackendReply>();
    let mut reader = RequestReader::new(Limits { max_request_bytes: proxy.config.limits.max_request_bytes as usize });
    // Buffers start small, so idle clients cost little, and grow with the traffic.
    let mut rbuf = BytesMut::new();
    let mut wbuf = BytesMut::new();
    let mut scratch = BytesMut::with_capacity(1024);
    // How much room each read gets: doubles (up to 64 KiB) whenever a read fills it.
    let mut read_room = 4 * 1024;
    let mut queue = Queue { entries: VecDeque::with_capacity(64), head: 0 };
    let max_pipeline = proxy.config.limits.max_pipeline;
    let mut reading = true; // false after EOF, QUIT, a protocol error, or shutdown
    let mut read_hint = 0usize;
    let (mut rd, mut wr) = stream.split();

    let mut done: Vec<Done> = Vec::with_capacity(64);
    let mut batch: Vec<Request> = Vec::with_capacity(BATCH);
    // the hash of each batched request's first key (see Limiter::prefetch)
    let mut hashes = [0u64; BATCH];
    let mut read_at = Instant::now();
    let gm = crate::metrics::global();

    loop {
        let can_read = reading && queue.entries.len() < max_pipeline;
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
                    {
                        let mut ctx =
                            Ctx {
                            client: &mut client,
                            seq,
                            reply_to: &tx,
                            scratch: &mut scratch,
                            cmd: e.meta.cmd,
                            now: e.meta.started,
                            cached: false,
                            invalidate: Vec::new(),
                            flush: false,
                            write_epoch: None,
                        };
                        if let Some(reply) = proxy.on_reply(&mut ctx, p, r) {
                            client.inflight -= 1;
                            let m = &mut e.meta;
                            m.ready_at = *now.get_or_insert_with(Instant::now);
                            m.redirected = p.redirected;
                            let slow_us = proxy.live.slowlog_slower_than_us.load(std::sync::atomic::Ordering::Relaxed);
                            if (m.ready_at - m.started).as_micros() as u64 >= slow_us / 4 {
                                m.node = p.node(&proxy.cluster);
                            }
                            e.reply = Reply::Ready(reply);
                        }
                    }
                    next = rx.try_recv().ok();
                }
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
        }

        // Dispatch what is buffered (up to the pipeline limit) and write every complete
        // reply at the front of the queue; repeat while that makes progress.
        let mut last;
        loop {
            let mut parsed = 0;
            while reading && queue.entries.len() < max_pipeline && !rbuf.is_empty() {
                // Parse what a pipelining client sent as one batch (up to BATCH), let the
                // rate limiter bring the batch's budgets into the cache together, then
                // dispatch the requests in order, each one's check reusing the key hash the
                // prefetch computed. (One at a time without a per-key rule: nothing to
                // prefetch.)
                let batch_max = if proxy.ratelimit.prefetching() { BATCH } else { 1 };
                let room = (max_pipeline - queue.entries.len()).min(batch_max);
                let mut failed = None;
                while batch.len() < room && !rbuf.is_empty() {
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
                let more = batch.len() == room && failed.is_none();
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
                    let raw = req.raw().clone();
                    let mut ctx = Ctx {
                        client: &mut client,
                        seq,
                        reply_to: &tx,
                        scratch: &mut scratch,
                        cmd: 0,
                        now: read_at,
                        cached: false,
                        invalidate: Vec::new(),
                        flush: false,
                        write_epoch: None,
                    };
                    let reply = match proxy.dispatch(&mut ctx, req) {
                        Outcome::Ready(b) => Reply::Ready(b),
                        Outcome::Waiting(p) => Reply::Waiting(p),
                    };
                    let (cmd, cached) = (ctx.cmd, ctx.cached);
                    client.rl.forget();
                    if let Reply::Waiting(_) = reply {
                        client.inflight += 1;
                    }
                    push(&mut queue, &mut client, &mut reading, reply, cmd, cached, Some(raw), read_at);
                    parsed += 1;
                }
                if let Some(e) = failed {
                    if reading {
                        info!(client = id, error = %e, "protocol error; closing");
                        Writer::new(&mut scratch, client.proto).error(&format!("ERR {e}"));
                        client.quit = true;
                        let reply = Reply::Ready(scratch.split().freeze());
                        push(&mut queue, &mut client, &mut reading, reply, proxy.unknown_id(), false, None, read_at);
                        parsed += 1;
                    }
                    break;
                }
                if !more {
                    break;
                }
            }
            let wrote;
            match flush(&mut wr, &mut queue, &mut wbuf, &mut done).await {
                Ok((l, write_start, written)) => {
                    last = l;
                    wrote = done.len();
                    for Done { reply, meta: m } in done.drain(..) {
                        let stages = crate::admin::Stages {
                            backend: m.ready_at - m.started,
                            queued: write_start.saturating_duration_since(m.ready_at),
                            write: written - write_start,
                        };
                        proxy.observe(
                            &client,
                            m.cmd,
                            written - m.started,
                            &reply,
                            m.redirected,
                            m.cached,
                            m.raw.as_ref(),
                            m.node.as_deref(),
                            stages,
                        );
                    }
                }
                Err(_) => return finish(&proxy, &client),
            }
            // Stop when nothing moved; writing replies frees room in the queue, so after a
            // write, requests already buffered are parsed even if none were this round.
            if last || (parsed == 0 && wrote == 0) || queue.entries.len() >= max_pipeline {
                break;
            }
        }
        if last || (!reading && queue.entries.is_empty()) {
            break;
        }
    }
    let _ = wr.shutdown().await;
    finish(&proxy, &client);
}

/// How many pipelined requests are parsed before they are dispatched.
const BATCH: usize = 32;

/// Queues a request's reply (or its place for one); a reply that ends the connection stops
/// the reading.
#[allow(clippy::too_many_arguments)]
fn push(
    queue: &mut Queue,
    client: &mut ClientState,
    reading: &mut bool,
    reply: Reply,
    cmd: usize,
    cached: bool,
    raw: Option<Bytes>,
    read_at: Instant,
) {
    let last = client.quit;
    if last {
        *reading = false;
    }
    queue.entries.push_back(Entry {
        reply,
        last,
        meta: Meta { cmd, started: read_at, ready_at: read_at, redirected: false, cached, raw, node: None },
    });
}

fn finish(proxy: &Proxy, client: &ClientState) {
    let id = client.id;
    if client.used_locks {
        proxy.locks.closed(id);
    }
    info!(client = id, "client disconnected");
}

/// Writes every complete reply at the front of the queue, small ones batched into one
/// write, moving them to `done`. Returns whether the connection's last reply was written,
/// and when the write started and finished.
async fn flush(
    wr: &mut tokio::net::tcp::WriteHalf<'_>,
    queue: &mut Queue,
    wbuf: &mut BytesMut,
    done: &mut Vec<Done>,
) -> std::io::Result<(bool, Instant, Instant)> {
    let mut last = false;
    let write_start = Instant::now();
    let mut sent = 0usize;
    while let Some(front) = queue.entries.front() {
        let Reply::Ready(b) = &front.reply else { break };
        sent += b.len();
        if b.len() > 64 * 1024 {
            // large replies go out as they are, without a copy
            if !wbuf.is_empty() {
                wr.write_all(wbuf).await?;
                wbuf.clear();
            }
            wr.write_all(b).await?;
        } else {
            wbuf.extend_from_slice(b);
        }
        let e = queue.entries.pop_front().expect("front exists");
        queue.head += 1;
        last = e.last;
        let Reply::Ready(reply) = e.reply else { unreachable!("checked above") };
        done.push(Done { reply, meta: e.meta });
        if last {
            break;
        }
    }
    if !wbuf.is_empty() {
        wr.write_all(wbuf).await?;
        wbuf.clear();
        if wbuf.capacity() > 1024 * 1024 {
            *wbuf = BytesMut::new();
        }
    }
    if sent > 0 {
        crate::metrics::global().bytes_out.increment(sent as u64);
    }
    Ok((last, write_start, if done.is_empty() { write_start } else { Instant::now() }))
}
