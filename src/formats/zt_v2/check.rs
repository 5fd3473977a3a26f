//! Data rules of the sparse layouts, checked when the file is opened.
//!
//! The spec checks these "when the object is assembled", and no digest
//! covers them (a file can carry a matching digest over bad indices). The
//! mount serves each part as its own file and never assembles the matrix,
//! so they are checked once, here, before anything is served: the indices
//! are read in order through the mapping (raw parts) or decoded one
//! seek-table frame at a time (at most 16 MiB held), so the work is one
//! pass over the index parts and the memory is bounded. A violation
//! refuses the whole file (spec §1.1: readers MUST reject), in one line
//! naming the tensor.

use std::collections::HashSet;

/// Reads the little-endian unsigned elements of one part in order.
pub struct Elements<'a> {
    stored: &'a [u8],
    /// `(stored, decoded)` frames; `None` for raw bytes.
    frames: Option<&'a [(u64, u64)]>,
    width: usize,
    /// The current decoded frame (zstd) and where we are in it.
    buf: Vec<u8>,
    pos: usize,
    frame: usize,
    stored_at: usize,
}

impl<'a> Elements<'a> {
    /// Elements of `width` bytes (4 or 8) from a raw part's bytes.
    pub fn raw(bytes: &'a [u8], width: usize) -> Self {
        Elements {
            stored: bytes,
            frames: None,
            width,
            buf: Vec::new(),
            pos: 0,
            frame: 0,
            stored_at: 0,
        }
    }

    /// Elements from the frames (from a checked seek table) of a
    /// `zt.zstd-seekable/1` part.
    pub fn zstd(stored: &'a [u8], frames: &'a [(u64, u64)], width: usize) -> Self {
        Elements {
            stored,
            frames: Some(frames),
            width,
            buf: Vec::new(),
            pos: 0,
            frame: 0,
            stored_at: 0,
        }
    }

    fn byte(&mut self) -> Result<Option<u8>, String> {
        let Some(frames) = self.frames else {
            let b = self.stored.get(self.pos).copied();
            self.pos += 1;
            return Ok(b);
        };
        while self.pos >= self.buf.len() {
            let Some(&(c, d)) = frames.get(self.frame) else {
                return Ok(None);
            };
            let end = self.stored_at.saturating_add(c as usize);
            let src = self
                .stored
                .get(self.stored_at..end)
                .ok_or("a frame lies outside the part")?;
            crate::codec::zstd::decode_frame(src, &mut self.buf, d as usize)?;
            self.stored_at = end;
            self.frame += 1;
            self.pos = 0;
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(Some(b))
    }

    /// The next element, `None` at the end (a trailing partial element is
    /// an error).
    pub fn next_elem(&mut self) -> Result<Option<u64>, String> {
        if self.frames.is_none() {
            let Some(s) = self.stored.get(self.pos..self.pos + self.width) else {
                return if self.pos >= self.stored.len() {
                    Ok(None)
                } else {
                    Err("the part ends inside an element".into())
                };
            };
            self.pos += self.width;
            let mut b = [0u8; 8];
            b[..self.width].copy_from_slice(s);
            return Ok(Some(u64::from_le_bytes(b)));
        }
        let mut b = [0u8; 8];
        for (i, slot) in b.iter_mut().take(self.width).enumerate() {
            match self.byte()? {
                Some(x) => *slot = x,
                None if i == 0 => return Ok(None),
                None => return Err("the part ends inside an element".into()),
            }
        }
        Ok(Some(u64::from_le_bytes(b)))
    }

    fn need(&mut self, what: &str) -> Result<u64, String> {
        self.next_elem()?
            .ok_or_else(|| format!("'{what}' ends early"))
    }
}

/// The `zt.sparse_csr/1` data rules: `indptr[0] == 0`, `indptr`
/// non-decreasing, `indptr[rows] == nnz`, column indices strictly
/// increasing within each row and below `cols`.
pub fn csr(
    indptr: &mut Elements,
    indices: &mut Elements,
    rows: u64,
    cols: u64,
    nnz: u64,
) -> Result<(), String> {
    let first = indptr.need("indptr")?;
    if first != 0 {
        return Err(format!("zt.sparse_csr/1: indptr[0] is {first}, not 0"));
    }
    let mut prev = 0u64;
    for r in 0..rows {
        let next = indptr.need("indptr")?;
        if next < prev {
            return Err(format!(
                "zt.sparse_csr/1: indptr decreases at row {r} ({prev} then {next})"
            ));
        }
        if next > nnz {
            return Err(format!(
                "zt.sparse_csr/1: indptr[{}] = {next} is past nnz {nnz}",
                r + 1
            ));
        }
        let mut last: Option<u64> = None;
        for _ in prev..next {
            let col = indices.need("indices")?;
            if col >= cols {
                return Err(format!(
                    "zt.sparse_csr/1: row {r} has column index {col}, not below {cols}"
                ));
            }
            if last.is_some_and(|l| col <= l) {
                return Err(format!(
                    "zt.sparse_csr/1: column indices of row {r} are not strictly increasing"
                ));
            }
            last = Some(col);
        }
        prev = next;
    }
    if prev != nnz {
        return Err(format!(
            "zt.sparse_csr/1: indptr[{rows}] is {prev}, not nnz {nnz}"
        ));
    }
    Ok(())
}

/// Most coordinates whose uniqueness is checked (8 bytes each are held):
/// past this a COO tensor is listed as unsupported rather than served
/// unchecked.
pub const MAX_COO_CHECK: u64 = 1 << 24;

/// The `zt.sparse_coo/1` data rules: every coordinate in dimension `d`
/// below `shape[d]`, no cell named twice. `Ok(Err(reason))` when the
/// tensor is too large to check.
pub fn coo(
    coords: &mut Elements,
    shape: &[u64],
    nnz: u64,
) -> Result<std::result::Result<(), String>, String> {
    let ndim = shape.len() as u64;
    let total = nnz.saturating_mul(ndim);
    if total > MAX_COO_CHECK {
        return Ok(Err(format!(
            "zt.sparse_coo/1 with {total} coordinates: more than the {MAX_COO_CHECK} \
             this reader checks for uniqueness"
        )));
    }
    let mut all = Vec::with_capacity(total as usize);
    for (d, &extent) in shape.iter().enumerate() {
        for i in 0..nnz {
            let c = coords.need("coords")?;
            if c >= extent {
                return Err(format!(
                    "zt.sparse_coo/1: element {i} has coordinate {c} in dimension {d}, \
                     not below {extent}"
                ));
            }
            all.push(c);
        }
    }
    let n = nnz as usize;
    let mut seen = HashSet::with_capacity(n);
    for i in 0..n {
        let cell: Vec<u64> = (0..shape.len()).map(|d| all[d * n + i]).collect();
        if !seen.insert(cell) {
            return Err(format!(
                "zt.sparse_coo/1: element {i} names a cell an earlier element names"
            ));
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le32(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn csr_rules() {
        let ok = |ip: &[u32], ix: &[u32]| {
            let (a, b) = (le32(ip), le32(ix));
            csr(
                &mut Elements::raw(&a, 4),
                &mut Elements::raw(&b, 4),
                ip.len() as u64 - 1,
                4,
                ix.len() as u64,
            )
        };
        assert!(ok(&[0, 2, 3], &[0, 3, 1]).is_ok());
        assert!(ok(&[1, 2, 3], &[0, 3, 1]).is_err());
        assert!(ok(&[0, 2, 1], &[0, 3, 1]).is_err());
        assert!(ok(&[0, 2, 3], &[3, 0, 1]).is_err());
        assert!(ok(&[0, 2, 3], &[0, 4, 1]).is_err());
        assert!(ok(&[0, 2, 2], &[0, 3, 1]).is_err());
    }

    #[test]
    fn coo_rules() {
        let run = |c: &[u32], shape: &[u64]| {
            let b = le32(c);
            let nnz = c.len() as u64 / shape.len() as u64;
            coo(&mut Elements::raw(&b, 4), shape, nnz)
        };
        assert_eq!(run(&[0, 1, 2, 0], &[2, 3]), Ok(Ok(())));
        assert!(run(&[0, 2, 2, 0], &[2, 3]).is_err());
        assert!(run(&[0, 0, 1, 1], &[2, 3]).is_err());
    }
}
