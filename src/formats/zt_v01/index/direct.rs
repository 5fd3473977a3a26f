//! The index array read straight from its bytes into [`RawEntry`]s, for
//! the plain CBOR every writer makes: no `ciborium` value per entry (a
//! 100 000-tensor index was a million values made and dropped, half of
//! the mount's time).
//!
//! It takes only what it can read exactly as the value decoder would:
//! definite lengths, text keys, each spec field of its expected type, and
//! entries that pass every rule of `parse_entry`. Anything else (a CBOR
//! error, an entry that would be refused, a tag, an indefinite length) and
//! it gives up: the caller then decodes the index with `ciborium`, which
//! yields the same entries or the exact error. Custom fields are decoded by
//! `ciborium` one value at a time, so they read as they always did.

use std::collections::HashSet;

use ciborium::value::Value;

use super::{KNOWN_KEYS, RawEntry, Walk, skip_item, unique_keys};
use crate::formats::cbor::header;

/// Nesting the direct reader hands to `ciborium` for one custom value: far
/// below the index's own limit, so a value it takes would also decode in
/// place (two levels down, inside the array and the entry's map).
const CUSTOM_DEPTH: usize = 16;

/// Every entry of the index array at the start of `cbor`, and where the
/// array ends; `None` where the value decoder must decide.
pub(super) fn entries(cbor: &[u8]) -> Option<(Vec<RawEntry>, usize)> {
    let mut r = Reader { b: cbor, pos: 0 };
    let n = r.definite(4)?;
    // Each entry takes some bytes, so the count cannot ask for more room
    // than the index has bytes.
    let mut out = Vec::with_capacity(usize::try_from(n).ok()?.min(cbor.len()));
    for _ in 0..n {
        out.push(r.entry()?);
    }
    Some((out, r.pos))
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

/// The spec fields of one entry as read, by their place in [`KNOWN_KEYS`].
#[derive(Default)]
struct Known {
    name: Option<String>,
    offset: Option<u64>,
    size: Option<u64>,
    dtype: Option<String>,
    shape: Option<Vec<u64>>,
    encoding: Option<String>,
    layout: Option<String>,
    endian: Option<String>,
    checksum: Option<String>,
}

impl<'a> Reader<'a> {
    /// The argument of a definite item of type `major` at the cursor.
    fn definite(&mut self, major: u8) -> Option<u64> {
        match header(self.b, self.pos)? {
            (m, Some(arg), n) if m == major => {
                self.pos += n;
                Some(arg)
            }
            _ => None,
        }
    }

    fn uint(&mut self) -> Option<u64> {
        self.definite(0)
    }

    fn str(&mut self) -> Option<&'a str> {
        let len = usize::try_from(self.definite(3)?).ok()?;
        let end = self.pos.checked_add(len)?;
        let s = std::str::from_utf8(self.b.get(self.pos..end)?).ok()?;
        self.pos = end;
        Some(s)
    }

    fn text(&mut self) -> Option<String> {
        self.str().map(str::to_string)
    }

    fn shape(&mut self) -> Option<Vec<u64>> {
        let n = usize::try_from(self.definite(4)?).ok()?;
        let mut dims = Vec::with_capacity(n.min(self.b.len() - self.pos));
        for _ in 0..n {
            dims.push(self.uint()?);
        }
        Some(dims)
    }

    /// The next item as a `ciborium` value, and nothing past its end.
    fn value(&mut self) -> Option<Value> {
        let Walk::End { end, .. } = skip_item(self.b, self.pos, u64::MAX) else {
            return None;
        };
        let mut cursor = std::io::Cursor::new(self.b.get(self.pos..end)?);
        let v = ciborium::de::from_reader_with_recursion_limit(&mut cursor, CUSTOM_DEPTH).ok()?;
        if cursor.position() != (end - self.pos) as u64 {
            return None;
        }
        self.pos = end;
        Some(v)
    }

    /// One entry map, as `parse_entry` would make it from its value.
    fn entry(&mut self) -> Option<RawEntry> {
        let pairs = self.definite(5)?;
        let mut known = Known::default();
        let mut custom = Vec::new();
        let mut custom_keys: HashSet<&str> = HashSet::new();
        for _ in 0..pairs {
            let key = self.str()?;
            match KNOWN_KEYS.iter().position(|k| *k == key) {
                Some(slot) => self.known(&mut known, slot)?,
                None => {
                    let v = self.value()?;
                    if unique_keys(&v).is_err() || !custom_keys.insert(key) {
                        return None;
                    }
                    custom.push((Value::Text(key.to_string()), v));
                }
            }
        }
        finish(known, custom)
    }

    /// Reads spec field `slot`'s value; `None` if it is there twice or is
    /// not of the field's type.
    fn known(&mut self, k: &mut Known, slot: usize) -> Option<()> {
        fn once<T>(field: &mut Option<T>, v: Option<T>) -> Option<()> {
            if field.is_some() {
                return None;
            }
            *field = Some(v?);
            Some(())
        }
        match slot {
            0 => once(&mut k.name, self.text()),
            1 => once(&mut k.offset, self.uint()),
            2 => once(&mut k.size, self.uint()),
            3 => once(&mut k.dtype, self.text()),
            4 => once(&mut k.shape, self.shape()),
            5 => once(&mut k.encoding, self.text()),
            6 => once(&mut k.layout, self.text()),
            7 => once(&mut k.endian, self.text()),
            8 => once(&mut k.checksum, self.text()),
            _ => None,
        }
    }
}

/// The entry, if `parse_entry` would take it: every required field there,
/// a name that is not empty and holds no NUL byte.
fn finish(k: Known, custom: Vec<(Value, Value)>) -> Option<RawEntry> {
    let name = k.name.filter(|n| !n.is_empty() && !n.contains('\0'))?;
    Some(RawEntry {
        name,
        offset: k.offset?,
        size: k.size?,
        dtype: k.dtype?,
        shape: k.shape?,
        encoding: k.encoding?,
        layout: k.layout.unwrap_or_else(|| "dense".to_string()),
        data_endianness: k.endian,
        checksum: k.checksum,
        custom,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{int, parse_entry};
    use super::*;

    fn text(s: &str) -> Value {
        Value::Text(s.into())
    }

    fn encode(entries: Vec<Value>) -> Vec<u8> {
        let mut v = Vec::new();
        ciborium::ser::into_writer(&Value::Array(entries), &mut v).unwrap();
        v
    }

    fn entry(extra: Vec<(Value, Value)>) -> Value {
        let mut pairs = vec![
            (text("name"), text("a.b")),
            (text("offset"), int(64)),
            (text("size"), int(16)),
            (text("dtype"), text("float32")),
            (text("shape"), Value::Array(vec![int(2), int(2)])),
            (text("encoding"), text("raw")),
        ];
        pairs.extend(extra);
        Value::Map(pairs)
    }

    #[test]
    fn entries_read_directly_equal_those_of_the_value_decoder() {
        let custom = Value::Map(vec![(text("k"), Value::Bytes(vec![1, 2]))]);
        let list = vec![
            entry(vec![]),
            entry(vec![
                (text("layout"), text("dense")),
                (text("data_endianness"), text("big")),
                (text("checksum"), text("crc32c:0x00000000")),
                (text("note"), custom),
                (text("n"), Value::Float(1.5)),
                (text("t"), Value::Tag(1, Box::new(int(1)))),
            ]),
        ];
        let bytes = encode(list.clone());
        let (direct, end) = entries(&bytes).unwrap();
        assert_eq!(end, bytes.len());
        for (i, (d, v)) in direct.iter().zip(list).enumerate() {
            let slow = parse_entry(v, i, "").unwrap();
            assert_eq!(format!("{d:?}"), format!("{slow:?}"));
        }
    }

    #[test]
    fn anything_unusual_is_left_to_the_value_decoder() {
        let bad = [
            entry(vec![(text("name"), text("again"))]),
            entry(vec![(text("x"), int(1)), (text("x"), int(2))]),
            entry(vec![(int(7), int(1))]),
            entry(vec![(text("layout"), int(1))]),
            entry(vec![(
                text("x"),
                Value::Map(vec![(int(1), int(1)), (text("$key:1"), int(2))]),
            )]),
            Value::Map(vec![(text("name"), text(""))]),
            Value::Map(vec![(text("name"), text("no fields"))]),
            text("not a map"),
        ];
        for b in bad {
            assert!(entries(&encode(vec![b.clone()])).is_none(), "{b:?}");
        }
        // Indefinite lengths, and bytes cut short.
        assert!(entries(&[0x9f, 0xff]).is_none());
        let bytes = encode(vec![entry(vec![])]);
        assert!(entries(&bytes[..bytes.len() - 1]).is_none());
    }
}
