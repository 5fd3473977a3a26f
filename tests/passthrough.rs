//! FUSE passthrough through real mounts: which files the kernel reads
//! itself (the `model.safetensors` view that is its source, decoded tensors
//! once decoded), that it does (the daemon serves none of their bytes),
//! that the bytes are those of the daemon's own path, and the rules around
//! it: opens during a fill, eviction under a small limit with files held
//! open, nothing left in `--cache-dir` after `kill -9`, a source rewritten
//! in place, and the fallback without CAP_SYS_ADMIN.

mod support;

use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use support::{Mount, Rng, run_with_timeout, wait_until};
use ztensor_mount::formats::zt_v01::DType;
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};

/// A safetensors file of `tensors` (name, F32 values), as the format lays
/// it out: header length, JSON header padded with spaces to 8 bytes, data.
fn write_safetensors(path: &Path, tensors: &[(&str, Vec<f32>)]) -> Vec<u8> {
    let typed: Vec<(&str, &str, Vec<u8>, usize)> = tensors
        .iter()
        .map(|(name, v)| {
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (*name, "F32", bytes, v.len())
        })
        .collect();
    write_typed_safetensors(path, &typed)
}

/// A safetensors file of `tensors` (name, dtype, little-endian bytes,
/// element count; one dimension each), laid out as [`write_safetensors`]
/// does: the file's bytes.
fn write_typed_safetensors(path: &Path, tensors: &[(&str, &str, Vec<u8>, usize)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, bytes, n) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": [n], "data_offsets": [start, data.len()]}),
        );
    }
    header.insert(
        "__metadata__".into(),
        serde_json::json!({"format": "pt", "written_by": "the passthrough test"}),
    );
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize((text.len() + 8).next_multiple_of(8) - 8, b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&data);
    std::fs::write(path, &out).unwrap();
    out
}

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut r = Rng(seed);
    (0..n).map(|_| (r.below(1 << 20) as f32) / 7.0).collect()
}

/// A zTensor file with the zstd tensors `names`, each `n` float32 values
/// in 1 MiB frames, and one raw tensor `raw`; returns each tensor's bytes.
fn write_zstd(path: &Path, names: &[&str], n: usize) -> Vec<(String, Vec<u8>)> {
    let mut w = Writer::create(path).unwrap();
    let mut out = Vec::new();
    let zstd = Options {
        compression: Compression::zstd(),
        ..Options::default()
    };
    for (i, name) in names.iter().enumerate() {
        let le = support::compressible(i as u64 + 1, n * 4);
        w.add(name, DType::Float32, &[n as u64], &le, &zstd)
            .unwrap();
        out.push((name.to_string(), le));
    }
    let raw = support::pattern(4, 1000, 9);
    w.add("raw", DType::Float32, &[1000], &raw, &Options::default())
        .unwrap();
    out.push(("raw".into(), raw));
    w.finish().unwrap();
    out
}

/// Reads `name` whole through one open, one MiB at a time, waiting after
/// each for the write-behind to write it, as a reader that leaves the CPU
/// free between its reads would find: none of it is left to the fill.
/// Returns the bytes and the open, still held.
fn read_written_behind(m: &Mount, name: &str, len: usize) -> (Vec<u8>, std::fs::File) {
    let mut f = std::fs::File::open(m.path(name)).unwrap();
    let mut got = vec![0u8; len];
    let before = m.stat_u64("write_behind_bytes") + m.stat_u64("write_behind_skipped_bytes");
    let skipped = m.stat_u64("write_behind_skipped_bytes");
    let mut at = 0;
    for chunk in got.chunks_mut(1 << 20) {
        f.read_exact(chunk).unwrap();
        at += chunk.len() as u64;
        assert_eq!(m.written_behind(before + at), skipped, "{}", m.stats());
    }
    (got, f)
}

/// Maps `path` (through the mount) and compares it with `want`.
fn assert_mapped_eq(path: &Path, want: &[u8]) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: the mount is read-only; nothing writes the file while mapped.
    let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
    assert_eq!(&map[..], want);
}

fn npy_data(npy: &[u8]) -> &[u8] {
    let hlen = u16::from_le_bytes([npy[8], npy[9]]) as usize;
    &npy[10 + hlen..]
}

#[test]
fn the_safetensors_view_of_a_safetensors_file_is_that_file_read_by_the_kernel() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("model.safetensors");
    let bytes = write_safetensors(
        &src,
        &[("b.weight", values(1, 300_000)), ("a.bias", values(2, 7))],
    );
    m.mount(&src, &[]);
    assert!(
        m.log_text().contains("passthrough is on"),
        "{}",
        m.log_text()
    );
    assert_eq!(m.stats()["passthrough"], true);
    let view = ".safetensors/model.safetensors";
    assert_eq!(
        std::fs::metadata(m.path(view)).unwrap().len(),
        bytes.len() as u64
    );
    let served = m.stat_u64("bytes_served");
    let opens = m.stat_u64("passthrough_opens");
    let reads = m.stat_u64("reads");
    assert_eq!(m.read(view), bytes, "the view is the file, byte for byte");
    // mmap, as safetensors' own loader reads it.
    assert_mapped_eq(&m.path(view), &bytes);
    assert_eq!(
        m.stat_u64("bytes_served"),
        served,
        "the daemon served bytes of a backed file"
    );
    // Nor saw a read of it (reads of .ztensor/stats are not counted).
    assert_eq!(m.stat_u64("reads"), reads, "{}", m.stats());
    assert_eq!(m.stat_u64("passthrough_opens"), opens + 2);
    // The tensor files are still the daemon's, and right.
    let b = m.read("b.weight");
    assert_eq!(
        &b[..],
        &bytes[bytes.len() - 7 * 4 - 300_000 * 4..bytes.len() - 28]
    );
    m.unmount_ok();
}

#[test]
fn a_safetensors_view_holding_a_tensor_that_fails_its_check_is_served_but_for_that_tensor() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    // A bool tensor with a byte that is neither 0 nor 1, beside a good one.
    let src = m.scratch_path("model.safetensors");
    let w: Vec<u8> = values(4, 2048)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let bytes = write_typed_safetensors(
        &src,
        &[
            ("w", "F32", w.clone(), 2048),
            ("flags", "BOOL", vec![0, 1, 2, 1], 4),
        ],
    );
    m.mount(&src, &[]);
    // The kernel would serve every byte of the file: the daemon serves
    // the view, as without passthrough, and fails only that tensor's range.
    let view = std::fs::File::open(m.path(".safetensors/model.safetensors")).unwrap();
    // The data section: the two tensors' 8196 bytes at the file's end.
    let data = bytes.len() as u64 - 8196;
    let mut got = vec![0u8; w.len()];
    view.read_exact_at(&mut got, data).unwrap();
    assert!(got == w, "the good tensor's bytes");
    let err = view.read_exact_at(&mut [0u8; 4], data + 8192).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(m.stat_u64("passthrough_opens"), 0);
    assert!(m.log_text().contains("flags"), "{}", m.log_text());
    drop(view);
    m.unmount_ok();
}

#[test]
fn without_passthrough_the_daemon_serves_the_same_bytes_and_says_why() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("model.safetensors");
    let bytes = write_safetensors(&src, &[("w", values(3, 50_000))]);
    m.mount(&src, &["--no-passthrough"]);
    assert!(
        m.log_text()
            .contains("every file is served through FUSE: passthrough is off (--no-passthrough)"),
        "{}",
        m.log_text()
    );
    assert_eq!(m.stats()["passthrough"], false);
    assert_eq!(m.read(".safetensors/model.safetensors"), bytes);
    assert!(m.stat_u64("bytes_served") >= 200_000, "{}", m.stats());
    assert_eq!(m.stat_u64("passthrough_opens"), 0);
    m.unmount_ok();
}

#[test]
fn a_decoded_tensor_is_passed_through_once_its_backing_file_is_filled() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let tensors = write_zstd(&src, &["z"], 3 << 20);
    let cache = m.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    m.mount(&src, &["--cache-dir", cache.to_str().unwrap()]);
    let want = &tensors[0].1;
    // The first open is the daemon's, and starts the fill.
    assert_eq!(&m.read("z"), want);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 1, "{}", m.stats());
    assert_eq!(m.stat_u64("backing_bytes_now"), want.len() as u64);
    // Unlinked: nothing in the directory, though it holds the bytes.
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
    let served = m.stat_u64("bytes_served");
    assert_eq!(&m.read("z"), want);
    // The zarr chunk holds the same bytes: the same backing file.
    assert_eq!(&m.read(".zarr/z/c/0"), want);
    assert_mapped_eq(&m.path("z"), want);
    assert_eq!(m.stat_u64("bytes_served"), served, "{}", m.stats());
    assert_eq!(m.stat_u64("backing_files"), 1);
    // The .npy view: a file of its own (header first), filled the same way.
    let npy = m.read(".npy/z.npy");
    assert_eq!(npy_data(&npy), &want[..]);
    m.settled();
    let served = m.stat_u64("bytes_served");
    assert_eq!(m.read(".npy/z.npy"), npy);
    assert_eq!(m.stat_u64("bytes_served"), served);
    // A raw tensor at an offset stays the daemon's.
    assert_eq!(m.read("raw"), tensors[1].1);
    assert!(m.stat_u64("bytes_served") > served);
    m.unmount_ok();
}

/// A zTensor file of one float32 tensor `z` of 12 MiB in one zstd frame.
fn write_one_frame(path: &Path) -> Vec<u8> {
    write_one_frame_of(path, 12 << 20)
}

/// The same, of `len` bytes (a multiple of 4).
fn write_one_frame_of(path: &Path, len: usize) -> Vec<u8> {
    let mut w = Writer::create(path).unwrap();
    let want = support::compressible(7, len);
    let one_frame = support::one_frame_options(3);
    w.add("z", DType::Float32, &[len as u64 / 4], &want, &one_frame)
        .unwrap();
    w.finish().unwrap();
    want
}

/// A mount of [`write_one_frame`]'s file with a cache dir of its own and
/// `opts`: the mount, the tensor's bytes, the cache dir.
fn mount_one_frame(opts: &[&str]) -> Option<(Mount, Vec<u8>, PathBuf)> {
    let mut m = Mount::scratch()?;
    let src = m.scratch_path("z.zt");
    let want = write_one_frame(&src);
    let cache = m.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    let dir = cache.to_str().unwrap();
    m.mount(&src, &[&["--cache-dir", dir][..], opts].concat());
    Some((m, want, cache))
}

#[test]
fn a_one_frame_tensor_is_backed_by_the_file_it_was_decoded_into() {
    let _s = support::serial();
    // Decoded whole, served while it decodes.
    let Some((m, want, cache)) = mount_one_frame(&[]) else {
        return;
    };
    assert_eq!(m.read("z"), want);
    m.settled();
    // That file became the backing as it was: nothing was filled, and
    // the tensor was decoded once.
    assert_eq!(m.stat_u64("backing_decoded"), 1, "{}", m.stats());
    assert_eq!(m.stat_u64("backing_files"), 1);
    assert_eq!(m.stat_u64("decompressions"), 1);
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
    let (served, opens) = (m.stat_u64("bytes_served"), m.stat_u64("passthrough_opens"));
    assert_eq!(m.read("z"), want);
    assert_mapped_eq(&m.path("z"), &want);
    assert_eq!(m.stat_u64("bytes_served"), served, "{}", m.stats());
    assert_eq!(m.stat_u64("passthrough_opens"), opens + 2);
    // Its .npy view is a file of its own, from the same decode.
    assert_eq!(npy_data(&m.read(".npy/z.npy")), &want[..]);
    assert_eq!(m.stat_u64("decompressions"), 1);
    assert_killed_leaving_nothing(m, &cache);
}

#[test]
fn a_spilled_tensor_is_backed_by_its_spill_file() {
    let _s = support::serial();
    // 12 MiB is over half of a 16 MiB cache: decoded into a spill file.
    let Some((m, want, cache)) = mount_one_frame(&["--cache-size", "16M"]) else {
        return;
    };
    assert_eq!(m.read("z"), want);
    m.settled();
    assert_eq!(m.stat_u64("spilled_tensors"), 1, "{}", m.stats());
    assert_eq!(m.stat_u64("backing_decoded"), 1, "{}", m.stats());
    let served = m.stat_u64("bytes_served");
    assert_eq!(m.read("z"), want);
    assert_eq!(m.stat_u64("bytes_served"), served, "{}", m.stats());
    m.unmount_ok();
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
}

/// A spilled tensor's `.npy` under a `--decoded-cache-size` that holds
/// the spill but not a second copy beside it: read whole (by `read` and
/// by a mapping), again and again, with no error; the view stays the
/// daemon's, served from the spill, which is never dropped for it, and
/// the tensor's own file is backed by the spill.
#[test]
fn a_spilled_tensors_npy_is_served_from_its_spill_where_a_copy_would_not_fit() {
    let _s = support::serial();
    let Some((m, want, cache)) =
        mount_one_frame(&["--cache-size", "16M", "--decoded-cache-size", "20M"])
    else {
        return;
    };
    for _ in 0..2 {
        assert_eq!(npy_data(&m.read(".npy/z.npy")), &want[..]);
        m.settled();
    }
    let npy = m.read(".npy/z.npy");
    assert_mapped_eq(&m.path(".npy/z.npy"), &npy);
    assert_eq!(m.stat_u64("errors"), 0, "{}", m.stats());
    assert_eq!(m.stat_u64("decompressions"), 1, "{}", m.stats());
    assert_eq!(m.stat_u64("spill_evictions"), 0, "{}", m.stats());
    assert_eq!(m.stat_u64("passthrough_opens"), 0, "{}", m.stats());
    // Its spill, complete, is the backing from the first open.
    assert_eq!(m.read("z"), want);
    assert_eq!(m.stat_u64("passthrough_opens"), 1, "{}", m.stats());
    assert_eq!(m.stat_u64("backing_decoded"), 1, "{}", m.stats());
    assert_killed_leaving_nothing(m, &cache);
}

/// A reader part way through a spilled tensor keeps its spill: another
/// tensor whose spill does not fit beside it waits for it instead of
/// taking its room, which would leave the first reader to fail in the
/// middle of its file; once the first reader has had every byte, the
/// other is served.
#[test]
fn a_spill_part_read_is_not_dropped_for_another() {
    let _s = support::serial();
    let Some((m, a, b)) = mount_two_spilling_tensors() else {
        return;
    };
    let (mut fa, mut got) = first_mib(&m, "a");
    // `b` waits for `a`'s reader, which goes on meanwhile.
    let path = m.path("b");
    let reader = std::thread::spawn(move || std::fs::read(path));
    assert!(
        support::wait_until(Duration::from_secs(10), || m.stat_u64("spill_room_waits")
            >= 1),
        "{}",
        m.stats()
    );
    fa.read_to_end(&mut got).unwrap();
    assert!(got == a, "a's bytes");
    let got_b = reader.join().unwrap().expect("b, once a's reader is done");
    assert!(got_b == b, "b's bytes");
    drop(fa);
    assert_eq!(m.stat_u64("errors"), 0, "{}", m.stats());
    assert_eq!(m.stat_u64("decompressions"), 2, "{}", m.stats());
    m.unmount_ok();
}

/// An open kept after a peek at a spilled tensor, not read since, lets go
/// of its spill when another tensor's spill needs the room; read again
/// later, its tensor is spilled again, with the right bytes.
#[test]
fn an_idle_open_lets_go_of_its_spill_for_another() {
    let _s = support::serial();
    let Some((m, a, b)) = mount_two_spilling_tensors() else {
        return;
    };
    let (mut fa, mut got) = first_mib(&m, "a");
    assert!(m.read("b") == b, "b's bytes");
    assert!(m.stat_u64("spill_room_waits") >= 1, "{}", m.stats());
    fa.read_to_end(&mut got).unwrap();
    assert!(got == a, "a's bytes");
    drop(fa);
    assert_eq!(m.stat_u64("errors"), 0, "{}", m.stats());
    assert_eq!(m.stat_u64("decompressions"), 3, "{}", m.stats());
    m.unmount_ok();
}

/// An open of `name` in `m` and its first MiB, read through it.
fn first_mib(m: &Mount, name: &str) -> (std::fs::File, Vec<u8>) {
    let mut f = std::fs::File::open(m.path(name)).unwrap();
    let mut got = vec![0u8; 1 << 20];
    f.read_exact(&mut got).unwrap();
    (f, got)
}

/// A mount of two float32 tensors `a` and `b` of 12 MiB, each one zstd
/// frame over half of `--cache-size 16M` (spilled), under a
/// `--decoded-cache-size` that holds one spill, not two: the mount and the
/// two tensors' bytes.
fn mount_two_spilling_tensors() -> Option<(Mount, Vec<u8>, Vec<u8>)> {
    let opts = ["--cache-size", "16M", "--decoded-cache-size", "20M"];
    let (m, mut t) = mount_one_frame_tensors(&[("a", 41, 12 << 20), ("b", 42, 12 << 20)], &opts)?;
    let b = t.pop()?;
    Some((m, t.pop()?, b))
}

/// A mount, with a cache dir of its own and `opts`, of float32 tensors
/// (name, seed, bytes) each in one zstd frame: the mount and their bytes.
fn mount_one_frame_tensors(
    tensors: &[(&str, u64, usize)],
    opts: &[&str],
) -> Option<(Mount, Vec<Vec<u8>>)> {
    let mut m = Mount::scratch()?;
    let src = m.scratch_path("frames.zt");
    let mut w = Writer::create(&src).unwrap();
    let one_frame = support::one_frame_options(3);
    let mut out = Vec::new();
    for &(name, seed, len) in tensors {
        let v = support::compressible(seed, len);
        w.add(name, DType::Float32, &[len as u64 / 4], &v, &one_frame)
            .unwrap();
        out.push(v);
    }
    w.finish().unwrap();
    let cache = m.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    let dir = cache.to_str().unwrap();
    m.mount(&src, &[opts, &["--cache-dir", dir]].concat());
    Some((m, out))
}

#[test]
fn opens_while_a_backing_file_fills_get_the_same_bytes() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let tensors = write_zstd(&src, &["z"], 6 << 20);
    m.mount(&src, &["--cache-size", "8M"]);
    let want = &tensors[0].1;
    let path = m.path("z");
    let mut passes = 0;
    // Keep opening while the first fill runs (and after): every open, the
    // daemon's or the kernel's, reads the same bytes.
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut n = 0;
                    for _ in 0..3 {
                        let mut got = Vec::new();
                        std::fs::File::open(&path)
                            .unwrap()
                            .read_to_end(&mut got)
                            .unwrap();
                        assert!(got == *want, "an open read other bytes");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        passes = readers.into_iter().map(|r| r.join().unwrap()).sum::<i32>();
    });
    assert_eq!(passes, 12);
    m.settled();
    assert_eq!(m.read("z"), *want);
    assert_eq!(
        m.stat_u64("backing_files"),
        1,
        "one fill for all: {}",
        m.stats()
    );
    m.unmount_ok();
}

#[test]
fn a_small_limit_evicts_only_backing_files_no_open_holds() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    // Two 4 MiB tensors; room for one.
    let tensors = write_zstd(&src, &["a", "b"], 1 << 20);
    m.mount(&src, &["--decoded-cache-size", "6M"]);
    let (a, b) = (&tensors[0].1, &tensors[1].1);
    assert_eq!(&m.read("a"), a);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 1);
    // Held open (by the kernel, from its backing file) while b wants room.
    let mut held = std::fs::File::open(m.path("a")).unwrap();
    assert_eq!(&m.read("b"), b);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 1, "b was filled over a held a");
    assert_eq!(m.stat_u64("backing_evictions"), 0);
    let mut got = Vec::new();
    held.read_to_end(&mut got).unwrap();
    assert_eq!(&got, a);
    drop(held);
    // Now a can go: b's next open fills b in its place.
    assert!(
        wait_until(Duration::from_secs(10), || {
            assert_eq!(&m.read("b"), b);
            m.settled();
            m.stat_u64("backing_files") == 2
        }),
        "{}\n{}",
        m.stats(),
        m.log_text()
    );
    assert_eq!(m.stat_u64("backing_evictions"), 1);
    assert!(m.stat_u64("backing_bytes_now") <= 6 << 20);
    assert_eq!(&m.read("a"), a);
    assert_eq!(&m.read("b"), b);
    m.unmount_ok();
}

#[test]
fn kill_9_leaves_nothing_in_the_cache_dir() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let tensors = write_zstd(&src, &["a", "b"], 1 << 20);
    let cache = m.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    m.mount(&src, &["--cache-dir", cache.to_str().unwrap()]);
    assert_eq!(m.read("a"), tensors[0].1);
    assert_eq!(npy_data(&m.read(".npy/b.npy")), &tensors[1].1[..]);
    m.settled();
    assert!(m.stat_u64("backing_files") >= 2);
    assert_killed_leaving_nothing(m, &cache);
}

/// A backing file a passed-through open holds at `kill -9` is kept by the
/// kernel with the dead mount (its id stays registered there), not by any
/// process: nothing is left to list, and its disk comes back when the dead
/// mount is unmounted (docs/serving.md, "Filling").
#[test]
fn kill_9_with_a_passed_through_open_held_frees_its_disk_at_unmount() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let tensors = write_zstd(&src, &["a"], 1 << 20);
    let cache = m.scratch_path("cache");
    let Some(tmpfs) = support::Tmpfs::cache_dir(&cache, "64m") else {
        return;
    };
    let empty = used_bytes(&cache);
    m.mount(&src, &["--cache-dir", cache.to_str().unwrap()]);
    assert_eq!(m.read("a"), tensors[0].1);
    m.settled();
    let before = m.stat_u64("passthrough_opens");
    let held = std::fs::File::open(m.path("a")).unwrap();
    assert_eq!(m.stat_u64("passthrough_opens"), before + 1);
    assert!(used_bytes(&cache) >= empty + (4 << 20));
    let pid = m.pid.expect("daemon pid");
    support::signal(pid, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(5), || !support::alive(pid)));
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
    drop(held);
    m.cleanup();
    assert!(
        wait_until(Duration::from_secs(5), || used_bytes(&cache) <= empty),
        "{} bytes still used in --cache-dir after the unmount, {empty} before the mount",
        used_bytes(&cache)
    );
    drop(tmpfs);
}

/// Bytes in use on the filesystem holding `dir`.
fn used_bytes(dir: &Path) -> u64 {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: all zeros is a valid statvfs, which the call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C path and a valid statvfs to write.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

/// Kills `m`'s daemon with SIGKILL: its files under `cache` (unlinked)
/// go with it.
fn assert_killed_leaving_nothing(mut m: Mount, cache: &Path) {
    let pid = m.pid.expect("daemon pid");
    support::signal(pid, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(5), || !support::alive(pid)));
    assert_eq!(
        std::fs::read_dir(cache).unwrap().count(),
        0,
        "files left in the cache dir"
    );
    m.cleanup();
}

/// Rewrites byte `at` of `path` in place and sets its mtime back.
fn rewrite_keeping_mtime(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let before = std::fs::metadata(path).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut b = [0u8];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    f.write_all_at(&[b[0] ^ 0xff], at).unwrap();
    f.sync_all().unwrap();
    let t = filetime(before.mtime(), before.mtime_nsec());
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C path and two valid timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), 0) };
    assert_eq!(r, 0);
    assert_eq!(std::fs::metadata(path).unwrap().mtime(), before.mtime());
}

fn filetime(s: i64, ns: i64) -> [libc::timespec; 2] {
    let t = libc::timespec {
        tv_sec: s,
        tv_nsec: ns,
    };
    [t, t]
}

#[test]
fn a_source_rewritten_in_place_is_not_passed_through_again() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("model.safetensors");
    let bytes = write_safetensors(&src, &[("w", values(4, 100_000))]);
    m.mount(&src, &[]);
    let view = ".safetensors/model.safetensors";
    assert_eq!(m.read(view), bytes);
    // A write, its mtime put back: the ctime still moved.
    rewrite_keeping_mtime(&src, bytes.len() as u64 - 100);
    let e = std::fs::File::open(m.path(view)).map(|_| ()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    let e = std::fs::read(m.path("w")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert!(
        m.log_text().contains("file was modified since mount"),
        "{}",
        m.log_text()
    );
    m.unmount_ok();
}

/// A decoded tensor's backing file holds checked bytes, yet once the
/// daemon has seen its source change, an open of it fails as every read
/// of that source does (its bytes may have come from a change the times
/// did not show); an open made before reads on.
#[test]
fn a_decoded_backing_file_is_not_opened_once_its_source_is_seen_changed() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let tensors = write_zstd(&src, &["z"], 3 << 20);
    m.mount(&src, &[]);
    let want = &tensors[0].1;
    assert_eq!(&m.read("z"), want);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 1, "{}", m.stats());
    let held = std::fs::File::open(m.path("z")).unwrap();
    let opens = m.stat_u64("passthrough_opens");
    assert_eq!(opens, 1, "{}", m.stats());
    // The last byte of the file (its index), its mtime put back.
    rewrite_keeping_mtime(&src, std::fs::metadata(&src).unwrap().len() - 1);
    let e = std::fs::read(m.path("raw")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    let e = std::fs::File::open(m.path("z")).map(|_| ()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert_eq!(m.stat_u64("passthrough_opens"), opens);
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; want.len()];
    held.read_exact_at(&mut b, 0).unwrap();
    assert!(&b == want, "the open made before");
    drop(held);
    m.unmount_ok();
}

fn open_to_all(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `/dev/fuse` readable and writable by every user (as udev makes it on
/// Debian) for one test, its mode put back after, even when it fails.
struct DevFuseOpen(u32);

impl DevFuseOpen {
    fn new() -> DevFuseOpen {
        let mode = std::fs::metadata("/dev/fuse").unwrap().mode() & 0o7777;
        open_to_all(Path::new("/dev/fuse"), 0o666);
        DevFuseOpen(mode)
    }
}

impl Drop for DevFuseOpen {
    fn drop(&mut self) {
        open_to_all(Path::new("/dev/fuse"), self.0);
    }
}

#[test]
fn without_cap_sys_admin_every_file_is_served_by_the_daemon() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let _dev = DevFuseOpen::new();
    let root: PathBuf = m.dir.path().canonicalize().unwrap();
    let src = m.scratch_path("model.safetensors");
    let bytes = write_safetensors(&src, &[("w", values(5, 10_000))]);
    open_to_all(&root, 0o755);
    open_to_all(&src, 0o644);
    let nobody = 65534;
    std::os::unix::fs::chown(&m.mp, Some(nobody), Some(nobody)).unwrap();
    let log = root.join("nobody.log");
    std::fs::write(&log, b"").unwrap();
    std::os::unix::fs::chown(&log, Some(nobody), Some(nobody)).unwrap();
    let as_nobody = |args: &[&std::ffi::OsStr]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args);
        c
    };
    let mount = || {
        run_with_timeout(
            &mut as_nobody(&[
                support::bin().as_ref(),
                src.as_os_str(),
                m.mp.as_os_str(),
                "--log-file".as_ref(),
                log.as_os_str(),
            ]),
            Duration::from_secs(20),
        )
    };
    // Closed to other users (no udev): refused, saying what to change.
    open_to_all(Path::new("/dev/fuse"), 0o600);
    let r = mount();
    assert_eq!(
        r.stderr.trim_end(),
        format!(
            "ztensor-mount: cannot mount {} on {}: Permission denied (os error 13) (/dev/fuse \
             is mode 0600 here, closed to this user: make it 0666 as udev does (chmod 0666 \
             /dev/fuse), or mount as root)",
            src.display(),
            m.mp.display()
        ),
        "{r:?}"
    );
    open_to_all(Path::new("/dev/fuse"), 0o666);
    let r = mount();
    assert!(r.ok(), "mount as nobody: {r:?}");
    m.pid = support::daemon_pids(&m.mp).into_iter().max();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("every file is served through FUSE: passthrough needs CAP_SYS_ADMIN"),
        "{text}"
    );
    let view = m.mp.join(".safetensors/model.safetensors");
    let out = as_nobody(&["cat".as_ref(), view.as_os_str()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, bytes);
    let stats = as_nobody(&["cat".as_ref(), m.mp.join(".ztensor/stats").as_os_str()])
        .output()
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["passthrough"], false);
    assert_eq!(stats["passthrough_opens"], 0);
    m.unmount_ok();
}

/// An XFS filesystem (reflink on) in a file, loop-mounted for one test and
/// taken down after it, even when it fails.
struct Xfs {
    dir: PathBuf,
}

impl Xfs {
    fn new(under: &Path) -> Option<Xfs> {
        let made = (|| -> Result<Xfs, String> {
            let img = under.join("xfs.img");
            let dir = under.join("xfs");
            std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
            std::fs::File::create(&img)
                .and_then(|f| f.set_len(320 << 20))
                .map_err(|e| e.to_string())?;
            let run = |c: &mut Command| {
                let r = run_with_timeout(c, Duration::from_secs(60));
                if r.ok() {
                    Ok(())
                } else {
                    Err(format!("{r:?}"))
                }
            };
            run(Command::new("mkfs.xfs")
                .args(["-q", "-m", "reflink=1"])
                .arg(&img))?;
            run(Command::new("mount")
                .args(["-o", "loop"])
                .arg(&img)
                .arg(&dir))?;
            Ok(Xfs { dir })
        })();
        match made {
            Ok(x) => Some(x),
            Err(why) => {
                support::require("a loop-mounted XFS (xfsprogs, loop devices)", Err(why));
                None
            }
        }
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A thread spinning on each core while it lives: no core is free.
struct BusyCores(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl BusyCores {
    fn new() -> BusyCores {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for _ in 0..cores {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        BusyCores(stop)
    }
}

impl Drop for BusyCores {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A filesystem frozen (`fsfreeze`) while it lives: every write to it
/// waits, as on a disk that does not answer. Thawed when dropped, even
/// when the test fails.
struct Frozen<'a>(&'a Path);

impl<'a> Frozen<'a> {
    fn new(dir: &'a Path) -> Frozen<'a> {
        let r = run_with_timeout(
            Command::new("fsfreeze").arg("-f").arg(dir),
            Duration::from_secs(30),
        );
        assert!(r.ok(), "fsfreeze -f {}: {r:?}", dir.display());
        Frozen(dir)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("-u").arg(self.0).status();
    }
}

/// A safetensors file whose data starts on a 4 KiB block and whose
/// tensors are whole blocks: each raw tensor's range can be cloned.
fn write_aligned_safetensors(path: &Path, tensors: &[(&str, Vec<f32>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut at = 0;
    for (i, (name, v)) in tensors.iter().enumerate() {
        assert!(
            i + 1 == tensors.len() || v.len() * 4 % 4096 == 0,
            "{name} ends off a block"
        );
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": [v.len()], "data_offsets": [at, at + v.len() * 4]}),
        );
        at += v.len() * 4;
    }
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize(4096 - 8, b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    for (_, v) in tensors {
        out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    std::fs::write(path, &out).unwrap();
    out
}

/// Mounts an aligned safetensors file of `tensors` on a new loop-mounted
/// XFS, with `--cache-dir` on it: (the XFS, the file, the cache dir).
fn mount_on_xfs(m: &mut Mount, tensors: &[(&str, Vec<f32>)]) -> Option<(Xfs, PathBuf, PathBuf)> {
    let xfs = Xfs::new(m.dir.path())?;
    let src = xfs.dir.join("aligned.safetensors");
    write_aligned_safetensors(&src, tensors);
    let cache = xfs.dir.join("cache");
    std::fs::create_dir(&cache).unwrap();
    m.mount(&src, &["--cache-dir", cache.to_str().unwrap()]);
    Some((xfs, src, cache))
}

/// Readers waiting on a decode that stalls (its `--cache-dir` frozen
/// while a one-frame tensor is decoded into a file there) wait off the
/// FUSE workers: with more of them than workers, the stats, a listing and
/// a sidecar are answered meanwhile; thawed, each reader gets the right
/// bytes.
#[test]
fn readers_waiting_on_a_stalled_decode_hold_no_worker() {
    let _s = support::serial();
    // Its decode takes long enough (a tenth of a second or more) to be
    // caught by a freeze made once its first MiB is there; a decode that
    // ends first is tried again on a new mount.
    let Some(mut st) = Stall::new(160 << 20) else {
        return;
    };
    for _ in 0..4 {
        // A cache that takes it whole: decoded into a file under the cache
        // dir, not spilled.
        st.mount("1G", &[]);
        let caught = st.readers_wait(Freeze::AfterFirstMib);
        st.m.unmount_ok();
        if caught {
            return;
        }
        eprintln!("the decode ended before the freeze; again on a new mount");
    }
    panic!("the decode ended before the freeze four times");
}

/// The same for a tensor too big for the cache, whose spill file is
/// being made on a `--cache-dir` frozen before any read: the first reader
/// waits for that disk on its worker, the others off the workers.
#[test]
fn readers_waiting_on_a_spill_made_on_a_frozen_disk_hold_no_worker() {
    let _s = support::serial();
    let Some(mut st) = Stall::new(48 << 20) else {
        return;
    };
    st.mount("64M", &["--decoded-cache-size", "200M"]);
    assert!(st.readers_wait(Freeze::First));
    assert_eq!(st.m.stat_u64("spilled_tensors"), 1, "{}", st.m.stats());
    st.m.unmount_ok();
}

/// A scratch mount, a loop-mounted XFS for its cache dir, and a one-frame
/// tensor `z` of `len` bytes to mount: what the stall tests share.
struct Stall {
    m: Mount,
    xfs: Xfs,
    src: PathBuf,
    want: Arc<Vec<u8>>,
    /// The cache dir, on the XFS.
    cache: String,
}

impl Stall {
    /// Mounts `z` with its cache dir on the XFS, two FUSE workers,
    /// `--cache-size cache_size` and `more`.
    fn mount(&mut self, cache_size: &str, more: &[&str]) {
        let args = ["--cache-dir", &self.cache, "--threads", "2"];
        let size = ["--cache-size", cache_size];
        self.m
            .mount(&self.src, &[&args[..], &size[..], more].concat());
    }

    /// [`readers_wait_on_a_frozen_decode`] on this mount.
    fn readers_wait(&self, when: Freeze) -> bool {
        readers_wait_on_a_frozen_decode(&self.m, &self.xfs.dir, &self.want, when)
    }

    fn new(len: usize) -> Option<Stall> {
        let m = Mount::scratch()?;
        let xfs = Xfs::new(m.dir.path())?;
        let src = m.scratch_path("z.zt");
        let want = Arc::new(write_one_frame_of(&src, len));
        let cache = xfs.dir.join("cache");
        std::fs::create_dir(&cache).unwrap();
        let cache = cache.to_str().unwrap().to_string();
        Some(Stall {
            m,
            xfs,
            src,
            want,
            cache,
        })
    }
}

/// When [`readers_wait_on_a_frozen_decode`] freezes the cache dir.
#[derive(PartialEq)]
enum Freeze {
    /// Once the first MiB of `z` is read: four readers wait.
    AfterFirstMib,
    /// Before any read: the first reader waits on its worker, three off.
    First,
}

/// Freezes `frozen` (after reading the first MiB of `z`, or first), starts
/// four readers of all of `z` (twice the mount's workers) and, once they
/// wait, asks the mount for its stats, its root and a sidecar. False when
/// the decode had ended before the freeze.
fn readers_wait_on_a_frozen_decode(
    m: &Mount,
    frozen: &Path,
    want: &Arc<Vec<u8>>,
    when: Freeze,
) -> bool {
    let path = m.path("z");
    let mut first = std::fs::File::open(&path).unwrap();
    if when == Freeze::AfterFirstMib {
        let mut head = vec![0u8; 1 << 20];
        first.read_exact(&mut head).unwrap();
        assert!(head == want[..head.len()]);
    }
    let ice = Frozen::new(frozen);
    let waiting_readers = if when == Freeze::First { 3 } else { 4 };
    let (tx, rx) = std::sync::mpsc::channel();
    for k in 0..4 {
        let (tx, path, want) = (tx.clone(), path.clone(), want.clone());
        std::thread::spawn(move || {
            let got = std::fs::read(&path).map(|got| got == *want);
            let _ = tx.send((k, got));
        });
    }
    // Each question is asked on a thread of its own, so that a mount that
    // does not answer fails the test instead of hanging it.
    let answered = |what: &'static str, ask: Box<dyn FnOnce() -> bool + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(ask());
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(ok) => ok,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("{what}: no answer while readers wait on the stalled decode")
            }
            Err(e) => panic!("{what}: the question failed (its panic is above): {e}"),
        }
    };
    let stats = m.path(".ztensor/stats");
    let waiting = move || {
        let text = std::fs::read(&stats).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        v["reads_waiting"].as_u64().unwrap()
    };
    let four_wait = answered(
        "the stats",
        Box::new(move || {
            support::wait_until(Duration::from_secs(5), || waiting() >= waiting_readers)
        }),
    );
    if !four_wait {
        // The decode ended before the freeze: the readers are done.
        drop(ice);
        for _ in 0..4 {
            let (k, got) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
            assert!(got.unwrap(), "reader {k}: wrong bytes");
        }
        return false;
    }
    let root = m.path("");
    assert!(answered(
        "the root",
        Box::new(move || std::fs::read_dir(&root).unwrap().count() > 0),
    ));
    let sidecar = m.path("z.json");
    assert!(answered(
        "the sidecar",
        Box::new(move || std::fs::read(&sidecar).is_ok_and(|t| !t.is_empty())),
    ));
    assert!(rx.try_recv().is_err(), "a reader ended while frozen");
    drop(ice);
    for _ in 0..4 {
        let (k, got) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a reader still waits after the thaw");
        assert!(got.unwrap(), "reader {k}: wrong bytes");
    }
    drop(first);
    true
}

/// Mounts `src` with four FUSE workers and `--cache-dir` on `xfs`.
fn mount_four_workers_caching_on(m: &mut Mount, src: &Path, xfs: &Xfs) {
    let cache = xfs.dir.join("cache");
    std::fs::create_dir(&cache).unwrap();
    m.mount(
        src,
        &["--cache-dir", cache.to_str().unwrap(), "--threads", "4"],
    );
}

/// A `--cache-dir` that does not answer (frozen for a snapshot, a hung
/// disk) holds no FUSE worker: the first opens of decoded tensors, which
/// make their backing files there, give up on them after a short wait and
/// are served, and the rest of the mount answers meanwhile.
#[test]
fn a_cache_dir_that_does_not_answer_holds_no_worker() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let names: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let tensors = write_zstd(&src, &refs, 1 << 20);
    let Some(xfs) = Xfs::new(m.dir.path()) else {
        return;
    };
    mount_four_workers_caching_on(&mut m, &src, &xfs);
    let frozen = Frozen::new(&xfs.dir);
    // More readers than workers, each opening a tensor the daemon would
    // make a backing file for.
    let (tx, rx) = std::sync::mpsc::channel();
    for (name, want) in tensors.iter().take(6).cloned() {
        let (tx, path) = (tx.clone(), m.path(&name));
        std::thread::spawn(move || {
            let _ = tx.send((std::fs::read(path).map(|got| got == want), name));
        });
    }
    for _ in 0..6 {
        let (same, name) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a reader still waits on the frozen cache directory");
        assert!(same.unwrap(), "{name}: wrong bytes");
    }
    assert_eq!(m.stat_u64("backing_files"), 0, "{}", m.stats());
    assert!(
        m.log_text().contains("did not make a backing file within"),
        "{}",
        m.log_text()
    );
    drop(frozen);
    // Thawed: the next reads make their files again, and the kernel reads
    // them.
    assert!(m.read("t0") == tensors[0].1);
    m.settled();
    assert!(m.read("t0") == tensors[0].1);
    assert!(m.stat_u64("passthrough_opens") >= 1, "{}", m.stats());
    m.unmount_ok();
}

/// The same for a tensor of one frame over 8 MiB, which is decoded into a
/// file under `--cache-dir` where it can: frozen, it is decoded into
/// memory, and neither its readers nor anyone else wait on the disk.
#[test]
fn a_cache_dir_that_does_not_answer_holds_no_reader_of_a_large_frame() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let want = write_one_frame(&src);
    let Some(xfs) = Xfs::new(m.dir.path()) else {
        return;
    };
    mount_four_workers_caching_on(&mut m, &src, &xfs);
    let frozen = Frozen::new(&xfs.dir);
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..6 {
        let (tx, path) = (tx.clone(), m.path("z"));
        std::thread::spawn(move || {
            let _ = tx.send(std::fs::read(path));
        });
    }
    for _ in 0..6 {
        let got = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a reader still waits on the frozen cache directory");
        assert!(got.unwrap() == want, "wrong bytes");
    }
    assert!(m.stat_u64("bytes_served") >= want.len() as u64);
    assert!(
        m.log_text().contains("did not make a file within"),
        "{}",
        m.log_text()
    );
    drop(frozen);
    m.unmount_ok();
}

/// A clone shares the source's disk blocks, not its page cache: the first
/// reads are the daemon's, from the source; the clone made at their close
/// backs every later open, once its pages are read in. So does a file of
/// the `.npy` header and a clone, for a tensor whose header fills a page.
#[test]
fn raw_tensors_on_blocks_are_backed_by_clones_where_the_cache_dir_shares_blocks() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    // `c` ends inside a block: the clone's last block is a copy.
    let (a, b, c) = (
        values(6, 1 << 20),
        values(7, 3 << 10),
        values(9, (1 << 18) + 3),
    );
    let tensors = [("a", a.clone()), ("b", b.clone()), ("c", c.clone())];
    let Some((xfs, src, cache)) = mount_on_xfs(&mut m, &tensors) else {
        return;
    };
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let read_all = |m: &Mount| {
        assert_eq!(m.read("a"), bytes(&a));
        assert_eq!(m.read(".zarr/b/c/0"), bytes(&b));
        assert_eq!(m.read("b"), bytes(&b));
        assert_eq!(m.read("c"), bytes(&c));
        for (name, v) in [("a", &a), ("c", &c)] {
            let npy = m.read(&format!(".npy/{name}.npy"));
            assert_eq!(
                npy.len(),
                4096 + v.len() * 4,
                "{name}: a header of one page"
            );
            assert_eq!(npy_data(&npy), bytes(v), "{name}.npy");
        }
    };
    let served = m.stat_u64("bytes_served");
    read_all(&m);
    assert!(
        m.stat_u64("bytes_served") >= served + (10 << 20) + (12 << 10),
        "the first reads are the daemon's: {}",
        m.stats()
    );
    m.settled();
    assert_eq!(m.stat_u64("backing_clones"), 5, "{}", m.stats());
    let (served, passed) = (m.stat_u64("bytes_served"), m.stat_u64("passthrough_opens"));
    read_all(&m);
    assert_eq!(m.stat_u64("bytes_served"), served, "{}", m.stats());
    assert_eq!(m.stat_u64("passthrough_opens"), passed + 6);
    assert_mapped_eq(&m.mp.join(".npy/c.npy"), &m.read(".npy/c.npy"));
    // A small tensor's view (its header ends inside a block) stays the
    // daemon's, read after read.
    for _ in 0..2 {
        let served = m.stat_u64("bytes_served");
        let npy = m.read(".npy/b.npy");
        assert_eq!(
            (npy.len(), npy_data(&npy)),
            (128 + (12 << 10), &bytes(&b)[..])
        );
        // (`bytes_served` counts tensors' bytes, not headers.)
        assert_eq!(m.stat_u64("bytes_served"), served + (12 << 10));
        m.settled();
    }
    assert_eq!(m.stat_u64("backing_clones"), 5, "{}", m.stats());
    assert_eq!(m.stat_u64("backing_bytes_now"), 0, "clones take no room");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
    // The source rewritten in place: the clones keep the old bytes, and
    // no open is handed them any more.
    let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xff], 4096).unwrap();
    drop(f);
    for name in ["a", "b", ".npy/a.npy", ".npy/c.npy"] {
        let e = std::fs::read(m.mp.join(name)).expect_err(name);
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{name}: {e}");
    }
    m.unmount_ok();
    drop(xfs);
}

/// A cache directory missing when the first clone is tried (removed for a
/// while) does not turn clones off for the mount: a read once it is back
/// makes one.
#[test]
fn a_cache_dir_missing_for_a_while_only_delays_clones() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let a = values(6, 1 << 18);
    let Some((xfs, _, cache)) = mount_on_xfs(&mut m, &[("a", a.clone())]) else {
        return;
    };
    std::fs::remove_dir(&cache).unwrap();
    let want: Vec<u8> = a.iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(m.read("a"), want);
    m.settled();
    assert_eq!(m.stat_u64("backing_clones"), 0, "{}", m.stats());
    assert!(
        m.log_text().contains("no block size for"),
        "{}",
        m.log_text()
    );
    std::fs::create_dir(&cache).unwrap();
    assert_eq!(m.read("a"), want);
    m.settled();
    assert_eq!(m.stat_u64("backing_clones"), 1, "{}", m.stats());
    let passed = m.stat_u64("passthrough_opens");
    assert_eq!(m.read("a"), want);
    assert_eq!(m.stat_u64("passthrough_opens"), passed + 1);
    m.unmount_ok();
    drop(xfs);
}

#[test]
fn raw_tensors_off_blocks_or_on_ext4_stay_the_daemons() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("model.safetensors");
    let bytes = write_safetensors(&src, &[("w", values(8, 1 << 16))]);
    m.mount(&src, &[]);
    let served = m.stat_u64("bytes_served");
    assert_eq!(m.read("w"), bytes[bytes.len() - (1 << 18)..]);
    assert!(m.stat_u64("bytes_served") >= served + (1 << 18));
    assert_eq!(m.stat_u64("backing_clones"), 0);
    m.unmount_ok();
}

/// Every regular file under `root` but `.ztensor/`, relative, sorted.
fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(root.join(&d)).unwrap() {
            let e = e.unwrap();
            let rel = d.join(e.file_name());
            if rel == Path::new(".ztensor") {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                dirs.push(rel);
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_formats_fixtures_read_the_same_with_passthrough_on_and_off() {
    let _s = support::serial();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = [
        "examples/model.zt",
        "tests/fixtures/pt/dtypes.pt",
        "tests/fixtures/pt/strided.pt",
        "tests/fixtures/pt/shared.pt",
        "tests/fixtures/pt/module.pt",
        "fuzz/seeds/formats/deflated.npz",
        "fuzz/seeds/formats/stored.npz",
        "fuzz/seeds/formats/h5py_default.h5",
        "fuzz/seeds/formats/h5py_latest.h5",
        "fuzz/seeds/formats/h5py_resizable.h5",
        "fuzz/seeds/formats/model.onnx",
        "fuzz/seeds/formats/plain.safetensors",
        "fuzz/seeds/formats/small.gguf",
        "fuzz/seeds/deathtensors/plain.deathtensors",
        "fuzz/seeds/deathtensors/zstd_sum.deathtensors",
        "tests/zt_v2/corpus/valid/canonical-basic.zt",
        "tests/zt_v2/corpus/valid/csr-data-valid.zt",
        "tests/zt_v2/corpus/valid/verify-ok.zt",
    ];
    let mut backed_somewhere = 0;
    for fixture in fixtures {
        let Some(mut on) = Mount::scratch() else {
            return;
        };
        let Some(mut off) = Mount::scratch() else {
            return;
        };
        let src = root.join(fixture);
        on.mount(&src, &[]);
        off.mount(&src, &["--no-passthrough"]);
        let files = files_under(&off.mp);
        assert_eq!(files, files_under(&on.mp), "{fixture}: the trees differ");
        for pass in 0..2 {
            for f in &files {
                let want = std::fs::read(off.mp.join(f));
                let got = std::fs::read(on.mp.join(f));
                match (want, got) {
                    (Ok(w), Ok(g)) => {
                        assert!(w == g, "{fixture}: {} differs (pass {pass})", f.display())
                    }
                    (Err(w), Err(g)) => assert_eq!(
                        w.raw_os_error(),
                        g.raw_os_error(),
                        "{fixture}: {}",
                        f.display()
                    ),
                    (w, g) => panic!(
                        "{fixture}: {}: {w:?} without passthrough, {g:?} with",
                        f.display()
                    ),
                }
            }
            on.settled();
        }
        backed_somewhere += (on.stat_u64("passthrough_opens") > 0) as usize;
        assert_eq!(off.stat_u64("passthrough_opens"), 0);
        on.unmount_ok();
        off.unmount_ok();
    }
    assert!(
        backed_somewhere >= 8,
        "only {backed_somewhere} fixtures had a backed file"
    );
}

#[test]
fn a_peek_at_a_decoded_tensor_fills_nothing() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let tensors = write_zstd(&src, &["z"], 2 << 20);
    m.mount(&src, &[]);
    let mut head = vec![0u8; 4096];
    std::fs::File::open(m.path("z"))
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert_eq!(head, tensors[0].1[..4096]);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 0, "{}", m.stats());
    // Read whole, it is filled.
    assert_eq!(m.read("z"), tensors[0].1);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 1, "{}", m.stats());
    m.unmount_ok();
}

#[test]
fn a_first_read_with_cpu_to_spare_is_written_behind_and_decodes_each_frame_once() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    // 24 frames of 1 MiB under an 8 MiB cache: a fill after the close
    // would find most of them evicted and decode them again.
    let tensors = write_zstd(&src, &["z"], 6 << 20);
    let want = &tensors[0].1;
    m.mount(&src, &["--cache-size", "8M"]);
    let frames = want.len() as u64 >> 20;
    // A reader that leaves the CPU free between its reads: every byte is
    // written behind it.
    let (got, held) = read_written_behind(&m, "z", want.len());
    assert!(got == *want, "first read");
    assert_eq!(m.stat_u64("decompressions"), frames, "{}", m.stats());
    // Frames behind the reader left the cache as they were written.
    assert!(m.stat_u64("cache_entries") <= 8, "{}", m.stats());
    // A second open while the first is held is the daemon's (no backing
    // file is handed out while a served open is left), and reads what the
    // first one wrote: no decode.
    assert!(m.read("z") == *want, "second read");
    assert_eq!(m.stat_u64("decompressions"), frames, "{}", m.stats());
    drop(held);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 1, "{}", m.stats());
    assert_eq!(
        m.stat_u64("decompressions"),
        frames,
        "the fill decoded again"
    );
    let served = m.stat_u64("bytes_served");
    assert!(m.read("z") == *want, "backed read");
    assert_eq!(m.stat_u64("bytes_served"), served, "{}", m.stats());
    m.unmount_ok();
}

#[test]
fn a_first_read_in_order_on_busy_cores_keeps_few_frames_and_the_fill_makes_the_rest() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    // 40 frames of 1 MiB in each, under the default cache, which holds
    // them all.
    let tensors = write_zstd(&src, &["a", "b", "c"], 10 << 20);
    let (a, b, c) = (&tensors[0].1, &tensors[1].1, &tensors[2].1);
    let frames = (a.len() >> 20) as u64;
    m.mount(&src, &[]);
    let busy = BusyCores::new();
    // In order, every core busy (nothing is written behind): the frames
    // more than 16 MiB behind the reader leave the cache as it goes.
    let mut f = std::fs::File::open(m.path("a")).unwrap();
    let mut got = vec![0u8; a.len()];
    for chunk in got.chunks_mut(1 << 20) {
        f.read_exact(chunk).unwrap();
    }
    assert!(got == *a, "first read");
    assert!(m.stat_u64("cache_bytes") <= 24 << 20, "{}", m.stats());
    // Back to front in 2 MiB reads (each two requests in order): no read
    // passes more than 2 MiB in order, so nothing is behind, and a second
    // pass decodes nothing.
    let g = std::fs::File::open(m.path("b")).unwrap();
    let back_to_front = || {
        let mut got = vec![0u8; b.len()];
        for (i, chunk) in got.chunks_mut(2 << 20).enumerate().rev() {
            g.read_exact_at(chunk, (i as u64) << 21).unwrap();
        }
        assert!(got == *b, "read back to front");
    };
    back_to_front();
    let decoded = m.stat_u64("decompressions");
    back_to_front();
    assert_eq!(m.stat_u64("decompressions"), decoded, "{}", m.stats());
    // Two readers 20 MiB apart, taking turns: neither reads in order, so
    // each frame is decoded once.
    let h = [
        std::fs::File::open(m.path("c")).unwrap(),
        std::fs::File::open(m.path("c")).unwrap(),
    ];
    let mut got = vec![0u8; c.len()];
    let (front, back) = got.split_at_mut(20 << 20);
    for (i, (x, y)) in front
        .chunks_mut(2 << 20)
        .zip(back.chunks_mut(2 << 20))
        .enumerate()
    {
        h[0].read_exact_at(x, (i as u64) << 21).unwrap();
        h[1].read_exact_at(y, (20 << 20) + ((i as u64) << 21))
            .unwrap();
    }
    assert!(got == *c, "two readers");
    assert_eq!(
        m.stat_u64("decompressions"),
        decoded + frames,
        "{}",
        m.stats()
    );
    drop(busy);
    drop((f, g, h));
    // The fill decodes what left the cache unwritten: the backing file is
    // whole, and the next read is the kernel's.
    m.settled();
    let served = m.stat_u64("bytes_served");
    assert!(m.read("a") == *a, "backed read");
    assert_eq!(m.stat_u64("bytes_served"), served, "{}", m.stats());
    m.unmount_ok();
}

#[test]
fn a_reader_coming_back_over_the_safetensors_view_reads_what_it_wrote() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    // One zstd tensor of 24 frames of 1 MiB under an 8 MiB cache: frames
    // written behind the reader leave the cache.
    let src = m.scratch_path("z.zt");
    let mut w = Writer::create(&src).unwrap();
    let zstd = Options {
        compression: Compression::zstd(),
        ..Options::default()
    };
    let le = support::compressible(1, 24 << 20);
    w.add("z", DType::Float32, &[6 << 20], &le, &zstd).unwrap();
    w.finish().unwrap();
    m.mount(&src, &["--cache-size", "8M"]);
    let view = ".safetensors/model.safetensors";
    let len = std::fs::metadata(m.path(view)).unwrap().len() as usize;
    // The first pass, one MiB at a time, each written behind before the
    // next (every byte: the header and the decoded tensor).
    let f = std::fs::File::open(m.path(view)).unwrap();
    let mut first = vec![0u8; len];
    let skipped = m.stat_u64("write_behind_skipped_bytes");
    let before = m.stat_u64("write_behind_bytes") + skipped;
    let mut at = 0;
    for chunk in first.chunks_mut(1 << 20) {
        f.read_exact_at(chunk, at as u64).unwrap();
        at += chunk.len();
        assert_eq!(
            m.written_behind(before + at as u64),
            skipped,
            "{}",
            m.stats()
        );
    }
    assert!(first.ends_with(&le), "first pass");
    // The same open comes back over it: what it wrote is read from the
    // backing file, not decoded again.
    let decoded = m.stat_u64("decompressions");
    let mut again = vec![0u8; len];
    for (i, chunk) in again.chunks_mut(1 << 20).enumerate() {
        f.read_exact_at(chunk, (i as u64) << 20).unwrap();
    }
    assert!(again == first, "second pass");
    assert_eq!(m.stat_u64("decompressions"), decoded, "{}", m.stats());
    drop(f);
    m.unmount_ok();
}

#[test]
fn backing_files_stay_within_the_descriptors_the_daemon_may_hold() {
    // 100 zstd tensors, each worth a backing file, read by a daemon
    // allowed 128 descriptors (soft and hard): at most half of what is
    // left past those open at mount and 64 more as backing files at once
    // (about 27), the least recently opened idle one giving way; every
    // byte right, and no read or backing file short of a descriptor.
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("many.zt");
    let names: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let tensors = write_zstd(&src, &names, 16 << 10);
    let r = m.run_under(&["prlimit", "--nofile=128:128"], &src, &[]);
    assert!(r.ok(), "{}{}", r.stderr, m.log_text());
    let pid = m.pid.unwrap();
    // Every core kept busy: the write-behind's writes wait in its queue,
    // which must hold no file (a descriptor) that gave way meanwhile.
    let _busy = BusyCores::new();
    // Each backing file published before the next read: the least
    // recently opened is then the least recently read (the filler may
    // otherwise publish them out of order on a busy machine).
    for (name, want) in &tensors[..100] {
        assert!(m.read(name) == *want, "{name}");
        m.settled();
    }
    // The last 20 read are backed still; the first ones gave way, and are
    // served (and backed anew) when read again.
    for (name, want) in tensors[80..100].iter().chain(&tensors[..20]) {
        assert!(m.read(name) == *want, "again: {name}");
    }
    m.settled();
    let st = m.stats();
    assert_eq!(st["passthrough_opens"], 20, "{st}");
    assert_eq!(st["backing_files"], 120, "{st}");
    assert!(st["backing_evictions"].as_u64().unwrap() >= 88, "{st}");
    let held = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(held <= 32 + 16, "{held} descriptors held: {st}");
    let log = m.log_text();
    assert!(!log.contains("Too many open files"), "{log}");
    assert!(
        log.contains("the open-file limit is 128, ") && log.contains("backing files at most"),
        "{log}"
    );
    m.unmount_ok();
}

/// Bytes of disk the daemon's files under `dir` take (unlinked ones
/// too), through its descriptors: each file once, however many
/// descriptors it has (a spill's file is also its backing file's).
fn disk_held_under(pid: i32, dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let files: std::collections::HashMap<(u64, u64), u64> =
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)))
            .filter_map(|e| std::fs::metadata(e.path()).ok())
            .map(|m| ((m.dev(), m.ino()), m.blocks() * 512))
            .collect();
    files.values().sum()
}

/// Spills (tensors decoded to disk, too big for the cache) and backing
/// files share `--decoded-cache-size`: tensors read one after another
/// keep at most that much of `--cache-dir`, each served whole and right;
/// one bigger than the bound fails with ENOSPC, saying so; a spill that
/// fails on its data gives its share back.
#[test]
fn spills_and_backing_files_stay_within_the_decoded_cache_size() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let mut w = Writer::create(&src).unwrap();
    let one_frame = support::one_frame_options(3);
    // `bad`, 8 MiB, damaged: its spill fails, and gives its share back.
    let bad = support::compressible(30, 8 << 20);
    w.add("bad", DType::Float32, &[2 << 20], &bad, &one_frame)
        .unwrap();
    let mut tensors = Vec::new();
    for i in 0..8u64 {
        let want = support::compressible(i + 1, 4 << 20);
        let name = format!("t{i}");
        w.add(&name, DType::Float32, &[1 << 20], &want, &one_frame)
            .unwrap();
        tensors.push((name, want));
    }
    let big = support::compressible(20, 12 << 20);
    w.add("big", DType::Float32, &[3 << 20], &big, &one_frame)
        .unwrap();
    w.finish().unwrap();
    support::data::garble_middle_block(&src, 0);
    let cache = m.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    let opts = [
        "--cache-size",
        "2M",
        "--decoded-cache-size",
        "10M",
        "--cache-dir",
    ];
    let mut args = opts.to_vec();
    args.push(cache.to_str().unwrap());
    m.mount(&src, &args);
    let pid = m.pid.expect("daemon pid");
    let e = std::fs::read(m.path("bad")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Given back by the spill's thread as it stops, which may be just
    // after the reader had its error.
    assert!(
        support::wait_until(Duration::from_secs(10), || m.stat_u64("spill_bytes_now")
            == 0),
        "{}",
        m.stats()
    );
    let mut peak = 0;
    for (name, want) in &tensors {
        assert!(m.read(name) == *want, "{name}");
        m.settled();
        peak = peak.max(disk_held_under(pid, &cache));
    }
    assert!(
        peak <= 10 << 20,
        "{peak} bytes of decoded files: {}",
        m.stats()
    );
    assert!(m.stat_u64("spill_evictions") >= 5, "{}", m.stats());
    // Read again: spilled anew, right.
    assert!(m.read("t0") == tensors[0].1);
    let e = std::fs::read(m.path("big")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let said = "12582912 decoded bytes do not fit in --decoded-cache-size (10485760 bytes";
    assert!(m.log_text().contains(said), "{}", m.log_text());
    m.unmount_ok();
}

#[test]
fn an_open_while_its_backing_file_is_filled_reads_what_the_first_read_wrote() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    // `big`: 128 MiB stored big-endian (turned around to be served: worth a
    // backing file, and no decode); `z`: 16 MiB of zstd in 1 MiB frames.
    let big = support::compressible(7, 128 << 20);
    let z = support::compressible(8, 16 << 20);
    let mut w = Writer::create(&src).unwrap();
    let be = Options {
        endian: ztensor_mount::formats::zt_v01::Endian::Big,
        ..Options::default()
    };
    w.add("big", DType::Float32, &[32 << 20], &big, &be)
        .unwrap();
    let zstd = Options {
        compression: Compression::zstd(),
        ..Options::default()
    };
    w.add("z", DType::Float32, &[4 << 20], &z, &zstd).unwrap();
    w.finish().unwrap();
    m.mount(&src, &["--cache-size", "8M"]);
    // Most of `big`, then closed: the filler turns the rest around, and
    // takes `z`'s file only after that.
    let mut f = std::fs::File::open(m.path("big")).unwrap();
    let mut head = vec![0u8; 80 << 20];
    f.read_exact(&mut head).unwrap();
    assert!(head[..] == big[..80 << 20]);
    drop(f);
    m.written_behind(80 << 20);
    // `z` whole, closed, and at once opened again while its backing file
    // waits for the filler: read from what the first read wrote (behind
    // it, the CPU free between its reads), not decoded again (its frames
    // left the cache behind the reader).
    let (first, f) = read_written_behind(&m, "z", z.len());
    drop(f);
    assert!(first == z, "first read");
    // Each of its 16 frames at least once: a busy machine may decode a
    // frame again, when the filler's units crowd it out of the 8 MiB
    // cache before the reader gets to it.
    let decoded = m.stat_u64("decompressions");
    assert!(decoded >= 16, "{}", m.stats());
    assert!(m.read("z") == z, "second read");
    assert_eq!(m.stat_u64("decompressions"), decoded, "{}", m.stats());
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 2, "{}", m.stats());
    assert!(m.read("big") == big);
    m.unmount_ok();
}

#[test]
fn bytes_written_through_are_not_served_once_the_source_changed() {
    let _s = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let src = m.scratch_path("z.zt");
    let tensors = write_zstd(&src, &["z"], 1 << 20);
    m.mount(&src, &[]);
    // Read whole through an open kept: its bytes are in its backing file.
    let f = std::fs::File::open(m.path("z")).unwrap();
    let mut got = vec![0u8; tensors[0].1.len()];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, 0).unwrap();
    assert!(got == tensors[0].1);
    rewrite_keeping_mtime(&src, 100);
    // Read again through the same open: the data layer's refusal, not the
    // written copy of the old bytes.
    let e = std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert!(
        m.log_text().contains("file was modified since mount"),
        "{}",
        m.log_text()
    );
    drop(f);
    m.unmount_ok();
}

/// A copy kept for speed yields to a spill a read needs, also while it is
/// still being filled after its file's close: a `.npy` view read whole
/// and closed takes the room of an idle spill, and the spill's tensor,
/// read again at once, is spilled again in the copy's place, with the
/// right bytes (it failed with `ENOSPC` while the copy was filling).
#[test]
fn a_copy_still_filling_yields_to_a_spill_a_read_needs() {
    let _s = support::serial();
    // `big` spills (over half of --cache-size); it and `mid`'s view's
    // copy do not fit in --decoded-cache-size together.
    let opts = ["--cache-size", "40M", "--decoded-cache-size", "70M"];
    let tensors = [("big", 51, 64 << 20), ("mid", 52, 12 << 20)];
    let Some((m, t)) = mount_one_frame_tensors(&tensors, &opts) else {
        return;
    };
    let (big, mid) = (&t[0], &t[1]);
    for _ in 0..3 {
        assert!(m.read("big") == *big, "big's bytes");
        assert!(npy_data(&m.read(".npy/mid.npy")) == &mid[..], "mid's bytes");
        assert!(m.read("big") == *big, "big's bytes, read at once");
    }
    assert_eq!(m.stat_u64("errors"), 0, "{}", m.stats());
    m.unmount_ok();
}
