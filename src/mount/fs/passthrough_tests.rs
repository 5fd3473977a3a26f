use super::*;
use crate::catalog::{Blob, DType, Endian, Part};
use crate::mount::backing::Origin;
use crate::mount::tree::ROOT;
use crate::serve::data::PROGRESSIVE_MIN;
use std::io::Read;

/// A mount of one zstd tensor "z" of `data`, with backing files in `dir`.
fn zstd_fs(dir: &std::path::Path, data: &[u8], limit: u64) -> TensorFs {
    zstd_fs_checked(dir, data, limit, Vec::new())
}

/// The same, its blob carrying `checks`.
fn zstd_fs_checked(
    dir: &std::path::Path,
    data: &[u8],
    limit: u64,
    checks: Vec<crate::catalog::Check>,
) -> TensorFs {
    zstd_fs_of(
        dir,
        data,
        &zstd::encode_all(data, 3).unwrap(),
        limit,
        checks,
    )
}

/// The same, its blob `blob` (the zstd frames of `data`).
fn zstd_fs_of(
    dir: &std::path::Path,
    data: &[u8],
    blob: &[u8],
    limit: u64,
    checks: Vec<crate::catalog::Check>,
) -> TensorFs {
    let (mut catalog, _) = crate::serve::testing::catalog_of(dir, &[("z", &[0u8][..])]);
    std::fs::write(dir.join("data"), blob).unwrap();
    let n = data.len() as u64;
    catalog.blobs[0] = Blob {
        len: blob.len() as u64,
        codec: Codec::Zstd { frames: None },
        decoded_len: n,
        checks,
        ..catalog.blobs[0].clone()
    };
    catalog.tensors[0].shape = vec![n];
    catalog.tensors[0].parts = Ok(vec![Part::dense(
        DType::Uint8,
        vec![n],
        n,
        0,
        Endian::Little,
    )]);
    fs_of(dir, catalog, limit)
}

/// A mount of `catalog`, whose one source is `dir/data`, with backing
/// files in `dir`.
fn fs_of(dir: &std::path::Path, catalog: crate::catalog::Catalog, limit: u64) -> TensorFs {
    let files = vec![Some(MappedFile::open(&dir.join("data")).unwrap())];
    let opts = FsOptions {
        data: DataOptions {
            cache_size: 64 << 20,
            cache_dir: dir.to_path_buf(),
            verify_raw: true,
            progressive_min: PROGRESSIVE_MIN,
        },
        direct_io: true,
        views: Views::ALL,
        xattrs: false,
        backing: BackingOptions {
            enabled: true,
            dir: dir.to_path_buf(),
            limit,
        },
    };
    TensorFs::new(catalog, files, opts).unwrap()
}

/// A mount of one zstd tensor "z" of `data` in 1 MiB frames, passthrough
/// on, with backing files in `dir`.
fn framed_fs(dir: &std::path::Path, data: &[u8]) -> TensorFs {
    let blob: Vec<u8> = data
        .chunks(1 << 20)
        .flat_map(|c| zstd::bulk::compress(c, 3).unwrap())
        .collect();
    let fs = zstd_fs_of(dir, data, &blob, 1 << 30, Vec::new());
    fs.set_passthrough(true);
    fs
}

/// Tensor "z" of `fs` opened, its first `frames` MiB read and written
/// through, and closed while the mount is busy, so that the fill of
/// the rest waits for a quiet mount (unless nearly all was written):
/// its inode, and the hold that keeps the mount busy.
fn read_then_closed_busy(fs: &TensorFs, frames: u64) -> (Ino, crate::mount::activity::Busy<'_>) {
    let (z, fh) = open_z(fs);
    for k in 0..frames {
        let bytes = fs.read(z, fh, k << 20, 1 << 20).unwrap();
        fs.served(k << 20, bytes);
    }
    fs.write_behind.flush();
    let busy = fs.backings.activity().begin();
    fs.release(fh);
    (z, busy)
}

fn filled(fs: &TensorFs) {
    let t = std::time::Instant::now();
    while fs.backings.gauges().1 > 0 {
        assert!(t.elapsed().as_secs() < 30, "still filling");
        std::thread::yield_now();
    }
}

/// The inode of tensor `z` and a new open of it.
fn open_z(fs: &TensorFs) -> (Ino, u64) {
    let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
    let (fh, _) = fs.open(z, false).unwrap();
    (z, fh)
}

fn read_all(fs: &TensorFs, ino: Ino, fh: u64, len: usize) {
    let mut at = 0;
    while at < len {
        let bytes = fs.read(ino, fh, at as u64, 1 << 20).unwrap();
        let n = bytes.len();
        fs.served(at as u64, bytes);
        at += n;
    }
    fs.write_behind.flush();
}

/// The `.safetensors` view's file: its inode and size.
fn safetensors_view(fs: &TensorFs) -> (Ino, u64) {
    let views = fs.lookup(ROOT, OsStr::new(".safetensors")).unwrap().ino;
    let view = fs.lookup(views, OsStr::new("model.safetensors")).unwrap();
    (view.ino, view.size)
}

/// The `.safetensors` view's file, opened and read whole: its inode and
/// the open.
fn read_safetensors_view(fs: &TensorFs) -> (Ino, u64) {
    let (view, size) = safetensors_view(fs);
    let (fh, _) = fs.open(view, false).unwrap();
    read_all(fs, view, fh, size as usize);
    (view, fh)
}

/// The bytes of the backing file a new open of `ino` is passed through to.
fn backed_bytes(fs: &TensorFs, ino: Ino) -> Vec<u8> {
    let (_, how) = fs.open(ino, false).unwrap();
    let Open::Backed(b) = how else {
        panic!("not backed")
    };
    contents(&b)
}

fn contents(b: &Backing) -> Vec<u8> {
    let mut v = Vec::new();
    b.file().try_clone().unwrap().read_to_end(&mut v).unwrap();
    v
}

#[test]
fn a_decoded_tensor_is_backed_after_its_first_open_by_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 7 % 251) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    // The hook hears of the inode whose reads asked for the file, before
    // an open can take the file.
    let heard = Arc::new(Mutex::new(Vec::new()));
    let backings = fs.backings.clone();
    let h = heard.clone();
    let _ = fs.filled_hook().set(Box::new(move |ino| {
        let ready = backings.ready(&Content::Part { tensor: 0, part: 0 });
        h.lock().unwrap().push((ino, ready.is_some()));
    }));
    let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
    let (fh, how) = fs.open(z, false).unwrap();
    // Served with direct I/O: the backing file, not the kernel's cache
    // of this inode, keeps the decoded bytes.
    assert!(matches!(how, Open::Served(CacheMode::DirectIo)));
    // A peek fills nothing.
    assert_eq!(fs.read(z, fh, 0, 4096).unwrap().len(), 4096);
    fs.release(fh);
    filled(&fs);
    assert_eq!(fs.backings.gauges(), (0, 0));
    // A whole read does, once the last open the daemon serves is closed.
    let (fh, _) = fs.open(z, false).unwrap();
    let (fh2, how) = fs.open(z, false).unwrap();
    assert!(matches!(how, Open::Served(_)));
    read_all(&fs, z, fh, data.len());
    fs.release(fh);
    // Its reads wrote the backing file through; it is not handed out
    // while a served open is left.
    assert_eq!(fs.backings.gauges(), (data.len() as u64, 1));
    assert!(
        fs.backings
            .ready(&Content::Part { tensor: 0, part: 0 })
            .is_none()
    );
    fs.release(fh2);
    filled(&fs);
    let (fh, how) = fs.open(z, false).unwrap();
    let Open::Backed(b) = how else {
        panic!("not backed")
    };
    assert_eq!(b.origin(), Origin::Filled);
    assert_eq!(contents(&b), data);
    assert_eq!(*heard.lock().unwrap(), vec![(z, false)]);
    fs.release(fh);
    // The .npy view: the header, then the same bytes.
    let npy_dir = fs.lookup(ROOT, OsStr::new(".npy")).unwrap().ino;
    let npy = fs.lookup(npy_dir, OsStr::new("z.npy")).unwrap().ino;
    let (fh, _) = fs.open(npy, false).unwrap();
    read_all(&fs, npy, fh, data.len() + 128);
    fs.release(fh);
    filled(&fs);
    let (_, how) = fs.open(npy, false).unwrap();
    let Open::Backed(b) = how else {
        panic!("npy not backed")
    };
    let v = contents(&b);
    assert_eq!(&v[..6], b"\x93NUMPY");
    assert_eq!(&v[v.len() - data.len()..], &data[..]);
    assert_eq!(fs.backings.gauges().0, (v.len() + data.len()) as u64);
}

#[test]
fn a_tensor_decoded_into_a_file_is_backed_by_that_very_file() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    // Over PROGRESSIVE_MIN: served while it decodes, into a file.
    let data: Vec<u8> = (0..9_000_000u32).map(|i| (i / 11 % 239) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let heard = Arc::new(Mutex::new(Vec::new()));
    let h = heard.clone();
    let _ = fs
        .filled_hook()
        .set(Box::new(move |ino| h.lock().unwrap().push(ino)));
    let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
    let (fh, how) = fs.open(z, false).unwrap();
    assert!(matches!(how, Open::Served(_)));
    read_all(&fs, z, fh, data.len());
    assert!(fs.data().decodes_into_file(0, 0));
    let unit = fs.data().decoded_file(0, 0).expect("the decoded file").file;
    fs.release(fh);
    filled(&fs);
    let (fh, how) = fs.open(z, false).unwrap();
    let Open::Backed(b) = how else {
        panic!("not backed")
    };
    // The file the decoder wrote, not a copy of it.
    let (a, u) = (b.file().metadata().unwrap(), unit.metadata().unwrap());
    assert_eq!((a.dev(), a.ino()), (u.dev(), u.ino()));
    assert_eq!(contents(&b), data);
    let stats = fs.data().stats();
    assert_eq!(stats.backing_decoded.load(Relaxed), 1);
    assert_eq!(stats.decompressions.load(Relaxed), 1);
    assert_eq!(*heard.lock().unwrap(), vec![z]);
    assert_eq!(fs.backings.gauges().0, data.len() as u64);
    fs.release(fh);
}

#[test]
fn a_tensor_whose_bool_check_failed_is_not_backed_by_its_decoded_file() {
    let dir = tempfile::tempdir().unwrap();
    // Bool elements, one of them 2, near the end: the decoder finishes
    // its unit, the range check over it fails.
    let mut data: Vec<u8> = (0..9_000_000u32).map(|i| (i % 3 == 0) as u8).collect();
    data[8_999_000] = 2;
    let check = crate::catalog::Check::BoolBytesIn {
        start: 0,
        len: data.len() as u64,
    };
    let fs = zstd_fs_checked(dir.path(), &data, 1 << 30, vec![check]);
    fs.set_passthrough(true);
    let (z, fh) = open_z(&fs);
    assert_eq!(fs.read(z, fh, 0, 1 << 20).err(), Some(libc::EIO));
    fs.release(fh);
    filled(&fs);
    assert!(fs.data().decoded_file(0, 0).is_none());
    let (fh, how) = fs.open(z, false).unwrap();
    assert!(matches!(how, Open::Served(_)), "{how:?}");
    assert_eq!(fs.read(z, fh, 0, 1 << 20).err(), Some(libc::EIO));
    fs.release(fh);
    assert_eq!(fs.data().stats().backing_decoded.load(Relaxed), 0);
}

#[test]
fn a_decoded_file_is_not_adopted_once_the_source_changed() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..9_000_000u32).map(|i| (i / 19 % 211) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let (z, fh) = open_z(&fs);
    read_all(&fs, z, fh, data.len());
    // Rewritten in place, the same size: other bytes, a new mtime.
    let src = dir.path().join("data");
    let len = std::fs::metadata(&src).unwrap().len() as usize;
    std::fs::write(&src, vec![0x5a; len]).unwrap();
    fs.release(fh);
    filled(&fs);
    assert!(fs.data().decoded_file(0, 0).is_none());
    // Every open checks the source: refused, neither backed nor served.
    assert_eq!(fs.open(z, false).err(), Some(libc::ESTALE));
    assert_eq!(fs.data().stats().backing_decoded.load(Relaxed), 0);
}

#[test]
fn a_spilled_tensor_is_backed_by_its_spill_file() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    // Over half the 64 MiB cache: decoded into a spill file.
    let data: Vec<u8> = (0..40_000_000u32).map(|i| (i / 17 % 233) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let (z, fh) = open_z(&fs);
    read_all(&fs, z, fh, data.len());
    assert!(fs.data().spilled(0, 0));
    let spill = fs.data().decoded_file(0, 0).expect("the spill file").file;
    fs.release(fh);
    filled(&fs);
    let (fh, how) = fs.open(z, false).unwrap();
    let Open::Backed(b) = how else {
        panic!("not backed")
    };
    let (a, s) = (b.file().metadata().unwrap(), spill.metadata().unwrap());
    assert_eq!((a.dev(), a.ino()), (s.dev(), s.ino()));
    assert_eq!(contents(&b), data);
    assert_eq!(fs.data().stats().backing_decoded.load(Relaxed), 1);
    fs.release(fh);
}

/// A `.npy` view of a tensor that spills, under a `--decoded-cache-size`
/// too small for the spill and a backing file of the view side by
/// side: the view is served by the daemon from the spill, every time,
/// and its open never takes the room the spill needs.
#[test]
fn a_view_of_a_spilled_tensor_is_served_from_its_spill_when_both_do_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    // Over half the 64 MiB cache: decoded into a spill file, 40 MB of
    // a 60 MB bound.
    let data: Vec<u8> = (0..40_000_000u32).map(|i| (i / 23 % 239) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 60_000_000);
    fs.set_passthrough(true);
    let top = fs.lookup(ROOT, OsStr::new(".npy")).unwrap().ino;
    let attr = fs.lookup(top, OsStr::new("z.npy")).unwrap();
    let (npy, len) = (attr.ino, attr.size as usize);
    for round in 0..2 {
        let (fh, how) = fs.open(npy, false).unwrap();
        assert!(matches!(how, Open::Served(_)), "round {round}: {how:?}");
        let mut got = Vec::new();
        while got.len() < len {
            let at = got.len() as u64;
            let bytes = fs.read(npy, fh, at, 1 << 20).unwrap_or_else(|e| {
                panic!("round {round}: read at {at}: errno {e}");
            });
            got.extend_from_slice(&bytes);
            fs.served(at, bytes);
        }
        fs.write_behind.flush();
        assert_eq!(&got[len - data.len()..], &data[..], "round {round}");
        assert!(got.starts_with(b"\x93NUMPY"));
        fs.release(fh);
        filled(&fs);
        assert!(fs.data().spilled(0, 0), "round {round}: the spill stays");
    }
    assert_eq!(fs.data().stats().errors.load(Relaxed), 0);
    // The tensor's own file is backed by the spill itself.
    let (z, fh) = open_z(&fs);
    read_all(&fs, z, fh, data.len());
    fs.release(fh);
    filled(&fs);
    let (fh, how) = fs.open(z, false).unwrap();
    assert!(matches!(how, Open::Backed(_)), "{how:?}");
    fs.release(fh);
}

#[test]
fn without_passthrough_a_tensor_is_decoded_into_memory() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..9_000_000u32).map(|i| (i / 13 % 229) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(false);
    let (z, fh) = open_z(&fs);
    let mut got = Vec::new();
    while got.len() < data.len() {
        let bytes = fs.read(z, fh, got.len() as u64, 1 << 20).unwrap();
        got.extend_from_slice(&bytes);
        fs.served((got.len() - bytes.len()) as u64, bytes);
    }
    assert_eq!(got, data);
    assert!(!fs.data().decodes_into_file(0, 0));
    assert!(fs.data().decoded_file(0, 0).is_none());
    fs.release(fh);
}

#[test]
fn a_whole_read_writes_its_backing_file_and_the_fill_reads_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 5 % 241) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let (z, fh) = open_z(&fs);
    read_all(&fs, z, fh, data.len());
    // Its one decoded unit is all written: it left the cache.
    assert_eq!(fs.data().cache().gauges().cache_entries, 0);
    let stats = fs.data().stats();
    let counts = || {
        (
            stats.cache_hits.load(Relaxed),
            stats.cache_misses.load(Relaxed),
            stats.decompressions.load(Relaxed),
        )
    };
    let before = counts();
    fs.release(fh);
    filled(&fs);
    assert_eq!(counts(), before, "the fill read the data layer again");
    assert_eq!(backed_bytes(&fs, z), data);
}

#[test]
fn a_read_of_the_safetensors_view_lets_what_it_wrote_through_leave_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 5 % 241) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let (_, fh) = read_safetensors_view(&fs);
    // As for the tensor's own file: its decoded unit is all written
    // through, so it is not kept in memory too.
    assert_eq!(fs.data().cache().gauges().cache_entries, 0);
    fs.release(fh);
}

#[test]
fn the_page_cache_behind_a_reader_is_dropped_in_steps_once_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i / 9 % 227) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let drops = Arc::new(Mutex::new(Vec::new()));
    let d = drops.clone();
    let _ = fs.behind_hook().set(Box::new(move |ino, at, len| {
        d.lock().unwrap().push((ino, at, len));
    }));
    let (z, fh) = open_z(&fs);
    // 1 MiB reads; in tests a step is 2 MiB, ending 1 MiB behind the
    // reader: dropped when the reader is at 3, 5 and 7 MiB.
    read_all(&fs, z, fh, data.len());
    let mib = 1u64 << 20;
    assert_eq!(
        *drops.lock().unwrap(),
        vec![
            (z, 0, 2 * mib),
            (z, 2 * mib, 2 * mib),
            (z, 4 * mib, 2 * mib)
        ]
    );
    fs.release(fh);
}

#[test]
fn a_close_that_comes_before_the_last_reads_write_through_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 7 % 233) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let (z, fh) = open_z(&fs);
    let last = 2_000_000;
    read_all(&fs, z, fh, last);
    let tail = fs.read(z, fh, last as u64, 1 << 20).unwrap();
    assert_eq!(tail.len(), data.len() - last);
    let decoded = fs.data().stats().decompressions.load(Relaxed);
    // The reader has the tail and closes while the daemon has yet to
    // write it through.
    std::thread::scope(|s| {
        let closing = s.spawn(|| fs.release(fh));
        let t = std::time::Instant::now();
        while crate::mount::lock(&fs.opens).by_fh.contains_key(&fh) {
            assert!(t.elapsed().as_secs() < 30, "release never began");
            std::thread::yield_now();
        }
        fs.served(last as u64, tail);
        closing.join().unwrap();
    });
    filled(&fs);
    let stats = fs.data().stats();
    assert_eq!(stats.decompressions.load(Relaxed), decoded, "decoded again");
    assert_eq!(backed_bytes(&fs, z), data);
}

#[test]
fn a_write_still_under_way_when_its_close_stops_waiting_drops_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 11 % 239) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let (z, fh) = open_z(&fs);
    read_all(&fs, z, fh, 2_000_000);
    // The tail's write never comes while the close waits (2 s): it
    // would land beside the fill's, so the file is not kept.
    let tail = fs.read(z, fh, 2_000_000, 1 << 20).unwrap();
    fs.release(fh);
    filled(&fs);
    fs.served(2_000_000, tail);
    fs.write_behind.flush();
    assert_eq!(fs.backings.gauges(), (0, 0));
    let (fh, how) = fs.open(z, false).unwrap();
    assert!(
        !matches!(how, Open::Backed(_)),
        "a file written after its seal"
    );
    read_all(&fs, z, fh, data.len());
    fs.release(fh);
}

#[test]
fn a_close_while_an_earlier_close_waits_to_seal_leaves_the_backing_file_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 5 % 227) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
    // A peek whose write-through is still to come when its open closes:
    // that close waits in the seal.
    let (a, _) = fs.open(z, false).unwrap();
    let first = fs.read(z, a, 0, 4096).unwrap();
    let Some(NodeKind::File(c)) = fs.tree.node(z).map(|n| &n.kind) else {
        panic!("z is no file")
    };
    std::thread::scope(|s| {
        let closing = s.spawn(|| fs.release(a));
        let t = std::time::Instant::now();
        while !fs.backings.sealing(c) {
            assert!(t.elapsed().as_secs() < 30, "the close never took the file");
            std::thread::yield_now();
        }
        // Another open peeks and closes meanwhile (the next `dd`): its
        // close finds the file taken, and returns at once.
        let (b, _) = fs.open(z, false).unwrap();
        let peek = fs.read(z, b, 4096, 4096).unwrap();
        fs.served(4096, peek);
        fs.release(b);
        fs.served(0, first);
        closing.join().unwrap();
    });
    // Dropped once (a peek keeps no disk), and counted so.
    assert_eq!(fs.backings.gauges(), (0, 0));
    let (c, _) = fs.open(z, false).unwrap();
    read_all(&fs, z, c, data.len());
    fs.release(c);
}

#[test]
fn an_open_right_after_a_whole_read_waits_for_its_backing_file_to_be_published() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 3 % 239) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    // A slow drop of the inode's page cache, as for gigabytes of it.
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = dropped.clone();
    let _ = fs.filled_hook().set(Box::new(move |_| {
        std::thread::sleep(std::time::Duration::from_millis(300));
        d.store(true, Relaxed);
    }));
    let (z, fh) = open_z(&fs);
    read_all(&fs, z, fh, data.len());
    fs.release(fh);
    // Every byte is written: the next open waits for the publication
    // instead of being served (which would fill the page cache again).
    let (fh, how) = fs.open(z, false).unwrap();
    let Open::Backed(b) = how else {
        panic!("served while its backing file was being published")
    };
    assert!(
        dropped.load(Relaxed),
        "backed before the page cache was dropped"
    );
    assert_eq!(contents(&b), data);
    fs.release(fh);
}

#[test]
fn a_spill_short_of_disk_may_drop_a_filled_file_no_open_holds() {
    let dir = tempfile::tempdir().unwrap();
    let data = vec![9u8; 1 << 20];
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let (z, fh) = open_z(&fs);
    read_all(&fs, z, fh, data.len());
    fs.release(fh);
    filled(&fs);
    let (fh, how) = fs.open(z, false).unwrap();
    assert!(matches!(how, Open::Backed(_)));
    let free = fs.data().free_disk();
    assert!(!free(), "dropped a backing file an open holds");
    fs.release(fh);
    assert!(free());
    assert_eq!(fs.backings.gauges(), (0, 0));
    assert!(!free());
}

#[test]
fn a_partly_read_file_is_filled_in_its_gaps_and_a_peek_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 3 % 239) as u8).collect();
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    fs.set_passthrough(true);
    let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
    // A peek away from the start makes no backing file; one from the
    // start makes one, and what it wrote is dropped at close.
    let (fh, _) = fs.open(z, false).unwrap();
    let bytes = fs.read(z, fh, 4096, 4096).unwrap();
    fs.served(4096, bytes);
    assert_eq!(fs.backings.gauges(), (0, 0));
    let bytes = fs.read(z, fh, 0, 4096).unwrap();
    fs.served(0, bytes);
    assert_eq!(fs.backings.gauges(), (data.len() as u64, 1));
    fs.release(fh);
    assert_eq!(fs.backings.gauges(), (0, 0));
    // Two thirds read, out of order and in odd sizes: the rest is filled.
    let (fh, _) = fs.open(z, false).unwrap();
    for (at, n) in [
        (0, 12_345),
        (1_000_000u64, 777_777u32),
        (12_345, 987_655),
        (1_777_777, 222_223),
    ] {
        let bytes = fs.read(z, fh, at, n).unwrap();
        fs.served(at, bytes);
    }
    fs.release(fh);
    filled(&fs);
    assert_eq!(backed_bytes(&fs, z), data);
}

/// Reads away from the start of a file whose backing file another open's
/// reads write join it: what they decode is written there too.
#[test]
fn a_read_away_from_the_start_joins_the_backing_file_another_open_writes() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i / 11 % 229) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    let (z, a) = open_z(&fs);
    let (_, b) = open_z(&fs);
    // `b` peeks first: nothing is made for it alone.
    let bytes = fs.read(z, b, 3 << 20, 4096).unwrap();
    fs.served(3 << 20, bytes);
    assert_eq!(fs.backings.gauges(), (0, 0));
    b_joins_the_file_a_makes(&fs, z, &data, a, b);
}

/// Open `a` reads file `z` (of `data`) from the start, which makes its
/// backing file; open `b` then reads its third MiB, which must be written
/// there too. Both are closed.
fn b_joins_the_file_a_makes(fs: &TensorFs, z: Ino, data: &[u8], a: u64, b: u64) {
    let bytes = fs.read(z, a, 0, 1 << 20).unwrap();
    fs.served(0, bytes);
    assert_eq!(fs.backings.gauges(), (data.len() as u64, 1));
    let bytes = fs.read(z, b, 2 << 20, 1 << 20).unwrap();
    fs.served(2 << 20, bytes);
    fs.write_behind.flush();
    let key = Content::Part { tensor: 0, part: 0 };
    let file = fs.backings.being_written(&key).unwrap();
    let written = file
        .read(2 << 20, 1 << 20)
        .expect("b's read written through");
    assert!(written[..] == data[2 << 20..3 << 20]);
    fs.release(a);
    fs.release(b);
}

/// An open whose read from the start found no backing file to make (no
/// room, or another open's still being made) still joins one made later:
/// what its next reads decode is written there too.
#[test]
fn a_read_from_the_start_that_found_no_backing_file_joins_one_made_later() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i / 7 % 241) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    let (z, b) = open_z(&fs);
    // Nothing can be made for `b`'s first read (passthrough given up a
    // moment, as when the room is taken).
    fs.set_passthrough(false);
    let bytes = fs.read(z, b, 0, 1 << 20).unwrap();
    fs.served(0, bytes);
    fs.set_passthrough(true);
    assert_eq!(fs.backings.gauges(), (0, 0));
    let (_, a) = open_z(&fs);
    b_joins_the_file_a_makes(&fs, z, &data, a, b);
}

/// A backing file begun by an open's reads is dropped at its close when
/// the kernel refused passthrough meanwhile: none would be passed through.
#[test]
fn a_backing_file_begun_before_passthrough_was_refused_is_dropped_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i / 13 % 239) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    let (z, a) = open_z(&fs);
    read_all(&fs, z, a, data.len());
    assert_eq!(fs.backings.gauges(), (data.len() as u64, 1));
    // What `refused_backing` does first.
    fs.set_passthrough(false);
    fs.release(a);
    assert_eq!(fs.backings.gauges(), (0, 0));
}

#[test]
fn a_filled_file_leaves_none_of_its_frames_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i / 7 % 233) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    // Reads of its first two frames, which queue decodes of the next
    // ones (read-ahead); the fill writes those two, from the cache.
    let (z, fh) = open_z(&fs);
    for at in [0, 1 << 20] {
        let bytes = fs.read(z, fh, at, 1 << 20).unwrap();
        fs.served(at, bytes);
    }
    fs.write_behind.flush();
    // The read-ahead done first: a decode of it still queued when the
    // fill is over would put its frame back.
    let cache = fs.data().cache();
    let t = std::time::Instant::now();
    while cache.peek((0, 2)).is_none()
        || cache.peek((0, 3)).is_none()
        || cache.gauges().inflight_decodes > 0
    {
        assert!(t.elapsed().as_secs() < 30, "read-ahead not done");
        std::thread::yield_now();
    }
    fs.release(fh);
    filled(&fs);
    // Its bytes are in the file: none stay in the daemon's memory too.
    assert_eq!(fs.data().cache().gauges().cache_entries, 0);
    assert_eq!(backed_bytes(&fs, z), data);
}

#[test]
fn a_stream_two_tensors_share_leaves_memory_once_a_file_of_both_is_filled() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i / 11 % 229) as u8).collect();
    let (n, half) = (data.len() as u64, 1_234_567u64);
    let (mut catalog, _) =
        crate::serve::testing::catalog_of(dir.path(), &[("a", &[0u8][..]), ("b", &[0u8][..])]);
    let blob = zstd::encode_all(&data[..], 3).unwrap();
    std::fs::write(dir.path().join("data"), &blob).unwrap();
    catalog.blobs[0] = Blob {
        len: blob.len() as u64,
        codec: Codec::Zstd { frames: None },
        decoded_len: n,
        ..catalog.blobs[0].clone()
    };
    // One stream, decoded as one unit: "a" its first bytes, "b" the rest.
    for (t, start, len) in [(0, 0, half), (1, half, n - half)] {
        let mut part = Part::dense(DType::Uint8, vec![len], len, 0, Endian::Little);
        part.map = crate::catalog::PartMap::Contiguous { start };
        catalog.tensors[t].shape = vec![len];
        catalog.tensors[t].parts = Ok(vec![part]);
    }
    let fs = fs_of(dir.path(), catalog, 1 << 30);
    fs.set_passthrough(true);
    let (view, fh) = read_safetensors_view(&fs);
    // Neither tensor covers the unit, so it stays while read.
    assert_eq!(fs.data().cache().gauges().cache_entries, 1);
    fs.release(fh);
    filled(&fs);
    // The view's file holds all of the stream: the unit leaves memory.
    assert_eq!(fs.data().cache().gauges().cache_entries, 0);
    let bytes = backed_bytes(&fs, view);
    assert_eq!(&bytes[bytes.len() - data.len()..], &data[..]);
}

#[test]
fn nothing_is_backed_without_passthrough_or_room() {
    let dir = tempfile::tempdir().unwrap();
    let data = vec![7u8; 1 << 20];
    let fs = zstd_fs(dir.path(), &data, 1 << 30);
    let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
    for _ in 0..2 {
        let (fh, how) = fs.open(z, false).unwrap();
        // No backing file to come: the kernel's page cache keeps it.
        assert!(matches!(how, Open::Served(CacheMode::KeepCache)));
        read_all(&fs, z, fh, data.len());
        fs.release(fh);
        filled(&fs);
    }
    assert_eq!(fs.backings.gauges(), (0, 0));
    let dir2 = tempfile::tempdir().unwrap();
    let small = zstd_fs(dir2.path(), &data, 1000);
    small.set_passthrough(true);
    for _ in 0..2 {
        let (fh, how) = small.open(z, false).unwrap();
        assert!(matches!(how, Open::Served(_)));
        read_all(&small, z, fh, data.len());
        small.release(fh);
        filled(&small);
    }
    assert_eq!(small.backings.gauges(), (0, 0));
}

#[test]
fn an_open_served_beside_another_reads_the_complete_backing_file_without_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i / 5 % 227) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    // A first open reads half and closes: the fill of the rest waits
    // while the mount is busy, and a second open meanwhile is served.
    let (z, busy) = read_then_closed_busy(&fs, 2);
    let (_, b) = open_z(&fs);
    drop(busy);
    filled(&fs);
    // Complete now, but `b` is served: so is a third open of the file.
    let (c, how) = fs.open(z, false).unwrap();
    assert!(matches!(how, Open::Served(_)));
    let decodes = fs.data().stats().decompressions.load(Relaxed);
    let mut got = Vec::new();
    while got.len() < data.len() {
        let bytes = fs.read(z, c, got.len() as u64, 1 << 20).unwrap();
        got.extend_from_slice(&bytes);
        fs.served(got.len() as u64 - bytes.len() as u64, bytes);
    }
    assert_eq!(got, data);
    // Every byte came from the backing file: nothing was decoded again.
    assert_eq!(fs.data().stats().decompressions.load(Relaxed), decodes);
    fs.release(b);
    fs.release(c);
}

#[test]
fn a_file_being_filled_is_given_up_for_a_spill_and_never_published() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i / 3 % 211) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    // Half read, then closed: the fill of the rest waits for a quiet mount.
    let (z, busy) = read_then_closed_busy(&fs, 2);
    let n = data.len() as u64;
    assert_eq!(fs.backings.gauges(), (n, 1));
    let used = fs.data().decoded_disk().used();
    // A spill a read needs takes its room at once.
    assert!(fs.backings.give_up_writing(|_, _| true, usize::MAX));
    assert_eq!(fs.backings.gauges(), (0, 0));
    assert_eq!(fs.data().decoded_disk().used(), used - n);
    drop(busy);
    let t = std::time::Instant::now();
    while !fs.backings.fills_done() {
        assert!(t.elapsed().as_secs() < 30, "the fill did not stop");
        std::thread::yield_now();
    }
    // Stopped, not published: the next open is served, with the right
    // bytes, and nothing is charged twice.
    assert_eq!(fs.backings.gauges(), (0, 0));
    assert_eq!(fs.data().decoded_disk().used(), used - n);
    let (b, how) = fs.open(z, false).unwrap();
    assert!(matches!(how, Open::Served(_)));
    let mut got = Vec::new();
    while got.len() < data.len() {
        let bytes = fs.read(z, b, got.len() as u64, 1 << 20).unwrap();
        got.extend_from_slice(&bytes);
    }
    assert_eq!(got, data);
    fs.release(b);
}

#[test]
fn an_open_right_after_a_close_that_wrote_nearly_all_waits_for_the_backing_file() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i / 9 % 223) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    // Seven of its eight frames read, written through, then closed while
    // another reader keeps the mount busy.
    let (z, busy) = read_then_closed_busy(&fs, 7);
    // The next open waits for the last eighth, filled at once, and is
    // passed through to the complete file.
    assert_eq!(backed_bytes(&fs, z), data);
    drop(busy);
}

/// Disk held by the unlinked files under `dir` that this process has
/// open, each file once.
fn held(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let dir = dir.to_string_lossy().into_owned();
    let mut seen = std::collections::HashSet::new();
    let mut bytes = 0;
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if !target.starts_with(&dir) || !target.ends_with(" (deleted)") {
            continue;
        }
        if let Ok(m) = std::fs::metadata(fd.path())
            && seen.insert(m.ino())
        {
            bytes += m.blocks() * 512;
        }
    }
    bytes
}

/// The `.safetensors` view of `fs` opened, its first `len` bytes read
/// and written through, and closed: its inode.
fn view_read_and_closed(fs: &TensorFs, len: u64) -> Ino {
    let (view, _) = safetensors_view(fs);
    let (fh, _) = fs.open(view, false).unwrap();
    let mut at = 0;
    while at < len {
        let bytes = fs
            .read(view, fh, at, (len - at).min(1 << 20) as u32)
            .unwrap();
        let n = bytes.len() as u64;
        fs.served(at, bytes);
        at += n;
    }
    fs.write_behind.flush();
    fs.release(fh);
    view
}

#[test]
fn a_fill_given_up_while_queued_frees_its_disk_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i / 5 % 199) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    // Tensor z's fill taken by its thread, waiting for a quiet mount; the
    // view's, 3 MiB of it written, queued behind it.
    let (z, busy) = read_then_closed_busy(&fs, 2);
    let before = held(dir.path());
    view_read_and_closed(&fs, 3 << 20);
    assert!(held(dir.path()) >= before + (3 << 20));
    assert!(
        fs.backings
            .give_up_writing(|c, _| matches!(c, Content::ViewData { .. }), usize::MAX)
    );
    // Its blocks are freed now, not when the fill ahead of it is done.
    assert!(
        held(dir.path()) <= before + (64 << 10),
        "{}",
        held(dir.path())
    );
    drop(busy);
    filled(&fs);
    assert_eq!(backed_bytes(&fs, z), data);
}

#[test]
fn copies_for_speed_are_given_up_one_at_a_time_the_largest_first() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4_000_000u32).map(|i| (i / 7 % 193) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    let (z, busy) = read_then_closed_busy(&fs, 2);
    view_read_and_closed(&fs, 3 << 20);
    assert_eq!(fs.backings.gauges().1, 2);
    // The view's file, the larger, goes; the tensor's is still filled.
    assert!(fs.backings.give_up_writing(|_, _| true, 1));
    assert_eq!(fs.backings.gauges(), (data.len() as u64, 1));
    drop(busy);
    filled(&fs);
    assert_eq!(backed_bytes(&fs, z), data);
}

#[test]
fn an_open_waits_neither_for_a_fill_queued_behind_another_nor_beside_a_served_open() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i / 11 % 227) as u8).collect();
    let fs = framed_fs(dir.path(), &data);
    // Tensor z's fill waits for a quiet mount; the view's, all but its
    // last 512 KiB written, is queued behind it.
    let (_z, busy) = read_then_closed_busy(&fs, 5);
    let (_, size) = safetensors_view(&fs);
    let view = view_read_and_closed(&fs, size - (512 << 10));
    // Served at once, not after the second a fill being made would get.
    let t = std::time::Instant::now();
    let (a, how) = fs.open(view, false).unwrap();
    assert!(matches!(how, Open::Served(_)));
    assert!(
        t.elapsed() < std::time::Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    // Beside that served open, a second one is served whatever it finds.
    let t = std::time::Instant::now();
    let (b, how) = fs.open(view, false).unwrap();
    assert!(matches!(how, Open::Served(_)));
    assert!(
        t.elapsed() < std::time::Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    fs.release(a);
    fs.release(b);
    drop(busy);
}
