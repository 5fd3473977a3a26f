//! Object headers (versions 1 and 2, with their continuation blocks) and
//! the messages a dataset or a group is described by.

use super::read::{Cur, H5, Res, lookup3};

/// Messages one object header may hold, continuation blocks included.
pub const MAX_MESSAGES: usize = 4096;
/// Continuation blocks one object header may chain.
pub const MAX_CONTINUATIONS: usize = 256;

/// One header message: its type, flags and body (a slice of the file).
pub struct Message<'a> {
    pub kind: u16,
    pub flags: u8,
    pub body: &'a [u8],
    /// Absolute file position of `body` (compact data is served from it).
    pub at: u64,
}

/// Reads the object header at `addr` into its messages.
pub fn messages<'a>(f: &H5<'a>, addr: u64) -> Res<Vec<Message<'a>>> {
    let head = f.slice(addr, 4, "object header")?;
    let mut out = Vec::new();
    // Continuation blocks still to read: (address, length).
    let mut todo: Vec<(u64, u64)> = Vec::new();
    let v2 = head == b"OHDR";
    if v2 {
        let mut c = f.at(addr, "object header")?;
        c.skip(4, "object header")?;
        let version = c.u8("object header")?;
        if version != 2 {
            return Err(format!(
                "object header at {addr:#x}: version {version} with OHDR"
            ));
        }
        let flags = c.u8("object header")?;
        if flags & 0x20 != 0 {
            c.skip(16, "object header times")?;
        }
        if flags & 0x10 != 0 {
            c.skip(4, "object header phase change")?;
        }
        let size = c.uint(1 << (flags & 3), "object header chunk size")?;
        let start = c.pos as u64;
        let total = start
            .checked_add(size)
            .and_then(|n| n.checked_add(4))
            .ok_or("object header: size overflows")?;
        let whole = f.slice(addr, total, "object header")?;
        check_sum(whole, addr, "object header")?;
        let body = &whole[start as usize..whole.len() - 4];
        v2_messages(
            f,
            body,
            f.absolute(addr) + start,
            flags,
            &mut out,
            &mut todo,
        )?;
    } else {
        let mut c = f.at(addr, "object header")?;
        let version = c.u8("object header")?;
        if version != 1 {
            return Err(format!(
                "object header at {addr:#x}: version {version} (1 or 2 expected)"
            ));
        }
        c.skip(1, "object header")?;
        c.skip(2, "object header")?; // message count: the walk bounds itself
        c.skip(4, "object header")?;
        let size = u64::from(c.u32("object header")?);
        // The prefix is padded to 16 bytes.
        let first = addr
            .checked_add(16)
            .ok_or("object header: address overflows")?;
        let body = f.slice(first, size, "object header")?;
        let at = f.absolute(addr) + 16;
        v1_messages(f, body, at, &mut out, &mut todo)?;
        let mut hops = 0;
        while let Some((a, n)) = todo.pop() {
            hops += 1;
            if hops > MAX_CONTINUATIONS {
                return Err(format!(
                    "object header at {addr:#x}: too many continuation blocks"
                ));
            }
            let body = f.slice(a, n, "object header continuation")?;
            v1_messages(f, body, f.absolute(a), &mut out, &mut todo)?;
        }
        return Ok(out);
    }
    let mut hops = 0;
    while let Some((a, n)) = todo.pop() {
        hops += 1;
        if hops > MAX_CONTINUATIONS {
            return Err(format!(
                "object header at {addr:#x}: too many continuation blocks"
            ));
        }
        if n < 8 {
            return Err(format!("object header continuation at {a:#x}: {n} bytes"));
        }
        let whole = f.slice(a, n, "object header continuation")?;
        if &whole[..4] != b"OCHK" {
            return Err(format!(
                "object header continuation at {a:#x}: no OCHK signature"
            ));
        }
        check_sum(whole, a, "object header continuation")?;
        let flags = f.slice(addr, 6, "object header")?[5];
        v2_messages(
            f,
            &whole[4..whole.len() - 4],
            f.absolute(a) + 4,
            flags,
            &mut out,
            &mut todo,
        )?;
    }
    Ok(out)
}

fn check_sum(whole: &[u8], addr: u64, what: &str) -> Res<()> {
    let (data, sum) = whole.split_at(whole.len() - 4);
    let want = u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]]);
    if lookup3(data) != want {
        return Err(format!("{what} at {addr:#x}: checksum mismatch"));
    }
    Ok(())
}

fn push<'a>(
    f: &H5<'a>,
    m: Message<'a>,
    out: &mut Vec<Message<'a>>,
    todo: &mut Vec<(u64, u64)>,
) -> Res<()> {
    if out.len() >= MAX_MESSAGES {
        return Err(format!(
            "an object header has more than {MAX_MESSAGES} messages"
        ));
    }
    if m.kind == 0x10 {
        let mut c = Cur::new(m.body, f.o, f.l);
        let a = c.addr("continuation message")?;
        let n = c.len("continuation message")?;
        f.pos(a, n, "continuation block")?;
        todo.push((a, n));
    }
    out.push(m);
    Ok(())
}

fn v1_messages<'a>(
    f: &H5<'a>,
    body: &'a [u8],
    at: u64,
    out: &mut Vec<Message<'a>>,
    todo: &mut Vec<(u64, u64)>,
) -> Res<()> {
    let mut c = Cur::new(body, f.o, f.l);
    while c.left() >= 8 {
        let kind = c.u16("header message")?;
        let size = c.u16("header message")? as usize;
        let flags = c.u8("header message")?;
        c.skip(3, "header message")?;
        let pos = c.pos;
        let body = c
            .bytes(size, "header message")
            .map_err(|_| format!("a header message of type {kind:#x} runs past its header"))?;
        push(
            f,
            Message {
                kind,
                flags,
                body,
                at: at + pos as u64,
            },
            out,
            todo,
        )?;
    }
    Ok(())
}

fn v2_messages<'a>(
    f: &H5<'a>,
    body: &'a [u8],
    at: u64,
    hflags: u8,
    out: &mut Vec<Message<'a>>,
    todo: &mut Vec<(u64, u64)>,
) -> Res<()> {
    let mut c = Cur::new(body, f.o, f.l);
    let head = if hflags & 0x04 != 0 { 6 } else { 4 };
    while c.left() >= head {
        let kind = u16::from(c.u8("header message")?);
        let size = c.u16("header message")? as usize;
        let flags = c.u8("header message")?;
        if hflags & 0x04 != 0 {
            c.skip(2, "header message")?;
        }
        let pos = c.pos;
        let body = c
            .bytes(size, "header message")
            .map_err(|_| format!("a header message of type {kind:#x} runs past its header"))?;
        push(
            f,
            Message {
                kind,
                flags,
                body,
                at: at + pos as u64,
            },
            out,
            todo,
        )?;
    }
    Ok(())
}

/// Element type of a dataset, as far as it can be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Elem {
    Int {
        size: u8,
        signed: bool,
        big: bool,
    },
    Float {
        size: u8,
        big: bool,
    },
    /// h5py's bool: an enum over a 1-byte int with FALSE=0 and TRUE=1.
    Bool,
}

impl Elem {
    pub fn size(&self) -> u64 {
        match self {
            Elem::Int { size, .. } | Elem::Float { size, .. } => u64::from(*size),
            Elem::Bool => 1,
        }
    }
}

/// A datatype message: the element type, or why it is not served; and its
/// size in bytes either way.
pub fn datatype(body: &[u8]) -> Res<(u64, Result<Elem, String>)> {
    let mut c = Cur::new(body, 8, 8);
    let cv = c.u8("datatype")?;
    let (class, version) = (cv & 0x0f, cv >> 4);
    let bits = c.bytes(3, "datatype")?;
    let size = u64::from(c.u32("datatype")?);
    let big = bits[0] & 1 != 0;
    let why = |s: &str| Ok((size, Err(s.to_string())));
    match class {
        0 => {
            let offset = c.u16("datatype")?;
            let precision = c.u16("datatype")?;
            if !matches!(size, 1 | 2 | 4 | 8) || offset != 0 || u64::from(precision) != 8 * size {
                return why(&format!(
                    "an integer of {size} bytes with {precision} bits at bit {offset}: not read here"
                ));
            }
            let signed = bits[0] & 0x08 != 0;
            Ok((
                size,
                Ok(Elem::Int {
                    size: size as u8,
                    signed,
                    big,
                }),
            ))
        }
        1 => {
            if bits[0] & 0x40 != 0 {
                return why("a VAX-order float: not read here");
            }
            let offset = c.u16("datatype")?;
            let precision = c.u16("datatype")?;
            let exp_at = c.u8("datatype")?;
            let exp_len = c.u8("datatype")?;
            let man_at = c.u8("datatype")?;
            let man_len = c.u8("datatype")?;
            let bias = c.u32("datatype")?;
            // (sign bit, exponent at, exponent bits, mantissa bits, bias)
            let ieee: (u8, u8, u8, u8, u32) = match size {
                2 => (15, 10, 5, 10, 15),
                4 => (31, 23, 8, 23, 127),
                8 => (63, 52, 11, 52, 1023),
                _ => (0, 0, 0, 0, 0),
            };
            let got = (bits[1], exp_at, exp_len, man_len, bias);
            if ieee.2 == 0
                || offset != 0
                || u64::from(precision) != 8 * size
                || man_at != 0
                || got != ieee
            {
                return why(&format!(
                    "a {size}-byte float that is not IEEE binary{} (exponent {exp_len} bits, \
                     mantissa {man_len} bits, bias {bias}): not read here",
                    8 * size
                ));
            }
            Ok((
                size,
                Ok(Elem::Float {
                    size: size as u8,
                    big,
                }),
            ))
        }
        8 => {
            let members = u16::from_le_bytes([bits[0], bits[1]]) as usize;
            let base_start = c.pos;
            let (bsize, base) = datatype(&body[base_start..])?;
            // The base type's own length: the header, then its properties.
            let blen = match body.get(base_start).map(|b| b & 0x0f) {
                Some(0) => 12,
                _ => return why("an enumeration over a non-integer type: not read here"),
            };
            c.skip(blen, "enumeration")?;
            let mut names = Vec::new();
            for _ in 0..members.min(64) {
                let rest = &body[c.pos..];
                let n = rest
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or("enumeration: a member name has no end")?;
                names.push(rest[..n].to_vec());
                let padded = if version >= 3 {
                    n + 1
                } else {
                    (n + 1).div_ceil(8) * 8
                };
                c.skip(padded, "enumeration")?;
            }
            let mut values = Vec::new();
            for _ in 0..members.min(64) {
                values.push(c.uint(bsize.min(8) as usize, "enumeration")?);
            }
            let is_bool = size == 1
                && bsize == 1
                && matches!(base, Ok(Elem::Int { size: 1, .. }))
                && members == 2
                && names.first().map(Vec::as_slice) == Some(b"FALSE".as_slice())
                && names.get(1).map(Vec::as_slice) == Some(b"TRUE".as_slice())
                && values == [0, 1];
            if is_bool {
                Ok((size, Ok(Elem::Bool)))
            } else {
                why("an enumeration (only h5py's bool, FALSE=0 TRUE=1 over int8, is read)")
            }
        }
        2 => why("a time type: not read here"),
        3 => why("a fixed-length string: not read here"),
        4 => why("a bitfield: not read here"),
        5 => why("an opaque type: not read here"),
        6 => why("a compound type: not read here"),
        7 => why("a reference: not read here"),
        9 => why("a variable-length type: not read here"),
        10 => why("an array type: not read here"),
        11 => why("a complex type: not read here"),
        c => why(&format!("datatype class {c}, which HDF5 does not define")),
    }
}

/// The name of a datatype message's class, for a type not served.
pub fn class_name(body: &[u8]) -> &'static str {
    match body.first().map(|b| b & 0x0f) {
        Some(0) => "integer",
        Some(1) => "float",
        Some(2) => "time",
        Some(3) => "string",
        Some(4) => "bitfield",
        Some(5) => "opaque",
        Some(6) => "compound",
        Some(7) => "reference",
        Some(8) => "enum",
        Some(9) => "vlen",
        Some(10) => "array",
        Some(11) => "complex",
        _ => "unknown",
    }
}

/// The dataspace message: `None` for a null dataspace (no elements, not
/// even a scalar one).
pub fn dataspace(body: &[u8], l: usize) -> Res<Option<Vec<u64>>> {
    let mut c = Cur::new(body, 8, l);
    let version = c.u8("dataspace")?;
    let rank = c.u8("dataspace")? as usize;
    let _flags = c.u8("dataspace")?;
    match version {
        1 => c.skip(5, "dataspace")?,
        2 => {
            if c.u8("dataspace")? == 2 {
                return Ok(None);
            }
        }
        v => return Err(format!("dataspace version {v} (1 or 2 expected)")),
    }
    if rank > 32 {
        return Err(format!("dataspace of {rank} dimensions (HDF5 allows 32)"));
    }
    (0..rank)
        .map(|_| c.len("dataspace dimensions"))
        .collect::<Res<Vec<_>>>()
        .map(Some)
}

/// The dataspace's maximum dimensions, when it records them (`u64::MAX`:
/// unlimited).
pub fn max_dims(body: &[u8], l: usize) -> Option<Vec<u64>> {
    let mut c = Cur::new(body, 8, l);
    let version = c.u8("").ok()?;
    let rank = c.u8("").ok()? as usize;
    let flags = c.u8("").ok()?;
    c.skip(if version == 1 { 5 } else { 1 }, "").ok()?;
    if flags & 1 == 0 || rank > 32 {
        return None;
    }
    c.skip(rank * l, "").ok()?;
    let undef = super::read::undefined(l);
    (0..rank)
        .map(|_| {
            c.len("")
                .ok()
                .map(|d| if d == undef { u64::MAX } else { d })
        })
        .collect()
}

/// Where a dataset's elements are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Absolute file position and length of bytes inside the header.
    Compact {
        at: u64,
        len: u64,
    },
    Contiguous {
        addr: u64,
        len: Option<u64>,
    },
    Chunked {
        dims: Vec<u64>,
        index: Index,
    },
}

/// How a chunked dataset finds its chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Index {
    /// A version 1 B-tree (layout versions 1 to 3).
    BTreeV1 {
        addr: u64,
    },
    /// The dataset is one chunk; `filtered`: its stored size and mask.
    Single {
        addr: u64,
        filtered: Option<(u64, u32)>,
    },
    /// Every chunk stored in order from `addr`, unfiltered.
    Implicit {
        addr: u64,
    },
    FixedArray {
        addr: u64,
    },
    /// Datasets with one unlimited dimension.
    ExtensibleArray {
        addr: u64,
    },
    /// Indexes not read here (a version 2 B-tree: more than one unlimited
    /// dimension).
    Other(&'static str),
}

/// The data layout message. `rank` is the dataspace's.
pub fn layout(m: &Message, l: usize, o: usize) -> Res<Layout> {
    let mut c = Cur::new(m.body, o, l);
    let version = c.u8("layout")?;
    match version {
        1 | 2 => {
            let ndim = c.u8("layout")? as usize;
            let class = c.u8("layout")?;
            c.skip(5, "layout")?;
            let addr = if class != 0 {
                c.addr("layout address")?
            } else {
                0
            };
            let dims = (0..ndim)
                .map(|_| c.u32("layout dimensions").map(u64::from))
                .collect::<Res<Vec<_>>>()?;
            match class {
                0 => {
                    let n = u64::from(c.u32("layout")?);
                    let at = m.at + c.pos as u64;
                    c.skip(n as usize, "compact data")?;
                    Ok(Layout::Compact { at, len: n })
                }
                1 => Ok(Layout::Contiguous { addr, len: None }),
                2 => {
                    c.u32("layout element size")?;
                    Ok(Layout::Chunked {
                        dims,
                        index: Index::BTreeV1 { addr },
                    })
                }
                k => Err(format!("layout class {k}")),
            }
        }
        // Version 5 (HDF5 2.0) is version 4 with filtered chunk sizes of a
        // fixed width in the index, which the index header gives anyway.
        3..=5 => {
            let class = c.u8("layout")?;
            match class {
                0 => {
                    let n = u64::from(c.u16("layout")?);
                    let at = m.at + c.pos as u64;
                    c.skip(n as usize, "compact data")?;
                    Ok(Layout::Compact { at, len: n })
                }
                1 => {
                    let addr = c.addr("layout address")?;
                    let len = c.len("layout size")?;
                    Ok(Layout::Contiguous {
                        addr,
                        len: Some(len),
                    })
                }
                2 if version == 3 => {
                    let ndim = c.u8("layout")? as usize;
                    let addr = c.addr("layout address")?;
                    let dims = (0..ndim)
                        .map(|_| c.u32("layout dimensions").map(u64::from))
                        .collect::<Res<Vec<_>>>()?;
                    Ok(Layout::Chunked {
                        dims,
                        index: Index::BTreeV1 { addr },
                    })
                }
                2 => {
                    let flags = c.u8("layout")?;
                    let ndim = c.u8("layout")? as usize;
                    let w = c.u8("layout")? as usize;
                    if !(1..=8).contains(&w) {
                        return Err(format!("layout: dimension sizes of {w} bytes"));
                    }
                    let dims = (0..ndim)
                        .map(|_| c.uint(w, "layout dimensions"))
                        .collect::<Res<Vec<_>>>()?;
                    let kind = c.u8("layout index type")?;
                    let index = match kind {
                        1 => {
                            let filtered = if flags & 2 != 0 {
                                Some((c.len("layout")?, c.u32("layout")?))
                            } else {
                                None
                            };
                            Index::Single {
                                addr: c.addr("layout address")?,
                                filtered,
                            }
                        }
                        2 => Index::Implicit {
                            addr: c.addr("layout address")?,
                        },
                        3 => {
                            c.skip(1, "layout")?;
                            Index::FixedArray {
                                addr: c.addr("layout address")?,
                            }
                        }
                        4 => {
                            c.skip(5, "layout")?;
                            Index::ExtensibleArray {
                                addr: c.addr("layout address")?,
                            }
                        }
                        5 => Index::Other("a version 2 B-tree"),
                        k => return Err(format!("layout: chunk index type {k}")),
                    };
                    Ok(Layout::Chunked { dims, index })
                }
                3 => Err("a virtual dataset: not read here".into()),
                k => Err(format!("layout class {k}")),
            }
        }
        v => Err(format!("layout version {v}")),
    }
}

/// One filter of a pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub id: u16,
    pub optional: bool,
    pub values: Vec<u32>,
}

/// The filter pipeline message.
pub fn filters(body: &[u8]) -> Res<Vec<Filter>> {
    let mut c = Cur::new(body, 8, 8);
    let version = c.u8("filter pipeline")?;
    let n = c.u8("filter pipeline")? as usize;
    if n > 32 {
        return Err(format!("filter pipeline of {n} filters (HDF5 allows 32)"));
    }
    match version {
        1 => c.skip(6, "filter pipeline")?,
        2 => {}
        v => return Err(format!("filter pipeline version {v}")),
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let id = c.u16("filter")?;
        let name_len = if version == 1 || id >= 256 {
            c.u16("filter")? as usize
        } else {
            0
        };
        let flags = c.u16("filter")?;
        let nv = c.u16("filter")? as usize;
        let name_len = if version == 1 {
            name_len.div_ceil(8) * 8
        } else {
            name_len
        };
        c.skip(name_len, "filter name")?;
        let values = (0..nv)
            .map(|_| c.u32("filter values"))
            .collect::<Res<Vec<_>>>()?;
        if version == 1 && nv % 2 == 1 {
            c.skip(4, "filter padding")?;
        }
        out.push(Filter {
            id,
            optional: flags & 1 != 0,
            values,
        });
    }
    Ok(out)
}

/// Whether a fill value message sets a value that is not all zero bytes
/// (chunks never written, or an unallocated dataset, read as it).
pub fn fill_nonzero(m: &Message) -> Res<bool> {
    let mut c = Cur::new(m.body, 8, 8);
    match m.kind {
        0x0004 => {
            let n = c.u32("fill value")? as usize;
            Ok(c.bytes(n, "fill value")?.iter().any(|&b| b != 0))
        }
        _ => {
            let version = c.u8("fill value")?;
            let defined = match version {
                1 | 2 => {
                    c.skip(2, "fill value")?;
                    c.u8("fill value")? != 0
                }
                3 => {
                    let flags = c.u8("fill value")?;
                    flags & 0x20 != 0
                }
                v => return Err(format!("fill value version {v}")),
            };
            if !defined || c.left() < 4 {
                return Ok(false);
            }
            let n = c.u32("fill value")? as usize;
            Ok(c.bytes(n, "fill value")?.iter().any(|&b| b != 0))
        }
    }
}
