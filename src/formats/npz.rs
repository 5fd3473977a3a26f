//! NumPy `.npz`: a zip archive of `.npy` members, one tensor each (the
//! member's name without `.npy`).
//!
//! Read here rather than through `ztensor-compat` so that a deflated
//! member is inflated straight into the cache entry the mount gives its
//! producer (the crate hands back a vector of its own, which was then
//! copied: the member was in memory twice), and so that any `.npy` type
//! numpy writes is read by its element type and byte order (`<u1`, `|u1`
//! and `=u1` are one type; big-endian data is served swapped).
//!
//! - A stored member is a raw range of the file, served from the mapping
//!   once its CRC-32 (over the whole member, as Python's zipfile checks
//!   it) has been checked: its blob is the member, its part the bytes
//!   after the `.npy` header.
//! - A deflated member is a [`Codec::Computed`] blob: inflated whole when
//!   first read, exactly its declared size, its CRC-32 checked.
//! - Listed as unsupported, the rest served: a dtype with no element type
//!   here (strings, objects, structured types, ...), Fortran order.
//! - As numpy reads them: a member not named `*.npy` is an array when it
//!   starts with the `.npy` magic (named as it is), else left out; of two
//!   members of one name in the archive's directory, the last.
//! - Refused in one line: an archive that cannot be read, a member whose
//!   local header names another member, that is encrypted or compressed
//!   other than by deflate, whose header is malformed (or over 1 MiB),
//!   whose data size is not its shape's, or that runs past the file; two
//!   arrays of one name (`a.npy` and an array member `a`).

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::catalog::{
    Blob, Catalog, Check, Checksum, Codec, DType, Endian, Json, JsonMap, Part, PartMap, Producer,
    Tensor,
};
use crate::error::{Error, ErrorKind, Result};
use crate::formats::{Limits, Opened};
use crate::source::MappedFile;

/// Bytes of a member read at open for its `.npy` header (what
/// `super::fetch` makes present for a remote archive).
pub const NPY_PROBE: u64 = 4096;

/// Reads an npz archive into the catalog.
pub fn open(src: MappedFile, limits: Limits) -> Result<Opened> {
    let _ = limits;
    let catalog = read(&src)?;
    Ok(Opened {
        catalog,
        sources: vec![Some(src)],
    })
}

/// A member's `.npy` header.
#[derive(Debug, PartialEq)]
struct Header {
    descr: String,
    fortran: bool,
    shape: Vec<u64>,
    /// Bytes before the data: magic, version, length and the dict.
    len: u64,
}

/// The longest `.npy` header read (numpy's own limit is 10000 bytes
/// unless the file is trusted).
const MAX_HEADER: u64 = 1 << 20;

/// The length of the `.npy` header at the start of `b` (magic, version,
/// length and dict), if its first bytes say.
fn header_len(b: &[u8]) -> Option<u64> {
    if !b.starts_with(b"\x93NUMPY") {
        return None;
    }
    match b.get(6)? {
        1 => Some(10 + u64::from(u16::from_le_bytes(b.get(8..10)?.try_into().ok()?))),
        2 | 3 => Some(12 + u64::from(u32::from_le_bytes(b.get(8..12)?.try_into().ok()?))),
        _ => None,
    }
}

/// Parses the `.npy` header at the start of `b`.
fn parse_header(b: &[u8]) -> std::result::Result<Header, String> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err("not a .npy member (no \\x93NUMPY magic)".into());
    }
    let (dict_len, start) = match b[6] {
        1 => (u64::from(u16::from_le_bytes([b[8], b[9]])), 10u64),
        2 | 3 => {
            let l = b
                .get(8..12)
                .ok_or("its .npy header is cut short")?
                .try_into()
                .map_err(|_| "its .npy header is cut short")?;
            (u64::from(u32::from_le_bytes(l)), 12)
        }
        v => return Err(format!(".npy format version {v} is not read")),
    };
    let len = start + dict_len;
    let dict = b.get(start as usize..len as usize).ok_or_else(|| {
        format!(
            "its .npy header of {len} bytes runs past the {} bytes of its member read",
            b.len()
        )
    })?;
    let dict = std::str::from_utf8(dict).map_err(|_| "its .npy header is not text")?;
    let mut p = Lit {
        s: dict.as_bytes(),
        at: 0,
    };
    let Value::Dict(entries) = p.value(0)? else {
        return Err("its .npy header is not a dict".into());
    };
    let get = |k: &str| entries.iter().find(|(n, _)| n == k).map(|(_, v)| v);
    let descr = match get("descr") {
        Some(Value::Str(s)) => s.clone(),
        // A structured dtype: a list of fields.
        Some(Value::List(_)) => "a structured dtype".into(),
        _ => return Err("its .npy header has no 'descr'".into()),
    };
    let fortran = match get("fortran_order") {
        Some(Value::Bool(f)) => *f,
        _ => return Err("its .npy header has no 'fortran_order' True or False".into()),
    };
    let shape = match get("shape") {
        Some(Value::List(dims)) => dims
            .iter()
            .map(|d| match d {
                Value::Int(n) => Ok(*n),
                _ => Err("a dimension of its shape is not a non-negative integer".to_string()),
            })
            .collect::<std::result::Result<Vec<u64>, String>>()?,
        _ => return Err("its .npy header has no 'shape' tuple".into()),
    };
    Ok(Header {
        descr,
        fortran,
        shape,
        len,
    })
}

/// A Python literal of a `.npy` header.
#[derive(Debug)]
enum Value {
    Str(String),
    Int(u64),
    Bool(bool),
    None,
    List(Vec<Value>),
    Dict(Vec<(String, Value)>),
}

/// A reader of the Python literals a `.npy` header holds.
struct Lit<'a> {
    s: &'a [u8],
    at: usize,
}

impl Lit<'_> {
    fn ws(&mut self) {
        while self.s.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.s.get(self.at) == Some(&c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> std::result::Result<Value, String> {
        if depth > 16 {
            return Err("its .npy header nests too deeply".into());
        }
        self.ws();
        let bad = || "its .npy header is not a Python literal".to_string();
        match self.s.get(self.at).copied().ok_or_else(bad)? {
            q @ (b'\'' | b'"') => {
                let from = self.at + 1;
                let len = self.s[from..]
                    .iter()
                    .position(|&c| c == q)
                    .ok_or_else(bad)?;
                self.at = from + len + 1;
                let text = std::str::from_utf8(&self.s[from..from + len]).map_err(|_| bad())?;
                Ok(Value::Str(text.to_string()))
            }
            open @ (b'(' | b'[' | b'{') => {
                self.at += 1;
                let close = match open {
                    b'(' => b')',
                    b'[' => b']',
                    _ => b'}',
                };
                let mut items = Vec::new();
                let mut entries = Vec::new();
                loop {
                    if self.eat(close) {
                        break;
                    }
                    if open == b'{' {
                        let Value::Str(k) = self.value(depth + 1)? else {
                            return Err(bad());
                        };
                        if !self.eat(b':') {
                            return Err(bad());
                        }
                        entries.push((k, self.value(depth + 1)?));
                    } else {
                        items.push(self.value(depth + 1)?);
                    }
                    if !self.eat(b',') {
                        if self.eat(close) {
                            break;
                        }
                        return Err(bad());
                    }
                }
                Ok(if open == b'{' {
                    Value::Dict(entries)
                } else {
                    Value::List(items)
                })
            }
            b'-' => Err("a dimension of its shape is negative".into()),
            c if c.is_ascii_digit() => {
                let from = self.at;
                while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
                    self.at += 1;
                }
                // Python 2 wrote longs as `3L`.
                if self.s.get(self.at) == Some(&b'L') {
                    self.at += 1;
                }
                let digits = std::str::from_utf8(&self.s[from..self.at])
                    .map_err(|_| bad())?
                    .trim_end_matches('L');
                digits
                    .parse()
                    .map(Value::Int)
                    .map_err(|_| "a dimension of its shape does not fit 64 bits".to_string())
            }
            _ => {
                for (word, v) in [
                    ("True", Value::Bool(true)),
                    ("False", Value::Bool(false)),
                    ("None", Value::None),
                ] {
                    if self.s[self.at..].starts_with(word.as_bytes()) {
                        self.at += word.len();
                        return Ok(v);
                    }
                }
                Err(bad())
            }
        }
    }
}

/// Our element type and byte order for a numpy `descr`, or why there is
/// none. numpy reads a `descr` string as `numpy.dtype` does: a type code
/// (`<f4`), a one-letter character code (`f`, `?`, `>q`) or a name
/// (`float32`), with or without a byte order; none (or `=`) is the
/// machine's, little-endian on every machine this runs on (and numpy's
/// `l` and `p` are 8 bytes there, as on Linux). A one-byte type has no
/// byte order (`<u1`, `|u1`, `=u1`, `>u1` are one type).
fn element_type(descr: &str) -> std::result::Result<(DType, Endian), String> {
    let none = || format!("numpy dtype {descr:?} has no element type here: listed, not served");
    let (order, code) = match descr.as_bytes().first() {
        Some(b'<' | b'>' | b'|' | b'=') => (descr.as_bytes()[0], &descr[1..]),
        _ => (b'=', descr),
    };
    let d = match code {
        "b1" | "?" | "bool" => DType::Bool,
        "i1" | "b" | "int8" => DType::Int8,
        "u1" | "B" | "uint8" => DType::Uint8,
        "i2" | "h" | "int16" => DType::Int16,
        "u2" | "H" | "uint16" => DType::Uint16,
        "i4" | "i" | "int32" => DType::Int32,
        "u4" | "I" | "uint32" => DType::Uint32,
        "i8" | "l" | "q" | "p" | "int64" => DType::Int64,
        "u8" | "L" | "Q" | "P" | "uint64" => DType::Uint64,
        "f2" | "e" | "float16" => DType::Float16,
        "f4" | "f" | "float32" => DType::Float32,
        "f8" | "d" | "float64" => DType::Float64,
        "c8" | "F" | "complex64" => DType::Complex64,
        "c16" | "D" | "complex128" => DType::Complex128,
        _ => return Err(none()),
    };
    let endian = match order {
        b'>' => Endian::Big,
        b'|' if d.size() > 1 => return Err(none()),
        _ => Endian::Little,
    };
    Ok((d, endian))
}

fn read(src: &MappedFile) -> Result<Catalog> {
    let label = src.label().to_string();
    let bad = |msg: String| Error::new(ErrorKind::Index, &label, None, msg);
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(src.bytes())).map_err(|e| {
        bad(format!(
            "a ZIP archive (npz or PyTorch .pt) that cannot be read, cut short or damaged: {e}"
        ))
    })?;
    let mut catalog = Catalog::of_file("npz", &label, src.path());
    // One descriptor shared by every deflated member's producer.
    let mut file: Option<Arc<std::fs::File>> = None;
    let mut names = std::collections::HashSet::new();
    for i in 0..zip.len() {
        let m = zip
            .by_index_raw(i)
            .map_err(|e| bad(format!("ZIP member {i}: {e}")))?;
        // numpy reads any member that starts with the `.npy` magic as an
        // array, named without `.npy` where its name ends so: one that is
        // not named so is read when it has the magic, else left out. A
        // member it cannot read refuses the file when it is named so, and
        // is left out otherwise.
        let (name, by_name) = match m.name().strip_suffix(".npy") {
            Some(n) => (n.to_string(), true),
            None => (m.name().to_string(), false),
        };
        let bad_tensor = |kind, msg: String| Error::new(kind, &label, Some(&name), msg);
        let member = match member_of(src, &m) {
            Ok(member) => member,
            Err((kind, why)) if by_name => return Err(bad_tensor(kind, why)),
            Err(_) => continue,
        };
        drop(m);
        let head = match npy_head(src, &mut zip, i, &member) {
            Ok(head) => head,
            Err((kind, why)) if by_name => return Err(bad_tensor(kind, why)),
            Err(_) => continue,
        };
        if !by_name && !head.starts_with(b"\x93NUMPY") {
            continue;
        }
        if !names.insert(name.clone()) {
            return Err(bad_tensor(
                ErrorKind::Duplicate,
                "two members of this name".into(),
            ));
        }
        let h = parse_header(&head).map_err(|why| bad_tensor(ErrorKind::Field, why))?;
        add_array(&mut catalog, src, &mut file, name, h, member)?;
    }
    if catalog.tensors.is_empty() && !zip.is_empty() {
        return Err(neither_npz_nor_pt(&label, zip.file_names()));
    }
    Ok(catalog)
}

/// Where a member's bytes are and how they are stored.
struct Stored {
    /// Its data in the file, and its length there.
    start: u64,
    stored_len: u64,
    /// Its length once inflated (`stored_len` when stored).
    size: u64,
    crc: u32,
    deflated: bool,
}

/// A member's problem, as the kind of refusal and why.
type Refusal = (ErrorKind, String);

/// Member `m` as numpy's `zipfile` would read it: its local header names
/// it as the directory does, it is not encrypted, it lies within the
/// file, and it is stored (and as long as it says) or deflated.
fn member_of(
    src: &MappedFile,
    m: &zip::read::ZipFile<'_, std::io::Cursor<&[u8]>>,
) -> std::result::Result<Stored, Refusal> {
    let bytes = src.bytes();
    let (start, size, stored_len, crc) = (m.data_start(), m.size(), m.compressed_size(), m.crc32());
    // Python's zipfile (numpy) refuses a member whose local header
    // names another: the directory and the data disagree.
    let hs = m.header_start();
    let local = usize::try_from(hs)
        .ok()
        .and_then(|h| Some((h, bytes.get(h + 26..h + 28)?)))
        .and_then(|(h, n)| {
            bytes.get(h + 30..h + 30 + usize::from(u16::from_le_bytes([n[0], n[1]])))
        });
    if local != Some(m.name_raw()) {
        return Err((
            ErrorKind::Index,
            format!(
                "its local header names {:?}, the archive's directory {:?}",
                String::from_utf8_lossy(local.unwrap_or_default()),
                m.name()
            ),
        ));
    }
    if m.encrypted() {
        return Err((
            ErrorKind::Unsupported,
            "its member is encrypted, which is not read here".into(),
        ));
    }
    if start.checked_add(stored_len).is_none_or(|e| e > src.len()) {
        return Err((
            ErrorKind::Placement,
            format!("its member's {stored_len} bytes at {start} run past the end of the file"),
        ));
    }
    let deflated = match m.compression() {
        zip::CompressionMethod::Stored if stored_len == size => false,
        zip::CompressionMethod::Stored => {
            return Err((
                ErrorKind::Size,
                format!("a stored member of {stored_len} bytes that says it holds {size}"),
            ));
        }
        zip::CompressionMethod::Deflated => true,
        other => {
            return Err((
                ErrorKind::Unsupported,
                format!("its member is compressed with {other}, which is not read here"),
            ));
        }
    };
    Ok(Stored {
        start,
        stored_len,
        size,
        crc,
        deflated,
    })
}

/// The `.npy` header of member `i`: its first bytes, inflated if need be;
/// more of them for a header longer than the probe (of a local file, or
/// stored: a remote archive has the probe present).
fn npy_head(
    src: &MappedFile,
    zip: &mut zip::ZipArchive<std::io::Cursor<&[u8]>>,
    i: usize,
    m: &Stored,
) -> std::result::Result<Vec<u8>, Refusal> {
    let mut head = Vec::new();
    let mut probe = NPY_PROBE.min(m.size);
    loop {
        head.clear();
        if m.deflated {
            zip.by_index(i)
                .map_err(|e| format!("ZIP member: {e}"))
                .and_then(|mut e| {
                    (&mut e)
                        .take(probe)
                        .read_to_end(&mut head)
                        .map_err(|e| format!("cannot inflate: {e}"))
                })
                .map_err(|why| (ErrorKind::Data, why))?;
        } else {
            // An index read: no read-ahead of the member's data.
            src.ensure_all(&[(m.start, probe)], true)
                .map_err(|why| (ErrorKind::Io, why.into()))?;
            let at = m.start as usize;
            head.extend_from_slice(&src.bytes()[at..at + probe as usize]);
        }
        match header_len(&head) {
            Some(n) if n > probe && probe < m.size && n <= MAX_HEADER => {
                if m.deflated && src.is_remote() {
                    return Err((
                        ErrorKind::Unsupported,
                        format!(
                            "its .npy header of {n} bytes is longer than the {probe} read at \
                             open of a deflated member over a URL"
                        ),
                    ));
                }
                probe = n.min(m.size);
            }
            _ => return Ok(head),
        }
    }
}

/// Adds the array of member `m`, whose `.npy` header is `h`, to `catalog`
/// (with its blob, when its type is served). `file`: the descriptor the
/// deflated members' producers share, opened by the first.
fn add_array(
    catalog: &mut Catalog,
    src: &MappedFile,
    file: &mut Option<Arc<std::fs::File>>,
    name: String,
    h: Header,
    m: Stored,
) -> Result<()> {
    let bad_tensor = |kind, msg: String| Error::new(kind, &catalog.label, Some(&name), msg);
    let mut meta = JsonMap::new();
    meta.insert("npy_descr".into(), Json::from(h.descr.clone()));
    meta.insert(
        "zip_compression".into(),
        if m.deflated { "deflate" } else { "stored" }.into(),
    );
    let data_len = m.size.checked_sub(h.len).ok_or_else(|| {
        bad_tensor(
            ErrorKind::Size,
            format!("its member of {} bytes is shorter than its header", m.size),
        )
    })?;
    // Fortran order differs from C order only where two dimensions hold
    // more than one element each (and there are elements at all).
    let transposed =
        h.fortran && !h.shape.contains(&0) && h.shape.iter().filter(|&&n| n > 1).count() > 1;
    let parts = match element_type(&h.descr) {
        _ if transposed => Err("stored in Fortran (column) order, which would be served \
                                transposed: listed, not served"
            .to_string()),
        Err(why) => Err(why),
        Ok((d, order)) => {
            let elems = h.shape.iter().try_fold(1u64, |a, &x| a.checked_mul(x));
            let want = elems.and_then(|n| n.checked_mul(d.size()));
            if want != Some(data_len) {
                return Err(bad_tensor(
                    ErrorKind::Size,
                    format!(
                        "holds {data_len} bytes of data but {} of shape {:?} is {}",
                        h.descr,
                        h.shape,
                        want.map_or("more than 2^64".into(), |w| w.to_string())
                    ),
                ));
            }
            let blob = if m.deflated {
                deflated_blob(src, file, &name, d, &h, &m, data_len)
            } else {
                meta.insert("offset".into(), (m.start + h.len).into());
                meta.insert("size".into(), data_len.into());
                Ok(stored_blob(&name, d, &h, &m, data_len))
            };
            blob.map(|b| {
                let skip = if m.deflated { 0 } else { h.len };
                catalog.blobs.push(b);
                let bi = catalog.blobs.len() - 1;
                let mut p = Part::dense(d, h.shape.clone(), data_len, bi, order);
                p.map = PartMap::Contiguous { start: skip };
                vec![p]
            })
        }
    };
    let encoding = if m.deflated { "deflate" } else { "raw" };
    catalog.tensors.push(Tensor::dense(
        name,
        h.descr,
        h.shape,
        encoding,
        parts,
        meta.into(),
    ));
    Ok(())
}

/// The blob of a deflated member: inflated whole (by its own reader) and
/// the header skipped; or why it cannot be.
fn deflated_blob(
    src: &MappedFile,
    file: &mut Option<Arc<std::fs::File>>,
    name: &str,
    d: DType,
    h: &Header,
    m: &Stored,
    data_len: u64,
) -> std::result::Result<Blob, String> {
    if data_len > super::common::MAX_COMPUTED {
        return Err(format!(
            "its {data_len} bytes can only be made whole, and that is over the {}-byte limit",
            super::common::MAX_COMPUTED
        ));
    }
    let f = super::common::shared_file(file, src)?;
    let member = Member {
        at: m.start,
        stored: m.stored_len,
        size: m.size,
        crc: m.crc,
        skip: h.len,
    };
    Ok(Blob {
        source: 0,
        // The stored member: what a remote file must have present before
        // it is inflated.
        offset: m.start,
        len: m.stored_len,
        codec: Codec::Computed(inflater(f, member)),
        decoded_len: data_len,
        checks: if d == DType::Bool {
            vec![Check::BoolBytes]
        } else {
            Vec::new()
        },
        label: format!("tensor {name:?}"),
    })
}

/// The blob of a stored member: the whole member, so that its CRC-32 is
/// checked before any of it is served; the tensor is the part after the
/// header.
fn stored_blob(name: &str, d: DType, h: &Header, m: &Stored, data_len: u64) -> Blob {
    let bools = if d == DType::Bool {
        vec![Check::BoolBytesIn {
            start: h.len,
            len: data_len,
        }]
    } else {
        Vec::new()
    };
    let checks = [vec![Check::Stored(Checksum::Crc32(m.crc))], bools].concat();
    Blob::raw(0, m.start, m.size, checks, format!("tensor {name:?}"))
}

/// The refusal of a ZIP archive none of whose members is an array (and
/// which has no `data.pkl`, or it would be read as `.pt`): it is some other
/// archive, not an empty npz.
fn neither_npz_nor_pt<'a>(label: &str, names: impl Iterator<Item = &'a str>) -> Error {
    const SHOWN: usize = 5;
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    let more = if names.len() > SHOWN { ", ..." } else { "" };
    names.truncate(SHOWN);
    Error::new(
        ErrorKind::NotZtensor,
        label,
        None,
        format!(
            "a ZIP archive that is neither npz (no member is a .npy array) nor PyTorch .pt \
             (no data.pkl): its members are {}{more}",
            names.join(", ")
        ),
    )
}

/// A deflated member: where its stored bytes are, what it inflates to.
struct Member {
    at: u64,
    stored: u64,
    /// Bytes inflated, header included.
    size: u64,
    crc: u32,
    /// The header's bytes, inflated and checked but not kept.
    skip: u64,
}

/// Reads `len` bytes of a file from `at` on, by `pread`.
struct Range {
    file: Arc<std::fs::File>,
    at: u64,
    left: u64,
}

impl Read for Range {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let got = self.file.read_at(&mut buf[..n], self.at)?;
        if got == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file ends inside the member",
            ));
        }
        self.at += got as u64;
        self.left -= got as u64;
        Ok(got)
    }
}

/// Inflates a member straight into the buffer the mount gives (the cache
/// entry), its header dropped; or, for a member too big for the cache,
/// piece by piece into what the mount writes to its spill file. Either
/// way: exactly `size` bytes inflated, no more, their CRC-32 what the
/// archive says.
fn inflater(file: Arc<std::fs::File>, m: Member) -> Producer {
    let m = Arc::new(m);
    let (f2, m2) = (file.clone(), m.clone());
    Producer {
        name: "npz deflate",
        produce: Arc::new(move |out: &mut Vec<u8>| {
            let n = usize::try_from(m.size - m.skip).map_err(|_| "too large".to_string())?;
            if out.capacity() < n {
                return Err(format!(
                    "{n} bytes to inflate, over the room given ({} bytes)",
                    out.capacity()
                ));
            }
            let mut z = Inflating::new(&file, &m)?;
            out.clear();
            out.resize(n, 0);
            z.fill(out)?;
            z.finish()
        }),
        stream: Some(Arc::new(
            move |emit: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>| {
                let mut z = Inflating::new(&f2, &m2)?;
                let mut buf = vec![0u8; 1 << 20];
                let mut left = m2.size - m2.skip;
                while left > 0 {
                    let k = left.min(buf.len() as u64) as usize;
                    z.fill(&mut buf[..k])?;
                    emit(&buf[..k])?;
                    left -= k as u64;
                }
                z.finish()
            },
        )),
    }
}

/// A member being inflated, its header read and dropped.
struct Inflating<'a> {
    z: flate2::bufread::DeflateDecoder<std::io::BufReader<Range>>,
    crc: flate2::Crc,
    m: &'a Member,
}

impl<'a> Inflating<'a> {
    fn new(file: &Arc<std::fs::File>, m: &'a Member) -> std::result::Result<Self, String> {
        let range = Range {
            file: file.clone(),
            at: m.at,
            left: m.stored,
        };
        let mut z = Inflating {
            z: flate2::bufread::DeflateDecoder::new(std::io::BufReader::with_capacity(
                64 << 10,
                range,
            )),
            crc: flate2::Crc::new(),
            m,
        };
        let mut head = vec![0u8; m.skip as usize];
        z.fill(&mut head)?;
        Ok(z)
    }

    /// The next `out.len()` inflated bytes.
    fn fill(&mut self, out: &mut [u8]) -> std::result::Result<(), String> {
        self.z.read_exact(out).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                format!(
                    "its member inflates to fewer than the {} bytes it declares",
                    self.m.size
                )
            } else {
                format!("cannot inflate its member: {e}")
            }
        })?;
        self.crc.update(out);
        Ok(())
    }

    /// Checks that the stream ends here and that its CRC-32 holds.
    fn finish(mut self) -> std::result::Result<(), String> {
        let mut more = [0u8; 1];
        let n = self
            .z
            .read(&mut more)
            .map_err(|e| format!("cannot inflate its member: {e}"))?;
        if n != 0 {
            return Err(format!(
                "its member inflates to more than the {} bytes it declares",
                self.m.size
            ));
        }
        if self.crc.sum() != self.m.crc {
            return Err(format!(
                "its member's CRC-32 is {:08x}, the archive says {:08x}",
                self.crc.sum(),
                self.m.crc
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(dict: &str) -> Vec<u8> {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((dict.len() as u16).to_le_bytes());
        b.extend(dict.as_bytes());
        b
    }

    #[test]
    fn headers_parse_as_numpy_writes_them() {
        let dict = "{'descr': '<u1', 'fortran_order': False, 'shape': (3, 4), }   \n";
        let h = parse_header(&npy(dict)).unwrap();
        assert_eq!(h.descr, "<u1");
        assert!(!h.fortran);
        assert_eq!(h.shape, [3, 4]);
        assert_eq!(h.len, 10 + dict.len() as u64);
        let h = parse_header(&npy(
            "{'descr': '>f8', 'fortran_order': True, 'shape': (), }",
        ))
        .unwrap();
        assert!(h.fortran && h.shape.is_empty());
        let h = parse_header(&npy(
            "{'descr': '|b1', 'fortran_order': False, 'shape': (7L,), }",
        ))
        .unwrap();
        assert_eq!(h.shape, [7]);
        let h = parse_header(&npy(
            "{'descr': [('a', '<i4'), ('b', '<f8')], 'fortran_order': False, 'shape': (2,), }",
        ))
        .unwrap();
        assert_eq!(h.descr, "a structured dtype");
        for bad in [
            "{'descr': '<f4', 'shape': (1,), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
            "{'descr': '<f4' 'fortran_order': False}",
            "not a dict",
            &format!("{}{}", "(".repeat(100), ")".repeat(100)),
        ] {
            assert!(parse_header(&npy(bad)).is_err(), "{bad}");
        }
        assert!(parse_header(b"\x93NUMPY\x01\x00\xff\xff{").is_err());
    }

    #[test]
    fn one_byte_types_have_no_byte_order() {
        for d in ["<u1", "|u1", "=u1", ">u1", "u1"] {
            assert_eq!(element_type(d).unwrap().0, DType::Uint8, "{d}");
        }
        assert_eq!(element_type("|b1").unwrap().0, DType::Bool);
        assert_eq!(element_type(">i4").unwrap(), (DType::Int32, Endian::Big));
        assert_eq!(
            element_type("=f4").unwrap(),
            (DType::Float32, Endian::Little)
        );
        assert_eq!(element_type("<c16").unwrap().0, DType::Complex128);
        for d in ["|i4", "<U5", "|O", "<M8[s]", "a structured dtype", ""] {
            assert!(element_type(d).is_err(), "{d}");
        }
    }
}
