//! What a remote object's format reads at open, made present in its cache
//! file before anything reads it: a remote object's bytes that were never
//! fetched read as zeros, so every byte a reader will touch is fetched
//! first, in as few requests as the format allows.
//!
//! Each format's entry in [`super::detect::FORMATS`] names its function
//! here. zTensor v0.1, v1 and v2, safetensors and deathtensors read an
//! index the file's ends point at. The others:
//!
//! - GGUF, read by `ztensor-compat`, which reads the file by path where it
//!   pleases: the header, up to the end of its last tensor info (found by
//!   our own walk, [`super::gguf_header::extent`], growing the fetched
//!   prefix fourfold while the header runs past it).
//! - npz and `.pt` (zip archives, our own readers): the
//!   end-of-central-directory record and the central directory, each
//!   member's local header, the first 4 KiB of each `.npy` member (its
//!   header; inflated for a deflated member), and the whole of a
//!   checkpoint's `data.pkl`. These are found by running the same `zip`
//!   crate over a reader that fetches what it reads ([`Ensuring`]), after
//!   one batch of requests for what the central directory says will be
//!   read, so that only a surprise costs a request of its own.
//! - ONNX has no index: its reader walks the whole protobuf stream at
//!   open, so the whole object is fetched when it is within
//!   `--index-memory`, and refused in one line otherwise. So is a Hugging
//!   Face index (JSON).
//! - HDF5: our reader follows the file's addresses wherever they point,
//!   so the whole object is fetched, within `--index-memory`, as ONNX is.

use std::cell::RefCell;
use std::io::{Read, Seek, SeekFrom};
use std::rc::Rc;

use super::{Limits, gguf_header, sharded, zt_v01};
use crate::error::{Error, ErrorKind, Result};
use crate::source::{FetchError, MappedFile};

/// Bytes of each end of a remote file fetched to recognise it (rounded up
/// to the source's blocks, so a small index comes with them).
const ENDS: u64 = 64 << 10;

/// What a deflated member's inflater reads ahead of what it hands on (its
/// buffer, 32 KiB in flate2), for batching requests only: the reads
/// themselves go through [`Ensuring`].
const INFLATE_AHEAD: u64 = 64 << 10;

/// What `ztensor-compat` reads of a `.npy` member at open (its header).
const NPY_PROBE: u64 = 4096;

/// Room assumed for a local header's extra field when batching requests
/// (torch pads its members' data to 64 bytes with one); a longer one
/// costs one more request, never a wrong byte.
const LOCAL_EXTRA_GUESS: u64 = 1024;

/// The first and last bytes of a remote object (rounded up to the source's
/// blocks, so a small index comes with them): what recognising its format
/// reads. Then the format's entry in [`super::detect::FORMATS`] makes
/// present what its reader touches at open (see the module's
/// documentation), or [`unknown`] does for bytes of no format yet. Whatever
/// a format module reads beyond this (the data of a sparse tensor it
/// checks at open, a computed blob's stored bytes) it makes present itself.
pub fn ends(src: &MappedFile) -> Result<()> {
    let n = src.len();
    let tail = n.saturating_sub(ENDS);
    src.ensure_all(&[(0, ENDS.min(n)), (tail, n - tail)], true)
        .map_err(|why| io(src, why))
}

fn io(src: &MappedFile, why: FetchError) -> Error {
    Error::new(ErrorKind::Io, src.label(), None, why)
}

/// The little-endian u64 at `at` of `src`, if it has one there.
fn u64_at(src: &MappedFile, at: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    Some(u64::from_le_bytes(
        src.bytes().get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Makes present the index range a format's trailer or prefix names, if
/// it names one within the object and `--index-memory`; a lying one is
/// left to the format module to refuse (nothing past the budget is
/// fetched).
fn index_range(src: &MappedFile, limits: Limits, range: Option<(u64, u64)>) -> Result<()> {
    let within = |&(at, len): &(u64, u64)| {
        len <= limits.index_memory && at.checked_add(len).is_some_and(|e| e <= src.len())
    };
    match range.filter(within) {
        Some(r) => src.ensure_all(&[r], true).map_err(|why| io(src, why)),
        None => Ok(()),
    }
}

/// zTensor v0.1: the index its last 8 bytes size, then the data of the
/// sparse tensors in the reference layouts, which are read at open.
pub fn zt_v01(src: &MappedFile, limits: Limits) -> Result<()> {
    let n = src.len();
    let range = u64_at(src, n.saturating_sub(8))
        .filter(|&len| len.saturating_add(16) <= n)
        .map(|len| (n - 8 - len, len));
    index_range(src, limits, range)?;
    let Ok(idx) = zt_v01::index::parse(src.bytes(), src.label(), limits.index_memory) else {
        return Ok(());
    };
    let ranges: Vec<(u64, u64)> = idx
        .entries
        .iter()
        .filter(|e| matches!(e.layout.as_str(), "sparsecsr" | "sparsecoo"))
        .map(|e| (e.offset, e.size))
        .collect();
    if ranges.is_empty() {
        return Ok(());
    }
    src.ensure_all(&ranges, false).map_err(|why| io(src, why))
}

/// zTensor v1: the manifest, then its u64 size and the magic.
pub fn zt_v1(src: &MappedFile, limits: Limits) -> Result<()> {
    let n = src.len();
    let range = u64_at(src, n.saturating_sub(16))
        .filter(|&len| len.saturating_add(24) <= n)
        .map(|len| (n - 16 - len, len));
    index_range(src, limits, range)
}

/// zTensor v2: the manifest its footer places and sizes.
pub fn zt_v2(src: &MappedFile, limits: Limits) -> Result<()> {
    let n = src.len();
    let range = (n >= 40)
        .then(|| u64_at(src, n - 40).zip(u64_at(src, n - 32)))
        .flatten();
    index_range(src, limits, range)
}

/// safetensors: a u64 header length, then the header.
pub fn safetensors(src: &MappedFile, limits: Limits) -> Result<()> {
    index_range(src, limits, u64_at(src, 0).map(|len| (8, len)))
}

/// deathtensors: magic, version, flags, then a u64 header length.
pub fn deathtensors(src: &MappedFile, limits: Limits) -> Result<()> {
    index_range(src, limits, u64_at(src, 16).map(|len| (24, len)))
}

/// A Hugging Face index (JSON): read whole.
pub fn json_index(src: &MappedFile, limits: Limits) -> Result<()> {
    let limits = Limits {
        index_memory: limits.index_memory.min(sharded::MAX_INDEX),
    };
    whole(src, limits, "a JSON index")
}

/// Bytes no format took yet, as only the object's ends are present: ONNX
/// (recognised only by a walk over the whole file) and a large JSON index
/// are read whole; anything else is left to the refusal.
pub fn unknown(src: &MappedFile, limits: Limits) -> Result<()> {
    let bytes = src.bytes();
    if bytes.first() == Some(&0x08) {
        return whole(src, limits, "what may be an ONNX model");
    }
    let first = bytes.iter().position(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|i| bytes[i] == b'{') {
        return json_index(src, limits);
    }
    Ok(())
}

/// The whole object, if it is within `--index-memory`: `what` names it in
/// the refusal.
pub fn whole(src: &MappedFile, limits: Limits, what: &str) -> Result<()> {
    let n = src.len();
    if n > limits.index_memory {
        return Err(Error::new(
            ErrorKind::NotSupported,
            src.label(),
            None,
            format!(
                "{what} is read whole at open, and over a URL it is fetched whole first: its {n} \
                 bytes are more than the {} allowed (--index-memory); mount a local copy",
                crate::size::bytes(limits.index_memory)
            ),
        ));
    }
    src.ensure_all(&[(0, n)], true)
        .map_err(|why| Error::new(ErrorKind::Io, src.label(), None, why))
}

/// A GGUF header: the fetched prefix grows fourfold until the header ends
/// within it. A broken header is left to the format's own refusal, which
/// reads nothing past where the walk stopped.
pub fn gguf(src: &MappedFile, limits: Limits) -> Result<()> {
    let n = src.len();
    let mut have = ENDS.min(n);
    loop {
        match gguf_header::extent(&src.bytes()[..have as usize], n) {
            gguf_header::Extent::Ends(_) | gguf_header::Extent::Broken(_) => return Ok(()),
            gguf_header::Extent::Short if have >= n => return Ok(()),
            gguf_header::Extent::Short => {}
        }
        let next = have.saturating_mul(4).min(n);
        if next > limits.index_memory {
            return Err(Error::new(
                ErrorKind::Index,
                src.label(),
                None,
                format!(
                    "its GGUF header runs past its first {have} bytes, and fetching more would \
                     pass the {} allowed (--index-memory)",
                    crate::size::bytes(limits.index_memory)
                ),
            ));
        }
        src.ensure_all(&[(0, next)], true)
            .map_err(|why| Error::new(ErrorKind::Io, src.label(), None, why))?;
        have = next;
    }
}

/// A reader over a remote file that fetches what it is asked to read
/// before reading it from the mapping. It is handed to the same `zip`
/// crate (one version in the build) that `ztensor-compat` reads with, so
/// a buffered reader in it asks here for what it asks the file for. A
/// failed fetch is kept in `failed`, so that it is told apart from a
/// broken file.
struct Ensuring<'a> {
    src: &'a MappedFile,
    pos: u64,
    failed: Rc<RefCell<Option<FetchError>>>,
    /// Bytes it may still read: a broken archive sends the `zip` crate
    /// searching the whole file for its records.
    budget: u64,
}

impl Read for Ensuring<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let len = self.src.len();
        let n = (buf.len() as u64).min(len.saturating_sub(self.pos));
        if n == 0 {
            return Ok(0);
        }
        let Some(left) = self.budget.checked_sub(n) else {
            let why = FetchError::failed(
                "reading its zip directory and headers would read more than the bytes \
                 allowed (--index-memory)",
            );
            *self.failed.borrow_mut() = Some(why.clone());
            return Err(std::io::Error::other(why));
        };
        self.budget = left;
        if let Err(why) = self.src.ensure_all(&[(self.pos, n)], true) {
            *self.failed.borrow_mut() = Some(why.clone());
            return Err(std::io::Error::other(why));
        }
        let at = self.pos as usize;
        buf[..n as usize].copy_from_slice(&self.src.bytes()[at..at + n as usize]);
        self.pos += n;
        Ok(n as usize)
    }
}

impl Seek for Ensuring<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let len = self.src.len() as i128;
        let at = match to {
            SeekFrom::Start(n) => i128::from(n),
            SeekFrom::End(d) => len + i128::from(d),
            SeekFrom::Current(d) => i128::from(self.pos) + i128::from(d),
        };
        self.pos = u64::try_from(at).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
        })?;
        Ok(self.pos)
    }
}

/// A member as its central directory entry describes it.
struct Member {
    header_start: u64,
    name_len: u64,
    compressed: u64,
    stored: bool,
    name: Vec<u8>,
}

/// The central directory's entries, for batching requests only: a field
/// misread here costs a request, never a byte, as the `zip` crate then
/// reads the archive for real through [`Ensuring`]. (Written here because
/// that crate gives no member's local header offset without reading the
/// local header, the very read to be batched.)
fn central_directory(b: &[u8], mut at: usize, count: usize, offset: u64) -> Vec<Member> {
    let u16_at = |b: &[u8], i: usize| -> Option<u64> {
        Some(u64::from(u16::from_le_bytes(
            b.get(i..i + 2)?.try_into().ok()?,
        )))
    };
    let u32_at = |b: &[u8], i: usize| -> Option<u64> {
        Some(u64::from(u32::from_le_bytes(
            b.get(i..i + 4)?.try_into().ok()?,
        )))
    };
    let u64_at = |b: &[u8], i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
    };
    let mut out = Vec::new();
    for _ in 0..count {
        let Some(e) = b.get(at..at.saturating_add(46)) else {
            break;
        };
        if e[..4] != [0x50, 0x4b, 0x01, 0x02] {
            break;
        }
        let one = || -> Option<(Member, usize)> {
            let method = u16_at(e, 10)?;
            let (mut compressed, mut size) = (u32_at(e, 20)?, u32_at(e, 24)?);
            let (name_len, extra_len, comment_len) =
                (u16_at(e, 28)?, u16_at(e, 30)?, u16_at(e, 32)?);
            let mut local = u32_at(e, 42)?;
            let name_at = at + 46;
            let name = b.get(name_at..name_at + name_len as usize)?.to_vec();
            let extra = b.get(name_at + name_len as usize..)?;
            let extra = extra.get(..extra_len as usize)?;
            // The zip64 extra field holds, in order, each 32-bit field
            // that is all ones.
            let mut i = 0;
            while i + 4 <= extra.len() {
                let (id, len) = (u16_at(extra, i)?, u16_at(extra, i + 2)? as usize);
                if id == 1 {
                    let mut j = i + 4;
                    for field in [&mut size, &mut compressed, &mut local] {
                        if *field == u64::from(u32::MAX) {
                            *field = u64_at(extra, j)?;
                            j += 8;
                        }
                    }
                }
                i += 4 + len;
            }
            let next = name_at + (name_len + extra_len + comment_len) as usize;
            Some((
                Member {
                    header_start: offset.checked_add(local)?,
                    name_len,
                    compressed,
                    stored: method == 0,
                    name,
                },
                next,
            ))
        };
        match one() {
            Some((m, next)) => {
                out.push(m);
                at = next;
            }
            None => break,
        }
    }
    out
}

/// A zip archive (npz or `.pt`): see the module's documentation.
pub fn zip(src: &MappedFile, limits: Limits) -> Result<()> {
    let io = |why: FetchError| Error::new(ErrorKind::Io, src.label(), None, why);
    // The end record is within the last 64 KiB and 22 bytes (its comment
    // is at most 65 535 bytes), fetched already: without one, the zip
    // crate would search the whole object for it.
    let n = src.len();
    let from = n.saturating_sub(ENDS + 22);
    src.ensure_all(&[(from, n - from)], true).map_err(io)?;
    let tail = &src.bytes()[from as usize..];
    if !tail.windows(4).any(|w| w == b"PK\x05\x06") {
        return Err(Error::new(
            ErrorKind::Index,
            src.label(),
            None,
            "a zip archive (npz or .pt) with no end-of-central-directory record in its last \
             64 KiB: truncated or damaged",
        ));
    }
    let failed = Rc::new(RefCell::new(None));
    let reader = Ensuring {
        src,
        pos: 0,
        failed: failed.clone(),
        budget: limits.index_memory,
    };
    let fetch_failed = || failed.borrow().clone().map(io);
    // The end records and the central directory (within the ends fetched
    // already, unless the directory is large).
    let mut archive = match zip::ZipArchive::new(reader) {
        Ok(a) => a,
        // A broken archive: the crate reads what we read, and refuses it.
        Err(_) => return fetch_failed().map_or(Ok(()), Err),
    };
    let is_pt = archive.file_names().any(|n| n.ends_with("data.pkl"));
    // One batch for what the reads below will want.
    let members = central_directory(
        src.bytes(),
        usize::try_from(archive.central_directory_start()).unwrap_or(usize::MAX),
        archive.len(),
        archive.offset(),
    );
    let mut batch = Vec::with_capacity(members.len());
    for m in &members {
        let local = 30 + m.name_len + LOCAL_EXTRA_GUESS;
        let data = if is_pt && m.name.ends_with(b"data.pkl") {
            m.compressed.min(limits.index_memory)
        } else if !is_pt && m.name.ends_with(b".npy") {
            if m.stored {
                NPY_PROBE
            } else {
                m.compressed.min(INFLATE_AHEAD)
            }
        } else {
            0
        };
        batch.push((m.header_start, local + data));
    }
    src.ensure_all(&batch, true).map_err(io)?;
    // What the crate reads, read through the same `zip` crate: every local
    // header; of an npz, each .npy member's header; of a checkpoint, the
    // pickle.
    let mut pickle_seen = false;
    for i in 0..archive.len() {
        let entry = if is_pt {
            archive.by_index_raw(i)
        } else {
            archive.by_index(i)
        };
        let mut entry = match entry {
            Ok(e) => e,
            Err(_) => match fetch_failed() {
                Some(e) => return Err(e),
                // The crate refuses the same member, or skips it.
                None => continue,
            },
        };
        let (start, size, compressed) = (entry.data_start(), entry.size(), entry.compressed_size());
        let stored = entry.compression() == zip::CompressionMethod::Stored;
        let name = entry.name().to_string();
        let wanted = if is_pt && name.ends_with("data.pkl") && !pickle_seen {
            pickle_seen = true;
            if compressed > limits.index_memory {
                return Err(Error::new(
                    ErrorKind::Index,
                    src.label(),
                    None,
                    format!(
                        "its pickle {name:?} is {compressed} bytes, more than the {} allowed \
                         (--index-memory)",
                        crate::size::bytes(limits.index_memory)
                    ),
                ));
            }
            Some((start, compressed))
        } else if !is_pt && name.ends_with(".npy") && stored {
            Some((start, size.min(NPY_PROBE)))
        } else if !is_pt && name.ends_with(".npy") {
            // Inflated as the crate inflates it: through the reader.
            let mut head = vec![0u8; NPY_PROBE.min(size) as usize];
            if entry.read_exact(&mut head).is_err()
                && let Some(e) = fetch_failed()
            {
                return Err(e);
            }
            None
        } else {
            None
        };
        drop(entry);
        if let Some((at, len)) = wanted {
            src.ensure_all(&[(at, len)], true).map_err(io)?;
        }
    }
    Ok(())
}
