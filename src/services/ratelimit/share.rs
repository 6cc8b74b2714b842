//! This instance's part of each rule when several heatshields serve one cluster
//! (docs/ratelimit.md, "A fleet of heatshields"). The fleet task
//! (`services::fleet`) decides the parts; this module holds them where the request path
//! reads them, and counts what the fleet task needs to decide:
//!
//! - [`Part`]: a rule's interval and tolerance for its shared budget and for keys with
//!   no lease (alone: the rule's own; in a fleet of N: the rule over N for a per-key
//!   rule, the instance's share of the demand for a shared one);
//! - [`Lease`]: a key the fleet watches (throttled somewhere lately), with this
//!   instance's share of it, following where its requests come from, and a counter of
//!   the requests it saw;
//! - [`Candidates`]: keys throttled here that have no lease yet, for the next report;
//! - [`Tokens`]: a leased key's requests draw on tokens this instance took from the
//!   fleet's bucket for the key in Redis, so the key's budget goes where its requests
//!   are within milliseconds of a move (the part above is what it falls back to while
//!   that bucket cannot be reached).
//!
//! The request path pays one relaxed load for a rule's part, and, only while the fleet
//! watches some key, one lookup in a small map keyed by the budget's tag.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The interval and tolerance (GCRA, nanoseconds) one instance charges with.
pub struct Part {
    interval: AtomicU64,
    tolerance: AtomicU64,
}

impl Part {
    pub fn new(interval: u64, tolerance: u64) -> Part {
        Part { interval: AtomicU64::new(interval), tolerance: AtomicU64::new(tolerance) }
    }

    #[inline]
    pub fn get(&self) -> (u64, u64) {
        (self.interval.load(Ordering::Relaxed), self.tolerance.load(Ordering::Relaxed))
    }

    /// The part of a rule of `interval` and `burst` that `share` (0 < share ≤ 1) gives:
    /// the rate times the share, and the burst times the share but at least one request.
    pub fn set(&self, interval: u64, burst: u64, share: f64) {
        let (i, t) = scaled(interval, burst, share);
        self.interval.store(i, Ordering::Relaxed);
        self.tolerance.store(t, Ordering::Relaxed);
    }

    /// The share this part stands for (for `PROXY RATELIMIT LIST`).
    pub fn share(&self, interval: u64) -> f64 {
        interval as f64 / self.interval.load(Ordering::Relaxed).max(1) as f64
    }
}

/// Interval and tolerance for `share` of a rule.
pub fn scaled(interval: u64, burst: u64, share: f64) -> (u64, u64) {
    let share = if share.is_finite() { share.clamp(1e-6, 1.0) } else { 1.0 };
    let i = ((interval as f64) / share).min((u64::MAX / 4) as f64) as u64;
    let burst = (burst as f64 * share).max(1.0);
    (i, ((i as f64) * burst).min((u64::MAX / 4) as f64) as u64)
}

/// How long after the fleet's change-over for a key (every member said it watches it)
/// this instance's next ask still empties the key's bucket first ([`Lease::burn_until`]).
pub const BURN_WITHIN_NS: u64 = 1_000_000_000;

/// A key the fleet watches, under one rule.
pub struct Lease {
    /// The rule's index in the rules the lease was made for.
    pub rule: usize,
    pub key: Box<[u8]>,
    pub part: Part,
    /// Requests for the key under the rule this instance saw (allowed or not).
    pub demand: AtomicU64,
    /// The fleet's bucket for the key (a Redis key in the fleet's slot), and the rule's
    /// whole interval and tolerance (GCRA, nanoseconds), which the bucket is kept with.
    pub bucket: Box<[u8]>,
    pub whole: (u64, u64),
    /// Tokens taken from the bucket and not used yet.
    pub tokens: AtomicU64,
    /// Most tokens one ask takes (a few hundredths of the rule's rate over the members,
    /// at least one): what an instance holds unused is at most this.
    pub most: AtomicU64,
    /// Requests that found no token since the last ask.
    pub short: AtomicU64,
    /// Queued to ask the bucket ([`Tokens::want`]).
    pub asking: AtomicBool,
    /// The bucket was empty: no ask before this time (the limiter's clock).
    pub not_before: AtomicU64,
    /// Until this time (the limiter's clock) a request also needs this instance's part:
    /// `u64::MAX` until every member's report said it watches the key (until then some
    /// may still draw on their parts), 0 after (docs/fleet.md, "While the fleet changes
    /// over").
    pub both_until: AtomicU64,
    /// Until this time (the limiter's clock) this instance's next ask empties the bucket
    /// before it takes tokens: set when the change-over ends here. Until every member
    /// watched the key, those that did not took no token for its requests, so the bucket
    /// filled meanwhile, and its burst would follow the parts' within one second.
    pub burn_until: AtomicU64,
}

impl Lease {
    pub fn new(rule: usize, key: Box<[u8]>, bucket: Box<[u8]>, interval: u64, tolerance: u64) -> Lease {
        Lease {
            rule,
            key,
            part: Part::new(interval, tolerance),
            demand: AtomicU64::new(0),
            bucket,
            whole: (interval, tolerance),
            tokens: AtomicU64::new(0),
            most: AtomicU64::new(1),
            short: AtomicU64::new(0),
            asking: AtomicBool::new(false),
            not_before: AtomicU64::new(0),
            both_until: AtomicU64::new(u64::MAX),
            burn_until: AtomicU64::new(0),
        }
    }

    /// Whether the fleet is changing over for this key (newly watched, or the buckets
    /// answering again after they did not: [`Tokens::both_until`]): a request then needs
    /// this instance's part as well as a token.
    #[inline]
    pub fn settling(&self, now: u64, tokens: &Tokens) -> bool {
        now < self.both_until.load(Ordering::Relaxed) || now < tokens.both_until.load(Ordering::Relaxed)
    }

    /// Takes `n` tokens if there are that many; asks the bucket for more (through
    /// `tokens`) to make up an ask's worth again, unless an ask is queued or the bucket
    /// said to wait (so a busy instance holds a few milliseconds of its requests ahead,
    /// and a late ask does not leave them without). `now`: the limiter's clock.
    #[inline]
    pub fn take(self: &std::sync::Arc<Self>, n: u64, now: u64, tokens: &Tokens) -> bool {
        let ok = self.tokens.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| t.checked_sub(n)).is_ok();
        if !ok {
            self.refused(n, now, tokens);
            return false;
        }
        let low = self.tokens.load(Ordering::Relaxed) < self.most.load(Ordering::Relaxed);
        if low && now >= self.not_before.load(Ordering::Relaxed) {
            self.ask(tokens);
        }
        ok
    }

    /// `n` requests found too few tokens: counted for the next ask, which is queued
    /// unless the bucket said to wait.
    pub fn refused(self: &std::sync::Arc<Self>, n: u64, now: u64, tokens: &Tokens) {
        self.short.fetch_add(n, Ordering::Relaxed);
        if now >= self.not_before.load(Ordering::Relaxed) {
            self.ask(tokens);
        }
    }

    /// Queues an ask for tokens unless one is queued.
    pub fn ask(self: &std::sync::Arc<Self>, tokens: &Tokens) {
        if !self.asking.swap(true, Ordering::Relaxed) {
            tokens.want(self.clone());
        }
    }
}

/// The part of a rule's rate that one ask for tokens takes at most, times the
/// instance's share of the key (or one over the members, if more), so that all the
/// tokens instances hold unused are at most twice this part of the rate
/// (`docs/fleet.md`: the bound on what the fleet admits).
pub const TOKENS_ASKED: f64 = 0.05;

/// The leases whose keys want tokens from the fleet's buckets, for the fleet task that
/// asks Redis for them (one script for all of them, at most every few milliseconds).
#[derive(Default)]
pub struct Tokens {
    /// The buckets answered the last ask (leases draw on tokens; otherwise on their part).
    pub on: AtomicBool,
    /// Others are in the fleet (alone, an instance's part is the whole rule: its own
    /// budgets are exact, and no ask is needed).
    pub shared: AtomicBool,
    wanting: Mutex<Vec<std::sync::Arc<Lease>>>,
    pub wake: tokio::sync::Notify,
    /// The buckets answered again after they did not: until this time (the limiter's
    /// clock) every watched key also needs this instance's part, as other members try the
    /// buckets again only a second after their failure ([`Lease::settling`]).
    pub both_until: AtomicU64,
}

impl Tokens {
    /// Whether watched keys draw on tokens now.
    #[inline]
    pub fn drawing(&self) -> bool {
        self.on.load(Ordering::Relaxed) && self.shared.load(Ordering::Relaxed)
    }

    fn want(&self, l: std::sync::Arc<Lease>) {
        self.wanting.lock().unwrap_or_else(|e| e.into_inner()).push(l);
        self.wake.notify_one();
    }

    /// The leases queued since the last call.
    pub fn take(&self) -> Vec<std::sync::Arc<Lease>> {
        std::mem::take(&mut *self.wanting.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The budget tag is a hash already.
#[derive(Default)]
pub struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The leases by budget tag (`table::tag` of the key's hash and the rule's salt).
pub type Leases = HashMap<u64, std::sync::Arc<Lease>, BuildHasherDefault<Identity>>;

/// Keys throttled here without a lease: at most this many between two reports.
pub const MAX_CANDIDATES: usize = 4096;

/// Keys throttled here that have no lease yet (rule index, key), one entry a throttle.
#[derive(Default)]
pub struct Candidates {
    /// A fleet is configured (alone, nothing is noted).
    pub on: AtomicBool,
    list: Mutex<Vec<(usize, Box<[u8]>)>>,
}

impl Candidates {
    /// Notes a throttle (the slow path: the request is refused anyway).
    pub fn note(&self, rule: usize, key: &[u8]) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        let mut l = self.list.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() < MAX_CANDIDATES {
            l.push((rule, key.into()));
        }
    }

    /// The keys noted since the last call, each with how many throttles.
    pub fn take(&self) -> Vec<(usize, Box<[u8]>, u64)> {
        let l = std::mem::take(&mut *self.list.lock().unwrap_or_else(|e| e.into_inner()));
        let mut out: Vec<(usize, Box<[u8]>, u64)> = Vec::new();
        let mut at: HashMap<(usize, &[u8]), usize> = HashMap::new();
        for (r, k) in &l {
            match at.get(&(*r, &k[..])) {
                Some(&i) => out[i].2 += 1,
                None => {
                    at.insert((*r, &k[..]), out.len());
                    out.push((*r, k.clone(), 1));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_scales_rate_and_burst() {
        // 1000/s burst 100: a third is 333/s, burst 33
        let (i, t) = scaled(1_000_000, 100, 1.0 / 3.0);
        assert_eq!(i, 3_000_000);
        assert!((t as f64 - 3_000_000.0 * 33.333).abs() < 10_000.0, "{t}");
        // a tiny share keeps one request of burst
        let (i, t) = scaled(1_000_000, 10, 0.001);
        assert_eq!((i, t), (1_000_000_000, 1_000_000_000));
        assert_eq!(scaled(1_000_000, 10, 1.0), (1_000_000, 10_000_000));
        assert_eq!(scaled(1_000_000, 10, f64::NAN), (1_000_000, 10_000_000));
    }

    #[test]
    fn a_lease_takes_its_tokens_and_asks_once_for_more() {
        let tokens = Tokens::default();
        let l = std::sync::Arc::new(Lease::new(0, b"k".to_vec().into(), b"b".to_vec().into(), 1000, 10_000));
        l.most.store(4, Ordering::Relaxed);
        // none held: refused, counted short, one ask queued however many find none
        assert!(!l.take(1, 10, &tokens));
        assert!(!l.take(2, 10, &tokens));
        assert_eq!(l.short.load(Ordering::Relaxed), 3);
        assert_eq!(tokens.take().len(), 1);
        // the ask's answer: three tokens
        l.tokens.store(3, Ordering::Relaxed);
        l.asking.store(false, Ordering::Relaxed);
        assert!(l.take(2, 10, &tokens));
        assert!(!l.take(2, 10, &tokens), "one left, two wanted");
        assert!(l.take(1, 10, &tokens));
        assert_eq!(l.tokens.load(Ordering::Relaxed), 0);
        assert_eq!(tokens.take().len(), 1, "below an ask's worth: asked again, once");
        // an empty bucket said to wait: no ask before then
        l.asking.store(false, Ordering::Relaxed);
        l.not_before.store(100, Ordering::Relaxed);
        assert!(!l.take(1, 50, &tokens));
        assert!(tokens.take().is_empty());
        assert!(!l.take(1, 100, &tokens));
        assert_eq!(tokens.take().len(), 1);
    }

    #[test]
    fn candidates_are_counted_and_bounded() {
        let c = Candidates::default();
        c.note(0, b"a");
        assert!(c.take().is_empty(), "alone, nothing is noted");
        c.on.store(true, Ordering::Relaxed);
        for _ in 0..3 {
            c.note(0, b"a");
        }
        c.note(1, b"a");
        c.note(0, b"b");
        let mut got = c.take();
        got.sort();
        assert_eq!(got, vec![(0, b"a"[..].into(), 3), (0, b"b"[..].into(), 1), (1, b"a"[..].into(), 1)]);
        for _ in 0..MAX_CANDIDATES + 10 {
            c.note(0, b"x");
        }
        assert_eq!(c.take()[0].2, MAX_CANDIDATES as u64);
    }
}
