//! The filesystem as the kernel sees it, minus the kernel: lookups,
//! attributes, directory listings, opens and reads over the tree and the data
//! layer. `fuse.rs` only translates between this and fuser, so everything
//! here can be tested without a mount.
//!
//! Here: the tree's side (lookups, attributes, listings, generated files,
//! xattrs). `open` decides per open between a backing file and the
//! daemon, `read` serves the daemon's reads and writes them through,
//! `clone` backs raw tensors with clones of their range.

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
use crate::serve::data::{Bytes, Copies, Data, DataOptions, Hold, scratch};
use crate::serve::stats::Stats;
use crate::source::MappedFile;
use crate::views::{self, Composed, Entry, ViewSet, Views};

mod clone;
mod live;
mod open;
#[cfg(test)]
mod passthrough_tests;
mod read;
#[cfg(test)]
mod tests;

use open::*;
pub use read::Served;

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
    /// Its size changes all the time (`.ztensor/stats`): the kernel keeps
    /// no attributes of it.
    pub live: bool,
}

/// How an opened file is read.
#[derive(Clone, Debug)]
pub enum Open {
    /// By the daemon, cached by the kernel as the mode says.
    Served(CacheMode),
    /// By the kernel itself, from this file (FUSE passthrough).
    Backed(Arc<Backing>),
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
    /// Answer extended attributes (else getxattr gets ENOSYS, which the
    /// kernel remembers: no getxattr reaches the daemon again; listxattr
    /// gets an empty list).
    pub xattrs: bool,
    /// Backing files for passthrough.
    pub backing: BackingOptions,
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
    /// The latest texts of the live generated files.
    live: live::Live,
    /// Held while index.json is rendered for an open.
    index_render: Mutex<()>,
    next_fh: AtomicU64,
    /// Renders made, for the tests.
    #[cfg(test)]
    renders: AtomicU64,
}

/// The views `on` names, made of `catalog`. The safetensors view compares
/// its header with the first source file's own (a remote object's is in
/// its cache file since the index was read). Read as an index is: a read
/// from the start that starts no read-ahead of the tensors behind it.
fn make_views(catalog: &Catalog, files: &[Option<MappedFile>], on: Views) -> ViewSet {
    let first = files.first().and_then(Option::as_ref);
    let read_at = |buf: &mut [u8], at: u64| match first {
        Some(f) => {
            f.ensure_all(&[(at, buf.len() as u64)], true)
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

/// The tree of `catalog` with its views. The views are made on a second
/// core while the tree is built: the safetensors view's header, like the
/// tree, is a pass over every tensor.
fn build_tree(catalog: &Arc<Catalog>, files: &[Option<MappedFile>], on: Views) -> Tree {
    let (made, tree) = std::thread::scope(|s| {
        let made = s.spawn(|| make_views(catalog, files, on));
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
    tree
}

/// Logs each tensor listed but not served, and each served under another
/// name than its own.
fn log_not_as_named(catalog: &Catalog, tree: &Tree) {
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
}

/// How the spills (the data layer's) and the backing files (the mount's)
/// share `--decoded-cache-size` and `--cache-dir`: each may take the room
/// of the other's idle files, and a spill that a read needs may take the
/// room of files being written only for speed.
fn share_room(
    data: &Arc<Data>,
    backings: &Arc<Backings>,
    tree: &Arc<Tree>,
    opens: &Arc<Mutex<Opens>>,
) {
    // A spill may take the share of the files being written of what
    // shows its tensor (its own file, a view's) that could never be
    // kept beside it, and of the spills idle readers hold.
    let (files, of, shown, readers) = (
        Arc::downgrade(backings),
        Arc::downgrade(data),
        Arc::downgrade(tree),
        Arc::downgrade(opens),
    );
    data.on_spill_reserved(Box::new(move |bi, which| {
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
        // Copies kept for speed yield to a spill a read needs, once
        // nothing idle is left to make room.
        if which == Copies::All {
            // One at a time, the largest first: the spill asks again
            // while it is short of room.
            return files.give_up_writing(|_, _| true, 1);
        }
        // First the tensor's own file (never written: the spill
        // becomes its backing), and views' files that could never be
        // kept beside the spill; others only once idle spills and files
        // made no room (`Copies::All` above).
        let disk = data.decoded_disk();
        let decoded = data.catalog().blobs.get(bi).map_or(0, |b| b.decoded_len);
        files.give_up_writing(
            |c, len| {
                let never =
                    matches!(c, Content::Part { .. }) || len.saturating_add(decoded) > disk.limit();
                never
                    && any_part_of(&tree, &data, c, |t, p| {
                        part_of(&data, t, p).is_some_and(|p| p.blob == bi)
                    })
            },
            usize::MAX,
        )
    }));
    let named = Arc::downgrade(tree);
    backings.name_files_with(Box::new(move |ino| {
        named.upgrade().map_or_else(String::new, |t| t.path(ino))
    }));
    // Filled files that need room may take an idle spill's share.
    let spills = Arc::downgrade(data);
    backings.on_spills_full(Box::new(move || {
        spills.upgrade().is_some_and(|d| d.drop_an_idle_spill())
    }));
    // A spill that does not fit may take the disk of filled backing
    // files no open holds: both live in `--cache-dir`.
    let weak = Arc::downgrade(backings);
    data.on_disk_full(Box::new(move || {
        weak.upgrade().is_some_and(|b| b.drop_idle())
    }));
}

impl TensorFs {
    /// Serves `catalog` from `files` (one per `catalog.sources`).
    pub fn new(
        catalog: Catalog,
        files: Vec<Option<MappedFile>>,
        opts: FsOptions,
    ) -> std::io::Result<TensorFs> {
        let catalog = Arc::new(catalog);
        let tree = build_tree(&catalog, &files, opts.views);
        log_not_as_named(&catalog, &tree);
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
        share_room(&data, &backings, &tree, &opens);
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
            live: live::Live::default(),
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
                live: false,
            },
            NodeKind::File(c) => Attr {
                ino,
                kind: Kind::File,
                size: self.size_of(ino, c),
                perm: 0o444,
                nlink: 1,
                live: is_live(c),
            },
        })
    }

    fn size_of(&self, ino: Ino, c: &Content) -> u64 {
        match c {
            Content::Part { tensor, part } => self.part(*tensor, *part).map_or(0, |p| p.nbytes),
            Content::ViewData { .. } => self.composed(c).map_or(0, |f| f.size),
            // Changes all the time: the size of the text the next open
            // gets (see `live`).
            Content::Stats | Content::Errors => self
                .live
                .text(ino, live::Asker::Stat, || self.render(ino, c).map(Arc::new))
                .map_or(0, |t| t.len() as u64),
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

    /// The text of generated file `ino`, shared with its other open handles.
    fn rendered(&self, ino: Ino, c: &Content) -> Result<Text, Errno> {
        if is_live(c) {
            let render = || self.render(ino, c).map(Arc::new);
            return self.live.text(ino, live::Asker::Open, render);
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
    /// None without `--xattrs`: an empty list, as a file system without
    /// xattrs gives (`tar --xattrs` and `rsync -X` then say nothing), where
    /// `getxattr` gets ENOSYS so that `ls -l` asks the daemon nothing.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        if !self.xattrs {
            return self.tree.node(ino).map(|_| Vec::new()).ok_or(libc::ENOENT);
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

/// Whether generated file `c` changes all the time (read with direct I/O,
/// its attributes never kept by the kernel).
fn is_live(c: &Content) -> bool {
    matches!(c, Content::Stats | Content::Errors)
}
