//! Backing files that are clones of a range of the source (`FICLONERANGE`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::{Backing, Backings, Content, Origin, Slot, Stats, lock, warn_once};

/// Clones `len` bytes at `off` of `src` into `dst` at `at`: the
/// block-aligned part by `FICLONERANGE`, a last partial block by a copy.
/// `off` and `at` must be on blocks ([`Backings::may_clone`]); an error
/// when the filesystems cannot share blocks.
fn clone_range(src: &File, off: u64, len: u64, dst: &File, at: u64) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let block = block_size_of(dst)?;
    let whole = len / block * block;
    if whole > 0 {
        let arg = libc::file_clone_range {
            src_fd: src.as_raw_fd() as i64,
            src_offset: off,
            src_length: whole,
            dest_offset: at,
        };
        // SAFETY: both descriptors are open for the call; the kernel only
        // reads `arg`, a valid struct of the type FICLONERANGE takes.
        let r = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONERANGE, &arg) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if whole < len {
        let mut tail = vec![0u8; (len - whole) as usize];
        src.read_exact_at(&mut tail, off + whole)?;
        dst.write_all_at(&tail, at + whole)?;
    }
    dst.set_len(at + len)?;
    Ok(())
}

/// Whether `FICLONERANGE` failed because the two files cannot share blocks
/// (other filesystems, one without reflink, a range it will not clone),
/// not for want of room or a disk error.
fn cannot_share(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EXDEV | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOTTY | libc::EPERM)
    )
}

/// Whether `f` still holds its first `end` bytes.
pub(super) fn covers(f: &File, end: u64) -> bool {
    f.metadata().is_ok_and(|m| m.len() >= end)
}

/// The block size of the filesystem `dir` is on: what clone ranges align to.
fn block_size(dir: &std::path::Path) -> std::io::Result<u64> {
    block_size_of(&File::open(dir)?)
}

fn block_size_of(f: &File) -> std::io::Result<u64> {
    use std::os::unix::io::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `f` is open and `st` a buffer of the type fstatfs fills.
    if unsafe { libc::fstatfs(f.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so it filled `st`.
    let bs = unsafe { st.assume_init() }.f_bsize;
    Ok((bs as u64).max(512))
}

impl Backings {
    /// Backs files of content `key`, `head` then `len` bytes at `off` in
    /// `src`, by a file of `head` and a clone of that range under
    /// `--cache-dir`, when its filesystem shares blocks with `src`'s and
    /// the range and `head`'s end are on blocks (a view's header of whole
    /// blocks: the `.npy` of a large tensor). Costs no copy and no disk
    /// beyond `head` until the source changes; not counted in the limit.
    /// `None` where that cannot be: the first refusal to share blocks
    /// turns clones off; a want of room or a disk error fails this one.
    pub fn clone_of(
        &self,
        key: &Content,
        head: &[u8],
        (src, off, len): (&File, u64, u64),
    ) -> Option<Arc<Backing>> {
        if let Some(Slot::Ready(b)) = lock(&self.inner).slots.get(key) {
            return Some(b.clone());
        }
        let at = head.len() as u64;
        if !self.may_clone(off) || !self.may_clone(at) || !self.make_room(&mut lock(&self.inner), 0)
        {
            return None;
        }
        let made = tempfile::tempfile_in(&self.opts.dir).and_then(|dst| {
            dst.write_all_at(head, 0)?;
            Ok(dst)
        });
        let file = match made.map(|dst| (clone_range(src, off, len, &dst, at), dst)) {
            Ok((Ok(()), f)) => f,
            // A source cut short meanwhile (EINVAL past its end) is the
            // source's change, not the directory's.
            Ok((Err(e), _)) if cannot_share(&e) && covers(src, off + len) => {
                if !self.no_clones.swap(true, Relaxed) {
                    log::info!(
                        "{} cannot share blocks with the mounted file ({e}): raw tensors are \
                         served by the daemon",
                        self.opts.dir.display()
                    );
                }
                return None;
            }
            // No room, a disk error: this clone only; later ones may work.
            Ok((Err(e), _)) | Err(e) => {
                warn_once(
                    &self.clone_failed,
                    format_args!("cannot make a clone in {}: {e}", self.opts.dir.display()),
                );
                return None;
            }
        };
        let b = Arc::new(Backing::new(
            file,
            None,
            at + len,
            Origin::Cloned,
            self.clock.fetch_add(1, Relaxed),
        ));
        let mut inner = lock(&self.inner);
        // Another open may have cloned it meanwhile: one backing per key.
        if let Some(Slot::Ready(other)) = inner.slots.get(key) {
            return Some(other.clone());
        }
        // And clones of other keys may have taken the room found above
        // while the lock was not held: the count is checked again.
        if !self.make_room(&mut inner, 0) {
            return None;
        }
        inner.slots.insert(key.clone(), Slot::Ready(b.clone()));
        drop(inner);
        self.published.notify_all();
        Stats::add(&self.stats.backing_clones, 1);
        Some(b)
    }

    /// Whether a range at `off` of a source may be cloned: clones work so
    /// far, and `off` is on a block of `--cache-dir`'s filesystem.
    pub fn may_clone(&self, off: u64) -> bool {
        if !self.opts.enabled || self.no_clones.load(Relaxed) {
            return false;
        }
        // Not remembered when it fails (the directory gone for a while):
        // asked again at the next clone.
        let block = match self.block.get() {
            Some(&b) => b,
            None => match block_size(&self.opts.dir) {
                Ok(b) => *self.block.get_or_init(|| b),
                Err(e) => {
                    warn_once(
                        &self.clone_failed,
                        format_args!(
                            "no block size for {}: {e}; no clone until there is",
                            self.opts.dir.display()
                        ),
                    );
                    return false;
                }
            },
        };
        block > 0 && off.is_multiple_of(block)
    }

    /// Drops the clone that backs files of content `key` (one made from a
    /// source that changed meanwhile), unless an open holds it.
    pub fn forget_clone(&self, key: &Content) {
        let mut inner = lock(&self.inner);
        if let Some(Slot::Ready(b)) = inner.slots.get(key)
            && b.origin == Origin::Cloned
            && b.opens.load(Relaxed) == 0
        {
            inner.slots.remove(key);
        }
    }
}
