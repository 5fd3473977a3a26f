//! zstd blobs: frame discovery (so a reader can jump to the frame it needs)
//! and decoders that never produce more or fewer bytes than the index promised.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;

use super::read_ahead::ReadAhead;

use ::zstd::zstd_safe;
use zstd_safe::zstd_sys as sys;

/// One zstd frame inside a blob: where its compressed bytes are and which
/// range of the decoded tensor it produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub c_start: u64,
    pub c_len: u64,
    pub d_start: u64,
    pub d_len: u64,
}

/// Most frames a blob is served by: their list is kept while the file is
/// mounted, 32 MiB at this count (a frame can be 10 bytes of a hostile
/// blob). A 1 TiB tensor in 1 MiB frames has 2^20.
pub const MAX_FRAMES: usize = 1 << 20;

/// Walks the frames of `blob`. Returns `Ok(None)` when some frame does not
/// declare its decoded size, or there are more than [`MAX_FRAMES`] (the blob
/// must then be decoded as one stream). Cheap: it reads frame headers only.
pub fn scan_frames(blob: &[u8]) -> Result<Option<Vec<Frame>>, String> {
    let mut frames = Vec::new();
    Ok(walk_frames(blob, |f| frames.push(f))?.then_some(frames))
}

/// [`scan_frames`] into a list allocated for `n` frames (what
/// [`count_frames`] said), so it takes no more than was counted.
pub fn scan_frames_sized(blob: &[u8], n: usize) -> Result<Option<Vec<Frame>>, String> {
    let mut frames = Vec::with_capacity(n.min(MAX_FRAMES));
    let whole = walk_frames(blob, |f| {
        if frames.len() < frames.capacity() {
            frames.push(f);
        }
    })?;
    Ok((whole && frames.len() == n).then_some(frames))
}

/// How many frames [`scan_frames`] would list, without the list: a caller
/// can see what the list would cost before it is built.
pub fn count_frames(blob: &[u8]) -> Result<Option<usize>, String> {
    let mut n = 0;
    Ok(walk_frames(blob, |_| n += 1)?.then_some(n))
}

/// Hands each frame of `blob` to `each`; false when the frames cannot be
/// listed (see [`scan_frames`]).
///
/// Frames are listed only when every data frame but the last declares the
/// same decoded size, as this project's writer and pzstd write them. A frame
/// is placed by the sizes the frames before it declare, and a frame header
/// that lies is found out only when that frame is decoded: with equal sizes
/// a damaged size breaks the pattern and the blob goes back to one stream,
/// which fails at the damage, instead of later frames being served from
/// the wrong place.
fn walk_frames(blob: &[u8], mut each: impl FnMut(Frame)) -> Result<bool, String> {
    let mut pos = 0usize;
    let mut d_start = 0u64;
    let mut count = 0usize;
    // The first data frame's size, and the latest one's (not the last
    // once another follows).
    let (mut first, mut latest) = (None, None);
    while pos < blob.len() {
        if count == MAX_FRAMES {
            return Ok(false);
        }
        let rest = &blob[pos..];
        let c_len = zstd_safe::find_frame_compressed_size(rest).map_err(|code| {
            format!(
                "zstd data is corrupt: frame at blob byte {pos}: {}",
                zstd_safe::get_error_name(code)
            )
        })?;
        if c_len == 0 {
            return Err(format!(
                "zstd data is corrupt: frame at blob byte {pos} has no length"
            ));
        }
        let d_len = match zstd_safe::get_frame_content_size(rest) {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(false),
            Err(_) => {
                return Err(format!(
                    "zstd data is corrupt: frame at blob byte {pos} has a bad header"
                ));
            }
        };
        if !is_skippable(rest) {
            if latest.is_some() && latest != first {
                return Ok(false);
            }
            first = first.or(Some(d_len));
            latest = Some(d_len);
        }
        each(Frame {
            c_start: pos as u64,
            c_len: c_len as u64,
            d_start,
            d_len,
        });
        count += 1;
        d_start = d_start
            .checked_add(d_len)
            .ok_or_else(|| "zstd frames declare more than 2^64 bytes".to_string())?;
        pos += c_len;
    }
    Ok(true)
}

/// Whether `rest` starts with a skippable frame (no data, any length).
fn is_skippable(rest: &[u8]) -> bool {
    rest.get(..4)
        .and_then(|m| m.try_into().ok())
        .is_some_and(|m| u32::from_le_bytes(m) & 0xFFFF_FFF0 == 0x184D_2A50)
}

/// The largest window of the frames of `blob` (see [`frame_window`]),
/// skippable frames left out, walking frame and block headers only: no
/// decoded sizes needed. `None` when the walk cannot tell (a bad header, a
/// reserved block type, more than [`MAX_FRAMES`] frames). `done` is handed
/// each stretch of `blob` walked past, about 8 MiB at a time, so a caller
/// walking a mapping can let go of it as it goes.
pub fn max_window(blob: &[u8], mut done: impl FnMut(&[u8])) -> Option<u64> {
    let (mut pos, mut frames, mut max, mut released) = (0usize, 0usize, 0u64, 0usize);
    while pos < blob.len() {
        frames += 1;
        if frames > MAX_FRAMES {
            return None;
        }
        let rest = &blob[pos..];
        let magic = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
        if magic & 0xFFFF_FFF0 == 0x184D_2A50 {
            // A skippable frame: its length, then that many bytes.
            let n = u32::from_le_bytes(rest.get(4..8)?.try_into().ok()?);
            pos = pos.checked_add(8 + n as usize)?;
            continue;
        }
        max = max.max(frame_window(rest)?);
        let fhd = *rest.get(4)?;
        let single = fhd & 0x20 != 0;
        let fcs = match fhd >> 6 {
            0 => usize::from(single),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let did = [0, 1, 2, 4][usize::from(fhd & 3)];
        pos += 5 + usize::from(!single) + did + fcs;
        loop {
            let h = blob.get(pos..pos + 3)?;
            let h = u32::from(h[0]) | u32::from(h[1]) << 8 | u32::from(h[2]) << 16;
            let size = (h >> 3) as usize;
            let body = match (h >> 1) & 3 {
                0 | 2 => size,
                1 => 1,
                _ => return None,
            };
            pos = pos.checked_add(3 + body)?;
            if pos - released >= 8 << 20 {
                done(&blob[released..pos.min(blob.len())]);
                released = pos.min(blob.len());
            }
            if h & 1 == 1 {
                break;
            }
        }
        if fhd & 4 != 0 {
            pos += 4;
        }
    }
    if pos != blob.len() {
        return None;
    }
    done(&blob[released..]);
    Some(max)
}

/// Whether `blob` is exactly one zstd frame (by its block headers; what
/// the frame decodes to is the decoder's to check).
pub fn is_one_frame(blob: &[u8]) -> bool {
    !is_skippable(blob) && zstd_safe::find_frame_compressed_size(blob) == Ok(blob.len())
}

/// The decoded size the first frame of `src` declares, if it does.
pub fn first_frame_size(src: &[u8]) -> Option<u64> {
    zstd_safe::get_frame_content_size(src).ok().flatten()
}

/// Frames from a writer's frame table (`zstd_frame_size` decoded bytes per
/// frame, `zstd_frames` compressed sizes), if it agrees with the blob and
/// the decoded size. Each frame is still checked when decoded (exactly one
/// frame, exactly its decoded size), so a lying table gives errors, never
/// other bytes.
pub fn frames_from_table(
    frame_size: u64,
    sizes: &[u64],
    blob_len: u64,
    decoded: u64,
) -> Option<Vec<Frame>> {
    let n = sizes.len() as u64;
    if n < 2 || sizes.len() > MAX_FRAMES || frame_size == 0 || sizes.contains(&0) {
        return None;
    }
    let full = frame_size.checked_mul(n - 1)?;
    let last = decoded
        .checked_sub(full)
        .filter(|&l| l > 0 && l <= frame_size)?;
    let mut frames = Vec::with_capacity(sizes.len());
    let mut c_start = 0u64;
    for (k, &c_len) in sizes.iter().enumerate() {
        let d_len = if k as u64 == n - 1 { last } else { frame_size };
        frames.push(Frame {
            c_start,
            c_len,
            d_start: k as u64 * frame_size,
            d_len,
        });
        c_start = c_start.checked_add(c_len)?;
    }
    (c_start == blob_len).then_some(frames)
}

/// Frames from a format's list of `(stored, decoded)` sizes, if it agrees
/// with the blob (the frames may be followed by other bytes of the blob,
/// such as a seek table in a skippable frame) and the decoded size. As with
/// [`frames_from_table`], each frame is still checked when decoded.
pub fn frames_from_list(sizes: &[(u64, u64)], blob_len: u64, decoded: u64) -> Option<Vec<Frame>> {
    if sizes.len() < 2 || sizes.len() > MAX_FRAMES || sizes.iter().any(|&(c, d)| c == 0 || d == 0) {
        return None;
    }
    let mut frames = Vec::with_capacity(sizes.len());
    let (mut c_start, mut d_start) = (0u64, 0u64);
    for &(c_len, d_len) in sizes {
        frames.push(Frame {
            c_start,
            c_len,
            d_start,
            d_len,
        });
        c_start = c_start.checked_add(c_len)?;
        d_start = d_start.checked_add(d_len)?;
    }
    (c_start <= blob_len && d_start == decoded).then_some(frames)
}

/// Decodes one frame, refusing a slice that is not exactly one frame.
pub fn decode_frame(src: &[u8], out: &mut Vec<u8>, expected: usize) -> Result<(), String> {
    match zstd_safe::find_frame_compressed_size(src) {
        Ok(n) if n == src.len() => decode_to_vec(src, out, expected),
        Ok(n) => Err(format!(
            "zstd data is corrupt: frame is {n} bytes, its table says {}",
            src.len()
        )),
        Err(code) => Err(format!(
            "zstd data is corrupt: {}",
            zstd_safe::get_error_name(code)
        )),
    }
}

/// Decodes `src` (one or more frames) into `out`, which must be empty with
/// room for exactly `expected` bytes. One-shot decoding straight into the
/// destination: no window copy and no zero-filling.
pub fn decode_to_vec(src: &[u8], out: &mut Vec<u8>, expected: usize) -> Result<(), String> {
    out.clear();
    out.reserve_exact(expected);
    let n = decode_one_shot(src, out, expected)?;
    if n != expected || out.len() != expected {
        return Err(format!(
            "zstd data decodes to only {n} bytes, expected {expected}"
        ));
    }
    Ok(())
}

/// One-shot decode into `out` (its capacity is the declared size: a stream
/// that would decode to more fails here instead of growing the buffer).
fn decode_one_shot<C: zstd_safe::WriteBuf + ?Sized>(
    src: &[u8],
    out: &mut C,
    expected: usize,
) -> Result<usize, String> {
    DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        let dctx = match &mut *slot {
            Some(d) => d,
            None => slot.insert(
                zstd_safe::DCtx::try_create().ok_or("zstd decoder: cannot allocate a context")?,
            ),
        };
        dctx.decompress(out, src)
            .map_err(|code| Fault(code).decoding(expected))
    })
}

thread_local! {
    /// One decompression context per thread, reused across calls.
    static DCTX: std::cell::RefCell<Option<zstd_safe::DCtx<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Decodes `src` in chunks handed to `sink`, failing as soon as the output
/// would pass `expected` bytes and if it ends short of it.
pub fn decode_stream(
    src: &[u8],
    expected: u64,
    mut sink: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut dec =
        zstd::stream::read::Decoder::with_buffer(src).map_err(|e| format!("zstd decoder: {e}"))?;
    read_exactly(&mut dec, expected, 1 << 20, &mut sink)?;
    ensure_finished(&mut dec, expected)
}

/// [`decode_stream`] over compressed bytes read through `src`, with a
/// window of at most 2^`window_log_max` bytes: a frame that needs more
/// fails.
pub fn decode_stream_from<R: std::io::BufRead>(
    src: R,
    expected: u64,
    window_log_max: u32,
    mut sink: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut dec =
        zstd::stream::read::Decoder::with_buffer(src).map_err(|e| format!("zstd decoder: {e}"))?;
    dec.window_log_max(window_log_max)
        .map_err(|e| format!("zstd decoder: {e}"))?;
    read_exactly(&mut dec, expected, 1 << 20, &mut sink)?;
    ensure_finished(&mut dec, expected)
}

/// Hands the first `n` decoded bytes of `dec` to `sink`, `chunk` at most
/// at a time; an error if the stream ends before.
fn read_exactly<R: std::io::BufRead>(
    dec: &mut zstd::stream::read::Decoder<'_, R>,
    n: u64,
    chunk: usize,
    mut sink: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut buf = vec![0u8; chunk];
    let mut done = 0u64;
    while done < n {
        let want = (n - done).min(buf.len() as u64) as usize;
        match dec.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(format!(
                    "zstd data decodes to only {done} bytes, expected {n}"
                ));
            }
            Ok(k) => {
                sink(&buf[..k])?;
                done += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("zstd data is corrupt: {e}")),
        }
    }
    Ok(())
}

/// Whether the first frame of `src` carries a content checksum (checked by
/// zstd only when the frame ends); `None` if `src` does not start with a
/// zstd frame header.
pub fn frame_has_checksum(src: &[u8]) -> Option<bool> {
    const MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();
    match src {
        [a, b, c, d, descriptor, ..] if [*a, *b, *c, *d] == MAGIC => Some(descriptor & 0b100 != 0),
        _ => None,
    }
}

/// How far back the matches of the frame that starts `src` may reach, from
/// its header: the window, or for a one-segment frame its content size.
pub fn frame_window(src: &[u8]) -> Option<u64> {
    const MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();
    match src {
        [a, b, c, d, descriptor, ..] if [*a, *b, *c, *d] == MAGIC && descriptor & 0x20 != 0 => {
            first_frame_size(src)
        }
        [a, b, c, d, _, wd, ..] if [*a, *b, *c, *d] == MAGIC => {
            let base = 1u64 << (10 + (wd >> 3));
            Some(base + base / 8 * u64::from(wd & 7))
        }
        _ => None,
    }
}

/// Decodes a blob front to back straight into one fixed output region whose
/// front others may already be reading. zstd's "stable output buffer" mode:
/// the decoded bytes are its window, so there is no window buffer and no
/// copy out of one (one-shot speed), and after every step the caller learns
/// how far the output is.
pub struct DirectDecoder<'a> {
    dctx: NonNull<sys::ZSTD_DCtx>,
    src: Source<'a>,
    /// Length of the compressed stream.
    total: usize,
    consumed: usize,
    /// For [`Source::File`]: the piece read last, starting at `buf_at`.
    buf: Vec<u8>,
    buf_at: usize,
    /// For [`Source::File`]: the pieces after `buf`, read on another
    /// thread, and where the next one starts; `None` before the first
    /// piece and after a failed one.
    ahead: Option<(ReadAhead, usize)>,
    /// No read-ahead thread could be started: pieces are read by `step`.
    read_here: bool,
    out: sys::ZSTD_outBuffer,
    /// The last step that moved ended a frame (so the stream may end here).
    at_frame_end: bool,
    /// zstd's hint for the next call's input: the rest of the next block
    /// (or header) and nothing more.
    hint: usize,
    /// Reading the compressed bytes failed (not the data's fault).
    input_failed: bool,
}

/// Where a [`DirectDecoder`]'s compressed bytes come from.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    /// Bytes in memory (or in a mapping).
    Bytes(&'a [u8]),
    /// `len` bytes at `offset` of `file`, read 1 MiB at a time into a
    /// buffer of the decoder's (`zstd -d` reads its input in pieces too, not
    /// through a mapping): no page faults on the decoder's thread and no
    /// mapping to let go of behind it (each let-go is a TLB flush on every
    /// core the process runs on).
    File {
        file: &'a File,
        offset: u64,
        len: usize,
    },
}

impl Source<'_> {
    /// Length of the compressed stream.
    pub fn len(&self) -> usize {
        match self {
            Source::Bytes(b) => b.len(),
            Source::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The most a [`Source::File`] decoder reads at once.
const FILE_PIECE: usize = 1 << 20;

impl<'a> DirectDecoder<'a> {
    /// # Safety
    /// `out` must be valid for writes of `len` bytes for the decoder's life,
    /// and nobody else may write there. The decoder writes only at or past
    /// [`DirectDecoder::produced`] and reads (as its window) what it
    /// produced, so others may read the bytes before `produced()`.
    // SAFETY: `new` only stores `out`; it is unsafe for the writes that
    // `step` makes through it later, which the contract above makes sound.
    pub unsafe fn new(src: Source<'a>, out: *mut u8, len: usize) -> Result<Self, String> {
        // SAFETY: plain constructor; freed in Drop.
        let dctx =
            NonNull::new(unsafe { sys::ZSTD_createDCtx() }).ok_or("zstd decoder: out of memory")?;
        let mut me = DirectDecoder {
            dctx,
            src,
            total: src.len(),
            consumed: 0,
            buf: Vec::new(),
            buf_at: 0,
            ahead: None,
            read_here: false,
            out: sys::ZSTD_outBuffer {
                dst: out.cast(),
                size: len,
                pos: 0,
            },
            at_frame_end: true,
            hint: 1,
            input_failed: false,
        };
        // ZSTD_d_stableOutBuffer is experimental parameter 2 in zstd.h.
        me.param(sys::ZSTD_dParameter::ZSTD_d_experimentalParam2, 1)?;
        // The output is the window: a big one costs no memory of ours.
        me.param(sys::ZSTD_dParameter::ZSTD_d_windowLogMax, 31)?;
        Ok(me)
    }

    fn param(&mut self, p: sys::ZSTD_dParameter, value: i32) -> Result<(), String> {
        // SAFETY: a live context; parameters are set before decoding starts.
        let code = unsafe { sys::ZSTD_DCtx_setParameter(self.dctx.as_ptr(), p, value) };
        check(code)
            .map(drop)
            .map_err(|e| format!("zstd decoder: {e}"))
    }

    /// Decoded bytes so far.
    pub fn produced(&self) -> usize {
        self.out.pos
    }

    /// Compressed bytes consumed so far.
    pub fn consumed(&self) -> usize {
        self.consumed
    }

    /// Up to `step` compressed bytes from `consumed()` on: (address, length).
    fn next_input(&mut self, step: usize) -> Result<(*const u8, usize), String> {
        let end = self.consumed.saturating_add(step).min(self.total);
        match self.src {
            Source::Bytes(b) => {
                let chunk = &b[self.consumed..end];
                Ok((chunk.as_ptr(), chunk.len()))
            }
            Source::File { file, offset, .. } => {
                // The piece read last, until zstd has used it up.
                let have = self.buf_at..self.buf_at + self.buf.len();
                if !have.contains(&self.consumed) && self.consumed < self.total {
                    if let Err(e) = self.next_piece(file, offset) {
                        // Nothing of a failed read may pass for data later.
                        self.buf.clear();
                        // A short read is a file cut short (the mount's
                        // guard says so); anything else is the disk.
                        self.input_failed = e.kind() != std::io::ErrorKind::UnexpectedEof;
                        return Err(format!("cannot read the compressed data: {e}"));
                    }
                    self.buf_at = self.consumed;
                }
                let from = (self.consumed - self.buf_at).min(self.buf.len());
                let n = (end - self.consumed).min(self.buf.len() - from);
                Ok((self.buf[from..].as_ptr(), n))
            }
        }
    }

    /// Replaces `buf` with the piece at `consumed()`: from the read-ahead
    /// thread (started at the first piece, and again after a failed one),
    /// or read here where none could start.
    fn next_piece(&mut self, file: &File, offset: u64) -> std::io::Result<()> {
        let at = self.consumed;
        if self.ahead.as_ref().is_some_and(|(_, next)| *next != at) {
            self.ahead = None;
        }
        if self.ahead.is_none() && !self.read_here {
            self.ahead = ReadAhead::start(file, offset + at as u64, self.total - at, FILE_PIECE)
                .map(|r| (r, at));
            self.read_here = self.ahead.is_none();
        }
        let used = std::mem::take(&mut self.buf);
        let Some((ahead, next)) = &mut self.ahead else {
            self.buf = used;
            self.buf.resize(FILE_PIECE.min(self.total - at), 0);
            return file.read_exact_at(&mut self.buf, offset + at as u64);
        };
        ahead.give_back(used);
        match ahead.next() {
            Some(Ok(piece)) => {
                *next += piece.len();
                self.buf = piece;
                Ok(())
            }
            // The thread has ended: the next piece starts another.
            Some(Err(e)) => {
                self.ahead = None;
                Err(e)
            }
            None => {
                self.ahead = None;
                Err(std::io::Error::other("the read-ahead thread ended early"))
            }
        }
    }

    /// Decodes from up to `step` more compressed bytes. Fails if the stream
    /// is corrupt, ends before the output is full, or would overflow it.
    pub fn step(&mut self, step: usize) -> Result<(), String> {
        let (at, n) = self.next_input(step)?;
        let mut input = sys::ZSTD_inBuffer {
            src: at.cast(),
            size: n,
            pos: 0,
        };
        let before = self.out.pos;
        // SAFETY: a live context; `input` points into the source or into
        // `buf`, neither touched until the call returns; `out` is the
        // region the caller vouched for in `new`, unchanged since.
        let code =
            unsafe { sys::ZSTD_decompressStream(self.dctx.as_ptr(), &mut self.out, &mut input) };
        let hint = check(code).map_err(|f| f.decoding(self.out.size))?;
        self.consumed += input.pos;
        if input.pos > 0 || self.out.pos > before {
            self.at_frame_end = hint == 0;
            self.hint = hint;
            return Ok(());
        }
        // No progress.
        if self.out.pos < self.out.size && self.consumed >= self.total && self.at_frame_end {
            Err(format!(
                "zstd data decodes to only {} bytes, expected {}",
                self.out.pos, self.out.size
            ))
        } else if self.out.pos >= self.out.size && self.consumed < self.total {
            Err(format!(
                "zstd data decodes to more than the expected {} bytes",
                self.out.size
            ))
        } else {
            Err("zstd data is corrupt: truncated frame".to_string())
        }
    }

    /// Decodes on until `out` more bytes are out, the output is full or the
    /// input is used up, giving zstd at each call only the input it says
    /// the next block needs: no call produces more than one block (128 KiB),
    /// however well the data compresses (a block of zeros takes 4 bytes).
    pub fn step_output(&mut self, out: usize) -> Result<(), String> {
        let start = self.out.pos;
        while self.out.pos - start < out && self.out.pos < self.out.size {
            if self.consumed >= self.total {
                // Input used up short of the output: `step` says how
                // (it moves on if zstd still holds output, else fails).
                return self.step(1);
            }
            // After a frame's end the hint is 0: a new frame's header next.
            self.step(self.hint.max(1))?;
        }
        Ok(())
    }

    /// Whether a step failed because the compressed bytes could not be
    /// read (an I/O error), not because of what they hold.
    pub fn input_failed(&self) -> bool {
        self.input_failed
    }

    /// After the last byte: the input must be used up, ending a frame.
    pub fn finish(&mut self) -> Result<(), String> {
        while self.consumed < self.total {
            self.step(usize::MAX)?;
        }
        if self.out.pos < self.out.size || !self.at_frame_end {
            return Err(if self.at_frame_end {
                format!(
                    "zstd data decodes to only {} bytes, expected {}",
                    self.out.pos, self.out.size
                )
            } else {
                "zstd data is corrupt: truncated frame".to_string()
            });
        }
        Ok(())
    }
}

impl Drop for DirectDecoder<'_> {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once.
        unsafe { sys::ZSTD_freeDCtx(self.dctx.as_ptr()) };
    }
}

/// A zstd function's result, or its error code.
fn check(code: usize) -> Result<usize, Fault> {
    // SAFETY: a pure function of an error code.
    if unsafe { sys::ZSTD_isError(code) } != 0 {
        return Err(Fault(code));
    }
    Ok(code)
}

/// A zstd error code.
#[derive(Debug, Clone, Copy)]
struct Fault(usize);

impl Fault {
    /// The output was full before the data ended: it decodes to more
    /// than the size it was given.
    fn overflows(self) -> bool {
        // SAFETY: a pure function of an error code.
        let code = unsafe { sys::ZSTD_getErrorCode(self.0) };
        code == sys::ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall
    }

    /// The one-line message for data that failed to decode into `expected`
    /// bytes.
    fn decoding(self, expected: usize) -> String {
        if self.overflows() {
            format!("zstd data decodes to more than the expected {expected} bytes")
        } else {
            format!("zstd data is corrupt: {self}")
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(zstd_safe::get_error_name(self.0))
    }
}

/// The 8 decoded bytes that end at offset `n` (the last entry of a sparse
/// header). Streams through a small buffer, so a header that claims to be
/// large costs decoding time, which the caller bounds, but no memory.
pub fn decoded_tail8(src: &[u8], n: u64) -> Result<[u8; 8], String> {
    if n < 8 {
        return Err(format!("a sparse header of {n} bytes has no last entry"));
    }
    let mut tail = [0u8; 8];
    read_exactly(&mut decoder(src)?, n, 1 << 16, |got| {
        // Slide the last 8 bytes seen along.
        let k = got.len();
        if k >= 8 {
            tail.copy_from_slice(&got[k - 8..]);
        } else {
            tail.copy_within(k.., 0);
            tail[8 - k..].copy_from_slice(got);
        }
        Ok(())
    })?;
    Ok(tail)
}

/// Counts the decoded bytes of `src` by decoding it; `None` once past `cap`.
pub fn count_decoded(src: &[u8], cap: u64) -> Result<Option<u64>, String> {
    let mut dec = decoder(src)?;
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        match dec.read(&mut buf) {
            Ok(0) => return Ok(Some(total)),
            Ok(n) => {
                total += n as u64;
                if total > cap {
                    return Ok(None);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("zstd data is corrupt: {e}")),
        }
    }
}

fn decoder(src: &[u8]) -> Result<zstd::stream::read::Decoder<'_, &[u8]>, String> {
    zstd::stream::read::Decoder::with_buffer(src).map_err(|e| format!("zstd decoder: {e}"))
}

fn ensure_finished<R: std::io::BufRead>(
    dec: &mut zstd::stream::read::Decoder<'_, R>,
    expected: u64,
) -> Result<(), String> {
    let mut probe = [0u8; 1];
    loop {
        match dec.read(&mut probe) {
            Ok(0) => return Ok(()),
            Ok(_) => {
                return Err(format!(
                    "zstd data decodes to more than the expected {expected} bytes"
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("zstd data is corrupt: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames_of(data: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for c in data.chunks(chunk) {
            out.extend(zstd::bulk::compress(c, 3).unwrap());
        }
        out
    }

    #[test]
    fn step_output_fails_on_a_stream_cut_short_instead_of_spinning() {
        let data: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 253) as u8).collect();
        let blob = zstd::bulk::compress(&data, 3).unwrap();
        for cut in [blob.len() / 2, blob.len() - 1, 6] {
            let mut out = vec![0u8; data.len()];
            // SAFETY: `out` outlives the decoder and is not touched meanwhile.
            let mut dec = unsafe {
                DirectDecoder::new(Source::Bytes(&blob[..cut]), out.as_mut_ptr(), out.len())
            }
            .unwrap();
            let err = (0..10_000)
                .find_map(|_| dec.step_output(1 << 20).err())
                .unwrap_or_else(|| panic!("cut at {cut}: no error"));
            assert!(
                err.contains("truncated") || err.contains("only"),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn step_output_runs_past_its_goal_by_one_block_at_most() {
        // 64 MiB of zeros compress to a few bytes per 128 KiB block: any
        // fixed input step would decode megabytes at once.
        let zeros = vec![0u8; 64 << 20];
        let blob = zstd::bulk::compress(&zeros, 3).unwrap();
        let mut out = vec![1u8; zeros.len()];
        // SAFETY: `out` outlives the decoder, which is dropped before `out`
        // is read (only its length is, meanwhile).
        let mut dec =
            unsafe { DirectDecoder::new(Source::Bytes(&blob), out.as_mut_ptr(), out.len()) }
                .unwrap();
        let mut steps = 0;
        while dec.produced() < out.len() {
            let before = dec.produced();
            dec.step_output(1 << 20).unwrap();
            let made = dec.produced() - before;
            assert!(made > 0 && made <= (1 << 20) + (128 << 10), "{made}");
            steps += 1;
        }
        dec.finish().unwrap();
        assert!(steps >= 56, "{steps} steps");
        drop(dec);
        assert!(out == zeros);
    }

    #[test]
    fn max_window_walks_every_frame_without_decoded_sizes() {
        let data: Vec<u8> = (0..(6u32 << 20)).map(|i| (i % 251) as u8).collect();
        let mut blob = zstd::bulk::compress(&data[..1 << 20], 3).unwrap();
        // A skippable frame, then a frame written through a stream (no
        // decoded size in its header) with an 8 MiB window.
        blob.extend([0x50, 0x2A, 0x4D, 0x18, 3, 0, 0, 0, 1, 2, 3]);
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.set_parameter(zstd::zstd_safe::CParameter::WindowLog(23))
            .unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let streamed = enc.finish().unwrap();
        let enc_len = streamed.len();
        blob.extend(streamed);
        let mut walked = 0;
        assert_eq!(max_window(&blob, |b| walked += b.len()), Some(8 << 20));
        assert_eq!(walked, blob.len(), "every byte handed back once");
        assert_eq!(max_window(&blob[..blob.len() - 1], |_| {}), None);
        // It agrees with zstd on where frames end.
        let two = [frames_of(&data, 1 << 20), blob.clone()].concat();
        assert_eq!(max_window(&two, |_| {}), Some(8 << 20));
        assert_eq!(
            zstd_safe::find_frame_compressed_size(&blob[blob.len() - enc_len..]),
            Ok(enc_len)
        );
    }

    #[test]
    fn frame_window_reads_the_header() {
        let data: Vec<u8> = (0..(6u32 << 20)).map(|i| (i % 251) as u8).collect();
        // Level 3 on 6 MiB: a 2 MiB window, not one segment.
        assert_eq!(
            frame_window(&zstd::bulk::compress(&data, 3).unwrap()),
            Some(2 << 20)
        );
        // A window as big as the input: one segment, its content size.
        let mut c = zstd::bulk::Compressor::new(3).unwrap();
        c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(23))
            .unwrap();
        assert_eq!(frame_window(&c.compress(&data).unwrap()), Some(6 << 20));
        assert_eq!(frame_window(b"not zstd"), None);
    }

    #[test]
    fn scans_concatenated_frames() {
        let data: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let blob = frames_of(&data, 4096);
        let frames = scan_frames(&blob).unwrap().unwrap();
        assert_eq!(frames.len(), data.len().div_ceil(4096));
        assert_eq!(
            frames.last().map(|f| f.d_start + f.d_len),
            Some(data.len() as u64)
        );
        let mut out = Vec::new();
        decode_to_vec(&blob, &mut out, data.len()).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn frames_of_unequal_sizes_are_decoded_as_one_stream() {
        let data: Vec<u8> = (0..3000u32).flat_map(|i| i.to_le_bytes()).collect();
        let part = |r: std::ops::Range<usize>| zstd::bulk::compress(&data[r], 1).unwrap();
        // Equal frames, a shorter last one, skippable frames anywhere: listed.
        let skip = [0x50, 0x2A, 0x4D, 0x18, 3, 0, 0, 0, 1, 2, 3];
        let blob = [
            &skip[..],
            &part(0..4000),
            &skip,
            &part(4000..8000),
            &part(8000..12000),
        ]
        .concat();
        let frames = scan_frames(&blob).unwrap().unwrap();
        let data_frames: Vec<_> = frames.iter().filter(|f| f.d_len > 0).collect();
        assert_eq!(data_frames.len(), 3);
        assert_eq!(data_frames[1].d_start, 4000);
        let blob = [part(0..4000), part(4000..6000)].concat();
        assert_eq!(scan_frames(&blob).unwrap().map(|f| f.len()), Some(2));
        // A shorter frame before the last: its successors' places would
        // rest on what it declares. One stream.
        let blob = [part(0..3996), part(3996..8000), part(8000..12000)].concat();
        assert_eq!(scan_frames(&blob).unwrap(), None);
        assert_eq!(count_frames(&blob).unwrap(), None);
        let mut out = Vec::new();
        decode_to_vec(&blob, &mut out, data.len()).unwrap();
        assert_eq!(out, data);
        // The review's case: frame 0 claims 4 bytes fewer, frame 2 4 more,
        // the total unchanged. Listed, frame 1 would be served 4 bytes off.
        let mut f0 = part(0..4000);
        let mut f2 = part(8000..12000);
        assert_eq!(
            zstd_safe::get_frame_content_size(&f0).ok(),
            Some(Some(4000))
        );
        let fcs = |f: &mut Vec<u8>, n: u16| {
            // Frame header descriptor: 2-byte content size at byte 5 or 6.
            let at = if f[4] & 0x20 != 0 { 5 } else { 6 };
            assert_eq!(f[4] >> 6, 1, "expected a 2-byte content size field");
            f[at..at + 2].copy_from_slice(&(n - 256).to_le_bytes());
        };
        fcs(&mut f0, 3996);
        fcs(&mut f2, 4004);
        let blob = [f0, part(4000..8000), f2].concat();
        assert_eq!(scan_frames(&blob).unwrap(), None);
        assert!(decode_to_vec(&blob, &mut Vec::new(), data.len()).is_err());
    }

    #[test]
    fn too_many_frames_are_decoded_as_one_stream() {
        let one = zstd::bulk::compress(&[5u8], 1).unwrap();
        let blob = one.repeat(MAX_FRAMES);
        assert_eq!(
            scan_frames(&blob).unwrap().map(|f| f.len()),
            Some(MAX_FRAMES)
        );
        let blob = one.repeat(MAX_FRAMES + 1);
        assert_eq!(scan_frames(&blob).unwrap(), None);
        // Still counted right, by decoding.
        let n = MAX_FRAMES as u64 + 1;
        assert_eq!(count_decoded(&blob, n).unwrap(), Some(n));
        assert_eq!(count_decoded(&blob, n - 1).unwrap(), None);
    }

    #[test]
    fn tail8_is_the_eight_bytes_before_n() {
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let blob = zstd::bulk::compress(&data, 3).unwrap();
        // Around the 64 KiB buffer's edges, and a read ending 1-7 bytes in.
        for n in [8, 9, 15, 65_535, 65_536, 65_537, 65_543, 131_073, 800_000] {
            let want = &data[n - 8..n];
            assert_eq!(&decoded_tail8(&blob, n as u64).unwrap()[..], want, "n={n}");
        }
        let e = decoded_tail8(&blob, 800_001).unwrap_err();
        assert!(e.contains("decodes to only 800000 bytes"), "{e}");
        assert!(decoded_tail8(&blob, 7).is_err());
    }

    #[test]
    fn refuses_long_and_short_output() {
        let data = vec![7u8; 1000];
        let blob = zstd::bulk::compress(&data, 3).unwrap();
        let mut out = Vec::new();
        assert!(
            decode_to_vec(&blob, &mut out, 999)
                .unwrap_err()
                .contains("more than")
        );
        assert!(
            decode_to_vec(&blob, &mut out, 1001)
                .unwrap_err()
                .contains("only 1000")
        );
        assert!(
            decode_stream(&blob, 10, |_| Ok(()))
                .unwrap_err()
                .contains("more than")
        );
        assert!(decode_to_vec(b"garbage!", &mut out, 4).is_err());
    }

    /// Runs a DirectDecoder over `blob` into a buffer of `len`, stepping
    /// `step` compressed bytes at a time, from memory and from a file (where
    /// the blob sits between other bytes); both must give the same result.
    fn direct(blob: &[u8], len: usize, step: usize) -> Result<Vec<u8>, String> {
        let mut file = tempfile::tempfile().unwrap();
        let junk = vec![0x28u8; 4099];
        for part in [&junk[..], blob, &junk[..]] {
            std::io::Write::write_all(&mut file, part).unwrap();
        }
        let from_file = Source::File {
            file: &file,
            offset: junk.len() as u64,
            len: blob.len(),
        };
        let a = direct_from(Source::Bytes(blob), len, step);
        assert_eq!(a, direct_from(from_file, len, step), "memory vs file");
        a
    }

    /// Checks the output only grows and the input is used up.
    fn direct_from(src: Source<'_>, len: usize, step: usize) -> Result<Vec<u8>, String> {
        let total = src.len();
        let mut out = vec![0u8; len];
        // SAFETY: `out` outlives the decoder and is not touched meanwhile.
        let mut d = unsafe { DirectDecoder::new(src, out.as_mut_ptr(), len) }?;
        let mut last = 0;
        while d.produced() < len {
            d.step(step)?;
            assert!(d.produced() >= last);
            last = d.produced();
        }
        d.finish()?;
        assert_eq!(d.consumed(), total);
        drop(d);
        Ok(out)
    }

    #[test]
    fn direct_decoder_fills_its_region_and_checks_the_end() {
        let data: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i / 7).to_le_bytes())
            .collect();
        let n = data.len();
        for blob in [
            zstd::bulk::compress(&data, 3).unwrap(),
            frames_of(&data, 100_000),
        ] {
            for step in [1000, 65_536, usize::MAX] {
                assert_eq!(direct(&blob, n, step).unwrap(), data);
            }
            assert!(
                direct(&blob, n - 1, 4096)
                    .unwrap_err()
                    .contains("more than")
            );
            assert!(direct(&blob, n + 1, 4096).unwrap_err().contains("only"));
            let cut = &blob[..blob.len() - 10];
            assert!(direct(cut, n, 4096).unwrap_err().contains("corrupt"));
        }
        assert!(
            direct(b"not zstd at all", 10, 4)
                .unwrap_err()
                .contains("corrupt")
        );
        // A big window needs no memory of ours here, so it is accepted.
        let mut c = zstd::bulk::Compressor::new(1).unwrap();
        c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(24))
            .unwrap();
        let big: Vec<u8> = (0..(12u32 << 20) / 4)
            .flat_map(|i| (i % 1_000_003).to_le_bytes())
            .collect();
        let blob = c.compress(&big).unwrap();
        assert!(direct(&blob, big.len(), 1 << 20).unwrap() == big);
        // Steps that straddle the file source's pieces.
        assert!(direct(&blob, big.len(), 700_001).unwrap() == big);
        // A file shorter than the index says: a read error, not a hang.
        let mut file = tempfile::tempfile().unwrap();
        let half = blob.len() / 2;
        std::io::Write::write_all(&mut file, &blob[..half]).unwrap();
        let short = Source::File {
            file: &file,
            offset: 0,
            len: blob.len(),
        };
        let mut out = vec![0u8; big.len()];
        // SAFETY: `out` outlives the decoder and is not touched meanwhile.
        let mut d = unsafe { DirectDecoder::new(short, out.as_mut_ptr(), big.len()) }.unwrap();
        let err = loop {
            if let Err(e) = d.step(1 << 20) {
                break e;
            }
        };
        assert!(err.contains("cannot read the compressed data"), "{err}");
        // A failed read leaves nothing behind that passes for data: once
        // the rest is there, the decoder reads it and finishes right.
        file.write_all_at(&blob[half..], half as u64).unwrap();
        while d.produced() < big.len() {
            d.step(1 << 20).unwrap();
        }
        d.finish().unwrap();
        drop(d);
        assert!(out == big);
    }

    #[test]
    fn frame_tables_must_agree_and_each_slice_must_be_one_frame() {
        let data: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let blob = frames_of(&data, 4096);
        let scanned = scan_frames(&blob).unwrap().unwrap();
        let sizes: Vec<u64> = scanned.iter().map(|f| f.c_len).collect();
        let table = frames_from_table(4096, &sizes, blob.len() as u64, data.len() as u64).unwrap();
        assert_eq!(table, scanned);
        // Sizes that do not add up to the blob, or a wrong decoded size: no table.
        assert!(
            frames_from_table(4096, &sizes[1..], blob.len() as u64, data.len() as u64).is_none()
        );
        assert!(
            frames_from_table(4096, &sizes, blob.len() as u64, data.len() as u64 + 4096).is_none()
        );
        // A slice holding two frames is refused even if its size were right.
        let two = &blob[..(sizes[0] + sizes[1]) as usize];
        let mut out = Vec::new();
        assert!(
            decode_frame(two, &mut out, 8192)
                .unwrap_err()
                .contains("corrupt")
        );
        assert!(decode_frame(&blob[..sizes[0] as usize], &mut out, 4096).is_ok());
    }

    #[test]
    fn one_frame_is_told_with_or_without_a_declared_size() {
        let data: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let sized = zstd::bulk::compress(&data, 3).unwrap();
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let streamed = enc.finish().unwrap();
        assert_eq!(super::first_frame_size(&streamed), None, "a streamed frame");
        assert!(is_one_frame(&sized) && is_one_frame(&streamed));
        let two = [sized.clone(), streamed.clone()].concat();
        assert!(!is_one_frame(&two), "two frames");
        assert!(!is_one_frame(&sized[..sized.len() - 1]), "cut short");
        assert!(
            !is_one_frame(&[sized.as_slice(), &[0]].concat()),
            "trailing byte"
        );
        let skippable = [
            &0x184D_2A50u32.to_le_bytes()[..],
            &4u32.to_le_bytes(),
            &[0; 4],
        ]
        .concat();
        assert!(
            !is_one_frame(&skippable),
            "a skippable frame is no data frame"
        );
        assert!(!is_one_frame(&[]));
    }
}
