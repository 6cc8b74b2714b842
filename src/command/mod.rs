//! The command table: one place that says, for every command a client may send, its
//! arity, where its keys are, whether it reads or writes, and how the proxy routes it.
//!
//! [`spec`] holds the shape of a key spec and the command flags; Redis's own `COMMAND
//! INFO` ([`generated`]) supplies names, arities, flags and legacy key positions;
//! [`learned`] adds what the masters know beyond them; [`route_of`] and [`keys_of`] overlay what the proxy does with each command.
//! Every other part of heatshield asks this table instead of matching on names.

mod generated;
pub mod learned;
pub(crate) mod spec;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use arc_swap::ArcSwap;

use smallvec::SmallVec;
use spec::{RawBegin, RawFind, RawKey, RawSpec};
pub use spec::{cat, flags, key};

use crate::protocol::Request;

/// Where a command's keys are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySpec {
    /// No keys.
    None,
    /// Keys at first, first+step, ... up to last (negative: counted from the end).
    Range { first: u32, last: i32, step: u32 },
    /// `numkeys` at position `at`, then that many keys; `dest` is a key before it.
    NumKeys { dest: Option<u32>, at: u32 },
    /// XREAD / XREADGROUP: the first half of the arguments after `STREAMS`.
    Streams,
    /// SORT / SORT_RO: the key at 1, plus the `STORE` destination.
    Sort,
    /// GEORADIUS[BYMEMBER]: the key at 1, plus `STORE`/`STOREDIST` destinations.
    GeoStore,
    /// A command learned from the servers: its key specs (learned.rs), behind one thin
    /// pointer so that every command's `KeySpec` stays as small as it was.
    Learned(&'static learned::KeyRules),
}

impl KeySpec {
    /// EVAL, EVALSHA, FCALL and their read-only forms (numkeys after the script or
    /// function). BLMPOP and BZMPOP share it, but are routed as blocking commands first.
    pub const SCRIPT: KeySpec = KeySpec::NumKeys { dest: None, at: 2 };

    /// [`KeySpec::SCRIPT`] (a pattern, not `==`: comparing with a learned spec would
    /// compare its rules, on every request).
    #[inline]
    pub fn is_script(&self) -> bool {
        matches!(self, KeySpec::NumKeys { dest: None, at: 2 })
    }
}

/// How a split multi-key command is sent and merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// MGET: values merged back in request order.
    Mget,
    /// MSET: key/value pairs; one OK when every part succeeded.
    Mset,
    /// DEL, UNLINK, EXISTS, TOUCH: integer replies summed.
    Sum,
}

/// Commands sent to every master, and how their replies merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanOut {
    /// KEYS, LATENCY LATEST: arrays concatenated.
    Keys,
    /// SCAN: one node at a time, the node encoded in the cursor.
    Scan,
    /// RANDOMKEY: any non-nil reply.
    RandomKey,
    /// DBSIZE: integers summed.
    Dbsize,
    /// FLUSHALL/FLUSHDB: every master, allowed only when configured.
    Flush,
    /// SCRIPT LOAD / SCRIPT FLUSH / FUNCTION LOAD|DELETE|FLUSH|RESTORE: every master must succeed;
    /// the first reply is returned.
    AllSame,
    /// SCRIPT EXISTS: element-wise AND of the 0/1 arrays.
    ScriptExists,
    /// SCRIPT KILL / FUNCTION KILL / FUNCTION STATS (Redis allows them while a script is
    /// busy): every master, each on a dedicated connection; `+OK` if one of them killed
    /// its script; the STATS of the master running a function, if one does.
    Kill,
    /// PUBSUB CHANNELS / SHARDCHANNELS: arrays merged without repeats.
    Channels,
    /// PUBSUB NUMSUB / SHARDNUMSUB: counts summed per channel (and this heatshield's
    /// shared subscriptions counted as its clients).
    NumSub(ChannelKind),
    /// PUBSUB NUMPAT: summed (a pattern subscribed on several masters counted once).
    NumPat,
    /// SLOWLOG GET, COMMANDLOG GET: every master's entries, newest first.
    Log,
    /// SLOWLOG RESET, COMMANDLOG RESET: every master (after PROXY AUTH where
    /// `admin.password` is set, as CONFIG SET).
    LogReset,
    /// CLUSTER SLOT-STATS (Valkey 8): every master's slots, ordered again.
    SlotStats,
    /// COMMAND, COMMAND COUNT / INFO / LIST / DOCS: one master's answer, less the commands
    /// heatshield refuses, plus its own (PROXY, LOCK.*).
    Commands,
}

/// What a subscription names (crate::services::pubsub).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChannelKind {
    /// SUBSCRIBE, PUBLISH.
    Channel = 0,
    /// PSUBSCRIBE.
    Pattern = 1,
    /// SSUBSCRIBE, SPUBLISH: routed by the channel's slot.
    Shard = 2,
}

/// Commands the proxy answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    Ping,
    Echo,
    Quit,
    Select,
    Hello,
    Auth,
    Time,
    Info,
    Reset,
    /// READONLY / READWRITE: accepted and ignored (reads go to masters).
    Ok,
    /// `CLIENT SETNAME | GETNAME | ID | SETINFO | INFO | LIST | KILL | REPLY | UNBLOCK |
    /// NO-EVICT | NO-TOUCH`: about heatshield's own clients (crate::face::client).
    Client,
    /// `PROXY ...`: heatshield's admin commands.
    Proxy,
    /// `CLUSTER INFO | MYID | SLOTS | SHARDS | NODES | KEYSLOT | COUNTKEYSINSLOT |
    /// GETKEYSINSLOT`: heatshield as a one-node cluster (crate::face::cluster).
    Cluster,
    /// `CONFIG GET | SET | RESETSTAT | REWRITE`: the masters' settings as one server's
    /// (crate::face::config).
    Config,
    /// WAIT: the replicas' acknowledgements of the client's writes, asked of the masters
    /// on connections of heatshield's own (crate::services::wait).
    Wait,
    /// WAITAOF (Redis 7.2): the same, for the fsyncs of the masters and their replicas.
    WaitAof,
    /// HOTKEYS (Redis 8.6): heatshield's own count of what it serves (crate::services::stats).
    Hotkeys,
    /// `ACL WHOAMI | CAT | USERS | LIST | SETUSER | DELUSER | GETUSER`: heatshield's own
    /// users and categories, never a master's (whose user is heatshield's own).
    Acl,
}

impl Local {
    /// Whether a client may send it before authenticating: AUTH, HELLO, QUIT and RESET,
    /// Redis 7.0's `no-auth` commands (PING is not one: it gets NOAUTH, as on Redis).
    pub fn auth_free(self) -> bool {
        matches!(self, Local::Auth | Local::Hello | Local::Quit | Local::Reset)
    }
}

/// MULTI / EXEC / DISCARD / WATCH / UNWATCH (crate::modes::transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxCmd {
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
}

/// What the proxy does with a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Sent to the master owning its keys' slot (all keys must share it); keyless: any master.
    Forward,
    /// Split by slot and merged when its keys span slots; forwarded whole otherwise.
    Split(Split),
    FanOut(FanOut),
    Local(Local),
    /// Any one master (COMMAND and its subcommands: they describe Redis itself).
    AnyMaster,
    /// heatshield's lock commands, run as scripts on the lock key's master (the locks
    /// module carries them out).
    Lock(LockCmd),
    /// MULTI, EXEC, DISCARD, WATCH, UNWATCH: the connection's transaction
    /// (crate::modes::transaction).
    Transaction(TxCmd),
    /// A blocking command: sent on a dedicated connection to the master owning its keys'
    /// slot (crate::path::pending::start_blocking). XREAD and XREADGROUP are `Forward`, and
    /// take this route when they have BLOCK.
    Block,
    /// SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE (`true`) and their UNSUBSCRIBEs (`false`): the
    /// connection's subscriptions (crate::modes::subscribe), served by shared backend
    /// subscriptions (crate::services::pubsub).
    Subscribe(ChannelKind, bool),
    /// Refused with `-ERR heatshield does not support '<name>'` (and the reason, if any).
    Unsupported(&'static str),
}

/// The four lock commands (`LOCK.ACQUIRE`, `LOCK.RELEASE`, `LOCK.EXTEND`, `LOCK.INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockCmd {
    Acquire,
    Release,
    Extend,
    Info,
}

/// One resolved command (or subcommand).
#[derive(Debug)]
pub struct Command {
    /// Dense index (0..[`CommandTable::count`]), for per-command statistics.
    pub id: usize,
    /// Uppercase name, `PARENT|SUB` for subcommands.
    pub name: String,
    /// Lowercase full name, as Redis writes it in error messages.
    pub lower: String,
    /// Redis's arity (the servers' where they changed it: see [`CommandTable::learn`]).
    arity: AtomicI32,
    /// The generated table's arity.
    built_arity: i32,
    pub flags: u32,
    /// ACL categories ([`cat`] bits), as the servers report them; heatshield's own
    /// commands have `@proxy` and `@lock` besides Redis's.
    pub acl: u32,
    /// A subcommand's parent's categories: a rule for a category the parent is in
    /// reaches every subcommand, as on Redis.
    pub parent_acl: u32,
    pub keys: KeySpec,
    /// Its key specs as the server declares them, with what ACL checks each key for
    /// (see [`acl_keys`]); routing uses [`KeySpec`].
    pub key_rules: Box<[learned::KeyRule]>,
    /// [`acl_key_at`], worked out with `key_rules`.
    acl_at: Option<(u32, u8)>,
    /// [`acl_key_place`], worked out with `key_rules`.
    acl_place: Option<u32>,
    pub route: Route,
    /// Its requests take the shared connections unless the connection's state says
    /// otherwise (a WATCH, a MULTI): every route but the blocking, subscription, lock,
    /// transaction and RESET ones and SCRIPT/FUNCTION KILL (see `crate::conn::order`).
    pub shared_lane: bool,
    /// What heatshield knows of it beyond Redis's flags ([`traits`]), decided here once
    /// from its name, so nothing else matches command names.
    pub traits: u16,
    /// Where its reply names keys (key colocation shows the client's names there).
    pub names: NamesInReply,
    /// Its lowercase name as a little-endian word when it has at most 8 bytes, else 0
    /// (see [`CommandTable::lookup`]).
    word: u64,
    /// Subcommands, by uppercase name.
    subs: Names,
}

/// Where a command's reply names keys, decided by name ([`NamesInReply::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum NamesInReply {
    #[default]
    None,
    /// The reply is one name (RANDOMKEY).
    One,
    /// An array of names (KEYS).
    List,
    /// SCAN's `[cursor, [names]]`.
    Scan,
    /// An array whose first element is the key it came from (BLPOP, BZPOPMIN, LMPOP, ...).
    First,
    /// XREAD's streams by name (an array of pairs in RESP2, a map in RESP3).
    Streams,
    /// (P)SUBSCRIBE and (P)UNSUBSCRIBE: their arguments and confirmations name channels,
    /// and a keyspace channel names a key (`__keyspace@0__:key`).
    Channels,
    /// EVAL, EVALSHA (and their read-only forms), SCRIPT LOAD: a script's body may make
    /// key names of its own; a SHA1 in the reply names the script.
    Script,
}

/// Whether a request whose first argument is `name` may be of a command whose reply
/// names keys ([`NamesInReply`]), without a lookup (any case).
/// (The length test inline: it decides GET, SET and most others.)
#[inline(always)]
pub fn may_name_keys(name: &[u8]) -> bool {
    (4..=12).contains(&name.len()) && may_name_keys_by_name(name)
}

#[inline(never)]
fn may_name_keys_by_name(name: &[u8]) -> bool {
    if !matches!(name[0] | 0x20, b'k' | b's' | b'r' | b'b' | b'l' | b'z' | b'x' | b'p' | b'u' | b'e' | b'c') {
        return false;
    }
    let mut up = [0u8; 12];
    up[..name.len()].copy_from_slice(name);
    up.make_ascii_uppercase();
    std::str::from_utf8(&up[..name.len()]).is_ok_and(|n| NamesInReply::of(n) != NamesInReply::None)
}

impl NamesInReply {
    pub fn of(name: &str) -> NamesInReply {
        match name {
            "RANDOMKEY" => NamesInReply::One,
            // (CLUSTER: for a lookup by its first argument; its other subcommands name none)
            "KEYS" | "CLUSTER|GETKEYSINSLOT" | "CLUSTER" => NamesInReply::List,
            "SCAN" => NamesInReply::Scan,
            "BLPOP" | "BRPOP" | "BZPOPMIN" | "BZPOPMAX" | "BLMPOP" | "BZMPOP" | "LMPOP" | "ZMPOP" => {
                NamesInReply::First
            }
            "XREAD" | "XREADGROUP" => NamesInReply::Streams,
            "SUBSCRIBE" | "PSUBSCRIBE" | "UNSUBSCRIBE" | "PUNSUBSCRIBE" => NamesInReply::Channels,
            "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" | "SCRIPT" | "SCRIPT|LOAD" => NamesInReply::Script,
            _ => NamesInReply::None,
        }
    }
}

/// Properties of a command that Redis's flags do not give, decided by name when the
/// table is built ([`Command::traits`]).
pub mod traits {
    /// A script or function call: it may write (EVAL, EVALSHA, FCALL).
    pub const MAY_WRITE: u16 = 1 << 0;
    /// Blocks only with its BLOCK option, whose value is the timeout in milliseconds
    /// (XREAD, XREADGROUP).
    pub const BLOCK_OPTION: u16 = 1 << 1;
    /// Its timeout is its first argument (BLMPOP, BZMPOP); otherwise its last.
    pub const TIMEOUT_FIRST: u16 = 1 << 2;
    /// Answers a timeout with a nil string, not a nil array (BRPOPLPUSH, BLMOVE).
    pub const NIL_STRING_ON_TIMEOUT: u16 = 1 << 3;
    /// Names its script by digest (EVALSHA, EVALSHA_RO).
    pub const BY_DIGEST: u16 = 1 << 4;
    /// A read whose reply changes without a write (time, randomness, object statistics):
    /// never cached.
    pub const VOLATILE: u16 = 1 << 5;
    /// PUBLISH; with [`SHARD`], SPUBLISH.
    pub const PUBLISH: u16 = 1 << 6;
    pub const SHARD: u16 = 1 << 7;

    /// The traits of command `name` (uppercase, `PARENT|SUB` for a subcommand).
    pub fn of(name: &str) -> u16 {
        match name {
            "EVAL" | "FCALL" => MAY_WRITE,
            "EVALSHA" => MAY_WRITE | BY_DIGEST,
            "EVALSHA_RO" => BY_DIGEST,
            "XREAD" | "XREADGROUP" => BLOCK_OPTION,
            "BLMPOP" | "BZMPOP" => TIMEOUT_FIRST,
            "BRPOPLPUSH" | "BLMOVE" => NIL_STRING_ON_TIMEOUT,
            "PUBLISH" => PUBLISH,
            "SPUBLISH" => PUBLISH | SHARD,
            "TTL" | "PTTL" | "EXPIRETIME" | "PEXPIRETIME" | "SRANDMEMBER" | "HRANDFIELD" | "ZRANDMEMBER"
            | "RANDOMKEY" | "OBJECT|IDLETIME" | "OBJECT|FREQ" | "OBJECT|ENCODING" | "OBJECT|REFCOUNT" => VOLATILE,
            _ => 0,
        }
    }
}

impl Command {
    /// A command that changes data (scripts count as writes: they may).
    /// A read-only command (Redis's `readonly` flag): its keys are what CLIENT TRACKING tracks.
    pub fn is_read(&self) -> bool {
        self.flags & flags::READONLY != 0
    }

    pub fn is_write(&self) -> bool {
        self.flags & flags::WRITE != 0 || self.traits & traits::MAY_WRITE != 0
    }

    /// A command that may block (BLPOP, XREAD ... BLOCK, ...).
    pub fn is_blocking(&self) -> bool {
        self.flags & flags::BLOCKING != 0 || self.traits & traits::BLOCK_OPTION != 0
    }

    /// Whether it has trait `t` ([`traits`]).
    #[inline]
    pub fn has(&self, t: u16) -> bool {
        self.traits & t != 0
    }

    /// XREAD / XREADGROUP with BLOCK: a blocking command for this request.
    #[inline(always)]
    pub fn blocks_with(&self, req: &Request) -> bool {
        self.has(traits::BLOCK_OPTION) && has_block(req)
    }

    pub fn is_readonly(&self) -> bool {
        self.flags & flags::READONLY != 0 && !self.is_write()
    }

    /// The subcommand `name` (uppercase).
    pub fn sub(&self, name: &[u8]) -> Option<&Command> {
        self.subs.get(name)
    }

    pub fn has_subcommands(&self) -> bool {
        !self.subs.is_empty()
    }

    /// Redis's arity: N arguments exactly (the name included), or at least -N.
    pub fn arity(&self) -> i32 {
        self.arity.load(Ordering::Relaxed)
    }

    fn arity_ok(&self, argc: usize) -> bool {
        let a = self.arity();
        (a >= 0 && argc == a as usize) || (a < 0 && argc >= (-a) as usize)
    }
}

/// Why a request could not be matched to a command; rendered with Redis's texts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupError {
    Unknown(String),
    UnknownSub(String),
    Arity(String),
}

impl LookupError {
    pub fn message(&self) -> &str {
        match self {
            LookupError::Unknown(s) | LookupError::UnknownSub(s) | LookupError::Arity(s) => s,
        }
    }
}

/// Commands by uppercase name. aHash rather than the standard SipHash: every request's
/// name is looked up here, and the table's keys are fixed at start-up (nothing a client
/// sends is inserted, so there is no flooding to resist).
type Names = HashMap<Vec<u8>, Command, ahash::RandomState>;

/// Buckets of [`CommandTable`]'s quick table.
const QUICK: usize = 4096;
/// A quick-table bucket no command name falls in.
const QUICK_EMPTY: u16 = u16::MAX;
/// A quick-table bucket several names fall in: the map decides.
const QUICK_SHARED: u16 = u16::MAX - 1;

/// A name's quick-table bucket, from its length and four of its bytes with the ASCII case
/// bit cleared (so `get` and `GET` fall in one bucket; other bytes change consistently),
/// spread by multiplying with `mult` (Fibonacci hashing: the product's top bits).
#[inline]
fn quick_bucket(name: &[u8], mult: u64) -> usize {
    let n = name.len();
    let b = |i: usize| (name[i] & !0x20) as u64;
    let x = n as u64 | b(0) << 8 | b(1.min(n - 1)) << 16 | b(n / 2) << 24 | b(n - 1) << 32;
    (x.wrapping_mul(mult) >> (64 - QUICK.trailing_zeros())) as usize
}

/// Commands sent most, which must each have a quick bucket of their own.
const COMMON: [&str; 16] = [
    "GET", "SET", "MGET", "MSET", "DEL", "EXISTS", "EXPIRE", "INCR", "HGET", "HSET", "HGETALL", "EVALSHA", "PING",
    "LPUSH", "RPOP", "ZADD",
];

/// The quick table for `names` with the first multiplier (of 64 tried) that gives every
/// [`COMMON`] command a bucket of its own, sharing as few buckets as it can.
fn quick_table(names: &[&[u8]]) -> (u64, Box<[u16]>) {
    let mut best: Option<(usize, u64, Box<[u16]>)> = None;
    for k in 0..64u64 {
        let mult = 0x9E37_79B9_7F4A_7C15u64 ^ k.wrapping_mul(0x5851_F42D_4C95_7F2D);
        let mut quick = vec![QUICK_EMPTY; QUICK].into_boxed_slice();
        for (at, name) in names.iter().enumerate() {
            let q = &mut quick[quick_bucket(name, mult)];
            *q = if *q == QUICK_EMPTY { at as u16 } else { QUICK_SHARED };
        }
        if COMMON.iter().any(|c| quick[quick_bucket(c.as_bytes(), mult)] == QUICK_SHARED) {
            continue;
        }
        let shared = names.iter().filter(|n| quick[quick_bucket(n, mult)] == QUICK_SHARED).count();
        if best.as_ref().is_none_or(|b| shared < b.0) {
            best = Some((shared, mult, quick));
        }
    }
    // every multiplier failing would only make lookups take the map: still correct
    best.map(|(_, m, q)| (m, q)).unwrap_or((0x9E37_79B9_7F4A_7C15, vec![QUICK_SHARED; QUICK].into_boxed_slice()))
}

/// Ids kept for commands learned from the servers (their statistics and metrics): a
/// learned command past these counts as `unknown`.
pub const LEARNED_IDS: usize = 512;
/// At most this many learned commands are made over the process's life (each server
/// version's new commands once): past it, no more are learned (and a warning says so).
const LEARNED_MAX: usize = 4096;

/// What the servers taught the table (see [`CommandTable::learn`]).
#[derive(Debug, Default)]
struct LearnedSet {
    /// Top-level commands the generated table lacks, by uppercase name.
    top: HashMap<Vec<u8>, &'static Command, ahash::RandomState>,
    /// Subcommands the generated table lacks of commands it has, by `PARENT|SUB`.
    subs: HashMap<Vec<u8>, &'static Command, ahash::RandomState>,
}

/// What [`CommandTable::learn`] did, for the log and `PROXY INFO`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Learning {
    /// Commands and subcommands from the servers that the generated table lacks, accepted.
    pub added: Vec<String>,
    /// Commands heatshield knows whose arity follows the servers' (`ZRANK ... WITHSCORE`).
    pub arity_changed: Vec<String>,
    /// Commands from the servers that heatshield refuses, and why.
    pub refused: Vec<String>,
    /// Commands some masters know and others do not (or describe otherwise): refused.
    pub disagreed: Vec<String>,
    /// The servers asked: `address version`.
    pub servers: Vec<String>,
}

/// All commands: the generated table, built at start-up, and what the servers add to it
/// (learned at run time, see [`CommandTable::learn`]).
#[derive(Debug)]
pub struct CommandTable {
    /// Top-level commands.
    list: Vec<Command>,
    /// Their places in `list`, by upper-case name.
    by_name: HashMap<Vec<u8>, u16, ahash::RandomState>,
    /// By [`quick_bucket`]: the place in `list` of the one command whose name falls
    /// there, or [`QUICK_EMPTY`] / [`QUICK_SHARED`]. Most names have a bucket of their
    /// own, so a lookup is three byte reads and one case-insensitive comparison (the map,
    /// with its upper-casing copy and hash, took 31 ns for `GET`).
    quick: Box<[u16]>,
    /// The multiplier of [`quick_bucket`] chosen for these names.
    mult: u64,
    /// Commands and subcommands; ids run from 0 to this (exclusive).
    count: usize,
    /// `names[id]` is the command's full name.
    names: Vec<String>,
    /// Ids of the generated table's commands run below this; learned ones from here.
    base: usize,
    /// What the servers added: looked at only when the generated table has no such name,
    /// so the usual lookup stays as it was.
    learned: ArcSwap<LearnedSet>,
    /// Times `learned` was replaced ([`CommandTable::generation`]).
    learnings: std::sync::atomic::AtomicU64,
    /// The learned commands made so far, with their definitions: reused when a server
    /// describes one alike again. They live as long as the process (lookups hand out
    /// `&'static Command`s, which needs no reference count per request); at most
    /// [`LEARNED_MAX`] are made.
    made: Mutex<Vec<(learned::Def, &'static Command)>>,
    /// Learned commands' ids, by full name (kept across learnings).
    learned_ids: Mutex<HashMap<String, usize>>,
    /// Learned commands' names, by id - `base`.
    learned_names: Box<[OnceLock<String>]>,
    /// What the last learning did.
    last: Mutex<Option<Learning>>,
}

impl Default for CommandTable {
    fn default() -> Self {
        Self::new()
    }
}

impl CommandTable {
    pub fn new() -> Self {
        let mut by_name = Names::default();
        let mut next_id = 0;
        for raw in generated::REDIS_COMMANDS {
            by_name.insert(raw.name.as_bytes().to_vec(), build(raw, None, &mut next_id));
        }
        // Newer than the Redis the table was generated from, and sent by current clients
        // (redis-py, Jedis, go-redis) right after connecting.
        if let Some(client) = by_name.get_mut(b"CLIENT".as_slice()) {
            static CLIENT: RawSpec = RawSpec {
                name: "CLIENT",
                arity: -2,
                flags: 0,
                first: 0,
                last: 0,
                step: 0,
                movable: false,
                acl: cat::SLOW,
                specs: &[],
                subs: &[],
            };
            static SETINFO: RawSpec = RawSpec {
                name: "SETINFO",
                arity: 4,
                flags: flags::NOSCRIPT | flags::LOADING | flags::STALE,
                first: 0,
                last: 0,
                step: 0,
                movable: false,
                acl: cat::SLOW | cat::CONNECTION,
                specs: &[],
                subs: &[],
            };
            client.subs.entry(b"SETINFO".to_vec()).or_insert_with(|| build(&SETINFO, Some(&CLIENT), &mut next_id));
            static NO_TOUCH: RawSpec = RawSpec {
                name: "NO-TOUCH",
                arity: 3,
                flags: flags::NOSCRIPT | flags::LOADING | flags::STALE,
                first: 0,
                last: 0,
                step: 0,
                movable: false,
                acl: cat::SLOW | cat::CONNECTION,
                specs: &[],
                subs: &[],
            };
            client.subs.entry(b"NO-TOUCH".to_vec()).or_insert_with(|| build(&NO_TOUCH, Some(&CLIENT), &mut next_id));
        }
        // heatshield's own commands: PROXY, Redis 8.6's HOTKEYS (answered by heatshield for
        // the whole cluster), and the lock commands (one key, the lock).
        static OWN: [RawSpec; 6] = [
            RawSpec {
                name: "PROXY",
                arity: -2,
                flags: flags::ADMIN | flags::NOSCRIPT | flags::LOADING | flags::STALE,
                first: 0,
                last: 0,
                step: 0,
                movable: false,
                acl: cat::ADMIN | cat::SLOW | cat::DANGEROUS | cat::PROXY,
                specs: &[],
                subs: &[],
            },
            RawSpec {
                name: "HOTKEYS",
                arity: -2,
                flags: flags::ADMIN | flags::NOSCRIPT | flags::LOADING | flags::STALE,
                first: 0,
                last: 0,
                step: 0,
                movable: false,
                acl: cat::ADMIN | cat::SLOW | cat::DANGEROUS,
                specs: &[],
                subs: &[],
            },
            RawSpec {
                name: "LOCK.ACQUIRE",
                arity: -4,
                flags: flags::WRITE | flags::DENYOOM,
                first: 1,
                last: 1,
                step: 1,
                movable: false,
                acl: cat::WRITE | cat::SLOW | cat::BLOCKING | cat::LOCK,
                specs: &[RawKey(key::ACCESS | key::CHANGE | key::WRITES, RawBegin::Index(1), RawFind::Range(0, 1, 0))],
                subs: &[],
            },
            RawSpec {
                name: "LOCK.RELEASE",
                arity: 3,
                flags: flags::WRITE,
                first: 1,
                last: 1,
                step: 1,
                movable: false,
                acl: cat::WRITE | cat::SLOW | cat::LOCK,
                specs: &[RawKey(key::ACCESS | key::CHANGE | key::WRITES, RawBegin::Index(1), RawFind::Range(0, 1, 0))],
                subs: &[],
            },
            RawSpec {
                name: "LOCK.EXTEND",
                arity: 4,
                flags: flags::WRITE,
                first: 1,
                last: 1,
                step: 1,
                movable: false,
                acl: cat::WRITE | cat::SLOW | cat::LOCK,
                specs: &[RawKey(key::ACCESS | key::CHANGE | key::WRITES, RawBegin::Index(1), RawFind::Range(0, 1, 0))],
                subs: &[],
            },
            RawSpec {
                name: "LOCK.INFO",
                arity: 2,
                flags: flags::READONLY,
                first: 1,
                last: 1,
                step: 1,
                movable: false,
                acl: cat::READ | cat::SLOW | cat::LOCK,
                specs: &[RawKey(key::ACCESS, RawBegin::Index(1), RawFind::Range(0, 1, 0))],
                subs: &[],
            },
        ];
        for raw in &OWN {
            by_name.insert(raw.name.as_bytes().to_vec(), build(raw, None, &mut next_id));
        }
        let mut names = vec![String::new(); next_id];
        for c in by_name.values() {
            names[c.id] = c.name.clone();
            for s in c.subs.values() {
                names[s.id] = s.name.clone();
            }
        }
        let mut list = Vec::with_capacity(by_name.len());
        let mut keys = Vec::with_capacity(by_name.len());
        let mut index = HashMap::with_capacity_and_hasher(by_name.len(), ahash::RandomState::default());
        for (name, cmd) in by_name {
            index.insert(name.clone(), list.len() as u16);
            keys.push(name);
            list.push(cmd);
        }
        let (mult, quick) = quick_table(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>());
        CommandTable {
            list,
            by_name: index,
            quick,
            mult,
            count: next_id + LEARNED_IDS,
            names,
            base: next_id,
            learned: ArcSwap::default(),
            learnings: Default::default(),
            made: Mutex::default(),
            learned_ids: Mutex::default(),
            learned_names: (0..LEARNED_IDS).map(|_| OnceLock::new()).collect(),
            last: Mutex::default(),
        }
    }

    /// Takes the commands the servers describe (`defs`: those every master agrees on, see
    /// [`learned::agreed`]): a command or subcommand the generated table lacks is accepted
    /// and routed by its key specs; one it has keeps heatshield's own handling, with the
    /// servers' arity where it changed. What was learned before and is no longer described
    /// is forgotten. `disagreed` is only reported.
    pub fn learn(&self, defs: &[learned::Def], disagreed: Vec<String>, servers: Vec<String>) -> Learning {
        let mut report = Learning { disagreed, servers, ..Learning::default() };
        let mut set = LearnedSet::default();
        let mut arity: HashMap<&str, i32> = HashMap::new();
        for def in defs {
            let Some(known) = self.get(def.name.as_bytes()) else {
                if let Some(c) = self.made(def, &mut report) {
                    set.top.insert(def.name.as_bytes().to_vec(), c);
                }
                continue;
            };
            if def.arity != known.built_arity {
                arity.insert(&known.name, def.arity);
            }
            for sd in &def.subs {
                let sub = sd.name.rsplit_once('|').map_or(sd.name.as_str(), |(_, s)| s);
                match known.subs.get(sub.as_bytes()) {
                    Some(k) if sd.arity != k.built_arity => {
                        arity.insert(&k.name, sd.arity);
                    }
                    Some(_) => {}
                    None => {
                        if let Some(c) = self.made(sd, &mut report) {
                            set.subs.insert(sd.name.as_bytes().to_vec(), c);
                        }
                    }
                }
            }
        }
        for c in self.list.iter().flat_map(|c| std::iter::once(c).chain(c.subs.values())) {
            let want = arity.get(c.name.as_str()).copied().unwrap_or(c.built_arity);
            if want != c.built_arity {
                report.arity_changed.push(format!("{} {} (was {})", c.name, want, c.built_arity));
            }
            c.arity.store(want, Ordering::Relaxed);
        }
        report.added.sort();
        report.arity_changed.sort();
        report.refused.sort();
        self.learned.store(std::sync::Arc::new(set));
        self.learnings.fetch_add(1, std::sync::atomic::Ordering::Release);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(report.clone());
        report
    }

    /// The top-level commands heatshield refuses whatever their arguments (MONITOR,
    /// DEBUG, ...: refused, and without a subcommand it accepts), lowercase.
    pub fn refused_names(&self) -> std::collections::HashSet<Vec<u8>> {
        let learned = self.learned.load();
        let refused = |c: &Command| {
            matches!(c.route, Route::Unsupported(_))
                && c.subs.values().all(|s| matches!(s.route, Route::Unsupported(_)))
                && !learned.subs.keys().any(|k| k.starts_with(c.name.as_bytes()) && k.get(c.name.len()) == Some(&b'|'))
        };
        let tops = self.list.iter().chain(learned.top.values().map(|c| &**c));
        tops.filter(|c| refused(c)).map(|c| c.lower.as_bytes().to_vec()).collect()
    }

    /// The subcommands heatshield refuses of commands it accepts otherwise, lowercase
    /// `parent|sub` (CLUSTER FAILOVER, CLIENT PAUSE, ...).
    pub fn refused_subs(&self) -> std::collections::HashSet<Vec<u8>> {
        let learned = self.learned.load();
        let tops = self.list.iter().chain(learned.top.values().map(|c| &**c));
        let subs = tops.flat_map(|c| c.subs.values()).chain(learned.subs.values().map(|c| &**c));
        subs.filter(|s| matches!(s.route, Route::Unsupported(_))).map(|s| s.lower.as_bytes().to_vec()).collect()
    }

    /// Every command and subcommand in ACL category `bit` ([`cat`]), lowercase
    /// (`parent|sub`), sorted: `ACL CAT <category>`. A command the servers describe
    /// counts with the categories they give it.
    pub fn in_category(&self, bit: u32) -> Vec<String> {
        let learned = self.learned.load();
        let mut all: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
        let tops = self.list.iter().chain(learned.top.values().map(|c| &**c));
        for c in tops {
            all.insert(&c.lower, c.acl);
            for s in c.subs.values() {
                all.insert(&s.lower, s.acl);
            }
        }
        for s in learned.subs.values() {
            all.insert(&s.lower, s.acl);
        }
        all.into_iter().filter(|(_, acl)| acl & bit != 0).map(|(n, _)| n.to_string()).collect()
    }

    /// Changes whenever the commands learned from the servers do (what
    /// [`CommandTable::every`] lists may then differ).
    pub fn generation(&self) -> u64 {
        self.learnings.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every command, by name, each followed by its subcommands (by name) with the index
    /// of their command: what ACL rules are described against
    /// (crate::services::acl::Perms::command_rules).
    pub fn every(&self) -> Vec<(&Command, Option<usize>)> {
        let learned = self.learned.load();
        let mut tops: Vec<&Command> = self.list.iter().chain(learned.top.values().map(|c| &**c)).collect();
        tops.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = Vec::new();
        for c in tops {
            let at = out.len();
            out.push((c, None));
            let mut subs: Vec<&Command> = c.subs.values().collect();
            subs.extend(
                learned
                    .subs
                    .values()
                    .filter(|s| s.name.split_once('|').is_some_and(|(p, _)| p == c.name))
                    .map(|s| &**s),
            );
            subs.sort_by(|a, b| a.name.cmp(&b.name));
            out.extend(subs.into_iter().map(|s| (s, Some(at))));
        }
        out
    }

    /// heatshield's own commands (PROXY, HOTKEYS and the lock commands): no server
    /// heatshield was tested with has them.
    pub fn own(&self) -> Vec<&Command> {
        let own = |c: &&Command| matches!(c.route, Route::Local(Local::Proxy | Local::Hotkeys) | Route::Lock(_));
        let mut own: Vec<&Command> = self.list.iter().filter(own).collect();
        own.sort_by(|a, b| a.name.cmp(&b.name));
        own
    }

    /// What the last [`CommandTable::learn`] did (`None`: nothing learned yet).
    pub fn learning(&self) -> Option<Learning> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The command for learned definition `def` (made once per definition).
    fn made(&self, def: &learned::Def, report: &mut Learning) -> Option<&'static Command> {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        let found = made.iter().find(|(d, _)| d == def).map(|(_, c)| *c);
        let c = match found {
            Some(c) => c,
            None if made.len() >= LEARNED_MAX => {
                report.refused.push(format!("{} (too many commands learned)", def.name));
                return None;
            }
            None => {
                let c: &'static Command = Box::leak(Box::new(self.learned_command(def)));
                made.push((def.clone(), c));
                c
            }
        };
        for c in std::iter::once(c).chain(c.subs.values()) {
            match c.route {
                Route::Unsupported(why) if !why.is_empty() => report.refused.push(format!("{} ({why})", c.name)),
                Route::Unsupported(_) => report.refused.push(c.name.clone()),
                _ => report.added.push(c.name.clone()),
            }
        }
        Some(c)
    }

    /// A command from a server's definition: routed by its key specs (or refused where
    /// heatshield cannot follow them); a command that may change its keys (the `write`
    /// flag or a writing key spec) counts as a write, so the hot-key cache forgets them.
    fn learned_command(&self, def: &learned::Def) -> Command {
        let subs = def
            .subs
            .iter()
            .map(|s| {
                let sub = s.name.rsplit_once('|').map_or(s.name.as_str(), |(_, n)| n);
                let mut c = self.learned_command(s);
                c.parent_acl = def.acl;
                (sub.as_bytes().to_vec(), c)
            })
            .collect();
        let mut fl = def.flags;
        if def.writes_keys() {
            fl |= flags::WRITE;
        }
        let keys = if !def.rules.is_empty() {
            KeySpec::Learned(Box::leak(Box::new(learned::KeyRules(def.rules.clone()))))
        } else if def.legacy.0 > 0 && !def.movable {
            let (first, last, step) = def.legacy;
            KeySpec::Range { first: first as u32, last, step: step.max(1) as u32 }
        } else {
            KeySpec::None
        };
        let route = if !def.keys_followable() {
            Route::Unsupported("its keys cannot be found from its key specs")
        } else if fl & flags::BLOCKING != 0
            && !matches!(route_of(&def.name, fl), Route::Unsupported(_) | Route::Local(_))
        {
            Route::Unsupported("heatshield does not know where its timeout is")
        } else {
            route_of(&def.name, fl)
        };
        let mut c = make(self.learned_id(&def.name), def.name.clone(), def.arity, fl, keys, route, subs);
        c.acl = def.acl;
        c.key_rules = def.rules.clone().into_boxed_slice();
        c.acl_at = key_at(&c.key_rules);
        c.acl_place = key_place(&c.key_rules);
        c
    }

    /// The id of learned command `name`: the same across learnings; past
    /// [`LEARNED_IDS`], the `unknown` id.
    fn learned_id(&self, name: &str) -> usize {
        let mut ids = self.learned_ids.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = ids.get(name) {
            return id;
        }
        let at = ids.len();
        if at >= LEARNED_IDS {
            return self.count;
        }
        let _ = self.learned_names[at].set(name.to_string());
        ids.insert(name.to_string(), self.base + at);
        self.base + at
    }

    /// Number of top-level commands.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Number of command ids (commands and subcommands).
    pub fn count(&self) -> usize {
        self.count
    }

    /// The full name (`GET`, `CLIENT|SETNAME`) of command `id` (`unknown` for a learned
    /// id not given yet).
    pub fn name_of(&self, id: usize) -> &str {
        match self.names.get(id) {
            Some(n) => n,
            None => id.checked_sub(self.base).and_then(|i| self.learned_names.get(i)?.get()).map_or("unknown", |n| n),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Whether command id `id` is a learned command's (not the generated table's).
    pub fn is_learned(&self, id: usize) -> bool {
        id >= self.base
    }

    /// Finds the command for a request, checking arity and resolving subcommands.
    pub fn lookup(&self, req: &Request) -> Result<&Command, LookupError> {
        let name = req.arg(0);
        // a name of up to 8 bytes in its own bucket: compared as one word (the byte loop of
        // a case-insensitive comparison cost about 40 instructions a request)
        let quick = match name.len() {
            1..=8 => match self.quick[quick_bucket(name, self.mult)] {
                QUICK_EMPTY | QUICK_SHARED => None,
                at => {
                    let c = &self.list[at as usize];
                    (c.word != 0 && c.name.len() == name.len() && ascii_lower(req.arg_word(0)) == c.word).then_some(c)
                }
            },
            _ => None,
        };
        let cmd = match quick.or_else(|| self.get(name)) {
            Some(c) => c,
            None => self.learned_top(name).ok_or_else(|| LookupError::Unknown(unknown_command_text(req)))?,
        };
        if cmd.has_subcommands() && req.argc() >= 2 {
            let sub = req.arg(1);
            let mut up = [0u8; 32];
            let sub_cmd = if sub.len() <= up.len() {
                up[..sub.len()].copy_from_slice(sub);
                up[..sub.len()].make_ascii_uppercase();
                cmd.subs.get(&up[..sub.len()]).or_else(|| self.learned_sub(cmd, &up[..sub.len()]))
            } else {
                None
            };
            let Some(sub_cmd) = sub_cmd else {
                return Err(LookupError::UnknownSub(crate::errors::unknown_subcommand(
                    &truncate_lossy(sub, 128),
                    &cmd.name,
                )));
            };
            if !sub_cmd.arity_ok(req.argc()) {
                return Err(LookupError::Arity(arity_text(&sub_cmd.lower)));
            }
            return Ok(sub_cmd);
        }
        if !cmd.arity_ok(req.argc()) {
            return Err(LookupError::Arity(arity_text(&cmd.lower)));
        }
        Ok(cmd)
    }

    /// A command learned from the servers, by name (any case).
    #[cold]
    #[inline(never)]
    fn learned_top(&self, name: &[u8]) -> Option<&'static Command> {
        let learned = self.learned.load();
        if learned.top.is_empty() || name.len() > 64 {
            return None;
        }
        learned.top.get(&name.to_ascii_uppercase()).copied()
    }

    /// A subcommand (`sub`, uppercase) of command `cmd` learned from the servers.
    #[cold]
    #[inline(never)]
    fn learned_sub(&self, cmd: &Command, sub: &[u8]) -> Option<&'static Command> {
        let learned = self.learned.load();
        if learned.subs.is_empty() {
            return None;
        }
        let mut full = Vec::with_capacity(cmd.name.len() + 1 + sub.len());
        full.extend_from_slice(cmd.name.as_bytes());
        full.push(b'|');
        full.extend_from_slice(sub);
        learned.subs.get(&full).copied()
    }

    /// Looks a top-level command up by name, case-insensitively, without allocating.
    #[inline]
    pub fn get(&self, name: &[u8]) -> Option<&Command> {
        const LONGEST: usize = 32;
        if name.is_empty() || name.len() > LONGEST {
            return None;
        }
        match self.quick[quick_bucket(name, self.mult)] {
            QUICK_EMPTY => return None,
            QUICK_SHARED => {}
            at => {
                // the only name in this bucket: it is this one, or none is
                let c = &self.list[at as usize];
                return c.name.as_bytes().eq_ignore_ascii_case(name).then_some(c);
            }
        }
        let mut up = [0u8; LONGEST];
        let up = &mut up[..name.len()];
        up.copy_from_slice(name);
        up.make_ascii_uppercase();
        self.by_name.get(&up[..]).map(|&at| &self.list[at as usize])
    }
}

/// Redis's text for a wrong number of arguments; for EXEC an EXECABORT (Redis discards
/// the transaction: see `crate::modes::transaction::exec_refused`).
fn arity_text(lower: &str) -> String {
    let text = crate::errors::wrong_arity(lower);
    if lower == "exec" {
        return crate::errors::exec_aborted_because(text.strip_prefix("ERR ").unwrap_or(&text));
    }
    text
}

fn truncate_lossy(b: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&b[..b.len().min(max)]).into_owned()
}

/// Redis's text for an unknown command.
fn unknown_command_text(req: &Request) -> String {
    let mut args = String::new();
    for i in 1..req.argc() {
        if args.len() >= 128 {
            break;
        }
        let room = 128 - args.len();
        args.push('\'');
        args.push_str(&truncate_lossy(req.arg(i), room));
        args.push_str("' ");
    }
    crate::errors::unknown_command(&truncate_lossy(req.arg(0), 128), &args)
}

fn build(raw: &'static RawSpec, parent: Option<&'static RawSpec>, next_id: &mut usize) -> Command {
    let name = match parent {
        Some(p) => format!("{}|{}", p.name, raw.name),
        None => raw.name.to_string(),
    };
    let id = *next_id;
    *next_id += 1;
    let subs = raw.subs.iter().map(|s| (s.name.as_bytes().to_vec(), build(s, Some(raw), next_id))).collect();
    let (keys, route) = (keyspec_of(&name, raw), route_of(&name, raw.flags));
    let mut c = make(id, name, raw.arity, raw.flags, keys, route, subs);
    c.acl = raw.acl;
    c.parent_acl = parent.map_or(0, |p| p.acl);
    c.key_rules = raw.specs.iter().map(rule_of).collect();
    c.acl_at = key_at(&c.key_rules);
    c.acl_place = key_place(&c.key_rules);
    c
}

/// A generated key spec as the learned ones are held.
fn rule_of(k: &RawKey) -> learned::KeyRule {
    use learned::{Begin, Find};
    let RawKey(fl, begin, find) = k;
    learned::KeyRule {
        begin: match begin {
            RawBegin::Index(i) => Begin::Index(*i),
            RawBegin::Keyword(w, from) => Begin::Keyword { keyword: w.as_bytes().to_vec(), from: *from },
            RawBegin::BeginUnknown => Begin::Unknown,
        },
        find: match find {
            RawFind::Range(last, step, limit) => Find::Range { last: *last, step: *step, limit: *limit },
            RawFind::KeyNum(at, first, step) => Find::KeyNum { at: *at, first: *first, step: *step },
            RawFind::FindUnknown => Find::Unknown,
        },
        not_key: fl & key::NOT_KEY != 0,
        incomplete: fl & key::INCOMPLETE != 0,
        write: fl & key::WRITES != 0,
        acl: fl & (key::ACCESS | key::CHANGE),
        variable: fl & key::VARIABLE != 0,
    }
}

/// Most commands: one key spec, one key at a fixed place (which a request may lack, being
/// too short): the place and what ACL checks the key for.
#[inline]
pub fn acl_key_at(cmd: &Command) -> Option<(u32, u8)> {
    cmd.acl_at
}

/// Where the one key of a command with one key at a fixed place is, whatever ACL checks
/// it for: [`acl_key_at`]'s place, and also that of a command whose arguments decide what
/// the key is checked for (SET with or without GET, BITFIELD's operations), which a
/// pattern allowing both reading and writing allows either way
/// (crate::services::acl::Perms::allows_quickly).
#[inline]
pub fn acl_key_place(cmd: &Command) -> Option<u32> {
    cmd.acl_place
}

/// [`acl_key_place`] from the key specs.
fn key_place(rules: &[learned::KeyRule]) -> Option<u32> {
    if let [r] = rules
        && let learned::Begin::Index(i) = r.begin
        && let learned::Find::Range { last: 0, .. } = r.find
        && !r.not_key
        && !r.incomplete
        && i > 0
    {
        return Some(i as u32);
    }
    None
}

/// [`acl_key_at`] from the key specs.
fn key_at(rules: &[learned::KeyRule]) -> Option<(u32, u8)> {
    // (the place's one spec, when its flags do not depend on the arguments)
    key_place(rules).filter(|_| !rules[0].variable).map(|i| (i, rules[0].acl))
}

/// The keys of `req` (as resolved to `cmd`) with what ACL checks each for
/// (`key::ACCESS`: read, `key::CHANGE`: write), in the order Redis checks them
/// (`getKeysFromCommandWithSpecs`): from the key specs where they find every key and
/// their flags are fixed, otherwise as Redis's own functions give them (SET and
/// BITFIELD by their arguments, SORT, MIGRATE).
pub fn acl_keys(cmd: &Command, req: &Request) -> SmallVec<[(u32, u8); 4]> {
    let mut out = SmallVec::new();
    let rules = &cmd.key_rules;
    if let Some((i, acl)) = acl_key_at(cmd) {
        if (i as usize) < req.argc() {
            out.push((i, acl));
        }
        return out;
    }
    if rules.iter().any(|r| !r.not_key) && rules.iter().all(|r| r.followable() && !r.variable) {
        // (a spec that does not fit leaves the command no keys to check, as on Redis: the
        // command then fails on its arguments)
        let mut found = SmallVec::new();
        learned::find_keys_strict(rules, req.argc(), |i| req.arg(i), &mut found);
        if let [r] = &rules[..] {
            // (one spec, most commands: its keys are all found)
            out.extend(found.iter().map(|&k| (k, r.acl)));
            return out;
        }
        if found.is_empty() {
            return out;
        }
        for r in rules.iter().filter(|r| !r.not_key) {
            found.clear();
            learned::find_keys_strict(std::slice::from_ref(r), req.argc(), |i| req.arg(i), &mut found);
            out.extend(found.iter().map(|&k| (k, r.acl)));
        }
        return out;
    }
    if !rules.is_empty() && rules.iter().all(|r| r.not_key) {
        // (SPUBLISH, SSUBSCRIBE: a shard channel, checked as a channel)
        return out;
    }
    let keys = keys_of(cmd, req).unwrap_or_default();
    let both = key::ACCESS | key::CHANGE;
    match cmd.name.as_str() {
        // Redis's setGetKeys: with GET it reads the old value too
        "SET" if keys.len() == 1 => {
            let get = (3..req.argc()).any(|i| req.arg(i).eq_ignore_ascii_case(b"GET"));
            out.push((keys[0], if get { both } else { key::CHANGE }));
        }
        // Redis's bitfieldGetKeys: only GETs (and OVERFLOWs) read, anything else writes
        "BITFIELD" if keys.len() == 1 => {
            let mut read_only = true;
            let mut i = 2;
            while i < req.argc() {
                let more = req.argc() - i - 1;
                let a = req.arg(i);
                if a.eq_ignore_ascii_case(b"GET") && more >= 2 {
                    i += 3;
                } else if a.eq_ignore_ascii_case(b"OVERFLOW") && more >= 1 {
                    i += 2;
                } else {
                    read_only = false;
                    break;
                }
            }
            out.push((keys[0], if read_only { key::ACCESS } else { both }));
        }
        // sortGetKeys: the key sorted is read, STORE's written
        "SORT" | "SORT_RO" => {
            out.extend(keys.iter().enumerate().map(|(i, &k)| (k, if i == 0 { key::ACCESS } else { key::CHANGE })))
        }
        _ => {
            // (MIGRATE's keys are read and deleted; a module's unfollowable specs: all
            // their flags at once)
            let mut fl = rules.iter().filter(|r| !r.not_key).fold(0, |a, r| a | r.acl);
            if rules.is_empty() {
                fl = if cmd.is_write() { both } else { key::ACCESS };
            }
            out.extend(keys.iter().map(|&k| (k, fl)));
        }
    }
    out
}

/// A command from its parts; `route` says what heatshield does with it.
fn make(id: usize, name: String, arity: i32, flags: u32, keys: KeySpec, route: Route, subs: Names) -> Command {
    let traits = traits::of(&name);
    let shared_lane = match route {
        // XREAD and XREADGROUP block with BLOCK
        Route::Forward => traits & traits::BLOCK_OPTION == 0,
        Route::Split(_) | Route::AnyMaster | Route::Unsupported(_) => true,
        Route::FanOut(f) => f != FanOut::Kill,
        // (PING takes connections of its own while a script runs: see crate::front::dispatch)
        // (and WAIT waits for the client's requests in flight: see crate::services::wait)
        Route::Local(l) => !matches!(l, Local::Reset | Local::Ping | Local::Wait | Local::WaitAof),
        Route::Lock(_) | Route::Transaction(_) | Route::Block | Route::Subscribe(..) => false,
    };
    Command {
        id,
        lower: name.to_ascii_lowercase(),
        arity: AtomicI32::new(arity),
        built_arity: arity,
        flags,
        acl: 0,
        parent_acl: 0,
        keys,
        key_rules: Box::default(),
        acl_at: None,
        acl_place: None,
        route,
        shared_lane,
        traits,
        names: NamesInReply::of(&name),
        word: lower_word(name.as_bytes()),
        name,
        subs,
    }
}

/// `name` lowercased as a little-endian word if it has at most 8 bytes; 0 otherwise.
fn lower_word(name: &[u8]) -> u64 {
    if name.is_empty() || name.len() > 8 {
        return 0;
    }
    let mut b = [0u8; 8];
    b[..name.len()].copy_from_slice(name);
    ascii_lower(u64::from_le_bytes(b))
}

/// The bytes of `x` with ASCII upper-case letters lowered, all at once (no byte loop).
#[inline(always)]
fn ascii_lower(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = ONES * 0x80;
    let low7 = x & !HIGH;
    // high bit set where a byte (its low 7 bits) is at least 'A', and where it is past 'Z'
    let at_least_a = low7 + ONES * (0x80 - b'A' as u64);
    let past_z = low7 + ONES * (0x80 - b'Z' as u64 - 1);
    let upper = at_least_a & !past_z & !x & HIGH;
    x | (upper >> 2)
}

fn keyspec_of(name: &str, raw: &RawSpec) -> KeySpec {
    match name {
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" | "FCALL" | "FCALL_RO" => KeySpec::SCRIPT,
        "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE" => KeySpec::NumKeys { dest: Some(1), at: 2 },
        "ZUNION" | "ZINTER" | "ZDIFF" | "ZINTERCARD" | "SINTERCARD" | "LMPOP" | "ZMPOP" => {
            KeySpec::NumKeys { dest: None, at: 1 }
        }
        "BLMPOP" | "BZMPOP" => KeySpec::NumKeys { dest: None, at: 2 },
        "XREAD" | "XREADGROUP" => KeySpec::Streams,
        "SORT" | "SORT_RO" => KeySpec::Sort,
        "GEORADIUS" | "GEORADIUSBYMEMBER" => KeySpec::GeoStore,
        _ if raw.first > 0 => KeySpec::Range { first: raw.first as u32, last: raw.last, step: raw.step.max(1) as u32 },
        _ => KeySpec::None,
    }
}

/// The routing overlay: what heatshield does with each command.
pub fn route_of(name: &str, fl: u32) -> Route {
    use Route::*;
    match name {
        "PING" => Local(self::Local::Ping),
        "PROXY" => Local(self::Local::Proxy),
        "HOTKEYS" => Local(self::Local::Hotkeys),
        "ACL|WHOAMI" | "ACL|CAT" | "ACL|USERS" | "ACL|LIST" | "ACL|SETUSER" | "ACL|DELUSER" | "ACL|GETUSER"
        | "ACL|DRYRUN" | "ACL|LOG" | "ACL|GENPASS" => Local(self::Local::Acl),
        "LOCK.ACQUIRE" => Lock(LockCmd::Acquire),
        "LOCK.RELEASE" => Lock(LockCmd::Release),
        "LOCK.EXTEND" => Lock(LockCmd::Extend),
        "LOCK.INFO" => Lock(LockCmd::Info),
        "ECHO" => Local(self::Local::Echo),
        "QUIT" => Local(self::Local::Quit),
        "SELECT" => Local(self::Local::Select),
        "HELLO" => Local(self::Local::Hello),
        "AUTH" => Local(self::Local::Auth),
        "TIME" => Local(self::Local::Time),
        "INFO" => Local(self::Local::Info),
        "RESET" => Local(self::Local::Reset),
        "READONLY" | "READWRITE" => Local(self::Local::Ok),
        "CLIENT|SETNAME"
        | "CLIENT|GETNAME"
        | "CLIENT|ID"
        | "CLIENT|SETINFO"
        | "CLIENT|INFO"
        | "CLIENT|LIST"
        | "CLIENT|KILL"
        | "CLIENT|REPLY"
        | "CLIENT|UNBLOCK"
        | "CLIENT|NO-EVICT"
        | "CLIENT|NO-TOUCH"
        | "CLIENT|TRACKING"
        | "CLIENT|CACHING"
        | "CLIENT|GETREDIR"
        | "CLIENT|TRACKINGINFO"
        | "CLIENT|CAPA" => Local(self::Local::Client),
        "MGET" => Split(self::Split::Mget),
        "MSET" => Split(self::Split::Mset),
        "DEL" | "UNLINK" | "EXISTS" | "TOUCH" => Split(self::Split::Sum),
        // the masters' arrays concatenated (LATENCY LATEST: every master's latency events)
        "KEYS" | "LATENCY|LATEST" => FanOut(self::FanOut::Keys),
        "SCAN" => FanOut(self::FanOut::Scan),
        "RANDOMKEY" => FanOut(self::FanOut::RandomKey),
        "DBSIZE" => FanOut(self::FanOut::Dbsize),
        "FLUSHALL" | "FLUSHDB" => FanOut(self::FanOut::Flush),
        "SCRIPT|LOAD" | "SCRIPT|FLUSH" | "FUNCTION|LOAD" | "FUNCTION|DELETE" | "FUNCTION|FLUSH"
        | "FUNCTION|RESTORE" => FanOut(self::FanOut::AllSame),
        "SCRIPT|EXISTS" => FanOut(self::FanOut::ScriptExists),
        "SCRIPT|KILL" | "FUNCTION|KILL" | "FUNCTION|STATS" => FanOut(self::FanOut::Kill),
        "COMMAND" | "COMMAND|COUNT" | "COMMAND|INFO" | "COMMAND|LIST" | "COMMAND|DOCS" => {
            FanOut(self::FanOut::Commands)
        }
        n if n.starts_with("COMMAND|") => AnyMaster,
        "FUNCTION|LIST" | "FUNCTION|DUMP" => AnyMaster,
        "MULTI" => Transaction(TxCmd::Multi),
        "EXEC" => Transaction(TxCmd::Exec),
        "DISCARD" => Transaction(TxCmd::Discard),
        "WATCH" => Transaction(TxCmd::Watch),
        "UNWATCH" => Transaction(TxCmd::Unwatch),
        "MONITOR" => Unsupported(""),
        // (MOVE goes to its key's master, which has the databases or says it has not)
        "SWAPDB" => Unsupported("each master would swap its databases at its own moment"),
        "WAIT" => Local(self::Local::Wait),
        "WAITAOF" => Local(self::Local::WaitAof),
        // Valkey 9: a scan of one slot at a time, on the node that owns it
        "CLUSTERSCAN" => Unsupported("heatshield is one node to its clients: SCAN covers every master"),
        "MIGRATE" | "ASKING" => Unsupported("cluster administration is not supported"),
        "SLOWLOG|GET" | "COMMANDLOG|GET" => FanOut(self::FanOut::Log),
        "SLOWLOG|LEN" | "COMMANDLOG|LEN" => FanOut(self::FanOut::Dbsize),
        "SLOWLOG|RESET" | "COMMANDLOG|RESET" => FanOut(self::FanOut::LogReset),
        "CLUSTER|SLOT-STATS" => FanOut(self::FanOut::SlotStats),
        "CLUSTER|INFO"
        | "CLUSTER|MYID"
        | "CLUSTER|MYSHARDID"
        | "CLUSTER|SLOTS"
        | "CLUSTER|SHARDS"
        | "CLUSTER|NODES"
        | "CLUSTER|KEYSLOT"
        | "CLUSTER|COUNTKEYSINSLOT"
        | "CLUSTER|GETKEYSINSLOT" => Local(self::Local::Cluster),
        "CONFIG|GET" | "CONFIG|SET" | "CONFIG|RESETSTAT" | "CONFIG|REWRITE" => Local(self::Local::Config),
        n if n.starts_with("CLUSTER") => Unsupported("cluster administration is not supported"),
        n if n.starts_with("CLIENT|") => Unsupported("backend connections are shared between clients"),
        "XREAD" | "XREADGROUP" => Forward, // Block at run time when BLOCK is given
        "SUBSCRIBE" => Subscribe(ChannelKind::Channel, true),
        "PSUBSCRIBE" => Subscribe(ChannelKind::Pattern, true),
        "SSUBSCRIBE" => Subscribe(ChannelKind::Shard, true),
        "UNSUBSCRIBE" => Subscribe(ChannelKind::Channel, false),
        "PUNSUBSCRIBE" => Subscribe(ChannelKind::Pattern, false),
        "SUNSUBSCRIBE" => Subscribe(ChannelKind::Shard, false),
        "PUBLISH" | "SPUBLISH" => Forward,
        "PUBSUB|CHANNELS" | "PUBSUB|SHARDCHANNELS" => FanOut(self::FanOut::Channels),
        "PUBSUB|NUMSUB" => FanOut(self::FanOut::NumSub(ChannelKind::Channel)),
        "PUBSUB|SHARDNUMSUB" => FanOut(self::FanOut::NumSub(ChannelKind::Shard)),
        "PUBSUB|NUMPAT" => FanOut(self::FanOut::NumPat),
        _ if fl & flags::PUBSUB != 0 => Unsupported(""),
        _ if fl & flags::BLOCKING != 0 => Block,
        _ if fl & flags::ADMIN != 0 => Unsupported("administrative commands are not forwarded"),
        _ => Forward,
    }
}

/// Positions of the keys of `req` (as resolved to `cmd`). Malformed numkeys give an error
/// text in Redis's words.
#[inline]
pub fn keys_of(cmd: &Command, req: &Request) -> Result<SmallVec<[u32; 4]>, &'static str> {
    // one key at a fixed place (GET, SET, INCR, ...): the usual case, without the loop
    if let KeySpec::Range { first, last, .. } = cmd.keys
        && first as i64 == last as i64
        && first > 0
    {
        let mut out = SmallVec::new();
        if (first as usize) < req.argc() {
            out.push(first);
        }
        return Ok(out);
    }
    keys_in(cmd, req)
}

/// [`keys_of`] for the other key specifications.
fn keys_in(cmd: &Command, req: &Request) -> Result<SmallVec<[u32; 4]>, &'static str> {
    let argc = req.argc() as i64;
    let mut out = SmallVec::new();
    match cmd.keys {
        KeySpec::None => {}
        KeySpec::Range { first, last, step } => {
            let last = if last < 0 { argc + last as i64 } else { (last as i64).min(argc - 1) };
            let mut i = first as i64;
            // (room for every key at once: an MSET of 10 keys grew the vector twice)
            if last >= i {
                out.reserve(((last - i) / (step as i64).max(1) + 1) as usize);
            }
            while i <= last {
                out.push(i as u32);
                i += step as i64;
            }
        }
        KeySpec::NumKeys { dest, at } => {
            if let Some(d) = dest {
                out.push(d);
            }
            let n = crate::protocol::request::parse_i64(req.arg(at as usize));
            // the MPOP commands need one more argument after the keys (LEFT/RIGHT, MIN/MAX)
            let after = if matches!(cmd.name.as_str(), "LMPOP" | "BLMPOP" | "ZMPOP" | "BZMPOP") { 1 } else { 0 };
            let bad = match n {
                None => Some(NumKeys::NotInteger),
                Some(n) if n < 0 => Some(NumKeys::Negative),
                Some(n) if n > argc - at as i64 - 1 - after => Some(NumKeys::TooMany),
                Some(0) => Some(NumKeys::Zero),
                _ => None,
            };
            if bad.is_some() && matches!(cmd.name.as_str(), "FCALL" | "FCALL_RO" | "EVALSHA" | "EVALSHA_RO") {
                // Redis looks the function or script up first ("Function not found",
                // NOSCRIPT): a master answers, and with a bad numkeys nothing runs there
                return Ok(out);
            }
            if let Some(bad) = bad
                && let Some(e) = numkeys_error(&cmd.name, bad)
            {
                return Err(e);
            }
            let n = n.unwrap_or(0).max(0);
            out.reserve(n as usize);
            for i in 0..n {
                out.push(at + 1 + i as u32);
            }
        }
        KeySpec::Streams => {
            // Redis's key spec: the keyword search starts after `GROUP group consumer` for
            // XREADGROUP (a consumer may be named STREAMS), at the first argument for XREAD
            let from = if cmd.name == "XREADGROUP" { 4 } else { 1 };
            let pos = (from..req.argc()).find(|&i| req.arg(i).eq_ignore_ascii_case(b"STREAMS"));
            let Some(pos) = pos else { return Err(crate::errors::SYNTAX) };
            let rest = req.argc() - pos - 1;
            if rest == 0 || !rest.is_multiple_of(2) {
                return Err(crate::errors::UNBALANCED_STREAMS);
            }
            for i in 0..rest / 2 {
                out.push((pos + 1 + i) as u32);
            }
        }
        KeySpec::Sort => {
            // Redis's sortGetKeys: LIMIT's two arguments, GET's and BY's one are skipped
            // (a pattern named STORE is not a destination); the last STORE names it.
            // SORT_RO has no destination.
            out.push(1);
            let mut store = None;
            let mut i = 2;
            while cmd.name == "SORT" && i < req.argc() {
                let a = req.arg(i);
                if a.eq_ignore_ascii_case(b"LIMIT") {
                    i += 2;
                } else if a.eq_ignore_ascii_case(b"GET") || a.eq_ignore_ascii_case(b"BY") {
                    i += 1;
                } else if a.eq_ignore_ascii_case(b"STORE") && i + 1 < req.argc() {
                    store = Some(i as u32 + 1);
                }
                i += 1;
            }
            out.extend(store);
        }
        KeySpec::Learned(rules) => learned::find_keys(&rules.0, req.argc(), |i| req.arg(i), &mut out),
        KeySpec::GeoStore => {
            out.push(1);
            let words: &[&[u8]] = &[b"STORE", b"STOREDIST"];
            let mut i = 2;
            while i + 1 < req.argc() {
                if words.iter().any(|w| req.arg(i).eq_ignore_ascii_case(w)) {
                    out.push(i as u32 + 1);
                    i += 1;
                }
                i += 1;
            }
        }
    }
    Ok(out)
}

/// [`keys_of`] for a client's command as it enters (admission, a queued transaction,
/// WATCH): the fleet's keys are heatshield's own, so a command naming one is refused (a
/// forged report would steer every instance's rate limits). Once, where a command
/// enters; the later [`keys_of`] calls need not look again. (Inlined: out of line, the
/// result's copy in and out cost about 70 instructions a request.)
#[inline(always)]
pub fn checked_keys_of(cmd: &Command, req: &Request) -> Result<SmallVec<[u32; 4]>, &'static str> {
    let out = keys_of(cmd, req)?;
    for &k in &out {
        if reserved(req.arg(k as usize)) {
            return Err(crate::errors::RESERVED_KEY);
        }
    }
    Ok(out)
}

/// Whether an argument of `req` is `BLOCK` (XREAD, XREADGROUP).
#[inline(never)]
fn has_block(req: &Request) -> bool {
    req.args().any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
}

/// The prefix of the keys heatshield keeps in the cluster for itself (docs/fleet.md).
pub const RESERVED_PREFIX: &[u8] = b"{heatshield:";

/// Whether `key` is one of heatshield's own (one byte compared for almost every key).
#[inline]
pub fn reserved(key: &[u8]) -> bool {
    key.first() == Some(&b'{') && key.starts_with(RESERVED_PREFIX)
}

/// What is wrong with a command's `numkeys` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NumKeys {
    NotInteger,
    Negative,
    Zero,
    TooMany,
}

/// The error Redis 7.0 answers for a bad `numkeys`, which differs by command family
/// (each checks its own arguments); `None` where the value is acceptable (EVAL's 0).
fn numkeys_error(name: &str, bad: NumKeys) -> Option<&'static str> {
    use crate::errors::{NOT_AN_INTEGER, NUMKEYS_NEGATIVE, NUMKEYS_TOO_MANY, NUMKEYS_ZERO, SYNTAX};
    let at_least_one = || crate::errors::at_least_one_key(name);
    Some(match (name, bad) {
        // numkeys parsed as a count of at least 1; a count past the arguments leaves
        // no LEFT/RIGHT (MIN/MAX) where one must be
        ("LMPOP" | "BLMPOP" | "ZMPOP" | "BZMPOP", NumKeys::TooMany) => SYNTAX,
        ("SINTERCARD", NumKeys::TooMany) => NUMKEYS_TOO_MANY,
        ("LMPOP" | "BLMPOP" | "ZMPOP" | "BZMPOP" | "SINTERCARD", _) => NUMKEYS_ZERO,
        (
            "ZUNION" | "ZINTER" | "ZDIFF" | "ZINTERCARD" | "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE",
            NumKeys::NotInteger,
        ) => NOT_AN_INTEGER,
        (
            "ZUNION" | "ZINTER" | "ZDIFF" | "ZINTERCARD" | "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE",
            NumKeys::TooMany,
        ) => SYNTAX,
        ("ZUNION" | "ZINTER" | "ZDIFF" | "ZINTERCARD" | "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE", _) => {
            at_least_one()
        }
        // EVAL, EVALSHA, FCALL and the rest
        (_, NumKeys::NotInteger) => NOT_AN_INTEGER,
        (_, NumKeys::Negative) => NUMKEYS_NEGATIVE,
        (_, NumKeys::TooMany) => NUMKEYS_TOO_MANY,
        (_, NumKeys::Zero) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_is_lowered_as_its_bytes() {
        for b in 0..=255u8 {
            let w = u64::from_le_bytes([b, b'G', 0xC7, b'z', b'@', b'[', b'`', b'{']);
            let want = u64::from_le_bytes([b.to_ascii_lowercase(), b'g', 0xC7, b'z', b'@', b'[', b'`', b'{']);
            assert_eq!(ascii_lower(w), want, "{b}");
        }
        let t = CommandTable::new();
        for name in ["get", "GET", "GeT", "lock.info", "LOCK.INFO", "ping"] {
            let r = crate::protocol::Request::from_args(&[name, "k"]);
            assert!(t.lookup(&r).is_ok_and(|c| c.name.eq_ignore_ascii_case(name)), "{name}");
        }
        let r = crate::protocol::Request::from_args(&["gEx", "k"]);
        assert!(t.lookup(&r).is_err() || t.lookup(&r).is_ok_and(|c| c.name == "GEX"));
        // (a byte 0x20 from a non-letter is not that character: only letters fold)
        let r = crate::protocol::Request::from_args(&["LOCK\x0eINFO", "k"]);
        assert!(t.lookup(&r).is_err());
    }

    #[test]
    fn acl_categories_are_redis_s_and_heatshield_s_own() {
        let t = CommandTable::new();
        let acl = |n: &str| t.get(n.as_bytes()).map(|c| c.acl).unwrap();
        assert_eq!(acl("GET"), cat::READ | cat::STRING | cat::FAST);
        assert_eq!(acl("SET"), cat::WRITE | cat::STRING | cat::SLOW);
        assert_eq!(acl("FLUSHALL"), cat::KEYSPACE | cat::WRITE | cat::SLOW | cat::DANGEROUS);
        assert_eq!(acl("PROXY") & cat::PROXY, cat::PROXY);
        assert_eq!(acl("LOCK.ACQUIRE") & (cat::LOCK | cat::WRITE), cat::LOCK | cat::WRITE);
        assert_eq!(cat::of(b"SortedSet"), Some(cat::SORTEDSET));
        assert_eq!(cat::of(b"lock"), Some(cat::LOCK));
        assert_eq!(cat::of(b"nope"), None);
        // every command of the generated table has at least one category
        for c in t.list.iter() {
            assert!(c.acl != 0 || c.subs.values().all(|s| s.acl != 0), "{} has no category", c.name);
        }
    }

    fn req(args: &[&str]) -> Request {
        Request::from_args(args)
    }

    #[test]
    fn every_command_is_found_in_any_case_and_near_names_are_not() {
        let t = CommandTable::new();
        let mut shared = 0;
        for (name, &at) in &t.by_name {
            let c = &t.list[at as usize];
            let text = std::str::from_utf8(name).unwrap();
            for form in [text.to_string(), text.to_lowercase(), text[..1].to_lowercase() + &text[1..]] {
                assert_eq!(t.get(form.as_bytes()).map(|c| c.id), Some(c.id), "{form}");
            }
            // one byte changed, a byte more or less: another command or none, never this one
            let mut other = name.clone();
            let last = other.len() - 1;
            other[last] ^= 0x01;
            assert_ne!(t.get(&other).map(|c| c.id), Some(c.id), "{text}");
            assert_ne!(t.get(&name[..last]).map(|c| c.id), Some(c.id), "{text}");
            if t.quick[quick_bucket(name, t.mult)] == QUICK_SHARED {
                shared += 1;
            }
        }
        for junk in [&b""[..], b"x", b"GETT", b"\xff\x00", b"0123456789012345678901234567890123"] {
            assert!(t.get(junk).is_none());
        }
        // the commonest ones take the quick path
        for name in COMMON {
            assert_ne!(t.quick[quick_bucket(name.as_bytes(), t.mult)], QUICK_SHARED, "{name}");
        }
        eprintln!("{shared} of {} command names share a quick bucket", t.by_name.len());
        assert!(shared * 8 < t.by_name.len(), "{shared} of {} share a bucket", t.by_name.len());
    }

    #[test]
    fn a_learned_key_spec_keeps_every_command_as_small() {
        // (KeySpec is copied on every request's key lookup)
        assert!(std::mem::size_of::<KeySpec>() <= 16, "{}", std::mem::size_of::<KeySpec>());
    }

    #[test]
    fn lookup_and_arity() {
        let t = CommandTable::new();
        assert!(t.len() > 200);
        assert!(t.count() > t.len());
        let get = t.get(b"GET").unwrap();
        assert_eq!(t.name_of(get.id), "GET");
        let setinfo = t.lookup(&req(&["client", "setinfo", "lib-ver", "1"])).unwrap();
        assert_eq!(t.name_of(setinfo.id), "CLIENT|SETINFO");
        let c = t.lookup(&req(&["get", "k"])).unwrap();
        assert_eq!(c.name, "GET");
        assert_eq!(c.route, Route::Forward);
        assert!(c.is_readonly());
        assert_eq!(
            t.lookup(&req(&["GET"])).unwrap_err(),
            LookupError::Arity("ERR wrong number of arguments for 'get' command".into())
        );
        assert_eq!(
            t.lookup(&req(&["nosuch", "a", "b"])).unwrap_err().message(),
            "ERR unknown command 'nosuch', with args beginning with: 'a' 'b' "
        );
        let c = t.lookup(&req(&["client", "setinfo", "lib-name", "x"])).unwrap();
        assert_eq!(c.route, Route::Local(Local::Client));
        let c = t.lookup(&req(&["client", "setname", "x"])).unwrap();
        assert_eq!(c.route, Route::Local(Local::Client));
        assert_eq!(
            t.lookup(&req(&["client", "bogus"])).unwrap_err().message(),
            "ERR unknown subcommand 'bogus'. Try CLIENT HELP."
        );
        assert_eq!(
            t.lookup(&req(&["client", "setname"])).unwrap_err().message(),
            "ERR wrong number of arguments for 'client|setname' command"
        );
        assert_eq!(t.lookup(&req(&["command"])).unwrap().route, Route::FanOut(FanOut::Commands));
        assert_eq!(t.lookup(&req(&["command", "getkeys", "get", "k"])).unwrap().route, Route::AnyMaster);
    }

    #[test]
    fn routes() {
        let t = CommandTable::new();
        let r = |a: &[&str]| t.lookup(&req(a)).unwrap().route;
        assert_eq!(r(&["MGET", "a", "b"]), Route::Split(Split::Mget));
        assert_eq!(r(&["del", "a"]), Route::Split(Split::Sum));
        assert_eq!(r(&["keys", "*"]), Route::FanOut(FanOut::Keys));
        assert_eq!(r(&["script", "load", "x"]), Route::FanOut(FanOut::AllSame));
        assert_eq!(r(&["blpop", "a", "0"]), Route::Block);
        assert!(matches!(r(&["subscribe", "a"]), Route::Subscribe(ChannelKind::Channel, true)));
        assert_eq!(r(&["multi"]), Route::Transaction(TxCmd::Multi));
        assert_eq!(r(&["watch", "k"]), Route::Transaction(TxCmd::Watch));
        assert_eq!(r(&["blpop", "k", "0"]), Route::Block);
        assert_eq!(r(&["bzmpop", "1", "1", "k", "MIN"]), Route::Block);
        assert_eq!(r(&["config", "get", "x"]), Route::Local(Local::Config));
        assert!(matches!(r(&["debug", "sleep", "0"]), Route::Unsupported(_)));
        assert_eq!(r(&["latency", "latest"]), Route::FanOut(FanOut::Keys));
        assert_eq!(r(&["msetnx", "a", "1"]), Route::Forward);
        assert!(t.lookup(&req(&["eval", "s", "0"])).unwrap().is_write());
        assert!(t.lookup(&req(&["set", "a", "b"])).unwrap().is_write());
    }

    #[test]
    fn every_movable_key_command_is_understood() {
        // Commands whose keys first/last/step cannot describe must have their own key spec,
        // or be refused; otherwise routing would look at the wrong argument.
        fn check(raw: &RawSpec, t: &CommandTable) {
            let c = t.get(raw.name.as_bytes());
            if raw.movable
                && let Some(c) = c
            {
                let special = !matches!(c.keys, KeySpec::Range { .. } | KeySpec::None);
                assert!(special || matches!(c.route, Route::Unsupported(_)), "{} has movable keys", raw.name);
            }
        }
        let t = CommandTable::new();
        for raw in generated::REDIS_COMMANDS {
            check(raw, &t);
        }
    }

    #[test]
    fn key_positions() {
        let t = CommandTable::new();
        let k = |a: &[&str]| {
            let r = req(a);
            keys_of(t.lookup(&r).unwrap(), &r).map(|v| v.to_vec())
        };
        assert_eq!(k(&["GET", "a"]), Ok(vec![1]));
        assert_eq!(k(&["MSET", "a", "1", "b", "2"]), Ok(vec![1, 3]));
        assert_eq!(k(&["MGET", "a", "b", "c"]), Ok(vec![1, 2, 3]));
        assert_eq!(k(&["EVAL", "s", "2", "a", "b", "x"]), Ok(vec![3, 4]));
        assert_eq!(k(&["EVAL", "s", "0"]), Ok(vec![]));
        assert_eq!(k(&["EVAL", "s", "3", "a"]), Err("ERR Number of keys can't be greater than number of args"));
        assert_eq!(k(&["EVAL", "s", "x"]), Err("ERR value is not an integer or out of range"));
        assert_eq!(k(&["ZUNIONSTORE", "d", "2", "a", "b", "WEIGHTS", "1", "2"]), Ok(vec![1, 3, 4]));
        assert_eq!(k(&["XREAD", "COUNT", "1", "STREAMS", "a", "b", "0", "0"]), Ok(vec![4, 5]));
        // a consumer named STREAMS (Redis: the search starts after GROUP group consumer)
        assert_eq!(k(&["XREADGROUP", "GROUP", "g", "STREAMS", "COUNT", "1", "STREAMS", "s", ">"]), Ok(vec![7]));
        assert_eq!(k(&["SORT", "a", "LIMIT", "0", "1", "STORE", "d"]), Ok(vec![1, 6]));
        // the word after BY or GET is a pattern, even STORE; the last STORE names the key
        assert_eq!(k(&["SORT", "a", "BY", "STORE", "ALPHA"]), Ok(vec![1]));
        assert_eq!(k(&["SORT", "a", "GET", "STORE", "STORE", "d"]), Ok(vec![1, 5]));
        assert_eq!(k(&["SORT", "a", "STORE", "d", "STORE", "e"]), Ok(vec![1, 5]));
        assert_eq!(k(&["SORT", "a", "LIMIT", "STORE", "x", "ALPHA"]), Ok(vec![1]));
        assert_eq!(k(&["SORT_RO", "a", "STORE", "d"]), Ok(vec![1]));
        assert_eq!(k(&["OBJECT", "ENCODING", "a"]), Ok(vec![2]));
        assert_eq!(k(&["BITOP", "AND", "d", "a", "b"]), Ok(vec![2, 3, 4]));
        assert_eq!(k(&["PING"]), Ok(vec![]));
    }
}

#[cfg(test)]
mod trait_tests {
    use super::*;

    #[test]
    fn traits_are_decided_once_by_name() {
        let t = CommandTable::new();
        let has = |name: &str, tr: u16| t.get(name.as_bytes()).unwrap().has(tr);
        assert!(has("EVAL", traits::MAY_WRITE) && t.get(b"EVAL").unwrap().is_write());
        assert!(!t.get(b"EVAL_RO").unwrap().is_write());
        assert!(has("XREAD", traits::BLOCK_OPTION) && t.get(b"XREAD").unwrap().is_blocking());
        assert!(has("BLMPOP", traits::TIMEOUT_FIRST) && has("BLMOVE", traits::NIL_STRING_ON_TIMEOUT));
        assert!(has("SPUBLISH", traits::PUBLISH) && has("SPUBLISH", traits::SHARD) && !has("PUBLISH", traits::SHARD));
        assert!(has("EVALSHA_RO", traits::BY_DIGEST) && has("TTL", traits::VOLATILE));
        assert!(t.get(b"OBJECT").unwrap().sub(b"FREQ").unwrap().has(traits::VOLATILE));
        assert_eq!(t.get(b"GET").unwrap().traits, 0);
        let xread = Request::from_args(&["XREAD", "BLOCK", "10", "STREAMS", "s", "$"]);
        assert!(t.get(b"XREAD").unwrap().blocks_with(&xread));
        assert!(!t.get(b"XREAD").unwrap().blocks_with(&Request::from_args(&["XREAD", "STREAMS", "s", "$"])));
    }
}
