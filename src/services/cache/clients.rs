//! Client-side caching through the proxy (`CLIENT TRACKING`): which keys each tracking
//! client read, and the `invalidate` messages it is owed when they change.
//!
//! Changes are learned from Redis: once some client tracks, each master's invalidation
//! connection (the hot-key cache's, [`super::tracking`]) also turns on
//! `CLIENT TRACKING on BCAST` for itself, so Redis reports every key written on that
//! master, whoever wrote it (this heatshield, another, a direct client, expiry, eviction);
//! keys nobody here tracks cost one lookup ([`ClientSide::invalidate`]). A tracking
//! client's own writes through heatshield are also told to it as soon as Redis answered
//! them ([`ClientSide::wrote`]), right after that reply as Redis sends it: so a client
//! that was told its write succeeded never reads what it overwrote from its own cache,
//! however late Redis's report comes. A client may therefore hear of a key more often
//! than from Redis (once from each), never less, never later.
//!
//! A client's key is forgotten once it has been invalidated (it must read the key again to
//! be told again), as Redis does. The table is bounded (`limits.tracking_max_keys`, like
//! Redis's `tracking-table-max-keys`): past it, a key is invalidated for its clients to make
//! room. Whenever invalidations may have been lost (an invalidation connection broke, a
//! master changed, BCAST just came on for a master), every tracking client is told to
//! drop everything (`invalidate` with a null key list, as after FLUSHALL).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::sync::watch;

use crate::mailbox::{Delivery, ReplyTx};
use crate::protocol::request::{write_array_header, write_bulk};
use crate::services::colocate::Colocate;

/// How a client tracks (CLIENT TRACKING on ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrackingOptions {
    /// BCAST: told about every key matching a prefix (none: every key), read or not.
    pub bcast: bool,
    pub prefixes: Vec<Bytes>,
    /// Keys are tracked only after CLIENT CACHING yes (OPTIN) / unless after CLIENT
    /// CACHING no (OPTOUT).
    pub optin: bool,
    pub optout: bool,
    /// Not told about its own writes.
    pub noloop: bool,
    /// Client id its invalidations go to (0: itself).
    pub redirect: u64,
}

/// A client's tracking state, kept with the connection.
#[derive(Debug, Clone, Default)]
pub struct ClientTracking {
    pub mode: TrackingOptions,
    /// CLIENT CACHING yes / no for the next command.
    pub caching: Option<bool>,
}

impl ClientTracking {
    /// Whether the keys of a read sent now are tracked.
    pub fn tracks_reads(&self) -> bool {
        let m = &self.mode;
        !m.bcast && (!m.optin || self.caching == Some(true)) && (!m.optout || self.caching != Some(false))
    }
}

/// Where a client's invalidations go.
struct Client {
    /// Its own reply channel, or its redirect target's.
    tx: ReplyTx,
    /// The receiver speaks RESP3 (a push), else RESP2 (a message on `__redis__:invalidate`).
    resp3: bool,
    /// Whether there is anyone to tell.
    deliver: bool,
    /// The invalidations go to the client itself (no redirect).
    own: bool,
    /// It read keys since it was last told to drop everything (only such clients are).
    dirty: bool,
    noloop: bool,
    /// BCAST prefixes (`Some(empty)`: every key).
    bcast: Option<Vec<Bytes>>,
}

impl Client {
    fn send(&self, push: Bytes) {
        if self.deliver {
            let _ = self.tx.send(Delivery::Push(push));
        }
    }
}

#[derive(Default)]
struct Table {
    clients: HashMap<u64, Client>,
    keys: HashMap<Bytes, SmallVec<[u64; 2]>>,
    /// Entries in `keys` (client, key pairs).
    pairs: usize,
}

impl Table {
    /// Client `id` no longer tracks `key`; whether it did.
    fn untrack(&mut self, key: &[u8], id: u64) -> bool {
        let Some(ids) = self.keys.get_mut(key) else { return false };
        let Some(at) = ids.iter().position(|&i| i == id) else { return false };
        ids.swap_remove(at);
        if ids.is_empty() {
            self.keys.remove(key);
        }
        self.pairs -= 1;
        true
    }
}

/// The table of tracked keys (see the module comment).
pub struct ClientSide {
    table: Mutex<Table>,
    /// ClientTracking clients now: the request path looks here first, and does nothing more
    /// while it is 0.
    active: AtomicUsize,
    /// Some client has tracked since start: the invalidation connections turn BCAST on.
    wanted: watch::Sender<bool>,
    wanted_once: AtomicBool,
    max_keys: usize,
    /// Masters whose invalidation connection reports every key now (BCAST on).
    reporting: AtomicUsize,
    /// Colocation rules: a BCAST prefix is matched against a key's client name.
    names: Arc<Colocate>,
}

/// Whether `key` (a stored name) starts with one of BCAST's `prefixes` (none: every key),
/// under its own name or its client's (crate::services::colocate).
fn prefixed(prefixes: &[Bytes], key: &[u8], names: &Colocate) -> bool {
    if prefixes.is_empty() || prefixes.iter().any(|p| key.starts_with(p)) {
        return true;
    }
    let client = names.client_key(key);
    client.len() != key.len() && prefixes.iter().any(|p| client.starts_with(p))
}

impl ClientSide {
    pub fn new(max_keys: usize, names: Arc<Colocate>) -> ClientSide {
        ClientSide {
            names,
            table: Mutex::new(Table::default()),
            active: AtomicUsize::new(0),
            wanted: watch::Sender::new(false),
            wanted_once: AtomicBool::new(false),
            max_keys: max_keys.max(1),
            reporting: AtomicUsize::new(0),
        }
    }

    /// Whether any client tracks now.
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed) > 0
    }

    /// ClientTracking clients now (INFO's `tracking_clients`).
    pub fn clients(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Tracked keys now (INFO's `tracking_total_keys`).
    pub fn keys(&self) -> usize {
        self.table.lock().keys.len()
    }

    /// Changes to "client tracking is wanted" (the invalidation connections watch it).
    pub fn wanted(&self) -> watch::Receiver<bool> {
        self.wanted.subscribe()
    }

    /// Client `id` tracks now; its invalidations go to `tx` (RESP3 pushes if `resp3`), or
    /// nowhere (`deliver` false: a RESP2 client without a redirect, as Redis allows).
    pub fn enable(&self, id: u64, tx: ReplyTx, resp3: bool, deliver: bool, mode: &TrackingOptions) {
        let c = Client {
            tx,
            resp3,
            deliver,
            own: mode.redirect == 0,
            dirty: false,
            noloop: mode.noloop,
            bcast: mode.bcast.then(|| mode.prefixes.clone()),
        };
        if self.table.lock().clients.insert(id, c).is_none() {
            self.active.fetch_add(1, Ordering::Relaxed);
        }
        if !self.wanted_once.swap(true, Ordering::Relaxed) {
            self.wanted.send_replace(true);
        }
    }

    /// Masters whose invalidation connection reports every key written now.
    pub fn reporting(&self) -> usize {
        self.reporting.load(Ordering::SeqCst)
    }

    /// A master's invalidation connection turned BCAST on; the guard counts it off again
    /// when dropped (the connection ended).
    pub fn reporting_on(&self) -> Reporting<'_> {
        self.reporting.fetch_add(1, Ordering::SeqCst);
        Reporting(self)
    }

    /// Client `id` stopped tracking (or left); its keys are forgotten lazily.
    pub fn disable(&self, id: u64) {
        if self.table.lock().clients.remove(&id).is_some() {
            self.active.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Client `id` read `keys`: it is told when they change.
    pub fn read<'k>(&self, id: u64, keys: impl Iterator<Item = &'k [u8]>) {
        let mut t = self.table.lock();
        if let Some(c) = t.clients.get_mut(&id) {
            c.dirty = true;
        }
        for key in keys {
            let ids = t.keys.entry(Bytes::copy_from_slice(key)).or_default();
            if !ids.contains(&id) {
                ids.push(id);
                t.pairs += 1;
            }
        }
        if t.keys.len() <= self.max_keys {
            return;
        }
        // over the bound: make room by invalidating keys (any ones), as Redis does; their
        // clients are told as if the keys had changed (from now on they could, untold)
        let mut out: HashMap<u64, Vec<Bytes>> = HashMap::new();
        while t.keys.len() > self.max_keys {
            let Some(k) = t.keys.keys().next().cloned() else { break };
            let ids = t.keys.remove(&k).unwrap_or_default();
            t.pairs -= ids.len();
            for i in ids {
                out.entry(i).or_default().push(k.clone());
            }
        }
        for (i, keys) in out {
            if let Some(c) = t.clients.get(&i) {
                let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
                c.send(message(c.resp3, Some(&refs)));
            }
        }
    }

    /// ClientTracking client `writer` wrote `keys` through heatshield, and Redis answered: it is
    /// told now (right after that reply, as Redis tells it), unless NOLOOP, so reading its
    /// own cache next it never finds what it overwrote. Everyone else hears from Redis
    /// ([`ClientSide::invalidate`]), as with one Redis.
    /// Returns the notice when it goes to the writer's own connection: it is written
    /// right after the write's reply, before the replies to what the client sent next, as
    /// Redis writes it (a redirect target is sent its copy).
    pub fn wrote(&self, keys: &[&[u8]], writer: u64) -> Option<Bytes> {
        let mut t = self.table.lock();
        let (noloop, bcast) = t.clients.get(&writer).map(|c| (c.noloop, c.bcast.clone()))?;
        let mut mine: Vec<&[u8]> = Vec::new();
        for &key in keys {
            let tracked = t.untrack(key, writer);
            let prefixed = bcast.as_ref().is_some_and(|p| prefixed(p, key, &self.names));
            if (tracked || prefixed) && !noloop {
                mine.push(key);
            }
        }
        let c = t.clients.get(&writer)?;
        if mine.is_empty() || !c.deliver {
            return None;
        }
        let notice = message(c.resp3, Some(&mine));
        if c.own {
            return Some(notice);
        }
        c.send(notice);
        None
    }

    /// NOLOOP client `writer` is about to write `keys`: it stops tracking them now (as in
    /// Redis, which forgets a key its tracker wrote), so Redis's report of its own write
    /// does not reach it.
    pub fn forget(&self, keys: &[&[u8]], writer: u64) {
        let mut t = self.table.lock();
        for &key in keys {
            t.untrack(key, writer);
        }
    }

    /// Redis reported `keys` changed: every client that tracks one of them is told, once.
    pub fn invalidate(&self, keys: &[&[u8]]) {
        let mut out: HashMap<u64, Vec<&[u8]>> = HashMap::new();
        let mut t = self.table.lock();
        for &key in keys {
            if let Some(ids) = t.keys.remove(key) {
                t.pairs -= ids.len();
                for id in ids {
                    out.entry(id).or_default().push(key);
                }
            }
            for (id, c) in &t.clients {
                if let Some(prefixes) = &c.bcast
                    && prefixed(prefixes, key, &self.names)
                {
                    out.entry(*id).or_default().push(key);
                }
            }
        }
        for (id, keys) in out {
            let Some(c) = t.clients.get(&id) else { continue };
            c.send(message(c.resp3, Some(&keys)));
        }
    }

    /// Every tracking client that may have cached something (it read a key since it was
    /// last told, or it is in BCAST mode) drops everything: after FLUSHALL, or when
    /// invalidations may have been lost.
    pub fn flush_all(&self) {
        let mut t = self.table.lock();
        t.keys.clear();
        t.pairs = 0;
        for c in t.clients.values_mut() {
            if c.dirty || c.bcast.is_some() {
                c.send(message(c.resp3, None));
                c.dirty = false;
            }
        }
    }
}

/// One master reporting every key (see [`ClientSide::reporting_on`]).
pub struct Reporting<'a>(&'a ClientSide);

impl Drop for Reporting<'_> {
    fn drop(&mut self) {
        self.0.reporting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `invalidate [keys]` (`None`: a null list, everything) as Redis sends it: a RESP3 push,
/// or to a RESP2 redirect target a message on `__redis__:invalidate`.
pub fn message(resp3: bool, keys: Option<&[&[u8]]>) -> Bytes {
    let mut b = BytesMut::with_capacity(64);
    if resp3 {
        b.extend_from_slice(b">2\r\n$10\r\ninvalidate\r\n");
    } else {
        b.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n");
    }
    match keys {
        Some(keys) => {
            write_array_header(&mut b, keys.len());
            for k in keys {
                write_bulk(&mut b, k);
            }
        }
        None if resp3 => b.extend_from_slice(b"_\r\n"),
        None => b.extend_from_slice(b"*-1\r\n"),
    }
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_redis_bytes() {
        assert_eq!(&message(true, Some(&[b"foo"]))[..], b">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nfoo\r\n");
        assert_eq!(&message(true, None)[..], b">2\r\n$10\r\ninvalidate\r\n_\r\n");
        assert_eq!(
            &message(false, Some(&[b"k"]))[..],
            b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n$1\r\nk\r\n"
        );
    }

    #[test]
    fn a_key_is_told_once_and_forgotten() {
        let cs = ClientSide::new(100, Arc::default());
        let (tx, mut rx) = crate::mailbox::reply_channel();
        cs.enable(7, tx, true, true, &TrackingOptions::default());
        cs.read(7, [&b"a"[..], b"b"].into_iter());
        cs.invalidate(&[b"a"]);
        let Some(Delivery::Push(told)) = rx.try_recv() else { panic!("an invalidation push") };
        assert_eq!(&told[..], &message(true, Some(&[b"a"]))[..]);
        cs.invalidate(&[b"a"]);
        assert!(rx.try_recv().is_none(), "told once");
        assert_eq!(cs.keys(), 1);
    }
}
