//! One client connection: read requests, hand each to the request path, and write the
//! replies back strictly in request order. Each request's context
//! ([`crate::path::pending::Ctx`]) is built here once, and the parsed request stays with its
//! place in the reply queue, so the reply path and the statistics never parse it again.
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
//! Bounds (`[limits]`, docs/security.md): a client is not read from while it has
//! `max_pipeline` commands unanswered, more than `max_inflight_request_bytes` of requests
//! in flight, or more than `output_soft_bytes` of replies held; its commands then wait in
//! the socket, not in memory. How many commands it may have in flight also shrinks with
//! the size of its replies (the soft limit divided by their running average), so a
//! pipeline of large replies cannot pile up in a backend either. Held above the soft
//! limit for `output_soft_seconds`, above `output_hard_bytes`, or past the process-wide
//! `output_total_over_soft_bytes`, the client is disconnected. Every request is answered
//! within [`Proxy::reply_deadline`]: a request still waiting then gets an error.

use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use crate::conn::{ClientInfo, ClientState, Control, Mode, ReplyMode};
use crate::mailbox::{BackendReply, Delivery, ReplyTx};
use crate::path::pending::{Ctx, Outcome, Pending};
use crate::protocol::request::{Limits, Request};
use crate::protocol::{Next, Proto, RequestReader, Writer};
use crate::proxy::{Answered, Proxy, ReplySummary};
use crate::upstream::retry;

mod io;
mod limits;
mod ordering;
mod output;
mod queue;

use io::{ReadSide, WriteSide};
use limits::{Cut, Held};
use ordering::Unrun;
use output::Output;
use queue::{Entry, Meta, Queue, Reply};

/// One client connection's state between socket events; [`run`] owns the sockets and
/// the timer, and calls the steps below. Its fields are grouped by the phase that owns
/// them (docs/architecture.md, "One way in").
///
/// Aligned to a cache line: the session lives inside its task's future, at an offset that
/// moves with whatever else that future holds, and where its hot fields fall across cache
/// lines then moved with unrelated changes (one that added a local to the connection's
/// start measured 2-3% at GET -P16; docs/design/performance.md).
#[repr(align(64))]
struct Session {
    // -- Who and where: the client, the proxy it talks through, where its replies come back.
    proxy: Arc<Proxy>,
    client: ClientState,
    /// Where backend replies for this client's requests are sent.
    tx: ReplyTx,
    scratch: BytesMut,
    // -- Read: the socket's requests, parsed, and when they came.
    reader: RequestReader,
    /// The hash of each batched request's first key (see `Limiter::prefetch`).
    hashes: [u64; BATCH],
    /// When the last read completed (the read time of what it brought).
    read_at: Instant,
    /// `read_at` in milliseconds since heatshield started (what CLIENT LIST shows), worked
    /// out once per read rather than for each request it brought.
    read_ms: u64,
    /// The time of this wake-up, read once, by the first that needs it: a read (its
    /// requests' start), the first reply that completes (its ready time), the first reply
    /// moved to the output. At -P1 each took its own clock read, four a request with the
    /// write's; the write's own (after the socket took it) stays apart.
    clock: Option<Instant>,
    /// The size of the request being read, when the reader knows it.
    read_hint: usize,
    /// False after EOF, QUIT, a protocol error, or shutdown.
    reading: bool,
    // -- Admit and dispatch: what may go now, in the client's order (crate::conn::order).
    /// None of `deferred`, `retrying` and `unrun` holds anything: the usual case, one
    /// test on the request path ([`Session::recalm`] keeps it).
    calm: bool,
    /// The place in the queue of a blocking command waiting for its reply: until it
    /// comes, no later request is dispatched (as in Redis, a blocked client's next
    /// commands wait), but the socket is still read so a disconnect is seen.
    blocking: Option<u64>,
    /// The first request waiting for the ordering rule (every request after it waits
    /// too): dispatched once nothing is in flight or being retried ([`crate::conn::order`]).
    deferred: Option<u64>,
    /// Requests (by place, in order) that met a reply that was not their answer and are
    /// being sent again: until each has its answer, no later request is dispatched, and
    /// a later request's non-answers wait in `parked` ([`crate::conn::order`]).
    retrying: SmallVec<[u64; 4]>,
    /// Backend replies held while an earlier request is being retried, in arrival order.
    parked: Vec<BackendReply>,
    /// A TRYAGAIN or NOSCRIPT held until the requests sent behind it have their replies.
    unrun: Option<Unrun>,
    /// A parked reply is being handed over ([`crate::path::pending::Ctx::behind_retry`]).
    behind_retry: bool,
    // -- Name: colocation's names, to the cluster's form on the way in and back on the way out.
    /// The colocation rules last seen, by generation (`crate::services::colocate`).
    colocate: Option<(u64, Arc<crate::services::colocate::Rules>)>,
    /// The requests whose replies name keys a colocation rule may have renamed, by
    /// place, in order: shown with the client's names when written (`output.rs`).
    fixes: Vec<(u64, Box<crate::services::colocate::ReplyFix>)>,
    /// The requests colocation renamed, as the client sent them, by place, in order
    /// (admission and the records judge these: `Ctx::asked`).
    asked: Vec<(u64, Box<Request>)>,
    /// The fixes of the commands queued in the open transaction, by their place in it:
    /// EXEC's reply takes them.
    tx_fixes: Vec<(u32, crate::services::colocate::ReplyFix)>,
    // -- Answer: one place per request in the client's order, then the socket.
    queue: Queue,
    out: Output,
    /// Pushes (invalidations, messages) that follow the reply of a tracking client's write
    /// still in flight, by that write's place (see [`Session::pushed`]).
    after_write: Vec<(u64, Bytes)>,
    /// The place of the last tracked write that got its reply (see [`Session::pushed`]).
    last_tracked_write: Option<u64>,
    /// The connection's last reply has moved to the output.
    closing: bool,
    /// The last write found the socket full.
    blocked: bool,
    /// CLIENT KILL from another connection: close now.
    killed: bool,
    /// Shutdown while a blocking command waits (its reply may never come): close now.
    stopped_blocked: bool,
    // -- Limits: the bytes the client holds against `[limits]`, and the timer they may arm.
    /// `[limits]` as they were when the client connected (a reload applies to later
    /// connections).
    limits: Arc<crate::config::LimitsConfig>,
    held: Held,
    soft: usize,
    hard: usize,
    /// Reply bytes held at or below which no byte limit can apply (the least of them).
    unlimited_below: usize,
    max_pipeline: usize,
    request_budget: usize,
    reply_deadline: Duration,
    /// When something may expire next (a request's deadline, the soft limit's duration);
    /// `None`: nothing can, so idle clients cost no timer.
    armed: Option<Instant>,
}

/// What woke a session's loop.
enum Woke {
    /// A backend reply, a push or a control message on the session's channel.
    Delivery(Delivery),
    /// The client's socket takes writes again (or failed).
    Writable(std::io::Result<()>),
    /// The client sent bytes (0: it closed its side).
    Read(std::io::Result<usize>),
    /// A request's deadline or a limit's duration may have passed.
    Timer,
}

/// The time of a batch of backend replies, read once for all of them.
struct ReplyClock {
    now: Instant,
    /// A request started at or before this may reach the slow log (a quarter of
    /// `slowlog-log-slower-than` before `now`): its node is noted for the log's entry.
    slow_from: Option<Instant>,
}

impl ReplyClock {
    fn new(proxy: &Proxy, now: Instant) -> ReplyClock {
        let slow_us = proxy.live.slowlog_slower_than_us.load(Ordering::Relaxed);
        ReplyClock { now, slow_from: now.checked_sub(Duration::from_micros(slow_us / 4)) }
    }
}

/// A client's connection, as accepted: plain, or TLS after its handshake.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<crate::tls::ServerStream>),
}

/// The client's and heatshield's addresses of a connection.
fn addrs(s: &TcpStream) -> (String, String) {
    let addr = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let laddr = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
    (addr, laddr)
}

/// Serves one client until it disconnects, sends QUIT, breaks the protocol, exceeds its
/// limits, or the proxy shuts down. A plain connection is read and written through the
/// socket's own halves; a TLS one through the halves of its TLS stream (the same loop,
/// made twice by the compiler).
pub async fn run(proxy: Arc<Proxy>, stream: Stream, stopping: Arc<AtomicBool>) {
    match stream {
        Stream::Plain(mut stream) => {
            let _ = stream.set_nodelay(true);
            let addrs = addrs(&stream);
            let cut = {
                let (rd, wr) = stream.split();
                serve(proxy, addrs, (false, None), &mut ReadSide::Plain(rd), &mut WriteSide::Plain(wr), stopping).await
            };
            if cut.is_none() {
                let _ = stream.shutdown().await;
            }
        }
        Stream::Tls(stream) => {
            let _ = stream.get_ref().0.set_nodelay(true);
            let addrs = addrs(stream.get_ref().0);
            // the user a verified client certificate names (tls.auth_clients_user)
            let cert_user = proxy.config.tls.cert_user().map(|f| crate::tls::cert_user_name(stream.get_ref().1, f));
            let (rd, wr) = tokio::io::split(*stream);
            let mut wr = WriteSide::Tls(wr);
            let cut = serve(proxy, addrs, (true, cert_user), &mut ReadSide::Tls(rd), &mut wr, stopping).await;
            if let (None, WriteSide::Tls(wr)) = (cut, &mut wr) {
                // (close_notify, then the socket's shutdown: bounded, since a client that
                // reads nothing more would leave the alert unwritten for ever)
                let _ = tokio::time::timeout(Duration::from_secs(1), wr.shutdown()).await;
            }
        }
    }
}

/// `tls`: whether the client came over TLS, and when `tls.auth_clients_user` is on, the
/// user name its certificate gives (`Some(None)`: on, and no such field).
async fn serve(
    proxy: Arc<Proxy>,
    (addr, laddr): (String, String),
    tls: (bool, Option<Option<String>>),
    rd: &mut ReadSide<'_>,
    wr: &mut WriteSide<'_>,
    stopping: Arc<AtomicBool>,
) -> Option<Cut> {
    let (tx, mut rx) = crate::mailbox::reply_channel();
    let mut s = Session::new(proxy, addr, laddr, tls, tx);
    let id = s.client.id;
    // The server tells every registered client of a shutdown on its reply channel
    // (`Control::Shutdown`), after setting `stopping`: a session registered too late for
    // that sees the flag here.
    if stopping.load(Ordering::Acquire) {
        s.stop();
    }
    // Buffers start small, so idle clients cost little, and grow with the traffic.
    let mut rbuf = BytesMut::new();
    // How much room each read gets: doubles (up to 64 KiB) whenever a read fills it.
    let mut read_room = 4 * 1024;
    let gm = crate::metrics::global();
    // One timer for the request deadlines and the soft limit's duration, set to
    // `Session::armed` whenever that changes.
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    let mut timer_at: Option<Instant> = None;
    // (the timer is polled once after each reset, and again only once it has fired)
    let mut timer_polled = false;
    // The last read found nothing and left this task's waker with the socket: until the
    // socket is reported readable, a wake-up for anything else need not read (at -P1 the
    // one after each reply did, and found nothing, about 160 instructions a request).
    let mut read_waiting = false;

    let cut = 'session: loop {
        // while blocked: read on (a little), to see the client leave
        // (while a migration's cutover holds requests, nothing read is dispatched: reading
        // stops at 64 KiB buffered, so a client cannot grow the buffer for the hold's length)
        let can_read = s.reading
            && ((s.room() && (rbuf.len() < 64 * 1024 || !s.proxy.migration.held()))
                || (s.blocking.is_some() && rbuf.len() < 64 * 1024));
        let want = s.read_hint.clamp(read_room, 4 * 1024 * 1024);
        // What woke the session, looked at in this order (a reply first: it may free
        // room before more is read). Polled by hand, not by `tokio::select!`, whose
        // branch bookkeeping and the receive's own future were about 175 instructions
        // of a request at -P1.
        let blocked = s.blocked;
        let read_hint = s.read_hint;
        let timer_on = timer_at.is_some();
        let woke = std::future::poll_fn(|cx| {
            if let Poll::Ready(Some(d)) = rx.poll_recv(cx) {
                return Poll::Ready(Woke::Delivery(d));
            }
            if blocked && let Poll::Ready(r) = wr.poll_writable(cx) {
                return Poll::Ready(Woke::Writable(r));
            }
            if can_read && (!read_waiting || rd.may_have_news()) {
                // Room for `want` bytes, but a buffer with a quarter of that free is read
                // into as it is: the requests split off it share it while in flight, so
                // reserving more makes a new buffer (two allocations, the second when the
                // first request is split off), which per read was one pair per request
                // at -P1. A request known to need more gets its room at once.
                let low = if read_hint > 0 { want } else { want / 4 };
                if rbuf.capacity() - rbuf.len() < low {
                    rbuf.reserve(want);
                }
                let room = rbuf.capacity() - rbuf.len();
                if let Poll::Ready(n) = std::pin::pin!(rd.read_buf(&mut rbuf)).poll(cx) {
                    if matches!(n, Ok(n) if n == room) {
                        read_room = (read_room * 2).min(64 * 1024);
                    }
                    read_waiting = false;
                    return Poll::Ready(Woke::Read(n));
                }
                // (not when the task's budget ran out: the read then left no waker, and
                // the task woke itself to go on)
                read_waiting = tokio::task::coop::has_budget_remaining();
            }
            // The timer is polled once after each reset, which leaves this task's waker
            // with it (outside the task budget, so that poll always registers), and again
            // only once it has fired: not on every wake-up, where its poll was about 3%
            // of the instructions of a request at -P1. (Tested at every poll, not once
            // before waiting: a timer that fires while the session waits here wakes it.)
            if timer_on && (!timer_polled || timer.is_elapsed()) {
                timer_polled = true;
                if std::pin::pin!(tokio::task::unconstrained(timer.as_mut())).poll(cx).is_ready() {
                    return Poll::Ready(Woke::Timer);
                }
            }
            Poll::Pending
        })
        .await;
        s.clock = None;
        match woke {
            Woke::Delivery(d) => s.take_replies(d, &mut rx),
            Woke::Writable(res) => {
                if res.is_err() {
                    break None;
                }
                s.blocked = false;
            }
            // (the result taken out whole: a match on `Woke::Read(Ok(n))` left the value
            // to be dropped after the match, a call of its drop glue at every read)
            Woke::Read(read) => match read {
                Ok(n) if n > 0 => {
                    gm.bytes_in.increment(n as u64);
                    s.read_at = *s.clock.insert(Instant::now());
                    s.read_ms = (s.read_at - s.proxy.started).as_millis() as u64;
                }
                _ => {
                    debug!(client = id, "client closed its side");
                    s.reading = false;
                    if s.blocking.is_some() {
                        // Gone while blocked: its dedicated connection is closed (with the
                        // request), so Redis forgets the blocked client and takes no
                        // element for it.
                        break None;
                    }
                }
            },
            Woke::Timer => {
                timer_at = None;
                if let Some(c) = s.on_timer(Instant::now()) {
                    break Some(c);
                }
            }
        }

        // Dispatch what is buffered (while the client has room) and write every complete
        // reply at the front of the queue; repeat while that makes progress.
        loop {
            s.resume();
            // (nothing buffered, after a reply at -P1: not called, its set-up and exit
            // were about 30 instructions a request)
            if rbuf.is_empty() {
                s.read_hint = 0;
            } else {
                s.dispatch_buffered(&mut rbuf);
            }
            let moved = s.move_ready();
            // (a waker that does nothing: a write that cannot go on now sets `blocked`,
            // and the writable branch above waits with the task's own)
            let wrote = match s.write(wr, &mut std::task::Context::from_waker(std::task::Waker::noop())) {
                Ok(n) => n,
                Err(_) => break 'session None,
            };
            s.record_written();
            // Another round only parses more: worth it when this one freed room (a reply
            // moved or written) and requests are buffered. Parsing alone frees none, and
            // what it made ready was moved and written in this round; a request it made
            // wait waits for a reply, which wakes the wait above (a round more was one in
            // four of the rounds a request took at -P1, for nothing).
            if s.closing || (moved == 0 && wrote == 0) || rbuf.is_empty() || !s.room() {
                break;
            }
        }
        if let Some(c) = s.check_limits() {
            break Some(c);
        }
        if s.killed {
            info!(client = id, "client killed (CLIENT KILL)");
            break None;
        }
        if s.stopped_blocked {
            break None;
        }
        if s.armed != timer_at {
            if let Some(t) = s.armed {
                timer.as_mut().reset(t.into());
                timer_polled = false;
            }
            timer_at = s.armed;
        }
        if (s.closing && s.out.is_empty()) || (!s.reading && s.queue.entries.is_empty() && s.out.is_empty()) {
            break None;
        }
    };
    if s.client.inflight > 0 {
        // (gone with requests in flight: a cutover does not wait for their replies)
        s.client.inflight = 0;
        landed(&s.proxy, 0);
    }
    s.end(cut);
    cut
}

/// A request was answered (`inflight`: the session's requests in flight now): when it was
/// the last, a migration's cutover waiting for every session's requests to land is told
/// (crate::services::migration::gate).
#[inline]
fn landed(proxy: &Proxy, inflight: u32) {
    if inflight == 0 && proxy.migration.configured() {
        proxy.migration.gate.busy(-1);
    }
}

/// While a migration shadows requests: this one, answered by the source with `reply`, is
/// offered to the target too (crate::services::migration::shadow).
#[cold]
fn shadow(proxy: &Proxy, req: &Request, reply: &Bytes) {
    if let Ok(cmd) = proxy.commands.lookup(req) {
        proxy.migration.shadow.offer(cmd, req, reply);
    }
}

/// [`Session::colocate_batch`] for one request that may name a rule's key: `seq` is the
/// place it takes. Its form as the client sent it goes to `asked` if it was renamed, and
/// its reply's fix to `fixes`.
#[inline(never)]
fn colocate_request(
    proxy: &Proxy,
    rules: &crate::services::colocate::Rules,
    asked: &mut Vec<(u64, Box<Request>)>,
    fixes: &mut Vec<(u64, Box<crate::services::colocate::ReplyFix>)>,
    seq: u64,
    req: &mut Request,
) {
    if !rules.may_touch(req) && !crate::command::may_name_keys(req.arg(0)) {
        return;
    }
    let Ok(cmd) = proxy.commands.lookup(req) else { return };
    let shas = &proxy.colocate.shas;
    if cmd.names == crate::command::NamesInReply::Script {
        // the body as the client knows it (its SHA1 is the client's): SCRIPT EXISTS and a
        // NOSCRIPT met by a call that needs no shim find it
        proxy.scripts.note(&cmd.name, req);
        // a loaded script: its shimmed body, for an EVALSHA with a rule's keys
        if cmd.name == "SCRIPT|LOAD" && req.argc() == 3 {
            let shim = crate::services::colocate::loaded(rules, shas, req.arg(2));
            let load = Request::from_args(&[&b"SCRIPT"[..], b"LOAD", &shim]);
            proxy.scripts.note(&cmd.name, &load);
        }
    }
    let (new, fix) = crate::services::colocate::on_the_way_in(rules, shas, cmd, req.clone());
    if new.raw() != req.raw() {
        asked.push((seq, Box::new(std::mem::replace(req, new))));
    } else {
        *req = new;
    }
    if let Some(fix) = fix {
        fixes.push((seq, fix));
    }
}

/// Request `seq` as the client sent it, if colocation renamed it.
#[inline]
fn asked_form(asked: &[(u64, Box<Request>)], seq: u64) -> Option<&Request> {
    if asked.is_empty() {
        return None;
    }
    asked.iter().find(|(s, _)| *s == seq).map(|(_, r)| &**r)
}

/// The enabled user a client certificate names (`name`: its field, if it has one), or
/// None (counted and logged by the reason).
fn cert_login(proxy: &Proxy, client: u64, addr: &str, name: Option<String>) -> Option<Arc<crate::services::acl::User>> {
    let m = crate::metrics::global();
    let Some(name) = name else {
        m.tls_cert_login(crate::metrics::CertLogin::NoField);
        proxy.audit.cert_login(client, addr, None, false, "no such field in the certificate");
        info!(client, "client certificate without the field tls.auth_clients_user names: the default user");
        return None;
    };
    match proxy.users.get(&name) {
        Some(u) if u.perms().enabled => {
            m.tls_cert_login(crate::metrics::CertLogin::User);
            proxy.audit.cert_login(client, addr, Some(&name), true, "");
            info!(client, user = %name, "logged in by its client certificate");
            Some(u)
        }
        found => {
            let why =
                if found.is_some() { crate::metrics::CertLogin::Disabled } else { crate::metrics::CertLogin::Unknown };
            m.tls_cert_login(why);
            proxy.audit.cert_login(client, addr, Some(&name), false, why.label());
            info!(client, user = %name, reason = why.label(), "client certificate names no enabled user: the default user");
            None
        }
    }
}

impl Session {
    fn new(
        proxy: Arc<Proxy>,
        addr: String,
        laddr: String,
        (tls, cert): (bool, Option<Option<String>>),
        tx: ReplyTx,
    ) -> Session {
        let id = proxy.stats.next_client_id.fetch_add(1, Ordering::Relaxed) + 1;
        info!(client = id, %addr, tls, "client connected");
        let info = Arc::new(ClientInfo::new(id, addr, laddr, tx.clone()));
        proxy.clients.add(info.clone());
        // logged in as `default` from the start if it needs no password, as on Redis; as
        // the user its certificate names, if tls.auth_clients_user says so and that user
        // is enabled (as on Valkey, the default user otherwise)
        let (user, authed) = match cert.map(|name| cert_login(&proxy, id, &info.addr, name)) {
            Some(Some(u)) => {
                info.names.lock().user = (u.name != "default").then(|| u.name.clone());
                (u, true)
            }
            _ => {
                let d = proxy.users.default_user();
                let p = d.perms();
                let authed = p.enabled && p.nopass;
                drop(p);
                (d, authed)
            }
        };
        let client = ClientState {
            id,
            proto: Proto::Resp2,
            authed,
            user,
            perms_seen: None,
            info,
            reply: ReplyMode::On,
            no_evict: false,
            no_touch: false,
            quit: false,
            modes: Default::default(),
            admin: false,
            inflight: 0,
            lane: crate::conn::order::Lane::Local,
            map_version: 0,
            used_locks: false,
            keepalive_locks: false,
            rl: proxy.ratelimit.view(),
            wrote: 0,
            db: 0,
            last_write_ms: 0,
        };
        let limits = proxy.limits.load_full();
        let soft = limits.output_soft_bytes as usize;
        let max_pipeline = limits.max_pipeline;
        Session {
            client,
            tx,
            scratch: BytesMut::with_capacity(1024),
            reader: RequestReader::new(Limits { max_request_bytes: limits.max_request_bytes as usize }),
            // the queue and the batch grow with the client's pipelining (an entry is 400
            // bytes: 64 made up front were 25 KiB for every idle client or subscriber)
            queue: Queue { entries: VecDeque::new(), head: 0, sent: 0 },
            out: Output::default(),
            // Until replies say otherwise, assume each may be 1/32 of the soft limit.
            held: Held {
                replies: 0,
                requests: 0,
                avg_reply: soft / 32,
                window: 32.min(max_pipeline),
                over_soft_since: None,
                counted_over_soft: 0,
                over_pubsub_soft_since: None,
            },
            hashes: [0u64; BATCH],
            read_at: Instant::now(),
            read_ms: proxy.started.elapsed().as_millis() as u64,
            clock: None,
            read_hint: 0,
            reading: true,
            closing: false,
            blocked: false,
            blocking: None,
            deferred: None,
            retrying: SmallVec::new(),
            parked: Vec::new(),
            unrun: None,
            colocate: None,
            asked: Vec::new(),
            fixes: Vec::new(),
            tx_fixes: Vec::new(),
            calm: true,
            after_write: Vec::new(),
            last_tracked_write: None,
            behind_retry: false,
            killed: false,
            stopped_blocked: false,
            armed: None,
            soft,
            hard: limits.output_hard_bytes as usize,
            unlimited_below: [
                soft as u64,
                limits.output_hard_bytes,
                limits.pubsub_output_soft_bytes,
                limits.pubsub_output_hard_bytes,
            ]
            .into_iter()
            .min()
            .unwrap_or(0) as usize,
            max_pipeline,
            request_budget: limits.max_inflight_request_bytes as usize,
            limits: limits.clone(),
            reply_deadline: proxy.reply_deadline(),
            proxy,
        }
    }

    /// The client may send more now: fewer commands unanswered than its window, and its
    /// reply and request bytes within their limits.
    fn room(&self) -> bool {
        self.queue.entries.len() < self.held.window
            && self.blocking.is_none()
            && self.calm
            && self.held.replies <= self.soft
            && self.held.requests <= self.request_budget
    }

    /// Hands `first` and every backend reply already waiting to their requests; a request
    /// whose reply is complete becomes ready.
    fn take_replies(&mut self, first: Delivery, rx: &mut crate::queue::Receiver<Delivery>) {
        let mut next = Some(first);
        // one clock read for every reply that completes in this batch
        let mut now: Option<ReplyClock> = None;
        while let Some(d) = next.take() {
            match d {
                Delivery::Reply(r) => self.take_reply(r, &mut now),
                Delivery::Push(b) => self.pushed(b),
                Delivery::Control(c) => self.control(c),
            }
            next = rx.try_recv();
        }
    }

    /// A pub/sub message for this client: after every reply to what it sent before the
    /// message came (straight to the output when nothing is waiting), never counted as a
    /// command.
    fn pushed(&mut self, b: Bytes) {
        // a key's name as the client knows it (crate::services::colocate)
        let b = match self.proxy.colocate.active() {
            true => self.proxy.colocate.restore_push(&b).unwrap_or(b),
            false => b,
        };
        // While a tracking client's write is in flight, a push waits to follow that write's
        // reply: Redis tells a client of its own write right after the reply (so the
        // reply to a read sent next comes after it), and any other push may come then too.
        if self.client.modes.tracking.is_some() {
            // a tracked write answered and not yet written out: right after its reply (it
            // may be what the push tells of: heatshield's invalidation connection can hear
            // of the write before its reply is taken)
            let unsent = self.queue.head + self.queue.sent as u64;
            if let Some(w) = self.last_tracked_write.filter(|&w| w >= unsent)
                && let Some(Entry { reply: Reply::Ready(r), .. }) = self.queue.get_mut(w)
            {
                *r = [&r[..], &b[..]].concat().into();
                self.held.replies += b.len();
                return;
            }
            // else after the first tracked write in flight (counted against the client's
            // limits while it waits)
            if let Some(i) =
                self.queue.entries.iter().position(|e| matches!(&e.reply, Reply::Waiting(p) if p.tracked_write()))
            {
                self.held.replies += b.len();
                self.after_write.push((self.queue.head + i as u64, b));
                return;
            }
        }
        self.held.replies += b.len();
        if self.queue.sent == self.queue.entries.len() {
            self.out.push(b);
        } else {
            let mut meta = Meta::new(PUSH_CMD, self.read_at, None);
            meta.ready_at = meta.started;
            self.queue.entries.push_back(Entry { reply: Reply::Ready(b), last: false, silent: false, meta });
        }
    }

    /// The pushes that waited for request `seq`, which was answered otherwise (its
    /// deadline, CLIENT UNBLOCK): queued as they would have been.
    fn release_pushes(&mut self, seq: u64) {
        if self.after_write.iter().any(|(s, _)| *s == seq) {
            let (mine, rest): (Vec<_>, Vec<_>) =
                std::mem::take(&mut self.after_write).into_iter().partition(|(s, _)| *s == seq);
            self.after_write = rest;
            for (_, b) in mine {
                self.held.replies -= b.len();
                self.pushed(b);
            }
        }
    }

    /// Hands one backend reply to its request. While an earlier request is being
    /// retried, a later request's non-answers wait for it ([`Session::hold`]); a TRYAGAIN
    /// or NOSCRIPT waits for the replies of the requests sent behind it ([`Unrun`]).
    fn take_reply(&mut self, r: BackendReply, now: &mut Option<ReplyClock>) {
        // the usual reply: nothing of the ordering rule's to look at (an answer, or an
        // error that did run)
        if self.calm && (matches!(&r.result, Ok(d) if d.first() != Some(&b'-')) || !retry::ran_nothing(&r.result)) {
            return self.deliver(r, now, false);
        }
        self.take_reply_ordered(r, now);
        self.recalm();
    }

    /// Keeps [`Session::calm`] true exactly when nothing waits for the ordering rule.
    fn recalm(&mut self) {
        self.calm = self.deferred.is_none() && self.retrying.is_empty() && self.unrun.is_none();
    }

    /// Hands reply `r` to its request: retried, followed or passed on as
    /// [`crate::path::pending::on_reply`] says, or (`as_is`) taken as its answer.
    #[inline(always)]
    fn deliver(&mut self, r: BackendReply, now: &mut Option<ReplyClock>, as_is: bool) {
        let seq = r.tag.seq;
        let mut retried = false;
        let mut done = false;
        if let Some(e) = self.queue.get_mut(seq)
            && let Reply::Waiting(p) = &mut e.reply
            && let Some(req) = &e.meta.req
        {
            let reply = match crate::path::pending::plain_reply(&self.proxy, p, r) {
                Ok(reply) => Some(reply),
                Err(r) => {
                    retried = retry::may_not_answer(&r.result) && !as_is;
                    let asked = asked_form(&self.asked, seq).unwrap_or(req);
                    let mut ctx =
                        Ctx::new(&mut self.client, seq, &self.tx, &mut self.scratch, req, asked, e.meta.started);
                    ctx.cmd = e.meta.cmd;
                    ctx.writes = e.meta.writes;
                    ctx.behind_retry = self.behind_retry;
                    if as_is {
                        crate::path::pending::answer_as_is(&self.proxy, &mut ctx, p, r)
                    } else {
                        crate::path::pending::on_reply(&self.proxy, &mut ctx, p, r)
                    }
                }
            };
            if let Some(reply) = reply {
                self.client.inflight -= 1;
                landed(&self.proxy, self.client.inflight);
                if self.proxy.migration.configured() && self.proxy.migration.shadow.on() {
                    shadow(&self.proxy, req, &reply);
                }
                let m = &mut e.meta;
                let clock = now
                    .get_or_insert_with(|| ReplyClock::new(&self.proxy, *self.clock.get_or_insert_with(Instant::now)));
                m.ready_at = clock.now;
                if m.writes && self.proxy.reads.active() {
                    // (read-your-writes: crate::services::reads)
                    self.client.last_write_ms = crate::upstream::backend::clock_ms(clock.now);
                }
                m.redirected = p.redirected();
                if clock.slow_from.is_some_and(|t| m.started <= t) {
                    m.node = p.node(&self.proxy.cluster);
                }
                let mut reply = reply;
                if self.client.modes.tracking.is_some() {
                    if !self.after_write.is_empty() {
                        // the pushes that waited for this write's reply follow it
                        let mut all = reply.to_vec();
                        self.after_write.retain(|(s, b)| {
                            if *s == seq {
                                all.extend_from_slice(b);
                            }
                            *s != seq
                        });
                        self.held.replies -= all.len() - reply.len();
                        reply = Bytes::from(all);
                    }
                    if p.tracked_write() {
                        self.last_tracked_write = Some(seq);
                    }
                }
                self.held.reply_ready(reply.len(), self.soft, self.max_pipeline);
                e.reply = Reply::Ready(reply);
                if self.blocking == Some(seq) {
                    self.blocking = None;
                }
                done = true;
            }
        }
        if done {
            if self.calm {
                return;
            }
            if let Some(t) = &self.unrun
                && seq > t.seq
                && !t.ran
                && self.touches(seq, t.seq)
                && let Some(t) = &mut self.unrun
            {
                t.ran = true;
            }
            self.settled(seq, now);
        } else if retried {
            // a non-answer, and the request goes on: it is being retried (or waits for
            // its other parts, which holds the client's next requests just as well)
            self.mark_retrying(seq);
        }
    }

    /// Parses and dispatches what `rbuf` holds while the client has room.
    fn dispatch_buffered(&mut self, rbuf: &mut BytesMut) {
        // what the request still incomplete needs, once one is (see `run`'s read)
        self.read_hint = 0;
        // one look at the slot map for this wake-up's requests (crate::path::pending::TopoRef)
        let mut view: Option<crate::upstream::cluster::TopologyView> = None;
        // (while a migration's cutover holds requests, crate::services::migration::gate,
        // none is dispatched; the session is told when they may go on)
        while self.reading && self.room() && !rbuf.is_empty() && !self.proxy.migration.held() {
            // Parse what a pipelining client sent as one batch (up to BATCH), let the rate
            // limiter bring the batch's budgets into the cache together, then dispatch the
            // requests in order, each one's check reusing the key hash the prefetch
            // computed. Colocation rules look at a batch at once too (one call, one look at
            // the rules' generation). (One at a time otherwise: nothing to gain.)
            let batch_max = if self.proxy.ratelimit.prefetching() || self.proxy.colocate.active() { BATCH } else { 1 };
            let used = self.queue.entries.len().min(self.held.window);
            let space = (self.held.window - used).min(batch_max);
            let mut failed = None;
            // (each request takes its place in the reply queue as it is parsed, and is
            // dispatched where it lies: not moved through a batch of its own, twice)
            let first = self.queue.entries.len();
            while self.queue.entries.len() - first < space && !rbuf.is_empty() {
                match self.reader.next(rbuf) {
                    Ok(Next::Incomplete { hint }) => {
                        self.read_hint = hint;
                        break;
                    }
                    Ok(Next::Request(req)) => self.enqueue(req),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let n = self.queue.entries.len() - first;
            let more = n == space && failed.is_none();
            let hashed = if n > 1 {
                let keys = self.queue.entries.range(first..).map(|e| match &e.meta.req {
                    Some(r) if r.argc() > 1 => r.arg(1),
                    _ => &[][..],
                });
                self.proxy.ratelimit.prefetch(keys, &mut self.hashes)
            } else {
                0
            };
            if self.proxy.colocate.active() {
                self.colocate_batch(first);
            }
            for i in 0..n {
                if !self.reading {
                    // after QUIT: the rest is never run
                    for e in self.queue.entries.drain(first + i..) {
                        self.held.requests -= e.meta.req.as_ref().map_or(0, |r| r.raw().len());
                    }
                    break;
                }
                if i < hashed
                    && self.hashes[i] != 0
                    && let Some(r) = &self.queue.entries[first + i].meta.req
                    && r.argc() > 1
                {
                    self.client.rl.expect(r.arg(1), self.hashes[i]);
                }
                // (behind a request that waits for the ordering rule it waits too)
                if self.deferred.is_none() {
                    let topo = view.get_or_insert_with(|| self.proxy.cluster.topology());
                    self.dispatch_at(first + i, Some(topo));
                }
            }
            if let Some(e) = failed {
                if self.reading {
                    info!(client = self.client.id, error = %e, "protocol error; closing");
                    Writer::new(&mut self.scratch, self.client.proto).error(&crate::errors::protocol(&e));
                    let b = self.scratch.split().freeze();
                    self.held.reply_ready(b.len(), self.soft, self.max_pipeline);
                    let meta = Meta::new(self.proxy.unknown_id(), self.read_at, None);
                    if self.deferred.is_some() {
                        // the requests before it that wait for the ordering rule run first;
                        // this reply ends the connection after theirs
                        self.reading = false;
                        self.queue.entries.push_back(Entry { reply: Reply::Ready(b), last: true, silent: false, meta });
                    } else {
                        self.client.quit = true;
                        self.push(Reply::Ready(b), meta);
                    }
                }
                break;
            }
            if !more {
                break;
            }
        }
    }

    /// Gives a request just read its place in the reply queue, where it is dispatched
    /// ([`Session::dispatch_at`]).
    #[inline(always)]
    fn enqueue(&mut self, req: Request) {
        self.held.requests += req.raw().len();
        self.queue.entries.push_back(Entry {
            // (dispatch_at writes the reply whatever the outcome)
            reply: Reply::Later,
            last: false,
            silent: false,
            meta: Meta::new(0, self.read_at, Some(req)),
        });
    }

    /// While colocation rules are in force, the requests of a batch about to be
    /// dispatched take their keys' stored names, and their replies will show the client's
    /// (`crate::services::colocate`). A request none of whose arguments can start a rule's
    /// key, of a command whose reply names no keys, stays as it is without a lookup.
    /// A renamed request's form as the client sent it goes to [`Session::asked`].
    #[inline(never)]
    fn colocate_batch(&mut self, first: usize) {
        let generation = self.proxy.colocate.generation();
        if self.colocate.as_ref().is_none_or(|(g, _)| *g != generation) {
            self.colocate = Some((generation, self.proxy.colocate.rules()));
        }
        let Some((_, rules)) = &self.colocate else { return };
        // (the quick look in a loop of its own, and the rest out of line: in one loop the
        // look's values lived on the stack, 79 instructions a request, with ten rules)
        let heads = rules.key_heads();
        let look = |e: &Entry| match &e.meta.req {
            Some(r) => r.arg_heads().any(|b| heads[b as usize] != 0) || crate::command::may_name_keys(r.arg(0)),
            None => false,
        };
        let mut i = first;
        while let Some(at) = self.queue.entries.range(i..).position(look) {
            i += at;
            let seq = self.queue.head + i as u64;
            if let Some(req) = self.queue.entries[i].meta.req.as_mut() {
                let before = req.raw().len();
                colocate_request(&self.proxy, rules, &mut self.asked, &mut self.fixes, seq, req);
                // (its bytes are held as they go: under its stored names)
                self.held.requests = self.held.requests - before + req.raw().len();
            }
            i += 1;
        }
    }

    /// Colocation inside a transaction: a queued command's reply fix moves to the
    /// transaction (by its place there), and EXEC's reply takes them all. `before`: the
    /// transaction's commands before request `seq` was dispatched, if one was open.
    #[cold]
    fn tx_names(&mut self, seq: u64, before: Option<usize>) {
        let after = match &self.client.modes.multi {
            crate::conn::Mode::Multi(q) => Some(q.client_count()),
            crate::conn::Mode::Normal => None,
        };
        match (before, after) {
            (Some(b), Some(a)) if a > b => {
                if let Some(at) = self.fixes.iter().position(|(s, _)| *s == seq) {
                    let (_, fix) = self.fixes.remove(at);
                    self.tx_fixes.push((b as u32, *fix));
                }
            }
            // EXEC (or DISCARD, RESET, EXECABORT: their replies hold no names)
            (Some(_), None) if !self.tx_fixes.is_empty() => {
                let fix = crate::services::colocate::ReplyFix::exec(std::mem::take(&mut self.tx_fixes));
                let at = self.fixes.partition_point(|(s, _)| *s < seq);
                self.fixes.insert(at, (seq, Box::new(fix)));
            }
            (None, _) => self.tx_fixes.clear(),
            _ => {}
        }
    }

    /// Dispatches the request of entry `i`; false if it must wait ([`Outcome::Later`]).
    #[inline(always)]
    fn dispatch_at(&mut self, i: usize, topo: Option<&crate::upstream::cluster::Topology>) -> bool {
        let seq = self.queue.head + i as u64;
        let Some(Entry { reply, last, silent, meta }) = self.queue.entries.get_mut(i) else { return true };
        let Some(req) = meta.req.as_ref() else { return true };
        let read_at = meta.started;
        let skip = self.client.reply == ReplyMode::Skip;
        // (colocation: a transaction's place before the request, if it may matter)
        let queued = match self.fixes.is_empty() && self.tx_fixes.is_empty() {
            true => None,
            false => Some(match &self.client.modes.multi {
                crate::conn::Mode::Multi(q) => Some(q.client_count()),
                crate::conn::Mode::Normal => None,
            }),
        };
        let asked = asked_form(&self.asked, seq).unwrap_or(req);
        let mut ctx = Ctx::new(&mut self.client, seq, &self.tx, &mut self.scratch, req, asked, read_at);
        ctx.topo = topo;
        let outcome = crate::front::dispatch::dispatch(&self.proxy, &mut ctx);
        if let Outcome::Later = outcome {
            *reply = Reply::Later;
            self.deferred = Some(seq);
            self.calm = false;
            self.client.rl.forget();
            return false;
        }
        (meta.cmd, meta.cached, meta.wait_ms, meta.first_key) = (ctx.cmd, ctx.cached, ctx.wait_ms, ctx.first_key);
        meta.writes = ctx.writes;
        let (pushing, lane) = (ctx.pushing, ctx.lane);
        self.client.rl.forget();
        // CLIENT REPLY: OFF and SKIP's own replies are not written, nor the reply of the
        // command after a SKIP
        if skip {
            *silent = true;
            if self.client.reply == ReplyMode::Skip {
                self.client.reply = ReplyMode::On;
            }
        } else {
            *silent = self.client.reply != ReplyMode::On;
        }
        // pub/sub confirmations are written whatever CLIENT REPLY says, as Redis writes them
        if pushing {
            *silent = false;
        }
        // (the bookkeeping first, by reference: then the outcome moves into the entry;
        // moved through the arms' bindings, a waiting request's 200 bytes of state were
        // copied three times, 87 instructions of a GET's)
        match &outcome {
            Outcome::Ready(b) => self.held.reply_ready(b.len(), self.soft, self.max_pipeline),
            Outcome::Waiting(p) => {
                if self.client.inflight == 0 && self.proxy.migration.configured() {
                    self.proxy.migration.gate.busy(1);
                }
                self.client.inflight += 1;
                self.client.lane = lane;
                if p.blocking() {
                    self.blocking = Some(seq);
                }
                // armed already for an earlier request (deadlines grow with the read
                // time), unless this one waits less than a LOCK.ACQUIRE WAIT
                let deadline = meta.deadline(self.reply_deadline);
                if self.armed.is_none_or(|t| deadline < t) {
                    self.armed = Some(deadline);
                }
            }
            Outcome::Later => return false,
        }
        // (assigned in each arm: a `match` expression's value is a copy of its own)
        match outcome {
            Outcome::Ready(b) => *reply = Reply::Ready(b),
            Outcome::Waiting(p) => *reply = Reply::Waiting(p),
            Outcome::Later => return false,
        }
        // a reply that ends the connection stops the reading
        *last = self.client.quit;
        if *last {
            self.reading = false;
        }
        let cmd = meta.cmd;
        self.publish(cmd);
        if let Some(before) = queued {
            self.tx_names(seq, before);
        }
        true
    }

    /// Dispatches the requests that waited for the ordering rule ([`crate::conn::order`]) once
    /// nothing of the client's is in flight or being retried, in order, until one waits
    /// again or one ends the connection.
    fn resume(&mut self) {
        let Some(first) = self.deferred else { return };
        if self.client.inflight > 0 || !self.retrying.is_empty() {
            return;
        }
        self.deferred = None;
        self.recalm();
        let mut i = (first - self.queue.head) as usize;
        while i < self.queue.entries.len() && matches!(self.queue.entries[i].reply, Reply::Later) {
            // its deadline counts from now: it waited behind its client's own requests
            self.queue.entries[i].meta.started = Instant::now();
            if !self.dispatch_at(i, None) || self.queue.entries[i].last {
                return;
            }
            i += 1;
        }
    }

    /// Keeps what other connections see of this one current (CLIENT LIST).
    fn publish(&self, cmd: usize) {
        let info = &self.client.info;
        info.last_cmd.store(cmd, Ordering::Relaxed);
        info.last_ms.store(self.read_ms, Ordering::Relaxed);
        info.flags.store(self.client.flags(self.blocking.is_some()), Ordering::Relaxed);
        let multi = match &self.client.modes.multi {
            Mode::Multi(q) => q.commands.len() as i64,
            Mode::Normal => -1,
        };
        info.multi.store(multi, Ordering::Relaxed);
        info.resp.store(self.client.proto.version() as u8, Ordering::Relaxed);
    }

    /// Queues a request's reply (or its place for one); a reply that ends the connection
    /// stops the reading.
    fn push(&mut self, reply: Reply, meta: Meta) {
        let last = self.client.quit;
        if last {
            self.reading = false;
        }
        self.queue.entries.push_back(Entry { reply, last, silent: false, meta });
    }

    /// Shutdown: no more requests are read; the replies in flight are written, except that
    /// of a blocking command (it may never come), which ends the connection now.
    fn stop(&mut self) {
        self.reading = false;
        self.stopped_blocked = self.blocking.is_some();
    }

    /// A request from another connection (CLIENT KILL, CLIENT UNBLOCK) or from the server
    /// (shutdown, a migration's cutover letting held requests go on).
    fn control(&mut self, c: Control) {
        if c == Control::Kill {
            self.killed = true;
            return;
        }
        if c == Control::Shutdown {
            self.stop();
            return;
        }
        if c == Control::Resume {
            // (woken to dispatch what it holds: the run loop does)
            return;
        }
        if c == Control::UnblockAtNode
            && let Some(seq) = self.blocking
            && let Some(Reply::Waiting(p)) = self.queue.get_mut(seq).map(|e| &e.reply)
            && let Some((node, local)) = p.blocked_at()
        {
            // the node answers it: nil, or what it took just before (its id there found
            // by the connection's address in CLIENT LIST: asking it at connect time would
            // delay every blocking command's first send)
            tokio::spawn(async move {
                let mut side = crate::upstream::side::Side::new(node.addr.clone(), node.options(), "unblock");
                let addr = format!("addr={local} ");
                let r = match side.call(&["CLIENT", "LIST", "TYPE", "normal"]).await {
                    Ok(list) => {
                        let list = String::from_utf8_lossy(&list).into_owned();
                        let id = list
                            .lines()
                            .find(|l| l.contains(&addr))
                            .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")).map(str::to_string));
                        match id {
                            Some(id) => side.call(&["CLIENT", "UNBLOCK", &id]).await.map(|_| ()),
                            None => Ok(()), // gone already: its reply is on its way
                        }
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = r {
                    warn!(node = %node.addr, error = %e, "CLIENT UNBLOCK for a cutover failed");
                }
            });
            return;
        }
        let Some(seq) = self.blocking.take() else { return };
        let Some(e) = self.queue.get_mut(seq) else { return };
        let Reply::Waiting(p) = &e.reply else { return };
        let nil_string = p.nil_string_on_timeout();
        let mut w = Writer::new(&mut self.scratch, self.client.proto);
        match c {
            Control::UnblockError => w.error(crate::errors::UNBLOCKED),
            // the command's own timeout reply
            _ if nil_string => w.nil(),
            _ => w.nil_array(),
        }
        let b = self.scratch.split().freeze();
        self.held.reply_ready(b.len(), self.soft, self.max_pipeline);
        self.client.inflight -= 1;
        landed(&self.proxy, self.client.inflight);
        e.meta.ready_at = Instant::now();
        // its Pending goes, and with it the dedicated connection (closed: Redis forgets
        // the blocked command)
        e.reply = Reply::Ready(b);
        self.client.info.flags.store(self.client.flags(false), Ordering::Relaxed);
        self.settled(seq, &mut None);
        self.release_pushes(seq);
    }

    /// The timer fired: the soft limit's duration may be over, and requests past their
    /// deadline are answered with an error.
    fn on_timer(&mut self, now: Instant) -> Option<Cut> {
        let limits = &self.limits;
        if let Some(since) = self.held.over_soft_since
            && limits.output_soft_seconds > 0
            && now >= since + Duration::from_secs(limits.output_soft_seconds)
        {
            return Some(Cut::Soft);
        }
        if let Some(since) = self.held.over_pubsub_soft_since
            && now >= since + Duration::from_secs(limits.pubsub_output_soft_seconds)
        {
            return Some(Cut::PubsubSoft);
        }
        self.armed = self.expire(now);
        None
    }

    /// Answers every request whose deadline has passed with an error; returns the next
    /// deadline of a request still waiting.
    fn expire(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut gone: SmallVec<[u64; 4]> = SmallVec::new();
        for (i, e) in self.queue.entries.iter_mut().enumerate() {
            let Reply::Waiting(_) = e.reply else { continue };
            let deadline = e.meta.deadline(self.reply_deadline);
            if now < deadline {
                next = Some(next.map_or(deadline, |t| t.min(deadline)));
            } else {
                let ms = (deadline - e.meta.started).as_millis();
                Writer::new(&mut self.scratch, self.client.proto).error(&crate::errors::expired(ms));
                let b = self.scratch.split().freeze();
                warn!(
                    client = self.client.id,
                    command = self.proxy.command_name(e.meta.cmd),
                    "no reply within the deadline; answered with an error"
                );
                crate::metrics::global().expired.increment(1);
                self.held.reply_ready(b.len(), self.soft, self.max_pipeline);
                self.client.inflight -= 1;
                landed(&self.proxy, self.client.inflight);
                if e.meta.writes {
                    // it may still run: its reads wait for the replicas to pass this moment
                    self.client.last_write_ms = crate::upstream::backend::clock_ms(now);
                }
                e.meta.ready_at = now;
                // (a request on a dedicated connection drops it with its Pending: closed)
                e.reply = Reply::Ready(b);
                if self.blocking == Some(self.queue.head + i as u64) {
                    self.blocking = None;
                }
                gone.push(self.queue.head + i as u64);
            }
        }
        let mut clock = None;
        for seq in gone {
            self.settled(seq, &mut clock);
            self.release_pushes(seq);
        }
        next
    }

    /// The connection ends (`cut`: disconnected by its limits).
    fn end(&mut self, cut: Option<Cut>) {
        let held = &self.held;
        if held.counted_over_soft > 0 {
            self.proxy.stats.output_over_soft.fetch_sub(held.counted_over_soft, Ordering::Relaxed);
        }
        let id = self.client.id;
        if let Some(c) = cut {
            warn!(
                client = id,
                addr = %self.client.info.addr,
                reason = c.reason(),
                reply_bytes = held.replies,
                "client disconnected: over its output limit"
            );
            crate::metrics::global().disconnect(c.reason());
        }
        if self.client.used_locks {
            self.proxy.locks.closed(id);
        }
        self.client.leave_pushing_modes(&self.proxy.pubsub, &self.proxy.client_side);
        self.proxy.clients.remove(id);
        info!(client = id, "client disconnected");
    }
}

/// How many pipelined requests are parsed before they are dispatched.
const BATCH: usize = 32;

/// The command id of a pushed message's place in the queue (see [`Session::pushed`]).
const PUSH_CMD: usize = usize::MAX;
