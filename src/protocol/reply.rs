//! Backend replies: finding where one ends without decoding it, and decoding the few the
//! proxy acts on.
//!
//! [`ReplyScanner`] walks RESP2 and RESP3 frames (every type, attributes and pushes
//! included) with an explicit stack, so depth costs memory, not call stack, and it resumes
//! where it stopped when a reply arrives in pieces (a 100 MiB bulk or a million-element
//! array is scanned once). A reply the proxy only forwards is never decoded: the bytes
//! Redis sent go to the client as they are.
//!
//! [`Value`] is a borrowed decoded view used for the replies the proxy merges or inspects
//! (MGET parts, SCAN pages, INFO, DBSIZE, MOVED/ASK errors).

use smallvec::SmallVec;

use super::request::parse_i64;

/// The backend sent something that is not RESP. The connection cannot be trusted after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backend protocol error: {0}")]
pub struct ReplyError(pub &'static str);

const ATTR_FLAG: u64 = 1 << 63;

/// Resumable reply-boundary finder.
#[derive(Debug, Default)]
pub struct ReplyScanner {
    pos: usize,
    /// Elements still expected at each open aggregate level (ATTR_FLAG marks an attribute map,
    /// which precedes a value rather than being one).
    stack: SmallVec<[u64; 8]>,
}

impl ReplyScanner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the length of the complete reply at the front of `buf`, or `None` when more
    /// bytes are needed. `buf` must start at the same place across calls until a reply is
    /// complete (the caller removes it and the scanner starts over).
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        loop {
            let Some(&t) = buf.get(self.pos) else { return Ok(None) };
            let Some(nl) = super::find_byte(b'\n', &buf[self.pos..]) else {
                return Ok(None);
            };
            let line_end = self.pos + nl; // index of '\n'
            if nl < 1 || buf[line_end - 1] != b'\r' {
                return Err(ReplyError("line not terminated by CRLF"));
            }
            let line = &buf[self.pos + 1..line_end - 1];
            let after = line_end + 1;
            match t {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
                    self.pos = after;
                    if self.complete_one() {
                        return Ok(Some(self.finish()));
                    }
                }
                b'$' | b'!' | b'=' => {
                    let len = parse_i64(line).ok_or(ReplyError("bad bulk length"))?;
                    if len < 0 {
                        self.pos = after;
                    } else {
                        let end = after + len as usize + 2;
                        if end > buf.len() {
                            return Ok(None);
                        }
                        self.pos = end;
                    }
                    if self.complete_one() {
                        return Ok(Some(self.finish()));
                    }
                }
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    let n = parse_i64(line).ok_or(ReplyError("bad aggregate length"))?;
                    self.pos = after;
                    if n <= 0 {
                        if t == b'|' {
                            continue; // empty attribute: the value follows
                        }
                        if self.complete_one() {
                            return Ok(Some(self.finish()));
                        }
                    } else {
                        let n = n as u64 * if matches!(t, b'%' | b'|') { 2 } else { 1 };
                        self.stack.push(if t == b'|' { n | ATTR_FLAG } else { n });
                    }
                }
                _ => return Err(ReplyError("unknown type byte")),
            }
        }
    }

    /// One element finished; closes the aggregates it completes. True when the whole reply is.
    fn complete_one(&mut self) -> bool {
        loop {
            let Some(top) = self.stack.last_mut() else { return true };
            let attr = *top & ATTR_FLAG != 0;
            *top -= 1;
            if *top & !ATTR_FLAG > 0 {
                return false;
            }
            self.stack.pop();
            if attr {
                // the attribute map is done; the value it annotates is still to come
                return false;
            }
        }
    }

    fn finish(&mut self) -> usize {
        let n = self.pos;
        self.pos = 0;
        self.stack.clear();
        n
    }
}

/// Length of the complete reply at the front of `buf`, if there is one.
pub fn reply_len(buf: &[u8]) -> Result<Option<usize>, ReplyError> {
    ReplyScanner::new().scan(buf)
}

/// A decoded reply, borrowing from the bytes it was decoded from.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// `+...`
    Simple(&'a [u8]),
    /// `-...` and `!` blob errors
    Error(&'a [u8]),
    /// `:` and `(` (big numbers are kept as text in `Bulk`)
    Int(i64),
    /// `$`, `=` (verbatim, without its `txt:` prefix), `,` doubles and `(` big numbers as text
    Bulk(&'a [u8]),
    /// `$-1`, `*-1`, `_`
    Nil,
    /// `#t` / `#f`
    Bool(bool),
    /// `*`, `~` sets and `>` pushes
    Array(Vec<Value<'a>>),
    /// `%` maps and `|` attributes, as key/value pairs
    Map(Vec<(Value<'a>, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// Decodes one complete reply (as found by [`ReplyScanner`]). Depth is limited to 64.
    pub fn parse(buf: &'a [u8]) -> Result<(Value<'a>, usize), ReplyError> {
        parse_at(buf, 0, 0)
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bulk(b) | Value::Simple(b) => parse_i64(b),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        match self {
            Value::Bulk(b) | Value::Simple(b) => Some(b),
            _ => None,
        }
    }
}

fn parse_at(buf: &[u8], pos: usize, depth: u32) -> Result<(Value<'_>, usize), ReplyError> {
    if depth > 64 {
        return Err(ReplyError("reply nested too deeply"));
    }
    let t = *buf.get(pos).ok_or(ReplyError("truncated reply"))?;
    let nl = memchr::memchr(b'\n', &buf[pos..]).ok_or(ReplyError("truncated reply"))? + pos;
    if nl == pos || buf[nl - 1] != b'\r' {
        return Err(ReplyError("line not terminated by CRLF"));
    }
    let line = &buf[pos + 1..nl - 1];
    let after = nl + 1;
    let bulk = |len: i64| -> Result<(&[u8], usize), ReplyError> {
        let end = after + len as usize;
        if end + 2 > buf.len() {
            return Err(ReplyError("truncated reply"));
        }
        Ok((&buf[after..end], end + 2))
    };
    Ok(match t {
        b'+' => (Value::Simple(line), after),
        b'-' => (Value::Error(line), after),
        b':' => (Value::Int(parse_i64(line).ok_or(ReplyError("bad integer"))?), after),
        b',' | b'(' => (Value::Bulk(line), after),
        b'_' => (Value::Nil, after),
        b'#' => (Value::Bool(line == b"t"), after),
        b'$' | b'!' | b'=' => {
            let len = parse_i64(line).ok_or(ReplyError("bad bulk length"))?;
            if len < 0 {
                (Value::Nil, after)
            } else {
                let (data, end) = bulk(len)?;
                match t {
                    b'!' => (Value::Error(data), end),
                    b'=' => (Value::Bulk(data.get(4..).unwrap_or_default()), end),
                    _ => (Value::Bulk(data), end),
                }
            }
        }
        b'*' | b'~' | b'>' => {
            let n = parse_i64(line).ok_or(ReplyError("bad aggregate length"))?;
            if n < 0 {
                return Ok((Value::Nil, after));
            }
            let mut v = Vec::with_capacity((n as usize).min(1024));
            let mut p = after;
            for _ in 0..n {
                let (e, np) = parse_at(buf, p, depth + 1)?;
                v.push(e);
                p = np;
            }
            (Value::Array(v), p)
        }
        b'%' | b'|' => {
            let n = parse_i64(line).ok_or(ReplyError("bad aggregate length"))?;
            let mut v = Vec::with_capacity((n.max(0) as usize).min(1024));
            let mut p = after;
            for _ in 0..n.max(0) {
                let (k, np) = parse_at(buf, p, depth + 1)?;
                let (val, np) = parse_at(buf, np, depth + 1)?;
                v.push((k, val));
                p = np;
            }
            if t == b'|' {
                // attributes annotate the next value; the proxy has no use for them
                return parse_at(buf, p, depth + 1);
            }
            (Value::Map(v), p)
        }
        _ => return Err(ReplyError("unknown type byte")),
    })
}

/// If `reply` is an error reply, its text (without the leading `-`).
#[inline]
pub fn error_text(reply: &[u8]) -> Option<&[u8]> {
    if reply.first() == Some(&b'-') && reply.len() >= 3 { Some(&reply[1..reply.len() - 2]) } else { None }
}

/// `b` in double quotes as redis-cli prints a string: printable ASCII as it is, `"` and
/// `\` escaped, `\n`, `\r`, `\t`, and other bytes as `\xNN`.
pub fn quoted(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() + 2);
    s.push('"');
    for &c in b {
        match c {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push('"');
    s
}

/// A redirection parsed from `MOVED slot host:port` / `ASK slot host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    Moved {
        slot: u16,
        addr: String,
    },
    Ask {
        slot: u16,
        addr: String,
    },
    /// `MOVED -1 host:port`: Valkey's answer to a keyless command sent to a replica (a
    /// master a failover has just demoted): go to that node; no slot moved.
    Keyless {
        addr: String,
    },
}

impl Redirect {
    /// The node it points at.
    pub fn addr(&self) -> &str {
        match self {
            Redirect::Moved { addr, .. } | Redirect::Ask { addr, .. } | Redirect::Keyless { addr } => addr,
        }
    }
}

/// Parses MOVED/ASK error texts.
pub fn parse_redirect(err: &[u8]) -> Option<Redirect> {
    let (ask, rest) = if let Some(r) = err.strip_prefix(b"MOVED ") {
        (false, r)
    } else if let Some(r) = err.strip_prefix(b"ASK ") {
        (true, r)
    } else {
        return None;
    };
    let sp = memchr::memchr(b' ', rest)?;
    let slot = parse_i64(&rest[..sp])?;
    let keyless = slot == -1 && !ask;
    if !(0..16384).contains(&slot) && !keyless {
        return None;
    }
    let addr = std::str::from_utf8(&rest[sp + 1..]).ok()?.trim().to_string();
    // Redis may send ":port" when it does not know its own address
    if addr.is_empty() {
        return None;
    }
    if keyless {
        return Some(Redirect::Keyless { addr });
    }
    let slot = slot as u16;
    Some(if ask { Redirect::Ask { slot, addr } } else { Redirect::Moved { slot, addr } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_every_type() {
        let cases: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR x\r\n",
            b":12\r\n",
            b"$3\r\nabc\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
            b"_\r\n",
            b",1.5\r\n",
            b"#t\r\n",
            b"(123456789012345678901234\r\n",
            b"=8\r\ntxt:abcd\r\n",
            b"!3\r\nerr\r\n",
            b"%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n_\r\n",
            b"~2\r\n+a\r\n+b\r\n",
            b">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nfoo\r\n",
            b"|1\r\n+key\r\n+val\r\n:5\r\n",
            b"*2\r\n|1\r\n+k\r\n+v\r\n:1\r\n:2\r\n",
        ];
        for c in cases {
            let mut with_tail = c.to_vec();
            with_tail.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(reply_len(&with_tail).unwrap(), Some(c.len()), "{}", String::from_utf8_lossy(c));
            // every strict prefix is incomplete, byte by byte with one resumable scanner
            let mut s = ReplyScanner::new();
            for i in 0..c.len() {
                assert_eq!(s.scan(&c[..i]).unwrap(), None, "prefix {i} of {}", String::from_utf8_lossy(c));
            }
            assert_eq!(s.scan(c).unwrap(), Some(c.len()));
            let (_, n) = Value::parse(c).unwrap();
            assert_eq!(n, c.len());
        }
    }

    #[test]
    fn deep_nesting_uses_no_call_stack() {
        let mut deep = b"*1\r\n".repeat(1_000_000);
        deep.extend_from_slice(b":1\r\n");
        assert_eq!(reply_len(&deep).unwrap(), Some(deep.len()));
        assert!(Value::parse(&deep).is_err());
    }

    #[test]
    fn values() {
        let (v, _) = Value::parse(b"*3\r\n$1\r\na\r\n$-1\r\n:7\r\n").unwrap();
        assert_eq!(v, Value::Array(vec![Value::Bulk(b"a"), Value::Nil, Value::Int(7)]));
        let (v, _) = Value::parse(b"=8\r\ntxt:abcd\r\n").unwrap();
        assert_eq!(v, Value::Bulk(b"abcd"));
    }

    #[test]
    fn redirects() {
        assert_eq!(
            parse_redirect(b"MOVED 3999 127.0.0.1:6381"),
            Some(Redirect::Moved { slot: 3999, addr: "127.0.0.1:6381".into() })
        );
        assert_eq!(parse_redirect(b"ASK 1 127.0.0.1:1"), Some(Redirect::Ask { slot: 1, addr: "127.0.0.1:1".into() }));
        assert_eq!(parse_redirect(b"ERR x"), None);
        assert_eq!(parse_redirect(b"MOVED 99999 a:1"), None);
        // Valkey's MOVED for a keyless command on a replica names no slot
        assert_eq!(parse_redirect(b"MOVED -1 127.0.0.1:7"), Some(Redirect::Keyless { addr: "127.0.0.1:7".into() }));
        assert_eq!(parse_redirect(b"ASK -1 127.0.0.1:7"), None);
        assert_eq!(parse_redirect(b"MOVED -2 127.0.0.1:7"), None);
        assert_eq!(error_text(b"-ERR x\r\n"), Some(&b"ERR x"[..]));
    }
}
