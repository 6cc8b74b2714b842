//! What other connections may see of a client and ask of it (CLIENT LIST, KILL, UNBLOCK),
//! kept in the proxy's [`Registry`]; a request from another connection reaches the
//! session as a [`Control`] on its mailbox, so it costs the session no wake-up source of
//! its own.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::mailbox::{Control, Delivery, ReplyTx};

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

/// A client's name and library (CLIENT SETNAME, CLIENT SETINFO, HELLO ... SETNAME).
#[derive(Debug, Default)]
pub struct Names {
    pub name: Option<Bytes>,
    /// The ACL user the client is logged in as (`None`: `default`).
    pub user: Option<String>,
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

    /// The ACL user it is logged in as.
    pub fn user(&self) -> String {
        self.names.lock().user.clone().unwrap_or_else(|| "default".into())
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
