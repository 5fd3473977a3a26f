//! Whether the daemon is serving reads: work that can wait (filling a
//! backing file, which decodes again what no read wrote) waits until it
//! is not, so that it never takes CPU from a load.
//!
//! Only reads the daemon serves are seen: reads the kernel serves from a
//! backing file never reach it, and a process that keeps a file mapped
//! but reads nothing does not hold the work back.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How long no read must have been served for the mount to be quiet: a
/// loader's gap between two tensors is well under it.
pub const QUIET: Duration = Duration::from_millis(20);

pub struct Activity {
    /// Reads being served.
    reading: AtomicU64,
    /// When the last read ended, in microseconds since `start`.
    last: AtomicU64,
    start: Instant,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            reading: AtomicU64::new(0),
            last: AtomicU64::new(0),
            start: Instant::now(),
        }
    }
}

/// A read being served, until dropped.
pub struct Busy<'a>(&'a Activity);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let a = self.0;
        // Two reads ending together may reach here out of order: keep the
        // later end.
        a.last.fetch_max(a.now(), Relaxed);
        a.reading.fetch_sub(1, Relaxed);
    }
}

impl Activity {
    fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// A read begins; it ends when the value is dropped.
    pub fn begin(&self) -> Busy<'_> {
        self.reading.fetch_add(1, Relaxed);
        Busy(self)
    }

    /// Whether no read is being served, nor was in the last [`QUIET`].
    pub fn quiet(&self) -> bool {
        self.reading.load(Relaxed) == 0
            && self.now().saturating_sub(self.last.load(Relaxed)) >= QUIET.as_micros() as u64
    }

    /// Waits until [`Self::quiet`], looking again every half of [`QUIET`]
    /// (a condition variable would cost every read a lock), or until
    /// `give_up` says so.
    pub fn wait_quiet(&self, give_up: impl Fn() -> bool) {
        while !self.quiet() && !give_up() {
            std::thread::sleep(QUIET / 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_only_with_no_read_for_a_while() {
        let a = Activity::default();
        // A new mount waits out one QUIET too: its first read may be near.
        let b = a.begin();
        assert!(!a.quiet());
        drop(b);
        assert!(!a.quiet(), "a read just ended");
        let t0 = Instant::now();
        a.wait_quiet(|| false);
        assert!(t0.elapsed() >= QUIET / 2);
        assert!(a.quiet());
        let _b = a.begin();
        assert!(!a.quiet());
        // Giving up ends the wait whatever the reads.
        a.wait_quiet(|| true);
    }
}
