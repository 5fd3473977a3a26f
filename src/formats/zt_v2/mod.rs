//! zTensor v2 (`spec/ztensor-v2-spec.md`, Draft 4): a footer at EOF points
//! at a deterministic-CBOR manifest of objects, each made of parts that
//! point at 4 KiB-aligned blobs, in this file or in shards beside it.
//!
//! The `ztensor` 2.x crate (as `ztensor2`) is the parser: its
//! `format::validate::image` takes the bytes of our own mapping and runs the
//! spec's whole reading algorithm (footer, manifest XXH3, deterministic
//! CBOR, names, shapes, blob alignment, bounds and overlap, the dense and
//! CSR metadata rules, registered logical types pinning their dtype). What
//! it does not give the mount is written here: the `zt.zstd-seekable/1`
//! seek table ([`seek`], the crate only parses it inside a whole-part
//! decode), shard files opened one by one so that a bad one fails only its
//! tensors (the crate fails the whole open), the data rules of the sparse
//! layouts ([`check`]) and the metadata rules of the layouts the crate does
//! not register (`zt.sparse_coo/1`, `zt.mx/1`, `gguf.*/1`,
//! `zt.quant_group/1`, [`profiles`]). No part's bytes are decoded through
//! the crate: it would allocate `decoded_length` up front.

pub mod check;
pub mod profiles;
mod project;
pub mod seek;

use crate::error::{Error, ErrorKind, Result};
use crate::formats::{Limits, Opened};
use crate::source::MappedFile;

pub use project::project;

/// The first 8 bytes of a v2 file (and its last 8).
pub const MAGIC: &[u8; 8] = b"\x89ZT2\r\n\x1a\n";

/// What users call the format.
pub const FORMAT: &str = "zTensor v2";

const FOOTER_LEN: usize = 40;

/// Reads the catalog of a v2 file already mapped as `src`.
pub fn open(src: MappedFile, limits: Limits) -> Result<Opened> {
    let bytes = src.bytes();
    // The manifest is decoded into memory: hold it to the index budget
    // before the crate reads it (the crate's own cap is 1 GiB).
    if let Some(footer) = bytes
        .len()
        .checked_sub(FOOTER_LEN)
        .and_then(|at| bytes.get(at..))
    {
        let len = u64::from_le_bytes(footer[8..16].try_into().unwrap_or_default());
        if len > limits.index_memory {
            return Err(Error::new(
                ErrorKind::Index,
                src.label(),
                None,
                format!(
                    "the manifest is {len} bytes, over the {} allowed (--index-memory)",
                    crate::size::bytes(limits.index_memory)
                ),
            ));
        }
    }
    let vocab = ztensor2::Vocabulary::standard();
    let manifest = ztensor2::format::validate::image(bytes, &vocab)
        .map_err(|e| from_crate(src.label(), None, &e))?;
    project(src, manifest)
}

/// Our error for one of the crate's, as one line.
pub(crate) fn from_crate(file: &str, tensor: Option<&str>, e: &ztensor2::Error) -> Error {
    use ztensor2::Rule;
    let kind = match e {
        ztensor2::Error::Reject { rule, .. } => match rule {
            Rule::FileTooSmall | Rule::HeaderMagic => ErrorKind::NotZtensor,
            Rule::Version => ErrorKind::NotSupported,
            Rule::ManifestBounds | Rule::BlobAlignment | Rule::BlobBounds | Rule::BlobOverlap => {
                ErrorKind::Placement
            }
            Rule::DenseSize | Rule::LayoutRule | Rule::Shape => ErrorKind::Size,
            Rule::LayoutData | Rule::Digest | Rule::Encoding => ErrorKind::Data,
            Rule::FooterMagic
            | Rule::ManifestTooLarge
            | Rule::ManifestHash
            | Rule::CborSyntax
            | Rule::CborDeterminism
            | Rule::CborDuplicateKey
            | Rule::CborDepth => ErrorKind::Index,
            _ => ErrorKind::Field,
        },
        ztensor2::Error::Io(_) => ErrorKind::Io,
        ztensor2::Error::Unsupported(_) => ErrorKind::Unsupported,
        _ => ErrorKind::Field,
    };
    Error::new(kind, file, tensor, format!("{FORMAT}: {e}"))
}
