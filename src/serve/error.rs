//! Why a read of a tensor's bytes failed, and the errno its reader gets.
//!
//! The kind is decided where the failure happens (the guard that saw the
//! file change, the limit that refused a size, the disk that had no
//! room), never from the message; the message is the one line the log
//! and `.ztensor/errors` show, naming the file and the tensor.

use crate::source::{FetchError, FetchKind};

/// What went wrong, as far as the reader's errno can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The bytes could not be read or decoded, or failed a check: `EIO`.
    Failed,
    /// The source file or object changed since mount: `ESTALE`, as
    /// mountpoint-s3 answers for an object replaced under it.
    Changed,
    /// Larger than the options let the daemon make (`--cache-size`):
    /// `EFBIG`.
    TooLarge,
    /// No room under `--cache-dir` for its decoded copy or a remote
    /// object's blocks: `ENOSPC`.
    NoSpace,
    /// The remote store refused the credentials: `EACCES`.
    Denied,
    /// The remote store did not answer in time: `ETIMEDOUT`.
    TimedOut,
    /// The daemon is out of file descriptors (`ulimit -n`) for the file
    /// the read needs (a spill): `EMFILE`, which a reader can tell from a
    /// failed check, and which passes once other files are closed.
    NoFiles,
}

impl Kind {
    pub fn errno(self) -> i32 {
        match self {
            Kind::Failed => libc::EIO,
            Kind::Changed => libc::ESTALE,
            Kind::TooLarge => libc::EFBIG,
            Kind::NoSpace => libc::ENOSPC,
            Kind::Denied => libc::EACCES,
            Kind::TimedOut => libc::ETIMEDOUT,
            Kind::NoFiles => libc::EMFILE,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub kind: Kind,
    msg: String,
    /// Said by the guard of a whole file, which logs it once for all of
    /// its tensors.
    by_guard: bool,
}

impl ReadError {
    pub fn new(kind: Kind, msg: impl Into<String>) -> ReadError {
        ReadError {
            kind,
            msg: msg.into(),
            by_guard: false,
        }
    }

    /// A file's guard's verdict (logged by the guard).
    pub fn from_guard(changed: bool, msg: String) -> ReadError {
        let kind = if changed { Kind::Changed } else { Kind::Failed };
        ReadError {
            kind,
            msg,
            by_guard: true,
        }
    }

    pub fn errno(&self) -> i32 {
        self.kind.errno()
    }

    pub fn message(&self) -> &str {
        &self.msg
    }

    pub fn by_guard(&self) -> bool {
        self.by_guard
    }

    /// The same failure, its message prefixed (with the file and tensor
    /// it happened to).
    pub fn context(mut self, prefix: impl std::fmt::Display) -> ReadError {
        self.msg = format!("{prefix}: {}", self.msg);
        self
    }
}

/// A file the daemon could not make or open: out of descriptors, or
/// another failure (EIO).
pub fn of_io(e: &std::io::Error, msg: String) -> ReadError {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => ReadError::new(
            Kind::NoFiles,
            format!("{msg} (raise the open-file limit: ulimit -n)"),
        ),
        _ => ReadError::new(Kind::Failed, msg),
    }
}

/// A failure with no more to say than its message: the bytes could not be
/// had (EIO).
impl From<String> for ReadError {
    fn from(msg: String) -> ReadError {
        ReadError::new(Kind::Failed, msg)
    }
}

/// A byte source's failure keeps its kind.
impl From<FetchError> for ReadError {
    fn from(e: FetchError) -> ReadError {
        let kind = match e.kind {
            FetchKind::Failed => Kind::Failed,
            FetchKind::Changed => Kind::Changed,
            FetchKind::NoSpace => Kind::NoSpace,
            FetchKind::Denied => Kind::Denied,
            FetchKind::TimedOut => Kind::TimedOut,
        };
        ReadError::new(kind, String::from(e))
    }
}

impl From<&str> for ReadError {
    fn from(msg: &str) -> ReadError {
        ReadError::new(Kind::Failed, msg)
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_errno_and_context_keeps_it() {
        let e = ReadError::new(Kind::NoSpace, "no room").context("m.zt: tensor \"w\"");
        assert_eq!(e.errno(), libc::ENOSPC);
        assert_eq!(e.to_string(), "m.zt: tensor \"w\": no room");
        assert_eq!(ReadError::from("bad".to_string()).errno(), libc::EIO);
        assert_eq!(ReadError::new(Kind::TooLarge, "x").errno(), libc::EFBIG);
        let f = ReadError::from(FetchError::new(FetchKind::NoSpace, "disk full"));
        assert_eq!((f.errno(), f.message()), (libc::ENOSPC, "disk full"));
        let out = std::io::Error::from_raw_os_error(libc::EMFILE);
        let m = of_io(
            &out,
            "cannot create a spill file in /c: Too many open files".into(),
        );
        assert_eq!(
            (m.errno(), m.message()),
            (
                libc::EMFILE,
                "cannot create a spill file in /c: Too many open files (raise the open-file \
                 limit: ulimit -n)"
            )
        );
        let other = std::io::Error::from_raw_os_error(libc::EROFS);
        assert_eq!(of_io(&other, "read-only".into()).errno(), libc::EIO);
        let t = ReadError::from(FetchError::new(FetchKind::TimedOut, "late"));
        assert_eq!(t.errno(), libc::ETIMEDOUT);
        let d = ReadError::from(FetchError::new(FetchKind::Denied, "401"));
        assert_eq!(d.errno(), libc::EACCES);
        let g = ReadError::from_guard(true, "changed".into());
        assert_eq!((g.errno(), g.by_guard()), (libc::ESTALE, true));
        assert_eq!(
            ReadError::from_guard(false, "EIO".into()).errno(),
            libc::EIO
        );
    }
}
