//! Cluster topology and routing: which master owns each slot, the backend connection pools
//! per node, and keeping that picture current.
//!
//! The slot table is an immutable [`Topology`] snapshot swapped atomically (readers never
//! lock). It is learned from `CLUSTER SLOTS` and `CLUSTER NODES` on any reachable node
//! (known masters first, then replicas, then the configured seeds), refreshed
//! periodically, after connection errors, and after a `MOVED` (which also patches the one
//! slot immediately, so the retry goes to the right node).
//!
//! Redirections are verified, not obeyed: a `MOVED` or `ASK` can come from a script's
//! error reply, so its address is client-controlled. heatshield connects only to nodes
//! the cluster itself announced ([`Topology::announces`]); for any other address it asks
//! for a refresh (at most one such refresh per [`CONFIRM_EVERY`]) and follows the
//! redirection only if the refreshed topology announces the target. No pool, connection
//! or credential ever goes to an address that no known node announced.
//! In standalone mode the topology is one node owning every slot and never changes.

pub mod slot;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use crate::protocol::Proto;
use crate::upstream::backend::{self, Backend, BackendOptions, NodeTracking};
use crate::upstream::side::Side;
use crate::worker;
pub use slot::{SLOTS, slot};

/// Marks a slot no master serves.
pub const UNASSIGNED: u16 = u16::MAX;

/// Refreshes asked for to confirm a redirection to an address the topology does not
/// announce happen at most this often, so fake redirections in a loop cannot become a
/// refresh storm.
pub const CONFIRM_EVERY: Duration = Duration::from_secs(1);
/// How long a confirmation waits for its refresh before the redirection counts as
/// unconfirmed.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// The backend connections to one node. Each worker thread has its own set, made on
/// first use on that thread (so a request and its backend connection never cross threads):
/// `n` RESP2 connections, and `n` RESP3 ones when the first RESP3 client needs them.
pub struct NodePool {
    pub addr: Arc<str>,
    /// This pool's bit in a client's mask of the nodes it wrote to (one of 64, given in
    /// turn as pools are made; see crate::services::wait).
    pub bit: u64,
    /// Server-assisted caching state of this node's connections (the hot-key cache owns the policy).
    pub tracking: Arc<NodeTracking>,
    opts: BackendOptions,
    per_conn: usize,
    workers: Box<[WorkerConns]>,
    metrics: Arc<crate::metrics::NodeMetrics>,
    /// Idle dedicated connections, by protocol (RESP2, RESP3).
    idle: Mutex<[Vec<Backend>; 2]>,
    /// Dedicated connections alive (leased and idle), at most `opts.dedicated_max`.
    dedicated: AtomicUsize,
    /// Scripts (EVAL, FCALL, ...) sent here whose reply has not come yet: while there are
    /// some, a PING asks this node whether it is busy (see `crate::face::local`).
    pub scripts: AtomicUsize,
    /// The order blocking commands for this node are written in.
    pub order: backend::SendOrder,
    /// A replica's pool for reads (its connections sent `READONLY`; see [`Topology::readers`]):
    /// the time (`backend::clock_ms`) of the latest sample of its master's replication
    /// offset that the replica had reached when last asked, 0 when it is down or unknown
    /// (kept by `crate::upstream::lag`).
    pub synced_at: AtomicU64,
    /// heatshield's own scripts (the lock commands', one bit each) sent whole (`EVAL`)
    /// here since this pool was made, since the last `SCRIPT FLUSH` through heatshield
    /// and since the last shared connection made to the node; the count of those flushes
    /// and connections above the bits (see [`NodePool::first_send_of_own_script`]).
    own_scripts: AtomicU64,
}

/// `SCRIPT FLUSH`es sent through heatshield (each empties every master's script cache).
static SCRIPT_FLUSHES: AtomicU64 = AtomicU64::new(0);

/// A `SCRIPT FLUSH` went through heatshield: every node's script cache is empty, and
/// heatshield's own scripts go whole again ([`NodePool::first_send_of_own_script`]).
pub fn scripts_flushed() {
    SCRIPT_FLUSHES.fetch_add(1, Ordering::SeqCst);
}

#[derive(Default)]
struct WorkerConns {
    resp2: OnceLock<Vec<Backend>>,
    resp3: OnceLock<Vec<Backend>>,
}

impl NodePool {
    fn new(addr: &str, opts: &BackendOptions, n: usize, workers: usize, replica: bool) -> NodePool {
        let tracking = Arc::new(NodeTracking::default());
        static MADE: AtomicUsize = AtomicUsize::new(0);
        NodePool {
            addr: Arc::from(addr),
            bit: 1 << (MADE.fetch_add(1, Ordering::Relaxed) % 64),
            opts: match replica {
                // nothing read from a replica is cached
                true => BackendOptions { tracking: None, readonly: true, ..opts.clone() },
                false => BackendOptions { tracking: Some(tracking.clone()), ..opts.clone() },
            },
            tracking,
            per_conn: n.max(1),
            workers: (0..workers.max(1)).map(|_| WorkerConns::default()).collect(),
            metrics: Arc::new(crate::metrics::NodeMetrics::new(addr, opts.latency_sample_every)),
            idle: Mutex::new([Vec::new(), Vec::new()]),
            dedicated: AtomicUsize::new(0),
            scripts: AtomicUsize::new(0),
            order: backend::SendOrder::default(),
            synced_at: AtomicU64::new(0),
            own_scripts: AtomicU64::new(0),
        }
    }

    /// Whether heatshield's own script number `bit` (below 8) goes to this node whole
    /// (`EVAL`, which loads it) rather than by its SHA: the first time since this pool was
    /// made, since a `SCRIPT FLUSH` through heatshield, or since a shared connection to
    /// the node was made (again: a node restarted at the same address has an empty
    /// script cache, and heatshield sees its restart only as a connection lost and made
    /// again). Marks it sent. (An `EVALSHA`
    /// that still meets `NOSCRIPT`, after a flush or a restart heatshield did not see, is
    /// sent again whole; but not when a later command of the client on the same keys ran
    /// meanwhile, and a client cannot answer a `NOSCRIPT` for a command that is not a
    /// script: this keeps that to those cases. Two requests at once may both go whole:
    /// harmless.)
    pub fn first_send_of_own_script(&self, bit: u32) -> bool {
        // (both counts only grow, so their sum changes whenever either does)
        let epoch = SCRIPT_FLUSHES.load(Ordering::SeqCst) + self.metrics.connects.load(Ordering::SeqCst);
        let now = self.own_scripts.load(Ordering::Relaxed);
        let known = if now >> 8 == epoch & (u64::MAX >> 8) { now & 0xff } else { 0 };
        if known & (1 << bit) != 0 {
            return false;
        }
        self.own_scripts.store((epoch << 8) | known | (1 << bit), Ordering::Relaxed);
        true
    }

    /// A dedicated connection to this node for one client (WATCH, a blocking command):
    /// an idle one, or a new one (it connects when first used). `None` when the node has
    /// `backend.dedicated_max_per_node` already.
    pub fn lease(self: &Arc<Self>, proto: Proto) -> Option<Lease> {
        let p = proto_index(proto);
        loop {
            let Some(conn) = self.idle.lock()[p].pop() else { break };
            let lease = Lease { node: self.clone(), conn: Some(conn), proto };
            if !lease.broken() {
                return Some(lease);
            }
            // it broke while idle: dropped, which closes it
        }
        let max = self.opts.dedicated_max;
        self.dedicated.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1)).ok()?;
        self.metrics.dedicated.increment(1.0);
        let o = BackendOptions { resp3: proto == Proto::Resp3, tracking: None, dedicated: true, ..self.opts.clone() };
        let conn = Backend::spawn(self.addr.clone(), o, self.metrics.clone());
        Some(Lease { node: self.clone(), conn: Some(conn), proto })
    }

    /// Dedicated connections alive now (leased and idle).
    pub fn dedicated(&self) -> usize {
        self.dedicated.load(Ordering::Relaxed)
    }

    /// The connection a client uses: this worker's, fixed per client (`affinity`), so one
    /// client's commands to one node stay in order. Must be called inside the runtime of
    /// the current worker (connections are started there).
    #[inline]
    pub fn conn(&self, proto: Proto, affinity: u64) -> &Backend {
        let w = &self.workers[worker::current() % self.workers.len()];
        let (cell, resp3) = match proto {
            Proto::Resp2 => (&w.resp2, false),
            Proto::Resp3 => (&w.resp3, true),
        };
        let conns = cell.get_or_init(|| {
            let o = BackendOptions { resp3, ..self.opts.clone() };
            (0..self.per_conn).map(|_| Backend::spawn(self.addr.clone(), o.clone(), self.metrics.clone())).collect()
        });
        &conns[(affinity % conns.len() as u64) as usize]
    }

    /// The options this node's connections use.
    pub fn options(&self) -> &BackendOptions {
        &self.opts
    }

    /// All connections made so far (for admin views).
    pub fn connections(&self) -> impl Iterator<Item = (Proto, &Backend)> {
        self.workers.iter().flat_map(|w| {
            let r2 = w.resp2.get().into_iter().flatten().map(|b| (Proto::Resp2, b));
            let r3 = w.resp3.get().into_iter().flatten().map(|b| (Proto::Resp3, b));
            r2.chain(r3)
        })
    }
}

fn proto_index(p: Proto) -> usize {
    match p {
        Proto::Resp2 => 0,
        Proto::Resp3 => 1,
    }
}

/// A dedicated connection leased to one client ([`NodePool::lease`]). Dropped, it is
/// closed (whatever it was doing: a blocked command, a WATCH); [`Lease::release`] gives
/// it back for the next lessee when that is safe.
pub struct Lease {
    node: Arc<NodePool>,
    conn: Option<Backend>,
    proto: Proto,
}

impl Lease {
    pub fn node(&self) -> &Arc<NodePool> {
        &self.node
    }

    pub fn conn(&self) -> &Backend {
        self.conn.as_ref().expect("a lease holds its connection until dropped")
    }

    /// The connection is gone (it broke, or could not connect): what it held is lost.
    pub fn broken(&self) -> bool {
        self.conn().stats.state() == backend::ConnState::Down
    }

    /// Gives the connection back to the pool if it is up and idle (nothing in flight),
    /// after an `UNWATCH` when `unwatch` (its reply is dropped); closes it otherwise.
    pub fn release(mut self, unwatch: bool) {
        let conn = self.conn.take().expect("a lease holds its connection until dropped");
        let clean = conn.stats.state() != backend::ConnState::Down && conn.stats.inflight.load(Ordering::SeqCst) == 0;
        let mut idle = self.node.idle.lock();
        let list = &mut idle[proto_index(self.proto)];
        if clean && list.len() < self.node.opts.dedicated_idle {
            if unwatch {
                // its reply goes nowhere; the next lessee's commands come after it
                let (tx, _) = crate::mailbox::reply_channel();
                conn.send(backend::BackendRequest {
                    data: bytes::Bytes::from_static(b"*1\r\n$7\r\nUNWATCH\r\n"),
                    count: 1,
                    prefix: backend::Prefix::None,
                    tag: crate::mailbox::Tag { seq: 0, part: 0 },
                    reply_to: tx,
                    order: None,
                    db: 0,
                });
            }
            list.push(conn);
            return;
        }
        drop(idle);
        drop(conn);
        self.node.dedicated.fetch_sub(1, Ordering::SeqCst);
        self.node.metrics.dedicated.decrement(1.0);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            self.node.dedicated.fetch_sub(1, Ordering::SeqCst);
            self.node.metrics.dedicated.decrement(1.0);
        }
    }
}

/// One consistent view of the cluster.
pub struct Topology {
    /// The slot map's version: increases with every change (`heatshield_slot_map_epoch`).
    pub version: u64,
    /// Every node address the cluster announced at the last refresh (masters, replicas,
    /// and nodes that serve no slot yet, from `CLUSTER NODES`): the only addresses a
    /// redirection may send heatshield to.
    nodes: HashSet<String>,
    /// Slot -> index into `masters`, or [`UNASSIGNED`].
    slots: Vec<u16>,
    /// The same map as runs of slots, while it has few ([`Runs`]): what lookups read.
    runs: Option<Runs>,
    /// Masters, sorted by address (the order SCAN cursors refer to).
    pub masters: Vec<Arc<NodePool>>,
    /// Replica addresses of each master, same order.
    pub replicas: Vec<Vec<String>>,
    /// Pools for reads from each master's replicas, same order (empty unless replica
    /// reads are on: [`Cluster::read_replicas`]).
    pub readers: Vec<Vec<Arc<NodePool>>>,
}

impl Topology {
    /// The master serving `slot`.
    #[inline]
    pub fn master_for_slot(&self, slot: u16) -> Option<&Arc<NodePool>> {
        match self.index_of(slot) {
            UNASSIGNED => None,
            i => Some(&self.masters[i as usize]),
        }
    }

    /// The index of the master serving `slot` (in `masters`, `replicas` and `readers`).
    #[inline]
    pub fn master_index(&self, slot: u16) -> Option<usize> {
        match self.index_of(slot) {
            UNASSIGNED => None,
            i => Some(i as usize),
        }
    }

    /// `slots[slot]`, from the runs when the map has few.
    #[inline]
    fn index_of(&self, slot: u16) -> u16 {
        match &self.runs {
            Some(r) => r.index_of(slot),
            None => self.slots[slot as usize],
        }
    }

    /// Slot ranges served by master `i`.
    pub fn ranges_of(&self, i: usize) -> Vec<(u16, u16)> {
        let mut out: Vec<(u16, u16)> = Vec::new();
        for (s, &m) in self.slots.iter().enumerate() {
            if m as usize == i {
                match out.last_mut() {
                    Some(r) if r.1 as usize + 1 == s => r.1 = s as u16,
                    _ => out.push((s as u16, s as u16)),
                }
            }
        }
        out
    }

    /// The master that `addr` replicates now, if `addr` is no master any more (after a
    /// failover made it a replica of the one promoted in its place).
    pub fn promoted_for(&self, addr: &str) -> Option<Arc<NodePool>> {
        if self.masters.iter().any(|m| &*m.addr == addr) {
            return None;
        }
        let i = self.replicas.iter().position(|r| r.iter().any(|a| a == addr))?;
        Some(self.masters[i].clone())
    }

    /// Whether the cluster announced a node at `addr`.
    pub fn announces(&self, addr: &str) -> bool {
        self.nodes.contains(addr) || self.masters.iter().any(|m| &*m.addr == addr)
    }

    fn empty() -> Topology {
        Topology {
            version: 0,
            nodes: HashSet::new(),
            slots: vec![UNASSIGNED; SLOTS],
            runs: Runs::of(&[UNASSIGNED; SLOTS]),
            masters: vec![],
            replicas: vec![],
            readers: vec![],
        }
    }
}

/// Most runs [`Runs`] holds: 16 ends and 16 masters, one cache line.
const RUNS: usize = 16;

/// A slot map of at most [`RUNS`] runs (slots in a row with one master, or none): a
/// cluster's slots usually lie in a few ranges a master (three, for three masters set up
/// by `redis-cli --cluster create`), and a map cut into more (slots moved one by one)
/// is read from the table. Why not the table always: every request with a key looks its
/// slot up, keys fall on slots at random, and a random read of a 32 KiB table missed the
/// cache (the load was 2.8% of heatshield's CPU at SET -P16, `perf`); the runs are one
/// line, read by every lookup, so it stays cached, and the run is found without a
/// branch (a count of the ends before the slot, which the compiler makes a few vector
/// instructions).
#[derive(Clone, Copy)]
struct Runs {
    /// The last slot of each run, in order; `u16::MAX` past the last run (never before
    /// a slot, so the count stops at the last run, which ends at slot 16383).
    ends: [u16; RUNS],
    /// Each run's master (an index into `masters`), or [`UNASSIGNED`].
    masters: [u16; RUNS],
}

impl Runs {
    /// The runs of `slots` (one master index a slot), if there are at most [`RUNS`].
    fn of(slots: &[u16]) -> Option<Runs> {
        let mut r = Runs { ends: [u16::MAX; RUNS], masters: [UNASSIGNED; RUNS] };
        let mut n = 0;
        for (s, &m) in slots.iter().enumerate() {
            if n > 0 && r.masters[n - 1] == m {
                r.ends[n - 1] = s as u16;
                continue;
            }
            if n == RUNS {
                return None;
            }
            (r.ends[n], r.masters[n]) = (s as u16, m);
            n += 1;
        }
        Some(r)
    }

    #[inline]
    fn index_of(&self, slot: u16) -> u16 {
        let before = self.ends.iter().fold(0u16, |n, &e| n + (e < slot) as u16) as usize;
        self.masters[before.min(RUNS - 1)]
    }
}

thread_local! {
    /// This thread's last look at a cluster's slot map ([`Cluster::topology`]). Out of
    /// the cell while a [`TopologyView`] holds it (a look made meanwhile loads its own).
    /// One snapshot a thread: an outgrown map (and its pools) stays alive until that
    /// thread looks again, which the workers do with every request.
    static SEEN: std::cell::Cell<Option<Seen>> = const { std::cell::Cell::new(None) };
}

struct Seen {
    /// The [`Cluster`]'s [`Cluster::id`], so that two clusters in one process (tests) are
    /// apart.
    cluster: u64,
    /// [`Cluster::published`] when `topo` was loaded: `topo` is that map or a newer one.
    published: u64,
    topo: Arc<Topology>,
}

/// A slot map from [`Cluster::topology`]; given back to the thread's cell when dropped.
pub struct TopologyView {
    /// Always set until dropped.
    seen: Option<Seen>,
}

impl std::ops::Deref for TopologyView {
    type Target = Arc<Topology>;
    #[inline]
    fn deref(&self) -> &Arc<Topology> {
        match &self.seen {
            Some(s) => &s.topo,
            None => unreachable!("a TopologyView is only emptied by its drop"),
        }
    }
}

impl Drop for TopologyView {
    #[inline]
    fn drop(&mut self) {
        let seen = self.seen.take();
        // (not after the thread's cell is gone, at its exit)
        let _ = SEEN.try_with(|c| c.set(seen));
    }
}

/// What heatshield fronts: a Redis Cluster (found from seeds) or one standalone server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    Cluster { seeds: Vec<String> },
    Standalone { addr: String },
}

/// The cluster as the proxy sees it.
pub struct Cluster {
    /// The nodes it starts from: the configured backend, or a migration's target after a
    /// cutover ([`Cluster::retarget`]).
    backing: parking_lot::RwLock<Backing>,
    /// Cluster mode (`backing` is `Backing::Cluster`); never changes.
    clustered: bool,
    topo: ArcSwap<Topology>,
    pools: Mutex<HashMap<String, Arc<NodePool>>>,
    /// Pools for reads from replicas, by address (apart from `pools`: their connections
    /// sent `READONLY`, which must not serve a master's requests).
    reader_pools: Mutex<HashMap<String, Arc<NodePool>>>,
    /// Replica reads are on: every slot map carries the replicas' pools.
    replica_reads: std::sync::atomic::AtomicBool,
    opts: parking_lot::RwLock<BackendOptions>,
    conns_per_node: usize,
    workers: usize,
    version: AtomicU64,
    /// Unique in the process (the thread's view of a dropped cluster is never taken for a
    /// new one's at the same address).
    id: u64,
    /// Slot maps stored so far, counted after each store ([`Cluster::topology`]).
    published: AtomicU64,
    wake: Notify,
    /// Wakes the refresher for a confirmation refresh (rate-limited, see [`CONFIRM_EVERY`]).
    confirm: Notify,
    /// Refreshes done, successful or not (for INFO/metrics).
    pub refreshes: AtomicU64,
    /// Refreshes started so far; each refresh publishes its number in `refreshed` when
    /// it has finished, so a confirmation can wait for one that started after it asked.
    started: AtomicU64,
    refreshed: watch::Sender<u64>,
    /// Why the last refresh failed, until one succeeds (`PROXY NODES`).
    refresh_error: Mutex<Option<String>>,
}

impl Cluster {
    /// Creates the cluster view for `workers` worker threads; in standalone mode the
    /// topology is complete at once. No connection is made until a worker uses a node.
    pub fn new(backing: Backing, opts: BackendOptions, conns_per_node: usize, workers: usize) -> Arc<Cluster> {
        let c = Arc::new(Cluster {
            backing: parking_lot::RwLock::new(backing.clone()),
            clustered: matches!(backing, Backing::Cluster { .. }),
            topo: ArcSwap::from_pointee(Topology::empty()),
            pools: Mutex::new(HashMap::new()),
            reader_pools: Mutex::new(HashMap::new()),
            replica_reads: std::sync::atomic::AtomicBool::new(false),
            opts: parking_lot::RwLock::new(opts),
            conns_per_node: conns_per_node.max(1),
            workers: workers.max(1),
            version: AtomicU64::new(0),
            id: {
                static NEXT: AtomicU64 = AtomicU64::new(1);
                NEXT.fetch_add(1, Ordering::Relaxed)
            },
            published: AtomicU64::new(0),
            wake: Notify::new(),
            confirm: Notify::new(),
            refreshes: AtomicU64::new(0),
            started: AtomicU64::new(0),
            refreshed: watch::Sender::new(0),
            refresh_error: Mutex::new(None),
        });
        if let Backing::Standalone { addr } = &backing {
            let pool = c.pool(addr);
            c.install(HashSet::from([addr.clone()]), vec![0; SLOTS], vec![pool], vec![vec![]], vec![vec![]]);
        }
        c
    }

    pub fn is_cluster(&self) -> bool {
        self.clustered
    }

    /// The nodes it starts from now.
    pub fn backing(&self) -> Backing {
        self.backing.read().clone()
    }

    /// The options of its connections now.
    pub fn options(&self) -> BackendOptions {
        self.opts.read().clone()
    }

    /// Serves another cluster from now on (a migration's cutover or rollback,
    /// crate::services::migration): its slot map is fetched from `backing`'s seeds alone
    /// and installed, and the pools of the nodes it does not announce are dropped (their
    /// connections close once the requests on them are answered). Both must be clusters,
    /// or both one server.
    pub async fn retarget(&self, backing: Backing, opts: BackendOptions) -> Result<(), String> {
        if matches!(backing, Backing::Cluster { .. }) != self.clustered {
            return Err("the other side is not of the same mode (cluster or standalone)".into());
        }
        *self.opts.write() = opts;
        *self.backing.write() = backing.clone();
        match backing {
            Backing::Cluster { seeds } => {
                let mut last = String::from("no seed nodes");
                let mut done = false;
                for addr in &seeds {
                    match self.fetch_slots(addr).await {
                        Ok((map, nodes)) => {
                            self.apply(map, nodes);
                            done = true;
                            break;
                        }
                        Err(e) => last = format!("{addr}: {e}"),
                    }
                }
                if !done {
                    return Err(last);
                }
            }
            Backing::Standalone { addr } => {
                let pool = self.pool(&addr);
                self.install(HashSet::from([addr.clone()]), vec![0; SLOTS], vec![pool], vec![vec![]], vec![vec![]]);
            }
        }
        let topo = self.topo.load_full();
        self.pools.lock().retain(|a, _| topo.announces(a) || topo.masters.iter().any(|m| &*m.addr == a));
        Ok(())
    }

    /// The current snapshot, as this thread last saw it if no newer one was published
    /// since ([`TopologyView`]): one load of a counter a request, where a load of the
    /// `ArcSwap` itself took a slot of its debt list with an atomic exchange (about 70
    /// instructions and a full barrier, on every request).
    #[inline]
    pub fn topology(&self) -> TopologyView {
        let cluster = self.id;
        let published = self.published.load(Ordering::Acquire);
        let seen = match SEEN.try_with(|c| c.take()).ok().flatten() {
            Some(s) if s.cluster == cluster && s.published == published => s,
            _ => Seen { cluster, published, topo: self.topo.load_full() },
        };
        TopologyView { seen: Some(seen) }
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    /// Every node pool (masters, and nodes a redirection pointed at).
    pub fn pools(&self) -> Vec<Arc<NodePool>> {
        self.pools.lock().values().cloned().collect()
    }

    /// The pool for `addr` if the cluster announced a node there (see
    /// [`Topology::announces`]); never a pool for any other address.
    pub fn announced_pool(&self, addr: &str) -> Option<Arc<NodePool>> {
        let topo = self.topology();
        if let Some(p) = topo.masters.iter().find(|m| &*m.addr == addr) {
            return Some(p.clone());
        }
        topo.announces(addr).then(|| self.pool(addr))
    }

    /// The pool for `addr`, created on first use. Only for addresses the cluster announced.
    fn pool(&self, addr: &str) -> Arc<NodePool> {
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get(addr) {
            return p.clone();
        }
        let p = Arc::new(NodePool::new(addr, &self.opts.read(), self.conns_per_node, self.workers, false));
        pools.insert(addr.to_string(), p.clone());
        p
    }

    /// Reads go to replicas too (set before the first refresh): each slot map carries
    /// pools for reads from the replicas.
    pub fn enable_replica_reads(&self) {
        self.replica_reads.store(true, Ordering::SeqCst);
    }

    /// Whether replica reads are on.
    pub fn replica_reads_on(&self) -> bool {
        self.replica_reads.load(Ordering::Relaxed)
    }

    /// The pools for reads from the replicas at `addrs` (none when replica reads are off).
    fn reader_pools(&self, addrs: &[Vec<String>]) -> Vec<Vec<Arc<NodePool>>> {
        if !self.replica_reads_on() {
            return vec![vec![]; addrs.len()];
        }
        let mut pools = self.reader_pools.lock();
        let out = addrs
            .iter()
            .map(|list| {
                list.iter()
                    .map(|a| {
                        pools
                            .entry(a.clone())
                            .or_insert_with(|| {
                                Arc::new(NodePool::new(a, &self.opts.read(), self.conns_per_node, self.workers, true))
                            })
                            .clone()
                    })
                    .collect()
            })
            .collect();
        // forget the pools of nodes that are no replicas any more
        pools.retain(|a, _| addrs.iter().flatten().any(|r| r == a));
        out
    }

    fn install(
        &self,
        nodes: HashSet<String>,
        slots: Vec<u16>,
        masters: Vec<Arc<NodePool>>,
        replicas: Vec<Vec<String>>,
        readers: Vec<Vec<Arc<NodePool>>>,
    ) {
        let version = self.version.fetch_add(1, Ordering::Relaxed) + 1;
        let runs = Runs::of(&slots);
        self.topo.store(Arc::new(Topology { version, nodes, slots, runs, masters, replicas, readers }));
        // after the store: a thread that sees this count loads the new map (or a newer one)
        self.published.fetch_add(1, Ordering::Release);
        crate::metrics::global().slot_map_version.set(version as f64);
    }

    /// Applies a `MOVED slot addr` at once and asks for a full refresh, if the cluster
    /// announced a node at `addr`. Returns false, changing nothing, otherwise: the caller
    /// may wait for [`fresh_topology`](Cluster::fresh_topology) and ask again.
    pub fn moved(&self, slot: u16, addr: &str) -> bool {
        let cur = self.topology();
        if cur.master_for_slot(slot).is_some_and(|p| &*p.addr == addr) {
            return true;
        }
        if !cur.announces(addr) {
            return false;
        }
        let mut masters = cur.masters.clone();
        let mut replicas = cur.replicas.clone();
        let mut readers = cur.readers.clone();
        let idx = match masters.iter().position(|p| &*p.addr == addr) {
            Some(i) => i,
            None => {
                masters.push(self.pool(addr));
                replicas.push(vec![]);
                readers.push(vec![]);
                masters.len() - 1
            }
        };
        let mut slots = cur.slots.clone();
        slots[slot as usize] = idx as u16;
        let nodes = cur.nodes.clone();
        drop(cur);
        self.install(nodes, slots, masters, replicas, readers);
        self.request_refresh();
        true
    }

    /// Waits (at most a few seconds) for a topology refresh that starts after this call,
    /// asking for one: at most one such refresh runs per [`CONFIRM_EVERY`]. Used before a
    /// redirection to an address the topology does not announce is looked at again.
    pub async fn fresh_topology(&self) {
        if !self.is_cluster() {
            return;
        }
        let want = self.started.load(Ordering::SeqCst) + 1;
        let mut done = self.refreshed.subscribe();
        self.confirm.notify_one();
        let _ = tokio::time::timeout(CONFIRM_TIMEOUT, done.wait_for(|&n| n >= want)).await;
    }

    /// Wakes the refresher (it coalesces bursts of requests).
    pub fn request_refresh(&self) {
        if self.is_cluster() {
            self.wake.notify_one();
        }
    }

    /// Fetches the slot map from the first node that answers and installs it.
    pub async fn refresh(&self) -> Result<(), String> {
        let Backing::Cluster { seeds } = self.backing() else {
            return Ok(());
        };
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let number = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        let result = self.refresh_from(&seeds).await;
        *self.refresh_error.lock() = result.as_ref().err().cloned();
        self.refreshed.send_modify(|n| *n = (*n).max(number));
        result
    }

    /// Why the last topology refresh failed, if none has succeeded since.
    pub fn refresh_error(&self) -> Option<String> {
        self.refresh_error.lock().clone()
    }

    async fn refresh_from(&self, seeds: &[String]) -> Result<(), String> {
        let mut candidates: Vec<String> = self.topology().masters.iter().map(|p| p.addr.to_string()).collect();
        for r in self.topology().replicas.iter().flatten() {
            candidates.push(r.clone());
        }
        candidates.extend(seeds.iter().cloned());
        candidates.dedup();
        let mut last_err = String::from("no seed nodes");
        for addr in candidates {
            match self.fetch_slots(&addr).await {
                Ok((map, nodes)) => {
                    self.apply(map, nodes);
                    crate::metrics::global().refresh_ok.increment(1);
                    return Ok(());
                }
                Err(e) => {
                    debug!(node = %addr, error = %e, "topology fetch failed");
                    last_err = format!("{addr}: {e}");
                }
            }
        }
        crate::metrics::global().refresh_error.increment(1);
        Err(last_err)
    }

    /// `CLUSTER SLOTS` and `CLUSTER NODES` of one node: the slot map, and every node
    /// address the cluster announces.
    async fn fetch_slots(&self, addr: &str) -> Result<(SlotMap, HashSet<String>), String> {
        let opts = self.options();
        let mut side = Side::new(addr, &opts, "topology");
        let mut ask = async |args: &[&str]| side.call(args).await.map_err(|e| e.to_string());
        let slots = ask(&["CLUSTER", "SLOTS"]).await?;
        let nodes = ask(&["CLUSTER", "NODES"]).await?;
        let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or("127.0.0.1");
        let mut map = parse_cluster_slots(&slots, host)?;
        let (mut announced, replicas) = parse_cluster_nodes(&nodes, host)?;
        // CLUSTER SLOTS leaves out a replica until the cluster bus has told of its
        // replication offset (seconds after it joined): CLUSTER NODES lists it at once
        for r in &mut map {
            for (replica, master) in &replicas {
                if *master == r.master && !r.replicas.contains(replica) {
                    r.replicas.push(replica.clone());
                }
            }
        }
        for r in &map {
            announced.insert(r.master.clone());
            announced.extend(r.replicas.iter().cloned());
        }
        Ok((map, announced))
    }

    fn apply(&self, map: SlotMap, nodes: HashSet<String>) {
        let mut addrs: Vec<String> = map.iter().map(|r| r.master.clone()).collect();
        addrs.sort();
        addrs.dedup();
        let mut slots = vec![UNASSIGNED; SLOTS];
        let mut replicas = vec![vec![]; addrs.len()];
        for r in &map {
            let i = addrs.binary_search(&r.master).expect("collected above");
            for s in r.start..=r.end {
                slots[s as usize] = i as u16;
            }
            for rep in &r.replicas {
                if !replicas[i].contains(rep) {
                    replicas[i].push(rep.clone());
                }
            }
        }
        let cur = self.topology();
        let same = cur.slots == slots
            && cur.masters.len() == addrs.len()
            && cur.masters.iter().zip(&addrs).all(|(p, a)| &*p.addr == a)
            && cur.replicas == replicas
            && cur.nodes == nodes;
        drop(cur);
        if same {
            return;
        }
        let masters: Vec<Arc<NodePool>> = addrs.iter().map(|a| self.pool(a)).collect();
        info!(masters = ?addrs, "topology updated");
        let readers = self.reader_pools(&replicas);
        self.install(nodes, slots, masters, replicas, readers);
        // Forget pools of nodes that are no longer masters: their tasks finish what is in
        // flight and exit once no snapshot or session holds them.
        self.pools.lock().retain(|a, _| addrs.iter().any(|m| m == a));
    }

    /// Runs refreshes: every `interval`, and soon after any [`request_refresh`](Cluster::request_refresh).
    pub fn spawn_refresher(self: &Arc<Self>, interval: Duration) {
        if !self.is_cluster() {
            return;
        }
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            // when the last confirmation refresh ran
            let mut last_confirm: Option<tokio::time::Instant> = None;
            loop {
                let Some(c) = me.upgrade() else { return };
                let (woke, confirm) = tokio::select! {
                    _ = c.wake.notified() => (true, false),
                    _ = c.confirm.notified() => (false, true),
                    _ = tokio::time::sleep(interval) => (false, false),
                };
                if confirm && let Some(t) = last_confirm {
                    // rate limit: redirections to unknown addresses may come from scripts
                    tokio::time::sleep_until(t + CONFIRM_EVERY).await;
                }
                if confirm {
                    last_confirm = Some(tokio::time::Instant::now());
                }
                if let Err(e) = c.refresh().await {
                    warn!(error = %e, "topology refresh failed");
                }
                drop(c);
                if woke {
                    // coalesce bursts (many MOVED replies during one migration)
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
    }
}

/// One row of CLUSTER SLOTS.
struct SlotRange {
    start: u16,
    end: u16,
    master: String,
    replicas: Vec<String>,
}
type SlotMap = Vec<SlotRange>;

fn node_addr(f: &OwnedFrame, default_host: &str) -> Option<String> {
    let OwnedFrame::Array(parts) = f else { return None };
    let host = match parts.first()? {
        OwnedFrame::BulkString(h) | OwnedFrame::SimpleString(h) => String::from_utf8_lossy(h).into_owned(),
        _ => return None,
    };
    let port = match parts.get(1)? {
        OwnedFrame::Integer(p) => *p,
        _ => return None,
    };
    let host = if host.is_empty() || host == "?" { default_host.to_string() } else { host };
    Some(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
}

/// The addresses of the nodes in a `CLUSTER NODES` reply (a bulk string, one node a
/// line: `id host:port@cport[,hostname] flags master-id ...`), but for nodes still in
/// handshake or without an address; and each replica not marked failing, with its
/// master's address.
#[allow(clippy::type_complexity)]
fn parse_cluster_nodes(reply: &[u8], default_host: &str) -> Result<(HashSet<String>, Vec<(String, String)>), String> {
    let (frame, _) = decode(reply).map_err(|e| e.to_string())?.ok_or("incomplete CLUSTER NODES reply")?;
    let text = match frame {
        OwnedFrame::BulkString(b) | OwnedFrame::SimpleString(b) => b,
        OwnedFrame::Error(e) => return Err(e),
        _ => return Err("unexpected CLUSTER NODES reply".into()),
    };
    let mut out = HashSet::new();
    let mut ids: HashMap<String, String> = HashMap::new();
    let mut replicas: Vec<(String, String)> = Vec::new();
    for line in String::from_utf8_lossy(&text).lines() {
        let mut f = line.split(' ');
        let (Some(id), Some(addr), Some(flags)) = (f.next(), f.next(), f.next()) else { continue };
        if flags.split(',').any(|x| x == "handshake" || x == "noaddr") {
            continue;
        }
        let hostport = addr.split(['@', ',']).next().unwrap_or("");
        let Some((host, port)) = hostport.rsplit_once(':') else { continue };
        if port.parse::<u16>().is_err() {
            continue;
        }
        let host = if host.is_empty() || host == "?" { default_host } else { host };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addr = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        ids.insert(id.to_string(), addr.clone());
        let failing = flags.split(',').any(|x| x == "fail" || x == "fail?");
        if let Some(master) = f.next()
            && flags.split(',').any(|x| x == "slave" || x == "replica")
            && !failing
            && master != "-"
        {
            replicas.push((addr.clone(), master.to_string()));
        }
        out.insert(addr);
    }
    let replicas = replicas.into_iter().filter_map(|(r, m)| Some((r, ids.get(&m)?.clone()))).collect();
    Ok((out, replicas))
}

/// Parses a `CLUSTER SLOTS` reply (decoded with redis-protocol).
fn parse_cluster_slots(reply: &[u8], default_host: &str) -> Result<SlotMap, String> {
    let (frame, _) = decode(reply).map_err(|e| e.to_string())?.ok_or("incomplete CLUSTER SLOTS reply")?;
    let rows = match frame {
        OwnedFrame::Array(rows) => rows,
        OwnedFrame::Error(e) => return Err(e),
        _ => return Err("unexpected CLUSTER SLOTS reply".into()),
    };
    let mut out = Vec::new();
    for row in rows {
        let OwnedFrame::Array(f) = row else {
            return Err("bad CLUSTER SLOTS row".into());
        };
        let (Some(OwnedFrame::Integer(start)), Some(OwnedFrame::Integer(end))) = (f.first(), f.get(1)) else {
            return Err("bad CLUSTER SLOTS range".into());
        };
        if !(0..SLOTS as i64).contains(start) || !(0..SLOTS as i64).contains(end) || start > end {
            return Err("slot out of range".into());
        }
        let master = f.get(2).and_then(|n| node_addr(n, default_host)).ok_or("bad master entry")?;
        let replicas = f[3..].iter().filter_map(|n| node_addr(n, default_host)).collect();
        out.push(SlotRange { start: *start as u16, end: *end as u16, master, replicas });
    }
    if out.is_empty() {
        return Err("no slots assigned".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_answer_as_the_table_does_and_give_way_to_it_past_sixteen() {
        // maps of 1 to 40 runs (some unassigned), the run boundaries at random
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for runs in 1..=40usize {
            let mut cuts: Vec<usize> = (0..runs - 1).map(|_| 1 + next(SLOTS as u64 - 1) as usize).collect();
            cuts.sort_unstable();
            cuts.dedup();
            cuts.push(SLOTS);
            let mut slots = Vec::with_capacity(SLOTS);
            let mut last = u16::MAX - 1;
            for &end in &cuts {
                // (neighbours differ, so each cut starts a run)
                let mut m = if next(5) == 0 { UNASSIGNED } else { next(4) as u16 };
                if m == last {
                    m = if m == UNASSIGNED { 0 } else { m + 1 };
                }
                last = m;
                slots.resize(end, m);
            }
            let n = cuts.len();
            match Runs::of(&slots) {
                Some(r) => {
                    assert!(n <= RUNS, "{n} runs kept");
                    for (s, &m) in slots.iter().enumerate() {
                        assert_eq!(r.index_of(s as u16), m, "slot {s} of {n} runs");
                    }
                }
                None => assert!(n > RUNS, "{n} runs refused"),
            }
        }
        // one master for every slot, and nothing served
        assert_eq!(Runs::of(&[3; SLOTS]).map(|r| (r.index_of(0), r.index_of(16383))), Some((3, 3)));
        assert_eq!(Runs::of(&[UNASSIGNED; SLOTS]).map(|r| r.index_of(100)), Some(UNASSIGNED));
    }

    #[test]
    fn a_threads_view_of_the_slot_map_follows_each_publication() {
        let new = || {
            let opts = BackendOptions::plain(std::time::Duration::from_secs(1));
            Cluster::new(Backing::Cluster { seeds: vec!["127.0.0.1:1".into()] }, opts, 1, 1)
        };
        let publish = |c: &Cluster, node: &str| {
            c.install(HashSet::from([node.to_string()]), Vec::new(), Vec::new(), Vec::new(), Vec::new())
        };
        let (a, b) = (new(), new());
        publish(&a, "a1");
        publish(&b, "b1");
        // two clusters on one thread: each view is its own cluster's map
        assert!(a.topology().nodes.contains("a1"));
        assert!(b.topology().nodes.contains("b1"));
        assert!(a.topology().nodes.contains("a1"));
        // a new map is seen on the next look, also while an older view is held
        let held = a.topology();
        publish(&a, "a2");
        assert!(a.topology().nodes.contains("a2"));
        assert!(held.nodes.contains("a1"));
        drop(held); // (gives the older map back to the thread's cell)
        assert!(a.topology().nodes.contains("a2"));
        assert_eq!(a.topology().version, 2);
        // another thread sees the newest map too
        let a2 = a.clone();
        assert!(std::thread::spawn(move || a2.topology().nodes.contains("a2")).join().unwrap());
        // a dropped cluster's view is not taken for a new cluster's
        drop(a);
        let c = new();
        publish(&c, "c1");
        assert!(c.topology().nodes.contains("c1"));
    }

    #[test]
    fn parses_cluster_slots() {
        let reply = b"*2\r\n*4\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*3\r\n$0\r\n\r\n:7003\r\n$2\r\nid\r\n*3\r\n:5461\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:7001\r\n$2\r\nid\r\n";
        let m = parse_cluster_slots(reply, "127.0.0.1").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].start, m[0].end, m[0].master.as_str()), (0, 5460, "127.0.0.1:7000"));
        assert_eq!(m[0].replicas, vec!["127.0.0.1:7003".to_string()]);
        assert_eq!(m[1].master, "127.0.0.1:7001");
        assert!(parse_cluster_slots(b"-ERR This instance has cluster support disabled\r\n", "h").is_err());
    }

    #[test]
    fn parses_cluster_nodes() {
        let text = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                    b2 :7001@17001 master - 0 0 2 connected 5461-16383\n\
                    c3 127.0.0.1:7002@17002,host.example slave b2 0 0 2 connected\n\
                    d4 127.0.0.1:7003@17003 handshake - 0 0 0 disconnected\n\
                    e5 :0@0 master,noaddr - 0 0 3 disconnected\n\
                    f6 ::1:7004@17004 master - 0 0 4 connected\n";
        let reply = format!("${}\r\n{}\r\n", text.len(), text);
        let (n, replicas) = parse_cluster_nodes(reply.as_bytes(), "127.0.0.1").unwrap();
        let mut got: Vec<&str> = n.iter().map(|s| s.as_str()).collect();
        got.sort();
        assert_eq!(got, ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002", "[::1]:7004"]);
        assert_eq!(replicas, vec![("127.0.0.1:7002".to_string(), "127.0.0.1:7001".to_string())]);
    }
}
