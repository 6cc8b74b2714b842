//! The HTTP port (`metrics.listen`): `/metrics` (Prometheus's text), `/live` (the process
//! serves) and `/ready` (a slot map is loaded, the listener accepts and heatshield is not
//! draining), for Prometheus, load balancers and Kubernetes probes (docs/fleet.md). Served
//! by hyper (HTTP/1.1) on the control runtime; each connection is bounded in time.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::warn;

use crate::proxy::Proxy;

/// A connection (and a request's headers) may take at most this long.
const CONNECTION_LIMIT: Duration = Duration::from_secs(30);
const HEADERS_LIMIT: Duration = Duration::from_secs(5);
/// Connections served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 64;

/// Serves the port until the process ends.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                warn!(error = %e, "metrics port: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let r = respond(&proxy, &req);
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADERS_LIMIT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIMIT, conn).await;
            drop(permit);
        });
    }
}

fn respond(proxy: &Proxy, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = text(StatusCode::OK, crate::metrics::render());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        "/live" => text(StatusCode::OK, "live\n".into()),
        "/ready" => match proxy.ready() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, "not found: /metrics, /live and /ready are served here\n".into()),
    }
}
