//! Interoperability with the real zTensor v1 writer, the Python package
//! `ztensor` 1.x (1.2.3): `tests/python/write_zt1.py DIR` writes `DIR/all.zt`
//! with it and `DIR/all.zt.expected.json` (per tensor: name, format, dtype,
//! numpy_dtype, shape, and per part the little-endian bytes and the sha256
//! of the package's own read-back). Our reader must give exactly those bytes.
//!
//! The venv is `$ZT_VENV`, by default `.venv` in the crate: its
//! `bin/python3` runs with `PYTHONPATH=$ZT_VENV/ztensor/1` (where the 1.x
//! package is installed beside the venv's 0.1.4). When Python or the
//! package is missing the test prints a note and passes, except under
//! `CI=true`, where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use ztensor_mount::catalog::{Codec, Endian};
use ztensor_mount::formats::{self, Limits, Opened};

fn venv() -> PathBuf {
    match std::env::var_os("ZT_VENV") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"),
    }
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

fn python_cmd(venv: &Path) -> Command {
    let mut c = Command::new(venv.join("bin/python3"));
    c.env("PYTHONPATH", venv.join("ztensor/1"));
    c
}

/// Why the Python side cannot run, if it cannot.
fn python_problem(venv: &Path) -> Option<String> {
    let probe = python_cmd(venv)
        .args([
            "-c",
            "import importlib.metadata as m, ztensor, numpy, ml_dtypes; \
             assert hasattr(ztensor, 'Tensor'), 'not ztensor 1.x'; \
             print(m.version('ztensor'))",
        ])
        .output();
    match probe {
        Err(e) => Some(format!("cannot run {}/bin/python3: {e}", venv.display())),
        Ok(out) if !out.status.success() => Some(format!(
            "{}/bin/python3 cannot import ztensor 1.x/numpy/ml_dtypes: {}",
            venv.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("(no message)")
                .trim()
        )),
        Ok(out) => {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (!version.starts_with("1.")).then(|| format!("ztensor {version} is not 1.x"))
        }
    }
}

/// Writes the files with the package, or says why it cannot (and panics
/// under CI).
pub fn write_with_python(dir: &Path) -> Option<(PathBuf, Json)> {
    let venv = venv();
    if let Some(problem) = python_problem(&venv) {
        let how = "point ZT_VENV at a venv with numpy, ml_dtypes, zstandard and \
                   ztensor 1.x installed under ZT_VENV/ztensor/1";
        if in_ci() {
            panic!("zTensor v1 interop cannot run under CI: {problem}; {how}");
        }
        eprintln!("skipping: {problem}; {how}");
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/write_zt1.py");
    let out = python_cmd(&venv)
        .arg(&script)
        .arg(dir)
        .output()
        .expect("run write_zt1.py");
    assert!(
        out.status.success(),
        "write_zt1.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = dir.join("all.zt");
    let expected: Json = serde_json::from_slice(
        &std::fs::read(dir.join("all.zt.expected.json")).expect("expected json"),
    )
    .expect("expected json parses");
    Some((file, expected))
}

fn hex_decode(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd-length hex {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A part's bytes straight from the catalog: the blob's stored bytes,
/// decoded with the zstd crate (independent of the mount's data layer).
fn bytes_by_catalog(opened: &Opened, t: usize, p: usize) -> Vec<u8> {
    let cat = &opened.catalog;
    let part = &cat.tensors[t].parts.as_ref().expect("supported")[p];
    let blob = &cat.blobs[part.blob];
    let src = opened.sources[blob.source].as_ref().expect("source");
    let stored = &src.bytes()[blob.offset as usize..(blob.offset + blob.len) as usize];
    let decoded = match blob.codec {
        Codec::Raw => stored.to_vec(),
        Codec::Zstd { .. } => zstd::stream::decode_all(stored).expect("zstd"),
    };
    assert_eq!(decoded.len() as u64, blob.decoded_len);
    assert_eq!(part.order, Endian::Little);
    decoded
}

#[test]
fn python_package_v1_files_read_right() {
    let dir = tempfile::tempdir().unwrap();
    let Some((file, expected)) = write_with_python(dir.path()) else {
        return;
    };
    let opened = formats::open(&file, Limits::default()).expect("our reader opens it");
    let cat = &opened.catalog;
    assert_eq!(cat.format, "zTensor v1");
    assert_eq!(cat.attributes["version"], "1.2.0");
    let tensors = expected["tensors"].as_array().unwrap();
    assert_eq!(cat.tensors.len(), tensors.len());
    let mut parts_checked = 0;
    for want in tensors {
        let name = want["name"].as_str().unwrap();
        let ti = cat
            .tensors
            .iter()
            .position(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        let t = &cat.tensors[ti];
        assert_eq!(t.layout, want["format"].as_str().unwrap(), "{name}");
        assert_eq!(t.dtype, want["dtype"].as_str().unwrap(), "{name}");
        let shape: Vec<u64> = serde_json::from_value(want["shape"].clone()).unwrap();
        assert_eq!(t.shape, shape, "{name}");
        assert_eq!(t.directory, want["format"] != "dense", "{name}");
        let parts = t.parts.as_ref().unwrap_or_else(|e| panic!("{name}: {e}"));
        let wparts = want["parts"].as_array().unwrap();
        assert_eq!(parts.len(), wparts.len(), "{name}");
        for (pi, wp) in wparts.iter().enumerate() {
            let p = &parts[pi];
            assert_eq!(p.name, wp["name"].as_str().unwrap(), "{name}");
            let pshape: Vec<u64> = serde_json::from_value(wp["shape"].clone()).unwrap();
            assert_eq!(p.shape, pshape, "{name}/{}", p.name);
            if let Some(np) = want["numpy_dtype"].as_str() {
                assert_eq!(p.dtype.numpy(), np, "{name}");
            }
            let bytes = hex_decode(wp["hex"].as_str().unwrap());
            assert_eq!(p.nbytes, bytes.len() as u64, "{name}/{}", p.name);
            let got = bytes_by_catalog(&opened, ti, pi);
            assert!(got == bytes, "{name}/{}: bytes differ", p.name);
            assert_eq!(sha256_hex(&got), wp["sha256"].as_str().unwrap());
            parts_checked += 1;
        }
    }
    assert!(parts_checked >= 79, "only {parts_checked} parts checked");
}
