//! Simple attributes (numbers, booleans and strings, scalar or
//! one-dimensional, stored in the header) as JSON for the sidecar and the
//! index. Others are skipped: shared types, compound and reference values,
//! attributes in dense storage.

use super::header::{self, Elem, Message};
use super::read::{Cur, H5};
use crate::catalog::{Json, JsonMap};

/// Values one attribute may show.
const MAX_VALUES: u64 = 1024;
/// Bytes one string value may show.
const MAX_STRING: u64 = 64 << 10;
/// Attributes one object may show.
const MAX_ATTRS: usize = 256;

/// The simple attributes among `msgs`, by name.
pub fn collect(f: &H5, msgs: &[Message]) -> JsonMap {
    let mut out = JsonMap::new();
    for m in msgs.iter().filter(|m| m.kind == 0x0C).take(MAX_ATTRS) {
        if let Some((k, v)) = attribute(f, m.body) {
            out.insert(k, v);
        }
    }
    out
}

fn attribute(f: &H5, body: &[u8]) -> Option<(String, Json)> {
    let mut c = Cur::new(body, f.o, f.l);
    let version = c.u8("").ok()?;
    let flags = c.u8("").ok()?;
    if flags & 0x03 != 0 {
        return None; // shared datatype or dataspace
    }
    let nn = c.u16("").ok()? as usize;
    let nt = c.u16("").ok()? as usize;
    let ns = c.u16("").ok()? as usize;
    let pad = |n: usize| if version == 1 { n.div_ceil(8) * 8 } else { n };
    match version {
        1 | 2 => {}
        3 => c.skip(1, "").ok()?,
        _ => return None,
    }
    let name = c.bytes(pad(nn), "").ok()?;
    let name = name.get(..nn.checked_sub(1)?)?;
    let name = std::str::from_utf8(name).ok()?.to_string();
    let dt = c.bytes(pad(nt), "").ok()?.get(..nt)?;
    let ds = c.bytes(pad(ns), "").ok()?.get(..ns)?;
    let shape = header::dataspace(ds, f.l).ok()??;
    if shape.len() > 1 {
        return None;
    }
    let count = shape.iter().product::<u64>();
    if count > MAX_VALUES {
        return None;
    }
    let scalar = shape.is_empty();
    let class = dt.first()? & 0x0f;
    let (size, elem) = header::datatype(dt).ok()?;
    let data = &body[c.pos..];
    let bytes = count.checked_mul(size)?;
    let data = data.get(..usize::try_from(bytes).ok()?)?;
    let mut values = Vec::new();
    let each = usize::try_from(size).ok()?.max(1);
    for v in data.chunks_exact(each) {
        let j = match (&elem, class) {
            (Ok(e), _) => number(e, v)?,
            (Err(_), 3) => text(dt, v),
            (Err(_), 9) if dt.get(1).is_some_and(|b| b & 0x0f == 1) => vlen_string(f, v)?,
            _ => return None,
        };
        values.push(j);
    }
    let value = if scalar {
        values.pop()?
    } else {
        Json::Array(values)
    };
    Some((name, value))
}

/// A fixed-length string of datatype `dt`, without its padding (the
/// datatype's: null-terminated, null-padded or space-padded): text, or
/// `{"$bytes": hex}` where it is not UTF-8, as h5py gives such bytes.
fn text(dt: &[u8], b: &[u8]) -> Json {
    let pad = dt.get(1).map_or(0, |x| x & 0x0f);
    let s = match pad {
        0 => &b[..b.iter().position(|&x| x == 0).unwrap_or(b.len())],
        2 => b.trim_ascii_end(),
        _ => &b[..b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1)],
    };
    utf8_or_bytes(s)
}

fn utf8_or_bytes(s: &[u8]) -> Json {
    match std::str::from_utf8(s) {
        Ok(t) => Json::String(t.to_string()),
        Err(_) => crate::formats::cbor_json::bytes(s),
    }
}

fn number(e: &Elem, v: &[u8]) -> Option<Json> {
    let mut b = v.to_vec();
    if matches!(
        e,
        Elem::Int { big: true, .. } | Elem::Float { big: true, .. }
    ) {
        b.reverse();
    }
    let u = b.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x));
    Some(match *e {
        Elem::Bool => Json::Bool(u != 0),
        Elem::Int { signed: false, .. } => u.into(),
        Elem::Int { size, .. } => {
            let shift = 64 - 8 * u32::from(size);
            (((u << shift) as i64) >> shift).into()
        }
        Elem::Float { size, .. } => {
            let x = match size {
                2 => f16_to_f64(u as u16),
                4 => f64::from(f32::from_bits(u as u32)),
                _ => f64::from_bits(u),
            };
            crate::formats::cbor_json::float(x)
        }
    })
}

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f64::from(h & 0x3ff);
    sign * match exp {
        0 => man * 2f64.powi(-24),
        31 if man == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + man / 1024.0) * 2f64.powi(e - 15),
    }
}

/// A variable-length string: length, global heap collection, object index.
fn vlen_string(f: &H5, v: &[u8]) -> Option<Json> {
    let mut c = Cur::new(v, f.o, f.l);
    let len = u64::from(c.u32("").ok()?);
    let coll = c.addr("").ok()?;
    let index = c.u32("").ok()?;
    if len > MAX_STRING {
        return None;
    }
    if f.undefined(coll) || len == 0 {
        return Some(Json::String(String::new()));
    }
    let mut g = f.at(coll, "").ok()?;
    g.tag(b"GCOL", "").ok()?;
    g.skip(4, "").ok()?;
    let size = g.len("").ok()?;
    let mut g = f.span(coll, size, "").ok()?;
    g.skip(8 + f.l, "").ok()?;
    while g.left() >= 8 + f.l {
        let i = g.u16("").ok()?;
        if i == 0 {
            return None;
        }
        g.skip(6, "").ok()?;
        let n = g.len("").ok()?;
        let padded = usize::try_from(n.div_ceil(8).checked_mul(8)?).ok()?;
        let obj = g.bytes(padded, "").ok()?;
        if u32::from(i) == index {
            let s = obj.get(..usize::try_from(len.min(n)).ok()?)?;
            return Some(utf8_or_bytes(s));
        }
    }
    None
}
