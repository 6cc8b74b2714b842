//! Start-up, in order: the listeners (bound, or taken over), the cluster's first slot
//! map, the shared state and every background task, the command table learned from the
//! masters, then the workers; and, once a signal or a takeover ends the serving, the
//! drain and the exit code.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::{error, info, warn};

use crate::config::{Config, Overrides};
use crate::life::drain::{drain, shutdown_signal};
use crate::life::gauges::spawn_gauges;
use crate::life::listen::{Bound, listen};
use crate::life::reloaders::{spawn_reloader, spawn_tls_reloader};
use crate::proxy::Proxy;
use crate::upstream::backend::BackendOptions;
use crate::upstream::cluster::Cluster;
use crate::upstream::side::Side;

/// The options of heatshield's connections to the nodes, from the configuration; `Err`
/// names what cannot be loaded (backend TLS's certificates).
pub fn backend_options(config: &Config) -> Result<BackendOptions, String> {
    let mut opts = BackendOptions {
        connect_timeout: config.connect_timeout(),
        command_timeout: config.command_timeout(),
        username: config.backend.username.clone(),
        password: config.backend.password.clone(),
        resp3: false,
        latency_sample_every: config.metrics.latency_sample_every,
        tracking: None,
        dedicated: false,
        dedicated_max: config.backend.dedicated_max_per_node,
        dedicated_idle: config.backend.dedicated_idle_per_node,
        tls: None,
        readonly: false,
        flush_delay: std::time::Duration::from_millis(config.backend.flush_delay_ms),
    };
    if let Some(files) = config.backend.tls_files() {
        let c =
            crate::tls::Connector::new(files).map_err(|e| format!("backend TLS: cannot load the certificates: {e}"))?;
        opts.tls = Some(Arc::new(c));
    }
    Ok(opts)
}

/// Serves until a signal (then drains) or a takeover (then hands over at once); the
/// process's exit code: 0 after serving, 1 when start-up failed (logged).
pub async fn run(config: Config, config_path: Option<PathBuf>, overrides: Overrides) -> i32 {
    let config_file = config_path.as_ref().map(|p| p.display().to_string());
    let opts = match backend_options(&config) {
        Ok(o) => o,
        Err(e) => {
            error!("{e}");
            return 1;
        }
    };
    let acceptor = match config.tls.files().map(crate::tls::Acceptor::new) {
        Some(Ok(a)) => Some(Arc::new(a)),
        Some(Err(e)) => {
            error!(error = %e, "TLS listener: cannot load the certificates");
            return 1;
        }
        None => None,
    };
    let workers = crate::worker::count(config.server.threads);
    let Some(bound) = listen(&config, workers).await else { return 1 };
    let Bound { listeners, http, offer, confirm } = bound;
    let cluster = Cluster::new(config.backing(), opts.clone(), config.backend.connections_per_node, workers);
    let b = &config.backend;
    let reads = crate::services::reads::Reads::new(b.read_from, b.replica_max_lag_ms, &b.read_rules, true);
    if reads.active() {
        // (before the first slot map: each carries the replicas' pools)
        cluster.enable_replica_reads();
        crate::upstream::lag::spawn(
            cluster.clone(),
            std::time::Duration::from_millis(b.replica_check_interval_ms),
            std::time::Duration::from_millis(reads.max_lag_ms()),
        );
    }
    if cluster.is_cluster() {
        // Wait briefly for a first slot map; without one, requests get CLUSTERDOWN until
        // the refresher finds a node.
        match tokio::time::timeout(std::time::Duration::from_secs(5), cluster.refresh()).await {
            Ok(Ok(())) => info!(masters = cluster.topology().masters.len(), "slot map loaded"),
            Ok(Err(e)) => warn!(error = %e, "no seed node answered; will keep trying"),
            Err(_) => warn!("seed nodes did not answer in time; will keep trying"),
        }
    }
    cluster.spawn_refresher(config.refresh_interval());
    let proxy = Arc::new(Proxy::new(config, cluster.clone(), config_file, workers));
    let http = http.map(|l| {
        info!(listen = ?l.local_addr().ok(), "metrics at /metrics, health at /live and /ready");
        tokio::spawn(crate::front::http::serve(proxy.clone(), l))
    });
    spawn_gauges(proxy.clone());
    crate::services::cache::tracking::start(proxy.cache.clone(), proxy.client_side.clone(), proxy.cluster.clone());
    crate::services::locks::start(proxy.locks.clone(), proxy.cluster.clone());
    crate::services::pubsub::start(proxy.pubsub.clone());
    if proxy.config.migration.configured() {
        match proxy.config.migration.options(&opts) {
            Ok(topts) => {
                let m = &proxy.config.migration;
                let target = Cluster::new(m.backing(), topts.clone(), 1, 1);
                // (the copier's own view of the source: the one requests use may serve the
                // target after a cutover)
                let source = Cluster::new(proxy.config.backing(), opts.clone(), 1, 1);
                proxy.migration.set_hooks(Box::new(CutoverHooks(Arc::downgrade(&proxy))), cluster.clone());
                tokio::spawn(proxy.migration.clone().run(source, opts.clone(), target, topts));
            }
            Err(e) => {
                error!("{e}");
                return 1;
            }
        }
    }
    spawn_reloader(proxy.clone(), config_path, overrides);
    // (what the fleet compares: looked at anew at each sync, so a reload shows at the
    // next, and made anew only when what they depend on changed)
    let weak = Arc::downgrade(&proxy);
    let memo = std::sync::Mutex::new(None::<(crate::proxy::DigestsOf, crate::services::fleet::Digests)>);
    proxy.fleet.set_digests(move || {
        let Some(p) = weak.upgrade() else { return Default::default() };
        let of = p.fleet_digests_of();
        let mut memo = memo.lock().unwrap_or_else(|e| e.into_inner());
        match &*memo {
            Some((was, d)) if crate::proxy::same_digests_of(was, &of) => d.clone(),
            _ => {
                let d = p.fleet_digests();
                *memo = Some((of, d.clone()));
                d
            }
        }
    });
    // (after the digests: it starts closing when its next colocation rules differ)
    let weak = Arc::downgrade(&proxy);
    proxy.fleet.set_switcher(move || {
        if let Some(p) = weak.upgrade() {
            p.colocate.switch();
        }
    });
    // (waits for the first sync, so the first clients meet the fleet's parts)
    crate::services::fleet::start(proxy.fleet.clone(), proxy.ratelimit.clone(), proxy.cluster.clone()).await;
    spawn_tls_reloader(acceptor.clone(), opts.tls.clone());
    // what the masters' command tables add to heatshield's (before the first client)
    crate::learn::start(proxy.clone()).await;
    // Learn the backends' version for HELLO/INFO; a node that does not answer in time
    // only leaves the default in place.
    let probe = async {
        let node = cluster.topology().masters.first()?.addr.clone();
        let reply = Side::new(node, &opts, "version").call(&["INFO", "server"]).await.ok()?;
        crate::face::info::redis_version_of(&reply)
    };
    if let Ok(Some(v)) = tokio::time::timeout(opts.command_timeout, probe).await {
        *proxy.redis_version.write() = v;
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let threads = match crate::front::server::spawn_workers(proxy.clone(), listeners, acceptor, stop_rx) {
        Ok(t) => t,
        Err(e) => {
            error!(error = %e, "cannot start worker threads");
            return 1;
        }
    };
    info!(listen = %proxy.config.server.listen, tls = ?proxy.config.tls.listen, workers, "heatshield ready");
    if let Some(c) = confirm {
        // (the workers accept: the old heatshield may drain now)
        let _ = tokio::task::spawn_blocking(move || c.serving()).await;
    }
    // the listeners, offered to a heatshield started with --takeover
    let taken = Arc::new(tokio::sync::Notify::new());
    let offer =
        offer.map(|(path, addrs, dups)| tokio::spawn(crate::front::handoff::offer(path, addrs, dups, taken.clone())));
    let handed = tokio::select! {
        _ = shutdown_signal() => false,
        _ = taken.notified() => true,
    };
    if handed {
        // the new heatshield accepts on these very sockets now: no grace
        proxy.health.draining.store(true, Ordering::Relaxed);
        if let Some(h) = &http {
            h.abort();
        }
    } else {
        let grace = std::time::Duration::from_millis(proxy.config.server.drain_grace_ms);
        drain(&proxy.health.draining, grace, shutdown_signal()).await;
    }
    // (the offer's copies of the sockets close with it, before the workers close theirs)
    if let Some(o) = offer {
        o.abort();
        let _ = o.await;
    }
    crate::services::fleet::leave(&proxy.fleet, &proxy.cluster).await;
    let _ = stop_tx.send(true);
    // Keep refreshing the topology while the workers drain.
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    0
}

/// What a migration's cutover asks of the sessions, the cache and the fleet
/// (crate::services::migration::dual::Hooks).
struct CutoverHooks(std::sync::Weak<Proxy>);

impl crate::services::migration::dual::Hooks for CutoverHooks {
    fn unblock_all(&self) {
        let Some(p) = self.0.upgrade() else { return };
        for c in p.clients.all() {
            if c.has(crate::conn::info::flag::BLOCKED) {
                c.send(crate::mailbox::Control::UnblockAtNode);
            }
        }
    }

    fn resume_all(&self) {
        let Some(p) = self.0.upgrade() else { return };
        for c in p.clients.all() {
            c.send(crate::mailbox::Control::Resume);
        }
    }

    fn forget_cache(&self) {
        if let Some(p) = self.0.upgrade() {
            p.cache.flush(crate::services::cache::Cause::Flush);
            // CLIENT TRACKING clients drop what they cached, as after a FLUSHALL
            p.client_side.flush_all();
        }
    }

    fn id(&self) -> String {
        self.0.upgrade().map(|p| p.fleet.id.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_options_follow_the_configuration() {
        let mut config = Config::default();
        config.backend.username = Some("u".into());
        config.backend.dedicated_max_per_node = 7;
        let o = backend_options(&config).unwrap();
        assert_eq!(o.username.as_deref(), Some("u"));
        assert_eq!(o.dedicated_max, 7);
        assert!(o.tls.is_none() && !o.resp3 && !o.dedicated && !o.readonly);
    }

    #[test]
    fn backend_tls_whose_files_do_not_load_stops_start_up_with_the_reason() {
        let mut config = Config::default();
        config.backend.tls = true;
        config.backend.tls_ca_cert_file = Some("/nonexistent/ca.pem".into());
        let e = backend_options(&config).expect_err("refused");
        assert!(e.starts_with("backend TLS: cannot load the certificates"), "{e}");
    }

    #[tokio::test]
    async fn a_listener_that_cannot_bind_ends_start_up_with_1() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut config = Config::default();
        config.server.listen = held.local_addr().unwrap().to_string();
        config.metrics.listen = "off".into();
        config.server.handoff_socket = "off".into();
        assert_eq!(run(config, None, Overrides::default()).await, 1);
    }
}
