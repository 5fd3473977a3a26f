//! GGUF, read through `ztensor-compat` and projected into the common
//! catalog (with checks of our own the crate does not make: tensors at the
//! same bytes, the file's tensor order; `super::gguf_header` walks the
//! header for the bounds and names those need). A split GGUF set is joined
//! by `super::sharded`.
//!
//! The crate opens a path itself. So that the bytes it parses are the file
//! we mapped, it is handed `/proc/self/fd/N` of our open file (through a
//! symlink in a private directory, whose name carries the extension the
//! crate wants); where `/proc` is missing it is handed the path, and the
//! file it opened must be ours (same size, and the path still names our
//! device and inode afterwards).
//!
//! Each part the crate projects is one of: a raw range of the file (a
//! [`Codec::Raw`] blob served from our mapping), or bytes only its reader
//! can produce (a [`Codec::Computed`] blob whose producer asks the crate).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use ztensor2::provide::Payload;
use ztensor2::{DType as ZDType, Source};

use crate::catalog::{
    Blob, Catalog, Check, Codec, DType, Endian, Json, JsonMap, Part, Producer, Tensor,
};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::Limits;
use crate::formats::cbor_json;
use crate::formats::common::MAX_COMPUTED;
use crate::source::MappedFile;

/// The format as users name it.
pub const NAME: &str = "GGUF";
/// The crate's label for it (and the extension it wants).
const LABEL: &str = "gguf";

/// Whether `bytes` open a GGUF file.
pub fn looks_like(bytes: &[u8]) -> bool {
    bytes.starts_with(b"GGUF")
}

/// Reads the GGUF file `src` through the crate, its header first checked
/// against `limits`. A remote file must have had what the crate reads at
/// open made present ([`super::prepare`]).
pub fn open(src: MappedFile, limits: Limits) -> Result<(Catalog, MappedFile)> {
    bounded(&src, limits)?;
    let source = crate_open(&src).map_err(|e| gguf_name_type(&src, gguf_name_overlap(&src, e)))?;
    let mut catalog = project(&src, Arc::new(source))?;
    gguf_file_order(&src, &mut catalog)?;
    gguf_no_aliasing(&src, &catalog)?;
    Ok((catalog, src))
}

/// Refuses a GGUF header that is broken or would take more memory decoded
/// than `limits` allow, before the crate that reads GGUF decodes it.
fn bounded(src: &MappedFile, limits: Limits) -> Result<()> {
    let err = |msg: String| Error::new(ErrorKind::Index, src.label(), None, msg);
    let cost = super::gguf_header::decoded_cost(src.bytes())
        .map_err(|why| err(format!("GGUF header: {why}")))?;
    if cost > limits.index_memory {
        return Err(err(format!(
            "its GGUF header's key/values and tensors would take about {} in memory, more than \
             the {} allowed (--index-memory)",
            crate::size::bytes(cost),
            crate::size::bytes(limits.index_memory)
        )));
    }
    Ok(())
}

/// The crate's "gguf tensor type id N has no registered projection" names
/// no tensor: the first tensor of that type is named, with the type's
/// name where ggml gives it one.
fn gguf_name_type(src: &MappedFile, mut e: Error) -> Error {
    const AT: &str = "gguf tensor type id ";
    let Some(i) = e.message.find(AT) else {
        return e;
    };
    let Some(id) = e.message[i + AT.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<u32>().ok())
    else {
        return e;
    };
    let Ok(infos) = super::gguf_header::tensor_infos(src.bytes()) else {
        return e;
    };
    let Some((name, _, _)) = infos.iter().find(|(_, _, ty)| *ty == id) else {
        return e;
    };
    let known = match id {
        34 => " (TQ1_0)",
        35 => " (TQ2_0)",
        40 => " (NVFP4)",
        41 => " (Q1_0)",
        _ => "",
    };
    e.message = format!(
        "tensor {name:?} is of ggml type {id}{known}, which this version does not read (its \
         GGUF reader knows the types up to MXFP4, 39)"
    );
    e
}

/// The crate's "tensor ranges overlap at X and Y" gives file offsets only:
/// the tensors starting there are named after it.
fn gguf_name_overlap(src: &MappedFile, mut e: Error) -> Error {
    const AT: &str = "tensor ranges overlap at ";
    let Some(i) = e.message.find(AT) else {
        return e;
    };
    let at: Vec<u64> = e.message[i + AT.len()..]
        .split(" and ")
        .filter_map(|s| s.split_whitespace().next()?.parse().ok())
        .collect();
    let Ok(starts) = super::gguf_header::tensor_starts(src.bytes()) else {
        return e;
    };
    let [x, y] = at[..] else {
        return e;
    };
    let first = starts.iter().find(|(_, s)| *s == x);
    let second = first.and_then(|(a, _)| starts.iter().find(|(n, s)| *s == y && n != a));
    if let (Some((a, _)), Some((b, _))) = (first, second) {
        e.message = format!("{}: tensors {a:?} and {b:?}", e.message);
    }
    e
}

/// Two GGUF tensors at the very same bytes: the crate refuses ranges that
/// overlap but lets identical ones through, and llama.cpp refuses both.
fn gguf_no_aliasing(src: &MappedFile, catalog: &Catalog) -> Result<()> {
    let mut at: std::collections::HashMap<(u64, u64), &str> = Default::default();
    for t in &catalog.tensors {
        let Ok(parts) = &t.parts else { continue };
        for p in parts {
            let Some(b) = catalog.blobs.get(p.blob) else {
                continue;
            };
            if b.len == 0 || !matches!(b.codec, Codec::Raw) {
                continue;
            }
            if let Some(other) = at.insert((b.offset, b.len), &t.name) {
                return Err(Error::new(
                    ErrorKind::Placement,
                    src.label(),
                    Some(&t.name),
                    format!(
                        "its bytes [{}, {}) are those of tensor {other:?} too",
                        b.offset,
                        b.offset + b.len
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A GGUF file's tensors in the order of its tensor-info table (the crate
/// gives them by name). Two tensors whose bytes overlap were refused by
/// the crate already ("tensor ranges overlap"), as an overlapping
/// safetensors or deathtensors file is; two at the very same bytes are
/// refused by [`gguf_no_aliasing`].
fn gguf_file_order(src: &MappedFile, catalog: &mut Catalog) -> Result<()> {
    let order = super::gguf_header::tensor_order(src.bytes()).map_err(|why| {
        Error::new(
            ErrorKind::Index,
            src.label(),
            None,
            format!("GGUF header: {why}"),
        )
    })?;
    let at: std::collections::HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    catalog
        .tensors
        .sort_by_key(|t| at.get(t.name.as_str()).copied().unwrap_or(usize::MAX));
    Ok(())
}

/// A crate error as one line naming our file (not the path we gave it):
/// what the crate does not support, or a broken file.
fn refused(src: &MappedFile, given: &Path, e: ztensor2::Error) -> Error {
    let kind = match e {
        ztensor2::Error::Unsupported(_) => ErrorKind::Unsupported,
        _ => ErrorKind::Index,
    };
    let msg = e
        .to_string()
        .replace(&given.display().to_string(), src.label())
        .replace('\n', " ");
    Error::new(kind, src.label(), None, msg)
}

fn crate_open(src: &MappedFile) -> Result<Source> {
    use std::os::fd::AsRawFd;
    let fd_path = format!("/proc/self/fd/{}", src.file().as_raw_fd());
    let ours = src.opened();
    let same = |m: &std::fs::Metadata| {
        m.dev() == ours.dev() && m.ino() == ours.ino() && m.len() == src.len()
    };
    let by_fd = std::fs::metadata(&fd_path).is_ok_and(|m| same(&m));
    let io = |what: &str, e: std::io::Error| {
        Error::new(ErrorKind::Io, src.label(), None, format!("{what}: {e}"))
    };
    if by_fd {
        let dir = tempfile::Builder::new()
            .prefix("ztensor-mount-compat")
            .tempdir()
            .map_err(|e| io("cannot make a temporary directory", e))?;
        let link = dir.path().join(format!("file.{LABEL}"));
        std::os::unix::fs::symlink(&fd_path, &link)
            .map_err(|e| io("cannot make a temporary link", e))?;
        let got = ztensor_compat::open(&link).map_err(|e| refused(src, &link, e))?;
        check_store(src, &got, &same)?;
        return Ok(got);
    }
    let path = src.path();
    let got = ztensor_compat::open(path).map_err(|e| refused(src, path, e))?;
    check_store(src, &got, &same)?;
    let now = std::fs::metadata(path).map_err(|e| io("cannot stat", e))?;
    if !same(&now) {
        return Err(Error::new(
            ErrorKind::Data,
            src.label(),
            None,
            "the file changed while it was being read",
        ));
    }
    Ok(got)
}

fn check_store(
    src: &MappedFile,
    got: &Source,
    same: &dyn Fn(&std::fs::Metadata) -> bool,
) -> Result<()> {
    let stores = got.stores();
    let ok = stores.len() == 1
        && stores[0].len() == src.len()
        && stores[0].format() == LABEL
        && std::fs::metadata(stores[0].path()).is_ok_and(|m| same(&m));
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Data,
            src.label(),
            None,
            format!(
                "the file read as {NAME} is not the file opened (it changed, or was read as another format)"
            ),
        ))
    }
}

/// The catalog of what the crate read from `src`.
fn project(src: &MappedFile, source: Arc<Source>) -> Result<Catalog> {
    let mut blobs = Vec::new();
    let tensors = source
        .tensors()
        .map(|t| tensor_of(src, &source, &t, &mut blobs))
        .collect();
    let attributes = match source.attributes().map(cbor_json::from_ztensor) {
        Some(Json::Object(m)) => m,
        Some(other) => JsonMap::from_iter([("attributes".to_string(), other)]),
        None => JsonMap::new(),
    };
    Ok(Catalog {
        blobs,
        tensors,
        attributes,
        ..Catalog::of_file(NAME, src.label(), src.path())
    })
}

/// The catalog's tensor for the crate's `t`, its parts' blobs added to
/// `blobs`.
fn tensor_of(
    src: &MappedFile,
    source: &Arc<Source>,
    t: &ztensor2::Tensor<'_>,
    blobs: &mut Vec<Blob>,
) -> Tensor {
    let name = t.name().to_string();
    let entry_attrs = t.attributes().map(cbor_json::from_ztensor);
    let mut meta = JsonMap::new();
    let mut parts = Ok(Vec::new());
    let mut first: Option<(ZDType, Option<String>)> = None;
    let part_names: Vec<&str> = t.parts().collect();
    let directory = part_names.len() != 1;
    for pname in &part_names {
        let made = t.part(pname).map_err(|e| e.to_string()).and_then(|p| {
            let logical = p.logical().map(str::to_string);
            first.get_or_insert((p.dtype(), logical.clone()));
            part_of(src, source, t, &p, pname, directory, logical.as_deref())
        });
        match (made, &mut parts) {
            (Ok((part, blob)), Ok(ps)) => {
                let mut part = part;
                part.blob = blobs.len();
                blobs.push(blob);
                ps.push(part);
            }
            (Err(why), _) => {
                parts = Err(why);
                break;
            }
            (Ok(_), Err(_)) => {}
        }
    }
    // A plain file shows its part's fields with the tensor's.
    if let Ok(ps) = &mut parts
        && !directory
        && let Some(p) = ps.first_mut()
    {
        meta.extend(std::mem::take(&mut p.meta).to_map());
    }
    let (zd, logical) = first.unwrap_or((ZDType::U8, None));
    let layout = t.layout().to_string();
    let dtype_name = format_dtype(&layout, zd, logical.as_deref());
    gguf_meta(&mut meta, &layout, &dtype_name, entry_attrs.as_ref());
    if let Some(l) = &logical {
        meta.insert("logical_type".into(), l.clone().into());
    }
    Tensor {
        name,
        dtype: dtype_name,
        shape: t.shape().to_vec(),
        layout,
        encoding: super::common::raw_or_computed(blobs, &parts).into(),
        directory,
        parts,
        meta: meta.into(),
    }
}

/// Part `pname` of the crate's tensor `t` and its blob (the part's `blob`
/// is set by the caller), or why it cannot be served.
fn part_of(
    src: &MappedFile,
    source: &Arc<Source>,
    t: &ztensor2::Tensor<'_>,
    p: &ztensor2::Part<'_>,
    pname: &str,
    directory: bool,
    logical: Option<&str>,
) -> std::result::Result<(Part, Blob), String> {
    let name = t.name();
    let (dtype, note) = our_dtype(p.dtype(), logical);
    // A part of several, or the stored blocks of a quantized tensor (its
    // logical shape is the tensor's): a flat file.
    let shape = if directory || t.layout() != "dense" {
        vec![p.nbytes() / dtype.size().max(1)]
    } else {
        t.shape().to_vec()
    };
    let (shape, packed_odd) = super::common::packed_shape(dtype, shape, p.nbytes());
    let label = if directory {
        format!("tensor {name:?} part {pname:?}")
    } else {
        format!("tensor {name:?}")
    };
    let mut checks = Vec::new();
    if dtype == DType::Bool {
        checks.push(Check::BoolBytes);
    }
    if packed_odd {
        checks.push(Check::ZeroLastNibble);
    }
    let mut pmeta = JsonMap::new();
    if let Some(n) = note {
        pmeta.insert("dtype_note".into(), n.into());
    }
    let blob = match p.payload() {
        Payload::At(at) => {
            let inside = at
                .offset
                .checked_add(at.len)
                .is_some_and(|e| e <= src.len());
            if !inside {
                return Err(format!(
                    "bytes {}+{} lie outside the file ({} bytes)",
                    at.offset,
                    at.len,
                    src.len()
                ));
            }
            pmeta.insert("offset".into(), at.offset.into());
            pmeta.insert("size".into(), at.len.into());
            Blob::raw(0, at.offset, at.len, checks, label)
        }
        Payload::Opaque { .. } if src.is_remote() => {
            // The crate makes such bytes reading the file where it pleases;
            // over a URL those blocks may not be fetched yet, and would read
            // as zeros. (GGUF's writers store every tensor as a plain range:
            // this is defence.)
            return Err("made by ztensor-compat's reader from wherever it reads \
                        in the file, which over a URL may be bytes not fetched \
                        yet: not served; mount a local copy"
                .into());
        }
        Payload::Opaque { decoded_len, .. } => {
            if *decoded_len > MAX_COMPUTED {
                return Err(format!(
                    "its {decoded_len} bytes can only be made whole, and that is over \
                     the {MAX_COMPUTED}-byte limit"
                ));
            }
            Blob {
                source: 0,
                offset: 0,
                len: 0,
                codec: Codec::Computed(producer(source, name, pname, *decoded_len)),
                decoded_len: *decoded_len,
                checks,
                label,
            }
        }
        Payload::Encoded { encoding, .. } => {
            return Err(format!("stored under encoding {encoding:?}, not read here"));
        }
    };
    let mut part = Part::dense(dtype, shape, p.nbytes(), 0, Endian::Little);
    part.name = if directory {
        pname.to_string()
    } else {
        String::new()
    };
    part.meta = pmeta.into();
    Ok((part, blob))
}

/// A producer that asks the crate for the part's bytes (of a local file:
/// see the refusal of such parts over a URL in [`project`]).
fn producer(source: &Arc<Source>, tensor: &str, part: &str, decoded_len: u64) -> Producer {
    let (source, tensor, part) = (source.clone(), tensor.to_string(), part.to_string());
    Producer {
        name: "ztensor-compat",
        stream: None,
        produce: Arc::new(move |out: &mut Vec<u8>| {
            // The mount has counted `decoded_len` in its cache and given us
            // that capacity; refuse before the crate allocates anything if
            // that is not so.
            if decoded_len > MAX_COMPUTED || (out.capacity() as u64) < decoded_len {
                return Err(format!(
                    "{decoded_len} bytes to make, over the room given ({} bytes)",
                    out.capacity()
                ));
            }
            let t = source.tensor(&tensor).map_err(|e| e.to_string())?;
            let p = t.part(&part).map_err(|e| e.to_string())?;
            let bytes = p.bytes().map_err(|e| e.to_string())?;
            if bytes.len() as u64 != decoded_len {
                return Err(format!(
                    "the reader made {} bytes, expected {decoded_len}",
                    bytes.len()
                ));
            }
            out.extend_from_slice(&bytes);
            Ok(())
        }),
    }
}

/// Our element type for the crate's storage type and logical type, with a
/// note where the bytes are shown as something plainer than they are.
fn our_dtype(d: ZDType, logical: Option<&str>) -> (DType, Option<&'static str>) {
    let plain = match d {
        ZDType::F64 => DType::Float64,
        ZDType::F32 => DType::Float32,
        ZDType::F16 => DType::Float16,
        ZDType::BF16 => DType::BFloat16,
        ZDType::I64 => DType::Int64,
        ZDType::I32 => DType::Int32,
        ZDType::I16 => DType::Int16,
        ZDType::I8 => DType::Int8,
        ZDType::U64 => DType::Uint64,
        ZDType::U32 => DType::Uint32,
        ZDType::U16 => DType::Uint16,
        ZDType::U8 => DType::Uint8,
    };
    let Some(l) = logical else {
        return (plain, None);
    };
    let t = match l {
        "bool" => DType::Bool,
        "f8_e4m3fn" => DType::Float8E4M3Fn,
        "f8_e5m2" => DType::Float8E5M2,
        "f8_e4m3fnuz" => DType::Float8E4M3Fnuz,
        "f8_e5m2fnuz" => DType::Float8E5M2Fnuz,
        "f8_e8m0" => DType::Float8E8M0Fnu,
        "f4_e2m1" => DType::Float4E2M1FnX2,
        _ => {
            return (
                plain,
                Some("a type this mount has no element type for: its stored bytes as they are"),
            );
        }
    };
    if t.size() == plain.size() {
        (t, None)
    } else {
        (plain, Some("stored bytes as they are"))
    }
}

/// The GGUF sidecar: the ggml type and, for block-quantized tensors, what
/// a block is.
fn gguf_meta(meta: &mut JsonMap, layout: &str, dtype: &str, attrs: Option<&Json>) {
    meta.insert("ggml_type".into(), dtype.into());
    if layout != "dense" {
        let get = |k: &str| attrs.and_then(|a| a.get(k)).cloned().unwrap_or(Json::Null);
        meta.insert("block_elements".into(), get("elems_per_block"));
        meta.insert("block_bytes".into(), get("block_bytes"));
        meta.insert(
            "note".into(),
            "the file holds the tensor's quantized blocks as stored (ggml row order, \
             block_elements per block_bytes; logical_shape gives the elements); nothing is \
             dequantized"
                .into(),
        );
    }
}

/// GGUF's own name for a tensor's type (the ggml type: `Q4_K`, `F16`),
/// which the crate does not carry.
fn format_dtype(layout: &str, d: ZDType, l: Option<&str>) -> String {
    if let Some(q) = layout.strip_prefix("gguf.") {
        return q.trim_end_matches("/1").to_uppercase();
    }
    match l {
        Some(l) => l.to_uppercase(),
        None => d.as_str().to_uppercase(),
    }
}
