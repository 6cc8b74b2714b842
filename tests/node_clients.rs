//! Real Node.js clients through heatshield, at their defaults, against a real 3-master
//! cluster (tests/node/clients.js): ioredis `multi()`, pipelines, WATCH and `blpop`;
//! node-redis `multi()`, `blPop` on a duplicate connection and WATCH (its WatchError); and
//! ioredis and node-redis pub/sub (channels, a pattern, shard channels on several shards
//! from one connection); a bullmq worker that drains its queue, blocks, and must pick up
//! a job added later.
//!
//! Needs `node` and `npm` (scripts/ensure-deps.sh installs them); the clients' pinned
//! versions (tests/node/package.json, package-lock.json) are installed into
//! tests/node/node_modules on first use.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::ClusterEnv;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node");

#[test]
fn ioredis_node_redis_and_bullmq_work_through_heatshield() {
    common::fixtures::node_clients_installed();
    let env = ClusterEnv::start(None);
    let mut child = Command::new("node")
        .arg(format!("{DIR}/clients.js"))
        .arg(env.proxy.port().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for node") {
            break Some(s);
        }
        if started.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().expect("node output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(status.is_some(), "the Node.js clients hung for 90 s\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let want = [
        "ok ioredis multi",
        "ok ioredis pipeline",
        "ok ioredis watch",
        "ok ioredis blpop",
        "ok node-redis multi",
        "ok node-redis blPop",
        "ok node-redis watch",
        "ok ioredis pub/sub",
        "ok node-redis pub/sub",
        "ok bullmq worker picks up a job added after it drained",
    ];
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, want, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(status.is_some_and(|s| s.success()));
    assert!(env.proxy.is_alive());
}
