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
