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
