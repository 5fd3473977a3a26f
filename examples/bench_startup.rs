//! Where a mount's startup time and memory go, step by step, without FUSE:
//! open and parse the file (`formats::open`: index -> catalog), build the
//! filesystem (`TensorFs::new`: tree, per-tensor state), then what glibc gives
//! back with `malloc_trim(0)`. Prints one line per step: wall time, the
//! process's anonymous RSS and its peak (VmHWM).
//!
//! cargo run --release --example bench_startup -- FILE

use std::time::Instant;

use ztensor_mount::formats::{self, Limits};
use ztensor_mount::mount::fs::{FsOptions, TensorFs};
use ztensor_mount::serve::data::DataOptions;

fn status() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            / 1024
    };
    (field("RssAnon:"), field("VmHWM:"))
}

fn step(what: &str, t0: Instant) {
    let (anon, hwm) = status();
    println!(
        "{what:<34} {:>8.1} ms   RssAnon {anon:>5} MiB   VmHWM {hwm:>5} MiB",
        t0.elapsed().as_secs_f64() * 1e3
    );
}

fn main() {
    let path = std::env::args().nth(1).expect("usage: bench_startup FILE");
    step("start", Instant::now());
    let t = Instant::now();
    let opened = formats::open(std::path::Path::new(&path), Limits::default()).expect("open");
    let n = opened.catalog.len();
    step(&format!("formats::open ({n} tensors)"), t);
    let t = Instant::now();
    let fs = TensorFs::new(
        opened.catalog,
        opened.sources,
        FsOptions {
            data: DataOptions {
                cache_size: 256 << 20,
                cache_dir: "/var/tmp".into(),
                verify_raw: true,
                progressive_min: ztensor_mount::serve::data::PROGRESSIVE_MIN,
            },
            direct_io: false,
            views: ztensor_mount::views::Views::ALL,
            xattrs: true,
            backing: ztensor_mount::mount::backing::BackingOptions::off(),
        },
    )
    .expect("fs");
    step(&format!("TensorFs::new ({} inodes)", fs.tree().len()), t);
    let t = Instant::now();
    // SAFETY: malloc_trim takes a number, touches no memory of ours and
    // runs under malloc's own locks.
    unsafe { libc::malloc_trim(0) };
    step("malloc_trim(0)", t);
    drop(fs);
    let t = Instant::now();
    // SAFETY: as above.
    unsafe { libc::malloc_trim(0) };
    step("drop everything + malloc_trim(0)", t);
}
