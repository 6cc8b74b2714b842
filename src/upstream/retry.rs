//! Retry rules: what one backend reply means for the request that got it. The request
//! path ([`crate::pending`]) and the lock task ([`crate::locks`]) both classify replies
//! here, so they follow the same redirections, wait out a failover the same way and give
//! up at the same limits.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::protocol::reply::{Redirect, error_text, parse_redirect};
use crate::upstream::backend::BackendError;
use crate::upstream::cluster::{Cluster, NodePool};

/// Redirections (MOVED, ASK, NOSCRIPT) followed for one request before the reply is
/// passed to the client as it is.
pub const MAX_REDIRECTS: u16 = 5;
/// Sends retried for one request after an unreachable node, TRYAGAIN or CLUSTERDOWN
/// (e.g. while a failover promotes a replica).
pub const MAX_RETRIES: u16 = 50;
/// How long a retried send waits.
pub const RETRY_DELAY: Duration = Duration::from_millis(100);

/// What a backend reply asks of the request that got it.
#[derive(Debug)]
pub enum Verdict {
    /// The reply is the answer (an error reply among them).
    Answer,
    /// NOSCRIPT: a script sent by its SHA is not loaded on that node; send it whole.
    NoScript,
    /// MOVED or ASK (only from a cluster).
    Redirect(Redirect),
    /// TRYAGAIN or CLUSTERDOWN: the cluster is between states; send again after
    /// [`RETRY_DELAY`] (only from a cluster).
    Busy,
    /// READONLY: a write reached a master that a failover has just made a replica; send
    /// it to the new master once the map shows it (only from a cluster).
    ReadOnly,
    /// Never written to the node: safe to send again, after [`RETRY_DELAY`].
    Unsent,
    /// The connection failed after the request was written, or timed out: it may have
    /// run, so the request path does not send it again.
    Failed,
    /// A shared cache fill gave the request back ([`BackendError::Resend`]): send it now.
    Resend,
    /// The topology was refreshed to confirm a held redirection ([`BackendError::Recheck`]).
    Recheck,
}

/// Classifies one backend reply. `cluster`: the backends are a Redis Cluster (a
/// standalone Redis sends no redirections, and its errors are all answers).
pub fn classify(result: &Result<Bytes, BackendError>, cluster: bool) -> Verdict {
    match result {
        Ok(data) => {
            let Some(err) = error_text(data) else { return Verdict::Answer };
            if err.starts_with(b"NOSCRIPT") {
                return Verdict::NoScript;
            }
            if !cluster {
                return Verdict::Answer;
            }
            if let Some(r) = parse_redirect(err) {
                return Verdict::Redirect(r);
            }
            if err.starts_with(b"TRYAGAIN") || err.starts_with(b"CLUSTERDOWN") {
                return Verdict::Busy;
            }
            if err.starts_with(b"READONLY") {
                return Verdict::ReadOnly;
            }
            Verdict::Answer
        }
        Err(BackendError::NotSent(_)) => Verdict::Unsent,
        Err(BackendError::Lost(_) | BackendError::Timeout(_)) => Verdict::Failed,
        Err(BackendError::Resend) => Verdict::Resend,
        Err(BackendError::Recheck) => Verdict::Recheck,
    }
}

/// The node a redirection points at, if the cluster announced it: heatshield connects
/// (and sends credentials) to no other address. A MOVED also patches the slot map; a
/// keyless MOVED (`MOVED -1`) never does, and asks for a refresh (a failover happened).
/// `None` changes nothing: the caller refreshes the topology and looks again, or passes
/// the reply on.
pub fn follow(cluster: &Cluster, r: &Redirect) -> Option<Arc<NodePool>> {
    match r {
        Redirect::Moved { slot, addr } => {
            if !cluster.moved(*slot, addr) {
                return None;
            }
            cluster.announced_pool(addr)
        }
        Redirect::Ask { addr, .. } => cluster.announced_pool(addr),
        Redirect::Keyless { addr } => {
            cluster.request_refresh();
            cluster.announced_pool(addr)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &[u8]) -> Result<Bytes, BackendError> {
        Ok(Bytes::copy_from_slice(s))
    }

    #[test]
    fn replies_are_classified() {
        assert!(matches!(classify(&ok(b"+OK\r\n"), true), Verdict::Answer));
        assert!(matches!(classify(&ok(b"-ERR wrong\r\n"), true), Verdict::Answer));
        assert!(matches!(classify(&ok(b"-NOSCRIPT No matching script\r\n"), false), Verdict::NoScript));
        assert!(matches!(
            classify(&ok(b"-MOVED 3999 127.0.0.1:7001\r\n"), true),
            Verdict::Redirect(Redirect::Moved { slot: 3999, .. })
        ));
        assert!(matches!(classify(&ok(b"-ASK 12 127.0.0.1:7001\r\n"), true), Verdict::Redirect(Redirect::Ask { .. })));
        // a standalone Redis sends no redirections: such a text is a script's answer
        assert!(matches!(classify(&ok(b"-MOVED 3999 127.0.0.1:7001\r\n"), false), Verdict::Answer));
        assert!(matches!(classify(&ok(b"-TRYAGAIN Multiple keys\r\n"), true), Verdict::Busy));
        assert!(matches!(classify(&ok(b"-CLUSTERDOWN The cluster is down\r\n"), true), Verdict::Busy));
        assert!(matches!(
            classify(&ok(b"-READONLY You can't write against a read only replica.\r\n"), true),
            Verdict::ReadOnly
        ));
        assert!(matches!(classify(&ok(b"-READONLY You can't write\r\n"), false), Verdict::Answer));
        assert!(matches!(classify(&Err(BackendError::NotSent("a".into())), true), Verdict::Unsent));
        assert!(matches!(classify(&Err(BackendError::Lost("a".into())), true), Verdict::Failed));
        assert!(matches!(classify(&Err(BackendError::Timeout("a".into())), true), Verdict::Failed));
    }
}
