//! Load: 64 concurrent readers at random offsets and sizes over raw and zstd
//! tensors with a cache far smaller than the zstd data, every read checked.
//! The suite runs it for ZT_LOAD_SECS seconds (default 4); the long run is
//! `ZT_LOAD_SECS=60 cargo test --release --test mount_load` (README).
//! Also: signals during heavy reads unmount cleanly and never hang readers.

mod support;

use std::fs::File;
use std::io::BufWriter;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use support::{Mount, Rng, compressible, pattern, serial, signal, wait_until};
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{DType, Endian};

const CACHE: u64 = 8 << 20;

struct Model {
    tensors: Vec<(String, Vec<u8>)>,
}

/// Adds a raw float32 tensor of 4 MiB (a pattern salted with `salt`),
/// big-endian on disk if `big`; returns its little-endian bytes.
fn add_raw(w: &mut Writer<BufWriter<File>>, name: &str, salt: u8, big: bool) -> Vec<u8> {
    let data = pattern(4, 1 << 20, salt);
    let endian = if big { Endian::Big } else { Endian::Little };
    let opts = Options {
        endian,
        ..Options::default()
    };
    w.add(name, DType::Float32, &[1 << 20], &data, &opts)
        .unwrap();
    data
}

fn model(path: &std::path::Path) -> Model {
    let mut w = Writer::create(path).unwrap();
    let mut tensors = Vec::new();
    for i in 0..4 {
        let name = format!("raw{i}");
        let data = add_raw(&mut w, &name, i as u8, i % 2 == 1);
        tensors.push((name, data));
    }
    for i in 0..6 {
        // 6 x 4 MiB of zstd data against an 8 MiB cache.
        let data = compressible(100 + i, 4 << 20);
        let frame_size = if i == 5 { 0 } else { 256 << 10 };
        let name = format!("z{i}");
        let opts = Options {
            compression: Compression::Zstd {
                level: 1,
                frame_size,
            },
            ..Options::default()
        };
        w.add(&name, DType::Uint8, &[4 << 20], &data, &opts)
            .unwrap();
        tensors.push((name, data));
    }
    w.finish().unwrap();
    Model { tensors }
}

fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A field of the daemon's /proc status; a daemon that is gone fails the
/// test instead of reading as 0 KiB, which would pass any bound.
fn status_kib(pid: i32, field: &str) -> u64 {
    support::status_kib(pid, field)
        .unwrap_or_else(|| panic!("no {field} for daemon {pid}: has it exited?"))
}

#[test]
fn sixty_four_readers_random_ranges() {
    let secs: u64 = std::env::var("ZT_LOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("load.zt");
    let model = Arc::new(model(&zt));
    m.mount(&zt, &["--cache-size", "8M", "--direct-io"]);
    let pid = m.pid.expect("daemon pid");
    let base_rss = rss_kib(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut readers = Vec::new();
    for r in 0..64u64 {
        let (model, stop, reads, bytes) =
            (model.clone(), stop.clone(), reads.clone(), bytes.clone());
        let mp = m.mp.clone();
        readers.push(std::thread::spawn(move || -> Result<(), String> {
            let mut rng = Rng(r * 7919 + 1);
            while !stop.load(Relaxed) {
                let (name, data) = &model.tensors[rng.below(model.tensors.len() as u64) as usize];
                let off = rng.below(data.len() as u64);
                let len = (1 + rng.below(256 << 10)).min(data.len() as u64 - off) as usize;
                let f =
                    std::fs::File::open(mp.join(name)).map_err(|e| format!("open {name}: {e}"))?;
                let mut buf = vec![0u8; len];
                f.read_exact_at(&mut buf, off)
                    .map_err(|e| format!("{name}@{off}+{len}: {e}"))?;
                if buf != data[off as usize..off as usize + len] {
                    return Err(format!("{name}@{off}+{len}: wrong bytes"));
                }
                reads.fetch_add(1, Relaxed);
                bytes.fetch_add(len as u64, Relaxed);
            }
            Ok(())
        }));
    }
    let start = Instant::now();
    let mut peak_rss = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        peak_rss = peak_rss.max(rss_kib(pid));
        let s = m.stats();
        assert!(
            s["cache_bytes"].as_u64().unwrap() <= CACHE,
            "cache over its limit: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Relaxed);
    for r in readers {
        r.join().unwrap().unwrap();
    }
    // The kernel's own high-water mark: a spike between two samples above
    // counts too.
    peak_rss = peak_rss.max(status_kib(pid, "VmHWM:"));
    let s = m.stats();
    eprintln!(
        "load: {} reads, {} MiB in {secs} s; daemon RSS {} -> peak {} KiB; stats {s}",
        reads.load(Relaxed),
        bytes.load(Relaxed) >> 20,
        base_rss,
        peak_rss
    );
    assert!(reads.load(Relaxed) > 100, "too few reads to mean anything");
    assert_eq!(s["errors"], 0);
    assert!(s["cache_peak_bytes"].as_u64().unwrap() <= CACHE);
    // Idle again: nothing decoding (read-ahead queued by the last reads may
    // still be finishing), the cache within its limit.
    let idle = support::wait_until(Duration::from_secs(5), || {
        m.stat_u64("inflight_decodes") == 0
    });
    assert!(
        idle,
        "decodes still in flight 5 s after the readers stopped: {}",
        m.stats()
    );
    assert!(
        peak_rss <= (CACHE >> 10) + 64 * 1024 + base_rss,
        "RSS {peak_rss} KiB over cache + 64 MiB"
    );
}

/// Raw replies of 128 KiB or more are sent from the daemon's mapping of
/// the file; however much of the file is read, and however (whole tensors,
/// random 4 KiB pieces, big-endian copies, from several threads), the
/// daemon keeps only a bounded part of it mapped (`serve::window`: 32 MiB
/// counted, one batch of 8 MiB being let go of, replies in flight).
#[test]
fn raw_reads_keep_little_of_the_file_mapped() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("wide.zt");
    let mut w = Writer::create(&zt).unwrap();
    let mut tensors = Vec::new();
    for i in 0..48 {
        // 48 x 4 MiB, every fourth one big-endian (served from a copy).
        let name = format!("t{i}");
        let data = add_raw(&mut w, &name, i as u8, i % 4 == 3);
        tensors.push((name, data));
    }
    w.finish().unwrap();
    m.mount(&zt, &[]);
    read_all_within_the_mapping_budget(&m, tensors);
}

/// The same bound holds for a set of shards read through: one budget for
/// the whole mount, not one per shard (24 shards kept 24 times 32 MiB
/// mapped, and a helper thread each).
#[test]
fn raw_reads_of_many_shards_keep_one_budget_mapped() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let dir = m.scratch_path("set");
    std::fs::create_dir(&dir).unwrap();
    let mut tensors = Vec::new();
    let mut map = serde_json::Map::new();
    for i in 0..24 {
        let (name, file) = (
            format!("t{i}"),
            format!("model-{i:05}-of-00024.safetensors"),
        );
        let data = pattern(1, 8 << 20, i as u8);
        std::fs::write(dir.join(&file), safetensors_of(&name, &data)).unwrap();
        map.insert(name.clone(), file.into());
        tensors.push((name, data));
    }
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(&index, serde_json::json!({ "weight_map": map }).to_string()).unwrap();
    m.mount(&index, &[]);
    let pid = m.pid.expect("daemon pid");
    read_all_within_the_mapping_budget(&m, tensors);
    // One mapping helper for the mount, not one per shard.
    let helpers = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == "zt-map")
        })
        .count();
    assert_eq!(helpers, 1, "mapping helper threads for 24 shards");
}

/// The same bound holds for zstd tensors read by several readers: the
/// frames' compressed bytes are read through the mapping and let go of
/// after each decode, frames are decoded out of order (read-ahead, four
/// readers), and a page fault maps a whole large folio of the page cache,
/// not just the pages a frame needs: 70 MiB of a model stayed mapped.
#[test]
fn zstd_reads_keep_little_of_the_file_mapped() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("frames.zt");
    let mut w = Writer::create(&zt).unwrap();
    let mut tensors = Vec::new();
    for i in 0..16u64 {
        // 16 x 16 MiB that zstd shrinks as little as it does weights (to
        // 0.8): about 200 MiB of frames to map, each slow enough to decode
        // that they finish out of order.
        let mut r = Rng(1000 + i);
        let data: Vec<u8> = (0..(16 << 20) / 8)
            .flat_map(|_| (r.next_u64() & 0x3f7f_ffff_3f7f_ffff).to_le_bytes())
            .collect();
        let name = format!("z{i}");
        let opts = Options {
            compression: Compression::Zstd {
                level: 1,
                frame_size: 1 << 20,
            },
            ..Options::default()
        };
        w.add(&name, DType::Uint8, &[data.len() as u64], &data, &opts)
            .unwrap();
        tensors.push((name, data));
    }
    w.finish().unwrap();
    cache_as_a_reader_would(&zt);
    m.mount(&zt, &[]);
    // Frames are not raw replies: nothing of them stays mapped.
    read_all_within(&m, tensors, 4 << 10);
}

/// Puts `path` in the page cache as a file read from disk is (in large
/// folios, by readahead), rather than as the small writes that made it.
fn cache_as_a_reader_would(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let f = File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: fadvise reads only its arguments; the fd is open.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "fadvise");
    std::io::copy(
        &mut std::io::BufReader::with_capacity(8 << 20, f),
        &mut std::io::sink(),
    )
    .unwrap();
}

/// A safetensors file of one U8 tensor `name`.
fn safetensors_of(name: &str, data: &[u8]) -> Vec<u8> {
    let header = serde_json::json!({
        name: {"dtype": "U8", "shape": [data.len()], "data_offsets": [0, data.len()]}
    })
    .to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Four readers each read a share of `tensors` whole, and all of them at
/// 200 random 4 KiB places, checking every byte; then the file pages the
/// daemon has mapped settle within the budget (the helper lets go of what
/// is past it shortly after).
fn read_all_within_the_mapping_budget(m: &Mount, tensors: Vec<(String, Vec<u8>)>) {
    read_all_within(m, tensors, (32 + 8 + 8) << 10)
}

/// The reads of [`read_all_within_the_mapping_budget`]; then the file
/// pages the daemon has mapped settle within `slack` KiB of where they
/// started.
fn read_all_within(m: &Mount, tensors: Vec<(String, Vec<u8>)>, slack: u64) {
    let pid = m.pid.expect("daemon pid");
    let base = status_kib(pid, "RssFile:");
    let tensors = Arc::new(tensors);
    let readers: Vec<_> = (0..4u64)
        .map(|r| {
            let (tensors, mp) = (tensors.clone(), m.mp.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut rng = Rng(r + 11);
                for (i, (name, data)) in tensors.iter().enumerate() {
                    let f = std::fs::File::open(mp.join(name)).map_err(|e| e.to_string())?;
                    if i % 4 == r as usize {
                        // This reader's share, whole.
                        let got = std::fs::read(mp.join(name)).map_err(|e| e.to_string())?;
                        if got != *data {
                            return Err(format!("{name}: wrong bytes"));
                        }
                    }
                    for _ in 0..200 {
                        let off = rng.below(data.len() as u64 - 4096) & !4095;
                        let mut buf = [0u8; 4096];
                        f.read_exact_at(&mut buf, off).map_err(|e| e.to_string())?;
                        if buf[..] != data[off as usize..off as usize + 4096] {
                            return Err(format!("{name}@{off}: wrong bytes"));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap().unwrap();
    }
    let read: usize = tensors.iter().map(|(_, d)| d.len()).sum();
    let bound = base + slack;
    let settled = wait_until(Duration::from_secs(5), || {
        status_kib(pid, "RssFile:") <= bound
    });
    let now = status_kib(pid, "RssFile:");
    eprintln!(
        "RssFile {base} KiB before, {now} KiB after reading {} MiB",
        read >> 20
    );
    assert!(
        settled,
        "{now} KiB of the files mapped after reading them all (started at {base} KiB)"
    );
}

#[test]
fn signals_during_heavy_reads_unmount_cleanly() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let _one_at_a_time = serial();
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        let zt = m.scratch_path("sig.zt");
        let model = Arc::new(model(&zt));
        m.mount(&zt, &["--cache-size", "8M"]);
        let pid = m.pid.expect("daemon pid");
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..8)
            .map(|r| {
                let (model, stop, mp) = (model.clone(), stop.clone(), m.mp.clone());
                let done = done.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(r + 1);
                    while !stop.load(Relaxed) {
                        let (name, _) =
                            &model.tensors[rng.below(model.tensors.len() as u64) as usize];
                        // Errors are expected once the mount goes away.
                        if std::fs::read(mp.join(name)).is_ok() {
                            done.fetch_add(1, Relaxed);
                        } else {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        // The signal lands while reads are under way: after every reader
        // has had time to finish a few, while all of them go on.
        assert!(
            wait_until(Duration::from_secs(10), || done.load(Relaxed) >= 32),
            "signal {sig}: the readers did not get going"
        );
        signal(pid, sig);
        // With files open the daemon detaches, waits 2 s, then aborts.
        assert!(
            wait_until(Duration::from_secs(10), || !support::alive(pid)),
            "signal {sig}: daemon still alive"
        );
        assert!(
            wait_until(Duration::from_secs(5), || !m.is_mounted()),
            "signal {sig}: mount left behind"
        );
        stop.store(true, Relaxed);
        // A reader stuck in the kernel fails the test instead of hanging it.
        assert!(
            wait_until(Duration::from_secs(10), || readers
                .iter()
                .all(|r| r.is_finished())),
            "signal {sig}: a reader hung after the daemon left"
        );
        for r in readers {
            r.join().expect("a reader panicked");
        }
    }
}
