//! Why a byte source could not make bytes present: a remote object's
//! fetch that failed, or a cache that had no room for them.
//!
//! The kind is decided where the failure happens (the answer that said the
//! object is another, the write that found the disk full, the wait that ran
//! out), never from the message; the serving core turns it into the
//! reader's errno (`serve::error`). The message is the one line the log
//! shows, naming the object and the bytes.

use std::fmt;

/// What went wrong, as far as a reader's errno can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchKind {
    /// The server failed, refused or cut the body short, or the cache file
    /// could not be written: `EIO`.
    Failed,
    /// The object is not the one pinned at mount (another ETag, size or
    /// version, or gone): `ESTALE`.
    Changed,
    /// The cache directory's disk is full: `ENOSPC`.
    NoSpace,
    /// The credentials were refused: `EACCES`.
    Denied,
    /// No answer in time, retries included: `ETIMEDOUT`.
    TimedOut,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchError {
    pub kind: FetchKind,
    msg: String,
}

impl FetchError {
    pub fn new(kind: FetchKind, msg: impl Into<String>) -> FetchError {
        FetchError {
            kind,
            msg: msg.into(),
        }
    }

    /// A failure with nothing more to say than its message.
    pub fn failed(msg: impl Into<String>) -> FetchError {
        FetchError::new(FetchKind::Failed, msg)
    }

    /// A write into the cache file that failed: no room is `NoSpace`.
    pub fn write(e: &std::io::Error, msg: impl Into<String>) -> FetchError {
        let kind = match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => FetchKind::NoSpace,
            _ => FetchKind::Failed,
        };
        FetchError::new(kind, msg)
    }

    pub fn message(&self) -> &str {
        &self.msg
    }

    /// The same failure, its message prefixed (with what was being fetched).
    pub fn context(mut self, prefix: impl fmt::Display) -> FetchError {
        self.msg = format!("{prefix}: {}", self.msg);
        self
    }

    /// Without a leading `prefix: `: a name the caller's own context
    /// gives already (a single file's, which is its catalog's).
    pub fn without_context(mut self, prefix: &str) -> FetchError {
        if let Some(rest) = self
            .msg
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix(": "))
        {
            self.msg = rest.to_string();
        }
        self
    }
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for FetchError {}

/// The message alone, for the mount's one-line refusals (a failed fetch at
/// open refuses the file whatever its kind).
impl From<FetchError> for String {
    fn from(e: FetchError) -> String {
        e.msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_no_space_and_other_write_errors_are_failures() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(FetchError::write(&full, "x").kind, FetchKind::NoSpace);
        let quota = std::io::Error::from_raw_os_error(libc::EDQUOT);
        assert_eq!(FetchError::write(&quota, "x").kind, FetchKind::NoSpace);
        let eio = std::io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(FetchError::write(&eio, "x").kind, FetchKind::Failed);
    }

    #[test]
    fn context_keeps_the_kind() {
        let e = FetchError::new(FetchKind::Changed, "ETag moved").context("bytes 0..4");
        assert_eq!(e.kind, FetchKind::Changed);
        assert_eq!(e.to_string(), "bytes 0..4: ETag moved");
        assert_eq!(String::from(e), "bytes 0..4: ETag moved");
    }

    #[test]
    fn a_name_given_already_is_left_out_once() {
        let e = FetchError::failed("bytes 0..4: cut").context("hf://o/r@c/m.safetensors");
        assert_eq!(
            e.clone()
                .without_context("hf://o/r@c/m.safetensors")
                .to_string(),
            "bytes 0..4: cut"
        );
        assert_eq!(
            e.without_context("hf://o/r@c/other.safetensors")
                .to_string(),
            "hf://o/r@c/m.safetensors: bytes 0..4: cut"
        );
    }
}
