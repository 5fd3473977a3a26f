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

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use support::data::{hex, hex_decode, json_shape, read_whole, serve, sha256_hex, tensor_index};
use support::python::{self, Python};
use ztensor_mount::catalog::{Codec, Endian};
use ztensor_mount::formats::{self, Limits, Opened};

/// The venv's Python with ztensor 1.x; `None` when the test is skipped.
fn python() -> Option<Python> {
    Python::ztensor(1).require(
        "Python with numpy, ml_dtypes, zstandard and ztensor 1.x (point ZT_VENV \
         at a venv with ztensor 1.x installed under ZT_VENV/ztensor/1)",
        "import importlib.metadata as m, ztensor, numpy, ml_dtypes; \
         assert hasattr(ztensor, 'Tensor'), 'not ztensor 1.x'; \
         print(m.version('ztensor'))",
        |v| {
            v.starts_with("1.")
                .then_some(())
                .ok_or_else(|| format!("ztensor {v} is not 1.x"))
        },
    )
}

/// Writes the files with the package; `None` when the test is skipped.
fn write_with_python(dir: &Path) -> Option<(PathBuf, Json)> {
    let python = python()?;
    python.run_script("write_zt1.py", dir);
    let expected = python::read_json(&dir.join("all.zt.expected.json"));
    Some((dir.join("all.zt"), expected))
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
        Codec::Computed(_) => panic!("a v1 blob is raw or zstd"),
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
        let ti = tensor_index(cat, name);
        let t = &cat.tensors[ti];
        assert_eq!(t.layout, want["format"].as_str().unwrap(), "{name}");
        assert_eq!(t.dtype, want["dtype"].as_str().unwrap(), "{name}");
        let shape = json_shape(&want["shape"]);
        assert_eq!(t.shape, shape, "{name}");
        assert_eq!(t.directory, want["format"] != "dense", "{name}");
        let parts = t.parts.as_ref().unwrap_or_else(|e| panic!("{name}: {e}"));
        let wparts = want["parts"].as_array().unwrap();
        assert_eq!(parts.len(), wparts.len(), "{name}");
        for (pi, wp) in wparts.iter().enumerate() {
            let p = &parts[pi];
            assert_eq!(p.name, wp["name"].as_str().unwrap(), "{name}");
            let pshape = json_shape(&wp["shape"]);
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

/// (tensor name, part name, path relative to the mount, expected bytes,
/// package read-back sha256).
fn expected_files(expected: &Json) -> Vec<(String, String, String, Vec<u8>, String)> {
    let mut out = Vec::new();
    for want in expected["tensors"].as_array().unwrap() {
        let name = want["name"].as_str().unwrap();
        for wp in want["parts"].as_array().unwrap() {
            let part = wp["name"].as_str().unwrap();
            let rel = if part.is_empty() {
                name.to_string()
            } else {
                format!("{name}/{part}")
            };
            out.push((
                name.to_string(),
                part.to_string(),
                rel,
                hex_decode(wp["hex"].as_str().unwrap()),
                wp["sha256"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

#[test]
fn python_package_v1_files_read_right_through_the_data_layer() {
    let dir = tempfile::tempdir().unwrap();
    let Some((file, expected)) = write_with_python(dir.path()) else {
        return;
    };
    let opened = formats::open(&file, Limits::default()).expect("our reader opens it");
    let data = serve(opened, dir.path(), 64 << 20);
    let cat = data.catalog();
    let mut n = 0;
    for (name, part, _, bytes, sha) in expected_files(&expected) {
        let ti = tensor_index(cat, &name);
        let parts = cat.tensors[ti].parts.as_ref().unwrap();
        let pi = parts.iter().position(|p| p.name == part).unwrap();
        let got = read_whole(&data, ti, pi, 1000).unwrap_or_else(|e| panic!("read failed: {e}"));
        assert!(got == bytes, "{name}/{part}: bytes differ");
        assert_eq!(sha256_hex(&got), sha, "{name}/{part}");
        n += 1;
    }
    assert_eq!(n, 79);
}

/// numpy reads each mounted file with its sidecar's `numpy_dtype` and
/// `shape` and gets the expected elements.
const NUMPY_CHECK: &str = r#"
import json, sys
import numpy as np
spec = json.load(open(sys.argv[1]))
bad = []
for c in spec:
    sc = json.load(open(c["sidecar"]))
    a = np.fromfile(c["path"], dtype=np.dtype(sc["numpy_dtype"])).reshape(sc["shape"])
    if list(a.shape) != c["shape"]:
        bad.append((c["path"], "shape", list(a.shape), c["shape"]))
    if a.tobytes() != bytes.fromhex(c["hex"]):
        bad.append((c["path"], "bytes differ"))
if bad:
    sys.exit("numpy disagrees: %r" % bad)
print("numpy ok", len(spec))
"#;

#[test]
fn python_package_v1_files_mount_and_numpy_reads_them() {
    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("py");
    std::fs::create_dir_all(&dir).unwrap();
    let Some((file, expected)) = write_with_python(&dir) else {
        return;
    };
    m.mount(&file, &[]);
    let mut spec = Vec::new();
    let shapes: std::collections::HashMap<(String, String), Json> = expected["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| {
            t["parts"].as_array().unwrap().iter().map(move |p| {
                (
                    (
                        t["name"].as_str().unwrap().to_string(),
                        p["name"].as_str().unwrap().to_string(),
                    ),
                    p["shape"].clone(),
                )
            })
        })
        .collect();
    for (name, part, rel, bytes, sha) in expected_files(&expected) {
        let got = m.read(&rel);
        assert_eq!(sha256_hex(&got), sha, "{rel}");
        assert!(got == bytes, "{rel}: bytes differ");
        let sidecar = m.json(&format!("{rel}.json"));
        assert_eq!(sidecar["nbytes"], bytes.len() as u64, "{rel}");
        if part.is_empty() {
            assert_eq!(sidecar["format"], "zTensor v1");
        }
        spec.push(serde_json::json!({
            "path": m.path(&rel),
            "sidecar": m.path(&format!("{rel}.json")),
            "shape": shapes[&(name, part)],
            "hex": hex(&bytes),
        }));
    }
    let spec_path = m.scratch_path("numpy_spec.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec).unwrap()).unwrap();
    let out = Python::ztensor(1)
        .cmd()
        .arg("-c")
        .arg(NUMPY_CHECK)
        .arg(&spec_path)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("numpy ok {}", spec.len())
    );
    m.unmount_ok();
}
