//! A cache of decoded bytes bounded in bytes, shared by all readers.
//!
//! The bound covers every decoded buffer alive: cached, being decoded, or
//! evicted but still being copied into a reply. A decode first reserves its
//! size, evicting least recently used entries; when what is left is pinned
//! by readers it waits for them. Two readers of the same cold unit cause one
//! decode: the second waits for the first. A big unit can instead be
//! served while it is decoded ([`Cache::get_filling`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use lru::LruCache;

use super::filling::Filling;
use super::lock;
use super::stats::{Gauges, Stats};

/// (tensor index, unit index within the tensor)
pub type Key = (u32, u32);

/// Tracks the bytes of all live buffers, and keeps a few freed ones for
/// the next decode of the same size (still counted in `used`): a fresh
/// buffer is faulted in page by page, which took a quarter of the CPU of a
/// multi-frame read.
struct Meter {
    used: AtomicU64,
    peak: AtomicU64,
    lock: Mutex<()>,
    freed: Condvar,
    spare: Mutex<Vec<Vec<u8>>>,
    /// Most bytes kept in `spare`.
    spare_limit: u64,
}

/// Smallest buffer worth keeping for reuse.
const SPARE_MIN: usize = 64 << 10;

/// What a cached unit costs beyond its bytes (its LRU node, hash slot and
/// `Buf`), counted with them: a file of empty frames must not grow the
/// cache past its limit one uncounted entry at a time.
pub const ENTRY_COST: u64 = 256;

impl Meter {
    fn release(&self, n: u64) {
        self.used.fetch_sub(n, Relaxed);
        self.notify();
    }

    fn notify(&self) {
        let _g = lock(&self.lock);
        self.freed.notify_all();
    }

    /// Keeps `v`, counted as `counted` bytes, for reuse if there is room;
    /// else frees it.
    fn recycle(&self, mut v: Vec<u8>, counted: u64) {
        let cap = v.capacity() as u64;
        if cap == counted && v.capacity() >= SPARE_MIN {
            let mut spare = lock(&self.spare);
            let kept: u64 = spare.iter().map(|b| b.capacity() as u64).sum();
            if kept + cap <= self.spare_limit {
                v.clear();
                spare.push(v);
                drop(spare);
                // A waiting decode may take it, or free it to make room.
                self.notify();
                return;
            }
        }
        drop(v);
        self.release(counted);
    }

    /// A kept buffer of exactly `len` bytes of capacity, if any.
    fn take_spare(&self, len: u64) -> Option<Vec<u8>> {
        let mut spare = lock(&self.spare);
        let i = spare.iter().position(|b| b.capacity() as u64 == len)?;
        Some(spare.swap_remove(i))
    }

    /// Returns a buffer [`Meter::take_spare`] handed out (still counted).
    fn put_back(&self, v: Vec<u8>) {
        lock(&self.spare).push(v);
        self.notify();
    }

    /// Frees one kept buffer. False if none was kept.
    fn free_spare(&self) -> bool {
        let Some(v) = lock(&self.spare).pop() else {
            return false;
        };
        let cap = v.capacity() as u64;
        drop(v);
        self.used.fetch_sub(cap, Relaxed);
        true
    }
}

/// Decoded bytes, counted by the meter until dropped.
pub struct Buf {
    store: Store,
    meter: Arc<Meter>,
}

enum Store {
    Done(Vec<u8>),
    /// Still being written by a decoder; readers wait for their bytes.
    Filling(Filling),
}

impl Buf {
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Done(v) => v.len(),
            Store::Filling(f) => f.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes decoded so far: all of them unless still filling.
    pub fn ready(&self) -> &[u8] {
        match &self.store {
            Store::Done(v) => v,
            Store::Filling(f) => f.filled(),
        }
    }

    /// Bytes `[at, at+n)`, waiting for them if the unit is still filling.
    pub fn range(&self, at: usize, n: usize) -> Result<&[u8], String> {
        let end = at.saturating_add(n);
        let bytes = match &self.store {
            Store::Done(v) => v.as_slice(),
            Store::Filling(f) => f.wait(end)?,
        };
        bytes
            .get(at..end)
            .ok_or_else(|| format!("bytes {at}..{end} are past the unit's {}", self.len()))
    }

    /// The file holding every byte of a unit decoded into one (see
    /// [`Filling::complete_file`]), once every byte is published.
    pub fn complete_file(&self) -> Option<&std::fs::File> {
        self.filling().and_then(Filling::complete_file)
    }

    /// The buffer a decoder fills, for units made by [`Cache::get_filling`].
    pub fn filling(&self) -> Option<&Filling> {
        match &self.store {
            Store::Filling(f) => Some(f),
            Store::Done(_) => None,
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let counted = self.len() as u64;
        match std::mem::replace(&mut self.store, Store::Done(Vec::new())) {
            Store::Done(v) => {
                self.meter.recycle(v, counted);
                self.meter.release(ENTRY_COST);
            }
            Store::Filling(f) => {
                drop(f);
                self.meter.release(counted + ENTRY_COST);
            }
        }
    }
}

type Outcome = Result<Arc<Buf>, String>;

/// A claim whose decode has not ended: if the decoder unwinds, gives back
/// its reservation and fails the claim, so that readers waiting for it get
/// an error instead of waiting for ever, and the next one tries again.
struct Unsettled<'a> {
    cache: &'a Cache,
    key: Key,
    flight: &'a Flight,
    charge: u64,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        self.cache.meter.release(self.charge);
        let mut inner = lock(&self.cache.inner);
        inner.inflight.remove(&self.key);
        drop(inner);
        self.flight.finish(Err(
            "the decoder stopped without an answer (a bug)".to_string()
        ));
    }
}

enum Claim {
    Found(Outcome),
    /// The caller decodes; into this kept buffer if one had the right size.
    Mine(Arc<Flight>, Option<Vec<u8>>),
}

#[derive(Default)]
struct Flight {
    done: Mutex<Option<Outcome>>,
    cond: Condvar,
}

impl Flight {
    fn wait(&self) -> Outcome {
        let mut g = lock(&self.done);
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            g = self.cond.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
    fn finish(&self, r: Outcome) {
        *lock(&self.done) = Some(r);
        self.cond.notify_all();
    }
}

struct Inner {
    lru: LruCache<Key, Arc<Buf>>,
    inflight: HashMap<Key, Arc<Flight>>,
}

pub struct Cache {
    limit: u64,
    meter: Arc<Meter>,
    /// Bytes counted for the mount's lifetime by [`Cache::hold`].
    held: AtomicU64,
    /// Times a hold or a claim found no room and waited for some.
    room_waits: AtomicU64,
    inner: Mutex<Inner>,
    stats: Arc<Stats>,
}

impl Cache {
    pub fn new(limit: u64, stats: Arc<Stats>) -> Cache {
        Cache {
            limit,
            meter: Arc::new(Meter {
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                lock: Mutex::new(()),
                freed: Condvar::new(),
                spare: Mutex::new(Vec::new()),
                spare_limit: (limit / 8).min(64 << 20),
            }),
            held: AtomicU64::new(0),
            room_waits: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                inflight: HashMap::new(),
            }),
            stats,
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How many times a hold or a decode found everything in use and
    /// waited for room.
    pub fn room_waits(&self) -> u64 {
        self.room_waits.load(Relaxed)
    }

    /// Counts `n` bytes that live as long as the mount (the frame lists of
    /// tensors served frame by frame) against the limit, evicting cached
    /// units to make room, and waiting for room while all is in use. At
    /// most a quarter of the limit is held this way: false past that, and
    /// the caller does without.
    pub fn hold(&self, n: u64) -> bool {
        loop {
            let mut inner = lock(&self.inner);
            if self.held.load(Relaxed).saturating_add(n) > self.limit / 4 {
                return false;
            }
            if self.make_room(&mut inner, n) {
                self.held.fetch_add(n, Relaxed);
                return true;
            }
            // Everything left is in use: wait for a reader or a decode to
            // let go, as a decode's reservation does (a plan is made once).
            drop(inner);
            self.room_waits.fetch_add(1, Relaxed);
            let g = lock(&self.meter.lock);
            let _ = self.meter.freed.wait_timeout(g, Duration::from_millis(20));
        }
    }

    /// Gives back `n` bytes of [`Cache::hold`].
    pub fn unhold(&self, n: u64) {
        self.held.fetch_sub(n, Relaxed);
        self.meter.release(n);
    }

    /// The cached unit `key`, decoding it with `decode` if needed. `decode`
    /// gets an empty vector with room for `len` bytes and must fill exactly
    /// that. `len` must not exceed the limit.
    pub fn get(
        &self,
        key: Key,
        len: u64,
        decode: impl FnOnce(&mut Vec<u8>) -> Result<(), String>,
    ) -> Outcome {
        let (flight, kept) = match self.claim(key, len) {
            Claim::Found(outcome) => return outcome,
            Claim::Mine(flight, kept) => (flight, kept),
        };
        let unsettled = Unsettled {
            cache: self,
            key,
            flight: &flight,
            charge: len + ENTRY_COST,
        };
        let fresh = kept.is_none();
        let mut data = kept.unwrap_or_default();
        let outcome = match data.try_reserve_exact(len as usize) {
            Err(e) => Err(format!("cannot allocate {len} bytes: {e}")),
            Ok(()) => {
                if fresh {
                    prefault(&mut data);
                }
                Stats::add(&self.stats.decompressions, 1);
                match decode(&mut data) {
                    Ok(()) if data.len() as u64 == len => {
                        Stats::add(&self.stats.decompressed_bytes, len);
                        Ok(())
                    }
                    Ok(()) => Err(format!("decoded {} bytes, expected {len}", data.len())),
                    Err(e) => Err(e),
                }
            }
        };
        let outcome = match outcome {
            // The reservation now belongs to the buffer.
            Ok(()) => Ok(Arc::new(Buf {
                store: Store::Done(data),
                meter: self.meter.clone(),
            })),
            Err(e) => {
                drop(data);
                self.meter.release(len + ENTRY_COST);
                Err(e)
            }
        };
        std::mem::forget(unsettled);
        self.settle(key, &flight, outcome)
    }

    /// Like [`Cache::get`], but a unit not cached yet is returned at once,
    /// empty, after `start` has been handed it to fill (through
    /// [`Buf::filling`]) on whatever thread it likes; readers wait in
    /// [`Buf::range`] for the bytes they need. A filler that fails calls
    /// [`Cache::discard`] so the next reader tries again.
    /// `file` makes, once the unit is ours to decode, an unlinked file to
    /// decode it into instead of memory (see [`Filling::in_file`]), or
    /// says no.
    pub fn get_filling(
        &self,
        key: Key,
        len: u64,
        file: impl FnOnce() -> Option<std::fs::File>,
        start: impl FnOnce(Arc<Buf>),
    ) -> Outcome {
        let flight = match self.claim(key, len) {
            Claim::Found(outcome) => return outcome,
            // A kept buffer's bytes are counted already: they now count
            // for the mapping instead.
            Claim::Mine(flight, kept) => {
                drop(kept);
                flight
            }
        };
        // `file` runs a call on `--cache-dir`: if it unwinds, the readers
        // waiting on this claim get an error, not a wait for ever.
        let unsettled = Unsettled {
            cache: self,
            key,
            flight: &flight,
            charge: len + ENTRY_COST,
        };
        // A file that cannot be mapped (a filesystem without shared
        // mappings, no mapping left): memory, as without one.
        let made = match file().map(|f| Filling::in_file(f, len as usize)) {
            Some(Ok(f)) => Ok(f),
            Some(Err(e)) => {
                log::debug!("a {len}-byte unit is decoded into memory: cannot map its file: {e}");
                Filling::new(len as usize)
            }
            None => Filling::new(len as usize),
        };
        let outcome = match made {
            Ok(f) => {
                Stats::add(&self.stats.decompressions, 1);
                Ok(Arc::new(Buf {
                    store: Store::Filling(f),
                    meter: self.meter.clone(),
                }))
            }
            Err(e) => {
                self.meter.release(len + ENTRY_COST);
                Err(format!("cannot map {len} bytes for decoding: {e}"))
            }
        };
        std::mem::forget(unsettled);
        let outcome = self.settle(key, &flight, outcome);
        if let Ok(b) = &outcome {
            start(b.clone());
        }
        outcome
    }

    /// Drops `key`'s unit unless someone holds it: its bytes are kept
    /// elsewhere now. Its buffer is kept for the next decode of its size.
    pub fn drop_idle(&self, key: Key) {
        let mut inner = lock(&self.inner);
        if inner
            .lru
            .peek(&key)
            .is_some_and(|b| Arc::strong_count(b) == 1)
        {
            let gone = inner.lru.pop(&key);
            drop(inner);
            drop(gone);
        }
    }

    /// Drops `buf` from the cache if it is still the entry for `key`.
    pub fn discard(&self, key: Key, buf: &Arc<Buf>) {
        let mut inner = lock(&self.inner);
        if inner.lru.peek(&key).is_some_and(|b| Arc::ptr_eq(b, buf)) {
            inner.lru.pop(&key);
        }
    }

    /// Finds `key` (cached, or waits for the decode under way) or reserves
    /// `len` bytes for the caller to decode it.
    fn claim(&self, key: Key, len: u64) -> Claim {
        if len.saturating_add(ENTRY_COST) > self.limit {
            return Claim::Found(Err(format!(
                "unit of {len} bytes exceeds the cache limit of {} bytes",
                self.limit
            )));
        }
        loop {
            let mut inner = lock(&self.inner);
            if let Some(b) = inner.lru.get(&key) {
                Stats::add(&self.stats.cache_hits, 1);
                return Claim::Found(Ok(b.clone()));
            }
            if let Some(f) = inner.inflight.get(&key).cloned() {
                drop(inner);
                Stats::add(&self.stats.cache_hits, 1);
                return Claim::Found(f.wait());
            }
            if let Some(kept) = self.reserve(&mut inner, len) {
                let f = Arc::new(Flight::default());
                inner.inflight.insert(key, f.clone());
                Stats::add(&self.stats.cache_misses, 1);
                return Claim::Mine(f, kept);
            }
            // Everything left is pinned by readers or decodes: wait for one.
            drop(inner);
            self.room_waits.fetch_add(1, Relaxed);
            let g = lock(&self.meter.lock);
            let _ = self.meter.freed.wait_timeout(g, Duration::from_millis(20));
        }
    }

    /// Ends a claim: caches a good unit and wakes whoever waited for it.
    fn settle(&self, key: Key, flight: &Flight, outcome: Outcome) -> Outcome {
        let mut inner = lock(&self.inner);
        inner.inflight.remove(&key);
        if let Ok(b) = &outcome {
            inner.lru.put(key, b.clone());
        }
        drop(inner);
        flight.finish(outcome.clone());
        outcome
    }

    /// Reserves a unit of `len` bytes and its [`ENTRY_COST`], evicting as
    /// needed: `Some(Some(buffer))` when a kept buffer of that size (its
    /// bytes already counted) is handed over, `Some(None)` when all of it is
    /// newly counted, `None` if not possible now.
    fn reserve(&self, inner: &mut Inner, len: u64) -> Option<Option<Vec<u8>>> {
        loop {
            // An eviction may just have kept a buffer of this size.
            if let Some(v) = self.meter.take_spare(len) {
                // Taken out first, so that making room frees other kept
                // buffers, not this one.
                if self.make_room(inner, ENTRY_COST) {
                    return Some(Some(v));
                }
                self.meter.put_back(v);
                return None;
            }
            let used = self.meter.used.load(Relaxed);
            if used + len + ENTRY_COST <= self.limit {
                self.count(len + ENTRY_COST);
                return Some(None);
            }
            if !self.evict_one(inner) {
                return None;
            }
        }
    }

    /// Counts `n` more bytes, evicting as needed; false if not possible now.
    fn make_room(&self, inner: &mut Inner, n: u64) -> bool {
        loop {
            if self.meter.used.load(Relaxed).saturating_add(n) <= self.limit {
                self.count(n);
                return true;
            }
            if !self.evict_one(inner) {
                return false;
            }
        }
    }

    /// Adds to `used`. Only reservations add, and they hold `inner`, so
    /// what they checked still holds (releases only lower it).
    fn count(&self, n: u64) {
        let now = self.meter.used.fetch_add(n, Relaxed) + n;
        self.meter.peak.fetch_max(now, Relaxed);
    }

    /// Frees a kept buffer, or else drops the least recently used unit that
    /// nobody holds (freed now, or kept for reuse). A unit in use is passed
    /// over: dropping it would free nothing until its holders let go, and
    /// its next reader would decode it again, while a filling unit's decoder
    /// runs on to the end regardless (a review measured 137 decodes of
    /// three tensors read by six threads). False when nothing can go now.
    fn evict_one(&self, inner: &mut Inner) -> bool {
        if self.meter.free_spare() {
            return true;
        }
        let idle = inner
            .lru
            .iter()
            .rev()
            .find(|(_, b)| Arc::strong_count(b) == 1)
            .map(|(k, _)| *k);
        match idle.and_then(|k| inner.lru.pop(&k)) {
            Some(victim) => {
                Stats::add(&self.stats.evictions, 1);
                drop(victim);
                true
            }
            None => false,
        }
    }

    /// `key`'s unit if it is cached (done or filling), without counting
    /// that as a use.
    pub fn peek(&self, key: Key) -> Option<Arc<Buf>> {
        lock(&self.inner).lru.peek(&key).cloned()
    }

    /// Whether a read of `key`'s unit up to byte `end` would wait now: the
    /// unit is being decoded by another reader, or is still filling short
    /// of `end`.
    pub fn would_wait(&self, key: Key, end: usize) -> bool {
        let inner = lock(&self.inner);
        if inner.inflight.contains_key(&key) {
            return true;
        }
        let unit = inner.lru.peek(&key).cloned();
        drop(inner);
        unit.is_some_and(|b| b.filling().is_some_and(|f| f.would_wait(end)))
    }

    /// True if `key` is cached or being decoded.
    pub fn has(&self, key: Key) -> bool {
        let inner = lock(&self.inner);
        inner.lru.contains(&key) || inner.inflight.contains_key(&key)
    }

    pub fn gauges(&self) -> Gauges {
        let inner = lock(&self.inner);
        Gauges {
            cache_bytes: self.meter.used.load(Relaxed),
            cache_peak_bytes: self.meter.peak.load(Relaxed),
            cache_limit: self.limit,
            cache_entries: inner.lru.len() as u64,
            inflight_decodes: inner.inflight.len() as u64,
        }
    }
}

/// Faults a new buffer's pages in with one call before the decoder writes
/// them, instead of one trap per page as it goes: 5-8% off a multi-frame
/// first read, measured on the project's 2-core VM. Best effort (Linux
/// 5.14+).
fn prefault(v: &mut Vec<u8>) {
    if v.capacity() < SPARE_MIN {
        return;
    }
    let page = crate::source::page_size();
    let start = v.as_mut_ptr() as usize;
    let (from, to) = (
        (start + page - 1) & !(page - 1),
        (start + v.capacity()) & !(page - 1),
    );
    if from < to {
        // SAFETY: whole pages inside the vector's own allocation; faulting
        // them in for writing changes no byte of it.
        unsafe {
            libc::madvise(
                from as *mut libc::c_void,
                to - from,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn stays_within_limit_and_evicts_lru() {
        let limit = 100 + 2 * ENTRY_COST;
        let c = Cache::new(limit, Arc::default());
        for k in 0..10u32 {
            let b = c.get((0, k), 40, |d| {
                d.resize(40, k as u8);
                Ok(())
            });
            assert_eq!(b.unwrap().ready()[0], k as u8);
            assert!(c.gauges().cache_bytes <= limit);
        }
        assert_eq!(c.gauges().cache_entries, 2);
        assert!(c.gauges().cache_peak_bytes <= limit);
        assert!(c.get((0, 0), limit - ENTRY_COST + 1, |_| Ok(())).is_err());
    }

    #[test]
    fn a_decoder_that_panics_fails_its_waiters_and_gives_back_its_room() {
        let stats = Arc::new(Stats::default());
        let c = Arc::new(Cache::new(1 << 20, stats.clone()));
        let started = Arc::new(std::sync::Barrier::new(2));
        let (c2, s2) = (c.clone(), started.clone());
        let decoder = std::thread::spawn(move || {
            c2.get((0, 0), 1000, |_| {
                s2.wait();
                // Until the other reader has found the claim in flight (it
                // counts a hit, then waits for this decode's outcome).
                while stats.cache_hits.load(Relaxed) == 0 {
                    std::thread::yield_now();
                }
                panic!("decoder bug");
            })
        });
        started.wait();
        // Waits for the decode under way, then gets its failure.
        let waited = c.get((0, 0), 1000, |_| unreachable!("the claim is taken"));
        assert!(waited.is_err_and(|e| e.contains("bug")));
        assert!(decoder.join().is_err());
        assert_eq!(c.gauges().cache_bytes, 0);
        assert_eq!(c.gauges().inflight_decodes, 0);
        // The next reader decodes it.
        let b = c.get((0, 0), 1000, |d| {
            d.resize(1000, 5);
            Ok(())
        });
        assert_eq!(b.unwrap().ready()[999], 5);
    }

    #[test]
    fn a_unit_file_that_panics_fails_its_waiters_and_gives_back_its_room() {
        let stats = Arc::new(Stats::default());
        let c = Arc::new(Cache::new(1 << 20, stats.clone()));
        let started = Arc::new(std::sync::Barrier::new(2));
        let (c2, s2) = (c.clone(), started.clone());
        let filler = std::thread::spawn(move || {
            let file = || {
                s2.wait();
                while stats.cache_hits.load(Relaxed) == 0 {
                    std::thread::yield_now();
                }
                panic!("cache dir bug")
            };
            c2.get_filling((0, 0), 1000, file, |_| {})
        });
        started.wait();
        let waited = c.get_filling((0, 0), 1000, || unreachable!(), |_| unreachable!());
        assert!(waited.is_err_and(|e| e.contains("bug")));
        assert!(filler.join().is_err());
        assert_eq!(c.gauges().cache_bytes, 0);
        assert_eq!(c.gauges().inflight_decodes, 0);
    }

    #[test]
    fn empty_units_count_too() {
        // A file of empty frames: each unit costs its entry, so the cache
        // keeps as many as fit and evicts the rest.
        let limit = 10 * ENTRY_COST;
        let c = Cache::new(limit, Arc::default());
        for k in 0..10_000u32 {
            assert!(c.get((0, k), 0, |_| Ok(())).unwrap().is_empty());
        }
        let g = c.gauges();
        assert_eq!(g.cache_entries, 10);
        assert_eq!(g.cache_bytes, limit);
    }

    #[test]
    fn held_bytes_count_and_stop_at_a_quarter() {
        let c = Cache::new(4000 + 4 * ENTRY_COST, Arc::default());
        let fill = |d: &mut Vec<u8>| -> Result<(), String> {
            d.resize(1000, 3);
            Ok(())
        };
        for k in 0..4 {
            c.get((0, k), 1000, fill).unwrap();
        }
        assert_eq!(c.gauges().cache_entries, 4);
        // Holding evicts cached units to make room...
        assert!(c.hold(600));
        assert_eq!(c.gauges().cache_entries, 3);
        assert!(c.gauges().cache_bytes <= c.limit());
        // ...up to a quarter of the limit in all.
        assert!(!c.hold(c.limit() / 4 - 600 + 1));
        assert!(c.hold(c.limit() / 4 - 600));
        c.unhold(c.limit() / 4);
        assert_eq!(c.gauges().cache_bytes, 3 * (1000 + ENTRY_COST));
        // Units in use that fill the cache: a hold waits for one to go.
        let pinned: Vec<_> = (10..14)
            .map(|k| c.get((1, k), 1000, fill).unwrap())
            .collect();
        let c = Arc::new(c);
        let c2 = c.clone();
        let waits = c.room_waits();
        let holder = std::thread::spawn(move || c2.hold(500));
        // Until the holder has found no room and waits for some.
        while c.room_waits() == waits {
            std::thread::yield_now();
        }
        assert!(!holder.is_finished(), "held with no room");
        drop(pinned);
        assert!(holder.join().unwrap());
        assert!(c.gauges().cache_bytes <= c.limit());
    }

    #[test]
    fn concurrent_readers_decode_once() {
        let stats = Arc::new(Stats::default());
        let c = Arc::new(Cache::new(1 << 20, stats.clone()));
        let decodes = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (c, decodes, stats) = (c.clone(), decodes.clone(), stats.clone());
                std::thread::spawn(move || {
                    let b = c
                        .get((1, 1), 1000, |d| {
                            decodes.fetch_add(1, Relaxed);
                            // Until the seven others have found this decode
                            // in flight (or its result cached).
                            while stats.cache_hits.load(Relaxed) < 7 {
                                std::thread::yield_now();
                            }
                            d.resize(1000, 9);
                            Ok(())
                        })
                        .unwrap();
                    assert!(b.ready().iter().all(|&x| x == 9));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(decodes.load(Relaxed), 1);
    }

    #[test]
    fn filling_units_are_served_while_filled_and_a_failed_one_is_dropped() {
        let c = Arc::new(Cache::new(1 << 20, Arc::default()));
        let started = AtomicUsize::new(0);
        let fillers = Mutex::new(Vec::new());
        let get = |key| {
            c.get_filling(
                key,
                100_000,
                || None,
                |buf| {
                    started.fetch_add(1, Relaxed);
                    lock(&fillers).push(std::thread::spawn(move || {
                        let f = buf.filling().unwrap();
                        let mut w = f.writer().unwrap();
                        while w.written() < 50_000 {
                            let s = w.spare(1000);
                            s.fill(7);
                            let n = s.len();
                            w.commit(n);
                            std::thread::sleep(Duration::from_micros(100));
                        }
                        w.finish(Err("zstd data is corrupt".into()));
                    }));
                },
            )
        };
        let b = get((3, 0)).unwrap();
        // Counted in full from the start.
        assert_eq!(c.gauges().cache_bytes, 100_000 + ENTRY_COST);
        assert_eq!(b.range(40_000, 10_000).unwrap(), &[7u8; 10_000][..]);
        assert!(b.range(40_000, 20_000).unwrap_err().contains("corrupt"));
        // The same unit again, while cached: no second decoder.
        let again = get((3, 0)).unwrap();
        assert!(Arc::ptr_eq(&b, &again));
        assert_eq!(started.load(Relaxed), 1);
        // The filler's owner discards it: the next reader starts afresh.
        c.discard((3, 0), &b);
        drop((b, again));
        for f in lock(&fillers).drain(..) {
            f.join().unwrap();
        }
        assert_eq!(c.gauges().cache_bytes, 0);
        let b = get((3, 0)).unwrap();
        assert_eq!(started.load(Relaxed), 2);
        assert!(b.range(0, 100_000).is_err());
    }

    #[test]
    fn freed_buffers_are_reused_within_the_bound() {
        const U: u64 = 256 << 10;
        // Room for 16 units; keeps at most 512 KiB of freed buffers.
        let limit = 16 * (U + ENTRY_COST);
        let c = Cache::new(limit, Arc::default());
        let fill = |d: &mut Vec<u8>| -> Result<(), String> {
            assert!(d.is_empty() && d.capacity() >= U as usize);
            d.resize(U as usize, 1);
            Ok(())
        };
        let first = c.get((0, 0), U, fill).unwrap();
        let addr = first.ready().as_ptr() as usize;
        drop(first);
        // Filling the cache evicts the first unit; its buffer is kept and
        // handed to a later decode of the same size.
        let mut reused = 0;
        for k in 1..40 {
            let b = c.get((0, k), U, fill).unwrap();
            reused += usize::from(b.ready().as_ptr() as usize == addr);
            assert!(c.gauges().cache_bytes <= limit);
        }
        assert!(reused >= 1);
        assert_eq!(c.gauges().cache_entries, 16);
        // Another size: kept buffers are freed before cached data is evicted.
        let big = c.get((1, 0), 2 * U, |d| {
            d.resize(2 * U as usize, 2);
            Ok(())
        });
        assert_eq!(big.unwrap().ready().len(), 2 * U as usize);
        assert!(c.gauges().cache_bytes <= limit);
    }

    #[test]
    fn eviction_passes_over_units_in_use() {
        let limit = 100 + 2 * ENTRY_COST;
        let c = Cache::new(limit, Arc::default());
        let decodes = AtomicUsize::new(0);
        let fill = |n: usize| {
            let decodes = &decodes;
            move |d: &mut Vec<u8>| -> Result<(), String> {
                decodes.fetch_add(1, Relaxed);
                d.resize(n, 0);
                Ok(())
            }
        };
        let held = c.get((0, 0), 50, fill(50)).unwrap();
        drop(c.get((0, 1), 50, fill(50)).unwrap());
        // (0, 0) is the least recently used, but held: (0, 1) goes.
        drop(c.get((0, 2), 50, fill(50)).unwrap());
        assert_eq!(decodes.load(Relaxed), 3);
        let again = c.get((0, 0), 50, fill(50)).unwrap();
        assert_eq!(decodes.load(Relaxed), 3, "the unit in use was evicted");
        assert!(Arc::ptr_eq(&held, &again));
    }

    #[test]
    fn pinned_buffers_count_and_failed_decodes_release() {
        let limit = 100 + 2 * ENTRY_COST;
        let c = Cache::new(limit, Arc::default());
        let fill = |n: usize| {
            move |d: &mut Vec<u8>| -> Result<(), String> {
                d.resize(n, 0);
                Ok(())
            }
        };
        let held = c.get((0, 0), 60, fill(60)).unwrap();
        // Evicting the held entry does not free it: the next unit must wait,
        // so try one that fits beside it.
        let b = c.get((0, 1), 40, fill(40)).unwrap();
        assert_eq!(c.gauges().cache_bytes, limit);
        drop(b);
        assert!(c.get((0, 2), 30, |_| Err("bad".into())).is_err());
        assert!(c.gauges().cache_bytes <= limit);
        drop(held);
    }
}
