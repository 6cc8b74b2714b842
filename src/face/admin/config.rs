//! `PROXY CONFIG GET | SET | RELOAD`: every setting with its value in force (secrets
//! only as set or not), the live settings ([`crate::config::Live`]) changed while
//! heatshield runs, and the file reloaded ([`crate::reload`]).

use std::sync::atomic::Ordering;

use crate::config::LIVE_KEYS;
use crate::errors;
use crate::proxy::Proxy;

pub(super) fn config_pairs(proxy: &Proxy) -> Vec<(String, String)> {
    let l = &proxy.live;
    let settings = proxy.settings();
    crate::config::entries(&settings)
        .into_iter()
        .filter_map(|(k, v)| {
            let v = match k.as_str() {
                // live settings: their current value
                "admin.bigkey_bytes" => l.bigkey_bytes.load(Ordering::Relaxed).to_string(),
                "admin.slowlog_max_len" => l.slowlog_max_len.load(Ordering::Relaxed).to_string(),
                "admin.slowlog_slower_than_us" => l.slowlog_slower_than_us.load(Ordering::Relaxed).to_string(),
                "server.allow_flush" => l.allow_flush.load(Ordering::Relaxed).to_string(),
                "server.max_clients" => l.max_clients.load(Ordering::Relaxed).to_string(),
                // secrets: only whether they are set
                "admin.password" | "backend.password" | "server.password" | "migration.target_password" => {
                    if v.is_some_and(|v| !v.is_empty()) { "(set)".into() } else { String::new() }
                }
                // users: their passwords as ACL GETUSER shows them, hashed
                "server.users" => {
                    settings.server.users.iter().map(|l| crate::services::acl::redact(l)).collect::<Vec<_>>().join(",")
                }
                _ => v?, // None: the rate-limit rules (PROXY RATELIMIT LIST)
            };
            Some((k, v))
        })
        .collect()
}

pub(super) fn config_set(proxy: &Proxy, key: &[u8], value: &[u8]) -> Result<(), String> {
    let key = String::from_utf8_lossy(key).to_ascii_lowercase();
    let v = String::from_utf8_lossy(value).to_string();
    let num = || v.parse::<u64>().map_err(|_| errors::config_value(&v, &key, "not a non-negative integer"));
    let l = &proxy.live;
    match key.as_str() {
        "admin.slowlog_slower_than_us" => l.slowlog_slower_than_us.store(num()?, Ordering::Relaxed),
        "admin.slowlog_max_len" => {
            let n = num()?;
            if n > 100_000 {
                return Err(errors::config_value(&v, &key, "at most 100000"));
            }
            l.slowlog_max_len.store(n as usize, Ordering::Relaxed)
        }
        "admin.bigkey_bytes" => l.bigkey_bytes.store(num()?, Ordering::Relaxed),
        "server.max_clients" => {
            let n = num()?;
            if n == 0 {
                return Err(errors::config_value(&v, &key, "must be at least 1"));
            }
            l.max_clients.store(n as usize, Ordering::Relaxed)
        }
        "server.allow_flush" => match v.to_ascii_lowercase().as_str() {
            "true" | "yes" | "1" => l.allow_flush.store(true, Ordering::Relaxed),
            "false" | "no" | "0" => l.allow_flush.store(false, Ordering::Relaxed),
            _ => return Err(errors::config_value(&v, &key, "not a boolean")),
        },
        _ if config_pairs(proxy).iter().any(|(k, _)| *k == key) => {
            return Err(errors::config_not_live(&key, LIVE_KEYS));
        }
        _ => return Err(errors::config_unknown(&key)),
    }
    Ok(())
}
