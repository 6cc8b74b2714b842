//! The state every session shares: configuration, the command table, the cluster view,
//! the counters and logs, the rate limiter, the hot-key cache and the lock service; and
//! the record of each answered command (statistics, slow log, big-key log).
//!
//! The request path itself reads top-down in the modules above this one: `dispatch`
//! (gates) → `policy` (admission) → `route` (parts) → `pending` (in flight, retries via
//! `retry`) → `merge`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::command::CommandTable;
use crate::config::Config;
use crate::conn::ClientState;
use crate::protocol::Request;
use crate::upstream::cluster::Cluster;

/// What [`Proxy::reply_deadline`] adds to the command timeout: the window in which a
/// failed part is retried ([`crate::upstream::retry`]) and a redirection confirmed.
pub const REPLY_GRACE: Duration = Duration::from_secs(10);

/// What `/ready` looks at besides the slot map (docs/fleet.md).
#[derive(Debug, Default)]
pub struct Health {
    /// A shutdown signal came: not ready, whatever else.
    pub draining: std::sync::atomic::AtomicBool,
    /// Workers accepting clients now.
    pub listening: AtomicUsize,
}

/// Process-wide counters.
#[derive(Debug, Default)]
pub struct Stats {
    pub clients: AtomicUsize,
    pub accepted: AtomicU64,
    pub rejected: AtomicU64,
    /// Commands dispatched (INFO's `total_commands_processed`).
    pub commands: crate::metrics::PerWorkerCounter,
    pub next_client_id: AtomicU64,
    /// Reply bytes all clients hold above their `output_soft_bytes`.
    pub output_over_soft: AtomicU64,
}

/// Shared by every session, its fields grouped by the phase of a request that owns them
/// (the phases: docs/architecture.md, "One way in").
pub struct Proxy {
    // -- Configuration and the process's life (crate::life, crate::reload).
    pub config: Config,
    /// The configuration in force: `config` as started, then as reloads left it
    /// (`crate::reload`; what needs a restart keeps its running value).
    pub current: arc_swap::ArcSwap<Config>,
    /// Settings that `PROXY CONFIG SET` may change.
    pub live: crate::config::Live,
    /// `[limits]` in force, for connections opened from now on (a reload replaces it).
    pub limits: arc_swap::ArcSwap<crate::config::LimitsConfig>,
    /// The file and command-line overrides a reload reads (set at start with --config).
    pub reload_from: std::sync::OnceLock<(std::path::PathBuf, crate::config::Overrides)>,
    pub config_file: Option<String>,
    pub started: Instant,
    /// Number of worker threads.
    pub workers: usize,
    /// `/ready`'s inputs.
    pub health: Health,
    // -- Identify: the command table, what the backends are.
    pub commands: CommandTable,
    /// `redis_version` of the backends, learned at start-up (reported by HELLO and INFO).
    pub redis_version: parking_lot::RwLock<String>,
    /// How many databases every master has (Valkey 9's `cluster-databases`, a standalone
    /// server's `databases`; 1 until learned, see crate::learn): what SELECT accepts.
    pub databases: std::sync::atomic::AtomicU32,
    // -- Admit: who the client is and what it may do (ACL users, failed logins, rate limits and the fleet that divides them).
    /// ACL users (`server.users`, `ACL SETUSER`).
    pub users: crate::services::acl::Users,
    /// Failed logins by client address (`server.auth_failures_per_minute`).
    pub auth_limiter: crate::services::acl::AuthLimiter,
    /// Per-key rate limits.
    pub ratelimit: Arc<crate::services::ratelimit::Limiter>,
    /// Which features' key patterns may see a key, by its first byte (rate limits, read
    /// policies): asked once per request in admission.
    pub features: Arc<crate::glob::KeyFeatures>,
    /// The fleet this heatshield divides the rate-limit rules with (`[fleet]`).
    pub fleet: Arc<crate::services::fleet::Fleet>,
    // -- Name and route: colocation's names, the cluster view, read policies.
    /// Key colocation rules (`[[colocate]]`, `PROXY COLOCATE`).
    pub colocate: Arc<crate::services::colocate::Colocate>,
    pub cluster: Arc<Cluster>,
    /// Read policies: which reads go to replicas (`backend.read_from`).
    pub reads: crate::services::reads::Reads,
    // -- Answer without a node, or through a service: the hot-key cache and tracking clients, locks, scripts, pub/sub.
    /// Hot-key detection and cache.
    pub cache: Arc<crate::services::cache::HotCache>,
    /// CLIENT TRACKING: the keys each tracking client read.
    pub client_side: Arc<crate::services::cache::clients::ClientSide>,
    /// Lock scripts, parked ACQUIREs and KEEPALIVE locks.
    pub locks: Arc<crate::services::locks::Locks>,
    /// Script bodies seen, so EVALSHA runs on any master.
    pub scripts: crate::services::scripts::Scripts,
    /// Subscriptions and their shared backend connections.
    pub pubsub: Arc<crate::services::pubsub::Hub>,
    // -- Record: every connected client, and what each answered command leaves behind.
    /// Every client connected now (CLIENT LIST, KILL, UNBLOCK).
    pub clients: crate::conn::Registry,
    pub stats: Stats,
    /// Per-command statistics for INFO (per worker).
    pub command_stats: crate::services::stats::CommandStats,
    /// Per-command Prometheus handles.
    pub command_metrics: crate::metrics::CommandsMetrics,
    pub slowlog: crate::services::stats::SlowLog,
    pub bigkeys: crate::services::stats::BigKeys,
    /// `HOTKEYS`: the session, if one was started.
    pub hotkeys: crate::services::stats::Hotkeys,
    /// The audit log (`[audit]`).
    pub audit: crate::services::audit::Audit,
    // -- After the answer: a move to another cluster.
    /// Dual-write to the migration target (`[migration]`, `PROXY MIGRATION`).
    pub migration: Arc<crate::services::migration::dual::DualWrite>,
}

/// What statistics need of a reply once it has been written (the reply itself is gone).
#[derive(Debug, Clone, Copy)]
pub struct ReplySummary {
    pub len: usize,
    /// An error reply.
    pub failed: bool,
    /// Refused by the rate limiter.
    pub throttled: bool,
}

/// One answered command, as the session reports it once the reply has been written.
pub struct Answered<'a> {
    /// Command id (statistics).
    pub cmd: usize,
    /// From the request being read to its reply being written.
    pub took: Duration,
    pub reply: ReplySummary,
    /// A MOVED or ASK was followed for it.
    pub redirected: bool,
    /// Answered from the hot-key cache.
    pub cached: bool,
    /// The request as the client sent it (for the slow log, the big-key log and HOTKEYS).
    pub req: Option<&'a Request>,
    /// The argument that is its first key (0: none).
    pub first_key: u32,
    /// The node that served it, when it was noted.
    pub node: Option<&'a str>,
    pub moments: crate::services::stats::Moments,
}

impl ReplySummary {
    pub fn of(reply: &[u8]) -> ReplySummary {
        ReplySummary {
            len: reply.len(),
            failed: matches!(reply.first(), Some(b'-' | b'!')),
            throttled: reply.starts_with(b"-THROTTLED "),
        }
    }
}

/// What the fleet's digests depend on ([`Proxy::fleet_digests_of`]).
pub type DigestsOf =
    (Vec<(u64, Arc<crate::services::acl::User>)>, Arc<Vec<Arc<crate::services::ratelimit::Rule>>>, u64, u64);

/// Whether two [`DigestsOf`] are of the same users, rules and tables.
pub fn same_digests_of(a: &DigestsOf, b: &DigestsOf) -> bool {
    a.0.len() == b.0.len()
        && a.0.iter().zip(&b.0).all(|(x, y)| x.0 == y.0 && Arc::ptr_eq(&x.1, &y.1))
        && Arc::ptr_eq(&a.1, &b.1)
        && (a.2, a.3) == (b.2, b.3)
}

impl Proxy {
    /// The configuration in force (see [`Proxy::current`]).
    pub fn settings(&self) -> Arc<Config> {
        self.current.load_full()
    }

    /// Whether heatshield should be sent new clients (`/ready`): not draining, accepting,
    /// and, in front of a cluster, with a slot map; else why not.
    pub fn ready(&self) -> Result<(), &'static str> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.health.draining.load(Relaxed) {
            return Err("draining");
        }
        if self.health.listening.load(Relaxed) == 0 {
            return Err("not accepting clients");
        }
        if self.cluster.is_cluster() && self.cluster.topology().masters.is_empty() {
            return Err("no slot map");
        }
        if self.fleet.names_differ() {
            return Err("colocation rules differ from the fleet's (PROXY FLEET)");
        }
        Ok(())
    }

    /// This instance's colocation rules, users and rate rules as digests, for its fleet
    /// (crate::services::fleet): instances that agree have equal digests.
    /// What [`Proxy::fleet_digests`] depends on: when it is unchanged, so are they (the
    /// fleet compares them at every sync, and describing users is not cheap).
    /// (The users and rules themselves, not their addresses, which a later value could
    /// reuse.)
    pub fn fleet_digests_of(&self) -> DigestsOf {
        let users = self.users.all().into_iter().map(|u| (u.changes(), u)).collect();
        (users, self.ratelimit.rules(), self.colocate.generation(), self.commands.generation())
    }

    pub fn fleet_digests(&self) -> crate::services::fleet::Digests {
        let sha = |text: &str| sha1_smol::Sha1::from(text).digest().to_string()[..16].to_string();
        let mut users: Vec<String> = self
            .users
            .all()
            .iter()
            .map(|u| format!("user {} {}", u.name, u.perms().describe(&self.commands)))
            .collect();
        users.sort();
        let rules: Vec<String> = self.ratelimit.rules().iter().map(|r| crate::services::fleet::rule_id(r)).collect();
        let colocate = self.colocate.rules();
        let specs: Vec<&crate::services::colocate::RuleConfig> = colocate.list.iter().map(|r| &r.spec).collect();
        crate::services::fleet::Digests {
            colocate_rules: serde_json::to_string(&specs).unwrap_or_default(),
            colocate: colocate.digest(),
            next: self.colocate.next().map(|n| n.digest()).unwrap_or_default(),
            closing: false,
            users: sha(&users.join("\n")),
            rules: sha(&rules.join("\n")),
        }
    }

    pub fn new(config: Config, cluster: Arc<Cluster>, config_file: Option<String>, workers: usize) -> Proxy {
        let commands = CommandTable::new();
        // validated with the configuration, so compiling cannot fail here
        let rules = crate::services::ratelimit::compile(&config.ratelimit.rules, &commands).unwrap_or_default();
        let features = Arc::new(crate::glob::KeyFeatures::default());
        let ratelimit = Arc::new(
            crate::services::ratelimit::Limiter::new(
                rules,
                config.ratelimit.max_tracked_keys,
                Duration::from_millis(config.ratelimit.idle_reclaim_ms),
            )
            .with_features(features.clone()),
        );
        let fleet = crate::services::fleet::Fleet::new(config.fleet.clone(), &config.server.listen);
        // one extra id for requests that match no command
        let ids = commands.count() + 1;
        // (validated with the configuration)
        let colocate = Arc::new(crate::services::colocate::Colocate::new(
            crate::services::colocate::compile(&config.colocate).unwrap_or_default(),
        ));
        colocate.set_next(crate::services::colocate::compile(&config.colocate_next).unwrap_or_default());
        let cache = Arc::new(crate::services::cache::HotCache::new(&config.cache, &commands, colocate.clone()));
        let users = crate::services::acl::Users::from_config(
            &config.server.users,
            config.server.password.as_deref(),
            &commands,
        )
        .unwrap_or_default();
        for u in users.names() {
            crate::metrics::acl_user(&u);
        }
        let b = &config.backend;
        let reads =
            crate::services::reads::Reads::new(b.read_from, b.replica_max_lag_ms, &b.read_rules, b.read_your_writes)
                .with_names(colocate.clone());
        features.set(crate::glob::feature::READS, &reads.key_first());
        Proxy {
            features,
            cache,
            reads,
            locks: Arc::default(),
            pubsub: Arc::new(crate::services::pubsub::Hub::new(cluster.clone(), config.limits.max_subscriptions)),
            client_side: Arc::new(crate::services::cache::clients::ClientSide::new(
                config.limits.tracking_max_keys,
                colocate.clone(),
            )),
            databases: std::sync::atomic::AtomicU32::new(1),
            // (validated with the configuration)
            users,
            auth_limiter: crate::services::acl::AuthLimiter::new(config.server.auth_failures_per_minute),
            scripts: Default::default(),
            colocate,
            clients: Default::default(),
            live: crate::config::Live::new(&config),
            ratelimit,
            fleet,
            health: Health::default(),
            current: arc_swap::ArcSwap::from_pointee(config.clone()),
            limits: arc_swap::ArcSwap::from_pointee(config.limits.clone()),
            reload_from: std::sync::OnceLock::new(),
            command_stats: crate::services::stats::CommandStats::new(workers, ids),
            command_metrics: crate::metrics::CommandsMetrics::new(ids),
            slowlog: Default::default(),
            bigkeys: Default::default(),
            hotkeys: Default::default(),
            audit: crate::services::audit::Audit::start(&config.audit, &commands, {
                let l = &config.server.listen;
                if l == "off" { config.tls.listen.clone().unwrap_or_default() } else { l.clone() }
            }),
            migration: Arc::new(
                crate::services::migration::dual::DualWrite::new(
                    config.migration.configured(),
                    config.migration.phase == "dual-write",
                    config.migration.max_pending,
                )
                .shadowing(config.migration.configured() && config.migration.phase == "shadow"),
            ),
            workers,
            config,
            commands,
            cluster,
            stats: Stats { commands: crate::metrics::PerWorkerCounter::new(workers), ..Stats::default() },
            started: Instant::now(),
            redis_version: parking_lot::RwLock::new("7.0.0".into()),
            config_file,
        }
    }

    /// How long after it was read a request is answered at the latest: its node's
    /// `command_timeout_ms` plus the window in which a failed part is retried
    /// (`MAX_RETRIES` × `RETRY_DELAY`) and a redirection confirmed. A request still
    /// waiting then is answered with [`errors::expired`](crate::errors::expired).
    pub fn reply_deadline(&self) -> Duration {
        Duration::from_millis(self.config.backend.command_timeout_ms) + REPLY_GRACE
    }

    /// The id used for requests that match no command.
    pub fn unknown_id(&self) -> usize {
        self.commands.count()
    }

    /// The metric/statistics name of command `id`.
    pub fn command_name(&self, id: usize) -> &str {
        if id < self.commands.count() { self.commands.name_of(id) } else { "unknown" }
    }

    /// Records one answered command (called when its reply has been written), all but its
    /// count in `heatshield_commands_total`: the outcome to count is returned, for the
    /// caller to count a run of alike commands at once with [`Proxy::count`].
    pub fn observe(&self, client: &ClientState, a: Answered) -> crate::metrics::CommandOutcome {
        let Answered { cmd, took, reply, redirected, cached, req, first_key, node, moments } = a;
        let failed = reply.failed;
        let outcome = if reply.throttled {
            crate::metrics::CommandOutcome::Throttled
        } else if cached {
            crate::metrics::CommandOutcome::Cached
        } else if failed {
            crate::metrics::CommandOutcome::Error
        } else if redirected {
            crate::metrics::CommandOutcome::Redirected
        } else {
            crate::metrics::CommandOutcome::Ok
        };
        if crate::metrics::sampled(0, self.config.metrics.latency_sample_every) {
            self.command_metrics.get(cmd, self.command_name(cmd)).time(took);
        }
        self.command_stats.record(crate::worker::current(), cmd, took, failed);
        let Some(req) = req else { return outcome };
        if took.as_micros() as u64 >= self.live.slowlog_slower_than_us.load(Ordering::Relaxed) {
            let name: String = client
                .info
                .names
                .lock()
                .name
                .as_deref()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .unwrap_or_default();
            self.slowlog.record(
                self.live.slowlog_max_len.load(Ordering::Relaxed),
                took,
                req,
                &client.info.addr,
                &name,
                node.unwrap_or(""),
                moments.stages(),
            );
        }
        let big = self.live.bigkey_bytes.load(Ordering::Relaxed);
        let size = req.raw().len() as u64;
        if self.hotkeys.active() {
            // (one name per key, however it was sent: a stored name counts as its client's)
            let key = (first_key > 0).then(|| self.colocate.client_key(req.arg(first_key as usize)));
            self.hotkeys.observe(key, size + reply.len as u64, took);
        }
        if first_key > 0 && (size >= big || reply.len as u64 >= big) {
            let key = bytes::Bytes::copy_from_slice(self.colocate.client_key(req.arg(first_key as usize)));
            let name = self.command_name(cmd);
            let max = self.config.admin.bigkeys_max_len;
            if size >= big {
                self.bigkeys.record(max, &key, name, "request", size);
            }
            if reply.len as u64 >= big {
                self.bigkeys.record(max, &key, name, "reply", reply.len as u64);
            }
        }
        outcome
    }

    /// Counts `n` answered commands `cmd` that ended in `outcome`.
    #[inline]
    pub fn count(&self, cmd: usize, outcome: crate::metrics::CommandOutcome, n: u64) {
        self.command_metrics.get(cmd, self.command_name(cmd)).count(outcome, n);
    }
}
