//! The raw shape of a Redis command as `COMMAND INFO` describes it (see generated.rs).

/// One command or subcommand as Redis reports it.
#[derive(Debug)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct RawSpec {
    pub name: &'static str,
    /// Redis arity: N means exactly N arguments (name included), -N means at least N.
    pub arity: i32,
    pub flags: u32,
    /// Legacy key specification: first key, last key (negative counts from the end), step.
    pub first: i32,
    pub last: i32,
    pub step: i32,
    /// Keys cannot be found from first/last/step alone.
    pub movable: bool,
    /// ACL categories ([`cat`] bits).
    pub acl: u32,
    /// Key specs, in Redis's order: what ACL checks each key for.
    pub specs: &'static [RawKey],
    pub subs: &'static [RawSpec],
}

/// One key spec as `COMMAND` describes it: its flags ([`key`] bits), where its search
/// begins and how it finds keys from there.
#[derive(Debug)]
pub(crate) struct RawKey(pub u8, pub RawBegin, pub RawFind);

/// Where a key spec's search begins.
#[derive(Debug)]
pub(crate) enum RawBegin {
    /// At this argument.
    Index(i32),
    /// After the first `keyword` from argument `startfrom` (negative: from the end).
    Keyword(&'static str, i32),
    /// The key can appear anywhere (SORT's STORE).
    BeginUnknown,
}

/// How a key spec finds its keys.
#[derive(Debug)]
pub(crate) enum RawFind {
    /// `lastkey`, `keystep`, `limit`.
    Range(i32, i32, i32),
    /// `keynumidx`, `firstkey`, `keystep`.
    KeyNum(i32, i32, i32),
    FindUnknown,
}

/// Key spec flags heatshield uses.
pub mod key {
    /// `access`: the command reads the key's value (ACL: read permission).
    pub const ACCESS: u8 = 1 << 0;
    /// `insert`, `update` or `delete` (ACL: write permission).
    pub const CHANGE: u8 = 1 << 1;
    /// `RW`, `OW`, `RM` or any of `CHANGE`'s: the key may change.
    pub const WRITES: u8 = 1 << 2;
    /// `not_key`: routed like a key, not one (a shard channel).
    pub const NOT_KEY: u8 = 1 << 3;
    /// `incomplete`: the spec may miss keys.
    pub const INCOMPLETE: u8 = 1 << 4;
    /// `variable_flags`: what it does to the key depends on the arguments (SET's GET).
    pub const VARIABLE: u8 = 1 << 5;
}

/// ACL categories: Redis 7.0's, in the order `ACL CAT` lists them (bit i is
/// [`cat::NAMES`]`[i]`), then heatshield's own.
pub mod cat {
    pub const KEYSPACE: u32 = 1 << 0;
    pub const READ: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const SET: u32 = 1 << 3;
    pub const SORTEDSET: u32 = 1 << 4;
    pub const LIST: u32 = 1 << 5;
    pub const HASH: u32 = 1 << 6;
    pub const STRING: u32 = 1 << 7;
    pub const BITMAP: u32 = 1 << 8;
    pub const HYPERLOGLOG: u32 = 1 << 9;
    pub const GEO: u32 = 1 << 10;
    pub const STREAM: u32 = 1 << 11;
    pub const PUBSUB: u32 = 1 << 12;
    pub const ADMIN: u32 = 1 << 13;
    pub const FAST: u32 = 1 << 14;
    pub const SLOW: u32 = 1 << 15;
    pub const BLOCKING: u32 = 1 << 16;
    pub const DANGEROUS: u32 = 1 << 17;
    pub const CONNECTION: u32 = 1 << 18;
    pub const TRANSACTION: u32 = 1 << 19;
    pub const SCRIPTING: u32 = 1 << 20;
    /// heatshield's `PROXY` commands.
    pub const PROXY: u32 = 1 << 21;
    /// heatshield's `LOCK.*` commands.
    pub const LOCK: u32 = 1 << 22;

    /// The names, by bit.
    pub const NAMES: [&str; 23] = [
        "keyspace",
        "read",
        "write",
        "set",
        "sortedset",
        "list",
        "hash",
        "string",
        "bitmap",
        "hyperloglog",
        "geo",
        "stream",
        "pubsub",
        "admin",
        "fast",
        "slow",
        "blocking",
        "dangerous",
        "connection",
        "transaction",
        "scripting",
        "proxy",
        "lock",
    ];

    /// The bit of a category named as `ACL CAT` names it (no `@`, any case).
    pub fn of(name: &[u8]) -> Option<u32> {
        NAMES.iter().position(|n| n.as_bytes().eq_ignore_ascii_case(name)).map(|i| 1 << i)
    }
}

/// Command flags, a subset of Redis's.
#[allow(dead_code)]
pub mod flags {
    pub const WRITE: u32 = 1 << 0;
    pub const READONLY: u32 = 1 << 1;
    pub const DENYOOM: u32 = 1 << 2;
    pub const ADMIN: u32 = 1 << 3;
    pub const PUBSUB: u32 = 1 << 4;
    pub const NOSCRIPT: u32 = 1 << 5;
    pub const BLOCKING: u32 = 1 << 6;
    pub const LOADING: u32 = 1 << 7;
    pub const STALE: u32 = 1 << 8;
    pub const FAST: u32 = 1 << 9;
    pub const NO_AUTH: u32 = 1 << 10;
    pub const MAY_REPLICATE: u32 = 1 << 11;
    pub const NO_MULTI: u32 = 1 << 12;
    pub const ALLOW_BUSY: u32 = 1 << 13;
    /// A module's command (learned): it may touch keys it does not declare.
    pub const MODULE: u32 = 1 << 14;
}
