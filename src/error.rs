//! One error type for reading files. Every error renders as one
//! line naming the file, the tensor (when there is one) and the problem.

use std::fmt;

/// What went wrong, for callers that react differently (and for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be opened, mapped or read.
    Io,
    /// Not a file of any format read here: bad magic or too short.
    NotZtensor,
    /// A format recognised by its first bytes that is not read.
    NotSupported,
    /// The trailing index is unreadable: bad size, bad CBOR, wrong shape.
    Index,
    /// A tensor's metadata is missing a field or has an ill-typed/invalid one.
    Field,
    /// A blob's position is impossible: misaligned, out of the data region,
    /// overlapping another.
    Placement,
    /// Declared sizes disagree with each other.
    Size,
    /// Two tensors share a name.
    Duplicate,
    /// The tensor's bytes fail a check: bad zstd stream, wrong decoded
    /// length, checksum mismatch, or the file changed under us.
    Data,
    /// The tensor uses a dtype, encoding or layout this reader cannot serve.
    Unsupported,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub file: String,
    pub tensor: Option<String>,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(
        kind: ErrorKind,
        file: &str,
        tensor: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        Error {
            kind,
            file: file.to_string(),
            tensor: tensor.map(str::to_string),
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file)?;
        if let Some(t) = &self.tensor {
            write!(f, "tensor {t:?}: ")?;
        }
        // Keep it to one line whatever the message carries.
        let msg = self.message.replace('\n', " ");
        f.write_str(&msg)
    }
}

impl std::error::Error for Error {}
