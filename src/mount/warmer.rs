//! Makes clones of raw tensors' ranges and reads their pages in while the
//! mount is idle.
//!
//! A clone of a raw tensor's range (`FICLONERANGE`) shares the source's
//! disk blocks, not its page cache: a read of a fresh clone is a read of
//! the disk, even while the source's own pages are all cached. So a tensor
//! is served by the daemon, from the source, until its clone's pages are
//! cached, and this makes the clone and reads its pages in: on one thread,
//! at the idle priorities of the CPU and the disk, and only while no open
//! is being read, by the daemon or by the kernel from a backing file. A
//! load that ran meanwhile shared the disk, the memory and the CPU with
//! it: a first load of a model took 1.1-1.3 s instead of 0.6-0.7 s with
//! its clones read in beside it (BENCHMARKS.md, "Raw tensors backed by
//! clones"). Cloning takes the source's inode locks, which a read of its
//! uncached pages waits for: another reason to wait.

use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::backing::Backing;
use super::lock;
use super::tree::Content;

/// Bytes read in at a time: the thread looks again between steps whether
/// an open is being read.
const STEP: u64 = 8 << 20;

/// Bytes of the buffer the pages are read into (see [`Backing::read_in`]).
const BUF: usize = 1 << 20;

/// One clone to make and read in.
pub struct CloneJob {
    /// The files it backs: one job per content at a time (a close while it
    /// is queued or under way queues nothing more).
    pub key: Content,
    /// Its length.
    pub len: u64,
    /// Makes the clone, checked, or says why not (`None`).
    pub make: Box<dyn FnOnce() -> Option<Arc<Backing>> + Send>,
    /// Told whether every page of the clone was in the page cache once
    /// its pages were read in.
    pub done: Box<dyn FnOnce(bool) + Send>,
}

#[derive(Default)]
pub struct Warmer {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    /// Notified when a job is queued or nothing is being read.
    wake: Condvar,
    /// Jobs queued or under way.
    pending: AtomicU64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<CloneJob>,
    /// The keys of the jobs queued or under way.
    keys: HashSet<Content>,
    /// Inodes with an open the daemon serves.
    served: usize,
    /// Opens the kernel serves from a backing file.
    backed: usize,
    started: bool,
}

impl State {
    fn busy(&self) -> bool {
        self.served > 0 || self.backed > 0
    }
}

impl Warmer {
    /// Queues a clone to be made and read in once nothing is being read.
    pub fn queue(&self, job: CloneJob) {
        let mut st = lock(&self.inner.state);
        if !st.started {
            let inner = self.inner.clone();
            match std::thread::Builder::new()
                .name("zt-warm-clones".into())
                .spawn(move || inner.run())
            {
                Ok(_) => st.started = true,
                Err(e) => {
                    log::warn!("cannot start the thread that reads clones in ({e}): none made");
                    return;
                }
            }
        }
        if !st.keys.insert(job.key.clone()) {
            return;
        }
        st.queue.push_back(job);
        self.inner.pending.fetch_add(1, Relaxed);
        self.inner.wake.notify_all();
    }

    /// The daemon serves opens of `n` inodes now.
    pub fn served(&self, n: usize) {
        let mut st = lock(&self.inner.state);
        st.served = n;
        self.notify_if_idle(st);
    }

    /// An open the kernel serves from a backing file was made (`true`) or
    /// closed.
    pub fn backed(&self, opened: bool) {
        let mut st = lock(&self.inner.state);
        if opened {
            st.backed += 1;
        } else {
            st.backed = st.backed.saturating_sub(1);
        }
        self.notify_if_idle(st);
    }

    fn notify_if_idle(&self, st: MutexGuard<'_, State>) {
        if !st.busy() {
            self.inner.wake.notify_all();
        }
    }

    /// Clones queued or being made and read in.
    pub fn pending(&self) -> u64 {
        self.inner.pending.load(Relaxed)
    }
}

impl Inner {
    fn run(&self) {
        super::priority::idle();
        let mut buf = vec![0u8; BUF];
        loop {
            let job = self.next();
            let key = job.key.clone();
            if !fits(job.len) {
                log::debug!(
                    "a clone of {} bytes is not made: its pages would take more than half \
                     of the memory available",
                    job.len
                );
            } else {
                // A job that panics is dropped, and the warmer goes on.
                let warm = std::panic::AssertUnwindSafe(|| {
                    if let Some(b) = (job.make)() {
                        let all = self.read_in(&b, &mut buf);
                        (job.done)(all);
                    }
                });
                if std::panic::catch_unwind(warm).is_err() {
                    log::error!("making a clone failed (a panic): its tensor stays the daemon's");
                }
            }
            lock(&self.state).keys.remove(&key);
            self.pending.fetch_sub(1, Relaxed);
        }
    }

    /// Reads `b`'s pages in, a step at a time while nothing else is read:
    /// whether all of them were in the page cache at the end.
    fn read_in(&self, b: &Backing, buf: &mut [u8]) -> bool {
        let mut at = 0;
        while at < b.len() {
            drop(self.idle());
            let n = STEP.min(b.len() - at);
            if let Err(e) = b.read_in(at, n, buf) {
                log::info!("reading a clone in failed ({e}): its tensor stays the daemon's");
                return false;
            }
            at += n;
        }
        b.resident()
    }

    /// The next job, once nothing is being read.
    fn next(&self) -> CloneJob {
        let mut st = self.idle();
        loop {
            if let Some(job) = st.queue.pop_front() {
                return job;
            }
            st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            st = self.wait_idle(st);
        }
    }

    fn idle(&self) -> MutexGuard<'_, State> {
        self.wait_idle(lock(&self.state))
    }

    fn wait_idle<'a>(&self, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.wake
            .wait_while(st, |s| s.busy())
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether a clone of `len` bytes may be read in: its pages are a second
/// copy of bytes the source's page cache likely holds, so a clone over half
/// of the memory the kernel can give (`MemAvailable`, or less where the
/// daemon's memory cgroup allows less) would push out the source's pages
/// or its own, and be dropped again, not read in whole. True where the
/// kernel does not say.
fn fits(len: u64) -> bool {
    let avail = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_room(Path::new("/sys/fs/cgroup"), &t));
    let room = match (avail, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    };
    room.is_none_or(|m| len <= m / 2)
}

/// The least room that the memory cgroups of the process (`cgroup`, the
/// text of /proc/self/cgroup; v2, or v1's memory controller) and their
/// ancestors leave under their limits, mounted under `root`: a limit less
/// what is charged to it, its page cache counted as room (the kernel
/// reclaims it first, as `MemAvailable` counts it). None without a limit.
fn cgroup_room(root: &Path, cgroup: &str) -> Option<u64> {
    let (dir, v1) = cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, ctl, path) = (f.next()?, f.next()?, f.next()?);
        let path = path.trim_start_matches('/');
        if ctl.split(',').any(|c| c == "memory") {
            Some((root.join("memory").join(path), true))
        } else if id == "0" && ctl.is_empty() {
            Some((root.join(path), false))
        } else {
            None
        }
    })?;
    let files = match v1 {
        true => ("memory.limit_in_bytes", "memory.usage_in_bytes", "cache"),
        false => ("memory.max", "memory.current", "file"),
    };
    dir.ancestors()
        .take_while(|d| d.starts_with(root))
        .filter_map(|d| room_in(d, files))
        .min()
}

/// Room left under the limit of the cgroup at `dir`, from its files
/// `(limit, usage, page cache field of memory.stat)`; None without one.
fn room_in(dir: &Path, (limit, usage, cache): (&str, &str, &str)) -> Option<u64> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    // v1 writes "no limit" as a number near 2^63.
    let limit: u64 = read(limit)?.trim().parse().ok().filter(|&l| l < 1 << 62)?;
    let usage: u64 = read(usage)?.trim().parse().ok()?;
    let stat = read("memory.stat").unwrap_or_default();
    let cached: u64 = stat
        .lines()
        .find_map(|l| {
            l.strip_prefix(cache)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(cached)))
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_from_meminfo_in_bytes() {
        let text = "MemTotal:       24683520 kB\nMemFree:        20038412 kB\n\
                    MemAvailable:   24113640 kB\nBuffers:           20544 kB\n";
        assert_eq!(mem_available(text), Some(24113640 * 1024));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
    }

    #[test]
    fn the_room_a_memory_cgroup_leaves_is_the_least_of_its_and_its_ancestors() {
        let root = tempfile::tempdir().unwrap();
        let write = |dir: &Path, files: &[(&str, &str)]| {
            std::fs::create_dir_all(dir).unwrap();
            for (n, t) in files {
                std::fs::write(dir.join(n), t).unwrap();
            }
        };
        // v2: a limit of 8 GiB with 3 used, 2 of them page cache: 7 GiB
        // of room; its parent's 6 GiB limit with 1 used leaves 5.
        let g = root.path().join("a/b");
        write(
            &g,
            &[
                ("memory.max", "8589934592\n"),
                ("memory.current", "3221225472\n"),
                ("memory.stat", "anon 1073741824\nfile 2147483648\n"),
            ],
        );
        let v2 = "0::/a/b\n";
        assert_eq!(cgroup_room(root.path(), v2), Some(7 << 30));
        write(
            &root.path().join("a"),
            &[
                ("memory.max", "6442450944\n"),
                ("memory.current", "1073741824\n"),
            ],
        );
        assert_eq!(cgroup_room(root.path(), v2), Some(5 << 30));
        // No limit ("max"): no answer.
        write(&g, &[("memory.max", "max\n")]);
        std::fs::write(root.path().join("a/memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_room(root.path(), v2), None);
        // v1's memory controller, and its "no limit" number.
        let m = root.path().join("memory/p");
        write(
            &m,
            &[
                ("memory.limit_in_bytes", "4294967296\n"),
                ("memory.usage_in_bytes", "3221225472\n"),
                ("memory.stat", "cache 1073741824\nrss 2147483648\n"),
            ],
        );
        let v1 = "9:pids:/\n4:memory:/p\n0::/\n";
        assert_eq!(cgroup_room(root.path(), v1), Some(2 << 30));
        std::fs::write(m.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_room(root.path(), v1), None);
    }

    #[test]
    fn a_content_queued_again_while_its_job_waits_queues_nothing_more() {
        let w = Warmer::default();
        w.served(1); // busy: the jobs wait
        let job = |tensor| CloneJob {
            key: Content::Part { tensor, part: 0 },
            len: 1,
            make: Box::new(|| None),
            done: Box::new(|_| ()),
        };
        w.queue(job(0));
        w.queue(job(0));
        w.queue(job(1));
        assert_eq!(w.pending(), 2);
        w.served(0);
        let drained = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            w.pending() == 0
        });
        assert!(drained, "{} jobs left", w.pending());
        // Done with, a content may be queued again.
        w.served(1);
        w.queue(job(0));
        assert_eq!(w.pending(), 1);
    }
}
