//! Worker threads. heatshield runs one single-threaded tokio runtime per worker thread
//! (thread-per-core): each worker accepts its own clients (the kernel spreads connections
//! over the workers' listeners with SO_REUSEPORT) and owns its own backend connections, so
//! a request, its backend connection and its reply never cross threads. This module only
//! knows which worker the current thread is.

use std::cell::Cell;

thread_local! {
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// Index of the worker running on this thread (0 outside workers).
#[inline]
pub fn current() -> usize {
    WORKER.with(|w| w.get())
}

/// Marks this thread as worker `i`.
pub fn set_current(i: usize) {
    WORKER.with(|w| w.set(i));
}

/// The number of workers for a configured `threads` value (0 = one per core).
pub fn count(threads: usize) -> usize {
    if threads > 0 { threads } else { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) }
}
