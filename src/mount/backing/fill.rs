//! Filling backing files: from the reads of served opens, then on
//! threads of their own at the last close.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::{
    Activity, Backing, Backings, Content, Data, Fill, Holds, Origin, Partial, Queued, Segment,
    Slot, Stats, WRITE_FAILED, Written, charge_of, fill_over, lock, warn_once,
};

/// Bytes one filling worker reads through the data layer at once: one
/// frame as `pack --zstd` writes them, so a read is one cache unit's slice,
/// handed over without a copy.
const CHUNK: u64 = 1 << 20;

/// Longest a fill waits for a quiet mount before decoding its next piece
/// anyway (see [`Activity`]).
const FILL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// A file to fill: `len` bytes of `segments` into `file`, then `key`'s.
pub(super) struct Job {
    key: Content,
    /// Set when its file is given up for a spill: the fill stops, and
    /// neither publishes the file nor uncharges it again.
    pub(super) stop: Arc<AtomicBool>,
    /// Set when an open waits for it: its pieces no longer wait for a
    /// quiet mount (see [`write_all`]).
    wanted: Arc<AtomicBool>,
    /// Set when its thread takes it from the queue: until then it waits
    /// behind other fills, which an open cannot hurry.
    started: Arc<AtomicBool>,
    /// The exposed file whose reads asked for it (see [`Filled`](super::Filled)).
    asked_by: u64,
    pub(super) file: File,
    holds: Holds,
    pub(super) len: u64,
    data: Arc<Data>,
    segments: Vec<Segment>,
    /// What reads wrote already.
    skip: Written,
}

impl Job {
    /// The fill of `key` (asked for by exposed file `asked_by`): `len`
    /// bytes of `segments` into `file`, but for what `skip` says is there.
    fn new(
        key: &Content,
        asked_by: u64,
        (file, holds, len): (File, Holds, u64),
        data: &Arc<Data>,
        (segments, skip): (Vec<Segment>, Written),
    ) -> Job {
        Job {
            key: key.clone(),
            stop: Arc::default(),
            wanted: Arc::default(),
            started: Arc::default(),
            asked_by,
            file,
            holds,
            len,
            data: data.clone(),
            segments,
            skip,
        }
    }
}

/// Files to fill, on two threads: one for files whose served reads wrote
/// every byte (nothing left but publishing them, which an open may be
/// waiting for), one for the rest, which waits for a quiet mount before
/// each piece it decodes (see [`Activity`]) unless an open waits for it.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) whole: std::collections::VecDeque<Job>,
    pub(super) rest: std::collections::VecDeque<Job>,
    /// Whether a thread is working through each.
    pub(super) running: [bool; 2],
}

impl Queue {
    fn of(&mut self, whole: bool) -> &mut std::collections::VecDeque<Job> {
        if whole {
            &mut self.whole
        } else {
            &mut self.rest
        }
    }
}

/// One piece of work for a filling worker: bytes `[at, at+len)` of part
/// `(tensor, part)`, written at `to`.
struct Piece {
    tensor: usize,
    part: usize,
    at: u64,
    pub(super) len: u64,
    to: u64,
}

/// When a fill's pieces go, and whether it is to stop.
struct Pace<'a> {
    activity: &'a Activity,
    /// See [`Job::stop`].
    pub(super) stop: &'a AtomicBool,
    /// See [`Job::wanted`].
    wanted: &'a AtomicBool,
}

impl Pace<'_> {
    /// Waits until the mount is quiet, an open waits for the file, or
    /// [`FILL_PATIENCE`] has passed (a mount never quiet, a reader that
    /// never pauses, still gets its files, a piece now and then); whether
    /// to go on.
    fn go(&self) -> bool {
        let asked = std::time::Instant::now();
        self.activity.wait_quiet(|| {
            self.stop.load(Relaxed) || self.wanted.load(Relaxed) || asked.elapsed() >= FILL_PATIENCE
        });
        !self.stop.load(Relaxed)
    }
}

/// Writes `segments` into `file` (sized) in order, but for what `skip`
/// says is there; parts in [`CHUNK`]s taken by one worker per core, each
/// when `pace` says: what the reads did not write is decoded again, and a
/// load going on must not wait for that, unless it waits for the file.
/// The bytes of parts it wrote.
fn write_all(
    file: &File,
    len: u64,
    data: &Data,
    segments: &[Segment],
    skip: &Written,
    pace: &Pace<'_>,
) -> Result<u64, String> {
    let io = |e: std::io::Error| format!("cannot write a backing file: {e}");
    let mut pieces = Vec::new();
    let mut to = 0u64;
    for s in segments {
        match s {
            Segment::Bytes(b) => {
                file.write_all_at(b, to).map_err(io)?;
                to += b.len() as u64;
            }
            &Segment::Part { tensor, part, len } => {
                let mut at = 0;
                while at < len {
                    let n = CHUNK.min(len - at);
                    if skip.covers(to + at, to + at + n) {
                        at += n;
                        continue;
                    }
                    pieces.push(Piece {
                        tensor,
                        part,
                        at,
                        len: n,
                        to: to + at,
                    });
                    at += n;
                }
                to += len;
            }
        }
    }
    if to != len {
        return Err(format!("its pieces make {to} bytes, not {len}"));
    }
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<String>> = Mutex::new(None);
    // One write at a time: writes to one file take its inode lock, and a
    // worker waiting there spins on the other's write (a fifth of the
    // fill's CPU in a profile); waiting here it sleeps, and the other
    // workers go on decoding.
    let writing = Mutex::new(());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers.min(pieces.len()) {
            s.spawn(|| {
                while lock(&failed).is_none() {
                    let Some(p) = pieces.get(next.fetch_add(1, Relaxed)) else {
                        return;
                    };
                    if !pace.go() {
                        lock(&failed).get_or_insert_with(|| "given up".into());
                        return;
                    }
                    let r = data
                        .read(p.tensor, p.part, p.at, p.len)
                        .map_err(|e| e.to_string())
                        .and_then(|bytes| {
                            if bytes.len() as u64 != p.len {
                                return Err(format!(
                                    "read {} bytes of {} at {}",
                                    bytes.len(),
                                    p.len,
                                    p.at
                                ));
                            }
                            let _one = lock(&writing);
                            file.write_all_at(&bytes, p.to).map_err(io)
                        })
                        .map(|()| data.copied(p.tensor, p.part, (p.at, p.at + p.len)));
                    if let Err(why) = r {
                        lock(&failed).get_or_insert(why);
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(why) => Err(why),
        None => Ok(pieces.iter().map(|p| p.len).sum()),
    }
}

impl Backings {
    /// At a served open's read from the start of a file of content `key`
    /// (`len` bytes) whose bytes take work: a backing file its reads
    /// write through to (see [`Partial`]), made now unless one is there
    /// already, being made or filled, or has no room.
    pub fn begin(&self, key: &Content, len: u64) -> Option<Arc<Partial>> {
        if let Some(slot) = lock(&self.inner).slots.get(key) {
            return slot.being_written();
        }
        let file = self.reserve(key, len)?;
        let p = Arc::new(Partial::new(file, len, Written::default()));
        lock(&self.inner)
            .slots
            .insert(key.clone(), Slot::Writing(p.clone()));
        Some(p)
    }

    /// At the last close of the served files of content `key` (`len`
    /// bytes, made of `segments`): completes, keeps or drops the backing
    /// file their reads wrote, as `fill` says (a peek at a large tensor
    /// keeps no disk).
    pub fn close(
        self: &Arc<Self>,
        key: &Content,
        asked_by: u64,
        len: u64,
        fill: Fill,
        data: &Arc<Data>,
        segments: Vec<Segment>,
    ) {
        // Taken from `Writing` under the lock, so that a close racing this
        // one (the next open's, while this one waits in `seal`) finds it
        // taken and leaves it: the file is kept or forgotten once.
        let partial = {
            let mut inner = lock(&self.inner);
            match inner.slots.get(key) {
                Some(Slot::Writing(p)) => {
                    let p = p.clone();
                    inner
                        .slots
                        .insert(key.clone(), Slot::Filling(Some(p.clone())));
                    // An open waiting for the close to hand it over.
                    self.published.notify_all();
                    Some(p)
                }
                Some(_) => return,
                None => None,
            }
        };
        let (file, skip) = match partial {
            Some(p) => {
                let written = p.seal();
                let file = p.file.try_clone();
                let keep = match fill {
                    Fill::Rest => true,
                    Fill::IfWhole => written.covers(0, len),
                    Fill::Drop => false,
                };
                match (keep && !written.failed, file) {
                    (true, Ok(file)) => (file, written),
                    _ => return self.forget(key, len),
                }
            }
            None if fill == Fill::Rest => match self.reserve(key, len) {
                Some(file) => (file, Written::default()),
                None => return,
            },
            None => return,
        };
        let whole = skip.covers(0, len);
        let job = Job::new(key, asked_by, (file, None, len), data, (segments, skip));
        self.queue(job, whole);
    }

    /// Makes `file`, which holds every byte of files of content `key`
    /// already (the unit or spill their tensor was decoded into, checked;
    /// nobody writes it any more), their backing, keeping `holds` (its
    /// owner) while it is: as a file whose reads wrote all of it,
    /// published by the filler's thread, which writes nothing and has the
    /// kernel drop the page cache of inode `asked_by` first. False when
    /// another file is being filled or ready for `key`, or there is no
    /// room.
    pub fn adopt(
        self: &Arc<Self>,
        key: &Content,
        asked_by: u64,
        (file, holds, len): (File, Holds, u64),
        data: &Arc<Data>,
        segments: Vec<Segment>,
    ) -> bool {
        let Ok(read_back) = file.try_clone() else {
            return false;
        };
        let mut skip = Written::default();
        skip.add(0, len);
        skip.sealed = true;
        let p = Arc::new(Partial::new(read_back, len, skip.clone()));
        {
            let mut inner = lock(&self.inner);
            // A file the reads wrote through to has its room counted
            // already; what they wrote is not needed.
            let writing = match inner.slots.get(key) {
                Some(Slot::Writing(_)) => true,
                None => false,
                Some(_) => return false,
            };
            let charge = charge_of(len, &holds);
            if writing {
                self.uncharge(&mut inner, len - charge);
            } else {
                if !self.make_room(&mut inner, charge) {
                    return false;
                }
                inner.filled += charge;
            }
            inner.slots.insert(key.clone(), Slot::Filling(Some(p)));
        }
        Stats::add(&self.stats.backing_decoded, 1);
        let job = Job::new(key, asked_by, (file, holds, len), data, (segments, skip));
        self.queue(job, true);
        true
    }

    /// Queues `job`, on the thread for files with nothing left to write
    /// when it is `whole` (an open may be waiting for it).
    fn queue(self: &Arc<Self>, job: Job, whole: bool) {
        let (key, charge) = (job.key.clone(), charge_of(job.len, &job.holds));
        if charge > 0 {
            let queued = Queued {
                stop: job.stop.clone(),
                wanted: job.wanted.clone(),
                started: job.started.clone(),
                len: job.len,
                charge,
            };
            lock(&self.inner).fills.insert(key.clone(), queued);
            // An open waiting for the file marks its fill wanted.
            self.published.notify_all();
        }
        let mut queue = lock(&self.queue);
        queue.of(whole).push_back(job);
        if !queue.running[whole as usize] {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name(
                    if whole {
                        "zt-backing-whole"
                    } else {
                        "zt-backing"
                    }
                    .into(),
                )
                .spawn(move || me.run_queue(whole));
            match spawned {
                Ok(_) => queue.running[whole as usize] = true,
                Err(e) => {
                    log::warn!("cannot start a backing file's filler: {e}");
                    // No thread was running, so the queue held only this job.
                    let stop = queue.of(whole).pop_front().map(|j| j.stop);
                    drop(queue);
                    if !stop.is_some_and(|s| self.given_up(&key, &s)) {
                        self.forget(&key, charge);
                    }
                }
            }
        }
    }

    /// Fills queued files one after another (each on every core), until
    /// none is left: a model's first load opens hundreds of tensors at
    /// once, and filling them all at once would only fight over the cache.
    fn run_queue(&self, whole: bool) {
        loop {
            let job = {
                let mut queue = lock(&self.queue);
                match queue.of(whole).pop_front() {
                    Some(j) => {
                        j.started.store(true, Relaxed);
                        j
                    }
                    None => {
                        queue.running[whole as usize] = false;
                        return;
                    }
                }
            };
            // A fill that panics leaves its file to the daemon and the
            // queue running: the files behind it still get filled.
            let (key, charge) = (job.key.clone(), charge_of(job.len, &job.holds));
            let (asked_by, stop) = (job.asked_by, job.stop.clone());
            let fill = std::panic::AssertUnwindSafe(|| self.fill(job));
            if std::panic::catch_unwind(fill).is_err() && !self.given_up(&key, &stop) {
                log::error!(
                    "filling the backing file of {} failed (a panic): it stays served by the daemon",
                    self.name(asked_by)
                );
                self.forget(&key, charge);
            }
        }
    }

    /// Fills the job's file with the bytes of its segments, on every core,
    /// and makes it its key's backing once all are there. Reads go through
    /// the data layer, so nothing is written that failed a check; a failure
    /// (logged by the data layer) leaves the key unbacked, to be tried again
    /// by a later open. The hook hears of the file before opens can take it,
    /// so the page cache it drops is gone by the first passthrough open.
    fn fill(&self, job: Job) {
        let Job {
            key,
            stop,
            wanted,
            started: _,
            asked_by,
            file,
            holds,
            len,
            data,
            segments,
            skip,
        } = job;
        let t0 = std::time::Instant::now();
        let pace = Pace {
            activity: &self.activity,
            stop: &stop,
            wanted: &wanted,
        };
        let wrote = match write_all(&file, len, &data, &segments, &skip, &pace) {
            Ok(n) => n,
            Err(_) if self.given_up(&key, &stop) => {
                log::debug!("{}: its backing file's fill stopped", self.name(asked_by));
                return;
            }
            Err(why) => {
                warn_once(
                    &WRITE_FAILED,
                    format_args!(
                        "{} stays served by the daemon: its backing file: {why}",
                        self.name(asked_by)
                    ),
                );
                self.forget(&key, charge_of(len, &holds));
                return;
            }
        };
        // All its bytes are in the file now: what the reads and the fill
        // left of them in the daemon's memory goes (see `Data::copied_all`).
        data.copied_all(segments.iter().filter_map(|s| match *s {
            Segment::Part { tensor, part, len } => Some((tensor, part, (0, len))),
            Segment::Bytes(_) => None,
        }));
        let t1 = std::time::Instant::now();
        self.drop_inode_cache(asked_by);
        log::debug!(
            "{}: backing file of {len} bytes: {wrote} written by the filler in {:?}, \
             the inode's page cache dropped in {:?}",
            self.name(asked_by),
            t1 - t0,
            t1.elapsed()
        );
        self.publish(key, file, holds, len, &stop);
    }

    /// The fill of `key` that `stop` tells is over: whether its file was
    /// given up meanwhile, which leaves it neither to publish nor to
    /// uncharge (see [`Self::give_up_writing`]).
    fn given_up(&self, key: &Content, stop: &Arc<AtomicBool>) -> bool {
        fill_over(&mut lock(&self.inner), key, stop);
        stop.load(Relaxed)
    }

    /// Makes `file`, complete, the backing of files of content `key`,
    /// unless its fill was told to `stop`.
    pub(super) fn publish(
        &self,
        key: Content,
        file: File,
        holds: Holds,
        len: u64,
        stop: &Arc<AtomicBool>,
    ) {
        let mut inner = lock(&self.inner);
        fill_over(&mut inner, &key, stop);
        if stop.load(Relaxed) {
            return;
        }
        Stats::add(&self.stats.backing_files, 1);
        Stats::add(&self.stats.backing_bytes, len);
        let b = Arc::new(Backing::new(
            file,
            holds,
            len,
            Origin::Filled,
            self.clock.fetch_add(1, Relaxed),
        ));
        inner.slots.insert(key, Slot::Ready(b));
        drop(inner);
        self.published.notify_all();
    }
}
