//! Protection against a file changing under the mount.
//!
//! The mount serves the files it opened (one, or a model's shards). If one
//! is truncated or written
//! in place, pages of the mmap can vanish (touching them raises SIGBUS) or
//! hold bytes the index never promised. Every access checks the file's size,
//! mtime and ctime against those seen at mount, and what the kernel said of
//! writes to it since (see [`super::inotify`]), and a SIGBUS inside the mapping is
//! absorbed by mapping a zero page there; the access that hit it then fails
//! the check and returns EIO instead of the zeros.
//!
//! The handler is [`crate::sigbus`]'s, which also watches the writable
//! mappings of our own spill files ([`Watched`]): a page of one that
//! fails to come in is blanked and the spill's writer told, instead of
//! the daemon dying.

use super::error::ReadError;
pub use crate::sigbus::Watched;
use crate::sigbus::{FileWatch, MAX_FILES};
use crate::source::FetchKind;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, OnceLock};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    /// No call sets it back (utimensat can restore an mtime, not this).
    ctime: (i64, i64),
    nlink: u64,
}

impl From<&std::fs::Metadata> for Stamp {
    fn from(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            nlink: m.nlink(),
        }
    }
}

impl Stamp {
    /// Whether the bytes may differ from `orig`'s (the stamp at mount),
    /// `last` being the stamp of the last check that found them unchanged.
    /// A write moves the mtime and the ctime; restoring the mtime
    /// afterwards moves the ctime again. Deleting the file, renaming
    /// another over it or linking it moves the ctime too, but changes no
    /// byte: a ctime change that comes with another link count than at
    /// the last check is taken for that, and only that one (the link
    /// count at mount would excuse every later ctime change).
    /// With the kernel's notice of the file (see [`super::inotify`]), a
    /// write is seen whatever the times say, and a ctime change that came
    /// with a rename is the rename's.
    fn changed_from(&self, orig: &Stamp, last: &Stamp, notice: Noticed) -> bool {
        self.len != orig.len
            || self.mtime != orig.mtime
            || notice.written
            || (self.ctime != last.ctime && self.nlink == last.nlink && !notice.moved)
    }
}

/// What the kernel said of the file since the last check (nothing where
/// it is not watched).
#[derive(Debug, Clone, Copy, Default)]
struct Noticed {
    written: bool,
    moved: bool,
}

fn stamp(f: &File) -> std::io::Result<Stamp> {
    Ok(Stamp::from(&f.metadata()?))
}

pub struct Guard {
    label: String,
    file: File,
    orig: Stamp,
    /// The stamp at the last check that found the file unchanged (see
    /// [`Stamp::changed_from`]); held while the file is stat'ed, so that
    /// no older stamp replaces a newer one.
    last: Mutex<Stamp>,
    /// Why the file is no longer served, and whether because it changed
    /// (rather than a disk error, or a stat that failed).
    broken: OnceLock<(String, bool)>,
    /// The watch of its mapping, if a slot was free.
    watch: Option<FileWatch>,
    /// For a remote object's cache file (written as blocks arrive, so its
    /// size and time say nothing): the object, which knows when it changed.
    remote: Option<std::sync::Arc<dyn crate::source::Backing>>,
    /// The kernel's watch of the file for writes and renames, if it could
    /// be added (see [`super::inotify`]).
    notice: Option<std::sync::Arc<super::inotify::Notice>>,
}

impl Guard {
    /// Watches `file` (a handle on the mounted file's inode: a dup of the
    /// one that was mapped, not a new open by path, which a rename could have
    /// pointed elsewhere) and the mapping `[base, base+len)` of it. `opened`
    /// is the metadata taken before the file was mapped and its index read:
    /// a write in between already counts as a change.
    pub fn new(
        label: &str,
        file: File,
        opened: &std::fs::Metadata,
        base: *const u8,
        len: usize,
    ) -> Guard {
        let watch = FileWatch::new(base, len);
        if watch.is_none() {
            log::warn!(
                "{label}: more than {MAX_FILES} files mapped at once: a page of this one that \
                 cannot be read will end the daemon instead of failing its reads"
            );
        }
        Guard {
            label: label.to_string(),
            file,
            orig: Stamp::from(opened),
            last: Mutex::new(Stamp::from(opened)),
            broken: OnceLock::new(),
            watch,
            remote: None,
            notice: None,
        }
    }

    /// Has the kernel tell it of writes to and renames of a local file
    /// (see [`super::inotify`]); a remote object's cache file, which the
    /// mount writes itself, is not watched.
    pub fn watched(mut self) -> Guard {
        self.notice = super::inotify::watch(&self.file);
        self
    }

    /// Watches a remote object's cache file: the object says when it
    /// changed (the file's own stamp changes with every block fetched).
    pub fn remote(mut self, backing: std::sync::Arc<dyn crate::source::Backing>) -> Guard {
        self.remote = Some(backing);
        self
    }

    /// Whether [`Guard::check`] found the file changed since mount: its
    /// size or times moved, or the remote object is another.
    pub fn changed(&self) -> bool {
        self.broken.get().is_some_and(|&(_, changed)| changed)
    }

    /// [`Guard::check`] as a read's error: `ESTALE` once the file changed.
    pub fn verdict(&self) -> Result<(), ReadError> {
        self.check()
            .map_err(|why| ReadError::from_guard(self.changed(), why))
    }

    /// Ok while the file is as it was at mount. Once it changed, stays failed.
    pub fn check(&self) -> Result<(), String> {
        if let Some((why, _)) = self.broken.get() {
            return Err(why.clone());
        }
        let Some(r) = &self.remote else {
            return self.check_stamp();
        };
        if let Some(broken) = r.broken() {
            // The object logged it.
            let changed = broken.kind == FetchKind::Changed;
            let why = String::from(broken);
            return Err(self.broken.get_or_init(|| (why, changed)).0.clone());
        }
        // Its times move with every block fetched; its size, set at open,
        // never does: another program cut or grew it, and what the mapping
        // shows of it can no longer be told.
        if let Ok(now) = stamp(&self.file)
            && now.len != self.orig.len
        {
            let why = format!(
                "{}: its cache file changed size since mount ({} -> {} bytes), by another \
                 program; refusing to serve its bytes until it is mounted again",
                self.label, self.orig.len, now.len
            );
            return Err(self.fail(why, false));
        }
        self.verdict_on(Ok((self.orig, false)))
    }

    /// [`Guard::check`] of a local file: its stamp now against the one
    /// at mount and the one at the last check that passed.
    fn check_stamp(&self) -> Result<(), String> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let noticed = match &self.notice {
            Some(n) => {
                super::inotify::drain();
                Noticed {
                    written: n.modified(),
                    moved: n.take_moved(),
                }
            }
            None => Noticed::default(),
        };
        let now = stamp(&self.file).map(|now| {
            let changed = now.changed_from(&self.orig, &last, noticed);
            if !changed {
                *last = now;
            }
            (now, changed)
        });
        drop(last);
        self.verdict_on(now)
    }

    /// The check's answer for the stamp found now, and whether it shows a
    /// change of the bytes.
    fn verdict_on(&self, now: std::io::Result<(Stamp, bool)>) -> Result<(), String> {
        let (why, changed) = match now {
            Err(e) => (
                format!("{}: cannot stat the mounted file: {e}", self.label),
                false,
            ),
            Ok((now, _)) if now.len != self.orig.len => (
                format!(
                    "{}: file changed since mount (size {} -> {} bytes); refusing to serve its \
                     bytes",
                    self.label, self.orig.len, now.len
                ),
                true,
            ),
            Ok((_, true)) => (
                format!(
                    "{}: file was modified since mount; refusing to serve its bytes",
                    self.label
                ),
                true,
            ),
            // The faulted page now reads as zeros, so nothing is served
            // from here on, whatever the cause.
            Ok(_) if self.watch.as_ref().is_some_and(|w| w.hits() > 0) => (
                format!(
                    "{}: reading the file through its mapping failed (SIGBUS) while its size and time are unchanged: a disk error, or a change that kept both; refusing to serve its bytes until it is mounted again",
                    self.label
                ),
                false,
            ),
            Ok(_) => return Ok(()),
        };
        Err(self.fail(why, changed))
    }

    /// Fails the file for good with `why` (logged inside the init, so the
    /// reason is in the log before any reader, this one or one waiting
    /// here, can return EIO); the first reason stays.
    fn fail(&self, why: String, changed: bool) -> String {
        self.broken
            .get_or_init(|| {
                log::error!("{why}");
                (why, changed)
            })
            .0
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Guard::new` registers its mapping process-wide: tests that make
    /// guards take turns, or one could move the mapping another's
    /// deliberate SIGBUS is in, and the handler would re-raise it.
    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
        M.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn a_write_before_the_guard_exists_counts_from_the_open() {
        let _turn = one_at_a_time();
        // The mount opens and maps the file, reads its index, then builds the
        // guard: a write in between must not become the guard's baseline.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 4096]).unwrap();
        let f = File::open(&path).unwrap();
        let opened = f.metadata().unwrap();
        // SAFETY: the file is this test's own; the write below changes it
        // under the map, whose bytes are never read (only its address).
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        {
            use std::os::unix::fs::FileExt;
            let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            w.write_all_at(&[2u8; 16], 64).unwrap();
            let later = opened.modified().unwrap() + std::time::Duration::from_secs(1);
            w.set_modified(later).unwrap();
        }
        let g = Guard::new(
            "f",
            f.try_clone().unwrap(),
            &opened,
            map.as_ptr(),
            map.len(),
        );
        let err = g.check().unwrap_err();
        assert!(err.contains("modified since mount"), "{err}");
        assert!(g.changed());
        // A guard whose baseline is now sees no change.
        let now = f.metadata().unwrap();
        let g = Guard::new("f", f, &now, map.as_ptr(), map.len());
        assert!(!g.check().is_err_and(|e| e.contains("modified")));
    }

    #[test]
    fn a_vanished_page_reads_as_zero_and_fails_the_check() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0xABu8; 3 * 4096]).unwrap();
        // SAFETY: the file is this test's own; the page its truncation below
        // takes away is read only with read_volatile, under the guard.
        let map = unsafe { memmap2::Mmap::map(&File::open(&path).unwrap()) }.unwrap();
        let f = File::open(&path).unwrap();
        let opened = f.metadata().unwrap();
        let g = Guard::new("f", f, &opened, map.as_ptr(), map.len());
        assert!(g.check().is_ok());
        assert_eq!(map[8192], 0xAB);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        // Without the handler this read kills the process with SIGBUS.
        // SAFETY: inside the 3-page map; the page is gone, so the read
        // faults and the guard's handler maps a zero page there first.
        let v = unsafe { std::ptr::read_volatile(map.as_ptr().add(8192 + 17)) };
        assert_eq!(v, 0);
        let why = g.check().unwrap_err();
        assert!(why.contains("size 12288 -> 100"), "{why}");
        assert!(g.changed());
        // Sticky: the file does not become trustworthy again.
        assert!(g.check().is_err());
    }

    #[test]
    fn a_fault_with_size_and_times_unchanged_is_no_change_of_the_file() {
        let _turn = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0xABu8; 4096]).unwrap();
        // SAFETY: the file is this test's own and is not changed; its map's
        // bytes are never read (only its address is watched).
        let map = unsafe { memmap2::Mmap::map(&File::open(&path).unwrap()) }.unwrap();
        let f = File::open(&path).unwrap();
        let opened = f.metadata().unwrap();
        let g = Guard::new("f", f, &opened, map.as_ptr(), map.len());
        // What the handler counts for a page the disk could not give.
        g.watch.as_ref().expect("a free slot").count_hit();
        let why = g.check().unwrap_err();
        assert!(why.contains("a disk error"), "{why}");
        assert!(!g.changed(), "a disk error is not a change of the file");
    }
}
