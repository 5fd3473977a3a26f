//! The zTensor v2 conformance corpus (`tests/zt_v2/corpus/`, see SOURCE.md):
//! every valid file opens through `formats::open` and each readable part
//! gives the bytes the `ztensor` 2.1 reference gives; every reject file is
//! refused at open with one line naming the file and its reason (the rule's
//! class as the reference names it, and the detail: `REASONS`), or
//! (data-level rules the spec checks when decoding or verifying) opens and
//! then fails the read of that tensor with its reason.

#[path = "zt_v2/read.rs"]
mod read;
mod support;

use std::path::{Path, PathBuf};

fn corpus(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/zt_v2/corpus")
        .join(kind);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "zt"))
        .collect();
    v.sort();
    v
}

fn stem(p: &Path) -> &str {
    p.file_stem().and_then(|s| s.to_str()).unwrap()
}

/// Rejects the spec checks only when a part is decoded or verified: the
/// file opens and the read of that tensor fails.
///
/// Corpus bug: `valid/f4-packed-odd-count.zt` is byte-identical to
/// `reject/f4-nonzero-odd-nibble.zt`; its final odd nibble is nonzero, so
/// it is treated as this reject (its read must fail).
const DATA_LEVEL: &[&str] = &[
    "verify-digest-mismatch",
    "bool-invalid-byte",
    "f4-nonzero-odd-nibble",
    "f4-packed-odd-count",
];

/// Valid files whose tensors a reader must list and refuse to decode.
const REFUSED_TENSORS: &[&str] = &[
    "view-unknown-encoding-refused",
    "unknown-layout-structural",
    "unknown-ltype-structural",
];

/// Valid files that name shards the corpus does not ship: their tensors in
/// those shards are listed as unreadable.
const MISSING_SHARDS: &[&str] = &[
    "shards-table",
    "local-and-foreign-parts-together",
    "shard-reference-is-a-valid-image",
];

/// What each reject file must be refused for (a substring of its one
/// line: the rule's class as the reference names it, and the detail), or,
/// for the data-level rules, of the failed read's error.
const REASONS: &[(&str, &str)] = &[
    ("attribute-key-empty", "rejected (Name): invalid name \"\""),
    (
        "attribute-key-not-text",
        "rejected (Schema): attribute keys must be text",
    ),
    (
        "attribute-key-nul",
        "rejected (Name): invalid name \"a\\0b\"",
    ),
    (
        "attributes-not-a-map",
        "rejected (Schema): 'attributes' must be a map",
    ),
    (
        "blob-array-with-three-elements",
        "rejected (Schema): 'blob' must have 2 elements",
    ),
    (
        "blob-misaligned",
        "rejected (BlobAlignment): \"t\"/\"data\": offset 4100 misaligned",
    ),
    (
        "blob-offset-zero",
        "rejected (BlobAlignment): \"t\"/\"data\": offset 0 misaligned",
    ),
    (
        "blob-out-of-bounds",
        "rejected (BlobBounds): \"t\"/\"data\": blob outside data region",
    ),
    (
        "blob-partial-overlap",
        "rejected (BlobOverlap): blobs at 4096 (+8192) and 8192 in this file",
    ),
    (
        "bool-invalid-byte",
        "tensor \"t\": bool element 0 is neither 0 nor 1",
    ),
    ("cbor-depth", "rejected (CborDepth): nesting too deep"),
    (
        "cbor-duplicate-key",
        "rejected (CborDuplicateKey): duplicate map key",
    ),
    (
        "cbor-indefinite",
        "rejected (CborSyntax): indefinite length",
    ),
    (
        "cbor-non-shortest",
        "rejected (CborDeterminism): non-shortest head",
    ),
    ("cbor-tag", "rejected (CborSyntax): tags are not permitted"),
    (
        "cbor-trailing-bytes",
        "rejected (CborSyntax): trailing bytes",
    ),
    (
        "cbor-unsorted-keys",
        "rejected (CborDeterminism): map keys not in canonical order",
    ),
    (
        "csr-index-out-of-cols",
        "tensor \"m\": zTensor v2: zt.sparse_csr/1: row 0 has column index 5, not below 3",
    ),
    (
        "csr-indptr-count",
        "rejected (LayoutRule): \"m\": 'indptr' must hold rows+1 elements",
    ),
    (
        "csr-indptr-not-zero-based",
        "tensor \"m\": zTensor v2: zt.sparse_csr/1: indptr[0] is 1, not 0",
    ),
    (
        "csr-missing-part",
        "rejected (LayoutRule): \"m\": sparse_csr requires exactly 3 parts",
    ),
    (
        "csr-row-not-increasing",
        "zt.sparse_csr/1: column indices of row 0 are not strictly increasing",
    ),
    (
        "csr-signed-indices",
        "rejected (LayoutRule): \"m\": 'indices' must be plain u32 or u64",
    ),
    (
        "csr-values-size",
        "rejected (LayoutRule): \"m\": 'values' decoded size 8 != 12 for nnz 3",
    ),
    (
        "data-shard-nonzero-offset",
        "rejected (ManifestBounds): data shard footer must zero manifest offset",
    ),
    (
        "dense-extra-part",
        "rejected (LayoutRule): \"t\": dense requires exactly one part named 'data'",
    ),
    (
        "dense-f4-size-mismatch",
        "rejected (DenseSize): \"t\": decoded size 4 != expected 3",
    ),
    (
        "dense-size-mismatch",
        "rejected (DenseSize): \"t\": decoded size 8 != expected 12",
    ),
    (
        "f4-nonzero-odd-nibble",
        "the unused high nibble of the last byte of packed 4-bit elements is not zero",
    ),
    ("file-too-small", "no format's magic or header found"),
    ("footer-magic", "rejected (FooterMagic): bad footer magic"),
    ("header-magic", "no format's magic or header found"),
    (
        "manifest-hash-mismatch",
        "rejected (ManifestHash): manifest hash mismatch",
    ),
    (
        "manifest-misaligned",
        "rejected (BlobAlignment): manifest blob is misaligned",
    ),
    (
        "manifest-out-of-bounds",
        "rejected (ManifestBounds): manifest outside data region",
    ),
    (
        "manifest-too-large",
        "the manifest is 2147483648 bytes, over the 1 GiB allowed (--index-memory)",
    ),
    ("name-empty", "rejected (Name): invalid name \"\""),
    ("name-nul", "rejected (Name): invalid name \"a\\0b\""),
    ("name-too-long", "rejected (Name): invalid name \"nnnn"),
    (
        "object-attributes-not-a-map",
        "rejected (Schema): 'attributes' must be a map",
    ),
    (
        "schema-blob-arity",
        "rejected (Schema): 'blob' must have 2 elements",
    ),
    (
        "schema-digest-uppercase-hex",
        "rejected (Schema): digest must be 'algo:lowercase-hex'",
    ),
    (
        "schema-encoding-without-decoded-length",
        "rejected (Schema): 'decoded_length' is required iff 'encoding' is present",
    ),
    (
        "schema-ltype-dtype-mismatch",
        "rejected (Schema): \"t\"/\"data\": type \"bool\" requires dtype U8",
    ),
    (
        "schema-missing-objects",
        "rejected (Schema): manifest missing 'objects'",
    ),
    (
        "schema-unknown-dtype",
        "rejected (Schema): unknown dtype \"f4\"",
    ),
    (
        "shape-product-overflow",
        "rejected (Shape): shape product overflows u64",
    ),
    ("shape-rank-65", "rejected (Shape): \"t\": rank exceeds 64"),
    (
        "shard-blob-partial-overlap",
        "rejected (BlobOverlap): blobs at 4096 (+8192) and 8192 in shard \"base\"",
    ),
    (
        "shard-name-empty",
        "rejected (ShardName): shard name \"\": must not be empty",
    ),
    (
        "shard-name-leading-dot",
        "rejected (ShardName): shard name \".hidden\": must not start with '.'",
    ),
    (
        "shard-name-separator",
        "rejected (ShardName): shard name \"sub/dir\": contains '/'",
    ),
    (
        "shard-name-traversal",
        "rejected (ShardName): shard name \"../etc/passwd\"",
    ),
    (
        "shard-ref-not-in-table",
        "rejected (ShardRef): \"t\"/\"data\": shard \"base\" not in table",
    ),
    (
        "shard-table-key-not-text",
        "rejected (Schema): shard key must be text",
    ),
    (
        "verify-digest-mismatch",
        "checksum mismatch over the decoded bytes: the file says xxh3:0000000000000000",
    ),
    (
        "version-unsupported",
        "rejected (Version): unsupported version 3",
    ),
];

fn reason(name: &str) -> &'static str {
    REASONS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, r)| *r)
        .unwrap_or_else(|| panic!("{name}: no expected reason in REASONS"))
}

#[test]
fn corpus_has_all_76_files() {
    assert_eq!(corpus("valid").len() + corpus("reject").len(), 76);
}

#[test]
fn every_valid_file_opens_and_reads_like_the_reference() {
    let mut parts_compared = 0;
    for path in corpus("valid") {
        let name = stem(&path);
        let o = read::open(&path).unwrap_or_else(|e| panic!("{name}: refused: {e}"));
        assert_eq!(o.catalog.format, "zTensor v2");
        assert_eq!(o.sources.len(), o.catalog.sources.len(), "{name}");
        let catalog = o.catalog.clone();
        let data = read::data(read::open(&path).unwrap());
        for (ti, t) in catalog.tensors.iter().enumerate() {
            let Ok(parts) = &t.parts else {
                assert!(
                    REFUSED_TENSORS.contains(&name) || MISSING_SHARDS.contains(&name),
                    "{name}: tensor {:?} unsupported: {:?}",
                    t.name,
                    t.parts
                );
                continue;
            };
            for (pi, p) in parts.iter().enumerate() {
                let ours = read::catalog_bytes(&o, ti, pi);
                let served = support::data::read_whole(&data, ti, pi, 3);
                if DATA_LEVEL.contains(&name) {
                    assert!(ours.is_err(), "{name}: {:?} read must fail", t.name);
                    assert!(served.is_err(), "{name}: {:?} Data read must fail", t.name);
                    continue;
                }
                let ours = ours.unwrap_or_else(|e| panic!("{name}: {:?}: {e}", t.name));
                let served = served.unwrap_or_else(|e| panic!("{name}: {:?}: Data: {e}", t.name));
                assert_eq!(served, ours, "{name}: {:?}/{:?}", t.name, p.name);
                let pname = read::v2_part_name(&p.name);
                let want = if MISSING_SHARDS.contains(&name) {
                    read::reference_local_raw(&path, &t.name, pname)
                } else {
                    read::reference_bytes(&path, &t.name, pname)
                }
                .unwrap_or_else(|e| panic!("{name}: reference: {e}"));
                assert_eq!(ours, want, "{name}: {:?}/{:?}", t.name, p.name);
                parts_compared += 1;
            }
        }
        for t in REFUSED_TENSORS.iter().filter(|n| **n == name) {
            assert!(catalog.tensors.iter().any(|t| !t.is_supported()), "{t}");
        }
    }
    assert!(parts_compared >= 15, "only {parts_compared} parts compared");
}

#[test]
fn every_reject_file_is_refused() {
    assert_eq!(
        REASONS.len(),
        corpus("reject").len(),
        "a reason per reject file"
    );
    for path in corpus("reject") {
        let name = stem(&path);
        let want = reason(name);
        match read::open(&path) {
            Err(e) => {
                assert!(!DATA_LEVEL.contains(&name), "{name}: must open, got {e}");
                let line = e.to_string();
                assert!(!line.contains('\n'), "{name}: {line}");
                assert!(line.contains(&path.display().to_string()), "{name}: {line}");
                assert!(
                    line.contains(want),
                    "{name}: refused as {line:?}, want {want:?}"
                );
            }
            Ok(o) => {
                assert!(
                    DATA_LEVEL.contains(&name),
                    "{name}: opened, must be refused"
                );
                let mut failed = 0;
                let data = read::data(o);
                for (ti, t) in data.catalog().tensors.iter().enumerate() {
                    for pi in 0..t.parts.as_ref().map_or(0, Vec::len) {
                        let e = support::data::read_whole(&data, ti, pi, 1 << 20);
                        if let Err(e) = e {
                            assert!(!e.contains('\n'), "{name}: {e}");
                            assert!(
                                e.contains(want),
                                "{name}: read failed with {e:?}, want {want:?}"
                            );
                            failed += 1;
                        }
                    }
                }
                assert!(failed > 0, "{name}: no read failed");
            }
        }
    }
}
