//! Any bytes as a file through `formats::open` (detection, then every
//! format's catalog: zTensor v0.1, our HDF5 reader with its chunk
//! assembly, our `.pt` pickle evaluator, and all ztensor-compat reads),
//! then every tensor read through the data layer: Ok, a one-line Err, or a
//! failed read; never a panic, a hang or an unbounded allocation.
#![no_main]

use std::io::Write;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use ztensor_mount::formats::{self, Limits};
use ztensor_mount::mount::data::{Data, DataOptions, PROGRESSIVE_MIN};
use ztensor_mount::mount::stats::Stats;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("zt-fuzz-formats-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("input");
    let Ok(mut f) = std::fs::File::create(&path) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    let limits = Limits {
        index_memory: 64 << 20,
    };
    match formats::open(&path, limits) {
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
});
