//! Interoperability with the real Python writer, the `ztensor` 2.x package:
//! `tests/python/write_zt2.py DIR` writes v2 files with every dtype and
//! logical type it offers, raw and `zt.zstd-seekable/1`, sparse and
//! quantized profiles and an appended generation, plus `expected.json`
//! (each part's little-endian bytes and the package's own read-back
//! sha256). We read every part through `formats::open` + `serve::data::Data`
//! and then through a real mount (the file with the sidecar's
//! `numpy_dtype`/`shape`, `np.fromfile` and sha256 in Python).
//!
//! The environment is `$ZT_VENV` (default `<crate>/.venv`, which
//! `scripts/setup.sh` creates): `$ZT_VENV/bin/python3` with numpy and
//! ml_dtypes, and the package at `$ZT_VENV/ztensor/2`. In a worktree with
//! no `.venv`, run with `ZT_VENV=/path/to/main/.venv`. When it is missing
//! the test prints a note and passes, except under `CI=true`, where it
//! fails.

#[path = "zt_v2/read.rs"]
mod read;
mod support;

use serde_json::Value as Json;
use support::data::{hex, json_shape, sha256_hex};
use support::python::Python;

/// The venv's Python with ztensor 2.x; `None` when the test is skipped.
fn python() -> Option<Python> {
    Python::ztensor(2).require(
        "the Python ztensor 2.x package with numpy and ml_dtypes (ZT_VENV)",
        "import ztensor, numpy, ml_dtypes; ztensor.Writer",
        |_| Ok(()),
    )
}

/// Writes the files, or `None` when the test is skipped.
fn written() -> Option<(tempfile::TempDir, Json)> {
    Some(python()?.write_into_tempdir("write_zt2.py"))
}

#[test]
fn python_written_v2_files_read_the_same_through_our_pipeline() {
    let Some((dir, expected)) = written() else {
        return;
    };
    let mut checked = 0;
    for (file, entries) in expected.as_object().unwrap() {
        let path = dir.path().join(file);
        let o = read::open(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(o.catalog.format, "zTensor v2");
        let data = read::data(o);
        let c = data.catalog();
        for e in entries.as_array().unwrap() {
            let name = e["name"].as_str().unwrap();
            let ti = c
                .tensors
                .iter()
                .position(|t| t.name == name)
                .unwrap_or_else(|| panic!("{file}: no {name}"));
            let t = &c.tensors[ti];
            let parts = t
                .parts
                .as_ref()
                .unwrap_or_else(|w| panic!("{file}: {name}: {w}"));
            let pi = match e["part"].as_str() {
                None => 0,
                Some(p) => parts.iter().position(|x| x.name == p).unwrap(),
            };
            let got = support::data::read_whole(&data, ti, pi, 1 << 16)
                .unwrap_or_else(|w| panic!("{file}: {name}: {w}"));
            assert_eq!(
                hex(&got),
                e["hex"].as_str().unwrap(),
                "{file}: {name} {:?}",
                e["part"]
            );
            assert_eq!(
                sha256_hex(&got),
                e["sha256"].as_str().unwrap(),
                "{file}: {name}"
            );
            let shape = json_shape(&e["shape"]);
            if e["part"].is_null() {
                assert_eq!(t.shape, shape, "{file}: {name}");
                assert_eq!(t.dtype, e["dtype"].as_str().unwrap(), "{file}: {name}");
            } else {
                assert_eq!(parts[pi].shape, shape, "{file}: {name} {:?}", e["part"]);
            }
            checked += 1;
        }
        if file == "zstd.zt" {
            let big = c.get("t_big").unwrap();
            assert_eq!(big.encoding, "zt.zstd-seekable/1");
        }
    }
    assert!(checked >= 60, "only {checked} parts checked");
}

#[test]
fn python_written_v2_files_read_the_same_through_a_real_mount() {
    let Some((dir, expected)) = written() else {
        return;
    };
    let _serial = support::serial();
    for (file, entries) in expected.as_object().unwrap() {
        let Some(mut m) = support::Mount::scratch() else {
            return;
        };
        m.mount(&dir.path().join(file), &[]);
        // One Python run per file: read each exposed file with numpy as its
        // sidecar says, and hash what it read.
        let mut jobs = Vec::new();
        for e in entries.as_array().unwrap() {
            let name = e["name"].as_str().unwrap();
            let (data, side) = match e["part"].as_str() {
                None => (m.path(name), m.path(&format!("{name}.json"))),
                Some(p) => (
                    m.path(&format!("{name}/{p}")),
                    m.path(&format!("{name}/{p}.json")),
                ),
            };
            let sidecar: Json = serde_json::from_slice(
                &std::fs::read(&side).unwrap_or_else(|err| panic!("{}: {err}", side.display())),
            )
            .unwrap();
            jobs.push(serde_json::json!({
                "path": data, "dtype": sidecar["numpy_dtype"], "shape": sidecar["shape"],
                "sha256": e["sha256"], "name": name,
            }));
        }
        let script = r#"
import hashlib, json, sys
import numpy as np
bad = []
for j in json.load(sys.stdin):
    a = np.fromfile(j["path"], dtype=j["dtype"])
    raw = open(j["path"], "rb").read()
    if hashlib.sha256(a.tobytes()).hexdigest() != j["sha256"] or a.tobytes() != raw:
        bad.append(j["name"])
print(json.dumps(bad))
"#;
        let mut child = Python::ztensor(2)
            .cmd()
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(serde_json::to_string(&jobs).unwrap().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "[]",
            "{file}: mismatched tensors"
        );
        m.unmount_ok();
    }
}
