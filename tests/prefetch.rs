//! `ztensor-mount prefetch`: through real mounts, a zstd tensor ends up
//! decoded in the daemon's cache and a remote object in the disk cache,
//! and reading them afterwards decodes and fetches nothing. The remote
//! object comes from the Range server of the remote tests
//! (`tests/python/range_server.py`), started here on 127.0.0.1.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::python::Python;
use support::{Mount, Run, run_with_timeout};
use ztensor_mount::formats::zt_v01::DType;
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};

const MIB: usize = 1 << 20;

/// Raw and zstd tensors (one of them in a directory); names and bytes.
fn write_model(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut w = Writer::create(path).unwrap();
    let zstd = Options {
        compression: Compression::Zstd {
            level: 1,
            frame_size: 256 << 10,
        },
        ..Options::default()
    };
    let mut out = Vec::new();
    for (i, (name, n, opts)) in [
        ("raw", 3 * MIB + 5, Options::default()),
        ("enc/packed", 2 * MIB, zstd.clone()),
        ("enc/small", 1000, zstd),
    ]
    .into_iter()
    .enumerate()
    {
        let bytes = support::compressible(i as u64 + 3, n);
        w.add(name, DType::Uint8, &[n as u64], &bytes, &opts)
            .unwrap();
        out.push((name.to_string(), bytes));
    }
    w.finish().unwrap();
    out
}

fn prefetch(mp: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(support::bin());
    cmd.arg("prefetch").arg(mp).args(args);
    run_with_timeout(&mut cmd, Duration::from_secs(60))
}

#[test]
fn prefetch_decodes_the_zstd_tensors_once_and_a_second_read_decodes_nothing() {
    let mut tensors = Vec::new();
    let Some(m) = Mount::with(&["--cache-size", "64M"], |p| tensors = write_model(p)) else {
        return;
    };
    let r = prefetch(&m.mp, &[]);
    assert!(r.ok(), "{r:?}");
    let line = r.stdout.trim_end();
    assert_eq!(
        line.lines().count(),
        1,
        "one line when not a terminal: {line}"
    );
    assert!(line.starts_with("prefetched 3 tensors"), "{line}");
    assert!(line.contains("decoded 2.0 MiB"), "{line}");
    let decoded = (2 * MIB + 1000) as u64;
    assert_eq!(m.stat_u64("decompressed_bytes"), decoded);
    let decodes = m.stat_u64("decompressions");
    for (name, bytes) in &tensors {
        assert!(m.read(name) == *bytes, "{name}: wrong bytes");
    }
    assert_eq!(m.stat_u64("decompressions"), decodes, "decoded again");
    assert_eq!(m.stat_u64("decompressed_bytes"), decoded);

    // A directory of the tree, and names that are not there.
    let r = prefetch(&m.mp, &["enc"]);
    assert!(r.stdout.starts_with("prefetched 2 tensors"), "{r:?}");
    let r = prefetch(&m.mp, &["enc/packed", "nope"]);
    assert!(!r.ok());
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("\"nope\""), "{}", r.stderr);
    m.unmount_ok();
    let r = prefetch(&m.mp, &[]);
    assert!(!r.ok());
    assert!(
        r.stderr.contains("is not a ztensor-mount mount"),
        "{}",
        r.stderr
    );
}

/// The Range server over `dir`; exits when its stdin closes.
type RangeServer = support::server::Server;

impl RangeServer {
    fn range(py: &Python, dir: &Path) -> RangeServer {
        RangeServer::script(py.cmd(), "range_server.py", &[dir.as_os_str()])
    }

    /// Data requests the server has answered.
    fn requests(&self) -> u64 {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET /__stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["requests"].as_u64().unwrap()
    }
}

#[test]
fn prefetch_of_a_remote_object_fills_the_disk_cache_and_a_second_read_fetches_nothing() {
    let Some(py) = Python::from_env().require("python3 (set ZT_PYTHON)", "print(1)", |_| Ok(()))
    else {
        return;
    };
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let files = m.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    let tensors = write_model(&files.join("model.zt"));
    let size = std::fs::metadata(files.join("model.zt")).unwrap().len();
    let srv = RangeServer::range(&py, &files);
    let url = format!("http://127.0.0.1:{}/model.zt", srv.port);
    m.mount(
        Path::new(&url),
        &[
            "--cache-dir",
            made(&m, "cache").to_str().unwrap(),
            "-o",
            "block_size=256K",
        ],
    );
    let r = prefetch(&m.mp, &[]);
    assert!(r.ok(), "{r:?}");
    assert!(r.stdout.contains(" fetched "), "{}", r.stdout);
    let stats = m.stats();
    assert_eq!(stats["remote_object_bytes"].as_u64(), Some(size), "{stats}");
    // Every tensor byte is cached; only the file's few bytes outside any
    // tensor (its header and index, fetched at open) count too.
    assert_eq!(stats["remote_cached_bytes"].as_u64(), Some(size), "{stats}");
    let requests = srv.requests();
    let sent = m.stat_u64("remote_requests");
    for (name, bytes) in &tensors {
        assert!(m.read(name) == *bytes, "{name}: wrong bytes");
    }
    assert_eq!(srv.requests(), requests, "a read after prefetch fetched");
    assert_eq!(m.stat_u64("remote_requests"), sent);
    m.unmount_ok();
}

/// A new directory in `m`'s scratch space.
fn made(m: &Mount, name: &str) -> PathBuf {
    let p = m.scratch_path(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A tensor whose read fails (a one-frame tensor too big for the cache,
/// whose spill does not fit in `--decoded-cache-size`) is named on stderr
/// with its error and not counted as prefetched; the command exits 1.
#[test]
fn prefetch_counts_a_tensor_that_fails_apart() {
    let mut small = Vec::new();
    let write = |p: &Path| {
        let mut w = Writer::create(p).unwrap();
        let one_frame = support::one_frame_options(1);
        let big = support::compressible(9, 24 * MIB);
        w.add("big", DType::Uint8, &[big.len() as u64], &big, &one_frame)
            .unwrap();
        small = support::compressible(10, MIB);
        w.add("small", DType::Uint8, &[MIB as u64], &small, &one_frame)
            .unwrap();
        w.finish().unwrap();
    };
    let opts = ["--cache-size", "8M", "--decoded-cache-size", "4M"];
    let Some(m) = Mount::with(&opts, write) else {
        return;
    };
    let r = prefetch(&m.mp, &["-j", "1"]);
    assert!(!r.ok(), "{r:?}");
    assert!(
        r.stdout.starts_with("prefetched 1 of 2 tensors (1 MiB)"),
        "{r:?}"
    );
    assert!(r.stdout.trim_end().ends_with("; 1 failed"), "{r:?}");
    // Beside the note that the tensors chosen do not all fit in the cache.
    let errors: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| !l.contains(": note: "))
        .collect();
    assert_eq!(
        errors,
        ["ztensor-mount prefetch: big: No space left on device (os error 28)"],
        "{}",
        r.stderr
    );
    assert!(m.read("small") == small, "small's bytes");
    m.unmount_ok();
}
