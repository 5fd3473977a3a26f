//! Hostile zTensor v1 files, each built here: every one must give the
//! error it states (kind, and words of the one-line message naming the
//! file, the tensor and the field), or open with only the bad tensor
//! unsupported; never a panic, never an allocation from a declared size.

mod support;

use std::path::Path;

use ciborium::value::{Integer, Value};
use ztensor_mount::catalog::{Catalog, Check, Checksum, Codec, DType};
use ztensor_mount::error::{Error, ErrorKind};
use ztensor_mount::formats::{self, Detected, Limits, zt_v1};

const MAGIC: &[u8; 8] = b"ZTEN1000";

fn t(s: &str) -> Value {
    Value::Text(s.into())
}

fn n(v: u64) -> Value {
    Value::Integer(Integer::from(v))
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (t(k), v)).collect())
}

fn cbor(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::ser::into_writer(v, &mut out).unwrap();
    out
}

/// A raw component of `dtype` at `offset`, `length` bytes.
fn comp(dtype: &str, offset: u64, length: u64) -> Vec<(&'static str, Value)> {
    vec![
        ("dtype", t(dtype)),
        ("offset", n(offset)),
        ("length", n(length)),
    ]
}

fn object(shape: &[u64], format: &str, comps: Vec<(&str, Value)>) -> Value {
    map(vec![
        ("shape", Value::Array(shape.iter().map(|&d| n(d)).collect())),
        ("format", t(format)),
        ("components", map(comps)),
    ])
}

fn dense(shape: &[u64], c: Vec<(&'static str, Value)>) -> Value {
    object(shape, "dense", vec![("data", map(c))])
}

fn manifest(objects: Vec<(&str, Value)>) -> Value {
    map(vec![("version", t("1.2.0")), ("objects", map(objects))])
}

/// Header, `blobs` each at the next multiple of 64 (the first at 64), then
/// the manifest `make(offsets)` builds, its size and the footer.
fn file_with(blobs: &[&[u8]], make: impl FnOnce(&[u64]) -> Value) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    let mut offsets = Vec::new();
    for b in blobs {
        out.resize(out.len().next_multiple_of(64), 0);
        offsets.push(out.len() as u64);
        out.extend_from_slice(b);
    }
    let m = cbor(&make(&offsets));
    raw_tail(out, &m)
}

/// `body`, then `manifest` bytes as they are, their size and the footer.
fn raw_tail(mut body: Vec<u8>, manifest: &[u8]) -> Vec<u8> {
    body.extend_from_slice(manifest);
    body.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
    body.extend_from_slice(MAGIC);
    body
}

/// A good file: f32 [2, 2] raw, and a u8 [4] neighbour.
fn good() -> Vec<u8> {
    let a: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    file_with(&[&a, &[9, 8, 7, 6]], |o| {
        manifest(vec![
            ("a", dense(&[2, 2], comp("f32", o[0], 16))),
            ("b", dense(&[4], comp("u8", o[1], 4))),
        ])
    })
}

fn catalog(bytes: &[u8]) -> Result<Catalog, Error> {
    catalog_limited(bytes, Limits::default())
}

fn catalog_limited(bytes: &[u8], limits: Limits) -> Result<Catalog, Error> {
    zt_v1::catalog(bytes, "h.zt", Path::new("h.zt"), limits)
}

/// The file must be refused with `kind`, the message holding `words`.
#[track_caller]
fn refused(bytes: &[u8], kind: ErrorKind, words: &str) -> Error {
    match catalog(bytes) {
        Ok(_) => panic!("opened, expected {kind:?} with {words:?}"),
        Err(e) => {
            let line = e.to_string();
            assert_eq!(e.kind, kind, "{line}");
            assert!(line.contains(words), "{line:?} lacks {words:?}");
            assert!(line.starts_with("h.zt: "), "{line}");
            assert!(!line.contains('\n'), "{line}");
            e
        }
    }
}

/// The file opens, with tensor `name` unsupported for a reason holding
/// `words`, every other tensor supported.
#[track_caller]
fn unsupported(bytes: &[u8], name: &str, words: &str) -> Catalog {
    let cat = catalog(bytes).unwrap_or_else(|e| panic!("refused: {e}"));
    for t in &cat.tensors {
        if t.name == name {
            let why = t.parts.as_ref().expect_err("bad tensor is unsupported");
            assert!(why.contains(words), "{why:?} lacks {words:?}");
        } else {
            assert!(t.is_supported(), "{}: {:?}", t.name, t.parts);
        }
    }
    cat
}

#[test]
fn the_good_file_opens_and_is_detected() {
    let b = good();
    assert_eq!(formats::detect(&b).name(), Some("zTensor v1"));
    let cat = catalog(&b).unwrap();
    assert_eq!(cat.format, "zTensor v1");
    assert_eq!(cat.tensors.len(), 2);
    assert_eq!(cat.tensors[0].parts.as_ref().unwrap()[0].nbytes, 16);
    assert_eq!(cat.blobs[1].offset, 128);
}

// --- 1. Framing: magics and the manifest size --------------------------

#[test]
fn bad_header_magic() {
    let mut b = good();
    b[0] = b'X';
    assert_eq!(formats::detect(&b), Detected::Unknown);
    refused(
        &b,
        ErrorKind::NotZtensor,
        "header magic \"ZTEN1000\" missing",
    );
}

#[test]
fn bad_footer_magic_is_a_truncated_file() {
    let mut b = good();
    let at = b.len() - 1;
    b[at] = b'1';
    refused(&b, ErrorKind::Index, "footer magic \"ZTEN1000\" missing");
    // Cut short: the footer is gone.
    let b = good();
    refused(&b[..b.len() - 5], ErrorKind::Index, "footer magic");
}

#[test]
fn too_short_for_the_trailer() {
    refused(b"ZTEN1000ZTEN1000", ErrorKind::Index, "too short");
    refused(b"ZTEN1000", ErrorKind::Index, "too short");
}

#[test]
fn manifest_size_zero_or_past_the_file() {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(MAGIC);
    refused(&b, ErrorKind::Index, "manifest size is 0");
    for size in [2u64, u64::MAX, 1 << 40] {
        let mut b = MAGIC.to_vec();
        b.push(0xa0);
        b.extend_from_slice(&size.to_le_bytes());
        b.extend_from_slice(MAGIC);
        refused(&b, ErrorKind::Index, "larger than the file allows");
    }
}

#[test]
fn manifest_over_the_memory_limit() {
    let b = good();
    let limits = Limits { index_memory: 64 };
    let e = catalog_limited(&b, limits).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Index);
    assert!(e.message.contains("--index-memory"), "{e}");
    // Many small items: the estimate, not the byte size, refuses it.
    let items = Value::Array(vec![n(0); 100_000]);
    let m = cbor(&map(vec![
        ("version", t("1.2.0")),
        ("attributes", map(vec![("x", items)])),
        ("objects", map(vec![])),
    ]));
    let b = raw_tail(MAGIC.to_vec(), &m);
    let e = catalog_limited(
        &b,
        Limits {
            index_memory: 1 << 20,
        },
    )
    .unwrap_err();
    assert!(e.message.contains("of memory decoded"), "{e}");
    assert!(catalog(&b).is_ok());
}

// --- 2. The manifest's CBOR and shape ---------------------------------

#[test]
fn truncated_cbor() {
    let m = cbor(&manifest(vec![("a", dense(&[0], comp("u8", 64, 0)))]));
    let b = raw_tail(MAGIC.to_vec(), &m[..m.len() - 3]);
    refused(&b, ErrorKind::Index, "not valid CBOR");
}

#[test]
fn trailing_bytes_after_the_manifest() {
    let mut m = cbor(&manifest(vec![]));
    m.extend_from_slice(&[0, 0]);
    refused(
        &raw_tail(MAGIC.to_vec(), &m),
        ErrorKind::Index,
        "2 trailing bytes",
    );
}

#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    // attributes: [[[[... 100 000 deep
    let mut m = cbor(&map(vec![
        ("version", t("1.2.0")),
        ("objects", map(vec![])),
    ]));
    m[0] = 0xa3; // three pairs
    m.extend_from_slice(&cbor(&t("attributes")));
    m.extend(std::iter::repeat_n(0x81, 100_000));
    m.push(0x00);
    refused(
        &raw_tail(MAGIC.to_vec(), &m),
        ErrorKind::Index,
        "nested deeper than",
    );
}

#[test]
fn huge_declared_lengths_allocate_nothing() {
    // A map of 2^60 pairs, an array of 2^32 items, a text of 2^62 bytes:
    // each declared, none present.
    for head in [
        vec![0xbb, 0x10, 0, 0, 0, 0, 0, 0, 0],
        vec![
            0xa1, 0x67, b'o', b'b', b'j', b'e', b'c', b't', b's', 0x9a, 0xff, 0xff, 0xff, 0xff,
        ],
        vec![0xa1, 0x7b, 0x40, 0, 0, 0, 0, 0, 0, 0],
    ] {
        refused(
            &raw_tail(MAGIC.to_vec(), &head),
            ErrorKind::Index,
            "not valid CBOR",
        );
    }
}

#[test]
fn the_manifest_must_be_a_map_with_version_and_objects() {
    let arr = cbor(&Value::Array(vec![]));
    refused(
        &raw_tail(MAGIC.to_vec(), &arr),
        ErrorKind::Index,
        "a CBOR array, expected a map",
    );
    let no_objects = cbor(&map(vec![("version", t("1.2.0"))]));
    refused(
        &raw_tail(MAGIC.to_vec(), &no_objects),
        ErrorKind::Index,
        "no \"objects\"",
    );
    let no_version = cbor(&map(vec![("objects", map(vec![]))]));
    refused(
        &raw_tail(MAGIC.to_vec(), &no_version),
        ErrorKind::Index,
        "no \"version\"",
    );
    let objects_array = cbor(&map(vec![
        ("version", t("1.2.0")),
        ("objects", Value::Array(vec![])),
    ]));
    refused(
        &raw_tail(MAGIC.to_vec(), &objects_array),
        ErrorKind::Index,
        "\"objects\" is a CBOR array",
    );
    let v2 = cbor(&map(vec![
        ("version", t("2.0.0")),
        ("objects", map(vec![])),
    ]));
    refused(
        &raw_tail(MAGIC.to_vec(), &v2),
        ErrorKind::NotSupported,
        "\"2.0.0\"",
    );
}

#[test]
fn duplicate_keys() {
    // The same object name twice (CBOR maps may repeat keys).
    let b = file_with(&[&[1], &[2]], |o| {
        manifest(vec![
            ("a", dense(&[1], comp("u8", o[0], 1))),
            ("a", dense(&[1], comp("u8", o[1], 1))),
        ])
    });
    refused(
        &b,
        ErrorKind::Duplicate,
        "tensor \"a\": object name appears twice",
    );
    // A field twice in a component.
    let b = file_with(&[&[1]], |o| {
        let mut c = comp("u8", o[0], 1);
        c.push(("length", n(1)));
        manifest(vec![("a", dense(&[1], c))])
    });
    refused(&b, ErrorKind::Field, "field \"length\" appears twice");
}

#[test]
fn ill_typed_and_missing_fields_name_the_tensor_and_field() {
    let cases: Vec<(Vec<(&'static str, Value)>, &str)> = vec![
        (
            vec![("dtype", t("u8")), ("length", n(1))],
            "required field \"offset\"",
        ),
        (
            vec![("dtype", t("u8")), ("offset", t("64")), ("length", n(1))],
            "\"offset\" is a CBOR text string",
        ),
        (
            vec![
                ("dtype", t("u8")),
                ("offset", Value::Integer(Integer::from(-64))),
                ("length", n(1)),
            ],
            "\"offset\" is negative",
        ),
        (
            vec![("dtype", n(3)), ("offset", n(64)), ("length", n(1))],
            "\"dtype\" is a CBOR integer",
        ),
    ];
    for (c, words) in cases {
        let b = file_with(&[&[1]], |_| manifest(vec![("w", dense(&[1], c))]));
        let e = refused(&b, ErrorKind::Field, words);
        assert_eq!(e.tensor.as_deref(), Some("w"));
        assert!(e.to_string().contains("component \"data\""), "{e}");
    }
    let b = file_with(&[], |_| {
        manifest(vec![(
            "s",
            map(vec![
                ("shape", t("[1]")),
                ("format", t("dense")),
                ("components", map(vec![])),
            ]),
        )])
    });
    refused(&b, ErrorKind::Field, "\"shape\" is a CBOR text string");
    let b = file_with(&[], |_| {
        manifest(vec![("", dense(&[0], comp("u8", 64, 0)))])
    });
    refused(&b, ErrorKind::Field, "object name is empty");
}

// --- 3. Placement -----------------------------------------------------

#[test]
fn offset_past_the_end_or_into_the_manifest() {
    let b = file_with(&[&[1, 2, 3, 4]], |o| {
        manifest(vec![("a", dense(&[4], comp("u8", o[0] + 64 * 100, 4)))])
    });
    refused(&b, ErrorKind::Placement, "runs past the end of the file");
    let b = file_with(&[&[1, 2, 3, 4]], |o| {
        manifest(vec![("a", dense(&[72], comp("u8", o[0], 72)))])
    });
    refused(&b, ErrorKind::Placement, "runs into the manifest");
}

#[test]
fn offset_plus_length_overflows() {
    let b = file_with(&[&[1]], |_| {
        manifest(vec![("a", dense(&[1], comp("u8", u64::MAX - 63, 65)))])
    });
    refused(&b, ErrorKind::Placement, "overflows 64 bits");
}

#[test]
fn misaligned_or_inside_the_header() {
    let b = file_with(&[&[1, 2]], |o| {
        manifest(vec![("a", dense(&[1], comp("u8", o[0] + 1, 1)))])
    });
    refused(&b, ErrorKind::Placement, "not a multiple of 64");
    let b = file_with(&[&[1, 2]], |_| {
        manifest(vec![("a", dense(&[1], comp("u8", 0, 1)))])
    });
    refused(&b, ErrorKind::Placement, "inside the 8-byte header magic");
}

#[test]
fn overlapping_components() {
    let b = file_with(&[&[0; 128]], |o| {
        manifest(vec![
            ("a", dense(&[128], comp("u8", o[0], 128))),
            ("b", dense(&[64], comp("u8", o[0] + 64, 64))),
        ])
    });
    refused(
        &b,
        ErrorKind::Placement,
        "overlaps component \"data\" of \"a\"",
    );
    // Empty components may share an offset (the package writes them so).
    let b = file_with(&[&[0; 8]], |o| {
        manifest(vec![
            ("e", dense(&[0, 3], comp("f32", o[0], 0))),
            ("s", dense(&[], comp("f64", o[0], 8))),
        ])
    });
    catalog(&b).unwrap();
}

// --- 4. Sizes ---------------------------------------------------------

#[test]
fn size_does_not_match_shape_times_dtype() {
    let b = file_with(&[&[0; 12]], |o| {
        manifest(vec![("a", dense(&[2, 2], comp("f32", o[0], 12)))])
    });
    refused(
        &b,
        ErrorKind::Size,
        "\"length\" is 12 bytes but shape [2, 2] of float32 needs 16",
    );
    // zstd: the declared uncompressed length is what must match.
    let z = zstd::encode_all(&[0u8; 16][..], 3).unwrap();
    let b = file_with(&[&z], |o| {
        let mut c = comp("f32", o[0], z.len() as u64);
        c.push(("encoding", t("zstd")));
        c.push(("uncompressed_length", n(20)));
        manifest(vec![("a", dense(&[2, 2], c))])
    });
    refused(&b, ErrorKind::Size, "\"uncompressed_length\" is 20 bytes");
    // A shape of more than 2^64 elements.
    let b = file_with(&[&[0; 8]], |o| {
        manifest(vec![("a", dense(&[1 << 33, 1 << 33], comp("u8", o[0], 8)))])
    });
    refused(&b, ErrorKind::Size, "more than 2^64 elements");
}

#[test]
fn zstd_without_uncompressed_length() {
    let b = file_with(&[&[0; 8]], |o| {
        let mut c = comp("u8", o[0], 8);
        c.push(("encoding", t("zstd")));
        manifest(vec![("a", dense(&[8], c))])
    });
    refused(&b, ErrorKind::Field, "requires \"uncompressed_length\"");
}

#[test]
fn sparse_counts_must_agree() {
    let vals = [0u8; 8]; // 2 f32
    let idx = [0u8; 24]; // 3 u64
    let ptr = [0u8; 24]; // 3 u64
    let b = file_with(&[&vals, &idx, &ptr], |o| {
        manifest(vec![(
            "csr",
            object(
                &[2, 4],
                "sparse_csr",
                vec![
                    ("values", map(comp("f32", o[0], 8))),
                    ("indices", map(comp("u64", o[1], 24))),
                    ("indptr", map(comp("u64", o[2], 24))),
                ],
            ),
        )])
    });
    refused(&b, ErrorKind::Size, "2 values but 3 indices");
    let b = file_with(&[&vals, &[0u8; 40]], |o| {
        manifest(vec![(
            "coo",
            object(
                &[3, 3],
                "sparse_coo",
                vec![
                    ("values", map(comp("f32", o[0], 8))),
                    ("coords", map(comp("u64", o[1], 40))),
                ],
            ),
        )])
    });
    refused(
        &b,
        ErrorKind::Size,
        "coords has 5 entries, 2 dimensions x 2 values need 4",
    );
    let b = file_with(&[&[0u8; 7]], |o| {
        manifest(vec![(
            "q",
            object(
                &[1],
                "quantized_group",
                vec![("scales", map(comp("f16", o[0], 7)))],
            ),
        )])
    });
    refused(
        &b,
        ErrorKind::Size,
        "not a whole number of 2-byte float16 elements",
    );
}

// --- 5. One tensor unsupported, the file still opens -------------------

#[test]
fn unknown_dtype_type_encoding_or_format_mark_only_that_tensor() {
    let cases: Vec<(Value, &str)> = vec![
        (
            dense(&[4], comp("f128", 64, 4)),
            "unsupported dtype \"f128\"",
        ),
        (
            dense(&[4], {
                let mut c = comp("u8", 64, 4);
                c.push(("type", t("f6_e3m2")));
                c
            }),
            "unsupported type \"f6_e3m2\"",
        ),
        (
            dense(&[4], {
                let mut c = comp("u8", 64, 4);
                c.push(("encoding", t("lz4")));
                c
            }),
            "unsupported encoding \"lz4\"",
        ),
        (
            dense(&[4], {
                let mut c = comp("u32", 64, 4);
                c.push(("type", t("f8_e4m3fn")));
                c
            }),
            "must be stored as \"u8\"",
        ),
        (
            object(
                &[4],
                "block_sparse",
                vec![("blocks", map(comp("u8", 64, 4)))],
            ),
            "unsupported format \"block_sparse\"",
        ),
        (
            object(&[4], "dense", vec![("values", map(comp("u8", 64, 4)))]),
            "has no component \"values\"",
        ),
        (
            object(
                &[2, 2],
                "sparse_csr",
                vec![("values", map(comp("u8", 64, 4)))],
            ),
            "needs a component \"indices\"",
        ),
    ];
    for (bad, words) in cases {
        let b = file_with(&[&[1, 2, 3, 4], &[5]], |o| {
            assert_eq!(o[0], 64);
            manifest(vec![("bad", bad), ("ok", dense(&[1], comp("u8", o[1], 1)))])
        });
        let cat = unsupported(&b, "bad", words);
        // The good neighbour is described right.
        let ok = cat.get("ok").unwrap();
        let p = &ok.parts.as_ref().unwrap()[0];
        assert_eq!(cat.blobs[p.blob].offset, 128);
    }
}

#[test]
fn sparse_index_components_must_be_u64() {
    let b = file_with(&[&[0; 8], &[0; 8], &[0; 12]], |o| {
        manifest(vec![(
            "csr",
            object(
                &[2, 4],
                "sparse_csr",
                vec![
                    ("values", map(comp("f32", o[0], 8))),
                    ("indices", map(comp("u32", o[1], 8))),
                    ("indptr", map(comp("u32", o[2], 12))),
                ],
            ),
        )])
    });
    unsupported(&b, "csr", "the spec requires \"u64\"");
}

// --- 6. Checks the data layer applies ---------------------------------

#[test]
fn digests_cover_stored_bytes_and_bools_are_checked() {
    let z = zstd::encode_all(&[1u8, 0, 1, 1][..], 3).unwrap();
    let b = file_with(&[&z], |o| {
        let mut c = comp("bool", o[0], z.len() as u64);
        c.push(("encoding", t("zstd")));
        c.push(("uncompressed_length", n(4)));
        c.push(("digest", t("crc32c:0x0000ABCD")));
        manifest(vec![("flags", dense(&[4], c))])
    });
    let cat = catalog(&b).unwrap();
    let blob = &cat.blobs[0];
    assert_eq!(blob.codec, Codec::Zstd { frames: None });
    assert_eq!((blob.len, blob.decoded_len), (z.len() as u64, 4));
    assert_eq!(
        blob.checks,
        vec![Check::Stored(Checksum::Crc32c(0xabcd)), Check::BoolBytes]
    );
    assert_eq!(cat.tensors[0].parts.as_ref().unwrap()[0].dtype, DType::Bool);
}

#[test]
fn malformed_or_unknown_digest() {
    let b = file_with(&[&[1]], |o| {
        let mut c = comp("u8", o[0], 1);
        c.push(("digest", t("sha256:xyz")));
        manifest(vec![("a", dense(&[1], c))])
    });
    refused(&b, ErrorKind::Field, "field \"digest\": malformed sha256");
    // An algorithm we do not know is kept, to be reported unverifiable.
    let b = file_with(&[&[1]], |o| {
        let mut c = comp("u8", o[0], 1);
        c.push(("digest", t("blake3:00")));
        manifest(vec![("a", dense(&[1], c))])
    });
    let cat = catalog(&b).unwrap();
    assert_eq!(
        cat.blobs[0].checks,
        vec![Check::Stored(Checksum::Unknown("blake3:00".into()))]
    );
}

#[test]
fn every_truncation_and_bit_flip_of_a_real_layout_is_handled() {
    // Without a panic: each prefix and each single-byte change of a file
    // with every format opens or gives a one-line error.
    let z = zstd::encode_all(&[7u8; 64][..], 3).unwrap();
    let b = file_with(&[&[0; 16], &z, &[0; 8], &[0; 24], &[0; 16]], |o| {
        let mut zc = comp("u8", o[1], z.len() as u64);
        zc.push(("encoding", t("zstd")));
        zc.push(("uncompressed_length", n(64)));
        zc.push(("digest", Value::Text(format!("sha256:{}", "0".repeat(64)))));
        manifest(vec![
            ("d", dense(&[4], comp("f32", o[0], 16))),
            ("z", dense(&[8, 8], zc)),
            (
                "csr",
                object(
                    &[2, 2],
                    "sparse_csr",
                    vec![
                        ("values", map(comp("f32", o[2], 8))),
                        ("indices", map(comp("u64", o[4], 16))),
                        ("indptr", map(comp("u64", o[3], 24))),
                    ],
                ),
            ),
        ])
    });
    catalog(&b).unwrap();
    for cut in 0..b.len() {
        if let Err(e) = catalog(&b[..cut]) {
            assert!(!e.to_string().contains('\n'));
        }
    }
    for at in 0..b.len() {
        for x in [0x01u8, 0x80, 0xff] {
            let mut m = b.clone();
            m[at] ^= x;
            if let Err(e) = catalog(&m) {
                assert!(!e.to_string().contains('\n'));
            }
        }
    }
}

// --- 7. Bad data: the read fails, the neighbour reads right ------------

/// Every tensor of `bytes` (written to a file, opened with
/// `formats::open` and served by the mount's data layer), whole: its bytes
/// or why the read failed.
fn read_all(bytes: &[u8]) -> Vec<(String, Result<Vec<u8>, String>)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.zt");
    std::fs::write(&path, bytes).unwrap();
    let opened = formats::open(&path, Limits::default()).unwrap();
    let data = support::data::serve(opened, dir.path(), 16 << 20);
    let mut out = Vec::new();
    for (ti, t) in data.catalog().tensors.iter().enumerate() {
        assert!(t.is_supported(), "{}: {:?}", t.name, t.parts);
        let r = support::data::read_whole(&data, ti, 0, 4096);
        out.push((t.name.clone(), r));
    }
    out
}

/// A file with tensor "bad" (component fields `bad`, blob `blob`) and a
/// good u8 neighbour "ok" = [5, 6, 7]; "bad"'s read must fail with
/// `words`, "ok" must read right.
#[track_caller]
fn bad_data(
    blob: &[u8],
    shape: &[u64],
    dtype: &str,
    fields: Vec<(&'static str, Value)>,
    words: &str,
) {
    let b = file_with(&[blob, &[5, 6, 7]], |o| {
        let mut c = comp(dtype, o[0], blob.len() as u64);
        c.extend(fields);
        manifest(vec![
            ("bad", dense(shape, c)),
            ("ok", dense(&[3], comp("u8", o[1], 3))),
        ])
    });
    let got = read_all(&b);
    for (name, r) in got {
        match name.as_str() {
            "bad" => {
                let e = r.expect_err("bad data must not read");
                assert!(e.contains(words), "{e:?} lacks {words:?}");
                assert!(e.contains("tensor \"bad\""), "{e}");
            }
            _ => assert_eq!(r.unwrap(), vec![5, 6, 7]),
        }
    }
}

fn zstd_fields(decoded: u64) -> Vec<(&'static str, Value)> {
    vec![("encoding", t("zstd")), ("uncompressed_length", n(decoded))]
}

#[test]
fn zstd_bomb_stops_at_the_declared_length() {
    // 64 MiB of zeros in a few KiB, declared as 64 bytes.
    let bomb = zstd::encode_all(std::io::Read::take(std::io::repeat(0), 64 << 20), 19).unwrap();
    assert!(bomb.len() < 1 << 16);
    bad_data(
        &bomb,
        &[64],
        "u8",
        zstd_fields(64),
        "decodes to more than the expected 64 bytes",
    );
}

#[test]
fn zstd_garbage_fails_to_decode() {
    bad_data(
        &[0x13; 40],
        &[64],
        "u8",
        zstd_fields(64),
        "zstd data is corrupt",
    );
}

#[test]
fn zstd_short_stream_gives_fewer_bytes_than_declared() {
    let short = zstd::encode_all(&[1u8; 32][..], 3).unwrap();
    bad_data(
        &short,
        &[64],
        "u8",
        zstd_fields(64),
        "decodes to only 32 bytes, expected 64",
    );
}

#[test]
fn checksum_mismatch_raw_and_zstd() {
    let raw = [1u8, 2, 3, 4];
    bad_data(
        &raw,
        &[4],
        "u8",
        vec![("digest", t("crc32c:0x12345678"))],
        "checksum mismatch over the stored bytes",
    );
    let z = zstd::encode_all(&[9u8; 100][..], 3).unwrap();
    let mut f = zstd_fields(100);
    f.push(("digest", Value::Text(format!("sha256:{}", "ab".repeat(32)))));
    bad_data(
        &z,
        &[100],
        "u8",
        f,
        "checksum mismatch over the stored bytes",
    );
}

#[test]
fn bool_bytes_other_than_0_and_1() {
    bad_data(
        &[0, 1, 2, 1],
        &[4],
        "bool",
        vec![],
        "bool element 2 is neither 0 nor 1",
    );
}

/// A manifest key that is a map whose key is a map, 30 levels deep (a
/// fuzzed file of 87 bytes): refused at once, its name in the message
/// short. Each level's name was the JSON of the level below escaped
/// again, doubling at each level, and the refusal's message took
/// gigabytes and minutes to make.
#[test]
fn keys_that_are_maps_of_maps_are_refused_at_once_with_a_short_name() {
    let mut key = n(0);
    for _ in 0..30 {
        key = Value::Map(vec![(key, n(0))]);
    }
    let m = Value::Map(vec![(key, n(0)), (t("version"), t("1.2.0"))]);
    let b = raw_tail(MAGIC.to_vec(), &cbor(&m));
    let start = std::time::Instant::now();
    let e = refused(
        &b,
        ErrorKind::Index,
        "a map key is a CBOR map; keys must be scalars",
    );
    assert!(e.to_string().len() < 4096, "{e}");
    assert!(start.elapsed().as_secs() < 5, "{:?}", start.elapsed());
}
