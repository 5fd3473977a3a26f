//! Writes served bytes into their backing files on a thread of its own,
//! the copy at the idle priority of the CPU, so that a first load never
//! waits for them.
//!
//! A decoded tensor's first reads are answered from the cache and then
//! copied into the file that will back its later opens. That copy lands in
//! new page-cache pages, which took half of the daemon's CPU in a model's
//! first load on the project's VM (new memory is slow there: BENCHMARKS.md),
//! twice what the decode took. Done by the FUSE worker after each reply, it
//! made the load wait for it. Here it takes only CPU nothing else wants:
//! on a host with cores to spare every read is written, and the tensor is
//! decoded once; on one whose cores the load keeps busy, the queue fills,
//! what does not fit is not written, and the backing file's fill decodes
//! those bytes again once the mount is idle (see `backing`).
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
}

impl WriteBehind {
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
        // At the normal priority: the work takes locks that serving threads
        // wait on, and lowers it itself around its copy
        // (`priority::with_idle_cpu`).
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
            work();
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
