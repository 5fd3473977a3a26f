//! Hostile zTensor v2 files of our own: each is refused by `formats::open`
//! in one line naming the file, or opens and then fails the read of the
//! damaged tensor (`a`) while its neighbour (`b`) still reads right. Never
//! a panic. Files are written with the `ztensor` 2.1 writer; stored bytes
//! that no honest writer makes come from an encoding registered under the
//! `zt.zstd-seekable/1` id that returns whatever the case needs.

#[path = "zt_v2/read.rs"]
mod read;
mod support;

use std::path::{Path, PathBuf};

use ztensor2::format::DigestAlgorithm;
use ztensor2::vocab::Encoding;
use ztensor2::{DType, Vocabulary, Writer};

const SEEKABLE: &str = "zt.zstd-seekable/1";
const SKIPPABLE: u32 = 0x184D_2A5E;
const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;

/// Makes a part's stored bytes from its decoded bytes.
type Forge = fn(&[u8]) -> Vec<u8>;

/// An "encoding" whose stored bytes are `make(decoded)`.
struct Forged(Forge);

impl Encoding for Forged {
    fn id(&self) -> &str {
        SEEKABLE
    }
    fn encode(&self, decoded: &[u8]) -> ztensor2::Result<Vec<u8>> {
        Ok((self.0)(decoded))
    }
    fn decode(&self, _: &[u8], _: u64) -> ztensor2::Result<Vec<u8>> {
        Err(ztensor2::Error::Unsupported("test encoding".into()))
    }
}

fn frame(data: &[u8], checksum: bool) -> Vec<u8> {
    use std::io::Write;
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    e.include_checksum(checksum).unwrap();
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A seekable stream: `frames` (stored bytes) and the table `entries`.
fn seekable(frames: &[Vec<u8>], entries: &[(u32, u32)]) -> Vec<u8> {
    let mut out: Vec<u8> = frames.concat();
    out.extend(SKIPPABLE.to_le_bytes());
    out.extend(((entries.len() * 8 + 9) as u32).to_le_bytes());
    for (c, d) in entries {
        out.extend(c.to_le_bytes());
        out.extend(d.to_le_bytes());
    }
    out.extend((entries.len() as u32).to_le_bytes());
    out.push(0);
    out.extend(SEEKABLE_MAGIC.to_le_bytes());
    out
}

/// Honest frames of 1 KiB, then `damage` applied to the whole stream.
fn honest(d: &[u8]) -> Vec<u8> {
    let frames: Vec<Vec<u8>> = d.chunks(1024).map(|c| frame(c, true)).collect();
    let entries: Vec<(u32, u32)> = frames
        .iter()
        .zip(d.chunks(1024))
        .map(|(f, c)| (f.len() as u32, c.len() as u32))
        .collect();
    seekable(&frames, &entries)
}

fn payload() -> Vec<u8> {
    (0..4096u32)
        .flat_map(|i| (i * 7 % 251).to_le_bytes())
        .collect()
}

fn neighbour() -> Vec<u8> {
    (0..64u32).flat_map(|i| i.to_le_bytes()).collect()
}

/// Writes `a` (encoded by `forge` when given; the writer records the xxh3
/// digest of the payload) and the raw neighbour `b`.
fn write(path: &Path, forge: Option<Forge>) {
    let vocab = match forge {
        Some(f) => Vocabulary::standard().with_encoding(Forged(f)),
        None => Vocabulary::standard(),
    };
    let mut w = Writer::options()
        .canonical(false)
        .vocabulary(&vocab)
        .create(path)
        .unwrap();
    let a = payload();
    w.object("a", |o| {
        o.shape([a.len() as u64 / 4]).part("data", |p| {
            let p = p.dtype(DType::U32).bytes(&a);
            if forge.is_some() {
                p.encoding(SEEKABLE)
            } else {
                p
            }
        })
    })
    .unwrap();
    let b = neighbour();
    w.add("b", [64u64], DType::U32, &b).unwrap();
    w.finish().unwrap();
}

/// Where part `data` of tensor `t` is stored.
fn blob_of(path: &Path, t: &str) -> (usize, usize) {
    let m = ztensor2::read::manifest_of(path).unwrap().unwrap();
    let p = m.part(t, "data").unwrap();
    (p.blob.offset as usize, p.blob.length as usize)
}

fn patch(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(path).unwrap();
    f(&mut b);
    std::fs::write(path, b).unwrap();
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Refused,
    ReadFailed,
}

/// Opens `path`; either it is refused in one line naming the file, or the
/// read of `a` fails (one line) and `b` reads its bytes.
fn outcome(path: &Path) -> Outcome {
    let o = match read::open(path) {
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(&path.display().to_string()), "{line}");
            return Outcome::Refused;
        }
        Ok(o) => o,
    };
    let data = read::data(o);
    let c = data.catalog();
    let ti = |n: &str| c.tensors.iter().position(|t| t.name == n).unwrap();
    let b = support::data::read_whole(&data, ti("b"), 0, 100).expect("the neighbour must read");
    assert_eq!(b, neighbour());
    let a = ti("a");
    if let Err(why) = &c.tensors[a].parts {
        assert!(!why.contains('\n'));
        return Outcome::ReadFailed;
    }
    let e =
        support::data::read_whole(&data, a, 0, 1 << 20).expect_err("the damaged tensor must fail");
    assert!(!e.contains('\n'), "{e}");
    Outcome::ReadFailed
}

fn tmp() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("model.zt");
    (d, p)
}

#[test]
fn baseline_reads() {
    let (_d, p) = tmp();
    write(&p, Some(honest));
    let data = read::data(read::open(&p).unwrap());
    assert_eq!(
        support::data::read_whole(&data, 0, 0, 999).unwrap(),
        payload()
    );
}

#[test]
fn raw_digest_mismatch_fails_the_read() {
    let (_d, p) = tmp();
    write(&p, None);
    let (o, _) = blob_of(&p, "a");
    patch(&p, |b| b[o + 5] ^= 1);
    assert_eq!(outcome(&p), Outcome::ReadFailed);
}

#[test]
fn zstd_digest_mismatch_fails_the_read() {
    let (_d, p) = tmp();
    // Stored bytes that decode (frames and checksums all fine) to other
    // bytes of the same length than the digest was taken over.
    write(
        &p,
        Some(|d: &[u8]| honest(&d.iter().map(|x| x ^ 1).collect::<Vec<u8>>())),
    );
    assert_eq!(outcome(&p), Outcome::ReadFailed);
}

#[test]
fn garbage_in_a_frame_fails_the_read() {
    let (_d, p) = tmp();
    write(&p, Some(honest));
    let (o, _) = blob_of(&p, "a");
    patch(&p, |b| {
        for x in &mut b[o + 20..o + 40] {
            *x ^= 0x5a;
        }
    });
    assert_eq!(outcome(&p), Outcome::ReadFailed);
}

#[test]
fn a_seek_table_whose_sums_lie_is_refused() {
    let (_d, p) = tmp();
    write(&p, Some(honest));
    let (o, l) = blob_of(&p, "a");
    // The last entry's decoded size: 4 frames, entry 3 at end-9-8.
    patch(&p, |b| b[o + l - 9 - 4] ^= 1);
    assert_eq!(outcome(&p), Outcome::Refused);
}

#[test]
fn a_seek_table_that_shifts_frames_is_caught() {
    let (_d, p) = tmp();
    write(
        &p,
        Some(|d: &[u8]| {
            let f: Vec<Vec<u8>> = d.chunks(1024).map(|c| frame(c, true)).collect();
            let mut e: Vec<(u32, u32)> = f.iter().map(|x| (x.len() as u32, 1024)).collect();
            e[0].0 += 3; // same total, frames misplaced
            e[1].0 -= 3;
            seekable(&f, &e)
        }),
    );
    // Frame 1's header is not where the table says: refused at open.
    assert_eq!(outcome(&p), Outcome::Refused);
}

#[test]
fn a_zstd_bomb_frame_fails_the_read() {
    let (_d, p) = tmp();
    write(
        &p,
        Some(|d: &[u8]| {
            // Declares 16 KiB, decodes to 64 MiB of zeros.
            let bomb = frame(&vec![0u8; 64 << 20], true);
            seekable(
                std::slice::from_ref(&bomb),
                &[(bomb.len() as u32, d.len() as u32)],
            )
        }),
    );
    assert_eq!(outcome(&p), Outcome::ReadFailed);
}

#[test]
fn a_frame_without_a_content_checksum_is_refused() {
    let (_d, p) = tmp();
    write(
        &p,
        Some(|d: &[u8]| {
            let f = frame(d, false);
            seekable(
                std::slice::from_ref(&f),
                &[(f.len() as u32, d.len() as u32)],
            )
        }),
    );
    assert_eq!(outcome(&p), Outcome::Refused);
}

#[test]
fn a_frame_over_16_mib_and_a_huge_count_are_refused() {
    let (_d, p) = tmp();
    write(&p, Some(honest));
    let (o, l) = blob_of(&p, "a");
    let (_d2, p2) = tmp();
    std::fs::copy(&p, &p2).unwrap();
    patch(&p, |b| b[o + l - 9 - 1] = 0x7f); // last frame's d high byte
    assert_eq!(outcome(&p), Outcome::Refused);
    patch(&p2, |b| {
        b[o + l - 9..o + l - 5].copy_from_slice(&u32::MAX.to_le_bytes())
    });
    assert_eq!(outcome(&p2), Outcome::Refused);
}

#[test]
fn an_empty_stream_claiming_bytes_is_refused() {
    let (_d, p) = tmp();
    write(&p, Some(|_d: &[u8]| seekable(&[], &[])));
    assert_eq!(outcome(&p), Outcome::Refused);
}

#[test]
fn invalid_bool_and_f4_bytes_fail_the_read() {
    for (logical, bytes, n) in [
        ("bool", vec![0u8, 1, 2, 1], 4u64),
        ("f4_e2m1", vec![0x21, 0x13], 3),
    ] {
        let (_d, p) = tmp();
        let mut w = Writer::options().canonical(false).create(&p).unwrap();
        w.object("a", |o| {
            o.shape([n]).part("data", |q| {
                q.dtype(DType::U8).logical(logical).bytes(&bytes)
            })
        })
        .unwrap();
        w.add("b", [64u64], DType::U32, &neighbour()).unwrap();
        w.finish().unwrap();
        assert_eq!(outcome(&p), Outcome::ReadFailed, "{logical}");
    }
}

#[test]
fn csr_indices_out_of_range_are_refused() {
    let (_d, p) = tmp();
    let le = |v: &[u32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (ip, ix, va) = (le(&[0, 1, 2]), le(&[0, 9]), le(&[1, 2]));
    let mut w = Writer::options().canonical(false).create(&p).unwrap();
    w.object("a", |o| {
        o.shape([2u64, 4])
            .layout("zt.sparse_csr/1")
            .part("indptr", |q| q.dtype(DType::U32).bytes(&ip))
            .part("indices", |q| q.dtype(DType::U32).bytes(&ix))
            .part("values", |q| q.dtype(DType::U32).bytes(&va))
    })
    .unwrap();
    w.add("b", [64u64], DType::U32, &neighbour()).unwrap();
    w.finish().unwrap();
    assert_eq!(outcome(&p), Outcome::Refused);
}

/// A root whose tensor `a` lives in shard `s1` and `b` locally.
fn sharded(dir: &Path) -> (PathBuf, PathBuf) {
    let shard = dir.join("model-s1.zt");
    let mut w = Writer::options().canonical(false).create(&shard).unwrap();
    w.add("a", [4096u64], DType::U32, &payload()).unwrap();
    w.finish().unwrap();
    let id = ztensor2::read::shard_identity(&shard, DigestAlgorithm::Sha256).unwrap();
    let m = ztensor2::read::manifest_of(&shard).unwrap().unwrap();
    let root = dir.join("model.zt");
    let mut w = Writer::options().canonical(false).create(&root).unwrap();
    w.add_shard("s1", &id).unwrap();
    w.link("a", m.object("a").unwrap(), "s1").unwrap();
    w.add("b", [64u64], DType::U32, &neighbour()).unwrap();
    w.finish().unwrap();
    (root, shard)
}

#[test]
fn a_good_shard_reads() {
    let d = tempfile::tempdir().unwrap();
    let (root, _) = sharded(d.path());
    let o = read::open(&root).unwrap();
    assert_eq!(o.catalog.sources.len(), 2);
    assert!(o.catalog.sources[1].digest.is_some());
    let data = read::data(o);
    let a = data
        .catalog()
        .tensors
        .iter()
        .position(|t| t.name == "a")
        .unwrap();
    assert_eq!(
        support::data::read_whole(&data, a, 0, 1000).unwrap(),
        payload()
    );
}

#[test]
fn truncated_missing_resized_or_altered_shards_fail_only_their_tensors() {
    type Damage = fn(&Path);
    // What `a`'s failure says after the shard's path, in the words of every
    // sharded format (`shard_set`) where the shard cannot serve at all.
    let cases: [(&str, Damage, &str); 4] = [
        (
            "truncated",
            |s| patch(s, |b| b.truncate(b.len() / 2)),
            " is 65607 bytes, the root says 131214",
        ),
        (
            "missing",
            |s| std::fs::remove_file(s).unwrap(),
            ": cannot open: No such file or directory (os error 2)",
        ),
        (
            "wrong size",
            |s| patch(s, |b| b.extend([0u8; 10])),
            " is 131224 bytes, the root says 131214",
        ),
        (
            "same size, other bytes",
            |s| {
                let m = ztensor2::read::manifest_of(s).unwrap().unwrap();
                let o = m.part("a", "data").unwrap().blob.offset as usize;
                patch(s, |b| b[o] ^= 0xff)
            },
            ": checksum mismatch: ",
        ),
    ];
    for (what, damage, says) in cases {
        let d = tempfile::tempdir().unwrap();
        let (root, shard) = sharded(d.path());
        damage(&shard);
        assert_eq!(outcome(&root), Outcome::ReadFailed, "{what}");
        let why = why_a_fails(&root);
        let shard = shard.display().to_string();
        let whole = if what.starts_with("same size") {
            // Opened, and its digest refused before a byte was served.
            format!("{shard}{says}")
        } else {
            format!("part \"data\" shard unusable: shard \"s1\": {shard}{says}")
        };
        assert!(why.starts_with(&whole), "{what}: {why}");
    }
}

/// The one line tensor `a` fails with: listed unreadable, or its read.
fn why_a_fails(root: &Path) -> String {
    let data = read::data(read::open(root).unwrap());
    let c = data.catalog();
    let a = c.tensors.iter().position(|t| t.name == "a").unwrap();
    match &c.tensors[a].parts {
        Err(why) => why.clone(),
        Ok(_) => support::data::read_whole(&data, a, 0, 1 << 20).unwrap_err(),
    }
}
