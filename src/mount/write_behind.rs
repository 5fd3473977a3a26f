//! Writes served bytes into their backing files on a thread of its own,
//! when a core is free, so that a first load never waits for them.
//!
//! A decoded tensor's first reads are answered from the cache and then
//! copied into the file that will back its later opens. That copy lands in
//! new page-cache pages, which took half of the daemon's CPU in a model's
//! first load on the project's VM (new memory is slow there: BENCHMARKS.md),
//! twice what the decode took. Done by the FUSE worker after each reply, it
//! made the load wait for it. Here it waits for a free core (fewer threads
//! ready to run than there are cores: `/proc/loadavg`): on a host with
//! cores to spare every read is written, and the tensor is decoded once; on
//! one whose cores the load keeps busy, the queue waits, what the cache
//! lets go meanwhile is not written, and the backing file's fill decodes
//! those bytes again once the mount is idle (see `backing`).
//!
//! Not the idle class of the scheduler: the work takes locks serving
//! threads take (a file's record of what is written, the cache's), and a
//! thread in that class may not run for as long as the cores are busy,
//! with them waiting on it (see `priority`).
//!
//! The queue does not keep frames cached: it holds slices of cached
//! frames weakly (a frame the cache let go meanwhile is not written, and
//! costs nothing to skip), owned bytes up to a bound in bytes, and a
//! bounded number of writes; past either a read's bytes are let go at once.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use super::lock;

type Work = Box<dyn FnOnce() + Send>;

pub struct WriteBehind {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// Notified when work is queued, and when the queue is done.
    wake: Condvar,
    /// Most bytes held by queued work.
    limit: u64,
}

/// Most writes queued: each is a few hundred bytes.
const MAX_QUEUED: usize = 16 << 10;

/// How often a write waiting for a free core looks again.
const WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// Whether fewer threads are ready to run than there are `cores`, this
/// one counted (the fourth field of `/proc/loadavg`, `running/total`).
/// True when it cannot be read: the write is made, as by a worker.
fn core_free(cores: usize) -> bool {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| running(&s))
        .is_none_or(|n| n <= cores)
}

/// The threads ready to run, from a `/proc/loadavg` text.
fn running(loadavg: &str) -> Option<usize> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

#[derive(Default)]
struct State {
    queue: VecDeque<(u64, Work)>,
    /// Bytes the queued work holds, the work running included.
    held: u64,
    /// Whether work is running.
    running: bool,
    started: bool,
}

impl WriteBehind {
    /// A queue holding at most `limit` bytes.
    pub fn new(limit: u64) -> WriteBehind {
        WriteBehind {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                wake: Condvar::new(),
                limit,
            }),
        }
    }

    /// Queues `work`, which holds `bytes` bytes until it has run; `Err`
    /// with it, not run, when those would pass the bound, the queue is
    /// full, or no thread can be started.
    pub fn push<W: FnOnce() + Send + 'static>(&self, bytes: u64, work: W) -> Result<(), W> {
        let mut st = lock(&self.inner.state);
        if st.held.saturating_add(bytes) > self.inner.limit
            || st.queue.len() >= MAX_QUEUED
            || !self.started(&mut st)
        {
            return Err(work);
        }
        st.held += bytes;
        st.queue.push_back((bytes, Box::new(work)));
        self.inner.wake.notify_all();
        Ok(())
    }

    fn started(&self, st: &mut State) -> bool {
        if !st.started {
            let inner = self.inner.clone();
            match std::thread::Builder::new()
                .name("zt-write-behind".into())
                .spawn(move || inner.run())
            {
                Ok(_) => st.started = true,
                Err(e) => log::debug!("cannot start the write-behind thread: {e}"),
            }
        }
        st.started
    }

    /// Waits until every write queued so far is done.
    #[cfg(test)]
    pub fn flush(&self) {
        let mut st = lock(&self.inner.state);
        while st.running || !st.queue.is_empty() {
            st = self.inner.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        // The thread ends once the queue is empty and nobody can push.
        let mut st = lock(&self.inner.state);
        st.started = false;
        self.inner.wake.notify_all();
    }
}

impl Inner {
    fn run(self: Arc<Self>) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        loop {
            let (bytes, work) = {
                let mut st = lock(&self.state);
                loop {
                    if let Some(w) = st.queue.pop_front() {
                        st.running = true;
                        break w;
                    }
                    if !st.started {
                        return;
                    }
                    st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            while !core_free(cores) && lock(&self.state).started {
                std::thread::sleep(WAIT);
            }
            // A bug in one write must not stop the queue (and leave every
            // later one holding its bytes).
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
                log::error!(
                    "a write into a backing file failed unexpectedly; its bytes are left to the fill"
                );
            }
            let mut st = lock(&self.state);
            st.held -= bytes;
            st.running = false;
            if st.queue.is_empty() {
                self.wake.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

    #[test]
    fn the_threads_ready_to_run_are_read_from_loadavg() {
        assert_eq!(running("0.52 0.58 0.59 3/456 12345\n"), Some(3));
        assert_eq!(running("0.52 0.58 0.59"), None);
        assert_eq!(running("0.52 0.58 0.59 x/456 1"), None);
        assert!(core_free(usize::MAX));
    }

    #[test]
    fn a_work_that_panics_does_not_stop_the_queue() {
        let wb = WriteBehind::new(100);
        assert!(wb.push(1, || panic!("a bug")).is_ok());
        let done = Arc::new(AtomicU64::new(0));
        let d = done.clone();
        assert!(
            wb.push(1, move || {
                d.store(1, SeqCst);
            })
            .is_ok()
        );
        wb.flush();
        assert_eq!(done.load(SeqCst), 1);
    }

    #[test]
    fn work_runs_in_order_and_past_the_bound_is_refused() {
        let wb = WriteBehind::new(100);
        let gate = Arc::new(Mutex::new(()));
        let held = lock(&gate);
        let done = Arc::new(AtomicU64::new(0));
        // The first work waits on the gate, so the next ones stay queued.
        let (g, d) = (gate.clone(), done.clone());
        assert!(
            wb.push(60, move || {
                drop(lock(&g));
                d.fetch_add(1, SeqCst);
            })
            .is_ok()
        );
        let d = done.clone();
        assert!(
            wb.push(40, move || {
                d.fetch_add(10, SeqCst);
            })
            .is_ok()
        );
        assert!(wb.push(1, || ()).is_err(), "past the bound");
        drop(held);
        wb.flush();
        assert_eq!(done.load(SeqCst), 11);
        // Room again once they ran.
        assert!(wb.push(100, || ()).is_ok());
        wb.flush();
    }
}
