//! Catalog -> bytes of an exposed file, for any range: raw blobs straight
//! from the source file's mapping, zstd blobs through the cache (frame by
//! frame when the blob has frames), blobs too big for the cache through a
//! spill file. Every failure is a `ReadError` whose kind gives the
//! reader's errno (`super::error`) and whose one line the caller logs.
//! Knows blobs, parts and sources, never a format.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::cache::{Buf, Cache};
use super::decoded_disk::SpillCharge;
use super::error::{Kind, ReadError};
use super::filling::Writer;
use super::guard::Guard;
use super::lazy_table::LazyTable;
use super::prefetch::Prefetcher;
use super::spill::{self, Spill};
use super::stats::Stats;
use super::window::{self, MapPool, MapWindow, Touched};
use crate::catalog::{
    Blob, Catalog, Check, Codec, FrameTable, Part, PartMap, Producer, Tensor, expose,
};
use crate::codec::zstd::{self as zstd_blob, Frame};
use crate::source::{MappedFile, Span};

mod checks;
pub mod scratch;
#[cfg(test)]
mod tests;

/// Bytes for one read reply.
pub enum Bytes<'a> {
    /// Straight from a source's mapping; counted by its window once sent.
    Mapped(&'a MapWindow<MappedFile>, &'a [u8]),
    /// A slice of a cached unit.
    Shared(Arc<Buf>, usize, usize),
    Owned(Vec<u8>),
}

impl Drop for Bytes<'_> {
    /// The reply has been written (or dropped): whatever it mapped is
    /// counted now, not before, so nothing it mapped escapes the count.
    fn drop(&mut self) {
        match self {
            Bytes::Mapped(w, s) => w.served_bytes(s),
            Bytes::Owned(v) => scratch::give_back(std::mem::take(v)),
            Bytes::Shared(..) => {}
        }
    }
}

impl<'a> Bytes<'a> {
    /// The same bytes, kept for later without keeping them cached: a
    /// slice of a cached unit by a weak reference (gone once the cache lets
    /// the unit go), owned bytes as they are. `Err` with them for bytes
    /// straight from a source's mapping, which live only as long as it.
    pub fn keep(mut self) -> Result<Kept, Bytes<'a>> {
        if let Bytes::Mapped(..) = self {
            return Err(self);
        }
        // `self` is dropped after: nothing is left in it to count or free.
        Ok(match &mut self {
            Bytes::Shared(b, at, n) => Kept::Cached(Arc::downgrade(b), *at, *n),
            Bytes::Owned(v) => Kept::Owned(std::mem::take(v)),
            Bytes::Mapped(..) => Kept::Owned(Vec::new()),
        })
    }
}

/// A read's bytes, kept by [`Bytes::keep`].
pub enum Kept {
    Cached(std::sync::Weak<Buf>, usize, usize),
    Owned(Vec<u8>),
}

impl Kept {
    /// Bytes of memory it holds: none for a slice of a cached unit (the
    /// cache counts it), a buffer's capacity for owned bytes.
    pub fn held(&self) -> u64 {
        match self {
            Kept::Cached(..) => 0,
            Kept::Owned(v) => v.capacity() as u64,
        }
    }

    /// How many bytes.
    pub fn size(&self) -> u64 {
        match self {
            Kept::Cached(_, _, n) => *n as u64,
            Kept::Owned(v) => v.len() as u64,
        }
    }

    /// The bytes, unless the cache let their unit go meanwhile.
    pub fn get(self) -> Option<Bytes<'static>> {
        match self {
            Kept::Cached(b, at, n) => Some(Bytes::Shared(b.upgrade()?, at, n)),
            Kept::Owned(v) => Some(Bytes::Owned(v)),
        }
    }
}

impl std::ops::Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(_, s) => s,
            // Made only after `Buf::range` returned these bytes: they are there.
            Bytes::Shared(b, at, n) => b.ready().get(*at..*at + *n).unwrap_or_default(),
            Bytes::Owned(v) => v,
        }
    }
}

#[derive(Debug, Clone)]
pub struct DataOptions {
    pub cache_size: u64,
    pub cache_dir: PathBuf,
    /// Verify raw blobs' checks before serving their first byte.
    pub verify_raw: bool,
    /// A whole-blob unit this big or bigger is served while it decodes (on
    /// a thread of its own) instead of after; smaller ones decode in one go.
    pub progressive_min: u64,
}

/// Default [`DataOptions::progressive_min`]: below it a decode is over
/// before a thread would have started.
pub const PROGRESSIVE_MIN: u64 = 8 << 20;

/// How far behind an in-order reader of a backed tensor its frames stay
/// cached (see [`Data::left_behind`]): readers side by side, and the
/// write-behind that copies them to the backing file, still use them.
pub const KEEP_BEHIND: u64 = 16 << 20;

/// How far past the end of a run of in-order reads a read may start and
/// still continue it (see [`Data::left_behind`]): a few requests whose
/// calls came late.
const RUN_SLACK: u64 = 4 << 20;

/// How many frames past the one being read are decoded ahead.
const PREFETCH_DEPTH: u64 = 4;

/// Decoded bytes a progressive decoder makes per step (it publishes them
/// after each).
const PROGRESSIVE_STEP: usize = 512 << 10;

/// How far past what it asked for a decoder step may write: the block it
/// ends in (128 KiB at most), the literals zstd may stage in the output
/// ahead of that block, and its 32-byte over-copies, with room to spare.
const STEP_REACH: usize = 256 << 10;

/// How a zstd blob is decoded.
enum Plan {
    /// Independent frames, each a cache unit.
    Frames(Vec<Frame>),
    /// The whole blob is one cache unit; `one_frame` when it is known to be
    /// a single zstd frame.
    Whole { one_frame: bool },
    /// Too big for the cache: decoded once into a temporary file.
    Spill { one_frame: bool },
}

#[derive(Default)]
struct BlobState {
    checked: OnceLock<Result<(), ReadError>>,
    /// The verdicts of its range checks ([`Check::BoolBytesIn`]), by start.
    ranges: Mutex<std::collections::HashMap<u64, Result<(), ReadError>>>,
    plan: OnceLock<Result<Plan, ReadError>>,
    /// Not a `OnceLock`: a spill that could not start or failed for want
    /// of disk is tried again by the next read.
    spill: Mutex<Option<Arc<Spill>>>,
    /// Set while a read takes or frees room for its spill and, once it has
    /// the room, until the spill is in `spill`: a spill being made under
    /// the slot's lock, which another spill waiting for room must count as
    /// one that will soon be read and let go of (see
    /// [`Data::spills_in_use`]).
    making_spill: AtomicBool,
    /// A spill of it has been logged at info level: later ones (made
    /// again after a drop) are logged at debug level, so that a small
    /// cache or descriptor limit does not flood the log.
    spilled: AtomicBool,
    /// The frame most recently read, to tell sequential readers.
    last_frame: AtomicUsize,
    /// The furthest frame queued for read-ahead.
    ahead: AtomicUsize,
    /// The run of in-order reads whose bytes go to a backing file: where
    /// it started and where its last read ended, in decoded offsets (see
    /// [`Data::left_behind`]).
    run: Mutex<(u64, u64)>,
}

/// One source file as served: its mapping, what of the mapping replies
/// keep mapped, and the guard that watches it.
struct Served {
    /// First, so dropped first: the SIGBUS handler stops answering for the
    /// file's range before the mapping goes (fields drop in this order), and
    /// never for a later mapping at the same address.
    guard: Arc<Guard>,
    file: Arc<MappedFile>,
    window: MapWindow<MappedFile>,
    /// The file's own checks (size, whole-file digest), done once.
    checked: OnceLock<Result<(), ReadError>>,
}

pub struct Data {
    me: Weak<Data>,
    prefetcher: Prefetcher,
    /// Shared with the tree, which lays out the views' directories from it
    /// on first use.
    catalog: Arc<Catalog>,
    /// One per `catalog.sources`; `None` where the file cannot be served.
    files: Vec<Option<Served>>,
    cache: Cache,
    stats: Arc<Stats>,
    /// One per `catalog.blobs`.
    states: LazyTable<BlobState>,
    /// One per tensor: the last reason logged at error level (a hash) and
    /// how many were. A new reason is logged again (a spill that failed for
    /// want of disk may fail later for another cause), up to
    /// [`LOGGED_REASONS`]; repeats go to the debug log. Logged under the
    /// lock: a reader failing at the same time waits for that line, so no
    /// EIO reaches anyone before the log says why.
    logged: LazyTable<Mutex<(u64, u8)>>,
    /// What was logged at error level, for `.ztensor/errors`.
    errors: Mutex<ErrorList>,
    opts: DataOptions,
    /// Progressive decoder threads running, at most `max_decoders`.
    decoders: AtomicUsize,
    max_decoders: usize,
    /// Asked to free some of `--cache-dir` that others hold (a filled
    /// backing file no open holds) when a spill does not fit; true when it
    /// freed something.
    free_disk: OnceLock<FreeDisk>,
    /// Asked to give up what was reserved beside the spill of a blob: the
    /// files that reads of its tensor's files write through to and that
    /// could never sit beside the spill (their fill would read the spill
    /// back), or, asked for `Copies::All`, any file reads write through
    /// to; true when it did.
    give_up: OnceLock<GiveUp>,
    /// The bound spills share with filled backing files
    /// (`--decoded-cache-size`).
    disk: Arc<super::decoded_disk::DecodedDisk>,
    /// Most spills held at once: each holds a descriptor (see
    /// [`Data::set_max_spills`]).
    max_spills: AtomicUsize,
    /// Whole units served while they decode go into unlinked files under
    /// `--cache-dir` rather than memory: set while the kernel takes backing
    /// files, so that such a file can then back its tensor's file as it is.
    units_in_files: AtomicBool,
    /// Set once `--cache-dir` did not make a unit's file in time (logged
    /// once).
    unit_file_late: AtomicBool,
}

/// See `Data::give_up`.
pub type GiveUp = Box<dyn Fn(usize, Copies) -> bool + Send + Sync>;

/// Which files written through to a spill short of room gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copies {
    /// Those that show its own tensor and could never sit beside it.
    Its,
    /// Every one: copies are kept for speed, a spill is needed to serve
    /// its tensor at all.
    All,
}

pub type FreeDisk = Box<dyn Fn() -> bool + Send + Sync>;

/// A file holding exactly a tensor's decoded bytes (see
/// [`Data::decoded_file`]).
pub struct DecodedFile {
    pub file: File,
    /// The spill it belongs to, if any: held while the file is used, so
    /// that the spill is not taken for idle (dropping it would free no
    /// disk while the file is open elsewhere).
    pub holds: Option<Arc<Spill>>,
}

impl Data {
    /// Serves `catalog` from `files` (one per `catalog.sources`).
    pub fn new(
        catalog: impl Into<Arc<Catalog>>,
        files: Vec<Option<MappedFile>>,
        opts: DataOptions,
        stats: Arc<Stats>,
    ) -> std::io::Result<Arc<Data>> {
        let mut catalog = catalog.into();
        list_too_large(&mut catalog, opts.cache_size);
        // One budget of mapped pages for every file: a set of many shards
        // keeps what one file does mapped.
        let pool = MapPool::new(window::BUDGET);
        let files = files
            .into_iter()
            .map(|f| f.map(|f| serve_file(f, &pool)).transpose())
            .collect::<std::io::Result<Vec<_>>>()?;
        let states = LazyTable::new(catalog.blobs.len());
        let logged = LazyTable::new(catalog.tensors.len());
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Arc::new_cyclic(|me| Data {
            me: me.clone(),
            prefetcher: Prefetcher::new(workers),
            cache: Cache::new(opts.cache_size, stats.clone()),
            catalog,
            files,
            stats,
            states,
            logged,
            errors: Mutex::default(),
            opts,
            decoders: AtomicUsize::new(0),
            max_decoders: workers,
            free_disk: OnceLock::new(),
            give_up: OnceLock::new(),
            disk: Arc::default(),
            max_spills: AtomicUsize::new(usize::MAX),
            units_in_files: AtomicBool::new(false),
            unit_file_late: AtomicBool::new(false),
        }))
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The opened file (the first source), if it is served.
    pub fn main_file(&self) -> Option<&MappedFile> {
        self.files.first()?.as_ref().map(|s| &*s.file)
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Source `i`, when it is a local file that is served.
    pub fn local_file(&self, i: usize) -> Option<&MappedFile> {
        let s = self.files.get(i)?.as_ref()?;
        (!s.file.is_remote()).then_some(&*s.file)
    }

    /// Source `i`, when every byte of it is in its file now: a local file,
    /// or a remote object whose cache file holds all of it (blocks there
    /// are never written again, and the object is not known to have
    /// changed).
    pub fn whole_file(&self, i: usize) -> Option<&MappedFile> {
        let s = self.files.get(i)?.as_ref()?;
        match s.file.backing() {
            None => Some(&*s.file),
            Some(b) => {
                let len = s.file.len();
                // Checked at the first open after a remount: the kernel
                // reads no byte of it that has not passed its check.
                if b.broken().is_none() && b.present(0, len) < len {
                    b.check_present();
                }
                let whole = b.broken().is_none() && b.present(0, len) == len;
                whole.then_some(&*s.file)
            }
        }
    }

    /// Whether part `pi` of tensor `ti` may be read straight from its
    /// source now: its source is unchanged since mount and every check a
    /// read of it would make has passed (a failure is logged as a read's).
    /// For a part served from a file the daemon does not read itself.
    pub fn check_raw(&self, ti: usize, pi: usize) -> Result<(), ReadError> {
        let t = &self.catalog.tensors[ti];
        let r = (|| -> Result<(), ReadError> {
            let parts = t.parts.as_ref().map_err(|why| self.fail_tensor(t, why))?;
            let part = parts
                .get(pi)
                .ok_or_else(|| self.fail_tensor(t, "no such part"))?;
            let s = self.served(part.blob)?;
            if self.opts.verify_raw {
                self.checked(s, part.blob)?;
            }
            Ok(())
        })();
        r.map_err(|why| self.failed(ti, pi, why))
    }

    /// Exposed bytes `[off, off+len)` of part `pi` of tensor `ti`.
    pub fn read(&self, ti: usize, pi: usize, off: u64, len: u64) -> Result<Bytes<'_>, ReadError> {
        let t = &self.catalog.tensors[ti];
        let out = self.read_inner(t, pi, off, len);
        if let Ok(b) = &out {
            Stats::add(&self.stats.bytes_served, b.len() as u64);
        }
        out.map_err(|why| self.failed(ti, pi, why))
    }

    /// A read of part `pi` of tensor `ti` failed: counted and logged. A
    /// failure on the way (a spill's, a check's) after the source changed
    /// is told as the change (`ESTALE`).
    fn failed(&self, ti: usize, pi: usize, why: ReadError) -> ReadError {
        Stats::add(&self.stats.errors, 1);
        self.log_failure(ti, &why);
        if why.kind == Kind::Failed && self.changed(ti, pi) {
            return ReadError::new(Kind::Changed, why.message());
        }
        why
    }

    fn log_failure(&self, ti: usize, e: &ReadError) {
        let why = e.message();
        if e.by_guard() {
            // The guard logged it, once for the whole file; the list says it
            // once per tensor.
            log::debug!("{why}");
            let mut last = super::lock(&self.logged[ti]);
            if last.1 == 0 {
                *last = (0, 1);
                super::lock(&self.errors).push(ti, why);
            }
            return;
        }
        let h = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            why.hash(&mut h);
            h.finish()
        };
        let mut last = super::lock(&self.logged[ti]);
        if last.0 != h && last.1 < LOGGED_REASONS {
            *last = (h, last.1 + 1);
            log::error!("{why}");
            super::lock(&self.errors).push(ti, why);
        } else {
            log::debug!("{why}");
        }
    }

    /// `.ztensor/errors`: one JSON object a line, `{"tensor", "error"}`,
    /// for each reason a tensor's reads failed for (as logged).
    pub fn errors_text(&self) -> Vec<u8> {
        let list = super::lock(&self.errors);
        let mut out = Vec::new();
        for (ti, why) in &list.entries {
            let name = self
                .catalog
                .tensors
                .get(*ti)
                .map_or("", |t| t.name.as_str());
            let line = serde_json::json!({"tensor": name, "error": why});
            let _ = serde_json::to_writer(&mut out, &line);
            out.push(b'\n');
        }
        if list.dropped > 0 {
            let line = serde_json::json!({"more": list.dropped});
            let _ = serde_json::to_writer(&mut out, &line);
            out.push(b'\n');
        }
        out
    }

    fn fail_tensor(&self, t: &Tensor, why: impl std::fmt::Display) -> ReadError {
        format!("{}: tensor {:?}: {why}", self.catalog.label, t.name).into()
    }

    /// `why`, naming the file and blob `bi`; its kind (and so its
    /// errno) kept.
    fn fail(&self, bi: usize, why: impl Into<ReadError>) -> ReadError {
        let b = &self.catalog.blobs[bi];
        why.into()
            .context(format_args!("{}: {}", self.catalog.label, b.label))
    }

    /// Logs that blob `bi` starts a spill: at info level the first time,
    /// at debug level when it is spilled again after its spill was dropped.
    fn log_spill(&self, bi: usize, why: String) {
        let again = self.states[bi].spilled.swap(true, Relaxed);
        let level = if again {
            log::Level::Debug
        } else {
            log::Level::Info
        };
        log::log!(level, "{}", self.fail(bi, why));
    }

    fn blob(&self, bi: usize) -> &Blob {
        &self.catalog.blobs[bi]
    }

    /// The file blob `bi` is stored in, once its own checks have passed.
    fn served(&self, bi: usize) -> Result<&Served, ReadError> {
        let b = self.blob(bi);
        let Some(Some(s)) = self.files.get(b.source) else {
            let why = self
                .catalog
                .sources
                .get(b.source)
                .and_then(|r| r.unusable.clone())
                .unwrap_or_else(|| "its file cannot be read".into());
            return Err(self.fail(bi, why));
        };
        s.guard.verdict()?;
        // Fetched outside the once-only check: a failed fetch fails this
        // read, not the file for good.
        if s.checked.get().is_none() {
            self.ensure_digested(b.source, s)?;
        }
        s.checked
            .get_or_init(|| {
                checks::source(&self.catalog, b.source, &s.file, &s.guard).map_err(ReadError::from)
            })
            .clone()?;
        Ok(s)
    }

    /// Makes bytes `[off, off+len)` of the file present before they are
    /// touched (a remote object's blocks fetched; nothing for a local
    /// file). A failure names blob `bi`, or says the object changed.
    fn ensure(&self, s: &Served, bi: usize, off: u64, len: u64) -> Result<(), ReadError> {
        if !s.file.is_remote() {
            return Ok(());
        }
        s.file
            .ensure(off, len)
            .map_err(|why| match s.guard.verdict() {
                Err(changed) => changed,
                // `fail` names the catalog: a single file's name once.
                Ok(()) => self.fail(bi, why.without_context(&self.catalog.label)),
            })
    }

    /// [`Data::ensure`] for all of blob `bi`'s stored bytes.
    fn ensure_blob(&self, s: &Served, bi: usize) -> Result<(), ReadError> {
        let b = self.blob(bi);
        self.ensure(s, bi, b.offset, b.len)
    }

    /// Makes present what a source's whole-file digest covers.
    fn ensure_digested(&self, i: usize, s: &Served) -> Result<(), ReadError> {
        let Some(r) = self.catalog.sources.get(i) else {
            return Ok(());
        };
        if r.digest.is_none() || !s.file.is_remote() {
            return Ok(());
        }
        let (at, len) = r.digest_span.unwrap_or((0, s.file.len()));
        s.file
            .ensure(at, len)
            .map_err(|why| match s.guard.verdict() {
                Err(changed) => changed,
                Ok(()) => why.into(),
            })
    }

    /// The stored bytes of blob `bi`.
    fn span(&self, s: &Served, bi: usize) -> Span {
        let b = self.blob(bi);
        Span {
            file: s.file.clone(),
            offset: b.offset,
            len: b.len,
        }
    }

    fn read_inner(
        &self,
        t: &Tensor,
        pi: usize,
        off: u64,
        len: u64,
    ) -> Result<Bytes<'_>, ReadError> {
        let parts = t.parts.as_ref().map_err(|why| self.fail_tensor(t, why))?;
        let part = parts
            .get(pi)
            .ok_or_else(|| self.fail_tensor(t, "no such part"))?;
        let Some((off, len)) = expose::clamp(part, off, len) else {
            return Ok(Bytes::Owned(Vec::new()));
        };
        let bi = part.blob;
        let s = self.served(bi)?;
        match &self.blob(bi).codec {
            Codec::Raw => self.read_raw(s, bi, part, off, len),
            Codec::Computed(p) => {
                if let Some(spill) = self.computed_spill(s, bi, p)? {
                    let out = expose::gather_into(scratch::take(), part, off, len, |at, out| {
                        spill
                            .read(at, out)
                            .map_err(|why| self.unit_error(s, bi, why))
                    })?;
                    // The spill may have been made before the file changed.
                    s.guard.verdict()?;
                    return Ok(Bytes::Owned(out));
                }
                let buf = self.computed(s, bi, p)?;
                let from_unit = |at: u64, out: &mut [u8]| {
                    let bytes = buf
                        .range(at as usize, out.len())
                        .map_err(|why| self.unit_error(s, bi, why))?;
                    out.copy_from_slice(bytes);
                    Ok(())
                };
                if let Some((at, n)) = expose::direct_range(part, off, len) {
                    buf.range(at as usize, n as usize)
                        .map_err(|why| self.unit_error(s, bi, why))?;
                    return Ok(Bytes::Shared(buf.clone(), at as usize, n as usize));
                }
                expose::gather_into(scratch::take(), part, off, len, from_unit).map(Bytes::Owned)
            }
            Codec::Zstd { .. } => {
                self.checked(s, bi)?;
                let plan = self.plan(s, bi)?;
                self.ranges_checked(s, bi, plan, t, part)?;
                // One unit holds the whole range: reply from it without a copy.
                if let Some((at, n)) = expose::direct_range(part, off, len)
                    && let Some((buf, start)) = self.unit_containing(s, bi, plan, at, n)?
                {
                    return Ok(Bytes::Shared(buf, start, n as usize));
                }
                expose::gather_into(scratch::take(), part, off, len, |at, out| {
                    self.fetch(s, bi, plan, at, out)
                })
                .map(Bytes::Owned)
            }
        }
    }

    fn read_raw<'a>(
        &'a self,
        s: &'a Served,
        bi: usize,
        part: &Part,
        off: u64,
        len: u64,
    ) -> Result<Bytes<'a>, ReadError> {
        if self.opts.verify_raw {
            self.checked(s, bi)?;
        }
        let b = self.blob(bi);
        let blob = s.file.range(b.offset, b.len);
        if let Some((at, n)) = expose::direct_range(part, off, len) {
            let (start, end) = (b.offset + at, b.offset + b.len);
            self.ensure(s, bi, start, n)?;
            if n < window::STREAMING as u64 {
                // A small read: one copy costs less than mapping its pages
                // and, later, letting go of them.
                let mut v = scratch::take();
                v.resize(n as usize, 0);
                let r = s.file.file().read_exact_at(&mut v, start);
                // A file cut short: the guard says so best.
                s.guard.verdict()?;
                r.map_err(|e| self.fail(bi, format!("cannot read the data: {e}")))?;
                return Ok(Bytes::Owned(v));
            }
            s.window.ahead(start as usize, n as usize, end as usize);
            let bytes = &blob[at as usize..(at + n) as usize];
            return Ok(Bytes::Mapped(&s.window, bytes));
        }
        let mut touched = Touched::default();
        let v: Result<Vec<u8>, ReadError> =
            expose::gather_into(scratch::take(), part, off, len, |at, out| {
                self.ensure(s, bi, b.offset + at, out.len() as u64)?;
                out.copy_from_slice(&blob[at as usize..at as usize + out.len()]);
                s.window
                    .touch(&mut touched, (b.offset + at) as usize, out.len());
                Ok(())
            });
        s.window.served_touched(touched);
        // The copy above touched the mmap: make sure it was still there.
        s.guard.verdict()?;
        v.map(Bytes::Owned)
    }

    /// Runs the blob's checks once per mount, before any byte is served.
    fn checked(&self, s: &Served, bi: usize) -> Result<(), ReadError> {
        // The checks read the whole blob: fetched first, outside the
        // once-only check (a failed fetch fails this read, not the blob).
        let b = self.blob(bi);
        // (A raw blob's range checks read it too: see `checks::Decoded`.)
        let reads_blob = matches!(b.codec, Codec::Raw) && !b.checks.is_empty()
            || (b.checks.iter()).any(|c| !matches!(c, Check::BoolBytesIn { .. }));
        if self.states[bi].checked.get().is_none()
            && reads_blob
            && !matches!(b.codec, Codec::Computed(_))
        {
            self.ensure_blob(s, bi)?;
            self.spilled_whole(s, bi)?;
        }
        self.states[bi]
            .checked
            .get_or_init(|| {
                let r = self.run_checks(s, bi);
                if let Err(checks::Failed::Mismatch(_)) = &r {
                    Stats::add(&self.stats.checksum_failures, 1);
                }
                r.map_err(|f| match f {
                    checks::Failed::Whole(why) => why,
                    other => self.fail(bi, other.to_string()),
                })
            })
            .clone()
    }

    /// Runs, once each, the blob's range checks whose range `part` reads
    /// from (a bool tensor in a zstd stream shared with other tensors):
    /// its bytes are not served unless they pass, and its neighbours are.
    fn ranges_checked(
        &self,
        s: &Served,
        bi: usize,
        plan: &Plan,
        t: &Tensor,
        part: &Part,
    ) -> Result<(), ReadError> {
        let PartMap::Contiguous { start: p0 } = part.map else {
            return Ok(());
        };
        let p1 = p0 + part.nbytes;
        for c in &self.blob(bi).checks {
            let &Check::BoolBytesIn { start, len } = c else {
                continue;
            };
            if len == 0 || start >= p1 || p0 >= start + len {
                continue;
            }
            if let Some(r) = super::lock(&self.states[bi].ranges).get(&start) {
                r.clone()?;
                continue;
            }
            // A failed decode fails this read; only a verdict is kept.
            let verdict = self
                .scan_bools(s, bi, plan, start, len)?
                .map_err(|why| self.fail_tensor(t, why));
            super::lock(&self.states[bi].ranges).insert(start, verdict.clone());
            verdict?;
        }
        Ok(())
    }

    /// Whether decoded bytes `[start, start+len)` are all 0 or 1, read in
    /// chunks of at most 1 MiB.
    fn scan_bools(
        &self,
        s: &Served,
        bi: usize,
        plan: &Plan,
        start: u64,
        len: u64,
    ) -> Result<Result<(), ReadError>, ReadError> {
        let mut buf = vec![0u8; len.min(1 << 20) as usize];
        let mut at = start;
        while at < start + len {
            let n = (start + len - at).min(buf.len() as u64) as usize;
            self.fetch(s, bi, plan, at, &mut buf[..n])?;
            if let Some(i) = buf[..n].iter().position(|&b| b > 1) {
                let e = at - start + i as u64;
                return Ok(Err(format!("bool element {e} is neither 0 nor 1").into()));
            }
            at += n as u64;
        }
        Ok(Ok(()))
    }

    fn run_checks(&self, s: &Served, bi: usize) -> Result<(), checks::Failed> {
        let b = self.blob(bi);
        checks::stored(b, &self.span(s, bi), &s.guard)?;
        if !matches!(b.codec, Codec::Zstd { .. }) {
            return Ok(());
        }
        let Some(mut d) = checks::Decoded::new(b) else {
            return Ok(());
        };
        // Decoded through the cache, as reads will want it: each frame once
        // (the next ones on the other cores, by read-ahead), and what fits
        // stays for the reads that follow.
        let data = |e: ReadError| checks::Failed::Whole(e);
        let range = |e: String| checks::Failed::Whole(e.into());
        match self.plan(s, bi).map_err(data)? {
            Plan::Frames(frames) => {
                for (k, f) in frames.iter().enumerate() {
                    let unit = self.frame(s, bi, k, f).map_err(data)?;
                    d.feed(unit.range(0, unit.len()).map_err(range)?);
                }
            }
            Plan::Whole { one_frame } => {
                let unit = self.whole(s, bi, *one_frame).map_err(data)?;
                d.feed(unit.range(0, unit.len()).map_err(range)?);
            }
            Plan::Spill { one_frame } => {
                // Read back from the spill (whole: see `checked`), not
                // decoded again: a second decoder would want the frame's
                // whole window in memory, outside the cache.
                let spill = self.spill(s, bi, *one_frame).map_err(data)?;
                let mut buf = scratch::take();
                buf.resize((1 << 20).min(b.decoded_len) as usize, 0);
                let mut at = 0;
                while at < b.decoded_len {
                    let n = (b.decoded_len - at).min(buf.len() as u64) as usize;
                    let read = spill.read(at, &mut buf[..n]);
                    read.map_err(|why| data(self.unit_error(s, bi, why)))?;
                    d.feed(&buf[..n]);
                    at += n as u64;
                }
                scratch::give_back(buf);
                s.guard.verdict().map_err(data)?;
            }
        }
        d.finish()
    }

    /// For a blob spilled whole, waits for its spill to end, outside the
    /// once-only check: a spill that fails for want of disk fails this
    /// read, and the next one tries again.
    fn spilled_whole(&self, s: &Served, bi: usize) -> Result<(), ReadError> {
        let b = self.blob(bi);
        if !matches!(b.codec, Codec::Zstd { .. }) || checks::Decoded::new(b).is_none() {
            return Ok(());
        }
        let Plan::Spill { one_frame } = self.plan(s, bi)? else {
            return Ok(());
        };
        let Some(last) = b.decoded_len.checked_sub(1) else {
            return Ok(());
        };
        let spill = self.spill(s, bi, *one_frame)?;
        spill
            .read(last, &mut [0u8])
            .map_err(|why| self.unit_error(s, bi, why))
    }

    fn plan(&self, s: &Served, bi: usize) -> Result<&Plan, ReadError> {
        // A plan made by walking the blob reads all of it: fetched first,
        // outside the once-only plan (a failed fetch fails this read only).
        if self.states[bi].plan.get().is_none()
            && !matches!(&self.blob(bi).codec, Codec::Zstd { frames: Some(_) })
        {
            self.ensure_blob(s, bi)?;
        }
        self.states[bi]
            .plan
            .get_or_init(|| self.make_plan(s, bi))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Frames as the format recorded them, when their list fits in a
    /// quarter of the cache: no walk over the blob.
    fn recorded_frames(&self, bi: usize) -> Option<Plan> {
        let b = self.blob(bi);
        let Codec::Zstd {
            frames: Some(table),
        } = &b.codec
        else {
            return None;
        };
        let limit = self.cache.limit();
        if !(2..=zstd_blob::MAX_FRAMES).contains(&table.len()) {
            return None;
        }
        // A frame list is kept while the file is mounted: it is counted in
        // the cache (`Cache::hold`) before it is built.
        let cost = list_cost(table.len());
        if !self.cache.hold(cost) {
            return None;
        }
        let frames = match table {
            FrameTable::Uniform {
                decoded,
                compressed,
            } if *decoded <= limit / 4 => {
                zstd_blob::frames_from_table(*decoded, compressed, b.len, b.decoded_len)
            }
            FrameTable::Listed(sizes) => zstd_blob::frames_from_list(sizes, b.len, b.decoded_len)
                .filter(|f| f.iter().all(|f| f.d_len <= limit / 4)),
            FrameTable::Uniform { .. } => None,
        };
        match frames {
            Some(frames) => Some(Plan::Frames(frames)),
            None => {
                self.cache.unhold(cost);
                None
            }
        }
    }

    fn make_plan(&self, s: &Served, bi: usize) -> Result<Plan, ReadError> {
        if let Some(plan) = self.recorded_frames(bi) {
            return Ok(plan);
        }
        self.ensure_blob(s, bi)?;
        let decoded = self.blob(bi).decoded_len;
        let limit = self.cache.limit();
        let span = self.span(s, bi);
        let blob = span.bytes();
        // A table that cannot be held, or that does not agree with the
        // blob, leaves it to the walk below, which counts the frames there
        // are. One frame that says it holds the whole blob: nothing to walk
        // (a walk touches every block header of the blob). The decoder
        // checks the rest: that the frame ends the blob and decodes to
        // exactly that size.
        if zstd_blob::first_frame_size(blob) == Some(decoded) {
            s.guard.verdict()?;
            return Ok(whole_or_spill(decoded, limit, true));
        }
        // One frame that does not declare its size (a streaming writer's:
        // ztensor 1.x, deathtensors): one walk over its block headers says
        // so, and makes it a single frame for trust, like the one above.
        if zstd_blob::is_one_frame(blob) {
            span.release_all();
            s.guard.verdict()?;
            return Ok(whole_or_spill(decoded, limit, true));
        }
        // Counted before the list is built: a blob of a million tiny
        // frames gets no list it cannot keep.
        let count = zstd_blob::count_frames(blob).map_err(|why| self.fail(bi, why));
        let held = match count {
            Ok(Some(n)) if n > 1 => {
                let cost = list_cost(n);
                let held = self.cache.hold(cost).then_some(cost);
                if held.is_none() {
                    log::info!(
                        "{}",
                        self.fail(bi, format!("the list of its {n} zstd frames ({cost} bytes) does not fit in a quarter of the cache: decoded as one stream"))
                    );
                }
                held
            }
            _ => None,
        };
        let frames = match (&count, held) {
            (Ok(Some(n)), _) if *n == 1 || held.is_some() => {
                // Exactly as long as counted.
                zstd_blob::scan_frames_sized(blob, *n).map_err(|why| self.fail(bi, why))
            }
            _ => Ok(None),
        };
        // The walks touched a page per block header across the blob.
        span.release_all();
        let plan = self.plan_from_walk(s, bi, count, frames);
        if let Some(cost) = held
            && !matches!(plan, Ok(Plan::Frames(_)))
        {
            self.cache.unhold(cost);
        }
        plan
    }

    fn plan_from_walk(
        &self,
        s: &Served,
        bi: usize,
        count: Result<Option<usize>, ReadError>,
        frames: Result<Option<Vec<Frame>>, ReadError>,
    ) -> Result<Plan, ReadError> {
        let decoded = self.blob(bi).decoded_len;
        let limit = self.cache.limit();
        s.guard.verdict()?;
        count?;
        let frames = frames?;
        let one_frame = frames.as_ref().is_some_and(|f| f.len() == 1);
        if let Some(frames) = frames {
            let total = frames.last().map_or(0, |f| f.d_start + f.d_len);
            if total != decoded {
                return Err(self.fail(
                    bi,
                    if total > decoded {
                        format!("zstd data decodes to more than the expected {decoded} bytes (its frame headers declare {total})")
                    } else {
                        format!("zstd data decodes to only {total} bytes, expected {decoded} (per its frame headers)")
                    },
                ));
            }
            if frames.len() > 1 && frames.iter().all(|f| f.d_len <= limit / 4) {
                return Ok(Plan::Frames(frames));
            }
        }
        Ok(whole_or_spill(decoded, limit, one_frame))
    }

    /// The cached unit holding decoded bytes `[at, at+n)`, if one does.
    fn unit_containing(
        &self,
        s: &Served,
        bi: usize,
        plan: &Plan,
        at: u64,
        n: u64,
    ) -> Result<Option<(Arc<Buf>, usize)>, ReadError> {
        match plan {
            Plan::Frames(frames) => {
                let k = frame_at(frames, at);
                let f = frames[k];
                if at + n > f.d_start + f.d_len {
                    return Ok(None);
                }
                let buf = self.frame(s, bi, k, &f)?;
                Ok(Some((buf, (at - f.d_start) as usize)))
            }
            Plan::Whole { one_frame } => {
                let buf = self.whole(s, bi, *one_frame)?;
                buf.range(at as usize, n as usize)
                    .map_err(|why| self.unit_error(s, bi, why))?;
                Ok(Some((buf, at as usize)))
            }
            Plan::Spill { .. } => Ok(None),
        }
    }

    /// Copies decoded bytes `[at, at+out.len())` into `out`.
    fn fetch(
        &self,
        s: &Served,
        bi: usize,
        plan: &Plan,
        at: u64,
        out: &mut [u8],
    ) -> Result<(), ReadError> {
        match plan {
            Plan::Frames(frames) => {
                let mut pos = at;
                let mut done = 0usize;
                let mut k = frame_at(frames, at);
                while done < out.len() {
                    let f = frames[k];
                    let buf = self.frame(s, bi, k, &f)?;
                    let from = (pos - f.d_start) as usize;
                    let n = (buf.len() - from).min(out.len() - done);
                    let bytes = buf
                        .range(from, n)
                        .map_err(|why| self.unit_error(s, bi, why))?;
                    out[done..done + n].copy_from_slice(bytes);
                    done += n;
                    pos += n as u64;
                    k += 1;
                }
                Ok(())
            }
            Plan::Whole { one_frame } => {
                let buf = self.whole(s, bi, *one_frame)?;
                let bytes = buf
                    .range(at as usize, out.len())
                    .map_err(|why| self.unit_error(s, bi, why))?;
                out.copy_from_slice(bytes);
                Ok(())
            }
            Plan::Spill { one_frame } => self
                .spill(s, bi, *one_frame)?
                .read(at, out)
                .map_err(|why| self.unit_error(s, bi, why)),
        }
    }

    fn frame(&self, s: &Served, bi: usize, k: usize, f: &Frame) -> Result<Arc<Buf>, ReadError> {
        let out = self.decode_frame(s, bi, k, f);
        s.guard.verdict()?;
        self.read_ahead(bi, k);
        out.map_err(|why| self.fail(bi, why.context(format_args!("frame {k}"))))
    }

    /// Frame `k` of blob `bi`, from the cache or decoded into it.
    fn decode_frame(
        &self,
        s: &Served,
        bi: usize,
        k: usize,
        f: &Frame,
    ) -> Result<Arc<Buf>, ReadError> {
        let b = self.blob(bi);
        s.file.ensure(b.offset + f.c_start, f.c_len)?;
        let src = s.file.range(b.offset + f.c_start, f.c_len);
        self.cache
            .get((bi as u32, k as u32), f.d_len, |dst| {
                let r = zstd_blob::decode_frame(src, dst, f.d_len as usize);
                s.file.release(src);
                r
            })
            .map_err(ReadError::from)
    }

    /// After frame `k` of a tensor read in order, queues decodes of the
    /// next frames so they are ready (or under way) when the reader gets
    /// there. Random readers get no read-ahead.
    fn read_ahead(&self, bi: usize, k: usize) {
        let st = &self.states[bi];
        let prev = st.last_frame.swap(k, Relaxed);
        if prev != k && prev.wrapping_add(1) != k {
            // A jump: what was queued ahead of the old position says
            // nothing about this one (a new pass starts at frame 0).
            st.ahead.store(k, Relaxed);
            return;
        }
        let Some(Ok(Plan::Frames(frames))) = st.plan.get() else {
            return;
        };
        let biggest = frames.iter().map(|f| f.d_len).max().unwrap_or(1).max(1);
        // Never let read-ahead take more than a quarter of the cache.
        let depth = (self.cache.limit() / 4 / biggest).min(PREFETCH_DEPTH) as usize;
        let last = (k + depth).min(frames.len() - 1);
        // Frames queued by the previous read of this pass are not queued
        // again. A mark outside this reader's window is another pass's (an
        // earlier full read, another reader): start from here.
        let mark = st.ahead.load(Relaxed);
        let first = if (k..=last).contains(&mark) {
            mark + 1
        } else {
            k + 1
        };
        let mut reached = first.saturating_sub(1);
        for j in first..=last {
            if !self.cache.has((bi as u32, j as u32)) {
                let me = self.me.clone();
                let queued = self.prefetcher.submit(Box::new(move || {
                    if let Some(data) = me.upgrade() {
                        data.prefetch(bi, j);
                    }
                }));
                // A full queue: the next read tries these again.
                if !queued {
                    break;
                }
            }
            reached = j;
        }
        st.ahead.store(reached, Relaxed);
    }

    fn prefetch(&self, bi: usize, k: usize) {
        // Queued twice, or already picked up by a reader: nothing to do, and
        // no waiting for someone else's decode.
        if self.cache.has((bi as u32, k as u32)) {
            return;
        }
        let Some(Ok(Plan::Frames(frames))) = self.states[bi].plan.get() else {
            return;
        };
        let (Some(f), Some(Some(s))) = (frames.get(k), self.files.get(self.blob(bi).source)) else {
            return;
        };
        // Errors surface when a reader asks for this frame itself.
        let _ = self.decode_frame(s, bi, k, f);
    }

    /// A unit that failed while a reader waited for it: the file changing
    /// under the mount is said as such, anything else names the tensor.
    fn unit_error(&self, s: &Served, bi: usize, why: impl Into<ReadError>) -> ReadError {
        match s.guard.verdict() {
            Err(changed) => changed,
            Ok(()) => self.fail(bi, why),
        }
    }

    fn whole(&self, s: &Served, bi: usize, one_frame: bool) -> Result<Arc<Buf>, ReadError> {
        let decoded = self.blob(bi).decoded_len;
        self.ensure_blob(s, bi)?;
        let span = self.span(s, bi);
        let src = span.bytes();
        let key = (bi as u32, 0);
        // Big units are decoded on a thread of their own into a buffer
        // faulted in ahead of it; their bytes are published as they come
        // only when nothing checks them at the end ([`Data::trusted_early`]),
        // else all at once when the stream has been checked to its end.
        let out = if decoded >= self.opts.progressive_min {
            let early = self.trusted_early(bi, src, one_frame);
            self.cache.get_filling(
                key,
                decoded,
                || self.unit_file(decoded),
                |buf| self.start_decoder(bi, buf, early),
            )
        } else {
            self.cache.get(key, decoded, |dst| {
                let r = zstd_blob::decode_to_vec(src, dst, decoded as usize);
                span.release(src);
                r
            })
        };
        s.guard.verdict()?;
        out.map_err(|why| self.fail(bi, why))
    }

    /// A computed blob, made whole into the cache (once, whoever asks),
    /// its checks run over it before anyone is served.
    /// The refusal of computed blob `bi`, made whole by `p`, for being over
    /// half the cache.
    fn too_large(&self, bi: usize, p: &Producer) -> ReadError {
        let why = format!(
            "its {} bytes are made whole by the {} reader, and that exceeds half the cache ({} \
             bytes): mount with a larger --cache-size",
            self.blob(bi).decoded_len,
            p.name,
            self.cache.limit()
        );
        self.fail(bi, ReadError::new(Kind::TooLarge, why))
    }

    fn computed(&self, s: &Served, bi: usize, p: &Producer) -> Result<Arc<Buf>, ReadError> {
        let b = self.blob(bi);
        let limit = self.cache.limit();
        self.ensure_blob(s, bi)?;
        if b.decoded_len > limit / 2 {
            return Err(self.too_large(bi, p));
        }
        let out = self.cache.get((bi as u32, 0), b.decoded_len, |dst| {
            dst.clear();
            (p.produce)(dst)?;
            if dst.len() as u64 != b.decoded_len {
                return Err(format!(
                    "the {} reader made {} bytes, expected {}",
                    p.name,
                    dst.len(),
                    b.decoded_len
                ));
            }
            if let Err(f) = checks::produced(b, dst) {
                if let checks::Failed::Mismatch(_) = f {
                    Stats::add(&self.stats.checksum_failures, 1);
                }
                return Err(f.to_string());
            }
            Ok(())
        });
        s.guard.verdict()?;
        out.map_err(|why| self.fail(bi, why))
    }

    /// Whether bytes of `src` may be served before its frame has ended. The
    /// end of a zstd frame is where zstd checks its own content checksum; a
    /// blob is trusted early if its checks (done before any byte is served)
    /// vouched for its bytes, or if it is one frame without a checksum.
    /// (A blob whose first frame declares the whole size is served from that
    /// frame only: anything after it fails before the last byte is out.)
    fn trusted_early(&self, bi: usize, src: &[u8], one_frame: bool) -> bool {
        checks::vouched(self.blob(bi))
            || (one_frame && zstd_blob::frame_has_checksum(src) == Some(false))
    }

    /// Decodes a filling unit on a thread of its own, one per core at most;
    /// past that the reader that asked decodes it on its own thread.
    fn start_decoder(&self, bi: usize, buf: Arc<Buf>, early: bool) {
        // A thread at low priority faults the buffer in ahead of the decoder,
        // wherever that runs: the decoder is the bound, and on two cores it
        // must not share its core with the faulting. It holds the buffer
        // weakly between pieces, so an evicted unit is let go of at once.
        let weak = Arc::downgrade(&buf);
        let _ = std::thread::Builder::new()
            .name("zt-populate".into())
            .spawn(move || {
                lower_priority();
                let mut at = 0;
                while let Some(b) = weak.upgrade()
                    && let Some(f) = b.filling()
                    && f.populate_step(&mut at)
                {}
            });
        if self.decoders.fetch_add(1, Relaxed) < self.max_decoders
            && let Some(me) = self.me.upgrade()
        {
            let b = buf.clone();
            let spawned = std::thread::Builder::new()
                .name("zt-decode".into())
                .spawn(move || {
                    let _slot = Slot(&me.decoders);
                    me.decode_filling(bi, &b, early);
                });
            if spawned.is_ok() {
                return;
            }
        }
        self.decoders.fetch_sub(1, Relaxed);
        self.decode_filling(bi, &buf, early);
    }

    fn decode_filling(&self, bi: usize, buf: &Arc<Buf>, early: bool) {
        let Some(Some(s)) = self.files.get(self.blob(bi).source) else {
            return;
        };
        let Some(mut w) = buf.filling().and_then(|f| f.writer()) else {
            return;
        };
        // Whatever happens below, even a panic, a failed unit leaves the
        // cache, so the next reader starts again (and fails again, with the
        // reason) instead of finding a dead one.
        let mut discard = Discard {
            cache: &self.cache,
            key: (bi as u32, 0),
            buf,
            armed: true,
        };
        let span = self.span(s, bi);
        let r = self.decode_progressively(&s.guard, span.reader(), &mut w, buf.len(), early);
        // The plan and the trust check read the frame header through the
        // mapping; let go of it with the rest.
        span.release_all();
        if r.is_ok() {
            Stats::add(&self.stats.decompressed_bytes, buf.len() as u64);
            discard.armed = false;
        }
        // Out of the cache before readers hear of the failure.
        drop(discard);
        w.finish(r.map_err(|e| e.to_string()));
    }

    /// Decodes `src` straight into `w`, claiming each step's reach first
    /// (see [`Writer::claim`]). With `early`, what is there is
    /// published after each step, the last byte only
    /// once the stream has been checked to its end, so a reader of the
    /// whole tensor never gets all of a blob that fails after it; without,
    /// nothing is published before that end (a frame checksum covers it).
    ///
    /// The buffer is faulted in ahead by the populate thread
    /// ([`Data::start_decoder`]), not here: on two cores, faulting from both
    /// threads at once slowed the decoder more than it saved (BENCHMARKS.md).
    fn decode_progressively(
        &self,
        guard: &Guard,
        src: zstd_blob::Source<'_>,
        w: &mut Writer,
        len: usize,
        early: bool,
    ) -> Result<(), ReadError> {
        // SAFETY: the writer's buffer is `len` bytes, lives as long as `w`
        // (which outlives the decoder), and only this decoder writes it, at
        // or past what was committed.
        let mut dec = unsafe { zstd_blob::DirectDecoder::new(src, w.as_mut_ptr(), len) }?;
        while dec.produced() < len {
            w.claim(dec.produced() + PROGRESSIVE_STEP + STEP_REACH);
            let stepped = dec.step_output(PROGRESSIVE_STEP);
            // Bytes decoded from a file that changed are not published; and
            // a change explains a failed step (a short read) best.
            guard.check()?;
            stepped?;
            if early {
                w.commit_to(dec.produced().min(len.saturating_sub(1)));
            }
        }
        dec.finish()?;
        w.commit_to(len);
        Ok(())
    }

    /// A computed blob over half the cache, made piece by piece into a
    /// spill file (once, kept while mounted) by its reader's stream, its
    /// checks run over the pieces as they come: `None` for a blob the
    /// cache takes whole. One whose reader cannot make it piece by piece,
    /// or whose checks need it whole, is refused.
    fn computed_spill(
        &self,
        s: &Served,
        bi: usize,
        p: &Producer,
    ) -> Result<Option<Arc<Spill>>, ReadError> {
        let b = self.blob(bi);
        let limit = self.cache.limit();
        if b.decoded_len <= limit / 2 {
            return Ok(None);
        }
        let Some(stream) = p.stream.clone().filter(|_| streamable(b)) else {
            return Err(self.too_large(bi, p));
        };
        let mut slot = super::lock(&self.states[bi].spill);
        if let Some(s) = slot.as_ref().filter(|s| !s.failed_for_now()) {
            return Ok(Some(s.clone()));
        }
        *slot = None;
        let decoded = b.decoded_len;
        let dir = &self.opts.cache_dir;
        self.descriptor_for_spill(bi);
        let charge = self.room_for_spill(bi, dir, decoded)?;
        let _making = Making(&self.states[bi].making_spill);
        self.ensure_blob(s, bi)?;
        let (blob, name, stats) = (b.clone(), p.name, self.stats.clone());
        let guard = s.guard.clone();
        let run = Box::new(
            move |write: &mut dyn FnMut(&[u8]) -> Result<(), String>| -> Result<(), String> {
                // The blob's checks over the pieces as they come; the
                // spill's readers wait for its end, after the verdict.
                let mut digest = checks::Decoded::new(&blob);
                stream(&mut |piece: &[u8]| {
                    if let Some(d) = digest.as_mut() {
                        d.feed(piece);
                    }
                    write(piece)
                })
                .map_err(|why| format!("the {name} reader: {why}"))?;
                // The reader reads the file with pread, which a rewrite in
                // place does not stop: bytes read across a change are a
                // mix, and not served.
                guard.check()?;
                if let Some(d) = digest
                    && let Err(f) = d.finish()
                {
                    if let checks::Failed::Mismatch(_) = f {
                        Stats::add(&stats.checksum_failures, 1);
                    }
                    return Err(f.to_string());
                }
                Ok(())
            },
        );
        let spill =
            Spill::produce(run, decoded, dir, &self.stats).map_err(|why| self.fail(bi, why))?;
        spill.keep(charge);
        self.log_spill(
            bi,
            format!(
                "its {decoded} bytes, made by the {} reader, exceed half the cache; spilling to {}",
                p.name,
                dir.display()
            ),
        );
        *slot = Some(spill.clone());
        // Seen in the slot before `_making` says it is no longer made.
        drop(slot);
        Ok(Some(spill))
    }

    fn spill(&self, s: &Served, bi: usize, one_frame: bool) -> Result<Arc<Spill>, ReadError> {
        let mut slot = super::lock(&self.states[bi].spill);
        if let Some(s) = slot.as_ref().filter(|s| !s.failed_for_now()) {
            return Ok(s.clone());
        }
        // A failed spill's file (unlinked) goes once its readers are done,
        // before the free space is asked: it may be what filled the disk.
        *slot = None;
        let decoded = self.blob(bi).decoded_len;
        let dir = &self.opts.cache_dir;
        self.descriptor_for_spill(bi);
        let charge = self.room_for_spill(bi, dir, decoded)?;
        let _making = Making(&self.states[bi].making_spill);
        self.ensure_blob(s, bi)?;
        let span = self.span(s, bi);
        let early = self.trusted_early(bi, span.bytes(), one_frame);
        let spill = Spill::start(&span, &s.guard, decoded, dir, early, &self.stats)
            .map_err(|why| self.fail(bi, why))?;
        spill.keep(charge);
        self.log_spill(
            bi,
            format!(
                "{decoded} decoded bytes exceed half the cache; spilling to {}",
                dir.display()
            ),
        );
        *slot = Some(spill.clone());
        drop(slot);
        Ok(spill)
    }
}

/// Whether a computed blob's checks can run over its pieces as its reader
/// streams them (see [`Data::computed_spill`]).
fn streamable(b: &crate::catalog::Blob) -> bool {
    b.checks.iter().all(|c| {
        matches!(
            c,
            Check::BoolBytes | Check::Decoded(_) | Check::ZeroLastNibble
        )
    })
}

/// Lists as unsupported, with the reason, each tensor with a part no read
/// can be served from under a cache of `cache` bytes: one only its
/// format's reader makes, whole, over half the cache. Its size and the
/// limit are known at mount, so it is not listed as a file whose every
/// read fails (`np.fromfile` takes such a failure for the end of the file
/// and returns zeros).
fn list_too_large(catalog: &mut Arc<Catalog>, cache: u64) {
    let whole_only = |b: &crate::catalog::Blob| match &b.codec {
        Codec::Computed(p) => b.decoded_len > cache / 2 && (p.stream.is_none() || !streamable(b)),
        _ => false,
    };
    let too_large: Vec<bool> = catalog.blobs.iter().map(whole_only).collect();
    if !too_large.contains(&true) {
        return;
    }
    let c = Arc::make_mut(catalog);
    for t in &mut c.tensors {
        let Ok(parts) = &t.parts else { continue };
        let Some(b) = parts
            .iter()
            .map(|p| p.blob)
            .find(|&bi| too_large.get(bi).copied().unwrap_or(false))
        else {
            continue;
        };
        let (len, name) = match &c.blobs[b].codec {
            Codec::Computed(p) => (c.blobs[b].decoded_len, p.name),
            _ => continue,
        };
        t.parts = Err(format!(
            "its {len} bytes are made whole by the {name} reader, over half of --cache-size \
             ({cache} bytes): mount with --cache-size {}M or more to read it",
            len.saturating_mul(2).div_ceil(1 << 20)
        ));
    }
}

impl Data {
    /// Part `pi` of tensor `ti`, if the tensor has parts and that one.
    fn part_of(&self, ti: usize, pi: usize) -> Option<&Part> {
        self.catalog.tensors.get(ti)?.parts.as_ref().ok()?.get(pi)
    }

    /// Whether whole units go into files (see [`Data::unit_file`]).
    pub fn set_units_in_files(&self, on: bool) {
        self.units_in_files.store(on, Relaxed);
    }

    /// An unlinked file of `len` bytes, its disk reserved, under
    /// `--cache-dir`, for a whole unit to be decoded into, when whole units
    /// go into files and the directory has the room a spill would need.
    /// `None` otherwise: the unit is decoded into memory.
    fn unit_file(&self, len: u64) -> Option<File> {
        if !self.units_in_files.load(Relaxed) {
            return None;
        }
        // On the cache directory's thread: a directory that does not answer
        // (frozen for a snapshot) must not hold this worker, nor the readers
        // waiting on this unit.
        let dir = self.opts.cache_dir.clone();
        let Some(made) = super::deadline::within(move || spill::reserved_file(&dir, len)) else {
            if !self.unit_file_late.swap(true, Relaxed) {
                log::warn!(
                    "{} did not make a file within {:?}: large units are decoded into memory \
                     until it answers",
                    self.opts.cache_dir.display(),
                    super::deadline::DEADLINE
                );
            }
            return None;
        };
        made.map_err(|why| log::debug!("a {len}-byte unit is decoded into memory: {why}"))
            .ok()
    }

    /// A file holding exactly the decoded bytes of part `pi` of tensor
    /// `ti`, checked, when its blob was decoded whole into one: a complete
    /// spill, or a unit decoded into a file (see [`Data::unit_file`]) that
    /// is still cached; the part is the whole blob, little-endian as
    /// stored.
    pub fn decoded_file(&self, ti: usize, pi: usize) -> Option<DecodedFile> {
        let bi = self.whole_blob_part(ti, pi)?;
        // The file first: most opens find none, and the source's check
        // below is a stat. A slot held is a spill being made (on a disk
        // that may not answer), so not complete: an open does not wait.
        let spill = self.spill_now(bi).ok()?;
        let len = self.blob(bi).decoded_len;
        let found = match spill {
            Some(s) => DecodedFile {
                file: s.complete_file(len)?.try_clone().ok()?,
                holds: Some(s),
            },
            None => DecodedFile {
                file: self
                    .cache
                    .peek((bi as u32, 0))?
                    .complete_file()?
                    .try_clone()
                    .ok()?,
                holds: None,
            },
        };
        (self.all_checks_passed(bi) && self.unchanged(ti, pi)).then_some(found)
    }

    /// Whether every check that reads of blob `bi` make has run and passed:
    /// its own, and those of each range of it (bool elements in a stream
    /// shared by several tensors), each of which has a verdict only once a
    /// read of it was made.
    fn all_checks_passed(&self, bi: usize) -> bool {
        let st = &self.states[bi];
        if !matches!(st.checked.get(), Some(Ok(()))) {
            return false;
        }
        // A raw blob's ranges were checked with the rest of it.
        let raw = matches!(self.blob(bi).codec, Codec::Raw);
        let ranges = super::lock(&st.ranges);
        self.blob(bi).checks.iter().all(|c| match *c {
            Check::BoolBytesIn { start, len } => {
                raw || len == 0 || matches!(ranges.get(&start), Some(Ok(())))
            }
            _ => true,
        })
    }

    /// Whether reads of part `pi` of tensor `ti` come from a unit decoded
    /// into a file that [`Data::decoded_file`] will give: nothing needs
    /// writing anywhere else.
    pub fn decodes_into_file(&self, ti: usize, pi: usize) -> bool {
        self.whole_blob_part(ti, pi).is_some_and(|bi| {
            self.cache
                .peek((bi as u32, 0))
                .is_some_and(|u| u.filling().is_some_and(|f| f.in_a_file()))
        })
    }

    /// The blob of part `pi` of tensor `ti` when the part's bytes are all
    /// of its decoded bytes, as they are.
    fn whole_blob_part(&self, ti: usize, pi: usize) -> Option<usize> {
        let p = self.part_of(ti, pi)?;
        let b = self.blob(p.blob);
        let as_stored = p.order == crate::catalog::Endian::Little || p.dtype.size() == 1;
        let whole = matches!(p.map, PartMap::Contiguous { start: 0 }) && p.nbytes == b.decoded_len;
        (as_stored && whole && !matches!(b.codec, Codec::Raw)).then_some(p.blob)
    }

    /// Whether a read of `len` bytes at `off` of part `pi` of tensor `ti`
    /// may now wait for a decode that another thread runs (its unit
    /// filling, in flight, or spilling short of them), or for a spill's
    /// disk. True too where its blob's plan is not made yet or its spill
    /// not started: the first readers of a blob arrive together, and all
    /// but one wait for that one's plan, checks and spill. False for raw
    /// bytes and parts gathered from pieces: such a read goes as any
    /// other.
    pub fn would_wait(&self, ti: usize, pi: usize, off: u64, len: u64) -> bool {
        let Some(p) = self.part_of(ti, pi) else {
            return false;
        };
        let PartMap::Contiguous { start } = p.map else {
            return false;
        };
        let bi = p.blob;
        let b = self.blob(bi);
        if matches!(b.codec, Codec::Raw) {
            return false;
        }
        let from = start.saturating_add(off).min(b.decoded_len);
        let end = from.saturating_add(len).min(b.decoded_len);
        // Made whole by its reader, into the cache or a spill: no plan.
        if matches!(b.codec, Codec::Computed(_)) {
            return self.cache.would_wait((bi as u32, 0), end as usize)
                || self.spill_would_wait(bi, end, false);
        }
        let Some(Ok(plan)) = self.states.get(bi).and_then(|st| st.plan.get()) else {
            return true;
        };
        match plan {
            Plan::Whole { .. } => self.cache.would_wait((bi as u32, 0), end as usize),
            Plan::Frames(frames) => {
                let k = frame_at(frames, from);
                let Some(f) = frames.get(k) else {
                    return false;
                };
                let within = end.min(f.d_start + f.d_len).saturating_sub(f.d_start);
                self.cache
                    .would_wait((bi as u32, k as u32), within as usize)
            }
            // An empty slot is a spill to make.
            Plan::Spill { .. } => self.spill_would_wait(bi, end, true),
        }
    }

    /// Whether a read of blob `bi`'s spill up to `end` would wait now;
    /// `empty` when it has none. A slot held is a spill being made (its
    /// file created, its room found), which a read would wait for: on a
    /// disk that does not answer, for as long as it does not.
    fn spill_would_wait(&self, bi: usize, end: u64, empty: bool) -> bool {
        self.states.get(bi).is_some()
            && self
                .spill_now(bi)
                .map_or(true, |slot| slot.map_or(empty, |s| s.would_wait(end)))
    }

    /// Blob `bi`'s spill now, without waiting for its slot: `Err` while
    /// the slot is held (a spill being made, which may wait on a disk
    /// that does not answer), so that opens and the FUSE workers never
    /// wait on it.
    fn spill_now(&self, bi: usize) -> Result<Option<Arc<Spill>>, SlotBusy> {
        let Some(st) = self.states.get(bi) else {
            return Ok(None);
        };
        match st.spill.try_lock() {
            Ok(slot) => Ok(slot.clone()),
            Err(std::sync::TryLockError::Poisoned(e)) => Ok(e.into_inner().clone()),
            Err(std::sync::TryLockError::WouldBlock) => Err(SlotBusy),
        }
    }

    /// A hold on the spill part `pi` of tensor `ti` is read from, when it
    /// has one now: while held, the spill is in use and is not dropped for
    /// room. Taken without waiting for its slot (`None` while it is held).
    pub fn spill_hold(&self, ti: usize, pi: usize) -> Option<Hold> {
        let bi = self.part_of(ti, pi)?.blob;
        let spill = self.spill_now(bi).ok()??;
        Some(Hold { _spill: spill })
    }

    /// Whether part `pi` of tensor `ti` is read from a spill: a decoded
    /// copy on disk already (or being made), from which a backing file is
    /// filled without decoding again (and which a second copy would crowd
    /// on the disk).
    pub fn spilled(&self, ti: usize, pi: usize) -> bool {
        self.part_of(ti, pi)
            .is_some_and(|p| self.spill_now(p.blob).map_or(true, |slot| slot.is_some()))
    }

    /// The decoded size of the spill part `pi` of tensor `ti` is read
    /// through: one it is read from now or soon (one being made counts),
    /// without waiting for its slot, which a spill being made holds while
    /// it finds room and creates its file (on a disk that may not answer),
    /// or one dropped that its next read makes again (its plan is a
    /// spill). `None` when it has none.
    pub fn spill_len(&self, ti: usize, pi: usize) -> Option<u64> {
        let bi = self.part_of(ti, pi)?.blob;
        let planned = matches!(self.states[bi].plan.get(), Some(Ok(Plan::Spill { .. })));
        (planned || self.spilled(ti, pi)).then(|| self.blob(bi).decoded_len)
    }

    /// The disk bound spills share with the mount's backing files.
    pub fn decoded_disk(&self) -> Arc<super::decoded_disk::DecodedDisk> {
        self.disk.clone()
    }

    /// Sets who gives up what was reserved beside a blob's spill (see
    /// `give_up`).
    pub fn on_spill_reserved(&self, give_up: GiveUp) {
        let _ = self.give_up.set(give_up);
    }

    /// Sets who frees `--cache-dir` space others hold (see `free_disk`).
    pub fn on_disk_full(&self, free: FreeDisk) {
        let _ = self.free_disk.set(free);
    }

    /// Sets the most spills held at once (unbounded until set): each holds
    /// a descriptor, and a daemon at its limit of open files could make no
    /// spill, open no socket and hand the kernel no backing file.
    pub fn set_max_spills(&self, n: usize) {
        self.max_spills.store(n.max(1), Relaxed);
    }

    /// Exposed bytes `covered` (from, to) of part `pi` of tensor `ti` are
    /// kept elsewhere now (a backing file), and a read just wrote `touched`
    /// of them: the few frames right behind `touched` that lie wholly in
    /// `covered` leave the cache, unless someone holds them. A first read
    /// then keeps a few frames in memory, not the tensor, and their buffers
    /// serve the next decodes. Frames behind, not under, the read: the
    /// requests of one read and readers side by side still use those, and
    /// one dropped under a reader about to take it would be decoded again.
    pub fn written(&self, ti: usize, pi: usize, touched: (u64, u64), covered: (u64, u64)) {
        const BEHIND: usize = 8;
        let Some(part) = self.part_of(ti, pi) else {
            return;
        };
        let blob_range = |(a, b): (u64, u64)| {
            expose::direct_range(part, a, b.saturating_sub(a)).map(|(at, n)| (at, at + n))
        };
        let (Some((t0, _)), Some((c0, _))) = (blob_range(touched), blob_range(covered)) else {
            return;
        };
        let frames = match self.states.get(part.blob).and_then(|s| s.plan.get()) {
            Some(Ok(Plan::Frames(frames))) => frames,
            // One unit: it goes once all of it is written.
            Some(Ok(Plan::Whole { .. })) => {
                let (c1, whole) = (blob_range(covered).map_or(0, |r| r.1), self.blob(part.blob));
                if c0 == 0 && c1 >= whole.decoded_len {
                    self.cache.drop_idle((part.blob as u32, 0));
                }
                return;
            }
            _ => return,
        };
        let first_after = frames.partition_point(|f| f.d_start + f.d_len <= t0);
        let from = first_after.saturating_sub(BEHIND);
        for (k, f) in frames.iter().enumerate().take(first_after).skip(from) {
            if f.d_start >= c0 {
                self.cache.drop_idle((part.blob as u32, k as u32));
            }
        }
    }

    /// A read of part `pi` of tensor `ti` just served `touched` (the
    /// part's offsets), and its bytes go to a backing file: the frames
    /// that the run of in-order reads it continues has itself passed by
    /// more than [`KEEP_BEHIND`] leave the cache unless someone holds
    /// them, written there or not, and their buffers serve the next
    /// decodes. A pass over a tensor then keeps a few frames in memory,
    /// not the tensor, and decodes into memory it used already, not new
    /// memory (each new page is a fault: a fifth of the CPU of a first read
    /// here, BENCHMARKS.md). What the write-behind had not written is
    /// decoded again by the fill, once the mount is idle.
    ///
    /// A run is reads each starting inside what the run covers so far or
    /// at most [`RUN_SLACK`] past its end, in the blob's decoded offsets
    /// (this is called once a reply is out, and one worker's call may come
    /// after the next request's); any other read starts a new one. So a
    /// reader that goes back, or jumps, lets go of nothing it has not
    /// itself passed in order, and neither do two readers far apart whose
    /// reads take turns.
    pub fn left_behind(&self, ti: usize, pi: usize, touched: (u64, u64)) {
        let Some(part) = self.part_of(ti, pi) else {
            return;
        };
        let Some(st) = self.states.get(part.blob) else {
            return;
        };
        let Some(Ok(Plan::Frames(frames))) = st.plan.get() else {
            return;
        };
        let Some((t0, n)) =
            expose::direct_range(part, touched.0, touched.1.saturating_sub(touched.0))
        else {
            return;
        };
        let start = {
            let mut run = super::lock(&st.run);
            if t0 < run.0 || t0 > run.1.saturating_add(RUN_SLACK) {
                *run = (t0, t0);
            }
            run.1 = run.1.max(t0 + n);
            run.0
        };
        let edge = t0.saturating_sub(KEEP_BEHIND);
        if edge <= start {
            return;
        }
        // The frames this read moved past the edge (and one before, for a
        // read that ended inside one), those wholly inside the run.
        let first_after = frames.partition_point(|f| f.d_start + f.d_len <= edge);
        let from = frames
            .partition_point(|f| f.d_start + f.d_len <= edge.saturating_sub(n))
            .saturating_sub(1);
        for (k, f) in frames.iter().enumerate().take(first_after).skip(from) {
            if f.d_start >= start {
                self.cache.drop_idle((part.blob as u32, k as u32));
            }
        }
    }

    /// Whether part `pi` of tensor `ti`'s file is as it was at mount: bytes
    /// decoded from it earlier may be served only while it is.
    pub fn unchanged(&self, ti: usize, pi: usize) -> bool {
        self.guard_of(ti, pi).is_some_and(|g| g.check().is_ok())
    }

    /// Part `pi` of tensor `ti`'s file as a read finds it: Ok while it is
    /// as it was at mount, else the read's error (`ESTALE` once it
    /// changed; logged once, by its guard).
    pub fn source_verdict(&self, ti: usize, pi: usize) -> Result<(), ReadError> {
        self.guard_of(ti, pi).map_or(Ok(()), |g| g.verdict())
    }

    /// Whether part `pi` of tensor `ti`'s file was found changed since
    /// mount (written, truncated, another object), as against failing a
    /// check or a read.
    fn changed(&self, ti: usize, pi: usize) -> bool {
        self.guard_of(ti, pi)
            .is_some_and(|g| g.check().is_err() && g.changed())
    }

    fn guard_of(&self, ti: usize, pi: usize) -> Option<&super::guard::Guard> {
        let bi = self.part_of(ti, pi)?.blob;
        let s = self.files.get(self.blob(bi).source)?.as_ref()?;
        Some(&s.guard)
    }

    /// The hook set by [`Data::on_disk_full`], for tests.
    #[cfg(test)]
    pub fn free_disk(&self) -> impl Fn() -> bool + '_ {
        || self.free_disk.get().is_some_and(|f| f())
    }

    /// Room in `dir` for a spill of `decoded` bytes of blob `bi`, as far as
    /// dropping idle spills and idle backing files can make it, and its
    /// share of `--decoded-cache-size`, which they make the same way; an
    /// error (`ENOSPC`) when the bound cannot hold it.
    fn room_for_spill(
        &self,
        bi: usize,
        dir: &Path,
        decoded: u64,
    ) -> Result<SpillCharge, ReadError> {
        let limit = self.disk.limit();
        let why = || {
            format!(
                "{decoded} decoded bytes do not fit in --decoded-cache-size ({limit} bytes, {} \
                 held by decoded files in use)",
                self.disk.used()
            )
        };
        // Past the bound whatever goes: nothing is dropped for it.
        if decoded > limit {
            return Err(self.fail(bi, ReadError::new(Kind::NoSpace, why())));
        }
        if spill::room(dir, decoded).is_err() {
            self.drop_idle_spills(bi, dir, decoded);
            if let Some(free) = self.free_disk.get() {
                while spill::room(dir, decoded).is_err() && free() {}
            }
        }
        match self.charge_for_spill(bi, decoded) {
            Some(charge) => Ok(charge),
            None => Err(self.fail(bi, ReadError::new(Kind::NoSpace, why()))),
        }
    }

    /// Spills stay while mounted, so that a tensor is decoded once. When a
    /// new one does not fit, finished spills that no reader holds go first
    /// (until it fits), so that spills read once cannot fill the disk and
    /// fail every later one. Other tensors' slots are only tried, never
    /// waited on: their holders may be waiting for this one.
    fn drop_idle_spills(&self, keep: usize, dir: &Path, decoded: u64) {
        let idle =
            |i: usize, s: &Arc<Spill>| i != keep && Arc::strong_count(s) == 1 && s.complete();
        // First whether dropping them all would make room at all: a tensor
        // that cannot fit anyway takes nothing from the others.
        let mut freeable = 0u64;
        for (i, state) in self.states.made() {
            if let Ok(slot) = state.spill.try_lock()
                && slot.as_ref().is_some_and(|s| idle(i, s))
            {
                freeable += self.blob(i).decoded_len;
            }
        }
        let free = spill::free_bytes(dir).unwrap_or(0);
        if decoded > (free.saturating_add(freeable) / 4).saturating_mul(3) {
            return;
        }
        self.drop_spills_until(keep, || spill::room(dir, decoded).is_ok());
    }

    /// Below the most spills held at once before blob `keep` makes one:
    /// finished spills no reader holds go. (One a backing file holds goes
    /// once that file does, which the backing files' own bound sees to.)
    fn descriptor_for_spill(&self, keep: usize) {
        let max = self.max_spills.load(Relaxed);
        let fewer = || self.spills_held() < max;
        if !fewer() {
            self.drop_spills_until(keep, fewer);
        }
    }

    /// Blob `bi`'s spill's share of `--decoded-cache-size`, once the
    /// write-through files of its tensor's files that could never sit
    /// beside it, idle spills and idle backing files have made room for
    /// it; `None` when they cannot. Spills that readers hold (a file part
    /// way read, or just closed: the kernel sends the release after close
    /// returns) are waited for, up to [`SPILL_ROOM_WAIT`]: their readers
    /// let go of them once they have every byte.
    fn charge_for_spill(&self, bi: usize, decoded: u64) -> Option<SpillCharge> {
        let fits = || self.disk.used().saturating_add(decoded) <= self.disk.limit();
        let until = std::time::Instant::now() + SPILL_ROOM_WAIT;
        let mut waited = false;
        let making = &self.states[bi].making_spill;
        // When the bound's count last moved.
        let mut moved = (self.disk.changes(), std::time::Instant::now());
        loop {
            // Said while this spill takes room or frees it for itself: a
            // spill waiting beside it must not find the room gone (taken,
            // or freed for this one) and nothing made with it.
            making.store(true, SeqCst);
            if let Some(charge) = self.disk.charge_spill(decoded) {
                return Some(charge);
            }
            // Files of its own tensor that could never be kept beside it
            // are given up first; others' idle files are worth keeping.
            let give_up = |which| self.give_up.get().is_some_and(|g| g(bi, which));
            let freed = give_up(Copies::Its)
                || self.drop_spills_until(bi, fits)
                || self.free_disk.get().is_some_and(|free| free())
                || give_up(Copies::All);
            if freed || fits() {
                continue;
            }
            // Waiting, it frees nothing: two spills that can only wait on
            // each other fail once the room has settled.
            making.store(false, SeqCst);
            let now = std::time::Instant::now();
            let changes = self.disk.changes();
            if changes != moved.0 {
                moved = (changes, now);
            }
            // Room in passing (a file being reserved, a spill handed to a
            // backing file) is neither in use nor idle yet: waited for.
            let settled = now.duration_since(moved.1) >= SPILL_ROOM_SETTLE;
            if now >= until || settled && !self.spills_in_use(bi) {
                return None;
            }
            if !waited {
                Stats::add(&self.stats.spill_room_waits, 1);
                waited = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Whether a spill but blob `keep`'s may soon be one that can go: one
    /// a reader holds or a backing file is made of (let go of once no open
    /// holds it), one still being finished (its reader may have had every
    /// byte before the spill was marked complete), or one taking or
    /// freeing room for itself, not yet in its slot (`making_spill`).
    fn spills_in_use(&self, keep: usize) -> bool {
        self.states.made().any(|(i, st)| {
            i != keep
                && (st.making_spill.load(SeqCst)
                    || st.spill.try_lock().is_ok_and(|s| {
                        s.as_ref().is_some_and(|s| {
                            !s.finished() || s.complete() && Arc::strong_count(s) > 1
                        })
                    }))
        })
    }

    /// Drops one finished spill no reader holds (for filled backing files
    /// that need its share of the bound); whether one went.
    pub fn drop_an_idle_spill(&self) -> bool {
        let before = self.disk.spills();
        self.drop_spills_until(usize::MAX, || self.disk.spills() < before)
    }

    /// Spills held now; a slot another thread holds counts as one.
    fn spills_held(&self) -> usize {
        self.states
            .made()
            .filter(|(_, st)| st.spill.try_lock().map_or(true, |s| s.is_some()))
            .count()
    }

    /// Drops finished spills that no reader holds, but blob `keep`'s,
    /// until `done`; whether it is. Other tensors' slots are only tried,
    /// never waited on: their holders may be waiting for `keep`'s.
    fn drop_spills_until(&self, keep: usize, done: impl Fn() -> bool) -> bool {
        for (i, state) in self.states.made() {
            let Ok(mut slot) = state.spill.try_lock() else {
                continue;
            };
            let idle = |s: &Arc<Spill>| i != keep && Arc::strong_count(s) == 1 && s.complete();
            if slot.as_ref().is_some_and(idle) {
                let idle = slot.take();
                drop(slot);
                drop(idle);
                Stats::add(&self.stats.spill_evictions, 1);
                log::debug!(
                    "{}: {}: dropped its spill to make room for another",
                    self.catalog.label,
                    self.blob(i).label
                );
                if done() {
                    return true;
                }
            }
        }
        done()
    }
}

/// Most reasons one tensor's reads log at error level while mounted.
const LOGGED_REASONS: u8 = 8;

/// Most entries `.ztensor/errors` keeps (then it counts the rest).
const ERRORS_KEPT: usize = 1000;

#[derive(Default)]
struct ErrorList {
    entries: Vec<(usize, String)>,
    dropped: u64,
}

impl ErrorList {
    fn push(&mut self, ti: usize, why: &str) {
        if self.entries.len() < ERRORS_KEPT {
            self.entries.push((ti, why.to_string()));
        } else {
            self.dropped += 1;
        }
    }
}

/// Memory a kept frame list of `n` frames takes.
fn list_cost(n: usize) -> u64 {
    (n * std::mem::size_of::<Frame>()) as u64
}

/// Makes the calling thread yield to the others (nice 10). Best effort.
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// A progressive decoder's place among `Data::decoders`, given back when
/// its thread ends, however it ends.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Drops a unit from the cache on the way out unless disarmed.
struct Discard<'a> {
    cache: &'a Cache,
    key: (u32, u32),
    buf: &'a Arc<Buf>,
    armed: bool,
}

impl Drop for Discard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cache.discard(self.key, self.buf);
        }
    }
}

/// Longest a spill that does not fit waits for spills other readers hold
/// (with its tensor's spill slot held: its other readers wait off the
/// FUSE workers, and opens do not wait for it).
const SPILL_ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the bound's count must stay still before a spill short of
/// room, with no spill in use to wait for, fails: what holds the room may
/// be on its way to being let go (a file being reserved on the cache
/// directory's thread takes up to 200 ms).
const SPILL_ROOM_SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

/// A blob's spill slot is held by another thread (see `Data::spill_now`).
struct SlotBusy;

/// Clears a blob's `making_spill` when its spill is in its slot, or was
/// not made.
struct Making<'a>(&'a AtomicBool);

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.0.store(false, SeqCst);
    }
}

/// A spill held by a reader between its reads (see [`Data::spill_hold`]).
pub struct Hold {
    _spill: Arc<Spill>,
}

/// A blob decoded as one unit lives in the cache if it takes at most half.
fn whole_or_spill(decoded: u64, limit: u64, one_frame: bool) -> Plan {
    if decoded <= limit / 2 {
        Plan::Whole { one_frame }
    } else {
        Plan::Spill { one_frame }
    }
}

fn frame_at(frames: &[Frame], at: u64) -> usize {
    frames
        .partition_point(|f| f.d_start + f.d_len <= at)
        .min(frames.len().saturating_sub(1))
}

/// A source file ready to serve: its window (in `pool`) and guard.
fn serve_file(f: MappedFile, pool: &Arc<MapPool<MappedFile>>) -> std::io::Result<Served> {
    let bytes = f.bytes();
    let guard = Guard::new(
        f.label(),
        f.file().try_clone()?,
        f.opened(),
        bytes.as_ptr(),
        bytes.len(),
    );
    let guard = match f.backing() {
        Some(b) => guard.remote(b.clone()),
        None => guard,
    };
    let file = Arc::new(f);
    Ok(Served {
        window: pool.window(file.clone()),
        file,
        guard: Arc::new(guard),
        checked: OnceLock::new(),
    })
}
