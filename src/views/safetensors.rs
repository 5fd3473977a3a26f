//! The `model.safetensors` view: one header built at mount (names,
//! safetensors type names, shapes, offsets) followed by every dense
//! tensor's exposed bytes in header order. Tensors it cannot hold are left
//! out and listed in its `__metadata__`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use super::{Composed, Entry, FileId, Made, Registration, Source, View};
use crate::catalog::{Catalog, Codec, DType, Endian, Json, Part, PartMap};

pub const VIEW: Registration = Registration {
    name: "safetensors",
    dir: ".safetensors",
    mirrors: false,
    path_of: |dir, _path| format!("{dir}/{FILE}"),
    make,
};

/// The view's one file.
pub const FILE: &str = "model.safetensors";

/// `model.safetensors`, laid out at mount; the source file itself when
/// that is the same bytes (see [`Layout::identical`]).
struct Safetensors {
    layout: Layout,
    is_source: bool,
}

fn make(src: &Source<'_>) -> Result<Box<dyn View>, String> {
    let c = src.catalog;
    let l = Layout::build(c)?;
    for (name, why) in &l.omitted {
        log::info!(
            "{}: tensor {name:?} is not in {}/{FILE}: {why}",
            c.label,
            VIEW.dir
        );
    }
    let (layout, is_source) = match src.file {
        Some((len, read_at)) => match l.identical(c, len, read_at) {
            Ok(l) => (l, true),
            Err(l) => (l, false),
        },
        None => (l, false),
    };
    Ok(Box::new(Safetensors { layout, is_source }))
}

impl View for Safetensors {
    fn top_files(&self) -> Vec<(&'static str, Made)> {
        let file = FileId {
            kind: 0,
            tensor: None,
        };
        vec![(FILE, Made::Data(file))]
    }

    fn shown(&self) -> Vec<usize> {
        self.layout.entries.iter().map(|e| e.tensor).collect()
    }

    fn data(&self, _c: &Catalog, _f: FileId) -> Option<Composed<'_>> {
        Some(Composed {
            header: Cow::Borrowed(&self.layout.header),
            entries: Cow::Borrowed(&self.layout.entries),
            size: self.layout.size,
            is_source: self.is_source,
        })
    }
}

/// safetensors' most header bytes.
const MAX_HEADER: usize = 100_000_000;

/// safetensors' name for `d`, for the types its readers know.
pub fn dtype_name(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::Bool => "BOOL",
        DType::Uint8 => "U8",
        DType::Int8 => "I8",
        DType::Uint16 => "U16",
        DType::Int16 => "I16",
        DType::Uint32 => "U32",
        DType::Int32 => "I32",
        DType::Uint64 => "U64",
        DType::Int64 => "I64",
        DType::Float16 => "F16",
        DType::BFloat16 => "BF16",
        DType::Float32 => "F32",
        DType::Float64 => "F64",
        DType::Float8E4M3Fn => "F8_E4M3",
        DType::Float8E5M2 => "F8_E5M2",
        DType::Float8E8M0Fnu => "F8_E8M0",
        DType::Complex64 => "C64",
        // Packed two to a byte, low nibble first; the shape in elements.
        DType::Float4E2M1FnX2 => "F4",
        _ => return None,
    })
}

/// An entry of a safetensors header as `Layout::identical` reads it: a
/// tensor, or anything else (`__metadata__`).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Said {
    Tensor {
        dtype: String,
        shape: Vec<u64>,
        data_offsets: [u64; 2],
    },
    Other(serde::de::IgnoredAny),
}

#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// The 8-byte header length and the header, padded to 8 bytes.
    pub header: Vec<u8>,
    /// In file order.
    pub entries: Vec<Entry>,
    /// The whole file's size.
    pub size: u64,
    /// Tensors left out, with why.
    pub omitted: Vec<(String, String)>,
}

impl Layout {
    /// The layout of `c`'s dense tensors, or why there is none.
    pub fn build(c: &Catalog) -> Result<Layout, String> {
        // Written as it goes, not built as a JSON map first: for 10^5
        // tensors a map of values took a seventh of the mount's time.
        let mut text = Vec::with_capacity(64 * c.tensors.len() + 256);
        text.push(b'{');
        let mut names = std::collections::HashSet::with_capacity(c.tensors.len());
        let mut entries = Vec::new();
        let mut omitted = Vec::new();
        let mut at = 0u64;
        for (ti, t) in c.tensors.iter().enumerate() {
            // A packed f4 file is safetensors' F4 as it is, its shape the
            // tensor's in elements.
            let packed = |p: &&Part| p.dtype == DType::Float4E2M1FnX2 && !t.directory;
            let f4 = t
                .parts
                .as_ref()
                .ok()
                .and_then(|ps| ps.first().filter(packed));
            let part = match (&t.parts, t.plain_file().or(f4)) {
                (Ok(_), Some(p)) => p,
                (Ok(_), None) => {
                    let why = format!("not one dense array (layout {})", t.layout);
                    omitted.push((t.name.clone(), why));
                    continue;
                }
                (Err(why), _) => {
                    omitted.push((t.name.clone(), format!("unsupported: {why}")));
                    continue;
                }
            };
            let Some(dtype) = dtype_name(part.dtype) else {
                omitted.push((t.name.clone(), format!("safetensors has no {}", part.dtype)));
                continue;
            };
            // safetensors reads F4 in whole bytes, two elements each, and
            // refuses a file with a tensor of an odd count (every tensor
            // of the view would be lost to it).
            let count = t.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
            if part.dtype == DType::Float4E2M1FnX2 && count.is_none_or(|n| n % 2 == 1) {
                omitted.push((
                    t.name.clone(),
                    "F4 of an odd number of elements: safetensors reads F4 two elements to a \
                     byte"
                        .into(),
                ));
                continue;
            }
            if t.name == "__metadata__" {
                omitted.push((
                    t.name.clone(),
                    "the name is safetensors' metadata key".into(),
                ));
                continue;
            }
            if !names.insert(t.name.as_str()) {
                omitted.push((
                    t.name.clone(),
                    "a tensor of the same name comes first".into(),
                ));
                continue;
            }
            let end = at.checked_add(part.nbytes).ok_or("offsets overflow")?;
            write_entry(&mut text, &t.name, dtype, &t.shape, at, end);
            entries.push(Entry {
                start: at,
                len: part.nbytes,
                tensor: ti,
            });
            at = end;
        }
        drop(names);
        text.extend_from_slice(b"\"__metadata__\":");
        serde_json::to_writer(&mut text, &metadata(c, &omitted)).map_err(|e| e.to_string())?;
        text.push(b'}');
        let padded = (8 + text.len()).next_multiple_of(8) - 8;
        if padded > MAX_HEADER {
            return Err(format!(
                "its header would be {padded} bytes, over safetensors' {MAX_HEADER}"
            ));
        }
        text.resize(padded, b' ');
        let mut out = Vec::with_capacity(8 + padded);
        out.extend_from_slice(&(padded as u64).to_le_bytes());
        out.extend_from_slice(&text);
        let base = out.len() as u64;
        for e in &mut entries {
            e.start += base;
        }
        Ok(Layout {
            header: out,
            entries,
            size: base + at,
            omitted,
        })
    }

    /// This layout made the source file's own: when `file` (source 0 of
    /// `c`, `len` bytes, read by `read_at`) is a safetensors file holding
    /// exactly this layout's tensors, with their names, types and shapes,
    /// each stored raw and little-endian where the view would show it, the
    /// view is that file byte for byte, header and `__metadata__` included.
    /// `None` otherwise (the view keeps its own header).
    pub fn identical(
        self,
        c: &Catalog,
        len: u64,
        read_at: impl Fn(&mut [u8], u64) -> std::io::Result<()>,
    ) -> Result<Layout, Layout> {
        match self.file_header(c, len, read_at) {
            Some((header, entries)) => Ok(Layout {
                header,
                entries,
                size: len,
                omitted: Vec::new(),
            }),
            None => Err(self),
        }
    }

    fn file_header(
        &self,
        c: &Catalog,
        len: u64,
        read_at: impl Fn(&mut [u8], u64) -> std::io::Result<()>,
    ) -> Option<(Vec<u8>, Vec<Entry>)> {
        if c.sources.len() != 1 || !self.omitted.is_empty() {
            return None;
        }
        let mut n = [0u8; 8];
        read_at(&mut n, 0).ok()?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER as u64 || 8 + n > len {
            return None;
        }
        let mut header = vec![0u8; 8 + n as usize];
        read_at(&mut header, 0).ok()?;
        // Typed, not a JSON tree: a header of 10^5 tensors parsed into
        // `Value`s would take several times the index's own memory.
        let json: HashMap<String, Said> = serde_json::from_slice(&header[8..]).ok()?;
        let tensors = json.keys().filter(|k| *k != "__metadata__").count();
        if tensors != self.entries.len() {
            return None;
        }
        let base = 8 + n;
        let mut entries = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            let t = c.tensors.get(e.tensor)?;
            let part = t.parts.as_ref().ok()?.first()?;
            let blob = c.blobs.get(part.blob)?;
            let stored_as_shown = blob.source == 0
                && blob.codec == Codec::Raw
                && part.map == (PartMap::Contiguous { start: 0 })
                && (part.order == Endian::Little || part.dtype.size() <= 1)
                && blob.len == part.nbytes;
            let Said::Tensor {
                dtype,
                shape,
                data_offsets: [from, to],
            } = json.get(&t.name)?
            else {
                return None;
            };
            let same = dtype == dtype_name(part.dtype)?
                && *shape == t.shape
                && to.checked_sub(*from) == Some(part.nbytes)
                && base.checked_add(*from) == Some(blob.offset);
            if !stored_as_shown || !same {
                return None;
            }
            entries.push(Entry {
                start: blob.offset,
                len: part.nbytes,
                tensor: e.tensor,
            });
        }
        entries.sort_by_key(|e| e.start);
        // The tensors tile the data, as the view's do: no byte of the file
        // is outside the header and the entries.
        let mut at = base;
        for e in &entries {
            if e.start != at {
                return None;
            }
            at += e.len;
        }
        (at == len).then_some((header, entries))
    }

    /// The entry holding file offset `off` (past the header), if any.
    pub fn entry_at(&self, off: u64) -> Option<&Entry> {
        let i = self.entries.partition_point(|e| e.start + e.len <= off);
        self.entries.get(i).filter(|e| e.start <= off)
    }
}

/// `"NAME":{"dtype":…,"shape":[…],"data_offsets":[from,to]},` as
/// serde_json writes it.
fn write_entry(out: &mut Vec<u8>, name: &str, dtype: &str, shape: &[u64], from: u64, to: u64) {
    use std::io::Write;
    // Writes to a Vec cannot fail, and a &str always serializes.
    let _ = serde_json::to_writer(&mut *out, name);
    let _ = write!(out, ":{{\"dtype\":\"{dtype}\",\"shape\":[");
    for (i, d) in shape.iter().enumerate() {
        let _ = write!(out, "{}{d}", if i == 0 { "" } else { "," });
    }
    let _ = write!(out, "],\"data_offsets\":[{from},{to}]}},");
}

/// `__metadata__`: text values only, as safetensors wants.
fn metadata(c: &Catalog, omitted: &[(String, String)]) -> serde_json::Map<String, Json> {
    let mut m = BTreeMap::new();
    for (k, v) in &c.attributes {
        let text = match v {
            Json::String(s) => s.clone(),
            other => other.to_string(),
        };
        m.insert(k.clone(), text);
    }
    // Loaders check this key (transformers refuses a file whose metadata
    // lacks it, or says other than pt, tf, flax or mlx); safetensors'
    // torch writer puts "pt" there. Only a safetensors source's own says
    // otherwise: another format's attribute of that name means something
    // else.
    if !c.format.starts_with("safetensors") || !m.contains_key("format") {
        m.insert("format".into(), "pt".into());
    }
    m.insert("ztensor_mount.format".into(), c.format.clone());
    m.insert("ztensor_mount.source".into(), c.label.clone());
    if !omitted.is_empty() {
        let list: serde_json::Map<String, Json> = omitted
            .iter()
            .map(|(n, why)| (n.clone(), Json::String(why.clone())))
            .collect();
        m.insert(
            "ztensor_mount.omitted".into(),
            Json::Object(list).to_string(),
        );
    }
    m.into_iter().map(|(k, v)| (k, Json::String(v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Part, Tensor};

    fn dense(name: &str, shape: &[u64]) -> Tensor {
        let nbytes = 4 * shape.iter().product::<u64>();
        Tensor {
            name: name.into(),
            dtype: "float32".into(),
            shape: shape.to_vec(),
            layout: "dense".into(),
            encoding: "raw".into(),
            directory: false,
            parts: Ok(vec![Part {
                name: String::new(),
                dtype: DType::Float32,
                shape: shape.to_vec(),
                nbytes,
                blob: 0,
                map: PartMap::Contiguous { start: 0 },
                order: Endian::Little,
                meta: Default::default(),
            }]),
            meta: Default::default(),
        }
    }

    /// A packed f4 tensor of `shape` elements, two to a byte.
    fn f4(name: &str, shape: &[u64]) -> Tensor {
        let count: u64 = shape.iter().product();
        let mut t = dense(name, shape);
        t.dtype = "float4_e2m1fn_x2".into();
        if let Ok(ps) = t.parts.as_mut() {
            ps[0].dtype = DType::Float4E2M1FnX2;
            ps[0].shape = vec![count.div_ceil(2)];
            ps[0].nbytes = count.div_ceil(2);
        }
        t
    }

    #[test]
    fn an_f4_tensor_of_an_odd_count_is_left_out_and_the_rest_kept() {
        let c = Catalog {
            format: "test".into(),
            label: "t.zt".into(),
            tensors: vec![f4("q", &[7]), f4("even", &[2, 3]), dense("w", &[2])],
            ..Default::default()
        };
        let l = Layout::build(&c).unwrap();
        let n = u64::from_le_bytes(l.header[..8].try_into().unwrap()) as usize;
        let text = std::str::from_utf8(&l.header[8..8 + n]).unwrap().trim_end();
        let json: serde_json::Map<String, Json> = serde_json::from_str(text).unwrap();
        let keys: Vec<_> = json.keys().map(String::as_str).collect();
        assert_eq!(keys, ["even", "w", "__metadata__"]);
        assert_eq!(
            json["even"],
            serde_json::json!({"dtype": "F4", "shape": [2, 3], "data_offsets": [0, 3]})
        );
        let omitted = json["__metadata__"]["ztensor_mount.omitted"]
            .as_str()
            .unwrap();
        assert!(
            omitted.contains("F4 of an odd number of elements"),
            "{omitted}"
        );
    }

    #[test]
    fn the_header_is_json_in_catalog_order_and_leaves_out_names_it_cannot_hold() {
        let c = Catalog {
            format: "test".into(),
            label: "t.zt".into(),
            tensors: vec![
                dense("b \"quoted\"", &[2, 3]),
                dense("__metadata__", &[1]),
                dense("a", &[]),
                dense("b \"quoted\"", &[5]),
            ],
            ..Default::default()
        };
        let l = Layout::build(&c).unwrap();
        let n = u64::from_le_bytes(l.header[..8].try_into().unwrap()) as usize;
        assert_eq!(l.header.len(), 8 + n);
        assert_eq!(n % 8, 0);
        let text = std::str::from_utf8(&l.header[8..]).unwrap().trim_end();
        let json: serde_json::Map<String, Json> = serde_json::from_str(text).unwrap();
        let keys: Vec<_> = json.keys().map(String::as_str).collect();
        assert_eq!(keys, ["b \"quoted\"", "a", "__metadata__"]);
        assert_eq!(
            json["b \"quoted\""],
            serde_json::json!({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})
        );
        assert_eq!(
            json["a"],
            serde_json::json!({"dtype": "F32", "shape": [], "data_offsets": [24, 28]})
        );
        let omitted = json["__metadata__"]["ztensor_mount.omitted"]
            .as_str()
            .unwrap();
        assert!(omitted.contains("safetensors' metadata key"), "{omitted}");
        assert!(omitted.contains("same name comes first"), "{omitted}");
        assert_eq!(json["__metadata__"]["format"], "pt");
        assert_eq!(l.entries.len(), 2);
        assert_eq!(l.size, 8 + n as u64 + 28);
    }
}
