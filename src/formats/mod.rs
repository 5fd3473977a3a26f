//! Format modules: each turns a file (and the files beside it that it
//! names) into the common catalog. Which module reads a file is decided
//! once, by its first bytes, never by its name: the table in [`detect`].

pub mod cbor;
pub mod cbor_json;
pub mod common;
pub mod deathtensors;
pub mod detect;
mod fetch;
pub mod gguf;
mod gguf_header;
pub mod hdf5;
pub mod npz;
pub mod onnx;
pub mod pt;
pub mod safetensors;
pub mod shard_set;
pub mod sharded;
pub mod zt_v01;
pub mod zt_v1;
pub mod zt_v2;

use std::path::Path;

use crate::catalog::Catalog;
use crate::error::{Error, ErrorKind, Result};
use crate::source::MappedFile;

pub use detect::{Detected, FORMATS, Format, detect, reads};

/// A file read into the common catalog, with the files its bytes are in.
pub struct Opened {
    pub catalog: Catalog,
    /// One per `catalog.sources`, in order; `None` for a source that could
    /// not be opened (its `SourceRef::unusable` says why).
    pub sources: Vec<Option<MappedFile>>,
}

/// Limits a format module applies while reading a catalog.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes the decoded index (manifest, header) may take in memory.
    pub index_memory: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            index_memory: zt_v01::index::DEFAULT_INDEX_MEMORY,
        }
    }
}

/// Makes present what `src`'s format reads at open, if its bytes are
/// fetched on demand (a remote object; see [`fetch`]); nothing for a
/// local file. Every file a format opens (a shard too) goes through here.
pub(crate) fn prepare(src: &MappedFile, limits: Limits) -> Result<()> {
    if !src.is_remote() {
        return Ok(());
    }
    fetch::ends(src)?;
    match detect(src.bytes()) {
        Detected::Format(f) => (f.fetch_index)(src, limits),
        _ => fetch::unknown(src, limits),
    }
}

/// Opens `path` and reads its catalog with the module its first bytes name.
///
/// A directory holding one Hugging Face `*.safetensors.index.json`, or that
/// index itself, opens the sharded set as one catalog; so does the first
/// file of a GGUF split (`split.count` in its header).
pub fn open(path: &Path, limits: Limits) -> Result<Opened> {
    if path.is_dir() {
        return bounded(sharded::open_dir(path, limits)?, limits);
    }
    open_source(MappedFile::open(path)?, limits)
}

/// Refuses an opened catalog that would take more memory laid out (catalog,
/// tree, views) than `limits` allow: every format is held to the one
/// measure ([`crate::catalog::cost`]), however its module bounded itself.
fn bounded(opened: Opened, limits: Limits) -> Result<Opened> {
    crate::catalog::cost::check(&opened.catalog, limits.index_memory)
        .map_err(|why| Error::new(ErrorKind::Index, &opened.catalog.label, None, why))?;
    Ok(opened)
}

/// Opens `arg`, a path or a URL (`s3://`, `gs://`, `az://`, `http(s)://`),
/// and reads its catalog.
pub fn open_arg(
    arg: &str,
    limits: Limits,
    remote: &crate::source::RemoteOptions,
) -> Result<Opened> {
    if !crate::source::is_remote(arg) {
        return open(Path::new(arg), limits);
    }
    let (src, about) = crate::source::open_described(arg, remote)?;
    let mut opened = open_source(src, limits)?;
    // Where a Hub file came from (repo, commit, the repo's other files),
    // held with the catalog, so within the same bound.
    if let Some(about) = about {
        opened.catalog.attributes.insert("source".into(), about);
        return bounded(opened, limits);
    }
    Ok(opened)
}

/// Reads the catalog of `src` with the module its first bytes name, held
/// to `limits`.
pub fn open_source(src: MappedFile, limits: Limits) -> Result<Opened> {
    bounded(read_source(src, limits)?, limits)
}

fn read_source(src: MappedFile, limits: Limits) -> Result<Opened> {
    prepare(&src, limits)?;
    match detect(src.bytes()) {
        Detected::Format(f) => (f.open)(src, limits),
        Detected::Known(name) => Err(Error::new(
            ErrorKind::NotSupported,
            src.label(),
            None,
            format!(
                "{name} is not supported yet (this version reads {})",
                reads()
            ),
        )),
        Detected::Unknown => Err(Error::new(
            ErrorKind::NotZtensor,
            src.label(),
            None,
            format!(
                "not a file of a format this version reads ({}): no format's magic or \
                 header found; {}",
                reads(),
                detect::describe_unknown(src.bytes())
            ),
        )),
    }
}
