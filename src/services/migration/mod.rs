//! Moving a live dataset from the cluster heatshield serves (the source, `[backend]`) to
//! another (the target, `[migration]`): the target's configuration and connection
//! options, and the phases (docs/migration.md). Built so far: [`verify`], every key
//! compared between the two.

pub mod verify;

use serde::{Deserialize, Serialize};

use crate::upstream::backend::BackendOptions;
use crate::upstream::cluster::Backing;

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
}
