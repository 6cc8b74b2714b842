//! The tests' one Redis client: RESP2 and RESP3, encoding and decoding.
//!
//! * [`Conn`] is one blocking `TcpStream` (10 s read/write timeouts) with its own read
//!   buffer, so replies can be read one at a time, pipelined, or mixed with raw bytes.
//!   It starts in RESP2; [`Conn::hello3`] sends `HELLO 3` and switches decoding to RESP3.
//! * Replies are decoded with the `redis_protocol` crate (RESP2:
//!   `resp2::decode::decode`, RESP3: `resp3::decode::complete::decode`) and normalized
//!   into [`V`]. [`Reply`] additionally keeps the exact bytes and the frame kinds
//!   ([`Shape`] / [`Kind`]), so tests can assert RESP3 types (a map, a double, `_` null)
//!   and compare replies byte for byte. [`encode`] is the one command encoder.
//! * One-shot commands on a fresh connection: [`cmd`] / [`try_cmd`] return a [`V`];
//!   [`cmd_text`] returns the reply as text the way `redis-cli` prints it when piped
//!   (what the tests compared against when they shelled out to it).
//! * [`Resp`] is a strict RESP2 view of a [`Reply`] (simple vs bulk string, null bulk vs
//!   null array) for tests that assert those, and [`parse_resp`] decodes one from bytes.

#![allow(dead_code)]

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use redis_protocol::resp2::types::OwnedFrame as Frame2;
use redis_protocol::resp3::types::OwnedFrame as Frame3;

/// Read/write timeout of a [`Conn`].
pub const CONN_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------

/// The protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Resp2,
    Resp3,
}

impl Proto {
    /// Both protocols, for tests that must run over each.
    pub const BOTH: [Proto; 2] = [Proto::Resp2, Proto::Resp3];

    pub fn version(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }

    /// Short tag for key names, so the two protocol passes of a test use distinct keys.
    pub fn tag(self) -> &'static str {
        match self {
            Proto::Resp2 => "r2",
            Proto::Resp3 => "r3",
        }
    }
}

/// A decoded reply, normalized over RESP2 and RESP3.
///
/// Map entries and set members are sorted (by their RESP encoding) because the decoder
/// stores them in hash containers; compare maps and sets as unordered.
#[derive(Clone, PartialEq)]
pub enum V {
    /// RESP2 `$-1` / `*-1`, RESP3 `_`.
    Nil,
    Int(i64),
    /// Bulk, simple, or verbatim string (verbatim without its `txt:` prefix).
    Str(Vec<u8>),
    /// Simple or blob error, the whole text (e.g. `ERR syntax error`).
    Err(String),
    /// Array (and RESP3 push).
    Arr(Vec<V>),
    Map(Vec<(V, V)>),
    Set(Vec<V>),
    Double(f64),
    Bool(bool),
    Big(String),
}

fn fmt_bytes(f: &mut fmt::Formatter<'_>, b: &[u8]) -> fmt::Result {
    const MAX: usize = 200;
    let shown = String::from_utf8_lossy(&b[..b.len().min(MAX)]);
    if b.len() > MAX { write!(f, "{shown:?}...({} bytes)", b.len()) } else { write!(f, "{shown:?}") }
}

impl fmt::Debug for V {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            V::Nil => write!(f, "Nil"),
            V::Int(i) => write!(f, "Int({i})"),
            V::Str(s) => {
                write!(f, "Str(")?;
                fmt_bytes(f, s)?;
                write!(f, ")")
            }
            V::Err(e) => write!(f, "Err({e:?})"),
            V::Arr(a) => {
                write!(f, "Arr")?;
                if a.len() > 50 {
                    f.debug_list().entries(&a[..50]).finish()?;
                    write!(f, "...({} items)", a.len())
                } else {
                    f.debug_list().entries(a).finish()
                }
            }
            V::Map(m) => {
                write!(f, "Map")?;
                f.debug_map().entries(m.iter().map(|(k, v)| (k, v))).finish()
            }
            V::Set(s) => {
                write!(f, "Set")?;
                f.debug_list().entries(s).finish()
            }
            V::Double(d) => write!(f, "Double({d})"),
            V::Bool(b) => write!(f, "Bool({b})"),
            V::Big(b) => write!(f, "Big({b})"),
        }
    }
}

impl V {
    /// `V::Str` from text.
    pub fn s(text: impl AsRef<[u8]>) -> V {
        V::Str(text.as_ref().to_vec())
    }

    /// `V::Arr` of strings.
    pub fn strs<S: AsRef<[u8]>>(items: &[S]) -> V {
        V::Arr(items.iter().map(V::s).collect())
    }

    pub fn ok() -> V {
        V::s("OK")
    }

    pub fn is_ok(&self) -> bool {
        *self == V::ok()
    }

    pub fn is_nil(&self) -> bool {
        matches!(self, V::Nil)
    }

    pub fn is_err(&self) -> bool {
        matches!(self, V::Err(_))
    }

    /// The error text, if this is an error.
    pub fn err(&self) -> Option<&str> {
        match self {
            V::Err(e) => Some(e),
            _ => None,
        }
    }

    /// String payload (panics with the value otherwise).
    pub fn bytes(&self) -> &[u8] {
        match self {
            V::Str(s) => s,
            other => panic!("expected a string reply, got {other:?}"),
        }
    }

    /// String payload as UTF-8 text (lossy; panics if not a string).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(self.bytes()).into_owned()
    }

    /// String payload as UTF-8 text (lossy), or `None` if this is not a string.
    pub fn as_text(&self) -> Option<String> {
        match self {
            V::Str(s) => Some(String::from_utf8_lossy(s).into_owned()),
            _ => None,
        }
    }

    /// Integer payload (panics otherwise).
    pub fn int(&self) -> i64 {
        match self {
            V::Int(i) => *i,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// Elements of an array or set (panics otherwise).
    pub fn items(&self) -> &[V] {
        match self {
            V::Arr(a) | V::Set(a) => a,
            other => panic!("expected an array reply, got {other:?}"),
        }
    }

    /// Key/value pairs of a map, or of a flat RESP2 array of pairs.
    pub fn pairs(&self) -> Vec<(V, V)> {
        match self {
            V::Map(m) => m.clone(),
            V::Arr(a) => {
                assert!(a.len() % 2 == 0, "odd-length array is not a map: {self:?}");
                a.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect()
            }
            other => panic!("expected a map reply, got {other:?}"),
        }
    }

    /// Value of `key` in a map (or a flat RESP2 array of pairs).
    pub fn get(&self, key: &str) -> Option<V> {
        self.pairs().into_iter().find(|(k, _)| *k == V::s(key)).map(|(_, v)| v)
    }

    /// Canonical bytes used to sort map entries and set members.
    fn canon(&self) -> Vec<u8> {
        format!("{self:?}").into_bytes()
    }
}

/// The kind of a frame as it came over the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `+`
    Simple,
    /// `$`
    Bulk,
    /// RESP3 `=`
    Verbatim,
    /// `-`
    Error,
    /// RESP3 `!`
    BlobError,
    /// `:`
    Int,
    /// RESP3 `_`
    Null,
    /// RESP2 `$-1` (also any nested RESP2 null: the decoder does not say which it was)
    NullBulk,
    /// RESP2 `*-1` (top level only)
    NullArray,
    /// `*`
    Array,
    /// RESP3 `%`
    Map,
    /// RESP3 `~`
    Set,
    /// RESP3 `>`
    Push,
    /// RESP3 `,`
    Double,
    /// RESP3 `#`
    Bool,
    /// RESP3 `(`
    Big,
}

/// Frame kinds of a reply and of its elements (for a map: key, value, key, value... in
/// the same order as [`V::Map`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub kind: Kind,
    pub items: Vec<Shape>,
}

impl Shape {
    fn leaf(kind: Kind) -> Shape {
        Shape { kind, items: vec![] }
    }

    /// Kinds of the direct elements.
    pub fn kinds(&self) -> Vec<Kind> {
        self.items.iter().map(|s| s.kind).collect()
    }
}

/// One reply: the normalized value, its frame kinds, and the exact bytes received.
#[derive(Clone)]
pub struct Reply {
    pub v: V,
    pub shape: Shape,
    pub raw: Vec<u8>,
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reply {{ v: {:?}, kind: {:?}, raw: ", self.v, self.shape.kind)?;
        fmt_bytes(f, &self.raw)?;
        write!(f, " }}")
    }
}

impl Reply {
    pub fn kind(&self) -> Kind {
        self.shape.kind
    }
}

fn from_frame2(f: Frame2) -> (V, Shape) {
    match f {
        Frame2::SimpleString(s) => (V::Str(s), Shape::leaf(Kind::Simple)),
        Frame2::Error(e) => (V::Err(e), Shape::leaf(Kind::Error)),
        Frame2::Integer(i) => (V::Int(i), Shape::leaf(Kind::Int)),
        Frame2::BulkString(b) => (V::Str(b), Shape::leaf(Kind::Bulk)),
        Frame2::Null => (V::Nil, Shape::leaf(Kind::NullBulk)),
        Frame2::Array(items) => {
            let (vs, shapes) = items.into_iter().map(from_frame2).unzip();
            (V::Arr(vs), Shape { kind: Kind::Array, items: shapes })
        }
    }
}

fn from_frame3(f: Frame3) -> (V, Shape) {
    let list = |items: Vec<Frame3>, kind: Kind| -> (Vec<V>, Shape) {
        let (vs, shapes): (Vec<V>, Vec<Shape>) = items.into_iter().map(from_frame3).unzip();
        (vs, Shape { kind, items: shapes })
    };
    match f {
        Frame3::BlobString { data, .. } => (V::Str(data), Shape::leaf(Kind::Bulk)),
        Frame3::SimpleString { data, .. } => (V::Str(data), Shape::leaf(Kind::Simple)),
        Frame3::VerbatimString { data, .. } => (V::Str(data), Shape::leaf(Kind::Verbatim)),
        Frame3::SimpleError { data, .. } => (V::Err(data), Shape::leaf(Kind::Error)),
        Frame3::BlobError { data, .. } => {
            (V::Err(String::from_utf8_lossy(&data).into_owned()), Shape::leaf(Kind::BlobError))
        }
        Frame3::Boolean { data, .. } => (V::Bool(data), Shape::leaf(Kind::Bool)),
        Frame3::Null => (V::Nil, Shape::leaf(Kind::Null)),
        Frame3::Number { data, .. } => (V::Int(data), Shape::leaf(Kind::Int)),
        Frame3::Double { data, .. } => (V::Double(data), Shape::leaf(Kind::Double)),
        Frame3::BigNumber { data, .. } => (V::Big(String::from_utf8_lossy(&data).into_owned()), Shape::leaf(Kind::Big)),
        Frame3::Array { data, .. } => {
            let (vs, shape) = list(data, Kind::Array);
            (V::Arr(vs), shape)
        }
        Frame3::Push { data, .. } => {
            let (vs, shape) = list(data, Kind::Push);
            (V::Arr(vs), shape)
        }
        Frame3::Set { data, .. } => {
            let mut pairs: Vec<(V, Shape)> = data.into_iter().map(from_frame3).collect();
            pairs.sort_by_key(|(v, _)| v.canon());
            let (vs, shapes) = pairs.into_iter().unzip();
            (V::Set(vs), Shape { kind: Kind::Set, items: shapes })
        }
        Frame3::Map { data, .. } => {
            let mut entries: Vec<((V, Shape), (V, Shape))> =
                data.into_iter().map(|(k, v)| (from_frame3(k), from_frame3(v))).collect();
            entries.sort_by_key(|((k, _), _)| k.canon());
            let mut vs = Vec::with_capacity(entries.len());
            let mut shapes = Vec::with_capacity(entries.len() * 2);
            for ((k, ks), (v, vsh)) in entries {
                vs.push((k, v));
                shapes.push(ks);
                shapes.push(vsh);
            }
            (V::Map(vs), Shape { kind: Kind::Map, items: shapes })
        }
        other => panic!("unexpected RESP3 frame from server: {other:?}"),
    }
}

/// Decodes one reply at the start of `buf`: `Ok(None)` if incomplete.
pub fn decode_reply(buf: &[u8], proto: Proto) -> Result<Option<(Reply, usize)>, String> {
    let (v, mut shape, used) = match proto {
        Proto::Resp2 => match redis_protocol::resp2::decode::decode(buf) {
            Ok(Some((f, used))) => {
                let (v, s) = from_frame2(f);
                (v, s, used)
            }
            Ok(None) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        },
        Proto::Resp3 => match redis_protocol::resp3::decode::complete::decode(buf) {
            Ok(Some((f, used))) => {
                let (v, s) = from_frame3(f);
                (v, s, used)
            }
            Ok(None) => return Ok(None),
            // redis_protocol keeps sets and maps in hash containers and cannot hold an
            // aggregate (e.g. COMMAND INFO's set of maps) as a member; decode those here.
            Err(e) if e.to_string().contains("hash key") => match fallback3(buf, 0)? {
                Some((v, s, used)) => (v, s, used),
                None => return Ok(None),
            },
            Err(e) => return Err(e.to_string()),
        },
    };
    if proto == Proto::Resp2 && buf.starts_with(b"*-1\r\n") {
        shape.kind = Kind::NullArray;
    }
    Ok(Some((Reply { v, shape, raw: buf[..used].to_vec() }, used)))
}

/// Minimal RESP3 decoder for what `redis_protocol` rejects (aggregates inside sets or as
/// map keys). `Ok(None)`: incomplete.
fn fallback3(buf: &[u8], depth: usize) -> Result<Option<(V, Shape, usize)>, String> {
    if depth > 64 {
        return Err("reply nested too deeply".into());
    }
    let Some(&t) = buf.first() else { return Ok(None) };
    let Some(nl) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = std::str::from_utf8(&buf[1..nl]).map_err(|e| e.to_string())?;
    let after = nl + 2;
    let num = || line.parse::<i64>().map_err(|e| format!("bad number {line:?}: {e}"));
    let leaf = |v: V, k: Kind| Ok(Some((v, Shape::leaf(k), after)));
    match t {
        b'+' => leaf(V::s(line), Kind::Simple),
        b'-' => leaf(V::Err(line.to_string()), Kind::Error),
        b':' => leaf(V::Int(num()?), Kind::Int),
        b'_' => leaf(V::Nil, Kind::Null),
        b'#' => leaf(V::Bool(line == "t"), Kind::Bool),
        b',' => leaf(
            V::Double(match line {
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                l => l.parse().map_err(|e| format!("bad double {l:?}: {e}"))?,
            }),
            Kind::Double,
        ),
        b'(' => leaf(V::Big(line.to_string()), Kind::Big),
        b'$' | b'!' | b'=' => {
            let n = num()?;
            if n < 0 {
                return leaf(V::Nil, Kind::NullBulk);
            }
            let end = after + n as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            let data = &buf[after..end];
            let (v, k) = match t {
                b'$' => (V::Str(data.to_vec()), Kind::Bulk),
                b'!' => (V::Err(String::from_utf8_lossy(data).into_owned()), Kind::BlobError),
                _ => (V::Str(data.get(4..).unwrap_or_default().to_vec()), Kind::Verbatim),
            };
            Ok(Some((v, Shape::leaf(k), end + 2)))
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = num()?;
            let count = if matches!(t, b'%' | b'|') { n * 2 } else { n };
            let mut pos = after;
            let mut items = Vec::new();
            for _ in 0..count.max(0) {
                match fallback3(&buf[pos..], depth + 1)? {
                    Some((v, s, used)) => {
                        items.push((v, s));
                        pos += used;
                    }
                    None => return Ok(None),
                }
            }
            if t == b'|' {
                // attributes: skip them, the value follows
                return Ok(fallback3(&buf[pos..], depth + 1)?.map(|(v, s, used)| (v, s, pos + used)));
            }
            let (v, shape) = match t {
                b'%' => {
                    let mut entries: Vec<((V, Shape), (V, Shape))> = Vec::new();
                    let mut it = items.into_iter();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        entries.push((k, v));
                    }
                    entries.sort_by_key(|((k, _), _)| k.canon());
                    let mut shapes = vec![];
                    let mut pairs = vec![];
                    for ((k, ks), (v, vs)) in entries {
                        shapes.push(ks);
                        shapes.push(vs);
                        pairs.push((k, v));
                    }
                    (V::Map(pairs), Shape { kind: Kind::Map, items: shapes })
                }
                b'~' => {
                    items.sort_by_key(|(v, _)| v.canon());
                    let (vs, shapes) = items.into_iter().unzip();
                    (V::Set(vs), Shape { kind: Kind::Set, items: shapes })
                }
                _ => {
                    let kind = if t == b'>' { Kind::Push } else { Kind::Array };
                    let (vs, shapes) = items.into_iter().unzip();
                    (V::Arr(vs), Shape { kind, items: shapes })
                }
            };
            Ok(Some((v, shape, pos)))
        }
        other => Err(format!("unknown RESP3 type byte {:?}", other as char)),
    }
}

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

/// Owned arguments of one command, for [`Conn::pipeline`].
pub fn args<A: AsRef<[u8]>>(a: &[A]) -> Vec<Vec<u8>> {
    a.iter().map(|x| x.as_ref().to_vec()).collect()
}

/// RESP encoding of one command: an array of bulk strings.
pub fn encode<A: AsRef<[u8]>>(a: &[A]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", a.len()).into_bytes();
    for arg in a {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn lossy_args<A: AsRef<[u8]>>(a: &[A]) -> Vec<String> {
    a.iter()
        .map(|x| {
            let b = x.as_ref();
            let s = String::from_utf8_lossy(&b[..b.len().min(60)]).into_owned();
            if b.len() > 60 { format!("{s}...({} bytes)", b.len()) } else { s }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Conn
// ---------------------------------------------------------------------------

/// One persistent client connection.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Start of undecoded data in `buf`.
    pos: usize,
    pub proto: Proto,
    pub port: u16,
}

impl Conn {
    /// Connects to `127.0.0.1:port` (RESP2). Panics on failure.
    pub fn connect(port: u16) -> Conn {
        Self::try_connect(port).unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"))
    }

    pub fn try_connect(port: u16) -> io::Result<Conn> {
        Self::try_connect_within(port, CONN_TIMEOUT)
    }

    /// Connects with `timeout` for the connect and every read and write.
    pub fn try_connect_within(port: u16, timeout: Duration) -> io::Result<Conn> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Conn { stream, buf: Vec::with_capacity(64 * 1024), pos: 0, proto: Proto::Resp2, port })
    }

    /// Connects and, for RESP3, sends `HELLO 3` (asserting it succeeds).
    pub fn connect_proto(port: u16, proto: Proto) -> Conn {
        let mut c = Self::connect(port);
        if proto == Proto::Resp3 {
            let v = c.hello3();
            assert!(matches!(v, V::Map(_)), "HELLO 3 on port {port} returned {v:?}");
        }
        c
    }

    /// Sends `HELLO 3` and from now on decodes RESP3. Returns the reply (a map on success).
    pub fn hello3(&mut self) -> V {
        self.send(&["HELLO", "3"]);
        self.proto = Proto::Resp3;
        let r = self.read_full();
        if r.v.is_err() {
            self.proto = Proto::Resp2;
        }
        r.v
    }

    /// Switches reply decoding (e.g. after a `HELLO 3 AUTH ...` sent by hand).
    pub fn set_proto(&mut self, proto: Proto) {
        self.proto = proto;
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends one command and returns its reply.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, a: &[A]) -> V {
        self.cmd_full(a).v
    }

    /// Sends one command and returns its reply with kinds and raw bytes.
    pub fn cmd_full<A: AsRef<[u8]>>(&mut self, a: &[A]) -> Reply {
        self.send(a);
        match self.try_read_full() {
            Ok(r) => r,
            Err(e) => panic!(
                "{:?} on port {}: reading reply failed: {e}{}",
                lossy_args(a),
                self.port,
                super::proxy::log_tail_for(self.port)
            ),
        }
    }

    /// Like [`cmd`](Self::cmd) but returns I/O errors instead of panicking.
    pub fn try_cmd<A: AsRef<[u8]>>(&mut self, a: &[A]) -> io::Result<V> {
        self.try_send_raw(&encode(a))?;
        Ok(self.try_read_full()?.v)
    }

    /// Writes one command without reading.
    pub fn send<A: AsRef<[u8]>>(&mut self, a: &[A]) {
        self.send_raw(&encode(a));
    }

    /// Writes bytes as they are. Panics on I/O errors.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        if let Err(e) = self.try_send_raw(bytes) {
            panic!(
                "write of {} bytes to port {} failed: {e}{}",
                bytes.len(),
                self.port,
                super::proxy::log_tail_for(self.port)
            );
        }
    }

    pub fn try_send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Writes `bytes` from a background thread (for payloads the peer may stop reading
    /// midway, or that are too large to write before reading replies).
    pub fn send_raw_bg(&self, bytes: Vec<u8>) -> JoinHandle<io::Result<()>> {
        let mut w = self.stream.try_clone().expect("clone stream");
        thread::spawn(move || {
            w.write_all(&bytes)?;
            w.flush()
        })
    }

    /// Reads one reply (panics on I/O or decode errors).
    pub fn read_reply(&mut self) -> V {
        self.read_full().v
    }

    pub fn read_full(&mut self) -> Reply {
        match self.try_read_full() {
            Ok(r) => r,
            Err(e) => {
                panic!("reading a reply from port {} failed: {e}{}", self.port, super::proxy::log_tail_for(self.port))
            }
        }
    }

    /// Reads one reply; EOF, timeouts and undecodable bytes are errors.
    pub fn try_read_full(&mut self) -> io::Result<Reply> {
        loop {
            if self.pos < self.buf.len() {
                match decode_reply(&self.buf[self.pos..], self.proto) {
                    Ok(Some((r, used))) => {
                        self.pos += used;
                        if self.pos == self.buf.len() {
                            self.buf.clear();
                            self.pos = 0;
                        }
                        return Ok(r);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let start = &self.buf[self.pos..];
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "undecodable {:?} reply ({e}): {:?}",
                                self.proto,
                                String::from_utf8_lossy(&start[..start.len().min(200)])
                            ),
                        ));
                    }
                }
            }
            if self.fill()? == 0 {
                let rest = &self.buf[self.pos..];
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed (pending partial reply: {:?})",
                        String::from_utf8_lossy(&rest[..rest.len().min(200)])
                    ),
                ));
            }
        }
    }

    /// Reads more bytes into the buffer; returns how many (0 = EOF).
    fn fill(&mut self) -> io::Result<usize> {
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let len = self.buf.len();
        // Grow the read size with the buffer so a 100 MiB reply takes few reads.
        let want = (len / 2).clamp(64 * 1024, 8 * 1024 * 1024);
        self.buf.resize(len + want, 0);
        let res = self.stream.read(&mut self.buf[len..]);
        let n = *res.as_ref().unwrap_or(&0);
        self.buf.truncate(len + n);
        res
    }

    /// Bytes received but not yet decoded as replies.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Reads everything until the peer closes (or `timeout` passes); returns the bytes and
    /// whether the connection was closed (EOF or reset) rather than timed out.
    pub fn read_until_close(&mut self, timeout: Duration) -> (Vec<u8>, bool) {
        self.stream.set_read_timeout(Some(timeout)).expect("set timeout");
        let mut out = self.buf[self.pos..].to_vec();
        self.buf.clear();
        self.pos = 0;
        let mut chunk = vec![0u8; 64 * 1024];
        let closed = loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => break true,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    break false;
                }
                Err(_) => break true, // reset counts as closed
            }
        };
        let _ = self.stream.set_read_timeout(Some(CONN_TIMEOUT));
        (out, closed)
    }

    /// True if the peer closes the connection (EOF or reset) within `timeout` without
    /// sending anything else. Panics if it sends more bytes.
    pub fn expect_closed(&mut self, timeout: Duration) -> bool {
        let (rest, closed) = self.read_until_close(timeout);
        assert!(
            rest.is_empty(),
            "expected the connection to close, but got more bytes: {:?}",
            String::from_utf8_lossy(&rest[..rest.len().min(300)])
        );
        closed
    }

    /// Writes all commands (from a background thread, so a long pipeline cannot deadlock
    /// on full socket buffers), then reads one reply per command, in order.
    pub fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> Vec<V> {
        self.pipeline_full(cmds).into_iter().map(|r| r.v).collect()
    }

    pub fn pipeline_full(&mut self, cmds: &[Vec<Vec<u8>>]) -> Vec<Reply> {
        let mut bytes = Vec::new();
        for c in cmds {
            bytes.extend_from_slice(&encode(c));
        }
        let writer = self.send_raw_bg(bytes);
        let mut out = Vec::with_capacity(cmds.len());
        for (i, c) in cmds.iter().enumerate() {
            match self.try_read_full() {
                Ok(r) => out.push(r),
                Err(e) => panic!(
                    "pipeline on port {}: reply {i} of {} ({:?}) failed: {e}{}",
                    self.port,
                    cmds.len(),
                    lossy_args(c),
                    super::proxy::log_tail_for(self.port)
                ),
            }
        }
        writer.join().expect("pipeline writer thread").expect("pipeline write");
        out
    }

    /// Half-closes the write side (the peer sees EOF).
    pub fn shutdown_write(&self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

// ---------------------------------------------------------------------------
// One-shot commands
// ---------------------------------------------------------------------------

/// Sends one command over a fresh connection to `127.0.0.1:port` (RESP2) and returns
/// its reply; I/O errors are returned.
pub fn try_cmd<A: AsRef<[u8]>>(port: u16, a: &[A]) -> io::Result<V> {
    Conn::try_connect(port)?.try_cmd(a)
}

/// [`try_cmd`] that panics on I/O errors.
pub fn cmd<A: AsRef<[u8]>>(port: u16, a: &[A]) -> V {
    try_cmd(port, a).unwrap_or_else(|e| panic!("{:?} on port {port} failed: {e}", lossy_args(a)))
}

/// Sends one command over a fresh connection and returns the reply as the text
/// `redis-cli` prints for it when its output is not a terminal, trimmed: a string as it
/// is, an integer in decimal, an error's text, nil as nothing, an array's elements one a
/// line. Panics on I/O errors.
pub fn cmd_text<A: AsRef<[u8]>>(port: u16, a: &[A]) -> String {
    cli_text(&cmd(port, a)).trim().to_string()
}

/// `redis-cli`'s piped ("raw") rendering of a reply, untrimmed.
fn cli_text(v: &V) -> String {
    match v {
        V::Nil => String::new(),
        V::Int(i) => i.to_string(),
        V::Str(s) => String::from_utf8_lossy(s).into_owned(),
        V::Err(e) => e.clone(),
        V::Arr(items) | V::Set(items) => items.iter().map(cli_text).collect::<Vec<_>>().join("\n"),
        V::Map(pairs) => pairs.iter().flat_map(|(k, v)| [cli_text(k), cli_text(v)]).collect::<Vec<_>>().join("\n"),
        V::Double(_) | V::Bool(_) | V::Big(_) => unreachable!("RESP2 (what cmd_text speaks) has no {v:?}"),
    }
}

/// The exact bytes of the reply to `PING` on a fresh connection, with 1 s timeouts;
/// `None` if the connection or the exchange fails (for readiness polls).
pub fn ping_raw(port: u16) -> Option<Vec<u8>> {
    let mut c = Conn::try_connect_within(port, Duration::from_secs(1)).ok()?;
    c.try_send_raw(&encode(&["PING"])).ok()?;
    c.try_read_full().ok().map(|r| r.raw)
}

// ---------------------------------------------------------------------------
// Strict RESP2 view
// ---------------------------------------------------------------------------

/// A RESP2 reply with the distinctions [`V`] drops: simple vs bulk string, null bulk
/// string vs null array. Built from a [`Reply`] ([`Resp::from_reply`]) or decoded from
/// bytes ([`parse_resp`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// `+...`
    Simple(String),
    /// `-...`
    Error(String),
    /// `:...`
    Int(i64),
    /// `$...`; `None` is the null bulk string `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*...`; `None` is the null array `*-1` (at the top level; the decoder reports a
    /// nested `*-1` as a null bulk string).
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The RESP2 view of a reply decoded as RESP2. Panics on RESP3-only kinds.
    pub fn from_reply(r: &Reply) -> Resp {
        Self::from_parts(&r.v, &r.shape)
    }

    fn from_parts(v: &V, shape: &Shape) -> Resp {
        match (shape.kind, v) {
            (Kind::Simple, V::Str(s)) => Resp::Simple(String::from_utf8_lossy(s).into_owned()),
            (Kind::Bulk, V::Str(b)) => Resp::Bulk(Some(b.clone())),
            (Kind::Error, V::Err(e)) => Resp::Error(e.clone()),
            (Kind::Int, V::Int(i)) => Resp::Int(*i),
            (Kind::NullBulk, V::Nil) => Resp::Bulk(None),
            (Kind::NullArray, V::Nil) => Resp::Array(None),
            (Kind::Array, V::Arr(items)) => {
                Resp::Array(Some(items.iter().zip(&shape.items).map(|(v, s)| Self::from_parts(v, s)).collect()))
            }
            (kind, v) => panic!("{kind:?} reply {v:?} has no RESP2 form"),
        }
    }

    /// Bulk or simple string payload as UTF-8 (lossy); `None` otherwise.
    pub fn text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Elements of a non-null array; `None` otherwise.
    pub fn items(&self) -> Option<&[Resp]> {
        match self {
            Resp::Array(Some(v)) => Some(v),
            _ => None,
        }
    }
}

/// Decodes one RESP2 reply at the start of `buf` with [`decode_reply`].
///
/// Returns the reply and the number of bytes it occupies, or `None` if `buf` does not
/// yet hold a complete reply. Panics on malformed input, since a test talking to a
/// broken peer should fail loudly rather than hang until a timeout.
pub fn parse_resp(buf: &[u8]) -> Option<(Resp, usize)> {
    if buf.is_empty() {
        return None;
    }
    match decode_reply(buf, Proto::Resp2) {
        Ok(Some((r, used))) => Some((Resp::from_reply(&r), used)),
        Ok(None) => None,
        Err(e) => panic!("malformed RESP reply ({e}): {:?}", String::from_utf8_lossy(&buf[..buf.len().min(200)])),
    }
}
