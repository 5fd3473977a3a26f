//! An object's cache files in `--cache-dir`: the sparse copy of its
//! bytes, the bitmaps of the blocks present (saved, and shared with other
//! mounts), and the eviction that keeps them within `--disk-cache-size`.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Acquire;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::source::shared::Live;
use crate::source::sums::Sums;

use super::{Options, fail};

/// A cache file opened for an object, with its saved bitmap and the
/// bitmap shared with the other mounts that have it open.
pub(super) struct Cache {
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) present: Vec<u64>,
    pub(super) bitmap: Option<File>,
    pub(super) live: Option<Live>,
    pub(super) sums: Sums,
    /// What its name is made from, as a number: seeds its blocks' sums.
    pub(super) key: u64,
    /// Bytes per block: `-o block_size`, or the size of the blocks the
    /// shared cache file already holds (see [`kept_block`]).
    pub(super) block: u64,
    pub(super) etag_mark: EtagMark,
}

/// Whether the answers to GETs of the object carried its ETag, known to
/// every mount of its cache files: a mount whose GETs have all lacked it
/// (it shares the file with the one that saw it, or it is a remount) holds
/// an answer without it as another object's all the same, since a server
/// that drops the ETag it sent may ignore `If-Match` too.
pub(super) struct EtagMark {
    seen: std::sync::atomic::AtomicBool,
    /// `NAME.etag`, made once an answer carried the ETag (none for an
    /// object whose cache files are not kept, nor for a mount of it that
    /// fetches into a private file).
    path: Option<PathBuf>,
}

impl EtagMark {
    pub(super) fn new(path: Option<PathBuf>) -> EtagMark {
        EtagMark {
            seen: std::sync::atomic::AtomicBool::new(false),
            path,
        }
    }

    /// An answer to a GET carried the ETag.
    pub(super) fn saw(&self) {
        if self.seen.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let Some(path) = &self.path else { return };
        // Made anew or found there, never opened (a FIFO put in its place
        // would block the open) nor followed (a link).
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            // This mount still holds the object to it; a remount of the
            // cache will not know it.
            Err(e) => log::warn!(
                "{}: cannot record that the object's answers carry its ETag ({e}): a remount \
                 will not hold them to it",
                path.display()
            ),
        }
    }

    /// The mark's file, where the object's cache files are kept.
    pub(super) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether an answer to a GET of this mount, or of any mount of the
    /// cache files, carried the ETag. Asked only of an answer without it.
    pub(super) fn seen(&self) -> bool {
        if self.seen.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        let marked = self
            .path
            .as_ref()
            .is_some_and(|p| p.symlink_metadata().is_ok());
        if marked {
            self.seen.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        marked
    }
}

/// The most blocks an object's cache tracks: its table (a sum of 8 bytes
/// and two bits a block, in memory or mapped) stays within 34 MiB, and a
/// size a server made up is refused before anything is sized by it. With
/// the default 4 MiB block that is 16 TiB, past any file of weights.
pub(super) const MAX_BLOCKS: u64 = 1 << 22;

pub(super) const BITMAP_MAGIC: &[u8; 8] = b"ZTRBLK1\n";
/// Magic, block size, object size.
pub(super) const BITMAP_HEADER: u64 = 24;

/// How long a mount waits for another to finish setting up the cache
/// file they share.
pub(super) const SETUP_WAIT: Duration = Duration::from_secs(10);

/// An object's cache files: `NAME.data` (the bytes), `NAME.blocks` (the
/// durable bitmap), `NAME.live` (the bitmap every mount of it shares),
/// `NAME.sums` (each block's XXH3-64, see [`Sums`]), `NAME.etag` (see
/// [`EtagMark`]).
pub(super) struct Names {
    /// What the name is made from, as a number.
    pub(super) key: u64,
    pub(super) dir: PathBuf,
    pub(super) name: String,
    pub(super) data: PathBuf,
    pub(super) blocks: PathBuf,
    pub(super) live: PathBuf,
    pub(super) sums: PathBuf,
    pub(super) etag: PathBuf,
}

pub(super) fn flock(f: &File, op: libc::c_int) -> bool {
    // SAFETY: flock on our own descriptor.
    unsafe { libc::flock(f.as_raw_fd(), op) == 0 }
}

/// How a mount whose cache files did not fit it settled.
enum Settled {
    /// Alone with the file (its exclusive lock held): the first mount.
    Alone,
    /// Another mount set the files up meanwhile: joined.
    Joined(Box<Cache>),
    /// Neither, within the wait.
    Not,
}

/// Waits at most `wait` for the mounts holding `f` (the cache file at
/// `path`) to let go of it, or for one of them to set its files up again,
/// which `join` then joins. (A shared lock asked to become exclusive is
/// let go of first: between tries the wait holds none.)
fn settle(
    f: &File,
    path: &Path,
    wait: Duration,
    join: impl Fn() -> std::io::Result<Cache>,
) -> Settled {
    use std::os::unix::fs::MetadataExt;
    // Still the file of that name: not one an eviction (or another
    // program) removed or replaced while no lock was held.
    let named = || match (f.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    let until = Instant::now() + wait;
    let mut joined_at = Instant::now();
    loop {
        if flock(f, libc::LOCK_EX | libc::LOCK_NB) {
            return match named() {
                true => Settled::Alone,
                false => Settled::Not,
            };
        }
        if joined_at.elapsed() >= Duration::from_millis(100)
            && flock(f, libc::LOCK_SH | libc::LOCK_NB)
        {
            if !named() {
                return Settled::Not;
            }
            joined_at = Instant::now();
            if let Ok(c) = join() {
                return Settled::Joined(Box::new(c));
            }
        }
        if Instant::now() >= until {
            return Settled::Not;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Cache {
    /// Opens the cache file of an object. Every mount of it holds a shared
    /// lock on the file while mounted (eviction takes only files no one
    /// holds); the first, alone with an exclusive lock for the while,
    /// checks and sizes the files before any other maps them.
    /// `pin` names the object's bytes (`None`: nothing does, so its file
    /// is private and not kept).
    /// The cache of the object `identity` names (its URL; of a signed URL,
    /// see [`crate::source::signed_url::identity`]) pinned to `pin`, `size` bytes;
    /// `label` names it in messages.
    pub(super) fn open(
        opts: &Options,
        (label, identity): (&str, &str),
        pin: Option<&str>,
        size: u64,
    ) -> Result<Cache> {
        let blocks = size.div_ceil(opts.block_size);
        if blocks > MAX_BLOCKS {
            return Err(fail(
                label,
                format!(
                    "the server gives its size as {size} bytes: more than the cache tracks \
                     ({MAX_BLOCKS} blocks of {} bytes, {} bytes; a larger -o block_size \
                     tracks more)",
                    opts.block_size,
                    MAX_BLOCKS.saturating_mul(opts.block_size)
                ),
            ));
        }
        let words = blocks.div_ceil(64) as usize;
        let io = |what: &str, e: std::io::Error| fail(label, format!("cache: {what}: {e}"));
        let folder = crate::source::shared::cache_folder(&opts.cache_dir).map_err(|e| {
            io(
                &opts.cache_dir.join("ztensor-remote").display().to_string(),
                e,
            )
        })?;
        let dir = match &folder {
            Ok(dir) => dir.clone(),
            Err(_) => opts.cache_dir.join("ztensor-remote"),
        };
        let pin = pin.unwrap_or_default();
        let h = xxhash_rust::xxh3::xxh3_128(format!("{identity}\0{pin}\0{size}").as_bytes());
        let name = format!("{h:032x}");
        let n = Names {
            key: h as u64,
            data: dir.join(format!("{name}.data")),
            blocks: dir.join(format!("{name}.blocks")),
            live: dir.join(format!("{name}.live")),
            sums: dir.join(format!("{name}.sums")),
            etag: dir.join(format!("{name}.etag")),
            dir,
            name,
        };
        if pin.is_empty() {
            return Self::private(opts, label, (size, words), &n, "nothing names its bytes");
        }
        if let Err(why) = &folder {
            log::warn!("{label}: the shared cache is not used: {why}");
            return Self::private(opts, label, (size, words), &n, "its folder is not trusted");
        }
        Self::shared(opts, label, (size, words), &n)
    }

    /// The cache file in a trusted folder, shared with the other mounts
    /// of the object where it can be, else private.
    fn shared(
        opts: &Options,
        label: &str,
        (size, words): (u64, usize),
        n: &Names,
    ) -> Result<Cache> {
        // Not through a link: a link would have the mount write elsewhere.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&n.data)
            .map_err(|e| {
                let denied = e.kind() == std::io::ErrorKind::PermissionDenied;
                (format!("{}: {e}", n.data.display()), denied)
            })
            .and_then(|f| {
                crate::source::shared::trusted_file(&f)
                    .map(|()| f)
                    .map_err(|why| (format!("{}: {why}", n.data.display()), false))
            });
        let file = match file {
            Ok(f) => f,
            // Another user's folder (root's /var/tmp/ztensor-remote):
            // every mount of this user fetches the object again.
            Err((why, true)) => {
                log::warn!(
                    "{label}: the shared cache file is not used: {why}; a --cache-dir of this \
                     user's own keeps the object's blocks for later mounts"
                );
                return Self::private(opts, label, (size, words), n, "this user cannot write it");
            }
            Err((why, false)) => {
                log::warn!("{label}: the shared cache file is not used: {why}");
                return Self::private(opts, label, (size, words), n, "it cannot be trusted");
            }
        };
        if flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            return Self::alone(opts, label, (size, words), n, file);
        }
        // Another mount has it: wait for its setup (its exclusive lock, held
        // for moments), then share. A lock held longer is not a setup (an
        // older version held it while mounted): a private file then.
        let until = Instant::now() + SETUP_WAIT;
        while !flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            if Instant::now() >= until {
                return Self::private(
                    opts,
                    label,
                    (size, words),
                    n,
                    "another mount holds it alone",
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        match Self::join(opts, size, n, &file) {
            Ok(c) => {
                // Each mount brings the cache within its bound, a second
                // one of an object as the first did.
                evict(&n.dir, opts.disk_cache_size, &n.name);
                Ok(c)
            }
            // Files that do not fit the object (damaged, cut short) may be
            // held by a mount that is exiting, its last commit under way
            // after an unmount: once none holds them, this mount is the
            // first and puts new ones in place, instead of fetching every
            // block again into a private file.
            // A directory in a side file's place is there for good (no
            // mount can put a file there): no wait.
            Err(e) if [&n.live, &n.sums, &n.blocks].iter().any(|p| p.is_dir()) => {
                Self::private(opts, label, (size, words), n, &e.to_string())
            }
            Err(e) => {
                log::info!(
                    "{label}: its cache files do not fit it ({e}); waiting for the mounts that \
                     hold them to let go, to set them up again"
                );
                match settle(&file, &n.data, SETUP_WAIT, || {
                    Self::join(opts, size, n, &file)
                }) {
                    Settled::Alone => Self::alone(opts, label, (size, words), n, file),
                    Settled::Joined(c) => {
                        evict(&n.dir, opts.disk_cache_size, &n.name);
                        Ok(*c)
                    }
                    Settled::Not => Self::private(opts, label, (size, words), n, &e.to_string()),
                }
            }
        }
    }

    /// The mount alone with the cache file (its exclusive lock held): the
    /// first, or, where its side files cannot be made, a private file.
    fn alone(
        opts: &Options,
        label: &str,
        (size, words): (u64, usize),
        n: &Names,
        file: File,
    ) -> Result<Cache> {
        match Self::first(opts, label, size, n, file) {
            Ok(c) => {
                evict(&n.dir, opts.disk_cache_size, &n.name);
                Ok(c)
            }
            // Its bitmap or sums cannot be made (a directory in their
            // place, a folder made immutable): the bytes are fetched
            // all the same, into a file of this mount's own.
            Err(e) => {
                log::warn!("{e}");
                Self::private(opts, label, (size, words), n, "its files cannot be set up")
            }
        }
    }

    /// A cache file of this mount's own (not kept), for when the shared
    /// one cannot be used.
    pub(super) fn private(
        opts: &Options,
        label: &str,
        (size, words): (u64, usize),
        n: &Names,
        why: &str,
    ) -> Result<Cache> {
        let io = |what: &str, e: std::io::Error| fail(label, format!("cache: {what}: {e}"));
        log::info!(
            "{label}: cannot share its cache file with another mount ({why}); using a private one"
        );
        // In the cache directory itself: `n.dir` may be another user's.
        let file = tempfile::tempfile_in(&opts.cache_dir).map_err(|e| io("temporary file", e))?;
        file.set_len(size)
            .map_err(|e| io("sizing the cache file", e))?;
        Ok(Cache {
            path: opts.cache_dir.join("(private)"),
            file,
            present: vec![0; words],
            bitmap: None,
            live: None,
            sums: Sums::own(size.div_ceil(opts.block_size)),
            key: n.key,
            // A private file leaves nothing behind.
            etag_mark: EtagMark::new(None),
            block: opts.block_size,
        })
    }

    /// Joins the mounts that have the cache file open: its size and live
    /// bitmap are theirs.
    /// Fetches in the blocks they fetch in, whatever `-o block_size`.
    pub(super) fn join(
        opts: &Options,
        size: u64,
        n: &Names,
        file: &File,
    ) -> std::io::Result<Cache> {
        if file.metadata()?.len() != size {
            return Err(std::io::Error::other("the cache file has another size"));
        }
        let block = crate::source::shared::live_layout(&n.live)
            .filter(|&(block, s, _)| s == size && valid_block(block, size))
            .map_or(opts.block_size, |(block, ..)| block);
        let words = bitmap_words(size, block);
        let (live, _) = Live::open(&n.live, block, size, words, false)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", n.live.display())))?;
        let present = live.iter().map(|w| w.load(Acquire)).collect();
        let bitmap = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&n.blocks)?;
        let sums = Sums::join(&n.sums, size.div_ceil(block))?;
        Ok(Cache {
            path: n.data.clone(),
            file: file.try_clone()?,
            present,
            bitmap: Some(bitmap),
            live: Some(live),
            sums,
            key: n.key,
            etag_mark: EtagMark::new(Some(n.etag.clone())),
            block,
        })
    }

    /// The first mount of the cache file (no other has it open): what is
    /// present is what the live bitmap says when it is of this boot (a
    /// mount killed with SIGKILL loses nothing it had fetched), else what
    /// the durable one says; blocks that are holes are not believed.
    pub(super) fn first(
        opts: &Options,
        label: &str,
        size: u64,
        n: &Names,
        file: File,
    ) -> Result<Cache> {
        let sized = file.metadata().is_ok_and(|m| m.len() == size);
        let block = kept_block(n, size)
            .filter(|_| sized)
            .unwrap_or(opts.block_size);
        let words = bitmap_words(size, block);
        let io = |what: &str, e: std::io::Error| fail(label, format!("cache: {what}: {e}"));
        let (live, kept) = match Live::open(&n.live, block, size, words, true) {
            Ok((l, kept)) => (Some(l), kept.filter(|_| sized)),
            Err(e) => {
                log::warn!("{label}: the cache cannot be shared with other mounts: {e}");
                (None, None)
            }
        };
        let from_live = kept.is_some();
        let saved = kept.or_else(|| load_bitmap(&n.blocks, block, size, words).filter(|_| sized));
        if saved.is_none()
            && let Some(why) = not_kept(&n.blocks, &file, block, size)
        {
            log::info!(
                "{label}: the cache file's blocks are not kept ({why}); they will be fetched again"
            );
        }
        let blocks = size.div_ceil(block);
        let sums = Sums::saved(&n.sums, blocks);
        let saved = match (saved, &sums) {
            (Some(bits), None) if bits.iter().any(|&w| w != 0) => {
                log::info!(
                    "{label}: the cache file's block sums are missing or not of its size \
                     (written by an older version, or damaged): its blocks will be fetched again"
                );
                None
            }
            (saved, _) => saved,
        };
        let kept_sums = saved.as_ref().and(sums);
        let present = match saved {
            Some(mut bits) => {
                let dropped = drop_holes(&file, &mut bits, block, size);
                if dropped > 0 {
                    log::warn!(
                        "{label}: the cache's bitmap claimed {dropped} blocks whose bytes are \
                         not on disk; they will be fetched again"
                    );
                }
                bits
            }
            None => {
                // Stale or new: start empty.
                file.set_len(0)
                    .map_err(|e| io(&format!("clearing {}", n.data.display()), e))?;
                vec![0; words]
            }
        };
        file.set_len(size)
            .map_err(|e| io(&format!("sizing {}", n.data.display()), e))?;
        if let Some(l) = &live {
            l.store(&present);
        }
        // Bits from the live bitmap may be of bytes not yet on disk: the
        // durable bitmap claims them only once they are.
        if from_live {
            file.sync_data()
                .map_err(|e| io(&format!("syncing {}", n.data.display()), e))?;
        }
        let sums = Sums::first(&n.sums, blocks, kept_sums)
            .map_err(|e| io(&n.sums.display().to_string(), e))?;
        let bitmap = write_bitmap(&n.blocks, block, size, &present)
            .map_err(|e| io(&n.blocks.display().to_string(), e))?;
        // Setup done: other mounts may join.
        flock(&file, libc::LOCK_SH);
        Ok(Cache {
            path: n.data.clone(),
            file,
            present,
            bitmap: Some(bitmap),
            live,
            sums,
            key: n.key,
            etag_mark: EtagMark::new(Some(n.etag.clone())),
            block,
        })
    }
}

/// Writes the durable bitmap at `path` (header and `words`); the file,
/// open for the commits that follow.
pub(super) fn write_bitmap(
    path: &Path,
    block: u64,
    size: u64,
    words: &[u64],
) -> std::io::Result<File> {
    // A new file renamed into place: a mount still holding the old one
    // (its cache file deleted since) saves its blocks there, not here.
    let tmp = crate::source::shared::new_beside(path)?;
    let mut head = Vec::with_capacity(BITMAP_HEADER as usize);
    head.extend_from_slice(BITMAP_MAGIC);
    head.extend_from_slice(&block.to_le_bytes());
    head.extend_from_slice(&size.to_le_bytes());
    let words_bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let f = tmp.as_file();
    f.set_len(BITMAP_HEADER + words_bytes.len() as u64)?;
    f.write_all_at(&head, 0)?;
    f.write_all_at(&words_bytes, BITMAP_HEADER)?;
    tmp.persist(path).map_err(|e| e.error)
}

pub(super) fn load_bitmap(path: &Path, block: u64, size: u64, words: usize) -> Option<Vec<u64>> {
    let b = crate::source::shared::read_exact_file(path, BITMAP_HEADER + words as u64 * 8)?;
    if bitmap_layout(&b)? != (block, size) {
        return None;
    }
    let rest = b.get(BITMAP_HEADER as usize..)?;
    if rest.len() != words * 8 {
        return None;
    }
    Some(
        rest.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect(),
    )
}

/// The block size and object size a saved bitmap's header names, when it
/// is one (its magic).
pub(super) fn bitmap_layout(b: &[u8]) -> Option<(u64, u64)> {
    let head = b.get(..BITMAP_HEADER as usize)?;
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
    (&head[..8] == BITMAP_MAGIC).then(|| (word(8), word(16)))
}

/// Why the blocks of a cache file that held some are not believed, when
/// neither bitmap was: its size, or the saved bitmap's layout.
pub(super) fn not_kept(blocks: &Path, data: &File, block: u64, size: u64) -> Option<String> {
    let len = data.metadata().ok()?.len();
    if len == 0 {
        return None;
    }
    if len != size {
        return Some(format!(
            "the cache file is {len} bytes, not the object's {size}"
        ));
    }
    let Some(head) = crate::source::shared::read_head::<{ BITMAP_HEADER as usize }>(blocks) else {
        return Some("its saved bitmap is missing or cannot be read".into());
    };
    match bitmap_layout(&head) {
        // Blocks of another size are fetched in that size (kept_block):
        // this bitmap claimed none.
        Some((kept, s)) if kept != block && s == size && valid_block(kept, size) => None,
        _ => Some("its saved bitmap is damaged or of another version".into()),
    }
}

/// The size of the blocks an object's cache file holds, when its live
/// bitmap (of this boot) or its saved one is of this object's size and
/// claims a block. A mount fetches that object in those blocks, whatever
/// its `-o block_size`: a remount, or a mount beside others, then fetches
/// nothing the file has. (Sums and bitmaps are per block: converting a
/// cache to another block size would read it all again to check it.)
pub(super) fn kept_block(n: &Names, size: u64) -> Option<u64> {
    let live = crate::source::shared::live_layout(&n.live);
    if let Some((block, s, any)) = live
        && s == size
        && valid_block(block, size)
    {
        return any.then_some(block);
    }
    let head = crate::source::shared::read_head::<{ BITMAP_HEADER as usize }>(&n.blocks)?;
    let (block, s) = bitmap_layout(&head)?;
    if s != size || !valid_block(block, size) {
        return None;
    }
    load_bitmap(&n.blocks, block, size, bitmap_words(size, block))?
        .iter()
        .any(|&w| w != 0)
        .then_some(block)
}

/// Words of a bitmap of an object of `size` bytes in blocks of `block`.
pub(super) fn bitmap_words(size: u64, block: u64) -> usize {
    size.div_ceil(block).div_ceil(64) as usize
}

/// Whether `-o block_size` may be `block`: a multiple of 64 KiB (so of
/// any page size) from 64 KiB to 256 MiB.
pub fn block_size_allowed(block: u64) -> bool {
    (64 << 10..=256 << 20).contains(&block) && block.is_multiple_of(64 << 10)
}

/// Whether an object of `size` bytes may be cached in blocks of `block`.
pub(super) fn valid_block(block: u64, size: u64) -> bool {
    block_size_allowed(block) && size.div_ceil(block) <= MAX_BLOCKS
}

/// Deletes the least recently used cache files (not `keep`, not in use)
/// until the rest take at most `budget` bytes on disk.
pub(super) fn evict(dir: &Path, budget: u64, keep: &str) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(i64, u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "data").then_some(())?;
            let m = e.metadata().ok()?;
            let used = p
                .with_extension("blocks")
                .metadata()
                .map_or(m.mtime(), |b| b.mtime());
            Some((used, m.blocks() * 512, p))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    if total <= budget {
        return;
    }
    files.sort();
    for (_, bytes, p) in files {
        if total <= budget {
            break;
        }
        if p.file_stem().is_some_and(|s| s == keep) {
            continue;
        }
        let Ok(f) = File::open(&p) else { continue };
        // SAFETY: flock on our own descriptor; a file another mount holds
        // is skipped.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        let _ = std::fs::remove_file(p.with_extension("blocks"));
        let _ = std::fs::remove_file(p.with_extension("live"));
        let _ = std::fs::remove_file(p.with_extension("sums"));
        if std::fs::remove_file(&p).is_ok() {
            let _ = std::fs::remove_file(p.with_extension("etag"));
            log::info!(
                "remote cache: removed {} ({bytes} bytes) to stay within the disk cache size",
                p.display()
            );
            total = total.saturating_sub(bytes);
        }
    }
}

/// The saved bitmap is committed once fetching paused this long, and at
/// least this often while it goes on: one fdatasync per 30 s of a long
/// fetch rather than one under every few blocks of it. A machine that
/// crashes in between loses the record of what was fetched since the last
/// commit (fetched again after the reboot), never the truth of what is
/// there; a daemon killed keeps it all (the live bitmap, in the page
/// cache).
pub(super) const COMMIT_QUIET: Duration = Duration::from_secs(1);
pub(super) const COMMIT_EVERY: Duration = Duration::from_secs(30);

/// What a commit does to the disk, in order.
pub(super) trait Disk {
    /// The cache file's bytes and their sums, to the disk.
    fn sync_data(&self) -> std::io::Result<()>;
    /// The bitmap's words, written.
    fn write_bits(&self, bytes: &[u8]) -> std::io::Result<()>;
    /// The bitmap, to the disk.
    fn sync_bits(&self) -> std::io::Result<()>;
}

pub(super) struct Files<'a> {
    pub(super) data: &'a File,
    pub(super) sums: &'a Sums,
    pub(super) bits: &'a File,
}

impl Disk for Files<'_> {
    fn sync_data(&self) -> std::io::Result<()> {
        self.data.sync_data()?;
        self.sums.sync()
    }

    fn write_bits(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.bits.write_all_at(bytes, BITMAP_HEADER)
    }

    fn sync_bits(&self) -> std::io::Result<()> {
        self.bits.sync_data()
    }
}

/// Saves `words`, a bitmap of blocks whose bytes were written to the cache
/// file, so that no bit reaches the disk before its block's bytes: after a
/// crash (of the machine, not only of the daemon) the bitmap may lack
/// blocks that are there, never claim ones that are not. The bytes are
/// synced first (one fdatasync for every block since the last commit);
/// a failed sync writes no bit.
pub(super) fn commit(disk: &impl Disk, words: &[u64]) -> std::io::Result<()> {
    disk.sync_data()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    disk.write_bits(&bytes)?;
    disk.sync_bits()
}

/// How many bytes from `off` on (at most `len`, within `size`) lie in
/// blocks of `block` bytes that `has`.
pub(super) fn present_run(
    has: impl Fn(u64) -> bool,
    block: u64,
    size: u64,
    off: u64,
    len: u64,
) -> u64 {
    let end = off.saturating_add(len).min(size);
    if off >= end {
        return 0;
    }
    let first_missing = (off / block..end.div_ceil(block)).find(|&b| !has(b));
    first_missing.map_or(end, |b| (b * block).max(off)) - off
}

/// Clears from `present` each block of `file` that is not all data on
/// disk (a hole in it): what a bitmap saved by a version that did not sync
/// first, or a file system that lost the bytes, may claim. Holes are what
/// a lost write leaves in a file grown by `set_len`; a file system that
/// cannot tell holes says none, and one that stores zeros as holes costs
/// those blocks a fetch again.
pub(super) fn drop_holes(file: &File, present: &mut [u64], block: u64, size: u64) -> u64 {
    let fd = file.as_raw_fd();
    let mut dropped = 0;
    for (wi, w) in present.iter_mut().enumerate() {
        let mut bits = *w;
        while bits != 0 {
            let bit = bits.trailing_zeros() as u64;
            bits &= bits - 1;
            let b = wi as u64 * 64 + bit;
            let (start, end) = (b * block, ((b + 1) * block).min(size));
            if start >= size {
                *w &= !(1 << bit);
                dropped += 1;
                continue;
            }
            let Ok(at) = libc::off_t::try_from(start) else {
                continue;
            };
            // SAFETY: lseek on our own descriptor; the offset is left
            // wherever, as every read and write here is positioned.
            let hole = unsafe { libc::lseek(fd, at, libc::SEEK_HOLE) };
            if hole >= 0 && (hole as u64) < end {
                *w &= !(1 << bit);
                dropped += 1;
            }
        }
    }
    dropped
}
