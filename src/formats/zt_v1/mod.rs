//! zTensor v1 (`ZTEN1000`, spec 1.x): the magic at both ends, 64-aligned
//! component blobs (raw or zstd), and a CBOR manifest of objects, each with
//! a shape, a format (`dense`, `sparse_csr`, `sparse_coo`,
//! `quantized_group`, ...) and named components. Read into the common
//! catalog: one blob per component; a dense object is one file, the others
//! a directory with a file per component.

pub mod manifest;
mod project;

use std::path::Path;

pub use manifest::MAGIC;
pub use project::{FORMAT, storage_dtype};

use crate::catalog::Catalog;
use crate::error::Result;
use crate::formats::{Limits, Opened};
use crate::source::MappedFile;

/// The catalog of a v1 file whose whole contents are `bytes`; `file` names
/// it in messages, `path` is where its blobs are read from.
pub fn catalog(bytes: &[u8], file: &str, path: &Path, limits: Limits) -> Result<Catalog> {
    parse(bytes, file, path, limits).map(|(c, _)| c)
}

/// The catalog, and where the manifest starts.
fn parse(bytes: &[u8], file: &str, path: &Path, limits: Limits) -> Result<(Catalog, u64)> {
    let m = manifest::parse(bytes, file, limits.index_memory)?;
    let data_end = m.data_end;
    Ok((
        project::project(bytes.len() as u64, file, path, m)?,
        data_end,
    ))
}

/// Reads an opened v1 file into the common catalog.
pub fn open(src: MappedFile, limits: Limits) -> Result<Opened> {
    let catalog = read(&src, limits)?;
    Ok(Opened {
        catalog,
        sources: vec![Some(src)],
    })
}

/// Reads the catalog of an opened v1 file, then hands the manifest's pages
/// back to the kernel.
pub fn read(src: &MappedFile, limits: Limits) -> Result<Catalog> {
    let (cat, data_end) = parse(src.bytes(), src.label(), src.path(), limits)?;
    // `data_end` was checked to lie within the file.
    if let Some(manifest) = usize::try_from(data_end)
        .ok()
        .and_then(|at| src.bytes().get(at..))
    {
        src.release(manifest);
    }
    Ok(cat)
}
