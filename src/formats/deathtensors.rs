//! deathtensors v1 (`DTLEGION`), as the real writer (deathtensors 0.3.0,
//! its Rust core's `writer.rs`) lays it out:
//!
//! ```text
//! 0   magic "DTLEGION"
//! 8   u32 LE version = 1
//! 12  u32 LE flags: bit0 the whole data blob is one zstd stream, bit1 a
//!     SHA-256 footer, bit2 encryption (refused), any other bit refused
//! 16  u64 LE header length H
//! 24  H bytes of JSON (pretty-printed by the writer)
//!     NUL padding to the next multiple of 8 (the prefix is 24 bytes, so
//!     the data starts at 24 + align8(H))
//!     the data blob: the tensors' bytes one after the other in header
//!     order, unaligned; or, with bit0, zstd of those bytes (one stream,
//!     without a content size); `data_offsets` are positions in the
//!     uncompressed bytes, relative to the blob
//!     with bit1: 32 bytes, SHA-256 of header + padding + stored blob: the
//!     24-byte prefix is NOT covered (the spec's picture suggests it is not
//!     either, but never says so)
//! ```
//!
//! A sharded model is an index file with no tensors whose
//! `global_metadata` holds `"deathtensors.sharded": "true"` and
//! `"deathtensors.shards"`, a JSON *string* listing
//! `{"path": basename, "tensors": [names], "bytes": n}`; each shard is a
//! plain deathtensors file beside the index. It is mounted as one tree: one
//! catalog source per shard, a missing or unreadable shard failing only the
//! tensors the index puts in it.
//!
//! The footer: verified on first read, not in the background. The mount
//! checks a source's digest on the first read of any blob in it, before any
//! byte is served; reads of that file wait for that one pass, and are then
//! served without further hashing; `ls`, `stat` and the sidecars never
//! wait. Measured through a real mount of a 1 GiB plain checksummed file
//! (4 tensors, page cache warm, 2 cores with a load average of 11): the
//! first 4 KiB read took 1.92 s, the next reads 1 to 11 ms, and reading
//! another 256 MiB tensor afterwards 0.16 s. Hashing from mount time in the
//! background would only move that wait earlier for a reader that comes
//! later, at the price of hashing files nobody reads and of a core taken
//! while the user is listing; a file that is read is hashed exactly once
//! either way. The index of a sharded model holds no tensor bytes: its
//! footer is checked here at open, since the shard list is read from it.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};

use super::shard_set::{Duplicates, Set};
use super::{Limits, Opened};
use crate::catalog::{
    Blob, Catalog, Check, Checksum, Codec, DType, Endian, Json, JsonMap, Part, PartMap, SourceRef,
    Tensor,
};
use crate::codec::digest::{Algorithm, compute};
use crate::error::{Error, ErrorKind, Result};
use crate::source::MappedFile;

pub const MAGIC: &[u8; 8] = b"DTLEGION";
pub const VERSION: u32 = 1;
/// Magic, version, flags, header length.
pub const PREFIX_LEN: u64 = 24;
pub const FLAG_COMPRESSED: u32 = 1 << 0;
pub const FLAG_CHECKSUM: u32 = 1 << 1;
pub const FLAG_ENCRYPTED: u32 = 1 << 2;
const KNOWN_FLAGS: u32 = FLAG_COMPRESSED | FLAG_CHECKSUM | FLAG_ENCRYPTED;
pub const FOOTER_LEN: u64 = 32;
const ALIGNMENT: u64 = 8;
/// The format as users name it.
const FORMAT: &str = "deathtensors v1";
/// The decoded header takes at most this many times its text in memory (a
/// shape `[0,0,...]` is 2 bytes of text per 8-byte dimension, and a vector
/// may hold twice what it uses while it grows).
const HEADER_EXPANSION: u64 = 8;

/// Global-metadata keys of a sharded index, as the writer names them.
pub const SHARDED_KEY: &str = "deathtensors.sharded";
pub const SHARDS_KEY: &str = "deathtensors.shards";
pub const SHARD_COUNT_KEY: &str = "deathtensors.shard.count";

/// One tensor of a header, checked against its file.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    /// The header's name (`"F32"`).
    pub dtype_name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// `[start, end)` in the (uncompressed) data blob.
    pub start: u64,
    pub end: u64,
    pub metadata: Vec<(String, String)>,
}

/// A file's prefix and header, checked against the file's length.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub flags: u32,
    pub header_len: u64,
    /// Where the data blob starts in the file.
    pub data_start: u64,
    /// Bytes of the blob as stored (compressed when `compressed()`).
    pub stored_len: u64,
    /// Bytes of the uncompressed blob the tensors need: the largest end.
    pub decoded_len: u64,
    /// The SHA-256 footer, and the bytes it covers as (offset, length).
    pub footer: Option<([u8; 32], (u64, u64))>,
    pub created_by: String,
    pub global: Vec<(String, String)>,
    pub tensors: Vec<Entry>,
}

impl Parsed {
    pub fn compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSED != 0
    }

    fn global(&self, key: &str) -> Option<&str> {
        self.global
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn is_sharded_index(&self) -> bool {
        self.global(SHARDED_KEY) == Some("true")
    }
}

/// The header's names for element types, with ours.
const DTYPES: [(&str, DType); 15] = [
    ("BOOL", DType::Bool),
    ("U8", DType::Uint8),
    ("I8", DType::Int8),
    ("U16", DType::Uint16),
    ("I16", DType::Int16),
    ("F16", DType::Float16),
    ("BF16", DType::BFloat16),
    ("I32", DType::Int32),
    ("U32", DType::Uint32),
    ("F32", DType::Float32),
    ("I64", DType::Int64),
    ("U64", DType::Uint64),
    ("F64", DType::Float64),
    ("C64", DType::Complex64),
    ("C128", DType::Complex128),
];

pub fn dtype_of(name: &str) -> Option<DType> {
    DTYPES.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
}

/// A JSON object kept as written: in order, duplicates and all (serde_json
/// would keep only the last of two equal keys).
#[derive(Debug, Default)]
struct Ordered<T>(Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Ordered<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Ordered<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Ordered<T>, A::Error> {
                // No capacity from the input: serde_json gives no hint.
                let mut v = Vec::new();
                while let Some(kv) = map.next_entry::<String, T>()? {
                    v.push(kv);
                }
                Ok(Ordered(v))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct RawHeader {
    format: String,
    format_version: u64,
    #[serde(default)]
    created_by: String,
    #[serde(default)]
    global_metadata: Ordered<String>,
    tensors: Ordered<RawTensor>,
}

#[derive(Deserialize)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
    #[serde(default)]
    metadata: Ordered<String>,
}

#[derive(Deserialize)]
struct RawShard {
    path: String,
    tensors: Vec<String>,
    #[serde(default)]
    bytes: Option<u64>,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads and checks the prefix, header and footer position of `bytes`
/// (a whole file). Nothing of the data blob is read.
pub fn parse(bytes: &[u8], file: &str, limits: Limits) -> Result<Parsed> {
    let p = prefix(bytes, file, limits)?;
    let raw = header(&bytes[PREFIX_LEN as usize..p.header_end as usize], file)?;
    let compressed = p.flags & FLAG_COMPRESSED != 0;
    let mut seen = HashSet::new();
    let mut tensors = Vec::new();
    let mut decoded_len = 0u64;
    for (name, t) in raw.tensors.0 {
        if !seen.insert(name.clone()) {
            return Err(Error::new(
                ErrorKind::Duplicate,
                file,
                Some(&name),
                "the header names this tensor twice",
            ));
        }
        let e = entry(name, t, (!compressed).then_some(p.stored_len), file)?;
        decoded_len = decoded_len.max(e.end);
        tensors.push(e);
    }
    check_overlaps(&tensors, file)?;
    Ok(Parsed {
        flags: p.flags,
        header_len: p.header_len,
        data_start: p.data_start,
        stored_len: p.stored_len,
        decoded_len,
        footer: p.footer,
        created_by: raw.created_by,
        global: raw.global_metadata.0,
        tensors,
    })
}

/// The fixed prefix, checked against the file's length and the limits.
struct Prefix {
    flags: u32,
    header_len: u64,
    header_end: u64,
    data_start: u64,
    stored_len: u64,
    footer: Option<([u8; 32], (u64, u64))>,
}

/// The magic, version and flags, and where the header, the data blob and
/// the footer lie.
fn prefix(bytes: &[u8], file: &str, limits: Limits) -> Result<Prefix> {
    let err = |kind, msg: String| Error::new(kind, file, None, msg);
    let len = bytes.len() as u64;
    if bytes.len() < PREFIX_LEN as usize || &bytes[..8] != MAGIC {
        return Err(err(
            ErrorKind::NotZtensor,
            format!(
                "not a deathtensors file: {len} bytes, need the magic \"DTLEGION\" and a \
                 {PREFIX_LEN}-byte prefix"
            ),
        ));
    }
    let version = le_u32(bytes, 8);
    if version != VERSION {
        return Err(err(
            ErrorKind::NotSupported,
            format!("deathtensors version {version} is not supported (this reader reads 1)"),
        ));
    }
    let flags = le_u32(bytes, 12);
    if flags & !KNOWN_FLAGS != 0 {
        return Err(err(
            ErrorKind::NotSupported,
            format!(
                "unknown flag bits {:#x} (flags {flags:#x}): refusing to guess",
                flags & !KNOWN_FLAGS
            ),
        ));
    }
    if flags & FLAG_ENCRYPTED != 0 {
        return Err(err(
            ErrorKind::NotSupported,
            "the file is encrypted (flag bit 2), which no reader supports".into(),
        ));
    }
    let header_len = le_u64(bytes, 16);
    let header_max = limits.index_memory / HEADER_EXPANSION;
    if header_len > header_max {
        return Err(err(
            ErrorKind::Index,
            format!(
                "header of {header_len} bytes is over the limit of {} (raise --index-memory \
                 to read it)",
                crate::size::bytes(header_max)
            ),
        ));
    }
    let header_end = PREFIX_LEN
        .checked_add(header_len)
        .filter(|&e| e <= len)
        .ok_or_else(|| {
            err(
                ErrorKind::Index,
                format!("header of {header_len} bytes runs past the end of the file ({len} bytes)"),
            )
        })?;
    let data_start = header_end.next_multiple_of(ALIGNMENT);
    let trailer = if flags & FLAG_CHECKSUM != 0 {
        FOOTER_LEN
    } else {
        0
    };
    let stored_end = len.checked_sub(trailer).filter(|&e| e >= data_start);
    let Some(stored_end) = stored_end else {
        return Err(err(
            ErrorKind::Index,
            format!(
                "file of {len} bytes ends inside the header padding{}",
                if trailer > 0 { " or the footer" } else { "" }
            ),
        ));
    };
    let stored_len = stored_end - data_start;
    let footer = (trailer > 0).then(|| {
        let mut d = [0u8; 32];
        d.copy_from_slice(&bytes[stored_end as usize..]);
        (d, (PREFIX_LEN, stored_end - PREFIX_LEN))
    });

    Ok(Prefix {
        flags,
        header_len,
        header_end,
        data_start,
        stored_len,
        footer,
    })
}

/// The JSON header, of this format and version, its global metadata's
/// keys each once.
fn header(text: &[u8], file: &str) -> Result<RawHeader> {
    let err = |kind, msg: String| Error::new(kind, file, None, msg);
    // serde_json refuses nesting deeper than 128 (its default recursion
    // limit, kept: the crate is built without `unbounded_depth`).
    let raw: RawHeader = serde_json::from_slice(text).map_err(|e| {
        err(
            ErrorKind::Index,
            format!("header is not a deathtensors JSON header: {e}"),
        )
    })?;
    if raw.format != "deathtensors" {
        return Err(err(
            ErrorKind::Index,
            format!("header says format {:?}, not \"deathtensors\"", raw.format),
        ));
    }
    if raw.format_version != 1 {
        return Err(err(
            ErrorKind::NotSupported,
            format!(
                "header format_version {} is not supported (this reader reads 1)",
                raw.format_version
            ),
        ));
    }
    if let Some(k) = first_duplicate(&raw.global_metadata.0) {
        return Err(err(
            ErrorKind::Duplicate,
            format!("global_metadata has the key {k:?} twice"),
        ));
    }

    Ok(raw)
}

/// One tensor's entry, checked: a known dtype, a size its shape implies,
/// and (`stored_len`, for a file not compressed) within the data blob.
fn entry(name: String, t: RawTensor, stored_len: Option<u64>, file: &str) -> Result<Entry> {
    let terr = |kind, msg: String| Error::new(kind, file, Some(&name), msg);
    if name.is_empty() {
        return Err(terr(ErrorKind::Field, "empty tensor name".into()));
    }
    let Some(dtype) = dtype_of(&t.dtype) else {
        return Err(terr(
            ErrorKind::Field,
            format!("unknown dtype {:?}", t.dtype),
        ));
    };
    let [start, end] = t.data_offsets;
    if end < start {
        return Err(terr(
            ErrorKind::Placement,
            format!("data_offsets [{start}, {end}] are reversed"),
        ));
    }
    let count = t
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| dtype.nbytes(n));
    let Some(nbytes) = count else {
        return Err(terr(
            ErrorKind::Size,
            format!(
                "shape {:?} of {} overflows 64 bits of bytes",
                t.shape, t.dtype
            ),
        ));
    };
    if end - start != nbytes {
        return Err(terr(
            ErrorKind::Size,
            format!(
                "{} {:?} is {nbytes} bytes but data_offsets [{start}, {end}] span {}",
                t.dtype,
                t.shape,
                end - start
            ),
        ));
    }
    if let Some(stored_len) = stored_len.filter(|&n| end > n) {
        return Err(terr(
            ErrorKind::Placement,
            format!("data_offsets [{start}, {end}] run past the data blob ({stored_len} bytes)"),
        ));
    }
    if let Some(k) = first_duplicate(&t.metadata.0) {
        return Err(terr(
            ErrorKind::Duplicate,
            format!("metadata has the key {k:?} twice"),
        ));
    }
    Ok(Entry {
        name,
        dtype_name: t.dtype,
        dtype,
        shape: t.shape,
        start,
        end,
        metadata: t.metadata.0,
    })
}

fn first_duplicate<T>(kv: &[(String, T)]) -> Option<&str> {
    let mut seen = HashSet::new();
    kv.iter()
        .map(|(k, _)| k.as_str())
        .find(|k| !seen.insert(*k))
}

/// The writer packs tensors one after the other; two that share a byte
/// are refused.
fn check_overlaps(tensors: &[Entry], file: &str) -> Result<()> {
    let mut ranges: Vec<(u64, u64, usize)> = tensors
        .iter()
        .enumerate()
        .filter(|(_, t)| t.end > t.start)
        .map(|(i, t)| (t.start, t.end, i))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let ((_, a_end, a), (b_start, _, b)) = (w[0], w[1]);
        if b_start < a_end {
            return Err(Error::new(
                ErrorKind::Placement,
                file,
                Some(&tensors[b].name),
                format!(
                    "its bytes [{}, {}) overlap those of tensor {:?} [{}, {})",
                    tensors[b].start,
                    tensors[b].end,
                    tensors[a].name,
                    tensors[a].start,
                    tensors[a].end
                ),
            ));
        }
    }
    Ok(())
}

fn string_map(kv: &[(String, String)]) -> JsonMap {
    kv.iter()
        .map(|(k, v)| (k.clone(), Json::String(v.clone())))
        .collect()
}

/// The source entry of a parsed file.
fn source_ref(path: &Path, p: &Parsed) -> SourceRef {
    SourceRef {
        path: path.to_path_buf(),
        size: None,
        digest: p.footer.map(|(d, _)| Checksum::Sha256(d)),
        digest_span: p.footer.map(|(_, span)| span),
        unusable: None,
    }
}

/// Adds the tensors of `p` (stored in `catalog.sources[source]`) to
/// `catalog`: a plain file gives one raw blob per tensor, a compressed one
/// a single zstd blob that every tensor is a part of. `shard` names the
/// shard in the sidecar.
fn add_tensors(catalog: &mut Catalog, source: usize, p: Parsed, shard: Option<&str>) {
    let encoding = if p.compressed() { "zstd" } else { "raw" };
    let shared = p.compressed().then(|| {
        catalog.blobs.push(Blob {
            source,
            offset: p.data_start,
            len: p.stored_len,
            codec: Codec::Zstd { frames: None },
            decoded_len: p.decoded_len,
            checks: Vec::new(),
            label: match shard {
                Some(s) => format!("the zstd data blob of shard {s:?}"),
                None => "the zstd data blob".into(),
            },
        });
        catalog.blobs.len() - 1
    });
    for t in p.tensors {
        let nbytes = t.end - t.start;
        let bool_bytes = t.dtype == DType::Bool;
        let (blob, start) = match shared {
            Some(b) => {
                // Its bytes are checked as they are first read, in the
                // shared stream: a bad one fails this tensor only.
                if bool_bytes && nbytes > 0 {
                    catalog.blobs[b].checks.push(Check::BoolBytesIn {
                        start: t.start,
                        len: nbytes,
                    });
                }
                (b, t.start)
            }
            None => {
                let checks = if bool_bytes {
                    vec![Check::BoolBytes]
                } else {
                    Vec::new()
                };
                let label = format!("tensor {:?}", t.name);
                let at = p.data_start + t.start;
                catalog
                    .blobs
                    .push(Blob::raw(source, at, nbytes, checks, label));
                (catalog.blobs.len() - 1, 0)
            }
        };
        let mut part = Part::dense(t.dtype, t.shape.clone(), nbytes, blob, Endian::Little);
        part.map = PartMap::Contiguous { start };
        let mut meta = JsonMap::new();
        meta.insert("data_offsets".into(), Json::from(vec![t.start, t.end]));
        if let Some(s) = shard {
            meta.insert("shard".into(), s.into());
        }
        meta.insert("metadata".into(), Json::Object(string_map(&t.metadata)));
        catalog.tensors.push(Tensor::dense(
            t.name,
            t.dtype_name,
            t.shape,
            encoding,
            Ok(vec![part]),
            meta.into(),
        ));
    }
}

/// Reads the catalog of an opened deathtensors file, and of its shards
/// when it is the index of a sharded model.
pub fn open(src: MappedFile, limits: Limits) -> Result<Opened> {
    let p = parse(src.bytes(), src.label(), limits)?;
    if !p.is_sharded_index() {
        let catalog = catalog_of(src.path(), src.label(), p, None);
        src.release(src.bytes());
        return Ok(Opened {
            catalog,
            sources: vec![Some(src)],
        });
    }
    let shards = shard_list(&src, &p)?;
    super::shard_set::check_count(src.label(), shards.len())?;
    let mut set = Set::new(FORMAT, src.label(), Duplicates::Refuse);
    *set.attributes() = string_map(&p.global);
    let dir = src
        .path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    set.add_index(catalog_of(src.path(), src.label(), p, None), src);
    let index = set.first_file();
    let opened = super::shard_set::open_each(&shards, |s| {
        open_shard(index, s, limits).map(|(file, parsed)| {
            let c = catalog_of(file.path(), file.label(), parsed, Some(&s.path));
            file.release(file.bytes());
            (c, file)
        })
    });
    for (s, shard) in shards.iter().zip(opened) {
        set.add(&dir.join(&s.path), shard, Some(&s.tensors));
    }
    set.finish()
}

/// The catalog of one file (`path`, `label` in messages) parsed as `p`;
/// `shard` names the shard in sidecars.
fn catalog_of(path: &Path, label: &str, p: Parsed, shard: Option<&str>) -> Catalog {
    let mut catalog = Catalog {
        format: FORMAT.into(),
        label: label.to_string(),
        sources: vec![source_ref(path, &p)],
        attributes: string_map(&p.global),
        ..Catalog::default()
    };
    add_tensors(&mut catalog, 0, p, shard);
    catalog
}

/// The shard list of a sharded index, once the index's own footer (if
/// any) has been checked: the list is taken from it.
fn shard_list(src: &MappedFile, p: &Parsed) -> Result<Vec<RawShard>> {
    let err = |msg: String| Error::new(ErrorKind::Index, src.label(), None, msg);
    if let Some((digest, (at, n))) = p.footer {
        // Within the file: `parse` checked it.
        let actual = compute(Algorithm::Sha256, src.range(at, n));
        if actual != Checksum::Sha256(digest) {
            return Err(Error::new(
                ErrorKind::Data,
                src.label(),
                None,
                format!(
                    "checksum mismatch in the index of a sharded model: the footer says {}, \
                     the file has {actual}",
                    Checksum::Sha256(digest)
                ),
            ));
        }
    }
    let text = p
        .global(SHARDS_KEY)
        .ok_or_else(|| err(format!("a sharded index without {SHARDS_KEY:?}")))?;
    let shards: Vec<RawShard> = serde_json::from_str(text)
        .map_err(|e| err(format!("{SHARDS_KEY:?} is not a shard list: {e}")))?;
    if let Some(n) = p.global(SHARD_COUNT_KEY)
        && n.parse::<usize>().ok() != Some(shards.len())
    {
        return Err(err(format!(
            "{SHARD_COUNT_KEY:?} says {n:?} but {SHARDS_KEY:?} lists {} shards",
            shards.len()
        )));
    }
    let mut seen = HashSet::new();
    for s in &shards {
        if !super::shard_set::name_ok(&s.path) {
            return Err(err(format!(
                "shard path {:?} is not {}",
                s.path,
                super::shard_set::PLAIN_NAME
            )));
        }
        if !seen.insert(s.path.as_str()) {
            return Err(err(format!("shard {:?} is listed twice", s.path)));
        }
    }
    Ok(shards)
}

/// Opens and parses one shard; the reason it cannot serve, otherwise.
fn open_shard(
    beside: Option<&MappedFile>,
    s: &RawShard,
    limits: Limits,
) -> std::result::Result<(MappedFile, Parsed), String> {
    let beside = beside.ok_or_else(|| format!("shard {:?}: the index is gone", s.path))?;
    // Beside the index however it was opened (a file, a remote object).
    let file = beside
        .sibling(&s.path)
        .map_err(|e| format!("shard {:?}: {e}", s.path))?;
    super::prepare(&file, limits).map_err(|e| format!("shard {:?}: {e}", s.path))?;
    let p = parse(file.bytes(), file.label(), limits).map_err(|e| e.to_string())?;
    if p.is_sharded_index() {
        return Err(format!(
            "{}: a shard that is itself a sharded index",
            file.label()
        ));
    }
    if let Some(want) = s.bytes {
        let names: HashSet<&str> = s.tensors.iter().map(String::as_str).collect();
        let held: Vec<_> = p
            .tensors
            .iter()
            .filter(|t| names.contains(t.name.as_str()))
            .collect();
        let listed: u64 = held
            .iter()
            .map(|t| t.end - t.start)
            .fold(0, u64::saturating_add);
        // A shard that lacks a tensor listed in it is not a shard of the
        // wrong size: each absent tensor is listed as such by the caller.
        if held.len() == names.len() && listed != want {
            return Err(format!(
                "{}: the index says its tensors are {want} bytes, they are {listed}",
                file.label()
            ));
        }
    }
    Ok((file, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as the writer lays it out.
    fn file(flags: u32, header: impl AsRef<[u8]>, blob: &[u8]) -> Vec<u8> {
        let header = header.as_ref();
        let mut f = Vec::new();
        f.extend_from_slice(MAGIC);
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&flags.to_le_bytes());
        f.extend_from_slice(&(header.len() as u64).to_le_bytes());
        f.extend_from_slice(header);
        while !f.len().is_multiple_of(8) {
            f.push(0);
        }
        f.extend_from_slice(blob);
        if flags & FLAG_CHECKSUM != 0
            && let Checksum::Sha256(d) = compute(Algorithm::Sha256, &f[24..])
        {
            f.extend_from_slice(&d);
        }
        f
    }

    const H: &str = r#"{"format":"deathtensors","format_version":1,"tensors":{
        "a":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]},
        "b":{"dtype":"F32","shape":[1],"data_offsets":[3,7],"metadata":{"k":"v"}}}}"#;

    #[test]
    fn a_plain_file_parses_in_order_with_unaligned_tensors() {
        let f = file(FLAG_CHECKSUM, H, &[1, 0, 1, 0, 0, 128, 63]);
        let p = parse(&f, "t", Limits::default()).unwrap();
        assert_eq!(p.tensors.len(), 2);
        assert_eq!(p.tensors[1].name, "b");
        assert_eq!(p.tensors[1].start, 3);
        assert_eq!(p.decoded_len, 7);
        assert_eq!(p.stored_len, 7);
        let (_, (at, n)) = p.footer.unwrap();
        assert_eq!((at, at + n), (24, f.len() as u64 - 32));
    }

    #[test]
    fn hostile_headers_are_one_line_errors() {
        // Nesting: an unknown field is skipped without recursion (serde_json's
        // ignore_value is iterative), and every known field has a fixed shape,
        // so no depth reaches the stack.
        let deep = |field: &str, n: usize| {
            format!(
                r#"{{"format":"deathtensors","format_version":1,{field}{}{},"tensors":{{}}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        assert!(
            parse(
                &file(0, deep("\"x\":", 1_000_000), &[]),
                "t",
                Limits::default()
            )
            .is_ok()
        );
        let cases = [
            file(0, deep("\"global_metadata\":{\"k\":", 100_000) + "}", &[]),
            file(0, b"{\"format\":\"deathtensors\xff\"}", &[]),
            file(0, H.replace("[3,7]", "[7,3]"), &[0; 7]),
            file(0, H.replace("[3,7]", "[3,8]"), &[0; 7]),
            file(0, H, &[0; 6]),
            file(8, H, &[0; 7]),
            file(FLAG_ENCRYPTED, H, &[0; 7]),
            file(0, H.replace("[0,3]", "[2,5]"), &[0; 7]),
            file(0, H.replace("\"b\"", "\"a\""), &[0; 7]),
        ];
        for f in cases {
            let e = parse(&f, "t", Limits::default()).unwrap_err();
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        let mut f = file(0, H, &[0; 7]);
        f[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&f, "t", Limits::default()).is_err());
    }
}
