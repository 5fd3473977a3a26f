//! CBOR helpers shared by the formats whose index is CBOR (zTensor v0.1
//! and v1): item headers read without decoding, one-line error texts, and
//! typed reads of decoded values.

use ciborium::value::Value;

/// How deeply an index's CBOR may nest: decoding recurses per level.
pub const MAX_DEPTH: usize = 64;

/// One CBOR header at `pos`: (major type, argument or `None` for an
/// indefinite length or a break, header length with a float's payload).
pub fn header(b: &[u8], pos: usize) -> Option<(u8, Option<u64>, usize)> {
    let first = *b.get(pos)?;
    let (major, ai) = (first >> 5, first & 31);
    match ai {
        0..=23 => Some((major, Some(u64::from(ai)), 1)),
        24..=27 => {
            let len = 1usize << (ai - 24);
            let bytes = b.get(pos + 1..pos.checked_add(1 + len)?)?;
            let arg = bytes.iter().fold(0u64, |a, &x| (a << 8) | u64::from(x));
            Some((major, Some(arg), 1 + len))
        }
        31 if matches!(major, 2..=5 | 7) => Some((major, None, 1)),
        _ => None,
    }
}

/// What a CBOR item is, from its first byte (as [`kind_name`] names it).
pub fn header_kind(first: u8) -> &'static str {
    match (first >> 5, first & 31) {
        (0 | 1, _) => "integer",
        (2, _) => "byte string",
        (3, _) => "text string",
        (4, _) => "array",
        (5, _) => "map",
        (6, _) => "tag",
        (7, 20 | 21) => "bool",
        (7, 22 | 23) => "null",
        (7, 25..=27) => "float",
        _ => "unknown value",
    }
}

/// A ciborium error as one line.
pub fn cbor_error<E: std::fmt::Debug>(e: &ciborium::de::Error<E>) -> String {
    match e {
        ciborium::de::Error::Io(_) => "unexpected end of data".to_string(),
        ciborium::de::Error::Syntax(at) => format!("syntax error at byte {at}"),
        ciborium::de::Error::Semantic(at, msg) => match at {
            Some(at) => format!("{msg} at byte {at}"),
            None => msg.clone(),
        },
        ciborium::de::Error::RecursionLimitExceeded => {
            format!("nested deeper than {MAX_DEPTH} levels")
        }
    }
}

/// What a decoded value is, for messages.
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
