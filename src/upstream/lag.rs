//! Replication lag of the replicas that serve reads (docs/replicas.md): for each replica
//! in the slot map's readers, a task asks its master and then the replica for their
//! replication offsets (`INFO replication`) every `backend.replica_check_interval_ms`,
//! on connections of its own, and publishes in the replica's pool
//! ([`NodePool::synced_at`]) the time of the latest master sample the replica has reached.
//!
//! Why this measure: a sample `(t, M)` is taken by reading the master's
//! `master_repl_offset` M with the clock read at `t` *before* the question was sent. Every
//! write whose reply heatshield had received before `t` was applied before the master
//! answered, so it is within M. A replica whose `slave_repl_offset` R is at least M has
//! applied it. So a replica whose `synced_at` is later than a client's last write has
//! that write (read-your-writes, with no `WAIT`), and `now - synced_at` bounds how far
//! behind it is (the lag the read policies compare with their limit). A replica that
//! does not answer, or whose link to its master is down, has `synced_at` 0; one that
//! stops answering ages past any limit by itself.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{debug, info};

use bytes::Bytes;

use crate::upstream::backend::clock_ms;
use crate::upstream::cluster::{Cluster, NodePool};
use crate::upstream::side::Side;

/// How often the slot map is read again while a master has no replica known.
const ASK_AGAIN: Duration = Duration::from_secs(2);

/// Starts the checker: one task per replica that serves reads, kept in step with the
/// slot map. `every`: the interval; `keep`: how far back samples are kept (the largest
/// lag any policy accepts).
pub fn spawn(cluster: Arc<Cluster>, every: Duration, keep: Duration) {
    let me = Arc::downgrade(&cluster);
    drop(cluster);
    tokio::spawn(async move {
        // replica address -> (its master's address, the task)
        let mut tasks: HashMap<String, (Arc<str>, tokio::task::JoinHandle<()>)> = HashMap::new();
        let mut last_asked: Option<Instant> = None;
        loop {
            let Some(c) = me.upgrade() else { break };
            let topo = c.topology();
            let mut wanted: HashMap<String, (Arc<NodePool>, Arc<NodePool>)> = HashMap::new();
            for (m, readers) in topo.masters.iter().zip(&topo.readers) {
                for r in readers {
                    wanted.insert(r.addr.to_string(), (m.clone(), r.clone()));
                }
            }
            if topo.readers.iter().any(Vec::is_empty) && last_asked.is_none_or(|t| t.elapsed() > ASK_AGAIN) {
                // a master with no replica known (yet: a new replica is announced by the
                // cluster bus within seconds): look again sooner than the periodic refresh
                c.request_refresh();
                last_asked = Some(Instant::now());
            }
            drop(topo);
            tasks.retain(|addr, (master, task)| {
                let keep = wanted.get(addr).is_some_and(|(m, _)| m.addr == *master);
                if !keep {
                    task.abort();
                }
                keep
            });
            for (addr, (m, r)) in wanted {
                if tasks.contains_key(&addr) {
                    continue;
                }
                let master = m.addr.clone();
                info!(replica = %addr, master = %master, "watching the replica's lag for reads");
                let task = tokio::spawn(watch(m, r, every, keep));
                tasks.insert(addr, (master, task));
            }
            drop(c);
            tokio::time::sleep(every.max(Duration::from_millis(50)) * 5).await;
        }
        for (_, (_, t)) in tasks {
            t.abort();
        }
    });
}

/// Samples of a master's offset, newest last.
struct Samples {
    list: VecDeque<(u64, u64)>,
    keep_ms: u64,
}

impl Samples {
    fn push(&mut self, at: u64, offset: u64) {
        self.list.push_back((at, offset));
        while self.list.front().is_some_and(|&(t, _)| at.saturating_sub(t) > self.keep_ms) && self.list.len() > 1 {
            self.list.pop_front();
        }
    }

    /// The latest sample time whose offset `reached` covers (0: none kept).
    fn reached(&self, reached: u64) -> u64 {
        self.list.iter().rev().find(|&&(_, m)| m <= reached).map_or(0, |&(t, _)| t)
    }
}

/// One replica's watch: samples its master, then asks the replica, every `every`.
async fn watch(master: Arc<NodePool>, replica: Arc<NodePool>, every: Duration, keep: Duration) {
    let gauge = metrics::gauge!("heatshield_replica_lag_seconds", "node" => replica.addr.to_string());
    let mut samples =
        Samples { list: VecDeque::new(), keep_ms: keep.as_millis() as u64 + 2 * every.as_millis() as u64 };
    // a question unanswered within this long counts as down (the replica ages meanwhile)
    let opts = master.options();
    let timeout = every.max(Duration::from_millis(100)).min(opts.command_timeout);
    let mut to_master = Side::new(master.addr.clone(), opts, "lag").timeout(timeout);
    let mut to_replica = Side::new(replica.addr.clone(), opts, "lag").timeout(timeout);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let at = clock_ms(Instant::now());
        match offset(&mut to_master, b"master_repl_offset:").await {
            Some(m) => samples.push(at, m),
            None => {
                // no sample: the replica's standing is unknown from here on, and ages
                debug!(master = %master.addr, "replication offset of the master not read");
            }
        }
        let synced = match replica_offset(&mut to_replica).await {
            Some(r) => samples.reached(r),
            None => 0,
        };
        if synced == 0 {
            replica.synced_at.store(0, Ordering::SeqCst);
            gauge.set(-1.0);
        } else {
            replica.synced_at.fetch_max(synced, Ordering::SeqCst);
            gauge
                .set(clock_ms(Instant::now()).saturating_sub(replica.synced_at.load(Ordering::SeqCst)) as f64 / 1000.0);
        }
    }
}

/// `field` (an offset) of `INFO replication` on the connection's node.
async fn offset(side: &mut Side, field: &[u8]) -> Option<u64> {
    let text = info(side).await?;
    number(&text, field)
}

/// A replica's `slave_repl_offset`, if its link to its master is up.
async fn replica_offset(side: &mut Side) -> Option<u64> {
    let text = info(side).await?;
    if !contains(&text, b"master_link_status:up") {
        return None;
    }
    number(&text, b"slave_repl_offset:")
}

async fn info(side: &mut Side) -> Option<Bytes> {
    match side.call(&["INFO", "replication"]).await {
        Ok(reply) if reply.first() == Some(&b'$') => Some(reply),
        _ => {
            side.close();
            None
        }
    }
}

fn contains(text: &[u8], what: &[u8]) -> bool {
    text.windows(what.len()).any(|w| w == what)
}

/// The number after `field` in an INFO text.
fn number(text: &[u8], field: &[u8]) -> Option<u64> {
    let at = text.windows(field.len()).position(|w| w == field)? + field.len();
    let digits: Vec<u8> = text[at..].iter().copied().take_while(u8::is_ascii_digit).collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_is_synced_to_the_latest_sample_it_reached() {
        let mut s = Samples { list: VecDeque::new(), keep_ms: 1000 };
        s.push(100, 10);
        s.push(200, 20);
        s.push(300, 30);
        assert_eq!(s.reached(5), 0, "behind every sample kept");
        assert_eq!(s.reached(10), 100);
        assert_eq!(s.reached(29), 200);
        assert_eq!(s.reached(30), 300);
        assert_eq!(s.reached(99), 300);
        // old samples go, the newest stays
        s.push(2000, 40);
        assert_eq!(s.list.len(), 1);
        assert_eq!(s.reached(35), 0);
    }

    #[test]
    fn reads_fields_of_info() {
        let t = b"$90\r\n# Replication\r\nrole:slave\r\nmaster_link_status:up\r\nslave_repl_offset:1234\r\nmaster_repl_offset:1240\r\n";
        assert_eq!(number(t, b"slave_repl_offset:"), Some(1234));
        assert_eq!(number(t, b"master_repl_offset:"), Some(1240));
        assert!(contains(t, b"master_link_status:up"));
        assert_eq!(number(t, b"nope:"), None);
    }
}
