//! HDF5, read by our own bounded reader (no libhdf5): the superblock
//! (versions 0 to 3), object headers (1 and 2), groups as symbol tables or
//! link messages, and datasets projected into the catalog.
//!
//! - `read`: bounded reads, the superblock, the lookup3 checksum;
//! - `header`: object headers and the messages of datasets;
//! - `group`: the group graph, walked with cycles and work bounded;
//! - `dense`: links in dense storage (fractal heap, v2 B-tree);
//! - `chunks`: chunk indexes and the producer that assembles chunked data;
//! - `attrs`: simple attributes into the sidecar.
//!
//! A dataset is served from the mapping when its bytes lie in one run of
//! the file in C order (contiguous, compact, or chunks that tile the array
//! row by row and follow each other in the file); otherwise it is
//! assembled chunk by chunk into the cache (a [`Codec::Computed`] blob).

mod attrs;
mod chunks;
mod dense;
mod group;
mod header;
mod read;

use std::sync::Arc;

use crate::catalog::{
    Blob, Catalog, Check, Codec, DType, Endian, Json, JsonMap, Part, Producer, Tensor,
};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::{Limits, Opened};
use crate::source::MappedFile;

use chunks::{Assembly, Grid};
use header::{Elem, Layout, Message};

pub use read::MAGIC;

/// The lookup3 checksum every version 2 structure ends with (for tests
/// that forge files).
#[doc(hidden)]
pub fn checksum(bytes: &[u8]) -> u32 {
    read::lookup3(bytes)
}

/// Largest dataset assembled whole (the mount also refuses more than half
/// its cache).
pub const MAX_COMPUTED: u64 = 1 << 30;
/// Dimensions a dataset may have (HDF5's own limit).
const MAX_RANK: usize = 32;

/// Reads `src`, an HDF5 file, into the catalog.
pub fn open(src: MappedFile, limits: Limits) -> Result<Opened> {
    let catalog = read_catalog(&src, limits)
        .map_err(|why| Error::new(ErrorKind::Index, src.label(), None, format!("HDF5: {why}")))?;
    Ok(Opened {
        catalog,
        sources: vec![Some(src)],
    })
}

fn read_catalog(src: &MappedFile, limits: Limits) -> read::Res<Catalog> {
    let data = src.bytes();
    let sb = read::superblock(data)?;
    let f = read::H5 {
        data,
        base: sb.base,
        o: sb.o,
        l: sb.l,
    };
    let walk = group::walk(f, sb.root, sb.root_cache)?;
    // Chunk lists are the index memory this reader keeps.
    let mut budget = Budget {
        index: limits.index_memory,
        file: None,
    };
    let mut blobs = Vec::new();
    let mut tensors: Vec<Tensor> = Vec::new();
    let mut names = std::collections::HashSet::new();
    // A dataset reached by several paths is projected once.
    let mut done: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (name, found) in &walk.found {
        if !names.insert(name.clone()) {
            return Err(format!("two objects are named {name:?}"));
        }
        let t = match found {
            group::Found::Refused(why) => {
                log::warn!("{}: HDF5 {name:?}: {why}", src.label());
                unreadable(name, "group", Vec::new(), why.clone(), JsonMap::new())
            }
            group::Found::Dataset(addr, _) if done.contains_key(addr) => {
                let mut t = tensors[done[addr]].clone();
                t.name = name.clone();
                t
            }
            group::Found::Dataset(addr, msgs) => {
                done.insert(*addr, tensors.len());
                dataset(&f, src, name, msgs, &mut blobs, &mut budget)?
            }
        };
        tensors.push(t);
    }
    let attributes = attrs::collect(&f, &walk.root);
    Ok(Catalog {
        blobs,
        tensors,
        attributes,
        ..Catalog::of_file("HDF5", src.label(), src.path())
    })
}

/// What the datasets of one file share while they are projected.
struct Budget {
    /// Bytes the chunk lists may still take (`--index-memory`).
    index: u64,
    /// The descriptor the producers read chunks through.
    file: Option<Arc<std::fs::File>>,
}

fn unreadable(name: &str, dtype: &str, shape: Vec<u64>, why: String, meta: JsonMap) -> Tensor {
    Tensor::dense(
        name.to_string(),
        dtype.to_string(),
        shape,
        "raw",
        Err(why),
        meta.into(),
    )
}

/// The numpy-style name of an element type, byte order included.
fn type_name(e: &Elem) -> String {
    match *e {
        Elem::Bool => "|b1".into(),
        Elem::Int {
            size: 1, signed, ..
        } => format!("|{}1", if signed { 'i' } else { 'u' }),
        Elem::Int { size, signed, big } => {
            format!(
                "{}{}{size}",
                if big { '>' } else { '<' },
                if signed { 'i' } else { 'u' }
            )
        }
        Elem::Float { size, big } => format!("{}f{size}", if big { '>' } else { '<' }),
    }
}

fn our_dtype(e: &Elem) -> DType {
    match *e {
        Elem::Bool => DType::Bool,
        Elem::Int {
            size: 1,
            signed: true,
            ..
        } => DType::Int8,
        Elem::Int {
            size: 2,
            signed: true,
            ..
        } => DType::Int16,
        Elem::Int {
            size: 4,
            signed: true,
            ..
        } => DType::Int32,
        Elem::Int { signed: true, .. } => DType::Int64,
        Elem::Int { size: 1, .. } => DType::Uint8,
        Elem::Int { size: 2, .. } => DType::Uint16,
        Elem::Int { size: 4, .. } => DType::Uint32,
        Elem::Int { .. } => DType::Uint64,
        Elem::Float { size: 2, .. } => DType::Float16,
        Elem::Float { size: 4, .. } => DType::Float32,
        Elem::Float { .. } => DType::Float64,
    }
}

/// One dataset as a tensor. Errors in its own description make it
/// unreadable with the reason; `Err` only for what breaks the whole file.
fn dataset(
    f: &read::H5,
    src: &MappedFile,
    name: &str,
    msgs: &[Message],
    blobs: &mut Vec<Blob>,
    budget: &mut Budget,
) -> read::Res<Tensor> {
    let mut meta = JsonMap::new();
    let a = attrs::collect(f, msgs);
    if !a.is_empty() {
        meta.insert("attributes".into(), Json::Object(a));
    }
    // The dtype and shape first: the sidecar shows them even when the
    // bytes cannot be served.
    let (elem, dtype_name, shape, nbytes) = match described(f, msgs) {
        Ok(d) => d,
        Err((dtype, shape, why)) => return Ok(unreadable(name, &dtype, shape, why, meta)),
    };
    let dtype = our_dtype(&elem);
    let served = serve(
        f, src, name, msgs, &elem, &shape, nbytes, &mut meta, blobs, budget,
    );
    let (blob, encoding) = match served {
        Ok(b) => b,
        Err(why) => return Ok(unreadable(name, &dtype_name, shape, why, meta)),
    };
    let big = matches!(
        elem,
        Elem::Int { big: true, .. } | Elem::Float { big: true, .. }
    );
    let order = if big { Endian::Big } else { Endian::Little };
    let part = Part::dense(dtype, shape.clone(), nbytes, blob, order);
    Ok(Tensor::dense(
        name.to_string(),
        dtype_name,
        shape,
        encoding,
        Ok(vec![part]),
        meta.into(),
    ))
}

/// A dataset's element type, the name of its type, its shape and the
/// bytes its elements take.
type Described = (Elem, String, Vec<u64>, u64);
/// What is known of a dataset that cannot be read (the name of its type,
/// its shape), and why.
type Unreadable = (String, Vec<u64>, String);

/// What a dataset's datatype and dataspace messages describe, or why it
/// cannot be read.
fn described(f: &read::H5, msgs: &[Message]) -> std::result::Result<Described, Unreadable> {
    let find = |k: u16| msgs.iter().find(|m| m.kind == k);
    let (elem, dtype_name, esize) = match find(0x03) {
        None => return Err(("unknown".into(), Vec::new(), "no datatype message".into())),
        Some(m) if m.flags & 0x02 != 0 => {
            let why = "a committed (shared) datatype: not read here";
            return Err(("shared".into(), Vec::new(), why.into()));
        }
        Some(m) => match header::datatype(m.body) {
            Ok((size, Ok(e))) => {
                let n = type_name(&e);
                (Ok(e), n, size)
            }
            Ok((size, Err(why))) => (Err(why), header::class_name(m.body).to_string(), size),
            Err(why) => (Err(format!("datatype: {why}")), "unknown".into(), 0),
        },
    };
    let no_shape = |why: String| (dtype_name.clone(), Vec::new(), why);
    let shape = match find(0x01).map(|m| header::dataspace(m.body, f.l)) {
        None => return Err(no_shape("no dataspace message".into())),
        Some(Err(why)) => return Err(no_shape(why)),
        Some(Ok(None)) => return Err(no_shape("a null dataspace (no elements)".into())),
        Some(Ok(Some(s))) => s,
    };
    if shape.len() > MAX_RANK {
        return Err(no_shape(format!("{} dimensions", shape.len())));
    }
    let elem = match elem {
        Ok(e) => e,
        Err(why) => return Err((dtype_name, shape, why)),
    };
    if esize != elem.size() {
        return Err((dtype_name, shape, format!("datatype size {esize}")));
    }
    let count = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let Some(nbytes) = count.and_then(|c| c.checked_mul(esize)) else {
        return Err((dtype_name, shape, "its size overflows".into()));
    };
    Ok((elem, dtype_name, shape, nbytes))
}

/// Where a dataset's elements are: the stored bytes' offset and length,
/// how they are read, and the encoding's name.
type Stored = (u64, u64, Codec, String);

/// What is known of a dataset while its bytes are found.
struct Dataset<'a> {
    f: &'a read::H5<'a>,
    msgs: &'a [Message<'a>],
    elem: &'a Elem,
    shape: &'a [u64],
    /// The elements' bytes.
    nbytes: u64,
    filters: Vec<header::Filter>,
    /// Its fill value is not zero (bytes never written are not zeros).
    fill_nonzero: bool,
}

/// The blob holding a dataset's elements, and its encoding's name; or why
/// it is not served.
#[allow(clippy::too_many_arguments)]
fn serve(
    f: &read::H5,
    src: &MappedFile,
    name: &str,
    msgs: &[Message],
    elem: &Elem,
    shape: &[u64],
    nbytes: u64,
    meta: &mut JsonMap,
    blobs: &mut Vec<Blob>,
    budget: &mut Budget,
) -> std::result::Result<(usize, String), String> {
    let find = |k: u16| msgs.iter().find(|m| m.kind == k);
    // External storage (an External Data Files message): the elements are
    // in other files the dataset names, never read here. Its layout says
    // contiguous with no address, which must not read as never written.
    if find(0x07).is_some() {
        return Err(
            "its data is stored in external files it names (HDF5 external storage), which are \
             not read: not served"
                .into(),
        );
    }
    let layout = header::layout(find(0x08).ok_or("no layout message")?, f.l, f.o)?;
    let d = Dataset {
        f,
        msgs,
        elem,
        shape,
        nbytes,
        filters: match find(0x0B) {
            Some(m) => header::filters(m.body)?,
            None => Vec::new(),
        },
        fill_nonzero: match msgs.iter().find(|m| m.kind == 0x05).or_else(|| find(0x04)) {
            Some(m) => header::fill_nonzero(m)?,
            None => false,
        },
    };
    let (offset, len, codec, encoding) = match layout {
        Layout::Compact { at, len } => {
            meta.insert("hdf5_layout".into(), "compact".into());
            if len != nbytes {
                return Err(format!(
                    "compact data of {len} bytes for {nbytes} bytes of elements"
                ));
            }
            (at, len, Codec::Raw, "raw".into())
        }
        Layout::Contiguous { addr, len } => contiguous(&d, addr, len, meta)?,
        Layout::Chunked { dims, index } => chunked(d, src, &dims, &index, meta, budget)?,
    };
    blobs.push(Blob {
        source: 0,
        offset,
        len,
        codec,
        decoded_len: nbytes,
        checks: if *elem == Elem::Bool {
            vec![Check::BoolBytes]
        } else {
            Vec::new()
        },
        label: format!("tensor {name:?}"),
    });
    Ok((blobs.len() - 1, encoding))
}

/// A contiguous dataset's bytes at `addr` (`len`: what the layout says
/// they take, if it does).
fn contiguous(
    d: &Dataset<'_>,
    addr: u64,
    len: Option<u64>,
    meta: &mut JsonMap,
) -> std::result::Result<Stored, String> {
    let nbytes = d.nbytes;
    meta.insert("hdf5_layout".into(), "contiguous".into());
    if !d.filters.is_empty() {
        return Err("filters on a contiguous dataset".into());
    }
    if len.is_some_and(|l| l != nbytes) {
        return Err(format!(
            "the layout says {} bytes, the elements take {nbytes}",
            len.unwrap_or(0)
        ));
    }
    if nbytes == 0 {
        return Ok((0, 0, Codec::Raw, "raw".into()));
    }
    if d.f.undefined(addr) {
        meta.insert("hdf5_unwritten".into(), true.into());
        if d.fill_nonzero {
            return Err("never written, and its fill value is not zero: not served".into());
        }
        return Ok((0, 0, zeros(nbytes)?, "fill".into()));
    }
    let at = d.f.pos(addr, nbytes, "contiguous data")?;
    meta.insert("offset".into(), (at as u64).into());
    meta.insert("size".into(), nbytes.into());
    Ok((at as u64, nbytes, Codec::Raw, "raw".into()))
}

/// A chunked dataset's bytes: one raw range when its chunks are
/// row-major tiles stored one after the other, else assembled chunk by
/// chunk (and unfiltered) when read.
fn chunked(
    d: Dataset<'_>,
    src: &MappedFile,
    dims: &[u64],
    index: &header::Index,
    meta: &mut JsonMap,
    budget: &mut Budget,
) -> std::result::Result<Stored, String> {
    let (f, shape, nbytes) = (d.f, d.shape, d.nbytes);
    meta.insert("hdf5_layout".into(), "chunked".into());
    let esize = d.elem.size();
    let max = d
        .msgs
        .iter()
        .find(|m| m.kind == 0x01)
        .and_then(|m| header::max_dims(m.body, f.l));
    let grid = Grid::new(shape, dims, esize, max.as_deref())?;
    if dims.last() != Some(&esize) {
        return Err(format!(
            "chunks of {}-byte elements",
            dims.last().copied().unwrap_or(0)
        ));
    }
    meta.insert("chunks".into(), grid.chunk.clone().into());
    chunks::check_filters(&d.filters, esize)?;
    let names: Vec<&str> = d
        .filters
        .iter()
        .map(|x| if x.id == 1 { "deflate" } else { "shuffle" })
        .collect();
    if !names.is_empty() {
        meta.insert("filters".into(), names.clone().into());
    }
    if nbytes == 0 {
        return Ok((0, 0, Codec::Raw, "raw".into()));
    }
    let list = chunks::list(f, index, &grid, !d.filters.is_empty())?;
    let cost = (list.len() as u64).saturating_mul(std::mem::size_of::<chunks::Chunk>() as u64);
    budget.index = budget.index.checked_sub(cost).ok_or_else(|| {
        "its chunk list, with those before it, is over --index-memory".to_string()
    })?;
    if (list.len() as u64) < grid.ncells() && d.fill_nonzero {
        return Err("chunks never written, and its fill value is not zero: not served".into());
    }
    // Row-major tiles, one after the other in the file: one raw run.
    let tiles = d.filters.is_empty()
        && grid.chunk[1..] == shape[1..]
        && list.len() as u64 == grid.ncells()
        && list.windows(2).all(|w| w[0].at + w[0].size == w[1].at);
    if tiles {
        let at = list[0].at;
        if at.checked_add(nbytes).is_none_or(|e| e > src.len()) {
            return Err("its chunks run past the end of the file".into());
        }
        meta.insert("offset".into(), at.into());
        meta.insert("size".into(), nbytes.into());
        return Ok((at, nbytes, Codec::Raw, "raw".into()));
    }
    computed_ok(nbytes)?;
    let file = crate::formats::common::shared_file(&mut budget.file, src)?;
    let encoding = if names.is_empty() {
        "chunked".to_string()
    } else {
        names.join("+")
    };
    let asm = Assembly {
        file,
        grid,
        chunks: list,
        filters: d.filters,
        nbytes,
    };
    Ok((0, 0, assembled(asm), encoding))
}

/// `n` zero bytes: a dataset never written, whose fill value is zero.
fn zeros(n: u64) -> std::result::Result<Codec, String> {
    computed_ok(n)?;
    Ok(Codec::Computed(Producer {
        name: "HDF5 fill",
        produce: Arc::new(move |out: &mut Vec<u8>| {
            if (out.capacity() as u64) < n {
                return Err("no room for the fill".into());
            }
            out.clear();
            out.resize(n as usize, 0);
            Ok(())
        }),
        stream: Some(Arc::new(
            move |emit: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>| {
                let zeros = vec![0u8; (n as usize).min(1 << 20)];
                let mut left = n;
                while left > 0 {
                    let k = left.min(zeros.len() as u64);
                    emit(&zeros[..k as usize])?;
                    left -= k;
                }
                Ok(())
            },
        )),
    }))
}

/// A chunked dataset's elements, made by assembling its chunks; band by
/// band for a spill, where a band of chunks is small.
fn assembled(asm: Assembly) -> Codec {
    let asm = Arc::new(asm);
    let streamed = asm.clone();
    let stream: Option<Arc<crate::catalog::StreamFn>> =
        (asm.band_bytes() <= chunks::Assembly::MAX_BAND).then(|| {
            Arc::new(
                move |emit: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>| {
                    streamed.stream(emit)
                },
            ) as Arc<crate::catalog::StreamFn>
        });
    Codec::Computed(Producer {
        name: "HDF5 chunk",
        stream,
        produce: Arc::new(move |out: &mut Vec<u8>| asm.produce(out)),
    })
}

fn computed_ok(nbytes: u64) -> std::result::Result<(), String> {
    if nbytes > MAX_COMPUTED {
        return Err(format!(
            "its {nbytes} bytes can only be made whole, and that is over the {MAX_COMPUTED}-byte limit"
        ));
    }
    Ok(())
}
