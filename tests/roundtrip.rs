//! Files written by our `Writer` (and a few hand-built ones) read back
//! exactly: every dtype, encoding, byte order and checksum; edge shapes;
//! custom metadata; both sparse conventions; indefinite-length CBOR; and a
//! large tensor streamed through the writer.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};

use ciborium::value::{Integer, Value};
use common::*;
use sha2::{Digest, Sha256};
use ztensor_mount::formats::zt_v01::catalog::Sparse;
use ztensor_mount::formats::zt_v01::writer::{Compression, DEFAULT_FRAME_SIZE, Options, Writer};
use ztensor_mount::formats::zt_v01::{
    Algorithm, Checksum, DType, Encoding, Endian, SparseForm, SparseFormat, Tensor, Verdict,
    ZtFile, zstd_blob,
};

/// 385 elements: several 256-byte frames even for one-byte types.
const SHAPE: [u64; 3] = [5, 7, 11];
const SMALL_FRAME: usize = 256;

const COMPRESSIONS: [(&str, Compression); 3] = [
    ("raw", Compression::Raw),
    (
        "zstd-1frame",
        Compression::Zstd {
            level: 3,
            frame_size: 0,
        },
    ),
    (
        "zstd-frames",
        Compression::Zstd {
            level: 3,
            frame_size: SMALL_FRAME,
        },
    ),
];

fn opts(compression: Compression, endian: Endian, checksum: Option<Algorithm>) -> Options {
    Options {
        compression,
        endian,
        checksum,
        custom: Vec::new(),
    }
}

fn numel(dims: &[u64]) -> usize {
    dims.iter().product::<u64>() as usize
}

/// Writes one file with `build` and opens it.
fn write_and_open(
    path: &Path,
    build: impl FnOnce(&mut Writer<std::io::BufWriter<std::fs::File>>),
) -> ZtFile {
    let mut w = Writer::create(path).expect("create");
    build(&mut w);
    w.finish().expect("finish");
    ZtFile::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn tensor<'a>(f: &'a ZtFile, name: &str) -> &'a Tensor {
    f.catalog()
        .get(name)
        .unwrap_or_else(|| panic!("tensor {name:?} missing from {}", f.label()))
}

/// The checksum of `blob` computed here, independently of the library.
fn expected_checksum(algo: Algorithm, blob: &[u8]) -> Checksum {
    match algo {
        Algorithm::Crc32c => Checksum::Crc32c(crc32c::crc32c(blob)),
        Algorithm::Sha256 => Checksum::Sha256(Sha256::digest(blob).into()),
        Algorithm::Xxh3 | Algorithm::Crc32 => {
            panic!("zTensor v0.1 writes no xxh3 or crc32 checksums")
        }
    }
}

#[test]
fn every_dtype_encoding_endian_and_checksum_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let n = numel(&SHAPE);
    for (cname, compression) in COMPRESSIONS {
        for endian in [Endian::Little, Endian::Big] {
            for checksum in [None, Some(Algorithm::Crc32c), Some(Algorithm::Sha256)] {
                let label = format!("{cname}-{}-{checksum:?}", endian.name());
                let path = dir.path().join(format!("{label}.zt"));
                let o = opts(compression, endian, checksum);
                let f = write_and_open(&path, |w| {
                    for d in DType::V01 {
                        w.add(d.name(), d, &SHAPE, &sample(d, n), &o).unwrap();
                    }
                });
                assert_eq!(f.catalog().len(), DType::V01.len(), "{label}");
                for (i, d) in DType::V01.into_iter().enumerate() {
                    let ctx = format!("{label} {d}");
                    let input = sample(d, n);
                    let nbytes = input.len() as u64;
                    let t = tensor(&f, d.name());
                    assert_eq!(t.index, i, "{ctx}");
                    assert_eq!(t.dtype, Some(d), "{ctx}");
                    assert_eq!(t.dtype_name, d.name(), "{ctx}");
                    assert_eq!(t.shape, SHAPE, "{ctx}");
                    assert_eq!(t.layout_name, "dense", "{ctx}");
                    assert_eq!(t.offset % 64, 0, "{ctx}: blob not 64-byte aligned");
                    // One-byte types have no byte order; the writer omits it.
                    let stored_endian = if d.size() > 1 { endian } else { Endian::Little };
                    assert_eq!(t.endian, stored_endian, "{ctx}");
                    let layout = t.layout.as_ref().expect("supported");
                    assert_eq!(layout.decoded_size, nbytes, "{ctx}");
                    assert!(layout.sparse.is_none(), "{ctx}");
                    assert_eq!(layout.parts.len(), 1, "{ctx}");
                    assert_eq!(layout.parts[0].shape, SHAPE, "{ctx}");
                    assert_eq!(layout.parts[0].nbytes, nbytes, "{ctx}");
                    assert_eq!(layout.parts[0].dtype, d, "{ctx}");

                    // What is on disk, checked without the reader.
                    let on_disk_order = if stored_endian == Endian::Big {
                        swapped(&input, d.size() as usize)
                    } else {
                        input.clone()
                    };
                    let blob = f.blob(t);
                    match compression {
                        Compression::Raw => {
                            assert_eq!(t.encoding_name, "raw", "{ctx}");
                            assert_eq!(layout.encoding, Encoding::Raw, "{ctx}");
                            assert_eq!(t.size, nbytes, "{ctx}");
                            assert_eq!(blob, &on_disk_order[..], "{ctx}: raw blob bytes");
                        }
                        Compression::Zstd { frame_size, .. } => {
                            assert_eq!(t.encoding_name, "zstd", "{ctx}");
                            assert_eq!(layout.encoding, Encoding::Zstd, "{ctx}");
                            assert_eq!(
                                zstd::decode_all(blob).unwrap(),
                                on_disk_order,
                                "{ctx}: zstd blob decodes to the stored bytes"
                            );
                            let frames = zstd_blob::scan_frames(blob)
                                .unwrap()
                                .expect("our frames declare their size");
                            let want = if frame_size == 0 {
                                1
                            } else {
                                input.len().div_ceil(frame_size)
                            };
                            assert_eq!(frames.len(), want, "{ctx}: frame count");
                        }
                    }
                    match checksum {
                        None => {
                            assert_eq!(t.checksum, None, "{ctx}");
                            assert_eq!(f.verify(t), Verdict::Absent, "{ctx}");
                        }
                        Some(algo) => {
                            assert_eq!(
                                t.checksum,
                                Some(expected_checksum(algo, blob)),
                                "{ctx}: checksum covers the on-disk bytes"
                            );
                            assert_eq!(f.verify(t), Verdict::Verified, "{ctx}");
                        }
                    }
                    f.check(t).unwrap();
                    assert_eq!(f.read_all(t).unwrap(), vec![input], "{ctx}: exposed bytes");
                }
            }
        }
    }
}

/// `(off, len)` pairs that start and end mid-element, cross elements, run
/// past the end and start at or after the end.
fn awkward_ranges(nbytes: u64) -> Vec<(u64, u64)> {
    let mut r = Vec::new();
    for off in [0, 1, 2, 3, 5, 7, 9, 13, 17] {
        for len in [0, 1, 2, 3, 5, 8, 11, 16, 33] {
            r.push((off, len));
        }
    }
    r.extend([
        (nbytes - 3, 2),
        (nbytes - 3, 100),
        (nbytes - 1, 1),
        (nbytes, 4),
        (nbytes + 9, 4),
        (1, nbytes),
        (0, u64::MAX),
    ]);
    r
}

fn slice_of(bytes: &[u8], off: u64, len: u64) -> &[u8] {
    let n = bytes.len() as u64;
    let start = off.min(n);
    let end = off.saturating_add(len).min(n);
    &bytes[start as usize..end as usize]
}

#[test]
fn read_part_sub_ranges_of_big_endian_data_match_the_little_endian_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let n = 37;
    for (cname, compression) in COMPRESSIONS {
        let path = dir.path().join(format!("{cname}.zt"));
        let o = opts(compression, Endian::Big, Some(Algorithm::Crc32c));
        let f = write_and_open(&path, |w| {
            for d in DType::V01 {
                w.add(d.name(), d, &[n as u64], &sample(d, n), &o).unwrap();
            }
        });
        for d in DType::V01 {
            let input = sample(d, n);
            let t = tensor(&f, d.name());
            let part = &t.layout.as_ref().unwrap().parts[0];
            for (off, len) in awkward_ranges(input.len() as u64) {
                for verify in [false, true] {
                    let got = f.read_part(t, part, off, len, verify).unwrap();
                    assert_eq!(
                        got,
                        slice_of(&input, off, len),
                        "{cname} {d} off={off} len={len}"
                    );
                }
            }
        }
    }
}

#[test]
fn scalar_tensor_has_one_element_and_empty_shape() {
    let dir = tempfile::tempdir().unwrap();
    let value = 3.5f32.to_le_bytes();
    for (cname, compression) in COMPRESSIONS {
        for endian in [Endian::Little, Endian::Big] {
            let path = dir.path().join(format!("{cname}-{}.zt", endian.name()));
            let f = write_and_open(&path, |w| {
                w.add(
                    "s",
                    DType::Float32,
                    &[],
                    &value,
                    &opts(compression, endian, None),
                )
                .unwrap();
            });
            let t = tensor(&f, "s");
            assert!(t.shape.is_empty());
            let part = &t.layout.as_ref().unwrap().parts[0];
            assert!(part.shape.is_empty());
            assert_eq!(part.nbytes, 4);
            assert_eq!(f.read_all(t).unwrap(), vec![value.to_vec()], "{cname}");
        }
    }
}

#[test]
fn empty_tensors_read_as_zero_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for (cname, compression) in COMPRESSIONS {
        let path = dir.path().join(format!("{cname}.zt"));
        let o = opts(compression, Endian::Big, Some(Algorithm::Sha256));
        let f = write_and_open(&path, |w| {
            w.add("zero", DType::Float64, &[0], &[], &o).unwrap();
            w.add("three_by_zero", DType::Int16, &[3, 0], &[], &o)
                .unwrap();
            w.add("after", DType::Uint8, &[3], &[1, 2, 3], &o).unwrap();
        });
        for (name, dims) in [("zero", vec![0]), ("three_by_zero", vec![3, 0])] {
            let t = tensor(&f, name);
            assert_eq!(t.shape, dims, "{cname} {name}");
            let layout = t.layout.as_ref().unwrap();
            assert_eq!(layout.decoded_size, 0, "{cname} {name}");
            assert_eq!(layout.parts[0].nbytes, 0, "{cname} {name}");
            if compression == Compression::Raw {
                assert_eq!(t.size, 0, "{cname} {name}");
            } else {
                // Even an empty tensor needs a valid zstd stream (one frame).
                let blob = f.blob(t);
                assert!(!blob.is_empty(), "{cname} {name}: zero-byte zstd blob");
                assert!(zstd::decode_all(blob).unwrap().is_empty(), "{cname} {name}");
            }
            assert_eq!(f.verify(t), Verdict::Verified, "{cname} {name}");
            assert_eq!(
                f.read_all(t).unwrap(),
                vec![Vec::<u8>::new()],
                "{cname} {name}"
            );
            let part = &layout.parts[0];
            assert!(f.read_part(t, part, 0, 10, true).unwrap().is_empty());
        }
        assert_eq!(
            f.read_all(tensor(&f, "after")).unwrap(),
            vec![vec![1, 2, 3]]
        );
    }
}

#[test]
fn zero_size_blobs_may_share_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.zt");
    let raw = Options::default();
    let f = write_and_open(&path, |w| {
        w.add("a", DType::Float32, &[0], &[], &raw).unwrap();
        w.add("b", DType::Uint16, &[2, 0, 5], &[], &raw).unwrap();
        // A real blob right where the empty ones "are".
        w.add("c", DType::Uint8, &[4], &[9, 8, 7, 6], &raw).unwrap();
    });
    let (a, b, c) = (tensor(&f, "a"), tensor(&f, "b"), tensor(&f, "c"));
    assert_eq!(
        a.offset, b.offset,
        "both empty blobs sit at the same offset"
    );
    assert_eq!(a.offset, c.offset, "the next blob starts there too");
    assert!(f.read_all(a).unwrap()[0].is_empty());
    assert!(f.read_all(b).unwrap()[0].is_empty());
    assert_eq!(f.read_all(c).unwrap(), vec![vec![9, 8, 7, 6]]);

    // The same by hand: two size-0 entries at offset 64 and a blob there too.
    let blob = [1u8, 2];
    let entries = vec![
        map(entry("e1", 64, 0, "float32", &[0], "raw")),
        map(entry("e2", 64, 0, "int64", &[0, 4], "raw")),
        map(entry("x", 64, 2, "uint8", &[2], "raw")),
    ];
    let path = dir.path().join("by_hand.zt");
    std::fs::write(&path, file_with(&[(64, &blob)], entries)).unwrap();
    let f = ZtFile::open(&path).unwrap();
    assert_eq!(f.catalog().len(), 3);
    assert_eq!(f.read_all(tensor(&f, "x")).unwrap(), vec![blob.to_vec()]);
}

#[test]
fn seventeen_byte_file_has_no_tensors() {
    let mut bytes = MAGIC.to_vec();
    bytes.push(0x80);
    bytes.extend_from_slice(&1u64.to_le_bytes());
    assert_eq!(bytes.len(), 17);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.zt");
    std::fs::write(&path, &bytes).unwrap();
    let f = ZtFile::open(&path).unwrap();
    assert!(f.catalog().is_empty());
    assert!(f.catalog().get("anything").is_none());

    // And our writer produces exactly that file when given nothing.
    let written = Writer::new(Vec::new()).unwrap().finish().unwrap();
    assert_eq!(written, bytes);
}

fn every_cbor_kind() -> Vec<(Value, Value)> {
    let int = |n: i128| Value::Integer(Integer::try_from(n).unwrap());
    vec![
        (text("small"), int(7)),
        (text("u64_max"), int(u64::MAX as i128)),
        (text("negative"), int(-5)),
        (text("most_negative"), int(-(1i128 << 64))),
        (text("half_float"), Value::Float(1.5)),
        (text("double"), Value::Float(0.1)),
        (text("infinity"), Value::Float(f64::NEG_INFINITY)),
        (text("text"), text("héllo, wörld")),
        (text("empty_text"), text("")),
        (text("bytes"), Value::Bytes(vec![0, 1, 0xfe, 0xff])),
        (text("true"), Value::Bool(true)),
        (text("false"), Value::Bool(false)),
        (text("null"), Value::Null),
        (
            text("array"),
            Value::Array(vec![int(1), text("two"), Value::Array(vec![]), Value::Null]),
        ),
        (
            text("nested"),
            Value::Map(vec![
                (text("inner"), Value::Map(vec![(text("deep"), int(-1))])),
                (int(3), text("int key inside")),
            ]),
        ),
        (
            text("tag"),
            Value::Tag(1, Box::new(Value::Float(1_700_000_000.0))),
        ),
        (
            text("tagged_text"),
            Value::Tag(32, Box::new(text("https://example.org"))),
        ),
        (int(42), text("integer key")),
        (Value::Bytes(vec![0xca, 0xfe]), text("bytes key")),
        (Value::Bool(false), Value::Null),
    ]
}

#[test]
fn custom_fields_of_every_cbor_kind_are_preserved_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custom.zt");
    let custom = every_cbor_kind();
    let mut o = opts(Compression::zstd(), Endian::Little, Some(Algorithm::Crc32c));
    o.custom = custom.clone();
    let f = write_and_open(&path, |w| {
        w.add("t", DType::Int32, &[2], &sample(DType::Int32, 2), &o)
            .unwrap();
        w.add("plain", DType::Uint8, &[1], &[5], &Options::default())
            .unwrap();
    });
    let t = tensor(&f, "t");
    assert_eq!(t.custom, custom, "custom fields, in order, as written");
    assert_eq!(t.custom("text"), Some(&text("héllo, wörld")));
    assert_eq!(t.custom("missing"), None);
    assert!(tensor(&f, "plain").custom.is_empty());
    // Custom fields do not disturb the data.
    assert_eq!(f.read_all(t).unwrap(), vec![sample(DType::Int32, 2)]);
}

/// A 4x6 CSR matrix with an empty row.
const CSR_SHAPE: [u64; 2] = [4, 6];
const CSR_INDPTR: [u64; 5] = [0, 2, 2, 5, 6];
const CSR_INDICES: [u64; 6] = [0, 3, 1, 2, 5, 4];
/// Four nonzeros of a 3x4x5 tensor; `COO_INDICES[d][k]` is the index of
/// nonzero k along dimension d.
const COO_SHAPE: [u64; 3] = [3, 4, 5];
const COO_INDICES: [[u64; 4]; 3] = [[0, 1, 2, 2], [3, 0, 1, 3], [4, 2, 0, 4]];

fn coo_flat() -> Vec<u64> {
    COO_INDICES.iter().flatten().copied().collect()
}

fn sparse_compressions() -> Vec<(&'static str, Compression)> {
    vec![
        ("raw", Compression::Raw),
        (
            "zstd-1frame",
            Compression::Zstd {
                level: 3,
                frame_size: 0,
            },
        ),
        (
            "zstd-frames",
            Compression::Zstd {
                level: 3,
                frame_size: 16,
            },
        ),
    ]
}

#[test]
fn sparse_csr_and_coo_expose_their_parts() {
    let dir = tempfile::tempdir().unwrap();
    let csr_values = sample(DType::Float32, CSR_INDICES.len());
    let coo_values = sample(DType::Int16, 4);
    for (cname, compression) in sparse_compressions() {
        for endian in [Endian::Little, Endian::Big] {
            let ctx = format!("{cname}-{}", endian.name());
            let path = dir.path().join(format!("{ctx}.zt"));
            let o = opts(compression, endian, Some(Algorithm::Crc32c));
            let f = write_and_open(&path, |w| {
                w.add_csr(
                    "csr",
                    DType::Float32,
                    CSR_SHAPE,
                    &CSR_INDPTR,
                    &CSR_INDICES,
                    &csr_values,
                    &o,
                )
                .unwrap();
                w.add_coo(
                    "coo",
                    DType::Int16,
                    &COO_SHAPE,
                    &coo_flat(),
                    &coo_values,
                    &o,
                )
                .unwrap();
            });

            let csr = tensor(&f, "csr");
            assert_eq!(csr.layout_name, "sparse", "{ctx}");
            assert_eq!(csr.shape, CSR_SHAPE, "{ctx}");
            let layout = csr.layout.as_ref().unwrap();
            assert_eq!(
                layout.sparse,
                Some(Sparse {
                    format: SparseFormat::Csr,
                    form: SparseForm::Spec,
                    nnz: 6
                }),
                "{ctx}"
            );
            let names: Vec<_> = layout.parts.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names, ["indptr", "indices", "values"], "{ctx}");
            assert_eq!(layout.parts[0].shape, [5], "{ctx}");
            assert_eq!(layout.parts[1].shape, [6], "{ctx}");
            assert_eq!(layout.parts[2].shape, [6], "{ctx}");
            assert_eq!(layout.parts[2].dtype, DType::Float32, "{ctx}");
            let expected = vec![
                le_u64s(&CSR_INDPTR),
                le_u64s(&CSR_INDICES),
                csr_values.clone(),
            ];
            if compression == Compression::Raw {
                // On disk: the parts back to back, each in the stored order.
                let disk: Vec<u8> = if endian == Endian::Big {
                    [
                        swapped(&expected[0], 8),
                        swapped(&expected[1], 8),
                        swapped(&expected[2], 4),
                    ]
                    .concat()
                } else {
                    expected.concat()
                };
                assert_eq!(f.blob(csr), &disk[..], "{ctx}");
            }
            assert_eq!(f.verify(csr), Verdict::Verified, "{ctx}");
            assert_eq!(f.read_all(csr).unwrap(), expected, "{ctx}");
            for (part, whole) in layout.parts.iter().zip(&expected) {
                for (off, len) in [(3, 6), (1, 100), (9, 9)] {
                    assert_eq!(
                        f.read_part(csr, part, off, len, true).unwrap(),
                        slice_of(whole, off, len),
                        "{ctx} {} [{off}+{len}]",
                        part.name
                    );
                }
            }

            let coo = tensor(&f, "coo");
            let layout = coo.layout.as_ref().unwrap();
            assert_eq!(
                layout.sparse,
                Some(Sparse {
                    format: SparseFormat::Coo,
                    form: SparseForm::Spec,
                    nnz: 4
                }),
                "{ctx}"
            );
            let names: Vec<_> = layout.parts.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names, ["indices", "values"], "{ctx}");
            assert_eq!(layout.parts[0].shape, [3, 4], "{ctx}");
            assert_eq!(layout.parts[1].shape, [4], "{ctx}");
            assert_eq!(
                f.read_all(coo).unwrap(),
                vec![le_u64s(&coo_flat()), coo_values.clone()],
                "{ctx}"
            );
        }
    }
}

/// Stores little-endian `bytes` of `es`-byte elements in `endian` order.
fn in_order(bytes: &[u8], es: usize, endian: Endian) -> Vec<u8> {
    match endian {
        Endian::Little => bytes.to_vec(),
        Endian::Big => swapped(bytes, es),
    }
}

/// zstd without the decoded size in the frame header, so the reader cannot
/// learn it from the header.
fn zstd_without_content_size(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_contentsize(false).unwrap();
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

#[test]
fn reference_form_sparse_exposes_csr_parts_and_coo_index_arrays() {
    let dir = tempfile::tempdir().unwrap();
    let values = sample(DType::Float64, CSR_INDICES.len());
    let coo_values = sample(DType::Uint16, 4);
    let ndim = COO_SHAPE.len();
    type Encode = fn(&[u8]) -> Vec<u8>;
    let encodings: [(&str, Encode); 3] = [
        ("raw", |b| b.to_vec()),
        ("zstd", |b| zstd::bulk::compress(b, 3).unwrap()),
        ("zstd-nosize", zstd_without_content_size),
    ];
    for (ename, encode) in encodings {
        for endian in [Endian::Little, Endian::Big] {
            let ctx = format!("{ename}-{}", endian.name());
            let encoding = if ename == "raw" { "raw" } else { "zstd" };
            let csr_blob = [
                in_order(&le_u64s(&CSR_INDPTR), 8, endian),
                in_order(&le_u64s(&CSR_INDICES), 8, endian),
                in_order(&values, 8, endian),
            ]
            .concat();
            // COO records: ndim u64 indices, then the value.
            let mut coo_blob = Vec::new();
            for k in 0..4 {
                for dim in &COO_INDICES {
                    coo_blob.extend(in_order(&dim[k].to_le_bytes(), 8, endian));
                }
                coo_blob.extend(in_order(&coo_values[2 * k..2 * k + 2], 2, endian));
            }
            let path = dir.path().join(format!("{ctx}.zt"));
            let f = write_and_open(&path, |w| {
                for (name, layout, dtype, dims, blob) in [
                    ("csr", "sparsecsr", "float64", &CSR_SHAPE[..], &csr_blob),
                    ("coo", "sparsecoo", "uint16", &COO_SHAPE[..], &coo_blob),
                ] {
                    w.add_blob(
                        &encode(blob),
                        fields(vec![
                            ("name", text(name)),
                            ("dtype", text(dtype)),
                            ("shape", shape(dims)),
                            ("encoding", text(encoding)),
                            ("layout", text(layout)),
                            ("data_endianness", text(endian.name())),
                        ]),
                    )
                    .unwrap();
                }
            });
            if ename == "zstd-nosize" {
                assert_eq!(
                    zstd_blob::scan_frames(f.blob(tensor(&f, "coo"))).unwrap(),
                    None,
                    "the frame must not declare its size for this case"
                );
            }

            let csr = tensor(&f, "csr");
            let layout = csr.layout.as_ref().unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(
                layout.sparse,
                Some(Sparse {
                    format: SparseFormat::Csr,
                    form: SparseForm::Reference,
                    nnz: 6
                }),
                "{ctx}"
            );
            let shapes: Vec<_> = layout
                .parts
                .iter()
                .map(|p| (p.name.as_str(), p.shape.clone()))
                .collect();
            assert_eq!(
                shapes,
                [
                    ("indptr", vec![5]),
                    ("indices", vec![6]),
                    ("values", vec![6])
                ],
                "{ctx}"
            );
            assert_eq!(
                f.read_all(csr).unwrap(),
                vec![le_u64s(&CSR_INDPTR), le_u64s(&CSR_INDICES), values.clone()],
                "{ctx}"
            );

            let coo = tensor(&f, "coo");
            let layout = coo.layout.as_ref().unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(
                layout.sparse,
                Some(Sparse {
                    format: SparseFormat::Coo,
                    form: SparseForm::Reference,
                    nnz: 4
                }),
                "{ctx}"
            );
            assert_eq!(layout.parts[0].name, "indices");
            assert_eq!(layout.parts[0].shape, [ndim as u64, 4], "{ctx}");
            assert_eq!(layout.parts[1].shape, [4], "{ctx}");
            let expected = vec![le_u64s(&coo_flat()), coo_values.clone()];
            assert_eq!(f.read_all(coo).unwrap(), expected, "{ctx}");
            // Gathered parts, read in pieces that split elements.
            for (part, whole) in layout.parts.iter().zip(&expected) {
                for (off, len) in awkward_ranges(whole.len() as u64) {
                    assert_eq!(
                        f.read_part(coo, part, off, len, false).unwrap(),
                        slice_of(whole, off, len),
                        "{ctx} {} [{off}+{len}]",
                        part.name
                    );
                }
            }
        }
    }
}

/// CBOR for the text string `s`, split into definite-length chunks inside
/// an indefinite-length string.
fn chunked_text(s: &str) -> Vec<u8> {
    let mut out = vec![0x7f];
    for piece in s.as_bytes().chunks(2) {
        out.push(0x60 | piece.len() as u8);
        out.extend_from_slice(piece);
    }
    out.push(0xff);
    out
}

fn short_text(s: &str) -> Vec<u8> {
    assert!(s.len() < 24);
    let mut out = vec![0x60 | s.len() as u8];
    out.extend_from_slice(s.as_bytes());
    out
}

#[test]
fn indefinite_length_cbor_and_every_integer_width_are_read() {
    // Four uint8 tensors at 64, 128, 192 and 256; each entry writes its
    // integers at a different width and the maps/arrays are indefinite.
    let blobs: Vec<(u64, Vec<u8>)> = (0..4u8)
        .map(|i| {
            (
                64 * (u64::from(i) + 1),
                vec![i * 10, i * 10 + 1, i * 10 + 2],
            )
        })
        .collect();
    let widths: [fn(u64) -> Vec<u8>; 4] = [
        |n| vec![0x18, n as u8],
        |n| [vec![0x19], (n as u16).to_be_bytes().to_vec()].concat(),
        |n| [vec![0x1a], (n as u32).to_be_bytes().to_vec()].concat(),
        |n| [vec![0x1b], n.to_be_bytes().to_vec()].concat(),
    ];
    let mut index = vec![0x9f]; // indefinite array
    for (i, (offset, blob)) in blobs.iter().enumerate() {
        let w = widths[i];
        index.push(0xbf); // indefinite map
        index.extend(short_text("name"));
        index.extend(chunked_text(&format!("t{i}")));
        index.extend(chunked_text("offset"));
        index.extend(w(*offset));
        index.extend(short_text("size"));
        index.extend(w(blob.len() as u64));
        index.extend(short_text("dtype"));
        index.extend(short_text("uint8"));
        index.extend(short_text("shape"));
        index.push(0x9f); // indefinite shape array
        index.extend(w(blob.len() as u64));
        index.push(0xff);
        index.extend(short_text("encoding"));
        index.extend(chunked_text("raw"));
        index.extend(short_text("note")); // custom, as an indefinite byte string
        index.extend([0x5f, 0x42, 1, 2, 0x41, 3, 0xff]);
        index.push(0xff);
    }
    index.push(0xff);
    let refs: Vec<(u64, &[u8])> = blobs.iter().map(|(o, b)| (*o, &b[..])).collect();
    let bytes = assemble(&data_region(&refs), &index);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("indefinite.zt");
    std::fs::write(&path, &bytes).unwrap();
    let f = ZtFile::open(&path).unwrap();
    assert_eq!(f.catalog().len(), 4);
    for (i, (offset, blob)) in blobs.iter().enumerate() {
        let t = tensor(&f, &format!("t{i}"));
        assert_eq!(t.offset, *offset);
        assert_eq!(t.size, 3);
        assert_eq!(t.shape, [3]);
        assert_eq!(t.encoding_name, "raw");
        assert_eq!(t.custom("note"), Some(&Value::Bytes(vec![1, 2, 3])));
        assert_eq!(f.read_all(t).unwrap(), vec![blob.clone()]);
    }
}

/// Produces `len` bytes computed on the fly, recording the largest request.
struct Generated {
    pos: u64,
    len: u64,
    largest_read: usize,
}

fn generated_byte(i: u64) -> u8 {
    // Compressible but not constant, and different in every 64 KiB.
    ((i >> 16) as u8).wrapping_mul(31) ^ (i as u8 & 0xf0)
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.largest_read = self.largest_read.max(buf.len());
        let n = (buf.len() as u64).min(self.len - self.pos) as usize;
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b = generated_byte(self.pos + k as u64);
        }
        self.pos += n as u64;
        Ok(n)
    }
}

#[test]
fn large_tensor_streams_through_the_writer() {
    const LEN: u64 = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("big.zt");
    let mut input = Generated {
        pos: 0,
        len: LEN,
        largest_read: 0,
    };
    let o = opts(
        Compression::Zstd {
            level: 1,
            frame_size: DEFAULT_FRAME_SIZE,
        },
        Endian::Little,
        Some(Algorithm::Crc32c),
    );
    let f = write_and_open(&path, |w| {
        w.add_from("big", DType::Float32, &[LEN / 4], &mut input, &o)
            .unwrap();
    });
    assert_eq!(input.pos, LEN, "the whole input was consumed");
    assert!(
        input.largest_read <= DEFAULT_FRAME_SIZE,
        "the writer asked for {} bytes at once; it should hold one frame",
        input.largest_read
    );
    let t = tensor(&f, "big");
    assert!(
        t.size < LEN / 8,
        "compressible input should shrink, got {}",
        t.size
    );
    let frames = zstd_blob::scan_frames(f.blob(t)).unwrap().unwrap();
    assert_eq!(frames.len() as u64, LEN / DEFAULT_FRAME_SIZE as u64);
    assert_eq!(f.verify(t), Verdict::Verified);

    let part = &t.layout.as_ref().unwrap().parts[0];
    let tail = f.read_part(t, part, LEN - 10, 100, true).unwrap();
    let want: Vec<u8> = (LEN - 10..LEN).map(generated_byte).collect();
    assert_eq!(tail, want);
    let all = f.read_all(t).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].len() as u64, LEN);
    if let Some(i) = (0..LEN).find(|&i| all[0][i as usize] != generated_byte(i)) {
        panic!("byte {i} differs after the round trip");
    }
}
