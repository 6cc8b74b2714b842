//! The listener: accepts clients, enforces `max_clients`, starts a session task per
//! connection, and on shutdown stops accepting, lets sessions finish their in-flight
//! replies (bounded by `shutdown_timeout_ms`) and returns.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::proxy::Proxy;
use crate::session;

/// Serves clients on `listener` until `stop` resolves, then drains and returns.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener, stop: impl std::future::Future<Output = ()>) {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            res = listener.accept() => {
                let (mut stream, peer) = match res {
                    Ok(s) => s,
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let stats = &proxy.stats;
                if stats.clients.load(Ordering::Relaxed) >= proxy.config.server.max_clients {
                    stats.rejected.fetch_add(1, Ordering::Relaxed);
                    warn!(%peer, "client refused: max_clients reached");
                    tokio::spawn(async move {
                        let _ = stream.write_all(b"-ERR max number of clients reached\r\n").await;
                        let _ = stream.shutdown().await;
                    });
                    continue;
                }
                stats.accepted.fetch_add(1, Ordering::Relaxed);
                stats.clients.fetch_add(1, Ordering::Relaxed);
                let p = proxy.clone();
                let rx = shutdown_rx.clone();
                tokio::spawn(async move {
                    session::run(p.clone(), stream, rx).await;
                    p.stats.clients.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }
    drop(listener);
    let _ = shutdown_tx.send(true);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(proxy.config.server.shutdown_timeout_ms);
    info!(
        clients = proxy.stats.clients.load(Ordering::Relaxed),
        "shutting down: draining clients"
    );
    while proxy.stats.clients.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    info!(left = proxy.stats.clients.load(Ordering::Relaxed), "shutdown complete");
}
