//! The command table learned from the cluster: at start (waited for at most
//! [`FIRST_WAIT`]), and whenever a master's version
//! or command count changes (an upgrade, a module loaded), heatshield reads `COMMAND`
//! from every master and gives the command table what they all agree on
//! ([`crate::command::CommandTable::learn`]). The check is two small requests per master
//! each `backend.refresh_interval_ms`, on a connection of its own, never on the request
//! path. The same check reads how many databases the masters have (Valkey 9's
//! `cluster-databases`, a standalone server's `databases`): SELECT accepts that many.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::command::learned;
use crate::proxy::Proxy;
use crate::upstream::side::Side;

/// What one master said about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    addr: String,
    /// `valkey 9.1.2`, `redis 7.0.15`.
    version: String,
    /// `COMMAND COUNT`: changes when a module adds commands.
    count: i64,
    /// Its databases (1 where it has no setting for them, or does not say).
    databases: u32,
}

/// How long start-up waits for the first learning (the masters' `COMMAND`): a master
/// that does not answer delays heatshield's start no longer than this; the learning goes
/// on in the background.
const FIRST_WAIT: Duration = Duration::from_secs(1);

/// Learns from the masters, then keeps watching them, in a task of its own; returns once
/// the first learning is done, or after [`FIRST_WAIT`].
pub async fn start(proxy: Arc<Proxy>) {
    let every = Duration::from_millis(proxy.config.backend.refresh_interval_ms.max(100));
    let weak = Arc::downgrade(&proxy);
    drop(proxy);
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut first = Some(first_tx);
        loop {
            let Some(proxy) = weak.upgrade() else { return };
            if let Err(e) = check(&proxy, &mut seen).await {
                if first.is_some() {
                    warn!(error = %e, "could not learn the servers' commands yet; the generated table serves until they answer");
                } else {
                    tracing::debug!(error = %e, "command table check failed");
                }
            }
            drop(proxy);
            if let Some(tx) = first.take() {
                let _ = tx.send(());
            }
            tokio::time::sleep(every).await;
        }
    });
    let _ = tokio::time::timeout(FIRST_WAIT, first_rx).await;
}

/// Asks every master its version and command count; learns the commands again if they
/// changed since `seen` (one connection per master, closed after).
async fn check(proxy: &Proxy, seen: &mut Vec<Seen>) -> Result<(), String> {
    let masters: Vec<Arc<crate::upstream::cluster::NodePool>> = proxy.cluster.topology().masters.to_vec();
    if masters.is_empty() {
        return Err("no master known yet".into());
    }
    let mut conns = Vec::with_capacity(masters.len());
    let mut now = Vec::with_capacity(masters.len());
    for m in &masters {
        let mut c = Conn::open(m).await.map_err(|e| format!("{}: {e}", m.addr))?;
        now.push(c.seen().await.map_err(|e| format!("{}: {e}", m.addr))?);
        conns.push(c);
    }
    let databases = now.iter().map(|s| s.databases).min().unwrap_or(1).max(1);
    let was = proxy.databases.swap(databases, std::sync::atomic::Ordering::Relaxed);
    if was != databases {
        info!(databases, "databases the masters have");
    }
    let mut sorted = now.clone();
    sorted.sort_by(|a, b| a.addr.cmp(&b.addr));
    if *seen == sorted {
        return Ok(());
    }
    let mut per_master = Vec::with_capacity(masters.len());
    for c in &mut conns {
        let reply = c.ask(&["COMMAND"]).await.map_err(|e| format!("{}: {e}", c.addr))?;
        per_master.push(learned::parse_commands(&reply).map_err(|e| format!("{}: {e}", c.addr))?);
    }
    let (defs, disagreed) = learned::agreed(&per_master);
    let servers: Vec<String> = sorted.iter().map(|s| format!("{} {}", s.addr, s.version)).collect();
    let learning = proxy.commands.learn(&defs, disagreed, servers.clone());
    info!(
        servers = ?servers,
        added = learning.added.len(),
        arity_changed = ?learning.arity_changed,
        refused = learning.refused.len(),
        "command table learned from the masters"
    );
    if !learning.disagreed.is_empty() {
        warn!(commands = ?learning.disagreed, "the masters disagree on these commands (a rolling upgrade?): refused until they agree");
    }
    *seen = sorted;
    Ok(())
}

/// A connection of the learner's own to one master.
struct Conn {
    addr: String,
    side: Side,
}

impl Conn {
    async fn open(node: &crate::upstream::cluster::NodePool) -> Result<Conn, String> {
        let mut side = Side::new(node.addr.clone(), node.options(), "learn");
        side.open().await.map_err(|e| e.to_string())?;
        Ok(Conn { addr: node.addr.to_string(), side })
    }

    async fn ask(&mut self, args: &[&str]) -> Result<bytes::Bytes, String> {
        self.side.call(args).await.map_err(|e| e.to_string())
    }

    /// The master's version and command count.
    async fn seen(&mut self) -> Result<Seen, String> {
        let info = self.ask(&["INFO", "server"]).await?;
        let count = self.ask(&["COMMAND", "COUNT"]).await?;
        let count = crate::protocol::reply::Value::parse(&count)
            .ok()
            .and_then(|(v, _)| v.as_int())
            .ok_or("COMMAND COUNT: not an integer")?;
        // (cluster mode has database 0 only, unless Valkey 9's cluster-databases says more)
        let setting = if String::from_utf8_lossy(&info).contains("redis_mode:cluster") {
            "cluster-databases"
        } else {
            "databases"
        };
        let databases = databases_of(&self.ask(&["CONFIG", "GET", setting]).await?);
        Ok(Seen { addr: self.addr.clone(), version: version_of(&info), count, databases })
    }
}

/// The value of a `CONFIG GET` reply for one setting: 1 if there is none (Redis 7's
/// cluster mode), or CONFIG is refused (managed services rename it).
fn databases_of(reply: &[u8]) -> u32 {
    use crate::protocol::reply::Value;
    let value = match Value::parse(reply) {
        Ok((Value::Array(v), _)) => v.get(1).and_then(Value::as_int),
        Ok((Value::Map(v), _)) => v.first().and_then(|(_, v)| v.as_int()),
        _ => None,
    };
    value.and_then(|n| u32::try_from(n).ok()).unwrap_or(1).max(1)
}

/// `valkey 9.1.2` or `redis 7.0.15` from an `INFO server` reply.
fn version_of(info: &[u8]) -> String {
    let text = String::from_utf8_lossy(info);
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')).map(|v| v.trim().to_string()))
    };
    match (field("valkey_version"), field("redis_version")) {
        (Some(v), _) => format!("valkey {v}"),
        (None, Some(v)) => format!("redis {v}"),
        _ => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn databases_are_read_from_config_get() {
        assert_eq!(databases_of(b"*2\r\n$17\r\ncluster-databases\r\n$2\r\n16\r\n"), 16);
        assert_eq!(databases_of(b"%1\r\n$9\r\ndatabases\r\n$1\r\n4\r\n"), 4);
        assert_eq!(databases_of(b"*0\r\n"), 1);
        assert_eq!(databases_of(b"-ERR unknown command 'CONFIG'\r\n"), 1);
        assert_eq!(databases_of(b"*2\r\n$9\r\ndatabases\r\n$1\r\n0\r\n"), 1);
    }
}
