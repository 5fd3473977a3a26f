//! safetensors: a little-endian u64 header length, a JSON header mapping
//! each tensor name to `{dtype, shape, data_offsets: [begin, end]}` (offsets
//! into the data after the header), then the data.
//!
//! Read here rather than through `ztensor-compat` (which reads the other
//! foreign formats) because the crate refuses the whole file when one
//! tensor has a dtype it has no projection for (`F6_E2M3`, or a type added
//! to safetensors later); the `safetensors` crate's closed `Dtype` enum
//! refuses such a header too. Here that tensor is listed with the reason
//! and the rest served. The header is JSON read with `serde_json`; the
//! rules are the crate's: at most 100 MB of header, ranges that tile the
//! data exactly (sorted, no gap, no overlap, ending at the end of the
//! file), a known dtype's range the size its shape implies, no name twice.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};

use crate::catalog::{Blob, Catalog, Check, DType, Endian, Json, JsonMap, Part, Tensor};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::{Limits, Opened};
use crate::size;
use crate::source::MappedFile;

/// Largest header read (the reference implementation's cap).
pub const MAX_HEADER: u64 = 100 << 20;

/// safetensors: a little-endian u64 header length, then a JSON object. A
/// length that runs past the end of the file, but within the largest header
/// read, is taken as a cut safetensors file, so that the refusal says so.
pub fn looks_like(bytes: &[u8]) -> bool {
    let Some(head) = bytes.get(..8) else {
        return false;
    };
    let n = u64::from_le_bytes(head.try_into().unwrap_or_default());
    let within = n <= bytes.len() as u64 - 8 || n <= MAX_HEADER;
    n >= 2 && within && bytes.get(8) == Some(&b'{')
}

/// Reads a safetensors file into the catalog.
pub fn open(src: MappedFile, limits: Limits) -> Result<Opened> {
    let catalog = read(&src, limits)?;
    Ok(Opened {
        catalog,
        sources: vec![Some(src)],
    })
}

/// Our element type for a safetensors dtype, and whether its elements
/// are packed two to a byte.
fn element_type(dtype: &str) -> Option<(DType, bool)> {
    Some(match dtype {
        "F64" => (DType::Float64, false),
        "F32" => (DType::Float32, false),
        "F16" => (DType::Float16, false),
        "BF16" => (DType::BFloat16, false),
        "I64" => (DType::Int64, false),
        "I32" => (DType::Int32, false),
        "I16" => (DType::Int16, false),
        "I8" => (DType::Int8, false),
        "U64" => (DType::Uint64, false),
        "U32" => (DType::Uint32, false),
        "U16" => (DType::Uint16, false),
        "U8" => (DType::Uint8, false),
        "BOOL" => (DType::Bool, false),
        "F8_E4M3" => (DType::Float8E4M3Fn, false),
        "F8_E5M2" => (DType::Float8E5M2, false),
        "F8_E8M0" => (DType::Float8E8M0Fnu, false),
        "C64" => (DType::Complex64, false),
        "F4" | "F4_E2M1" => (DType::Float4E2M1FnX2, true),
        _ => return None,
    })
}

/// The header's entries in file order, duplicates kept (a JSON parser
/// would silently keep one of two same-named tensors), each charged as it
/// is parsed with what it will take in memory once laid out
/// ([`crate::catalog::cost`]): parsing stops at the first entry past
/// `--index-memory`, before the rest of the header is decoded.
struct Entries(Vec<(String, Json)>);

/// Parses the header's entries within `limit` bytes of memory; `over`
/// says why parsing stopped when it was for memory.
struct Charged<'a> {
    limit: u64,
    over: &'a std::cell::Cell<Option<(u64, usize)>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for Charged<'_> {
    type Value = Entries;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Entries, D::Error> {
        struct V<'a>(Charged<'a>);
        impl<'de> Visitor<'de> for V<'_> {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries, A::Error> {
                use crate::catalog::cost;
                let mut out = Vec::new();
                let mut used = 0u64;
                while let Some((k, v)) = m.next_entry::<String, Json>()? {
                    // The entry as parsed, the tensor it becomes, and its
                    // slot in the list.
                    used = used
                        .saturating_add(cost::name_cost(&k))
                        .saturating_add(cost::json_cost(&v))
                        .saturating_add(cost::TENSOR_COST)
                        .saturating_add(64);
                    if used > self.0.limit {
                        self.0.over.set(Some((used, out.len() + 1)));
                        return Err(serde::de::Error::custom("over --index-memory"));
                    }
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V(self))
    }
}

fn read(src: &MappedFile, limits: Limits) -> Result<Catalog> {
    let label = src.label().to_string();
    let (data_start, Entries(entries)) = header(src, limits)?;
    let data_len = src.len() - data_start;
    let mut catalog = Catalog::of_file("safetensors", &label, src.path());
    let mut names = std::collections::HashSet::new();
    // (begin, end, tensor) in data-section offsets, for the tiling check.
    let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
    for (name, entry) in entries {
        if !names.insert(name.clone()) {
            return Err(Error::new(
                ErrorKind::Duplicate,
                &label,
                Some(&name),
                "named twice in the header",
            ));
        }
        if name == "__metadata__" {
            metadata(&mut catalog, entry)?;
            continue;
        }
        let at = Data {
            start: data_start,
            len: data_len,
        };
        let (begin, end) = add_tensor(&mut catalog, name, entry, at)?;
        ranges.push((begin, end, catalog.tensors.len() - 1));
    }
    check_tiling(&catalog, &mut ranges, data_len)?;
    Ok(catalog)
}

/// The data section: where it starts in the file, and its length.
#[derive(Clone, Copy)]
struct Data {
    start: u64,
    len: u64,
}

/// The header's length, checked against the file and the limits, and its
/// entries, charged to `--index-memory` as they are parsed: where the
/// data starts, and the entries.
fn header(src: &MappedFile, limits: Limits) -> Result<(u64, Entries)> {
    let bad = |msg: String| Error::new(ErrorKind::Index, src.label(), None, msg);
    let bytes = src.bytes();
    let file_len = src.len();
    let header_len = bytes
        .get(..8)
        .and_then(|h| h.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| bad("shorter than the 8-byte header length".into()))?;
    if header_len > file_len.saturating_sub(8) {
        return Err(bad(format!(
            "truncated safetensors file: its header length {header_len} reaches past the end \
             of the file ({file_len} bytes)"
        )));
    }
    if header_len > MAX_HEADER {
        return Err(bad(format!(
            "header length {header_len} is over the {MAX_HEADER}-byte limit of safetensors"
        )));
    }
    if header_len > limits.index_memory {
        return Err(bad(format!(
            "header length {header_len} is over the {} allowed (--index-memory)",
            size::bytes(limits.index_memory)
        )));
    }
    let data_start = 8 + header_len;
    let header = &bytes[8..data_start as usize];
    let over = std::cell::Cell::new(None);
    let parsed = {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_slice(header);
        let seed = Charged {
            limit: limits.index_memory,
            over: &over,
        };
        seed.deserialize(&mut de).and_then(|e| de.end().map(|()| e))
    };
    let entries = parsed.map_err(|e| match over.get() {
        Some((used, n)) => bad(format!(
            "its header's first {n} entries would already take about {} in memory (catalog, \
             tree and views), more than the {} allowed (--index-memory)",
            size::bytes(used),
            size::bytes(limits.index_memory)
        )),
        None => bad(format!("header is not a JSON object: {e}")),
    })?;
    Ok((data_start, entries))
}

/// `__metadata__`: string values only, kept as the file's attributes.
fn metadata(catalog: &mut Catalog, entry: Json) -> Result<()> {
    let bad = |msg: String| Error::new(ErrorKind::Index, &catalog.label, None, msg);
    let Json::Object(meta) = entry else {
        return Err(bad("__metadata__ is not an object".into()));
    };
    if let Some((k, _)) = meta.iter().find(|(_, v)| !v.is_string()) {
        return Err(bad(format!("__metadata__[{k:?}] is not a string")));
    }
    catalog.attributes.extend(meta);
    Ok(())
}

/// Adds the tensor of header entry `entry` to `catalog` (with its blob,
/// when its dtype has an element type here): its range in the data.
fn add_tensor(catalog: &mut Catalog, name: String, entry: Json, at: Data) -> Result<(u64, u64)> {
    let label = catalog.label.clone();
    let bad_tensor = |kind, msg: String| Error::new(kind, &label, Some(&name), msg);
    let field = |msg: &str| bad_tensor(ErrorKind::Field, msg.to_string());
    let Json::Object(fields) = entry else {
        return Err(field("its entry is not an object"));
    };
    let dtype = fields
        .get("dtype")
        .and_then(Json::as_str)
        .ok_or_else(|| field("no dtype string"))?
        .to_string();
    let shape: Vec<u64> = fields
        .get("shape")
        .and_then(Json::as_array)
        .ok_or_else(|| field("no shape array"))?
        .iter()
        .map(Json::as_u64)
        .collect::<Option<_>>()
        .ok_or_else(|| field("a dimension of its shape is not a non-negative integer"))?;
    let (begin, end) = match fields
        .get("data_offsets")
        .and_then(Json::as_array)
        .map(|a| a.iter().map(Json::as_u64).collect::<Vec<_>>())
        .as_deref()
    {
        Some([Some(b), Some(e)]) if b <= e && *e <= at.len => (*b, *e),
        _ => {
            return Err(bad_tensor(
                ErrorKind::Placement,
                format!(
                    "data_offsets {} are not [begin, end] within the {} bytes of data",
                    fields.get("data_offsets").unwrap_or(&Json::Null),
                    at.len
                ),
            ));
        }
    };
    let nbytes = end - begin;
    let mut meta = JsonMap::new();
    meta.insert("offset".into(), (at.start + begin).into());
    meta.insert("size".into(), nbytes.into());
    let parts = match element_type(&dtype) {
        None => Err(format!(
            "safetensors dtype {dtype:?} has no element type here: listed, not served"
        )),
        Some((d, packed)) => {
            let elems = shape
                .iter()
                .try_fold(1u64, |a, &x| a.checked_mul(x))
                .ok_or_else(|| field("its shape's element count overflows"))?;
            let want = if packed {
                elems.div_ceil(2)
            } else {
                elems
                    .checked_mul(d.size())
                    .ok_or_else(|| field("its byte size overflows"))?
            };
            if nbytes != want {
                return Err(bad_tensor(
                    ErrorKind::Size,
                    format!("holds {nbytes} bytes but {dtype} of shape {shape:?} is {want}"),
                ));
            }
            let (pshape, odd) = crate::formats::common::packed_shape(d, shape.clone(), nbytes);
            let mut checks = Vec::new();
            if d == DType::Bool {
                checks.push(Check::BoolBytes);
            }
            if odd {
                checks.push(Check::ZeroLastNibble);
            }
            let label = format!("tensor {name:?}");
            catalog
                .blobs
                .push(Blob::raw(0, at.start + begin, nbytes, checks, label));
            let blob = catalog.blobs.len() - 1;
            Ok(vec![Part::dense(d, pshape, nbytes, blob, Endian::Little)])
        }
    };
    catalog
        .tensors
        .push(Tensor::dense(name, dtype, shape, "raw", parts, meta.into()));
    Ok((begin, end))
}

/// The ranges tile the data exactly: no byte is two tensors', none is no
/// tensor's, whatever a JSON parser would have made of the header.
fn check_tiling(catalog: &Catalog, ranges: &mut [(u64, u64, usize)], data_len: u64) -> Result<()> {
    ranges.sort_unstable();
    let mut cursor = 0u64;
    for &(begin, end, t) in ranges.iter() {
        if begin != cursor {
            return Err(Error::new(
                ErrorKind::Placement,
                &catalog.label,
                Some(&catalog.tensors[t].name),
                if begin < cursor {
                    format!("its bytes [{begin}, {end}) overlap another tensor's (up to {cursor})")
                } else {
                    format!("the data is not tiled exactly: a gap of [{cursor}, {begin}) before it")
                },
            ));
        }
        cursor = end;
    }
    if cursor != data_len {
        return Err(Error::new(
            ErrorKind::Index,
            &catalog.label,
            None,
            format!("the data is {data_len} bytes but the tensors cover {cursor}"),
        ));
    }
    Ok(())
}
