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

use crate::catalog::{Blob, Catalog, Check, Codec, DType, Endian, Json, JsonMap, Part, Tensor};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::{Limits, Opened};
use crate::source::MappedFile;

mod pickle;
mod strided;

use pickle::{StorageRef, TensorRef, Vm, VmResult};
use strided::{Gather, gatherer};

/// Largest tensor gathered from strides: the same cap as other bytes only
/// a format's reader can produce.
const MAX_GATHERED: u64 = crate::formats::common::MAX_COMPUTED;

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
            "{} bytes, more than the {} allowed (--index-memory)",
            f.size(),
            crate::size::bytes(limit)
        ));
    }
    let mut out = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    if out.len() as u64 > limit {
        return Err(format!(
            "more than the {} allowed (--index-memory)",
            crate::size::bytes(limit)
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

#[cfg(test)]
mod tests;
