//! The slow log: the most recent commands slower than `admin.slowlog_slower_than_us`,
//! with the stages their time went to.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::protocol::Request;

/// Time spent in each stage of a slow command.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stages {
    /// From the whole request being read until its reply was ready (the backend round trip,
    /// including redirections and retries; ~0 for commands answered by heatshield).
    pub backend: Duration,
    /// From the reply being ready until its turn to be written (replies to earlier
    /// commands of the same client go first).
    pub queued: Duration,
    /// The write to the client.
    pub write: Duration,
}

/// The moments a command passed, from which its [`Stages`] are worked out only when it
/// is slow enough for the log (three subtractions per command were 3% of a transaction's
/// instructions).
#[derive(Debug, Clone, Copy)]
pub struct Moments {
    /// The whole request was read.
    pub started: std::time::Instant,
    /// Its reply was ready.
    pub ready: std::time::Instant,
    /// Its reply went into the output.
    pub queued: std::time::Instant,
    /// The output was written.
    pub written: std::time::Instant,
}

impl Moments {
    pub fn stages(&self) -> Stages {
        Stages {
            backend: self.ready.saturating_duration_since(self.started),
            queued: self.queued.saturating_duration_since(self.ready),
            write: self.written.saturating_duration_since(self.queued),
        }
    }
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

pub(crate) struct SlowEntry {
    pub(crate) id: u64,
    pub(crate) at: u64,
    pub(crate) total: Duration,
    pub(crate) args: Vec<Bytes>,
    pub(crate) client: String,
    pub(crate) name: String,
    pub(crate) node: String,
    pub(crate) stages: Stages,
}

/// The slow log: the most recent commands slower than the threshold.
#[derive(Default)]
pub struct SlowLog {
    pub(crate) entries: Mutex<VecDeque<SlowEntry>>,
    pub(crate) next_id: AtomicU64,
}

impl SlowLog {
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        max_len: usize,
        total: Duration,
        req: &Request,
        client: &str,
        name: &str,
        node: &str,
        stages: Stages,
    ) {
        if max_len == 0 {
            return;
        }
        // as Redis: at most 32 arguments, each at most 128 bytes
        let kept = if req.argc() > 32 { 31 } else { req.argc() };
        let mut args: Vec<Bytes> = (0..kept).map(|i| req.arg_bytes(i)).collect();
        if req.argc() > 32 {
            args.push(Bytes::from(format!("... ({} more arguments)", req.argc() - 31)));
        }
        for a in &mut args {
            if a.len() > 128 {
                let more = a.len() - 128;
                let mut v = a[..128].to_vec();
                v.extend_from_slice(format!("... ({more} more bytes)").as_bytes());
                *a = Bytes::from(v);
            }
        }
        let e = SlowEntry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            at: unix_now(),
            total,
            args,
            client: client.to_string(),
            name: name.to_string(),
            node: node.to_string(),
            stages,
        };
        let mut q = self.entries.lock();
        q.push_front(e);
        q.truncate(max_len);
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn reset(&self) {
        self.entries.lock().clear();
    }
}
