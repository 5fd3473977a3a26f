//! An XXH3-64 sum of each block of a remote object's cache file, so that
//! bytes changed on disk since they were fetched (a flipped bit, another
//! program writing into the file) are fetched again, never served. XXH3
//! rather than CRC-32C: it costs half the CPU per byte here (0.12 against
//! 0.22 s a GiB), on a path where the CPU is the bound.
//!
//! The sums live in `NAME.sums` beside the cache file, 8 bytes per block,
//! mapped `MAP_SHARED` by every mount of the object (a block's sum is
//! stored before its bit in the live bitmap is set, so a process that
//! sees the bit sees the sum), and synced with the cache file before the
//! saved bitmap claims the block. A sum that was lost fails its block's
//! check: the block is fetched again, which costs a request, never a wrong
//! byte (a sums file missing or of another size is not believed at all:
//! see `Cache::first` in remote/cache.rs). Each sum
//! is seeded with the block's number and the cache file's name, so that it
//! holds for those bytes in that place of that object's file only: blocks
//! swapped together with their sums, or another object's files copied
//! under this name, fail too.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::Xxh3;

/// The sums of one cache file's blocks: this process's own (a private
/// cache file), or those every mount of the file shares.
pub enum Sums {
    Own(Vec<AtomicU64>),
    Shared {
        /// Before `map`, so dropped before it is unmapped.
        _watch: Option<crate::sigbus::Watched>,
        map: memmap2::MmapMut,
        file: File,
        blocks: usize,
    },
}

impl Sums {
    /// Sums of a private cache file, all unknown.
    pub fn own(blocks: u64) -> Sums {
        Sums::Own((0..blocks).map(|_| AtomicU64::new(0)).collect())
    }

    /// The sums the file at `path` holds, when it has this layout.
    pub fn saved(path: &Path, blocks: u64) -> Option<Vec<u8>> {
        super::shared::read_exact_file(path, blocks.checked_mul(8)?)
    }

    /// The first mount of the cache file (alone): a new sums file put in
    /// place of the old one (a mount still mapping that one goes on with
    /// it, as with the bitmaps), holding `kept` (the old file's
    /// [`Sums::saved`], when the blocks present are believed).
    pub fn first(path: &Path, blocks: u64, kept: Option<Vec<u8>>) -> io::Result<Sums> {
        let tmp = super::shared::new_beside(path)?;
        tmp.as_file().set_len(blocks * 8)?;
        if let Some(b) = kept {
            tmp.as_file().write_all_at(&b, 0)?;
        }
        let file = tmp.persist(path).map_err(|e| e.error)?;
        Self::map(file, blocks)
    }

    /// A mount joining those that have the cache file open: their sums.
    pub fn join(path: &Path, blocks: u64) -> io::Result<Sums> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let m = file.metadata()?;
        if !m.is_file() || m.len() != blocks * 8 {
            return Err(io::Error::other(format!(
                "{} is not a block sums file of this size",
                path.display()
            )));
        }
        Self::map(file, blocks)
    }

    fn map(file: File, blocks: u64) -> io::Result<Sums> {
        let blocks = usize::try_from(blocks).map_err(io::Error::other)?;
        if blocks == 0 {
            return Ok(Sums::Own(Vec::new()));
        }
        // SAFETY: the file is sized to `blocks * 8` bytes before any
        // process maps it and never resized in place by us (a mount alone
        // puts a new file in its place instead); a page another program
        // takes away by cutting it is blanked by the watch below rather
        // than fault; its words are only changed through atomics.
        let mut map = unsafe { memmap2::MmapOptions::new().map_mut(&file)? };
        // Another program may still cut it short: a page that goes then
        // is blanked (its sums read as 0, their blocks fail their check
        // and are fetched again), not the end of the daemon.
        let watch = crate::sigbus::Watched::new(map.as_mut_ptr(), map.len());
        Ok(Sums::Shared {
            _watch: watch,
            map,
            file,
            blocks,
        })
    }

    /// Block `b`'s sum, as stored before its bit was set.
    pub fn get(&self, b: u64) -> Option<u64> {
        Some(self.slot(b)?.load(Ordering::Acquire))
    }

    /// Stores block `b`'s sum; before its bit is set.
    pub fn set(&self, b: u64, sum: u64) {
        if let Some(s) = self.slot(b) {
            s.store(sum, Ordering::Release);
        }
    }

    fn slot(&self, b: u64) -> Option<&AtomicU64> {
        let words: &[AtomicU64] = match self {
            Sums::Own(v) => v,
            Sums::Shared { map, blocks, .. } => {
                debug_assert!(map.len() >= blocks * 8);
                // SAFETY: the mapping holds `blocks * 8` bytes (checked at
                // open), page-aligned, so aligned for AtomicU64, which has
                // u64's layout; they live as long as `map`; every process
                // changes them only through atomics.
                unsafe { std::slice::from_raw_parts(map.as_ptr().cast::<AtomicU64>(), *blocks) }
            }
        };
        words.get(usize::try_from(b).ok()?)
    }

    /// The sums to the disk (before a saved bitmap claims their blocks).
    pub fn sync(&self) -> io::Result<()> {
        match self {
            Sums::Own(_) => Ok(()),
            Sums::Shared { file, .. } => file.sync_data(),
        }
    }
}

/// The hasher of block `b` of the cache file named by `key`.
fn hasher(key: u64, b: u64) -> Xxh3 {
    Xxh3::with_seed(key ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// The running sum of the block a body is being written into: the pieces
/// of a body come in order, and may end anywhere in a block.
pub struct Summing {
    key: u64,
    block: u64,
    size: u64,
    next: u64,
    hash: Xxh3,
}

impl Summing {
    /// For a body starting at block `first` of an object of `size` bytes
    /// in blocks of `block`, in the cache file named by `key`.
    pub fn new(key: u64, first: u64, block: u64, size: u64) -> Summing {
        Summing {
            key,
            block,
            size,
            next: first,
            hash: hasher(key, first),
        }
    }

    /// Adds `piece`, written at `at`, and calls `done(b, sum)` for each
    /// block it completes, in order.
    pub fn feed(&mut self, mut at: u64, mut piece: &[u8], mut done: impl FnMut(u64, u64)) {
        while !piece.is_empty() {
            let end = ((self.next + 1) * self.block).min(self.size);
            let take =
                usize::try_from(end.saturating_sub(at)).map_or(piece.len(), |n| n.min(piece.len()));
            if take == 0 {
                // Past the object's end: the caller refuses that body.
                return;
            }
            self.hash.update(&piece[..take]);
            at += take as u64;
            piece = &piece[take..];
            if at == end {
                done(self.next, self.hash.digest());
                self.next += 1;
                self.hash = hasher(self.key, self.next);
            }
        }
    }
}

/// Whether block `b` of `file` (the cache file named by `key`, blocks of
/// `block`, an object of `size` bytes) sums to `want`; an error reading
/// it is a failed check.
pub fn holds(
    file: &File,
    key: u64,
    (b, block, size): (u64, u64, u64),
    want: u64,
) -> io::Result<bool> {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    const PIECE: usize = 256 << 10;
    let (start, end) = (b * block, ((b + 1) * block).min(size));
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.resize(PIECE, 0);
        let mut hash = hasher(key, b);
        let mut at = start;
        while at < end {
            let n = usize::try_from(end - at).map_or(PIECE, |n| n.min(PIECE));
            file.read_exact_at(&mut buf[..n], at)?;
            hash.update(&buf[..n]);
            at += n as u64;
        }
        Ok(hash.digest() == want)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cut_anywhere_give_each_block_its_sum() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let (block, size) = (4096u64, data.len() as u64);
        let sum = |b: u64, c: &[u8]| {
            let mut h = hasher(7, b);
            h.update(c);
            h.digest()
        };
        let want: Vec<(u64, u64)> = data
            .chunks(block as usize)
            .enumerate()
            .map(|(i, c)| (i as u64, sum(i as u64, c)))
            .collect();
        for cut in [1usize, 100, 4095, 4096, 4097, 10_000] {
            let mut s = Summing::new(7, 0, block, size);
            let mut got = Vec::new();
            let mut at = 0;
            for piece in data.chunks(cut) {
                s.feed(at, piece, |b, sum| got.push((b, sum)));
                at += piece.len() as u64;
            }
            assert_eq!(got, want, "pieces of {cut}");
        }
        // A body starting at block 1.
        let mut s = Summing::new(7, 1, block, size);
        let mut got = Vec::new();
        s.feed(block, &data[block as usize..], |b, sum| got.push((b, sum)));
        assert_eq!(got, want[1..]);
    }

    #[test]
    fn a_block_changed_on_disk_or_in_another_place_fails_its_check() {
        let f = tempfile::tempfile().unwrap();
        let data = vec![7u8; 10_000];
        f.write_all_at(&data, 0).unwrap();
        // The sums of a body written whole, in the file named 7.
        let mut sums = Vec::new();
        Summing::new(7, 0, 4096, 10_000).feed(0, &data, |_, s| sums.push(s));
        assert!(holds(&f, 7, (1, 4096, 10_000), sums[1]).unwrap());
        // The same bytes in another block, or in another object's file.
        assert!(!holds(&f, 7, (0, 4096, 10_000), sums[1]).unwrap());
        assert!(!holds(&f, 8, (1, 4096, 10_000), sums[1]).unwrap());
        f.write_all_at(&[8], 5000).unwrap();
        assert!(!holds(&f, 7, (1, 4096, 10_000), sums[1]).unwrap());
        // The short last block.
        assert!(holds(&f, 7, (2, 4096, 10_000), sums[2]).unwrap());
    }

    #[test]
    fn shared_sums_are_seen_by_a_joining_mapping_and_kept_by_the_next_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.sums");
        let a = Sums::first(&p, 3, None).unwrap();
        a.set(1, 0xdead_beef_0000_0001);
        let b = Sums::join(&p, 3).unwrap();
        assert_eq!(b.get(1), Some(0xdead_beef_0000_0001));
        assert!(Sums::join(&p, 4).is_err(), "another layout is refused");
        drop((a, b));
        assert_eq!(Sums::saved(&p, 4), None, "another layout");
        let kept = Sums::saved(&p, 3);
        assert_eq!(
            Sums::first(&p, 3, kept).unwrap().get(1),
            Some(0xdead_beef_0000_0001)
        );
        assert_eq!(Sums::first(&p, 3, None).unwrap().get(1), Some(0));
        assert_eq!(Sums::own(2).get(2), None);
    }
}
