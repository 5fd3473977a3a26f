//! A catalog for the mount's own tests, made without any format: tensors
//! of bytes laid end to end in a plain file.

use std::path::Path;

use crate::catalog::{Blob, Catalog, DType, Endian, Part, SourceRef, Tensor};
use crate::source::MappedFile;

/// Writes `tensors` (name, bytes) to `dir/data` and catalogs them as
/// dense `uint8` tensors.
pub fn catalog_of(dir: &Path, tensors: &[(&str, &[u8])]) -> (Catalog, Vec<Option<MappedFile>>) {
    let path = dir.join("data");
    let bytes: Vec<u8> = tensors
        .iter()
        .flat_map(|(_, b)| b.iter().copied())
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    let mut c = Catalog {
        format: "test".into(),
        label: path.display().to_string(),
        sources: vec![SourceRef {
            path: path.clone(),
            ..SourceRef::default()
        }],
        ..Catalog::default()
    };
    let mut offset = 0;
    for (i, (name, b)) in tensors.iter().enumerate() {
        let len = b.len() as u64;
        c.blobs.push(Blob::raw(
            0,
            offset,
            len,
            Vec::new(),
            format!("tensor {name:?}"),
        ));
        c.tensors.push(Tensor {
            name: name.to_string(),
            dtype: "uint8".into(),
            shape: vec![len],
            layout: "dense".into(),
            encoding: "raw".into(),
            directory: false,
            parts: Ok(vec![Part::dense(
                DType::Uint8,
                vec![len],
                len,
                i,
                Endian::Little,
            )]),
            meta: crate::catalog::Meta::default(),
        });
        offset += len;
    }
    (c, vec![Some(MappedFile::open(&path).unwrap())])
}
