//! Multi-key commands split across slots (MGET, MSET, DEL, UNLINK, EXISTS, TOUCH): the
//! proxy must answer exactly what a single standalone Redis answers for the same data and
//! the same commands — byte for byte in RESP2, the same values and frame kinds in RESP3.
//! MSETNX cannot be split atomically and is refused across slots.

mod common;

use std::sync::Arc;

use common::client::{Conn, Proto, Reply, V};
use common::{DiffEnv, Shared, key_slot};

type Env = DiffEnv;

static ENV: Shared<Env> = Shared::new();

fn env() -> Arc<Env> {
    ENV.get(DiffEnv::start)
}

/// The same command on the proxy and on the standalone server.
struct Pair {
    proto: Proto,
    proxy: Conn,
    redis: Conn,
}

impl Pair {
    fn new(env: &Env, proto: Proto) -> Pair {
        Pair {
            proto,
            proxy: Conn::connect_proto(env.proxy.port(), proto),
            redis: Conn::connect_proto(env.standalone.port(), proto),
        }
    }

    /// Runs `args` on both and asserts the replies are the same; returns the proxy's.
    fn same<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        let p = self.proxy.cmd_full(args);
        let r = self.redis.cmd_full(args);
        let shown: Vec<String> = args.iter().map(|a| String::from_utf8_lossy(a.as_ref()).into_owned()).collect();
        match self.proto {
            Proto::Resp2 => assert_eq!(
                String::from_utf8_lossy(&p.raw),
                String::from_utf8_lossy(&r.raw),
                "RESP2 bytes differ for {shown:?}\nproxy: {p:?}\nredis: {r:?}"
            ),
            Proto::Resp3 => {
                assert_eq!(p.v, r.v, "RESP3 values differ for {shown:?}");
                assert_eq!(p.shape, r.shape, "RESP3 frame kinds differ for {shown:?}\nproxy: {p:?}\nredis: {r:?}");
            }
        }
        p
    }
}

/// `n` keys with `prefix`, asserting they cover all three masters.
fn spread_keys(env: &Env, prefix: &str, n: usize) -> Vec<String> {
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let mut masters: Vec<u16> = keys.iter().map(|k| env.owners.of_key(k.as_bytes())).collect();
    masters.sort_unstable();
    masters.dedup();
    assert_eq!(masters.len(), 3, "keys {keys:?} do not cover all 3 masters");
    let mut slots: Vec<u16> = keys.iter().map(|k| key_slot(k.as_bytes())).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), n, "test keys should be in distinct slots");
    keys
}

fn cmd<'a>(name: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![name];
    v.extend_from_slice(rest);
    v
}

#[test]
fn split_commands_answer_like_a_single_redis() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut s = Pair::new(&env, proto);
        let keys = spread_keys(&env, &format!("split:{t}:k"), 12);
        let k: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (m1, m2) = (format!("split:{t}:missing1"), format!("split:{t}:missing2"));
        let (m1, m2) = (m1.as_str(), m2.as_str());

        let mut all = k.clone();
        all.extend([m1, m2]);
        s.same(&cmd("DEL", &all));

        // MSET over every master
        let mut mset = vec!["MSET"];
        let vals: Vec<String> = (0..k.len()).map(|i| format!("value-{i}")).collect();
        for (key, val) in k.iter().zip(&vals) {
            mset.push(key);
            mset.push(val);
        }
        assert_eq!(s.same(&mset).v, V::ok());

        // MGET with missing keys and duplicates, in request order
        let mut mget = vec!["MGET", m1];
        mget.extend(&k);
        mget.extend([k[3], m2, k[0], k[3]]);
        let r = s.same(&mget);
        assert_eq!(r.v.items().len(), mget.len() - 1);
        assert_eq!(r.v.items()[0], V::Nil);
        assert_eq!(r.v.items()[4], V::s("value-3"));

        // MSET with a duplicate key: the last value wins
        assert_eq!(s.same(&["MSET", k[0], "a", k[5], "b", k[0], "c"]).v, V::ok());
        assert_eq!(s.same(&["MGET", k[0], k[5]]).v, V::Arr(vec![V::s("c"), V::s("b")]));

        // EXISTS and TOUCH count every occurrence
        assert_eq!(s.same(&["EXISTS", k[0], k[1], m1, k[0], k[0], k[7]]).v, V::Int(5));
        assert_eq!(s.same(&["TOUCH", k[0], k[1], m1, k[0], k[9]]).v, V::Int(4));
        // DEL and UNLINK count each key once
        assert_eq!(s.same(&["DEL", k[1], m1, k[1], k[2], k[10]]).v, V::Int(3));
        assert_eq!(s.same(&["UNLINK", k[3], k[4], k[3], m2, k[11]]).v, V::Int(3));
        assert_eq!(s.same(&["EXISTS", k[1], k[2], k[3], k[4], k[5]]).v, V::Int(1));
        s.same(&cmd("MGET", &k));

        // non-string keys read as nil in MGET
        s.same(&["SADD", k[7], "member"]);
        s.same(&["MGET", k[6], k[7], k[8]]);
        s.same(&["EXISTS", k[6], k[7], k[8]]);

        // binary-safe values survive the split and merge
        s.same(&["MSET", k[0], "a\r\nb", k[6], "", k[8], "\u{0}\u{7f}x"]);
        let bin = s.same(&["MGET", k[8], k[6], k[0]]);
        assert_eq!(bin.v, V::Arr(vec![V::s("\u{0}\u{7f}x"), V::s(""), V::s("a\r\nb")]));

        // arity errors are Redis's
        s.same(&["MSET", k[0]]);
        s.same(&["MSET", k[0], "1", k[1]]);
        s.same(&["MGET"]);
        s.same(&["DEL"]);
        s.same(&["EXISTS"]);
        s.same(&["UNLINK"]);
        s.same(&["TOUCH"]);

        // single-key forms
        s.same(&["MGET", k[0]]);
        s.same(&["DEL", k[0]]);
        s.same(&["MGET", k[0]]);

        // everything deleted
        assert_eq!(s.same(&cmd("DEL", &all)).v.int(), 5);
        let gone = s.same(&cmd("MGET", &all));
        assert!(gone.v.items().iter().all(V::is_nil), "{gone:?}");
        assert_eq!(s.same(&cmd("EXISTS", &all)).v, V::Int(0));
    }
}

#[test]
fn large_split_commands_match_standalone() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut s = Pair::new(&env, proto);
        let keys: Vec<String> = (0..600).map(|i| format!("split:{t}:big:{i}")).collect();
        let k: Vec<&str> = keys.iter().map(String::as_str).collect();
        s.same(&cmd("DEL", &k));
        // every third key set, values of varying size
        let vals: Vec<String> = (0..k.len()).map(|i| "x".repeat(i % 50)).collect();
        let mut mset = vec!["MSET"];
        for i in (0..k.len()).step_by(3) {
            mset.push(k[i]);
            mset.push(&vals[i]);
        }
        assert_eq!(s.same(&mset).v, V::ok());
        let mut mget = vec!["MGET"];
        mget.extend(k.iter().rev());
        let r = s.same(&mget);
        assert_eq!(r.v.items().iter().filter(|v| !v.is_nil()).count(), 200);
        assert_eq!(s.same(&cmd("EXISTS", &k)).v, V::Int(200));
        assert_eq!(s.same(&cmd("TOUCH", &k)).v, V::Int(200));
        assert_eq!(s.same(&cmd("UNLINK", &k[..300])).v, V::Int(100));
        assert_eq!(s.same(&cmd("DEL", &k)).v, V::Int(100));
    }
}

#[test]
fn msetnx_across_slots_is_refused() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut s = Pair::new(&env, proto);
        let keys = spread_keys(&env, &format!("split:{t}:nx"), 3);
        s.same(&["DEL", &keys[0], &keys[1], &keys[2]]);
        let r = s.proxy.cmd(&["MSETNX", &keys[0], "1", &keys[1], "2", &keys[2], "3"]);
        assert_eq!(r, V::Err("CROSSSLOT Keys in request don't hash to the same slot".into()), "{proto:?}");
        assert_eq!(
            s.proxy.cmd(&["EXISTS", &keys[0], &keys[1], &keys[2]]),
            V::Int(0),
            "a refused MSETNX must not set anything"
        );
        // within one slot it is forwarded and behaves like Redis
        let tag = format!("{{split:{t}:nxtag}}");
        let (a, b) = (format!("{tag}a"), format!("{tag}b"));
        s.same(&["DEL", &a, &b]);
        assert_eq!(s.same(&["MSETNX", &a, "1", &b, "2"]).v, V::Int(1));
        assert_eq!(s.same(&["MSETNX", &a, "x", &b, "y"]).v, V::Int(0));
        s.same(&["MGET", &a, &b]);
        s.same(&["DEL", &a, &b]);
    }
}
