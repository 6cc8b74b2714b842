//! Per-key rate limits (docs/ratelimit.md): ordered rules matching keys by glob and
//! commands by kind, each with a rate and a burst, per key or shared; GCRA budgets kept as
//! one timestamp each in a lock-free table ([`table`]); a hard cap on tracked keys;
//! background reclaim of idle budgets.
//!
//! GCRA is written here rather than taken from `governor`: a multi-key command must check
//! every key first and charge none of them when one is over budget, and governor's keyed
//! limiter charges on each check with no way to look without consuming.

pub mod share;
pub mod table;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::command::{Command, CommandTable};

/// Which commands a rule counts.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum CommandsSpec {
    /// "reads", "writes" or "all".
    Kind(String),
    /// Explicit command names.
    List(Vec<String>),
}

impl Default for CommandsSpec {
    fn default() -> Self {
        CommandsSpec::Kind("all".into())
    }
}

/// One rule as written in the configuration.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub name: String,
    pub pattern: String,
    #[serde(default)]
    pub commands: CommandsSpec,
    /// Requests per second.
    pub rate: f64,
    /// Requests allowed at once beyond the steady rate.
    pub burst: u64,
    /// "per-key" (default) or "shared".
    #[serde(default = "default_scope")]
    pub scope: String,
    /// Reads answered from the hot-key cache count too (by default they do not: the
    /// limits protect Redis).
    #[serde(default)]
    pub count_cached: bool,
}

fn default_scope() -> String {
    "per-key".into()
}

/// `[ratelimit]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// Keys with a budget of their own at most; new keys beyond share their rule's budget.
    pub max_tracked_keys: usize,
    /// A key's budget is dropped once it has been full (unused) this long. Dropping it
    /// sooner loses nothing but costs a re-insert when the key comes back.
    pub idle_reclaim_ms: u64,
    pub rules: Vec<RuleConfig>,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig { max_tracked_keys: 1_000_000, idle_reclaim_ms: 10_000, rules: vec![] }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Filter {
    Reads,
    Writes,
    All,
    Names(Vec<String>),
}

/// A compiled rule and its budgets.
pub struct Rule {
    pub spec: RuleConfig,
    pattern: crate::glob::Pattern,
    filter: Filter,
    per_key: bool,
    /// Nanoseconds between requests at the steady rate.
    interval: u64,
    /// How far ahead of now a budget's timestamp may run: burst × interval.
    tolerance: u64,
    /// The shared budget (scope = "shared", and per-key keys beyond the cap).
    shared: AtomicU64,
    /// This instance's part of the rule in a fleet ([`share`]): the interval and tolerance
    /// the shared budget and the keys without a lease are charged with. Alone: the rule's.
    pub(crate) local: share::Part,
    /// Mixed into the key hashes of this rule's budgets in the key table, so every rule
    /// (and every new version of a rule) has budgets of its own.
    salt: u64,
    /// Requests allowed, one counter per worker (no read-modify-write on the request path).
    allowed: crate::metrics::PerWorkerCounter,
    pub throttled: AtomicU64,
    m_allowed: metrics::Counter,
    m_throttled: metrics::Counter,
    m_share: metrics::Gauge,
}

/// Counter slots per rule; workers beyond share slots (then counts may be lost, not
/// budgets: budgets are charged atomically).
const WORKER_SLOTS: usize = 16;

impl Rule {
    /// Requests this rule allowed.
    pub fn allowed(&self) -> u64 {
        self.allowed.sum()
    }

    /// This instance's share of the rule (1 alone; see [`share`]).
    pub fn share(&self) -> f64 {
        self.local.share(self.interval)
    }

    #[inline]
    fn count_allowed(&self, n: u64) {
        self.allowed.add(n);
    }

    #[inline]
    fn matches(&self, cmd: &Command, key: &[u8]) -> bool {
        let cmd_ok = match &self.filter {
            Filter::All => true,
            Filter::Reads => cmd.is_readonly(),
            Filter::Writes => cmd.is_write(),
            Filter::Names(n) => named(n, cmd),
        };
        cmd_ok && self.pattern.matches(key)
    }
}

/// Whether a rule for the commands `names` applies to `cmd` (out of line: most rules are
/// for all commands, reads or writes).
#[inline(never)]
fn named(names: &[String], cmd: &Command) -> bool {
    names.contains(&cmd.name)
}

/// Compiles rules, checking each; every problem names the rule.
pub fn compile(rules: &[RuleConfig], table: &CommandTable) -> Result<Vec<Arc<Rule>>, Vec<String>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let at = format!("ratelimit.rules[{i}] ('{}')", r.name);
        if r.name.is_empty() {
            problems.push(format!("ratelimit.rules[{i}].name: must not be empty"));
        }
        if rules[..i].iter().any(|o| o.name == r.name) {
            problems.push(format!("{at}: the name is used by an earlier rule"));
        }
        if r.pattern.is_empty() {
            problems.push(format!("{at}.pattern: must not be empty"));
        }
        if !(r.rate.is_finite() && r.rate > 0.0 && r.rate <= 1e9) {
            problems.push(format!("{at}.rate: must be greater than 0 (requests per second)"));
        }
        if r.burst == 0 || r.burst > 1_000_000_000 {
            problems.push(format!("{at}.burst: must be at least 1"));
        }
        let per_key = match r.scope.as_str() {
            "per-key" => true,
            "shared" => false,
            other => {
                problems.push(format!("{at}.scope: '{other}' is neither \"per-key\" nor \"shared\""));
                true
            }
        };
        let filter = match &r.commands {
            CommandsSpec::Kind(k) => match k.to_ascii_lowercase().as_str() {
                "reads" => Filter::Reads,
                "writes" => Filter::Writes,
                "all" => Filter::All,
                other => {
                    problems.push(format!("{at}.commands: '{other}' is not \"reads\", \"writes\", \"all\" or a list"));
                    Filter::All
                }
            },
            CommandsSpec::List(names) => {
                let names: Vec<String> = names.iter().map(|n| n.to_ascii_uppercase()).collect();
                for n in &names {
                    if table.get(n.as_bytes()).is_none() {
                        problems.push(format!("{at}.commands: unknown command '{n}'"));
                    }
                }
                Filter::Names(names)
            }
        };
        let interval = if r.rate > 0.0 { (1e9 / r.rate) as u64 } else { u64::MAX / 4 };
        let labels = [("rule", r.name.clone())];
        out.push(Arc::new(Rule {
            spec: r.clone(),
            pattern: crate::glob::Pattern::new(r.pattern.as_bytes()),
            filter,
            per_key,
            interval,
            tolerance: interval.saturating_mul(r.burst),
            shared: AtomicU64::new(0),
            local: share::Part::new(interval, interval.saturating_mul(r.burst)),
            salt: ahash::RandomState::new().hash_one(i),
            allowed: crate::metrics::PerWorkerCounter::new(WORKER_SLOTS),
            throttled: AtomicU64::new(0),
            m_allowed: metrics::counter!("heatshield_ratelimit_allowed_total", &labels),
            m_throttled: metrics::counter!("heatshield_ratelimit_throttled_total", &labels),
            m_share: metrics::gauge!("heatshield_ratelimit_share", &labels),
        }));
    }
    if problems.is_empty() { Ok(out) } else { Err(problems) }
}

/// A command over budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Throttled {
    pub key: Vec<u8>,
    pub rate: f64,
    pub rule: String,
}

impl Throttled {
    /// The error reply's text.
    pub fn message(&self) -> String {
        let rate = if self.rate.fract() == 0.0 { format!("{}", self.rate as u64) } else { format!("{}", self.rate) };
        format!(
            "THROTTLED key '{}' is over {} requests/s (rule '{}')",
            String::from_utf8_lossy(&self.key[..self.key.len().min(128)]),
            rate,
            self.rule
        )
    }
}

/// The live rules and their budgets.
///
/// Per-key budgets are keyed by a 64-bit hash of the key made with random keys (aHash),
/// not by the key itself: a lookup then touches one 16-byte table slot instead of a
/// heap-allocated key. Two keys share a budget only on a 64-bit collision, and the random
/// keys keep clients from choosing keys that collide.
pub struct Limiter {
    /// Shared with every session's [`View`].
    state: Arc<ArcSwap<State>>,
    /// Held to publish a new [`State`].
    publish: std::sync::Mutex<()>,
    /// Some rule is per-key.
    per_key: std::sync::atomic::AtomicBool,
    /// Some rule exists (one relaxed load on the request path when none does).
    some: std::sync::atomic::AtomicBool,
    /// Where admission asks, for all features at once, whether some rule may see a key
    /// (this limiter's bit: [`crate::glob::feature::RATE`], the first bytes of keys some
    /// rule's pattern may match, replaced with the rules), so a key no rule can match skips
    /// the limiter (its prefetch and its check) for the price of one load.
    features: Arc<crate::glob::KeyFeatures>,
    max_keys: usize,
    /// Nanoseconds a full budget stays before [`Limiter::reclaim`] drops it.
    idle_ns: u64,
    /// Budgets of per-key rules, made when the first per-key rule appears.
    table: OnceLock<table::Budgets>,
    clock_zero: Instant,
    hasher: ahash::RandomState,
    /// Keys throttled here without a lease, for the fleet's next report.
    pub candidates: share::Candidates,
    /// Leased keys' tokens from the fleet's buckets: which leases want more.
    pub tokens: share::Tokens,
}

/// Which budget a key draws on: rule index, and the key's hash (None: the rule's shared one).
type BudgetId = (usize, Option<u64>);

/// The rules in order and the fleet's leases on their keys, published as one value.
struct State {
    rules: Arc<Vec<Arc<Rule>>>,
    /// Empty when alone, and until the fleet watches a key.
    leases: Arc<share::Leases>,
}

/// What this instance saw of its rules since the fleet task last asked
/// ([`Limiter::fleet_seen`]).
pub struct Seen {
    /// The rules it was seen under (a plan for other rules is not applied).
    pub rules: Arc<Vec<Arc<Rule>>>,
    /// Requests each rule counted so far (allowed and refused), by rule index.
    pub demand: Vec<u64>,
    /// Leased keys: rule index, key, requests since the last call.
    pub leased: Vec<(usize, Box<[u8]>, u64)>,
    /// Keys throttled here without a lease: rule index, key, throttles.
    pub throttled: Vec<(usize, Box<[u8]>, u64)>,
}

/// A key the fleet watches: rule index, key, this instance's share of it, the key's
/// bucket in Redis, whether every member said it watches the key ([`Plan::leases`]), and
/// whether this instance's report was the last to say so (it ends the change-over: its
/// next ask empties the bucket, [`share::Lease::burn_until`]).
pub type Watch = (usize, Box<[u8]>, f64, Box<[u8]>, bool, bool);

/// What the fleet decided for this instance ([`Limiter::fleet_apply`]).
pub struct Plan {
    /// The rules it was decided for (from [`Seen::rules`]).
    pub rules: Arc<Vec<Arc<Rule>>>,
    /// This instance's share of each rule's shared budget and of its keys without a lease.
    pub shares: Vec<f64>,
    /// The keys to watch: rule index, key, this instance's share of it, the key's bucket
    /// in Redis, and whether every member's report said it watches the key (until then
    /// a request also needs this instance's part: [`share::Lease::both_until`]).
    pub leases: Vec<Watch>,
    /// The fleet's members now.
    pub members: usize,
}

/// A session's handle on the limiter, so that a check costs less than a standalone one:
/// the rules as the session last saw them (`arc_swap::Cache`: re-read only when they were
/// replaced, which costs one pointer comparison to find out), and the hash of the current
/// request's first key when the session already computed it to prefetch its budget.
///
/// The budget table is not cached here: a session idle since the table grew would keep the
/// old one alive.
pub struct View {
    state: arc_swap::Cache<Arc<ArcSwap<State>>, Arc<State>>,
    /// The budget table as the session last saw it (made at its first per-key check).
    table: Option<table::TableCache>,
    /// The last request time converted to the limiter's clock: the requests of one read
    /// share their time, so most checks skip the conversion.
    clock: (Instant, u64),
    /// (address, length, hash) of the key hashed for the current request; address 0: none.
    hint: (usize, usize, u64),
}

impl View {
    /// The next check of exactly this key slice (same address and length) may use `hash`,
    /// computed by [`Limiter::prefetch`] with the same hasher.
    #[inline]
    pub fn expect(&mut self, key: &[u8], hash: u64) {
        self.hint = (key.as_ptr() as usize, key.len(), hash);
    }

    /// Forgets the hint (the request it was for is done).
    #[inline]
    pub fn forget(&mut self) {
        self.hint.0 = 0;
    }

    /// `at` in the limiter's clock ([`Limiter::ns`]), converted once per distinct time.
    #[inline]
    fn ns(&mut self, limiter: &Limiter, at: Instant) -> u64 {
        if self.clock.0 != at {
            self.clock = (at, limiter.ns(at));
        }
        self.clock.1
    }
}

impl Limiter {
    pub fn new(rules: Vec<Arc<Rule>>, max_keys: usize, idle: std::time::Duration) -> Limiter {
        let l = Limiter {
            state: Arc::new(ArcSwap::from_pointee(State {
                rules: Arc::new(Vec::new()),
                leases: Arc::new(share::Leases::default()),
            })),
            publish: std::sync::Mutex::new(()),
            per_key: std::sync::atomic::AtomicBool::new(false),
            some: std::sync::atomic::AtomicBool::new(false),
            features: Arc::default(),
            max_keys,
            idle_ns: idle.as_nanos() as u64,
            table: OnceLock::new(),
            clock_zero: Instant::now(),
            hasher: ahash::RandomState::new(),
            candidates: share::Candidates::default(),
            tokens: share::Tokens::default(),
        };
        l.replace(rules);
        l
    }

    /// Writes its rules' first bytes to `features` (the proxy's table, shared by every
    /// feature with key patterns) from now on.
    pub fn with_features(mut self, features: Arc<crate::glob::KeyFeatures>) -> Limiter {
        self.features = features;
        let rules = self.rules();
        self.set_first(rules.iter());
        self
    }

    /// Whether any rule exists (the request path skips everything otherwise): one
    /// relaxed load.
    #[inline(always)]
    pub fn active(&self) -> bool {
        self.some.load(Ordering::Relaxed)
    }

    /// Whether some rule's pattern may match `key` (a no is sure: then no rule applies to
    /// it, and it needs no check).
    #[inline(always)]
    pub fn may_match(&self, key: &[u8]) -> bool {
        self.features.of(key) & crate::glob::feature::RATE != 0
    }

    pub fn rules(&self) -> Arc<Vec<Arc<Rule>>> {
        self.state.load().rules.clone()
    }

    /// Replaces the rules. A rule whose definition is unchanged keeps its budgets, its
    /// part of a fleet's and, where it keeps its place, the fleet's leases on its keys
    /// (dropped, a watched key would draw on this instance's part until the next sync
    /// while the others take the whole rate from its bucket); new and changed rules start
    /// fresh (the budgets of the old ones go idle and are reclaimed).
    pub fn replace(&self, rules: Vec<Arc<Rule>>) {
        let _p = self.publish.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.state.load().rules.clone();
        let rules: Vec<Arc<Rule>> =
            rules.into_iter().map(|r| old.iter().find(|o| o.spec == r.spec).cloned().unwrap_or(r)).collect();
        let per_key = rules.iter().any(|r| r.per_key);
        if per_key {
            self.table.get_or_init(|| table::Budgets::new(self.max_keys));
        }
        self.per_key.store(per_key, Ordering::Relaxed);
        // (a request checked while the rules are replaced is checked under the old or the
        // new ones: the filter is widened to both first, and narrowed to the new ones after)
        self.set_first(rules.iter().chain(old.iter()));
        self.some.store(!rules.is_empty(), Ordering::Relaxed);
        let kept: share::Leases = self
            .state
            .load()
            .leases
            .iter()
            .filter(|(_, l)| matches!((old.get(l.rule), rules.get(l.rule)), (Some(o), Some(n)) if Arc::ptr_eq(o, n)))
            .map(|(t, l)| (*t, l.clone()))
            .collect();
        let rules = Arc::new(rules);
        self.state.store(Arc::new(State { rules: rules.clone(), leases: Arc::new(kept) }));
        self.set_first(rules.iter());
    }

    fn set_first<'r>(&self, rules: impl Iterator<Item = &'r Arc<Rule>>) {
        let first = crate::glob::FirstBytes::of(rules.map(|r| r.spec.pattern.as_bytes()));
        self.features.set(crate::glob::feature::RATE, &first);
    }

    /// Keys the fleet watches now.
    pub fn leased_keys(&self) -> usize {
        self.state.load().leases.len()
    }

    /// Keys the fleet watches now, by rule name.
    pub fn leases_by_rule(&self) -> std::collections::HashMap<String, usize> {
        let state = self.state.load();
        let mut out = std::collections::HashMap::new();
        for l in state.leases.values() {
            if let Some(r) = state.rules.get(l.rule) {
                *out.entry(r.spec.name.clone()).or_default() += 1;
            }
        }
        out
    }

    /// What the fleet task reports: each rule's demand so far, the requests each leased
    /// key saw since the last call, and the keys throttled here without a lease.
    pub fn fleet_seen(&self) -> Seen {
        let state = self.state.load_full();
        let demand = state.rules.iter().map(|r| r.allowed() + r.throttled.load(Ordering::Relaxed)).collect();
        let leased =
            state.leases.values().map(|l| (l.rule, l.key.clone(), l.demand.swap(0, Ordering::Relaxed))).collect();
        Seen { rules: state.rules.clone(), demand, leased, throttled: self.candidates.take() }
    }

    /// Applies the fleet's plan, unless the rules changed since it was made (the next
    /// round makes one for the new rules). A key leased before keeps its counter.
    pub fn fleet_apply(&self, plan: &Plan) {
        let _p = self.publish.lock().unwrap_or_else(|e| e.into_inner());
        let state = self.state.load_full();
        if !Arc::ptr_eq(&state.rules, &plan.rules) {
            return;
        }
        self.tokens.shared.store(plan.members > 1, Ordering::Relaxed);
        for (r, &s) in state.rules.iter().zip(&plan.shares) {
            r.local.set(r.interval, r.spec.burst, s);
        }
        let mut leases = share::Leases::default();
        for (ri, key, s, bucket, settled, ends) in &plan.leases {
            let Some(r) = state.rules.get(*ri).filter(|r| r.per_key) else { continue };
            let tag = table::tag(self.hasher.hash_one(&key[..]), r.salt);
            let lease = match state.leases.get(&tag) {
                Some(l) => l.clone(),
                None => Arc::new(share::Lease::new(*ri, key.clone(), bucket.clone(), r.interval, r.tolerance)),
            };
            // until every member said it watches the key, some may still draw on their
            // parts (a member joining later makes it so again); when this instance's
            // report is the one that ends that, it empties the bucket at once: what the
            // bucket gathered while some member took no token must not follow the
            // parts' burst within one second (the others, settling after it, do not:
            // they would throw away what the bucket gathered since)
            let ending = *settled && lease.both_until.load(Ordering::Relaxed) == u64::MAX;
            lease.both_until.store(if *settled { 0 } else { u64::MAX }, Ordering::Relaxed);
            if ending && *ends {
                lease.burn_until.store(self.now() + share::BURN_WITHIN_NS, Ordering::Relaxed);
                lease.ask(&self.tokens);
            }
            lease.part.set(r.interval, r.spec.burst, *s);
            // what one ask takes at most: TOKENS_ASKED of the rule's rate times this
            // instance's share of the key's demand, or over the members if more (the
            // shares add up to one: all the instances' together are at most twice
            // TOKENS_ASKED of the rate)
            let members = plan.shares.get(*ri).copied().unwrap_or(1.0);
            let most = (r.spec.rate * share::TOKENS_ASKED * s.max(members)).floor().max(1.0) as u64;
            lease.most.store(most, Ordering::Relaxed);
            leases.insert(tag, lease);
        }
        self.state.store(Arc::new(State { rules: state.rules.clone(), leases: Arc::new(leases) }));
    }

    /// Whether a per-key rule exists, so that pipelined requests are worth prefetching
    /// ([`Limiter::prefetch`]) as a batch.
    #[inline]
    pub fn prefetching(&self) -> bool {
        self.per_key.load(Ordering::Relaxed)
    }

    /// Keys with a budget of their own.
    pub fn tracked_keys(&self) -> usize {
        self.table.get().map_or(0, |t| t.len())
    }

    /// A handle for one session (see [`View`]).
    pub fn view(&self) -> View {
        View {
            state: arc_swap::Cache::new(self.state.clone()),
            table: None,
            clock: (self.clock_zero, 1 << 40),
            hint: (0, 0, 0),
        }
    }

    /// Brings the budget slots of the given keys (the first key of each request of a
    /// pipelined batch) into the CPU cache, so that their misses overlap instead of
    /// coming one per request when the requests are checked. Writes each key's hash to
    /// `hashes` (for [`View::expect`]), or 0 for a key no rule may match (not hashed:
    /// [`Limiter::may_match`]); returns how many were written, 0 without a per-key rule.
    #[inline]
    pub fn prefetch<'k>(&self, keys: impl Iterator<Item = &'k [u8]>, hashes: &mut [u64]) -> usize {
        let Some(b) = self.table.get().filter(|_| self.prefetching()) else { return 0 };
        let t = b.load();
        let mut n = 0;
        for (h, k) in hashes.iter_mut().zip(keys) {
            *h = if self.may_match(k) { self.hasher.hash_one(k) } else { 0 };
            n += 1;
        }
        table::Budgets::prefetch(&t, &hashes[..n]);
        n
    }

    /// `at` in the limiter's clock (nanoseconds, offset so that a fresh budget, timestamp 0,
    /// is always full).
    #[inline]
    fn ns(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.clock_zero);
        d.as_secs() * 1_000_000_000 + d.subsec_nanos() as u64 + (1 << 40)
    }

    /// Publishes the rules' counters to the metrics exporter (called periodically, so the
    /// request path touches one counter, not two).
    pub fn publish_metrics(&self) {
        for r in self.state.load().rules.iter() {
            r.m_allowed.absolute(r.allowed());
            r.m_throttled.absolute(r.throttled.load(Ordering::Relaxed));
            r.m_share.set(r.share());
        }
    }

    /// Checks the keys of one command against the rules (see [`Limiter::check_in`]), for a
    /// caller without a [`View`].
    pub fn check<'k>(
        &self,
        cmd: &Command,
        keys: impl Iterator<Item = &'k [u8]>,
        at: Instant,
        cached: bool,
    ) -> Result<(), Throttled> {
        self.check_in(&mut self.view(), cmd, keys, at, cached)
    }

    /// Checks the keys of one command against the rules. When every key is within budget,
    /// charges each and returns Ok; otherwise charges nothing and names the first key over.
    /// `at` is when the request arrived (the session's read time; no clock read here).
    /// `cached`: the keys are answered from the hot-key cache, so only rules with
    /// `count_cached` apply.
    #[inline]
    pub fn check_in<'k>(
        &self,
        view: &mut View,
        cmd: &Command,
        keys: impl Iterator<Item = &'k [u8]>,
        at: Instant,
        cached: bool,
    ) -> Result<(), Throttled> {
        let now = view.ns(self, at);
        let View { state, table, hint, .. } = view;
        let state = state.load();
        if state.rules.is_empty() {
            return Ok(());
        }
        let mut keys = keys.peekable();
        let Some(first) = keys.next() else { return Ok(()) };
        if keys.peek().is_none() {
            return self.check_one(state, table, cmd, first, *hint, now, cached);
        }
        self.check_many(state, table, cmd, std::iter::once(first).chain(keys).map(|k| (k, cached)), now)
    }

    /// Checks the keys of one command of which some are answered from the hot-key cache
    /// (`(key, cached)` pairs, see [`Limiter::check_in`]): all charged, or none.
    pub fn check_mixed<'k>(
        &self,
        view: &mut View,
        cmd: &Command,
        keys: impl Iterator<Item = (&'k [u8], bool)>,
        at: Instant,
    ) -> Result<(), Throttled> {
        let now = view.ns(self, at);
        let View { state, table, .. } = view;
        let state = state.load();
        if state.rules.is_empty() {
            return Ok(());
        }
        self.check_many(state, table, cmd, keys, now)
    }

    /// Several keys: look at every budget first, then charge them all or none.
    fn check_many<'k>(
        &self,
        state: &State,
        tables: &mut Option<table::TableCache>,
        cmd: &Command,
        keys: impl Iterator<Item = (&'k [u8], bool)>,
        now: u64,
    ) -> Result<(), Throttled> {
        let rules = &state.rules;
        let table = self.table.get().map(|b| (b, &**tables.get_or_insert_with(|| b.cache()).load()));
        // budgets this command draws on, how many requests each, and the first key on it
        let mut need: SmallVec<[(BudgetId, u64, &'k [u8]); 4]> = SmallVec::new();
        for (key, cached) in keys {
            let Some(ri) = rules.iter().position(|r| r.matches(cmd, key)) else { continue };
            let r = &rules[ri];
            if cached && !r.spec.count_cached {
                continue;
            }
            let id = match table {
                Some((b, t)) if r.per_key => {
                    let h = self.hasher.hash_one(key);
                    let tagged = table::tag(h, r.salt);
                    // at the cap a new key draws on the shared budget
                    if table::Budgets::get(t, h, tagged).is_some() || b.len() < self.max_keys {
                        (ri, Some(h))
                    } else {
                        (ri, None)
                    }
                }
                _ => (ri, None),
            };
            match need.iter_mut().find(|(b, _, _)| *b == id) {
                Some((_, n, _)) => *n += 1,
                None => need.push((id, 1, key)),
            }
        }
        if need.is_empty() {
            return Ok(());
        }
        let tokens = self.tokens.drawing();
        // Look first...
        for &((ri, key), n, first) in &need {
            let r = &rules[ri];
            let (tat, (mut interval, mut tolerance, lease)) = match (key, table) {
                (Some(h), Some((_, t))) => {
                    let tag = table::tag(h, r.salt);
                    (table::Budgets::get(t, h, tag).unwrap_or(0), Self::part(state, r, Some(tag)))
                }
                _ => (r.shared.load(Ordering::Relaxed), Self::part(state, r, None)),
            };
            // (without tokens, the stricter part while some member may not watch the key:
            // as in check_one)
            if let Some(l) = lease.filter(|l| !tokens && l.settling(now, &self.tokens)) {
                (interval, tolerance) = Self::settling_part(l, r);
            }
            let over = match lease {
                Some(l) if tokens => {
                    l.tokens.load(Ordering::Relaxed) < n || {
                        let (i, t) = Self::settling_part(l, r);
                        l.settling(now, &self.tokens) && tat.max(now) + n * i - now > t
                    }
                }
                _ => tat.max(now) + n * interval - now > tolerance,
            };
            if over {
                r.throttled.fetch_add(1, Ordering::Relaxed);
                match lease {
                    Some(l) => {
                        l.demand.fetch_add(n, Ordering::Relaxed);
                        if tokens {
                            l.refused(n, now, &self.tokens);
                        }
                    }
                    None if r.per_key => self.candidates.note(ri, first),
                    None => {}
                }
                return Err(Throttled { key: first.to_vec(), rate: r.spec.rate, rule: r.spec.name.clone() });
            }
        }
        // ...then charge every budget (a key that lost its place to the cap meanwhile
        // is charged to the shared budget).
        for &((ri, key), n, _) in &need {
            let r = &rules[ri];
            let tag = key.map(|h| table::tag(h, r.salt));
            let (interval, _, lease) = Self::part(state, r, tag);
            if let Some(l) = lease {
                l.demand.fetch_add(n, Ordering::Relaxed);
                // (while the fleet changes over, the part is charged too: below)
                if tokens && !l.settling(now, &self.tokens) {
                    // (another request may have taken them since the look: admitted all
                    // the same, a few tokens over at most)
                    l.take(n, now, &self.tokens);
                    // the part keeps count too, never refusing (as for one key)
                    if let (Some(h), Some((b, t))) = (key, table) {
                        let (_, tolerance) = l.part.get();
                        b.update(t, h, table::tag(h, r.salt), now, |tat| {
                            Some((tat.max(now) + n * interval).min(now + tolerance))
                        });
                    }
                    r.count_allowed(n);
                    continue;
                }
                if tokens {
                    l.take(n, now, &self.tokens);
                }
            }
            let interval = match lease {
                Some(l) if tokens || l.settling(now, &self.tokens) => Self::settling_part(l, r).0,
                _ => interval,
            };
            let charge = |tat: u64| Some(tat.max(now) + n * interval);
            let placed = match (key, table) {
                (Some(h), Some((b, t))) => b.update(t, h, table::tag(h, r.salt), now, charge) != table::Update::Full,
                _ => false,
            };
            if !placed {
                let _ = r.shared.fetch_update(Ordering::Relaxed, Ordering::Relaxed, charge);
            }
            r.count_allowed(n);
        }
        Ok(())
    }

    /// The part a watched key is also charged with while the fleet changes over
    /// ([`share::Lease::settling`]): the stricter of its lease's and the rule's part of an
    /// unwatched key (1/N), which is what members that do not watch it yet charge with.
    /// (Its lease's share follows the demand reported so far, all of it here when this
    /// instance is the first to report the key.)
    #[inline]
    fn settling_part(l: &share::Lease, r: &Rule) -> (u64, u64) {
        let (a, b) = (l.part.get(), r.local.get());
        if a.0 >= b.0 { a } else { b }
    }

    /// The interval and tolerance a budget is charged with: its lease's when the fleet
    /// watches the key (`tag`: the key's budget tag), else the rule's part.
    #[inline]
    fn part<'s>(state: &'s State, r: &Rule, tag: Option<u64>) -> (u64, u64, Option<&'s Arc<share::Lease>>) {
        if let Some(l) = tag.filter(|_| !state.leases.is_empty()).and_then(|tag| state.leases.get(&tag)) {
            let (i, t) = l.part.get();
            return (i, t, Some(l));
        }
        let (i, t) = r.local.get();
        (i, t, None)
    }

    /// One key (most commands): one table lookup, checked and charged in one step.
    /// `hint`: the session's [`View`] hint, which may hold the key's hash.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn check_one(
        &self,
        state: &State,
        tables: &mut Option<table::TableCache>,
        cmd: &Command,
        key: &[u8],
        hint: (usize, usize, u64),
        now: u64,
        cached: bool,
    ) -> Result<(), Throttled> {
        let Some(ri) = state.rules.iter().position(|r| r.matches(cmd, key)) else { return Ok(()) };
        let r = &state.rules[ri];
        if cached && !r.spec.count_cached {
            return Ok(());
        }
        // The common case, inlined: a per-key budget while the fleet watches no key (no
        // lease), charged with the rule's part; the rest is check_rule's.
        if r.per_key
            && state.leases.is_empty()
            && let Some(b) = self.table.get()
        {
            let h =
                if (key.as_ptr() as usize, key.len()) == (hint.0, hint.1) { hint.2 } else { self.hasher.hash_one(key) };
            let (interval, tolerance) = r.local.get();
            let t = tables.get_or_insert_with(|| b.cache()).load();
            return match b.take(t, h, table::tag(h, r.salt), now, interval, tolerance) {
                table::Update::Applied(true) => {
                    r.count_allowed(1);
                    Ok(())
                }
                table::Update::Applied(false) => self.refused(r, ri, key, true),
                // at the cap a new key draws on the shared budget
                table::Update::Full => {
                    let take = table::gcra(now, interval, tolerance);
                    let ok = r.shared.fetch_update(Ordering::Relaxed, Ordering::Relaxed, take).is_ok();
                    self.finish(r, ri, key, ok, true)
                }
            };
        }
        self.check_rule(state, tables, r, ri, key, hint, now)
    }

    /// [`Limiter::check_one`] past its common case: a shared budget, or a key the fleet
    /// watches.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn check_rule(
        &self,
        state: &State,
        tables: &mut Option<table::TableCache>,
        r: &Rule,
        ri: usize,
        key: &[u8],
        hint: (usize, usize, u64),
        now: u64,
    ) -> Result<(), Throttled> {
        let take = |interval: u64, tolerance: u64| table::gcra(now, interval, tolerance);
        // `candidate`: a per-key budget the fleet does not watch yet
        let (ok, candidate) = match self.table.get() {
            Some(b) if r.per_key => {
                let h = if (key.as_ptr() as usize, key.len()) == (hint.0, hint.1) {
                    hint.2
                } else {
                    self.hasher.hash_one(key)
                };
                let tag = table::tag(h, r.salt);
                let (interval, tolerance, lease) = Self::part(state, r, Some(tag));
                if let Some(l) = lease {
                    l.demand.fetch_add(1, Ordering::Relaxed);
                    // a watched key draws on the tokens this instance took from the
                    // fleet's bucket for it, while the bucket answers; while the fleet
                    // changes over (a key newly watched, the bucket answering again),
                    // on this instance's part as well, as other members may still draw
                    // on theirs
                    if self.tokens.drawing() {
                        let t = tables.get_or_insert_with(|| b.cache()).load();
                        if l.settling(now, &self.tokens) {
                            // a token is looked for first: a request refused for want of
                            // one does not spend the part (keys of a few requests a second
                            // spent most of it on refused requests: tests/fleet.rs's 1,000
                            // keys admitted 0.29 of the rule in their second second)
                            if l.tokens.load(Ordering::Relaxed) == 0 {
                                l.refused(1, now, &self.tokens);
                                return self.finish(r, ri, key, false, false);
                            }
                            let (i, t_) = Self::settling_part(l, r);
                            if b.update(t, h, tag, now, take(i, t_)) == table::Update::Applied(false) {
                                return self.finish(r, ri, key, false, false);
                            }
                        } else {
                            // the part keeps count too (never refusing): should the
                            // buckets stop answering, the key draws on a part whose burst
                            // its recent requests spent, not a full one on top of what
                            // the bucket gave
                            b.update(t, h, tag, now, |tat| Some((tat.max(now) + interval).min(now + tolerance)));
                        }
                        return self.finish(r, ri, key, l.take(1, now, &self.tokens), false);
                    }
                    // (the buckets did not answer: asked again now and then)
                    if self.tokens.shared.load(Ordering::Relaxed) && now >= l.not_before.load(Ordering::Relaxed) {
                        l.ask(&self.tokens);
                    }
                }
                // Without tokens, a key some member may not watch yet draws on the stricter
                // part: that member draws on the rule's 1/N, and the parts of a plan it
                // has not applied (demand shares) would add up to more than the rule.
                let (interval, tolerance) = match lease {
                    Some(l) if l.settling(now, &self.tokens) => Self::settling_part(l, r),
                    _ => (interval, tolerance),
                };
                let take = take(interval, tolerance);
                let ok = match b.update(tables.get_or_insert_with(|| b.cache()).load(), h, tag, now, take) {
                    table::Update::Applied(ok) => ok,
                    // at the cap a new key draws on the shared budget
                    table::Update::Full => r.shared.fetch_update(Ordering::Relaxed, Ordering::Relaxed, take).is_ok(),
                };
                (ok, lease.is_none())
            }
            _ => {
                let (interval, tolerance) = r.local.get();
                (r.shared.fetch_update(Ordering::Relaxed, Ordering::Relaxed, take(interval, tolerance)).is_ok(), false)
            }
        };
        self.finish(r, ri, key, ok, candidate)
    }

    /// Counts one key's check; `candidate`: a refused key the fleet may watch.
    #[inline]
    fn finish(&self, r: &Rule, ri: usize, key: &[u8], ok: bool, candidate: bool) -> Result<(), Throttled> {
        if ok {
            r.count_allowed(1);
            Ok(())
        } else {
            self.refused(r, ri, key, candidate)
        }
    }

    /// Counts one key refused; `candidate`: a key the fleet may watch.
    #[cold]
    #[inline(never)]
    fn refused(&self, r: &Rule, ri: usize, key: &[u8], candidate: bool) -> Result<(), Throttled> {
        r.throttled.fetch_add(1, Ordering::Relaxed);
        if candidate {
            self.candidates.note(ri, key);
        }
        Err(Throttled { key: key.to_vec(), rate: r.spec.rate, rule: r.spec.name.clone() })
    }

    /// Now, in the limiter's clock.
    pub fn now(&self) -> u64 {
        self.ns(Instant::now())
    }

    /// Drops budgets that have been full (they hold no information) for the idle time,
    /// visiting a tenth of the table per call (it is called every second, so a budget is
    /// dropped at most about 10 s after it became idle). Returns how many.
    pub fn reclaim(&self) -> usize {
        let Some(t) = self.table.get() else { return 0 };
        if t.is_empty() {
            return 0;
        }
        let cutoff = self.ns(Instant::now()).saturating_sub(self.idle_ns);
        t.reclaim(cutoff, (t.slots() / 10).max(4096))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, pattern: &str, rate: f64, burst: u64, scope: &str, commands: &str) -> RuleConfig {
        RuleConfig {
            name: name.into(),
            pattern: pattern.into(),
            commands: CommandsSpec::Kind(commands.into()),
            rate,
            burst,
            scope: scope.into(),
            count_cached: false,
        }
    }

    /// A per-key rule on every key at a million requests a second.
    fn every_key(t: &CommandTable, burst: u64, cap: usize, idle: std::time::Duration) -> Limiter {
        Limiter::new(compile(&[rule("r", "*", 1_000_000.0, burst, "per-key", "all")], t).unwrap(), cap, idle)
    }

    #[test]
    fn burst_then_refused_without_charging() {
        let t = CommandTable::new();
        let get = t.get(b"GET").unwrap();
        let mget = t.get(b"MGET").unwrap();
        let l =
            Limiter::new(compile(&[rule("r", "k:*", 1.0, 3, "per-key", "all")], &t).unwrap(), 100, Default::default());
        for _ in 0..3 {
            assert!(l.check(get, [&b"k:a"[..]].into_iter(), Instant::now(), false).is_ok());
        }
        let e = l.check(get, [&b"k:a"[..]].into_iter(), Instant::now(), false).unwrap_err();
        assert_eq!(e.message(), "THROTTLED key 'k:a' is over 1 requests/s (rule 'r')");
        // MGET with an exhausted key is refused whole and does not charge k:b
        assert!(l.check(mget, [&b"k:b"[..], &b"k:a"[..]].into_iter(), Instant::now(), false).is_err());
        for _ in 0..3 {
            assert!(l.check(get, [&b"k:b"[..]].into_iter(), Instant::now(), false).is_ok());
        }
        assert!(l.check(get, [&b"k:b"[..]].into_iter(), Instant::now(), false).is_err());
        // keys no rule matches are free
        for _ in 0..100 {
            assert!(l.check(get, [&b"other"[..]].into_iter(), Instant::now(), false).is_ok());
        }
        assert_eq!(l.tracked_keys(), 2);
    }

    #[test]
    fn duplicates_and_shared_budgets_add_up() {
        let t = CommandTable::new();
        let mget = t.get(b"MGET").unwrap();
        let l =
            Limiter::new(compile(&[rule("s", "*", 1.0, 3, "shared", "reads")], &t).unwrap(), 100, Default::default());
        // 4 keys on one shared budget of 3: refused
        assert!(
            l.check(mget, [&b"a"[..], &b"b"[..], &b"c"[..], &b"d"[..]].into_iter(), Instant::now(), false).is_err()
        );
        assert!(l.check(mget, [&b"a"[..], &b"a"[..], &b"b"[..]].into_iter(), Instant::now(), false).is_ok());
        assert!(l.check(mget, [&b"z"[..]].into_iter(), Instant::now(), false).is_err());
        // writes are not counted by a reads rule
        let set = t.get(b"SET").unwrap();
        assert!(l.check(set, [&b"a"[..]].into_iter(), Instant::now(), false).is_ok());
    }

    #[test]
    fn cap_falls_back_to_shared_and_reclaim_frees() {
        let t = CommandTable::new();
        let get = t.get(b"GET").unwrap();
        let l = every_key(&t, 1, 2, std::time::Duration::from_millis(1));
        for k in [&b"a"[..], b"b", b"c", b"d"] {
            let _ = l.check(get, [k].into_iter(), Instant::now(), false);
        }
        assert_eq!(l.tracked_keys(), 2);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(l.reclaim(), 2);
        assert_eq!(l.tracked_keys(), 0);
    }

    #[test]
    fn budgets_survive_the_table_growing() {
        let t = CommandTable::new();
        let get = t.get(b"GET").unwrap();
        let l = every_key(&t, 5, 10_000, Default::default());
        let now = Instant::now();
        for i in 0..3000 {
            let k = format!("k{i}");
            assert!(l.check(get, [k.as_bytes()].into_iter(), now, false).is_ok());
        }
        let b = l.table.get().unwrap();
        assert!(b.slots() >= 8192, "the table grew");
        // budgets survived the moves: each key has 4 more requests of its burst of 5
        for _ in 0..4 {
            assert!(l.check(get, [&b"k7"[..]].into_iter(), now, false).is_ok());
        }
        assert!(l.check(get, [&b"k7"[..]].into_iter(), now, false).is_err());
        assert_eq!(l.tracked_keys(), 3000);
    }

    /// The plan in which this instance's report ends the change-over for a key (it was
    /// the last to say it watches the key) has it ask at once, emptying the key's bucket
    /// (within a second); one that another member's report settled does not, later plans
    /// do not renew it, and a plan that is not settled again (a member joined) leads to a
    /// new one.
    #[test]
    fn the_change_overs_end_empties_the_bucket_once() {
        let t = CommandTable::new();
        let l = Limiter::new(
            compile(&[rule("r", "k:*", 100.0, 10, "per-key", "all")], &t).unwrap(),
            100,
            Default::default(),
        );
        let plan = |settled: bool, ends: bool| Plan {
            rules: l.state.load_full().rules.clone(),
            shares: vec![1.0 / 3.0],
            leases: vec![(0, b"k:a".to_vec().into(), 1.0, b"bucket".to_vec().into(), settled, ends)],
            members: 3,
        };
        let lease = || l.state.load_full().leases.values().next().expect("the key is leased").clone();
        let burn = || lease().burn_until.load(Ordering::Relaxed);
        l.fleet_apply(&plan(false, false));
        assert!(lease().settling(l.now(), &l.tokens), "unsettled: part and token");
        assert_eq!(burn(), 0, "no bucket emptied while the fleet changes over");
        // settled by another member's report: no emptying here
        l.fleet_apply(&plan(true, false));
        assert!(!lease().settling(l.now(), &l.tokens), "settled: tokens alone");
        assert_eq!(burn(), 0, "another member's report ended the change-over");
        l.fleet_apply(&plan(false, false));
        let before = l.now();
        l.fleet_apply(&plan(true, true));
        assert!(!lease().settling(l.now(), &l.tokens), "settled: tokens alone");
        let first = burn();
        assert!(first >= before + share::BURN_WITHIN_NS && first <= l.now() + share::BURN_WITHIN_NS);
        assert!(lease().asking.load(Ordering::Relaxed), "and asks at once, demand or not");
        std::thread::sleep(std::time::Duration::from_millis(20));
        l.fleet_apply(&plan(true, true));
        assert_eq!(burn(), first, "a later settled plan does not empty it again");
        l.fleet_apply(&plan(false, false));
        assert!(lease().settling(l.now(), &l.tokens), "a member joined: part and token again");
        l.fleet_apply(&plan(true, true));
        assert!(burn() > first, "and its end empties the bucket again");
    }

    #[test]
    fn invalid_rules_are_named() {
        let t = CommandTable::new();
        let mut bad = vec![rule("a", "x", 0.0, 1, "per-key", "all"), rule("a", "", 1.0, 0, "sideways", "some")];
        bad.push(RuleConfig {
            commands: CommandsSpec::List(vec!["NOPE".into()]),
            ..rule("c", "x", 1.0, 1, "shared", "all")
        });
        let p = compile(&bad, &t).err().unwrap();
        let all = p.join("\n");
        for want in ["rate", "earlier rule", "pattern", "burst", "scope", "commands: 'some'", "unknown command 'NOPE'"]
        {
            assert!(all.contains(want), "{want} missing in {all}");
        }
    }
}
