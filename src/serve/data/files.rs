//! Decoded files the kernel may be handed: units decoded into files,
//! complete spills, and what reads have written of a file's bytes.

use std::fs::File;
use std::sync::atomic::Ordering::Relaxed;

use crate::catalog::{Check, Codec, PartMap, expose};
use crate::serve::spill;

use super::{Data, DecodedFile, KEEP_BEHIND, Plan, RUN_SLACK};

impl Data {
    /// Whether whole units go into files (see [`Data::unit_file`]).
    pub fn set_units_in_files(&self, on: bool) {
        self.units_in_files.store(on, Relaxed);
    }

    /// An unlinked file of `len` bytes, its disk reserved, under
    /// `--cache-dir`, for a whole unit to be decoded into, when whole units
    /// go into files and the directory has the room a spill would need.
    /// `None` otherwise: the unit is decoded into memory.
    pub(super) fn unit_file(&self, len: u64) -> Option<File> {
        if !self.units_in_files.load(Relaxed) {
            return None;
        }
        // On the cache directory's thread: a directory that does not answer
        // (frozen for a snapshot) must not hold this worker, nor the readers
        // waiting on this unit.
        let dir = self.opts.cache_dir.clone();
        let Some(made) = crate::serve::deadline::within(move || spill::reserved_file(&dir, len))
        else {
            if !self.unit_file_late.swap(true, Relaxed) {
                log::warn!(
                    "{} did not make a file within {:?}: large units are decoded into memory \
                     until it answers",
                    self.opts.cache_dir.display(),
                    crate::serve::deadline::DEADLINE
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
    pub(super) fn all_checks_passed(&self, bi: usize) -> bool {
        let st = &self.states[bi];
        if !matches!(st.checked.get(), Some(Ok(()))) {
            return false;
        }
        // A raw blob's ranges were checked with the rest of it.
        let raw = matches!(self.blob(bi).codec, Codec::Raw);
        let ranges = crate::serve::lock(&st.ranges);
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
    pub(super) fn whole_blob_part(&self, ti: usize, pi: usize) -> Option<usize> {
        let p = self.part_of(ti, pi)?;
        let b = self.blob(p.blob);
        let as_stored = p.order == crate::catalog::Endian::Little || p.dtype.size() == 1;
        let whole = matches!(p.map, PartMap::Contiguous { start: 0 }) && p.nbytes == b.decoded_len;
        (as_stored && whole && !matches!(b.codec, Codec::Raw)).then_some(p.blob)
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

    /// Bytes `range` (from, to) of part `pi` of tensor `ti` are in a
    /// backing file now: see [`Data::copied_all`].
    pub fn copied(&self, ti: usize, pi: usize, range: (u64, u64)) {
        let Some(part) = self.part_of(ti, pi) else {
            return;
        };
        if let Some((at, n)) = expose::direct_range(part, range.0, range.1.saturating_sub(range.0))
        {
            self.let_go(part.blob, &[(at, at + n)]);
        }
    }

    /// Each (tensor, part, (from, to)) says those bytes of that part are in
    /// a backing file now (its fill wrote them, or the reads did): the
    /// frames that lie wholly in what they cover of a blob together leave
    /// the cache, and so does a unit they cover whole, unless someone holds
    /// it. Kept, they would hold the file's size in the daemon's memory,
    /// which no swap can reclaim, beside the file's own page cache, which
    /// the kernel can; the next reader is passed through to the file.
    /// Together, because a stream shared by several tensors has frames
    /// across their boundaries, and is one unit that no one part covers.
    /// Parts whose bytes are swapped or gathered on the way out keep their
    /// frames (no range of the blob is theirs alone).
    pub fn copied_all(&self, ranges: impl IntoIterator<Item = (usize, usize, (u64, u64))>) {
        let mut by_blob: std::collections::HashMap<usize, Vec<(u64, u64)>> = Default::default();
        for (ti, pi, (from, to)) in ranges {
            let Some(part) = self.part_of(ti, pi) else {
                continue;
            };
            if let Some((at, n)) = expose::direct_range(part, from, to.saturating_sub(from)) {
                by_blob.entry(part.blob).or_default().push((at, at + n));
            }
        }
        for (bi, mut covered) in by_blob {
            covered.sort_unstable();
            let merged = covered
                .into_iter()
                .fold(Vec::<(u64, u64)>::new(), |mut m, r| {
                    match m.last_mut() {
                        Some(last) if r.0 <= last.1 => last.1 = last.1.max(r.1),
                        _ => m.push(r),
                    }
                    m
                });
            self.let_go(bi, &merged);
        }
    }

    /// Drops from the cache the units of blob `bi` that lie wholly in one
    /// of `covered` (sorted, apart), unless held: frames, or the blob's one
    /// unit unless it is decoded into a file (its pages are the kernel's
    /// already, and the file may become the tensor's own backing file).
    fn let_go(&self, bi: usize, covered: &[(u64, u64)]) {
        let within =
            |start: u64, len: u64| covered.iter().any(|&(a, b)| a <= start && start + len <= b);
        match self.states.get(bi).and_then(|s| s.plan.get()) {
            Some(Ok(Plan::Frames(frames))) => {
                for &(a, b) in covered {
                    let first = frames.partition_point(|f| f.d_start < a);
                    for (k, f) in frames.iter().enumerate().skip(first) {
                        if f.d_start + f.d_len > b {
                            break;
                        }
                        self.cache.drop_idle((bi as u32, k as u32));
                    }
                }
            }
            Some(Ok(Plan::Whole { .. })) if within(0, self.blob(bi).decoded_len) => {
                let key = (bi as u32, 0);
                let in_file = self
                    .cache
                    .peek(key)
                    .is_some_and(|u| u.filling().is_some_and(|f| f.in_a_file()));
                if !in_file {
                    self.cache.drop_idle(key);
                }
            }
            _ => {}
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
            let mut run = crate::serve::lock(&st.run);
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
}
