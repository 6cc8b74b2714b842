//! The audit log (`[audit]`, docs/audit.md): who logged in or failed to, from where and
//! how (AUTH, HELLO AUTH, a client certificate), who ran which administrative or dangerous
//! command with what result, and the configuration reloads, as JSON lines in a file or on
//! standard output.
//!
//! - What is recorded: every command in `@admin` or `@dangerous` (heatshield's `PROXY`
//!   commands are both), the commands of `audit.commands`, and logins. Decided by command
//!   id from a table made at start, so a command that is not audited costs one load.
//! - Never a value or a secret: a record names the command, the keys it names and, for
//!   `@admin` commands only, its other arguments (each cut at 64 bytes), with passwords
//!   masked (`ACL SETUSER`'s `>`, `<`, `#` and `!` rules, `CONFIG SET` of a password
//!   parameter, `MIGRATE`'s `AUTH` / `AUTH2`, `PROXY AUTH`). AUTH and HELLO are logins: their records
//!   have the user name only.
//! - A session never waits for the log: records go through a bounded queue to a writer
//!   thread of their own, and when the queue is full they are dropped and counted
//!   (`heatshield_audit_dropped_total`). The writer opens the file itself, so a file that
//!   blocks (a FIFO nobody reads, a stuck disk) holds only the writer.
//! - The file is rotated by size (`max_bytes`: `FILE` becomes `FILE.1`, `FILE.1` becomes
//!   `FILE.2`, up to `keep`), and opened again on SIGHUP (for logrotate).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::command::{Command, CommandTable, spec::cat};
use crate::protocol::Request;

/// `[audit]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// The JSON-lines file records go to; unset: none (unless `stdout`).
    pub file: Option<String>,
    /// Records go to standard output (instead of a file).
    pub stdout: bool,
    /// The file is rotated once it is this large (0: never; it is opened again on SIGHUP).
    pub max_bytes: u64,
    /// Rotated files kept (`FILE.1` the newest).
    pub keep: usize,
    /// More commands to record, lowercase, subcommands as `parent|sub`, besides every
    /// command in `@admin` or `@dangerous`.
    pub commands: Vec<String>,
    /// Records waiting for the writer at most; more are dropped and counted.
    pub queue: usize,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            file: None,
            stdout: false,
            max_bytes: 100 << 20,
            keep: 5,
            commands: vec!["script|flush".into(), "function|flush".into(), "function|delete".into()],
            queue: 65_536,
        }
    }
}

impl AuditConfig {
    /// Whether records are written anywhere.
    pub fn on(&self) -> bool {
        self.file.is_some() || self.stdout
    }

    /// Problems with the settings, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut p = vec![];
        if self.file.is_some() && self.stdout {
            p.push("audit.file: and audit.stdout are one or the other".into());
        }
        if self.file.as_deref() == Some("") {
            p.push("audit.file: empty (leave it unset for no file)".into());
        }
        if self.queue == 0 || self.queue > 10_000_000 {
            p.push("audit.queue: between 1 and 10000000".into());
        }
        if self.keep > 1000 {
            p.push("audit.keep: at most 1000".into());
        }
        p
    }
}

/// How a login was tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Auth,
    Hello,
    Certificate,
}

impl Via {
    fn label(self) -> &'static str {
        match self {
            Via::Auth => "auth",
            Via::Hello => "hello",
            Via::Certificate => "certificate",
        }
    }
}

/// Who did it.
pub struct Who<'a> {
    pub client: u64,
    pub addr: &'a str,
    pub user: &'a str,
}

#[derive(Serialize)]
struct Record<'a> {
    time: String,
    instance: &'a str,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    client: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    via: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Vec<String>>,
    result: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    applied: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    restart: Vec<String>,
}

/// The audit log of one process.
pub struct Audit {
    /// By command id: recorded (the ids known at start; a later one, a command the
    /// servers taught heatshield, is looked at when its reply comes: [`Audit::command`]).
    wanted: Box<[bool]>,
    /// `audit.commands`, lowercase.
    named: Vec<String>,
    /// Command ids of AUTH and HELLO (logins, recorded apart).
    logins: [usize; 2],
    tx: Option<SyncSender<String>>,
    reopen: Arc<AtomicBool>,
    instance: String,
}

/// Arguments are cut at this many bytes in a record.
const ARG_MAX: usize = 64;
/// A record shows at most this many keys, and this many other arguments: the rest are
/// counted in a last entry, as Redis's slow log does (so a record's size, and the queue's
/// memory, stay bounded whatever a client sends).
const ARGS_MAX: usize = 32;

/// At most [`ARGS_MAX`] entries of `all`, then "… (N more)".
fn capped(all: impl ExactSizeIterator<Item = String>) -> Vec<String> {
    let n = all.len();
    let mut v: Vec<String> = all.take(ARGS_MAX).collect();
    if n > ARGS_MAX {
        v.push(format!("… ({} more)", n - ARGS_MAX));
    }
    v
}

impl Audit {
    /// An audit log that records nothing.
    pub fn off() -> Audit {
        Audit {
            wanted: Box::new([]),
            named: Vec::new(),
            logins: [usize::MAX; 2],
            tx: None,
            reopen: Arc::new(AtomicBool::new(false)),
            instance: String::new(),
        }
    }

    /// The audit log `cfg` asks for, its writer started (`instance`: this heatshield, as
    /// records name it).
    pub fn start(cfg: &AuditConfig, commands: &CommandTable, instance: String) -> Audit {
        if !cfg.on() {
            return Audit::off();
        }
        let named: Vec<String> = cfg.commands.iter().map(|n| n.to_ascii_lowercase()).collect();
        let mut wanted = vec![false; commands.count()];
        for (c, _) in commands.every() {
            if c.id < wanted.len() && audited(c, &named) {
                wanted[c.id] = true;
            }
        }
        let id =
            |name: &str| commands.every().into_iter().find(|(c, _)| c.name == name).map_or(usize::MAX, |(c, _)| c.id);
        let (tx, rx) = sync_channel(cfg.queue);
        let reopen = Arc::new(AtomicBool::new(false));
        let out = Output { file: cfg.file.clone(), max_bytes: cfg.max_bytes, keep: cfg.keep };
        let flag = reopen.clone();
        let spawned =
            std::thread::Builder::new().name("heatshield-audit".into()).spawn(move || write_loop(out, rx, flag));
        if let Err(e) = spawned {
            warn!(error = %e, "audit log: no writer thread; nothing is recorded");
            return Audit::off();
        }
        Audit { wanted: wanted.into(), named, logins: [id("AUTH"), id("HELLO")], tx: Some(tx), reopen, instance }
    }

    /// Whether command `id`'s replies may be recorded (a login's too; a command learned
    /// after start is decided by [`Audit::command`]).
    #[inline]
    pub fn wants(&self, id: usize) -> bool {
        match self.wanted.get(id) {
            Some(&w) => w || (self.tx.is_some() && self.logins.contains(&id)),
            // (usize::MAX: a pushed message, not a command)
            None => self.tx.is_some() && id != usize::MAX,
        }
    }

    /// The file is opened again before the next record (SIGHUP).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
    }

    fn send(&self, r: &Record<'_>) {
        let Some(tx) = &self.tx else { return };
        let Ok(line) = serde_json::to_string(r) else { return };
        match tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                crate::metrics::global().audit_dropped.increment(1);
            }
        }
    }

    fn record<'s>(&'s self, kind: &'static str, result: &'s str) -> Record<'s> {
        Record {
            time: rfc3339(SystemTime::now()),
            instance: &self.instance,
            kind,
            client: None,
            addr: None,
            user: None,
            via: None,
            subject: None,
            command: None,
            keys: Vec::new(),
            args: None,
            result: "",
            reason: None,
            applied: Vec::new(),
            restart: Vec::new(),
        }
        .with_result(result)
    }

    /// A command of `who` answered with `reply`: recorded if it is audited ([`Audit::wants`]).
    /// `keys`: the argument places of its keys (the client's names).
    pub fn command(&self, who: &Who<'_>, cmd: &Command, req: &Request, keys: &[u32], reply: &[u8]) {
        let (result, reason) = outcome(reply);
        if self.logins.contains(&cmd.id) {
            // AUTH [user] pass, HELLO proto [AUTH user pass]: the user tried, never more
            let user = match (cmd.name.as_str(), req.argc()) {
                ("AUTH", 3) => Some(req.arg(1)),
                ("AUTH", _) => Some(&b"default"[..]),
                _ => (2..req.argc()).find(|&i| req.arg(i).eq_ignore_ascii_case(b"AUTH")).map(|i| req.arg(i + 1)),
            };
            let Some(user) = user else { return }; // a HELLO without AUTH logs nobody in
            let user = String::from_utf8_lossy(user);
            let mut r = self.record("login", if result == "ok" { "ok" } else { "failed" });
            r.client = Some(who.client);
            r.addr = Some(who.addr);
            r.user = Some(&user);
            r.via = Some(if cmd.name == "AUTH" { Via::Auth } else { Via::Hello }.label());
            r.reason = reason;
            self.send(&r);
            return;
        }
        if cmd.id >= self.wanted.len() && !audited(cmd, &self.named) {
            return;
        }
        let mut r = self.record("command", result);
        r.client = Some(who.client);
        r.addr = Some(who.addr);
        r.user = Some(who.user);
        r.command = Some(&cmd.lower);
        r.keys = capped(keys.iter().map(|&k| shown(req.arg(k as usize))));
        if cmd.acl & cat::ADMIN != 0 {
            let first = if cmd.name.contains('|') { 2 } else { 1 };
            r.args = Some(masked(&cmd.name, req, first, keys));
        }
        r.reason = reason;
        self.send(&r);
    }

    /// A login by client certificate (`user`: the name it gave, `ok`: logged in as it).
    pub fn cert_login(&self, client: u64, addr: &str, user: Option<&str>, ok: bool, why: &str) {
        if self.tx.is_none() {
            return;
        }
        let mut r = self.record("login", if ok { "ok" } else { "failed" });
        r.client = Some(client);
        r.addr = Some(addr);
        r.user = user;
        r.via = Some(Via::Certificate.label());
        r.reason = (!ok).then(|| why.to_string());
        self.send(&r);
    }

    /// A configuration reload: what it applied and what waits for a restart, or why it
    /// failed.
    pub fn reload(&self, applied: &[String], restart: &[String], error: Option<&str>) {
        if self.tx.is_none() {
            return;
        }
        let mut r = self.record("reload", if error.is_none() { "ok" } else { "error" });
        r.applied = applied.to_vec();
        r.restart = restart.to_vec();
        r.reason = error.map(str::to_string);
        self.send(&r);
    }
}

impl<'a> Record<'a> {
    fn with_result(mut self, result: &'a str) -> Record<'a> {
        self.result = result;
        self
    }
}

/// Whether `cmd` is recorded: `@admin`, `@dangerous`, or named in `audit.commands`.
fn audited(cmd: &Command, named: &[String]) -> bool {
    cmd.acl & (cat::ADMIN | cat::DANGEROUS) != 0 || named.iter().any(|n| n.eq_ignore_ascii_case(&cmd.lower))
}

/// "ok", "refused" (ACL, a rate limit: the reason says which) or "error", and the error's
/// text.
fn outcome(reply: &[u8]) -> (&'static str, Option<String>) {
    if !matches!(reply.first(), Some(b'-' | b'!')) {
        return ("ok", None);
    }
    let text = reply[1..].split(|&b| b == b'\r').next().unwrap_or_default();
    let text = String::from_utf8_lossy(&text[..text.len().min(256)]).into_owned();
    let refused = text.starts_with("NOPERM") || text.starts_with("THROTTLED") || text.starts_with("NOAUTH");
    (if refused { "refused" } else { "error" }, Some(text))
}

/// An argument as a record shows it: text, cut at [`ARG_MAX`] bytes.
fn shown(a: &[u8]) -> String {
    let cut = &a[..a.len().min(ARG_MAX)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if a.len() > ARG_MAX {
        s.push('…');
    }
    s
}

/// The arguments of an `@admin` command from `first` on, keys left out (they are in
/// `keys`), passwords masked.
fn masked(name: &str, req: &Request, first: usize, keys: &[u32]) -> Vec<String> {
    const SECRET_PARAMS: &[&str] =
        &["requirepass", "masterauth", "masteruser", "tls-key-file-pass", "tls-client-key-file-pass"];
    let lower = |i: usize| req.arg(i).to_ascii_lowercase();
    let secret = |i: usize| match name {
        "ACL|SETUSER" => i >= 3 && matches!(req.arg(i).first(), Some(b'>' | b'<' | b'#' | b'!')),
        "CONFIG|SET" => {
            i > first && (i - first) % 2 == 1 && SECRET_PARAMS.iter().any(|p| p.as_bytes() == lower(i - 1).as_slice())
        }
        // MIGRATE ... AUTH password, AUTH2 username password
        "MIGRATE" => (i > 1 && lower(i - 1) == b"auth") || (i > 2 && lower(i - 2) == b"auth2"),
        // PROXY AUTH password
        "PROXY" => i >= 2 && lower(1) == b"auth",
        _ => false,
    };
    let shown_args: Vec<usize> = (first..req.argc()).filter(|&i| !keys.contains(&(i as u32))).collect();
    capped(shown_args.into_iter().map(|i| if secret(i) { "(masked)".to_string() } else { shown(req.arg(i)) }))
}

/// `t` as RFC 3339 in UTC, to the millisecond.
fn rfc3339(t: SystemTime) -> String {
    let ms = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis() as i64;
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s, milli) = (rem / 3_600_000, rem / 60_000 % 60, rem / 1000 % 60, rem % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

/// Where the writer writes.
struct Output {
    file: Option<String>,
    max_bytes: u64,
    keep: usize,
}

/// The writer thread: takes records from the queue and writes them, a batch at a time,
/// opening the file itself (a file that blocks holds only this thread).
fn write_loop(out: Output, rx: Receiver<String>, reopen: Arc<AtomicBool>) {
    let m = crate::metrics::global();
    let mut sink: Option<(Box<dyn Write + Send>, u64)> = None;
    let mut warned = false;
    while let Ok(first) = rx.recv() {
        if reopen.swap(false, Ordering::Relaxed) {
            sink = None;
        }
        if sink.is_none() {
            sink = open(&out);
            if sink.is_none() {
                if !warned {
                    warn!(file = ?out.file, "audit log: the file does not open; records are dropped until it does");
                    warned = true;
                }
                m.audit_dropped.increment(1 + rx.try_iter().count() as u64);
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            warned = false;
        }
        let Some((w, size)) = sink.as_mut() else { continue };
        let mut n = 0u64;
        let mut failed = false;
        for line in std::iter::once(first).chain(rx.try_iter().take(4096)) {
            if w.write_all(line.as_bytes()).and_then(|_| w.write_all(b"\n")).is_err() {
                failed = true;
                break;
            }
            *size += line.len() as u64 + 1;
            n += 1;
        }
        if failed || w.flush().is_err() {
            warn!(file = ?out.file, "audit log: a write failed; the file is opened again");
            sink = None;
            continue;
        }
        m.audit_records.increment(n);
        if out.max_bytes > 0 && *size >= out.max_bytes && out.file.is_some() {
            sink = None;
            rotate(&out);
        }
    }
}

fn open(out: &Output) -> Option<(Box<dyn Write + Send>, u64)> {
    match &out.file {
        None => Some((Box::new(std::io::LineWriter::new(std::io::stdout())), 0)),
        Some(path) => {
            let f = std::fs::OpenOptions::new().create(true).append(true).open(path).ok()?;
            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
            Some((Box::new(std::io::BufWriter::with_capacity(64 << 10, f)), size))
        }
    }
}

/// `FILE.(k-1)` → `FILE.k` down to `FILE` → `FILE.1`; the oldest beyond `keep` goes.
fn rotate(out: &Output) {
    let Some(path) = &out.file else { return };
    if out.keep == 0 {
        let _ = std::fs::remove_file(path);
        return;
    }
    let _ = std::fs::remove_file(format!("{path}.{}", out.keep));
    for k in (1..out.keep).rev() {
        let _ = std::fs::rename(format!("{path}.{k}"), format!("{path}.{}", k + 1));
    }
    let _ = std::fs::rename(path, format!("{path}.1"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(args: &[&str]) -> Request {
        Request::from_args(args)
    }

    #[test]
    fn secrets_are_masked_and_other_arguments_kept() {
        let r = req(&["ACL", "SETUSER", "alice", "on", ">secret1", "#abcd", "~k:*", "+get"]);
        assert_eq!(masked("ACL|SETUSER", &r, 2, &[]), ["alice", "on", "(masked)", "(masked)", "~k:*", "+get"]);
        let r = req(&["CONFIG", "SET", "maxmemory", "10mb", "requirepass", "secret2"]);
        assert_eq!(masked("CONFIG|SET", &r, 2, &[]), ["maxmemory", "10mb", "requirepass", "(masked)"]);
        let r = req(&["MIGRATE", "h", "1", "", "0", "5", "AUTH2", "u", "secret3", "KEYS", "a", "b"]);
        let shownargs = masked("MIGRATE", &r, 1, &[10, 11]);
        assert!(!shownargs.iter().any(|a| a.contains("secret")), "{shownargs:?}");
        assert!(shownargs.contains(&"u".to_string()));
        let r = req(&["PROXY", "AUTH", "secret5"]);
        assert_eq!(masked("PROXY", &r, 1, &[]), ["AUTH", "(masked)"]);
        let r = req(&["MIGRATE", "h", "1", "", "0", "5", "AUTH", "secret4", "KEYS", "a"]);
        assert!(!masked("MIGRATE", &r, 1, &[9]).iter().any(|a| a.contains("secret")));
        assert_eq!(shown(&[b'x'; 100]).chars().count(), ARG_MAX + 1);
    }

    #[test]
    fn a_record_shows_at_most_32_arguments_and_counts_the_rest() {
        let mut args = vec!["CONFIG", "SET"];
        let many: Vec<String> = (0..1000).map(|i| format!("p{i}")).collect();
        args.extend(many.iter().map(String::as_str));
        let r = req(&args);
        let shownargs = masked("CONFIG|SET", &r, 2, &[]);
        assert_eq!(shownargs.len(), ARGS_MAX + 1);
        assert_eq!(shownargs[0], "p0");
        assert_eq!(shownargs[ARGS_MAX], "… (968 more)");
        let few = masked("CONFIG|SET", &req(&["CONFIG", "SET", "maxmemory", "1"]), 2, &[]);
        assert_eq!(few, ["maxmemory", "1"]);
    }

    #[test]
    fn outcomes_and_times() {
        assert_eq!(outcome(b"+OK\r\n"), ("ok", None));
        assert_eq!(outcome(b"-NOPERM no\r\n").0, "refused");
        assert_eq!(outcome(b"-ERR bad\r\n"), ("error", Some("ERR bad".into())));
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_934_225_123);
        assert_eq!(rfc3339(t), "2026-11-29T06:37:05.123Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }
}
