//! The reply queue: one place per request, in the order the client sent them; a place
//! holds its request's state (not dispatched yet, waiting, ready, written out) and what is
//! recorded about it once its reply has been written.

use super::*;

/// Where a request's reply stands.
pub(super) enum Reply {
    /// Not dispatched yet: it waits for the client's requests before it
    /// ([`crate::conn::order`]).
    Later,
    Waiting(Pending),
    Ready(Bytes),
    /// Moved to the output; kept (as a summary) until its bytes are written, to record it.
    Sent {
        summary: ReplySummary,
        /// When it moved to the output.
        at: Instant,
    },
}

/// One request's place in the reply queue.
pub(super) struct Entry {
    pub(super) reply: Reply,
    /// The connection closes after this reply (QUIT, protocol error).
    pub(super) last: bool,
    /// CLIENT REPLY OFF / SKIP: the reply is not written.
    pub(super) silent: bool,
    pub(super) meta: Meta,
}

/// What is recorded about a request once its reply has been written.
pub(super) struct Meta {
    /// Command id (for statistics).
    pub(super) cmd: usize,
    /// When the request had been read.
    pub(super) started: Instant,
    /// When its reply was ready.
    pub(super) ready_at: Instant,
    pub(super) redirected: bool,
    /// Answered from the hot-key cache.
    pub(super) cached: bool,
    /// The request (its context on the reply path), in the cluster's names (as the client
    /// sent it: `Session::asked`, when colocation renamed it).
    pub(super) req: Option<Request>,
    /// The argument that is the request's first key (0: none).
    pub(super) first_key: u32,
    /// The node that served it, noted only when it was slow to answer.
    pub(super) node: Option<Arc<str>>,
    /// Milliseconds the request may wait on purpose (LOCK.ACQUIRE ... WAIT) on top of
    /// the reply deadline.
    pub(super) wait_ms: u32,
    /// The command may write (see `Ctx::writes`).
    pub(super) writes: bool,
}

impl Meta {
    pub(super) fn new(cmd: usize, read_at: Instant, req: Option<Request>) -> Meta {
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
            writes: false,
        }
    }

    /// When a request still waiting for its reply is answered with an error.
    pub(super) fn deadline(&self, reply_deadline: Duration) -> Instant {
        self.started + reply_deadline + Duration::from_millis(self.wait_ms as u64)
    }
}

/// The in-order reply queue. Its front `sent` entries have moved to the output
/// ([`Reply::Sent`]); they leave the queue once their bytes are written.
pub(super) struct Queue {
    pub(super) entries: VecDeque<Entry>,
    /// Sequence number of `entries[0]`.
    pub(super) head: u64,
    pub(super) sent: usize,
}

impl Queue {
    pub(super) fn next_seq(&self) -> u64 {
        self.head + self.entries.len() as u64
    }
    pub(super) fn get(&self, seq: u64) -> Option<&Entry> {
        let i = seq.checked_sub(self.head)?;
        self.entries.get(i as usize)
    }
    pub(super) fn get_mut(&mut self, seq: u64) -> Option<&mut Entry> {
        let i = seq.checked_sub(self.head)?;
        self.entries.get_mut(i as usize)
    }
}
