//! The Redis Cluster hash slot of a key: CRC16-XMODEM of its hash tag, mod 16384.

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: usize = 16384;

/// The part of a key that is hashed: the content of the first `{...}` when it is
/// non-empty (the first `}` after the first `{`), otherwise the whole key.
#[inline]
pub fn hash_tag(key: &[u8]) -> &[u8] {
    use crate::protocol::find_byte;
    if let Some(open) = find_byte(b'{', key)
        && let Some(close) = find_byte(b'}', &key[open + 1..])
        && close > 0
    {
        return &key[open + 1..open + 1 + close];
    }
    key
}

/// CRC16-XMODEM (polynomial 0x1021, init 0), as Redis Cluster uses.
#[inline]
pub fn crc16(data: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(data)
}

/// The slot a key belongs to.
#[inline]
pub fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) & (SLOTS as u16 - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_and_slots() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b""), 0);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        // empty tag: the whole key is hashed
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"{}"), b"{}");
        // the first '}' after the first '{'
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"{{a}}"), b"{a");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"a{}b{c}"), b"a{}b{c}");
        assert_eq!(hash_tag(b"no}tag{"), b"no}tag{");
        assert_eq!(slot(b"{a}x"), slot(b"a"));
    }
}
