//! Tensors too big for the cache: decoded once, by a thread of their own,
//! into an unlinked file under `--cache-dir`, and read back from there.
//!
//! Frames with small windows (up to 8 MiB, as zstd writes them up to level
//! 19) go through zstd's stream decoder and pwrite. Larger windows are
//! decoded straight into a shared mapping of the file (zstd's stable-output
//! mode: the decoded bytes are its window), so no window buffer is needed
//! however large the frame says its window is; what it mapped is let go of
//! a few MiB behind it (the pages stay in the page cache, the file has
//! them).

use super::error::{Kind, ReadError};
use std::cell::Cell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Acquire, Ordering::Release};
use std::sync::{Arc, Condvar, Mutex};

use super::guard::{Guard, Watched};
use super::lock;
use super::stats::Stats;
use crate::codec::zstd::{self as zstd_blob, DirectDecoder};
use crate::source::{Span, page_size};

/// Spill decoders at work at once; a spill past that waits for a place
/// before it starts (and its readers with it). Each may hold a stream
/// window of 2^[`STREAM_WINDOW_LOG`] bytes.
const MAX_DECODERS: usize = 4;

/// Frames whose window is at most 2^this are decoded by zstd's stream
/// decoder (whose window buffer is that big) and written with pwrite. On
/// this VM that is a third faster than decoding into the mapping, where
/// the fault path first zeroes every new page of the file. Larger windows
/// (up to 2 GiB, or a one-segment frame's whole size) go through the
/// mapping, which needs no window buffer.
const STREAM_WINDOW_LOG: u32 = 23;

/// How far behind its output the decoder keeps the file mapped at most:
/// the frame's window, up to the largest of zstd frames as usually written
/// (8 MiB, level 19). A match from further back still reads right, through
/// a page fault.
const MAX_KEEP: usize = 8 << 20;

/// How far back each release of the mapped path reaches, at most.
const RELEASE_BACK: usize = 256 << 20;

/// Output faulted in ahead of the decoder at once, and let go of at once.
const BATCH: usize = 4 << 20;

/// What makes a computed blob for [`Spill::produce`]: it hands each piece
/// it makes, in order, to the function it is given.
pub type Making =
    dyn FnOnce(&mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> + Send;

/// Why a spill failed, and whether the next read should try again (the
/// disk may have room then) or not (the data is bad).
struct Failure {
    why: String,
    retry: bool,
    /// The disk has no room for it (`ENOSPC` to its readers).
    no_room: bool,
}

impl Failure {
    fn data(why: String) -> Failure {
        Failure {
            why,
            retry: false,
            no_room: false,
        }
    }

    fn disk(why: String) -> Failure {
        Failure {
            why,
            retry: true,
            no_room: false,
        }
    }

    /// Too little free space under `--cache-dir` ([`room`], or the
    /// reservation refused with `ENOSPC`).
    fn no_room(why: String) -> Failure {
        Failure {
            why,
            retry: true,
            no_room: true,
        }
    }

    /// The disk refused to reserve `len` bytes in `dir`.
    fn reserving(len: u64, dir: &Path, e: std::io::Error) -> Failure {
        let why = format!(
            "cannot reserve {len} bytes for a spill file in {}: {e}",
            dir.display()
        );
        if no_room(&e) {
            Failure::no_room(why)
        } else {
            Failure::disk(why)
        }
    }

    /// Writing the spill file in `dir` failed: no room (`ENOSPC`, or a
    /// quota: the disk filled up under a file that could not be
    /// reserved), or the disk's fault.
    fn writing(dir: &Path, e: std::io::Error) -> Failure {
        let why = format!("cannot write a spill file in {}: {e}", dir.display());
        if no_room(&e) {
            Failure::no_room(why)
        } else {
            Failure::disk(why)
        }
    }

    /// A decoder's error: the data's, unless reading the `.zt` failed.
    fn of(dec: &DirectDecoder, why: String) -> Failure {
        Failure {
            why,
            retry: dec.input_failed(),
            no_room: false,
        }
    }
}

/// A tensor being (or done being) decoded into a spill file. Readers wait
/// only until their bytes are there, or until the whole stream has been
/// checked if its bytes cannot be trusted before that (`early` false).
pub struct Spill {
    file: File,
    early: bool,
    /// (bytes decoded so far, Some(error or "" when finished)).
    progress: Mutex<(u64, Option<String>)>,
    cond: Condvar,
    /// It failed in a way the next read should try again (the disk).
    retry: AtomicBool,
    /// It failed for want of room on the disk.
    no_room: AtomicBool,
    /// Its share of `--decoded-cache-size`, given back with it, or when
    /// it fails (its file is cut to nothing then).
    charge: Mutex<Option<super::decoded_disk::SpillCharge>>,
}

impl Spill {
    /// Starts decoding the blob stored at `span` into a new file under
    /// `dir`, once the disk has room for its `decoded` bytes.
    pub fn start(
        span: &Span,
        guard: &Arc<Guard>,
        decoded: u64,
        dir: &Path,
        early: bool,
        stats: &Arc<Stats>,
    ) -> Result<Arc<Spill>, ReadError> {
        let spill = Spill::create(dir, decoded, early)?;
        let (span, guard, s, stats) = (span.clone(), guard.clone(), spill.clone(), stats.clone());
        let dir = dir.to_path_buf();
        std::thread::Builder::new()
            .name("zt-spill".into())
            .spawn(move || {
                let _ends = EndOnDrop(&s);
                Stats::add(&stats.spilled_tensors, 1);
                let r = s.decode(&span, &guard, decoded, &dir, &stats);
                // The plan and the trust check read the frame header
                // through the mapping; let go of it.
                span.release_all();
                let done = lock(&s.progress).0;
                s.end(r, done);
            })
            .map_err(|e| format!("cannot start the spill thread: {e}"))?;
        Ok(spill)
    }

    /// Starts making a computed blob of `len` bytes into a new file under
    /// `dir` on a thread of its own: `run` hands each piece it makes, in
    /// order, to the function it is given, which writes it there. Nothing
    /// of it is whole in memory. Readers wait for the end (`run` checks
    /// what it made as it goes and at its end), then read the file.
    pub fn produce(
        run: Box<Making>,
        len: u64,
        dir: &Path,
        stats: &Arc<Stats>,
    ) -> Result<Arc<Spill>, ReadError> {
        let spill = Spill::create(dir, len, false)?;
        let (s, stats) = (spill.clone(), stats.clone());
        let dir = dir.to_path_buf();
        std::thread::Builder::new()
            .name("zt-spill".into())
            .spawn(move || {
                let _ends = EndOnDrop(&s);
                let _place = Place::take();
                Stats::add(&stats.spilled_tensors, 1);
                Stats::add(&stats.decompressions, 1);
                let r = s.write_all(run, len, &dir);
                let done = if r.is_ok() { len } else { 0 };
                s.end(r, done);
            })
            .map_err(|e| format!("cannot start the spill thread: {e}"))?;
        Ok(spill)
    }

    /// A new, empty spill of `len` bytes under `dir`, once the disk has
    /// room for it (asked early, and again when the space is reserved).
    fn create(dir: &Path, len: u64, early: bool) -> Result<Arc<Spill>, ReadError> {
        room(dir, len).map_err(|why| ReadError::new(Kind::NoSpace, why))?;
        let file = tempfile::tempfile_in(dir).map_err(|e| {
            super::error::of_io(
                &e,
                format!("cannot create a spill file in {}: {e}", dir.display()),
            )
        })?;
        Ok(Arc::new(Spill {
            file,
            early,
            progress: Mutex::new((0, None)),
            cond: Condvar::new(),
            retry: AtomicBool::new(false),
            no_room: AtomicBool::new(false),
            charge: Mutex::new(None),
        }))
    }

    /// Records how its making ended, `done` bytes made. A failure gives the
    /// disk back before anyone may try again (the next spill asks for the
    /// free space); a reader of bytes past the cut gets a short read, not
    /// zeros.
    fn end(&self, r: Result<(), Failure>, done: u64) {
        match r {
            Ok(()) => self.advance(done, Some(String::new())),
            Err(f) => {
                let _ = self.file.set_len(0);
                self.retry.store(f.retry, Release);
                self.no_room.store(f.no_room, Release);
                self.advance(done, Some(f.why));
                // After it is marked failed: `keep` then keeps no charge.
                lock(&self.charge).take();
            }
        }
    }

    fn write_all(&self, run: Box<Making>, len: u64, dir: &Path) -> Result<(), Failure> {
        {
            let _one = lock(&RESERVING);
            room(dir, len).map_err(Failure::no_room)?;
            reserve(&self.file, len).map_err(|e| Failure::reserving(len, dir, e))?;
        }
        let mut at = 0u64;
        let mut disk: Option<Failure> = None;
        let r = run(&mut |piece: &[u8]| {
            let end = at + piece.len() as u64;
            if end > len {
                return Err(format!(
                    "its reader made more than the {len} bytes expected"
                ));
            }
            if let Err(e) = self.file.write_all_at(piece, at) {
                let f = Failure::writing(dir, e);
                let why = f.why.clone();
                disk = Some(f);
                return Err(why);
            }
            at = end;
            Ok(())
        });
        if let Some(f) = disk {
            return Err(f);
        }
        r.map_err(Failure::data)?;
        if at != len {
            return Err(Failure::data(format!(
                "its reader made {at} bytes, expected {len}"
            )));
        }
        Ok(())
    }

    /// Keeps `charge` while it is held.
    pub fn keep(&self, charge: super::decoded_disk::SpillCharge) {
        let mut held = lock(&self.charge);
        // One that failed already gave its disk back.
        if !matches!(&lock(&self.progress).1, Some(why) if !why.is_empty()) {
            *held = Some(charge);
        }
    }

    /// Whether it ended, made or failed.
    pub fn finished(&self) -> bool {
        lock(&self.progress).1.is_some()
    }

    /// Whether it has decoded all of its tensor, without error: what it
    /// holds on disk.
    pub fn complete(&self) -> bool {
        matches!(&lock(&self.progress).1, Some(why) if why.is_empty())
    }

    /// The file it decoded into, once all `len` bytes of it are there:
    /// the tensor's bytes. (The last byte is published only once the
    /// stream has been checked to its end, so a reader that has it may
    /// close before the spill is marked complete: this does not wait.)
    pub fn complete_file(&self, len: u64) -> Option<&File> {
        let g = lock(&self.progress);
        let failed = matches!(&g.1, Some(why) if !why.is_empty());
        (g.0 >= len && !failed).then_some(&self.file)
    }

    /// Whether it failed in a way that a new spill may not (a full disk).
    pub fn failed_for_now(&self) -> bool {
        self.retry.load(Acquire)
    }

    fn decode(
        &self,
        span: &Span,
        guard: &Guard,
        decoded: u64,
        dir: &Path,
        stats: &Stats,
    ) -> Result<(), Failure> {
        let _place = Place::take();
        let len = usize::try_from(decoded).map_err(|_| {
            Failure::data(format!("{decoded} bytes do not fit in memory addresses"))
        })?;
        {
            // Spills that waited for a place ask and reserve one at a time,
            // or together they could take more than they were told.
            let _one = lock(&RESERVING);
            room(dir, decoded).map_err(Failure::no_room)?;
            reserve(&self.file, decoded).map_err(|e| Failure::reserving(decoded, dir, e))?;
        }
        Stats::add(&stats.decompressions, 1);
        // Every frame's window, read from the headers first (through the
        // mapping, let go of as the walk goes): the stream decoder only
        // when all are small, so it never stops part way for want of a
        // window. Going again from the start would rewrite bytes readers
        // may be reading (zstd uses its output past what it has finished
        // as scratch space).
        let window =
            zstd_blob::max_window(span.bytes(), |walked| span.release(walked)).unwrap_or(u64::MAX);
        if window <= 1 << STREAM_WINDOW_LOG {
            self.decode_streamed(span, guard, decoded, dir, stats)
        } else {
            self.decode_mapped(span, guard, len, dir, window, stats)
        }
    }

    /// Decodes with zstd's stream decoder (a window buffer of its own, at
    /// most 2^[`STREAM_WINDOW_LOG`]) and writes what comes out with pwrite.
    fn decode_streamed(
        &self,
        span: &Span,
        guard: &Guard,
        decoded: u64,
        dir: &Path,
        stats: &Stats,
    ) -> Result<(), Failure> {
        let read_failed = Cell::new(false);
        let input = std::io::BufReader::with_capacity(
            1 << 20,
            Pread {
                file: span.file.file(),
                at: span.offset,
                end: span.offset + span.len,
                failed: &read_failed,
            },
        );
        let (mut pos, mut fault) = (0u64, None);
        let r = zstd_blob::decode_stream_from(input, decoded, STREAM_WINDOW_LOG, |chunk| {
            // As in the mapped path: nothing decoded from a changed file
            // is published.
            if let Err(why) = guard.check() {
                fault = Some(Failure::data(why.clone()));
                return Err(why);
            }
            if let Err(e) = self.file.write_all_at(chunk, pos) {
                let f = Failure::writing(dir, e);
                let why = f.why.clone();
                fault = Some(f);
                return Err(why);
            }
            pos += chunk.len() as u64;
            Stats::add(&stats.spilled_bytes, chunk.len() as u64);
            Stats::add(&stats.decompressed_bytes, chunk.len() as u64);
            // The last byte waits for the end check.
            self.advance(pos.min(decoded.saturating_sub(1)), None);
            Ok(())
        });
        if let Some(f) = fault {
            return Err(f);
        }
        guard.check().map_err(Failure::data)?;
        r.map_err(|why| Failure {
            why,
            retry: read_failed.get(),
            no_room: false,
        })?;
        self.advance(decoded, None);
        Ok(())
    }

    /// Decodes straight into a shared mapping of the file: no window
    /// buffer, whatever window the frames declare.
    fn decode_mapped(
        &self,
        span: &Span,
        guard: &Guard,
        len: usize,
        dir: &Path,
        window: u64,
        stats: &Stats,
    ) -> Result<(), Failure> {
        let decoded = len as u64;
        let dir = dir.display();
        // SAFETY: the file is ours alone (unlinked) and keeps its length
        // while mapped; a page that fails to come in is caught (`watch`).
        let mut map = unsafe { memmap2::MmapOptions::new().len(len).map_mut(&self.file) }
            .map_err(|e| Failure::disk(format!("cannot map the spill file in {dir}: {e}")))?;
        let base = map.as_mut_ptr();
        // Declared after `map`, so dropped (unwatched) before it is unmapped.
        let watch = Watched::new(base, len)
            .ok_or_else(|| Failure::disk("no free slot to watch the spill file".into()))?;
        let lost = || {
            Failure::disk(format!(
                "a page of a spill file in {dir} could not be read or written"
            ))
        };
        // SAFETY: `map` is `len` writable bytes, outlives the decoder and is
        // written by nothing else; readers go through the file.
        let mut dec =
            unsafe { DirectDecoder::new(span.reader(), base, len) }.map_err(Failure::data)?;
        // How far back matches reach; past `keep`, they fault pages back in,
        // which then stay until released from the start again.
        let keep = window.clamp(BATCH as u64, MAX_KEEP as u64) as usize;
        let (mut ahead, mut behind) = (0usize, 0usize);
        let mut releases = 0u32;
        loop {
            let at = dec.produced();
            if at >= len {
                break;
            }
            ahead = ahead.max(page_floor(at));
            if at + BATCH / 2 >= ahead && ahead < len {
                // Best effort: one call instead of a fault per page.
                let n = BATCH.min(len - ahead);
                advise(base, ahead, n, libc::MADV_POPULATE_WRITE);
                ahead += n;
            }
            // About BATCH of output (a block more at most, however well
            // the data compresses); readers hear of it after each.
            let stepped = dec.step_output(BATCH);
            // Bytes decoded from a file that changed are not published; a
            // change explains a failed step (a short read) best, and a lost
            // page of ours (zeros in the window) explains bad data best.
            guard.check().map_err(Failure::data)?;
            if watch.hit() {
                return Err(lost());
            }
            stepped.map_err(|e| Failure::of(&dec, e))?;
            let now = dec.produced();
            Stats::add(&stats.spilled_bytes, (now - at) as u64);
            Stats::add(&stats.decompressed_bytes, (now - at) as u64);
            if now > behind + keep + BATCH {
                let to = page_floor(now - keep);
                // Long matches bring pages back, at most a window behind:
                // release that far back each time (each release walks the
                // page tables it covers), and for a window too big for
                // that, from the start now and then.
                releases += 1;
                let back = window.min(RELEASE_BACK as u64) as usize;
                let from = if window > RELEASE_BACK as u64 && releases.is_multiple_of(16) {
                    0
                } else {
                    behind.min(page_floor(to.saturating_sub(back)))
                };
                advise(base, from, to - from, libc::MADV_DONTNEED);
                behind = to;
            }
            // The last byte waits for the end check.
            self.advance((now as u64).min(decoded.saturating_sub(1)), None);
        }
        let end = dec.finish();
        guard.check().map_err(Failure::data)?;
        if watch.hit() {
            return Err(lost());
        }
        end.map_err(|e| Failure::of(&dec, e))?;
        self.advance(decoded, None);
        Ok(())
    }

    fn advance(&self, done: u64, end: Option<String>) {
        let mut g = lock(&self.progress);
        g.0 = done;
        if end.is_some() {
            g.1 = end;
        }
        self.cond.notify_all();
    }

    /// Whether [`Self::read`] of the bytes before `need` would wait now.
    pub fn would_wait(&self, need: u64) -> bool {
        let g = lock(&self.progress);
        g.1.is_none() && !(self.early && g.0 >= need)
    }

    /// Decoded bytes `[at, at+out.len())`, once they are there.
    pub fn read(&self, at: u64, out: &mut [u8]) -> Result<(), ReadError> {
        let need = at + out.len() as u64;
        let mut g = lock(&self.progress);
        loop {
            match &g.1 {
                Some(e) if !e.is_empty() => return Err(self.failure(e.clone())),
                Some(_) if g.0 >= need => break,
                Some(_) => {
                    return Err(format!("spill ended at {} bytes, before {need}", g.0).into());
                }
                None if self.early && g.0 >= need => break,
                None => g = self.cond.wait(g).unwrap_or_else(|e| e.into_inner()),
            }
        }
        drop(g);
        self.file.read_exact_at(out, at).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                // A spill that failed meanwhile and was cut: it records its
                // reason (and whether to try again) right after the cut,
                // and that reason is the one to give.
                let mut g = lock(&self.progress);
                let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
                while g.1.is_none() && std::time::Instant::now() < until {
                    let wait = std::time::Duration::from_millis(100);
                    g = self
                        .cond
                        .wait_timeout(g, wait)
                        .map_or_else(|e| e.into_inner().0, |r| r.0);
                }
                if let Some(why) = g.1.as_ref().filter(|why| !why.is_empty()) {
                    return self.failure(why.clone());
                }
            } else if lock(&self.progress).1.is_some() {
                // The disk under the spill file: a new spill may do better.
                // A spill still running is left to finish; this read fails.
                self.retry.store(true, Release);
            }
            format!("cannot read the spill file: {e}").into()
        })
    }

    /// Its recorded failure `why`, as its readers get it.
    fn failure(&self, why: String) -> ReadError {
        let kind = if self.no_room.load(Acquire) {
            Kind::NoSpace
        } else {
            Kind::Failed
        };
        ReadError::new(kind, why)
    }
}

/// Whether the disk refused for want of room: full (`ENOSPC`) or over a
/// quota (`EDQUOT`), for a reservation or a write.
fn no_room(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// A byte range of a file, read with pread (no shared offset, no mapping).
struct Pread<'a> {
    file: &'a File,
    at: u64,
    end: u64,
    /// Set on an I/O error: the disk's fault, not the data's.
    failed: &'a Cell<bool>,
}

impl std::io::Read for Pread<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min((self.end - self.at) as usize);
        match self.file.read_at(&mut buf[..n], self.at) {
            Ok(k) => {
                self.at += k as u64;
                Ok(k)
            }
            Err(e) => {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    self.failed.set(true);
                }
                Err(e)
            }
        }
    }
}

/// Gives the file `len` bytes of disk now, so a full disk is an error here
/// and not a fault later. Where the filesystem cannot, the file is only
/// sized (sparse); the watch catches what that risks.
pub(crate) fn reserve(file: &File, len: u64) -> std::io::Result<()> {
    match allocate(file, len) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => {
            file.set_len(len)
        }
        r => r,
    }
}

/// A new unlinked file under `dir` of `len` bytes, all of them on disk
/// (`fallocate`, checked and made one at a time with the spills'): one
/// that a shared mapping can be written through without a fault for want
/// of room. An error where the directory lacks the room or the
/// filesystem cannot reserve it.
pub(crate) fn reserved_file(dir: &Path, len: u64) -> Result<File, String> {
    let _one = lock(&RESERVING);
    room(dir, len)?;
    let file = tempfile::tempfile_in(dir).map_err(|e| e.to_string())?;
    allocate(&file, len).map_err(|e| format!("cannot reserve {len} bytes: {e}"))?;
    Ok(file)
}

/// `fallocate` of `len` bytes from 0 (the file's size too).
fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    let n =
        i64::try_from(len).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    loop {
        // SAFETY: a plain syscall on a file descriptor we own.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, n) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

fn page_floor(n: usize) -> usize {
    n & !(page_size() - 1)
}

/// madvise over `[base+from, base+from+len)`, rounded to whole pages.
/// Best effort: a kernel without the advice simply faults as usual.
fn advise(base: *mut u8, from: usize, len: usize, advice: libc::c_int) {
    let start = page_floor(from);
    let len = from + len - start;
    // SAFETY: inside the spill mapping (`from + len <= its length`, and its
    // base is page-aligned); neither advice changes what the file holds.
    unsafe { libc::madvise(base.add(start).cast(), len, advice) };
}

/// Held while a spill checks the free space and reserves its share.
static RESERVING: Mutex<()> = Mutex::new(());

/// Whether `dir` has room for a spill of `decoded` bytes. The size comes
/// from the index: ask the disk before trusting it, and leave a quarter of
/// what is free to everyone else.
pub(crate) fn room(dir: &Path, decoded: u64) -> Result<(), String> {
    match free_bytes(dir) {
        Some(free) if decoded > free - free / 4 => Err(format!(
            "{decoded} decoded bytes are too big for the cache and for {} ({free} bytes free; a spill may take three quarters)",
            dir.display()
        )),
        _ => Ok(()),
    }
}

/// Bytes an unprivileged writer may still put in `dir`'s filesystem.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid C string and a zeroed struct the call fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0)
        .then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// A place among the spill decoders at work, given back however its
/// thread ends.
struct Place;

static PLACES: Mutex<usize> = Mutex::new(0);
static PLACE_FREED: Condvar = Condvar::new();

impl Place {
    fn take() -> Place {
        let mut n = lock(&PLACES);
        while *n >= MAX_DECODERS {
            n = PLACE_FREED.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
        Place
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        *lock(&PLACES) -= 1;
        PLACE_FREED.notify_one();
    }
}

/// Ends a spill that its thread left unfinished (a panic), so its readers
/// get an error instead of waiting forever.
struct EndOnDrop<'a>(&'a Spill);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        let mut g = lock(&self.0.progress);
        if g.1.is_some() {
            return;
        }
        g.1 = Some("the spill thread stopped".into());
        self.0.retry.store(true, Release);
        self.0.cond.notify_all();
        drop(g);
        // As a failure: its share of the bound goes back.
        lock(&self.0.charge).take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_refused_for_room_is_no_room_other_write_errors_are_the_disks() {
        let dir = Path::new("/cache");
        for (errno, no_room) in [
            (libc::ENOSPC, true),
            (libc::EDQUOT, true),
            (libc::EIO, false),
        ] {
            let f = Failure::writing(dir, std::io::Error::from_raw_os_error(errno));
            assert_eq!((f.no_room, f.retry), (no_room, true), "errno {errno}");
            assert!(
                f.why.starts_with("cannot write a spill file in /cache: "),
                "{}",
                f.why
            );
        }
    }
}
