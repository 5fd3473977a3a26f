//! The views' hidden directories (see `crate::views`): `.npy` and `.zarr`
//! mirror the tree's paths, `.safetensors` holds one file.
//!
//! The mirrors are laid out on first use, not at mount: they are most of
//! a mount's nodes (a zarr array is a directory, its `zarr.json` and its
//! chunk path), and a mount of 10^5 tensors is live sooner without them.
//! They are laid out whole, from the finished tree, so their nodes and
//! inode numbers are those a layout at mount would give.

use std::collections::HashSet;
use std::sync::Arc;

use super::{
    Content, Ino, Node, NodeKind, ROOT, Tree, VIEW_NPY, VIEW_ZARR, enter, find, new_dir, reserve,
};
use crate::views::{self, Views, npy, zarr};

/// The mirrors' nodes, once laid out.
pub(super) struct Mirrors {
    /// Inode `Tree::nodes.len() + 1 + i` is `nodes[i]`.
    pub(super) nodes: Vec<Node>,
    /// The top directories (`Tree::mirror_tops`, in order) with their
    /// entries.
    tops: Vec<(Ino, Node)>,
    /// `VIEW_NPY` and `VIEW_ZARR` bits of each tensor.
    pub(super) views: Vec<u8>,
}

impl Mirrors {
    pub(super) fn top(&self, ino: Ino) -> Option<&Node> {
        self.tops.iter().find(|(i, _)| *i == ino).map(|(_, n)| n)
    }
}

impl Tree {
    /// Makes the views' top directories before any tensor is placed, so
    /// that tensors of those names are placed elsewhere.
    pub(super) fn reserve_views(&mut self, v: Views) {
        let tops = [
            (v.npy, views::NPY_DIR),
            (v.zarr, views::ZARR_DIR),
            (v.safetensors, views::SAFETENSORS_DIR),
        ];
        for (on, name) in tops {
            if on {
                let ino = self.add(ROOT, name.to_string(), new_dir());
                self.sealed.insert(ino);
                self.reserved.insert(ino);
                if name != views::SAFETENSORS_DIR {
                    self.mirror_tops.push(ino);
                }
            }
        }
    }

    /// Adds the view files made at mount, once all tensors are placed:
    /// the safetensors view's one file.
    pub(super) fn add_view_files(&mut self, v: Views) {
        if v.safetensors
            && let Some(dir) = self.child(ROOT, views::SAFETENSORS_DIR)
        {
            self.add(
                dir,
                views::SAFETENSORS_FILE,
                NodeKind::File(Content::Safetensors),
            );
        }
    }

    /// Lays out the `.npy` and `.zarr` mirrors now, if they are not yet
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

    /// Every view file of the mirrors, in tensor order.
    fn build_mirrors(&self) -> Mirrors {
        let c = &*self.catalog;
        let top_of = |name: &str| {
            self.child(ROOT, name)
                .filter(|ino| self.mirror_tops.contains(ino))
        };
        let npy_top = top_of(views::NPY_DIR);
        let zarr_top = top_of(views::ZARR_DIR);
        let tops = self
            .mirror_tops
            .iter()
            .filter_map(|&ino| {
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
        if let Some(top) = zarr_top {
            b.add(
                top,
                "zarr.json",
                NodeKind::File(Content::ZarrGroup { top: true }),
            );
        }
        let top = c.tensors.iter().filter(|t| !t.name.contains('/')).count();
        for dir in [npy_top, zarr_top].into_iter().flatten() {
            b.reserve(dir, top);
        }
        for (ti, t) in c.tensors.iter().enumerate() {
            let Ok(parts) = &t.parts else { continue };
            let file = self.placements.get(ti).map_or(0, |p| p.file);
            if t.directory || parts.len() != 1 || file == 0 {
                continue;
            }
            let path = self.path(file);
            let dtype = parts[0].dtype;
            let comps: Vec<&str> = path.split('/').collect();
            let Some((leaf, dirs)) = comps.split_last() else {
                continue;
            };
            if let Some(top) = npy_top
                && npy::descr(dtype).is_some()
            {
                let dir = b.mirror_dirs(top, dirs, false);
                b.add(
                    dir,
                    format!("{leaf}.npy"),
                    NodeKind::File(Content::Npy { tensor: ti }),
                );
                b.m.views[ti] |= VIEW_NPY;
            }
            if let Some(top) = zarr_top
                && zarr::data_type(dtype).is_some()
            {
                b.add_zarr_array(top, dirs, leaf, ti, &parts[0].shape, &t.name);
            }
        }
        b.m
    }
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

    fn add_zarr_array(
        &mut self,
        top: Ino,
        dirs: &[&str],
        leaf: &str,
        ti: usize,
        shape: &[u64],
        name: &str,
    ) {
        let group = self.mirror_dirs(top, dirs, true);
        if self.child(group, leaf).is_some() {
            log::warn!("tensor {name:?}: no zarr view: {leaf:?} is taken in its zarr group");
            return;
        }
        let array = self.add(group, leaf.to_string(), new_dir());
        self.m.views[ti] |= VIEW_ZARR;
        let zarr_json = self.common("zarr.json");
        self.add(
            array,
            zarr_json,
            NodeKind::File(Content::ZarrArray { tensor: ti }),
        );
        let Some(chunk) = zarr::chunk_path(shape) else {
            return;
        };
        let Some((file, dirs)) = chunk.split_last() else {
            return;
        };
        let mut at = array;
        for d in dirs {
            let d = self.common(d);
            at = self.add(at, d, new_dir());
        }
        let file = self.common(file);
        self.add(
            at,
            file,
            NodeKind::File(Content::Part {
                tensor: ti,
                part: 0,
            }),
        );
    }

    /// One shared copy of a name the views repeat in every array
    /// (`zarr.json`, the chunk path's `c` and `0`).
    fn common(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.common.get(name) {
            return n.clone();
        }
        let n: Arc<str> = name.into();
        self.common.insert(n.clone());
        n
    }

    /// The directory `dirs` under `top`, made where missing; in the zarr
    /// view each made directory is a group with its `zarr.json`.
    fn mirror_dirs(&mut self, top: Ino, dirs: &[&str], groups: bool) -> Ino {
        let mut at = top;
        for d in dirs {
            at = match self.child(at, d) {
                Some(ino) => ino,
                None => {
                    let ino = self.add(at, d.to_string(), new_dir());
                    if groups {
                        let zarr_json = self.common("zarr.json");
                        self.add(
                            ino,
                            zarr_json,
                            NodeKind::File(Content::ZarrGroup { top: false }),
                        );
                    }
                    ino
                }
            };
        }
        at
    }
}
