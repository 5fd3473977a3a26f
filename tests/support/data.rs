//! Reading an opened file through the mount's data layer, and the byte
//! helpers the tests compare what they read with.

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use ztensor_mount::catalog::Catalog;
use ztensor_mount::formats::Opened;
use ztensor_mount::serve::data::{Data, DataOptions, PROGRESSIVE_MIN};
use ztensor_mount::serve::stats::Stats;

/// The mount's data layer over `opened` (checks on raw blobs on), its
/// cache of `cache_size` bytes in `cache_dir`.
pub fn serve(opened: Opened, cache_dir: &Path, cache_size: u64) -> Arc<Data> {
    let opts = DataOptions {
        cache_size,
        cache_dir: cache_dir.to_path_buf(),
        verify_raw: true,
        progressive_min: PROGRESSIVE_MIN,
    };
    Data::new(
        opened.catalog,
        opened.sources,
        opts,
        Arc::new(Stats::default()),
    )
    .expect("data layer")
}

/// All exposed bytes of part `p` of tensor `t`, read through `Data` in
/// chunks of `chunk` bytes; why not when the part is unsupported, a read
/// fails or ends early.
pub fn read_whole(d: &Data, t: usize, p: usize, chunk: u64) -> Result<Vec<u8>, String> {
    let parts = d.catalog().tensors[t]
        .parts
        .as_ref()
        .map_err(|e| e.clone())?;
    let n = parts[p].nbytes;
    let mut out = Vec::with_capacity(n as usize);
    while (out.len() as u64) < n {
        let b = d
            .read(t, p, out.len() as u64, chunk)
            .map_err(|e| e.to_string())?;
        if b.is_empty() {
            return Err(format!("ended at byte {} of {n}", out.len()));
        }
        out.extend_from_slice(&b);
    }
    Ok(out)
}

/// The index of tensor `name`; panics when there is none.
pub fn tensor_index(c: &Catalog, name: &str) -> usize {
    c.tensors
        .iter()
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name:?}"))
}

/// Bytes from lowercase or uppercase hex.
pub fn hex_decode(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd-length hex {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// Lowercase hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The SHA-256 of `b`, in lowercase hex.
pub fn sha256_hex(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

/// A JSON list of dimensions (a `shape` in an `expected.json`).
pub fn json_shape(v: &serde_json::Value) -> Vec<u64> {
    let dims = v
        .as_array()
        .unwrap_or_else(|| panic!("shape {v} is not a list"));
    dims.iter()
        .map(|d| {
            d.as_u64()
                .unwrap_or_else(|| panic!("shape {v}: {d} is not a dimension"))
        })
        .collect()
}

/// Garbles the contents of a compressed block in the middle of tensor
/// `ti`'s zstd blob, leaving the block headers whole (a damaged header
/// would be found before any byte is served, by the walk over the headers).
pub fn garble_middle_block(zt: &std::path::Path, ti: usize) {
    let (off, size) = {
        let f = ztensor_mount::formats::zt_v01::ZtFile::open(zt).unwrap();
        let t = &f.catalog().tensors[ti];
        (t.offset, t.size)
    };
    let bytes = std::fs::read(zt).unwrap();
    let (at, len) = compressed_block_near(&bytes[off as usize..(off + size) as usize], size / 2);
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(zt).unwrap();
    file.write_all_at(&vec![0xA5; len - 8], off + at + 8)
        .unwrap();
}

/// (offset, length) of the contents of the first compressed block at or
/// past `from` in a one-frame zstd blob.
pub fn compressed_block_near(blob: &[u8], from: u64) -> (u64, usize) {
    let fhd = blob[4];
    let single_segment = (fhd >> 5) & 1 == 1;
    let dict_id = [0, 1, 2, 4][(fhd & 3) as usize];
    let fcs = match fhd >> 6 {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let mut pos = 5 + usize::from(!single_segment) + dict_id + fcs;
    loop {
        let h = u32::from_le_bytes([blob[pos], blob[pos + 1], blob[pos + 2], 0]);
        let (last, kind, size) = (h & 1 == 1, (h >> 1) & 3, (h >> 3) as usize);
        let content = if kind == 1 { 1 } else { size };
        if kind == 2 && pos as u64 >= from && size > 64 {
            return ((pos + 3) as u64, size);
        }
        assert!(!last, "no compressed block past {from}");
        pos += 3 + content;
    }
}
