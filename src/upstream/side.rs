//! heatshield's own connections to a node (side connections), one type for all of them:
//! the topology refresh, the command-table check, the lag probe, WAIT, the fleet's sync,
//! the lock task's release subscriber, the invalidation and pub/sub connections, the
//! version probe and `colocate-migrate`.
//!
//! A [`Side`] connects when first used, with the data connections' handshake
//! ([`backend::connect`]: TLS, AUTH, HELLO) but never their tracking or dedicated
//! settings, names itself (`CLIENT SETNAME heatshield-<purpose>`, so `CLIENT LIST` on a
//! node says what each connection is for), selects its database, and turns TCP
//! keep-alive on (a node whose host went away is noticed by a connection that only
//! listens). Every request has the command timeout; a connection that failed or timed
//! out is dropped, and the next use connects again after [`Backoff`]'s delay, which a
//! success resets. Bytes after a reply are kept for the next read, never dropped.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;

use crate::protocol::Request;
use crate::protocol::reply::{ReplyScanner, error_text};
use crate::tls::Link;
use crate::upstream::backend::{self, BackendOptions};

/// How long a side connection's socket may be silent before TCP probes the peer, and the
/// probes' interval.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// The delay before connecting again after a failure: doubles from `min` to `max`, back
/// to `min` after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff { next: min, min, max }
    }

    /// The delay to wait now; the one after it is twice as long (up to `max`).
    pub fn fail(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// Waits [`Backoff::fail`]'s delay.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.fail()).await;
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// One side connection to one node.
pub struct Side {
    addr: Arc<str>,
    opts: BackendOptions,
    name: &'static str,
    db: u32,
    link: Option<Link>,
    buf: BytesMut,
    scanner: ReplyScanner,
    /// The delay before the next connection after a failure.
    pub backoff: Backoff,
}

impl Side {
    /// A side connection to `addr` named `heatshield-<purpose>`, with `base`'s TLS,
    /// credentials and timeouts, RESP2, database 0. Nothing is connected yet.
    pub fn new(addr: impl Into<Arc<str>>, base: &BackendOptions, purpose: &'static str) -> Side {
        let opts = BackendOptions {
            resp3: false,
            tracking: None,
            dedicated: false,
            readonly: false,
            flush_delay: Duration::ZERO,
            ..base.clone()
        };
        Side {
            addr: addr.into(),
            opts,
            name: purpose,
            db: 0,
            link: None,
            buf: BytesMut::new(),
            scanner: ReplyScanner::new(),
            backoff: Backoff::default(),
        }
    }

    /// Speaks RESP3 (`HELLO 3`): push frames (invalidations) arrive on it.
    pub fn resp3(mut self) -> Side {
        self.opts.resp3 = true;
        self
    }

    /// Works in database `db` (`SELECT`ed at each connect).
    pub fn db(mut self, db: u32) -> Side {
        self.db = db;
        self
    }

    /// Connects and answers within `d` (instead of the configured timeouts): a probe
    /// that must not fall behind its own schedule.
    pub fn timeout(mut self, d: Duration) -> Side {
        self.opts.connect_timeout = self.opts.connect_timeout.min(d);
        self.opts.command_timeout = d;
        self
    }

    pub fn addr(&self) -> &Arc<str> {
        &self.addr
    }

    pub fn is_open(&self) -> bool {
        self.link.is_some()
    }

    /// Drops the connection; the next use connects again.
    pub fn close(&mut self) {
        self.link = None;
        self.buf = BytesMut::new();
        self.scanner = ReplyScanner::new();
    }

    /// Connects now if not connected.
    pub async fn open(&mut self) -> io::Result<()> {
        if self.link.is_some() {
            return Ok(());
        }
        let r = self.connect().await;
        if r.is_err() {
            self.close();
        }
        r
    }

    async fn connect(&mut self) -> io::Result<()> {
        let (link, _, _) = backend::connect(&self.addr, &self.opts).await?;
        keepalive(&link);
        self.link = Some(link);
        self.buf = BytesMut::with_capacity(4096);
        self.scanner = ReplyScanner::new();
        let mut setup = BytesMut::new();
        let name = format!("heatshield-{}", self.name);
        setup.extend_from_slice(Request::from_args(&["CLIENT", "SETNAME", &name]).raw());
        let db = self.db.to_string();
        if self.db != 0 {
            setup.extend_from_slice(Request::from_args(&["SELECT", &db]).raw());
        }
        let n = if self.db != 0 { 2 } else { 1 };
        for reply in self.exchange(&setup, n).await? {
            if let Some(e) = error_text(&reply) {
                return Err(io::Error::other(format!("setup refused: {}", String::from_utf8_lossy(e))));
            }
        }
        Ok(())
    }

    /// Sends one command and reads its reply (an error reply is a reply, not an error).
    pub async fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Bytes> {
        let req = Request::from_args(args);
        Ok(self.call_raw(req.raw(), 1).await?.pop().unwrap_or_default())
    }

    /// Sends `data` (`n` commands, encoded) and reads their `n` replies, connecting first
    /// if needed. A failure or a timeout drops the connection.
    pub async fn call_raw(&mut self, data: &[u8], n: usize) -> io::Result<Vec<Bytes>> {
        self.open().await?;
        let r = self.exchange(data, n).await;
        match &r {
            Ok(_) => self.backoff.reset(),
            Err(_) => self.close(),
        }
        r
    }

    async fn exchange(&mut self, data: &[u8], n: usize) -> io::Result<Vec<Bytes>> {
        let timeout = self.opts.command_timeout;
        let work = async {
            self.send_now(data).await?;
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                out.push(self.read_frame().await?);
            }
            Ok(out)
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no reply in time")),
        }
    }

    /// Writes `data` without waiting for a reply (a subscription, a command whose reply
    /// comes among pushes), connecting first if needed. A failure drops the connection.
    pub async fn send(&mut self, data: &[u8]) -> io::Result<()> {
        self.open().await?;
        let r = self.send_now(data).await;
        if r.is_err() {
            self.close();
        }
        r
    }

    async fn send_now(&mut self, data: &[u8]) -> io::Result<()> {
        match self.link.as_mut() {
            Some(l) => l.send(data).await,
            None => Err(io::Error::new(io::ErrorKind::NotConnected, "not connected")),
        }
    }

    /// The next whole frame, however long it takes (a subscriber's message, a blocked
    /// command's reply). Cancel-safe: bytes read before a cancellation stay for the next
    /// call. A failure (the peer closed, bytes that are no reply) drops the connection.
    pub async fn frame(&mut self) -> io::Result<Bytes> {
        let r = self.read_frame().await;
        if r.is_err() {
            self.close();
        }
        r
    }

    async fn read_frame(&mut self) -> io::Result<Bytes> {
        loop {
            if let Some(n) = self.scanner.scan(&self.buf).map_err(io::Error::other)? {
                self.scanner = ReplyScanner::new();
                return Ok(self.buf.split_to(n).freeze());
            }
            let Some(link) = self.link.as_mut() else {
                return Err(io::Error::new(io::ErrorKind::NotConnected, "not connected"));
            };
            if link.read_buf(&mut self.buf).await? == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed by peer"));
            }
        }
    }
}

/// TCP keep-alive on the connection's socket (best effort).
fn keepalive(link: &Link) {
    let ka = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE).with_interval(KEEPALIVE_INTERVAL);
    let _ = socket2::SockRef::from(link.tcp()).set_tcp_keepalive(&ka);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_ceiling_and_a_success_resets_it() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_millis(300));
        assert_eq!(b.fail(), Duration::from_millis(50));
        assert_eq!(b.fail(), Duration::from_millis(100));
        assert_eq!(b.fail(), Duration::from_millis(200));
        assert_eq!(b.fail(), Duration::from_millis(300));
        assert_eq!(b.fail(), Duration::from_millis(300));
        b.reset();
        assert_eq!(b.fail(), Duration::from_millis(50));
    }

    #[test]
    fn a_side_connection_never_carries_the_data_connections_settings() {
        let base = BackendOptions {
            resp3: true,
            tracking: Some(Arc::new(backend::NodeTracking::default())),
            dedicated: true,
            readonly: true,
            ..BackendOptions::plain(Duration::from_millis(100))
        };
        let s = Side::new("127.0.0.1:1", &base, "test");
        assert!(!s.opts.resp3 && s.opts.tracking.is_none() && !s.opts.dedicated && !s.opts.readonly);
        assert!(s.resp3().opts.resp3);
    }

    #[tokio::test]
    async fn a_node_that_is_not_there_is_an_error_and_leaves_it_closed() {
        let base = BackendOptions::plain(Duration::from_millis(200));
        // a port nobody listens on: bind one, note it, let it go
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut s = Side::new(format!("127.0.0.1:{port}"), &base, "test");
        assert!(s.call(&["PING"]).await.is_err());
        assert!(!s.is_open());
    }
}
