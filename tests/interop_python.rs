//! Interoperability with the Python package `ztensor==0.1.4`:
//! `tests/python/write_reference.py OUT.zt` writes a file with it and
//! `OUT.zt.expected.json` (`[{name, dtype, shape, data_hex}]`, the
//! little-endian element bytes); our reader must give exactly those bytes.
//!
//! The interpreter is `$ZT_PYTHON`, by default `.venv/bin/python3` in the
//! crate. When it or the package is missing the test prints a note and
//! passes, except under `CI=true`, where it fails.

mod support;

use support::data::{hex_decode, json_shape};
use support::python::{self, Python};
use ztensor_mount::formats::zt_v01::ZtFile;

const PACKAGE_VERSION: &str = "0.1.4";

#[test]
fn python_package_files_read_right() {
    let Some(python) = Python::from_env().require(
        "Python with ztensor==0.1.4, numpy and ml_dtypes (create it with \
         `python3 -m venv .venv && .venv/bin/pip install ztensor==0.1.4` \
         or point ZT_PYTHON at an interpreter that has it)",
        "import importlib.metadata as m, ztensor, numpy, ml_dtypes; \
         print(m.version('ztensor'))",
        |v| python::version_is("ztensor", PACKAGE_VERSION, v),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("python.zt");
    python.run_script("write_reference.py", &out);
    let expected = python::read_json(&dir.path().join("python.zt.expected.json"));
    let expected = expected.as_array().expect("a JSON array");
    assert!(!expected.is_empty(), "the script wrote no tensors");

    let f = ZtFile::open(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        f.catalog().len(),
        expected.len(),
        "tensors in the file vs expected.json"
    );
    for item in expected {
        let name = item["name"].as_str().expect("name");
        let t = f
            .catalog()
            .get(name)
            .unwrap_or_else(|| panic!("tensor {name:?} missing"));
        assert_eq!(
            Some(t.dtype_name.as_str()),
            item["dtype"].as_str(),
            "{name}: dtype"
        );
        let shape = json_shape(&item["shape"]);
        assert_eq!(t.shape, shape, "{name}: shape");
        let data = hex_decode(item["data_hex"].as_str().expect("data_hex"));
        let parts = f.read_all(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parts, vec![data], "{name}: bytes");
    }
}
