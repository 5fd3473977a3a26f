//! The formats read through `ztensor-compat` (GGUF), projected into the
//! common catalog. PyTorch `.pt`, npz, safetensors and ONNX are recognised
//! here and read by modules of their own (`super::pt`, `super::npz`,
//! `super::safetensors`, `super::onnx`); HDF5 has its own reader
//! (`super::hdf5`).
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
    Blob, Catalog, Check, Codec, DType, Endian, Json, JsonMap, Part, Producer, SourceRef, Tensor,
};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::cbor_json;
use crate::source::MappedFile;

/// The foreign formats read through the crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Safetensors,
    Gguf,
    Npz,
    Pt,
    Onnx,
}

impl Kind {
    /// As users name it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Safetensors => "safetensors",
            Kind::Gguf => "GGUF",
            Kind::Npz => "npz",
            Kind::Pt => "PyTorch .pt",
            Kind::Onnx => "ONNX",
        }
    }

    /// The crate's label for it.
    fn label(self) -> &'static str {
        match self {
            Kind::Safetensors => "safetensors",
            Kind::Gguf => "gguf",
            Kind::Npz => "npz",
            Kind::Pt => "pt",
            Kind::Onnx => "onnx",
        }
    }
}

/// Largest blob a producer will make: the crate's own cap on what it
/// decodes in one piece (1 GiB). The mount refuses anything over half its
/// cache before a producer runs; this holds whatever the cache size.
pub const MAX_COMPUTED: u64 = 1 << 30;

/// What a zip archive's member names say it is: a `.pt` checkpoint has a
/// `data.pkl`; anything else is read as npz.
pub fn zip_kind(bytes: &[u8]) -> Kind {
    let is_pt = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map(|z| z.file_names().any(|n| n.ends_with("data.pkl")))
        .unwrap_or(false);
    if is_pt { Kind::Pt } else { Kind::Npz }
}

/// Whether `bytes` look like an ONNX ModelProto: a walk over its top-level
/// protobuf fields, each a field number ModelProto has, with a known wire
/// type and within the file, starting with `ir_version` and including a
/// `graph`; or, for a model cut short (or with bytes past its end that
/// break off), `ir_version` and a graph that runs past the end, or at
/// least two such fields before the one that does, so that the ONNX reader
/// says what is wrong with it. Tried after
/// every format with a magic.
pub fn looks_like_onnx(bytes: &[u8]) -> bool {
    fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*pos)?;
            *pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    // ir_version (field 1, varint) comes first in every writer we know.
    if bytes.first() != Some(&0x08) {
        return false;
    }
    let (mut pos, mut graph, mut fields) = (0usize, false, 0u32);
    // A walk cut off by the end of the file, after two good fields.
    let cut = |pos: usize, fields: u32| fields >= 2 && pos >= bytes.len();
    while pos < bytes.len() {
        let Some(tag) = varint(bytes, &mut pos) else {
            return cut(pos, fields);
        };
        let (field, wire) = (tag >> 3, tag & 7);
        if !(1..=25).contains(&field) {
            return false;
        }
        match wire {
            0 => {
                if varint(bytes, &mut pos).is_none() {
                    return cut(pos, fields);
                }
            }
            2 => {
                let Some(n) = varint(bytes, &mut pos) else {
                    return cut(pos, fields);
                };
                match usize::try_from(n).ok().and_then(|n| pos.checked_add(n)) {
                    Some(end) if end <= bytes.len() => pos = end,
                    _ => return fields >= 2 || field == 7 && fields == 1,
                }
                graph |= field == 7;
            }
            _ => return false,
        }
        fields += 1;
        if fields > 1_000_000 {
            return false;
        }
    }
    graph
}

/// Reads `src` (a file of format `kind`) through the crate. A remote
/// file must have had what the crate reads at open made present
/// ([`super::prepare`]).
pub fn open(src: MappedFile, kind: Kind) -> Result<(Catalog, MappedFile)> {
    let source = crate_open(&src, kind).map_err(|e| match kind {
        Kind::Gguf => gguf_name_overlap(&src, e),
        _ => e,
    })?;
    let mut catalog = project(&src, kind, Arc::new(source))?;
    if kind == Kind::Gguf {
        gguf_file_order(&src, &mut catalog)?;
        gguf_no_aliasing(&src, &catalog)?;
    }
    Ok((catalog, src))
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

/// For a remote file, what a computed part's producer makes present
/// before the crate reads it: the stored bytes of the zip members it
/// inflates. (A remote ONNX model is present whole; HDF5 is not read
/// over a URL.)
struct Fetches {
    backing: Arc<dyn crate::source::Backing>,
    kind: Kind,
    /// Each compressed member's name and stored range.
    members: Vec<(String, (u64, u64))>,
}

impl Fetches {
    fn of(src: &MappedFile, kind: Kind) -> Option<Fetches> {
        let backing = src.backing()?.clone();
        let members = match kind {
            Kind::Npz | Kind::Pt => super::fetch::compressed_members(src),
            _ => Vec::new(),
        };
        Some(Fetches {
            backing,
            kind,
            members,
        })
    }

    /// The ranges tensor `name`'s producer reads: an npz tensor's own
    /// member; for a checkpoint, whose tensors name their storage only in
    /// the pickle the crate keeps to itself, every compressed storage.
    fn ranges(&self, name: &str) -> Vec<(u64, u64)> {
        let own: Vec<(u64, u64)> = self
            .members
            .iter()
            .filter(|(m, _)| self.kind == Kind::Npz && m.strip_suffix(".npy") == Some(name))
            .map(|(_, r)| *r)
            .collect();
        if !own.is_empty() {
            return own;
        }
        self.members
            .iter()
            .filter(|(m, _)| !m.ends_with("data.pkl"))
            .map(|(_, r)| *r)
            .collect()
    }
}

/// A crate error as one line naming our file (not the path we gave it).
fn refused(src: &MappedFile, given: &Path, e: impl std::fmt::Display) -> Error {
    let mut msg = e
        .to_string()
        .replace(&given.display().to_string(), src.label())
        .replace('\n', " ");
    // A zip whose directory cannot be read was taken for npz only because
    // nothing in it could say it is a `.pt` file.
    const NOT_ZIP: &str = "npz: not a ZIP archive: ";
    if let Some(at) = msg.find(NOT_ZIP) {
        let why = msg[at + NOT_ZIP.len()..].to_string();
        msg = format!(
            "{}a ZIP archive (npz or PyTorch .pt) that cannot be read, cut short or damaged: {why}",
            &msg[..at]
        );
    }
    let kind = if msg.contains("no registered projection")
        || msg.contains("not compiled in")
        || msg.contains("is refused")
        || msg.contains("are refused")
    {
        ErrorKind::Unsupported
    } else {
        ErrorKind::Index
    };
    Error::new(kind, src.label(), None, msg)
}

fn crate_open(src: &MappedFile, kind: Kind) -> Result<Source> {
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
        let link = dir.path().join(format!("file.{}", kind.label()));
        std::os::unix::fs::symlink(&fd_path, &link)
            .map_err(|e| io("cannot make a temporary link", e))?;
        let got = ztensor_compat::open(&link).map_err(|e| refused(src, &link, e))?;
        check_store(src, &got, kind, &same)?;
        return Ok(got);
    }
    let path = src.path();
    let got = ztensor_compat::open(path).map_err(|e| refused(src, path, e))?;
    check_store(src, &got, kind, &same)?;
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
    kind: Kind,
    same: &dyn Fn(&std::fs::Metadata) -> bool,
) -> Result<()> {
    let stores = got.stores();
    let ok = stores.len() == 1
        && stores[0].len() == src.len()
        && stores[0].format() == kind.label()
        && std::fs::metadata(stores[0].path()).is_ok_and(|m| same(&m));
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Data,
            src.label(),
            None,
            format!(
                "the file read as {} is not the file opened (it changed, or was read as another format)",
                kind.name()
            ),
        ))
    }
}

/// The catalog of what the crate read from `src`.
fn project(src: &MappedFile, kind: Kind, source: Arc<Source>) -> Result<Catalog> {
    let fetches = Fetches::of(src, kind);
    let mut blobs = Vec::new();
    let mut tensors = Vec::with_capacity(source.len());
    for t in source.tensors() {
        let name = t.name().to_string();
        let entry_attrs = t.attributes().map(cbor_json::from_ztensor);
        let mut meta = JsonMap::new();
        let mut parts = Ok(Vec::new());
        let mut first: Option<(ZDType, Option<String>)> = None;
        let part_names: Vec<&str> = t.parts().collect();
        let directory = part_names.len() != 1;
        for pname in &part_names {
            let p = match t.part(pname) {
                Ok(p) => p,
                Err(e) => {
                    parts = Err(e.to_string());
                    break;
                }
            };
            let logical = p.logical().map(str::to_string);
            first.get_or_insert((p.dtype(), logical.clone()));
            let (dtype, note) = our_dtype(p.dtype(), logical.as_deref());
            // A part of several, or the stored blocks of a quantized
            // tensor (its logical shape is the tensor's): a flat file.
            let shape = if directory || t.layout() != "dense" {
                vec![p.nbytes() / dtype.size().max(1)]
            } else {
                t.shape().to_vec()
            };
            let (shape, packed_odd) = packed_shape(dtype, shape, p.nbytes());
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
                        parts = Err(format!(
                            "bytes {}+{} lie outside the file ({} bytes)",
                            at.offset,
                            at.len,
                            src.len()
                        ));
                        break;
                    }
                    pmeta.insert("offset".into(), at.offset.into());
                    pmeta.insert("size".into(), at.len.into());
                    Blob {
                        source: 0,
                        offset: at.offset,
                        len: at.len,
                        codec: Codec::Raw,
                        decoded_len: at.len,
                        checks,
                        label,
                    }
                }
                Payload::Opaque { decoded_len, .. } => {
                    if *decoded_len > MAX_COMPUTED {
                        parts = Err(format!(
                            "its {decoded_len} bytes can only be made whole, and that is over \
                             the {MAX_COMPUTED}-byte limit"
                        ));
                        break;
                    }
                    Blob {
                        source: 0,
                        offset: 0,
                        len: 0,
                        codec: Codec::Computed(producer(
                            &source,
                            &name,
                            pname,
                            *decoded_len,
                            fetches
                                .as_ref()
                                .map(|f| (f.backing.clone(), f.ranges(&name))),
                        )),
                        decoded_len: *decoded_len,
                        checks,
                        label,
                    }
                }
                Payload::Encoded { encoding, .. } => {
                    parts = Err(format!("stored under encoding {encoding:?}, not read here"));
                    break;
                }
            };
            let mut part = Part::dense(dtype, shape, p.nbytes(), blobs.len(), Endian::Little);
            part.name = if directory {
                (*pname).to_string()
            } else {
                String::new()
            };
            part.meta = pmeta;
            blobs.push(blob);
            if let Ok(ps) = &mut parts {
                ps.push(part);
            }
        }
        // A plain file shows its part's fields with the tensor's.
        if let Ok(ps) = &mut parts
            && !directory
            && let Some(p) = ps.first_mut()
        {
            meta.append(&mut p.meta);
        }
        let (zd, logical) = first.unwrap_or((ZDType::U8, None));
        let layout = t.layout().to_string();
        let dtype_name = format_dtype(kind, &layout, zd, logical.as_deref());
        if kind == Kind::Gguf {
            gguf_meta(
                &mut meta,
                &layout,
                &dtype_name,
                t.shape(),
                entry_attrs.as_ref(),
            );
        } else if let Some(a) = entry_attrs {
            meta.insert("attributes".into(), a);
        }
        if let Some(l) = &logical {
            meta.insert("logical_type".into(), l.clone().into());
        }
        tensors.push(Tensor {
            name,
            dtype: dtype_name,
            shape: t.shape().to_vec(),
            layout,
            encoding: match &parts {
                Ok(ps) if ps.iter().any(|p| is_computed(&blobs, p.blob)) => "computed".into(),
                _ => "raw".into(),
            },
            directory,
            parts,
            meta,
        });
    }
    let attributes = match source.attributes().map(cbor_json::from_ztensor) {
        Some(Json::Object(m)) => m,
        Some(other) => JsonMap::from_iter([("attributes".to_string(), other)]),
        None => JsonMap::new(),
    };
    Ok(Catalog {
        format: kind.name().to_string(),
        label: src.label().to_string(),
        sources: vec![SourceRef {
            path: src.path().to_path_buf(),
            ..SourceRef::default()
        }],
        blobs,
        tensors,
        attributes,
    })
}

fn is_computed(blobs: &[Blob], b: usize) -> bool {
    blobs
        .get(b)
        .is_some_and(|b| matches!(b.codec, Codec::Computed(_)))
}

/// The stored ranges a producer makes present before the crate reads them.
type Fetch = (Arc<dyn crate::source::Backing>, Vec<(u64, u64)>);

/// A producer that asks the crate for the part's bytes (after `fetch`
/// made present what the crate will read, for a remote file).
fn producer(
    source: &Arc<Source>,
    tensor: &str,
    part: &str,
    decoded_len: u64,
    fetch: Option<Fetch>,
) -> Producer {
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
            if let Some((backing, ranges)) = &fetch {
                backing.ensure(ranges, false)?;
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

/// A packed 4-bit type's shape in stored units (the last dimension halved,
/// rounded up), and whether the last byte holds one element only.
pub(crate) fn packed_shape(d: DType, mut shape: Vec<u64>, nbytes: u64) -> (Vec<u64>, bool) {
    if d != DType::Float4E2M1FnX2 {
        return (shape, false);
    }
    let elems: u64 = shape.iter().product();
    let odd = elems % 2 == 1;
    let halve = shape.len() == 1 || shape.last().is_some_and(|l| l % 2 == 0);
    match shape.last_mut() {
        Some(l) if halve => *l = l.div_ceil(2),
        _ => shape = vec![nbytes],
    }
    (shape, odd)
}

/// The GGUF sidecar: the ggml type and, for block-quantized tensors, what
/// a block is.
fn gguf_meta(meta: &mut JsonMap, layout: &str, dtype: &str, shape: &[u64], attrs: Option<&Json>) {
    meta.insert("ggml_type".into(), dtype.into());
    if layout != "dense" {
        meta.insert("shape".into(), shape.into());
        let get = |k: &str| attrs.and_then(|a| a.get(k)).cloned().unwrap_or(Json::Null);
        meta.insert("block_elements".into(), get("elems_per_block"));
        meta.insert("block_bytes".into(), get("block_bytes"));
        meta.insert(
            "note".into(),
            "the file holds the tensor's quantized blocks as stored (ggml row order, \
             block_elements per block_bytes); nothing is dequantized"
                .into(),
        );
    }
}

/// Each format's own name for a tensor's type, which the crate does not
/// carry.
fn format_dtype(kind: Kind, layout: &str, d: ZDType, l: Option<&str>) -> String {
    if kind == Kind::Gguf
        && let Some(q) = layout.strip_prefix("gguf.")
    {
        return q.trim_end_matches("/1").to_uppercase();
    }
    let (w, z) = (d.width(), d.as_str());
    match kind {
        // safetensors and .pt have readers of their own; their arm is
        // GGUF's for want of a better.
        Kind::Gguf | Kind::Safetensors | Kind::Pt => match l {
            Some(l) => l.to_uppercase(),
            None => z.to_uppercase(),
        },
        Kind::Npz => match (l, z.as_bytes()[0]) {
            (Some("bool"), _) => "|b1".into(),
            (Some(l), _) => l.into(),
            (None, b'b') => "bfloat16".into(),
            (None, c) if w == 1 => format!("|{}1", c as char),
            (None, c) => format!("<{}{w}", c as char),
        },
        Kind::Onnx => match (l, d) {
            (Some("bool"), _) => "BOOL".into(),
            (Some(l), _) => l.to_uppercase(),
            (None, ZDType::F32) => "FLOAT".into(),
            (None, ZDType::F64) => "DOUBLE".into(),
            (None, ZDType::F16) => "FLOAT16".into(),
            (None, ZDType::BF16) => "BFLOAT16".into(),
            (None, _) => format!("{}INT{}", if z.starts_with('u') { "U" } else { "" }, w * 8),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onnx_detection_wants_ir_version_and_a_graph() {
        // ir_version 8, graph (field 7) of 2 bytes.
        assert!(looks_like_onnx(&[0x08, 0x08, 0x3a, 0x02, 0x00, 0x00]));
        assert!(!looks_like_onnx(&[0x08, 0x08]));
        // Cut in its graph: ONNX, for the reader to say so.
        assert!(looks_like_onnx(&[0x08, 0x08, 0x3a, 0x09, 0x00]));
        assert!(!looks_like_onnx(&[0x08, 0x08, 0x42, 0x09, 0x00]));
        assert!(!looks_like_onnx(b"hello world"));
        assert!(!looks_like_onnx(&[]));
    }

    #[test]
    fn packed_fp4_shapes_count_bytes() {
        assert_eq!(
            packed_shape(DType::Float4E2M1FnX2, vec![3, 4], 6),
            (vec![3, 2], false)
        );
        assert_eq!(
            packed_shape(DType::Float4E2M1FnX2, vec![5], 3),
            (vec![3], true)
        );
        assert_eq!(
            packed_shape(DType::Float4E2M1FnX2, vec![3, 3], 5),
            (vec![5], true)
        );
    }
}
