//! `ztensor-mount cat FILE TENSOR [--part PART]`: a tensor's exposed
//! little-endian bytes on stdout, for hosts without FUSE. Reads through the
//! mount's own data layer, so it serves every format and checks every
//! digest exactly as a mount does.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use crate::formats::{self, Limits};
use crate::serve::data::{Data, DataOptions, PROGRESSIVE_MIN};
use crate::serve::stats::Stats;

/// Bytes asked of the data layer at a time.
const CHUNK: u64 = 1 << 20;

/// cat reads one tensor in order: a few frames in memory are all it needs.
/// A blob decoded as one piece that is bigger than half of this is decoded
/// into a temporary file (`$TMPDIR`), as a mount does under `--cache-dir`.
const CACHE: u64 = 64 << 20;

pub fn run(
    path: &Path,
    name: &str,
    part: Option<&str>,
    remote: &crate::source::RemoteOptions,
) -> ExitCode {
    match cat(path, name, part, remote) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ztensor-mount: {}", super::one_line(e));
            ExitCode::from(1)
        }
    }
}

fn cat(
    path: &Path,
    name: &str,
    part_name: Option<&str>,
    remote: &crate::source::RemoteOptions,
) -> Result<(), String> {
    let opened = formats::open_arg(&path.to_string_lossy(), Limits::default(), remote)
        .map_err(|e| e.to_string())?;
    let label = opened.catalog.label.clone();
    let ti = find(&opened.catalog, name).ok_or_else(|| {
        // A URL's query is shown as `?…` (it may be a signature), which
        // would not run as given.
        let hint = match label.contains("?…") {
            true => "`ztensor-mount info` of the same URL lists them".to_string(),
            false => format!("`ztensor-mount info {label}` lists them"),
        };
        format!("{label}: no tensor named {name:?} ({hint})")
    })?;
    let name = opened.catalog.tensors[ti].name.clone();
    let name = name.as_str();
    let t = &opened.catalog.tensors[ti];
    let parts = t
        .parts
        .as_ref()
        .map_err(|why| format!("{label}: tensor {name:?}: {why}"))?;
    let pi = match part_name {
        None if parts.len() == 1 => 0,
        None => {
            let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
            return Err(format!(
                "{label}: tensor {name:?} has parts; choose --part {}",
                names.join("|")
            ));
        }
        Some(p) => parts
            .iter()
            .position(|x| x.name == p)
            .ok_or_else(|| format!("{label}: tensor {name:?} has no part {p:?}"))?,
    };
    let nbytes = parts[pi].nbytes;
    // Reads ahead of this tensor's bytes stop at their end: nothing past
    // it will be read, and the process ends with whatever is in flight.
    if let Some(blob) = opened.catalog.blobs.get(parts[pi].blob)
        && let Some(Some(source)) = opened.sources.get(blob.source)
    {
        source.read_ahead_until(blob.offset.saturating_add(blob.len));
    }
    let opts = DataOptions {
        cache_size: CACHE,
        cache_dir: std::env::temp_dir(),
        verify_raw: true,
        progressive_min: PROGRESSIVE_MIN,
    };
    let data = Data::new(
        opened.catalog,
        opened.sources,
        opts,
        Arc::new(Stats::default()),
    )
    .map_err(|e| format!("{label}: {e}"))?;
    let mut out = std::io::stdout().lock();
    let mut off = 0;
    while off < nbytes {
        let chunk = data.read(ti, pi, off, CHUNK).map_err(|e| e.to_string())?;
        if chunk.is_empty() {
            return Err(format!(
                "{label}: tensor {name:?}: ended at byte {off} of {nbytes}"
            ));
        }
        if let Err(e) = out.write_all(&chunk) {
            return stdout_failed(e, &label, name);
        }
        off += chunk.len() as u64;
    }
    out.flush().or_else(|e| stdout_failed(e, &label, name))
}

/// Tensor `name`: by its name in the file, else by the name as `info`
/// prints it (control characters as `%0A`, a NUL as `%00`), so that a name
/// no command line can hold is reached.
fn find(c: &crate::catalog::Catalog, name: &str) -> Option<usize> {
    let by = |f: &dyn Fn(&str) -> bool| c.tensors.iter().position(|t| f(&t.name));
    by(&|n| n == name).or_else(|| by(&|n| crate::mount::tree::printable(n) == name))
}

/// A failed write to stdout: a closed pipe (`| head`) is the reader's
/// choice, and ends the output without an error; anything else is one.
fn stdout_failed(e: std::io::Error, label: &str, name: &str) -> Result<(), String> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return Ok(());
    }
    Err(format!("{label}: tensor {name:?}: writing stdout: {e}"))
}
