//! The views' hidden directories (see `crate::views`): a mirroring view's
//! holds the tree's directories, with the files the view places for each
//! tensor; another view's holds the files it makes at mount.
//!
//! The mirrors are laid out on first use, not at mount: they are most of
//! a mount's nodes (a zarr array is a directory, its `zarr.json` and its
//! chunk path), and a mount of 10^5 tensors is live sooner without them.
//! They are laid out whole, from the finished tree, so their nodes and
//! inode numbers are those a layout at mount would give.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Content, Ino, Node, NodeKind, ROOT, Tree, enter, find, new_dir, reserve};
use crate::views::{Made, Placed, VIEWS, View, ViewSet, Views};

/// The mirrors' nodes, once laid out.
pub(super) struct Mirrors {
    /// Inode `Tree::nodes.len() + 1 + i` is `nodes[i]`.
    pub(super) nodes: Vec<Node>,
    /// The top directories (`Tree::mirror_tops`, in order) with their
    /// entries.
    tops: Vec<(Ino, Node)>,
    /// The mirroring views (bit `id`) that show each tensor.
    pub(super) views: Vec<u8>,
}

impl Mirrors {
    pub(super) fn top(&self, ino: Ino) -> Option<&Node> {
        self.tops.iter().find(|(i, _)| *i == ino).map(|(_, n)| n)
    }
}

/// The node content of a file view `view` places (`tensor`: the tensor it
/// was placed for, whose bytes `Made::TensorBytes` are).
fn content(view: u8, what: Made, tensor: Option<usize>) -> Option<Content> {
    Some(match what {
        Made::Text(file) => Content::ViewText { view, file },
        Made::Data(file) => Content::ViewData { view, file },
        Made::TensorBytes => Content::Part {
            tensor: tensor?,
            part: 0,
        },
    })
}

impl Tree {
    /// Makes the views' top directories before any tensor is placed, so
    /// that tensors of those names are placed elsewhere.
    pub(super) fn reserve_views(&mut self, v: Views) {
        for (id, r) in VIEWS.iter().enumerate() {
            if !v.has(id) {
                continue;
            }
            let ino = self.add(ROOT, r.dir.to_string(), new_dir());
            self.sealed.insert(ino);
            self.reserved.insert(ino);
            if r.mirrors {
                self.mirror_tops.push((ino, id as u8));
            }
        }
    }

    /// Gives the tree the views made of its catalog (those whose
    /// directories [`Tree::build`] made), once every tensor is placed:
    /// the files of the views that do not mirror the tree are made now.
    pub fn add_views(&mut self, views: Arc<ViewSet>) {
        for (id, r, view) in views.made() {
            if r.mirrors {
                continue;
            }
            let Some(dir) = self.child(ROOT, r.dir) else {
                continue;
            };
            for (name, what) in view.top_files() {
                if let Some(c) = content(id, what, None) {
                    self.add(dir, name, NodeKind::File(c));
                }
            }
            for ti in view.shown() {
                if let Some(p) = self.placements.get_mut(ti) {
                    p.views |= 1 << id;
                }
            }
        }
        self.views = views;
    }

    /// The views the tree shows.
    pub fn views(&self) -> &ViewSet {
        &self.views
    }

    /// Lays out the mirroring views' directories now, if they are not yet
    /// (they are on first use otherwise).
    pub fn lay_out_views(&self) {
        if !self.mirror_tops.is_empty() {
            self.mirrors();
        }
    }

    /// Whether the mirrors are laid out yet.
    #[cfg(test)]
    pub(crate) fn mirrors_laid_out(&self) -> bool {
        self.mirrors.get().is_some()
    }

    pub(super) fn mirrors(&self) -> &Mirrors {
        self.mirrors.get_or_init(|| self.build_mirrors())
    }

    /// Every file of the mirrors, in tensor order, and for each tensor in
    /// the order of `VIEWS`.
    fn build_mirrors(&self) -> Mirrors {
        let c = &*self.catalog;
        let mirrored: Vec<(Ino, u8, &dyn View)> = self
            .mirror_tops
            .iter()
            .filter_map(|&(ino, id)| Some((ino, id, self.views.get(id)?)))
            .collect();
        let tops = self
            .mirror_tops
            .iter()
            .filter_map(|&(ino, _)| {
                let n = self.nodes.get((ino - 1) as usize)?;
                let node = Node {
                    parent: n.parent,
                    name: n.name.clone(),
                    kind: new_dir(),
                };
                Some((ino, node))
            })
            .collect();
        let mut b = Builder {
            base: self.nodes.len() as Ino,
            m: Mirrors {
                // What a tensor of one or two dimensions makes: the npy
                // file, the zarr array's directory, zarr.json and chunk path.
                nodes: Vec::with_capacity(6 * c.len() + 16),
                tops,
                views: vec![0; c.len()],
            },
            common: HashSet::new(),
        };
        for &(top, id, view) in &mirrored {
            for (name, what) in view.dir_files(true) {
                if let Some(content) = content(id, what, None) {
                    let name = b.common(name);
                    b.add(top, name, NodeKind::File(content));
                }
            }
        }
        let top = c.tensors.iter().filter(|t| !t.name.contains('/')).count();
        for &(dir, ..) in &mirrored {
            b.reserve(dir, top);
        }
        for (ti, t) in c.tensors.iter().enumerate() {
            let Some(part) = t.plain_file() else { continue };
            let file = self.placements.get(ti).map_or(0, |p| p.file);
            if file == 0 {
                continue;
            }
            let path = self.path(file);
            let comps: Vec<&str> = path.split('/').collect();
            let Some((leaf, dirs)) = comps.split_last() else {
                continue;
            };
            for &(top, id, view) in &mirrored {
                let placed = view.tensor_files(ti, part, leaf);
                if placed.is_empty() {
                    continue;
                }
                let at = Mirrored { top, id, view };
                if let Err(why) = b.place(at, dirs, ti, placed) {
                    let dir = VIEWS.get(id as usize).map_or("", |r| r.dir);
                    log::warn!("tensor {:?}: no {dir} view: {why}", t.name);
                } else {
                    b.m.views[ti] |= 1 << id;
                }
            }
        }
        b.m
    }
}

/// A mirroring view, and its top directory.
#[derive(Clone, Copy)]
struct Mirrored<'a> {
    top: Ino,
    id: u8,
    view: &'a dyn View,
}

/// Lays the mirrors out: their nodes are numbered from `base + 1`, and
/// their top directories are the tree's.
struct Builder {
    base: Ino,
    m: Mirrors,
    /// Names the views repeat, shared (see `Builder::common`).
    common: HashSet<Arc<str>>,
}

impl Builder {
    fn slot(&mut self, ino: Ino) -> Option<&mut Node> {
        match ino.checked_sub(self.base + 1) {
            Some(i) => self.m.nodes.get_mut(i as usize),
            None => self
                .m
                .tops
                .iter_mut()
                .find(|(i, _)| *i == ino)
                .map(|(_, n)| n),
        }
    }

    fn add(&mut self, parent: Ino, name: impl Into<Arc<str>>, kind: NodeKind) -> Ino {
        let name: Arc<str> = name.into();
        let ino = self.base + self.m.nodes.len() as Ino + 1;
        if let Some(dir) = self.slot(parent) {
            enter(&mut dir.kind, &name, ino, &kind);
        }
        self.m.nodes.push(Node { parent, name, kind });
        ino
    }

    fn reserve(&mut self, dir: Ino, n: usize) {
        if let Some(node) = self.slot(dir) {
            reserve(&mut node.kind, n);
        }
    }

    fn child(&mut self, dir: Ino, name: &str) -> Option<Ino> {
        find(&self.slot(dir)?.kind, name)
    }

    /// Places the files `placed` that view `at` shows of tensor `ti`, in
    /// its directory that mirrors `dirs`; or says why it shows none.
    fn place(
        &mut self,
        at: Mirrored<'_>,
        dirs: &[&str],
        ti: usize,
        placed: Vec<Placed>,
    ) -> Result<(), String> {
        let dir = self.mirror_dirs(at, dirs)?;
        for p in &placed {
            if let Some(first) = p.path.first()
                && self.child(dir, first).is_some()
            {
                return Err(format!("{first:?} is taken in its directory there"));
            }
        }
        for Placed { path, what } in placed {
            // The tensor's own name first, then names the view repeats for
            // every tensor (shared).
            let names: Vec<Arc<str>> = path
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    if i == 0 {
                        Arc::from(&**n)
                    } else {
                        self.common(n)
                    }
                })
                .collect();
            let Some((leaf, walk)) = names.split_last() else {
                continue;
            };
            let mut d = dir;
            for name in walk {
                d = match self.child(d, name) {
                    Some(ino) if self.is_dir(ino) => ino,
                    Some(_) => return Err(format!("{name:?} is a file there")),
                    None => self.add(d, name.clone(), new_dir()),
                };
            }
            if let Some(c) = content(at.id, what, Some(ti)) {
                self.add(d, leaf.clone(), NodeKind::File(c));
            }
        }
        Ok(())
    }

    /// One shared copy of a name the views repeat in every tensor's files
    /// (`zarr.json`, the chunk path's `c` and `0`).
    fn common(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.common.get(name) {
            return n.clone();
        }
        let n: Arc<str> = name.into();
        self.common.insert(n.clone());
        n
    }

    fn is_dir(&mut self, ino: Ino) -> bool {
        self.slot(ino)
            .is_some_and(|n| matches!(n.kind, NodeKind::Dir { .. }))
    }

    /// The directory `dirs` under view `at`'s top, made where missing,
    /// each made one with the view's files of a directory.
    fn mirror_dirs(&mut self, at: Mirrored<'_>, dirs: &[&str]) -> Result<Ino, String> {
        let mut ino = at.top;
        for d in dirs {
            ino = match self.child(ino, d) {
                Some(i) if self.is_dir(i) => i,
                Some(_) => return Err(format!("{d:?} is a file there")),
                None => {
                    let made = self.add(ino, d.to_string(), new_dir());
                    for (name, what) in at.view.dir_files(false) {
                        if let Some(c) = content(at.id, what, None) {
                            let name = self.common(name);
                            self.add(made, name, NodeKind::File(c));
                        }
                    }
                    made
                }
            };
        }
        Ok(ino)
    }
}
