//! ACL users and their rules, in Redis's syntax (`ACL SETUSER name rule ...`): whether a
//! user may log in and with which passwords, which commands it may run (by name,
//! subcommand and category, in the order the rules were given), which keys and channels
//! it may touch. A user's permissions are one value swapped whole when its rules change,
//! so a session that holds the user sees the change at its next command, as on Redis.
//!
//! What a command does to each key (read, write, both or neither) is taken from its key
//! specs, as Redis takes it ([`crate::command::acl_keys`]). The rules are kept in the order
//! given (a rule superseded by a later one is dropped, so they stay bounded) and shown as
//! Redis 7.0 shows them: rebuilt from what they allow ([`Perms::command_rules`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::command::{Command, CommandTable, Route, cat, key, traits};
use crate::protocol::request::Request;

/// A SHA-256 of a password, as `#<hex>` rules give it and ACL GETUSER shows it.
pub type Hash = [u8; 32];

/// The SHA-256 of `password`.
pub fn hash(password: &[u8]) -> Hash {
    let d = ring::digest::digest(&ring::digest::SHA256, password);
    let mut h = [0u8; 32];
    h.copy_from_slice(d.as_ref());
    h
}

/// A user's line (`name rule ...`) with its plain passwords (`>pw`, `<pw`) hashed
/// (`#sha256`, `!sha256`): what may be shown of it.
pub fn redact(line: &str) -> String {
    let word = |w: &str| match (w.strip_prefix('>'), w.strip_prefix('<')) {
        (Some(p), _) => format!("#{}", hex(&hash(p.as_bytes()))),
        (_, Some(p)) => format!("!{}", hex(&hash(p.as_bytes()))),
        _ => w.to_string(),
    };
    line.split_ascii_whitespace().map(word).collect::<Vec<_>>().join(" ")
}

/// `hash` as 64 lowercase hex digits.
pub fn hex(hash: &Hash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &[u8]) -> Option<Hash> {
    if s.len() != 64 || !s.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)) {
        return None;
    }
    let mut h = [0u8; 32];
    for (i, pair) in s.chunks(2).enumerate() {
        h[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(h)
}

/// One command rule, in the order given: the last that matches a command decides.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CmdRule {
    /// `+@all` / `allcommands`, `-@all` / `nocommands`
    All(bool),
    /// `+@category` / `-@category`: a [`cat`] bit
    Category(u32, bool),
    /// `+name` / `-name`: the command and its subcommands (uppercase name)
    Command(String, bool),
    /// `+name|sub` / `-name|sub` (uppercase `NAME|SUB`)
    Sub(String, bool),
    /// `+name|arg` for a command without subcommands: allowed with this first argument
    /// (uppercase name; the argument as given, compared without case)
    FirstArg(String, Vec<u8>),
}

impl CmdRule {
    /// Whether the rule speaks of `cmd` (for [`CmdRule::FirstArg`], whatever the
    /// argument).
    fn hits(&self, cmd: &Command) -> bool {
        match self {
            CmdRule::All(_) => true,
            CmdRule::Category(bit, _) => (cmd.acl | cmd.parent_acl) & bit != 0,
            CmdRule::Command(name, _) => {
                cmd.name == *name || cmd.name.strip_prefix(name.as_str()).is_some_and(|r| r.starts_with('|'))
            }
            CmdRule::Sub(name, _) | CmdRule::FirstArg(name, _) => cmd.name == *name,
        }
    }

    /// Whether a later `self` makes `earlier` count for nothing.
    fn supersedes(&self, earlier: &CmdRule) -> bool {
        match (self, earlier) {
            (CmdRule::Category(a, _), CmdRule::Category(b, _)) => a == b,
            (CmdRule::Command(a, _), CmdRule::Command(b, _) | CmdRule::Sub(b, _) | CmdRule::FirstArg(b, _)) => {
                a == b || b.strip_prefix(a.as_str()).is_some_and(|r| r.starts_with('|'))
            }
            (CmdRule::Sub(a, _), CmdRule::Sub(b, _)) => a == b,
            (CmdRule::FirstArg(a, x), CmdRule::FirstArg(b, y)) => a == b && x.eq_ignore_ascii_case(y),
            _ => false,
        }
    }
}

/// A key pattern and what it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    pub pattern: Vec<u8>,
    pub read: bool,
    pub write: bool,
    /// `pattern` prepared for matching (a `prefix*` compared as a prefix).
    glob: crate::glob::Pattern,
}

impl KeyPattern {
    fn new(pattern: &[u8], read: bool, write: bool) -> KeyPattern {
        KeyPattern { pattern: pattern.to_vec(), read, write, glob: crate::glob::Pattern::new(pattern) }
    }
}

/// What a user may do: all of it swapped at once when its rules change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Perms {
    pub enabled: bool,
    pub nopass: bool,
    pub passwords: Vec<Hash>,
    rules: Vec<CmdRule>,
    pub keys: Vec<KeyPattern>,
    pub channels: Vec<Vec<u8>>,
    /// `sanitize-payload` (`Some(true)`) / `skip-sanitize-payload` (`Some(false)`): kept
    /// and shown, as RESTORE's payloads are the servers' business.
    pub sanitize: Option<bool>,
    /// Redis 7.0's selectors (`(...)` rules): more sets of command, key and channel rules,
    /// each a [`Perms`] whose flags and passwords mean nothing. A command runs when these
    /// permissions (the root) or one selector allow all of it ([`Perms::check`]).
    pub selectors: Vec<Perms>,
    /// What the rules decide, worked out once ([`Perms::settle`]) for the request path.
    settled: Settled,
}

/// The rules' verdicts, worked out once when they change: whether anything must be
/// checked at all, and each command's verdict by id (a bit set), so a request costs a
/// bit test instead of a walk over the rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Settled {
    unrestricted: bool,
    all_keys: bool,
    /// Commands whose verdict is known whatever their arguments (not those with
    /// first-argument rules, nor commands learned since).
    known: Vec<u64>,
    allowed: Vec<u64>,
    /// Known and allowed, and naming no channel (not a subscription, not PUBLISH): what
    /// [`Perms::allows_quickly`] looks at first, one bit.
    quick: Vec<u64>,
}

impl Settled {
    #[inline(always)]
    fn bit(bits: &[u64], id: usize) -> bool {
        bits.get(id / 64).is_some_and(|w| w & (1 << (id % 64)) != 0)
    }
}

/// Why a rule was refused, in Redis's words (`ERR Error in ACL SETUSER modifier '...':
/// <this>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleError {
    Syntax,
    Unknown,
    NoSuchPassword,
    BadHash,
    KeysAfterAll,
    ChannelsAfterAll,
    FirstArgOfSub,
}

impl RuleError {
    pub fn text(&self) -> &'static str {
        match self {
            RuleError::Syntax => "Syntax error",
            RuleError::Unknown => "Unknown command or category name in ACL",
            RuleError::NoSuchPassword => "The password you are trying to remove from the user does not exist",
            RuleError::BadHash => {
                "The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters"
            }
            RuleError::KeysAfterAll => {
                "Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid and does not have any effect. Try 'resetkeys' to start with an empty list of patterns"
            }
            RuleError::ChannelsAfterAll => {
                "Adding a pattern after the * pattern (or the 'allchannels' flag) is not valid and does not have any effect. Try 'resetchannels' to start with an empty list of channels"
            }
            RuleError::FirstArgOfSub => "Allowing first-arg of a subcommand is not supported",
        }
    }

    /// The whole error reply text for `rule`.
    pub fn reply(&self, rule: &[u8]) -> String {
        format!("ERR Error in ACL SETUSER modifier '{}': {}", String::from_utf8_lossy(rule), self.text())
    }
}

/// Why a command was refused to a user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    Command,
    Key,
    Channel,
}

/// A refusal: why, and the argument refused (the key or channel; 0 for a command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    pub why: Denied,
    pub arg: usize,
}

impl Denied {
    /// The reason as `ACL LOG` and the metric give it.
    pub fn reason(self) -> &'static str {
        match self {
            Denied::Command => "command",
            Denied::Key => "key",
            Denied::Channel => "channel",
        }
    }
}

impl Perms {
    /// A new user's: off, no password, no command, key or channel.
    pub fn new() -> Perms {
        Perms::default()
    }

    /// The `default` user's when heatshield has no users configured: everything, with
    /// `password` or without any.
    pub fn everything(password: Option<&str>) -> Perms {
        Perms {
            enabled: true,
            nopass: password.is_none(),
            passwords: password.map(|p| vec![hash(p.as_bytes())]).unwrap_or_default(),
            rules: vec![CmdRule::All(true)],
            keys: vec![KeyPattern::new(b"*", true, true)],
            channels: vec![b"*".to_vec()],
            sanitize: None,
            selectors: Vec::new(),
            settled: Settled { unrestricted: true, all_keys: true, ..Settled::default() },
        }
    }

    /// Works out what the rules decide for every command of `table` (after the rules
    /// changed; until then the request path walks the rules).
    pub fn settle(&mut self, table: &CommandTable) {
        let all = table.every();
        let words = all.iter().map(|(c, _)| c.id / 64 + 1).max().unwrap_or(0);
        let mut s = Settled {
            unrestricted: self.rules == [CmdRule::All(true)]
                && self.keys.iter().any(|k| k.pattern == b"*" && k.read && k.write)
                && self.channels.iter().any(|c| c == b"*"),
            all_keys: self.keys.iter().any(|k| k.pattern == b"*" && k.read && k.write),
            known: vec![0; words],
            allowed: vec![0; words],
            quick: vec![0; words],
        };
        for (c, _) in &all {
            // (a learned command may be learned again with other categories: walked)
            if table.is_learned(c.id) || self.rules.iter().any(|r| matches!(r, CmdRule::FirstArg(..)) && r.hits(c)) {
                continue;
            }
            s.known[c.id / 64] |= 1 << (c.id % 64);
            if self.allows(c) {
                s.allowed[c.id / 64] |= 1 << (c.id % 64);
                if !matches!(c.route, Route::Subscribe(..)) && !c.has(traits::PUBLISH) {
                    s.quick[c.id / 64] |= 1 << (c.id % 64);
                }
            }
        }
        for sel in &mut self.selectors {
            sel.settle(table);
            // (a selector that allows everything lets the user do anything)
            s.unrestricted |= sel.settled.unrestricted;
        }
        self.settled = s;
    }

    /// Applies one rule, as `ACL SETUSER` does, against the commands of `table`.
    pub fn apply(&mut self, rule: &[u8], table: &CommandTable) -> Result<(), RuleError> {
        let lower = rule.to_ascii_lowercase();
        match lower.as_slice() {
            b"on" => self.enabled = true,
            b"off" => self.enabled = false,
            b"nopass" => {
                self.nopass = true;
                self.passwords.clear();
            }
            b"resetpass" => {
                self.nopass = false;
                self.passwords.clear();
            }
            b"allkeys" => self.keys = vec![KeyPattern::new(b"*", true, true)],
            b"resetkeys" => self.keys.clear(),
            b"allchannels" => self.channels = vec![b"*".to_vec()],
            b"resetchannels" => self.channels.clear(),
            b"allcommands" => self.rules = vec![CmdRule::All(true)],
            b"nocommands" => self.rules = vec![CmdRule::All(false)],
            b"sanitize-payload" => self.sanitize = Some(true),
            b"skip-sanitize-payload" => self.sanitize = Some(false),
            b"clearselectors" => self.selectors.clear(),
            b"reset" => {
                *self = Perms::new();
                self.rules = vec![CmdRule::All(false)];
                self.sanitize = Some(true);
            }
            _ => return self.apply_pattern(rule, table),
        }
        Ok(())
    }

    fn apply_pattern(&mut self, rule: &[u8], table: &CommandTable) -> Result<(), RuleError> {
        let (&first, rest) = rule.split_first().ok_or(RuleError::Syntax)?;
        match first {
            b'>' => {
                let h = hash(rest);
                if !self.passwords.contains(&h) {
                    self.passwords.push(h);
                }
                self.nopass = false;
            }
            b'#' => {
                let h = unhex(rest).ok_or(RuleError::BadHash)?;
                if !self.passwords.contains(&h) {
                    self.passwords.push(h);
                }
                self.nopass = false;
            }
            b'<' | b'!' => {
                let h = if first == b'<' { hash(rest) } else { unhex(rest).ok_or(RuleError::BadHash)? };
                let before = self.passwords.len();
                self.passwords.retain(|p| *p != h);
                if self.passwords.len() == before {
                    return Err(RuleError::NoSuchPassword);
                }
            }
            b'~' => self.add_keys(rest, true, true)?,
            b'%' => {
                let (flags, pattern) = rest.split_at(rest.iter().position(|&c| c == b'~').ok_or(RuleError::Syntax)?);
                let (mut read, mut write) = (false, false);
                for c in flags {
                    match c.to_ascii_uppercase() {
                        b'R' if !read => read = true,
                        b'W' if !write => write = true,
                        _ => return Err(RuleError::Syntax),
                    }
                }
                if !read && !write {
                    return Err(RuleError::Syntax);
                }
                self.add_keys(&pattern[1..], read, write)?;
            }
            b'&' => {
                if self.channels.iter().any(|c| c == b"*") {
                    return Err(RuleError::ChannelsAfterAll);
                }
                if rest.iter().any(u8::is_ascii_whitespace) {
                    return Err(RuleError::Syntax);
                }
                if rest == b"*" {
                    self.channels = vec![b"*".to_vec()];
                } else if !self.channels.iter().any(|c| c == rest) {
                    self.channels.push(rest.to_vec());
                }
            }
            b'+' | b'-' => {
                let allow = first == b'+';
                let rule = if let Some(c) = rest.strip_prefix(b"@") {
                    if c.eq_ignore_ascii_case(b"all") {
                        CmdRule::All(allow)
                    } else {
                        CmdRule::Category(cat::of(c).ok_or(RuleError::Unknown)?, allow)
                    }
                } else {
                    Self::command_rule(rest, allow, table)?
                };
                self.push_rule(rule);
            }
            b'(' if rule.len() > 1 && rule.ends_with(b")") => {
                let mut sel = Perms::new();
                for op in rule[1..rule.len() - 1].split(u8::is_ascii_whitespace).filter(|w| !w.is_empty()) {
                    sel.apply_in_selector(op, table)?;
                }
                self.selectors.push(sel);
            }
            _ => return Err(RuleError::Syntax),
        }
        Ok(())
    }

    /// One rule inside a selector: only command, key and channel rules (Redis 7.0's
    /// `ACLSetSelector`); flags, passwords and selectors are a syntax error there.
    fn apply_in_selector(&mut self, op: &[u8], table: &CommandTable) -> Result<(), RuleError> {
        let lower = op.to_ascii_lowercase();
        match lower.as_slice() {
            b"allkeys" | b"resetkeys" | b"allchannels" | b"resetchannels" | b"allcommands" | b"nocommands" => {
                self.apply(op, table)
            }
            [b'~' | b'%' | b'&' | b'+' | b'-', ..] => self.apply_pattern(op, table),
            _ => Err(RuleError::Syntax),
        }
    }

    /// `+name`, `-name`, `+name|sub`, `-name|sub` or `+name|first-arg`, as Redis 7.0 takes
    /// them: the part after the last `|` is a subcommand where the command has any, a
    /// first argument (allowed only) where it has none.
    fn command_rule(rest: &[u8], allow: bool, table: &CommandTable) -> Result<CmdRule, RuleError> {
        let name = String::from_utf8_lossy(rest).to_ascii_uppercase();
        let known = |n: &str| match n.split_once('|') {
            Some((p, s)) => table.get(p.as_bytes()).and_then(|c| c.sub(s.as_bytes())).is_some(),
            None => table.get(n.as_bytes()).is_some(),
        };
        let Some((parent, arg)) = name.rsplit_once('|') else {
            return if known(&name) { Ok(CmdRule::Command(name, allow)) } else { Err(RuleError::Unknown) };
        };
        if !allow {
            return if known(&name) { Ok(CmdRule::Sub(name, false)) } else { Err(RuleError::Unknown) };
        }
        if !known(parent) {
            return Err(RuleError::Unknown);
        }
        if parent.contains('|') {
            return Err(RuleError::FirstArgOfSub);
        }
        if arg.is_empty() {
            return Err(RuleError::Syntax);
        }
        let cmd = table.get(parent.as_bytes()).ok_or(RuleError::Unknown)?;
        if cmd.has_subcommands() {
            return if known(&name) { Ok(CmdRule::Sub(name, true)) } else { Err(RuleError::Unknown) };
        }
        let given = &rest[rest.len() - arg.len()..];
        Ok(CmdRule::FirstArg(parent.to_string(), given.to_vec()))
    }

    /// Adds `rule` after dropping the rules it makes count for nothing (all of them for
    /// `+@all` / `-@all`): a user's rules stay as many as the commands and categories.
    fn push_rule(&mut self, rule: CmdRule) {
        if let CmdRule::All(_) = rule {
            self.rules.clear();
        } else {
            self.rules.retain(|r| !rule.supersedes(r));
        }
        self.rules.push(rule);
    }

    fn add_keys(&mut self, pattern: &[u8], read: bool, write: bool) -> Result<(), RuleError> {
        if pattern.iter().any(u8::is_ascii_whitespace) {
            return Err(RuleError::Syntax);
        }
        if self.keys.iter().any(|k| k.pattern == b"*" && k.read && k.write) {
            return Err(RuleError::KeysAfterAll);
        }
        if pattern == b"*" && read && write {
            self.keys = vec![KeyPattern::new(b"*", read, write)];
        } else if let Some(k) = self.keys.iter_mut().find(|k| k.pattern == pattern) {
            k.read |= read;
            k.write |= write;
        } else {
            self.keys.push(KeyPattern::new(pattern, read, write));
        }
        Ok(())
    }

    /// Whether the user may run `cmd` (a subcommand's own [`Command`] for a container's)
    /// with `first` as its first argument.
    pub fn may_run(&self, cmd: &Command, first: Option<&[u8]>) -> bool {
        let mut allowed = false;
        for r in &self.rules {
            match r {
                CmdRule::FirstArg(_, arg) => {
                    if r.hits(cmd) && first.is_some_and(|f| f.eq_ignore_ascii_case(arg)) {
                        allowed = true;
                    }
                }
                CmdRule::All(a) | CmdRule::Category(_, a) | CmdRule::Command(_, a) | CmdRule::Sub(_, a) => {
                    if r.hits(cmd) {
                        allowed = *a;
                    }
                }
            }
        }
        allowed
    }

    /// Whether `cmd` is allowed whatever its arguments (its bit in Redis's bitmap).
    fn allows(&self, cmd: &Command) -> bool {
        self.rules.iter().filter(|r| !matches!(r, CmdRule::FirstArg(..)) && r.hits(cmd)).last().is_some_and(|r| {
            matches!(
                r,
                CmdRule::All(true) | CmdRule::Category(_, true) | CmdRule::Command(_, true) | CmdRule::Sub(_, true)
            )
        })
    }

    /// The first arguments `cmd` is allowed with (those given since the last rule that
    /// decided for the whole command).
    fn first_args(&self, cmd: &Command) -> Vec<&[u8]> {
        let from =
            self.rules.iter().rposition(|r| !matches!(r, CmdRule::FirstArg(..)) && r.hits(cmd)).map_or(0, |i| i + 1);
        let mut out: Vec<&[u8]> = Vec::new();
        for r in &self.rules[from..] {
            if let CmdRule::FirstArg(_, arg) = r
                && r.hits(cmd)
                && !out.iter().any(|a| a.eq_ignore_ascii_case(arg))
            {
                out.push(arg);
            }
        }
        out
    }

    /// Every key may be touched (`allkeys`, `~*`).
    fn all_keys(&self) -> bool {
        self.settled.all_keys
    }

    /// Whether the user may touch `key` as `need` says (`key::ACCESS`: read,
    /// `key::CHANGE`: write; neither: any pattern that matches will do). As on Redis, one
    /// pattern must allow all of it.
    /// (Inlined, and a plain loop: `Iter::any` over the patterns compiled to a call of its
    /// own on the quick look's path, [`Perms::allows_quickly`].)
    #[inline(always)]
    pub fn may_touch(&self, key: &[u8], need: u8) -> bool {
        let (read, write) = (need & key::ACCESS != 0, need & key::CHANGE != 0);
        if self.all_keys() {
            return true;
        }
        for k in &self.keys {
            if (!read || k.read) && (!write || k.write) && k.glob.matches(key) {
                return true;
            }
        }
        false
    }

    /// Whether the user may run `req` (resolved to `cmd`): allowed when the root rules or
    /// one selector allow all of it (command, keys and channels). Refused, the refusal
    /// Redis 7.0 reports (`ACLCheckAllUserCommandPerm`): of the root's and every selector's,
    /// the channel before the key before the command, and of two alike the later argument.
    #[inline]
    pub fn check(&self, cmd: &Command, req: &Request) -> Result<(), Denial> {
        let root = self.check_one(cmd, req);
        if root.is_ok() || self.selectors.is_empty() {
            return root;
        }
        self.check_selectors(cmd, req, root)
    }

    /// Whether the root's rules surely allow `req` (resolved to `cmd`), decided without
    /// listing keys: a command whose verdict is settled and allowed, with no channel, and
    /// either every key allowed or its one key at a fixed place matching a key pattern (for
    /// reading and writing both, where the arguments decide which: SET, BITFIELD).
    /// False means "not decided here", not "refused": [`Perms::check`] then decides (and
    /// names the refusal). `tagged_key_unsure`: a key starting with `{` is not decided
    /// here (under colocation it may be a stored name, taken back to the client's before
    /// the check). What most requests of a restricted user cost: two bit tests and one
    /// pattern, instead of a walk over the command's keys and channels.
    #[inline(always)]
    pub fn allows_quickly(&self, cmd: &Command, req: &Request, tagged_key_unsure: bool) -> bool {
        if !Settled::bit(&self.settled.quick, cmd.id) {
            return false;
        }
        if self.all_keys() {
            return true;
        }
        let (k, need) = match crate::command::acl_key_at(cmd) {
            Some(at) => at,
            // (the arguments decide what the key is checked for: a pattern allowing both
            // allows it either way)
            None => match crate::command::acl_key_place(cmd) {
                Some(k) => (k, key::ACCESS | key::CHANGE),
                None => return false,
            },
        };
        if k as usize >= req.argc() {
            return false;
        }
        let key = req.arg(k as usize);
        if tagged_key_unsure && key.first() == Some(&b'{') {
            return false;
        }
        self.may_touch(key, need)
    }

    /// [`Perms::check`] once the root's rules refused: the selectors'.
    #[inline(never)]
    fn check_selectors(&self, cmd: &Command, req: &Request, root: Result<(), Denial>) -> Result<(), Denial> {
        let rank = |d: &Denial| {
            let why = match d.why {
                Denied::Command => 1,
                Denied::Key => 2,
                Denied::Channel => 4,
            };
            (why, d.arg)
        };
        let mut relevant = root.unwrap_err();
        for sel in &self.selectors {
            match sel.check_one(cmd, req) {
                Ok(()) => return Ok(()),
                Err(d) if rank(&d) > rank(&relevant) => relevant = d,
                Err(_) => {}
            }
        }
        Err(relevant)
    }

    /// [`Perms::check`] by these rules alone (the root's, or one selector's): the command,
    /// then each of its keys, then its channels, as Redis checks them; the first refusal.
    #[inline]
    fn check_one(&self, cmd: &Command, req: &Request) -> Result<(), Denial> {
        // (AUTH, HELLO and RESET, which need no login, need no permission either)
        let may_run = if Settled::bit(&self.settled.known, cmd.id) {
            Settled::bit(&self.settled.allowed, cmd.id)
        } else {
            self.may_run(cmd, (req.argc() > 1).then(|| req.arg(1)))
        };
        if cmd.flags & crate::command::flags::NO_AUTH == 0 && !may_run {
            return Err(Denial { why: Denied::Command, arg: 0 });
        }
        if !self.all_keys() {
            // (most commands: one key at a fixed place, checked without listing keys)
            if let Some((k, need)) = crate::command::acl_key_at(cmd) {
                if (k as usize) < req.argc() && !self.may_touch(req.arg(k as usize), need) {
                    return Err(Denial { why: Denied::Key, arg: k as usize });
                }
            } else {
                for (k, need) in crate::command::acl_keys(cmd, req) {
                    if !self.may_touch(req.arg(k as usize), need) {
                        return Err(Denial { why: Denied::Key, arg: k as usize });
                    }
                }
            }
        }
        // (a shard channel is routed like a key, and checked as a channel only, as on Redis)
        let channels = match cmd.route {
            Route::Subscribe(kind, true) => Some((req.argc(), kind == crate::command::ChannelKind::Pattern)),
            _ if cmd.has(traits::PUBLISH) => Some((2.min(req.argc()), false)),
            _ => None,
        };
        if let Some((end, pattern)) = channels
            && let Some(i) = (1..end).find(|&i| !self.may_use_channel(req.arg(i), pattern))
        {
            return Err(Denial { why: Denied::Channel, arg: i });
        }
        Ok(())
    }

    /// Whether the user may use `channel` (`pattern`: a PSUBSCRIBE pattern, which must be
    /// one of the user's patterns literally, as on Redis).
    pub fn may_use_channel(&self, channel: &[u8], pattern: bool) -> bool {
        self.channels
            .iter()
            .any(|c| c == b"*" || if pattern { c == channel } else { crate::glob::matches(c, channel, false) })
    }

    /// Everything allowed: no check is needed on the request path.
    #[inline]
    pub fn unrestricted(&self) -> bool {
        self.settled.unrestricted
    }

    /// Whether `password` logs this user in.
    pub fn accepts(&self, password: &[u8]) -> bool {
        self.enabled && (self.nopass || self.passwords.contains(&hash(password)))
    }

    /// The command rules as Redis 7.0 shows them (`ACLDescribeSelectorCommandRules`):
    /// rebuilt from what they allow, not as given. `+@all` or `-@all` (whichever came
    /// last), then the categories that best fit, chosen one at a time, then each command
    /// and subcommand that still differs, then the first arguments of commands not
    /// allowed whole. (Redis lists the single commands in its hash table's order;
    /// heatshield by name.)
    pub fn command_rules(&self, table: &CommandTable) -> String {
        let all = table.every();
        let user: Vec<bool> = all.iter().map(|(c, _)| self.allows(c)).collect();
        let future = matches!(self.rules.iter().rev().find(|r| matches!(r, CmdRule::All(_))), Some(CmdRule::All(true)));
        let additive = !future;
        let mut fake = vec![future; all.len()];
        let mut temp = user.clone();
        let mut out: Vec<String> = vec![if future { "+@all" } else { "-@all" }.into()];
        // a category's rule on a bitmap: a command in it with all its subcommands, and
        // each subcommand in it
        let set_category = |bits: &mut Vec<bool>, bit: u32, value: bool| {
            for (i, (c, parent)) in all.iter().enumerate() {
                let in_it = c.acl & bit != 0 || parent.is_some_and(|p| all[p].0.acl & bit != 0);
                if in_it {
                    bits[i] = value;
                }
            }
        };
        let mut applied = [false; cat::NAMES.len()];
        loop {
            let mut best = None;
            let (mut min_diff, mut max_same) = (usize::MAX, 0);
            for (j, done) in applied.iter().enumerate() {
                if *done {
                    continue;
                }
                let bit = 1u32 << j;
                let (mut on, mut off) = (0, 0);
                for (i, (c, _)) in all.iter().enumerate() {
                    if c.acl & bit != 0 {
                        if temp[i] {
                            on += 1;
                        } else {
                            off += 1;
                        }
                    }
                }
                let (diff, same) = if additive { (off, on) } else { (on, off) };
                if same > diff && (diff < min_diff || (diff == min_diff && same > max_same)) {
                    best = Some(j);
                    (min_diff, max_same) = (diff, same);
                }
            }
            let Some(j) = best else { break };
            set_category(&mut fake, 1 << j, additive);
            set_category(&mut temp, 1 << j, !additive);
            out.push(format!("{}@{}", if additive { '+' } else { '-' }, cat::NAMES[j]));
            applied[j] = true;
        }
        for (i, (c, parent)) in all.iter().enumerate() {
            if user[i] != fake[i] {
                out.push(format!("{}{}", if user[i] { '+' } else { '-' }, c.lower));
                fake[i] = user[i];
                if parent.is_none() {
                    // (a command's rule reaches its subcommands, which come right after it)
                    for (f, (_, p)) in fake.iter_mut().zip(&all).skip(i + 1) {
                        if *p != Some(i) {
                            break;
                        }
                        *f = user[i];
                    }
                }
            }
            if !user[i] {
                for arg in self.first_args(c) {
                    out.push(format!("+{}|{}", c.lower, String::from_utf8_lossy(arg)));
                }
            }
        }
        out.join(" ")
    }

    /// The key patterns as text (`~a:* %R~b:*`).
    pub fn key_rules(&self) -> String {
        let one = |k: &KeyPattern| {
            let p = String::from_utf8_lossy(&k.pattern);
            match (k.read, k.write) {
                (true, true) => format!("~{p}"),
                (true, false) => format!("%R~{p}"),
                _ => format!("%W~{p}"),
            }
        };
        self.keys.iter().map(one).collect::<Vec<_>>().join(" ")
    }

    /// The channel patterns as text (`&*`, or `&news &sport`).
    pub fn channel_rules(&self) -> String {
        self.channels.iter().map(|c| format!("&{}", String::from_utf8_lossy(c))).collect::<Vec<_>>().join(" ")
    }

    /// The flags as `ACL GETUSER` lists them.
    pub fn flags(&self) -> Vec<&'static str> {
        let mut flags = vec![if self.enabled { "on" } else { "off" }];
        if self.nopass {
            flags.push("nopass");
        }
        match self.sanitize {
            Some(false) => flags.push("skip-sanitize-payload"),
            Some(true) => flags.push("sanitize-payload"),
            None => {}
        }
        flags
    }

    /// The user as `ACL LIST` shows it, without `user <name> ` (Redis 7.0's order): flags,
    /// passwords, the root rules, then each selector in parentheses.
    pub fn describe(&self, table: &CommandTable) -> String {
        let mut parts: Vec<String> = self.flags().iter().map(|f| f.to_string()).collect();
        parts.extend(self.passwords.iter().map(|h| format!("#{}", hex(h))));
        parts.push(self.describe_rules(table));
        for sel in &self.selectors {
            parts.push(format!("({})", sel.describe_rules(table)));
        }
        parts.join(" ")
    }

    /// The key, channel and command rules as `ACL LIST` shows them (Redis 7.0's
    /// `ACLDescribeSelector`).
    pub fn describe_rules(&self, table: &CommandTable) -> String {
        let mut parts: Vec<String> = Vec::new();
        if !self.keys.is_empty() {
            parts.push(self.key_rules());
        }
        if self.channels.iter().any(|c| c == b"*") {
            parts.push("&*".into());
        } else {
            parts.push("resetchannels".into());
            if !self.channels.is_empty() {
                parts.push(self.channel_rules());
            }
        }
        parts.push(self.command_rules(table));
        parts.join(" ")
    }
}

/// The rules with each selector made one again (Redis 7.0's `ACLMergeSelectorArguments`): a
/// rule that opens with `(` and does not close it takes the rules after it, joined by
/// spaces, up to one that ends with `)`; another such opening starts afresh. A selector
/// left open is Redis's error.
fn merge_selectors<'r>(rules: &[&'r [u8]]) -> Result<Vec<std::borrow::Cow<'r, [u8]>>, String> {
    use std::borrow::Cow;
    let mut out = Vec::with_capacity(rules.len());
    let mut open: Option<(usize, Vec<u8>)> = None;
    for (i, &r) in rules.iter().enumerate() {
        if r.starts_with(b"(") && !r.ends_with(b")") {
            // (one opened while another is open starts afresh, as on Redis)
            open = Some((i, r.to_vec()));
        } else if let Some((_, sel)) = &mut open {
            sel.push(b' ');
            sel.extend_from_slice(r);
            if r.ends_with(b")") {
                out.push(Cow::Owned(open.take().map(|(_, s)| s).unwrap_or_default()));
            }
        } else {
            out.push(Cow::Borrowed(r));
        }
    }
    match open {
        Some((i, _)) => Err(format!(
            "ERR Unmatched parenthesis in acl selector starting at '{}'.",
            String::from_utf8_lossy(rules[i])
        )),
        None => Ok(out),
    }
}

/// A user: its name and its permissions, swapped whole on change.
#[derive(Debug)]
pub struct User {
    pub name: String,
    perms: ArcSwap<Perms>,
    /// Counts the changes of `perms` (a session keeps the permissions it saw last, and
    /// looks again only when this moved: [`User::perms_cached`]).
    changes: std::sync::atomic::AtomicU64,
}

/// A session's copy of its user's permissions, as of a change count ([`User::perms_cached`]).
pub type PermsSeen = Option<(usize, u64, Arc<Perms>)>;

impl User {
    pub fn new(name: &str, perms: Perms) -> User {
        User { name: name.to_string(), perms: ArcSwap::from_pointee(perms), changes: Default::default() }
    }

    /// The permissions now, from `seen` while they have not changed since it was taken
    /// (one relaxed load on the request path instead of an `ArcSwap` load), else taken
    /// anew into it.
    #[inline(always)]
    pub fn perms_cached<'s>(self: &Arc<User>, seen: &'s mut PermsSeen) -> &'s Perms {
        let key = (Arc::as_ptr(self) as usize, self.changes.load(std::sync::atomic::Ordering::Acquire));
        if !matches!(seen, Some((p, c, _)) if (*p, *c) == key) {
            *seen = Some((key.0, key.1, self.perms.load_full()));
        }
        match seen {
            Some((_, _, p)) => p,
            None => unreachable!("set just above"),
        }
    }

    /// The permissions now.
    /// Counts the changes of its permissions.
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn perms(&self) -> arc_swap::Guard<Arc<Perms>> {
        self.perms.load()
    }

    pub fn set(&self, perms: Perms) {
        self.perms.store(Arc::new(perms));
        self.changes.fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

/// One `ACL LOG` entry: refusals alike (reason, context, object, user) within a minute
/// of each other are one entry with a count.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub count: u64,
    /// `command`, `key`, `channel` or `auth`.
    pub reason: &'static str,
    /// `toplevel` or `multi`.
    pub context: &'static str,
    /// The command (`get`, `object|encoding`), key or channel refused, or `auth`.
    pub object: Vec<u8>,
    /// The user refused, or the name given to AUTH.
    pub username: String,
    /// When it last happened.
    pub at: std::time::Instant,
    /// The client's `CLIENT LIST` line when it last happened.
    pub client_info: String,
}

/// The ACL log, newest first, at most [`Log::MAX`] entries (Redis's `acllog-max-len`).
#[derive(Debug, Default)]
pub struct Log {
    entries: parking_lot::Mutex<std::collections::VecDeque<LogEntry>>,
}

impl Log {
    /// Entries kept.
    pub const MAX: usize = 128;
    /// Longest object kept (a longer key or channel is cut: a client's request cannot
    /// fill the log with large keys).
    pub const MAX_OBJECT: usize = 1024;

    /// Logs a refusal (or counts it on an entry alike from the last minute, among the
    /// ten newest, as Redis does).
    pub fn add(&self, reason: &'static str, context: &'static str, object: &[u8], username: &str, client_info: String) {
        let object = &object[..object.len().min(Self::MAX_OBJECT)];
        let now = std::time::Instant::now();
        let mut entries = self.entries.lock();
        let alike = entries.iter().take(10).position(|e| {
            e.reason == reason
                && e.context == context
                && e.object == object
                && e.username == username
                && now.duration_since(e.at) <= std::time::Duration::from_secs(60)
        });
        if let Some(mut e) = alike.and_then(|i| entries.remove(i)) {
            e.count += 1;
            e.at = now;
            e.client_info = client_info;
            entries.push_front(e);
        } else {
            let username = username.chars().take(Self::MAX_OBJECT).collect();
            entries.push_front(LogEntry {
                count: 1,
                reason,
                context,
                object: object.to_vec(),
                username,
                at: now,
                client_info,
            });
            entries.truncate(Self::MAX);
        }
    }

    /// The newest `n` entries (all of them when `None`).
    pub fn newest(&self, n: Option<usize>) -> Vec<LogEntry> {
        let entries = self.entries.lock();
        entries.iter().take(n.unwrap_or(usize::MAX)).cloned().collect()
    }

    /// `ACL LOG RESET`.
    pub fn reset(&self) {
        self.entries.lock().clear();
    }
}

/// Failed logins by client address: a bucket of `per_minute` failures per address,
/// refilled evenly over a minute. An address with an empty bucket is refused without its
/// password being checked, so guessing goes no faster than the bucket refills. Held in a
/// bounded cache (addresses idle for ten minutes are forgotten; past 100,000 addresses
/// the least used are).
pub struct AuthLimiter {
    /// Changed by a reload (`set`).
    per_minute: std::sync::atomic::AtomicU32,
    buckets: moka::sync::Cache<std::net::IpAddr, Arc<parking_lot::Mutex<(f64, std::time::Instant)>>>,
}

impl std::fmt::Debug for AuthLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthLimiter").field("per_minute", &self.limit()).finish()
    }
}

impl AuthLimiter {
    pub fn new(per_minute: u32) -> AuthLimiter {
        let buckets = moka::sync::Cache::builder()
            .max_capacity(100_000)
            .time_to_idle(std::time::Duration::from_secs(600))
            .build();
        AuthLimiter { per_minute: per_minute.into(), buckets }
    }

    fn limit(&self) -> u32 {
        self.per_minute.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A new limit (a reload): buckets refill up to it from now on.
    pub fn set(&self, per_minute: u32) {
        self.per_minute.store(per_minute, std::sync::atomic::Ordering::Relaxed);
    }

    fn bucket(&self, addr: std::net::IpAddr) -> Arc<parking_lot::Mutex<(f64, std::time::Instant)>> {
        let full = self.limit() as f64;
        self.buckets.get_with(addr, || Arc::new(parking_lot::Mutex::new((full, std::time::Instant::now()))))
    }

    /// The failures left to `addr` now (refilled since last asked).
    fn left(&self, b: &mut (f64, std::time::Instant)) -> f64 {
        let now = std::time::Instant::now();
        let limit = self.limit() as f64;
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * limit / 60.0).min(limit);
        b.1 = now;
        b.0
    }

    /// Whether `addr` may try to log in now.
    pub fn may_try(&self, addr: Option<std::net::IpAddr>) -> bool {
        let Some(addr) = addr.filter(|_| self.limit() > 0) else { return true };
        let b = self.bucket(addr);
        let mut b = b.lock();
        self.left(&mut b) >= 1.0
    }

    /// A failed login from `addr`.
    pub fn failed(&self, addr: Option<std::net::IpAddr>) {
        let Some(addr) = addr.filter(|_| self.limit() > 0) else { return };
        let b = self.bucket(addr);
        let mut b = b.lock();
        let left = self.left(&mut b);
        b.0 = (left - 1.0).max(0.0);
    }
}

/// Every user, by name.
#[derive(Debug, Default)]
pub struct Users {
    /// `ACL LOG`.
    pub log: Log,
    users: parking_lot::RwLock<BTreeMap<String, Arc<User>>>,
    /// Some user may not do everything: only then are requests checked (one relaxed
    /// load a request otherwise).
    restricted: std::sync::atomic::AtomicBool,
}

impl Users {
    /// The users of `lines` (each `name rule ...`, as ACL SETUSER takes them), with the
    /// `default` user first made with `password` (`server.password`) and everything
    /// allowed. A line's rules apply to the user as it stands, so a line for `default`
    /// changes it.
    pub fn from_config(lines: &[String], password: Option<&str>, table: &CommandTable) -> Result<Users, String> {
        let users = Users::default();
        users.users.write().insert("default".into(), Arc::new(User::new("default", Perms::everything(password))));
        users.note_restricted(&users.users.read());
        for line in lines {
            let mut words = line.split_ascii_whitespace();
            let Some(name) = words.next() else { continue };
            let rules: Vec<&[u8]> = words.map(str::as_bytes).collect();
            users.set_user(name, &rules, table).map_err(|e| format!("user '{name}': {e}"))?;
        }
        Ok(users)
    }

    pub fn get(&self, name: &str) -> Option<Arc<User>> {
        self.users.read().get(name).cloned()
    }

    /// The `default` user (always there: DELUSER refuses to remove it).
    pub fn default_user(&self) -> Arc<User> {
        self.get("default").unwrap_or_else(|| Arc::new(User::new("default", Perms::everything(None))))
    }

    /// Whether some user may not do everything (requests must be checked).
    #[inline]
    pub fn restricted(&self) -> bool {
        self.restricted.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn note_restricted(&self, users: &BTreeMap<String, Arc<User>>) {
        let any = users.values().any(|u| !u.perms().unrestricted());
        self.restricted.store(any, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every user (`ACL LIST`), sorted by name.
    pub fn all(&self) -> Vec<Arc<User>> {
        self.users.read().values().cloned().collect()
    }

    /// `ACL SETUSER`: every rule applies, or none does (the first refused is the error,
    /// in Redis's words). Returns the user.
    pub fn set_user(&self, name: &str, rules: &[&[u8]], table: &CommandTable) -> Result<Arc<User>, String> {
        let rules = merge_selectors(rules)?;
        let mut users = self.users.write();
        let mut perms = users.get(name).map(|u| (**u.perms()).clone()).unwrap_or_default();
        for r in &rules {
            perms.apply(r, table).map_err(|e| e.reply(r))?;
        }
        perms.settle(table);
        let user = match users.get(name) {
            Some(u) => {
                u.set(perms);
                u.clone()
            }
            None => {
                let u = Arc::new(User::new(name, perms));
                users.insert(name.to_string(), u.clone());
                u
            }
        };
        self.note_restricted(&users);
        Ok(user)
    }

    /// `ACL DELUSER`: removes the users named (never `default`); returns those removed.
    pub fn delete(&self, names: &[&str]) -> Vec<Arc<User>> {
        let mut users = self.users.write();
        let gone = names.iter().filter(|n| **n != "default").filter_map(|n| users.remove(*n)).collect();
        self.note_restricted(&users);
        gone
    }

    /// Takes the users of `other` (a reload): a user that stays keeps its identity with
    /// the new permissions (its connections see them at their next command), new users
    /// are added, and the others are removed; returns those removed.
    pub fn replace(&self, other: Users) -> Vec<Arc<User>> {
        let mut users = self.users.write();
        let mut new = std::mem::take(&mut *other.users.write());
        let gone: Vec<Arc<User>> = users.values().filter(|u| !new.contains_key(&u.name)).cloned().collect();
        for (name, u) in std::mem::take(&mut new) {
            match users.get(&name) {
                Some(old) => old.set((**u.perms()).clone()),
                None => {
                    users.insert(name, u);
                }
            }
        }
        for g in &gone {
            users.remove(&g.name);
        }
        self.note_restricted(&users);
        gone
    }

    /// The names, sorted (`ACL USERS`).
    pub fn names(&self) -> Vec<String> {
        self.users.read().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> CommandTable {
        CommandTable::new()
    }

    fn perms(rules: &[&str]) -> Result<Perms, String> {
        let t = table();
        let mut p = Perms::new();
        for r in rules {
            p.apply(r.as_bytes(), &t).map_err(|e| e.reply(r.as_bytes()))?;
        }
        p.settle(&t);
        Ok(p)
    }

    fn cmd<'t>(t: &'t CommandTable, name: &str) -> &'t Command {
        match name.split_once('|') {
            Some((p, s)) => t.get(p.as_bytes()).and_then(|c| c.sub(s.as_bytes())).unwrap(),
            None => t.get(name.as_bytes()).unwrap(),
        }
    }

    #[test]
    fn the_last_rule_that_matches_decides() {
        let t = table();
        let p = perms(&["on", "+@all", "-@dangerous", "+flushdb", "-client|kill"]).unwrap();
        assert!(p.may_run(cmd(&t, "GET"), None));
        assert!(!p.may_run(cmd(&t, "FLUSHALL"), None), "@dangerous");
        assert!(p.may_run(cmd(&t, "FLUSHDB"), None), "allowed again after the category");
        assert!(!p.may_run(cmd(&t, "CLIENT|KILL"), None));
        assert!(p.may_run(cmd(&t, "CLIENT|SETNAME"), None));
        let p = perms(&["+@read", "-get", "+client"]).unwrap();
        assert!(
            p.may_run(cmd(&t, "HGET"), None) && !p.may_run(cmd(&t, "GET"), None) && !p.may_run(cmd(&t, "SET"), None)
        );
        assert!(p.may_run(cmd(&t, "CLIENT|KILL"), None), "+client allows every subcommand");
        assert!(!perms(&[]).unwrap().may_run(cmd(&t, "PING"), None), "a new user may run nothing");
        let p = perms(&["+@all", "-@proxy", "-@lock"]).unwrap();
        assert!(
            !p.may_run(cmd(&t, "PROXY"), None)
                && !p.may_run(cmd(&t, "LOCK.ACQUIRE"), None)
                && p.may_run(cmd(&t, "SET"), None)
        );
    }

    #[test]
    fn keys_and_channels() {
        let p = perms(&["~app:*", "%R~shared:*", "%W~log:*", "&news.*"]).unwrap();
        assert!(p.may_touch(b"app:1", key::ACCESS | key::CHANGE));
        assert!(p.may_touch(b"shared:x", key::ACCESS) && !p.may_touch(b"shared:x", key::CHANGE));
        assert!(p.may_touch(b"log:1", key::CHANGE) && !p.may_touch(b"log:1", key::ACCESS));
        assert!(!p.may_touch(b"other", key::ACCESS));
        assert!(p.may_use_channel(b"news.sport", false) && !p.may_use_channel(b"weather", false));
        assert!(p.may_use_channel(b"news.*", true) && !p.may_use_channel(b"news.s*", true));
        let p = perms(&["allkeys", "allchannels", "allcommands"]).unwrap();
        assert!(p.unrestricted());
        assert!(!perms(&["allkeys", "allchannels", "+@all", "-debug"]).unwrap().unrestricted());
    }

    fn req(args: &str) -> Request {
        Request::from_args(&args.split(' ').collect::<Vec<_>>())
    }

    fn check(p: &Perms, t: &CommandTable, args: &str) -> Result<(), (Denied, usize)> {
        let r = req(args);
        let c = t.lookup(&r).unwrap();
        p.check(c, &r).map_err(|d| (d.why, d.arg))
    }

    #[test]
    fn the_quick_look_never_allows_what_the_whole_check_refuses() {
        let t = table();
        let users: &[&[&str]] = &[
            &["+@all", "~key:*", "~counter:*"],
            &["+@all", "%R~r*", "%W~w*", "~rw*"],
            &["+@read", "~a:*"],
            &["+get", "+set", "~d:*"],
            &["+@all", "-get", "~*"],
            &["+@all", "allkeys", "&news:*"],
            &["+@all", "resetchannels", "~k*"],
            &["+@all", "~{rq}*"],
            &["+client|setname", "+config|get", "~*"],
            &["-@all", "~*"],
            &["+@all", "~k*", "(+get ~other*)"],
        ];
        let reqs = [
            "GET key:1",
            "SET key:1 v",
            "SET key:1 v GET",
            "GET other",
            "GET r1",
            "GET w1",
            "SET w1 x",
            "INCR w1",
            "INCR rw1",
            "GET a:1",
            "SET a:1 v",
            "GET d:1",
            "HGET d:1 f",
            "PUBLISH news:1 m",
            "PUBLISH other m",
            "SPUBLISH news:1 m",
            "SUBSCRIBE news:1",
            "MGET key:1 other",
            "MSET key:1 v other v",
            "DEL key:1",
            "GET",
            "GET {rq}x",
            "CLIENT SETNAME x",
            "CONFIG GET maxmemory",
            "EVAL return 1 1 key:1",
            "PING",
        ];
        let mut decided = 0;
        for rules in users {
            let p = perms(rules).unwrap();
            for args in reqs {
                let r = req(args);
                let Ok(c) = t.lookup(&r) else { continue };
                for tagged in [false, true] {
                    let quick = p.allows_quickly(c, &r, tagged);
                    if quick {
                        decided += 1;
                        assert_eq!(p.check(c, &r), Ok(()), "{rules:?} {args} (tagged keys unsure: {tagged})");
                    }
                }
            }
        }
        // it decides the common cases (what it exists for), not nothing
        let p = perms(users[0]).unwrap();
        for args in ["GET key:1", "SET key:1 v", "INCR counter:9"] {
            let r = req(args);
            assert!(p.allows_quickly(t.lookup(&r).unwrap(), &r, true), "{args}");
        }
        let r = req("GET {rq}x");
        let p = perms(users[7]).unwrap();
        assert!(!p.allows_quickly(t.lookup(&r).unwrap(), &r, true), "a tagged key is left to the whole check");
        assert!(p.allows_quickly(t.lookup(&r).unwrap(), &r, false));
        assert!(decided > 40, "{decided}");
    }

    #[test]
    fn each_key_is_checked_for_what_its_key_spec_says() {
        let t = table();
        let p = perms(&["+@all", "%R~r*", "%W~w*", "~rw*"]).unwrap();
        assert_eq!(check(&p, &t, "GET r1"), Ok(()));
        assert_eq!(check(&p, &t, "GET w1"), Err((Denied::Key, 1)));
        assert_eq!(check(&p, &t, "SET w1 x"), Ok(()), "SET without GET only writes");
        assert_eq!(check(&p, &t, "SET w1 x GET"), Err((Denied::Key, 1)), "SET ... GET reads too");
        assert_eq!(check(&p, &t, "INCR w1"), Err((Denied::Key, 1)), "INCR reads and writes");
        assert_eq!(check(&p, &t, "INCR rw1"), Ok(()));
        assert_eq!(check(&p, &t, "EXISTS w1"), Ok(()), "EXISTS neither reads nor writes the value");
        assert_eq!(check(&p, &t, "EXISTS other"), Err((Denied::Key, 1)));
        assert_eq!(check(&p, &t, "COPY r1 w1"), Ok(()));
        assert_eq!(check(&p, &t, "COPY w1 r1"), Err((Denied::Key, 1)));
        assert_eq!(check(&p, &t, "LMOVE r1 w1 LEFT RIGHT"), Err((Denied::Key, 1)), "the source is also written");
        assert_eq!(check(&p, &t, "SORT r1 STORE w1"), Ok(()));
        assert_eq!(check(&p, &t, "SORT r1 STORE r2"), Err((Denied::Key, 3)));
        assert_eq!(check(&p, &t, "BITFIELD r1 GET u8 0"), Ok(()));
        assert_eq!(check(&p, &t, "BITFIELD r1 SET u8 0 1"), Err((Denied::Key, 1)));
        assert_eq!(check(&p, &t, "ZUNIONSTORE w1 2 r1 r2"), Ok(()));
        assert_eq!(check(&p, &t, "EVAL x 2 rw1 r1"), Err((Denied::Key, 4)), "a script's keys are read and written");
        assert_eq!(check(&p, &t, "MGET r1 r2 w3"), Err((Denied::Key, 3)));
        let p = perms(&["+@all", "%R~a", "%W~a"]).unwrap();
        assert_eq!(p.key_rules(), "~a", "the same pattern twice is one");
        let p = perms(&["+@all", "allkeys", "&news"]).unwrap();
        assert_eq!(check(&p, &t, "PUBLISH news x"), Ok(()));
        assert_eq!(check(&p, &t, "SUBSCRIBE news sport"), Err((Denied::Channel, 2)));
        assert_eq!(check(&p, &t, "SPUBLISH sport x"), Err((Denied::Channel, 1)));
    }

    #[test]
    fn first_arguments_and_the_rules_as_redis_7_0_shows_them() {
        let t = table();
        let p = perms(&["-@all", "+select|0", "+config|get"]).unwrap();
        assert_eq!(check(&p, &t, "SELECT 0"), Ok(()));
        assert_eq!(check(&p, &t, "SELECT 1"), Err((Denied::Command, 0)));
        assert_eq!(check(&p, &t, "CONFIG GET x"), Ok(()));
        assert_eq!(check(&p, &t, "CONFIG SET x y"), Err((Denied::Command, 0)));
        assert!(perms(&["-select|0"]).unwrap_err().ends_with("Unknown command or category name in ACL"));
        assert!(
            perms(&["+client|kill|x"]).unwrap_err().ends_with("Allowing first-arg of a subcommand is not supported")
        );
        assert!(perms(&["+acl|nosuch"]).unwrap_err().ends_with("Unknown command or category name in ACL"));
        // what Redis 7.0.15 answers for the same rules
        let shown = |r: &[&str]| perms(r).unwrap().command_rules(&t);
        assert_eq!(shown(&["+@all", "-get", "+get"]), "+@all");
        assert_eq!(shown(&["+@all", "-get", "+get", "-set"]), "+@all -set");
        assert_eq!(shown(&["-@all", "+client|kill"]), "-@all +client|kill");
        assert_eq!(shown(&["+@all", "-client", "+client|kill"]), "+@all -client +client|kill");
        assert_eq!(shown(&["+@all", "+select|0"]), "+@all");
        assert_eq!(shown(&["-@all", "+select|0", "+@read"]), "-@all +@read +select|0");
        assert_eq!(shown(&["-@all", "+get", "+@read"]), "-@all +@read");
        assert_eq!(shown(&["-@all", "+@read", "+get", "-get"]), "-@all +@read -get");
        assert_eq!(shown(&["-@all", "+client", "-client|kill", "+client|kill"]), "-@all +client");
        assert_eq!(shown(&["-@all", "+get", "allcommands", "-set"]), "+@all -set");
        assert_eq!(shown(&["nocommands", "+get"]), "-@all +get");
        assert_eq!(shown(&["+@all", "-@read", "-set"]), "+@all -@read -set");
        // superseded rules are dropped: repeating a rule does not grow the user
        let mut p = perms(&["-@all"]).unwrap();
        for _ in 0..100 {
            p.apply(b"+get", &t).unwrap();
            p.apply(b"-get", &t).unwrap();
            p.apply(b"+@read", &t).unwrap();
        }
        assert!(p.rules.len() <= 3, "{:?}", p.rules);
    }

    #[test]
    fn the_log_groups_alike_refusals_and_keeps_the_newest() {
        let log = Log::default();
        log.add("key", "toplevel", b"k", "u", "id=1".into());
        log.add("key", "toplevel", b"k", "u", "id=2".into());
        log.add("command", "multi", b"get", "u", "id=3".into());
        let e = log.newest(None);
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].reason, e[0].count), ("command", 1));
        assert_eq!((e[1].count, e[1].client_info.as_str()), (2, "id=2"));
        for i in 0..300 {
            log.add("key", "toplevel", format!("k{i}").as_bytes(), "u", String::new());
        }
        assert_eq!(log.newest(None).len(), Log::MAX);
        assert_eq!(log.newest(Some(1))[0].object, b"k299");
        log.add("key", "toplevel", &vec![b'x'; 10_000], "u", String::new());
        assert_eq!(log.newest(Some(1))[0].object.len(), Log::MAX_OBJECT);
        log.reset();
        assert!(log.newest(None).is_empty());
    }

    #[test]
    fn failed_logins_empty_an_address_s_bucket() {
        let l = AuthLimiter::new(3);
        let a = Some("10.0.0.1".parse().unwrap());
        let b = Some("10.0.0.2".parse().unwrap());
        for _ in 0..3 {
            assert!(l.may_try(a));
            l.failed(a);
        }
        assert!(!l.may_try(a), "three failures a minute");
        assert!(l.may_try(b), "another address has its own");
        assert!(AuthLimiter::new(0).may_try(a), "0: no limit");
        // a reload: 0 lifts the limit at once, a new limit counts from the bucket left
        l.set(0);
        assert!(l.may_try(a));
        l.set(3);
        assert!(!l.may_try(a), "the emptied bucket stays empty");
    }

    #[test]
    fn passwords() {
        let p = perms(&["on", ">s3cret", "#5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"]).unwrap();
        assert!(p.accepts(b"s3cret") && p.accepts(b"password") && !p.accepts(b"nope"));
        assert_eq!(hex(&hash(b"password")), "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8");
        let off = perms(&[">s3cret"]).unwrap();
        assert!(!off.accepts(b"s3cret"), "a user is off until 'on'");
        let p = perms(&["on", ">a", "<a"]).unwrap();
        assert!(!p.accepts(b"a"));
        assert!(perms(&["on", "nopass"]).unwrap().accepts(b"anything"));
        assert!(!perms(&["on", "nopass", "resetpass"]).unwrap().accepts(b"anything"));
    }

    #[test]
    fn refused_rules_in_redis_s_words() {
        let e = |r: &[&str]| perms(r).unwrap_err();
        assert_eq!(
            e(&["+nosuch"]),
            "ERR Error in ACL SETUSER modifier '+nosuch': Unknown command or category name in ACL"
        );
        assert_eq!(
            e(&["+@nosuch"]),
            "ERR Error in ACL SETUSER modifier '+@nosuch': Unknown command or category name in ACL"
        );
        assert_eq!(e(&["bogus"]), "ERR Error in ACL SETUSER modifier 'bogus': Syntax error");
        assert!(e(&["#abc"]).ends_with("contain only lowercase hexadecimal characters"));
        assert!(e(&["<never"]).ends_with("does not exist"));
        assert!(e(&["allkeys", "~x"]).contains("Try 'resetkeys'"));
        assert!(e(&["allchannels", "&x"]).contains("Try 'resetchannels'"));
        assert!(e(&["%X~a"]).ends_with("Syntax error"));
    }

    #[test]
    fn users_change_live_and_all_or_nothing() {
        let t = table();
        let users = Users::from_config(&["alice on >pw ~a:* +get".into()], Some("defpass"), &t).unwrap();
        assert_eq!(users.names(), ["alice", "default"]);
        let default = users.get("default").unwrap();
        assert!(default.perms().accepts(b"defpass") && default.perms().unrestricted());
        let alice = users.get("alice").unwrap();
        assert!(alice.perms().may_run(cmd(&t, "GET"), None) && !alice.perms().may_run(cmd(&t, "SET"), None));
        // a change reaches whoever holds the user
        users.set_user("alice", &[b"+set"], &t).unwrap();
        assert!(alice.perms().may_run(cmd(&t, "SET"), None));
        // a refused rule changes nothing
        assert!(users.set_user("alice", &[b"-set", b"+nosuch"], &t).is_err());
        assert!(alice.perms().may_run(cmd(&t, "SET"), None));
        assert_eq!(users.delete(&["alice", "default", "ghost"]).len(), 1);
        assert_eq!(users.names(), ["default"]);
        assert!(Users::from_config(&["bob +nosuch".into()], None, &t).unwrap_err().contains("user 'bob'"));
    }

    #[test]
    fn a_selector_allows_what_it_allows_whole_and_a_refusal_is_the_most_relevant() {
        let t = table();
        let users = Users::default();
        let rules: Vec<&[u8]> =
            ["on", "nopass", "~a*", "+get", "+mget", "(~b*", "+set", "+mget)", "(&c*", "%R~z*", "+publish", "+get)"]
                .iter()
                .map(|r| r.as_bytes())
                .collect();
        let u = users.set_user("s", &rules, &t).unwrap();
        let p = u.perms();
        assert_eq!(p.selectors.len(), 2);
        assert!(!p.unrestricted());
        assert_eq!(check(&p, &t, "GET a1"), Ok(()), "the root");
        assert_eq!(check(&p, &t, "SET b1 v"), Ok(()), "the first selector");
        assert_eq!(check(&p, &t, "GET z1"), Ok(()), "the second, read only");
        assert_eq!(check(&p, &t, "MGET a1 a2"), Ok(()));
        // all of a command in one place: keys that span the root and a selector are refused
        assert_eq!(check(&p, &t, "MGET a1 b1"), Err((Denied::Key, 2)), "the later of two key refusals");
        assert_eq!(check(&p, &t, "MGET b1 a1"), Err((Denied::Key, 2)));
        assert_eq!(check(&p, &t, "SET z1 v"), Err((Denied::Key, 1)), "a key refusal before a command's");
        assert_eq!(check(&p, &t, "HSET a h v"), Err((Denied::Command, 0)));
        assert_eq!(check(&p, &t, "PUBLISH d m"), Err((Denied::Channel, 1)), "a channel refusal before all");
        assert_eq!(check(&p, &t, "PUBLISH c1 m"), Ok(()));
        assert!(p.describe(&t).ends_with(
            "~a* resetchannels -@all +get +mget (~b* resetchannels -@all +mget +set) (%R~z* resetchannels &c* -@all +get +publish)"
        ));
        drop(p);
        // a selector that allows everything lets the user do anything; clearselectors
        let u = users.set_user("s", &[b"(allkeys allchannels +@all)"], &t).unwrap();
        assert!(u.perms().unrestricted());
        let u = users.set_user("s", &[b"clearselectors"], &t).unwrap();
        assert!(u.perms().selectors.is_empty() && !u.perms().unrestricted());
        // selectors given across arguments, and Redis's errors
        let e = users.set_user("s", &[b"(~x", b"+get", b"(~y", b"z)"], &t).unwrap_err();
        assert_eq!(e, "ERR Error in ACL SETUSER modifier '(~y z)': Syntax error");
        let e = users.set_user("s", &[b"(~x", b"(~y)"], &t).unwrap_err();
        assert_eq!(e, "ERR Error in ACL SETUSER modifier '(~x (~y)': Syntax error");
        let e = users.set_user("s", &[b"+get", b"(~x", b"+get"], &t).unwrap_err();
        assert_eq!(e, "ERR Unmatched parenthesis in acl selector starting at '(~x'.");
        let e = users.set_user("s", &[b"(reset)"], &t).unwrap_err();
        assert_eq!(e, "ERR Error in ACL SETUSER modifier '(reset)': Syntax error");
        assert!(u.perms().selectors.is_empty(), "a refused SETUSER changes nothing");
        // from the configuration file: one line, selectors split by its spaces
        let users =
            Users::from_config(&["erin on nopass ~a* +get (~b* +set) (%R~c* +@read)".into()], None, &t).unwrap();
        assert_eq!(users.get("erin").unwrap().perms().selectors.len(), 2);
    }
}
