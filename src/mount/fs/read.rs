//! Reads: a served file's bytes from the data layer or the file its
//! reads wrote through to, the write-through itself, and whether a read
//! would wait for a decode another thread runs.

use super::*;

/// The bytes of one read, for its reply; handed back to
/// [`TensorFs::served`] once the reply is out.
pub struct Served<'a> {
    bytes: Bytes<'a>,
    /// The file's inode and the backing file the bytes are written to.
    through: Option<(Ino, Through)>,
    /// Counts the read as served until it is dropped, after its reply.
    _busy: Option<Busy<'a>>,
}

impl Served<'_> {
    /// Whether the bytes are straight from a source's mapping, where they
    /// lie in the page as they lie in the file.
    pub fn mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped(..))
    }

    /// Copies the bytes into `out`, checked where they come from a
    /// source's mapping (see `Bytes::copy_checked`).
    pub fn copy_checked(&self, out: &mut [u8]) -> Result<(), Errno> {
        self.bytes.copy_checked(out).map_err(|e| e.errno())
    }
}

impl std::ops::Deref for Served<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Where a read's bytes go in a backing file, and what to tell once
/// they are written there.
pub(super) struct WriteThrough {
    pub(super) data: Arc<Data>,
    pub(super) backings: Arc<Backings>,
    pub(super) ino: Ino,
    pub(super) off: u64,
    /// The tensor part the read met first: (tensor, part, where it starts
    /// in the file, its length); `None` for a read of a view's header.
    pub(super) part: Option<(usize, usize, u64, u64)>,
}

impl WriteThrough {
    /// Writes `bytes` to `p`'s file, then drops the page cache and the
    /// decoded frames well behind the reader. False when they could not be
    /// written (the file sealed, a full disk).
    fn write(&self, p: &Through, bytes: Bytes<'_>) -> bool {
        let end = self.off + bytes.len() as u64;
        let Some(written) = p.offer(self.off, &bytes) else {
            return false;
        };
        // Let go of the frames first: a held one stays cached.
        drop(bytes);
        self.written(p, end, written, true);
        true
    }

    /// The read's bytes, up to `end`, are in `p`'s file, which holds
    /// `[from, to)` around them: drops the page cache behind the reader,
    /// and (`frames`) lets the decoded frames behind it leave the cache.
    fn written(&self, p: &Through, end: u64, (from, to): (u64, u64), frames: bool) {
        for range in p.behind(self.off, (from, to)) {
            self.backings.drop_behind(self.ino, range);
        }
        let Some((tensor, part, start, len)) = self.part else {
            return;
        };
        // In the part's own offsets: what this read touched, and all that
        // is written around it.
        let inside = |x: u64| (x.max(start) - start).min(len);
        if frames && end > start {
            self.data.written(
                tensor,
                part,
                (inside(self.off), inside(end)),
                (inside(from), inside(to)),
            );
        }
    }
}

/// What an open has as it begins a read (see `TensorFs::before_read`).
#[derive(Default)]
pub(super) struct BeforeRead {
    /// The backing file its reads write through to, and its inode.
    pub(super) partial: Option<(Ino, Arc<Partial>)>,
    /// The hold it had on the spill of another part (a view's file of
    /// several tensors read in order), taken from it so that the hold
    /// cannot keep this part's spill from being made; to be dropped
    /// outside the lock.
    pub(super) other: Option<Reading>,
    /// Whether it is to look for a backing file for its reads
    /// (`OpenFile::through_later`).
    pub(super) later: bool,
}

impl TensorFs {
    /// Bytes `[off, off+size)` of a view's file `f`: its header, then the
    /// tensors of its entries (each its part 0). A read within one tensor
    /// is that tensor's own read (zero-copy where it is); one across a
    /// boundary is put together.
    pub(super) fn read_composite(
        &self,
        f: &Composed<'_>,
        off: u64,
        size: u32,
    ) -> Result<Bytes<'_>, Errno> {
        let (header, entries) = (&*f.header, &*f.entries);
        let end = off.saturating_add(size as u64);
        let within = |e: &&Entry| e.start <= off && end <= e.start + e.len;
        // The entries are in order: the first that ends past `off` found by
        // halving, not by a walk (a view of 10^5 tensors is read at every
        // offset).
        let first = entries.partition_point(|e| e.start + e.len <= off);
        if off >= header.len() as u64
            && let Some(e) = entries.get(first).filter(within)
        {
            return self
                .data
                .read(e.tensor, 0, off - e.start, size as u64)
                .map_err(|e| e.errno());
        }
        let mut out = scratch::take();
        out.reserve(size as usize);
        let h = header.len() as u64;
        if off < h {
            out.extend_from_slice(&header[off as usize..end.min(h) as usize]);
        }
        for e in &entries[first..] {
            if e.start >= end {
                break;
            }
            let from = off.max(e.start);
            let to = end.min(e.start + e.len);
            if from >= to {
                continue;
            }
            let b = self
                .data
                .read(e.tensor, 0, from - e.start, to - from)
                .map_err(|e| e.errno())?;
            out.extend_from_slice(&b);
        }
        Ok(Bytes::Owned(out))
    }

    /// The checks a read of part `pi` of tensor `ti` makes before its
    /// first byte, with that read's errno when they fail.
    pub(super) fn check_raw(&self, ti: usize, pi: usize) -> Result<(), Errno> {
        self.data.check_raw(ti, pi).map_err(|e| e.errno())
    }

    /// Bytes `[off, off+size)` of file `ino` opened as `fh`. A data error is
    /// logged by the data layer, and its errno is the one its kind names
    /// (`serve::error`).
    pub fn read(&self, ino: Ino, fh: u64, off: u64, size: u32) -> Result<Served<'_>, Errno> {
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        // Reads of data hold back the fills, and are the ones counted (not
        // those of generated files, such as a poll of `.ztensor/stats`,
        // which would count itself).
        let data = matches!(
            node.kind,
            NodeKind::File(Content::Part { .. } | Content::ViewData { .. })
        );
        if data {
            Stats::add(&self.data.stats().reads, 1);
        }
        let busy = data.then(|| self.backings.activity().begin());
        // The tensor part it reads, and the file's length, for the hold
        // on its spill.
        let part = match &node.kind {
            NodeKind::File(c @ (Content::Part { .. } | Content::ViewData { .. })) => self
                .part_at(&node.kind, off, size as u64)
                .map(|(t, p, ..)| (t, p, self.size_of(ino, c))),
            _ => None,
        };
        let before = self.before_read(fh, part.map(|(t, p, _)| (t, p)));
        drop(before.other);
        let partial = match (before.partial, &node.kind) {
            (Some((i, p)), _) => Some(p).filter(|_| i == ino),
            (None, NodeKind::File(c)) if before.later => self.through_from(fh, ino, c, off),
            (None, _) => None,
        };
        let written = match &partial {
            Some(p) => self.written(&node.kind, off, size, |at, n| p.read(at, n)),
            None => None,
        }
        .or_else(|| self.read_from_backing(&node.kind, off, size));
        let served = match written {
            Some(v) => Served {
                bytes: Bytes::Owned(v),
                through: None,
                _busy: busy,
            },
            None => Served {
                bytes: self.read_node(ino, &node.kind, fh, off, size)?,
                through: partial.map(|p| (ino, p.through())),
                _busy: busy,
            },
        };
        let mut opens = crate::mount::lock(&self.opens);
        if let Some(ino) = opens.by_fh.get(&fh).map(|o| o.ino) {
            *opens.served_bytes.entry(ino).or_default() += served.len() as u64;
        }
        let done = opens.by_fh.get_mut(&fh).and_then(|o| {
            o.read += served.len() as u64;
            o.last_read = std::time::Instant::now();
            self.hold_spill(o, part)
        });
        drop(opens);
        drop(done);
        Ok(served)
    }

    /// Has open `o`, which read part `part` last (tensor, part, the file's
    /// length), hold that part's spill until it has been served as many
    /// bytes as its file holds (or is closed, or idle: see
    /// [`let_go_of_idle_spills`]). A spill no reader holds may go to make
    /// room for another, and a reader part way through its file would
    /// then find its own spill gone, and maybe no room to make it again.
    /// What it lets go of is returned, to be dropped outside the lock.
    pub(super) fn hold_spill(
        &self,
        o: &mut OpenFile,
        part: Option<(usize, usize, u64)>,
    ) -> Option<Reading> {
        let (t, p, len) = part?;
        if o.read >= len {
            return o.reading.take();
        }
        if o.reading.is_none() {
            o.reading = self.data.spill_hold(t, p).map(|h| (t, p, h));
        }
        None
    }

    /// What open `fh` has before it reads part `part` (one look at the
    /// open for all of it).
    pub(super) fn before_read(&self, fh: u64, part: Option<(usize, usize)>) -> BeforeRead {
        let mut opens = crate::mount::lock(&self.opens);
        let Some(o) = opens.by_fh.get_mut(&fh) else {
            return BeforeRead::default();
        };
        let same = o.reading.as_ref().map(|(t, p, _)| (*t, *p)) == part;
        BeforeRead {
            partial: o.partial.clone().map(|p| (o.ino, p)),
            other: if same { None } else { o.reading.take() },
            later: o.through_later,
        }
    }

    /// For served open `fh` of `ino` (content `c`), reading at `off` with
    /// no backing file for its reads yet: the one other opens' reads or a
    /// fill write, else, at a read from the start, a new one (a reader of
    /// the whole file begins there; one that peeks here and there makes
    /// none).
    pub(super) fn through_from(
        &self,
        fh: u64,
        ino: Ino,
        c: &Content,
        off: u64,
    ) -> Option<Arc<Partial>> {
        let from_start = off == 0;
        let found = if from_start {
            self.write_through(ino, c)
        } else {
            self.backings.being_written(c)
        };
        let mut opens = crate::mount::lock(&self.opens);
        let o = opens.by_fh.get_mut(&fh).filter(|o| o.ino == ino)?;
        // Found nothing (another open's file still being made, or no
        // room): its later reads look again.
        o.through_later &= found.is_none();
        if o.partial.is_none() {
            o.partial = found;
        }
        o.partial.clone()
    }

    /// Whether a read of `size` bytes at `off` of file `ino` would wait
    /// for a decode that another thread runs (see `Data::would_wait`).
    pub fn would_wait(&self, ino: Ino, off: u64, size: u32) -> bool {
        let Some(node) = self.tree.node(ino) else {
            return false;
        };
        let Some((tensor, part, start, len)) = self.part_at(&node.kind, off, size as u64) else {
            return false;
        };
        let from = off.max(start);
        let end = off
            .saturating_add(size as u64)
            .min(start.saturating_add(len));
        self.data
            .would_wait(tensor, part, from - start, end.saturating_sub(from))
    }

    /// After `read`'s bytes, read at `off`, went to the reader: writes
    /// them through to the file's backing file, if it has one coming (see
    /// [`Partial`]). Called once the reply is out, so the reader does not
    /// wait for the write; a local tensor's bytes are written by the
    /// write-behind thread, when a core is free (see `write_behind`).
    pub fn served(&self, off: u64, read: Served<'_>) {
        let Served {
            bytes,
            through,
            _busy,
        } = read;
        let Some((ino, p)) = through else {
            return;
        };
        let Some(kind) = self.tree.node(ino).map(|n| &n.kind) else {
            return;
        };
        let NodeKind::File(c) = kind else {
            return;
        };
        let part = self.part_at(kind, off, bytes.len() as u64);
        let to = WriteThrough {
            data: self.data.clone(),
            backings: self.backings.clone(),
            ino,
            off,
            part,
        };
        if let Some((tensor, part, ..)) = part {
            if self.data.spilled(tensor, part) {
                return; // the fill reads the spill back
            }
            // A tensor file whose unit is decoded into a file: that file
            // becomes its backing as it is, so nothing is written; every
            // byte served is in it.
            if matches!(c, Content::Part { .. })
                && !self.fetched_part(tensor, part)
                && self.data.decodes_into_file(tensor, part)
            {
                let end = off + bytes.len() as u64;
                drop(bytes);
                // The unit stays cached until its file is adopted.
                return to.written(&p, end, (0, end), false);
            }
        }
        // A remote file's reads are written now: its backing file is kept
        // only when they wrote all of it (nothing is fetched to complete
        // it), so a write left for later would lose it.
        // (The part the read met, not every part of a view: a view of 10^5
        // tensors would be walked at each read; a view's header alone asks
        // of them all, once per file.)
        let remote = match part {
            Some((tensor, part, ..)) => self.fetched_part(tensor, part),
            None => self.fetched(c),
        };
        if remote {
            to.write(&p, bytes);
            return;
        }
        if let Some((tensor, part, start, len)) = part {
            let inside = |x: u64| (x.max(start) - start).min(len);
            let end = off + bytes.len() as u64;
            self.data
                .left_behind(tensor, part, (inside(off), inside(end)));
        }
        self.write_behind(p, to, bytes);
    }

    /// Queues `bytes` to be written by the write-behind (see
    /// `write_behind`), or counts them left to the fill.
    pub(super) fn write_behind(&self, p: Through, to: WriteThrough, bytes: Bytes<'_>) {
        let n = bytes.len() as u64;
        let stats = self.data.stats();
        // Raw bytes straight from a source's mapping (a view of raw and
        // decoded tensors) are not kept: the fill copies them, no decode.
        let Ok(kept) = bytes.keep() else {
            return Stats::add(&stats.write_behind_skipped_bytes, n);
        };
        // Weakly, and no `Through` while queued: a close does not wait for
        // the write, and a file dropped meanwhile (its descriptor, its
        // disk) is not kept for it.
        let partial = Arc::downgrade(&p.partial());
        drop(p);
        let held = kept.held();
        let work = move || {
            let through = partial.upgrade().and_then(|p| p.through_if_open());
            let wrote = match (through, kept.get()) {
                (Some(p), Some(bytes)) => to.write(&p, bytes),
                _ => false,
            };
            let stats = to.data.stats();
            let counter = match wrote {
                true => &stats.write_behind_bytes,
                false => &stats.write_behind_skipped_bytes,
            };
            Stats::add(counter, n);
        };
        // Not queued (a full queue): the fill writes them.
        if self.write_behind.push(held, work).is_err() {
            Stats::add(&stats.write_behind_skipped_bytes, n);
        }
    }

    /// The tensor part whose bytes a read of `len` bytes at `off` of a
    /// file of `kind` meets first: (tensor, part, where the part starts in
    /// the file, its length).
    pub(super) fn part_at(
        &self,
        kind: &NodeKind,
        off: u64,
        len: u64,
    ) -> Option<(usize, usize, u64, u64)> {
        let NodeKind::File(c) = kind else {
            return None;
        };
        if let Content::Part { tensor, part } = c {
            return Some((*tensor, *part, 0, u64::MAX));
        }
        let f = self.composed(c)?;
        let e = f
            .entries
            .get(f.entries.partition_point(|e| e.start + e.len <= off))?;
        (e.start < off.saturating_add(len)).then_some((e.tensor, 0, e.start, e.len))
    }

    /// For a file holding one tensor part (the tensor's file, a view's
    /// file of one tensor such as its `.npy`): the part, and where its
    /// bytes start in the file.
    pub(super) fn one_part(&self, c: &Content) -> Option<(usize, usize, u64)> {
        match c {
            Content::Part { tensor, part } => Some((*tensor, *part, 0)),
            // A view's file of one tensor (`FileId::tensor`), not one that
            // happens to hold one (the `.safetensors` view of a model of
            // one tensor is still the model's file).
            Content::ViewData { file, .. } if file.tensor.is_some() => {
                match &*self.composed(c)?.entries {
                    [e] if Some(e.tensor) == file.tensor => Some((e.tensor, 0, e.start)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Bytes `[off, off+size)` of a served file from its complete backing
    /// file, when it has one. An open is served while another served open
    /// of its file is held (a loader opens a file twice, and the backing
    /// file can be published between the two): its reads take the bytes
    /// the file holds, checked when written, instead of decoding them
    /// again (a 3 GiB zstd model's second load took 2.0 s decoding, on a
    /// 16-core host, against 0.47 s for the raw file; BENCHMARKS.md).
    /// Only a tensor's or a view's file, and never waiting for the record
    /// of backing files: a read of `.ztensor/stats` or of another tensor
    /// must be answered while a disk stalls (see `Backings::ready_now`).
    fn read_from_backing(&self, kind: &NodeKind, off: u64, size: u32) -> Option<Vec<u8>> {
        let NodeKind::File(c @ (Content::Part { .. } | Content::ViewData { .. })) = kind else {
            return None;
        };
        let b = self.backings.ready_now(c)?;
        self.written(kind, off, size, |at, n| b.read(at, n))
    }

    /// Bytes `[off, off+size)` of a file, taken by `read` from a backing
    /// file (one its reads wrote, or a complete one), when they are all
    /// there and the tensor's file is unchanged (else the data layer's
    /// read fails, and says why).
    pub(super) fn written(
        &self,
        kind: &NodeKind,
        off: u64,
        size: u32,
        read: impl Fn(u64, u64) -> Option<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        let NodeKind::File(c) = kind else {
            return None;
        };
        if let Some((tensor, part, _)) = self.one_part(c) {
            let bytes = read(off, size as u64)?;
            return self.data.unchanged(tensor, part).then_some(bytes);
        }
        // A view's file of several tensors (the `.safetensors` view): its
        // header is the daemon's own, and each tensor the range meets must
        // be as it was. Else a reader coming back over bytes it already
        // wrote decoded them again, and wrote them again, at every pass.
        let f = self.composed(c)?;
        let bytes = read(off, size as u64)?;
        let end = off + bytes.len() as u64;
        let first = f.entries.partition_point(|e| e.start + e.len <= off);
        let unchanged = f.entries[first..]
            .iter()
            .take_while(|e| e.start < end)
            .all(|e| self.data.unchanged(e.tensor, 0));
        unchanged.then_some(bytes)
    }

    pub(super) fn read_node(
        &self,
        ino: Ino,
        kind: &NodeKind,
        fh: u64,
        off: u64,
        size: u32,
    ) -> Result<Bytes<'_>, Errno> {
        match kind {
            NodeKind::Dir { .. } => Err(libc::EISDIR),
            NodeKind::File(Content::Part { tensor, part }) => self
                .data
                .read(*tensor, *part, off, size as u64)
                .map_err(|e| e.errno()),
            NodeKind::File(c @ Content::ViewData { .. }) => {
                let f = self.composed(c).ok_or(libc::EIO)?;
                self.read_composite(&f, off, size)
            }
            NodeKind::File(c) => {
                let held = self
                    .handles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&fh)
                    .map(|(_, b)| b.clone());
                // A read without our open (e.g. after a restart) shares the
                // text of the open handles, or renders it anew.
                let bytes = match held {
                    Some(b) => b,
                    None => self.rendered(ino, c)?,
                };
                let start = (off as usize).min(bytes.len());
                let end = start.saturating_add(size as usize).min(bytes.len());
                let mut out = scratch::take();
                out.extend_from_slice(&bytes[start..end]);
                Ok(Bytes::Owned(out))
            }
        }
    }
}
