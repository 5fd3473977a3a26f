//! A zTensor v0.1 catalog in the common model: one blob per tensor, the
//! index fields and custom fields in the sidecar.

use ciborium::value::Value;

use super::catalog::{Catalog as V01, Encoding, SparseForm, SparseFormat, Tensor as V01Tensor};
use super::index::as_u64;
use super::writer::{FRAME_SIZE_KEY, FRAMES_KEY};
use serde::Serialize;

use crate::catalog::{Blob, Catalog, Check, Codec, FrameTable, JsonMap, Meta, Tensor};
use crate::formats::cbor_json;
use crate::source::MappedFile;

/// The common catalog of a v0.1 file whose v0.1 catalog is `v01`.
pub fn project(src: &MappedFile, v01: V01) -> Catalog {
    let mut blobs = Vec::with_capacity(v01.tensors.len());
    let mut tensors = Vec::with_capacity(v01.tensors.len());
    for t in v01.tensors {
        blobs.push(blob(&t));
        tensors.push(tensor(t));
    }
    Catalog {
        blobs,
        tensors,
        ..Catalog::of_file("zTensor v0.1.0", src.label(), src.path())
    }
}

fn blob(t: &V01Tensor) -> Blob {
    let (codec, decoded_len) = match &t.layout {
        Ok(l) if l.encoding == Encoding::Zstd => (
            Codec::Zstd {
                frames: frame_table(t),
            },
            l.decoded_size,
        ),
        Ok(l) => (Codec::Raw, l.decoded_size),
        Err(_) => (Codec::Raw, t.size),
    };
    Blob {
        source: 0,
        offset: t.offset,
        len: t.size,
        codec,
        decoded_len,
        checks: t.checksum.iter().cloned().map(Check::Stored).collect(),
        label: label(&t.name),
    }
}

/// `tensor "NAME"`, as `format!("tensor {name:?}")` writes it; without the
/// formatter when the name is printable ASCII other than `"` and `\`,
/// which Debug writes as they are (the usual name; one per tensor).
fn label(name: &str) -> String {
    if !name
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        return format!("tensor {name:?}");
    }
    let mut s = String::with_capacity(name.len() + 9);
    s.push_str("tensor \"");
    s.push_str(name);
    s.push('"');
    s
}

/// The frame table our writer records in custom fields, when present.
fn frame_table(t: &V01Tensor) -> Option<FrameTable> {
    let decoded = as_u64(t.custom(FRAME_SIZE_KEY)?).ok()?;
    let Value::Array(items) = t.custom(FRAMES_KEY)? else {
        return None;
    };
    let compressed = items
        .iter()
        .map(|v| as_u64(v).ok())
        .collect::<Option<_>>()?;
    Some(FrameTable::Uniform {
        decoded,
        compressed,
    })
}

/// A tensor's own sidecar fields, in the order they are shown.
#[derive(Serialize)]
struct Fields {
    offset: u64,
    size: u64,
    data_endianness: &'static str,
    checksum: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sparse_format: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sparse_form: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nnz: Option<u64>,
    custom: JsonMap,
}

fn tensor(t: V01Tensor) -> Tensor {
    let sparse = t.layout.as_ref().ok().and_then(|l| l.sparse.as_ref());
    // Written as text straight from the fields (see `Meta`).
    let meta = Meta::of(&Fields {
        offset: t.offset,
        size: t.size,
        data_endianness: t.endian.name(),
        checksum: t.checksum.as_ref().map(|c| c.to_string()),
        sparse_format: sparse.map(|s| match s.format {
            SparseFormat::Csr => "csr",
            SparseFormat::Coo => "coo",
        }),
        sparse_form: sparse.map(|s| match s.form {
            SparseForm::Spec => "spec",
            SparseForm::Reference => "reference",
        }),
        nnz: sparse.map(|s| s.nnz),
        custom: cbor_json::map_to_json(&t.custom),
    });
    Tensor {
        directory: sparse.is_some(),
        name: t.name,
        dtype: t.dtype_name,
        shape: t.shape,
        layout: t.layout_name,
        encoding: t.encoding_name,
        parts: t.layout.map(|l| l.parts),
        meta,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_are_those_debug_writes() {
        for name in [
            "w",
            "a/b.c d'e",
            "q\"x",
            "back\\slash",
            "nl\n",
            "é",
            "",
            "\u{7f}",
        ] {
            assert_eq!(super::label(name), format!("tensor {name:?}"), "{name:?}");
        }
    }
}
