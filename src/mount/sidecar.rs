//! The JSON a user reads next to each tensor (`NAME.json`), per sparse part,
//! and in `.ztensor/index.json`. Serialized straight from borrowed fields:
//! `ls -l` of a 100 000-tensor mount renders every sidecar once for its size.

use std::io::Write;

use serde::Serialize;
use serde::ser::SerializeMap;

use super::tree::Placement;
use crate::format::cbor_json;
use crate::format::{Part, SparseForm, SparseFormat, Tensor};

/// One tensor, as in `NAME.json`.
#[derive(Serialize)]
pub struct TensorSidecar<'a> {
    name: &'a str,
    path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_escaped_because: Option<&'a str>,
    dtype: &'a str,
    shape: &'a [u64],
    supported: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    unsupported_reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nbytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    numpy_dtype: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    numpy_note: Option<&'static str>,
    layout: &'a str,
    encoding: &'a str,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    parts: Option<Vec<PartSidecar<'a>>>,
    custom: Custom<'a>,
}

/// One sparse part, as in `NAME/PART.json`.
#[derive(Serialize)]
pub struct PartSidecar<'a> {
    tensor: &'a str,
    part: &'static str,
    path: String,
    dtype: &'static str,
    shape: &'a [u64],
    nbytes: u64,
    numpy_dtype: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    numpy_note: Option<&'static str>,
}

/// Custom fields, converted to JSON as they are written (see cbor_json).
pub struct Custom<'a>(&'a [(ciborium::value::Value, ciborium::value::Value)]);

impl Serialize for Custom<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            m.serialize_entry(&cbor_json::key_to_string(k), &cbor_json::to_json(v))?;
        }
        m.end()
    }
}

pub fn tensor_sidecar<'a>(t: &'a Tensor, at: &'a Placement) -> TensorSidecar<'a> {
    let layout = t.layout.as_ref().ok();
    let dense = layout.filter(|l| l.sparse.is_none()).map(|l| &l.parts[0]);
    let sparse = layout.and_then(|l| l.sparse.as_ref().map(|s| (l, s)));
    TensorSidecar {
        name: &t.name,
        path: (!at.path.is_empty()).then_some(at.path.as_str()),
        path_escaped_because: at.escaped.as_deref(),
        dtype: &t.dtype_name,
        shape: &t.shape,
        supported: layout.is_some(),
        unsupported_reason: t.layout.as_ref().err().map(String::as_str),
        nbytes: layout.map(|l| l.parts.iter().map(|p| p.nbytes).sum()),
        numpy_dtype: dense.map(|p| p.dtype.numpy()),
        numpy_note: dense.and_then(|p| p.dtype.numpy_note()),
        layout: &t.layout_name,
        encoding: &t.encoding_name,
        offset: t.offset,
        size: t.size,
        data_endianness: t.endian.name(),
        checksum: t.checksum.as_ref().map(|c| c.to_string()),
        sparse_format: sparse.map(|(_, s)| match s.format {
            SparseFormat::Csr => "csr",
            SparseFormat::Coo => "coo",
        }),
        sparse_form: sparse.map(|(_, s)| match s.form {
            SparseForm::Spec => "spec",
            SparseForm::Reference => "reference",
        }),
        nnz: sparse.map(|(_, s)| s.nnz),
        parts: sparse.map(|(l, _)| {
            l.parts
                .iter()
                .map(|p| part_sidecar(t, p, &at.path))
                .collect()
        }),
        custom: Custom(&t.custom),
    }
}

pub fn part_sidecar<'a>(t: &'a Tensor, p: &'a Part, dir: &str) -> PartSidecar<'a> {
    PartSidecar {
        tensor: &t.name,
        part: p.name,
        path: format!("{dir}/{}", p.name),
        dtype: p.dtype.name(),
        shape: &p.shape,
        nbytes: p.nbytes,
        numpy_dtype: p.dtype.numpy(),
        numpy_note: p.dtype.numpy_note(),
    }
}

/// Pretty JSON text with a final newline.
pub fn render(v: &impl Serialize) -> Vec<u8> {
    let mut out = Vec::new();
    render_to(&mut out, v);
    out
}

/// [`render`] into `w` (a [`Counter`] to learn the length without the text).
pub fn render_to(w: &mut impl Write, v: &impl Serialize) {
    let _ = serde_json::to_writer_pretty(&mut *w, v);
    let _ = w.write_all(b"\n");
}

/// `.ztensor/index.json` into `w`: one tensor per line, written as it goes
/// so that only the text (not a JSON tree of every tensor) is ever made.
pub fn index_to<'a>(
    w: &mut impl Write,
    file: &str,
    tensors: impl ExactSizeIterator<Item = (&'a Tensor, &'a Placement)>,
) {
    let n = tensors.len();
    let _ = w.write_all(b"{\"file\":");
    let _ = serde_json::to_writer(&mut *w, file);
    let _ = w.write_all(
        format!(",\"format\":\"zTensor v0.1.0\",\"tensor_count\":{n},\"tensors\":[\n").as_bytes(),
    );
    for (i, (t, p)) in tensors.enumerate() {
        let _ = serde_json::to_writer(&mut *w, &tensor_sidecar(t, p));
        let _ = w.write_all(if i + 1 < n { b",\n" } else { b"\n" });
    }
    let _ = w.write_all(b"]}\n");
}

/// A writer that only counts: the size of a generated file without
/// keeping its text (index.json of 600 000 tensors is some 300 MB).
#[derive(Default)]
pub struct Counter(pub u64);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
