//! The copy of a key from the source to the target, with a version, so that a copy never
//! replaces a newer one (whoever makes them: this run, another heatshield, a later phase).
//!
//! Both scripts are sent as `EVALSHA` (a node that does not know them is taught them with
//! `SCRIPT LOAD` and asked again), so a copy carries its key and value, not the script.
//!
//! - **Read** (one script on the source, [`READ`]): the source master's clock (`TIME`, in
//!   microseconds: the copy's version), the key's type, its expiry time (`PEXPIRETIME`),
//!   and its `DUMP`, all at one instant. A collection of more than [`BIG`] elements is not
//!   dumped: it is copied in pieces (below).
//! - **Write** (one script on the target, [`WRITE`]): the version of the key's last copy is
//!   kept in a hash beside it (`{heatshield:mv:N}v`, in the key's slot: [`super::slot_tag`]);
//!   the copy is applied (`RESTORE ... REPLACE ABSTTL`, or `DEL` for a key gone from the
//!   source) only if its version is newer, and then becomes the key's version. A copy
//!   made earlier but applied later is dropped.
//! - **Big keys in pieces**: a hash, set, sorted set or list of more than [`BIG`] elements
//!   is read in pieces of [`super::verify::CHUNK`] (`HSCAN`, `SSCAN`, `ZSCAN`, `LRANGE`),
//!   none of which holds the source for more than about a millisecond, and written into a
//!   key of its own beside it on the target (`{heatshield:mv:N}t:KEY`, expiring after an
//!   hour if the copy never finishes); the write script then renames it over the key, with
//!   the version of the moment the read began. A stream, or a module's type, is dumped
//!   whatever its size.
//!
//! Versions come from the clock of the master serving the key at the read. After a
//! failover to a master whose clock is behind, a copy could be older than one made
//! before it; `verify` would find such a key.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::{Nodes, int, scan_reply, slot_tag};
use crate::protocol::reply::{Value, error_text};
use crate::upstream::cluster::slot;

/// Collections with more elements than this are copied in pieces.
pub const BIG: usize = 10_000;

/// KEYS[1]: the key; ARGV[1]: [`BIG`]; ARGV[2]: `dump`, or `logical` (the other side
/// cannot restore this one's dumps: a string's value is read, every other type in pieces).
/// Returns {seconds, microseconds} for a key that does not exist, {.., type, expiry time}
/// for a collection copied in pieces, {.., type, expiry time, value, 'value'} for a string
/// read by value, {.., type, expiry time, dump} otherwise.
pub const READ: &str = "local t = redis.call('TIME') \
local ty = redis.call('TYPE', KEYS[1])['ok'] \
if ty == 'none' then return {t[1], t[2]} end \
if ARGV[2] == 'logical' then \
  local at = redis.call('PEXPIRETIME', KEYS[1]) \
  if ty == 'string' then return {t[1], t[2], ty, at, redis.call('GET', KEYS[1]), 'value'} end \
  return {t[1], t[2], ty, at} \
end \
local n = 0 \
if ty == 'hash' then n = redis.call('HLEN', KEYS[1]) \
elseif ty == 'set' then n = redis.call('SCARD', KEYS[1]) \
elseif ty == 'zset' then n = redis.call('ZCARD', KEYS[1]) \
elseif ty == 'list' then n = redis.call('LLEN', KEYS[1]) end \
local at = redis.call('PEXPIRETIME', KEYS[1]) \
if n > tonumber(ARGV[1]) then return {t[1], t[2], ty, at} end \
return {t[1], t[2], ty, at, redis.call('DUMP', KEYS[1])}";

/// KEYS: the key, its slot's version hash, its big-copy key. ARGV: the version, the
/// mode (`dump`, `set`, `del` or `rename`), the expiry time in ms (-1: none), the dump
/// (or, for `set`, the string's value). Returns
/// 1 when applied, 0 when the target had a copy as new or newer.
pub const WRITE: &str = "local cur = tonumber(redis.call('HGET', KEYS[2], KEYS[1]) or '0') \
if tonumber(ARGV[1]) <= cur then \
  if ARGV[2] == 'rename' then redis.call('DEL', KEYS[3]) end \
  return 0 \
end \
local at = tonumber(ARGV[3]) \
if ARGV[2] == 'del' then redis.call('DEL', KEYS[1]) \
elseif ARGV[2] == 'set' then \
  redis.call('SET', KEYS[1], ARGV[4]) \
  if at > 0 then redis.call('PEXPIREAT', KEYS[1], at) end \
elseif ARGV[2] == 'dump' then \
  if at > 0 then redis.call('RESTORE', KEYS[1], at, ARGV[4], 'REPLACE', 'ABSTTL') \
  else redis.call('RESTORE', KEYS[1], 0, ARGV[4], 'REPLACE') end \
elseif redis.call('EXISTS', KEYS[3]) == 1 then \
  redis.call('RENAME', KEYS[3], KEYS[1]) \
  if at > 0 then redis.call('PEXPIREAT', KEYS[1], at) else redis.call('PERSIST', KEYS[1]) end \
else redis.call('DEL', KEYS[1]) end \
redis.call('HSET', KEYS[2], KEYS[1], ARGV[1]) \
return 1";

/// A script and its SHA1, as `EVALSHA` names it.
struct Script {
    text: &'static str,
    sha: std::sync::OnceLock<String>,
}

impl Script {
    fn sha(&self) -> &[u8] {
        self.sha.get_or_init(|| sha1_smol::Sha1::from(self.text).digest().to_string()).as_bytes()
    }
}

static READ_SCRIPT: Script = Script { text: READ, sha: std::sync::OnceLock::new() };
static WRITE_SCRIPT: Script = Script { text: WRITE, sha: std::sync::OnceLock::new() };

/// Sends `cmds` (`EVALSHA`s of `script`) to `addr` pipelined. A node that does not know
/// the script (it restarted, or a failover) is taught it (`SCRIPT LOAD`) and the commands
/// it refused are sent again; the others' replies stand.
async fn scripted(n: &mut Nodes, addr: &Arc<str>, script: &Script, cmds: &[Vec<&[u8]>]) -> Result<Vec<Bytes>, String> {
    let mut replies = n.pipe(addr, cmds).await?;
    let again: Vec<usize> = (0..replies.len()).filter(|&i| replies[i].starts_with(b"-NOSCRIPT")).collect();
    if again.is_empty() {
        return Ok(replies);
    }
    n.ask(addr, vec![b"SCRIPT", b"LOAD", script.text.as_bytes()]).await?;
    let redo: Vec<Vec<&[u8]>> = again.iter().map(|&i| cmds[i].clone()).collect();
    for (i, r) in again.into_iter().zip(n.pipe(addr, &redo).await?) {
        replies[i] = r;
    }
    Ok(replies)
}

/// How long a big key's copy in progress lives on the target if it is never finished.
const PIECES_TTL_MS: &str = "3600000";

/// What copies did.
#[derive(Debug, Default, Clone)]
pub struct Copied {
    /// Copies applied on the target (keys written, or deleted there as on the source).
    pub applied: u64,
    /// Copies dropped because the target had one as new or newer.
    pub kept: u64,
    /// Keys that did not exist on the source when read (deleted there, or never).
    pub gone: u64,
    /// Keys copied in pieces.
    pub big: u64,
    /// Bytes read from the source (dumps and pieces).
    pub bytes: u64,
    /// Keys that could not be copied, with the reason (all counted, the first 20 kept).
    pub failed: u64,
    pub first_failures: Vec<(Vec<u8>, String)>,
    /// Keys that could not be copied, to try again (at most [`RETRY_MAX`]).
    pub retry: Vec<Vec<u8>>,
    /// The target refused a dump as of another server's version (Redis 7.0 cannot
    /// restore Valkey 9's): copy by value.
    pub incompatible: bool,
}

/// Failed keys a [`Copied`] keeps to be tried again.
pub const RETRY_MAX: usize = 10_000;

impl Copied {
    fn fail(&mut self, key: &[u8], why: String) {
        self.failed += 1;
        if why.contains("DUMP payload version") || why.contains("Bad data format") {
            self.incompatible = true;
        }
        if self.retry.len() < RETRY_MAX {
            self.retry.push(key.to_vec());
        }
        if self.first_failures.len() < 20 {
            self.first_failures.push((key.to_vec(), why));
        }
    }
}

/// One key as read on the source.
enum Read {
    Gone {
        version: u64,
    },
    Dump {
        version: u64,
        at: i64,
        dump: Bytes,
    },
    /// A string read by value.
    Value {
        version: u64,
        at: i64,
        value: Bytes,
    },
    Big {
        version: u64,
        at: i64,
        ty: Vec<u8>,
    },
}

fn parse_read(r: &[u8]) -> Result<Read, String> {
    if let Some(e) = error_text(r) {
        return Err(String::from_utf8_lossy(e).into_owned());
    }
    let Ok((Value::Array(v), _)) = Value::parse(r) else { return Err("unexpected reply to the read".into()) };
    let n = |i: usize| v.get(i).and_then(Value::as_int);
    let (Some(sec), Some(usec)) = (n(0), n(1)) else { return Err("no time in the read".into()) };
    let version = sec as u64 * 1_000_000 + usec as u64;
    match (v.get(2).and_then(Value::as_bytes), n(3), v.get(4)) {
        (None, ..) => Ok(Read::Gone { version }),
        (Some(ty), Some(at), None) => Ok(Read::Big { version, at, ty: ty.to_vec() }),
        (Some(_), Some(at), Some(Value::Bulk(d))) if v.len() == 6 => {
            Ok(Read::Value { version, at, value: Bytes::copy_from_slice(d) })
        }
        (Some(_), Some(at), Some(Value::Bulk(d))) => Ok(Read::Dump { version, at, dump: Bytes::copy_from_slice(d) }),
        // (a key that expired between TYPE and DUMP)
        (Some(_), Some(_), Some(_)) => Ok(Read::Gone { version }),
        _ => Err("unexpected reply to the read".into()),
    }
}

/// The version hash and the big-copy key of `key`, on the target.
fn beside(key: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let tag = slot_tag(slot(key)).as_bytes();
    let mut v = Vec::with_capacity(tag.len() + 3);
    v.extend_from_slice(b"{");
    v.extend_from_slice(tag);
    v.extend_from_slice(b"}v");
    let mut t = Vec::with_capacity(tag.len() + 4 + key.len());
    t.extend_from_slice(&v[..v.len() - 1]);
    t.extend_from_slice(b"t:");
    t.extend_from_slice(key);
    (v, t)
}

/// Copies `keys` (from a `SCAN` of source master `m`): one pipelined read on `m`, one
/// pipelined write per target master, big keys one by one in pieces.
pub async fn copy_batch(
    src: &mut Nodes,
    dst: &mut Nodes,
    m: &Arc<str>,
    keys: &[Vec<u8>],
    logical: bool,
    out: &mut Copied,
) -> Result<(), String> {
    if keys.is_empty() {
        return Ok(());
    }
    let big = BIG.to_string();
    let how: &[u8] = if logical { b"logical" } else { b"dump" };
    let refs: Vec<Vec<&[u8]>> = keys
        .iter()
        .map(|k| vec![&b"EVALSHA"[..], READ_SCRIPT.sha(), b"1", k.as_slice(), big.as_bytes(), how])
        .collect();
    let replies = scripted(src, m, &READ_SCRIPT, &refs).await?;
    let mut reads = Vec::with_capacity(keys.len());
    for ((k, r), cmd) in keys.iter().zip(replies).zip(&refs) {
        let r = match parse_read(&r) {
            // (a slot moved since the scan: read where it is now)
            Err(_) => {
                let owner = src.owner(k)?;
                parse_read(
                    &scripted(src, &owner, &READ_SCRIPT, std::slice::from_ref(cmd)).await?.pop().unwrap_or_default(),
                )
            }
            ok => ok,
        };
        reads.push(r);
    }
    // the writes, by target master
    let mut by_owner: HashMap<Arc<str>, Vec<(usize, Command)>> = HashMap::new();
    let mut bigs = Vec::new();
    for (i, (k, r)) in keys.iter().zip(reads).enumerate() {
        let (version, mode, at, dump) = match r {
            Err(e) => {
                out.fail(k, e);
                continue;
            }
            Ok(Read::Big { version, at, ty }) => {
                bigs.push((i, version, at, ty));
                continue;
            }
            Ok(Read::Gone { version }) => {
                out.gone += 1;
                (version, &b"del"[..], -1, Bytes::new())
            }
            Ok(Read::Dump { version, at, dump }) => {
                out.bytes += dump.len() as u64;
                (version, &b"dump"[..], at, dump)
            }
            Ok(Read::Value { version, at, value }) => {
                out.bytes += value.len() as u64;
                (version, &b"set"[..], at, value)
            }
        };
        by_owner.entry(dst.owner(k)?).or_default().push((i, write_cmd(k, version, mode, at, &dump)));
    }
    for (addr, writes) in by_owner {
        let refs: Vec<Vec<&[u8]>> = writes.iter().map(|(_, c)| c.iter().map(Vec::as_slice).collect()).collect();
        let replies = scripted(dst, &addr, &WRITE_SCRIPT, &refs).await?;
        for ((i, _), r) in writes.iter().zip(replies) {
            count_write(&keys[*i], &r, out);
        }
    }
    for (i, version, at, ty) in bigs {
        copy_big(src, dst, &keys[i], version, at, &ty, out).await?;
    }
    Ok(())
}

/// A command's arguments.
type Command = Vec<Vec<u8>>;

fn write_cmd(key: &[u8], version: u64, mode: &[u8], at: i64, dump: &[u8]) -> Command {
    let (v, t) = beside(key);
    vec![
        b"EVALSHA".to_vec(),
        WRITE_SCRIPT.sha().to_vec(),
        b"3".to_vec(),
        key.to_vec(),
        v,
        t,
        version.to_string().into_bytes(),
        mode.to_vec(),
        at.to_string().into_bytes(),
        dump.to_vec(),
    ]
}

fn count_write(key: &[u8], r: &[u8], out: &mut Copied) {
    match int(r) {
        Some(1) => out.applied += 1,
        Some(0) => out.kept += 1,
        _ => out.fail(
            key,
            error_text(r).map_or_else(|| "unexpected reply".into(), |e| String::from_utf8_lossy(e).into_owned()),
        ),
    }
}

/// Copies a big collection in pieces into its copy key on the target, then renames it
/// over the key if no newer copy was applied meanwhile.
async fn copy_big(
    src: &mut Nodes,
    dst: &mut Nodes,
    key: &[u8],
    version: u64,
    at: i64,
    ty: &[u8],
    out: &mut Copied,
) -> Result<(), String> {
    let (_, tmp) = beside(key);
    let chunk = super::verify::CHUNK.to_string();
    let from_node = src.owner(key)?;
    let to = dst.owner(key)?;
    dst.ask(&to, vec![b"DEL", &tmp]).await?;
    let mut cursor = b"0".to_vec();
    let mut index = 0i64;
    let mut from = b"-".to_vec();
    loop {
        let (items, done) = match ty {
            b"stream" => {
                // entries from `from` on: id, then its fields and values
                let r = src.ask(&from_node, vec![b"XRANGE", key, &from, b"+", b"COUNT", chunk.as_bytes()]).await?;
                let Ok((Value::Array(v), _)) = Value::parse(&r) else {
                    return Err(format!("XRANGE of a stream: {r:?}"));
                };
                let mut entries = Vec::new();
                for e in &v {
                    if let Value::Array(e) = e
                        && let [Value::Bulk(id), Value::Array(fv)] = &e[..]
                    {
                        let mut cmd = vec![b"XADD".to_vec(), tmp.clone(), id.to_vec()];
                        cmd.extend(fv.iter().filter_map(Value::as_bytes).map(<[u8]>::to_vec));
                        from = [b"(", *id].concat();
                        entries.push(cmd);
                    }
                }
                let done = entries.len() < super::verify::CHUNK;
                if !entries.is_empty() {
                    let mut cmds: Vec<Vec<&[u8]>> =
                        entries.iter().map(|c| c.iter().map(Vec::as_slice).collect()).collect();
                    cmds.push(vec![b"PEXPIRE", &tmp, PIECES_TTL_MS.as_bytes()]);
                    out.bytes += entries.iter().flatten().map(|a| a.len() as u64).sum::<u64>();
                    let replies = dst.pipe(&to, &cmds).await?;
                    if let Some(e) = replies.iter().find_map(|r| error_text(r)) {
                        out.fail(key, String::from_utf8_lossy(e).into_owned());
                        return Ok(());
                    }
                }
                (Vec::new(), done)
            }
            b"hash" | b"set" | b"zset" | b"list" => match ty {
                b"list" => {
                    let (a, b) = (index.to_string(), (index + super::verify::CHUNK as i64 - 1).to_string());
                    let r = src.ask(&from_node, vec![b"LRANGE", key, a.as_bytes(), b.as_bytes()]).await?;
                    let Ok((Value::Array(v), _)) = Value::parse(&r) else {
                        return Err(format!("LRANGE of a big key: {r:?}"));
                    };
                    let items: Vec<Vec<u8>> = v.iter().filter_map(Value::as_bytes).map(<[u8]>::to_vec).collect();
                    index += items.len() as i64;
                    let done = items.len() < super::verify::CHUNK;
                    (items, done)
                }
                _ => {
                    let scan = match ty {
                        b"hash" => &b"HSCAN"[..],
                        b"set" => b"SSCAN",
                        _ => b"ZSCAN",
                    };
                    let r = src.ask(&from_node, vec![scan, key, &cursor, b"COUNT", chunk.as_bytes()]).await?;
                    let (next, items) = scan_reply(&r)?;
                    cursor = next;
                    (items, cursor == b"0")
                }
            },
            _ => {
                out.fail(key, format!("a {} cannot be copied by value", String::from_utf8_lossy(ty)));
                return Ok(());
            }
        };
        if !items.is_empty() {
            out.bytes += items.iter().map(|i| i.len() as u64).sum::<u64>();
            let add: &[u8] = match ty {
                b"list" => b"RPUSH",
                b"hash" => b"HSET",
                b"set" => b"SADD",
                _ => b"ZADD",
            };
            let mut cmd: Vec<&[u8]> = vec![add, &tmp];
            if ty == b"zset" {
                // ZSCAN gives member, score; ZADD takes score, member
                for p in items.chunks(2) {
                    if let [m, s] = p {
                        cmd.extend([s.as_slice(), m.as_slice()]);
                    }
                }
            } else {
                cmd.extend(items.iter().map(Vec::as_slice));
            }
            let replies = dst.pipe(&to, &[cmd, vec![b"PEXPIRE", &tmp, PIECES_TTL_MS.as_bytes()]]).await?;
            if let Some(e) = replies.iter().find_map(|r| error_text(r)) {
                out.fail(key, String::from_utf8_lossy(e).into_owned());
                return Ok(());
            }
        }
        if done {
            break;
        }
    }
    out.big += 1;
    let w = write_cmd(key, version, b"rename", at, b"");
    let r =
        scripted(dst, &to, &WRITE_SCRIPT, &[w.iter().map(Vec::as_slice).collect()]).await?.pop().unwrap_or_default();
    count_write(key, &r, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_parsed_into_what_to_write() {
        let gone = parse_read(b"*2\r\n$10\r\n1700000000\r\n$2\r\n42\r\n").unwrap();
        assert!(matches!(gone, Read::Gone { version: 1_700_000_000_000_042 }));
        let big = parse_read(b"*4\r\n$1\r\n1\r\n$1\r\n2\r\n$4\r\nhash\r\n:-1\r\n").unwrap();
        assert!(matches!(big, Read::Big { version: 1_000_002, at: -1, ref ty } if ty == b"hash"));
        let dump = parse_read(b"*5\r\n$1\r\n1\r\n$1\r\n2\r\n$6\r\nstring\r\n:99\r\n$3\r\nabc\r\n").unwrap();
        assert!(matches!(dump, Read::Dump { at: 99, ref dump, .. } if &dump[..] == b"abc"));
        assert!(parse_read(b"-ERR no\r\n").is_err());
    }

    #[test]
    fn a_keys_version_and_pieces_live_in_its_slot() {
        let (v, t) = beside(b"user:{42}:name");
        assert_eq!(slot(&v), slot(b"user:{42}:name"));
        assert_eq!(slot(&t), slot(b"user:{42}:name"));
        assert!(t.ends_with(b"user:{42}:name"));
    }
}
