//! The bodies of the fuzz targets in `fuzz/` (each target is one call of a
//! function here). They live in the library so that the stable toolchain
//! builds them with every `cargo test`, and `tests/fuzz_bodies.rs` runs
//! each over its seeds: a target cannot stop compiling unnoticed, as it
//! could in the fuzz crate, which only cargo-fuzz on nightly builds.
//!
//! Each must never panic on any input except through its own assertions,
//! which state what the code under test promises.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::catalog::PartMap;
use crate::formats::{self, Limits, zt_v01, zt_v1, zt_v2};
use crate::serve::data::{Data, DataOptions, PROGRESSIVE_MIN};
use crate::serve::stats::Stats;

fn limits() -> Limits {
    Limits {
        index_memory: 64 << 20,
    }
}

/// A scratch directory of this process for the targets that need a file.
fn scratch(target: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("zt-fuzz-{target}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// `index`: the zTensor v0.1 index parser and catalog checks on arbitrary
/// bytes: Ok or a one-line Err.
pub fn index(data: &[u8]) {
    match zt_v01::Catalog::parse(data, "fuzz.zt") {
        Ok(cat) => {
            // Touch what the mount would: every tensor's description.
            for t in &cat.tensors {
                if let Ok(l) = &t.layout {
                    assert!(
                        l.parts
                            .iter()
                            .all(|p| !p.name.is_empty() || l.parts.len() == 1)
                    );
                }
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
}

/// `data_path`: 8 bytes of read plan, then a zTensor v0.1 file, opened
/// through the mount's data layer with a 64 KiB cache (so the frame,
/// whole-blob, progressive and spill paths all run) and read at seeded
/// ranges of every part of every tensor; every byte served must be the
/// library's one-shot read of that tensor.
pub fn data_path(input: &[u8]) {
    let Some((plan, file)) = input.split_first_chunk::<8>() else {
        return;
    };
    let dir = scratch("data_path");
    let path = dir.join("input.zt");
    if std::fs::write(&path, file).is_err() {
        return;
    }
    let (Ok(zt), Ok(reference)) = (zt_v01::ZtFile::open(&path), zt_v01::ZtFile::open(&path)) else {
        return;
    };
    let (src, v01) = zt.into_parts();
    let catalog = zt_v01::project(&src, v01);
    // Units from 1 KiB up are served while they decode, so that path runs too.
    let opts = DataOptions {
        cache_size: 64 << 10,
        cache_dir: dir.clone(),
        verify_raw: true,
        progressive_min: 1 << 10,
    };
    let Ok(data) = Data::new(catalog, vec![Some(src)], opts, Arc::new(Stats::default())) else {
        return;
    };
    let mut seed = u64::from_le_bytes(*plan);
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let tensors = data.catalog().tensors.len();
    assert_eq!(tensors, reference.catalog().tensors.len());
    for ti in 0..tensors {
        let sizes: Vec<u64> = data.catalog().tensors[ti]
            .parts
            .as_ref()
            .map_or_else(|_| Vec::new(), |ps| ps.iter().map(|p| p.nbytes).collect());
        let whole = reference.read_all(&reference.catalog().tensors[ti]).ok();
        for (pi, &nbytes) in sizes.iter().enumerate() {
            for _ in 0..3 {
                let off = if nbytes == 0 {
                    0
                } else {
                    next() % (nbytes + 8)
                };
                let len = next() % (1 << 16);
                if let Ok(bytes) = data.read(ti, pi, off, len) {
                    assert!(bytes.len() as u64 <= len);
                    assert!(off >= nbytes || bytes.len() as u64 == len.min(nbytes - off));
                    // Never other bytes than the library's whole-tensor read.
                    if let Some(parts) = &whole
                        && off < nbytes
                    {
                        let at = off as usize;
                        assert!(bytes[..] == parts[pi][at..at + bytes.len()]);
                    }
                }
            }
        }
    }
}

/// `zt_v1`: the zTensor v1 manifest parser and catalog on arbitrary
/// bytes: Ok or a one-line Err; an Ok catalog points only inside the file.
pub fn zt_v1(data: &[u8]) {
    match zt_v1::catalog(data, "fuzz.zt", Path::new("fuzz.zt"), limits()) {
        Ok(cat) => {
            for b in &cat.blobs {
                assert!(
                    b.offset
                        .checked_add(b.len)
                        .is_some_and(|e| e <= data.len() as u64)
                );
            }
            for t in &cat.tensors {
                // What the sidecar shows must serialize.
                let _ = serde_json::to_string(&t.meta);
                if let Ok(parts) = &t.parts {
                    for p in parts {
                        let b = &cat.blobs[p.blob];
                        assert_eq!(p.map, PartMap::Contiguous { start: 0 });
                        assert_eq!(p.nbytes, b.decoded_len, "{}", t.name);
                        assert!(t.directory || p.name.is_empty());
                        assert!(!p.name.contains('/'));
                    }
                }
            }
            let _ = serde_json::to_string(&cat.attributes);
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
}

/// `zt_v2_seek`: the first 8 bytes are a part's declared decoded length,
/// the rest its stored bytes. A seek table the parser accepts must add up
/// (stored sizes to the bytes before it, decoded sizes to the length,
/// frames within the 16 MiB rule), and is then walked as the open path
/// walks it.
pub fn zt_v2_seek(data: &[u8]) {
    use zt_v2::{check, seek};
    let Some((head, stored)) = data.split_first_chunk::<8>() else {
        return;
    };
    let decoded = u64::from_le_bytes(*head) % (1 << 26);
    if let Ok(t) = seek::parse(stored, decoded) {
        assert_eq!(t.frames.iter().map(|f| f.0).sum::<u64>(), t.frames_len);
        assert_eq!(t.frames.iter().map(|f| f.1).sum::<u64>(), decoded);
        assert!(t.frames_len <= stored.len() as u64);
        assert!(
            t.frames
                .iter()
                .all(|&(c, d)| c > 0 && d > 0 && d <= seek::MAX_FRAME_DECODED)
        );
        if seek::check_frame_headers(stored, &t).is_ok() {
            let mut e = check::Elements::zstd(stored, &t.frames, 4);
            let mut n = 0u64;
            while let Ok(Some(_)) = e.next_elem() {
                n += 1;
            }
            assert!(n <= decoded / 4);
        }
    }
}

/// `deathtensors`: the prefix and header parser on arbitrary bytes: Ok or
/// a one-line Err; what it accepts agrees with the file it came from.
pub fn deathtensors(data: &[u8]) {
    match formats::deathtensors::parse(data, "fuzz.deathtensors", limits()) {
        Ok(p) => {
            let len = data.len() as u64;
            assert!(p.data_start + p.stored_len <= len);
            for t in &p.tensors {
                assert!(t.start <= t.end && t.end <= p.decoded_len);
                if !p.compressed() {
                    assert!(t.end <= p.stored_len);
                }
            }
            if let Some((_, (at, n))) = p.footer {
                assert_eq!(at + n + 32, len);
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
}

/// `formats`: any bytes as a file through detection and every format's
/// catalog, then every tensor read through the data layer: Ok, a one-line
/// Err, or a failed read.
pub fn formats(data: &[u8]) {
    let dir = scratch("formats");
    let path = dir.join("input");
    let Ok(mut f) = std::fs::File::create(&path) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    match formats::open(&path, limits()) {
        Ok(opened) => {
            let opts = DataOptions {
                cache_size: 16 << 20,
                cache_dir: dir.clone(),
                verify_raw: true,
                progressive_min: PROGRESSIVE_MIN,
            };
            let Ok(d) = Data::new(
                opened.catalog,
                opened.sources,
                opts,
                Arc::new(Stats::default()),
            ) else {
                return;
            };
            for (ti, t) in d.catalog().tensors.iter().enumerate() {
                let n = t.parts.as_ref().map_or(0, |p| p.len());
                for pi in 0..n {
                    let _ = d.read(ti, pi, 0, 1 << 16);
                }
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
}
