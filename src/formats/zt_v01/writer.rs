//! Writes zTensor v0.1 files, streaming: blobs go straight to the output and
//! only the index is kept in memory. zstd blobs are written as a run of
//! independent frames (each declares its decoded size), which any zstd decoder
//! reads as one stream and which lets a reader jump to the frame it needs.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;

use ciborium::value::Value;

use super::index::{ALIGNMENT, MAGIC, int};
use crate::catalog::dtype::{DType, Endian, swap_elements};
use crate::codec::digest::{Algorithm, Hasher};

/// Decoded bytes per zstd frame unless asked otherwise: large enough to
/// compress well, small enough that a reader waits for little.
pub const DEFAULT_FRAME_SIZE: usize = 1 << 20;
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
/// Custom field: decoded bytes per zstd frame (all frames but the last).
pub const FRAME_SIZE_KEY: &str = "zstd_frame_size";
/// Custom field: compressed size of each zstd frame, in order.
pub const FRAMES_KEY: &str = "zstd_frames";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Raw,
    /// `frame_size` decoded bytes per frame (rounded down to whole elements);
    /// 0 writes a single frame.
    Zstd {
        level: i32,
        frame_size: usize,
    },
}

impl Compression {
    pub fn zstd() -> Compression {
        Compression::Zstd {
            level: DEFAULT_ZSTD_LEVEL,
            frame_size: DEFAULT_FRAME_SIZE,
        }
    }
}

/// How to store one tensor.
#[derive(Debug, Clone)]
pub struct Options {
    pub compression: Compression,
    /// Byte order on disk; input is always little-endian. With zstd it is
    /// the decoded bytes' order, as this reader takes `data_endianness`; the
    /// reference package applies that field to raw blobs only, so `pack`
    /// writes zstd tensors little-endian.
    pub endian: Endian,
    pub checksum: Option<Algorithm>,
    /// Extra metadata fields, written after the spec's fields.
    pub custom: Vec<(Value, Value)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            compression: Compression::Raw,
            endian: Endian::Little,
            checksum: None,
            custom: Vec::new(),
        }
    }
}

pub struct Writer<W: Write> {
    out: W,
    pos: u64,
    entries: Vec<Value>,
    /// Names taken so far: a reader refuses a file that repeats one.
    names: HashSet<String>,
}

impl Writer<BufWriter<File>> {
    pub fn create(path: &Path) -> io::Result<Self> {
        Writer::new(BufWriter::with_capacity(1 << 20, File::create(path)?))
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl<W: Write> Writer<W> {
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(MAGIC)?;
        Ok(Writer {
            out,
            pos: MAGIC.len() as u64,
            entries: Vec::new(),
            names: HashSet::new(),
        })
    }

    /// Takes `name` for a new tensor, or says why a reader would refuse it.
    fn claim(&mut self, name: &str) -> io::Result<()> {
        if name.is_empty() {
            return Err(invalid("a tensor name is empty".into()));
        }
        if name.contains('\0') {
            return Err(invalid(format!("{name:?}: a tensor name holds a NUL")));
        }
        if !self.names.insert(name.to_owned()) {
            return Err(invalid(format!("{name}: the name is used twice")));
        }
        Ok(())
    }

    /// Adds a dense tensor from little-endian element bytes in memory.
    pub fn add(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        data: &[u8],
        opts: &Options,
    ) -> io::Result<()> {
        self.add_from(name, dtype, shape, &mut &data[..], opts)
    }

    /// Adds a dense tensor whose little-endian bytes are read from `input`
    /// (exactly the size the shape needs), holding one frame at a time.
    pub fn add_from(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        input: &mut dyn Read,
        opts: &Options,
    ) -> io::Result<()> {
        v01_type(name, dtype)?;
        let nbytes = shape
            .iter()
            .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
            .ok_or_else(|| invalid(format!("{name}: shape {shape:?} is too large")))?;
        self.claim(name)?;
        let mut blob = self.begin(dtype.size() as usize, nbytes, opts)?;
        let mut buf = vec![0u8; blob.chunk];
        let mut left = nbytes;
        while left > 0 {
            let n = (buf.len() as u64).min(left) as usize;
            input.read_exact(&mut buf[..n]).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{name}: input holds fewer than the {nbytes} bytes of shape {shape:?}: {e}"
                    ),
                )
            })?;
            blob.push(&mut self.out, &mut buf[..n])?;
            left -= n as u64;
        }
        let (offset, size, checksum, frames) = blob.finish(&mut self.out)?;
        self.pos = offset + size;
        self.record(
            name, offset, size, dtype, shape, "dense", opts, checksum, frames,
        );
        Ok(())
    }

    /// Adds a CSR matrix in this project's sparse form (see README).
    #[allow(clippy::too_many_arguments)]
    pub fn add_csr(
        &mut self,
        name: &str,
        dtype: DType,
        shape: [u64; 2],
        indptr: &[u64],
        indices: &[u64],
        values: &[u8],
        opts: &Options,
    ) -> io::Result<()> {
        v01_type(name, dtype)?;
        if indptr.len() as u64 != shape[0] + 1
            || values.len() as u64 != indices.len() as u64 * dtype.size()
        {
            return Err(invalid(format!("{name}: CSR parts do not match the shape")));
        }
        let parts: [(&str, DType, Vec<u8>); 3] = [
            ("indptr", DType::Uint64, le_u64(indptr)),
            ("indices", DType::Uint64, le_u64(indices)),
            ("values", dtype, values.to_vec()),
        ];
        self.add_sparse(
            name,
            dtype,
            &shape,
            "csr",
            indices.len() as u64,
            parts.to_vec(),
            opts,
        )
    }

    /// Adds a COO tensor in this project's sparse form: `indices` is the
    /// `[ndim, nnz]` coordinate array in C order.
    pub fn add_coo(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        indices: &[u64],
        values: &[u8],
        opts: &Options,
    ) -> io::Result<()> {
        v01_type(name, dtype)?;
        let nnz = values.len() as u64 / dtype.size();
        if indices.len() as u64 != nnz * shape.len() as u64
            || shape.is_empty()
            || !(values.len() as u64).is_multiple_of(dtype.size())
        {
            return Err(invalid(format!("{name}: COO parts do not match the shape")));
        }
        let parts = vec![
            ("indices", DType::Uint64, le_u64(indices)),
            ("values", dtype, values.to_vec()),
        ];
        self.add_sparse(name, dtype, shape, "coo", nnz, parts, opts)
    }

    #[allow(clippy::too_many_arguments)]
    fn add_sparse(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[u64],
        format: &str,
        nnz: u64,
        parts: Vec<(&str, DType, Vec<u8>)>,
        opts: &Options,
    ) -> io::Result<()> {
        self.claim(name)?;
        let total = parts.iter().map(|p| p.2.len() as u64).sum();
        let mut blob = self.begin(1, total, opts)?;
        let mut offsets = Vec::new();
        let mut at = 0u64;
        for (pname, pdtype, mut bytes) in parts {
            offsets.push((Value::Text(pname.into()), int(at)));
            at += bytes.len() as u64;
            if opts.endian == Endian::Big {
                swap_elements(&mut bytes, pdtype.size() as usize);
            }
            blob.push_as_is(&mut self.out, &bytes)?;
        }
        let (offset, size, checksum, frames) = blob.finish(&mut self.out)?;
        self.pos = offset + size;
        let mut extra = frames;
        extra.extend([
            (
                Value::Text("sparse_format".into()),
                Value::Text(format.into()),
            ),
            (Value::Text("nnz".into()), int(nnz)),
            (
                Value::Text("index_dtype".into()),
                Value::Text("uint64".into()),
            ),
            (Value::Text("sparse_offsets".into()), Value::Map(offsets)),
        ]);
        self.record(
            name, offset, size, dtype, shape, "sparse", opts, checksum, extra,
        );
        Ok(())
    }

    /// Low level: writes `blob` as-is at the next aligned offset and an index
    /// entry made of `fields` plus `offset` and `size`. For tests that need
    /// files no well-behaved writer makes: nothing is checked, names
    /// included.
    pub fn add_blob(&mut self, blob: &[u8], fields: Vec<(Value, Value)>) -> io::Result<u64> {
        let offset = self.pad()?;
        self.out.write_all(blob)?;
        self.pos = offset + blob.len() as u64;
        let mut map = vec![
            (Value::Text("offset".into()), int(offset)),
            (Value::Text("size".into()), int(blob.len() as u64)),
        ];
        map.extend(fields);
        self.entries.push(Value::Map(map));
        Ok(offset)
    }

    /// Writes the index and its size; returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        let mut cbor = Vec::new();
        ciborium::ser::into_writer(&Value::Array(std::mem::take(&mut self.entries)), &mut cbor)
            .map_err(|e| io::Error::other(format!("cannot encode the index: {e}")))?;
        self.out.write_all(&cbor)?;
        self.out.write_all(&(cbor.len() as u64).to_le_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn pad(&mut self) -> io::Result<u64> {
        let aligned = self.pos.div_ceil(ALIGNMENT) * ALIGNMENT;
        let zeros = [0u8; ALIGNMENT as usize];
        self.out
            .write_all(&zeros[..(aligned - self.pos) as usize])?;
        self.pos = aligned;
        Ok(aligned)
    }

    /// Starts a blob of `total` decoded bytes made of `elem`-byte elements.
    fn begin(&mut self, elem: usize, total: u64, opts: &Options) -> io::Result<BlobSink> {
        let offset = self.pad()?;
        let (codec, chunk) = match opts.compression {
            Compression::Raw => (Codec::Raw, DEFAULT_FRAME_SIZE),
            Compression::Zstd {
                level,
                frame_size: 0,
            } => {
                let mut e = zstd::stream::raw::Encoder::new(level)?;
                // Declared so readers know the decoded size from the header.
                e.set_pledged_src_size(Some(total))?;
                (Codec::Stream(Box::new(e)), DEFAULT_FRAME_SIZE)
            }
            Compression::Zstd { level, frame_size } => {
                let c = zstd::bulk::Compressor::new(level)?;
                (
                    Codec::Frames(Box::new(c)),
                    (frame_size / elem).max(1) * elem,
                )
            }
        };
        Ok(BlobSink {
            offset,
            size: 0,
            elem,
            swap: opts.endian == Endian::Big,
            hasher: opts.checksum.map(Hasher::new),
            codec,
            chunk,
            pending: Vec::new(),
            scratch: Vec::new(),
            frames: Vec::new(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        name: &str,
        offset: u64,
        size: u64,
        dtype: DType,
        shape: &[u64],
        layout: &str,
        opts: &Options,
        checksum: Option<String>,
        extra: Vec<(Value, Value)>,
    ) {
        let t = |s: &str| Value::Text(s.to_string());
        let mut map = vec![
            (t("name"), t(name)),
            (t("offset"), int(offset)),
            (t("size"), int(size)),
            (t("dtype"), t(dtype.name())),
            (
                t("shape"),
                Value::Array(shape.iter().map(|&d| int(d)).collect()),
            ),
            (
                t("encoding"),
                t(if matches!(opts.compression, Compression::Raw) {
                    "raw"
                } else {
                    "zstd"
                }),
            ),
            (t("layout"), t(layout)),
        ];
        if dtype.size() > 1 || layout != "dense" {
            map.push((t("data_endianness"), t(opts.endian.name())));
        }
        if let Some(c) = checksum {
            map.push((t("checksum"), t(&c)));
        }
        map.extend(extra);
        map.extend(opts.custom.iter().cloned());
        self.entries.push(Value::Map(map));
    }
}

fn le_u64(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A finished blob: (offset, size, checksum, frame-table fields).
type Written = (u64, u64, Option<String>, Vec<(Value, Value)>);

/// How a blob's bytes are encoded on their way out.
enum Codec {
    Raw,
    /// Independent frames of `chunk` decoded bytes each.
    Frames(Box<zstd::bulk::Compressor<'static>>),
    /// One frame, streamed.
    Stream(Box<zstd::stream::raw::Encoder<'static>>),
}

/// One blob being written: swaps, compresses and hashes the on-disk bytes.
struct BlobSink {
    offset: u64,
    size: u64,
    elem: usize,
    swap: bool,
    hasher: Option<Hasher>,
    codec: Codec,
    /// Decoded bytes per frame (and per read of the input).
    chunk: usize,
    /// Decoded bytes waiting for a full frame.
    pending: Vec<u8>,
    /// Output buffer of the streaming encoder.
    scratch: Vec<u8>,
    /// Compressed size of each frame written so far.
    frames: Vec<u64>,
}

impl BlobSink {
    /// Little-endian elements (a whole number of them).
    fn push(&mut self, out: &mut dyn Write, data: &mut [u8]) -> io::Result<()> {
        if self.swap {
            swap_elements(data, self.elem);
        }
        self.push_as_is(out, data)
    }

    fn push_as_is(&mut self, out: &mut dyn Write, mut data: &[u8]) -> io::Result<()> {
        match &mut self.codec {
            Codec::Raw => self.emit(out, data),
            Codec::Stream(enc) => {
                use zstd::stream::raw::Operation;
                if self.scratch.is_empty() {
                    self.scratch = vec![0u8; 1 << 17];
                }
                let mut scratch = std::mem::take(&mut self.scratch);
                let mut enc_result = Ok(());
                while !data.is_empty() {
                    match enc.run_on_buffers(data, &mut scratch) {
                        Ok(st) => {
                            data = &data[st.bytes_read..];
                            let written = st.bytes_written;
                            if let Err(e) =
                                emit_to(&mut self.hasher, &mut self.size, out, &scratch[..written])
                            {
                                enc_result = Err(e);
                                break;
                            }
                        }
                        Err(e) => {
                            enc_result = Err(e);
                            break;
                        }
                    }
                }
                self.scratch = scratch;
                enc_result
            }
            Codec::Frames(_) => {
                while !data.is_empty() {
                    let take = (self.chunk - self.pending.len()).min(data.len());
                    self.pending.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.pending.len() == self.chunk {
                        self.flush_frame(out)?;
                    }
                }
                Ok(())
            }
        }
    }

    fn flush_frame(&mut self, out: &mut dyn Write) -> io::Result<()> {
        if let Codec::Frames(c) = &mut self.codec {
            let frame = c.compress(&self.pending)?;
            self.pending.clear();
            self.frames.push(frame.len() as u64);
            self.emit(out, &frame)?;
        }
        Ok(())
    }

    fn emit(&mut self, out: &mut dyn Write, bytes: &[u8]) -> io::Result<()> {
        emit_to(&mut self.hasher, &mut self.size, out, bytes)
    }

    /// (offset, size, checksum, frame-table fields for the index).
    fn finish(mut self, out: &mut dyn Write) -> io::Result<Written> {
        // An empty tensor still gets one (empty) frame: a zero-byte blob is
        // not a zstd stream and decoders refuse it.
        if !self.pending.is_empty() || (matches!(self.codec, Codec::Frames(_)) && self.size == 0) {
            self.flush_frame(out)?;
        }
        if let Codec::Stream(enc) = &mut self.codec {
            use zstd::stream::raw::{Operation, OutBuffer};
            let mut scratch = vec![0u8; 1 << 17];
            loop {
                let mut ob = OutBuffer::around(&mut scratch[..]);
                let remaining = enc.finish(&mut ob, true)?;
                let n = ob.pos();
                emit_to(&mut self.hasher, &mut self.size, out, &scratch[..n])?;
                if remaining == 0 {
                    break;
                }
            }
        }
        let checksum = self.hasher.take().map(|h| h.finish().to_string());
        // The frame table lets readers find any frame without walking the blob.
        let table = if self.frames.len() > 1 {
            vec![
                (Value::Text(FRAME_SIZE_KEY.into()), int(self.chunk as u64)),
                (
                    Value::Text(FRAMES_KEY.into()),
                    Value::Array(self.frames.iter().map(|&c| int(c)).collect()),
                ),
            ]
        } else {
            Vec::new()
        };
        Ok((self.offset, self.size, checksum, table))
    }
}

fn emit_to(
    hasher: &mut Option<Hasher>,
    size: &mut u64,
    out: &mut dyn Write,
    bytes: &[u8],
) -> io::Result<()> {
    if let Some(h) = hasher.as_mut() {
        h.update(bytes);
    }
    out.write_all(bytes)?;
    *size += bytes.len() as u64;
    Ok(())
}

/// Refuses an element type zTensor v0.1 has no name for.
fn v01_type(name: &str, dtype: DType) -> io::Result<()> {
    if DType::V01.contains(&dtype) {
        Ok(())
    } else {
        Err(invalid(format!("{name}: zTensor v0.1 has no type {dtype}")))
    }
}
