//! `ztensor-mount cat FILE.zt TENSOR [--part PART]`: a tensor's exposed
//! little-endian bytes on stdout, for hosts without FUSE.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use crate::format::catalog::PartMap;
use crate::format::dtype::swap_elements;
use crate::format::{Encoding, Endian, ZtFile, expose, zstd_blob};

pub fn run(path: &Path, name: &str, part: Option<&str>) -> ExitCode {
    match cat(path, name, part) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.contains("Broken pipe") => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ztensor-mount: {e}");
            ExitCode::from(1)
        }
    }
}

fn cat(path: &Path, name: &str, part_name: Option<&str>) -> Result<(), String> {
    let zt = ZtFile::open(path).map_err(|e| e.to_string())?;
    let label = zt.label().to_string();
    let t = zt
        .catalog()
        .get(name)
        .ok_or_else(|| format!("{label}: no tensor named {name:?}"))?;
    let layout = t
        .layout
        .as_ref()
        .map_err(|why| format!("{label}: tensor {name:?}: {why}"))?;
    let part = match part_name {
        None if layout.parts.len() == 1 => &layout.parts[0],
        None => {
            let names: Vec<&str> = layout.parts.iter().map(|p| p.name).collect();
            return Err(format!(
                "{label}: tensor {name:?} is sparse; choose --part {}",
                names.join("|")
            ));
        }
        Some(p) => layout
            .parts
            .iter()
            .find(|x| x.name == p)
            .ok_or_else(|| format!("{label}: tensor {name:?} has no part {p:?}"))?,
    };
    zt.check(t).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let w = |out: &mut std::io::StdoutLock, b: &[u8]| {
        out.write_all(b)
            .map_err(|e| format!("{label}: tensor {name:?}: writing stdout: {e}"))
    };
    let direct = expose::direct_range(part, t.endian, 0, part.nbytes);
    match (layout.encoding, direct) {
        // Streams: memory stays at one chunk whatever the tensor size.
        (Encoding::Zstd, Some((0, n))) if n == layout.decoded_size => {
            zstd_blob::decode_stream(zt.blob(t), layout.decoded_size, |c| w(&mut out, c))
                .map_err(|why| format!("{label}: tensor {name:?}: {why}"))?;
        }
        // Any other run of elements in a zstd blob (big-endian, or a part of
        // a sparse tensor): streamed too, swapped on the way out.
        (Encoding::Zstd, _) if matches!(part.map, PartMap::Contiguous { .. }) => {
            let start = part.source_of(0);
            let end = start.saturating_add(part.nbytes);
            let mut swap = Swapper::new(part.dtype.size() as usize, t.endian);
            let mut pos = 0u64;
            zstd_blob::decode_stream(zt.blob(t), layout.decoded_size, |c| {
                let at = pos;
                pos += c.len() as u64;
                let lo = start.saturating_sub(at).min(c.len() as u64) as usize;
                let hi = end.saturating_sub(at).min(c.len() as u64) as usize;
                if lo < hi {
                    swap.push(&c[lo..hi], |b| w(&mut out, b))?;
                }
                Ok(())
            })
            .map_err(|why| format!("{label}: tensor {name:?}: {why}"))?;
        }
        (Encoding::Raw, _) => {
            let blob = zt.blob(t);
            let mut off = 0;
            while off < part.nbytes {
                let chunk = expose::from_blob(blob, part, t.endian, off, 1 << 20);
                w(&mut out, &chunk)?;
                off += chunk.len() as u64;
            }
        }
        // The reference crate's COO records, whose index part is their
        // transpose: decoded whole, so only up to a bound (frames that
        // declare their sizes can declare any size; the mount reads such a
        // tensor a span of records at a time instead).
        _ => {
            if layout.decoded_size > WHOLE_MAX {
                return Err(format!(
                    "{label}: tensor {name:?}: its records are {} bytes decoded; cat decodes this form whole, at most {WHOLE_MAX} bytes (read it through the mount)",
                    layout.decoded_size
                ));
            }
            let blob = zt.decoded(t).map_err(|e| e.to_string())?;
            w(
                &mut out,
                &expose::from_blob(&blob, part, t.endian, 0, part.nbytes),
            )?;
        }
    }
    out.flush()
        .map_err(|e| format!("{label}: tensor {name:?}: writing stdout: {e}"))
}

/// Most decoded bytes `cat` holds at once, for the one form it decodes
/// whole.
const WHOLE_MAX: u64 = 1 << 30;

/// Little-endian elements out of a stream of chunks that may split them.
struct Swapper {
    es: usize,
    swap: bool,
    carry: Vec<u8>,
}

impl Swapper {
    fn new(es: usize, endian: Endian) -> Swapper {
        Swapper {
            es,
            swap: endian == Endian::Big && es > 1,
            carry: Vec::new(),
        }
    }

    /// Hands `out` the whole elements so far, keeping a partial one back.
    fn push<E>(
        &mut self,
        bytes: &[u8],
        mut out: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.swap {
            return out(bytes);
        }
        self.carry.extend_from_slice(bytes);
        let whole = self.carry.len() / self.es * self.es;
        swap_elements(&mut self.carry[..whole], self.es);
        out(&self.carry[..whole])?;
        self.carry.drain(..whole);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_split_across_chunks_come_out_whole_and_swapped() {
        let elems: Vec<u64> = (0..1000u64)
            .map(|i| i.wrapping_mul(0x0102_0304_0506_0708))
            .collect();
        let be: Vec<u8> = elems.iter().flat_map(|v| v.to_be_bytes()).collect();
        let le: Vec<u8> = elems.iter().flat_map(|v| v.to_le_bytes()).collect();
        for chunk in [1, 3, 7, 8, 13, 64, 999] {
            let mut s = Swapper::new(8, Endian::Big);
            let mut got = Vec::new();
            for c in be.chunks(chunk) {
                s.push(c, |b| -> Result<(), ()> {
                    assert_eq!(b.len() % 8, 0, "a partial element went out");
                    got.extend_from_slice(b);
                    Ok(())
                })
                .unwrap();
            }
            assert!(got == le, "chunks of {chunk}");
        }
    }
}
