//! zstd blobs: frame discovery (so a reader can jump to the frame it needs)
//! and decoders that never produce more or fewer bytes than the index promised.

use std::io::Read;

use zstd::zstd_safe;

/// One zstd frame inside a blob: where its compressed bytes are and which
/// range of the decoded tensor it produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub c_start: u64,
    pub c_len: u64,
    pub d_start: u64,
    pub d_len: u64,
}

/// Walks the frames of `blob`. Returns `Ok(None)` when some frame does not
/// declare its decoded size (the blob must then be decoded as one stream).
/// Cheap: it reads frame and block headers only.
pub fn scan_frames(blob: &[u8]) -> Result<Option<Vec<Frame>>, String> {
    let mut frames = Vec::new();
    let mut pos = 0usize;
    let mut d_start = 0u64;
    while pos < blob.len() {
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
            Ok(None) => return Ok(None),
            Err(_) => {
                return Err(format!(
                    "zstd data is corrupt: frame at blob byte {pos} has a bad header"
                ));
            }
        };
        frames.push(Frame {
            c_start: pos as u64,
            c_len: c_len as u64,
            d_start,
            d_len,
        });
        d_start = d_start
            .checked_add(d_len)
            .ok_or_else(|| "zstd frames declare more than 2^64 bytes".to_string())?;
        pos += c_len;
    }
    Ok(Some(frames))
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
    if n < 2 || frame_size == 0 || sizes.contains(&0) {
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
    let n = DCTX.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot =
                Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd decoder: {e}"))?);
        }
        let Some(dctx) = slot.as_mut() else {
            return Err("zstd decoder unavailable".to_string());
        };
        // The destination's capacity is the declared size: a stream that
        // would decode to more fails here instead of growing the buffer.
        dctx.decompress_to_buffer(src, out).map_err(|e| {
            if e.to_string().contains("too small") {
                format!("zstd data decodes to more than the expected {expected} bytes")
            } else {
                format!("zstd data is corrupt: {e}")
            }
        })
    })?;
    if n != expected || out.len() != expected {
        return Err(format!(
            "zstd data decodes to only {n} bytes, expected {expected}"
        ));
    }
    Ok(())
}

thread_local! {
    /// One decompression context per thread, reused across calls.
    static DCTX: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Decodes `src` (one or more frames) filling `out` exactly.
pub fn decode_into(src: &[u8], out: &mut [u8]) -> Result<(), String> {
    let mut v = Vec::new();
    decode_to_vec(src, &mut v, out.len())?;
    out.copy_from_slice(&v);
    Ok(())
}

/// Decodes `src` in chunks handed to `sink`, failing as soon as the output
/// would pass `expected` bytes and if it ends short of it.
pub fn decode_stream(
    src: &[u8],
    expected: u64,
    sink: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    decode_stream_from(src, expected, sink)
}

/// [`decode_stream`] over compressed bytes read through `src`.
pub fn decode_stream_from<R: std::io::BufRead>(
    src: R,
    expected: u64,
    mut sink: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let mut dec =
        zstd::stream::read::Decoder::with_buffer(src).map_err(|e| format!("zstd decoder: {e}"))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < expected {
        let want = (expected - done).min(buf.len() as u64) as usize;
        match dec.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(format!(
                    "zstd data decodes to only {done} bytes, expected {expected}"
                ));
            }
            Ok(n) => {
                sink(&buf[..n])?;
                done += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("zstd data is corrupt: {e}")),
        }
    }
    ensure_finished(&mut dec, expected)
}

/// Decodes only the first `n` bytes (for reading a sparse header).
/// The buffer grows with the decoded data, so a header that merely claims
/// to be large costs no memory.
pub fn decode_prefix(src: &[u8], n: usize) -> Result<Vec<u8>, String> {
    let dec = decoder(src)?;
    let mut out = Vec::new();
    dec.take(n as u64)
        .read_to_end(&mut out)
        .map_err(|e| format!("zstd data is corrupt: {e}"))?;
    if out.len() < n {
        return Err(format!(
            "zstd data decodes to only {} bytes, needed {n}",
            out.len()
        ));
    }
    Ok(out)
}

/// Counts the decoded bytes of `src`, giving up past `cap`.
pub fn decoded_len(src: &[u8], cap: u64) -> Result<u64, String> {
    if let Some(frames) = scan_frames(src)? {
        return Ok(frames.last().map_or(0, |f| f.d_start + f.d_len));
    }
    let mut dec = decoder(src)?;
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        match dec.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => {
                total += n as u64;
                if total > cap {
                    return Err(format!("zstd data decodes to more than {cap} bytes"));
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
    fn scans_concatenated_frames() {
        let data: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let blob = frames_of(&data, 4096);
        let frames = scan_frames(&blob).unwrap().unwrap();
        assert_eq!(frames.len(), data.len().div_ceil(4096));
        assert_eq!(
            frames.last().map(|f| f.d_start + f.d_len),
            Some(data.len() as u64)
        );
        let mut out = vec![0u8; data.len()];
        decode_into(&blob, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn refuses_long_and_short_output() {
        let data = vec![7u8; 1000];
        let blob = zstd::bulk::compress(&data, 3).unwrap();
        let mut short = vec![0u8; 999];
        assert!(
            decode_into(&blob, &mut short)
                .unwrap_err()
                .contains("more than")
        );
        let mut long = vec![0u8; 1001];
        assert!(
            decode_into(&blob, &mut long)
                .unwrap_err()
                .contains("only 1000")
        );
        assert!(
            decode_stream(&blob, 10, |_| Ok(()))
                .unwrap_err()
                .contains("more than")
        );
        assert!(decode_into(b"garbage!", &mut [0u8; 4]).is_err());
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
}
