//! The group graph, walked from the root: groups as symbol tables (a
//! version 1 B-tree of symbol nodes naming entries in a local heap) or as
//! link messages in their header. Every dataset found is returned with its
//! path; a group that cannot be read here is returned with the reason.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::dense;
use super::header::{self, Message};
use super::read::{Cur, H5, Res};

/// Group nesting the walk follows.
pub const MAX_DEPTH: usize = 64;
/// Links, B-tree nodes and symbol nodes one file may make the walk visit
/// (a file whose groups share children can name one object many times).
pub const MAX_VISITS: u64 = 200_000;

/// What the walk found at one path.
pub enum Found<'a> {
    /// A dataset: its header's address and messages (shared by every path
    /// that reaches it).
    Dataset(u64, Rc<Vec<Message<'a>>>),
    /// A group (or link) that is not read, and why; the rest of the file is.
    Refused(String),
}

pub struct Walk<'a> {
    f: H5<'a>,
    visits: u64,
    /// Headers already read, by address: a file whose groups share
    /// children names one object many times, and it is read once.
    headers: HashMap<u64, Rc<Vec<Message<'a>>>>,
    pub found: Vec<(String, Found<'a>)>,
    /// The root group's header messages (its attributes).
    pub root: Vec<Message<'a>>,
}

/// Walks the file from the root group at `root`; `cache`: the symbol table
/// a version 0/1 superblock's root entry names.
pub fn walk<'a>(f: H5<'a>, root: u64, cache: Option<(u64, u64)>) -> Res<Walk<'a>> {
    let mut w = Walk {
        f,
        visits: 0,
        headers: HashMap::new(),
        found: Vec::new(),
        root: Vec::new(),
    };
    let msgs = header::messages(&f, root).map_err(|e| format!("root group: {e}"))?;
    let mut path = vec![root];
    let kind = classify(&msgs);
    match kind {
        Kind::Dataset => return Err("the root object is a dataset, not a group".into()),
        Kind::Other if cache.is_none() => {
            return Err("the root object is not a group".into());
        }
        _ => {}
    }
    let links = match (kind, cache) {
        (Kind::Other, Some((bt, heap))) => w.symbol_table(bt, heap, "/")?,
        _ => match w.links(&msgs, "/")? {
            Ok(l) => l,
            Err(why) => return Err(format!("root group: {why}")),
        },
    };
    w.root = msgs;
    w.children("", links, &mut path)?;
    Ok(w)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Group,
    Dataset,
    Other,
}

fn classify(msgs: &[Message]) -> Kind {
    if msgs.iter().any(|m| matches!(m.kind, 0x02 | 0x06 | 0x11)) {
        Kind::Group
    } else if msgs.iter().any(|m| m.kind == 0x08) {
        Kind::Dataset
    } else {
        Kind::Other
    }
}

/// A link to follow: name and object header address.
type Link = (String, u64);

impl<'a> Walk<'a> {
    fn visit(&mut self) -> Res<()> {
        self.visits += 1;
        if self.visits > MAX_VISITS {
            return Err(format!(
                "the group graph makes the reader visit more than {MAX_VISITS} links and nodes"
            ));
        }
        Ok(())
    }

    fn children(&mut self, prefix: &str, mut links: Vec<Link>, path: &mut Vec<u64>) -> Res<()> {
        links.sort();
        if path.len() > MAX_DEPTH {
            return Err(format!("groups nest deeper than {MAX_DEPTH} at {prefix:?}"));
        }
        for (name, addr) in links {
            self.visit()?;
            let full = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            if path.contains(&addr) {
                self.found.push((
                    full.clone(),
                    Found::Refused(format!(
                        "a link back to a group that contains it (a cycle): {full:?} not followed"
                    )),
                ));
                continue;
            }
            let msgs = match self.headers.get(&addr) {
                Some(m) => m.clone(),
                None => {
                    let m =
                        header::messages(&self.f, addr).map_err(|e| format!("{full:?}: {e}"))?;
                    let m = Rc::new(m);
                    self.headers.insert(addr, m.clone());
                    m
                }
            };
            match classify(&msgs) {
                Kind::Dataset => self.found.push((full, Found::Dataset(addr, msgs))),
                Kind::Other => {} // a committed datatype, or nothing served
                Kind::Group => {
                    let links = match self.links(&msgs, &full)? {
                        Ok(l) => l,
                        Err(why) => {
                            self.found.push((full, Found::Refused(why)));
                            continue;
                        }
                    };
                    path.push(addr);
                    self.children(&full, links, path)?;
                    path.pop();
                }
            }
        }
        Ok(())
    }

    /// The links of a group stored in its header (compact storage), or why
    /// they are not read (dense storage).
    fn links(&mut self, msgs: &[Message], at: &str) -> Res<Result<Vec<Link>, String>> {
        if let Some(m) = msgs.iter().find(|m| m.kind == 0x11) {
            let mut c = Cur::new(m.body, self.f.o, self.f.l);
            let bt = c.addr("symbol table message")?;
            let heap = c.addr("symbol table message")?;
            return self.symbol_table(bt, heap, at).map(Ok);
        }
        if let Some(m) = msgs.iter().find(|m| m.kind == 0x02) {
            let mut c = Cur::new(m.body, self.f.o, self.f.l);
            let _version = c.u8("link info")?;
            let flags = c.u8("link info")?;
            if flags & 1 != 0 {
                c.skip(8, "link info")?;
            }
            let heap = c.addr("link info")?;
            let btree = c.addr("link info")?;
            if !self.f.undefined(heap) {
                let objs = match dense::links(&self.f, heap, btree) {
                    Ok(o) => o,
                    Err(why) => {
                        return Ok(Err(format!(
                            "group {at:?} keeps its links in dense storage that cannot be read: {why}"
                        )));
                    }
                };
                let mut out = Vec::new();
                for body in objs {
                    self.visit()?;
                    if let Some(l) =
                        link(body, self.f.o).map_err(|e| format!("group {at:?}: {e}"))?
                    {
                        out.push(l);
                    }
                }
                return Ok(Ok(out));
            }
        }
        let mut out = Vec::new();
        for m in msgs.iter().filter(|m| m.kind == 0x06) {
            if let Some(l) = link(m.body, self.f.o).map_err(|e| format!("group {at:?}: {e}"))? {
                out.push(l);
            }
        }
        Ok(Ok(out))
    }

    /// The entries of a symbol-table group: B-tree, symbol nodes, names in
    /// the local heap.
    fn symbol_table(&mut self, btree: u64, heap: u64, at: &str) -> Res<Vec<Link>> {
        let err = |e: String| format!("group {at:?}: {e}");
        let mut c = self.f.at(heap, "local heap").map_err(err)?;
        c.tag(b"HEAP", "local heap").map_err(err)?;
        c.skip(4, "local heap").map_err(err)?;
        let size = c.len("local heap").map_err(err)?;
        c.len("local heap").map_err(err)?;
        let data_addr = c.addr("local heap").map_err(err)?;
        let names = self
            .f
            .slice(data_addr, size, "local heap data")
            .map_err(err)?;
        let mut snods = Vec::new();
        let mut seen = HashSet::new();
        self.group_node(btree, 0, &mut snods, &mut seen)
            .map_err(err)?;
        let mut out = Vec::new();
        for s in snods {
            self.visit()?;
            let mut c = self.f.at(s, "symbol node").map_err(err)?;
            c.tag(b"SNOD", "symbol node").map_err(err)?;
            c.skip(2, "symbol node").map_err(err)?;
            let n = c.u16("symbol node").map_err(err)?;
            for _ in 0..n {
                let off = c.addr("symbol entry").map_err(err)?;
                let addr = c.addr("symbol entry").map_err(err)?;
                let cache_type = c.u32("symbol entry").map_err(err)?;
                c.skip(20, "symbol entry").map_err(err)?;
                // Cache type 2: a soft link (its target path in the heap,
                // its address undefined), not followed.
                if cache_type == 2 {
                    continue;
                }
                let name = heap_name(names, off).map_err(err)?;
                out.push((name, addr));
            }
        }
        Ok(out)
    }

    fn group_node(
        &mut self,
        addr: u64,
        depth: usize,
        out: &mut Vec<u64>,
        seen: &mut HashSet<u64>,
    ) -> Res<()> {
        self.visit()?;
        if depth > MAX_DEPTH || !seen.insert(addr) {
            return Err(format!(
                "B-tree node at {addr:#x} is reached twice or too deep"
            ));
        }
        let mut c = self.f.at(addr, "B-tree node")?;
        c.tag(b"TREE", "B-tree node")?;
        let kind = c.u8("B-tree node")?;
        if kind != 0 {
            return Err(format!("B-tree node at {addr:#x}: type {kind} in a group"));
        }
        let level = c.u8("B-tree node")?;
        let n = c.u16("B-tree node")?;
        c.addr("B-tree node")?;
        c.addr("B-tree node")?;
        for _ in 0..n {
            c.len("B-tree key")?;
            let child = c.addr("B-tree child")?;
            if level == 0 {
                out.push(child);
            } else {
                self.group_node(child, depth + 1, out, seen)?;
            }
        }
        Ok(())
    }
}

fn heap_name(names: &[u8], off: u64) -> Res<String> {
    let rest = usize::try_from(off)
        .ok()
        .and_then(|o| names.get(o..))
        .ok_or_else(|| format!("a name at {off} lies outside the local heap"))?;
    let n = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or("a name in the local heap has no end")?;
    name(&rest[..n])
}

/// A link's name. `.` and `..` are names like any in HDF5 (h5py writes
/// and reads a dataset called `..`); the tree escapes them as it does in
/// every format. A `/` would split the name, and HDF5 writes none.
fn name(b: &[u8]) -> Res<String> {
    let s = std::str::from_utf8(b).map_err(|_| "a link name is not UTF-8".to_string())?;
    if s.is_empty() || s.contains('/') || s.contains('\0') {
        return Err(format!("link name {s:?} is not a name"));
    }
    Ok(s.to_string())
}

/// A link message: a hard link's name and address; `None` for soft and
/// external links (not followed).
fn link(body: &[u8], o: usize) -> Res<Option<Link>> {
    let mut c = Cur::new(body, o, 8);
    let version = c.u8("link message")?;
    if version != 1 {
        return Err(format!("link message version {version}"));
    }
    let flags = c.u8("link message")?;
    let kind = if flags & 0x08 != 0 {
        c.u8("link message")?
    } else {
        0
    };
    if flags & 0x04 != 0 {
        c.skip(8, "link message")?;
    }
    if flags & 0x10 != 0 {
        c.skip(1, "link message")?;
    }
    let n = c.uint(1 << (flags & 3), "link message")?;
    let n = usize::try_from(n).map_err(|_| "link name too long".to_string())?;
    let nm = name(c.bytes(n, "link name")?)?;
    if kind != 0 {
        return Ok(None);
    }
    Ok(Some((nm, c.addr("link address")?)))
}
