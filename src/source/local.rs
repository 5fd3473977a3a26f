//! A local file, opened without blocking and mapped read-only.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, ErrorKind, Result};

pub struct MappedFile {
    path: PathBuf,
    label: String,
    file: File,
    /// The file's metadata taken before it was mapped: what the bytes
    /// served must still be (see `serve::guard`).
    opened: std::fs::Metadata,
    map: Mmap,
    /// What makes the mapping's bytes present: `None` for a local file
    /// (all of it is), the remote object for its cache file.
    backing: Option<std::sync::Arc<dyn super::Backing>>,
    /// Who opens the files beside this one, when they are not simply in
    /// its directory (a Hub file read from `huggingface_hub`'s cache).
    siblings: Option<std::sync::Arc<dyn super::Siblings>>,
}

/// The most one page fault maps of a file mapping: what one page table
/// spans, a page's worth of 8-byte entries each mapping a page (2 MiB with
/// 4 KiB pages; 32 MiB with arm64's 16 KiB ones). See
/// [`MappedFile::release`].
fn fault_span() -> usize {
    let page = page_size();
    page / 8 * page
}

/// The system's page size.
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}

impl MappedFile {
    /// Opens and maps `path`, which must be a regular file.
    pub fn open(path: &Path) -> Result<MappedFile> {
        let label = path.display().to_string();
        let io = |what: &str, e: std::io::Error| {
            Error::new(ErrorKind::Io, &label, None, format!("{what}: {e}"))
        };
        let file = open_nonblocking(path).map_err(|e| io("cannot open", e))?;
        let meta = file.metadata().map_err(|e| io("cannot stat", e))?;
        if !meta.is_file() {
            return Err(Error::new(
                ErrorKind::Io,
                &label,
                None,
                "not a regular file",
            ));
        }
        // SAFETY: the map is read-only. A writer truncating the file under us
        // is handled by the mount (it checks the file before touching pages).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io("cannot mmap", e))?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            label,
            file,
            opened: meta,
            map,
            backing: None,
            siblings: None,
        })
    }

    /// Maps `file` (at `path`), whose bytes `backing` makes present on
    /// demand; `label` names it in messages (a URL).
    pub fn with_backing(
        path: &Path,
        label: String,
        file: File,
        backing: std::sync::Arc<dyn super::Backing>,
    ) -> Result<MappedFile> {
        let io = |what: &str, e: std::io::Error| {
            Error::new(ErrorKind::Io, &label, None, format!("{what}: {e}"))
        };
        let meta = file
            .metadata()
            .map_err(|e| io("cannot stat the cache file", e))?;
        // SAFETY: read-only map of our own cache file, which is never
        // shortened while mapped; bytes not yet fetched read as zeros and
        // are never used before `ensure` fetched them.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io("cannot mmap the cache file", e))?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            label,
            file,
            opened: meta,
            map,
            backing: Some(backing),
            siblings: None,
        })
    }

    /// This file, named `label` in messages, with its siblings opened by
    /// `siblings`.
    pub fn relabel(
        mut self,
        label: String,
        siblings: std::sync::Arc<dyn super::Siblings>,
    ) -> MappedFile {
        self.label = label;
        self.siblings = Some(siblings);
        self
    }

    /// The remote object behind the mapping, if it is one.
    pub fn backing(&self) -> Option<&std::sync::Arc<dyn super::Backing>> {
        self.backing.as_ref()
    }

    pub fn is_remote(&self) -> bool {
        self.backing.is_some()
    }

    /// Reads ahead stop at byte `end` (see [`super::Backing::read_ahead_until`]);
    /// nothing to do for a local file.
    pub fn read_ahead_until(&self, end: u64) {
        if let Some(b) = &self.backing {
            b.read_ahead_until(end);
        }
    }

    /// Makes bytes `[off, off+len)` (clipped to the file) present in the
    /// mapping: nothing to do for a local file.
    pub fn ensure(&self, off: u64, len: u64) -> std::result::Result<(), super::FetchError> {
        self.ensure_all(&[(off, len)], false)
    }

    /// [`MappedFile::ensure`] for several ranges at once (fetched in
    /// parallel); `index` asks for few requests rather than parallel ones.
    pub fn ensure_all(
        &self,
        ranges: &[(u64, u64)],
        index: bool,
    ) -> std::result::Result<(), super::FetchError> {
        match &self.backing {
            None => Ok(()),
            Some(b) => b.ensure(ranges, index),
        }
    }

    /// Opens the file named `name` beside this one (a shard), the same way.
    pub fn sibling(&self, name: &str) -> Result<MappedFile> {
        if let Some(s) = &self.siblings {
            return s.sibling(name);
        }
        match &self.backing {
            Some(b) => b.sibling(name),
            None => {
                let dir = self.path.parent().unwrap_or(Path::new("."));
                MappedFile::open(&dir.join(name))
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name used in messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The file's metadata as it was before it was mapped.
    pub fn opened(&self) -> &std::fs::Metadata {
        &self.opened
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// `len` bytes at `offset`, which the caller has checked lie in the file.
    pub fn range(&self, offset: u64, len: u64) -> &[u8] {
        &self.map[offset as usize..(offset + len) as usize]
    }

    /// Faults in the mapping's pages for `len` bytes at `off` (clipped to
    /// the mapping) ahead of their use, in one call: the pages come from
    /// the page cache, or are read from disk. Fails on kernels before 5.14
    /// (`EINVAL`), or if the file is now shorter than the mapping (`EFAULT`,
    /// never a SIGBUS). Of a remote object's mapping, only the run of
    /// blocks fetched already from `off` on, up to the first that is not:
    /// faulting in the others would read the cache file's holes into
    /// zeroed page-cache pages that the fetch then overwrites.
    pub fn populate(&self, off: usize, len: usize) -> std::io::Result<()> {
        let len = match &self.backing {
            Some(b) => b.present(off as u64, len as u64) as usize,
            None => len,
        };
        let end = off.saturating_add(len).min(self.map.len());
        if off >= end {
            return Ok(());
        }
        self.map
            .advise_range(memmap2::Advice::PopulateRead, off, end - off)
    }

    /// The span of `bytes` if it lies within this mapping, rounded out to
    /// what a page table spans (2 MiB with 4 KiB pages; within the mapping). A page fault maps
    /// more than the page it needs: up to 64 KiB around it ("fault-around"),
    /// and the whole of a large folio of the page cache within that page
    /// table (ext4 and XFS cache a file in folios of up to 2 MiB). Letting
    /// go of only the pages read would leave those neighbours mapped; when
    /// their own range was let go of before (frames decoded out of order),
    /// they stayed mapped for good (70 MiB past the window's budget in a
    /// model load by four readers).
    fn pages_of(&self, bytes: &[u8]) -> Option<(usize, usize)> {
        let base = self.map.as_ptr() as usize;
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        if bytes.is_empty() || start < base || end > base + self.map.len() {
            return None;
        }
        let unit = fault_span();
        let from = (start & !(unit - 1)).max(base);
        let to = end.next_multiple_of(unit).min(base + self.map.len());
        Some((from, to - from))
    }

    /// Drops the pages under `bytes`, a slice of this file's mapping, from
    /// the process's page tables. They stay in the kernel's page cache, so a
    /// later access costs a minor fault; meanwhile the daemon's RSS holds
    /// only what it is using, however much of the file has been read.
    pub fn release(&self, bytes: &[u8]) {
        if let Some((from, len)) = self.pages_of(bytes) {
            // SAFETY: within our read-only file mapping (which starts on a
            // page; its end is rounded up to one by the kernel);
            // MADV_DONTNEED only unmaps, the file is untouched.
            unsafe { libc::madvise(from as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        }
    }
}

/// Opens `path` for reading without blocking, so that a FIFO is refused
/// (it is not a regular file) instead of waiting for a writer forever; the
/// flag means nothing to a regular file. A file another process holds a
/// write lease on answers EWOULDBLOCK while the lease is being broken: try
/// again for a while (the kernel's lease-break-time is 45 s), never
/// blocking, so a path swapped for a FIFO meanwhile is still refused.
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match open() {
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && std::time::Instant::now() < until =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// A byte range of a mapped file: a blob's stored bytes.
#[derive(Clone)]
pub struct Span {
    pub file: std::sync::Arc<MappedFile>,
    pub offset: u64,
    pub len: u64,
}

impl Span {
    /// The bytes, through the mapping (the catalog checked they are in the
    /// file).
    pub fn bytes(&self) -> &[u8] {
        self.file.range(self.offset, self.len)
    }

    /// The same bytes as a decoder source that reads them with `pread`
    /// rather than through the mapping.
    pub fn reader(&self) -> crate::codec::zstd::Source<'_> {
        crate::codec::zstd::Source::File {
            file: self.file.file(),
            offset: self.offset,
            len: self.len as usize,
        }
    }

    /// Lets go of the mapped pages under `bytes` (see [`MappedFile::release`]).
    pub fn release(&self, bytes: &[u8]) {
        self.file.release(bytes)
    }

    /// Lets go of all of the span's mapped pages.
    pub fn release_all(&self) {
        self.file.release(self.bytes())
    }
}
