//! MULTI: the transaction a connection is queueing. The commands of the mode are in
//! `crate::modes::transaction`; its gate (what may be queued) is applied at dispatch.

use bytes::Bytes;

use crate::protocol::Request;

/// Which commands a connection may send now, and what they mean.
#[derive(Debug, Default)]
pub enum Mode {
    /// Any command.
    #[default]
    Normal,
    /// After MULTI: commands are checked and queued (answered `+QUEUED`) until EXEC sends
    /// them as one transaction, or DISCARD or RESET drops them (crate::modes::transaction).
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
