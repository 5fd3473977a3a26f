//! The JSON a user reads next to each tensor (`NAME.json`), per sparse part,
//! and in `.ztensor/index.json`. Serialized straight from borrowed fields:
//! `ls -l` of a 100 000-tensor mount renders every sidecar once for its size.

use std::io::Write;

use serde::Serialize;

use super::tree::{Placement, Tree};
use crate::catalog::{Catalog, JsonMap, Meta, Part, Tensor};

/// One tensor, as in `NAME.json`.
#[derive(Serialize)]
pub struct TensorSidecar<'a> {
    name: &'a str,
    path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_escaped_because: Option<&'a str>,
    format: &'a str,
    /// Our element type name where the tensor is one file of a known
    /// type; the format's otherwise.
    dtype: &'a str,
    /// The format's own name for the type, where it differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    format_dtype: Option<&'a str>,
    /// The file's shape, in elements of `numpy_dtype` for one file.
    shape: &'a [u64],
    /// The tensor's shape, where its one file holds other units (quantized
    /// blocks, packed nibbles) and so has another.
    #[serde(skip_serializing_if = "Option::is_none")]
    logical_shape: Option<&'a [u64]>,
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
    /// The format's own fields.
    #[serde(flatten)]
    meta: &'a Meta,
    #[serde(skip_serializing_if = "Option::is_none")]
    parts: Option<Vec<PartSidecar<'a>>>,
    /// The view files that show it, by view.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    views: JsonMap,
}

/// One part of a tensor shown as a directory, as in `NAME/PART.json`.
#[derive(Serialize)]
pub struct PartSidecar<'a> {
    tensor: &'a str,
    part: &'a str,
    path: String,
    dtype: &'static str,
    shape: &'a [u64],
    nbytes: u64,
    numpy_dtype: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    numpy_note: Option<&'static str>,
    encoding: &'static str,
    supported: bool,
    #[serde(flatten)]
    meta: &'a Meta,
}

/// The sidecar of tensor `t`, placed at `at` with exposed path `path`
/// (`Tree::path_of`) and shown by `views` (`Tree::views_of`).
pub fn tensor_sidecar<'a>(
    c: &'a Catalog,
    t: &'a Tensor,
    path: &'a str,
    at: &'a Placement,
    views: u8,
) -> TensorSidecar<'a> {
    let parts = t.parts.as_ref().ok();
    let file = parts.filter(|_| !t.directory).and_then(|ps| ps.first());
    let dtype = file.map_or(t.dtype.as_str(), |p| p.dtype.name());
    let shape = file.map_or(&t.shape[..], |p| &p.shape[..]);
    TensorSidecar {
        name: &t.name,
        path: (!path.is_empty()).then_some(path),
        path_escaped_because: at.escaped.as_deref(),
        format: &c.format,
        dtype,
        format_dtype: (dtype != t.dtype).then_some(t.dtype.as_str()),
        shape,
        logical_shape: (shape != t.shape).then_some(&t.shape[..]),
        supported: parts.is_some(),
        unsupported_reason: t.parts.as_ref().err().map(String::as_str),
        nbytes: t.nbytes(),
        numpy_dtype: file.map(|p| p.dtype.numpy()),
        numpy_note: file.and_then(|p| p.dtype.numpy_note()),
        layout: &t.layout,
        encoding: &t.encoding,
        meta: &t.meta,
        parts: parts
            .filter(|_| t.directory)
            .map(|ps| ps.iter().map(|p| part_sidecar(c, t, p, path)).collect()),
        views: view_paths(path, views),
    }
}

/// Where the views (bit `id` of `views`) show a tensor of exposed path
/// `path`.
fn view_paths(path: &str, views: u8) -> JsonMap {
    let mut m = JsonMap::new();
    for (id, r) in crate::views::VIEWS.iter().enumerate() {
        if views & (1 << id) != 0 {
            m.insert(r.name.into(), (r.path_of)(r.dir, path).into());
        }
    }
    m
}

pub fn part_sidecar<'a>(c: &Catalog, t: &'a Tensor, p: &'a Part, dir: &str) -> PartSidecar<'a> {
    PartSidecar {
        tensor: &t.name,
        part: &p.name,
        path: format!("{dir}/{}", p.name),
        dtype: p.dtype.name(),
        shape: &p.shape,
        nbytes: p.nbytes,
        numpy_dtype: p.dtype.numpy(),
        numpy_note: p.dtype.numpy_note(),
        encoding: c.blobs.get(p.blob).map_or("raw", |b| b.codec.name()),
        supported: true,
        meta: &p.meta,
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
pub fn index_to(w: &mut impl Write, c: &Catalog, tree: &Tree) {
    let n = c.tensors.len();
    let _ = w.write_all(b"{\"file\":");
    let _ = serde_json::to_writer(&mut *w, &c.label);
    let _ = w.write_all(b",\"format\":");
    let _ = serde_json::to_writer(&mut *w, &c.format);
    let _ = w.write_all(b",\"attributes\":");
    let _ = serde_json::to_writer(&mut *w, &c.attributes);
    let _ = w.write_all(format!(",\"tensor_count\":{n},\"tensors\":[\n").as_bytes());
    for (i, (t, p)) in c.tensors.iter().zip(&tree.placements).enumerate() {
        let path = tree.path_of(i);
        let _ = serde_json::to_writer(&mut *w, &tensor_sidecar(c, t, &path, p, tree.views_of(i)));
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
