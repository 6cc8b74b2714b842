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

/// The number of workers for a configured `threads` value (0 = one per core but one, at
/// least one: the load generator, Redis or the application usually need a core of the
/// machine too; on a 2-core machine one worker served 17-27% more requests per second at
/// -P1 than two, and 7-9% more per CPU-second at -P16: `scripts/bench-threads.sh`).
pub fn count(threads: usize) -> usize {
    if threads > 0 {
        return threads;
    }
    default_count(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// `threads = 0` on a machine with `cores` cores.
fn default_count(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_leaves_a_core() {
        assert_eq!(super::default_count(1), 1);
        assert_eq!(super::default_count(2), 1);
        assert_eq!(super::default_count(8), 7);
        assert_eq!(super::count(3), 3);
    }
}
