//! File bytes -> index: finds the CBOR array at the end of the file, decodes
//! it within fixed limits, and turns each map into typed [`RawEntry`] fields.
//! Cross-tensor rules (placement, overlap, sizes) live in `catalog.rs`.

use std::collections::HashSet;

use ciborium::value::{Integer, Value};

use super::cbor_json::key_to_string;

use super::error::{Error, ErrorKind, Result};

pub const MAGIC: &[u8; 8] = b"ZTEN0001";
pub const ALIGNMENT: u64 = 64;
/// Nesting depth allowed in the index; real files need 3 or 4 levels.
const MAX_CBOR_DEPTH: usize = 64;

/// The spec's fields; everything else in a map is a custom field.
const KNOWN_KEYS: [&str; 9] = [
    "name",
    "offset",
    "size",
    "dtype",
    "shape",
    "encoding",
    "layout",
    "data_endianness",
    "checksum",
];

/// One tensor's metadata as written, typed but not yet checked against the
/// rest of the file.
#[derive(Debug, Clone)]
pub struct RawEntry {
    pub name: String,
    pub offset: u64,
    pub size: u64,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub encoding: String,
    /// `"dense"` when absent.
    pub layout: String,
    /// `None` when absent (which means little).
    pub data_endianness: Option<String>,
    pub checksum: Option<String>,
    /// Every other key, in file order, as written.
    pub custom: Vec<(Value, Value)>,
}

impl RawEntry {
    /// A custom field with a text key.
    pub fn custom(&self, key: &str) -> Option<&Value> {
        self.custom
            .iter()
            .find(|(k, _)| k.as_text() == Some(key))
            .map(|(_, v)| v)
    }
}

/// The decoded index and where the data region ends.
#[derive(Debug)]
pub struct Index {
    pub entries: Vec<RawEntry>,
    /// First byte of the CBOR index: blobs must end at or before it.
    pub data_end: u64,
}

/// Reads the magic, the trailing size and the CBOR array of `bytes`.
pub fn parse(bytes: &[u8], file: &str) -> Result<Index> {
    let err = |kind, msg: String| Error::new(kind, file, None, msg);
    let len = bytes.len() as u64;
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        return Err(err(
            ErrorKind::NotZtensor,
            "not a zTensor v0.1 file (magic \"ZTEN0001\" missing)".into(),
        ));
    }
    if len < 16 {
        return Err(err(
            ErrorKind::Index,
            format!("file is {len} bytes, too short for the trailing index size"),
        ));
    }
    let mut size_bytes = [0u8; 8];
    size_bytes.copy_from_slice(&bytes[bytes.len() - 8..]);
    let index_size = u64::from_le_bytes(size_bytes);
    let room = len - 16;
    if index_size > room {
        return Err(err(
            ErrorKind::Index,
            format!(
                "index size {index_size} is larger than the file allows ({room} bytes between the magic and the size field)"
            ),
        ));
    }
    if index_size == 0 {
        return Err(err(
            ErrorKind::Index,
            "index size is 0; an empty index is the 1-byte CBOR array 0x80".into(),
        ));
    }
    let data_end = len - 8 - index_size;
    let cbor = &bytes[data_end as usize..bytes.len() - 8];
    let mut cursor = std::io::Cursor::new(cbor);
    // The usual case, an array: decode it entry by entry, so no tree of the
    // whole index is ever built (a 100 000-tensor index would be ~10^6 nodes).
    if cbor.first().is_some_and(|b| b >> 5 == 4) {
        let list: Entries =
            ciborium::de::from_reader_with_recursion_limit(&mut cursor, MAX_CBOR_DEPTH).map_err(
                |e| {
                    err(
                        ErrorKind::Index,
                        format!("index is not valid CBOR: {}", cbor_error(&e)),
                    )
                },
            )?;
        check_trailing(cursor.position(), index_size, file)?;
        if let Some(mut e) = list.first_err {
            e.file = file.to_string();
            return Err(e);
        }
        return Ok(Index {
            entries: list.entries,
            data_end,
        });
    }
    let value: Value = ciborium::de::from_reader_with_recursion_limit(&mut cursor, MAX_CBOR_DEPTH)
        .map_err(|e| {
            err(
                ErrorKind::Index,
                format!("index is not valid CBOR: {}", cbor_error(&e)),
            )
        })?;
    check_trailing(cursor.position(), index_size, file)?;
    let Value::Array(items) = value else {
        return Err(err(
            ErrorKind::Index,
            format!(
                "index is a CBOR {}, expected an array of maps",
                kind_name(&value)
            ),
        ));
    };
    let mut entries = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        entries.push(parse_entry(item, i, file)?);
    }
    Ok(Index { entries, data_end })
}

fn check_trailing(used: u64, index_size: u64, file: &str) -> Result<()> {
    if used == index_size {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Index,
        file,
        None,
        format!(
            "{} trailing bytes after the CBOR index array (index size says {index_size}, array ends after {used})",
            index_size - used
        ),
    ))
}

/// The index array, turned into entries as it is read. The first bad entry
/// is kept; the rest of the array is still read so CBOR errors show first.
struct Entries {
    entries: Vec<RawEntry>,
    first_err: Option<Error>,
}

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of tensor maps")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut out = Entries {
                    entries: Vec::new(),
                    first_err: None,
                };
                let mut i = 0;
                while out.first_err.is_none() {
                    let Some(item) = seq.next_element::<Value>()? else {
                        return Ok(out);
                    };
                    match parse_entry(item, i, "") {
                        Ok(e) => out.entries.push(e),
                        Err(e) => out.first_err = Some(e),
                    }
                    i += 1;
                }
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(out)
            }
        }
        d.deserialize_seq(Visit)
    }
}

fn cbor_error<E: std::fmt::Debug>(e: &ciborium::de::Error<E>) -> String {
    match e {
        ciborium::de::Error::Io(_) => "unexpected end of data".to_string(),
        ciborium::de::Error::Syntax(at) => format!("syntax error at byte {at}"),
        ciborium::de::Error::Semantic(at, msg) => match at {
            Some(at) => format!("{msg} at byte {at}"),
            None => msg.clone(),
        },
        ciborium::de::Error::RecursionLimitExceeded => {
            format!("nested deeper than {MAX_CBOR_DEPTH} levels")
        }
    }
}

pub fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Integer(_) => "integer",
        Value::Bytes(_) => "byte string",
        Value::Float(_) => "float",
        Value::Text(_) => "text string",
        Value::Bool(_) => "bool",
        Value::Null => "null",
        Value::Tag(..) => "tag",
        Value::Array(_) => "array",
        Value::Map(_) => "map",
        _ => "unknown value",
    }
}

/// Checks that no map inside `v` has two keys that read the same in JSON
/// (one would silently hide the other in a sidecar); the repeated key if so.
fn unique_keys(v: &Value) -> std::result::Result<(), String> {
    match v {
        Value::Map(pairs) => {
            let mut seen = HashSet::new();
            for (k, inner) in pairs {
                let key = key_to_string(k);
                unique_keys(inner)?;
                if !seen.insert(key.clone()) {
                    return Err(key);
                }
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(unique_keys),
        Value::Tag(_, inner) => unique_keys(inner),
        _ => Ok(()),
    }
}

fn parse_entry(item: Value, i: usize, file: &str) -> Result<RawEntry> {
    let Value::Map(pairs) = item else {
        return Err(Error::new(
            ErrorKind::Index,
            file,
            None,
            format!(
                "index entry {i} is a CBOR {}, expected a map",
                kind_name(&item)
            ),
        ));
    };
    // The name first, so every later error can name the tensor.
    let label = match pairs.iter().find(|(k, _)| k.as_text() == Some("name")) {
        Some((_, Value::Text(t))) => t.clone(),
        _ => format!("#{i}"),
    };
    let ferr = |msg: String| Error::new(ErrorKind::Field, file, Some(&label), msg);

    let mut known: [Option<Value>; 9] = Default::default();
    let mut custom = Vec::new();
    // Keys as they will read in JSON sidecars, which must not collide; a
    // set, not a scan of `custom`: an entry may have millions of keys.
    let mut custom_keys = HashSet::new();
    for (k, v) in pairs {
        match k
            .as_text()
            .and_then(|t| KNOWN_KEYS.iter().position(|x| *x == t))
        {
            Some(slot) => {
                if known[slot].is_some() {
                    return Err(ferr(format!(
                        "field \"{}\" appears twice",
                        KNOWN_KEYS[slot]
                    )));
                }
                known[slot] = Some(v);
            }
            None => {
                let key = key_to_string(&k);
                if let Err(inner) = unique_keys(&v) {
                    return Err(ferr(format!(
                        "field \"{key}\": key \"{inner}\" appears twice in a map"
                    )));
                }
                if !custom_keys.insert(key) {
                    return Err(ferr(format!(
                        "field \"{}\" appears twice",
                        key_to_string(&k)
                    )));
                }
                custom.push((k, v))
            }
        }
    }
    let [
        name,
        offset,
        size,
        dtype,
        shape,
        encoding,
        layout,
        endian,
        checksum,
    ] = known;

    let text = |v: Option<Value>, key: &str, required: bool| -> Result<Option<String>> {
        match v {
            None if required => Err(ferr(format!("required field \"{key}\" is missing"))),
            None => Ok(None),
            Some(Value::Text(t)) => Ok(Some(t)),
            Some(other) => Err(ferr(format!(
                "field \"{key}\" is a CBOR {}, expected a text string",
                kind_name(&other)
            ))),
        }
    };
    let uint = |v: Option<Value>, key: &str| -> Result<u64> {
        match v {
            None => Err(ferr(format!("required field \"{key}\" is missing"))),
            Some(v) => as_u64(&v).map_err(|why| ferr(format!("field \"{key}\" {why}"))),
        }
    };

    let name = text(name, "name", true)?.unwrap_or_default();
    if name.is_empty() {
        return Err(ferr("field \"name\" is empty".into()));
    }
    if name.contains('\0') {
        return Err(ferr("field \"name\" contains a NUL byte".into()));
    }
    let offset = uint(offset, "offset")?;
    let size = uint(size, "size")?;
    let dtype = text(dtype, "dtype", true)?.unwrap_or_default();
    let encoding = text(encoding, "encoding", true)?.unwrap_or_default();
    let layout = text(layout, "layout", false)?.unwrap_or_else(|| "dense".to_string());
    let data_endianness = text(endian, "data_endianness", false)?;
    let checksum = text(checksum, "checksum", false)?;
    let shape = match shape {
        None => return Err(ferr("required field \"shape\" is missing".into())),
        Some(Value::Array(dims)) => {
            let mut out = Vec::with_capacity(dims.len());
            for (d, v) in dims.iter().enumerate() {
                out.push(as_u64(v).map_err(|why| ferr(format!("shape[{d}] {why}")))?);
            }
            out
        }
        Some(other) => {
            return Err(ferr(format!(
                "field \"shape\" is a CBOR {}, expected an array",
                kind_name(&other)
            )));
        }
    };
    Ok(RawEntry {
        name,
        offset,
        size,
        dtype,
        shape,
        encoding,
        layout,
        data_endianness,
        checksum,
        custom,
    })
}

/// A CBOR integer that fits u64, or why not.
pub fn as_u64(v: &Value) -> std::result::Result<u64, String> {
    match v {
        Value::Integer(i) => {
            let n = i128::from(*i);
            if n < 0 {
                Err(format!("is negative ({n})"))
            } else {
                u64::try_from(n).map_err(|_| format!("is too large ({n})"))
            }
        }
        other => Err(format!(
            "is a CBOR {}, expected an unsigned integer",
            kind_name(other)
        )),
    }
}

/// Convenience for writers and tests.
pub fn int(v: u64) -> Value {
    Value::Integer(Integer::from(v))
}
