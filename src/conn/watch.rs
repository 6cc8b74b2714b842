//! WATCH: the pinned connection a connection's watched keys are guarded on. The commands
//! of the mode are in `crate::modes::transaction`.

use crate::upstream::cluster::Lease;

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
