//! A backing file: its bytes, and how the kernel is asked to read them in.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::{Holds, Origin, charge_of};

/// A complete file whose bytes are an exposed file's, at the same offsets.
pub struct Backing {
    pub(super) file: File,
    /// The data layer's owner of the same file, if any, kept while this
    /// is: the owner then does not count as idle, and dropping it would
    /// free no disk.
    _holds: Holds,
    pub(super) len: u64,
    /// Its bytes in [`Inner::filled`](super::Inner::filled).
    pub(super) charged: u64,
    pub(super) origin: Origin,
    /// Opens that the kernel serves from it now.
    pub(super) opens: AtomicUsize,
    /// When it was last opened ([`Backings`](super::Backings)' clock), for eviction.
    pub(super) used: AtomicU64,
    /// Every page of it was found in the page cache once (see
    /// [`Backing::resident`]); set from the start for all but clones.
    resident: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backing")
            .field("file", &self.file)
            .field("len", &self.len)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Backing {
    /// A backing of `len` bytes in `file`, last opened at `used` ([`Backings`](super::Backings)'
    /// clock). All but a clone are resident from the start (see
    /// [`Backing::resident`]).
    pub(super) fn new(file: File, holds: Holds, len: u64, origin: Origin, used: u64) -> Backing {
        let charged = match origin {
            Origin::Filled => charge_of(len, &holds),
            _ => 0,
        };
        Backing {
            file,
            _holds: holds,
            len,
            charged,
            origin,
            opens: AtomicUsize::new(0),
            used: AtomicU64::new(used),
            resident: std::sync::atomic::AtomicBool::new(origin != Origin::Cloned),
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Whether the kernel has all of it cached now, or had once. A clone
    /// shares the source's disk blocks but not its page cache: until its
    /// own pages are read in, a read of it is a read of the disk, several
    /// times slower than the daemon serving the source's cached pages.
    /// Pages dropped later are read back as any file's are.
    pub fn resident(&self) -> bool {
        if self.resident.load(Relaxed) {
            return true;
        }
        let all = all_cached(&self.file, self.len);
        if all {
            self.resident.store(true, Relaxed);
        }
        all
    }

    /// Bytes `[at, at+n)` of a filled file (cut at its end), for a read
    /// the daemon serves; `None` for a clone, whose pages may not be in
    /// memory when the source's are, and past the end.
    pub fn read(&self, at: u64, n: u64) -> Option<Vec<u8>> {
        let end = at.saturating_add(n).min(self.len);
        if self.origin != Origin::Filled || at >= end {
            return None;
        }
        read_range(&self.file, at, end)
    }

    /// Asks the disk for `[at, at+n)` of it, without waiting.
    fn will_need(&self, at: u64, n: u64) {
        let fd = std::os::unix::io::AsRawFd::as_raw_fd(&self.file);
        // SAFETY: fadvise only reads its integer arguments; `fd` is open
        // while `self` is.
        unsafe {
            libc::posix_fadvise(fd, at as i64, n as i64, libc::POSIX_FADV_WILLNEED);
        }
    }

    /// The most bytes one [`Self::will_need`] of it reads (see
    /// [`readahead_cap`]).
    fn readahead_step(&self) -> u64 {
        readahead_cap(&self.file)
    }

    /// Asks the disk for `[at, at+n)` of it in steps of `step`, while
    /// `go_on()` holds.
    fn will_need_steps(&self, at: u64, n: u64, step: u64, go_on: impl Fn() -> bool) {
        let mut k = 0;
        while k < n && go_on() {
            self.will_need(at + k, step.min(n - k));
            k += step;
        }
    }

    /// Reads `[at, at+n)` of a clone into the page cache and waits for it:
    /// asked of the disk in large folios (see [`Self::populate`]), then
    /// read into `buf`, a piece at a time, each piece twice. The first
    /// read also pays, here, what the first touch of a page the disk wrote
    /// costs on a VM (the hypervisor maps it then). The second read makes
    /// the kernel count the pages as used again (its active list), which
    /// the loader's first read would do otherwise: 6.9-7.2 GB/s for that
    /// load instead of 6.0-6.2 (BENCHMARKS.md, "Raw tensors backed by
    /// clones"). A page the disk
    /// cannot read is an error, as for any reader.
    pub fn read_in(&self, at: u64, n: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.populate(at, n);
        let mut k = 0;
        while k < n {
            let m = (n - k).min(buf.len() as u64) as usize;
            for _ in 0..2 {
                self.file.read_exact_at(&mut buf[..m], at + k)?;
            }
            k += m as u64;
        }
        Ok(())
    }

    /// Asks the disk for `[at, at+n)` (`at` on a page) through a mapping
    /// marked for huge pages (`MADV_HUGEPAGE`, then `MADV_POPULATE_READ`):
    /// the kernel then reads it into folios of up to 2 MiB. What
    /// `fadvise(WILLNEED)` reads in stays in 4 KiB pages, which a loader
    /// mapping the file faults in a few at a time: `np.load(mmap_mode="r")`
    /// of a clone-backed `.npy` ran at 4.0-4.3 GB/s with the clone read in
    /// that way, 8.4 GB/s this way, the source's own mapping 10.3 GB/s.
    /// Best effort: where either advice is refused, the reads that follow
    /// bring the pages in (in the folios the kernel's read-ahead makes).
    fn populate(&self, at: u64, n: u64) {
        let Ok(len) = usize::try_from(n) else {
            return;
        };
        // SAFETY: a read-only map of a clone the daemon made and nobody
        // writes (unlinked). No byte is read through it: the kernel fills
        // the page cache for MADV_POPULATE_READ, which fails (EFAULT)
        // rather than raising SIGBUS where a page cannot be read. It is
        // unmapped when dropped.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(at)
                .len(len)
                .map(&self.file)
        };
        if let Ok(map) = map {
            let _ = map.advise(memmap2::Advice::HugePage);
            let _ = map.advise(memmap2::Advice::PopulateRead);
        }
    }
}

/// Whether every page of the first `len` bytes of `file` is in the page
/// cache (`mincore` of a mapping that is never read through).
fn all_cached(file: &File, len: u64) -> bool {
    let Ok(n) = usize::try_from(len) else {
        return false;
    };
    if n == 0 {
        return true;
    }
    // SAFETY: a read-only map of a file the daemon made and nobody
    // writes (an unlinked clone); its bytes are never read through it,
    // only which pages are cached, and it is unmapped when dropped.
    let Ok(map) = (unsafe { memmap2::MmapOptions::new().len(n).map(file) }) else {
        return false;
    };
    let mut pages = vec![0u8; n.div_ceil(crate::source::page_size())];
    // SAFETY: `map` is a live mapping of `n` bytes at a page-aligned
    // address, and `pages` holds one byte per page of it, as mincore writes.
    let r = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, n, pages.as_mut_ptr()) };
    r == 0 && pages.iter().all(|p| p & 1 != 0)
}

/// Bytes `[at, end)` of `file`, in a buffer from the shared pool.
pub(super) fn read_range(file: &File, at: u64, end: u64) -> Option<Vec<u8>> {
    let mut v = crate::serve::data::scratch::take();
    v.resize((end - at) as usize, 0);
    file.read_exact_at(&mut v, at).ok()?;
    Some(v)
}

/// Most bytes asked of the disk by one `posix_fadvise(WILLNEED)`.
const WARM_STEP: u64 = 64 << 20;

/// Asks the disk for all of `b`'s bytes, from a thread of its own, so a
/// cold load gets deep, parallel reads instead of the kernel's readahead
/// behind each fault or read alone. Pages already cached cost a lookup.
/// It stops when no open reads `b` any more.
pub(super) fn warm(b: Arc<Backing>) {
    let _ = std::thread::Builder::new()
        .name("zt-warm".into())
        .spawn(move || {
            let step = b.readahead_step();
            b.will_need_steps(0, b.len, step, || b.opens.load(Relaxed) > 0);
        });
}

/// The most bytes of `file` one `posix_fadvise(WILLNEED)` reads: the
/// kernel cuts each call to the larger of its disk's read-ahead and
/// largest request (`force_page_cache_ra`), so a longer step would read
/// its first few MiB only. From sysfs, for a disk or a partition of one;
/// the kernel's default read-ahead (128 KiB) where sysfs does not say
/// (btrfs, whose files name no disk).
fn readahead_cap(file: &File) -> u64 {
    const DEFAULT: u64 = 128 << 10;
    let Ok(dev) = file
        .metadata()
        .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
    else {
        return DEFAULT;
    };
    let base = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
    let kib = |name: &str| {
        [
            format!("{base}/queue/{name}"),
            format!("{base}/../queue/{name}"),
        ]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok())
    };
    match kib("read_ahead_kb").max(kib("max_sectors_kb")) {
        Some(k) => (k << 10).clamp(crate::source::page_size() as u64, WARM_STEP),
        None => DEFAULT,
    }
}
