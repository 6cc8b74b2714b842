//! A blocking command (BLPOP, BZPOPMIN, XREAD BLOCK, ...): where its timeout is and when
//! it ends ([`Block::of`]), and what remains of it when the command is issued again after
//! a redirection or a failover ([`remaining`]); `super::start_blocking` sends it on a
//! dedicated connection. The session keeps the one blocked request of a connection (nothing
//! after it is dispatched until it is answered) and answers CLIENT UNBLOCK with the
//! command's own timeout reply.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::command::Command;
use crate::protocol::Request;

/// A blocking command's own timeout, so that a re-issue (after a redirection or a
/// failover) waits only what remains of it.
pub struct Block {
    /// When its timeout ends (`None`: it waits for ever).
    pub deadline: Option<Instant>,
    /// The argument that is the timeout.
    pub arg: usize,
    /// The timeout is in milliseconds (XREAD BLOCK), not seconds.
    pub ms: bool,
    /// Its timeout is a nil string, not a nil array (BRPOPLPUSH, BLMOVE).
    pub nil_string: bool,
}

/// Clients blocked now (INFO's `blocked_clients`; the process's, like the metric).
pub static BLOCKED: AtomicUsize = AtomicUsize::new(0);
/// Those of them whose command has a timeout (INFO's `clients_in_timeout_table`).
pub static BLOCKED_TIMED: AtomicUsize = AtomicUsize::new(0);

impl Block {
    /// Counted in `heatshield_blocked_clients`, [`BLOCKED`] and [`BLOCKED_TIMED`] while it exists.
    pub fn new(deadline: Option<Instant>, arg: usize, ms: bool, nil_string: bool) -> Block {
        crate::metrics::global().blocked.increment(1.0);
        BLOCKED.fetch_add(1, Ordering::Relaxed);
        if deadline.is_some() {
            BLOCKED_TIMED.fetch_add(1, Ordering::Relaxed);
        }
        Block { deadline, arg, ms, nil_string }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        crate::metrics::global().blocked.decrement(1.0);
        BLOCKED.fetch_sub(1, Ordering::Relaxed);
        if self.deadline.is_some() {
            BLOCKED_TIMED.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Block {
    /// The timeout of blocking command `cmd` sent as `req` at `now`: where it is (first,
    /// after BLOCK, or last, as the command table's traits say), when it ends, and how
    /// long the request may wait for its reply (0: Redis answers at once, the timeout it
    /// cannot read; `u32::MAX`: for ever).
    pub fn of(cmd: &Command, req: &Request, now: Instant) -> (Block, u32) {
        use crate::command::traits::{BLOCK_OPTION, NIL_STRING_ON_TIMEOUT, TIMEOUT_FIRST};
        let (arg, ms) = if cmd.has(TIMEOUT_FIRST) {
            (1, false)
        } else if cmd.has(BLOCK_OPTION) {
            let at = req.args().position(|a| a.eq_ignore_ascii_case(b"BLOCK")).unwrap_or(0);
            (at + 1, true)
        } else {
            (req.argc() - 1, false)
        };
        // Redis checks the timeout itself: one it cannot read is answered at once
        let timeout = std::str::from_utf8(req.arg(arg)).ok().and_then(|t| t.parse::<f64>().ok());
        let (deadline, wait_ms) = match timeout {
            Some(t) if t > 0.0 && t.is_finite() => {
                let millis = if ms { t } else { t * 1000.0 };
                let d = Duration::from_millis(millis.min(u32::MAX as f64) as u64);
                (Some(now + d), d.as_millis() as u32)
            }
            Some(0.0) => (None, u32::MAX),
            _ => (None, 0),
        };
        (Block::new(deadline, arg, ms, cmd.has(NIL_STRING_ON_TIMEOUT)), wait_ms)
    }
}

/// A blocking command with its timeout replaced by what remains of it (at least 1 ms, so
/// Redis itself answers the timeout in the command's own form).
pub(super) fn remaining(req: &Request, b: &Block, now: Instant) -> Bytes {
    let Some(deadline) = b.deadline else { return req.raw().clone() };
    let left = deadline.saturating_duration_since(now).as_millis().max(1);
    let value = if b.ms { left.to_string() } else { format!("{}.{:03}", left / 1000, left % 1000) };
    let args: Vec<&[u8]> = req.args().enumerate().map(|(i, a)| if i == b.arg { value.as_bytes() } else { a }).collect();
    Request::from_args(&args).raw().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_of(args: &[&str]) -> (Block, u32, Request) {
        let table = crate::command::CommandTable::new();
        let req = Request::from_args(args);
        let cmd = table.lookup(&req).unwrap();
        let (b, wait) = Block::of(cmd, &req, Instant::now());
        (b, wait, req)
    }

    #[test]
    fn the_timeout_is_found_where_each_command_keeps_it() {
        let (b, wait, _) = block_of(&["BLPOP", "a", "b", "1.5"]);
        assert_eq!((b.arg, b.ms, b.nil_string, wait), (3, false, false, 1500));
        let (b, wait, _) = block_of(&["BLMPOP", "2", "2", "a", "b", "LEFT"]);
        assert_eq!((b.arg, b.ms, wait), (1, false, 2000));
        let (b, wait, _) = block_of(&["XREAD", "COUNT", "1", "BLOCK", "250", "STREAMS", "s", "$"]);
        assert_eq!((b.arg, b.ms, wait), (4, true, 250));
        let (b, _, _) = block_of(&["BLMOVE", "a", "b", "LEFT", "RIGHT", "1"]);
        assert!(b.nil_string, "BLMOVE times out with a nil string");
        // 0 waits for ever; what Redis cannot read it answers at once
        let (b, wait, _) = block_of(&["BLPOP", "a", "0"]);
        assert_eq!((b.deadline, wait), (None, u32::MAX));
        let (_, wait, _) = block_of(&["BLPOP", "a", "soon"]);
        assert_eq!(wait, 0);
    }

    #[test]
    fn a_reissue_waits_only_what_remains() {
        let (b, _, req) = block_of(&["BLPOP", "a", "2"]);
        let later = b.deadline.unwrap() - Duration::from_millis(750);
        assert_eq!(&remaining(&req, &b, later)[..], Request::from_args(&["BLPOP", "a", "0.750"]).raw());
        // past its end: 1 ms, so Redis answers the timeout in the command's own form
        let past = b.deadline.unwrap() + Duration::from_secs(1);
        assert_eq!(&remaining(&req, &b, past)[..], Request::from_args(&["BLPOP", "a", "0.001"]).raw());
        let (b, _, req) = block_of(&["XREAD", "BLOCK", "900", "STREAMS", "s", "$"]);
        let later = b.deadline.unwrap() - Duration::from_millis(400);
        assert_eq!(
            &remaining(&req, &b, later)[..],
            Request::from_args(&["XREAD", "BLOCK", "400", "STREAMS", "s", "$"]).raw()
        );
        // for ever stays for ever
        let (b, _, req) = block_of(&["BLPOP", "a", "0"]);
        assert_eq!(&remaining(&req, &b, Instant::now())[..], req.raw());
    }
}
