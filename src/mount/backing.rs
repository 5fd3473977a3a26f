//! Backing files: exposed files whose bytes exist whole in a file on disk,
//! so the kernel can read them itself (FUSE passthrough) and no read of
//! them reaches the daemon.
//!
//! Two kinds:
//! - the source itself, where an exposed file is that file byte for byte
//!   (registered by [`Backings::source`]; costs nothing);
//! - a file under `--cache-dir` filled once with an exposed file's bytes
//!   read through the data layer ([`Backings::get_or_start`]), so every
//!   check the data layer makes has passed before the file is complete, and
//!   only a complete file is ever handed out. These are created unlinked
//!   (`O_TMPFILE`): a crash leaves nothing behind. Their bytes are bounded
//!   by [`BackingOptions::limit`]; one no open holds is dropped, least
//!   recently opened first, when a new one needs the room.
//!
//! Knows byte ranges of the data layer, never a format.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};

use super::activity::Activity;
use super::lock;
use super::tree::Content;
use super::warmer::{CloneJob, Warmer};
use crate::serve::data::Data;
use crate::serve::stats::Stats;

/// Bytes one filling worker reads through the data layer at once: one
/// frame as `pack --zstd` writes them, so a read is one cache unit's slice,
/// handed over without a copy.
const CHUNK: u64 = 1 << 20;

/// The longest an open waits for a backing file that is only being
/// published (see [`Backings::ready_or_wait`]).
const PUBLISH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest an open waits for a backing file whose reads wrote all
/// but an eighth of it (see [`Backings::ready_or_wait`]).
const NEARLY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long an open waiting for a nearly written file's fill gives the
/// fill, once queued, to be taken by its thread: longer, it waits behind
/// other fills, and the open is served instead.
const HANDOVER: std::time::Duration = std::time::Duration::from_millis(20);

/// How long the last close of a file waits for the write-through of
/// reads already sent to the reader (see [`Through`]); a write that takes
/// longer is left to the filler.
const SEAL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Longest a fill waits for a quiet mount before decoding its next piece
/// anyway (see [`Activity`]).
const FILL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// The page cache a daemon-served read fills (by `mmap`) is dropped behind
/// the reader in steps of this many bytes (see [`Behind`]) ...
const DROP_STEP: u64 = if cfg!(test) { 2 << 20 } else { 64 << 20 };
/// ... ending this far behind it: pages just read may be read again (a
/// loader's next tensor shares their page), and read-ahead runs ahead.
const DROP_MARGIN: u64 = if cfg!(test) { 1 << 20 } else { 32 << 20 };

#[derive(Debug, Clone)]
pub struct BackingOptions {
    /// Whether to make backing files at all (`--no-passthrough` says no).
    pub enabled: bool,
    /// Where filled files are created (`--cache-dir`).
    pub dir: PathBuf,
    /// Most bytes the filled files may hold together (`--decoded-cache-size`).
    pub limit: u64,
}

impl BackingOptions {
    /// No backing files.
    pub fn off() -> BackingOptions {
        BackingOptions {
            enabled: false,
            dir: std::env::temp_dir(),
            limit: 0,
        }
    }
}

/// Where a backing file's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The mounted file itself.
    Source,
    /// Filled under `--cache-dir` from the data layer.
    Filled,
    /// A range of the source cloned under `--cache-dir` (`FICLONERANGE`:
    /// the two files share the disk blocks, nothing is copied).
    Cloned,
}

/// What a backing file keeps alive besides itself (the spill it is).
pub type Holds = Option<Arc<dyn std::any::Any + Send + Sync>>;

/// What a filled file of `len` bytes counts against `--decoded-cache-size`:
/// nothing for a spill's file (`holds`), which its spill counts.
fn charge_of(len: u64, holds: &Holds) -> u64 {
    if holds.is_some() { 0 } else { len }
}

/// A complete file whose bytes are an exposed file's, at the same offsets.
pub struct Backing {
    file: File,
    /// The data layer's owner of the same file, if any, kept while this
    /// is: the owner then does not count as idle, and dropping it would
    /// free no disk.
    _holds: Holds,
    len: u64,
    /// Its bytes in [`Inner::filled`].
    charged: u64,
    origin: Origin,
    /// Opens that the kernel serves from it now.
    opens: AtomicUsize,
    /// When it was last opened ([`Backings`]' clock), for eviction.
    used: AtomicU64,
    /// Every page of it was found in the page cache once (see
    /// [`Backing::resident`]); set from the start for all but clones.
    resident: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backing")
            .field("file", &self.file)
            .field("len", &self.len)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Backing {
    /// A backing of `len` bytes in `file`, last opened at `used` ([`Backings`]'
    /// clock). All but a clone are resident from the start (see
    /// [`Backing::resident`]).
    fn new(file: File, holds: Holds, len: u64, origin: Origin, used: u64) -> Backing {
        let charged = match origin {
            Origin::Filled => charge_of(len, &holds),
            _ => 0,
        };
        Backing {
            file,
            _holds: holds,
            len,
            charged,
            origin,
            opens: AtomicUsize::new(0),
            used: AtomicU64::new(used),
            resident: std::sync::atomic::AtomicBool::new(origin != Origin::Cloned),
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Whether the kernel has all of it cached now, or had once. A clone
    /// shares the source's disk blocks but not its page cache: until its
    /// own pages are read in, a read of it is a read of the disk, several
    /// times slower than the daemon serving the source's cached pages.
    /// Pages dropped later are read back as any file's are.
    pub fn resident(&self) -> bool {
        if self.resident.load(Relaxed) {
            return true;
        }
        let all = all_cached(&self.file, self.len);
        if all {
            self.resident.store(true, Relaxed);
        }
        all
    }

    /// Bytes `[at, at+n)` of a filled file (cut at its end), for a read
    /// the daemon serves; `None` for a clone, whose pages may not be in
    /// memory when the source's are, and past the end.
    pub fn read(&self, at: u64, n: u64) -> Option<Vec<u8>> {
        let end = at.saturating_add(n).min(self.len);
        if self.origin != Origin::Filled || at >= end {
            return None;
        }
        read_range(&self.file, at, end)
    }

    /// Asks the disk for `[at, at+n)` of it, without waiting.
    fn will_need(&self, at: u64, n: u64) {
        let fd = std::os::unix::io::AsRawFd::as_raw_fd(&self.file);
        // SAFETY: fadvise only reads its integer arguments; `fd` is open
        // while `self` is.
        unsafe {
            libc::posix_fadvise(fd, at as i64, n as i64, libc::POSIX_FADV_WILLNEED);
        }
    }

    /// The most bytes one [`Self::will_need`] of it reads (see
    /// [`readahead_cap`]).
    fn readahead_step(&self) -> u64 {
        readahead_cap(&self.file)
    }

    /// Asks the disk for `[at, at+n)` of it in steps of `step`, while
    /// `go_on()` holds.
    fn will_need_steps(&self, at: u64, n: u64, step: u64, go_on: impl Fn() -> bool) {
        let mut k = 0;
        while k < n && go_on() {
            self.will_need(at + k, step.min(n - k));
            k += step;
        }
    }

    /// Reads `[at, at+n)` of a clone into the page cache and waits for it:
    /// asked of the disk in large folios (see [`Self::populate`]), then
    /// read into `buf`, a piece at a time, each piece twice. The first
    /// read also pays, here, what the first touch of a page the disk wrote
    /// costs on a VM (the hypervisor maps it then). The second read makes
    /// the kernel count the pages as used again (its active list), which
    /// the loader's first read would do otherwise: 6.9-7.2 GB/s for that
    /// load instead of 6.0-6.2 (BENCHMARKS.md, "Raw tensors backed by
    /// clones"). A page the disk
    /// cannot read is an error, as for any reader.
    pub fn read_in(&self, at: u64, n: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.populate(at, n);
        let mut k = 0;
        while k < n {
            let m = (n - k).min(buf.len() as u64) as usize;
            for _ in 0..2 {
                self.file.read_exact_at(&mut buf[..m], at + k)?;
            }
            k += m as u64;
        }
        Ok(())
    }

    /// Asks the disk for `[at, at+n)` (`at` on a page) through a mapping
    /// marked for huge pages (`MADV_HUGEPAGE`, then `MADV_POPULATE_READ`):
    /// the kernel then reads it into folios of up to 2 MiB. What
    /// `fadvise(WILLNEED)` reads in stays in 4 KiB pages, which a loader
    /// mapping the file faults in a few at a time: `np.load(mmap_mode="r")`
    /// of a clone-backed `.npy` ran at 4.0-4.3 GB/s with the clone read in
    /// that way, 8.4 GB/s this way, the source's own mapping 10.3 GB/s.
    /// Best effort: where either advice is refused, the reads that follow
    /// bring the pages in (in the folios the kernel's read-ahead makes).
    fn populate(&self, at: u64, n: u64) {
        let Ok(len) = usize::try_from(n) else {
            return;
        };
        // SAFETY: a read-only map of a clone the daemon made and nobody
        // writes (unlinked). No byte is read through it: the kernel fills
        // the page cache for MADV_POPULATE_READ, which fails (EFAULT)
        // rather than raising SIGBUS where a page cannot be read. It is
        // unmapped when dropped.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(at)
                .len(len)
                .map(&self.file)
        };
        if let Ok(map) = map {
            let _ = map.advise(memmap2::Advice::HugePage);
            let _ = map.advise(memmap2::Advice::PopulateRead);
        }
    }
}

/// Whether every page of the first `len` bytes of `file` is in the page
/// cache (`mincore` of a mapping that is never read through).
fn all_cached(file: &File, len: u64) -> bool {
    let Ok(n) = usize::try_from(len) else {
        return false;
    };
    if n == 0 {
        return true;
    }
    // SAFETY: a read-only map of a file the daemon made and nobody
    // writes (an unlinked clone); its bytes are never read through it,
    // only which pages are cached, and it is unmapped when dropped.
    let Ok(map) = (unsafe { memmap2::MmapOptions::new().len(n).map(file) }) else {
        return false;
    };
    let mut pages = vec![0u8; n.div_ceil(crate::source::page_size())];
    // SAFETY: `map` is a live mapping of `n` bytes at a page-aligned
    // address, and `pages` holds one byte per page of it, as mincore writes.
    let r = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, n, pages.as_mut_ptr()) };
    r == 0 && pages.iter().all(|p| p & 1 != 0)
}

/// Bytes `[at, end)` of `file`, in a buffer from the shared pool.
fn read_range(file: &File, at: u64, end: u64) -> Option<Vec<u8>> {
    let mut v = crate::serve::data::scratch::take();
    v.resize((end - at) as usize, 0);
    file.read_exact_at(&mut v, at).ok()?;
    Some(v)
}

/// One piece of an exposed file, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Bytes made at mount (a view's header).
    Bytes(Arc<Vec<u8>>),
    /// All of part `part` of tensor `tensor`, `len` bytes.
    Part {
        tensor: usize,
        part: usize,
        len: u64,
    },
}

/// What the last close of a file's served opens does with the backing
/// file their reads wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Fills what the reads did not write (or all of a new file).
    Rest,
    /// Keeps it only if the reads wrote all of it: a remote object's
    /// bytes are not fetched for a backing file.
    IfWhole,
    /// Drops what they wrote.
    Drop,
}

enum Slot {
    /// Written by the reads of served opens (see [`Partial`]).
    Writing(Arc<Partial>),
    /// Being filled, or sealed by the close that will fill it (its reads
    /// may still write through until the seal); opens meanwhile are served
    /// by the daemon, from what the reads of the served opens before wrote
    /// (the partial) and otherwise from the data layer, except when those
    /// reads wrote all of it: then opens wait the moment it takes to
    /// publish it (see [`Backings::ready_or_wait`]).
    Filling(Option<Arc<Partial>>),
    Ready(Arc<Backing>),
}

impl Slot {
    /// The file being written, by served opens' reads or its fill.
    fn being_written(&self) -> Option<Arc<Partial>> {
        match self {
            Slot::Writing(p) | Slot::Filling(Some(p)) => Some(p.clone()),
            _ => None,
        }
    }
}

/// A backing file written as the daemon serves its file's reads: each
/// range a read got from the data layer (checked, as every byte it
/// serves) is written here too. At the last close only what no read asked
/// for is left to fill: a whole read is decoded once, not again for its
/// backing file after its frames left the cache.
pub struct Partial {
    file: File,
    len: u64,
    written: Mutex<Written>,
    /// Notified when no [`Through`] is pending any more.
    settled: Condvar,
    /// The page cache of the file being read is dropped up to here (see
    /// [`Behind`]).
    dropped: AtomicU64,
}

/// The bytes of one read, sent to the reader before they are written
/// through to its file's [`Partial`]: the reader may close (and the close
/// seal the partial) before the daemon's write, so a sealing waits until
/// every `Through` made before it is dropped.
pub struct Through(Arc<Partial>);

impl Through {
    /// Its file's [`Partial`], to write to later (see
    /// [`Partial::through_if_open`]).
    pub fn partial(&self) -> Arc<Partial> {
        self.0.clone()
    }

    /// See [`Partial::offer`].
    pub fn offer(&self, at: u64, bytes: &[u8]) -> Option<(u64, u64)> {
        self.0.offer(at, bytes)
    }

    /// The ranges of the file's page cache to drop now (see [`Behind`]),
    /// with bytes at `at` just written through and `written` (from
    /// [`Self::offer`], or a file decoded whole) in the file: what is
    /// written of it from where the last drop ended to [`DROP_MARGIN`]
    /// behind `at`, once that is a [`DROP_STEP`] or more. What is not
    /// written yet (bytes the write-behind could not keep) stays for the
    /// drop at the end, so that a reader coming back to it is served
    /// without a decode; past it the drops go on (they stopped there, and
    /// the drop at the end took 0.2-0.3 s for a 3 GiB model, which the
    /// next open waits for).
    pub fn behind(&self, at: u64, written: (u64, u64)) -> Vec<(u64, u64)> {
        let dropped = &self.0.dropped;
        let from = dropped.load(Relaxed);
        let to = at.saturating_sub(DROP_MARGIN) / DROP_STEP * DROP_STEP;
        if to < from + DROP_STEP
            || dropped
                .compare_exchange(from, to, Relaxed, Relaxed)
                .is_err()
        {
            return Vec::new();
        }
        if written.0 <= from && to <= written.1 {
            return vec![(from, to)];
        }
        lock(&self.0.written).within(from, to)
    }
}

impl Drop for Through {
    fn drop(&mut self) {
        let mut w = lock(&self.0.written);
        w.pending -= 1;
        if w.pending == 0 {
            self.0.settled.notify_all();
        }
    }
}

impl Partial {
    /// A read's bytes are on their way to the reader, to be offered here
    /// once they are (see [`Through`]).
    pub fn through(self: &Arc<Self>) -> Through {
        lock(&self.written).pending += 1;
        Through(self.clone())
    }

    /// Like [`Self::through`], for bytes already sent, written later: `None`
    /// once it is sealed (a close does not wait for writes not begun;
    /// the fill writes what they would have).
    pub fn through_if_open(self: &Arc<Self>) -> Option<Through> {
        let mut w = lock(&self.written);
        if w.sealed || w.failed {
            return None;
        }
        w.pending += 1;
        drop(w);
        Some(Through(self.clone()))
    }

    /// Takes no more writes once those of the reads already answered are
    /// in (at most [`SEAL_WAIT`]): what they wrote.
    fn seal(&self) -> Written {
        let deadline = std::time::Instant::now() + SEAL_WAIT;
        let mut w = lock(&self.written);
        while w.pending > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                log::debug!(
                    "sealed a backing file with {} writes still pending: dropped",
                    w.pending
                );
                // They land later, beside the fill's writes of the same
                // bytes: the file is not kept (written once).
                w.failed = true;
                break;
            }
            w = self
                .settled
                .wait_timeout(w, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        w.sealed = true;
        w.clone()
    }

    /// Bytes `[at, at+n)` (cut at the end of the file) when they are
    /// written: a read of them needs no decode, and no cache.
    pub fn read(&self, at: u64, n: u64) -> Option<Vec<u8>> {
        let end = at.saturating_add(n).min(self.len);
        {
            let w = lock(&self.written);
            if at >= end || w.failed || !w.covers(at, end) {
                return None;
            }
        }
        read_range(&self.file, at, end)
    }

    /// Whether it is sealed with every byte written: nothing is left to
    /// fill, and it is published as soon as the filler's thread gets to it.
    fn whole(&self) -> bool {
        let w = lock(&self.written);
        w.sealed && !w.failed && w.covers(0, self.len)
    }

    /// Whether all but at most an eighth of it is written (see
    /// [`Backings::ready_or_wait`]).
    fn nearly_whole(&self) -> bool {
        lock(&self.written).nearly_covers(self.len)
    }

    /// Writes `bytes`, served at `at`: the written range they are in now,
    /// or `None` when they could not be written (a full disk leaves the
    /// file to be dropped at close).
    pub fn offer(&self, at: u64, bytes: &[u8]) -> Option<(u64, u64)> {
        let end = at + bytes.len() as u64;
        {
            let w = lock(&self.written);
            if bytes.is_empty() || w.failed || w.sealed {
                return None;
            }
            if let Some(r) = w.around(at, end) {
                return Some(r);
            }
        }
        match self.file.write_all_at(bytes, at) {
            Ok(()) => Some(lock(&self.written).add(at, end)),
            Err(e) => {
                warn_once(
                    &WRITE_FAILED,
                    format_args!("cannot write a backing file, served by the daemon: {e}"),
                );
                lock(&self.written).failed = true;
                None
            }
        }
    }
}

/// The ranges of a backing file written so far.
#[derive(Default, Clone)]
struct Written {
    /// Start -> end, disjoint and not touching.
    ranges: std::collections::BTreeMap<u64, u64>,
    failed: bool,
    /// The filler owns the file now: reads add nothing more (what they
    /// wrote is still read back).
    sealed: bool,
    /// Reads answered and not yet offered (see [`Through`]).
    pending: usize,
}

impl Written {
    /// Adds `[start, end)`; the written range it is part of now.
    fn add(&mut self, mut start: u64, mut end: u64) -> (u64, u64) {
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back()
            && e >= start
        {
            start = s;
            end = end.max(e);
        }
        let after: Vec<(u64, u64)> = self
            .ranges
            .range(start..=end)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in after {
            self.ranges.remove(&s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
        (start, end)
    }

    fn covers(&self, start: u64, end: u64) -> bool {
        self.around(start, end).is_some()
    }

    /// Whether all but at most an eighth of `len` bytes are written.
    fn nearly_covers(&self, len: u64) -> bool {
        let written: u64 = self.ranges.iter().map(|(s, e)| e - s).sum();
        !self.failed && written >= len - len / 8
    }

    /// The written ranges inside `[start, end)`, cut to it.
    fn within(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let first = self
            .around(start, start + 1)
            .map(|(s, _)| s)
            .unwrap_or(start);
        self.ranges
            .range(first..end)
            .map(|(&s, &e)| (s.max(start), e.min(end)))
            .filter(|(s, e)| s < e)
            .collect()
    }

    /// The written range holding all of `[start, end)`, if one does.
    fn around(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        self.ranges
            .range(..=start)
            .next_back()
            .filter(|(_, e)| **e >= end)
            .map(|(&s, &e)| (s, e))
    }
}

#[derive(Default)]
struct Inner {
    slots: HashMap<Content, Slot>,
    /// Bytes of filled files, ready or being filled.
    filled: u64,
    /// The fills queued or running that take room of their own, by key:
    /// a spill a read needs may stop one (see [`Backings::give_up_writing`]).
    fills: HashMap<Content, Queued>,
}

/// A file [`Backings::give_up_writing`] found, to give up if still there.
enum Giving {
    Writing(Arc<Partial>),
    Filling(Arc<AtomicBool>),
}

/// A fill queued or running: told to stop when its file is given up,
/// and when an open waits for it.
struct Queued {
    stop: Arc<AtomicBool>,
    wanted: Arc<AtomicBool>,
    /// See [`Job::started`].
    started: Arc<AtomicBool>,
    len: u64,
    charge: u64,
}

/// The fill of `key` that `stop` tells is over: no longer one to give up.
fn fill_over(inner: &mut Inner, key: &Content, stop: &Arc<AtomicBool>) {
    if inner
        .fills
        .get(key)
        .is_some_and(|q| Arc::ptr_eq(&q.stop, stop))
    {
        inner.fills.remove(key);
    }
}

/// Bytes of the filled files that are complete (the rest of
/// [`Inner::filled`] is being written).
fn ready_filled(inner: &Inner) -> u64 {
    inner
        .slots
        .values()
        .map(|s| match s {
            Slot::Ready(b) if b.origin == Origin::Filled => b.charged,
            _ => 0,
        })
        .sum()
}

/// Why a backing file was not made.
enum Made {
    NoRoom(String),
    Failed(std::io::Error),
}

/// A file to fill: `len` bytes of `segments` into `file`, then `key`'s.
struct Job {
    key: Content,
    /// Set when its file is given up for a spill: the fill stops, and
    /// neither publishes the file nor uncharges it again.
    stop: Arc<AtomicBool>,
    /// Set when an open waits for it: its pieces no longer wait for a
    /// quiet mount (see [`write_all`]).
    wanted: Arc<AtomicBool>,
    /// Set when its thread takes it from the queue: until then it waits
    /// behind other fills, which an open cannot hurry.
    started: Arc<AtomicBool>,
    /// The exposed file whose reads asked for it (see [`Filled`]).
    asked_by: u64,
    file: File,
    holds: Holds,
    len: u64,
    data: Arc<Data>,
    segments: Vec<Segment>,
    /// What reads wrote already.
    skip: Written,
}

/// Files to fill, on two threads: one for files whose served reads wrote
/// every byte (nothing left but publishing them, which an open may be
/// waiting for), one for the rest, which waits for a quiet mount before
/// each piece it decodes (see [`Activity`]) unless an open waits for it.
#[derive(Default)]
struct Queue {
    whole: std::collections::VecDeque<Job>,
    rest: std::collections::VecDeque<Job>,
    /// Whether a thread is working through each.
    running: [bool; 2],
}

impl Queue {
    fn of(&mut self, whole: bool) -> &mut std::collections::VecDeque<Job> {
        if whole {
            &mut self.whole
        } else {
            &mut self.rest
        }
    }
}

/// Told the exposed file (an inode number) whose reads asked for a
/// backing file, once that file is complete. The FUSE adapter drops the
/// kernel's page cache of that inode then: the daemon filled it while
/// serving those reads, passthrough opens never read it, and the kernel
/// would otherwise drop it inside the next open (10 ms for 64 MiB, on the
/// reader's clock).
pub type Filled = Arc<std::sync::OnceLock<Box<dyn Fn(u64) + Send + Sync>>>;

/// Told (inode, offset, length) of a part of an exposed file's page cache
/// that the daemon's replies filled while they were written through to
/// its backing file, now well behind the reader (see
/// [`Through::behind`]). The FUSE adapter drops it, on a thread of its
/// own: a loader's `mmap` of a decoded file fills that page cache, and
/// dropping it all at once when the backing file is complete (see
/// [`Filled`]) took 0.4 s for 3 GiB, which the next open waits for.
pub type Behind = Arc<std::sync::OnceLock<Box<dyn Fn(u64, u64, u64) + Send + Sync>>>;

pub struct Backings {
    opts: BackingOptions,
    filled_hook: Filled,
    behind_hook: Behind,
    queue: Mutex<Queue>,
    /// Set once `--cache-dir` could not clone a range of the source
    /// (another filesystem, or one without reflink): not tried again.
    no_clones: std::sync::atomic::AtomicBool,
    /// A clone could not be made (no block size for `--cache-dir`, no
    /// room, a disk error): logged as a warning the first time only.
    clone_failed: std::sync::atomic::AtomicBool,
    /// Most backing files at once, of every kind (see
    /// [`Backings::set_max_files`]).
    max_files: AtomicUsize,
    /// Set once a backing file could not be created: later failures are
    /// logged at debug level (a full table of descriptors fails every open).
    create_failed: std::sync::atomic::AtomicBool,
    /// Set once `--cache-dir` did not make a file in time: logged once.
    slow_dir: std::sync::atomic::AtomicBool,
    /// `--cache-dir`'s block size, which a cloned range must start on,
    /// once it could be read.
    block: std::sync::OnceLock<u64>,
    /// Makes clones and reads their pages in while nothing is being read.
    warmer: Warmer,
    inner: Mutex<Inner>,
    /// Notified when a slot becomes ready or is forgotten.
    published: Condvar,
    clock: AtomicU64,
    stats: Arc<Stats>,
    /// The bound filled files share with spills (`--decoded-cache-size`).
    disk: Arc<crate::serve::decoded_disk::DecodedDisk>,
    /// Drops an idle spill (see [`Backings::on_spills_full`]).
    free_spills: std::sync::OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
    /// The path in the mount of an exposed file (an inode number), for
    /// the log (see [`Backings::name_files_with`]).
    names: std::sync::OnceLock<Box<dyn Fn(u64) -> String + Send + Sync>>,
    /// The reads the daemon serves, which a fill's decodes wait out.
    activity: Activity,
}

impl Backings {
    pub fn new(
        opts: BackingOptions,
        stats: Arc<Stats>,
        disk: Arc<crate::serve::decoded_disk::DecodedDisk>,
    ) -> Backings {
        if opts.enabled && on_tmpfs(&opts.dir) {
            log::warn!(
                "{} is on tmpfs: decoded backing files there hold memory that cannot be \
                 reclaimed without swap (up to --decoded-cache-size, {} bytes)",
                opts.dir.display(),
                opts.limit
            );
        }
        Backings {
            opts,
            filled_hook: Filled::default(),
            behind_hook: Behind::default(),
            queue: Mutex::default(),
            no_clones: std::sync::atomic::AtomicBool::new(false),
            clone_failed: std::sync::atomic::AtomicBool::new(false),
            max_files: AtomicUsize::new(usize::MAX),
            create_failed: std::sync::atomic::AtomicBool::new(false),
            slow_dir: std::sync::atomic::AtomicBool::new(false),
            block: std::sync::OnceLock::new(),
            warmer: Warmer::default(),
            inner: Mutex::default(),
            published: Condvar::new(),
            clock: AtomicU64::new(0),
            stats,
            disk,
            free_spills: std::sync::OnceLock::new(),
            names: std::sync::OnceLock::new(),
            activity: Activity::default(),
        }
    }

    /// Where reads the daemon serves are counted (see [`Activity`]).
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    /// Sets the most backing files at once, of every kind (unbounded until
    /// set): each holds a descriptor, and the daemon must keep some for
    /// its sources, spills and sockets.
    pub fn set_max_files(&self, n: usize) {
        self.max_files.store(n, Relaxed);
    }

    /// Where to say that a backing file is complete (set once).
    pub fn filled_hook(&self) -> Filled {
        self.filled_hook.clone()
    }

    /// Where to say which page cache to drop behind a reader (set once).
    pub fn behind_hook(&self) -> Behind {
        self.behind_hook.clone()
    }

    /// Drops `[from, to)` of inode `ino`'s page cache, when told how.
    pub fn drop_behind(&self, ino: u64, (from, to): (u64, u64)) {
        if let Some(hook) = self.behind_hook.get() {
            hook(ino, from, to - from);
        }
    }

    pub fn enabled(&self) -> bool {
        self.opts.enabled
    }

    /// Backs files of content `key` by `file`, the source they are byte
    /// for byte.
    pub fn source(&self, key: &Content, file: File, len: u64) -> Arc<Backing> {
        let mut inner = lock(&self.inner);
        if let Some(Slot::Ready(b)) = inner.slots.get(key) {
            return b.clone();
        }
        let b = Arc::new(Backing::new(file, None, len, Origin::Source, 0));
        inner.slots.insert(key.clone(), Slot::Ready(b.clone()));
        drop(inner);
        self.published.notify_all();
        b
    }

    /// Backs files of content `key`, `head` then `len` bytes at `off` in
    /// `src`, by a file of `head` and a clone of that range under
    /// `--cache-dir`, when its filesystem shares blocks with `src`'s and
    /// the range and `head`'s end are on blocks (a view's header of whole
    /// blocks: the `.npy` of a large tensor). Costs no copy and no disk
    /// beyond `head` until the source changes; not counted in the limit.
    /// `None` where that cannot be: the first refusal to share blocks
    /// turns clones off; a want of room or a disk error fails this one.
    pub fn clone_of(
        &self,
        key: &Content,
        head: &[u8],
        (src, off, len): (&File, u64, u64),
    ) -> Option<Arc<Backing>> {
        if let Some(Slot::Ready(b)) = lock(&self.inner).slots.get(key) {
            return Some(b.clone());
        }
        let at = head.len() as u64;
        if !self.may_clone(off) || !self.may_clone(at) || !self.make_room(&mut lock(&self.inner), 0)
        {
            return None;
        }
        let made = tempfile::tempfile_in(&self.opts.dir).and_then(|dst| {
            dst.write_all_at(head, 0)?;
            Ok(dst)
        });
        let file = match made.map(|dst| (clone_range(src, off, len, &dst, at), dst)) {
            Ok((Ok(()), f)) => f,
            // A source cut short meanwhile (EINVAL past its end) is the
            // source's change, not the directory's.
            Ok((Err(e), _)) if cannot_share(&e) && covers(src, off + len) => {
                if !self.no_clones.swap(true, Relaxed) {
                    log::info!(
                        "{} cannot share blocks with the mounted file ({e}): raw tensors are \
                         served by the daemon",
                        self.opts.dir.display()
                    );
                }
                return None;
            }
            // No room, a disk error: this clone only; later ones may work.
            Ok((Err(e), _)) | Err(e) => {
                warn_once(
                    &self.clone_failed,
                    format_args!("cannot make a clone in {}: {e}", self.opts.dir.display()),
                );
                return None;
            }
        };
        let b = Arc::new(Backing::new(
            file,
            None,
            at + len,
            Origin::Cloned,
            self.clock.fetch_add(1, Relaxed),
        ));
        let mut inner = lock(&self.inner);
        // Another open may have cloned it meanwhile: one backing per key.
        if let Some(Slot::Ready(other)) = inner.slots.get(key) {
            return Some(other.clone());
        }
        // And clones of other keys may have taken the room found above
        // while the lock was not held: the count is checked again.
        if !self.make_room(&mut inner, 0) {
            return None;
        }
        inner.slots.insert(key.clone(), Slot::Ready(b.clone()));
        drop(inner);
        self.published.notify_all();
        Stats::add(&self.stats.backing_clones, 1);
        Some(b)
    }

    /// Whether a range at `off` of a source may be cloned: clones work so
    /// far, and `off` is on a block of `--cache-dir`'s filesystem.
    pub fn may_clone(&self, off: u64) -> bool {
        if !self.opts.enabled || self.no_clones.load(Relaxed) {
            return false;
        }
        // Not remembered when it fails (the directory gone for a while):
        // asked again at the next clone.
        let block = match self.block.get() {
            Some(&b) => b,
            None => match block_size(&self.opts.dir) {
                Ok(b) => *self.block.get_or_init(|| b),
                Err(e) => {
                    warn_once(
                        &self.clone_failed,
                        format_args!(
                            "no block size for {}: {e}; no clone until there is",
                            self.opts.dir.display()
                        ),
                    );
                    return false;
                }
            },
        };
        block > 0 && off.is_multiple_of(block)
    }

    /// Whether a close has taken the file of content `key` to seal and
    /// fill (or forget) it.
    #[cfg(test)]
    pub(crate) fn sealing(&self, key: &Content) -> bool {
        matches!(
            lock(&self.inner).slots.get(key),
            Some(Slot::Filling(Some(_)))
        )
    }

    /// The backing of files of content `key`, if there is a complete one.
    pub fn ready(&self, key: &Content) -> Option<Arc<Backing>> {
        match lock(&self.inner).slots.get(key) {
            Some(Slot::Ready(b)) => Some(b.clone()),
            _ => None,
        }
    }

    /// Like [`Self::ready`], for a read: `None` while another thread holds
    /// the record of backing files (one may be closing a file on a disk
    /// that does not answer), so that no read waits for it.
    pub fn ready_now(&self, key: &Content) -> Option<Arc<Backing>> {
        match self.inner.try_lock().ok()?.slots.get(key) {
            Some(Slot::Ready(b)) => Some(b.clone()),
            _ => None,
        }
    }

    /// Like [`Self::ready`], but when the reads of the last served opens
    /// wrote every byte of it and only its publication is pending (the
    /// kernel dropping the inode's page cache, see [`Filled`]), waits for
    /// that, at most [`PUBLISH_WAIT`]: an open served meanwhile would fill
    /// that page cache again (a model loaded twice in a row, by `mmap`),
    /// and the next passthrough open would wait for its drop instead.
    /// When they wrote all but an eighth of it, waits at most
    /// [`NEARLY_WAIT`] for the fill of the rest, which then no longer
    /// waits for a quiet mount; so, once told that no served open holds
    /// the file any more (`closing`: its last close is under way, and the
    /// file not yet handed to the filler), does an open whose reads wrote
    /// that much. A loader's second load opens the file the moment its
    /// first closed it (1 ms later on a 16-core host), and served, it read
    /// the whole file through the daemon while the file was published, and
    /// its open kept the next load from being passed through until the
    /// page cache it filled was dropped.
    ///
    /// No wait where it would be for nothing: beside a served open of the
    /// file (this open is served whatever it finds), nor for a fill
    /// queued behind others (which wait for a quiet mount), once the
    /// close had time to hand it over ([`HANDOVER`]).
    pub fn ready_or_wait(&self, key: &Content, closing: bool) -> Option<Arc<Backing>> {
        let start = std::time::Instant::now();
        // When its fill was first seen queued and not yet taken.
        let mut queued_seen = None;
        let mut inner = lock(&self.inner);
        loop {
            let wait = match inner.slots.get(key) {
                Some(Slot::Ready(b)) => return Some(b.clone()),
                _ if !closing => return None,
                Some(Slot::Filling(Some(p))) if p.whole() => PUBLISH_WAIT,
                Some(Slot::Filling(Some(p))) if p.nearly_whole() => NEARLY_WAIT,
                Some(Slot::Writing(p)) if p.nearly_whole() => NEARLY_WAIT,
                _ => return None,
            };
            // Woken by each change it waits on (the file handed over, its
            // fill queued, published or given up), or at its deadline.
            let mut until = start + wait;
            // Its fill, once queued, goes on without waiting for quiet.
            if let Some(q) = inner.fills.get(key) {
                q.wanted.store(true, Relaxed);
                if wait == NEARLY_WAIT && !q.started.load(Relaxed) {
                    let since = *queued_seen.get_or_insert_with(std::time::Instant::now);
                    until = until.min(since + HANDOVER);
                }
            }
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            inner = self
                .published
                .wait_timeout(inner, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The backing file being written for files of content `key`, when
    /// there is one (served opens' reads write it, or its fill does).
    pub fn being_written(&self, key: &Content) -> Option<Arc<Partial>> {
        lock(&self.inner).slots.get(key)?.being_written()
    }

    /// At a served open's read from the start of a file of content `key`
    /// (`len` bytes) whose bytes take work: a backing file its reads
    /// write through to (see [`Partial`]), made now unless one is there
    /// already, being made or filled, or has no room.
    pub fn begin(&self, key: &Content, len: u64) -> Option<Arc<Partial>> {
        if let Some(slot) = lock(&self.inner).slots.get(key) {
            return slot.being_written();
        }
        let file = self.reserve(key, len)?;
        let p = Arc::new(Partial {
            file,
            len,
            written: Mutex::default(),
            settled: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        lock(&self.inner)
            .slots
            .insert(key.clone(), Slot::Writing(p.clone()));
        Some(p)
    }

    /// At the last close of the served files of content `key` (`len`
    /// bytes, made of `segments`): completes, keeps or drops the backing
    /// file their reads wrote, as `fill` says (a peek at a large tensor
    /// keeps no disk).
    pub fn close(
        self: &Arc<Self>,
        key: &Content,
        asked_by: u64,
        len: u64,
        fill: Fill,
        data: &Arc<Data>,
        segments: Vec<Segment>,
    ) {
        // Taken from `Writing` under the lock, so that a close racing this
        // one (the next open's, while this one waits in `seal`) finds it
        // taken and leaves it: the file is kept or forgotten once.
        let partial = {
            let mut inner = lock(&self.inner);
            match inner.slots.get(key) {
                Some(Slot::Writing(p)) => {
                    let p = p.clone();
                    inner
                        .slots
                        .insert(key.clone(), Slot::Filling(Some(p.clone())));
                    // An open waiting for the close to hand it over.
                    self.published.notify_all();
                    Some(p)
                }
                Some(_) => return,
                None => None,
            }
        };
        let (file, skip) = match partial {
            Some(p) => {
                let written = p.seal();
                let file = p.file.try_clone();
                let keep = match fill {
                    Fill::Rest => true,
                    Fill::IfWhole => written.covers(0, len),
                    Fill::Drop => false,
                };
                match (keep && !written.failed, file) {
                    (true, Ok(file)) => (file, written),
                    _ => return self.forget(key, len),
                }
            }
            None if fill == Fill::Rest => match self.reserve(key, len) {
                Some(file) => (file, Written::default()),
                None => return,
            },
            None => return,
        };
        let whole = skip.covers(0, len);
        let job = Job {
            key: key.clone(),
            stop: Arc::default(),
            wanted: Arc::default(),
            started: Arc::default(),
            asked_by,
            file,
            holds: None,
            len,
            data: data.clone(),
            segments,
            skip,
        };
        self.queue(job, whole);
    }

    /// Makes `file`, which holds every byte of files of content `key`
    /// already (the unit or spill their tensor was decoded into, checked;
    /// nobody writes it any more), their backing, keeping `holds` (its
    /// owner) while it is: as a file whose reads wrote all of it,
    /// published by the filler's thread, which writes nothing and has the
    /// kernel drop the page cache of inode `asked_by` first. False when
    /// another file is being filled or ready for `key`, or there is no
    /// room.
    pub fn adopt(
        self: &Arc<Self>,
        key: &Content,
        asked_by: u64,
        (file, holds, len): (File, Holds, u64),
        data: &Arc<Data>,
        segments: Vec<Segment>,
    ) -> bool {
        let Ok(read_back) = file.try_clone() else {
            return false;
        };
        let mut skip = Written::default();
        skip.add(0, len);
        skip.sealed = true;
        let p = Arc::new(Partial {
            file: read_back,
            len,
            written: Mutex::new(skip.clone()),
            settled: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        {
            let mut inner = lock(&self.inner);
            // A file the reads wrote through to has its room counted
            // already; what they wrote is not needed.
            let writing = match inner.slots.get(key) {
                Some(Slot::Writing(_)) => true,
                None => false,
                Some(_) => return false,
            };
            let charge = charge_of(len, &holds);
            if writing {
                self.uncharge(&mut inner, len - charge);
            } else {
                if !self.make_room(&mut inner, charge) {
                    return false;
                }
                inner.filled += charge;
            }
            inner.slots.insert(key.clone(), Slot::Filling(Some(p)));
        }
        Stats::add(&self.stats.backing_decoded, 1);
        let job = Job {
            key: key.clone(),
            stop: Arc::default(),
            wanted: Arc::default(),
            started: Arc::default(),
            asked_by,
            file,
            holds,
            len,
            data: data.clone(),
            segments,
            skip,
        };
        self.queue(job, true);
        true
    }

    /// Room and an empty file of `len` bytes for `key`, whose slot it takes
    /// (as being filled); `None` when there is no room or no file.
    fn reserve(&self, key: &Content, len: u64) -> Option<File> {
        let mut inner = lock(&self.inner);
        if inner.slots.contains_key(key) {
            return None;
        }
        if !self.make_room(&mut inner, len) {
            log::debug!(
                "no room for a {len}-byte backing file (limit {}); served by the daemon",
                self.opts.limit
            );
            return None;
        }
        // The files being written take their disk as they are written:
        // the room they will take is counted as if they had it now, so
        // that fills side by side leave the directory its free quarter.
        let pending = inner.filled.saturating_sub(ready_filled(&inner));
        inner.filled += len;
        inner.slots.insert(key.clone(), Slot::Filling(None));
        drop(inner);
        // On the cache directory's thread, waited for a short while: a
        // worker must not wait on a disk that does not answer.
        let dir = self.opts.dir.clone();
        let made = crate::serve::deadline::within(move || {
            crate::serve::spill::room(&dir, len + pending).map_err(Made::NoRoom)?;
            // Sized, not reserved: pieces are written with pwrite, so a
            // disk that fills fails that write (and the fill), never a
            // fault; and a file written into `fallocate`d space reads back
            // slower (40 ms against 28 for 64 MiB here).
            tempfile::tempfile_in(&dir)
                .and_then(|f| f.set_len(len).map(|_| f))
                .map_err(Made::Failed)
        });
        match made {
            Some(Ok(f)) => Some(f),
            Some(Err(Made::NoRoom(why))) => {
                log::debug!("no backing file of {len} bytes: {why}");
                self.forget(key, len);
                None
            }
            Some(Err(Made::Failed(e))) => {
                warn_once(
                    &self.create_failed,
                    format_args!(
                        "cannot create a backing file in {}: {e} (the file is served by the \
                         daemon; later failures are logged at debug level)",
                        self.opts.dir.display()
                    ),
                );
                self.forget(key, len);
                None
            }
            None => {
                warn_once(
                    &self.slow_dir,
                    format_args!(
                        "{} did not make a backing file within {:?} (a frozen or hung \
                         disk?): files are served by the daemon until it does (logged once)",
                        self.opts.dir.display(),
                        crate::serve::deadline::DEADLINE
                    ),
                );
                self.forget(key, len);
                None
            }
        }
    }

    /// Queues `job`, on the thread for files with nothing left to write
    /// when it is `whole` (an open may be waiting for it).
    fn queue(self: &Arc<Self>, job: Job, whole: bool) {
        let (key, charge) = (job.key.clone(), charge_of(job.len, &job.holds));
        if charge > 0 {
            let queued = Queued {
                stop: job.stop.clone(),
                wanted: job.wanted.clone(),
                started: job.started.clone(),
                len: job.len,
                charge,
            };
            lock(&self.inner).fills.insert(key.clone(), queued);
            // An open waiting for the file marks its fill wanted.
            self.published.notify_all();
        }
        let mut queue = lock(&self.queue);
        queue.of(whole).push_back(job);
        if !queue.running[whole as usize] {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name(
                    if whole {
                        "zt-backing-whole"
                    } else {
                        "zt-backing"
                    }
                    .into(),
                )
                .spawn(move || me.run_queue(whole));
            match spawned {
                Ok(_) => queue.running[whole as usize] = true,
                Err(e) => {
                    log::warn!("cannot start a backing file's filler: {e}");
                    // No thread was running, so the queue held only this job.
                    let stop = queue.of(whole).pop_front().map(|j| j.stop);
                    drop(queue);
                    if !stop.is_some_and(|s| self.given_up(&key, &s)) {
                        self.forget(&key, charge);
                    }
                }
            }
        }
    }

    /// Fills queued files one after another (each on every core), until
    /// none is left: a model's first load opens hundreds of tensors at
    /// once, and filling them all at once would only fight over the cache.
    fn run_queue(&self, whole: bool) {
        loop {
            let job = {
                let mut queue = lock(&self.queue);
                match queue.of(whole).pop_front() {
                    Some(j) => {
                        j.started.store(true, Relaxed);
                        j
                    }
                    None => {
                        queue.running[whole as usize] = false;
                        return;
                    }
                }
            };
            // A fill that panics leaves its file to the daemon and the
            // queue running: the files behind it still get filled.
            let (key, charge) = (job.key.clone(), charge_of(job.len, &job.holds));
            let (asked_by, stop) = (job.asked_by, job.stop.clone());
            let fill = std::panic::AssertUnwindSafe(|| self.fill(job));
            if std::panic::catch_unwind(fill).is_err() && !self.given_up(&key, &stop) {
                log::error!(
                    "filling the backing file of {} failed (a panic): it stays served by the daemon",
                    self.name(asked_by)
                );
                self.forget(&key, charge);
            }
        }
    }

    /// Frees backing files no open holds, least recently opened first,
    /// until one more file, of `len` more filled bytes, fits: filled files
    /// for the bytes, filled or cloned ones for the count. False when they
    /// cannot.
    /// On success `len` is charged to the bound, for the caller to add to
    /// [`Inner::filled`].
    fn make_room(&self, inner: &mut Inner, len: u64) -> bool {
        let max = self.max_files.load(Relaxed);
        while inner.slots.len() >= max {
            if !self.evict_one(inner, true) {
                log::debug!(
                    "{} backing files, all open: no more (at most {max}); served by the daemon",
                    inner.slots.len(),
                );
                return false;
            }
        }
        // Spills share the bound: idle ones go too, after idle files.
        while !self.disk.charge_filled(len) {
            let freed =
                self.evict_one(inner, false) || self.free_spills.get().is_some_and(|free| free());
            if !freed {
                return false;
            }
        }
        true
    }

    /// Sets who drops an idle spill when filled files need its share of
    /// the bound (the data layer; true when one went).
    pub fn on_spills_full(&self, free: Box<dyn Fn() -> bool + Send + Sync>) {
        let _ = self.free_spills.set(free);
    }

    /// Names exposed files (inode numbers) in the log by `path`: the
    /// backing files know only what they hold and which file asked.
    pub fn name_files_with(&self, path: Box<dyn Fn(u64) -> String + Send + Sync>) {
        let _ = self.names.set(path);
    }

    /// The path of exposed file `ino`, as the log names it.
    fn name(&self, ino: u64) -> String {
        match self.names.get().map(|path| path(ino)) {
            Some(p) if !p.is_empty() => p,
            _ => format!("inode {ino}"),
        }
    }

    /// Takes `len` bytes off the filled files' count and the bound.
    fn uncharge(&self, inner: &mut Inner, len: u64) {
        inner.filled = inner.filled.saturating_sub(len);
        self.disk.release_filled(len);
    }

    /// Frees the least recently opened filled file no open holds, for a
    /// spill that needs its disk. False when there is none.
    pub fn drop_idle(&self) -> bool {
        self.evict_one(&mut lock(&self.inner), false)
    }

    /// Gives up the files that the reads of served opens write through
    /// to, and those being filled after their last close, where `mine`
    /// (given the content and the file's length) says so: files of a
    /// tensor that spills and that cannot be kept beside its spill, or
    /// (copies kept for speed) any, for a spill a read needs. A tensor
    /// that spills is never written there (the spill becomes the tensor's
    /// own backing file, and a view's fill would read the spill back).
    /// Their reads write nothing more, and read nothing back from them; a
    /// fill stops at its next piece. `mine` is asked outside the lock (a
    /// view's file may list 10^5 tensors). At most `most` files, the
    /// largest first. A fill given up while still queued leaves the queue
    /// at once, its file closed: its written blocks would otherwise stay
    /// on disk, past the bound that no longer counts them, until the fills
    /// ahead of it are done. False when there is none.
    pub fn give_up_writing(&self, mine: impl Fn(&Content, u64) -> bool, most: usize) -> bool {
        let mut found: Vec<(Content, u64, Giving)> = {
            let inner = lock(&self.inner);
            let writing = inner.slots.iter().filter_map(|(key, s)| match s {
                Slot::Writing(p) => Some((key.clone(), p.len, Giving::Writing(p.clone()))),
                _ => None,
            });
            let filling = inner
                .fills
                .iter()
                .map(|(key, q)| (key.clone(), q.len, Giving::Filling(q.stop.clone())));
            writing.chain(filling).collect()
        };
        found.sort_by_key(|f| std::cmp::Reverse(f.1));
        let (mut gave_up, mut filling) = (0, false);
        for (key, len, giving) in found.into_iter().filter(|(key, len, _)| mine(key, *len)) {
            if gave_up == most {
                break;
            }
            let mut inner = lock(&self.inner);
            // Still the same file, not sealed by a close or published
            // meanwhile.
            let charge = match (&giving, inner.slots.get(&key)) {
                (Giving::Writing(p), Some(Slot::Writing(q))) if Arc::ptr_eq(p, q) => {
                    lock(&p.written).failed = true;
                    len
                }
                (Giving::Filling(stop), Some(Slot::Filling(partial)))
                    if inner
                        .fills
                        .get(&key)
                        .is_some_and(|q| Arc::ptr_eq(&q.stop, stop)) =>
                {
                    if let Some(p) = partial {
                        lock(&p.written).failed = true;
                    }
                    stop.store(true, Relaxed);
                    filling = true;
                    inner.fills.remove(&key).map_or(0, |q| q.charge)
                }
                _ => continue,
            };
            inner.slots.remove(&key);
            self.uncharge(&mut inner, charge);
            gave_up += 1;
            log::debug!("gave up the {len}-byte backing file of {key:?} for a spill");
        }
        if filling {
            self.unqueue_stopped();
        }
        if gave_up > 0 {
            self.published.notify_all();
        }
        gave_up > 0
    }

    /// Takes the fills told to stop out of the queue (a running one sees
    /// it at its next piece), closing their files outside the lock (a
    /// disk that does not answer must not hold the queue).
    fn unqueue_stopped(&self) {
        let stopped: Vec<Job> = {
            let mut guard = lock(&self.queue);
            let queue = &mut *guard;
            let mut out = Vec::new();
            for q in [&mut queue.rest, &mut queue.whole] {
                let (gone, kept): (Vec<Job>, Vec<Job>) =
                    q.drain(..).partition(|j| j.stop.load(Relaxed));
                q.extend(kept);
                out.extend(gone);
            }
            out
        };
        drop(stopped);
    }

    /// Frees the least recently opened filled file no open holds (or
    /// cloned one too, where `clones`: they free a descriptor, not disk).
    fn evict_one(&self, inner: &mut Inner, clones: bool) -> bool {
        let victim = inner
            .slots
            .iter()
            .filter_map(|(key, s)| match s {
                Slot::Ready(b)
                    if (b.origin == Origin::Filled || clones && b.origin == Origin::Cloned)
                        && b.opens.load(Relaxed) == 0 =>
                {
                    Some((key, b.used.load(Relaxed), b))
                }
                _ => None,
            })
            .min_by_key(|&(_, used, _)| used)
            .map(|(key, _, b)| (key.clone(), b.origin, b.len, b.charged));
        let Some((key, origin, len, charged)) = victim else {
            return false;
        };
        inner.slots.remove(&key);
        if origin == Origin::Filled {
            self.uncharge(inner, charged);
        }
        Stats::add(&self.stats.backing_evictions, 1);
        log::debug!("dropped the {len}-byte backing file of {key:?} to make room");
        true
    }

    /// Drops the clone that backs files of content `key` (one made from a
    /// source that changed meanwhile), unless an open holds it.
    pub fn forget_clone(&self, key: &Content) {
        let mut inner = lock(&self.inner);
        if let Some(Slot::Ready(b)) = inner.slots.get(key)
            && b.origin == Origin::Cloned
            && b.opens.load(Relaxed) == 0
        {
            inner.slots.remove(key);
        }
    }

    fn forget(&self, key: &Content, len: u64) {
        let mut inner = lock(&self.inner);
        inner.slots.remove(key);
        self.uncharge(&mut inner, len);
        self.published.notify_all();
    }

    /// An open now served from `b`. The first open of the source itself
    /// also asks the disk for all of it at once (see [`warm`]).
    pub fn opened(&self, b: &Arc<Backing>) {
        // A filled file was written by the daemon, a clone read in by the
        // warmer before its first open: only the source may be cold.
        if b.opens.fetch_add(1, Relaxed) == 0 && b.origin == Origin::Source {
            warm(b.clone());
        }
        b.used.store(self.clock.fetch_add(1, Relaxed), Relaxed);
        self.warmer.backed(true);
        Stats::add(&self.stats.passthrough_opens, 1);
    }

    /// The daemon serves opens of `n` inodes now: clones are made and read
    /// in only while it serves none (and the kernel none from a backing).
    pub fn served_inodes(&self, n: usize) {
        self.warmer.served(n);
    }

    /// Clones still to be made or read in.
    pub fn warming(&self) -> u64 {
        self.warmer.pending()
    }

    /// Queues a clone to be made and read in while nothing is being read
    /// (see [`Warmer`]).
    pub fn warm_clone(&self, job: CloneJob) {
        self.warmer.queue(job);
    }

    /// Drops the kernel's page cache of inode `ino`, whose files are
    /// passed through from now on (as a filled file's, see [`Filled`]).
    pub fn drop_inode_cache(&self, ino: u64) {
        if let Some(hook) = self.filled_hook.get() {
            hook(ino);
        }
    }

    /// That open was closed (or never made it to the kernel).
    pub fn closed(&self, b: &Backing) {
        b.opens.fetch_sub(1, Relaxed);
        self.warmer.backed(false);
    }

    /// (Bytes of filled backing files, how many are being filled) now.
    /// Whether no fill is queued or running.
    #[cfg(test)]
    pub fn fills_done(&self) -> bool {
        !lock(&self.queue).running.iter().any(|&r| r)
    }

    pub fn gauges(&self) -> (u64, u64) {
        let inner = lock(&self.inner);
        let filling = inner
            .slots
            .values()
            .filter(|s| matches!(s, Slot::Filling(_) | Slot::Writing(_)))
            .count();
        (inner.filled, filling as u64)
    }

    /// Fills the job's file with the bytes of its segments, on every core,
    /// and makes it its key's backing once all are there. Reads go through
    /// the data layer, so nothing is written that failed a check; a failure
    /// (logged by the data layer) leaves the key unbacked, to be tried again
    /// by a later open. The hook hears of the file before opens can take it,
    /// so the page cache it drops is gone by the first passthrough open.
    fn fill(&self, job: Job) {
        let Job {
            key,
            stop,
            wanted,
            started: _,
            asked_by,
            file,
            holds,
            len,
            data,
            segments,
            skip,
        } = job;
        let t0 = std::time::Instant::now();
        let pace = Pace {
            activity: &self.activity,
            stop: &stop,
            wanted: &wanted,
        };
        let wrote = match write_all(&file, len, &data, &segments, &skip, &pace) {
            Ok(n) => n,
            Err(_) if self.given_up(&key, &stop) => {
                log::debug!("{}: its backing file's fill stopped", self.name(asked_by));
                return;
            }
            Err(why) => {
                warn_once(
                    &WRITE_FAILED,
                    format_args!(
                        "{} stays served by the daemon: its backing file: {why}",
                        self.name(asked_by)
                    ),
                );
                self.forget(&key, charge_of(len, &holds));
                return;
            }
        };
        // All its bytes are in the file now: what the reads and the fill
        // left of them in the daemon's memory goes (see `Data::copied_all`).
        data.copied_all(segments.iter().filter_map(|s| match *s {
            Segment::Part { tensor, part, len } => Some((tensor, part, (0, len))),
            Segment::Bytes(_) => None,
        }));
        let t1 = std::time::Instant::now();
        self.drop_inode_cache(asked_by);
        log::debug!(
            "{}: backing file of {len} bytes: {wrote} written by the filler in {:?}, \
             the inode's page cache dropped in {:?}",
            self.name(asked_by),
            t1 - t0,
            t1.elapsed()
        );
        self.publish(key, file, holds, len, &stop);
    }

    /// The fill of `key` that `stop` tells is over: whether its file was
    /// given up meanwhile, which leaves it neither to publish nor to
    /// uncharge (see [`Self::give_up_writing`]).
    fn given_up(&self, key: &Content, stop: &Arc<AtomicBool>) -> bool {
        fill_over(&mut lock(&self.inner), key, stop);
        stop.load(Relaxed)
    }

    /// Makes `file`, complete, the backing of files of content `key`,
    /// unless its fill was told to `stop`.
    fn publish(&self, key: Content, file: File, holds: Holds, len: u64, stop: &Arc<AtomicBool>) {
        let mut inner = lock(&self.inner);
        fill_over(&mut inner, &key, stop);
        if stop.load(Relaxed) {
            return;
        }
        Stats::add(&self.stats.backing_files, 1);
        Stats::add(&self.stats.backing_bytes, len);
        let b = Arc::new(Backing::new(
            file,
            holds,
            len,
            Origin::Filled,
            self.clock.fetch_add(1, Relaxed),
        ));
        inner.slots.insert(key, Slot::Ready(b));
        drop(inner);
        self.published.notify_all();
    }
}

/// Clones `len` bytes at `off` of `src` into `dst` at `at`: the
/// block-aligned part by `FICLONERANGE`, a last partial block by a copy.
/// `off` and `at` must be on blocks ([`Backings::may_clone`]); an error
/// when the filesystems cannot share blocks.
fn clone_range(src: &File, off: u64, len: u64, dst: &File, at: u64) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let block = block_size_of(dst)?;
    let whole = len / block * block;
    if whole > 0 {
        let arg = libc::file_clone_range {
            src_fd: src.as_raw_fd() as i64,
            src_offset: off,
            src_length: whole,
            dest_offset: at,
        };
        // SAFETY: both descriptors are open for the call; the kernel only
        // reads `arg`, a valid struct of the type FICLONERANGE takes.
        let r = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONERANGE, &arg) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if whole < len {
        let mut tail = vec![0u8; (len - whole) as usize];
        src.read_exact_at(&mut tail, off + whole)?;
        dst.write_all_at(&tail, at + whole)?;
    }
    dst.set_len(at + len)?;
    Ok(())
}

/// Whether `FICLONERANGE` failed because the two files cannot share blocks
/// (other filesystems, one without reflink, a range it will not clone),
/// not for want of room or a disk error.
fn cannot_share(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EXDEV | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOTTY | libc::EPERM)
    )
}

/// Raised once a backing file could not be written or filled (a disk
/// error, no room on `--cache-dir`, a read of the source that failed):
/// the first is a warning, so that a mount whose files stay served by the
/// daemon says why; the rest are for debugging only.
static WRITE_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Logs `why` as a warning the first time `flag` is raised, then for
/// debugging only: a model's load would repeat it for every tensor.
fn warn_once(flag: &std::sync::atomic::AtomicBool, why: std::fmt::Arguments<'_>) {
    let level = match flag.swap(true, Relaxed) {
        false => log::Level::Warn,
        true => log::Level::Debug,
    };
    log::log!(level, "{why}");
}

/// Whether `f` still holds its first `end` bytes.
fn covers(f: &File, end: u64) -> bool {
    f.metadata().is_ok_and(|m| m.len() >= end)
}

/// The block size of the filesystem `dir` is on: what clone ranges align to.
fn block_size(dir: &std::path::Path) -> std::io::Result<u64> {
    block_size_of(&File::open(dir)?)
}

fn block_size_of(f: &File) -> std::io::Result<u64> {
    use std::os::unix::io::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `f` is open and `st` a buffer of the type fstatfs fills.
    if unsafe { libc::fstatfs(f.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so it filled `st`.
    let bs = unsafe { st.assume_init() }.f_bsize;
    Ok((bs as u64).max(512))
}

/// Whether `dir` is on tmpfs.
fn on_tmpfs(dir: &std::path::Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a valid C string and `st` a buffer of the right type,
    // written by statfs before it is read (only on success).
    let r = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    // SAFETY: statfs succeeded, so it filled `st`.
    #[allow(clippy::unnecessary_cast)] // f_type is not i64 on every target
    let tmpfs = r == 0 && unsafe { st.assume_init() }.f_type as i64 == TMPFS_MAGIC;
    tmpfs
}

/// Most bytes asked of the disk by one `posix_fadvise(WILLNEED)`.
const WARM_STEP: u64 = 64 << 20;

/// Asks the disk for all of `b`'s bytes, from a thread of its own, so a
/// cold load gets deep, parallel reads instead of the kernel's readahead
/// behind each fault or read alone. Pages already cached cost a lookup.
/// It stops when no open reads `b` any more.
fn warm(b: Arc<Backing>) {
    let _ = std::thread::Builder::new()
        .name("zt-warm".into())
        .spawn(move || {
            let step = b.readahead_step();
            b.will_need_steps(0, b.len, step, || b.opens.load(Relaxed) > 0);
        });
}

/// The most bytes of `file` one `posix_fadvise(WILLNEED)` reads: the
/// kernel cuts each call to the larger of its disk's read-ahead and
/// largest request (`force_page_cache_ra`), so a longer step would read
/// its first few MiB only. From sysfs, for a disk or a partition of one;
/// the kernel's default read-ahead (128 KiB) where sysfs does not say
/// (btrfs, whose files name no disk).
fn readahead_cap(file: &File) -> u64 {
    const DEFAULT: u64 = 128 << 10;
    let Ok(dev) = file
        .metadata()
        .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
    else {
        return DEFAULT;
    };
    let base = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
    let kib = |name: &str| {
        [
            format!("{base}/queue/{name}"),
            format!("{base}/../queue/{name}"),
        ]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok())
    };
    match kib("read_ahead_kb").max(kib("max_sectors_kb")) {
        Some(k) => (k << 10).clamp(crate::source::page_size() as u64, WARM_STEP),
        None => DEFAULT,
    }
}

/// One piece of work for a filling worker: bytes `[at, at+len)` of part
/// `(tensor, part)`, written at `to`.
struct Piece {
    tensor: usize,
    part: usize,
    at: u64,
    len: u64,
    to: u64,
}

/// When a fill's pieces go, and whether it is to stop.
struct Pace<'a> {
    activity: &'a Activity,
    /// See [`Job::stop`].
    stop: &'a AtomicBool,
    /// See [`Job::wanted`].
    wanted: &'a AtomicBool,
}

impl Pace<'_> {
    /// Waits until the mount is quiet, an open waits for the file, or
    /// [`FILL_PATIENCE`] has passed (a mount never quiet, a reader that
    /// never pauses, still gets its files, a piece now and then); whether
    /// to go on.
    fn go(&self) -> bool {
        let asked = std::time::Instant::now();
        self.activity.wait_quiet(|| {
            self.stop.load(Relaxed) || self.wanted.load(Relaxed) || asked.elapsed() >= FILL_PATIENCE
        });
        !self.stop.load(Relaxed)
    }
}

/// Writes `segments` into `file` (sized) in order, but for what `skip`
/// says is there; parts in [`CHUNK`]s taken by one worker per core, each
/// when `pace` says: what the reads did not write is decoded again, and a
/// load going on must not wait for that, unless it waits for the file.
/// The bytes of parts it wrote.
fn write_all(
    file: &File,
    len: u64,
    data: &Data,
    segments: &[Segment],
    skip: &Written,
    pace: &Pace<'_>,
) -> Result<u64, String> {
    let io = |e: std::io::Error| format!("cannot write a backing file: {e}");
    let mut pieces = Vec::new();
    let mut to = 0u64;
    for s in segments {
        match s {
            Segment::Bytes(b) => {
                file.write_all_at(b, to).map_err(io)?;
                to += b.len() as u64;
            }
            &Segment::Part { tensor, part, len } => {
                let mut at = 0;
                while at < len {
                    let n = CHUNK.min(len - at);
                    if skip.covers(to + at, to + at + n) {
                        at += n;
                        continue;
                    }
                    pieces.push(Piece {
                        tensor,
                        part,
                        at,
                        len: n,
                        to: to + at,
                    });
                    at += n;
                }
                to += len;
            }
        }
    }
    if to != len {
        return Err(format!("its pieces make {to} bytes, not {len}"));
    }
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<String>> = Mutex::new(None);
    // One write at a time: writes to one file take its inode lock, and a
    // worker waiting there spins on the other's write (a fifth of the
    // fill's CPU in a profile); waiting here it sleeps, and the other
    // workers go on decoding.
    let writing = Mutex::new(());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers.min(pieces.len()) {
            s.spawn(|| {
                while lock(&failed).is_none() {
                    let Some(p) = pieces.get(next.fetch_add(1, Relaxed)) else {
                        return;
                    };
                    if !pace.go() {
                        lock(&failed).get_or_insert_with(|| "given up".into());
                        return;
                    }
                    let r = data
                        .read(p.tensor, p.part, p.at, p.len)
                        .map_err(|e| e.to_string())
                        .and_then(|bytes| {
                            if bytes.len() as u64 != p.len {
                                return Err(format!(
                                    "read {} bytes of {} at {}",
                                    bytes.len(),
                                    p.len,
                                    p.at
                                ));
                            }
                            let _one = lock(&writing);
                            file.write_all_at(&bytes, p.to).map_err(io)
                        })
                        .map(|()| data.copied(p.tensor, p.part, (p.at, p.at + p.len)));
                    if let Err(why) = r {
                        lock(&failed).get_or_insert(why);
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(why) => Err(why),
        None => Ok(pieces.iter().map(|p| p.len).sum()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_being_written_count_as_taking_their_room() {
        // Two files of 45% of the free space each: one fits the rule (at
        // most three quarters of what is free), two do not, although the
        // first, sized but not written yet, takes no disk so far.
        let dir = tempfile::tempdir().unwrap();
        let free = crate::serve::spill::free_bytes(dir.path()).unwrap();
        let len = free / 100 * 45;
        let opts = BackingOptions {
            enabled: true,
            dir: dir.path().to_path_buf(),
            limit: u64::MAX,
        };
        let b = Backings::new(opts, Arc::new(Stats::default()), Arc::default());
        let key = |tensor| Content::Part { tensor, part: 0 };
        assert!(b.reserve(&key(0), len).is_some());
        assert!(b.reserve(&key(1), len).is_none());
        // Half as much fits beside it.
        assert!(b.reserve(&key(2), len / 3).is_some());
    }

    #[test]
    fn past_the_most_files_the_least_recently_opened_idle_one_goes() {
        let dir = tempfile::tempdir().unwrap();
        let opts = BackingOptions {
            enabled: true,
            dir: dir.path().to_path_buf(),
            limit: u64::MAX,
        };
        let b = Backings::new(opts, Arc::new(Stats::default()), Arc::default());
        b.set_max_files(2);
        let key = |tensor| Content::Part { tensor, part: 0 };
        for t in 0..2 {
            let f = b.reserve(&key(t), 10).unwrap();
            b.publish(key(t), f, None, 10, &Arc::default());
        }
        // Tensor 1 held open, tensor 0 idle: 0 makes room for 2.
        let one = b.ready(&key(1)).unwrap();
        b.opened(&one);
        assert!(b.reserve(&key(2), 10).is_some());
        assert!(b.ready(&key(0)).is_none());
        assert_eq!(b.stats.backing_evictions.load(Relaxed), 1);
        // Tensor 1 open, 2 being filled: nothing can go, no file for 3.
        assert!(b.reserve(&key(3), 10).is_none());
        assert!(b.ready(&key(1)).is_some());
    }

    #[test]
    fn written_ranges_merge_and_cover() {
        let mut w = Written::default();
        w.add(10, 20);
        w.add(30, 40);
        assert!(w.covers(10, 20) && w.covers(12, 18) && w.covers(30, 40));
        assert!(!w.covers(5, 15) && !w.covers(15, 35) && !w.covers(0, 1));
        // Touching and overlapping ranges join; one inside changes nothing.
        w.add(20, 30);
        assert!(w.covers(10, 40));
        w.add(5, 12);
        w.add(35, 50);
        w.add(15, 16);
        assert_eq!(w.ranges.iter().collect::<Vec<_>>(), vec![(&5, &50)]);
        // A range over several joins them all.
        w.add(60, 70);
        w.add(80, 90);
        w.add(55, 85);
        assert_eq!(
            w.ranges.iter().collect::<Vec<_>>(),
            vec![(&5, &50), (&55, &90)]
        );
        assert!(!w.covers(49, 56));
    }

    #[test]
    fn page_cache_behind_a_reader_goes_past_what_is_not_written() {
        const MIB: u64 = 1 << 20;
        let p = Arc::new(Partial {
            file: tempfile::tempfile().unwrap(),
            len: 64 * MIB,
            written: Mutex::default(),
            settled: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        // Written: all but [3 MiB, 4 MiB), which the write-behind skipped.
        lock(&p.written).add(0, 3 * MIB);
        lock(&p.written).add(4 * MIB, 20 * MIB);
        let t = p.through();
        // Less than a step behind: nothing yet.
        let no = (0, 0);
        assert_eq!(t.behind(2 * MIB, no), vec![]);
        // Up to the margin behind, in whole steps: what is written of it.
        assert_eq!(
            t.behind(12 * MIB, no),
            vec![(0, 3 * MIB), (4 * MIB, 10 * MIB)]
        );
        // Each range once; the next step after it.
        assert_eq!(t.behind(12 * MIB, no), vec![]);
        assert_eq!(t.behind(14 * MIB, no), vec![(10 * MIB, 12 * MIB)]);
        // A file decoded whole is written where the caller says.
        assert_eq!(
            t.behind(18 * MIB, (0, 18 * MIB)),
            vec![(12 * MIB, 16 * MIB)]
        );
    }
}
