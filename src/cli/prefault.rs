//! Faulting in the heap ahead of the mount's index read and tree.
//!
//! A large index becomes a catalog and a tree of about 1.5 KiB of new
//! memory per tensor, and on a virtual machine a new page costs several
//! microseconds to fault in: for 10^5 tensors, about a fifth of the time
//! to mount. While they are built:
//!
//! - allocations up to 32 MiB come from the heap, and the heap keeps what
//!   is freed: the index's vectors, once read into the catalog, make room
//!   for the catalog's own instead of going back to the kernel and being
//!   faulted in anew;
//! - a thread on another core asks the kernel to populate the pages the
//!   heap has just grown by (`MADV_POPULATE_WRITE`, Linux 5.14+): the same
//!   pages the builder would fault in, faulted in once, on a core that was
//!   idle. The heap grows [`TOP_PAD`] at a time so that the thread stays
//!   ahead of the builder.
//!
//! When it stops, malloc's three settings are set to glibc's defaults
//! (the daemon then sets its own thresholds, `tune_malloc`), and the
//! heap's free pages go back to the kernel (`malloc_trim`): what is kept
//! afterwards is what was built. The measure is in BENCHMARKS.md ("Mount
//! of 100 000 tensors").
//!
//! Nothing is read or written through the populated pages here, and the
//! heap's end comes from the kernel (`brk(0)`), so the builder's blocks
//! are not touched: a kernel without the advice, or a heap that grows
//! faster than the thread, only costs the faults it would have cost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

/// How far past what it needs the heap grows at a time while the thread
/// runs (glibc's default is 128 KiB).
const TOP_PAD: libc::c_int = 8 << 20;
const DEFAULT_TOP_PAD: libc::c_int = 128 << 10;
/// glibc's default mmap and trim thresholds (the daemon sets its own when
/// it starts serving).
const DEFAULT_THRESHOLD: libc::c_int = 128 << 10;
/// Allocations below this come from the heap while the thread runs (the
/// most glibc takes), and the heap keeps up to this much free at its top.
const BIG: libc::c_int = 32 << 20;
/// How often the thread looks at the heap's end while it grows, and at
/// most while it does not (a remote index can take seconds to fetch).
const POLL: Duration = Duration::from_micros(100);
const POLL_IDLE: Duration = Duration::from_millis(5);

/// The running thread; [`Prefault::stop`] ends it (it must be stopped
/// before the process forks).
pub struct Prefault {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Starts faulting in the heap ahead of its use.
pub fn start() -> Prefault {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("prefault".into())
        .spawn(move || run(&flag))
        .ok();
    if thread.is_some() {
        // SAFETY: mallopt takes two integers and sets one of malloc's own
        // parameters under its lock; each value is in its range.
        unsafe {
            libc::mallopt(libc::M_TOP_PAD, TOP_PAD);
            libc::mallopt(libc::M_MMAP_THRESHOLD, BIG);
            libc::mallopt(libc::M_TRIM_THRESHOLD, BIG);
        }
    }
    Prefault { stop, thread }
}

impl Prefault {
    /// Ends the thread and waits for it; the heap grows as before.
    pub fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            // SAFETY: as in `start`; malloc_trim gives back free pages under
            // malloc's lock and touches no allocated block.
            unsafe {
                libc::mallopt(libc::M_TOP_PAD, DEFAULT_TOP_PAD);
                libc::mallopt(libc::M_MMAP_THRESHOLD, DEFAULT_THRESHOLD);
                libc::mallopt(libc::M_TRIM_THRESHOLD, DEFAULT_THRESHOLD);
                libc::malloc_trim(0);
            }
        }
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        self.end();
    }
}

/// The heap's end, from the kernel.
fn heap_end() -> usize {
    // SAFETY: brk(0) asks for the current program break and changes
    // nothing; the kernel answers under its own lock.
    unsafe { libc::syscall(libc::SYS_brk, 0usize) as usize }
}

fn run(stop: &AtomicBool) {
    let page = 4096usize;
    let mut done = heap_end().next_multiple_of(page);
    let mut poll = POLL;
    while !stop.load(Relaxed) {
        let end = heap_end() & !(page - 1);
        if end <= done {
            std::thread::sleep(poll);
            poll = (poll * 2).min(POLL_IDLE);
            continue;
        }
        poll = POLL;
        // SAFETY: [done, end) was inside the heap, this process's own
        // anonymous memory, when the kernel gave its end; populating pages
        // for writing faults them in without changing a byte of them. If
        // malloc trims the heap meanwhile, the range is partly unmapped and
        // the call fails with ENOMEM (the thread then ends), changing
        // nothing; so does a kernel without the advice.
        let r = unsafe {
            libc::madvise(
                done as *mut libc::c_void,
                end - done,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            return;
        }
        done = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks allocated and written while the thread runs keep their
    /// bytes, and it stops. (A test thread allocates from an arena of its
    /// own, not the heap the thread populates: the mounts of the suite
    /// run that path.)
    #[test]
    fn memory_built_while_faulting_in_ahead_holds_what_was_written() {
        let p = start();
        let blocks: Vec<Vec<u64>> = (0..64u64)
            .map(|i| (0..(64 << 10) / 8).map(|j| i * 1_000_003 + j).collect())
            .collect();
        p.stop();
        for (i, b) in blocks.iter().enumerate() {
            let i = i as u64;
            assert!(
                b.iter()
                    .enumerate()
                    .all(|(j, &v)| v == i * 1_000_003 + j as u64)
            );
        }
    }
}
