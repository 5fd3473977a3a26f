//! File bytes -> manifest: checks the magic at both ends, finds the CBOR
//! manifest before the footer, bounds what decoding it may cost, and decodes
//! it object by object into typed [`RawObject`]s. Placement, sizes and
//! layouts are checked in `project.rs`.
//!
//! Layout (spec 1.2, `website/docs/spec.md` of pie-project/ztensor):
//! `"ZTEN1000" | blobs (64-aligned) | CBOR manifest | u64 LE manifest size |
//! "ZTEN1000"`.

pub use crate::formats::cbor::{as_u64, kind_name};
use crate::formats::cbor::{cbor_error, header, header_kind};
use std::collections::HashSet;

use ciborium::value::Value;

use crate::error::{Error, ErrorKind, Result};
use crate::formats::cbor_json::key_to_string;

pub const MAGIC: &[u8; 8] = b"ZTEN1000";
/// Every component starts at a multiple of this.
pub const ALIGNMENT: u64 = 64;
/// Header magic + manifest size + footer magic.
const FIXED: u64 = 24;
/// Nesting allowed in the manifest; real files need 5 levels (root,
/// objects, object, components, component) plus what attributes hold.
pub const MAX_CBOR_DEPTH: usize = crate::formats::cbor::MAX_DEPTH;

/// Memory one decoded CBOR item is reckoned to take.
const ITEM_COST: u64 = 32;
/// Memory of one map beyond its items (an object or a component becomes a
/// catalog entry, a tree node, a sidecar): counted for every map.
const MAP_COST: u64 = 1024;

/// One component as written, typed but not yet checked against the file.
#[derive(Debug, Clone)]
pub struct RawComponent {
    /// Its key in `components` (`"data"`, `"values"`, ...).
    pub role: String,
    pub dtype: String,
    /// `type`, the logical type; `None` when absent or null.
    pub logical: Option<String>,
    pub offset: u64,
    pub length: u64,
    pub uncompressed_length: Option<u64>,
    /// `"raw"` when absent.
    pub encoding: String,
    pub digest: Option<String>,
    /// Fields the spec does not name, in file order.
    pub extra: Vec<(Value, Value)>,
}

/// One object (tensor) as written.
#[derive(Debug, Clone)]
pub struct RawObject {
    pub name: String,
    pub shape: Vec<u64>,
    pub format: String,
    pub attributes: Option<Vec<(Value, Value)>>,
    /// In file order.
    pub components: Vec<RawComponent>,
    pub extra: Vec<(Value, Value)>,
}

#[derive(Debug)]
pub struct Manifest {
    pub version: String,
    pub attributes: Option<Vec<(Value, Value)>>,
    /// Root fields the spec does not name.
    pub extra: Vec<(Value, Value)>,
    pub objects: Vec<RawObject>,
    /// First byte of the manifest: blobs end at or before it.
    pub data_end: u64,
}

/// Reads the magics, the manifest size and the manifest of `bytes`. A
/// manifest that would take more than `memory_limit` bytes decoded (an
/// estimate from its CBOR headers, made before decoding) is refused.
pub fn parse(bytes: &[u8], file: &str, memory_limit: u64) -> Result<Manifest> {
    let err = |kind, msg: String| Error::new(kind, file, None, msg);
    let (data_end, size) = framing(bytes, file, memory_limit)?;
    let cbor = &bytes[data_end as usize..bytes.len() - 16];
    // RFC 8949's self-described CBOR tag (55799) may come first.
    let (cbor, tag_len) = match cbor.strip_prefix(&[0xd9, 0xd9, 0xf7]) {
        Some(rest) => (rest, 3u64),
        None => (cbor, 0),
    };
    let cost = estimate(cbor);
    if cost.memory > memory_limit {
        return Err(err(
            ErrorKind::Index,
            format!(
                "the manifest would take about {} of memory decoded ({} CBOR items), more than \
                 the {} allowed (--index-memory)",
                crate::size::bytes(cost.memory),
                cost.items,
                crate::size::bytes(memory_limit)
            ),
        ));
    }
    let mut cursor = std::io::Cursor::new(cbor);
    let cbor_err = |e: ciborium::de::Error<std::io::Error>| {
        err(
            ErrorKind::Index,
            format!("manifest is not valid CBOR: {}", cbor_error(&e)),
        )
    };
    if cbor.first().is_some_and(|b| b >> 5 == 5) {
        let root: Root =
            ciborium::de::from_reader_with_recursion_limit(&mut cursor, MAX_CBOR_DEPTH)
                .map_err(cbor_err)?;
        check_trailing(tag_len + cursor.position(), size, file)?;
        return manifest_of(root, file, data_end);
    }
    // Not a map: check it is CBOR without building it, then say what it is.
    ciborium::de::from_reader_with_recursion_limit::<serde::de::IgnoredAny, _>(
        &mut cursor,
        MAX_CBOR_DEPTH,
    )
    .map_err(cbor_err)?;
    check_trailing(tag_len + cursor.position(), size, file)?;
    Err(err(
        ErrorKind::Index,
        format!(
            "manifest is a CBOR {}, expected a map",
            header_kind(cbor.first().copied().unwrap_or(0xff))
        ),
    ))
}

/// Checks the magics at both ends and the manifest size of `bytes`: where
/// the manifest starts (blobs end there) and its size.
fn framing(bytes: &[u8], file: &str, memory_limit: u64) -> Result<(u64, u64)> {
    let err = |kind, msg: String| Error::new(kind, file, None, msg);
    let len = bytes.len() as u64;
    if !bytes.starts_with(MAGIC) {
        return Err(err(
            ErrorKind::NotZtensor,
            "not a zTensor v1 file (header magic \"ZTEN1000\" missing)".into(),
        ));
    }
    if len < FIXED {
        return Err(err(
            ErrorKind::Index,
            format!(
                "file is {len} bytes, too short for a manifest size and footer (at least {FIXED})"
            ),
        ));
    }
    let tail = &bytes[bytes.len() - 16..];
    if &tail[8..] != MAGIC {
        return Err(err(
            ErrorKind::Index,
            format!(
                "footer magic \"ZTEN1000\" missing (last 8 bytes are {}): the file is truncated or damaged",
                crate::formats::cbor_json::hex(&tail[8..])
            ),
        ));
    }
    let mut size_bytes = [0u8; 8];
    size_bytes.copy_from_slice(&tail[..8]);
    let size = u64::from_le_bytes(size_bytes);
    let room = len - FIXED;
    if size == 0 {
        return Err(err(
            ErrorKind::Index,
            "manifest size is 0; a manifest is at least a CBOR map".into(),
        ));
    }
    if size > room {
        return Err(err(
            ErrorKind::Index,
            format!(
                "manifest size {size} is larger than the file allows ({room} bytes between the header and the manifest size)"
            ),
        ));
    }
    if size > memory_limit {
        return Err(err(
            ErrorKind::Index,
            format!(
                "manifest is {size} bytes, more than the {} allowed (--index-memory)",
                crate::size::bytes(memory_limit)
            ),
        ));
    }
    Ok((len - 16 - size, size))
}

/// The manifest of a decoded root map: its version (1.x), attributes and
/// objects (`data_end`: where the manifest starts).
fn manifest_of(root: Root, file: &str, data_end: u64) -> Result<Manifest> {
    let err = |kind, msg: String| Error::new(kind, file, None, msg);
    if let Some(mut e) = root.first_err {
        e.file = file.to_string();
        return Err(e);
    }
    let version = match root.version {
        None => return Err(err(ErrorKind::Index, "manifest has no \"version\"".into())),
        Some(Value::Text(t)) => t,
        Some(other) => {
            return Err(err(
                ErrorKind::Index,
                format!(
                    "manifest \"version\" is a CBOR {}, expected a text string",
                    kind_name(&other)
                ),
            ));
        }
    };
    if version.split('.').next() != Some("1") {
        return Err(err(
            ErrorKind::NotSupported,
            format!(
                "zTensor manifest version {version:?} is not supported (this reader reads version 1.x)"
            ),
        ));
    }
    let attributes = match root.attributes {
        None | Some(Value::Null) => None,
        Some(Value::Map(pairs)) => {
            unique_keys_map(&pairs)
                .map_err(|why| err(ErrorKind::Index, format!("manifest \"attributes\": {why}")))?;
            Some(pairs)
        }
        Some(other) => {
            return Err(err(
                ErrorKind::Index,
                format!(
                    "manifest \"attributes\" is a CBOR {}, expected a map",
                    kind_name(&other)
                ),
            ));
        }
    };
    let Some(objects) = root.objects else {
        return Err(err(ErrorKind::Index, "manifest has no \"objects\"".into()));
    };
    Ok(Manifest {
        version,
        attributes,
        extra: root.extra,
        objects,
        data_end,
    })
}

fn check_trailing(used: u64, size: u64, file: &str) -> Result<()> {
    if used == size {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Index,
        file,
        None,
        format!(
            "{} trailing bytes after the CBOR manifest (manifest size says {size}, the map ends after {used})",
            size.saturating_sub(used)
        ),
    ))
}

/// What decoding a manifest would cost, from its headers.
#[derive(Debug, Default, PartialEq)]
pub struct Cost {
    pub items: u64,
    pub memory: u64,
}

/// Walks every CBOR header of `b` (the first item only), summing what its
/// decoded form takes. Malformed CBOR ends the walk: the decoder reports it.
pub fn estimate(b: &[u8]) -> Cost {
    let mut c = Cost::default();
    // Items still to read in each open container; `None`: until a break.
    let mut open: Vec<Option<u64>> = vec![Some(1)];
    let mut pos = 0usize;
    loop {
        while open.last() == Some(&Some(0)) {
            open.pop();
        }
        let Some(&top) = open.last() else {
            return c;
        };
        let Some((major, arg, n)) = header(b, pos) else {
            return c;
        };
        pos += n;
        if major == 7 && arg.is_none() {
            if top.is_some() {
                return c;
            }
            open.pop();
            continue;
        }
        if let Some(Some(left)) = open.last_mut() {
            *left -= 1;
        }
        c.items += 1;
        c.memory = c.memory.saturating_add(ITEM_COST);
        let child = match (major, arg) {
            (2 | 3, Some(len)) => {
                match usize::try_from(len).ok().and_then(|l| pos.checked_add(l)) {
                    Some(end) if end <= b.len() => {
                        c.memory = c.memory.saturating_add(len.max(32));
                        pos = end;
                    }
                    _ => return c,
                }
                continue;
            }
            (2 | 3, None) => {
                loop {
                    match header(b, pos) {
                        Some((7, None, k)) => {
                            pos += k;
                            break;
                        }
                        Some((m, Some(len), k)) if m == major => {
                            match usize::try_from(len)
                                .ok()
                                .and_then(|l| (pos + k).checked_add(l))
                            {
                                Some(end) if end <= b.len() => {
                                    c.memory = c.memory.saturating_add(len.max(32));
                                    pos = end;
                                }
                                _ => return c,
                            }
                        }
                        _ => return c,
                    }
                }
                continue;
            }
            (4, len) => len,
            (5, pairs) => {
                c.memory = c.memory.saturating_add(MAP_COST);
                match pairs.map(|p| p.checked_mul(2)) {
                    Some(None) => return c,
                    Some(Some(k)) => Some(k),
                    None => None,
                }
            }
            (6, _) => Some(1),
            _ => continue,
        };
        if open.len() > MAX_CBOR_DEPTH {
            return c;
        }
        c.memory = c.memory.saturating_add(32);
        open.push(child);
    }
}

/// The root map, read with `objects` decoded one object at a time: no tree
/// of the whole manifest is built.
struct Root {
    version: Option<Value>,
    attributes: Option<Value>,
    objects: Option<Vec<RawObject>>,
    extra: Vec<(Value, Value)>,
    /// The first problem found in the root or an object; the rest of the
    /// manifest is still read so that CBOR errors show first.
    first_err: Option<Error>,
}

fn index_err(msg: String) -> Error {
    Error::new(ErrorKind::Index, "", None, msg)
}

impl<'de> serde::Deserialize<'de> for Root {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Root;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("the manifest map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Root, A::Error> {
                let mut root = Root {
                    version: None,
                    attributes: None,
                    objects: None,
                    extra: Vec::new(),
                    first_err: None,
                };
                let mut seen = HashSet::new();
                while let Some(key) = map.next_key::<Value>()? {
                    let spelled = key_to_string(&key);
                    if !seen.insert(spelled.clone()) && root.first_err.is_none() {
                        root.first_err = Some(index_err(format!(
                            "manifest field \"{spelled}\" appears twice"
                        )));
                    }
                    match key.as_text() {
                        Some("version") => root.version = Some(map.next_value()?),
                        Some("attributes") => root.attributes = Some(map.next_value()?),
                        Some("objects") => {
                            let objects: Objects = map.next_value()?;
                            if root.first_err.is_none() {
                                root.first_err = objects.first_err;
                            }
                            root.objects = Some(objects.objects);
                        }
                        _ => {
                            let v: Value = map.next_value()?;
                            if root.first_err.is_none()
                                && let Err(why) = scalar_key(&key).and_then(|()| unique_keys(&v))
                            {
                                root.first_err =
                                    Some(index_err(format!("manifest field \"{spelled}\": {why}")));
                            }
                            root.extra.push((key, v));
                        }
                    }
                }
                Ok(root)
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The `objects` map, each object parsed as it is read.
struct Objects {
    objects: Vec<RawObject>,
    first_err: Option<Error>,
}

impl<'de> serde::Deserialize<'de> for Objects {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Objects;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of objects")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Objects, A::Error> {
                let mut out = Objects {
                    objects: Vec::new(),
                    first_err: None,
                };
                let mut names = HashSet::new();
                let mut i = 0usize;
                while out.first_err.is_none() {
                    let Some(key) = map.next_key::<Value>()? else {
                        return Ok(out);
                    };
                    let value: Value = map.next_value()?;
                    match parse_object(key, value, i) {
                        Ok(o) => {
                            if names.insert(o.name.clone()) {
                                out.objects.push(o);
                            } else {
                                out.first_err = Some(Error::new(
                                    ErrorKind::Duplicate,
                                    "",
                                    Some(&o.name),
                                    "object name appears twice in \"objects\"; names must be unique",
                                ));
                            }
                        }
                        Err(e) => out.first_err = Some(e),
                    }
                    i += 1;
                }
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(out)
            }
            // Anything else is reported by the caller as a field error.
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Objects, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(not_a_map("array"))
            }
            fn visit_str<E>(self, _: &str) -> std::result::Result<Objects, E> {
                Ok(not_a_map("text string"))
            }
            fn visit_bytes<E>(self, _: &[u8]) -> std::result::Result<Objects, E> {
                Ok(not_a_map("byte string"))
            }
            fn visit_u64<E>(self, _: u64) -> std::result::Result<Objects, E> {
                Ok(not_a_map("integer"))
            }
            fn visit_i64<E>(self, _: i64) -> std::result::Result<Objects, E> {
                Ok(not_a_map("integer"))
            }
            fn visit_u128<E>(self, _: u128) -> std::result::Result<Objects, E> {
                Ok(not_a_map("integer"))
            }
            fn visit_i128<E>(self, _: i128) -> std::result::Result<Objects, E> {
                Ok(not_a_map("integer"))
            }
            fn visit_f64<E>(self, _: f64) -> std::result::Result<Objects, E> {
                Ok(not_a_map("float"))
            }
            fn visit_bool<E>(self, _: bool) -> std::result::Result<Objects, E> {
                Ok(not_a_map("bool"))
            }
            fn visit_unit<E>(self) -> std::result::Result<Objects, E> {
                Ok(not_a_map("null"))
            }
            fn visit_none<E>(self) -> std::result::Result<Objects, E> {
                Ok(not_a_map("null"))
            }
        }
        d.deserialize_any(Visit)
    }
}

fn not_a_map(kind: &str) -> Objects {
    Objects {
        objects: Vec::new(),
        first_err: Some(index_err(format!(
            "manifest \"objects\" is a CBOR {kind}, expected a map"
        ))),
    }
}

/// A map key's spelling must be a scalar (it becomes a JSON key).
fn scalar_key(k: &Value) -> std::result::Result<(), String> {
    match k {
        Value::Map(_) | Value::Array(_) | Value::Tag(..) => Err(format!(
            "a map key is a CBOR {}; keys must be scalars",
            kind_name(k)
        )),
        _ => Ok(()),
    }
}

/// No map inside `v` has two keys that read the same in JSON, or a key
/// that is not a scalar. Iterative: depth is bounded by the decoder, but a
/// wide value must not cost stack either.
fn unique_keys(v: &Value) -> std::result::Result<(), String> {
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        match v {
            Value::Map(pairs) => {
                let mut seen = HashSet::new();
                for (k, inner) in pairs {
                    scalar_key(k)?;
                    let key = key_to_string(k);
                    if !seen.insert(key) {
                        return Err(format!(
                            "key \"{}\" appears twice in a map",
                            key_to_string(k)
                        ));
                    }
                    todo.push(inner);
                }
            }
            Value::Array(items) => todo.extend(items.iter()),
            Value::Tag(_, inner) => todo.push(inner),
            _ => {}
        }
    }
    Ok(())
}

fn unique_keys_map(pairs: &[(Value, Value)]) -> std::result::Result<(), String> {
    let mut seen = HashSet::new();
    for (k, v) in pairs {
        scalar_key(k)?;
        if !seen.insert(key_to_string(k)) {
            return Err(format!("key \"{}\" appears twice", key_to_string(k)));
        }
        unique_keys(v)?;
    }
    Ok(())
}

/// A map's known fields, by position, and the others in file order.
type Fields<const N: usize> = ([Option<Value>; N], Vec<(Value, Value)>);

/// Splits a map into the fields named in `known` (each at most once) and
/// the rest; `what` names the map in messages.
fn fields<const N: usize>(
    pairs: Vec<(Value, Value)>,
    known: [&str; N],
    what: &str,
) -> std::result::Result<Fields<N>, String> {
    let mut slots: [Option<Value>; N] = std::array::from_fn(|_| None);
    let mut extra = Vec::new();
    let mut extra_keys = HashSet::new();
    for (k, v) in pairs {
        match k.as_text().and_then(|t| known.iter().position(|x| *x == t)) {
            Some(i) => {
                if slots[i].is_some() {
                    return Err(format!("{what} field \"{}\" appears twice", known[i]));
                }
                slots[i] = Some(v);
            }
            None => {
                scalar_key(&k).map_err(|why| format!("{what}: {why}"))?;
                let key = key_to_string(&k);
                unique_keys(&v).map_err(|why| format!("{what} field \"{key}\": {why}"))?;
                if !extra_keys.insert(key.clone()) {
                    return Err(format!("{what} field \"{key}\" appears twice"));
                }
                extra.push((k, v));
            }
        }
    }
    Ok((slots, extra))
}

fn text(v: Option<Value>, key: &str, what: &str) -> std::result::Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Text(t)) => Ok(Some(t)),
        Some(other) => Err(format!(
            "{what} field \"{key}\" is a CBOR {}, expected a text string",
            kind_name(&other)
        )),
    }
}

fn uint(v: Option<Value>, key: &str, what: &str) -> std::result::Result<Option<u64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => as_u64(&v)
            .map(Some)
            .map_err(|why| format!("{what} field \"{key}\" {why}")),
    }
}

fn required<T>(v: Option<T>, key: &str, what: &str) -> std::result::Result<T, String> {
    v.ok_or_else(|| format!("{what}: required field \"{key}\" is missing"))
}

fn parse_object(key: Value, value: Value, i: usize) -> Result<RawObject> {
    let name = match key {
        Value::Text(t) => t,
        other => {
            return Err(index_err(format!(
                "key of object {i} in \"objects\" is a CBOR {}, expected a text string",
                kind_name(&other)
            )));
        }
    };
    let ferr = |msg: String| Error::new(ErrorKind::Field, "", Some(&name), msg);
    if name.is_empty() {
        return Err(ferr("object name is empty".into()));
    }
    if name.contains('\0') {
        return Err(ferr("object name contains a NUL byte".into()));
    }
    let Value::Map(pairs) = value else {
        return Err(ferr(format!(
            "object is a CBOR {}, expected a map",
            kind_name(&value)
        )));
    };
    let ([shape, format, attributes, components], extra) = fields(
        pairs,
        ["shape", "format", "attributes", "components"],
        "object",
    )
    .map_err(ferr)?;
    let shape = match shape {
        None => return Err(ferr("object: required field \"shape\" is missing".into())),
        Some(Value::Array(dims)) => {
            let mut out = Vec::new();
            for (d, v) in dims.iter().enumerate() {
                out.push(as_u64(v).map_err(|why| ferr(format!("shape[{d}] {why}")))?);
            }
            out
        }
        Some(other) => {
            return Err(ferr(format!(
                "object field \"shape\" is a CBOR {}, expected an array",
                kind_name(&other)
            )));
        }
    };
    let format = text(format, "format", "object")
        .and_then(|f| required(f, "format", "object"))
        .map_err(ferr)?;
    let attributes = match attributes {
        None | Some(Value::Null) => None,
        Some(Value::Map(pairs)) => {
            unique_keys_map(&pairs).map_err(|why| ferr(format!("object \"attributes\": {why}")))?;
            Some(pairs)
        }
        Some(other) => {
            return Err(ferr(format!(
                "object field \"attributes\" is a CBOR {}, expected a map",
                kind_name(&other)
            )));
        }
    };
    let components = match components {
        None => {
            return Err(ferr(
                "object: required field \"components\" is missing".into(),
            ));
        }
        Some(Value::Map(pairs)) => {
            let mut out: Vec<RawComponent> = Vec::new();
            for (k, v) in pairs {
                let role = match k {
                    Value::Text(t) => t,
                    other => {
                        return Err(ferr(format!(
                            "a key of \"components\" is a CBOR {}, expected a text string",
                            kind_name(&other)
                        )));
                    }
                };
                if out.iter().any(|c| c.role == role) {
                    return Err(ferr(format!("component \"{role}\" appears twice")));
                }
                out.push(parse_component(role, v).map_err(&ferr)?);
            }
            out
        }
        Some(other) => {
            return Err(ferr(format!(
                "object field \"components\" is a CBOR {}, expected a map",
                kind_name(&other)
            )));
        }
    };
    Ok(RawObject {
        name,
        shape,
        format,
        attributes,
        components,
        extra,
    })
}

fn parse_component(role: String, v: Value) -> std::result::Result<RawComponent, String> {
    let what = format!("component \"{role}\"");
    let Value::Map(pairs) = v else {
        return Err(format!(
            "{what} is a CBOR {}, expected a map",
            kind_name(&v)
        ));
    };
    let (
        [
            dtype,
            logical,
            offset,
            length,
            uncompressed_length,
            encoding,
            digest,
        ],
        extra,
    ) = fields(
        pairs,
        [
            "dtype",
            "type",
            "offset",
            "length",
            "uncompressed_length",
            "encoding",
            "digest",
        ],
        &what,
    )?;
    Ok(RawComponent {
        dtype: required(text(dtype, "dtype", &what)?, "dtype", &what)?,
        logical: text(logical, "type", &what)?,
        offset: required(uint(offset, "offset", &what)?, "offset", &what)?,
        length: required(uint(length, "length", &what)?, "length", &what)?,
        uncompressed_length: uint(uncompressed_length, "uncompressed_length", &what)?,
        encoding: text(encoding, "encoding", &what)?.unwrap_or_else(|| "raw".into()),
        digest: text(digest, "digest", &what)?,
        extra,
        role,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_counts_items_maps_and_strings() {
        let v = Value::Map(vec![(
            Value::Text("a".into()),
            Value::Array(vec![Value::Text("x".repeat(100)), Value::Integer(1.into())]),
        )]);
        let mut b = Vec::new();
        ciborium::ser::into_writer(&v, &mut b).unwrap();
        let c = estimate(&b);
        assert_eq!(c.items, 5);
        assert_eq!(c.memory, 5 * ITEM_COST + MAP_COST + 2 * 32 + 32 + 100);
        // A map that declares 2^63 pairs ends the walk, no overflow.
        let huge = [0xbb, 0x80, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(estimate(&huge).items, 1);
    }
}
