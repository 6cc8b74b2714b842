//! Pub/sub through shared subscription connections: the [`Hub`] knows which clients
//! subscribed to which channels, patterns and shard channels, keeps the backend
//! subscriptions that serve them, and fans each message out to the subscribers' reply
//! channels (the bytes Redis sent, shared, not copied per subscriber).
//!
//! Backend subscriptions live on "links": one RESP3 connection per master, shared by
//! every client of this heatshield (a connection per subscribed client would spend one of
//! Redis's `maxclients` per subscriber; docs/pubsub.md has the measurements).
//! - Channels and patterns are subscribed on the home master (the owner of slot 0, as for
//!   keyless scripts): Redis Cluster delivers every PUBLISH to every node, so one node is
//!   enough. Keyspace notifications are published only on the node where the key lives,
//!   so a channel or pattern that can match `__keyspace@` or `__keyevent@` is subscribed on
//!   every master too, and from the other masters only those notifications are passed on
//!   (everything else arrives from the home master already).
//! - A shard channel is subscribed on the master owning its slot. When Redis takes the
//!   subscription away (`sunsubscribe` after a migration), or the master fails over, the
//!   hub subscribes it again on the slot's new owner by itself.
//!
//! A client's confirmation waits until the backend confirmed every channel it named that
//! was not live yet, so a message published after the client saw its confirmation reaches
//! it; for a channel live already, until a barrier (a PING on the link) passed, and only
//! then do its messages reach the client, so none published before its SUBSCRIBE does.
//! When the home master changes (a failover), the new home's messages are passed on only
//! after [`HOME_SETTLE`], so none arrives twice. The confirmation's counts are the client's own (a connection's subscriptions are
//! its [`Subscriptions`]). Messages are delivered at most once, as Redis does: while a
//! link reconnects, what is published meanwhile is not seen.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, info, warn};

use crate::mailbox::{Delivery, ReplyTx, Tag};
use crate::protocol::Request;
use crate::protocol::reply::Value;
use crate::upstream::cluster::{Cluster, NodePool, slot};
use crate::upstream::side::Side;

/// After the home master changed, how long messages from the new home (other than
/// notifications) are not passed on. Redis Cluster's bus may bring the new home a message
/// published on the old one just before the switch only after heatshield subscribed
/// there; that message reached the subscribers from the old home already, and would
/// arrive twice. Messages are delivered at most once: what is published in this window
/// is lost, as while a link reconnects.
const HOME_SETTLE: Duration = Duration::from_millis(200);

/// What a subscription names: a channel, a pattern, or a shard channel.
pub use crate::command::ChannelKind as Kind;

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Channel, Kind::Pattern, Kind::Shard];

    /// The verb of a confirmation: `subscribe`, `psubscribe`, `ssubscribe`.
    pub fn subscribed(self) -> &'static str {
        ["subscribe", "psubscribe", "ssubscribe"][self as usize]
    }

    /// The verb of an unsubscription: `unsubscribe`, `punsubscribe`, `sunsubscribe`.
    pub fn unsubscribed(self) -> &'static str {
        ["unsubscribe", "punsubscribe", "sunsubscribe"][self as usize]
    }

    fn command(self, sub: bool) -> &'static [u8] {
        match (self, sub) {
            (Kind::Channel, true) => b"SUBSCRIBE",
            (Kind::Pattern, true) => b"PSUBSCRIBE",
            (Kind::Shard, true) => b"SSUBSCRIBE",
            (Kind::Channel, false) => b"UNSUBSCRIBE",
            (Kind::Pattern, false) => b"PUNSUBSCRIBE",
            (Kind::Shard, false) => b"SUNSUBSCRIBE",
        }
    }
}

/// One connection's subscriptions.
#[derive(Debug, Default)]
pub struct Subscriptions {
    pub sets: [HashSet<Bytes>; 3],
}

impl Subscriptions {
    /// What a `subscribe`/`psubscribe` confirmation counts: channels and patterns.
    pub fn classic(&self) -> usize {
        self.sets[0].len() + self.sets[1].len()
    }

    /// What an `ssubscribe` confirmation counts: shard channels.
    pub fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Shard => self.sets[2].len(),
            _ => self.classic(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.sets.iter().all(|s| s.is_empty())
    }
}

/// Whether notifications published on one node only (keyspace and keyevent) can arrive
/// on `name`.
fn keyspace(kind: Kind, name: &[u8]) -> bool {
    match kind {
        Kind::Channel => is_notification(name),
        Kind::Pattern => may_start_with(name, b"__keyspace@") || may_start_with(name, b"__keyevent@"),
        Kind::Shard => false,
    }
}

fn is_notification(channel: &[u8]) -> bool {
    channel.starts_with(b"__keyspace@") || channel.starts_with(b"__keyevent@")
}

/// Whether some string that starts with `prefix` matches the glob `pat`.
fn may_start_with(pat: &[u8], prefix: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    while i < prefix.len() {
        match pat.get(p) {
            None => return false,
            Some(b'*') => return true,
            Some(b'?') => p += 1,
            Some(b'[') => {
                // a class: assume it can match (skip to its end)
                p += 1;
                while p < pat.len() && pat[p] != b']' {
                    p += if pat[p] == b'\\' { 2 } else { 1 };
                }
                p += 1;
            }
            Some(b'\\') => {
                if pat.get(p + 1) != Some(&prefix[i]) {
                    return false;
                }
                p += 2;
            }
            Some(&c) => {
                if c != prefix[i] {
                    return false;
                }
                p += 1;
            }
        }
        i += 1;
    }
    true
}

/// A subscriber's way back: its reply channel, and whether it speaks RESP3.
struct Subscriber {
    tx: ReplyTx,
    resp3: bool,
    /// Messages reach it (false until a barrier showed that Redis sent every message
    /// published before its SUBSCRIBE: see [`Hub::subscribe`]).
    ready: bool,
}

/// A change asked of a link.
#[derive(Debug)]
enum Op {
    Sub(Kind, Bytes),
    Unsub(Kind, Bytes),
    /// A PING for waiter `.0`: its reply comes after every message Redis sent before.
    Barrier(u64),
}

/// What a link sent and awaits the reply to, in order.
enum Sent {
    /// (P|S)SUBSCRIBE (`true`) or (P|S)UNSUBSCRIBE of a name.
    Sub(Kind, bool, Bytes),
    Barrier(u64),
}

/// A subscription connection to one master.
struct Link {
    pool: Arc<NodePool>,
    tx: mpsc::UnboundedSender<Op>,
    /// Taken by the manager when it starts the link's task.
    rx: Option<mpsc::UnboundedReceiver<Op>>,
    /// What this link is (being) subscribed to.
    has: HashSet<(Kind, Bytes)>,
    /// Unsubscriptions sent and not yet confirmed: until they are, Redis still counts the
    /// link as a subscriber (PUBLISH's and NUMSUB's corrections take that off).
    leaving: HashMap<(Kind, Bytes), u32>,
    /// Waiters whose barrier is out on this link, in order.
    barriers: Vec<u64>,
}

impl Link {
    fn new(pool: Arc<NodePool>) -> Link {
        let (tx, rx) = mpsc::unbounded_channel();
        Link { pool, tx, rx: Some(rx), has: HashSet::new(), leaving: HashMap::new(), barriers: Vec::new() }
    }

    fn barrier(&mut self, w: u64) {
        self.barriers.push(w);
        let _ = self.tx.send(Op::Barrier(w));
    }

    fn want(&mut self, kind: Kind, name: &Bytes) {
        if self.has.insert((kind, name.clone())) {
            let _ = self.tx.send(Op::Sub(kind, name.clone()));
        }
    }

    /// Whether Redis counts this link as subscribed to `(kind, name)` now (or soon).
    fn counts(&self, key: &(Kind, Bytes)) -> bool {
        self.has.contains(key) || self.leaving.contains_key(key)
    }

    fn drop_sub(&mut self, kind: Kind, name: &Bytes) {
        if self.has.remove(&(kind, name.clone())) {
            *self.leaving.entry((kind, name.clone())).or_default() += 1;
            let _ = self.tx.send(Op::Unsub(kind, name.clone()));
        }
    }
}

/// A client's confirmation, sent once the backend confirmed what it waits for.
struct Waiter {
    client: u64,
    tx: ReplyTx,
    tag: Tag,
    reply: Bytes,
    /// Confirmations and barriers still awaited.
    remaining: usize,
    kind: Kind,
    /// Names that were live already: the client gets their messages once it is done.
    live: Vec<Bytes>,
}

/// A name subscribed on links that have not all confirmed it yet.
#[derive(Default)]
struct Awaited {
    /// Links whose confirmation is still to come (a pattern that can see keyspace
    /// notifications is subscribed on every master: its subscribers wait for all of them,
    /// or a notification from a master that had not subscribed yet would be lost).
    links: usize,
    /// The waiters that go on once every link confirmed.
    waiters: Vec<u64>,
}

#[derive(Default)]
struct State {
    /// Per kind: name → subscribers by client id.
    subs: [HashMap<Bytes, HashMap<u64, Subscriber>>; 3],
    /// By node address.
    links: HashMap<Arc<str>, Link>,
    /// The master channels and patterns are subscribed on.
    home: Option<Arc<str>>,
    /// After the home moved (a failover): until this instant nothing but notifications is
    /// passed on from the new home (see [`HOME_SETTLE`]).
    settle_until: Option<std::time::Instant>,
    /// Backend confirmations awaited, by (kind, name).
    waiting: HashMap<(Kind, Bytes), Awaited>,
    waiters: HashMap<u64, Waiter>,
    next_waiter: u64,
    /// The topology version the links were last laid out for.
    laid_out: u64,
    /// Something moved (a shard channel lost, a link down): lay out again.
    dirty: bool,
}

impl State {
    /// The links that must carry `(kind, name)` under `topo`'s masters.
    fn targets(&self, cluster: &Cluster, kind: Kind, name: &[u8]) -> Vec<Arc<NodePool>> {
        let topo = cluster.topology();
        match kind {
            Kind::Shard => topo.master_for_slot(slot(name)).cloned().into_iter().collect(),
            _ if keyspace(kind, name) => topo.masters.clone(),
            _ => topo.master_for_slot(0).cloned().into_iter().collect(),
        }
    }

    fn link(&mut self, pool: &Arc<NodePool>) -> &mut Link {
        self.links.entry(pool.addr.clone()).or_insert_with(|| Link::new(pool.clone()))
    }

    /// Subscribes `(kind, name)` where it must be; returns on how many links a
    /// confirmation is awaited (0: live already).
    fn place(&mut self, cluster: &Cluster, kind: Kind, name: &Bytes) -> usize {
        let mut awaited = 0;
        for pool in self.targets(cluster, kind, name) {
            let link = self.link(&pool);
            if !link.has.contains(&(kind, name.clone())) {
                link.want(kind, name);
                awaited += 1;
            }
        }
        awaited
    }

    fn unplace(&mut self, kind: Kind, name: &Bytes) {
        for link in self.links.values_mut() {
            link.drop_sub(kind, name);
        }
    }

    /// One of what waiter `w` awaits is in; once all are, its client's subscriptions to
    /// names that were live take messages, and its confirmation goes out.
    fn step(&mut self, w: u64) {
        let Some(waiter) = self.waiters.get_mut(&w) else { return };
        waiter.remaining -= 1;
        if waiter.remaining > 0 {
            return;
        }
        let Some(waiter) = self.waiters.remove(&w) else { return };
        for name in &waiter.live {
            if let Some(s) = self.subs[waiter.kind as usize].get_mut(name).and_then(|m| m.get_mut(&waiter.client)) {
                s.ready = true;
            }
        }
        let _ = waiter.tx.send(Delivery::reply(waiter.tag, Ok(waiter.reply)));
    }

    /// The barriers out on a link that is gone or new: nothing sent before them will come
    /// on its connection.
    fn release_barriers(&mut self, barriers: Vec<u64>) {
        for w in barriers {
            self.step(w);
        }
    }
}

/// Metrics of the hub.
struct Meters {
    delivered: metrics::Counter,
    resubscribed: metrics::Counter,
}

/// The proxy's pub/sub state (see the module comment).
pub struct Hub {
    cluster: Arc<Cluster>,
    /// Subscriptions held now (client, name) and their bound (`limits.max_subscriptions`).
    held: std::sync::atomic::AtomicUsize,
    max: usize,
    state: Mutex<State>,
    wake: Notify,
    meters: Meters,
}

impl Hub {
    pub fn new(cluster: Arc<Cluster>, max: usize) -> Hub {
        Hub {
            cluster,
            held: Default::default(),
            max,
            state: Mutex::new(State { dirty: true, ..State::default() }),
            wake: Notify::new(),
            meters: Meters {
                delivered: metrics::counter!("heatshield_pubsub_messages_total"),
                resubscribed: metrics::counter!("heatshield_pubsub_resubscribes_total"),
            },
        }
    }

    /// Whether `n` more subscriptions fit under `limits.max_subscriptions` (the bound on
    /// the memory subscriptions hold); `Err` carries the limit.
    pub fn room(&self, n: usize) -> Result<(), usize> {
        if self.held.load(std::sync::atomic::Ordering::Relaxed) + n > self.max { Err(self.max) } else { Ok(()) }
    }

    /// Adds client `id` to `names`. `reply` (its confirmations) goes to `tx` tagged `tag`
    /// once the backend confirmed each name that was not live yet; returns it at once
    /// (`Some`) when all were live.
    #[allow(clippy::too_many_arguments)]
    pub fn subscribe(
        &self,
        id: u64,
        tx: &ReplyTx,
        resp3: bool,
        kind: Kind,
        names: &[Bytes],
        tag: Tag,
        reply: Bytes,
    ) -> Option<Bytes> {
        let mut st = self.state.lock();
        let mut awaited: Vec<Bytes> = Vec::new();
        // names live already (another client subscribes them): a message Redis sent before
        // this SUBSCRIBE may still be on its way; a barrier on each link they are on lets
        // the client have only what comes after it, as Redis would
        let mut live: Vec<Bytes> = Vec::new();
        let mut barrier_on: Vec<Arc<NodePool>> = Vec::new();
        for name in names {
            let clients = st.subs[kind as usize].entry(name.clone()).or_default();
            let new = !clients.contains_key(&id);
            if new {
                clients.insert(id, Subscriber { tx: tx.clone(), resp3, ready: true });
                self.held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let pending = st.waiting.contains_key(&(kind, name.clone()));
            let links = st.place(&self.cluster, kind, name);
            if links > 0 {
                st.waiting.entry((kind, name.clone())).or_default().links += links;
            }
            if links > 0 || pending {
                awaited.push(name.clone());
            } else if new {
                for pool in st.targets(&self.cluster, kind, name) {
                    if !barrier_on.iter().any(|p| Arc::ptr_eq(p, &pool)) {
                        barrier_on.push(pool);
                    }
                }
                if let Some(s) = st.subs[kind as usize].get_mut(name).and_then(|m| m.get_mut(&id)) {
                    s.ready = false;
                }
                live.push(name.clone());
            }
        }
        let new_links = st.links.values().any(|l| l.rx.is_some());
        if awaited.is_empty() && barrier_on.is_empty() {
            drop(st);
            if new_links {
                self.wake.notify_one();
            }
            return Some(reply);
        }
        let w = st.next_waiter;
        st.next_waiter += 1;
        for name in &awaited {
            st.waiting.entry((kind, name.clone())).or_default().waiters.push(w);
        }
        let remaining = awaited.len() + barrier_on.len();
        st.waiters.insert(w, Waiter { client: id, tx: tx.clone(), tag, reply, remaining, kind, live });
        for pool in &barrier_on {
            st.link(pool).barrier(w);
        }
        drop(st);
        if new_links {
            self.wake.notify_one();
        }
        None
    }

    /// Removes client `id` from `names`; a name nobody wants any more is unsubscribed on
    /// the backend.
    pub fn unsubscribe(&self, id: u64, kind: Kind, names: &[Bytes]) {
        let mut st = self.state.lock();
        for name in names {
            let map = &mut st.subs[kind as usize];
            let Some(clients) = map.get_mut(name) else { continue };
            if clients.remove(&id).is_some() {
                self.held.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
            if clients.is_empty() {
                map.remove(name);
                st.unplace(kind, name);
            }
        }
    }

    /// The client left: every subscription of `subs` ends, and its waiting confirmations
    /// are forgotten.
    pub fn gone(&self, id: u64, subs: &Subscriptions) {
        for kind in Kind::ALL {
            let names: Vec<Bytes> = subs.sets[kind as usize].iter().cloned().collect();
            self.unsubscribe(id, kind, &names);
        }
        let mut st = self.state.lock();
        st.waiters.retain(|_, w| w.client != id);
    }

    /// How many of this heatshield's clients a PUBLISH to `channel` reaches, minus the
    /// links Redis counts for it on the home master (what PUBLISH's reply must be
    /// corrected by to count clients, as one Redis would).
    pub fn publish_adjust(&self, channel: &[u8]) -> i64 {
        let home = self.cluster.topology().master_for_slot(0).map(|p| p.addr.clone());
        let st = self.state.lock();
        let home = home.and_then(|h| st.links.get(&h));
        let mut adjust = 0i64;
        if let Some(c) = st.subs[0].get(channel) {
            adjust += c.len() as i64;
        }
        // the link counts while it is subscribed, and until Redis confirmed it left (even
        // when no client of heatshield subscribes any more)
        if home.is_some_and(|l| l.counts(&(Kind::Channel, Bytes::copy_from_slice(channel)))) {
            adjust -= 1;
        }
        for (pat, c) in &st.subs[1] {
            if crate::glob::matches(pat, channel, false) {
                adjust += c.len() as i64;
                if home.is_some_and(|l| l.has.contains(&(Kind::Pattern, pat.clone()))) {
                    adjust -= 1;
                }
            }
        }
        if let Some(l) = home {
            for (kind, pat) in l.leaving.keys() {
                if *kind == Kind::Pattern
                    && !l.has.contains(&(Kind::Pattern, pat.clone()))
                    && crate::glob::matches(pat, channel, false)
                {
                    adjust -= 1;
                }
            }
        }
        adjust
    }

    /// For PUBSUB NUMSUB / SHARDNUMSUB summed over the masters: per channel, this
    /// heatshield's subscribers minus the links Redis counts.
    pub fn numsub_adjust(&self, kind: Kind, channels: &[&[u8]]) -> Vec<i64> {
        let st = self.state.lock();
        channels
            .iter()
            .map(|ch| {
                let key = (kind, Bytes::copy_from_slice(ch));
                let links = st.links.values().filter(|l| l.counts(&key)).count() as i64;
                st.subs[kind as usize].get(*ch).map_or(0, |c| c.len() as i64) - links
            })
            .collect()
    }

    /// For PUBSUB NUMPAT summed over the masters: the patterns subscribed on more than one
    /// master count once.
    pub fn numpat_adjust(&self) -> i64 {
        let st = self.state.lock();
        let mut per: HashMap<&Bytes, i64> = HashMap::new();
        for l in st.links.values() {
            for (k, name) in &l.has {
                if *k == Kind::Pattern {
                    *per.entry(name).or_default() += 1;
                }
            }
        }
        -per.values().map(|n| n - 1).sum::<i64>()
    }

    /// For SPUBLISH: this heatshield's subscribers of shard channel `channel`, minus its
    /// link Redis counts.
    pub fn spublish_adjust(&self, channel: &[u8]) -> i64 {
        self.numsub_adjust(Kind::Shard, &[channel])[0]
    }

    /// A backend confirmed `(kind, name)`: once every link it was asked of did,
    /// confirmations waiting only for it go out.
    fn confirmed(&self, kind: Kind, name: &[u8]) {
        let mut st = self.state.lock();
        let key = (kind, Bytes::copy_from_slice(name));
        let Some(a) = st.waiting.get_mut(&key) else { return };
        a.links = a.links.saturating_sub(1);
        if a.links > 0 {
            return;
        }
        let Some(a) = st.waiting.remove(&key) else { return };
        for w in a.waiters {
            st.step(w);
        }
    }

    /// The link to `addr` passed waiter `w`'s barrier.
    fn barrier_passed(&self, addr: &str, w: u64) {
        let mut st = self.state.lock();
        let Some(l) = st.links.get_mut(addr) else { return };
        let Some(i) = l.barriers.iter().position(|&b| b == w) else { return };
        l.barriers.remove(i);
        st.step(w);
    }

    /// A message from the link to `addr`: `kind` and `name` say whose subscribers get it,
    /// `channel` is the channel it was published on.
    fn deliver(&self, addr: &str, kind: Kind, name: &[u8], channel: &[u8], frame: Bytes) {
        let st = self.state.lock();
        match kind {
            // notifications come from every master, anything else from home only
            Kind::Channel | Kind::Pattern => {
                if !is_notification(channel)
                    && (st.home.as_deref() != Some(addr)
                        || st.settle_until.is_some_and(|t| std::time::Instant::now() < t))
                {
                    return;
                }
            }
            // from the link that holds it (two may, for a moment, around a migration)
            Kind::Shard => {
                if !st.links.get(addr).is_some_and(|l| l.has.contains(&(Kind::Shard, Bytes::copy_from_slice(name)))) {
                    return;
                }
            }
        }
        let Some(clients) = st.subs[kind as usize].get(name) else { return };
        let mut resp2: Option<Bytes> = None;
        let mut delivered = 0;
        for s in clients.values().filter(|s| s.ready) {
            delivered += 1;
            let bytes = if s.resp3 {
                frame.clone()
            } else {
                // the same elements as an array: `>` becomes `*`
                resp2
                    .get_or_insert_with(|| {
                        let mut b = BytesMut::with_capacity(frame.len());
                        b.put_u8(b'*');
                        b.extend_from_slice(&frame[1..]);
                        b.freeze()
                    })
                    .clone()
            };
            let _ = s.tx.send(Delivery::Push(bytes));
        }
        self.meters.delivered.increment(delivered);
    }

    /// Redis no longer serves shard channel `name` on `addr` (its slot moved, or it
    /// refused the subscription with MOVED): subscribe it again on the slot's owner.
    fn shard_lost(&self, addr: &str, name: &[u8]) {
        let mut st = self.state.lock();
        if let Some(l) = st.links.get_mut(addr) {
            l.has.remove(&(Kind::Shard, Bytes::copy_from_slice(name)));
        }
        st.dirty = true;
        drop(st);
        self.meters.resubscribed.increment(1);
        // placed again at the manager's next round, by then (usually) on a refreshed map:
        // placing it at once would ask the same node again
        self.cluster.request_refresh();
    }

    /// A link (re)connected: what it must subscribe.
    fn link_up(&self, addr: &str) -> Vec<(Kind, Bytes)> {
        let mut st = self.state.lock();
        let Some(l) = st.links.get_mut(addr) else { return Vec::new() };
        // a new connection: nothing is leaving it, and nothing came before its barriers
        l.leaving.clear();
        let subs = l.has.iter().cloned().collect();
        let barriers = std::mem::take(&mut l.barriers);
        st.release_barriers(barriers);
        subs
    }

    /// The link to `addr` confirmed an unsubscription of `(kind, name)`.
    fn left(&self, addr: &str, kind: Kind, name: &[u8]) {
        let mut st = self.state.lock();
        let Some(l) = st.links.get_mut(addr) else { return };
        let key = (kind, Bytes::copy_from_slice(name));
        if let Some(n) = l.leaving.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                l.leaving.remove(&key);
            }
        }
    }

    /// Lays the links out for the current topology: links to masters only, channels and
    /// patterns on the home master (and notifications' on every master), each shard
    /// channel on its slot's owner. Returns the links whose tasks must start.
    fn lay_out(&self) -> Vec<(Arc<NodePool>, mpsc::UnboundedReceiver<Op>)> {
        let topo = self.cluster.topology();
        let mut st = self.state.lock();
        if st.laid_out != topo.version || st.dirty {
            st.laid_out = topo.version;
            st.dirty = false;
            let home = topo.master_for_slot(0).map(|p| p.addr.clone());
            if st.home != home {
                info!(home = ?home, "pub/sub home master");
                if st.home.is_some() {
                    st.settle_until = Some(std::time::Instant::now() + HOME_SETTLE);
                }
                st.home = home;
            }
            // links to nodes that are no longer masters go (their tasks end)
            let masters: HashSet<Arc<str>> = topo.masters.iter().map(|m| m.addr.clone()).collect();
            let gone: Vec<Arc<str>> = st.links.keys().filter(|a| !masters.contains(*a)).cloned().collect();
            for addr in gone {
                if let Some(l) = st.links.remove(&addr) {
                    st.release_barriers(l.barriers);
                }
            }
            let mut want: HashMap<Arc<str>, HashSet<(Kind, Bytes)>> = HashMap::new();
            let mut pools: HashMap<Arc<str>, Arc<NodePool>> = HashMap::new();
            for kind in Kind::ALL {
                for name in st.subs[kind as usize].keys() {
                    for pool in st.targets(&self.cluster, kind, name) {
                        want.entry(pool.addr.clone()).or_default().insert((kind, name.clone()));
                        pools.entry(pool.addr.clone()).or_insert(pool);
                    }
                }
            }
            for (addr, subs) in &want {
                let link = st.link(&pools[addr]);
                for (kind, name) in subs {
                    link.want(*kind, name);
                }
            }
            for (addr, link) in st.links.iter_mut() {
                let stale: Vec<(Kind, Bytes)> =
                    link.has.iter().filter(|k| !want.get(addr).is_some_and(|w| w.contains(*k))).cloned().collect();
                for (kind, name) in stale {
                    link.drop_sub(kind, &name);
                }
            }
        }
        st.links.values_mut().filter_map(|l| Some((l.pool.clone(), l.rx.take()?))).collect()
    }
}

/// Starts the hub's manager on the current runtime (the control runtime): it lays the
/// links out when the topology changes and starts their tasks.
pub fn start(hub: Arc<Hub>) {
    tokio::spawn(async move {
        loop {
            for (pool, rx) in hub.lay_out() {
                tokio::spawn(link(hub.clone(), pool, rx));
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), hub.wake.notified()).await;
        }
    });
}

/// Keeps one link's connection up while the hub keeps the link.
async fn link(hub: Arc<Hub>, pool: Arc<NodePool>, mut rx: mpsc::UnboundedReceiver<Op>) {
    let mut side = Side::new(pool.addr.clone(), pool.options(), "pubsub").resp3();
    loop {
        match serve(&hub, &pool, &mut side, &mut rx).await {
            Ok(()) => break,
            Err(e) => warn!(node = %pool.addr, error = %e, "pub/sub connection lost; subscribing again"),
        }
        side.close();
        side.backoff.wait().await;
        if rx.is_closed() {
            break;
        }
    }
    debug!(node = %pool.addr, "pub/sub link ends");
}

fn encode(op: &Op, out: &mut BytesMut, fifo: &mut VecDeque<Sent>) {
    let (kind, sub, name) = match op {
        Op::Sub(k, n) => (*k, true, n),
        Op::Unsub(k, n) => (*k, false, n),
        Op::Barrier(w) => {
            out.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
            fifo.push_back(Sent::Barrier(*w));
            return;
        }
    };
    out.extend_from_slice(Request::from_args(&[kind.command(sub), &name[..]]).raw());
    fifo.push_back(Sent::Sub(kind, sub, name.clone()));
}

/// One connection's life: returns `Ok` when the hub dropped the link, an error when the
/// connection broke.
async fn serve(
    hub: &Hub,
    pool: &Arc<NodePool>,
    s: &mut Side,
    rx: &mut mpsc::UnboundedReceiver<Op>,
) -> std::io::Result<()> {
    s.open().await?;
    s.backoff.reset();
    // what was asked while down is in the link's set already
    while rx.try_recv().is_ok() {}
    let mut fifo: VecDeque<Sent> = VecDeque::new();
    let mut out = BytesMut::new();
    for (kind, name) in hub.link_up(&pool.addr) {
        encode(&Op::Sub(kind, name), &mut out, &mut fifo);
    }
    s.send(&out).await?;
    out.clear();
    debug!(node = %pool.addr, subscriptions = fifo.len(), "pub/sub connection up");
    loop {
        tokio::select! {
            op = rx.recv() => {
                let Some(op) = op else { return Ok(()) };
                encode(&op, &mut out, &mut fifo);
                while let Ok(op) = rx.try_recv() {
                    encode(&op, &mut out, &mut fifo);
                }
                s.send(&out).await?;
                out.clear();
            }
            frame = s.frame() => on_frame(hub, &pool.addr, frame?, &mut fifo),
        }
    }
}

/// One frame from a link: a message to fan out, or the reply to a command it sent.
fn on_frame(hub: &Hub, addr: &str, frame: Bytes, fifo: &mut VecDeque<Sent>) {
    let Ok((v, _)) = Value::parse(&frame) else { return };
    let items = match v {
        Value::Array(items) => items,
        Value::Error(e) => {
            // a subscription Redis refused (SSUBSCRIBE to a node that does not own the slot)
            if let Some(Sent::Sub(kind, true, name)) = fifo.pop_front() {
                warn!(node = addr, error = %String::from_utf8_lossy(e), "subscription refused; placing it again");
                if kind == Kind::Shard {
                    hub.shard_lost(addr, &name);
                }
            }
            return;
        }
        _ => {
            // a barrier's PONG
            if let Some(Sent::Barrier(w)) = fifo.pop_front() {
                hub.barrier_passed(addr, w);
            }
            return;
        }
    };
    let at = |i: usize| items.get(i).and_then(|x| x.as_bytes()).unwrap_or_default();
    let verb = at(0);
    match verb {
        b"message" => hub.deliver(addr, Kind::Channel, at(1), at(1), frame.clone()),
        b"pmessage" => hub.deliver(addr, Kind::Pattern, at(1), at(2), frame.clone()),
        b"smessage" => hub.deliver(addr, Kind::Shard, at(1), at(1), frame.clone()),
        b"subscribe" | b"psubscribe" | b"ssubscribe" => {
            fifo.pop_front();
            let kind = match verb {
                b"subscribe" => Kind::Channel,
                b"psubscribe" => Kind::Pattern,
                _ => Kind::Shard,
            };
            hub.confirmed(kind, at(1));
        }
        b"unsubscribe" | b"punsubscribe" => {
            fifo.pop_front();
            let kind = if verb == b"unsubscribe" { Kind::Channel } else { Kind::Pattern };
            hub.left(addr, kind, at(1));
        }
        b"sunsubscribe" => {
            if matches!(fifo.front(), Some(Sent::Sub(Kind::Shard, false, n)) if &n[..] == at(1)) {
                fifo.pop_front();
                hub.left(addr, Kind::Shard, at(1));
            } else {
                // not asked for: Redis no longer serves the channel here (its slot moved)
                info!(node = addr, channel = %String::from_utf8_lossy(at(1)), "shard channel moved; subscribing on its new owner");
                hub.shard_lost(addr, at(1));
            }
        }
        _ => {
            fifo.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_that_can_see_notifications() {
        for p in [&b"*"[..], b"__key*", b"__keyspace@0__:*", b"__keyevent@?__:del", b"_[_x]keyspace@*", b"?*"] {
            assert!(keyspace(Kind::Pattern, p), "{}", String::from_utf8_lossy(p));
        }
        for p in [&b"news.*"[..], b"__keyspac", b"_x*", b"__keyspace", b"h?llo"] {
            assert!(!keyspace(Kind::Pattern, p), "{}", String::from_utf8_lossy(p));
        }
        assert!(keyspace(Kind::Channel, b"__keyevent@0__:expired"));
        assert!(!keyspace(Kind::Channel, b"news"));
    }

    #[test]
    fn counts() {
        let mut s = Subscriptions::default();
        s.sets[0].insert(Bytes::from_static(b"a"));
        s.sets[1].insert(Bytes::from_static(b"p*"));
        s.sets[2].insert(Bytes::from_static(b"s"));
        assert_eq!(s.count(Kind::Channel), 2);
        assert_eq!(s.count(Kind::Pattern), 2);
        assert_eq!(s.count(Kind::Shard), 1);
    }
}
