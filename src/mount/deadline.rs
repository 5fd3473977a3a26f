//! Runs calls on `--cache-dir` for the FUSE workers on a thread of its
//! own, waiting for each at most a deadline.
//!
//! A worker that waits on a disk that does not answer (a filesystem
//! frozen by `fsfreeze` for a snapshot, a hung network disk) is one fewer
//! to serve the mount, and once they all wait every request to it does:
//! opens of other files, `ls`, `.ztensor/stats`. What a worker asks of
//! `--cache-dir` is optional (a backing file to write a tensor's reads
//! into), so past the deadline it goes on without it. The call goes on
//! on this thread; when it ends, what it made is dropped (an unlinked
//! file: nothing is left).

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Longest a worker waits for a call on `--cache-dir`.
pub const DEADLINE: Duration = Duration::from_millis(200);

type Call = Box<dyn FnOnce() + Send>;

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
    let (tx, rx) = channel();
    let call: Call = Box::new(move || {
        // A receiver gone (past its deadline) drops the value here.
        let _ = tx.send(f());
    });
    crate::serve::lock(calls).send(call).ok()?;
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
        // Queued behind it: given up too, while the disk is stuck.
        assert_eq!(within_for(Duration::from_millis(50), || 2), None);
        drop(held);
        assert_eq!(within(|| 3), Some(3));
        assert!(open.load(SeqCst));
    }
}
