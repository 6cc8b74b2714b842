//! `backfill`: every key of the source copied to the target ([`super::copy`]: versioned,
//! so a copy never replaces a newer one), resumable, paced if asked.
//!
//! - The source's masters are scanned one after another (`SCAN`, batches of
//!   [`BATCH`]); each batch is read on the source in one pipelined round trip and written
//!   on the target in one per target master.
//! - **Progress is kept in the target** (`{heatshield:migration}backfill`, a hash): each
//!   source master's `SCAN` cursor after its last finished batch, whether its scan is
//!   done, and the keys and bytes copied. A run that stopped (killed, an error,
//!   `max_keys`) is resumed by the next from those cursors: at most one batch is copied
//!   again, which the versions make harmless. A master that is not there any more (a
//!   failover changed the address) is scanned from the start. `restart` forgets the
//!   progress.
//! - **Pacing**: `rate` keys a second at most (0: as fast as the nodes answer), so the
//!   source's clients keep their latency.
//! - heatshield's own keys (`{heatshield:...`) are not copied.

use std::time::{Duration, Instant};

use super::copy::{Copied, copy_batch};
use super::{Clusters, int, scan_reply};
use crate::protocol::reply::Value;

/// Keys per `SCAN` batch.
pub const BATCH: usize = 500;

/// The target's key that holds the progress.
pub const PROGRESS_KEY: &[u8] = b"{heatshield:migration}backfill";

/// Options of one run.
pub struct Options {
    /// Forget the progress of earlier runs and start over.
    pub restart: bool,
    /// Keys a second at most; 0: no limit.
    pub rate: u64,
    /// Stop after this many keys (0: all); the next run goes on.
    pub max_keys: u64,
    /// Called after each batch with (keys done, keys of the source, bytes copied, slots
    /// done: those of the masters whose every key has been copied, this run or before).
    pub progress: Box<dyn FnMut(u64, u64, u64, u64) + Send>,
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub copied: Copied,
    /// Keys looked at by this run.
    pub keys: u64,
    /// Keys and bytes of every run so far (from the progress in the target).
    pub keys_total: u64,
    pub bytes_total: u64,
    /// Masters whose scan this run took up where an earlier one stopped, out of all.
    pub resumed: usize,
    pub masters: usize,
    /// Every master's scan is done.
    pub complete: bool,
    pub took: Duration,
}

impl Report {
    /// The report as `heatshield migrate backfill` prints it.
    pub fn render(&self) -> String {
        let c = &self.copied;
        let secs = self.took.as_secs_f64().max(1e-9);
        let mut s = format!(
            "backfill: {}: {} keys looked at in {:.1} s ({:.0} keys/s): {} copied, {} kept (the target's copy was as new), {} gone from the source, {} big keys in pieces, {:.1} MB read; {} failed\n",
            if self.complete { "complete" } else { "stopped, run it again to go on" },
            self.keys,
            secs,
            self.keys as f64 / secs,
            c.applied,
            c.kept,
            c.gone,
            c.big,
            c.bytes as f64 / 1e6,
            c.failed
        );
        s += &format!(
            "all runs: {} keys, {:.1} MB; this run resumed {} of {} masters' scans\n",
            self.keys_total,
            self.bytes_total as f64 / 1e6,
            self.resumed,
            self.masters
        );
        for (k, why) in &c.first_failures {
            s += &format!("failed: {}: {why}\n", crate::protocol::reply::quoted(k));
        }
        s
    }
}

/// Runs `backfill` from `source` to `target`.
pub async fn run(clusters: Clusters, mut o: Options) -> Result<Report, String> {
    let started = Instant::now();
    let (mut src, mut dst) = clusters.open("backfill").await?;
    if o.restart {
        dst.ask_for(PROGRESS_KEY, vec![b"DEL", PROGRESS_KEY]).await?;
    }
    let saved = dst.ask_for(PROGRESS_KEY, vec![b"HGETALL", PROGRESS_KEY]).await?;
    let saved: Vec<(Vec<u8>, Vec<u8>)> = match Value::parse(&saved) {
        Ok((Value::Array(v), _)) => v
            .chunks(2)
            .filter_map(|p| Some((p.first()?.as_bytes()?.to_vec(), p.get(1)?.as_bytes()?.to_vec())))
            .collect(),
        _ => return Err(format!("the progress on the target: {}", String::from_utf8_lossy(&saved).trim_end())),
    };
    let field = |name: &str| saved.iter().find(|(k, _)| k == name.as_bytes()).map(|(_, v)| v.clone());
    let mut report = Report::default();
    let mut total = 0;
    let masters = src.masters();
    for m in &masters {
        total += int(&src.ask(m, vec![b"DBSIZE"]).await?).unwrap_or(0).max(0) as u64;
    }
    report.masters = masters.len();
    // the slots a master serves, for the progress by slot
    let slot_counts: std::collections::HashMap<std::sync::Arc<str>, u64> = {
        let topo = src.cluster.topology();
        let mut h = std::collections::HashMap::new();
        for s in 0..crate::upstream::cluster::slot::SLOTS as u16 {
            if let Some(n) = topo.master_for_slot(s) {
                *h.entry(n.addr.clone()).or_default() += 1;
            }
        }
        h
    };
    let slots_of = |m: &std::sync::Arc<str>| slot_counts.get(m).copied().unwrap_or(0);
    let mut slots_done: u64 = masters.iter().filter(|m| field(&format!("done:{m}")).is_some()).map(slots_of).sum();
    let mut done_keys = 0u64;
    let mut complete = true;
    'masters: for m in &masters {
        if field(&format!("done:{m}")).is_some() {
            report.resumed += 1;
            continue;
        }
        let mut cursor = field(&format!("cursor:{m}")).unwrap_or_else(|| b"0".to_vec());
        if cursor != b"0" {
            report.resumed += 1;
        }
        loop {
            if o.max_keys > 0 && report.keys >= o.max_keys {
                complete = false;
                break 'masters;
            }
            let count = BATCH.to_string();
            let r = src.ask(m, vec![b"SCAN", &cursor, b"COUNT", count.as_bytes()]).await?;
            let (next, mut keys) = scan_reply(&r).map_err(|e| format!("{m}: SCAN: {e}"))?;
            keys.retain(|k| !crate::command::reserved(k));
            let bytes_before = report.copied.bytes;
            copy_batch(&mut src, &mut dst, m, &keys, false, &mut report.copied).await?;
            report.keys += keys.len() as u64;
            done_keys += keys.len() as u64;
            // the batch is in the target: its cursor is saved after it, never before
            let (n, b) = (keys.len().to_string(), (report.copied.bytes - bytes_before).to_string());
            let (cf, df) = (format!("cursor:{m}"), format!("done:{m}"));
            let mut save: Vec<Vec<&[u8]>> = vec![
                vec![b"HSET", PROGRESS_KEY, cf.as_bytes(), &next],
                vec![b"HINCRBY", PROGRESS_KEY, b"keys", n.as_bytes()],
                vec![b"HINCRBY", PROGRESS_KEY, b"bytes", b.as_bytes()],
            ];
            if next == b"0" {
                save.push(vec![b"HSET", PROGRESS_KEY, df.as_bytes(), b"1"]);
            }
            let owner = dst.owner(PROGRESS_KEY)?;
            let replies = dst.pipe(&owner, &save).await?;
            if let Some(e) = replies.iter().find_map(|r| crate::protocol::reply::error_text(r)) {
                return Err(format!("saving the progress: {}", String::from_utf8_lossy(e)));
            }
            if next == b"0" {
                slots_done += slots_of(m);
            }
            (o.progress)(done_keys, total, report.copied.bytes, slots_done);
            if o.rate > 0 {
                let due = Duration::from_secs_f64(report.keys as f64 / o.rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            cursor = next;
            if cursor == b"0" {
                break;
            }
        }
    }
    let all = dst.ask_for(PROGRESS_KEY, vec![b"HMGET", PROGRESS_KEY, b"keys", b"bytes"]).await?;
    if let Ok((Value::Array(v), _)) = Value::parse(&all) {
        report.keys_total = v.first().and_then(Value::as_int).unwrap_or(0) as u64;
        report.bytes_total = v.get(1).and_then(Value::as_int).unwrap_or(0) as u64;
    }
    report.complete = complete;
    report.took = started.elapsed();
    Ok(report)
}
