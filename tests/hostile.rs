//! Hostile files: one test per rule of the reader, each built here, written
//! to a temporary directory and opened by path, so the error must name the
//! file. The same files are committed under `tests/hostile/` (with
//! `EXPECTED.tsv`) for mount-level tests; `ZT_REGEN_HOSTILE=1 cargo test
//! --test hostile` rewrites them.
//!
//! `EXPECTED.tsv` columns: file, outcome, message substring. The outcome is
//! an `ErrorKind` name. `Data` and `Unsupported` files (named `data_*`) open
//! fine and fail only when the affected tensor is read; `Unverifiable` means
//! the file reads fine but a checksum cannot be checked. Any other kind means
//! opening the file fails.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ciborium::value::{Integer, Value};
use common::*;
use ztensor_mount::formats::zt_v01::{Catalog, Error, ErrorKind, Verdict, ZtFile};

// ---------------------------------------------------------------------------
// Largest single allocation made by the current thread, to show that hostile
// lengths are not trusted.

struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every method hands its arguments to the system allocator
// unchanged and returns what it returns, so `Tracking` keeps each of
// `GlobalAlloc`'s contracts exactly as `System` does; `note` only records a
// size in a thread-local (`try_with`: nothing while the thread is torn
// down) and never allocates.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's promises for `alloc` are passed on as made.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's promises for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` (every allocation here does) with
        // this `layout`, as the caller promises.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as for `dealloc`, and `new_size` is the caller's, valid
        // for `layout`'s alignment as `realloc` requires.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Runs `f`, returning its result, the largest allocation it made on this
/// thread and how long it took.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, Duration) {
    LARGEST.with(|l| l.set(0));
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    (out, LARGEST.with(|l| l.get()), took)
}

// ---------------------------------------------------------------------------
// Expectations.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Opening the file fails with this kind.
    Refused(ErrorKind),
    /// The file opens; reading the tensor fails with `Data`.
    ReadData,
    /// The file opens; the tensor is listed but cannot be served.
    ReadUnsupported,
    /// The file opens and reads; the checksum cannot be checked.
    Unverifiable,
}

impl Outcome {
    fn column(self) -> String {
        match self {
            Outcome::Refused(k) => format!("{k:?}"),
            Outcome::ReadData => "Data".into(),
            Outcome::ReadUnsupported => "Unsupported".into(),
            Outcome::Unverifiable => "Unverifiable".into(),
        }
    }

    fn parse(s: &str) -> Outcome {
        use ErrorKind::*;
        match s {
            "Data" => Outcome::ReadData,
            "Unsupported" => Outcome::ReadUnsupported,
            "Unverifiable" => Outcome::Unverifiable,
            other => Outcome::Refused(
                [Io, NotZtensor, Index, Field, Placement, Size, Duplicate]
                    .into_iter()
                    .find(|k| format!("{k:?}") == other)
                    .unwrap_or_else(|| panic!("unknown outcome {other:?} in EXPECTED.tsv")),
            ),
        }
    }
}

struct Case {
    bytes: Vec<u8>,
    outcome: Outcome,
    /// A distinctive part of the message.
    needle: &'static str,
    /// The tensor the message must name, if any.
    tensor: Option<&'static str>,
}

fn refused(
    kind: ErrorKind,
    needle: &'static str,
    tensor: Option<&'static str>,
    bytes: Vec<u8>,
) -> Case {
    Case {
        bytes,
        outcome: Outcome::Refused(kind),
        needle,
        tensor,
    }
}

/// A file-level refusal that names no tensor.
fn bad_file(kind: ErrorKind, needle: &'static str, bytes: Vec<u8>) -> Case {
    refused(kind, needle, None, bytes)
}

/// A refusal because of the entry of tensor "t" (see `t_file`).
fn bad_t(kind: ErrorKind, needle: &'static str, bytes: Vec<u8>) -> Case {
    refused(kind, needle, Some("t"), bytes)
}

fn read_fails(
    outcome: Outcome,
    needle: &'static str,
    tensor: &'static str,
    bytes: Vec<u8>,
) -> Case {
    Case {
        bytes,
        outcome,
        needle,
        tensor: Some(tensor),
    }
}

/// Checks the one-line rendering of `e`: it starts with the file and names
/// the tensor, if there is one.
fn check_rendering(e: &Error, label: &str, tensor: Option<&str>) -> Result<(), String> {
    let line = e.to_string();
    if line.contains('\n') {
        return Err(format!("message is not one line: {line:?}"));
    }
    if e.file != label || !line.starts_with(&format!("{label}: ")) {
        return Err(format!(
            "message does not start with the file {label:?}: {line}"
        ));
    }
    match tensor {
        Some(t) if e.tensor.as_deref() != Some(t) || !line.contains(&format!("tensor {t:?}: ")) => {
            Err(format!("message does not name tensor {t:?}: {line}"))
        }
        None if e.tensor.is_some() => Err(format!("message names a tensor, expected none: {line}")),
        _ => Ok(()),
    }
}

fn check_error(e: &Error, kind: ErrorKind, needle: &str) -> Result<(), String> {
    if e.kind != kind {
        return Err(format!("expected {kind:?}, got {:?}: {e}", e.kind));
    }
    if !e.message.contains(needle) {
        return Err(format!("message lacks {needle:?}: {e}"));
    }
    Ok(())
}

/// Opens `path` and checks the outcome. `tensor` is the tensor that must be
/// named; when `None` for a read-time outcome, whichever tensor fails is
/// checked. Returns the refusal (or read failure) for comparisons.
fn check_path(
    path: &Path,
    outcome: Outcome,
    needle: &str,
    tensor: Option<&str>,
    strict_tensor: bool,
) -> Result<Option<Error>, String> {
    let label = path.display().to_string();
    let opened = ZtFile::open(path);
    let f = match (outcome, opened) {
        (Outcome::Refused(kind), Err(e)) => {
            check_error(&e, kind, needle)?;
            if strict_tensor {
                check_rendering(&e, &label, tensor)?;
            } else {
                check_rendering(&e, &label, e.tensor.as_deref())?;
            }
            return Ok(Some(e));
        }
        (Outcome::Refused(kind), Ok(_)) => {
            return Err(format!(
                "expected the file to be refused with {kind:?}, it opened"
            ));
        }
        (_, Err(e)) => return Err(format!("expected the file to open: {e}")),
        (_, Ok(f)) => f,
    };
    let mut failure = None;
    for t in &f.catalog().tensors {
        let named = tensor.is_none_or(|want| want == t.name);
        match outcome {
            Outcome::Unverifiable => {
                f.read_all(t).map_err(|e| format!("read failed: {e}"))?;
                if let Verdict::Unverifiable(what) = f.verify(t) {
                    if !named || !what.contains(needle) {
                        return Err(format!("tensor {:?} unverifiable as {what:?}", t.name));
                    }
                    failure = Some(Error::new(ErrorKind::Data, &label, Some(&t.name), what));
                }
            }
            _ => match f.read_all(t) {
                Ok(_) if named && tensor.is_some() => {
                    return Err(format!("tensor {:?} read fine", t.name));
                }
                Ok(_) => {}
                Err(e) => {
                    if !named {
                        return Err(format!("another tensor failed: {e}"));
                    }
                    let kind = if outcome == Outcome::ReadData {
                        ErrorKind::Data
                    } else {
                        let why = t.layout.as_ref().err();
                        if !why.is_some_and(|w| w.contains(needle)) {
                            return Err(format!("layout of {:?} is {:?}", t.name, t.layout));
                        }
                        ErrorKind::Unsupported
                    };
                    check_error(&e, kind, needle)?;
                    check_rendering(&e, &label, Some(&t.name))?;
                    failure = Some(e);
                }
            },
        }
    }
    failure
        .map(Some)
        .ok_or_else(|| "no tensor failed".to_string())
}

/// The checks of one rule: from memory, then from a file on disk.
fn run(name: &str, case: Case) {
    assert!(
        case.bytes.len() < 4096,
        "{name}: {} bytes is too big to commit",
        case.bytes.len()
    );
    if let Outcome::Refused(kind) = case.outcome {
        let label = format!("mem:{name}");
        let e = Catalog::parse(&case.bytes, &label)
            .err()
            .unwrap_or_else(|| panic!("{name}: Catalog::parse accepted it"));
        check_error(&e, kind, case.needle)
            .and_then(|()| check_rendering(&e, &label, case.tensor))
            .unwrap_or_else(|why| panic!("{name} (from memory): {why}"));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.zt"));
    std::fs::write(&path, &case.bytes).unwrap();
    check_path(&path, case.outcome, case.needle, case.tensor, true)
        .unwrap_or_else(|why| panic!("{name}: {why}"));
}

// ---------------------------------------------------------------------------
// Building blocks.

/// 16 bytes: a float32 [4] blob.
fn blob16() -> Vec<u8> {
    sample(ztensor_mount::formats::zt_v01::DType::Float32, 4)
}

/// The entry of a healthy float32 [4] tensor "t" at offset 64.
fn t_entry() -> Vec<(&'static str, Value)> {
    entry("t", 64, 16, "float32", &[4], "raw")
}

fn replace(
    mut pairs: Vec<(&'static str, Value)>,
    key: &'static str,
    v: Value,
) -> Vec<(&'static str, Value)> {
    match pairs.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = v,
        None => pairs.push((key, v)),
    }
    pairs
}

fn without(mut pairs: Vec<(&'static str, Value)>, key: &str) -> Vec<(&'static str, Value)> {
    pairs.retain(|(k, _)| *k != key);
    pairs
}

/// A file with the 16-byte blob at 64 and a single entry.
fn t_file(pairs: Vec<(&'static str, Value)>) -> Vec<u8> {
    file_with(&[(64, &blob16())], vec![map(pairs)])
}

/// A file with the 16-byte blob at 64 and the given raw index bytes.
fn t_file_raw_index(index: &[u8]) -> Vec<u8> {
    assemble(&data_region(&[(64, &blob16())]), index)
}

fn healthy() -> Vec<u8> {
    t_file(t_entry())
}

fn with_size_field(mut bytes: Vec<u8>, size: u64) -> Vec<u8> {
    let n = bytes.len();
    bytes[n - 8..].copy_from_slice(&size.to_le_bytes());
    bytes
}

fn big_int(n: i128) -> Value {
    Value::Integer(Integer::try_from(n).unwrap())
}

/// CBOR bytes of a map entry for tensor "t" with one extra custom field
/// whose value is `raw_value` (already encoded).
fn t_index_with_raw_field(raw_value: &[u8]) -> Vec<u8> {
    let pairs = t_entry();
    let mut out = vec![0x81, 0xa0 | (pairs.len() as u8 + 1)];
    for (k, v) in &pairs {
        out.extend(cbor(&text(k)));
        out.extend(cbor(v));
    }
    out.extend(cbor(&text("x")));
    out.extend_from_slice(raw_value);
    out
}

/// A sparse CSR entry of shape [2, 3] with nnz 2, float32 values and
/// uint64 indices: parts of 24, 16 and 8 bytes.
fn csr_entry(offsets: &[(&str, u64)], size: u64) -> Vec<(&'static str, Value)> {
    let mut e = entry("t", 64, size, "float32", &[2, 3], "raw");
    e.push(("layout", text("sparse")));
    e.push(("sparse_format", text("csr")));
    e.push(("nnz", uint(2)));
    e.push(("index_dtype", text("uint64")));
    e.push((
        "sparse_offsets",
        map(offsets.iter().map(|(k, o)| (*k, uint(*o))).collect()),
    ));
    e
}

const CSR_OFFSETS: [(&str, u64); 3] = [("indptr", 0), ("indices", 24), ("values", 40)];

fn csr_blob() -> Vec<u8> {
    [
        le_u64s(&[0, 1, 2]),
        le_u64s(&[0, 2]),
        sample(ztensor_mount::formats::zt_v01::DType::Float32, 2),
    ]
    .concat()
}

fn csr_file(pairs: Vec<(&'static str, Value)>) -> Vec<u8> {
    file_with(&[(64, &csr_blob())], vec![map(pairs)])
}

/// The CSR entry as the faulty tensor "bad", next to a healthy "ok".
fn csr_bad_file(pairs: Vec<(&'static str, Value)>) -> Vec<u8> {
    let pairs = replace(replace(pairs, "name", text("bad")), "offset", uint(128));
    with_ok_neighbour(&csr_blob(), pairs)
}

/// A healthy uint8 tensor "ok" at 64 next to a faulty tensor "bad" at 128.
fn with_ok_neighbour(bad_blob: &[u8], bad: Vec<(&'static str, Value)>) -> Vec<u8> {
    let ok = [1u8, 2, 3, 4];
    file_with(
        &[(64, &ok), (128, bad_blob)],
        vec![map(entry("ok", 64, 4, "uint8", &[4], "raw")), map(bad)],
    )
}

fn bad_entry(blob: &[u8], dtype: &str, dims: &[u64], encoding: &str) -> Vec<(&'static str, Value)> {
    entry("bad", 128, blob.len() as u64, dtype, dims, encoding)
}

// ---------------------------------------------------------------------------
// The rules. Each function builds one file; `hostile!` below turns each into
// a test of the same name and a file `<name>.zt` in the corpus.

mod cases {
    use super::*;
    use ErrorKind::*;

    pub fn bad_magic() -> Case {
        let mut b = healthy();
        b[..8].copy_from_slice(b"ZTEN0002");
        bad_file(NotZtensor, "\"ZTEN0002\"", b)
    }

    pub fn empty_file() -> Case {
        bad_file(NotZtensor, "the file is empty", Vec::new())
    }

    pub fn shorter_than_magic() -> Case {
        bad_file(NotZtensor, "\"ZTEN00\"", b"ZTEN00".to_vec())
    }

    pub fn shorter_than_16_bytes() -> Case {
        let mut b = MAGIC.to_vec();
        b.extend([0x80, 1, 0, 0]);
        bad_file(Index, "too short for the trailing index size", b)
    }

    pub fn index_size_past_magic() -> Case {
        let b = healthy();
        let too_big = b.len() as u64 - 16 + 1;
        bad_file(
            Index,
            "is larger than the file allows",
            with_size_field(b, too_big),
        )
    }

    pub fn index_size_u64_max() -> Case {
        bad_file(
            Index,
            "index size 18446744073709551615 is larger than the file allows",
            with_size_field(healthy(), u64::MAX),
        )
    }

    pub fn index_size_zero() -> Case {
        let mut b = MAGIC.to_vec();
        b.extend(0u64.to_le_bytes());
        bad_file(Index, "index size is 0", b)
    }

    pub fn index_not_cbor() -> Case {
        // 0x1c: an integer with a reserved length code.
        bad_file(Index, "index is not valid CBOR", t_file_raw_index(&[0x1c]))
    }

    pub fn index_truncated_cbor() -> Case {
        // An array of two maps that ends inside the first.
        let mut index = vec![0x82];
        index.extend(&cbor(&map(t_entry()))[..20]);
        bad_file(
            Index,
            "index is not valid CBOR: unexpected end of data",
            t_file_raw_index(&index),
        )
    }

    pub fn index_trailing_bytes() -> Case {
        let mut index = cbor(&Value::Array(vec![map(t_entry())]));
        index.extend([0x00, 0x00]);
        bad_file(
            Index,
            "2 trailing bytes after the CBOR index array",
            t_file_raw_index(&index),
        )
    }

    pub fn index_not_array() -> Case {
        let index = cbor(&map(t_entry()));
        bad_file(
            Index,
            "index is a CBOR map, expected an array of maps",
            t_file_raw_index(&index),
        )
    }

    pub fn entry_not_map() -> Case {
        let index = cbor(&Value::Array(vec![map(t_entry()), text("oops")]));
        bad_file(
            Index,
            "index entry 1 is a CBOR text string, expected a map",
            t_file_raw_index(&index),
        )
    }

    pub fn missing_name() -> Case {
        refused(
            Field,
            "required field \"name\" is missing",
            Some("#0"),
            t_file(without(t_entry(), "name")),
        )
    }

    pub fn missing_offset() -> Case {
        bad_t(
            Field,
            "required field \"offset\" is missing",
            t_file(without(t_entry(), "offset")),
        )
    }

    pub fn missing_size() -> Case {
        bad_t(
            Field,
            "required field \"size\" is missing",
            t_file(without(t_entry(), "size")),
        )
    }

    pub fn missing_dtype() -> Case {
        bad_t(
            Field,
            "required field \"dtype\" is missing",
            t_file(without(t_entry(), "dtype")),
        )
    }

    pub fn missing_shape() -> Case {
        bad_t(
            Field,
            "required field \"shape\" is missing",
            t_file(without(t_entry(), "shape")),
        )
    }

    pub fn missing_encoding() -> Case {
        bad_t(
            Field,
            "required field \"encoding\" is missing",
            t_file(without(t_entry(), "encoding")),
        )
    }

    pub fn offset_as_text() -> Case {
        bad_t(
            Field,
            "field \"offset\" is a CBOR text string, expected an unsigned integer",
            t_file(replace(t_entry(), "offset", text("64"))),
        )
    }

    pub fn size_negative() -> Case {
        bad_t(
            Field,
            "field \"size\" is negative (-16)",
            t_file(replace(t_entry(), "size", sint(-16))),
        )
    }

    pub fn shape_as_map() -> Case {
        bad_t(
            Field,
            "field \"shape\" is a CBOR map, expected an array",
            t_file(replace(t_entry(), "shape", map(vec![("0", uint(4))]))),
        )
    }

    pub fn dtype_as_int() -> Case {
        bad_t(
            Field,
            "field \"dtype\" is a CBOR integer, expected a text string",
            t_file(replace(t_entry(), "dtype", uint(4))),
        )
    }

    pub fn name_as_bytes() -> Case {
        refused(
            Field,
            "field \"name\" is a CBOR byte string, expected a text string",
            Some("#0"),
            t_file(replace(t_entry(), "name", Value::Bytes(b"t".to_vec()))),
        )
    }

    pub fn layout_as_int() -> Case {
        bad_t(
            Field,
            "field \"layout\" is a CBOR integer, expected a text string",
            t_file(replace(t_entry(), "layout", uint(0))),
        )
    }

    pub fn dimension_as_float() -> Case {
        bad_t(
            Field,
            "shape[1] is a CBOR float, expected an unsigned integer",
            t_file(replace(
                t_entry(),
                "shape",
                Value::Array(vec![uint(2), Value::Float(2.0)]),
            )),
        )
    }

    pub fn dimension_bignum() -> Case {
        // Tag 2 (unsigned bignum) holding 2^64.
        let two_to_64 = Value::Tag(2, Box::new(Value::Bytes(vec![1, 0, 0, 0, 0, 0, 0, 0, 0])));
        bad_t(
            Field,
            "shape[0] is a CBOR tag, expected an unsigned integer",
            t_file(replace(t_entry(), "shape", Value::Array(vec![two_to_64]))),
        )
    }

    pub fn empty_name() -> Case {
        refused(
            Field,
            "field \"name\" is empty",
            Some(""),
            t_file(replace(t_entry(), "name", text(""))),
        )
    }

    pub fn name_with_nul() -> Case {
        refused(
            Field,
            "field \"name\" contains a NUL byte",
            Some("a\0b"),
            t_file(replace(t_entry(), "name", text("a\0b"))),
        )
    }

    pub fn negative_dimension() -> Case {
        bad_t(
            Field,
            "shape[0] is negative (-3)",
            t_file(replace(
                t_entry(),
                "shape",
                Value::Array(vec![sint(-3), uint(2)]),
            )),
        )
    }

    pub fn dimension_below_u64_range() -> Case {
        // -2^64, the most negative CBOR integer.
        bad_t(
            Field,
            "shape[0] is negative (-18446744073709551616)",
            t_file(replace(
                t_entry(),
                "shape",
                Value::Array(vec![big_int(-(1i128 << 64))]),
            )),
        )
    }

    pub fn shape_product_overflow() -> Case {
        bad_t(
            Size,
            "has more than 2^64 elements",
            t_file(replace(t_entry(), "shape", shape(&[1 << 32, 1 << 32, 2]))),
        )
    }

    pub fn nbytes_overflow() -> Case {
        // 2^62 elements fit; 2^62 float32 values (2^64 bytes) do not.
        bad_t(
            Size,
            "shape [4611686018427387904] of float32 is more than 2^64 bytes",
            t_file(replace(t_entry(), "shape", shape(&[1 << 62]))),
        )
    }

    pub fn offset_misaligned() -> Case {
        let b = file_with(
            &[(72, &blob16())],
            vec![map(replace(t_entry(), "offset", uint(72)))],
        );
        bad_t(Placement, "offset 72 is not a multiple of 64", b)
    }

    pub fn offset_inside_magic() -> Case {
        bad_t(
            Placement,
            "offset 0 lies inside the 8-byte magic",
            t_file(replace(t_entry(), "offset", uint(0))),
        )
    }

    pub fn blob_runs_into_index() -> Case {
        // 17 bytes from 64: one byte into the index.
        bad_t(
            Placement,
            "blob [64, 81) runs into the index, which starts at 80",
            t_file(replace(t_entry(), "size", uint(17))),
        )
    }

    pub fn blob_past_end_of_file() -> Case {
        bad_t(
            Placement,
            "blob [64, 100064) runs past the end of the file",
            t_file(replace(t_entry(), "size", uint(100_000))),
        )
    }

    pub fn offset_plus_size_overflow() -> Case {
        bad_t(
            Placement,
            "offset 64 + size 18446744073709551600 overflows 64 bits",
            t_file(replace(t_entry(), "size", uint(u64::MAX - 15))),
        )
    }

    pub fn overlapping_blobs() -> Case {
        let blob = sample(ztensor_mount::formats::zt_v01::DType::Float32, 32);
        let b = file_with(
            &[(64, &blob)],
            vec![
                map(entry("a", 64, 128, "float32", &[32], "raw")),
                map(entry("b", 128, 16, "float32", &[4], "raw")),
            ],
        );
        refused(
            Placement,
            "blob [128, 144) overlaps tensor \"a\" at [64, 192)",
            Some("b"),
            b,
        )
    }

    pub fn raw_size_mismatch() -> Case {
        bad_t(
            Size,
            "raw blob is 12 bytes but shape [4] of float32 needs 16",
            t_file(replace(t_entry(), "size", uint(12))),
        )
    }

    pub fn unknown_endianness() -> Case {
        bad_t(
            Field,
            "field \"data_endianness\" is \"middle\", expected \"little\" or \"big\"",
            t_file(replace(t_entry(), "data_endianness", text("middle"))),
        )
    }

    pub fn duplicate_names() -> Case {
        let b = file_with(
            &[(64, &blob16()), (128, &blob16())],
            vec![map(t_entry()), map(replace(t_entry(), "offset", uint(128)))],
        );
        bad_t(
            Duplicate,
            "name is used by index entries 0 and 1; names must be unique",
            b,
        )
    }

    pub fn duplicate_key() -> Case {
        let mut pairs = t_entry();
        pairs.push(("offset", uint(64)));
        bad_t(Field, "field \"offset\" appears twice", t_file(pairs))
    }

    pub fn duplicate_custom_key() -> Case {
        let mut pairs = t_entry();
        pairs.push(("note", text("one")));
        pairs.push(("note", text("two")));
        bad_t(Field, "field \"note\" appears twice", t_file(pairs))
    }

    pub fn duplicate_nested_key() -> Case {
        let mut pairs = t_entry();
        let inner = Value::Map(vec![(text("a"), uint(1)), (text("a"), uint(2))]);
        pairs.push(("meta", Value::Array(vec![inner])));
        bad_t(
            Field,
            "field \"meta\": key \"a\" appears twice in a map",
            t_file(pairs),
        )
    }

    pub fn custom_keys_colliding_in_json() -> Case {
        // The integer key 7 reads "$key:7" in a sidecar, like this text key.
        let mut m: Vec<(Value, Value)> = t_entry().into_iter().map(|(k, v)| (text(k), v)).collect();
        m.push((uint(7), uint(1)));
        m.push((text("$key:7"), uint(2)));
        bad_t(
            Field,
            "field \"$key:7\" appears twice",
            file_with(&[(64, &blob16())], vec![Value::Map(m)]),
        )
    }

    pub fn custom_key_is_a_map() -> Case {
        // A key that is a map whose key is a map, 40 deep: spelled as JSON,
        // each level would double the escaping (2^40 bytes).
        let mut key = text("k\"");
        for _ in 0..40 {
            key = Value::Map(vec![(key, uint(0))]);
        }
        let mut pairs = t_entry();
        pairs.push(("meta", Value::Map(vec![(key, uint(1))])));
        bad_t(
            Field,
            "field \"meta\": a map key is a CBOR map; keys must be scalars",
            t_file(pairs),
        )
    }

    pub fn malformed_crc32c() -> Case {
        bad_t(
            Field,
            "malformed crc32c checksum \"crc32c:0xNOTHEX\"",
            t_file(replace(t_entry(), "checksum", text("crc32c:0xNOTHEX"))),
        )
    }

    pub fn malformed_crc32c_too_long() -> Case {
        bad_t(
            Field,
            "malformed crc32c checksum \"crc32c:0x123456789\"",
            t_file(replace(t_entry(), "checksum", text("crc32c:0x123456789"))),
        )
    }

    pub fn malformed_crc32c_signed() -> Case {
        // Rust's integer parsing takes a leading '+'; a checksum must not.
        bad_t(
            Field,
            "malformed crc32c checksum \"crc32c:0x+1234567\"",
            t_file(replace(t_entry(), "checksum", text("crc32c:0x+1234567"))),
        )
    }

    pub fn malformed_sha256_signed() -> Case {
        let digest = format!("sha256:{}", "+a".repeat(32));
        bad_t(
            Field,
            "malformed sha256 checksum \"sha256:+a+a",
            t_file(replace(t_entry(), "checksum", text(&digest))),
        )
    }

    pub fn malformed_sha256() -> Case {
        bad_t(
            Field,
            "malformed sha256 checksum \"sha256:abcd\" (want 64 hex digits)",
            t_file(replace(t_entry(), "checksum", text("sha256:abcd"))),
        )
    }

    pub fn deeply_nested_arrays() -> Case {
        let mut v = vec![0x81; 3000];
        v.push(0x00);
        bad_file(
            Index,
            "nested deeper than 64 levels",
            t_file_raw_index(&t_index_with_raw_field(&v)),
        )
    }

    pub fn deeply_nested_maps() -> Case {
        let mut v = [0xa1, 0x00].repeat(1500);
        v.push(0x00);
        bad_file(
            Index,
            "nested deeper than 64 levels",
            t_file_raw_index(&t_index_with_raw_field(&v)),
        )
    }

    pub fn deeply_nested_tags() -> Case {
        // Tag 6 (unassigned) wrapping itself.
        let mut v = vec![0xc6; 3000];
        v.push(0x00);
        bad_file(
            Index,
            "nested deeper than 64 levels",
            t_file_raw_index(&t_index_with_raw_field(&v)),
        )
    }

    pub fn huge_index_array_length() -> Case {
        let mut index = vec![0x9b];
        index.extend(u64::MAX.to_be_bytes());
        bad_file(Index, "index is not valid CBOR", t_file_raw_index(&index))
    }

    pub fn huge_array_length_in_field() -> Case {
        let mut v = vec![0x9b];
        v.extend(u64::MAX.to_be_bytes());
        bad_file(
            Index,
            "index is not valid CBOR",
            t_file_raw_index(&t_index_with_raw_field(&v)),
        )
    }

    pub fn huge_map_length_in_field() -> Case {
        let mut v = vec![0xbb];
        v.extend(u64::MAX.to_be_bytes());
        bad_file(
            Index,
            "index is not valid CBOR",
            t_file_raw_index(&t_index_with_raw_field(&v)),
        )
    }

    pub fn huge_byte_string_length() -> Case {
        let mut v = vec![0x5b];
        v.extend(u64::MAX.to_be_bytes());
        bad_file(
            Index,
            "index is not valid CBOR",
            t_file_raw_index(&t_index_with_raw_field(&v)),
        )
    }

    pub fn huge_text_string_length() -> Case {
        let mut v = vec![0x7b];
        v.extend((u64::MAX >> 1).to_be_bytes());
        bad_file(
            Index,
            "index is not valid CBOR",
            t_file_raw_index(&t_index_with_raw_field(&v)),
        )
    }

    pub fn sparse_missing_format() -> Case {
        bad_t(
            Field,
            "layout \"sparse\" needs the field \"sparse_format\"",
            csr_file(without(csr_entry(&CSR_OFFSETS, 48), "sparse_format")),
        )
    }

    // Sparse metadata in another convention than this project's (the spec
    // leaves all but `sparse_format` to the writer): that tensor is listed
    // as unsupported, its neighbours are served.
    pub fn data_sparse_missing_nnz() -> Case {
        read_fails(
            Outcome::ReadUnsupported,
            "layout \"sparse\" needs the field \"nnz\"",
            "bad",
            csr_bad_file(without(csr_entry(&CSR_OFFSETS, 48), "nnz")),
        )
    }

    pub fn data_sparse_missing_offsets() -> Case {
        read_fails(
            Outcome::ReadUnsupported,
            "layout \"sparse\" needs the field \"sparse_offsets\"",
            "bad",
            csr_bad_file(without(csr_entry(&CSR_OFFSETS, 48), "sparse_offsets")),
        )
    }

    pub fn data_sparse_offsets_wrong_part() -> Case {
        let offsets = [("indptr", 0), ("idx", 24), ("values", 40)];
        read_fails(
            Outcome::ReadUnsupported,
            "field \"sparse_offsets\" lacks the part \"indices\"",
            "bad",
            csr_bad_file(csr_entry(&offsets, 48)),
        )
    }

    pub fn data_sparse_overlapping_parts() -> Case {
        // indptr is 24 bytes from 0; indices start at 16.
        let offsets = [("indptr", 0), ("indices", 16), ("values", 40)];
        read_fails(
            Outcome::ReadUnsupported,
            "sparse parts indptr and indices overlap",
            "bad",
            csr_bad_file(csr_entry(&offsets, 48)),
        )
    }

    pub fn data_sparse_raw_size_mismatch() -> Case {
        read_fails(
            Outcome::ReadUnsupported,
            "raw sparse blob is 40 bytes but its parts end at 48",
            "bad",
            csr_bad_file(csr_entry(&CSR_OFFSETS, 40)),
        )
    }

    pub fn data_sparse_csr_not_2d() -> Case {
        read_fails(
            Outcome::ReadUnsupported,
            "a CSR tensor needs a 2-d shape, got [6]",
            "bad",
            csr_bad_file(replace(csr_entry(&CSR_OFFSETS, 48), "shape", shape(&[6]))),
        )
    }

    // --- Files that open: the fault shows when the tensor is read. -------

    pub fn data_zstd_garbage() -> Case {
        let blob = b"this is not a zstd frame at all!".to_vec();
        read_fails(
            Outcome::ReadData,
            "zstd data is corrupt",
            "bad",
            with_ok_neighbour(&blob, bad_entry(&blob, "uint8", &[32], "zstd")),
        )
    }

    pub fn data_zstd_bomb() -> Case {
        // 64 MiB of zeros in about 2 KiB, declared as 1024 bytes.
        let blob = zstd::bulk::compress(&vec![0u8; 64 << 20], 3).unwrap();
        read_fails(
            Outcome::ReadData,
            "zstd data decodes to more than the expected 1024 bytes",
            "bad",
            with_ok_neighbour(&blob, bad_entry(&blob, "uint8", &[1024], "zstd")),
        )
    }

    pub fn data_zstd_too_short() -> Case {
        let blob = zstd::bulk::compress(&[7u8; 100], 3).unwrap();
        read_fails(
            Outcome::ReadData,
            "zstd data decodes to only 100 bytes, expected 1000",
            "bad",
            with_ok_neighbour(&blob, bad_entry(&blob, "uint8", &[1000], "zstd")),
        )
    }

    pub fn data_zstd_truncated() -> Case {
        let data = sample(ztensor_mount::formats::zt_v01::DType::Float64, 64);
        let mut blob = zstd::bulk::compress(&data, 3).unwrap();
        blob.truncate(blob.len() - 5);
        read_fails(
            Outcome::ReadData,
            "zstd data is corrupt",
            "bad",
            with_ok_neighbour(&blob, bad_entry(&blob, "float64", &[64], "zstd")),
        )
    }

    pub fn data_crc32c_mismatch_raw() -> Case {
        let blob = blob16();
        let wrong = crc32c::crc32c(&blob) ^ 1;
        let e = replace(
            bad_entry(&blob, "float32", &[4], "raw"),
            "checksum",
            text(&format!("crc32c:0x{wrong:08X}")),
        );
        read_fails(
            Outcome::ReadData,
            "checksum mismatch",
            "bad",
            with_ok_neighbour(&blob, e),
        )
    }

    pub fn data_sha256_mismatch_zstd() -> Case {
        let blob = zstd::bulk::compress(&blob16(), 3).unwrap();
        let e = replace(
            bad_entry(&blob, "float32", &[4], "zstd"),
            "checksum",
            text(&format!("sha256:{}", "ab".repeat(32))),
        );
        read_fails(
            Outcome::ReadData,
            "checksum mismatch",
            "bad",
            with_ok_neighbour(&blob, e),
        )
    }

    pub fn data_unknown_dtype() -> Case {
        let blob = blob16();
        read_fails(
            Outcome::ReadUnsupported,
            "unsupported dtype \"complex64\"",
            "bad",
            with_ok_neighbour(&blob, bad_entry(&blob, "complex64", &[2], "raw")),
        )
    }

    pub fn data_unknown_encoding() -> Case {
        let blob = blob16();
        read_fails(
            Outcome::ReadUnsupported,
            "unsupported encoding \"lz4\"",
            "bad",
            with_ok_neighbour(&blob, bad_entry(&blob, "float32", &[4], "lz4")),
        )
    }

    pub fn data_unknown_layout() -> Case {
        let blob = blob16();
        let e = replace(
            bad_entry(&blob, "float32", &[4], "raw"),
            "layout",
            text("blocked"),
        );
        read_fails(
            Outcome::ReadUnsupported,
            "unsupported layout \"blocked\"",
            "bad",
            with_ok_neighbour(&blob, e),
        )
    }

    pub fn data_unknown_sparse_format() -> Case {
        let blob = blob16();
        let mut e = bad_entry(&blob, "float32", &[2, 2], "raw");
        e.push(("layout", text("sparse")));
        e.push(("sparse_format", text("bsr")));
        read_fails(
            Outcome::ReadUnsupported,
            "unsupported sparse_format \"bsr\"",
            "bad",
            with_ok_neighbour(&blob, e),
        )
    }

    pub fn data_sparsecsr_wrong_nnz() -> Case {
        // Reference CSR 2x2: indptr says 5 nonzeros, the blob holds one.
        let blob = [le_u64s(&[0, 1, 5]), le_u64s(&[1]), vec![9]].concat();
        let e = replace(
            bad_entry(&blob, "uint8", &[2, 2], "raw"),
            "layout",
            text("sparsecsr"),
        );
        read_fails(
            Outcome::ReadUnsupported,
            "indptr says nnz=5",
            "bad",
            with_ok_neighbour(&blob, e),
        )
    }

    pub fn data_sparsecsr_zstd_huge_indptr() -> Case {
        // 2^27 - 1 rows promise a 1 GiB indptr; the stream holds 24 bytes.
        let blob = zstd::bulk::compress(&le_u64s(&[0, 0, 0]), 3).unwrap();
        let e = replace(
            bad_entry(&blob, "uint8", &[(1 << 27) - 1, 1], "zstd"),
            "layout",
            text("sparsecsr"),
        );
        read_fails(
            Outcome::ReadUnsupported,
            "zstd data decodes to only 24 bytes",
            "bad",
            with_ok_neighbour(&blob, e),
        )
    }

    pub fn data_unknown_checksum() -> Case {
        let blob = blob16();
        let e = replace(
            bad_entry(&blob, "float32", &[4], "raw"),
            "checksum",
            text("md5:0123456789abcdef0123456789abcdef"),
        );
        read_fails(
            Outcome::Unverifiable,
            "md5:0123456789abcdef",
            "bad",
            with_ok_neighbour(&blob, e),
        )
    }
}

macro_rules! hostile {
    ($($name:ident),* $(,)?) => {
        /// Every case, by file stem.
        const ALL: &[(&str, fn() -> Case)] = &[$((stringify!($name), cases::$name)),*];
        $(
            #[test]
            fn $name() {
                run(stringify!($name), cases::$name());
            }
        )*
    };
}

hostile!(
    bad_magic,
    empty_file,
    shorter_than_magic,
    shorter_than_16_bytes,
    index_size_past_magic,
    index_size_u64_max,
    index_size_zero,
    index_not_cbor,
    index_truncated_cbor,
    index_trailing_bytes,
    index_not_array,
    entry_not_map,
    missing_name,
    missing_offset,
    missing_size,
    missing_dtype,
    missing_shape,
    missing_encoding,
    offset_as_text,
    size_negative,
    shape_as_map,
    dtype_as_int,
    name_as_bytes,
    layout_as_int,
    dimension_as_float,
    dimension_bignum,
    empty_name,
    name_with_nul,
    negative_dimension,
    dimension_below_u64_range,
    shape_product_overflow,
    nbytes_overflow,
    offset_misaligned,
    offset_inside_magic,
    blob_runs_into_index,
    blob_past_end_of_file,
    offset_plus_size_overflow,
    overlapping_blobs,
    raw_size_mismatch,
    unknown_endianness,
    duplicate_names,
    duplicate_key,
    duplicate_custom_key,
    duplicate_nested_key,
    custom_keys_colliding_in_json,
    custom_key_is_a_map,
    malformed_crc32c,
    malformed_crc32c_too_long,
    malformed_crc32c_signed,
    malformed_sha256,
    malformed_sha256_signed,
    deeply_nested_arrays,
    deeply_nested_maps,
    deeply_nested_tags,
    huge_index_array_length,
    huge_array_length_in_field,
    huge_map_length_in_field,
    huge_byte_string_length,
    huge_text_string_length,
    sparse_missing_format,
    data_sparse_missing_nnz,
    data_sparse_missing_offsets,
    data_sparse_offsets_wrong_part,
    data_sparse_overlapping_parts,
    data_sparse_raw_size_mismatch,
    data_sparse_csr_not_2d,
    data_zstd_garbage,
    data_zstd_bomb,
    data_zstd_too_short,
    data_zstd_truncated,
    data_crc32c_mismatch_raw,
    data_sha256_mismatch_zstd,
    data_unknown_dtype,
    data_unknown_encoding,
    data_unknown_layout,
    data_unknown_sparse_format,
    data_sparsecsr_wrong_nnz,
    data_sparsecsr_zstd_huge_indptr,
    data_unknown_checksum,
);

// ---------------------------------------------------------------------------
// Beyond single rules.

#[test]
fn nesting_100000_levels_deep_errors_without_overflowing_the_stack() {
    let dir = tempfile::tempdir().unwrap();
    let deep: [(&str, Vec<u8>); 4] = [
        ("arrays", vec![0x81; 100_000]),
        ("indefinite_arrays", vec![0x9f; 100_000]),
        ("maps", [0xa1, 0x00].repeat(100_000)),
        ("tags", vec![0xc6; 100_000]),
    ];
    for (what, mut v) in deep {
        v.push(0x00);
        // Both as a custom field and as the whole index.
        for (place, index) in [("field", t_index_with_raw_field(&v)), ("index", v.clone())] {
            let path = dir.path().join(format!("{what}_{place}.zt"));
            std::fs::write(&path, t_file_raw_index(&index)).unwrap();
            let e = ZtFile::open(&path).err().expect("refused");
            check_error(&e, ErrorKind::Index, "nested deeper than 64 levels")
                .unwrap_or_else(|why| panic!("{what} in {place}: {why}"));
        }
    }
}

#[test]
fn huge_declared_lengths_fail_fast_without_allocating() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "huge_index_array_length",
        "huge_array_length_in_field",
        "huge_map_length_in_field",
        "huge_byte_string_length",
        "huge_text_string_length",
    ] {
        let case = ALL.iter().find(|(n, _)| *n == name).unwrap().1();
        let path = dir.path().join(format!("{name}.zt"));
        std::fs::write(&path, &case.bytes).unwrap();
        let (opened, largest, took) = measured(|| ZtFile::open(&path));
        assert!(opened.is_err(), "{name}: opened");
        assert!(
            largest < 1 << 20,
            "{name}: allocated {largest} bytes at once"
        );
        assert!(took < Duration::from_secs(2), "{name}: took {took:?}");
    }
}

#[test]
fn zstd_bomb_is_stopped_at_the_declared_size() {
    let case = cases::data_zstd_bomb();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.zt");
    std::fs::write(&path, &case.bytes).unwrap();
    let f = ZtFile::open(&path).unwrap();
    let t = f.catalog().get("bad").unwrap();
    let (read, largest, took) = measured(|| f.read_all(t));
    assert_eq!(read.unwrap_err().kind, ErrorKind::Data);
    // The 64 MiB never lands in memory.
    assert!(largest < 4 << 20, "allocated {largest} bytes at once");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn sparse_shapes_are_not_trusted_for_memory_at_open() {
    let case = cases::data_sparsecsr_zstd_huge_indptr();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge_indptr.zt");
    std::fs::write(&path, &case.bytes).unwrap();
    let (opened, largest, _) = measured(|| ZtFile::open(&path));
    opened.unwrap();
    assert!(
        largest < 64 << 20,
        "opening a {}-byte file allocated {largest} bytes at once",
        case.bytes.len()
    );
}

#[test]
fn many_custom_keys_are_checked_in_linear_time() {
    // 200 000 distinct custom keys on one tensor; a pairwise duplicate
    // check would take minutes.
    let mut pairs = entry("t", 64, 16, "float32", &[4], "raw");
    let keys: Vec<String> = (0..200_000).map(|i| format!("k{i}")).collect();
    let mut m: Vec<(Value, Value)> = pairs.drain(..).map(|(k, v)| (text(k), v)).collect();
    m.extend(keys.iter().map(|k| (text(k), uint(1))));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.zt");
    std::fs::write(&path, file_with(&[(64, &blob16())], vec![Value::Map(m)])).unwrap();
    let (opened, _, took) = measured(|| ZtFile::open(&path));
    let f = opened.unwrap();
    assert!(f.catalog().get("t").unwrap().custom("k199999").is_some());
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn huge_indexes_are_refused_without_being_built() {
    let dir = tempfile::tempdir().unwrap();
    // One entry with a custom array of 2^21 + 1 one-byte items (2 MiB of
    // CBOR, 64 MiB decoded), and an index that is a map of 2^21 pairs.
    let mut pairs = t_entry();
    pairs.push(("flags", Value::Array(vec![uint(0); (1 << 21) + 1])));
    let big_entry = t_file(pairs);
    let big_map = t_file_raw_index(&cbor(&Value::Map(
        (0..1u64 << 21).map(|i| (uint(i), uint(0))).collect(),
    )));
    for (name, bytes, needle) in [
        (
            "entry",
            big_entry,
            "index entry 0 holds more than 2097152 CBOR items",
        ),
        (
            "map",
            big_map,
            "index is a CBOR map, expected an array of maps",
        ),
    ] {
        let path = dir.path().join(format!("{name}.zt"));
        std::fs::write(&path, bytes).unwrap();
        let (opened, largest, took) = measured(|| ZtFile::open(&path));
        let e = opened.err().unwrap_or_else(|| panic!("{name}: opened"));
        check_error(&e, ErrorKind::Index, needle).unwrap_or_else(|why| panic!("{name}: {why}"));
        assert!(
            largest < 1 << 20,
            "{name}: allocated {largest} bytes at once"
        );
        assert!(took < Duration::from_secs(5), "{name}: took {took:?}");
    }
    // Just under the limit, the entry opens (a 2^20-frame table must).
    let mut pairs = t_entry();
    pairs.push(("flags", Value::Array(vec![uint(0); (1 << 21) - 16])));
    let path = dir.path().join("under.zt");
    std::fs::write(&path, t_file(pairs)).unwrap();
    ZtFile::open(&path).unwrap();
}

/// zstd of `n` zero bytes, written a MiB at a time.
fn zstd_zeros(n: usize) -> Vec<u8> {
    use std::io::Write;
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    let mib = vec![0u8; 1 << 20];
    for _ in 0..n >> 20 {
        enc.write_all(&mib).unwrap();
    }
    enc.finish().unwrap()
}

#[test]
fn sparse_probes_stream_and_share_one_budget_per_file() {
    // Five CSR tensors whose indptr is 256 MiB of zeros (nnz = 0), from a
    // blob of a few KiB each: learning nnz means decoding all of it.
    let blob = zstd_zeros(256 << 20);
    let stride = blob.len().next_multiple_of(64) as u64;
    let names = ["p0", "p1", "p2", "p3", "p4"];
    let offsets: Vec<u64> = (0..names.len() as u64).map(|i| 64 + i * stride).collect();
    let blobs: Vec<(u64, &[u8])> = offsets.iter().map(|&o| (o, &blob[..])).collect();
    let entries = names
        .iter()
        .zip(&offsets)
        .map(|(n, &o)| {
            let e = entry(
                n,
                o,
                blob.len() as u64,
                "uint8",
                &[(1 << 25) - 1, 1],
                "zstd",
            );
            map(replace(e, "layout", text("sparsecsr")))
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probes.zt");
    std::fs::write(&path, file_with(&blobs, entries)).unwrap();

    let (opened, largest, took) = measured(|| ZtFile::open(&path));
    let f = opened.unwrap();
    // Streamed: nothing near the 256 MiB header is ever held.
    assert!(largest < 8 << 20, "allocated {largest} bytes at once");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    // The 1 GiB budget covers four; the fifth is listed but not served.
    for n in &names[..4] {
        let t = f.catalog().get(n).unwrap();
        let layout = t.layout.as_ref().unwrap_or_else(|e| panic!("{n}: {e}"));
        assert_eq!(layout.sparse.as_ref().map(|s| s.nnz), Some(0), "{n}");
    }
    let last = f.catalog().get("p4").unwrap();
    let why = last.layout.as_ref().unwrap_err();
    assert!(why.contains("budget"), "{why}");
}

#[test]
fn framed_sparse_blobs_are_probed_by_their_last_frame_only() {
    // Frames that declare their sizes (what `pack --zstd` writes): a CSR
    // probe decodes one frame, a COO probe none, so five 256 MiB indptrs
    // and a 2 GiB COO blob all fit the per-file budget.
    let frame = zstd::bulk::compress(&vec![0u8; 1 << 20], 1).unwrap();
    let csr = frame.repeat(256);
    let coo = frame.repeat(2048);
    let stride = |b: &[u8]| b.len().next_multiple_of(64) as u64;
    let mut blobs: Vec<(u64, &[u8])> = Vec::new();
    let mut entries = Vec::new();
    let mut at = 64;
    for n in ["c0", "c1", "c2", "c3", "c4"] {
        let e = entry(
            n,
            at,
            csr.len() as u64,
            "uint8",
            &[(1 << 25) - 1, 1],
            "zstd",
        );
        entries.push(map(replace(e, "layout", text("sparsecsr"))));
        blobs.push((at, &csr));
        at += stride(&csr);
    }
    // Records of one u64 index and a float64 value: 16 bytes each.
    let e = entry("coo", at, coo.len() as u64, "float64", &[1 << 30], "zstd");
    entries.push(map(replace(e, "layout", text("sparsecoo"))));
    blobs.push((at, &coo));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("framed.zt");
    std::fs::write(&path, file_with(&blobs, entries)).unwrap();
    let f = ZtFile::open(&path).unwrap();
    for (n, nnz) in [("c0", 0), ("c4", 0), ("coo", 1 << 27)] {
        let t = f.catalog().get(n).unwrap();
        let layout = t.layout.as_ref().unwrap_or_else(|e| panic!("{n}: {e}"));
        assert_eq!(layout.sparse.as_ref().map(|s| s.nnz), Some(nnz), "{n}");
    }
}

#[test]
fn missing_files_and_directories_are_io_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.zt");
    for (path, needle) in [
        (missing.as_path(), "cannot open"),
        (dir.path(), "not a regular file"),
    ] {
        let e = ZtFile::open(path).err().expect("refused");
        check_error(&e, ErrorKind::Io, needle)
            .and_then(|()| check_rendering(&e, &path.display().to_string(), None))
            .unwrap_or_else(|why| panic!("{}: {why}", path.display()));
    }
}

#[test]
fn data_faults_do_not_spoil_other_tensors() {
    let dir = tempfile::tempdir().unwrap();
    for (name, build) in ALL.iter().filter(|(n, _)| n.starts_with("data_")) {
        let path = dir.path().join(format!("{name}.zt"));
        std::fs::write(&path, build().bytes).unwrap();
        let f = ZtFile::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ok = f.catalog().get("ok").expect("healthy neighbour listed");
        assert_eq!(f.read_all(ok).unwrap(), vec![vec![1, 2, 3, 4]], "{name}");
        assert!(
            f.catalog().get("bad").is_some(),
            "{name}: faulty tensor listed"
        );
    }
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile")
}

const TSV_HEADER: &str = "\
# Hostile zTensor files and what reading them must give; see tests/hostile.rs.
# file<TAB>outcome<TAB>message substring
# outcome: an ErrorKind. Data and Unsupported files (data_*) open fine and
# fail only when the affected tensor is read; Unverifiable files read fine but
# their checksum algorithm is unknown. Any other kind: opening the file fails.
";

fn tsv_line(name: &str, case: &Case) -> String {
    format!("{name}.zt\t{}\t{}", case.outcome.column(), case.needle)
}

/// Rewrites the committed corpus when `ZT_REGEN_HOSTILE=1`.
fn regenerate(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "zt") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let mut tsv = TSV_HEADER.to_string();
    for (name, build) in ALL {
        let case = build();
        std::fs::write(dir.join(format!("{name}.zt")), &case.bytes).unwrap();
        tsv.push_str(&tsv_line(name, &case));
        tsv.push('\n');
    }
    std::fs::write(dir.join("EXPECTED.tsv"), tsv).unwrap();
}

#[test]
fn committed_corpus_gives_the_expected_errors() {
    let dir = corpus_dir();
    if std::env::var("ZT_REGEN_HOSTILE").is_ok_and(|v| v == "1") {
        regenerate(&dir);
    }
    let hint = "run `ZT_REGEN_HOSTILE=1 cargo test --test hostile` to rewrite tests/hostile/";

    // Every line of EXPECTED.tsv holds for its committed file.
    let tsv = std::fs::read_to_string(dir.join("EXPECTED.tsv"))
        .unwrap_or_else(|e| panic!("tests/hostile/EXPECTED.tsv: {e}; {hint}"));
    let lines: Vec<&str> = tsv
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    for line in &lines {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 3, "malformed EXPECTED.tsv line {line:?}");
        let path = dir.join(cols[0]);
        check_path(&path, Outcome::parse(cols[1]), cols[2], None, false)
            .unwrap_or_else(|why| panic!("{}: {why}", cols[0]));
    }

    // The table, the TSV and the files agree.
    let want: Vec<String> = ALL.iter().map(|(n, b)| tsv_line(n, &b())).collect();
    assert_eq!(
        lines, want,
        "EXPECTED.tsv differs from the generator; {hint}"
    );
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".zt"))
        .collect();
    on_disk.sort();
    let mut names: Vec<String> = ALL.iter().map(|(n, _)| format!("{n}.zt")).collect();
    names.sort();
    assert_eq!(
        on_disk, names,
        "corpus files differ from the generator; {hint}"
    );

    // Regenerated files give the same errors as the committed ones, and the
    // committed ones name the right tensor.
    let tmp = tempfile::tempdir().unwrap();
    for (name, build) in ALL {
        let case = build();
        let committed = dir.join(format!("{name}.zt"));
        let fresh = tmp.path().join(format!("{name}.zt"));
        std::fs::write(&fresh, &case.bytes).unwrap();
        let a = check_path(&committed, case.outcome, case.needle, case.tensor, true)
            .unwrap_or_else(|why| panic!("committed {name}: {why}"));
        let b = check_path(&fresh, case.outcome, case.needle, case.tensor, true)
            .unwrap_or_else(|why| panic!("regenerated {name}: {why}"));
        let strip = |e: Option<Error>| e.map(|e| (e.kind, e.tensor, e.message));
        assert_eq!(
            strip(a),
            strip(b),
            "{name}: committed and regenerated differ; {hint}"
        );
    }
}

#[test]
fn shapes_count_elements_only_for_dense_tensors_of_known_dtypes() {
    // A sparse [2^32, 2^32] matrix is legitimate, and an unsupported dtype
    // of any shape gets a sidecar: neither refuses the file.
    use ztensor_mount::formats::zt_v01::DType;
    use ztensor_mount::formats::zt_v01::writer::{Options, Writer};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big_shapes.zt");
    let mut w = Writer::create(&path).unwrap();
    let values: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let big = 1u64 << 32;
    w.add_coo(
        "coo",
        DType::Float32,
        &[big, big],
        &[7, big - 1, 3, 0],
        &values,
        &Options::default(),
    )
    .unwrap();
    let blob = [0u8; 64];
    let mut fields = entry("c64", 0, 64, "complex64", &[1 << 40, 1 << 40], "raw");
    fields.retain(|(k, _)| !matches!(*k, "offset" | "size"));
    let fields = fields
        .into_iter()
        .map(|(k, v)| (Value::Text(k.into()), v))
        .collect();
    w.add_blob(&blob, fields).unwrap();
    w.finish().unwrap();
    let f = ZtFile::open(&path).unwrap_or_else(|e| panic!("refused: {e}"));
    let coo = f.catalog().get("coo").expect("coo listed");
    let parts = f.read_all(coo).unwrap();
    assert_eq!(parts[1], values, "values");
    let idx: Vec<u8> = [7, big - 1, 3, 0]
        .iter()
        .flat_map(|v: &u64| v.to_le_bytes())
        .collect();
    assert_eq!(parts[0], idx, "indices");
    let c64 = f.catalog().get("c64").expect("c64 listed");
    assert!(
        c64.layout
            .as_ref()
            .is_err_and(|why| why.contains("complex64")),
        "{:?}",
        c64.layout.as_ref().err()
    );
}

#[test]
fn an_index_may_start_with_the_self_described_cbor_tag() {
    let mut index = vec![0xd9, 0xd9, 0xf7];
    index.extend(cbor(&Value::Array(vec![map(t_entry())])));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("self_described.zt");
    std::fs::write(&path, t_file_raw_index(&index)).unwrap();
    let f = ZtFile::open(&path).unwrap_or_else(|e| panic!("refused: {e}"));
    let t = f.catalog().get("t").expect("t listed");
    assert_eq!(f.read_all(t).unwrap(), vec![blob16()]);
    // Any other tag there is still refused.
    let mut index = vec![0xc6];
    index.extend(cbor(&Value::Array(vec![map(t_entry())])));
    std::fs::write(&path, t_file_raw_index(&index)).unwrap();
    assert!(ZtFile::open(&path).is_err());
}
