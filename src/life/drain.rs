//! The end of a heatshield's life: the signal that starts it, and the drain before the
//! workers close their listeners (docs/fleet.md#drain-and-restart).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::info;

/// The first step of a shutdown: `draining` is set at once (`/ready` answers 503), and
/// clients are still accepted and served for `grace` (`server.drain_grace_ms`), so that a
/// load balancer has time to stop sending new ones (`again` ending first cuts it short: a
/// second signal). Then the workers close their listeners and drain
/// (`front::server::serve`).
pub async fn drain(draining: &AtomicBool, grace: Duration, again: impl std::future::Future<Output = ()>) {
    draining.store(true, Ordering::Relaxed);
    if grace.is_zero() {
        return;
    }
    info!(
        grace_ms = grace.as_millis() as u64,
        "draining: /ready answers 503; still accepting clients for server.drain_grace_ms"
    );
    tokio::select! {
        _ = tokio::time::sleep(grace) => {}
        _ = again => info!("a second signal: closing the listener now"),
    }
}

/// SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    info!("shutdown signal received");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn without_grace_it_is_over_at_once() {
        let flag = AtomicBool::new(false);
        let t = Instant::now();
        drain(&flag, Duration::ZERO, std::future::pending()).await;
        assert!(flag.load(Ordering::Relaxed));
        assert!(t.elapsed() < Duration::from_millis(100));
    }

    #[tokio::test]
    async fn the_grace_is_waited_out_with_ready_already_failing() {
        let flag = AtomicBool::new(false);
        let t = Instant::now();
        let seen = async {
            // /ready's flag is set before the grace ends
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert!(flag.load(Ordering::Relaxed));
        };
        tokio::join!(drain(&flag, Duration::from_millis(300), std::future::pending()), seen);
        assert!(t.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_second_signal_cuts_the_grace_short() {
        let flag = AtomicBool::new(false);
        let t = Instant::now();
        drain(&flag, Duration::from_secs(30), tokio::time::sleep(Duration::from_millis(50))).await;
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
