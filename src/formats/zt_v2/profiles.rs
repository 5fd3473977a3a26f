//! Metadata rules of the registered layout profiles the `ztensor` crate
//! does not register itself (it checks `dense` and `zt.sparse_csr/1`):
//! `zt.sparse_coo/1`, `zt.mx/1`, `gguf.<type>/1` and `zt.quant_group/1`,
//! from `spec/profiles/`. The mount does not dequantize: it serves each
//! part as a file and shows the profile's attributes in the sidecar, so
//! these rules are what makes those files the sizes the profile says.
//! A violation is the tensor's reason to be listed as unsupported.

use ztensor2::format::cbor::Value;
use ztensor2::format::{DType as V2, Object, Part};

type Rule = Result<(), String>;

fn attr<'a>(obj: &'a Object, key: &str) -> Option<&'a Value> {
    match obj.attributes.as_ref()? {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| matches!(k, Value::Text(t) if t == key))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn sub<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| matches!(k, Value::Text(t) if t == key))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn uint(v: Option<&Value>, what: &str) -> Result<u64, String> {
    match v {
        Some(Value::Uint(n)) => Ok(*n),
        Some(_) => Err(format!("attribute {what} is not an unsigned integer")),
        None => Err(format!("attribute {what} is missing")),
    }
}

fn text<'a>(v: Option<&'a Value>, what: &str) -> Result<&'a str, String> {
    match v {
        Some(Value::Text(t)) => Ok(t),
        Some(_) => Err(format!("attribute {what} is not text")),
        None => Err(format!("attribute {what} is missing")),
    }
}

/// Decoded size of `n` elements of a part's type, when it is known.
pub fn size_of(part: &Part, n: u64) -> Option<u64> {
    match part.logical.as_deref() {
        None => n.checked_mul(part.dtype.width()),
        Some("bool" | "f8_e4m3fn" | "f8_e5m2" | "f8_e4m3fnuz" | "f8_e5m2fnuz" | "f8_e8m0") => {
            Some(n)
        }
        Some("f4_e2m1") => Some(n.div_ceil(2)),
        Some("complex64") => n.checked_mul(8),
        Some("complex128") => n.checked_mul(16),
        Some(_) => None,
    }
}

fn exactly(obj: &Object, names: &[&str], layout: &str) -> Rule {
    let have: Vec<&str> = obj.parts.keys().map(String::as_str).collect();
    let mut want = names.to_vec();
    want.sort_unstable();
    if have != want {
        return Err(format!(
            "{layout} requires exactly the parts {want:?}, the object has {have:?}"
        ));
    }
    Ok(())
}

fn elements(obj: &Object) -> Result<u64, String> {
    obj.num_elements().map_err(|e| e.to_string())
}

fn plain_index(p: &Part, what: &str, layout: &str) -> Result<u64, String> {
    if !matches!(p.dtype, V2::U32 | V2::U64) || p.logical.is_some() {
        return Err(format!("{layout}: '{what}' must be plain u32 or u64"));
    }
    Ok(p.dtype.width())
}

fn sized(p: &Part, expected: Option<u64>, what: &str, layout: &str) -> Rule {
    match expected {
        Some(e) if e == p.decoded_size() => Ok(()),
        Some(e) => Err(format!(
            "{layout}: '{what}' holds {} bytes, the profile says {e}",
            p.decoded_size()
        )),
        None => Err(format!("{layout}: the size of '{what}' cannot be computed")),
    }
}

/// `zt.sparse_coo/1`: returns `nnz`.
pub fn coo(obj: &Object) -> Result<u64, String> {
    const L: &str = "zt.sparse_coo/1";
    if obj.shape.is_empty() {
        return Err(format!("{L} requires rank >= 1"));
    }
    exactly(obj, &["values", "coords"], L)?;
    let (coords, values) = (&obj.parts["coords"], &obj.parts["values"]);
    let w = plain_index(coords, "coords", L)?;
    let per = w * obj.shape.len() as u64;
    if coords.decoded_size() % per != 0 {
        return Err(format!("{L}: 'coords' size is not a multiple of {per}"));
    }
    let nnz = coords.decoded_size() / per;
    sized(values, size_of(values, nnz), "values", L)?;
    Ok(nnz)
}

/// `zt.mx/1`.
pub fn mx(obj: &Object) -> Rule {
    const L: &str = "zt.mx/1";
    exactly(obj, &["data", "scales"], L)?;
    let (data, scales) = (&obj.parts["data"], &obj.parts["scales"]);
    if scales.dtype != V2::U8 || scales.logical.as_deref() != Some("f8_e8m0") {
        return Err(format!("{L}: 'scales' must be u8 of type f8_e8m0"));
    }
    match (data.logical.as_deref(), data.dtype) {
        (Some("f4_e2m1" | "f8_e4m3fn" | "f8_e5m2"), V2::U8) | (None, V2::I8) => {}
        _ => return Err(format!("{L}: 'data' is not a registered MX element type")),
    }
    if text(attr(obj, "scale_form"), "scale_form")? != "e8m0_exponent" {
        return Err(format!("{L}: scale_form must be \"e8m0_exponent\""));
    }
    let block = uint(attr(obj, "block_size"), "block_size")?;
    let rank = obj.shape.len() as u64;
    let axis = match attr(obj, "axis") {
        None => rank
            .checked_sub(1)
            .ok_or(format!("{L} requires rank >= 1"))?,
        v => uint(v, "axis")?,
    };
    let along = usize::try_from(axis)
        .ok()
        .and_then(|a| obj.shape.get(a))
        .ok_or(format!("{L}: axis {axis} is not below the rank {rank}"))?;
    if block < 2 || along % block != 0 {
        return Err(format!(
            "{L}: block_size {block} does not divide shape[axis] = {along}"
        ));
    }
    let n = elements(obj)?;
    sized(data, size_of(data, n), "data", L)?;
    sized(scales, Some(n / block), "scales", L)
}

/// `gguf.<type>/1`.
pub fn gguf(obj: &Object, layout: &str) -> Rule {
    exactly(obj, &["data"], layout)?;
    let data = &obj.parts["data"];
    if data.dtype != V2::U8 || data.logical.is_some() {
        return Err(format!("{layout}: 'data' must be plain u8"));
    }
    let per = uint(attr(obj, "elems_per_block"), "elems_per_block")?;
    let bytes = uint(attr(obj, "block_bytes"), "block_bytes")?;
    let n = elements(obj)?;
    if per == 0 || bytes == 0 || n % per != 0 {
        return Err(format!(
            "{layout}: elems_per_block {per} / block_bytes {bytes} do not fit {n} elements"
        ));
    }
    sized(data, (n / per).checked_mul(bytes), "data", layout)
}

/// `zt.quant_group/1`.
pub fn quant_group(obj: &Object) -> Rule {
    const L: &str = "zt.quant_group/1";
    let bits = uint(attr(obj, "bits"), "bits")?;
    let group = uint(attr(obj, "group_size"), "group_size")?;
    let axis = uint(attr(obj, "axis"), "axis")?;
    let packing = attr(obj, "packing").ok_or(format!("{L}: attribute packing is missing"))?;
    let word = text(sub(packing, "word"), "packing.word")?;
    let order = text(sub(packing, "order"), "packing.order")?;
    let per_word = uint(sub(packing, "per_word"), "packing.per_word")?;
    let scale_form = text(attr(obj, "scale_form"), "scale_form")?;
    let zp = attr(obj, "zero_point").ok_or(format!("{L}: attribute zero_point is missing"))?;
    let form = text(sub(zp, "form"), "zero_point.form")?;
    let word_w: u64 = match word {
        "u8" => 1,
        "u16" => 2,
        "u32" => 4,
        "u64" => 8,
        _ => return Err(format!("{L}: packing.word {word:?} is not u8/u16/u32/u64")),
    };
    if !matches!(order, "lsb_first" | "msb_first") {
        return Err(format!("{L}: packing.order {order:?} is unknown"));
    }
    if !matches!(bits, 2..=6 | 8)
        || !(8 * word_w).is_multiple_of(bits)
        || per_word != 8 * word_w / bits
    {
        return Err(format!(
            "{L}: bits {bits} and per_word {per_word} do not fit a {word} word"
        ));
    }
    let with_zeros = match form {
        "none" => false,
        "implied" => {
            if !matches!(sub(zp, "value"), Some(Value::Uint(_) | Value::Nint(_))) {
                return Err(format!("{L}: zero_point.value is missing"));
            }
            false
        }
        "tensor" => true,
        _ => return Err(format!("{L}: zero_point.form {form:?} is unknown")),
    };
    if with_zeros {
        exactly(obj, &["data", "scales", "zeros"], L)?;
    } else {
        exactly(obj, &["data", "scales"], L)?;
    }
    let (data, scales) = (&obj.parts["data"], &obj.parts["scales"]);
    if data.logical.is_some()
        || data.dtype.width() != word_w
        || !matches!(
            data.dtype,
            V2::U8 | V2::U16 | V2::U32 | V2::U64 | V2::I8 | V2::I16 | V2::I32 | V2::I64
        )
    {
        return Err(format!(
            "{L}: 'data' must be an integer type of the {word} word"
        ));
    }
    match scale_form {
        "f32_factors" | "f16_factors"
            if matches!(scales.dtype, V2::F64 | V2::F32 | V2::F16 | V2::BF16) => {}
        "e8m0_exponent"
            if scales.dtype == V2::U8 && scales.logical.as_deref() == Some("f8_e8m0") => {}
        _ => {
            return Err(format!(
                "{L}: scale_form {scale_form:?} does not fit 'scales'"
            ));
        }
    }
    let along = usize::try_from(axis)
        .ok()
        .and_then(|a| obj.shape.get(a).copied())
        .ok_or(format!("{L}: axis {axis} is not below the rank"))?;
    if group != 0 && (along % group != 0) {
        return Err(format!(
            "{L}: group_size {group} does not divide shape[axis] = {along}"
        ));
    }
    let codes = elements(obj)?;
    let groups = along.checked_div(group).unwrap_or(along);
    let lanes = codes.checked_div(along).unwrap_or(0);
    let per_group = groups.checked_mul(lanes);
    sized(data, (codes / per_word).checked_mul(word_w), "data", L)?;
    sized(
        scales,
        per_group.and_then(|g| g.checked_mul(scales.dtype.width())),
        "scales",
        L,
    )?;
    if with_zeros {
        let zeros = &obj.parts["zeros"];
        let expected = match text(sub(zp, "packing"), "zero_point.packing")? {
            "plain" => per_group.and_then(|g| g.checked_mul(zeros.dtype.width())),
            "same_as_data" => per_group.and_then(|g| (g / per_word).checked_mul(word_w)),
            other => return Err(format!("{L}: zero_point.packing {other:?} is unknown")),
        };
        sized(zeros, expected, "zeros", L)?;
    }
    Ok(())
}
