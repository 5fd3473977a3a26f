//! Remote mounts from the servers people have at hand, through the real
//! binary: a plain web server that ignores Range (Python's `http.server`
//! handler), and HTTPS with a certificate of a private CA (the Range
//! server of `tests/python/range_server.py` behind TLS,
//! `tests/python/tls_server.py`, with a CA and certificates made there).
//! Every server is started here on 127.0.0.1 and a free port, and exits
//! when the test drops it (its stdin closes) or the test process dies.
//!
//! Needs the tests' venv (`cryptography` comes with moto): without it the
//! tests skip, or fail when CI=true.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::Mount;
use support::python::Python;
use support::server::Server;
use ztensor_mount::formats::zt_v01::DType;
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};

fn python(what: &str, module: &str) -> Option<Python> {
    Python::from_env().require(
        &format!("python with {what} (scripts/setup.sh)"),
        &format!("import {module}"),
        |_| Ok(()),
    )
}

/// A server process of the test's own: it exits when its stdin closes
/// (this is dropped, or the test process dies); killed and reaped on drop.
impl Server {
    /// Python's `http.server` file handler (what `python3 -m http.server
    /// --bind 127.0.0.1` serves with: no Range, no ETag) over `dir`.
    fn plain(py: &Python, dir: &Path) -> Server {
        let mut cmd = py.cmd();
        cmd.args([
            "-c",
            "import functools, http.server, sys, threading\n\
             h = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n\
             h.func.log_message = lambda *a: None\n\
             s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), h)\n\
             s.daemon_threads = True\n\
             s.handle_error = lambda *a: None\n\
             threading.Thread(target=s.serve_forever, daemon=True).start()\n\
             print('PORT %d' % s.server_address[1], flush=True)\n\
             sys.stdin.read()\n",
        ])
        .arg(dir);
        Server::spawn(cmd)
    }

    /// The Range server behind TLS with a certificate of `kind` (good,
    /// expired, wronghost); its CA is written to `certs/ca.pem`.
    fn tls(py: &Python, dir: &Path, certs: &Path, kind: &str) -> Server {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/tls_server.py");
        let mut cmd = py.cmd();
        cmd.arg(script).arg(dir).arg(certs).arg(kind);
        Server::spawn(cmd)
    }
}

/// Tensors' names and bytes.
type Tensors = Vec<(String, Vec<u8>)>;

/// A v0.1 file of `n` bytes of tensors (a raw one and a zstd one); their
/// names and bytes.
fn write_model(path: &Path, n: usize) -> Tensors {
    let mut w = Writer::create(path).unwrap();
    let raw = support::compressible(1, n / 2);
    let packed = support::compressible(2, n / 2);
    w.add(
        "raw",
        DType::Uint8,
        &[raw.len() as u64],
        &raw,
        &Options::default(),
    )
    .unwrap();
    let zstd = Options {
        compression: Compression::Zstd {
            level: 1,
            frame_size: 64 << 10,
        },
        ..Options::default()
    };
    w.add(
        "packed",
        DType::Uint8,
        &[packed.len() as u64],
        &packed,
        &zstd,
    )
    .unwrap();
    w.finish().unwrap();
    vec![("raw".into(), raw), ("packed".into(), packed)]
}

/// A scratch mount with a folder `files/` holding `model.zt` of `n` bytes.
fn scratch_with_model(n: usize) -> Option<(Mount, PathBuf, Tensors)> {
    let m = Mount::scratch()?;
    let files = m.scratch_path("files");
    std::fs::create_dir(&files).unwrap();
    let tensors = write_model(&files.join("model.zt"), n);
    Some((m, files, tensors))
}

fn assert_serves(m: &Mount, tensors: &[(String, Vec<u8>)]) {
    for (name, bytes) in tensors {
        assert!(m.read(name) == *bytes, "{name}: wrong bytes");
    }
}

/// The one line a refused mount printed, checked to be one line.
fn one_line(r: &support::Run) -> String {
    assert!(!r.ok(), "mounted, but should have been refused");
    let err = r.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    err.to_string()
}

#[test]
fn a_small_object_from_a_server_that_ignores_range_is_fetched_whole_and_served() {
    let Some(py) = python("http.server", "http.server") else {
        return;
    };
    let Some((mut m, files, tensors)) = scratch_with_model(600 << 10) else {
        return;
    };
    let srv = Server::plain(&py, &files);
    let url = format!("http://127.0.0.1:{}/model.zt", srv.port);
    m.mount(
        Path::new(&url),
        &["--cache-dir", made(&m, "cache").to_str().unwrap()],
    );
    assert_serves(&m, &tensors);
    let stats = m.stats();
    let size = std::fs::metadata(files.join("model.zt")).unwrap().len();
    assert_eq!(
        stats["remote_fetched_bytes"].as_u64(),
        Some(size),
        "{stats}"
    );
    assert_eq!(stats["remote_cached_bytes"].as_u64(), Some(size), "{stats}");
    // The ranged GETs at open (each answered with all of the object),
    // then one GET of all of it; none after.
    let requests = stats["remote_requests"].as_u64().unwrap();
    assert!(requests <= 4, "{stats}");
    assert_serves(&m, &tensors);
    assert_eq!(m.stat_u64("remote_requests"), requests);
    m.unmount_ok();
}

#[test]
fn a_large_object_from_a_server_that_ignores_range_is_refused_in_one_line() {
    let Some(py) = python("http.server", "http.server") else {
        return;
    };
    let Some((mut m, files, _)) = scratch_with_model(3 << 20) else {
        return;
    };
    let srv = Server::plain(&py, &files);
    let url = format!("http://127.0.0.1:{}/model.zt", srv.port);
    let r = m.run(
        Path::new(&url),
        &[
            "--index-memory",
            "1M",
            "--cache-dir",
            made(&m, "cache").to_str().unwrap(),
        ],
    );
    let err = one_line(&r);
    assert!(err.contains("ignores Range requests"), "{err}");
    assert!(err.contains("honours Range"), "{err}");
    assert_eq!(err.matches(&url).count(), 1, "the URL once: {err}");
    assert!(!m.is_mounted());
}

#[test]
fn https_with_a_private_ca_is_refused_naming_the_certificate_then_served_with_the_ca() {
    let Some(py) = python("cryptography", "cryptography") else {
        return;
    };
    let Some((mut m, files, tensors)) = scratch_with_model(300 << 10) else {
        return;
    };
    let certs = m.scratch_path("certs");
    let cache = made(&m, "cache");
    let cache = cache.to_str().unwrap();
    let srv = Server::tls(&py, &files, &certs, "good");
    let url = format!("https://127.0.0.1:{}/model.zt", srv.port);
    let ca = certs.join("ca.pem");

    // Without the CA: one line naming the certificate problem.
    let err = one_line(&m.run(Path::new(&url), &["--cache-dir", cache]));
    assert!(err.contains("unknown authority"), "{err}");
    assert!(
        err.contains("--ca-file") && err.contains("SSL_CERT_FILE"),
        "{err}"
    );

    // With --ca-file: served.
    m.mount(
        Path::new(&url),
        &["--cache-dir", cache, "--ca-file", ca.to_str().unwrap()],
    );
    assert_serves(&m, &tensors);
    m.unmount_ok();

    // With SSL_CERT_FILE, as curl and Python take it: served too (a new
    // cache directory, so that the bytes are fetched again).
    let cache2 = made(&m, "cache2");
    let mut cmd = Command::new(support::bin());
    cmd.arg(&url)
        .arg(&m.mp)
        .arg("--log-file")
        .arg(&m.log)
        .arg("--cache-dir")
        .arg(&cache2)
        .env("SSL_CERT_FILE", &ca);
    let r = support::run_with_timeout(&mut cmd, std::time::Duration::from_secs(20));
    assert!(r.ok(), "SSL_CERT_FILE: {}", r.stderr);
    m.pid = support::daemon_pids(&m.mp).into_iter().max();
    assert_serves(&m, &tensors);
    m.unmount_ok();
}

#[test]
fn an_expired_certificate_and_one_for_another_host_are_named() {
    let Some(py) = python("cryptography", "cryptography") else {
        return;
    };
    let Some((mut m, files, _)) = scratch_with_model(64 << 10) else {
        return;
    };
    for (kind, says) in [
        ("expired", "has expired"),
        ("wronghost", "for another host name"),
    ] {
        let certs = m.scratch_path(&format!("certs-{kind}"));
        let srv = Server::tls(&py, &files, &certs, kind);
        let url = format!("https://127.0.0.1:{}/model.zt", srv.port);
        let ca = certs.join("ca.pem");
        let r = m.run(
            Path::new(&url),
            &[
                "--cache-dir",
                made(&m, "cache").to_str().unwrap(),
                "--ca-file",
                ca.to_str().unwrap(),
            ],
        );
        let err = one_line(&r);
        assert!(err.contains(says), "{kind}: {err}");
        assert!(!m.is_mounted());
    }
}

/// A new directory in `m`'s scratch space.
fn made(m: &Mount, name: &str) -> PathBuf {
    let p = m.scratch_path(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}
