//! Protection against the file changing under the mount.
//!
//! The mount serves the file it opened. If that file is truncated or written
//! in place, pages of the mmap can vanish (touching them raises SIGBUS) or
//! hold bytes the index never promised. Every access checks the file's size
//! and mtime against those seen at mount, and a SIGBUS inside the mapping is
//! absorbed by mapping a zero page there; the access that hit it then fails
//! the check and returns EIO instead of the zeros.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

fn stamp(f: &File) -> std::io::Result<Stamp> {
    let m = f.metadata()?;
    Ok(Stamp {
        len: m.len(),
        mtime: m.mtime(),
        mtime_nsec: m.mtime_nsec(),
    })
}

pub struct Guard {
    label: String,
    file: File,
    orig: Stamp,
    broken: OnceLock<String>,
}

impl Guard {
    /// Watches `file` (a second handle on the mounted file) and the mapping
    /// `[base, base+len)` of it.
    pub fn new(label: &str, file: File, base: *const u8, len: usize) -> std::io::Result<Guard> {
        let orig = stamp(&file)?;
        install_sigbus_handler(base as usize, len);
        Ok(Guard {
            label: label.to_string(),
            file,
            orig,
            broken: OnceLock::new(),
        })
    }

    /// Ok while the file is as it was at mount. Once it changed, stays failed.
    pub fn check(&self) -> Result<(), String> {
        if let Some(why) = self.broken.get() {
            return Err(why.clone());
        }
        let why = match stamp(&self.file) {
            Err(e) => format!("{}: cannot stat the mounted file: {e}", self.label),
            Ok(now) if now.len != self.orig.len => format!(
                "{}: file changed since mount (size {} -> {} bytes); refusing to serve its bytes",
                self.label, self.orig.len, now.len
            ),
            Ok(now) if now != self.orig => {
                format!(
                    "{}: file was modified since mount; refusing to serve its bytes",
                    self.label
                )
            }
            Ok(_) if SIGBUS_HITS.load(SeqCst) > 0 => {
                format!(
                    "{}: pages of the file vanished under the mount (SIGBUS)",
                    self.label
                )
            }
            Ok(_) => return Ok(()),
        };
        // Logged inside the init, so the reason is in the log before any
        // reader (this one or one waiting here) can return EIO.
        Err(self
            .broken
            .get_or_init(|| {
                log::error!("{why}");
                why
            })
            .clone())
    }
}

static MAP_BASE: AtomicUsize = AtomicUsize::new(0);
static MAP_LEN: AtomicUsize = AtomicUsize::new(0);
static SIGBUS_HITS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Async-signal-safe work only: atomics and mmap(2).
    let addr = unsafe { (*info).si_addr() } as usize;
    let base = MAP_BASE.load(SeqCst);
    let len = MAP_LEN.load(SeqCst);
    if base != 0 && addr >= base && addr < base + len {
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let at = addr & !(page - 1);
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            SIGBUS_HITS.fetch_add(1, SeqCst);
            return;
        }
    }
    // Not ours: die as SIGBUS would have killed us.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn install_sigbus_handler(base: usize, len: usize) {
    MAP_BASE.store(base, SeqCst);
    MAP_LEN.store(len, SeqCst);
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vanished_page_reads_as_zero_and_fails_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0xABu8; 3 * 4096]).unwrap();
        let map = unsafe { memmap2::Mmap::map(&File::open(&path).unwrap()) }.unwrap();
        let g = Guard::new("f", File::open(&path).unwrap(), map.as_ptr(), map.len()).unwrap();
        assert!(g.check().is_ok());
        assert_eq!(map[8192], 0xAB);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        // Without the handler this read kills the process with SIGBUS.
        let v = unsafe { std::ptr::read_volatile(map.as_ptr().add(8192 + 17)) };
        assert_eq!(v, 0);
        let why = g.check().unwrap_err();
        assert!(why.contains("size 12288 -> 100"), "{why}");
        // Sticky: the file does not become trustworthy again.
        assert!(g.check().is_err());
    }
}
