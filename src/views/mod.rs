//! Views: extra files computed from the catalog so that libraries open a
//! mounted tensor by its path alone. Each is a small generated header (or
//! none) followed by tensors' exposed bytes, served through the same data
//! path as the tensor's own file: no second copy, no extra decode.
//!
//! - `.npy/PATH.npy`: numpy's format (`np.load`, with or without mmap).
//! - `.zarr/`: a zarr v3 group mirroring the tree; each dense tensor is an
//!   array of one chunk (`PATH/zarr.json`, `PATH/c/0/…`), for TensorStore
//!   and zarr-python.
//! - `.safetensors/model.safetensors`: one safetensors file of every dense
//!   tensor whose type safetensors has.
//!
//! They sit in hidden top-level directories, so `ls MOUNT` shows the model
//! as it is; `--views` chooses which are made.
//!
//! A view is one module here that implements [`View`], and one entry in
//! [`VIEWS`]. The mount knows no view by name: it lays out the files a
//! view places (`mount/tree/mirror.rs`), serves a [`Made::Data`] file like
//! a tensor's own (with its backing file, passthrough included) and a
//! [`Made::Text`] file like a sidecar.

use std::borrow::Cow;

use crate::catalog::{Catalog, Part};

pub mod npy;
pub mod safetensors;
pub mod zarr;

/// Every view, in the order their files are laid out. A view's id (its
/// bit in [`Views`] and in a tensor's sidecar) is its place here.
pub const VIEWS: &[Registration] = &[npy::VIEW, zarr::VIEW, safetensors::VIEW];

// A view's bit is in a `u8` ([`Views`], a tensor's placement).
const _: () = assert!(VIEWS.len() <= 8);

/// A view's entry in [`VIEWS`].
pub struct Registration {
    /// Its name in `--views` and in each sidecar's `views`.
    pub name: &'static str,
    /// Its hidden top-level directory.
    pub dir: &'static str,
    /// Whether it mirrors the tree: its directory holds the tree's
    /// directories, and in them the files [`View::tensor_files`] places
    /// for each tensor (laid out on first use, not at mount). Otherwise it
    /// holds the files of [`View::top_files`], made at mount.
    pub mirrors: bool,
    /// Where it shows a tensor of exposed path `path`, from the mount's
    /// top (`dir`: its directory); in the tensor's sidecar.
    pub path_of: fn(dir: &str, path: &str) -> String,
    /// Makes the view of a mount's catalog, or says why it has none.
    pub make: fn(&Source<'_>) -> Result<Box<dyn View>, String>,
}

/// Reads bytes of a file at an offset, filling the buffer.
pub type ReadAt<'a> = &'a (dyn Fn(&mut [u8], u64) -> std::io::Result<()> + Sync);

/// What a view is made from.
pub struct Source<'a> {
    pub catalog: &'a Catalog,
    /// The length of the catalog's first source file, and a reader of its
    /// bytes, where the mount has that file at hand.
    pub file: Option<(u64, ReadAt<'a>)>,
}

/// Which file of a view a node is: the view's own code for its kind of
/// file, and the tensor it shows, if one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub kind: u8,
    pub tensor: Option<usize>,
}

/// A file a view places for a tensor, at `path` (names below the
/// directory that mirrors the tensor's; the first is the tensor's own
/// place there, which no other entry may hold).
pub struct Placed {
    pub path: Vec<Cow<'static, str>>,
    pub what: Made,
}

/// What a placed file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// Generated text ([`View::text`]).
    Text(FileId),
    /// A header and tensors' bytes ([`View::data`]).
    Data(FileId),
    /// The tensor's own bytes, as its file in the tree holds them.
    TensorBytes,
}

/// One tensor's place in a [`Composed`] file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Offset in the file of its first byte.
    pub start: u64,
    pub len: u64,
    /// The tensor whose part 0 these are.
    pub tensor: usize,
}

/// A file made of a header and then tensors' bytes.
#[derive(Debug, Clone)]
pub struct Composed<'a> {
    pub header: Cow<'a, [u8]>,
    /// In file order, from the end of the header to `size`: they must
    /// leave no gap (a read is put together from the header and these).
    pub entries: Cow<'a, [Entry]>,
    /// The whole file's size.
    pub size: u64,
    /// The file is the catalog's first source file byte for byte: the
    /// kernel may read it from there.
    pub is_source: bool,
}

/// One view of one mount's catalog.
pub trait View: Send + Sync {
    /// Mirroring views: the files shown for tensor `ti`, whose one dense
    /// part is `part`, placed beside where the tensor's path would be;
    /// `leaf` is the last name of that path.
    fn tensor_files(&self, _ti: usize, _part: &Part, _leaf: &str) -> Vec<Placed> {
        Vec::new()
    }

    /// Mirroring views: the files in each directory that mirrors one of
    /// the tree's (`top`: the view's own directory).
    fn dir_files(&self, _top: bool) -> Vec<(&'static str, Made)> {
        Vec::new()
    }

    /// Other views: the files in the view's directory.
    fn top_files(&self) -> Vec<(&'static str, Made)> {
        Vec::new()
    }

    /// Other views: the tensors their files show.
    fn shown(&self) -> Vec<usize> {
        Vec::new()
    }

    /// The text of file `f` (placed as [`Made::Text`]).
    fn text(&self, _c: &Catalog, _f: FileId) -> Vec<u8> {
        Vec::new()
    }

    /// What file `f` (placed as [`Made::Data`]) is made of.
    fn data(&self, _c: &Catalog, _f: FileId) -> Option<Composed<'_>> {
        None
    }
}

/// The views a mount made, by id.
#[derive(Default)]
pub struct ViewSet {
    views: Vec<Option<Box<dyn View>>>,
}

impl ViewSet {
    /// Makes the views `on` names. One that cannot be made is left out,
    /// and the log says why.
    pub fn make(on: Views, src: &Source<'_>) -> ViewSet {
        let views = VIEWS
            .iter()
            .enumerate()
            .map(|(id, r)| {
                if !on.has(id) {
                    return None;
                }
                (r.make)(src)
                    .map_err(|why| {
                        log::warn!("{}: no {} view: {why}", src.catalog.label, r.dir);
                    })
                    .ok()
            })
            .collect();
        ViewSet { views }
    }

    /// View `id`, if made.
    pub fn get(&self, id: u8) -> Option<&dyn View> {
        self.views.get(id as usize)?.as_deref()
    }

    /// The views made, with their id and entry.
    pub fn made(&self) -> impl Iterator<Item = (u8, &'static Registration, &dyn View)> {
        self.views
            .iter()
            .zip(VIEWS)
            .enumerate()
            .filter_map(|(id, (v, r))| Some((id as u8, r, v.as_deref()?)))
    }

    /// Which views were made.
    pub fn on(&self) -> Views {
        Views(self.made().fold(0, |m, (id, _, _)| m | 1 << id))
    }
}

/// Which views a mount makes: bit `i` is `VIEWS[i]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Views(u8);

impl Default for Views {
    fn default() -> Self {
        Views::ALL
    }
}

impl Views {
    pub const ALL: Views = Views(((1u16 << VIEWS.len()) - 1) as u8);
    pub const NONE: Views = Views(0);

    /// Whether view `id` is on.
    pub fn has(self, id: usize) -> bool {
        id < VIEWS.len() && self.0 & (1 << id) != 0
    }

    /// Parses a list of view names, `all` or `none` (`npy,zarr`).
    pub fn parse(list: &str) -> Result<Views, String> {
        let mut v = Views::NONE;
        // An empty list is a slip more often than a wish for none.
        if list.split(',').all(|s| s.trim().is_empty()) {
            return Err(format!(
                "no view named in {list:?} (give none for no views)"
            ));
        }
        let items: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        // `npy,none` would mean none, `none,npy` npy: neither is asked.
        if items.len() > 1 && items.iter().any(|i| matches!(*i, "all" | "none")) {
            return Err(format!("all and none stand alone, not in a list: {list:?}"));
        }
        for item in items {
            match item {
                "all" => v = Views::ALL,
                "none" => v = Views::NONE,
                other => match VIEWS.iter().position(|r| r.name == other) {
                    Some(id) => v.0 |= 1 << id,
                    None => {
                        let names: Vec<&str> = VIEWS.iter().map(|r| r.name).collect();
                        return Err(format!(
                            "unknown view {other:?} (views: {}, all, none)",
                            names.join(", ")
                        ));
                    }
                },
            }
        }
        Ok(v)
    }
}
