//! The big-key log: the largest requests and replies seen, by key.

use bytes::Bytes;
use parking_lot::Mutex;

use super::slowlog::unix_now;

/// One request or reply in the big-key log.
pub(crate) struct BigEntry {
    pub(crate) key: Bytes,
    pub(crate) command: String,
    /// "request" or "reply".
    pub(crate) kind: &'static str,
    pub(crate) bytes: u64,
    pub(crate) at: u64,
}

/// The big-key log: the largest requests and replies seen, by key.
#[derive(Default)]
pub struct BigKeys {
    pub(crate) entries: Mutex<Vec<BigEntry>>,
}

impl BigKeys {
    /// Notes a request or reply of `bytes` for `key` (keeps the largest per key and kind).
    pub fn record(&self, max_len: usize, key: &[u8], command: &str, kind: &'static str, bytes: u64) {
        if max_len == 0 {
            return;
        }
        let mut v = self.entries.lock();
        if let Some(e) = v.iter_mut().find(|e| e.kind == kind && e.key == key) {
            e.at = unix_now();
            if bytes >= e.bytes {
                e.bytes = bytes;
                e.command = command.to_string();
            }
            return;
        }
        if v.len() >= max_len {
            // replace the smallest if this one is larger
            let (i, smallest) =
                v.iter().enumerate().min_by_key(|(_, e)| e.bytes).map(|(i, e)| (i, e.bytes)).unwrap_or((0, 0));
            if bytes <= smallest {
                return;
            }
            v.swap_remove(i);
        }
        v.push(BigEntry {
            key: Bytes::copy_from_slice(key),
            command: command.to_string(),
            kind,
            bytes,
            at: unix_now(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigkeys_keep_the_largest() {
        let b = BigKeys::default();
        for i in 0..10u64 {
            b.record(3, format!("k{i}").as_bytes(), "SET", "request", 100 + i);
        }
        let mut sizes: Vec<u64> = b.entries.lock().iter().map(|e| e.bytes).collect();
        sizes.sort();
        assert_eq!(sizes, vec![107, 108, 109]);
        b.record(3, b"k9", "GET", "request", 5000);
        assert!(b.entries.lock().iter().any(|e| e.key == "k9" && e.bytes == 5000 && e.command == "GET"));
    }
}
