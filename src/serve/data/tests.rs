//! The data layer over catalogs made by hand: what no one format shows.

use std::sync::Arc;

use super::{Data, DataOptions, PROGRESSIVE_MIN};
use crate::catalog::{Check, Checksum, Codec, Producer};
use crate::codec::digest::{Algorithm, compute};
use crate::serve::stats::Stats;
use crate::serve::testing::catalog_of;

fn opts(dir: &std::path::Path) -> DataOptions {
    DataOptions {
        cache_size: 8 << 20,
        cache_dir: dir.to_path_buf(),
        verify_raw: true,
        progressive_min: PROGRESSIVE_MIN,
    }
}

fn read_all(d: &Data, ti: usize) -> Result<Vec<u8>, String> {
    d.read(ti, 0, 0, 1 << 20)
        .map(|b| b.to_vec())
        .map_err(|e| e.to_string())
}

/// A producer that writes `bytes`.
fn making(bytes: &'static [u8]) -> Codec {
    Codec::Computed(Producer {
        name: "test",
        produce: Arc::new(move |out: &mut Vec<u8>| {
            out.extend_from_slice(bytes);
            Ok(())
        }),
        stream: None,
    })
}

#[test]
fn a_computed_blob_is_served_from_what_its_reader_makes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, files) = catalog_of(dir.path(), &[("a", &[0; 4]), ("b", &[0; 4])]);
    c.blobs[0].codec = making(b"made");
    // One that makes too few bytes, and one whose digest does not match.
    c.blobs[1].codec = making(b"mad");
    let d = Data::new(
        c.clone(),
        files,
        opts(dir.path()),
        Arc::new(Stats::default()),
    )
    .unwrap();
    assert_eq!(read_all(&d, 0).unwrap(), b"made");
    let err = read_all(&d, 1).unwrap_err();
    assert!(err.contains("made 3 bytes, expected 4"), "{err}");

    let (mut c, files) = catalog_of(dir.path(), &[("a", &[0; 4])]);
    c.blobs[0].codec = making(b"made");
    c.blobs[0].checks = vec![Check::Decoded(compute(Algorithm::Xxh3, b"mode"))];
    let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
    let err = read_all(&d, 0).unwrap_err();
    assert!(err.contains("checksum mismatch"), "{err}");
}

#[test]
fn a_source_digest_over_part_of_the_file_is_checked_before_any_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, files) = catalog_of(dir.path(), &[("a", b"abcd"), ("b", b"efgh")]);
    // Covers the first tensor only: right, then wrong.
    c.sources[0].digest = Some(compute(Algorithm::Sha256, b"abcd"));
    c.sources[0].digest_span = Some((0, 4));
    let d = Data::new(
        c.clone(),
        files,
        opts(dir.path()),
        Arc::new(Stats::default()),
    )
    .unwrap();
    assert_eq!(read_all(&d, 1).unwrap(), b"efgh");

    let (mut c, files) = catalog_of(dir.path(), &[("a", b"abcd"), ("b", b"efgh")]);
    c.sources[0].digest = Some(compute(Algorithm::Sha256, b"abce"));
    c.sources[0].digest_span = Some((0, 4));
    let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
    for ti in 0..2 {
        let err = read_all(&d, ti).unwrap_err();
        assert!(err.contains("checksum mismatch"), "{err}");
    }

    // A span past the end is an error, not a panic.
    let (mut c, files) = catalog_of(dir.path(), &[("a", b"abcd")]);
    c.sources[0].digest = Some(Checksum::Sha256([0; 32]));
    c.sources[0].digest_span = Some((2, u64::MAX));
    let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
    assert!(read_all(&d, 0).unwrap_err().contains("past its end"));
}

#[test]
fn a_missing_source_fails_only_its_own_tensors_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, mut files) = catalog_of(dir.path(), &[("a", b"abcd")]);
    c.sources.push(crate::catalog::SourceRef {
        unusable: Some("shard model-00002.zt is missing".into()),
        ..Default::default()
    });
    files.push(None);
    let mut b = c.blobs[0].clone();
    b.source = 1;
    c.blobs.push(b);
    let mut t = c.tensors[0].clone();
    t.name = "far".into();
    if let Ok(parts) = &mut t.parts {
        parts[0].blob = 1;
    }
    c.tensors.push(t);
    let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
    assert_eq!(read_all(&d, 0).unwrap(), b"abcd");
    let err = read_all(&d, 1).unwrap_err();
    assert!(err.contains("model-00002.zt is missing"), "{err}");
}

/// A catalog of one tensor whose blob is `blob`, zstd of `decoded` bytes.
fn zstd_catalog(
    dir: &std::path::Path,
    blob: &[u8],
    decoded: usize,
) -> (
    crate::catalog::Catalog,
    Vec<Option<crate::source::MappedFile>>,
) {
    use crate::catalog::{DType, Endian, Part};
    let (mut c, files) = catalog_of(dir, &[("z", blob)]);
    c.blobs[0].codec = Codec::Zstd { frames: None };
    c.blobs[0].decoded_len = decoded as u64;
    c.tensors[0].shape = vec![decoded as u64];
    c.tensors[0].parts = Ok(vec![Part::dense(
        DType::Uint8,
        vec![decoded as u64],
        decoded as u64,
        0,
        Endian::Little,
    )]);
    (c, files)
}

/// One frame as a streaming writer makes it (ztensor 1.x, deathtensors,
/// the zstd CLI from a pipe): no declared size, with or without the
/// content checksum.
fn streamed_frame(data: &[u8], checksum: bool) -> Vec<u8> {
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.include_checksum(checksum).unwrap();
    std::io::Write::write_all(&mut enc, data).unwrap();
    enc.finish().unwrap()
}

#[test]
fn a_streamed_frame_is_served_and_its_checksum_is_checked_before_any_byte() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(3u32 << 20))
        .map(|i| (i % 251) as u8 ^ (i >> 13) as u8)
        .collect();
    let mut o = opts(dir.path());
    o.progressive_min = 1 << 20; // decoded on a thread of its own
    for checksum in [false, true] {
        let blob = streamed_frame(&data, checksum);
        let (c, files) = zstd_catalog(dir.path(), &blob, data.len());
        let d = Data::new(c, files, o.clone(), Arc::new(Stats::default())).unwrap();
        for at in [0, 1 << 20, data.len() as u64 - 4096] {
            let got = d.read(0, 0, at, 4096).unwrap();
            assert_eq!(
                &got[..],
                &data[at as usize..at as usize + 4096],
                "{checksum} {at}"
            );
        }
    }
    // The checksum is over the whole frame, so a frame that fails it gives
    // no byte, not even its first ones.
    let mut blob = streamed_frame(&data, true);
    let n = blob.len();
    blob[n - 1] ^= 1;
    let (c, files) = zstd_catalog(dir.path(), &blob, data.len());
    let d = Data::new(c, files, o, Arc::new(Stats::default())).unwrap();
    let err = match d.read(0, 0, 0, 4096) {
        Ok(_) => panic!("bytes of a frame that fails its checksum were served"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("checksum") || err.contains("corrupt"), "{err}");
}

#[test]
fn a_computed_blob_over_half_the_cache_without_a_stream_is_listed_as_too_large() {
    // 5 MiB made whole by a reader that cannot stream, against an 8 MiB
    // cache: known at mount, so the tensor is listed, not served, saying
    // which option to raise; its neighbour is served.
    static MADE: [u8; 5 << 20] = [7; 5 << 20];
    let dir = tempfile::tempdir().unwrap();
    let (mut c, files) = catalog_of(dir.path(), &[("big", &MADE), ("small", &[1; 4])]);
    c.blobs[0].codec = making(&MADE);
    let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
    let why = d.catalog().tensors[0].parts.as_ref().unwrap_err();
    assert!(why.contains("--cache-size 10M or more"), "{why}");
    assert!(d.read(0, 0, 0, 4096).is_err());
    assert_eq!(read_all(&d, 1).unwrap(), [1; 4]);
}

#[test]
fn a_computed_spill_whose_file_changes_while_it_is_made_is_not_served() {
    // 5 MiB streamed against an 8 MiB cache: spilled. Halfway through, the
    // source is rewritten in place, as another program would; what the
    // reader read across the change is a mix, and the read says ESTALE.
    static MADE: [u8; 5 << 20] = [7; 5 << 20];
    let dir = tempfile::tempdir().unwrap();
    let (mut c, files) = catalog_of(dir.path(), &[("big", &MADE)]);
    let src = dir.path().join("data");
    c.blobs[0].codec = Codec::Computed(Producer {
        name: "test",
        produce: Arc::new(|out: &mut Vec<u8>| {
            out.extend_from_slice(&MADE);
            Ok(())
        }),
        stream: Some(Arc::new(
            move |put: &mut dyn FnMut(&[u8]) -> Result<(), String>| {
                let (a, b) = MADE.split_at(MADE.len() / 2);
                put(a)?;
                let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
                std::os::unix::fs::FileExt::write_at(&f, b"changed", 0).unwrap();
                let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
                f.set_modified(later).unwrap();
                put(b)
            },
        )),
    });
    let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
    let err = d.read(0, 0, 0, 4096).err().unwrap();
    assert_eq!(err.errno(), libc::ESTALE, "{err}");
}

#[test]
fn a_spilled_blob_with_a_digest_is_checked_over_its_spill_whatever_its_window() {
    // 5 MiB against an 8 MiB cache: spilled. Its frame declares a 256 MiB
    // window (no size given, --long=28): the spill decodes it into its
    // file; the digest is taken over what the spill holds, not over a
    // second decode, which would want that window in memory (and refuses
    // a window past 128 MiB).
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(5u32 << 20))
        .map(|i| (i % 251) as u8 ^ (i >> 13) as u8)
        .collect();
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.window_log(28).unwrap();
    enc.long_distance_matching(true).unwrap();
    std::io::Write::write_all(&mut enc, &data).unwrap();
    let blob = enc.finish().unwrap();
    for (digest, right) in [(&data[..], true), (&b"other"[..], false)] {
        let (mut c, files) = zstd_catalog(dir.path(), &blob, data.len());
        c.blobs[0].checks = vec![Check::Decoded(compute(Algorithm::Xxh3, digest))];
        let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
        match d.read(0, 0, 1 << 20, 4096) {
            Ok(got) if right => assert_eq!(&got[..], &data[1 << 20..(1 << 20) + 4096]),
            Ok(_) => panic!("bytes that fail their digest were served"),
            Err(e) if right => panic!("{e}"),
            Err(e) => assert!(e.to_string().contains("checksum mismatch"), "{e}"),
        }
    }
}

/// A spill waiting for room counts one being made under its slot's lock
/// (its room taken, not yet in the slot) as one that will be let go of:
/// it waits for it, where it used to fail at once with ENOSPC.
#[test]
fn a_spill_waits_for_room_taken_by_a_spill_being_made() {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (c, files) = catalog_of(dir.path(), &[("a", &[0; 4]), ("b", &[0; 4])]);
    let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
    let disk = d.decoded_disk();
    disk.set_limit(100);
    let (held, room) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Blob 0's spill being made: its slot locked, its room taken.
            let _slot = crate::serve::lock(&d.states[0].spill);
            d.states[0].making_spill.store(true, SeqCst);
            let charge = disk.charge_spill(80).unwrap();
            held.send(()).unwrap();
            // Let go once the other waits for it (or give up after 10 s,
            // for the assertion below to fail rather than hang).
            let waiting = || d.stats().spill_room_waits.load(SeqCst) > 0;
            let start = std::time::Instant::now();
            while !waiting() && start.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::yield_now();
            }
            d.states[0].making_spill.store(false, SeqCst);
            drop(charge);
        });
        room.recv().unwrap();
        let got = d.charge_for_spill(1, 80);
        assert!(got.is_ok(), "blob 1 found no room and did not wait");
        assert_eq!(d.stats().spill_room_waits.load(SeqCst), 1);
    });
}

/// A tensor read through a spill keeps saying so once its spill was
/// dropped for room: its next read makes it again, and a copy of it must
/// still find room beside that spill (a fill of a tensor whose spill had
/// been dropped took the room its own spill then needed).
#[test]
fn a_dropped_spill_still_counts_as_the_tensors_spill() {
    let dir = tempfile::tempdir().unwrap();
    // 5 MiB against an 8 MiB cache: spilled.
    let data: Vec<u8> = (0..(5u32 << 20)).map(|i| (i % 251) as u8).collect();
    let blob = zstd::bulk::compress(&data, 3).unwrap();
    let (c, files) = zstd_catalog(dir.path(), &blob, data.len());
    let d = Data::new(c, files, opts(dir.path()), Arc::new(Stats::default())).unwrap();
    assert_eq!(d.spill_len(0, 0), None, "nothing read yet");
    assert_eq!(&d.read(0, 0, 0, 4096).unwrap()[..], &data[..4096]);
    assert!(d.spilled(0, 0));
    // Idle once decoded whole: read its end, then it can go.
    let end = data.len() as u64 - 4096;
    assert_eq!(&d.read(0, 0, end, 4096).unwrap()[..], &data[end as usize..]);
    let start = std::time::Instant::now();
    while !d.drop_an_idle_spill() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "never idle"
        );
        std::thread::yield_now();
    }
    assert!(!d.spilled(0, 0));
    assert_eq!(d.spill_len(0, 0), Some(data.len() as u64));
}

#[test]
fn a_reply_buffer_kept_for_a_write_and_let_go_unwritten_is_reused() {
    let mut v = super::scratch::take();
    v.resize(1 << 20, 3);
    let at = v.as_ptr();
    let Ok(kept) = super::Bytes::Owned(v).keep() else {
        panic!("owned bytes are kept as they are")
    };
    // The write-behind's queue was full: the write is dropped unmade.
    drop(kept);
    let again = super::scratch::take();
    assert_eq!(again.as_ptr(), at);
}
