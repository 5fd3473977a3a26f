//! The zTensor v0.1 format: reading (file bytes -> index -> catalog -> exposed
//! bytes) and writing. Knows nothing about FUSE.

pub mod catalog;
pub mod cbor_json;
pub mod checksum;
pub mod dtype;
pub mod error;
pub mod expose;
pub mod file;
pub mod index;
pub mod writer;
pub mod zstd_blob;

pub use catalog::{Catalog, Encoding, Part, PartMap, SparseForm, SparseFormat, Tensor};
pub use checksum::{Algorithm, Checksum, Verdict};
pub use dtype::{DType, Endian};
pub use error::{Error, ErrorKind, Result};
pub use file::ZtFile;
