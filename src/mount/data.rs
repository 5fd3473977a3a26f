//! Tensor catalog -> bytes of an exposed file, for any range: raw tensors
//! straight from the mmap, zstd tensors through the cache (frame by frame
//! when the blob has frames), tensors too big for the cache through a spill
//! file. Every failed check becomes an error string the caller logs and
//! turns into EIO.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::cache::{Buf, Cache};
use super::filling::Writer;
use super::guard::Guard;
use super::prefetch::Prefetcher;
use super::spill::{self, Spill};
use super::stats::Stats;
use super::window::{self, MapWindow, Touched};
use crate::format::index::as_u64;
use crate::format::writer::{FRAME_SIZE_KEY, FRAMES_KEY};
use crate::format::zstd_blob::{self, Frame};
use crate::format::{Encoding, Tensor, Verdict, ZtFile, expose};
use ciborium::value::Value;

/// Bytes for one read reply.
pub enum Bytes<'a> {
    /// Straight from the mmap; counted by the window once sent.
    Mapped(&'a MapWindow<ZtFile>, &'a [u8]),
    /// A slice of a cached unit.
    Shared(Arc<Buf>, usize, usize),
    Owned(Vec<u8>),
}

impl Drop for Bytes<'_> {
    /// The reply has been written (or dropped): whatever it mapped is
    /// counted now, not before, so nothing it mapped escapes the count.
    fn drop(&mut self) {
        if let Bytes::Mapped(w, s) = self {
            w.served_bytes(s);
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
    /// Verify raw blobs' checksums before serving their first byte.
    pub verify_raw: bool,
    /// A whole-blob unit this big or bigger is served while it decodes (on
    /// a thread of its own) instead of after; smaller ones decode in one go.
    pub progressive_min: u64,
}

/// Default [`DataOptions::progressive_min`]: below it a decode is over
/// before a thread would have started.
pub const PROGRESSIVE_MIN: u64 = 8 << 20;

/// How many frames past the one being read are decoded ahead.
const PREFETCH_DEPTH: u64 = 4;

/// Compressed bytes a progressive decoder takes per step (it publishes its
/// output after each).
const PROGRESSIVE_STEP: usize = 512 << 10;

/// How a zstd tensor is decoded.
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
struct TensorState {
    checked: OnceLock<Result<(), String>>,
    plan: OnceLock<Result<Plan, String>>,
    /// Not a `OnceLock`: a spill that could not start or failed for want
    /// of disk is tried again by the next read.
    spill: Mutex<Option<Arc<Spill>>>,
    /// The last reason logged at error level for this tensor (a hash) and
    /// how many were: a new reason is logged again (a spill that failed for
    /// want of disk may fail later for another cause), up to
    /// [`LOGGED_REASONS`], repeats go to the debug log. Logged under the
    /// lock: a reader failing at the same time waits for that line, so no
    /// EIO reaches anyone before the log says why.
    logged: Mutex<(u64, u8)>,
    /// The frame most recently read, to tell sequential readers.
    last_frame: AtomicUsize,
    /// The furthest frame queued for read-ahead.
    ahead: AtomicUsize,
}

pub struct Data {
    me: Weak<Data>,
    prefetcher: Prefetcher,
    zt: Arc<ZtFile>,
    /// What of `zt`'s mapping raw replies keep mapped.
    window: MapWindow<ZtFile>,
    cache: Cache,
    stats: Arc<Stats>,
    states: Vec<TensorState>,
    guard: Arc<Guard>,
    opts: DataOptions,
    /// Progressive decoder threads running, at most `max_decoders`.
    decoders: AtomicUsize,
    max_decoders: usize,
}

impl Data {
    pub fn new(zt: ZtFile, opts: DataOptions, stats: Arc<Stats>) -> std::io::Result<Arc<Data>> {
        let bytes = zt.bytes();
        let guard = Guard::new(
            zt.label(),
            zt.file().try_clone()?,
            zt.opened(),
            bytes.as_ptr(),
            bytes.len(),
        );
        let states = (0..zt.catalog().len())
            .map(|_| TensorState::default())
            .collect();
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let zt = Arc::new(zt);
        Ok(Arc::new_cyclic(|me| Data {
            window: MapWindow::new(zt.clone(), window::BUDGET),
            me: me.clone(),
            prefetcher: Prefetcher::new(workers),
            cache: Cache::new(opts.cache_size, stats.clone()),
            zt,
            stats,
            states,
            guard: Arc::new(guard),
            opts,
            decoders: AtomicUsize::new(0),
            max_decoders: workers,
        }))
    }

    pub fn file(&self) -> &ZtFile {
        &self.zt
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Exposed bytes `[off, off+len)` of part `pi` of tensor `ti`.
    pub fn read(&self, ti: usize, pi: usize, off: u64, len: u64) -> Result<Bytes<'_>, String> {
        let t = &self.zt.catalog().tensors[ti];
        let out = self.read_inner(t, ti, pi, off, len);
        match &out {
            Ok(b) => Stats::add(&self.stats.bytes_served, b.len() as u64),
            Err(why) => {
                Stats::add(&self.stats.errors, 1);
                if self.guard.broken() == Some(why.as_str()) {
                    // The guard logged it, once for the whole file.
                    log::debug!("{why}");
                } else {
                    let h = {
                        use std::hash::{Hash, Hasher};
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        why.hash(&mut h);
                        h.finish()
                    };
                    let mut last = self.states[ti]
                        .logged
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if last.0 != h && last.1 < LOGGED_REASONS {
                        *last = (h, last.1 + 1);
                        log::error!("{why}");
                    } else {
                        log::debug!("{why}");
                    }
                }
            }
        }
        out
    }

    fn fail(&self, t: &Tensor, why: impl std::fmt::Display) -> String {
        format!("{}: tensor {:?}: {why}", self.zt.label(), t.name)
    }

    fn read_inner(
        &self,
        t: &Tensor,
        ti: usize,
        pi: usize,
        off: u64,
        len: u64,
    ) -> Result<Bytes<'_>, String> {
        let layout = t.layout.as_ref().map_err(|why| self.fail(t, why))?;
        let part = layout
            .parts
            .get(pi)
            .ok_or_else(|| self.fail(t, "no such part"))?;
        let Some((off, len)) = expose::clamp(part, off, len) else {
            return Ok(Bytes::Owned(Vec::new()));
        };
        self.guard.check()?;
        match layout.encoding {
            Encoding::Raw => {
                if self.opts.verify_raw {
                    self.checked(t, ti)?;
                }
                let blob = self.zt.blob(t);
                if let Some((at, n)) = expose::direct_range(part, t.endian, off, len) {
                    let (start, end) = (t.offset + at, t.offset + t.size);
                    if n < window::STREAMING as u64 {
                        // A small read: one copy costs less than mapping
                        // its pages and, later, letting go of them.
                        let mut v = vec![0; n as usize];
                        let r = self.zt.file().read_exact_at(&mut v, start);
                        // A file cut short: the guard says so best.
                        self.guard.check()?;
                        r.map_err(|e| self.fail(t, format!("cannot read the data: {e}")))?;
                        return Ok(Bytes::Owned(v));
                    }
                    self.window.ahead(start as usize, n as usize, end as usize);
                    let bytes = &blob[at as usize..(at + n) as usize];
                    return Ok(Bytes::Mapped(&self.window, bytes));
                }
                let mut touched = Touched::default();
                let v: Result<Vec<u8>, String> =
                    expose::gather(part, t.endian, off, len, |at, out| {
                        out.copy_from_slice(&blob[at as usize..at as usize + out.len()]);
                        self.window
                            .touch(&mut touched, (t.offset + at) as usize, out.len());
                        Ok(())
                    });
                self.window.served_touched(touched);
                // The copy above touched the mmap: make sure it was still there.
                self.guard.check()?;
                v.map(Bytes::Owned)
            }
            Encoding::Zstd => {
                self.checked(t, ti)?;
                let plan = self.plan(t, ti)?;
                // One unit holds the whole range: reply from it without a copy.
                if let Some((at, n)) = expose::direct_range(part, t.endian, off, len)
                    && let Some((buf, start)) = self.unit_containing(t, ti, plan, at, n)?
                {
                    return Ok(Bytes::Shared(buf, start, n as usize));
                }
                expose::gather(part, t.endian, off, len, |at, out| {
                    self.fetch(t, ti, plan, at, out)
                })
                .map(Bytes::Owned)
            }
        }
    }

    /// Checks the tensor's checksum once per mount (over the on-disk bytes).
    fn checked(&self, t: &Tensor, ti: usize) -> Result<(), String> {
        self.states[ti]
            .checked
            .get_or_init(|| {
                let verdict = self.zt.verify(t);
                self.guard.check()?;
                match verdict {
                    Verdict::Mismatch { expected, actual } => {
                        Stats::add(&self.stats.checksum_failures, 1);
                        Err(self.fail(
                            t,
                            format!("checksum mismatch: index says {expected}, blob has {actual}"),
                        ))
                    }
                    Verdict::Unverifiable(algo) => {
                        log::warn!(
                            "{}",
                            self.fail(
                                t,
                                format!(
                                    "checksum {algo:?} uses an unknown algorithm; served unverified"
                                )
                            )
                        );
                        Ok(())
                    }
                    Verdict::Absent | Verdict::Verified => Ok(()),
                }
            })
            .clone()
    }

    fn plan(&self, t: &Tensor, ti: usize) -> Result<&Plan, String> {
        self.states[ti]
            .plan
            .get_or_init(|| {
                let decoded = t.layout.as_ref().map(|l| l.decoded_size).unwrap_or(0);
                let limit = self.cache.limit();
                // A frame list is kept while the file is mounted: it is
                // counted in the cache (`Cache::hold`) before it is built,
                // and a tensor whose list does not fit there is decoded as
                // one stream. A table that cannot be held, or that does not
                // agree with the blob, leaves it to the walk below, which
                // counts the frames there are.
                if let Some((size, items)) = frame_table(t)
                    && (2..=zstd_blob::MAX_FRAMES).contains(&items.len())
                    && size <= limit / 4
                {
                    let cost = list_cost(items.len());
                    if self.cache.hold(cost) {
                        let sizes: Option<Vec<u64>> = items.iter().map(|v| as_u64(v).ok()).collect();
                        match sizes.and_then(|s| zstd_blob::frames_from_table(size, &s, t.size, decoded)) {
                            Some(frames) => return Ok(Plan::Frames(frames)),
                            None => self.cache.unhold(cost),
                        }
                    }
                }
                // One frame that says it holds the whole tensor: nothing to
                // walk (a walk touches every block header of the blob). The
                // decoder checks the rest: that the frame ends the blob and
                // decodes to exactly that size.
                let blob = self.zt.blob(t);
                if zstd_blob::first_frame_size(blob) == Some(decoded) {
                    self.guard.check()?;
                    return Ok(whole_or_spill(decoded, limit, true));
                }
                // Counted before the list is built: a blob of a million
                // tiny frames gets no list it cannot keep.
                let count = zstd_blob::count_frames(blob).map_err(|why| self.fail(t, why));
                let held = match count {
                    Ok(Some(n)) if n > 1 => {
                        let cost = list_cost(n);
                        let held = self.cache.hold(cost).then_some(cost);
                        if held.is_none() {
                            log::info!(
                                "{}",
                                self.fail(t, format!("the list of its {n} zstd frames ({cost} bytes) does not fit in a quarter of the cache: decoded as one stream"))
                            );
                        }
                        held
                    }
                    _ => None,
                };
                let frames = match (&count, held) {
                    (Ok(Some(n)), _) if *n == 1 || held.is_some() => {
                        // Exactly as long as counted.
                        zstd_blob::scan_frames_sized(blob, *n).map_err(|why| self.fail(t, why))
                    }
                    _ => Ok(None),
                };
                // The walks touched a page per block header across the blob.
                self.zt.release(self.zt.blob(t));
                let plan = (|| {
                    self.guard.check()?;
                    count?;
                    let frames = frames?;
                    let one_frame = frames.as_ref().is_some_and(|f| f.len() == 1);
                    if let Some(frames) = frames {
                        let total = frames.last().map_or(0, |f| f.d_start + f.d_len);
                        if total != decoded {
                            return Err(self.fail(
                                t,
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
                })();
                if let Some(cost) = held
                    && !matches!(plan, Ok(Plan::Frames(_)))
                {
                    self.cache.unhold(cost);
                }
                plan
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The cached unit holding decoded bytes `[at, at+n)`, if one does.
    fn unit_containing(
        &self,
        t: &Tensor,
        ti: usize,
        plan: &Plan,
        at: u64,
        n: u64,
    ) -> Result<Option<(Arc<Buf>, usize)>, String> {
        match plan {
            Plan::Frames(frames) => {
                let k = frame_at(frames, at);
                let f = frames[k];
                if at + n > f.d_start + f.d_len {
                    return Ok(None);
                }
                let buf = self.frame(t, ti, k, &f)?;
                Ok(Some((buf, (at - f.d_start) as usize)))
            }
            Plan::Whole { one_frame } => {
                let buf = self.whole(t, ti, *one_frame)?;
                buf.range(at as usize, n as usize)
                    .map_err(|why| self.unit_error(t, why))?;
                Ok(Some((buf, at as usize)))
            }
            Plan::Spill { .. } => Ok(None),
        }
    }

    /// Copies decoded bytes `[at, at+out.len())` into `out`.
    fn fetch(
        &self,
        t: &Tensor,
        ti: usize,
        plan: &Plan,
        at: u64,
        out: &mut [u8],
    ) -> Result<(), String> {
        match plan {
            Plan::Frames(frames) => {
                let mut pos = at;
                let mut done = 0usize;
                let mut k = frame_at(frames, at);
                while done < out.len() {
                    let f = frames[k];
                    let buf = self.frame(t, ti, k, &f)?;
                    let from = (pos - f.d_start) as usize;
                    let n = (buf.len() - from).min(out.len() - done);
                    let bytes = buf.range(from, n).map_err(|why| self.unit_error(t, why))?;
                    out[done..done + n].copy_from_slice(bytes);
                    done += n;
                    pos += n as u64;
                    k += 1;
                }
                Ok(())
            }
            Plan::Whole { one_frame } => {
                let buf = self.whole(t, ti, *one_frame)?;
                let bytes = buf
                    .range(at as usize, out.len())
                    .map_err(|why| self.unit_error(t, why))?;
                out.copy_from_slice(bytes);
                Ok(())
            }
            Plan::Spill { one_frame } => self
                .spill(t, ti, *one_frame)?
                .read(at, out)
                .map_err(|why| self.unit_error(t, why)),
        }
    }

    fn frame(&self, t: &Tensor, ti: usize, k: usize, f: &Frame) -> Result<Arc<Buf>, String> {
        let src = &self.zt.blob(t)[f.c_start as usize..(f.c_start + f.c_len) as usize];
        let out = self.cache.get((ti as u32, k as u32), f.d_len, |dst| {
            let r = zstd_blob::decode_frame(src, dst, f.d_len as usize);
            self.zt.release(src);
            r
        });
        self.guard.check()?;
        self.read_ahead(ti, k);
        out.map_err(|why| self.fail(t, format!("frame {k}: {why}")))
    }

    /// After frame `k` of a tensor read in order, queues decodes of the
    /// next frames so they are ready (or under way) when the reader gets
    /// there. Random readers get no read-ahead.
    fn read_ahead(&self, ti: usize, k: usize) {
        let st = &self.states[ti];
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
            if !self.cache.has((ti as u32, j as u32)) {
                let me = self.me.clone();
                let queued = self.prefetcher.submit(Box::new(move || {
                    if let Some(data) = me.upgrade() {
                        data.prefetch(ti, j);
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

    fn prefetch(&self, ti: usize, k: usize) {
        // Queued twice, or already picked up by a reader: nothing to do, and
        // no waiting for someone else's decode.
        if self.cache.has((ti as u32, k as u32)) {
            return;
        }
        let t = &self.zt.catalog().tensors[ti];
        let Some(Ok(Plan::Frames(frames))) = self.states[ti].plan.get() else {
            return;
        };
        let Some(f) = frames.get(k) else { return };
        let src = &self.zt.blob(t)[f.c_start as usize..(f.c_start + f.c_len) as usize];
        // Errors surface when a reader asks for this frame itself.
        let _ = self.cache.get((ti as u32, k as u32), f.d_len, |dst| {
            let r = zstd_blob::decode_frame(src, dst, f.d_len as usize);
            self.zt.release(src);
            r
        });
    }

    /// A unit that failed while a reader waited for it: the file changing
    /// under the mount is said as such, anything else names the tensor.
    fn unit_error(&self, t: &Tensor, why: String) -> String {
        match self.guard.check() {
            Err(changed) => changed,
            Ok(()) => self.fail(t, why),
        }
    }

    fn whole(&self, t: &Tensor, ti: usize, one_frame: bool) -> Result<Arc<Buf>, String> {
        let decoded = t.layout.as_ref().map(|l| l.decoded_size).unwrap_or(0);
        let src = self.zt.blob(t);
        let key = (ti as u32, 0);
        let out = if decoded >= self.opts.progressive_min && self.trusted_early(t, src, one_frame) {
            self.cache
                .get_filling(key, decoded, |buf| self.start_decoder(ti, buf))
        } else {
            self.cache.get(key, decoded, |dst| {
                let r = zstd_blob::decode_to_vec(src, dst, decoded as usize);
                self.zt.release(src);
                r
            })
        };
        self.guard.check()?;
        out.map_err(|why| self.fail(t, why))
    }

    /// Whether bytes of `src` may be served before its frame has ended. The
    /// end of a zstd frame is where zstd checks its own content checksum; a
    /// blob is trusted early if the tensor's index checksum already vouched
    /// for the compressed bytes, or if it is one frame without a checksum.
    /// (A blob whose first frame declares the whole size is served from that
    /// frame only: anything after it fails before the last byte is out.)
    fn trusted_early(&self, t: &Tensor, src: &[u8], one_frame: bool) -> bool {
        let verified = t.checksum.as_ref().is_some_and(|c| c.algorithm().is_some());
        verified || (one_frame && zstd_blob::frame_has_checksum(src) == Some(false))
    }

    /// Decodes a filling unit on a thread of its own, one per core at most;
    /// past that the reader that asked decodes it on its own thread.
    fn start_decoder(&self, ti: usize, buf: Arc<Buf>) {
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
                    me.decode_filling(ti, &b);
                });
            if spawned.is_ok() {
                return;
            }
        }
        self.decoders.fetch_sub(1, Relaxed);
        self.decode_filling(ti, &buf);
    }

    fn decode_filling(&self, ti: usize, buf: &Arc<Buf>) {
        let t = &self.zt.catalog().tensors[ti];
        let Some(mut w) = buf.filling().and_then(|f| f.writer()) else {
            return;
        };
        // Whatever happens below, even a panic, a failed unit leaves the
        // cache, so the next reader starts again (and fails again, with the
        // reason) instead of finding a dead one.
        let mut discard = Discard {
            cache: &self.cache,
            key: (ti as u32, 0),
            buf,
            armed: true,
        };
        let r = self.decode_progressively(self.zt.blob_source(t), &mut w, buf.len());
        // The plan and the trust check read the frame header through the
        // mapping; let go of it with the rest.
        self.zt.release(self.zt.blob(t));
        if r.is_ok() {
            Stats::add(&self.stats.decompressed_bytes, buf.len() as u64);
            discard.armed = false;
        }
        // Out of the cache before readers hear of the failure.
        drop(discard);
        w.finish(r);
    }

    /// Decodes `src` straight into `w`, publishing what is there after
    /// each step of compressed input; the last byte only once the stream
    /// has been checked to its end, so a reader of the whole tensor never
    /// gets all of a blob that fails after it.
    ///
    /// The buffer is faulted in ahead by the populate thread
    /// ([`Data::start_decoder`]), not here: on two cores, faulting from both
    /// threads at once slowed the decoder more than it saved (BENCHMARKS.md).
    fn decode_progressively(
        &self,
        src: zstd_blob::Source<'_>,
        w: &mut Writer,
        len: usize,
    ) -> Result<(), String> {
        // SAFETY: the writer's buffer is `len` bytes, lives as long as `w`
        // (which outlives the decoder), and only this decoder writes it, at
        // or past what was committed.
        let mut dec = unsafe { zstd_blob::DirectDecoder::new(src, w.as_mut_ptr(), len) }?;
        while dec.produced() < len {
            let stepped = dec.step(PROGRESSIVE_STEP);
            // Bytes decoded from a file that changed are not published; and
            // a change explains a failed step (a short read) best.
            self.guard.check()?;
            stepped?;
            w.commit_to(dec.produced().min(len.saturating_sub(1)));
        }
        dec.finish()?;
        w.commit_to(len);
        Ok(())
    }

    fn spill(&self, t: &Tensor, ti: usize, one_frame: bool) -> Result<Arc<Spill>, String> {
        let mut slot = self.states[ti]
            .spill
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slot.as_ref().filter(|s| !s.failed_for_now()) {
            return Ok(s.clone());
        }
        // A failed spill's file (unlinked) goes once its readers are done,
        // before the free space is asked: it may be what filled the disk.
        *slot = None;
        let decoded = t.layout.as_ref().map(|l| l.decoded_size).unwrap_or(0);
        let dir = &self.opts.cache_dir;
        if spill::room(dir, decoded).is_err() {
            self.drop_idle_spills(ti, dir, decoded);
        }
        let early = self.trusted_early(t, self.zt.blob(t), one_frame);
        let spill = Spill::start(&self.zt, &self.guard, ti, decoded, dir, early, &self.stats)
            .map_err(|why| self.fail(t, why))?;
        log::info!(
            "{}",
            self.fail(
                t,
                format!(
                    "{decoded} decoded bytes exceed half the cache; spilling to {}",
                    dir.display()
                )
            )
        );
        *slot = Some(spill.clone());
        Ok(spill)
    }
}

impl Data {
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
        for (i, state) in self.states.iter().enumerate() {
            if let Ok(slot) = state.spill.try_lock()
                && slot.as_ref().is_some_and(|s| idle(i, s))
            {
                let t = &self.zt.catalog().tensors[i];
                freeable += t.layout.as_ref().map_or(0, |l| l.decoded_size);
            }
        }
        let free = spill::free_bytes(dir).unwrap_or(0);
        if decoded > (free.saturating_add(freeable) / 4).saturating_mul(3) {
            return;
        }
        for (i, state) in self.states.iter().enumerate() {
            let Ok(mut slot) = state.spill.try_lock() else {
                continue;
            };
            if slot.as_ref().is_some_and(|s| idle(i, s)) {
                let idle = slot.take();
                drop(slot);
                drop(idle);
                log::info!(
                    "{}: dropped its spill to make room for another",
                    self.zt.catalog().tensors[i].name
                );
                if spill::room(dir, decoded).is_ok() {
                    return;
                }
            }
        }
    }
}

/// Most reasons one tensor's reads log at error level while mounted.
const LOGGED_REASONS: u8 = 8;

/// Memory a kept frame list of `n` frames takes.
fn list_cost(n: usize) -> u64 {
    (n * std::mem::size_of::<Frame>()) as u64
}

/// The frame table our writer records (decoded bytes per frame, and each
/// frame's compressed size), when present: no walk over the blob (a 1 GiB
/// tensor has 1024 frames to find otherwise). Checked when it is built.
fn frame_table(t: &Tensor) -> Option<(u64, &[Value])> {
    let size = as_u64(t.custom(FRAME_SIZE_KEY)?).ok()?;
    let Value::Array(items) = t.custom(FRAMES_KEY)? else {
        return None;
    };
    Some((size, items))
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
