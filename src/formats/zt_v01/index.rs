//! File bytes -> index: finds the CBOR array at the end of the file, decodes
//! it within fixed limits, and turns each map into typed [`RawEntry`] fields.
//! Cross-tensor rules (placement, overlap, sizes) live in `catalog.rs`.

pub use crate::formats::cbor::{as_u64, kind_name};
// Nesting depth allowed in the index; real files need 3 or 4 levels.
use crate::formats::cbor::{MAX_DEPTH as MAX_CBOR_DEPTH, cbor_error, header, header_kind};
use std::collections::HashSet;

use ciborium::value::{Integer, Value};

use crate::formats::cbor_json::key_to_string;

use crate::error::{Error, ErrorKind, Result};

mod direct;

pub const MAGIC: &[u8; 8] = b"ZTEN0001";
pub const ALIGNMENT: u64 = 64;

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

/// Most memory the decoded index may take unless the user says otherwise:
/// about 250 000 tensors (`catalog::cost`). Real models have up to about 100 000.
pub const DEFAULT_INDEX_MEMORY: u64 = 1 << 30;

/// Reads the magic, the trailing size and the CBOR array of `bytes`; an
/// index that would take more than `memory_limit` bytes once decoded (an
/// estimate from its headers, made before decoding) is refused.
pub fn parse(bytes: &[u8], file: &str, memory_limit: u64) -> Result<Index> {
    let err = |kind, msg: String| Error::new(kind, file, None, msg);
    let (data_end, index_size) = framing(bytes, file)?;
    let cbor = &bytes[data_end as usize..bytes.len() - 8];
    // RFC 8949's "self-described CBOR" tag (55799) only says that CBOR
    // follows: a writer may put it first.
    let (cbor, tag_len) = match cbor.strip_prefix(&[0xd9, 0xd9, 0xf7]) {
        Some(rest) => (rest, 3),
        None => (cbor, 0),
    };
    let mut cursor = std::io::Cursor::new(cbor);
    // The usual case, an array: decode it entry by entry, so no tree of the
    // whole index is ever built (a 100 000-tensor index would be ~10^6 nodes).
    if cbor.first().is_some_and(|b| b >> 5 == 4) {
        within_memory(cbor, file, memory_limit)?;
        if let Some((entries, end)) = direct::entries(cbor) {
            check_trailing(tag_len + end as u64, index_size, file)?;
            return Ok(Index { entries, data_end });
        }
        let list: Entries =
            ciborium::de::from_reader_with_recursion_limit(&mut cursor, MAX_CBOR_DEPTH).map_err(
                |e| {
                    err(
                        ErrorKind::Index,
                        format!("index is not valid CBOR: {}", cbor_error(&e)),
                    )
                },
            )?;
        check_trailing(tag_len + cursor.position(), index_size, file)?;
        if let Some(mut e) = list.first_err {
            e.file = file.to_string();
            return Err(e);
        }
        return Ok(Index {
            entries: list.entries,
            data_end,
        });
    }
    // Not an array: check it is CBOR without building it (a map of 10^8
    // items would be gigabytes decoded), then say what it is.
    ciborium::de::from_reader_with_recursion_limit::<serde::de::IgnoredAny, _>(
        &mut cursor,
        MAX_CBOR_DEPTH,
    )
    .map_err(|e| {
        err(
            ErrorKind::Index,
            format!("index is not valid CBOR: {}", cbor_error(&e)),
        )
    })?;
    check_trailing(tag_len + cursor.position(), index_size, file)?;
    Err(err(
        ErrorKind::Index,
        format!(
            "index is a CBOR {}, expected an array of maps",
            header_kind(cbor[0])
        ),
    ))
}

/// Checks the magic and the trailing index size of `bytes`: where the
/// index starts (tensor data ends there) and its size.
fn framing(bytes: &[u8], file: &str) -> Result<(u64, u64)> {
    let err = |kind, msg: String| Error::new(kind, file, None, msg);
    let len = bytes.len() as u64;
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        let found = match bytes.len() {
            0 => "the file is empty".to_string(),
            n => format!(
                "it starts with {:?}",
                String::from_utf8_lossy(&bytes[..n.min(8)])
            ),
        };
        return Err(err(
            ErrorKind::NotZtensor,
            format!("not a zTensor v0.1 file (magic \"ZTEN0001\" missing; {found})"),
        ));
    }
    if len < 16 {
        return Err(err(
            ErrorKind::Index,
            format!(
                "file is {len} bytes, too short for the trailing index size (it looks truncated)"
            ),
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
                "index size {index_size} is larger than the file allows ({room} bytes between the magic and the size field; the file looks truncated)"
            ),
        ));
    }
    if index_size == 0 {
        return Err(err(
            ErrorKind::Index,
            "index size is 0; an empty index is the 1-byte CBOR array 0x80".into(),
        ));
    }
    Ok((len - 8 - index_size, index_size))
}

/// Refuses an index array (`cbor`) with an entry of too many items, or
/// that would take more than `memory_limit` bytes decoded (an estimate
/// from its headers, made before decoding).
fn within_memory(cbor: &[u8], file: &str, memory_limit: u64) -> Result<()> {
    let err = |msg: String| Error::new(ErrorKind::Index, file, None, msg);
    let tally = tally(cbor, MAX_ENTRY_ITEMS);
    if let Some(i) = tally.oversized {
        return Err(err(format!(
            "index entry {i} holds more than {MAX_ENTRY_ITEMS} CBOR items"
        )));
    }
    if tally.memory() > memory_limit {
        return Err(err(format!(
            "the index would take about {} of memory decoded ({} entries, {} CBOR items), more \
             than the {} allowed (--index-memory)",
            crate::size::bytes(tally.memory()),
            tally.entries,
            tally.items,
            crate::size::bytes(memory_limit)
        )));
    }
    Ok(())
}

/// Most CBOR items one index entry may hold. Each becomes a 32-byte value
/// while the entry is read, so this bounds that at 64 MiB; a frame table of
/// 2^20 frames fits.
const MAX_ENTRY_ITEMS: u64 = 1 << 21;

/// What a walk over the headers of the index array found.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    entries: u64,
    items: u64,
    /// What strings and containers take on the heap besides their items
    /// (see [`heap_cost`]).
    heap_bytes: u64,
    /// The first entry holding more than the cap, if one does.
    oversized: Option<usize>,
}

impl Tally {
    /// Roughly what reading the index takes in memory, before anything is
    /// decoded: the entries and the catalog made of them peaked at 1.85 KiB
    /// per tensor for 100 000 entries of eight fields (`bench_startup`),
    /// which this slightly exceeds. The catalog, once built, is held to
    /// the whole measure of `catalog::cost` (tree and views included).
    fn memory(&self) -> u64 {
        self.entries
            .saturating_mul(ENTRY_COST)
            .saturating_add(self.items.saturating_mul(ITEM_COST))
            .saturating_add(self.heap_bytes)
    }
}

/// What a string takes decoded beyond its item: its bytes, at least a
/// small allocation; in text, each `/` may make a directory in the tree
/// (a node, its table and names: some hundreds of bytes).
fn heap_cost(major: u8, bytes: &[u8]) -> u64 {
    let own = (bytes.len() as u64).max(32);
    if major != 3 {
        return own;
    }
    let slashes = bytes.iter().filter(|&&c| c == b'/').count() as u64;
    own.saturating_add(slashes.saturating_mul(DIR_COST))
}

/// Memory of a directory a `/` in a name may make.
const DIR_COST: u64 = 512;

/// Memory of one tensor beyond its items: catalog entry, tree nodes, paths.
const ENTRY_COST: u64 = 1024;
/// Memory of one decoded CBOR item.
const ITEM_COST: u64 = 32;

/// Walks the headers of the index array's entries, counting, and stops at
/// the first entry holding more than `cap` items. Malformed CBOR ends the
/// walk: the decoder reports it.
fn tally(cbor: &[u8], cap: u64) -> Tally {
    let mut t = Tally::default();
    let Some((4, len, n)) = header(cbor, 0) else {
        return t;
    };
    let mut pos = n;
    loop {
        if len.is_some_and(|l| t.entries >= l) || (len.is_none() && cbor.get(pos) == Some(&0xff)) {
            return t;
        }
        match skip_item(cbor, pos, cap) {
            Walk::End {
                end,
                items,
                heap_bytes,
            } => {
                pos = end;
                t.items += items;
                t.heap_bytes += heap_bytes;
            }
            Walk::TooMany => {
                t.oversized = Some(t.entries as usize);
                return t;
            }
            Walk::Malformed => return t,
        }
        t.entries += 1;
    }
}

enum Walk {
    End {
        end: usize,
        items: u64,
        heap_bytes: u64,
    },
    TooMany,
    Malformed,
}

/// Walks the item at `pos`, counting it and everything inside it.
fn skip_item(b: &[u8], mut pos: usize, cap: u64) -> Walk {
    // Items still to read in each open container; `None`: until a break.
    let mut open: Vec<Option<u64>> = vec![Some(1)];
    let mut items = 0u64;
    let mut heap_bytes = 0u64;
    loop {
        while open.last() == Some(&Some(0)) {
            open.pop();
        }
        let Some(&top) = open.last() else {
            return Walk::End {
                end: pos,
                items,
                heap_bytes,
            };
        };
        let Some((major, arg, n)) = header(b, pos) else {
            return Walk::Malformed;
        };
        pos += n;
        if major == 7 && arg.is_none() {
            // A break ends an indefinite container, nothing else.
            if top.is_some() {
                return Walk::Malformed;
            }
            open.pop();
            continue;
        }
        if let Some(Some(left)) = open.last_mut() {
            *left -= 1;
        }
        items += 1;
        if items > cap {
            return Walk::TooMany;
        }
        let child = match (major, arg) {
            (2 | 3, Some(len)) => {
                match usize::try_from(len).ok().and_then(|l| pos.checked_add(l)) {
                    Some(end) if end <= b.len() => {
                        heap_bytes += heap_cost(major, &b[pos..end]);
                        pos = end;
                    }
                    _ => return Walk::Malformed,
                }
                continue;
            }
            // Chunks until a break, each a definite string of this type.
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
                                    heap_bytes += heap_cost(major, &b[pos + k..end]);
                                    pos = end;
                                }
                                _ => return Walk::Malformed,
                            }
                        }
                        _ => return Walk::Malformed,
                    }
                }
                continue;
            }
            (4, len) => len,
            (5, Some(pairs)) => match pairs.checked_mul(2) {
                Some(k) => Some(k),
                None => return Walk::Malformed,
            },
            (5, None) => None,
            (6, _) => Some(1),
            _ => continue,
        };
        if open.len() > MAX_CBOR_DEPTH {
            return Walk::Malformed;
        }
        // A container's items live in a heap block of its own.
        heap_bytes += 32;
        open.push(child);
    }
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

/// A map key's spelling in JSON sidecars. Only scalars: a key that is a
/// map or array is spelled as escaped JSON, which doubles at every level.
fn spelled(k: &Value) -> std::result::Result<String, String> {
    match k {
        Value::Map(_) | Value::Array(_) | Value::Tag(..) => Err(format!(
            "a map key is a CBOR {}; keys must be scalars",
            kind_name(k)
        )),
        _ => Ok(key_to_string(k)),
    }
}

/// Checks that no map inside `v` has two keys that read the same in JSON
/// (one would silently hide the other in a sidecar), or a key that is not
/// a scalar; says which.
fn unique_keys(v: &Value) -> std::result::Result<(), String> {
    match v {
        Value::Map(pairs) => {
            let mut seen = HashSet::new();
            for (k, inner) in pairs {
                let key = spelled(k)?;
                unique_keys(inner)?;
                if !seen.insert(key) {
                    return Err(format!(
                        "key \"{}\" appears twice in a map",
                        key_to_string(k)
                    ));
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

    let (known, custom) = fields(pairs, &ferr)?;
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
        Some(Value::Array(dims)) => dims
            .iter()
            .enumerate()
            .map(|(d, v)| as_u64(v).map_err(|why| ferr(format!("shape[{d}] {why}"))))
            .collect::<Result<Vec<u64>>>()?,
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

/// An entry's known fields (by `KNOWN_KEYS` slot) and custom fields.
type Fields = ([Option<Value>; 9], Vec<(Value, Value)>);

/// An entry's fields: those the format names, in `KNOWN_KEYS` order, and
/// the others (custom fields) in file order; each once, and each custom
/// field's key and value readable as JSON keys. `ferr` makes the error.
fn fields(pairs: Vec<(Value, Value)>, ferr: &impl Fn(String) -> Error) -> Result<Fields> {
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
                let key = spelled(&k).map_err(|why| ferr(format!("custom field: {why}")))?;
                if let Err(why) = unique_keys(&v) {
                    return Err(ferr(format!("field \"{key}\": {why}")));
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
    Ok((known, custom))
}

/// Convenience for writers and tests.
pub fn int(v: u64) -> Value {
    Value::Integer(Integer::from(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(b: &[u8]) -> (Option<u64>, bool) {
        // Items counted exactly: the walk ends at `cap` items but not below.
        let items = (1..64).find(|&cap| !matches!(skip_item(b, 0, cap), Walk::TooMany));
        match skip_item(b, 0, 64) {
            Walk::End { end, items: n, .. } => {
                assert_eq!(items, Some(n));
                (items, end == b.len())
            }
            _ => (None, false),
        }
    }

    #[test]
    fn the_header_walk_counts_every_item_and_ends_where_the_item_ends() {
        // [_ 1, (_ h'61'), {_ "a": 1}, 1(2), 1.5, true, null]
        let indefinite = [
            0x9f, 0x01, 0x5f, 0x41, 0x61, 0xff, 0xbf, 0x61, 0x61, 0x01, 0xff, 0xc1, 0x02, 0xfb,
            0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xf5, 0xf6, 0xff,
        ];
        assert_eq!(count(&indefinite), (Some(11), true));
        let mut v = Vec::new();
        let value = Value::Map(vec![
            (
                Value::Text("shape".into()),
                Value::Array(vec![int(3), int(300)]),
            ),
            (int(7), Value::Bytes(vec![0; 300])),
        ]);
        ciborium::ser::into_writer(&value, &mut v).unwrap();
        assert_eq!(count(&v), (Some(7), true));
        // Cut short, a break out of place, a reserved length: malformed.
        for bad in [&v[..v.len() - 1], &[0x81, 0xff][..], &[0x1c][..]] {
            assert!(matches!(skip_item(bad, 0, 64), Walk::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn the_estimate_counts_directories_small_strings_and_containers() {
        // A name of 10 000 components makes 10 000 directories in the tree.
        let name = "a/".repeat(10_000);
        let entry = Value::Map(vec![(Value::Text("name".into()), Value::Text(name))]);
        let mut v = Vec::new();
        ciborium::ser::into_writer(&Value::Array(vec![entry]), &mut v).unwrap();
        let t = tally(&v, 1 << 20);
        assert!(t.memory() >= 10_000 * DIR_COST, "{t:?}");
        // Tiny strings cost a small allocation each, not their length.
        let tiny = Value::Array(vec![Value::Text("x".into()); 1000]);
        let mut v = Vec::new();
        ciborium::ser::into_writer(&Value::Array(vec![tiny]), &mut v).unwrap();
        assert!(tally(&v, 1 << 20).memory() >= 1000 * (ITEM_COST + 32));
    }

    #[test]
    fn only_an_entry_past_the_cap_is_reported() {
        let entry = |n: usize| Value::Array(vec![int(0); n]);
        let mut v = Vec::new();
        ciborium::ser::into_writer(&Value::Array(vec![entry(3), entry(9), entry(2)]), &mut v)
            .unwrap();
        assert_eq!(
            tally(&v, 10),
            Tally {
                entries: 3,
                items: 17,
                heap_bytes: 3 * 32,
                oversized: None
            }
        );
        assert_eq!(tally(&v, 9).oversized, Some(1));
        assert_eq!(tally(&[0x9f, 0x80, 0x82, 1, 2, 0xff], 2).oversized, Some(1));
    }
}
