//! Metadata values -> JSON, for sidecars and `info --json`: CBOR's, and
//! the floats and byte strings of every other format's metadata.
//!
//! Conventions (also in the README): integers stay numbers; floats that JSON
//! cannot hold become the strings "NaN", "Infinity", "-Infinity"; byte strings
//! become `{"$bytes": "<hex>"}`; tags become `{"$tag": N, "value": ...}`; a map
//! key that is not text becomes the string `"$key:"` + the key's JSON.

use ciborium::value::Value;
use serde_json::{Map, Value as Json};
use ztensor2::format::cbor::Value as ZValue;

pub fn to_json(v: &Value) -> Json {
    match v {
        Value::Integer(i) => {
            let n = i128::from(*i);
            if let Ok(u) = u64::try_from(n) {
                Json::from(u)
            } else if let Ok(s) = i64::try_from(n) {
                Json::from(s)
            } else {
                Json::String(n.to_string())
            }
        }
        Value::Float(f) => float(*f),
        Value::Text(t) => Json::String(t.clone()),
        Value::Bool(b) => Json::Bool(*b),
        Value::Null => Json::Null,
        Value::Bytes(b) => bytes(b),
        Value::Tag(tag, inner) => {
            let mut m = Map::new();
            m.insert("$tag".into(), Json::from(*tag));
            m.insert("value".into(), to_json(inner));
            Json::Object(m)
        }
        Value::Array(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(pairs) => Json::Object(map_to_json(pairs)),
        _ => Json::Null,
    }
}

/// A float as JSON: a number, or "NaN", "Infinity", "-Infinity", which
/// JSON numbers cannot be. Every format's metadata floats go through here.
pub fn float(f: f64) -> Json {
    match serde_json::Number::from_f64(f) {
        Some(n) => Json::Number(n),
        None if f.is_nan() => Json::String("NaN".into()),
        None if f > 0.0 => Json::String("Infinity".into()),
        None => Json::String("-Infinity".into()),
    }
}

/// A byte string as JSON: `{"$bytes": "<hex>"}`, for every format's
/// metadata.
pub fn bytes(b: &[u8]) -> Json {
    let mut m = Map::new();
    m.insert("$bytes".into(), Json::String(hex(b)));
    Json::Object(m)
}

/// A CBOR map as a JSON object (see the key convention above).
pub fn map_to_json(pairs: &[(Value, Value)]) -> Map<String, Json> {
    let mut m = Map::new();
    for (k, v) in pairs {
        m.insert(key_to_string(k), to_json(v));
    }
    m
}

pub fn key_to_string(k: &Value) -> String {
    match k {
        Value::Text(t) => t.clone(),
        other => non_text_key(&to_json(other)),
    }
}

/// Longest key JSON kept whole. A map key that is a map whose keys are
/// maps doubles its text at each level (every quote of the inner key is
/// escaped in the outer), so 30 levels of a few bytes each would make a
/// gigabyte: a longer key is named by its length instead, which bounds
/// every level.
const KEY_MAX: usize = 1024;

/// The name a non-text key `k` (as JSON) takes: `$key:` and its JSON, or
/// its length where that is over [`KEY_MAX`].
fn non_text_key(k: &Json) -> String {
    let text = k.to_string();
    if text.len() > KEY_MAX {
        format!("$key:({} bytes of JSON)", text.len())
    } else {
        format!("$key:{text}")
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A `ztensor` 2.x CBOR value (zTensor v2 attributes, and what
/// `ztensor-compat` reads from GGUF) as JSON, by the same rules.
pub fn from_ztensor(v: &ZValue) -> Json {
    match v {
        ZValue::Uint(n) => (*n).into(),
        // -1 - n, which i64 holds for n up to 2^63 - 1.
        ZValue::Nint(n) => match i64::try_from(*n) {
            Ok(n) => (-1 - n).into(),
            Err(_) => Json::String((-1 - i128::from(*n)).to_string()),
        },
        ZValue::Bytes(b) => bytes(b),
        ZValue::Text(s) => Json::String(s.clone()),
        ZValue::Array(items) => Json::Array(items.iter().map(from_ztensor).collect()),
        ZValue::Map(entries) => Json::Object(
            entries
                .iter()
                .map(|(k, v)| {
                    let k = match k {
                        ZValue::Text(s) => s.clone(),
                        other => non_text_key(&from_ztensor(other)),
                    };
                    (k, from_ztensor(v))
                })
                .collect(),
        ),
        ZValue::Bool(b) => (*b).into(),
        ZValue::Null => Json::Null,
        ZValue::Float(f) => float(*f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ciborium::value::Integer;

    #[test]
    fn every_kind_has_a_json_form() {
        let v = Value::Map(vec![
            (Value::Text("b".into()), Value::Bytes(vec![0, 255])),
            (
                Value::Integer(Integer::from(7)),
                Value::Tag(1, Box::new(Value::Float(f64::NAN))),
            ),
            (Value::Text("neg".into()), Value::Integer(Integer::from(-3))),
        ]);
        let j = to_json(&v);
        assert_eq!(
            j.to_string(),
            r#"{"b":{"$bytes":"00ff"},"$key:7":{"$tag":1,"value":"NaN"},"neg":-3}"#
        );
    }

    /// Keys that are maps whose keys are maps, 40 deep: each level's key
    /// is its JSON, escaped again by the next, so the text doubled at each
    /// level (a fuzzed zTensor v1 index of 30 such levels hung the mount).
    #[test]
    fn keys_of_keys_stay_short_however_deep() {
        let (mut c, mut z) = (Value::Null, ZValue::Null);
        for _ in 0..40 {
            c = Value::Map(vec![(c, Value::Text("\"\\".into()))]);
            z = ZValue::Map(vec![(z, ZValue::Text("\"\\".into()))]);
        }
        let (c, z) = (to_json(&c).to_string(), from_ztensor(&z).to_string());
        assert!(c.len() < 4 * KEY_MAX && z.len() < 4 * KEY_MAX, "{c}\n{z}");
        assert!(
            c.contains("bytes of JSON)") && z.contains("bytes of JSON)"),
            "{c}"
        );
        let short = Value::Map(vec![(Value::Map(vec![]), Value::Null)]);
        assert_eq!(to_json(&short).to_string(), r#"{"$key:{}":null}"#);
    }

    #[test]
    fn ztensor_values_take_the_same_form() {
        let v = ZValue::Map(vec![
            (ZValue::Text("b".into()), ZValue::Bytes(vec![0, 255])),
            (ZValue::Uint(7), ZValue::Float(f64::NAN)),
            (ZValue::Text("neg".into()), ZValue::Nint(2)),
            (ZValue::Text("big".into()), ZValue::Nint(u64::MAX)),
            (ZValue::Text("inf".into()), ZValue::Float(f64::NEG_INFINITY)),
        ]);
        assert_eq!(
            from_ztensor(&v).to_string(),
            r#"{"b":{"$bytes":"00ff"},"$key:7":"NaN","neg":-3,"big":"-18446744073709551616","inf":"-Infinity"}"#
        );
    }
}
