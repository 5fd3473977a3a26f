//! The foreign formats, written by their own writers (`tests/python/formats/`),
//! read back through the pipeline (`formats::open` + the data layer) and
//! through a real mount: every tensor is the bytes the writer was given.
//!
//! The interpreter is `$ZT_PYTHON` (default `.venv/bin/python3`) with numpy,
//! safetensors, gguf, onnx and h5py (`scripts/setup.sh`). Without them the
//! test prints a note and passes, except under `CI=true`, where it fails.

mod support;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value as Json;
use support::data::{serve, sha256_hex};
use support::python::Python;
use ztensor_mount::formats::{self, Limits};
use ztensor_mount::serve::data::Data;

/// Runs `write_<writer>.py` into a fresh directory; `None`: skipped.
fn written(writer: &str) -> Option<(tempfile::TempDir, Json)> {
    let python = Python::from_env().require(
        "Python with the format writers (scripts/setup.sh)",
        "import numpy, safetensors, gguf, onnx, h5py",
        |_| Ok(()),
    )?;
    Some(python.write_into_tempdir(&format!("formats/write_{writer}.py")))
}

/// Every expected tensor of `file`, through the pipeline.
fn check_pipeline(path: &Path, want: &Json, format: &str) -> Arc<Data> {
    let opened = formats::open(path, Limits::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(opened.catalog.format, format);
    let scratch = tempfile::tempdir().unwrap();
    let data = serve(opened, scratch.path(), 64 << 20);
    let cat = data.catalog();
    let want = want.as_object().unwrap();
    assert_eq!(cat.len(), want.len(), "{}: tensor count", path.display());
    for (name, w) in want {
        let ti = cat
            .tensors
            .iter()
            .position(|t| &t.name == name)
            .unwrap_or_else(|| panic!("{}: no tensor {name}", path.display()));
        let t = &cat.tensors[ti];
        let parts = t.parts.as_ref().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(parts.len(), 1, "{name}");
        let p = &parts[0];
        assert_eq!(p.dtype.name(), w["dtype"], "{name}: dtype");
        assert_eq!(Json::from(p.shape.clone()), w["shape"], "{name}: shape");
        let bytes = data.read(ti, 0, 0, p.nbytes + 10).unwrap();
        assert_eq!(bytes.len() as u64, p.nbytes, "{name}");
        assert_eq!(
            sha256_hex(&bytes),
            w["sha256"],
            "{}: {name}: bytes",
            path.display()
        );
        if let Some(ls) = w.get("logical_shape") {
            assert_eq!(Json::from(t.shape.clone()), *ls, "{name}: logical shape");
            assert_eq!(t.meta.to_map()["ggml_type"], w["ggml_type"], "{name}");
            assert!(
                t.meta.to_map()["block_bytes"].as_u64().unwrap() > 0,
                "{name}"
            );
            assert!(
                t.meta.to_map()["block_elements"].as_u64().unwrap() > 0,
                "{name}"
            );
        }
    }
    data
}

/// The same through a real mount: each tensor file's bytes and sidecar.
fn check_mount(path: &Path, want: &Json) -> Option<Json> {
    let mut m = support::Mount::scratch()?;
    m.mount(path, &[]);
    let index = m.index();
    // The safetensors view says which framework's layout it holds, as
    // loaders ask (transformers refuses metadata without `format`).
    let view = m.read(".safetensors/model.safetensors");
    let n = u64::from_le_bytes(view[..8].try_into().unwrap()) as usize;
    let header: Json = serde_json::from_slice(&view[8..8 + n]).unwrap();
    let format = &header["__metadata__"]["format"];
    let said = match index["format"].as_str() {
        Some(f) if f.starts_with("safetensors") => {
            index["attributes"]["format"].as_str().unwrap_or("pt")
        }
        _ => "pt",
    };
    assert_eq!(format, said, "{}", path.display());
    let by_name: std::collections::HashMap<&str, &Json> = index["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t))
        .collect();
    for (name, w) in want.as_object().unwrap() {
        let side = by_name[name.as_str()];
        let rel = side["path"].as_str().unwrap();
        assert_eq!(side["dtype"], w["dtype"], "{name}");
        assert_eq!(side["supported"], true, "{name}");
        let bytes = m.read(rel);
        assert_eq!(
            sha256_hex(&bytes),
            w["sha256"],
            "mounted {}: {name}",
            path.display()
        );
        let sidecar = m.json(&format!("{rel}.json"));
        assert_eq!(sidecar["numpy_dtype"], side["numpy_dtype"], "{name}");
        // `np.fromfile(path, numpy_dtype).reshape(shape)` holds for every
        // file; a quantized tensor's logical shape is apart, and it is in
        // no view (its file holds blocks, not elements).
        assert_eq!(sidecar["shape"], w["shape"], "{name}");
        let elems: u64 = w["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .product();
        let width: u64 = sidecar["numpy_dtype"].as_str().unwrap()[2..]
            .parse()
            .unwrap();
        assert_eq!(elems * width, bytes.len() as u64, "{name}: {sidecar}");
        if let Some(ls) = w.get("logical_shape") {
            assert_eq!(sidecar["logical_shape"], *ls, "{name}");
            assert_eq!(sidecar.get("views"), None, "{name}: {sidecar}");
            let view = m.read(".safetensors/model.safetensors");
            let n = u64::from_le_bytes(view[..8].try_into().unwrap()) as usize;
            let header: Json = serde_json::from_slice(&view[8..8 + n]).unwrap();
            assert_eq!(header.get(name.as_str()), None, "{name}: {header}");
            let omitted = header["__metadata__"]["ztensor_mount.omitted"]
                .as_str()
                .unwrap();
            assert!(omitted.contains(name.as_str()), "{name}: {omitted}");
        } else {
            assert_eq!(sidecar.get("logical_shape"), None, "{name}");
        }
    }
    m.unmount_ok();
    Some(index)
}

#[test]
fn safetensors_plain_and_sharded() {
    let Some((dir, exp)) = written("safetensors") else {
        return;
    };
    let plain = dir.path().join("plain.safetensors");
    let d = check_pipeline(&plain, &exp["plain.safetensors"], "safetensors");
    assert_eq!(d.catalog().attributes["who"], "test");
    assert_eq!(d.catalog().get("bool").unwrap().dtype, "BOOL");
    // The set by its directory and by its index.
    let set = dir.path().join("sharded");
    check_pipeline(&set, &exp["sharded"], "safetensors (sharded)");
    let index = set.join("model.safetensors.index.json");
    let d = check_pipeline(&index, &exp["sharded"], "safetensors (sharded)");
    assert_eq!(d.catalog().sources.len(), 3);
    // What every shard's metadata says alike is the set's.
    assert_eq!(d.catalog().attributes["format"], "np");
    if let Some(ix) = check_mount(&plain, &exp["plain.safetensors"]) {
        assert_eq!(ix["attributes"]["format"], "np");
        check_mount(&set, &exp["sharded"]);
        // A Hugging Face cache: a snapshot's files are links into a folder
        // of blobs named otherwise. The shards are those beside the link.
        let hub = dir.path().join("hub");
        let (blobs, snap) = (hub.join("blobs"), hub.join("snapshots/rev"));
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::create_dir_all(&snap).unwrap();
        for (i, e) in std::fs::read_dir(&set).unwrap().enumerate() {
            let e = e.unwrap();
            std::fs::copy(e.path(), blobs.join(format!("{i}"))).unwrap();
            std::os::unix::fs::symlink(format!("../../blobs/{i}"), snap.join(e.file_name()))
                .unwrap();
        }
        check_mount(&snap.join("model.safetensors.index.json"), &exp["sharded"]);
    }
    // An index that leaves a tensor out, and puts another in a shard that
    // does not hold it: the first is listed after the rest and served, the
    // second served from the shard that holds it, as loaders that read
    // each shard whole find it.
    let idx: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    let map = idx["weight_map"].as_object().unwrap();
    let mut names: Vec<&String> = map.keys().collect();
    names.sort();
    let (left_out, moved) = (names[0].clone(), names[1].clone());
    let (from, to) = (map[&moved].as_str().unwrap().to_string(), {
        let other = map.values().find(|f| *f != &map[&moved]).unwrap();
        other.as_str().unwrap().to_string()
    });
    let mut edited = idx.clone();
    let wm = edited["weight_map"].as_object_mut().unwrap();
    wm.remove(&left_out);
    wm.insert(moved.clone(), to.clone().into());
    let odd = dir.path().join("odd");
    std::fs::create_dir(&odd).unwrap();
    for e in std::fs::read_dir(&set).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), odd.join(e.file_name())).unwrap();
    }
    let odd_index = odd.join("model.safetensors.index.json");
    std::fs::write(&odd_index, serde_json::to_vec(&edited).unwrap()).unwrap();
    let opened = formats::open(&odd_index, Limits::default()).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let data = serve(opened, scratch.path(), 64 << 20);
    let cat = data.catalog();
    let read = |name: &str| {
        let ti = cat.tensors.iter().position(|t| t.name == name).unwrap();
        (
            data.read(ti, 0, 0, 1 << 20).map(|b| b.to_vec()),
            &cat.tensors[ti],
        )
    };
    let (bytes, t) = read(&left_out);
    assert_eq!(
        sha256_hex(&bytes.unwrap()),
        exp["sharded"][&left_out]["sha256"]
    );
    assert_eq!(t.meta.to_map()["in_index"], false);
    let (got, t) = read(&moved);
    assert_eq!(sha256_hex(&got.unwrap()), exp["sharded"][&moved]["sha256"]);
    let meta = t.meta.to_map();
    assert_eq!(
        (&meta["shard"], &meta["index_shard"]),
        (&from.clone().into(), &to.clone().into())
    );
    assert_eq!(meta.get("in_index"), None);
    assert!(cat.get(&format!("{moved} (duplicate in {from})")).is_none());
    assert_eq!(cat.len(), 14);
    // A missing shard: its tensors fail with the reason, the rest serve.
    let gone = set.join("model-00002-of-00003.safetensors");
    std::fs::remove_file(&gone).unwrap();
    let opened = formats::open(&set, Limits::default()).unwrap();
    assert!(opened.sources[1].is_none());
    let scratch = tempfile::tempdir().unwrap();
    let data = serve(opened, scratch.path(), 64 << 20);
    let cat = data.catalog();
    let mut failed = 0;
    for (ti, t) in cat.tensors.iter().enumerate() {
        let meta = t.meta.to_map();
        let shard = meta["shard"].as_str().unwrap();
        if shard == "model-00002-of-00003.safetensors" {
            let why = t.parts.as_ref().unwrap_err();
            assert!(why.contains("model-00002-of-00003"), "{why}");
            failed += 1;
        } else {
            let bytes = data.read(ti, 0, 0, 1 << 20).unwrap();
            assert_eq!(
                sha256_hex(&bytes),
                exp["sharded"][&t.name]["sha256"],
                "{}",
                t.name
            );
        }
    }
    assert!(failed > 0);
    assert_eq!(cat.len(), 14);
}

#[test]
fn gguf_plain_quantized_and_split() {
    let Some((dir, exp)) = written("gguf") else {
        return;
    };
    let file = dir.path().join("model.gguf");
    let d = check_pipeline(&file, &exp["model.gguf"], "GGUF");
    let attrs = &d.catalog().attributes;
    assert_eq!(
        attrs["tokenizer.ggml.tokens"].as_array().unwrap().len(),
        50000
    );
    assert_eq!(attrs["test.i32"], -7);
    assert_eq!(attrs["test.str"], "hello");
    assert_eq!(d.catalog().get("w_q4_0").unwrap().dtype, "Q4_0");
    let first = dir.path().join("split/m-00001-of-00003.gguf");
    let d = check_pipeline(&first, &exp["split"], "GGUF (split)");
    assert_eq!(d.catalog().sources.len(), 3);
    if let Some(ix) = check_mount(&file, &exp["model.gguf"]) {
        assert_eq!(ix["attributes"]["tokenizer.ggml.tokens"][49999], "tok49999");
        check_mount(&first, &exp["split"]);
    }
    // A later split file alone is refused, naming the first.
    let second = dir.path().join("split/m-00002-of-00003.gguf");
    let err = formats::open(&second, Limits::default()).err().unwrap();
    assert!(err.to_string().contains("mount the first one"), "{err}");
    // A big-endian file is named so, not taken for a broken one.
    let big = dir.path().join("big_endian.gguf");
    let err = formats::open(&big, Limits::default()).err().unwrap();
    assert!(
        err.to_string()
            .contains("a big-endian GGUF file (version 3); only little-endian GGUF is read"),
        "{err}"
    );
}

#[test]
fn npz_stored_and_deflated() {
    let Some((dir, exp)) = written("npz") else {
        return;
    };
    for f in ["stored.npz", "deflated.npz"] {
        let path = dir.path().join(f);
        check_pipeline(&path, &exp[f], "npz");
        check_mount(&path, &exp[f]);
    }
}

#[test]
fn onnx_initializers_found_by_content() {
    let Some((dir, exp)) = written("onnx") else {
        return;
    };
    let path = dir.path().join("model.bin");
    check_pipeline(&path, &exp["model.bin"], "ONNX");
    check_mount(&path, &exp["model.bin"]);
}

/// h5py's file (contiguous, chunked, deflated and shuffled datasets, one
/// in a group), read by our own HDF5 reader (`src/formats/hdf5/`; the full
/// checks are in `tests/format_hdf5.rs`).
#[test]
fn hdf5_from_h5py() {
    let Some((dir, exp)) = written("hdf5") else {
        return;
    };
    let path = dir.path().join("data.h5");
    check_pipeline(&path, &exp["data.h5"], "HDF5");
    check_mount(&path, &exp["data.h5"]);
}
