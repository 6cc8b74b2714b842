//! The ordering rule on the way back: while a request of the client's is being retried
//! (a redirection, a failover waited out) or a reply saying nothing ran came (TRYAGAIN,
//! NOSCRIPT), the replies of the requests
//! behind it wait, so that nothing the client sent later takes effect before it
//! (docs/design/ordering.md). The way there is `crate::conn::order`'s.

use super::*;

impl Session {
    /// [`Session::take_reply`] while a request is being retried or a reply saying nothing
    /// ran came ([`Unrun`]).
    #[inline(never)]
    pub(super) fn take_reply_ordered(&mut self, r: BackendReply, now: &mut Option<ReplyClock>) {
        let seq = r.tag.seq;
        if let Some(t) = &mut self.unrun
            && t.seq == seq
        {
            // the rest of its replies (a transaction's EXEC, other parts) wait with it
            t.replies.push(r);
            return;
        }
        // the requests sent behind it may have run already: see Unrun (those answered
        // already count too)
        let ran = self.unrun.is_none() && retry::ran_nothing(&r.result) && self.ran_behind(seq);
        if self.unrun.is_none() && retry::ran_nothing(&r.result) && (ran || self.sent_behind(seq)) {
            self.unrun = Some(Unrun { seq, replies: vec![r], ran });
            self.mark_retrying(seq);
            // (those behind it may be held already, their replies parked)
            self.decide_unrun(now);
            return;
        }
        if !self.retrying.is_empty() && self.hold(&r) {
            self.parked.push(r);
            self.decide_unrun(now);
            return;
        }
        self.deliver(r, now, false);
        if self.unrun.is_some() {
            self.decide_unrun(now);
        }
    }

    /// Whether a request dispatched after request `seq` has its reply already and names
    /// one of its keys.
    pub(super) fn ran_behind(&self, seq: u64) -> bool {
        let Some(i) = seq.checked_sub(self.queue.head) else { return false };
        let later = self.queue.entries.iter().enumerate().skip(i as usize + 1);
        later
            .filter(|(_, e)| matches!(e.reply, Reply::Ready(_) | Reply::Sent { .. }) && e.meta.req.is_some())
            .any(|(j, _)| self.touches(self.queue.head + j as u64, seq))
    }

    /// Whether a request dispatched after request `seq` still waits for its reply.
    pub(super) fn sent_behind(&self, seq: u64) -> bool {
        let Some(i) = seq.checked_sub(self.queue.head) else { return false };
        self.queue.entries.iter().skip(i as usize + 1).any(|e| matches!(e.reply, Reply::Waiting(_)))
    }

    /// Once every request sent behind a held TRYAGAIN or NOSCRIPT has its reply or waits
    /// behind it ([`Session::hold`]): it goes to its request, to be retried if none of
    /// them touched its keys and ran, or as its answer if one did (its retry would now
    /// come after that request).
    pub(super) fn decide_unrun(&mut self, now: &mut Option<ReplyClock>) {
        let Some(t) = &self.unrun else { return };
        let Some(i) = t.seq.checked_sub(self.queue.head) else { return };
        let undecided = self.queue.entries.iter().enumerate().skip(i as usize + 1).any(|(j, e)| {
            let seq = self.queue.head + j as u64;
            matches!(e.reply, Reply::Waiting(_)) && !self.parked.iter().any(|r| r.tag.seq == seq)
        });
        if undecided {
            return;
        }
        let Some(t) = self.unrun.take() else { return };
        let mut replies = t.replies.into_iter();
        // (they waited: a redirection among them may be out of date)
        self.behind_retry = true;
        if let Some(first) = replies.next() {
            self.deliver(first, now, t.ran);
        }
        for r in replies {
            self.deliver(r, now, false);
        }
        self.behind_retry = false;
    }

    /// Request `seq` is being retried (see [`Session::retrying`]).
    pub(super) fn mark_retrying(&mut self, seq: u64) {
        let at = self.retrying.partition_point(|&s| s < seq);
        if self.retrying.get(at) != Some(&seq) {
            self.retrying.insert(at, seq);
        }
        self.calm = false;
    }

    /// Whether request `later` names a key request `earlier` names (or its keys are not
    /// known: EXEC's are its transaction's).
    pub(super) fn touches(&self, later: u64, earlier: u64) -> bool {
        let keys = |seq: u64| -> Option<Vec<&[u8]>> {
            let req = self.queue.get(seq)?.meta.req.as_ref()?;
            let cmd = self.proxy.commands.lookup(req).ok()?;
            if matches!(cmd.route, crate::command::Route::Transaction(_)) {
                return None;
            }
            let keys = crate::command::keys_of(cmd, req).ok()?;
            Some(keys.iter().map(|&k| req.arg(k as usize)).collect())
        };
        match (keys(later), keys(earlier)) {
            // a script that declares no keys may still use any key of its node
            (_, Some(b)) if b.is_empty() && self.is_script(earlier) => true,
            (Some(a), Some(b)) => a.iter().any(|k| b.contains(k)),
            _ => true,
        }
    }

    /// Whether request `seq` runs a script or a function (its keys are the ones declared).
    fn is_script(&self, seq: u64) -> bool {
        let Some(req) = self.queue.get(seq).and_then(|e| e.meta.req.as_ref()) else { return false };
        self.proxy.commands.lookup(req).is_ok_and(|c| c.keys.is_script())
    }

    /// Whether reply `r` waits while an earlier request is being retried: every reply of a
    /// request that waits already, and any non-answer (which would be retried, and must
    /// not be sent again before the earlier request has gone).
    pub(super) fn hold(&mut self, r: &BackendReply) -> bool {
        let seq = r.tag.seq;
        if self.retrying[0] >= seq {
            return false;
        }
        let waits = self.retrying.contains(&seq);
        if !waits && (!retry::may_not_answer(&r.result) || retry::unannounced(&self.proxy.cluster, &r.result)) {
            // (a redirection to an address the cluster did not announce is held by its
            // request while a refresh looks again, and that refresh's outcome is held here
            // in its turn: so each waits for one refresh, not one after another's)
            return false;
        }
        self.mark_retrying(seq);
        true
    }

    /// Request `seq` has its reply (or is gone): if it was being retried, the client's
    /// later requests may go on, and the replies held behind it are handed over.
    pub(super) fn settled(&mut self, seq: u64, now: &mut Option<ReplyClock>) {
        if self.unrun.as_ref().is_some_and(|t| t.seq == seq) {
            self.unrun = None;
        }
        if let Some(i) = self.retrying.iter().position(|&s| s == seq) {
            self.retrying.remove(i);
            while let Some(i) =
                self.parked.iter().position(|r| self.retrying.first().is_none_or(|&first| first >= r.tag.seq))
            {
                let r = self.parked.remove(i);
                self.behind_retry = true;
                self.take_reply(r, now);
                self.behind_retry = false;
            }
        }
        self.recalm();
    }
}

/// A reply saying nothing of a request ran on that node ([`retry::ran_nothing`]: TRYAGAIN
/// while a migration splits its keys, NOSCRIPT from a master whose script cache lacks the
/// script, say one just promoted) for a request with requests sent behind it on the same
/// connection. Redis ran those already: one that touched a key this one names and found
/// it in place has run before this one's retry (or its EVAL form) could. So the reply
/// waits until every request behind it has its reply or waits itself (a redirection,
/// held behind this one): then the request is retried if none of them touched its keys
/// and ran, and the reply passed on as its answer if one did (Redis's TRYAGAIN or
/// NOSCRIPT: nothing of it ran, as a client of one Redis may be told; a transaction's
/// EXEC answers EXECABORT, or nil under WATCH), so that nothing runs out of the client's
/// order.
pub(super) struct Unrun {
    pub(super) seq: u64,
    /// The reply, and the request's replies that came after it.
    pub(super) replies: Vec<BackendReply>,
    /// A request sent behind it that touches its keys has run.
    pub(super) ran: bool,
}
