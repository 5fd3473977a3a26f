//! zarr v3 metadata for the `.zarr` view: a group mirroring the tree, and
//! for each dense tensor an array of one chunk holding its bytes. Type
//! names are TensorStore's (zarr's core types plus its extensions).

use std::borrow::Cow;

use serde_json::json;

use super::{FileId, Made, Placed, Registration, Source, View};
use crate::catalog::{Catalog, DType, Json, Part, Tensor};

pub const VIEW: Registration = Registration {
    name: "zarr",
    dir: ".zarr",
    mirrors: true,
    path_of: |dir, path| format!("{dir}/{path}"),
    make,
};

fn make(_: &Source<'_>) -> Result<Box<dyn View>, String> {
    Ok(Box::new(Zarr))
}

/// Kinds of file (`FileId::kind`): a tensor's array's `zarr.json`, a
/// group's, the top group's.
const ARRAY: u8 = 0;
const GROUP: u8 = 1;
const TOP: u8 = 2;

/// A zarr v3 group for each directory of the tree, holding for each dense
/// tensor of a type zarr has an array of one chunk: `PATH/zarr.json` and
/// the chunk (`PATH/c/0/…`), which is the tensor's own bytes.
struct Zarr;

impl View for Zarr {
    fn tensor_files(&self, ti: usize, part: &Part, leaf: &str) -> Vec<Placed> {
        if data_type(part.dtype).is_none() || part.shape.len() > MAX_RANK {
            return Vec::new();
        }
        let array = FileId {
            kind: ARRAY,
            tensor: Some(ti),
        };
        let mut out = vec![Placed {
            path: vec![leaf.to_string().into(), "zarr.json".into()],
            what: Made::Text(array),
        }];
        if let Some(chunk) = chunk_path(&part.shape) {
            let mut path = vec![Cow::Owned(leaf.to_string())];
            path.extend(chunk.into_iter().map(Cow::Borrowed));
            out.push(Placed {
                path,
                what: Made::TensorBytes,
            });
        }
        out
    }

    fn dir_files(&self, top: bool) -> Vec<(&'static str, Made)> {
        let kind = if top { TOP } else { GROUP };
        vec![("zarr.json", Made::Text(FileId { kind, tensor: None }))]
    }

    fn text(&self, c: &Catalog, f: FileId) -> Vec<u8> {
        match (f.kind, f.tensor) {
            (ARRAY, Some(ti)) => c
                .tensors
                .get(ti)
                .and_then(|t| array_json(c, t, t.parts.as_ref().ok()?.first()?))
                .unwrap_or_default(),
            (kind, _) => group_json(c, kind == TOP),
        }
    }
}

/// The highest rank the readers open: TensorStore's limit, and where
/// zarr-python's indexing stops too. A tensor of higher rank gets no
/// array that would only fail.
pub const MAX_RANK: usize = 32;

/// The zarr v3 `data_type` of `d`, where a reader has one.
pub fn data_type(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::Float8E8M0Fnu | DType::Float4E2M1FnX2 => return None,
        // Our names are TensorStore's for every other type.
        other => other.name(),
    })
}

fn fill_value(d: DType) -> Json {
    match d {
        DType::Bool => json!(false),
        DType::Complex64 | DType::Complex128 => json!([0.0, 0.0]),
        d if d.is_integer() => json!(0),
        _ => json!(0.0),
    }
}

/// The path of the one chunk inside the array's directory, as components
/// (`c` for a scalar, `c/0/0` for a matrix), or `None` when the array has
/// no chunk (a zero-length dimension: nothing is stored).
pub fn chunk_path(shape: &[u64]) -> Option<Vec<&'static str>> {
    if shape.contains(&0) {
        return None;
    }
    let mut p = vec!["c"];
    p.extend(std::iter::repeat_n("0", shape.len()));
    Some(p)
}

/// `zarr.json` of the array for `part` of tensor `t`, or `None` when zarr
/// has no type for it.
pub fn array_json(c: &Catalog, t: &Tensor, part: &Part) -> Option<Vec<u8>> {
    let data_type = data_type(part.dtype)?;
    let chunk: Vec<u64> = part.shape.iter().map(|&d| d.max(1)).collect();
    let mut attributes = serde_json::Map::new();
    attributes.insert("name".into(), json!(t.name));
    attributes.insert("format".into(), json!(c.format));
    attributes.insert("format_dtype".into(), json!(t.dtype));
    attributes.insert("layout".into(), json!(t.layout));
    attributes.insert("encoding".into(), json!(t.encoding));
    attributes.extend(t.meta.to_map());
    let mut codec = json!({"name": "bytes"});
    if part.dtype.size() > 1 {
        codec["configuration"] = json!({"endian": "little"});
    }
    let v = json!({
        "zarr_format": 3,
        "node_type": "array",
        "shape": part.shape,
        "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill_value(part.dtype),
        "codecs": [codec],
        "attributes": attributes,
    });
    serde_json::to_vec_pretty(&v).ok()
}

/// `zarr.json` of a group; the top one carries the file's attributes.
pub fn group_json(c: &Catalog, top: bool) -> Vec<u8> {
    let attributes = if top {
        json!({"format": c.format, "file": c.label, "attributes": c.attributes})
    } else {
        json!({})
    };
    let v = json!({"zarr_format": 3, "node_type": "group", "attributes": attributes});
    serde_json::to_vec_pretty(&v).unwrap_or_default()
}
