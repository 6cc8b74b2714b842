//! Moving a live dataset from the cluster heatshield serves (the source, `[backend]`) to
//! another (the target, `[migration]`): the target's configuration and connection
//! options, and the phases (docs/migration.md). Built so far: [`copy`], a key copied with
//! a version; [`backfill`], every key copied; [`dual`], the keys clients write copied
//! after the source's reply; [`verify`], every key compared between the two.

pub mod ask;
pub mod backfill;
pub mod copy;
pub mod dual;
pub mod gate;
pub mod shadow;
pub mod verify;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::protocol::Request;
use crate::protocol::reply::{Value, error_text};
use crate::upstream::backend::BackendOptions;
use crate::upstream::cluster::{Backing, Cluster, slot};
use crate::upstream::side::Side;

/// `[migration]`: the cluster to move to, and how the phases compare and pace.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MigrationConfig {
    /// The target's seed nodes (`target_mode = "cluster"`) or its one address
    /// (`"standalone"`), HOST:PORT. Empty: no migration configured.
    pub target: Vec<String>,
    /// "cluster" or "standalone".
    pub target_mode: String,
    /// Credentials for the target (ACL user and password, or password only).
    pub target_username: Option<String>,
    pub target_password: Option<String>,
    /// TLS to every node of the target, with these files (as `backend.tls_*`).
    pub target_tls: bool,
    pub target_tls_ca_cert_file: Option<String>,
    pub target_tls_cert_file: Option<String>,
    pub target_tls_key_file: Option<String>,
    pub target_tls_server_name: Option<String>,
    /// Two remaining times to live this close are the same.
    pub ttl_tolerance_ms: u64,
    /// A key that differs is compared again this many times, this long apart, before it
    /// is reported (a key written while it was compared settles).
    pub verify_rechecks: u32,
    pub verify_recheck_delay_ms: u64,
    /// The phase at start: "off", "shadow" (requests also asked of the target, its replies
    /// compared), or "dual-write" (every key a client writes is copied to
    /// the target after the source's reply). `PROXY MIGRATION` changes it while running.
    pub phase: String,
    /// Keys written and waiting for their copy at most; more are dropped and counted.
    pub max_pending: usize,
}

impl Default for MigrationConfig {
    fn default() -> Self {
        MigrationConfig {
            target: vec![],
            target_mode: "cluster".into(),
            target_username: None,
            target_password: None,
            target_tls: false,
            target_tls_ca_cert_file: None,
            target_tls_cert_file: None,
            target_tls_key_file: None,
            target_tls_server_name: None,
            ttl_tolerance_ms: 1_000,
            verify_rechecks: 3,
            verify_recheck_delay_ms: 500,
            phase: "off".into(),
            max_pending: 1_000_000,
        }
    }
}

impl MigrationConfig {
    /// Whether a target is configured.
    pub fn configured(&self) -> bool {
        !self.target.is_empty()
    }

    /// Problems with the section, given the source's addresses (`source`): a target that
    /// is the source would compare the data with itself, and later phases would write
    /// it back onto itself.
    pub fn problems(&self, source: &[String]) -> Vec<String> {
        let mut p = Vec::new();
        match self.phase.as_str() {
            "off" => {}
            "dual-write" | "shadow" if self.configured() => {}
            ph @ ("dual-write" | "shadow") => p.push(format!("migration.phase: {ph:?} needs migration.target")),
            ph => p.push(format!("migration.phase: {ph:?} is not \"off\", \"shadow\" or \"dual-write\"")),
        }
        if self.max_pending == 0 {
            p.push("migration.max_pending: must be at least 1".into());
        }
        if !self.configured() {
            return p;
        }
        match self.target_mode.as_str() {
            "cluster" => {}
            "standalone" if self.target.len() == 1 => {}
            "standalone" => p.push("migration.target: one address in standalone mode".into()),
            m => p.push(format!("migration.target_mode: {m:?} is neither \"cluster\" nor \"standalone\"")),
        }
        for a in &self.target {
            if a.rsplit_once(':').is_none_or(|(_, port)| port.parse::<u16>().is_err()) {
                p.push(format!("migration.target: {a:?} is not HOST:PORT"));
            }
            if source.iter().any(|s| s == a) {
                p.push(format!("migration.target: {a} is also the source (backend)"));
            }
        }
        if self.target_tls && self.target_tls_ca_cert_file.is_none() {
            p.push("migration.target_tls: needs target_tls_ca_cert_file".into());
        }
        if self.target_password.as_deref() == Some("") {
            p.push("migration.target_password: must not be empty (remove the key for none)".into());
        }
        p
    }

    /// How the target is reached.
    pub fn backing(&self) -> Backing {
        if self.target_mode == "standalone" {
            Backing::Standalone { addr: self.target.first().cloned().unwrap_or_default() }
        } else {
            Backing::Cluster { seeds: self.target.clone() }
        }
    }

    /// The target's connection options: the source's (timeouts), with the target's
    /// credentials and TLS.
    pub fn options(&self, source: &BackendOptions) -> Result<BackendOptions, String> {
        let mut o = source.clone();
        o.username = self.target_username.clone();
        o.password = self.target_password.clone();
        o.tls = None;
        if self.target_tls {
            let files = crate::tls::ClientFiles {
                ca: self.target_tls_ca_cert_file.clone().unwrap_or_default().into(),
                cert: self.target_tls_cert_file.clone().map(Into::into),
                key: self.target_tls_key_file.clone().map(Into::into),
                server_name: self.target_tls_server_name.clone(),
            };
            let c = crate::tls::Connector::new(files)
                .map_err(|e| format!("migration target TLS: cannot load the certificates: {e}"))?;
            o.tls = Some(std::sync::Arc::new(c));
        }
        Ok(o)
    }
}

/// One connection per node of one side, opened when first needed.
pub struct Nodes {
    pub cluster: Arc<Cluster>,
    opts: BackendOptions,
    links: HashMap<Arc<str>, Side>,
    /// What the connections are for (`CLIENT SETNAME heatshield-<purpose>`).
    purpose: &'static str,
}

impl Nodes {
    pub fn new(cluster: Arc<Cluster>, opts: BackendOptions, purpose: &'static str) -> Nodes {
        Nodes { cluster, opts, links: HashMap::new(), purpose }
    }

    /// The master serving `key`'s slot now.
    pub fn owner(&self, key: &[u8]) -> Result<Arc<str>, String> {
        let s = slot(key);
        self.cluster
            .topology()
            .master_for_slot(s)
            .map(|n| n.addr.clone())
            .ok_or_else(|| format!("slot {s} has no master"))
    }

    pub fn masters(&self) -> Vec<Arc<str>> {
        self.cluster.topology().masters.iter().map(|m| m.addr.clone()).collect()
    }

    /// Sends `cmds` to `addr` pipelined; their replies, in order.
    pub async fn pipe(&mut self, addr: &Arc<str>, cmds: &[Vec<&[u8]>]) -> Result<Vec<Bytes>, String> {
        let mut data = BytesMut::new();
        for c in cmds {
            data.extend_from_slice(Request::from_args(c).raw());
        }
        let side = self.links.entry(addr.clone()).or_insert_with(|| Side::new(addr.clone(), &self.opts, self.purpose));
        side.call_raw(&data, cmds.len()).await.map_err(|e| format!("{addr}: {e}"))
    }

    /// Sends `n` commands already encoded (`data`) to `addr` and reads their replies.
    pub async fn pipe_raw(&mut self, addr: &Arc<str>, data: &[u8], n: usize) -> Result<Vec<Bytes>, String> {
        let side = self.links.entry(addr.clone()).or_insert_with(|| Side::new(addr.clone(), &self.opts, self.purpose));
        side.call_raw(data, n).await.map_err(|e| format!("{addr}: {e}"))
    }

    pub async fn ask(&mut self, addr: &Arc<str>, cmd: Vec<&[u8]>) -> Result<Bytes, String> {
        Ok(self.pipe(addr, &[cmd]).await?.pop().unwrap_or_default())
    }

    /// `cmd` for `key`, sent to the key's master.
    pub async fn ask_for(&mut self, key: &[u8], cmd: Vec<&[u8]>) -> Result<Bytes, String> {
        let addr = self.owner(key)?;
        self.ask(&addr, cmd).await
    }
}

pub fn int(r: &[u8]) -> Option<i64> {
    Value::parse(r).ok().and_then(|(v, _)| v.as_int())
}

/// A `SCAN`-family reply: the next cursor and the items.
pub fn scan_reply(r: &[u8]) -> Result<(Vec<u8>, Vec<Vec<u8>>), String> {
    if let Some(e) = error_text(r) {
        return Err(String::from_utf8_lossy(e).into_owned());
    }
    let (v, _) = Value::parse(r).map_err(|e| e.0.to_string())?;
    let Value::Array(parts) = v else { return Err(format!("unexpected reply {v:?}")) };
    match (parts.first().and_then(Value::as_bytes), parts.get(1)) {
        (Some(c), Some(Value::Array(items))) => {
            Ok((c.to_vec(), items.iter().filter_map(Value::as_bytes).map(<[u8]>::to_vec).collect()))
        }
        _ => Err(format!("unexpected reply {parts:?}")),
    }
}

/// The two clusters of a move and how to reach them.
#[derive(Clone)]
pub struct Clusters {
    pub source: Arc<Cluster>,
    pub source_opts: BackendOptions,
    pub target: Arc<Cluster>,
    pub target_opts: BackendOptions,
}

impl Clusters {
    /// Both sides' slot maps read now, and a connection set for each, named
    /// `heatshield-<purpose>`.
    pub async fn open(self, purpose: &'static str) -> Result<(Nodes, Nodes), String> {
        for c in [&self.source, &self.target] {
            if c.is_cluster() {
                c.refresh().await?;
            }
        }
        Ok((Nodes::new(self.source, self.source_opts, purpose), Nodes::new(self.target, self.target_opts, purpose)))
    }
}

/// The reserved prefix of heatshield's own keys on the target: `{heatshield:mv:N}`, where
/// `N` is chosen so the key falls in a given slot ([`slot_tag`]).
pub const TAG_PREFIX: &str = "heatshield:mv:";

/// A hash tag (without its braces) whose keys fall in `slot`: heatshield's own keys for a
/// key of that slot (its copy's version, a big key's copy in progress) go beside it, so a
/// script can touch both.
pub fn slot_tag(s: u16) -> &'static str {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let n = crate::upstream::cluster::SLOTS;
        let mut tags = vec![String::new(); n];
        let mut left = n;
        let mut i = 0u64;
        while left > 0 {
            let t = format!("{TAG_PREFIX}{i}");
            let s = slot(format!("{{{t}}}").as_bytes()) as usize;
            if tags[s].is_empty() {
                tags[s] = t;
                left -= 1;
            }
            i += 1;
        }
        tags
    });
    &tags[s as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_checked_against_the_source_and_its_mode() {
        let mut c = MigrationConfig::default();
        assert!(c.problems(&["127.0.0.1:7000".into()]).is_empty(), "nothing configured, nothing to say");
        c.target = vec!["127.0.0.1:7000".into(), "nowhere".into()];
        let p = c.problems(&["127.0.0.1:7000".into()]);
        assert!(p.iter().any(|x| x.contains("also the source")), "{p:?}");
        assert!(p.iter().any(|x| x.contains("not HOST:PORT")), "{p:?}");
        c.target = vec!["127.0.0.1:7100".into(), "127.0.0.1:7101".into()];
        c.target_mode = "standalone".into();
        assert!(c.problems(&[]).iter().any(|x| x.contains("one address")));
        c.target_mode = "cluster".into();
        c.target_tls = true;
        assert!(c.problems(&[]).iter().any(|x| x.contains("target_tls_ca_cert_file")));
        c.target_tls = false;
        assert!(c.problems(&[]).is_empty());
        assert!(matches!(c.backing(), Backing::Cluster { seeds } if seeds.len() == 2));
    }

    #[test]
    fn every_slot_has_a_tag_of_its_own() {
        for s in [0u16, 1, 777, 16383] {
            let key = format!("{{{}}}v", slot_tag(s));
            assert_eq!(slot(key.as_bytes()), s);
            assert!(crate::command::reserved(key.as_bytes()), "{key} is one of heatshield's own");
        }
    }
}
