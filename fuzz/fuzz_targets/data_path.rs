//! Opens a fuzzed file through the mount's data layer (the code behind every
//! read) and reads ranges of every part of every tensor, with a tiny cache so
//! frames, whole-blob and spill plans all run. Input: 8 bytes of read plan,
//! then the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use ztensor_mount::formats::zt_v01::ZtFile;
use ztensor_mount::mount::data::{Data, DataOptions};
use ztensor_mount::mount::stats::Stats;

fuzz_target!(|input: &[u8]| {
    if input.len() < 8 {
        return;
    }
    let (plan, file) = input.split_at(8);
    let path = std::env::temp_dir().join(format!("ztfuzz-{}.zt", std::process::id()));
    if std::fs::write(&path, file).is_err() {
        return;
    }
    let Ok(zt) = ZtFile::open(&path) else { return };
    // Units from 1 KiB up are served while they decode, so that path runs too.
    let opts = DataOptions {
        cache_size: 64 << 10,
        cache_dir: std::env::temp_dir(),
        verify_raw: true,
        progressive_min: 1 << 10,
    };
    // The library's one-shot reader, to compare served bytes with.
    let Ok(reference) = ZtFile::open(&path) else { return };
    let Ok(data) = Data::new(zt, opts, Arc::new(Stats::default())) else { return };
    let mut seed = u64::from_le_bytes(plan.try_into().unwrap_or([0; 8]));
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let tensors = data.file().catalog().tensors.len();
    for ti in 0..tensors {
        let parts = data.file().catalog().tensors[ti].layout.as_ref().map_or(0, |l| l.parts.len());
        let whole = reference.read_all(&reference.catalog().tensors[ti]).ok();
        for pi in 0..parts {
            let nbytes = data.file().catalog().tensors[ti].layout.as_ref().map_or(0, |l| l.parts[pi].nbytes);
            for _ in 0..3 {
                let off = if nbytes == 0 { 0 } else { next() % (nbytes + 8) };
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
});
