//! Joins shards into one catalog: the one joiner of every format whose
//! model is an index (or first file) naming files beside it, each read on
//! its own by its format's module: a Hugging Face safetensors index, GGUF
//! split files, a deathtensors sharded index ([`Set`]). A zTensor v2 root
//! holds every tensor itself and its shards only bytes, so there is no
//! catalog to join: its shards are opened and judged here all the same
//! ([`open_bytes`], [`unusable_source`], [`unusable`]).
//!
//! The rules, the same for each:
//! - A shard that cannot be opened, or is not what the index says (gone,
//!   another format, a size or header that disagrees with the index):
//!   an unusable source, with the reason; each tensor the index puts in
//!   it is listed and fails with that reason. A GGUF split file is named
//!   by no index, so when one cannot be read it is listed itself, as
//!   `NAME (unusable shard)`.
//! - A tensor the index puts in a shard that does not hold it: served
//!   from a shard that does, in its place, where the format lists
//!   duplicates (a Hugging Face index, which loaders read shard by shard);
//!   else listed, failing, saying so. What a shard holds that the index
//!   does not put in it is listed after every tensor the index places,
//!   where the format lists duplicates: served under its name where no
//!   other tensor has it, else as a duplicate (below). Where the format refuses duplicates (a
//!   deathtensors index, which lists every tensor of the set) it is not
//!   shown; the log says how many.
//! - A shard altered after mount: its guard fails its reads with `ESTALE`
//!   (as for any source), and a digest the format records is checked
//!   before its first byte is served.
//! - A name two shards hold: the format says whether that refuses the
//!   set ([`Duplicates::Refuse`]) or lists the second as a failing
//!   `NAME (duplicate in SHARD)` ([`Duplicates::List`]).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::Opened;
use crate::catalog::{Catalog, JsonMap, SourceRef, Tensor};
use crate::error::{Error, ErrorKind, Result};
use crate::source::MappedFile;

/// What [`name_ok`] asks of a shard's name, as an error says it.
pub const PLAIN_NAME: &str =
    "a plain file name beside the index (no `/`, `\\` or control character)";

/// A shard file name an index gives, for every format's index alike: a
/// plain name in the index's directory (no control character: a URL
/// parser drops tabs and newlines, so `a\n.safetensors` would fetch
/// another file).
pub fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\\')
        && !name.chars().any(char::is_control)
}

/// Refuses a set whose index names `shards` files, beside the file
/// opened, past [`crate::catalog::MAX_SOURCES`]: before any is opened (a
/// hostile index of thousands of shards held a descriptor and memory for
/// each, and took minutes over HTTP).
pub fn check_count(label: &str, shards: usize) -> Result<()> {
    let most = crate::catalog::MAX_SOURCES - 1;
    if shards > most {
        return Err(Error::new(
            ErrorKind::Index,
            label,
            None,
            format!("it names {shards} shard files: more than {most}, the most one mount serves"),
        ));
    }
    Ok(())
}

/// Shards opened at once. Over HTTP each shard's open is a HEAD (from
/// the Hub, a resolve) and a GET of its header, one after the other: a
/// set of 160 shards 50 ms away took eight seconds and more to mount one
/// shard at a time. Eight at once, as `huggingface_hub` downloads a
/// snapshot; each header's parse is held to `--index-memory`.
const OPENERS: usize = 8;

/// `open` of each of `items`, up to [`OPENERS`] at once, in their order.
/// A thread that cannot be started leaves its share to the others.
pub fn open_each<T: Sync, R: Send>(items: &[T], open: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    let work = &|| loop {
        let i = next.fetch_add(1, Relaxed);
        let Some(item) = items.get(i) else { break };
        let r = open(item);
        out.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
    };
    std::thread::scope(|scope| {
        for _ in 1..OPENERS.min(items.len()) {
            let _ = std::thread::Builder::new()
                .name("zt-open".into())
                .spawn_scoped(scope, work);
        }
        work();
    });
    out.into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

/// What a name held by two shards does to the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duplicates {
    /// The set is refused, naming the tensor.
    Refuse,
    /// The second is listed as `NAME (duplicate in SHARD)`, failing.
    List,
}

/// A shard read on its own (its catalog, with the file it was read from as
/// its one source), or why it cannot serve.
pub type ShardResult = std::result::Result<(Catalog, MappedFile), String>;

/// A set of shards being joined into one catalog.
pub struct Set {
    catalog: Catalog,
    files: Vec<Option<MappedFile>>,
    names: HashSet<String>,
    duplicates: Duplicates,
    /// The first name held twice, when [`Duplicates::Refuse`].
    duplicate: Option<String>,
    /// Tensors shards hold that the index does not put there: added last,
    /// so that the index's placement of a name wins.
    unplaced: Vec<Tensor>,
    /// Tensors the index puts in a shard that does not hold them: where
    /// each is listed, and that shard.
    misplaced: HashMap<String, (usize, String)>,
    /// Attributes every shard has alike (a safetensors shard's `format`),
    /// `None` before the first shard.
    common: Option<JsonMap>,
}

impl Set {
    pub fn new(format: &str, label: &str, duplicates: Duplicates) -> Set {
        Set {
            catalog: Catalog {
                format: format.to_string(),
                label: label.to_string(),
                ..Catalog::default()
            },
            files: Vec::new(),
            names: HashSet::new(),
            duplicates,
            duplicate: None,
            unplaced: Vec::new(),
            misplaced: HashMap::new(),
            common: None,
        }
    }

    /// The set's own attributes (the index's metadata).
    pub fn attributes(&mut self) -> &mut JsonMap {
        &mut self.catalog.attributes
    }

    /// The first file added, which the others are beside.
    pub fn first_file(&self) -> Option<&MappedFile> {
        self.files.first()?.as_ref()
    }

    /// Adds the index's own file and the tensors it holds itself, with no
    /// shard named in their sidecars.
    pub fn add_index(&mut self, c: Catalog, src: MappedFile) {
        self.take(c, src, None, None);
    }

    /// Adds the shard at `path` (its file name is what sidecars and
    /// messages call it). `wanted`: the tensors the index puts in it, when
    /// there is an index; only those are taken from it.
    pub fn add(&mut self, path: &Path, shard: ShardResult, wanted: Option<&[String]>) {
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match shard {
            Ok((c, src)) => self.take(c, src, Some(&file), wanted),
            Err(why) => self.unusable(path, &file, why, wanted),
        }
    }

    /// A shard's catalog joined: its source appended (with what the format
    /// knows of it, a digest say), its blobs renumbered, its tensors (those
    /// wanted) appended.
    fn take(&mut self, c: Catalog, src: MappedFile, file: Option<&str>, wanted: Option<&[String]>) {
        if file.is_some() {
            self.keep_common(&c.attributes);
        }
        let si = self.catalog.sources.len();
        let base = self.catalog.blobs.len();
        let mut sref = c.sources.into_iter().next().unwrap_or_default();
        sref.path = src.path().to_path_buf();
        sref.size = Some(src.len());
        self.catalog.sources.push(sref);
        self.files.push(Some(src));
        self.catalog.blobs.extend(c.blobs.into_iter().map(|mut b| {
            b.source = si;
            b
        }));
        let wanted_set: Option<HashSet<&str>> =
            wanted.map(|w| w.iter().map(String::as_str).collect());
        let mut have = HashSet::new();
        for mut t in c.tensors {
            if let Ok(ps) = &mut t.parts {
                for p in ps {
                    p.blob += base;
                }
            }
            if let Some(f) = file {
                t.meta.insert("shard", f.into());
            }
            if wanted_set
                .as_ref()
                .is_some_and(|w| !w.contains(t.name.as_str()))
            {
                t.meta.insert("in_index", false.into());
                self.unplaced.push(t);
                continue;
            }
            have.insert(t.name.clone());
            self.push(t);
        }
        let file = file.unwrap_or_default();
        for name in wanted.into_iter().flatten() {
            if !have.contains(name) {
                let why = format!("the index puts it in {file}, which does not hold it");
                let at = self.catalog.tensors.len();
                self.push(missing(name, file, why));
                if self.duplicates == Duplicates::List
                    && self
                        .catalog
                        .tensors
                        .get(at)
                        .is_some_and(|t| &t.name == name)
                {
                    self.misplaced.insert(name.clone(), (at, file.to_string()));
                }
            }
        }
    }

    fn unusable(&mut self, path: &Path, file: &str, why: String, wanted: Option<&[String]>) {
        self.catalog
            .sources
            .push(unusable_source(path, why.clone()));
        self.files.push(None);
        for name in wanted.into_iter().flatten() {
            self.push(missing(name, file, unusable(&why)));
        }
        // A set without an index (GGUF split files): the shard's tensors
        // cannot be named, so the shard itself is listed, lest its tensors
        // vanish without a word.
        if wanted.is_none() {
            let why = format!("shard unusable, its tensors cannot be listed: {why}");
            self.push(missing(&format!("{file} (unusable shard)"), file, why));
        }
    }

    fn push(&mut self, mut t: Tensor) {
        if !self.names.insert(t.name.clone()) {
            if self.duplicates == Duplicates::Refuse {
                self.duplicate.get_or_insert(t.name);
                return;
            }
            t.parts = Err("another shard holds a tensor of the same name".into());
            let shard = t.meta.get("shard");
            let shard = shard.as_ref().and_then(|s| s.as_str()).unwrap_or_default();
            t.name = format!("{} (duplicate in {shard})", t.name);
            if !self.names.insert(t.name.clone()) {
                return;
            }
        }
        self.catalog.tensors.push(t);
    }

    /// Narrows the attributes every shard has alike to those `shard` has.
    fn keep_common(&mut self, shard: &JsonMap) {
        match &mut self.common {
            None => self.common = Some(shard.clone()),
            Some(c) => c.retain(|k, v| shard.get(k) == Some(v)),
        }
    }

    /// A tensor a shard holds where the index puts it in another shard,
    /// which does not hold it: served from where its bytes are, in its
    /// place in the index, as loaders that read each shard whole find it.
    /// Gives `t` back when the index puts it nowhere else.
    fn place_misplaced(&mut self, mut t: Tensor) -> Option<Tensor> {
        let Some((at, said)) = self.misplaced.remove(&t.name) else {
            return Some(t);
        };
        let held = t.meta.get("shard");
        let held = held.as_ref().and_then(|s| s.as_str()).unwrap_or_default();
        log::warn!(
            "{}: tensor {:?}: the index puts it in {said}, which does not hold it; served \
             from {held}, which does",
            self.catalog.label,
            t.name
        );
        let mut meta = t.meta.to_map();
        meta.remove("in_index");
        meta.insert("index_shard".into(), said.into());
        t.meta = meta.into();
        match self.catalog.tensors.get_mut(at) {
            Some(slot) => {
                *slot = t;
                None
            }
            None => Some(t),
        }
    }

    /// The joined set; refused if a name was held twice and the format
    /// refuses that.
    pub fn finish(mut self) -> Result<Opened> {
        for (k, v) in self.common.take().unwrap_or_default() {
            self.catalog.attributes.entry(k).or_insert(v);
        }
        let mut unplaced = std::mem::take(&mut self.unplaced);
        if self.duplicates == Duplicates::List {
            unplaced = unplaced
                .into_iter()
                .filter_map(|t| self.place_misplaced(t))
                .collect();
        }
        if !unplaced.is_empty() {
            let listed = self.duplicates == Duplicates::List;
            log::info!(
                "{}: {} tensors its shards hold are not in its index; {}",
                self.catalog.label,
                unplaced.len(),
                if listed {
                    "listed after the rest"
                } else {
                    "not shown (the index is the set's list of tensors)"
                }
            );
            for t in unplaced.into_iter().filter(|_| listed) {
                self.push(t);
            }
        }
        if let Some(name) = self.duplicate {
            return Err(Error::new(
                ErrorKind::Duplicate,
                &self.catalog.label,
                Some(&name),
                "the tensor is in two shards (or in the index and a shard)",
            ));
        }
        Ok(Opened {
            catalog: self.catalog,
            sources: self.files,
        })
    }
}

/// Why a tensor in an unusable shard fails, in the words of every format.
pub fn unusable(why: &str) -> String {
    format!("shard unusable: {why}")
}

/// The source of a shard that cannot serve, with the reason (logged once,
/// here, for all of its tensors).
pub fn unusable_source(path: &Path, why: String) -> SourceRef {
    log::warn!("{why}");
    SourceRef {
        path: path.to_path_buf(),
        unusable: Some(why),
        ..Default::default()
    }
}

/// A shard that holds only bytes, at `path` beside `root` (opened however
/// the root was: a file, a remote object), called `name` in messages:
/// opened, its first and last bytes made present, its size checked against
/// the `size` its root records, and its bytes against `problem` (what the
/// container's own header says is wrong with it, if anything); or why it
/// cannot serve.
pub fn open_bytes(
    root: &MappedFile,
    name: &str,
    path: &Path,
    size: u64,
    problem: impl FnOnce(&[u8]) -> Option<&'static str>,
) -> std::result::Result<MappedFile, String> {
    let shard = |why: String| format!("shard {name:?}: {why}");
    let file_name = path.file_name().unwrap_or_default().to_string_lossy();
    let m = root.sibling(&file_name).map_err(|e| shard(e.to_string()))?;
    let n = m.len();
    m.ensure_all(&[(0, 8.min(n)), (n.saturating_sub(16), 16.min(n))], true)
        .map_err(|why| shard(Error::new(ErrorKind::Io, m.label(), None, why).to_string()))?;
    if n != size {
        return Err(shard(format!(
            "{} is {n} bytes, the root says {size}",
            path.display()
        )));
    }
    match problem(m.bytes()) {
        Some(p) => Err(shard(format!("{}: {p}", path.display()))),
        None => Ok(m),
    }
}

/// A tensor an index names whose bytes cannot be had.
fn missing(name: &str, shard: &str, why: String) -> Tensor {
    let mut meta = JsonMap::new();
    meta.insert("shard".into(), shard.into());
    Tensor {
        name: name.to_string(),
        dtype: "unknown".into(),
        shape: Vec::new(),
        layout: "unknown".into(),
        encoding: "unknown".into(),
        directory: false,
        parts: Err(why),
        meta: meta.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard file `name` in `dir` whose catalog holds `tensors` (no
    /// bytes) and `attrs`.
    fn shard(dir: &Path, name: &str, tensors: &[&str], attrs: &[(&str, &str)]) -> ShardResult {
        let path = dir.join(name);
        std::fs::write(&path, [0u8; 8]).unwrap();
        let c = Catalog {
            tensors: tensors
                .iter()
                .map(|t| Tensor {
                    parts: Ok(Vec::new()),
                    ..missing(t, "", String::new())
                })
                .collect(),
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), (*v).into()))
                .collect(),
            ..Catalog::default()
        };
        Ok((c, MappedFile::open(&path).unwrap()))
    }

    /// The index puts `a` in s2, which does not hold it; s1 and s3 do.
    fn joined(duplicates: Duplicates) -> Catalog {
        let dir = tempfile::tempdir().unwrap();
        let mut set = Set::new("test", "ix", duplicates);
        let s1 = shard(
            dir.path(),
            "s1",
            &["a", "b"],
            &[("format", "pt"), ("x", "1")],
        );
        set.add(&dir.path().join("s1"), s1, Some(&["b".to_string()]));
        let s2 = shard(dir.path(), "s2", &["c"], &[("format", "pt"), ("x", "2")]);
        set.add(&dir.path().join("s2"), s2, Some(&["a".into(), "c".into()]));
        let s3 = shard(dir.path(), "s3", &["a"], &[("format", "pt")]);
        set.add(&dir.path().join("s3"), s3, Some(&[]));
        set.finish()
            .map(|o| o.catalog)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_tensor_in_another_shard_than_the_index_says_is_served_from_the_first_that_holds_it() {
        let c = joined(Duplicates::List);
        let names: Vec<&str> = c.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b", "c", "a", "a (duplicate in s3)"]);
        let a = c.get("a").unwrap();
        assert!(a.parts.is_ok());
        let meta = a.meta.to_map();
        assert_eq!(
            (&meta["shard"], &meta["index_shard"]),
            (&"s1".into(), &"s2".into())
        );
        assert!(c.get("a (duplicate in s3)").unwrap().parts.is_err());
        // Only what every shard says alike is the set's.
        assert_eq!(c.attributes.get("format"), Some(&"pt".into()));
        assert_eq!(c.attributes.get("x"), None);
    }

    #[test]
    fn where_the_index_lists_every_tensor_a_misplaced_one_stays_failing() {
        let c = joined(Duplicates::Refuse);
        let names: Vec<&str> = c.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b", "c", "a"]);
        let why = c.get("a").unwrap().parts.clone().unwrap_err();
        assert_eq!(why, "the index puts it in s2, which does not hold it");
    }

    #[test]
    fn each_item_is_opened_once_and_given_back_in_its_order() {
        let opened = std::sync::atomic::AtomicUsize::new(0);
        for n in [0, 1, 7, 100] {
            let items: Vec<usize> = (0..n).collect();
            let out = open_each(&items, |&i| {
                opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // Later items finish first: the order is still the items'.
                std::thread::sleep(std::time::Duration::from_micros((n - i) as u64 * 20));
                i * 2
            });
            assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());
        }
        assert_eq!(opened.into_inner(), 108);
    }
}
