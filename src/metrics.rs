//! Metrics: every name heatshield exports (docs/metrics.md lists them), the handles bound
//! once per command and per node so the hot path only increments, and the Prometheus
//! recorder (metrics-exporter-prometheus), whose text `front::http` serves on `/metrics`
//! beside the health endpoints.
//!
//! Without an installed recorder (unit tests, `[metrics] listen = "off"`) every handle is a
//! no-op. Labels are bounded: command names from the command table, node addresses, and
//! fixed words; never a key or a client address.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Histogram buckets for every latency, in seconds.
pub const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global recorder; [`render`] gives its text. Must be called from inside a
/// tokio runtime that lives as long as the process serves (it runs the recorder's upkeep
/// there every second, so recorded samples do not pile up).
pub fn install() -> Result<(), String> {
    let handle = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let _ = HANDLE.set(handle);
    describe();
    gauge!("heatshield_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(())
}

/// The metrics in Prometheus's text format (empty before [`install`]).
pub fn render() -> String {
    HANDLE.get().map(PrometheusHandle::render).unwrap_or_default()
}

/// HELP texts (docs/metrics.md says the same at more length).
fn describe() {
    describe_gauge!("heatshield_build_info", "heatshield's version (always 1).");
    describe_gauge!("heatshield_uptime_seconds", Unit::Seconds, "Seconds since heatshield started.");
    describe_counter!(
        "heatshield_commands_total",
        "Commands answered, by command and outcome (ok, error, redirected, throttled, cached)."
    );
    describe_counter!(
        "heatshield_ratelimit_allowed_total",
        "Requests a rate-limit rule counted and let through, by rule."
    );
    describe_counter!("heatshield_ratelimit_throttled_total", "Commands a rate-limit rule refused, by rule.");
    describe_gauge!("heatshield_ratelimit_tracked_keys", "Keys with a rate-limit budget of their own.");
    describe_histogram!(
        "heatshield_command_duration_seconds",
        Unit::Seconds,
        "Command latency as the client sees it: request read to reply written."
    );
    describe_histogram!(
        "heatshield_backend_request_duration_seconds",
        Unit::Seconds,
        "One request to one backend node: sent to reply received."
    );
    describe_counter!(
        "heatshield_backend_errors_total",
        "Backend requests without a reply, by node and kind (connect, lost, timeout)."
    );
    describe_gauge!("heatshield_backend_connections", "Backend connections by node and state (up, connecting, down).");
    describe_gauge!("heatshield_client_connections", "Client connections open now.");
    describe_gauge!("heatshield_blocked_clients", "Clients waiting in a blocking command now.");
    describe_gauge!(
        "heatshield_backend_dedicated_connections",
        "Dedicated backend connections (WATCH, blocking commands), leased and idle, by node."
    );
    describe_counter!(
        "heatshield_tls_handshakes_failed_total",
        "Client TLS handshakes that failed or timed out (a bad or missing client certificate, a plain-text client)."
    );
    describe_counter!("heatshield_tls_reloads_total", "Certificate files reloaded (TLS listener and backend).");
    describe_counter!(
        "heatshield_tls_cert_logins_total",
        "TLS clients whose certificate named a user (tls.auth_clients_user), by result."
    );
    describe_counter!("heatshield_audit_records_total", "Records the audit log wrote.");
    describe_counter!(
        "heatshield_audit_dropped_total",
        "Audit records dropped: the queue full or the file not opening."
    );
    describe_gauge!(
        "heatshield_fleet_members",
        "Heatshields of this one's fleet seen at the last sync, itself included."
    );
    describe_gauge!("heatshield_fleet_watched_keys", "Keys the fleet divides by demand (leases held here).");
    describe_gauge!(
        "heatshield_fleet_sync_age_seconds",
        Unit::Seconds,
        "Seconds since this heatshield last synced with its fleet (parts are kept from then)."
    );
    describe_counter!("heatshield_fleet_syncs_total", "Fleet syncs, by result (ok, error).");
    describe_counter!(
        "heatshield_fleet_token_asks_total",
        "Asks for tokens from the fleet's buckets of watched keys, by result (ok, error)."
    );
    describe_counter!("heatshield_fleet_tokens_taken_total", "Tokens taken from the fleet's buckets of watched keys.");
    describe_gauge!(
        "heatshield_fleet_differs",
        "1 while this heatshield's colocation rules, users or rate rules (what) differ from its fleet's."
    );
    describe_gauge!("heatshield_ratelimit_share", "This heatshield's share of a rate-limit rule (1 alone), by rule.");
    describe_counter!(
        "heatshield_acl_denied_total",
        "Requests and logins refused by ACL, by user and reason (command, key, channel, auth)."
    );
    describe_counter!("heatshield_client_connections_accepted_total", "Client connections accepted.");
    describe_counter!(
        "heatshield_client_connections_rejected_total",
        "Client connections refused at server.max_clients."
    );
    describe_counter!("heatshield_redirections_total", "MOVED and ASK redirections followed, by kind.");
    describe_counter!(
        "heatshield_redirections_refused_total",
        "MOVED and ASK replies naming an address no cluster node announced, passed to the client unfollowed."
    );
    describe_counter!(
        "heatshield_requests_expired_total",
        "Requests answered with an error because no reply came within the reply deadline."
    );
    describe_counter!(
        "heatshield_client_disconnects_total",
        "Clients disconnected by their limits, by reason (output_hard, output_soft, output_total, pubsub_hard, pubsub_soft)."
    );
    describe_counter!("heatshield_pubsub_messages_total", "Pub/sub messages delivered to subscribed clients.");
    describe_counter!(
        "heatshield_pubsub_resubscribes_total",
        "Shard channels subscribed again on a new owner after Redis moved or refused them."
    );
    describe_counter!(
        "heatshield_retries_total",
        "Requests completed another way after a cluster state change, by reason (tryagain_per_key, readonly, function_loaded)."
    );
    describe_counter!(
        "heatshield_script_detours_total",
        "Requests sent on a dedicated connection because a long-running script held their shared one."
    );
    describe_counter!("heatshield_replica_reads_total", "Reads sent to a replica by a read policy.");
    describe_counter!(
        "heatshield_replica_fallbacks_total",
        "Reads a policy would send to a replica that went to the master, by reason (lag, own_write, failed)."
    );
    describe_gauge!(
        "heatshield_replica_lag_seconds",
        "How far behind its master each replica that serves reads is (-1: down or unknown)."
    );
    describe_counter!(
        "heatshield_cache_stale_answers_total",
        "Reads answered with a stale cached value while their master could not answer."
    );
    describe_counter!("heatshield_topology_refreshes_total", "Slot-map refreshes, by result (ok, error).");
    describe_gauge!("heatshield_slot_map_epoch", "Version of the current slot map; increases with every change.");
    describe_counter!("heatshield_client_bytes_received_total", Unit::Bytes, "Bytes read from clients.");
    describe_counter!("heatshield_cache_hits_total", "Reads of hot keys answered from the cache.");
    describe_counter!("heatshield_cache_misses_total", "Reads of hot keys the cache could not answer.");
    describe_counter!(
        "heatshield_cache_fills_total",
        "Reads sent to Redis to fill the cache (with CLIENT CACHING yes)."
    );
    describe_counter!(
        "heatshield_cache_fills_coalesced_total",
        "Misses that waited for a fill already in flight instead of reading Redis."
    );
    describe_counter!(
        "heatshield_cache_fills_discarded_total",
        "Fill replies not kept, by reason (raced: an invalidation came first; too_big: over cache.max_entry_bytes)."
    );
    describe_counter!(
        "heatshield_cache_invalidations_total",
        "Cache invalidations by cause (write, tracking, flush, connection, cooled)."
    );
    describe_gauge!("heatshield_cache_hot_keys", "Keys currently detected as hot.");
    describe_gauge!("heatshield_lock_waiters", "LOCK.ACQUIRE ... WAIT requests parked now.");
    describe_gauge!("heatshield_migration_dual_write", "1 while dual-write to the migration target is on, else 0.");
    describe_gauge!("heatshield_migration_cut_over", "1 while the migration target serves (cut over), else 0.");
    describe_gauge!("heatshield_migration_shadow", "1 while requests are shadowed to the migration target, else 0.");
    describe_counter!(
        "heatshield_migration_shadow_total",
        "Requests shadowed to the migration target, by outcome (matched, differed, failed, dropped, skipped)."
    );
    describe_gauge!(
        "heatshield_migration_pending_keys",
        "Keys written under dual-write and not yet copied to the target."
    );
    describe_counter!(
        "heatshield_migration_copies_total",
        "Dual-write's copies by outcome (applied, kept, gone, failed, overflowed)."
    );
    describe_gauge!("heatshield_migration_job_running", "1 while a backfill or verify runs inside this heatshield.");
    describe_gauge!("heatshield_migration_job_keys_done", "Keys the last backfill or verify run here has done.");
    describe_gauge!(
        "heatshield_migration_job_source_keys",
        "Keys of the source when the last backfill or verify began."
    );
    describe_gauge!("heatshield_migration_job_bytes", Unit::Bytes, "Bytes the last backfill run here has copied.");
    describe_gauge!(
        "heatshield_migration_job_slots_done",
        "Slots (of 16384) whose every key the last backfill run here has copied."
    );
    describe_gauge!("heatshield_lock_keepalive_locks", "KEEPALIVE locks heatshield is renewing now.");
    describe_counter!("heatshield_lock_waits_total", "Parked LOCK.ACQUIRE requests by result (acquired, timeout).");
    describe_gauge!("heatshield_cache_entries", "Keys with cached replies.");
    describe_gauge!(
        "heatshield_cache_bytes",
        Unit::Bytes,
        "Bytes the cached replies weigh (cache.max_bytes bounds it)."
    );
    describe_counter!("heatshield_client_bytes_sent_total", Unit::Bytes, "Bytes written to clients.");
}

/// How one answered command ended: the `outcome` label of `heatshield_commands_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandOutcome {
    Ok,
    Error,
    /// Answered after following MOVED/ASK.
    Redirected,
    /// Refused by a rate limit (never sent to Redis).
    Throttled,
    /// Answered from the hot-key cache.
    Cached,
}

/// Handles for one command.
pub struct CommandMetrics {
    ok: Counter,
    error: Counter,
    redirected: Counter,
    throttled: Counter,
    cached: Counter,
    duration: Histogram,
}

impl CommandMetrics {
    fn new(name: &str) -> CommandMetrics {
        let c = |outcome: &'static str| counter!("heatshield_commands_total", "command" => name.to_string(), "outcome" => outcome);
        CommandMetrics {
            ok: c("ok"),
            error: c("error"),
            redirected: c("redirected"),
            throttled: c("throttled"),
            cached: c("cached"),
            duration: histogram!("heatshield_command_duration_seconds", "command" => name.to_string()),
        }
    }

    /// Counts `n` commands that ended alike (a session counts a run of them at once: the
    /// exporter's counters are atomics shared by every worker).
    #[inline]
    pub fn count(&self, outcome: CommandOutcome, n: u64) {
        match outcome {
            CommandOutcome::Ok => self.ok.increment(n),
            CommandOutcome::Error => self.error.increment(n),
            CommandOutcome::Redirected => self.redirected.increment(n),
            CommandOutcome::Throttled => self.throttled.increment(n),
            CommandOutcome::Cached => self.cached.increment(n),
        }
    }

    /// Adds one command's latency to the histogram (one command in
    /// `metrics.latency_sample_every` is timed).
    #[inline]
    pub fn time(&self, took: Duration) {
        self.duration.record(took.as_secs_f64());
    }
}

/// Per-command handles, made on a command's first use (so the exposition lists the
/// commands actually used), indexed by command id.
pub struct CommandsMetrics {
    by_id: Box<[OnceLock<CommandMetrics>]>,
}

impl CommandsMetrics {
    pub fn new(n: usize) -> Self {
        CommandsMetrics { by_id: (0..n).map(|_| OnceLock::new()).collect() }
    }

    #[inline]
    pub fn get(&self, id: usize, name: &str) -> &CommandMetrics {
        self.by_id[id].get_or_init(|| CommandMetrics::new(name))
    }
}

/// Picks one event in `every`, per thread, without shared state: each recorded histogram
/// sample costs the exporter a clock read and a store, which at hundreds of thousands of
/// commands a second is most of the cost of metrics.
/// `stream` keeps independent sequences apart (0: commands, 1: backend requests), so one
/// cannot starve the other.
#[inline]
pub fn sampled(stream: usize, every: u32) -> bool {
    thread_local! {
        static N: [std::cell::Cell<u32>; 2] = const { [std::cell::Cell::new(0), std::cell::Cell::new(0)] };
    }
    N.with(|n| {
        let n = &n[stream & 1];
        let v = n.get() + 1;
        if v >= every {
            n.set(0);
            true
        } else {
            n.set(v);
            false
        }
    })
}

/// Handles for one backend node.
pub struct NodeMetrics {
    pub duration: Histogram,
    /// Time one request in this many (see [`sampled`]).
    pub sample_every: u32,
    pub err_connect: Counter,
    pub err_lost: Counter,
    pub err_timeout: Counter,
    /// Dedicated connections to the node (leased and idle).
    pub dedicated: Gauge,
    /// Shared connections made to the node so far (first ones and those made again after
    /// one was lost): a node restarted at the same address has lost its script cache, so
    /// heatshield's own scripts go whole again after any of them
    /// (`crate::upstream::cluster::NodePool::first_send_of_own_script`). Not exported.
    pub connects: std::sync::atomic::AtomicU64,
}

impl NodeMetrics {
    pub fn new(node: &str, sample_every: u32) -> NodeMetrics {
        let e = |kind: &'static str| counter!("heatshield_backend_errors_total", "node" => node.to_string(), "kind" => kind);
        NodeMetrics {
            duration: histogram!("heatshield_backend_request_duration_seconds", "node" => node.to_string()),
            sample_every,
            err_connect: e("connect"),
            err_lost: e("lost"),
            err_timeout: e("timeout"),
            dedicated: gauge!("heatshield_backend_dedicated_connections", "node" => node.to_string()),
            connects: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

/// Process-wide handles.
pub struct Global {
    pub clients: Gauge,
    pub accepted: Counter,
    pub rejected: Counter,
    pub tls_handshake_failed: Counter,
    /// By [`CertLogin`].
    pub tls_cert_logins: [Counter; 4],
    pub tls_reloads: Counter,
    pub audit_records: Counter,
    pub audit_dropped: Counter,
    pub fleet_members: Gauge,
    pub fleet_leased_keys: Gauge,
    pub fleet_sync_age: Gauge,
    pub fleet_syncs_ok: Counter,
    pub fleet_syncs_failed: Counter,
    pub fleet_token_asks_ok: Counter,
    pub fleet_token_asks_failed: Counter,
    pub fleet_tokens_taken: Counter,
    pub moved: Counter,
    pub ask: Counter,
    pub redirect_refused: Counter,
    /// Multi-key parts split key by key after TRYAGAIN.
    pub tryagain_per_key: Counter,
    /// Writes sent again after READONLY (a failover).
    pub readonly_retried: Counter,
    /// FCALLs run again after their library was loaded where it was missing.
    pub function_loaded: Counter,
    /// Requests sent on a dedicated connection because a script held their shared one.
    pub script_detours: Counter,
    /// Requests answered with an error because no reply came within the deadline.
    pub expired: Counter,
    /// Reads sent to a replica (docs/replicas.md).
    pub replica_reads: Counter,
    /// Reads a policy would send to a replica that went to the master: no replica in
    /// sync (`lag`), the client's own write not yet there (`own_write`), the replica
    /// failed (`failed`).
    pub replica_fallback_lag: Counter,
    pub replica_fallback_own_write: Counter,
    pub replica_fallback_failed: Counter,
    disconnect_output_hard: Counter,
    disconnect_output_soft: Counter,
    disconnect_output_total: Counter,
    disconnect_pubsub_hard: Counter,
    disconnect_pubsub_soft: Counter,
    pub refresh_ok: Counter,
    pub refresh_error: Counter,
    pub slot_map_version: Gauge,
    pub bytes_in: Counter,
    pub bytes_out: Counter,
    pub uptime: Gauge,
    pub ratelimit_keys: Gauge,
    /// Clients waiting in a blocking command.
    pub blocked: Gauge,
}

/// What a client certificate's user name came to (`tls.auth_clients_user`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertLogin {
    /// Logged in as the user it names.
    User,
    /// No such user: the default user.
    Unknown,
    /// The user is disabled: the default user.
    Disabled,
    /// The certificate has no such field: the default user.
    NoField,
}

impl CertLogin {
    pub fn label(self) -> &'static str {
        match self {
            CertLogin::User => "user",
            CertLogin::Unknown => "unknown",
            CertLogin::Disabled => "disabled",
            CertLogin::NoField => "no_field",
        }
    }
}

impl Global {
    pub fn tls_cert_login(&self, r: CertLogin) {
        self.tls_cert_logins[r as usize].increment(1);
    }
}

/// The process-wide handles (bound on first use, after the recorder is installed).
pub fn global() -> &'static Global {
    static G: OnceLock<Global> = OnceLock::new();
    G.get_or_init(|| Global {
        clients: gauge!("heatshield_client_connections"),
        accepted: counter!("heatshield_client_connections_accepted_total"),
        rejected: counter!("heatshield_client_connections_rejected_total"),
        tls_handshake_failed: counter!("heatshield_tls_handshakes_failed_total"),
        tls_cert_logins: [CertLogin::User, CertLogin::Unknown, CertLogin::Disabled, CertLogin::NoField]
            .map(|r| counter!("heatshield_tls_cert_logins_total", "result" => r.label())),
        tls_reloads: counter!("heatshield_tls_reloads_total"),
        audit_records: counter!("heatshield_audit_records_total"),
        audit_dropped: counter!("heatshield_audit_dropped_total"),
        fleet_members: gauge!("heatshield_fleet_members"),
        fleet_leased_keys: gauge!("heatshield_fleet_watched_keys"),
        fleet_sync_age: gauge!("heatshield_fleet_sync_age_seconds"),
        fleet_syncs_ok: counter!("heatshield_fleet_syncs_total", "result" => "ok"),
        fleet_syncs_failed: counter!("heatshield_fleet_syncs_total", "result" => "error"),
        fleet_token_asks_ok: counter!("heatshield_fleet_token_asks_total", "result" => "ok"),
        fleet_token_asks_failed: counter!("heatshield_fleet_token_asks_total", "result" => "error"),
        fleet_tokens_taken: counter!("heatshield_fleet_tokens_taken_total"),
        moved: counter!("heatshield_redirections_total", "kind" => "moved"),
        ask: counter!("heatshield_redirections_total", "kind" => "ask"),
        redirect_refused: counter!("heatshield_redirections_refused_total"),
        tryagain_per_key: counter!("heatshield_retries_total", "reason" => "tryagain_per_key"),
        readonly_retried: counter!("heatshield_retries_total", "reason" => "readonly"),
        function_loaded: counter!("heatshield_retries_total", "reason" => "function_loaded"),
        script_detours: counter!("heatshield_script_detours_total"),
        replica_reads: counter!("heatshield_replica_reads_total"),
        replica_fallback_lag: counter!("heatshield_replica_fallbacks_total", "reason" => "lag"),
        replica_fallback_own_write: counter!("heatshield_replica_fallbacks_total", "reason" => "own_write"),
        replica_fallback_failed: counter!("heatshield_replica_fallbacks_total", "reason" => "failed"),
        expired: counter!("heatshield_requests_expired_total"),
        disconnect_output_hard: counter!("heatshield_client_disconnects_total", "reason" => "output_hard"),
        disconnect_output_soft: counter!("heatshield_client_disconnects_total", "reason" => "output_soft"),
        disconnect_output_total: counter!("heatshield_client_disconnects_total", "reason" => "output_total"),
        disconnect_pubsub_hard: counter!("heatshield_client_disconnects_total", "reason" => "pubsub_hard"),
        disconnect_pubsub_soft: counter!("heatshield_client_disconnects_total", "reason" => "pubsub_soft"),
        refresh_ok: counter!("heatshield_topology_refreshes_total", "result" => "ok"),
        refresh_error: counter!("heatshield_topology_refreshes_total", "result" => "error"),
        slot_map_version: gauge!("heatshield_slot_map_epoch"),
        bytes_in: counter!("heatshield_client_bytes_received_total"),
        bytes_out: counter!("heatshield_client_bytes_sent_total"),
        uptime: gauge!("heatshield_uptime_seconds"),
        blocked: gauge!("heatshield_blocked_clients"),
        ratelimit_keys: gauge!("heatshield_ratelimit_tracked_keys"),
    })
}

impl Global {
    /// Whether this heatshield's `what` (colocate, users, rules) differs from its fleet's.
    pub fn fleet_differs(&self, what: &'static str, differs: bool) {
        metrics::gauge!("heatshield_fleet_differs", "what" => what).set(if differs { 1.0 } else { 0.0 });
    }

    /// Counts a client disconnected by its limits (`reason`: output_hard, output_soft,
    /// output_total).
    pub fn disconnect(&self, reason: &str) {
        match reason {
            "output_hard" => self.disconnect_output_hard.increment(1),
            "output_soft" => self.disconnect_output_soft.increment(1),
            "pubsub_hard" => self.disconnect_pubsub_hard.increment(1),
            "pubsub_soft" => self.disconnect_pubsub_soft.increment(1),
            _ => self.disconnect_output_total.increment(1),
        }
    }
}

/// Sets `heatshield_backend_connections{node,state}` from counted states.
pub fn set_backend_connections(node: &str, up: usize, connecting: usize, down: usize) {
    for (state, n) in [("up", up), ("connecting", connecting), ("down", down)] {
        gauge!("heatshield_backend_connections", "node" => node.to_string(), "state" => state).set(n as f64);
    }
}

/// Adds to a counter that only one thread writes (a per-worker slot): a plain load and
/// store, no read-modify-write instruction on the request path.
#[inline]
pub fn bump(a: &std::sync::atomic::AtomicU64, n: u64) {
    a.store(a.load(std::sync::atomic::Ordering::Relaxed).wrapping_add(n), std::sync::atomic::Ordering::Relaxed);
}

/// A counter that each worker adds to in a slot of its own, on a cache line of its own, so
/// the request path pays a plain load and store ([`bump`]) instead of a read-modify-write
/// on a line every worker shares; read as the sum of the slots. With fewer slots than
/// workers, workers share slots and a count may be lost (never more).
#[derive(Debug, Default)]
pub struct PerWorkerCounter {
    slots: Box<[Slot]>,
}

#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot(std::sync::atomic::AtomicU64);

impl PerWorkerCounter {
    /// At least `slots` slots (rounded up to a power of two, so a worker's slot is found
    /// with a mask, not a division).
    pub fn new(slots: usize) -> PerWorkerCounter {
        PerWorkerCounter { slots: (0..slots.max(1).next_power_of_two()).map(|_| Slot::default()).collect() }
    }

    /// Adds `n` in the current worker's slot.
    #[inline]
    pub fn add(&self, n: u64) {
        if let Some(s) = self.slots.get(crate::worker::current() & self.slots.len().wrapping_sub(1)) {
            bump(&s.0, n);
        }
    }

    pub fn sum(&self) -> u64 {
        self.slots.iter().map(|s| s.0.load(std::sync::atomic::Ordering::Relaxed)).sum()
    }
}

/// An ACL refusal: of `user` (a user that exists, or `(unknown)` for a login as nobody:
/// the label's values are the configured users, never a name a client made up) for
/// `reason` (`command`, `key`, `channel`, `auth`). Not on the request path of anyone
/// allowed.
#[cold]
pub fn acl_denied(user: &str, reason: &'static str) {
    metrics::counter!("heatshield_acl_denied_total", "user" => user.to_string(), "reason" => reason).increment(1);
}

/// Shows `user`'s ACL refusals at 0 from the start (a series appears only once made).
pub fn acl_user(user: &str) {
    for reason in ["command", "key", "channel", "auth"] {
        metrics::counter!("heatshield_acl_denied_total", "user" => user.to_string(), "reason" => reason).increment(0);
    }
}
