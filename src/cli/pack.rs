//! `ztensor-mount pack OUT.zt NAME=PATH.npy[:DTYPE] ...`

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::npy;
use crate::catalog::dtype::swap_elements;
use crate::catalog::{Algorithm, DType, Endian};
use crate::formats::zt_v01::writer::{Compression, DEFAULT_FRAME_SIZE, Options, Writer};

pub struct PackArgs {
    pub out: PathBuf,
    pub inputs: Vec<String>,
    pub zstd: Option<i32>,
    pub frame_size: Option<u64>,
    pub checksum: Option<Algorithm>,
    pub big_endian: bool,
    /// Replace an existing output file.
    pub force: bool,
}

/// Why a pack failed: the command line (exit 2) or the work (exit 1).
enum Failure {
    Usage(String),
    Failed(String),
}

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure::Failed(s)
    }
}

pub fn run(a: PackArgs) -> ExitCode {
    match pack(&a) {
        Ok(n) => {
            let noun = if n == 1 { "tensor" } else { "tensors" };
            eprintln!("wrote {} ({n} {noun})", a.out.display());
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(e)) => {
            eprintln!("ztensor-mount pack: {}", super::one_line(e));
            ExitCode::from(2)
        }
        Err(Failure::Failed(e)) => {
            eprintln!("ztensor-mount pack: {}", super::one_line(e));
            ExitCode::from(1)
        }
    }
}

fn tmp_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

/// Removes the half-written file unless the pack got to its rename, also
/// when it ends by a panic.
struct Partial(Option<PathBuf>);

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn pack(a: &PackArgs) -> Result<usize, Failure> {
    // The command line first, before anything is written.
    let mut specs = Vec::with_capacity(a.inputs.len());
    for spec in &a.inputs {
        match spec.split_once('=') {
            Some((name, rest)) if !name.is_empty() => specs.push((name, rest)),
            _ => {
                return Err(Failure::Usage(format!(
                    "{spec:?}: expected NAME=PATH.npy (the tensor's name, '=', the .npy file)"
                )));
            }
        }
    }
    if !a.force && std::fs::symlink_metadata(&a.out).is_ok() {
        return Err(Failure::Usage(format!(
            "{} exists; pass --force to replace it",
            a.out.display()
        )));
    }
    let tmp = tmp_path(&a.out);
    let mut w = Writer::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut partial = Partial(Some(tmp.clone()));
    let opts = Options {
        compression: match a.zstd {
            None => Compression::Raw,
            Some(level) => Compression::Zstd {
                level,
                frame_size: a.frame_size.map_or(DEFAULT_FRAME_SIZE, |f| f as usize),
            },
        },
        endian: if a.big_endian {
            Endian::Big
        } else {
            Endian::Little
        },
        checksum: a.checksum,
        custom: Vec::new(),
    };
    for (name, rest) in specs {
        let (path, dtype_override) = match rest.rsplit_once(':') {
            Some((p, d)) if DType::from_v01_name(d).is_some() => (p, DType::from_v01_name(d)),
            // A relabel by a name zTensor v0.1 has not, rather than a file
            // whose name holds a ':'.
            Some((p, d)) if !Path::new(rest).exists() && Path::new(p).exists() => {
                let names: Vec<&str> = DType::V01.iter().map(|t| t.name()).collect();
                return Err(format!(
                    "{rest}: {d:?} is not a zTensor v0.1 dtype (one of {})",
                    names.join(", ")
                )
                .into());
            }
            _ => (rest, None),
        };
        let arr = npy::open(Path::new(path))?;
        let dtype = match dtype_override {
            Some(d) if d.size() != arr.dtype.size() => {
                return Err(format!("{path}: cannot read {} elements as {d}", arr.dtype).into());
            }
            Some(d) => d,
            None => arr.dtype,
        };
        let mut input: Box<dyn Read> = match arr.endian {
            Endian::Little => Box::new(arr.reader),
            Endian::Big => Box::new(SwapReader {
                inner: arr.reader,
                elem: dtype.size() as usize,
                pending: Vec::new(),
            }),
        };
        w.add_from(name, dtype, &arr.shape, &mut input, &opts)
            .map_err(|e| format!("{path}: {e}"))?;
    }
    w.finish().map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    partial.0 = None;
    Ok(a.inputs.len())
}

/// Turns big-endian elements into little-endian ones while reading.
struct SwapReader<R> {
    inner: R,
    elem: usize,
    pending: Vec<u8>,
}

impl<R: Read> Read for SwapReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pending.is_empty() {
            let mut chunk = vec![0u8; (buf.len().max(self.elem) / self.elem) * self.elem];
            let mut filled = 0;
            while filled < chunk.len() {
                let n = self.inner.read(&mut chunk[filled..])?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            chunk.truncate(filled - filled % self.elem);
            swap_elements(&mut chunk, self.elem);
            self.pending = chunk;
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }
}
