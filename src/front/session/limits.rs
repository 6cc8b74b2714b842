//! The client's byte limits (`[limits]`, docs/security.md): the bytes it holds, why it
//! must go when it must, and its share of the process-wide total.

use super::*;

/// Why a client was disconnected by its limits (the metric's `reason` label).
#[derive(Debug, Clone, Copy)]
pub(super) enum Cut {
    /// Over `output_hard_bytes`.
    Hard,
    /// Over `output_soft_bytes` for `output_soft_seconds`.
    Soft,
    /// The process-wide `output_total_over_soft_bytes` is spent.
    Total,
    /// A subscribed client over `pubsub_output_hard_bytes`.
    PubsubHard,
    /// A subscribed client over `pubsub_output_soft_bytes` for `pubsub_output_soft_seconds`.
    PubsubSoft,
}

impl Cut {
    pub(super) fn reason(self) -> &'static str {
        match self {
            Cut::Hard => "output_hard",
            Cut::Soft => "output_soft",
            Cut::Total => "output_total",
            Cut::PubsubHard => "pubsub_hard",
            Cut::PubsubSoft => "pubsub_soft",
        }
    }
}

/// The bytes one client holds, against its limits.
pub(super) struct Held {
    /// Reply bytes: complete replies in the queue plus unwritten output.
    pub(super) replies: usize,
    /// Request bytes read and not yet answered (their replies not yet written).
    pub(super) requests: usize,
    /// Running average size of this client's replies (1/8 weight for each new one).
    pub(super) avg_reply: usize,
    /// Commands this client may have unanswered: `max_pipeline`, fewer when its replies
    /// are large (the soft limit divided by `avg_reply`).
    pub(super) window: usize,
    /// Since when the client has been above the soft limit.
    pub(super) over_soft_since: Option<Instant>,
    /// What this client added to the process-wide bytes above soft limits.
    pub(super) counted_over_soft: u64,
    /// Since when a subscribed client has been above `pubsub_output_soft_bytes`.
    pub(super) over_pubsub_soft_since: Option<Instant>,
}

impl Held {
    pub(super) fn reply_ready(&mut self, len: usize, soft: usize, max_pipeline: usize) {
        self.replies += len;
        self.avg_reply = self.avg_reply - self.avg_reply / 8 + len / 8;
        self.window = (soft / self.avg_reply.max(1)).clamp(1, max_pipeline);
    }
}

impl Session {
    /// The client's byte limits: why it must go, if it must. A single reply is always
    /// delivered, however large (the client asked for it and it is in memory already); the
    /// hard limit and the soft limit's duration apply once a client holds more than one.
    /// The process-wide total applies to every byte.
    pub(super) fn check_limits(&mut self) -> Option<Cut> {
        let limits = &self.limits;
        // nothing held near a limit, nothing counted over one: the common case
        if self.held.replies <= self.unlimited_below
            && self.held.counted_over_soft == 0
            && self.held.over_soft_since.is_none()
            && self.held.over_pubsub_soft_since.is_none()
        {
            return None;
        }
        // (requests waiting for the ordering rule hold no reply yet)
        let later = self.deferred.map_or(0, |d| self.queue.next_seq() - d) as usize;
        let several = self.queue.entries.len() - self.client.inflight as usize - later > 1;
        if self.client.modes.subs.is_some() {
            // a subscriber's messages: Redis's pubsub limits, the process-wide total as
            // for everyone
            let replies = self.held.replies as u64;
            if replies > limits.pubsub_output_hard_bytes {
                return Some(Cut::PubsubHard);
            }
            if replies <= limits.pubsub_output_soft_bytes {
                self.held.over_pubsub_soft_since = None;
            } else if limits.pubsub_output_soft_seconds > 0 {
                let since = *self.held.over_pubsub_soft_since.get_or_insert_with(Instant::now);
                let at = since + Duration::from_secs(limits.pubsub_output_soft_seconds);
                if self.armed.is_none_or(|t| at < t) {
                    self.armed = Some(at);
                }
            }
            let total_limit = limits.output_total_over_soft_bytes;
            return over_soft(&self.proxy, &mut self.held, self.soft, false, total_limit);
        }
        self.held.over_pubsub_soft_since = None;
        if self.held.replies > self.hard && several {
            return Some(Cut::Hard);
        }
        let total_limit = limits.output_total_over_soft_bytes;
        if let Some(c) = over_soft(&self.proxy, &mut self.held, self.soft, several, total_limit) {
            return Some(c);
        }
        if let Some(since) = self.held.over_soft_since
            && limits.output_soft_seconds > 0
        {
            let at = since + Duration::from_secs(limits.output_soft_seconds);
            if self.armed.is_none_or(|t| at < t) {
                self.armed = Some(at);
            }
        }
        None
    }
}

/// Keeps the client's share of the process-wide bytes above soft limits current; says
/// whether the client must go because that total is over its limit.
pub(super) fn over_soft(proxy: &Proxy, held: &mut Held, soft: usize, several: bool, total_limit: u64) -> Option<Cut> {
    if held.replies <= soft {
        held.over_soft_since = None;
        if held.counted_over_soft > 0 {
            proxy.stats.output_over_soft.fetch_sub(held.counted_over_soft, Ordering::Relaxed);
            held.counted_over_soft = 0;
        }
        return None;
    }
    if several {
        held.over_soft_since.get_or_insert_with(Instant::now);
    } else {
        held.over_soft_since = None;
    }
    let over = (held.replies - soft) as u64;
    let total = if over >= held.counted_over_soft {
        let add = over - held.counted_over_soft;
        proxy.stats.output_over_soft.fetch_add(add, Ordering::Relaxed) + add
    } else {
        let sub = held.counted_over_soft - over;
        proxy.stats.output_over_soft.fetch_sub(sub, Ordering::Relaxed) - sub
    };
    held.counted_over_soft = over;
    (total > total_limit).then_some(Cut::Total)
}
