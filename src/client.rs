//! What heatshield knows about one client connection, and the mode the connection is
//! in. A mode is the one place a connection's state lives: a new per-connection feature
//! (a queued transaction, a watched key's pinned connection, a blocked command's leased
//! connection) is a new variant with its rules in dispatch, not a flag threaded through
//! the request path. Subscriptions are the exception: they last across modes (a RESP3
//! client may subscribe and run a transaction), so they are a field of their own.
//!
//! [`ClientInfo`] is what other connections may see of a client and ask of it (CLIENT
//! LIST, KILL, UNBLOCK), kept in the proxy's [`Registry`]; a request from another
//! connection reaches the session as a [`Control`] on its reply channel, so it costs the
//! session no wake-up source of its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::mailbox::{Delivery, ReplyTx};

use crate::protocol::{Proto, Request};
use crate::upstream::cluster::Lease;

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
    /// The slot of the keys queued so far (every key of a transaction shares it, unless
    /// `transactions.cross_slot = "per-node"`: then it is the first command's).
    pub slot: Option<u16>,
    /// Each queued command's slot (`None`: keyless).
    pub slots: Vec<Option<u16>>,
    /// A command was refused at queue time: EXEC answers EXECABORT.
    pub failed: bool,
    /// Keys of the queued writes (the hot-key cache drops them when EXEC runs).
    pub write_keys: Vec<Bytes>,
}

/// WATCH in effect: from WATCH until EXEC, DISCARD, UNWATCH, RESET or disconnect the
/// client is pinned to a dedicated connection to the watched keys' master, where its
/// WATCH ran; commands for the watched slot travel on it.
pub struct Watch {
    /// The slot of the watched keys (a transaction's keys must share it).
    pub slot: u16,
    /// The pinned connection.
    pub lease: Option<Lease>,
    /// The watch is void (the slot moved away from where it ran): EXEC then answers nil,
    /// as if a watched key had changed, and the client retries. The connection is kept
    /// (the client's requests still on it get their replies) until the watch ends.
    pub voided: bool,
}

impl Watch {
    /// The watch no longer guards its keys (voided, or its connection broke).
    pub fn void(&self) -> bool {
        self.voided || self.lease.as_ref().is_none_or(|l| l.broken())
    }
}

/// CLIENT REPLY: whether the client's replies are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplyMode {
    #[default]
    On,
    Off,
    /// The next command's reply is not written.
    Skip,
}

/// Bits of [`ClientInfo::flags`] (CLIENT LIST's `flags=`).
pub mod flag {
    pub const MULTI: u8 = 1;
    pub const BLOCKED: u8 = 2;
    pub const WATCH: u8 = 4;
    pub const NO_EVICT: u8 = 8;
    pub const NO_TOUCH: u8 = 16;
    /// Subscribed to something (Redis's `P`, and CLIENT LIST / KILL `TYPE pubsub`).
    pub const PUBSUB: u8 = 32;
    /// CLIENT TRACKING on (`t`), in BCAST mode (`B`).
    pub const TRACKING: u8 = 64;
    pub const BCAST: u8 = 128;
}

pub use crate::mailbox::Control;

/// A client's name and library (CLIENT SETNAME, CLIENT SETINFO, HELLO ... SETNAME).
#[derive(Debug, Default)]
pub struct Names {
    pub name: Option<Bytes>,
    pub lib_name: String,
    pub lib_ver: String,
}

/// What other connections may see of a client and ask of it.
pub struct ClientInfo {
    pub id: u64,
    pub addr: String,
    pub laddr: String,
    pub created: Instant,
    pub names: Mutex<Names>,
    /// The last command's id, and when it was read (ms since the proxy started).
    pub last_cmd: AtomicUsize,
    pub last_ms: AtomicU64,
    /// [`flag`] bits.
    pub flags: AtomicU8,
    /// Commands queued after MULTI (-1: not in MULTI).
    pub multi: AtomicI64,
    /// The RESP version the client speaks.
    pub resp: AtomicU8,
    /// Channels, patterns and shard channels subscribed (CLIENT LIST `sub`, `psub`, `ssub`).
    pub subs: [AtomicUsize; 3],
    /// CLIENT LIST's `redir`: -1 not tracking, 0 tracking without a redirect, else its id.
    pub redir: AtomicI64,
    /// CLIENT LIST's `db`: the database SELECT chose.
    pub db: std::sync::atomic::AtomicU32,
    /// The session's reply channel, for [`Control`] messages.
    control: ReplyTx,
}

impl ClientInfo {
    pub fn new(id: u64, addr: String, laddr: String, control: ReplyTx) -> ClientInfo {
        ClientInfo {
            id,
            addr,
            laddr,
            created: Instant::now(),
            names: Mutex::new(Names::default()),
            last_cmd: AtomicUsize::new(0),
            last_ms: AtomicU64::new(0),
            flags: AtomicU8::new(0),
            multi: AtomicI64::new(-1),
            resp: AtomicU8::new(2),
            subs: Default::default(),
            redir: AtomicI64::new(-1),
            db: Default::default(),
            control,
        }
    }

    /// Asks the session for `c`; false if it is gone.
    pub fn send(&self, c: Control) -> bool {
        self.control.send(Delivery::Control(c)).is_ok()
    }

    /// The session's reply channel (for invalidations redirected to this client).
    pub fn reply_tx(&self) -> ReplyTx {
        self.control.clone()
    }

    pub fn has(&self, f: u8) -> bool {
        self.flags.load(Ordering::Relaxed) & f != 0
    }
}

/// Every client connected now, by id.
#[derive(Default)]
pub struct Registry {
    map: Mutex<HashMap<u64, Arc<ClientInfo>>>,
}

impl Registry {
    pub fn add(&self, c: Arc<ClientInfo>) {
        self.map.lock().insert(c.id, c);
    }

    pub fn remove(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    pub fn get(&self, id: u64) -> Option<Arc<ClientInfo>> {
        self.map.lock().get(&id).cloned()
    }

    /// Every client, by id.
    pub fn all(&self) -> Vec<Arc<ClientInfo>> {
        let mut v: Vec<Arc<ClientInfo>> = self.map.lock().values().cloned().collect();
        v.sort_by_key(|c| c.id);
        v
    }
}

/// The way to Redis a request takes (the ordering rule is crate::order's) (a byte: it is compared on every pipelined request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Lane {
    /// Answered from heatshield's own state, changing nothing a request in flight uses (a
    /// command queued after MULTI): never waits.
    #[default]
    Local,
    /// The nodes' shared pipelined connections this client uses, in RESP2 (each node's
    /// one connection for this client, so requests to one node stay in order).
    Shared2,
    /// The same in RESP3: other connections.
    Shared3,
    /// The client's WATCH connection.
    Pinned,
    /// Parked with the lock task (`LOCK.ACQUIRE ... WAIT`), which serves each lock's
    /// waiters in the order they came: several may wait together, the commands after them
    /// wait for them.
    LockTask,
    /// A way of its own (a dedicated connection, the pub/sub hub), or a change to the way
    /// the requests in flight travel (the end of a WATCH, RESET): only once nothing is in
    /// flight.
    Own,
}

impl Lane {
    /// The shared connections in protocol `p`.
    #[inline]
    pub fn shared(p: Proto) -> Lane {
        match p {
            Proto::Resp2 => Lane::Shared2,
            Proto::Resp3 => Lane::Shared3,
        }
    }
}

/// What the proxy knows about a client connection.
pub struct ClientState {
    pub id: u64,
    pub proto: Proto,
    pub authed: bool,
    /// What other connections see of this one.
    pub info: Arc<ClientInfo>,
    /// CLIENT REPLY.
    pub reply: ReplyMode,
    /// CLIENT NO-EVICT / NO-TOUCH (accepted; heatshield evicts no client).
    pub no_evict: bool,
    pub no_touch: bool,
    /// QUIT was received: close once its reply is written.
    pub quit: bool,
    /// The connection's mode: which commands it may send now, and what they mean.
    pub mode: Mode,
    /// `PROXY AUTH` succeeded on this connection.
    pub admin: bool,
    /// Requests dispatched whose replies are not complete yet.
    pub inflight: u32,
    /// The way to Redis those requests took (they share one: see [`crate::order`]).
    pub lane: Lane,
    /// The slot map's version they were routed by (see [`crate::order`]).
    pub map_version: u64,
    /// The client parked a LOCK.ACQUIRE ... WAIT or holds KEEPALIVE locks: the lock task
    /// must hear when it leaves.
    pub used_locks: bool,
    /// The client acquired a lock with KEEPALIVE.
    pub keepalive_locks: bool,
    /// This session's handle on the rate limiter.
    pub rl: crate::ratelimit::View,
    /// WATCH in effect (see [`Watch`]).
    pub watch: Option<Box<Watch>>,
    /// The connection's subscriptions (`None`: none); they coexist with any mode (in
    /// RESP3 a subscribed client may run a transaction).
    pub subs: Option<Box<crate::pubsub::Subscriptions>>,
    /// CLIENT TRACKING on (`None`: off).
    pub tracking: Option<Box<crate::cache::clients::ClientTracking>>,
    /// The nodes this client's writes were sent to, as a mask of their pools' bits (what
    /// WAIT and WAITAOF answer for, see crate::replicas).
    pub wrote: u64,
    /// SELECT: the database this client's commands run in (see `crate::upstream::backend::BackendRequest::db`).
    pub db: u16,
}

impl ClientState {
    /// The [`flag`] bits of this client now (`blocked`: a blocking command waits).
    pub fn flags(&self, blocked: bool) -> u8 {
        let mut f = 0;
        if matches!(self.mode, Mode::Multi(_)) {
            f |= flag::MULTI;
        }
        if blocked {
            f |= flag::BLOCKED;
        }
        if self.watch.is_some() {
            f |= flag::WATCH;
        }
        if self.no_evict {
            f |= flag::NO_EVICT;
        }
        if self.no_touch {
            f |= flag::NO_TOUCH;
        }
        if self.subs.is_some() {
            f |= flag::PUBSUB;
        }
        if let Some(t) = &self.tracking {
            f |= flag::TRACKING;
            if t.mode.bcast {
                f |= flag::BCAST;
            }
        }
        f
    }

    /// Ends WATCH: the pinned connection goes back to the pool after an UNWATCH, or is
    /// closed.
    pub fn unwatch(&mut self) {
        if let Some(w) = self.watch.take()
            && let Some(l) = w.lease
        {
            l.release(true);
        }
    }
}
