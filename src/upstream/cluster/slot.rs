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

/// CRC16-XMODEM with 16 tables (`crc`'s slice-by-16) for keys of 16 bytes or more,
/// taken 16 bytes at a time (half the cost of one byte at a time for a 16-byte key:
/// criterion, `slot/plain_16B_key`), and one table below that, where the 16 tables' set-up
/// costs more than it saves. Every request with a key pays this.
const XMODEM16: crc::Crc<u16, crc::Table<16>> = crc::Crc::<u16, crc::Table<16>>::new(&crc::CRC_16_XMODEM);
const XMODEM1: crc::Crc<u16, crc::Table<1>> = crc::Crc::<u16, crc::Table<1>>::new(&crc::CRC_16_XMODEM);

/// CRC16-XMODEM (polynomial 0x1021, init 0), as Redis Cluster uses.
#[inline]
pub fn crc16(data: &[u8]) -> u16 {
    if data.len() >= 16 { XMODEM16.checksum(data) } else { XMODEM1.checksum(data) }
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
    fn both_tables_agree_with_the_bitwise_definition() {
        // polynomial 0x1021, init 0, no reflection: one bit at a time
        fn bitwise(data: &[u8]) -> u16 {
            let mut crc = 0u16;
            for &b in data {
                crc ^= (b as u16) << 8;
                for _ in 0..8 {
                    crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
                }
            }
            crc
        }
        let data: Vec<u8> = (0..100u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(crc16(&data[..len]), bitwise(&data[..len]), "length {len}");
        }
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
