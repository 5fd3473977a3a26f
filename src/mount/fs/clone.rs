//! Raw tensors backed by clones of their range (`FICLONERANGE`) where
//! `--cache-dir` shares blocks with the source.

use super::*;

/// Part `pi` of tensor `ti` as one range of a local file: (the file, where
/// the range starts, its length).
fn clonable_range(data: &Data, ti: usize, pi: usize) -> Option<(&MappedFile, u64, u64)> {
    let p = part_of(data, ti, pi)?;
    let b = &data.catalog().blobs[p.blob];
    match p.map {
        crate::catalog::PartMap::Contiguous { start } => {
            Some((data.local_file(b.source)?, b.offset + start, p.nbytes))
        }
        _ => None,
    }
}

/// Clones part `pi` of tensor `ti` after `head` (content `key`) under
/// `--cache-dir` once the checks a read makes pass, kept only if the
/// source is still as they found it after the clone was made. `None` when
/// it cannot be.
fn make_clone(
    data: &Data,
    backings: &Backings,
    key: &Content,
    (ti, pi): (usize, usize),
    head: &[u8],
) -> Option<Arc<Backing>> {
    let (f, off, len) = clonable_range(data, ti, pi)?;
    data.check_raw(ti, pi).ok()?;
    let clone = backings.clone_of(key, head, (f.file(), off, len))?;
    if data.check_raw(ti, pi).is_err() {
        backings.forget_clone(key);
        return None;
    }
    Some(clone)
}

impl TensorFs {
    /// Files of content `c` that a clone of a raw tensor's range can back
    /// (see [`Self::clone_read`]): the tensor's own file, or a view's file
    /// of that tensor alone after a header (its `.npy`): (tensor, part,
    /// the header).
    pub(super) fn clonable(&self, c: &Content) -> Option<(usize, usize, Vec<u8>)> {
        match c {
            Content::Part { tensor, part } => {
                (!self.needs_work(*tensor, *part)).then(|| (*tensor, *part, Vec::new()))
            }
            // A view's file of one tensor, not one that happens to hold one
            // (see `one_part`), whose header ends on a block.
            Content::ViewData { file, .. } if file.tensor.is_some() => {
                let f = self.composed(c).filter(|f| !f.is_source)?;
                let [e] = f.entries.as_ref() else {
                    return None;
                };
                let header = f.header.len() as u64;
                let alone = Some(e.tensor) == file.tensor
                    && self.part(e.tensor, 0)?.nbytes == e.len
                    && e.start == header
                    && f.size == header + e.len
                    && self.backings.may_clone(header);
                let tensor = e.tensor;
                (alone && !self.needs_work(tensor, 0)).then(|| (tensor, 0, f.header.into_owned()))
            }
            _ => None,
        }
    }

    /// A raw tensor's file (or its `.npy`) backed by the clone of its range
    /// made after earlier opens read at least half of it (see
    /// [`Self::clone_read`]), once the clone's own pages are cached
    /// and the checks a read makes pass.
    /// Until then the daemon serves the tensor from the source's pages: a
    /// clone shares the source's disk blocks, not its page cache, and a
    /// first load read from a fresh clone ran at a quarter of the daemon's
    /// speed with the source cached, and at half of it with nothing cached
    /// (BENCHMARKS.md, "Raw tensors backed by clones"). The errno of a
    /// read when the checks fail.
    pub(super) fn cloned_backing(
        &self,
        c: &Content,
        ti: usize,
        pi: usize,
    ) -> Result<Option<Arc<Backing>>, Errno> {
        let Some(b) = self
            .backings
            .ready(c)
            .filter(|b| b.origin() == Origin::Cloned)
        else {
            return Ok(None);
        };
        if let Err(e) = self.check_raw(ti, pi) {
            // A changed source: the clone, no longer sharing its blocks,
            // holds disk for nothing.
            self.backings.forget_clone(c);
            return Err(e);
        }
        Ok(b.resident().then_some(b))
    }

    /// After the last served open of `ino` (content `c`, a raw tensor's
    /// file or a view of it alone after `head`, see [`Self::clonable`]),
    /// its opens having read at least half of it: a file of `head` and a
    /// clone of the tensor's range for later opens, where the cache
    /// directory allows (see `Backings::clone_of`), made and read in while
    /// nothing is being read (see `mount::warmer`). Once read in, the
    /// kernel's page cache of `ino` is dropped (passthrough opens never
    /// read it); a clone that could not be read in whole is dropped, to be
    /// made again after a later read.
    pub(super) fn clone_read(
        &self,
        ino: Ino,
        c: &Content,
        (ti, pi): (usize, usize),
        head: Vec<u8>,
    ) {
        let Some((_, off, len)) = clonable_range(&self.data, ti, pi) else {
            return;
        };
        if !self.backings.may_clone(off) || self.backings.ready(c).is_some() {
            return;
        }
        let (data, backings, key) = (self.data.clone(), self.backings.clone(), c.clone());
        let (done_by, done_key) = (self.backings.clone(), c.clone());
        self.backings.warm_clone(CloneJob {
            key: c.clone(),
            len: head.len() as u64 + len,
            make: Box::new(move || make_clone(&data, &backings, &key, (ti, pi), &head)),
            done: Box::new(move |all| {
                if all {
                    done_by.drop_inode_cache(ino);
                } else {
                    done_by.forget_clone(&done_key);
                }
            }),
        });
    }
}
