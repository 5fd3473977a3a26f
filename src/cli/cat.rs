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
        out.write_all(b).map_err(|e| format!("stdout: {e}"))
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
        (Encoding::Zstd, _) if let PartMap::Contiguous { start } = part.map => {
            let es = part.dtype.size() as usize;
            let swap = t.endian == Endian::Big && es > 1;
            let end = start.saturating_add(part.nbytes);
            let (mut pos, mut carry) = (0u64, Vec::new());
            zstd_blob::decode_stream(zt.blob(t), layout.decoded_size, |c| {
                let at = pos;
                pos += c.len() as u64;
                let lo = start.saturating_sub(at).min(c.len() as u64) as usize;
                let hi = end.saturating_sub(at).min(c.len() as u64) as usize;
                if lo >= hi {
                    return Ok(());
                }
                if !swap {
                    return w(&mut out, &c[lo..hi]);
                }
                // Elements may straddle chunks: keep the partial one.
                carry.extend_from_slice(&c[lo..hi]);
                let whole = carry.len() / es * es;
                swap_elements(&mut carry[..whole], es);
                w(&mut out, &carry[..whole])?;
                carry.drain(..whole);
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
        // transpose: decoded whole. Their size was found by decoding them at
        // open, at most 1 GiB per file.
        _ => {
            let blob = zt.decoded(t).map_err(|e| e.to_string())?;
            w(
                &mut out,
                &expose::from_blob(&blob, part, t.endian, 0, part.nbytes),
            )?;
        }
    }
    out.flush().map_err(|e| format!("stdout: {e}"))
}
