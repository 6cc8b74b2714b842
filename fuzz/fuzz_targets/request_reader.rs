//! Fuzzes the client-facing request reader: arbitrary bytes, fed whole and in pieces,
//! must never panic, must give the same requests either way, and must never return an
//! argument larger than the limit.
#![no_main]

use bytes::BytesMut;
use heatshield::protocol::request::{Limits, Next, RequestReader};
use libfuzzer_sys::fuzz_target;

fn run(data: &[u8], chunk: usize) -> (Vec<Vec<Vec<u8>>>, bool) {
    let limit = 4096;
    let mut r = RequestReader::new(Limits { max_request_bytes: limit });
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match r.next(&mut buf) {
                Ok(Next::Request(req)) => {
                    assert!(req.args().all(|a| a.len() <= limit), "argument over the limit");
                    out.push(req.args().map(|a| a.to_vec()).collect());
                }
                Ok(Next::Incomplete { .. }) => break,
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

fuzz_target!(|data: &[u8]| {
    let chunk = data.first().map(|&b| (b as usize % 17) + 1).unwrap_or(1);
    let whole = run(data, data.len());
    let pieces = run(data, chunk);
    assert_eq!(whole, pieces, "reading in pieces changed the result");
});
