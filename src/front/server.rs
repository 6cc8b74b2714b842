//! The listeners: one per worker thread (SO_REUSEPORT) for plain clients and one for TLS
//! clients (`[tls]`), each accepting clients, enforcing `max_clients`, and starting a
//! session task per connection on its worker (a TLS client's after its handshake, bounded
//! by `tls.handshake_timeout_ms`); on shutdown they stop accepting, let sessions finish
//! their in-flight replies (bounded by `shutdown_timeout_ms`) and return.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::conn::Control;
use crate::front::session;
use crate::proxy::Proxy;
use crate::tls::Acceptor;

/// Binds `n` listening sockets to `addr` with SO_REUSEPORT, so the kernel spreads new
/// connections over the workers. An address another process listens on already is
/// refused ("Address already in use", as Redis refuses it): a new heatshield takes over
/// an old one's port by receiving its sockets (`--takeover`, [`super::handoff`]), never
/// by joining them.
pub fn bind(addr: &str, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let addr: std::net::SocketAddr = addr.parse().map_err(std::io::Error::other)?;
    if addr.port() != 0 {
        // SO_REUSEPORT would let this process join another's listening sockets: a socket
        // without it cannot bind beside them, which tells
        let probe = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
        probe.set_reuse_address(true)?;
        probe.bind(&addr.into())?;
    }
    (0..n.max(1)).map(|_| bind_beside(addr)).collect()
}

/// One more listening socket on `addr` in the SO_REUSEPORT group of this process's
/// others (for a worker that received none in a takeover).
pub fn bind_beside(addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    #[cfg(unix)]
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// The sockets each worker accepts on: plain listeners, TLS ones, or both (one of each,
/// or more after a takeover from a process that had more workers).
#[derive(Default)]
pub struct Listeners {
    pub plain: Vec<std::net::TcpListener>,
    pub tls: Vec<std::net::TcpListener>,
}

/// Runs one worker thread per [`Listeners`], each with its own single-threaded runtime,
/// until `stop` becomes true and the worker has drained. Returns the threads to join.
pub fn spawn_workers(
    proxy: Arc<Proxy>,
    listeners: Vec<Listeners>,
    tls: Option<Arc<Acceptor>>,
    stop: watch::Receiver<bool>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let proxy = proxy.clone();
            let tls = tls.clone();
            let mut stop = stop.clone();
            std::thread::Builder::new().name(format!("heatshield-w{i}")).spawn(move || {
                crate::worker::set_current(i);
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        warn!(worker = i, error = %e, "cannot start worker runtime");
                        return;
                    }
                };
                rt.block_on(async move {
                    let register = |ls: Vec<std::net::TcpListener>| {
                        ls.into_iter().map(TcpListener::from_std).collect::<std::io::Result<Vec<_>>>().map_err(|e| {
                            warn!(worker = i, error = %e, "cannot register listener");
                        })
                    };
                    let (Ok(plain), Ok(secure)) = (register(l.plain), register(l.tls)) else { return };
                    let secure = tls.filter(|_| !secure.is_empty()).map(|a| (secure, a));
                    serve(proxy, plain, secure, async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await;
                });
            })
        })
        .collect()
}

/// The next connection on any of `ls`; never, without one.
async fn accept(ls: &[TcpListener]) -> std::io::Result<(TcpStream, std::net::SocketAddr)> {
    std::future::poll_fn(|cx| {
        for l in ls {
            if let std::task::Poll::Ready(r) = l.poll_accept(cx) {
                return std::task::Poll::Ready(r);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Serves clients on the plain listener and the TLS one until `stop` resolves, then
/// drains and returns.
pub async fn serve(
    proxy: Arc<Proxy>,
    plain: Vec<TcpListener>,
    tls: Option<(Vec<TcpListener>, Arc<Acceptor>)>,
    stop: impl std::future::Future<Output = ()>,
) {
    // set before every client is told of the shutdown (see `session::run`)
    let stopping = Arc::new(AtomicBool::new(false));
    tokio::pin!(stop);
    proxy.health.listening.fetch_add(1, Ordering::Relaxed);
    if crate::worker::current() == 0 {
        crate::services::fleet::start_tokens(proxy.fleet.clone(), proxy.ratelimit.clone(), proxy.cluster.clone());
    }
    loop {
        let (res, secure) = tokio::select! {
            _ = &mut stop => break,
            res = accept(&plain) => (res, None),
            res = accept(tls.as_ref().map_or(&[][..], |t| &t.0)) => (res, tls.as_ref().map(|t| t.1.clone())),
        };
        let (stream, peer) = match res {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let stats = &proxy.stats;
        let gm = crate::metrics::global();
        // One atomic step takes the place, so workers accepting at the same time
        // cannot both take the last one.
        let max = proxy.live.max_clients.load(Ordering::Relaxed);
        let took = stats.clients.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c < max).then_some(c + 1));
        let handshake = Duration::from_millis(proxy.config.tls.handshake_timeout_ms);
        if took.is_err() {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            gm.rejected.increment(1);
            warn!(%peer, "client refused: max_clients reached");
            tokio::spawn(async move {
                let refusal = crate::errors::resp(crate::errors::MAX_CLIENTS);
                match secure {
                    None => {
                        let mut stream = stream;
                        let _ = stream.write_all(&refusal).await;
                        let _ = stream.shutdown().await;
                    }
                    Some(acceptor) => {
                        // (all of it bounded: the client may never finish, or never read)
                        let _ = tokio::time::timeout(handshake, async {
                            if let Ok(mut s) = acceptor.accept(stream).await {
                                let _ = s.write_all(&refusal).await;
                                let _ = s.shutdown().await;
                            }
                        })
                        .await;
                    }
                }
            });
            continue;
        }
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        gm.accepted.increment(1);
        let p = proxy.clone();
        let stopping = stopping.clone();
        tokio::spawn(async move {
            let stream = match secure {
                None => Some(session::Stream::Plain(stream)),
                Some(acceptor) => match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => Some(session::Stream::Tls(Box::new(s))),
                    Ok(Err(e)) => {
                        crate::metrics::global().tls_handshake_failed.increment(1);
                        info!(%peer, error = %e, "client TLS handshake failed");
                        None
                    }
                    Err(_) => {
                        crate::metrics::global().tls_handshake_failed.increment(1);
                        info!(%peer, "client TLS handshake timed out");
                        None
                    }
                },
            };
            if let Some(stream) = stream {
                session::run(p.clone(), stream, stopping).await;
            }
            p.stats.clients.fetch_sub(1, Ordering::Relaxed);
        });
    }
    drop(plain);
    drop(tls);
    proxy.health.listening.fetch_sub(1, Ordering::Relaxed);
    stopping.store(true, Ordering::Release);
    for c in proxy.clients.all() {
        c.send(Control::Shutdown);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(proxy.config.server.shutdown_timeout_ms);
    info!(clients = proxy.stats.clients.load(Ordering::Relaxed), "shutting down: draining clients");
    while proxy.stats.clients.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    info!(left = proxy.stats.clients.load(Ordering::Relaxed), "shutdown complete");
}
