//! TLS, on both sides, through rustls (ring as its crypto, TLS 1.2 and 1.3 only): the
//! PEM files heatshield loads, the acceptor its TLS listener hands clients to, the
//! connector its backend connections use, and [`Link`], a backend connection plain or TLS.
//!
//! Certificates change without a restart: [`Acceptor`] and [`Connector`] keep the
//! rustls configuration built from their files and swap it whole when [`Reloadable::reload`]
//! finds the files changed (the process checks every second and on SIGHUP). A handshake
//! takes the configuration current at its start, so connections already open keep the
//! certificate they were made with. Files that do not load leave the old configuration in
//! place, with the reason in the log.
//!
//! A verified client certificate may name the client's ACL user ([`cert_user_name`],
//! `tls.auth_clients_user`, as Valkey's `tls-auth-clients-user`); x509-parser reads its
//! fields (rustls verifies it, but leaves its subject to the caller).

use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A client connection accepted on the TLS listener, after its handshake.
pub type ServerStream = tokio_rustls::server::TlsStream<TcpStream>;
/// A backend connection over TLS.
pub type ClientStream = tokio_rustls::client::TlsStream<TcpStream>;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const VERSIONS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", path.display()));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in certs(path)? {
        roots.add(c).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// When each of a set of files was last modified: what tells that they changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Vec<Option<SystemTime>>);

impl Stamp {
    fn of(files: &[&PathBuf]) -> Stamp {
        Stamp(files.iter().map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok()).collect())
    }
}

/// Something built from files that may be rebuilt when they change.
pub trait Reloadable {
    /// Rebuilds from the files if they changed since the last build (or always, with
    /// `force`). `Ok(true)`: rebuilt; `Err`: the files did not load and the old
    /// configuration stays.
    fn reload(&self, force: bool) -> Result<bool, String>;
}

/// The files of the client-facing TLS listener (`[tls]`).
#[derive(Debug, Clone)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate signed by this CA (mutual TLS)...
    pub client_ca: Option<PathBuf>,
    /// ... unless this is set: then one is verified if presented, and not asked for.
    pub client_cert_optional: bool,
}

impl ServerFiles {
    fn paths(&self) -> Vec<&PathBuf> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()].into_iter().flatten().collect()
    }

    fn build(&self) -> Result<ServerConfig, String> {
        let b = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| e.to_string())?;
        let b = match &self.client_ca {
            Some(ca) => {
                let v = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
                let v = if self.client_cert_optional { v.allow_unauthenticated() } else { v };
                b.with_client_cert_verifier(v.build().map_err(|e| format!("{}: {e}", ca.display()))?)
            }
            None => b.with_no_client_auth(),
        };
        b.with_single_cert(certs(&self.cert)?, key(&self.key)?)
            .map_err(|e| format!("{} / {}: {e}", self.cert.display(), self.key.display()))
    }
}

/// The TLS listener's handshakes, with the configuration its files give now.
pub struct Acceptor {
    files: ServerFiles,
    current: ArcSwap<ServerConfig>,
    stamp: parking_lot::Mutex<Stamp>,
}

impl Acceptor {
    pub fn new(files: ServerFiles) -> Result<Acceptor, String> {
        let stamp = Stamp::of(&files.paths());
        let config = files.build()?;
        Ok(Acceptor { current: ArcSwap::from_pointee(config), stamp: parking_lot::Mutex::new(stamp), files })
    }

    /// Runs the server side of a handshake on `tcp`.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<ServerStream> {
        tokio_rustls::TlsAcceptor::from(self.current.load_full()).accept(tcp).await
    }
}

impl Reloadable for Acceptor {
    fn reload(&self, force: bool) -> Result<bool, String> {
        reload(&self.files.paths(), &self.stamp, force, || self.files.build().map(|c| self.current.store(Arc::new(c))))
    }
}

fn reload(
    paths: &[&PathBuf],
    stamp: &parking_lot::Mutex<Stamp>,
    force: bool,
    build: impl FnOnce() -> Result<(), String>,
) -> Result<bool, String> {
    let now = Stamp::of(paths);
    let mut last = stamp.lock();
    if !force && *last == now {
        return Ok(false);
    }
    // noted even when the build fails: the same broken files are not reported every second
    *last = now;
    build().map(|()| true)
}

/// The files and names of TLS to the backends (`backend.tls_*`).
#[derive(Debug, Clone)]
pub struct ClientFiles {
    /// The CA the nodes' certificates must be signed by.
    pub ca: PathBuf,
    /// A client certificate and its key, for nodes that ask for one (mutual TLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name every node's certificate must carry; unset: the host (an IP address, as
    /// the cluster announces its nodes) of the address connected to.
    pub server_name: Option<String>,
}

impl ClientFiles {
    fn paths(&self) -> Vec<&PathBuf> {
        [Some(&self.ca), self.cert.as_ref(), self.key.as_ref()].into_iter().flatten().collect()
    }

    fn build(&self) -> Result<ClientConfig, String> {
        let b = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots(&self.ca)?);
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => b
                .with_client_auth_cert(certs(c)?, key(k)?)
                .map_err(|e| format!("{} / {}: {e}", c.display(), k.display())),
            _ => Ok(b.with_no_client_auth()),
        }
    }
}

/// Handshakes of backend connections, with the configuration the files give now.
pub struct Connector {
    files: ClientFiles,
    current: ArcSwap<ClientConfig>,
    stamp: parking_lot::Mutex<Stamp>,
    name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").field("files", &self.files).finish()
    }
}

impl Connector {
    pub fn new(files: ClientFiles) -> Result<Connector, String> {
        let name = match &files.server_name {
            Some(n) => Some(ServerName::try_from(n.clone()).map_err(|e| format!("server name '{n}': {e}"))?),
            None => None,
        };
        let stamp = Stamp::of(&files.paths());
        let config = files.build()?;
        Ok(Connector { current: ArcSwap::from_pointee(config), stamp: parking_lot::Mutex::new(stamp), files, name })
    }

    /// Runs the client side of a handshake with the node at `addr` (`HOST:PORT`), whose
    /// certificate must name the configured server name, or else `HOST`.
    pub async fn connect(&self, tcp: TcpStream, addr: &str) -> io::Result<ClientStream> {
        let name = match &self.name {
            Some(n) => n.clone(),
            None => name_of(addr)?,
        };
        tokio_rustls::TlsConnector::from(self.current.load_full()).connect(name, tcp).await
    }
}

impl Reloadable for Connector {
    fn reload(&self, force: bool) -> Result<bool, String> {
        reload(&self.files.paths(), &self.stamp, force, || self.files.build().map(|c| self.current.store(Arc::new(c))))
    }
}

/// The name a node's certificate must carry when none is configured: the host of its
/// address, an IP address or a DNS name.
fn name_of(addr: &str) -> io::Result<ServerName<'static>> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) => Ok(ServerName::IpAddress(ip.into())),
        Err(_) => ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("'{host}' is no server name: {e}"))),
    }
}

/// One backend connection, plain or TLS.
pub enum Link {
    Plain(TcpStream),
    Tls(Box<ClientStream>),
}

/// A backend connection's read half, plain or TLS (matched at each read, so that the
/// connection task is compiled once for both).
pub enum LinkRead<'a> {
    Plain(tokio::net::tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut ClientStream>),
}

/// A backend connection's write half, plain or TLS.
pub enum LinkWrite<'a> {
    Plain(tokio::net::tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<&'a mut ClientStream>),
}

impl Link {
    /// The two halves, used by one task at a time (a TLS stream's share a lock, taken
    /// only while one of them is polled).
    pub fn split(&mut self) -> (LinkRead<'_>, LinkWrite<'_>) {
        match self {
            Link::Plain(s) => {
                let (r, w) = s.split();
                (LinkRead::Plain(r), LinkWrite::Plain(w))
            }
            Link::Tls(s) => {
                let (r, w) = tokio::io::split(s.as_mut());
                (LinkRead::Tls(r), LinkWrite::Tls(w))
            }
        }
    }

    /// The TCP socket under the connection (for socket options).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Tls(s) => s.get_ref().0,
        }
    }

    /// Writes all of `data` and flushes it: over TLS, records the socket did not take
    /// at once are still heatshield's until flushed.
    pub async fn send(&mut self, data: &[u8]) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.write_all(data).await?;
        self.flush().await
    }
}

impl AsyncRead for Link {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Link::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Link::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_flush(cx),
            Link::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Link::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for LinkRead<'_> {
    #[inline]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkRead::Plain(r) => Pin::new(r).poll_read(cx, buf),
            LinkRead::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkWrite<'_> {
    #[inline]
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkWrite::Plain(w) => Pin::new(w).poll_write(cx, buf),
            LinkWrite::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkWrite::Plain(_) => Poll::Ready(Ok(())),
            LinkWrite::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkWrite::Plain(w) => Pin::new(w).poll_shutdown(cx),
            LinkWrite::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_addresses() {
        assert_eq!(
            name_of("127.0.0.1:7000").unwrap(),
            ServerName::IpAddress("127.0.0.1".parse::<IpAddr>().unwrap().into())
        );
        assert_eq!(name_of("[::1]:7000").unwrap(), ServerName::IpAddress("::1".parse::<IpAddr>().unwrap().into()));
        assert_eq!(name_of("::1:7000").unwrap(), ServerName::IpAddress("::1".parse::<IpAddr>().unwrap().into()));
        assert_eq!(name_of("redis-0.example:7000").unwrap(), ServerName::try_from("redis-0.example").unwrap());
    }

    #[test]
    fn missing_files_are_named() {
        let e = Acceptor::new(ServerFiles {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
            client_ca: None,
            client_cert_optional: false,
        })
        .err()
        .unwrap();
        assert!(e.contains("/nonexistent/cert.pem"), "{e}");
    }
}

/// The field of a verified client certificate that names its ACL user
/// (`tls.auth_clients_user`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertUser {
    /// The subject's first common name.
    Cn,
    /// The first URI among the subject alternative names, whole.
    Uri,
}

/// The user name the client certificate of `conn` gives in `field`, if it presented one
/// (a certificate present after the handshake was verified against `tls.ca_cert_file`)
/// and it has that field.
pub fn cert_user_name(conn: &rustls::ServerConnection, field: CertUser) -> Option<String> {
    let der = conn.peer_certificates()?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    match field {
        CertUser::Cn => cert.subject().iter_common_name().next()?.as_str().ok().map(str::to_string),
        CertUser::Uri => cert.subject_alternative_name().ok()??.value.general_names.iter().find_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        }),
    }
}
