//! Handing the listening sockets to a new heatshield (`--takeover`, docs/fleet.md).
//!
//! Every heatshield offers its listening sockets (the clients' ports, plain and TLS, and
//! the HTTP port) on a Unix socket, `server.handoff_socket`. A new heatshield started with
//! `--takeover` asks for them there before it binds anything; the old one checks that
//! the new one listens on the same addresses and sends the sockets (`SCM_RIGHTS`). Once
//! the new one has started and accepts, it says so, and the old one drains as on
//! SIGTERM, but without the grace: the new one accepts on the very same sockets, so no
//! connection waiting in their queues is lost and the port never refuses a client. A new
//! one that dies before it serves leaves the old one serving. Two SO_REUSEPORT groups side by side would not give that: a socket
//! that closes resets the connections queued on it.
//!
//! Only a process of the same user may ask (checked with `SO_PEERCRED`), and the socket
//! file is made private to that user. With `--takeover` and no heatshield answering at
//! the path, the new one binds as usual (and fails on an address in use, as without it).

use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::{info, warn};

/// The listening sockets of one process.
#[derive(Default)]
pub struct Sockets {
    pub plain: Vec<std::net::TcpListener>,
    pub tls: Vec<std::net::TcpListener>,
    pub http: Option<std::net::TcpListener>,
}

/// The addresses a process listens on, as configured: the new process's must be the
/// old one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    pub plain: Option<String>,
    pub tls: Option<String>,
    pub http: Option<String>,
}

impl Addresses {
    fn line(&self) -> String {
        let a = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
        format!("takeover plain={} tls={} http={}\n", a(&self.plain), a(&self.tls), a(&self.http))
    }
}

/// The Unix socket path for `server.handoff_socket`: the setting, or (empty) one made
/// from the listen address in the temporary directory; None for "off".
pub fn path(setting: &str, listen: &str) -> Option<PathBuf> {
    match setting {
        "off" => None,
        "" => {
            let name: String = listen.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
            Some(std::env::temp_dir().join(format!("heatshield-{name}.sock")))
        }
        p => Some(PathBuf::from(p)),
    }
}

/// How long either side waits for the other.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(5);
/// How long the old heatshield waits for the new one to start serving.
const START_LIMIT: Duration = Duration::from_secs(60);
/// At most this many sockets in one handoff.
const MAX_SOCKETS: usize = 256;

/// Asks the heatshield at `path` for its sockets. `Ok(None)`: nobody answers there.
pub fn receive(path: &Path, want: &Addresses) -> io::Result<Option<(Sockets, Confirm)>> {
    let mut s = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused) => return Ok(None),
        Err(e) => return Err(e),
    };
    s.set_read_timeout(Some(EXCHANGE_LIMIT))?;
    s.set_write_timeout(Some(EXCHANGE_LIMIT))?;
    s.write_all(want.line().as_bytes())?;
    // the answer: one line, with the sockets attached
    let mut buf = [0u8; 256];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = rustix::net::RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &s,
        &mut [io::IoSliceMut::new(&mut buf)],
        &mut control,
        rustix::net::RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let rustix::net::RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    let line = String::from_utf8_lossy(&buf[..got.bytes]).trim_end().to_string();
    let Some(counts) = line.strip_prefix("ok ") else {
        return Err(io::Error::other(format!("the heatshield at {} refused: {line}", path.display())));
    };
    let n: Vec<usize> = counts.split(' ').filter_map(|f| f.split_once('=')?.1.parse().ok()).collect();
    let [plain, tls, http] = n[..] else { return Err(io::Error::other(format!("bad handoff answer: {line}"))) };
    if plain + tls + http != fds.len() {
        return Err(io::Error::other(format!(
            "handoff: {} sockets announced, {} received",
            plain + tls + http,
            fds.len()
        )));
    }
    let mut fds = fds.into_iter().map(|fd| {
        let l = std::net::TcpListener::from(fd);
        l.set_nonblocking(true).map(|_| l)
    });
    let mut take = |n: usize| fds.by_ref().take(n).collect::<io::Result<Vec<_>>>();
    let plain = take(plain)?;
    let tls = take(tls)?;
    let http = take(http)?.pop();
    Ok(Some((Sockets { plain, tls, http }, Confirm(s))))
}

/// Tells the old heatshield that the new one serves (its workers accept): the old one
/// drains only then, and serves on if the new one dies before.
pub struct Confirm(UnixStream);

impl Confirm {
    pub fn serving(mut self) {
        if let Err(e) = self.0.write_all(b"taken\n") {
            warn!(error = %e, "could not tell the old heatshield that this one serves");
        }
    }
}

/// Offers this process's sockets at `path` until one new heatshield takes them (then
/// `taken` is notified and the offer ends) or the task is dropped (the copies of the
/// sockets it holds are closed with it). `sockets` are duplicates of the ones served.
pub async fn offer(path: PathBuf, own: Addresses, sockets: Sockets, taken: Arc<Notify>) {
    // A file there is a process's that is gone, or the old heatshield's this one took
    // over from (it leaves the file alone once it is not its own): replaced. A live
    // heatshield on the same addresses cannot be there: they were bound or received.
    let _ = std::fs::remove_file(&path);
    let listener = match bind_private(&path) {
        Ok(l) => l,
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot offer the listeners for --takeover");
            return;
        }
    };
    let _file = Owned::of(&path);
    let me = rustix::process::getuid();
    let mut sockets = Some(sockets);
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let uid = stream.peer_cred().map(|c| c.uid()).ok();
        if uid != Some(me.as_raw()) {
            warn!(?uid, "a takeover was asked by another user; refused");
            continue;
        }
        let Ok(stream) = stream.into_std() else { continue };
        let own = own.clone();
        let s = sockets.take().unwrap_or_default();
        let result = tokio::task::spawn_blocking(move || give(stream, &own, s)).await;
        match result {
            Ok(Ok(())) => {
                info!(path = %path.display(), "listeners handed to a new heatshield; draining");
                taken.notify_one();
                return;
            }
            Ok(Err((e, back))) => {
                warn!(error = %e, "takeover refused or failed; still serving");
                sockets = Some(back);
            }
            Err(_) => return,
        }
    }
}

/// The socket file this process made: removed when the offer ends, unless a newer
/// heatshield has put its own in its place.
struct Owned(PathBuf, Option<u64>);

impl Owned {
    fn of(path: &Path) -> Owned {
        use std::os::unix::fs::MetadataExt;
        Owned(path.to_path_buf(), std::fs::metadata(path).ok().map(|m| m.ino()))
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if self.1.is_some() && std::fs::metadata(&self.0).ok().map(|m| m.ino()) == self.1 {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The Unix listener at `path`, readable and writable by this user only.
fn bind_private(path: &Path) -> io::Result<tokio::net::UnixListener> {
    let l = tokio::net::UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// One exchange on the offering side; on failure the sockets come back.
fn give(s: UnixStream, own: &Addresses, sockets: Sockets) -> Result<(), (io::Error, Sockets)> {
    let fail = |e: io::Error, sockets| Err((e, sockets));
    // (it comes from tokio non-blocking)
    let setup = s.set_nonblocking(false);
    if let Err(e) = setup
        .and_then(|_| s.set_read_timeout(Some(EXCHANGE_LIMIT)))
        .and_then(|_| s.set_write_timeout(Some(EXCHANGE_LIMIT)))
    {
        return fail(e, sockets);
    }
    let mut line = String::new();
    let mut r = io::BufReader::new(&s).take(1024);
    if let Err(e) = r.read_line(&mut line) {
        return fail(e, sockets);
    }
    if line != own.line() {
        let _ = (&s).write_all(format!("no: this heatshield listens on {}", own.line()).as_bytes());
        return fail(io::Error::other(format!("asked for other addresses: {}", line.trim_end())), sockets);
    }
    let answer = format!(
        "ok plain={} tls={} http={}\n",
        sockets.plain.len(),
        sockets.tls.len(),
        usize::from(sockets.http.is_some())
    );
    let fds: Vec<_> = sockets
        .plain
        .iter()
        .map(|l| l.as_fd())
        .chain(sockets.tls.iter().map(|l| l.as_fd()))
        .chain(sockets.http.iter().map(|l| l.as_fd()))
        .collect();
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_SOCKETS))];
    let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_SOCKETS || !control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)) {
        return fail(io::Error::other("too many sockets to hand over"), sockets);
    }
    if let Err(e) =
        rustix::net::sendmsg(&s, &[io::IoSlice::new(answer.as_bytes())], &mut control, rustix::net::SendFlags::empty())
    {
        return fail(e.into(), sockets);
    }
    // they are the new one's once it says it serves (it may die starting)
    let _ = s.set_read_timeout(Some(START_LIMIT));
    let mut ack = String::new();
    match io::BufReader::new(&s).take(64).read_line(&mut ack) {
        Ok(_) if ack == "taken\n" => Ok(()),
        Ok(_) => fail(io::Error::other("the new heatshield did not confirm"), sockets),
        Err(e) => fail(e, sockets),
    }
}
