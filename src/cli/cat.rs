//! `ztensor-mount cat FILE.zt TENSOR [--part PART]`: a tensor's exposed
//! little-endian bytes on stdout, for hosts without FUSE.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use crate::format::{Encoding, ZtFile, expose, zstd_blob};

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
        (Encoding::Raw, _) => {
            let blob = zt.blob(t);
            let mut off = 0;
            while off < part.nbytes {
                let chunk = expose::from_blob(blob, part, t.endian, off, 1 << 20);
                w(&mut out, &chunk)?;
                off += chunk.len() as u64;
            }
        }
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
