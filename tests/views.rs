//! The views through a real mount, read by the libraries they are made for:
//! numpy (`np.load`, with and without `mmap_mode`), zarr-python 3 and
//! TensorStore (the `.zarr` group), safetensors (`model.safetensors`), and
//! the `user.ztensor.*` xattrs; each compared with the tensor's own file.
//! `tests/python/check_views.py` does the reading.
//!
//! The interpreter is `$ZT_PYTHON`, else `.venv/bin/python3`; without it (or
//! its zarr, tensorstore, safetensors) the test fails under CI=true.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use support::Mount;
use support::python::Python;
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{DType, Endian};

fn python() -> Option<Python> {
    Python::from_env().require(
        "python with zarr, tensorstore, safetensors",
        "import numpy, zarr, tensorstore, safetensors",
        |_| Ok(()),
    )
}

/// Runs check_views.py over the mount; `expect` gives the least number of
/// tensors each reader must check.
fn check(py: &Python, m: &Mount, expect: serde_json::Value) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_views.py");
    let ep = m.scratch_path("expect.json");
    std::fs::write(&ep, expect.to_string()).unwrap();
    py.run_ok(
        &[script.as_ref(), m.path("").as_ref(), ep.as_ref()],
        Duration::from_secs(120),
        "check_views",
    );
}

/// Every v0.1 dtype raw and zstd (in frames), big-endian, a scalar, a
/// zero-length dimension, and a sparse tensor (which has no views).
fn write_model(path: &Path) {
    let mut w = Writer::create(path).unwrap();
    let zstd = Options {
        compression: Compression::Zstd {
            level: 3,
            frame_size: 4096,
        },
        ..Options::default()
    };
    let be = Options {
        endian: Endian::Big,
        ..Options::default()
    };
    for d in DType::V01 {
        let n = 3 * 5 * 7;
        let bytes = support::pattern(d.size() as usize, n, d.size() as u8);
        let bytes = if d == DType::Bool {
            bytes.iter().map(|b| b & 1).collect()
        } else {
            bytes
        };
        for (tag, o) in [("raw", &Options::default()), ("zstd", &zstd), ("be", &be)] {
            let name = format!("{}/{tag}", d.name());
            w.add(&name, d, &[3, 5, 7], &bytes, o).unwrap();
        }
    }
    // Names the tree escapes (`a/%2E%2E/b`, `%2E/c`) beside the names a
    // URL's decoding of those escapes would give: each reader must open
    // its own tensor (a `file://` kvstore decodes them; see views.md).
    for (i, name) in ["b", "a/../b", "c", "./c"].iter().enumerate() {
        let bytes = support::pattern(4, 6, 10 + i as u8);
        w.add(name, DType::Int32, &[6], &bytes, &Options::default())
            .unwrap();
    }
    w.add(
        "scalar",
        DType::Float64,
        &[],
        &2.5f64.to_le_bytes(),
        &Options::default(),
    )
    .unwrap();
    w.add("empty", DType::Float32, &[0, 4], &[], &Options::default())
        .unwrap();
    let big: Vec<u8> = support::compressible(7, 3 << 20);
    w.add("big/frames", DType::Float32, &[3 << 18], &big, &zstd)
        .unwrap();
    w.add_csr(
        "sparse",
        DType::Float32,
        [2, 3],
        &[0, 1, 2],
        &[0, 2],
        &[0, 0, 128, 63, 0, 0, 0, 64],
        &Options::default(),
    )
    .unwrap();
    w.finish().unwrap();
}

#[test]
fn numpy_zarr_tensorstore_and_safetensors_open_a_mounted_zt_v01() {
    let Some(py) = python() else { return };
    let Some(m) = Mount::with(&["--xattrs"], write_model) else {
        return;
    };
    // 13 dtypes x 3 storages, four with escaped names or their twins, the
    // scalar, the empty one and the big one.
    let dense = 13 * 3 + 4 + 3;
    let index = m.index();
    let sparse = index["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "sparse")
        .unwrap();
    assert!(
        sparse.get("views").is_none(),
        "a sparse tensor has no views"
    );
    check(
        &py,
        &m,
        json!({
            "npy": dense,
            "zarr": dense - 3,        // zarr-python has no bfloat16
            "tensorstore": dense,
            "safetensors": dense,
            "xattr": dense,
        }),
    );
    // Views are hidden: the top level lists the model as it is.
    let top: Vec<String> = std::fs::read_dir(m.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(top.contains(&"float32".to_string()) && top.contains(&"scalar".to_string()));
}

#[test]
fn a_v2_file_opens_through_every_view() {
    let Some(py) = python() else { return };
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/zt_v2/corpus/valid/canonical-basic.zt");
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    m.mount(&src, &["-o", "xattrs"]);
    let n = m.index()["tensors"].as_array().unwrap().len();
    assert!(n > 0);
    check(
        &py,
        &m,
        json!({"npy": 1, "tensorstore": 1, "safetensors": 1, "xattr": 1}),
    );
}

/// numpy reads up to 64 dimensions, zarr-python and TensorStore up to 32.
/// A tensor of more gets no view that its reader would only refuse, and
/// its sidecar names only the views it has; those open. (The safetensors
/// view, off here, has no such limit.)
#[test]
fn a_tensor_of_more_dimensions_than_a_reader_opens_gets_no_view_for_it() {
    let Some(py) = python() else { return };
    let ranks = [32, 33, 64, 65];
    let Some(m) = Mount::with(&["--xattrs", "--views", "npy,zarr"], |p| {
        let mut w = Writer::create(p).unwrap();
        for r in ranks {
            let mut shape = vec![1u64; r];
            shape[r - 1] = 3;
            w.add(
                &format!("r{r}"),
                DType::Uint8,
                &shape,
                &[r as u8, 1, 2],
                &Options::default(),
            )
            .unwrap();
        }
        w.finish().unwrap();
    }) else {
        return;
    };
    for r in ranks {
        let side = m.json(&format!("r{r}.json"));
        // A tensor in no view has no "views".
        let views = side["views"].as_object().cloned().unwrap_or_default();
        assert_eq!(views.contains_key("npy"), r <= 64, "r{r}: {views:?}");
        assert_eq!(views.contains_key("zarr"), r <= 32, "r{r}: {views:?}");
        assert_eq!(m.path(&format!(".npy/r{r}.npy")).exists(), r <= 64, "r{r}");
        assert_eq!(m.path(&format!(".zarr/r{r}")).exists(), r <= 32, "r{r}");
    }
    check(
        &py,
        &m,
        json!({"npy": 3, "zarr": 1, "tensorstore": 1, "xattr": 3}),
    );
}

#[test]
fn views_can_be_turned_off() {
    let Some(m) = Mount::with(&["--views", "npy"], write_model) else {
        return;
    };
    assert!(m.path(".npy/scalar.npy").is_file());
    assert!(!m.path(".zarr").exists());
    assert!(!m.path(".safetensors").exists());
    let npy = m.read(".npy/scalar.npy");
    assert_eq!(npy.len() % 64, 8, "a 64-aligned header, then 8 bytes");
    assert_eq!(&npy[npy.len() - 8..], &2.5f64.to_le_bytes());
    // xattrs are off unless asked for: the list is empty, as on a file
    // system without them (`tar --xattrs` warns of nothing), and getxattr
    // is not supported, so that `ls -l` makes no round trips for them.
    let path = std::ffi::CString::new(m.path("scalar").as_os_str().as_encoded_bytes()).unwrap();
    let mut names = [0u8; 256];
    // SAFETY: `path` is NUL-terminated and `names` is a buffer of the
    // length given, both alive for the call.
    let n = unsafe { libc::listxattr(path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    let errno = std::io::Error::last_os_error();
    assert_eq!(n, 0, "an empty list by default ({errno})");
    let name = c"user.ztensor.name";
    // SAFETY: as above; `name` is NUL-terminated and a null buffer of
    // length 0 asks only for the size.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!((n, errno), (-1, Some(libc::EOPNOTSUPP)));
}

#[test]
fn gguf_and_deathtensors_files_open_through_every_view() {
    let Some(py) = Python::from_env().require(
        "python with gguf, deathtensors, zarr, tensorstore, safetensors",
        "import gguf, deathtensors, zarr, tensorstore, safetensors",
        |_| Ok(()),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    py.run_script("write_view_sources.py", dir.path());
    for (file, dense) in [("model.gguf", 3), ("model.deathtensors", 4)] {
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        m.mount(&dir.path().join(file), &["--xattrs"]);
        check(
            &py,
            &m,
            json!({"npy": dense, "tensorstore": dense, "safetensors": dense, "xattr": dense}),
        );
        m.unmount_ok();
    }
}
