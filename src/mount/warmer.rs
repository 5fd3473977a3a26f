//! Reads clones' pages into the page cache while the mount is idle.
//!
//! A clone of a raw tensor's range (`FICLONERANGE`) shares the source's
//! disk blocks, not its page cache: a read of a fresh clone is a read of
//! the disk, even while the source's own pages are all cached. So a tensor
//! is served by the daemon, from the source, until its clone's pages are
//! cached, and this reads them in: on one thread, at the idle priorities
//! of the CPU and the disk, and only while no open the daemon serves is
//! left. A load that ran meanwhile shared the disk, the memory and the CPU
//! with it: a first load of a model took 1.1-1.3 s instead of 0.6-0.7 s
//! with its clones read in beside it (BENCHMARKS.md, "Raw tensors backed by
//! clones").

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, Weak};

use super::backing::Backing;
use super::lock;

/// Bytes read in at a time: the thread looks again between steps whether
/// the daemon serves an open.
const STEP: u64 = 8 << 20;

#[derive(Default)]
pub struct Warmer {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    /// Notified when a clone is queued or the daemon serves no open.
    wake: Condvar,
    /// Clones queued or being read in.
    pending: AtomicU64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Weak<Backing>>,
    /// Inodes with an open the daemon serves.
    served: usize,
    started: bool,
}

impl Warmer {
    /// Queues clone `b`'s pages to be read in; dropping `b` meanwhile
    /// takes it off.
    pub fn queue(&self, b: &Arc<Backing>) {
        let mut st = lock(&self.inner.state);
        st.queue.push_back(Arc::downgrade(b));
        self.inner.pending.fetch_add(1, Relaxed);
        if !st.started {
            let inner = self.inner.clone();
            st.started = std::thread::Builder::new()
                .name("zt-warm-clones".into())
                .spawn(move || inner.run())
                .is_ok();
        }
        self.inner.wake.notify_all();
    }

    /// The daemon serves opens of `n` inodes now.
    pub fn served(&self, n: usize) {
        lock(&self.inner.state).served = n;
        if n == 0 {
            self.inner.wake.notify_all();
        }
    }

    /// Clones queued or being read in.
    pub fn pending(&self) -> u64 {
        self.inner.pending.load(Relaxed)
    }
}

impl Inner {
    fn run(&self) {
        idle_priority();
        while let Some(b) = self.next() {
            let mut at = 0;
            while at < b.len() {
                self.wait_idle();
                let n = STEP.min(b.len() - at);
                b.read_in(at, n);
                at += n;
            }
            // Noted now, so that the next open passes it through at once.
            b.resident();
            self.pending.fetch_sub(1, Relaxed);
        }
    }

    /// The next clone still backing a file, once the daemon serves no open.
    fn next(&self) -> Option<Arc<Backing>> {
        let mut st = lock(&self.state);
        loop {
            while st.served > 0 || st.queue.is_empty() {
                st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            while let Some(w) = st.queue.pop_front() {
                if let Some(b) = w.upgrade() {
                    return Some(b);
                }
                self.pending.fetch_sub(1, Relaxed);
            }
        }
    }

    /// Waits until the daemon serves no open.
    fn wait_idle(&self) {
        let mut st = lock(&self.state);
        while st.served > 0 {
            st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Puts the calling thread in the idle classes of the CPU and the disk
/// schedulers. Best effort: a kernel or scheduler without them leaves it
/// as it was.
fn idle_priority() {
    /// `IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0)`.
    const IOPRIO_IDLE: libc::c_long = 3 << 13;
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscalls on the calling thread (0 names it); `param`
    // is a valid sched_param that outlives the call.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE);
    }
}
