//! What several format modules share: limits and element-shape rules that
//! belong to no one format.

use std::fs::File;
use std::sync::Arc;

use crate::catalog::{Blob, Codec, DType, Part};
use crate::source::MappedFile;

/// Largest blob a producer will make whole: the cap `ztensor-compat` puts
/// on what it decodes in one piece (1 GiB), which the modules that gather
/// or inflate a tensor themselves (npz, `.pt`, ONNX) keep too. The mount
/// refuses anything over half its cache before a producer runs; this holds
/// whatever the cache size.
pub const MAX_COMPUTED: u64 = 1 << 30;

/// Whether `bytes` open a ZIP archive: its first member, or the end record
/// of an empty one (npz and `.pt` files are both).
pub fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06")
}

/// A packed 4-bit type's shape in stored units (the last dimension halved,
/// rounded up), and whether the last byte holds one element only.
pub fn packed_shape(d: DType, mut shape: Vec<u64>, nbytes: u64) -> (Vec<u64>, bool) {
    if d != DType::Float4E2M1FnX2 {
        return (shape, false);
    }
    let elems: u64 = shape.iter().product();
    let odd = elems % 2 == 1;
    let halve = shape.len() == 1 || shape.last().is_some_and(|l| l % 2 == 0);
    match shape.last_mut() {
        Some(l) if halve => *l = l.div_ceil(2),
        _ => shape = vec![nbytes],
    }
    (shape, odd)
}

/// The descriptor every producer of `src`'s computed blobs shares: opened
/// again (so that it outlives the mapping's) by the first to ask, kept in
/// `slot`.
pub fn shared_file(
    slot: &mut Option<Arc<File>>,
    src: &MappedFile,
) -> std::result::Result<Arc<File>, String> {
    if let Some(f) = slot {
        return Ok(f.clone());
    }
    let f = src
        .file()
        .try_clone()
        .map_err(|e| format!("cannot reopen the file: {e}"))?;
    Ok(slot.insert(Arc::new(f)).clone())
}

/// The encoding a tensor of `parts` shows: `computed` when some part's
/// bytes are made by the format's own reader (a `Codec::Computed` blob of
/// `blobs`), else `raw`.
pub fn raw_or_computed(blobs: &[Blob], parts: &Result<Vec<Part>, String>) -> &'static str {
    let computed = |p: &Part| {
        blobs
            .get(p.blob)
            .is_some_and(|b| matches!(b.codec, Codec::Computed(_)))
    };
    match parts {
        Ok(ps) if ps.iter().any(computed) => "computed",
        _ => "raw",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_fp4_shapes_count_bytes() {
        assert_eq!(
            packed_shape(DType::Float4E2M1FnX2, vec![3, 4], 6),
            (vec![3, 2], false)
        );
        assert_eq!(
            packed_shape(DType::Float4E2M1FnX2, vec![5], 3),
            (vec![3], true)
        );
        assert_eq!(
            packed_shape(DType::Float4E2M1FnX2, vec![3, 3], 5),
            (vec![5], true)
        );
    }
}
