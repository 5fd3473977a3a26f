//! A remote object served as a mapped file: its blocks fetched on demand
//! into its cache file, checked, and committed as present.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use object_store::path::Path as Key;

use crate::error::Result;
use crate::source::error::FetchError;
use crate::source::shared::Live;
use crate::source::sums::Sums;
use crate::source::{Backing, MappedFile};

use super::cache::{COMMIT_EVERY, COMMIT_QUIET, Cache, EtagMark, Files, commit, present_run};
use super::client::Client;
use super::fetch::Flight;
use super::{CHECKERS, MAX_REQUESTS, PARALLEL, Typed, fail, open_with, runtime};

/// Which blocks of a cache file are present: this process's own view (a
/// private file), or the view every mount of the file shares.
pub(super) enum Bits {
    Own(Vec<AtomicU64>),
    Shared(Live),
}

impl std::ops::Deref for Bits {
    type Target = [AtomicU64];

    fn deref(&self) -> &[AtomicU64] {
        match self {
            Bits::Own(v) => v,
            Bits::Shared(l) => l,
        }
    }
}

/// A pinned remote object and its cache file.
pub struct Object {
    pub(super) me: Weak<Object>,
    pub(super) client: Arc<Client>,
    pub(super) url: url::Url,
    /// Its URL and key as typed, for an object store's.
    pub(super) typed: Option<Typed>,
    pub(super) label: String,
    pub(super) key: Key,
    pub(super) size: u64,
    pub(super) etag: Option<String>,
    /// The ETag was pinned from a GET's answer: every answer must carry it
    /// (one without it is not this object; a server whose HEAD alone gives
    /// an ETag is held to its Last-Modified instead).
    pub(super) etag_on_gets: bool,
    /// Whether a GET's answer carried the pinned ETag, in this mount or
    /// another of its cache files: from then on, every answer must (a
    /// server that stops sending it serves another object, and may ignore
    /// `If-Match`).
    pub(super) etag_seen_on_get: EtagMark,
    pub(super) version: Option<String>,
    /// Its Last-Modified (seconds) at mount, if the server gave one: what
    /// each answer without an ETag to compare must still say.
    pub(super) modified: Option<i64>,
    pub(super) block: u64,
    /// The cache file, written with pwrite.
    pub(super) file: Option<File>,
    /// The blocks present in the cache file (shared with the other mounts
    /// of the object that use it).
    pub(super) present: Bits,
    /// The saved bitmap (none for a private cache file).
    pub(super) bitmap: Option<Mutex<File>>,
    /// Each block's XXH3-64 as fetched (shared like `present`), seeded
    /// with its number and `key_sum` (the cache file's name).
    pub(super) sums: Sums,
    pub(super) key_sum: u64,
    /// The blocks this process fetched, or found to match their sums:
    /// only those are read (a block present but not checked is checked
    /// first, and fetched again if it fails).
    pub(super) checked: Vec<AtomicU64>,
    /// The cache file's path, for messages.
    pub(super) path: PathBuf,
    pub(super) flights: Mutex<HashMap<u64, Arc<Flight>>>,
    /// Why the object's bytes can no longer be served (its kind says
    /// whether because it changed).
    pub(super) broken: OnceLock<FetchError>,
    /// The block after the last one a reader asked for (read-ahead).
    pub(super) next_seq: AtomicU64,
    /// Where reads ahead stop (a block number; the object's end unless a
    /// reader said otherwise, see [`Backing::read_ahead_until`]).
    pub(super) ahead_end: AtomicU64,
    /// The block after the last one of the cache file that the kernel was
    /// asked to read ahead for a sequential reader (see [`Object::advise`]).
    pub(super) advised: AtomicU64,
    pub(super) requests: Arc<tokio::sync::Semaphore>,
    /// Blocks fetched since the bitmap was last committed.
    pub(super) dirty: AtomicU64,
    /// When the bitmap was last committed; held while committing.
    pub(super) committed: Mutex<Instant>,
    /// When the last block arrived (see [`Object::commit_when_due`]).
    pub(super) last_arrival: Mutex<Instant>,
    /// The process whose task waits to commit, or commits (one at a
    /// time; 0: none). A process id, as a fork keeps the value and none of
    /// the parent's tasks (the runtime is dropped before it).
    pub(super) committer: AtomicU32,
    /// A commit failed (said once).
    pub(super) commit_failed: AtomicBool,
    /// For a server that ignores Range: the one fetch of the whole object.
    /// Held while it runs; true once it succeeded.
    pub(super) whole: tokio::sync::Mutex<bool>,
}

/// What a HEAD (or a first GET) pinned of an object at open.
pub(super) struct Pinned {
    pub(super) key: Key,
    pub(super) meta: object_store::ObjectMeta,
    /// Its Last-Modified in seconds, if the server gave one.
    pub(super) modified: Option<i64>,
    /// See [`Object::etag_on_gets`].
    pub(super) etag_on_gets: bool,
}

impl Object {
    /// The object over its opened cache file; the cache file itself comes
    /// back for the mapping.
    pub(super) fn new(
        client: Arc<Client>,
        url: url::Url,
        typed: Option<Typed>,
        label: String,
        pinned: Pinned,
        cache: Cache,
    ) -> (Arc<Object>, File) {
        let words = cache.present.len();
        let present = match cache.live {
            Some(live) => Bits::Shared(live),
            None => Bits::Own(cache.present.iter().map(|&w| AtomicU64::new(w)).collect()),
        };
        let Pinned {
            key,
            meta,
            modified,
            etag_on_gets,
        } = pinned;
        let obj = Arc::new_cyclic(|me| Object {
            me: me.clone(),
            client,
            url,
            typed,
            label,
            key,
            size: meta.size,
            etag: meta.e_tag,
            etag_on_gets,
            etag_seen_on_get: cache.etag_mark,
            version: meta.version,
            modified,
            block: cache.block,
            file: cache.file.try_clone().ok(),
            present,
            bitmap: cache.bitmap.map(Mutex::new),
            sums: cache.sums,
            key_sum: cache.key,
            checked: (0..words).map(|_| AtomicU64::new(0)).collect(),
            path: cache.path,
            flights: Mutex::new(HashMap::new()),
            broken: OnceLock::new(),
            next_seq: AtomicU64::new(u64::MAX),
            ahead_end: AtomicU64::new(u64::MAX),
            advised: AtomicU64::new(0),
            requests: Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS)),
            dirty: AtomicU64::new(0),
            committed: Mutex::new(Instant::now()),
            last_arrival: Mutex::new(Instant::now()),
            committer: AtomicU32::new(0),
            commit_failed: AtomicBool::new(false),
            whole: tokio::sync::Mutex::new(false),
        });
        (obj, cache.file)
    }

    pub(super) fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block)
    }

    pub(super) fn has(&self, b: u64) -> bool {
        self.present
            .get((b / 64) as usize)
            .is_some_and(|w| w.load(Acquire) & (1 << (b % 64)) != 0)
    }

    /// Marks `blocks` present (their bytes are in the cache file). The
    /// saved bitmap learns of them later, in [`Object::commit`], once
    /// their bytes are on disk.
    pub(super) fn mark(&self, blocks: Range<u64>) {
        let n = blocks.end - blocks.start;
        for b in blocks {
            if let Some(w) = self.present.get((b / 64) as usize) {
                w.fetch_or(1 << (b % 64), Release);
            }
        }
        // After the bits: a commit that counts these sees them.
        self.dirty.fetch_add(n, SeqCst);
    }

    /// Asks the kernel to read block `b` of the cache file into the page
    /// cache (a hint: nothing waits for it).
    pub(super) fn advise_block(&self, b: u64) {
        let Some(f) = &self.file else { return };
        let at = b * self.block;
        let len = ((b + 1) * self.block).min(self.size).saturating_sub(at);
        if let (Ok(at), Ok(len)) = (libc::off_t::try_from(at), libc::off_t::try_from(len)) {
            // SAFETY: posix_fadvise on our own descriptor; a hint, its
            // failure changes nothing.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), at, len, libc::POSIX_FADV_WILLNEED) };
        }
    }

    /// Whether this process fetched block `b` or has checked it.
    pub(super) fn checked(&self, b: u64) -> bool {
        self.checked
            .get((b / 64) as usize)
            .is_some_and(|w| w.load(Acquire) & (1 << (b % 64)) != 0)
    }

    /// Whether block `b` is present and may be read: this process fetched
    /// it or has checked it against its sum. A block present that fails
    /// its check is marked missing (for every mount of the cache file),
    /// to be fetched again.
    pub(super) fn usable(&self, b: u64) -> bool {
        if !self.has(b) {
            return false;
        }
        if self.checked(b) {
            return true;
        }
        let (start, end) = (b * self.block, ((b + 1) * self.block).min(self.size));
        let why = match (&self.file, self.sums.get(b)) {
            (Some(f), Some(sum)) => {
                match crate::source::sums::holds(f, self.key_sum, (b, self.block, self.size), sum) {
                    Ok(true) => {
                        self.set_checked(b);
                        return true;
                    }
                    Ok(false) => "its bytes do not match their sum as fetched (XXH3)".to_string(),
                    Err(e) => format!("cannot read it: {e}"),
                }
            }
            _ => "no file or sum to check it against".to_string(),
        };
        log::warn!(
            "{}: bytes {start}..{end} of the cache file {}: {why}; fetching them again",
            self.label,
            self.path.display()
        );
        BAD_BLOCKS.fetch_add(1, Relaxed);
        if let Some(w) = self.present.get((b / 64) as usize) {
            w.fetch_and(!(1 << (b % 64)), Release);
        }
        false
    }

    /// Marks `blocks` missing (for every mount of the cache file), and
    /// not checked: an answer whose bytes turned out not to be those
    /// asked for.
    pub(super) fn unmark(&self, blocks: Range<u64>) {
        for b in blocks {
            let bit = !(1u64 << (b % 64));
            if let Some(w) = self.present.get((b / 64) as usize) {
                w.fetch_and(bit, Release);
            }
            if let Some(w) = self.checked.get((b / 64) as usize) {
                w.fetch_and(bit, Release);
            }
        }
    }

    pub(super) fn set_checked(&self, b: u64) {
        if let Some(w) = self.checked.get((b / 64) as usize) {
            w.fetch_or(1 << (b % 64), Release);
        }
    }

    /// Block `b`'s bytes are all in the cache file, hashing to `sum`:
    /// marks it present and lets its readers go on, while the rest of its
    /// request is under way.
    pub(super) fn arrived(&self, b: u64, sum: u64) {
        self.fetched(b, sum);
        self.mark(b..b + 1);
        self.to_commit();
        let f = self
            .flights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&b);
        if let Some(f) = f {
            f.finish(Ok(()));
        }
    }

    /// Records the sum of block `b`, just written by this process, before
    /// it is marked present.
    pub(super) fn fetched(&self, b: u64, sum: u64) {
        self.sums.set(b, sum);
        self.set_checked(b);
    }

    /// Blocks just marked present: the saved bitmap is to learn of them,
    /// by the one committer task of this object, started here if none is.
    /// The committer and `dirty` are read and written in one order
    /// (`SeqCst`) here, in [`Object::mark`] and in the task: an arrival
    /// that finds the task there is seen by it before it ends.
    pub(super) fn to_commit(&self) {
        if self.bitmap.is_none() || self.file.is_none() {
            return;
        }
        *self.last_arrival.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let pid = std::process::id();
        let now = self.committer.load(SeqCst);
        if now == pid
            || self
                .committer
                .compare_exchange(now, pid, SeqCst, SeqCst)
                .is_err()
        {
            return;
        }
        match runtime() {
            Ok(rt) => drop(rt.spawn(Object::commit_when_due(self.me.clone(), pid))),
            Err(e) => {
                log::debug!("{}: no runtime to commit on: {e}", self.label);
                self.committer.store(0, SeqCst);
            }
        }
    }

    /// When the next commit is due: once fetching paused for
    /// [`COMMIT_QUIET`], or [`COMMIT_EVERY`] after the last while it goes
    /// on.
    pub(super) fn commit_at(&self) -> Instant {
        let quiet = *self.last_arrival.lock().unwrap_or_else(|p| p.into_inner()) + COMMIT_QUIET;
        let every = *self.committed.lock().unwrap_or_else(|p| p.into_inner()) + COMMIT_EVERY;
        quiet.min(every)
    }

    /// Waits until a commit is due, commits (its fdatasync on a blocking
    /// thread), and goes on while blocks arrived meanwhile. Not under
    /// every few blocks of a read that fetches: each fdatasync made the
    /// kernel write the cache file out under the writes of the fetch, and
    /// halved a cold read on a disk slower than the network (BENCHMARKS.md,
    /// "Remote reads").
    /// It holds the object only to commit: one no longer used is dropped
    /// (and commits then) without waiting for it.
    pub(super) async fn commit_when_due(me: Weak<Object>, pid: u32) {
        loop {
            let Some(at) = me.upgrade().map(|o| o.commit_at()) else {
                return;
            };
            if Instant::now() < at {
                tokio::time::sleep_until(at.into()).await;
                continue;
            }
            let Some(o) = me.upgrade() else { return };
            let saved = tokio::task::spawn_blocking({
                let o = o.clone();
                move || o.commit()
            })
            .await;
            if !saved.unwrap_or(false) {
                // Logged; tried again after a while (a disk error may
                // pass), not at once.
                drop(o);
                tokio::time::sleep(COMMIT_EVERY).await;
                continue;
            }
            o.committer.store(0, SeqCst);
            // Blocks that arrived during the commit found the task still
            // there: it goes on for them, unless another took over.
            if o.dirty.load(SeqCst) == 0
                || o.committer
                    .compare_exchange(0, pid, SeqCst, SeqCst)
                    .is_err()
            {
                return;
            }
        }
    }

    /// Saves the bitmap of the blocks present, after their bytes reached
    /// the disk (see [`commit`]).
    /// True when it saved them.
    pub(super) fn commit(&self) -> bool {
        let Some(bm) = &self.bitmap else { return false };
        let Some(data) = &self.file else { return false };
        let mut at = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        // Taken before the data is synced: every bit in it is of a block
        // whose bytes were written before the sync.
        let dirty = self.dirty.load(Acquire);
        let words: Vec<u64> = self.present.iter().map(|w| w.load(Acquire)).collect();
        let bits = bm.lock().unwrap_or_else(|p| p.into_inner());
        let files = Files {
            data,
            sums: &self.sums,
            bits: &bits,
        };
        let saved = match commit(&files, &words) {
            Ok(()) => {
                self.dirty.fetch_sub(dirty, Relaxed);
                true
            }
            Err(e) => {
                // Tried again every 30 s: said once, then in the debug log.
                let level = match self.commit_failed.swap(true, Relaxed) {
                    false => log::Level::Warn,
                    true => log::Level::Debug,
                };
                log::log!(
                    level,
                    "{}: cannot save the cache's block bitmap (the blocks will be fetched again \
                     after a restart): {e}",
                    self.label
                );
                false
            }
        };
        *at = Instant::now();
        saved
    }
}

impl Backing for Object {
    fn ensure(&self, ranges: &[(u64, u64)], index: bool) -> std::result::Result<(), FetchError> {
        match self.ensure_once(ranges, index) {
            // A reader that joined a request another started (a read-ahead
            // under a fault that has since cleared) asks once for itself.
            Err(Waited::Joined(_)) if self.broken.get().is_none() => {
                self.ensure_once(ranges, index).map_err(Waited::into_error)
            }
            r => r.map_err(Waited::into_error),
        }
    }

    fn present(&self, off: u64, len: u64) -> u64 {
        let usable = |b| self.has(b) && self.checked(b);
        present_run(usable, self.block, self.size, off, len)
    }

    fn check_present(&self) {
        let todo: Vec<u64> = (0..self.blocks())
            .filter(|&b| self.has(b) && !self.checked(b))
            .collect();
        // A remount's first open of the view waits for this, and the cache
        // file's pages are likely gone: the disk is the bound. One thread
        // asks the kernel for the blocks ahead (as `warm` does for a file
        // passed through), and several check them as they come.
        let next = AtomicUsize::new(0);
        let work = || {
            while let Some(&b) = todo.get(next.fetch_add(1, Relaxed)) {
                self.usable(b);
            }
        };
        std::thread::scope(|s| {
            if !todo.is_empty() {
                s.spawn(|| todo.iter().for_each(|&b| self.advise_block(b)));
            }
            for _ in 1..CHECKERS.min(todo.len()) {
                s.spawn(work);
            }
            work();
        });
    }

    fn broken(&self) -> Option<FetchError> {
        self.broken.get().cloned()
    }

    fn read_ahead_until(&self, end: u64) {
        self.ahead_end.store(end.div_ceil(self.block), Relaxed);
    }

    fn sibling(&self, name: &str) -> Result<MappedFile> {
        if let Some(repo) = &self.client.hub {
            return crate::source::hub::sibling(repo, &self.url, name);
        }
        let url = sibling_url(&self.url, name)
            .ok_or_else(|| fail(&self.label, format!("sibling {name:?}: not beside it")))?;
        let typed = self.typed.as_ref().map(|t| t.sibling(name));
        open_with(self.client.clone(), url, typed)
    }
}

/// The URL of the file `name` beside the one at `url`: its last segment
/// replaced by `name` as one segment, percent-encoded. (`Url::join` would
/// read a `?` or `#` in a name as a query or fragment, and `%2e%2e` as
/// `..`: another file.)
pub(in crate::source) fn sibling_url(url: &url::Url, name: &str) -> Option<url::Url> {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    u.path_segments_mut().ok()?.pop().push(name);
    Some(u)
}

/// Why an `ensure` failed: a request it started, or one it joined.
pub(super) enum Waited {
    Led(FetchError),
    Joined(FetchError),
}

impl Waited {
    pub(super) fn into_error(self) -> FetchError {
        match self {
            Waited::Led(e) | Waited::Joined(e) => e,
        }
    }
}

impl Object {
    /// Asks the kernel to read the present blocks of `blocks` (those ahead
    /// of a sequential reader) from the cache file into the page cache, in
    /// the background, so that the reader finds them there rather than
    /// waiting for the disk a fault at a time. Each block is asked for
    /// once per pass of a reader.
    pub(super) fn advise(&self, blocks: Range<u64>) {
        let Some(file) = &self.file else { return };
        let from = self.advised.load(Relaxed);
        // Going on from the last advice, or starting over elsewhere.
        let start = if (blocks.start..=blocks.end).contains(&from) {
            from
        } else {
            blocks.start
        };
        if start >= blocks.end {
            return;
        }
        self.advised.store(blocks.end, Relaxed);
        let mut b = start;
        while b < blocks.end {
            if !self.has(b) {
                b += 1;
                continue;
            }
            let run = b;
            while b < blocks.end && self.has(b) {
                b += 1;
            }
            let at = run * self.block;
            let len = (b * self.block).min(self.size).saturating_sub(at);
            let (Ok(at), Ok(len)) = (libc::off_t::try_from(at), libc::off_t::try_from(len)) else {
                return;
            };
            // SAFETY: posix_fadvise on our own descriptor; a hint, its
            // failure changes nothing.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), at, len, libc::POSIX_FADV_WILLNEED) };
        }
    }

    /// Fetches the missing blocks of `ranges` (joining requests under way
    /// for any of them), and starts read-ahead for a sequential reader.
    pub(super) fn ensure_once(
        &self,
        ranges: &[(u64, u64)],
        index: bool,
    ) -> std::result::Result<(), Waited> {
        if let Some(why) = self.broken.get() {
            return Err(Waited::Led(why.clone()));
        }
        let mut wanted: Vec<u64> = Vec::new();
        for &(off, len) in ranges {
            let end = off.saturating_add(len).min(self.size);
            if off >= end {
                continue;
            }
            wanted.extend(off / self.block..end.div_ceil(self.block));
        }
        wanted.sort_unstable();
        wanted.dedup();
        // Read-ahead for a reader going on from where the last one ended
        // (or reading that block again), whether or not its own blocks are
        // here already: the blocks after them are fetched while it reads.
        let mut ahead = Vec::new();
        if !index && let (Some(&first), Some(&last)) = (wanted.first(), wanted.last()) {
            let seq = self.next_seq.swap(last + 1, Relaxed);
            if first <= seq && seq <= last + 1 {
                let until = (last + 1 + self.client.opts.read_ahead)
                    .min(self.blocks())
                    .min(self.ahead_end.load(Relaxed));
                ahead.extend((last + 1..until).filter(|&b| !self.has(b)));
                self.advise(last + 1..until);
            }
        }
        wanted.retain(|&b| !self.usable(b));
        if wanted.is_empty() && ahead.is_empty() {
            return Ok(());
        }
        let mut waits = Vec::new();
        let mut led: Vec<(u64, Arc<Flight>)> = Vec::new();
        let mut led_ahead: Vec<(u64, Arc<Flight>)> = Vec::new();
        {
            let mut map = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            for (list, mine, wait) in [(&wanted, &mut led, true), (&ahead, &mut led_ahead, false)] {
                for &b in list {
                    // Fetched while we looked.
                    if self.usable(b) {
                        continue;
                    }
                    match map.get(&b) {
                        Some(f) => {
                            if wait {
                                waits.push((f.clone(), false));
                            }
                        }
                        None => {
                            let f = Arc::new(Flight::default());
                            map.insert(b, f.clone());
                            if wait {
                                waits.push((f.clone(), true));
                            }
                            mine.push((b, f));
                        }
                    }
                }
            }
        }
        // Blocks ahead are one request each: with a store's time to first
        // byte, the requests in flight are what bounds a sequential read.
        for (list, pieces) in [
            (led, if index { 1 } else { PARALLEL }),
            (led_ahead, u64::MAX),
        ] {
            // Contiguous runs, each fetched by up to `pieces` requests.
            let mut i = 0;
            while i < list.len() {
                let mut j = i + 1;
                while j < list.len() && list[j].0 == list[j - 1].0 + 1 {
                    j += 1;
                }
                let run = list[i].0..list[j - 1].0 + 1;
                let flights = list[i..j].iter().map(|(_, f)| f.clone()).collect();
                self.launch(run, pieces, flights);
                i = j;
            }
        }
        let until = Instant::now() + self.patience();
        for (f, led) in waits {
            f.wait(until).map_err(|why| {
                // A change of the object names it already (see `changed`).
                let e = why.without_context(&self.label).context(&self.label);
                if led {
                    Waited::Led(e)
                } else {
                    Waited::Joined(e)
                }
            })?;
        }
        Ok(())
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        // What was fetched is known after a restart only once committed.
        if self.dirty.load(Relaxed) > 0 {
            self.commit();
        }
    }
}

/// GET requests sent, and bytes written into cache files, by this process.
pub(super) static REQUESTS: AtomicU64 = AtomicU64::new(0);
pub(super) static FETCHED: AtomicU64 = AtomicU64::new(0);
/// Blocks of cache files that failed their check, by this process.
pub(super) static BAD_BLOCKS: AtomicU64 = AtomicU64::new(0);

/// What the remote objects of this process have fetched and hold, for
/// `.ztensor/stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    /// GET requests sent (retries by the client not counted apart).
    pub requests: u64,
    /// Bytes fetched into cache files.
    pub fetched_bytes: u64,
    /// Bytes of the objects open now that are in their cache files.
    pub cached_bytes: u64,
    /// Total size of the objects open now.
    pub object_bytes: u64,
    /// Blocks of cache files that failed their check and were fetched
    /// again.
    pub bad_blocks: u64,
}

pub fn counters() -> Counters {
    let live = live_objects();
    let mut c = Counters {
        requests: REQUESTS.load(Relaxed),
        fetched_bytes: FETCHED.load(Relaxed),
        bad_blocks: BAD_BLOCKS.load(Relaxed),
        ..Counters::default()
    };
    for o in live {
        c.object_bytes += o.size;
        c.cached_bytes += (0..o.blocks())
            .filter(|&b| o.has(b))
            .map(|b| ((b + 1) * o.block).min(o.size) - b * o.block)
            .sum::<u64>();
    }
    c
}

/// Every object opened in this process, for [`commit_all`].
pub(super) static LIVE: Mutex<Vec<Weak<Object>>> = Mutex::new(Vec::new());

/// The objects of this process still open (the list loses the others).
pub(super) fn live_objects() -> Vec<Arc<Object>> {
    let mut l = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    l.retain(|w| w.strong_count() > 0);
    l.iter().filter_map(Weak::upgrade).collect()
}

/// Starts a committer for every object with blocks the saved bitmap has
/// not learnt of: in a forked child, whose parent's committers did not
/// cross the fork (its runtime was dropped before it).
pub fn after_fork() {
    for o in live_objects() {
        if o.dirty.load(SeqCst) > 0 {
            o.to_commit();
        }
    }
}

/// Commits the bitmap of every object still open: for a process about to
/// exit, whose objects may never be dropped.
pub fn commit_all() {
    for o in live_objects() {
        if o.dirty.load(Relaxed) > 0 {
            o.commit();
        }
    }
}
