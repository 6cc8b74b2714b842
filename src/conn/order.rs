//! Order: a client's commands take effect in the order it sent them, as on one Redis
//! connection, whatever way to Redis each one takes (docs/design/ordering.md).
//!
//! One Redis connection runs its commands one after the other. heatshield sends a
//! client's commands on several ways to Redis: the node's shared pipelined connection
//! this client uses (one per node and protocol, so its commands to one node stay in
//! order), the connection its WATCH pinned, a dedicated connection of the request's own
//! (a blocking command, SCRIPT KILL), the pub/sub hub's links, the lock task. Two rules
//! keep the order, both applied by the session:
//!
//! 1. **A switch waits.** Each request is given a [`Lane`] before dispatch (no side effect
//!    has happened yet). A request whose lane differs from the lane of the client's
//!    requests in flight, or that needs a way of its own, is not dispatched until every
//!    earlier request has its reply ([`must_wait`]); the requests after it wait behind it.
//!    A client whose commands all take the shared connections pays one comparison.
//! 2. **A retry goes first.** Once a request meets a reply that is not its answer (a
//!    redirection, TRYAGAIN, CLUSTERDOWN, a connection that failed before sending, ...),
//!    the client's later requests are not dispatched until it has its answer, and any
//!    non-answer a later request in flight meets is held until then, so their resends go
//!    out after it, in the client's order.

use crate::command::{Command, FanOut, KeySpec, Local, Route, TxCmd, keys_of};
use crate::conn::{ClientState, Mode};
use crate::protocol::Proto;
use crate::protocol::Request;
use crate::upstream::cluster::slot;

/// The way to Redis a request takes (a byte: it is compared on every pipelined request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Lane {
    /// Answered from heatshield's own state, changing nothing a request in flight uses (a
    /// command queued after MULTI): never waits.
    #[default]
    Local,
    /// The nodes' shared pipelined connections this client uses, in RESP2 (each node's
    /// one connection for this client, so requests to one node stay in order).
    Shared2,
    /// The same in RESP3: other connections.
    Shared3,
    /// Reads a read policy may send to replicas (crate::services::reads), on their
    /// connections or, falling back, the shared ones: reads only, so their order among
    /// themselves changes nothing, while a write after them waits for them.
    Replica,
    /// The client's WATCH connection.
    Pinned,
    /// Parked with the lock task (`LOCK.ACQUIRE ... WAIT`), which serves each lock's
    /// waiters in the order they came: several may wait together, the commands after them
    /// wait for them.
    LockTask,
    /// A way of its own (a dedicated connection, the pub/sub hub), or a change to the way
    /// the requests in flight travel (the end of a WATCH, RESET): only once nothing is in
    /// flight.
    Own,
}

impl Lane {
    /// The shared connections in protocol `p`.
    #[inline]
    pub fn shared(p: Proto) -> Lane {
        match p {
            Proto::Resp2 => Lane::Shared2,
            Proto::Resp3 => Lane::Shared3,
        }
    }
}

/// Whether a request on `next` must wait until the client's `inflight` requests, all on
/// `current`, have their replies.
#[inline]
pub fn must_wait(inflight: u32, current: Lane, next: Lane) -> bool {
    inflight > 0 && next != Lane::Local && (next != current || next == Lane::Own)
}

/// The lane of request `req` (command `cmd`) from `client` now.
#[inline]
pub fn lane(client: &ClientState, cmd: &Command, req: &Request) -> Lane {
    let queuing = matches!(client.modes.multi, Mode::Multi(_));
    // the usual request: one look at the command and the connection
    if cmd.shared_lane && client.modes.watch.is_none() && !queuing {
        return Lane::shared(client.proto);
    }
    lane_of(client, cmd, req, queuing)
}

/// [`lane`] for the rest.
#[inline(never)]
fn lane_of(client: &ClientState, cmd: &Command, req: &Request, queuing: bool) -> Lane {
    let shared = Lane::shared(client.proto);
    let watching = client.modes.watch.as_ref().map(|w| w.slot);
    // the watched slot's connection; a void watch's commands go another way: once nothing
    // is in flight on it
    let pinned = match &client.modes.watch {
        Some(w) if !w.void() => Lane::Pinned,
        _ => Lane::Own,
    };
    match cmd.route {
        // EXEC under WATCH gives the pinned connection back (or closes it if a request is
        // still on it): after the replies in flight
        Route::Transaction(TxCmd::Exec) if watching.is_some() => Lane::Own,
        Route::Transaction(TxCmd::Exec) => shared,
        // so do DISCARD in MULTI and UNWATCH outside it
        Route::Transaction(TxCmd::Discard) if watching.is_some() && queuing => Lane::Own,
        Route::Transaction(TxCmd::Unwatch) if watching.is_some() && !queuing => Lane::Own,
        Route::Transaction(TxCmd::Watch) if !queuing => match watching {
            Some(s) if slot_of(cmd, req) == Some(s) => pinned,
            Some(_) => Lane::Local,
            None => Lane::Own,
        },
        Route::Transaction(_) => Lane::Local,
        Route::Local(Local::Reset | Local::Wait | Local::WaitAof) => Lane::Own,
        Route::Local(Local::Quit) => shared,
        _ if queuing => Lane::Local,
        Route::Block => match watching {
            Some(s) if slot_of(cmd, req) == Some(s) => pinned,
            _ => Lane::Own,
        },
        Route::Forward if blocking_read(cmd, req) => match watching {
            Some(s) if slot_of(cmd, req) == Some(s) => pinned,
            _ => Lane::Own,
        },
        Route::Subscribe(..) | Route::FanOut(FanOut::Kill) => Lane::Own,
        // an ACQUIRE that may wait is parked with the lock task
        Route::Lock(_) if req.args().skip(2).any(|a| a.eq_ignore_ascii_case(b"WAIT")) => Lane::LockTask,
        Route::FanOut(_) | Route::AnyMaster | Route::Local(_) | Route::Unsupported(_) => shared,
        Route::Forward | Route::Split(_) | Route::Lock(_) => match watching {
            Some(s) if slot_of(cmd, req) == Some(s) => pinned,
            _ => shared,
        },
    }
}

/// XREAD / XREADGROUP with BLOCK.
fn blocking_read(cmd: &Command, req: &Request) -> bool {
    matches!(cmd.keys, KeySpec::Streams) && cmd.blocks_with(req)
}

/// The one slot the request's keys share (a keyless script's is slot 0; a lock command's
/// is its key's), if they share one.
fn slot_of(cmd: &Command, req: &Request) -> Option<u16> {
    if matches!(cmd.route, Route::Lock(_)) {
        return (req.argc() > 1).then(|| slot(req.arg(1)));
    }
    let keys = keys_of(cmd, req).ok()?;
    let Some(&k0) = keys.first() else {
        return cmd.keys.is_script().then_some(0);
    };
    let s = slot(req.arg(k0 as usize));
    keys[1..].iter().all(|&k| slot(req.arg(k as usize)) == s).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Proto;

    #[test]
    fn only_a_change_of_way_waits() {
        let r2 = Lane::shared(Proto::Resp2);
        let r3 = Lane::shared(Proto::Resp3);
        // nothing in flight: nothing waits
        for next in [Lane::Local, r2, r3, Lane::Pinned, Lane::LockTask, Lane::Own] {
            assert!(!must_wait(0, r2, next));
        }
        // the same shared connections, or the same pinned one: no wait
        assert!(!must_wait(3, r2, r2));
        assert!(!must_wait(3, Lane::Pinned, Lane::Pinned));
        assert!(!must_wait(3, Lane::Pinned, Lane::Local));
        // another protocol's connections, the pinned one, a way of its own: wait
        assert!(must_wait(1, r2, r3));
        assert!(must_wait(1, r2, Lane::Pinned));
        assert!(must_wait(1, Lane::Pinned, r2));
        assert!(must_wait(1, r2, Lane::Own));
        assert!(must_wait(1, Lane::Own, Lane::Own));
        assert!(must_wait(1, Lane::Own, r2));
        // reads that may go to replicas are in flight together; a write after them waits
        assert!(!must_wait(4, Lane::Replica, Lane::Replica));
        assert!(must_wait(1, Lane::Replica, r2));
        assert!(must_wait(1, r2, Lane::Replica));
        // lock waiters wait together; what comes after them waits for them
        assert!(!must_wait(2, Lane::LockTask, Lane::LockTask));
        assert!(must_wait(2, Lane::LockTask, r2));
        assert!(must_wait(2, r2, Lane::LockTask));
    }
}
