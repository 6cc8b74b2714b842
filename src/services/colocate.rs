//! Key colocation (docs/colocation.md): rules that give every key of one family one hash
//! tag, so a framework written for one Redis (rq, celery, bullmq, lock libraries) runs
//! its multi-key commands, transactions and scripts on a cluster unchanged.
//!
//! A rule names key patterns and a tag: fixed (`rq:*` → `rq`) or made of what the
//! patterns' `*`s matched (`lock:*` and `lock-signal:*` with tag `$1`: a lock and its
//! signal share a slot, different locks spread over the cluster). A matching key `K` is
//! stored as `{T}K`: the tag first, so a script that builds names from `KEYS[1]` plus a
//! suffix keeps it. The rewrite is a function of the name alone, and so is its inverse
//! ([`Colocate::client_name`]): a stored name is shown as the client's when rewriting
//! that client name gives it back, so nothing needs remembering.
//!
//! Owns the rules (swapped whole when `PROXY COLOCATE` changes them), the rewrite of a
//! request's keys on the way in, and of the key names in replies and pushes on the way out.
//! A key that carries a hash tag already, or matches no rule, is left alone; values never
//! change. With no rules, one relaxed load a request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::command::{Command, NamesInReply, keys_of};
use crate::protocol::Request;
use crate::protocol::reply::reply_len;
use crate::protocol::request::write_bulk;

/// Rules at most (a rule's candidates are a bit in a 64-bit mask).
pub const MAX_RULES: usize = 64;
/// Patterns a rule may have, and `*`s a pattern may have.
const MAX_PATTERNS: usize = 16;
const MAX_STARS: usize = 8;

/// One `[[colocate]]` table: the keys matching any of `keys` get the hash tag `tag`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub name: String,
    /// Glob patterns of `*`, `?` and plain characters.
    pub keys: Vec<String>,
    /// The tag: plain text, with `$1`, `$2`, ... standing for what the pattern's first,
    /// second, ... `*` matched.
    pub tag: String,
}

#[derive(Debug)]
struct Pattern {
    /// The pattern split at its `*`s (a `?` in a segment matches any one byte).
    segs: Vec<Vec<u8>>,
    /// What every key it matches starts with (up to its first `*` or `?`).
    prefix: Vec<u8>,
    /// Its first 8 bytes as one word, and the mask of those it has (a quick look).
    head: (u64, u64),
}

/// The first 8 bytes of `b` (zeros after its end) as one word.
#[inline]
fn head8(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = b.len().min(8);
    w[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(w)
}

#[derive(Debug, Clone, PartialEq)]
enum TagPart {
    Text(Vec<u8>),
    Star(usize),
}

#[derive(Debug)]
pub struct Rule {
    pub spec: RuleConfig,
    pats: Vec<Pattern>,
    tag: Vec<TagPart>,
}

/// The rules in force, with the ones a key's first byte may match.
#[derive(Debug)]
pub struct Rules {
    pub list: Vec<Rule>,
    by_first: Box<[u64; 256]>,
    /// The Lua put before a script's body ([`Rules::shim`]).
    prologue: String,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { list: Vec::new(), by_first: Box::new([0; 256]), prologue: String::new() }
    }
}

/// Checks and prepares rules; every problem is reported, naming the rule.
pub fn compile(specs: &[RuleConfig]) -> Result<Rules, Vec<String>> {
    let mut problems = Vec::new();
    if specs.len() > MAX_RULES {
        problems.push(format!("colocate: at most {MAX_RULES} rules"));
    }
    let mut list = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        let at =
            if s.name.is_empty() { format!("colocate rule {}", i + 1) } else { format!("colocate rule {:?}", s.name) };
        if s.name.is_empty() || s.name.bytes().any(|b| b.is_ascii_whitespace()) {
            problems.push(format!("{at}: a name without spaces is needed"));
        }
        if specs[..i].iter().any(|o| o.name == s.name) {
            problems.push(format!("{at}: the name is used twice"));
        }
        if s.keys.is_empty() || s.keys.len() > MAX_PATTERNS {
            problems.push(format!("{at}: keys needs 1 to {MAX_PATTERNS} patterns"));
        }
        let mut pats = Vec::new();
        for k in &s.keys {
            let b = k.as_bytes();
            if b.is_empty() || b.iter().any(|c| matches!(c, b'[' | b']' | b'\\' | b'{' | b'}')) {
                problems.push(format!("{at}: pattern {k:?} may hold only plain characters, * and ? (no [ ] \\ {{ }})"));
                continue;
            }
            let segs: Vec<Vec<u8>> = b.split(|&c| c == b'*').map(<[u8]>::to_vec).collect();
            if segs.len() - 1 > MAX_STARS {
                problems.push(format!("{at}: pattern {k:?} has more than {MAX_STARS} *"));
                continue;
            }
            let prefix: Vec<u8> = segs[0].iter().take_while(|&&c| c != b'?').copied().collect();
            let n = prefix.len().min(8);
            let mask = if n == 8 { u64::MAX } else { (1u64 << (8 * n)) - 1 };
            let head = (head8(&prefix), mask);
            pats.push(Pattern { segs, prefix, head });
        }
        let tag = parse_tag(&s.tag);
        let stars =
            tag.iter().filter_map(|p| if let TagPart::Star(n) = p { Some(*n) } else { None }).max().unwrap_or(0);
        if s.tag.is_empty() || s.tag.contains(['{', '}']) {
            problems.push(format!("{at}: tag must be non-empty text without {{ or }}"));
        }
        if let Some(p) = pats.iter().find(|p| p.segs.len() - 1 < stars) {
            let text: Vec<String> = p.segs.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect();
            problems.push(format!("{at}: tag uses ${stars} but pattern {:?} has fewer *", text.join("*")));
        }
        list.push(Rule { spec: s.clone(), pats, tag });
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let mut by_first = Box::new([0u64; 256]);
    for (i, r) in list.iter().enumerate() {
        for p in &r.pats {
            match p.segs[0].first() {
                Some(&c) if c != b'?' => by_first[c as usize] |= 1 << i,
                // a leading * or ?: any first byte
                _ => by_first.iter_mut().for_each(|m| *m |= 1 << i),
            }
        }
    }
    let prologue = prologue(&list);
    Ok(Rules { list, by_first, prologue })
}

/// `b` as a Lua string literal (letters and digits as they are, every other byte as
/// `\ddd`).
fn lua_str(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() * 2 + 2);
    out.push('"');
    for &c in b {
        match c.is_ascii_alphanumeric() {
            true => out.push(c as char),
            false => out.push_str(&format!("\\{c:03}")),
        }
    }
    out.push('"');
    out
}

/// Commands whose only key is their first argument, in every form (Redis's key specs:
/// one key at index 1, nothing found by keyword): inside a shimmed script their first
/// argument is renamed without a `COMMAND GETKEYS` (checked against the command table by
/// a test).
pub const ONE_KEY_FIRST: &[&str] = &[
    "append",
    "bitcount",
    "bitpos",
    "decr",
    "decrby",
    "dump",
    "expire",
    "expireat",
    "expiretime",
    "get",
    "getbit",
    "getdel",
    "getex",
    "getrange",
    "getset",
    "hdel",
    "hexists",
    "hget",
    "hgetall",
    "hincrby",
    "hincrbyfloat",
    "hkeys",
    "hlen",
    "hmget",
    "hmset",
    "hrandfield",
    "hscan",
    "hset",
    "hsetnx",
    "hstrlen",
    "hvals",
    "incr",
    "incrby",
    "incrbyfloat",
    "lindex",
    "linsert",
    "llen",
    "lpop",
    "lpos",
    "lpush",
    "lpushx",
    "lrange",
    "lrem",
    "lset",
    "ltrim",
    "persist",
    "pexpire",
    "pexpireat",
    "pexpiretime",
    "pfadd",
    "psetex",
    "pttl",
    "restore",
    "rpop",
    "rpush",
    "rpushx",
    "sadd",
    "scard",
    "set",
    "setbit",
    "setex",
    "setnx",
    "setrange",
    "sismember",
    "smembers",
    "smismember",
    "spop",
    "srandmember",
    "srem",
    "sscan",
    "strlen",
    "ttl",
    "type",
    "xack",
    "xadd",
    "xautoclaim",
    "xclaim",
    "xdel",
    "xlen",
    "xpending",
    "xrange",
    "xrevrange",
    "xsetid",
    "xtrim",
    "zadd",
    "zcard",
    "zcount",
    "zincrby",
    "zlexcount",
    "zmscore",
    "zpopmax",
    "zpopmin",
    "zrandmember",
    "zrange",
    "zrangebylex",
    "zrangebyscore",
    "zrank",
    "zrem",
    "zremrangebylex",
    "zremrangebyrank",
    "zremrangebyscore",
    "zrevrange",
    "zrevrangebylex",
    "zrevrangebyscore",
    "zrevrank",
    "zscan",
    "zscore",
];

/// The Lua that makes a script see and use names as the client does ([`Rules::shim`]):
/// one line (the script's line numbers stay), in front of the body. It shadows `KEYS`
/// with the client's names of the declared keys, and `redis` with a table whose `call`
/// and `pcall` rename an argument the server names a key (`COMMAND GETKEYS`, asked only
/// when an argument is a name a rule colocates) as heatshield does, by the same rules in
/// the same order. So every name means the same key whether the client or a script uses
/// it, and values (a set of job keys) hold the client's names, as on one Redis.
fn prologue(list: &[Rule]) -> String {
    // __hs_n(k): the stored name of k, or nil. An argument no pattern can start as is
    // passed over first (one plain search of its first byte), as most are.
    let pats = || list.iter().flat_map(|r| r.pats.iter().map(move |p| (r, p)));
    let any_first = pats().any(|(_, p)| p.segs[0].first().is_none_or(|&c| c == b'?'));
    let mut firsts: Vec<u8> = pats().filter_map(|(_, p)| p.segs[0].first().copied()).collect();
    firsts.sort();
    firsts.dedup();
    // (the library's functions as locals: a global's lookup costs more in a loop)
    let mut n = String::from(
        "local __hs_r, __hs_find, __hs_sub, __hs_byte, __hs_type, __hs_select, __hs_unpack, __hs_lower = \
         redis, string.find, string.sub, string.byte, type, select, unpack, string.lower; ",
    );
    // commands whose one key is their first argument, whatever follows: renamed without
    // asking the server which arguments are keys
    n.push_str(&format!("local __hs_one = ' {} '; ", ONE_KEY_FIRST.join(" ")));
    if !any_first {
        let bytes: Vec<String> = firsts.iter().map(|b| format!("[{b}] = true")).collect();
        n.push_str(&format!("local __hs_first = {{{}}}; ", bytes.join(", ")));
    }
    n.push_str(
        "local function __hs_tagged(k) local o = __hs_find(k, '{', 1, true); \
         if o then local c = __hs_find(k, '}', o + 1, true); return c ~= nil and c > o + 1 end; return false end; ",
    );
    n.push_str("local function __hs_n(k) if __hs_type(k) ~= 'string' then return nil end; ");
    if !any_first {
        n.push_str("if not __hs_first[__hs_byte(k) or 0] then return nil end; ");
    }
    n.push_str("local s, e, c1, c2, c3, c4, c5, c6, c7, c8; ");
    for (r, p) in pats() {
        // ^seg(.-)seg(.-)...seg$, a `?` any one byte
        let mut pat = Vec::from(&b"^"[..]);
        for (i, seg) in p.segs.iter().enumerate() {
            if i > 0 {
                pat.extend_from_slice(b"(.-)");
            }
            for &c in seg {
                match c {
                    b'?' => pat.push(b'.'),
                    c if c.is_ascii_alphanumeric() => pat.push(c),
                    c => pat.extend_from_slice(&[b'%', c]),
                }
            }
        }
        pat.push(b'$');
        let caps: String = (1..p.segs.len()).map(|i| format!(", c{i}")).collect();
        // a name with a hash tag of its own is left alone (looked for once a pattern matched)
        n.push_str(&format!(
            "s, e{caps} = __hs_find(k, {}); if s then if __hs_tagged(k) then return nil end; ",
            lua_str(&pat)
        ));
        match r.tag.as_slice() {
            // a fixed tag: checked when the rule was made
            [TagPart::Text(t)] => n.push_str(&format!("return {} .. k end; ", lua_str(&[b"{", &t[..], b"}"].concat()))),
            parts => {
                let tag: Vec<String> = parts
                    .iter()
                    .map(|t| match t {
                        TagPart::Text(t) => lua_str(t),
                        TagPart::Star(i) => format!("(c{i} or '')"),
                    })
                    .collect();
                n.push_str(&format!(
                    "local t = {}; if t == '' or __hs_find(t, '}}', 1, true) then return nil end; \
                     return '{{' .. t .. '}}' .. k end; ",
                    tag.join(" .. ")
                ));
            }
        }
    }
    n.push_str("return nil end; ");
    // KEYS as the client named them: the script sees what it would on one Redis (a name it
    // makes from KEYS[1] is the one the client would use, and renamed alike)
    n.push_str(
        "local __hs_keys = {}; for i = 1, #KEYS do local k = KEYS[i]; __hs_keys[i] = k; \
         if __hs_byte(k) == 123 then local e = __hs_find(k, '}', 2, true); \
         if e and e > 2 then local c = __hs_sub(k, e + 1); if __hs_n(c) == k then __hs_keys[i] = c end end end end; \
         local KEYS = __hs_keys; ",
    );
    // __hs_a(c, ...): the arguments with the keys among them renamed (a table made only
    // when one may be)
    n.push_str(
        "local function __hs_a(c, ...) local n = __hs_select('#', ...); \
         if __hs_type(c) == 'string' and __hs_find(__hs_one, ' ' .. __hs_lower(c) .. ' ', 1, true) then \
         local s = __hs_n((...)); if not s then return ... end; local a = {...}; a[1] = s; return __hs_unpack(a, 1, n) end; \
         local rn; for i = 1, n do local s = __hs_n((__hs_select(i, ...))); if s then rn = rn or {}; rn[i] = s end end; \
         if not rn then return ... end; \
         local ks = __hs_r.pcall('COMMAND', 'GETKEYS', c, ...); \
         if __hs_type(ks) ~= 'table' or ks.err then return ... end; local a = {...}; local j = 1; \
         for i = 1, n do if ks[j] ~= nil and a[i] == ks[j] then a[i] = rn[i] or a[i]; j = j + 1 end end; \
         return __hs_unpack(a, 1, n) end; \
         local redis = setmetatable({call = function(c, ...) return __hs_r.call(c, __hs_a(c, ...)) end, \
         pcall = function(c, ...) return __hs_r.pcall(c, __hs_a(c, ...)) end}, {__index = __hs_r}); ",
    );
    n
}

fn parse_tag(tag: &str) -> Vec<TagPart> {
    let b = tag.as_bytes();
    let mut parts = Vec::new();
    let mut text = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if b[i] == b'$' && digits > 0 {
            let n: usize = tag[i + 1..i + 1 + digits].parse().unwrap_or(usize::MAX);
            if !text.is_empty() {
                parts.push(TagPart::Text(std::mem::take(&mut text)));
            }
            parts.push(TagPart::Star(n.max(1)));
            i += 1 + digits;
        } else {
            text.push(b[i]);
            i += 1;
        }
    }
    if !text.is_empty() {
        parts.push(TagPart::Text(text));
    }
    parts
}

/// Whether segment `seg` (`?` any byte) matches `s` at `at`.
#[inline]
fn seg_at(seg: &[u8], s: &[u8], at: usize) -> bool {
    s.len() >= at + seg.len() && seg.iter().zip(&s[at..]).all(|(&p, &c)| p == b'?' || p == c)
}

impl Pattern {
    /// What each `*` matched (each as little as it can), if `s` matches.
    fn captures(&self, s: &[u8]) -> Option<SmallVec<[(usize, usize); 4]>> {
        let segs = &self.segs;
        let (first, last) = (&segs[0], &segs[segs.len() - 1]);
        if segs.len() == 1 {
            return (s.len() == first.len() && seg_at(first, s, 0)).then(SmallVec::new);
        }
        if s.len() < first.len() + last.len() || !seg_at(first, s, 0) {
            return None;
        }
        let end = s.len() - last.len();
        if !seg_at(last, s, end) {
            return None;
        }
        let mut caps = SmallVec::new();
        let mut pos = first.len();
        for seg in &segs[1..segs.len() - 1] {
            // the leftmost place it fits (before the last segment)
            let at = (pos..=end.checked_sub(seg.len())?).find(|&j| seg_at(seg, s, j))?;
            caps.push((pos, at));
            pos = at + seg.len();
        }
        if pos > end {
            return None;
        }
        caps.push((pos, end));
        Some(caps)
    }
}

/// Whether Redis hashes `key` by a tag of its own (`{...}` with something inside).
#[inline]
pub fn has_hash_tag(key: &[u8]) -> bool {
    match memchr::memchr(b'{', key) {
        Some(open) => memchr::memchr(b'}', &key[open + 1..]).is_some_and(|close| close > 0),
        None => false,
    }
}

impl Rules {
    /// The tag key `key` gets, if a rule matches it (the first rule that does decides; a
    /// tag that would come out empty or hold `}` leaves the key alone).
    fn tag(&self, key: &[u8]) -> Option<Vec<u8>> {
        let &first = key.first()?;
        let mut cand = self.by_first[first as usize];
        while cand != 0 {
            let i = cand.trailing_zeros() as usize;
            cand &= cand - 1;
            let rule = &self.list[i];
            for p in &rule.pats {
                if let Some(caps) = p.captures(key) {
                    let mut tag = Vec::new();
                    for part in &rule.tag {
                        match part {
                            TagPart::Text(t) => tag.extend_from_slice(t),
                            TagPart::Star(n) => {
                                let (a, b) = caps.get(n - 1).copied().unwrap_or((0, 0));
                                tag.extend_from_slice(&key[a..b]);
                            }
                        }
                    }
                    return (!tag.is_empty() && !tag.contains(&b'}')).then_some(tag);
                }
            }
        }
        None
    }

    /// Whether some argument of `req` may be a key a rule colocates (a quick look at
    /// each one's beginning: a yes may be wrong, a no is not).
    #[inline]
    pub fn may_touch(&self, req: &Request) -> bool {
        (1..req.argc()).any(|i| {
            let a = req.arg(i);
            let cand = a.first().map_or(0, |&f| self.by_first[f as usize]);
            cand != 0 && self.starts_a_key(cand, a)
        })
    }

    /// The first bytes, of which at least one of the request's arguments must start
    /// with, if it may be a key a rule colocates (see [`Rules::may_touch`]).
    #[inline(always)]
    pub fn key_heads(&self) -> &[u64; 256] {
        &self.by_first
    }

    /// Whether `a` starts with the prefix of a pattern of a rule in `cand` (8 bytes at
    /// once: most prefixes are shorter, and a memcmp call costs more).
    fn starts_a_key(&self, mut cand: u64, a: &[u8]) -> bool {
        let head = match a.get(..8) {
            Some(h) => u64::from_le_bytes(h.try_into().unwrap_or_default()),
            None => head8(a),
        };
        while cand != 0 {
            let i = cand.trailing_zeros() as usize;
            cand &= cand - 1;
            for p in &self.list[i].pats {
                if head & p.head.1 == p.head.0 && (p.prefix.len() <= 8 || a.starts_with(&p.prefix)) {
                    return true;
                }
            }
        }
        false
    }

    /// The name `key` is stored under, if a rule colocates it.
    pub fn stored_name(&self, key: &[u8]) -> Option<Vec<u8>> {
        if has_hash_tag(key) {
            return None;
        }
        let tag = self.tag(key)?;
        let mut v = Vec::with_capacity(tag.len() + 2 + key.len());
        v.push(b'{');
        v.extend_from_slice(&tag);
        v.push(b'}');
        v.extend_from_slice(key);
        Some(v)
    }

    /// The rule that colocates `key`, if one does (the first that matches it).
    pub fn rule_of(&self, key: &[u8]) -> Option<&Rule> {
        if has_hash_tag(key) || self.tag(key).is_none() {
            return None;
        }
        self.list.iter().find(|r| r.pats.iter().any(|p| p.captures(key).is_some()))
    }

    /// A digest of the rules (their names, patterns and tags, in order): equal on every
    /// heatshield with the same rules (`PROXY INFO`'s `colocate_digest`).
    pub fn digest(&self) -> String {
        let specs: Vec<&RuleConfig> = self.list.iter().map(|r| &r.spec).collect();
        let text = serde_json::to_string(&specs).unwrap_or_default();
        sha1_smol::Sha1::from(text).digest().to_string()[..16].to_string()
    }

    /// Whether a KEYS / SCAN pattern may match the client name of a key some rule
    /// colocates (their plain beginnings agree as far as both go).
    pub fn pattern_may_match(&self, pattern: &[u8]) -> bool {
        let plain = |p: &[u8]| p.iter().position(|c| matches!(c, b'*' | b'?' | b'[' | b'\\')).unwrap_or(p.len());
        let head = &pattern[..plain(pattern)];
        self.list.iter().flat_map(|r| &r.pats).any(|p| {
            let s = &p.segs[0];
            let own = &s[..plain(s)];
            head.starts_with(own) || own.starts_with(head)
        })
    }

    /// The tag of every key that starts with `lit`, if one rule with a fixed tag takes
    /// them all (a pattern of it is a prefix of `lit` then `*`, and no rule before it may
    /// take any of them). Such keys' names can be made from a pattern (SORT's `BY`, a
    /// keyspace channel pattern): the tag goes first.
    pub fn fixed_tag_for_prefix(&self, lit: &[u8]) -> Option<&[u8]> {
        if lit.contains(&b'{') {
            return None;
        }
        for r in &self.list {
            let covers = r.pats.iter().any(|p| {
                p.segs.len() == 2 && p.segs[1].is_empty() && !p.segs[0].contains(&b'?') && lit.starts_with(&p.segs[0])
            });
            if covers {
                return match r.tag.as_slice() {
                    [TagPart::Text(t)] => Some(t),
                    _ => None,
                };
            }
            if r.pats.iter().any(|p| lit.starts_with(&p.prefix) || p.prefix.starts_with(lit)) {
                return None;
            }
        }
        None
    }

    /// A glob of key names (a keyspace channel pattern's key part) as a glob of their
    /// stored names, if one rule with a fixed tag takes every key it can match.
    pub fn stored_pattern(&self, glob: &[u8]) -> Option<Vec<u8>> {
        let plain = glob.iter().position(|c| matches!(c, b'*' | b'?' | b'[' | b'\\')).unwrap_or(glob.len());
        let tag = self.fixed_tag_for_prefix(&glob[..plain])?;
        let mut v = Vec::with_capacity(glob.len() + tag.len() + 4);
        v.push(b'{');
        for &c in tag {
            if matches!(c, b'*' | b'?' | b'[' | b']' | b'\\') {
                v.push(b'\\');
            }
            v.push(c);
        }
        v.push(b'}');
        v.extend_from_slice(glob);
        Some(v)
    }

    /// The client's glob for a stored one ([`Rules::stored_pattern`]), if a rule made it.
    pub fn client_pattern<'a>(&self, stored: &'a [u8]) -> Option<&'a [u8]> {
        if stored.first() != Some(&b'{') {
            return None;
        }
        let close = memchr::memchr(b'}', stored)?;
        let glob = &stored[close + 1..];
        (self.stored_pattern(glob).as_deref() == Some(stored)).then_some(glob)
    }

    /// A script body that, run on Redis, gives the key names it makes itself (from
    /// `ARGV`, from values) their stored names, as heatshield gives the declared ones: the
    /// prologue on the body's first line (after a `#!` line, which must stay first).
    pub fn shim(&self, body: &[u8]) -> Vec<u8> {
        let (head, rest) = match body.starts_with(b"#!") {
            true => match memchr::memchr(b'\n', body) {
                Some(nl) => body.split_at(nl + 1),
                None => (body, &b""[..]),
            },
            false => (&b""[..], body),
        };
        [head, self.prologue.as_bytes(), rest].concat()
    }

    /// The body [`Rules::shim`] was given, if `body` is a shimmed one.
    pub fn unshim(&self, body: &[u8]) -> Option<Vec<u8>> {
        let p = self.prologue.as_bytes();
        if p.is_empty() {
            return None;
        }
        let at = match body.starts_with(b"#!") {
            true => memchr::memchr(b'\n', body)? + 1,
            false => 0,
        };
        body[at..].starts_with(p).then(|| [&body[..at], &body[at + p.len()..]].concat())
    }

    /// The client's name for a stored name, if it is one a rule made.
    pub fn client_name<'a>(&self, stored: &'a [u8]) -> Option<&'a [u8]> {
        if stored.first() != Some(&b'{') {
            return None;
        }
        let close = memchr::memchr(b'}', stored)?;
        let (tag, key) = (&stored[1..close], &stored[close + 1..]);
        if tag.is_empty() || has_hash_tag(key) {
            return None;
        }
        (self.tag(key).as_deref() == Some(tag)).then_some(key)
    }
}

/// The rules in force, shared by every session.
#[derive(Default)]
pub struct Colocate {
    rules: ArcSwap<Rules>,
    /// The rules this instance switches to with its fleet (`[[colocate_next]]`), if any.
    next: parking_lot::Mutex<Option<Arc<Rules>>>,
    active: AtomicBool,
    /// Counts the changes of the rules (a session keeps the rules it saw last).
    generation: AtomicU64,
    /// Scripts sent with the shim ([`Rules::shim`]): the client's SHA1 to the one Redis has.
    pub shas: Shas,
}

/// Script SHA1s, the client's to the shimmed body's (bounded: the least recently used go
/// first; an `EVALSHA` whose script is forgotten is sent as it is, and Redis answers
/// `NOSCRIPT`, after which a client sends the body again).
pub struct Shas(moka::sync::Cache<[u8; 20], [u8; 20]>);

/// Scripts whose shimmed SHA1 is remembered, at most.
const MAX_SHAS: u64 = 65_536;

impl Default for Shas {
    fn default() -> Self {
        Shas(moka::sync::Cache::new(MAX_SHAS))
    }
}

/// A 40-digit hex SHA1 (either case) as its 20 bytes.
fn unhex(hex: &[u8]) -> Option<[u8; 20]> {
    if hex.len() != 40 {
        return None;
    }
    let mut out = [0u8; 20];
    for (i, pair) in hex.chunks(2).enumerate() {
        let d = |c: u8| (c as char).to_digit(16);
        out[i] = (d(pair[0])? * 16 + d(pair[1])?) as u8;
    }
    Some(out)
}

/// 20 bytes as 40 lower-case hex digits, as Redis writes a script's SHA1.
fn hex(b: &[u8; 20]) -> [u8; 40] {
    let mut out = [0u8; 40];
    for (i, x) in b.iter().enumerate() {
        out[2 * i] = b"0123456789abcdef"[(x >> 4) as usize];
        out[2 * i + 1] = b"0123456789abcdef"[(x & 15) as usize];
    }
    out
}

impl Colocate {
    pub fn new(rules: Rules) -> Colocate {
        let c = Colocate::default();
        c.replace(rules);
        c
    }

    /// Some rule is in force (a relaxed load: the request path asks this first).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    pub fn rules(&self) -> Arc<Rules> {
        self.rules.load_full()
    }

    pub fn replace(&self, rules: Rules) {
        let on = !rules.list.is_empty();
        self.rules.store(Arc::new(rules));
        // shimmed with the old rules: sent as they are again until their bodies come by
        self.shas.0.invalidate_all();
        self.generation.fetch_add(1, Ordering::Release);
        self.active.store(on, Ordering::Relaxed);
    }

    /// The rules to switch to with the fleet (none: no change is rolling out).
    pub fn next(&self) -> Option<Arc<Rules>> {
        self.next.lock().clone()
    }

    /// Sets the rules to switch to (empty: none). (Counted as a change: the fleet's
    /// digests are made again.)
    pub fn set_next(&self, rules: Rules) {
        *self.next.lock() = (!rules.list.is_empty()).then(|| Arc::new(rules));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Puts the next rules in force (the fleet switched).
    pub fn switch(&self) {
        if let Some(next) = self.next() {
            let specs: Vec<RuleConfig> = next.list.iter().map(|r| r.spec.clone()).collect();
            // (they compiled when they were set)
            if let Ok(rules) = compile(&specs) {
                self.replace(rules);
            }
        }
    }

    /// Changes so far (see [`Colocate::rules`]).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// `req` with its keys under the client's names again (what ACL rules are written for).
    pub fn restore_request(&self, cmd: &Command, req: &Request) -> Option<Request> {
        let keys = keys_of(cmd, req).ok()?;
        let rules = self.rules.load();
        // a shimmed EVAL's body as the client sent it (SCRIPT LOAD goes as it is)
        let body = match cmd.name.as_str() {
            "EVAL" | "EVAL_RO" if req.argc() > 1 => rules.unshim(req.arg(1)).map(|b| (1, b)),
            _ => None,
        };
        if body.is_none() && !keys.iter().any(|&k| rules.client_name(req.arg(k as usize)).is_some()) {
            return None;
        }
        let args: Vec<&[u8]> = (0..req.argc())
            .map(|i| match (keys.contains(&(i as u32)), &body) {
                (_, Some((at, b))) if *at == i => &b[..],
                (true, _) => rules.client_name(req.arg(i)).unwrap_or(req.arg(i)),
                (false, _) => req.arg(i),
            })
            .collect();
        Some(Request::from_args(&args))
    }

    /// The client's name for a stored key name (the name itself if no rule made it): the
    /// one way back from a stored key name, for whatever must see the client's names
    /// (rate limits, ACL key rules, statistics, the admin views).
    #[inline]
    pub fn client_key<'a>(&self, stored: &'a [u8]) -> &'a [u8] {
        if stored.first() != Some(&b'{') || !self.active() {
            return stored;
        }
        self.rules.load().client_name(stored).unwrap_or(stored)
    }

    /// What a request of `cmd` needs on its way in and out: `req` with its keys under
    /// their stored names (if a rule colocates one), and how its reply shows the client's
    /// names. A KEYS or SCAN pattern that a colocated key's client name may match becomes
    /// `*`, and heatshield filters the reply by the client's pattern (a stored name is the
    /// tag first: the client's pattern cannot find it).
    pub fn on_the_way_in(&self, cmd: &Command, req: Request) -> (Request, Option<Box<ReplyFix>>) {
        on_the_way_in(&self.rules.load(), &self.shas, cmd, req)
    }

    /// A reply of a command that returns key names ([`NamesInReply`]) with the client's
    /// names (and, for KEYS and SCAN, only those the client's pattern matches); `None` if
    /// nothing changes (or the reply is not of the expected shape).
    pub fn restore_reply(&self, fix: &ReplyFix, reply: &[u8]) -> Option<Bytes> {
        let rules = self.rules.load();
        restore_reply(&rules, fix, reply)
    }

    /// An error reply quoting a stored name (`NOGROUP No such key '...'`) with the
    /// client's name. `None` if it quotes none.
    pub fn restore_error(&self, err: &[u8]) -> Option<Bytes> {
        restore_error(&self.rules.load(), err)
    }

    /// A push or pub/sub message with the client's names: an `invalidate` push's keys; a
    /// keyspace notification's key (in the channel of `__keyspace@N__:key`, in the
    /// message of `__keyevent@N__:event`); a keyspace channel or pattern in a
    /// subscription's confirmation or message. `None` if nothing changes.
    pub fn restore_push(&self, push: &[u8]) -> Option<Bytes> {
        restore_push(&self.rules.load(), push)
    }
}

/// [`Colocate::restore_reply`] with `rules`.
fn restore_reply(rules: &Rules, fix: &ReplyFix, reply: &[u8]) -> Option<Bytes> {
    let mut w = Walk { buf: reply, pos: 0, out: BytesMut::new(), copied: 0, changed: false, rules };
    if !fix.tx.is_empty() {
        // EXEC: [reply, ...] (nil when a watched key changed)
        let n = w.aggregate()?;
        for i in 0..n {
            let start = w.pos;
            w.skip()?;
            let elem = &reply[start..w.pos];
            let new = match fix.tx.iter().find(|(j, _)| *j as usize == i) {
                Some((_, f)) => restore_reply(rules, f, elem),
                None => restore_error(rules, elem),
            };
            if let Some(nb) = new {
                w.replace_raw(start, &nb);
            }
        }
        return w.finish();
    }
    if fix.kind == NamesInReply::Script {
        // the shimmed script's SHA1 (an error's `script: ...`) is the client's
        let pair = fix.filter.as_deref()?;
        let (sent, orig) = pair.split_at(40);
        let start = memchr::memmem::find(reply, sent)?;
        let out = [&reply[..start], orig, &reply[start + 40..]].concat();
        return Some(restore_error(rules, &out).unwrap_or_else(|| out.into()));
    }
    if let Some(nb) = restore_error(rules, reply) {
        return Some(nb);
    }
    match fix.kind {
        NamesInReply::None | NamesInReply::Script => return None,
        NamesInReply::Channels => {
            // one confirmation per channel, one after the other
            while w.pos < reply.len() {
                let start = w.pos;
                w.skip()?;
                if let Some(nb) = restore_push(rules, &reply[start..w.pos]) {
                    w.replace_raw(start, &nb);
                }
            }
        }
        NamesInReply::One => w.name()?,
        NamesInReply::List => return names(rules, reply, false, fix.filter.as_deref()),
        NamesInReply::Scan => return names(rules, reply, true, fix.filter.as_deref()),
        NamesInReply::First => {
            if w.aggregate()? > 0 {
                w.name()?;
            }
        }
        NamesInReply::Streams => {
            // RESP2: [[name, entries], ...]; RESP3: {name: entries, ...}
            let map = reply.first() == Some(&b'%');
            let n = w.aggregate()?;
            for _ in 0..n {
                if !map {
                    w.aggregate()?;
                }
                w.name()?;
                w.skip()?;
            }
        }
    }
    w.finish()
}

/// [`Colocate::restore_push`] with `rules`.
fn restore_push(rules: &Rules, push: &[u8]) -> Option<Bytes> {
    let mut w = Walk { buf: push, pos: 0, out: BytesMut::new(), copied: 0, changed: false, rules };
    let n = w.aggregate()?;
    let kind = w.peek_bulk()?;
    if kind.eq_ignore_ascii_case(b"invalidate") && n == 2 {
        w.skip()?;
        // nil: everything was flushed
        if let Some(k) = w.aggregate_or_nil()? {
            for _ in 0..k {
                w.name()?;
            }
        }
        return w.finish();
    }
    let confirmation = |k: &[u8]| {
        [&b"subscribe"[..], b"unsubscribe", b"psubscribe", b"punsubscribe"].iter().any(|c| k.eq_ignore_ascii_case(c))
    };
    if n == 3 && confirmation(kind) {
        w.skip()?;
        let pattern = kind[0] | 0x20 == b'p';
        w.keyspace(pattern)?;
        return w.finish();
    }
    let pattern = kind.eq_ignore_ascii_case(b"pmessage");
    if !(kind.eq_ignore_ascii_case(b"message") || pattern) {
        return None;
    }
    w.skip()?;
    if pattern {
        w.keyspace(true)?;
    }
    let channel = w.peek_bulk()?;
    if channel.starts_with(b"__keyspace@") {
        w.suffix_name(b"__:")?;
        return w.finish();
    }
    if channel.starts_with(b"__keyevent@") {
        w.skip()?;
        w.name()?;
        return w.finish();
    }
    // the invalidations of a RESP2 client tracking with REDIRECT
    if channel == b"__redis__:invalidate" {
        w.skip()?;
        if let Some(k) = w.aggregate_or_nil()? {
            for _ in 0..k {
                w.name()?;
            }
        }
        return w.finish();
    }
    None
}

/// `req` with its keys under their stored names, if a rule colocates one of them. Lock
/// commands keep theirs (their names are heatshield's).
pub fn rewrite(rules: &Rules, cmd: &Command, req: &Request) -> Option<Request> {
    let keys = keys_of(cmd, req).ok()?;
    let mut new: SmallVec<[(u32, Vec<u8>); 4]> = SmallVec::new();
    for &k in &keys {
        if let Some(n) = rules.stored_name(req.arg(k as usize)) {
            new.push((k, n));
        }
    }
    if new.is_empty() {
        return None;
    }
    let args: Vec<&[u8]> = (0..req.argc())
        .map(|i| match new.iter().find(|(k, _)| *k as usize == i) {
            Some((_, n)) => &n[..],
            None => req.arg(i),
        })
        .collect();
    Some(Request::from_args(&args))
}

/// What a request of `cmd` needs on its way in and out: `req` with its keys under their
/// stored names (if a rule colocates one), and how its reply shows the client's names. A
/// KEYS or SCAN pattern that a colocated key's client name may match becomes `*`, and
/// heatshield filters the reply by the client's pattern (a stored name is the tag first:
/// the client's pattern cannot find it).
pub fn on_the_way_in(rules: &Rules, shas: &Shas, cmd: &Command, req: Request) -> (Request, Option<Box<ReplyFix>>) {
    if cmd.names == NamesInReply::Script {
        return script(rules, shas, cmd, req);
    }
    let req = rewrite(rules, cmd, &req).unwrap_or(req);
    if cmd.names == NamesInReply::None {
        let req = match matches!(cmd.name.as_str(), "SORT" | "SORT_RO") {
            true => sort_patterns(rules, &req).unwrap_or(req),
            false => req,
        };
        return (req, None);
    }
    if cmd.names == NamesInReply::Channels {
        let pattern = cmd.name.starts_with('P');
        let req = channels(rules, &req, pattern).unwrap_or(req);
        return (req, Some(Box::new(ReplyFix::new(cmd.names, None))));
    }
    let at = match cmd.names {
        NamesInReply::List if req.argc() == 2 => Some(1),
        NamesInReply::Scan => (2..req.argc().saturating_sub(1))
            .step_by(2)
            .find(|&i| req.arg(i).eq_ignore_ascii_case(b"MATCH"))
            .map(|i| i + 1),
        _ => None,
    };
    let Some(at) = at else { return (req, Some(Box::new(ReplyFix::new(cmd.names, None)))) };
    let filter = req.arg(at).to_vec();
    let req = match rules.pattern_may_match(&filter) && req.arg(at) != b"*" {
        true => {
            let args: Vec<&[u8]> = (0..req.argc()).map(|i| if i == at { &b"*"[..] } else { req.arg(i) }).collect();
            Request::from_args(&args)
        }
        false => req,
    };
    (req, Some(Box::new(ReplyFix::new(cmd.names, Some(filter)))))
}

/// A script on its way in: its declared keys under their stored names and, when one
/// of them is a rule's, its body shimmed ([`Rules::shim`]) so the names it makes itself
/// are stored alike. `EVALSHA` of a script shimmed or loaded before is sent as the
/// shimmed one's SHA1 (met with `NOSCRIPT` on a master that lacks it, it is sent as
/// `EVAL` of the shimmed body: [`loaded`]); an error names the client's SHA1.
fn script(rules: &Rules, shas: &Shas, cmd: &Command, req: Request) -> (Request, Option<Box<ReplyFix>>) {
    let keyed = rewrite(rules, cmd, &req);
    let (at, shim) = match cmd.name.as_str() {
        "EVAL" | "EVAL_RO" if keyed.is_some() => (1, true),
        "EVALSHA" | "EVALSHA_RO" if keyed.is_some() => (1, false),
        _ => return (keyed.unwrap_or(req), None),
    };
    let req = keyed.unwrap_or(req);
    let (orig, sent, arg) = match shim {
        true => {
            let body = rules.shim(req.arg(at));
            let orig = sha1_smol::Sha1::from(req.arg(at)).digest().bytes();
            let sent = sha1_smol::Sha1::from(&body).digest().bytes();
            shas.0.insert(orig, sent);
            (orig, sent, body)
        }
        false => {
            let Some(orig) = unhex(req.arg(at)) else { return (req, None) };
            let Some(sent) = shas.0.get(&orig) else { return (req, None) };
            (orig, sent, hex(&sent).to_vec())
        }
    };
    let args: Vec<&[u8]> = (0..req.argc()).map(|i| if i == at { &arg[..] } else { req.arg(i) }).collect();
    let mut pair = hex(&sent).to_vec();
    pair.extend_from_slice(&hex(&orig));
    (Request::from_args(&args), Some(Box::new(ReplyFix::new(NamesInReply::Script, Some(pair)))))
}

/// `SCRIPT LOAD body` goes as it is (the client may run it with keys no rule takes, and
/// `SCRIPT SHOW` shows it); the shimmed body a call with a rule's keys needs is made now,
/// its SHA1 remembered: returned, for heatshield to keep with the scripts it can send
/// again (crate::services::scripts).
pub fn loaded(rules: &Rules, shas: &Shas, body: &[u8]) -> Vec<u8> {
    let shim = rules.shim(body);
    let orig = sha1_smol::Sha1::from(body).digest().bytes();
    shas.0.insert(orig, sha1_smol::Sha1::from(&shim).digest().bytes());
    shim
}

/// SORT's `BY` and `GET` patterns under their stored names: a pattern whose every key
/// (`*` replaced by an element) a rule with a fixed tag colocates gets the tag first, so
/// the keys it makes are the stored ones (and Redis Cluster, seeing the tag, allows
/// `BY`/`GET` when it is the sorted key's slot). `None` if none changes.
fn sort_patterns(rules: &Rules, req: &Request) -> Option<Request> {
    let mut new: SmallVec<[(usize, Vec<u8>); 2]> = SmallVec::new();
    let mut i = 2;
    while i + 1 < req.argc() {
        let a = req.arg(i);
        if a.eq_ignore_ascii_case(b"LIMIT") {
            i += 3;
            continue;
        }
        if a.eq_ignore_ascii_case(b"BY") || a.eq_ignore_ascii_case(b"GET") {
            let p = req.arg(i + 1);
            // (no `*`: BY sorts nothing, GET of a fixed name gives nil; `#`: the element)
            if let Some(star) = memchr::memchr(b'*', p)
                && !has_hash_tag(p)
                && let Some(tag) = rules.fixed_tag_for_prefix(&p[..star])
            {
                new.push((i + 1, [&b"{"[..], tag, b"}", p].concat()));
            }
            i += 2;
            continue;
        }
        i += 1;
    }
    replaced(req, &new)
}

/// `req` with the arguments at the places of `new` replaced; `None` if there are none.
fn replaced(req: &Request, new: &[(usize, Vec<u8>)]) -> Option<Request> {
    if new.is_empty() {
        return None;
    }
    let args: Vec<&[u8]> = (0..req.argc())
        .map(|i| match new.iter().find(|(k, _)| *k == i) {
            Some((_, n)) => &n[..],
            None => req.arg(i),
        })
        .collect();
    Some(Request::from_args(&args))
}

/// Where a keyspace channel's key (or key pattern) starts: after `__keyspace@N__:`.
fn keyspace_key(channel: &[u8]) -> Option<usize> {
    if !channel.starts_with(b"__keyspace@") {
        return None;
    }
    memchr::memmem::find(channel, b"__:").map(|at| at + 3)
}

/// (P)SUBSCRIBE / (P)UNSUBSCRIBE's keyspace channels under their stored names: a channel
/// naming a key a rule colocates, or (`pattern`) a pattern all of whose keys a rule with a
/// fixed tag colocates. `None` if none changes.
fn channels(rules: &Rules, req: &Request, pattern: bool) -> Option<Request> {
    let mut new: SmallVec<[(usize, Vec<u8>); 2]> = SmallVec::new();
    for i in 1..req.argc() {
        let c = req.arg(i);
        let Some(at) = keyspace_key(c) else { continue };
        let (head, key) = c.split_at(at);
        let stored = match pattern {
            false => rules.stored_name(key),
            true => rules.stored_pattern(key),
        };
        if let Some(k) = stored {
            new.push((i, [head, &k].concat()));
        }
    }
    replaced(req, &new)
}

/// An error quoting stored names (`'{tag}key'`, as in `NOGROUP No such key 'k' ...`)
/// with the client's names. `None` if it quotes none.
fn restore_error(rules: &Rules, err: &[u8]) -> Option<Bytes> {
    if err.first() != Some(&b'-') || memchr::memmem::find(err, b"'{").is_none() {
        return None;
    }
    let mut out = Vec::with_capacity(err.len());
    let mut rest = err;
    let mut changed = false;
    while let Some(open) = memchr::memmem::find(rest, b"'{") {
        out.extend_from_slice(&rest[..open + 1]);
        rest = &rest[open + 1..];
        let Some(close) = memchr::memchr(b'\'', rest) else { break };
        let quoted = &rest[..close];
        match rules.client_name(quoted) {
            Some(k) => {
                out.extend_from_slice(k);
                changed = true;
            }
            None => out.extend_from_slice(quoted),
        }
        rest = &rest[close..];
    }
    out.extend_from_slice(rest);
    changed.then(|| Bytes::from(out))
}

/// How a request's reply shows the client's key names ([`Colocate::restore_reply`]).
#[derive(Debug)]
pub struct ReplyFix {
    pub kind: NamesInReply,
    /// KEYS's or SCAN's pattern as the client sent it.
    pub filter: Option<Vec<u8>>,
    /// EXEC: the fixes of the transaction's commands, by their place in its reply.
    pub tx: Vec<(u32, ReplyFix)>,
}

impl ReplyFix {
    pub fn new(kind: NamesInReply, filter: Option<Vec<u8>>) -> ReplyFix {
        ReplyFix { kind, filter, tx: Vec::new() }
    }

    /// EXEC's reply, whose elements `tx` (by place) are fixed as their commands' replies
    /// would be (an error quoting a stored name is fixed wherever it is).
    pub fn exec(tx: Vec<(u32, ReplyFix)>) -> ReplyFix {
        ReplyFix { kind: NamesInReply::None, filter: None, tx }
    }
}

/// KEYS's array of names, or SCAN's `[cursor, [names]]`, with the client's names, only
/// those `filter` matches.
fn names(rules: &Rules, reply: &[u8], scan: bool, filter: Option<&[u8]>) -> Option<Bytes> {
    let mut w = Walk { buf: reply, pos: 0, out: BytesMut::new(), copied: 0, changed: false, rules };
    let mut cursor: &[u8] = &[];
    if scan {
        if w.aggregate()? != 2 {
            return None;
        }
        let at = w.pos;
        w.skip()?;
        cursor = &reply[at..w.pos];
    }
    let head = reply.get(w.pos).copied()?;
    let n = w.aggregate()?;
    // each element kept: a name, or (not a string) its bytes as they are
    let mut kept: Vec<(bool, &[u8])> = Vec::with_capacity(n.min(4096));
    let mut changed = false;
    for _ in 0..n {
        let at = w.pos;
        let name = w.peek_bulk();
        w.skip()?;
        let Some(name) = name else {
            kept.push((false, &reply[at..w.pos]));
            continue;
        };
        let client = rules.client_name(name).unwrap_or(name);
        if filter.is_some_and(|f| !crate::glob::matches(f, client, false)) {
            changed = true;
            continue;
        }
        changed |= client.len() != name.len();
        kept.push((true, client));
    }
    if !changed {
        return None;
    }
    let mut out = BytesMut::with_capacity(reply.len());
    if scan {
        out.extend_from_slice(b"*2\r\n");
        out.extend_from_slice(cursor);
    }
    out.extend_from_slice(&[head]);
    out.extend_from_slice(itoa::Buffer::new().format(kept.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for &(name, k) in &kept {
        match name {
            true => write_bulk(&mut out, k),
            false => out.extend_from_slice(k),
        }
    }
    Some(out.freeze())
}

/// A walk over one reply that copies it, rewriting the names it is told to.
struct Walk<'a> {
    buf: &'a [u8],
    pos: usize,
    out: BytesMut,
    /// Bytes of `buf` already in `out` (or skipped for a rewritten name).
    copied: usize,
    changed: bool,
    rules: &'a Rules,
}

impl<'a> Walk<'a> {
    /// The line at `pos` (without CRLF) and where the next element starts.
    fn line(&self) -> Option<(&'a [u8], usize)> {
        let buf: &'a [u8] = self.buf;
        let rest = buf.get(self.pos..)?;
        let nl = memchr::memchr(b'\n', rest)?;
        (nl >= 1 && rest[nl - 1] == b'\r').then(|| (&rest[..nl - 1], self.pos + nl + 1))
    }

    /// An aggregate header (`*`, `%`, `~`, `>`): its count (a map counts its pairs).
    fn aggregate(&mut self) -> Option<usize> {
        self.aggregate_or_nil()?
    }

    fn aggregate_or_nil(&mut self) -> Option<Option<usize>> {
        let (line, next) = self.line()?;
        let (&t, n) = line.split_first()?;
        if !matches!(t, b'*' | b'%' | b'~' | b'>' | b'_' | b'$') {
            return None;
        }
        self.pos = next;
        if t == b'_' || n.first() == Some(&b'-') {
            return Some(None);
        }
        let n: usize = std::str::from_utf8(n).ok()?.parse().ok()?;
        Some(Some(n))
    }

    /// Steps over one whole element.
    fn skip(&mut self) -> Option<()> {
        let len = reply_len(&self.buf[self.pos..]).ok()??;
        self.pos += len;
        Some(())
    }

    /// The bulk string at `pos`, not stepped over.
    fn peek_bulk(&self) -> Option<&'a [u8]> {
        let (line, next) = self.line()?;
        let (&t, n) = line.split_first()?;
        if !matches!(t, b'$' | b'+') {
            return None;
        }
        if t == b'+' {
            return Some(n);
        }
        let n: usize = std::str::from_utf8(n).ok()?.parse().ok()?;
        let buf: &'a [u8] = self.buf;
        buf.get(next..next + n)
    }

    /// A key name (a bulk string or nil): replaced by the client's name.
    fn name(&mut self) -> Option<()> {
        let start = self.pos;
        let Some(data) = self.peek_bulk() else {
            // nil or another type: left as it is
            return self.skip();
        };
        let data: &[u8] = data;
        self.skip()?;
        if let Some(k) = self.rules.client_name(data) {
            let k = k.to_vec();
            self.replace(start, &k);
        }
        Some(())
    }

    /// A bulk string whose part after the first `sep` is a key name (a keyspace channel).
    fn suffix_name(&mut self, sep: &[u8]) -> Option<()> {
        let start = self.pos;
        let data = self.peek_bulk()?;
        let at = memchr::memmem::find(data, sep)? + sep.len();
        let (head, key) = data.split_at(at);
        let new = self.rules.client_name(key).map(|k| [head, k].concat());
        self.skip()?;
        if let Some(n) = new {
            self.replace(start, &n);
        }
        Some(())
    }

    /// A channel (or, `pattern`, a channel pattern): a keyspace one naming a stored key
    /// (or glob) takes the client's.
    fn keyspace(&mut self, pattern: bool) -> Option<()> {
        let start = self.pos;
        let Some(data) = self.peek_bulk() else { return self.skip() };
        self.skip()?;
        let Some(at) = keyspace_key(data) else { return Some(()) };
        let (head, key) = data.split_at(at);
        let client = match pattern {
            false => self.rules.client_name(key),
            true => self.rules.client_pattern(key),
        };
        if let Some(k) = client {
            let n = [head, k].concat();
            self.replace(start, &n);
        }
        Some(())
    }

    /// The element at `start..pos` becomes `with`, as it is (a whole element).
    fn replace_raw(&mut self, start: usize, with: &[u8]) {
        self.out.extend_from_slice(&self.buf[self.copied..start]);
        self.out.extend_from_slice(with);
        self.copied = self.pos;
        self.changed = true;
    }

    /// The element at `start..pos` becomes the bulk string `with`.
    fn replace(&mut self, start: usize, with: &[u8]) {
        self.out.extend_from_slice(&self.buf[self.copied..start]);
        write_bulk(&mut self.out, with);
        self.copied = self.pos;
        self.changed = true;
    }

    fn finish(mut self) -> Option<Bytes> {
        if !self.changed {
            return None;
        }
        self.out.extend_from_slice(&self.buf[self.copied..]);
        Some(self.out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, keys: &[&str], tag: &str) -> RuleConfig {
        RuleConfig { name: name.into(), keys: keys.iter().map(|s| s.to_string()).collect(), tag: tag.into() }
    }

    fn rules() -> Rules {
        compile(&[
            rule("rq", &["rq:*"], "rq"),
            rule("lock", &["lock:*", "lock-signal:*"], "$1"),
            rule("bull", &["bull:*:*"], "bull:$1"),
        ])
        .unwrap()
    }

    #[test]
    fn names_get_their_tag_and_come_back() {
        let r = rules();
        let cases: [(&str, Option<&str>); 9] = [
            ("rq:job:1", Some("{rq}rq:job:1")),
            ("lock:orders", Some("{orders}lock:orders")),
            ("lock-signal:orders", Some("{orders}lock-signal:orders")),
            ("bull:q1:wait", Some("{bull:q1}bull:q1:wait")),
            ("bull:q1:123:logs", Some("{bull:q1}bull:q1:123:logs")),
            ("bull:q1", None),
            ("rq{x}:job", None),
            ("session:1", None),
            ("lock:", None),
        ];
        for (k, want) in cases {
            let got = r.stored_name(k.as_bytes());
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{k}");
            if let Some(s) = got {
                assert_eq!(r.client_name(&s), Some(k.as_bytes()), "{k}");
            }
        }
        // names no rule made stay as they are
        for s in ["{rq}session:1", "{x}rq:job:1", "{}rq:1", "rq:1", "{orders}lock:other"] {
            assert_eq!(r.client_name(s.as_bytes()), None, "{s}");
        }
    }

    #[test]
    fn a_quick_look_finds_every_request_a_rule_may_touch() {
        let r = rules();
        let req = |a: &[&str]| Request::from_args(a);
        assert!(r.may_touch(&req(&["GET", "rq:job:1"])));
        assert!(r.may_touch(&req(&["MSET", "a", "1", "lock:x", "2"])));
        assert!(r.may_touch(&req(&["EVAL", "body", "1", "bull:q:wait"])));
        assert!(!r.may_touch(&req(&["GET", "key:000001"])));
        assert!(!r.may_touch(&req(&["GET", "r"])));
        assert!(!r.may_touch(&req(&["PING"])));
        for n in ["KEYS", "scan", "RandomKey", "blpop", "BZMPOP", "xreadgroup", "LMPOP", "punsubscribe", "SUBSCRIBE"] {
            assert!(crate::command::may_name_keys(n.as_bytes()), "{n}");
        }
        for n in ["GET", "SET", "KEY", "SCANX", "XADD", "BLMOVE", "ZADD", "PUBLISH", "UNLINK", "SSUBSCRIBE"] {
            assert!(!crate::command::may_name_keys(n.as_bytes()), "{n}");
        }
    }

    #[test]
    fn captures_take_as_little_as_they_can() {
        let p = Pattern { segs: vec![b"a".to_vec(), b":".to_vec(), b"".to_vec()], prefix: b"a".to_vec(), head: (0, 0) };
        assert_eq!(p.captures(b"ax:y:z").unwrap().to_vec(), vec![(1, 2), (3, 6)]);
        assert!(p.captures(b"ax").is_none());
        let q = Pattern { segs: vec![b"x?".to_vec(), b"end".to_vec()], prefix: b"x".to_vec(), head: (0, 0) };
        assert_eq!(q.captures(b"xyMIDend").unwrap().to_vec(), vec![(2, 5)]);
        assert!(q.captures(b"xend").is_none());
    }

    #[test]
    fn bad_rules_are_refused_each_named() {
        let e = compile(&[
            rule("", &["a:*"], "a"),
            rule("x", &["[ab]*"], "x"),
            rule("y", &["y:*"], "$2"),
            rule("y", &["z:*"], "{z}"),
        ])
        .unwrap_err();
        assert_eq!(e.len(), 5, "{e:?}");
    }

    fn fix(kind: NamesInReply) -> ReplyFix {
        ReplyFix::new(kind, None)
    }

    #[test]
    fn keys_and_scan_are_filtered_by_the_clients_pattern() {
        let c = Colocate::new(rules());
        let r = c.rules();
        assert!(r.pattern_may_match(b"rq:job:*"));
        assert!(r.pattern_may_match(b"r*"));
        assert!(r.pattern_may_match(b"*"));
        assert!(!r.pattern_may_match(b"session:*"));
        let list = b"*3\r\n$12\r\n{rq}rq:job:1\r\n$8\r\nrq:other\r\n$11\r\n{rq}session\r\n";
        let f = ReplyFix::new(NamesInReply::List, Some(b"rq:*".to_vec()));
        assert_eq!(&c.restore_reply(&f, list).unwrap()[..], b"*2\r\n$8\r\nrq:job:1\r\n$8\r\nrq:other\r\n");
        let f = ReplyFix::new(NamesInReply::Scan, Some(b"*:job:*".to_vec()));
        let scan = b"*2\r\n$1\r\n0\r\n*2\r\n$12\r\n{rq}rq:job:1\r\n$8\r\nrq:other\r\n";
        assert_eq!(&c.restore_reply(&f, scan).unwrap()[..], b"*2\r\n$1\r\n0\r\n*1\r\n$8\r\nrq:job:1\r\n");
        // the request: a pattern a rule's keys may match is sent as *
        let table = crate::command::CommandTable::new();
        let req = Request::from_args(&["KEYS", "rq:*"]);
        let cmd = table.lookup(&req).unwrap();
        let (sent, fix) = c.on_the_way_in(cmd, req.clone());
        assert_eq!(sent.arg(1), b"*");
        assert_eq!(fix.unwrap().filter.as_deref(), Some(&b"rq:*"[..]));
        let req = Request::from_args(&["SCAN", "0", "MATCH", "session:*", "COUNT", "10"]);
        let (sent, fix) = c.on_the_way_in(table.lookup(&req).unwrap(), req.clone());
        assert_eq!(sent.arg(3), b"session:*");
        assert!(fix.unwrap().filter.is_some());
        let req = Request::from_args(&["MSET", "rq:a", "1", "x", "2"]);
        let (sent, fix) = c.on_the_way_in(table.lookup(&req).unwrap(), req.clone());
        assert_eq!(sent.args().collect::<Vec<_>>(), [&b"MSET"[..], b"{rq}rq:a", b"1", b"x", b"2"]);
        assert!(fix.is_none());
    }

    #[test]
    fn replies_show_the_clients_names() {
        let c = Colocate::new(rules());
        let list = b"*3\r\n$12\r\n{rq}rq:job:1\r\n$5\r\nother\r\n$-1\r\n";
        assert_eq!(
            &c.restore_reply(&fix(NamesInReply::List), list).unwrap()[..],
            b"*3\r\n$8\r\nrq:job:1\r\n$5\r\nother\r\n$-1\r\n"
        );
        let scan = b"*2\r\n$2\r\n17\r\n*1\r\n$12\r\n{rq}rq:job:1\r\n";
        assert_eq!(
            &c.restore_reply(&fix(NamesInReply::Scan), scan).unwrap()[..],
            b"*2\r\n$2\r\n17\r\n*1\r\n$8\r\nrq:job:1\r\n"
        );
        let pop = b"*2\r\n$12\r\n{rq}rq:queue\r\n$1\r\nv\r\n";
        assert_eq!(
            &c.restore_reply(&fix(NamesInReply::First), pop).unwrap()[..],
            b"*2\r\n$8\r\nrq:queue\r\n$1\r\nv\r\n"
        );
        assert_eq!(c.restore_reply(&fix(NamesInReply::First), b"*-1\r\n"), None);
        let streams3 = b"%1\r\n$8\r\n{rq}rq:s\r\n*0\r\n";
        assert_eq!(&c.restore_reply(&fix(NamesInReply::Streams), streams3).unwrap()[..], b"%1\r\n$4\r\nrq:s\r\n*0\r\n");
        let streams2 = b"*1\r\n*2\r\n$8\r\n{rq}rq:s\r\n*0\r\n";
        assert_eq!(
            &c.restore_reply(&fix(NamesInReply::Streams), streams2).unwrap()[..],
            b"*1\r\n*2\r\n$4\r\nrq:s\r\n*0\r\n"
        );
        let inval = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$12\r\n{rq}rq:job:1\r\n";
        assert_eq!(&c.restore_push(inval).unwrap()[..], b">2\r\n$10\r\ninvalidate\r\n*1\r\n$8\r\nrq:job:1\r\n");
        let space = b"*3\r\n$7\r\nmessage\r\n$27\r\n__keyspace@0__:{rq}rq:job:1\r\n$3\r\nset\r\n";
        assert_eq!(
            &c.restore_push(space).unwrap()[..],
            b"*3\r\n$7\r\nmessage\r\n$23\r\n__keyspace@0__:rq:job:1\r\n$3\r\nset\r\n"
        );
        let event = b"*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$18\r\n__keyevent@0__:set\r\n$12\r\n{rq}rq:job:1\r\n";
        assert_eq!(
            &c.restore_push(event).unwrap()[..],
            b"*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$18\r\n__keyevent@0__:set\r\n$8\r\nrq:job:1\r\n"
        );
        assert_eq!(c.restore_push(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$12\r\n{rq}rq:job:1\r\n"), None);
    }

    #[test]
    fn the_shims_one_key_commands_have_one_key_first() {
        let table = crate::command::CommandTable::new();
        for name in ONE_KEY_FIRST {
            let c = table.get(name.as_bytes()).unwrap_or_else(|| panic!("{name}: not a command"));
            assert_eq!(format!("{:?}", c.keys), "Range { first: 1, last: 1, step: 1 }", "{name}");
        }
    }

    #[test]
    fn patterns_get_a_fixed_tag_when_one_rule_takes_all_their_keys() {
        let r = rules();
        assert_eq!(r.fixed_tag_for_prefix(b"rq:w_"), Some(&b"rq"[..]));
        assert_eq!(r.fixed_tag_for_prefix(b"rq:"), Some(&b"rq"[..]));
        // not all of its keys, or not one tag
        assert_eq!(r.fixed_tag_for_prefix(b"rq"), None);
        assert_eq!(r.fixed_tag_for_prefix(b"lock:"), None);
        assert_eq!(r.fixed_tag_for_prefix(b"bull:q:"), None);
        assert_eq!(r.fixed_tag_for_prefix(b"rq:{x}"), None);
        assert_eq!(r.stored_pattern(b"rq:job:*").as_deref(), Some(&b"{rq}rq:job:*"[..]));
        assert_eq!(r.stored_pattern(b"rq*"), None);
        assert_eq!(r.client_pattern(b"{rq}rq:job:*"), Some(&b"rq:job:*"[..]));
        assert_eq!(r.client_pattern(b"{x}rq:job:*"), None);
        // an earlier rule that may take some of the keys: no single tag
        let two = compile(&[rule("a", &["rq:a*"], "a"), rule("rq", &["rq:*"], "rq")]).unwrap();
        assert_eq!(two.fixed_tag_for_prefix(b"rq:"), None);
        assert_eq!(two.fixed_tag_for_prefix(b"rq:b"), Some(&b"rq"[..]));
        // SORT's BY and GET
        let sort =
            Request::from_args(&["SORT", "rq:l", "BY", "rq:w_*", "LIMIT", "0", "5", "GET", "#", "GET", "rq:o_*->f"]);
        let got = sort_patterns(&r, &sort).unwrap();
        assert_eq!(got.arg(3), b"{rq}rq:w_*");
        assert_eq!(got.arg(8), b"#");
        assert_eq!(got.arg(10), b"{rq}rq:o_*->f");
        assert!(sort_patterns(&r, &Request::from_args(&["SORT", "rq:l", "BY", "nosort"])).is_none());
        // keyspace channels
        let sub = Request::from_args(&["SUBSCRIBE", "__keyspace@0__:rq:x", "news"]);
        assert_eq!(channels(&r, &sub, false).unwrap().arg(1), b"__keyspace@0__:{rq}rq:x");
        let psub = Request::from_args(&["PSUBSCRIBE", "__keyspace@*__:rq:*", "__keyspace@0__:*"]);
        let got = channels(&r, &psub, true).unwrap();
        assert_eq!((got.arg(1), got.arg(2)), (&b"__keyspace@*__:{rq}rq:*"[..], &b"__keyspace@0__:*"[..]));
    }

    #[test]
    fn confirmations_exec_and_errors_show_the_clients_names() {
        let c = Colocate::new(rules());
        let conf = b"*3\r\n$9\r\nsubscribe\r\n$23\r\n__keyspace@0__:{rq}rq:x\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:2\r\n";
        assert_eq!(
            &c.restore_reply(&fix(NamesInReply::Channels), conf).unwrap()[..],
            &b"*3\r\n$9\r\nsubscribe\r\n$19\r\n__keyspace@0__:rq:x\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:2\r\n"[..]
        );
        let pmsg = b">4\r\n$8\r\npmessage\r\n$23\r\n__keyspace@0__:{rq}rq:*\r\n$23\r\n__keyspace@0__:{rq}rq:x\r\n$3\r\nset\r\n";
        assert_eq!(
            &c.restore_push(pmsg).unwrap()[..],
            &b">4\r\n$8\r\npmessage\r\n$19\r\n__keyspace@0__:rq:*\r\n$19\r\n__keyspace@0__:rq:x\r\n$3\r\nset\r\n"[..]
        );
        // EXEC: [KEYS's reply, an error quoting a key, RANDOMKEY's]
        let exec = ReplyFix::exec(vec![(0, fix(NamesInReply::List)), (2, fix(NamesInReply::One))]);
        let reply = b"*3\r\n*1\r\n$8\r\n{rq}rq:a\r\n-NOGROUP No such key '{rq}rq:s' or consumer group 'g'\r\n$8\r\n{rq}rq:b\r\n";
        assert_eq!(
            &c.restore_reply(&exec, reply).unwrap()[..],
            &b"*3\r\n*1\r\n$4\r\nrq:a\r\n-NOGROUP No such key 'rq:s' or consumer group 'g'\r\n$4\r\nrq:b\r\n"[..]
        );
        assert_eq!(c.restore_reply(&exec, b"*-1\r\n"), None);
        assert_eq!(c.restore_error(b"-NOGROUP No such key '{x}y' or consumer group 'g'\r\n"), None);
        assert_eq!(
            &c.restore_error(b"-NOGROUP No such consumer group 'g' for key name '{rq}rq:s'\r\n").unwrap()[..],
            &b"-NOGROUP No such consumer group 'g' for key name 'rq:s'\r\n"[..]
        );
    }
}
