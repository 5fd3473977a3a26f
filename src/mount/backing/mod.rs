//! Backing files: exposed files whose bytes exist whole in a file on disk,
//! so the kernel can read them itself (FUSE passthrough) and no read of
//! them reaches the daemon.
//!
//! Three kinds ([`Origin`]):
//! - the source itself, where an exposed file is that file byte for byte
//!   (registered by [`Backings::source`]; costs nothing);
//! - a file under `--cache-dir` filled once with an exposed file's bytes
//!   read through the data layer (`fill.rs`: written through by the reads
//!   of served opens, the rest filled after their last close), so every
//!   check the data layer makes has passed before the file is complete, and
//!   only a complete file is ever handed out. These are created unlinked
//!   (`O_TMPFILE`): a crash leaves nothing behind. Their bytes are bounded
//!   by [`BackingOptions::limit`]; one no open holds is dropped, least
//!   recently opened first, when a new one needs the room (`room.rs`);
//! - a clone of a range of the source, where `--cache-dir` shares blocks
//!   with it (`clone.rs`).
//!
//! This file keeps the record of them by content, which opens ask
//! ([`Backings::ready_or_wait`]); `file.rs` is one complete backing file,
//! `partial.rs` one being written.
//!
//! Knows byte ranges of the data layer, never a format.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};

use super::activity::Activity;
use super::lock;
use super::tree::Content;
use super::warmer::{CloneJob, Warmer};
use crate::serve::data::Data;
use crate::serve::stats::Stats;

mod clone;
mod file;
mod fill;
mod partial;
mod room;

pub use file::Backing;
use file::warm;
use fill::{Job, Queue};
use partial::Written;
pub use partial::{Partial, Through};

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

#[derive(Default)]
struct Inner {
    slots: HashMap<Content, Slot>,
    /// Bytes of filled files, ready or being filled.
    filled: u64,
    /// The fills queued or running that take room of their own, by key:
    /// a spill a read needs may stop one (see [`Backings::give_up_writing`]).
    fills: HashMap<Content, Queued>,
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
}

#[cfg(test)]
mod tests;
