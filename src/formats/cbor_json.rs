//! Metadata values -> JSON, for sidecars and `info --json`: CBOR's, and
//! the floats and byte strings of every other format's metadata.
//!
//! Conventions (also in the README): integers stay numbers; floats that JSON
//! cannot hold become the strings "NaN", "Infinity", "-Infinity"; byte strings
//! become `{"$bytes": "<hex>"}`; tags become `{"$tag": N, "value": ...}`; a map
//! key that is not text becomes the string `"$key:"` + the key's JSON.

use ciborium::value::Value;
use serde_json::{Map, Value as Json};

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
        other => format!("$key:{}", to_json(other)),
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
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
}
