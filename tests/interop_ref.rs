//! Interoperability with the reference Rust crate `ztensor` 0.1.0: its files
//! read right through `ZtFile`, and our dense files read right through its
//! `ZTensorReader`.

mod common;

use ciborium::value::Value;
use common::*;
use ztensor::{
    ChecksumAlgorithm, DataEndianness, Encoding as RefEncoding, Layout as RefLayout, ZTensorReader,
    ZTensorWriter,
};
use ztensor_mount::formats::zt_v01::catalog::Sparse;
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{
    Algorithm, DType, Encoding, Endian, SparseForm, SparseFormat, Verdict, ZtFile,
};

fn ref_dtype(d: DType) -> ztensor::DType {
    use ztensor::DType as R;
    match d {
        DType::Float64 => R::Float64,
        DType::Float32 => R::Float32,
        DType::Float16 => R::Float16,
        DType::BFloat16 => R::BFloat16,
        DType::Int64 => R::Int64,
        DType::Int32 => R::Int32,
        DType::Int16 => R::Int16,
        DType::Int8 => R::Int8,
        DType::Uint64 => R::Uint64,
        DType::Uint32 => R::Uint32,
        DType::Uint16 => R::Uint16,
        DType::Uint8 => R::Uint8,
        DType::Bool => R::Bool,
        other => panic!("zTensor v0.1 has no {other}"),
    }
}

const SHAPE: [u64; 2] = [3, 5];

/// How the reference writer is asked to store a tensor.
#[derive(Clone, Copy, Debug)]
struct RefStore {
    encoding: &'static str,
    big_endian: bool,
    crc32c: bool,
}

const REF_STORES: [RefStore; 5] = [
    RefStore {
        encoding: "raw",
        big_endian: false,
        crc32c: false,
    },
    RefStore {
        encoding: "raw",
        big_endian: true,
        crc32c: false,
    },
    RefStore {
        encoding: "raw",
        big_endian: true,
        crc32c: true,
    },
    RefStore {
        encoding: "zstd",
        big_endian: false,
        crc32c: false,
    },
    RefStore {
        encoding: "zstd",
        big_endian: false,
        crc32c: true,
    },
];

impl RefStore {
    fn encoding(self) -> RefEncoding {
        if self.encoding == "zstd" {
            RefEncoding::Zstd
        } else {
            RefEncoding::Raw
        }
    }
    fn endianness(self) -> Option<DataEndianness> {
        Some(if self.big_endian {
            DataEndianness::Big
        } else {
            DataEndianness::Little
        })
    }
    fn checksum(self) -> ChecksumAlgorithm {
        if self.crc32c {
            ChecksumAlgorithm::Crc32c
        } else {
            ChecksumAlgorithm::None
        }
    }
}

#[test]
fn reference_dense_files_read_right() {
    let dir = tempfile::tempdir().unwrap();
    let n = numel(&SHAPE);
    for store in REF_STORES {
        let path = dir.path().join(format!(
            "{}-{}-{}.zt",
            store.encoding, store.big_endian, store.crc32c
        ));
        let mut w = ZTensorWriter::create(&path).unwrap();
        for d in DType::V01 {
            w.add_tensor(
                d.name(),
                SHAPE.to_vec(),
                ref_dtype(d),
                RefLayout::Dense,
                store.encoding(),
                sample(d, n),
                store.endianness(),
                store.checksum(),
                None,
            )
            .unwrap();
        }
        w.finalize().unwrap();

        let f = ZtFile::open(&path).unwrap();
        assert_eq!(f.catalog().len(), DType::V01.len());
        for d in DType::V01 {
            let ctx = format!("{store:?} {d}");
            let t = f.catalog().get(d.name()).unwrap();
            assert_eq!(t.dtype, Some(d), "{ctx}");
            assert_eq!(t.shape, SHAPE, "{ctx}");
            assert_eq!(t.encoding_name, store.encoding, "{ctx}");
            // The reference crate records (and applies) a byte order only
            // for raw multi-byte data.
            let big = store.big_endian && store.encoding == "raw" && d.size() > 1;
            let want_endian = if big { Endian::Big } else { Endian::Little };
            assert_eq!(t.endian, want_endian, "{ctx}");
            let want_verdict = if store.crc32c {
                Verdict::Verified
            } else {
                Verdict::Absent
            };
            assert_eq!(f.verify(t), want_verdict, "{ctx}");
            assert_eq!(f.read_all(t).unwrap(), vec![sample(d, n)], "{ctx}");
        }
    }
}

fn numel(dims: &[u64]) -> usize {
    dims.iter().product::<u64>() as usize
}

/// Custom fields of several CBOR kinds (the reference value type has no
/// tags), in key order as the reference writer's `BTreeMap` keeps them.
fn custom_fields() -> Vec<(&'static str, Value)> {
    vec![
        ("author", text("interop test")),
        ("bytes", Value::Bytes(vec![0, 0xff])),
        ("flag", Value::Bool(true)),
        ("list", Value::Array(vec![uint(1), text("b"), Value::Null])),
        (
            "nested",
            map(vec![("k", sint(-7)), ("pi", Value::Float(3.25))]),
        ),
        ("step", uint(1234567)),
    ]
}

#[test]
fn reference_custom_fields_read_right() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custom.zt");
    let mut w = ZTensorWriter::create(&path).unwrap();
    // The reference crate's value type is not nameable from here; let the
    // call site pick it and fill it by decoding CBOR.
    let custom = ciborium::de::from_reader(&cbor(&map(custom_fields()))[..]).unwrap();
    w.add_tensor(
        "t",
        vec![2],
        ztensor::DType::Int32,
        RefLayout::Dense,
        RefEncoding::Raw,
        sample(DType::Int32, 2),
        None,
        ChecksumAlgorithm::Crc32c,
        Some(custom),
    )
    .unwrap();
    w.finalize().unwrap();

    // serde's `flatten` makes the reference writer emit indefinite-length
    // maps (0xbf ... 0xff), so this also reads those from a real writer.
    let bytes = std::fs::read(&path).unwrap();
    let index_len = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().unwrap()) as usize;
    let index = &bytes[bytes.len() - 8 - index_len..bytes.len() - 8];
    assert_eq!(&index[..2], [0x81, 0xbf], "one entry, an indefinite map");

    let f = ZtFile::open(&path).unwrap();
    let t = f.catalog().get("t").unwrap();
    let want: Vec<(Value, Value)> = custom_fields()
        .into_iter()
        .map(|(k, v)| (text(k), v))
        .collect();
    assert_eq!(t.custom, want);
    assert_eq!(f.verify(t), Verdict::Verified);
    assert_eq!(f.read_all(t).unwrap(), vec![sample(DType::Int32, 2)]);
}

/// A 3x4 float64 matrix with 4 nonzeros. The reference writer insists that
/// a sparse blob is as long as the dense tensor (12 * 8 bytes), which these
/// sizes satisfy: CSR 4 + 4 + 4 u64-sized words, COO 4 records of 3 words.
const SPARSE_SHAPE: [u64; 2] = [3, 4];
const INDPTR: [u64; 4] = [0, 2, 2, 4];
const INDICES: [u64; 4] = [1, 3, 0, 2];
const ROWS: [u64; 4] = [0, 0, 2, 2];
const VALUES: [f64; 4] = [1.5, -2.0, 3.25, 4.0];

fn values_le() -> Vec<u8> {
    VALUES.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn reference_sparse_tensors_read_right() {
    let csr_blob = [le_u64s(&INDPTR), le_u64s(&INDICES), values_le()].concat();
    let mut coo_blob = Vec::new();
    for k in 0..4 {
        coo_blob.extend(ROWS[k].to_le_bytes());
        coo_blob.extend(INDICES[k].to_le_bytes());
        coo_blob.extend(VALUES[k].to_le_bytes());
    }
    let dir = tempfile::tempdir().unwrap();
    for store in REF_STORES {
        let ctx = format!("{store:?}");
        let path = dir.path().join(format!(
            "{}-{}-{}.zt",
            store.encoding, store.big_endian, store.crc32c
        ));
        let mut w = ZTensorWriter::create(&path).unwrap();
        for (name, layout, blob) in [
            ("csr", RefLayout::SparseCsr, &csr_blob),
            ("coo", RefLayout::SparseCoo, &coo_blob),
        ] {
            w.add_tensor(
                name,
                SPARSE_SHAPE.to_vec(),
                ztensor::DType::Float64,
                layout,
                store.encoding(),
                blob.clone(),
                store.endianness(),
                store.checksum(),
                None,
            )
            .unwrap();
        }
        w.finalize().unwrap();

        // The reference reader understands its own file as intended.
        let mut r = ZTensorReader::open(&path).unwrap();
        let csr = r.read_csr_tensor::<f64>("csr").unwrap();
        assert_eq!(csr.indptr, INDPTR, "{ctx}");
        assert_eq!(csr.values, VALUES, "{ctx}");
        let coo = r.read_coo_tensor::<f64>("coo").unwrap();
        assert_eq!(coo.indices[2], vec![ROWS[2], INDICES[2]], "{ctx}");

        let f = ZtFile::open(&path).unwrap();
        let t = f.catalog().get("csr").unwrap();
        assert_eq!(t.layout_name, "sparsecsr", "{ctx}");
        let layout = t.layout.as_ref().unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(
            layout.sparse,
            Some(Sparse {
                format: SparseFormat::Csr,
                form: SparseForm::Reference,
                nnz: 4
            }),
            "{ctx}"
        );
        assert_eq!(
            f.read_all(t).unwrap(),
            vec![le_u64s(&INDPTR), le_u64s(&INDICES), values_le()],
            "{ctx}"
        );

        let t = f.catalog().get("coo").unwrap();
        assert_eq!(t.layout_name, "sparsecoo", "{ctx}");
        let layout = t.layout.as_ref().unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(layout.sparse.as_ref().map(|s| s.nnz), Some(4), "{ctx}");
        assert_eq!(layout.parts[0].shape, [2, 4], "{ctx}");
        let index_array = [le_u64s(&ROWS), le_u64s(&INDICES)].concat();
        assert_eq!(
            f.read_all(t).unwrap(),
            vec![index_array, values_le()],
            "{ctx}"
        );
    }
}

#[test]
fn reference_empty_file_reads_as_no_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.zt");
    ZTensorWriter::create(&path).unwrap().finalize().unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 17);
    assert!(ZtFile::open(&path).unwrap().catalog().is_empty());
}

/// Our dense files, in the forms the reference reader understands: raw in
/// either byte order, zstd (little-endian; the reference reader does not
/// swap decoded zstd data) in one frame or many, with or without crc32c.
fn our_stores() -> Vec<(&'static str, Options)> {
    let o = |compression, endian, checksum| Options {
        compression,
        endian,
        checksum,
        custom: Vec::new(),
    };
    let frames = Compression::Zstd {
        level: 3,
        frame_size: 64,
    };
    let one_frame = Compression::Zstd {
        level: 3,
        frame_size: 0,
    };
    vec![
        ("raw-le", o(Compression::Raw, Endian::Little, None)),
        ("raw-be", o(Compression::Raw, Endian::Big, None)),
        (
            "raw-be-crc",
            o(Compression::Raw, Endian::Big, Some(Algorithm::Crc32c)),
        ),
        ("zstd-frames", o(frames, Endian::Little, None)),
        (
            "zstd-frames-crc",
            o(frames, Endian::Little, Some(Algorithm::Crc32c)),
        ),
        ("zstd-1frame", o(one_frame, Endian::Little, None)),
    ]
}

#[test]
fn our_dense_files_read_right_in_the_reference_reader() {
    let dir = tempfile::tempdir().unwrap();
    let n = 100;
    for (label, opts) in our_stores() {
        let path = dir.path().join(format!("{label}.zt"));
        let mut w = Writer::create(&path).unwrap();
        for d in DType::V01 {
            w.add(d.name(), d, &[4, 25], &sample(d, n), &opts).unwrap();
        }
        w.add("scalar", DType::Float64, &[], &2.5f64.to_le_bytes(), &opts)
            .unwrap();
        w.add("empty", DType::Int32, &[0, 3], &[], &opts).unwrap();
        w.finish().unwrap();
        if let Compression::Zstd { frame_size: 64, .. } = opts.compression {
            // Make sure the multi-frame case really has several frames.
            let f = ZtFile::open(&path).unwrap();
            let t = f.catalog().get("float64").unwrap();
            let frames = ztensor_mount::formats::zt_v01::zstd_blob::scan_frames(f.blob(t));
            assert!(frames.unwrap().unwrap().len() > 1, "{label}");
            assert_eq!(t.layout.as_ref().unwrap().encoding, Encoding::Zstd);
        }

        let mut r = ZTensorReader::open(&path).unwrap_or_else(|e| panic!("{label}: {e:?}"));
        assert_eq!(r.list_tensors().len(), DType::V01.len() + 2, "{label}");
        for d in DType::V01 {
            let got = r
                .read_raw_tensor_data_by_name(d.name())
                .unwrap_or_else(|e| panic!("{label} {d}: {e:?}"));
            assert_eq!(got, sample(d, n), "{label} {d}");
        }
        assert_eq!(r.read_typed_tensor_data::<f64>("scalar").unwrap(), [2.5]);
        assert!(r.read_raw_tensor_data_by_name("empty").unwrap().is_empty());
        // A typed read too, where the reference crate decodes the values.
        let ints: Vec<i32> = r.read_typed_tensor_data("int32").unwrap();
        let want: Vec<i32> = sample(DType::Int32, n)
            .as_chunks::<4>()
            .0
            .iter()
            .map(|c| i32::from_le_bytes(*c))
            .collect();
        assert_eq!(ints, want, "{label}");
    }
}

#[test]
fn our_custom_text_fields_read_right_in_the_reference_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("custom.zt");
    let opts = Options {
        checksum: Some(Algorithm::Crc32c),
        custom: vec![
            (text("author"), text("ztensor-mount tests")),
            (text("license"), text("MIT")),
            (text("step"), uint(42)),
        ],
        ..Options::default()
    };
    let mut w = Writer::create(&path).unwrap();
    w.add("t", DType::Uint16, &[3], &sample(DType::Uint16, 3), &opts)
        .unwrap();
    w.finish().unwrap();

    let mut r = ZTensorReader::open(&path).unwrap();
    let meta = r.get_tensor_metadata("t").unwrap().clone();
    // Back to CBOR and into our value type, to compare.
    let mut bytes = Vec::new();
    ciborium::ser::into_writer(&meta.custom_fields, &mut bytes).unwrap();
    let got: Value = ciborium::de::from_reader(&bytes[..]).unwrap();
    assert_eq!(
        got,
        map(vec![
            ("author", text("ztensor-mount tests")),
            ("license", text("MIT")),
            ("step", uint(42)),
        ])
    );
    assert_eq!(meta.checksum.as_deref().map(|c| &c[..9]), Some("crc32c:0x"));
    assert_eq!(
        r.read_raw_tensor_data_by_name("t").unwrap(),
        sample(DType::Uint16, 3)
    );
}

#[test]
fn our_empty_file_reads_right_in_the_reference_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.zt");
    Writer::create(&path).unwrap().finish().unwrap();
    let r = ZTensorReader::open(&path).unwrap();
    assert!(r.list_tensors().is_empty());
}
