//! The filesystem as the kernel sees it, minus the kernel: lookups,
//! attributes, directory listings, opens and reads over the tree and the data
//! layer. `fuse.rs` only translates between this and fuser, so everything
//! here can be tested without a mount.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::data::{Bytes, Data, DataOptions};
use super::sidecar;
use super::stats::Stats;
use super::tree::{Content, Ino, NodeKind, Tree};
use crate::catalog::{Catalog, Codec, Part};
use crate::source::MappedFile;

pub type Errno = i32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
}

/// How the kernel should cache an opened file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Keep the page cache across opens: the bytes never change.
    KeepCache,
    /// Bypass the page cache (data read anew each time).
    DirectIo,
}

#[derive(Debug, Clone)]
pub struct FsOptions {
    pub data: DataOptions,
    /// Serve tensor data with direct I/O instead of the page cache.
    pub direct_io: bool,
}

/// An open generated file: its inode and the text it reads.
/// A `Vec`, not `[u8]`: made at its counted size and shared as is, with
/// no copy into a new allocation (index.json can be hundreds of MB).
type Text = Arc<Vec<u8>>;
type Held = (Ino, Text);

pub struct TensorFs {
    tree: Tree,
    data: Arc<Data>,
    direct_io: bool,
    /// Sizes of generated files, computed on first stat.
    sizes: Vec<OnceLock<u64>>,
    /// Contents of generated files, per open handle.
    handles: Mutex<HashMap<u64, Held>>,
    /// The render each open handle of a file shares (never changes, except
    /// stats), while one is open: `index.json` of a big file is tens of MB.
    shared: Mutex<HashMap<Ino, Weak<Vec<u8>>>>,
    /// Held while index.json is rendered for an open.
    index_render: Mutex<()>,
    next_fh: AtomicU64,
    /// Renders made, for the tests.
    #[cfg(test)]
    renders: AtomicU64,
}

impl TensorFs {
    /// Serves `catalog` from `files` (one per `catalog.sources`).
    pub fn new(
        catalog: Catalog,
        files: Vec<Option<MappedFile>>,
        opts: FsOptions,
    ) -> std::io::Result<TensorFs> {
        let tree = Tree::build(&catalog);
        for (t, p) in catalog.tensors.iter().zip(&tree.placements) {
            if let Some(why) = &p.escaped {
                log::warn!(
                    "{}: tensor {:?} is served as {:?}: {why}",
                    catalog.label,
                    t.name,
                    if p.path.is_empty() {
                        &p.sidecar
                    } else {
                        &p.path
                    }
                );
            }
        }
        let sizes = (0..tree.len()).map(|_| OnceLock::new()).collect();
        let data = Data::new(catalog, files, opts.data, Arc::new(Stats::default()))?;
        Ok(TensorFs {
            tree,
            data,
            direct_io: opts.direct_io,
            sizes,
            handles: Mutex::new(HashMap::new()),
            shared: Mutex::new(HashMap::new()),
            index_render: Mutex::new(()),
            next_fh: AtomicU64::new(1),
            #[cfg(test)]
            renders: AtomicU64::new(0),
        })
    }

    /// Switches tensor data to the page cache (for kernels that cannot mmap
    /// files opened with direct I/O).
    pub fn use_page_cache(&mut self) {
        self.direct_io = false;
    }

    pub fn serves_direct_io(&self) -> bool {
        self.direct_io
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    pub fn data(&self) -> &Data {
        &self.data
    }

    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr, Errno> {
        let name = name.to_str().ok_or(libc::ENOENT)?;
        let ino = self.tree.lookup(parent, name).ok_or(libc::ENOENT)?;
        self.getattr(ino)
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr, Errno> {
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        Ok(match &node.kind {
            NodeKind::Dir { .. } => Attr {
                ino,
                kind: Kind::Dir,
                size: 0,
                perm: 0o555,
                nlink: 2 + self.tree.subdirs(ino) as u32,
            },
            NodeKind::File(c) => Attr {
                ino,
                kind: Kind::File,
                size: self.size_of(ino, c),
                perm: 0o444,
                nlink: 1,
            },
        })
    }

    fn size_of(&self, ino: Ino, c: &Content) -> u64 {
        match c {
            Content::Part { tensor, part } => self.part(*tensor, *part).map_or(0, |p| p.nbytes),
            // Changes all the time: read it with direct I/O, like /proc.
            Content::Stats => 0,
            // Counted, not kept: the text is made when a file is opened.
            _ => *self.sizes[(ino - 1) as usize].get_or_init(|| {
                let mut n = sidecar::Counter::default();
                self.render_to(c, &mut n);
                n.0
            }),
        }
    }

    fn part(&self, ti: usize, pi: usize) -> Option<&Part> {
        self.data
            .catalog()
            .tensors
            .get(ti)?
            .parts
            .as_ref()
            .ok()?
            .get(pi)
    }

    /// Text of generated file `ino`, in a buffer of exactly its size;
    /// ENOMEM, not an abort, when that much memory cannot be had (a
    /// hostile index can make index.json many times its own size).
    fn render(&self, ino: Ino, c: &Content) -> Result<Vec<u8>, Errno> {
        let size = match c {
            Content::Stats => 0,
            _ => self.size_of(ino, c),
        };
        let mut out = Vec::new();
        if usize::try_from(size)
            .ok()
            .and_then(|n| out.try_reserve_exact(n).ok())
            .is_none()
        {
            log::error!(
                "{}: cannot allocate {size} bytes for a generated file (inode {ino})",
                self.data.catalog().label
            );
            return Err(libc::ENOMEM);
        }
        self.render_to(c, &mut out);
        #[cfg(test)]
        self.renders.fetch_add(1, Relaxed);
        Ok(out)
    }

    /// [`TensorFs::render`] into `w`.
    fn render_to(&self, c: &Content, w: &mut impl std::io::Write) {
        let cat = self.data.catalog();
        match c {
            Content::Sidecar { tensor, part: None } => sidecar::render_to(
                w,
                &sidecar::tensor_sidecar(
                    cat,
                    &cat.tensors[*tensor],
                    &self.tree.placements[*tensor],
                ),
            ),
            Content::Sidecar {
                tensor,
                part: Some(p),
            } => {
                let t = &cat.tensors[*tensor];
                if let Some(part) = self.part(*tensor, *p) {
                    sidecar::render_to(
                        w,
                        &sidecar::part_sidecar(cat, t, part, &self.tree.placements[*tensor].path),
                    )
                }
            }
            Content::Index => sidecar::index_to(w, cat, &self.tree.placements),
            Content::Stats => {
                let _ = w.write_all(&self.data.stats().render(&self.data.cache().gauges()));
            }
            Content::Part { .. } => {}
        }
    }

    /// Entries of directory `ino` from position `offset` on: (ino, kind, name).
    /// Positions count `.` and `..` first.
    pub fn readdir(
        &self,
        ino: Ino,
        offset: u64,
        mut add: impl FnMut(u64, Ino, Kind, &str) -> bool,
    ) -> Result<(), Errno> {
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        let NodeKind::Dir { entries, .. } = &node.kind else {
            return Err(libc::ENOTDIR);
        };
        let dots = [(ino, "."), (node.parent, "..")];
        let all = dots
            .iter()
            .map(|&(i, n)| (i, n))
            .chain(entries.iter().map(|(n, i)| (*i, &**n)));
        for (pos, (child, name)) in all.enumerate().skip(offset as usize) {
            let kind = if matches!(
                self.tree.node(child).map(|n| &n.kind),
                Some(NodeKind::Dir { .. })
            ) {
                Kind::Dir
            } else {
                Kind::File
            };
            if add(pos as u64 + 1, child, kind, name) {
                break;
            }
        }
        Ok(())
    }

    /// Opens a file for reading: (handle, cache mode).
    pub fn open(&self, ino: Ino, write: bool) -> Result<(u64, CacheMode), Errno> {
        if write {
            return Err(libc::EROFS);
        }
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        match &node.kind {
            NodeKind::Dir { .. } => Err(libc::EISDIR),
            NodeKind::File(Content::Part { tensor, part }) => {
                // Decoded data is worth keeping: a second read from the page
                // cache beats decoding again or copying from our cache.
                let zstd = self.part(*tensor, *part).is_some_and(|p| {
                    !matches!(self.data.catalog().blobs[p.blob].codec, Codec::Raw)
                });
                let mode = if self.direct_io && !zstd {
                    CacheMode::DirectIo
                } else {
                    CacheMode::KeepCache
                };
                Ok((0, mode))
            }
            NodeKind::File(c) => {
                let fh = self.next_fh.fetch_add(1, Relaxed);
                let bytes = self.rendered(ino, c)?;
                self.handles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(fh, (ino, bytes));
                Ok((
                    fh,
                    if *c == Content::Stats {
                        CacheMode::DirectIo
                    } else {
                        CacheMode::KeepCache
                    },
                ))
            }
        }
    }

    /// The text of generated file `ino`, shared with its other open handles.
    fn rendered(&self, ino: Ino, c: &Content) -> Result<Text, Errno> {
        if *c == Content::Stats {
            return self.render(ino, c).map(Arc::new);
        }
        let shared = || self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = shared().get(&ino).and_then(Weak::upgrade) {
            return Ok(b);
        }
        // index.json can be hundreds of MB: first opens at once wait for one
        // render instead of each making its own. Sidecars are small and
        // rendered unlocked, so opens of other files never wait for them.
        let _one = (*c == Content::Index)
            .then(|| self.index_render.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(b) = shared().get(&ino).and_then(Weak::upgrade) {
            return Ok(b);
        }
        let mine = Arc::new(self.render(ino, c)?);
        let mut shared = shared();
        // Another open may have rendered it meanwhile: share that one.
        if let Some(b) = shared.get(&ino).and_then(Weak::upgrade) {
            return Ok(b);
        }
        shared.insert(ino, Arc::downgrade(&mine));
        Ok(mine)
    }

    pub fn release(&self, fh: u64) {
        if fh == 0 {
            return;
        }
        let gone = self
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh);
        if let Some((ino, bytes)) = gone {
            drop(bytes);
            // Its last handle closed: forget the render (a `Weak` keeps the
            // allocation). An open that shares it holds `shared` meanwhile.
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            if shared.get(&ino).is_some_and(|w| w.strong_count() == 0) {
                shared.remove(&ino);
            }
        }
    }

    /// Bytes `[off, off+size)` of file `ino` opened as `fh`. A data error is
    /// logged by the data layer and becomes EIO.
    pub fn read(&self, ino: Ino, fh: u64, off: u64, size: u32) -> Result<Bytes<'_>, Errno> {
        Stats::add(&self.data.stats().reads, 1);
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        match &node.kind {
            NodeKind::Dir { .. } => Err(libc::EISDIR),
            NodeKind::File(Content::Part { tensor, part }) => self
                .data
                .read(*tensor, *part, off, size as u64)
                .map_err(|_| libc::EIO),
            NodeKind::File(c) => {
                let held = self
                    .handles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&fh)
                    .map(|(_, b)| b.clone());
                // A read without our open (e.g. after a restart) shares the
                // text of the open handles, or renders it anew.
                let bytes = match held {
                    Some(b) => b,
                    None => self.rendered(ino, c)?,
                };
                let start = (off as usize).min(bytes.len());
                let end = start.saturating_add(size as usize).min(bytes.len());
                Ok(Bytes::Owned(bytes[start..end].to_vec()))
            }
        }
    }

    /// (total blocks of 4 KiB, number of inodes) for statfs.
    pub fn statfs(&self) -> (u64, u64) {
        (
            self.data
                .catalog()
                .blobs
                .iter()
                .map(|b| b.decoded_len.div_ceil(4096))
                .sum(),
            self.tree.len() as u64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::data::{DataOptions, PROGRESSIVE_MIN};
    use crate::mount::tree::{META_DIR, ROOT};

    fn fs_of(dir: &std::path::Path) -> TensorFs {
        fs_with(dir, 0)
    }

    /// "w" and `more` tensors of one byte.
    fn fs_with(dir: &std::path::Path, more: usize) -> TensorFs {
        let names: Vec<String> = (0..more).map(|i| format!("t{i}")).collect();
        let mut tensors: Vec<(&str, &[u8])> = vec![("w", &[1, 2, 3, 4])];
        tensors.extend(names.iter().map(|n| (n.as_str(), &[7u8][..])));
        let (catalog, files) = crate::mount::testing::catalog_of(dir, &tensors);
        let opts = FsOptions {
            data: DataOptions {
                cache_size: 8 << 20,
                cache_dir: dir.to_path_buf(),
                verify_raw: true,
                progressive_min: PROGRESSIVE_MIN,
            },
            direct_io: true,
        };
        TensorFs::new(catalog, files, opts).unwrap()
    }

    #[test]
    fn open_handles_of_a_generated_file_share_one_render() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_of(dir.path());
        let meta = fs.lookup(ROOT, OsStr::new(META_DIR)).unwrap().ino;
        let index = fs.lookup(meta, OsStr::new("index.json")).unwrap().ino;
        let (a, _) = fs.open(index, false).unwrap();
        let (b, _) = fs.open(index, false).unwrap();
        let held = |fh| fs.handles.lock().unwrap()[&fh].1.clone();
        assert!(Arc::ptr_eq(&held(a), &held(b)), "two renders for two opens");
        assert_eq!(&*fs.read(index, a, 0, 1 << 20).unwrap(), &*held(a));
        fs.release(a);
        assert_eq!(fs.shared.lock().unwrap().len(), 1, "b still open");
        fs.release(b);
        assert!(fs.shared.lock().unwrap().is_empty(), "nothing left open");
        // Stats change: each open renders its own.
        let stats = fs.lookup(meta, OsStr::new("stats")).unwrap().ino;
        let (c, _) = fs.open(stats, false).unwrap();
        let (d, _) = fs.open(stats, false).unwrap();
        assert!(!Arc::ptr_eq(&held(c), &held(d)));
    }

    #[test]
    fn a_text_too_big_to_allocate_is_enomem_not_an_abort() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_of(dir.path());
        // Found without a stat, which would count its size.
        let w_json = fs.tree.lookup(ROOT, "w.json").unwrap();
        // As if its counted size were beyond any allocation.
        fs.sizes[(w_json - 1) as usize].set(u64::MAX).unwrap();
        assert_eq!(fs.open(w_json, false).unwrap_err(), libc::ENOMEM);
        assert!(matches!(fs.read(w_json, 12345, 0, 10), Err(libc::ENOMEM)));
    }

    #[test]
    fn first_opens_at_once_share_one_text_and_sizes_match_it() {
        let dir = tempfile::tempdir().unwrap();
        // Enough tensors that a render takes a while: opens overlap.
        let fs = fs_with(dir.path(), 20_000);
        let meta = fs.lookup(ROOT, OsStr::new(META_DIR)).unwrap().ino;
        let index = fs.lookup(meta, OsStr::new("index.json")).unwrap().ino;
        let before = fs.renders.load(Relaxed);
        let start = std::sync::Barrier::new(8);
        let texts: Vec<Text> = std::thread::scope(|s| {
            let opens: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        fs.open(index, false).unwrap().0
                    })
                })
                .collect();
            let fhs: Vec<u64> = opens.into_iter().map(|h| h.join().unwrap()).collect();
            let held = fs.handles.lock().unwrap();
            fhs.iter().map(|fh| held[fh].1.clone()).collect()
        });
        assert!(texts.iter().all(|t| Arc::ptr_eq(t, &texts[0])));
        assert_eq!(fs.renders.load(Relaxed) - before, 1, "renders for 8 opens");
        // Made at its counted size: no spare capacity.
        assert_eq!(texts[0].capacity(), texts[0].len());
        // The size a stat gives (counted, never kept) is the text's length,
        // for index.json and for sidecars.
        let w_json = fs.lookup(ROOT, OsStr::new("w.json")).unwrap().ino;
        for ino in [index, w_json] {
            let size = fs.getattr(ino).unwrap().size;
            let (fh, _) = fs.open(ino, false).unwrap();
            let text = fs.read(ino, fh, 0, 1 << 24).unwrap();
            assert_eq!(size, text.len() as u64);
            assert!(serde_json::from_slice::<serde_json::Value>(&text).is_ok());
        }
    }
}
