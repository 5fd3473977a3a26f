//! Opens and closes: whether the kernel is handed a backing file or the
//! daemon serves the file, the file its reads write through to, and what
//! a close leaves (a fill, a kept file, nothing).

use super::*;

/// An open handle of a tensor or view file.
pub(super) struct OpenFile {
    pub(super) ino: Ino,
    /// Its backing when the kernel reads it.
    pub(super) backing: Option<Arc<Backing>>,
    /// The backing file its reads write through to, when the daemon
    /// serves it and its bytes take work.
    pub(super) partial: Option<Arc<Partial>>,
    /// Served, its bytes take work, and no backing file found for its
    /// reads yet: its reads join one other opens write, and a read from
    /// offset 0 makes one (see `TensorFs::through_from`).
    pub(super) through_later: bool,
    /// The spill its reads come from, held while it is read (see
    /// `TensorFs::hold_spill`): (tensor, part, the hold).
    pub(super) reading: Option<Reading>,
    /// Bytes served through it.
    pub(super) read: u64,
    /// When it was last read.
    pub(super) last_read: std::time::Instant,
}

/// A spill an open holds while it reads: (tensor, part, the hold).
pub(super) type Reading = (usize, usize, Hold);

/// Open handles of tensor and view files.
#[derive(Default)]
pub(super) struct Opens {
    pub(super) by_fh: HashMap<u64, OpenFile>,
    /// Handles the daemon serves, by inode. While one is open its inode is
    /// not passed through: the kernel refuses (EIO) a passthrough open of an
    /// inode with page-cache opens or mappings.
    pub(super) served: HashMap<Ino, usize>,
    /// Bytes the daemon has served of each inode since mount (what the
    /// page cache served again is not among them).
    pub(super) served_bytes: HashMap<Ino, u64>,
    /// Last served handles of an inode closed whose fill is not decided
    /// yet: counted as served, so that no reader of `.ztensor/stats` sees
    /// neither an open nor a fill between the close and the fill's start.
    pub(super) closing: usize,
}

/// How long an open that holds a spill may go without a read before the
/// spill is let go of when another needs its room: a reader part way
/// through a file reads again within it; an open kept after a peek, or a
/// mapping touched here and there, does not.
pub(super) const HOLD_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Lets go of the spills held by opens not read for [`HOLD_IDLE`]; true
/// when it let go of one.
pub(super) fn let_go_of_idle_spills(opens: &Mutex<Opens>) -> bool {
    let mut idle = Vec::new();
    {
        let mut opens = crate::mount::lock(opens);
        for o in opens.by_fh.values_mut() {
            if o.reading.is_some() && o.last_read.elapsed() >= HOLD_IDLE {
                idle.extend(o.reading.take());
            }
        }
    }
    // Dropped outside the lock: the last hold of a dropped spill closes it.
    !idle.is_empty()
}

impl TensorFs {
    /// Opens a file for reading: (handle, how it is read).
    pub fn open(&self, ino: Ino, write: bool) -> Result<(u64, Open), Errno> {
        if write {
            return Err(libc::EROFS);
        }
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        let fh = self.next_fh.fetch_add(1, Relaxed);
        match &node.kind {
            NodeKind::Dir { .. } => Err(libc::EISDIR),
            NodeKind::File(c @ (Content::Part { .. } | Content::ViewData { .. })) => {
                let backing = self.backing(ino, c)?;
                let mut opens = crate::mount::lock(&self.opens);
                let mut open = OpenFile {
                    ino,
                    backing: None,
                    partial: None,
                    through_later: false,
                    reading: None,
                    read: 0,
                    last_read: std::time::Instant::now(),
                };
                if let Some(b) = backing.filter(|_| !opens.served.contains_key(&ino)) {
                    self.backings.opened(&b);
                    open.backing = Some(b.clone());
                    opens.by_fh.insert(fh, open);
                    return Ok((fh, Open::Backed(b)));
                }
                drop(opens);
                let mode = self.cache_mode(c);
                // Every open, not only those that keep the page cache: an
                // open that does not drops the inode's page cache, and a
                // reader holding a mapping from before the change would
                // then fault in pages the daemon now refuses (SIGBUS on
                // bytes it had read).
                self.sources_unchanged(c)?;
                // A backing file for its reads is made at its first read
                // from the start, not now: an open that reads here and
                // there (a random reader's peek) would only make the file
                // and drop it at its close, a new inode each time.
                open.through_later = self.passthrough() && self.worth_filling(c);
                let mut opens = crate::mount::lock(&self.opens);
                *opens.served.entry(ino).or_default() += 1;
                self.backings.served_inodes(opens.served.len());
                opens.by_fh.insert(fh, open);
                Stats::add(&self.data.stats().fuse_opens, 1);
                Ok((fh, Open::Served(mode)))
            }
            NodeKind::File(c) => {
                let bytes = self.rendered(ino, c)?;
                self.handles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(fh, (ino, bytes));
                Ok((
                    fh,
                    Open::Served(if is_live(c) {
                        CacheMode::DirectIo
                    } else {
                        CacheMode::KeepCache
                    }),
                ))
            }
        }
    }

    /// Whether the files of the tensors files of content `c` show are as
    /// they were at mount, else the errno a read would get (`ESTALE` once
    /// one changed). Asked at each open the daemon serves: the reads of
    /// one that keeps the kernel's page cache never reach the daemon, which
    /// would otherwise not see a change the cache predates; one that does
    /// not keep it drops it.
    pub(super) fn sources_unchanged(&self, c: &Content) -> Result<(), Errno> {
        let mut verdict = Ok(());
        // Each file once: a view of 10^5 tensors is of one file, or a few.
        let mut checked = std::collections::HashSet::new();
        self.any_part(c, |t, p| {
            if !checked.insert(self.data.source_of(t, p)) {
                return false;
            }
            verdict = self.data.source_verdict(t, p).map_err(|e| e.errno());
            verdict.is_err()
        });
        verdict
    }

    /// How the daemon serves a tensor or view file.
    pub(super) fn cache_mode(&self, c: &Content) -> CacheMode {
        // Decoded data is worth keeping: a second read from the page
        // cache beats decoding again or copying from our cache. With
        // passthrough a backing file keeps it instead (filled after this
        // open), and the kernel's copy into its own cache would only cost
        // the first read a quarter of its speed and the memory twice.
        let decoded = self
            .one_part(c)
            .and_then(|(t, part, _)| self.part(t, part))
            .is_some_and(|p| !matches!(self.data.catalog().blobs[p.blob].codec, Codec::Raw));
        if self.direct_io && (!decoded || self.passthrough()) {
            CacheMode::DirectIo
        } else {
            CacheMode::KeepCache
        }
    }

    /// Sets the most backing files at once, and half as many spills (each
    /// holds a descriptor; unbounded until set).
    pub fn limit_files(&self, backing_files: usize) {
        self.backings.set_max_files(backing_files);
        self.data.set_max_spills(backing_files / 2);
    }

    /// The kernel takes backing files (or, with `false`, refused one: from
    /// now on every open is served by the daemon).
    pub fn set_passthrough(&self, on: bool) {
        self.passthrough
            .store(on && self.backings.enabled(), Relaxed);
        self.data.set_units_in_files(self.passthrough());
        self.data
            .stats()
            .passthrough
            .store(self.passthrough.load(Relaxed) as u64, Relaxed);
    }

    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Relaxed)
    }

    /// The backing file the kernel may read files of content `c` from,
    /// when there is one now. When its bytes would be the source's: ESTALE
    /// if the source changed, EIO if it failed a check (logged by the data
    /// layer).
    pub(super) fn backing(&self, ino: Ino, c: &Content) -> Result<Option<Arc<Backing>>, Errno> {
        if !self.passthrough() {
            return Ok(None);
        }
        if let Some(f) = self.composed(c).filter(|f| f.is_source) {
            return self.source_backing(c, &f);
        }
        if let Some((tensor, part, _)) = self.clonable(c) {
            return self.cloned_backing(c, tensor, part);
        }
        // No served open holds it: a last close may be handing its file
        // to the filler.
        let closing = !crate::mount::lock(&self.opens).served.contains_key(&ino);
        let found = match self.backings.ready_or_wait(c, closing) {
            Some(b) => Some(b),
            // Decoded into a file by a read of another file (its `.npy`, say).
            None => self
                .adopt_decoded(ino, c)
                .then(|| self.backings.ready_or_wait(c, closing))
                .flatten(),
        };
        // A decoded file holds checked bytes, but once the source is seen
        // changed no read of it is served (its bytes may have been read
        // in a change the times did not show): nor is an open of it.
        if found.is_some() {
            self.sources_unchanged(c)?;
        }
        Ok(found)
    }

    /// Has the file that the blob of tensor file `ino` (content `c`) was
    /// decoded into (see `Data::decoded_file`) become its backing, the
    /// inode's page cache dropped first. False when there is none.
    pub(super) fn adopt_decoded(&self, ino: Ino, c: &Content) -> bool {
        let Content::Part { tensor, part } = c else {
            return false;
        };
        let Some(d) = self.data.decoded_file(*tensor, *part) else {
            return false;
        };
        let len = self.part(*tensor, *part).map_or(0, |p| p.nbytes);
        let holds = d.holds.map(|s| s as Arc<dyn std::any::Any + Send + Sync>);
        let segments = self.segments(c);
        // The unit stays cached (its pages are the file's, nothing more)
        // for reads of the tensor's views, until the cache needs room.
        self.backings
            .adopt(c, ino, (d.file, holds, len), &self.data, segments)
    }

    /// Whether files of content `c` are worth a filled backing file: some
    /// of their bytes take work to make. (Asked at every open: no segments
    /// built; a view's file is described once, its header with it.)
    pub(super) fn worth_filling(&self, c: &Content) -> bool {
        match c {
            Content::Part { tensor, part } => self.needs_work(*tensor, *part),
            // A view that is its source is backed by the source itself.
            Content::ViewData { .. } => self.composed(c).is_some_and(|f| {
                !f.is_source && f.entries.iter().any(|e| self.needs_work(e.tensor, 0))
            }),
            _ => false,
        }
    }

    /// Whether some bytes of files of content `c` come from a remote
    /// object (fetched, not only read).
    pub(super) fn fetched(&self, c: &Content) -> bool {
        self.any_part(c, |t, p| self.fetched_part(t, p))
    }

    /// Whether `pred` holds for a tensor part (tensor, part) that files of
    /// content `c` show; false for generated files.
    pub(super) fn any_part(&self, c: &Content, pred: impl FnMut(usize, usize) -> bool) -> bool {
        any_part_of(&self.tree, &self.data, c, pred)
    }

    /// When the last open of `ino` the daemon served is closed, `read`
    /// bytes of it served since mount: fills what its reads did not write
    /// of a backing file for it when those are at least half of a file
    /// worth one, else drops what they wrote (a peek at a large tensor
    /// decodes no more than it read).
    pub(super) fn maybe_fill(&self, ino: Ino, read: u64) {
        let Some(NodeKind::File(c)) = self.tree.node(ino).map(|n| &n.kind) else {
            return;
        };
        if !matches!(c, Content::Part { .. } | Content::ViewData { .. }) {
            return;
        }
        let len = self.size_of(ino, c);
        if !self.passthrough() {
            // Refused by the kernel since its reads began a backing file:
            // none will be passed through, so what they wrote goes now
            // (kept, it held its disk and its charge until unmount). A
            // drop makes no fill: no segments for one.
            if self.backings.being_written(c).is_some() {
                self.backings
                    .close(c, ino, len, Fill::Drop, &self.data, Vec::new());
            }
            return;
        }
        // A peek (less than half of the file) keeps no disk.
        let most = read.saturating_mul(2) >= len;
        if self.worth_filling(c) {
            if most && self.adopt_decoded(ino, c) {
                return;
            }
            let fill = if !most || !self.fits_beside_spills(c, len) {
                Fill::Drop
            } else if self.fetched(c) {
                Fill::IfWhole
            } else {
                Fill::Rest
            };
            self.backings
                .close(c, ino, len, fill, &self.data, self.segments(c));
        } else if most && let Some((tensor, part, head)) = self.clonable(c) {
            self.clone_read(ino, c, (tensor, part), head);
        }
    }

    /// The backing file a served open of `ino` (content `c`) writes its
    /// reads through to, when `c` is worth one (see [`Partial`]).
    pub(super) fn write_through(&self, ino: Ino, c: &Content) -> Option<Arc<Partial>> {
        if !self.passthrough() {
            return None;
        }
        let len = self.size_of(ino, c);
        if !self.worth_filling(c) || !self.fits_beside_spills(c, len) {
            return None;
        }
        self.backings.begin(c, len)
    }

    /// Whether a filled backing file of `len` bytes for files of content
    /// `c` fits in `--decoded-cache-size` beside the spills of the tensors
    /// they show. Its fill reads those spills back, so room made by
    /// dropping them would only make them again; where both do not fit,
    /// the daemon serves the files from the spills.
    /// (A fill reads a view's tensors one after another, so beside the
    /// largest of their spills: the others may go while it runs.)
    pub(super) fn fits_beside_spills(&self, c: &Content, len: u64) -> bool {
        let disk = self.data.decoded_disk();
        if len.saturating_add(disk.spills()) <= disk.limit() {
            return true;
        }
        let mut largest = 0;
        self.any_part(c, |t, p| {
            largest = largest.max(self.data.spill_len(t, p).unwrap_or(0));
            false
        });
        len.saturating_add(largest) <= disk.limit()
    }

    /// The source file as the backing of a view `l` that is that file,
    /// after the checks a read of every tensor in it would make; `None`
    /// while it is a remote object whose cache file lacks some of it (the
    /// daemon serves the view, fetching, until every block is there), and
    /// when a tensor in it fails its checks: the daemon serves the view
    /// then, as without passthrough, failing only the reads of that
    /// tensor's range (the kernel, reading the file itself, would serve
    /// every byte). `ESTALE` once the source changed, as every open gets.
    pub(super) fn source_backing(
        &self,
        c: &Content,
        l: &Composed<'_>,
    ) -> Result<Option<Arc<Backing>>, Errno> {
        let Some(f) = self.data.whole_file(0) else {
            return Ok(None);
        };
        for e in l.entries.iter() {
            match self.check_raw(e.tensor, 0) {
                Ok(()) => {}
                Err(libc::ESTALE) => return Err(libc::ESTALE),
                Err(_) => return Ok(None),
            }
        }
        let file = f.file().try_clone().map_err(|e| {
            log::error!("{}: cannot hand the file to the kernel: {e}", f.label());
            libc::EIO
        })?;
        Ok(Some(self.backings.source(c, file, l.size)))
    }

    /// Whether part `pi` of tensor `ti` is more than a stored range of a
    /// local file: decoded, gathered, byte-swapped or fetched.
    pub(super) fn needs_work(&self, ti: usize, pi: usize) -> bool {
        let Some(p) = self.part(ti, pi) else {
            return false;
        };
        let b = &self.data.catalog().blobs[p.blob];
        // A raw range of a remote object is not: the daemon serves it from
        // the object's cache file, where a remount finds it, and a copy of
        // it made while a cold read is served would cost that read a
        // quarter of its speed (the copies, not the requests, bound a
        // fetch on loopback).
        !matches!(b.codec, Codec::Raw)
            || !matches!(p.map, crate::catalog::PartMap::Contiguous { .. })
            || (p.order == crate::catalog::Endian::Big && p.dtype.size() > 1)
    }

    /// Whether part `pi` of tensor `ti` is stored in a remote object.
    pub(super) fn fetched_part(&self, ti: usize, pi: usize) -> bool {
        self.part(ti, pi).is_some_and(|p| {
            let b = &self.data.catalog().blobs[p.blob];
            self.data.local_file(b.source).is_none()
        })
    }

    /// What tensor or view file `c` is made of, in order.
    pub(super) fn segments(&self, c: &Content) -> Vec<Segment> {
        let part = |tensor: usize, part: usize| {
            let len = self.part(tensor, part).map_or(0, |p| p.nbytes);
            Segment::Part { tensor, part, len }
        };
        match c {
            Content::Part { tensor, part: p } => vec![part(*tensor, *p)],
            Content::ViewData { .. } => match self.composed(c) {
                Some(f) => std::iter::once(Segment::Bytes(Arc::new(f.header.into_owned())))
                    .chain(f.entries.iter().map(|e| part(e.tensor, 0)))
                    .collect(),
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    pub fn release(&self, fh: u64) {
        if fh == 0 {
            return;
        }
        let (data_handle, last) = {
            let mut opens = crate::mount::lock(&self.opens);
            let gone = opens.by_fh.remove(&fh);
            let mut last = None;
            if let Some(OpenFile {
                ino, backing: None, ..
            }) = &gone
                && let Some(n) = opens.served.get_mut(ino)
            {
                *n -= 1;
                if *n == 0 {
                    opens.served.remove(ino);
                    self.backings.served_inodes(opens.served.len());
                    opens.closing += 1;
                    last = Some(opens.served_bytes.get(ino).copied().unwrap_or(0));
                }
            }
            (gone, last)
        };
        if let Some(open) = data_handle {
            match (&open.backing, last) {
                (Some(b), _) => self.backings.closed(b),
                (None, Some(read)) => {
                    self.maybe_fill(open.ino, read);
                    crate::mount::lock(&self.opens).closing -= 1;
                }
                (None, None) => {}
            }
            return;
        }
        let gone = self
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh);
        if let Some((ino, bytes)) = gone {
            drop(bytes);
            // Its last handle closed: forget the render (a `Weak` keeps the
            // allocation). An open that shares it holds `shared` meanwhile.
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if shared.get(&ino).is_some_and(|w| w.strong_count() == 0) {
                shared.remove(&ino);
            }
        }
    }

    /// The kernel would not take handle `fh`'s backing file: it is served
    /// by the daemon instead, as the returned mode says, and so is every
    /// later open.
    pub fn refused_backing(&self, fh: u64, why: &std::io::Error) -> CacheMode {
        if self.passthrough.swap(false, Relaxed) {
            self.data.set_units_in_files(false);
            log::warn!(
                "{}: the kernel refused a backing file ({why}); serving every file through FUSE",
                self.data.catalog().label
            );
            self.data.stats().passthrough.store(0, Relaxed);
        }
        let mut opens = crate::mount::lock(&self.opens);
        let Some(open) = opens.by_fh.get_mut(&fh) else {
            return CacheMode::DirectIo;
        };
        let ino = open.ino;
        if let Some(b) = open.backing.take() {
            self.backings.closed(&b);
        }
        *opens.served.entry(ino).or_default() += 1;
        self.backings.served_inodes(opens.served.len());
        drop(opens);
        match self.tree.node(ino).map(|n| &n.kind) {
            Some(NodeKind::File(c)) => self.cache_mode(c),
            _ => CacheMode::DirectIo,
        }
    }
}
