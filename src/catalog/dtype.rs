//! Element types of exposed files, whatever the format, and what each one
//! looks like to numpy. Names are TensorStore's where it has one.

/// The element type of an exposed file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Float64,
    Float32,
    Float16,
    BFloat16,
    Int64,
    Int32,
    Int16,
    Int8,
    Uint64,
    Uint32,
    Uint16,
    Uint8,
    Bool,
    Float8E4M3Fn,
    Float8E5M2,
    Float8E4M3Fnuz,
    Float8E5M2Fnuz,
    Float8E8M0Fnu,
    /// OCP MXFP4: two 4-bit elements per byte, low nibble first.
    Float4E2M1FnX2,
    Complex64,
    Complex128,
}

impl DType {
    /// The 13 element types of zTensor v0.1 (and v1).
    pub const V01: [DType; 13] = [
        DType::Float64,
        DType::Float32,
        DType::Float16,
        DType::BFloat16,
        DType::Int64,
        DType::Int32,
        DType::Int16,
        DType::Int8,
        DType::Uint64,
        DType::Uint32,
        DType::Uint16,
        DType::Uint8,
        DType::Bool,
    ];

    pub const ALL: [DType; 21] = [
        DType::Float64,
        DType::Float32,
        DType::Float16,
        DType::BFloat16,
        DType::Int64,
        DType::Int32,
        DType::Int16,
        DType::Int8,
        DType::Uint64,
        DType::Uint32,
        DType::Uint16,
        DType::Uint8,
        DType::Bool,
        DType::Float8E4M3Fn,
        DType::Float8E5M2,
        DType::Float8E4M3Fnuz,
        DType::Float8E5M2Fnuz,
        DType::Float8E8M0Fnu,
        DType::Float4E2M1FnX2,
        DType::Complex64,
        DType::Complex128,
    ];

    /// Parses a name [`DType::name`] gives.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// One of zTensor v0.1's 13 names (`"float32"`, ...).
    pub fn from_v01_name(name: &str) -> Option<DType> {
        DType::V01.into_iter().find(|d| d.name() == name)
    }

    /// Our name for it: zTensor v0.1's for its 13 types, TensorStore's
    /// for the rest (`float4_e2m1fn_x2`: two per byte, as ml_dtypes and
    /// PyTorch name the packed pair).
    pub fn name(self) -> &'static str {
        match self {
            DType::Float64 => "float64",
            DType::Float32 => "float32",
            DType::Float16 => "float16",
            DType::BFloat16 => "bfloat16",
            DType::Int64 => "int64",
            DType::Int32 => "int32",
            DType::Int16 => "int16",
            DType::Int8 => "int8",
            DType::Uint64 => "uint64",
            DType::Uint32 => "uint32",
            DType::Uint16 => "uint16",
            DType::Uint8 => "uint8",
            DType::Bool => "bool",
            DType::Float8E4M3Fn => "float8_e4m3fn",
            DType::Float8E5M2 => "float8_e5m2",
            DType::Float8E4M3Fnuz => "float8_e4m3fnuz",
            DType::Float8E5M2Fnuz => "float8_e5m2fnuz",
            DType::Float8E8M0Fnu => "float8_e8m0fnu",
            DType::Float4E2M1FnX2 => "float4_e2m1fn_x2",
            DType::Complex64 => "complex64",
            DType::Complex128 => "complex128",
        }
    }

    /// Bytes per stored unit: an element, or for packed 4-bit types the
    /// byte that holds two.
    pub fn size(self) -> u64 {
        match self {
            DType::Complex128 => 16,
            DType::Float64 | DType::Int64 | DType::Uint64 | DType::Complex64 => 8,
            DType::Float32 | DType::Int32 | DType::Uint32 => 4,
            DType::Float16 | DType::BFloat16 | DType::Int16 | DType::Uint16 => 2,
            _ => 1,
        }
    }

    /// Bytes that are reversed together to change byte order: a complex
    /// number's real and imaginary halves each.
    pub fn swap_unit(self) -> u64 {
        match self {
            DType::Complex64 | DType::Complex128 => self.size() / 2,
            _ => self.size(),
        }
    }

    /// Bytes that `count` elements take (`None` on overflow).
    pub fn nbytes(self, count: u64) -> Option<u64> {
        match self {
            DType::Float4E2M1FnX2 => Some(count.div_ceil(2)),
            _ => count.checked_mul(self.size()),
        }
    }

    /// The numpy type string of the exposed (little-endian) bytes. numpy has
    /// no bfloat16: its bytes are exposed as `<u2` and the sidecar says how to
    /// widen them (see [`DType::numpy_note`]).
    pub fn numpy(self) -> &'static str {
        match self {
            DType::Float64 => "<f8",
            DType::Float32 => "<f4",
            DType::Float16 => "<f2",
            DType::BFloat16 => "<u2",
            DType::Int64 => "<i8",
            DType::Int32 => "<i4",
            DType::Int16 => "<i2",
            DType::Int8 => "|i1",
            DType::Uint64 => "<u8",
            DType::Uint32 => "<u4",
            DType::Uint16 => "<u2",
            DType::Uint8 => "|u1",
            DType::Bool => "|b1",
            DType::Float8E4M3Fn
            | DType::Float8E5M2
            | DType::Float8E4M3Fnuz
            | DType::Float8E5M2Fnuz
            | DType::Float8E8M0Fnu
            | DType::Float4E2M1FnX2 => "|u1",
            DType::Complex64 => "<c8",
            DType::Complex128 => "<c16",
        }
    }

    /// Extra advice for types numpy cannot name directly.
    pub fn numpy_note(self) -> Option<&'static str> {
        match self {
            DType::BFloat16 => Some(
                "numpy has no bfloat16: read as '<u2' and widen with \
                 (a.astype('<u4') << 16).view('<f4'), or use \
                 torch.from_file(path, dtype=torch.bfloat16) or ml_dtypes.bfloat16",
            ),
            DType::Float8E4M3Fn
            | DType::Float8E5M2
            | DType::Float8E4M3Fnuz
            | DType::Float8E5M2Fnuz
            | DType::Float8E8M0Fnu => Some(
                "numpy has no 8-bit floats: read as '|u1' and view as the \
                 ml_dtypes type of the same name (a.view(ml_dtypes.float8_e4m3fn))",
            ),
            DType::Float4E2M1FnX2 => Some(
                "two 4-bit floats per byte, low nibble first; the file holds \
                 ceil(n/2) bytes for n elements: read as '|u1' and unpack \
                 (ml_dtypes.float4_e2m1fn)",
            ),
            _ => None,
        }
    }

    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DType::Int64
                | DType::Int32
                | DType::Int16
                | DType::Int8
                | DType::Uint64
                | DType::Uint32
                | DType::Uint16
                | DType::Uint8
        )
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Byte order of multi-byte elements in a stored blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endian {
    Little,
    Big,
}

impl Endian {
    pub fn name(self) -> &'static str {
        match self {
            Endian::Little => "little",
            Endian::Big => "big",
        }
    }
}

/// Reverses the bytes of each `elem`-byte element of `buf` in place.
/// `buf.len()` must be a multiple of `elem`.
pub fn swap_elements(buf: &mut [u8], elem: usize) {
    if elem <= 1 {
        return;
    }
    for chunk in buf.chunks_exact_mut(elem) {
        chunk.reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_v01_name("complex64"), None);
        assert_eq!(DType::from_v01_name("float32"), Some(DType::Float32));
    }

    #[test]
    fn swap_reverses_each_element() {
        let mut b = [1u8, 2, 3, 4, 5, 6, 7, 8];
        swap_elements(&mut b, 4);
        assert_eq!(b, [4, 3, 2, 1, 8, 7, 6, 5]);
    }
}
