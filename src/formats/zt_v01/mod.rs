//! zTensor v0.1 (`ZTEN0001`): reading (file bytes -> index -> v0.1 catalog
//! -> the common catalog) and writing.

pub mod catalog;
pub mod file;
pub mod index;
mod project;
pub mod writer;

pub use catalog::{Catalog, Encoding, SparseForm, SparseFormat, Tensor};
pub use file::ZtFile;
pub use project::project;

use crate::formats::{Limits, Opened};
use crate::source::MappedFile;

/// The first bytes of every v0.1 file.
pub const MAGIC: &[u8; 8] = index::MAGIC;

/// Reads an opened v0.1 file into the common catalog.
pub fn open(src: MappedFile, limits: Limits) -> crate::error::Result<Opened> {
    let (src, v01) = ZtFile::from_source(src, limits.index_memory)?.into_parts();
    let catalog = project(&src, v01);
    Ok(Opened {
        catalog,
        sources: vec![Some(src)],
    })
}

// The shared types the v0.1 library's API takes and gives, in one place
// for its users.
pub use crate::catalog::{Algorithm, Checksum, DType, Endian, Part, PartMap, Verdict};
pub use crate::codec::zstd as zstd_blob;
pub use crate::error::{Error, ErrorKind, Result};
