//! Blobs too big for the cache, decoded into spill files under
//! `--cache-dir`: made, held by their readers, and dropped for room
//! within `--decoded-cache-size`.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::{Arc, Mutex};

use crate::catalog::{Codec, Producer};
use crate::serve::decoded_disk::SpillCharge;
use crate::serve::error::{Kind, ReadError};
use crate::serve::spill;
use crate::serve::spill::Spill;
use crate::serve::stats::Stats;

use super::plan::streamable;
use super::{Copies, Data, FreeDisk, GiveUp, Plan, Served, checks};

/// Longest a spill that does not fit waits for spills other readers hold
/// (with its tensor's spill slot held: its other readers wait off the
/// FUSE workers, and opens do not wait for it).
pub(super) const SPILL_ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the bound's count must stay still before a spill short of
/// room, with no spill in use to wait for, fails: what holds the room may
/// be on its way to being let go (a file being reserved on the cache
/// directory's thread takes up to 200 ms).
pub(super) const SPILL_ROOM_SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

/// A blob's spill slot, when no thread holds it for long: another
/// waiter's glance at it (as this one's) takes a moment, a spill being
/// made or waiting for room holds it throughout.
fn peek<T>(slot: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    for _ in 0..64 {
        match slot.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// A blob's spill slot is held by another thread (see `Data::spill_now`).
pub(super) struct SlotBusy;

/// Clears a blob's `making_spill` when its spill is in its slot, or was
/// not made.
pub(super) struct Making<'a>(&'a AtomicBool);

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.0.store(false, SeqCst);
    }
}

/// A spill held by a reader between its reads (see [`Data::spill_hold`]).
pub struct Hold {
    pub(super) _spill: Arc<Spill>,
}

impl Data {
    /// For a blob spilled whole, waits for its spill to end, outside the
    /// once-only check: a spill that fails for want of disk fails this
    /// read, and the next one tries again.
    pub(super) fn spilled_whole(&self, s: &Served, bi: usize) -> Result<(), ReadError> {
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

    /// A computed blob over half the cache, made piece by piece into a
    /// spill file (once, kept while mounted) by its reader's stream, its
    /// checks run over the pieces as they come: `None` for a blob the
    /// cache takes whole. One whose reader cannot make it piece by piece,
    /// or whose checks need it whole, is refused.
    pub(super) fn computed_spill(
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
        let mut slot = crate::serve::lock(&self.states[bi].spill);
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

    pub(super) fn spill(
        &self,
        s: &Served,
        bi: usize,
        one_frame: bool,
    ) -> Result<Arc<Spill>, ReadError> {
        let mut slot = crate::serve::lock(&self.states[bi].spill);
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

    /// Whether a read of blob `bi`'s spill up to `end` would wait now;
    /// `empty` when it has none. A slot held is a spill being made (its
    /// file created, its room found), which a read would wait for: on a
    /// disk that does not answer, for as long as it does not.
    pub(super) fn spill_would_wait(&self, bi: usize, end: u64, empty: bool) -> bool {
        self.states.get(bi).is_some()
            && self
                .spill_now(bi)
                .map_or(true, |slot| slot.map_or(empty, |s| s.would_wait(end)))
    }

    /// Blob `bi`'s spill now, without waiting for its slot: `Err` while
    /// the slot is held (a spill being made, which may wait on a disk
    /// that does not answer), so that opens and the FUSE workers never
    /// wait on it.
    pub(super) fn spill_now(&self, bi: usize) -> Result<Option<Arc<Spill>>, SlotBusy> {
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

    /// The hook set by [`Data::on_disk_full`], for tests.
    #[cfg(test)]
    pub fn free_disk(&self) -> impl Fn() -> bool + '_ {
        || self.free_disk.get().is_some_and(|f| f())
    }

    /// Room in `dir` for a spill of `decoded` bytes of blob `bi`, as far as
    /// dropping idle spills and idle backing files can make it, and its
    /// share of `--decoded-cache-size`, which they make the same way; an
    /// error (`ENOSPC`) when the bound cannot hold it.
    pub(super) fn room_for_spill(
        &self,
        bi: usize,
        dir: &Path,
        decoded: u64,
    ) -> Result<SpillCharge, ReadError> {
        let limit = self.disk.limit();
        let why = || {
            let (spills, used) = (self.disk.spills(), self.disk.used());
            format!(
                "{decoded} decoded bytes do not fit in --decoded-cache-size ({limit} bytes, {used} \
                 held by decoded files in use: {spills} by spills, {} by backing files)",
                used.saturating_sub(spills)
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
        self.charge_for_spill(bi, decoded).map_err(|waited| {
            let why = format!(
                "{}, after {:.1} s looking for room",
                why(),
                waited.as_secs_f64()
            );
            self.fail(bi, ReadError::new(Kind::NoSpace, why))
        })
    }

    /// Spills stay while mounted, so that a tensor is decoded once. When a
    /// new one does not fit, finished spills that no reader holds go first
    /// (until it fits), so that spills read once cannot fill the disk and
    /// fail every later one. Other tensors' slots are only tried, never
    /// waited on: their holders may be waiting for this one.
    pub(super) fn drop_idle_spills(&self, keep: usize, dir: &Path, decoded: u64) {
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
    pub(super) fn descriptor_for_spill(&self, keep: usize) {
        let max = self.max_spills.load(Relaxed);
        let fewer = || self.spills_held() < max;
        if !fewer() {
            self.drop_spills_until(keep, fewer);
        }
    }

    /// Blob `bi`'s spill's share of `--decoded-cache-size`, once the
    /// write-through files of its tensor's files that could never sit
    /// beside it, idle spills and idle backing files have made room for
    /// it; else how long it waited. Spills that readers hold (a file part
    /// way read, or just closed: the kernel sends the release after close
    /// returns) are waited for, up to [`SPILL_ROOM_WAIT`]: their readers
    /// let go of them once they have every byte.
    pub(super) fn charge_for_spill(
        &self,
        bi: usize,
        decoded: u64,
    ) -> Result<SpillCharge, std::time::Duration> {
        let fits = || self.disk.used().saturating_add(decoded) <= self.disk.limit();
        let start = std::time::Instant::now();
        let until = start + SPILL_ROOM_WAIT;
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
                return Ok(charge);
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
                return Err(now.duration_since(start));
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
    pub(super) fn spills_in_use(&self, keep: usize) -> bool {
        self.states.made().any(|(i, st)| {
            i != keep
                && (st.making_spill.load(SeqCst)
                    || peek(&st.spill).is_some_and(|s| {
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
    pub(super) fn spills_held(&self) -> usize {
        self.states
            .made()
            .filter(|(_, st)| st.spill.try_lock().map_or(true, |s| s.is_some()))
            .count()
    }

    /// Drops finished spills that no reader holds, but blob `keep`'s,
    /// until `done`; whether it is. Other tensors' slots are only tried,
    /// never waited on: their holders may be waiting for `keep`'s.
    pub(super) fn drop_spills_until(&self, keep: usize, done: impl Fn() -> bool) -> bool {
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
