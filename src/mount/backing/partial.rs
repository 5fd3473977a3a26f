//! A backing file written as the daemon serves its file's reads, and the
//! record of what they wrote.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};

use super::file::read_range;
use super::{WRITE_FAILED, lock, warn_once};

/// How long the last close of a file waits for the write-through of
/// reads already sent to the reader (see [`Through`]); a write that takes
/// longer is left to the filler.
const SEAL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The page cache a daemon-served read fills (by `mmap`) is dropped behind
/// the reader in steps of this many bytes (see [`Behind`](super::Behind)) ...
const DROP_STEP: u64 = if cfg!(test) { 2 << 20 } else { 64 << 20 };

/// ... ending this far behind it: pages just read may be read again (a
/// loader's next tensor shares their page), and read-ahead runs ahead.
const DROP_MARGIN: u64 = if cfg!(test) { 1 << 20 } else { 32 << 20 };

/// A backing file written as the daemon serves its file's reads: each
/// range a read got from the data layer (checked, as every byte it
/// serves) is written here too. At the last close only what no read asked
/// for is left to fill: a whole read is decoded once, not again for its
/// backing file after its frames left the cache.
pub struct Partial {
    pub(super) file: File,
    pub(super) len: u64,
    pub(super) written: Mutex<Written>,
    /// Notified when no [`Through`] is pending any more.
    settled: Condvar,
    /// The page cache of the file being read is dropped up to here (see
    /// [`Behind`](super::Behind)).
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

    /// The ranges of the file's page cache to drop now (see [`Behind`](super::Behind)),
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
    /// A file of `len` bytes of which `written` is written.
    pub(super) fn new(file: File, len: u64, written: Written) -> Partial {
        Partial {
            file,
            len,
            written: Mutex::new(written),
            settled: Condvar::new(),
            dropped: AtomicU64::new(0),
        }
    }

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
    pub(super) fn seal(&self) -> Written {
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
    pub(super) fn whole(&self) -> bool {
        let w = lock(&self.written);
        w.sealed && !w.failed && w.covers(0, self.len)
    }

    /// Whether all but at most an eighth of it is written (see
    /// [`Backings::ready_or_wait`](super::Backings::ready_or_wait)).
    pub(super) fn nearly_whole(&self) -> bool {
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
pub(super) struct Written {
    /// Start -> end, disjoint and not touching.
    pub(super) ranges: std::collections::BTreeMap<u64, u64>,
    pub(super) failed: bool,
    /// The filler owns the file now: reads add nothing more (what they
    /// wrote is still read back).
    pub(super) sealed: bool,
    /// Reads answered and not yet offered (see [`Through`]).
    pending: usize,
}

impl Written {
    /// Adds `[start, end)`; the written range it is part of now.
    pub(super) fn add(&mut self, mut start: u64, mut end: u64) -> (u64, u64) {
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

    pub(super) fn covers(&self, start: u64, end: u64) -> bool {
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
