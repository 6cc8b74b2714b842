//! Configuration: the TOML file (conf/heatshield.toml documents every key), command-line
//! overrides, defaults, and validation that reports every problem at once, naming the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::upstream::cluster::Backing;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub tls: TlsConfig,
    pub backend: BackendConfig,
    pub limits: LimitsConfig,
    pub metrics: MetricsConfig,
    pub admin: AdminConfig,
    pub transactions: TransactionsConfig,
    pub ratelimit: crate::services::ratelimit::RateLimitConfig,
    pub cache: crate::services::cache::CacheConfig,
    /// `[fleet]`: heatshields that divide the rate-limit rules between them (docs/fleet.md).
    pub fleet: crate::services::fleet::FleetConfig,
    /// `[[colocate]]`: key colocation rules (docs/colocation.md).
    pub colocate: Vec<crate::services::colocate::RuleConfig>,
    /// `[[colocate_next]]`: the colocation rules this instance switches to together with
    /// the rest of its fleet (docs/fleet.md, "Changing colocation rules in a running
    /// fleet"). Empty: none.
    pub colocate_next: Vec<crate::services::colocate::RuleConfig>,
    /// `[audit]`: the audit log (docs/audit.md).
    pub audit: crate::services::audit::AuditConfig,
    /// `[migration]`: a cluster to move the data to (docs/migration.md).
    pub migration: crate::services::migration::MigrationConfig,
}

/// Every key of a configuration as `section.key` with its value, made from the structs
/// themselves (serde), so that no list of keys is kept by hand: `PROXY CONFIG GET` shows
/// these, and a test holds them against `conf/heatshield.toml` and the README's table.
/// Values are text: lists joined with ",", an unset value as "". The rate-limit rules
/// (`ratelimit.rules`, an array of tables) and the colocation rules (`colocate`) are listed
/// by key only, with no value: `PROXY RATELIMIT LIST` and `PROXY COLOCATE LIST` show them.
pub fn entries(c: &Config) -> Vec<(String, Option<String>)> {
    fn text(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::Null => String::new(),
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(a) => a.iter().map(text).collect::<Vec<_>>().join(","),
            // as Rust prints them: 1000, not 1000.0
            serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => u.to_string(),
                (_, Some(i), _) => i.to_string(),
                (_, _, Some(f)) => f.to_string(),
                _ => n.to_string(),
            },
            other => other.to_string(),
        }
    }
    let mut out = Vec::new();
    // the structs are plain data: serializing them cannot fail
    let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(c) else { return out };
    for (section, table) in sections {
        // an array of tables at the top (`[[colocate]]`): listed by name, as the rules are
        if let serde_json::Value::Array(_) = table {
            out.push((section, None));
            continue;
        }
        let serde_json::Value::Object(keys) = table else { continue };
        for (key, v) in keys {
            let tables = matches!(&v, serde_json::Value::Array(a) if a.iter().all(|x| x.is_object()) && key == "rules");
            out.push((format!("{section}.{key}"), (!tables).then(|| text(&v))));
        }
    }
    out.sort();
    out
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address of the HTTP listener serving `/metrics`, or "off".
    pub listen: String,
    /// Latency histograms time one command (and one backend request) in this many; the
    /// counters count every one. 1 times every command.
    pub latency_sample_every: u32,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { listen: "127.0.0.1:9180".into(), latency_sample_every: 8 }
    }
}

/// `[transactions]`: MULTI / EXEC through the proxy (docs/transactions.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransactionsConfig {
    /// A transaction whose keys span slots: `"refuse"` (CROSSSLOT at queue time, as Redis
    /// Cluster does) or `"per-node"` (one native transaction per slot, each atomic, not
    /// together).
    pub cross_slot: String,
}

impl Default for TransactionsConfig {
    fn default() -> Self {
        TransactionsConfig { cross_slot: "refuse".into() }
    }
}

impl TransactionsConfig {
    /// `cross_slot = "per-node"`.
    pub fn per_node(&self) -> bool {
        self.cross_slot == "per-node"
    }
}

/// `[admin]`: the `PROXY ...` commands, the slow log and the big-key log.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Whether `PROXY ...` commands are answered at all.
    pub enabled: bool,
    /// When set, a connection must send `PROXY AUTH <password>` before other PROXY commands.
    pub password: Option<String>,
    /// Commands slower than this (microseconds, as the client sees them) enter the slow log.
    pub slowlog_slower_than_us: u64,
    /// Entries the slow log keeps.
    pub slowlog_max_len: usize,
    /// Requests and replies at least this large (bytes) enter the big-key log.
    pub bigkey_bytes: u64,
    /// Entries the big-key log keeps (the largest).
    pub bigkeys_max_len: usize,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            enabled: true,
            password: None,
            slowlog_slower_than_us: 10_000,
            slowlog_max_len: 128,
            bigkey_bytes: 64 * 1024,
            bigkeys_max_len: 64,
        }
    }
}

/// `[server]`: the client-facing side.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on for Redis clients.
    pub listen: String,
    /// Worker threads (each a single-threaded runtime with its own listener and backend
    /// connections); 0 means one per CPU core but one (at least one).
    pub threads: usize,
    /// Client connections beyond this are refused with an error reply.
    pub max_clients: usize,
    /// When set, clients must AUTH with this password first (the `default` user's).
    pub password: Option<String>,
    /// ACL users, each `name rule ...` in Redis's ACL syntax (as `ACL SETUSER` takes
    /// them; docs/acl.md); a line for `default` changes the default user.
    pub users: Vec<String>,
    /// Failed AUTH / HELLO AUTH a client address may make a minute (a bucket of this
    /// many, refilled over a minute); past it, logins from it are refused unchecked
    /// until the bucket refills. 0: no limit. Per heatshield (docs/acl.md).
    pub auth_failures_per_minute: u32,
    /// Allow FLUSHALL / FLUSHDB, which are sent to every master.
    pub allow_flush: bool,
    /// On shutdown, how long in-flight replies may take before connections are closed.
    pub shutdown_timeout_ms: u64,
    /// After SIGTERM, how long new connections are still accepted (with `/ready` already
    /// answering 503, so that a load balancer stops sending them) before the listener
    /// closes.
    pub drain_grace_ms: u64,
    /// `HOST:PORT` heatshield gives cluster-aware clients as the one node of its cluster
    /// (`CLUSTER SLOTS`, ...); unset: the address each client connected to.
    pub announce: Option<String>,
    /// Start by taking the listening sockets of the heatshield serving these addresses
    /// (through `handoff_socket`), which then drains: a restart that refuses no client.
    pub takeover: bool,
    /// The Unix socket through which this heatshield hands its listeners to one started
    /// with `--takeover`; empty: `heatshield-<listen address>.sock` in the temporary
    /// directory; "off": none.
    pub handoff_socket: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:6380".into(),
            threads: 0,
            max_clients: 10_000,
            password: None,
            users: vec![],
            auth_failures_per_minute: 30,
            allow_flush: false,
            shutdown_timeout_ms: 5_000,
            drain_grace_ms: 0,
            announce: None,
            takeover: false,
            handoff_socket: String::new(),
        }
    }
}

/// `[tls]`: the client-facing TLS listener (docs/tls.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Address of the TLS listener (Redis's `tls-port`); unset: none. Beside
    /// `server.listen`, or alone with `server.listen = "off"`.
    pub listen: Option<String>,
    /// The certificate chain heatshield presents (PEM).
    pub cert_file: Option<String>,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<String>,
    /// The CA that client certificates must be signed by (PEM).
    pub ca_cert_file: Option<String>,
    /// Client certificates (Redis's `tls-auth-clients`): "yes" (required), "optional"
    /// (verified when given), "no". Unset: "yes" when `ca_cert_file` is set, else "no".
    pub auth_clients: Option<String>,
    /// Which field of a verified client certificate names the client's ACL user, who is
    /// then logged in without AUTH (Valkey's `tls-auth-clients-user`): "off", "CN" (the
    /// subject's common name) or "URI" (the first URI subject alternative name). A field
    /// that names no enabled user leaves the connection the default user's.
    pub auth_clients_user: String,
    /// A client whose handshake has not finished in this long is disconnected.
    pub handshake_timeout_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            listen: None,
            cert_file: None,
            key_file: None,
            ca_cert_file: None,
            auth_clients: None,
            auth_clients_user: "off".into(),
            handshake_timeout_ms: 10_000,
        }
    }
}

impl TlsConfig {
    /// "yes", "optional" or "no", defaults applied.
    pub fn auth_clients(&self) -> &str {
        match (&self.auth_clients, &self.ca_cert_file) {
            (Some(a), _) => a,
            (None, Some(_)) => "yes",
            (None, None) => "no",
        }
    }

    /// The certificate field that names a client's user, unless "off" (after validation).
    pub fn cert_user(&self) -> Option<crate::tls::CertUser> {
        match self.auth_clients_user.to_ascii_lowercase().as_str() {
            "cn" => Some(crate::tls::CertUser::Cn),
            "uri" => Some(crate::tls::CertUser::Uri),
            _ => None,
        }
    }

    /// The listener's files, when it is configured (after validation).
    pub fn files(&self) -> Option<crate::tls::ServerFiles> {
        self.listen.as_ref()?;
        let auth = self.auth_clients();
        Some(crate::tls::ServerFiles {
            cert: self.cert_file.clone()?.into(),
            key: self.key_file.clone()?.into(),
            client_ca: if auth == "no" { None } else { self.ca_cert_file.clone().map(Into::into) },
            client_cert_optional: auth == "optional",
        })
    }
}

/// `[backend]`: the Redis servers behind the proxy.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    /// "cluster" or "standalone".
    pub mode: String,
    /// Cluster seed nodes, HOST:PORT.
    pub seeds: Vec<String>,
    /// The server in standalone mode, HOST:PORT.
    pub address: Option<String>,
    /// Pipelined connections per backend node (per worker and protocol), shared by that
    /// worker's clients. One by default: a worker is one thread, so a second connection
    /// adds no parallelism, only smaller batches (more system calls and wake-ups a request).
    pub connections_per_node: usize,
    pub connect_timeout_ms: u64,
    /// A backend that does not reply within this long is treated as failed.
    pub command_timeout_ms: u64,
    /// How often the slot map is re-read even when nothing looks wrong.
    pub refresh_interval_ms: u64,
    /// Credentials for the backend (ACL user and password, or password only).
    pub username: Option<String>,
    pub password: Option<String>,
    /// Dedicated connections (for WATCH and blocking commands, one client each) one node
    /// may have at once, leased and idle together.
    pub dedicated_max_per_node: usize,
    /// Idle dedicated connections kept per node (and protocol) for the next lessee.
    pub dedicated_idle_per_node: usize,
    /// Milliseconds a shared connection holds its write when its node has nothing in
    /// flight (asleep), so that one wake-up serves every client that sends meanwhile:
    /// latency traded for the masters' CPU (docs/design/performance.md). 0: never held.
    pub flush_delay_ms: u64,
    /// TLS to every node (seeds, announced masters and replicas, every connection).
    pub tls: bool,
    /// The CA the nodes' certificates must be signed by (PEM); required with `tls`.
    pub tls_ca_cert_file: Option<String>,
    /// A client certificate and key for nodes that ask for one (`tls-auth-clients`).
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    /// The name every node's certificate must carry; unset: the address's IP (or host
    /// name), as the cluster announces it.
    pub tls_server_name: Option<String>,
    /// Where read-only commands go (docs/replicas.md): "master", "prefer-replica",
    /// "replica" or "any".
    pub read_from: crate::services::reads::ReadFrom,
    /// A replica further behind its master than this is not read.
    pub replica_max_lag_ms: u64,
    /// How often each replica's lag is measured.
    pub replica_check_interval_ms: u64,
    /// A client's reads go to a replica only once its last write is there.
    pub read_your_writes: bool,
    /// Read policies per key pattern (`[[backend.read_rules]]`), the first match deciding.
    pub read_rules: Vec<crate::services::reads::ReadRule>,
}

impl BackendConfig {
    /// The files and name of TLS to the nodes, when `tls` is on (after validation).
    pub fn tls_files(&self) -> Option<crate::tls::ClientFiles> {
        if !self.tls {
            return None;
        }
        Some(crate::tls::ClientFiles {
            ca: self.tls_ca_cert_file.clone()?.into(),
            cert: self.tls_cert_file.clone().map(Into::into),
            key: self.tls_key_file.clone().map(Into::into),
            server_name: self.tls_server_name.clone(),
        })
    }
}

/// The longest `backend.flush_delay_ms`: a hold is meant to gather one turn of the
/// clients' requests, and every request to an idle node waits it out.
pub const MAX_FLUSH_DELAY_MS: u64 = 100;

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            mode: "cluster".into(),
            seeds: vec![],
            address: None,
            connections_per_node: 1,
            connect_timeout_ms: 1_000,
            command_timeout_ms: 5_000,
            refresh_interval_ms: 5_000,
            username: None,
            password: None,
            dedicated_max_per_node: 4096,
            dedicated_idle_per_node: 16,
            flush_delay_ms: 0,
            tls: false,
            tls_ca_cert_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_server_name: None,
            read_from: Default::default(),
            replica_max_lag_ms: 1_000,
            replica_check_interval_ms: 100,
            read_your_writes: true,
            read_rules: vec![],
        }
    }
}

/// `[limits]`: protection against oversized or runaway clients.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest request accepted (and so largest bulk string), in bytes. Redis: 512 MiB.
    pub max_request_bytes: u64,
    /// Commands one client may have in flight before the proxy stops reading from it.
    pub max_pipeline: usize,
    /// Bytes of requests one client may have read and not yet answered before the proxy
    /// stops reading from it (a single larger request still goes through).
    pub max_inflight_request_bytes: u64,
    /// Reply bytes held for one client above which the proxy stops reading its requests.
    pub output_soft_bytes: u64,
    /// A client held above `output_soft_bytes` this long is disconnected (0: never).
    pub output_soft_seconds: u64,
    /// A client for which the proxy would hold more reply bytes is disconnected at once.
    pub output_hard_bytes: u64,
    /// All clients together may hold at most this many reply bytes above their
    /// `output_soft_bytes`; a client whose replies would go past it is disconnected.
    pub output_total_over_soft_bytes: u64,
    /// The same three limits for a client with subscriptions (Redis's
    /// `client-output-buffer-limit pubsub 32mb 8mb 60`): messages it does not read pile
    /// up here, and past them it is disconnected, alone.
    pub pubsub_output_soft_bytes: u64,
    pub pubsub_output_soft_seconds: u64,
    pub pubsub_output_hard_bytes: u64,
    /// Keys heatshield remembers for clients with CLIENT TRACKING on (Redis's
    /// `tracking-table-max-keys`); past it, keys are invalidated to make room.
    pub tracking_max_keys: usize,
    /// Subscriptions (client, channel/pattern/shard channel) all clients together may
    /// hold; a SUBSCRIBE past it is refused.
    pub max_subscriptions: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_bytes: 512 * 1024 * 1024,
            max_pipeline: 1024,
            max_inflight_request_bytes: 32 * 1024 * 1024,
            output_soft_bytes: 256 * 1024,
            output_soft_seconds: 30,
            output_hard_bytes: 64 * 1024 * 1024,
            output_total_over_soft_bytes: 1024 * 1024 * 1024,
            pubsub_output_soft_bytes: 8 * 1024 * 1024,
            pubsub_output_soft_seconds: 60,
            pubsub_output_hard_bytes: 32 * 1024 * 1024,
            tracking_max_keys: 1_000_000,
            max_subscriptions: 1_000_000,
        }
    }
}

/// Command-line values that override the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub cluster: Option<String>,
    pub standalone: Option<String>,
    pub threads: Option<usize>,
    pub metrics: Option<String>,
    /// `--takeover`: sets `server.takeover`.
    pub takeover: bool,
}

/// A configuration that failed to load; each line names a key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration{}:\n  {}", .file.as_ref().map(|f| format!(" in {}", f.display())).unwrap_or_default(), .problems.join("\n  "))]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    pub problems: Vec<String>,
}

impl Config {
    /// Loads `path` (if any), applies overrides and validates.
    pub fn load(path: Option<&Path>, ov: &Overrides) -> Result<Config, ConfigError> {
        let err = |p: Vec<String>| ConfigError { file: path.map(Path::to_path_buf), problems: p };
        let mut cfg = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| err(vec![format!("cannot read file: {e}")]))?;
                Config::parse(&text).map_err(|e| err(vec![e]))?
            }
            None => Config::default(),
        };
        cfg.apply(ov);
        cfg.validate().map_err(err)?;
        Ok(cfg)
    }

    /// Parses TOML text (no validation).
    pub fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim().to_string())
    }

    pub fn apply(&mut self, ov: &Overrides) {
        if let Some(l) = &ov.listen {
            self.server.listen = l.clone();
        }
        if let Some(c) = &ov.cluster {
            self.backend.mode = "cluster".into();
            self.backend.seeds = c.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        }
        if let Some(s) = &ov.standalone {
            self.backend.mode = "standalone".into();
            self.backend.address = Some(s.clone());
        }
        if ov.takeover {
            self.server.takeover = true;
        }
        if let Some(t) = ov.threads {
            self.server.threads = t;
        }
        if let Some(m) = &ov.metrics {
            self.metrics.listen = m.clone();
        }
    }

    /// Every problem, each naming its key.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut p = Vec::new();
        if let Some(a) = &self.server.announce
            && a.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            p.push(format!("server.announce: '{a}' is not a HOST:PORT address"));
        }
        if self.server.listen == "off" {
            if self.tls.listen.is_none() {
                p.push("server.listen: \"off\" needs tls.listen (clients must connect somewhere)".into());
            }
        } else if self.server.listen.parse::<SocketAddr>().is_err() {
            p.push(format!("server.listen: '{}' is neither an IP:PORT address nor \"off\"", self.server.listen));
        }
        p.extend(self.validate_tls());
        if self.server.max_clients == 0 {
            p.push("server.max_clients: must be at least 1".into());
        }
        if self.server.threads > 1024 {
            p.push("server.threads: at most 1024".into());
        }
        if self.server.password.as_deref() == Some("") {
            p.push("server.password: must not be empty (remove the key to disable AUTH)".into());
        }
        match self.backend.mode.as_str() {
            "cluster" => {
                if self.backend.seeds.is_empty() {
                    p.push("backend.seeds: list at least one HOST:PORT (or pass --cluster) when backend.mode = \"cluster\"".into());
                }
                for s in &self.backend.seeds {
                    if !valid_host_port(s) {
                        p.push(format!("backend.seeds: '{s}' is not HOST:PORT"));
                    }
                }
            }
            "standalone" => match &self.backend.address {
                None => {
                    p.push("backend.address: required when backend.mode = \"standalone\" (or pass --standalone)".into())
                }
                Some(a) if !valid_host_port(a) => p.push(format!("backend.address: '{a}' is not HOST:PORT")),
                _ => {}
            },
            other => p.push(format!("backend.mode: '{other}' is neither \"cluster\" nor \"standalone\"")),
        }
        let reads = crate::services::reads::Reads::new(
            self.backend.read_from,
            self.backend.replica_max_lag_ms,
            &self.backend.read_rules,
            true,
        );
        if reads.active() && self.backend.mode == "standalone" {
            p.push(
                "backend.read_from: replicas are read only in front of a cluster (backend.mode = \"cluster\")".into(),
            );
        }
        if !(10..=60_000).contains(&self.backend.replica_check_interval_ms) {
            p.push("backend.replica_check_interval_ms: must be between 10 and 60000".into());
        }
        for (i, r) in self.backend.read_rules.iter().enumerate() {
            if r.pattern.is_empty() {
                p.push(format!("backend.read_rules[{i}].pattern: must not be empty"));
            }
        }
        for lag in std::iter::once(self.backend.replica_max_lag_ms)
            .chain(self.backend.read_rules.iter().filter_map(|r| r.max_lag_ms))
        {
            if lag < 2 * self.backend.replica_check_interval_ms || lag > 3_600_000 {
                p.push(format!(
                    "backend.replica_max_lag_ms: {lag} must be between twice backend.replica_check_interval_ms and 3600000"
                ));
            }
        }
        if !(1..=64).contains(&self.backend.connections_per_node) {
            p.push("backend.connections_per_node: must be between 1 and 64".into());
        }
        if !(1..=100_000).contains(&self.backend.dedicated_max_per_node) {
            p.push("backend.dedicated_max_per_node: must be between 1 and 100000".into());
        }
        if !matches!(self.transactions.cross_slot.as_str(), "refuse" | "per-node") {
            p.push(format!(
                "transactions.cross_slot: '{}' is neither \"refuse\" nor \"per-node\"",
                self.transactions.cross_slot
            ));
        }
        if self.backend.flush_delay_ms > MAX_FLUSH_DELAY_MS {
            p.push(format!("backend.flush_delay_ms: must be at most {MAX_FLUSH_DELAY_MS}"));
        }
        if self.backend.dedicated_idle_per_node > self.backend.dedicated_max_per_node {
            p.push("backend.dedicated_idle_per_node: must be at most backend.dedicated_max_per_node".into());
        }
        for (k, v) in [
            ("backend.connect_timeout_ms", self.backend.connect_timeout_ms),
            ("backend.command_timeout_ms", self.backend.command_timeout_ms),
            ("backend.refresh_interval_ms", self.backend.refresh_interval_ms),
        ] {
            if v == 0 {
                p.push(format!("{k}: must be greater than 0"));
            }
        }
        if self.limits.max_request_bytes < 1024 || self.limits.max_request_bytes > u32::MAX as u64 {
            p.push("limits.max_request_bytes: must be between 1024 and 4294967295".into());
        }
        let l = &self.limits;
        if l.max_inflight_request_bytes < 1024 {
            p.push("limits.max_inflight_request_bytes: must be at least 1024".into());
        }
        if l.output_soft_bytes < 1024 {
            p.push("limits.output_soft_bytes: must be at least 1024".into());
        }
        if l.output_hard_bytes < l.output_soft_bytes {
            p.push("limits.output_hard_bytes: must be at least limits.output_soft_bytes".into());
        }
        if l.max_subscriptions == 0 {
            p.push("limits.max_subscriptions: must be at least 1".into());
        }
        if l.tracking_max_keys == 0 {
            p.push("limits.tracking_max_keys: must be at least 1".into());
        }
        if l.pubsub_output_soft_bytes < 1024 {
            p.push("limits.pubsub_output_soft_bytes: must be at least 1024".into());
        }
        if l.pubsub_output_hard_bytes < l.pubsub_output_soft_bytes {
            p.push("limits.pubsub_output_hard_bytes: must be at least limits.pubsub_output_soft_bytes".into());
        }
        if self.server.drain_grace_ms > 600_000 {
            p.push("server.drain_grace_ms: at most 600000".into());
        }
        if self.limits.max_pipeline == 0 {
            p.push("limits.max_pipeline: must be at least 1".into());
        }
        if self.metrics.listen != "off" && self.metrics.listen.parse::<SocketAddr>().is_err() {
            p.push(format!("metrics.listen: '{}' is neither an IP:PORT address nor \"off\"", self.metrics.listen));
        }
        if !(1..=1_000_000).contains(&self.metrics.latency_sample_every) {
            p.push("metrics.latency_sample_every: must be between 1 and 1000000".into());
        }
        let table = crate::command::CommandTable::new();
        if let Err(e) =
            crate::services::acl::Users::from_config(&self.server.users, self.server.password.as_deref(), &table)
        {
            p.push(format!("server.users: {e}"));
        }
        if let Err(rules) = crate::services::ratelimit::compile(&self.ratelimit.rules, &table) {
            p.extend(rules);
        }
        p.extend(self.cache.validate(&table));
        p.extend(self.fleet.problems());
        p.extend(self.audit.problems());
        let source = match self.backing() {
            Backing::Cluster { seeds } => seeds,
            Backing::Standalone { addr } => vec![addr],
        };
        p.extend(self.migration.problems(&source));
        if let Err(rules) = crate::services::colocate::compile(&self.colocate) {
            p.extend(rules);
        }
        if let Err(rules) = crate::services::colocate::compile(&self.colocate_next) {
            p.extend(rules.into_iter().map(|r| format!("colocate_next: {r}")));
        }
        if !self.colocate_next.is_empty() && self.fleet.name.is_empty() {
            p.push(
                "colocate_next: switching rules with a fleet needs one ([fleet] name); alone, change [[colocate]]"
                    .into(),
            );
        }
        if self.admin.password.as_deref() == Some("") {
            p.push("admin.password: must not be empty (remove the key to disable it)".into());
        }
        if self.admin.slowlog_max_len > 100_000 {
            p.push("admin.slowlog_max_len: at most 100000".into());
        }
        if self.admin.bigkeys_max_len > 10_000 {
            p.push("admin.bigkeys_max_len: at most 10000".into());
        }
        if p.is_empty() { Ok(()) } else { Err(p) }
    }

    fn validate_tls(&self) -> Vec<String> {
        let mut p = Vec::new();
        let t = &self.tls;
        if let Some(l) = &t.listen {
            if l.parse::<SocketAddr>().is_err() {
                p.push(format!("tls.listen: '{l}' is not an IP:PORT address"));
            } else if *l == self.server.listen {
                p.push("tls.listen: must differ from server.listen".into());
            }
            if t.cert_file.is_none() {
                p.push("tls.cert_file: required with tls.listen".into());
            }
            if t.key_file.is_none() {
                p.push("tls.key_file: required with tls.listen".into());
            }
        }
        match t.auth_clients() {
            "no" => {}
            "yes" | "optional" if t.ca_cert_file.is_none() => {
                p.push("tls.auth_clients: client certificates need tls.ca_cert_file".into())
            }
            "yes" | "optional" => {}
            other => p.push(format!("tls.auth_clients: '{other}' is none of \"yes\", \"optional\", \"no\"")),
        }
        match t.auth_clients_user.to_ascii_lowercase().as_str() {
            "off" => {}
            "cn" | "uri" if t.auth_clients() == "no" => p.push(
                "tls.auth_clients_user: needs client certificates (tls.auth_clients \"yes\" or \"optional\")".into(),
            ),
            "cn" | "uri" => {}
            _ => {
                p.push(format!("tls.auth_clients_user: '{}' is none of \"off\", \"CN\", \"URI\"", t.auth_clients_user))
            }
        }
        if t.handshake_timeout_ms == 0 {
            p.push("tls.handshake_timeout_ms: must be greater than 0".into());
        }
        let b = &self.backend;
        if b.tls && b.tls_ca_cert_file.is_none() {
            p.push("backend.tls_ca_cert_file: required with backend.tls (the nodes' certificates are verified)".into());
        }
        if b.tls_cert_file.is_some() != b.tls_key_file.is_some() {
            p.push("backend.tls_cert_file: and backend.tls_key_file go together".into());
        }
        if let Some(n) = &b.tls_server_name
            && rustls::pki_types::ServerName::try_from(n.as_str()).is_err()
        {
            p.push(format!("backend.tls_server_name: '{n}' is not a DNS name or IP address"));
        }
        p
    }

    /// What heatshield fronts, from `backend.mode` (after validation).
    pub fn backing(&self) -> Backing {
        if self.backend.mode == "standalone" {
            Backing::Standalone { addr: self.backend.address.clone().unwrap_or_default() }
        } else {
            Backing::Cluster { seeds: self.backend.seeds.clone() }
        }
    }

    /// The metrics listener, unless "off".
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.listen.parse().ok()
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.backend.connect_timeout_ms)
    }
    pub fn command_timeout(&self) -> Duration {
        Duration::from_millis(self.backend.command_timeout_ms)
    }
    pub fn refresh_interval(&self) -> Duration {
        Duration::from_millis(self.backend.refresh_interval_ms)
    }
}

fn valid_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((h, port)) => !h.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    }
}

/// Settings `PROXY CONFIG SET` may change while heatshield runs.
pub struct Live {
    pub slowlog_slower_than_us: AtomicU64,
    pub slowlog_max_len: AtomicUsize,
    pub bigkey_bytes: AtomicU64,
    pub allow_flush: AtomicBool,
    pub max_clients: AtomicUsize,
}

impl Live {
    pub fn new(c: &Config) -> Live {
        Live {
            slowlog_slower_than_us: AtomicU64::new(c.admin.slowlog_slower_than_us),
            slowlog_max_len: AtomicUsize::new(c.admin.slowlog_max_len),
            bigkey_bytes: AtomicU64::new(c.admin.bigkey_bytes),
            allow_flush: AtomicBool::new(c.server.allow_flush),
            max_clients: AtomicUsize::new(c.server.max_clients),
        }
    }
}

/// Keys `PROXY CONFIG SET` accepts.
pub const LIVE_KEYS: &[&str] = &[
    "admin.bigkey_bytes",
    "admin.slowlog_max_len",
    "admin.slowlog_slower_than_us",
    "server.allow_flush",
    "server.max_clients",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_config_parses() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/heatshield.toml")).unwrap();
        let cfg = Config::parse(&text).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.server.listen, "127.0.0.1:6380");
    }

    #[test]
    fn every_problem_named() {
        let mut cfg = Config::parse(
            "[server]\nlisten = 'nope'\nannounce = 'host'\n[backend]\nmode = 'cluster'\nconnections_per_node = 0\n",
        )
        .unwrap();
        cfg.apply(&Overrides::default());
        let p = cfg.validate().unwrap_err();
        assert!(p.iter().any(|l| l.starts_with("server.listen:")), "{p:?}");
        assert!(p.iter().any(|l| l.starts_with("backend.seeds:")), "{p:?}");
        assert!(p.iter().any(|l| l.starts_with("backend.connections_per_node:")), "{p:?}");
        assert!(p.iter().any(|l| l.starts_with("server.announce:")), "{p:?}");
    }

    #[test]
    fn next_colocation_rules_need_a_fleet() {
        let rule = "[[colocate_next]]\nname = 'rq'\nkeys = ['rq:*']\ntag = 'rq'\n";
        let alone = Config::parse(rule).unwrap();
        let p = alone.validate().unwrap_err();
        assert!(p.iter().any(|l| l.starts_with("colocate_next: switching rules with a fleet needs one")), "{p:?}");
        let mut fleet = Config::parse(&format!("[fleet]\nname = 'f'\n\n{rule}")).unwrap();
        fleet.apply(&Overrides { standalone: Some("127.0.0.1:7000".into()), ..Default::default() });
        fleet.validate().unwrap();
        assert_eq!(fleet.colocate_next.len(), 1);
    }

    #[test]
    fn unknown_key_rejected() {
        let e = Config::parse("[server]\nlisten_on = '1'\n").unwrap_err();
        assert!(e.contains("listen_on"), "{e}");
    }

    #[test]
    fn overrides_win() {
        let mut cfg = Config::default();
        cfg.apply(&Overrides { standalone: Some("127.0.0.1:7000".into()), ..Default::default() });
        cfg.validate().unwrap();
        assert_eq!(cfg.backing(), Backing::Standalone { addr: "127.0.0.1:7000".into() });
    }
}
