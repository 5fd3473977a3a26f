//! Shared by the zTensor v2 tests: reading a part's bytes straight from an
//! `Opened` catalog (the blob's frames decoded, its checks applied), and
//! the reference reader's bytes for the same part. A test file that
//! includes it also has `mod support;`.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use ztensor_mount::serve::data::Data;

use ztensor_mount::catalog::{Check, Codec, FrameTable, PartMap, Verdict};
use ztensor_mount::formats::{self, Limits, Opened};

pub fn open(path: &Path) -> ztensor_mount::error::Result<Opened> {
    formats::open(path, Limits::default())
}

/// The exposed bytes of part `p` of tensor `t`, from the catalog alone.
pub fn catalog_bytes(o: &Opened, t: usize, p: usize) -> Result<Vec<u8>, String> {
    let tensor = &o.catalog.tensors[t];
    let parts = tensor.parts.as_ref().map_err(|e| e.clone())?;
    let part = &parts[p];
    let blob = &o.catalog.blobs[part.blob];
    let src = o.sources[blob.source]
        .as_ref()
        .ok_or_else(|| format!("source {} unusable", blob.source))?;
    let stored = src
        .bytes()
        .get(blob.offset as usize..(blob.offset + blob.len) as usize)
        .ok_or("blob outside its source")?;
    let decoded = match &blob.codec {
        Codec::Raw => stored.to_vec(),
        Codec::Zstd {
            frames: Some(FrameTable::Listed(frames)),
        } => {
            let mut out = Vec::new();
            let mut at = 0usize;
            for &(c, d) in frames {
                let mut buf = Vec::new();
                ztensor_mount::codec::zstd::decode_frame(
                    &stored[at..at + c as usize],
                    &mut buf,
                    d as usize,
                )?;
                out.extend_from_slice(&buf);
                at += c as usize;
            }
            out
        }
        other => return Err(format!("unexpected codec {other:?}")),
    };
    if decoded.len() as u64 != blob.decoded_len {
        return Err("wrong decoded length".into());
    }
    for check in &blob.checks {
        match check {
            Check::Decoded(sum) | Check::Stored(sum) => match sum.verify(&decoded) {
                Verdict::Verified => {}
                v => return Err(format!("digest: {v:?}")),
            },
            Check::BoolBytes => {
                if decoded.iter().any(|&b| b > 1) {
                    return Err("bool byte not 0/1".into());
                }
            }
            Check::ZeroLastNibble => {
                if decoded.last().is_some_and(|b| b & 0xf0 != 0) {
                    return Err("odd f4 nibble not zero".into());
                }
            }
            Check::BoolBytesIn { start, len } => {
                let range = decoded.get(*start as usize..(start + len) as usize);
                if range.is_none_or(|r| r.iter().any(|&b| b > 1)) {
                    return Err("bool byte not 0/1".into());
                }
            }
        }
    }
    let PartMap::Contiguous { start } = part.map else {
        return Err("not contiguous".into());
    };
    Ok(decoded[start as usize..(start + part.nbytes) as usize].to_vec())
}

/// What the `ztensor` 2.1 reference gives for a part (trusted files only:
/// it allocates the decoded length up front).
pub fn reference_bytes(path: &Path, tensor: &str, part: &str) -> Result<Vec<u8>, String> {
    let src = ztensor2::Source::open(path).map_err(|e| e.to_string())?;
    let t = src.tensor(tensor).map_err(|e| e.to_string())?;
    let p = t.part(part).map_err(|e| e.to_string())?;
    p.verify().map_err(|e| e.to_string())?;
    Ok(p.bytes().map_err(|e| e.to_string())?.into_owned())
}

/// The v2 part name of one of our parts ("" is a dense tensor's "data").
pub fn v2_part_name(name: &str) -> &str {
    if name.is_empty() { "data" } else { name }
}

/// For a file whose shards are absent (the reference will not open it):
/// a raw local part's bytes where the reference's own manifest parse puts
/// them.
pub fn reference_local_raw(path: &Path, tensor: &str, part: &str) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let m = ztensor2::format::validate::image(&bytes, &ztensor2::Vocabulary::standard())
        .map_err(|e| e.to_string())?
        .ok_or("a data shard")?;
    let p = m.part(tensor, part).map_err(|e| e.to_string())?;
    if p.blob.shard.is_some() || p.encoding.is_some() {
        return Err("not a raw local part".into());
    }
    let (o, l) = (p.blob.offset as usize, p.blob.length as usize);
    Ok(bytes[o..o + l].to_vec())
}

/// The mount's data layer over an opened file (checks on raw blobs on).
pub fn data(o: Opened) -> Arc<Data> {
    crate::support::data::serve(o, &std::env::temp_dir(), 64 << 20)
}
