//! `heatshield colocate-migrate --rule NAME`: moves the keys a colocation rule covers that
//! were written before the rule, from their plain names to their colocated ones
//! (docs/colocation.md, "Existing data"), for use while the application is stopped.
//!
//! Each key is copied before it is deleted (`DUMP`, `PEXPIRETIME`, then `RESTORE ...
//! ABSTTL` under the new name, which refuses a name that exists, then `DEL`), so an
//! interruption at any point loses nothing: a later run finds the keys still to move,
//! and a key already copied whose old name is still there (the run stopped between the
//! copy and the delete) is recognised by its identical `DUMP` and finished. A new name
//! that exists with other contents is a conflict: reported, both left alone.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::protocol::reply::Value;
use crate::services::colocate::{Rules, compile};
use crate::upstream::backend::BackendOptions;
use crate::upstream::cluster::{Cluster, slot};
use crate::upstream::side::Side;

/// What one run found and did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    /// Keys of the rule still under their plain names when the run started.
    pub found: u64,
    pub moved: u64,
    /// Keys copied by an earlier run that stopped before deleting the old name.
    pub finished: u64,
    /// New names that exist with other contents: both left alone.
    pub conflicts: Vec<(Vec<u8>, Vec<u8>)>,
    /// Keys that expired or went away while the run looked at them.
    pub gone: u64,
}

/// Options of one run.
pub struct Options {
    pub rule: String,
    /// Count and list, change nothing.
    pub dry_run: bool,
    /// Stop after moving this many keys (0: no limit): a migration in steps.
    pub max_keys: u64,
    /// Called after each key with (keys handled, keys found).
    pub progress: Box<dyn FnMut(u64, u64)>,
}

/// One connection per node, opened when first needed.
struct Nodes {
    opts: BackendOptions,
    links: HashMap<String, Side>,
}

impl Nodes {
    async fn ask(&mut self, addr: &str, args: &[&[u8]]) -> Result<Bytes, String> {
        let side = self.links.entry(addr.to_string()).or_insert_with(|| Side::new(addr, &self.opts, "migrate"));
        side.call(args).await.map_err(|e| format!("{addr}: {e}"))
    }
}

fn error_of(reply: &[u8]) -> Option<String> {
    crate::protocol::reply::error_text(reply).map(|e| String::from_utf8_lossy(e).into_owned())
}

/// Runs the migration of rule `o.rule` (of `rules`) over the masters of `cluster`.
pub async fn run(cluster: Arc<Cluster>, opts: BackendOptions, rules: Rules, mut o: Options) -> Result<Outcome, String> {
    let Some(rule) = rules.list.iter().find(|r| r.spec.name == o.rule) else {
        let names: Vec<&str> = rules.list.iter().map(|r| r.spec.name.as_str()).collect();
        return Err(format!("no colocation rule named {:?} (the configuration has: {})", o.rule, names.join(", ")));
    };
    let patterns = rule.spec.keys.clone();
    // the rule alone decides which keys are its own (an earlier rule that matches a key
    // takes it: that key is that rule's to move)
    let mine = compile(std::slice::from_ref(&rule.spec)).map_err(|p| p.join("; "))?;
    if cluster.is_cluster() {
        cluster.refresh().await?;
    }
    let topo = cluster.topology();
    let mut nodes = Nodes { opts, links: HashMap::new() };
    // 1. the keys still under their plain names, on every master
    let mut todo: Vec<Vec<u8>> = Vec::new();
    for m in &topo.masters {
        for p in &patterns {
            let mut cursor = b"0".to_vec();
            loop {
                let r = nodes.ask(&m.addr, &[b"SCAN", &cursor, b"MATCH", p.as_bytes(), b"COUNT", b"1000"]).await?;
                let (v, _) = Value::parse(&r).map_err(|e| e.0.to_string())?;
                let Value::Array(parts) = v else { return Err(format!("{}: SCAN answered {v:?}", m.addr)) };
                let (Some(c), Some(Value::Array(keys))) = (parts.first().and_then(Value::as_bytes), parts.get(1))
                else {
                    return Err(format!("{}: SCAN answered {parts:?}", m.addr));
                };
                for k in keys.iter().filter_map(Value::as_bytes) {
                    // the key is this rule's (not an earlier rule's) and has its plain name
                    let ours = rules.stored_name(k).is_some() && rules.stored_name(k) == mine.stored_name(k);
                    if ours && !todo.iter().any(|t| t == k) {
                        todo.push(k.to_vec());
                    }
                }
                cursor = c.to_vec();
                if cursor == b"0" {
                    break;
                }
            }
        }
    }
    let mut out = Outcome { found: todo.len() as u64, ..Outcome::default() };
    let owner = |key: &[u8]| -> Result<String, String> {
        topo.master_for_slot(slot(key))
            .map(|n| n.addr.to_string())
            .ok_or_else(|| format!("slot {} has no master", slot(key)))
    };
    let mut handled = 0;
    for key in &todo {
        if o.max_keys > 0 && out.moved + out.finished >= o.max_keys {
            break;
        }
        let Some(new) = rules.stored_name(key) else { continue };
        let (from, to) = (owner(key)?, owner(&new)?);
        handled += 1;
        (o.progress)(handled, out.found);
        if o.dry_run {
            if nodes.ask(&to, &[b"EXISTS", &new]).await?.as_ref() == b":1\r\n" {
                // a copy an earlier run made is not a conflict
                let (a, b) = (nodes.ask(&from, &[b"DUMP", key]).await?, nodes.ask(&to, &[b"DUMP", &new]).await?);
                match a == b {
                    true => out.finished += 1,
                    false => out.conflicts.push((key.clone(), new)),
                }
            }
            continue;
        }
        let dump = nodes.ask(&from, &[b"DUMP", key]).await?;
        if let Some(e) = error_of(&dump) {
            return Err(format!("DUMP {}: {e}", String::from_utf8_lossy(key)));
        }
        let Ok((Value::Bulk(data), _)) = Value::parse(&dump) else {
            out.gone += 1;
            continue;
        };
        let at = nodes.ask(&from, &[b"PEXPIRETIME", key]).await?;
        let at = match Value::parse(&at) {
            Ok((Value::Int(-2), _)) => {
                out.gone += 1;
                continue;
            }
            Ok((Value::Int(t), _)) => t.max(0),
            _ => return Err(format!("PEXPIRETIME {}: {}", String::from_utf8_lossy(key), String::from_utf8_lossy(&at))),
        };
        let at = at.to_string();
        let r = nodes.ask(&to, &[b"RESTORE", &new, at.as_bytes(), data, b"ABSTTL"]).await?;
        match error_of(&r) {
            None => out.moved += 1,
            Some(e) if e.starts_with("BUSYKEY") => {
                // copied by a run that stopped before the delete, or someone else's key
                let theirs = nodes.ask(&to, &[b"DUMP", &new]).await?;
                if theirs != dump {
                    out.conflicts.push((key.clone(), new));
                    continue;
                }
                out.finished += 1;
            }
            Some(e) => return Err(format!("RESTORE {}: {e}", String::from_utf8_lossy(&new))),
        }
        let r = nodes.ask(&from, &[b"DEL", key]).await?;
        if let Some(e) = error_of(&r) {
            return Err(format!("DEL {}: {e}", String::from_utf8_lossy(key)));
        }
    }
    Ok(out)
}
