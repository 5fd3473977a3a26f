//! Decoded blob bytes -> exposed little-endian bytes of one part, for exactly
//! the range asked. Works on any source of decoded bytes (an mmap slice, a
//! decoded buffer, cached frames), so the mount and the library share it.

use std::borrow::Cow;

use super::catalog::{Part, PartMap};
use super::dtype::{Endian, swap_elements};

/// Clamps `[off, off+len)` to the part. Returns `None` past the end.
pub fn clamp(part: &Part, off: u64, len: u64) -> Option<(u64, u64)> {
    if off >= part.nbytes {
        return None;
    }
    Some((off, len.min(part.nbytes - off)))
}

/// The zero-copy case: little-endian (or byte-sized) contiguous elements.
/// Returns the decoded-blob range holding exposed bytes `[off, off+len)`.
pub fn direct_range(part: &Part, endian: Endian, off: u64, len: u64) -> Option<(u64, u64)> {
    match part.map {
        PartMap::Contiguous { start } if endian == Endian::Little || part.dtype.size() == 1 => {
            Some((start + off, len))
        }
        _ => None,
    }
}

/// Exposed bytes `[off, off+len)` of `part` (already clamped), reading the
/// decoded blob through `fetch(blob_offset, out)`.
pub fn gather<E>(
    part: &Part,
    endian: Endian,
    off: u64,
    len: u64,
    mut fetch: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
) -> Result<Vec<u8>, E> {
    if let Some((at, n)) = direct_range(part, endian, off, len) {
        let mut out = vec![0u8; n as usize];
        fetch(at, &mut out)?;
        return Ok(out);
    }
    let es = part.dtype.size();
    let first = off / es;
    let last = (off + len).div_ceil(es);
    let mut buf = vec![0u8; ((last - first) * es) as usize];
    match part.map {
        PartMap::Contiguous { start } => fetch(start + first * es, &mut buf)?,
        _ => {
            for (i, chunk) in buf.chunks_exact_mut(es as usize).enumerate() {
                fetch(part.source_of(first + i as u64), chunk)?;
            }
        }
    }
    if endian == Endian::Big {
        swap_elements(&mut buf, es as usize);
    }
    let skip = (off - first * es) as usize;
    buf.drain(..skip);
    buf.truncate(len as usize);
    Ok(buf)
}

/// Exposed bytes of `part` from a whole decoded blob in memory; borrows when
/// no byte needs moving.
pub fn from_blob<'a>(
    blob: &'a [u8],
    part: &Part,
    endian: Endian,
    off: u64,
    len: u64,
) -> Cow<'a, [u8]> {
    let Some((off, len)) = clamp(part, off, len) else {
        return Cow::Borrowed(&[]);
    };
    if let Some((at, n)) = direct_range(part, endian, off, len) {
        return Cow::Borrowed(&blob[at as usize..(at + n) as usize]);
    }
    let copied: Result<Vec<u8>, std::convert::Infallible> =
        gather(part, endian, off, len, |at, out| {
            out.copy_from_slice(&blob[at as usize..at as usize + out.len()]);
            Ok(())
        });
    match copied {
        Ok(v) => Cow::Owned(v),
        Err(never) => match never {},
    }
}
