//! TLS for the tests: [`Pki`], a certificate authority of the test's own in a temp dir
//! (rcgen), issuing the certificates of Redis nodes, heatshield and clients as PEM files;
//! and [`TlsConn`], a RESP client over rustls that says which certificate the server
//! presented.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tempfile::TempDir;

use super::client::{Reply, V, decode_reply, encode};
use super::ports::local;

/// A certificate authority and the files it issued, in one temp dir.
pub struct Pki {
    dir: TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
    serial: std::sync::atomic::AtomicU64,
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Issued {
    /// The certificate, DER (to compare with what a server presented).
    pub fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(&self.cert).expect("read issued certificate")
    }
}

impl Pki {
    /// A new CA named `name`; its certificate is [`Pki::ca`].
    pub fn new(name: &str) -> Pki {
        let dir = tempfile::Builder::new().prefix("heatshield-pki-").tempdir().expect("pki tempdir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("ca key")).expect("ca cert");
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).expect("write ca");
        Pki { dir, ca, serial: 1.into() }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA's certificate file.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// Issues a certificate for `names` (IP addresses and DNS names), good for servers
    /// and clients alike, written as `<file>.crt` / `<file>.key`.
    pub fn issue(&self, file: &str, names: &[&str]) -> Issued {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(file, params)
    }

    /// Signs `params` (a fresh key, the next serial) and writes `<file>.crt` / `<file>.key`.
    fn sign(&self, file: &str, mut params: CertificateParams) -> Issued {
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let n = self.serial.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        params.serial_number = Some(rcgen::SerialNumber::from(n));
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("sign");
        let issued = Issued {
            cert: self.dir.path().join(format!("{file}.crt")),
            key: self.dir.path().join(format!("{file}.key")),
        };
        write_atomically(&issued.cert, cert.pem().as_bytes());
        write_atomically(&issued.key, key.serialize_pem().as_bytes());
        issued
    }

    /// A client certificate whose common name is `file` and whose one subject alternative
    /// name is the URI `uri`, written as `<file>.crt` / `<file>.key`.
    pub fn issue_uri(&self, file: &str, uri: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, file);
        params.subject_alt_names = vec![rcgen::SanType::URI(uri.to_string().try_into().expect("an IA5 URI"))];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(file, params)
    }

    /// A certificate for 127.0.0.1, ::1 and localhost.
    pub fn issue_local(&self, file: &str) -> Issued {
        self.issue(file, &["127.0.0.1", "::1", "localhost"])
    }
}

/// Replaces `path` with `data` at once (a reader never sees half a file).
pub fn write_atomically(path: &Path, data: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// A RESP2 client over TLS (rustls), verifying the server against `ca`.
pub struct TlsConn {
    stream: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

impl TlsConn {
    /// Connects to 127.0.0.1:`port` and completes the handshake, presenting `client` if
    /// given.
    pub fn connect(port: u16, ca: &Path, client: Option<&Issued>) -> io::Result<TlsConn> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca).map_err(io::Error::other)? {
            roots.add(c.map_err(io::Error::other)?).map_err(io::Error::other)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let b = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_root_certificates(roots);
        let config = match client {
            Some(c) => b
                .with_client_auth_cert(vec![c.der()], PrivateKeyDer::from_pem_file(&c.key).map_err(io::Error::other)?)
                .map_err(io::Error::other)?,
            None => b.with_no_client_auth(),
        };
        let tcp = TcpStream::connect(local(port))?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("127.0.0.1").expect("ip name");
        let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(io::Error::other)?;
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(TlsConn { stream, buf: Vec::new() })
    }

    /// The certificate the server presented.
    pub fn server_cert(&self) -> CertificateDer<'static> {
        self.stream.conn.peer_certificates().expect("a server certificate")[0].clone().into_owned()
    }

    /// Sends one command and reads its reply.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, a: &[A]) -> io::Result<V> {
        self.stream.write_all(&encode(a))?;
        self.stream.flush()?;
        Ok(self.read()?.v)
    }

    /// Sends commands back to back and reads their replies.
    pub fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> io::Result<Vec<V>> {
        let mut out = Vec::new();
        for c in cmds {
            out.extend(encode(c));
        }
        self.stream.write_all(&out)?;
        self.stream.flush()?;
        cmds.iter().map(|_| self.read().map(|r| r.v)).collect()
    }

    fn read(&mut self) -> io::Result<Reply> {
        loop {
            if let Some((r, n)) = decode_reply(&self.buf, super::client::Proto::Resp2).map_err(io::Error::other)? {
                self.buf.drain(..n);
                return Ok(r);
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}
