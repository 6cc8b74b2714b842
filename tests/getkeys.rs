//! Key extraction against Redis's own: for every command in heatshield's table, and for
//! a list of argument lists that are known to be tricky (keywords that look like key
//! markers, numkeys that do not match, a consumer named STREAMS, ...), the keys
//! heatshield routes by ([`heatshield::command::keys_of`]) are the keys a real
//! `redis-server` names in `COMMAND GETKEYS` for the same arguments.
//!
//! Where Redis finds no keys or refuses the arguments, heatshield must not route by a key
//! either (it may find none or answer an error itself).
//!
//! The same against Valkey 9.1, with the table as heatshield learns it from Valkey's own
//! `COMMAND` (docs/commands.md): every command Valkey has, its newer ones routed by the
//! key specs it reports.

mod common;

use heatshield::command::{CommandTable, keys_of, learned};
use heatshield::protocol::Request;

use common::client::{Conn, V};
use common::{RedisServer, RedisStandalone};

/// Argument lists (command name included) whose keys are easy to get wrong.
const TRICKY: &[&[&str]] = &[
    &["XREADGROUP", "GROUP", "g", "STREAMS", "COUNT", "1", "STREAMS", "s1", ">"],
    &["XREADGROUP", "GROUP", "g", "c", "STREAMS", "s1", "s2", ">", ">"],
    &["XREADGROUP", "GROUP", "g", "c", "COUNT", "2", "BLOCK", "0", "NOACK", "STREAMS", "s1", ">"],
    &["XREAD", "COUNT", "1", "STREAMS", "s1", "s2", "0", "0"],
    &["XREAD", "BLOCK", "100", "STREAMS", "streams", "0"],
    &["XREAD", "STREAMS", "s1", "STREAMS", "0", "0"],
    &["SORT", "k", "BY", "w_*", "GET", "o_*", "STORE", "dst"],
    &["SORT", "k", "LIMIT", "0", "1", "STORE", "dst", "ALPHA"],
    &["SORT", "k", "GET", "store"],
    &["SORT_RO", "k", "BY", "nosort"],
    &["GEORADIUS", "g", "0", "0", "1", "km", "STORE", "dst"],
    &["GEORADIUS", "g", "0", "0", "1", "km", "STOREDIST", "dst"],
    &["GEORADIUS", "g", "0", "0", "1", "km", "WITHDIST", "COUNT", "3"],
    &["GEORADIUSBYMEMBER", "g", "m", "1", "km", "STORE", "dst"],
    &["GEORADIUSBYMEMBER_RO", "g", "m", "1", "km"],
    &["GEOSEARCHSTORE", "dst", "src", "FROMMEMBER", "m", "BYRADIUS", "1", "km"],
    &["EVAL", "return 1", "0"],
    &["EVAL", "return 1", "2", "a", "b", "arg"],
    &["EVAL_RO", "return 1", "1", "a", "arg1", "arg2"],
    &["EVALSHA", "0000000000000000000000000000000000000000", "1", "a"],
    &["FCALL", "f", "2", "a", "b"],
    &["FCALL_RO", "f", "0", "x"],
    &["ZUNIONSTORE", "dst", "2", "a", "b", "WEIGHTS", "1", "2"],
    &["ZINTERSTORE", "dst", "1", "a", "AGGREGATE", "MAX"],
    &["ZDIFFSTORE", "dst", "2", "a", "b"],
    &["ZUNION", "2", "a", "b", "WITHSCORES"],
    &["ZINTER", "1", "a"],
    &["ZDIFF", "3", "a", "b", "c"],
    &["ZINTERCARD", "2", "a", "b", "LIMIT", "1"],
    &["SINTERCARD", "2", "a", "b", "LIMIT", "5"],
    &["LMPOP", "2", "a", "b", "LEFT", "COUNT", "2"],
    &["BLMPOP", "0", "1", "a", "RIGHT"],
    &["ZMPOP", "1", "a", "MIN"],
    &["BZMPOP", "1.5", "2", "a", "b", "MAX", "COUNT", "1"],
    &["MSET", "a", "1", "b", "2", "c", "3"],
    &["MSETNX", "a", "1", "b", "2"],
    &["MGET", "a", "b", "a"],
    &["DEL", "a"],
    &["BLPOP", "a", "b", "0"],
    &["BRPOPLPUSH", "a", "b", "0"],
    &["BLMOVE", "a", "b", "LEFT", "RIGHT", "0"],
    &["LMOVE", "a", "b", "LEFT", "LEFT"],
    &["SMOVE", "a", "b", "m"],
    &["RENAME", "a", "b"],
    &["COPY", "a", "b", "REPLACE"],
    &["LCS", "a", "b", "LEN"],
    &["BITOP", "AND", "dst", "a", "b"],
    &["PFMERGE", "dst", "a", "b"],
    &["PFCOUNT", "a", "b"],
    &["SUNIONSTORE", "dst", "a", "b"],
    &["ZRANGESTORE", "dst", "src", "0", "-1"],
    &["OBJECT", "ENCODING", "k"],
    &["OBJECT", "FREQ", "k"],
    &["MEMORY", "USAGE", "k", "SAMPLES", "5"],
    &["XINFO", "STREAM", "s", "FULL"],
    &["XINFO", "GROUPS", "s"],
    &["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"],
    &["XAUTOCLAIM", "s", "g", "c", "0", "0"],
    &["XCLAIM", "s", "g", "c", "0", "1-1"],
    &["BITFIELD", "k", "GET", "u8", "0"],
    &["BITFIELD_RO", "k", "GET", "u8", "0"],
    &["SET", "k", "v", "GET", "KEEPTTL"],
    &["GETEX", "k", "PERSIST"],
    &["WATCH", "a", "b"],
    &["EXISTS", "a", "a", "b"],
    &["TOUCH", "a"],
    &["UNLINK", "a", "b"],
    &["RESTORE", "k", "0", "x"],
    &["DUMP", "k"],
    &["SUBSCRIBE", "ch"],
    &["PUBLISH", "ch", "m"],
    &["SPUBLISH", "ch", "m"],
    &["SSUBSCRIBE", "ch1", "ch2"],
    &["PFDEBUG", "GETREG", "k"],
    &["LPOS", "k", "v", "RANK", "1"],
    &["OBJECT", "HELP"],
    &["SCRIPT", "EXISTS", "x"],
    &["CLIENT", "LIST"],
];

/// Filler arguments for a command's generic argument lists: words first, then numbers
/// first (so numkeys-style specs find a count).
const WORDS: &[&str] = &["k1", "k2", "k3", "k4", "k5", "k6", "k7"];
const NUMBERED: &[&str] = &["2", "k1", "k2", "k3", "k4", "k5", "k6"];

/// Redis's `COMMAND GETKEYS` for `args`: the keys, or its error text.
fn redis_keys(c: &mut Conn, args: &[&str]) -> Result<Vec<String>, String> {
    let mut q = vec!["COMMAND", "GETKEYS"];
    q.extend_from_slice(args);
    match c.cmd(&q) {
        V::Err(e) => Err(e),
        V::Arr(items) => Ok(items.iter().map(V::text).collect()),
        other => panic!("COMMAND GETKEYS {args:?}: unexpected reply {other:?}"),
    }
}

/// heatshield's keys for `args`: `Ok(None)` when it does not route by a key (unknown
/// command, wrong arity, no keys), `Err` for an error it answers itself.
fn heatshield_keys(table: &CommandTable, args: &[&str]) -> Result<Option<Vec<String>>, &'static str> {
    let req = Request::from_args(args);
    let Ok(cmd) = table.lookup(&req) else { return Ok(None) };
    let keys = keys_of(cmd, &req)?;
    if keys.is_empty() {
        return Ok(None);
    }
    Ok(Some(keys.iter().map(|&i| String::from_utf8_lossy(req.arg(i as usize)).into_owned()).collect()))
}

/// Shard channels: Redis's key specs mark them `not_key` (so `COMMAND GETKEYS` names
/// none), yet Redis Cluster routes these commands by the channel's slot, as heatshield
/// does: the channels are where its keys are.
fn shard_channels(args: &[&str]) -> Option<Vec<String>> {
    let name = args[0].to_ascii_uppercase();
    let chans: &[&str] = match name.as_str() {
        "SPUBLISH" => &args[1..2],
        "SSUBSCRIBE" | "SUNSUBSCRIBE" => &args[1..],
        _ => return None,
    };
    Some(chans.iter().map(|s| s.to_string()).collect())
}

/// The argument lists tried for the table's command `full` (`PARENT|SUB` for a
/// subcommand): the fewest fillers its arity accepts, and two more, each with words first
/// and with a number first (so numkeys-style specs find a count).
fn generic_args(table: &CommandTable, full: &str) -> Vec<Vec<String>> {
    let name: Vec<String> = full.split('|').map(str::to_string).collect();
    let with = |fill: &[&str], n: usize| -> Vec<String> {
        let mut a = name.clone();
        a.extend(fill.iter().cycle().take(n).map(|s| s.to_string()));
        a
    };
    let accepts = |a: &[String]| table.lookup(&Request::from_args(a)).is_ok();
    let Some(least) = (0..8).find(|&n| accepts(&with(WORDS, n))) else { return vec![] };
    let mut out = vec![];
    for n in [least, least + 2] {
        for fill in [WORDS, NUMBERED] {
            let a = with(fill, n);
            if accepts(&a) {
                out.push(a);
            }
        }
    }
    out
}

#[test]
fn keys_match_redis_command_getkeys() {
    let server = RedisStandalone::start();
    let with_keys = compare_getkeys(server.port(), &CommandTable::new());
    assert!(with_keys >= 200, "too few argument lists with keys compared ({with_keys}): the test would prove little");
}

#[test]
fn keys_match_valkey_command_getkeys_with_the_learned_table() {
    let server = RedisServer::standalone_of(&common::redis::valkey_server_required(), &[]);
    let table = CommandTable::new();
    let defs = learned::parse_commands(&raw_reply(server.port(), &["COMMAND"])).unwrap();
    let learning = table.learn(&defs, vec![], vec![]);
    assert!(learning.added.iter().any(|n| n == "HGETEX"), "{learning:?}");
    let with_keys = compare_getkeys(server.port(), &table);
    assert!(with_keys >= 230, "too few argument lists with keys compared ({with_keys}): the test would prove little");
}

/// The raw reply of one request to the server on `port`.
fn raw_reply(port: u16, args: &[&str]) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(Request::from_args(args).raw()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(len) = heatshield::protocol::reply::reply_len(&buf).unwrap() {
            buf.truncate(len);
            return buf;
        }
    }
}

/// Compares heatshield's keys with the server's `COMMAND GETKEYS` for the tricky argument
/// lists and every command of `table`; returns how many had keys.
fn compare_getkeys(port: u16, table: &CommandTable) -> usize {
    let mut c = Conn::connect(port);
    let mut cases: Vec<Vec<String>> = TRICKY.iter().map(|a| a.iter().map(|s| s.to_string()).collect()).collect();
    for id in 0..table.count() {
        if table.name_of(id) != "unknown" {
            cases.extend(generic_args(table, table.name_of(id)));
        }
    }

    let (mut compared, mut with_keys, mut own_errors) = (0, 0, 0);
    let mut problems = vec![];
    for case in &cases {
        let args: Vec<&str> = case.iter().map(String::as_str).collect();
        let ours = heatshield_keys(table, &args);
        let theirs = redis_keys(&mut c, &args);
        compared += 1;
        match (&theirs, &ours) {
            (Ok(t), Ok(Some(o))) if t == o => with_keys += 1,
            // Redis names no key: heatshield must not route by one
            (Ok(t), Ok(None)) if t.is_empty() => {}
            // an error heatshield answers itself (a bad numkeys): Redis's own text when it
            // runs the command (only numkeys-style commands get here, all safe to run)
            (_, Err(e)) => {
                own_errors += 1;
                match c.cmd(&args) {
                    V::Err(r) if r == *e => {}
                    other => problems.push(format!("{args:?}: heatshield answers {e:?}, Redis {other:?}")),
                }
            }
            (Err(e), Ok(Some(o))) if e.contains("no key arguments") && shard_channels(&args).as_ref() == Some(o) => {
                with_keys += 1
            }
            // arguments Redis 7.0 refuses (a command or arity of a later Redis): the
            // master the keys lead to answers that error itself
            (Err(e), _) if e.contains("Invalid command specified") || e.contains("Invalid arguments") => {}
            (Err(_), Ok(None)) => {}
            _ => problems.push(format!("{args:?}: Redis {theirs:?}, heatshield {ours:?}")),
        }
    }
    eprintln!("{own_errors} answered by heatshield with an error");
    eprintln!("{compared} argument lists compared, {with_keys} with keys; {} differ", problems.len());
    assert!(problems.is_empty(), "{} differences:\n{}", problems.len(), problems.join("\n"));
    with_keys
}

/// The errors heatshield answers before a command reaches Redis (wrong number of
/// arguments, unknown subcommand) are Redis's own texts. Redis checks both before it runs
/// anything, so every command can be tried against it safely.
#[test]
fn arity_and_unknown_subcommand_errors_match_redis() {
    let server = RedisStandalone::start();
    let mut c = Conn::connect(server.port());
    let table = CommandTable::new();
    let (mut compared, mut problems) = (0, vec![]);
    for id in 0..table.count() {
        let full = table.name_of(id);
        let mut args: Vec<String> = full.split('|').map(str::to_string).collect();
        if args[0].starts_with("LOCK.") {
            continue; // heatshield's own
        }
        let mut cases = vec![];
        // one argument too few and one too many, where the arity says so
        for extra in 0..8 {
            let mut a = args.clone();
            a.extend((0..extra).map(|i| format!("a{i}")));
            if table.lookup(&Request::from_args(&a)).is_ok() {
                if extra > 0 || args.len() > 1 {
                    let mut fewer = a.clone();
                    fewer.pop();
                    cases.push(fewer);
                }
                let mut more = a.clone();
                more.push("extra".into());
                cases.push(more);
                break;
            }
        }
        if args.len() == 2 {
            args[1] = "NO-SUCH-SUBCOMMAND".into();
            cases.push(args.clone());
        }
        for a in cases {
            let Err(ours) = table.lookup(&Request::from_args(&a)) else { continue };
            compared += 1;
            let theirs = c.cmd(&a);
            if theirs
                .err()
                .is_some_and(|e| e.starts_with("ERR unknown command") || e.starts_with("ERR unknown subcommand"))
                && !a[a.len() - 1].eq_ignore_ascii_case("NO-SUCH-SUBCOMMAND")
            {
                // a command of a later Redis (CLIENT SETINFO) or heatshield's own (PROXY)
                continue;
            }
            if theirs != V::Err(ours.message().to_string()) {
                problems.push(format!("{a:?}: heatshield {:?}, Redis {theirs:?}", ours.message()));
            }
        }
    }
    eprintln!("{compared} refused argument lists compared; {} differ", problems.len());
    assert!(compared >= 100, "too few refusals compared ({compared})");
    assert!(problems.is_empty(), "{} differences:\n{}", problems.len(), problems.join("\n"));
}
