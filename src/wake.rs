//! Wake: which of a task's sources woke it. A task that waits on several sources (a
//! socket and a channel, say) is polled whenever any of them fires, and each poll used to
//! ask every source again; a source whose last poll came back pending, and which has not
//! fired since, can only say "not yet". [`Noted`] is a waker for one source: it notes that
//! the source fired before it wakes the task, so the task polls that source only when it
//! may have something.
//!
//! Only for a source that wakes nothing but the waker of its last pending poll (a plain
//! TCP half read by one future). A source whose readiness could be registered by another
//! poll with another waker (the halves of a TLS stream share one socket) must be polled
//! every time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Wake, Waker};

/// The waker of one source of a task, and whether that source is known to be idle.
pub struct Noted {
    state: Option<(Arc<Fired>, Waker)>,
    /// The source's last poll, with this waker, came back pending, and it has not fired
    /// since.
    idle: bool,
}

struct Fired {
    fired: AtomicBool,
    task: Waker,
}

impl Wake for Fired {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake_by_ref();
    }
}

impl Default for Noted {
    fn default() -> Self {
        Noted::new()
    }
}

impl Noted {
    pub fn new() -> Noted {
        Noted { state: None, idle: false }
    }

    /// The waker to poll the source with, or `None` when it is idle (the poll would only
    /// come back pending). `task` is the waker of the poll under way; a new one (the
    /// task's waker changed) starts over.
    #[inline]
    pub fn to_poll(&mut self, task: &Waker) -> Option<&Waker> {
        match &self.state {
            Some((f, _)) if f.task.will_wake(task) => {
                // (cleared before the poll: a wake-up from here on is for a later poll)
                if !f.fired.swap(false, Ordering::AcqRel) && self.idle {
                    return None;
                }
            }
            _ => {
                let f = Arc::new(Fired { fired: AtomicBool::new(false), task: task.clone() });
                let w = Waker::from(f.clone());
                self.state = Some((f, w));
            }
        }
        self.state.as_ref().map(|(_, w)| w)
    }

    /// How the poll with [`Noted::to_poll`]'s waker came back.
    #[inline]
    pub fn polled(&mut self, pending: bool) {
        self.idle = pending;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_source_is_polled_again_only_once_it_fired() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        let mut n = Noted::new();
        // first poll: always
        let w = n.to_poll(&task).expect("polled").clone();
        n.polled(true);
        // pending and not fired: skipped, again and again
        assert!(n.to_poll(&task).is_none());
        assert!(n.to_poll(&task).is_none());
        // the source fires: the task is woken, and the source polled
        w.wake_by_ref();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(n.to_poll(&task).is_some());
        // it came back ready: polled next time whatever happens
        n.polled(false);
        assert!(n.to_poll(&task).is_some());
        n.polled(true);
        assert!(n.to_poll(&task).is_none());
        // a fire that lands between the check and the poll is kept for the next check
        w.wake_by_ref();
        assert!(n.to_poll(&task).is_some());
        w.wake_by_ref();
        n.polled(true);
        assert!(n.to_poll(&task).is_some());
    }

    #[test]
    fn another_task_waker_starts_over() {
        let a = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let b = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let mut n = Noted::new();
        n.to_poll(&a);
        n.polled(true);
        assert!(n.to_poll(&a).is_none());
        // polled with another task's waker: polled (and registered) again
        assert!(n.to_poll(&b).is_some());
    }
}
