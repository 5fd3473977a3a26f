//! One SIGBUS handler for the process, for the mappings of files that
//! may lose pages under it: a mounted source file cut short by another
//! program, a spill or a cache's shared bitmap or sums that cannot be
//! brought in (a disk error, a full disk under a sparse file, a file cut
//! by another program). A fault in a mapping registered here is absorbed by
//! mapping a blank page over the one that faulted; its owner learns of it
//! through the count of hits. Anything else dies of SIGBUS as it would
//! have. Async-signal-safe throughout: the handler touches atomics and
//! calls mmap(2) only.

use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// A mapping the SIGBUS handler answers for; `len` 0: a free slot.
struct Mapping {
    base: AtomicUsize,
    len: AtomicUsize,
    /// SIGBUS absorbed in it.
    hits: AtomicUsize,
}

impl Mapping {
    const fn free() -> Mapping {
        Mapping {
            base: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            hits: AtomicUsize::new(0),
        }
    }
}

/// Most served files mapped at once (a model's shards each take one):
/// as many as a catalog names.
pub const MAX_FILES: usize = crate::catalog::MAX_SOURCES;
static FILES: [Mapping; MAX_FILES] = [const { Mapping::free() }; MAX_FILES];

/// Most writable mappings of our own files watched at once: spills, and
/// two for each remote object's cache (its shared bitmap and sums).
pub const MAX_WATCHED: usize = 512;
static WATCHED: [Mapping; MAX_WATCHED] = [const { Mapping::free() }; MAX_WATCHED];
/// SIGBUS absorbed in any watched mapping.
static WATCHED_HITS: AtomicUsize = AtomicUsize::new(0);

/// Takes a free slot of `table` for `[base, base+len)`.
fn claim(table: &[Mapping], base: usize, len: usize) -> Option<usize> {
    table.iter().position(|m| {
        // The base claims the slot; the length, stored last, arms it.
        if m.base.compare_exchange(0, base, SeqCst, SeqCst).is_ok() {
            m.hits.store(0, SeqCst);
            m.len.store(len, SeqCst);
            true
        } else {
            false
        }
    })
}

fn release(m: &Mapping) {
    m.len.store(0, SeqCst);
    m.base.store(0, SeqCst);
}

/// The slot of `table` whose mapping holds `addr`. Async-signal-safe.
fn holding(table: &[Mapping], addr: usize) -> Option<&Mapping> {
    table.iter().find(|m| {
        // The length on both sides of the base: a slot freed and taken
        // again in between gives a pair that never was, which is skipped.
        let (l1, b, l2) = (m.len.load(SeqCst), m.base.load(SeqCst), m.len.load(SeqCst));
        l1 == l2 && l1 != 0 && b != 0 && addr >= b && addr < b + l1
    })
}

/// A writable shared mapping of a file of the mount's own (a spill, a
/// remote cache's shared bitmap or sums), watched while this lives: a page
/// of it that cannot be brought in (an I/O error, a disk that filled under
/// a sparse file, a file cut short by another program) raises SIGBUS,
/// which the handler absorbs by mapping a blank page there, so the daemon
/// lives on and the writer learns of it through [`Watched::hit`].
pub struct Watched {
    slot: usize,
    hits_before: usize,
}

impl Watched {
    /// Watches `[base, base+len)`; `None` when every slot is taken. Drop
    /// before unmapping.
    pub fn new(base: *mut u8, len: usize) -> Option<Watched> {
        install_handler();
        let hits_before = WATCHED_HITS.load(SeqCst);
        let slot = claim(&WATCHED, base as usize, len)?;
        Some(Watched { slot, hits_before })
    }

    /// Whether a SIGBUS was absorbed in any watched mapping since this one
    /// began (any: the count is shared, so a hit elsewhere counts here too,
    /// which errs on the safe side).
    pub fn hit(&self) -> bool {
        WATCHED_HITS.load(SeqCst) != self.hits_before
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        release(&WATCHED[self.slot]);
    }
}

/// Maps a blank page over the page holding `addr`, which must be one that
/// [`holding`] found in a mapping of ours. Async-signal-safe.
fn blank_page(addr: usize, prot: libc::c_int) -> bool {
    let page = PAGE.load(SeqCst);
    let at = addr & !(page - 1);
    // SAFETY: both callers pass an address in a registered mapping of ours
    // that the faulting access is in (so still mapped): MAP_FIXED replaces
    // that one page. mmap(2) is a bare syscall, safe in a handler.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            page,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}

/// The page size, read once at install: `sysconf` is not on the list of
/// calls a signal handler may make.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Async-signal-safe work only: atomics and mmap(2); errno as it was.
    // SAFETY: __errno_location gives this thread's errno, always valid; a
    // plain load of it (and the store back below) is async-signal-safe.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t for the
    // handler's run; for SIGBUS its si_addr is the faulting address.
    let addr = unsafe { (*info).si_addr() } as usize;
    let mine = |hits: &AtomicUsize| {
        hits.fetch_add(1, SeqCst);
        // SAFETY: this thread's errno, put back as it was on entry.
        unsafe { *libc::__errno_location() = errno };
    };
    // The watched mappings first: they come and go, and one may since sit
    // where a mapping that was watched as a file's used to be.
    if holding(&WATCHED, addr).is_some() && blank_page(addr, libc::PROT_READ | libc::PROT_WRITE) {
        mine(&WATCHED_HITS);
        return;
    }
    if let Some(m) = holding(&FILES, addr)
        && blank_page(addr, libc::PROT_READ)
    {
        mine(&m.hits);
        return;
    }
    // Not ours: die as SIGBUS would have killed us.
    // SAFETY: signal(2) and raise(3) are async-signal-safe and pass no
    // memory; with the default action back, the raise ends the process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn install_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(install);
}

fn install() {
    PAGE.store(
        // SAFETY: sysconf takes a constant and touches no memory of ours.
        unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize,
        SeqCst,
    );
    // SAFETY: an all-zero sigaction is valid (no handler, no flags) before
    // it is filled in; `on_sigbus` has the form SA_SIGINFO calls and does
    // only async-signal-safe work; the pointers live through the calls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

/// A mounted file's mapping, watched while this lives (read-only: a
/// fault maps a zero page, which the file's guard must then refuse to
/// serve). `None` when every slot is taken.
pub(crate) struct FileWatch(usize);

impl FileWatch {
    pub(crate) fn new(base: *const u8, len: usize) -> Option<FileWatch> {
        install_handler();
        claim(&FILES, base as usize, len).map(FileWatch)
    }

    /// SIGBUS absorbed in the mapping since it was watched.
    pub(crate) fn hits(&self) -> usize {
        FILES[self.0].hits.load(SeqCst)
    }

    /// Counts a hit as the handler would (for tests of what follows one).
    #[cfg(test)]
    pub(crate) fn count_hit(&self) {
        FILES[self.0].hits.fetch_add(1, SeqCst);
    }
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        release(&FILES[self.0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_page_that_cannot_come_in_is_blanked_and_reported() {
        install_handler();
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("spill"))
            .unwrap();
        file.set_len(3 * 4096).unwrap();
        // SAFETY: the file is this test's own; the page its shrinking below
        // takes away is first touched with write_volatile, under the watch.
        let mut map = unsafe { memmap2::MmapOptions::new().len(3 * 4096).map_mut(&file) }.unwrap();
        let w = Watched::new(map.as_mut_ptr(), map.len()).unwrap();
        map[0] = 1;
        assert!(!w.hit());
        file.set_len(4096).unwrap();
        // Without the watch this write kills the process with SIGBUS.
        // SAFETY: inside the 3-page map; the page is gone, so the write
        // faults and the handler maps a blank writable page there first.
        unsafe { std::ptr::write_volatile(map.as_mut_ptr().add(8192 + 5), 7) };
        assert!(w.hit());
        assert_eq!(map[8192 + 5], 7, "the write lands on the blank page");
        assert_eq!(map[0], 1, "the pages still there are untouched");
        drop(w);
    }
}
