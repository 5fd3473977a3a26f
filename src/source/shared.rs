//! What lets several processes (mounts of one object, with one cache
//! directory) share a cache file: a bitmap of the blocks present that all
//! of them map (`NAME.live`, `MAP_SHARED`, its words changed only
//! atomically), and a lock per run of blocks (an open-file-description
//! lock on a byte range of that file), held from before a block is
//! fetched until it is marked present, so that a block is fetched once
//! whichever process asks first.
//!
//! The live bitmap is believed only during the boot that wrote it (its
//! header holds the boot id): a bit is set once the block's bytes are
//! written into the cache file, which puts them in the page cache, and
//! the page cache outlives a process killed with SIGKILL but not the
//! machine. After a reboot the durable bitmap (`NAME.blocks`, saved after
//! an fdatasync) is the truth.

use std::fs::File;
use std::io;
use std::ops::{Deref, Range};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

const MAGIC: &[u8; 8] = b"ZTRLIVE1";
/// Magic, boot id (36 bytes of text), block size, object size; then the
/// words, 8-byte aligned.
const HEADER: usize = 64;
/// Where the block locks are: past any real offset of the file, so that
/// they never cover its header or words (a lock is only a range).
const LOCK_BASE: i64 = 1 << 40;

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
fn boot_id() -> io::Result<[u8; 36]> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    s.trim()
        .as_bytes()
        .try_into()
        .map_err(|_| io::Error::other("boot_id is not 36 characters"))
}

fn header(block: u64, size: u64) -> io::Result<[u8; HEADER]> {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..44].copy_from_slice(&boot_id()?);
    h[44..52].copy_from_slice(&block.to_le_bytes());
    h[52..60].copy_from_slice(&size.to_le_bytes());
    Ok(h)
}

/// The block size and object size the live bitmap at `path` was made
/// for, and whether it marks any block present, when it is a whole one
/// of this boot (its words are believed only then).
pub fn live_layout(path: &Path) -> Option<(u64, u64, bool)> {
    let head: [u8; HEADER] = read_head(path)?;
    let now = header(0, 0).ok()?;
    if head[..44] != now[..44] {
        return None;
    }
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
    let (block, size) = (word(44), word(52));
    if block == 0 {
        return None;
    }
    let words = size.div_ceil(block).div_ceil(64);
    let whole = read_exact_file(path, (HEADER as u64).checked_add(words.checked_mul(8)?)?)?;
    Some((block, size, whole[HEADER..].iter().any(|&b| b != 0)))
}

/// The blocks present in one cache file, as every process mapping it
/// sees them.
pub struct Live {
    path: PathBuf,
    /// Before `map`, so dropped before it is unmapped.
    _watch: Option<crate::sigbus::Watched>,
    map: memmap2::MmapMut,
    words: usize,
}

impl Live {
    /// Opens (creating) the live bitmap at `path` for `words` words of an
    /// object of `size` bytes in blocks of `block`. `alone`: no other
    /// process has the cache file open (its exclusive lock is held): the
    /// words the file held are given back when they are of this boot and
    /// this layout, and the bitmap becomes a new file put in its place, so
    /// that a process still mapping the old one (its cache file deleted
    /// and made again since) goes on with its own and never shares words
    /// with a file it does not have. Otherwise the file is mapped as it
    /// is, or refused if its layout differs.
    pub fn open(
        path: &Path,
        block: u64,
        size: u64,
        words: usize,
        alone: bool,
    ) -> io::Result<(Live, Option<Vec<u64>>)> {
        let want = header(block, size)?;
        let len = (HEADER + words * 8) as u64;
        let old = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(!alone)
            .truncate(false)
            .open(path);
        let same = |f: &File| {
            let mut have = [0u8; HEADER];
            f.metadata().is_ok_and(|m| m.len() == len)
                && f.read_exact_at(&mut have, 0).is_ok()
                && have == want
        };
        let (f, kept) = if alone {
            let kept = old.ok().filter(|f| same(f)).and_then(|f| {
                let mut b = vec![0u8; words * 8];
                f.read_exact_at(&mut b, HEADER as u64).ok()?;
                Some(
                    b.chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect(),
                )
            });
            (fresh(path, &want, len)?, kept)
        } else {
            let f = old?;
            if !same(&f) {
                return Err(io::Error::other(format!(
                    "{} is not a live bitmap of this object's layout (another block size, from \
                     before a reboot, or damaged)",
                    path.display()
                )));
            }
            (f, None)
        };
        // SAFETY: the file is ours to map: sized above (or checked to be)
        // before any process maps it, and never resized by us once in
        // place (a process alone puts a new file in its place instead); a
        // page another program takes away is blanked by the watch below.
        let mut map = unsafe { memmap2::MmapOptions::new().map_mut(&f)? };
        // Another program may still cut it short: a page that goes then
        // is blanked (its blocks read as missing, fetched again), not the
        // end of the daemon.
        let watch = crate::sigbus::Watched::new(map.as_mut_ptr(), map.len());
        let live = Live {
            path: path.to_path_buf(),
            _watch: watch,
            map,
            words,
        };
        Ok((live, kept))
    }

    /// Sets the words (while alone, before any other process maps them).
    pub fn store(&self, words: &[u64]) {
        for (w, &v) in self.iter().zip(words) {
            w.store(v, std::sync::atomic::Ordering::Release);
        }
    }

    /// The file whose ranges [`lock_range`] locks.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A value made once per process and handed out as clones: one made
/// before a fork is not the child's (its connections belong to the
/// parent's runtime), so the child makes its own at its first use.
#[derive(Debug)]
pub(super) struct PerProcess<T>(std::sync::Mutex<Option<(u32, T)>>);

impl<T: Clone> PerProcess<T> {
    pub(super) const fn new() -> PerProcess<T> {
        PerProcess(std::sync::Mutex::new(None))
    }

    /// This process's value, made by `make` if it has none yet.
    pub(super) fn get<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if let Some((p, v)) = slot.as_ref()
            && *p == pid
        {
            return Ok(v.clone());
        }
        let v = make()?;
        *slot = Some((pid, v.clone()));
        Ok(v)
    }
}

/// The bytes of the regular file at `path` when it holds exactly `len`:
/// opened without following a link and without blocking (a FIFO put in
/// its place), and never read past `len` (a huge or endless file).
pub(super) fn read_exact_file(path: &Path, len: u64) -> Option<Vec<u8>> {
    let f = open_to_read(path)?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.len() != len {
        return None;
    }
    let mut b = vec![0u8; usize::try_from(len).ok()?];
    f.read_exact_at(&mut b, 0).ok()?;
    Some(b)
}

/// The first `N` bytes of the file at `path`, not through a link (nor
/// blocking on a FIFO).
pub(super) fn read_head<const N: usize>(path: &Path) -> Option<[u8; N]> {
    let mut head = [0u8; N];
    open_to_read(path)?.read_exact_at(&mut head, 0).ok()?;
    Some(head)
}

/// The file at `path` opened to read, not through a link and without
/// blocking (on a FIFO put in its place).
fn open_to_read(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()
}

/// A new file in `path`'s directory, to be renamed onto `path`, with the
/// mode a file made by `open` gets (0664 less the umask), not the 0600 of
/// a temporary file: the mounts of the group's users share it.
pub(super) fn new_beside(path: &Path) -> io::Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    // Never writable by every user, whatever the umask (see `trusted`).
    let mode = 0o664 & !umask();
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(tmp)
}

/// This process's umask, from `/proc/self/status` (reading it with
/// umask(2) would change it meanwhile); 022 where it cannot be read.
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Umask:"))?;
            u32::from_str_radix(line["Umask:".len()..].trim(), 8).ok()
        })
        .unwrap_or(0o022)
}

/// The folder of the remote cache under `cache_dir`, `ztensor-remote`,
/// made when missing (never writable by every user). The outer error: it
/// cannot be made; the inner one: it is there, but its files are not to
/// be trusted (see [`trusted`]).
pub(super) fn cache_folder(cache_dir: &Path) -> io::Result<Result<PathBuf, String>> {
    made_folder(cache_dir.join("ztensor-remote"))
}

/// The folder `dir`, made when missing (0775 less the umask: a group may
/// share it, no other user), and whether its files may be trusted (see
/// [`trusted`]), as [`cache_folder`] says.
pub(super) fn made_folder(dir: PathBuf) -> io::Result<Result<PathBuf, String>> {
    use std::os::unix::fs::DirBuilderExt;
    if std::fs::symlink_metadata(&dir).is_err() {
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o775)
            .create(&dir)
        {
            Ok(()) => {}
            // Made by another mount meanwhile: checked below as any is.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(trusted(&dir).map(|()| dir))
}

/// Whether the files in `dir` may be trusted: a folder (not a link to
/// one) that this process's user or root owns, which users other than
/// its group cannot write. In a folder any user can write (`/var/tmp`)
/// another could have made it first, and put in it links or files of
/// their own that a mount would write through (as root: any file) or
/// serve bytes from.
pub(super) fn trusted(dir: &Path) -> Result<(), String> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.file_type().is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    owners_only(&m).map_err(|why| format!("{} {why}", dir.display()))
}

/// Whether the cache file `f` may be used: a regular file that this
/// process's user or root owns, which users other than its group cannot
/// write (see [`trusted`]).
pub(super) fn trusted_file(f: &File) -> Result<(), String> {
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("it is not a regular file".into());
    }
    owners_only(&m).map_err(|why| format!("it {why}"))
}

/// Whether only this process's user or root (and a group they chose) can
/// change what `m` describes; what is wrong, after the thing's name.
fn owners_only(m: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me && m.uid() != 0 {
        Err(format!(
            "belongs to user {}, neither this user ({me}) nor root, who could change it",
            m.uid()
        ))
    } else if m.mode() & 0o002 != 0 {
        Err(format!(
            "can be written by every user (mode {:o})",
            m.mode() & 0o7777
        ))
    } else {
        Ok(())
    }
}

/// A new live bitmap file of `len` bytes starting with `header`, renamed
/// onto `path`.
fn fresh(path: &Path, header: &[u8], len: u64) -> io::Result<File> {
    let tmp = new_beside(path)?;
    tmp.as_file().set_len(len)?;
    tmp.as_file().write_all_at(header, 0)?;
    tmp.persist(path).map_err(|e| e.error)
}

impl Deref for Live {
    type Target = [AtomicU64];

    fn deref(&self) -> &[AtomicU64] {
        let words = &self.map[HEADER..];
        debug_assert!(words.len() >= self.words * 8);
        // SAFETY: the mapping holds HEADER + words * 8 bytes (sized at
        // open), page-aligned, so the words at HEADER (a multiple of 8) are
        // aligned for AtomicU64, which has u64's layout; they live as long
        // as `self.map`; every process changes them only through atomics.
        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<AtomicU64>(), self.words) }
    }
}

/// An open-file-description write lock on `blocks` (at [`LOCK_BASE`]
/// plus the block number) of the file at `path`, through a descriptor of
/// its own: OFD locks of one description do not exclude each other, so
/// each holder opens the file anew. `wait`: wait for the range to be free;
/// else `None` when another holds part of it.
pub fn lock_range(path: &Path, blocks: Range<u64>, wait: bool) -> io::Result<Option<File>> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let start = LOCK_BASE
        .checked_add(i64::try_from(blocks.start).map_err(io::Error::other)?)
        .ok_or_else(|| io::Error::other("block number out of range"))?;
    let len = i64::try_from(blocks.end.saturating_sub(blocks.start)).map_err(io::Error::other)?;
    // SAFETY: a zeroed flock is a valid value of the C struct; the fields
    // that matter are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start;
    fl.l_len = len.max(1);
    let cmd = match wait {
        true => libc::F_OFD_SETLKW,
        false => libc::F_OFD_SETLK,
    };
    loop {
        // SAFETY: fcntl on our own descriptor with a valid flock.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &fl) };
        if r == 0 {
            return Ok(Some(f));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::EACCES) if !wait => return Ok(None),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn a_live_bitmap_is_kept_for_its_layout_and_shared_between_mappings() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.live");
        let (a, kept) = Live::open(&p, 4096, 100_000, 1, true).unwrap();
        assert_eq!(kept, None, "a new file holds nothing");
        a.store(&[0b101]);
        // A second mapping (another process's) sees the same words.
        let (b, kept) = Live::open(&p, 4096, 100_000, 1, false).unwrap();
        assert_eq!(kept, None);
        b[0].fetch_or(0b10, Relaxed);
        assert_eq!(a[0].load(Relaxed), 0b111);
        drop((a, b));
        // Reopened alone: kept; with another block size: reset, and
        // refused to a process that is not alone.
        let (_, kept) = Live::open(&p, 4096, 100_000, 1, true).unwrap();
        assert_eq!(kept, Some(vec![0b111]));
        assert!(Live::open(&p, 8192, 100_000, 1, false).is_err());
        let (c, kept) = Live::open(&p, 8192, 100_000, 1, true).unwrap();
        assert_eq!(kept, None);
        assert_eq!(c[0].load(Relaxed), 0);
    }

    #[test]
    fn a_process_alone_maps_a_new_file_and_an_older_mapping_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.live");
        let (old, _) = Live::open(&p, 4096, 100_000, 1, true).unwrap();
        old.store(&[0b1]);
        // Its cache file deleted and made again: the next process alone
        // is given the old words (the caller drops them for a new cache
        // file) but shares nothing with the older mapping.
        let (new, kept) = Live::open(&p, 4096, 100_000, 1, true).unwrap();
        assert_eq!(kept, Some(vec![0b1]));
        new.store(&[0]);
        new[0].fetch_or(0b100, Relaxed);
        old[0].fetch_or(0b10, Relaxed);
        assert_eq!((old[0].load(Relaxed), new[0].load(Relaxed)), (0b11, 0b100));
        // A process joining maps the new one.
        let (joined, _) = Live::open(&p, 4096, 100_000, 1, false).unwrap();
        assert_eq!(joined[0].load(Relaxed), 0b100);
    }

    #[test]
    fn a_block_lock_excludes_another_holder_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.live");
        let (live, _) = Live::open(&p, 4096, 100_000, 1, true).unwrap();
        let held = lock_range(live.path(), 2..5, false).unwrap().unwrap();
        // Without waiting: refused while held.
        assert!(lock_range(&p, 4..6, false).unwrap().is_none());
        let (tx, rx) = std::sync::mpsc::channel();
        let p2 = p.clone();
        let t = std::thread::spawn(move || {
            let _l = lock_range(&p2, 4..6, true).unwrap();
            tx.send(()).unwrap();
        });
        // Disjoint ranges do not wait.
        drop(lock_range(&p, 5..6, false).unwrap().unwrap());
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err(),
            "an overlapping lock was granted"
        );
        drop(held);
        rx.recv().unwrap();
        t.join().unwrap();
    }
}
