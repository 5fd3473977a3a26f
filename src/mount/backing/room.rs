//! Room for backing files: the bound on their bytes and count, and what
//! is dropped or given up to keep it.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::{
    Backings, Content, Inner, Job, Origin, Partial, Slot, Stats, lock, ready_filled, warn_once,
};

/// A file [`Backings::give_up_writing`] found, to give up if still there.
enum Giving {
    Writing(Arc<Partial>),
    Filling(Arc<AtomicBool>),
}

/// Why a backing file was not made.
enum Made {
    NoRoom(String),
    Failed(std::io::Error),
}

impl Backings {
    /// Room and an empty file of `len` bytes for `key`, whose slot it takes
    /// (as being filled); `None` when there is no room or no file.
    pub(super) fn reserve(&self, key: &Content, len: u64) -> Option<File> {
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

    /// Frees backing files no open holds, least recently opened first,
    /// until one more file, of `len` more filled bytes, fits: filled files
    /// for the bytes, filled or cloned ones for the count. False when they
    /// cannot.
    /// On success `len` is charged to the bound, for the caller to add to
    /// [`Inner::filled`].
    pub(super) fn make_room(&self, inner: &mut Inner, len: u64) -> bool {
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

    /// Takes `len` bytes off the filled files' count and the bound.
    pub(super) fn uncharge(&self, inner: &mut Inner, len: u64) {
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

    pub(super) fn forget(&self, key: &Content, len: u64) {
        let mut inner = lock(&self.inner);
        inner.slots.remove(key);
        self.uncharge(&mut inner, len);
        self.published.notify_all();
    }
}
