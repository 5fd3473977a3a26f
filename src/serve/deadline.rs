//! Runs calls on `--cache-dir` for the FUSE workers on a thread of its
//! own, waiting for each at most a deadline.
//!
//! A worker that waits on a disk that does not answer (a filesystem
//! frozen by `fsfreeze` for a snapshot, a hung network disk) is one fewer
//! to serve the mount, and once they all wait every request to it does:
//! opens of other files, `ls`, `.ztensor/stats`. What a worker asks of
//! `--cache-dir` this way is optional (a backing file to write a tensor's
//! reads into, a file to decode a large unit into instead of memory), so
//! past the deadline it goes on without it. The call goes on on this
//! thread; when it ends, what it made is dropped (an unlinked file:
//! nothing is left). While the call running has run past the deadline
//! (the disk is stuck), new calls are not queued but given up at once,
//! so the queue stays short however long the disk takes; a disk that is
//! only busy queues them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Longest a worker waits for a call on `--cache-dir`.
pub const DEADLINE: Duration = Duration::from_millis(200);

/// Calls queued at most behind one that has run past the deadline.
const MOST_QUEUED_STUCK: usize = 8;

type Call = Box<dyn FnOnce() + Send>;

/// One thread that runs calls in order, and what it is doing.
struct Runner {
    calls: Mutex<Sender<Call>>,
    /// Calls sent and not yet ended.
    queued: AtomicUsize,
    /// When the call running began, in microseconds since `epoch`, plus
    /// one; 0 while none runs.
    running_since: AtomicU64,
    epoch: Instant,
}

impl Runner {
    /// A runner on a thread of its own; `None` if it cannot start.
    fn start(name: &str) -> Option<Arc<Runner>> {
        let (tx, rx) = channel::<Call>();
        let runner = Arc::new(Runner {
            calls: Mutex::new(tx),
            queued: AtomicUsize::new(0),
            running_since: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        let me = runner.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || me.run(rx))
            .map_err(|e| log::warn!("cannot start the cache directory's thread: {e}"))
            .ok()?;
        Some(runner)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    fn run(&self, rx: Receiver<Call>) {
        while let Ok(call) = rx.recv() {
            self.running_since.store(self.now(), Relaxed);
            // A call that panics is one call lost, not the thread: every
            // later call would be given up.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).is_err() {
                log::error!("a call on the cache directory failed (a panic)");
            }
            self.running_since.store(0, Relaxed);
            self.queued.fetch_sub(1, Relaxed);
        }
    }

    /// Whether the call running has run past [`DEADLINE`].
    fn stuck(&self) -> bool {
        let since = self.running_since.load(Relaxed);
        since != 0 && self.now().saturating_sub(since) > DEADLINE.as_micros() as u64
    }

    fn within<T: Send + 'static>(
        &self,
        deadline: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        if self.stuck() && self.queued.load(Relaxed) >= MOST_QUEUED_STUCK {
            return None;
        }
        let (tx, rx) = channel();
        let call: Call = Box::new(move || {
            // A receiver gone (past its deadline) drops the value here.
            let _ = tx.send(f());
        });
        self.queued.fetch_add(1, Relaxed);
        if crate::serve::lock(&self.calls).send(call).is_err() {
            self.queued.fetch_sub(1, Relaxed);
            return None;
        }
        rx.recv_timeout(deadline).ok()
    }
}

/// The cache directory's runner, started at the first call.
static RUNNER: OnceLock<Option<Arc<Runner>>> = OnceLock::new();

/// `f()`, run on the cache directory's thread, if it ends within
/// [`DEADLINE`]; else `None`, and what it returns later is dropped. Run
/// here when that thread cannot be started.
pub fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    match RUNNER.get_or_init(|| Runner::start("zt-cache-dir")) {
        Some(r) => r.within(DEADLINE, f),
        None => Some(f()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    #[test]
    fn a_call_past_its_deadline_is_given_up_and_the_next_ones_still_run() {
        // A runner of its own: the mount's is shared by other tests.
        let r = Runner::start("test-cache-dir").unwrap();
        let short = Duration::from_millis(50);
        assert_eq!(r.within(short, || 7), Some(7));
        let (gate, open) = (Arc::new(Mutex::new(())), Arc::new(AtomicBool::new(false)));
        let held = crate::serve::lock(&gate);
        let (g, o) = (gate.clone(), open.clone());
        // A call that waits on a "disk" that does not answer.
        let stuck = r.within(short, move || {
            drop(crate::serve::lock(&g));
            o.store(true, SeqCst);
            1
        });
        assert_eq!(stuck, None);
        // Queued behind it: given up too, while the disk is stuck; and
        // once it has run past the deadline, past a few, not even queued.
        while !r.stuck() {
            std::thread::sleep(Duration::from_millis(10));
        }
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 * MOST_QUEUED_STUCK {
            let ran = ran.clone();
            let call = move || ran.fetch_add(1, SeqCst);
            assert_eq!(r.within(Duration::from_millis(5), call), None);
        }
        assert!(r.queued.load(SeqCst) <= MOST_QUEUED_STUCK + 1);
        drop(held);
        // The disk answers: the stuck call and those queued end.
        while r.queued.load(SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(r.within(DEADLINE, || 3), Some(3));
        assert!(open.load(SeqCst));
        let ran = ran.load(SeqCst);
        assert!(
            ran <= MOST_QUEUED_STUCK,
            "{ran} calls queued behind the stuck one"
        );
    }

    #[test]
    fn a_busy_disk_queues_calls_and_a_call_that_panics_stops_nothing() {
        let r = Runner::start("test-cache-dir").unwrap();
        // Many slow calls at once, none past the deadline: each is run.
        let calls: Vec<_> = (0..3 * MOST_QUEUED_STUCK)
            .map(|i| {
                let r = r.clone();
                std::thread::spawn(move || {
                    r.within(Duration::from_secs(10), move || {
                        std::thread::sleep(Duration::from_millis(2));
                        i
                    })
                })
            })
            .collect();
        for (i, c) in calls.into_iter().enumerate() {
            assert_eq!(c.join().unwrap(), Some(i));
        }
        assert_eq!(r.within(DEADLINE, || -> u8 { panic!("bug") }), None);
        assert_eq!(r.within(DEADLINE, || 4), Some(4));
    }
}
