//! A walk over a GGUF header's key/value section that counts what decoding
//! it would cost, before `ztensor-compat` decodes it: that crate makes a
//! value per array element (some 40 bytes each, on top of string bytes),
//! so a header of a 100 MB array would take gigabytes. Nothing is
//! allocated here; every length is checked against the file.

/// Bytes a decoded value takes beyond its own bytes (an enum and a vector
/// slot, as the crate holds it).
const PER_VALUE: u64 = 48;

/// What decoding the header's key/values would take, in bytes, or why the
/// header is broken (the crate then says the same in its own words).
pub fn decoded_cost(b: &[u8]) -> Result<u64, String> {
    walk(b, false).map(|(cost, _)| cost)
}

/// The tensors' names in the order of the header's tensor-info table.
pub fn tensor_order(b: &[u8]) -> Result<Vec<String>, String> {
    walk(b, true).map(|(_, names)| names)
}

fn walk(b: &[u8], infos: bool) -> Result<(u64, Vec<String>), String> {
    let mut r = Reader { b, at: 0 };
    if r.take(4)? != b"GGUF" {
        return Err("no GGUF magic".into());
    }
    let version = r.u32()?;
    if version < 2 {
        return Err(format!("GGUF version {version} is not read"));
    }
    let tensors = r.u64()?;
    let kvs = r.u64()?;
    let mut cost = 0u64;
    for _ in 0..kvs {
        let key = r.u64()?;
        r.skip(key)?;
        let ty = r.u32()?;
        cost = cost.saturating_add(PER_VALUE + key);
        cost = cost.saturating_add(r.value(ty, 0)?);
    }
    let mut names = Vec::new();
    if infos {
        // Each info: name, n_dims, the dims, type, offset. Every length is
        // checked against the file before anything is kept.
        for _ in 0..tensors {
            let n = r.u64()?;
            let name = String::from_utf8_lossy(r.take(n)?).into_owned();
            let dims = r.u32()?;
            r.skip(u64::from(dims) * 8)?;
            r.skip(4 + 8)?;
            names.push(name);
        }
    }
    Ok((cost, names))
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: u64) -> Result<&[u8], String> {
        let n = usize::try_from(n).map_err(|_| "a length past the file".to_string())?;
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("a length of {n} bytes at {} runs past the file", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        self.take(n).map(|_| ())
    }

    fn u32(&mut self) -> Result<u32, String> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    /// Skips one value of type `ty`, giving what it costs decoded.
    fn value(&mut self, ty: u32, depth: u32) -> Result<u64, String> {
        if let Some(size) = scalar_size(ty) {
            self.skip(size)?;
            return Ok(0);
        }
        match ty {
            8 => {
                let n = self.u64()?;
                self.skip(n)?;
                Ok(n)
            }
            9 if depth < 4 => {
                let ety = self.u32()?;
                let count = self.u64()?;
                let mut cost = count.saturating_mul(PER_VALUE);
                if let Some(size) = scalar_size(ety) {
                    // Checked against the file before anything is counted.
                    self.skip(count.checked_mul(size).ok_or("an array length overflows")?)?;
                    return Ok(cost);
                }
                for _ in 0..count {
                    cost = cost.saturating_add(self.value(ety, depth + 1)?);
                }
                Ok(cost)
            }
            9 => Err("arrays nested too deeply".into()),
            other => Err(format!("unknown GGUF value type {other}")),
        }
    }
}

fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in kvs {
            b.extend((k.len() as u64).to_le_bytes());
            b.extend(k.as_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        b
    }

    #[test]
    fn arrays_cost_per_element_and_lengths_are_checked() {
        let mut arr = 4u32.to_le_bytes().to_vec();
        arr.extend(1000u64.to_le_bytes());
        arr.extend(vec![0u8; 4000]);
        let cost = decoded_cost(&header(&[("a", 9, arr)])).unwrap();
        assert!(cost >= 1000 * PER_VALUE, "{cost}");
        // An array that says it holds more than the file.
        let mut lie = 4u32.to_le_bytes().to_vec();
        lie.extend((1u64 << 40).to_le_bytes());
        assert!(decoded_cost(&header(&[("a", 9, lie)])).is_err());
        let mut huge = 4u32.to_le_bytes().to_vec();
        huge.extend(u64::MAX.to_le_bytes());
        assert!(decoded_cost(&header(&[("a", 9, huge)])).is_err());
        assert!(decoded_cost(b"GGUF").is_err());
    }

    #[test]
    fn a_header_too_big_for_the_index_memory_is_refused_before_decoding() {
        let mut arr = 4u32.to_le_bytes().to_vec();
        arr.extend(100_000u64.to_le_bytes());
        arr.extend(vec![0u8; 400_000]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.gguf");
        std::fs::write(&path, header(&[("tokens", 9, arr)])).unwrap();
        let small = crate::formats::Limits {
            index_memory: 1 << 20,
        };
        let Err(e) = crate::formats::open(&path, small) else {
            panic!("a 4.8 MB decode under a 1 MiB limit was let through");
        };
        let msg = e.to_string();
        assert!(
            msg.contains("big.gguf") && msg.contains("--index-memory"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }
}
