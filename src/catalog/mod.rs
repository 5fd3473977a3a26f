//! The one model every format is projected into, and all the mount sees.
//!
//! A catalog lists the files its bytes live in (`sources`: the opened file,
//! and shards beside it), the stored byte ranges (`blobs`: where, how they
//! are encoded, what they must decode to and what checks they must pass),
//! and the tensors (`tensors`: each one or more `parts`, a part being one
//! exposed file of little-endian elements read out of one blob). After a
//! format module has built it, there is nothing per-format left to say:
//! the sidecar fields a format wants shown travel as JSON.

pub mod cost;
pub mod dtype;
pub mod expose;
pub mod meta;

use std::path::{Path, PathBuf};

pub use crate::codec::digest::{Algorithm, Checksum, Verdict};
pub use dtype::{DType, Endian};
pub use meta::Meta;

pub type Json = serde_json::Value;
pub type JsonMap = serde_json::Map<String, Json>;

/// The most source files one catalog names (the opened file and its
/// shards): a mount holds each open and mapped, and watches each mapping
/// for a file cut short under it (`serve::guard`), which has a place for
/// this many. A set naming more is refused before any shard is opened.
pub const MAX_SOURCES: usize = 1024;

#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// The format and version, as users name it (`"zTensor v0.1.0"`).
    pub format: String,
    /// The opened file as named in messages.
    pub label: String,
    /// The files blobs point into; `sources[0]` is the opened file.
    pub sources: Vec<SourceRef>,
    pub blobs: Vec<Blob>,
    pub tensors: Vec<Tensor>,
    /// File-level metadata (a format's attributes or header fields).
    pub attributes: JsonMap,
}

/// A file the catalog's bytes come from, and what it must be.
#[derive(Debug, Clone, Default)]
pub struct SourceRef {
    pub path: PathBuf,
    /// Its exact size, when the format states it (a shard table does).
    pub size: Option<u64>,
    /// A digest of the file, when the format states one: checked before
    /// any byte of it is served.
    pub digest: Option<Checksum>,
    /// The bytes `digest` covers, as (offset, length); `None`: the whole
    /// file.
    pub digest_span: Option<(u64, u64)>,
    /// Why nothing of it can be served (a shard that is missing or is not
    /// what the table says), found when the catalog was built.
    pub unusable: Option<String>,
}

/// A stored byte range and what it decodes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// Index in `Catalog::sources`.
    pub source: usize,
    pub offset: u64,
    /// Stored bytes.
    pub len: u64,
    pub codec: Codec,
    /// Bytes once decoded (`len` for raw).
    pub decoded_len: u64,
    /// Checks the bytes must pass before any of them is served.
    pub checks: Vec<Check>,
    /// Names the blob in messages: the tensor, and the part when the
    /// tensor has several blobs.
    pub label: String,
}

impl Blob {
    /// Bytes stored as they are served: `len` of them at `offset` of
    /// source `source`, passing `checks` before any is served.
    pub fn raw(source: usize, offset: u64, len: u64, checks: Vec<Check>, label: String) -> Blob {
        Blob {
            source,
            offset,
            len,
            codec: Codec::Raw,
            decoded_len: len,
            checks,
            label,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Codec {
    Raw,
    /// One or more zstd frames, one after the other.
    Zstd {
        /// The frames as the format records them, when it does: no walk
        /// over the blob's frame headers is needed. Checked against the
        /// blob before it is used.
        frames: Option<FrameTable>,
    },
    /// Bytes only the format's own reader can produce (a deflated zip
    /// member, a chunked dataset), made whole into the cache.
    Computed(Producer),
}

impl Codec {
    pub fn name(&self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd { .. } => "zstd",
            Codec::Computed(_) => "computed",
        }
    }
}

/// Makes a blob's decoded bytes: appends exactly `Blob::decoded_len`
/// bytes to the (empty) buffer it is given, whose capacity is that size.
/// It must not allocate past it: the caller counted that much in its cache.
pub type ProduceFn = dyn Fn(&mut Vec<u8>) -> Result<(), String> + Send + Sync;

/// Makes a blob's decoded bytes in order, handing each piece to the
/// function it is given (which may refuse it); exactly
/// `Blob::decoded_len` bytes in all. For a blob too big for the cache:
/// its pieces are written to a spill file as they come, so that it is
/// never whole in memory.
pub type StreamFn =
    dyn Fn(&mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> + Send + Sync;

/// A [`ProduceFn`] with a name for messages, and the same bytes as a
/// [`StreamFn`] where the format's reader can make them piece by piece.
#[derive(Clone)]
pub struct Producer {
    pub name: &'static str,
    pub produce: std::sync::Arc<ProduceFn>,
    pub stream: Option<std::sync::Arc<StreamFn>>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Producer({})", self.name)
    }
}

impl PartialEq for Producer {
    fn eq(&self, other: &Producer) -> bool {
        std::sync::Arc::ptr_eq(&self.produce, &other.produce)
    }
}

impl Eq for Producer {}

/// Sizes of a blob's zstd frames, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameTable {
    /// Every frame decodes to `decoded` bytes but the last (the rest);
    /// `compressed` lists each frame's stored size.
    Uniform { decoded: u64, compressed: Vec<u64> },
    /// `(stored, decoded)` bytes of each frame.
    Listed(Vec<(u64, u64)>),
}

impl FrameTable {
    pub fn len(&self) -> usize {
        match self {
            FrameTable::Uniform { compressed, .. } => compressed.len(),
            FrameTable::Listed(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a blob's bytes must satisfy before they are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A digest of the stored bytes (what zTensor v0.1 records).
    Stored(Checksum),
    /// A digest of the decoded bytes (what zTensor v2 records).
    Decoded(Checksum),
    /// Every decoded byte is 0 or 1 (`bool` stored as bytes).
    BoolBytes,
    /// The high nibble of the last decoded byte is zero (an odd count of
    /// 4-bit elements packed two per byte).
    ZeroLastNibble,
    /// Every decoded byte in `[start, start+len)` is 0 or 1: a bool tensor
    /// that is one part of a blob it shares with others (one zstd stream
    /// for a whole file). Checked before a part reading from that range
    /// is first served; a failure fails only those parts.
    BoolBytesIn { start: u64, len: u64 },
}

/// One tensor: one exposed file, or a directory of parts.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    /// The format's own name for the element type (`"float32"`, `"bf16"`).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// The format's name for the layout (`"dense"`, `"zt.sparse_csr/1"`).
    pub layout: String,
    /// The format's name for how the bytes are stored (`"raw"`, `"zstd"`).
    pub encoding: String,
    /// Shown as a directory of parts rather than one file.
    pub directory: bool,
    /// What can be served, or why nothing can (the tensor is listed, with
    /// its sidecar, and no bytes are served).
    pub parts: Result<Vec<Part>, String>,
    /// Format-specific sidecar fields, shown after the common ones.
    pub meta: Meta,
}

impl Tensor {
    /// Its one file's part, when the file holds its elements in its own
    /// shape: not a directory of parts, and not a file of other units
    /// (quantized blocks, packed nibbles) whose shape differs.
    pub fn plain_file(&self) -> Option<&Part> {
        match &self.parts {
            Ok(ps) if !self.directory && ps.len() == 1 && ps[0].shape == self.shape => ps.first(),
            _ => None,
        }
    }

    /// A tensor of dense layout shown as one file (not a directory of
    /// parts): what most formats hold.
    pub fn dense(
        name: String,
        dtype: String,
        shape: Vec<u64>,
        encoding: impl Into<String>,
        parts: Result<Vec<Part>, String>,
        meta: Meta,
    ) -> Tensor {
        Tensor {
            name,
            dtype,
            shape,
            layout: "dense".into(),
            encoding: encoding.into(),
            directory: false,
            parts,
            meta,
        }
    }

    pub fn is_supported(&self) -> bool {
        self.parts.is_ok()
    }

    /// Exposed bytes of all parts.
    pub fn nbytes(&self) -> Option<u64> {
        self.parts
            .as_ref()
            .ok()
            .map(|ps| ps.iter().map(|p| p.nbytes).sum())
    }
}

/// One exposed file of a tensor: little-endian elements in C order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The file's name inside the tensor's directory; "" for the one part
    /// of a tensor that is a plain file.
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Exposed size in bytes.
    pub nbytes: u64,
    /// Index in `Catalog::blobs`: where the elements are read from.
    pub blob: usize,
    /// Where each element sits in the decoded blob.
    pub map: PartMap,
    /// Byte order of the stored elements.
    pub order: Endian,
    /// Format-specific sidecar fields of this part.
    pub meta: Meta,
}

/// Where the bytes of one exposed element come from in the decoded blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartMap {
    /// Elements stored one after the other from `start`.
    Contiguous { start: u64 },
    /// Records of `ndim` u64 indices then one value (zTensor v0.1's
    /// reference COO form). Exposed as an `[ndim, nnz]` index array,
    /// element (d, k) at `k*record + 8*d`.
    CooRecordIndices { nnz: u64, record: u64 },
    /// The values of those records: element k at `k*record + value_at`.
    CooRecordValues { record: u64, value_at: u64 },
}

impl Part {
    /// Offset in the decoded blob of exposed element `e`.
    pub fn source_of(&self, e: u64) -> u64 {
        match self.map {
            PartMap::Contiguous { start } => start + e * self.dtype.size(),
            PartMap::CooRecordIndices { nnz, record } => (e % nnz) * record + 8 * (e / nnz),
            PartMap::CooRecordValues { record, value_at } => e * record + value_at,
        }
    }

    /// From exposed element `e`, how many of the next (at most `max`)
    /// elements sit at one stride from each other in the decoded blob, and
    /// that stride: they can be read as one span.
    pub fn run_from(&self, e: u64, max: u64) -> (u64, u64) {
        let es = self.dtype.size();
        match self.map {
            PartMap::Contiguous { .. } => (max, es),
            // One coordinate of consecutive records, up to the next one.
            PartMap::CooRecordIndices { nnz, record } => ((nnz - e % nnz).min(max), record),
            PartMap::CooRecordValues { record, .. } => (max, record),
        }
    }

    /// The one part of a dense tensor stored as a whole blob.
    pub fn dense(dtype: DType, shape: Vec<u64>, nbytes: u64, blob: usize, order: Endian) -> Part {
        Part {
            name: String::new(),
            dtype,
            shape,
            nbytes,
            blob,
            map: PartMap::Contiguous { start: 0 },
            order,
            meta: Meta::default(),
        }
    }
}

impl Catalog {
    /// The catalog of one file of `format` at `path` (`label` in
    /// messages), with nothing in it yet.
    pub fn of_file(format: &str, label: &str, path: &Path) -> Catalog {
        Catalog {
            format: format.to_string(),
            label: label.to_string(),
            sources: vec![SourceRef {
                path: path.to_path_buf(),
                ..SourceRef::default()
            }],
            ..Catalog::default()
        }
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The tensor called `name` (names are unique within a catalog).
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Whether a blob's bytes need a check before the first is served.
    pub fn blob_has_checks(&self, b: usize) -> bool {
        self.blobs.get(b).is_some_and(|b| !b.checks.is_empty())
    }
}
