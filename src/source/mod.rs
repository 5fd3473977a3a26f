//! Where a catalog's bytes come from: a local file, mapped, or a remote
//! object (S3, GCS, Azure, HTTP) mirrored into a sparse local file that is
//! mapped the same way. Formats and the mount see one type, [`MappedFile`];
//! what differs is its [`Backing`], which makes bytes of the mapping present
//! before they are used ([`MappedFile::ensure`]: nothing to do for a local
//! file, ranged GETs for a remote object). Formats open their files (and a
//! file's siblings, [`MappedFile::sibling`]) through here, so that every
//! file is opened, checked and mapped the same way.

mod aws_profile;
mod error;
mod hf_cache;
mod http;
pub mod hub;
mod local;
pub mod remote;
mod shared;
mod signed_url;
mod sums;

pub use error::{FetchError, FetchKind};
pub use local::{MappedFile, Span, page_size};

/// What stands behind a mapping whose bytes are not all there yet. A local
/// file has none (every byte is present); a remote object fetches blocks on
/// demand into the file it is mapped from.
pub trait Backing: Send + Sync {
    /// Makes every byte of `ranges` (offset, length; clipped to the file)
    /// present in the mapping, or says why it cannot. `index` asks for as
    /// few requests as possible (a format's index) rather than parallel ones.
    fn ensure(&self, ranges: &[(u64, u64)], index: bool) -> Result<(), FetchError>;
    /// How many bytes from `off` on are present already and checked (at
    /// most `len`), without fetching any.
    fn present(&self, off: u64, len: u64) -> u64;
    /// Checks every byte present that has not been checked yet, so that
    /// [`Backing::present`] counts it (what fails is fetched again when
    /// read).
    fn check_present(&self);
    /// Why the bytes can no longer be served, once known; its kind says
    /// whether that is because the object changed (rather than, say, a
    /// server that cannot serve it).
    fn broken(&self) -> Option<FetchError>;
    /// The object named `name` beside this one (a shard), opened the same way.
    fn sibling(&self, name: &str) -> crate::error::Result<MappedFile>;
    /// Reads ahead of a sequential reader stop at byte `end`: a reader
    /// that will read nothing past it (`cat` of one tensor) is not sent
    /// blocks it will never ask for.
    fn read_ahead_until(&self, end: u64);
}

/// Where and how remote objects are fetched; see [`remote::Options`].
pub use remote::Options as RemoteOptions;

/// Whether `arg` names a remote object (a URL: `s3://`, `gs://`, `az://`,
/// `http(s)://`, `hf://`) rather than a path.
pub fn is_remote(arg: &str) -> bool {
    remote::is_url(arg) || hub::is_hub(arg)
}

/// Opens `arg`, a path or a URL (`s3://`, `gs://`, `az://`, `http(s)://`,
/// `hf://`).
pub fn open(arg: &str, remote: &RemoteOptions) -> crate::error::Result<MappedFile> {
    open_described(arg, remote).map(|(f, _)| f)
}

/// [`open`], and what `.ztensor/index.json` should say of where the file
/// came from beyond its name (a Hub file's repo, commit and the repo's
/// other files).
pub fn open_described(
    arg: &str,
    remote: &RemoteOptions,
) -> crate::error::Result<(MappedFile, Option<serde_json::Value>)> {
    if hub::is_hub(arg) {
        hub::open(arg, remote).map(|(f, about)| (f, Some(about)))
    } else if remote::is_url(arg) {
        Ok((remote::open(arg, remote)?, None))
    } else {
        Ok((MappedFile::open(std::path::Path::new(arg))?, None))
    }
}

/// What the byte sources must do before the process forks: no thread of
/// theirs left running (the remote runtime's).
pub fn before_fork() {
    remote::before_fork();
}

/// What the byte sources must do in a forked child before it serves:
/// the remote objects' committers started again.
pub fn after_fork() {
    remote::after_fork();
}

/// What the byte sources must do before the process exits without
/// dropping them (`process::exit`): a remote object's cache bitmap saved.
pub fn before_exit() {
    remote::commit_all();
}

/// The bytes of a small file of settings (a token, a ref, a profile) at
/// `path`: refused if it is not a regular file (a FIFO would block, a
/// device never end) or holds more than `max` bytes.
pub(crate) fn read_small(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut out = Vec::new();
    f.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::other(format!("larger than {max} bytes")));
    }
    Ok(out)
}

/// Opens the files beside a file whose siblings are not simply in its
/// directory: a Hub file read from `huggingface_hub`'s cache, whose shards
/// may be there or not (then they are fetched).
pub trait Siblings: Send + Sync {
    fn sibling(&self, name: &str) -> crate::error::Result<MappedFile>;
}
