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
        // Keep it to one line whatever the message carries, and name the
        // file once (a message from a byte source starts with it already).
        let msg = self.message.replace('\n', " ");
        let prefix = format!("{}: ", self.file);
        f.write_str(msg.strip_prefix(&prefix).unwrap_or(&msg))
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_named_once_when_the_message_names_it_too() {
        let e = Error::new(ErrorKind::Io, "http://h/m.zt", None, "http://h/m.zt: no");
        assert_eq!(e.to_string(), "http://h/m.zt: no");
        let e = Error::new(ErrorKind::Io, "a.zt", Some("t"), "a.zt: bad");
        assert_eq!(e.to_string(), "a.zt: tensor \"t\": bad");
        let e = Error::new(ErrorKind::Io, "a.zt", None, "b.zt: bad");
        assert_eq!(e.to_string(), "a.zt: b.zt: bad");
    }
}
