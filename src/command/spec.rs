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
    pub subs: &'static [RawSpec],
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
