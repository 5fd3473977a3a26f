//! Interoperability with the real deathtensors writer (`deathtensors==0.3.0`
//! on PyPI): `tests/python/write_deathtensors.py DIR` writes plain, zstd,
//! checksummed and sharded files with every dtype its API takes, and
//! `DIR/expected.json` with what it was given. Every tensor read through our
//! pipeline (formats::open -> Data) and through a real mount must be exactly
//! those bytes.
//!
//! The interpreter is `$ZT_PYTHON`, by default `.venv/bin/python3` in the
//! crate. When it or the package is missing the test prints a note and
//! passes, except under `CI=true`, where it fails.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::Value as Json;
use support::Mount;
use ztensor_mount::formats::{self, Limits};
use ztensor_mount::mount::data::{Data, DataOptions, PROGRESSIVE_MIN};
use ztensor_mount::mount::stats::Stats;

const PACKAGE_VERSION: &str = "0.3.0";

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    match std::env::var_os("ZT_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => manifest_dir().join(".venv/bin/python3"),
    }
}

/// Why the writer cannot run, if it cannot.
fn python_problem(python: &Path) -> Option<String> {
    let out = Command::new(python)
        .args([
            "-c",
            "import importlib.metadata as m, deathtensors; print(m.version('deathtensors'))",
        ])
        .output();
    match out {
        Err(e) => Some(format!("cannot run {}: {e}", python.display())),
        Ok(o) if !o.status.success() => Some(format!(
            "{} cannot import deathtensors: {}",
            python.display(),
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("(no message)")
                .trim()
        )),
        Ok(o) => {
            let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
            (v != PACKAGE_VERSION).then(|| {
                format!(
                    "{} has deathtensors {v}, expected {PACKAGE_VERSION}",
                    python.display()
                )
            })
        }
    }
}

/// Files the writer made, and what it was given; `None` when skipped.
fn written() -> Option<(tempfile::TempDir, Json)> {
    let python = python();
    if let Some(problem) = python_problem(&python) {
        let how = "run scripts/setup.sh (it installs deathtensors==0.3.0 into .venv) \
                   or point ZT_PYTHON at an interpreter that has it";
        if support::in_ci() {
            panic!("the deathtensors interop test cannot run under CI: {problem}; {how}");
        }
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipping: the deathtensors interop test: {problem}; {how}"
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = manifest_dir().join("tests/python/write_deathtensors.py");
    let run = Command::new(&python)
        .arg(&script)
        .arg(dir.path())
        .output()
        .expect("run write_deathtensors.py");
    assert!(
        run.status.success(),
        "write_deathtensors.py failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let expected: Json =
        serde_json::from_slice(&std::fs::read(dir.path().join("expected.json")).unwrap()).unwrap();
    Some((dir, expected))
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn files(expected: &Json) -> Vec<(String, PathBuf, &Json)> {
    expected["files"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), PathBuf::from(v["path"].as_str().unwrap()), v))
        .collect()
}

#[test]
fn writer_files_read_right_through_the_data_layer() {
    let Some((dir, expected)) = written() else {
        return;
    };
    let shards = expected["shards"].as_array().unwrap().len();
    assert!(shards >= 3, "the sharded model should have several shards");
    for (kind, path, want) in files(&expected) {
        let opened = formats::open(&path, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
        let c = &opened.catalog;
        assert_eq!(c.format, "deathtensors v1");
        if kind == "sharded" {
            assert_eq!(c.sources.len(), shards + 1, "{kind}: index + shards");
            assert_eq!(c.attributes["deathtensors.sharded"], "true");
            assert!(c.sources[1..].iter().all(|s| s.digest.is_some()));
        }
        if kind.contains("checksum") {
            let (at, len) = c.sources[0].digest_span.unwrap();
            assert_eq!(
                (at, at + len),
                (24, std::fs::metadata(&path).unwrap().len() - 32)
            );
        }
        for (k, v) in want["global_metadata"].as_object().unwrap() {
            assert_eq!(&c.attributes[k], v, "{kind}: global metadata {k}");
        }
        let tensors = want["tensors"].as_array().unwrap();
        assert_eq!(c.tensors.len(), tensors.len(), "{kind}");
        let data = Data::new(
            c.clone(),
            opened.sources,
            DataOptions {
                cache_size: 16 << 20,
                cache_dir: dir.path().to_path_buf(),
                verify_raw: true,
                progressive_min: PROGRESSIVE_MIN,
            },
            Arc::new(Stats::default()),
        )
        .unwrap();
        for w in tensors {
            let name = w["name"].as_str().unwrap();
            let ti = c.tensors.iter().position(|t| t.name == name).unwrap();
            let t = &c.tensors[ti];
            assert_eq!(t.dtype, w["dtype"].as_str().unwrap(), "{kind} {name}");
            let shape: Vec<u64> = w["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(t.shape, shape, "{kind} {name}");
            assert_eq!(t.meta["metadata"], w["metadata"], "{kind} {name}");
            let bytes = hex_decode(w["data_hex"].as_str().unwrap());
            let got = data
                .read(ti, 0, 0, bytes.len() as u64 + 10)
                .unwrap_or_else(|e| panic!("{kind} {name}: {e}"))
                .to_vec();
            assert_eq!(got, bytes, "{kind} {name}");
            // A read in the middle too.
            if bytes.len() > 10 {
                let mid = data.read(ti, 0, 3, 5).unwrap().to_vec();
                assert_eq!(mid, bytes[3..8], "{kind} {name}");
            }
        }
    }
}

#[test]
fn writer_files_read_right_through_a_mount() {
    let _serial = support::serial();
    let Some((_dir, expected)) = written() else {
        return;
    };
    for (kind, path, want) in files(&expected) {
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        m.mount(&path, &[]);
        for w in want["tensors"].as_array().unwrap() {
            let name = w["name"].as_str().unwrap();
            let bytes = hex_decode(w["data_hex"].as_str().unwrap());
            assert_eq!(m.read(name), bytes, "{kind} {name} through the mount");
            let side = m.json(&format!("{name}.json"));
            assert_eq!(side["shape"], w["shape"], "{kind} {name} sidecar");
        }
        m.unmount_ok();
        m.cleanup();
    }
}
