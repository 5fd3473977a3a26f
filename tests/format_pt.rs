//! PyTorch `.pt` files written by torch itself (`tests/fixtures/pt/`, made
//! by `scripts/make_pt_fixtures.py`; see the README there): every tensor
//! is the bytes torch holds, through the data layer and through a real
//! mount, with the dtype and shape torch gives. Strided tensors and
//! tensors sharing a storage read right; the legacy format is refused in
//! one line. The expected bytes are files beside the fixtures, so no torch
//! is needed here.

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use support::Mount;
use support::data::{read_whole, serve, sha256_hex, tensor_index};
use ztensor_mount::formats::{self, Limits};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt")
}

fn manifest() -> Json {
    let text = std::fs::read(fixtures().join("manifest.json")).expect("manifest.json");
    serde_json::from_slice(&text).expect("manifest is JSON")
}

/// The fixtures the reader must read: every one but the legacy file.
fn readable() -> Vec<(String, Json)> {
    manifest()["files"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(f, _)| *f != "legacy.pt")
        .map(|(f, w)| (f.clone(), w["tensors"].clone()))
        .collect()
}

/// What torch holds for `name` of `file`, made contiguous.
fn expected(file: &str, name: &str) -> Vec<u8> {
    let stem = file.trim_end_matches(".pt");
    std::fs::read(fixtures().join(stem).join(format!("{name}.bin")))
        .unwrap_or_else(|e| panic!("{stem}/{name}.bin: {e}"))
}

/// The numpy dtype the sidecar must name for a torch dtype.
fn numpy_dtype(torch: &str) -> &'static str {
    match torch {
        "torch.float64" => "<f8",
        "torch.float32" => "<f4",
        "torch.float16" => "<f2",
        // numpy has no bfloat16 or float8: the bits, the sidecar says how.
        "torch.bfloat16" => "<u2",
        "torch.int64" => "<i8",
        "torch.int32" => "<i4",
        "torch.int16" => "<i2",
        "torch.int8" => "|i1",
        "torch.uint64" => "<u8",
        "torch.uint32" => "<u4",
        "torch.uint16" => "<u2",
        "torch.uint8" => "|u1",
        "torch.bool" => "|b1",
        "torch.complex64" => "<c8",
        "torch.complex128" => "<c16",
        "torch.float8_e4m3fn" | "torch.float8_e5m2" => "|u1",
        other => panic!("no numpy dtype listed for {other}"),
    }
}

#[test]
fn every_tensor_torch_wrote_reads_through_the_data_layer() {
    let mut checked = 0;
    let mut strided = 0;
    for (file, want) in readable() {
        let path = fixtures().join(&file);
        let opened = formats::open(&path, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opened.catalog.format, "PyTorch .pt", "{file}");
        let scratch = tempfile::tempdir().unwrap();
        let data = serve(opened, scratch.path(), 16 << 20);
        let cat = data.catalog();
        let want = want.as_object().unwrap();
        assert_eq!(cat.len(), want.len(), "{file}: tensor count");
        for (name, w) in want {
            let ti = tensor_index(cat, name);
            let t = &cat.tensors[ti];
            assert_eq!(t.dtype, w["dtype"], "{file}: {name}: dtype");
            assert_eq!(
                Json::from(t.shape.clone()),
                w["shape"],
                "{file}: {name}: shape"
            );
            let contiguous = w["contiguous"].as_bool().unwrap();
            let parts = match &t.parts {
                Ok(p) => p,
                // Only a strided tensor may be refused, and then saying so.
                Err(why) if !contiguous => {
                    assert!(why.contains("strided"), "{file}: {name}: {why}");
                    continue;
                }
                Err(why) => panic!("{file}: {name} refused: {why}"),
            };
            let p = &parts[0];
            assert_eq!(p.nbytes, w["nbytes"].as_u64().unwrap(), "{file}: {name}");
            assert_eq!(p.dtype.numpy(), numpy_dtype(w["dtype"].as_str().unwrap()));
            // In odd chunks, so reads start inside elements.
            let got = read_whole(&data, ti, 0, 7).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got, expected(&file, name), "{file}: {name}: bytes");
            assert_eq!(sha256_hex(&got), w["sha256"], "{file}: {name}");
            checked += 1;
            strided += usize::from(!contiguous);
        }
    }
    // dtypes 21, shared 4, strided 4, module 5.
    assert_eq!(checked, 34);
    assert_eq!(strided, 3, "the strided tensors are gathered, not refused");
}

#[test]
fn names_follow_the_saved_order_and_nesting() {
    let path = fixtures().join("dtypes.pt");
    let opened = formats::open(&path, Limits::default()).unwrap();
    let names: Vec<&str> = opened
        .catalog
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    // The dict's insertion order, nested keys joined with '.'.
    assert_eq!(&names[..3], ["f32", "f16", "bf16"]);
    assert!(names.contains(&"model.layers.0.weight"), "{names:?}");
    let tail = &names[names.len() - 2..];
    assert_eq!(tail, ["model.layers.0.weight", "model.layers.1.bias"]);

    let module = formats::open(&fixtures().join("module.pt"), Limits::default()).unwrap();
    let names: Vec<&str> = module
        .catalog
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["0.weight", "1.weight", "1.bias", "2.weight", "2.bias"]
    );
}

#[test]
fn views_of_one_storage_share_it_and_read_their_own_elements() {
    let opened = formats::open(&fixtures().join("shared.pt"), Limits::default()).unwrap();
    let cat = &opened.catalog;
    let storage = |n: &str| cat.get(n).unwrap().meta.to_map()["storage"].clone();
    assert_eq!(storage("base"), storage("rows"));
    assert_eq!(storage("base"), storage("last"));
    // Tied: the same tensor object twice, a memo reference in the pickle.
    assert_eq!(storage("base"), storage("tied"));
    assert_eq!(cat.get("tied").unwrap().shape, [6, 4]);
    assert_eq!(
        cat.get("tied").unwrap().meta.to_map()["offset"],
        cat.get("base").unwrap().meta.to_map()["offset"]
    );
    assert_eq!(cat.get("rows").unwrap().meta.to_map()["storage_offset"], 8);
    assert_eq!(cat.get("last").unwrap().meta.to_map()["storage_offset"], 20);
    let m = manifest();
    assert_eq!(
        m["files"]["shared.pt"]["tensors"]["rows"]["storage_offset"],
        8
    );
}

#[test]
fn the_legacy_format_is_refused_in_one_line() {
    let path = fixtures().join("legacy.pt");
    let e = formats::open(&path, Limits::default())
        .err()
        .expect("refused");
    let line = e.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert!(line.starts_with(&path.display().to_string()), "{line}");
    assert!(line.contains("legacy format"), "{line}");
    assert!(line.contains("_use_new_zipfile_serialization"), "{line}");
}

/// A copy of dtypes.pt whose bool tensor holds a 2: that tensor fails its
/// reads, the others still read.
#[test]
fn a_bool_byte_that_is_not_0_or_1_fails_that_tensor_only() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("dtypes.pt");
    let opened = formats::open(&src, Limits::default()).unwrap();
    let at = opened.catalog.get("bool").unwrap().meta.to_map()["offset"]
        .as_u64()
        .unwrap();
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[at as usize + 1] = 2;
    let path = dir.path().join("badbool.pt");
    std::fs::write(&path, &bytes).unwrap();
    let data = serve(
        formats::open(&path, Limits::default()).unwrap(),
        dir.path(),
        16 << 20,
    );
    let cat = data.catalog();
    let e = match data.read(tensor_index(cat, "bool"), 0, 0, 64) {
        Ok(_) => panic!("a bool of 2 was served"),
        Err(e) => e,
    };
    assert!(e.to_string().contains("neither 0 nor 1"), "{e}");
    let f32 = data.read(tensor_index(cat, "f32"), 0, 0, 1 << 20).unwrap();
    assert_eq!(f32.to_vec(), expected("dtypes.pt", "f32"));
}

#[test]
fn through_a_mount_every_tensor_file_is_torch_bytes() {
    let _serial = support::serial();
    for (file, want) in readable() {
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        m.mount(&fixtures().join(&file), &[]);
        let index = m.index();
        assert_eq!(index["format"], "PyTorch .pt", "{file}");
        for t in index["tensors"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            let w = &want[name];
            assert!(w.is_object(), "{file}: {name} not written by torch");
            assert_eq!(t["supported"], true, "{file}: {name}: {t}");
            let rel = t["path"].as_str().unwrap();
            assert_eq!(m.read(rel), expected(&file, name), "mounted {file}: {name}");
            let side = m.json(&format!("{rel}.json"));
            assert_eq!(side["format_dtype"], w["dtype"], "{file}: {name}");
            assert_eq!(side["shape"], w["shape"], "{file}: {name}");
            assert_eq!(
                side["numpy_dtype"],
                numpy_dtype(w["dtype"].as_str().unwrap()),
                "{file}: {name}"
            );
        }
        assert_eq!(
            index["tensors"].as_array().unwrap().len(),
            want.as_object().unwrap().len(),
            "{file}"
        );
        m.unmount_ok();
        m.cleanup();
    }
}

#[test]
fn through_a_mount_a_bad_bool_is_eio_and_the_legacy_file_one_line() {
    let _serial = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = fixtures().join("dtypes.pt");
    let opened = formats::open(&src, Limits::default()).unwrap();
    let at = opened.catalog.get("bool").unwrap().meta.to_map()["offset"]
        .as_u64()
        .unwrap();
    let mut bytes = std::fs::read(&src).unwrap();
    bytes[at as usize] = 2;
    let path = m.scratch_path("badbool.pt");
    std::fs::write(&path, &bytes).unwrap();
    m.mount(&path, &[]);
    let e = std::fs::read(m.path("bool")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(m.read("i64"), expected("dtypes.pt", "i64"));
    let listed = String::from_utf8(m.read(".ztensor/errors")).unwrap();
    assert!(
        listed.contains("\"bool\"") && listed.contains("neither 0 nor 1"),
        "{listed}"
    );
    m.unmount_ok();
    m.cleanup();

    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let r = m.run(&fixtures().join("legacy.pt"), &[]);
    assert!(!r.ok(), "the legacy file mounted");
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("legacy format"), "{}", r.stderr);
    m.cleanup();
}

/// Strided tensors over half the cache are gathered band by band into a
/// spill file rather than refused: with a 64-byte cache, `every_other`
/// (40 bytes) and `transposed` (48) read torch's bytes.
#[test]
fn strided_tensors_over_half_the_cache_are_gathered_into_a_spill() {
    let path = fixtures().join("strided.pt");
    let opened = formats::open(&path, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let scratch = tempfile::tempdir().unwrap();
    let data = serve(opened, scratch.path(), 64);
    for name in ["every_other", "transposed"] {
        let ti = tensor_index(data.catalog(), name);
        let got = read_whole(&data, ti, 0, 7).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, expected("strided.pt", name), "{name}");
    }
}
