//! Which pages of the source files' mappings the daemon keeps mapped while
//! it serves raw tensors. A raw reply is written to the kernel straight
//! from a mapping, so its pages are mapped (page faults) before they are
//! sent, and must be let go of (a page-table walk and a TLB flush) once
//! readers are past them, or the daemon's RSS would grow to the size of
//! the files.
//!
//! On the thread that serves the reply, both cost a third of a raw
//! sequential read on the project's 2-core VM (a profile), so both happen on a
//! thread of the pool's own: the next chunks ahead of a streaming reader
//! are faulted in before it asks for them, and the least recently served
//! chunks past a fixed budget are let go of (their pages stay in the page
//! cache; a later read maps them again).
//!
//! One [`MapPool`] serves every source file of a mount (each a
//! [`MapWindow`]): one budget and one helper thread however many shards a
//! set has, so a set of 160 shards read through keeps what one file does
//! mapped, not 160 times that.
//!
//! What is mapped never escapes the count, whatever the timing: a reply's
//! chunks are counted after it was sent (so a chunk let go of while the
//! reply was being written, and mapped again by it, is counted again), and
//! the helper checks after faulting chunks in that they are still counted
//! (and lets go of those that are not). So jobs may run in any order, and
//! nothing ever waits for the helper.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::AcqRel, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};

use lru::LruCache;

use crate::source::MappedFile;

/// The unit of accounting: mapped pages are counted (and let go of) per
/// 2 MiB of address space, aligned as page tables are: a page fault maps
/// its neighbours too ("fault-around"), but never across such a boundary
/// nor outside its own mapping, so no page is mapped outside the chunks
/// that were counted.
pub const CHUNK: usize = 2 << 20;
/// Default budget: at most this much of a mount's mappings is counted as
/// mapped for raw replies; the helper may still be letting go of one batch
/// past it (a quarter of it); what replies in flight map is counted once
/// sent.
pub const BUDGET: usize = 32 << 20;
/// How far ahead of a streaming reader the helper faults pages in, and
/// how many chunks one reply may ask for (a reader moves half a chunk per
/// 1 MiB reply, so the window catches up). 2 to 8 MiB ahead did equally
/// well on the project's VM, 16 MiB worse; less ahead leaves room in the
/// budget for more readers at once.
const AHEAD: usize = 4 << 20;
const AHEAD_PER_REPLY: usize = 2;
/// A reply this long counts as streaming (the kernel's own readahead asks
/// for 128 KiB at a time); the data layer reads shorter ones with `pread`,
/// not through the mapping.
pub const STREAMING: usize = 128 << 10;
/// Jobs waiting for the helper. Past that, hints are dropped and the
/// serving thread lets go itself.
const QUEUE: usize = 8;

/// What a window does to its mapping: a source file's, or a test's record.
pub trait Pages: Send + Sync + 'static {
    /// Address and length of the mapping.
    fn map_base(&self) -> usize;
    fn map_len(&self) -> usize;
    /// Faults in `len` bytes at `off`; false if this kernel cannot (the
    /// helper then stops asking).
    fn populate(&self, off: usize, len: usize) -> bool;
    /// Unmaps `len` bytes at `off` (the data stays in the page cache).
    fn release(&self, off: usize, len: usize);
}

impl Pages for MappedFile {
    fn map_base(&self) -> usize {
        self.bytes().as_ptr() as usize
    }

    fn map_len(&self) -> usize {
        self.bytes().len()
    }

    fn populate(&self, off: usize, len: usize) -> bool {
        match MappedFile::populate(self, off, len) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
            // A file cut short is the guard's to report; the reply faults.
            _ => true,
        }
    }

    fn release(&self, off: usize, len: usize) {
        let end = off.saturating_add(len).min(self.bytes().len());
        if off < end {
            MappedFile::release(self, &self.bytes()[off..end]);
        }
    }
}

/// A chunk as counted: its number (by address) and the base address of
/// the mapping it was mapped in. Two mappings may share a chunk of address
/// space (one ends and the next begins inside it); each counts its own
/// part, and letting go of one leaves the other's pages alone.
type Key = (usize, usize);

enum Job<P> {
    /// Fault in offsets `.3..4` of the mapping, which lie in chunks
    /// `.1..=.2`.
    Populate(Arc<P>, usize, usize, usize, usize),
    /// Let go of these chunks.
    Release(Vec<(Key, Arc<P>)>),
}

/// What the pool and its helper share.
struct Shared<P: Pages> {
    /// Chunks counted as mapped, least recently served first, with the
    /// mapping each is in (held until the chunk is let go of).
    counted: Mutex<LruCache<Key, Arc<P>>>,
    /// Jobs sent and not yet done (for tests to wait on).
    pending: AtomicUsize,
    /// A release batch is queued or being done.
    releasing: AtomicBool,
    /// Cleared if this kernel cannot fault pages in ahead (before 5.14):
    /// then nothing is asked for, nor counted ahead.
    can_populate: AtomicBool,
}

impl<P: Pages> Shared<P> {
    fn counted(&self) -> MutexGuard<'_, LruCache<Key, Arc<P>>> {
        self.counted.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release_all(&self, gone: Vec<(Key, Arc<P>)>) {
        for ((c, _), pages) in gone {
            release(&*pages, c);
        }
    }
}

/// Lets go of chunk `c`: the part of `pages`' mapping inside it.
fn release<P: Pages>(pages: &P, c: usize) {
    let base = pages.map_base();
    let from = (c * CHUNK).max(base);
    let to = ((c + 1) * CHUNK).min(base + pages.map_len());
    if from < to {
        pages.release(from - base, to - from);
    }
}

/// Chunks a copy read, noted piece by piece.
#[derive(Default)]
pub struct Touched(Vec<usize>);

/// The budget and helper thread the windows of one mount share.
pub struct MapPool<P: Pages> {
    shared: Arc<Shared<P>>,
    /// In chunks: past `budget`, the least recently served are let go of
    /// down to `low` at once (a job per 8 MiB streamed, not one per reply).
    budget: usize,
    low: usize,
    jobs: SyncSender<Job<P>>,
}

impl<P: Pages> MapPool<P> {
    /// A pool of at most `budget` bytes (rounded up to whole chunks) with
    /// its helper thread, which ends when the pool and its windows are
    /// dropped.
    pub fn new(budget: usize) -> Arc<MapPool<P>> {
        let (jobs, rx) = sync_channel(QUEUE);
        let shared = Arc::new(Shared {
            counted: Mutex::new(LruCache::unbounded()),
            pending: AtomicUsize::new(0),
            releasing: AtomicBool::new(false),
            can_populate: AtomicBool::new(true),
        });
        let s = shared.clone();
        // Without a helper every send fails: hints are dropped, chunks are
        // let go of on the serving thread.
        if let Err(e) = std::thread::Builder::new()
            .name("zt-map".into())
            .spawn(move || helper(&s, rx))
        {
            log::warn!(
                "cannot start the mapping helper thread ({e}); replies fault their own pages"
            );
        }
        let budget = budget.div_ceil(CHUNK).max(2);
        Arc::new(MapPool {
            shared,
            budget,
            low: budget * 3 / 4,
            jobs,
        })
    }

    /// The window of one mapping, counted in this pool.
    pub fn window(self: &Arc<Self>, pages: Arc<P>) -> MapWindow<P> {
        MapWindow {
            pool: self.clone(),
            base: pages.map_base(),
            pages,
        }
    }

    /// Past the budget, takes the least recently served chunks out of the
    /// count and hands them to the helper; returns those the caller must
    /// let go of itself.
    #[must_use]
    fn make_room(&self, counted: &mut LruCache<Key, Arc<P>>) -> Vec<(Key, Arc<P>)> {
        if counted.len() <= self.budget {
            return Vec::new();
        }
        let mut gone = Vec::with_capacity(counted.len() - self.low);
        while counted.len() > self.low {
            match counted.pop_lru() {
                Some(c) => gone.push(c),
                None => break,
            }
        }
        // One batch at a time is the helper's; past that the caller lets
        // go itself, so what waits to be let go of stays under a budget.
        if self.shared.releasing.swap(true, Relaxed) {
            return gone;
        }
        match self.send(Job::Release(gone)) {
            Ok(()) => Vec::new(),
            Err(e) => {
                self.shared.releasing.store(false, Relaxed);
                let (TrySendError::Full(job) | TrySendError::Disconnected(job)) = e;
                match job {
                    Job::Release(gone) => gone,
                    Job::Populate(..) => Vec::new(),
                }
            }
        }
    }

    fn send(&self, job: Job<P>) -> Result<(), TrySendError<Job<P>>> {
        self.shared.pending.fetch_add(1, AcqRel);
        let r = self.jobs.try_send(job);
        if r.is_err() {
            self.shared.pending.fetch_sub(1, AcqRel);
        }
        r
    }

    /// Chunks counted as mapped now, in every window.
    pub fn chunks(&self) -> usize {
        self.shared.counted().len()
    }
}

/// What of one mapping replies keep mapped, counted in its pool.
pub struct MapWindow<P: Pages> {
    pool: Arc<MapPool<P>>,
    pages: Arc<P>,
    base: usize,
}

impl<P: Pages> MapWindow<P> {
    /// A window of its own pool of at most `budget` bytes.
    #[cfg(test)]
    pub fn new(pages: Arc<P>, budget: usize) -> MapWindow<P> {
        MapPool::new(budget).window(pages)
    }

    fn key(&self, c: usize) -> Key {
        (c, self.base)
    }

    /// Before a reply of `len` bytes at `off` of the mapping: if it
    /// streams (is long, and starts in a chunk read or asked for already),
    /// asks for the next chunks of its tensor (which ends at `limit`) to be
    /// faulted in.
    pub fn ahead(&self, off: usize, len: usize, limit: usize) {
        let pool = &self.pool;
        let limit = self.base + limit.min(self.pages.map_len());
        let (start, end) = (self.base + off, (self.base + off).saturating_add(len));
        if len < STREAMING || end >= limit || !pool.shared.can_populate.load(Relaxed) {
            return;
        }
        let to = end.saturating_add(AHEAD).next_multiple_of(CHUNK).min(limit);
        let counted = pool.shared.counted();
        // Long random reads are not streams: their pages are not asked for.
        if !counted.contains(&self.key(start / CHUNK)) {
            return;
        }
        // Chunks counted are mapped, or were asked for already.
        let Some(first) =
            (end / CHUNK..=(to - 1) / CHUNK).find(|&c| !counted.contains(&self.key(c)))
        else {
            return;
        };
        let last = ((to - 1) / CHUNK).min(first + AHEAD_PER_REPLY - 1);
        let from = end.max(first * CHUNK) - self.base;
        let to = to.min((last + 1) * CHUNK) - self.base;
        let job = Job::Populate(self.pages.clone(), first, last, from, to);
        if pool.send(job).is_ok() {
            self.count(counted, first..=last);
        }
    }

    /// After `len` bytes at `off` were read through the mapping (a reply
    /// sent, a copy made): counts their chunks, and lets go of the least
    /// recently served past the budget.
    pub fn served(&self, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        let at = self.base + off;
        self.count(
            self.pool.shared.counted(),
            at / CHUNK..=(at + len - 1) / CHUNK,
        );
    }

    /// Notes that a copy read `len` bytes at `off` of the mapping; the
    /// copy then hands `touched` to [`MapWindow::served_touched`]. For
    /// copies made of many small pieces (sparse records): a lock per piece
    /// would cost more than the piece.
    pub fn touch(&self, touched: &mut Touched, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        let at = self.base + off;
        for c in at / CHUNK..=(at + len - 1) / CHUNK {
            // Pieces alternate between a few runs of the file.
            if !touched.0.iter().rev().take(8).any(|&x| x == c) {
                touched.0.push(c);
            }
        }
    }

    /// Counts the chunks a copy read (see [`MapWindow::touch`]).
    pub fn served_touched(&self, mut touched: Touched) {
        if touched.0.is_empty() {
            return;
        }
        touched.0.sort_unstable();
        touched.0.dedup();
        self.count(self.pool.shared.counted(), touched.0);
    }

    /// [`MapWindow::served`] of a slice of the mapping.
    pub fn served_bytes(&self, bytes: &[u8]) {
        let at = bytes.as_ptr() as usize;
        if at >= self.base {
            self.served(at - self.base, bytes.len());
        }
    }

    /// Counts `chunks` as the most recently used (under `counted`, the
    /// lock), then makes room past the budget; what the helper cannot take
    /// is let go of here, once the lock is let go.
    fn count(
        &self,
        mut counted: MutexGuard<'_, LruCache<Key, Arc<P>>>,
        chunks: impl IntoIterator<Item = usize>,
    ) {
        for c in chunks {
            // An update keeps the mapping already held: no reference count
            // touched for a chunk served again.
            if counted.get(&self.key(c)).is_none() {
                counted.push(self.key(c), self.pages.clone());
            }
        }
        let gone = self.pool.make_room(&mut counted);
        drop(counted);
        self.pool.shared.release_all(gone);
    }

    /// Chunks counted as mapped now, in every window of its pool.
    pub fn chunks(&self) -> usize {
        self.pool.chunks()
    }
}

fn helper<P: Pages>(shared: &Shared<P>, jobs: Receiver<Job<P>>) {
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Populate(pages, first, last, from, to) => {
                if !pages.populate(from, to - from) {
                    shared.can_populate.store(false, Relaxed);
                }
                // Let go of what was no longer counted by the time it was
                // mapped: nothing mapped escapes the count.
                let base = pages.map_base();
                let gone: Vec<usize> = {
                    let counted = shared.counted();
                    (first..=last)
                        .filter(|&c| !counted.contains(&(c, base)))
                        .collect()
                };
                for c in gone {
                    release(&*pages, c);
                }
            }
            Job::Release(gone) => {
                shared.release_all(gone);
                shared.releasing.store(false, Relaxed);
            }
        }
        shared.pending.fetch_sub(1, AcqRel);
    }
}

#[cfg(test)]
impl<P: Pages> MapWindow<P> {
    /// The chunks counted for this window's mapping.
    fn counted_set(&self) -> std::collections::BTreeSet<usize> {
        let counted = self.pool.shared.counted();
        counted
            .iter()
            .filter(|((_, base), _)| *base == self.base)
            .map(|((c, _), _)| *c)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::sync::atomic::Ordering::Acquire;
    use std::time::{Duration, Instant};

    /// Records which chunks are mapped, as the kernel would see them.
    struct Record {
        base: usize,
        len: usize,
        mapped: Mutex<BTreeSet<usize>>,
        populated: Mutex<Vec<(usize, usize)>>,
        attempts: AtomicUsize,
        /// Calls that were not one chunk clipped to the mapping.
        bad: Mutex<Vec<String>>,
        can_populate: bool,
    }

    impl Record {
        fn new(len: usize, can_populate: bool) -> Arc<Record> {
            Record::at(0, len, can_populate)
        }
        fn at(base: usize, len: usize, can_populate: bool) -> Arc<Record> {
            Arc::new(Record {
                base,
                len,
                mapped: Mutex::new(BTreeSet::new()),
                populated: Mutex::new(Vec::new()),
                attempts: AtomicUsize::new(0),
                bad: Mutex::new(Vec::new()),
                can_populate,
            })
        }
        /// What a reply's own page faults map: chunks of address space.
        fn fault(&self, off: usize, len: usize) {
            let mut m = self.mapped.lock().unwrap();
            let at = self.base + off;
            for c in at / CHUNK..=(at + len - 1) / CHUNK {
                m.insert(c);
            }
        }
        fn mapped(&self) -> BTreeSet<usize> {
            self.mapped.lock().unwrap().clone()
        }
    }

    impl Pages for Record {
        fn map_base(&self) -> usize {
            self.base
        }
        fn map_len(&self) -> usize {
            self.len
        }
        fn populate(&self, off: usize, len: usize) -> bool {
            self.attempts.fetch_add(1, Relaxed);
            if !self.can_populate {
                return false;
            }
            if len == 0 || off + len > self.len {
                self.bad
                    .lock()
                    .unwrap()
                    .push(format!("populate {off}+{len}"));
            }
            self.populated.lock().unwrap().push((off, len));
            self.fault(off, len);
            true
        }
        fn release(&self, off: usize, len: usize) {
            // One chunk of address space, clipped to the mapping.
            let (from, to) = (self.base + off, self.base + off + len);
            let c = from / CHUNK;
            let whole = len > 0
                && (to - 1) / CHUNK == c
                && (from % CHUNK == 0 || off == 0)
                && (to % CHUNK == 0 || off + len == self.len);
            if !whole {
                self.bad
                    .lock()
                    .unwrap()
                    .push(format!("release {off}+{len}"));
            }
            self.mapped.lock().unwrap().remove(&c);
        }
    }

    /// Waits until the helper has done every job, then checks that nothing
    /// mapped escaped the count, and that the pool is within its budget.
    fn settle(w: &MapWindow<Record>, rec: &Record) {
        let shared = &w.pool.shared;
        let t = Instant::now();
        while shared.pending.load(Acquire) > 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (mapped, counted) = (rec.mapped(), w.counted_set());
        let escaped: Vec<_> = mapped.difference(&counted).collect();
        assert!(escaped.is_empty(), "mapped but not counted: {escaped:?}");
        assert!(w.chunks() <= w.pool.budget, "{} chunks counted", w.chunks());
        assert_eq!(
            rec.bad.lock().unwrap().len(),
            0,
            "{:?}",
            rec.bad.lock().unwrap()
        );
    }

    /// One reply, in the order the data layer makes the calls.
    fn reply(w: &MapWindow<Record>, rec: &Record, off: usize, len: usize, limit: usize) {
        w.ahead(off, len, limit);
        rec.fault(off, len);
        w.served(off, len);
    }

    #[test]
    fn a_stream_is_faulted_in_ahead_and_let_go_of_behind() {
        let len = 256 << 20;
        // A mapping that does not start on a chunk.
        let rec = Record::at((7 << 20) + 20480, len, true);
        let w = MapWindow::new(rec.clone(), BUDGET);
        let step = 1 << 20;
        for off in (0..len).step_by(step) {
            reply(&w, &rec, off, step, len);
            assert!(w.chunks() <= BUDGET / CHUNK, "over budget at {off}");
            // A reply takes time: the helper keeps up.
            std::thread::sleep(Duration::from_micros(200));
        }
        settle(&w, &rec);
        // The end of the stream is what stays mapped.
        let last = (rec.base + len - 1) / CHUNK;
        assert!(rec.mapped().contains(&last));
        // What came after the first reply was asked for ahead (all of it
        // when the helper keeps up; hints it cannot take are dropped).
        let asked: usize = rec.populated.lock().unwrap().iter().map(|(_, n)| n).sum();
        assert!(asked >= len / 2, "only {asked} bytes ahead");
    }

    #[test]
    fn random_small_reads_stay_within_the_budget() {
        // 4 KiB replies at random places of 1 GiB: nothing streams, nothing
        // is faulted in ahead, and what is mapped stays bounded.
        let len = 1 << 30;
        let rec = Record::at(4096, len, true);
        let w = MapWindow::new(rec.clone(), 8 << 20);
        let mut x = 12345u64;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) as usize % (len - 4096);
            reply(&w, &rec, off, 4096, len);
        }
        settle(&w, &rec);
        assert!(rec.populated.lock().unwrap().is_empty());
        assert!(w.chunks() <= 4);
    }

    #[test]
    fn without_populate_it_still_lets_go() {
        let len = 256 << 20;
        let rec = Record::new(len, false);
        let w = MapWindow::new(rec.clone(), 8 << 20);
        for off in (0..len).step_by(1 << 20) {
            reply(&w, &rec, off, 1 << 20, len);
            std::thread::sleep(Duration::from_micros(100));
        }
        settle(&w, &rec);
        assert!(rec.mapped().len() <= 4);
        // Told once that the kernel cannot, it stops asking (and counting):
        // only jobs queued by then still ask, not one per reply (256).
        assert!(rec.attempts.load(Relaxed) <= QUEUE + 1);
    }

    #[test]
    fn long_random_reads_are_not_streams() {
        let len = 1 << 30;
        let rec = Record::new(len, true);
        let w = MapWindow::new(rec.clone(), BUDGET);
        let mut x = 7u64;
        for _ in 0..2000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) as usize % (len - (1 << 20));
            reply(&w, &rec, off, 1 << 20, len);
        }
        settle(&w, &rec);
        // Only reads that happen to start in a chunk still counted.
        let asked = rec.populated.lock().unwrap().len();
        assert!(asked < 200, "{asked} of 2000 random reads faulted in ahead");
    }

    #[test]
    fn nothing_ahead_past_the_tensor() {
        let len = 64 << 20;
        let rec = Record::new(len, true);
        let w = MapWindow::new(rec.clone(), BUDGET);
        // A tensor ending at 5 MiB + 100 of a longer mapping.
        let limit = (5 << 20) + 100;
        for off in (0..limit).step_by(1 << 20) {
            reply(&w, &rec, off, (1 << 20).min(limit - off), limit);
            std::thread::sleep(Duration::from_millis(2));
        }
        settle(&w, &rec);
        let pop = rec.populated.lock().unwrap();
        assert!(!pop.is_empty());
        assert!(pop.iter().all(|(o, n)| o + n <= limit), "{pop:?}");
    }

    #[test]
    fn replies_in_flight_while_others_push_them_out_stay_counted() {
        // Eight streams over a small budget, their replies interleaved: a
        // reply's chunk is let go of before the reply is written (which maps
        // it again), and chunks asked for ahead are pushed out before the
        // helper gets to them. Whatever ends up mapped must be counted.
        let len = 512 << 20;
        let rec = Record::at(3 << 20, len, true);
        let w = MapWindow::new(rec.clone(), 8 << 20);
        let streams: Vec<usize> = (0..8).map(|i| i * (64 << 20)).collect();
        let step = 256 << 10;
        let mut x = 99u64;
        let mut inflight: Vec<(usize, usize)> = Vec::new();
        for round in 0..(64 << 20) / step {
            for s in &streams {
                let off = s + round * step;
                w.ahead(off, step, s + (64 << 20));
                inflight.push((off, step));
            }
            // Finish some replies, in a scrambled order.
            while inflight.len() > 6 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let (off, n) = inflight.swap_remove((x >> 33) as usize % inflight.len());
                rec.fault(off, n);
                w.served(off, n);
            }
        }
        for (off, n) in inflight {
            rec.fault(off, n);
            w.served(off, n);
        }
        settle(&w, &rec);
    }

    #[test]
    fn the_windows_of_one_pool_share_its_budget() {
        // 24 files (a sharded set), each streamed through: what stays
        // mapped is one budget in all, not one per file.
        let pool = MapPool::new(BUDGET);
        let len = 8 << 20;
        let recs: Vec<_> = (0..24)
            .map(|i| Record::at((i * 64 + 1) << 20, len, true))
            .collect();
        let windows: Vec<_> = recs.iter().map(|r| pool.window(r.clone())).collect();
        for (w, rec) in windows.iter().zip(&recs) {
            for off in (0..len).step_by(1 << 20) {
                reply(w, rec, off, 1 << 20, len);
            }
        }
        for (w, rec) in windows.iter().zip(&recs) {
            settle(w, rec);
        }
        let mapped: usize = recs.iter().map(|r| r.mapped().len()).sum();
        assert!(mapped <= BUDGET / CHUNK, "{mapped} chunks mapped");
        // The last file streamed is what stays mapped.
        assert!(!recs[23].mapped().is_empty());
        assert!(recs[0].mapped().is_empty());
    }

    #[test]
    fn mappings_that_share_a_chunk_count_their_own_parts() {
        // The kernel places mappings side by side: one ends and the next
        // begins inside chunk 2 (4-6 MiB). Each counts and lets go of its
        // own part, so neither's pages escape the count.
        let pool = MapPool::new(8 << 20);
        let a = Record::at(0, (5 << 20) + (512 << 10), true);
        let b = Record::at(a.len, 32 << 20, true);
        let (wa, wb) = (pool.window(a.clone()), pool.window(b.clone()));
        for round in 0..4 {
            for off in (0..a.len).step_by(256 << 10) {
                let n = (256 << 10).min(a.len - off);
                reply(&wa, &a, off, n, a.len);
            }
            let start = round * (8 << 20);
            for off in (start..start + (8 << 20)).step_by(1 << 20) {
                reply(&wb, &b, off, 1 << 20, b.len);
            }
        }
        settle(&wa, &a);
        settle(&wb, &b);
    }
}
