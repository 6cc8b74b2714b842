//! The Redis protocol as heatshield needs it: a bounded, resumable reader for client
//! requests ([`request`]), a boundary scanner and small decoder for backend replies
//! ([`reply`]), and a writer for the replies the proxy composes itself ([`encode`]).
//! Nothing here does I/O.

pub mod encode;
pub mod reply;
pub mod request;

pub use encode::{Proto, Writer};
pub use reply::{ReplyScanner, Value};
pub use request::{Next, ProtocolError, Request, RequestReader};

/// Position of the first `b` in `hay`. The lines the parsers look for an end of are
/// mostly a few bytes (`$5`, `+OK`, `:42`) and keys a few dozen, where a plain loop beats
/// `memchr`'s setup (measured: `memchr` was a tenth of the instructions per
/// transaction); the rest of a longer haystack goes to `memchr`.
#[inline]
pub fn find_byte(b: u8, hay: &[u8]) -> Option<usize> {
    const SHORT: usize = 32;
    let head = &hay[..hay.len().min(SHORT)];
    if let Some(i) = head.iter().position(|&c| c == b) {
        return Some(i);
    }
    if hay.len() <= SHORT {
        return None;
    }
    memchr::memchr(b, &hay[SHORT..]).map(|i| i + SHORT)
}

#[cfg(test)]
mod tests {
    use super::find_byte;

    #[test]
    fn find_byte_agrees_with_memchr_at_every_length_and_place() {
        for len in 0..80 {
            for at in 0..=len {
                let mut hay = vec![b'x'; len];
                if at < len {
                    hay[at] = b'\n';
                }
                assert_eq!(find_byte(b'\n', &hay), memchr::memchr(b'\n', &hay), "len {len} at {at}");
            }
        }
    }
}
