//! An opened zTensor file: the mmap, its catalog, and whole-tensor access for
//! the commands and tests. The mount builds its cache on the same pieces.

use std::borrow::Cow;
use std::fs::File;
use std::path::Path;

use super::catalog::{Catalog, Encoding, Layout, Tensor};
use crate::catalog::{Part, expose};
use crate::codec::digest::{Hasher, Verdict};
use crate::codec::zstd as zstd_blob;
use crate::error::{Error, ErrorKind, Result};
use crate::source::MappedFile;

pub struct ZtFile {
    src: MappedFile,
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
        ZtFile::from_source(MappedFile::open(path)?, index_memory)
    }

    /// Reads the catalog of an opened file.
    pub fn from_source(src: MappedFile, index_memory: u64) -> Result<ZtFile> {
        let catalog = Catalog::parse_with(src.bytes(), src.label(), index_memory)?;
        // The index was read through the mapping: hand its pages back.
        src.release(&src.bytes()[catalog.data_end as usize..]);
        Ok(ZtFile { src, catalog })
    }

    /// The opened file and its catalog, apart.
    pub fn into_parts(self) -> (MappedFile, Catalog) {
        (self.src, self.catalog)
    }

    pub fn path(&self) -> &Path {
        self.src.path()
    }

    /// The name used in messages.
    pub fn label(&self) -> &str {
        self.src.label()
    }

    pub fn file(&self) -> &File {
        self.src.file()
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn bytes(&self) -> &[u8] {
        self.src.bytes()
    }

    /// The on-disk bytes of a tensor (bounds were checked by the catalog).
    pub fn blob(&self, t: &Tensor) -> &[u8] {
        self.src.range(t.offset, t.size)
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

    /// See [`MappedFile::release`].
    pub fn release(&self, bytes: &[u8]) {
        self.src.release(bytes)
    }

    fn err(&self, t: &Tensor, kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error::new(kind, self.label(), Some(&t.name), msg)
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
        Ok(expose::from_blob(&blob, part, off, len).into_owned())
    }

    /// All exposed bytes of every part of `t`, in part order.
    pub fn read_all(&self, t: &Tensor) -> Result<Vec<Vec<u8>>> {
        self.check(t)?;
        let layout = self.layout(t)?;
        let blob = self.decoded(t)?;
        Ok(layout
            .parts
            .iter()
            .map(|p| expose::from_blob(&blob, p, 0, p.nbytes).into_owned())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{DType, Endian};
    use crate::formats::zt_v01::writer::{Options, Writer};
    use crate::source::page_size;
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
