//! The views' hidden directories (see `crate::views`): `.npy` and `.zarr`
//! mirror the tree's paths, `.safetensors` holds one file.

use super::{Content, Ino, NodeKind, ROOT, Tree, VIEW_NPY, VIEW_ZARR, new_dir};
use crate::catalog::Catalog;
use crate::views::{self, Views, npy, zarr};

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
            }
        }
    }

    /// Adds every view file, once all tensors are placed.
    pub(super) fn add_views(&mut self, c: &Catalog, v: Views) {
        if v.safetensors
            && let Some(dir) = self.child(ROOT, views::SAFETENSORS_DIR)
        {
            self.add(
                dir,
                views::SAFETENSORS_FILE,
                NodeKind::File(Content::Safetensors),
            );
        }
        let zarr_top = self.child(ROOT, views::ZARR_DIR).filter(|_| v.zarr);
        if let Some(top) = zarr_top {
            self.add(
                top,
                "zarr.json",
                NodeKind::File(Content::ZarrGroup { top: true }),
            );
        }
        let npy_top = self.child(ROOT, views::NPY_DIR).filter(|_| v.npy);
        let top = c.tensors.iter().filter(|t| !t.name.contains('/')).count();
        for dir in [npy_top, zarr_top].into_iter().flatten() {
            self.reserve(dir, top);
        }
        for (ti, t) in c.tensors.iter().enumerate() {
            let Ok(parts) = &t.parts else { continue };
            if t.directory || parts.len() != 1 || self.placements[ti].path.is_empty() {
                continue;
            }
            let path = std::mem::take(&mut self.placements[ti].path);
            let dtype = parts[0].dtype;
            let comps: Vec<&str> = path.split('/').collect();
            let Some((leaf, dirs)) = comps.split_last() else {
                continue;
            };
            if let Some(top) = npy_top
                && npy::descr(dtype).is_some()
            {
                let dir = self.mirror_dirs(top, dirs, false);
                self.add(
                    dir,
                    format!("{leaf}.npy"),
                    NodeKind::File(Content::Npy { tensor: ti }),
                );
                self.placements[ti].views |= VIEW_NPY;
            }
            if let Some(top) = zarr_top
                && zarr::data_type(dtype).is_some()
            {
                self.add_zarr_array(top, dirs, leaf, ti, &parts[0].shape, &t.name);
            }
            self.placements[ti].path = path;
        }
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
        // Not marked sealed: only placing tensors asks, and that is done.
        let array = self.add(group, leaf.to_string(), new_dir());
        self.placements[ti].views |= VIEW_ZARR;
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
    fn common(&mut self, name: &str) -> std::sync::Arc<str> {
        if let Some(n) = self.common.get(name) {
            return n.clone();
        }
        let n: std::sync::Arc<str> = name.into();
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
