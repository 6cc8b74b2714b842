//! What heatshield knows about one client connection, and the mode the connection is
//! in. A mode is the one place a connection's state lives: a new per-connection feature
//! (a queued transaction, a watched key's pinned connection, a blocked command's leased
//! connection, subscriptions) is a new variant with its rules in dispatch, not a flag
//! threaded through the request path.

use std::time::Instant;

use bytes::Bytes;

use crate::protocol::{Proto, Request};

/// Which commands a connection may send now, and what they mean.
#[derive(Debug, Default)]
pub enum Mode {
    /// Any command.
    #[default]
    Normal,
    /// After MULTI: commands are checked and queued (answered `+QUEUED`) until EXEC sends
    /// them as one transaction, or DISCARD or RESET drops them (crate::transaction).
    Multi(Box<Queued>),
}

/// A transaction being queued.
#[derive(Debug, Default)]
pub struct Queued {
    /// The commands, in order, as the client sent them.
    pub commands: Vec<Request>,
    /// Their bytes.
    pub bytes: usize,
    /// The memory they hold: their bytes, their parsed form and the keys of the writes
    /// (bounded by `limits.max_inflight_request_bytes`).
    pub held: usize,
    /// The slot of the keys queued so far (every key of a transaction shares it).
    pub slot: Option<u16>,
    /// A command was refused at queue time: EXEC answers EXECABORT.
    pub failed: bool,
    /// Keys of the queued writes (the hot-key cache drops them when EXEC runs).
    pub write_keys: Vec<Bytes>,
}

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
    /// The connection's mode: which commands it may send now, and what they mean.
    pub mode: Mode,
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
