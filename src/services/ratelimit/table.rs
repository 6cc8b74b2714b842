//! The per-key budget table: an open-addressing table of 16-byte slots (a tag and a GCRA
//! timestamp) that the request path reads and charges without a lock.
//!
//! Why not a concurrent map: at high request rates over many keys, the cost of a check is
//! one cache miss into the table. A sharded map takes a lock before it can even start that
//! load, so misses for requests a client pipelined come one after another. Here a key's
//! home slot is a pure function of its hash, so the session can prefetch the home slots
//! of a whole batch of pipelined requests first ([`Budgets::prefetch`], prefetch
//! instructions through the `prefetch-index` crate), letting the CPU overlap their misses,
//! before any of them is checked.
//!
//! - A slot's tag is the key's hash with its rule's salt mixed into the high 32 bits, so
//!   the low bits (the home slot) are the key's alone; `EMPTY` and `TOMB` (a reclaimed
//!   slot) are reserved. Linear probing from the home slot, at most [`MAX_PROBE`] slots; a
//!   key that finds no room is reported as [`Update::Full`].
//! - Lookups and charges are lock-free (a compare-and-swap on the timestamp). Inserting,
//!   growing and reclaiming take `writer`, so two inserts of one key cannot both claim a
//!   slot.
//! - A budget whose timestamp is at or before the caller's now is full, which is what a
//!   key without one is: a new key takes the slot of a full budget in its chain first,
//!   and when the table is half full the full budgets are dropped before it grows. The
//!   table so holds the keys in debt now (a rule whose budgets refill between a key's
//!   requests keeps it at its first size, in the CPU's caches), not every key seen.
//! - The table starts at 1,024 slots and doubles while more than a quarter full after
//!   that, up to `2 × cap` slots rounded up to a power of two, so it stays as dense as the
//!   keys in debt (a sparse table spreads them over more cache lines and TLB entries). Growing and
//!   reclaiming first set a slot's timestamp to `DEAD`; a charge that meets `DEAD` goes
//!   through `writer` and retries on the current table, so no charge is lost.
//! - A tombstone becomes `EMPTY` again once the slot after it is empty (then no probe
//!   chain runs through it).
//! - Memory: 16 bytes a slot, at most 32 MB at the default cap of one million keys. The
//!   table does not shrink. A session keeps the table it last used
//!   ([`Budgets::cache`]) until its next request; outgrown tables kept so add up to at
//!   most one more table's size.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use zerocopy::FromZeros;

use std::sync::{Arc, Mutex};

const EMPTY: u64 = 0;
const TOMB: u64 = 1;
/// The timestamp of a slot being (or having been) reclaimed or moved to a bigger table.
const DEAD: u64 = u64::MAX;
/// How far from its home slot a key may be placed.
pub const MAX_PROBE: usize = 64;
const MIN_SLOTS: usize = 1024;

/// What [`Budgets::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// The budget was found or created; whether the change was applied.
    Applied(bool),
    /// The key has no budget and there is no room for one (cap reached, or its probe
    /// window is full).
    Full,
}

/// A key's tag under one rule: never `EMPTY` or `TOMB`, and with the hash's low 32 bits.
#[inline]
pub fn tag(hash: u64, salt: u64) -> u64 {
    let t = hash ^ (salt & !0xffff_ffff);
    if t <= TOMB { t | 1 << 63 } else { t }
}

/// One request's GCRA charge: the budget's next timestamp, or None when that would put it
/// more than `tolerance` past `now` (refused).
#[inline(always)]
pub fn gcra(now: u64, interval: u64, tolerance: u64) -> impl FnMut(u64) -> Option<u64> + Copy {
    move |tat: u64| {
        let next = tat.max(now) + interval;
        (next - now <= tolerance).then_some(next)
    }
}

/// One generation of the table. A caller holding one ([`Budgets::load`]) while the table
/// grows finds its charges meet `DEAD`, and they are redone on the current one.
pub struct KeyTable {
    /// Slot `i` is `words[2i]` (tag) and `words[2i + 1]` (timestamp).
    words: Box<[AtomicU64]>,
    mask: usize,
}

impl KeyTable {
    fn new(slots: usize) -> KeyTable {
        let words = <[AtomicU64]>::new_box_zeroed_with_elems(slots * 2).expect("rate-limit table allocation");
        KeyTable { words, mask: slots - 1 }
    }

    fn slots(&self) -> usize {
        self.mask + 1
    }

    #[inline]
    fn tag_at(&self, slot: usize) -> &AtomicU64 {
        &self.words[2 * slot]
    }

    #[inline]
    fn tat_at(&self, slot: usize) -> &AtomicU64 {
        &self.words[2 * slot + 1]
    }

    #[inline]
    fn find(&self, hash: u64, tag: u64) -> Option<usize> {
        let mut i = hash as usize & self.mask;
        for _ in 0..MAX_PROBE {
            match self.tag_at(i).load(Ordering::Acquire) {
                t if t == tag => return Some(i),
                EMPTY => return None,
                _ => i = (i + 1) & self.mask,
            }
        }
        None
    }

    /// The first free slot in the key's probe window.
    fn free_slot(&self, hash: u64) -> Option<usize> {
        let mut i = hash as usize & self.mask;
        for _ in 0..MAX_PROBE {
            let t = self.tag_at(i).load(Ordering::Relaxed);
            if t == EMPTY || t == TOMB {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// The first slot before the end of the key's chain whose budget is full at `now`.
    fn full_slot(&self, hash: u64, now: u64) -> Option<usize> {
        let mut i = hash as usize & self.mask;
        for _ in 0..MAX_PROBE {
            match self.tag_at(i).load(Ordering::Relaxed) {
                EMPTY => return None,
                TOMB => {}
                _ if self.tat_at(i).load(Ordering::Relaxed) <= now => return Some(i),
                _ => {}
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Stores a budget in a free slot. (The timestamp with `Release`: a charge that loads
    /// it then sees the new tag, not the slot's previous key's; see [`KeyTable::charge`].)
    fn put(&self, slot: usize, tag: u64, tat: u64) {
        self.tat_at(slot).store(tat, Ordering::Release);
        self.tag_at(slot).store(tag, Ordering::Release);
    }

    /// Applies `f` to slot `i`'s timestamp while the slot holds `tag`: whether it was
    /// applied, or None when the slot was moved, reclaimed or given to another key since
    /// the caller found it (a timestamp loaded after such a change comes with the new tag,
    /// and one loaded before it no longer matches the slot, so the compare-and-swap fails:
    /// timestamps only grow past the old key's).
    #[inline]
    fn charge(&self, i: usize, tag: u64, f: &mut impl FnMut(u64) -> Option<u64>) -> Option<bool> {
        let tat = self.tat_at(i);
        let mut v = tat.load(Ordering::Acquire);
        loop {
            if v == DEAD || self.tag_at(i).load(Ordering::Relaxed) != tag {
                return None;
            }
            let Some(new) = f(v) else { return Some(false) };
            match tat.compare_exchange_weak(v, new, Ordering::Release, Ordering::Acquire) {
                Ok(_) => return Some(true),
                Err(x) => v = x,
            }
        }
    }
}

/// A session's cache of the current [`KeyTable`] ([`Budgets::cache`]).
pub type TableCache = arc_swap::Cache<Arc<ArcSwap<KeyTable>>, Arc<KeyTable>>;

/// The budgets of every per-key rule.
pub struct Budgets {
    /// Shared with the sessions' caches of it ([`Budgets::cache`]).
    table: Arc<ArcSwap<KeyTable>>,
    /// The current table's address (changed with `writer` held), so an update that goes
    /// through `writer` uses the table it has when that is still the current one.
    current: std::sync::atomic::AtomicPtr<KeyTable>,
    /// Held to insert, grow and reclaim.
    writer: Mutex<()>,
    /// Keys with a budget: changed with `writer` held, read without.
    live: AtomicUsize,
    cap: usize,
    max_slots: usize,
    /// Where the next incremental reclaim pass starts (a slot index, counting down).
    sweep: AtomicUsize,
}

impl Budgets {
    /// A table for at most `cap` keys.
    pub fn new(cap: usize) -> Budgets {
        let max_slots = (cap.max(1) * 2).next_power_of_two().max(MIN_SLOTS);
        let first = Arc::new(KeyTable::new(MIN_SLOTS));
        Budgets {
            current: std::sync::atomic::AtomicPtr::new(Arc::as_ptr(&first).cast_mut()),
            table: Arc::new(ArcSwap::new(first)),
            writer: Mutex::new(()),
            live: AtomicUsize::new(0),
            cap,
            max_slots,
            sweep: AtomicUsize::new(0),
        }
    }

    /// The current table.
    #[inline]
    pub fn load(&self) -> arc_swap::Guard<Arc<KeyTable>> {
        self.table.load()
    }

    /// A session's cache of the current table: each look costs one pointer comparison
    /// instead of a full load. A cache holds the table it last saw until its next look,
    /// so idle sessions may keep outgrown tables alive; the table only grows by doubling,
    /// so all the outgrown ones together are at most the size of the current one.
    pub fn cache(&self) -> TableCache {
        arc_swap::Cache::new(self.table.clone())
    }

    /// Changes the count of keys with a budget. Called with `writer` held, so a load and a
    /// store (no locked instruction) do.
    #[inline]
    fn add_live(&self, by: isize) {
        self.live.store(self.live.load(Ordering::Relaxed).wrapping_add_signed(by), Ordering::Relaxed);
    }

    /// Keys with a budget.
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots in the table now.
    pub fn slots(&self) -> usize {
        self.table.load().slots()
    }

    /// Prefetches the home slots of these key hashes, all at once, to bring them into the
    /// cache ahead of their checks.
    #[inline]
    pub fn prefetch(t: &KeyTable, hashes: &[u64]) {
        // (0: a key no rule matches, not hashed)
        for &h in hashes.iter().filter(|&&h| h != 0) {
            prefetch_index::prefetch_index(&t.words, 2 * (h as usize & t.mask));
        }
    }

    /// The key's budget timestamp, if it has a budget (in `t`, a table from
    /// [`Budgets::load`]).
    pub fn get(t: &KeyTable, hash: u64, tag: u64) -> Option<u64> {
        let i = t.find(hash, tag)?;
        match t.tat_at(i).load(Ordering::Relaxed) {
            DEAD => None,
            v => Some(v),
        }
    }

    /// Applies `f` to the key's timestamp (0 for a key without a budget yet, which then
    /// gets one if `f` accepts and there is room), looking first in `t` (a table from
    /// [`Budgets::load`], possibly outgrown). `f` may run more than once.
    ///
    /// `now`: the caller's clock. A budget whose timestamp is at or before it is full, as
    /// a key without one is, so its slot may be given to a new key at once (before any
    /// empty slot, and before the table grows): the table holds the keys that are in debt
    /// now, not every key seen in the last `idle_reclaim_ms`, and stays as small (and as
    /// warm in the CPU's caches) as that.
    pub fn update(&self, t: &KeyTable, hash: u64, tag: u64, now: u64, mut f: impl FnMut(u64) -> Option<u64>) -> Update {
        // (None: moved, reclaimed or given to another key under us: redone below)
        if let Some(applied) = t.find(hash, tag).and_then(|i| t.charge(i, tag, &mut f)) {
            return Update::Applied(applied);
        }
        self.update_locked(t, hash, tag, now, f)
    }

    /// One request's GCRA charge of the key's budget (what most checks are: [`Budgets::update`]
    /// with `interval` and `tolerance`), its common case (the budget found and charged
    /// without a lock) inlined into the caller and the rest out of line.
    #[inline(always)]
    pub fn take(&self, t: &KeyTable, hash: u64, tag: u64, now: u64, interval: u64, tolerance: u64) -> Update {
        let mut f = gcra(now, interval, tolerance);
        if let Some(applied) = t.find(hash, tag).and_then(|i| t.charge(i, tag, &mut f)) {
            return Update::Applied(applied);
        }
        self.take_locked(t, hash, tag, now, interval, tolerance)
    }

    #[inline(never)]
    fn take_locked(&self, t: &KeyTable, hash: u64, tag: u64, now: u64, interval: u64, tolerance: u64) -> Update {
        self.update_locked(t, hash, tag, now, gcra(now, interval, tolerance))
    }

    /// [`Budgets::update`] past its lock-free look: with `writer` held.
    #[inline]
    fn update_locked(
        &self,
        t: &KeyTable,
        hash: u64,
        tag: u64,
        now: u64,
        mut f: impl FnMut(u64) -> Option<u64>,
    ) -> Update {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        // no slot is half-moved or half-reclaimed while `writer` is held
        let mut owned;
        let mut t = if std::ptr::eq(t, self.current.load(Ordering::Relaxed)) {
            t
        } else {
            owned = self.table.load_full();
            &*owned
        };
        if let Some(i) = t.find(hash, tag) {
            return Update::Applied(t.tat_at(i).fetch_update(Ordering::Release, Ordering::Acquire, &mut f).is_ok());
        }
        // the slot of a budget that is full again
        if let Some(i) = t.full_slot(hash, now) {
            let Some(new) = f(0) else { return Update::Applied(false) };
            let tat = t.tat_at(i);
            let v = tat.load(Ordering::Relaxed);
            // (a charge of the old key since the look keeps it: then a free slot below)
            if v <= now && tat.compare_exchange(v, DEAD, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                t.tag_at(i).store(tag, Ordering::Relaxed);
                tat.store(new, Ordering::Release);
                return Update::Applied(true);
            }
        }
        if self.live.load(Ordering::Relaxed) >= self.cap {
            return Update::Full;
        }
        if (self.live.load(Ordering::Relaxed) + 1) * 2 > t.slots() {
            // first drop the budgets that are full again; grow only if that leaves the
            // table more than a quarter full (so a purge's pass over the table is paid
            // for by a quarter of its slots' inserts)
            self.purge(t, now);
            if (self.live.load(Ordering::Relaxed) + 1) * 4 > t.slots() && t.slots() < self.max_slots {
                owned = self.grow(t, now);
                t = &*owned;
            }
        }
        let Some(i) = t.free_slot(hash) else { return Update::Full };
        let Some(new) = f(0) else { return Update::Applied(false) };
        t.put(i, tag, new);
        self.add_live(1);
        Update::Applied(true)
    }

    /// Moves every budget that is not full (timestamp after `now`) into a table twice the
    /// size and publishes it. Called with `writer` held.
    fn grow(&self, old: &KeyTable, now: u64) -> Arc<KeyTable> {
        let new = KeyTable::new(old.slots() * 2);
        for i in 0..old.slots() {
            let tag = old.tag_at(i).load(Ordering::Relaxed);
            if tag <= TOMB {
                continue;
            }
            // charges go on until the slot is marked; after that they wait for `writer`
            let tat = old.tat_at(i).swap(DEAD, Ordering::Relaxed);
            if tat <= now {
                self.add_live(-1); // full: as if it had no budget
            } else if let Some(j) = new.free_slot(tag) {
                new.put(j, tag, tat);
            } else {
                self.add_live(-1); // no room: the key starts afresh
            }
        }
        let new = Arc::new(new);
        self.current.store(Arc::as_ptr(&new).cast_mut(), Ordering::Relaxed);
        self.table.store(new.clone());
        new
    }

    /// Drops every budget of `t` (the current table) that is full at `now`, and the
    /// tombstones that end a chain. Called with `writer` held.
    fn purge(&self, t: &KeyTable, now: u64) {
        for i in (0..t.slots()).rev() {
            self.drop_if_full(t, i, now);
        }
    }

    /// Drops slot `i`'s budget if its timestamp is at or before `cutoff`, and clears a
    /// tombstone there that ends its chain. Called with `writer` held.
    #[inline]
    fn drop_if_full(&self, t: &KeyTable, i: usize, cutoff: u64) -> bool {
        let mut removed = false;
        if t.tag_at(i).load(Ordering::Relaxed) > TOMB {
            let tat = t.tat_at(i);
            let v = tat.load(Ordering::Relaxed);
            if v <= cutoff && tat.compare_exchange(v, DEAD, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                t.tag_at(i).store(TOMB, Ordering::Release);
                self.add_live(-1);
                removed = true;
            }
        }
        // a tombstone at the end of a chain ends the chain
        if t.tag_at(i).load(Ordering::Relaxed) == TOMB && t.tag_at((i + 1) & t.mask).load(Ordering::Relaxed) == EMPTY {
            t.tag_at(i).store(EMPTY, Ordering::Release);
        }
        removed
    }

    /// Drops budgets whose timestamp is at or before `cutoff`, visiting `slots` slots from
    /// where the previous call stopped (counting down, wrapping). Returns how many.
    pub fn reclaim(&self, cutoff: u64, slots: usize) -> usize {
        const CHUNK: usize = 4096;
        let mut left = slots;
        let mut removed = 0;
        while left > 0 {
            let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let t = self.table.load();
            let total = t.slots();
            left = left.min(total);
            let mut end = self.sweep.load(Ordering::Relaxed);
            if end == 0 || end > total {
                end = total;
            }
            let start = end.saturating_sub(CHUNK.min(left));
            for i in (start..end).rev() {
                removed += usize::from(self.drop_if_full(&t, i, cutoff));
            }
            self.sweep.store(start, Ordering::Relaxed);
            left -= end - start;
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(t: &Budgets, h: u64, v: u64) -> Update {
        upd(t, h, |_| Some(v))
    }

    fn upd(t: &Budgets, h: u64, f: impl FnMut(u64) -> Option<u64>) -> Update {
        t.update(&t.load(), h, tag(h, 0), 0, f)
    }

    fn get(t: &Budgets, h: u64, tag: u64) -> Option<u64> {
        Budgets::get(&t.load(), h, tag)
    }

    #[test]
    fn insert_find_charge() {
        let t = Budgets::new(10);
        assert_eq!(get(&t, 5, tag(5, 0)), None);
        assert_eq!(add(&t, 5, 100), Update::Applied(true));
        assert_eq!(get(&t, 5, tag(5, 0)), Some(100));
        // another rule's budget for the same key is separate
        assert_eq!(get(&t, 5, tag(5, 9 << 40)), None);
        assert_eq!(upd(&t, 5, |v| (v < 150).then_some(v + 10)), Update::Applied(true));
        assert_eq!(get(&t, 5, tag(5, 0)), Some(110));
        assert_eq!(upd(&t, 5, |_| None), Update::Applied(false));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn colliding_homes_probe_and_reclaim_keeps_chains() {
        let t = Budgets::new(10);
        let slots = t.slots() as u64;
        // three keys with one home slot
        let (a, b, c) = (7, 7 + slots, 7 + 2 * slots);
        for h in [a, b, c] {
            assert_eq!(add(&t, h, 10), Update::Applied(true));
        }
        upd(&t, c, |_| Some(1000));
        // reclaim the first two: c, behind them in the chain, must still be found
        assert_eq!(t.reclaim(500, usize::MAX), 2);
        assert_eq!(get(&t, a, tag(a, 0)), None);
        assert_eq!(get(&t, c, tag(c, 0)), Some(1000));
        assert_eq!(t.len(), 1);
        // a re-inserted key reuses a tombstone
        assert_eq!(add(&t, a, 20), Update::Applied(true));
        assert_eq!(get(&t, a, tag(a, 0)), Some(20));
        // once everything is reclaimed the tombstones are cleared
        assert_eq!(t.reclaim(5000, usize::MAX), 2);
        let tb = t.table.load();
        assert!((0..tb.slots()).all(|i| tb.tag_at(i).load(Ordering::Relaxed) == EMPTY));
    }

    #[test]
    fn cap_and_probe_window_are_respected() {
        let t = Budgets::new(3);
        for h in 0..3 {
            assert_eq!(add(&t, h, 1), Update::Applied(true));
        }
        assert_eq!(add(&t, 3, 1), Update::Full);
        // a full probe window
        let t = Budgets::new(1000);
        let slots = t.slots() as u64;
        for k in 0..MAX_PROBE as u64 {
            assert_eq!(add(&t, 1 + k * slots, 1), Update::Applied(true));
        }
        assert_eq!(add(&t, 1 + MAX_PROBE as u64 * slots, 1), Update::Full);
    }

    #[test]
    fn growing_keeps_every_budget_and_stops_at_twice_the_cap() {
        let t = Budgets::new(5000);
        let h = |k: u64| k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for k in 0..5000 {
            assert_eq!(add(&t, h(k), 100 + k), Update::Applied(true));
        }
        assert_eq!(t.slots(), 16384);
        for k in 0..5000 {
            assert_eq!(get(&t, h(k), tag(h(k), 0)), Some(100 + k));
        }
        assert_eq!(add(&t, h(5000), 1), Update::Full);
    }

    #[test]
    fn charges_racing_growth_and_reclaim_are_not_lost() {
        let t = Arc::new(Budgets::new(100_000));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // one thread adds keys (the table doubles several times), one reclaims budgets
        // with small timestamps (the added keys), while this one charges key 42
        let adder = {
            let t = t.clone();
            std::thread::spawn(move || {
                for k in 1000..9000u64 {
                    add(&t, k.wrapping_mul(0x9e37_79b9_7f4a_7c15), 1);
                }
            })
        };
        let reclaimer = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    t.reclaim(1, 1 << 20);
                    // let the others take `writer` too (the proxy reclaims once a second)
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            })
        };
        // charged through a table snapshot that is refreshed only now and then (a check
        // that loaded it just before the table grew is in that place, only briefly), so
        // charges also meet slots of outgrown tables
        let mut snap = t.load();
        for n in 0..50_000 {
            if n % 1000 == 0 {
                snap = t.load();
            }
            assert_eq!(t.update(&snap, 42, tag(42, 0), 0, |v| Some(v.max(10) + 1)), Update::Applied(true));
        }
        adder.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        reclaimer.join().unwrap();
        assert_eq!(get(&t, 42, tag(42, 0)), Some(50_010));
    }

    #[test]
    fn a_full_budget_gives_its_slot_to_a_new_key() {
        let t = Budgets::new(1000);
        let slots = t.slots() as u64;
        let (a, b) = (7, 7 + slots);
        assert_eq!(t.update(&t.load(), a, tag(a, 0), 0, |_| Some(100)), Update::Applied(true));
        // at 50, a is still in debt: b takes the next slot
        assert_eq!(t.update(&t.load(), b, tag(b, 0), 50, |_| Some(60)), Update::Applied(true));
        assert_eq!((get(&t, a, tag(a, 0)), get(&t, b, tag(b, 0)), t.len()), (Some(100), Some(60), 2));
        // at 80, b is full again: c takes its slot, a keeps its budget
        let c = 7 + 2 * slots;
        assert_eq!(t.update(&t.load(), c, tag(c, 0), 80, |_| Some(90)), Update::Applied(true));
        assert_eq!((get(&t, a, tag(a, 0)), get(&t, b, tag(b, 0)), get(&t, c, tag(c, 0))), (Some(100), None, Some(90)));
        assert_eq!(t.len(), 2);
        // a key refused while fresh takes nothing
        assert_eq!(t.update(&t.load(), b, tag(b, 0), 200, |_| None), Update::Applied(false));
        assert_eq!(get(&t, b, tag(b, 0)), None);
    }

    #[test]
    fn keys_whose_budgets_fill_again_keep_the_table_small() {
        let t = Budgets::new(1_000_000);
        let h = |k: u64| k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // 200,000 keys one after another, each full again before the next one comes
        for k in 0..200_000u64 {
            let now = 10 * k;
            assert_eq!(t.update(&t.load(), h(k), tag(h(k), 0), now, |v| Some(v.max(now) + 5)), Update::Applied(true));
        }
        assert_eq!(t.slots(), MIN_SLOTS, "{} keys in a table of {}", t.len(), t.slots());
        // keys that stay in debt still make it grow, and every one keeps its budget
        let now = 10 * 200_000;
        for k in 0..5000u64 {
            let k = 1_000_000 + k;
            assert_eq!(t.update(&t.load(), h(k), tag(h(k), 0), now, |_| Some(u64::MAX / 2)), Update::Applied(true));
        }
        assert!(t.slots() >= 10_000);
        for k in 0..5000u64 {
            let k = 1_000_000 + k;
            assert_eq!(get(&t, h(k), tag(h(k), 0)), Some(u64::MAX / 2));
        }
    }

    #[test]
    fn charges_racing_slots_given_to_new_keys_are_neither_lost_nor_misplaced() {
        let t = Arc::new(Budgets::new(100_000));
        const FAR: u64 = 1 << 60;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // one thread inserts keys whose budgets are full again at once, so they keep
        // taking each other's slots (in a table of 1,024 slots, many in key 42's chain)
        let adder = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut k = 1000u64;
                while !stop.load(Ordering::Relaxed) {
                    let h = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                    let now = k;
                    t.update(&t.load(), h, tag(h, 0), now, |v| {
                        assert!(v < FAR, "key {k} charged with key 42's budget {v}");
                        Some(v.max(now) + 1)
                    });
                    k += 1;
                }
            })
        };
        // key 42 is always in debt (far in the future): never given away, every charge kept
        let bad = std::sync::atomic::AtomicU64::new(0);
        for _ in 0..200_000 {
            t.update(&t.load(), 42, tag(42, 0), 0, |v| {
                if v != 0 && v < FAR {
                    bad.store(v, Ordering::Relaxed);
                }
                Some(v.max(FAR) + 1)
            });
        }
        stop.store(true, Ordering::Relaxed);
        adder.join().unwrap();
        assert_eq!(bad.load(Ordering::Relaxed), 0, "key 42 charged on another key's budget");
        assert_eq!(get(&t, 42, tag(42, 0)), Some(FAR + 200_000));
    }
}
