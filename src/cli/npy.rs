//! Just enough of the `.npy` format to stream an array into `pack`.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::catalog::{DType, Endian};

pub struct Npy {
    pub dtype: DType,
    pub endian: Endian,
    pub shape: Vec<u64>,
    /// Positioned at the first data byte.
    pub reader: BufReader<File>,
}

pub fn open(path: &Path) -> Result<Npy, String> {
    let label = path.display();
    let f = File::open(path).map_err(|e| format!("{label}: {e}"))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut pre = [0u8; 10];
    r.read_exact(&mut pre)
        .map_err(|_| format!("{label}: not a .npy file (too short)"))?;
    if &pre[..6] != b"\x93NUMPY" {
        return Err(format!("{label}: not a .npy file (bad magic)"));
    }
    let hlen = match pre[6] {
        1 => u16::from_le_bytes([pre[8], pre[9]]) as usize,
        2 | 3 => {
            let mut more = [0u8; 2];
            r.read_exact(&mut more)
                .map_err(|_| format!("{label}: truncated .npy header"))?;
            u32::from_le_bytes([pre[8], pre[9], more[0], more[1]]) as usize
        }
        v => return Err(format!("{label}: unsupported .npy version {v}")),
    };
    if hlen > 1 << 20 {
        return Err(format!(
            "{label}: .npy header of {hlen} bytes is implausible"
        ));
    }
    let mut header = vec![0u8; hlen];
    r.read_exact(&mut header)
        .map_err(|_| format!("{label}: truncated .npy header"))?;
    let header = String::from_utf8_lossy(&header);
    let descr =
        field(&header, "descr").ok_or_else(|| format!("{label}: .npy header lacks 'descr'"))?;
    let descr = descr.trim().trim_matches(|c| c == '\'' || c == '"');
    if field(&header, "fortran_order").is_some_and(|v| v.trim().starts_with("True")) {
        return Err(format!(
            "{label}: Fortran-order arrays are not supported; save np.ascontiguousarray(a)"
        ));
    }
    let shape_txt =
        field(&header, "shape").ok_or_else(|| format!("{label}: .npy header lacks 'shape'"))?;
    let shape = shape_txt
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<u64>()
                .map_err(|_| format!("{label}: bad shape {shape_txt}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // A byte-order mark, if any ('=' is native: this crate runs on
    // little-endian hosts only). `descr` is any text the file holds.
    let (endian, code) = if let Some(c) = descr.strip_prefix(['<', '|', '=']) {
        (Endian::Little, c)
    } else if let Some(c) = descr.strip_prefix('>') {
        (Endian::Big, c)
    } else {
        (Endian::Little, descr)
    };
    let dtype = match code {
        "f8" => DType::Float64,
        "f4" => DType::Float32,
        "f2" => DType::Float16,
        "i8" => DType::Int64,
        "i4" => DType::Int32,
        "i2" => DType::Int16,
        "i1" => DType::Int8,
        "u8" => DType::Uint64,
        "u4" => DType::Uint32,
        "u2" => DType::Uint16,
        "u1" => DType::Uint8,
        "b1" => DType::Bool,
        // ml_dtypes' bfloat16 is saved as an opaque 2-byte void type.
        "V2" => DType::BFloat16,
        _ => {
            return Err(format!(
                "{label}: dtype {descr:?} has no zTensor equivalent"
            ));
        }
    };
    Ok(Npy {
        dtype,
        endian,
        shape,
        reader: r,
    })
}

/// The text after `'key':` up to the next top-level comma.
fn field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = header[at..].trim_start().strip_prefix(':')?;
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..i]),
            _ => {}
        }
    }
    Some(rest)
}
