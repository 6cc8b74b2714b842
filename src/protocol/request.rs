//! The client-facing request reader: turns untrusted bytes into [`Request`]s.
//!
//! Clients send either RESP arrays of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or
//! inline commands (`GET k\r\n`, as typed into telnet). This reader is:
//! - **bounded**: a bulk or a whole request larger than `max_request_bytes`, a header line
//!   that never ends, or an inline line over 64 KiB is a protocol error, never a buffer
//!   that grows without limit; requests are flat (arrays of bulk strings), so nesting
//!   cannot recurse;
//! - **resumable**: a request that arrives in pieces is parsed where the previous read
//!   stopped (the state machine keeps its position and the argument offsets already
//!   found), so a 100 MiB MSET costs one pass, not one pass per read (a request not yet
//!   whole is first looked at once by the one-pass reader below, which reads at most its
//!   first 99 headers and keeps nothing);
//! - **quick for the usual request**: one already whole in the buffer, of at most 99
//!   arguments with short headers, is parsed in one pass that keeps no state between
//!   arguments; anything else goes the resumable way, which gives the same request;
//! - **zero-copy**: a complete request is split off the read buffer as one `Bytes` and its
//!   arguments are offsets into it, so forwarding it means handing those bytes on.
//!
//! It does no I/O and knows nothing about commands.

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

/// Longest inline command line, and longest `*`/`$` header line, as in Redis.
pub const MAX_INLINE: usize = 64 * 1024;

/// A protocol error; the text follows `-ERR ` in the reply, matching Redis's wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(s: &str) -> Self {
        ProtocolError(s.to_string())
    }
}

/// One client request: the RESP encoding of the command plus where each argument lies in it.
#[derive(Debug, Clone)]
pub struct Request {
    raw: Bytes,
    /// (start, len) of each argument inside `raw`.
    args: SmallVec<[(u32, u32); 6]>,
}

impl Request {
    /// Reads the one request that `raw` holds (RESP bytes heatshield itself stored, such
    /// as a request kept for the slow log); `None` if they do not hold a whole one.
    pub fn parse(raw: &[u8]) -> Option<Request> {
        let mut r = RequestReader::new(Limits { max_request_bytes: u32::MAX as usize });
        match r.next(&mut BytesMut::from(raw)) {
            Ok(Next::Request(req)) => Some(req),
            _ => None,
        }
    }

    /// Builds a request from arguments (used for inline commands and by the proxy itself
    /// when it composes a command).
    pub fn from_args<A: AsRef<[u8]>>(args: &[A]) -> Request {
        let mut buf = BytesMut::with_capacity(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
        let mut offs = SmallVec::new();
        write_array_header(&mut buf, args.len());
        for a in args {
            let a = a.as_ref();
            write_bulk_header(&mut buf, a.len());
            offs.push((buf.len() as u32, a.len() as u32));
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        Request { raw: buf.freeze(), args: offs }
    }

    /// Number of arguments, the command name included.
    #[inline]
    pub fn argc(&self) -> usize {
        self.args.len()
    }

    /// Argument `i` (0 is the command name). Panics when out of range.
    #[inline]
    pub fn arg(&self, i: usize) -> &[u8] {
        let (s, l) = self.args[i];
        &self.raw[s as usize..(s + l) as usize]
    }

    /// The first 8 bytes of argument `i` as a little-endian word, zero past its end: one
    /// load when the buffer holds 8 bytes from the argument's start, as it almost always
    /// does (every argument is followed by `\r\n`, and most by more). For comparing short
    /// names (a command's) without a byte loop.
    #[inline(always)]
    pub fn arg_word(&self, i: usize) -> u64 {
        let (s, l) = self.args[i];
        let (s, l) = (s as usize, (l as usize).min(8));
        match self.raw.get(s..s + 8) {
            Some(w) => {
                let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
                if l == 8 { w } else { w & ((1u64 << (l * 8)) - 1) }
            }
            None => {
                let mut b = [0u8; 8];
                b[..l].copy_from_slice(&self.raw[s..s + l]);
                u64::from_le_bytes(b)
            }
        }
    }

    /// Argument `i` as a `Bytes` sharing the request's buffer.
    pub fn arg_bytes(&self, i: usize) -> Bytes {
        let (s, l) = self.args[i];
        self.raw.slice(s as usize..(s + l) as usize)
    }

    /// The request exactly as RESP (what is sent to Redis when it is forwarded unchanged).
    #[inline]
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// The first byte of each non-empty argument after the command's name, in one pass
    /// (a look at each costs less than [`Request::arg`] for each).
    #[inline]
    pub fn arg_heads(&self) -> impl Iterator<Item = u8> + '_ {
        let raw = &self.raw[..];
        let args = self.args.get(1..).unwrap_or_default();
        args.iter().filter(|a| a.1 > 0).map(move |&(s, _)| raw.get(s as usize).copied().unwrap_or_default())
    }

    /// Iterates over all arguments.
    pub fn args(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.argc()).map(move |i| self.arg(i))
    }
}

/// Appends `*n\r\n`.
pub fn write_array_header(buf: &mut BytesMut, n: usize) {
    buf.put_u8(b'*');
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    buf.extend_from_slice(b"\r\n");
}

/// Appends `$n\r\n`.
pub fn write_bulk_header(buf: &mut BytesMut, n: usize) {
    buf.put_u8(b'$');
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    buf.extend_from_slice(b"\r\n");
}

/// Appends one bulk string.
pub fn write_bulk(buf: &mut BytesMut, b: &[u8]) {
    write_bulk_header(buf, b.len());
    buf.extend_from_slice(b);
    buf.extend_from_slice(b"\r\n");
}

/// Limits applied to client input.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest single request (and so the largest bulk), in bytes.
    pub max_request_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_request_bytes: 512 * 1024 * 1024 }
    }
}

/// Where the reader is inside a multibulk request that has not fully arrived.
#[derive(Debug, Default)]
struct Partial {
    /// Arguments the header announced.
    expected: usize,
    /// Bytes of the buffer consumed so far by this request.
    pos: usize,
    args: SmallVec<[(u32, u32); 6]>,
}

/// The resumable request reader. One per client connection.
#[derive(Debug)]
pub struct RequestReader {
    limits: Limits,
    partial: Option<Partial>,
}

/// What `next` found.
#[derive(Debug)]
pub enum Next {
    /// A complete request, removed from the buffer.
    Request(Request),
    /// More bytes are needed; `hint` is how many more at least (to size the next read).
    Incomplete { hint: usize },
}

impl RequestReader {
    pub fn new(limits: Limits) -> Self {
        RequestReader { limits, partial: None }
    }

    /// Parses the next request at the front of `buf`. Empty requests (`*0`, `*-1`, blank
    /// inline lines) are consumed and skipped, as Redis does.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Next, ProtocolError> {
        if self.partial.is_none()
            && let Some(req) = self.whole(buf)
        {
            return Ok(Next::Request(req));
        }
        self.resume(buf)
    }

    /// The usual request in one pass, with nothing kept in `self` on the way: a multibulk
    /// already complete in `buf`, of at most 99 arguments, each header one to five plain
    /// digits and CRLF, within `max_request_bytes`. `None` for anything else (incomplete, larger,
    /// unusual or malformed), which [`RequestReader::resume`] then parses from the start;
    /// what this returns is the request that would give. (Through `resume` a SET took 417
    /// instructions, its state written back to `partial` at every argument.)
    #[inline(always)]
    fn whole(&self, buf: &mut BytesMut) -> Option<Request> {
        let b: &[u8] = buf;
        if b.first() != Some(&b'*') {
            return None;
        }
        let (n, mut pos) = small_count(b, 1)?;
        if n == 0 || n > 99 {
            return None;
        }
        let mut args: SmallVec<[(u32, u32); 6]> = SmallVec::new();
        if n > 6 {
            args.reserve_exact(n);
        }
        for _ in 0..n {
            if b.get(pos) != Some(&b'$') {
                return None;
            }
            let (len, after) = small_count(b, pos + 1)?;
            let end = after + len + 2;
            if end > b.len() {
                return None;
            }
            args.push((after as u32, len as u32));
            pos = end;
        }
        // (within the whole request's limit, every limit `resume` checks holds: a bulk's,
        // and the count's, each argument taking 6 bytes at least)
        if pos > self.limits.max_request_bytes {
            return None;
        }
        Some(Request { raw: buf.split_to(pos).freeze(), args })
    }

    /// [`RequestReader::next`] for any request, and for one whose start an earlier call
    /// already parsed (`partial`).
    #[inline(never)]
    fn resume(&mut self, buf: &mut BytesMut) -> Result<Next, ProtocolError> {
        loop {
            if self.partial.is_none() {
                if buf.is_empty() {
                    return Ok(Next::Incomplete { hint: 0 });
                }
                if buf[0] != b'*' {
                    match self.inline(buf)? {
                        Some(Some(r)) => return Ok(Next::Request(r)),
                        Some(None) => continue, // blank line
                        None => return Ok(Next::Incomplete { hint: 0 }),
                    }
                }
                // multibulk header
                let Some((n, after)) = read_line_int(buf, 1, "too big mbulk count string")? else {
                    return Ok(Next::Incomplete { hint: 0 });
                };
                let n = n.map_err(|_| ProtocolError::new("invalid multibulk length"))?;
                if n <= 0 {
                    let _ = buf.split_to(after);
                    continue;
                }
                // every argument takes at least 4 bytes ("$0\r\n" + "\r\n" is 6)
                if n as u64 > (self.limits.max_request_bytes / 4) as u64 || n > i32::MAX as i64 {
                    return Err(ProtocolError::new("invalid multibulk length"));
                }
                let n = n as usize;
                self.partial = Some(Partial { expected: n, pos: after, args: SmallVec::with_capacity(n.min(64)) });
            }
            let p = self.partial.as_mut().expect("partial set above");
            while p.args.len() < p.expected {
                if p.pos >= buf.len() {
                    return Ok(Next::Incomplete { hint: 0 });
                }
                if buf[p.pos] != b'$' {
                    let got = buf[p.pos] as char;
                    return Err(ProtocolError(format!("expected '$', got '{got}'")));
                }
                let Some((len, after)) = read_line_int(buf, p.pos + 1, "too big bulk count string")? else {
                    return Ok(Next::Incomplete { hint: 0 });
                };
                let len = match len {
                    Ok(l) if l >= 0 && (l as u64) <= self.limits.max_request_bytes as u64 => l as usize,
                    _ => return Err(ProtocolError::new("invalid bulk length")),
                };
                let end = after + len + 2;
                if end > self.limits.max_request_bytes.saturating_add(MAX_INLINE) {
                    return Err(ProtocolError::new("request too large"));
                }
                if end > buf.len() {
                    return Ok(Next::Incomplete { hint: end - buf.len() });
                }
                p.args.push((after as u32, len as u32));
                p.pos = end;
            }
            let p = self.partial.take().expect("partial set above");
            let raw = buf.split_to(p.pos).freeze();
            return Ok(Next::Request(Request { raw, args: p.args }));
        }
    }

    /// Parses an inline command. `Ok(None)`: incomplete; `Ok(Some(None))`: blank line skipped.
    fn inline(&mut self, buf: &mut BytesMut) -> Result<Option<Option<Request>>, ProtocolError> {
        let Some(nl) = memchr::memchr(b'\n', &buf[..buf.len().min(MAX_INLINE + 1)]) else {
            if buf.len() > MAX_INLINE {
                return Err(ProtocolError::new("too big inline request"));
            }
            return Ok(None);
        };
        let line = buf.split_to(nl + 1);
        let mut l = &line[..nl];
        if l.last() == Some(&b'\r') {
            l = &l[..l.len() - 1];
        }
        let args = split_args(l).ok_or_else(|| ProtocolError::new("unbalanced quotes in request"))?;
        if args.is_empty() {
            return Ok(Some(None));
        }
        Ok(Some(Some(Request::from_args(&args))))
    }
}

/// Reads `<int>\r\n` starting at `start`. `Ok(None)` when the line is not complete yet;
/// the inner `Err` when it is complete but not an integer.
#[allow(clippy::type_complexity)]
#[inline(always)]
fn read_line_int(buf: &[u8], start: usize, too_big: &str) -> Result<Option<(Result<i64, ()>, usize)>, ProtocolError> {
    // The usual line, a few plain digits and "\r", found and parsed in one pass; anything
    // else (a sign, a leading zero, a long or unfinished line) takes the general way below.
    let rest = buf.get(start..).unwrap_or_default();
    let (mut v, mut i) = (0i64, 0usize);
    while i < rest.len().min(18) && rest[i].is_ascii_digit() {
        v = v * 10 + (rest[i] - b'0') as i64;
        i += 1;
    }
    if i > 0 && i < rest.len() && rest[i] == b'\r' && (rest[0] != b'0' || i == 1) {
        return Ok((i + 1 < rest.len()).then_some((Ok(v), start + i + 2)));
    }
    read_line_int_general(buf, start, too_big)
}

/// `<digits>\r\n` at `start`, one to five plain digits without a leading zero (but "0"):
/// the number and where the line ends. `None` for anything else, and for a line not
/// complete in `b` ([`RequestReader::whole`]).
#[inline(always)]
fn small_count(b: &[u8], start: usize) -> Option<(usize, usize)> {
    let mut v = 0usize;
    let mut i = start;
    loop {
        let c = *b.get(i)?;
        if c == b'\r' {
            break;
        }
        let d = c.wrapping_sub(b'0');
        if d > 9 || i - start == 5 {
            return None;
        }
        v = v * 10 + d as usize;
        i += 1;
    }
    let digits = i - start;
    if digits == 0 || (digits > 1 && b[start] == b'0') || b.get(i + 1) != Some(&b'\n') {
        return None;
    }
    Some((v, i + 2))
}

/// [`read_line_int`] for any line: finds the CR, then parses what precedes it. Kept out
/// of line, so the usual line's pass is inlined where it is read without it.
#[allow(clippy::type_complexity)]
#[inline(never)]
fn read_line_int_general(
    buf: &[u8],
    start: usize,
    too_big: &str,
) -> Result<Option<(Result<i64, ()>, usize)>, ProtocolError> {
    let window = &buf[start.min(buf.len())..buf.len().min(start + MAX_INLINE)];
    let Some(cr) = super::find_byte(b'\r', window) else {
        if buf.len() - start.min(buf.len()) >= MAX_INLINE {
            return Err(ProtocolError::new(too_big));
        }
        return Ok(None);
    };
    if start + cr + 1 >= buf.len() {
        return Ok(None);
    }
    Ok(Some((parse_i64(&window[..cr]).ok_or(()), start + cr + 2)))
}

/// Parses a decimal i64 exactly as Redis's `string2ll`: optional '-', digits, no spaces,
/// no leading '+', no leading zeros except "0".
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let (neg, digits) = if s[0] == b'-' { (true, &s[1..]) } else { (false, s) };
    if digits.is_empty() || (digits[0] == b'0' && (digits.len() > 1 || neg)) {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        let d = (c - b'0') as i64;
        v = if neg { v.checked_mul(10)?.checked_sub(d)? } else { v.checked_mul(10)?.checked_add(d)? };
    }
    Some(v)
}

/// Splits an inline command line like Redis's `sdssplitargs`: whitespace separates
/// arguments; "double quotes" understand \n \r \t \b \a \\ \" and \xHH; 'single quotes'
/// understand only \'. A closing quote must be followed by whitespace or the end.
/// Returns `None` for unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    // Redis splits a C string: a NUL byte ends the line.
    let line = &line[..memchr::memchr(0, line).unwrap_or(line.len())];
    let is_space = |c: u8| c.is_ascii_whitespace() || c == 0x0b;
    let mut out = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && is_space(line[i]) {
            i += 1;
        }
        if i >= n {
            return Some(out);
        }
        let mut cur = Vec::new();
        let mut inq = false; // double quotes
        let mut insq = false; // single quotes
        loop {
            if inq {
                if i >= n {
                    return None;
                }
                let c = line[i];
                if c == b'\\'
                    && i + 3 < n
                    && line[i + 1] == b'x'
                    && line[i + 2].is_ascii_hexdigit()
                    && line[i + 3].is_ascii_hexdigit()
                {
                    let h = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
                    cur.push(h(line[i + 2]) * 16 + h(line[i + 3]));
                    i += 3;
                } else if c == b'\\' && i + 1 < n {
                    i += 1;
                    cur.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        o => o,
                    });
                } else if c == b'"' {
                    if i + 1 < n && !is_space(line[i + 1]) {
                        return None;
                    }
                    i += 1;
                    break;
                } else {
                    cur.push(c);
                }
            } else if insq {
                if i >= n {
                    return None;
                }
                let c = line[i];
                if c == b'\\' && i + 1 < n && line[i + 1] == b'\'' {
                    i += 1;
                    cur.push(b'\'');
                } else if c == b'\'' {
                    if i + 1 < n && !is_space(line[i + 1]) {
                        return None;
                    }
                    i += 1;
                    break;
                } else {
                    cur.push(c);
                }
            } else {
                if i >= n {
                    break;
                }
                match line[i] {
                    c if is_space(c) => break,
                    b'"' => inq = true,
                    b'\'' => insq = true,
                    c => cur.push(c),
                }
            }
            i += 1;
        }
        out.push(cur);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut r = RequestReader::new(Limits::default());
        let mut buf = BytesMut::from(input);
        let mut out = vec![];
        while let Next::Request(req) = r.next(&mut buf)? {
            out.push(req.args().map(|a| a.to_vec()).collect());
        }
        Ok(out)
    }

    #[test]
    fn multibulk_and_inline() {
        let got = parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nSET a \"b c\"\r\n\r\n*0\r\nPING\n").unwrap();
        assert_eq!(
            got,
            vec![
                vec![b"GET".to_vec(), b"k".to_vec()],
                vec![b"SET".to_vec(), b"a".to_vec(), b"b c".to_vec()],
                vec![b"PING".to_vec()],
            ]
        );
    }

    #[test]
    fn byte_by_byte_equals_whole() {
        let input = b"*3\r\n$3\r\nSET\r\n$5\r\nhello\r\n$11\r\nworld\r\n\r\nxx\r\n*1\r\n$4\r\nPING\r\n";
        let mut r = RequestReader::new(Limits::default());
        let mut buf = BytesMut::new();
        let mut got = vec![];
        for &b in input.iter() {
            buf.extend_from_slice(&[b]);
            while let Next::Request(req) = r.next(&mut buf).unwrap() {
                got.push(req.args().map(|a| a.to_vec()).collect::<Vec<_>>());
            }
        }
        assert_eq!(got, parse_all(input).unwrap());
        assert_eq!(got[0][2], b"world\r\n\r\nxx");
        assert!(buf.is_empty());
    }

    #[test]
    fn raw_is_forwardable() {
        let input = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        let mut r = RequestReader::new(Limits::default());
        let mut buf = BytesMut::from(&input[..]);
        let Next::Request(req) = r.next(&mut buf).unwrap() else { panic!() };
        assert_eq!(&req.raw()[..], &input[..]);
        let inline = Request::from_args(&["GET", "k"]);
        assert_eq!(&inline.raw()[..], &input[..]);
    }

    #[test]
    fn errors_match_redis() {
        let e = |s: &[u8]| parse_all(s).unwrap_err().to_string();
        assert_eq!(e(b"*x\r\n"), "Protocol error: invalid multibulk length");
        assert_eq!(e(b"*1\r\n+GET\r\n"), "Protocol error: expected '$', got '+'");
        assert_eq!(e(b"*1\r\n$-5\r\n"), "Protocol error: invalid bulk length");
        assert_eq!(e(b"*1\r\n$9223372036854775807\r\n"), "Protocol error: invalid bulk length");
        assert_eq!(e(b"SET a \"b\r\n"), "Protocol error: unbalanced quotes in request");
        assert_eq!(e(&vec![b'a'; MAX_INLINE + 10]), "Protocol error: too big inline request");
        let mut big = b"*1\r\n$".to_vec();
        big.extend(vec![b'1'; MAX_INLINE + 10]);
        assert_eq!(e(&big), "Protocol error: too big bulk count string");
    }

    /// Whatever the one-pass reader accepts, the general one gives the same: the same
    /// arguments and the same bytes consumed (and only for bytes it accepts too).
    #[test]
    fn the_one_pass_reader_agrees_with_the_general_one() {
        let mut inputs: Vec<Vec<u8>> = vec![
            b"*3\r\n$3\r\nSET\r\n$16\r\nkey:000000012345\r\n$3\r\nxxx\r\n*2\r\n$3\r\nGET\r\n".to_vec(),
            b"*1\r\n$0\r\n\r\n".to_vec(),
            b"*1\r\n$00\r\n\r\n".to_vec(),
            b"*01\r\n$1\r\na\r\n".to_vec(),
            b"*0\r\n*1\r\n$1\r\na\r\n".to_vec(),
            b"*-1\r\n".to_vec(),
            b"*1\r\n$1\ra\r\n".to_vec(),
            b"*1\r$1\r\na\r\n".to_vec(),
            b"*1\r\n$123456\r\n".to_vec(),
            b"*1\r\n$+1\r\na\r\n".to_vec(),
            b"*1\r\n$1\r\nab\r\n".to_vec(),
            b"GET a\r\n".to_vec(),
        ];
        let mut big = b"*100\r\n".to_vec();
        let mut many = b"*99\r\n".to_vec();
        for _ in 0..100 {
            big.extend_from_slice(b"$1\r\nk\r\n");
        }
        for _ in 0..99 {
            many.extend_from_slice(b"$5\r\nvalue\r\n");
        }
        let mut long = b"*2\r\n$3\r\nSET\r\n$99999\r\n".to_vec();
        long.extend(vec![b'v'; 99_999]);
        long.extend_from_slice(b"\r\n");
        inputs.extend([big, many, long]);
        // and mutations of a usual pipeline: one byte swapped for one the headers use
        let base = b"*2\r\n$3\r\nGET\r\n$12\r\nkey:00000042\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\n0123456789\r\n";
        let alphabet = b"*$\r\n0123456789-+ a";
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            let mut m = base.to_vec();
            for _ in 0..1 + (x % 3) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x % m.len() as u64) as usize;
                m[at] = alphabet[((x >> 32) % alphabet.len() as u64) as usize];
            }
            inputs.push(m);
        }
        for limit in [1024usize, 60, 512 * 1024 * 1024] {
            for input in &inputs {
                for cut in [input.len(), input.len() - 1, input.len() / 2] {
                    let lim = Limits { max_request_bytes: limit };
                    let mut a = BytesMut::from(&input[..cut]);
                    let mut b = a.clone();
                    let Some(fast) = RequestReader::new(lim).whole(&mut a) else { continue };
                    match RequestReader::new(lim).resume(&mut b) {
                        Ok(Next::Request(general)) => {
                            assert_eq!(fast.raw(), general.raw(), "{:?}", String::from_utf8_lossy(input));
                            assert_eq!(fast.args, general.args, "{:?}", String::from_utf8_lossy(input));
                            assert_eq!(a, b);
                        }
                        other => panic!("{:?}: one pass {fast:?}, general {other:?}", String::from_utf8_lossy(input)),
                    }
                }
            }
        }
    }

    #[test]
    fn bulk_over_limit() {
        let mut r = RequestReader::new(Limits { max_request_bytes: 100 });
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$101\r\n"[..]);
        assert_eq!(r.next(&mut buf).unwrap_err().to_string(), "Protocol error: invalid bulk length");
    }

    #[test]
    fn nested_arrays_are_rejected_not_recursed() {
        let input: Vec<u8> = b"*1\r\n".repeat(100_000);
        assert_eq!(parse_all(&input).unwrap_err().to_string(), "Protocol error: expected '$', got '*'");
    }

    #[test]
    fn split_args_like_redis() {
        let s = |l: &str| {
            split_args(l.as_bytes())
                .map(|v| v.into_iter().map(|a| String::from_utf8_lossy(&a).to_string()).collect::<Vec<_>>())
        };
        assert_eq!(s("  set  a   b "), Some(vec!["set".into(), "a".into(), "b".into()]));
        assert_eq!(s(r#"set "a\x41\n" 'it\'s'"#), Some(vec!["set".into(), "aA\n".into(), "it's".into()]));
        assert_eq!(s(r#"set "a"b"#), None);
        assert_eq!(s(r#"set 'a"#), None);
        assert_eq!(s(""), Some(vec![]));
        // a NUL ends the line (Redis splits a C string); this once looped forever
        assert_eq!(s("get a\0b c"), Some(vec!["get".into(), "a".into()]));
        assert_eq!(s("\0\0\0"), Some(vec![]));
        assert_eq!(s("a\x0b\x0cb"), Some(vec!["a".into(), "b".into()]));
    }

    #[test]
    fn read_line_int_fast_path_agrees_with_the_general_one() {
        let lines: &[&[u8]] = &[
            b"3\r\n",
            b"16\r\n",
            b"0\r\n",
            b"00\r\n",
            b"012\r\n",
            b"-1\r\n",
            b"-0\r\n",
            b"+5\r\n",
            b"123456789012345678\r\n",
            b"1234567890123456789\r\n",
            b"9223372036854775807\r\n",
            b"9223372036854775808\r\n",
            b"12a\r\n",
            b"\r\n",
            b"1 \r\n",
            b"7\rx",
            b"42",
        ];
        for line in lines {
            for cut in 0..=line.len() {
                let mut buf = b"$".to_vec();
                buf.extend_from_slice(&line[..cut]);
                let got = read_line_int(&buf, 1, "too big").map_err(|e| e.0);
                let want = read_line_int_general(&buf, 1, "too big").map_err(|e| e.0);
                assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&buf));
            }
        }
    }

    #[test]
    fn parse_i64_strict() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"012"), None);
        assert_eq!(parse_i64(b"+1"), None);
        assert_eq!(parse_i64(b"-0"), None);
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
    }
}
