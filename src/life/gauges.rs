//! The gauges that are sampled rather than counted, refreshed every second, and the
//! per-second housekeeping that rides on the same tick (idle rate-limit budgets
//! reclaimed, the services' metrics published).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::proxy::Proxy;
use crate::upstream::backend::ConnState;

/// Spawns the once-a-second refresh of [`sample`].
pub fn spawn_gauges(proxy: Arc<Proxy>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            sample(&proxy);
        }
    });
}

/// One refresh of the sampled gauges.
pub fn sample(proxy: &Proxy) {
    let g = crate::metrics::global();
    g.uptime.set(proxy.started.elapsed().as_secs_f64());
    g.clients.set(proxy.stats.clients.load(Ordering::Relaxed) as f64);
    g.slot_map_version.set(proxy.cluster.version() as f64);
    proxy.ratelimit.reclaim();
    proxy.ratelimit.publish_metrics();
    let fleet = proxy.fleet.view();
    g.fleet_members.set(fleet.members as f64);
    if let Some(at) = fleet.synced.filter(|_| proxy.fleet.enabled()) {
        g.fleet_sync_age.set(at.elapsed().as_secs_f64());
    }
    g.ratelimit_keys.set(proxy.ratelimit.tracked_keys() as f64);
    proxy.cache.publish_metrics();
    proxy.locks.publish_metrics();
    proxy.migration.publish_metrics();
    for node in proxy.cluster.pools() {
        let (mut up, mut connecting, mut down) = (0, 0, 0);
        for (_, b) in node.connections() {
            match b.stats.state() {
                ConnState::Up => up += 1,
                ConnState::Connecting => connecting += 1,
                ConnState::Down => down += 1,
            }
        }
        crate::metrics::set_backend_connections(&node.addr, up, connecting, down);
    }
}
