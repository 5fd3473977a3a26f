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
//! nothing is left). While calls wait behind one that does not end, new
//! ones are not queued but given up at once: the queue stays small
//! however long the disk takes.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Longest a worker waits for a call on `--cache-dir`.
pub const DEADLINE: Duration = Duration::from_millis(200);

/// Calls queued or running at most: past it the thread is stuck, and a
/// new call is given up without being queued.
const MOST_QUEUED: usize = 8;

type Call = Box<dyn FnOnce() + Send>;

/// Calls sent and not yet ended.
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// The thread's queue, made at the first call.
static CALLS: OnceLock<Option<Mutex<Sender<Call>>>> = OnceLock::new();

fn calls() -> Option<&'static Mutex<Sender<Call>>> {
    CALLS
        .get_or_init(|| {
            let (tx, rx) = channel::<Call>();
            std::thread::Builder::new()
                .name("zt-cache-dir".into())
                .spawn(move || run(rx))
                .map_err(|e| log::warn!("cannot start the cache directory's thread: {e}"))
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

fn run(rx: Receiver<Call>) {
    while let Ok(call) = rx.recv() {
        call();
        QUEUED.fetch_sub(1, Relaxed);
    }
}

/// `f()`, run on the cache directory's thread, if it ends within
/// [`DEADLINE`]; else `None`, and what it returns later is dropped. Run
/// here when that thread cannot be started.
pub fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    within_for(DEADLINE, f)
}

fn within_for<T: Send + 'static>(
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let Some(calls) = calls() else {
        return Some(f());
    };
    if QUEUED.fetch_add(1, Relaxed) >= MOST_QUEUED {
        QUEUED.fetch_sub(1, Relaxed);
        return None;
    }
    let (tx, rx) = channel();
    let call: Call = Box::new(move || {
        // A receiver gone (past its deadline) drops the value here.
        let _ = tx.send(f());
    });
    if crate::serve::lock(calls).send(call).is_err() {
        QUEUED.fetch_sub(1, Relaxed);
        return None;
    }
    rx.recv_timeout(deadline).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    #[test]
    fn a_call_past_its_deadline_is_given_up_and_the_next_ones_still_run() {
        assert_eq!(within(|| 7), Some(7));
        let (gate, open) = (Arc::new(Mutex::new(())), Arc::new(AtomicBool::new(false)));
        let held = crate::serve::lock(&gate);
        let (g, o) = (gate.clone(), open.clone());
        // A call that waits on a "disk" that does not answer.
        let stuck = within_for(Duration::from_millis(50), move || {
            drop(crate::serve::lock(&g));
            o.store(true, SeqCst);
            1
        });
        assert_eq!(stuck, None);
        // Queued behind it: given up too, while the disk is stuck; and
        // past a few, not even queued.
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 * MOST_QUEUED {
            let ran = ran.clone();
            let call = move || ran.fetch_add(1, SeqCst);
            assert_eq!(within_for(Duration::from_millis(5), call), None);
            assert!(QUEUED.load(SeqCst) <= MOST_QUEUED);
        }
        drop(held);
        assert_eq!(within(|| 3), Some(3));
        assert!(open.load(SeqCst));
        let ran = ran.load(SeqCst);
        assert!(ran < MOST_QUEUED, "{ran} calls queued behind the stuck one");
    }
}
