//! A few background threads that decode the next zstd frames while a
//! sequential reader is still busy with this one, so decoding runs on every
//! core. Best effort: when the queue is full a hint is dropped.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

pub type Job = Box<dyn FnOnce() + Send>;

pub struct Prefetcher {
    tx: Option<SyncSender<Job>>,
}

impl Prefetcher {
    /// `workers` threads; 0 disables prefetching.
    pub fn new(workers: usize) -> Prefetcher {
        if workers == 0 {
            return Prefetcher { tx: None };
        }
        let (tx, rx) = sync_channel::<Job>(workers * 4);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..workers {
            let rx: Arc<Mutex<Receiver<Job>>> = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("zt-prefetch-{i}"))
                .spawn(move || {
                    loop {
                        // The lock is held only to take a job, not to run it.
                        let job = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            // Every sender is gone: the data layer was dropped.
                            Err(_) => return,
                        }
                    }
                });
            if spawned.is_err() {
                log::warn!("cannot start prefetch thread {i}; continuing with fewer");
            }
        }
        Prefetcher { tx: Some(tx) }
    }

    /// Queues `job` unless the queue is full. True if queued.
    pub fn submit(&self, job: Job) -> bool {
        match &self.tx {
            Some(tx) => !matches!(
                tx.try_send(job),
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_))
            ),
            None => false,
        }
    }
}
