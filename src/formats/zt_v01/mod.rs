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

/// The first bytes of every v0.1 file.
pub const MAGIC: &[u8; 8] = index::MAGIC;

// The shared types the v0.1 library's API takes and gives, in one place
// for its users.
pub use crate::catalog::{Algorithm, Checksum, DType, Endian, Part, PartMap, Verdict};
pub use crate::codec::zstd as zstd_blob;
pub use crate::error::{Error, ErrorKind, Result};
