//! Redis Cluster hash slots: [`crc16`] / [`key_slot`] hash keys as Redis does,
//! [`slot_view`] reads a node's `CLUSTER SLOTS`, and [`SlotOwners`] is the slot ->
//! master map of a cluster read once, with helpers to pick keys on each master.

use super::RedisCluster;
use super::client::{V, try_cmd};

/// Number of hash slots in Redis Cluster.
pub const SLOTS: u16 = 16384;

/// CRC16-XMODEM (poly 0x1021, init 0), as used by Redis Cluster.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// Redis Cluster hash slot of `key`, honouring hash tags: if the key contains
/// `{` followed later by `}` with non-empty content in between, only that
/// content (between the first `{` and the first `}` after it) is hashed.
pub fn key_slot(key: &[u8]) -> u16 {
    let mut hashed = key;
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        hashed = &key[open + 1..open + 1 + len];
    }
    crc16(hashed) % SLOTS
}

/// One slot range of a `CLUSTER SLOTS` reply: `(first, last, master_port)`.
pub type SlotRange = (u16, u16, u16);

/// `CLUSTER SLOTS` of the node on `port` as sorted `(first, last, master)`.
pub fn slot_view(port: u16) -> Result<Vec<SlotRange>, String> {
    let reply = try_cmd(port, &["CLUSTER", "SLOTS"]).map_err(|e| format!("{port}: CLUSTER SLOTS failed: {e}"))?;
    let bad = || format!("{port}: unexpected CLUSTER SLOTS reply {reply:?}");
    let V::Arr(entries) = &reply else { return Err(bad()) };
    let mut view = Vec::new();
    for entry in entries {
        match entry {
            V::Arr(range) => match range.as_slice() {
                [V::Int(lo), V::Int(hi), V::Arr(master), ..] => {
                    let master_port = match master.as_slice() {
                        [_, V::Int(p), ..] => *p as u16,
                        _ => return Err(bad()),
                    };
                    view.push((*lo as u16, *hi as u16, master_port));
                }
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        }
    }
    view.sort_unstable();
    Ok(view)
}

/// Checks that sorted ranges cover `0..16384` exactly once.
pub fn check_coverage(view: &[SlotRange]) -> Result<(), String> {
    let mut next = 0u32;
    for &(lo, hi, _) in view {
        if lo as u32 != next || hi < lo {
            return Err(format!("slot gap/overlap at {next}: range {lo}-{hi}"));
        }
        next = hi as u32 + 1;
    }
    if next != SLOTS as u32 {
        return Err(format!("slots covered only up to {next}"));
    }
    Ok(())
}

/// The current slot -> master-port map of a cluster, read once (`CLUSTER SLOTS`).
pub struct SlotOwners {
    owner: Vec<u16>,
}

impl SlotOwners {
    pub fn read(cluster: &RedisCluster) -> SlotOwners {
        let mut last = String::new();
        for port in cluster.live_ports() {
            let view = match slot_view(port) {
                Ok(view) => view,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let mut owner = vec![0u16; SLOTS as usize];
            for &(lo, hi, p) in &view {
                for s in lo..=hi {
                    owner[s as usize] = p;
                }
            }
            if owner.iter().all(|&p| p != 0) {
                return SlotOwners { owner };
            }
            last = format!("{port}: incomplete CLUSTER SLOTS {view:?}");
        }
        panic!("no node gave a complete slot map ({last})");
    }

    pub fn of_slot(&self, slot: u16) -> u16 {
        self.owner[slot as usize]
    }

    pub fn of_key(&self, key: &[u8]) -> u16 {
        self.owner[key_slot(key) as usize]
    }

    /// Distinct master ports, sorted.
    pub fn masters(&self) -> Vec<u16> {
        let mut m = self.owner.clone();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// One key `"{prefix}{n}"` owned by each master (sorted by master port).
    pub fn key_per_master(&self, prefix: &str) -> Vec<(u16, String)> {
        let masters = self.masters();
        let mut found: Vec<Option<String>> = vec![None; masters.len()];
        let mut n = 0u32;
        while found.iter().any(Option::is_none) {
            let key = format!("{prefix}{n}");
            let m = self.of_key(key.as_bytes());
            let i = masters.binary_search(&m).expect("known master");
            if found[i].is_none() {
                found[i] = Some(key);
            }
            n += 1;
            assert!(n < 100_000, "could not find keys on every master");
        }
        masters.into_iter().zip(found.into_iter().map(Option::unwrap)).collect()
    }

    /// A hash tag `{tagN}` (including braces) whose slot is owned by `master`.
    pub fn tag_on(&self, master: u16, prefix: &str) -> String {
        (0..100_000)
            .map(|n| format!("{{{prefix}{n}}}"))
            .find(|t| self.of_key(t.as_bytes()) == master)
            .expect("a tag on the master")
    }
}
