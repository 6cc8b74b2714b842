//! Pipelining: a long pipeline of mixed commands (forwarded, split, local) is answered in
//! order with the right values; concurrent pipelining clients sharing backend connections
//! never get each other's replies; a 100 MiB value survives a SET/GET round trip; inline
//! (telnet-style) commands work. RESP2 and RESP3.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::thread;

use common::client::{Conn, Kind, Proto, Reply, V, args};
use common::{Proxy, RedisCluster, Shared, cmd_text};

struct Env {
    cluster: RedisCluster,
    proxy: Proxy,
}

static ENV: Shared<Env> = Shared::new();

fn env() -> Arc<Env> {
    ENV.get(|| {
        let cluster = RedisCluster::start();
        let proxy = Proxy::start_cluster(&cluster, &[]);
        Env { cluster, proxy }
    })
}

/// Tiny deterministic PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

enum Expect {
    Exact(V),
    /// TIME: two bulk strings
    Time,
}

/// Builds `n` mixed commands over `keys`/`ctrs` and what each must return, simulating the
/// data in `model`.
fn mixed_commands(
    rng: &mut Rng,
    n: usize,
    prefix: &str,
    client_id: i64,
    model: &mut HashMap<String, String>,
) -> (Vec<Vec<Vec<u8>>>, Vec<Expect>) {
    let keys: Vec<String> = (0..40).map(|i| format!("{prefix}:k{i}")).collect();
    let ctrs: Vec<String> = (0..4).map(|i| format!("{prefix}:ctr{i}")).collect();
    let mut counters: HashMap<String, i64> = HashMap::new();
    let mut cmds = vec![];
    let mut exp = vec![];
    let get = |model: &HashMap<String, String>, k: &str| model.get(k).map(V::s).unwrap_or(V::Nil);
    for i in 0..n {
        let k = keys[rng.below(keys.len())].clone();
        let k2 = keys[rng.below(keys.len())].clone();
        let k3 = keys[rng.below(keys.len())].clone();
        match i % 12 {
            0 | 1 => {
                let v = format!("v{i}-{}", "x".repeat(rng.below(300)));
                cmds.push(args(&["SET", &k, &v]));
                exp.push(Expect::Exact(V::ok()));
                model.insert(k, v);
            }
            2 | 3 => {
                exp.push(Expect::Exact(get(model, &k)));
                cmds.push(args(&["GET", &k]));
            }
            4 => {
                let c = ctrs[rng.below(ctrs.len())].clone();
                let n = counters.entry(c.clone()).or_insert(0);
                *n += 1;
                exp.push(Expect::Exact(V::Int(*n)));
                cmds.push(args(&["INCR", &c]));
            }
            5 => {
                exp.push(Expect::Exact(V::Arr(vec![get(model, &k), get(model, &k2), get(model, &k3)])));
                cmds.push(args(&["MGET", &k, &k2, &k3]));
            }
            6 => {
                let n = model.remove(&k).is_some() as i64;
                exp.push(Expect::Exact(V::Int(n)));
                cmds.push(args(&["DEL", &k]));
            }
            7 => {
                cmds.push(args(&["PING"]));
                exp.push(Expect::Exact(V::s("PONG")));
            }
            8 => {
                let m = format!("echo-{i}");
                exp.push(Expect::Exact(V::s(&m)));
                cmds.push(args(&["ECHO", &m]));
            }
            9 => match rng.below(3) {
                0 => {
                    cmds.push(args(&["CLIENT", "ID"]));
                    exp.push(Expect::Exact(V::Int(client_id)));
                }
                1 => {
                    cmds.push(args(&["SELECT", "0"]));
                    exp.push(Expect::Exact(V::ok()));
                }
                _ => {
                    cmds.push(args(&["TIME"]));
                    exp.push(Expect::Time);
                }
            },
            10 => {
                let n = [&k, &k2, &k3].iter().filter(|x| model.contains_key(x.as_str())).count();
                exp.push(Expect::Exact(V::Int(n as i64)));
                cmds.push(args(&["EXISTS", &k, &k2, &k3]));
            }
            _ => {
                let (va, vb) = (format!("a{i}"), format!("b{i}"));
                cmds.push(args(&["MSET", &k, &va, &k2, &vb]));
                exp.push(Expect::Exact(V::ok()));
                model.insert(k.clone(), va);
                model.insert(k2.clone(), vb);
            }
        }
    }
    // counters start from scratch: delete them first
    let mut del = vec!["DEL".to_string()];
    del.extend(ctrs.iter().cloned());
    del.extend(keys.iter().cloned());
    cmds.insert(0, args(&del));
    // (every test run uses fresh key names, so there is nothing to delete)
    exp.insert(0, Expect::Exact(V::Int(0)));
    (cmds, exp)
}

fn check(replies: &[Reply], exp: &[Expect], cmds: &[Vec<Vec<u8>>], who: &str) {
    assert_eq!(replies.len(), exp.len());
    for (i, (r, e)) in replies.iter().zip(exp).enumerate() {
        let shown =
            || cmds[i].iter().map(|a| String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned()).collect::<Vec<_>>();
        match e {
            Expect::Exact(v) => assert_eq!(&r.v, v, "{who}: reply #{i} to {:?}", shown()),
            Expect::Time => assert_eq!(r.shape.kinds(), [Kind::Bulk, Kind::Bulk], "{who}: #{i} TIME {r:?}"),
        }
    }
}

#[test]
fn thousand_pipelined_mixed_commands_in_order() {
    let env = env();
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let id = c.cmd(&["CLIENT", "ID"]).int();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ proto.version() as u64);
        let mut model = HashMap::new();
        let prefix = format!("pipe:{}", proto.tag());
        let (cmds, exp) = mixed_commands(&mut rng, 1000, &prefix, id, &mut model);
        assert_eq!(cmds.len(), 1001);
        let replies = c.pipeline_full(&cmds);
        check(&replies, &exp, &cmds, &format!("{proto:?}"));
        // nulls keep the protocol's encoding inside split replies too
        let missing = format!("{prefix}:never");
        let r = c.cmd_full(&["MGET", &missing, &format!("{prefix}:k1"), &format!("{prefix}:k2")]);
        let nil = if proto == Proto::Resp3 { Kind::Null } else { Kind::NullBulk };
        assert_eq!(r.shape.items[0].kind, nil, "{r:?}");
        // the model matches the cluster afterwards
        for (k, v) in &model {
            assert_eq!(c.cmd(&["GET", k]), V::s(v), "{k}");
        }
    }
}

#[test]
fn concurrent_pipelines_do_not_mix_replies() {
    let env = env();
    let port = env.proxy.port();
    let handles: Vec<_> = (0..6)
        .map(|t| {
            thread::spawn(move || {
                let proto = Proto::BOTH[t % 2];
                let mut c = Conn::connect_proto(port, proto);
                let id = c.cmd(&["CLIENT", "ID"]).int();
                let mut rng = Rng(1000 + t as u64);
                let mut model = HashMap::new();
                for round in 0..3 {
                    let prefix = format!("pipe:conc:{t}:{round}");
                    let (cmds, exp) = mixed_commands(&mut rng, 400, &prefix, id, &mut model);
                    let replies = c.pipeline_full(&cmds);
                    check(&replies, &exp, &cmds, &format!("client {t} ({proto:?}) round {round}"));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread");
    }
    assert!(env.proxy.is_alive());
}

/// 100 MiB of non-repeating content: 1 MiB pseudo-random blocks, each stamped with its index.
fn big_value() -> Vec<u8> {
    const MIB: usize = 1 << 20;
    let mut rng = Rng(42);
    let mut block = vec![0u8; MIB];
    for chunk in block.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next().to_le_bytes());
    }
    let mut v = Vec::with_capacity(100 * MIB);
    for i in 0..100u64 {
        let start = v.len();
        v.extend_from_slice(&block);
        v[start..start + 8].copy_from_slice(&i.to_le_bytes());
    }
    v
}

fn fnv1a(data: &[u8]) -> u64 {
    // over 8-byte words: fast enough in debug builds
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in data.chunks(8) {
        let mut b = [0u8; 8];
        b[..w.len()].copy_from_slice(w);
        h ^= u64::from_le_bytes(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[test]
fn hundred_mib_value_round_trip() {
    let env = env();
    let value = big_value();
    let len = value.len();
    assert_eq!(len, 100 << 20);
    let want = fnv1a(&value);
    let key = "pipe:big";

    // SET in RESP2, written straight from one buffer
    let mut c = Conn::connect(env.proxy.port());
    let mut req = format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${len}\r\n", key.len()).into_bytes();
    req.extend_from_slice(&value);
    req.extend_from_slice(b"\r\n");
    c.send_raw(&req);
    drop(req);
    assert_eq!(c.read_reply(), V::ok());
    assert_eq!(c.cmd(&["STRLEN", key]), V::Int(len as i64));
    let owner = env.cluster.master_for_key(key.as_bytes());
    assert_eq!(cmd_text(owner, &["STRLEN", key]), len.to_string());

    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let r = c.cmd_full(&["GET", key]);
        assert_eq!(r.kind(), Kind::Bulk);
        let got = r.v.bytes();
        assert_eq!(got.len(), len, "{proto:?} GET length");
        assert!(got == value.as_slice(), "{proto:?} GET content differs (fnv {:x} vs {want:x})", fnv1a(got));
        // the connection is still in sync afterwards
        assert_eq!(c.cmd(&["GETRANGE", key, "1048576", "1048583"]), V::Str(1u64.to_le_bytes().to_vec()));
        assert_eq!(c.cmd(&["PING"]), V::s("PONG"));
    }
    assert_eq!(c.cmd(&["DEL", key]), V::Int(1));
}

#[test]
fn inline_commands() {
    let env = env();
    for proto in Proto::BOTH {
        let t = proto.tag();
        let mut c = Conn::connect(env.proxy.port());
        if proto == Proto::Resp3 {
            c.send_raw(b"HELLO 3\r\n");
            c.set_proto(Proto::Resp3);
            let r = c.read_full();
            assert_eq!(r.kind(), Kind::Map, "inline HELLO 3: {r:?}");
        }
        let key = format!("pipe:inline:{t}");
        c.send_raw(format!("SET {key} \"b c\"\r\nGET {key}\r\n").as_bytes());
        let set = c.read_full();
        let get = c.read_full();
        assert_eq!(set.raw, b"+OK\r\n");
        assert_eq!(get.raw, b"$3\r\nb c\r\n");

        // blank lines are skipped; LF-only lines, escapes and single quotes work; inline and
        // RESP requests mix in one write
        let raw = format!(
            "\r\n  PING  \r\nECHO 'it\\'s'\nSET {key} \"tab\\there\\x21\"\r\n*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\nEXISTS {key} {key}x\r\n",
            key.len()
        );
        c.send_raw(raw.as_bytes());
        let replies: Vec<V> = (0..5).map(|_| c.read_reply()).collect();
        assert_eq!(replies, [V::s("PONG"), V::s("it's"), V::ok(), V::s("tab\there!"), V::Int(1),]);
        // an unknown inline command gets Redis's error and the connection stays usable
        c.send_raw(b"NOPE a b\r\nPING\r\n");
        assert_eq!(c.read_reply(), V::Err("ERR unknown command 'NOPE', with args beginning with: 'a' 'b' ".into()));
        assert_eq!(c.read_reply(), V::s("PONG"));
    }
}

/// More commands pipelined than `limits.max_pipeline` (here 4): heatshield stops reading
/// while 4 are unanswered and must resume on what it already buffered once they are
/// answered (this once stalled until the client gave up).
#[test]
fn pipelines_longer_than_max_pipeline_complete() {
    let env = env();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("h.toml");
    std::fs::write(&conf, "[limits]\nmax_pipeline = 4\n").unwrap();
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", conf.to_str().unwrap()]);
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(proxy.port(), proto);
        let mut cmds = Vec::new();
        for i in 0..600 {
            let k = format!("pl:max:{proto:?}:{}", i % 37);
            cmds.push(args(&["SET", &k, &i.to_string()]));
            cmds.push(args(&["GET", &k]));
            cmds.push(args(&["PING"]));
        }
        let replies = c.pipeline(&cmds);
        assert_eq!(replies.len(), cmds.len());
        for (i, r) in replies.chunks(3).enumerate() {
            assert_eq!(r[0], V::ok(), "{proto:?} #{i}");
            assert_eq!(r[1], V::s(i.to_string()), "{proto:?} #{i}");
            assert_eq!(r[2], V::s("PONG"), "{proto:?} #{i}");
        }
    }
}
