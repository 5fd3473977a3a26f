//! The API's answer for a revision (`{"sha": …, "siblings": [{"rfilename":
//! …, "size": …, "lfs": {"size": …}}, …], …}`), parsed as it is read: a
//! repo may list millions of files, and a `serde_json::Value` of them
//! takes some 17 times the answer's size. Each file costs its name and a
//! fixed overhead, counted against `--index-memory` as it comes; anything
//! else in the answer is skipped unread.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// What a file of the list costs beside its name: its entry, its size,
/// its place in the check for repeats.
const FILE_COST: u64 = 48;

/// The answer's commit (whatever `sha` holds, when it is text) and files
/// (name, size) in the order listed.
#[derive(Debug, Default)]
pub(super) struct Answer {
    pub(super) sha: Option<String>,
    pub(super) files: Vec<(String, Option<u64>)>,
}

/// Parses `body`, refusing a list of files that would take more than
/// `limit` bytes.
pub(super) fn parse(body: &[u8], limit: u64) -> Result<Answer, String> {
    let mut d = serde_json::Deserializer::from_slice(body);
    let over = std::cell::Cell::new(None);
    let answer = d
        .deserialize_map(Top { limit, over: &over })
        .map_err(|e| match over.take() {
            Some(why) => why,
            None => format!("the Hub's answer is not JSON of a revision: {e}"),
        })?;
    d.end()
        .map_err(|e| format!("the Hub's answer is not JSON of a revision: {e}"))?;
    Ok(answer)
}

struct Top<'o> {
    limit: u64,
    /// Why the list was refused, where it was too long.
    over: &'o std::cell::Cell<Option<String>>,
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = Answer;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Answer, A::Error> {
        let mut answer = Answer::default();
        while let Some(key) = m.next_key::<Cow<'de, str>>()? {
            match &*key {
                "sha" => {
                    let sha = m.next_value::<Lenient<Text>>()?.0.0;
                    answer.sha = sha.map(Cow::into_owned);
                }
                "siblings" => {
                    let (limit, over) = (self.limit, self.over);
                    answer.files = m.next_value_seed(Files { limit, over })?;
                }
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(answer)
    }
}

/// The `siblings` list, as (name, size), each counted as it comes.
struct Files<'o> {
    limit: u64,
    over: &'o std::cell::Cell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for Files<'_> {
    type Value = Vec<(String, Option<u64>)>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Files<'_> {
    type Value = Vec<(String, Option<u64>)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of files")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
        let mut files = Vec::new();
        let mut cost = 0u64;
        while let Some(Lenient(f)) = s.next_element::<Lenient<Sibling>>()? {
            let Some(name) = f.name else { continue };
            cost += name.len() as u64 + FILE_COST;
            if cost > self.limit {
                self.over.set(Some(format!(
                    "the Hub lists more files than the {} --index-memory allows for their \
                     list (over it at file {}); raise --index-memory",
                    crate::size::bytes(self.limit),
                    files.len() + 1
                )));
                return Err(de::Error::custom("too many files"));
            }
            let size = f.lfs_size.or(f.size);
            files.push((name.into_owned(), size));
        }
        Ok(files)
    }

    /// Anything else is no list: none.
    fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_map(m).map(|_| Vec::new())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
}

/// What the answer says of a file, where it says it in the expected
/// shape: a value of another shape (a number for a name, a list for a
/// size) is skipped, however nested, and says nothing.
#[derive(Default)]
struct Sibling<'de> {
    name: Option<Cow<'de, str>>,
    size: Option<u64>,
    lfs_size: Option<u64>,
}

/// A value that is text, else none.
#[derive(Default)]
struct Text<'de>(Option<Cow<'de, str>>);

/// A value that is a count of bytes, else none.
#[derive(Default)]
struct Count(Option<u64>);

/// The `size` an `lfs` object gives, else none.
#[derive(Default)]
struct LfsSize(Option<u64>);

/// A type read from the one shape of value it takes; any other gives its
/// default.
trait Shape<'de>: Default + Sized {
    fn from_u64(_: u64) -> Self {
        Self::default()
    }
    fn from_str(_: Cow<'de, str>) -> Self {
        Self::default()
    }
    fn from_map<A: MapAccess<'de>>(m: A) -> Result<Self, A::Error> {
        IgnoredAny.visit_map(m).map(|_| Self::default())
    }
}

impl<'de> Shape<'de> for Text<'de> {
    fn from_str(s: Cow<'de, str>) -> Self {
        Text(Some(s))
    }
}

impl<'de> Shape<'de> for Count {
    fn from_u64(n: u64) -> Self {
        Count(Some(n))
    }
}

impl<'de> Shape<'de> for LfsSize {
    fn from_map<A: MapAccess<'de>>(mut m: A) -> Result<Self, A::Error> {
        let mut size = None;
        while let Some(key) = m.next_key::<Cow<'de, str>>()? {
            match &*key {
                "size" => size = m.next_value::<Lenient<Count>>()?.0.0,
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(LfsSize(size))
    }
}

impl<'de> Shape<'de> for Sibling<'de> {
    fn from_map<A: MapAccess<'de>>(mut m: A) -> Result<Self, A::Error> {
        let mut s = Sibling::default();
        while let Some(key) = m.next_key::<Cow<'de, str>>()? {
            match &*key {
                "rfilename" => s.name = m.next_value::<Lenient<Text>>()?.0.0,
                "size" => s.size = m.next_value::<Lenient<Count>>()?.0.0,
                "lfs" => s.lfs_size = m.next_value::<Lenient<LfsSize>>()?.0.0,
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(s)
    }
}

/// `T`, read leniently (see [`Shape`]).
struct Lenient<T>(T);

impl<'de, T: Shape<'de>> serde::Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor(std::marker::PhantomData))
            .map(Lenient)
    }
}

struct ShapeVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Shape<'de>> Visitor<'de> for ShapeVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_u64<E>(self, n: u64) -> Result<T, E> {
        Ok(T::from_u64(n))
    }
    fn visit_f64<E>(self, _: f64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<T, E> {
        Ok(T::from_str(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<T, E> {
        Ok(T::from_str(Cow::Owned(s.to_string())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<T, A::Error> {
        IgnoredAny.visit_seq(s).map(|_| T::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<T, A::Error> {
        T::from_map(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commit_and_files_are_read_and_the_rest_skipped() {
        let body = br#"{"id": "o/r", "sha": "abc1234", "cardData": {"a": [1, {"b": 2}]},
            "siblings": [
                {"rfilename": "model.safetensors", "size": 8, "lfs": {"size": 9, "oid": "x"}},
                {"rfilename": "config.json", "size": 3},
                {"rfilename": "a\"b", "size": "12"},
                {"rfilename": 7, "size": 1},
                {"size": 1},
                {"rfilename": "c", "size": -1, "lfs": null},
                {"rfilename": "d", "size": [1], "lfs": {"size": {"x": 1}}}
            ], "tags": ["x"]}"#;
        let a = parse(body, 1 << 20).unwrap();
        assert_eq!(a.sha.as_deref(), Some("abc1234"));
        let want: Vec<(String, Option<u64>)> = vec![
            ("model.safetensors".into(), Some(9)),
            ("config.json".into(), Some(3)),
            ("a\"b".into(), None),
            ("c".into(), None),
            ("d".into(), None),
        ];
        assert_eq!(a.files, want);
    }

    #[test]
    fn odd_shapes_give_nothing_not_an_error() {
        for body in [
            &br#"{"sha": 5, "siblings": {"a": 1}}"#[..],
            br#"{"siblings": null}"#,
            br#"{"siblings": "x", "sha": [1]}"#,
            br#"{"siblings": [1, "a", null, [], {"rfilename": {"x": [1]}}]}"#,
            br#"{}"#,
        ] {
            let a = parse(body, 1 << 20).unwrap();
            assert!(a.sha.is_none() && a.files.is_empty());
        }
        assert!(parse(b"[1]", 1 << 20).is_err());
        assert!(parse(b"{\"sha\": \"a\"} x", 1 << 20).is_err());
        assert!(parse(b"{\"siblings\": [", 1 << 20).is_err());
    }

    #[test]
    fn a_list_over_the_limit_is_refused_naming_it() {
        let names: Vec<String> = (0..100)
            .map(|i| format!("{{\"rfilename\": \"f{i:04}\"}}"))
            .collect();
        let body = format!(
            "{{\"sha\": \"abc1234\", \"siblings\": [{}]}}",
            names.join(",")
        );
        // 100 files of 5 bytes each: 5300 bytes.
        assert_eq!(parse(body.as_bytes(), 5300).unwrap().files.len(), 100);
        let e = parse(body.as_bytes(), 5299).unwrap_err();
        assert!(
            e == "the Hub lists more files than the 5.2 KiB --index-memory allows for their list \
                 (over it at file 100); raise --index-memory",
            "{e}"
        );
    }
}
