//! The `.npy` header of a tensor: numpy's format 1.0 (2.0 when the header
//! needs more than 64 KiB), padded so the data starts at a multiple of 64,
//! as numpy itself writes it, or, for a tensor of [`PAGE_ALIGN_MIN`] bytes
//! or more, at a multiple of 4096: the format allows any padding, and data
//! on a page boundary lets a clone of the tensor's blocks back the view
//! (`mount::backing`) and a mapping of the view map whole pages of it.

use std::borrow::Cow;

use super::{Composed, Entry, FileId, Made, Placed, Registration, Source, View};
use crate::catalog::{Catalog, DType, Part};

pub const VIEW: Registration = Registration {
    name: "npy",
    dir: ".npy",
    mirrors: true,
    path_of: |dir, path| format!("{dir}/{path}.npy"),
    make,
};

fn make(_: &Source<'_>) -> Result<Box<dyn View>, String> {
    Ok(Box::new(Npy))
}

/// `.npy/PATH.npy` for each tensor of one dense part numpy has a type for:
/// its header, then the part's bytes.
struct Npy;

impl View for Npy {
    fn tensor_files(&self, ti: usize, part: &Part, leaf: &str) -> Vec<Placed> {
        if descr(part.dtype).is_none() || part.shape.len() > MAX_DIMS {
            return Vec::new();
        }
        let file = FileId {
            kind: 0,
            tensor: Some(ti),
        };
        vec![Placed {
            path: vec![format!("{leaf}.npy").into()],
            what: Made::Data(file),
        }]
    }

    fn data(&self, c: &Catalog, f: FileId) -> Option<Composed<'_>> {
        let ti = f.tensor?;
        let p = c.tensors.get(ti)?.parts.as_ref().ok()?.first()?;
        let header = header(p)?;
        let start = header.len() as u64;
        let entry = Entry {
            start,
            len: p.nbytes,
            tensor: ti,
        };
        Some(Composed {
            header: header.into(),
            entries: Cow::Owned(vec![entry]),
            size: start + p.nbytes,
            is_source: false,
        })
    }
}

const MAGIC: &[u8] = b"\x93NUMPY";
/// The most dimensions numpy reads (`NPY_MAXDIMS` since numpy 2.0; 1.x
/// stops at 32): a tensor of more gets no `.npy` that would only fail.
pub const MAX_DIMS: usize = 64;
/// Where numpy starts the data: the least alignment of a view's.
const ALIGN: usize = 64;
/// A page, and the block of the filesystems that clone (XFS, btrfs, ext4's
/// 4 KiB default): the data of a large tensor's view starts on one.
const PAGE: usize = 4096;
/// The least tensor whose view's data starts on a [`PAGE`]: at 1 MiB the
/// header is at most 0.4% of the file, and a smaller tensor's view gains
/// little from a clone (its open's round trip, not its bytes, is its
/// cost), so it stays as numpy would write it.
pub const PAGE_ALIGN_MIN: u64 = 1 << 20;

/// numpy's type string for the exposed bytes, where one is honest. numpy
/// has no bfloat16 or 8-bit floats: those are given as opaque void
/// elements of their size (`|V2`, `|V1`), which claim nothing about their
/// meaning (view them as the ml_dtypes type). Packed 4-bit pairs have no
/// element numpy can address, so they get no `.npy`.
pub fn descr(d: DType) -> Option<&'static str> {
    match d {
        DType::BFloat16 => Some("|V2"),
        DType::Float8E4M3Fn
        | DType::Float8E5M2
        | DType::Float8E4M3Fnuz
        | DType::Float8E5M2Fnuz
        | DType::Float8E8M0Fnu => Some("|V1"),
        DType::Float4E2M1FnX2 => None,
        other => Some(other.numpy()),
    }
}

/// The header for `part` (little-endian C-order elements), or `None` when
/// numpy has no honest type for it.
pub fn header(part: &Part) -> Option<Vec<u8>> {
    let descr = descr(part.dtype)?;
    let shape = match part.shape.as_slice() {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let align = if part.nbytes >= PAGE_ALIGN_MIN {
        PAGE
    } else {
        ALIGN
    };
    // magic + version + length field, then the dict padded with spaces and
    // ended by a newline.
    for (version, len_bytes) in [(1u8, 2usize), (2, 4)] {
        let fixed = MAGIC.len() + 2 + len_bytes;
        let total = (fixed + dict.len() + 1).next_multiple_of(align);
        let hlen = total - fixed;
        if len_bytes == 2 && hlen > u16::MAX as usize {
            continue;
        }
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[version, 0]);
        if len_bytes == 2 {
            out.extend_from_slice(&(hlen as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(hlen as u32).to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        out.resize(total - 1, b' ');
        out.push(b'\n');
        return Some(out);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Endian, Part};

    fn part(dtype: DType, shape: Vec<u64>) -> Part {
        let n = shape.iter().product::<u64>() * dtype.size();
        Part::dense(dtype, shape, n, 0, Endian::Little)
    }

    #[test]
    fn headers_are_padded_to_64_and_say_the_shape() {
        let h = header(&part(DType::Float32, vec![3, 4])).unwrap();
        assert_eq!(h.len() % 64, 0);
        assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
        assert_eq!(u16::from_le_bytes([h[8], h[9]]) as usize, h.len() - 10);
        let text = String::from_utf8_lossy(&h[10..]);
        assert!(text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"));
        assert!(text.ends_with(" \n"));
        let scalar = header(&part(DType::Int8, vec![])).unwrap();
        assert!(String::from_utf8_lossy(&scalar).contains("'shape': ()"));
        let one = header(&part(DType::Uint8, vec![7])).unwrap();
        assert!(String::from_utf8_lossy(&one).contains("'shape': (7,)"));
        assert!(header(&part(DType::Float4E2M1FnX2, vec![4])).is_none());
    }

    #[test]
    fn a_tensor_of_a_mebibyte_or_more_has_its_data_on_a_page() {
        let small = header(&part(DType::Float32, vec![PAGE_ALIGN_MIN / 4 - 1])).unwrap();
        assert_eq!(small.len(), 128);
        let big = header(&part(DType::Float32, vec![1024, 256])).unwrap();
        assert_eq!(big.len(), 4096);
        assert_eq!(u16::from_le_bytes([big[8], big[9]]) as usize, 4096 - 10);
        let text = String::from_utf8_lossy(&big[10..]);
        assert!(
            text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (1024, 256), }")
        );
        assert!(text[..text.len() - 1].trim_end().ends_with('}'));
        assert!(text.ends_with(" \n"));
    }

    #[test]
    fn a_huge_shape_takes_format_2() {
        let h = header(&part(DType::Float32, vec![1; 30_000])).unwrap();
        assert_eq!(&h[6..8], &[2, 0]);
        assert_eq!(h.len() % 64, 0);
        let n = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
        assert_eq!(n, h.len() - 12);
    }
}
