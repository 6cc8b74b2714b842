//! Mailbox: what reaches a session on its one channel, each kind a variant of its own
//! ([`Delivery`]): a node's reply to one of its requests, a message pushed to the client
//! (a pub/sub message, an invalidation), and a request from another connection or from
//! the server ([`Control`]: CLIENT KILL, CLIENT UNBLOCK, shutdown). One channel, so the
//! session has one wake-up source for all of them and their order is kept; typed, so
//! nothing on it is told apart by a reserved tag.
//!
//! The tasks that talk to nodes for heatshield itself (the lock task, the tracking
//! connections, a fan-out's gatherer) use the same channel and read only replies.

use std::sync::Arc;

use bytes::Bytes;

/// Where a reply goes: the session's channel, with the request's place in it.
/// Shared behind an `Arc`: every request carries one, and an `Arc` clone is one atomic
/// where a channel sender's is two (its reference and its sender count), as is a drop.
pub type ReplyTx = Arc<crate::queue::Sender<Delivery>>;

/// A session's channel: where requests say to answer, and where the answers are read.
pub fn reply_channel() -> (ReplyTx, crate::queue::Receiver<Delivery>) {
    let (tx, rx) = crate::queue::channel();
    (Arc::new(tx), rx)
}

/// One message on a session's channel.
#[derive(Debug)]
pub enum Delivery {
    /// A reply (or failure) for one of the session's requests.
    Reply(BackendReply),
    /// A message for the client that answers none of its requests (a pub/sub message, an
    /// invalidation), in the client's protocol, written after the replies before it.
    Push(Bytes),
    /// What another connection, or the server, asks of the session.
    Control(Control),
}

impl Delivery {
    /// A reply, or a failure, for `tag`.
    #[inline]
    pub fn reply(tag: Tag, result: Result<Bytes, BackendError>) -> Delivery {
        Delivery::Reply(BackendReply { tag, result })
    }

    /// The reply this is, if it is one (for the tasks that read only replies).
    #[inline]
    pub fn into_reply(self) -> Option<BackendReply> {
        match self {
            Delivery::Reply(r) => Some(r),
            _ => None,
        }
    }
}

/// Identifies a reply to the session: which queued command, and which part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    pub seq: u64,
    pub part: u32,
}

/// A reply (or failure) for a [`Tag`].
#[derive(Debug)]
pub struct BackendReply {
    pub tag: Tag,
    pub result: Result<Bytes, BackendError>,
}

impl BackendReply {
    /// One reply.
    pub fn one(tag: Tag, result: Result<Bytes, BackendError>) -> Self {
        BackendReply { tag, result }
    }
}

/// Why a backend request has no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// Never written to the node: safe to retry.
    #[error("could not connect to {0}")]
    NotSent(Arc<str>),
    /// Written, but the connection failed before the reply: it may or may not have run.
    #[error("connection to {0} lost before the reply")]
    Lost(Arc<str>),
    /// No reply within the command timeout.
    #[error("timeout waiting for {0}")]
    Timeout(Arc<str>),
    /// Not sent on the caller's behalf after all (a shared cache fill was abandoned, a
    /// retry's delay on a dedicated connection is over): send it again now.
    #[error("resend")]
    Resend,
    /// Not from a backend: the topology was refreshed to confirm a redirection this part
    /// received; look at it again.
    #[error("recheck")]
    Recheck,
}

/// What another connection, or the server, asks of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// CLIENT KILL: close the connection now.
    Kill,
    /// CLIENT UNBLOCK id [TIMEOUT]: end the blocking command as if it timed out.
    UnblockTimeout,
    /// CLIENT UNBLOCK id ERROR: end it with `-UNBLOCKED`.
    UnblockError,
    /// The proxy shuts down: read no more requests, finish the replies in flight.
    Shutdown,
    /// A migration's cutover held requests and lets them go on: dispatch what is read.
    Resume,
    /// A migration's cutover: end the blocking command at its node (`CLIENT UNBLOCK`, its
    /// id found in `CLIENT LIST` by the connection's address), so
    /// what the node took for it still reaches the client; as `UnblockTimeout` when it
    /// is not waiting at a node.
    UnblockAtNode,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_stays_as_small_as_a_reply() {
        // every reply travels in one: the wrapping costs at most the word that tells the
        // kinds apart (a reply used to carry a word of its own, its count of replies after
        // it, and lost it when each reply became a message of its own)
        assert!(std::mem::size_of::<Delivery>() <= std::mem::size_of::<BackendReply>() + 8);
    }
}
