//! A walk over a GGUF header that counts what decoding its key/values
//! would cost, before `ztensor-compat` decodes them: that crate makes a
//! value per array element (some 40 bytes each, on top of string bytes),
//! so a header of a 100 MB array would take gigabytes. The same walk goes
//! on over the tensor infos to find where the header ends: the bytes the
//! crate reads at open, which a remote object must have present first.
//! Nothing is allocated here; every length is checked against the bytes.

/// Bytes a decoded value takes beyond its own bytes: an enum and a vector
/// slot as the crate holds it, then the same again as the JSON value the
/// index keeps, with the allocator's rounding (measured: a header of 3
/// million empty strings or single bytes took some 100 bytes a value at
/// mount, where 48 were counted).
const PER_VALUE: u64 = 112;
/// Times a string's bytes are held: the crate's copy and the JSON copy.
const STRING_COPIES: u64 = 2;

/// What decoding the header's key/values would take, in bytes, and its
/// tensor infos once laid out as tensors ([`crate::catalog::cost`]), or
/// why the key/values are broken (the crate then says the same in its own
/// words). Counting stops at a tensor info that is cut short: the crate
/// refuses that.
pub fn decoded_cost(b: &[u8]) -> Result<u64, String> {
    use crate::catalog::cost;
    let mut r = Reader {
        b,
        whole: b.len() as u64,
        at: 0,
        short: false,
        alignment: DEFAULT_ALIGNMENT,
    };
    let (tensors, mut total) = r.kvs()?;
    for i in 0..tensors {
        let Ok(n) = r.u64() else { break };
        let at = r.at;
        let Ok(name) = r.take(n) else { break };
        // Named here, as the crate's refusal names neither tensor nor byte.
        let Ok(name) = std::str::from_utf8(name) else {
            return Err(format!(
                "the name of tensor {i} (at byte {at}) is not UTF-8"
            ));
        };
        let name_cost = cost::name_cost(name);
        let Ok(dims) = r.u32() else { break };
        if r.skip(u64::from(dims) * 8 + 4 + 8).is_err() {
            // The bytes `take` gave, taken again (it holds the reader).
            let bytes = b
                .get(at..)
                .and_then(|x| x.get(..n as usize))
                .unwrap_or_default();
            let name = String::from_utf8_lossy(bytes);
            // A count past what ggml allows (4) that the file cannot hold
            // is that tensor's fault, not a matter of --index-memory.
            if dims > GGML_MAX_DIMS {
                return Err(format!(
                    "tensor {name:?} (tensor {i}, at byte {at}) declares {dims} dimensions \
                     (GGUF allows {GGML_MAX_DIMS}), more than the rest of the file holds"
                ));
            }
            break;
        }
        total = total
            .saturating_add(name_cost)
            .saturating_add(u64::from(dims).saturating_mul(8))
            .saturating_add(cost::TENSOR_COST);
    }
    Ok(total)
}

/// The most dimensions ggml gives a tensor.
const GGML_MAX_DIMS: u32 = 4;

/// The data section's alignment when the header sets none.
const DEFAULT_ALIGNMENT: u64 = 32;

/// Each tensor's name and the file offset its bytes start at, in the order
/// of the header's tensor-info table (to name the tensors of a refusal
/// that gives only offsets).
pub fn tensor_starts(b: &[u8]) -> Result<Vec<(String, u64)>, String> {
    Ok(tensor_infos(b)?
        .into_iter()
        .map(|(n, start, _)| (n, start))
        .collect())
}

/// Each tensor's name, the file offset its bytes start at and its ggml
/// type, in the order of the header's tensor-info table.
pub fn tensor_infos(b: &[u8]) -> Result<Vec<(String, u64, u32)>, String> {
    let mut r = Reader {
        b,
        whole: b.len() as u64,
        at: 0,
        short: false,
        alignment: DEFAULT_ALIGNMENT,
    };
    let (tensors, _) = r.kvs()?;
    let mut infos = Vec::new();
    for _ in 0..tensors {
        let n = r.u64()?;
        let name = String::from_utf8_lossy(r.take(n)?).into_owned();
        let dims = r.u32()?;
        r.skip(u64::from(dims) * 8)?;
        let ty = r.u32()?;
        infos.push((name, r.u64()?, ty));
    }
    let align = r.alignment.max(1);
    let data = (r.at as u64).div_ceil(align).saturating_mul(align);
    Ok(infos
        .into_iter()
        .map(|(n, off, ty)| (n, data.saturating_add(off), ty))
        .collect())
}

/// The tensors' names in the order of the header's tensor-info table.
pub fn tensor_order(b: &[u8]) -> Result<Vec<String>, String> {
    Ok(tensor_starts(b)?.into_iter().map(|(n, _)| n).collect())
}

/// Where a header whose first bytes are `prefix` ends (past its last
/// tensor info): what the crate reads at open, the data section's
/// alignment padding aside.
#[derive(Debug, PartialEq, Eq)]
pub enum Extent {
    /// The header ends at this offset, within `prefix`.
    Ends(u64),
    /// It runs past `prefix`, within the file: more of it is needed to say.
    Short,
    /// It is broken within `prefix` (the crate refuses it too).
    Broken(String),
}

/// The end of the header whose first bytes are `prefix`, of a file of
/// `whole` bytes (see [`Extent`]): a length running past the file is
/// broken, not short.
pub fn extent(prefix: &[u8], whole: u64) -> Extent {
    let mut r = Reader {
        b: prefix,
        whole,
        at: 0,
        short: false,
        alignment: DEFAULT_ALIGNMENT,
    };
    let walked = r.kvs().and_then(|(tensors, _)| {
        for _ in 0..tensors {
            let name = r.u64()?;
            r.skip(name)?;
            let dims = r.u32()?;
            if dims > 64 {
                return Err(format!("a tensor of {dims} dimensions"));
            }
            // Each dimension, then the type and the offset.
            r.skip(u64::from(dims) * 8 + 4 + 8)?;
        }
        Ok(r.at as u64)
    });
    match walked {
        Ok(end) => Extent::Ends(end),
        Err(_) if r.short => Extent::Short,
        Err(why) => Extent::Broken(why),
    }
}

struct Reader<'a> {
    b: &'a [u8],
    /// The file's length (`b` may be a prefix of it).
    whole: u64,
    at: usize,
    /// The last failure was a length running past the bytes.
    short: bool,
    /// `general.alignment`, once the key/values are read.
    alignment: u64,
}

impl Reader<'_> {
    /// The magic, version and counts, then the key/values: the tensor
    /// count and what the key/values cost decoded.
    fn kvs(&mut self) -> Result<(u64, u64), String> {
        if self.take(4)? != b"GGUF" {
            return Err("no GGUF magic".into());
        }
        let version = self.u32()?;
        // gguf-py writes big-endian files on request, version included.
        let swapped = version.swap_bytes();
        if version > 0xffff && (1..=0xffff).contains(&swapped) {
            return Err(format!(
                "a big-endian GGUF file (version {swapped}); only little-endian GGUF is read"
            ));
        }
        if version < 2 {
            return Err(format!("GGUF version {version} is not read"));
        }
        let tensors = self.u64()?;
        let kvs = self.u64()?;
        let mut cost = 0u64;
        // llama.cpp refuses a key given twice (gguf-py warns); the crate
        // keeps the last, which for `general.alignment` moves every tensor.
        let mut seen = std::collections::HashSet::new();
        let bytes = self.b;
        for _ in 0..kvs {
            let key = self.u64()?;
            let from = self.at;
            self.take(key)?;
            let name = &bytes[from..self.at];
            let Ok(shown) = std::str::from_utf8(name) else {
                return Err(format!("the key at byte {from} is not UTF-8"));
            };
            if !seen.insert(name) {
                return Err(format!(
                    "the key {:?} is given twice",
                    String::from_utf8_lossy(name)
                ));
            }
            let is_alignment = name == b"general.alignment";
            let ty = self.u32()?;
            if is_alignment
                && ty == 4
                && let Some(v) = self.b.get(self.at..self.at + 4)
            {
                self.alignment = u64::from(u32::from_le_bytes([v[0], v[1], v[2], v[3]]));
            }
            cost = cost.saturating_add(PER_VALUE.saturating_add(key.saturating_mul(STRING_COPIES)));
            let value = self
                .value(ty, 0)
                .map_err(|why| format!("the value of key {shown:?}: {why}"))?;
            cost = cost.saturating_add(value);
        }
        Ok((tensors, cost))
    }

    fn take(&mut self, n: u64) -> Result<&[u8], String> {
        let want = (self.at as u64).saturating_add(n);
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.at.checked_add(n))
            .filter(|&e| e <= self.b.len());
        // Past the bytes at hand but within the file: more is needed.
        self.short = end.is_none() && want <= self.whole;
        let end =
            end.ok_or_else(|| format!("a length of {n} bytes at {} runs past the file", self.at))?;
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
                let at = self.at;
                // The crate refuses a string that is not UTF-8 in words that
                // name no key: said here, and the caller names the key.
                if std::str::from_utf8(self.take(n)?).is_err() {
                    return Err(format!("the string at byte {at} is not UTF-8"));
                }
                Ok(n.saturating_mul(STRING_COPIES))
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
    fn a_big_endian_file_is_named_so() {
        let mut b = header(&[]);
        b[4..8].copy_from_slice(&3u32.to_be_bytes());
        let why = decoded_cost(&b).unwrap_err();
        assert_eq!(
            why,
            "a big-endian GGUF file (version 3); only little-endian GGUF is read"
        );
    }

    #[test]
    fn the_extent_runs_past_the_tensor_infos_and_says_when_it_needs_more() {
        let mut b = header(&[("general.alignment", 4, 32u32.to_le_bytes().to_vec())]);
        // Two tensor infos: name, dims, each dim, type, offset.
        b[8..16].copy_from_slice(&2u64.to_le_bytes());
        for (name, dims) in [("a", vec![4u64]), ("bb", vec![2, 3])] {
            b.extend((name.len() as u64).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(0u32.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        let end = b.len() as u64;
        b.extend([0u8; 100]);
        let whole = b.len() as u64;
        assert_eq!(extent(&b, whole), Extent::Ends(end));
        for cut in [3, 20, end as usize - 1] {
            assert_eq!(extent(&b[..cut], whole), Extent::Short, "cut at {cut}");
        }
        // The file itself ends before the header does.
        assert!(matches!(
            extent(&b[..20], 20),
            Extent::Broken(why) if why.contains("runs past")
        ));
        let mut bad = b.clone();
        bad[..4].copy_from_slice(b"GGUX");
        assert!(matches!(extent(&bad, whole), Extent::Broken(_)));
        // A key length past the file is broken at once, not a reason to
        // fetch more of it.
        let mut lie = b.clone();
        lie[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(extent(&lie[..64], whole), Extent::Broken(_)));
    }

    #[test]
    fn a_tensor_of_more_dimensions_than_the_file_holds_is_named() {
        // One tensor info, "t", claiming 2^31 dimensions in a 100-byte file.
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.push(b't');
        b.extend((1u32 << 31).to_le_bytes());
        b.extend([0u8; 64]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dims.gguf");
        std::fs::write(&path, &b).unwrap();
        let Err(e) = crate::formats::open(&path, Default::default()) else {
            panic!("mounted a tensor of 2^31 dimensions");
        };
        let msg = e.to_string();
        assert!(
            msg.ends_with(
                "tensor \"t\" (tensor 0, at byte 32) declares 2147483648 dimensions (GGUF \
                 allows 4), more than the rest of the file holds"
            ),
            "{msg}"
        );
        assert!(
            msg.contains("dims.gguf") && !msg.contains("--index-memory"),
            "{msg}"
        );
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
