//! Decoded blob bytes -> exposed little-endian bytes of one part, for exactly
//! the range asked. Works on any source of decoded bytes (an mmap slice, a
//! decoded buffer, cached frames), so the mount and the library share it.

use std::borrow::Cow;

use super::dtype::{Endian, swap_elements};
use super::{Part, PartMap};

/// Clamps `[off, off+len)` to the part. Returns `None` past the end.
pub fn clamp(part: &Part, off: u64, len: u64) -> Option<(u64, u64)> {
    if off >= part.nbytes {
        return None;
    }
    Some((off, len.min(part.nbytes - off)))
}

/// The zero-copy case: little-endian (or byte-sized) contiguous elements.
/// Returns the decoded-blob range holding exposed bytes `[off, off+len)`.
pub fn direct_range(part: &Part, off: u64, len: u64) -> Option<(u64, u64)> {
    match part.map {
        PartMap::Contiguous { start }
            if part.order == Endian::Little || part.dtype.swap_unit() == 1 =>
        {
            Some((start + off, len))
        }
        _ => None,
    }
}

/// Exposed bytes `[off, off+len)` of `part` (already clamped), reading the
/// decoded blob through `fetch(blob_offset, out)`.
pub fn gather<E>(
    part: &Part,
    off: u64,
    len: u64,
    fetch: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<Vec<u8>, E> {
    gather_into(Vec::new(), part, off, len, fetch)
}

/// [`gather`] into `buf`, whose contents are replaced (a caller that
/// reuses one buffer spares a fresh allocation, and its page faults, per
/// read).
pub fn gather_into<E>(
    mut buf: Vec<u8>,
    part: &Part,
    off: u64,
    len: u64,
    mut fetch: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<Vec<u8>, E> {
    buf.clear();
    if let Some((at, n)) = direct_range(part, off, len) {
        buf.resize(n as usize, 0);
        fetch(at, &mut buf)?;
        return Ok(buf);
    }
    let es = part.dtype.size();
    let first = off / es;
    let last = (off + len).div_ceil(es);
    buf.resize(((last - first) * es) as usize, 0);
    match part.map {
        PartMap::Contiguous { start } => fetch(start + first * es, &mut buf)?,
        _ => {
            // Elements of records: one fetch per span of records (at most
            // SPAN bytes), not one per element; one per element where the
            // records are so long that a span would copy mostly other bytes.
            const SPAN: u64 = 1 << 20;
            const MAX_STRIDE: u64 = 4 << 10;
            let n = last - first;
            let mut span = Vec::new();
            let mut i = 0;
            while i < n {
                let (run, stride) = part.run_from(first + i, n - i);
                let run = if stride > MAX_STRIDE {
                    1
                } else {
                    run.min(SPAN / stride).max(1)
                };
                span.resize(((run - 1) * stride + es) as usize, 0);
                fetch(part.source_of(first + i), &mut span)?;
                for j in 0..run {
                    let (from, to) = ((j * stride) as usize, ((i + j) * es) as usize);
                    buf[to..to + es as usize].copy_from_slice(&span[from..from + es as usize]);
                }
                i += run;
            }
        }
    }
    if part.order == Endian::Big {
        swap_elements(&mut buf, part.dtype.swap_unit() as usize);
    }
    let skip = (off - first * es) as usize;
    buf.drain(..skip);
    buf.truncate(len as usize);
    Ok(buf)
}

/// Exposed bytes of `part` from a whole decoded blob in memory; borrows when
/// no byte needs moving.
pub fn from_blob<'a>(blob: &'a [u8], part: &Part, off: u64, len: u64) -> Cow<'a, [u8]> {
    let Some((off, len)) = clamp(part, off, len) else {
        return Cow::Borrowed(&[]);
    };
    if let Some((at, n)) = direct_range(part, off, len) {
        return Cow::Borrowed(&blob[at as usize..(at + n) as usize]);
    }
    let copied: Result<Vec<u8>, std::convert::Infallible> = gather(part, off, len, |at, out| {
        out.copy_from_slice(&blob[at as usize..at as usize + out.len()]);
        Ok(())
    });
    match copied {
        Ok(v) => Cow::Owned(v),
        Err(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::DType;

    /// Reference COO records: 7 entries of 3 u64 indices then a u32 value.
    fn records() -> (Vec<u8>, Part, Part) {
        let (nnz, ndim) = (7u64, 3u64);
        let record = 8 * ndim + 4;
        let mut blob = Vec::new();
        for k in 0..nnz {
            for d in 0..ndim {
                blob.extend((100 * d + k).to_be_bytes());
            }
            blob.extend((1000 + k as u32).to_be_bytes());
        }
        let indices = Part {
            name: "indices".into(),
            dtype: DType::Uint64,
            shape: vec![ndim, nnz],
            nbytes: 8 * ndim * nnz,
            blob: 0,
            map: PartMap::CooRecordIndices { nnz, record },
            order: Endian::Big,
            meta: crate::catalog::Meta::default(),
        };
        let values = Part {
            name: "values".into(),
            dtype: DType::Uint32,
            shape: vec![nnz],
            nbytes: 4 * nnz,
            blob: 0,
            map: PartMap::CooRecordValues {
                record,
                value_at: 8 * ndim,
            },
            order: Endian::Big,
            meta: crate::catalog::Meta::default(),
        };
        (blob, indices, values)
    }

    #[test]
    fn record_parts_read_in_spans_match_element_by_element() {
        let (blob, indices, values) = records();
        for part in [&indices, &values] {
            let es = part.dtype.size();
            // Element by element, the plain way.
            let mut want = Vec::new();
            for e in 0..part.nbytes / es {
                let at = part.source_of(e) as usize;
                let mut el = blob[at..at + es as usize].to_vec();
                el.reverse();
                want.extend(el);
            }
            for off in 0..part.nbytes {
                for len in 1..=part.nbytes - off {
                    let mut fetches = 0;
                    let got: Result<Vec<u8>, ()> = gather(part, off, len, |at, out| {
                        fetches += 1;
                        out.copy_from_slice(&blob[at as usize..at as usize + out.len()]);
                        Ok(())
                    });
                    let (o, l) = (off as usize, len as usize);
                    assert_eq!(got.unwrap(), want[o..o + l], "{} {off}+{len}", part.name);
                    // One fetch per coordinate the range touches.
                    assert!(fetches <= 3, "{} {off}+{len}: {fetches} fetches", part.name);
                }
            }
        }
    }
}
