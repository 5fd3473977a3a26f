//! Threads for reads that would wait for a decode another thread runs, so
//! that they do not wait on the FUSE workers: a decode that stalls (its
//! `--cache-dir` frozen for a snapshot, a disk that hangs) then holds the
//! readers of its tensor, while listings, stats and reads of other files
//! are still answered. Threads start as such reads come, at most `max` at
//! once, and end after [`IDLE`] without one; past `max` a read waits on
//! its worker, as any other.
//!
//! Written here rather than taken from a pool crate: all it needs is a
//! queue, a count of idle threads and a cap, and a job that cannot be
//! handed off must come back to the caller (its reply still unsent).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::lock;

/// How long a thread with nothing to do stays.
const IDLE: Duration = Duration::from_secs(10);

pub type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Threads waiting for a job.
    idle: usize,
    threads: usize,
}

pub struct Waiting {
    state: Mutex<State>,
    cond: Condvar,
    max: usize,
}

impl Waiting {
    pub fn new(max: usize) -> Arc<Waiting> {
        Arc::new(Waiting {
            state: Mutex::default(),
            cond: Condvar::new(),
            max,
        })
    }

    /// Runs `job` on a thread of its own; gives it back when `max` threads
    /// are busy already or none could start.
    pub fn hand_off(self: &Arc<Self>, job: Job) -> Result<(), Job> {
        let mut s = lock(&self.state);
        // An idle thread for each job queued, and one for this.
        if s.idle > s.queue.len() {
            s.queue.push_back(job);
            self.cond.notify_one();
            return Ok(());
        }
        if s.threads >= self.max {
            return Err(job);
        }
        s.threads += 1;
        drop(s);
        // The job goes in with the thread, so that a thread that cannot
        // start gives it back, not some other job.
        let first = Arc::new(Mutex::new(Some(job)));
        let (me, mine) = (self.clone(), first.clone());
        let spawned = std::thread::Builder::new()
            .name("zt-wait".into())
            .spawn(move || {
                if let Some(job) = lock(&mine).take() {
                    run(job);
                }
                me.serve();
            });
        match spawned {
            Ok(_) => Ok(()),
            Err(e) => {
                log::debug!("no thread for a read that waits: {e}");
                lock(&self.state).threads -= 1;
                lock(&first).take().map_or(Ok(()), Err)
            }
        }
    }

    /// Runs queued jobs until none has come for [`IDLE`].
    fn serve(&self) {
        let mut s = lock(&self.state);
        loop {
            if let Some(job) = s.queue.pop_front() {
                drop(s);
                run(job);
                s = lock(&self.state);
                continue;
            }
            s.idle += 1;
            let (g, waited) = self
                .cond
                .wait_timeout(s, IDLE)
                .unwrap_or_else(|e| e.into_inner());
            s = g;
            s.idle -= 1;
            if waited.timed_out() && s.queue.is_empty() {
                s.threads -= 1;
                return;
            }
        }
    }

    #[cfg(test)]
    fn threads(&self) -> usize {
        lock(&self.state).threads
    }
}

/// A job whose panic ends the job, not its thread (the thread's count
/// would be wrong).
fn run(job: Job) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
        log::error!("a read answered off the FUSE workers panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn jobs_past_the_cap_come_back_and_the_others_run_side_by_side() {
        let w = Waiting::new(2);
        let release = Arc::new(Mutex::new(()));
        let gate = release.lock().unwrap();
        let (tx, rx) = mpsc::channel();
        for _ in 0..2 {
            let (release, tx) = (release.clone(), tx.clone());
            let job: Job = Box::new(move || {
                tx.send(()).unwrap();
                drop(release.lock().unwrap());
            });
            assert!(w.hand_off(job).is_ok());
        }
        // Both run at once: each has started while the other still waits.
        for _ in 0..2 {
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        let back = w.hand_off(Box::new(|| {}));
        assert!(back.is_err(), "a third job past a cap of two");
        drop(gate);
        // Freed, a thread takes the next job without a new one.
        runs_once_a_thread_is_free(&w);
        assert!(w.threads() <= 2);
    }

    /// Hands off a job as soon as a thread takes it, and waits for it to run.
    fn runs_once_a_thread_is_free(w: &Arc<Waiting>) {
        let (tx, rx) = mpsc::channel();
        let t = std::time::Instant::now();
        loop {
            let tx = tx.clone();
            if w.hand_off(Box::new(move || tx.send(()).unwrap())).is_ok() {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10));
            std::thread::yield_now();
        }
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn a_job_that_panics_leaves_its_thread_serving() {
        let w = Waiting::new(1);
        assert!(w.hand_off(Box::new(|| panic!("in a test"))).is_ok());
        runs_once_a_thread_is_free(&w);
        assert_eq!(w.threads(), 1);
    }
}
