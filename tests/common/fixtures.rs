//! Fixtures the tests of one binary share: [`Shared`] hands one expensive fixture to the
//! tests that overlap and tears it down when the last is done (a plain `static` would
//! leak the redis-server processes: statics are never dropped); [`ClusterEnv`] is the
//! usual such fixture (a cluster, a proxy in front of it, the slot owners);
//! [`shared_traffic`] / [`exclusive_traffic`] keep tests that read the masters' counters
//! apart from the others.

use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use super::{Proxy, RedisCluster, RedisStandalone, SlotOwners, config_file};

/// A fixture shared by the tests of one binary while they run concurrently.
///
/// `get` returns the live instance if some test still holds it, else builds a new one.
/// When the last `Arc` is dropped the fixture (and its processes) is dropped, so nothing
/// outlives the test binary. With `--test-threads=1` each test simply builds its own.
pub struct Shared<T> {
    slot: Mutex<Weak<T>>,
}

impl<T> Shared<T> {
    pub const fn new() -> Self {
        Shared { slot: Mutex::new(Weak::new()) }
    }

    pub fn get(&self, init: impl FnOnce() -> T) -> Arc<T> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = slot.upgrade() {
            return t;
        }
        let t = Arc::new(init());
        *slot = Arc::downgrade(&t);
        t
    }
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// What most test files start once and share: a cluster, a proxy in front of it (with a
/// configuration file when `config` is given) and who owns each slot.
pub struct ClusterEnv {
    pub cluster: RedisCluster,
    pub proxy: Proxy,
    pub owners: SlotOwners,
    _conf: Option<tempfile::TempDir>,
}

impl ClusterEnv {
    pub fn start(config: Option<&str>) -> ClusterEnv {
        let cluster = RedisCluster::start();
        let (conf, proxy) = match config {
            Some(text) => {
                let (dir, path) = config_file(text);
                (Some(dir), Proxy::start_cluster(&cluster, &["--config", &path]))
            }
            None => (None, Proxy::start_cluster(&cluster, &[])),
        };
        let owners = SlotOwners::read(&cluster);
        ClusterEnv { cluster, proxy, owners, _conf: conf }
    }
}

/// What differential tests start once and share: a cluster, a proxy in front of it, who
/// owns each slot, and a standalone Redis that answers the same commands as the reference.
pub struct DiffEnv {
    pub cluster: RedisCluster,
    pub proxy: Proxy,
    pub standalone: RedisStandalone,
    pub owners: SlotOwners,
}

impl DiffEnv {
    pub fn start() -> DiffEnv {
        let cluster = RedisCluster::start();
        let proxy = Proxy::start_cluster(&cluster, &[]);
        let standalone = RedisStandalone::start();
        let owners = SlotOwners::read(&cluster);
        DiffEnv { cluster, proxy, standalone, owners }
    }
}

/// Tests of one binary that send data commands through a shared cluster hold the read
/// side; a test that reads the masters' counters (`INFO commandstats`, cache statistics)
/// holds the write side, so those count only its own commands.
static QUIET: RwLock<()> = RwLock::new(());

pub fn shared_traffic() -> RwLockReadGuard<'static, ()> {
    QUIET.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive_traffic() -> RwLockWriteGuard<'static, ()> {
    QUIET.write().unwrap_or_else(|e| e.into_inner())
}

/// tests/node, where the Node.js clients' pinned versions (package.json,
/// package-lock.json) are installed.
pub const NODE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node");

/// `node` and `npm` are there (scripts/ensure-deps.sh installs them), and the Node.js
/// clients are installed into tests/node/node_modules (on first use).
pub fn node_clients_installed() {
    let have = |bin: &str| std::process::Command::new(bin).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(have("node") && have("npm"), "node and npm are required for this test: run scripts/ensure-deps.sh");
    if std::path::Path::new(NODE_DIR).join("node_modules/bullmq/package.json").exists() {
        return;
    }
    let out = std::process::Command::new("npm")
        // (not `npm ci`: it refuses a lock file without every platform's optional
        // packages, which some registries leave out; the versions are pinned anyway)
        .args(["install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix", NODE_DIR])
        .output()
        .expect("run npm install");
    assert!(
        out.status.success(),
        "npm install in tests/node failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
