//! A fleet of heatshields (docs/fleet.md): instances with the same `fleet.name` find each
//! other through the cluster they serve and divide each rate-limit rule between them, so
//! that a rule holds for the fleet as a whole, with no round trip on the request path.
//!
//! Every `fleet.sync_interval_ms`, on the control runtime, each instance runs one script
//! on the master of the fleet's slot (its keys share the hash tag `{heatshield:NAME}`):
//! it writes the instance's report (what its rules and its watched keys saw, per second,
//! since the last one) into the hash `{heatshield:NAME}:reports` and its expiry time
//! (Redis's clock plus `fleet.member_ttl_ms`) into the sorted set
//! `{heatshield:NAME}:members`, removes the members whose time passed, and returns every
//! report. From the reports each instance works out its own part ([`plan`]):
//!
//! - a per-key rule: 1/N of the rate and burst for each key, N being the members that
//!   have the rule;
//! - a key throttled anywhere (watched: a lease): the instance's share of the key's demand
//!   over the fleet (with a floor of 1% of the rate each, so that an instance that starts
//!   seeing the key gets some budget at once), as long as the fleet's demand on it is at
//!   least half of 1/N of the rate (below that, 1/N admits everything);
//! - a shared rule: the instance's share of the rule's demand, with the same floor.
//!
//! The shares add up to one: the fleet admits the rule's rate. When the script fails
//! (the master unreachable, a failover), each instance keeps its last part (said by
//! `heatshield_fleet_sync_age_seconds`, and `PROXY RATELIMIT LIST`). An instance that
//! stops cleanly removes its report at once; one killed is dropped after
//! `fleet.member_ttl_ms`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::protocol::Request;
use crate::protocol::reply::Value;
use crate::services::ratelimit::{Limiter, Plan, Rule, Seen};
use crate::upstream::cluster::{Cluster, slot};
use crate::upstream::side::Side;

/// `[fleet]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// The fleet's name; instances with the same name divide the rate-limit rules between
    /// them. Empty: this instance is alone.
    pub name: String,
    /// How often an instance reports and works out its part again.
    pub sync_interval_ms: u64,
    /// An instance that stopped reporting this long is no longer a member.
    pub member_ttl_ms: u64,
    /// Keys the fleet watches at most (the most demanded first).
    pub max_watched_keys: usize,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig { name: String::new(), sync_interval_ms: 500, member_ttl_ms: 1500, max_watched_keys: 10_000 }
    }
}

impl FleetConfig {
    /// Problems with the settings, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut p = vec![];
        if self.name.contains(['{', '}']) || self.name.len() > 64 {
            p.push("fleet.name: at most 64 bytes, without '{' or '}'".to_string());
        }
        if !(50..=60_000).contains(&self.sync_interval_ms) {
            p.push("fleet.sync_interval_ms: between 50 and 60000".to_string());
        }
        if self.member_ttl_ms < 2 * self.sync_interval_ms || self.member_ttl_ms > 600_000 {
            p.push("fleet.member_ttl_ms: at least twice fleet.sync_interval_ms, at most 600000".to_string());
        }
        if self.max_watched_keys > 1_000_000 {
            p.push("fleet.max_watched_keys: at most 1000000".to_string());
        }
        p
    }

    /// The fleet's two keys: reports and members.
    pub fn keys(&self) -> (String, String) {
        (format!("{{heatshield:{}}}:reports", self.name), format!("{{heatshield:{}}}:members", self.name))
    }

    /// The fleet's bucket for a watched key under a rule (by the rule's id): a key in the
    /// fleet's slot, named by the rule's digest and the key.
    pub fn bucket(&self, rule_id: &str, key: &[u8]) -> Box<[u8]> {
        let digest = sha1_smol::Sha1::from(rule_id).digest().to_string();
        let mut b = format!("{{heatshield:{}}}:tokens:{}:", self.name, &digest[..16]).into_bytes();
        b.extend_from_slice(key);
        b.into_boxed_slice()
    }
}

/// How much of a leased key's demand in the last round goes into the demand it reports
/// (an exponential average: about three rounds).
const SMOOTHING: f64 = 0.35;

/// The floor of every member's demand, as a fraction of the rule's rate.
const FLOOR: f64 = 0.01;

/// What the fleet looks like from here (`PROXY RATELIMIT LIST`, metrics).
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Members seen in the last sync, this one included (1 alone or before any sync).
    pub members: usize,
    /// When the last sync succeeded.
    pub synced: Option<Instant>,
    /// The last sync's error, if it failed.
    pub error: Option<String>,
    /// By rule name: the fleet's demand and this instance's (requests per second), and
    /// how many members have the rule.
    pub rules: HashMap<String, (f64, f64, usize)>,
    /// Every member at the last sync, this one included, the earliest joined first.
    pub list: Vec<Member>,
    /// The fleet's names and rules: for each of colocation, users and rate rules, the
    /// digest most members have (on a tie, the earliest joined member's).
    pub fleet_digests: Digests,
}

/// An instance's colocation rules, users and rate rules, each as a digest: instances of
/// one fleet must agree on colocation (or they store one key under two names), and
/// should on the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Digests {
    pub colocate: String,
    pub users: String,
    pub rules: String,
    /// The colocation rules themselves (JSON of their `[[colocate]]` tables): an
    /// instance that differs refuses the keys the fleet's rules would store otherwise.
    pub colocate_rules: String,
    /// The digest of the rules it switches to with the fleet (`[[colocate_next]]`), if any.
    pub next: String,
    /// It refuses the keys its rules and its next rules name differently, until every
    /// member does (then each switches): see [`Fleet::closing`].
    pub closing: bool,
}

impl Digests {
    /// The colocation rules it counts as having: its next ones once it is closing for
    /// them (it serves neither's names of the keys they name differently, and switches
    /// when every member is closing), its own otherwise.
    pub fn names(&self) -> &String {
        if self.closing && !self.next.is_empty() { &self.next } else { &self.colocate }
    }

    /// What of `self` differs from `fleet` (`colocate`, `users`, `rules`).
    pub fn differing(&self, fleet: &Digests) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (what, a, b) in [
            ("colocate", self.names(), &fleet.colocate),
            ("users", &self.users, &fleet.users),
            ("rules", &self.rules, &fleet.rules),
        ] {
            if !b.is_empty() && a != b {
                out.push(what);
            }
        }
        out
    }
}

/// One member as its last report says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Member {
    pub id: String,
    /// `listen-address pid version`.
    pub about: String,
    pub digests: Digests,
    /// When it joined (unix ms).
    pub since_ms: u64,
    /// When it last reported (unix ms).
    pub at_ms: u64,
}

/// The fleet: its settings, this instance's id and the view.
pub struct Fleet {
    pub config: FleetConfig,
    /// This instance's id in the fleet's keys: random, new at every start.
    pub id: String,
    /// What the reports of this instance say it is (`addr pid version`).
    pub about: String,
    /// When this instance started (unix ms): the earliest member breaks ties over the
    /// fleet's names.
    pub since_ms: u64,
    view: Mutex<View>,
    /// This instance's digests now (set at start-up, read at each sync: a reload shows at
    /// the next one).
    digests: std::sync::OnceLock<Box<dyn Fn() -> Digests + Send + Sync>>,
    /// This instance's colocation rules differ from the fleet's: it is not ready.
    names_differ: std::sync::atomic::AtomicBool,
    /// The fleet's colocation rules, while this instance's differ.
    fleet_rules: Mutex<Option<Arc<crate::services::colocate::Rules>>>,
    /// Switching colocation rules with the fleet: this instance refuses the keys its rules
    /// and its next ones name differently, and waits for every member to do the same.
    closing: std::sync::atomic::AtomicBool,
    /// Puts the next colocation rules in force (set at start-up).
    switcher: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// `names_differ || closing`: the one load the request path makes ([`Fleet::refusing`]).
    refusing: std::sync::atomic::AtomicBool,
}

impl Fleet {
    pub fn new(config: FleetConfig, listen: &str) -> Arc<Fleet> {
        let id = format!("{:016x}", ahash::RandomState::new().hash_one(std::process::id()));
        let about = format!("{} {} {}", listen, std::process::id(), env!("CARGO_PKG_VERSION"));
        Arc::new(Fleet {
            config,
            id,
            about,
            since_ms: unix_ms(),
            view: Mutex::new(View { members: 1, ..View::default() }),
            digests: std::sync::OnceLock::new(),
            names_differ: std::sync::atomic::AtomicBool::new(false),
            fleet_rules: Mutex::new(None),
            closing: std::sync::atomic::AtomicBool::new(false),
            switcher: std::sync::OnceLock::new(),
            refusing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether this instance is closing for its next colocation rules ([`Fleet::closing`]'s
    /// field).
    #[inline]
    pub fn closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::Acquire)
    }

    fn set_closing(&self, on: bool) {
        self.closing.store(on, std::sync::atomic::Ordering::Release);
        self.refusing.store(on || self.names_differ(), std::sync::atomic::Ordering::Release);
    }

    fn set_names_differ(&self, on: bool) {
        self.names_differ.store(on, std::sync::atomic::Ordering::Release);
        self.refusing.store(on || self.closing(), std::sync::atomic::Ordering::Release);
    }

    /// Whether some keys are refused now: this instance's colocation rules differ from the
    /// fleet's, or it is closing for its next ones.
    #[inline]
    pub fn refusing(&self) -> bool {
        self.refusing.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Where the next colocation rules are put in force from (once, at start-up). An
    /// instance that starts with next rules other than its own starts closing: it may be
    /// joining a fleet that switched already, and its first sync says.
    pub fn set_switcher(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.switcher.set(Box::new(f));
        let d = self.digests();
        if self.enabled() && !d.next.is_empty() && d.next != d.colocate {
            self.set_closing(true);
        }
    }

    /// While this instance's colocation rules differ from the fleet's: whether `key` (a
    /// client's name) is stored under another name by `mine` than by the fleet's rules.
    /// (Not known yet: every key a rule of either may take is.)
    pub fn stored_otherwise(&self, mine: &crate::services::colocate::Rules, key: &[u8]) -> bool {
        match self.fleet_rules.lock().as_ref() {
            Some(fleet) => mine.stored_name(key) != fleet.stored_name(key),
            None => mine.stored_name(key).is_some(),
        }
    }

    /// Where this instance's digests come from (once, at start-up).
    pub fn set_digests(&self, f: impl Fn() -> Digests + Send + Sync + 'static) {
        let _ = self.digests.set(Box::new(f));
    }

    /// This instance's digests now.
    pub fn digests(&self) -> Digests {
        self.digests.get().map(|f| f()).unwrap_or_default()
    }

    /// This instance's colocation rules differ from the fleet's (`/ready` says so).
    pub fn names_differ(&self) -> bool {
        self.names_differ.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn enabled(&self) -> bool {
        !self.config.name.is_empty()
    }

    pub fn view(&self) -> View {
        self.view.lock().clone()
    }
}

/// A rule's identity across instances: its whole definition (instances that define a
/// rule differently do not share it).
pub fn rule_id(r: &Rule) -> String {
    let s = &r.spec;
    hex(format!(
        "{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{:?}\u{1f}{}",
        s.name, s.pattern, s.rate, s.burst, s.scope, s.commands, s.count_cached
    )
    .as_bytes())
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// One member's report: its demand per rule and per watched key (requests per second).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub id: String,
    pub about: String,
    pub digests: Digests,
    /// When the member joined, and when it wrote this report (unix ms).
    pub since_ms: u64,
    pub at_ms: u64,
    /// By rule id.
    pub rules: HashMap<String, f64>,
    /// By (rule id, key).
    pub keys: HashMap<(String, Vec<u8>), f64>,
    /// The keys of `keys` the member watches (has a lease for) as it writes the report.
    pub watched: std::collections::HashSet<(String, Vec<u8>)>,
}

impl Report {
    /// The report as stored: a line each (`a ABOUT`, `s SINCE AT`, `d c|u|r DIGEST`,
    /// `r RULE DEMAND`, `k RULE KEY DEMAND [w]`, names and keys in hex; `w`: watched).
    pub fn encode(&self) -> String {
        let mut s = format!("a {}\n", self.about);
        let _ = writeln!(s, "s {} {}", self.since_ms, self.at_ms);
        for (w, d) in [("c", &self.digests.colocate), ("u", &self.digests.users), ("r", &self.digests.rules)] {
            if !d.is_empty() {
                let _ = writeln!(s, "d {w} {d}");
            }
        }
        if !self.digests.colocate_rules.is_empty() {
            let _ = writeln!(s, "c {}", hex(self.digests.colocate_rules.as_bytes()));
        }
        if !self.digests.next.is_empty() {
            let _ = writeln!(s, "d n {}", self.digests.next);
        }
        if self.digests.closing {
            let _ = writeln!(s, "w closing");
        }
        for (r, d) in &self.rules {
            let _ = writeln!(s, "r {r} {d:.3}");
        }
        for ((r, k), d) in &self.keys {
            let w = if self.watched.contains(&(r.clone(), k.clone())) { " w" } else { "" };
            let _ = writeln!(s, "k {r} {} {d:.3}{w}", hex(k));
        }
        s
    }

    pub fn decode(id: &str, text: &str) -> Report {
        let mut rep = Report { id: id.to_string(), ..Report::default() };
        for line in text.lines() {
            let mut f = line.split(' ');
            match f.next() {
                Some("a") => rep.about = line[2.min(line.len())..].to_string(),
                Some("s") => {
                    rep.since_ms = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                    rep.at_ms = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                }
                Some("c") => {
                    let rules = f.next().and_then(unhex).map(|b| String::from_utf8_lossy(&b).into_owned());
                    rep.digests.colocate_rules = rules.unwrap_or_default();
                }
                Some("d") => {
                    let (w, d) = (f.next(), f.next().unwrap_or_default().to_string());
                    match w {
                        Some("c") => rep.digests.colocate = d,
                        Some("u") => rep.digests.users = d,
                        Some("r") => rep.digests.rules = d,
                        Some("n") => rep.digests.next = d,
                        _ => {}
                    }
                }
                Some("w") => rep.digests.closing = f.next() == Some("closing"),
                Some("r") => {
                    if let (Some(r), Some(Ok(d))) = (f.next(), f.next().map(str::parse::<f64>)) {
                        rep.rules.insert(r.to_string(), d.max(0.0));
                    }
                }
                Some("k") => {
                    if let (Some(r), Some(Some(k)), Some(Ok(d))) =
                        (f.next(), f.next().map(unhex), f.next().map(str::parse::<f64>))
                    {
                        if f.next() == Some("w") {
                            rep.watched.insert((r.to_string(), k.clone()));
                        }
                        rep.keys.insert((r.to_string(), k), d.max(0.0));
                    }
                }
                _ => {}
            }
        }
        rep
    }
}

/// The fleet's digests: for each of colocation, users and rules, the one most members
/// report; on a tie, the earliest joined member's (then the lowest id). Members whose
/// report has none (an older version) are not counted.
pub fn fleet_digests(reports: &[Report]) -> Digests {
    let mut sorted: Vec<&Report> = reports.iter().collect();
    sorted.sort_by(|a, b| (a.since_ms, &a.id).cmp(&(b.since_ms, &b.id)));
    let pick = |get: &dyn Fn(&Report) -> &String| -> String {
        let mut counts: Vec<(&String, usize)> = Vec::new();
        for r in &sorted {
            let d = get(r);
            if d.is_empty() {
                continue;
            }
            match counts.iter_mut().find(|(x, _)| *x == d) {
                Some((_, n)) => *n += 1,
                None => counts.push((d, 1)),
            }
        }
        // (the first of the most counted: the earliest joined among them)
        let most = counts.iter().map(|(_, n)| *n).max().unwrap_or(0);
        counts.iter().find(|(_, n)| *n == most).map(|(d, _)| (*d).clone()).unwrap_or_default()
    };
    Digests {
        colocate: pick(&|r| r.digests.names()),
        users: pick(&|r| &r.digests.users),
        rules: pick(&|r| &r.digests.rules),
        ..Digests::default()
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A key to watch: rule index, key, this instance's share.
pub type Lease = (usize, Vec<u8>, f64, bool);

/// This instance's part, from every member's report (its own among them, under `me`).
/// `rules` are this instance's rules with their ids.
pub fn plan(me: &str, rules: &[(Arc<Rule>, String)], reports: &[Report], max_keys: usize) -> (Vec<f64>, Vec<Lease>) {
    let mut shares = Vec::with_capacity(rules.len());
    let mut keys: Vec<(f64, usize, Vec<u8>, f64, bool)> = Vec::new();
    let mine = reports.iter().find(|r| r.id == me);
    for (ri, (rule, id)) in rules.iter().enumerate() {
        let with: Vec<&Report> = reports.iter().filter(|r| r.rules.contains_key(id)).collect();
        let n = with.len().max(1) as f64;
        let floor = FLOOR * rule.spec.rate;
        let share_of = |own: f64, total: f64| ((own + floor) / (total + n * floor)).clamp(0.0, 1.0);
        if rule.spec.scope == "shared" {
            let total: f64 = with.iter().map(|r| r.rules[id]).sum();
            let own = mine.and_then(|r| r.rules.get(id)).copied().unwrap_or(0.0);
            shares.push(share_of(own, total));
            continue;
        }
        shares.push(1.0 / n);
        // the keys any member watches under this rule, with the fleet's demand
        let mut totals: HashMap<&[u8], f64> = HashMap::new();
        for r in &with {
            for ((rid, k), d) in &r.keys {
                if rid == id {
                    *totals.entry(&k[..]).or_default() += d;
                }
            }
        }
        for (k, total) in totals {
            if total < rule.spec.rate / (2.0 * n) {
                continue;
            }
            let at = (id.clone(), k.to_vec());
            let own = mine.and_then(|r| r.keys.get(&at)).copied().unwrap_or(0.0);
            // every member with the rule said it watches the key: none draws on its part
            let settled = with.iter().all(|r| r.watched.contains(&at));
            keys.push((total / rule.spec.rate, ri, k.to_vec(), share_of(own, total), settled));
        }
    }
    // the most demanded keys first, relative to their rule's rate
    keys.sort_by(|a, b| b.0.total_cmp(&a.0));
    keys.truncate(max_keys);
    (shares, keys.into_iter().map(|(_, ri, k, s, settled)| (ri, k, s, settled)).collect())
}

/// The script: report, expire the members gone, return every report.
const SYNC: &str = "\
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, id in ipairs(gone) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
redis.call('PEXPIRE', KEYS[1], 60000)
redis.call('PEXPIRE', KEYS[2], 60000)
return redis.call('HGETALL', KEYS[1])";

/// The script that gives an instance tokens from the fleet's buckets: for each key, its
/// interval and tolerance (GCRA, microseconds, the rule's whole rate and burst), how
/// many tokens the instance wants, and 1 to empty the bucket first (the end of the
/// fleet's change-over for the key: [`Lease::burn_until`]) or 0; returns, for each, how
/// many it got and the microseconds until the bucket has one more. Redis's clock is every
/// instance's. A bucket starts empty (the key had its parts of the rule until it was
/// watched), and goes 10 s after it was last full.
///
/// [`Lease::burn_until`]: crate::services::ratelimit::share::Lease::burn_until
pub const TOKENS: &str = "\
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i, k in ipairs(KEYS) do
  local iv = tonumber(ARGV[4 * i - 3])
  local tol = tonumber(ARGV[4 * i - 2])
  local want = tonumber(ARGV[4 * i - 1])
  local was = tonumber(redis.call('GET', k) or '')
  local tat = was or (now + tol)
  if tat < now then tat = now end
  local burnt = ARGV[4 * i] == '1' and tat < now + tol
  if burnt then tat = now + tol end
  local n = math.floor((now + tol - tat) / iv)
  if n > want then n = want end
  if n < 0 then n = 0 end
  if n > 0 or not was or burnt then
    tat = tat + n * iv
    redis.call('SET', k, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 10000)
  end
  out[2 * i - 1] = n
  local wait = tat + iv - tol - now
  if wait < 0 then wait = 0 end
  out[2 * i] = math.ceil(wait)
end
return out";

/// The shortest time between two asks for tokens (asks that come sooner wait and go
/// together).
const TOKENS_EVERY: Duration = Duration::from_millis(3);

/// After the buckets did not answer, the leases ask again this much later (ns).
const RETRY_NS: u64 = 1_000_000_000;

/// Asks the fleet's buckets for the tokens the leases want, as they want them: one
/// script for every lease queued, at most every [`TOKENS_EVERY`]. While the buckets do
/// not answer, leases draw on their parts (`Tokens::on` is false) and ask again a
/// second later. Runs on the first worker's runtime (`front::server` starts it there),
/// not the control one: under load a worker thread gets the CPU sooner, and an ask that
/// comes late leaves the requests that wait for its tokens refused.
pub fn start_tokens(fleet: Arc<Fleet>, limiter: Arc<Limiter>, cluster: Arc<Cluster>) {
    if !fleet.enabled() {
        return;
    }
    limiter.tokens.on.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::spawn(async move {
        let mut link: Option<Side> = None;
        let mut last = Instant::now();
        loop {
            limiter.tokens.wake.notified().await;
            if let Some(d) = TOKENS_EVERY.checked_sub(last.elapsed()) {
                tokio::time::sleep(d).await;
            }
            last = Instant::now();
            let leases = limiter.tokens.take();
            if leases.is_empty() {
                continue;
            }
            use std::sync::atomic::Ordering::Relaxed;
            let asked = limiter.now();
            let burns: Vec<u64> = leases.iter().map(|l| l.burn_until.load(Relaxed)).collect();
            let outcome = ask_tokens(&fleet, &cluster, &mut link, &leases, &burns, asked).await;
            let now = limiter.now();
            match outcome {
                Ok(grants) => {
                    let g = crate::metrics::global();
                    g.fleet_token_asks_ok.increment(1);
                    g.fleet_tokens_taken.increment(grants.iter().map(|(n, _)| n).sum());
                    if !limiter.tokens.on.swap(true, Relaxed) {
                        // the others try again within a second of their own failure
                        limiter.tokens.both_until.store(now + RETRY_NS + 10 * TOKENS_EVERY.as_nanos() as u64, Relaxed);
                    }
                    for ((l, (n, wait_us)), &burn) in leases.iter().zip(grants).zip(&burns) {
                        if burn > asked {
                            // emptied: not again (unless a new change-over ended meanwhile)
                            let _ = l.burn_until.compare_exchange(burn, 0, Relaxed, Relaxed);
                        }
                        l.tokens.fetch_add(n, Relaxed);
                        l.not_before.store(if n == 0 { now + wait_us * 1000 } else { 0 }, Relaxed);
                        l.asking.store(false, Relaxed);
                    }
                }
                Err(e) => {
                    crate::metrics::global().fleet_token_asks_failed.increment(1);
                    if limiter.tokens.on.swap(false, Relaxed) {
                        warn!(fleet = %fleet.config.name, error = %e, "the fleet's buckets do not answer; watched keys draw on this instance's part");
                    }
                    link = None;
                    for l in &leases {
                        l.not_before.store(now + RETRY_NS, Relaxed);
                        l.asking.store(false, Relaxed);
                    }
                }
            }
        }
    });
}

/// One ask: for each lease, (tokens given, microseconds until the bucket has one more).
async fn ask_tokens(
    fleet: &Fleet,
    cluster: &Cluster,
    link: &mut Option<Side>,
    leases: &[Arc<crate::services::ratelimit::share::Lease>],
    burns: &[u64],
    now: u64,
) -> Result<Vec<(u64, u64)>, String> {
    use std::sync::atomic::Ordering::Relaxed;
    let side = link_to_master(fleet, cluster, link, "fleet-tokens")?;
    let count = leases.len().to_string();
    let mut args: Vec<Vec<u8>> = vec![b"EVAL".to_vec(), TOKENS.as_bytes().to_vec(), count.into_bytes()];
    args.extend(leases.iter().map(|l| l.bucket.to_vec()));
    for (l, &burn) in leases.iter().zip(burns) {
        let (interval, tolerance) = l.whole;
        // up to an ask's worth held (and what the requests that found none asked for,
        // within that)
        let most = l.most.load(Relaxed).max(1);
        let held = l.tokens.load(Relaxed);
        let want = (most.saturating_sub(held) + l.short.swap(0, Relaxed)).clamp(1, most);
        args.push(format!("{:.3}", interval as f64 / 1000.0).into_bytes());
        args.push(format!("{:.3}", tolerance as f64 / 1000.0).into_bytes());
        args.push(want.to_string().into_bytes());
        args.push(if burn > now { b"1".to_vec() } else { b"0".to_vec() });
    }
    let req = Request::from_args(&args);
    let reply =
        side.call_raw(req.raw(), 1).await.map_err(|e| format!("{}: {e}", side.addr()))?.pop().unwrap_or_default();
    match Value::parse(&reply) {
        Ok((Value::Array(v), _)) if v.len() == 2 * leases.len() => {
            let num = |x: &Value| match x {
                Value::Int(n) => (*n).max(0) as u64,
                _ => 0,
            };
            Ok(v.chunks(2).map(|p| (num(&p[0]), num(&p[1]))).collect())
        }
        _ => Err(refused(cluster, side, &reply)),
    }
}

/// The connection to the master of the fleet's slot in `link`, made anew when the slot
/// moved.
fn link_to_master<'l>(
    fleet: &Fleet,
    cluster: &Cluster,
    link: &'l mut Option<Side>,
    purpose: &'static str,
) -> Result<&'l mut Side, String> {
    let (reports, _) = fleet.config.keys();
    let node = cluster
        .topology()
        .master_for_slot(slot::slot(reports.as_bytes()))
        .cloned()
        .ok_or("no master for the fleet's slot")?;
    if link.as_ref().is_none_or(|l| **l.addr() != *node.addr) {
        *link = Some(Side::new(node.addr.clone(), node.options(), purpose));
    }
    link.as_mut().ok_or_else(|| "no link".to_string())
}

/// What a script's unexpected reply says (a redirection asks for a new slot map).
fn refused(cluster: &Cluster, side: &Side, reply: &[u8]) -> String {
    if crate::protocol::reply::error_text(reply).is_some_and(|e| e.starts_with(b"MOVED") || e.starts_with(b"ASK")) {
        cluster.request_refresh();
    }
    format!("{}: {}", side.addr(), String::from_utf8_lossy(&reply[..reply.len().min(200)]).trim_end())
}

/// The script an instance that stops runs: its report and membership go at once.
const LEAVE: &str = "redis.call('HDEL', KEYS[1], ARGV[1]) return redis.call('ZREM', KEYS[2], ARGV[1])";

/// What the task keeps between rounds.
struct Round {
    /// The connection to the master of the fleet's slot.
    link: Option<Side>,
    last: Instant,
    /// Each rule's demand counted at the last round, by rule id.
    counted: HashMap<String, u64>,
    /// Each leased key's demand (requests a second), smoothed over a few rounds
    /// ([`SMOOTHING`]), by rule id and key.
    smoothed: HashMap<(String, Vec<u8>), f64>,
    /// The last sync failed: the next that succeeds writes this instance's report but
    /// keeps the last parts (see [`sync`]).
    failed: bool,
}

/// Starts the fleet task (when a fleet is configured) and waits for its first sync, at
/// most a sync interval, so that the first clients meet the fleet's parts.
pub async fn start(fleet: Arc<Fleet>, limiter: Arc<Limiter>, cluster: Arc<Cluster>) {
    if !fleet.enabled() {
        return;
    }
    limiter.candidates.on.store(true, std::sync::atomic::Ordering::Relaxed);
    let every = Duration::from_millis(fleet.config.sync_interval_ms);
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    info!(fleet = %fleet.config.name, id = %fleet.id, "joining the fleet");
    tokio::spawn(async move {
        let mut round = Round {
            link: None,
            last: Instant::now(),
            counted: HashMap::new(),
            smoothed: HashMap::new(),
            failed: false,
        };
        let mut first = Some(first_tx);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let outcome = sync(&fleet, &limiter, &cluster, &mut round).await;
            let g = crate::metrics::global();
            match outcome {
                Ok(()) => g.fleet_syncs_ok.increment(1),
                Err(e) => {
                    g.fleet_syncs_failed.increment(1);
                    round.link = None;
                    round.failed = true;
                    // The fleet's master did not answer: the buckets are on it too. Watched
                    // keys draw on this instance's part until an ask succeeds again, as
                    // every other member's do: one whose asks happened to succeed around
                    // the failure would otherwise take the whole rate from the bucket
                    // while the others take theirs from their parts.
                    limiter.tokens.on.store(false, std::sync::atomic::Ordering::Relaxed);
                    let mut v = fleet.view.lock();
                    if v.error.is_none() {
                        warn!(fleet = %fleet.config.name, error = %e, "fleet sync failed; keeping the last parts");
                    } else {
                        debug!(error = %e, "fleet sync failed");
                    }
                    v.error = Some(e);
                }
            }
            if let Some(tx) = first.take() {
                let _ = tx.send(());
            }
        }
    });
    let _ = tokio::time::timeout(every, first_rx).await;
}

/// Removes this instance from the fleet (on shutdown), so the others take its part now.
pub async fn leave(fleet: &Fleet, cluster: &Cluster) {
    if !fleet.enabled() {
        return;
    }
    let (reports, members) = fleet.config.keys();
    let req = Request::from_args(&["EVAL", LEAVE, "2", &reports, &members, &fleet.id]);
    let Some(node) = cluster.topology().master_for_slot(slot::slot(reports.as_bytes())).cloned() else { return };
    let mut side = Side::new(node.addr.clone(), node.options(), "fleet");
    match side.call_raw(req.raw(), 1).await {
        Ok(_) => info!(fleet = %fleet.config.name, "left the fleet"),
        _ => {
            warn!(fleet = %fleet.config.name, "could not leave the fleet; the others drop this instance after fleet.member_ttl_ms")
        }
    }
}

/// One round: report, read the others, apply this instance's part.
async fn sync(fleet: &Fleet, limiter: &Limiter, cluster: &Cluster, round: &mut Round) -> Result<(), String> {
    let seen: Seen = limiter.fleet_seen();
    let now = Instant::now();
    let secs = now.duration_since(round.last).as_secs_f64().max(0.001);
    round.last = now;
    let ids: Vec<(Arc<Rule>, String)> = seen.rules.iter().map(|r| (r.clone(), rule_id(r))).collect();
    let members_before = fleet.view.lock().members.max(1) as f64;
    let mut me = Report {
        id: fleet.id.clone(),
        about: fleet.about.clone(),
        digests: Digests { closing: fleet.closing(), ..fleet.digests() },
        since_ms: fleet.since_ms,
        at_ms: unix_ms(),
        ..Report::default()
    };
    let mut counted = HashMap::new();
    for ((_, id), &n) in ids.iter().zip(&seen.demand) {
        let before = round.counted.get(id).copied().unwrap_or(n);
        me.rules.insert(id.clone(), n.saturating_sub(before) as f64 / secs);
        counted.insert(id.clone(), n);
    }
    round.counted = counted;
    // a leased key's demand over a few rounds, not the last one alone: a key of a few
    // requests a second may see none in one round, and is watched all the same
    let mut smoothed = HashMap::new();
    for (ri, key, n) in &seen.leased {
        if let Some((_, id)) = ids.get(*ri) {
            let k = (id.clone(), key.to_vec());
            let now = *n as f64 / secs;
            let d = match round.smoothed.get(&k) {
                Some(was) => was + SMOOTHING * (now - was),
                None => now,
            };
            smoothed.insert(k.clone(), d);
            me.watched.insert(k.clone());
            *me.keys.entry(k).or_default() += d;
        }
    }
    // the keys this report says it watches for the first time: if every other member
    // said so already, this report ends the change-over for them
    let fresh: std::collections::HashSet<(String, Vec<u8>)> =
        smoothed.keys().filter(|k| !round.smoothed.contains_key(*k)).cloned().collect();
    round.smoothed = smoothed;
    for (ri, key, throttles) in &seen.throttled {
        if let Some((r, id)) = ids.get(*ri) {
            // what it was allowed at this instance's part, plus what was refused
            let d = r.spec.rate / members_before + *throttles as f64 / secs;
            let e = me.keys.entry((id.clone(), key.to_vec())).or_default();
            *e = e.max(d);
        }
    }
    let reports = exchange(fleet, cluster, round, &me).await?;
    if std::mem::take(&mut round.failed) {
        // The fleet's master did not answer until now (it failed over, say), so no member
        // could renew its membership, and the script just dropped those whose time ran
        // out: the first to sync again would find itself alone and take the whole rule,
        // the next ones half of it, while the others still keep their parts. Every
        // member syncs again within an interval: the reports are whole at the next one.
        return Ok(());
    }
    let (shares, keys) = plan(&fleet.id, &ids, &reports, fleet.config.max_watched_keys);
    limiter.fleet_apply(&Plan {
        rules: seen.rules.clone(),
        shares,
        leases: keys
            .into_iter()
            .map(|(ri, k, s, settled)| {
                let bucket = fleet.config.bucket(&ids[ri].1, &k);
                let ends = settled && fresh.contains(&(ids[ri].1.clone(), k.clone()));
                (ri, k.into_boxed_slice(), s, bucket, settled, ends)
            })
            .collect(),
        members: reports.len(),
    });
    names(fleet, &me.digests, &reports);
    switching(fleet, &me.digests, &reports);
    let mut v = fleet.view.lock();
    if v.members != reports.len() || v.error.is_some() {
        info!(fleet = %fleet.config.name, members = reports.len(), "fleet membership");
    }
    v.members = reports.len();
    v.synced = Some(now);
    v.error = None;
    v.rules = ids
        .iter()
        .map(|(r, id)| {
            let with: Vec<&Report> = reports.iter().filter(|x| x.rules.contains_key(id)).collect();
            let total = with.iter().map(|x| x.rules[id]).sum();
            (r.spec.name.clone(), (total, me.rules.get(id).copied().unwrap_or(0.0), with.len()))
        })
        .collect();
    let g = crate::metrics::global();
    g.fleet_members.set(reports.len() as f64);
    g.fleet_leased_keys.set(limiter.leased_keys() as f64);
    Ok(())
}

/// The members and the fleet's names, from every member's report: this instance is not
/// ready while its colocation rules differ from the fleet's; users and rate rules that
/// differ are reported (a log line when that changes, a metric) and served.
fn names(fleet: &Fleet, mine: &Digests, reports: &[Report]) {
    let agreed = fleet_digests(reports);
    let differing = mine.differing(&agreed);
    let mut list: Vec<Member> = reports
        .iter()
        .map(|r| Member {
            id: r.id.clone(),
            about: r.about.clone(),
            digests: r.digests.clone(),
            since_ms: r.since_ms,
            at_ms: r.at_ms,
        })
        .collect();
    list.sort_by(|a, b| (a.since_ms, &a.id).cmp(&(b.since_ms, &b.id)));
    let mut v = fleet.view.lock();
    let before = v.fleet_digests.clone();
    let was = mine.differing(&before);
    if differing != was || (before.colocate.is_empty() && !differing.is_empty()) {
        let others: Vec<&str> = list
            .iter()
            .filter(|m| m.id != fleet.id && !m.digests.differing(mine).is_empty())
            .map(|m| m.about.as_str())
            .collect();
        if differing.is_empty() {
            info!(fleet = %fleet.config.name, "colocation rules, users and rate rules agree with the fleet's");
        } else if differing.contains(&"colocate") {
            warn!(fleet = %fleet.config.name, differ = ?differing, mine = %mine.colocate, fleet_rules = %agreed.colocate, members = ?others,
                "this instance's colocation rules differ from the fleet's: not ready until they agree (PROXY FLEET)");
        } else {
            warn!(fleet = %fleet.config.name, differ = ?differing, members = ?others,
                "this instance's users or rate rules differ from the fleet's (served; PROXY FLEET)");
        }
    }
    let g = crate::metrics::global();
    for what in ["colocate", "users", "rules"] {
        g.fleet_differs(what, differing.contains(&what));
    }
    // the fleet's colocation rules, from the earliest member that has them
    let rules = match differing.contains(&"colocate") {
        true => list
            .iter()
            .find(|m| m.digests.colocate == agreed.colocate)
            .and_then(|m| {
                serde_json::from_str::<Vec<crate::services::colocate::RuleConfig>>(&m.digests.colocate_rules).ok()
            })
            .and_then(|specs| crate::services::colocate::compile(&specs).ok())
            .map(Arc::new),
        false => None,
    };
    *fleet.fleet_rules.lock() = rules;
    fleet.set_names_differ(differing.contains(&"colocate"));
    v.fleet_digests = agreed;
    v.list = list;
}

/// A change of colocation rules rolled out instance by instance (`[[colocate_next]]`,
/// docs/fleet.md): once every member knows the next rules (or has them in force), each
/// closes, refusing the keys its rules and the next ones name differently; once every
/// member's report says it closed (or switched), each switches. So no instance serves a
/// key under its new name while another still serves it under the old one. Once closed,
/// an instance waits for every member (one that joins without the next rules holds the
/// switch until it is reloaded with them or leaves), unless no member has switched yet,
/// when a member without the next rules opens the old names again.
fn switching(fleet: &Fleet, mine: &Digests, reports: &[Report]) {
    let next = &mine.next;
    let closing = fleet.closing();
    if next.is_empty() || *next == mine.colocate {
        if closing {
            fleet.set_closing(false);
            info!(fleet = %fleet.config.name, "colocation rules: no change to switch to now; every key is served");
        }
        return;
    }
    let switched = reports.iter().any(|r| r.digests.colocate == *next);
    let know = reports.iter().all(|r| r.digests.next == *next || r.digests.colocate == *next);
    let closed = reports.iter().all(|r| (r.digests.next == *next && r.digests.closing) || r.digests.colocate == *next);
    if closing && closed {
        if let Some(f) = fleet.switcher.get() {
            f();
        }
        fleet.set_closing(false);
        info!(fleet = %fleet.config.name, rules = %next, "colocation rules: every member closed; switched to the next rules");
    } else if !closing && (know || switched) {
        fleet.set_closing(true);
        info!(fleet = %fleet.config.name, rules = %next,
            "colocation rules: every member knows the next rules; closing (the keys they name otherwise are refused until every member has closed)");
    } else if closing && !know && !switched {
        fleet.set_closing(false);
        let without: Vec<&str> = reports
            .iter()
            .filter(|r| r.digests.next != *next && r.digests.colocate != *next)
            .map(|r| r.about.as_str())
            .collect();
        info!(fleet = %fleet.config.name, members = ?without, "colocation rules: members without the next rules; not switching yet, every key is served");
    }
}

/// Runs the sync script on the master of the fleet's slot; every member's report.
async fn exchange(fleet: &Fleet, cluster: &Cluster, round: &mut Round, me: &Report) -> Result<Vec<Report>, String> {
    let (reports, members) = fleet.config.keys();
    let link = link_to_master(fleet, cluster, &mut round.link, "fleet")?;
    let ttl = fleet.config.member_ttl_ms.to_string();
    let body = me.encode();
    let req = Request::from_args(&["EVAL", SYNC, "2", &reports, &members, &fleet.id, &ttl, &body]);
    let reply =
        link.call_raw(req.raw(), 1).await.map_err(|e| format!("{}: {e}", link.addr()))?.pop().unwrap_or_default();
    match Value::parse(&reply) {
        Ok((Value::Array(v), _)) => Ok(v
            .chunks(2)
            .filter_map(|p| {
                let id = String::from_utf8_lossy(p.first()?.as_bytes()?);
                Some(Report::decode(&id, &String::from_utf8_lossy(p.get(1)?.as_bytes()?)))
            })
            .collect()),
        _ => Err(refused(cluster, link, &reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::CommandTable;
    use crate::services::ratelimit::{CommandsSpec, RuleConfig, compile};

    fn rules(scope: &str) -> Vec<(Arc<Rule>, String)> {
        let cfg = RuleConfig {
            name: "r".into(),
            pattern: "*".into(),
            commands: CommandsSpec::default(),
            rate: 1000.0,
            burst: 100,
            scope: scope.into(),
            count_cached: false,
        };
        compile(&[cfg], &CommandTable::new()).unwrap().into_iter().map(|r| (r.clone(), rule_id(&r))).collect()
    }

    fn report(id: &str, rule: &str, demand: f64, keys: &[(&str, f64)]) -> Report {
        Report {
            id: id.into(),
            about: format!("127.0.0.1:1 {id}"),
            rules: [(rule.to_string(), demand)].into(),
            keys: keys.iter().map(|(k, d)| ((rule.to_string(), k.as_bytes().to_vec()), *d)).collect(),
            ..Report::default()
        }
    }

    #[test]
    fn reports_survive_their_encoding() {
        let mut r = report("a", "7275", 12.5, &[("k\u{0}ey \n", 3.25)]);
        r.digests = Digests {
            colocate: "c1".into(),
            users: "u1".into(),
            rules: "r1".into(),
            colocate_rules: r#"[{"name":"rq","keys":["rq:*"],"tag":"rq"}]"#.into(),
            next: "n1".into(),
            closing: true,
        };
        (r.since_ms, r.at_ms) = (1_700_000_000_000, 1_700_000_000_500);
        assert_eq!(Report::decode("a", &r.encode()), r);
    }

    /// A member's report for the switch: its rules in force, its next ones, closed or not.
    fn at(id: &str, colocate: &str, next: &str, closing: bool) -> Report {
        Report {
            id: id.into(),
            digests: Digests { colocate: colocate.into(), next: next.into(), closing, ..Digests::default() },
            ..Report::default()
        }
    }

    #[test]
    fn a_fleet_switches_its_colocation_rules_only_once_every_member_has_closed() {
        let fleet = Fleet::new(FleetConfig { name: "f".into(), ..FleetConfig::default() }, "x");
        let switched = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let s = switched.clone();
        fleet.set_switcher(move || {
            s.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        let me = |closing| at("a", "old", "new", closing);
        let count = || switched.load(std::sync::atomic::Ordering::Relaxed);
        // another member does not know the next rules: every key is served
        switching(&fleet, &me(false).digests, &[me(false), at("b", "old", "", false)]);
        assert!(!fleet.closing());
        // every member knows them: closing (not switching yet)
        switching(&fleet, &me(false).digests, &[me(false), at("b", "old", "new", false)]);
        assert!(fleet.closing() && count() == 0);
        // the other has not closed yet: still closing
        switching(&fleet, &me(true).digests, &[me(true), at("b", "old", "new", false)]);
        assert!(fleet.closing() && count() == 0);
        // a member joins without them before anyone switched: open again
        let joined = [me(true), at("b", "old", "new", true), at("c", "old", "", false)];
        switching(&fleet, &me(true).digests, &joined);
        assert!(!fleet.closing() && count() == 0);
        // it is reloaded with them; everyone closes, then every report says closed: switch
        switching(&fleet, &me(false).digests, &[me(false), at("b", "old", "new", true), at("c", "old", "new", false)]);
        assert!(fleet.closing());
        switching(&fleet, &me(true).digests, &[me(true), at("b", "old", "new", true), at("c", "old", "new", true)]);
        assert!(!fleet.closing() && count() == 1);
        // a member that restarts with the old rules and the next ones, after the others
        // switched, closes at once and switches once its own report says closed, even
        // with a member without the next rules around (it holds no one back: the
        // others switched)
        let fleet = Fleet::new(FleetConfig { name: "f".into(), ..FleetConfig::default() }, "y");
        fleet.set_switcher(|| {});
        switching(&fleet, &me(false).digests, &[me(false), at("b", "new", "new", false), at("c", "old", "", false)]);
        assert!(fleet.closing());
        switching(&fleet, &me(true).digests, &[me(true), at("b", "new", "new", false), at("c", "old", "", false)]);
        assert!(fleet.closing(), "c neither closed nor switched");
        switching(&fleet, &me(true).digests, &[me(true), at("b", "new", "", false), at("c", "new", "", false)]);
        assert!(!fleet.closing());
    }

    fn named(id: &str, since_ms: u64, colocate: &str) -> Report {
        Report {
            id: id.into(),
            since_ms,
            digests: Digests { colocate: colocate.into(), users: "u".into(), rules: "r".into(), ..Digests::default() },
            ..Report::default()
        }
    }

    #[test]
    fn the_fleets_names_are_the_most_members_then_the_earliest_joined() {
        // two against one: the two
        let reports = [named("a", 30, "x"), named("b", 10, "y"), named("c", 20, "x")];
        assert_eq!(fleet_digests(&reports).colocate, "x");
        // one each: the earliest joined
        let reports = [named("a", 30, "x"), named("b", 10, "y")];
        assert_eq!(fleet_digests(&reports).colocate, "y");
        // a member with no digests (an older version) is not counted
        let reports = [named("a", 30, "x"), named("b", 10, "")];
        assert_eq!(fleet_digests(&reports).colocate, "x");
        let mine = Digests { colocate: "y".into(), users: "u".into(), rules: "other".into(), ..Digests::default() };
        assert_eq!(mine.differing(&fleet_digests(&reports)), vec!["colocate", "rules"]);
        // nothing known yet: nothing differs
        assert!(mine.differing(&Digests::default()).is_empty());
    }

    #[test]
    fn shares_follow_demand_and_add_up() {
        let rs = rules("per-key");
        let id = &rs[0].1;
        let reports = [
            report("a", id, 2800.0, &[("hot", 2800.0), ("cold", 10.0)]),
            report("b", id, 800.0, &[("hot", 800.0)]),
            report("c", id, 400.0, &[("hot", 400.0)]),
        ];
        let mut total = 0.0;
        for me in ["a", "b", "c"] {
            let (shares, keys) = plan(me, &rs, &reports, 100);
            assert!((shares[0] - 1.0 / 3.0).abs() < 1e-9, "a per-key rule's keys without a lease get 1/N");
            assert_eq!(keys.len(), 1, "cold is under half of 1/N of the rate: no lease ({keys:?})");
            total += keys[0].2;
            if me == "a" {
                assert!((keys[0].2 - 0.70).abs() < 0.01, "{keys:?}");
            }
        }
        assert!((total - 1.0).abs() < 1e-9, "shares add up to one: {total}");
        // an instance with no demand keeps a floor; alone, all of it
        let (_, keys) = plan("d", &rs, &[reports[0].clone(), report("d", id, 0.0, &[])], 100);
        assert!(keys[0].2 > 0.0 && keys[0].2 < 0.01, "{keys:?}");
        let (shares, keys) = plan("a", &rs, &reports[..1], 100);
        assert_eq!((shares[0], keys[0].2), (1.0, 1.0));
        // at most max_keys, the most demanded first
        let (_, keys) = plan("a", &rs, &[report("a", id, 0.0, &[("x", 600.0), ("y", 900.0)])], 1);
        assert_eq!(keys[0].1, b"y");
    }

    #[test]
    fn a_key_settles_once_every_member_with_its_rule_says_it_watches_it() {
        let rs = rules("per-key");
        let id = &rs[0].1;
        let watching = |mut r: Report, keys: &[&str]| {
            r.watched = keys.iter().map(|k| (id.to_string(), k.as_bytes().to_vec())).collect();
            r
        };
        let a = report("a", id, 900.0, &[("hot", 900.0)]);
        let b = report("b", id, 100.0, &[("hot", 100.0)]);
        let other = report("c", "other", 50.0, &[]);
        let settled = |reports: &[Report]| plan("a", &rs, reports, 10).1[0].3;
        // newly watched: nobody said so yet, then one member of two
        assert!(!settled(&[a.clone(), b.clone(), other.clone()]));
        assert!(!settled(&[watching(a.clone(), &["hot"]), b.clone(), other.clone()]));
        // every member with the rule (c has another rule, and counts not)
        assert!(settled(&[watching(a.clone(), &["hot"]), watching(b.clone(), &["hot"]), other.clone()]));
        // a member that joins draws on its part until it watches the key too
        let d = report("d", id, 0.0, &[]);
        assert!(!settled(&[watching(a.clone(), &["hot"]), watching(b.clone(), &["hot"]), d]));
        // the mark survives the report's encoding
        let r = watching(a, &["hot"]);
        assert_eq!(Report::decode("a", &r.encode()).watched, r.watched);
    }

    #[test]
    fn a_shared_rule_divides_by_demand_and_other_rules_are_not_shared() {
        let rs = rules("shared");
        let id = &rs[0].1;
        let reports = [report("a", id, 300.0, &[]), report("b", id, 100.0, &[]), report("c", "other", 500.0, &[])];
        let (shares, _) = plan("a", &rs, &reports, 10);
        assert!((shares[0] - 310.0 / 420.0).abs() < 1e-9, "{shares:?}");
    }

    #[test]
    fn settings_are_checked() {
        let bad = FleetConfig { name: "a{b}".into(), sync_interval_ms: 10, member_ttl_ms: 15, max_watched_keys: 0 };
        assert_eq!(bad.problems().len(), 3);
        assert!(FleetConfig::default().problems().is_empty());
        let (reports, members) = FleetConfig { name: "shop".into(), ..Default::default() }.keys();
        assert_eq!(reports, "{heatshield:shop}:reports");
        // no client may touch them
        assert!(crate::command::reserved(reports.as_bytes()) && crate::command::reserved(members.as_bytes()));
    }
}
