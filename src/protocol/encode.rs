//! Writing the replies the proxy composes itself (local commands, merged replies, errors)
//! in the protocol the client negotiated: RESP2 by default, RESP3 after `HELLO 3`.
//! Forwarded replies never pass through here.

use bytes::{BufMut, BytesMut};

pub use super::request::{write_array_header, write_bulk, write_bulk_header};

/// The protocol a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Proto {
    #[default]
    Resp2,
    Resp3,
}

impl Proto {
    pub fn version(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }
}

/// Reply builder over a `BytesMut`.
pub struct Writer<'a> {
    pub buf: &'a mut BytesMut,
    pub proto: Proto,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut BytesMut, proto: Proto) -> Self {
        Writer { buf, proto }
    }

    fn line(&mut self, t: u8, s: &[u8]) {
        self.buf.put_u8(t);
        self.buf.extend_from_slice(s);
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn simple(&mut self, s: &str) {
        self.line(b'+', s.as_bytes());
    }

    pub fn ok(&mut self) {
        self.buf.extend_from_slice(b"+OK\r\n");
    }

    /// An error reply; `e` is the full text including its code, e.g. `ERR syntax error`.
    /// CR and LF are replaced so the reply stays one line.
    pub fn error(&mut self, e: &str) {
        self.buf.put_u8(b'-');
        for b in e.bytes() {
            self.buf.put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn int(&mut self, i: i64) {
        self.line(b':', itoa::Buffer::new().format(i).as_bytes());
    }

    pub fn bulk(&mut self, b: &[u8]) {
        write_bulk(self.buf, b);
    }

    /// A double: RESP3's `,`, a bulk string in RESP2 (as Redis replies).
    pub fn double(&mut self, d: f64) {
        let text = format!("{d}");
        match self.proto {
            Proto::Resp3 => self.line(b',', text.as_bytes()),
            Proto::Resp2 => write_bulk(self.buf, text.as_bytes()),
        }
    }

    pub fn nil(&mut self) {
        match self.proto {
            Proto::Resp2 => self.buf.extend_from_slice(b"$-1\r\n"),
            Proto::Resp3 => self.buf.extend_from_slice(b"_\r\n"),
        }
    }

    pub fn array(&mut self, n: usize) {
        write_array_header(self.buf, n);
    }

    /// A map of `n` pairs (RESP2: a flat array of 2n).
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => write_array_header(self.buf, 2 * n),
            Proto::Resp3 => self.line(b'%', itoa::Buffer::new().format(n).as_bytes()),
        }
    }

    /// A push of `n` elements, as pub/sub messages and confirmations are sent (RESP2: an
    /// array).
    pub fn push(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => write_array_header(self.buf, n),
            Proto::Resp3 => self.line(b'>', itoa::Buffer::new().format(n).as_bytes()),
        }
    }

    /// A set of `n` elements (RESP2: an array).
    pub fn set(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => write_array_header(self.buf, n),
            Proto::Resp3 => self.line(b'~', itoa::Buffer::new().format(n).as_bytes()),
        }
    }

    /// Text such as INFO's: a bulk string in RESP2, a verbatim `txt` string in RESP3.
    pub fn verbatim(&mut self, s: &[u8]) {
        match self.proto {
            Proto::Resp2 => write_bulk(self.buf, s),
            Proto::Resp3 => {
                self.buf.put_u8(b'=');
                self.buf.extend_from_slice(itoa::Buffer::new().format(s.len() + 4).as_bytes());
                self.buf.extend_from_slice(b"\r\ntxt:");
                self.buf.extend_from_slice(s);
                self.buf.extend_from_slice(b"\r\n");
            }
        }
    }

    /// A null array (`*-1` in RESP2, `_` in RESP3).
    /// An array of simple strings (a HELP reply).
    pub fn lines(&mut self, lines: &[&str]) {
        self.array(lines.len());
        for l in lines {
            self.simple(l);
        }
    }

    pub fn nil_array(&mut self) {
        match self.proto {
            Proto::Resp2 => self.buf.extend_from_slice(b"*-1\r\n"),
            Proto::Resp3 => self.buf.extend_from_slice(b"_\r\n"),
        }
    }

    /// Appends bytes that already are a complete RESP value.
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_protocols() {
        let mut b = BytesMut::new();
        let mut w = Writer::new(&mut b, Proto::Resp2);
        w.map(1);
        w.bulk(b"a");
        w.nil();
        w.verbatim(b"x");
        assert_eq!(&b[..], b"*2\r\n$1\r\na\r\n$-1\r\n$1\r\nx\r\n");
        let mut b = BytesMut::new();
        let mut w = Writer::new(&mut b, Proto::Resp3);
        w.map(1);
        w.bulk(b"a");
        w.nil();
        w.verbatim(b"x");
        w.error("ERR a\r\nb");
        assert_eq!(&b[..], b"%1\r\n$1\r\na\r\n_\r\n=5\r\ntxt:x\r\n-ERR a  b\r\n");
    }
}
