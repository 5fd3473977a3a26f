//! Manifest -> the common catalog: checks every component against the file
//! and the others, and describes what each object exposes. Refuses the whole
//! file on a structural error; marks a single tensor unsupported when only
//! it cannot be served (unknown dtype, logical type, encoding or format).

use std::path::Path;

use ciborium::value::Value;

use super::manifest::{ALIGNMENT, MAGIC, Manifest, RawComponent, RawObject};
use crate::catalog::{
    Blob, Catalog, Check, Checksum, Codec, DType, Endian, Json, JsonMap, Part, PartMap, Tensor,
};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::cbor_json;

/// The format as users name it.
pub const FORMAT: &str = "zTensor v1";

/// A storage dtype of the spec (its 13 fixed primitives).
pub fn storage_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "f64" => DType::Float64,
        "f32" => DType::Float32,
        "f16" => DType::Float16,
        "bf16" => DType::BFloat16,
        "i64" => DType::Int64,
        "i32" => DType::Int32,
        "i16" => DType::Int16,
        "i8" => DType::Int8,
        "u64" => DType::Uint64,
        "u32" => DType::Uint32,
        "u16" => DType::Uint16,
        "u8" => DType::Uint8,
        "bool" => DType::Bool,
        _ => return None,
    })
}

/// A logical type of the spec and the storage dtype it must be stored as.
fn logical_dtype(name: &str) -> Option<(DType, DType)> {
    Some(match name {
        "f8_e4m3fn" => (DType::Float8E4M3Fn, DType::Uint8),
        "f8_e5m2" => (DType::Float8E5M2, DType::Uint8),
        "f8_e4m3fnuz" => (DType::Float8E4M3Fnuz, DType::Uint8),
        "f8_e5m2fnuz" => (DType::Float8E5M2Fnuz, DType::Uint8),
        "complex64" => (DType::Complex64, DType::Float32),
        "complex128" => (DType::Complex128, DType::Float64),
        _ => return None,
    })
}

/// Why a tensor cannot be described: the whole file is refused, or only
/// this tensor is left unserved.
enum Problem {
    File(ErrorKind, String),
    Tensor(String),
}

fn size_err(msg: String) -> Problem {
    Problem::File(ErrorKind::Size, msg)
}

/// A component checked against the file: where its bytes are and what they
/// decode to. Built for every component, served or not.
struct Placed {
    codec: Codec,
    decoded_len: u64,
    checks: Vec<Check>,
}

/// Builds the catalog of the file whose bytes are `bytes` (`file` names it
/// in messages, `path` is where it lives) from its manifest.
pub fn project(bytes_len: u64, file: &str, path: &Path, m: Manifest) -> Result<Catalog> {
    let mut blobs = Vec::new();
    let mut tensors = Vec::with_capacity(m.objects.len());
    // Every component's span, to find overlaps: (start, end, object, role).
    let mut spans: Vec<(u64, u64, usize, usize)> = Vec::new();
    for (oi, o) in m.objects.iter().enumerate() {
        let e = |kind, msg: String| Error::new(kind, file, Some(&o.name), msg);
        let mut placed = Vec::with_capacity(o.components.len());
        for (ci, c) in o.components.iter().enumerate() {
            let p = place(c, bytes_len, m.data_end).map_err(|(kind, msg)| e(kind, msg))?;
            if c.length > 0 {
                spans.push((c.offset, c.offset + c.length, oi, ci));
            }
            placed.push(p);
        }
        let tensor = match describe(o, &placed) {
            Ok(parts) => {
                // One blob per served component, in part order.
                let mut parts = parts;
                for part in &mut parts {
                    let ci = part.blob;
                    let c = &o.components[ci];
                    let p = &placed[ci];
                    part.blob = blobs.len();
                    let mut checks = p.checks.clone();
                    // The spec: a bool is one byte, 0x00 or 0x01.
                    if part.dtype == DType::Bool {
                        checks.push(Check::BoolBytes);
                    }
                    blobs.push(Blob {
                        source: 0,
                        offset: c.offset,
                        len: c.length,
                        codec: p.codec.clone(),
                        decoded_len: p.decoded_len,
                        checks,
                        label: if o.format == "dense" {
                            format!("tensor {:?}", o.name)
                        } else {
                            format!("tensor {:?} component {:?}", o.name, c.role)
                        },
                    });
                }
                Ok(parts)
            }
            Err(Problem::File(kind, msg)) => return Err(e(kind, msg)),
            Err(Problem::Tensor(why)) => Err(why),
        };
        tensors.push(tensor_of(o, tensor));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if a.1 > b.0 {
            let (oa, ob) = (&m.objects[a.2], &m.objects[b.2]);
            return Err(Error::new(
                ErrorKind::Placement,
                file,
                Some(&ob.name),
                format!(
                    "component {:?} at [{}, {}) overlaps component {:?} of {:?} at [{}, {})",
                    ob.components[b.3].role, b.0, b.1, oa.components[a.3].role, oa.name, a.0, a.1
                ),
            ));
        }
    }
    let mut attributes = JsonMap::new();
    attributes.insert("version".into(), m.version.into());
    if let Some(a) = &m.attributes {
        attributes.insert("attributes".into(), Json::Object(cbor_json::map_to_json(a)));
    }
    if !m.extra.is_empty() {
        attributes.insert(
            "extra".into(),
            Json::Object(cbor_json::map_to_json(&m.extra)),
        );
    }
    Ok(Catalog {
        blobs,
        tensors,
        attributes,
        ..Catalog::of_file(FORMAT, file, path)
    })
}

/// Checks a component's place, encoding fields and digest.
fn place(
    c: &RawComponent,
    file_len: u64,
    data_end: u64,
) -> std::result::Result<Placed, (ErrorKind, String)> {
    let what = format!("component {:?}", c.role);
    let placement = |msg: String| (ErrorKind::Placement, format!("{what}: {msg}"));
    if c.offset < MAGIC.len() as u64 {
        return Err(placement(format!(
            "offset {} lies inside the 8-byte header magic",
            c.offset
        )));
    }
    if !c.offset.is_multiple_of(ALIGNMENT) {
        return Err(placement(format!(
            "offset {} is not a multiple of {ALIGNMENT}",
            c.offset
        )));
    }
    let Some(end) = c.offset.checked_add(c.length) else {
        return Err(placement(format!(
            "offset {} + length {} overflows 64 bits",
            c.offset, c.length
        )));
    };
    if end > file_len {
        return Err(placement(format!(
            "[{}, {end}) runs past the end of the file ({file_len} bytes)",
            c.offset
        )));
    }
    if end > data_end {
        return Err(placement(format!(
            "[{}, {end}) runs into the manifest, which starts at {data_end}",
            c.offset
        )));
    }
    let mut checks = Vec::new();
    if let Some(d) = &c.digest {
        // The spec: the digest covers the stored (possibly compressed) bytes.
        let sum = Checksum::parse(d)
            .map_err(|why| (ErrorKind::Field, format!("{what} field \"digest\": {why}")))?;
        checks.push(Check::Stored(sum));
    }
    let (codec, decoded_len) = match c.encoding.as_str() {
        "zstd" => {
            let Some(n) = c.uncompressed_length else {
                return Err((
                    ErrorKind::Field,
                    format!("{what}: encoding \"zstd\" requires \"uncompressed_length\""),
                ));
            };
            (Codec::Zstd { frames: None }, n)
        }
        // Raw, or an encoding only this tensor's description rejects.
        _ => {
            if c.encoding == "raw"
                && let Some(n) = c.uncompressed_length
                && n != c.length
            {
                return Err((
                    ErrorKind::Size,
                    format!(
                        "{what}: raw, but \"uncompressed_length\" {n} differs from \"length\" {}",
                        c.length
                    ),
                ));
            }
            (Codec::Raw, c.length)
        }
    };
    Ok(Placed {
        codec,
        decoded_len,
        checks,
    })
}

/// The element type a component exposes: its logical type when it has a
/// known one (or, unknown, one stored 1:1 in its dtype), else its dtype.
fn element(c: &RawComponent) -> std::result::Result<DType, Problem> {
    if c.encoding != "raw" && c.encoding != "zstd" {
        return Err(Problem::Tensor(format!(
            "component {:?}: unsupported encoding {:?}",
            c.role, c.encoding
        )));
    }
    let Some(storage) = storage_dtype(&c.dtype) else {
        return Err(Problem::Tensor(format!(
            "component {:?}: unsupported dtype {:?}",
            c.role, c.dtype
        )));
    };
    match c.logical.as_deref() {
        None => Ok(storage),
        Some(t) if t == c.dtype => Ok(storage),
        Some(t) => match logical_dtype(t) {
            Some((logical, needs)) if needs == storage => Ok(logical),
            Some((_, needs)) => Err(Problem::Tensor(format!(
                "component {:?}: type {t:?} must be stored as {:?}, not {:?}",
                c.role,
                v1_name(needs),
                c.dtype
            ))),
            None => Err(Problem::Tensor(format!(
                "component {:?}: unsupported type {t:?}",
                c.role
            ))),
        },
    }
}

/// The spec's name of one of its storage dtypes.
fn v1_name(d: DType) -> &'static str {
    match d {
        DType::Float64 => "f64",
        DType::Float32 => "f32",
        DType::Float16 => "f16",
        DType::BFloat16 => "bf16",
        DType::Int64 => "i64",
        DType::Int32 => "i32",
        DType::Int16 => "i16",
        DType::Int8 => "i8",
        DType::Uint64 => "u64",
        DType::Uint32 => "u32",
        DType::Uint16 => "u16",
        DType::Uint8 => "u8",
        _ => "bool",
    }
}

/// Elements of `dtype` in a component of `decoded` bytes, which must be a
/// whole number of them.
fn count(c: &RawComponent, dtype: DType, decoded: u64) -> std::result::Result<u64, Problem> {
    let size = dtype.size();
    if !decoded.is_multiple_of(size) {
        return Err(size_err(format!(
            "component {:?} holds {decoded} bytes, not a whole number of {}-byte {dtype} elements",
            c.role, size
        )));
    }
    Ok(decoded / size)
}

fn component<'a>(
    o: &'a RawObject,
    role: &str,
) -> std::result::Result<(usize, &'a RawComponent), Problem> {
    o.components
        .iter()
        .enumerate()
        .find(|(_, c)| c.role == role)
        .ok_or_else(|| {
            Problem::Tensor(format!(
                "format {:?} needs a component {role:?}, which is missing",
                o.format
            ))
        })
}

/// A component stored as `u64` indices (the spec's rule for every index
/// component of a sparse format).
fn index_component(c: &RawComponent) -> std::result::Result<(), Problem> {
    if c.dtype != "u64" || c.logical.as_deref().is_some_and(|t| t != "u64") {
        return Err(Problem::Tensor(format!(
            "index component {:?} is {:?}; the spec requires \"u64\"",
            c.role, c.dtype
        )));
    }
    Ok(())
}

/// Only the components `roles` may be present.
fn only(o: &RawObject, roles: &[&str]) -> std::result::Result<(), Problem> {
    match o
        .components
        .iter()
        .find(|c| !roles.contains(&c.role.as_str()))
    {
        Some(c) => Err(Problem::Tensor(format!(
            "format {:?} has no component {:?}",
            o.format, c.role
        ))),
        None => Ok(()),
    }
}

/// A part reading component `ci` (its index is kept in `blob` until the
/// blob is made).
fn part(
    name: &str,
    dtype: DType,
    shape: Vec<u64>,
    ci: usize,
) -> std::result::Result<Part, Problem> {
    let numel = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|n| dtype.nbytes(n))
        .ok_or_else(|| size_err(format!("part {name:?}: shape {shape:?} overflows 64 bits")))?;
    Ok(Part {
        name: name.to_string(),
        dtype,
        shape,
        nbytes: numel,
        blob: ci,
        map: PartMap::Contiguous { start: 0 },
        order: Endian::Little,
        meta: crate::catalog::Meta::default(),
    })
}

/// Whether a component's role can name a file in the tensor's directory.
fn file_name_ok(role: &str) -> bool {
    !role.is_empty() && role != "." && role != ".." && !role.contains(['/', '\0'])
}

fn describe(o: &RawObject, placed: &[Placed]) -> std::result::Result<Vec<Part>, Problem> {
    match o.format.as_str() {
        "dense" => {
            only(o, &["data"])?;
            let (ci, c) = component(o, "data")?;
            let dtype = element(c)?;
            let numel = o
                .shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| {
                    size_err(format!("shape {:?} has more than 2^64 elements", o.shape))
                })?;
            let nbytes = dtype.nbytes(numel).ok_or_else(|| {
                size_err(format!(
                    "shape {:?} of {dtype} is more than 2^64 bytes",
                    o.shape
                ))
            })?;
            let decoded = placed[ci].decoded_len;
            if decoded != nbytes {
                let what = if placed[ci].codec == Codec::Raw {
                    "\"length\""
                } else {
                    "\"uncompressed_length\""
                };
                return Err(size_err(format!(
                    "component \"data\": {what} is {decoded} bytes but shape {:?} of {dtype} needs {nbytes}",
                    o.shape
                )));
            }
            Ok(vec![part("", dtype, o.shape.clone(), ci)?])
        }
        "sparse_csr" => {
            only(o, &["values", "indices", "indptr"])?;
            let (vi, v) = component(o, "values")?;
            let (ii, i) = component(o, "indices")?;
            let (pi, p) = component(o, "indptr")?;
            index_component(i)?;
            index_component(p)?;
            let dtype = element(v)?;
            element(i)?;
            element(p)?;
            let [rows, _] = o.shape[..] else {
                return Err(Problem::Tensor(format!(
                    "sparse_csr needs a 2-D shape, not {:?}",
                    o.shape
                )));
            };
            let nnz = count(v, dtype, placed[vi].decoded_len)?;
            let ni = count(i, DType::Uint64, placed[ii].decoded_len)?;
            let np = count(p, DType::Uint64, placed[pi].decoded_len)?;
            if ni != nnz {
                return Err(size_err(format!(
                    "sparse_csr: {nnz} values but {ni} indices"
                )));
            }
            if Some(np) != rows.checked_add(1) {
                return Err(size_err(format!(
                    "sparse_csr: indptr has {np} entries, shape {:?} needs {rows} + 1",
                    o.shape
                )));
            }
            Ok(vec![
                with_meta(part("values", dtype, vec![nnz], vi)?, v),
                with_meta(part("indices", DType::Uint64, vec![nnz], ii)?, i),
                with_meta(part("indptr", DType::Uint64, vec![np], pi)?, p),
            ])
        }
        "sparse_coo" => {
            only(o, &["values", "coords"])?;
            let (vi, v) = component(o, "values")?;
            let (ki, k) = component(o, "coords")?;
            index_component(k)?;
            let dtype = element(v)?;
            element(k)?;
            let nnz = count(v, dtype, placed[vi].decoded_len)?;
            let nk = count(k, DType::Uint64, placed[ki].decoded_len)?;
            let ndim = o.shape.len() as u64;
            if Some(nk) != ndim.checked_mul(nnz) {
                return Err(size_err(format!(
                    "sparse_coo: coords has {nk} entries, {ndim} dimensions x {nnz} values need {}",
                    ndim.saturating_mul(nnz)
                )));
            }
            Ok(vec![
                with_meta(part("values", dtype, vec![nnz], vi)?, v),
                with_meta(part("coords", DType::Uint64, vec![ndim, nnz], ki)?, k),
            ])
        }
        // Components whose meaning lies in the object's attributes: each is
        // exposed as the flat array it is.
        "quantized_group" => {
            if o.components.is_empty() {
                return Err(Problem::Tensor("quantized_group has no components".into()));
            }
            let mut parts = Vec::with_capacity(o.components.len());
            for (ci, c) in o.components.iter().enumerate() {
                if !file_name_ok(&c.role) {
                    return Err(Problem::Tensor(format!(
                        "component name {:?} cannot name a file",
                        c.role
                    )));
                }
                let dtype = element(c)?;
                let n = count(c, dtype, placed[ci].decoded_len)?;
                parts.push(with_meta(part(&c.role, dtype, vec![n], ci)?, c));
            }
            Ok(parts)
        }
        other => Err(Problem::Tensor(format!("unsupported format {other:?}"))),
    }
}

/// A part's sidecar shows its component's fields under `component` (its
/// own `dtype` and `encoding` are the exposed file's).
fn with_meta(mut p: Part, c: &RawComponent) -> Part {
    p.meta.insert("component", Json::Object(component_meta(c)));
    p
}

/// A component's fields as written, for the sidecar.
fn component_meta(c: &RawComponent) -> JsonMap {
    let mut m = JsonMap::new();
    m.insert("dtype".into(), c.dtype.clone().into());
    m.insert(
        "type".into(),
        c.logical.clone().map_or(Json::Null, Json::from),
    );
    m.insert("offset".into(), c.offset.into());
    m.insert("length".into(), c.length.into());
    m.insert(
        "uncompressed_length".into(),
        c.uncompressed_length.map_or(Json::Null, Json::from),
    );
    m.insert("encoding".into(), c.encoding.clone().into());
    m.insert(
        "digest".into(),
        c.digest.clone().map_or(Json::Null, Json::from),
    );
    if !c.extra.is_empty() {
        m.insert(
            "extra".into(),
            Json::Object(cbor_json::map_to_json(&c.extra)),
        );
    }
    m
}

fn map_json(pairs: &[(Value, Value)]) -> Json {
    Json::Object(cbor_json::map_to_json(pairs))
}

fn tensor_of(o: &RawObject, parts: std::result::Result<Vec<Part>, String>) -> Tensor {
    // The element type users know the object by: its data or values
    // component's logical type, else its dtype.
    let primary = match o.format.as_str() {
        "dense" => o.components.iter().find(|c| c.role == "data"),
        "sparse_csr" | "sparse_coo" => o.components.iter().find(|c| c.role == "values"),
        _ => None,
    }
    .or(o.components.first());
    let dtype = primary
        .map(|c| c.logical.clone().unwrap_or_else(|| c.dtype.clone()))
        .unwrap_or_default();
    let mut encodings: Vec<&str> = o.components.iter().map(|c| c.encoding.as_str()).collect();
    encodings.dedup();
    let encoding = match encodings[..] {
        [] => "raw".to_string(),
        [one] => one.to_string(),
        _ => "mixed".to_string(),
    };
    // The sidecar's `layout` is the object's `format`.
    let mut meta = JsonMap::new();
    let mut comps = JsonMap::new();
    for c in &o.components {
        comps.insert(c.role.clone(), Json::Object(component_meta(c)));
    }
    meta.insert("components".into(), Json::Object(comps));
    meta.insert(
        "attributes".into(),
        o.attributes.as_deref().map_or(Json::Null, map_json),
    );
    if !o.extra.is_empty() {
        meta.insert("extra".into(), map_json(&o.extra));
    }
    Tensor {
        name: o.name.clone(),
        dtype,
        shape: o.shape.clone(),
        layout: o.format.clone(),
        encoding,
        directory: o.format != "dense",
        parts,
        meta: meta.into(),
    }
}
