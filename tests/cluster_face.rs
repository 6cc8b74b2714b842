//! heatshield as a one-node cluster for cluster-aware clients: CLUSTER INFO / MYID /
//! SLOTS / SHARDS / NODES / KEYSLOT answered by heatshield (itself one master owning all
//! 16,384 slots), COUNTKEYSINSLOT asked of the real owner, and redis-py's `RedisCluster`
//! working through it unchanged, against a real 3-master cluster.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::client::{Conn, Proto, V};
use common::{ClusterEnv, Proxy, Shared, config_file, key_slot};

static ENV: Shared<ClusterEnv> = Shared::new();

fn env() -> Arc<ClusterEnv> {
    ENV.get(|| ClusterEnv::start(None))
}

#[test]
fn heatshield_presents_itself_as_one_master_with_every_slot() {
    let env = env();
    let port = env.proxy.port() as i64;
    for proto in Proto::BOTH {
        let mut c = Conn::connect_proto(env.proxy.port(), proto);
        let id = c.cmd(&["CLUSTER", "MYID"]).text();
        assert_eq!(id.len(), 40, "{id:?}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id:?}");
        assert_eq!(Conn::connect(env.proxy.port()).cmd(&["CLUSTER", "MYID"]).text(), id, "the id is stable");

        let info = c.cmd(&["CLUSTER", "INFO"]).text();
        for line in ["cluster_enabled:1", "cluster_state:ok", "cluster_slots_assigned:16384", "cluster_known_nodes:1"] {
            assert!(info.lines().any(|l| l == line), "{proto:?}: {line} missing from {info:?}");
        }

        let slots = c.cmd(&["CLUSTER", "SLOTS"]);
        let ranges = slots.items();
        assert_eq!(ranges.len(), 1, "{slots:?}");
        let r = ranges[0].items();
        assert_eq!((&r[0], &r[1]), (&V::Int(0), &V::Int(16383)));
        let node = r[2].items();
        assert_eq!(node[0], V::s("127.0.0.1"));
        assert_eq!(node[1], V::Int(port));
        assert_eq!(node[2], V::s(&id));

        let nodes = c.cmd(&["CLUSTER", "NODES"]).text();
        let fields: Vec<&str> = nodes.trim_end().split(' ').collect();
        assert_eq!(fields[0], id);
        assert!(fields[1].starts_with(&format!("127.0.0.1:{port}@")), "{nodes:?}");
        assert_eq!(fields[2], "myself,master");
        assert_eq!(fields.last().copied(), Some("0-16383"));

        let shards = c.cmd(&["CLUSTER", "SHARDS"]);
        assert_eq!(shards.items().len(), 1, "{shards:?}");
        let shard = &shards.items()[0];
        assert_eq!(shard.get("slots"), Some(V::Arr(vec![V::Int(0), V::Int(16383)])), "{shard:?}");
        let members = shard.get("nodes").unwrap_or(V::Nil);
        assert_eq!(members.items().len(), 1);
        assert_eq!(members.items()[0].get("id"), Some(V::s(&id)));
        assert_eq!(members.items()[0].get("port"), Some(V::Int(port)));
        assert_eq!(members.items()[0].get("role"), Some(V::s("master")));

        for key in ["a", "{user:1}x", "somekey"] {
            assert_eq!(c.cmd(&["CLUSTER", "KEYSLOT", key]), V::Int(key_slot(key.as_bytes()) as i64));
        }
    }
}

#[test]
fn slot_questions_go_to_the_real_owner() {
    let env = env();
    let tag = "{face}";
    let s = key_slot(tag.as_bytes());
    let owner = env.owners.of_slot(s);
    let mut c = Conn::connect(env.proxy.port());
    for i in 0..3 {
        assert_eq!(c.cmd(&["SET", &format!("{tag}{i}"), "v"]), V::ok());
    }
    let mut d = Conn::connect(owner);
    for cmd in [
        vec!["CLUSTER", "COUNTKEYSINSLOT", &s.to_string()],
        vec!["CLUSTER", "GETKEYSINSLOT", &s.to_string(), "10"],
        vec!["CLUSTER", "COUNTKEYSINSLOT", "99999"],
        vec!["CLUSTER", "COUNTKEYSINSLOT", "x"],
    ] {
        let (got, want) = (c.cmd(&cmd), d.cmd(&cmd));
        let sorted = |v: V| match v {
            V::Arr(mut items) => {
                items.sort_by_key(|x| x.bytes().to_vec());
                V::Arr(items)
            }
            v => v,
        };
        assert_eq!(sorted(got), sorted(want), "{cmd:?}");
    }
    assert_eq!(c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &s.to_string()]), V::Int(3));
    assert_eq!(c.cmd(&["DEL", &format!("{tag}0"), &format!("{tag}1"), &format!("{tag}2")]), V::Int(3));
}

#[test]
fn the_announced_address_can_be_configured() {
    let env = env();
    let (_dir, path) = config_file("[server]\nannounce = \"10.1.2.3:7777\"\n");
    let proxy = Proxy::start_cluster(&env.cluster, &["--config", &path]);
    let mut c = Conn::connect(proxy.port());
    let slots = c.cmd(&["CLUSTER", "SLOTS"]);
    let node = slots.items()[0].items()[2].items().to_vec();
    assert_eq!((&node[0], &node[1]), (&V::s("10.1.2.3"), &V::Int(7777)), "{slots:?}");
    assert!(c.cmd(&["CLUSTER", "NODES"]).text().contains(" 10.1.2.3:7777@"));
}

const SCRIPT: &str = r#"
import sys
from redis.cluster import RedisCluster
port, prefix = int(sys.argv[1]), sys.argv[2]
rc = RedisCluster(host="127.0.0.1", port=port)
print("nodes", [n.port for n in rc.get_nodes()])
keys = [f"{prefix}:{i}" for i in range(20)]
for i, k in enumerate(keys):
    rc.set(k, f"v{i}")
print("get", rc.get(keys[7]))
print("mget", rc.mget_nonatomic(keys[:4]))
print("incr", rc.incr(prefix + ":n"), rc.incr(prefix + ":n"))
print("keyslot", rc.keyslot(keys[0]) == rc.cluster_keyslot(keys[0]))
print("deleted", rc.delete(*keys, prefix + ":n"))
"#;

#[test]
fn redis_py_cluster_client_works_through_heatshield() {
    let env = env();
    let ok = Command::new("python3").args(["-c", "import redis.cluster"]).status().is_ok_and(|s| s.success());
    assert!(ok, "python3 with the `redis` package is required: run scripts/ensure-deps.sh");
    let out = Command::new("python3")
        .args(["-c", SCRIPT, &env.proxy.port().to_string(), "face:py"])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            format!("nodes [{}]", env.proxy.port()).as_str(),
            "get b'v7'",
            "mget [b'v0', b'v1', b'v2', b'v3']",
            "incr 1 2",
            "keyslot True",
            "deleted 21",
        ],
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // the keys really went to the cluster behind heatshield
    assert!(env.proxy.is_alive());
}
