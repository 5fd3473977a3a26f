//! Format modules: each turns a file (and the files beside it that it
//! names) into the common catalog. Which module reads a file is decided
//! here, once, by its first bytes, never by its name.

pub mod cbor;
pub mod cbor_json;
pub mod compat;
pub mod deathtensors;
mod fetch;
mod gguf_header;
pub mod hdf5;
pub mod npz;
pub mod onnx;
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
    // A ZIP archive: its first member, or the end record of an empty one.
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
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

/// Makes present what `src`'s format reads at open, if its bytes are
/// fetched on demand (a remote object; see [`fetch`]); nothing for a
/// local file. Every file a format opens (a shard too) goes through here.
pub(crate) fn prepare(src: &MappedFile, limits: Limits) -> Result<()> {
    if src.is_remote() {
        fetch::fetch_index(src, limits)?;
    }
    Ok(())
}

/// Reads `src`, prepared, through `ztensor-compat`, a GGUF header first
/// checked against `limits`.
pub(crate) fn open_compat(
    src: MappedFile,
    kind: compat::Kind,
    limits: Limits,
) -> Result<(Catalog, MappedFile)> {
    if kind == compat::Kind::Gguf {
        gguf_bounded(&src, limits)?;
    }
    compat::open(src, kind)
}

/// Refuses a GGUF header that is broken or would take more memory decoded
/// than `limits` allow, before the crate that reads GGUF decodes it.
fn gguf_bounded(src: &MappedFile, limits: Limits) -> Result<()> {
    let err = |msg: String| Error::new(ErrorKind::Index, src.label(), None, msg);
    let cost =
        gguf_header::decoded_cost(src.bytes()).map_err(|why| err(format!("GGUF header: {why}")))?;
    if cost > limits.index_memory {
        return Err(err(format!(
            "its GGUF header's key/values and tensors would take about {cost} bytes in memory, \
             more than the {} allowed (--index-memory)",
            limits.index_memory
        )));
    }
    Ok(())
}

/// safetensors: a little-endian u64 header length, then a JSON object. A
/// length that runs past the end of the file, but within the largest header
/// read, is taken as a cut safetensors file, so that the refusal says so.
fn looks_like_safetensors(bytes: &[u8]) -> bool {
    let Some(head) = bytes.get(..8) else {
        return false;
    };
    let n = u64::from_le_bytes(head.try_into().unwrap_or_default());
    let within = n <= bytes.len() as u64 - 8 || n <= safetensors::MAX_HEADER;
    n >= 2 && within && bytes.get(8) == Some(&b'{')
}

/// Opens `path` and reads its catalog with the module its first bytes name.
///
/// A directory holding one Hugging Face `*.safetensors.index.json`, or that
/// index itself, opens the sharded set as one catalog; so does the first
/// file of a GGUF split (`split.count` in its header).
pub fn open(path: &Path, limits: Limits) -> Result<Opened> {
    if path.is_dir() {
        return bounded(sharded::open_dir(path, limits)?, limits);
    }
    open_source(MappedFile::open(path)?, limits)
}

/// Refuses an opened catalog that would take more memory laid out (catalog,
/// tree, views) than `limits` allow: every format is held to the one
/// measure ([`crate::catalog::cost`]), however its module bounded itself.
fn bounded(opened: Opened, limits: Limits) -> Result<Opened> {
    crate::catalog::cost::check(&opened.catalog, limits.index_memory)
        .map_err(|why| Error::new(ErrorKind::Index, &opened.catalog.label, None, why))?;
    Ok(opened)
}

/// Opens `arg`, a path or a URL (`s3://`, `gs://`, `az://`, `http(s)://`),
/// and reads its catalog.
pub fn open_arg(
    arg: &str,
    limits: Limits,
    remote: &crate::source::RemoteOptions,
) -> Result<Opened> {
    if !crate::source::is_remote(arg) {
        return open(Path::new(arg), limits);
    }
    let (src, about) = crate::source::open_described(arg, remote)?;
    let mut opened = open_source(src, limits)?;
    // Where a Hub file came from (repo, commit, the repo's other files).
    if let Some(about) = about {
        opened.catalog.attributes.insert("source".into(), about);
    }
    Ok(opened)
}

/// Reads the catalog of `src` with the module its first bytes name, held
/// to `limits`.
pub fn open_source(src: MappedFile, limits: Limits) -> Result<Opened> {
    bounded(read_source(src, limits)?, limits)
}

fn read_source(src: MappedFile, limits: Limits) -> Result<Opened> {
    prepare(&src, limits)?;
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
        Detected::Compat(compat::Kind::Npz) => npz::open(src, limits),
        Detected::Compat(compat::Kind::Onnx) => onnx::open(src, limits),
        Detected::Compat(compat::Kind::Safetensors) => safetensors::open(src, limits),
        Detected::Compat(kind) => {
            let (catalog, src) = open_compat(src, kind, limits)?;
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
                "not a file of a format this version reads ({READS}): no format's magic or \
                 header found; {}",
                looks_like(src.bytes())
            ),
        )),
    }
}

/// Whether `head` opens an HTML page (`<!DOCTYPE html` or `<html`, any
/// case, after white space).
fn looks_like_html(head: &[u8]) -> bool {
    let t = head.trim_ascii_start().to_ascii_lowercase();
    t.starts_with(b"<!doctype html") || t.starts_with(b"<html")
}

/// What a file of no known format looks like, from its first bytes.
fn looks_like(bytes: &[u8]) -> String {
    const SHOWN: usize = 16;
    let head = &bytes[..bytes.len().min(SHOWN)];
    let more = if bytes.len() > SHOWN { "..." } else { "" };
    let known = [
        (&b"\x1f\x8b"[..], "a gzip stream: decompress it first"),
        (
            &b"\x28\xb5\x2f\xfd"[..],
            "a zstd stream: decompress it first",
        ),
        (&b"\xfd7zXZ\x00"[..], "an xz stream: decompress it first"),
        (&b"BZh"[..], "a bzip2 stream: decompress it first"),
        (&b"\x7fELF"[..], "an ELF executable"),
    ];
    if bytes.is_empty() {
        return "the file is empty".into();
    }
    if let Some((_, what)) = known.iter().find(|(m, _)| bytes.starts_with(m)) {
        return format!("it looks like {what}");
    }
    if bytes.starts_with(b"ZTEN") {
        let magic = String::from_utf8_lossy(&bytes[..bytes.len().min(8)]);
        return format!(
            "it starts like a zTensor file, but {magic:?} is no version this build reads \
             (\"ZTEN0001\": v0.1, \"ZTEN1000\": v1; v2 starts with \"\\x89ZT2\")"
        );
    }
    if looks_like_html(head) {
        return format!(
            "it is an HTML page, not tensor data (an error or login page saved in place of \
             the file?): {:?}{more}",
            String::from_utf8_lossy(head)
        );
    }
    match std::str::from_utf8(head) {
        Ok(t)
            if t.chars()
                .all(|c| !c.is_control() || c.is_ascii_whitespace()) =>
        {
            format!("it starts with text: {t:?}{more}")
        }
        _ => {
            let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
            format!("its first bytes are {}{more}", hex.join(" "))
        }
    }
}
