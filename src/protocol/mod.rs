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
/// mostly a few bytes (`$5`, `+OK`, `:42`) and keys a few dozen, where a short loop beats
/// `memchr`'s setup (measured: `memchr` was a tenth of the instructions per
/// transaction): the first 32 bytes are looked at 8 at a time, each word compared with
/// the byte in all its lanes at once (the lowest lane that matches is the first match;
/// a lane can only look like a match above a real one), and the rest of a longer
/// haystack goes to `memchr`. Why not `memchr` for the head too: its set-up is most of
/// its cost on haystacks this short.
#[inline]
pub fn find_byte(b: u8, hay: &[u8]) -> Option<usize> {
    const SHORT: usize = 32;
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let head = &hay[..hay.len().min(SHORT)];
    let lanes = ONES * b as u64;
    let mut words = head.chunks_exact(8);
    let mut at = 0;
    for w in &mut words {
        let x = u64::from_le_bytes(w.try_into().expect("chunks of 8")) ^ lanes;
        let zero = x.wrapping_sub(ONES) & !x & HIGHS;
        if zero != 0 {
            return Some(at + (zero.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    if let Some(i) = words.remainder().iter().position(|&c| c == b) {
        return Some(at + i);
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

    #[test]
    fn find_byte_is_not_fooled_by_neighbouring_bytes() {
        // bytes that differ from the target by one bit or one borrow, around one or two
        // matches, for targets at the edges of the byte range
        for b in [0x00u8, 0x01, b'\n', b'{', b'}', 0x7f, 0x80, 0xfe, 0xff] {
            let fill = [b ^ 1, b.wrapping_add(1), b.wrapping_sub(1), 0x00, 0x80, 0xff, b ^ 0x80];
            for f in fill {
                if f == b {
                    continue;
                }
                for len in 0..48 {
                    for at in 0..=len {
                        let mut hay: Vec<u8> = (0..len).map(|i| if i % 3 == 0 { f } else { f ^ 0x40 }).collect();
                        hay.iter_mut().filter(|c| **c == b).for_each(|c| *c = f);
                        if at < len {
                            hay[at] = b;
                            if at + 3 < len {
                                hay[at + 3] = b;
                            }
                        }
                        assert_eq!(
                            find_byte(b, &hay),
                            memchr::memchr(b, &hay),
                            "b {b:#x} fill {f:#x} len {len} at {at}"
                        );
                    }
                }
            }
        }
    }
}
