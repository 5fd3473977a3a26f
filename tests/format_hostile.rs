//! Hostile safetensors and GGUF files through the pipeline and the whole
//! mount, each with its exact outcome (`want`): refused at open and at
//! mount in one line naming the file and the problem, or mounted with the
//! bad tensor listed with its reason or failing (EIO) and every neighbour
//! reading whole. Never a panic or a hang (the harness kills a mount that
//! takes over 20 s).

mod support;

use ztensor_mount::formats::{self, Limits};

// ---- safetensors ------------------------------------------------------

fn st_raw(header_len: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut b = header_len.to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend_from_slice(data);
    b
}

fn st(header: &str, data: &[u8]) -> Vec<u8> {
    st_raw(header.len() as u64, header.as_bytes(), data)
}

fn safetensors_cases() -> Vec<(&'static str, Vec<u8>)> {
    let nested = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    vec![
        ("header length past the end", st_raw(1 << 20, b"{}", &[])),
        (
            "header length u64::MAX",
            st_raw(u64::MAX, b"{\"a\":1}", &[]),
        ),
        ("header JSON broken", st("{\"a\": {\"dtype\": ", &[0; 8])),
        ("header deeply nested", st(&nested, &[])),
        ("header not an object", st("[1, 2, 3]       ", &[])),
        (
            "offsets outside the data",
            st(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,1000]}}"#,
                &[0; 8],
            ),
        ),
        (
            "offsets reversed",
            st(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#,
                &[0; 8],
            ),
        ),
        (
            "offsets overlapping",
            st(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                &[0; 12],
            ),
        ),
        (
            "offsets not tiling (a gap)",
            st(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#,
                &[0; 12],
            ),
        ),
        (
            "dtype/shape/size mismatch",
            st(
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
        ),
        (
            "unknown dtype",
            st(
                r#"{"a":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}}"#,
                &[0; 3],
            ),
        ),
        (
            "truncated file",
            st(
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                &[0; 8],
            ),
        ),
        (
            "shape product overflows",
            st(
                r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
        ),
        (
            "duplicate key aliasing",
            st(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                &[0; 8],
            ),
        ),
        (
            "__metadata__ not strings",
            st(
                r#"{"__metadata__":{"k":[1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
                &[1],
            ),
        ),
        (
            "negative dimension",
            st(
                r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
                &[1],
            ),
        ),
        (
            "bool bytes not 0/1",
            st(
                r#"{"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#,
                &[7, 1, 5, 6],
            ),
        ),
    ]
}

// ---- GGUF -------------------------------------------------------------

struct Gguf(Vec<u8>);

impl Gguf {
    fn new(version: u32, tensors: u64, kvs: u64) -> Gguf {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(tensors.to_le_bytes());
        b.extend(kvs.to_le_bytes());
        Gguf(b)
    }
    fn str(mut self, s: &str) -> Self {
        self.0.extend((s.len() as u64).to_le_bytes());
        self.0.extend(s.as_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    /// A tensor info: name, dims (ggml order), type, offset.
    fn info(self, name: &str, dims: &[u64], ty: u32, off: u64) -> Self {
        let mut g = self.str(name).u32(dims.len() as u32);
        for d in dims {
            g = g.u64(*d);
        }
        g.u32(ty).u64(off)
    }
    /// Pads to 32 and appends `data`.
    fn data(mut self, data: &[u8]) -> Vec<u8> {
        while !self.0.len().is_multiple_of(32) {
            self.0.push(0);
        }
        self.0.extend_from_slice(data);
        self.0
    }
}

/// Three F32 [2] tensors whose info table lists "zeta", "alpha", "mid"
/// (at data offsets 0, 32, 64), so file order is not name order.
fn gguf_unsorted() -> Vec<u8> {
    let mut data = Vec::new();
    for v in [1f32, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0] {
        data.extend(v.to_le_bytes());
    }
    data.resize(64, 0);
    for v in [5f32, 6.0] {
        data.extend(v.to_le_bytes());
    }
    Gguf::new(3, 3, 0)
        .info("zeta", &[2], 0, 0)
        .info("alpha", &[2], 0, 32)
        .info("mid", &[2], 0, 64)
        .data(&data)
}

fn gguf_cases() -> Vec<(&'static str, Vec<u8>)> {
    let f32x2 = |name| Gguf::new(3, 1, 0).info(name, &[2], 0, 0);
    let mut nested = Gguf::new(3, 0, 1).str("k").u32(9);
    for _ in 0..40 {
        nested = nested.u32(9).u64(1);
    }
    vec![
        ("truncated header", b"GGUF\x03\x00\x00\x00\x01".to_vec()),
        ("version 1", Gguf::new(1, 0, 0).data(&[])),
        (
            "huge tensor count",
            Gguf::new(3, u64::MAX, 0).data(&[0; 64]),
        ),
        ("huge kv count", Gguf::new(3, 0, 1 << 60).data(&[0; 64])),
        (
            "huge string length",
            Gguf::new(3, 0, 1).u64(u64::MAX - 3).data(&[0; 64]),
        ),
        (
            "huge array count",
            Gguf::new(3, 0, 1)
                .str("k")
                .u32(9)
                .u32(0)
                .u64(1 << 62)
                .data(&[]),
        ),
        (
            "unknown value type",
            Gguf::new(3, 0, 1).str("k").u32(99).data(&[0; 8]),
        ),
        ("arrays nested 40 deep", nested.data(&[])),
        (
            "unknown ggml type",
            Gguf::new(3, 1, 0).info("a", &[2], 99, 0).data(&[0; 64]),
        ),
        ("tensor past the end", f32x2("a").data(&[0; 4])),
        (
            "tensor offset huge",
            Gguf::new(3, 1, 0)
                .info("a", &[2], 0, u64::MAX - 2)
                .data(&[0; 8]),
        ),
        (
            "tensors overlapping",
            Gguf::new(3, 2, 0)
                .info("a", &[4], 0, 0)
                .info("b", &[4], 0, 8)
                .data(&[0; 32]),
        ),
        (
            "tensors at the same bytes",
            Gguf::new(3, 2, 0)
                .info("a", &[4], 0, 0)
                .info("b", &[4], 0, 0)
                .data(&[0; 16]),
        ),
        (
            "too many dims",
            Gguf::new(3, 1, 0).info("a", &[1; 100], 0, 0).data(&[0; 8]),
        ),
        (
            "alignment not a power of two",
            Gguf::new(3, 0, 1)
                .str("general.alignment")
                .u32(4)
                .u32(3)
                .data(&[]),
        ),
        (
            // 64, then 32, in a file laid out at 64: the last would move the
            // tensor onto the padding.
            "a key given twice",
            Gguf::new(3, 0, 2)
                .str("general.alignment")
                .u32(4)
                .u32(64)
                .str("general.alignment")
                .u32(4)
                .u32(32)
                .data(&[]),
        ),
        (
            "quantized row not whole blocks",
            Gguf::new(3, 1, 0).info("q", &[31], 8, 0).data(&[0; 64]),
        ),
        (
            "shape product overflows",
            Gguf::new(3, 1, 0)
                .info("a", &[1 << 32, 1 << 32, 16], 0, 0)
                .data(&[0; 8]),
        ),
        (
            "duplicate tensor names",
            Gguf::new(3, 2, 0)
                .info("a", &[2], 0, 0)
                .info("a", &[2], 0, 8)
                .data(&[0; 16]),
        ),
        (
            "a string value not UTF-8",
            Gguf::new(3, 0, 1)
                .str("tokenizer.ggml.tokens")
                .u32(8)
                .u64(4)
                .u32(0xffff_fffe)
                .data(&[]),
        ),
        (
            "a tensor name not UTF-8",
            Gguf::new(3, 1, 0)
                .u64(4)
                .u32(0xffff_fffe)
                .u32(1)
                .u64(2)
                .u32(0)
                .u64(0)
                .data(&[0; 8]),
        ),
        (
            "invalid UTF-8 name",
            Gguf::new(3, 0, 1)
                .u64(4)
                .u32(0xffff_ffff)
                .u32(4)
                .u32(7)
                .data(&[0; 8]),
        ),
    ]
}

/// What a hostile file must give, exactly.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// Refused at open and at mount: one line naming the file and
    /// containing these words.
    Refused(&'static str),
    /// Mounts; the tensor is listed, not served, its reason containing
    /// these words; every other tensor reads whole.
    Listed(&'static str, &'static str),
    /// Mounts; reading the tensor fails with EIO; every other tensor reads
    /// whole.
    Eio(&'static str),
}

/// The outcome each case of `safetensors_cases` and `gguf_cases` must have.
fn want(what: &str) -> Want {
    use Want::*;
    match what {
        // safetensors
        "header length past the end" => Refused("truncated safetensors file"),
        "header length u64::MAX" => Refused("no format's magic or header found"),
        "header JSON broken" => Refused("header is not a JSON object"),
        "header deeply nested" => Refused("recursion limit exceeded"),
        "header not an object" => Refused("no format's magic or header found"),
        "offsets outside the data" => {
            Refused("data_offsets [0,1000] are not [begin, end] within the 8 bytes of data")
        }
        "offsets reversed" => Refused("data_offsets [8,0] are not [begin, end]"),
        "offsets overlapping" => Refused("its bytes [4, 12) overlap another tensor's"),
        "offsets not tiling (a gap)" => Refused("a gap of [4, 8) before it"),
        "dtype/shape/size mismatch" => Refused("holds 8 bytes but F32 of shape [3] is 12"),
        "unknown dtype" => Listed("a", "safetensors dtype \"F6_E3M2\" has no element type"),
        "truncated file" => {
            Refused("data_offsets [0,16] are not [begin, end] within the 8 bytes of data")
        }
        "__metadata__ not strings" => Refused("__metadata__[\"k\"] is not a string"),
        "negative dimension" => Refused("a dimension of its shape is not a non-negative integer"),
        "bool bytes not 0/1" => Eio("a"),
        "duplicate key aliasing" => Refused("named twice in the header"),
        // both formats
        "shape product overflows" => Refused("overflow"),
        // GGUF
        "truncated header" => Refused("GGUF header: a length of 8 bytes at 8 runs past the file"),
        "version 1" => Refused("GGUF version 1 is not read"),
        "huge tensor count" => Refused("gguf: header counts exceed file size"),
        // Its zeros read as empty keys: the second is refused first.
        "huge kv count" => Refused("GGUF header: the key \"\" is given twice"),
        "huge string length" => Refused("a length of 18446744073709551612 bytes at 32 runs past"),
        "huge array count" => Refused("a length of 4611686018427387904 bytes at 49 runs past"),
        "unknown value type" => Refused("unknown GGUF value type 99"),
        "arrays nested 40 deep" => Refused("arrays nested too deeply"),
        "unknown ggml type" => {
            Refused("tensor \"a\" is of ggml type 99, which this version does not read")
        }
        "tensor past the end" => Refused("tensor \"a\" extends past end of file"),
        "tensor offset huge" => Refused("gguf tensor offset: 64 + 18446744073709551613 overflows"),
        "tensors overlapping" => {
            Refused("tensor ranges overlap at 96 and 104: tensors \"a\" and \"b\"")
        }
        "tensors at the same bytes" => {
            Refused("tensor \"b\": its bytes [96, 112) are those of tensor \"a\" too")
        }
        "too many dims" => Refused("tensor \"a\" has 100 dims"),
        "alignment not a power of two" => Refused("general.alignment must be a power-of-two"),
        "a key given twice" => Refused("GGUF header: the key \"general.alignment\" is given twice"),
        "quantized row not whole blocks" => {
            Refused("tensor \"q\": fastest dim 31 not divisible by block size 32")
        }
        "duplicate tensor names" => Refused("duplicate tensor name \"a\""),
        "invalid UTF-8 name" => Refused("GGUF header: the key at byte 32 is not UTF-8"),
        "a tensor name not UTF-8" => {
            Refused("GGUF header: the name of tensor 0 (at byte 32) is not UTF-8")
        }
        "a string value not UTF-8" => Refused(
            "GGUF header: the value of key \"tokenizer.ggml.tokens\": the string at byte 65 is not UTF-8",
        ),
        other => panic!("no expected outcome for the case {other:?}"),
    }
}

/// One hostile file through `formats::open` and, when `m` is given, the
/// mount: the outcome must be `want(what)`. Returns what went wrong.
fn check(
    m: Option<&mut support::Mount>,
    dir: &std::path::Path,
    what: &str,
    bytes: &[u8],
    i: usize,
) -> Result<(), String> {
    let path = dir.join(format!("hostile-{i}"));
    std::fs::write(&path, bytes).unwrap();
    let label = path.display().to_string();
    let want = want(what);
    // The pipeline.
    match (formats::open(&path, Limits::default()), want) {
        (Err(e), Want::Refused(words)) => {
            let line = e.to_string();
            if !(line.starts_with(&label) && !line.contains('\n') && line.contains(words)) {
                return Err(format!(
                    "{what}: refused as {line:?}, want one line with {words:?}"
                ));
            }
        }
        (Err(e), w) => return Err(format!("{what}: refused ({e}), want {w:?}")),
        (Ok(_), Want::Refused(words)) => {
            return Err(format!("{what}: opened, want refused with {words:?}"));
        }
        (Ok(o), Want::Listed(name, words)) => {
            let why = o.catalog.get(name).map(|t| t.parts.as_ref().err().cloned());
            match why {
                Some(Some(why)) if why.contains(words) => {}
                other => {
                    return Err(format!(
                        "{what}: {name} is {other:?}, want listed with {words:?}"
                    ));
                }
            }
        }
        (Ok(_), Want::Eio(_)) => {}
    }
    let Some(m) = m else {
        return Ok(());
    };
    let r = m.run(&path, &[]);
    if !r.ok() {
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.is_empty()).collect();
        return match want {
            Want::Refused(words)
                if lines.len() == 1 && lines[0].contains(&label) && lines[0].contains(words) =>
            {
                Ok(())
            }
            w => Err(format!(
                "{what}: mount refused with {:?}, want {w:?}",
                r.stderr
            )),
        };
    }
    let mut wrong = Vec::new();
    if let Want::Refused(words) = want {
        wrong.push(format!("{what}: mounted, want refused with {words:?}"));
    }
    let index = m.index();
    for t in index["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let rel = t["path"].as_str().unwrap_or("");
        let got = std::fs::read(m.path(rel));
        match want {
            Want::Listed(n, words) if n == name => {
                let why = t["unsupported_reason"].as_str().unwrap_or("");
                if t["supported"] != false
                    || !why.contains(words)
                    || std::fs::metadata(m.path(name)).is_ok()
                {
                    wrong.push(format!("{what}: {name} not listed with {words:?}: {t}"));
                }
            }
            Want::Eio(n) if n == name => {
                if got.as_ref().map_err(|e| e.raw_os_error()).err() != Some(Some(libc::EIO)) {
                    wrong.push(format!("{what}: {name} read as {got:?}, want EIO"));
                }
            }
            _ => match got {
                Ok(b) if Some(b.len() as u64) == t["nbytes"].as_u64() => {}
                other => wrong.push(format!("{what}: {name} read as {other:?}, want whole")),
            },
        }
    }
    m.unmount_ok();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

fn run_all(cases: Vec<(&'static str, Vec<u8>)>) {
    let dir = tempfile::tempdir().unwrap();
    let mut m = support::Mount::scratch();
    let wrong: Vec<String> = cases
        .iter()
        .enumerate()
        .filter_map(|(i, (what, bytes))| check(m.as_mut(), dir.path(), what, bytes, i).err())
        .collect();
    assert!(
        wrong.is_empty(),
        "{} cases wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn hostile_safetensors() {
    run_all(safetensors_cases());
}

#[test]
fn hostile_gguf() {
    run_all(gguf_cases());
}

/// The bool check: a safetensors BOOL tensor of bytes other than 0/1 fails
/// on read, with its neighbour right.
#[test]
fn bool_bytes_are_checked_neighbours_serve() {
    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let (_, bytes) = safetensors_cases()
        .into_iter()
        .find(|(w, _)| *w == "bool bytes not 0/1")
        .unwrap();
    let path = m.scratch_path("bool.safetensors");
    std::fs::write(&path, bytes).unwrap();
    m.mount(&path, &[]);
    let err = std::fs::read(m.path("a")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert_eq!(std::fs::read(m.path("b")).unwrap(), [5, 6]);
    m.unmount_ok();
}

/// A tensor of a dtype with no element type here (`F6_E2M3`, `F6_E3M2`,
/// or one safetensors adds later) is listed with the reason and not
/// served; its neighbours are. Its range still counts for the tiling rule.
#[test]
fn a_tensor_of_an_unknown_dtype_is_listed_and_the_rest_served() {
    let header = r#"{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[8,11]},"c":{"dtype":"U8","shape":[3],"data_offsets":[11,14]},"d":{"dtype":"F7_NEW","shape":[1],"data_offsets":[14,15]}}"#;
    let data: Vec<u8> = (0..15u8).collect();
    let bytes = st(header, &data);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let opened = formats::open(&path, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let cat = &opened.catalog;
    let names: Vec<&str> = cat.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert_eq!(cat.attributes["k"], "v");
    for (n, dt) in [("b", "F6_E2M3"), ("d", "F7_NEW")] {
        let t = cat.get(n).unwrap();
        assert_eq!(t.dtype, dt);
        let why = t.parts.as_ref().unwrap_err();
        assert!(why.contains(dt) && why.contains("no element type"), "{why}");
    }
    let data_layer = support::data::serve(opened, dir.path(), 1 << 20);
    let read = |n: &str| {
        let ti = support::data::tensor_index(data_layer.catalog(), n);
        data_layer.read(ti, 0, 0, 64).map(|b| b.to_vec())
    };
    assert_eq!(read("a").unwrap(), (0..8u8).collect::<Vec<_>>());
    assert_eq!(read("c").unwrap(), [11, 12, 13]);

    // The same range overlapping a neighbour: refused, whatever its dtype.
    let overlapping = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[6,9]}}"#;
    std::fs::write(&path, st(overlapping, &[0; 9])).unwrap();
    let e = formats::open(&path, Limits::default())
        .err()
        .expect("refused");
    assert!(e.to_string().contains("overlap"), "{e}");

    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let path = m.scratch_path("mixed.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    m.mount(&path, &[]);
    assert_eq!(m.read("a"), (0..8u8).collect::<Vec<_>>());
    assert_eq!(m.read("c"), [11, 12, 13]);
    let side = m.json("b.json");
    assert_eq!(side["supported"], false);
    assert_eq!(side["dtype"], "F6_E2M3");
    assert!(
        side["unsupported_reason"]
            .as_str()
            .unwrap()
            .contains("F6_E2M3"),
        "{side}"
    );
    assert!(std::fs::metadata(m.path("b")).is_err());
    let log = m.log_text();
    assert!(
        log.contains("\"b\"") && log.contains("F6_E2M3"),
        "the log lacks the reason:\n{log}"
    );
    m.unmount_ok();
}

/// GGUF tensors come in the order of the file's tensor-info table, in the
/// catalog, `.ztensor/index.json`, `info` and a directory listing.
#[test]
fn gguf_tensors_come_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("unsorted.gguf");
    std::fs::write(&path, gguf_unsorted()).unwrap();
    let want = ["zeta", "alpha", "mid"];
    let opened = formats::open(&path, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = opened
        .catalog
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(names, want);
    let data = support::data::serve(opened, dir.path(), 1 << 20);
    let alpha = support::data::tensor_index(data.catalog(), "alpha");
    assert_eq!(
        data.read(alpha, 0, 0, 64).map(|b| b.to_vec()).unwrap(),
        [3f32.to_le_bytes(), 4f32.to_le_bytes()].concat()
    );
    let out = std::process::Command::new(support::bin())
        .arg("info")
        .arg(&path)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<&str> = info
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, want, "info --json");

    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let path = m.scratch_path("unsorted.gguf");
    std::fs::write(&path, gguf_unsorted()).unwrap();
    m.mount(&path, &[]);
    let index = m.index();
    let listed: Vec<&str> = index["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(listed, want, "index.json");
    let files: Vec<String> = std::fs::read_dir(&m.mp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && !n.ends_with(".json"))
        .collect();
    assert_eq!(files, want, "readdir");
    assert_eq!(
        m.read("mid"),
        [5f32.to_le_bytes(), 6f32.to_le_bytes()].concat()
    );
    m.unmount_ok();
}

/// Two GGUF tensors claiming the same bytes: the file is refused in one
/// line (by `ztensor-compat`), as an overlapping safetensors or
/// deathtensors file is.
#[test]
fn gguf_tensors_sharing_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("alias.gguf");
    for (what, second_at, dims) in [("same start", 0, 2), ("inside", 32, 4)] {
        let bytes = Gguf::new(3, 2, 0)
            .info("a", &[16], 0, 0)
            .info("b", &[dims], 0, second_at)
            .data(&[0; 64]);
        std::fs::write(&path, bytes).unwrap();
        let e = formats::open(&path, Limits::default())
            .err()
            .unwrap_or_else(|| panic!("{what}: aliasing tensors were let through"));
        let line = e.to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("overlap"), "{what}: {line}");
        // The crate gives offsets only; the tensors are named after them.
        assert!(
            line.ends_with(": tensors \"a\" and \"b\""),
            "{what}: {line}"
        );
        assert!(line.starts_with(&path.display().to_string()), "{line}");
    }
    // Touching, not sharing: served.
    let bytes = Gguf::new(3, 2, 0)
        .info("a", &[8], 0, 0)
        .info("b", &[8], 0, 32)
        .data(&[0; 64]);
    std::fs::write(&path, bytes).unwrap();
    formats::open(&path, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
}

/// A shard index naming a file outside its directory is refused.
#[test]
fn shard_index_cannot_escape_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let ix = dir.path().join("m.safetensors.index.json");
    std::fs::write(&ix, r#"{"weight_map":{"a":"../etc/passwd"}}"#).unwrap();
    let e = formats::open(&ix, Limits::default()).err().unwrap();
    assert!(
        e.to_string()
            .contains("not a plain file name beside the index (no `/`, `\\` or control character)"),
        "{e}"
    );
    // A control character: a URL parser drops a newline, so over HTTP
    // `m\n.safetensors` would be another file; named escaped.
    std::fs::write(&ix, r#"{"weight_map":{"a":"m\n\u001b.safetensors"}}"#).unwrap();
    let e = formats::open(&ix, Limits::default()).err().unwrap();
    assert!(
        e.to_string().ends_with(
            r#"weight_map["a"] names "m\n\u{1b}.safetensors", not a plain file name beside the index (no `/`, `\` or control character)"#
        ),
        "{e}"
    );
    // `./NAME` is the file beside it, as loaders join it to the folder.
    let header = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header);
    st.extend_from_slice(&1.5f32.to_le_bytes());
    std::fs::write(dir.path().join("s.safetensors"), st).unwrap();
    std::fs::write(&ix, r#"{"weight_map":{"a":"./s.safetensors"}}"#).unwrap();
    let o = formats::open(&ix, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    let a = o.catalog.get("a").unwrap();
    assert!(a.parts.is_ok());
    assert_eq!(a.meta.to_map()["shard"], "s.safetensors");
}

/// GGUF split file `i` of `n`: one F32 [4] tensor `t{i}` of the value `i`.
fn gguf_split(dir: &std::path::Path, i: u32, n: u32, tensor: &str) {
    let data: Vec<u8> = [i as f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    let bytes = Gguf::new(3, 1, 2)
        .str("split.no")
        .u32(4)
        .u32(i - 1)
        .str("split.count")
        .u32(4)
        .u32(n)
        .info(tensor, &[4], 0, 0)
        .data(&data);
    std::fs::write(dir.join(format!("m-{i:05}-of-{n:05}.gguf")), bytes).unwrap();
}

/// A GGUF split set whose second file is missing, or is another split's:
/// its tensors cannot be named (only that file's header names them), so
/// the file itself is listed with the reason, never dropped without a
/// word (the set was served as if it held only the other files' tensors).
#[test]
fn a_gguf_split_file_that_cannot_be_read_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    for i in 1..=3 {
        gguf_split(dir.path(), i, 3, &format!("t{i}"));
    }
    let first = dir.path().join("m-00001-of-00003.gguf");
    let second = dir.path().join("m-00002-of-00003.gguf");
    let names = |o: &formats::Opened| -> Vec<String> {
        o.catalog.tensors.iter().map(|t| t.name.clone()).collect()
    };
    let o = formats::open(&first, Limits::default()).unwrap();
    assert_eq!(names(&o), ["t1", "t2", "t3"]);

    let listed = "m-00002-of-00003.gguf (unusable shard)";
    std::fs::remove_file(&second).unwrap();
    let o = formats::open(&first, Limits::default()).unwrap();
    assert_eq!(names(&o), ["t1", listed, "t3"]);
    let why = o.catalog.get(listed).unwrap().parts.clone().unwrap_err();
    assert_eq!(
        why,
        format!(
            "shard unusable, its tensors cannot be listed: {}: cannot open: \
             No such file or directory (os error 2)",
            second.display()
        )
    );

    // The third file in the second's place, and the second in the third's.
    gguf_split(dir.path(), 2, 3, "t2");
    let third = dir.path().join("m-00003-of-00003.gguf");
    let tmp = dir.path().join("tmp");
    std::fs::rename(&second, &tmp).unwrap();
    std::fs::rename(&third, &second).unwrap();
    std::fs::rename(&tmp, &third).unwrap();
    let o = formats::open(&first, Limits::default()).unwrap();
    assert_eq!(
        names(&o),
        ["t1", listed, "m-00003-of-00003.gguf (unusable shard)"]
    );
    assert_eq!(
        o.catalog.get(listed).unwrap().parts.clone().unwrap_err(),
        format!(
            "shard unusable, its tensors cannot be listed: {}: its header says split 3 of 3, \
             expected 2 of 3",
            second.display()
        )
    );

    // Through a mount: listed in the index with the reason, t1 served.
    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    m.mount(&first, &[]);
    let index = m.index();
    let t: Vec<&serde_json::Value> = index["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == listed)
        .collect();
    assert_eq!(t.len(), 1, "{index}");
    assert_eq!(t[0]["supported"], false);
    assert!(
        t[0]["unsupported_reason"]
            .as_str()
            .unwrap()
            .contains("its header says split 3 of 3, expected 2 of 3"),
        "{}",
        t[0]
    );
    assert_eq!(
        m.read("t1"),
        [1f32; 4]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
    );
    m.unmount_ok();
}

#[test]
fn a_sharded_set_past_the_open_file_limit_is_refused_naming_the_limit() {
    // 40 shards, each held open (twice) while mounted, under a limit of 48
    // descriptors: refused in one line that says which limit to raise.
    let Some(mut m) = support::Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("set");
    std::fs::create_dir(&dir).unwrap();
    let mut map = serde_json::Map::new();
    for i in 0..40 {
        let name = format!("model-{i:05}-of-00040.safetensors");
        let header =
            format!("{{\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}}}");
        std::fs::write(dir.join(&name), st(&header, &[i as u8])).unwrap();
        map.insert(format!("t{i}"), name.into());
    }
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(&index, serde_json::json!({ "weight_map": map }).to_string()).unwrap();
    let r = m.run_under(&["prlimit", "--nofile=48:48"], &index, &[]);
    assert!(!r.ok(), "mounted: {}", m.log_text());
    let err = r.stderr.trim_end();
    assert!(
        err.ends_with(
            "Too many open files (os error 24) (this process may hold 48 open files: raise the \
             limit with ulimit -n)"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // With room for them all, it mounts.
    m.mount(&index, &[]);
    assert_eq!(m.read("t39"), [39]);
    m.unmount_ok();
}

/// An index naming more shard files than one mount serves (1023 beside
/// it) is refused in one line before any shard is opened: none of these
/// exist, and a hostile index of thousands over HTTP held a descriptor and
/// memory for each and took minutes to open.
#[test]
fn an_index_of_more_shards_than_a_mount_serves_is_refused_before_opening_any() {
    let dir = tempfile::tempdir().unwrap();
    let ix = dir.path().join("model.safetensors.index.json");
    let index = |n: usize| {
        let map: serde_json::Map<String, serde_json::Value> = (0..n)
            .map(|i| (format!("t{i}"), format!("s{i}.safetensors").into()))
            .collect();
        std::fs::write(&ix, serde_json::json!({ "weight_map": map }).to_string()).unwrap();
    };
    index(1024);
    let e = formats::open(&ix, Limits::default()).err().unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: it names 1024 shard files: more than 1023, the most one mount serves",
            ix.display()
        )
    );
    // At the limit, it opens: each missing shard's tensors are listed.
    index(1023);
    let o = formats::open(&ix, Limits::default()).unwrap();
    assert_eq!(o.catalog.tensors.len(), 1023);
}

/// A safetensors shard of `n` one-byte tensors `t{i}` (value i % 256),
/// and an index putting all of them in it.
fn one_shard_of(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let mut header = String::from("{");
    for i in 0..n {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[{i},{}]}}",
            i + 1
        ));
    }
    header.push('}');
    let data: Vec<u8> = (0..n).map(|i| i as u8).collect();
    std::fs::write(dir.join("s.safetensors"), st(&header, &data)).unwrap();
    let map: serde_json::Map<String, serde_json::Value> = (0..n)
        .map(|i| (format!("t{i}"), "s.safetensors".into()))
        .collect();
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(&index, serde_json::json!({ "weight_map": map }).to_string()).unwrap();
    index
}

/// An index of many tensors is joined in time linear in them: one of
/// 200 000 tensors in one shard took 151 s to open with the release build
/// (each tensor looked up in a list of them all), the shard alone 8 s.
/// Now the index takes about what its shard takes; one naming a shard of
/// its own for each tensor is refused at once, by their number.
#[test]
fn an_index_of_many_tensors_opens_in_linear_time() {
    let dir = tempfile::tempdir().unwrap();
    let n = 100_000;
    let index = one_shard_of(dir.path(), n);
    let timed = |p: &std::path::Path| {
        let t = std::time::Instant::now();
        let o = formats::open(p, Limits::default()).unwrap();
        (t.elapsed(), o)
    };
    let (alone, o) = timed(&dir.path().join("s.safetensors"));
    assert_eq!(o.catalog.tensors.len(), n);
    drop(o);
    let (joined, o) = timed(&index);
    assert_eq!(o.catalog.tensors.len(), n);
    assert!(o.catalog.tensors.iter().all(|t| t.parts.is_ok()));
    drop(o);
    eprintln!("{n} tensors: the shard alone {alone:?}, through the index {joined:?}");
    assert!(
        joined <= alone * 3 + std::time::Duration::from_secs(2),
        "the index took {joined:?}, its shard alone {alone:?}"
    );

    // A shard of its own for each tensor, none there.
    let map: serde_json::Map<String, serde_json::Value> = (0..n)
        .map(|i| (format!("t{i}"), format!("s{i}.safetensors").into()))
        .collect();
    std::fs::write(&index, serde_json::json!({ "weight_map": map }).to_string()).unwrap();
    let t = std::time::Instant::now();
    let e = formats::open(&index, Limits::default()).err().unwrap();
    let many = t.elapsed();
    assert!(
        e.to_string()
            .ends_with("it names 100000 shard files: more than 1023, the most one mount serves"),
        "{e}"
    );
    eprintln!("{n} shards, refused: {many:?}");
    assert!(
        many <= alone * 3 + std::time::Duration::from_secs(2),
        "{n} shards took {many:?} to refuse"
    );
}

/// An index is held to `--index-memory` before it is parsed and before
/// its set is laid out: one of 1.5 million tensors (39 MB) was refused
/// under a 60 MiB limit only once all of it was built, after 39 s at a
/// peak of 1.8 GB. Now: one line, at once, by its size; or, small enough
/// to parse, by its count of tensors.
#[test]
fn index_memory_bounds_a_shard_index_before_it_is_laid_out() {
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    let n = 200_000;
    let map: serde_json::Map<String, serde_json::Value> = (0..n)
        .map(|i| (format!("t{i}"), "s.safetensors".into()))
        .collect();
    let text = serde_json::json!({ "weight_map": map }).to_string();
    std::fs::write(&index, &text).unwrap();
    let label = index.display().to_string();
    let open = |limit: u64| {
        let t = std::time::Instant::now();
        let e = formats::open(
            &index,
            Limits {
                index_memory: limit,
            },
        )
        .err()
        .unwrap_or_else(|| panic!("opened under --index-memory {limit}"));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        e.to_string()
    };
    assert_eq!(
        open(16 << 20),
        format!(
            "{label}: an index of {} would take about {} in memory parsed, more than the 16 MiB \
             allowed (--index-memory)",
            ztensor_mount::size::bytes(text.len() as u64),
            ztensor_mount::size::bytes(text.len() as u64 * 8)
        )
    );
    let e = open(64 << 20);
    assert!(
        e.starts_with(&format!(
            "{label}: its index of {n} tensors would take about "
        )) && e.ends_with(
            "in memory (catalog, tree and views), more than the 64 MiB allowed (--index-memory)"
        ),
        "{e}"
    );
}

/// A safetensors header over `--index-memory` is refused naming the
/// option (it said only "over the 32-byte limit", which reads as the
/// format's own).
#[test]
fn a_safetensors_header_over_index_memory_names_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    std::fs::write(&path, st(header, &[0; 4])).unwrap();
    let e = formats::open(&path, Limits { index_memory: 32 })
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: header length {} is over the 32 bytes allowed (--index-memory)",
            path.display(),
            header.len()
        )
    );
}

/// A file of no format read here is refused saying what its first bytes
/// look like, as the README promises (it said only that no magic was
/// found, the same for an empty file, a text file and a gzip stream).
#[test]
fn an_unknown_file_says_what_its_bytes_look_like() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[u8], &str); 9] = [
        (b"", "the file is empty"),
        (
            b" {\"metadata\": {}}",
            "it starts with text: \" {\\\"metadata\\\": {}\"... (JSON without the \"weight_map\" \
             that a Hugging Face index of shards has)",
        ),
        (
            b"hello world, this is text\n",
            "it starts with text: \"hello world, thi\"...",
        ),
        (
            b"\x1f\x8b\x08\x00rest",
            "it looks like a gzip stream: decompress it first",
        ),
        (
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00",
            "its first bytes are 89 50 4e 47 0d 0a 1a 0a 00 00 00 0d 49 48 44 52...",
        ),
        (
            &st_raw(u64::MAX, b"{}", &[]),
            "its first bytes are ff ff ff ff ff ff ff ff 7b 7d",
        ),
        (b"ab", "it starts with text: \"ab\""),
        (
            b"\n<!DOCTYPE html><html><head><title>401",
            "it is an HTML page, not tensor data (an error or login page saved in place of the \
             file?): \"\\n<!DOCTYPE html>\"...",
        ),
        (
            b"ZTEN0009\0\0\0\0",
            "it starts like a zTensor file, but \"ZTEN0009\" is no version this build reads \
             (\"ZTEN0001\": v0.1, \"ZTEN1000\": v1; v2 starts with \"\\x89ZT2\")",
        ),
    ];
    for (i, (bytes, says)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("unknown-{i}"));
        std::fs::write(&path, bytes).unwrap();
        let e = formats::open(&path, Limits::default()).err().unwrap();
        let line = e.to_string();
        assert!(
            line.starts_with(&path.display().to_string())
                && line.contains("no format's magic or header found; ")
                && line.ends_with(says)
                && !line.contains('\n'),
            "{line}"
        );
    }
}
