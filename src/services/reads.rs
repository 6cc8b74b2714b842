//! Read policies (docs/replicas.md): which reads may go to a master's replicas, and to
//! which one now.
//!
//! `backend.read_from` (and `[[backend.read_rules]]` per key pattern, the first match
//! deciding) says where a read-only command of one slot goes: `master`, `prefer-replica`
//! (a replica in sync, else the master), `replica` (a replica in sync, else an error) or
//! `any` (the master and the replicas in sync, spread by client). A replica is in sync
//! when `crate::upstream::lag` saw it reach a sample of its master's offset taken at most
//! the policy's `max_lag_ms` ago. Read-your-writes: a client's read goes to a replica
//! only if that replica reached a sample taken after the reply to the client's last
//! write came, so the write is there (no `WAIT`, no window to guess).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::{Command, Route, Split};
use crate::upstream::cluster::{NodePool, Topology};

/// Where reads go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadFrom {
    #[default]
    Master,
    PreferReplica,
    Replica,
    Any,
}

/// One `[[backend.read_rules]]` rule.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRule {
    /// A glob of keys.
    pub pattern: String,
    pub read_from: ReadFrom,
    /// The largest lag accepted; unset: `backend.replica_max_lag_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lag_ms: Option<u64>,
}

/// Where one read goes ([`Reads::choose`]).
pub enum Choice {
    Master,
    /// This replica; `strict`: a `replica` policy (no master to fall back on).
    Replica(Arc<NodePool>, bool),
    /// A `replica` policy and no replica in sync: refused.
    NoReplica,
}

/// The read policies in force.
pub struct Reads {
    default: (ReadFrom, u64),
    rules: Vec<(crate::glob::Pattern, ReadFrom, u64)>,
    /// What the rules' keys may start with: a key none may match takes the default at once.
    first: crate::glob::FirstBytes,
    read_your_writes: bool,
    active: bool,
    /// Colocation rules: a pattern matches a key's client name too.
    names: Option<Arc<crate::services::colocate::Colocate>>,
}

impl Reads {
    pub fn new(default: ReadFrom, max_lag_ms: u64, rules: &[ReadRule], read_your_writes: bool) -> Reads {
        let first = crate::glob::FirstBytes::of(rules.iter().map(|r| r.pattern.as_bytes()));
        let rules: Vec<(crate::glob::Pattern, ReadFrom, u64)> = rules
            .iter()
            .map(|r| (crate::glob::Pattern::new(r.pattern.as_bytes()), r.read_from, r.max_lag_ms.unwrap_or(max_lag_ms)))
            .collect();
        let active = default != ReadFrom::Master || rules.iter().any(|r| r.1 != ReadFrom::Master);
        Reads { default: (default, max_lag_ms), rules, first, read_your_writes, active, names: None }
    }

    /// Patterns match the client's names of keys that colocation rules store under
    /// another (crate::services::colocate), as every other rule's patterns do.
    pub fn with_names(mut self, names: Arc<crate::services::colocate::Colocate>) -> Reads {
        self.names = Some(names);
        self
    }

    /// The keys whose reads may go elsewhere than the master: those some rule may match,
    /// or every key when the default does not read the master.
    pub fn key_first(&self) -> crate::glob::FirstBytes {
        match self.default.0 {
            ReadFrom::Master if self.active => self.first,
            ReadFrom::Master => crate::glob::FirstBytes::default(),
            _ => crate::glob::FirstBytes::all(),
        }
    }

    /// Whether some policy reads replicas.
    #[inline]
    pub fn active(&self) -> bool {
        self.active
    }

    /// The largest lag any policy accepts.
    pub fn max_lag_ms(&self) -> u64 {
        self.rules.iter().map(|r| r.2).chain([self.default.1]).max().unwrap_or(0)
    }

    /// Whether `cmd` may be read from a replica: read-only, of one key's slot, not
    /// blocking (a transaction, WATCH, pub/sub and scripts that may write never are).
    #[inline]
    pub fn eligible(cmd: &Command) -> bool {
        cmd.is_readonly()
            && !cmd.is_blocking()
            && matches!(cmd.route, Route::Forward | Route::Split(Split::Mget | Split::Sum))
    }

    /// The policy for `key` and its lag limit.
    #[inline]
    pub fn policy(&self, key: &[u8]) -> (ReadFrom, u64) {
        // (a stored name starts with its tag, '{': its client name is looked at below)
        if self.rules.is_empty() || (!self.first.may_match(key) && key.first() != Some(&b'{')) {
            return self.default;
        }
        self.policy_by_rules(key)
    }

    /// [`Reads::policy`] for a key some rule may match.
    #[inline(never)]
    fn policy_by_rules(&self, key: &[u8]) -> (ReadFrom, u64) {
        let client = match &self.names {
            Some(n) => n.client_key(key),
            None => key,
        };
        for (p, from, lag) in &self.rules {
            if p.matches(key) || (client.len() != key.len() && p.matches(client)) {
                return (*from, *lag);
            }
        }
        self.default
    }

    /// Where a read of slot `slot` under `policy` (its key's, [`Reads::policy`]) by
    /// client `id`, whose last write was answered at `last_write_ms`
    /// (`backend::clock_ms`), goes at `now_ms`.
    pub fn choose(
        &self,
        topo: &Topology,
        slot: u16,
        policy: (ReadFrom, u64),
        id: u64,
        last_write_ms: u64,
        now_ms: u64,
    ) -> Choice {
        let (from, max_lag) = policy;
        if from == ReadFrom::Master {
            return Choice::Master;
        }
        let g = crate::metrics::global();
        let readers = match topo.master_index(slot).and_then(|i| topo.readers.get(i)) {
            Some(r) if !r.is_empty() => &r[..],
            _ => {
                g.replica_fallback_lag.increment(1);
                return match from {
                    ReadFrom::Replica => Choice::NoReplica,
                    _ => Choice::Master,
                };
            }
        };
        let (mut in_sync, mut own_write) = (0usize, false);
        let mut first: Option<&Arc<NodePool>> = None;
        let n = readers.len();
        for k in 0..n {
            let r = &readers[(id as usize + k) % n];
            let synced = r.synced_at.load(std::sync::atomic::Ordering::Relaxed);
            if synced == 0 || now_ms.saturating_sub(synced) > max_lag {
                continue;
            }
            if self.read_your_writes && synced <= last_write_ms {
                own_write = true;
                continue;
            }
            in_sync += 1;
            first.get_or_insert(r);
        }
        let Some(r) = first else {
            if own_write {
                // the client's write may not be there yet: the master has it
                g.replica_fallback_own_write.increment(1);
                return Choice::Master;
            }
            g.replica_fallback_lag.increment(1);
            return match from {
                ReadFrom::Replica => Choice::NoReplica,
                _ => Choice::Master,
            };
        };
        if from == ReadFrom::Any && (id as usize) % (in_sync + 1) == in_sync {
            return Choice::Master;
        }
        g.replica_reads.increment(1);
        Choice::Replica(r.clone(), from == ReadFrom::Replica)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_rule_decides() {
        let rules = vec![
            ReadRule { pattern: "feed:*".into(), read_from: ReadFrom::PreferReplica, max_lag_ms: Some(5000) },
            ReadRule { pattern: "order:*".into(), read_from: ReadFrom::Master, max_lag_ms: None },
        ];
        let r = Reads::new(ReadFrom::Master, 1000, &rules, true);
        assert!(r.active());
        assert_eq!(r.policy(b"feed:1"), (ReadFrom::PreferReplica, 5000));
        assert_eq!(r.policy(b"order:1"), (ReadFrom::Master, 1000));
        assert_eq!(r.policy(b"other"), (ReadFrom::Master, 1000));
        assert_eq!(r.max_lag_ms(), 5000);
        assert!(!Reads::new(ReadFrom::Master, 1000, &[], true).active());
        let parsed: ReadRule = toml::from_str("pattern = \"x*\"\nread_from = \"prefer-replica\"").unwrap();
        assert_eq!(parsed.read_from, ReadFrom::PreferReplica);
    }
}
