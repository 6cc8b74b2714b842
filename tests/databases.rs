//! Numbered databases (docs/commands.md): in front of a Valkey 9.1 cluster with
//! `cluster-databases 16` (3 masters, 3 replicas, its own), and of a standalone Redis
//! 7.0 (16 databases), `SELECT n` works as on one server: two clients in different
//! databases pipelining on the same key names over heatshield's shared connections each
//! see their own; transactions, WATCH, blocking pops, scripts, scans, counts and flushes
//! stay in the client's database; the hot-key cache keeps each database's values apart,
//! never answering a read with another database's value, nor keeping one after a MOVE.

mod common;

use std::time::Duration;

use common::client::{Conn, V};
use common::{Proxy, RedisCluster, RedisStandalone, cmd, config_file};

const CONFIG: &str = r#"
[server]
allow_flush = true

[cache]
pin = ["{dbc}*"]

[[backend.read_rules]]
pattern = "dbr:*"
read_from = "replica"
max_lag_ms = 5000
"#;

/// Runs `args` on `port` in database `db` (a connection of its own).
fn in_db(port: u16, db: u32, args: &[&str]) -> V {
    let mut c = Conn::connect(port);
    assert_eq!(c.cmd(&["SELECT", &db.to_string()]), V::ok());
    c.cmd(args)
}

#[test]
fn select_works_in_front_of_a_valkey_cluster_with_databases() {
    let cluster = RedisCluster::start_valkey(&["cluster-databases 16"]);
    let (_conf, path) = config_file(CONFIG);
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let port = proxy.port();
    let mut zero = Conn::connect(port);
    let mut three = Conn::connect(port);
    assert_eq!(three.cmd(&["SELECT", "3"]), V::ok());
    assert!(three.cmd(&["CLIENT", "INFO"]).text().contains(" db=3 "));
    assert_eq!(three.cmd(&["SET", "db:k", "three"]), V::ok());
    assert_eq!(three.cmd(&["GET", "db:k"]), V::s("three"));
    assert!(zero.cmd(&["GET", "db:k"]).is_nil());
    let owner = cluster.master_for_key(b"db:k");
    assert_eq!(in_db(owner, 3, &["GET", "db:k"]), V::s("three"));
    assert!(cmd(owner, &["GET", "db:k"]).is_nil());
    // Redis's texts for a database that is not there
    assert_eq!(three.cmd(&["SELECT", "16"]).err(), Some("ERR DB index is out of range"));
    assert_eq!(three.cmd(&["SELECT", "x"]).err(), Some("ERR value is not an integer or out of range"));
    assert!(three.cmd(&["GET", "db:k"]) == V::s("three"), "a refused SELECT changed the database");

    // two clients pipelining on the same names in two databases, over shared connections
    let mut five = Conn::connect(port);
    assert_eq!(five.cmd(&["SELECT", "5"]), V::ok());
    let mut batch0 = Vec::new();
    let mut batch5 = Vec::new();
    for i in 0..300 {
        let key = format!("db:p{}", i % 30);
        batch0.push(common::client::encode(&["INCRBY", &key, "1"]));
        batch5.push(common::client::encode(&["INCRBY", &key, "1000"]));
    }
    zero.send_raw(&batch0.concat());
    five.send_raw(&batch5.concat());
    for _ in 0..300 {
        assert!(zero.read_reply().err().is_none());
        assert!(five.read_reply().err().is_none());
    }
    for i in 0..30 {
        let key = format!("db:p{i}");
        assert_eq!(zero.cmd(&["GET", &key]), V::s("10"), "{key} in db 0");
        assert_eq!(five.cmd(&["GET", &key]), V::s("10000"), "{key} in db 5");
    }

    // a transaction and a script run in the client's database
    assert_eq!(three.cmd(&["MULTI"]), V::s("OK"));
    assert_eq!(three.cmd(&["SET", "{db:t}a", "1"]), V::s("QUEUED"));
    assert_eq!(three.cmd(&["INCR", "{db:t}a"]), V::s("QUEUED"));
    assert_eq!(three.cmd(&["EXEC"]), V::Arr(vec![V::ok(), V::Int(2)]));
    assert_eq!(three.cmd(&["EVAL", "return redis.call('GET', KEYS[1])", "1", "{db:t}a"]), V::s("2"));
    assert!(zero.cmd(&["EXISTS", "{db:t}a"]) == V::Int(0));

    // a split command and a lock land in the client's database too: MSET / MGET over
    // keys of several masters, and LOCK.ACQUIRE (run by heatshield's lock task)
    let keys: Vec<String> = (0..6).map(|i| format!("db:split{i}")).collect();
    let mut mset = vec!["MSET"];
    for k in &keys {
        mset.extend([k.as_str(), "s3"]);
    }
    assert_eq!(three.cmd(&mset), V::ok());
    let mut mget = vec!["MGET"];
    mget.extend(keys.iter().map(String::as_str));
    assert_eq!(three.cmd(&mget), V::strs(&["s3"; 6]));
    assert_eq!(zero.cmd(&mget), V::Arr(vec![V::Nil; 6]));
    for k in &keys {
        assert_eq!(in_db(cluster.master_for_key(k.as_bytes()), 3, &["GET", k]), V::s("s3"), "{k} in db 3");
    }
    assert!(three.cmd(&["LOCK.ACQUIRE", "db:lock", "me", "10000"]).int() > 0);
    assert_eq!(three.cmd(&["EXISTS", "db:lock"]), V::Int(1), "the lock in the client's database");
    assert_eq!(zero.cmd(&["EXISTS", "db:lock"]), V::Int(0));
    assert_eq!(in_db(cluster.master_for_key(b"db:lock"), 3, &["EXISTS", "db:lock"]), V::Int(1));
    assert_eq!(three.cmd(&["LOCK.RELEASE", "db:lock", "me"]), V::Int(1));

    // WATCH guards the key in its own database: a write of the same name elsewhere does
    // not touch it, a write in its database does
    assert_eq!(three.cmd(&["WATCH", "{db:t}a"]), V::ok());
    assert_eq!(zero.cmd(&["SET", "{db:t}a", "x"]), V::ok());
    assert_eq!(three.cmd(&["MULTI"]), V::ok());
    assert_eq!(three.cmd(&["INCR", "{db:t}a"]), V::s("QUEUED"));
    assert_eq!(three.cmd(&["EXEC"]), V::Arr(vec![V::Int(3)]));
    assert_eq!(three.cmd(&["WATCH", "{db:t}a"]), V::ok());
    assert_eq!(in_db(port, 3, &["SET", "{db:t}a", "y"]), V::ok());
    assert_eq!(three.cmd(&["MULTI"]), V::ok());
    assert_eq!(three.cmd(&["INCR", "{db:t}a"]), V::s("QUEUED"));
    assert!(three.cmd(&["EXEC"]).is_nil(), "EXEC ran though its watched key changed");

    // a blocking pop waits in its database: a push of the same name in another does not
    // serve it
    let mut pusher = Conn::connect(port);
    let waiter = std::thread::spawn(move || {
        let mut c = Conn::connect(port);
        assert_eq!(c.cmd(&["SELECT", "4"]), V::ok());
        c.cmd(&["BLPOP", "db:q", "5"])
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(pusher.cmd(&["LPUSH", "db:q", "in-zero"]), V::Int(1));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(pusher.cmd(&["SELECT", "4"]), V::ok());
    assert_eq!(pusher.cmd(&["LPUSH", "db:q", "in-four"]), V::Int(1));
    assert_eq!(waiter.join().unwrap(), V::Arr(vec![V::s("db:q"), V::s("in-four")]));

    // counts, scans and flushes cover the client's database only
    let mut seven = Conn::connect(port);
    assert_eq!(seven.cmd(&["SELECT", "7"]), V::ok());
    for i in 0..20 {
        assert_eq!(seven.cmd(&["SET", &format!("db:s{i}"), "v"]), V::ok());
    }
    assert_eq!(seven.cmd(&["DBSIZE"]), V::Int(20));
    assert_eq!(seven.cmd(&["KEYS", "db:s*"]).items().len(), 20);
    assert!(zero.cmd(&["KEYS", "db:s*"]).items().is_empty());
    let mut cursor = "0".to_string();
    let mut seen = 0;
    loop {
        let r = seven.cmd(&["SCAN", &cursor, "COUNT", "100"]);
        cursor = r.items()[0].text();
        seen += r.items()[1].items().len();
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(seen, 20);
    let before0 = zero.cmd(&["DBSIZE"]);
    assert_eq!(seven.cmd(&["FLUSHDB"]), V::ok());
    assert_eq!(seven.cmd(&["DBSIZE"]), V::Int(0));
    assert_eq!(zero.cmd(&["DBSIZE"]), before0);
    // RESET goes back to database 0
    assert_eq!(seven.cmd(&["RESET"]), V::s("RESET"));
    assert!(seven.cmd(&["CLIENT", "INFO"]).text().contains(" db=0 "));

    // a read a read rule sends to a replica is answered from the client's database there
    assert_eq!(zero.cmd(&["SET", "dbr:k", "zero"]), V::ok());
    assert_eq!(three.cmd(&["SET", "dbr:k", "three"]), V::ok());
    let replica = cluster.replica_of(cluster.master_for_key(b"dbr:k"));
    let mut reader3 = Conn::connect(port);
    assert_eq!(reader3.cmd(&["SELECT", "3"]), V::ok());
    let mut reader0 = Conn::connect(port);
    let on_replica = |db: &str| {
        let mut c = Conn::connect(replica);
        assert_eq!(c.cmd(&["READONLY"]), V::ok());
        assert_eq!(c.cmd(&["SELECT", db]), V::ok());
        c.cmd(&["GET", "dbr:k"])
    };
    common::wait_until(Duration::from_secs(20), "the replica in sync", || {
        on_replica("3") == V::s("three") && on_replica("0") == V::s("zero")
    });
    // (and heatshield has seen the replica reach its master's offset)
    common::wait_until(Duration::from_secs(10), "a replica in sync for heatshield", || {
        reader0.cmd(&["GET", "dbr:k"]) == V::s("zero")
    });
    let before = common::cmdstat_calls(replica, "get");
    for _ in 0..5 {
        assert_eq!(reader3.cmd(&["GET", "dbr:k"]), V::s("three"), "database 3, by a replica");
        assert_eq!(reader0.cmd(&["GET", "dbr:k"]), V::s("zero"), "database 0, by a replica");
    }
    // (the test's own reads above are on the replica too: at least the ten of the clients)
    assert!(common::cmdstat_calls(replica, "get") - before >= 10, "the reads went to the replica");
}

#[test]
fn the_hot_key_cache_keeps_each_database_apart() {
    let cluster = RedisCluster::start_valkey(&["cluster-databases 4"]);
    let (_conf, path) = config_file(CONFIG);
    let proxy = Proxy::start_cluster(&cluster, &["--config", &path]);
    let port = proxy.port();
    let mut zero = Conn::connect(port);
    let mut two = Conn::connect(port);
    assert_eq!(two.cmd(&["SELECT", "2"]), V::ok());
    let hits = |c: &mut Conn| c.cmd(&["PROXY", "CACHE", "STATS"]).get("hits").map(|v| v.int()).unwrap_or(0);
    let mut stale = Vec::new();
    for round in 0..50 {
        let key = format!("{{dbc}}k{round}");
        let (v0, v2) = (format!("zero{round}"), format!("two{round}"));
        assert_eq!(zero.cmd(&["SET", &key, &v0]), V::ok());
        // read twice: the second is answered by the cache (the key is pinned)
        for _ in 0..2 {
            assert_eq!(zero.cmd(&["GET", &key]), V::s(&v0));
        }
        // the same name in database 2: never database 0's cached value
        if two.cmd(&["GET", &key]) != V::Nil {
            stale.push(format!("{key}: db 2 read db 0's value"));
        }
        assert_eq!(two.cmd(&["SET", &key, &v2]), V::ok());
        for _ in 0..2 {
            if two.cmd(&["GET", &key]) != V::s(&v2) {
                stale.push(format!("{key}: db 2 read not its own"));
            }
        }
        for _ in 0..2 {
            if zero.cmd(&["GET", &key]) != V::s(&v0) {
                stale.push(format!("{key}: db 0 read not its own after a db 2 write"));
            }
        }
        // a write in database 0 leaves database 2's value as it is, and is seen in 0
        assert_eq!(zero.cmd(&["SET", &key, &format!("{v0}b")]), V::ok());
        if zero.cmd(&["GET", &key]) != V::s(format!("{v0}b")) || two.cmd(&["GET", &key]) != V::s(&v2) {
            stale.push(format!("{key}: after a db 0 write"));
        }
        // MOVE takes database 0's key away: no cached read keeps it
        let m = format!("{key}m");
        assert_eq!(zero.cmd(&["SET", &m, "moving"]), V::ok());
        assert_eq!(zero.cmd(&["GET", &m]), V::s("moving"));
        assert_eq!(zero.cmd(&["GET", &m]), V::s("moving"));
        assert_eq!(zero.cmd(&["MOVE", &m, "2"]), V::Int(1));
        if !zero.cmd(&["GET", &m]).is_nil() || two.cmd(&["GET", &m]) != V::s("moving") {
            stale.push(format!("{m}: read after MOVE"));
        }
    }
    assert!(stale.is_empty(), "{} stale reads: {stale:?}", stale.len());
    // both databases' reads were answered by the cache, not only database 0's
    let before = hits(&mut zero);
    for _ in 0..20 {
        assert_eq!(two.cmd(&["GET", "{dbc}k0"]), V::s("two0"));
    }
    let after = hits(&mut zero);
    assert!(after - before >= 19, "database 2's reads were answered by the cache {} times in 20", after - before);
}

#[test]
fn select_works_in_front_of_a_standalone_redis() {
    let server = RedisStandalone::start();
    let proxy = Proxy::start_standalone(&server, &[]);
    let mut c = Conn::connect(proxy.port());
    assert_eq!(c.cmd(&["SELECT", "9"]), V::ok());
    assert_eq!(c.cmd(&["SET", "db:k", "nine"]), V::ok());
    assert_eq!(in_db(server.port(), 9, &["GET", "db:k"]), V::s("nine"));
    assert!(cmd(server.port(), &["GET", "db:k"]).is_nil());
    assert_eq!(c.cmd(&["SELECT", "16"]).err(), Some("ERR DB index is out of range"));
}
