//! The kernel's notice of writes to the mounted files (inotify), for what
//! their size and times cannot show: a write whose mtime was set back, made
//! around a change of the link count (a hard link a backup tool made, then
//! a write in place), moves the ctime as the link does, so the times alone
//! would excuse it; and a rename moves the ctime without a write, so the
//! times alone would take a file moved aside (`mv model model.bak`) for a
//! changed one.
//!
//! One inotify instance for the process, read without blocking at each
//! check of a file's guard (an event is queued before the write that made
//! it returns, so a check made after the write sees it); no thread. Where
//! a watch cannot be added (the user's limit of watches, a filesystem
//! without inotify) the guard goes on with the times alone.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

/// What the kernel said of one watched file since it was watched.
#[derive(Default)]
pub struct Notice {
    /// Written or truncated (`IN_MODIFY`): for good.
    modified: AtomicBool,
    /// Renamed (`IN_MOVE_SELF`) since the last [`Notice::take_moved`].
    moved: AtomicBool,
}

impl Notice {
    /// Whether the file was written or truncated since it was watched.
    pub fn modified(&self) -> bool {
        self.modified.load(Relaxed)
    }

    /// Whether the file was renamed since the last call.
    pub fn take_moved(&self) -> bool {
        self.moved.swap(false, Relaxed)
    }
}

struct Inotify {
    fd: OwnedFd,
    /// The notices of each watch, one per guard that asked (the same
    /// inode watched again shares the watch, not what was seen before);
    /// held while events are read, so that each lands on the watch it names.
    watches: Mutex<HashMap<i32, Vec<std::sync::Weak<Notice>>>>,
}

fn instance() -> Option<&'static Inotify> {
    static ONE: OnceLock<Option<Inotify>> = OnceLock::new();
    ONE.get_or_init(|| {
        // SAFETY: inotify_init1 takes flags only; on success it returns a
        // new descriptor that nothing else owns.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            log::debug!(
                "no inotify ({}): changes are seen by the files' size and times",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Inotify {
            // SAFETY: `fd` is the new descriptor, owned from here on.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            watches: Mutex::default(),
        })
    })
    .as_ref()
}

/// Watches `file` (its inode, whatever its name now: through
/// `/proc/self/fd`) for writes and renames; `None` where it cannot be.
pub fn watch(file: &File) -> Option<Arc<Notice>> {
    let ino = instance()?;
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
    let mut watches = ino.watches.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: a NUL-ended path that lives through the call, and our own
    // inotify descriptor.
    let wd = unsafe {
        libc::inotify_add_watch(
            ino.fd.as_raw_fd(),
            path.as_ptr(),
            libc::IN_MODIFY | libc::IN_MOVE_SELF,
        )
    };
    if wd < 0 {
        log::debug!(
            "cannot watch a mounted file ({}): its changes are seen by its size and times",
            std::io::Error::last_os_error()
        );
        return None;
    }
    // The same inode watched again shares its watch; its notice starts
    // empty (the file may have been rewritten before this open of it).
    // What was queued before this watch began is not this notice's.
    drain_into(ino, &watches);
    let notice = Arc::new(Notice::default());
    let list = watches.entry(wd).or_default();
    list.retain(|n| n.strong_count() > 0);
    list.push(Arc::downgrade(&notice));
    Some(notice)
}

/// Reads the events queued so far onto the watches' notices.
pub fn drain() {
    let Some(ino) = instance() else { return };
    let watches = ino.watches.lock().unwrap_or_else(|e| e.into_inner());
    drain_into(ino, &watches);
}

/// [`drain`], its watches held.
fn drain_into(ino: &Inotify, watches: &HashMap<i32, Vec<std::sync::Weak<Notice>>>) {
    if watches.is_empty() {
        return;
    }
    // Aligned for the events' header; many events a read.
    let mut buf = [0u64; 512];
    loop {
        // SAFETY: reads into our own buffer, of its size, from our own
        // non-blocking descriptor.
        let n = unsafe {
            libc::read(
                ino.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(&buf),
            )
        };
        let Ok(n) = usize::try_from(n) else { return };
        if n == 0 {
            return;
        }
        // SAFETY: the first `n` bytes of `buf` were written by the read.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
        apply(bytes, watches);
    }
}

/// Sets the notices the events in `bytes` name. An overflowed queue lost
/// events: every watched file is taken as written.
fn apply(bytes: &[u8], watches: &HashMap<i32, Vec<std::sync::Weak<Notice>>>) {
    const HEAD: usize = std::mem::size_of::<libc::inotify_event>();
    let mut at = 0;
    while let Some(head) = bytes.get(at..at + HEAD) {
        let wd = i32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
        let mask = u32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
        let len = u32::from_ne_bytes([head[12], head[13], head[14], head[15]]) as usize;
        at += HEAD + len;
        if mask & libc::IN_Q_OVERFLOW != 0 {
            log::warn!("the kernel's queue of changes to the mounted files overflowed");
            let all = watches
                .values()
                .flatten()
                .filter_map(std::sync::Weak::upgrade);
            all.for_each(|n| n.modified.store(true, Relaxed));
            continue;
        }
        let Some(list) = watches.get(&wd) else {
            continue;
        };
        for n in list.iter().filter_map(std::sync::Weak::upgrade) {
            if mask & libc::IN_MODIFY != 0 {
                n.modified.store(true, Relaxed);
            }
            if mask & libc::IN_MOVE_SELF != 0 {
                n.moved.store(true, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_and_a_rename_are_noticed_whatever_the_files_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"old").unwrap();
        let f = File::open(&path).unwrap();
        let notice = watch(&f).unwrap();
        drain();
        assert!(!notice.modified() && !notice.take_moved());
        std::fs::rename(&path, dir.path().join("g")).unwrap();
        drain();
        assert!(notice.take_moved() && !notice.modified());
        assert!(!notice.take_moved(), "taken once");
        std::os::unix::fs::FileExt::write_all_at(
            &std::fs::OpenOptions::new()
                .write(true)
                .open(dir.path().join("g"))
                .unwrap(),
            b"new",
            0,
        )
        .unwrap();
        drain();
        assert!(notice.modified());
    }
}
