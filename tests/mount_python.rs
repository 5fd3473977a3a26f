//! numpy reading a real mount: `np.fromfile(path, sidecar numpy_dtype)`
//! gives the right values for every dtype and storage, and `np.memmap`
//! (mmap(2) on the FUSE file) works on raw and zstd tensors.
//!
//! The interpreter is `$ZT_PYTHON`, else `.venv/bin/python3` in the crate.
//! Without python+numpy: fail when CI=true, else skip with a note.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value as Json, json};
use support::Mount;
use support::python::Python;
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{DType, Endian};

fn python() -> Option<Python> {
    Python::from_env().require(
        "python with numpy (set ZT_PYTHON)",
        "import numpy; print(numpy.__version__)",
        |_| Ok(()),
    )
}

/// Runs `script` with `spec` (JSON) as its argument; panics with its output
/// unless it prints "OK".
fn run_python(py: &Python, m: &Mount, script: &str, spec: &Json) {
    let sp = m.scratch_path("check.py");
    std::fs::write(&sp, script).unwrap();
    let jp = m.scratch_path("spec.json");
    std::fs::write(&jp, serde_json::to_vec(spec).unwrap()).unwrap();
    py.run_ok(
        &[sp.as_ref(), jp.as_ref()],
        Duration::from_secs(60),
        "python check",
    );
}

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as f64;
    sign * match exp {
        0 => man * 2f64.powi(-24),
        _ => (1.0 + man / 1024.0) * 2f64.powi(exp - 15),
    }
}

/// 12 values per dtype: (LE bytes, JSON values, raw bits for the 16-bit
/// floats). Values are exact in their type and include the extremes.
fn values(d: DType) -> (Vec<u8>, Vec<Json>, Option<Vec<u16>>) {
    fn pack<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }
    match d {
        DType::Float64 => {
            let v = [
                0.0,
                -0.0,
                1.5,
                -2.25,
                1e300,
                -1e-300,
                std::f64::consts::PI,
                65504.0,
                0.1,
                -7.0,
                5e-324,
                123456789.123,
            ];
            (
                pack(&v, f64::to_le_bytes),
                v.map(|x| json!(x)).to_vec(),
                None,
            )
        }
        DType::Float32 => {
            let v: [f32; 12] = [
                0.0, 0.5, -3.25, 1e10, -1e-10, 3.4e38, -1.5, 2.0, 0.1, 7.0, -65536.0, 1.0e-38,
            ];
            (
                pack(&v, f32::to_le_bytes),
                v.map(|x| json!(x as f64)).to_vec(),
                None,
            )
        }
        DType::Float16 => {
            let bits: [u16; 12] = [
                0x0000, 0x3C00, 0xC000, 0x3800, 0x7BFF, 0x3E00, 0xB400, 0x4200, 0x2E66, 0x0400,
                0x0001, 0xE400,
            ];
            (
                pack(&bits, u16::to_le_bytes),
                bits.map(|b| json!(f16_to_f64(b))).to_vec(),
                Some(bits.to_vec()),
            )
        }
        DType::BFloat16 => {
            let bits: [u16; 12] = [
                0x3F80, 0xC000, 0x3F00, 0x4049, 0x7F7F, 0x0080, 0x8000, 0x4380, 0x0000, 0xBF80,
                0x42C8, 0x3DCD,
            ];
            (
                pack(&bits, u16::to_le_bytes),
                bits.map(|b| json!(f32::from_bits((b as u32) << 16) as f64))
                    .to_vec(),
                Some(bits.to_vec()),
            )
        }
        DType::Int64 => {
            let v = [
                i64::MIN,
                i64::MAX,
                -1,
                0,
                1,
                -2,
                1 << 53,
                -(1 << 40),
                7,
                8,
                9,
                10,
            ];
            (
                pack(&v, i64::to_le_bytes),
                v.map(|x| json!(x)).to_vec(),
                None,
            )
        }
        DType::Int32 => {
            let v = [
                i32::MIN,
                i32::MAX,
                -1,
                0,
                1,
                -2,
                1 << 20,
                -(1 << 30),
                7,
                8,
                9,
                10,
            ];
            (
                pack(&v, i32::to_le_bytes),
                v.map(|x| json!(x)).to_vec(),
                None,
            )
        }
        DType::Int16 => {
            let v = [i16::MIN, i16::MAX, -1, 0, 1, -2, 256, -300, 7, 8, 9, 10];
            (
                pack(&v, i16::to_le_bytes),
                v.map(|x| json!(x)).to_vec(),
                None,
            )
        }
        DType::Int8 => {
            let v = [i8::MIN, i8::MAX, -1, 0, 1, -2, 64, -100, 7, 8, 9, 10];
            (
                pack(&v, i8::to_le_bytes),
                v.map(|x| json!(x)).to_vec(),
                None,
            )
        }
        DType::Uint64 => {
            let v = [u64::MAX, 1 << 63, 0, 1, 2, 3, 1 << 53, 1 << 40, 7, 8, 9, 10];
            (
                pack(&v, u64::to_le_bytes),
                v.map(|x| json!(x)).to_vec(),
                None,
            )
        }
        DType::Uint32 => {
            let v = [u32::MAX, 1 << 31, 0, 1, 2, 3, 1 << 20, 1 << 30, 7, 8, 9, 10];
            (
                pack(&v, u32::to_le_bytes),
                v.map(|x| json!(x)).to_vec(),
                None,
            )
        }
        DType::Uint16 => {
            let v = [u16::MAX, 1 << 15, 0, 1, 2, 3, 256, 300, 7, 8, 9, 10];
            (
                pack(&v, u16::to_le_bytes),
                v.map(|x| json!(x)).to_vec(),
                None,
            )
        }
        DType::Uint8 => {
            let v = [u8::MAX, 128, 0, 1, 2, 3, 64, 100, 7, 8, 9, 10];
            (v.to_vec(), v.map(|x| json!(x)).to_vec(), None)
        }
        DType::Bool => {
            let v = [
                true, false, false, true, true, true, false, true, false, false, true, false,
            ];
            (v.map(u8::from).to_vec(), v.map(|x| json!(x)).to_vec(), None)
        }
        other => panic!("zTensor v0.1 has no {other}"),
    }
}

const FROMFILE: &str = r#"
import json, sys
import numpy as np

spec = json.load(open(sys.argv[1]))
bad = []
for c in spec["cases"]:
    with open(c["sidecar"]) as f:
        sc = json.load(f)
    dt = np.dtype(sc["numpy_dtype"])
    a = np.fromfile(c["path"], dtype=dt).reshape(sc["shape"])
    shape = tuple(c["shape"])
    if a.shape != shape:
        bad.append((c["path"], "shape", a.shape, shape))
        continue
    if c["dtype"] == "bfloat16":
        # numpy has no bfloat16: raw bits as <u2, then widened as the note says.
        if a.dtype != np.dtype("<u2"):
            bad.append((c["path"], "dtype", str(a.dtype)))
        if not np.array_equal(a, np.array(c["bits"], dtype="<u2").reshape(shape)):
            bad.append((c["path"], "bits", a.ravel().tolist(), c["bits"]))
        wide = (a.astype("<u4") << 16).view("<f4")
        want = np.array(c["values"], dtype="<f4").reshape(shape)
        if not np.array_equal(wide, want):
            bad.append((c["path"], "widened", wide.ravel().tolist(), c["values"]))
    else:
        want = np.array(c["values"], dtype=c["numpy"]).reshape(shape)
        if a.dtype != want.dtype:
            bad.append((c["path"], "dtype", str(a.dtype), str(want.dtype)))
        elif not (np.array_equal(a, want) and a.tobytes() == want.tobytes()):
            bad.append((c["path"], "values", a.ravel().tolist(), c["values"]))
        if c.get("bits") is not None and a.view("<u2").ravel().tolist() != c["bits"]:
            bad.append((c["path"], "f16 bits", a.view("<u2").ravel().tolist()))
    # The same through mmap(2) on the FUSE file.
    m = np.memmap(c["path"], dtype=dt, mode="r", shape=shape)
    if not np.array_equal(m, a) or m.tobytes() != a.tobytes():
        bad.append((c["path"], "memmap differs from fromfile"))
    del m
for b in bad:
    print("MISMATCH", *b)
print("OK" if not bad else "FAILED %d" % len(bad))
"#;

#[test]
fn numpy_fromfile_reads_every_dtype_and_storage() {
    let Some(py) = python() else {
        return;
    };
    let storages: [(&str, Options); 3] = [
        ("raw", Options::default()),
        (
            "zstd_be",
            Options {
                compression: Compression::Zstd {
                    level: 3,
                    frame_size: 16,
                },
                endian: Endian::Big,
                ..Options::default()
            },
        ),
        (
            "zstd",
            Options {
                compression: Compression::zstd(),
                ..Options::default()
            },
        ),
    ];
    let mut cases = Vec::new();
    let Some(m) = Mount::with(&[], |p| {
        let mut w = Writer::create(p).unwrap();
        for d in DType::V01 {
            let (le, _, _) = values(d);
            for (s, o) in &storages {
                w.add(&format!("{s}/{}", d.name()), d, &[3, 4], &le, o)
                    .unwrap();
            }
        }
        w.finish().unwrap();
    }) else {
        return;
    };
    for d in DType::V01 {
        let (_, vals, bits) = values(d);
        for (s, _) in &storages {
            let rel = format!("{s}/{}", d.name());
            cases.push(json!({
                "path": m.path(&rel),
                "sidecar": m.path(&format!("{rel}.json")),
                "dtype": d.name(),
                "numpy": support::numpy(d),
                "shape": [3, 4],
                "values": vals,
                "bits": bits,
            }));
        }
    }
    run_python(&py, &m, FROMFILE, &json!({ "cases": cases }));
    assert_eq!(m.stat_u64("errors"), 0);
}

const MEMMAP: &str = r#"
import json, sys
import numpy as np

spec = json.load(open(sys.argv[1]))
n = spec["n"]
want = np.arange(n, dtype=np.float32) * np.float32(0.5) - np.float32(7)
bad = []
for path in spec["paths"]:
    m = np.memmap(path, dtype="<f4", mode="r", shape=(n,))
    # Scattered slices first (page faults all over the file), then all of it.
    for lo in (n - 3, 12345, 0, n // 2 - 1, 77777):
        if not np.array_equal(m[lo:lo + 1000], want[lo:lo + 1000]):
            bad.append((path, "slice", lo))
    if not np.array_equal(m, want):
        bad.append((path, "whole", int(np.argmax(m != want))))
    if float(m[::4096].sum()) != float(want[::4096].sum()):
        bad.append((path, "strided sum"))
    del m
for b in bad:
    print("MISMATCH", *b)
print("OK" if not bad else "FAILED")
"#;

fn write_memmap_file(path: &Path, n: usize) {
    let le: Vec<u8> = (0..n)
        .flat_map(|i| (i as f32 * 0.5 - 7.0).to_le_bytes())
        .collect();
    let mut w = Writer::create(path).unwrap();
    w.add("raw", DType::Float32, &[n as u64], &le, &Options::default())
        .unwrap();
    let zstd = |frame_size, endian| Options {
        compression: Compression::Zstd {
            level: 1,
            frame_size,
        },
        endian,
        ..Options::default()
    };
    w.add(
        "zstd",
        DType::Float32,
        &[n as u64],
        &le,
        &zstd(64 << 10, Endian::Little),
    )
    .unwrap();
    w.add(
        "zstd_be_one_frame",
        DType::Float32,
        &[n as u64],
        &le,
        &zstd(0, Endian::Big),
    )
    .unwrap();
    w.finish().unwrap();
}

#[test]
fn numpy_memmap_of_raw_and_zstd_tensors() {
    let Some(py) = python() else {
        return;
    };
    const N: usize = 300_000;
    // Both ways tensor data reaches readers (raw tensors differ).
    for args in [&[][..], &["--page-cache"]] {
        let Some(m) = Mount::with(args, |p| write_memmap_file(p, N)) else {
            return;
        };
        let paths: Vec<_> = ["raw", "zstd", "zstd_be_one_frame"]
            .iter()
            .map(|t| m.path(t))
            .collect();
        run_python(&py, &m, MEMMAP, &json!({ "n": N, "paths": paths }));
        assert_eq!(m.stat_u64("errors"), 0, "{args:?}");
    }
}

#[test]
fn numpy_memmap_works_with_direct_io() {
    // Shared mmap of a FOPEN_DIRECT_IO file needs FUSE_DIRECT_IO_ALLOW_MMAP
    // (Linux 6.6+); on older kernels the daemon falls back to the page cache,
    // so np.memmap must work everywhere.
    let Some(py) = python() else {
        return;
    };
    const N: usize = 100_000;
    let Some(m) = Mount::with(&["--direct-io"], |p| write_memmap_file(p, N)) else {
        return;
    };
    let paths: Vec<_> = ["raw", "zstd"].iter().map(|t| m.path(t)).collect();
    run_python(&py, &m, MEMMAP, &json!({ "n": N, "paths": paths }));
    assert_eq!(m.stat_u64("errors"), 0);
}
