//! Helpers shared by the integration tests: deterministic tensor contents,
//! CBOR building blocks and hand-assembled zTensor files.
#![allow(dead_code)]

use ciborium::value::{Integer, Value};
use ztensor_mount::formats::zt_v01::DType;

pub const MAGIC: &[u8; 8] = b"ZTEN0001";

/// `n` elements of `dtype` as little-endian bytes. Every byte of an element
/// differs from its neighbours, so a missing or doubled byte swap shows up.
/// Bools are 0/1 as the format requires.
pub fn sample(dtype: DType, n: usize) -> Vec<u8> {
    let es = dtype.size() as usize;
    if dtype == DType::Bool {
        return (0..n).map(|i| u8::from(i % 3 != 1)).collect();
    }
    let mut out = Vec::with_capacity(n * es);
    for i in 0..n {
        for b in 0..es {
            out.push((i * 31 + b * 7 + 1) as u8);
        }
    }
    out
}

/// Reverses every `es`-byte element: LE <-> BE.
pub fn swapped(bytes: &[u8], es: usize) -> Vec<u8> {
    let mut v = bytes.to_vec();
    if es > 1 {
        for c in v.chunks_exact_mut(es) {
            c.reverse();
        }
    }
    v
}

pub fn le_u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn text(s: &str) -> Value {
    Value::Text(s.to_string())
}

pub fn uint(n: u64) -> Value {
    Value::Integer(Integer::from(n))
}

pub fn sint(n: i64) -> Value {
    Value::Integer(Integer::from(n))
}

pub fn shape(dims: &[u64]) -> Value {
    Value::Array(dims.iter().map(|&d| uint(d)).collect())
}

/// A map with text keys, in the given order.
pub fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (text(k), v)).collect())
}

/// A complete dense metadata entry.
pub fn entry(
    name: &str,
    offset: u64,
    size: u64,
    dtype: &str,
    dims: &[u64],
    encoding: &str,
) -> Vec<(&'static str, Value)> {
    vec![
        ("name", text(name)),
        ("offset", uint(offset)),
        ("size", uint(size)),
        ("dtype", text(dtype)),
        ("shape", shape(dims)),
        ("encoding", text(encoding)),
    ]
}

/// Fields for `Writer::add_blob`, which adds `offset` and `size` itself.
pub fn fields(pairs: Vec<(&str, Value)>) -> Vec<(Value, Value)> {
    pairs.into_iter().map(|(k, v)| (text(k), v)).collect()
}

pub fn cbor(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::ser::into_writer(v, &mut out).expect("encode CBOR");
    out
}

/// Magic, then `data` (which starts at file offset 8), then the index bytes
/// exactly as given and the trailing little-endian size.
pub fn assemble(data: &[u8], index: &[u8]) -> Vec<u8> {
    let mut f = MAGIC.to_vec();
    f.extend_from_slice(data);
    f.extend_from_slice(index);
    f.extend_from_slice(&(index.len() as u64).to_le_bytes());
    f
}

/// A data region holding `blobs` at the given absolute offsets (each >= 8),
/// zero-filled in between; returned bytes start at file offset 8.
pub fn data_region(blobs: &[(u64, &[u8])]) -> Vec<u8> {
    let end = blobs
        .iter()
        .map(|(o, b)| *o as usize + b.len())
        .max()
        .unwrap_or(8);
    let mut d = vec![0u8; end - 8];
    for (o, b) in blobs {
        let at = *o as usize - 8;
        d[at..at + b.len()].copy_from_slice(b);
    }
    d
}

/// A file whose index is the CBOR array of `entries`.
pub fn file_with(blobs: &[(u64, &[u8])], entries: Vec<Value>) -> Vec<u8> {
    assemble(&data_region(blobs), &cbor(&Value::Array(entries)))
}
