//! The filesystem as the kernel sees it, minus the kernel: lookups,
//! attributes, directory listings, opens and reads over the tree and the data
//! layer. `fuse.rs` only translates between this and fuser, so everything
//! here can be tested without a mount.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::activity::Busy;
use super::backing::{
    Backing, BackingOptions, Backings, Behind, Fill, Filled, Origin, Partial, Segment, Through,
};
use super::sidecar;
use super::tree::{Content, Ino, NodeKind, Tree};
use super::warmer::CloneJob;
use crate::catalog::{Catalog, Codec, Part};
use crate::serve::data::{Bytes, Data, DataOptions, Hold, scratch};
use crate::serve::stats::Stats;
use crate::source::MappedFile;
use crate::views::{self, Composed, Entry, ViewSet, Views};

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

/// How an opened file is read.
#[derive(Clone, Debug)]
pub enum Open {
    /// By the daemon, cached by the kernel as the mode says.
    Served(CacheMode),
    /// By the kernel itself, from this file (FUSE passthrough).
    Backed(Arc<Backing>),
}

/// The bytes of one read, for its reply; handed back to
/// [`TensorFs::served`] once the reply is out.
pub struct Served<'a> {
    bytes: Bytes<'a>,
    /// The file's inode and the backing file the bytes are written to.
    through: Option<(Ino, Through)>,
    /// Counts the read as served until it is dropped, after its reply.
    _busy: Option<Busy<'a>>,
}

impl std::ops::Deref for Served<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Where a read's bytes go in a backing file, and what to tell once
/// they are written there.
struct WriteThrough {
    data: Arc<Data>,
    backings: Arc<Backings>,
    ino: Ino,
    off: u64,
    /// The tensor part the read met first: (tensor, part, where it starts
    /// in the file, its length); `None` for a read of a view's header.
    part: Option<(usize, usize, u64, u64)>,
}

impl WriteThrough {
    /// Writes `bytes` to `p`'s file, then drops the page cache and the
    /// decoded frames well behind the reader. False when they could not be
    /// written (the file sealed, a full disk).
    fn write(&self, p: &Through, bytes: Bytes<'_>) -> bool {
        let end = self.off + bytes.len() as u64;
        let Some(written) = p.offer(self.off, &bytes) else {
            return false;
        };
        // Let go of the frames first: a held one stays cached.
        drop(bytes);
        self.written(p, end, written, true);
        true
    }

    /// The read's bytes, up to `end`, are in `p`'s file, which holds
    /// `[from, to)` around them: drops the page cache behind the reader,
    /// and (`frames`) lets the decoded frames behind it leave the cache.
    fn written(&self, p: &Through, end: u64, (from, to): (u64, u64), frames: bool) {
        if let Some(range) = p.behind(self.off, (from, to)) {
            self.backings.drop_behind(self.ino, range);
        }
        let Some((tensor, part, start, len)) = self.part else {
            return;
        };
        // In the part's own offsets: what this read touched, and all that
        // is written around it.
        let inside = |x: u64| (x.max(start) - start).min(len);
        if frames && end > start {
            self.data.written(
                tensor,
                part,
                (inside(self.off), inside(end)),
                (inside(from), inside(to)),
            );
        }
    }
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
    /// Which views to make.
    pub views: Views,
    /// Answer extended attributes (else ENOSYS, which the kernel remembers:
    /// no xattr request reaches the daemon again).
    pub xattrs: bool,
    /// Backing files for passthrough.
    pub backing: BackingOptions,
}

/// An open handle of a tensor or view file.
struct OpenFile {
    ino: Ino,
    /// Its backing when the kernel reads it.
    backing: Option<Arc<Backing>>,
    /// The backing file its reads write through to, when the daemon
    /// serves it and its bytes take work.
    partial: Option<Arc<Partial>>,
    /// The spill its reads come from, held while it is read (see
    /// `TensorFs::hold_spill`): (tensor, part, the hold).
    reading: Option<Reading>,
    /// Bytes served through it.
    read: u64,
    /// When it was last read.
    last_read: std::time::Instant,
}

/// A spill an open holds while it reads: (tensor, part, the hold).
type Reading = (usize, usize, Hold);

/// Open handles of tensor and view files.
#[derive(Default)]
struct Opens {
    by_fh: HashMap<u64, OpenFile>,
    /// Handles the daemon serves, by inode. While one is open its inode is
    /// not passed through: the kernel refuses (EIO) a passthrough open of an
    /// inode with page-cache opens or mappings.
    served: HashMap<Ino, usize>,
    /// Bytes the daemon has served of each inode since mount (what the
    /// page cache served again is not among them).
    served_bytes: HashMap<Ino, u64>,
    /// Last served handles of an inode closed whose fill is not decided
    /// yet: counted as served, so that no reader of `.ztensor/stats` sees
    /// neither an open nor a fill between the close and the fill's start.
    closing: usize,
}

/// An open generated file: its inode and the text it reads.
/// A `Vec`, not `[u8]`: made at its counted size and shared as is, with
/// no copy into a new allocation (index.json can be hundreds of MB).
type Text = Arc<Vec<u8>>;
type Held = (Ino, Text);

pub struct TensorFs {
    /// Shared with the thread that lays out the views' mirrors after
    /// mount (see [`TensorFs::views_layout`]).
    tree: Arc<Tree>,
    data: Arc<Data>,
    xattrs: bool,
    backings: Arc<Backings>,
    /// Writes served bytes into backing files, after the reply.
    write_behind: super::write_behind::WriteBehind,
    /// Whether the kernel takes backing files (set once it said so).
    passthrough: std::sync::atomic::AtomicBool,
    /// Shared with the data layer's hook that lets go of idle readers'
    /// spills (see [`let_go_of_idle_spills`]).
    opens: Arc<Mutex<Opens>>,
    direct_io: bool,
    /// Sizes of generated files, computed on first stat: of the nodes
    /// made at mount, then (made with them) of the views' mirrors.
    sizes: Vec<OnceLock<u64>>,
    mirror_sizes: OnceLock<Vec<OnceLock<u64>>>,
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

/// The views `on` names, made of `catalog`. The safetensors view compares
/// its header with the first source file's own (a remote object's is in
/// its cache file since the index was read).
fn make_views(catalog: &Catalog, files: &[Option<MappedFile>], on: Views) -> ViewSet {
    let first = files.first().and_then(Option::as_ref);
    let read_at = |buf: &mut [u8], at: u64| match first {
        Some(f) => {
            f.ensure(at, buf.len() as u64)
                .map_err(std::io::Error::other)?;
            f.file().read_exact_at(buf, at)
        }
        None => Err(std::io::ErrorKind::NotFound.into()),
    };
    let src = views::Source {
        catalog,
        file: first.map(|f| (f.len(), &read_at as _)),
    };
    ViewSet::make(on, &src)
}

impl TensorFs {
    /// Serves `catalog` from `files` (one per `catalog.sources`).
    pub fn new(
        catalog: Catalog,
        files: Vec<Option<MappedFile>>,
        opts: FsOptions,
    ) -> std::io::Result<TensorFs> {
        let on = opts.views;
        let catalog = Arc::new(catalog);
        // The views are made on a second core while the tree is built: the
        // safetensors view's header, like the tree, is a pass over every
        // tensor.
        let (made, tree) = std::thread::scope(|s| {
            let made = s.spawn(|| make_views(&catalog, &files, on));
            let tree = Tree::build(catalog.clone(), on);
            (made.join(), tree)
        });
        let made = made.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let mut tree = if made.on() == on {
            tree
        } else {
            // Rare: built again without the directories of the views that
            // could not be made.
            Tree::build(catalog.clone(), made.on())
        };
        tree.add_views(Arc::new(made));
        for (t, p) in catalog.tensors.iter().zip(&tree.placements) {
            if let Err(why) = &t.parts {
                log::warn!(
                    "{}: tensor {:?} is listed, not served: {why}",
                    catalog.label,
                    t.name
                );
            }
            if let Some(why) = &p.escaped {
                log::warn!(
                    "{}: tensor {:?} is served as {:?}: {why}",
                    catalog.label,
                    t.name,
                    tree.path(if p.file == 0 { p.sidecar } else { p.file })
                );
            }
        }
        let sizes = (0..tree.main_len()).map(|_| OnceLock::new()).collect();
        // Owned bytes waiting to be written: outside the cache's count, so
        // a small share of it.
        let write_behind =
            super::write_behind::WriteBehind::new((opts.data.cache_size / 8).min(16 << 20));
        let stats = Arc::new(Stats::default());
        let data = Data::new(catalog, files, opts.data, stats.clone())?;
        let disk = data.decoded_disk();
        disk.set_limit(opts.backing.limit);
        let backings = Arc::new(Backings::new(opts.backing, stats, disk));
        let tree = Arc::new(tree);
        let opens = Arc::new(Mutex::new(Opens::default()));
        // A spill may take the share of the files being written of what
        // shows its tensor (its own file, a view's) that could never be
        // kept beside it, and of the spills idle readers hold.
        let (files, of, shown, readers) = (
            Arc::downgrade(&backings),
            Arc::downgrade(&data),
            Arc::downgrade(&tree),
            Arc::downgrade(&opens),
        );
        data.on_spill_reserved(Box::new(move |bi| {
            let (Some(files), Some(data), Some(tree), Some(readers)) = (
                files.upgrade(),
                of.upgrade(),
                shown.upgrade(),
                readers.upgrade(),
            ) else {
                return false;
            };
            if let_go_of_idle_spills(&readers) {
                return true;
            }
            // The tensor's own file (never written: the spill becomes its
            // backing), and views' files that could never be kept beside
            // the spill; others wait for idle spills and files to make room.
            let disk = data.decoded_disk();
            let decoded = data.catalog().blobs.get(bi).map_or(0, |b| b.decoded_len);
            files.give_up_writing(|c, len| {
                let never =
                    matches!(c, Content::Part { .. }) || len.saturating_add(decoded) > disk.limit();
                never
                    && any_part_of(&tree, &data, c, |t, p| {
                        part_of(&data, t, p).is_some_and(|p| p.blob == bi)
                    })
            })
        }));
        let named = Arc::downgrade(&tree);
        backings.name_files_with(Box::new(move |ino| {
            named.upgrade().map_or_else(String::new, |t| t.path(ino))
        }));
        // Filled files that need room may take an idle spill's share.
        let spills = Arc::downgrade(&data);
        backings.on_spills_full(Box::new(move || {
            spills.upgrade().is_some_and(|d| d.drop_an_idle_spill())
        }));
        // A spill that does not fit may take the disk of filled backing
        // files no open holds: both live in `--cache-dir`.
        let weak = Arc::downgrade(&backings);
        data.on_disk_full(Box::new(move || {
            weak.upgrade().is_some_and(|b| b.drop_idle())
        }));
        Ok(TensorFs {
            backings,
            write_behind,
            passthrough: std::sync::atomic::AtomicBool::new(false),
            opens,
            xattrs: opts.xattrs,
            tree,
            data,
            direct_io: opts.direct_io,
            sizes,
            mirror_sizes: OnceLock::new(),
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

    /// Lays out the `.npy` and `.zarr` mirrors, for a thread to run once
    /// the mount is live: the first lookup in a view then finds them made
    /// (or waits for them) rather than making them itself.
    pub fn views_layout(&self) -> impl FnOnce() + Send + 'static {
        let tree = self.tree.clone();
        move || tree.lay_out_views()
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    pub fn data(&self) -> &Data {
        &self.data
    }

    /// Where to say that a backing file is complete (see [`Filled`]).
    pub fn filled_hook(&self) -> Filled {
        self.backings.filled_hook()
    }

    /// Where to say which page cache to drop behind a reader (see
    /// [`Behind`]).
    pub fn behind_hook(&self) -> Behind {
        self.backings.behind_hook()
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
            Content::ViewData { .. } => self.composed(c).map_or(0, |f| f.size),
            // Changes all the time: read it with direct I/O, like /proc.
            Content::Stats | Content::Errors => 0,
            // Counted, not kept: the text is made when a file is opened.
            _ => {
                let count = || {
                    let mut n = sidecar::Counter::default();
                    self.render_to(c, &mut n);
                    n.0
                };
                match self.size_slot(ino) {
                    Some(slot) => *slot.get_or_init(count),
                    None => count(),
                }
            }
        }
    }

    /// Where the size of generated file `ino` is kept.
    fn size_slot(&self, ino: Ino) -> Option<&OnceLock<u64>> {
        let i = (ino as usize).checked_sub(1)?;
        match i.checked_sub(self.sizes.len()) {
            None => self.sizes.get(i),
            Some(j) => self
                .mirror_sizes
                .get_or_init(|| {
                    let n = self.tree.len() - self.tree.main_len();
                    (0..n).map(|_| OnceLock::new()).collect()
                })
                .get(j),
        }
    }

    fn part(&self, ti: usize, pi: usize) -> Option<&Part> {
        part_of(&self.data, ti, pi)
    }

    /// What file `c` is made of, when it is a view's file of tensors'
    /// bytes.
    fn composed(&self, c: &Content) -> Option<Composed<'_>> {
        composed_of(&self.tree, &self.data, c)
    }

    /// Bytes `[off, off+size)` of a view's file `f`: its header, then the
    /// tensors of its entries (each its part 0). A read within one tensor
    /// is that tensor's own read (zero-copy where it is); one across a
    /// boundary is put together.
    fn read_composite(&self, f: &Composed<'_>, off: u64, size: u32) -> Result<Bytes<'_>, Errno> {
        let (header, entries) = (&*f.header, &*f.entries);
        let end = off.saturating_add(size as u64);
        let within = |e: &&Entry| e.start <= off && end <= e.start + e.len;
        // The entries are in order: the first that ends past `off` found by
        // halving, not by a walk (a view of 10^5 tensors is read at every
        // offset).
        let first = entries.partition_point(|e| e.start + e.len <= off);
        if off >= header.len() as u64
            && let Some(e) = entries.get(first).filter(within)
        {
            return self
                .data
                .read(e.tensor, 0, off - e.start, size as u64)
                .map_err(|e| e.errno());
        }
        let mut out = scratch::take();
        out.reserve(size as usize);
        let h = header.len() as u64;
        if off < h {
            out.extend_from_slice(&header[off as usize..end.min(h) as usize]);
        }
        for e in &entries[first..] {
            if e.start >= end {
                break;
            }
            let from = off.max(e.start);
            let to = end.min(e.start + e.len);
            if from >= to {
                continue;
            }
            let b = self
                .data
                .read(e.tensor, 0, from - e.start, to - from)
                .map_err(|e| e.errno())?;
            out.extend_from_slice(&b);
        }
        Ok(Bytes::Owned(out))
    }

    /// Text of generated file `ino`, in a buffer of exactly its size;
    /// ENOMEM, not an abort, when that much memory cannot be had (a
    /// hostile index can make index.json many times its own size).
    fn render(&self, ino: Ino, c: &Content) -> Result<Vec<u8>, Errno> {
        let size = match c {
            Content::Stats | Content::Errors => 0,
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
            Content::Sidecar { tensor, part: None } => {
                let path = self.tree.path_of(*tensor);
                let at = &self.tree.placements[*tensor];
                let views = self.tree.views_of(*tensor);
                let t = &cat.tensors[*tensor];
                sidecar::render_to(w, &sidecar::tensor_sidecar(cat, t, &path, at, views))
            }
            Content::Sidecar {
                tensor,
                part: Some(p),
            } => {
                let t = &cat.tensors[*tensor];
                if let Some(part) = self.part(*tensor, *p) {
                    sidecar::render_to(
                        w,
                        &sidecar::part_sidecar(cat, t, part, &self.tree.path_of(*tensor)),
                    )
                }
            }
            Content::Index => sidecar::index_to(w, cat, &self.tree),
            Content::Stats => {
                // Opens first, then fills: a fill a close starts is queued
                // before that close stops counting as an open, so a reader
                // that sees neither has truly nothing in flight.
                let (served, backed) = {
                    let o = super::lock(&self.opens);
                    let held = o.served.values().sum::<usize>();
                    ((held + o.closing) as u64, (o.by_fh.len() - held) as u64)
                };
                let (filled, filling) = self.backings.gauges();
                let more = [
                    ("backing_bytes_now", filled),
                    ("spill_bytes_now", self.data.decoded_disk().spills()),
                    ("backing_filling", filling),
                    ("backing_warming", self.backings.warming()),
                    ("open_files_served", served),
                    ("open_files_backed", backed),
                ];
                let _ = w.write_all(&self.data.stats().render(&self.data.cache().gauges(), &more));
            }
            Content::Errors => {
                let _ = w.write_all(&self.data.errors_text());
            }
            Content::ViewText { view, file } => {
                if let Some(v) = self.tree.views().get(*view) {
                    let _ = w.write_all(&v.text(cat, *file));
                }
            }
            Content::Part { .. } | Content::ViewData { .. } => {}
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

    /// Opens a file for reading: (handle, how it is read).
    pub fn open(&self, ino: Ino, write: bool) -> Result<(u64, Open), Errno> {
        if write {
            return Err(libc::EROFS);
        }
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        let fh = self.next_fh.fetch_add(1, Relaxed);
        match &node.kind {
            NodeKind::Dir { .. } => Err(libc::EISDIR),
            NodeKind::File(c @ (Content::Part { .. } | Content::ViewData { .. })) => {
                let backing = self.backing(ino, c)?;
                let mut opens = super::lock(&self.opens);
                let mut open = OpenFile {
                    ino,
                    backing: None,
                    partial: None,
                    reading: None,
                    read: 0,
                    last_read: std::time::Instant::now(),
                };
                if let Some(b) = backing.filter(|_| !opens.served.contains_key(&ino)) {
                    self.backings.opened(&b);
                    open.backing = Some(b.clone());
                    opens.by_fh.insert(fh, open);
                    return Ok((fh, Open::Backed(b)));
                }
                drop(opens);
                let mode = self.cache_mode(c);
                if mode == CacheMode::KeepCache {
                    self.sources_unchanged(c)?;
                }
                open.partial = self.write_through(ino, c);
                let mut opens = super::lock(&self.opens);
                *opens.served.entry(ino).or_default() += 1;
                self.backings.served_inodes(opens.served.len());
                opens.by_fh.insert(fh, open);
                Stats::add(&self.data.stats().fuse_opens, 1);
                Ok((fh, Open::Served(mode)))
            }
            NodeKind::File(c) => {
                let bytes = self.rendered(ino, c)?;
                self.handles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(fh, (ino, bytes));
                Ok((
                    fh,
                    Open::Served(if matches!(c, Content::Stats | Content::Errors) {
                        CacheMode::DirectIo
                    } else {
                        CacheMode::KeepCache
                    }),
                ))
            }
        }
    }

    /// Whether the files of the tensors files of content `c` show are as
    /// they were at mount, else the errno a read would get (`ESTALE` once
    /// one changed). Asked at an open that keeps the kernel's page cache:
    /// its reads of cached pages never reach the daemon, which would
    /// otherwise not see a change the cache predates.
    fn sources_unchanged(&self, c: &Content) -> Result<(), Errno> {
        let mut verdict = Ok(());
        self.any_part(c, |t, p| {
            verdict = self.data.source_verdict(t, p).map_err(|e| e.errno());
            verdict.is_err()
        });
        verdict
    }

    /// How the daemon serves a tensor or view file.
    fn cache_mode(&self, c: &Content) -> CacheMode {
        // Decoded data is worth keeping: a second read from the page
        // cache beats decoding again or copying from our cache. With
        // passthrough a backing file keeps it instead (filled after this
        // open), and the kernel's copy into its own cache would only cost
        // the first read a quarter of its speed and the memory twice.
        let decoded = self
            .one_part(c)
            .and_then(|(t, part, _)| self.part(t, part))
            .is_some_and(|p| !matches!(self.data.catalog().blobs[p.blob].codec, Codec::Raw));
        if self.direct_io && (!decoded || self.passthrough()) {
            CacheMode::DirectIo
        } else {
            CacheMode::KeepCache
        }
    }

    /// Sets the most backing files at once, and half as many spills (each
    /// holds a descriptor; unbounded until set).
    pub fn limit_files(&self, backing_files: usize) {
        self.backings.set_max_files(backing_files);
        self.data.set_max_spills(backing_files / 2);
    }

    /// The kernel takes backing files (or, with `false`, refused one: from
    /// now on every open is served by the daemon).
    pub fn set_passthrough(&self, on: bool) {
        self.passthrough
            .store(on && self.backings.enabled(), Relaxed);
        self.data.set_units_in_files(self.passthrough());
        self.data
            .stats()
            .passthrough
            .store(self.passthrough.load(Relaxed) as u64, Relaxed);
    }

    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Relaxed)
    }

    /// The backing file the kernel may read files of content `c` from,
    /// when there is one now. When its bytes would be the source's: ESTALE
    /// if the source changed, EIO if it failed a check (logged by the data
    /// layer).
    fn backing(&self, ino: Ino, c: &Content) -> Result<Option<Arc<Backing>>, Errno> {
        if !self.passthrough() {
            return Ok(None);
        }
        if let Some(f) = self.composed(c).filter(|f| f.is_source) {
            return self.source_backing(c, &f);
        }
        if let Some((tensor, part, _)) = self.clonable(c) {
            return self.cloned_backing(c, tensor, part);
        }
        let found = match self.backings.ready_or_wait(c) {
            Some(b) => Some(b),
            // Decoded into a file by a read of another file (its `.npy`, say).
            None => self
                .adopt_decoded(ino, c)
                .then(|| self.backings.ready_or_wait(c))
                .flatten(),
        };
        // A decoded file holds checked bytes, but once the source is seen
        // changed no read of it is served (its bytes may have been read
        // in a change the times did not show): nor is an open of it.
        if found.is_some() {
            self.sources_unchanged(c)?;
        }
        Ok(found)
    }

    /// Has the file that the blob of tensor file `ino` (content `c`) was
    /// decoded into (see `Data::decoded_file`) become its backing, the
    /// inode's page cache dropped first. False when there is none.
    fn adopt_decoded(&self, ino: Ino, c: &Content) -> bool {
        let Content::Part { tensor, part } = c else {
            return false;
        };
        let Some(d) = self.data.decoded_file(*tensor, *part) else {
            return false;
        };
        let len = self.part(*tensor, *part).map_or(0, |p| p.nbytes);
        let holds = d.holds.map(|s| s as Arc<dyn std::any::Any + Send + Sync>);
        let segments = self.segments(c);
        // The unit stays cached (its pages are the file's, nothing more)
        // for reads of the tensor's views, until the cache needs room.
        self.backings
            .adopt(c, ino, (d.file, holds, len), &self.data, segments)
    }

    /// Whether files of content `c` are worth a filled backing file: some
    /// of their bytes take work to make. (Asked at every open: no segments
    /// built; a view's file is described once, its header with it.)
    fn worth_filling(&self, c: &Content) -> bool {
        match c {
            Content::Part { tensor, part } => self.needs_work(*tensor, *part),
            // A view that is its source is backed by the source itself.
            Content::ViewData { .. } => self.composed(c).is_some_and(|f| {
                !f.is_source && f.entries.iter().any(|e| self.needs_work(e.tensor, 0))
            }),
            _ => false,
        }
    }

    /// Whether some bytes of files of content `c` come from a remote
    /// object (fetched, not only read).
    fn fetched(&self, c: &Content) -> bool {
        self.any_part(c, |t, p| self.fetched_part(t, p))
    }

    /// Whether `pred` holds for a tensor part (tensor, part) that files of
    /// content `c` show; false for generated files.
    fn any_part(&self, c: &Content, pred: impl FnMut(usize, usize) -> bool) -> bool {
        any_part_of(&self.tree, &self.data, c, pred)
    }

    /// When the last open of `ino` the daemon served is closed, `read`
    /// bytes of it served since mount: fills what its reads did not write
    /// of a backing file for it when those are at least half of a file
    /// worth one, else drops what they wrote (a peek at a large tensor
    /// decodes no more than it read).
    fn maybe_fill(&self, ino: Ino, read: u64) {
        let Some(NodeKind::File(c)) = self.tree.node(ino).map(|n| &n.kind) else {
            return;
        };
        if !self.passthrough() || !matches!(c, Content::Part { .. } | Content::ViewData { .. }) {
            return;
        }
        let len = self.size_of(ino, c);
        // A peek (less than half of the file) keeps no disk.
        let most = read.saturating_mul(2) >= len;
        if self.worth_filling(c) {
            if most && self.adopt_decoded(ino, c) {
                return;
            }
            let fill = if !most || !self.fits_beside_spills(c, len) {
                Fill::Drop
            } else if self.fetched(c) {
                Fill::IfWhole
            } else {
                Fill::Rest
            };
            self.backings
                .close(c, ino, len, fill, &self.data, self.segments(c));
        } else if most && let Some((tensor, part, head)) = self.clonable(c) {
            self.clone_read(ino, c, (tensor, part), head);
        }
    }

    /// The backing file a served open of `ino` (content `c`) writes its
    /// reads through to, when `c` is worth one (see [`Partial`]).
    fn write_through(&self, ino: Ino, c: &Content) -> Option<Arc<Partial>> {
        if !self.passthrough() {
            return None;
        }
        let len = self.size_of(ino, c);
        if !self.worth_filling(c) || !self.fits_beside_spills(c, len) {
            return None;
        }
        self.backings.begin(c, len)
    }

    /// Whether a filled backing file of `len` bytes for files of content
    /// `c` fits in `--decoded-cache-size` beside the spills of the tensors
    /// they show. Its fill reads those spills back, so room made by
    /// dropping them would only make them again; where both do not fit,
    /// the daemon serves the files from the spills.
    /// (A fill reads a view's tensors one after another, so beside the
    /// largest of their spills: the others may go while it runs.)
    fn fits_beside_spills(&self, c: &Content, len: u64) -> bool {
        let disk = self.data.decoded_disk();
        if len.saturating_add(disk.spills()) <= disk.limit() {
            return true;
        }
        let mut largest = 0;
        self.any_part(c, |t, p| {
            largest = largest.max(self.data.spill_len(t, p).unwrap_or(0));
            false
        });
        len.saturating_add(largest) <= disk.limit()
    }

    /// The source file as the backing of a view `l` that is that file,
    /// after the checks a read of every tensor in it would make; `None`
    /// while it is a remote object whose cache file lacks some of it (the
    /// daemon serves the view, fetching, until every block is there).
    fn source_backing(&self, c: &Content, l: &Composed<'_>) -> Result<Option<Arc<Backing>>, Errno> {
        let Some(f) = self.data.whole_file(0) else {
            return Ok(None);
        };
        for e in l.entries.iter() {
            self.check_raw(e.tensor, 0)?;
        }
        let file = f.file().try_clone().map_err(|e| {
            log::error!("{}: cannot hand the file to the kernel: {e}", f.label());
            libc::EIO
        })?;
        Ok(Some(self.backings.source(c, file, l.size)))
    }

    /// Files of content `c` that a clone of a raw tensor's range can back
    /// (see [`Self::clone_read`]): the tensor's own file, or a view's file
    /// of that tensor alone after a header (its `.npy`): (tensor, part,
    /// the header).
    fn clonable(&self, c: &Content) -> Option<(usize, usize, Vec<u8>)> {
        match c {
            Content::Part { tensor, part } => {
                (!self.needs_work(*tensor, *part)).then(|| (*tensor, *part, Vec::new()))
            }
            // A view's file of one tensor, not one that happens to hold one
            // (see `one_part`), whose header ends on a block.
            Content::ViewData { file, .. } if file.tensor.is_some() => {
                let f = self.composed(c).filter(|f| !f.is_source)?;
                let [e] = f.entries.as_ref() else {
                    return None;
                };
                let header = f.header.len() as u64;
                let alone = Some(e.tensor) == file.tensor
                    && self.part(e.tensor, 0)?.nbytes == e.len
                    && e.start == header
                    && f.size == header + e.len
                    && self.backings.may_clone(header);
                let tensor = e.tensor;
                (alone && !self.needs_work(tensor, 0)).then(|| (tensor, 0, f.header.into_owned()))
            }
            _ => None,
        }
    }

    /// A raw tensor's file (or its `.npy`) backed by the clone of its range
    /// made after earlier opens read at least half of it (see
    /// [`Self::clone_read`]), once the clone's own pages are cached
    /// and the checks a read makes pass.
    /// Until then the daemon serves the tensor from the source's pages: a
    /// clone shares the source's disk blocks, not its page cache, and a
    /// first load read from a fresh clone ran at a quarter of the daemon's
    /// speed with the source cached, and at half of it with nothing cached
    /// (BENCHMARKS.md, "Raw tensors backed by clones"). The errno of a
    /// read when the checks fail.
    fn cloned_backing(
        &self,
        c: &Content,
        ti: usize,
        pi: usize,
    ) -> Result<Option<Arc<Backing>>, Errno> {
        let Some(b) = self
            .backings
            .ready(c)
            .filter(|b| b.origin() == Origin::Cloned)
        else {
            return Ok(None);
        };
        if let Err(e) = self.check_raw(ti, pi) {
            // A changed source: the clone, no longer sharing its blocks,
            // holds disk for nothing.
            self.backings.forget_clone(c);
            return Err(e);
        }
        Ok(b.resident().then_some(b))
    }

    /// After the last served open of `ino` (content `c`, a raw tensor's
    /// file or a view of it alone after `head`, see [`Self::clonable`]),
    /// its opens having read at least half of it: a file of `head` and a
    /// clone of the tensor's range for later opens, where the cache
    /// directory allows (see `Backings::clone_of`), made and read in while
    /// nothing is being read (see `mount::warmer`). Once read in, the
    /// kernel's page cache of `ino` is dropped (passthrough opens never
    /// read it); a clone that could not be read in whole is dropped, to be
    /// made again after a later read.
    fn clone_read(&self, ino: Ino, c: &Content, (ti, pi): (usize, usize), head: Vec<u8>) {
        let Some((_, off, len)) = clonable_range(&self.data, ti, pi) else {
            return;
        };
        if !self.backings.may_clone(off) || self.backings.ready(c).is_some() {
            return;
        }
        let (data, backings, key) = (self.data.clone(), self.backings.clone(), c.clone());
        let (done_by, done_key) = (self.backings.clone(), c.clone());
        self.backings.warm_clone(CloneJob {
            key: c.clone(),
            len: head.len() as u64 + len,
            make: Box::new(move || make_clone(&data, &backings, &key, (ti, pi), &head)),
            done: Box::new(move |all| {
                if all {
                    done_by.drop_inode_cache(ino);
                } else {
                    done_by.forget_clone(&done_key);
                }
            }),
        });
    }

    /// Whether part `pi` of tensor `ti` is more than a stored range of a
    /// local file: decoded, gathered, byte-swapped or fetched.
    fn needs_work(&self, ti: usize, pi: usize) -> bool {
        let Some(p) = self.part(ti, pi) else {
            return false;
        };
        let b = &self.data.catalog().blobs[p.blob];
        // A raw range of a remote object is not: the daemon serves it from
        // the object's cache file, where a remount finds it, and a copy of
        // it made while a cold read is served would cost that read a
        // quarter of its speed (the copies, not the requests, bound a
        // fetch on loopback).
        !matches!(b.codec, Codec::Raw)
            || !matches!(p.map, crate::catalog::PartMap::Contiguous { .. })
            || (p.order == crate::catalog::Endian::Big && p.dtype.size() > 1)
    }

    /// Whether part `pi` of tensor `ti` is stored in a remote object.
    fn fetched_part(&self, ti: usize, pi: usize) -> bool {
        self.part(ti, pi).is_some_and(|p| {
            let b = &self.data.catalog().blobs[p.blob];
            self.data.local_file(b.source).is_none()
        })
    }

    /// What tensor or view file `c` is made of, in order.
    fn segments(&self, c: &Content) -> Vec<Segment> {
        let part = |tensor: usize, part: usize| {
            let len = self.part(tensor, part).map_or(0, |p| p.nbytes);
            Segment::Part { tensor, part, len }
        };
        match c {
            Content::Part { tensor, part: p } => vec![part(*tensor, *p)],
            Content::ViewData { .. } => match self.composed(c) {
                Some(f) => std::iter::once(Segment::Bytes(Arc::new(f.header.into_owned())))
                    .chain(f.entries.iter().map(|e| part(e.tensor, 0)))
                    .collect(),
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// The text of generated file `ino`, shared with its other open handles.
    fn rendered(&self, ino: Ino, c: &Content) -> Result<Text, Errno> {
        if matches!(c, Content::Stats | Content::Errors) {
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
        let (data_handle, last) = {
            let mut opens = super::lock(&self.opens);
            let gone = opens.by_fh.remove(&fh);
            let mut last = None;
            if let Some(OpenFile {
                ino, backing: None, ..
            }) = &gone
                && let Some(n) = opens.served.get_mut(ino)
            {
                *n -= 1;
                if *n == 0 {
                    opens.served.remove(ino);
                    self.backings.served_inodes(opens.served.len());
                    opens.closing += 1;
                    last = Some(opens.served_bytes.get(ino).copied().unwrap_or(0));
                }
            }
            (gone, last)
        };
        if let Some(open) = data_handle {
            match (&open.backing, last) {
                (Some(b), _) => self.backings.closed(b),
                (None, Some(read)) => {
                    self.maybe_fill(open.ino, read);
                    super::lock(&self.opens).closing -= 1;
                }
                (None, None) => {}
            }
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

    /// The kernel would not take handle `fh`'s backing file: it is served
    /// by the daemon instead, as the returned mode says, and so is every
    /// later open.
    pub fn refused_backing(&self, fh: u64, why: &std::io::Error) -> CacheMode {
        if self.passthrough.swap(false, Relaxed) {
            self.data.set_units_in_files(false);
            log::warn!(
                "{}: the kernel refused a backing file ({why}); serving every file through FUSE",
                self.data.catalog().label
            );
            self.data.stats().passthrough.store(0, Relaxed);
        }
        let mut opens = super::lock(&self.opens);
        let Some(open) = opens.by_fh.get_mut(&fh) else {
            return CacheMode::DirectIo;
        };
        let ino = open.ino;
        if let Some(b) = open.backing.take() {
            self.backings.closed(&b);
        }
        *opens.served.entry(ino).or_default() += 1;
        self.backings.served_inodes(opens.served.len());
        drop(opens);
        match self.tree.node(ino).map(|n| &n.kind) {
            Some(NodeKind::File(c)) => self.cache_mode(c),
            _ => CacheMode::DirectIo,
        }
    }

    /// The checks a read of part `pi` of tensor `ti` makes before its
    /// first byte, with that read's errno when they fail.
    fn check_raw(&self, ti: usize, pi: usize) -> Result<(), Errno> {
        self.data.check_raw(ti, pi).map_err(|e| e.errno())
    }

    /// Bytes `[off, off+size)` of file `ino` opened as `fh`. A data error is
    /// logged by the data layer, and its errno is the one its kind names
    /// (`serve::error`).
    pub fn read(&self, ino: Ino, fh: u64, off: u64, size: u32) -> Result<Served<'_>, Errno> {
        Stats::add(&self.data.stats().reads, 1);
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        // Reads of data hold back the fills (not those of generated files,
        // such as a poll of `.ztensor/stats`).
        let busy = matches!(
            node.kind,
            NodeKind::File(Content::Part { .. } | Content::ViewData { .. })
        )
        .then(|| self.backings.activity().begin());
        // The tensor part it reads, and the file's length, for the hold
        // on its spill.
        let part = match &node.kind {
            NodeKind::File(c @ (Content::Part { .. } | Content::ViewData { .. })) => self
                .part_at(&node.kind, off, size as u64)
                .map(|(t, p, ..)| (t, p, self.size_of(ino, c))),
            _ => None,
        };
        let (partial, other) = self.partial_for_read(fh, part.map(|(t, p, _)| (t, p)));
        drop(other);
        let partial = partial.filter(|(i, _)| *i == ino).map(|(_, p)| p);
        let written = partial
            .as_ref()
            .and_then(|p| self.written(&node.kind, p, off, size));
        let served = match written {
            Some(v) => Served {
                bytes: Bytes::Owned(v),
                through: None,
                _busy: busy,
            },
            None => Served {
                bytes: self.read_node(ino, &node.kind, fh, off, size)?,
                through: partial.map(|p| (ino, p.through())),
                _busy: busy,
            },
        };
        let mut opens = super::lock(&self.opens);
        if let Some(ino) = opens.by_fh.get(&fh).map(|o| o.ino) {
            *opens.served_bytes.entry(ino).or_default() += served.len() as u64;
        }
        let done = opens.by_fh.get_mut(&fh).and_then(|o| {
            o.read += served.len() as u64;
            o.last_read = std::time::Instant::now();
            self.hold_spill(o, part)
        });
        drop(opens);
        drop(done);
        Ok(served)
    }

    /// Has open `o`, which read part `part` last (tensor, part, the file's
    /// length), hold that part's spill until it has been served as many
    /// bytes as its file holds (or is closed, or idle: see
    /// [`let_go_of_idle_spills`]). A spill no reader holds may go to make
    /// room for another, and a reader part way through its file would
    /// then find its own spill gone, and maybe no room to make it again.
    /// What it lets go of is returned, to be dropped outside the lock.
    fn hold_spill(&self, o: &mut OpenFile, part: Option<(usize, usize, u64)>) -> Option<Reading> {
        let (t, p, len) = part?;
        if o.read >= len {
            return o.reading.take();
        }
        if o.reading.is_none() {
            o.reading = self.data.spill_hold(t, p).map(|h| (t, p, h));
        }
        None
    }

    /// Before open `fh` reads part `part`: the backing file its reads
    /// write through to, and its inode, and the hold it had on
    /// the spill of another part (a view's file of several tensors read in
    /// order), taken from it so that the hold cannot keep this part's spill
    /// from being made; to be dropped outside the lock. One look at the
    /// open for both.
    fn partial_for_read(
        &self,
        fh: u64,
        part: Option<(usize, usize)>,
    ) -> (Option<(Ino, Arc<Partial>)>, Option<Reading>) {
        let mut opens = super::lock(&self.opens);
        let Some(o) = opens.by_fh.get_mut(&fh) else {
            return (None, None);
        };
        let same = o.reading.as_ref().map(|(t, p, _)| (*t, *p)) == part;
        let other = if same { None } else { o.reading.take() };
        let partial = o.partial.clone().map(|p| (o.ino, p));
        (partial, other)
    }

    /// Whether a read of `size` bytes at `off` of file `ino` would wait
    /// for a decode that another thread runs (see `Data::would_wait`).
    pub fn would_wait(&self, ino: Ino, off: u64, size: u32) -> bool {
        let Some(node) = self.tree.node(ino) else {
            return false;
        };
        let Some((tensor, part, start, len)) = self.part_at(&node.kind, off, size as u64) else {
            return false;
        };
        let from = off.max(start);
        let end = off
            .saturating_add(size as u64)
            .min(start.saturating_add(len));
        self.data
            .would_wait(tensor, part, from - start, end.saturating_sub(from))
    }

    /// After `read`'s bytes, read at `off`, went to the reader: writes
    /// them through to the file's backing file, if it has one coming (see
    /// [`Partial`]). Called once the reply is out, so the reader does not
    /// wait for the write; a local tensor's bytes are written by the
    /// write-behind thread, when a core is free (see `write_behind`).
    pub fn served(&self, off: u64, read: Served<'_>) {
        let Served {
            bytes,
            through,
            _busy,
        } = read;
        let Some((ino, p)) = through else {
            return;
        };
        let Some(kind) = self.tree.node(ino).map(|n| &n.kind) else {
            return;
        };
        let NodeKind::File(c) = kind else {
            return;
        };
        let part = self.part_at(kind, off, bytes.len() as u64);
        let to = WriteThrough {
            data: self.data.clone(),
            backings: self.backings.clone(),
            ino,
            off,
            part,
        };
        if let Some((tensor, part, ..)) = part {
            if self.data.spilled(tensor, part) {
                return; // the fill reads the spill back
            }
            // A tensor file whose unit is decoded into a file: that file
            // becomes its backing as it is, so nothing is written; every
            // byte served is in it.
            if matches!(c, Content::Part { .. })
                && !self.fetched_part(tensor, part)
                && self.data.decodes_into_file(tensor, part)
            {
                let end = off + bytes.len() as u64;
                drop(bytes);
                // The unit stays cached until its file is adopted.
                return to.written(&p, end, (0, end), false);
            }
        }
        // A remote file's reads are written now: its backing file is kept
        // only when they wrote all of it (nothing is fetched to complete
        // it), so a write left for later would lose it.
        // (The part the read met, not every part of a view: a view of 10^5
        // tensors would be walked at each read; a view's header alone asks
        // of them all, once per file.)
        let remote = match part {
            Some((tensor, part, ..)) => self.fetched_part(tensor, part),
            None => self.fetched(c),
        };
        if remote {
            to.write(&p, bytes);
            return;
        }
        if let Some((tensor, part, start, len)) = part {
            let inside = |x: u64| (x.max(start) - start).min(len);
            let end = off + bytes.len() as u64;
            self.data
                .left_behind(tensor, part, (inside(off), inside(end)));
        }
        self.write_behind(p, to, bytes);
    }

    /// Queues `bytes` to be written by the write-behind (see
    /// `write_behind`), or counts them left to the fill.
    fn write_behind(&self, p: Through, to: WriteThrough, bytes: Bytes<'_>) {
        let n = bytes.len() as u64;
        let stats = self.data.stats();
        // Raw bytes straight from a source's mapping (a view of raw and
        // decoded tensors) are not kept: the fill copies them, no decode.
        let Ok(kept) = bytes.keep() else {
            return Stats::add(&stats.write_behind_skipped_bytes, n);
        };
        // Weakly, and no `Through` while queued: a close does not wait for
        // the write, and a file dropped meanwhile (its descriptor, its
        // disk) is not kept for it.
        let partial = Arc::downgrade(&p.partial());
        drop(p);
        let held = kept.held();
        let work = move || {
            let through = partial.upgrade().and_then(|p| p.through_if_open());
            let wrote = match (through, kept.get()) {
                (Some(p), Some(bytes)) => to.write(&p, bytes),
                _ => false,
            };
            let stats = to.data.stats();
            let counter = match wrote {
                true => &stats.write_behind_bytes,
                false => &stats.write_behind_skipped_bytes,
            };
            Stats::add(counter, n);
        };
        // Not queued (a full queue): the fill writes them.
        if self.write_behind.push(held, work).is_err() {
            Stats::add(&stats.write_behind_skipped_bytes, n);
        }
    }

    /// The tensor part whose bytes a read of `len` bytes at `off` of a
    /// file of `kind` meets first: (tensor, part, where the part starts in
    /// the file, its length).
    fn part_at(&self, kind: &NodeKind, off: u64, len: u64) -> Option<(usize, usize, u64, u64)> {
        let NodeKind::File(c) = kind else {
            return None;
        };
        if let Content::Part { tensor, part } = c {
            return Some((*tensor, *part, 0, u64::MAX));
        }
        let f = self.composed(c)?;
        let e = f
            .entries
            .get(f.entries.partition_point(|e| e.start + e.len <= off))?;
        (e.start < off.saturating_add(len)).then_some((e.tensor, 0, e.start, e.len))
    }

    /// For a file holding one tensor part (the tensor's file, a view's
    /// file of one tensor such as its `.npy`): the part, and where its
    /// bytes start in the file.
    fn one_part(&self, c: &Content) -> Option<(usize, usize, u64)> {
        match c {
            Content::Part { tensor, part } => Some((*tensor, *part, 0)),
            // A view's file of one tensor (`FileId::tensor`), not one that
            // happens to hold one (the `.safetensors` view of a model of
            // one tensor is still the model's file).
            Content::ViewData { file, .. } if file.tensor.is_some() => {
                match &*self.composed(c)?.entries {
                    [e] if Some(e.tensor) == file.tensor => Some((e.tensor, 0, e.start)),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Bytes `[off, off+size)` of a file from the backing file `p` its
    /// reads wrote, when they are all there and the tensor's file is
    /// unchanged (else the data layer's read fails, and says why).
    fn written(&self, kind: &NodeKind, p: &Partial, off: u64, size: u32) -> Option<Vec<u8>> {
        let NodeKind::File(c) = kind else {
            return None;
        };
        if let Some((tensor, part, _)) = self.one_part(c) {
            let bytes = p.read(off, size as u64)?;
            return self.data.unchanged(tensor, part).then_some(bytes);
        }
        // A view's file of several tensors (the `.safetensors` view): its
        // header is the daemon's own, and each tensor the range meets must
        // be as it was. Else a reader coming back over bytes it already
        // wrote decoded them again, and wrote them again, at every pass.
        let f = self.composed(c)?;
        let bytes = p.read(off, size as u64)?;
        let end = off + bytes.len() as u64;
        let first = f.entries.partition_point(|e| e.start + e.len <= off);
        let unchanged = f.entries[first..]
            .iter()
            .take_while(|e| e.start < end)
            .all(|e| self.data.unchanged(e.tensor, 0));
        unchanged.then_some(bytes)
    }

    fn read_node(
        &self,
        ino: Ino,
        kind: &NodeKind,
        fh: u64,
        off: u64,
        size: u32,
    ) -> Result<Bytes<'_>, Errno> {
        match kind {
            NodeKind::Dir { .. } => Err(libc::EISDIR),
            NodeKind::File(Content::Part { tensor, part }) => self
                .data
                .read(*tensor, *part, off, size as u64)
                .map_err(|e| e.errno()),
            NodeKind::File(c @ Content::ViewData { .. }) => {
                let f = self.composed(c).ok_or(libc::EIO)?;
                self.read_composite(&f, off, size)
            }
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
                let mut out = scratch::take();
                out.extend_from_slice(&bytes[start..end]);
                Ok(Bytes::Owned(out))
            }
        }
    }

    /// Extended attributes of a tensor's file: what a user would otherwise
    /// read from its sidecar. (name, value) pairs.
    fn xattrs(&self, ino: Ino) -> Result<Vec<(&'static str, String)>, Errno> {
        let node = self.tree.node(ino).ok_or(libc::ENOENT)?;
        // A tensor's file, or a view's file of that tensor alone.
        let (ti, pi) = match &node.kind {
            NodeKind::File(Content::Part { tensor, part }) => (*tensor, *part),
            NodeKind::File(c @ Content::ViewData { .. }) => match self.one_part(c) {
                Some((t, p, _)) => (t, p),
                None => return Ok(Vec::new()),
            },
            _ => return Ok(Vec::new()),
        };
        let cat = self.data.catalog();
        let (Some(t), Some(p)) = (cat.tensors.get(ti), self.part(ti, pi)) else {
            return Ok(Vec::new());
        };
        let shape = serde_json::to_string(&p.shape).unwrap_or_default();
        Ok(vec![
            ("user.ztensor.name", t.name.clone()),
            ("user.ztensor.dtype", p.dtype.name().to_string()),
            ("user.ztensor.shape", shape),
            ("user.ztensor.numpy_dtype", p.dtype.numpy().to_string()),
            ("user.ztensor.format", cat.format.clone()),
            ("user.ztensor.format_dtype", t.dtype.clone()),
        ])
    }

    /// The value of xattr `name`, or ENODATA.
    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>, Errno> {
        if !self.xattrs {
            return Err(libc::ENOSYS);
        }
        self.xattrs(ino)?
            .into_iter()
            .find(|(n, _)| OsStr::new(n) == name)
            .map(|(_, v)| v.into_bytes())
            .ok_or(libc::ENODATA)
    }

    /// The names of the xattrs of `ino`, each ended by a NUL.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        if !self.xattrs {
            return Err(libc::ENOSYS);
        }
        let mut out = Vec::new();
        for (n, _) in self.xattrs(ino)? {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        Ok(out)
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

fn part_of(data: &Data, ti: usize, pi: usize) -> Option<&Part> {
    data.catalog().tensors.get(ti)?.parts.as_ref().ok()?.get(pi)
}

/// How long an open that holds a spill may go without a read before the
/// spill is let go of when another needs its room: a reader part way
/// through a file reads again within it; an open kept after a peek, or a
/// mapping touched here and there, does not.
const HOLD_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Lets go of the spills held by opens not read for [`HOLD_IDLE`]; true
/// when it let go of one.
fn let_go_of_idle_spills(opens: &Mutex<Opens>) -> bool {
    let mut idle = Vec::new();
    {
        let mut opens = super::lock(opens);
        for o in opens.by_fh.values_mut() {
            if o.reading.is_some() && o.last_read.elapsed() >= HOLD_IDLE {
                idle.extend(o.reading.take());
            }
        }
    }
    // Dropped outside the lock: the last hold of a dropped spill closes it.
    !idle.is_empty()
}

/// What file `c` is made of, when it is a view's file of tensors' bytes.
fn composed_of<'a>(tree: &'a Tree, data: &'a Data, c: &Content) -> Option<Composed<'a>> {
    let Content::ViewData { view, file } = c else {
        return None;
    };
    tree.views().get(*view)?.data(data.catalog(), *file)
}

/// Whether `pred` holds for a tensor part (tensor, part) that files of
/// content `c` show; false for generated files.
fn any_part_of(
    tree: &Tree,
    data: &Data,
    c: &Content,
    mut pred: impl FnMut(usize, usize) -> bool,
) -> bool {
    match c {
        Content::Part { tensor, part } => pred(*tensor, *part),
        Content::ViewData { .. } => {
            composed_of(tree, data, c).is_some_and(|f| f.entries.iter().any(|e| pred(e.tensor, 0)))
        }
        _ => false,
    }
}

/// Part `pi` of tensor `ti` as one range of a local file: (the file, where
/// the range starts, its length).
fn clonable_range(data: &Data, ti: usize, pi: usize) -> Option<(&MappedFile, u64, u64)> {
    let p = part_of(data, ti, pi)?;
    let b = &data.catalog().blobs[p.blob];
    match p.map {
        crate::catalog::PartMap::Contiguous { start } => {
            Some((data.local_file(b.source)?, b.offset + start, p.nbytes))
        }
        _ => None,
    }
}

/// Clones part `pi` of tensor `ti` after `head` (content `key`) under
/// `--cache-dir` once the checks a read makes pass, kept only if the
/// source is still as they found it after the clone was made. `None` when
/// it cannot be.
fn make_clone(
    data: &Data,
    backings: &Backings,
    key: &Content,
    (ti, pi): (usize, usize),
    head: &[u8],
) -> Option<Arc<Backing>> {
    let (f, off, len) = clonable_range(data, ti, pi)?;
    data.check_raw(ti, pi).ok()?;
    let clone = backings.clone_of(key, head, (f.file(), off, len))?;
    if data.check_raw(ti, pi).is_err() {
        backings.forget_clone(key);
        return None;
    }
    Some(clone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::tree::{META_DIR, ROOT};
    use crate::serve::data::{DataOptions, PROGRESSIVE_MIN};

    fn fs_of(dir: &std::path::Path) -> TensorFs {
        fs_with(dir, 0)
    }

    /// "w" and `more` tensors of one byte.
    fn fs_with(dir: &std::path::Path, more: usize) -> TensorFs {
        let names: Vec<String> = (0..more).map(|i| format!("t{i}")).collect();
        let mut tensors: Vec<(&str, &[u8])> = vec![("w", &[1, 2, 3, 4])];
        tensors.extend(names.iter().map(|n| (n.as_str(), &[7u8][..])));
        fs_of_tensors(dir, &tensors)
    }

    /// The fs of `tensors`, with every view.
    fn fs_of_tensors(dir: &std::path::Path, tensors: &[(&str, &[u8])]) -> TensorFs {
        let (catalog, files) = crate::serve::testing::catalog_of(dir, tensors);
        let opts = FsOptions {
            data: DataOptions {
                cache_size: 8 << 20,
                cache_dir: dir.to_path_buf(),
                verify_raw: true,
                progressive_min: PROGRESSIVE_MIN,
            },
            direct_io: true,
            views: Views::ALL,
            xattrs: true,
            backing: BackingOptions::off(),
        };
        TensorFs::new(catalog, files, opts).unwrap()
    }

    #[test]
    fn only_a_view_file_of_one_tensor_counts_as_that_tensors_file() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_of_tensors(dir.path(), &[("w", &[1, 2, 3, 4])]);
        let content = |dir: &str, name: &str| {
            let top = fs.lookup(ROOT, OsStr::new(dir)).unwrap().ino;
            let ino = fs.lookup(top, OsStr::new(name)).unwrap().ino;
            match &fs.tree.node(ino).unwrap().kind {
                NodeKind::File(c) => c.clone(),
                other => panic!("{other:?}"),
            }
        };
        let npy = content(".npy", "w.npy");
        assert_eq!(fs.one_part(&npy), Some((0, 0, 128)));
        // The model's file, though it holds one tensor: served, cached and
        // described as a model (no tensor xattrs), as with more tensors.
        let model = content(".safetensors", "model.safetensors");
        assert_eq!(fs.one_part(&model), None);
    }

    /// A view's file put together from a header and tensors reads the
    /// same whatever the offsets and sizes of its reads: within one
    /// tensor, across several, from the header on, past the end.
    #[test]
    fn a_composed_view_reads_alike_at_every_offset_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<Vec<u8>> = [3usize, 0, 8, 1, 16, 5]
            .iter()
            .enumerate()
            .map(|(t, &n)| (0..n).map(|i| (t * 40 + i) as u8).collect())
            .collect();
        let names = ["a", "b", "c", "d", "e", "f"];
        let tensors: Vec<(&str, &[u8])> = names
            .iter()
            .copied()
            .zip(bytes.iter().map(|b| &b[..]))
            .collect();
        let fs = fs_of_tensors(dir.path(), &tensors);
        let top = fs.lookup(ROOT, OsStr::new(".safetensors")).unwrap().ino;
        let ino = fs.lookup(top, OsStr::new("model.safetensors")).unwrap().ino;
        let (fh, _) = fs.open(ino, false).unwrap();
        let whole = fs.read(ino, fh, 0, 1 << 20).unwrap().to_vec();
        let data: Vec<u8> = bytes.concat();
        assert!(whole.ends_with(&data), "{whole:?}");
        for size in 1..=whole.len() as u32 + 2 {
            for off in 0..=whole.len() {
                let got = fs.read(ino, fh, off as u64, size).unwrap();
                let end = (off + size as usize).min(whole.len());
                assert_eq!(&*got, &whole[off..end], "{size} bytes at {off}");
            }
        }
    }

    #[test]
    fn a_tensor_whose_place_in_a_view_is_taken_is_not_in_that_view() {
        let dir = tempfile::tempdir().unwrap();
        // `.npy/x.npy` is x's file, so "x.npy/y" has no directory there;
        // in `.zarr` the array `x` and the group `x.npy` do not meet.
        let fs = fs_of_tensors(dir.path(), &[("x", &[1]), ("x.npy/y", &[2])]);
        let npy = fs.lookup(ROOT, OsStr::new(".npy")).unwrap().ino;
        let x = fs.lookup(npy, OsStr::new("x.npy")).unwrap();
        assert_eq!(x.kind, Kind::File);
        assert_eq!(x.size, 128 + 1);
        let zarr = fs.lookup(ROOT, OsStr::new(".zarr")).unwrap().ino;
        let group = fs.lookup(zarr, OsStr::new("x.npy")).unwrap().ino;
        assert!(fs.lookup(group, OsStr::new("y")).is_ok());
        let npy_bit = 1 << 0;
        let zarr_bit = 1 << 1;
        assert_eq!(
            fs.tree.views_of(0) & (npy_bit | zarr_bit),
            npy_bit | zarr_bit
        );
        assert_eq!(fs.tree.views_of(1) & (npy_bit | zarr_bit), zarr_bit);
    }

    #[test]
    fn the_views_mirrors_are_laid_out_at_first_use() {
        let dir = tempfile::tempdir().unwrap();
        let fs = fs_with(dir.path(), 2);
        let main = fs.tree.main_len();
        assert!(!fs.tree.mirrors_laid_out());
        let w = fs.lookup(ROOT, OsStr::new("w")).unwrap();
        assert_eq!(w.size, 4);
        assert!(!fs.tree.mirrors_laid_out());
        // A view's directory is stat'ed with its entries counted.
        let npy = fs
            .lookup(ROOT, OsStr::new(crate::views::npy::VIEW.dir))
            .unwrap();
        assert!(fs.tree.mirrors_laid_out());
        assert_eq!(fs.tree.main_len(), main);
        let w_npy = fs.lookup(npy.ino, OsStr::new("w.npy")).unwrap();
        assert!(w_npy.ino as usize > main);
        assert_eq!(w_npy.size, 128 + 4);
        let mut names = Vec::new();
        fs.readdir(npy.ino, 0, |_, _, _, n| {
            names.push(n.to_string());
            false
        })
        .unwrap();
        assert_eq!(names, [".", "..", "w.npy", "t0.npy", "t1.npy"]);
        let zarr = fs
            .lookup(ROOT, OsStr::new(crate::views::zarr::VIEW.dir))
            .unwrap();
        let array = fs.lookup(zarr.ino, OsStr::new("t1")).unwrap();
        assert_eq!(fs.tree.path(array.ino), ".zarr/t1");
        // Laid out by `views_layout` first: the same inodes.
        let dir2 = tempfile::tempdir().unwrap();
        let other = fs_with(dir2.path(), 2);
        (other.views_layout())();
        assert!(other.tree.mirrors_laid_out());
        let npy2 = other
            .lookup(ROOT, OsStr::new(crate::views::npy::VIEW.dir))
            .unwrap();
        assert_eq!(
            other.lookup(npy2.ino, OsStr::new("w.npy")).unwrap().ino,
            w_npy.ino
        );
        assert_eq!(other.tree.len(), fs.tree.len());
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

#[cfg(test)]
mod passthrough_tests {
    use super::*;
    use crate::catalog::{Blob, DType, Endian, Part};
    use crate::mount::backing::Origin;
    use crate::mount::tree::ROOT;
    use crate::serve::data::PROGRESSIVE_MIN;
    use std::io::Read;

    /// A mount of one zstd tensor "z" of `data`, with backing files in `dir`.
    fn zstd_fs(dir: &std::path::Path, data: &[u8], limit: u64) -> TensorFs {
        zstd_fs_checked(dir, data, limit, Vec::new())
    }

    /// The same, its blob carrying `checks`.
    fn zstd_fs_checked(
        dir: &std::path::Path,
        data: &[u8],
        limit: u64,
        checks: Vec<crate::catalog::Check>,
    ) -> TensorFs {
        let (mut catalog, _) = crate::serve::testing::catalog_of(dir, &[("z", &[0u8][..])]);
        let blob = zstd::encode_all(data, 3).unwrap();
        std::fs::write(dir.join("data"), &blob).unwrap();
        let n = data.len() as u64;
        catalog.blobs[0] = Blob {
            len: blob.len() as u64,
            codec: Codec::Zstd { frames: None },
            decoded_len: n,
            checks,
            ..catalog.blobs[0].clone()
        };
        catalog.tensors[0].shape = vec![n];
        catalog.tensors[0].parts = Ok(vec![Part::dense(
            DType::Uint8,
            vec![n],
            n,
            0,
            Endian::Little,
        )]);
        let files = vec![Some(MappedFile::open(&dir.join("data")).unwrap())];
        let opts = FsOptions {
            data: DataOptions {
                cache_size: 64 << 20,
                cache_dir: dir.to_path_buf(),
                verify_raw: true,
                progressive_min: PROGRESSIVE_MIN,
            },
            direct_io: true,
            views: Views::ALL,
            xattrs: false,
            backing: BackingOptions {
                enabled: true,
                dir: dir.to_path_buf(),
                limit,
            },
        };
        TensorFs::new(catalog, files, opts).unwrap()
    }

    fn filled(fs: &TensorFs) {
        let t = std::time::Instant::now();
        while fs.backings.gauges().1 > 0 {
            assert!(t.elapsed().as_secs() < 30, "still filling");
            std::thread::yield_now();
        }
    }

    /// The inode of tensor `z` and a new open of it.
    fn open_z(fs: &TensorFs) -> (Ino, u64) {
        let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
        let (fh, _) = fs.open(z, false).unwrap();
        (z, fh)
    }

    fn read_all(fs: &TensorFs, ino: Ino, fh: u64, len: usize) {
        let mut at = 0;
        while at < len {
            let bytes = fs.read(ino, fh, at as u64, 1 << 20).unwrap();
            let n = bytes.len();
            fs.served(at as u64, bytes);
            at += n;
        }
        fs.write_behind.flush();
    }

    fn contents(b: &Backing) -> Vec<u8> {
        let mut v = Vec::new();
        b.file().try_clone().unwrap().read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn a_decoded_tensor_is_backed_after_its_first_open_by_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 7 % 251) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        // The hook hears of the inode whose reads asked for the file, before
        // an open can take the file.
        let heard = Arc::new(Mutex::new(Vec::new()));
        let backings = fs.backings.clone();
        let h = heard.clone();
        let _ = fs.filled_hook().set(Box::new(move |ino| {
            let ready = backings.ready(&Content::Part { tensor: 0, part: 0 });
            h.lock().unwrap().push((ino, ready.is_some()));
        }));
        let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
        let (fh, how) = fs.open(z, false).unwrap();
        // Served with direct I/O: the backing file, not the kernel's cache
        // of this inode, keeps the decoded bytes.
        assert!(matches!(how, Open::Served(CacheMode::DirectIo)));
        // A peek fills nothing.
        assert_eq!(fs.read(z, fh, 0, 4096).unwrap().len(), 4096);
        fs.release(fh);
        filled(&fs);
        assert_eq!(fs.backings.gauges(), (0, 0));
        // A whole read does, once the last open the daemon serves is closed.
        let (fh, _) = fs.open(z, false).unwrap();
        let (fh2, how) = fs.open(z, false).unwrap();
        assert!(matches!(how, Open::Served(_)));
        read_all(&fs, z, fh, data.len());
        fs.release(fh);
        // Its reads wrote the backing file through; it is not handed out
        // while a served open is left.
        assert_eq!(fs.backings.gauges(), (data.len() as u64, 1));
        assert!(
            fs.backings
                .ready(&Content::Part { tensor: 0, part: 0 })
                .is_none()
        );
        fs.release(fh2);
        filled(&fs);
        let (fh, how) = fs.open(z, false).unwrap();
        let Open::Backed(b) = how else {
            panic!("not backed")
        };
        assert_eq!(b.origin(), Origin::Filled);
        assert_eq!(contents(&b), data);
        assert_eq!(*heard.lock().unwrap(), vec![(z, false)]);
        fs.release(fh);
        // The .npy view: the header, then the same bytes.
        let npy_dir = fs.lookup(ROOT, OsStr::new(".npy")).unwrap().ino;
        let npy = fs.lookup(npy_dir, OsStr::new("z.npy")).unwrap().ino;
        let (fh, _) = fs.open(npy, false).unwrap();
        read_all(&fs, npy, fh, data.len() + 128);
        fs.release(fh);
        filled(&fs);
        let (_, how) = fs.open(npy, false).unwrap();
        let Open::Backed(b) = how else {
            panic!("npy not backed")
        };
        let v = contents(&b);
        assert_eq!(&v[..6], b"\x93NUMPY");
        assert_eq!(&v[v.len() - data.len()..], &data[..]);
        assert_eq!(fs.backings.gauges().0, (v.len() + data.len()) as u64);
    }

    #[test]
    fn a_tensor_decoded_into_a_file_is_backed_by_that_very_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        // Over PROGRESSIVE_MIN: served while it decodes, into a file.
        let data: Vec<u8> = (0..9_000_000u32).map(|i| (i / 11 % 239) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        let _ = fs
            .filled_hook()
            .set(Box::new(move |ino| h.lock().unwrap().push(ino)));
        let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
        let (fh, how) = fs.open(z, false).unwrap();
        assert!(matches!(how, Open::Served(_)));
        read_all(&fs, z, fh, data.len());
        assert!(fs.data().decodes_into_file(0, 0));
        let unit = fs.data().decoded_file(0, 0).expect("the decoded file").file;
        fs.release(fh);
        filled(&fs);
        let (fh, how) = fs.open(z, false).unwrap();
        let Open::Backed(b) = how else {
            panic!("not backed")
        };
        // The file the decoder wrote, not a copy of it.
        let (a, u) = (b.file().metadata().unwrap(), unit.metadata().unwrap());
        assert_eq!((a.dev(), a.ino()), (u.dev(), u.ino()));
        assert_eq!(contents(&b), data);
        let stats = fs.data().stats();
        assert_eq!(stats.backing_decoded.load(Relaxed), 1);
        assert_eq!(stats.decompressions.load(Relaxed), 1);
        assert_eq!(*heard.lock().unwrap(), vec![z]);
        assert_eq!(fs.backings.gauges().0, data.len() as u64);
        fs.release(fh);
    }

    #[test]
    fn a_tensor_whose_bool_check_failed_is_not_backed_by_its_decoded_file() {
        let dir = tempfile::tempdir().unwrap();
        // Bool elements, one of them 2, near the end: the decoder finishes
        // its unit, the range check over it fails.
        let mut data: Vec<u8> = (0..9_000_000u32).map(|i| (i % 3 == 0) as u8).collect();
        data[8_999_000] = 2;
        let check = crate::catalog::Check::BoolBytesIn {
            start: 0,
            len: data.len() as u64,
        };
        let fs = zstd_fs_checked(dir.path(), &data, 1 << 30, vec![check]);
        fs.set_passthrough(true);
        let (z, fh) = open_z(&fs);
        assert_eq!(fs.read(z, fh, 0, 1 << 20).err(), Some(libc::EIO));
        fs.release(fh);
        filled(&fs);
        assert!(fs.data().decoded_file(0, 0).is_none());
        let (fh, how) = fs.open(z, false).unwrap();
        assert!(matches!(how, Open::Served(_)), "{how:?}");
        assert_eq!(fs.read(z, fh, 0, 1 << 20).err(), Some(libc::EIO));
        fs.release(fh);
        assert_eq!(fs.data().stats().backing_decoded.load(Relaxed), 0);
    }

    #[test]
    fn a_decoded_file_is_not_adopted_once_the_source_changed() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..9_000_000u32).map(|i| (i / 19 % 211) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let (z, fh) = open_z(&fs);
        read_all(&fs, z, fh, data.len());
        // Rewritten in place, the same size: other bytes, a new mtime.
        let src = dir.path().join("data");
        let len = std::fs::metadata(&src).unwrap().len() as usize;
        std::fs::write(&src, vec![0x5a; len]).unwrap();
        fs.release(fh);
        filled(&fs);
        assert!(fs.data().decoded_file(0, 0).is_none());
        let (fh, how) = fs.open(z, false).unwrap();
        assert!(matches!(how, Open::Served(_)), "{how:?}");
        assert_eq!(fs.read(z, fh, 0, 1 << 20).err(), Some(libc::ESTALE));
        fs.release(fh);
        assert_eq!(fs.data().stats().backing_decoded.load(Relaxed), 0);
    }

    #[test]
    fn a_spilled_tensor_is_backed_by_its_spill_file() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        // Over half the 64 MiB cache: decoded into a spill file.
        let data: Vec<u8> = (0..40_000_000u32).map(|i| (i / 17 % 233) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let (z, fh) = open_z(&fs);
        read_all(&fs, z, fh, data.len());
        assert!(fs.data().spilled(0, 0));
        let spill = fs.data().decoded_file(0, 0).expect("the spill file").file;
        fs.release(fh);
        filled(&fs);
        let (fh, how) = fs.open(z, false).unwrap();
        let Open::Backed(b) = how else {
            panic!("not backed")
        };
        let (a, s) = (b.file().metadata().unwrap(), spill.metadata().unwrap());
        assert_eq!((a.dev(), a.ino()), (s.dev(), s.ino()));
        assert_eq!(contents(&b), data);
        assert_eq!(fs.data().stats().backing_decoded.load(Relaxed), 1);
        fs.release(fh);
    }

    /// A `.npy` view of a tensor that spills, under a `--decoded-cache-size`
    /// too small for the spill and a backing file of the view side by
    /// side: the view is served by the daemon from the spill, every time,
    /// and its open never takes the room the spill needs.
    #[test]
    fn a_view_of_a_spilled_tensor_is_served_from_its_spill_when_both_do_not_fit() {
        let dir = tempfile::tempdir().unwrap();
        // Over half the 64 MiB cache: decoded into a spill file, 40 MB of
        // a 60 MB bound.
        let data: Vec<u8> = (0..40_000_000u32).map(|i| (i / 23 % 239) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 60_000_000);
        fs.set_passthrough(true);
        let top = fs.lookup(ROOT, OsStr::new(".npy")).unwrap().ino;
        let attr = fs.lookup(top, OsStr::new("z.npy")).unwrap();
        let (npy, len) = (attr.ino, attr.size as usize);
        for round in 0..2 {
            let (fh, how) = fs.open(npy, false).unwrap();
            assert!(matches!(how, Open::Served(_)), "round {round}: {how:?}");
            let mut got = Vec::new();
            while got.len() < len {
                let at = got.len() as u64;
                let bytes = fs.read(npy, fh, at, 1 << 20).unwrap_or_else(|e| {
                    panic!("round {round}: read at {at}: errno {e}");
                });
                got.extend_from_slice(&bytes);
                fs.served(at, bytes);
            }
            fs.write_behind.flush();
            assert_eq!(&got[len - data.len()..], &data[..], "round {round}");
            assert!(got.starts_with(b"\x93NUMPY"));
            fs.release(fh);
            filled(&fs);
            assert!(fs.data().spilled(0, 0), "round {round}: the spill stays");
        }
        assert_eq!(fs.data().stats().errors.load(Relaxed), 0);
        // The tensor's own file is backed by the spill itself.
        let (z, fh) = open_z(&fs);
        read_all(&fs, z, fh, data.len());
        fs.release(fh);
        filled(&fs);
        let (fh, how) = fs.open(z, false).unwrap();
        assert!(matches!(how, Open::Backed(_)), "{how:?}");
        fs.release(fh);
    }

    #[test]
    fn without_passthrough_a_tensor_is_decoded_into_memory() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..9_000_000u32).map(|i| (i / 13 % 229) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(false);
        let (z, fh) = open_z(&fs);
        let mut got = Vec::new();
        while got.len() < data.len() {
            let bytes = fs.read(z, fh, got.len() as u64, 1 << 20).unwrap();
            got.extend_from_slice(&bytes);
            fs.served((got.len() - bytes.len()) as u64, bytes);
        }
        assert_eq!(got, data);
        assert!(!fs.data().decodes_into_file(0, 0));
        assert!(fs.data().decoded_file(0, 0).is_none());
        fs.release(fh);
    }

    #[test]
    fn a_whole_read_writes_its_backing_file_and_the_fill_reads_nothing_again() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 5 % 241) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let (z, fh) = open_z(&fs);
        read_all(&fs, z, fh, data.len());
        // Its one decoded unit is all written: it left the cache.
        assert_eq!(fs.data().cache().gauges().cache_entries, 0);
        let stats = fs.data().stats();
        let counts = || {
            (
                stats.cache_hits.load(Relaxed),
                stats.cache_misses.load(Relaxed),
                stats.decompressions.load(Relaxed),
            )
        };
        let before = counts();
        fs.release(fh);
        filled(&fs);
        assert_eq!(counts(), before, "the fill read the data layer again");
        let (_, how) = fs.open(z, false).unwrap();
        let Open::Backed(b) = how else {
            panic!("not backed")
        };
        assert_eq!(contents(&b), data);
    }

    #[test]
    fn a_read_of_the_safetensors_view_lets_what_it_wrote_through_leave_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 5 % 241) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let views = fs.lookup(ROOT, OsStr::new(".safetensors")).unwrap().ino;
        let view = fs.lookup(views, OsStr::new("model.safetensors")).unwrap();
        let (fh, _) = fs.open(view.ino, false).unwrap();
        read_all(&fs, view.ino, fh, view.size as usize);
        // As for the tensor's own file: its decoded unit is all written
        // through, so it is not kept in memory too.
        assert_eq!(fs.data().cache().gauges().cache_entries, 0);
        fs.release(fh);
    }

    #[test]
    fn the_page_cache_behind_a_reader_is_dropped_in_steps_once_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..8u32 << 20).map(|i| (i / 9 % 227) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let drops = Arc::new(Mutex::new(Vec::new()));
        let d = drops.clone();
        let _ = fs.behind_hook().set(Box::new(move |ino, at, len| {
            d.lock().unwrap().push((ino, at, len));
        }));
        let (z, fh) = open_z(&fs);
        // 1 MiB reads; in tests a step is 2 MiB, ending 1 MiB behind the
        // reader: dropped when the reader is at 3, 5 and 7 MiB.
        read_all(&fs, z, fh, data.len());
        let mib = 1u64 << 20;
        assert_eq!(
            *drops.lock().unwrap(),
            vec![
                (z, 0, 2 * mib),
                (z, 2 * mib, 2 * mib),
                (z, 4 * mib, 2 * mib)
            ]
        );
        fs.release(fh);
    }

    #[test]
    fn a_close_that_comes_before_the_last_reads_write_through_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 7 % 233) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let (z, fh) = open_z(&fs);
        let last = 2_000_000;
        read_all(&fs, z, fh, last);
        let tail = fs.read(z, fh, last as u64, 1 << 20).unwrap();
        assert_eq!(tail.len(), data.len() - last);
        let decoded = fs.data().stats().decompressions.load(Relaxed);
        // The reader has the tail and closes while the daemon has yet to
        // write it through.
        std::thread::scope(|s| {
            let closing = s.spawn(|| fs.release(fh));
            let t = std::time::Instant::now();
            while super::super::lock(&fs.opens).by_fh.contains_key(&fh) {
                assert!(t.elapsed().as_secs() < 30, "release never began");
                std::thread::yield_now();
            }
            fs.served(last as u64, tail);
            closing.join().unwrap();
        });
        filled(&fs);
        let stats = fs.data().stats();
        assert_eq!(stats.decompressions.load(Relaxed), decoded, "decoded again");
        let (_, how) = fs.open(z, false).unwrap();
        let Open::Backed(b) = how else {
            panic!("not backed")
        };
        assert_eq!(contents(&b), data);
    }

    #[test]
    fn a_write_still_under_way_when_its_close_stops_waiting_drops_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 11 % 239) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let (z, fh) = open_z(&fs);
        read_all(&fs, z, fh, 2_000_000);
        // The tail's write never comes while the close waits (2 s): it
        // would land beside the fill's, so the file is not kept.
        let tail = fs.read(z, fh, 2_000_000, 1 << 20).unwrap();
        fs.release(fh);
        filled(&fs);
        fs.served(2_000_000, tail);
        fs.write_behind.flush();
        assert_eq!(fs.backings.gauges(), (0, 0));
        let (fh, how) = fs.open(z, false).unwrap();
        assert!(
            !matches!(how, Open::Backed(_)),
            "a file written after its seal"
        );
        read_all(&fs, z, fh, data.len());
        fs.release(fh);
    }

    #[test]
    fn a_close_while_an_earlier_close_waits_to_seal_leaves_the_backing_file_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 5 % 227) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
        // A peek whose write-through is still to come when its open closes:
        // that close waits in the seal.
        let (a, _) = fs.open(z, false).unwrap();
        let first = fs.read(z, a, 0, 4096).unwrap();
        let Some(NodeKind::File(c)) = fs.tree.node(z).map(|n| &n.kind) else {
            panic!("z is no file")
        };
        std::thread::scope(|s| {
            let closing = s.spawn(|| fs.release(a));
            let t = std::time::Instant::now();
            while !fs.backings.sealing(c) {
                assert!(t.elapsed().as_secs() < 30, "the close never took the file");
                std::thread::yield_now();
            }
            // Another open peeks and closes meanwhile (the next `dd`): its
            // close finds the file taken, and returns at once.
            let (b, _) = fs.open(z, false).unwrap();
            let peek = fs.read(z, b, 4096, 4096).unwrap();
            fs.served(4096, peek);
            fs.release(b);
            fs.served(0, first);
            closing.join().unwrap();
        });
        // Dropped once (a peek keeps no disk), and counted so.
        assert_eq!(fs.backings.gauges(), (0, 0));
        let (c, _) = fs.open(z, false).unwrap();
        read_all(&fs, z, c, data.len());
        fs.release(c);
    }

    #[test]
    fn an_open_right_after_a_whole_read_waits_for_its_backing_file_to_be_published() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 3 % 239) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        // A slow drop of the inode's page cache, as for gigabytes of it.
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = dropped.clone();
        let _ = fs.filled_hook().set(Box::new(move |_| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            d.store(true, Relaxed);
        }));
        let (z, fh) = open_z(&fs);
        read_all(&fs, z, fh, data.len());
        fs.release(fh);
        // Every byte is written: the next open waits for the publication
        // instead of being served (which would fill the page cache again).
        let (fh, how) = fs.open(z, false).unwrap();
        let Open::Backed(b) = how else {
            panic!("served while its backing file was being published")
        };
        assert!(
            dropped.load(Relaxed),
            "backed before the page cache was dropped"
        );
        assert_eq!(contents(&b), data);
        fs.release(fh);
    }

    #[test]
    fn a_spill_short_of_disk_may_drop_a_filled_file_no_open_holds() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![9u8; 1 << 20];
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let (z, fh) = open_z(&fs);
        read_all(&fs, z, fh, data.len());
        fs.release(fh);
        filled(&fs);
        let (fh, how) = fs.open(z, false).unwrap();
        assert!(matches!(how, Open::Backed(_)));
        let free = fs.data().free_disk();
        assert!(!free(), "dropped a backing file an open holds");
        fs.release(fh);
        assert!(free());
        assert_eq!(fs.backings.gauges(), (0, 0));
        assert!(!free());
    }

    #[test]
    fn a_partly_read_file_is_filled_in_its_gaps_and_a_peek_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 3 % 239) as u8).collect();
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        fs.set_passthrough(true);
        let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
        // A peek: what it wrote is dropped at close.
        let (fh, _) = fs.open(z, false).unwrap();
        let bytes = fs.read(z, fh, 4096, 4096).unwrap();
        fs.served(4096, bytes);
        assert_eq!(fs.backings.gauges(), (data.len() as u64, 1));
        fs.release(fh);
        assert_eq!(fs.backings.gauges(), (0, 0));
        // Two thirds read, out of order and in odd sizes: the rest is filled.
        let (fh, _) = fs.open(z, false).unwrap();
        for (at, n) in [
            (1_000_000u64, 777_777u32),
            (12_345, 987_655),
            (1_777_777, 222_223),
        ] {
            let bytes = fs.read(z, fh, at, n).unwrap();
            fs.served(at, bytes);
        }
        fs.release(fh);
        filled(&fs);
        let (_, how) = fs.open(z, false).unwrap();
        let Open::Backed(b) = how else {
            panic!("not backed")
        };
        assert_eq!(contents(&b), data);
    }

    #[test]
    fn nothing_is_backed_without_passthrough_or_room() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![7u8; 1 << 20];
        let fs = zstd_fs(dir.path(), &data, 1 << 30);
        let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
        for _ in 0..2 {
            let (fh, how) = fs.open(z, false).unwrap();
            // No backing file to come: the kernel's page cache keeps it.
            assert!(matches!(how, Open::Served(CacheMode::KeepCache)));
            read_all(&fs, z, fh, data.len());
            fs.release(fh);
            filled(&fs);
        }
        assert_eq!(fs.backings.gauges(), (0, 0));
        let dir2 = tempfile::tempdir().unwrap();
        let small = zstd_fs(dir2.path(), &data, 1000);
        small.set_passthrough(true);
        for _ in 0..2 {
            let (fh, how) = small.open(z, false).unwrap();
            assert!(matches!(how, Open::Served(_)));
            read_all(&small, z, fh, data.len());
            small.release(fh);
            filled(&small);
        }
        assert_eq!(small.backings.gauges(), (0, 0));
    }
}
