//! Which pages of the `.zt` mapping the daemon keeps mapped while it serves
//! raw tensors. A raw reply is written to the kernel straight from the
//! mapping, so its pages are mapped (page faults) before they are sent, and
//! must be let go of (a page-table walk and a TLB flush) once readers are
//! past them, or the daemon's RSS would grow to the size of the file.
//!
//! On the thread that serves the reply, both cost a third of a raw
//! sequential read on the project's VM (BENCHMARKS.md), so both happen on a
//! thread of the window's own: the next chunks ahead of a streaming reader
//! are faulted in before it asks for them, and the least recently served
//! chunks past a fixed budget are let go of (their pages stay in the page
//! cache; a later read maps them again).

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::format::ZtFile;

/// The unit of accounting: mapped pages are counted (and let go of) per
/// 2 MiB of address space, aligned as page tables are: a page fault maps
/// its neighbours too ("fault-around"), but never across such a boundary,
/// so no page is mapped outside the chunks that were counted.
pub const CHUNK: usize = 2 << 20;
/// Default budget: at most this much of the mapping is kept mapped for
/// raw replies (plus what the helper has not let go of yet, at most
/// [`QUEUE`] chunks).
pub const BUDGET: usize = 32 << 20;
/// How far ahead of a streaming reader the helper faults pages in, and
/// how many chunks one reply may ask for (a reader moves half a chunk per
/// 1 MiB reply, so the window catches up; readers that push each other's
/// windows out cost little). 2 to 8 MiB ahead did equally well on the
/// project's VM; 16 MiB did worse.
const AHEAD: usize = 8 << 20;
const AHEAD_PER_REPLY: usize = 2;
/// A reply this long counts as streaming (the kernel's own readahead asks
/// for 128 KiB at a time); shorter ones fault in only their own pages.
const STREAMING: usize = 128 << 10;
/// Jobs waiting for the helper. Past that, hints are dropped and a release
/// waits for room: releases and the faulting-in of the same chunk must
/// happen in the order they were decided, or a chunk let go of could be
/// mapped again behind the window's back.
const QUEUE: usize = 8;

/// What the window does to the mapping: the `.zt`'s, or a test's record.
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

impl Pages for ZtFile {
    fn map_base(&self) -> usize {
        self.bytes().as_ptr() as usize
    }

    fn map_len(&self) -> usize {
        self.bytes().len()
    }

    fn populate(&self, off: usize, len: usize) -> bool {
        match ZtFile::populate(self, off, len) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => false,
            // A file cut short is the guard's to report; the reply faults.
            _ => true,
        }
    }

    fn release(&self, off: usize, len: usize) {
        let end = off.saturating_add(len).min(self.bytes().len());
        if off < end {
            ZtFile::release(self, &self.bytes()[off..end]);
        }
    }
}

enum Job {
    Populate(usize, usize),
    Release(usize, usize),
}

pub struct MapWindow<P: Pages> {
    pages: Arc<P>,
    base: usize,
    /// Chunks counted as mapped, least recently served first (numbered by
    /// address, not by file offset).
    mapped: Mutex<LruCache<usize, ()>>,
    budget: usize,
    jobs: SyncSender<Job>,
}

impl<P: Pages> MapWindow<P> {
    /// A window of at most `budget` bytes (rounded up to whole chunks)
    /// with its helper thread, which ends when the window is dropped.
    pub fn new(pages: Arc<P>, budget: usize) -> MapWindow<P> {
        let (jobs, rx) = sync_channel(QUEUE);
        let p = pages.clone();
        // Without a helper every send fails: releases happen inline.
        let _ = std::thread::Builder::new()
            .name("zt-map".into())
            .spawn(move || helper(&*p, rx));
        MapWindow {
            base: pages.map_base(),
            pages,
            mapped: Mutex::new(LruCache::unbounded()),
            budget: budget.div_ceil(CHUNK).max(1),
            jobs,
        }
    }

    /// A reply of `len` bytes at `off` of the mapping is about to be sent;
    /// `limit` is where its tensor ends (nothing past it is faulted in).
    pub fn serve(&self, off: usize, len: usize, limit: usize) {
        if len == 0 {
            return;
        }
        // Addresses from here on.
        let (off, limit) = (self.base + off, self.base + limit.min(self.pages.map_len()));
        let mut ahead = None;
        let mut gone = Vec::new();
        {
            let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
            let end = off.saturating_add(len);
            if len >= STREAMING && end < limit {
                let to = end.saturating_add(AHEAD).next_multiple_of(CHUNK).min(limit);
                // Chunks already counted are mapped, or were just asked for.
                let first_new = (end / CHUNK..=(to - 1) / CHUNK).find(|c| !mapped.contains(c));
                if let Some(c) = first_new {
                    let last = ((to - 1) / CHUNK).min(c + AHEAD_PER_REPLY - 1);
                    for c in c..=last {
                        mapped.push(c, ());
                    }
                    let from = end.max(c * CHUNK);
                    ahead = Some((from, to.min((last + 1) * CHUNK) - from));
                }
            }
            // The reply's own chunks last: they are the most recently used.
            for c in off / CHUNK..=(end - 1) / CHUNK {
                mapped.push(c, ());
            }
            while mapped.len() > self.budget {
                match mapped.pop_lru() {
                    Some((c, ())) => gone.push(c),
                    None => break,
                }
            }
        }
        if let Some((from, n)) = ahead {
            // A hint: if the helper is busy, the reply faults its own pages.
            let _ = self.jobs.try_send(Job::Populate(from - self.base, n));
        }
        for c in gone {
            // The chunk's part of the mapping, as offsets.
            let from = (c * CHUNK).max(self.base);
            let to = ((c + 1) * CHUNK).min(self.base + self.pages.map_len());
            let (at, n) = (from - self.base, to.saturating_sub(from));
            // Without a helper (it could not start), let go here.
            if self.jobs.send(Job::Release(at, n)).is_err() {
                self.pages.release(at, n);
            }
        }
    }

    /// Chunks counted as mapped now.
    pub fn chunks(&self) -> usize {
        self.mapped.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

fn helper<P: Pages>(pages: &P, jobs: Receiver<Job>) {
    let mut can_populate = true;
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Populate(off, n) if can_populate => can_populate = pages.populate(off, n),
            Job::Populate(..) => {}
            Job::Release(off, n) => pages.release(off, n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    /// Records which chunks are mapped, as the kernel would see them.
    struct Record {
        base: usize,
        len: usize,
        mapped: Mutex<BTreeSet<usize>>,
        populated: Mutex<Vec<(usize, usize)>>,
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
        fn mapped(&self) -> usize {
            self.mapped.lock().unwrap().len()
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
            if !self.can_populate {
                return false;
            }
            self.populated.lock().unwrap().push((off, len));
            self.fault(off, len);
            true
        }
        fn release(&self, off: usize, len: usize) {
            // One chunk of address space, clipped to the mapping.
            let (from, to) = (self.base + off, self.base + off + len);
            let c = from / CHUNK;
            assert!(
                len > 0 && (to - 1) / CHUNK == c,
                "{off}+{len} is not one chunk"
            );
            assert!(
                from % CHUNK == 0 || off == 0,
                "{off}: not from a chunk's start"
            );
            assert!(
                to % CHUNK == 0 || off + len == self.len,
                "{off}+{len}: short"
            );
            self.mapped.lock().unwrap().remove(&c);
        }
    }

    /// Waits for the helper to drain its queue (it has no other signal).
    fn settle(w: &MapWindow<Record>, rec: &Record) {
        let t = Instant::now();
        while rec.mapped() > w.chunks() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    #[test]
    fn a_stream_is_faulted_in_ahead_and_let_go_of_behind() {
        let len = 256 << 20;
        // A mapping that does not start on a chunk.
        let rec = Record::at((7 << 20) + 20480, len, true);
        let w = MapWindow::new(rec.clone(), BUDGET);
        let step = 1 << 20;
        for off in (0..len).step_by(step) {
            w.serve(off, step, len);
            rec.fault(off, step);
            assert!(w.chunks() <= BUDGET / CHUNK, "over budget at {off}");
            // A reply takes time: the helper keeps up (hints it cannot
            // take in time are dropped).
            std::thread::sleep(Duration::from_micros(200));
        }
        settle(&w, &rec);
        assert!(
            rec.mapped() <= BUDGET / CHUNK + QUEUE + 1,
            "{} chunks left mapped",
            rec.mapped()
        );
        // The end of the stream is what stays mapped.
        let last = (rec.base + len - 1) / CHUNK;
        assert!(rec.mapped.lock().unwrap().contains(&last));
        // Most of the stream was asked for ahead of time (all of it, on
        // a quiet machine), and nothing past the limit.
        let pop = rec.populated.lock().unwrap();
        let asked: usize = pop.iter().map(|(_, n)| n).sum();
        assert!(asked >= len / 2, "only {asked} bytes ahead");
        assert!(pop.iter().all(|(o, n)| o + n <= len));
    }

    #[test]
    fn many_small_tensors_stay_within_the_budget() {
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
            w.serve(off, 4096, len);
            rec.fault(off, 4096);
        }
        settle(&w, &rec);
        assert!(rec.populated.lock().unwrap().is_empty());
        assert!(w.chunks() <= 4);
        assert!(rec.mapped() <= 4 + QUEUE, "{} chunks mapped", rec.mapped());
    }

    #[test]
    fn without_populate_it_still_lets_go() {
        let len = 64 << 20;
        let rec = Record::new(len, false);
        let w = MapWindow::new(rec.clone(), 4 << 20);
        for off in (0..len).step_by(1 << 20) {
            w.serve(off, 1 << 20, len);
            rec.fault(off, 1 << 20);
        }
        settle(&w, &rec);
        assert!(rec.mapped() <= 2 + QUEUE, "{} chunks mapped", rec.mapped());
    }

    #[test]
    fn nothing_ahead_past_the_tensor() {
        let len = 64 << 20;
        let rec = Record::new(len, true);
        let w = MapWindow::new(rec.clone(), BUDGET);
        // A tensor ending at 5 MiB + 100, read in 1 MiB replies.
        let limit = (5 << 20) + 100;
        for off in (0..limit).step_by(1 << 20) {
            w.serve(off, (1 << 20).min(limit - off), limit);
        }
        settle(&w, &rec);
        let pop = rec.populated.lock().unwrap();
        assert!(!pop.is_empty());
        assert!(pop.iter().all(|(o, n)| o + n <= limit), "{pop:?}");
    }
}
