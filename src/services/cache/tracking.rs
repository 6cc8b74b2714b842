//! The cache's background tasks: one invalidation connection per master (RESP3, named
//! `heatshield-invalidations`, the target every backend connection's tracking redirects
//! to), the task that lands fills, and the detection window clock.
//!
//! An invalidation task lives while its node is a master of the current topology: when
//! the node leaves (failover, removal), the task closes its connection and ends, and no
//! task reconnects to a node that left.
//!
//! The same connections serve client-side caching ([`super::clients`]): once some client
//! has turned CLIENT TRACKING on, each one also turns `CLIENT TRACKING on BCAST` on for
//! itself, so Redis reports every key written on its node, and hands the keys to the
//! tracking clients' table as well. They then run even with the hot-key cache disabled.
//!
//! While a node's invalidation connection is up, its id is published in the node's
//! [`NodeTracking`](crate::upstream::backend::NodeTracking) so new backend connections redirect to it, and
//! connections made earlier are switched to it. When it breaks, the id is withdrawn and
//! the node's generation bumped: everything cached from the node is dropped, and no read
//! from it fills the cache until a new invalidation connection is up and connections are
//! redirected to it again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::clients::ClientSide;
use super::{Cause, HotCache};
use crate::mailbox::Tag;
use crate::protocol::Request;
use crate::protocol::reply::{Value, error_text};
use crate::upstream::backend::{BackendRequest, Prefix};
use crate::upstream::cluster::Cluster;
use crate::upstream::cluster::NodePool;
use crate::upstream::side::Side;

/// What the cache's tasks use: the cache, the tracking clients' table and the cluster
/// view, nothing else of the proxy.
struct Handles {
    cache: Arc<HotCache>,
    clients: Arc<ClientSide>,
    cluster: Arc<Cluster>,
}

/// Starts the cache's tasks on the current runtime (the control runtime): the fills and
/// the detection clock when the cache is on; the invalidation connections when the cache
/// is on or, from the first CLIENT TRACKING on, for client-side caching.
pub fn start(cache: Arc<HotCache>, clients: Arc<ClientSide>, cluster: Arc<Cluster>) {
    let h = Arc::new(Handles { cache, clients, cluster });
    if h.cache.enabled {
        start_cache(h.clone());
    }
    let mut wanted = h.clients.wanted();
    tokio::spawn(async move {
        // one invalidation task per current master; a task ends by itself when its node
        // is no longer a master
        while !h.cache.enabled && !*wanted.borrow() {
            if wanted.changed().await.is_err() {
                return;
            }
        }
        let mut running: HashMap<Arc<str>, tokio::task::JoinHandle<()>> = HashMap::new();
        loop {
            running.retain(|_, t| !t.is_finished());
            let masters: Vec<Arc<NodePool>> = h.cluster.topology().masters.clone();
            for pool in masters {
                if !running.contains_key(&pool.addr) {
                    running.insert(pool.addr.clone(), tokio::spawn(invalidations(h.clone(), pool)));
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// The hot-key cache's own tasks: landing fills, the detection window clock.
fn start_cache(h: Arc<Handles>) {
    let (tx, mut rx) = crate::mailbox::reply_channel();
    if h.cache.fill_tx.set(tx).is_err() {
        return; // already started
    }
    let p = h.clone();
    tokio::spawn(async move {
        while let Some(r) = rx.recv().await {
            if let Some(r) = r.into_reply() {
                p.cache.fill_done(r);
            }
        }
    });
    let p = h.clone();
    tokio::spawn(async move {
        let window = Duration::from_millis(p.cache.cfg.window_ms);
        let mut tick = tokio::time::interval(window);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut last = Instant::now();
        loop {
            tick.tick().await;
            let now = Instant::now();
            p.cache.roll(now - last);
            last = now;
        }
    });
}

/// Whether `pool` is (still) one of the topology's masters.
fn is_master(h: &Handles, pool: &Arc<NodePool>) -> bool {
    h.cluster.topology().masters.iter().any(|m| Arc::ptr_eq(m, pool))
}

/// Keeps `pool`'s invalidation connection up and applies what it reports, while the node
/// is a master.
async fn invalidations(h: Arc<Handles>, pool: Arc<NodePool>) {
    let mut side = Side::new(pool.addr.clone(), pool.options(), "invalidations").resp3();
    while is_master(&h, &pool) {
        if let Err(e) = serve(&h, &pool, &mut side).await {
            debug!(node = %pool.addr, error = %e, "invalidation connection failed");
        }
        side.close();
        side.backoff.wait().await;
    }
    debug!(node = %pool.addr, "node left the topology; its invalidation task ends");
}

/// One invalidation connection's life. Returns when it breaks.
async fn serve(h: &Handles, pool: &Arc<NodePool>, s: &mut Side) -> std::io::Result<()> {
    let reply = s.call(&["CLIENT", "ID"]).await?;
    let id = match Value::parse(&reply) {
        Ok((Value::Int(id), _)) if id > 0 => id as u64,
        _ => return Err(std::io::Error::other("unexpected CLIENT ID reply")),
    };
    // client-side caching: every key written on the node, from now on (asked before any
    // connection redirects here, so the reply is the next frame)
    let mut wanted = h.clients.wanted();
    let mut bcast_asked = false;
    let mut _reporting = None;
    if *wanted.borrow_and_update() {
        let r = s.call_raw(BCAST.raw(), 1).await?;
        bcast_on(h, pool, r.first().map_or(&b""[..], |r| &r[..]))?;
        _reporting = Some(h.clients.reporting_on());
        bcast_asked = true;
    }
    let tracking = &pool.tracking;
    tracking.redirect.store(id, Ordering::SeqCst);
    info!(node = %pool.addr, client_id = id, "invalidation connection up");

    // Connections made before now report to no one (or to a dead connection): switch
    // them over. Until one answers, its reads do not fill the cache.
    let (rearm_tx, mut rearm_rx) = crate::mailbox::reply_channel();
    let mut conns = Vec::new();
    let cmd = Request::from_args(&["CLIENT", "TRACKING", "on", "REDIRECT", &id.to_string(), "OPTIN"]);
    for (_, b) in pool.connections() {
        if b.stats.tracking_id.load(Ordering::SeqCst) != id {
            b.send(BackendRequest {
                data: cmd.raw().clone(),
                count: 1,
                prefix: Prefix::None,
                tag: Tag { seq: conns.len() as u64, part: 0 },
                reply_to: rearm_tx.clone(),
                order: None,
                db: 0,
            });
            conns.push(b.stats.clone());
        }
    }

    let mut check = tokio::time::interval(Duration::from_secs(1));
    let result = loop {
        tokio::select! {
            r = wanted.changed(), if !bcast_asked => {
                if r.is_ok() && *wanted.borrow_and_update() {
                    // its reply comes among the invalidations (see `apply`)
                    if let Err(e) = s.send(BCAST.raw()).await {
                        break Err(e);
                    }
                    bcast_asked = true;
                }
            }
            _ = check.tick() => {
                if !is_master(h, pool) {
                    break Ok(());
                }
            }
            r = s.frame() => {
                let frame = match r {
                    Ok(f) => f,
                    Err(e) => break Err(e),
                };
                if matches!(frame.first(), Some(b'+' | b'-')) {
                    // the only command sent here since setup: BCAST's reply
                    if let Err(e) = bcast_on(h, pool, &frame) {
                        break Err(e);
                    }
                    _reporting = Some(h.clients.reporting_on());
                } else {
                    apply(h, pool, &frame);
                }
            }
            Some(r) = rearm_rx.recv() => {
                let Some(r) = r.into_reply() else { continue };
                if let (Ok(reply), Some(stats)) = (&r.result, conns.get(r.tag.seq as usize))
                    && error_text(reply).is_none()
                {
                    stats.tracking_id.store(id, Ordering::SeqCst);
                }
            }
        }
    };
    finish(h, pool, result)
}

/// `CLIENT TRACKING on BCAST` for the invalidation connection itself.
static BCAST: std::sync::LazyLock<Request> =
    std::sync::LazyLock::new(|| Request::from_args(&["CLIENT", "TRACKING", "on", "BCAST"]));

/// BCAST's reply: from now on every key written on the node is reported. What tracking
/// clients read from the node before now may have changed unseen: they drop everything.
fn bcast_on(h: &Handles, pool: &NodePool, reply: &[u8]) -> std::io::Result<()> {
    if let Some(e) = error_text(reply) {
        return Err(std::io::Error::other(format!("CLIENT TRACKING on BCAST: {}", String::from_utf8_lossy(e))));
    }
    info!(node = %pool.addr, "invalidations for every key (client-side caching)");
    h.clients.flush_all();
    Ok(())
}

fn finish(h: &Handles, pool: &NodePool, result: std::io::Result<()>) -> std::io::Result<()> {
    pool.tracking.redirect.store(0, Ordering::SeqCst);
    h.cache.drop_node(pool, Cause::Connection);
    if h.clients.active() {
        // invalidations from the node may be lost from here on
        h.clients.flush_all();
    }
    match &result {
        Err(e) => {
            warn!(node = %pool.addr, error = %e, "invalidation connection lost; dropped what was cached from the node")
        }
        Ok(()) => info!(node = %pool.addr, "invalidation connection closed"),
    }
    result
}

/// Applies one frame from the invalidation connection: `>2 invalidate [keys]`, or
/// `>2 invalidate <null>` when the node was flushed.
fn apply(h: &Handles, pool: &NodePool, frame: &[u8]) {
    if frame.first() != Some(&b'>') {
        return;
    }
    let Ok((Value::Array(items), _)) = Value::parse(frame) else { return };
    if items.first().and_then(|v| v.as_bytes()) != Some(&b"invalidate"[..]) {
        return;
    }
    match items.get(1) {
        Some(Value::Array(keys)) => {
            let keys: Vec<&[u8]> = keys.iter().filter_map(|k| k.as_bytes()).collect();
            if h.cache.enabled {
                for k in &keys {
                    h.cache.invalidate(k, Cause::Tracking);
                }
            }
            if h.clients.active() {
                h.clients.invalidate(&keys);
            }
        }
        _ => {
            h.cache.drop_node(pool, Cause::Flush);
            if h.clients.active() {
                h.clients.flush_all();
            }
        }
    }
}
