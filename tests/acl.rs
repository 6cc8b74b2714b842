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
