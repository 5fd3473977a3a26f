//! The zTensor v0.1 element types and what each one looks like to numpy.

/// One of the 13 element types of zTensor v0.1.
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
}

impl DType {
    pub const ALL: [DType; 13] = [
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

    /// Parses the name used in the index (`"float32"`, ...).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The name used in the index.
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
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::Float64 | DType::Int64 | DType::Uint64 => 8,
            DType::Float32 | DType::Int32 | DType::Uint32 => 4,
            DType::Float16 | DType::BFloat16 | DType::Int16 | DType::Uint16 => 2,
            DType::Int8 | DType::Uint8 | DType::Bool => 1,
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
        assert_eq!(DType::from_name("complex64"), None);
    }

    #[test]
    fn swap_reverses_each_element() {
        let mut b = [1u8, 2, 3, 4, 5, 6, 7, 8];
        swap_elements(&mut b, 4);
        assert_eq!(b, [4, 3, 2, 1, 8, 7, 6, 5]);
    }
}
