//! PyTorch `.pt` files: the zip archives `torch.save` writes (torch 1.6
//! and later), read by a restricted pickle evaluator that runs no code.
//!
//! An archive holds `<root>/data.pkl`, a pickle of the saved object whose
//! tensors point at storages by key, and `<root>/data/<key>`, each storage's
//! bytes, stored (not deflated) and 64-byte aligned by torch. The pickle is
//! evaluated by a small stack machine that knows the few callables torch's
//! tensors are rebuilt with (`torch._utils._rebuild_tensor{,_v2,_v3}`,
//! `_rebuild_parameter`, `torch._tensor._rebuild_from_type_v2` for a
//! subclass, `collections.OrderedDict`) and keeps every other object
//! opaque: no code is imported or run.
//!
//! This is our own reader rather than `ztensor-compat`'s, because that one
//! refuses the whole file for one tensor it cannot read (a complex or
//! unsigned storage, a transposed tensor), and no maintained Rust crate
//! evaluates torch's reconstruction pickles: `serde-pickle` has no
//! persistent ids or `REDUCE` of arbitrary globals. Here a tensor the
//! reader cannot serve is listed with the reason, the rest served:
//!
//! - a contiguous tensor is a raw range of its storage, served from the
//!   mapping (several tensors may share one storage: views, tied weights);
//! - a strided one (transposed, sliced with a step) is gathered into C
//!   order by a producer that reads its storage from the open file;
//! - a dtype with no element type here, a deflated storage, a tensor
//!   reaching past its storage, or a `_rebuild_tensor*` call whose
//!   arguments do not describe a tensor (a negative offset or dimension,
//!   no storage), or a tensor torch rebuilds another way (quantized,
//!   sparse, nested: another `torch._utils._rebuild_*`) is listed with
//!   the reason.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::catalog::{
    Blob, Catalog, Check, Codec, DType, Endian, Json, JsonMap, Part, Producer, Tensor,
};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::{Limits, Opened};
use crate::source::MappedFile;

/// Largest tensor gathered from strides: the same cap as other bytes only
/// a format's reader can produce.
const MAX_GATHERED: u64 = crate::formats::common::MAX_COMPUTED;
/// Bytes read from a storage at a time while gathering.
const WINDOW: u64 = 1 << 20;
/// Most opcodes evaluated.
const MAX_OPS: u64 = 100_000_000;
/// Deepest nesting of containers walked for tensors.
const MAX_DEPTH: usize = 256;
/// Longest tensor name made of nested keys.
const MAX_NAME: usize = 64 << 10;

/// The first bytes of a file `torch.save` wrote in the legacy format
/// (`_use_new_zipfile_serialization=False`): pickle protocol 2, then the
/// magic number 0x1950a86a20f9469cfc6c as a 10-byte LONG1.
pub const LEGACY_MAGIC: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";

/// Whether `bytes` are a ZIP archive trying to be one `torch.save` wrote:
/// one with a member named `data.pkl` at any depth. The reader then says
/// what is wrong with one that is not where torch puts it (at the top, or
/// in one top folder).
pub fn looks_like(bytes: &[u8]) -> bool {
    super::common::is_zip(bytes)
        && zip::ZipArchive::new(std::io::Cursor::new(bytes))
            .is_ok_and(|z| z.file_names().any(|n| n.ends_with("data.pkl")))
}

/// Reads a `.pt` archive into the catalog.
pub fn open(src: MappedFile, limits: Limits) -> Result<Opened> {
    let catalog = read(&src, limits)?;
    Ok(Opened {
        catalog,
        sources: vec![Some(src)],
    })
}

/// Where each storage's bytes are: (start, length) in the file, or why
/// they cannot be served.
type Storages = HashMap<String, std::result::Result<(u64, u64), String>>;

fn read(src: &MappedFile, limits: Limits) -> Result<Catalog> {
    let label = src.label().to_string();
    let bad = |msg: String| Error::new(ErrorKind::Index, &label, None, msg);
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(src.bytes()))
        .map_err(|e| bad(format!("not a readable zip archive: {e}")))?;
    let pkl = the_pickle(&zip).map_err(bad)?;
    let root = pkl.strip_suffix("data.pkl").unwrap_or_default().to_string();
    little_endian(&mut zip, &root, &label)?;

    let i = zip
        .index_for_name(&pkl)
        .ok_or_else(|| bad(format!("{pkl}: not found")))?;
    let pickle =
        read_member(&mut zip, i, limits.index_memory).map_err(|e| bad(format!("{pkl}: {e}")))?;
    let mut vm = Vm::new(&pickle, limits.index_memory);
    let top = vm.run().map_err(|e| bad(format!("{pkl}: {e}")))?;
    let mut found = Vec::new();
    let mut budget = vm.cap;
    vm.collect(&top, String::new(), 0, &mut budget, &mut found)
        .map_err(|e| bad(format!("{pkl}: {e}")))?;
    if found.is_empty() {
        return Err(bad(format!("{pkl}: no tensors in the saved object")));
    }
    check_names(&found, &label)?;

    let mut storages = Storages::new();
    for (_, t) in &found {
        let Ok(t) = t else { continue };
        let key = &vm.storages[t.storage].key;
        if !storages.contains_key(key) {
            let at = storage_at(&mut zip, src, &format!("{root}data/{key}"));
            storages.insert(key.clone(), at);
        }
    }

    let mut catalog = Catalog {
        attributes: JsonMap::from_iter([(
            "archive".to_string(),
            Json::from(root.trim_end_matches('/')),
        )]),
        ..Catalog::of_file("PyTorch .pt", &label, src.path())
    };
    for (name, t) in found {
        let tensor = match t {
            Ok(t) => tensor_of(src, &mut catalog.blobs, name, t, &vm.storages, &storages),
            // Rebuilt by torch's function from arguments not read here:
            // listed with the reason rather than left out.
            Err(why) => Tensor::dense(
                name,
                "unknown".into(),
                Vec::new(),
                "raw",
                Err(why),
                crate::catalog::Meta::default(),
            ),
        };
        catalog.tensors.push(tensor);
    }
    Ok(catalog)
}

/// The archive's `data.pkl`: at the top, or in one top folder, and only
/// one; or why there is none to read.
fn the_pickle(
    zip: &zip::ZipArchive<std::io::Cursor<&[u8]>>,
) -> std::result::Result<String, String> {
    let pickles: Vec<String> = zip
        .file_names()
        .filter(|n| {
            *n == "data.pkl"
                || n.strip_suffix("/data.pkl")
                    .is_some_and(|r| !r.contains('/'))
        })
        .map(str::to_string)
        .collect();
    match pickles.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err("no data.pkl in the archive: not a torch.save file".into()),
        many => Err(format!(
            "{} data.pkl entries in the archive ({}): which one was saved is unclear",
            many.len(),
            many.join(", ")
        )),
    }
}

/// Refuses an archive saved on a big-endian machine: storages are the
/// machine's byte order, and torch says which it was (`root`byteorder).
fn little_endian(
    zip: &mut zip::ZipArchive<std::io::Cursor<&[u8]>>,
    root: &str,
    label: &str,
) -> Result<()> {
    let Some(i) = zip.index_for_name(&format!("{root}byteorder")) else {
        return Ok(());
    };
    let order = read_member(zip, i, 16)
        .map_err(|e| Error::new(ErrorKind::Index, label, None, format!("byteorder: {e}")))?;
    if order.trim_ascii() == b"little" {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Unsupported,
        label,
        None,
        format!(
            "saved on a {:?}-endian machine: only little-endian .pt files are read",
            String::from_utf8_lossy(order.trim_ascii())
        ),
    ))
}

/// Refuses names no path can hold (a NUL byte) and a name saved twice.
fn check_names(found: &[(String, VmResult<TensorRef>)], label: &str) -> Result<()> {
    let mut seen = HashSet::new();
    for (name, _) in found {
        // No file system path holds one; other formats refuse it too.
        if name.contains('\0') {
            return Err(Error::new(
                ErrorKind::Index,
                label,
                Some(name),
                "a tensor name with a NUL byte",
            ));
        }
        if !seen.insert(name.as_str()) {
            return Err(Error::new(
                ErrorKind::Duplicate,
                label,
                Some(name),
                "two tensors of the saved object have this name",
            ));
        }
    }
    Ok(())
}

/// Where storage member `member`'s bytes are in the file, or why they
/// cannot be served.
fn storage_at(
    zip: &mut zip::ZipArchive<std::io::Cursor<&[u8]>>,
    src: &MappedFile,
    member: &str,
) -> std::result::Result<(u64, u64), String> {
    let i = zip
        .index_for_name(member)
        .ok_or_else(|| format!("its storage {member:?} is not in the archive"))?;
    let f = zip
        .by_index_raw(i)
        .map_err(|e| format!("its storage {member:?}: {e}"))?;
    if f.compression() != zip::CompressionMethod::Stored {
        return Err(format!(
            "its storage {member:?} is compressed ({}); torch stores storages \
             uncompressed and only those are read",
            f.compression()
        ));
    }
    check_local(src.bytes(), f.header_start(), f.name_raw()).map_err(|why| {
        format!("its storage {member:?}: the archive's directory points at {why}")
    })?;
    let (start, len) = (f.data_start(), f.size());
    if start.checked_add(len).is_some_and(|e| e <= src.len()) {
        Ok((start, len))
    } else {
        Err(format!(
            "its storage {member:?} lies past the end of the file"
        ))
    }
}

/// The catalog's tensor `name`, rebuilt as `t` describes, its blobs added
/// to `blobs`.
fn tensor_of(
    src: &MappedFile,
    blobs: &mut Vec<Blob>,
    name: String,
    t: TensorRef,
    refs: &[StorageRef],
    storages: &Storages,
) -> Tensor {
    let storage = &refs[t.storage];
    let mut meta = JsonMap::new();
    meta.insert("storage".into(), storage.key.clone().into());
    meta.insert("storage_offset".into(), t.offset.into());
    meta.insert("stride".into(), t.stride.clone().into());
    let dtype_name = format!("torch.{}", t.dtype);
    let parts = match storages.get(&storage.key) {
        // torch's storage is its persistent id's size; the record may hold
        // more, which no tensor of it reaches.
        Some(Ok((start, len))) => storage
            .nbytes()
            .and_then(|n| place(src, blobs, &name, &t, (*start, n.min(*len)), &mut meta)),
        Some(Err(why)) => Err(why.clone()),
        None => Err("its storage was not looked up".into()),
    };
    Tensor::dense(
        name,
        dtype_name,
        t.shape,
        super::common::raw_or_computed(blobs, &parts),
        parts,
        meta.into(),
    )
}

/// Whether the zip local file header at `at` is that of member `name`:
/// the central directory says where each member's header is, and the zip
/// reader does not check that the header there is that member's. What is
/// there instead, if not. (A name of another length is not read: over a
/// URL only the bytes of the directory's name length were fetched.)
fn check_local(file: &[u8], at: u64, name: &[u8]) -> std::result::Result<(), String> {
    let head = usize::try_from(at)
        .ok()
        .and_then(|at| file.get(at..at.checked_add(30)?));
    let Some(head) = head.filter(|h| h.starts_with(b"PK\x03\x04")) else {
        return Err("no local entry".into());
    };
    let n = usize::from(u16::from_le_bytes([head[26], head[27]]));
    if n != name.len() {
        return Err(format!("the local entry of a name of {n} bytes"));
    }
    let here = usize::try_from(at).unwrap_or(usize::MAX).saturating_add(30);
    match file.get(here..here.saturating_add(n)) {
        Some(found) if found == name => Ok(()),
        Some(found) => Err(format!("the entry of {:?}", String::from_utf8_lossy(found))),
        None => Err("a local entry cut short".into()),
    }
}

/// Up to `limit` bytes of zip member `i`, decompressed.
fn read_member<R: std::io::Read + std::io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    i: usize,
    limit: u64,
) -> std::result::Result<Vec<u8>, String> {
    let f = zip.by_index(i).map_err(|e| e.to_string())?;
    if f.size() > limit {
        return Err(format!(
            "{} bytes, more than the {limit} allowed (--index-memory)",
            f.size()
        ));
    }
    let mut out = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    if out.len() as u64 > limit {
        return Err(format!(
            "more than the {limit} bytes allowed (--index-memory)"
        ));
    }
    Ok(out)
}

/// Our element type for a torch dtype name (`float32`, `bool`, ...).
fn element_type(torch: &str) -> Option<DType> {
    Some(match torch {
        "float64" => DType::Float64,
        "float32" => DType::Float32,
        "float16" => DType::Float16,
        "bfloat16" => DType::BFloat16,
        "int64" => DType::Int64,
        "int32" => DType::Int32,
        "int16" => DType::Int16,
        "int8" => DType::Int8,
        "uint64" => DType::Uint64,
        "uint32" => DType::Uint32,
        "uint16" => DType::Uint16,
        "uint8" => DType::Uint8,
        "bool" => DType::Bool,
        "complex64" => DType::Complex64,
        "complex128" => DType::Complex128,
        "float8_e4m3fn" => DType::Float8E4M3Fn,
        "float8_e5m2" => DType::Float8E5M2,
        "float8_e4m3fnuz" => DType::Float8E4M3Fnuz,
        "float8_e5m2fnuz" => DType::Float8E5M2Fnuz,
        "float8_e8m0fnu" => DType::Float8E8M0Fnu,
        _ => return None,
    })
}

/// The torch dtype a typed storage class holds (`FloatStorage` →
/// `float32`); the class name less `Storage`, lower-cased, otherwise.
fn storage_dtype(class: &str) -> String {
    let named = match class {
        "DoubleStorage" => "float64",
        "FloatStorage" => "float32",
        "HalfStorage" => "float16",
        "BFloat16Storage" => "bfloat16",
        "LongStorage" => "int64",
        "IntStorage" => "int32",
        "ShortStorage" => "int16",
        "CharStorage" => "int8",
        "ByteStorage" => "uint8",
        "BoolStorage" => "bool",
        "ComplexFloatStorage" => "complex64",
        "ComplexDoubleStorage" => "complex128",
        "ComplexHalfStorage" => "complex32",
        other => return other.trim_end_matches("Storage").to_lowercase(),
    };
    named.to_string()
}

/// The part of tensor `t`, whose storage is at `(start, len)` in the file:
/// a raw range when contiguous, gathered from its strides otherwise.
fn place(
    src: &MappedFile,
    blobs: &mut Vec<Blob>,
    name: &str,
    t: &TensorRef,
    (start, len): (u64, u64),
    meta: &mut JsonMap,
) -> std::result::Result<Vec<Part>, String> {
    let Some(dtype) = element_type(&t.dtype) else {
        return Err(format!("torch.{} has no element type here", t.dtype));
    };
    if t.stride.len() != t.shape.len() {
        return Err(format!(
            "{} strides for {} dimensions",
            t.stride.len(),
            t.shape.len()
        ));
    }
    let es = dtype.size();
    let too_big = || "its size overflows".to_string();
    let numel = t
        .shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(too_big)?;
    let nbytes = numel.checked_mul(es).ok_or_else(too_big)?;
    let storage_elems = len / es;
    // The last storage element the tensor touches.
    if numel > 0 {
        let last = t
            .shape
            .iter()
            .zip(&t.stride)
            .try_fold(t.offset, |a, (&d, &s)| {
                a.checked_add((d - 1).checked_mul(s)?)
            })
            .ok_or_else(too_big)?;
        if last >= storage_elems {
            return Err(format!(
                "it reaches element {last} of its storage, which holds {storage_elems}"
            ));
        }
    }
    let mut checks = Vec::new();
    if dtype == DType::Bool {
        checks.push(Check::BoolBytes);
    }
    let label = format!("tensor {name:?}");
    let contiguous = is_contiguous(&t.shape, &t.stride);
    meta.insert("contiguous".into(), contiguous.into());
    let blob = if contiguous || numel == 0 {
        let offset = if numel == 0 {
            start
        } else {
            start + t.offset * es
        };
        meta.insert("offset".into(), offset.into());
        meta.insert("size".into(), nbytes.into());
        Blob::raw(0, offset, nbytes, checks, label)
    } else {
        if nbytes > MAX_GATHERED {
            return Err(format!(
                "it is strided (not contiguous) and its {nbytes} bytes would be gathered \
                 whole, over the {MAX_GATHERED}-byte limit"
            ));
        }
        let file = src
            .file()
            .try_clone()
            .map_err(|e| format!("cannot reopen the file to gather it: {e}"))?;
        meta.insert(
            "note".into(),
            "strided in its storage: gathered into C order when first read".into(),
        );
        // The stored range is the storage the gatherer reads: over a URL
        // the data layer makes it present before the gatherer runs.
        Blob {
            source: 0,
            offset: start,
            len,
            codec: Codec::Computed(gatherer(
                file,
                Gather {
                    storage: (start, len),
                    es,
                    offset: t.offset,
                    shape: t.shape.clone(),
                    stride: t.stride.clone(),
                    nbytes,
                },
            )),
            decoded_len: nbytes,
            checks,
            label,
        }
    };
    blobs.push(blob);
    Ok(vec![Part::dense(
        dtype,
        t.shape.clone(),
        nbytes,
        blobs.len() - 1,
        Endian::Little,
    )])
}

/// Row-major strides, dimensions of size 1 excepted (theirs is arbitrary).
fn is_contiguous(shape: &[u64], stride: &[u64]) -> bool {
    let mut want = 1u64;
    for (&d, &s) in shape.iter().zip(stride).rev() {
        if d > 1 && s != want {
            return false;
        }
        want = want.saturating_mul(d);
    }
    true
}

/// What gathering a strided tensor needs.
#[derive(Debug, Clone)]
struct Gather {
    /// The storage's (offset, length) in the file.
    storage: (u64, u64),
    es: u64,
    /// In elements, as the strides.
    offset: u64,
    shape: Vec<u64>,
    stride: Vec<u64>,
    nbytes: u64,
}

fn gatherer(file: std::fs::File, g: Gather) -> Producer {
    let (file, g) = (Arc::new(file), Arc::new(g));
    let (f2, g2) = (file.clone(), g.clone());
    let stream: Option<Arc<crate::catalog::StreamFn>> = (band_row(&g) <= MAX_BAND).then(|| {
        Arc::new(
            move |emit: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>| {
                gather_stream(&f2, &g2, MAX_BAND, emit)
            },
        ) as Arc<crate::catalog::StreamFn>
    });
    Producer {
        name: "torch strides",
        stream,
        produce: Arc::new(move |out: &mut Vec<u8>| gather(&file, &g, out)),
    }
}

/// Most bytes of C-order output gathered at once for a spill.
const MAX_BAND: u64 = 32 << 20;

/// Bytes of one index of the first dimension (the whole tensor for a
/// 0-d one).
fn band_row(g: &Gather) -> u64 {
    g.shape
        .iter()
        .skip(1)
        .fold(g.es, |a, &d| a.saturating_mul(d))
}

/// Gathers the tensor in bands of whole indices of its first dimension
/// (at most `max_band` bytes each, or one index, in C order) and hands
/// each on: for a tensor too big for the cache, whose bands go to a spill
/// file.
fn gather_stream(
    file: &std::fs::File,
    g: &Gather,
    max_band: u64,
    emit: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    let row = band_row(g);
    let Some((&rows, _)) = g.shape.split_first() else {
        let mut one = Vec::with_capacity(g.nbytes as usize);
        gather(file, g, &mut one)?;
        return emit(&one);
    };
    if g.nbytes == 0 {
        return Ok(());
    }
    let per = (max_band / row.max(1)).clamp(1, rows);
    let mut band = Vec::with_capacity((per * row) as usize);
    let mut i0 = 0;
    while i0 < rows {
        let k = per.min(rows - i0);
        let mut shape = g.shape.clone();
        shape[0] = k;
        let part = Gather {
            storage: g.storage,
            es: g.es,
            offset: g.offset + i0 * g.stride[0],
            shape,
            stride: g.stride.clone(),
            nbytes: k * row,
        };
        band.clear();
        gather(file, &part, &mut band)?;
        emit(&band)?;
        i0 += k;
    }
    Ok(())
}

/// Writes the tensor's elements in C order into `out`, visiting them in
/// the order of their place in the storage (dimensions by falling stride),
/// so the storage is read forward through one window.
fn gather(file: &std::fs::File, g: &Gather, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    let n = usize::try_from(g.nbytes).map_err(|_| "too large".to_string())?;
    if out.capacity() < n {
        return Err(format!(
            "{n} bytes to gather, over the room given ({} bytes)",
            out.capacity()
        ));
    }
    out.clear();
    out.resize(n, 0);
    if n == 0 {
        return Ok(());
    }
    let nd = g.shape.len();
    // Elements between neighbours along each dimension in the output.
    let mut cstride = vec![1u64; nd];
    for d in (0..nd.saturating_sub(1)).rev() {
        cstride[d] = cstride[d + 1] * g.shape[d + 1];
    }
    // Dimensions of one element never move (their stride may be anything).
    let mut order: Vec<usize> = (0..nd).filter(|&d| g.shape[d] > 1).collect();
    order.sort_by(|&a, &b| g.stride[b].cmp(&g.stride[a]).then(a.cmp(&b)));
    let es = g.es as usize;
    let (base, slen) = g.storage;
    let mut window: Vec<u8> = Vec::new();
    let mut wstart = u64::MAX;
    let mut idx = vec![0u64; nd];
    let (mut s, mut o) = (g.offset, 0u64);
    loop {
        let at = s * g.es;
        if at < wstart || at + g.es > wstart + window.len() as u64 {
            let len = WINDOW.max(g.es).min(slen - at);
            window.resize(len as usize, 0);
            file.read_exact_at(&mut window, base + at)
                .map_err(|e| format!("reading its storage: {e}"))?;
            wstart = at;
        }
        let w = (at - wstart) as usize;
        let dst = (o * g.es) as usize;
        out[dst..dst + es].copy_from_slice(&window[w..w + es]);
        // Next index, the last dimension of `order` fastest.
        let mut k = order.len();
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            let d = order[k];
            idx[d] += 1;
            s += g.stride[d];
            o += cstride[d];
            if idx[d] < g.shape[d] {
                break;
            }
            s -= g.stride[d] * g.shape[d];
            o -= cstride[d] * g.shape[d];
            idx[d] = 0;
        }
    }
}

// ---------------------------------------------------------------------------
// The restricted pickle evaluator.

/// A tensor as `_rebuild_tensor*` describes it.
#[derive(Debug, Clone)]
struct TensorRef {
    /// Index in `Vm::storages`.
    storage: usize,
    /// torch's dtype name (`float32`).
    dtype: String,
    /// In elements.
    offset: u64,
    shape: Vec<u64>,
    stride: Vec<u64>,
}

#[derive(Debug, Clone)]
struct StorageRef {
    key: String,
    /// torch's dtype name for a typed storage; `None` for an untyped one
    /// (`torch.storage.UntypedStorage`: the tensor names its dtype).
    dtype: Option<String>,
    /// Its elements, as the persistent id says (`None` when it says no
    /// count): torch makes the storage that size, whatever the record's.
    numel: Option<u64>,
}

impl StorageRef {
    /// The storage's size in bytes, as torch makes it: its count of
    /// elements of its own dtype (bytes for an untyped one).
    fn nbytes(&self) -> std::result::Result<u64, String> {
        let numel = self
            .numel
            .ok_or("its storage's persistent id gives no element count (numel)")?;
        let size = match &self.dtype {
            None => 1,
            Some(d) => element_type(d)
                .ok_or_else(|| format!("its storage's torch.{d} has no element type here"))?
                .size(),
        };
        numel
            .checked_mul(size)
            .ok_or_else(|| "its storage's size overflows".to_string())
    }
}

/// A value on the stack. Containers live in `Vm::nodes` and are named by
/// index, so copies (memo gets, `DUP`) are cheap and share.
#[derive(Debug, Clone)]
enum Val {
    None,
    Int(i64),
    Str(Arc<str>),
    Global(Arc<str>, Arc<str>),
    /// Tuple, list or set.
    Seq(usize),
    Dict(usize),
    Storage(usize),
    Tensor(usize),
    Mark,
    /// Anything else: a float, bytes, an object of a class not known here.
    Opaque,
}

enum Node {
    Seq(Vec<Val>),
    Dict(Vec<(Val, Val)>),
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Val>,
    marks: Vec<usize>,
    memo: HashMap<u64, Val>,
    nodes: Vec<Node>,
    storages: Vec<StorageRef>,
    /// Index in `storages` of each key's first persistent id: torch loads
    /// a key once, and later ids of it (even naming another class or
    /// count) get that storage.
    by_key: HashMap<String, usize>,
    /// Each tensor rebuilt, or why its arguments could not be read.
    tensors: Vec<std::result::Result<TensorRef, String>>,
    /// Values held in containers, the stack and the memo, against `cap`.
    cells: u64,
    cap: u64,
}

type VmResult<T> = std::result::Result<T, String>;

/// The refusal of an opcode this reader does not run.
fn unread(op: u8, at: usize) -> String {
    format!("pickle opcode 0x{op:02x} at byte {at} is not read here")
}

impl<'a> Vm<'a> {
    fn new(data: &'a [u8], index_memory: u64) -> Vm<'a> {
        Vm {
            data,
            pos: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            nodes: Vec::new(),
            storages: Vec::new(),
            by_key: HashMap::new(),
            tensors: Vec::new(),
            cells: 0,
            // A cell takes about 32 bytes with its share of a container.
            cap: (index_memory / 32).max(1 << 16),
        }
    }

    fn take(&mut self, n: u64) -> VmResult<&'a [u8]> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| format!("pickle truncated at byte {}", self.pos))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn le(&mut self, n: u64) -> VmResult<u64> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x)))
    }

    fn line(&mut self) -> VmResult<&'a [u8]> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| format!("pickle truncated at byte {}", self.pos))?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    fn count(&mut self, n: u64) -> VmResult<()> {
        self.cells += n;
        if self.cells > self.cap {
            return Err(format!(
                "the pickle holds more than {} values (--index-memory)",
                self.cap
            ));
        }
        Ok(())
    }

    fn push(&mut self, v: Val) -> VmResult<()> {
        self.count(1)?;
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> VmResult<Val> {
        if self
            .marks
            .last()
            .is_some_and(|&m| m + 1 >= self.stack.len())
        {
            return Err(format!("pickle pops a mark at byte {}", self.pos));
        }
        self.stack
            .pop()
            .ok_or_else(|| format!("pickle stack empty at byte {}", self.pos))
    }

    fn pop_mark(&mut self) -> VmResult<Vec<Val>> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| format!("pickle has no mark at byte {}", self.pos))?;
        let items = self.stack.split_off(m + 1);
        self.stack.pop();
        Ok(items)
    }

    fn node(&mut self, n: Node) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    fn seq(&mut self, items: Vec<Val>) -> VmResult<Val> {
        let v = Val::Seq(self.node(Node::Seq(items)));
        self.push(v)?;
        Ok(Val::None)
    }

    fn str_of(bytes: &[u8]) -> Val {
        Val::Str(Arc::from(String::from_utf8_lossy(bytes).as_ref()))
    }

    /// Runs the pickle; the value it leaves.
    fn run(&mut self) -> VmResult<Val> {
        let mut ops = 0u64;
        loop {
            ops += 1;
            if ops > MAX_OPS {
                return Err("pickle too long (opcode limit)".into());
            }
            let at = self.pos;
            let op = *self.data.get(self.pos).ok_or("pickle ends without STOP")?;
            self.pos += 1;
            if op == b'.' {
                return self.pop(); // STOP
            }
            self.step(op, at)?;
        }
    }

    /// One opcode other than STOP, by its family.
    fn step(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            0x80 | 0x95 | b'(' | b'0' | b'1' | b'2' | 0x97 | 0x98 => self.framing(op, at),
            b'N' | 0x88 | 0x89 | b'J' | b'K' | b'M' | 0x8a | 0x8b | b'I' | b'L' | b'G' | b'F' => {
                self.scalar(op, at)
            }
            b'X' | 0x8c | 0x8d | b'T' | b'U' | b'V' | b'S' | b'B' | b'C' | 0x8e | 0x96 => {
                self.string(op, at)
            }
            b')'
            | b']'
            | 0x8f
            | b'}'
            | b't'
            | b'l'
            | 0x91
            | 0x85..=0x87
            | b'd'
            | b'a'
            | b'e'
            | 0x90
            | b's'
            | b'u' => self.container(op, at),
            b'c' | 0x93 | b'R' | 0x81 | 0x92 | b'b' | b'i' | b'o' | b'Q' | b'P' => {
                self.object(op, at)
            }
            b'p' | b'q' | b'r' | 0x94 | b'g' | b'h' | b'j' => self.memo(op, at),
            other => Err(unread(other, at)),
        }
    }

    /// Framing and the stack itself: PROTO, FRAME, MARK, POP, POP_MARK,
    /// DUP, and out-of-band buffers.
    fn framing(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            0x80 => {
                self.take(1)?; // PROTO
            }
            0x95 => {
                self.take(8)?; // FRAME: a hint only
            }
            b'(' => {
                self.marks.push(self.stack.len());
                self.push(Val::Mark)?;
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self
                    .stack
                    .last()
                    .cloned()
                    .ok_or_else(|| format!("pickle stack empty at byte {at}"))?;
                self.push(v)?;
            }
            0x97 => self.push(Val::Opaque)?, // NEXT_BUFFER
            0x98 => {}                       // READONLY_BUFFER
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// None, bools, ints and floats.
    fn scalar(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b'N' => self.push(Val::None)?,
            0x88 | 0x89 => self.push(Val::Opaque)?, // NEWTRUE, NEWFALSE
            b'J' => {
                let v = self.le(4)? as u32 as i32;
                self.push(Val::Int(i64::from(v)))?;
            }
            b'K' => {
                let v = self.le(1)?;
                self.push(Val::Int(v as i64))?;
            }
            b'M' => {
                let v = self.le(2)?;
                self.push(Val::Int(v as i64))?;
            }
            0x8a | 0x8b => {
                // LONG1, LONG4: little-endian two's complement.
                let n = if op == 0x8a { self.le(1)? } else { self.le(4)? };
                let b = self.take(n)?;
                let v = if b.len() <= 8 {
                    let neg = b.last().is_some_and(|&x| x & 0x80 != 0);
                    let mut v: i64 = if neg { -1 } else { 0 };
                    for &x in b.iter().rev() {
                        v = (v << 8) | i64::from(x);
                    }
                    Val::Int(v)
                } else {
                    Val::Opaque
                };
                self.push(v)?;
            }
            b'I' | b'L' => {
                let l = self.line()?;
                let s = String::from_utf8_lossy(l);
                let v = s
                    .trim()
                    .trim_end_matches('L')
                    .parse()
                    .map_or(Val::Opaque, Val::Int);
                self.push(v)?;
            }
            b'G' => {
                self.take(8)?;
                self.push(Val::Opaque)?;
            }
            b'F' => {
                self.line()?;
                self.push(Val::Opaque)?;
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// Strings (kept) and bytes (skipped).
    fn string(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b'X' | 0x8c | 0x8d | b'T' | b'U' => {
                let n = match op {
                    b'X' | b'T' => self.le(4)?,
                    0x8d => self.le(8)?,
                    _ => self.le(1)?,
                };
                let b = self.take(n)?;
                self.count(n / 32)?;
                self.push(Self::str_of(b))?;
            }
            b'V' | b'S' => {
                let l = self.line()?;
                let l = if op == b'S' {
                    l.strip_prefix(b"'")
                        .and_then(|l| l.strip_suffix(b"'"))
                        .unwrap_or(l)
                } else {
                    l
                };
                self.push(Self::str_of(l))?;
            }
            b'B' | b'C' | 0x8e | 0x96 => {
                let n = match op {
                    b'B' => self.le(4)?,
                    b'C' => self.le(1)?,
                    _ => self.le(8)?,
                };
                self.take(n)?;
                self.push(Val::Opaque)?;
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// Tuples, lists, sets and dicts: made, and added to.
    fn container(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b')' => {
                self.seq(Vec::new())?;
            }
            b']' | 0x8f => {
                self.seq(Vec::new())?; // EMPTY_LIST, EMPTY_SET
            }
            b'}' => {
                let v = Val::Dict(self.node(Node::Dict(Vec::new())));
                self.push(v)?;
            }
            b't' | b'l' | 0x91 => {
                let items = self.pop_mark()?;
                self.seq(items)?; // TUPLE, LIST, FROZENSET
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.seq(items)?;
            }
            b'd' => {
                let items = self.pop_mark()?;
                let pairs = pairs(items);
                let v = Val::Dict(self.node(Node::Dict(pairs)));
                self.push(v)?;
            }
            b'a' | b'e' | 0x90 => {
                let items = if op == b'a' {
                    vec![self.pop()?]
                } else {
                    self.pop_mark()?
                };
                match self.stack.last() {
                    Some(Val::Seq(i)) => {
                        if let Some(Node::Seq(v)) = self.nodes.get_mut(*i) {
                            v.extend(items);
                        }
                    }
                    Some(_) => {}
                    None => return Err(format!("pickle appends to nothing at byte {at}")),
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    vec![k, v]
                } else {
                    self.pop_mark()?
                };
                match self.stack.last() {
                    Some(Val::Dict(i)) => {
                        if let Some(Node::Dict(v)) = self.nodes.get_mut(*i) {
                            v.extend(pairs(items));
                        }
                    }
                    Some(_) => {}
                    None => return Err(format!("pickle sets items of nothing at byte {at}")),
                }
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// Globals, calls, BUILD, persistent ids (the storages), and objects
    /// not read here.
    fn object(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                let v = Val::Global(
                    Arc::from(String::from_utf8_lossy(module).as_ref()),
                    Arc::from(String::from_utf8_lossy(name).as_ref()),
                );
                self.push(v)?;
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let v = match (module, name) {
                    (Val::Str(m), Val::Str(n)) => Val::Global(m, n),
                    _ => Val::Opaque,
                };
                self.push(v)?;
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let f = self.pop()?;
                let v = self.call(&f, &args)?;
                self.push(v)?;
            }
            0x92 => {
                self.pop()?; // NEWOBJ_EX's kwargs
                let args = self.pop()?;
                let f = self.pop()?;
                let v = self.call(&f, &args)?;
                self.push(v)?;
            }
            b'b' => {
                // BUILD: a dict's state adds to it; an object of a
                // class not known here is shown as its state, so the
                // tensors of a pickled module are still found.
                let state = self.pop()?;
                let obj = self.pop()?;
                let v = match (&obj, &state) {
                    (Val::Dict(o), Val::Dict(s)) if o != s => {
                        let more = match self.nodes.get(*s) {
                            Some(Node::Dict(m)) => m.clone(),
                            _ => Vec::new(),
                        };
                        self.count(more.len() as u64)?;
                        if let Some(Node::Dict(d)) = self.nodes.get_mut(*o) {
                            d.extend(more);
                        }
                        obj
                    }
                    (Val::Opaque, _) => state,
                    _ => obj,
                };
                self.push(v)?;
            }
            b'i' => {
                self.line()?;
                self.line()?;
                self.pop_mark()?;
                self.push(Val::Opaque)?; // INST
            }
            b'o' => {
                self.pop_mark()?;
                self.push(Val::Opaque)?; // OBJ
            }
            b'Q' => {
                let pid = self.pop()?;
                let v = self.persistent(&pid)?;
                self.push(v)?;
            }
            b'P' => {
                self.line()?;
                self.push(Val::Opaque)?;
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    /// The memo: PUT and GET in their forms.
    fn memo(&mut self, op: u8, at: usize) -> VmResult<()> {
        match op {
            b'p' | b'q' | b'r' | 0x94 => {
                let key = match op {
                    b'p' => {
                        let l = self.line()?;
                        String::from_utf8_lossy(l)
                            .trim()
                            .parse()
                            .map_err(|_| format!("bad PUT at byte {at}"))?
                    }
                    b'q' => self.le(1)?,
                    b'r' => self.le(4)?,
                    _ => self.memo.len() as u64,
                };
                let top = self
                    .stack
                    .last()
                    .cloned()
                    .ok_or_else(|| format!("pickle memoizes nothing at byte {at}"))?;
                self.count(1)?;
                self.memo.insert(key, top);
            }
            b'g' | b'h' | b'j' => {
                let key = match op {
                    b'g' => {
                        let l = self.line()?;
                        String::from_utf8_lossy(l)
                            .trim()
                            .parse()
                            .map_err(|_| format!("bad GET at byte {at}"))?
                    }
                    b'h' => self.le(1)?,
                    _ => self.le(4)?,
                };
                let v =
                    self.memo.get(&key).cloned().ok_or_else(|| {
                        format!("pickle gets memo {key}, never put, at byte {at}")
                    })?;
                self.push(v)?;
            }
            other => return Err(unread(other, at)),
        }
        Ok(())
    }

    fn items(&self, v: &Val) -> &[Val] {
        match v {
            Val::Seq(i) => match self.nodes.get(*i) {
                Some(Node::Seq(items)) => items,
                _ => &[],
            },
            _ => &[],
        }
    }

    fn dims(&self, v: &Val) -> Option<Vec<u64>> {
        self.items(v)
            .iter()
            .map(|d| match d {
                Val::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            })
            .collect()
    }

    /// `REDUCE`: the few callables torch's tensors are rebuilt with.
    fn call(&mut self, f: &Val, args: &Val) -> VmResult<Val> {
        let Val::Global(module, name) = f else {
            return Ok(Val::Opaque);
        };
        // At most the 7 arguments `_rebuild_tensor_v3` takes: a huge tuple
        // reduced again and again costs nothing.
        let args: Vec<Val> = self.items(args).iter().take(8).cloned().collect();
        Ok(match (&**module, &**name) {
            ("collections", "OrderedDict") | ("builtins", "dict") | ("__builtin__", "dict") => {
                Val::Dict(self.node(Node::Dict(Vec::new())))
            }
            ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
                match args.first() {
                    Some(t @ Val::Tensor(_)) => t.clone(),
                    _ => Val::Opaque,
                }
            }
            ("torch._utils", "_rebuild_tensor" | "_rebuild_tensor_v2" | "_rebuild_tensor_v3") => {
                let t = self
                    .rebuild(name, &args)
                    .map_err(|why| format!("{module}.{name} with {why}"));
                self.tensor(t)?
            }
            // A tensor subclass: `(func, type, func's args, state)`; the
            // tensor is what `func` rebuilds, the subclass is left aside.
            ("torch._tensor" | "torch._utils", "_rebuild_from_type" | "_rebuild_from_type_v2") => {
                let t = match (args.first(), args.get(2)) {
                    (Some(Val::Global(m, f)), Some(inner))
                        if &**m == "torch._utils"
                            && matches!(
                                &**f,
                                "_rebuild_tensor" | "_rebuild_tensor_v2" | "_rebuild_tensor_v3"
                            ) =>
                    {
                        let inner: Vec<Val> = self.items(inner).iter().take(8).cloned().collect();
                        self.rebuild(f, &inner)
                            .map_err(|why| format!("{m}.{f} with {why}"))
                    }
                    _ => Err(format!(
                        "{module}.{name} of a function other than torch's _rebuild_tensor*"
                    )),
                };
                self.tensor(t)?
            }
            // torch's other rebuilds (quantized, sparse, nested, meta
            // tensors...): listed, not read.
            ("torch._utils", n) if n.starts_with("_rebuild_") => {
                self.tensor(Err(format!("{module}.{n}: a kind of tensor not read here")))?
            }
            _ => Val::Opaque,
        })
    }

    /// A tensor torch rebuilt, or why it is not read, as a value; counted
    /// against the budget.
    fn tensor(&mut self, t: VmResult<TensorRef>) -> VmResult<Val> {
        // Each call holds its own size and stride: a tuple got from the
        // memo and reduced again and again is counted.
        self.count(match &t {
            Ok(t) => 1 + (t.shape.len() + t.stride.len()) as u64,
            Err(why) => 1 + why.len() as u64 / 32,
        })?;
        self.tensors.push(t);
        Ok(Val::Tensor(self.tensors.len() - 1))
    }

    /// `_rebuild_tensor*(storage, storage_offset, size, stride, ...)`; v3
    /// adds the dtype after the hooks (for an untyped storage). What is
    /// wrong with the arguments when they do not describe a tensor.
    fn rebuild(&self, name: &str, args: &[Val]) -> VmResult<TensorRef> {
        let needed = if name == "_rebuild_tensor_v3" { 7 } else { 4 };
        if args.len() < needed {
            return Err(format!("{} arguments, not {needed}", args.len()));
        }
        let at = match &args[0] {
            Val::Storage(s) => self.storages.get(*s).map(|st| (*s, st)),
            _ => None,
        };
        let Some((s, storage)) = at else {
            return Err("a first argument that is not a storage \
                        (a persistent id (\"storage\", class, key, ...))"
                .into());
        };
        let offset = match &args[1] {
            Val::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
        .ok_or("a storage offset that is not an integer of 0 or more")?;
        let shape = self
            .dims(&args[2])
            .ok_or("a size that is not a tuple of integers of 0 or more")?;
        let stride = self
            .dims(&args[3])
            .ok_or("a stride that is not a tuple of integers of 0 or more")?;
        let dtype = match (&storage.dtype, name) {
            (_, "_rebuild_tensor_v3") => match &args[6] {
                Val::Global(m, n) if &**m == "torch" => n.to_string(),
                _ => return Err("a dtype (argument 7) that is not a torch dtype".into()),
            },
            (Some(d), _) => d.clone(),
            (None, _) => return Err("an untyped storage and no dtype".into()),
        };
        Ok(TensorRef {
            storage: s,
            dtype,
            offset,
            shape,
            stride,
        })
    }

    /// `BINPERSID`: torch's `("storage", class, key, location, numel)`.
    fn persistent(&mut self, pid: &Val) -> VmResult<Val> {
        let items = self.items(pid);
        let (Some(Val::Str(tag)), Some(Val::Global(module, class)), Some(Val::Str(key))) =
            (items.first(), items.get(1), items.get(2))
        else {
            return Ok(Val::Opaque);
        };
        if &**tag != "storage" {
            return Ok(Val::Opaque);
        }
        let dtype = match (&**module, &**class) {
            ("torch.storage", "UntypedStorage") | ("torch", "UntypedStorage") => None,
            (_, c) => Some(storage_dtype(c)),
        };
        let numel = match items.get(4) {
            Some(Val::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        };
        // Its own copy of the key: a long key got from the memo again and
        // again is counted.
        let (key, class) = (key.to_string(), class.len());
        self.count(1 + (key.len() + class) as u64 / 32)?;
        if let Some(&first) = self.by_key.get(&key) {
            return Ok(Val::Storage(first));
        }
        self.storages.push(StorageRef {
            key: key.clone(),
            dtype,
            numel,
        });
        self.by_key.insert(key, self.storages.len() - 1);
        Ok(Val::Storage(self.storages.len() - 1))
    }

    /// The tensors under `v`, named by their keys joined with `.`, in the
    /// order they were saved.
    fn collect(
        &self,
        v: &Val,
        name: String,
        depth: usize,
        budget: &mut u64,
        out: &mut Vec<(String, VmResult<TensorRef>)>,
    ) -> VmResult<()> {
        if depth > MAX_DEPTH {
            return Err("the saved object nests too deep".into());
        }
        // Containers may be shared (a memo got twice): a walk of a
        // structure doubled at every level would never end.
        *budget = budget
            .checked_sub(1)
            .ok_or("the saved object has too many values to walk (--index-memory)")?;
        let join = |k: &str| -> VmResult<String> {
            if name.len() + k.len() >= MAX_NAME {
                return Err(format!("a tensor name over {MAX_NAME} bytes"));
            }
            Ok(if name.is_empty() {
                k.to_string()
            } else {
                format!("{name}.{k}")
            })
        };
        match v {
            Val::Tensor(i) => {
                if let Some(t) = self.tensors.get(*i) {
                    out.push((name, t.clone()));
                }
            }
            Val::Dict(i) => {
                if let Some(Node::Dict(entries)) = self.nodes.get(*i) {
                    for (place, (k, v)) in entries.iter().enumerate() {
                        let key = self.key_name(k).unwrap_or_else(|| format!("#{place}"));
                        self.collect(v, join(&key)?, depth + 1, budget, out)?;
                    }
                }
            }
            Val::Seq(i) => {
                if let Some(Node::Seq(items)) = self.nodes.get(*i) {
                    for (k, v) in items.iter().enumerate() {
                        self.collect(v, join(&k.to_string())?, depth + 1, budget, out)?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl Vm<'_> {
    /// A dict key as a name: a string as it is, an integer in decimal,
    /// `None`, a tuple of those as Python shows it (`(1, 'a')`). `None`
    /// for any other key (a float, bytes, a bool, an object), which the
    /// caller names by its place in the dict.
    fn key_name(&self, k: &Val) -> Option<String> {
        let item = |k: &Val| match k {
            Val::Str(s) => Some(py_repr(s)),
            Val::Int(n) => Some(n.to_string()),
            Val::None => Some("None".into()),
            _ => None,
        };
        match k {
            Val::Str(s) => Some(s.to_string()),
            Val::Int(_) | Val::None => item(k),
            Val::Seq(i) => match self.nodes.get(*i) {
                Some(Node::Seq(items)) if items.len() <= 16 => {
                    let parts: Option<Vec<String>> = items.iter().map(item).collect();
                    let parts = parts?;
                    Some(match parts.len() {
                        1 => format!("({},)", parts[0]),
                        _ => format!("({})", parts.join(", ")),
                    })
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// A string as Python's `repr` shows it (quotes and escapes), for a
/// string inside a tuple key.
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn pairs(items: Vec<Val>) -> Vec<(Val, Val)> {
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguity_ignores_unit_dimensions() {
        assert!(is_contiguous(&[3, 4], &[4, 1]));
        assert!(is_contiguous(&[1, 4], &[99, 1]));
        assert!(is_contiguous(&[], &[]));
        assert!(!is_contiguous(&[4, 3], &[1, 4]));
        assert!(!is_contiguous(&[5], &[2]));
    }

    #[test]
    fn hostile_pickles_are_errors_not_panics() {
        for p in [
            &b""[..],
            b"\x80\x02",
            b"0.",
            b"t.",
            b"h\x05.",
            b"X\xff\xff\xff\xff",
            b"\x80\x02]q\x00(h\x00h\x00e.",
        ] {
            let mut vm = Vm::new(p, 1 << 20);
            let r = vm.run();
            if let Ok(v) = r {
                // A cycle is an error; anything else may be empty.
                let (mut out, mut budget) = (Vec::new(), 1000);
                let _ = vm.collect(&v, String::new(), 0, &mut budget, &mut out);
                assert!(out.is_empty());
            }
        }
    }

    #[test]
    fn a_self_containing_list_stops_at_the_depth_limit() {
        // [] memo 0, then append memo 0 to itself: a cycle.
        let mut vm = Vm::new(b"]q\x00h\x00a.", 1 << 20);
        let v = vm.run().unwrap();
        let (mut out, mut budget) = (Vec::new(), u64::MAX);
        assert!(
            vm.collect(&v, String::new(), 0, &mut budget, &mut out)
                .is_err()
        );
    }

    #[test]
    fn gathering_follows_strides_and_ignores_unit_dimensions() {
        // A 2x3 transposed from a 3x2 storage, with a unit dimension of
        // absurd stride in front.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("storage");
        let storage: Vec<u8> = (0..6u8).collect();
        std::fs::write(&path, &storage).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let g = Gather {
            storage: (0, 6),
            es: 1,
            offset: 0,
            shape: vec![1, 2, 3],
            stride: vec![u64::MAX, 1, 2],
            nbytes: 6,
        };
        let mut out = Vec::with_capacity(6);
        gather(&file, &g, &mut out).unwrap();
        assert_eq!(out, [0, 2, 4, 1, 3, 5]);
    }

    #[test]
    fn gathering_in_bands_gives_the_same_bytes() {
        // A 4x3x2 tensor strided out of a 2x3x4 storage (axes reversed).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("storage");
        let storage: Vec<u8> = (0..24u8).collect();
        std::fs::write(&path, &storage).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let g = Gather {
            storage: (0, 24),
            es: 1,
            offset: 0,
            shape: vec![4, 3, 2],
            stride: vec![1, 4, 12],
            nbytes: 24,
        };
        let mut whole = Vec::with_capacity(24);
        gather(&file, &g, &mut whole).unwrap();
        for band in [1, 6, 7, 13, 24, 1000] {
            let mut got = Vec::new();
            let mut sizes = Vec::new();
            gather_stream(&file, &g, band, &mut |b| {
                sizes.push(b.len());
                got.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
            assert_eq!(got, whole, "bands of {band}");
            assert!(
                sizes.iter().all(|&n| n <= band.max(6) as usize),
                "{sizes:?}"
            );
        }
        // A 0-d tensor: one band of one element.
        let scalar = Gather {
            storage: (0, 24),
            es: 2,
            offset: 5,
            shape: vec![],
            stride: vec![],
            nbytes: 2,
        };
        let mut got = Vec::new();
        gather_stream(&file, &scalar, 1, &mut |b| {
            got.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(got, [10, 11]);
    }

    #[test]
    fn an_overlong_name_is_an_error() {
        let mut p = b"}X".to_vec();
        p.extend_from_slice(&70_000u32.to_le_bytes());
        p.extend(std::iter::repeat_n(b'k', 70_000));
        p.extend_from_slice(b"}s.");
        let mut vm = Vm::new(&p, 1 << 20);
        let v = vm.run().unwrap();
        let (mut out, mut budget) = (Vec::new(), 1000);
        let e = vm
            .collect(&v, String::new(), 0, &mut budget, &mut out)
            .unwrap_err();
        assert!(e.contains("tensor name over"), "{e}");
    }

    #[test]
    fn strings_in_tuple_keys_are_shown_as_python_shows_them() {
        assert_eq!(py_repr("a"), "'a'");
        assert_eq!(py_repr("a'b"), "\"a'b\"");
        assert_eq!(py_repr("a'b\""), "'a\\'b\"'");
        assert_eq!(py_repr("c\\d\te\u{1}"), "'c\\\\d\\te\\x01'");
    }

    #[test]
    fn every_dict_key_names_its_tensors() {
        // {"ok": t, (1, 2): t, None: t, 1.5: t, True: t, 7: t}, each t a
        // float32 [2] of storage "0": torch.load keeps every key.
        let mut t = b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage".to_vec();
        t.extend_from_slice(b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu");
        t.extend_from_slice(b"K\x10tQK\x00K\x02\x85K\x01\x85tR");
        let mut p = b"}(".to_vec();
        let float = [&b"G"[..], &1.5f64.to_be_bytes()].concat();
        let keys: [&[u8]; 6] = [
            b"X\x02\x00\x00\x00ok",
            b"K\x01K\x02\x86",
            b"N",
            &float,
            b"\x88",
            b"K\x07",
        ];
        for k in keys {
            p.extend_from_slice(k);
            p.extend_from_slice(&t);
        }
        p.extend_from_slice(b"u.");
        let mut vm = Vm::new(&p, 1 << 20);
        let v = vm.run().unwrap();
        let (mut out, mut budget) = (Vec::new(), 1000);
        vm.collect(&v, String::new(), 0, &mut budget, &mut out)
            .unwrap();
        let names: Vec<_> = out.iter().map(|(n, t)| (n.as_str(), t.is_ok())).collect();
        let want = ["ok", "(1, 2)", "None", "#3", "#4", "7"];
        assert_eq!(names, want.map(|n| (n, true)));
    }

    #[test]
    fn a_doubling_structure_runs_out_of_budget() {
        // L0 = [], then 60 times: L = [L, L] (memo 0 each time).
        let mut p = b"]q\x00".to_vec();
        for _ in 0..60 {
            p.extend_from_slice(b"(h\x00h\x00lq\x00");
        }
        p.push(b'.');
        let mut vm = Vm::new(&p, 1 << 20);
        let v = vm.run().unwrap();
        let (mut out, mut budget) = (Vec::new(), 1_000_000);
        let e = vm
            .collect(&v, String::new(), 0, &mut budget, &mut out)
            .unwrap_err();
        assert!(e.contains("too many values"), "{e}");
    }
}
