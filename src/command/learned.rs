//! Commands as the servers describe them: a `COMMAND` (or `COMMAND INFO`) reply parsed
//! into definitions (arity, flags, key specs, subcommands), the keys of a request found
//! from key specs the way Redis finds them (`getKeysUsingKeySpecs` in db.c), and the
//! definitions every master agrees on.
//!
//! The generated table (generated.rs) knows Redis 7.0; what a newer Redis, Valkey or a
//! module adds is learned here at run time (crate::learn asks the masters).

use crate::protocol::reply::Value;
use crate::protocol::request::parse_i64;

use super::spec::{flags, key};

/// One command (or subcommand) as a server describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Def {
    /// Uppercase; `PARENT|SUB` for a subcommand.
    pub name: String,
    pub arity: i32,
    /// heatshield's flag bits (crate::command::flags) for the flags it knows.
    pub flags: u32,
    /// `movablekeys`: the legacy first/last/step do not find its keys.
    pub movable: bool,
    /// ACL categories (crate::command::cat bits) for the categories heatshield knows.
    pub acl: u32,
    /// Legacy key positions (first, last, step).
    pub legacy: (i32, i32, i32),
    pub rules: Vec<KeyRule>,
    pub subs: Vec<Def>,
}

/// A learned command's key specs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRules(pub Vec<KeyRule>);

/// One key spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRule {
    pub begin: Begin,
    pub find: Find,
    /// `not_key`: names something routed like a key that is not one (a shard channel).
    pub not_key: bool,
    /// `incomplete`: the spec may miss keys (only `COMMAND GETKEYS` finds them all).
    pub incomplete: bool,
    /// `RW`, `OW`, `RM`, `insert`, `update` or `delete`: the command may change the key.
    pub write: bool,
    /// What ACL checks the key for: `access` (read) and `insert`/`update`/`delete`
    /// (write), as crate::command::spec::key bits.
    pub acl: u8,
    /// `variable_flags`: what the command does to the key depends on its arguments.
    pub variable: bool,
}

/// Where a key spec's search begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// At this argument.
    Index(i32),
    /// After the first `keyword` found from argument `from` (negative: from the end,
    /// searching backwards).
    Keyword { keyword: Vec<u8>, from: i32 },
    /// A type heatshield does not know.
    Unknown,
}

/// How a key spec's keys are found from where its search begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Find {
    /// Keys up to `last` (relative to the beginning, or from the end when negative; with
    /// `limit`, a 1/limit share of what remains), every `step`.
    Range { last: i32, step: i32, limit: i32 },
    /// The number of keys at `at` (relative), the first key `first` after the beginning,
    /// every `step`.
    KeyNum { at: i32, first: i32, step: i32 },
    /// A type heatshield does not know.
    Unknown,
}

impl KeyRule {
    /// Whether heatshield can follow this spec to all of a request's keys.
    pub fn followable(&self) -> bool {
        !self.incomplete && self.begin != Begin::Unknown && self.find != Find::Unknown
    }
}

impl Def {
    /// Whether heatshield finds every key of this command from its key specs alone.
    pub fn keys_followable(&self) -> bool {
        let specs = self.rules.iter().all(KeyRule::followable);
        // a `movablekeys` command without key specs (an old module's getkeys callback)
        specs && !(self.movable && self.rules.is_empty())
    }

    /// Whether any key spec says the command may change its keys.
    pub fn writes_keys(&self) -> bool {
        self.rules.iter().any(|r| r.write && !r.not_key)
    }
}

/// The positions of the keys of a request of `argc` arguments (`arg(0)` is the command
/// name) under `rules`, as Redis's `getKeysUsingKeySpecs` finds them: a spec that does not
/// fit the arguments gives no keys at all (the server reports the error, as through
/// Redis Cluster); `not_key` specs name no keys.
pub fn find_keys<'a>(
    rules: &[KeyRule],
    argc: usize,
    arg: impl Fn(usize) -> &'a [u8],
    out: &mut smallvec::SmallVec<[u32; 4]>,
) {
    find(rules, argc, arg, out, false)
}

/// [`find_keys`] as ACL finds keys: a spec whose keys end before they begin (a count of
/// 0, or arguments missing) does not fit either, and gives no keys at all.
pub fn find_keys_strict<'a>(
    rules: &[KeyRule],
    argc: usize,
    arg: impl Fn(usize) -> &'a [u8],
    out: &mut smallvec::SmallVec<[u32; 4]>,
) {
    find(rules, argc, arg, out, true)
}

#[inline(always)]
fn find<'a>(
    rules: &[KeyRule],
    argc: usize,
    arg: impl Fn(usize) -> &'a [u8],
    out: &mut smallvec::SmallVec<[u32; 4]>,
    strict: bool,
) {
    let argc = argc as i64;
    for rule in rules {
        if rule.not_key {
            continue;
        }
        let first = match &rule.begin {
            Begin::Index(i) => *i as i64,
            Begin::Keyword { keyword, from } => {
                let from = *from as i64;
                let (start, end) = if from > 0 { (from, argc - 1) } else { (argc + from, 1) };
                let mut found = None;
                let mut i = start;
                while i != end {
                    if i >= argc || i < 1 {
                        break;
                    }
                    if arg(i as usize).eq_ignore_ascii_case(keyword) {
                        found = Some(i + 1);
                        break;
                    }
                    i += if start <= end { 1 } else { -1 };
                }
                match found {
                    Some(f) => f,
                    None => continue,
                }
            }
            Begin::Unknown => {
                out.clear();
                return;
            }
        };
        let (first, last, step) = match rule.find {
            Find::Range { last, step, limit } => {
                let last = if last >= 0 {
                    first + last as i64
                } else if limit == 0 {
                    argc + last as i64
                } else {
                    first + ((argc - first) / limit as i64 + last as i64)
                };
                (first, last, step)
            }
            Find::KeyNum { at, first: f, step } => {
                let at = first + at as i64;
                if at < 1 || at >= argc {
                    out.clear();
                    return;
                }
                let Some(n) = parse_i64(arg(at as usize)).filter(|&n| n >= 0) else {
                    out.clear();
                    return;
                };
                let first = first + f as i64;
                (first, first + (n - 1) * step.max(1) as i64, step)
            }
            Find::Unknown => {
                out.clear();
                return;
            }
        };
        if last < first {
            if strict {
                out.clear();
                return;
            }
            // (no keys: `numkeys` 0)
            continue;
        }
        if last >= argc || first >= argc || first < 1 {
            out.clear();
            return;
        }
        let step = step.max(1) as i64;
        let mut i = first;
        while i <= last {
            out.push(i as u32);
            i += step;
        }
    }
}

/// Parses a `COMMAND` / `COMMAND INFO` reply (RESP2 or RESP3) into definitions, skipping
/// the nil entries `COMMAND INFO` gives for unknown names.
pub fn parse_commands(reply: &[u8]) -> Result<Vec<Def>, String> {
    let (v, _) = Value::parse(reply).map_err(|e| e.0.to_string())?;
    let Value::Array(entries) = v else {
        return Err(match v {
            Value::Error(e) => String::from_utf8_lossy(e).into_owned(),
            _ => "COMMAND: not an array".into(),
        });
    };
    let mut out = Vec::with_capacity(entries.len());
    for e in &entries {
        if *e == Value::Nil {
            continue;
        }
        out.push(parse_def(e)?);
    }
    Ok(out)
}

fn parse_def(v: &Value) -> Result<Def, String> {
    let Value::Array(f) = v else { return Err("COMMAND: an entry is not an array".into()) };
    let text = |i: usize| f.get(i).and_then(Value::as_bytes).map(|b| String::from_utf8_lossy(b).to_ascii_uppercase());
    let int = |i: usize| f.get(i).and_then(Value::as_int);
    // (a subcommand's name comes as `parent|sub`)
    let name = text(0).ok_or("COMMAND: an entry has no name")?;
    let arity = int(1).ok_or_else(|| format!("COMMAND: {name} has no arity"))? as i32;
    let mut bits = 0;
    let mut movable = false;
    if let Some(Value::Array(fl)) = f.get(2) {
        for x in fl.iter().filter_map(Value::as_bytes) {
            match x.to_ascii_lowercase().as_slice() {
                b"write" => bits |= flags::WRITE,
                b"readonly" => bits |= flags::READONLY,
                b"denyoom" => bits |= flags::DENYOOM,
                b"admin" => bits |= flags::ADMIN,
                b"pubsub" => bits |= flags::PUBSUB,
                b"noscript" => bits |= flags::NOSCRIPT,
                b"blocking" => bits |= flags::BLOCKING,
                b"loading" => bits |= flags::LOADING,
                b"stale" => bits |= flags::STALE,
                b"fast" => bits |= flags::FAST,
                b"no_auth" => bits |= flags::NO_AUTH,
                b"may_replicate" => bits |= flags::MAY_REPLICATE,
                b"no_multi" => bits |= flags::NO_MULTI,
                b"allow_busy" => bits |= flags::ALLOW_BUSY,
                b"module" => bits |= flags::MODULE,
                b"movablekeys" => movable = true,
                _ => {}
            }
        }
    }
    let mut acl = 0;
    if let Some(Value::Array(cats)) = f.get(6) {
        for c in cats.iter().filter_map(Value::as_bytes) {
            acl |= super::spec::cat::of(c.strip_prefix(b"@").unwrap_or(c)).unwrap_or(0);
        }
    }
    let legacy = (int(3).unwrap_or(0) as i32, int(4).unwrap_or(0) as i32, int(5).unwrap_or(0) as i32);
    let mut rules = Vec::new();
    if let Some(Value::Array(specs)) = f.get(8) {
        for s in specs {
            rules.push(parse_rule(s).ok_or_else(|| format!("COMMAND: {name} has a key spec heatshield cannot read"))?);
        }
    }
    let mut subs = Vec::new();
    if let Some(Value::Array(ss)) = f.get(9) {
        for s in ss {
            subs.push(parse_def(s)?);
        }
    }
    // (in the order of the server's own hash table: it differs from server to server)
    subs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Def { name, arity, flags: bits, movable, acl, legacy, rules, subs })
}

/// The fields of a RESP2 flat key/value array or a RESP3 map, by name.
fn fields<'v, 'a>(v: &'v Value<'a>) -> Vec<(&'a [u8], &'v Value<'a>)> {
    match v {
        Value::Array(items) => items.chunks_exact(2).filter_map(|kv| Some((kv[0].as_bytes()?, &kv[1]))).collect(),
        Value::Map(kv) => kv.iter().filter_map(|(k, v)| Some((k.as_bytes()?, v))).collect(),
        _ => Vec::new(),
    }
}

fn field<'v, 'a>(v: &'v Value<'a>, name: &[u8]) -> Option<&'v Value<'a>> {
    fields(v).into_iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v)
}

fn parse_rule(v: &Value) -> Option<KeyRule> {
    let mut rule = KeyRule {
        begin: Begin::Unknown,
        find: Find::Unknown,
        not_key: false,
        incomplete: false,
        write: false,
        acl: 0,
        variable: false,
    };
    if let Some(Value::Array(fl)) = field(v, b"flags") {
        for x in fl.iter().filter_map(Value::as_bytes) {
            match x.to_ascii_lowercase().as_slice() {
                b"not_key" => rule.not_key = true,
                b"incomplete" => rule.incomplete = true,
                b"rw" | b"ow" | b"rm" => rule.write = true,
                b"insert" | b"update" | b"delete" => {
                    rule.write = true;
                    rule.acl |= key::CHANGE;
                }
                b"access" => rule.acl |= key::ACCESS,
                b"variable_flags" => rule.variable = true,
                _ => {}
            }
        }
    }
    let int = |v: &Value, name: &[u8]| field(v, name).and_then(Value::as_int).map(|i| i as i32);
    if let Some(b) = field(v, b"begin_search") {
        let kind = field(b, b"type").and_then(Value::as_bytes).unwrap_or_default();
        let spec = field(b, b"spec");
        rule.begin = match (kind, spec) {
            (b"index", Some(s)) => Begin::Index(int(s, b"index")?),
            (b"keyword", Some(s)) => Begin::Keyword {
                keyword: field(s, b"keyword").and_then(Value::as_bytes)?.to_vec(),
                from: int(s, b"startfrom")?,
            },
            _ => Begin::Unknown,
        };
    }
    if let Some(fk) = field(v, b"find_keys") {
        let kind = field(fk, b"type").and_then(Value::as_bytes).unwrap_or_default();
        let spec = field(fk, b"spec");
        rule.find = match (kind, spec) {
            (b"range", Some(s)) => Find::Range {
                last: int(s, b"lastkey")?,
                step: int(s, b"keystep")?,
                limit: int(s, b"limit").unwrap_or(0),
            },
            (b"keynum", Some(s)) => {
                Find::KeyNum { at: int(s, b"keynumidx")?, first: int(s, b"firstkey")?, step: int(s, b"keystep")? }
            }
            _ => Find::Unknown,
        };
    }
    Some(rule)
}

/// The definitions every master gave alike (a rolling upgrade: a command only some
/// masters know is not accepted), and the names left out because the masters disagree.
pub fn agreed(per_master: &[Vec<Def>]) -> (Vec<Def>, Vec<String>) {
    let Some((first, rest)) = per_master.split_first() else { return (Vec::new(), Vec::new()) };
    let mut out = Vec::new();
    let mut left = Vec::new();
    for d in first {
        if rest.iter().all(|m| m.iter().any(|o| o == d)) {
            out.push(d.clone());
        } else {
            left.push(d.name.clone());
        }
    }
    for m in rest {
        for d in m {
            if !first.iter().any(|o| o.name == d.name) && !left.contains(&d.name) {
                left.push(d.name.clone());
            }
        }
    }
    left.sort();
    (out, left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::spec::cat;

    /// Valkey 9.1.2's `COMMAND INFO msetex`, as it came.
    const MSETEX: &[u8] = b"*1\r\n*10\r\n$6\r\nmsetex\r\n:-4\r\n*3\r\n+write\r\n+denyoom\r\n+movablekeys\r\n:0\r\n:0\r\n:0\r\n*3\r\n+@write\r\n+@string\r\n+@slow\r\n*2\r\n$26\r\nrequest_policy:multi_shard\r\n$29\r\nresponse_policy:all_succeeded\r\n*1\r\n*6\r\n$5\r\nflags\r\n*2\r\n+OW\r\n+update\r\n$12\r\nbegin_search\r\n*4\r\n$4\r\ntype\r\n$5\r\nindex\r\n$4\r\nspec\r\n*2\r\n$5\r\nindex\r\n:1\r\n$9\r\nfind_keys\r\n*4\r\n$4\r\ntype\r\n$6\r\nkeynum\r\n$4\r\nspec\r\n*6\r\n$9\r\nkeynumidx\r\n:0\r\n$8\r\nfirstkey\r\n:1\r\n$7\r\nkeystep\r\n:2\r\n*0\r\n";

    fn keys(rules: &[KeyRule], args: &[&str]) -> Vec<u32> {
        let mut out = smallvec::SmallVec::new();
        find_keys(rules, args.len(), |i| args[i].as_bytes(), &mut out);
        out.to_vec()
    }

    #[test]
    fn a_servers_description_is_read_whole() {
        let defs = parse_commands(MSETEX).unwrap();
        assert_eq!(defs.len(), 1);
        let d = &defs[0];
        assert_eq!((d.name.as_str(), d.arity, d.movable), ("MSETEX", -4, true));
        assert_eq!(d.flags, flags::WRITE | flags::DENYOOM);
        assert_eq!(d.acl, cat::WRITE | cat::STRING | cat::SLOW, "its ACL categories");
        assert_eq!(
            d.rules,
            vec![KeyRule {
                begin: Begin::Index(1),
                find: Find::KeyNum { at: 0, first: 1, step: 2 },
                not_key: false,
                incomplete: false,
                acl: key::CHANGE,
                variable: false,
                write: true,
            }]
        );
        assert!(d.keys_followable() && d.writes_keys());
        // a name the server does not know comes as nil, and is left out
        assert_eq!(parse_commands(b"*1\r\n*-1\r\n").unwrap(), vec![]);
        assert!(parse_commands(b"-ERR no\r\n").is_err());
    }

    #[test]
    fn keys_are_found_as_redis_finds_them() {
        let msetex = parse_commands(MSETEX).unwrap().remove(0).rules;
        assert_eq!(keys(&msetex, &["MSETEX", "2", "a", "1", "b", "2", "EX", "9"]), vec![2, 4]);
        assert_eq!(keys(&msetex, &["MSETEX", "0", "EX", "9"]), Vec::<u32>::new());
        // numkeys past the arguments, or not a number: no keys (the server says what is wrong)
        assert_eq!(keys(&msetex, &["MSETEX", "3", "a", "1", "b", "2"]), Vec::<u32>::new());
        assert_eq!(keys(&msetex, &["MSETEX", "x", "a", "1"]), Vec::<u32>::new());
        // a keyword search, from the end backwards (as MIGRATE's KEYS)
        let kw = |from| KeyRule {
            begin: Begin::Keyword { keyword: b"KEYS".to_vec(), from },
            find: Find::Range { last: -1, step: 1, limit: 0 },
            not_key: false,
            incomplete: false,
            acl: 0,
            variable: false,
            write: false,
        };
        assert_eq!(keys(&[kw(-2)], &["M", "h", "KEYS", "a", "b"]), vec![3, 4]);
        assert_eq!(keys(&[kw(1)], &["M", "KEYS", "a", "b"]), vec![2, 3]);
        assert_eq!(keys(&[kw(1)], &["M", "a", "b"]), Vec::<u32>::new());
        // a range with a limit: the first half of what remains (XREAD's STREAMS k1 k2 id1 id2)
        let half = KeyRule {
            begin: Begin::Index(1),
            find: Find::Range { last: -1, step: 1, limit: 2 },
            not_key: false,
            incomplete: false,
            acl: 0,
            variable: false,
            write: true,
        };
        assert_eq!(keys(std::slice::from_ref(&half), &["X", "a", "b", "c", "d"]), vec![1, 2]);
        // not_key specs name no keys
        let not_key = KeyRule { not_key: true, ..half };
        assert_eq!(keys(&[not_key], &["X", "a", "b"]), Vec::<u32>::new());
    }

    #[test]
    fn only_what_every_master_says_alike_is_agreed() {
        let d = parse_commands(MSETEX).unwrap().remove(0);
        let other = Def { arity: -5, ..d.clone() };
        let (agreed_all, left) = agreed(&[vec![d.clone()], vec![d.clone()]]);
        assert_eq!((agreed_all, left), (vec![d.clone()], vec![]));
        let (none, left) = agreed(&[vec![d.clone()], vec![other]]);
        assert!(none.is_empty());
        assert_eq!(left, vec!["MSETEX".to_string()]);
        let (none, left) = agreed(&[vec![d.clone()], vec![]]);
        assert!(none.is_empty());
        assert_eq!(left, vec!["MSETEX".to_string()]);
    }
}
