//! The format table (`formats::FORMATS`, `src/formats/detect.rs`)
//! enumerated. Every format this version reads has: files its own writer
//! made, which detection gives to it and to no other format, and which
//! open with their tensors; a test against that writer; hostile cases;
//! and a row in the benchmark (or an entry, with its reason, in the list
//! of rows still missing). A format added to the table without them fails
//! here.

use std::path::{Path, PathBuf};

use ztensor_mount::formats::{self, FORMATS, Limits};

/// What the repository holds for one format.
struct Covered {
    name: &'static str,
    /// Files its own writer made (kept as fuzz seeds or fixtures).
    samples: &'static [&'static str],
    /// The test that reads what its real writer writes.
    interop: &'static str,
    /// Its hostile cases.
    hostile: &'static str,
    /// Text naming its row in `scripts/bench.py`.
    bench: Option<&'static str>,
}

const COVERED: &[Covered] = &[
    Covered {
        name: "Hugging Face safetensors index",
        samples: &[],
        interop: "tests/format_compat.rs",
        hostile: "tests/format_hostile.rs",
        bench: None,
    },
    Covered {
        name: "zTensor v0.1",
        samples: &["examples/model.zt"],
        interop: "tests/interop_python.rs",
        hostile: "tests/hostile.rs",
        bench: Some(".zt v0.1 (pack)"),
    },
    Covered {
        name: "zTensor v1",
        samples: &[
            "fuzz/seeds/zt_v1/python_all_formats.zt",
            "fuzz/seeds/zt_v1/tiny_dense.zt",
        ],
        interop: "tests/zt_v1_interop.rs",
        hostile: "tests/zt_v1_hostile.rs",
        bench: Some("zTensor v1 (ztensor 1.x write_numpy)"),
    },
    Covered {
        name: "zTensor v2",
        samples: &["tests/zt_v2/corpus/valid/canonical-basic.zt"],
        interop: "tests/zt_v2_interop.rs",
        hostile: "tests/zt_v2_hostile.rs",
        bench: Some("zt v2 raw (ztensor 2.x)"),
    },
    Covered {
        name: "deathtensors",
        samples: &[
            "fuzz/seeds/deathtensors/plain.deathtensors",
            "fuzz/seeds/deathtensors/zstd.deathtensors",
        ],
        interop: "tests/format_deathtensors.rs",
        hostile: "tests/deathtensors_hostile.rs",
        bench: Some("deathtensors (deathtensors.save)"),
    },
    Covered {
        name: "GGUF",
        samples: &["fuzz/seeds/formats/small.gguf"],
        interop: "tests/format_compat.rs",
        hostile: "tests/format_hostile.rs",
        bench: Some("GGUF (gguf.GGUFWriter, F32)"),
    },
    Covered {
        name: "HDF5",
        samples: &[
            "fuzz/seeds/formats/h5py_default.h5",
            "fuzz/seeds/formats/h5py_latest.h5",
        ],
        interop: "tests/format_hdf5.rs",
        hostile: "tests/format_hdf5.rs",
        bench: Some("HDF5 (h5py, one contiguous dataset)"),
    },
    Covered {
        name: "PyTorch .pt",
        samples: &[
            "fuzz/seeds/formats/torch_module.pt",
            "tests/fixtures/pt/dtypes.pt",
        ],
        interop: "tests/format_pt.rs",
        hostile: "tests/pt_hostile.rs",
        bench: Some("PyTorch .pt (torch.save's zip layout)"),
    },
    Covered {
        name: "npz",
        samples: &[
            "fuzz/seeds/formats/stored.npz",
            "fuzz/seeds/formats/deflated.npz",
        ],
        interop: "tests/format_npz.rs",
        hostile: "tests/npz_hostile.rs",
        bench: Some("npz (numpy.savez)"),
    },
    Covered {
        name: "safetensors",
        samples: &["fuzz/seeds/formats/plain.safetensors"],
        interop: "tests/format_compat.rs",
        hostile: "tests/format_hostile.rs",
        bench: Some("safetensors (safetensors.numpy.save_file)"),
    },
    Covered {
        name: "ONNX",
        samples: &["fuzz/seeds/formats/model.onnx"],
        interop: "tests/format_compat.rs",
        hostile: "tests/onnx_hostile.rs",
        bench: Some("ONNX (onnx.save, one initializer)"),
    },
];

/// Formats with no benchmark row yet, and why.
const NO_BENCH_ROW_YET: &[(&str, &str)] = &[(
    "Hugging Face safetensors index",
    "a sharded set's rows are its safetensors shards'",
)];

/// Formats whose recognition takes another's files too, which the table's
/// order settles: (the format, the one after it that also takes its files).
const OVERLAPS: &[(&str, &str)] = &[
    // npz takes every ZIP archive that `.pt` did not.
    ("PyTorch .pt", "npz"),
];

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn covered(name: &str) -> &'static Covered {
    COVERED
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("format {name:?} is in FORMATS but not in this test's COVERED"))
}

#[test]
fn every_format_in_the_table_is_covered_and_nothing_else_is() {
    let names: Vec<&str> = FORMATS.iter().map(|f| f.name).collect();
    for f in FORMATS {
        covered(f.name);
    }
    for c in COVERED {
        assert!(
            names.contains(&c.name),
            "{:?} is covered here but is not in FORMATS",
            c.name
        );
    }
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        names.len(),
        "two formats share a name: {names:?}"
    );
}

#[test]
fn every_format_has_its_tests_and_a_bench_row_or_says_why_not() {
    let bench = std::fs::read_to_string(repo("scripts/bench.py")).unwrap();
    for f in FORMATS {
        let c = covered(f.name);
        for test in [c.interop, c.hostile] {
            assert!(repo(test).is_file(), "{}: {test} is missing", f.name);
        }
        let missing = NO_BENCH_ROW_YET.iter().find(|(n, _)| *n == f.name);
        match (c.bench, missing) {
            (Some(row), None) => assert!(
                bench.contains(row),
                "{}: no row {row:?} in scripts/bench.py",
                f.name
            ),
            (None, Some(_)) => {}
            (Some(_), Some(_)) => {
                panic!("{}: has a bench row; take it off NO_BENCH_ROW_YET", f.name)
            }
            (None, None) => panic!(
                "{}: no bench row, and no reason in NO_BENCH_ROW_YET",
                f.name
            ),
        }
    }
}

/// Each sample goes to its own format, and opens with its tensors.
#[test]
fn each_formats_files_are_detected_as_it_and_open() {
    for f in FORMATS {
        for sample in covered(f.name).samples {
            let path = repo(sample);
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{sample}: {e}"));
            assert_eq!(
                formats::detect(&bytes).name(),
                Some(f.name),
                "{sample} is not detected as {}",
                f.name
            );
            let others: Vec<&str> = FORMATS
                .iter()
                .filter(|g| g.name != f.name && (g.looks_like)(&bytes))
                .map(|g| g.name)
                .filter(|&g| !OVERLAPS.contains(&(f.name, g)))
                .collect();
            assert!(others.is_empty(), "{sample} looks like {others:?} too");
            let opened = formats::open(&path, Limits::default())
                .unwrap_or_else(|e| panic!("{sample} ({}): {e}", f.name));
            assert!(!opened.catalog.tensors.is_empty(), "{sample}: no tensors");
        }
    }
}

/// The one format without a sample file of its own: an index written here
/// as `huggingface_hub` writes one, beside a shard safetensors wrote.
#[test]
fn a_hugging_face_index_is_detected_as_one_and_opens_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("model-00001-of-00001.safetensors");
    std::fs::copy(repo("fuzz/seeds/formats/plain.safetensors"), &shard).unwrap();
    let alone = formats::open(&shard, Limits::default()).unwrap();
    let map: serde_json::Map<String, serde_json::Value> = alone
        .catalog
        .tensors
        .iter()
        .map(|t| (t.name.clone(), "model-00001-of-00001.safetensors".into()))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    let path = dir.path().join("model.safetensors.index.json");
    let text = serde_json::to_vec_pretty(&index).unwrap();
    std::fs::write(&path, &text).unwrap();
    assert_eq!(
        formats::detect(&text).name(),
        Some("Hugging Face safetensors index")
    );
    let set = formats::open(&path, Limits::default()).unwrap();
    assert_eq!(set.catalog.tensors.len(), alone.catalog.tensors.len());
}

/// What no format reads is refused naming what it looks like, never as a
/// broken file of some format it is not trying to be.
#[test]
fn a_file_of_no_format_is_refused_saying_what_it_looks_like() {
    let dir = tempfile::tempdir().unwrap();
    for (bytes, says) in [
        (
            &b"hello, world\n"[..],
            "it starts with text: \"hello, world\\n\"",
        ),
        (b"", "the file is empty"),
        (b"<!DOCTYPE html><html>", "it is an HTML page"),
        (
            b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 548105171\n",
            "it is a Git LFS pointer to a file of 548105171 bytes, not the file itself",
        ),
        (b"\x1f\x8b\x08\x00", "a gzip stream"),
        (
            b"\x93NUMPY\x01\x00",
            "a numpy .npy file is not supported yet",
        ),
    ] {
        let path = dir.path().join("f.bin");
        std::fs::write(&path, bytes).unwrap();
        let e = formats::open(&path, Limits::default())
            .err()
            .unwrap_or_else(|| panic!("{bytes:?} opened"))
            .to_string();
        assert!(e.contains("f.bin") && e.contains(says), "{bytes:?}: {e}");
        assert!(!e.contains("ZTEN0001"), "{bytes:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        if !says.contains("not supported yet") {
            assert!(e.contains(&formats::reads()), "{e}");
        }
    }
}

/// A ZIP archive none of whose members is an array is some other archive:
/// refused naming its members, not mounted as an empty npz. An archive of
/// no members at all is what `np.savez()` of no arrays writes: it mounts,
/// empty.
#[test]
fn a_zip_that_is_neither_npz_nor_pt_is_refused_naming_its_members() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &Path, members: &[(&str, &[u8])]| {
        let mut w = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        for (name, bytes) in members {
            w.start_file(*name, zip::write::SimpleFileOptions::default())
                .unwrap();
            w.write_all(bytes).unwrap();
        }
        w.finish().unwrap();
    };
    let other = dir.path().join("other.zip");
    write(&other, &[("readme.txt", b"hello"), ("config.json", b"{}")]);
    assert_eq!(
        formats::detect(&std::fs::read(&other).unwrap()).name(),
        Some("npz")
    );
    let e = formats::open(&other, Limits::default())
        .err()
        .expect("an archive of no arrays opened")
        .to_string();
    assert!(
        e.contains("other.zip")
            && e.contains("neither npz (no member is a .npy array) nor PyTorch .pt")
            && e.contains("its members are config.json, readme.txt"),
        "{e}"
    );
    let empty = dir.path().join("empty.npz");
    write(&empty, &[]);
    let opened = formats::open(&empty, Limits::default()).unwrap();
    assert!(opened.catalog.tensors.is_empty());
}
