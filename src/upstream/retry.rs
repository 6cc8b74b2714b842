//! Retry rules: the one table of reactions to what a node answers. [`classify`] says what
//! a reply means ([`Verdict`]); [`react`] says what the request that got it does next
//! ([`Step`]), given how far that request has come ([`Attempt`]), carrying what the
//! caller needs to do it (the redirection, the slot, the error) so that no caller reads
//! the reply again. Plain requests, split parts and the reply ordering
//! ([`crate::path::pending`], the session), transactions (which gather their replies' verdicts)
//! and the lock task ([`crate::services::locks`]) all react here: they follow the same
//! redirections, wait out a failover the same way and give up at the same limits.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::mailbox::BackendError;
use crate::protocol::reply::{Redirect, error_text, parse_redirect};
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

impl Verdict {
    /// The node that answered is not (or no longer) where the request's keys are served:
    /// a WATCH that ran there guards nothing now.
    pub fn leaves_node(&self) -> bool {
        matches!(self, Verdict::Redirect(_) | Verdict::Busy | Verdict::ReadOnly | Verdict::Unsent | Verdict::Failed)
    }
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

/// Classifies the reply of a blocking command: as [`classify`], and `-UNBLOCKED` (Redis
/// let the client go because its node stopped being a master) is [`Verdict::Busy`].
pub fn classify_blocked(result: &Result<Bytes, BackendError>, cluster: bool) -> Verdict {
    match result {
        Ok(d) if d.starts_with(b"-UNBLOCKED") => Verdict::Busy,
        _ => classify(result, cluster),
    }
}

/// How far a request has come, as far as what it does with a reply depends on it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attempt {
    /// Redirections followed so far (at most [`MAX_REDIRECTS`]).
    pub redirects: u16,
    /// Sends retried so far (at most [`MAX_RETRIES`]).
    pub retries: u16,
    /// The reply waited behind an earlier request's retry: an ASK in it is out of date.
    pub behind_retry: bool,
    /// A blocking command on a connection of its own.
    pub blocked: bool,
    /// ... whose own timeout is over.
    pub expired: bool,
    /// On a dedicated connection (a blocked command, a transaction under WATCH).
    pub dedicated: bool,
    /// Sent to a slot's owner (not to a node named by a redirection or a fan-out).
    pub by_slot: bool,
    /// Sent after an ASK (to the node it named, for that one query).
    pub asked: bool,
    /// A read whose exact reply the hot-key cache holds under a stale-if-error rule:
    /// when its master cannot answer, that reply answers ([`Step::Stale`]).
    pub may_stale: bool,
}

/// What a request does next with a reply ([`react`]).
#[derive(Debug)]
pub enum Step {
    /// The reply is the answer: an answer, an error reply, or a redirection or retry past
    /// its limit.
    Answer,
    /// NOSCRIPT: send the script whole (its EVAL form), as one more redirection; a caller
    /// that does not know the script passes the reply on.
    Reload,
    /// FCALL of a function this node lacks: load the library heatshield saw register it,
    /// on the connection the call goes on again, then send the call (once).
    LoadFunction,
    /// Follow a redirection: to its node if the cluster announced it, else hold the reply
    /// until a refresh of the topology confirms or refutes it ([`Step::Recheck`] comes
    /// then).
    Follow(Redirect),
    /// An ASK that waited behind an earlier request's retry: ask the slot's owner again
    /// now (the slot may have moved on, and ASKING there could create the key afresh).
    AskOwner(u16),
    /// TRYAGAIN or CLUSTERDOWN: refresh the topology and send again after
    /// [`RETRY_DELAY`]. `tryagain`: a multi-key command whose keys a migration splits,
    /// which may be served key by key instead.
    Busy { tryagain: bool },
    /// READONLY: a write reached a master that a failover made a replica. A slot's
    /// request goes to the slot's owner later; one meant for that node, to the replica
    /// promoted in its place once a refresh shows it.
    NewMaster,
    /// A blocked command whose connection broke (its node failed over): issue it again
    /// to the slot's owner, with what remains of its timeout.
    Reissue,
    /// A refresh confirmed or refuted a held redirection or READONLY: look at it again.
    Recheck,
    /// A shared cache fill gave the request back: send it now.
    Resend,
    /// The node could not be reached. `retry`: send again later (a slot's request,
    /// within its retries); else give up with [`crate::errors::node_unreachable`].
    Unreachable { addr: Arc<str>, retry: bool },
    /// The request was written and its connection failed (or timed out): it may have run,
    /// so it is not sent again; give up with [`crate::errors::backend_failed`].
    Fail(BackendError),
    /// A blocked command sent back and forth past the limit while slots move, once its
    /// own timeout is over: it timed out, as on one Redis (its nil reply, not a MOVED).
    TimedOut,
    /// The master cannot answer now (busy, unreachable, failed) and a stale-if-error rule
    /// covers the read: answer with the cached reply (crate::services::cache) if one is
    /// held, else do what the step inside says.
    Stale(Box<Step>),
    /// A read sent to a replica that failed, does not serve the slot any more, or is not
    /// ready (LOADING, MASTERDOWN): a read is safe to send again, to the slot's master.
    ToMaster,
    /// The same under `read_from = "replica"`: no master to fall back on; give up with
    /// [`crate::errors::no_replica`].
    NoReplica,
}

/// The reaction table: what a request at `a` does with a reply that [`classify`] read as
/// `verdict`. (A replica's reply first goes through [`react_on_replica`].)
pub fn react(verdict: Verdict, result: &Result<Bytes, BackendError>, a: &Attempt) -> Step {
    let step = react_on_master(verdict, result, a);
    match step {
        Step::Busy { .. } | Step::Unreachable { .. } | Step::Fail(_) if a.may_stale => Step::Stale(Box::new(step)),
        step => step,
    }
}

/// The rows of the table for a reply from a replica that serves reads
/// (crate::services::reads): `Some` when the replica could not answer the read
/// ([`Step::ToMaster`], or [`Step::NoReplica`] when `strict`), `None` when its reply is
/// the answer (or a NOSCRIPT, reloaded there as on a master).
pub fn react_on_replica(verdict: &Verdict, result: &Result<Bytes, BackendError>, strict: bool) -> Option<Step> {
    let not_ready = matches!(result, Ok(d) if d.starts_with(b"-LOADING") || d.starts_with(b"-MASTERDOWN"));
    if matches!(verdict, Verdict::Answer | Verdict::NoScript) && !not_ready {
        return None;
    }
    Some(if strict { Step::NoReplica } else { Step::ToMaster })
}

/// [`react`] before the stale-if-error row.
fn react_on_master(verdict: Verdict, result: &Result<Bytes, BackendError>, a: &Attempt) -> Step {
    let redirect = a.redirects < MAX_REDIRECTS;
    let retry = a.retries < MAX_RETRIES;
    match (verdict, result) {
        (Verdict::NoScript, _) if redirect => Step::Reload,
        (Verdict::Redirect(Redirect::Ask { slot, .. }), _) if a.behind_retry && redirect => Step::AskOwner(slot),
        (Verdict::Redirect(r), _) if redirect => Step::Follow(r),
        (Verdict::Busy, Ok(d)) if retry => Step::Busy { tryagain: d.starts_with(b"-TRYAGAIN") },
        (Verdict::ReadOnly, _) if retry => Step::NewMaster,
        (Verdict::Failed, _) if a.blocked && retry => Step::Reissue,
        (Verdict::Recheck, _) => Step::Recheck,
        (Verdict::Resend, _) => Step::Resend,
        (Verdict::Unsent, Err(e)) => {
            let addr = match e {
                BackendError::NotSent(a) => a.clone(),
                _ => Arc::from(""),
            };
            Step::Unreachable { addr, retry: a.by_slot && retry }
        }
        (_, Err(e)) => Step::Fail(e.clone()),
        (Verdict::Answer, Ok(d))
            if d.starts_with(b"-ERR Function not found") && !a.dedicated && redirect && !a.asked =>
        {
            Step::LoadFunction
        }
        (Verdict::Redirect(_) | Verdict::Busy, _) if a.expired => Step::TimedOut,
        _ => Step::Answer,
    }
}

/// A reply saying nothing of the request ran on that node, though the requests sent
/// behind it on the same connection may have: TRYAGAIN (keys split by a migration),
/// NOSCRIPT (a script the node's cache lacks) and `Function not found` (a function
/// library it lacks). Its retry would come after them, so the session holds it until
/// they have their replies (see its ordering rule).
#[inline]
pub fn ran_nothing(result: &Result<Bytes, BackendError>) -> bool {
    match result {
        Ok(d) if d.first() == Some(&b'-') => {
            d.starts_with(b"-TRYAGAIN") || d.starts_with(b"-NOSCRIPT") || d.starts_with(b"-ERR Function not found")
        }
        _ => false,
    }
}

/// A reply that may not be its request's answer: an error reply (a redirection,
/// TRYAGAIN, ...) or no reply at all (a connection error, a resend).
#[inline]
pub fn may_not_answer(result: &Result<Bytes, BackendError>) -> bool {
    match result {
        Ok(d) => d.first() == Some(&b'-'),
        Err(_) => true,
    }
}

/// EXEC's reply says the native transaction did not run: EXECABORT, or any error once a
/// queued command was redirected or found its slot busy (Redis Cluster then discards
/// the transaction at EXEC).
pub fn exec_aborted(exec: &[u8], redirected_or_busy: bool) -> bool {
    exec.starts_with(b"-EXECABORT") || (exec.first() == Some(&b'-') && redirected_or_busy)
}

/// A MOVED or ASK to an address the slot map does not announce (a script can answer any
/// error text): its request sends nothing before a refresh has looked again.
pub fn unannounced(cluster: &Cluster, result: &Result<Bytes, BackendError>) -> bool {
    let Ok(d) = result else { return false };
    let Some(redirect) = error_text(d).and_then(parse_redirect) else { return false };
    let addr = redirect.addr();
    let topo = cluster.topology();
    !topo.masters.iter().any(|m| &*m.addr == addr) && !topo.announces(addr)
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
        assert!(matches!(classify_blocked(&ok(b"-UNBLOCKED force unblock\r\n"), true), Verdict::Busy));
        assert!(matches!(classify(&ok(b"-UNBLOCKED force unblock\r\n"), true), Verdict::Answer));
    }

    fn step(reply: &Result<Bytes, BackendError>, a: Attempt) -> Step {
        react(classify(reply, true), reply, &a)
    }

    #[test]
    fn redirections_are_followed_up_to_their_limit() {
        let moved = ok(b"-MOVED 3999 127.0.0.1:7001\r\n");
        assert!(matches!(step(&moved, Attempt::default()), Step::Follow(Redirect::Moved { slot: 3999, .. })));
        let spent = Attempt { redirects: MAX_REDIRECTS, ..Attempt::default() };
        assert!(matches!(step(&moved, spent), Step::Answer));
        let ask = ok(b"-ASK 12 127.0.0.1:7001\r\n");
        assert!(matches!(step(&ask, Attempt::default()), Step::Follow(Redirect::Ask { slot: 12, .. })));
        // an ASK that waited is out of date: the slot's owner is asked again
        assert!(matches!(step(&ask, Attempt { behind_retry: true, ..Attempt::default() }), Step::AskOwner(12)));
        let noscript = ok(b"-NOSCRIPT No matching script\r\n");
        assert!(matches!(step(&noscript, Attempt::default()), Step::Reload));
        assert!(matches!(step(&noscript, spent), Step::Answer));
    }

    #[test]
    fn a_failover_is_waited_out_up_to_the_retry_limit() {
        let spent = Attempt { retries: MAX_RETRIES, ..Attempt::default() };
        for (reply, tryagain) in [(&b"-TRYAGAIN Multiple keys\r\n"[..], true), (b"-CLUSTERDOWN down\r\n", false)] {
            assert!(matches!(step(&ok(reply), Attempt::default()), Step::Busy { tryagain: t } if t == tryagain));
            assert!(matches!(step(&ok(reply), spent), Step::Answer));
        }
        let readonly = ok(b"-READONLY You can't write against a read only replica.\r\n");
        assert!(matches!(step(&readonly, Attempt::default()), Step::NewMaster));
        assert!(matches!(step(&readonly, spent), Step::Answer));
        // a blocked command past its own timeout times out instead of answering MOVED
        let expired = Attempt { redirects: MAX_REDIRECTS, blocked: true, expired: true, ..Attempt::default() };
        assert!(matches!(step(&ok(b"-MOVED 1 127.0.0.1:7001\r\n"), expired), Step::TimedOut));
        assert!(matches!(
            step(&ok(b"-CLUSTERDOWN down\r\n"), Attempt { retries: MAX_RETRIES, ..expired }),
            Step::TimedOut
        ));
    }

    #[test]
    fn only_what_was_never_written_is_sent_again() {
        let unsent = Err(BackendError::NotSent("127.0.0.1:7001".into()));
        let slot = Attempt { by_slot: true, ..Attempt::default() };
        assert!(
            matches!(step(&unsent, slot), Step::Unreachable { retry: true, ref addr } if &**addr == "127.0.0.1:7001")
        );
        assert!(matches!(step(&unsent, Attempt::default()), Step::Unreachable { retry: false, .. }));
        let spent = Attempt { retries: MAX_RETRIES, ..slot };
        assert!(matches!(step(&unsent, spent), Step::Unreachable { retry: false, .. }));
        // written, then the connection failed: it may have run
        let lost = Err(BackendError::Lost("n".into()));
        assert!(matches!(step(&lost, slot), Step::Fail(BackendError::Lost(_))));
        // ... unless it is a blocked command, which Redis forgets with its connection
        assert!(matches!(step(&lost, Attempt { blocked: true, ..slot }), Step::Reissue));
        assert!(matches!(step(&Err(BackendError::Resend), slot), Step::Resend));
        assert!(matches!(step(&Err(BackendError::Recheck), slot), Step::Recheck));
    }

    #[test]
    fn a_missing_function_is_loaded_once_where_heatshield_chose_the_node() {
        let missing = ok(b"-ERR Function not found\r\n");
        assert!(matches!(step(&missing, Attempt::default()), Step::LoadFunction));
        assert!(matches!(step(&missing, Attempt { redirects: MAX_REDIRECTS, ..Attempt::default() }), Step::Answer));
        assert!(matches!(step(&missing, Attempt { dedicated: true, ..Attempt::default() }), Step::Answer));
        assert!(matches!(step(&missing, Attempt { asked: true, ..Attempt::default() }), Step::Answer));
        assert!(matches!(step(&ok(b"-ERR other\r\n"), Attempt::default()), Step::Answer));
    }

    #[test]
    fn what_the_session_holds() {
        assert!(ran_nothing(&ok(b"-TRYAGAIN Multiple keys\r\n")));
        assert!(ran_nothing(&ok(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")));
        assert!(ran_nothing(&ok(b"-ERR Function not found\r\n")));
        assert!(!ran_nothing(&ok(b"+TRYAGAIN\r\n")));
        assert!(!ran_nothing(&ok(b"-ERR other\r\n")));
        assert!(may_not_answer(&ok(b"-ERR x\r\n")));
        assert!(may_not_answer(&Err(BackendError::Resend)));
        assert!(!may_not_answer(&ok(b"$1\r\nx\r\n")));
        assert!(exec_aborted(b"-EXECABORT Transaction discarded\r\n", false));
        assert!(!exec_aborted(b"-CROSSSLOT Keys\r\n", false));
        assert!(exec_aborted(b"-CROSSSLOT Keys\r\n", true));
        assert!(!exec_aborted(b"*1\r\n+OK\r\n", true));
    }

    #[test]
    fn a_replica_that_cannot_answer_sends_the_read_to_its_master() {
        let ok = |d: &'static [u8]| -> Result<Bytes, BackendError> { Ok(Bytes::from_static(d)) };
        for d in [&b"-LOADING Redis is loading\r\n"[..], b"-MASTERDOWN Link down\r\n", b"-MOVED 3 127.0.0.1:1\r\n"] {
            let r = ok(d);
            assert!(matches!(react_on_replica(&classify(&r, true), &r, false), Some(Step::ToMaster)), "{d:?}");
            assert!(matches!(react_on_replica(&classify(&r, true), &r, true), Some(Step::NoReplica)), "{d:?}");
        }
        let lost: Result<Bytes, BackendError> = Err(BackendError::Lost(Arc::from("x")));
        assert!(matches!(react_on_replica(&classify(&lost, true), &lost, false), Some(Step::ToMaster)));
        for d in [&b"$1\r\nv\r\n"[..], b"-WRONGTYPE x\r\n", b"-NOSCRIPT x\r\n"] {
            let r = ok(d);
            assert!(react_on_replica(&classify(&r, true), &r, false).is_none(), "{d:?}");
        }
    }

    #[test]
    fn a_master_that_cannot_answer_gives_a_stale_answer_only_where_a_rule_allows() {
        let busy: Result<Bytes, BackendError> = Ok(Bytes::from_static(b"-CLUSTERDOWN x\r\n"));
        let lost: Result<Bytes, BackendError> = Err(BackendError::Lost(Arc::from("x")));
        let unsent: Result<Bytes, BackendError> = Err(BackendError::NotSent(Arc::from("x")));
        let may = Attempt { may_stale: true, by_slot: true, ..Attempt::default() };
        let may_not = Attempt { by_slot: true, ..Attempt::default() };
        for r in [&busy, &lost, &unsent] {
            assert!(matches!(react(classify(r, true), r, &may), Step::Stale(_)));
            assert!(!matches!(react(classify(r, true), r, &may_not), Step::Stale(_)));
        }
        let answer: Result<Bytes, BackendError> = Ok(Bytes::from_static(b"$1\r\nv\r\n"));
        assert!(matches!(react(classify(&answer, true), &answer, &may), Step::Answer));
    }
}
