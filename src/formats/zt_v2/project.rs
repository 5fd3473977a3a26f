//! A validated v2 manifest in the common catalog.
//!
//! Each object is a tensor; each part one exposed file with its own blob.
//! Shards are resolved by the spec's positional convention (Appendix B:
//! root `<dir>/<stem>.zt`, shard `n` at `<dir>/<stem>-<n>.zt`) and opened
//! one by one: a missing one, or one of the wrong size or that is not a v2
//! container, is recorded as unusable and fails only the tensors with a
//! part in it. Its whole-file digest is recorded for the mount to check.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ztensor2::format::{DType as V2, Manifest, Object, Part as V2Part};

use super::check::{self, Elements};
use super::{FORMAT, MAGIC, profiles, seek};
use crate::catalog::{
    Blob, Catalog, Check, Checksum, Codec, DType, Endian, FrameTable, Json, JsonMap, Part, PartMap,
    SourceRef, Tensor,
};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::{Opened, cbor_json, shard_set};
use crate::source::MappedFile;

/// The common catalog of the v2 file `root` whose validated manifest is
/// `manifest` (`None`: a data shard, which holds no tensors).
pub fn project(root: MappedFile, manifest: Option<Manifest>) -> Result<Opened> {
    let label = root.label().to_string();
    let mut b = Builder {
        label: label.clone(),
        catalog: Catalog::of_file(FORMAT, &label, root.path()),
        maps: Vec::new(),
        shard_of: BTreeMap::new(),
    };
    let Some(manifest) = manifest else {
        b.catalog.attributes.insert(
            "data_shard".into(),
            "a zTensor v2 data shard: it holds blobs and no manifest; open its root".into(),
        );
        b.maps.push(Some(root));
        return Ok(b.finish());
    };
    shard_set::check_count(root.label(), manifest.shards.len())?;
    b.open_shards(&root, &manifest);
    b.maps.insert(0, Some(root));
    if let Some(attrs) = &manifest.attributes
        && let Json::Object(m) = cbor_json::from_ztensor(attrs)
    {
        b.catalog.attributes = m;
    }
    for (name, obj) in &manifest.objects {
        let t = b.object(name, obj)?;
        b.catalog.tensors.push(t);
    }
    Ok(b.finish())
}

struct Builder {
    label: String,
    catalog: Catalog,
    /// The mapped shards (the root goes in front once they are opened).
    maps: Vec<Option<MappedFile>>,
    /// Shard name -> index in `catalog.sources`.
    shard_of: BTreeMap<String, usize>,
}

/// Why a tensor cannot be served (it is still listed).
type Unsupported = String;
/// A file an object's layout exposes: its part's name, its element count
/// and its shape.
type Planned<'o> = (&'o str, u64, Vec<u64>);
/// An object's files in order, and for a sparse layout its count of
/// stored values.
type Plan<'o> = (Vec<Planned<'o>>, Option<u64>);
/// How a part's stored bytes are read: codec, stored length, seek table.
type Stored = (Codec, u64, Option<seek::SeekTable>);

impl Builder {
    fn finish(self) -> Opened {
        Opened {
            catalog: self.catalog,
            sources: self.maps,
        }
    }

    fn open_shards(&mut self, root: &MappedFile, manifest: &Manifest) {
        let dir = root
            .path()
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let stem = root
            .path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (name, shard) in &manifest.shards {
            // The name was checked by the crate: [A-Za-z0-9._-], no leading
            // dot, so it is one path component.
            let file_name = format!("{stem}-{name}.zt");
            let path = dir.join(&file_name);
            let digest =
                Checksum::parse(&shard.digest).unwrap_or(Checksum::Unknown(shard.digest.clone()));
            let opened = shard_set::open_bytes(root, name, &path, shard.size, container_problem);
            self.shard_of
                .insert(name.clone(), self.catalog.sources.len());
            let source = match opened {
                Ok(m) => {
                    self.maps.push(Some(m));
                    SourceRef {
                        path,
                        size: Some(shard.size),
                        digest: Some(digest),
                        digest_span: None,
                        unusable: None,
                    }
                }
                Err(why) => {
                    self.maps.push(None);
                    SourceRef {
                        size: Some(shard.size),
                        digest: Some(digest),
                        ..shard_set::unusable_source(&path, why)
                    }
                }
            };
            self.catalog.sources.push(source);
        }
    }

    fn source_of(&self, p: &V2Part) -> std::result::Result<usize, Unsupported> {
        let Some(s) = &p.blob.shard else {
            return Ok(0);
        };
        let i = *self
            .shard_of
            .get(s)
            .ok_or_else(|| format!("shard {s:?} is not in the shard table"))?;
        match &self.catalog.sources[i].unusable {
            Some(why) => Err(shard_set::unusable(why)),
            None => Ok(i),
        }
    }

    fn object(&mut self, name: &str, obj: &Object) -> Result<Tensor> {
        let main = ["data", "values"]
            .iter()
            .find_map(|k| obj.parts.get(*k))
            .or_else(|| obj.parts.values().next());
        let mut meta = JsonMap::new();
        if let Some(a) = &obj.attributes {
            meta.insert("attributes".into(), cbor_json::from_ztensor(a));
        }
        let mut part_meta = JsonMap::new();
        for (pname, p) in &obj.parts {
            part_meta.insert(pname.clone(), Json::Object(describe(p)));
        }
        meta.insert("parts".into(), Json::Object(part_meta));
        let parts = self.parts(name, obj)?;
        Ok(Tensor {
            name: name.to_string(),
            dtype: main
                .map(|p| {
                    p.logical
                        .clone()
                        .unwrap_or_else(|| p.dtype.as_str().to_string())
                })
                .unwrap_or_default(),
            shape: obj.shape.clone(),
            layout: obj.layout.clone(),
            encoding: main
                .and_then(|p| p.encoding.clone())
                .unwrap_or_else(|| "raw".into()),
            directory: obj.layout != "dense",
            parts,
            meta: meta.into(),
        })
    }

    /// The parts of an object, or why it cannot be served; `Err` refuses
    /// the file.
    fn parts(
        &mut self,
        name: &str,
        obj: &Object,
    ) -> Result<std::result::Result<Vec<Part>, Unsupported>> {
        let (plan, sparse) = match self.plan(name, obj)? {
            Ok(plan) => plan,
            Err(why) => return Ok(Err(why)),
        };
        let mut parts = Vec::with_capacity(plan.len());
        let mut tables: BTreeMap<String, (usize, Option<seek::SeekTable>)> = BTreeMap::new();
        for planned in plan {
            match self.part(name, obj, planned, &mut tables)? {
                Ok(part) => parts.push(part),
                Err(why) => return Ok(Err(why)),
            }
        }
        if let Some(nnz) = sparse
            && let Err(why) = self.sparse_data(name, obj, nnz, &tables)?
        {
            return Ok(Err(why));
        }
        Ok(Ok(parts))
    }

    /// The files an object's layout exposes, in order, and for a sparse
    /// layout its count of stored values; or why this reader does not
    /// interpret the layout.
    fn plan<'o>(
        &self,
        name: &str,
        obj: &'o Object,
    ) -> Result<std::result::Result<Plan<'o>, Unsupported>> {
        let layout = obj.layout.as_str();
        let n = obj
            .num_elements()
            .map_err(|e| super::from_crate(&self.label, Some(name), &e))?;
        let mut plan: Vec<Planned<'o>> = Vec::new();
        let one_d = |p: &V2Part| -> u64 {
            match elem_size(p) {
                Some(s) if s > 0 => p.decoded_size() / s,
                _ => p.decoded_size(),
            }
        };
        let mut sparse: Option<u64> = None;
        match layout {
            "dense" => plan.push(("data", n, obj.shape.clone())),
            "zt.sparse_csr/1" => {
                // Checked by the crate: rank 2, the three parts, the sizes.
                let w = obj.parts["indices"].dtype.width();
                let nnz = obj.parts["indices"].decoded_size() / w;
                plan.push(("indptr", obj.shape[0] + 1, vec![obj.shape[0] + 1]));
                plan.push(("indices", nnz, vec![nnz]));
                plan.push(("values", nnz, vec![nnz]));
                sparse = Some(nnz);
            }
            "zt.sparse_coo/1" => {
                let nnz = match profiles::coo(obj) {
                    Ok(nnz) => nnz,
                    Err(why) => return Err(self.refuse(name, ErrorKind::Size, why)),
                };
                let ndim = obj.shape.len() as u64;
                plan.push(("coords", ndim * nnz, vec![ndim, nnz]));
                plan.push(("values", nnz, vec![nnz]));
                sparse = Some(nnz);
            }
            "zt.mx/1" | "zt.quant_group/1" => {
                let rule = if layout == "zt.mx/1" {
                    profiles::mx(obj)
                } else {
                    profiles::quant_group(obj)
                };
                if let Err(why) = rule {
                    return Ok(Err(why));
                }
                for (pname, p) in &obj.parts {
                    // MX data holds one element per logical element.
                    let count = if layout == "zt.mx/1" && pname == "data" {
                        n
                    } else {
                        one_d(p)
                    };
                    plan.push((pname, count, vec![count]));
                }
            }
            l if l.starts_with("gguf.") && l.ends_with("/1") => {
                if let Err(why) = profiles::gguf(obj, l) {
                    return Ok(Err(why));
                }
                let p = &obj.parts["data"];
                plan.push(("data", p.decoded_size(), vec![p.decoded_size()]));
            }
            other => {
                return Ok(Err(format!(
                    "layout {other:?} is not one this reader interprets (it reads dense, \
                     zt.sparse_csr/1, zt.sparse_coo/1, zt.quant_group/1, zt.mx/1, gguf.<type>/1)"
                )));
            }
        }
        Ok(Ok((plan, sparse)))
    }

    /// The part `planned` of object `name`, with its blob added to the
    /// catalog and its seek table to `tables`; or why it cannot be served.
    fn part(
        &mut self,
        name: &str,
        obj: &Object,
        (pname, count, shape): Planned<'_>,
        tables: &mut BTreeMap<String, (usize, Option<seek::SeekTable>)>,
    ) -> Result<std::result::Result<Part, Unsupported>> {
        let dense = obj.layout == "dense";
        let Some(p) = obj.parts.get(pname) else {
            return Err(self.refuse(name, ErrorKind::Field, format!("part {pname:?} is missing")));
        };
        let dtype = match element_type(p) {
            Ok(d) => d,
            Err(why) => return Ok(Err(format!("part {pname:?}: {why}"))),
        };
        let Some(nbytes) = dtype.nbytes(count).filter(|&b| b == p.decoded_size()) else {
            return Err(self.refuse(
                name,
                ErrorKind::Size,
                format!(
                    "part {pname:?} holds {} decoded bytes, not the size of {count} {} elements",
                    p.decoded_size(),
                    dtype.name()
                ),
            ));
        };
        let source = match self.source_of(p) {
            Ok(s) => s,
            Err(why) => return Ok(Err(format!("part {pname:?} {why}"))),
        };
        let (codec, len, table) = match self.encoding(name, pname, source, p)? {
            Ok(e) => e,
            Err(why) => return Ok(Err(why)),
        };
        let mut checks = Vec::new();
        if let Some(d) = &p.digest {
            let sum = Checksum::parse(d).map_err(|why| self.refuse(name, ErrorKind::Field, why))?;
            checks.push(Check::Decoded(sum));
        }
        if dtype == DType::Bool {
            checks.push(Check::BoolBytes);
        }
        if dtype == DType::Float4E2M1FnX2 && count % 2 == 1 {
            checks.push(Check::ZeroLastNibble);
        }
        let blob = self.catalog.blobs.len();
        self.catalog.blobs.push(Blob {
            source,
            offset: p.blob.offset,
            len,
            codec,
            decoded_len: p.decoded_size(),
            checks,
            label: if dense {
                format!("tensor {name:?}")
            } else {
                format!("tensor {name:?} part {pname:?}")
            },
        });
        tables.insert(pname.to_string(), (source, table));
        Ok(Ok(Part {
            name: if dense {
                String::new()
            } else {
                pname.to_string()
            },
            dtype,
            shape,
            nbytes,
            blob,
            map: PartMap::Contiguous { start: 0 },
            order: Endian::Little,
            meta: describe(p).into(),
        }))
    }

    /// How part `pname`'s stored bytes are read: the codec, the stored
    /// length and the seek table (checked against its frames' headers); or
    /// why this reader cannot decode them.
    fn encoding(
        &self,
        name: &str,
        pname: &str,
        source: usize,
        p: &V2Part,
    ) -> Result<std::result::Result<Stored, Unsupported>> {
        Ok(Ok(match p.encoding.as_deref() {
            None => (Codec::Raw, p.blob.length, None),
            Some("zt.zstd-seekable/1") => {
                let stored = self.stored(source, p);
                let table = seek::parse(stored, p.decoded_size())
                    .and_then(|t| seek::check_frame_headers(stored, &t).map(|()| t))
                    .map_err(|why| {
                        self.refuse(name, ErrorKind::Data, format!("part {pname:?}: {why}"))
                    })?;
                if table.frames.is_empty() {
                    // Nothing to decode: an empty blob serves no bytes.
                    (Codec::Raw, 0, Some(table))
                } else {
                    let frames = FrameTable::Listed(table.frames.clone());
                    let len = table.frames_len;
                    (
                        Codec::Zstd {
                            frames: Some(frames),
                        },
                        len,
                        Some(table),
                    )
                }
            }
            Some(other) => {
                return Ok(Err(format!(
                    "part {pname:?}: encoding {other:?} is not supported (this reader \
                     decodes zt.zstd-seekable/1)"
                )));
            }
        }))
    }

    /// Checks the sparse data rules (see [`check`]).
    fn sparse_data(
        &self,
        name: &str,
        obj: &Object,
        nnz: u64,
        tables: &BTreeMap<String, (usize, Option<seek::SeekTable>)>,
    ) -> Result<std::result::Result<(), Unsupported>> {
        let reader = |pname: &str| -> Elements<'_> {
            let p = &obj.parts[pname];
            let (source, table) = &tables[pname];
            let stored = self.stored(*source, p);
            let w = p.dtype.width() as usize;
            match table {
                Some(t) => Elements::zstd(stored, &t.frames, w),
                None => Elements::raw(stored, w),
            }
        };
        let refuse = |why: String| self.refuse(name, ErrorKind::Data, why);
        if obj.layout == "zt.sparse_csr/1" {
            check::csr(
                &mut reader("indptr"),
                &mut reader("indices"),
                obj.shape[0],
                obj.shape[1],
                nnz,
            )
            .map_err(refuse)?;
            Ok(Ok(()))
        } else {
            check::coo(&mut reader("coords"), &obj.shape, nnz).map_err(refuse)
        }
    }

    /// The stored bytes of a part in a usable source (bounds were checked
    /// by the crate against the source's size, which we checked).
    /// For a source fetched on demand, the bytes are fetched first; bytes
    /// that cannot be are none (the checks over them then fail the tensor).
    fn stored(&self, source: usize, p: &V2Part) -> &[u8] {
        let Some(Some(map)) = self.maps.get(source) else {
            return &[];
        };
        if let Err(why) = map.ensure(p.blob.offset, p.blob.length) {
            log::error!("{why}");
            return &[];
        }
        let (o, l) = (p.blob.offset as usize, p.blob.length as usize);
        map.bytes().get(o..o.saturating_add(l)).unwrap_or_default()
    }

    fn refuse(&self, tensor: &str, kind: ErrorKind, why: String) -> Error {
        Error::new(kind, &self.label, Some(tensor), format!("{FORMAT}: {why}"))
    }
}

/// Why a shard file is not a v2 container, if it is not.
fn container_problem(b: &[u8]) -> Option<&'static str> {
    if b.len() < 48 {
        return Some("shorter than 48 bytes: not a zTensor v2 container");
    }
    if !b.starts_with(MAGIC) || !b.ends_with(MAGIC) {
        return Some("not a zTensor v2 container (magic missing)");
    }
    let v = &b[b.len() - 16..b.len() - 12];
    (v != 2u32.to_le_bytes()).then_some("not a version 2 container")
}

/// Bytes per element of a part, when its type is known.
fn elem_size(p: &V2Part) -> Option<u64> {
    element_type(p).ok().map(DType::size)
}

/// Our element type for a part's storage dtype and logical type.
pub fn element_type(p: &V2Part) -> std::result::Result<DType, String> {
    let storage = match p.dtype {
        V2::F64 => DType::Float64,
        V2::F32 => DType::Float32,
        V2::F16 => DType::Float16,
        V2::BF16 => DType::BFloat16,
        V2::I64 => DType::Int64,
        V2::I32 => DType::Int32,
        V2::I16 => DType::Int16,
        V2::I8 => DType::Int8,
        V2::U64 => DType::Uint64,
        V2::U32 => DType::Uint32,
        V2::U16 => DType::Uint16,
        V2::U8 => DType::Uint8,
    };
    let Some(logical) = p.logical.as_deref() else {
        return Ok(storage);
    };
    let (ours, needs) = match logical {
        "bool" => (DType::Bool, V2::U8),
        "f8_e4m3fn" => (DType::Float8E4M3Fn, V2::U8),
        "f8_e5m2" => (DType::Float8E5M2, V2::U8),
        "f8_e4m3fnuz" => (DType::Float8E4M3Fnuz, V2::U8),
        "f8_e5m2fnuz" => (DType::Float8E5M2Fnuz, V2::U8),
        "f8_e8m0" => (DType::Float8E8M0Fnu, V2::U8),
        "f4_e2m1" => (DType::Float4E2M1FnX2, V2::U8),
        "complex64" => (DType::Complex64, V2::F32),
        "complex128" => (DType::Complex128, V2::F64),
        other => {
            return Err(format!(
                "logical type {other:?} is not one this reader knows"
            ));
        }
    };
    if p.dtype != needs {
        return Err(format!(
            "logical type {logical:?} needs dtype {needs}, not {}",
            p.dtype
        ));
    }
    Ok(ours)
}

/// A part's v2 fields, for the sidecar.
fn describe(p: &V2Part) -> JsonMap {
    let mut m = JsonMap::new();
    m.insert("dtype".into(), p.dtype.as_str().into());
    if let Some(t) = &p.logical {
        m.insert("type".into(), t.clone().into());
    }
    m.insert(
        "blob".into(),
        Json::from(vec![p.blob.offset, p.blob.length]),
    );
    if let Some(s) = &p.blob.shard {
        m.insert("shard".into(), s.clone().into());
    }
    m.insert(
        "encoding".into(),
        p.encoding.clone().unwrap_or_else(|| "raw".into()).into(),
    );
    if let Some(d) = p.decoded_length {
        m.insert("decoded_length".into(), d.into());
    }
    m.insert(
        "digest".into(),
        p.digest.clone().map_or(Json::Null, Json::from),
    );
    m
}
