//! The hold of a cutover or rollback: while the serving cluster changes, no request of any
//! client is dispatched, and the change waits until every request already sent has been
//! answered (and so noted for its copy) and every copy has landed. Then the requests held
//! go to the other cluster, in each client's order, and read what was written before.
//!
//! - Sessions look at [`Gate::held`] before they dispatch what they read (one relaxed
//!   load a read), and count themselves busy while they have requests in flight
//!   ([`Gate::busy`]: only where a migration target is configured, once per change
//!   between none and some). The hold ends with a `Resume` sent to every session.
//! - A blocking command waiting on the old cluster would wait there for ever: it is ended
//!   as if it timed out (docs/migration.md lists it among what a client sees).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// How long a cutover waits for requests in flight and copies pending before it gives up
/// (and lets the held requests go on to the cluster they were bound for).
pub const SETTLE: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct Gate {
    closed: AtomicBool,
    /// Sessions with requests in flight.
    busy: AtomicI64,
}

impl Gate {
    /// Whether requests are held now.
    #[inline]
    pub fn held(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// A session's requests in flight went from none to some (`1`) or back (`-1`).
    #[inline]
    pub fn busy(&self, by: i64) {
        self.busy.fetch_add(by, Ordering::AcqRel);
    }

    /// Sessions with requests in flight now.
    pub fn busy_sessions(&self) -> i64 {
        self.busy.load(Ordering::Acquire)
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
    }

    /// Waits (up to `within`) until `done` holds, looking every millisecond.
    pub async fn until(within: Duration, mut done: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + within;
        while !done() {
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hold_waits_for_the_busy_sessions() {
        let g = Gate::default();
        assert!(!g.held());
        g.close();
        assert!(g.held());
        g.busy(1);
        assert!(!Gate::until(Duration::from_millis(20), || g.busy_sessions() == 0).await);
        g.busy(-1);
        assert!(Gate::until(Duration::from_millis(20), || g.busy_sessions() == 0).await);
        g.open();
        assert!(!g.held());
    }
}
