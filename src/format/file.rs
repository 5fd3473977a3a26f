//! An opened zTensor file: the mmap, its catalog, and whole-tensor access for
//! the commands and tests. The mount builds its cache on the same pieces.

use std::borrow::Cow;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::catalog::{Catalog, Encoding, Layout, Part, Tensor};
use super::checksum::{Hasher, Verdict};
use super::error::{Error, ErrorKind, Result};
use super::{expose, zstd_blob};

pub struct ZtFile {
    path: PathBuf,
    label: String,
    file: File,
    /// The file's metadata taken before it was mapped: what the bytes
    /// served must still be (see `mount::guard`).
    opened: std::fs::Metadata,
    map: Mmap,
    catalog: Catalog,
}

impl ZtFile {
    /// Opens, maps and checks `path`.
    pub fn open(path: &Path) -> Result<ZtFile> {
        ZtFile::open_with(path, super::index::DEFAULT_INDEX_MEMORY)
    }

    /// [`ZtFile::open`], refusing an index that would take more than
    /// `index_memory` bytes decoded.
    pub fn open_with(path: &Path, index_memory: u64) -> Result<ZtFile> {
        let label = path.display().to_string();
        let io = |what: &str, e: std::io::Error| {
            Error::new(ErrorKind::Io, &label, None, format!("{what}: {e}"))
        };
        // Non-blocking, so that a FIFO is refused below instead of waiting
        // for a writer forever (the flag means nothing to a regular file).
        // A file another process holds a write lease on answers EWOULDBLOCK
        // then, and the lease is being broken: try again for a while (the
        // kernel's lease-break-time is 45 s), never blocking, so a path
        // swapped for a FIFO meanwhile is still refused.
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let file = loop {
            match open() {
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && std::time::Instant::now() < until =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => break other,
            }
        }
        .map_err(|e| io("cannot open", e))?;
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
        let catalog = Catalog::parse_with(&map, &label, index_memory)?;
        let zt = ZtFile {
            path: path.to_path_buf(),
            label,
            file,
            opened: meta,
            map,
            catalog,
        };
        // The index was read through the mapping: hand its pages back.
        zt.release(&zt.map[zt.catalog.data_end as usize..]);
        Ok(zt)
    }
}

/// The system's page size.
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}

impl ZtFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name used in messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The file's metadata as it was before it was mapped and its index read.
    pub fn opened(&self) -> &std::fs::Metadata {
        &self.opened
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The on-disk bytes of a tensor (bounds were checked by the catalog).
    pub fn blob(&self, t: &Tensor) -> &[u8] {
        &self.map[t.offset as usize..(t.offset + t.size) as usize]
    }

    /// The same bytes as a decoder source that reads them from the file
    /// with `pread` rather than through the mapping.
    pub fn blob_source(&self, t: &Tensor) -> zstd_blob::Source<'_> {
        zstd_blob::Source::File {
            file: &self.file,
            offset: t.offset,
            len: t.size as usize,
        }
    }

    /// Checks the tensor's checksum over its on-disk bytes, a few MiB at a
    /// time, letting go of each piece of the mapping once hashed.
    pub fn verify(&self, t: &Tensor) -> Verdict {
        let Some(c) = &t.checksum else {
            return Verdict::Absent;
        };
        let Some(algo) = c.algorithm() else {
            return c.verify(&[]);
        };
        let mut h = Hasher::new(algo);
        for chunk in self.blob(t).chunks(8 << 20) {
            h.update(chunk);
            self.release(chunk);
        }
        c.judge(h.finish())
    }

    /// Faults in the mapping's pages for `len` bytes at `off` (clipped to
    /// the mapping) ahead of their use, in one call: the pages come from
    /// the page cache, or are read from disk. Fails on kernels before 5.14
    /// (`EINVAL`), or if the file is now shorter than the mapping (`EFAULT`,
    /// never a SIGBUS).
    pub fn populate(&self, off: usize, len: usize) -> std::io::Result<()> {
        let end = off.saturating_add(len).min(self.map.len());
        if off >= end {
            return Ok(());
        }
        self.map
            .advise_range(memmap2::Advice::PopulateRead, off, end - off)
    }

    /// The span of `bytes` if it lies within this mapping, rounded out to
    /// 64 KiB (within the mapping): a page fault maps up to 64 KiB around
    /// the page it needs (the kernel's default "fault-around"), so letting
    /// go of only the pages read would leave their neighbours mapped.
    fn pages_of(&self, bytes: &[u8]) -> Option<(usize, usize)> {
        let base = self.map.as_ptr() as usize;
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        if bytes.is_empty() || start < base || end > base + self.map.len() {
            return None;
        }
        let unit = page_size().max(64 << 10);
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

    fn err(&self, t: &Tensor, kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error::new(kind, &self.label, Some(&t.name), msg)
    }

    fn layout<'t>(&self, t: &'t Tensor) -> Result<&'t Layout> {
        t.layout
            .as_ref()
            .map_err(|why| self.err(t, ErrorKind::Unsupported, why.clone()))
    }

    /// Fails unless the checksum matches (or there is none / it is unknown).
    pub fn check(&self, t: &Tensor) -> Result<()> {
        match self.verify(t) {
            Verdict::Mismatch { expected, actual } => Err(self.err(
                t,
                ErrorKind::Data,
                format!("checksum mismatch: index says {expected}, blob has {actual}"),
            )),
            _ => Ok(()),
        }
    }

    /// The whole decoded blob: borrowed for raw, decoded for zstd (after
    /// checking the checksum, which covers the compressed bytes).
    pub fn decoded(&self, t: &Tensor) -> Result<Cow<'_, [u8]>> {
        let layout = self.layout(t)?;
        match layout.encoding {
            Encoding::Raw => Ok(Cow::Borrowed(self.blob(t))),
            Encoding::Zstd => {
                self.check(t)?;
                let mut out = Vec::new();
                // The size is the index's: an allocation that fails is an
                // error, not an abort.
                usize::try_from(layout.decoded_size)
                    .ok()
                    .and_then(|n| out.try_reserve_exact(n).ok())
                    .ok_or_else(|| {
                        self.err(
                            t,
                            ErrorKind::Data,
                            format!("cannot allocate {} decoded bytes", layout.decoded_size),
                        )
                    })?;
                zstd_blob::decode_stream(self.blob(t), layout.decoded_size, |chunk| {
                    out.extend_from_slice(chunk);
                    Ok(())
                })
                .map_err(|why| self.err(t, ErrorKind::Data, why))?;
                Ok(Cow::Owned(out))
            }
        }
    }

    /// Exposed little-endian bytes `[off, off+len)` of one part. Raw data is
    /// verified only when `verify_raw` is set; zstd always.
    pub fn read_part(
        &self,
        t: &Tensor,
        part: &Part,
        off: u64,
        len: u64,
        verify_raw: bool,
    ) -> Result<Vec<u8>> {
        if verify_raw {
            self.check(t)?;
        }
        let blob = self.decoded(t)?;
        Ok(expose::from_blob(&blob, part, t.endian, off, len).into_owned())
    }

    /// All exposed bytes of every part of `t`, in part order.
    pub fn read_all(&self, t: &Tensor) -> Result<Vec<Vec<u8>>> {
        self.check(t)?;
        let layout = self.layout(t)?;
        let blob = self.decoded(t)?;
        Ok(layout
            .parts
            .iter()
            .map(|p| expose::from_blob(&blob, p, t.endian, 0, p.nbytes).into_owned())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::writer::{Options, Writer};
    use crate::format::{DType, Endian};
    use std::io::{Read, Seek, SeekFrom};

    /// Whether the page at `addr` is mapped in this process (pagemap's
    /// "present" bit, readable without privileges).
    fn present(addr: usize) -> bool {
        let mut pm = File::open("/proc/self/pagemap").unwrap();
        pm.seek(SeekFrom::Start((addr / page_size() * 8) as u64))
            .unwrap();
        let mut e = [0u8; 8];
        pm.read_exact(&mut e).unwrap();
        u64::from_le_bytes(e) >> 63 == 1
    }

    #[test]
    fn release_lets_go_of_the_pages_mapped_around_a_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.zt");
        let mut w = Writer::create(&path).unwrap();
        let data = vec![7u8; 1 << 20];
        let opts = Options {
            endian: Endian::Little,
            ..Options::default()
        };
        w.add("t", DType::Uint8, &[1 << 20], &data, &opts).unwrap();
        w.finish().unwrap();
        let zt = ZtFile::open(&path).unwrap();
        let blob = zt.blob(&zt.catalog().tensors[0]);
        // A byte in the middle of a 64 KiB unit: the fault may map the
        // whole unit (the kernel's default fault-around; with it turned
        // off this test cannot fail, and has nothing to catch).
        let base = zt.bytes().as_ptr() as usize;
        let unit = 64 << 10;
        let at = (base + (512 << 10)).next_multiple_of(unit) + 5 * page_size() - base;
        assert!(at + unit < blob.len() + (blob.as_ptr() as usize - base));
        // SAFETY: `at` lies within the mapping (asserted above); volatile so
        // the read, and its page fault, really happen.
        let byte = unsafe { std::ptr::read_volatile(zt.bytes().as_ptr().add(at)) };
        assert_eq!(byte, 7);
        assert!(present(base + at));
        zt.release(&zt.bytes()[at..at + 1]);
        let first = base + at - 5 * page_size();
        for p in (first..first + unit).step_by(page_size()) {
            assert!(!present(p), "page {:#x} still mapped", p - base);
        }
    }
}
