//! HTTP for the metrics endpoint and the Prometheus API: [`http_get`] is a minimal
//! HTTP/1.0 GET over a `TcpStream` (a chunked body is decoded).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Timeout for the connect, the reads and the writes of [`try_http_get`].
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// `GET path` over HTTP/1.0 to `addr` (`HOST:PORT`) on a plain `TcpStream`
/// with 10 s connect/read/write timeouts. Returns the status code and the
/// body (lossy UTF-8; a chunked body is decoded). Panics on I/O errors or a
/// malformed response; use [`try_http_get`] to handle them.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    try_http_get(addr, path).unwrap_or_else(|e| panic!("GET http://{addr}{path} failed: {e}"))
}

/// [`http_get`] returning I/O errors and malformed responses as `Err`.
pub fn try_http_get(addr: &str, path: &str) -> io::Result<(u16, String)> {
    use std::net::ToSocketAddrs;
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let sock = addr.to_socket_addrs()?.next().ok_or_else(|| bad(format!("cannot resolve {addr}")))?;
    let mut stream = TcpStream::connect_timeout(&sock, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;

    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad(format!("no end of headers in {:?}", String::from_utf8_lossy(&raw))))?;
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let body = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked { dechunk(body).map_err(bad)? } else { body.to_vec() };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Decodes an HTTP/1.1 chunked body (trailers are ignored).
fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n").ok_or("chunk size line not terminated")?;
        let size_text = String::from_utf8_lossy(&data[..eol]).into_owned();
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|e| format!("bad chunk size {size_hex:?}: {e}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// The value of one series (`name{labels}` exactly as exposed) scraped from the metrics
/// endpoint at `addr`; `None` when it is not there.
pub fn scrape_series(addr: &str, series: &str) -> Option<f64> {
    let (_, body) = http_get(addr, "/metrics");
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}
