//! Plumbing shared by the process wrappers ([`RedisServer`](super::RedisServer),
//! [`Proxy`](super::Proxy)): waiting for a condition, killing and reaping a child,
//! reading its log for the tail printed when a test panics.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// Number of log lines printed when a process is dropped during a panic.
pub const LOG_TAIL_LINES: usize = 40;

/// Locks a mutex, ignoring poisoning (a panicking test must not break the
/// teardown or the port registry for the other tests in the binary).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `f` every 20 ms until it returns true; panics mentioning `what` if
/// that does not happen within `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    poll(timeout, Duration::from_millis(20), what, || if f() { Ok(()) } else { Err("condition false".into()) });
}

/// Like [`wait_until`] but with a configurable interval, and the closure
/// explains *why* it is not done yet; the last reason ends up in the panic.
pub fn poll(timeout: Duration, interval: Duration, what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + timeout;
    loop {
        let reason = match f() {
            Ok(()) => return,
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what} (last state: {reason})");
        }
        thread::sleep(interval);
    }
}

/// Last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// When the test thread is panicking, prints the tail of a dropped process's log, so a
/// failure can be diagnosed from `cargo test` output.
pub fn report_if_panicking(what: &str, port: u16, pid: u32, log: impl FnOnce() -> String) {
    if thread::panicking() {
        eprintln!("----- {what} {port} (pid {pid}) log tail -----\n{}\n-----", tail(&log(), LOG_TAIL_LINES));
    }
}

/// A file's contents as lossy UTF-8; empty if it cannot be read.
pub fn read_lossy(path: &Path) -> String {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// Kills (SIGKILL) and reaps a child; a no-op if it already exited.
pub fn kill_child(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = child.kill();
    child.wait().ok()
}

/// Maps an exit status to a shell-style code (128 + signal if signalled).
pub fn exit_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(-1)
}
