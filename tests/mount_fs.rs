//! Real mounts: what a program sees through the kernel. Every dtype, byte
//! order and encoding, sparse tensors, sidecars, the index, escaped names,
//! read-only enforcement, partial reads, times and inode numbers.

mod support;

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use ciborium::value::{Integer, Value};
use serde_json::{Value as Json, json};
use support::{Mount, Rng, pattern};
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{Algorithm, DType, Endian};

/// One dense tensor to write and then find through the mount.
struct Dense {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    /// Little-endian element bytes (what the mount must serve).
    le: Vec<u8>,
    opts: Options,
}

fn elements(shape: &[u64]) -> usize {
    shape.iter().product::<u64>() as usize
}

/// Element bytes for `d`: bools are 0/1, others a byte pattern.
fn data(d: DType, n: usize, salt: u8) -> Vec<u8> {
    if d == DType::Bool {
        return (0..n)
            .map(|i| u8::from((i + salt as usize).is_multiple_of(3)))
            .collect();
    }
    pattern(d.size() as usize, n, salt)
}

fn dense(name: &str, dtype: DType, shape: &[u64], salt: u8, opts: Options) -> Dense {
    Dense {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        le: data(dtype, elements(shape), salt),
        opts,
    }
}

fn opts(compression: Compression, endian: Endian, checksum: Option<Algorithm>) -> Options {
    Options {
        compression,
        endian,
        checksum,
        custom: Vec::new(),
    }
}

fn zstd(frame_size: usize) -> Compression {
    Compression::Zstd {
        level: 3,
        frame_size,
    }
}

fn write_dense(path: &Path, tensors: &[Dense]) {
    let mut w = Writer::create(path).unwrap();
    for t in tensors {
        w.add(&t.name, t.dtype, &t.shape, &t.le, &t.opts).unwrap();
    }
    w.finish().unwrap();
}

fn swap(bytes: &[u8], es: usize) -> Vec<u8> {
    let mut v = bytes.to_vec();
    if es > 1 {
        v.chunks_exact_mut(es).for_each(<[u8]>::reverse);
    }
    v
}

/// Number of zstd frames in `blob`.
fn zstd_frames(blob: &[u8]) -> usize {
    let mut pos = 0;
    let mut n = 0;
    while pos < blob.len() {
        pos += zstd::zstd_safe::find_frame_compressed_size(&blob[pos..]).expect("zstd frame");
        n += 1;
    }
    n
}

/// The index entry of tensor `name`.
fn entry(index: &Json, name: &str) -> Json {
    index["tensors"]
        .as_array()
        .expect("tensors array")
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("index.json has no tensor {name:?}"))
        .clone()
}

fn path_of(index: &Json, name: &str) -> String {
    entry(index, name)["path"]
        .as_str()
        .unwrap_or_else(|| panic!("tensor {name:?} has no path"))
        .to_string()
}

/// Checks a sidecar's checksum string against the on-disk blob bytes.
fn check_checksum(name: &str, sidecar: &Json, algo: Option<Algorithm>, blob: &[u8]) {
    match algo {
        None => assert_eq!(sidecar["checksum"], Json::Null, "{name}: checksum"),
        Some(Algorithm::Xxh3 | Algorithm::Crc32) => {
            panic!("{name}: zTensor v0.1 has no xxh3 or crc32 checksums")
        }
        Some(Algorithm::Crc32c) => {
            let s = sidecar["checksum"].as_str().expect("checksum string");
            let hex = s
                .strip_prefix("crc32c:")
                .unwrap_or_else(|| panic!("{name}: checksum {s:?}"));
            let hex = hex.trim_start_matches("0x").trim_start_matches("0X");
            assert_eq!(
                u32::from_str_radix(hex, 16).unwrap(),
                crc32c::crc32c(blob),
                "{name}: crc32c in sidecar vs blob"
            );
        }
        Some(Algorithm::Sha256) => {
            use sha2::Digest;
            let s = sidecar["checksum"].as_str().expect("checksum string");
            let want: String = sha2::Sha256::digest(blob)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                s.to_ascii_lowercase(),
                format!("sha256:{want}"),
                "{name}: sha256"
            );
        }
    }
}

/// Everything a reader of one dense tensor can check through the mount.
fn check_dense(m: &Mount, zt: &[u8], index: &Json, t: &Dense) {
    let name = &t.name;
    let path = path_of(index, name);
    let got = m.read(&path);
    assert!(got == t.le, "{name}: bytes read through the mount differ");
    let meta = std::fs::metadata(m.path(&path)).unwrap();
    assert!(meta.is_file(), "{name}: not a regular file");
    assert_eq!(meta.len(), t.le.len() as u64, "{name}: st_size");

    let sc = m.json(&format!("{path}.json"));
    assert_eq!(sc, entry(index, name), "{name}: sidecar vs index entry");
    assert_eq!(sc["name"], json!(name));
    assert_eq!(sc["path"], json!(path));
    assert_eq!(sc["dtype"], json!(t.dtype.name()), "{name}: dtype");
    assert_eq!(sc["shape"], json!(t.shape), "{name}: shape");
    assert_eq!(sc["nbytes"], json!(t.le.len()), "{name}: nbytes");
    assert_eq!(
        sc["numpy_dtype"],
        json!(support::numpy(t.dtype)),
        "{name}: numpy"
    );
    assert_eq!(sc["layout"], "dense");
    assert_eq!(sc["supported"], true);
    let es = t.dtype.size() as usize;
    let big = t.opts.endian == Endian::Big && es > 1;
    assert_eq!(
        sc["data_endianness"],
        if big { "big" } else { "little" },
        "{name}: data_endianness"
    );
    if t.dtype == DType::BFloat16 {
        assert!(sc["numpy_note"].is_string(), "{name}: bfloat16 note");
    }

    // offset/size must point at the stored blob in the .zt file.
    let off = sc["offset"].as_u64().expect("offset") as usize;
    let size = sc["size"].as_u64().expect("size") as usize;
    assert_eq!(off % 64, 0, "{name}: offset {off} not 64-aligned");
    let blob = &zt[off..off + size];
    let stored = if big { swap(&t.le, es) } else { t.le.clone() };
    match t.opts.compression {
        Compression::Raw => {
            assert_eq!(sc["encoding"], "raw");
            assert!(blob == stored, "{name}: blob at offset/size");
        }
        Compression::Zstd { frame_size, .. } => {
            assert_eq!(sc["encoding"], "zstd");
            let decoded = zstd::decode_all(blob).unwrap();
            assert!(decoded == stored, "{name}: zstd blob at offset/size");
            if frame_size > 0 && t.le.len() > frame_size {
                assert!(zstd_frames(blob) > 1, "{name}: expected several frames");
            }
        }
    }
    check_checksum(name, &sc, t.opts.checksum, blob);
}

/// All file paths under the mount (relative, '/'-separated), walking readdir.
/// The views' directories at the top: tests/views.rs checks them; the
/// tests here check the model's own tree.
const VIEW_DIRS: [&str; 3] = [".npy", ".zarr", ".safetensors"];

/// Every file under `root`, but the views'.
fn walk(root: &Path) -> BTreeSet<String> {
    fn go(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_str().expect("UTF-8 name").to_string();
            if prefix.is_empty() && VIEW_DIRS.contains(&name.as_str()) {
                continue;
            }
            let rel = format!("{prefix}{name}");
            if e.file_type().unwrap().is_dir() {
                go(&e.path(), &format!("{rel}/"), out);
            } else {
                out.insert(rel);
            }
        }
    }
    let mut out = BTreeSet::new();
    go(root, "", &mut out);
    out
}

/// The names in `dir`, but the views' directories.
fn names_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().to_string())
        .filter(|n| !VIEW_DIRS.contains(&n.as_str()))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The files a set of dense tensors must produce, plus `.ztensor/*`.
fn expected_files(index: &Json) -> BTreeSet<String> {
    let mut want = set(&[".ztensor/errors", ".ztensor/index.json", ".ztensor/stats"]);
    for t in index["tensors"].as_array().unwrap() {
        let p = t["path"].as_str().unwrap();
        want.insert(p.to_string());
        want.insert(format!("{p}.json"));
    }
    want
}

fn variants() -> Vec<(&'static str, Options)> {
    vec![
        ("raw_le", opts(Compression::Raw, Endian::Little, None)),
        (
            "raw_be",
            opts(Compression::Raw, Endian::Big, Some(Algorithm::Crc32c)),
        ),
        (
            "zstd_one_frame",
            opts(zstd(0), Endian::Little, Some(Algorithm::Sha256)),
        ),
        ("zstd_frames_le", opts(zstd(40), Endian::Little, None)),
        (
            "zstd_frames_be",
            opts(zstd(24), Endian::Big, Some(Algorithm::Crc32c)),
        ),
    ]
}

fn all_dense() -> Vec<Dense> {
    let mut out = Vec::new();
    for (k, d) in DType::V01.into_iter().enumerate() {
        for (v, o) in variants() {
            let name = format!("{}/{v}", d.name());
            out.push(dense(&name, d, &[5, 7], k as u8 * 16, o));
        }
    }
    out
}

#[test]
fn every_dtype_encoding_and_byte_order_reads_back() {
    every_dtype_reads_back_in(&[], true);
}

#[test]
fn every_dtype_reads_back_through_the_page_cache() {
    every_dtype_reads_back_in(&["--page-cache"], false);
}

/// Every tensor of [`all_dense`] read back in the mode `args` choose.
/// Raw tensors come from the daemon on every read with direct I/O, and
/// from the page cache on a second read otherwise (checked, so a mode
/// that silently did not take effect fails here).
fn every_dtype_reads_back_in(args: &[&str], direct_io: bool) {
    let tensors = all_dense();
    let Some(m) = Mount::with(args, |p| write_dense(p, &tensors)) else {
        return;
    };
    let raw = tensors
        .iter()
        .find(|t| matches!(t.opts.compression, Compression::Raw) && t.le.len() >= 64)
        .expect("a raw tensor");
    let served = || m.stat_u64("bytes_served");
    assert!(m.read(&raw.name) == raw.le);
    let before = served();
    assert!(m.read(&raw.name) == raw.le);
    let again = served() - before;
    if direct_io {
        assert_eq!(
            again,
            raw.le.len() as u64,
            "{args:?}: the daemon served the re-read"
        );
    } else {
        assert_eq!(again, 0, "{args:?}: a re-read came from the page cache");
    }
    let zt = std::fs::read(m.scratch_path("test.zt")).unwrap();
    let index = m.index();
    assert_eq!(index["tensor_count"], json!(tensors.len()));
    for t in &tensors {
        assert_eq!(path_of(&index, &t.name), t.name, "plain names are paths");
        check_dense(&m, &zt, &index, t);
    }
    // readdir shows exactly the tensors and sidecars, nothing else.
    assert_eq!(walk(&m.mp), expected_files(&index));
    let root = names_in(&m.mp);
    assert!(root.contains(".ztensor") && root.contains("bfloat16"));
    assert_eq!(root.len(), 1 + DType::V01.len());
    // Reading through the kernel was counted, without errors.
    let st = m.stats();
    assert!(st["bytes_served"].as_u64().unwrap() > 0);
    assert_eq!(st["errors"], 0, "stats: {st}");
}

#[test]
fn unaligned_reads_with_direct_io_match_every_slice() {
    // With --direct-io each pread reaches the daemon at exactly the offset and
    // length asked, so byte swapping and frame gathering see odd ranges.
    let tensors = all_dense();
    let Some(m) = Mount::with(&["--direct-io"], |p| write_dense(p, &tensors)) else {
        return;
    };
    let mut rng = Rng(7);
    for t in &tensors {
        let f = std::fs::File::open(m.path(&t.name)).unwrap();
        let n = t.le.len() as u64;
        for _ in 0..12 {
            let off = rng.below(n + 3);
            let len = 1 + rng.below(19) as usize;
            let mut buf = vec![0u8; len];
            let got = f.read_at(&mut buf, off).unwrap();
            let lo = (off as usize).min(t.le.len());
            let hi = (off as usize + len).min(t.le.len());
            assert_eq!(
                &buf[..got],
                &t.le[lo..hi],
                "{}: pread of {len} at {off}",
                t.name
            );
        }
    }
    assert_eq!(m.stat_u64("errors"), 0);
}

#[test]
fn scalars_and_empty_tensors() {
    let tensors = vec![
        dense(
            "scalar_f32",
            DType::Float32,
            &[],
            1,
            opts(Compression::Raw, Endian::Little, None),
        ),
        dense(
            "scalar_i64_zstd_be",
            DType::Int64,
            &[],
            2,
            opts(zstd(0), Endian::Big, Some(Algorithm::Crc32c)),
        ),
        dense(
            "scalar_bool",
            DType::Bool,
            &[],
            0,
            opts(Compression::Raw, Endian::Little, None),
        ),
        dense(
            "empty_raw",
            DType::Float32,
            &[0],
            3,
            opts(Compression::Raw, Endian::Little, Some(Algorithm::Sha256)),
        ),
        dense(
            "empty_zstd",
            DType::Float64,
            &[3, 0],
            4,
            opts(zstd(16), Endian::Little, None),
        ),
        dense(
            "empty_be",
            DType::Int16,
            &[0, 5],
            5,
            opts(Compression::Raw, Endian::Big, None),
        ),
    ];
    let Some(m) = Mount::with(&[], |p| write_dense(p, &tensors)) else {
        return;
    };
    let zt = std::fs::read(m.scratch_path("test.zt")).unwrap();
    let index = m.index();
    for t in &tensors {
        check_dense(&m, &zt, &index, t);
    }
    assert_eq!(m.read("scalar_f32").len(), 4);
    assert_eq!(m.read("scalar_bool"), vec![1]);
    // A read past the end of an empty file returns nothing, not an error.
    let f = std::fs::File::open(m.path("empty_zstd")).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(f.read_at(&mut buf, 100).unwrap(), 0);
    assert_eq!(walk(&m.mp), expected_files(&index));
    assert_eq!(m.stat_u64("errors"), 0);
}

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

struct Sparse {
    name: &'static str,
    format: &'static str,
    dtype: DType,
    shape: Vec<u64>,
    /// (part name, part dtype, part shape, little-endian bytes)
    parts: Vec<(&'static str, DType, Vec<u64>, Vec<u8>)>,
    nnz: u64,
    opts: Options,
}

fn sparse_cases() -> Vec<Sparse> {
    let indptr = [0u64, 2, 2, 5, 6];
    let csr_idx = [1u64, 4, 0, 3, 5, 2];
    let csr_vals = data(DType::Float32, 6, 9);
    let coo_idx = [0u64, 1, 2, 2, 3, 0, 1, 3, 4, 4, 0, 1];
    let coo_vals = data(DType::Int16, 4, 3);
    let csr = |name, opts| Sparse {
        name,
        format: "csr",
        dtype: DType::Float32,
        shape: vec![4, 6],
        parts: vec![
            ("indptr", DType::Uint64, vec![5], u64s(&indptr)),
            ("indices", DType::Uint64, vec![6], u64s(&csr_idx)),
            ("values", DType::Float32, vec![6], csr_vals.clone()),
        ],
        nnz: 6,
        opts,
    };
    let coo = |name, opts| Sparse {
        name,
        format: "coo",
        dtype: DType::Int16,
        shape: vec![3, 4, 5],
        parts: vec![
            ("indices", DType::Uint64, vec![3, 4], u64s(&coo_idx)),
            ("values", DType::Int16, vec![4], coo_vals.clone()),
        ],
        nnz: 4,
        opts,
    };
    vec![
        csr(
            "sp/csr_raw",
            opts(Compression::Raw, Endian::Little, Some(Algorithm::Crc32c)),
        ),
        // Frames of 16 bytes: every part straddles frame boundaries.
        csr("sp/csr_zstd_be", opts(zstd(16), Endian::Big, None)),
        coo("sp/coo_raw_be", opts(Compression::Raw, Endian::Big, None)),
        coo(
            "sp/coo_zstd",
            opts(zstd(24), Endian::Little, Some(Algorithm::Sha256)),
        ),
    ]
}

#[test]
fn sparse_csr_and_coo_parts() {
    let cases = sparse_cases();
    let Some(m) = Mount::with(&[], |p| {
        let mut w = Writer::create(p).unwrap();
        for c in &cases {
            let idx: Vec<u64> = c.parts[c.parts.len() - 2]
                .3
                .as_chunks::<8>()
                .0
                .iter()
                .map(|b| u64::from_le_bytes(*b))
                .collect();
            let vals = &c.parts.last().unwrap().3;
            if c.format == "csr" {
                let indptr: Vec<u64> = c.parts[0]
                    .3
                    .as_chunks::<8>()
                    .0
                    .iter()
                    .map(|b| u64::from_le_bytes(*b))
                    .collect();
                let shape = [c.shape[0], c.shape[1]];
                w.add_csr(c.name, c.dtype, shape, &indptr, &idx, vals, &c.opts)
                    .unwrap();
            } else {
                w.add_coo(c.name, c.dtype, &c.shape, &idx, vals, &c.opts)
                    .unwrap();
            }
        }
        w.finish().unwrap();
    }) else {
        return;
    };
    let zt = std::fs::read(m.scratch_path("test.zt")).unwrap();
    let index = m.index();
    let mut want_files = set(&[".ztensor/errors", ".ztensor/index.json", ".ztensor/stats"]);
    for c in &cases {
        let name = c.name;
        let path = path_of(&index, name);
        assert_eq!(path, name);
        assert!(
            m.path(&path).is_dir(),
            "{name}: sparse tensor is a directory"
        );
        let mut listing = BTreeSet::new();
        for (pname, _, _, _) in &c.parts {
            listing.insert(pname.to_string());
            listing.insert(format!("{pname}.json"));
        }
        assert_eq!(names_in(&m.path(&path)), listing, "{name}: parts");
        want_files.extend(listing.iter().map(|f| format!("{path}/{f}")));
        want_files.insert(format!("{path}.json"));

        let sc = m.json(&format!("{path}.json"));
        assert_eq!(sc, entry(&index, name), "{name}: sidecar vs index");
        assert_eq!(sc["layout"], "sparse");
        assert_eq!(sc["sparse_format"], c.format);
        assert_eq!(sc["nnz"], c.nnz);
        assert_eq!(sc["dtype"], c.dtype.name());
        assert_eq!(sc["shape"], json!(c.shape));
        assert_eq!(sc["supported"], true);
        let total: usize = c.parts.iter().map(|p| p.3.len()).sum();
        assert_eq!(sc["nbytes"], total, "{name}: nbytes of all parts");
        assert!(
            sc.get("numpy_dtype").is_none(),
            "{name}: a sparse tensor has no single numpy dtype"
        );
        let parts = sc["parts"].as_array().expect("parts");
        assert_eq!(parts.len(), c.parts.len());

        let mut stored = Vec::new();
        for (k, (pname, pd, pshape, le)) in c.parts.iter().enumerate() {
            let rel = format!("{path}/{pname}");
            assert!(m.read(&rel) == *le, "{name}: part {pname} bytes");
            assert_eq!(
                std::fs::metadata(m.path(&rel)).unwrap().len(),
                le.len() as u64
            );
            let pj = m.json(&format!("{rel}.json"));
            assert_eq!(pj, parts[k], "{name}: {pname}.json vs parts[{k}]");
            assert_eq!(pj["tensor"], name);
            assert_eq!(pj["part"], *pname);
            assert_eq!(pj["path"], rel);
            assert_eq!(pj["dtype"], pd.name());
            assert_eq!(pj["shape"], json!(pshape), "{name}: {pname} shape");
            assert_eq!(pj["nbytes"], le.len());
            assert_eq!(pj["numpy_dtype"], support::numpy(*pd));
            if c.opts.endian == Endian::Big {
                stored.extend(swap(le, pd.size() as usize));
            } else {
                stored.extend_from_slice(le);
            }
        }
        let off = sc["offset"].as_u64().unwrap() as usize;
        let size = sc["size"].as_u64().unwrap() as usize;
        let blob = &zt[off..off + size];
        let decoded = match c.opts.compression {
            Compression::Raw => blob.to_vec(),
            Compression::Zstd { .. } => zstd::decode_all(blob).unwrap(),
        };
        assert!(decoded == stored, "{name}: blob at offset/size");
        check_checksum(name, &sc, c.opts.checksum, blob);
    }
    assert_eq!(walk(&m.mp), want_files);
    assert_eq!(m.stat_u64("errors"), 0);
}

#[test]
fn custom_fields_and_unsupported_tensors() {
    let t = |s: &str| Value::Text(s.into());
    let custom = vec![
        (t("author"), t("ünï")),
        (t("step"), Value::Integer(Integer::from(42))),
        (t("neg"), Value::Integer(Integer::from(-7))),
        (t("lr"), Value::Float(0.5)),
        (t("nan"), Value::Float(f64::NAN)),
        (t("flag"), Value::Bool(true)),
        (
            t("tags"),
            Value::Array(vec![t("a"), Value::Integer(Integer::from(1))]),
        ),
        (t("nested"), Value::Map(vec![(t("k"), Value::Null)])),
        (t("raw"), Value::Bytes(vec![0xde, 0xad])),
        (Value::Integer(Integer::from(5)), t("five")),
    ];
    let with_custom = Dense {
        name: "meta/w".into(),
        dtype: DType::Float32,
        shape: vec![4],
        le: data(DType::Float32, 4, 1),
        opts: Options {
            custom,
            ..opts(zstd(0), Endian::Little, None)
        },
    };
    let plain = dense(
        "meta/plain",
        DType::Uint8,
        &[3],
        2,
        opts(Compression::Raw, Endian::Little, None),
    );
    let Some(m) = Mount::with(&[], |p| {
        let mut w = Writer::create(p).unwrap();
        for d in [&with_custom, &plain] {
            w.add(&d.name, d.dtype, &d.shape, &d.le, &d.opts).unwrap();
        }
        let fields = |name: &str, dtype: &str, enc: &str| {
            vec![
                (t("name"), t(name)),
                (t("dtype"), t(dtype)),
                (
                    t("shape"),
                    Value::Array(vec![Value::Integer(Integer::from(2))]),
                ),
                (t("encoding"), t(enc)),
                (t("layout"), t("dense")),
                (t("note"), t("kept")),
            ]
        };
        w.add_blob(&[0u8; 16], fields("odd/complex", "complex64", "raw"))
            .unwrap();
        w.add_blob(&[0u8; 8], fields("odd/lz4", "float32", "lz4"))
            .unwrap();
        w.finish().unwrap();
    }) else {
        return;
    };
    let zt = std::fs::read(m.scratch_path("test.zt")).unwrap();
    let index = m.index();
    check_dense(&m, &zt, &index, &plain);
    let sc = m.json("meta/w.json");
    assert_eq!(
        sc["custom"],
        json!({
            "author": "ünï",
            "step": 42,
            "neg": -7,
            "lr": 0.5,
            "nan": "NaN",
            "flag": true,
            "tags": ["a", 1],
            "nested": {"k": null},
            "raw": {"$bytes": "dead"},
            "$key:5": "five",
        })
    );
    assert_eq!(m.json("meta/plain.json")["custom"], json!({}));
    assert!(m.read("meta/w") == with_custom.le);

    // Unsupported tensors: a sidecar that says why, and no data file.
    for name in ["odd/complex", "odd/lz4"] {
        let sc = m.json(&format!("{name}.json"));
        assert_eq!(sc, entry(&index, name));
        assert_eq!(sc["supported"], false, "{name}");
        assert_eq!(sc["path"], Json::Null, "{name}");
        let why = sc["unsupported_reason"].as_str().unwrap_or("");
        assert!(!why.is_empty(), "{name}: unsupported_reason");
        assert_eq!(sc["custom"]["note"], "kept");
        let err = std::fs::metadata(m.path(name)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{name}");
    }
    assert!(
        m.json("odd/complex.json")["unsupported_reason"]
            .as_str()
            .unwrap()
            .contains("complex64")
    );
    assert_eq!(names_in(&m.path("odd")), set(&["complex.json", "lz4.json"]));
    assert_eq!(index["tensor_count"], 4);
}

#[test]
fn nested_and_unicode_names() {
    let names = [
        "model/layers/0/weight",
        "model/layers/0/bias",
        "model/layers/1/weight",
        "model/embed",
        "ünïcödé/权重",
        "emoji 🙂 name",
        "with space/and:colon;semi",
        "deep/a/b/c/d/e/f/g/h",
    ];
    let tensors: Vec<Dense> = names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            dense(
                n,
                DType::Int32,
                &[3, 3],
                k as u8,
                opts(zstd(12), Endian::Little, None),
            )
        })
        .collect();
    let Some(m) = Mount::with(&[], |p| write_dense(p, &tensors)) else {
        return;
    };
    let zt = std::fs::read(m.scratch_path("test.zt")).unwrap();
    let index = m.index();
    for t in &tensors {
        assert_eq!(path_of(&index, &t.name), t.name);
        assert!(entry(&index, &t.name).get("path_escaped_because").is_none());
        check_dense(&m, &zt, &index, t);
    }
    assert_eq!(
        names_in(&m.mp),
        set(&[
            ".ztensor",
            "model",
            "ünïcödé",
            "emoji 🙂 name",
            "emoji 🙂 name.json",
            "with space",
            "deep"
        ])
    );
    assert_eq!(names_in(&m.path("model/layers")), set(&["0", "1"]));
    assert_eq!(
        names_in(&m.path("model")),
        set(&["layers", "embed", "embed.json"])
    );
    // A directory's link count is 2 plus its subdirectories.
    assert_eq!(
        std::fs::metadata(m.path("model/layers")).unwrap().nlink(),
        4
    );
    assert_eq!(std::fs::metadata(m.path("model")).unwrap().nlink(), 3);
    assert_eq!(walk(&m.mp), expected_files(&index));
    // Lookups of missing names fail cleanly.
    for (missing, errno) in [
        ("model/nope", libc::ENOENT),
        ("model/layers/2", libc::ENOENT),
        ("emoji", libc::ENOENT),
        ("model/embed/x", libc::ENOTDIR),
    ] {
        let e = std::fs::metadata(m.path(missing)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(errno), "{missing}: {e}");
    }
}

#[test]
fn a_sparse_tensors_directory_holds_only_its_parts() {
    // A later tensor named into a sparse tensor's directory gets a
    // directory of its own (sp~N), as one named under a file does.
    let Some(m) = Mount::with(&[], |p| {
        let mut w = Writer::create(p).unwrap();
        let values: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        w.add_csr(
            "sp",
            DType::Float32,
            [2, 3],
            &[0, 1, 2],
            &[0, 2],
            &values,
            &Options::default(),
        )
        .unwrap();
        w.add("a", DType::Uint8, &[3], &[7, 8, 9], &Options::default())
            .unwrap();
        for name in ["sp/extra", "sp/values", "a/b", "a/c"] {
            w.add(name, DType::Uint8, &[3], &[7, 8, 9], &Options::default())
                .unwrap();
        }
        w.finish().unwrap();
    }) else {
        return;
    };
    let index = m.index();
    assert_eq!(
        names_in(&m.path("sp")),
        set(&[
            "indptr",
            "indptr.json",
            "indices",
            "indices.json",
            "values",
            "values.json"
        ])
    );
    for name in ["sp/extra", "sp/values", "a/b", "a/c"] {
        let path = path_of(&index, name);
        let (head, tail) = name.split_once('/').unwrap();
        assert!(
            path.starts_with(&format!("{head}~")) && path.ends_with(&format!("/{tail}")),
            "{name} at {path}"
        );
        let why = entry(&index, name)["path_escaped_because"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let want = if head == "sp" {
            "sparse tensor's directory"
        } else {
            "already a file"
        };
        assert!(why.contains(want), "{name}: {why}");
        assert_eq!(m.read(&path), vec![7, 8, 9], "{name}");
    }
    // Siblings under one taken name share the one directory made for it.
    let dir_of = |n: &str| path_of(&index, n).rsplit_once('/').unwrap().0.to_string();
    assert_eq!(dir_of("sp/extra"), dir_of("sp/values"));
    assert_eq!(dir_of("a/b"), dir_of("a/c"));
    assert_eq!(
        m.read("sp/values"),
        [1.0f32, 2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
    );
}

#[test]
fn names_that_cannot_be_paths_are_escaped() {
    let long_a = "x".repeat(300);
    let long_b = format!("{}z", "x".repeat(299));
    let names: Vec<String> = [
        ".",
        "..",
        "a//b",
        &long_a,
        &long_b,
        "w",
        "w.json",
        "enc/x",
        "enc",
        "f",
        "f/y",
        ".ztensor/evil",
        ".ztensor",
        "/lead",
        "trail/",
        "...",
        "dir/../up",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let tensors: Vec<Dense> = names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            dense(
                n,
                DType::Uint16,
                &[k as u64 + 1],
                k as u8,
                opts(Compression::Raw, Endian::Little, None),
            )
        })
        .collect();
    let Some(m) = Mount::with(&[], |p| write_dense(p, &tensors)) else {
        return;
    };
    let zt = std::fs::read(m.scratch_path("test.zt")).unwrap();
    let index = m.index();
    let mut seen = BTreeSet::new();
    for t in &tensors {
        let path = path_of(&index, &t.name);
        let e = entry(&index, &t.name);
        let comps: Vec<&str> = path.split('/').collect();
        for c in &comps {
            assert!(
                !c.is_empty() && *c != "." && *c != ".." && c.len() <= 255,
                "{:?}: bad component {c:?} in {path:?}",
                t.name
            );
        }
        assert!(seen.insert(path.clone()), "{path:?} used twice");
        let escaped = path != t.name;
        assert_eq!(
            e.get("path_escaped_because").is_some_and(Json::is_string),
            escaped,
            "{:?} -> {path:?}: path_escaped_because must be there iff escaped",
            t.name
        );
        // The data is where the index says, and the sidecar sits next to it.
        check_dense(&m, &zt, &index, t);
    }
    let p = |n: &str| path_of(&index, n);
    assert_eq!(p("."), "%2E");
    assert_eq!(p(".."), "%2E%2E");
    assert_eq!(p("a//b"), "a/%/b");
    assert_eq!(p("/lead"), "%/lead");
    assert_eq!(p("trail/"), "trail/%");
    assert_eq!(p("dir/../up"), "dir/%2E%2E/up");
    assert_eq!(p("..."), "...");
    assert_ne!(p(&long_a), p(&long_b), "long names must stay distinct");
    assert!(p(&long_a).starts_with("xxxxxxxx"));
    // First come, first served: "w" keeps its name, so "w.json" is the
    // sidecar of "w" and the tensor "w.json" lives elsewhere.
    assert_eq!(p("w"), "w");
    assert_ne!(p("w.json"), "w.json");
    assert_eq!(m.json("w.json")["name"], "w");
    assert_eq!(p("enc/x"), "enc/x");
    assert_ne!(p("enc"), "enc");
    assert!(m.path("enc").is_dir());
    assert_eq!(p("f"), "f");
    assert!(!p("f/y").starts_with("f/"), "{}", p("f/y"));
    assert!(!p(".ztensor/evil").starts_with(".ztensor/"));
    assert_ne!(p(".ztensor"), ".ztensor");
    assert_eq!(
        names_in(&m.path(".ztensor")),
        set(&["errors", "index.json", "stats"]),
        ".ztensor holds only the daemon's files"
    );
    assert_eq!(walk(&m.mp), expected_files(&index));
}

#[test]
fn live_files_report_the_size_of_what_a_copy_gets() {
    let tensors = vec![dense(
        "t",
        DType::Float32,
        &[1024],
        3,
        opts(zstd(0), Endian::Little, None),
    )];
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    write_dense(&zt, &tensors);
    // Every open reaches the daemon, so each one counts.
    m.mount(&zt, &["--no-passthrough"]);
    assert_eq!(m.read("t"), tensors[0].le);
    let text = support::copies_whole(&m.path(".ztensor/stats"));
    let stats: Json = serde_json::from_slice(&text).unwrap();
    let opens = stats["fuse_opens"].as_u64().unwrap();
    assert!(opens >= 1, "{stats}");
    // A poller that opens, reads and closes sees fresh figures each time.
    assert_eq!(m.read("t"), tensors[0].le);
    assert_eq!(m.stat_u64("fuse_opens"), opens + 1, "{}", m.stats());
    assert_eq!(support::copies_whole(&m.path(".ztensor/errors")), b"");
}

fn errno_of<T: std::fmt::Debug>(what: &str, r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("{what}: succeeded ({v:?}) on a read-only mount"),
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn libc_result(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn every_write_fails_with_erofs() {
    let tensors = vec![
        dense(
            "d/t",
            DType::Float32,
            &[8],
            1,
            opts(Compression::Raw, Endian::Little, None),
        ),
        dense(
            "z",
            DType::Int8,
            &[8],
            2,
            opts(zstd(0), Endian::Little, None),
        ),
    ];
    let Some(m) = Mount::with(&[], |p| write_dense(p, &tensors)) else {
        return;
    };
    use std::fs::OpenOptions;
    let file = m.path("d/t");
    let side = m.path("d/t.json");
    let dir = m.path("d");
    let mut checks: Vec<(String, i32)> = Vec::new();
    let mut check = |what: &str, r: std::io::Result<()>| {
        checks.push((what.to_string(), errno_of(what, r)));
    };
    for target in [&file, &side, &m.path("z"), &m.path(".ztensor/stats")] {
        let t = target.display();
        check(
            &format!("open {t} for write"),
            OpenOptions::new().write(true).open(target).map(drop),
        );
        check(
            &format!("open {t} read-write"),
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(target)
                .map(drop),
        );
        check(
            &format!("open {t} append"),
            OpenOptions::new().append(true).open(target).map(drop),
        );
        check(
            &format!("truncate {t}"),
            // SAFETY (this and the calls below): each path is a CString
            // that lives until the call returns; no other memory is passed
            // but the static `c"..."`/`b"..."` literals and their lengths.
            libc_result(unsafe { libc::truncate(cpath(target).as_ptr(), 0) }),
        );
        check(
            &format!("O_RDONLY|O_TRUNC {t}"),
            libc_result(unsafe {
                let fd = libc::open(cpath(target).as_ptr(), libc::O_RDONLY | libc::O_TRUNC);
                if fd >= 0 {
                    libc::close(fd);
                    0
                } else {
                    -1
                }
            }),
        );
        check(
            &format!("chmod {t}"),
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o644)),
        );
        check(
            &format!("chown {t}"),
            libc_result(unsafe { libc::chown(cpath(target).as_ptr(), 0, 0) }),
        );
        check(
            &format!("utimes {t}"),
            libc_result(unsafe {
                libc::utimensat(libc::AT_FDCWD, cpath(target).as_ptr(), std::ptr::null(), 0)
            }),
        );
        check(
            &format!("setxattr {t}"),
            libc_result(unsafe {
                libc::setxattr(
                    cpath(target).as_ptr(),
                    c"user.test".as_ptr(),
                    b"v".as_ptr().cast(),
                    1,
                    0,
                )
            }),
        );
        check(&format!("unlink {t}"), std::fs::remove_file(target));
        check(
            &format!("rename {t}"),
            std::fs::rename(target, m.path("renamed")),
        );
        check(
            &format!("link {t}"),
            std::fs::hard_link(target, m.path("hardlink")),
        );
    }
    check("create", std::fs::File::create(m.path("new")).map(drop));
    check(
        "create in subdir",
        std::fs::File::create(dir.join("new")).map(drop),
    );
    check(
        "create_new",
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.path("new2"))
            .map(drop),
    );
    check("mkdir", std::fs::create_dir(m.path("newdir")));
    check("mkdir in subdir", std::fs::create_dir(dir.join("sub")));
    check("rmdir", std::fs::remove_dir(&dir));
    check("rmdir .ztensor", std::fs::remove_dir(m.path(".ztensor")));
    check("rename dir", std::fs::rename(&dir, m.path("d2")));
    check("symlink", std::os::unix::fs::symlink("d/t", m.path("link")));
    check(
        "mknod fifo",
        // SAFETY: the path is a CString that lives until the call returns.
        libc_result(unsafe { libc::mkfifo(cpath(&m.path("fifo")).as_ptr(), 0o644) }),
    );
    check(
        "chmod dir",
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)),
    );
    let bad: Vec<_> = checks.iter().filter(|(_, e)| *e != libc::EROFS).collect();
    assert!(bad.is_empty(), "expected EROFS (30) from: {bad:#?}");
    // Nothing changed.
    assert!(m.read("d/t") == tensors[0].le);
    assert_eq!(names_in(&m.mp), set(&[".ztensor", "d", "z", "z.json"]));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o444);
}

#[test]
fn dd_and_pread_read_slices() {
    let tensors = vec![
        dense(
            "raw_le",
            DType::Float32,
            &[2048],
            1,
            opts(Compression::Raw, Endian::Little, None),
        ),
        dense(
            "raw_be",
            DType::Int32,
            &[2048],
            2,
            opts(Compression::Raw, Endian::Big, None),
        ),
        // 1000-byte frames: not a multiple of 4, so dd blocks straddle frames.
        dense(
            "zstd_frames",
            DType::Uint16,
            &[4096],
            3,
            opts(zstd(1000), Endian::Little, None),
        ),
        dense(
            "zstd_frames_be",
            DType::Float64,
            &[1024],
            4,
            opts(zstd(1000), Endian::Big, Some(Algorithm::Crc32c)),
        ),
    ];
    let Some(m) = Mount::with(&[], |p| write_dense(p, &tensors)) else {
        return;
    };
    for t in &tensors {
        let path = m.path(&t.name);
        for (skip, count) in [(0, 1), (1, 3), (250, 7), (499, 30), (1000, 500), (2047, 5)] {
            let out = Command::new("dd")
                .arg(format!("if={}", path.display()))
                .args([
                    "bs=4".to_string(),
                    format!("skip={skip}"),
                    format!("count={count}"),
                    "status=none".to_string(),
                ])
                .output()
                .expect("run dd");
            assert!(out.status.success(), "dd: {out:?}");
            let lo = (skip * 4).min(t.le.len());
            let hi = ((skip + count) * 4).min(t.le.len());
            assert!(
                out.stdout == t.le[lo..hi],
                "{}: dd bs=4 skip={skip} count={count}",
                t.name
            );
        }
        // Odd offsets and lengths with pread, across the whole file.
        let f = std::fs::File::open(&path).unwrap();
        let mut rng = Rng(t.le.len() as u64);
        for _ in 0..40 {
            let off = rng.below(t.le.len() as u64) as usize;
            let len = 1 + rng.below(3000) as usize;
            let mut buf = vec![0u8; len];
            let mut got = 0;
            while got < len {
                let n = f.read_at(&mut buf[got..], (off + got) as u64).unwrap();
                if n == 0 {
                    break;
                }
                got += n;
            }
            let hi = (off + len).min(t.le.len());
            assert!(buf[..got] == t.le[off..hi], "{}: pread {len}@{off}", t.name);
        }
    }
    assert_eq!(m.stat_u64("errors"), 0);
}

#[test]
fn times_modes_owners_and_inode_numbers() {
    let tensors = vec![
        dense(
            "a/t",
            DType::Float32,
            &[3],
            1,
            opts(Compression::Raw, Endian::Little, None),
        ),
        dense(
            "b",
            DType::Int64,
            &[2],
            2,
            opts(zstd(0), Endian::Little, None),
        ),
    ];
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    write_dense(&zt, &tensors);
    // A distinctive mtime with nanoseconds, well in the past.
    let when = std::time::UNIX_EPOCH + std::time::Duration::new(1_500_000_000, 123_456_789);
    std::fs::File::options()
        .write(true)
        .open(&zt)
        .unwrap()
        .set_modified(when)
        .unwrap();
    m.mount(&zt, &[]);
    let zmeta = std::fs::metadata(&zt).unwrap();
    assert_eq!(zmeta.modified().unwrap(), when);
    // SAFETY: getuid and getgid take nothing and cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let all = [
        "",
        "a",
        "a/t",
        "a/t.json",
        "b",
        "b.json",
        ".ztensor",
        ".ztensor/index.json",
        ".ztensor/stats",
    ];
    let mut inos = BTreeSet::new();
    for rel in all {
        let p = m.path(rel);
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.modified().unwrap(), when, "{rel}: mtime");
        assert_eq!(md.mtime_nsec(), 123_456_789, "{rel}: mtime nsec");
        assert_eq!(md.ctime(), 1_500_000_000, "{rel}: ctime");
        assert_eq!(md.atime(), 1_500_000_000, "{rel}: atime");
        assert_eq!((md.uid(), md.gid()), (uid, gid), "{rel}: owner");
        if md.is_dir() {
            assert_eq!(md.mode(), libc::S_IFDIR | 0o555, "{rel}: mode");
        } else {
            assert_eq!(md.mode(), libc::S_IFREG | 0o444, "{rel}: mode");
            assert_eq!(md.nlink(), 1, "{rel}: nlink");
        }
        // Stable: a second stat (and one after reading) gives the same inode.
        let again = std::fs::metadata(&p).unwrap();
        assert_eq!(md.ino(), again.ino(), "{rel}: inode changed");
        assert_eq!(md.dev(), again.dev());
        if md.is_file() {
            let _ = std::fs::read(&p).unwrap();
            assert_eq!(std::fs::metadata(&p).unwrap().ino(), md.ino());
        }
        assert!(inos.insert(md.ino()), "{rel}: inode {} reused", md.ino());
    }
    // readdir reports the same inode numbers as stat.
    for e in std::fs::read_dir(&m.mp).unwrap() {
        let e = e.unwrap();
        use std::os::unix::fs::DirEntryExt;
        assert_eq!(
            e.ino(),
            std::fs::metadata(e.path()).unwrap().ino(),
            "{:?}",
            e.file_name()
        );
    }
    // Sizes as `ls -l` shows them: tensors their byte count, sidecars their
    // text length.
    assert_eq!(std::fs::metadata(m.path("a/t")).unwrap().len(), 12);
    assert_eq!(std::fs::metadata(m.path("b")).unwrap().len(), 16);
    for rel in ["a/t.json", "b.json", ".ztensor/index.json"] {
        assert_eq!(
            std::fs::metadata(m.path(rel)).unwrap().len(),
            m.read(rel).len() as u64,
            "{rel}: st_size vs content"
        );
    }
    // The root is the mount's root, on a different device from the scratch dir.
    let root = std::fs::metadata(&m.mp).unwrap();
    assert_ne!(root.dev(), zmeta.dev());
    // As root fuser calls mount(2) with type "fuse" and drops the subtype;
    // through fusermount3 it is "fuse.ztensor-mount". Either way the source
    // names the file and the mount is read-only, nosuid, nodev.
    let (source, fstype, options) = support::mount_entry(&m.mp).expect("mounted");
    assert!(fstype.starts_with("fuse"), "fstype {fstype}");
    assert_eq!(source, zt.display().to_string());
    let options: BTreeSet<&str> = options.split(',').collect();
    for o in ["ro", "nosuid", "nodev", "noexec"] {
        assert!(options.contains(o), "mount options {options:?} lack {o}");
    }
}
