//! Many readers at once through a real mount: every byte right while the
//! decode cache stays within its limit, one decode per frame for readers of
//! the same cold tensor, and tensors larger than the cache.

mod support;

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use serde_json::Value as Json;
use support::data::{compressed_block_near, garble_middle_block};
use support::{Mount, Rng, Tmpfs, compressible};
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{DType, Endian};
use ztensor_mount::serve::cache::ENTRY_COST;

const MIB: usize = 1 << 20;

#[derive(Clone)]
struct T {
    name: String,
    dtype: DType,
    /// Little-endian bytes the mount must serve.
    le: Vec<u8>,
    opts: Options,
}

fn zstd(frame_size: usize, endian: Endian) -> Options {
    Options {
        compression: Compression::Zstd {
            level: 1,
            frame_size,
        },
        endian,
        ..Options::default()
    }
}

fn write(path: &std::path::Path, ts: &[T]) {
    let mut w = Writer::create(path).unwrap();
    for t in ts {
        let n = t.le.len() as u64 / t.dtype.size();
        w.add(&t.name, t.dtype, &[n], &t.le, &t.opts).unwrap();
    }
    w.finish().unwrap();
}

/// `n` float32 tensors `t0`, `t1`... of `len` compressible bytes (seeds
/// from `seed` on), each stored as one zstd frame.
fn one_frame_tensors(n: u64, seed: u64, len: usize) -> Vec<T> {
    (0..n)
        .map(|i| T {
            name: format!("t{i}"),
            dtype: DType::Float32,
            le: compressible(seed + i, len),
            opts: zstd(0, Endian::Little),
        })
        .collect()
}

/// Reads each tensor of `ts` whole through `m`, `rounds` times over, each
/// against the bytes it must hold.
fn read_all_right(m: &Mount, ts: &[T], rounds: usize) {
    for round in 0..rounds {
        for t in ts {
            let got = std::fs::read(m.path(&t.name));
            assert!(
                got.as_ref().is_ok_and(|g| *g == t.le),
                "round {round}, {}: {:?}; log:\n{}",
                t.name,
                got.err(),
                m.log_text()
            );
        }
    }
}

/// Starts `readers` threads; reader `i` reads `rounds` random ranges of up
/// to `max_len` bytes of `files[i % files.len()]` (seeded with `seed + i`)
/// and checks each against the bytes that file must hold. Returns how many
/// readers failed (their panics are printed).
fn random_readers(
    files: &[(std::path::PathBuf, Arc<Vec<u8>>)],
    readers: u64,
    rounds: usize,
    max_len: u64,
    seed: u64,
) -> usize {
    let threads: Vec<_> = (0..readers)
        .map(|i| {
            let (path, le) = files[(i % files.len() as u64) as usize].clone();
            std::thread::spawn(move || {
                let f = std::fs::File::open(&path).unwrap();
                let mut rng = Rng(seed + i);
                for _ in 0..rounds {
                    let off = rng.below(le.len() as u64) as usize;
                    let len = 1 + rng.below(max_len) as usize;
                    let got = pread(&f, off as u64, len);
                    let hi = (off + len).min(le.len());
                    assert!(got == le[off..hi], "reader {i}: {len} at {off}");
                }
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join())
        .filter(Result::is_err)
        .count()
}

/// Reads `[off, off+len)` fully (short reads retried), as much as exists.
fn pread(f: &std::fs::File, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = f.read_at(&mut buf[got..], off + got as u64).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    buf
}

/// Polls `.ztensor/stats` until stopped; records every sample that shows
/// more decoded bytes alive than the limit.
struct Monitor {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<(u64, u64, Vec<Json>)>,
}

impl Monitor {
    fn start(stats: std::path::PathBuf) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let (mut samples, mut max_bytes) = (0u64, 0u64);
            let mut bad = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let v: Json = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
                let used = v["cache_bytes"].as_u64().unwrap();
                let limit = v["cache_limit"].as_u64().unwrap();
                let peak = v["cache_peak_bytes"].as_u64().unwrap();
                max_bytes = max_bytes.max(used);
                if used > limit || peak > limit {
                    bad.push(v);
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (samples, max_bytes, bad)
        });
        Monitor { stop, handle }
    }

    fn finish(self) -> (u64, u64, Vec<Json>) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

#[test]
fn sixteen_readers_with_a_cache_smaller_than_the_data() {
    // Six 3 MiB zstd tensors in 256 KiB frames (18 MiB decoded) behind a
    // 4 MiB cache, plus raw tensors; half the zstd ones stored big-endian.
    let mut ts = Vec::new();
    for k in 0..6u64 {
        let (dtype, endian) = if k % 2 == 0 {
            (DType::Uint8, Endian::Little)
        } else {
            (DType::Float32, Endian::Big)
        };
        ts.push(T {
            name: format!("z{k}"),
            dtype,
            le: compressible(k + 1, 3 * MIB),
            opts: zstd(256 << 10, endian),
        });
    }
    for k in 0..2u64 {
        ts.push(T {
            name: format!("raw{k}"),
            dtype: DType::Int16,
            le: compressible(100 + k, MIB),
            opts: Options {
                endian: if k == 0 { Endian::Little } else { Endian::Big },
                ..Options::default()
            },
        });
    }
    // Direct I/O: every read reaches the daemon, none is served from the
    // kernel's page cache.
    let Some(m) = Mount::with(
        &["--cache-size", "4M", "--direct-io", "--threads", "6"],
        |p| write(p, &ts),
    ) else {
        return;
    };
    let ts = Arc::new(ts);
    let mon = Monitor::start(m.path(".ztensor/stats"));
    let start = Arc::new(Barrier::new(16));
    let readers: Vec<_> = (0..16)
        .map(|i| {
            let (ts, start, mp) = (ts.clone(), start.clone(), m.mp.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(i as u64 * 7919 + 1);
                start.wait();
                // One full sequential read, in odd-sized chunks.
                let t = &ts[i % ts.len()];
                let f = std::fs::File::open(mp.join(&t.name)).unwrap();
                let chunk = 100_000 + 4099 * i;
                let mut off = 0;
                while off < t.le.len() {
                    let got = pread(&f, off as u64, chunk);
                    let hi = (off + chunk).min(t.le.len());
                    assert!(got == t.le[off..hi], "{}: sequential read at {off}", t.name);
                    off = hi;
                }
                // Random ranges of random tensors, some across frame borders.
                for _ in 0..40 {
                    let t = &ts[rng.below(ts.len() as u64) as usize];
                    let f = std::fs::File::open(mp.join(&t.name)).unwrap();
                    let off = rng.below(t.le.len() as u64) as usize;
                    let len = 1 + rng.below(300_000) as usize;
                    let got = pread(&f, off as u64, len);
                    let hi = (off + len).min(t.le.len());
                    assert!(got == t.le[off..hi], "{}: {len} bytes at {off}", t.name);
                }
            })
        })
        .collect();
    let mut failed = Vec::new();
    for (i, r) in readers.into_iter().enumerate() {
        if let Err(e) = r.join() {
            failed.push(format!("reader {i}: {e:?}"));
        }
    }
    // Read-ahead decodes queued by the last reads may still run: what the
    // stats say is judged once they are done.
    let settled = support::wait_until(Duration::from_secs(30), || {
        m.stats()["inflight_decodes"] == 0
    });
    let (samples, max_bytes, bad) = mon.finish();
    assert!(failed.is_empty(), "readers failed: {failed:#?}");
    assert!(
        settled,
        "read-ahead still running 30 s after the readers: {}",
        m.stats()
    );
    assert!(
        bad.is_empty(),
        "cache over its limit in {} of {samples} samples, e.g. {}",
        bad.len(),
        bad[0]
    );
    let st = m.stats();
    let limit = st["cache_limit"].as_u64().unwrap();
    assert_eq!(limit, 4 << 20);
    assert!(samples > 5, "monitor took only {samples} samples");
    assert!(
        max_bytes > 0 && max_bytes <= limit,
        "max sampled {max_bytes}"
    );
    assert!(
        st["cache_peak_bytes"].as_u64().unwrap() <= limit,
        "peak over limit: {st}"
    );
    assert!(st["cache_bytes"].as_u64().unwrap() <= limit);
    assert_eq!(st["errors"], 0, "{st}");
    // 72 frames, all read at least once, and more than the cache holds.
    assert!(st["decompressions"].as_u64().unwrap() >= 72, "{st}");
    assert!(st["evictions"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["spilled_tensors"], 0, "frames fit: nothing spills");
}

#[test]
fn page_cached_readers_agree() {
    // The same kind of load through the page cache: readahead sends large
    // requests that span several frames.
    let ts: Vec<T> = (0..4u64)
        .map(|k| T {
            name: format!("dir/z{k}"),
            dtype: DType::Uint16,
            le: compressible(k + 50, 2 * MIB),
            opts: zstd(
                192 << 10,
                if k % 2 == 0 {
                    Endian::Little
                } else {
                    Endian::Big
                },
            ),
        })
        .collect();
    let Some(m) = Mount::with(&["--cache-size", "2M"], |p| write(p, &ts)) else {
        return;
    };
    let ts = Arc::new(ts);
    let mon = Monitor::start(m.path(".ztensor/stats"));
    let start = Arc::new(Barrier::new(8));
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let (ts, start, mp) = (ts.clone(), start.clone(), m.mp.clone());
            std::thread::spawn(move || {
                start.wait();
                let t = &ts[i % ts.len()];
                let got = std::fs::read(mp.join(&t.name)).unwrap();
                assert!(got == t.le, "{}: full read by reader {i}", t.name);
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let (_, _, bad) = mon.finish();
    assert!(bad.is_empty(), "cache over its limit: {}", bad[0]);
    let st = m.stats();
    assert_eq!(st["errors"], 0, "{st}");
    assert!(st["cache_peak_bytes"].as_u64().unwrap() <= 2 << 20, "{st}");
}

#[test]
fn readers_of_one_cold_tensor_decode_each_frame_once() {
    // 8 frames of 64 KiB; a cache that holds them all.
    const FRAME: usize = 64 << 10;
    let t = T {
        name: "cold".into(),
        dtype: DType::Uint8,
        le: compressible(9, 8 * FRAME),
        opts: zstd(FRAME, Endian::Little),
    };
    let le = Arc::new(t.le.clone());
    // The data layer's cache alone: with passthrough, frames written
    // through to a backing file leave the cache behind the readers.
    let Some(m) = Mount::with(
        &[
            "--cache-size",
            "64M",
            "--direct-io",
            "--threads",
            "8",
            "--no-passthrough",
        ],
        |p| write(p, std::slice::from_ref(&t)),
    ) else {
        return;
    };
    let before = m.stats();
    assert_eq!(
        before["decompressions"], 0,
        "nothing decoded before reading"
    );
    let start = Arc::new(Barrier::new(4));
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let (le, start, path) = (le.clone(), start.clone(), m.path("cold"));
            std::thread::spawn(move || {
                let f = std::fs::File::open(&path).unwrap();
                start.wait();
                // Reader i starts at frame 2i: each frame gets two readers
                // at about the same time.
                for k in 0..8 {
                    let frame = (k + 2 * i) % 8;
                    let off = frame * FRAME;
                    let got = pread(&f, off as u64, FRAME);
                    assert!(got == le[off..off + FRAME], "reader {i} frame {frame}");
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let st = m.stats();
    assert_eq!(st["decompressions"], 8, "one decode per frame: {st}");
    assert_eq!(st["cache_misses"], 8, "{st}");
    // The other 24 frame reads were answered by our cache or, since zstd
    // tensors are opened through the page cache, by the kernel: never by a
    // second decode (the two counts above).
    assert_eq!(st["cache_entries"], 8, "{st}");
    // Each unit counts its bytes and its entry, and the frame list (8
    // frames of 32 bytes) is held in the cache too.
    assert_eq!(
        st["cache_bytes"],
        8 * (FRAME as u64 + ENTRY_COST) + 8 * 32,
        "{st}"
    );
    // Warm: reading it all again decodes nothing.
    assert!(std::fs::read(m.path("cold")).unwrap() == *le);
    let st = m.stats();
    assert_eq!(st["decompressions"], 8, "{st}");
    assert_eq!(st["errors"], 0, "{st}");
}

#[test]
fn a_blob_of_tiny_frames_costs_no_memory_outside_the_cache() {
    // 16 384 frames of 16 bytes: their list (32 bytes a frame, 512 KiB)
    // cannot have a quarter of a 1 MiB cache, so the tensor is decoded as
    // one stream; one of 64 frames keeps its list and is served by frame.
    let tiny = T {
        name: "tiny".into(),
        dtype: DType::Uint32,
        le: compressible(21, 256 << 10),
        opts: zstd(16, Endian::Little),
    };
    let few = T {
        name: "few".into(),
        dtype: DType::Uint32,
        le: compressible(22, 256 << 10),
        opts: zstd(4 << 10, Endian::Big),
    };
    let ts = [tiny, few];
    let Some(m) = Mount::with(&["--cache-size", "1M", "--direct-io"], |p| write(p, &ts)) else {
        return;
    };
    assert!(m.read("tiny") == ts[0].le, "tiny read wrong");
    assert!(m.read("few") == ts[1].le, "few read wrong");
    let st = m.stats();
    assert_eq!(st["errors"], 0, "{st}");
    // One decode for the stream, one per frame for the other.
    assert_eq!(st["decompressions"], 1 + 64, "{st}");
    assert!(st["cache_peak_bytes"].as_u64().unwrap() <= 1 << 20, "{st}");
    let log = m.log_text();
    assert!(
        log.contains("\"tiny\"") && log.contains("16384 zstd frames") && log.contains("one stream"),
        "{log}"
    );
    assert!(!log.contains("\"few\": the list"), "{log}");
}

#[test]
fn a_second_pass_over_an_evicted_tensor_is_read_ahead_too() {
    // 64 frames of 64 KiB under a 1 MiB cache: the second pass finds the
    // first pass's frames evicted. One reader, 64 KiB at a time, with the
    // kernel's readahead off for its file: the daemon sees frames 0, 1, 2...
    // and decodes the next ones ahead, which the reader then finds (hits).
    const FRAME: usize = 64 << 10;
    let t = T {
        name: "seq".into(),
        dtype: DType::Uint8,
        le: compressible(31, 64 * FRAME),
        opts: zstd(FRAME, Endian::Little),
    };
    // The data layer's read-ahead: with passthrough, the second pass
    // would read what the first wrote through to a backing file.
    let Some(m) = Mount::with(
        &["--cache-size", "1M", "--direct-io", "--no-passthrough"],
        |p| write(p, std::slice::from_ref(&t)),
    ) else {
        return;
    };
    let f = std::fs::File::open(m.path("seq")).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let pass = || {
        // Nothing of the file in the kernel's page cache, no readahead.
        // SAFETY: `fd` is `f`'s descriptor, open for the whole closure;
        // fadvise touches no memory of ours.
        unsafe {
            libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
            libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_RANDOM);
        }
        let before = m.stat_u64("cache_hits");
        for k in 0..64 {
            let got = pread(&f, (k * FRAME) as u64, FRAME);
            assert!(got == t.le[k * FRAME..(k + 1) * FRAME], "frame {k}");
        }
        m.stat_u64("cache_hits") - before
    };
    let first = pass();
    let second = pass();
    assert!(first >= 8, "first pass: {first} frames found decoded ahead");
    assert!(
        second >= 8,
        "second pass: {second} frames found decoded ahead (first: {first})"
    );
}

#[test]
fn tensor_larger_than_the_cache_spills_and_reads_right() {
    // One 3 MiB frame cannot live in a 1 MiB cache: it is decoded once into
    // a spill file in --cache-dir while readers wait for their bytes.
    let t = T {
        name: "big".into(),
        dtype: DType::Float32,
        le: compressible(77, 3 * MIB),
        opts: zstd(0, Endian::Big),
    };
    let le = Arc::new(t.le.clone());
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    write(&zt, std::slice::from_ref(&t));
    let spill_dir = m.scratch_path("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    let dir_arg = spill_dir.to_str().unwrap().to_string();
    m.mount(
        &zt,
        &["--cache-size", "1M", "--cache-dir", &dir_arg, "--direct-io"],
    );
    let failed = random_readers(&[(m.path("big"), le.clone())], 6, 20, 200_000, 1);
    assert_eq!(failed, 0, "log:\n{}", m.log_text());
    assert!(std::fs::read(m.path("big")).unwrap() == *le);
    let st = m.stats();
    assert_eq!(st["spilled_tensors"], 1, "{st}");
    assert_eq!(st["decompressions"], 1, "decoded once: {st}");
    assert_eq!(st["errors"], 0, "{st}");
    assert!(st["cache_peak_bytes"].as_u64().unwrap() <= 1 << 20, "{st}");
    // The spill file is unlinked (a tempfile): the directory stays empty.
    assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 0);
}

#[test]
fn a_spill_decoder_holds_no_window_of_its_own() {
    // 96 MiB in one zstd frame written with a 128 MiB window: the frame is
    // one segment, so a zstd stream decoder would hold all 96 MiB as its
    // window. Decoding into the spill file's mapping needs none; the
    // daemon's peak memory while it spills stays far below the tensor.
    let le = compressible(95, 96 * MIB);
    let mut c = zstd::bulk::Compressor::new(1).unwrap();
    c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(27))
        .unwrap();
    let blob = c.compress(&le).unwrap();
    // And 96 MiB of zeros, some 10 000 times smaller compressed: the
    // decoder's steps must not map much more than they are meant to.
    let zeros = vec![0u8; 96 * MIB];
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    let mut w = Writer::create(&zt).unwrap();
    w.add_blob(&blob, zstd_fields("big", (le.len() / 4) as u64))
        .unwrap();
    w.add_blob(
        &zstd::bulk::compress(&zeros, 3).unwrap(),
        zstd_fields("zeros", (zeros.len() / 4) as u64),
    )
    .unwrap();
    // A small-window frame, then one with a 48 MiB window: the stream
    // decoder takes the first and refuses the second; the spill goes again
    // through the mapping.
    let mixed = compressible(96, 52 * MIB);
    let mut blob2 = zstd::bulk::compress(&mixed[..4 * MIB], 1).unwrap();
    blob2.extend(c.compress(&mixed[4 * MIB..]).unwrap());
    w.add_blob(&blob2, zstd_fields("mixed", (mixed.len() / 4) as u64))
        .unwrap();
    w.finish().unwrap();
    let spill_dir = m.scratch_path("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    m.mount(
        &zt,
        &[
            "--cache-size",
            "8M",
            "--cache-dir",
            spill_dir.to_str().unwrap(),
            "--threads",
            "2",
        ],
    );
    let pid = m.pid.unwrap();
    let before = support::status_kib(pid, "VmRSS:").unwrap();
    assert!(std::fs::read(m.path("big")).unwrap() == le);
    assert!(std::fs::read(m.path("zeros")).unwrap() == zeros);
    assert!(std::fs::read(m.path("mixed")).unwrap() == mixed);
    let peak = support::status_kib(pid, "VmHWM:").unwrap();
    let st = m.stats();
    assert_eq!(st["spilled_tensors"], 3, "{st}");
    assert_eq!(st["errors"], 0, "{st}");
    assert!(
        peak < before + 40 * 1024,
        "daemon peak {peak} KiB, {before} KiB before the spill"
    );
}

#[test]
fn a_spill_that_does_not_fit_fails_until_there_is_room() {
    // 3 MiB in one frame, a 1 MiB cache: it must spill, but --cache-dir is
    // a 1 MiB tmpfs. The read fails with ENOSPC and a log line saying why;
    // once the directory has room, the next read spills and succeeds.
    let t = T {
        name: "big".into(),
        dtype: DType::Float32,
        le: compressible(78, 3 * MIB),
        opts: zstd(0, Endian::Little),
    };
    // The same with a damaged middle: it fails first for want of room,
    // then for its data, and the log must give both reasons.
    let damaged = T {
        name: "damaged".into(),
        ..t.clone()
    };
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    write(&zt, &[t.clone(), damaged]);
    garble_middle_block(&zt, 1);
    let dir = m.scratch_path("small");
    let Some(tmpfs) = Tmpfs::cache_dir(&dir, "1m") else {
        return;
    };
    let dir_arg = dir.to_str().unwrap().to_string();
    // Direct I/O: the kernel sends no read-ahead of its own, which could
    // reach the daemon after the resize below and spill `damaged` early.
    // The bound spills share with backing files set past the room the
    // directory will have: its room is what is tested (by default the
    // bound is half of what was free at mount).
    m.mount(
        &zt,
        &[
            "--cache-size",
            "1M",
            "--cache-dir",
            &dir_arg,
            "--direct-io",
            "--decoded-cache-size",
            "8M",
        ],
    );
    let e = std::fs::read(m.path("big")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    let log = m.log_text();
    assert!(
        log.contains("big") && log.contains("too big for the cache and for"),
        "log:\n{log}"
    );
    let e = std::fs::read(m.path("damaged")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    tmpfs.resize("8m");
    assert!(std::fs::read(m.path("big")).unwrap() == t.le);
    assert_eq!(m.stats()["spilled_tensors"], 1, "{}", m.stats());
    let e = std::fs::read(m.path("damaged")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let log = m.log_text();
    let damaged: Vec<_> = log
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("\"damaged\""))
        .collect();
    assert!(
        damaged.iter().any(|l| l.contains("too big for the cache"))
            && damaged.iter().any(|l| l.contains("corrupt")),
        "both reasons at error level:\n{log}"
    );
    m.unmount_ok();
}

#[test]
fn finished_spills_nobody_reads_make_room_for_new_ones() {
    // Five 3 MiB single-frame tensors, a 1 MiB cache, a 10 MiB tmpfs for
    // spills: the spills held may take half of it (--decoded-cache-size's
    // default), so kept for good they would pass it by the second; idle
    // ones go instead, and every tensor reads right, twice.
    let mut ts = one_frame_tensors(5, 60, 3 * MIB);
    // Too big for the directory even empty: it takes no spill from others.
    ts.push(T {
        name: "huge".into(),
        dtype: DType::Float32,
        le: compressible(70, 12 * MIB),
        opts: zstd(0, Endian::Little),
    });
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    write(&zt, &ts);
    let dir = m.scratch_path("small");
    let Some(_tmpfs) = Tmpfs::cache_dir(&dir, "10m") else {
        return;
    };
    let dir_arg = dir.to_str().unwrap().to_string();
    // Spills alone: backing files filled beside them in this small
    // directory would take room at times no test can line up.
    m.mount(
        &zt,
        &[
            "--cache-size",
            "1M",
            "--cache-dir",
            &dir_arg,
            "--no-passthrough",
        ],
    );
    let (huge, ts) = ts.split_last().unwrap();
    read_all_right(&m, ts, 2);
    let drops = || m.stat_u64("spill_evictions");
    let before = drops();
    assert!(before > 0, "{}", m.log_text());
    let e = std::fs::read(m.path(&huge.name)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(
        drops(),
        before,
        "spills dropped for nothing:\n{}",
        m.log_text()
    );
    m.unmount_ok();
}

#[test]
fn spills_stay_within_the_descriptors_the_daemon_may_hold() {
    // 40 single-frame tensors of 3 MiB, each spilled (a 4 MiB cache), read
    // twice in order by a daemon allowed 128 descriptors: at most a quarter
    // of what is left past those open at mount and 64 more as spills at
    // once (about 13), finished ones no reader holds giving way, so every
    // read is right however many tensors have spilled.
    let ts = one_frame_tensors(40, 200, 3 * MIB);
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    write(&zt, &ts);
    let r = m.run_under(
        &["prlimit", "--nofile=128:128"],
        &zt,
        &["--cache-size", "4M"],
    );
    assert!(r.ok(), "{}{}", r.stderr, m.log_text());
    read_all_right(&m, &ts, 2);
    let st = m.stats();
    assert_eq!(st["errors"], 0, "{st}");
    assert!(st["spilled_tensors"].as_u64().unwrap() >= 40, "{st}");
    let log = m.log_text();
    assert!(!log.contains("Too many open files"), "{log}");
    assert!(st["spill_evictions"].as_u64().unwrap() > 0, "{st}");
    m.unmount_ok();
}

#[test]
fn a_big_single_frame_is_served_while_it_decodes() {
    // 24 MiB in one zstd frame (no frame table to jump with): decoded once,
    // front to back, on its own thread while readers take what is there.
    // Its neighbour is the same bytes with a damaged middle.
    let le = Arc::new(compressible(91, 24 * MIB));
    let ts = [
        T {
            name: "one".into(),
            dtype: DType::Float32,
            le: le.to_vec(),
            opts: zstd(0, Endian::Little),
        },
        T {
            name: "damaged".into(),
            dtype: DType::Float32,
            le: le.to_vec(),
            opts: zstd(0, Endian::Little),
        },
    ];
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    write(&zt, &ts);
    garble_middle_block(&zt, 1);
    m.mount(&zt, &["--cache-size", "64M"]);

    let failed = random_readers(&[(m.path("one"), le.clone())], 6, 16, 3 * MIB as u64, 1);
    assert_eq!(failed, 0, "log:\n{}", m.log_text());
    assert!(std::fs::read(m.path("one")).unwrap() == *le);
    let st = m.stats();
    assert_eq!(st["decompressions"], 1, "decoded once: {st}");
    assert_eq!(st["errors"], 0, "{st}");
    assert!(st["cache_peak_bytes"].as_u64().unwrap() <= 64 << 20, "{st}");

    // The damaged one: bytes before the damage are what the stream decodes
    // to; from the damage on, EIO, every time, and the log says why.
    let f = std::fs::File::open(m.path("damaged")).unwrap();
    assert!(pread(&f, 0, MIB) == le[..MIB]);
    for _ in 0..2 {
        let err = std::fs::read(m.path("damaged")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    let log = m.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("\"damaged\"") && l.contains("corrupt")),
        "{log}"
    );
    // The good tensor is still right and the daemon still serves.
    assert!(std::fs::read(m.path("one")).unwrap() == *le);
    let st = m.stats();
    assert!(st["cache_peak_bytes"].as_u64().unwrap() <= 64 << 20, "{st}");
}

/// Index fields of a dense float32 zstd tensor of `n` elements.
fn zstd_fields(name: &str, n: u64) -> Vec<(ciborium::Value, ciborium::Value)> {
    use ciborium::Value;
    let t = |s: &str| Value::Text(s.into());
    vec![
        (t("name"), t(name)),
        (t("dtype"), t("float32")),
        (t("shape"), Value::Array(vec![Value::Integer(n.into())])),
        (t("encoding"), t("zstd")),
        (t("layout"), t("dense")),
    ]
}

#[test]
fn a_whole_blob_is_served_early_only_when_it_cannot_fail_later() {
    // "trailing": one 24 MiB frame that declares the whole size, then a
    // second frame. Served while it decodes, but its last byte only once the
    // stream is checked to the end, which fails: a whole read is EIO.
    // "two": frames of 20 and 4 MiB (the first too big for frame-by-frame
    // in a 64 MiB cache, so decoded as one unit), the second with a damaged
    // block. Not one frame, so it is decoded and checked whole before any
    // byte is out. "spilled": the same two frames in a cache too small to
    // hold them, decoded into a spill file: the same rule.
    let le = compressible(93, 24 * MIB);
    let mut trailing = zstd::bulk::compress(&le, 1).unwrap();
    trailing.extend(zstd::bulk::compress(&[1u8; 4096], 1).unwrap());
    let two_le = compressible(94, 24 * MIB);
    let first = zstd::bulk::compress(&two_le[..20 * MIB], 1).unwrap();
    let mut two = first.clone();
    two.extend(zstd::bulk::compress(&two_le[20 * MIB..], 1).unwrap());
    let (at, len) = compressed_block_near(&two[first.len()..], 0);
    let at = first.len() + at as usize;
    two[at + 8..at + len].fill(0xA5);

    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    let mut w = Writer::create(&zt).unwrap();
    w.add_blob(&trailing, zstd_fields("trailing", (le.len() / 4) as u64))
        .unwrap();
    w.add_blob(&two, zstd_fields("two", (two_le.len() / 4) as u64))
        .unwrap();
    w.finish().unwrap();
    // A second mount of the same file with a cache that makes "two" spill.
    let mut small = Mount::scratch().unwrap();
    let spill_dir = small.scratch_path("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    small.mount(
        &zt,
        &[
            "--cache-size",
            "32M",
            "--cache-dir",
            spill_dir.to_str().unwrap(),
        ],
    );
    {
        let f = std::fs::File::open(small.path("two")).unwrap();
        let mut head = vec![0u8; 4096];
        let err = f.read_exact_at(&mut head, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    assert_eq!(small.stats()["spilled_tensors"], 1, "{}", small.stats());
    // The failed spill gave its disk back: its file (unlinked, still open
    // in the daemon) is empty. The open's backing file, which its failed
    // reads never wrote, goes at the RELEASE, which the kernel sends after
    // close(2) has returned: waited for.
    let pid = small.pid.unwrap();
    let held = || -> Vec<u64> {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return Vec::new();
        };
        fds.flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|p| p.starts_with(&spill_dir)))
            .filter_map(|e| std::fs::metadata(e.path()).ok().map(|m| m.len()))
            .collect()
    };
    support::wait_until(Duration::from_secs(10), || held() == [0]);
    assert_eq!(
        held(),
        [0],
        "sizes of the files the daemon holds in the spill dir"
    );
    drop(small);

    m.mount(&zt, &["--cache-size", "64M"]);

    let f = std::fs::File::open(m.path("trailing")).unwrap();
    assert!(pread(&f, 0, MIB) == le[..MIB]);
    for _ in 0..2 {
        let err = std::fs::read(m.path("trailing")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        let mut last = [0u8; 1];
        let err = f.read_exact_at(&mut last, le.len() as u64 - 1).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    let f = std::fs::File::open(m.path("two")).unwrap();
    let mut head = vec![0u8; 4096];
    let err = f.read_exact_at(&mut head, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let log = m.log_text();
    for name in ["\"trailing\"", "\"two\""] {
        assert!(log.lines().any(|l| l.contains(name)), "{name}: {log}");
    }
    let st = m.stats();
    assert!(st["cache_peak_bytes"].as_u64().unwrap() <= 64 << 20, "{st}");
    // Failed units leave the cache (once the last reply holding one is out).
    let empty = support::wait_until(Duration::from_secs(5), || m.stat_u64("cache_bytes") == 0);
    assert!(empty, "{}", m.stats());
}

#[test]
fn progressive_units_evicted_while_read_stay_right_and_bounded() {
    // Three 24 MiB single-frame tensors behind a 64 MiB cache: each is one
    // unit served while it decodes, and they do not all fit, so units are
    // evicted while readers still wait on them or copy from them.
    let les: Vec<Arc<Vec<u8>>> = (0..3)
        .map(|i| Arc::new(compressible(200 + i, 24 * MIB)))
        .collect();
    let ts: Vec<T> = les
        .iter()
        .enumerate()
        .map(|(i, le)| T {
            name: format!("t{i}"),
            dtype: DType::Float32,
            le: le.to_vec(),
            opts: zstd(0, Endian::Little),
        })
        .collect();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("test.zt");
    write(&zt, &ts);
    m.mount(&zt, &["--cache-size", "64M", "--direct-io"]);
    let files: Vec<_> = les
        .iter()
        .enumerate()
        .map(|(i, le)| (m.path(&format!("t{i}")), le.clone()))
        .collect();
    let failed = random_readers(&files, 9, 12, 4 * MIB as u64, 11);
    assert_eq!(failed, 0, "log:\n{}", m.log_text());
    let st = m.stats();
    assert_eq!(st["errors"], 0, "{st}");
    assert!(st["evictions"].as_u64().unwrap() >= 1, "no pressure: {st}");
    assert!(st["cache_peak_bytes"].as_u64().unwrap() <= 64 << 20, "{st}");
    for (i, le) in les.iter().enumerate() {
        assert!(std::fs::read(m.path(&format!("t{i}"))).unwrap() == **le);
    }
}
