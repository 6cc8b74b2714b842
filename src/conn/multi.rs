//! MULTI: the transaction a connection is queueing. The commands of the mode are in
//! `crate::modes::transaction`; its gate (what may be queued) is applied at dispatch.

use bytes::Bytes;
use smallvec::SmallVec;

use crate::command::Split;
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
    /// Cross-slot multi-key commands queued as one command per slot (`transactions.
    /// cross_slot = "per-node"`): EXEC's reply merges each back into one.
    pub splits: Vec<TxSplit>,
}

/// A cross-slot MGET, MSET, DEL, UNLINK, EXISTS or TOUCH queued as one command per slot,
/// each in its slot's native transaction; in EXEC's reply, their replies are merged into
/// the one reply the client's command has (crate::path::merge::merge_exec).
#[derive(Debug, Clone)]
pub struct TxSplit {
    /// Where its first part is in [`Queued::commands`]; the others follow it.
    pub first: u32,
    /// Its parts.
    pub count: u32,
    pub kind: Split,
    /// MGET: per part, the positions of its keys among the command's keys.
    pub keys: Vec<SmallVec<[u32; 4]>>,
    /// MGET: the command's keys.
    pub nkeys: u32,
}

impl Queued {
    /// The commands as the client counts them (a split command is one).
    pub fn client_count(&self) -> usize {
        self.commands.len() - self.splits.iter().map(|s| s.count as usize - 1).sum::<usize>()
    }
}
