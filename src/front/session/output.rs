//! The way out: replies moved from the front of the reply queue to the output in request
//! order, written without ever waiting on the client, and recorded once written.

use super::*;
use std::task::{Context, Poll};

use super::io::WriteSide;

/// Replies on their way to the client: large ones as they are (no copy), small ones
/// coalesced into `tail`, which always comes after every chunk.
#[derive(Default)]
pub(super) struct Output {
    pub(super) chunks: VecDeque<Bytes>,
    pub(super) tail: BytesMut,
}

impl Output {
    pub(super) fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.tail.is_empty()
    }

    pub(super) fn push(&mut self, b: Bytes) {
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
    pub(super) fn write(&mut self, wr: &mut WriteSide<'_>, cx: &mut Context<'_>) -> std::io::Result<(usize, bool)> {
        let mut total = 0;
        while !self.is_empty() {
            let r = if self.chunks.is_empty() {
                wr.try_write_vectored(cx, &[IoSlice::new(&self.tail)])
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
                wr.try_write_vectored(cx, &slices[..n])
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
                    // (all of it written: cleared, not advanced, so that the buffer keeps
                    // its room from the start; advanced past its end, the next reply's
                    // copy had to call `reserve` to take the room back, at every request)
                    None if n >= self.tail.len() => {
                        self.tail.clear();
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
        match wr.poll_drained(cx) {
            Poll::Ready(r) => r.map(|()| (total, false)),
            Poll::Pending => Ok((total, true)),
        }
    }
}

impl Session {
    /// Moves the complete replies at the front of the queue to the output (the wake-up's
    /// clock is read only when something moves). Returns how many moved.
    pub(super) fn move_ready(&mut self) -> usize {
        let clock = &mut self.clock;
        let mut moved = 0;
        let q = &mut self.queue;
        while !self.closing
            && let Some(e) = q.entries.get_mut(q.sent)
            && matches!(e.reply, Reply::Ready(_))
        {
            let at = *clock.get_or_insert_with(Instant::now);
            // (the bytes taken out of the entry, not the whole entry's reply moved: a reply
            // has a request in flight's size)
            let Reply::Ready(b) = &mut e.reply else { break };
            let b = std::mem::take(b);
            // colocation: the client's names in the reply, and in an error quoting a key
            // (NOGROUP ... 'key') while rules are in force
            // (a reply that is no error and has no fix pending needs no call)
            let b = match self.fixes.is_empty() && (self.colocate.is_none() || b.first() != Some(&b'-')) {
                true => b,
                false => colocated(&self.proxy, &mut self.fixes, &mut self.held.replies, q.head + q.sent as u64, b),
            };
            if self.proxy.audit.wants(e.meta.cmd) {
                let req = super::asked_form(&self.asked, q.head + q.sent as u64).or(e.meta.req.as_ref());
                audit(&self.proxy, &self.client, req, &b);
            }
            e.reply = Reply::Sent { summary: ReplySummary::of(&b), at };
            if e.silent {
                self.held.replies -= b.len();
            } else {
                self.out.push(b);
            }
            self.closing = e.last;
            q.sent += 1;
            moved += 1;
        }
        moved
    }

    /// Writes what the socket takes now, never waiting. Returns the bytes written.
    pub(super) fn write(&mut self, wr: &mut WriteSide<'_>, cx: &mut Context<'_>) -> std::io::Result<usize> {
        if self.blocked || self.out.is_empty() || self.holding() {
            return Ok(0);
        }
        let (n, would_block) = self.out.write(wr, cx)?;
        self.blocked = would_block;
        self.held.replies -= n;
        if n > 0 {
            crate::metrics::global().bytes_out.increment(n as u64);
        }
        Ok(n)
    }

    /// Replies of one read go out together, as Redis writes a pipeline's replies once it
    /// has run the batch: while the next request in the queue was read with the replies
    /// already in the output and still waits for a backend, they wait for it (one write
    /// instead of two; a transaction's `+QUEUED`s go with its EXEC). Never for a request
    /// that waits on purpose (a blocking command, LOCK.ACQUIRE ... WAIT): Redis sends what
    /// came before a blocked command at once.
    pub(super) fn holding(&self) -> bool {
        let q = &self.queue;
        match (q.sent.checked_sub(1).and_then(|i| q.entries.get(i)), q.entries.get(q.sent)) {
            (Some(last), Some(next)) => {
                matches!(next.reply, Reply::Waiting(_))
                    && next.meta.started == last.meta.started
                    && next.meta.wait_ms == 0
            }
            _ => false,
        }
    }

    /// Once the output is empty, records every reply written (statistics, slow log) and
    /// lets it leave the queue.
    pub(super) fn record_written(&mut self) {
        if !self.out.is_empty() || self.queue.sent == 0 {
            return;
        }
        let written = Instant::now();
        let n = std::mem::take(&mut self.queue.sent);
        // consecutive commands that ended alike are counted at once (a pipeline of GETs is
        // one increment of the exporter's shared counter, not one each)
        let mut run: Option<(usize, crate::metrics::CommandOutcome, u64)> = None;
        // the requests of one read share their start, so their time is one subtraction
        // (about 37 instructions a request otherwise)
        let mut took: Option<(Instant, Duration)> = None;
        for (i, e) in self.queue.entries.range(..n).enumerate() {
            let Reply::Sent { summary, at } = e.reply else { continue };
            let m = &e.meta;
            if m.cmd == PUSH_CMD {
                continue; // a message, not a command
            }
            self.held.requests -= m.req.as_ref().map_or(0, |r| r.raw().len());
            let moments =
                crate::services::stats::Moments { started: m.started, ready: m.ready_at, queued: at, written };
            let took = match took {
                Some((started, d)) if started == m.started => d,
                _ => took.insert((m.started, written - m.started)).1,
            };
            let outcome = self.proxy.observe(
                &self.client,
                Answered {
                    cmd: m.cmd,
                    took,
                    reply: summary,
                    redirected: m.redirected,
                    cached: m.cached,
                    req: super::asked_form(&self.asked, self.queue.head + i as u64).or(m.req.as_ref()),
                    first_key: m.first_key,
                    node: m.node.as_deref(),
                    moments,
                },
            );
            match &mut run {
                Some((cmd, o, k)) if *cmd == m.cmd && *o == outcome => *k += 1,
                _ => {
                    if let Some((cmd, o, k)) = run.replace((m.cmd, outcome, 1)) {
                        self.proxy.count(cmd, o, k);
                    }
                }
            }
        }
        if let Some((cmd, o, k)) = run {
            self.proxy.count(cmd, o, k);
        }
        // dropped where they are, not moved out first; one (unpipelined, the usual) taken
        // from the front, without a drain's set-up and its two slices (about 90
        // instructions a request at -P1)
        if n == 1 {
            self.queue.entries.pop_front();
        } else {
            self.queue.entries.drain(..n);
        }
        self.queue.head += n as u64;
        if !self.asked.is_empty() {
            let head = self.queue.head;
            self.asked.retain(|(s, _)| *s >= head);
        }
    }
}

/// Records an audited command's reply (crate::services::audit), its keys as the client
/// named them.
#[cold]
#[inline(never)]
fn audit(proxy: &Proxy, client: &crate::conn::ClientState, req: Option<&crate::protocol::Request>, reply: &[u8]) {
    let Some(req) = req else { return };
    let Ok(cmd) = proxy.commands.lookup(req) else { return };
    let keys = crate::command::keys_of(cmd, req).unwrap_or_default();
    let who = crate::services::audit::Who { client: client.id, addr: &client.info.addr, user: &client.user.name };
    proxy.audit.command(&who, cmd, req, &keys, reply);
}

/// An error reply with the client's names for the stored ones it quotes
/// (crate::services::colocate); `replies` (the bytes held) follows its length.
#[cold]
fn fix_error(proxy: &Proxy, replies: &mut usize, b: Bytes) -> Bytes {
    match proxy.colocate.restore_error(&b) {
        Some(nb) => {
            *replies = *replies - b.len() + nb.len();
            nb
        }
        None => b,
    }
}

/// [`fix_names`] then [`fix_error`]: a reply of request `seq` while colocation rules are
/// in force or a fix is pending.
#[cold]
fn colocated(
    proxy: &Proxy,
    fixes: &mut Vec<(u64, Box<crate::services::colocate::ReplyFix>)>,
    held: &mut usize,
    seq: u64,
    b: Bytes,
) -> Bytes {
    let b = match fixes.is_empty() {
        true => b,
        false => fix_names(proxy, fixes, held, seq, b),
    };
    match b.first() == Some(&b'-') {
        true => fix_error(proxy, held, b),
        false => b,
    }
}

/// The reply of request `seq` with the client's key names, if it is one of `fixes`
/// (crate::services::colocate); `replies` (the bytes held) follows its length.
#[cold]
fn fix_names(
    proxy: &Proxy,
    fixes: &mut Vec<(u64, Box<crate::services::colocate::ReplyFix>)>,
    replies: &mut usize,
    seq: u64,
    b: Bytes,
) -> Bytes {
    // (the earlier ones' places are gone: answered otherwise)
    let done = fixes.iter().take_while(|(s, _)| *s < seq).count();
    fixes.drain(..done);
    match fixes.first() {
        Some((s, fix)) if *s == seq => {
            let out = match proxy.colocate.restore_reply(fix, &b) {
                Some(nb) => {
                    *replies = *replies - b.len() + nb.len();
                    nb
                }
                None => b,
            };
            fixes.remove(0);
            out
        }
        _ => b,
    }
}
