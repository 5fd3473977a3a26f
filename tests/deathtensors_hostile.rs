//! Hostile deathtensors files, built byte for byte in the real writer's
//! layout (see `src/formats/deathtensors.rs`): each is refused at open with
//! one line naming the file, or its reads fail (EIO through a mount) while
//! a neighbour that can be served still is. Never a panic or a hang.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use support::Mount;
use ztensor_mount::codec::digest::{Algorithm, compute};
use ztensor_mount::error::ErrorKind;
use ztensor_mount::formats::{self, Limits};
use ztensor_mount::serve::data::Data;

const COMPRESSED: u32 = 1;
const CHECKSUM: u32 = 2;

/// A file as the writer lays it out: prefix, header, NUL padding to 8,
/// blob, and with CHECKSUM the SHA-256 of everything after the prefix.
fn dt(flags: u32, header: impl AsRef<[u8]>, blob: &[u8]) -> Vec<u8> {
    let header = header.as_ref();
    let mut f = b"DTLEGION".to_vec();
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&flags.to_le_bytes());
    f.extend_from_slice(&(header.len() as u64).to_le_bytes());
    f.extend_from_slice(header);
    while !f.len().is_multiple_of(8) {
        f.push(0);
    }
    f.extend_from_slice(blob);
    if flags & CHECKSUM != 0
        && let ztensor_mount::catalog::Checksum::Sha256(d) = compute(Algorithm::Sha256, &f[24..])
    {
        f.extend_from_slice(&d);
    }
    f
}

/// A header of `(name, dtype, shape, [start, end])` tensors.
fn header(tensors: &[(&str, &str, &str, [u64; 2])], global: &str) -> String {
    let ts: Vec<String> = tensors
        .iter()
        .map(|(n, d, s, [a, b])| {
            format!(
                r#""{n}":{{"dtype":"{d}","shape":{s},"data_offsets":[{a},{b}],"metadata":{{}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"format":"deathtensors","format_version":1,"created_by":"test","global_metadata":{{{global}}},"tensors":{{{}}}}}"#,
        ts.join(",")
    )
}

/// Two F32 tensors of 4 elements: "a" then "b".
fn two() -> String {
    header(
        &[("a", "F32", "[4]", [0, 16]), ("b", "F32", "[4]", [16, 32])],
        "",
    )
}

fn blob32() -> Vec<u8> {
    (0..32u8).collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Opening fails with one line naming the file (and `kind`, if given).
fn refused(bytes: &[u8], kind: Option<ErrorKind>, says: &str) {
    refused_with(bytes, kind, says, Limits::default())
}

fn refused_with(bytes: &[u8], kind: Option<ErrorKind>, says: &str, limits: Limits) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "bad.deathtensors", bytes);
    let e = match formats::open(&p, limits) {
        Ok(_) => panic!("opened a file that says {says:?}"),
        Err(e) => e,
    };
    let line = e.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert!(line.starts_with(&p.display().to_string()), "{line}");
    assert!(line.contains(says), "expected {says:?} in: {line}");
    if let Some(k) = kind {
        assert_eq!(e.kind, k, "{line}");
    }
}

fn serve(path: &Path, dir: &Path) -> Arc<Data> {
    let o = formats::open(path, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    support::data::serve(o, dir, 8 << 20)
}

/// Tensor `name`'s bytes, in one read.
fn read(d: &Data, name: &str) -> Result<Vec<u8>, String> {
    let ti = support::data::tensor_index(d.catalog(), name);
    d.read(ti, 0, 0, 1 << 30)
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}

#[test]
fn the_well_formed_base_case_opens() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "ok.deathtensors",
        &dt(CHECKSUM, two(), &blob32()),
    );
    let d = serve(&p, dir.path());
    assert_eq!(read(&d, "b").unwrap(), (16..32u8).collect::<Vec<_>>());
}

#[test]
fn prefix_problems_are_refused() {
    refused(b"DTLEGION\x01\0\0\0", Some(ErrorKind::NotZtensor), "prefix");
    let mut f = dt(0, two(), &blob32());
    f[8] = 2;
    refused(&f, Some(ErrorKind::NotSupported), "version 2");
    refused(
        &dt(8, two(), &blob32()),
        Some(ErrorKind::NotSupported),
        "unknown flag bits 0x8",
    );
    refused(
        &dt(1 << 31, two(), &blob32()),
        Some(ErrorKind::NotSupported),
        "unknown flag",
    );
    refused(
        &dt(4, two(), &blob32()),
        Some(ErrorKind::NotSupported),
        "encrypted",
    );
    refused(
        &dt(4 | CHECKSUM, two(), &blob32()),
        Some(ErrorKind::NotSupported),
        "encrypted",
    );
}

#[test]
fn header_length_past_the_end_or_over_the_limit_is_refused() {
    let mut f = dt(0, two(), &blob32());
    let past = (f.len() as u64 - 24 + 1).to_le_bytes();
    f[16..24].copy_from_slice(&past);
    refused(&f, Some(ErrorKind::Index), "past the end");
    f[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    refused(&f, Some(ErrorKind::Index), "over the limit");
    f[16..24].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
    refused_with(
        &f,
        Some(ErrorKind::Index),
        "",
        Limits {
            index_memory: u64::MAX,
        },
    );
    let f = dt(0, two(), &blob32());
    refused_with(
        &f,
        Some(ErrorKind::Index),
        "over the limit",
        Limits { index_memory: 64 },
    );
}

#[test]
fn files_that_end_in_the_padding_or_the_footer_are_refused() {
    // Header of 3 bytes: padding to 32, and the file stops at 28.
    let mut f = dt(0, "{}x", &[]);
    f.truncate(28);
    refused(&f, Some(ErrorKind::Index), "ends inside the header padding");
    let f = dt(0, two(), &[]);
    let mut g = f.clone();
    g[12] = CHECKSUM as u8;
    g.extend_from_slice(&[0; 31]);
    refused(&g, Some(ErrorKind::Index), "or the footer");
}

#[test]
fn bad_json_is_refused() {
    refused(
        &dt(0, b"{\"format\":\"death\xfftensors\"}", &[]),
        Some(ErrorKind::Index),
        "not a deathtensors JSON header",
    );
    refused(&dt(0, "[1,2,3]", &[]), Some(ErrorKind::Index), "JSON");
    refused(
        &dt(0, two() + "xx", &blob32()),
        Some(ErrorKind::Index),
        "trailing",
    );
    refused(
        &dt(0, &two()[..40], &blob32()),
        Some(ErrorKind::Index),
        "EOF",
    );
    refused(
        &dt(
            0,
            two().replace("\"deathtensors\"", "\"safetensors\""),
            &blob32(),
        ),
        Some(ErrorKind::Index),
        "not \"deathtensors\"",
    );
    refused(
        &dt(
            0,
            two().replace("\"format_version\":1", "\"format_version\":2"),
            &blob32(),
        ),
        Some(ErrorKind::NotSupported),
        "format_version 2",
    );
    // Metadata values are strings, as the writer makes them.
    refused(
        &dt(0, header(&[], r#""k":{"a":1}"#), &[]),
        Some(ErrorKind::Index),
        "JSON",
    );
}

#[test]
fn deep_nesting_is_refused_or_skipped_never_recursed() {
    let n = 200_000;
    let deep = format!("{}{}", "[".repeat(n), "]".repeat(n));
    // In a known field it fails at the first bracket.
    refused(
        &dt(0, header(&[], &format!(r#""k":{deep}"#)), &[]),
        Some(ErrorKind::Index),
        "JSON",
    );
    refused(
        &dt(0, header(&[("a", "F32", &deep, [0, 0])], ""), &[]),
        Some(ErrorKind::Index),
        "JSON",
    );
    // In an unknown field serde_json skips it without recursion.
    let h = two().replacen('{', &format!(r#"{{"x":{deep},"#), 1);
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "deep.deathtensors", &dt(0, h, &blob32()));
    assert_eq!(
        formats::open(&p, Limits::default()).unwrap().catalog.len(),
        2
    );
}

#[test]
fn offsets_outside_the_blob_or_reversed_are_refused() {
    let h = header(
        &[("a", "F32", "[4]", [0, 16]), ("b", "F32", "[4]", [24, 40])],
        "",
    );
    refused(
        &dt(0, h, &blob32()),
        Some(ErrorKind::Placement),
        "run past the data blob (32 bytes)",
    );
    let h = header(&[("a", "F32", "[0]", [16, 0])], "");
    refused(&dt(0, h, &blob32()), Some(ErrorKind::Placement), "reversed");
    let h = header(&[("a", "U8", "[1]", [u64::MAX, u64::MAX])], "");
    refused(&dt(0, h, &blob32()), Some(ErrorKind::Size), "span 0");
    // The blob cut short: the second tensor runs past it.
    let f = dt(0, two(), &blob32()[..31]);
    refused(&f, Some(ErrorKind::Placement), "tensor \"b\"");
    // A checksummed file cut short loses its footer into the blob.
    let mut f = dt(CHECKSUM, two(), &blob32());
    f.truncate(f.len() - 1);
    refused(&f, Some(ErrorKind::Placement), "run past the data blob");
}

#[test]
fn dtype_shape_and_size_disagreements_are_refused() {
    let h = header(&[("a", "F32", "[5]", [0, 16])], "");
    refused(
        &dt(0, h, &blob32()),
        Some(ErrorKind::Size),
        "is 20 bytes but data_offsets [0, 16] span 16",
    );
    let h = header(&[("a", "F8", "[4]", [0, 4])], "");
    refused(
        &dt(0, h, &blob32()),
        Some(ErrorKind::Field),
        "unknown dtype \"F8\"",
    );
    let h = header(&[("a", "float32", "[4]", [0, 16])], "");
    refused(
        &dt(0, h, &blob32()),
        Some(ErrorKind::Field),
        "unknown dtype",
    );
    let h = header(&[("a", "C128", "[4294967296,4294967296]", [0, 16])], "");
    refused(&dt(0, h, &blob32()), Some(ErrorKind::Size), "overflows");
    let h = header(&[("a", "F32", "[-1]", [0, 16])], "");
    refused(&dt(0, h, &blob32()), Some(ErrorKind::Index), "JSON");
    let h = two().replace("[0,16]", "[0,16,32]");
    refused(&dt(0, h, &blob32()), Some(ErrorKind::Index), "JSON");
}

#[test]
fn overlaps_and_duplicates_are_refused() {
    let h = header(
        &[("a", "F32", "[4]", [0, 16]), ("b", "F32", "[4]", [12, 28])],
        "",
    );
    refused(&dt(0, h, &blob32()), Some(ErrorKind::Placement), "overlap");
    let h = header(
        &[("a", "F32", "[4]", [0, 16]), ("a", "F32", "[4]", [16, 32])],
        "",
    );
    refused(&dt(0, h, &blob32()), Some(ErrorKind::Duplicate), "twice");
    refused(
        &dt(0, header(&[], r#""k":"1","k":"2""#), &[]),
        Some(ErrorKind::Duplicate),
        "twice",
    );
}

#[test]
fn a_footer_mismatch_fails_every_read_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = dt(CHECKSUM, two(), &blob32());
    let n = f.len();
    f[n - 40] ^= 1; // in tensor "b"
    let p = write(dir.path(), "sum.deathtensors", &f);
    let d = serve(&p, dir.path());
    for t in ["a", "b"] {
        let e = read(&d, t).unwrap_err();
        assert!(e.contains("checksum mismatch"), "{e}");
    }
    // The header is covered too; the prefix is not (as the writer hashes).
    let mut f = dt(CHECKSUM, two(), &blob32());
    let at = f.windows(6).position(|w| w == b"\"test\"").unwrap();
    f[at + 1] = b'T'; // created_by "Test"
    let p = write(dir.path(), "sum2.deathtensors", &f);
    let d = serve(&p, dir.path());
    assert!(read(&d, "a").unwrap_err().contains("checksum mismatch"));
}

fn zstd_file(stream: &[u8], tensors: &[(&str, &str, &str, [u64; 2])]) -> Vec<u8> {
    dt(COMPRESSED, header(tensors, ""), stream)
}

#[test]
fn a_zstd_bomb_fails_at_the_declared_size() {
    let dir = tempfile::tempdir().unwrap();
    // Declares 32 bytes, decodes to 256 MiB.
    let bomb = zstd::encode_all(std::io::repeat(0).take_n(256 << 20), 19).unwrap();
    assert!(bomb.len() < 64 << 10);
    let f = zstd_file(
        &bomb,
        &[("a", "F32", "[4]", [0, 16]), ("b", "F32", "[4]", [16, 32])],
    );
    let p = write(dir.path(), "bomb.deathtensors", &f);
    let d = serve(&p, dir.path());
    let t = std::time::Instant::now();
    let e = read(&d, "a").unwrap_err();
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
    assert!(!e.contains('\n'), "{e}");
    assert!(e.contains("zstd data blob"), "{e}");
    // Logged (and listed in .ztensor/errors) naming the tensor read, not
    // only the stream the two share.
    let listed = String::from_utf8(d.errors_text()).unwrap();
    let line: serde_json::Value = serde_json::from_str(listed.trim_end()).unwrap();
    let logged = line["error"].as_str().unwrap();
    assert!(
        logged.contains(": tensor \"a\": the zstd data blob: "),
        "{logged}"
    );
}

trait TakeN: std::io::Read + Sized {
    fn take_n(self, n: u64) -> std::io::Take<Self> {
        self.take(n)
    }
}
impl<R: std::io::Read> TakeN for R {}

#[test]
fn garbage_short_or_truncated_zstd_fails_the_reads() {
    let dir = tempfile::tempdir().unwrap();
    let good = zstd::encode_all(&blob32()[..], 3).unwrap();
    let ts = [("a", "F32", "[4]", [0, 16]), ("b", "F32", "[4]", [16, 32])];
    // The well-formed one reads.
    let p = write(dir.path(), "z.deathtensors", &zstd_file(&good, &ts));
    assert_eq!(
        read(&serve(&p, dir.path()), "b").unwrap(),
        (16..32u8).collect::<Vec<_>>()
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", vec![0x55; 64]),
        ("truncated", good[..good.len() - 3].to_vec()),
        ("empty", Vec::new()),
        // Decodes to 16 bytes where the header wants 32.
        ("short", zstd::encode_all(&blob32()[..16], 3).unwrap()),
    ];
    for (what, stream) in cases {
        let p = write(
            dir.path(),
            &format!("{what}.deathtensors"),
            &zstd_file(&stream, &ts),
        );
        let d = serve(&p, dir.path());
        for t in ["a", "b"] {
            let e = read(&d, t).unwrap_err();
            assert!(!e.contains('\n'), "{what}: {e}");
        }
    }
}

/// An index and shards as `save_sharded` writes them: "a" in shard 1,
/// "b" in shard 2, each a checksummed file.
fn sharded(dir: &Path) -> PathBuf {
    let list = r#"[{"path": "m-00001-of-0002.deathtensors", "tensors": ["a"], "bytes": 16}, {"path": "m-00002-of-0002.deathtensors", "tensors": ["b"], "bytes": 16}]"#;
    let global = format!(
        r#""deathtensors.shard.count":"2","deathtensors.sharded":"true","deathtensors.shards":{}"#,
        serde_json::to_string(list).unwrap()
    );
    write(
        dir,
        "m-00001-of-0002.deathtensors",
        &dt(
            CHECKSUM,
            header(&[("a", "F32", "[4]", [0, 16])], ""),
            &blob32()[..16],
        ),
    );
    write(
        dir,
        "m-00002-of-0002.deathtensors",
        &dt(
            CHECKSUM,
            header(&[("b", "F32", "[4]", [0, 16])], ""),
            &blob32()[16..],
        ),
    );
    write(
        dir,
        "m.deathtensors",
        &dt(CHECKSUM, header(&[], &global), &[]),
    )
}

#[test]
fn a_missing_or_broken_shard_fails_only_its_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded(dir.path());
    let d = serve(&index, dir.path());
    assert_eq!(read(&d, "a").unwrap(), (0..16u8).collect::<Vec<_>>());
    assert_eq!(read(&d, "b").unwrap(), (16..32u8).collect::<Vec<_>>());

    // Missing: listed, with the reason; the neighbour reads.
    std::fs::remove_file(dir.path().join("m-00002-of-0002.deathtensors")).unwrap();
    let o = formats::open(&index, Limits::default()).unwrap();
    assert!(o.sources[2].is_none());
    let why = o.catalog.sources[2].unusable.clone().unwrap();
    assert!(why.contains("m-00002-of-0002.deathtensors"), "{why}");
    let b = o.catalog.get("b").unwrap();
    assert_eq!(
        b.parts.as_ref().unwrap_err(),
        &format!("shard unusable: {why}")
    );
    let d = serve(&index, dir.path());
    assert_eq!(read(&d, "a").unwrap(), (0..16u8).collect::<Vec<_>>());
    assert!(read(&d, "b").is_err());

    // Not a deathtensors file, or one that lacks the tensor.
    write(dir.path(), "m-00002-of-0002.deathtensors", b"garbage");
    let o = formats::open(&index, Limits::default()).unwrap();
    assert!(o.catalog.get("b").unwrap().parts.is_err());
    write(
        dir.path(),
        "m-00002-of-0002.deathtensors",
        &dt(
            0,
            header(&[("c", "F32", "[4]", [0, 16])], ""),
            &blob32()[16..],
        ),
    );
    let o = formats::open(&index, Limits::default()).unwrap();
    assert!(o.catalog.get("b").unwrap().parts.is_err());

    // Corrupt: the footer fails its reads, not the neighbour's.
    let mut f = dt(
        CHECKSUM,
        header(&[("b", "F32", "[4]", [0, 16])], ""),
        &blob32()[16..],
    );
    let n = f.len();
    f[n - 33] ^= 0x80;
    write(dir.path(), "m-00002-of-0002.deathtensors", &f);
    let d = serve(&index, dir.path());
    assert_eq!(read(&d, "a").unwrap(), (0..16u8).collect::<Vec<_>>());
    assert!(read(&d, "b").unwrap_err().contains("checksum mismatch"));
}

#[test]
fn hostile_shard_lists_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded(dir.path());
    let bytes = std::fs::read(&index).unwrap();
    let text = String::from_utf8_lossy(&bytes[24..bytes.len() - 32])
        .trim_end_matches('\0')
        .to_string();
    let cases = [
        (
            text.replace("m-00002-of-0002", "../m-00002-of-0002"),
            "not a plain file name beside the index (no `/`, `\\` or control character)",
        ),
        (
            text.replace("m-00002-of-0002", "m-00001-of-0002"),
            "listed twice",
        ),
        (
            text.replace(
                "\"deathtensors.shard.count\":\"2\"",
                "\"deathtensors.shard.count\":\"3\"",
            ),
            "lists 2 shards",
        ),
        (text.replace("[{", "{{"), "not a shard list"),
    ];
    for (h, says) in cases {
        refused(&dt(CHECKSUM, h, &[]), Some(ErrorKind::Index), says);
    }
    // The index's own footer is checked at open: the list comes from it.
    let mut f = bytes.clone();
    let n = f.len();
    f[n - 1] ^= 1;
    refused(&f, Some(ErrorKind::Data), "checksum mismatch");
    // A tensor in two shards.
    write(
        dir.path(),
        "m-00002-of-0002.deathtensors",
        &dt(
            CHECKSUM,
            header(&[("a", "F32", "[4]", [0, 16])], ""),
            &blob32()[16..],
        ),
    );
    let h = text.replace("\"tensors\\\": [\\\"b\\\"]", "\"tensors\\\": [\\\"a\\\"]");
    assert_ne!(h, text);
    let p = write(dir.path(), "m2.deathtensors", &dt(0, h, &[]));
    let e = formats::open(&p, Limits::default()).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Duplicate, "{e}");
}

#[test]
fn through_a_mount_bad_reads_are_eio_and_neighbours_serve() {
    let _serial = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("model");
    std::fs::create_dir(&dir).unwrap();
    let index = sharded(&dir);
    let mut f = dt(
        CHECKSUM,
        header(&[("b", "F32", "[4]", [0, 16])], ""),
        &blob32()[16..],
    );
    let n = f.len();
    f[n - 33] ^= 0x80;
    write(&dir, "m-00002-of-0002.deathtensors", &f);
    m.mount(&index, &[]);
    assert_eq!(m.read("a"), (0..16u8).collect::<Vec<_>>());
    let e = std::fs::read(m.path("b")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(m.read("a"), (0..16u8).collect::<Vec<_>>());
    m.unmount_ok();
    m.cleanup();

    // A zstd bomb: EIO, and the mount still answers.
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let bomb = zstd::encode_all(std::io::repeat(0).take_n(64 << 20), 19).unwrap();
    let p = m.scratch_path("bomb.deathtensors");
    std::fs::write(&p, zstd_file(&bomb, &[("a", "F32", "[4]", [0, 16])])).unwrap();
    m.mount(&p, &[]);
    let e = std::fs::read(m.path("a")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(m.json("a.json")["dtype"], "float32");
    m.unmount_ok();
    m.cleanup();
}

/// F32 "a", BOOL "flags" holding `bools`, U8 "c"; the blob and header.
fn with_bools(bools: [u8; 4]) -> (Vec<u8>, String) {
    let mut blob: Vec<u8> = (0..16u8).collect();
    blob.extend_from_slice(&bools);
    blob.extend_from_slice(&[7, 8, 9, 10]);
    let h = header(
        &[
            ("a", "F32", "[4]", [0, 16]),
            ("flags", "BOOL", "[4]", [16, 20]),
            ("c", "U8", "[4]", [20, 24]),
        ],
        "",
    );
    (blob, h)
}

/// A BOOL tensor holding a 2, in a plain file and in a compressed one
/// (where every tensor is a part of one zstd stream): its reads fail
/// with the reason, its neighbours read, and good bools read.
#[test]
fn a_bool_byte_of_2_fails_that_tensor_only() {
    let dir = tempfile::tempdir().unwrap();
    for compressed in [false, true] {
        for (bools, good) in [([0, 1, 2, 1], false), ([1, 0, 0, 1], true)] {
            let (blob, h) = with_bools(bools);
            let f = if compressed {
                dt(COMPRESSED, &h, &zstd::encode_all(&blob[..], 3).unwrap())
            } else {
                dt(CHECKSUM, &h, &blob)
            };
            let p = write(dir.path(), "bools.deathtensors", &f);
            let d = serve(&p, dir.path());
            let what = format!("compressed {compressed}, bools {bools:?}");
            // The neighbours first and after: a failure touches only it.
            assert_eq!(read(&d, "c").unwrap(), [7, 8, 9, 10], "{what}");
            match read(&d, "flags") {
                Ok(b) => {
                    assert!(good, "{what}: a 2 was served");
                    assert_eq!(b, bools, "{what}");
                }
                Err(e) => {
                    assert!(!good, "{what}: {e}");
                    assert!(e.contains("\"flags\""), "{what}: {e}");
                    assert!(
                        e.contains("bool element 2 is neither 0 nor 1"),
                        "{what}: {e}"
                    );
                    // Sticky, and a read past the bad byte fails too.
                    let ti = support::data::tensor_index(d.catalog(), "flags");
                    assert!(d.read(ti, 0, 3, 1).is_err(), "{what}");
                }
            }
            assert_eq!(
                read(&d, "a").unwrap(),
                (0..16u8).collect::<Vec<_>>(),
                "{what}"
            );
        }
    }
}

#[test]
fn through_a_mount_a_bad_bool_is_eio_with_a_log_line() {
    let _serial = support::serial();
    for compressed in [false, true] {
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        let (blob, h) = with_bools([0, 1, 2, 1]);
        let f = if compressed {
            dt(COMPRESSED, &h, &zstd::encode_all(&blob[..], 3).unwrap())
        } else {
            dt(0, &h, &blob)
        };
        let p = m.scratch_path("bools.deathtensors");
        std::fs::write(&p, f).unwrap();
        m.mount(&p, &[]);
        let e = std::fs::read(m.path("flags")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
        assert_eq!(m.read("c"), [7, 8, 9, 10]);
        assert_eq!(m.read("a"), (0..16u8).collect::<Vec<_>>());
        let log = m.log_text();
        assert!(
            log.contains("\"flags\"") && log.contains("neither 0 nor 1"),
            "compressed {compressed}: the log lacks it:\n{log}"
        );
        let listed = String::from_utf8(m.read(".ztensor/errors")).unwrap();
        assert!(
            listed.contains("\"flags\"") && listed.contains("neither 0 nor 1"),
            "{listed}"
        );
        m.unmount_ok();
        m.cleanup();
    }
}

/// Two shards swapped on disk (each holds the other's tensor): each
/// tensor is listed as absent from the shard the index puts it in (in the
/// words of every sharded format: `formats/shard_set.rs`). The
/// reason said the shard's tensors were "0 bytes" where the index says 16,
/// as if the shard were cut.
#[test]
fn swapped_shards_say_which_tensor_is_absent() {
    let dir = tempfile::tempdir().unwrap();
    let index = sharded(dir.path());
    let one = dir.path().join("m-00001-of-0002.deathtensors");
    let two = dir.path().join("m-00002-of-0002.deathtensors");
    let tmp = dir.path().join("tmp");
    std::fs::rename(&one, &tmp).unwrap();
    std::fs::rename(&two, &one).unwrap();
    std::fs::rename(&tmp, &two).unwrap();
    let o = formats::open(&index, Limits::default()).unwrap();
    let why = |n: &str| o.catalog.get(n).unwrap().parts.clone().unwrap_err();
    assert_eq!(
        why("a"),
        "the index puts it in m-00001-of-0002.deathtensors, which does not hold it"
    );
    assert_eq!(
        why("b"),
        "the index puts it in m-00002-of-0002.deathtensors, which does not hold it"
    );
    assert_eq!(o.catalog.tensors.len(), 2);
}

/// A sharded index of many tensors is joined in time linear in them: one
/// shard of 50 000 tensors took 21.7 s through its index with the release
/// build (each tensor looked up in a list of them all), 1.3 s alone.
#[test]
fn a_sharded_index_of_many_tensors_opens_in_linear_time() {
    let dir = tempfile::tempdir().unwrap();
    let n = 50_000;
    let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
    let ts: Vec<(&str, &str, &str, [u64; 2])> = names
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), "U8", "[1]", [i as u64, i as u64 + 1]))
        .collect();
    let blob: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let shard = write(
        dir.path(),
        "m-00001-of-0001.deathtensors",
        &dt(0, header(&ts, ""), &blob),
    );
    let list = serde_json::json!([{
        "path": "m-00001-of-0001.deathtensors", "tensors": names, "bytes": n
    }])
    .to_string();
    let global = format!(
        r#""deathtensors.shard.count":"1","deathtensors.sharded":"true","deathtensors.shards":{}"#,
        serde_json::to_string(&list).unwrap()
    );
    let index = write(
        dir.path(),
        "m.deathtensors",
        &dt(0, header(&[], &global), &[]),
    );
    let timed = |p: &Path| {
        let t = std::time::Instant::now();
        let o = formats::open(p, Limits::default()).unwrap_or_else(|e| panic!("{e}"));
        (t.elapsed(), o)
    };
    let (alone, o) = timed(&shard);
    assert_eq!(o.catalog.tensors.len(), n);
    drop(o);
    let (joined, o) = timed(&index);
    assert_eq!(o.catalog.tensors.len(), n);
    assert!(o.catalog.tensors.iter().all(|t| t.parts.is_ok()));
    let d = support::data::serve(o, dir.path(), 8 << 20);
    assert_eq!(
        read(&d, &format!("t{}", n - 1)).unwrap(),
        [((n - 1) % 256) as u8]
    );
    eprintln!("{n} tensors: the shard alone {alone:?}, through the index {joined:?}");
    assert!(
        joined <= alone * 3 + std::time::Duration::from_secs(2),
        "the index took {joined:?}, its shard alone {alone:?}"
    );
}
