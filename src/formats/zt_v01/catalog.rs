//! Index -> catalog: checks every entry against the file and the others and
//! describes what each tensor exposes ("parts": one for a dense tensor, two or
//! three for a sparse one). Refuses the whole file on a structural error;
//! marks a single tensor unsupported when only it cannot be served.

use std::collections::HashMap;
use std::sync::OnceLock;

use ciborium::value::Value;

use super::index::{self, ALIGNMENT, RawEntry, as_u64};
use crate::catalog::{Checksum, DType, Endian, Part, PartMap};
use crate::codec::zstd as zstd_blob;
use crate::error::{Error, ErrorKind, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Raw,
    Zstd,
}

impl Encoding {
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Raw => "raw",
            Encoding::Zstd => "zstd",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseFormat {
    Csr,
    Coo,
}

/// Which convention describes a sparse blob (see README, "Sparse tensors").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseForm {
    /// `layout: "sparse"` with `sparse_format`, `nnz`, `index_dtype`,
    /// `sparse_offsets`: what this project writes.
    Spec,
    /// `layout: "sparsecsr"` / `"sparsecoo"`: the reference crate's form.
    Reference,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sparse {
    pub format: SparseFormat,
    pub form: SparseForm,
    pub nnz: u64,
}

/// What the reader can serve of a supported tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub encoding: Encoding,
    /// Size of the blob once decoded (equals `size` for raw).
    pub decoded_size: u64,
    pub sparse: Option<Sparse>,
    pub parts: Vec<Part>,
}

#[derive(Debug, Clone)]
pub struct Tensor {
    /// Position in the index.
    pub index: usize,
    pub name: String,
    pub dtype_name: String,
    pub dtype: Option<DType>,
    pub shape: Vec<u64>,
    pub encoding_name: String,
    pub layout_name: String,
    pub offset: u64,
    pub size: u64,
    pub endian: Endian,
    /// True when `data_endianness` was written (false means the default).
    pub endian_explicit: bool,
    pub checksum: Option<Checksum>,
    pub custom: Vec<(Value, Value)>,
    /// `Err(reason)` when this reader cannot serve the tensor's bytes.
    pub layout: std::result::Result<Layout, String>,
}

impl Tensor {
    pub fn is_supported(&self) -> bool {
        self.layout.is_ok()
    }
    pub fn custom(&self, key: &str) -> Option<&Value> {
        self.custom
            .iter()
            .find(|(k, _)| k.as_text() == Some(key))
            .map(|(_, v)| v)
    }
}

#[derive(Debug, Clone)]
pub struct Catalog {
    pub tensors: Vec<Tensor>,
    pub data_end: u64,
    /// Tensor indexes sorted by name, for lookups without a copy of names;
    /// sorted on the first lookup (a mount looks up none).
    by_name: OnceLock<Vec<u32>>,
}

/// Decoded bytes all of a file's zstd reference-form sparse tensors may
/// cost at open time (their nnz lives in the data): about a second of
/// decoding, whatever the file claims. Tensors past it are listed, unserved.
const SPARSE_PROBE_BUDGET: u64 = 1 << 30;

impl Catalog {
    /// Builds the catalog of the zTensor file whose whole contents are `bytes`.
    /// `file` names the file in error messages.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Catalog> {
        Catalog::parse_with(bytes, file, index::DEFAULT_INDEX_MEMORY)
    }

    /// [`Catalog::parse`] of an index allowed `index_memory` bytes decoded.
    pub fn parse_with(bytes: &[u8], file: &str, index_memory: u64) -> Result<Catalog> {
        let idx = index::parse(bytes, file, index_memory)?;
        let file_len = bytes.len() as u64;
        let mut tensors = Vec::with_capacity(idx.entries.len());
        let mut probe = SPARSE_PROBE_BUDGET;
        for (i, raw) in idx.entries.into_iter().enumerate() {
            let place = (bytes, file_len, idx.data_end);
            tensors.push(check_entry(raw, i, place, &mut probe, file)?);
        }
        check_unique(&tensors, file)?;
        check_overlaps(&tensors, file)?;
        Ok(Catalog {
            tensors,
            data_end: idx.data_end,
            by_name: OnceLock::new(),
        })
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        let by_name = self.by_name.get_or_init(|| {
            let mut v: Vec<u32> = (0..self.tensors.len() as u32).collect();
            v.sort_unstable_by(|&a, &b| {
                self.tensors[a as usize]
                    .name
                    .cmp(&self.tensors[b as usize].name)
            });
            v
        });
        let at = by_name
            .binary_search_by(|&i| self.tensors[i as usize].name.as_str().cmp(name))
            .ok()?;
        Some(&self.tensors[by_name[at] as usize])
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

/// Refuses a name used twice, naming the first two entries that use it.
fn check_unique(tensors: &[Tensor], file: &str) -> Result<()> {
    let mut first: HashMap<&str, usize, rustc_hash::FxBuildHasher> =
        HashMap::with_capacity_and_hasher(tensors.len(), Default::default());
    for (i, t) in tensors.iter().enumerate() {
        if let Some(&j) = first.get(t.name.as_str()) {
            return Err(Error::new(
                ErrorKind::Duplicate,
                file,
                Some(&t.name),
                format!("name is used by index entries {j} and {i}; names must be unique"),
            ));
        }
        first.insert(&t.name, i);
    }
    Ok(())
}

/// `probe`: what is left of the file's open-time decoding budget.
fn check_entry(
    raw: RawEntry,
    i: usize,
    (bytes, file_len, data_end): (&[u8], u64, u64),
    probe: &mut u64,
    file: &str,
) -> Result<Tensor> {
    let e = |kind, msg: String| Error::new(kind, file, Some(&raw.name), msg);

    let (endian, endian_explicit) = match raw.data_endianness.as_deref() {
        None => (Endian::Little, false),
        Some("little") => (Endian::Little, true),
        Some("big") => (Endian::Big, true),
        Some(other) => {
            return Err(e(
                ErrorKind::Field,
                format!("field \"data_endianness\" is {other:?}, expected \"little\" or \"big\""),
            ));
        }
    };
    let checksum = match &raw.checksum {
        None => None,
        Some(text) => Some(
            Checksum::parse(text)
                .map_err(|why| e(ErrorKind::Field, format!("field \"checksum\": {why}")))?,
        ),
    };

    // Placement: every blob, served or not, must sit in the data region.
    if raw.offset < index::MAGIC.len() as u64 {
        return Err(e(
            ErrorKind::Placement,
            format!("offset {} lies inside the 8-byte magic", raw.offset),
        ));
    }
    if !raw.offset.is_multiple_of(ALIGNMENT) {
        return Err(e(
            ErrorKind::Placement,
            format!("offset {} is not a multiple of {ALIGNMENT}", raw.offset),
        ));
    }
    let Some(end) = raw.offset.checked_add(raw.size) else {
        return Err(e(
            ErrorKind::Placement,
            format!(
                "offset {} + size {} overflows 64 bits",
                raw.offset, raw.size
            ),
        ));
    };
    if end > file_len {
        return Err(e(
            ErrorKind::Placement,
            format!(
                "blob [{}, {end}) runs past the end of the file ({file_len} bytes)",
                raw.offset
            ),
        ));
    }
    if end > data_end {
        return Err(e(
            ErrorKind::Placement,
            format!(
                "blob [{}, {end}) runs into the index, which starts at {data_end}",
                raw.offset
            ),
        ));
    }
    let dtype = DType::from_v01_name(&raw.dtype);
    let layout = match describe(&raw, dtype, endian, bytes, probe) {
        Ok(mut layout) => {
            // One blob per tensor, at the tensor's index.
            for p in &mut layout.parts {
                p.blob = i;
                p.order = endian;
            }
            Ok(layout)
        }
        Err(Problem::File(kind, msg)) => return Err(e(kind, msg)),
        Err(Problem::Tensor(why)) => Err(why),
    };
    Ok(Tensor {
        index: i,
        name: raw.name,
        dtype_name: raw.dtype,
        dtype,
        shape: raw.shape,
        encoding_name: raw.encoding,
        layout_name: raw.layout,
        offset: raw.offset,
        size: raw.size,
        endian,
        endian_explicit,
        checksum,
        custom: raw.custom,
        layout,
    })
}

/// Why a tensor cannot be described: the whole file is refused, or only
/// this tensor is left unserved.
enum Problem {
    File(ErrorKind, String),
    Tensor(String),
}

fn size_err(msg: String) -> Problem {
    Problem::File(ErrorKind::Size, msg)
}

fn field_err(msg: String) -> Problem {
    Problem::File(ErrorKind::Field, msg)
}

fn describe(
    raw: &RawEntry,
    dtype: Option<DType>,
    endian: Endian,
    bytes: &[u8],
    probe: &mut u64,
) -> std::result::Result<Layout, Problem> {
    let encoding = match raw.encoding.as_str() {
        "raw" => Encoding::Raw,
        "zstd" => Encoding::Zstd,
        other => return Err(Problem::Tensor(format!("unsupported encoding {other:?}"))),
    };
    let Some(dtype) = dtype else {
        return Err(Problem::Tensor(format!(
            "unsupported dtype {:?}",
            raw.dtype
        )));
    };
    match raw.layout.as_str() {
        "dense" => {
            // Only a dense tensor has as many elements as its shape says: a
            // sparse one may be [2^32, 2^32].
            let numel = raw
                .shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    size_err(format!("shape {:?} has more than 2^64 elements", raw.shape))
                })?;
            let nbytes = numel.checked_mul(dtype.size()).ok_or_else(|| {
                size_err(format!(
                    "shape {:?} of {dtype} is more than 2^64 bytes",
                    raw.shape
                ))
            })?;
            if encoding == Encoding::Raw && raw.size != nbytes {
                return Err(size_err(format!(
                    "raw blob is {} bytes but shape {:?} of {dtype} needs {nbytes}",
                    raw.size, raw.shape
                )));
            }
            Ok(Layout {
                encoding,
                decoded_size: nbytes,
                sparse: None,
                parts: vec![part(
                    "",
                    dtype,
                    raw.shape.clone(),
                    nbytes,
                    PartMap::Contiguous { start: 0 },
                )],
            })
        }
        "sparse" => spec_sparse(raw, dtype, encoding),
        "sparsecsr" | "sparsecoo" => {
            let blob = &bytes[raw.offset as usize..(raw.offset + raw.size) as usize];
            reference_sparse(raw, dtype, encoding, endian, blob, probe).map_err(Problem::Tensor)
        }
        other => Err(Problem::Tensor(format!("unsupported layout {other:?}"))),
    }
}

fn mul(a: u64, b: u64, what: &str) -> std::result::Result<u64, Problem> {
    a.checked_mul(b)
        .ok_or_else(|| size_err(format!("{what} overflows 64 bits")))
}

/// Our sparse convention: everything needed is in the metadata.
fn spec_sparse(
    raw: &RawEntry,
    dtype: DType,
    encoding: Encoding,
) -> std::result::Result<Layout, Problem> {
    let format = match raw.custom("sparse_format") {
        Some(Value::Text(t)) if t == "csr" => SparseFormat::Csr,
        Some(Value::Text(t)) if t == "coo" => SparseFormat::Coo,
        Some(Value::Text(t)) => {
            return Err(Problem::Tensor(format!("unsupported sparse_format {t:?}")));
        }
        Some(v) => return Err(wrong_type("sparse_format", v, "text")),
        None => return Err(sparse_needs("sparse_format")),
    };
    // The rest is this project's convention (README); the spec leaves it to
    // the writer. A tensor described some other way is left unserved, and
    // the file with it.
    our_sparse(raw, dtype, encoding, format).map_err(|p| match p {
        Problem::File(_, why) | Problem::Tensor(why) => Problem::Tensor(why),
    })
}

/// A field of the sparse layout that is not of the CBOR type it must be.
fn wrong_type(field: &str, v: &Value, expected: &str) -> Problem {
    field_err(format!(
        "field \"{field}\" is a CBOR {}, expected {expected}",
        index::kind_name(v)
    ))
}

/// A field the sparse layout needs that the entry lacks.
fn sparse_needs(field: &str) -> Problem {
    field_err(format!("layout \"sparse\" needs the field \"{field}\""))
}

fn our_sparse(
    raw: &RawEntry,
    dtype: DType,
    encoding: Encoding,
    format: SparseFormat,
) -> std::result::Result<Layout, Problem> {
    let (nnz, index_dtype, offsets) = sparse_fields(raw)?;
    let mut wanted: Vec<(&'static str, DType, Vec<u64>)> = Vec::new();
    match format {
        SparseFormat::Csr => {
            if raw.shape.len() != 2 {
                return Err(field_err(format!(
                    "a CSR tensor needs a 2-d shape, got {:?}",
                    raw.shape
                )));
            }
            let rows = raw.shape[0]
                .checked_add(1)
                .ok_or_else(|| size_err("indptr length overflows".into()))?;
            wanted.push(("indptr", index_dtype, vec![rows]));
            wanted.push(("indices", index_dtype, vec![nnz]));
        }
        SparseFormat::Coo => {
            if raw.shape.is_empty() {
                return Err(field_err(
                    "a COO tensor needs at least one dimension".into(),
                ));
            }
            wanted.push(("indices", index_dtype, vec![raw.shape.len() as u64, nnz]));
        }
    }
    wanted.push(("values", dtype, vec![nnz]));
    if offsets.len() != wanted.len() {
        let names: Vec<&str> = wanted.iter().map(|w| w.0).collect();
        return Err(field_err(format!(
            "field \"sparse_offsets\" must name exactly the parts {names:?}"
        )));
    }
    let mut parts = Vec::new();
    for (pname, pdtype, shape) in wanted {
        let Some(&(_, start)) = offsets.iter().find(|(k, _)| k == pname) else {
            return Err(field_err(format!(
                "field \"sparse_offsets\" lacks the part \"{pname}\""
            )));
        };
        let count = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let nbytes = match count {
            Some(c) => mul(c, pdtype.size(), pname)?,
            None => return Err(size_err(format!("part {pname} overflows 64 bits"))),
        };
        parts.push(part(
            pname,
            pdtype,
            shape,
            nbytes,
            PartMap::Contiguous { start },
        ));
    }
    let decoded_size = sparse_end(&parts)?;
    if encoding == Encoding::Raw && raw.size != decoded_size {
        return Err(size_err(format!(
            "raw sparse blob is {} bytes but its parts end at {decoded_size}",
            raw.size
        )));
    }
    Ok(Layout {
        encoding,
        decoded_size,
        sparse: Some(Sparse {
            format,
            form: SparseForm::Spec,
            nnz,
        }),
        parts,
    })
}

/// nnz, the index element type, and where each part starts.
type SparseFields = (u64, DType, Vec<(String, u64)>);

/// The fields of our sparse form: `nnz`, `index_dtype` (default u64) and
/// `sparse_offsets` (part name -> where it starts in the decoded blob).
fn sparse_fields(raw: &RawEntry) -> std::result::Result<SparseFields, Problem> {
    let nnz = match raw.custom("nnz") {
        Some(v) => as_u64(v).map_err(|why| field_err(format!("field \"nnz\" {why}")))?,
        None => return Err(sparse_needs("nnz")),
    };
    let index_dtype = match raw.custom("index_dtype") {
        None => DType::Uint64,
        Some(Value::Text(t)) => match DType::from_v01_name(t) {
            Some(d) if d.is_integer() => d,
            _ => return Err(Problem::Tensor(format!("unsupported index_dtype {t:?}"))),
        },
        Some(v) => return Err(wrong_type("index_dtype", v, "text")),
    };
    let offsets: Vec<(String, u64)> = match raw.custom("sparse_offsets") {
        Some(Value::Map(pairs)) => {
            let mut out = Vec::with_capacity(pairs.len());
            for (k, v) in pairs {
                let Some(k) = k.as_text() else {
                    return Err(field_err(
                        "field \"sparse_offsets\" has a non-text key".into(),
                    ));
                };
                let off =
                    as_u64(v).map_err(|why| field_err(format!("sparse_offsets.{k} {why}")))?;
                out.push((k.to_string(), off));
            }
            out
        }
        Some(v) => return Err(wrong_type("sparse_offsets", v, "a map")),
        None => return Err(sparse_needs("sparse_offsets")),
    };
    Ok((nnz, index_dtype, offsets))
}

/// Where the decoded blob of sparse `parts` ends: where the last part
/// ends, once no two parts overlap.
fn sparse_end(parts: &[Part]) -> std::result::Result<u64, Problem> {
    let mut spans: Vec<(u64, u64, &str)> = Vec::new();
    for p in parts {
        let PartMap::Contiguous { start } = p.map else {
            continue;
        };
        let end = start
            .checked_add(p.nbytes)
            .ok_or_else(|| size_err(format!("part {} ends past 2^64", p.name)))?;
        spans.push((start, end, p.name.as_str()));
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(size_err(format!(
                "sparse parts {} and {} overlap",
                w[0].2, w[1].2
            )));
        }
    }
    Ok(spans.iter().map(|s| s.1).max().unwrap_or(0))
}

/// The compressed bytes to decode, and how far, to reach decoded offset
/// `end`: from the frame holding byte `end - 8` when the blob's frames
/// declare their sizes (a packed file: about one frame), else all of it.
fn last_frames(blob: &[u8], end: u64) -> std::result::Result<(&[u8], u64), String> {
    let Some(frames) = zstd_blob::scan_frames(blob)? else {
        return Ok((blob, end));
    };
    let total = frames.last().map_or(0, |f| f.d_start + f.d_len);
    let (Some(first), Some(last)) = (
        frames.iter().find(|f| f.d_start + f.d_len > end - 8),
        frames.iter().find(|f| f.d_start + f.d_len >= end),
    ) else {
        return Err(format!(
            "zstd data decodes to only {total} bytes, needed {end}"
        ));
    };
    let range = first.c_start as usize..(last.c_start + last.c_len) as usize;
    Ok((&blob[range], end - first.d_start))
}

/// Takes `n` decoded bytes from the open-time budget, or says why not.
fn spend(probe: &mut u64, n: u64, what: &str) -> std::result::Result<(), String> {
    if n > *probe {
        return Err(format!(
            "learning its structure means decoding {what} ({n} bytes) at open, past what is left ({}) of the file's {SPARSE_PROBE_BUDGET}-byte budget for that",
            *probe
        ));
    }
    *probe -= n;
    Ok(())
}

/// The reference crate's sparse form, whose nnz lives in the data.
fn reference_sparse(
    raw: &RawEntry,
    dtype: DType,
    encoding: Encoding,
    endian: Endian,
    blob: &[u8],
    probe: &mut u64,
) -> std::result::Result<Layout, String> {
    if raw.layout == "sparsecsr" {
        reference_csr(raw, dtype, encoding, endian, blob, probe)
    } else {
        reference_coo(raw, dtype, encoding, blob, probe)
    }
}

/// The reference crate's CSR form: indptr (u64) then indices (u64) then
/// values, nnz in indptr's last entry.
fn reference_csr(
    raw: &RawEntry,
    dtype: DType,
    encoding: Encoding,
    endian: Endian,
    blob: &[u8],
    probe: &mut u64,
) -> std::result::Result<Layout, String> {
    let vsz = dtype.size();
    let ovf = || "sparse sizes overflow 64 bits".to_string();
    let Some(&nrows) = raw.shape.first() else {
        return Err("a CSR tensor needs at least one dimension".into());
    };
    let indptr_len = nrows.checked_add(1).ok_or_else(ovf)?;
    let header = indptr_len.checked_mul(8).ok_or_else(ovf)?;
    let last = match encoding {
        Encoding::Raw => {
            if header > blob.len() as u64 {
                return Err(format!(
                    "blob of {} bytes is too small for indptr[{indptr_len}]",
                    blob.len()
                ));
            }
            blob[(header - 8) as usize..header as usize].to_vec()
        }
        Encoding::Zstd => {
            let (from, n) = last_frames(blob, header)?;
            spend(probe, n, "its indptr")?;
            zstd_blob::decoded_tail8(from, n)?.to_vec()
        }
    };
    let mut b = [0u8; 8];
    b.copy_from_slice(&last);
    let nnz = match endian {
        Endian::Little => u64::from_le_bytes(b),
        Endian::Big => u64::from_be_bytes(b),
    };
    let indices = nnz.checked_mul(8).ok_or_else(ovf)?;
    let values = nnz.checked_mul(vsz).ok_or_else(ovf)?;
    let total = header
        .checked_add(indices)
        .and_then(|x| x.checked_add(values))
        .ok_or_else(ovf)?;
    if encoding == Encoding::Raw && total != blob.len() as u64 {
        return Err(format!(
            "indptr says nnz={nnz}, which needs {total} bytes, but the blob is {}",
            blob.len()
        ));
    }
    let parts = vec![
        part(
            "indptr",
            DType::Uint64,
            vec![indptr_len],
            header,
            PartMap::Contiguous { start: 0 },
        ),
        part(
            "indices",
            DType::Uint64,
            vec![nnz],
            indices,
            PartMap::Contiguous { start: header },
        ),
        part(
            "values",
            dtype,
            vec![nnz],
            values,
            PartMap::Contiguous {
                start: header + indices,
            },
        ),
    ];
    Ok(Layout {
        encoding,
        decoded_size: total,
        sparse: Some(Sparse {
            format: SparseFormat::Csr,
            form: SparseForm::Reference,
            nnz,
        }),
        parts,
    })
}

/// The reference crate's COO form: records of ndim u64 indices and one
/// value, nnz from the blob's decoded size.
fn reference_coo(
    raw: &RawEntry,
    dtype: DType,
    encoding: Encoding,
    blob: &[u8],
    probe: &mut u64,
) -> std::result::Result<Layout, String> {
    let vsz = dtype.size();
    let ovf = || "sparse sizes overflow 64 bits".to_string();
    let ndim = raw.shape.len() as u64;
    if ndim == 0 {
        return Err("a COO tensor needs at least one dimension".into());
    }
    let record = ndim
        .checked_mul(8)
        .and_then(|x| x.checked_add(vsz))
        .ok_or_else(ovf)?;
    let total = match encoding {
        Encoding::Raw => blob.len() as u64,
        // Frames that declare their sizes give the total without decoding
        // (each is checked when it is decoded to be served).
        Encoding::Zstd => match zstd_blob::scan_frames(blob)? {
            Some(frames) => frames.last().map_or(0, |f| f.d_start + f.d_len),
            None => match zstd_blob::count_decoded(blob, *probe)? {
                Some(n) => {
                    *probe -= n;
                    n
                }
                None => {
                    let left = std::mem::take(probe);
                    return Err(format!(
                        "learning its structure means decoding its records at open, more than what is left ({left} bytes) of the file's {SPARSE_PROBE_BUDGET}-byte budget for that"
                    ));
                }
            },
        },
    };
    if total % record != 0 {
        return Err(format!(
            "blob of {total} bytes is not a whole number of {record}-byte COO records"
        ));
    }
    let nnz = total / record;
    let parts = vec![
        part(
            "indices",
            DType::Uint64,
            vec![ndim, nnz],
            ndim * nnz * 8,
            if nnz == 0 {
                PartMap::Contiguous { start: 0 }
            } else {
                PartMap::CooRecordIndices { nnz, record }
            },
        ),
        part(
            "values",
            dtype,
            vec![nnz],
            nnz * vsz,
            PartMap::CooRecordValues {
                record,
                value_at: ndim * 8,
            },
        ),
    ];
    Ok(Layout {
        encoding,
        decoded_size: total,
        sparse: Some(Sparse {
            format: SparseFormat::Coo,
            form: SparseForm::Reference,
            nnz,
        }),
        parts,
    })
}

fn check_overlaps(tensors: &[Tensor], file: &str) -> Result<()> {
    let mut spans: Vec<(u64, u64, usize)> = tensors
        .iter()
        .filter(|t| t.size > 0)
        .map(|t| (t.offset, t.offset + t.size, t.index))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        if a.1 > b.0 {
            let (ta, tb) = (&tensors[a.2], &tensors[b.2]);
            return Err(Error::new(
                ErrorKind::Placement,
                file,
                Some(&tb.name),
                format!(
                    "blob [{}, {}) overlaps tensor {:?} at [{}, {})",
                    b.0, b.1, ta.name, a.0, a.1
                ),
            ));
        }
    }
    Ok(())
}

/// A part of a tensor's blob; `check_entry` sets its blob and byte order.
fn part(name: &str, dtype: DType, shape: Vec<u64>, nbytes: u64, map: PartMap) -> Part {
    Part {
        name: name.to_string(),
        dtype,
        shape,
        nbytes,
        blob: 0,
        map,
        order: Endian::Little,
        meta: crate::catalog::Meta::default(),
    }
}
