//! What a running heatshield reloads on its own: the configuration file on SIGHUP
//! ([`crate::reload`] applies it), and the TLS certificates of both sides when their
//! files change or on SIGHUP ([`crate::tls`]).

use std::path::PathBuf;
use std::sync::Arc;

use tracing::{error, info, warn};

use crate::config::Overrides;
use crate::proxy::Proxy;
use crate::tls::{Acceptor, Connector, Reloadable};

/// On SIGHUP, reloads the configuration file: what can change live is applied, the rest
/// is logged as needing a restart, and a file with any problem is rejected whole.
pub fn spawn_reloader(proxy: Arc<Proxy>, path: Option<PathBuf>, overrides: Overrides) {
    if let Some(p) = path {
        let _ = proxy.reload_from.set((p, overrides));
    }
    #[cfg(unix)]
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
        while hup.recv().await.is_some() {
            info!("SIGHUP: reloading the configuration");
            if let Err(e) = crate::reload::from_file(&proxy) {
                warn!(error = %e, "SIGHUP: nothing reloaded");
            }
        }
    });
}

/// Reloads the certificates of the TLS listener and of backend TLS when their files
/// change (checked every second) and on SIGHUP; connections already open keep theirs.
pub fn spawn_tls_reloader(acceptor: Option<Arc<Acceptor>>, connector: Option<Arc<Connector>>) {
    if acceptor.is_none() && connector.is_none() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let force = tokio::select! {
                _ = tick.tick() => false,
                Some(_) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            };
            #[cfg(not(unix))]
            let force = {
                tick.tick().await;
                false
            };
            let sides: [(&str, Option<&dyn Reloadable>); 2] = [
                ("TLS listener", acceptor.as_deref().map(|a| a as _)),
                ("backend TLS", connector.as_deref().map(|c| c as _)),
            ];
            reload_sides(&sides, force);
        }
    });
}

/// One look at each side's certificates (`force`: reload even unchanged files); returns
/// how many were reloaded. A side that fails keeps its old certificates.
pub fn reload_sides(sides: &[(&str, Option<&dyn Reloadable>)], force: bool) -> usize {
    let mut reloaded = 0;
    for (side, r) in sides {
        let Some(r) = r else { continue };
        match r.reload(force) {
            Ok(true) => {
                crate::metrics::global().tls_reloads.increment(1);
                info!(side, "certificates reloaded");
                reloaded += 1;
            }
            Ok(false) => {}
            Err(e) => error!(side, error = %e, "certificates not reloaded; keeping the old ones"),
        }
    }
    reloaded
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A side whose reload answers as told, counting the calls.
    struct Side(std::sync::Mutex<Vec<Result<bool, String>>>, std::sync::atomic::AtomicUsize);

    impl Reloadable for Side {
        fn reload(&self, _force: bool) -> Result<bool, String> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.lock().unwrap().remove(0)
        }
    }

    #[test]
    fn each_side_is_looked_at_and_a_failure_keeps_the_others_going() {
        let a = Side(std::sync::Mutex::new(vec![Err("bad key".into()), Ok(true)]), Default::default());
        let b = Side(std::sync::Mutex::new(vec![Ok(true), Ok(false)]), Default::default());
        let sides: [(&str, Option<&dyn Reloadable>); 3] = [("a", Some(&a)), ("none", None), ("b", Some(&b))];
        assert_eq!(reload_sides(&sides, false), 1);
        assert_eq!(reload_sides(&sides, true), 1);
        assert_eq!(a.1.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(b.1.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
