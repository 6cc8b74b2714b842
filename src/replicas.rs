//! WAIT: how many replicas have acknowledged everything written so far, asked of the
//! masters without blocking a connection other clients use.
//!
//! Redis's WAIT counts the replicas that acknowledged the offset of the last write of the
//! connection it is sent on; heatshield's backend connections are shared, and a WAIT there
//! would hold every other client's commands behind it for up to its timeout. So WAIT runs
//! on a connection of its own to each master, after the client's earlier commands have
//! their replies (its lane is a way of its own, see crate::order): it reads the master's
//! replication offset (past every write answered so far), then asks the replicas for
//! their acknowledgements (a `WAIT` that cannot be met within 1 ms makes the master send
//! them `REPLCONF GETACK`) and reads them from `INFO replication`, until enough replicas
//! have reached that offset or the timeout ends. The answer is the least count over the
//! masters: every master is asked, not only those the client wrote to (so it never says
//! more than is true of the client's writes). Nothing is written anywhere.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::backend::{self, BackendOptions, BackendReply, ReplyTx, Tag};
use crate::cluster::NodePool;
use crate::protocol::Request;

/// Between two looks at a master's acknowledgements.
const POLL: Duration = Duration::from_millis(2);

/// Answers the request `tag` on `reply_to` with the least number, over `masters`, of
/// replicas that acknowledged all writes before it: once `want` have on every master, or
/// at `deadline` (`None`: no end). Runs as a task of its own.
pub fn spawn(masters: Vec<Arc<NodePool>>, want: i64, deadline: Option<Instant>, reply_to: ReplyTx, tag: Tag) {
    tokio::spawn(async move {
        // every master at once, each on a task of its own
        let asks: Vec<_> = masters
            .into_iter()
            .map(|m| {
                let gone = reply_to.clone();
                tokio::spawn(async move { acked(&m, want, deadline, &gone).await })
            })
            .collect();
        let mut least: Option<i64> = None;
        let mut failed = None;
        for a in asks {
            match a.await {
                Ok(Ok(n)) => least = Some(least.map_or(n, |l| l.min(n))),
                Ok(Err(e)) => failed = Some(e),
                Err(e) => failed = Some(e.to_string()),
            }
        }
        let reply = match (failed, least) {
            (Some(e), _) => format!("-ERR heatshield: WAIT could not ask a master: {e}\r\n"),
            (None, n) => format!(":{}\r\n", n.unwrap_or(0)),
        };
        let _ = reply_to.send(BackendReply::one(tag, Ok(Bytes::from(reply))));
    });
}

/// How many replicas of `node` acknowledged its replication offset as it is now: as soon
/// as `want` have, or at `deadline`.
/// Stops (with the count so far) when the client has gone (`gone` closed).
async fn acked(node: &NodePool, want: i64, deadline: Option<Instant>, gone: &ReplyTx) -> Result<i64, String> {
    let opts = BackendOptions { resp3: false, ..node.options().clone() };
    let timeout = opts.command_timeout;
    let (mut s, _) = tokio::time::timeout(timeout, backend::connect(&node.addr, &opts))
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| e.to_string())?;
    let mut ask = async |args: &[&str]| -> Result<Bytes, String> {
        tokio::time::timeout(timeout, backend::roundtrip(&mut s, Request::from_args(args).raw()))
            .await
            .map_err(|_| "timeout".to_string())?
            .map_err(|e| e.to_string())
    };
    let info = ask(&["INFO", "replication"]).await?;
    let (target, _) = offsets(&info).ok_or("no master_repl_offset in INFO replication")?;
    loop {
        // have the replicas acknowledge now, not at their next second: a WAIT no replica
        // count can meet blocks 1 ms, and the master sends them GETACK (also before the
        // first count: an acknowledgement a second old may not have the last write)
        ask(&["WAIT", "1000000", "1"]).await?;
        tokio::time::sleep(POLL).await;
        let info = ask(&["INFO", "replication"]).await?;
        let (_, replicas) = offsets(&info).ok_or("no master_repl_offset in INFO replication")?;
        let n = replicas.iter().filter(|&&o| o >= target).count() as i64;
        if n >= want || deadline.is_some_and(|d| Instant::now() >= d) || gone.is_closed() {
            return Ok(n);
        }
    }
}

/// `master_repl_offset`, and each online replica's acknowledged `offset`, from `INFO
/// replication`.
fn offsets(info: &[u8]) -> Option<(i64, Vec<i64>)> {
    let text = std::str::from_utf8(info).ok()?;
    let mut master = None;
    let mut replicas = Vec::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("master_repl_offset:") {
            master = v.trim().parse().ok();
        } else if line.starts_with("slave") && line.contains("state=online") {
            let off: Option<i64> =
                line.split(',').find_map(|kv| kv.strip_prefix("offset=")).and_then(|v| v.trim().parse().ok());
            replicas.extend(off);
        }
    }
    Some((master?, replicas))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_read_from_info_replication() {
        let info = b"$300\r\n# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=7001,state=online,offset=150,lag=0\r\nslave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\nmaster_failover_state:no-failover\r\nmaster_repl_offset:151\r\n";
        assert_eq!(offsets(info), Some((151, vec![150])));
        assert_eq!(offsets(b"$5\r\nrole:\r\n"), None);
    }
}
