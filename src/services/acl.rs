//! ACL users and their rules, in Redis's syntax (`ACL SETUSER name rule ...`): whether a
//! user may log in and with which passwords, which commands it may run (by name,
//! subcommand and category, in the order the rules were given), which keys and channels
//! it may touch. A user's permissions are one value swapped whole when its rules change,
//! so a session that holds the user sees the change at its next command, as on Redis.
//!
//! What a command may do to a key is taken from the command's flags for now (a write
//! needs write permission on its keys, a read read permission); Redis takes it from each
//! key spec, which a few commands (COPY, LMOVE, SORT ... STORE) need to be exact.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::command::{Command, CommandTable, cat};

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
}

/// A key pattern and what it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    pub pattern: Vec<u8>,
    pub read: bool,
    pub write: bool,
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
            keys: vec![KeyPattern { pattern: b"*".to_vec(), read: true, write: true }],
            channels: vec![b"*".to_vec()],
        }
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
            b"allkeys" => self.keys = vec![KeyPattern { pattern: b"*".to_vec(), read: true, write: true }],
            b"resetkeys" => self.keys.clear(),
            b"allchannels" => self.channels = vec![b"*".to_vec()],
            b"resetchannels" => self.channels.clear(),
            b"allcommands" => self.rules = vec![CmdRule::All(true)],
            b"nocommands" => self.rules = vec![CmdRule::All(false)],
            b"reset" => {
                *self = Perms::new();
                self.rules = vec![CmdRule::All(false)];
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
                        b'R' => read = true,
                        b'W' => write = true,
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
                    let name = String::from_utf8_lossy(rest).to_ascii_uppercase();
                    match name.split_once('|') {
                        Some((parent, sub)) => {
                            let known = table.get(parent.as_bytes()).is_some_and(|c| c.sub(sub.as_bytes()).is_some());
                            if !known {
                                return Err(RuleError::Unknown);
                            }
                            CmdRule::Sub(name, allow)
                        }
                        None => {
                            if table.get(name.as_bytes()).is_none() {
                                return Err(RuleError::Unknown);
                            }
                            CmdRule::Command(name, allow)
                        }
                    }
                };
                self.rules.push(rule);
            }
            _ => return Err(RuleError::Syntax),
        }
        Ok(())
    }

    fn add_keys(&mut self, pattern: &[u8], read: bool, write: bool) -> Result<(), RuleError> {
        if self.keys.iter().any(|k| k.pattern == b"*" && k.read && k.write) {
            return Err(RuleError::KeysAfterAll);
        }
        if pattern == b"*" && read && write {
            self.keys = vec![KeyPattern { pattern: b"*".to_vec(), read, write }];
        } else if let Some(k) = self.keys.iter_mut().find(|k| k.pattern == pattern) {
            k.read |= read;
            k.write |= write;
        } else {
            self.keys.push(KeyPattern { pattern: pattern.to_vec(), read, write });
        }
        Ok(())
    }

    /// Whether the user may run `cmd` (a subcommand's own [`Command`] for a container's).
    pub fn may_run(&self, cmd: &Command) -> bool {
        let mut allowed = false;
        for r in &self.rules {
            let (hit, allow) = match r {
                CmdRule::All(a) => (true, *a),
                CmdRule::Category(bit, a) => (cmd.acl & bit != 0, *a),
                CmdRule::Command(name, a) => {
                    (cmd.name == *name || cmd.name.strip_prefix(name.as_str()).is_some_and(|r| r.starts_with('|')), *a)
                }
                CmdRule::Sub(name, a) => (cmd.name == *name, *a),
            };
            if hit {
                allowed = allow;
            }
        }
        allowed
    }

    /// Whether the user may touch `key` for reading and/or writing.
    pub fn may_touch(&self, key: &[u8], read: bool, write: bool) -> bool {
        // what one pattern does not allow, another may: each access is checked alone
        let ok = |want: fn(&KeyPattern) -> bool| {
            self.keys.iter().any(|k| want(k) && crate::glob::matches(&k.pattern, key, false))
        };
        (!read || ok(|k| k.read)) && (!write || ok(|k| k.write))
    }

    /// Whether the user may use `channel` (`pattern`: a PSUBSCRIBE pattern, which must be
    /// one of the user's patterns literally, as on Redis).
    pub fn may_use_channel(&self, channel: &[u8], pattern: bool) -> bool {
        self.channels
            .iter()
            .any(|c| c == b"*" || if pattern { c == channel } else { crate::glob::matches(c, channel, false) })
    }

    /// Everything allowed: no check is needed on the request path.
    pub fn unrestricted(&self) -> bool {
        self.rules == [CmdRule::All(true)]
            && self.keys.iter().any(|k| k.pattern == b"*" && k.read && k.write)
            && self.channels.iter().any(|c| c == b"*")
    }

    /// Whether `password` logs this user in.
    pub fn accepts(&self, password: &[u8]) -> bool {
        self.enabled && (self.nopass || self.passwords.contains(&hash(password)))
    }

    /// The command rules as text, in the order given (`+@all -debug`), from the last
    /// `+@all` / `-@all` on (what came before it no longer counts).
    pub fn command_rules(&self) -> String {
        let from = self.rules.iter().rposition(|r| matches!(r, CmdRule::All(_))).unwrap_or(0);
        let mut out: Vec<String> = Vec::new();
        if !matches!(self.rules.get(from), Some(CmdRule::All(_))) {
            out.push("-@all".into());
        }
        for r in &self.rules[from..] {
            let (sign, what) = match r {
                CmdRule::All(a) => (*a, "@all".to_string()),
                CmdRule::Category(bit, a) => (*a, format!("@{}", cat::NAMES[bit.trailing_zeros() as usize])),
                CmdRule::Command(n, a) | CmdRule::Sub(n, a) => (*a, n.to_ascii_lowercase()),
            };
            out.push(format!("{}{what}", if sign { '+' } else { '-' }));
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

    /// The user as `ACL LIST` shows it, without `user <name> ` (Redis 7.0's order).
    pub fn describe(&self) -> String {
        let mut parts = vec![if self.enabled { "on" } else { "off" }.to_string()];
        if self.nopass {
            parts.push("nopass".into());
        }
        parts.extend(self.passwords.iter().map(|h| format!("#{}", hex(h))));
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
        parts.push(self.command_rules());
        parts.join(" ")
    }
}

/// A user: its name and its permissions, swapped whole on change.
#[derive(Debug)]
pub struct User {
    pub name: String,
    perms: ArcSwap<Perms>,
}

impl User {
    pub fn new(name: &str, perms: Perms) -> User {
        User { name: name.to_string(), perms: ArcSwap::from_pointee(perms) }
    }

    /// The permissions now.
    pub fn perms(&self) -> arc_swap::Guard<Arc<Perms>> {
        self.perms.load()
    }

    pub fn set(&self, perms: Perms) {
        self.perms.store(Arc::new(perms));
    }
}

/// Every user, by name.
#[derive(Debug, Default)]
pub struct Users {
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
        let mut users = self.users.write();
        let mut perms = users.get(name).map(|u| (**u.perms()).clone()).unwrap_or_default();
        for r in rules {
            perms.apply(r, table).map_err(|e| e.reply(r))?;
        }
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
        assert!(p.may_run(cmd(&t, "GET")));
        assert!(!p.may_run(cmd(&t, "FLUSHALL")), "@dangerous");
        assert!(p.may_run(cmd(&t, "FLUSHDB")), "allowed again after the category");
        assert!(!p.may_run(cmd(&t, "CLIENT|KILL")));
        assert!(p.may_run(cmd(&t, "CLIENT|SETNAME")));
        let p = perms(&["+@read", "-get", "+client"]).unwrap();
        assert!(p.may_run(cmd(&t, "HGET")) && !p.may_run(cmd(&t, "GET")) && !p.may_run(cmd(&t, "SET")));
        assert!(p.may_run(cmd(&t, "CLIENT|KILL")), "+client allows every subcommand");
        assert!(!perms(&[]).unwrap().may_run(cmd(&t, "PING")), "a new user may run nothing");
        let p = perms(&["+@all", "-@proxy", "-@lock"]).unwrap();
        assert!(!p.may_run(cmd(&t, "PROXY")) && !p.may_run(cmd(&t, "LOCK.ACQUIRE")) && p.may_run(cmd(&t, "SET")));
    }

    #[test]
    fn keys_and_channels() {
        let p = perms(&["~app:*", "%R~shared:*", "%W~log:*", "&news.*"]).unwrap();
        assert!(p.may_touch(b"app:1", true, true));
        assert!(p.may_touch(b"shared:x", true, false) && !p.may_touch(b"shared:x", false, true));
        assert!(p.may_touch(b"log:1", false, true) && !p.may_touch(b"log:1", true, false));
        assert!(!p.may_touch(b"other", true, false));
        assert!(p.may_use_channel(b"news.sport", false) && !p.may_use_channel(b"weather", false));
        assert!(p.may_use_channel(b"news.*", true) && !p.may_use_channel(b"news.s*", true));
        let p = perms(&["allkeys", "allchannels", "allcommands"]).unwrap();
        assert!(p.unrestricted());
        assert!(!perms(&["allkeys", "allchannels", "+@all", "-debug"]).unwrap().unrestricted());
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
        assert!(alice.perms().may_run(cmd(&t, "GET")) && !alice.perms().may_run(cmd(&t, "SET")));
        // a change reaches whoever holds the user
        users.set_user("alice", &[b"+set"], &t).unwrap();
        assert!(alice.perms().may_run(cmd(&t, "SET")));
        // a refused rule changes nothing
        assert!(users.set_user("alice", &[b"-set", b"+nosuch"], &t).is_err());
        assert!(alice.perms().may_run(cmd(&t, "SET")));
        assert_eq!(users.delete(&["alice", "default", "ghost"]).len(), 1);
        assert_eq!(users.names(), ["default"]);
        assert!(Users::from_config(&["bob +nosuch".into()], None, &t).unwrap_err().contains("user 'bob'"));
    }
}
