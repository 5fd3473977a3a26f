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

use std::path::PathBuf;

use serde_json::Value as Json;
use support::Mount;
use support::data::{hex_decode, json_shape, serve, tensor_index};
use support::python::{self, Python};
use ztensor_mount::formats::{self, Limits, Opened};

const PACKAGE_VERSION: &str = "0.3.0";

/// Files the writer made, and what it was given; `None` when skipped.
fn written() -> Option<(tempfile::TempDir, Json)> {
    let python = Python::from_env().require(
        "Python with deathtensors==0.3.0 (run scripts/setup.sh, which installs it \
         into .venv, or point ZT_PYTHON at an interpreter that has it)",
        "import importlib.metadata as m, deathtensors; print(m.version('deathtensors'))",
        |v| python::version_is("deathtensors", PACKAGE_VERSION, v),
    )?;
    Some(python.write_into_tempdir("write_deathtensors.py"))
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
        let data = serve(
            Opened {
                catalog: c.clone(),
                sources: opened.sources,
            },
            dir.path(),
            16 << 20,
        );
        for w in tensors {
            let name = w["name"].as_str().unwrap();
            let ti = tensor_index(c, name);
            let t = &c.tensors[ti];
            assert_eq!(t.dtype, w["dtype"].as_str().unwrap(), "{kind} {name}");
            let shape = json_shape(&w["shape"]);
            assert_eq!(t.shape, shape, "{kind} {name}");
            assert_eq!(t.meta.to_map()["metadata"], w["metadata"], "{kind} {name}");
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
