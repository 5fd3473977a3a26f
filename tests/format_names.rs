//! A NUL byte in a tensor name, in files the formats' own writers made
//! (safetensors, GGUF, ONNX all write one): the name cannot be a path, so
//! the tree escapes it (`a\0b` becomes `a%00b`, with the reason in the
//! sidecar) and it never shadows the tensor `a` beside it. Checked through
//! a real mount: the listing, each file's bytes, the sidecars, `info`.
//!
//! The interpreter is `$ZT_PYTHON` (default `.venv/bin/python3`) with numpy,
//! safetensors, gguf and onnx (`scripts/setup.sh`). Without them the test
//! prints a note and passes, except under `CI=true`, where it fails.

mod support;

use support::python::Python;

const WRITE: &str = r#"
import os, sys
import numpy as np
d = sys.argv[1]
ab = np.array([1, 2], dtype=np.float32)
a = np.array([3], dtype=np.float32)
from safetensors.numpy import save_file
save_file({"a\0b": ab, "a": a}, os.path.join(d, "nul.safetensors"))
import gguf
w = gguf.GGUFWriter(os.path.join(d, "nul.gguf"), "test")
w.add_tensor("a\0b", ab)
w.add_tensor("a", a)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
import onnx
from onnx import helper, numpy_helper
inits = [numpy_helper.from_array(ab, "a\0b"), numpy_helper.from_array(a, "a")]
onnx.save(helper.make_model(helper.make_graph([], "g", [], [], initializer=inits)),
          os.path.join(d, "nul.onnx"))
print("OK")
"#;

#[test]
fn a_nul_byte_in_a_name_is_escaped_and_shadows_nothing() {
    let Some(py) = Python::from_env().require(
        "Python with numpy, safetensors, gguf and onnx (scripts/setup.sh)",
        "import numpy, safetensors, gguf, onnx",
        |_| Ok(()),
    ) else {
        return;
    };
    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("files");
    std::fs::create_dir(&dir).unwrap();
    py.run_ok(
        &["-c".as_ref(), WRITE.as_ref(), dir.as_os_str()],
        std::time::Duration::from_secs(60),
        "writing the files",
    );
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for file in ["nul.safetensors", "nul.gguf", "nul.onnx"] {
        let path = dir.join(file);
        m.mount(&path, &[]);
        let mut names: Vec<String> = std::fs::read_dir(&m.mp)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["a", "a%00b", "a%00b.json", "a.json"],
            "{file}: the listing"
        );
        assert_eq!(m.read("a"), f32s(&[3.0]), "{file}: a");
        assert_eq!(m.read("a%00b"), f32s(&[1.0, 2.0]), "{file}: a\\0b");
        let side = m.json("a%00b.json");
        assert_eq!(side["name"], "a\0b", "{file}");
        assert_eq!(side["path"], "a%00b", "{file}");
        let why = side["path_escaped_because"].as_str().unwrap_or("");
        assert!(why.contains("NUL byte"), "{file}: {side}");
        let side = m.json("a.json");
        assert_eq!(side["name"], "a", "{file}");
        assert!(side.get("path_escaped_because").is_none(), "{file}: {side}");
        m.unmount_ok();

        // `info` prints the name escaped the same way, on one line.
        let out = std::process::Command::new(support::bin())
            .arg("info")
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{file}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(!text.contains('\0'), "{file}: info printed a NUL:\n{text}");
        assert!(
            text.lines().any(|l| l.starts_with("a%00b ")),
            "{file}: info:\n{text}"
        );
    }
}

/// `info` escapes every control character of a name (a newline, an
/// escape sequence), so that one tensor is one line of the listing.
#[test]
fn info_escapes_control_characters_in_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctl.safetensors");
    let header = r#"{"x\ny":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"\u001b[2Jz":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(&[1, 2]);
    std::fs::write(&path, b).unwrap();
    let out = std::process::Command::new(support::bin())
        .arg("info")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\u{1b}'), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[2].starts_with("x%0Ay "), "{text}");
    assert!(lines[3].starts_with("%1B[2Jz "), "{text}");
}
