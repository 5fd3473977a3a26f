//! ONNX: a ModelProto's graph initializers, one tensor each, found by a
//! walk over the protobuf wire format (no schema compiled in). The whole
//! model is walked at open, every length checked against the message it
//! is in, as `onnx.load` parses it whole.
//!
//! - `raw_data`: a raw range of the file, served from the mapping.
//! - The typed repeated fields (`float_data`, `int32_data`, ...): a
//!   [`Codec::Computed`] blob, converted by the ONNX storage rules when
//!   first read (small types are one element per `int32_data` entry).
//! - External data (`data_location: EXTERNAL`): a raw range of a file in
//!   the model's directory, as `onnx.load` reads it. Its `location` must
//!   be a relative path that stays in that directory (no `..`, no
//!   absolute path, no symlink out of it) and name a regular file that
//!   holds the range.
//! - Listed as unsupported, the rest served: a STRING or UNDEFINED tensor
//!   or one of a type with no element type here, a segment
//!   (`TensorProto.segment`, which `onnx` does not load either), a sparse
//!   initializer.
//! - Refused in one line naming the tensor: a negative dimension, sizes
//!   that disagree, data in two places, external data that is outside the
//!   directory, missing or short; two initializers of one name; a wire
//!   format that is broken anywhere.

use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::catalog::{
    Blob, Catalog, Check, Codec, DType, Endian, Json, JsonMap, Part, Producer, SourceRef, Tensor,
};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::common::MAX_COMPUTED;
use crate::formats::{Limits, Opened};
use crate::source::MappedFile;

/// Whether `bytes` look like an ONNX ModelProto: a walk over its top-level
/// protobuf fields, each a field number ModelProto has, with a known wire
/// type and within the file, starting with `ir_version` and including a
/// `graph`; or, for a model cut short (or with bytes past its end that
/// break off), `ir_version` and a graph that runs past the end, or at
/// least two such fields before the one that does, so that the ONNX reader
/// says what is wrong with it. Tried after every format with a magic
/// (`super::detect`).
pub fn looks_like(bytes: &[u8]) -> bool {
    fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*pos)?;
            *pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    // ir_version (field 1, varint) comes first in every writer we know.
    if bytes.first() != Some(&0x08) {
        return false;
    }
    let (mut pos, mut graph, mut fields) = (0usize, false, 0u32);
    // A walk cut off by the end of the file, after two good fields.
    let cut = |pos: usize, fields: u32| fields >= 2 && pos >= bytes.len();
    while pos < bytes.len() {
        let Some(tag) = varint(bytes, &mut pos) else {
            return cut(pos, fields);
        };
        let (field, wire) = (tag >> 3, tag & 7);
        if !(1..=25).contains(&field) {
            return false;
        }
        match wire {
            0 => {
                if varint(bytes, &mut pos).is_none() {
                    return cut(pos, fields);
                }
            }
            2 => {
                let Some(n) = varint(bytes, &mut pos) else {
                    return cut(pos, fields);
                };
                match usize::try_from(n).ok().and_then(|n| pos.checked_add(n)) {
                    Some(end) if end <= bytes.len() => pos = end,
                    _ => return fields >= 2 || field == 7 && fields == 1,
                }
                graph |= field == 7;
            }
            _ => return false,
        }
        fields += 1;
        if fields > 1_000_000 {
            return false;
        }
    }
    graph
}

const VARINT: u64 = 0;
const I64: u64 = 1;
const LEN: u64 = 2;
const I32: u64 = 5;

/// One field's value as it is on the wire.
#[derive(Clone, Copy)]
enum Val<'a> {
    Int(u64),
    Fixed64(&'a [u8]),
    Fixed32(&'a [u8]),
    /// Where in the file the bytes start, and the bytes.
    Bytes(u64, &'a [u8]),
}

/// A walk over one message's fields.
struct Pb<'a> {
    b: &'a [u8],
    at: usize,
    /// Where `b` starts in the file.
    base: u64,
    /// The message, for errors ("the graph").
    what: &'static str,
}

impl<'a> Pb<'a> {
    fn new(b: &'a [u8], base: u64, what: &'static str) -> Self {
        Pb {
            b,
            at: 0,
            base,
            what,
        }
    }

    fn varint(&mut self) -> std::result::Result<u64, String> {
        let from = self.base + self.at as u64;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.b.get(self.at) else {
                return Err(format!(
                    "a varint at byte {from} runs past the end of {}",
                    self.what
                ));
            };
            self.at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("a varint at byte {from} is longer than 10 bytes"))
    }

    fn take(&mut self, n: u64) -> std::result::Result<(u64, &'a [u8]), String> {
        let from = self.base + self.at as u64;
        let left = (self.b.len() - self.at) as u64;
        if n > left {
            return Err(format!(
                "a length of {n} bytes at byte {from} runs past the end of {} ({left} bytes left)",
                self.what
            ));
        }
        let s = &self.b[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok((from, s))
    }

    /// The next field: its number and value; `None` at the end.
    fn next(&mut self) -> std::result::Result<Option<(u64, Val<'a>)>, String> {
        if self.at >= self.b.len() {
            return Ok(None);
        }
        let from = self.base + self.at as u64;
        let tag = self.varint()?;
        let (field, wire) = (tag >> 3, tag & 7);
        if field == 0 {
            return Err(format!("field number 0 at byte {from} in {}", self.what));
        }
        let v = match wire {
            VARINT => Val::Int(self.varint()?),
            I64 => Val::Fixed64(self.take(8)?.1),
            LEN => {
                let n = self.varint()?;
                let (at, s) = self.take(n)?;
                Val::Bytes(at, s)
            }
            I32 => Val::Fixed32(self.take(4)?.1),
            w => {
                return Err(format!(
                    "wire type {w} at byte {from} in {}, which ONNX does not use",
                    self.what
                ));
            }
        };
        Ok(Some((field, v)))
    }
}

/// Each varint of a packed field.
fn varints(b: &[u8], base: u64) -> impl Iterator<Item = std::result::Result<u64, String>> + '_ {
    let mut p = Pb::new(b, base, "a packed field");
    std::iter::from_fn(move || (p.at < p.b.len()).then(|| p.varint()))
}

/// Reads an ONNX model into the catalog.
pub fn open(src: MappedFile, limits: Limits) -> Result<Opened> {
    let _ = limits;
    let mut r = Reader {
        src: &src,
        catalog: Catalog::of_file("ONNX", src.label(), src.path()),
        extra: Vec::new(),
        file: None,
        names: std::collections::HashSet::new(),
    };
    r.model()?;
    let Reader { catalog, extra, .. } = r;
    let mut sources = vec![Some(src)];
    sources.extend(extra.into_iter().map(|(_, f)| Some(f)));
    Ok(Opened { catalog, sources })
}

struct Reader<'s> {
    src: &'s MappedFile,
    catalog: Catalog,
    /// The external data files opened, by their real path.
    extra: Vec<(PathBuf, MappedFile)>,
    /// One descriptor shared by every typed tensor's producer.
    file: Option<Arc<std::fs::File>>,
    names: std::collections::HashSet<String>,
}

/// What a TensorProto says.
#[derive(Default)]
struct Proto<'a> {
    name: Option<String>,
    dims: Vec<u64>,
    data_type: u64,
    raw: Option<(u64, &'a [u8])>,
    /// Elements in each typed field: float, int32, string, int64, double,
    /// uint64.
    typed: [u64; 6],
    segment: bool,
    external: bool,
    entries: Vec<(String, String)>,
    /// The whole message: where it is in the file and its length.
    at: (u64, u64),
}

const FLOAT_DATA: usize = 0;
const INT32_DATA: usize = 1;
const STRING_DATA: usize = 2;
const INT64_DATA: usize = 3;
const DOUBLE_DATA: usize = 4;
const UINT64_DATA: usize = 5;
const TYPED_NAMES: [&str; 6] = [
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
];

/// An ONNX data type: our element type, its name, the typed field that
/// holds it and how many entries of that field make one element.
fn data_type(id: u64) -> std::result::Result<(DType, &'static str, usize, u64), String> {
    use DType::*;
    Ok(match id {
        1 => (Float32, "FLOAT", FLOAT_DATA, 1),
        2 => (Uint8, "UINT8", INT32_DATA, 1),
        3 => (Int8, "INT8", INT32_DATA, 1),
        4 => (Uint16, "UINT16", INT32_DATA, 1),
        5 => (Int16, "INT16", INT32_DATA, 1),
        6 => (Int32, "INT32", INT32_DATA, 1),
        7 => (Int64, "INT64", INT64_DATA, 1),
        9 => (Bool, "BOOL", INT32_DATA, 1),
        10 => (Float16, "FLOAT16", INT32_DATA, 1),
        11 => (Float64, "DOUBLE", DOUBLE_DATA, 1),
        12 => (Uint32, "UINT32", UINT64_DATA, 1),
        13 => (Uint64, "UINT64", UINT64_DATA, 1),
        14 => (Complex64, "COMPLEX64", FLOAT_DATA, 2),
        15 => (Complex128, "COMPLEX128", DOUBLE_DATA, 2),
        16 => (BFloat16, "BFLOAT16", INT32_DATA, 1),
        17 => (Float8E4M3Fn, "FLOAT8E4M3FN", INT32_DATA, 1),
        18 => (Float8E4M3Fnuz, "FLOAT8E4M3FNUZ", INT32_DATA, 1),
        19 => (Float8E5M2, "FLOAT8E5M2", INT32_DATA, 1),
        20 => (Float8E5M2Fnuz, "FLOAT8E5M2FNUZ", INT32_DATA, 1),
        0 => return Err("its data_type is 0 (UNDEFINED)".into()),
        8 => return Err("a STRING tensor: strings have no element type here".into()),
        n => {
            let name = match n {
                21 => "UINT4",
                22 => "INT4",
                23 => "FLOAT4E2M1",
                24 => "FLOAT8E8M0",
                25 => "UINT2",
                26 => "INT2",
                _ => return Err(format!("ONNX data type {n} is not one this reader knows")),
            };
            return Err(format!(
                "ONNX data type {name} ({n}) has no element type here"
            ));
        }
    })
}

fn type_name(id: u64) -> String {
    match (id, data_type(id)) {
        (_, Ok((_, n, _, _))) => n.into(),
        (0, _) => "UNDEFINED".into(),
        (8, _) => "STRING".into(),
        (n, _) => format!("ONNX data type {n}"),
    }
}

impl<'s> Reader<'s> {
    fn bad(&self, msg: String) -> Error {
        Error::new(ErrorKind::Index, self.src.label(), None, msg)
    }

    fn bad_tensor(&self, name: &str, kind: ErrorKind, msg: String) -> Error {
        Error::new(kind, self.src.label(), Some(name), msg)
    }

    fn model(&mut self) -> Result<()> {
        let src = self.src;
        let mut pb = Pb::new(src.bytes(), 0, "the model");
        let mut graph = None;
        while let Some((field, v)) = pb
            .next()
            .map_err(|e| self.bad(format!("ONNX model: {e}")))?
        {
            if field == 7 {
                let Val::Bytes(at, b) = v else {
                    return Err(self.bad("ONNX model: its graph is not a message".into()));
                };
                if graph.is_some() {
                    return Err(self.bad("ONNX model: more than one graph field".into()));
                }
                graph = Some((at, b));
            }
        }
        let (at, b) = graph.ok_or_else(|| self.bad("ONNX model: no graph".into()))?;
        let mut pb = Pb::new(b, at, "the graph");
        while let Some((field, v)) = pb
            .next()
            .map_err(|e| self.bad(format!("ONNX graph: {e}")))?
        {
            match (field, v) {
                (5, Val::Bytes(at, b)) => self.initializer(at, b)?,
                (15, Val::Bytes(at, b)) => self.sparse(at, b)?,
                (5 | 15, _) => {
                    return Err(self.bad(format!(
                        "ONNX graph: its field {field} (an initializer) is not a message"
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn proto<'a>(&self, at: u64, b: &'a [u8]) -> Result<Proto<'a>> {
        let mut t = Proto {
            at: (at, b.len() as u64),
            ..Proto::default()
        };
        let mut pb = Pb::new(b, at, "an initializer");
        let wire = |e: String| self.bad(format!("ONNX initializer at byte {at}: {e}"));
        let mut dims: Vec<u64> = Vec::new();
        while let Some((field, v)) = pb.next().map_err(wire)? {
            match (field, v) {
                (1, Val::Int(d)) => dims.push(d),
                (1, Val::Bytes(at, b)) => {
                    for d in varints(b, at) {
                        dims.push(d.map_err(wire)?);
                    }
                }
                (2, Val::Int(d)) => t.data_type = d,
                (3, _) => t.segment = true,
                (4, Val::Bytes(_, b)) if b.len() % 4 == 0 => {
                    t.typed[FLOAT_DATA] += b.len() as u64 / 4
                }
                (4, Val::Fixed32(_)) => t.typed[FLOAT_DATA] += 1,
                (10, Val::Bytes(_, b)) if b.len() % 8 == 0 => {
                    t.typed[DOUBLE_DATA] += b.len() as u64 / 8
                }
                (10, Val::Fixed64(_)) => t.typed[DOUBLE_DATA] += 1,
                (5 | 7 | 11, Val::Int(_)) | (6, Val::Bytes(..)) => {
                    t.typed[typed_index(field)] += 1;
                }
                (5 | 7 | 11, Val::Bytes(at, b)) => {
                    for d in varints(b, at) {
                        d.map_err(wire)?;
                        t.typed[typed_index(field)] += 1;
                    }
                }
                (8, Val::Bytes(_, b)) => {
                    t.name = Some(
                        String::from_utf8(b.to_vec())
                            .map_err(|_| wire("its name is not UTF-8".into()))?,
                    );
                }
                (9, Val::Bytes(at, b)) => t.raw = Some((at, b)),
                (13, Val::Bytes(at, b)) => {
                    t.external = true;
                    let (mut k, mut val) = (String::new(), String::new());
                    let mut e = Pb::new(b, at, "an external_data entry");
                    while let Some((f, v)) = e.next().map_err(wire)? {
                        if let (1 | 2, Val::Bytes(_, s)) = (f, v) {
                            let s = String::from_utf8_lossy(s).into_owned();
                            if f == 1 { k = s } else { val = s }
                        }
                    }
                    t.entries.push((k, val));
                }
                (14, Val::Int(l)) => t.external |= l == 1,
                (1..=11 | 13 | 14, _) => {
                    return Err(wire(format!(
                        "its field {field} has the wrong wire type, or a length that is not \
                         whole elements"
                    )));
                }
                _ => {}
            }
        }
        // dims are int64: a negative one is a varint of 2^63 or more.
        t.dims = dims;
        Ok(t)
    }

    fn initializer(&mut self, at: u64, b: &[u8]) -> Result<()> {
        let t = self.proto(at, b)?;
        let Some(name) = t.name.clone().filter(|n| !n.is_empty()) else {
            return Err(self.bad(format!("ONNX initializer at byte {at} has no name")));
        };
        self.claim(&name)?;
        let dims = self.dims(&name, &t.dims)?;
        let dtype = type_name(t.data_type);
        let mut meta = JsonMap::new();
        meta.insert("onnx_data_type".into(), t.data_type.into());
        let parts = if t.segment {
            Err(
                "a segment of a tensor (TensorProto.segment), which onnx does not load either"
                    .to_string(),
            )
        } else {
            match data_type(t.data_type) {
                Err(why) => Err(why),
                Ok((d, _, field, per)) => {
                    let (blob, encoding) = self.data(&name, &t, d, &dims, field, per, &mut meta)?;
                    let checks = if d == DType::Bool {
                        vec![Check::BoolBytes]
                    } else {
                        Vec::new()
                    };
                    let nbytes = blob.decoded_len;
                    self.catalog.blobs.push(Blob {
                        checks,
                        label: format!("tensor {name:?}"),
                        ..blob
                    });
                    let bi = self.catalog.blobs.len() - 1;
                    Ok((
                        vec![Part::dense(d, dims.clone(), nbytes, bi, Endian::Little)],
                        encoding,
                    ))
                }
            }
        };
        let (parts, encoding) = match parts {
            Ok((p, e)) => (Ok(p), e),
            Err(why) => (Err(why), "raw"),
        };
        self.catalog.tensors.push(Tensor::dense(
            name,
            dtype,
            dims,
            encoding,
            parts,
            meta.into(),
        ));
        Ok(())
    }

    /// A sparse initializer: listed by its values' name.
    fn sparse(&mut self, at: u64, b: &[u8]) -> Result<()> {
        let mut pb = Pb::new(b, at, "a sparse initializer");
        let wire = |e: String| self.bad(format!("ONNX sparse initializer at byte {at}: {e}"));
        let (mut values, mut dims) = (None, Vec::new());
        while let Some((field, v)) = pb.next().map_err(wire)? {
            match (field, v) {
                (1, Val::Bytes(at, b)) => values = Some(self.proto(at, b)?),
                (2, Val::Bytes(at, b)) => {
                    self.proto(at, b)?;
                }
                (3, Val::Int(d)) => dims.push(d),
                (3, Val::Bytes(at, b)) => {
                    for d in varints(b, at) {
                        dims.push(d.map_err(wire)?);
                    }
                }
                _ => {}
            }
        }
        let Some(name) = values
            .as_ref()
            .and_then(|v| v.name.clone())
            .filter(|n| !n.is_empty())
        else {
            return Err(self.bad(format!("ONNX sparse initializer at byte {at} has no name")));
        };
        self.claim(&name)?;
        let dims = self.dims(&name, &dims)?;
        self.catalog.tensors.push(Tensor {
            name,
            dtype: type_name(values.map_or(0, |v| v.data_type)),
            shape: dims,
            layout: "sparse".into(),
            encoding: "raw".into(),
            directory: false,
            parts: Err(
                "a sparse initializer (SparseTensorProto): its values and indices are \
                        not served as a dense tensor"
                    .into(),
            ),
            meta: crate::catalog::Meta::default(),
        });
        Ok(())
    }

    fn claim(&mut self, name: &str) -> Result<()> {
        if self.names.insert(name.to_string()) {
            Ok(())
        } else {
            Err(self.bad_tensor(
                name,
                ErrorKind::Duplicate,
                "two initializers of this name".into(),
            ))
        }
    }

    fn dims(&self, name: &str, dims: &[u64]) -> Result<Vec<u64>> {
        match dims.iter().find(|&&d| d > i64::MAX as u64) {
            Some(&d) => Err(self.bad_tensor(
                name,
                ErrorKind::Field,
                format!(
                    "dimension {} of its dims {:?} is negative",
                    d as i64,
                    dims.iter().map(|&d| d as i64).collect::<Vec<_>>()
                ),
            )),
            None => Ok(dims.to_vec()),
        }
    }

    /// The blob of a tensor of a known type, and its encoding's name.
    #[allow(clippy::too_many_arguments)]
    fn data(
        &mut self,
        name: &str,
        t: &Proto,
        d: DType,
        dims: &[u64],
        field: usize,
        per: u64,
        meta: &mut JsonMap,
    ) -> Result<(Blob, &'static str)> {
        let tname = type_name(t.data_type);
        let want = dims
            .iter()
            .try_fold(1u64, |a, &x| a.checked_mul(x))
            .and_then(|n| n.checked_mul(d.size()))
            .ok_or_else(|| {
                self.bad_tensor(
                    name,
                    ErrorKind::Size,
                    format!("{tname} of dims {dims:?} is more than 2^64 bytes"),
                )
            })?;
        let size_err = |have: u64, r#where: &str| {
            self.bad_tensor(
                name,
                ErrorKind::Size,
                format!("holds {have} bytes in {where} but {tname} of dims {dims:?} is {want}"),
            )
        };
        let typed = self.one_place(name, t)?;
        if t.external {
            return self.external(name, t, want, meta).map(|b| (b, "raw"));
        }
        if let Some((at, b)) = t.raw {
            if b.len() as u64 != want {
                return Err(size_err(b.len() as u64, "raw_data"));
            }
            meta.insert("offset".into(), at.into());
            meta.insert("size".into(), want.into());
            return Ok((raw_blob(at, want), "raw"));
        }
        // The typed field of this type (or none at all: no data).
        let have = t.typed[field];
        if typed.is_empty() && want == 0 {
            return Ok((raw_blob(0, 0), "raw"));
        }
        if let Some(other) = typed.first().filter(|&&f| f != TYPED_NAMES[field]) {
            return Err(self.bad_tensor(
                name,
                ErrorKind::Field,
                format!("its data is in {other}, which does not hold {tname}"),
            ));
        }
        let elems = want / d.size().max(1);
        if have != elems * per {
            let unit = d.size() / per;
            return Err(size_err(have * unit, TYPED_NAMES[field]));
        }
        if want > MAX_COMPUTED {
            return Err(self.bad_tensor(
                name,
                ErrorKind::Unsupported,
                format!(
                    "its {want} bytes in {} can only be made whole, and that is over the \
                     {MAX_COMPUTED}-byte limit",
                    TYPED_NAMES[field]
                ),
            ));
        }
        let file = super::common::shared_file(&mut self.file, self.src)
            .map_err(|why| Error::new(ErrorKind::Io, self.src.label(), None, why))?;
        meta.insert("onnx_field".into(), Json::from(TYPED_NAMES[field]));
        Ok((
            Blob {
                source: 0,
                offset: 0,
                len: 0,
                codec: Codec::Computed(converter(file, t.at, field, d.size() / per, want)),
                decoded_len: want,
                checks: Vec::new(),
                label: String::new(),
            },
            "computed",
        ))
    }

    /// The typed fields that hold tensor `t`'s data (at most one), once
    /// its data is in one place only: one typed field, `raw_data` or
    /// external data.
    fn one_place(&self, name: &str, t: &Proto) -> Result<Vec<&'static str>> {
        let typed: Vec<&'static str> = (0..6)
            .filter(|&i| t.typed[i] > 0)
            .map(|i| TYPED_NAMES[i])
            .collect();
        let places = usize::from(t.raw.is_some()) + usize::from(t.external) + typed.len().min(1);
        if places <= 1 && typed.len() <= 1 {
            return Ok(typed);
        }
        let mut all = typed;
        if t.raw.is_some() {
            all.insert(0, "raw_data");
        }
        if t.external {
            all.insert(0, "external data");
        }
        Err(self.bad_tensor(
            name,
            ErrorKind::Field,
            format!("its data is in more than one place ({})", all.join(", ")),
        ))
    }

    /// External data: a range of a file in the model's directory.
    fn external(&mut self, name: &str, t: &Proto, want: u64, meta: &mut JsonMap) -> Result<Blob> {
        let src = self.src;
        let refuse = |msg: String| Error::new(ErrorKind::Placement, src.label(), Some(name), msg);
        if src.is_remote() {
            return Err(refuse(
                "its data is in an external file, which is not read for a model over a URL".into(),
            ));
        }
        let get = |k: &str| t.entries.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v);
        let loc = get("location")
            .ok_or_else(|| refuse("its external data has no location".into()))?
            .clone();
        let num = |k: &str| -> Result<Option<u64>> {
            get(k)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| refuse(format!("its external data {k} {v:?} is not a number")))
                })
                .transpose()
        };
        let (offset, length) = (num("offset")?.unwrap_or(0), num("length")?);
        let rel = Path::new(&loc);
        if rel.is_absolute() {
            return Err(refuse(format!(
                "its external data file {loc:?} is an absolute path; it must be a file in the \
                 model's directory"
            )));
        }
        if loc.is_empty()
            || loc.contains('\0')
            || !rel.components().all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(refuse(format!(
                "its external data file {loc:?} is not a plain path inside the model's directory"
            )));
        }
        let dir = src.path().parent().unwrap_or(Path::new("."));
        let io = |what: &str, e: std::io::Error| {
            refuse(format!("its external data file {loc:?} {what}: {e}"))
        };
        let real_dir = dir.canonicalize().map_err(|e| io("cannot be found", e))?;
        let real = dir
            .join(rel)
            .canonicalize()
            .map_err(|e| io("cannot be opened", e))?;
        if !real.starts_with(&real_dir) {
            return Err(refuse(format!(
                "its external data file {loc:?} leads outside the model's directory (to {})",
                real.display()
            )));
        }
        let k = match self.extra.iter().position(|(p, _)| *p == real) {
            Some(k) => k,
            None => {
                let f = MappedFile::open(&real).map_err(|e| {
                    refuse(format!("its external data file {loc:?}: {}", e.message))
                })?;
                self.catalog.sources.push(SourceRef {
                    path: real.clone(),
                    ..SourceRef::default()
                });
                self.extra.push((real.clone(), f));
                self.extra.len() - 1
            }
        };
        let flen = self.extra[k].1.len();
        let length = length.unwrap_or(flen.saturating_sub(offset));
        if length != want {
            return Err(refuse(format!(
                "its external data is {length} bytes but {} of dims {:?} is {want}",
                type_name(t.data_type),
                t.dims
            )));
        }
        if offset.checked_add(length).is_none_or(|e| e > flen) {
            return Err(refuse(format!(
                "its external bytes at {offset} (+{length}) run past the end of {loc:?} \
                 ({flen} bytes)"
            )));
        }
        meta.insert("external_data".into(), Json::from(loc));
        meta.insert("offset".into(), offset.into());
        meta.insert("size".into(), length.into());
        Ok(Blob::raw(k + 1, offset, length, Vec::new(), String::new()))
    }
}

fn typed_index(field: u64) -> usize {
    match field {
        4 => FLOAT_DATA,
        5 => INT32_DATA,
        6 => STRING_DATA,
        7 => INT64_DATA,
        10 => DOUBLE_DATA,
        _ => UINT64_DATA,
    }
}

/// Converts a tensor's typed field to little-endian elements (units of
/// `width` bytes: an element, or half a complex one), reading its message
/// (`at`: offset, length) from the file again.
fn converter(
    file: Arc<std::fs::File>,
    at: (u64, u64),
    field: usize,
    width: u64,
    n: u64,
) -> Producer {
    Producer {
        name: "onnx typed field",
        stream: None,
        produce: Arc::new(move |out: &mut Vec<u8>| {
            if (out.capacity() as u64) < n {
                return Err(format!(
                    "{n} bytes to make, over the room given ({} bytes)",
                    out.capacity()
                ));
            }
            let len = usize::try_from(at.1).map_err(|_| "too large".to_string())?;
            let mut msg = vec![0u8; len];
            file.read_exact_at(&mut msg, at.0)
                .map_err(|e| format!("cannot read its message: {e}"))?;
            out.clear();
            let w = width as usize;
            let mut pb = Pb::new(&msg, at.0, "an initializer");
            while let Some((f, v)) = pb.next()? {
                if f == 0 || typed_index(f) != field || !matches!(f, 4 | 5 | 7 | 10 | 11) {
                    continue;
                }
                match v {
                    Val::Fixed32(b) | Val::Fixed64(b) => out.extend_from_slice(b),
                    Val::Bytes(_, b) if f == 4 || f == 10 => out.extend_from_slice(b),
                    Val::Bytes(base, b) => {
                        for x in varints(b, base) {
                            out.extend_from_slice(&x?.to_le_bytes()[..w.min(8)]);
                        }
                    }
                    Val::Int(x) => out.extend_from_slice(&x.to_le_bytes()[..w.min(8)]),
                }
                if out.len() as u64 > n {
                    break;
                }
            }
            if out.len() as u64 != n {
                return Err(format!(
                    "its typed field made {} bytes, expected {n} (the file changed?)",
                    out.len()
                ));
            }
            Ok(())
        }),
    }
}

/// A blob of `len` bytes stored as they are, at `offset` of the model.
fn raw_blob(offset: u64, len: u64) -> Blob {
    Blob::raw(0, offset, len, Vec::new(), String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onnx_detection_wants_ir_version_and_a_graph() {
        // ir_version 8, graph (field 7) of 2 bytes.
        assert!(looks_like(&[0x08, 0x08, 0x3a, 0x02, 0x00, 0x00]));
        assert!(!looks_like(&[0x08, 0x08]));
        // Cut in its graph: ONNX, for the reader to say so.
        assert!(looks_like(&[0x08, 0x08, 0x3a, 0x09, 0x00]));
        assert!(!looks_like(&[0x08, 0x08, 0x42, 0x09, 0x00]));
        assert!(!looks_like(b"hello world"));
        assert!(!looks_like(&[]));
    }
}
