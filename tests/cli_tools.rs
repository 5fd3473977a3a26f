//! `pack`, `info` and `cat` as a user runs them: `.npy` files in, a `.zt`
//! out whose tensors read back as the same little-endian bytes; hostile
//! `.npy` headers give one line, exit 1 and leave no half-written file.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{bin, run_with_timeout};

/// A version-1 `.npy` file: `header` is the dict text, padded here.
fn write_npy(path: &Path, header: &str, data: &[u8]) {
    let mut h = header.as_bytes().to_vec();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(b' ');
    }
    h.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

fn cat(zt: &Path, tensor: &str) -> Vec<u8> {
    cat_with(zt, tensor, &[])
}

fn cat_part(zt: &Path, tensor: &str, part: &str) -> Vec<u8> {
    cat_with(zt, tensor, &["--part", part])
}

fn cat_with(zt: &Path, tensor: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(bin())
        .arg("cat")
        .arg(zt)
        .arg(tensor)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cat {tensor} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn packed_arrays_read_back_as_little_endian_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let values: Vec<i32> = (0..5000).map(|i| i * 7919 - 1_000_000).collect();
    let le: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let be: Vec<u8> = values.iter().flat_map(|v| v.to_be_bytes()).collect();
    let f: Vec<u8> = (0..300)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let a = dir.path().join("a.npy");
    let b = dir.path().join("b.npy");
    let c = dir.path().join("c.npy");
    write_npy(
        &a,
        "{'descr': '<i4', 'fortran_order': False, 'shape': (50, 100), }",
        &le,
    );
    write_npy(
        &b,
        "{'descr': '>i4', 'fortran_order': False, 'shape': (5000,), }",
        &be,
    );
    write_npy(
        &c,
        "{'descr': '<f4', 'fortran_order': False, 'shape': (300,), }",
        &f,
    );
    // Flags go before the inputs: `--zstd` must not take `a=...` as its level.
    for extra in [
        &[][..],
        &["--zstd"],
        &["--zstd=9", "--frame-size", "4K"],
        &["--big-endian", "--checksum", "sha256"],
    ] {
        let zt = dir.path().join("out.zt");
        let r = run_with_timeout(
            Command::new(bin())
                .arg("pack")
                .arg(&zt)
                .args(extra)
                .arg(format!("a={}", a.display()))
                .arg(format!("b={}", b.display()))
                .arg(format!("half/c={}", c.display())),
            Duration::from_secs(30),
        );
        assert!(r.ok(), "pack {extra:?}: {r:?}");
        assert_eq!(cat(&zt, "a"), le, "{extra:?}");
        assert_eq!(cat(&zt, "b"), le, "{extra:?}");
        assert_eq!(cat(&zt, "half/c"), f, "{extra:?}");
        let r = run_with_timeout(
            Command::new(bin()).args(["info", "--json"]).arg(&zt),
            Duration::from_secs(30),
        );
        assert!(r.ok(), "info: {r:?}");
        let info: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        let a_info = &info[0];
        assert_eq!(a_info["name"], "a");
        assert_eq!(a_info["dtype"], "int32");
        assert_eq!(a_info["shape"], serde_json::json!([50, 100]));
        let endian = if extra.contains(&"--big-endian") {
            "big"
        } else {
            "little"
        };
        assert_eq!(a_info["data_endianness"], endian, "{extra:?}");
        let zstd = extra.iter().any(|x| x.starts_with("--zstd"));
        let encoding = if zstd { "zstd" } else { "raw" };
        assert_eq!(a_info["encoding"], encoding, "{extra:?}");
        assert!(!dir.path().join("out.zt.partial").exists());
        std::fs::remove_file(&zt).unwrap();
    }
    // What a reader would refuse, or read wrong, is not written.
    let a_in = format!("a={}", a.display());
    let nameless = format!("={}", a.display());
    let twice = format!("c={}", c.display());
    let relabel = format!("a={}:float8_e4m3fn", a.display());
    for (args, code, why) in [
        (vec![nameless.as_str()], 2, "expected NAME=PATH.npy"),
        (
            vec![relabel.as_str()],
            1,
            "\"float8_e4m3fn\" is not a zTensor v0.1 dtype",
        ),
        (vec![a.to_str().unwrap()], 2, "expected NAME=PATH.npy"),
        (vec![&a_in, &twice, &twice], 1, "c: the name is used twice"),
        (
            vec!["--zstd", "--big-endian", &a_in],
            2,
            "cannot be used with",
        ),
    ] {
        let zt = dir.path().join("refused.zt");
        let r = run_with_timeout(
            Command::new(bin()).arg("pack").arg(&zt).args(&args),
            Duration::from_secs(30),
        );
        assert_eq!(r.status.code(), Some(code), "{args:?}: {r:?}");
        assert!(r.stderr.contains(why), "{args:?}: {r:?}");
        assert!(!zt.exists() && !dir.path().join("refused.zt.partial").exists());
    }
    // An existing output is replaced only with --force.
    let out = dir.path().join("kept.zt");
    std::fs::write(&out, b"mine").unwrap();
    let pack = |extra: &[&str]| {
        run_with_timeout(
            Command::new(bin())
                .arg("pack")
                .arg(&out)
                .args(extra)
                .arg(&a_in),
            Duration::from_secs(30),
        )
    };
    let r = pack(&[]);
    assert_eq!(r.status.code(), Some(2), "{r:?}");
    assert!(r.stderr.contains("--force"), "{r:?}");
    assert_eq!(std::fs::read(&out).unwrap(), b"mine");
    let r = pack(&["--force"]);
    assert!(r.ok(), "{r:?}");
    assert!(r.stderr.contains("(1 tensor)"), "{r:?}");
    assert_ne!(std::fs::read(&out).unwrap(), b"mine");
}

#[test]
fn hostile_npy_headers_fail_with_one_line_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.npy");
    write_npy(
        &good,
        "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }",
        &[0; 8],
    );
    let cases: &[(&str, &[u8])] = &[
        (
            "{'descr': '', 'fortran_order': False, 'shape': (1,), }",
            &[0; 4],
        ),
        (
            "{'descr': '\u{e9}f4', 'fortran_order': False, 'shape': (1,), }",
            &[0; 4],
        ),
        (
            "{'descr': '>', 'fortran_order': False, 'shape': (1,), }",
            &[0; 4],
        ),
        (
            "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
            &[0; 8],
        ),
        (
            "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
            &[0; 4],
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (x,), }",
            &[0; 4],
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
            &[0; 4],
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }",
            &[0; 4],
        ),
        ("{'fortran_order': False, 'shape': (1,), }", &[0; 4]),
    ];
    for (i, (header, data)) in cases.iter().enumerate() {
        let bad = dir.path().join(format!("bad{i}.npy"));
        write_npy(&bad, header, data);
        let zt = dir.path().join(format!("out{i}.zt"));
        let r = run_with_timeout(
            Command::new(bin())
                .arg("pack")
                .arg(&zt)
                .arg(format!("g={}", good.display()))
                .arg(format!("x={}", bad.display())),
            Duration::from_secs(30),
        );
        let err = r.stderr.trim_end();
        assert_eq!(r.status.code(), Some(1), "{header}: {r:?}");
        assert_eq!(err.lines().count(), 1, "{header}: {err:?}");
        assert!(err.starts_with("ztensor-mount pack: "), "{header}: {err:?}");
        assert!(!err.contains("panicked"), "{header}: {err:?}");
        assert!(!zt.exists(), "{header}: wrote {}", zt.display());
        let mut partial = zt.into_os_string();
        partial.push(".partial");
        assert!(!Path::new(&partial).exists(), "{header}: left {partial:?}");
    }
    // Not .npy at all.
    for (name, bytes) in [
        ("empty.npy", &b""[..]),
        ("text.npy", b"hello world, not numpy"),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let r = run_with_timeout(
            Command::new(bin())
                .arg("pack")
                .arg(dir.path().join("o.zt"))
                .arg(format!("x={}", p.display())),
            Duration::from_secs(30),
        );
        assert_eq!(r.status.code(), Some(1), "{name}: {r:?}");
        assert!(r.stderr.contains("not a .npy file"), "{name}: {r:?}");
    }
}

#[test]
fn cat_streams_big_endian_and_sparse_zstd_tensors_in_bounded_memory() {
    use std::io::Read;
    use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
    use ztensor_mount::formats::zt_v01::{DType, Endian};
    let dir = tempfile::tempdir().unwrap();
    let zt = dir.path().join("big.zt");
    let be = Options {
        compression: Compression::zstd(),
        endian: Endian::Big,
        ..Options::default()
    };
    let mut w = Writer::create(&zt).unwrap();
    // 1 GiB of the bytes 1,2,3,4 over and over (a swap shows in every
    // element): a few KiB compressed, more than the limit below decoded.
    const N: u64 = 1 << 30;
    const PAT: [u8; 4] = [1, 2, 3, 4];
    let mut input = Cycle {
        pat: PAT.repeat(1 << 18),
        at: 0,
    }
    .take(N);
    w.add_from("pattern", DType::Float32, &[N / 4], &mut input, &be)
        .unwrap();
    let values: Vec<u8> = (0..1000u32)
        .flat_map(|v| (v as f32).to_le_bytes())
        .collect();
    let indptr: Vec<u64> = (0..=10).map(|r| r * 100).collect();
    let indices: Vec<u64> = (0..1000).map(|i| (i * 7) % 50).collect();
    w.add_csr(
        "m",
        DType::Float32,
        [10, 50],
        &indptr,
        &indices,
        &values,
        &be,
    )
    .unwrap();
    w.finish().unwrap();
    let le64 = |v: &[u64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    assert_eq!(cat_part(&zt, "m", "indptr"), le64(&indptr));
    assert_eq!(cat_part(&zt, "m", "indices"), le64(&indices));
    assert_eq!(cat_part(&zt, "m", "values"), values);
    // Under a 512 MiB address-space limit: decoding it whole cannot work.
    let want = PAT.repeat((1 << 18) + 1);
    let total = cat_limited(&zt, &["pattern"], |at, bytes| {
        // Reads end on any byte: the pattern's phase is the offset's.
        let phase = (at % 4) as usize;
        assert!(
            bytes == &want[phase..phase + bytes.len()],
            "wrong byte near {at}"
        );
    });
    assert_eq!(total, N);
}

/// Runs `cat FILE ARGS` under a 512 MiB address-space limit, handing each
/// piece of its output (and where it starts) to `check`; the bytes out.
fn cat_limited(zt: &std::path::Path, args: &[&str], mut check: impl FnMut(u64, &[u8])) -> u64 {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(bin());
    child.arg("cat").arg(zt).args(args);
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setrlimit (async-signal-safe) on a value on its stack; it
    // allocates nothing and takes no lock.
    unsafe {
        child.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 512 << 20,
                rlim_max: 512 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = child
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let (mut total, mut buf) = (0u64, vec![0u8; 1 << 20]);
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        check(total, &buf[..n]);
        total += n as u64;
    }
    let res = child.wait_with_output().unwrap();
    assert!(
        res.status.success(),
        "cat under 512 MiB: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    total
}

/// Reads its pattern (a whole number of elements long) over and over.
struct Cycle {
    pat: Vec<u8>,
    at: usize,
}

impl std::io::Read for Cycle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.pat.len() - self.at);
        buf[..n].copy_from_slice(&self.pat[self.at..self.at + n]);
        self.at = (self.at + n) % self.pat.len();
        Ok(n)
    }
}

#[test]
fn cat_streams_a_huge_reference_coo_tensor_in_bounded_memory() {
    use ciborium::value::Value;
    use ztensor_mount::formats::zt_v01::writer::Writer;
    // Reference-form COO records (one u64 index, one uint8 value: 9 bytes)
    // in 512 frames of 9 MiB of zeros, each declaring its size: 4.5 GiB
    // decoded from a few hundred KiB. cat reads it as the mount does, a
    // frame at a time, and never holds it whole.
    let frame = zstd::bulk::compress(&vec![0u8; 9 << 20], 1).unwrap();
    let blob = frame.repeat(512);
    let dir = tempfile::tempdir().unwrap();
    let zt = dir.path().join("coo.zt");
    let mut w = Writer::create(&zt).unwrap();
    let t = |s: &str| Value::Text(s.into());
    w.add_blob(
        &blob,
        vec![
            (t("name"), t("t")),
            (t("dtype"), t("uint8")),
            (t("shape"), Value::Array(vec![Value::Integer(1000.into())])),
            (t("encoding"), t("zstd")),
            (t("layout"), t("sparsecoo")),
            (t("data_endianness"), t("little")),
        ],
    )
    .unwrap();
    w.finish().unwrap();
    let total = cat_limited(&zt, &["t", "--part", "values"], |at, bytes| {
        assert!(
            bytes.iter().all(|&b| b == 0),
            "a value that is not 0 near {at}"
        );
    });
    assert_eq!(total, (512 * (9 << 20)) / 9, "one value per 9-byte record");
}

#[test]
fn cat_into_a_pipe_its_reader_closes_ends_quietly_by_sigpipe() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use ztensor_mount::formats::zt_v01::DType;
    use ztensor_mount::formats::zt_v01::writer::{Options, Writer};
    // `cat ... | head -c 4096`: the reader goes away after 4 KiB of 16 MiB.
    // As GNU cat, the tool ends by SIGPIPE, saying nothing (the shell
    // reports the pipeline's status from `head`).
    let dir = tempfile::tempdir().unwrap();
    let zt = dir.path().join("m.zt");
    let mut w = Writer::create(&zt).unwrap();
    let data = vec![7u8; 16 << 20];
    w.add(
        "w",
        DType::Uint8,
        &[data.len() as u64],
        &data,
        &Options::default(),
    )
    .unwrap();
    w.finish().unwrap();
    let mut child = Command::new(bin())
        .arg("cat")
        .arg(&zt)
        .arg("w")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = vec![0u8; 4096];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    assert!(head.iter().all(|&b| b == 7));
    // The pipe's read end is closed here (dropped above).
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {said}",
        out.status
    );
    assert!(said.is_empty(), "said: {said}");
}

#[test]
fn cat_finds_a_tensor_by_the_name_info_prints() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("names.safetensors");
    let mut header = r#"{"nul\u0000x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"nl\nname":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}}"#.to_string();
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(&[7, 8, 9]);
    std::fs::write(&p, f).unwrap();
    // A NUL no argument can hold, and a newline, as `info` prints them.
    let info = Command::new(bin()).arg("info").arg(&p).output().unwrap();
    let listed = String::from_utf8_lossy(&info.stdout);
    assert!(
        listed.contains("nul%00x") && listed.contains("nl%0Aname"),
        "{listed}"
    );
    assert_eq!(cat(&p, "nul%00x"), [7, 8]);
    assert_eq!(cat(&p, "nl%0Aname"), [9]);
    assert_eq!(cat(&p, "nl\nname"), [9]);
    let out = Command::new(bin())
        .arg("cat")
        .arg(&p)
        .arg("nope")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no tensor named \"nope\" (`ztensor-mount info "),
        "{err}"
    );
}
