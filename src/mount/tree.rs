//! Tensor catalog -> filesystem tree: inodes, names, directories. Decides
//! where each tensor, part and sidecar lives and escapes names that cannot be
//! paths. Knows nothing about bytes or the kernel.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::catalog::{Catalog, Part};
use crate::views::{FileId, ViewSet, Views};

mod mirror;

pub type Ino = u64;
/// FxHash (rustc's): names are short, it reads them eight bytes at a
/// time, and a mount of 10^5 tensors hashes each name several times. A
/// crafted file can only make its own lookups slower.
type Lookup = HashMap<Arc<str>, Ino, rustc_hash::FxBuildHasher>;
/// Most entries of a directory searched without a table.
const SMALL_DIR: usize = 16;
pub const ROOT: Ino = 1;
/// The hidden directory at the top that holds `index.json` and `stats`.
pub const META_DIR: &str = ".ztensor";
const NAME_MAX: usize = 255;
/// Nodes a dense tensor makes at mount: its file and sidecar.
const NODES_PER_TENSOR: usize = 2;

/// What a regular file holds. Two files of equal content (a tensor's file
/// and its zarr chunk) hold the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Content {
    /// Exposed bytes of part `part` of tensor `tensor` (catalog indexes).
    Part { tensor: usize, part: usize },
    /// The sidecar of a tensor (`part` None) or of one sparse part.
    Sidecar { tensor: usize, part: Option<usize> },
    /// `.ztensor/index.json`
    Index,
    /// `.ztensor/stats`
    Stats,
    /// `.ztensor/errors`: each tensor that failed a read, and why.
    Errors,
    /// A view's file of generated text (`views::Made::Text`): view `view`
    /// (its id), file `file`.
    ViewText { view: u8, file: FileId },
    /// A view's file of a header and tensors' bytes (`views::Made::Data`).
    ViewData { view: u8, file: FileId },
}

#[derive(Debug)]
pub enum NodeKind {
    Dir {
        entries: Vec<(Arc<str>, Ino)>,
        /// Built once the directory has more than [`SMALL_DIR`] entries; a
        /// small one is searched in order (most directories are a zarr
        /// array's two or three entries, and a table each cost a tenth of
        /// the mount's time for 10^5 tensors).
        lookup: Option<Box<Lookup>>,
        /// How many entries are directories: a stat gives 2 + this as the
        /// link count without a walk over 10^5 entries.
        subdirs: u32,
    },
    File(Content),
}

#[derive(Debug)]
pub struct Node {
    pub parent: Ino,
    /// Shared with the parent's entry list and lookup table.
    pub name: Arc<str>,
    pub kind: NodeKind,
}

/// Where a tensor ended up: its nodes (their paths are the names on the
/// way up, see [`Tree::path`]), not copies of its paths.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// The data file or sparse directory (0 if none).
    pub file: Ino,
    pub sidecar: Ino,
    /// Set when the path differs from the tensor name: why.
    pub escaped: Option<String>,
    /// The views (bit `id`) of files made at mount that show it (the
    /// mirroring views' bits are known once their directories are laid
    /// out: see [`Tree::views_of`]).
    pub views: u8,
}

pub struct Tree {
    /// Every node but the views' mirrors: inode `i` is `nodes[i - 1]`.
    nodes: Vec<Node>,
    pub placements: Vec<Placement>,
    catalog: Arc<Catalog>,
    /// The views the tree shows (see [`Tree::add_views`]).
    views: Arc<ViewSet>,
    /// The mirroring views' top directories, with the view's id: their
    /// contents (and every inode after `nodes`) are laid out on first use.
    mirror_tops: Vec<(Ino, u8)>,
    mirrors: OnceLock<mirror::Mirrors>,
    /// Directories that are a sparse tensor's parts, and `.ztensor`:
    /// nothing else goes in.
    sealed: std::collections::HashSet<Ino>,
    /// (directory, name) -> the directory made instead, for names that were
    /// taken: every later tensor under the same name goes there too.
    moved: HashMap<(Ino, String), Ino>,
    /// Top-level directories of the mount's own (`.ztensor`, the views').
    reserved: std::collections::HashSet<Ino>,
}

impl Tree {
    /// Lays out every tensor of `catalog`, with the top directories of the
    /// views `views` names (their files come with [`Tree::add_views`]).
    /// Tensors are placed in index order; when two would take the same
    /// path, the first keeps it.
    pub fn build(catalog: Arc<Catalog>, views: Views) -> Tree {
        // Room for what a tensor makes here (its file and sidecar): a
        // vector of 10^5 nodes grown by doubling is moved at every step.
        let mut nodes = Vec::with_capacity(NODES_PER_TENSOR * catalog.len() + 16);
        nodes.push(Node {
            parent: ROOT,
            name: "".into(),
            kind: new_dir(),
        });
        let mut tree = Tree {
            nodes,
            placements: Vec::with_capacity(catalog.len()),
            catalog: catalog.clone(),
            views: Default::default(),
            mirror_tops: Vec::new(),
            mirrors: OnceLock::new(),
            sealed: Default::default(),
            moved: HashMap::default(),
            reserved: Default::default(),
        };
        let meta = tree.add(ROOT, META_DIR.to_string(), new_dir());
        tree.sealed.insert(meta);
        tree.reserved.insert(meta);
        tree.add(meta, "index.json", NodeKind::File(Content::Index));
        tree.add(meta, "stats", NodeKind::File(Content::Stats));
        tree.add(meta, "errors", NodeKind::File(Content::Errors));
        tree.reserve_views(views);
        let top = catalog
            .tensors
            .iter()
            .filter(|t| !t.name.contains('/'))
            .count();
        tree.reserve(ROOT, 2 * top);
        for (ti, t) in catalog.tensors.iter().enumerate() {
            let parts = t.parts.as_ref().ok().map(|ps| (t.directory, &ps[..]));
            let p = tree.place(ti, &t.name, parts);
            tree.placements.push(p);
        }
        tree
    }

    fn add(&mut self, parent: Ino, name: impl Into<Arc<str>>, kind: NodeKind) -> Ino {
        let name: Arc<str> = name.into();
        let ino = self.nodes.len() as Ino + 1;
        if let Some(dir) = self.nodes.get_mut((parent - 1) as usize) {
            enter(&mut dir.kind, &name, ino, &kind);
        }
        self.nodes.push(Node { parent, name, kind });
        ino
    }

    /// Makes room in `dir` for `n` more entries (a top directory that will
    /// hold one per tensor grows once, not twenty times).
    fn reserve(&mut self, dir: Ino, n: usize) {
        if let Some(node) = self.nodes.get_mut((dir - 1) as usize) {
            reserve(&mut node.kind, n);
        }
    }

    /// The entry `name` of `dir` among the nodes made so far (while
    /// placing tensors: no view's mirror is asked for).
    fn child(&self, dir: Ino, name: &str) -> Option<Ino> {
        find(&self.nodes.get(dir.checked_sub(1)? as usize)?.kind, name)
    }

    fn is_dir(&self, ino: Ino) -> bool {
        let node = ino.checked_sub(1).and_then(|i| self.nodes.get(i as usize));
        matches!(node.map(|n| &n.kind), Some(NodeKind::Dir { .. }))
    }

    /// `parts`: None for an unsupported tensor (sidecar only), else
    /// (is a directory of parts, the parts).
    fn place(&mut self, ti: usize, name: &str, parts: Option<(bool, &[Part])>) -> Placement {
        let mut why: Vec<String> = Vec::new();
        let mut comps: Vec<Cow<str>> = name
            .split('/')
            .map(|c| escape_component(c, &mut why))
            .collect();
        // `split` yields at least one component: the leaf.
        let leaf = comps.pop().unwrap_or_default();

        // Walk or create the directories; a component that is a file already
        // gets a suffix so this tensor gets a directory of its own.
        let mut dir = ROOT;
        for c in &comps {
            let c: &str = c;
            match self.child(dir, c) {
                Some(ino) if self.is_dir(ino) && !self.sealed.contains(&ino) => dir = ino,
                Some(ino) => {
                    why.push(if self.reserved.contains(&ino) {
                        format!("{c} is reserved")
                    } else if self.is_dir(ino) {
                        format!("{c:?} is a sparse tensor's directory of parts")
                    } else {
                        format!("{c:?} is already a file")
                    });
                    let key = (dir, c.to_string());
                    dir = match self.moved.get(&key) {
                        Some(&d) => d,
                        None => {
                            let free = self.free_name(dir, c, ti, &[]);
                            let d = self.add(dir, free, new_dir());
                            self.moved.insert(key, d);
                            d
                        }
                    };
                }
                None => dir = self.add(dir, c, new_dir()),
            }
        }
        // The leaf: a data file (or sparse directory) plus `leaf.json`, both free.
        let mut leaf = leaf;
        if let Some(ino) = self.child(dir, &leaf)
            && self.reserved.contains(&ino)
        {
            why.push(format!("{leaf} is reserved"));
            leaf = self.free_name(dir, &leaf, ti, &[".json"]).into();
        }
        let mut sidecar = format!("{leaf}.json");
        if self.child(dir, &leaf).is_some() || self.child(dir, &sidecar).is_some() {
            why.push(format!("{leaf:?} or {leaf:?}.json is already taken"));
            leaf = self.free_name(dir, &leaf, ti, &[".json"]).into();
            sidecar = format!("{leaf}.json");
        }
        let mut placement = Placement::default();
        match parts {
            None => {}
            Some((false, _)) => {
                placement.file = self.add(
                    dir,
                    &*leaf,
                    NodeKind::File(Content::Part {
                        tensor: ti,
                        part: 0,
                    }),
                );
            }
            Some((true, parts)) => {
                let sdir = self.add(dir, &*leaf, new_dir());
                placement.file = sdir;
                self.sealed.insert(sdir);
                for (part, p) in parts.iter().enumerate() {
                    let pname = escape_component(&p.name, &mut why);
                    self.add(
                        sdir,
                        &*pname,
                        NodeKind::File(Content::Part { tensor: ti, part }),
                    );
                    self.add(
                        sdir,
                        format!("{pname}.json"),
                        NodeKind::File(Content::Sidecar {
                            tensor: ti,
                            part: Some(part),
                        }),
                    );
                }
            }
        }
        placement.sidecar = self.add(
            dir,
            sidecar,
            NodeKind::File(Content::Sidecar {
                tensor: ti,
                part: None,
            }),
        );
        if !why.is_empty() {
            placement.escaped = Some(why.join("; "));
        }
        placement
    }

    /// `base~N` (N = tensor index), lengthened until no `base~N` + suffix is taken.
    fn free_name(&self, dir: Ino, base: &str, ti: usize, suffixes: &[&str]) -> String {
        let mut cand = fit(&format!("{base}~{ti}"), 5);
        let taken = |c: &str| {
            self.child(dir, c).is_some()
                || suffixes
                    .iter()
                    .any(|s| self.child(dir, &format!("{c}{s}")).is_some())
        };
        while taken(&cand) {
            cand = fit(&format!("{cand}~"), 5);
        }
        cand
    }

    /// Node `ino`; asking for a view's mirror (its top directory or a node
    /// in it) lays the mirrors out first.
    pub fn node(&self, ino: Ino) -> Option<&Node> {
        let i = ino.checked_sub(1)? as usize;
        match self.nodes.get(i) {
            Some(_) if self.mirror_tops.iter().any(|&(i, _)| i == ino) => self.mirrors().top(ino),
            Some(node) => Some(node),
            None if self.mirror_tops.is_empty() => None,
            None => self.mirrors().nodes.get(i - self.nodes.len()),
        }
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Option<Ino> {
        find(&self.node(parent)?.kind, name)
    }

    /// Every node, the views' mirrors included (laid out to count them).
    pub fn len(&self) -> usize {
        self.nodes.len()
            + self
                .mirror_tops
                .first()
                .map_or(0, |_| self.mirrors().nodes.len())
    }

    /// The nodes made at mount: inodes `1..=main_len()`. The mirrors'
    /// nodes come after them.
    pub fn main_len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The path of node `ino` in the mount ("" for the root or no node):
    /// the names on the way up.
    pub fn path(&self, ino: Ino) -> String {
        let mut names = Vec::new();
        let mut at = ino;
        while at != ROOT {
            let Some(node) = self.node(at) else {
                return String::new();
            };
            names.push(&*node.name);
            at = node.parent;
        }
        let mut out = String::with_capacity(names.iter().map(|n| n.len() + 1).sum());
        for (i, n) in names.iter().rev().enumerate() {
            if i > 0 {
                out.push('/');
            }
            out.push_str(n);
        }
        out
    }

    /// The exposed path of tensor `ti`'s data file or sparse directory
    /// ("" if none).
    pub fn path_of(&self, ti: usize) -> String {
        self.placements.get(ti).map_or_else(String::new, |p| {
            if p.file == 0 {
                String::new()
            } else {
                self.path(p.file)
            }
        })
    }

    /// The views that show tensor `ti`: bit `id` for each (lays the mirrors
    /// out when there are any).
    pub fn views_of(&self, ti: usize) -> u8 {
        let mirrored = match self.mirror_tops.first() {
            Some(_) => self.mirrors().views.get(ti).copied().unwrap_or(0),
            None => 0,
        };
        self.placements.get(ti).map_or(0, |p| p.views) | mirrored
    }

    /// Number of subdirectories of `ino` (for nlink).
    pub fn subdirs(&self, ino: Ino) -> usize {
        match self.node(ino).map(|n| &n.kind) {
            Some(NodeKind::Dir { subdirs, .. }) => *subdirs as usize,
            _ => 0,
        }
    }
}

fn new_dir() -> NodeKind {
    NodeKind::Dir {
        entries: Vec::new(),
        lookup: None,
        subdirs: 0,
    }
}

/// Enters `name` (node `ino`, of `kind`) in directory `dir` (nothing if
/// `dir` is a file).
fn enter(dir: &mut NodeKind, name: &Arc<str>, ino: Ino, kind: &NodeKind) {
    let is_dir = matches!(kind, NodeKind::Dir { .. });
    if let NodeKind::Dir {
        entries,
        lookup,
        subdirs,
    } = dir
    {
        entries.push((name.clone(), ino));
        match lookup {
            Some(table) => {
                table.insert(name.clone(), ino);
            }
            None if entries.len() > SMALL_DIR => {
                let mut table =
                    Lookup::with_capacity_and_hasher(entries.capacity(), Default::default());
                table.extend(entries.iter().cloned());
                *lookup = Some(Box::new(table));
            }
            None => {}
        }
        *subdirs += u32::from(is_dir);
    }
}

/// Makes room in directory `dir` for `n` more entries.
fn reserve(dir: &mut NodeKind, n: usize) {
    if let NodeKind::Dir {
        entries, lookup, ..
    } = dir
    {
        entries.reserve(n);
        if let Some(table) = lookup {
            table.reserve(n);
        }
    }
}

/// The entry `name` of directory `dir`.
fn find(dir: &NodeKind, name: &str) -> Option<Ino> {
    match dir {
        NodeKind::Dir {
            lookup: Some(table),
            ..
        } => table.get(name).copied(),
        NodeKind::Dir { entries, .. } => entries.iter().find(|(n, _)| &**n == name).map(|e| e.1),
        NodeKind::File(_) => None,
    }
}

/// Makes one path component safe: `%` for empty, `%2E`/`%2E%2E` for the
/// dot names, `%00` for each NUL byte (a path cannot hold one: the kernel
/// would end the name there, and `a\0b` would shadow `a`), and a hashed
/// tail for names over 255 bytes.
fn escape_component<'a>(c: &'a str, why: &mut Vec<String>) -> Cow<'a, str> {
    let c: Cow<str> = if c.contains('\0') {
        why.push("a NUL byte in the name".into());
        c.replace('\0', "%00").into()
    } else {
        c.into()
    };
    match &*c {
        "" => {
            why.push("empty path component".into());
            "%".into()
        }
        "." => {
            why.push("\".\" is not a file name".into());
            "%2E".into()
        }
        ".." => {
            why.push("\"..\" is not a file name".into());
            "%2E%2E".into()
        }
        long if long.len() > NAME_MAX - 5 => {
            why.push(format!("component of {} bytes is too long", long.len()));
            fit(long, 5).into()
        }
        _ => c,
    }
}

/// `name` with each control character (NUL, newline, escape, DEL, ...)
/// written as `%XX` per byte, the notation of the tree's escapes: for
/// listings printed to a terminal (`info`), where a raw one would move the
/// cursor or end the line.
pub fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return name.into();
    }
    let mut out = String::with_capacity(name.len() + 8);
    for ch in name.chars() {
        if ch.is_control() {
            let mut buf = [0u8; 4];
            for b in ch.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(ch);
        }
    }
    out.into()
}

/// Shortens `s` so that `s` plus `reserve` more bytes fits NAME_MAX, keeping
/// a prefix and a hash of the whole so distinct names stay distinct.
fn fit(s: &str, reserve: usize) -> String {
    if s.len() + reserve <= NAME_MAX {
        return s.to_string();
    }
    let hash = fnv1a(s.as_bytes());
    let keep = NAME_MAX - reserve - 17;
    let mut cut = keep;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hash:016x}", &s[..cut])
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}
