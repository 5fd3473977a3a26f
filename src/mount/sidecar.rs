//! The JSON a user reads next to each tensor (`NAME.json`), per sparse part,
//! and in `.ztensor/index.json`.

use serde_json::{Map, Value as Json, json};

use super::tree::Placement;
use crate::format::cbor_json;
use crate::format::{Part, SparseForm, SparseFormat, Tensor};

/// The full description of one tensor.
pub fn tensor_json(t: &Tensor, at: &Placement) -> Json {
    let mut m = Map::new();
    m.insert("name".into(), json!(t.name));
    m.insert(
        "path".into(),
        if at.path.is_empty() {
            Json::Null
        } else {
            json!(at.path)
        },
    );
    if let Some(why) = &at.escaped {
        m.insert("path_escaped_because".into(), json!(why));
    }
    m.insert("dtype".into(), json!(t.dtype_name));
    m.insert("shape".into(), json!(t.shape));
    match &t.layout {
        Ok(l) => {
            m.insert("supported".into(), json!(true));
            let nbytes: u64 = l.parts.iter().map(|p| p.nbytes).sum();
            m.insert("nbytes".into(), json!(nbytes));
            if l.sparse.is_none() {
                add_numpy(&mut m, &l.parts[0]);
            }
        }
        Err(why) => {
            m.insert("supported".into(), json!(false));
            m.insert("unsupported_reason".into(), json!(why));
        }
    }
    m.insert("layout".into(), json!(t.layout_name));
    m.insert("encoding".into(), json!(t.encoding_name));
    m.insert("offset".into(), json!(t.offset));
    m.insert("size".into(), json!(t.size));
    m.insert("data_endianness".into(), json!(t.endian.name()));
    m.insert(
        "checksum".into(),
        t.checksum
            .as_ref()
            .map_or(Json::Null, |c| json!(c.to_string())),
    );
    if let Ok(l) = &t.layout
        && let Some(s) = &l.sparse
    {
        m.insert(
            "sparse_format".into(),
            json!(match s.format {
                SparseFormat::Csr => "csr",
                SparseFormat::Coo => "coo",
            }),
        );
        m.insert(
            "sparse_form".into(),
            json!(match s.form {
                SparseForm::Spec => "spec",
                SparseForm::Reference => "reference",
            }),
        );
        m.insert("nnz".into(), json!(s.nnz));
        let parts: Vec<Json> = l.parts.iter().map(|p| part_json(t, p, &at.path)).collect();
        m.insert("parts".into(), Json::Array(parts));
    }
    m.insert(
        "custom".into(),
        Json::Object(cbor_json::map_to_json(&t.custom)),
    );
    Json::Object(m)
}

/// The description of one sparse part, in `NAME/PART.json`.
pub fn part_json(t: &Tensor, p: &Part, dir: &str) -> Json {
    let mut m = Map::new();
    m.insert("tensor".into(), json!(t.name));
    m.insert("part".into(), json!(p.name));
    m.insert("path".into(), json!(format!("{dir}/{}", p.name)));
    m.insert("dtype".into(), json!(p.dtype.name()));
    m.insert("shape".into(), json!(p.shape));
    m.insert("nbytes".into(), json!(p.nbytes));
    add_numpy(&mut m, p);
    Json::Object(m)
}

fn add_numpy(m: &mut Map<String, Json>, p: &Part) {
    m.insert("numpy_dtype".into(), json!(p.dtype.numpy()));
    if let Some(note) = p.dtype.numpy_note() {
        m.insert("numpy_note".into(), json!(note));
    }
}

/// Pretty JSON text with a final newline.
pub fn render(v: &Json) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// `.ztensor/index.json`: one tensor per line, written as it goes so that
/// only the text (not a JSON tree of every tensor) is ever in memory.
pub fn index<'a>(
    file: &str,
    tensors: impl ExactSizeIterator<Item = (&'a Tensor, &'a Placement)>,
) -> Vec<u8> {
    let n = tensors.len();
    let mut out = Vec::with_capacity(n * 400 + 200);
    let head = json!({"file": file, "format": "zTensor v0.1.0", "tensor_count": n});
    let head = head.to_string();
    // `{"file":...,"tensor_count":N` then the array.
    out.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    out.extend_from_slice(b",\"tensors\":[\n");
    for (i, (t, p)) in tensors.enumerate() {
        let _ = serde_json::to_writer(&mut out, &tensor_json(t, p));
        out.extend_from_slice(if i + 1 < n { b",\n" } else { b"\n" });
    }
    out.extend_from_slice(b"]}\n");
    out
}
