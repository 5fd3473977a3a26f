//! Catalog -> bytes of an exposed file, for any range: raw blobs straight
//! from the source file's mapping, zstd blobs through the cache (frame by
//! frame when the blob has frames), blobs too big for the cache through a
//! spill file. Every failure is a `ReadError` whose kind gives the
//! reader's errno (`super::error`) and whose one line the caller logs.
//! Knows blobs, parts and sources, never a format.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::cache::{Buf, Cache};
use super::error::{Kind, ReadError};
use super::guard::Guard;
use super::lazy_table::LazyTable;
use super::prefetch::Prefetcher;
use super::spill::Spill;
use super::stats::Stats;
use super::window::{self, MapPool, MapWindow, Touched};
use crate::catalog::{Blob, Catalog, Check, Codec, Part, PartMap, Tensor, expose};
use crate::codec::zstd::Frame;
use crate::source::{MappedFile, Span};

mod checks;
mod decode;
mod files;
mod plan;
pub mod scratch;
mod spills;
#[cfg(test)]
mod tests;

use plan::{frame_at, streamable};
pub use spills::Hold;

/// Bytes for one read reply.
pub enum Bytes<'a> {
    /// Straight from a source's mapping; counted by its window once sent.
    /// With the guard of its file, for a copy made here (see
    /// [`Bytes::copy_checked`]).
    Mapped(&'a MapWindow<MappedFile>, &'a [u8], &'a Guard),
    /// A slice of a cached unit.
    Shared(Arc<Buf>, usize, usize),
    Owned(Vec<u8>),
}

impl Drop for Bytes<'_> {
    /// The reply has been written (or dropped): whatever it mapped is
    /// counted now, not before, so nothing it mapped escapes the count.
    fn drop(&mut self) {
        match self {
            Bytes::Mapped(w, s, _) => w.served_bytes(s),
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

impl Bytes<'_> {
    /// Copies the bytes into `out` (of their length). A copy from a
    /// source's mapping is checked after it: where a page of it is gone
    /// (the file cut short, a disk error), the kernel's own copy into a
    /// reply fails, while a copy made here meets the SIGBUS handler's
    /// zero page, which only the guard's verdict tells from data.
    pub fn copy_checked(&self, out: &mut [u8]) -> Result<(), ReadError> {
        out.copy_from_slice(self);
        match self {
            Bytes::Mapped(_, _, guard) => guard.verdict(),
            _ => Ok(()),
        }
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
    pub fn get(mut self) -> Option<Bytes<'static>> {
        match &mut self {
            Kept::Cached(b, at, n) => Some(Bytes::Shared(b.upgrade()?, *at, *n)),
            Kept::Owned(v) => Some(Bytes::Owned(std::mem::take(v))),
        }
    }
}

impl Drop for Kept {
    /// Owned bytes let go unwritten (the write-behind's queue full, as it
    /// is while a load keeps every core busy, or their file gone) go back
    /// to the reply buffers, to the thread that let them go: freed, each
    /// next reply of a worker would be a new buffer, faulted in page by
    /// page (most of the daemon's page faults in a zstd model's first
    /// load).
    fn drop(&mut self) {
        if let Kept::Owned(v) = self {
            scratch::give_back(std::mem::take(v));
        }
    }
}

impl std::ops::Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(_, s, _) => s,
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
        let why = self.naming_tensor(ti, why.to_string());
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
            super::lock(&self.errors).push(ti, &why);
        } else {
            log::debug!("{why}");
        }
    }

    /// `why`, for a read of tensor `ti`, naming that tensor when it names
    /// only what it failed in: a stream several tensors share (a
    /// deathtensors blob) is named for itself, not for the tensor read.
    fn naming_tensor(&self, ti: usize, why: String) -> String {
        let Some(t) = self.catalog.tensors.get(ti) else {
            return why;
        };
        let tensor = format!("tensor {:?}", t.name);
        if why.contains(&tensor) {
            return why;
        }
        let file = format!("{}: ", self.catalog.label);
        match why.strip_prefix(&file) {
            Some(rest) => format!("{file}{tensor}: {rest}"),
            None => format!("{tensor}: {why}"),
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
            return Ok(Bytes::Mapped(&s.window, bytes, &s.guard));
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

    /// The disk bound spills share with the mount's backing files.
    pub fn decoded_disk(&self) -> Arc<super::decoded_disk::DecodedDisk> {
        self.disk.clone()
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
        // An open refused is a read refused: counted and listed as one.
        self.guard_of(ti, pi)
            .map_or(Ok(()), |g| g.verdict())
            .map_err(|why| self.failed(ti, pi, why))
    }

    /// Whether part `pi` of tensor `ti`'s file was found changed since
    /// mount (written, truncated, another object), as against failing a
    /// check or a read.
    fn changed(&self, ti: usize, pi: usize) -> bool {
        self.guard_of(ti, pi)
            .is_some_and(|g| g.check().is_err() && g.changed())
    }

    /// The source file part `pi` of tensor `ti` is read from (its index
    /// among the mounted files).
    pub fn source_of(&self, ti: usize, pi: usize) -> Option<usize> {
        Some(self.blob(self.part_of(ti, pi)?.blob).source)
    }

    fn guard_of(&self, ti: usize, pi: usize) -> Option<&super::guard::Guard> {
        let bi = self.part_of(ti, pi)?.blob;
        let s = self.files.get(self.blob(bi).source)?.as_ref()?;
        Some(&s.guard)
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
        None => guard.watched(),
    };
    let file = Arc::new(f);
    Ok(Served {
        window: pool.window(file.clone()),
        file,
        guard: Arc::new(guard),
        checked: OnceLock::new(),
    })
}
