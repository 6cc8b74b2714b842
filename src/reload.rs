//! Reloading the configuration file while heatshield runs (SIGHUP, `PROXY CONFIG
//! RELOAD`; docs/admin.md). The file is loaded and checked whole first (with the command
//! table learned from the masters): a file with any problem changes nothing. Then each
//! key that differs from the running configuration is either applied at once ([`LIVE`])
//! or reported as needing a restart (its running value stays), and every change is
//! logged by name, with old and new values except for secrets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::{error, info, warn};

use crate::config::{self, Config};
use crate::proxy::Proxy;

/// The keys a reload applies at once. `limits.*` apply to the connections opened after
/// the reload; the others to everyone now. The rest need a restart.
pub const LIVE: &[&str] = &[
    "admin.bigkey_bytes",
    "admin.slowlog_max_len",
    "admin.slowlog_slower_than_us",
    "cache.cool_windows",
    "cache.hot_threshold",
    "cache.max_hot_keys",
    "colocate",
    "colocate_next",
    "limits.max_inflight_request_bytes",
    "limits.max_pipeline",
    "limits.max_request_bytes",
    "limits.output_hard_bytes",
    "limits.output_soft_bytes",
    "limits.output_soft_seconds",
    "limits.output_total_over_soft_bytes",
    "limits.pubsub_output_hard_bytes",
    "limits.pubsub_output_soft_bytes",
    "limits.pubsub_output_soft_seconds",
    "ratelimit.rules",
    "server.allow_flush",
    "server.auth_failures_per_minute",
    "server.max_clients",
    "server.password",
    "server.users",
];

/// Keys whose values are never logged or shown.
const SECRET: &[&str] = &["admin.password", "backend.password", "server.password", "server.users"];

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    /// Keys applied.
    pub applied: Vec<String>,
    /// Keys changed in the file that need a restart (their running values stay).
    pub restart: Vec<String>,
}

/// Every key with its value, rules and colocation included (as JSON text).
fn values(c: &Config) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = config::entries(c).into_iter().filter_map(|(k, v)| Some((k, v?))).collect();
    out.insert("ratelimit.rules".into(), serde_json::to_string(&c.ratelimit.rules).unwrap_or_default());
    out.insert("colocate".into(), serde_json::to_string(&c.colocate).unwrap_or_default());
    out.insert("colocate_next".into(), serde_json::to_string(&c.colocate_next).unwrap_or_default());
    out
}

/// Loads the file heatshield was started with and applies it ([`apply`]).
pub fn from_file(proxy: &Proxy) -> Result<Report, String> {
    let Some((path, overrides)) = proxy.reload_from.get() else {
        return Err("heatshield was started without --config: there is no file to reload".into());
    };
    let new = Config::load(Some(path), overrides).map_err(|e| {
        let e = e.to_string();
        proxy.audit.reopen();
        proxy.audit.reload(&[], &[], Some(&e));
        error!(file = %path.display(), problems = %e, "reload: configuration rejected whole; nothing changed");
        e
    })?;
    let r = apply(proxy, new);
    // (logrotate moved the audit log, say: opened again before its next record)
    proxy.audit.reopen();
    match &r {
        Ok(r) => {
            proxy.audit.reload(&r.applied, &r.restart, None);
            info!(file = %path.display(), applied = r.applied.len(), needs_restart = r.restart.len(), "reload done")
        }
        Err(e) => {
            proxy.audit.reload(&[], &[], Some(e));
            error!(file = %path.display(), problems = %e, "reload: configuration rejected whole; nothing changed")
        }
    }
    r
}

/// Applies a checked configuration: the keys in [`LIVE`] that changed now, the others
/// reported. Rejected whole, changing nothing, if its rules or users do not compile
/// against the running command table.
pub fn apply(proxy: &Proxy, new: Config) -> Result<Report, String> {
    let current = proxy.settings();
    let rules = crate::services::ratelimit::compile(&new.ratelimit.rules, &proxy.commands).map_err(|p| p.join("; "))?;
    let colocation = crate::services::colocate::compile(&new.colocate).map_err(|p| p.join("; "))?;
    let next = crate::services::colocate::compile(&new.colocate_next).map_err(|p| p.join("; "))?;
    let users =
        crate::services::acl::Users::from_config(&new.server.users, new.server.password.as_deref(), &proxy.commands)
            .map_err(|e| format!("server.users: {e}"))?;
    let (mut old_values, new_values) = (values(&current), values(&new));
    // what runs now, where it may differ from the file it started with (PROXY CONFIG SET,
    // PROXY RATELIMIT, PROXY COLOCATE): the file wins where it says otherwise
    let running_rules: Vec<_> = proxy.ratelimit.rules().iter().map(|r| r.spec.clone()).collect();
    let running_colocate: Vec<_> = proxy.colocate.rules().list.iter().map(|r| r.spec.clone()).collect();
    let l = &proxy.live;
    for (k, v) in [
        ("ratelimit.rules", serde_json::to_string(&running_rules).unwrap_or_default()),
        ("colocate", serde_json::to_string(&running_colocate).unwrap_or_default()),
        ("admin.bigkey_bytes", l.bigkey_bytes.load(Ordering::Relaxed).to_string()),
        ("admin.slowlog_max_len", l.slowlog_max_len.load(Ordering::Relaxed).to_string()),
        ("admin.slowlog_slower_than_us", l.slowlog_slower_than_us.load(Ordering::Relaxed).to_string()),
        ("server.allow_flush", l.allow_flush.load(Ordering::Relaxed).to_string()),
        ("server.max_clients", l.max_clients.load(Ordering::Relaxed).to_string()),
    ] {
        old_values.insert(k.to_string(), v);
    }
    let mut report = Report::default();
    for (key, new_value) in &new_values {
        let old_value = old_values.get(key).cloned().unwrap_or_default();
        if old_value == *new_value {
            continue;
        }
        let shown = |v: &str| if SECRET.contains(&key.as_str()) { "(hidden)".to_string() } else { v.to_string() };
        if LIVE.contains(&key.as_str()) {
            info!(key = %key, from = %shown(&old_value), to = %shown(new_value), "reload: applied");
            report.applied.push(key.clone());
        } else {
            warn!(key = %key, from = %shown(&old_value), to = %shown(new_value), "reload: needs a restart; the running value stays");
            report.restart.push(key.clone());
        }
    }
    let changed = |k: &str| report.applied.iter().any(|a| a == k);
    if changed("admin.bigkey_bytes") {
        l.bigkey_bytes.store(new.admin.bigkey_bytes, Ordering::Relaxed);
    }
    if changed("admin.slowlog_max_len") {
        l.slowlog_max_len.store(new.admin.slowlog_max_len, Ordering::Relaxed);
    }
    if changed("admin.slowlog_slower_than_us") {
        l.slowlog_slower_than_us.store(new.admin.slowlog_slower_than_us, Ordering::Relaxed);
    }
    if changed("server.allow_flush") {
        l.allow_flush.store(new.server.allow_flush, Ordering::Relaxed);
    }
    if changed("server.max_clients") {
        l.max_clients.store(new.server.max_clients, Ordering::Relaxed);
    }
    if changed("server.auth_failures_per_minute") {
        proxy.auth_limiter.set(new.server.auth_failures_per_minute);
    }
    if changed("ratelimit.rules") {
        proxy.ratelimit.replace(rules);
    }
    // (the next rules already in force: the fleet switched to them, and the file has not
    // caught up yet; going back to its rules now would split the keys they name)
    let switched = !next.list.is_empty() && next.digest() == proxy.colocate.rules().digest();
    if changed("colocate") && !switched {
        proxy.colocate.replace(colocation);
    }
    if changed("colocate_next") {
        proxy.colocate.set_next(next);
    }
    if changed("server.users") || changed("server.password") {
        // as ACL LOAD on Redis: the connections of users that are gone are closed, and
        // those of users the file turns off (logged in by AUTH or by a certificate alike)
        let gone = proxy.users.replace(users);
        let off: Vec<String> = proxy
            .users
            .names()
            .into_iter()
            .filter(|n| proxy.users.get(n).is_some_and(|u| !u.perms().enabled))
            .collect();
        for c in proxy.clients.all() {
            let user = c.user();
            if gone.iter().any(|u| u.name == user) || (user != "default" && off.contains(&user)) {
                c.send(crate::conn::Control::Kill);
                proxy.clients.remove(c.id);
            }
        }
        for u in proxy.users.names() {
            crate::metrics::acl_user(&u);
        }
    }
    if report.applied.iter().any(|k| k.starts_with("limits.")) {
        proxy.limits.store(Arc::new(new.limits.clone()));
    }
    if report.applied.iter().any(|k| k.starts_with("cache.")) {
        proxy.cache.retune(new.cache.hot_threshold, new.cache.cool_windows, new.cache.max_hot_keys);
    }
    // the running configuration: the new file, but what needs a restart as it runs
    let mut merged = serde_json::to_value(&new).map_err(|e| e.to_string())?;
    let old = serde_json::to_value(&*current).map_err(|e| e.to_string())?;
    for key in &report.restart {
        let (section, name) = key.split_once('.').unwrap_or((key.as_str(), ""));
        let was = if name.is_empty() { old.get(section) } else { old.get(section).and_then(|s| s.get(name)) };
        if let (Some(was), Some(slot)) = (was.cloned(), merged.get_mut(section)) {
            match (name.is_empty(), slot.get_mut(name)) {
                (true, _) => *slot = was,
                (false, Some(v)) => *v = was,
                (false, None) => {}
            }
        }
    }
    let merged: Config = serde_json::from_value(merged).map_err(|e| e.to_string())?;
    proxy.current.store(Arc::new(merged));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_live_key_is_a_key() {
        let keys = values(&Config::default());
        for k in LIVE {
            assert!(keys.contains_key(*k), "{k} is not a configuration key");
        }
        for k in SECRET {
            assert!(keys.contains_key(*k), "{k} is not a configuration key");
        }
    }
}
