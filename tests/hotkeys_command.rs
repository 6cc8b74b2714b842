//! `HOTKEYS` (Redis 8.6) answered by heatshield (docs/commands.md): a session counts, per
//! key, the bytes and the time of what heatshield serves; `GET` answers in Redis's shape
//! with the costliest keys first; Redis's texts for bad arguments; `SLOTS`, `DURATION`;
//! changing the session needs `PROXY AUTH` where an admin password is set. Against a
//! standalone Redis 7.0 (no server here has HOTKEYS).

mod common;

use std::time::Duration;

use common::client::{Conn, Proto, V};
use common::{Proxy, RedisStandalone, config_file, key_slot};

/// `HOTKEYS GET`'s one entry as (field, value) pairs.
fn session(c: &mut Conn) -> V {
    let r = c.cmd(&["HOTKEYS", "GET"]);
    assert_eq!(r.items().len(), 1, "{r:?}");
    r.items()[0].clone()
}

fn field(s: &V, name: &str) -> V {
    s.get(name).unwrap_or_else(|| panic!("no {name} in {s:?}"))
}

/// The keys of a `by-...` list, in order.
fn keys(list: &V) -> Vec<String> {
    list.items().chunks(2).map(|p| p[0].text()).collect()
}

#[test]
fn hotkeys_counts_what_heatshield_serves() {
    let server = RedisStandalone::start();
    let proxy = Proxy::start_standalone(&server, &[]);
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        assert!(c.cmd(&["HOTKEYS", "GET"]).is_nil());
        assert!(c.cmd(&["HOTKEYS", "STOP"]).is_nil());
        assert_eq!(c.cmd(&["HOTKEYS", "RESET"]), V::ok());
        assert_eq!(c.cmd(&["HOTKEYS", "START", "METRICS", "2", "CPU", "NET", "COUNT", "3"]), V::ok());
        assert_eq!(
            c.cmd(&["HOTKEYS", "START", "METRICS", "1", "CPU"]).err(),
            Some("ERR hotkey tracking session already in progress")
        );
        let big = "x".repeat(10_000);
        for _ in 0..20 {
            assert_eq!(c.cmd(&["SET", "hk:big", &big]), V::ok());
        }
        for _ in 0..5 {
            assert!(c.cmd(&["GET", "hk:small"]).is_nil());
        }
        // a script that keeps the server busy some 40 ms, on its key (at 6 ms, a loaded
        // machine's 20 SETs of 10 KB once took longer, waiting included)
        let busy = "local i = 0 while i < 3000000 do i = i + 1 end return 1";
        for _ in 0..3 {
            assert_eq!(c.cmd(&["EVAL", busy, "1", "hk:slow"]), V::Int(1));
        }
        let s = session(&mut c);
        assert_eq!(field(&s, "tracking-active"), V::Int(1));
        assert_eq!(field(&s, "sample-ratio"), V::Int(1));
        assert_eq!(field(&s, "selected-slots"), V::Arr(vec![V::Arr(vec![V::Int(0), V::Int(16383)])]));
        assert_eq!(keys(&field(&s, "by-net-bytes"))[0], "hk:big", "{s:?}");
        assert_eq!(keys(&field(&s, "by-cpu-time-us"))[0], "hk:slow", "{s:?}");
        assert!(keys(&field(&s, "by-net-bytes")).len() <= 3);
        assert!(field(&s, "total-net-bytes").int() > 200_000, "{s:?}");
        assert!(field(&s, "net-bytes-all-commands-all-slots").int() >= field(&s, "total-net-bytes").int());
        assert!(field(&s, "all-commands-all-slots-us").int() > 0);
        assert!(field(&s, "collection-start-time-unix-ms").int() > 1_700_000_000_000);
        assert!(s.get("total-cpu-time-user-ms").is_some());
        assert_eq!(
            c.cmd(&["HOTKEYS", "RESET"]).err(),
            Some("ERR hotkey tracking session in progress, stop tracking first")
        );
        assert_eq!(c.cmd(&["HOTKEYS", "STOP"]), V::ok());
        let s = session(&mut c);
        assert_eq!(field(&s, "tracking-active"), V::Int(0));
        // a stopped session counts nothing more
        let before = field(&s, "net-bytes-all-commands-all-slots");
        assert_eq!(c.cmd(&["SET", "hk:big", &big]), V::ok());
        assert_eq!(field(&session(&mut c), "net-bytes-all-commands-all-slots"), before);
        assert_eq!(c.cmd(&["HOTKEYS", "RESET"]), V::ok());
        assert!(c.cmd(&["HOTKEYS", "GET"]).is_nil());

        // one slot selected, NET only: only keys of that slot are listed
        let slot = key_slot(b"hk:small").to_string();
        assert_eq!(c.cmd(&["HOTKEYS", "START", "METRICS", "1", "NET", "SLOTS", "1", &slot]), V::ok());
        assert_eq!(c.cmd(&["SET", "hk:big", &big]), V::ok());
        assert!(c.cmd(&["GET", "hk:small"]).is_nil());
        let s = session(&mut c);
        assert_eq!(keys(&field(&s, "by-net-bytes")), vec!["hk:small".to_string()]);
        assert!(s.get("by-cpu-time-us").is_none() && s.get("total-cpu-time-user-ms").is_none());
        let n: i64 = slot.parse().unwrap();
        assert_eq!(field(&s, "selected-slots"), V::Arr(vec![V::Arr(vec![V::Int(n), V::Int(n)])]));
        assert!(field(&s, "net-bytes-all-commands-selected-slots").int() < 1000);
        assert_eq!(c.cmd(&["HOTKEYS", "STOP"]), V::ok());
        assert_eq!(c.cmd(&["HOTKEYS", "RESET"]), V::ok());

        // DURATION ends the session by itself
        assert_eq!(c.cmd(&["HOTKEYS", "START", "METRICS", "1", "CPU", "DURATION", "1"]), V::ok());
        std::thread::sleep(Duration::from_millis(1200));
        let s = session(&mut c);
        assert_eq!(field(&s, "tracking-active"), V::Int(0));
        let lasted = field(&s, "collection-duration-ms").int();
        assert!((1000..1100).contains(&lasted), "{lasted}");
        assert_eq!(c.cmd(&["HOTKEYS", "RESET"]), V::ok());

        // Redis's texts
        let cases: &[(&[&str], &str)] = &[
            (&["HOTKEYS", "START"], "ERR METRICS parameter is required"),
            (&["HOTKEYS", "START", "METRICS", "3", "CPU"], "ERR METRICS count must be > 0 and <= 2"),
            (
                &["HOTKEYS", "START", "METRICS", "2", "CPU"],
                "ERR METRICS count does not match number of metric types provided",
            ),
            (&["HOTKEYS", "START", "METRICS", "2", "CPU", "CPU"], "ERR METRICS CPU defined more than once!"),
            (&["HOTKEYS", "START", "METRICS", "1", "RAM"], "ERR METRICS no valid metrics passed. Supported: CPU|NET"),
            (&["HOTKEYS", "START", "METRICS", "1", "CPU", "COUNT", "65"], "ERR COUNT must be between 1 and 64"),
            (&["HOTKEYS", "START", "METRICS", "1", "CPU", "SLOTS", "2", "1", "1"], "ERR duplicate slot number"),
            (&["HOTKEYS", "START", "METRICS", "1", "CPU", "SLOTS", "1", "16384"], "ERR Invalid or out of range slot"),
            (&["HOTKEYS", "START", "METRICS", "1", "CPU", "SLOTS", "3", "1"], "ERR not enough slot numbers provided"),
            (&["HOTKEYS", "START", "METRICS", "1", "CPU", "BOGUS"], "ERR syntax error"),
        ];
        for (args, want) in cases {
            assert_eq!(c.cmd(args).err(), Some(*want), "{args:?}");
        }
        assert!(c.cmd(&["HOTKEYS", "GET"]).is_nil(), "a refused START started a session");
        assert_eq!(c.cmd(&["HOTKEYS", "NOPE"]).err(), Some("ERR unknown subcommand 'NOPE'. Try HOTKEYS HELP."));
        assert_eq!(
            c.cmd(&["HOTKEYS", "GET", "x"]).err(),
            Some("ERR wrong number of arguments for 'hotkeys|get' command")
        );
        assert!(!c.cmd(&["HOTKEYS", "HELP"]).items().is_empty());
    }
}

#[test]
fn changing_the_session_needs_proxy_auth_where_a_password_is_set() {
    let server = RedisStandalone::start();
    let (_conf, path) = config_file("[admin]\npassword = \"s3cret\"\n");
    let proxy = Proxy::start_standalone(&server, &["--config", &path]);
    let mut c = Conn::connect(proxy.port());
    let start = ["HOTKEYS", "START", "METRICS", "1", "NET"];
    assert!(c.cmd(&start).err().unwrap().starts_with("NOPERM"));
    assert!(c.cmd(&["HOTKEYS", "GET"]).is_nil());
    assert_eq!(c.cmd(&["PROXY", "AUTH", "s3cret"]), V::ok());
    assert_eq!(c.cmd(&start), V::ok());
    assert_eq!(field(&session(&mut Conn::connect(proxy.port())), "tracking-active"), V::Int(1));
}
