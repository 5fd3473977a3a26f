//! Tensor catalog -> filesystem tree: inodes, names, directories. Decides
//! where each tensor, part and sidecar lives and escapes names that cannot be
//! paths. Knows nothing about bytes or the kernel.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::views::Views;

mod mirror;

pub type Ino = u64;
type Lookup = HashMap<Arc<str>, Ino, BuildHasherDefault<Fnv>>;
/// Most entries of a directory searched without a table.
const SMALL_DIR: usize = 16;
pub const ROOT: Ino = 1;
/// The hidden directory at the top that holds `index.json` and `stats`.
pub const META_DIR: &str = ".ztensor";
const NAME_MAX: usize = 255;
/// Nodes a tensor of one or two dimensions makes with every view on.
const NODES_PER_TENSOR: usize = 8;

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
    /// `.npy/PATH.npy`: a header, then the bytes of the tensor's one part.
    Npy { tensor: usize },
    /// `.zarr/PATH/zarr.json` of a tensor's array.
    ZarrArray { tensor: usize },
    /// `zarr.json` of a group of the zarr view (`top`: its root).
    ZarrGroup { top: bool },
    /// `.safetensors/model.safetensors`
    Safetensors,
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

/// Where a tensor ended up.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Exposed path of the data file or sparse directory ("" if none).
    pub path: String,
    pub sidecar: String,
    /// Set when the path differs from the tensor name: why.
    pub escaped: Option<String>,
    /// The views that show it: `VIEW_*` bits.
    pub views: u8,
}

pub const VIEW_NPY: u8 = 1;
pub const VIEW_ZARR: u8 = 2;
pub const VIEW_SAFETENSORS: u8 = 4;

pub struct Tree {
    nodes: Vec<Node>,
    pub placements: Vec<Placement>,
    /// Directories that are a sparse tensor's parts, and `.ztensor`:
    /// nothing else goes in.
    sealed: std::collections::HashSet<Ino>,
    /// (directory, name) -> the directory made instead, for names that were
    /// taken: every later tensor under the same name goes there too.
    moved: HashMap<(Ino, String), Ino>,
    /// Top-level directories of the mount's own (`.ztensor`, the views').
    reserved: std::collections::HashSet<Ino>,
    /// Names the views repeat, shared (see `Tree::common`).
    common: std::collections::HashSet<Arc<str>>,
}

impl Tree {
    /// Lays out every tensor of `catalog`, and the `views` of them. Tensors
    /// are placed in index order; when two would take the same path, the
    /// first keeps it.
    pub fn build(catalog: &Catalog, views: Views) -> Tree {
        // Room for what a tensor usually makes (its file and sidecar, the
        // npy file, the zarr array's directory, zarr.json and chunk path):
        // a vector of 10^6 nodes grown by doubling is moved at every step.
        let mut nodes = Vec::with_capacity(NODES_PER_TENSOR * catalog.len() + 16);
        nodes.push(Node {
            parent: ROOT,
            name: "".into(),
            kind: new_dir(),
        });
        let mut tree = Tree {
            nodes,
            placements: Vec::with_capacity(catalog.len()),
            sealed: Default::default(),
            moved: HashMap::default(),
            reserved: Default::default(),
            common: Default::default(),
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
            let parts = t.parts.as_ref().ok().map(|ps| {
                let names = ps.iter().map(|p| p.name.as_str()).collect();
                (t.directory, names)
            });
            let p = tree.place(ti, &t.name, parts);
            tree.placements.push(p);
        }
        tree.add_views(catalog, views);
        tree
    }

    fn add(&mut self, parent: Ino, name: impl Into<Arc<str>>, kind: NodeKind) -> Ino {
        let name: Arc<str> = name.into();
        let ino = self.nodes.len() as Ino + 1;
        let is_dir = matches!(kind, NodeKind::Dir { .. });
        if let NodeKind::Dir {
            entries,
            lookup,
            subdirs,
        } = &mut self.nodes[(parent - 1) as usize].kind
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
        self.nodes.push(Node { parent, name, kind });
        ino
    }

    /// Makes room in `dir` for `n` more entries (a top directory that will
    /// hold one per tensor grows once, not twenty times).
    fn reserve(&mut self, dir: Ino, n: usize) {
        if let Some(NodeKind::Dir {
            entries, lookup, ..
        }) = self.nodes.get_mut((dir - 1) as usize).map(|n| &mut n.kind)
        {
            entries.reserve(n);
            if let Some(table) = lookup {
                table.reserve(n);
            }
        }
    }

    fn child(&self, dir: Ino, name: &str) -> Option<Ino> {
        match &self.node(dir)?.kind {
            NodeKind::Dir {
                lookup: Some(table),
                ..
            } => table.get(name).copied(),
            NodeKind::Dir { entries, .. } => {
                entries.iter().find(|(n, _)| &**n == name).map(|e| e.1)
            }
            NodeKind::File(_) => None,
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        matches!(self.node(ino).map(|n| &n.kind), Some(NodeKind::Dir { .. }))
    }

    /// `parts`: None for an unsupported tensor (sidecar only), else
    /// (is_sparse, part names).
    fn place(&mut self, ti: usize, name: &str, parts: Option<(bool, Vec<&str>)>) -> Placement {
        let mut why: Vec<String> = Vec::new();
        let comps: Vec<String> = name
            .split('/')
            .map(|c| escape_component(c, &mut why))
            .collect();
        let (leaf, dirs) = comps
            .split_last()
            .map(|(l, d)| (l.clone(), d.to_vec()))
            .unwrap_or_default();

        // Walk or create the directories; a component that is a file already
        // gets a suffix so this tensor gets a directory of its own.
        let mut dir = ROOT;
        let mut path = String::new();
        for c in &dirs {
            let mut c = c.clone();
            match self.child(dir, &c) {
                Some(ino) if self.is_dir(ino) && !self.sealed.contains(&ino) => dir = ino,
                Some(ino) => {
                    why.push(if self.reserved.contains(&ino) {
                        format!("{c} is reserved")
                    } else if self.is_dir(ino) {
                        format!("{c:?} is a sparse tensor's directory of parts")
                    } else {
                        format!("{c:?} is already a file")
                    });
                    let key = (dir, c.clone());
                    let moved = match self.moved.get(&key) {
                        Some(&d) => d,
                        None => {
                            let free = self.free_name(dir, &c, ti, &[]);
                            let d = self.add(dir, free, new_dir());
                            self.moved.insert(key, d);
                            d
                        }
                    };
                    c = self.node(moved).map_or(c, |n| n.name.to_string());
                    dir = moved;
                }
                None => dir = self.add(dir, c.clone(), new_dir()),
            }
            path.push_str(&c);
            path.push('/');
        }
        // The leaf: a data file (or sparse directory) plus `leaf.json`, both free.
        let mut leaf = leaf;
        if let Some(ino) = self.child(dir, &leaf)
            && self.reserved.contains(&ino)
        {
            why.push(format!("{leaf} is reserved"));
            leaf = self.free_name(dir, &leaf, ti, &[".json"]);
        }
        let mut sidecar = format!("{leaf}.json");
        if self.child(dir, &leaf).is_some() || self.child(dir, &sidecar).is_some() {
            why.push(format!("{leaf:?} or {leaf:?}.json is already taken"));
            leaf = self.free_name(dir, &leaf, ti, &[".json"]);
            sidecar = format!("{leaf}.json");
        }
        let mut placement = Placement {
            path: String::new(),
            sidecar: format!("{path}{sidecar}"),
            escaped: None,
            views: 0,
        };
        match parts {
            None => {}
            Some((false, _)) => {
                self.add(
                    dir,
                    leaf.clone(),
                    NodeKind::File(Content::Part {
                        tensor: ti,
                        part: 0,
                    }),
                );
                placement.path = format!("{path}{leaf}");
            }
            Some((true, names)) => {
                let sdir = self.add(dir, leaf.clone(), new_dir());
                self.sealed.insert(sdir);
                for (part, pname) in names.into_iter().enumerate() {
                    let pname = escape_component(pname, &mut why);
                    self.add(
                        sdir,
                        pname.clone(),
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
                placement.path = format!("{path}{leaf}");
            }
        }
        self.add(
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

    pub fn node(&self, ino: Ino) -> Option<&Node> {
        ino.checked_sub(1).and_then(|i| self.nodes.get(i as usize))
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Option<Ino> {
        self.child(parent, name)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
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

/// FNV-1a for the directory tables: names are short, and it is several
/// times faster than SipHash over 10^5 entries. A crafted file can only make
/// its own lookups slower.
#[derive(Default)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf29ce484222325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
        self.0 = h;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Makes one path component safe: `%` for empty, `%2E`/`%2E%2E` for the
/// dot names, `%00` for each NUL byte (a path cannot hold one: the kernel
/// would end the name there, and `a\0b` would shadow `a`), and a hashed
/// tail for names over 255 bytes.
fn escape_component(c: &str, why: &mut Vec<String>) -> String {
    let nul_free;
    let c = if c.contains('\0') {
        why.push("a NUL byte in the name".into());
        nul_free = c.replace('\0', "%00");
        nul_free.as_str()
    } else {
        c
    };
    match c {
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
        _ if c.len() > NAME_MAX - 5 => {
            why.push(format!("component of {} bytes is too long", c.len()));
            fit(c, 5)
        }
        _ => c.to_string(),
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
