//! npz archives as numpy writes them (and one `.npy` header another
//! writer might give), read by `src/formats/npz.rs` through a real mount:
//! every one-byte type whatever its byte-order character, big-endian
//! members served little-endian, deflated members inflated once, straight
//! into the cache.
//!
//! The interpreter is `$ZT_PYTHON` (default `.venv/bin/python3`) with
//! numpy. Without it the test prints a note and passes, except under
//! `CI=true`, where it fails.

mod support;

use support::python::Python;

fn python() -> Option<Python> {
    Python::from_env().require(
        "Python with numpy (scripts/setup.sh)",
        "import numpy",
        |_| Ok(()),
    )
}

const WRITE: &str = r#"
import io, os, sys, zipfile
import numpy as np
d = sys.argv[1]
def npy(descr, shape, data, fortran=False):
    h = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)
    h = h + " " * (63 - (10 + len(h)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + data
with zipfile.ZipFile(os.path.join(d, "types.npz"), "w") as z:
    z.writestr("lt_u1.npy", npy("<u1", "(3,)", bytes([1, 2, 250])))
    z.writestr("eq_i1.npy", npy("=i1", "(2,)", bytes([255, 7])))
    z.writestr("lt_b1.npy", npy("<b1", "(2,)", bytes([1, 0])))
    buf = io.BytesIO()
    np.save(buf, np.array([1, -2, 3], dtype=">i4"))
    z.writestr("be_i4.npy", buf.getvalue())
    buf = io.BytesIO()
    np.save(buf, np.array([0.5, 1.5], dtype="<f4"))
    z.writestr("deflated_f4.npy", buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    buf = io.BytesIO()
    np.save(buf, np.array(["x"]))
    z.writestr("str.npy", buf.getvalue())
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype="<i2").reshape(2, 3).T)
    z.writestr("fortran.npy", buf.getvalue())
    # Headers other writers give: descrs numpy.dtype reads (no byte
    # order, character codes, a name), and Fortran order where it is C
    # order's bytes.
    z.writestr("bare_f4.npy", npy("f4", "(2,)", np.array([0.5, 1.5], "<f4").tobytes()))
    z.writestr("char_bool.npy", npy("?", "(2,)", bytes([0, 1])))
    z.writestr("char_h.npy", npy("h", "(2,)", np.array([-3, 4], "<i2").tobytes()))
    z.writestr("char_be_q.npy", npy(">q", "(1,)", np.array([-5], ">i8").tobytes()))
    z.writestr("char_F.npy", npy("F", "(1,)", np.array([1 + 2j], "<c8").tobytes()))
    z.writestr("name_f4.npy", npy("float32", "(1,)", np.array([2.5], "<f4").tobytes()))
    row = np.array([1, 2, 3], "<i2").tobytes()
    z.writestr("fortran_1d.npy", npy("<i2", "(3,)", row, True))
    z.writestr("fortran_row.npy", npy("<i2", "(1, 3)", row, True))
with np.load(os.path.join(d, "types.npz")) as f:
    want = {"bare_f4": [0.5, 1.5], "char_bool": [False, True], "char_h": [-3, 4],
            "char_be_q": [-5], "char_F": [1 + 2j], "name_f4": [2.5],
            "fortran_1d": [1, 2, 3], "fortran_row": [[1, 2, 3]]}
    for k, v in want.items():
        assert f[k].tolist() == v, (k, f[k])
np.savez_compressed(os.path.join(d, "big.npz"), big=np.arange(int(sys.argv[2]), dtype="<u4"))
print("OK")
"#;

#[test]
fn every_one_byte_descr_and_big_endian_members_read() {
    let Some(py) = python() else {
        return;
    };
    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("npz");
    std::fs::create_dir(&dir).unwrap();
    py.run_ok(
        &[
            "-c".as_ref(),
            WRITE.as_ref(),
            dir.as_os_str(),
            "16".as_ref(),
        ],
        std::time::Duration::from_secs(60),
        "writing the npz files",
    );
    m.mount(&dir.join("types.npz"), &[]);
    assert_eq!(m.read("lt_u1"), [1, 2, 250]);
    assert_eq!(m.read("eq_i1"), [255, 7]);
    assert_eq!(m.read("lt_b1"), [1, 0]);
    let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    assert_eq!(m.read("be_i4"), i32s(&[1, -2, 3]));
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    assert_eq!(m.read("deflated_f4"), f32s(&[0.5, 1.5]));
    assert_eq!(m.read("bare_f4"), f32s(&[0.5, 1.5]));
    assert_eq!(m.read("char_bool"), [0, 1]);
    assert_eq!(m.read("char_h"), [253, 255, 4, 0]);
    assert_eq!(m.read("char_be_q"), (-5i64).to_le_bytes());
    assert_eq!(m.read("char_F"), f32s(&[1.0, 2.0]));
    assert_eq!(m.read("name_f4"), f32s(&[2.5]));
    assert_eq!(m.read("fortran_1d"), [1, 0, 2, 0, 3, 0]);
    assert_eq!(m.read("fortran_row"), [1, 0, 2, 0, 3, 0]);
    assert_eq!(m.json("char_F.json")["dtype"], "complex64");
    assert_eq!(
        m.json("fortran_row.json")["shape"],
        serde_json::json!([1, 3])
    );
    assert_eq!(m.json("lt_u1.json")["dtype"], "uint8");
    assert_eq!(m.json("be_i4.json")["format_dtype"], ">i4");
    for (name, why) in [("str", "has no element type"), ("fortran", "Fortran")] {
        let side = m.json(&format!("{name}.json"));
        assert_eq!(side["supported"], false, "{name}: {side}");
        let reason = side["unsupported_reason"].as_str().unwrap_or("");
        assert!(reason.contains(why), "{name}: {reason}");
        assert!(std::fs::metadata(m.path(name)).is_err(), "{name}");
    }
    m.unmount_ok();
}

/// A deflated member of 96 MiB is inflated once, into its cache entry:
/// reading it raises the daemon's peak by the member, not twice that.
#[test]
fn a_deflated_member_is_inflated_straight_into_the_cache() {
    let Some(py) = python() else {
        return;
    };
    let _serial = support::serial();
    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("npz");
    std::fs::create_dir(&dir).unwrap();
    let n: u64 = 24 << 20;
    py.run_ok(
        &[
            "-c".as_ref(),
            WRITE.as_ref(),
            dir.as_os_str(),
            n.to_string().as_ref(),
        ],
        std::time::Duration::from_secs(120),
        "writing the npz files",
    );
    m.mount(&dir.join("big.npz"), &["--cache-size", "256M"]);
    let pid = m.pid.expect("daemon pid");
    let before = support::status_kib(pid, "VmRSS:").unwrap() << 10;
    let got = m.read("big");
    assert_eq!(got.len() as u64, 4 * n);
    for (k, c) in got.chunks_exact(4).enumerate().step_by(4099) {
        assert_eq!(c, (k as u32).to_le_bytes(), "element {k}");
    }
    let hwm = support::status_kib(pid, "VmHWM:").unwrap() << 10;
    let member = 4 * n;
    eprintln!(
        "daemon: {} MiB before the read, peak {} MiB, member {} MiB",
        before >> 20,
        hwm >> 20,
        member >> 20
    );
    assert!(
        hwm <= before + member + (40 << 20),
        "peak {hwm} bytes: the {member}-byte member was held more than once (from {before})"
    );
    m.unmount_ok();
}

/// A deflated member of 200 MiB under a 64 MiB cache: not refused, made
/// once into a spill file under `--cache-dir` as it is inflated, never
/// whole in memory: the daemon peaks within the cache plus 64 MiB.
#[test]
fn a_deflated_member_larger_than_the_cache_is_spilled() {
    let Some(py) = python() else {
        return;
    };
    let _serial = support::serial();
    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("npz");
    std::fs::create_dir(&dir).unwrap();
    let spill = m.scratch_path("spill");
    std::fs::create_dir(&spill).unwrap();
    let n: u64 = 50 << 20;
    py.run_ok(
        &[
            "-c".as_ref(),
            WRITE.as_ref(),
            dir.as_os_str(),
            n.to_string().as_ref(),
        ],
        std::time::Duration::from_secs(180),
        "writing the npz files",
    );
    let spill_arg = spill.to_string_lossy().into_owned();
    m.mount(
        &dir.join("big.npz"),
        &["--cache-size", "64M", "--cache-dir", &spill_arg],
    );
    let pid = m.pid.expect("daemon pid");
    // Read in 1 MiB pieces, checking every element as it comes.
    use std::io::Read;
    let mut f = std::fs::File::open(m.path("big")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut k = 0u64;
    loop {
        let got = f.read(&mut buf).unwrap();
        if got == 0 {
            break;
        }
        assert_eq!(got % 4, 0, "a read of {got} bytes");
        for c in buf[..got].chunks_exact(4) {
            assert_eq!(c, (k as u32).to_le_bytes(), "element {k}");
            k += 1;
        }
    }
    assert_eq!(k, n, "elements read");
    drop(f);
    let hwm = support::status_kib(pid, "VmHWM:").unwrap() << 10;
    eprintln!(
        "daemon peak {} MiB for a {} MiB member, cache 64 MiB",
        hwm >> 20,
        (4 * n) >> 20
    );
    assert!(hwm <= (64 << 20) + (64 << 20), "peak {hwm} bytes");
    assert!(
        m.log_text().contains("spilling to"),
        "no spill in the log:\n{}",
        m.log_text()
    );
    assert_eq!(m.stat_u64("spilled_tensors"), 1);
    m.unmount_ok();
}
