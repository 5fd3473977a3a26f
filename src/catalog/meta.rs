//! A format's own sidecar fields of a tensor or part: a JSON object, kept
//! as its compact text.
//!
//! Text, not a map: a mount holds one per tensor for as long as it runs,
//! and is read only when a sidecar (or a zarr array's attributes) is
//! rendered. The five fields of a zTensor v0.1 tensor took about 800
//! bytes as an ordered map (an entry table, a hash table, a string per
//! key); their text takes one allocation of some 90. On a VM where each
//! new page of memory costs microseconds, that was a fifth of the time a
//! mount of 10^5 tensors took to come up.

use serde::{Serialize, Serializer};

use super::{Json, JsonMap};

/// The fields, in the order the format gave them. Empty: no text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Meta(Option<Box<str>>);

impl Meta {
    /// The fields of `v`, a value that serializes as a JSON object (a
    /// map, or a struct of the format's fields).
    pub fn of(v: &impl Serialize) -> Meta {
        match serde_json::to_string(v) {
            Ok(text) if text != "{}" => Meta(Some(text.into_boxed_str())),
            _ => Meta(None),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The fields as a map. The text was written from a map or a struct
    /// by serde_json, so it reads back as one (an empty map otherwise).
    pub fn to_map(&self) -> JsonMap {
        self.0
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default()
    }

    /// The value of field `key`.
    pub fn get(&self, key: &str) -> Option<Json> {
        self.to_map().remove(key)
    }

    /// Sets field `key` (last if it is new, in place if not).
    pub fn insert(&mut self, key: &str, value: Json) {
        let mut m = self.to_map();
        m.insert(key.to_string(), value);
        *self = Meta::from(m);
    }

    /// Bytes of the text.
    pub fn text_len(&self) -> usize {
        self.0.as_deref().map_or(0, str::len)
    }
}

impl From<JsonMap> for Meta {
    fn from(m: JsonMap) -> Meta {
        Meta::of(&m)
    }
}

/// As the map of its fields: `#[serde(flatten)]` puts them among the
/// sidecar's own.
impl Serialize for Meta {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_map().serialize(s)
    }
}

impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_deref().unwrap_or("{}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Json) -> JsonMap {
        match v {
            Json::Object(m) => m,
            _ => unreachable!("a test gives objects"),
        }
    }

    #[test]
    fn fields_read_back_in_order_with_their_values() {
        let m =
            map(json!({"z": 1, "a": u64::MAX, "f": 0.1, "n": -3, "s": "é\"", "o": {"k": [null]}}));
        let meta = Meta::from(m.clone());
        let back = meta.to_map();
        assert_eq!(back, m);
        assert_eq!(
            back.keys().collect::<Vec<_>>(),
            ["z", "a", "f", "n", "s", "o"]
        );
        assert_eq!(meta.get("a"), Some(json!(u64::MAX)));
    }

    #[test]
    fn an_empty_map_takes_no_text() {
        let meta = Meta::from(JsonMap::new());
        assert!(meta.is_empty());
        assert_eq!(meta, Meta::default());
        assert_eq!(serde_json::to_string(&meta).unwrap(), "{}");
    }

    #[test]
    fn insert_replaces_in_place_and_appends_new_keys() {
        let mut meta = Meta::from(map(json!({"a": 1, "b": 2})));
        meta.insert("a", json!(3));
        meta.insert("c", json!("x"));
        assert_eq!(meta.to_map(), map(json!({"a": 3, "b": 2, "c": "x"})));
        let keys: Vec<String> = meta.to_map().keys().cloned().collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(meta.get("b"), Some(json!(2)));
    }

    #[test]
    fn flattened_into_a_struct_the_fields_come_after_its_own() {
        #[derive(Serialize)]
        struct S<'a> {
            name: &'a str,
            #[serde(flatten)]
            meta: &'a Meta,
        }
        let meta = Meta::from(map(json!({"offset": 8, "size": 4})));
        let text = serde_json::to_string(&S {
            name: "w",
            meta: &meta,
        })
        .unwrap();
        assert_eq!(text, r#"{"name":"w","offset":8,"size":4}"#);
        // Rendered as the map it was made of, pretty or not, nested values
        // and floats included.
        #[derive(Serialize)]
        struct M<'a> {
            name: &'a str,
            #[serde(flatten)]
            meta: &'a JsonMap,
        }
        let m = map(json!({"f": 0.1, "big": u64::MAX, "o": {"k": [1, "é\n", null]}, "e": {}}));
        let meta = Meta::from(m.clone());
        let s = S {
            name: "w",
            meta: &meta,
        };
        let want = M {
            name: "w",
            meta: &m,
        };
        assert_eq!(
            serde_json::to_string_pretty(&s).unwrap(),
            serde_json::to_string_pretty(&want).unwrap()
        );
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            serde_json::to_string(&want).unwrap()
        );
    }
}
