//! A buffer written front to back by one thread while any number of readers
//! read what is already written: a big zstd unit is served while it is still
//! being decoded, so a reader waits only for its own bytes.
//!
//! It is an anonymous mapping of its own, or a shared mapping of an unlinked
//! file under `--cache-dir` ([`Filling::in_file`]) when that file can then
//! back the tensor's own file, so that its bytes are written once, by the
//! decoder (over zeros, below), and not copied into a backing file
//! afterwards. Either is released in one `munmap` when the last reader
//! lets go. Such a file is unlinked, written by nobody else (the kernel
//! only reads a backing file), never truncated, and has its disk
//! reserved, so no page of it
//! vanishes or fails to be written while mapped. Not caught: a disk that
//! fails to read back a page once the kernel wrote it back and dropped it
//! (the access faults), as for any file the daemon maps.
//!
//! Not advised for huge pages: on the project's VM new
//! huge pages come from memory the host has taken back and are 4 times
//! slower to touch than small ones (BENCHMARKS.md); the pages are faulted
//! in ahead of the writer instead, by another thread
//! ([`Filling::populate_step`]). A file's pages are first made by writing
//! zeros into it there: the write path makes the page cache in large
//! folios, ten times faster than faults on the mapping make it one page
//! at a time (ext4: 0.07 s against 0.65 s for 256 MiB). Zeros written
//! over decoded bytes would be wrong bytes, so that thread writes them
//! only where the writer has said it does not write yet, and the writer
//! writes its own where it has caught up with that thread
//! ([`Writer::claim`]).
//!
//! Safety rests on one rule: the writer only ever holds `&mut` to bytes at
//! or past `filled`, readers only ever see bytes before it, and `filled`
//! only grows (published with `Release`, read with `Acquire`). Zeros are
//! written only at or past the writer's claim, which is past `filled`.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use memmap2::{Advice, MmapOptions, MmapRaw};

/// What [`Filling::populate_step`] does per call.
const PIECE: usize = 2 << 20;

pub struct Filling {
    map: MmapRaw,
    /// The file mapped, for a buffer made by [`Filling::in_file`].
    file: Option<File>,
    len: usize,
    filled: AtomicUsize,
    writer_taken: AtomicBool,
    /// `Some` once the writer is done: `Ok` when every byte is there.
    end: Mutex<Option<Result<(), String>>>,
    cond: Condvar,
    /// For a file: where zeros may be written ahead of the writer.
    ahead: Mutex<Ahead>,
    ahead_cond: Condvar,
    /// A pause before each slice of zeros, for tests to catch it busy.
    #[cfg(test)]
    zero_delay: Duration,
}

/// The writer writes only below `claimed`. The populate thread writes
/// zeros only at or past it, one slice at a time (`busy` while it writes
/// them), in a run (`zeroed`, the slices done); a claim over a busy slice
/// waits for it, and the writer writes zeros itself where a claim covers
/// none of that run.
#[derive(Default)]
struct Ahead {
    claimed: usize,
    busy: Option<Range<usize>>,
    zeroed: Range<usize>,
    /// Bytes of zeros written ahead, and the time that took.
    bytes: usize,
    spent: Duration,
    /// They took so long that faults on the mapping are used instead.
    slow: bool,
    /// Waits of claims for a busy slice.
    #[cfg(test)]
    waits: u32,
}

/// Past this per piece on average, over 4 pieces or more, zeros are slower
/// than faults (about 0.5 ms where new memory is at hand; several times
/// that where a virtual machine's host must first give it back, and the
/// large folios the zeros make come from the blocks it took back first).
const SLOW_PIECE: Duration = Duration::from_micros(1500);

/// Zeros are written a slice at a time, each busy on its own, so a writer
/// that reaches them waits for one slice at most (the thread writing them
/// runs at a lower priority), and the rest of the piece is then left to it.
const SLICE: usize = 256 << 10;

/// How far past the writer's claim the populate thread starts again when
/// the writer has caught up with it: the writer makes the pages between
/// (as fast), and has that far to go before it could reach a piece the
/// thread is busy with.
const LEAD: usize = 8 << 20;

/// Zeros to write ahead of a file's writer from (never written: the
/// kernel maps these pages to its one zero page, which stays in cache).
static ZEROS: [u8; 256 << 10] = [0; 256 << 10];

impl Filling {
    pub fn new(len: usize) -> std::io::Result<Filling> {
        // A zero-length mapping is an error; one page is never read.
        let map = MmapRaw::from(MmapOptions::new().len(len.max(1)).map_anon()?);
        Ok(Filling::with(map, None, len))
    }

    /// A buffer that is `file`, mapped shared: what the writer writes is
    /// the file's bytes. `file` must be unlinked, `len` bytes long and
    /// reserved on disk (`fallocate`), so that no write through the
    /// mapping can fail for want of room (a fault, not an error).
    pub fn in_file(file: File, len: usize) -> std::io::Result<Filling> {
        if len == 0 {
            return Filling::new(0);
        }
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        Ok(Filling::with(map, Some(file), len))
    }

    fn with(map: MmapRaw, file: Option<File>, len: usize) -> Filling {
        Filling {
            map,
            file,
            len,
            filled: AtomicUsize::new(0),
            writer_taken: AtomicBool::new(false),
            end: Mutex::new(None),
            cond: Condvar::new(),
            ahead: Mutex::default(),
            ahead_cond: Condvar::new(),
            #[cfg(test)]
            zero_delay: Duration::ZERO,
        }
    }

    fn ahead(&self) -> MutexGuard<'_, Ahead> {
        self.ahead.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file it is, once every byte is written: a complete copy of the
    /// unit's bytes on disk. (The last byte is published only once the
    /// writer has checked all it wrote, so a reader that has it may close
    /// before the writer says it is done: this does not wait for that.)
    pub fn complete_file(&self) -> Option<&File> {
        let failed = matches!(
            *self.end.lock().unwrap_or_else(|e| e.into_inner()),
            Some(Err(_))
        );
        let whole = self.filled.load(Ordering::Acquire) >= self.len;
        self.file.as_ref().filter(|_| whole && !failed)
    }

    /// Whether it is a file ([`Filling::in_file`]).
    pub fn in_a_file(&self) -> bool {
        self.file.is_some()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes written so far.
    pub fn filled(&self) -> &[u8] {
        let n = self.filled.load(Ordering::Acquire);
        // SAFETY: bytes before `filled` are initialised and no longer written
        // (see the module comment: a mapped file is ours alone, never
        // truncated, and our own zeros go only past `filled`); the mapping
        // lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), n) }
    }

    /// Whether [`Self::wait`] for the first `end` bytes would wait now:
    /// they are not written yet and the writer has not ended.
    pub fn would_wait(&self, end: usize) -> bool {
        let end = end.min(self.len);
        self.filled.load(Ordering::Acquire) < end
            && self.end.lock().unwrap_or_else(|e| e.into_inner()).is_none()
    }

    /// Waits until the first `end` bytes are written (or the writer failed
    /// or gave up before them) and returns the bytes written so far.
    pub fn wait(&self, end: usize) -> Result<&[u8], String> {
        let end = end.min(self.len);
        if self.filled.load(Ordering::Acquire) >= end {
            return Ok(self.filled());
        }
        let mut g = self.end.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            // Checked under the lock the writer notifies under: no lost wakeup.
            if self.filled.load(Ordering::Acquire) >= end {
                return Ok(self.filled());
            }
            match &*g {
                Some(Err(why)) => return Err(why.clone()),
                Some(Ok(())) => {
                    return Err(format!(
                        "decoder stopped at byte {}, before {end}",
                        self.filled.load(Ordering::Acquire)
                    ));
                }
                None => g = self.cond.wait(g).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// Faults the next piece of the buffer in ahead of its writer, on the
    /// calling thread (another than the writer's, and only one such
    /// thread): first touches of new memory took a third of a decoder's
    /// time. `at` is where the last call ended (start at 0). False once
    /// there is nothing more to do: the end reached, the writer done, zeros
    /// that could not be written, or the kernel saying no (before 5.14).
    /// One piece (2 MiB) at most per call, so the caller need not keep the
    /// buffer alive in between.
    pub fn populate_step(&self, at: &mut usize) -> bool {
        if *at >= self.len || self.end.lock().map_or(true, |g| g.is_some()) {
            return false;
        }
        let zeros = self.file.as_ref().filter(|_| !self.ahead().slow);
        let range = match zeros {
            Some(file) => match self.zero_ahead(file, *at) {
                Some(r) => r,
                None => return false,
            },
            // Never behind the writer: what it passed is there already.
            None => {
                let from = (*at).max(self.filled.load(Ordering::Acquire) / PIECE * PIECE);
                from..(from + PIECE).min(self.len)
            }
        };
        // Empty where the writer reached the piece first: the next call
        // starts past it.
        if !range.is_empty()
            && self
                .map
                .advise_range(Advice::PopulateWrite, range.start, range.len())
                .is_err()
        {
            return false;
        }
        *at = range.end;
        true
    }

    /// Writes zeros into the next piece of the file at or past both `at`
    /// and the writer's claim (well past it if the writer has caught up),
    /// so its page cache exists before the mapping is touched; the piece,
    /// or `None` past the end or when the write failed (the writer then
    /// makes the pages).
    fn zero_ahead(&self, file: &File, at: usize) -> Option<Range<usize>> {
        let piece = {
            let mut a = self.ahead();
            let from = if at >= a.claimed {
                at
            } else {
                (a.claimed + LEAD).next_multiple_of(PIECE)
            };
            if from >= self.len {
                return None;
            }
            if from != a.zeroed.end {
                a.zeroed = from..from;
            }
            from..(from + PIECE).min(self.len)
        };
        let mut pos = piece.start;
        while pos < piece.end {
            let slice = pos..(pos + SLICE).min(piece.end);
            {
                let mut a = self.ahead();
                if a.busy.is_some() {
                    return None; // another thread writes zeros: not ours to do
                }
                if a.claimed > slice.start {
                    break; // the writer got here first: the rest is its own
                }
                a.busy = Some(slice.clone());
            }
            // Whatever happens, the writer is let past the slice again.
            let mut done = Unbusy(self, None);
            #[cfg(test)]
            std::thread::sleep(self.zero_delay);
            let t0 = Instant::now();
            write_zeros(file, slice.clone()).ok()?;
            let took = t0.elapsed();
            done.1 = Some(slice.end);
            drop(done);
            let mut a = self.ahead();
            a.bytes += slice.len();
            a.spent += took;
            a.slow = a.bytes >= 4 * PIECE
                && a.spent.as_secs_f64() > SLOW_PIECE.as_secs_f64() * (a.bytes / PIECE) as f64;
            pos = slice.end;
        }
        Some(piece.start..pos)
    }

    /// The writer's handle; there is only ever one.
    pub fn writer(&self) -> Option<Writer<'_>> {
        // Lazily: a Writer made and dropped would end the buffer.
        (!self.writer_taken.swap(true, Ordering::AcqRel)).then(|| Writer {
            f: self,
            at: self.filled.load(Ordering::Acquire),
        })
    }

    fn finish(&self, r: Result<(), String>) {
        let mut g = self.end.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(r);
        }
        self.cond.notify_all();
    }
}

/// Writes zeros over `range` of `file` with `pwrite` (see the module
/// comment for why).
fn write_zeros(file: &File, range: Range<usize>) -> std::io::Result<()> {
    let mut pos = range.start;
    while pos < range.end {
        let n = ZEROS.len().min(range.end - pos);
        file.write_all_at(&ZEROS[..n], pos as u64)?;
        pos += n;
    }
    Ok(())
}

/// Ends a slice of zeros being written ahead (see [`Filling::zero_ahead`]),
/// adding it to the run when its end is set (the zeros were written).
struct Unbusy<'a>(&'a Filling, Option<usize>);

impl Drop for Unbusy<'_> {
    fn drop(&mut self) {
        let mut a = self.0.ahead();
        a.busy = None;
        if let Some(end) = self.1 {
            a.zeroed.end = end;
        }
        drop(a);
        self.0.ahead_cond.notify_all();
    }
}

/// The single writer of a [`Filling`]. Dropped without [`Writer::finish`]
/// (a panic, an early return), it ends the buffer with an error so readers
/// never wait forever.
pub struct Writer<'a> {
    f: &'a Filling,
    at: usize,
}

impl Writer<'_> {
    /// The unwritten bytes, at most `max` of them.
    pub fn spare(&mut self, max: usize) -> &mut [u8] {
        let n = (self.f.len - self.at).min(max);
        self.claim(self.at + n);
        // SAFETY: `[at, at+n)` is inside the mapping, at or past `filled`, so
        // no reader sees it, and `&mut self` makes this the only `&mut`.
        unsafe { std::slice::from_raw_parts_mut(self.f.map.as_mut_ptr().add(self.at), n) }
    }

    /// The start of the buffer, for a decoder that writes through a raw
    /// pointer: it must write only at or past [`Writer::written`] and below
    /// its last [`Writer::claim`] (as [`Writer::spare`] would), and then
    /// [`Writer::commit_to`].
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.f.map.as_mut_ptr()
    }

    /// Says that the writer writes nothing at or past `end` until its next
    /// claim (claims only grow). For a file, first makes the page cache of
    /// what the claim adds: zeros written ahead by the populate thread, or
    /// here where it has not (behind or far ahead of the writer); waits
    /// while that thread is writing zeros below `end` (a moment).
    pub fn claim(&mut self, end: usize) {
        let Some(file) = &self.f.file else { return };
        let end = end.min(self.f.len);
        let mut a = self.f.ahead();
        while a.busy.as_ref().is_some_and(|b| b.start < end) {
            #[cfg(test)]
            {
                a.waits += 1;
            }
            a = self.f.ahead_cond.wait(a).unwrap_or_else(|e| e.into_inner());
        }
        let new = a.claimed..end.max(a.claimed);
        a.claimed = new.end;
        let done = a.zeroed.clone();
        if a.slow {
            return;
        }
        drop(a);
        // Nobody else writes below the claim now.
        for r in [
            new.start..new.end.min(done.start),
            new.start.max(done.end)..new.end,
        ] {
            if !r.is_empty() && write_zeros(file, r.clone()).is_ok() {
                let _ = self
                    .f
                    .map
                    .advise_range(Advice::PopulateWrite, r.start, r.len());
            }
        }
    }

    /// Publishes every byte before `end`.
    pub fn commit_to(&mut self, end: usize) {
        self.commit(end.saturating_sub(self.at));
    }

    /// Publishes the next `n` bytes of [`Writer::spare`] to readers.
    pub fn commit(&mut self, n: usize) {
        self.at = (self.at + n).min(self.f.len);
        self.f.filled.store(self.at, Ordering::Release);
        let _g = self.f.end.lock().unwrap_or_else(|e| e.into_inner());
        self.f.cond.notify_all();
    }

    pub fn written(&self) -> usize {
        self.at
    }

    pub fn finish(self, r: Result<(), String>) {
        let r = match r {
            Ok(()) if self.at < self.f.len => Err(format!(
                "decoder ended at byte {}, expected {}",
                self.at, self.f.len
            )),
            r => r,
        };
        self.f.finish(r);
    }
}

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        // After `finish` this is a no-op: the first outcome stands.
        self.f.finish(Err("decoder stopped".to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn readers_get_their_bytes_while_the_writer_goes_on() {
        let f = Arc::new(Filling::new(1 << 20).unwrap());
        let reader = {
            let f = f.clone();
            std::thread::spawn(move || {
                let got = f.wait(300_000).unwrap();
                assert!(got.len() >= 300_000);
                assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
                f.wait(1 << 20).unwrap().len()
            })
        };
        let mut w = f.writer().unwrap();
        assert!(f.writer().is_none(), "a second writer");
        let mut i = 0usize;
        while w.written() < 1 << 20 {
            let s = w.spare(4096);
            for b in s.iter_mut() {
                *b = (i % 251) as u8;
                i += 1;
            }
            let n = s.len();
            w.commit(n);
            std::thread::sleep(Duration::from_micros(50));
        }
        w.finish(Ok(()));
        assert_eq!(reader.join().unwrap(), 1 << 20);
        assert_eq!(f.filled().len(), 1 << 20);
    }

    /// The pattern the tests below write: never a zero.
    fn byte(i: usize) -> u8 {
        (i % 251) as u8 | 1
    }

    /// A buffer in a new reserved file of `len` bytes, its zeros paused
    /// for `delay` in each busy slice.
    fn in_a_file(dir: &tempfile::TempDir, len: usize, delay: Duration) -> Arc<Filling> {
        let file = crate::serve::spill::reserved_file(dir.path(), len as u64).unwrap();
        let mut f = Filling::in_file(file, len).unwrap();
        f.zero_delay = delay;
        Arc::new(f)
    }

    /// Writes the pattern up to `upto`, `chunk` bytes per claim.
    fn write_pattern(w: &mut Writer, upto: usize, chunk: usize) {
        while w.written() < upto {
            let from = w.written();
            let s = w.spare(chunk);
            for (k, b) in s.iter_mut().enumerate() {
                *b = byte(from + k);
            }
            let n = s.len();
            w.commit(n);
        }
    }

    /// The first byte of the file, or of what readers see, that is not the
    /// pattern.
    fn first_wrong(f: &Filling) -> Option<usize> {
        let mut back = vec![0; f.len()];
        f.file
            .as_ref()
            .unwrap()
            .read_exact_at(&mut back, 0)
            .unwrap();
        (0..f.len()).find(|&i| back[i] != byte(i) || f.filled()[i] != byte(i))
    }

    #[test]
    fn zeros_written_ahead_of_a_file_never_land_on_written_bytes() {
        const LEN: usize = 24 << 20;
        let dir = tempfile::tempdir().unwrap();
        let f = in_a_file(&dir, LEN, Duration::ZERO);
        let mut w = f.writer().unwrap();
        // A third written before the zeros start, from byte 0; the rest
        // while they run.
        write_pattern(&mut w, LEN / 3, 3 << 10);
        let (started, first) = std::sync::mpsc::channel();
        let zeros = {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut at = 0;
                while f.populate_step(&mut at) {
                    let _ = started.send(at);
                }
            })
        };
        let at = first.recv().unwrap();
        assert!(at > LEN / 3, "zeros from {at}, inside what was written");
        write_pattern(&mut w, LEN, 3 << 10);
        w.finish(Ok(()));
        zeros.join().unwrap();
        assert_eq!(first_wrong(&f), None, "a zero over a written byte");
    }

    #[test]
    fn a_writer_that_catches_up_with_the_zeros_waits_for_their_slice_and_keeps_its_bytes() {
        const LEN: usize = 24 << 20;
        let dir = tempfile::tempdir().unwrap();
        // Zeros far slower than the writer, which catches up with them
        // again and again, each time inside a busy slice's pause.
        let f = in_a_file(&dir, LEN, Duration::from_millis(3));
        let zeros = {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut at = 0;
                while f.populate_step(&mut at) {}
            })
        };
        while f.ahead().busy.is_none() {
            std::thread::yield_now();
        }
        let mut w = f.writer().unwrap();
        write_pattern(&mut w, LEN, 64 << 10);
        w.finish(Ok(()));
        zeros.join().unwrap();
        assert_eq!(first_wrong(&f), None, "a zero over a written byte");
        let a = f.ahead();
        assert!(a.waits >= 1, "the writer never met a busy slice");
        assert!(a.bytes >= SLICE, "no zeros written: {}", a.bytes);
    }

    #[test]
    fn a_failed_or_dropped_writer_wakes_readers_with_an_error() {
        let f = Arc::new(Filling::new(8192).unwrap());
        let r = {
            let f = f.clone();
            std::thread::spawn(move || f.wait(8192).map(|b| b.len()))
        };
        let mut w = f.writer().unwrap();
        let n = w.spare(100).len();
        w.commit(n);
        w.finish(Err("zstd data is corrupt".into()));
        assert_eq!(r.join().unwrap().unwrap_err(), "zstd data is corrupt");
        // Bytes written before the failure are still there.
        assert_eq!(f.wait(100).unwrap().len(), 100);

        let g = Filling::new(10).unwrap();
        drop(g.writer());
        assert!(g.wait(1).unwrap_err().contains("stopped"));
        let h = Filling::new(10).unwrap();
        h.writer().unwrap().finish(Ok(()));
        assert!(h.wait(10).unwrap_err().contains("ended at byte 0"));
    }
}
