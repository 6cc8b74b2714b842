//! ACL through heatshield, against a real Redis 7.0.15: what heatshield answers itself
//! (`ACL WHOAMI`, `ACL CAT`) compared with what Redis answers, and the backend's user
//! never shown to a client.

mod common;

use std::collections::BTreeSet;

use common::client::{Conn, V};
use common::{Proxy, RedisStandalone, config_file};

/// heatshield's own commands and the ones it adds to Redis 7.0's table.
const HEATSHIELD_ONLY: &[&str] = &[
    "proxy",
    "hotkeys",
    "lock.acquire",
    "lock.release",
    "lock.extend",
    "lock.info",
    "client|setinfo",
    "client|no-touch",
];

fn names(v: &V) -> BTreeSet<String> {
    v.items().iter().map(V::text).collect()
}

#[test]
fn acl_cat_and_whoami_are_heatshield_s_never_the_backend_user_s() {
    // the backend logs heatshield in as a user of its own
    let redis = RedisStandalone::start();
    let mut admin = Conn::connect(redis.port());
    assert_eq!(
        admin.cmd(&["ACL", "SETUSER", "heatshield-backend", "on", ">backend-secret", "~*", "&*", "+@all"]),
        V::ok()
    );
    let (_d, conf) = config_file("[backend]\nusername = \"heatshield-backend\"\npassword = \"backend-secret\"\n");
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["SET", "k", "v"]), V::ok(), "heatshield logged in as its backend user");

    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), V::s("default"), "the client's user, not heatshield's backend user");

    // ACL CAT: Redis's categories, in Redis's order, then heatshield's own
    let redis_cats = admin.cmd(&["ACL", "CAT"]);
    let ours = c.cmd(&["ACL", "CAT"]);
    let mut want: Vec<String> = redis_cats.items().iter().map(V::text).collect();
    want.extend(["proxy".to_string(), "lock".to_string()]);
    assert_eq!(ours.items().iter().map(V::text).collect::<Vec<_>>(), want);

    // each category's commands: Redis's, plus only heatshield's additions
    for cat in redis_cats.items().iter().map(V::text) {
        let theirs = names(&admin.cmd(&["ACL", "CAT", &cat]));
        let mine = names(&c.cmd(&["ACL", "CAT", &cat.to_uppercase()]));
        let missing: Vec<&String> = theirs.difference(&mine).collect();
        let extra: Vec<&String> = mine.difference(&theirs).filter(|n| !HEATSHIELD_ONLY.contains(&n.as_str())).collect();
        assert!(missing.is_empty() && extra.is_empty(), "@{cat}: missing {missing:?}, extra {extra:?}");
    }
    assert_eq!(
        names(&c.cmd(&["ACL", "CAT", "lock"])),
        ["lock.acquire", "lock.extend", "lock.info", "lock.release"].iter().map(|s| s.to_string()).collect()
    );
    assert_eq!(names(&c.cmd(&["ACL", "CAT", "proxy"])), ["proxy".to_string()].into_iter().collect());
    // errors in Redis's words
    for args in [vec!["ACL", "CAT", "nope"], vec!["ACL", "CAT", "a", "b"], vec!["acl", "cat", "a", "b"]] {
        assert_eq!(c.cmd(&args), admin.cmd(&args), "{args:?}");
    }
}

/// The users of the differential test, as `ACL SETUSER` arguments.
const USERS: &[&[&str]] = &[
    // Redis 7.0's selectors, given as separate arguments (from the configuration file too)
    &[
        "mixed",
        "on",
        ">mpw",
        "~app:*",
        "+get",
        "(~log:*",
        "+set",
        "+lpush)",
        "(%R~other",
        "&weather",
        "+@read",
        "+publish)",
    ],
    &["app", "on", ">apppw", "~app:*", "&app.*", "+@all", "-@dangerous", "-@admin"],
    &["reader", "on", ">rpw", "%R~*", "resetchannels", "+@read", "+@connection"],
    &["writer", "on", ">wpw", "%W~log:*", "+@write", "-flushall", "+ping"],
    &["pinger", "on", ">ppw", "~*", "&*", "-@all", "+ping", "+client|setname"],
    &["subs", "on", ">spw", "resetchannels", "&news.*", "+subscribe", "+psubscribe", "+publish", "+ping"],
    &["sleeper", "off", ">zpw", "~*", "&*", "+@all"],
];

/// Commands every user tries, on heatshield and on the reference Redis alike.
fn matrix() -> Vec<Vec<&'static str>> {
    vec![
        vec!["GET", "app:1"],
        vec!["SET", "app:1", "v"],
        vec!["GET", "other"],
        vec!["SET", "log:1", "x"],
        vec!["LPUSH", "log:l", "x"],
        vec!["GET", "log:1"],
        vec!["DEL", "app:1"],
        vec!["MGET", "app:1", "other"],
        vec!["MGET", "app:1", "log:1"],
        vec!["MGET", "other", "other"],
        vec!["MSET", "app:1", "a", "app:2", "b"],
        vec!["HSET", "app:h", "f", "v"],
        vec!["EVAL", "return 1", "1", "app:1"],
        vec!["EVAL", "return 1", "1", "other"],
        vec!["PUBLISH", "news.sport", "m"],
        vec!["PUBLISH", "app.x", "m"],
        vec!["PUBLISH", "weather", "m"],
        vec!["PING"],
        vec!["CLIENT", "SETNAME", "n"],
        vec!["CLIENT", "KILL", "ID", "999999"],
        vec!["ACL", "WHOAMI"],
        vec!["ACL", "SETUSER", "intruder", "on", "nopass", "+@all"],
        vec!["ACL", "USERS"],
        vec!["CONFIG", "GET", "maxmemory-policy"],
        vec!["FLUSHALL"],
        vec!["KEYS", "nomatch:*"],
    ]
}

#[test]
fn users_and_rules_answer_as_redis_does() {
    let reference = RedisStandalone::start();
    let backing = RedisStandalone::start();
    // half of the users from heatshield's configuration, the rest made at runtime
    let (from_config, at_runtime) = USERS.split_at(3);
    let lines: Vec<String> = from_config.iter().map(|u| format!("\"{}\"", u.join(" "))).collect();
    let (_d, conf) = config_file(&format!("[server]\nusers = [{}]\n", lines.join(", ")));
    let proxy = Proxy::start_standalone(&backing, &["--config", &conf]);
    let mut admin_ref = Conn::connect(reference.port());
    let mut admin = Conn::connect(proxy.port());
    for u in USERS {
        let mut args = vec!["ACL", "SETUSER"];
        args.extend_from_slice(u);
        assert_eq!(admin_ref.cmd(&args), V::ok(), "{u:?}");
    }
    for u in at_runtime {
        let mut args = vec!["ACL", "SETUSER"];
        args.extend_from_slice(u);
        assert_eq!(admin.cmd(&args), V::ok(), "{u:?}");
    }
    assert_eq!(admin.cmd(&["ACL", "USERS"]), admin_ref.cmd(&["ACL", "USERS"]));
    for u in USERS {
        let (a, b) = (admin.cmd(&["ACL", "GETUSER", u[0]]), admin_ref.cmd(&["ACL", "GETUSER", u[0]]));
        // (flags and passwords exactly; the rules as heatshield writes them, checked below)
        assert_eq!(a.get("flags"), b.get("flags"), "{}", u[0]);
        assert_eq!(a.get("passwords"), b.get("passwords"), "{}", u[0]);
        assert_eq!(a.get("keys"), b.get("keys"), "{}", u[0]);
        assert_eq!(a.get("channels"), b.get("channels"), "{}", u[0]);
        selectors_alike(&a, &b, u[0]);
    }

    let mut cells = 0;
    for u in USERS {
        let (name, pass) = (u[0], u[2].trim_start_matches('>'));
        let mut ours = Conn::connect(proxy.port());
        let mut theirs = Conn::connect(reference.port());
        let auth = ["AUTH", name, pass];
        let logged_in = theirs.cmd(&auth);
        assert_eq!(ours.cmd(&auth), logged_in, "AUTH {name}");
        if logged_in.is_err() {
            continue; // (a user turned off)
        }
        for c in matrix() {
            let (a, b) = (ours.cmd(&c), theirs.cmd(&c));
            match (&b, c[0]) {
                // values differ by server (users, keys), not whether and how it was refused
                (_, "ACL" | "CONFIG") | (V::Arr(_), _) if !b.is_err() => {
                    assert!(!a.is_err(), "{name} {c:?}: heatshield refused it: {a:?}")
                }
                _ => assert_eq!(a, b, "{name} {c:?}"),
            }
            cells += 1;
        }
    }
    eprintln!("{cells} cells alike");
    // wrong passwords, unknown users, a user turned off: Redis's WRONGPASS
    for auth in [["AUTH", "app", "nope"], ["AUTH", "ghost", "x"], ["AUTH", "sleeper", "zpw"]] {
        assert_eq!(Conn::connect(proxy.port()).cmd(&auth), Conn::connect(reference.port()).cmd(&auth), "{auth:?}");
    }
}

#[test]
fn a_transaction_and_live_changes_and_deleted_users() {
    let redis = RedisStandalone::start();
    let (_d, conf) = config_file("[server]\nusers = [\"app on >apppw ~app:* +@all -@admin\"]\n");
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    let mut admin = Conn::connect(proxy.port());
    let mut app = Conn::connect(proxy.port());
    // HELLO 3 AUTH logs in too
    app.set_proto(common::client::Proto::Resp3);
    let hello = app.cmd(&["HELLO", "3", "AUTH", "app", "apppw"]);
    assert!(!hello.is_err(), "{hello:?}");
    assert_eq!(app.cmd(&["ACL", "WHOAMI"]), V::s("app"));
    // the configured passwords are never shown, only their hashes
    let shown = admin.cmd(&["PROXY", "CONFIG", "GET", "server.users"]);
    let shown = format!("{shown:?}");
    assert!(!shown.contains("apppw") && shown.contains("app on #"), "{shown}");
    let list = admin.cmd(&["CLIENT", "LIST"]).text();
    assert!(list.contains(" user=app "), "CLIENT LIST shows the user: {list}");
    // refused at queue time, and EXEC aborts, as on Redis
    assert_eq!(app.cmd(&["MULTI"]), V::ok());
    assert_eq!(app.cmd(&["SET", "app:1", "x"]), V::s("QUEUED"));
    assert_eq!(
        app.cmd(&["SET", "other", "x"]).err(),
        Some("NOPERM this user has no permissions to access one of the keys used as arguments")
    );
    assert_eq!(app.cmd(&["EXEC"]).err(), Some("EXECABORT Transaction discarded because of previous errors."));
    // a change reaches the live session at its next command
    assert!(app.cmd(&["GET", "other"]).is_err());
    assert_eq!(admin.cmd(&["ACL", "SETUSER", "app", "~other"]), V::ok());
    assert_eq!(app.cmd(&["GET", "other"]), V::Nil);
    assert_eq!(admin.cmd(&["ACL", "SETUSER", "app", "-get"]), V::ok());
    assert_eq!(app.cmd(&["GET", "other"]).err(), Some("NOPERM this user has no permissions to run the 'get' command"));
    // a deleted user's connections are closed
    assert_eq!(admin.cmd(&["ACL", "DELUSER", "app", "ghost"]), V::Int(1));
    assert!(app.expect_closed(std::time::Duration::from_secs(5)), "the deleted user's connection stays open");
    assert_eq!(admin.cmd(&["ACL", "DELUSER", "default"]).err(), Some("ERR The 'default' user cannot be removed"));
    // the default user turned off: new connections must log in as someone else
    assert_eq!(admin.cmd(&["ACL", "SETUSER", "ops", "on", ">opspw", "~*", "&*", "+@all"]), V::ok());
    assert_eq!(admin.cmd(&["ACL", "SETUSER", "default", "off"]), V::ok());
    let mut late = Conn::connect(proxy.port());
    assert_eq!(late.cmd(&["GET", "k"]).err(), Some("NOAUTH Authentication required."));
    assert_eq!(late.cmd(&["AUTH", "ops", "opspw"]), V::ok());
    assert_eq!(late.cmd(&["SET", "k", "v"]), V::ok());
    // refusals and failed logins counted by user and reason, never by a made-up name
    assert!(late.cmd(&["AUTH", "made-up-name", "x"]).is_err());
    let metrics = proxy.metrics_addr().unwrap();
    let series = |s: &str| common::http::scrape_series(&metrics, s).unwrap_or(0.0);
    assert!(series("heatshield_acl_denied_total{user=\"app\",reason=\"key\"}") >= 2.0);
    assert!(series("heatshield_acl_denied_total{user=\"app\",reason=\"command\"}") >= 1.0);
    assert!(series("heatshield_acl_denied_total{user=\"(unknown)\",reason=\"auth\"}") >= 1.0);
    let (_, body) = common::http_get(&metrics, "/metrics");
    assert!(!body.contains("made-up-name"), "a client-chosen name became a label");
}

/// `ACL GETUSER`'s selectors alike: as many, each with the same keys and channels and
/// commands [`rules_alike`].
fn selectors_alike(ours: &V, theirs: &V, user: &str) {
    let (a, b) = (ours.get("selectors").unwrap(), theirs.get("selectors").unwrap());
    let (a, b) = (a.items(), b.items());
    assert_eq!(a.len(), b.len(), "{user}: selectors {a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.get("keys"), y.get("keys"), "{user}: a selector's keys");
        assert_eq!(x.get("channels"), y.get("channels"), "{user}: a selector's channels");
        let (x, y) = (x.get("commands").unwrap().text(), y.get("commands").unwrap().text());
        assert!(rules_alike(&x, &y), "{user}: a selector's commands {x:?} vs {y:?}");
    }
}

/// `ACL GETUSER`'s `commands` (or `ACL LIST`'s rules) alike: the same `+@all` / `-@all`,
/// the same categories in the same order, the same single commands (which Redis lists
/// in its hash table's order, heatshield by name).
fn rules_alike(ours: &str, theirs: &str) -> bool {
    let split = |s: &str| {
        let words: Vec<String> = s.split(' ').map(String::from).collect();
        let (cats, cmds): (Vec<String>, Vec<String>) = words.into_iter().partition(|w| w[1..].starts_with('@'));
        (cats, cmds.into_iter().collect::<BTreeSet<String>>())
    };
    split(ours) == split(theirs)
}

/// Users of the generated matrix: key, channel, category, subcommand and first-argument
/// rules, set up alike on the reference Redis and on heatshield.
const MATRIX_USERS: &[&[&str]] = &[
    &["keys", "on", "nopass", "%R~app:*", "%W~log:*", "~rw:*", "&*", "+@all"],
    &["cats", "on", "nopass", "~*", "-@all", "+@read", "+@hash", "-hgetall", "+client|id", "+config|get", "+select|0"],
    &[
        "subs",
        "on",
        "nopass",
        "allkeys",
        "&news.*",
        "+@all",
        "-@admin",
        "+acl|whoami",
        "-object|encoding",
        "-@pubsub",
        "+subscribe",
    ],
    &["app", "on", "nopass", "~app:*", "&app.*", "+@all", "-@dangerous", "-@admin"],
    &["reader", "on", "nopass", "%R~*", "resetchannels", "+@read", "+@connection"],
    &["writer", "on", "nopass", "%W~log:*", "+@write", "-flushall", "+ping"],
    &["nothing", "on", "nopass", "resetkeys", "resetchannels", "-@all", "+@fast", "-@keyspace"],
    // selectors: a command runs when the root or one selector allows all of it
    &[
        "sels",
        "on",
        "nopass",
        "%R~app:*",
        "resetchannels",
        "-@all",
        "+@read",
        "(~log:*",
        "%R~rw:*",
        "+@write",
        "+@read)",
        "(&news.*",
        "%W~app:*",
        "+@pubsub",
        "+@write",
        "-psubscribe)",
    ],
];

/// Every command and subcommand the reference Redis lists (`COMMAND`), with its arity.
fn every_command(redis: &mut Conn) -> Vec<(Vec<String>, i64)> {
    let mut out = Vec::new();
    for c in redis.cmd(&["COMMAND"]).items() {
        let it = c.items();
        let name = it[0].text();
        out.push((vec![name.clone()], it[1].int()));
        if let Some(subs) = it.get(9) {
            for s in subs.items() {
                let s = s.items();
                let full = s[0].text();
                let sub = full.split_once('|').map_or(full.clone(), |(_, s)| s.to_string());
                out.push((vec![name.clone(), sub], s[1].int()));
            }
        }
    }
    out
}

/// The requests the matrix tries for a command: its fewest arguments (and one more
/// where it takes more), all one name, or names of every kind, or a count first (for
/// the commands whose keys follow a count).
fn requests_for(name: &[String], arity: i64) -> Vec<Vec<String>> {
    let fewest = (arity.unsigned_abs() as usize).saturating_sub(name.len());
    let counts: Vec<usize> = if arity < 0 { vec![fewest, fewest + 2] } else { vec![fewest] };
    let mut out = Vec::new();
    let mixed = ["app:1", "log:1", "rw:1", "other", "news.x", "app.x"];
    for n in counts {
        for tok in mixed {
            out.push((0..n).map(|_| tok.to_string()).collect::<Vec<_>>());
        }
        out.push((0..n).map(|i| mixed[i % mixed.len()].to_string()).collect());
        out.push((0..n).map(|i| mixed[(i + 1) % mixed.len()].to_string()).collect());
        if n >= 2 {
            let mut counted = vec!["1".to_string()];
            counted.extend((1..n).map(|i| mixed[i % mixed.len()].to_string()));
            out.push(counted);
        }
    }
    out.into_iter()
        .map(|args| {
            let mut full = name.to_vec();
            full.extend(args);
            full
        })
        .collect()
}

/// NOPERM for what `ACL DRYRUN` said.
fn noperm_for(dryrun: &str) -> String {
    if let Some(rest) = dryrun.strip_prefix("This user has no permissions to run the ") {
        format!("NOPERM this user has no permissions to run the {rest}")
    } else if dryrun.ends_with(" key") {
        "NOPERM this user has no permissions to access one of the keys used as arguments".into()
    } else {
        "NOPERM this user has no permissions to access one of the channels used as arguments".into()
    }
}

#[test]
fn a_generated_matrix_of_every_command_and_user_answers_as_redis_does() {
    let reference = RedisStandalone::start();
    let backing = RedisStandalone::start();
    let proxy = Proxy::start_standalone(&backing, &[]);
    let mut theirs = Conn::connect(reference.port());
    let mut ours = Conn::connect(proxy.port());
    for u in MATRIX_USERS {
        let mut args = vec!["ACL", "SETUSER"];
        args.extend_from_slice(u);
        assert_eq!(theirs.cmd(&args), V::ok(), "{u:?}");
        assert_eq!(ours.cmd(&args), V::ok(), "{u:?}");
    }
    // the rules shown as Redis 7.0 shows them
    for u in MATRIX_USERS {
        let (a, b) = (ours.cmd(&["ACL", "GETUSER", u[0]]), theirs.cmd(&["ACL", "GETUSER", u[0]]));
        for field in ["flags", "passwords", "keys", "channels"] {
            assert_eq!(a.get(field), b.get(field), "{} {field}", u[0]);
        }
        selectors_alike(&a, &b, u[0]);
        let (a, b) = (a.get("commands").unwrap().text(), b.get("commands").unwrap().text());
        assert!(rules_alike(&a, &b), "{}: heatshield shows {a:?}, Redis {b:?}", u[0]);
    }
    let (a, b) = (ours.cmd(&["ACL", "LIST"]), theirs.cmd(&["ACL", "LIST"]));
    assert_eq!(a.items().len(), b.items().len());
    for (a, b) in a.items().iter().zip(b.items()) {
        let (a, b) = (a.text(), b.text());
        let (rest_a, rules_a) = a.split_at(a.find(" +@all").or(a.find(" -@all")).unwrap());
        let (rest_b, rules_b) = b.split_at(b.find(" +@all").or(b.find(" -@all")).unwrap());
        assert_eq!(rest_a, rest_b);
        assert!(rules_alike(rules_a.trim(), rules_b.trim()), "ACL LIST: {a:?} vs {b:?}");
    }

    // every command × every user × several argument lists: ACL DRYRUN alike; what it
    // refuses, heatshield refuses when it is run, with Redis's NOPERM
    let mut as_user: Vec<Conn> = MATRIX_USERS
        .iter()
        .map(|u| {
            let mut c = Conn::connect(proxy.port());
            assert_eq!(c.cmd(&["AUTH", u[0], "x"]), V::ok());
            c
        })
        .collect();
    let (mut cells, mut refused) = (0, 0);
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for (name, arity) in every_command(&mut theirs) {
        // one command's cells pipelined on each server, then read
        let mut cell_list: Vec<(usize, Vec<String>)> = Vec::new();
        for req in requests_for(&name, arity) {
            for (i, u) in MATRIX_USERS.iter().enumerate() {
                let mut dry = vec!["ACL".to_string(), "DRYRUN".to_string(), u[0].to_string()];
                dry.extend(req.iter().cloned());
                ours.send(&dry);
                theirs.send(&dry);
                cell_list.push((i, req.clone()));
            }
        }
        let mut runs: Vec<Vec<(Vec<String>, String)>> = vec![Vec::new(); MATRIX_USERS.len()];
        for (i, req) in &cell_list {
            let (a, b) = (ours.read_reply(), theirs.read_reply());
            assert_eq!(a, b, "{} {req:?}", MATRIX_USERS[*i][0]);
            cells += 1;
            if b.is_ok() || b.is_err() {
                continue;
            }
            let verdict = b.text();
            let kind = if verdict.ends_with(" key") {
                "key"
            } else if verdict.ends_with(" channel") {
                "channel"
            } else {
                "command"
            };
            *kinds.entry(kind).or_default() += 1;
            // (QUIT: Redis 7.0 answers it before any check)
            if name[0] != "QUIT" {
                runs[*i].push((req.clone(), verdict));
            }
        }
        for (conn, runs) in as_user.iter_mut().zip(&runs) {
            for (req, _) in runs {
                conn.send(req);
            }
            for (req, verdict) in runs {
                let got = conn.read_reply();
                assert_eq!(got.err(), Some(noperm_for(verdict).as_str()), "{req:?} ({verdict})");
                refused += 1;
            }
        }
    }
    eprintln!("{cells} cells alike; {refused} refused when run ({kinds:?})");
    assert!(cells > 20_000 && kinds.len() == 3, "{cells} cells, refusals {kinds:?}");

    // DRYRUN's own errors
    for args in [
        vec!["ACL", "DRYRUN", "ghost", "GET", "k"],
        vec!["ACL", "DRYRUN", "keys", "NOSUCH", "k"],
        vec!["ACL", "DRYRUN", "keys", "GET"],
        vec!["ACL", "DRYRUN", "keys", "OBJECT", "NOPE", "x"],
    ] {
        assert_eq!(ours.cmd(&args), theirs.cmd(&args), "{args:?}");
    }
}

/// Before logging in, as Redis 7.0 answers: NOAUTH for everything but AUTH, HELLO (with
/// AUTH), QUIT and RESET, in Redis's bytes; RESET goes back to the `default` user.
#[test]
fn before_logging_in_every_answer_is_redis_s() {
    let reference = RedisStandalone::start();
    // (set once it answered the harness's PING)
    assert_eq!(Conn::connect(reference.port()).cmd(&["CONFIG", "SET", "requirepass", "pw"]), V::ok());
    let backing = RedisStandalone::start();
    let (_d, conf) = config_file("[server]\npassword = \"pw\"\nusers = [\"ops on >opspw ~* &* +@all\"]\n");
    let proxy = Proxy::start_standalone(&backing, &["--config", &conf]);
    let steps: &[&[&str]] = &[
        &["PING"],
        &["PING", "hello"],
        &["ECHO", "x"],
        &["GET", "k"],
        &["HELLO"],
        &["HELLO", "3"],
        &["HELLO", "2", "AUTH", "default", "wrong"],
        &["CLIENT", "SETNAME", "n"],
        &["RESET"],
        &["AUTH", "wrong"],
        &["GET", "k"],
        &["AUTH", "pw"],
        &["PING"],
        &["RESET"],
        &["PING"],
    ];
    let mut ours = Conn::connect(proxy.port());
    let mut theirs = Conn::connect(reference.port());
    for s in steps {
        assert_eq!(ours.cmd_full(s).raw, theirs.cmd_full(s).raw, "{s:?}");
    }
    // RESET after logging in as another user: back to `default`, not logged in
    assert_eq!(ours.cmd(&["AUTH", "ops", "opspw"]), V::ok());
    assert_eq!(ours.cmd(&["ACL", "WHOAMI"]), V::s("ops"));
    assert_eq!(ours.cmd(&["RESET"]), V::s("RESET"));
    assert_eq!(ours.cmd(&["ACL", "WHOAMI"]).err(), Some("NOAUTH Authentication required."));
    assert_eq!(ours.cmd(&["AUTH", "pw"]), V::ok());
    assert_eq!(ours.cmd(&["ACL", "WHOAMI"]), V::s("default"));
    let list = ours.cmd(&["CLIENT", "LIST"]).text();
    assert!(!list.contains("user=ops"), "CLIENT LIST still shows the user RESET left: {list}");
}

#[test]
fn acl_log_and_malformed_rules_as_on_redis() {
    let reference = RedisStandalone::start();
    let backing = RedisStandalone::start();
    let proxy = Proxy::start_standalone(&backing, &[]);
    for port in [reference.port(), proxy.port()] {
        let mut admin = Conn::connect(port);
        assert_eq!(
            admin.cmd(&["ACL", "SETUSER", "w", "on", ">pw", "~k*", "&ch", "+get", "+set", "+multi", "+publish"]),
            V::ok()
        );
        assert_eq!(admin.cmd(&["ACL", "LOG", "RESET"]), V::ok());
        let mut c = Conn::connect(port);
        assert!(c.cmd(&["AUTH", "w", "bad"]).is_err());
        assert!(c.cmd(&["AUTH", "nosuchuser", "bad"]).is_err());
        assert_eq!(c.cmd(&["AUTH", "w", "pw"]), V::ok());
        assert!(c.cmd(&["GET", "a"]).is_err());
        assert!(c.cmd(&["GET", "a"]).is_err());
        assert!(c.cmd(&["OBJECT", "ENCODING", "k1"]).is_err());
        assert!(c.cmd(&["PUBLISH", "other", "m"]).is_err());
        assert_eq!(c.cmd(&["MULTI"]), V::ok());
        assert!(c.cmd(&["SET", "a", "1"]).is_err());
    }
    let log = |port: u16, n: Option<&str>| {
        let mut args = vec!["ACL", "LOG"];
        args.extend(n);
        let v = Conn::connect(port).cmd(&args);
        v.items()
            .iter()
            .map(|e| {
                let f =
                    |k: &str| e.get(k).map(|v| v.as_text().unwrap_or_else(|| v.int().to_string())).unwrap_or_default();
                let info = f("client-info");
                assert!(info.contains(" user=") && info.starts_with("id="), "{info}");
                (f("count"), f("reason"), f("context"), f("object"), f("username"))
            })
            .collect::<Vec<_>>()
    };
    let ours = log(proxy.port(), None);
    assert_eq!(ours, log(reference.port(), None));
    assert_eq!(ours.len(), 6, "{ours:?}");
    assert_eq!(log(proxy.port(), Some("2")), log(reference.port(), Some("2")));
    for args in [vec!["ACL", "LOG", "x"], vec!["ACL", "LOG", "1", "2"], vec!["ACL", "LOG", "-1"]] {
        assert_eq!(Conn::connect(proxy.port()).cmd(&args), Conn::connect(reference.port()).cmd(&args), "{args:?}");
    }

    // malformed rules: Redis's errors, and nothing of the user changed
    let rules: &[&[&str]] = &[
        &["+nosuch"],
        &["+@nosuch"],
        &["bogus"],
        &["#abc"],
        &["<never"],
        &["allkeys", "~x"],
        &["allchannels", "&x"],
        &["%X~a"],
        &["%~a"],
        &["-select|0"],
        &["+client|kill|x"],
        &["+acl|nosuch"],
        &["+nosuch|x"],
        &["+get|"],
        &[">ok", "+nosuch"],
        &["on", "+get", "bogus"],
        // selectors: one left open, rules no selector takes, an error inside one
        &["(~a", "+get"],
        &["(~a", "+get)", "(&x"],
        &["(on)"],
        &["(>pw", "+get)"],
        &["a)"],
        &["(+nosuch)"],
        &["(~a", "(~b)"],
        &["(allkeys", "~x)"],
        &["(~x", "+get", "(~y", "z)"],
    ];
    let mut ours = Conn::connect(proxy.port());
    let mut theirs = Conn::connect(reference.port());
    for r in rules {
        let mut args = vec!["ACL", "SETUSER", "w"];
        args.extend_from_slice(r);
        assert_eq!(ours.cmd(&args), theirs.cmd(&args), "{r:?}");
        assert_eq!(
            ours.cmd(&["ACL", "GETUSER", "w"]).get("passwords"),
            theirs.cmd(&["ACL", "GETUSER", "w"]).get("passwords")
        );
    }
    for args in [vec!["ACL", "GENPASS", "0"], vec!["ACL", "GENPASS", "x"]] {
        assert_eq!(ours.cmd(&args), theirs.cmd(&args), "{args:?}");
    }
    assert_eq!(ours.cmd(&["ACL", "GENPASS"]).text().len(), 64);
    assert_eq!(ours.cmd(&["ACL", "GENPASS", "5"]).text().len(), theirs.cmd(&["ACL", "GENPASS", "5"]).text().len());
}

#[test]
fn failed_logins_are_rate_limited_per_client_address() {
    let redis = RedisStandalone::start();
    let (_d, conf) = config_file("[server]\nauth_failures_per_minute = 60\nusers = [\"app on >right ~* +@all\"]\n");
    let proxy = Proxy::start_standalone(&redis, &["--config", &conf]);
    let mut c = Conn::connect(proxy.port());
    for _ in 0..60 {
        assert_eq!(
            c.cmd(&["AUTH", "app", "guess"]).err(),
            Some("WRONGPASS invalid username-password pair or user is disabled.")
        );
    }
    // the bucket is empty: even the right password is refused, unchecked
    assert!(c.cmd(&["AUTH", "app", "right"]).is_err());
    assert!(
        Conn::connect(proxy.port()).cmd(&["HELLO", "3", "AUTH", "app", "right"]).is_err(),
        "a new connection from the same address too"
    );
    let metrics = proxy.metrics_addr().unwrap();
    let limited =
        common::http::scrape_series(&metrics, "heatshield_acl_denied_total{user=\"app\",reason=\"auth_rate\"}");
    assert!(limited.unwrap_or(0.0) >= 2.0, "{limited:?}");
    // it refills at 60 a minute: a second later one try is allowed, and it succeeds
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(c.cmd(&["AUTH", "app", "right"]), V::ok());
    assert_eq!(c.cmd(&["ACL", "WHOAMI"]), V::s("app"));
}

#[test]
fn split_commands_across_masters_are_all_or_nothing() {
    let env = common::ClusterEnv::start(None);
    let masters = env.owners.masters();
    let a = format!("app:{}", env.owners.tag_on(masters[0], "s"));
    let b = format!("app:{}", env.owners.tag_on(masters[1], "s"));
    let other = env.owners.tag_on(masters[2], "other");
    let mut admin = Conn::connect(env.proxy.port());
    assert_eq!(admin.cmd(&["ACL", "SETUSER", "app", "on", ">pw", "~app:*", "+@all"]), V::ok());
    let mut app = Conn::connect(env.proxy.port());
    assert_eq!(app.cmd(&["AUTH", "app", "pw"]), V::ok());
    assert_eq!(app.cmd(&["MSET", &a, "1", &b, "2"]), V::ok(), "keys on two masters, all allowed");
    assert_eq!(app.cmd(&["MGET", &a, &b]), V::strs(&["1", "2"]));
    let key_refused = Some("NOPERM this user has no permissions to access one of the keys used as arguments");
    // one key refused: nothing is sent to any master
    assert_eq!(app.cmd(&["MSET", &a, "x", &other, "y"]).err(), key_refused);
    assert_eq!(app.cmd(&["DEL", &a, &b, &other]).err(), key_refused);
    assert_eq!(app.cmd(&["MGET", &a, &other]).err(), key_refused);
    assert_eq!(admin.cmd(&["MGET", &a, &b, &other]), V::Arr(vec![V::s("1"), V::s("2"), V::Nil]));
    assert_eq!(app.cmd(&["DEL", &a, &b]), V::Int(2));
}
