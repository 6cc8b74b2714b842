//! Hostile or broken clients: malformed RESP gets `-ERR Protocol error: ...` and the
//! connection is closed (as Redis does); oversize lengths are refused before any memory is
//! reserved; deep nesting cannot recurse; `limits.max_request_bytes` is enforced; and none
//! of it disturbs other clients or the proxy process. Each test runs its own proxy (on a
//! shared cluster) and checks it is still alive at the end.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::client::{Conn, Proto, V, decode_reply};
use common::{Proxy, RedisCluster, Shared};

static CLUSTER: Shared<RedisCluster> = Shared::new();

fn cluster() -> Arc<RedisCluster> {
    CLUSTER.get(RedisCluster::start)
}

/// Watches the proxy's resident memory; if it exceeds `limit_mb` the proxy is killed (so a
/// memory blow-up fails the test instead of getting the machine's OOM killer involved) and
/// the peak is reported by `check`.
struct RssGuard {
    stop: Arc<AtomicBool>,
    tripped: Arc<Mutex<Option<u64>>>,
    peak: Arc<AtomicUsize>,
    handle: Option<thread::JoinHandle<()>>,
}

fn rss_mb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

impl RssGuard {
    fn start(proxy: &Proxy, limit_mb: u64) -> RssGuard {
        let pid = proxy.pid();
        let stop = Arc::new(AtomicBool::new(false));
        let tripped = Arc::new(Mutex::new(None));
        let peak = Arc::new(AtomicUsize::new(0));
        let (s, t, p) = (stop.clone(), tripped.clone(), peak.clone());
        let handle = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Some(mb) = rss_mb(pid) else { return };
                p.fetch_max(mb as usize, Ordering::Relaxed);
                if mb > limit_mb {
                    *t.lock().unwrap() = Some(mb);
                    // SIGKILL the proxy this test started, by its pid
                    let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
        });
        RssGuard { stop, tripped, peak, handle: Some(handle) }
    }

    /// Panics if the limit was exceeded; returns the peak RSS in MiB.
    fn check(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        if let Some(mb) = *self.tripped.lock().unwrap() {
            panic!("proxy memory blew up: RSS reached {mb} MiB; the proxy was killed");
        }
        self.peak.load(Ordering::Relaxed) as u64
    }
}

impl Drop for RssGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn config(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new().prefix("heatshield-conf-").tempdir().unwrap();
    let path = dir.path().join("heatshield.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path.to_str().unwrap().to_string())
}

const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Sends `junk` on a fresh connection in `proto` (the write may fail midway if the proxy
/// closes first), then returns everything received until the proxy closes.
fn junk_exchange(port: u16, proto: Proto, junk: Vec<u8>) -> (Vec<u8>, bool) {
    let mut c = Conn::connect_proto(port, proto);
    let writer = c.send_raw_bg(junk);
    let out = c.read_until_close(CLOSE_WAIT);
    let _ = writer.join();
    out
}

fn assert_protocol_error(port: u16, proto: Proto, junk: &[u8], want: &str) {
    let (got, closed) = junk_exchange(port, proto, junk.to_vec());
    assert_eq!(
        String::from_utf8_lossy(&got),
        format!("-ERR Protocol error: {want}\r\n"),
        "{proto:?} reply to {:?}",
        String::from_utf8_lossy(&junk[..junk.len().min(80)])
    );
    assert!(closed, "{proto:?}: connection not closed after a protocol error ({want})");
}

fn assert_serving(proxy: &Proxy) {
    assert!(proxy.is_alive(), "proxy process died");
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
    assert_eq!(c.cmd(&["SET", "bad:alive", "1"]), V::ok());
    assert_eq!(c.cmd(&["GET", "bad:alive"]), V::s("1"));
}

#[test]
fn malformed_resp_gets_a_protocol_error_and_is_closed() {
    let cluster = cluster();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let cases: &[(&[u8], &str)] = &[
        (b"*x\r\n", "invalid multibulk length"),
        (b"*1\r\n+GET\r\n", "expected '$', got '+'"),
        (b"*1\r\n$-5\r\n", "invalid bulk length"),
        (b"*1\r\n$abc\r\n", "invalid bulk length"),
        (b"*1\r\n:1\r\n", "expected '$', got ':'"),
        (b"*2\r\n$3\r\nGET\r\n*1\r\n", "expected '$', got '*'"),
        (b"*3000000000\r\n", "invalid multibulk length"),
        (b"*-\r\n", "invalid multibulk length"),
        (b"*1\r\n$01\r\nx\r\n", "invalid bulk length"),
    ];
    for proto in Proto::BOTH {
        for (junk, want) in cases {
            assert_protocol_error(proxy.port(), proto, junk, want);
        }
        // a good request before the bad one is still answered, in order
        let mut junk = b"*1\r\n$4\r\nPING\r\n".to_vec();
        junk.extend_from_slice(b"*1\r\n+GET\r\n*1\r\n$4\r\nPING\r\n");
        let (got, closed) = junk_exchange(proxy.port(), proto, junk);
        assert_eq!(
            String::from_utf8_lossy(&got),
            "+PONG\r\n-ERR Protocol error: expected '$', got '+'\r\n",
            "{proto:?}"
        );
        assert!(closed);
        // empty multibulks are skipped, as Redis does
        let mut c = Conn::connect_proto(proxy.port(), proto);
        c.send_raw(b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n");
        assert_eq!(c.read_full().raw, b"+PONG\r\n");
    }
    assert_serving(&proxy);
}

/// Requests pipelined before a protocol error in the same write are still run and
/// answered, in order, then the error. Checked without rules (each request dispatched as
/// it is parsed) and with a per-key rate-limit rule (requests parsed in batches of 32 and
/// their budgets prefetched before they run).
#[test]
fn requests_pipelined_before_a_protocol_error_are_answered_first() {
    let cluster = cluster();
    let (_dir, path) =
        config("[[ratelimit.rules]]\nname = \"all\"\npattern = \"*\"\nrate = 1000000\nburst = 1000000\n");
    for proxy in [Proxy::start_cluster(&cluster, &[]), Proxy::start_cluster(&cluster, &["--config", &path])] {
        for proto in Proto::BOTH {
            let mut junk = Vec::new();
            junk.extend_from_slice(b"*1\r\n$4\r\nPING\r\n*3\r\n$3\r\nSET\r\n$8\r\nbad:pipe\r\n$1\r\nv\r\n");
            // more requests than one batch, so the error comes in a later batch
            for _ in 0..40 {
                junk.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$8\r\nbad:pipe\r\n");
            }
            junk.extend_from_slice(b"*1\r\n+GET\r\n*1\r\n$4\r\nPING\r\n");
            let (got, closed) = junk_exchange(proxy.port(), proto, junk);
            let want =
                format!("+PONG\r\n+OK\r\n{}-ERR Protocol error: expected '$', got '+'\r\n", "$1\r\nv\r\n".repeat(40));
            assert_eq!(String::from_utf8_lossy(&got), want, "{proto:?}");
            assert!(closed, "{proto:?}: connection not closed after the protocol error");
        }
        assert_serving(&proxy);
    }
}

#[test]
fn unbalanced_quotes_in_inline_commands() {
    let cluster = cluster();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    for proto in Proto::BOTH {
        assert_protocol_error(proxy.port(), proto, b"SET a \"b\r\n", "unbalanced quotes in request");
        assert_protocol_error(proxy.port(), proto, b"SET 'a\r\n", "unbalanced quotes in request");
        assert_protocol_error(proxy.port(), proto, b"ECHO \"a\"b\r\n", "unbalanced quotes in request");
        // an inline line that never ends is bounded
        let mut long = vec![b'a'; 70 * 1024];
        long.extend_from_slice(b"\r\n");
        assert_protocol_error(proxy.port(), proto, &long, "too big inline request");
    }
    assert_serving(&proxy);
}

#[test]
fn nul_bytes_end_an_inline_command() {
    // Redis splits inline commands as C strings: a NUL ends the line. (An earlier
    // heatshield looped forever, allocating, on an inline line containing a NUL.)
    let cluster = cluster();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let guard = RssGuard::start(&proxy, 512);
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        c.send_raw(b"\0\r\nECHO a\0b c\r\n\0\0\0 x\r\nPING\r\n");
        let r = c.read_reply();
        assert_eq!(r, V::s("a"), "{proto:?}: ECHO a<NUL>b must echo 'a'");
        assert_eq!(c.read_reply(), V::s("PONG"), "{proto:?}");
    }
    guard.check();
    assert_serving(&proxy);
}

#[test]
fn oversize_bulk_header_is_refused_at_once() {
    let cluster = cluster();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    for proto in Proto::BOTH {
        let start = Instant::now();
        assert_protocol_error(proxy.port(), proto, b"*2\r\n$3\r\nSET\r\n$999999999999\r\n", "invalid bulk length");
        assert!(start.elapsed() < Duration::from_secs(2), "the proxy waited for the body");
        assert_protocol_error(
            proxy.port(),
            proto,
            b"*2\r\n$3\r\nSET\r\n$9223372036854775808\r\n",
            "invalid bulk length",
        );
        // a header line that never ends is bounded too
        let mut big = b"*1\r\n$".to_vec();
        big.extend(vec![b'9'; 70 * 1024]);
        assert_protocol_error(proxy.port(), proto, &big, "too big bulk count string");
    }
    assert_serving(&proxy);
}

#[test]
fn deeply_nested_arrays_do_not_recurse() {
    let cluster = cluster();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    for proto in Proto::BOTH {
        let junk = b"*1\r\n".repeat(100_000);
        assert_protocol_error(proxy.port(), proto, &junk, "expected '$', got '*'");
        assert!(proxy.is_alive());
    }
    assert_serving(&proxy);
}

#[test]
fn max_request_bytes_is_enforced() {
    let cluster = cluster();
    let (_dir, path) = config("[limits]\nmax_request_bytes = 1048576\n");
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    for proto in Proto::BOTH {
        let key = format!("bad:limit:{}", proto.tag());
        // under the limit: fine
        let half = vec![b'h'; 512 * 1024];
        let mut c = Conn::connect_proto(proxy.port(), proto);
        assert_eq!(c.cmd(&[b"SET".as_slice(), key.as_bytes(), &half]), V::ok());
        assert_eq!(c.cmd(&["STRLEN", &key]), V::Int(512 * 1024));

        // a 2 MiB bulk: refused with Redis's error, connection closed
        let big = vec![b'b'; 2 * 1024 * 1024];
        let mut req = format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n", key.len(), big.len()).into_bytes();
        req.extend_from_slice(&big);
        req.extend_from_slice(b"\r\n");
        let (got, closed) = junk_exchange(proxy.port(), proto, req);
        assert_eq!(
            String::from_utf8_lossy(&got),
            "-ERR Protocol error: invalid bulk length\r\n",
            "{proto:?} 2 MiB SET with max_request_bytes = 1 MiB"
        );
        assert!(closed);
        // nothing was written
        assert_eq!(c.cmd(&["STRLEN", &key]), V::Int(512 * 1024));

        // many small arguments adding up to more than the limit: refused as well
        let mut req = b"*401\r\n$4\r\nMSET\r\n".to_vec();
        for i in 0..200 {
            let k = format!("bad:many:{i}");
            req.extend_from_slice(format!("${}\r\n{k}\r\n$8192\r\n", k.len()).as_bytes());
            req.extend(vec![b'x'; 8192]);
            req.extend_from_slice(b"\r\n");
        }
        let (got, closed) = junk_exchange(proxy.port(), proto, req);
        let got = String::from_utf8_lossy(&got);
        assert!(
            got.starts_with("-ERR Protocol error: ") && got.ends_with("\r\n") && got.lines().count() == 1,
            "{proto:?} 1.6 MiB MSET: {got:?}"
        );
        assert!(closed);
        assert_eq!(c.cmd(&["EXISTS", "bad:many:0", "bad:many:199"]), V::Int(0));
    }
    assert_serving(&proxy);
}

/// Junk of many kinds, deterministic.
fn junk_corpus() -> Vec<Vec<u8>> {
    let mut corpus: Vec<Vec<u8>> = vec![
        b"*x\r\n".to_vec(),
        b"*1\r\n+GET\r\n".to_vec(),
        b"*1\r\n$-5\r\n".to_vec(),
        b"*2\r\n$3\r\nSET\r\n$999999999999\r\n".to_vec(),
        b"SET a \"b\r\n".to_vec(),
        b"*1\r\n".repeat(10_000),
        b"*3\r\n$3\r\nSET\r\n$1\r\na".to_vec(), // truncated, then closed
        b"*2\r\n$3\r\nGET\r\n".to_vec(),        // truncated
        b"\r\n\r\n\n\n".to_vec(),
        b"GET\r\n".to_vec(),
        vec![0u8; 5000],
        vec![0xffu8; 5000],
        b"$5\r\nhello\r\n".to_vec(),
        b"*1\r\n$8\r\nFLUSHALL\r\n".to_vec(),
        b"*2\r\n$5\r\nHELLO\r\n$1\r\n9\r\n".to_vec(),
        b"*1\r\n$5\r\nMULTI\r\n*1\r\n$4\r\nEXEC\r\n".to_vec(),
        b"*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\nc\r\n".to_vec(),
    ];
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let alphabet = b"*$:+-\r\n0123456789-abcSETGET \"'";
    for i in 0..120 {
        let len = (next() % 2000) as usize + 1;
        let bytes: Vec<u8> = if i % 2 == 0 {
            (0..len).map(|_| next() as u8).collect()
        } else {
            (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect()
        };
        corpus.push(bytes);
    }
    corpus
}

/// Checks that `bytes` is a sequence of well-formed RESP replies (a reset connection may
/// cut the last one short).
fn well_formed(bytes: &[u8], proto: Proto) -> Result<usize, String> {
    let mut pos = 0;
    let mut n = 0;
    while pos < bytes.len() {
        match decode_reply(&bytes[pos..], proto)? {
            Some((_, used)) => {
                pos += used;
                n += 1;
            }
            None => return Err(format!("incomplete reply at byte {pos}")),
        }
    }
    Ok(n)
}

#[test]
fn garbage_never_affects_a_concurrent_client() {
    let cluster = cluster();
    let proxy = Proxy::start_cluster(&cluster, &[]);
    let guard = RssGuard::start(&proxy, 1024);
    let port = proxy.port();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));

    let good: Vec<_> = Proto::BOTH
        .into_iter()
        .map(|proto| {
            let (stop, ops, errors) = (stop.clone(), ops.clone(), errors.clone());
            thread::spawn(move || {
                let mut c = Conn::connect_proto(port, proto);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("bad:good:{}:{}", proto.tag(), i % 50);
                    let v = format!("value-{i}");
                    let set = c.try_cmd(&["SET", &k, &v]);
                    let get = c.try_cmd(&["GET", &k]);
                    let mget = c.try_cmd(&["MGET", &k, "bad:good:none", &k]);
                    match (set, get, mget) {
                        (Ok(s), Ok(g), Ok(m))
                            if s.is_ok() && g == V::s(&v) && m == V::Arr(vec![V::s(&v), V::Nil, V::s(&v)]) => {}
                        other => {
                            errors.lock().unwrap().push(format!("{proto:?} op {i}: {other:?}"));
                            if other.0.is_err() {
                                return; // connection gone; reported above
                            }
                        }
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();

    // junk from several threads at once, each connection half-closed after its junk
    let corpus = Arc::new(junk_corpus());
    let next = Arc::new(AtomicUsize::new(0));
    let bad_replies = Arc::new(Mutex::new(Vec::<String>::new()));
    let junkers: Vec<_> = (0..4)
        .map(|_| {
            let (corpus, next, bad_replies) = (corpus.clone(), next.clone(), bad_replies.clone());
            thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(junk) = corpus.get(i) else { return };
                    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                    let mut s = match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                        Ok(s) => s,
                        Err(e) => {
                            bad_replies.lock().unwrap().push(format!("junk #{i}: connect failed: {e}"));
                            return;
                        }
                    };
                    s.set_read_timeout(Some(CLOSE_WAIT)).unwrap();
                    let _ = s.write_all(junk);
                    if i % 3 == 0 {
                        drop(s); // abrupt close, possibly mid-request
                        continue;
                    }
                    let _ = s.shutdown(std::net::Shutdown::Write);
                    let mut out = vec![];
                    let mut chunk = [0u8; 16384];
                    let closed = loop {
                        match s.read(&mut chunk) {
                            Ok(0) => break true,
                            Ok(n) => out.extend_from_slice(&chunk[..n]),
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) =>
                            {
                                break false;
                            }
                            Err(_) => break true,
                        }
                    };
                    if !closed {
                        bad_replies.lock().unwrap().push(format!("junk #{i}: connection not closed"));
                    }
                    if let Err(e) = well_formed(&out, Proto::Resp2) {
                        // a reset may cut the tail; anything else is a bug
                        if !e.starts_with("incomplete") {
                            bad_replies.lock().unwrap().push(format!("junk #{i}: {e}"));
                        }
                    }
                }
            })
        })
        .collect();
    for j in junkers {
        if j.join().is_err() {
            guard.check();
            panic!("junk thread failed");
        }
    }
    // keep the good clients running a little past the junk
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for g in good {
        g.join().expect("good client thread");
    }
    let peak = guard.check();
    eprintln!("proxy peak RSS during the junk: {peak} MiB");
    let errors = errors.lock().unwrap();
    assert!(errors.is_empty(), "the well-behaved clients saw errors: {:?}", &errors[..errors.len().min(10)]);
    assert!(ops.load(Ordering::Relaxed) > 50, "good clients made too little progress: {}", ops.load(Ordering::Relaxed));
    let bad = bad_replies.lock().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_serving(&proxy);
}
