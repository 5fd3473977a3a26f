//! Format modules: each turns a file (and the files beside it that it
//! names) into the common catalog. Which module reads a file is decided
//! here, once, by its first bytes, never by its name.

pub mod cbor;
pub mod cbor_json;
pub mod compat;
pub mod deathtensors;
mod gguf_header;
pub mod hdf5;
pub mod pt;
pub mod safetensors;
pub mod sharded;
pub mod zt_v01;
pub mod zt_v1;
pub mod zt_v2;

use std::path::Path;

use crate::catalog::Catalog;
use crate::error::{Error, ErrorKind, Result};
use crate::source::MappedFile;

/// Bytes of each end of a remote file fetched to recognise it (rounded up
/// to the source's blocks, so a small index comes with them).
const ENDS: u64 = 64 << 10;

/// The formats this version reads, for messages.
pub const READS: &str = "zTensor v0.1, v1 and v2, safetensors (and sharded sets), GGUF (and split files), deathtensors (and sharded sets), npz, PyTorch .pt, ONNX, HDF5";

/// A file read into the common catalog, with the files its bytes are in.
pub struct Opened {
    pub catalog: Catalog,
    /// One per `catalog.sources`, in order; `None` for a source that could
    /// not be opened (its `SourceRef::unusable` says why).
    pub sources: Vec<Option<MappedFile>>,
}

/// Limits a format module applies while reading a catalog.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes the decoded index (manifest, header) may take in memory.
    pub index_memory: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            index_memory: zt_v01::index::DEFAULT_INDEX_MEMORY,
        }
    }
}

/// What a file's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detected {
    ZtV01,
    /// zTensor v1: `ZTEN1000` first (and last).
    ZtV1,
    ZtV2,
    /// deathtensors: `DTLEGION`.
    DeathTensors,
    /// HDF5: `\x89HDF\r\n\x1a\n`, read by our own reader.
    Hdf5,
    /// A format read through `ztensor-compat`.
    Compat(compat::Kind),
    /// A format this version recognises but does not read.
    Known(&'static str),
    Unknown,
}

/// Recognises a file by its first bytes.
pub fn detect(bytes: &[u8]) -> Detected {
    const KNOWN: &[(&[u8], &str)] = &[(b"\x93NUMPY", "a numpy .npy file")];
    if bytes.starts_with(zt_v01::MAGIC) {
        return Detected::ZtV01;
    }
    if bytes.starts_with(zt_v1::MAGIC) {
        return Detected::ZtV1;
    }
    if bytes.starts_with(zt_v2::MAGIC) {
        return Detected::ZtV2;
    }
    if bytes.starts_with(deathtensors::MAGIC) {
        return Detected::DeathTensors;
    }
    if bytes.starts_with(b"GGUF") {
        return Detected::Compat(compat::Kind::Gguf);
    }
    if bytes.starts_with(hdf5::MAGIC) {
        return Detected::Hdf5;
    }
    if bytes.starts_with(b"PK\x03\x04") {
        return Detected::Compat(compat::zip_kind(bytes));
    }
    if bytes.starts_with(pt::LEGACY_MAGIC) {
        return Detected::Known(
            "a PyTorch file in torch.save's legacy format (_use_new_zipfile_serialization=False, \
             or torch before 1.6; save it again with torch.save's default zip format)",
        );
    }
    if let Some((_, name)) = KNOWN.iter().find(|(m, _)| bytes.starts_with(m)) {
        return Detected::Known(name);
    }
    if looks_like_safetensors(bytes) {
        return Detected::Compat(compat::Kind::Safetensors);
    }
    // Protobuf has no magic: last, and only a walk over the whole top level.
    if compat::looks_like_onnx(bytes) {
        return Detected::Compat(compat::Kind::Onnx);
    }
    Detected::Unknown
}

/// Refuses a GGUF header that is broken or would take more memory decoded
/// than `limits` allow, before the crate that reads GGUF decodes it.
fn gguf_bounded(src: &MappedFile, limits: Limits) -> Result<()> {
    let err = |msg: String| Error::new(ErrorKind::Index, src.label(), None, msg);
    let cost =
        gguf_header::decoded_cost(src.bytes()).map_err(|why| err(format!("GGUF header: {why}")))?;
    if cost > limits.index_memory {
        return Err(err(format!(
            "its GGUF header's key/values would take about {cost} bytes decoded, more than the \
             {} allowed (--index-memory)",
            limits.index_memory
        )));
    }
    Ok(())
}

/// safetensors: a little-endian u64 header length, then a JSON object.
fn looks_like_safetensors(bytes: &[u8]) -> bool {
    let Some(head) = bytes.get(..8) else {
        return false;
    };
    let n = u64::from_le_bytes(head.try_into().unwrap_or_default());
    n >= 2 && n <= bytes.len() as u64 - 8 && bytes.get(8) == Some(&b'{')
}

/// Opens `path` and reads its catalog with the module its first bytes name.
///
/// A directory holding one Hugging Face `*.safetensors.index.json`, or that
/// index itself, opens the sharded set as one catalog; so does the first
/// file of a GGUF split (`split.count` in its header).
pub fn open(path: &Path, limits: Limits) -> Result<Opened> {
    if path.is_dir() {
        return sharded::open_dir(path, limits);
    }
    open_source(MappedFile::open(path)?, limits)
}

/// Opens `arg`, a path or a URL (`s3://`, `gs://`, `az://`, `http(s)://`),
/// and reads its catalog.
pub fn open_arg(
    arg: &str,
    limits: Limits,
    remote: &crate::source::RemoteOptions,
) -> Result<Opened> {
    if !crate::source::remote::is_url(arg) {
        return open(Path::new(arg), limits);
    }
    open_source(crate::source::open(arg, remote)?, limits)
}

/// Reads the catalog of `src` with the module its first bytes name.
pub fn open_source(src: MappedFile, limits: Limits) -> Result<Opened> {
    if src.is_remote() {
        fetch_index(&src, limits)?;
    }
    if sharded::is_hf_index(src.bytes()) {
        return sharded::open_hf_index(src, limits);
    }
    match detect(src.bytes()) {
        Detected::ZtV01 => {
            let zt = zt_v01::ZtFile::from_source(src, limits.index_memory)?;
            let (src, v01) = zt.into_parts();
            let catalog = zt_v01::project(&src, v01);
            Ok(Opened {
                catalog,
                sources: vec![Some(src)],
            })
        }
        Detected::ZtV2 => zt_v2::open(src, limits),
        Detected::DeathTensors => deathtensors::open(src, limits),
        Detected::Hdf5 => hdf5::open(src, limits),
        Detected::ZtV1 => {
            let catalog = zt_v1::read(&src, limits)?;
            Ok(Opened {
                catalog,
                sources: vec![Some(src)],
            })
        }
        Detected::Compat(compat::Kind::Pt) => pt::open(src, limits),
        Detected::Compat(compat::Kind::Safetensors) => safetensors::open(src, limits),
        Detected::Compat(kind) => {
            if kind == compat::Kind::Gguf {
                gguf_bounded(&src, limits)?;
            }
            let (catalog, src) = compat::open(src, kind)?;
            if kind == compat::Kind::Gguf && sharded::gguf_split_count(&catalog) > 1 {
                return sharded::open_gguf_split(catalog, src, limits);
            }
            Ok(Opened {
                catalog,
                sources: vec![Some(src)],
            })
        }
        Detected::Known(name) => Err(Error::new(
            ErrorKind::NotSupported,
            src.label(),
            None,
            format!("{name} is not supported yet (this version reads {READS})"),
        )),
        Detected::Unknown => Err(Error::new(
            ErrorKind::NotZtensor,
            src.label(),
            None,
            format!(
                "not a file of a format this version reads ({READS}): magic \"ZTEN0001\" \
                 missing, and no other format's magic found"
            ),
        )),
    }
}

/// Makes present, for a source whose bytes are fetched on demand, what its
/// format reads at open: its first and last bytes (the magic, a trailing
/// index size or footer), then the index they point at, in as few requests
/// as the format allows. Whatever a format module reads beyond this (the
/// data of a sparse tensor it checks at open) it makes present itself.
fn fetch_index(src: &MappedFile, limits: Limits) -> Result<()> {
    let n = src.len();
    let io = |why: String| Error::new(ErrorKind::Io, src.label(), None, why);
    let tail = n.saturating_sub(ENDS);
    src.ensure_all(&[(0, ENDS.min(n)), (tail, n - tail)], true)
        .map_err(io)?;
    let bytes = src.bytes();
    let u64_at = |at: u64| -> Option<u64> {
        let at = usize::try_from(at).ok()?;
        Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    // The index range each format's trailer or prefix names; a lying one
    // is left to the format module to refuse (nothing past the budget is
    // fetched).
    let within = |at: u64, len: u64| {
        len <= limits.index_memory && at.checked_add(len).is_some_and(|e| e <= n)
    };
    let index = match detect(bytes) {
        Detected::ZtV01 => u64_at(n.saturating_sub(8))
            .filter(|&len| len <= limits.index_memory && len.saturating_add(16) <= n)
            .map(|len| (n - 8 - len, len)),
        Detected::ZtV2 if n >= 40 => u64_at(n - 40)
            .zip(u64_at(n - 32))
            .filter(|&(at, len)| within(at, len)),
        // A u64 header length, then the header.
        Detected::Compat(compat::Kind::Safetensors) => u64_at(0)
            .map(|len| (8, len))
            .filter(|&(at, len)| within(at, len)),
        // Magic, version, flags, then a u64 header length.
        Detected::DeathTensors => u64_at(16)
            .map(|len| (24, len))
            .filter(|&(at, len)| within(at, len)),
        Detected::Hdf5 => {
            // Our reader reads the file where its links point; only what
            // was fetched is there.
            return Err(Error::new(
                ErrorKind::NotSupported,
                src.label(),
                None,
                "HDF5 over a URL is not supported yet (zTensor, safetensors and deathtensors \
                 are): mount a local copy",
            ));
        }
        Detected::Compat(kind) => {
            // Their readers read the file where they please: only what was
            // fetched is there, so nothing else is handed to them.
            return Err(Error::new(
                ErrorKind::NotSupported,
                src.label(),
                None,
                format!(
                    "{} over a URL is not supported yet (zTensor, safetensors and deathtensors \
                     are): mount a local copy",
                    kind.name()
                ),
            ));
        }
        _ => None,
    };
    if let Some((at, len)) = index {
        src.ensure_all(&[(at, len)], true).map_err(io)?;
    }
    // v0.1 sparse tensors in the reference layouts are read at open.
    if detect(bytes) == Detected::ZtV01
        && let Ok(idx) = zt_v01::index::parse(bytes, src.label(), limits.index_memory)
    {
        let ranges: Vec<(u64, u64)> = idx
            .entries
            .iter()
            .filter(|e| matches!(e.layout.as_str(), "sparsecsr" | "sparsecoo"))
            .map(|e| (e.offset, e.size))
            .collect();
        if !ranges.is_empty() {
            src.ensure_all(&ranges, false).map_err(io)?;
        }
    }
    Ok(())
}
