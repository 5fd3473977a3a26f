//! The hostile corpus (tests/hostile/) given to the real daemon. Files the
//! library refuses: the mount exits non-zero within 5 s with one line naming
//! the file, no panic text, and no mount left. Files with a data-level fault:
//! the mount works, the bad tensor's reads fail with EIO, its neighbour reads
//! right and the daemon lives on.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{Mount, run_with_timeout};
use ztensor_mount::formats::zt_v01::ZtFile;

fn corpus() -> Vec<(PathBuf, String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile");
    let tsv = std::fs::read_to_string(dir.join("EXPECTED.tsv")).expect("EXPECTED.tsv");
    tsv.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.splitn(3, '\t').collect();
            assert_eq!(f.len(), 3, "bad EXPECTED.tsv line {l:?}");
            (dir.join(f[0]), f[1].to_string(), f[2].to_string())
        })
        .collect()
}

fn is_data_level(kind: &str) -> bool {
    matches!(kind, "Data" | "Unsupported" | "Unverifiable")
}

#[test]
fn structurally_broken_files_are_refused_with_one_line() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let mut checked = 0;
    for (file, kind, substring) in corpus().into_iter().filter(|c| !is_data_level(&c.1)) {
        let r = m.run(&file, &[]);
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!r.ok(), "{name}: mount succeeded but the file is {kind}");
        assert!(
            r.elapsed < Duration::from_secs(5),
            "{name}: took {:?}",
            r.elapsed
        );
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{name}: want one line, got {:?}", r.stderr);
        assert!(
            lines[0].contains(&name),
            "{name}: message does not name the file: {}",
            lines[0]
        );
        assert!(
            lines[0].contains(&substring),
            "{name}: message lacks {substring:?}: {}",
            lines[0]
        );
        assert!(
            !r.stderr.contains("panicked"),
            "{name}: panic text: {}",
            r.stderr
        );
        assert!(!m.is_mounted(), "{name}: a mount was left behind");
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} structural hostile files");
}

#[test]
fn data_faults_fail_only_their_tensor() {
    let corpus: Vec<_> = corpus()
        .into_iter()
        .filter(|c| is_data_level(&c.1))
        .collect();
    assert!(corpus.len() >= 10, "data-level corpus too small");
    for (file, kind, substring) in corpus {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        m.mount(&file, &[]);
        // The healthy neighbour reads exactly what the library reads.
        let zt = ZtFile::open(&file).unwrap();
        let ok = zt
            .catalog()
            .get("ok")
            .expect("corpus files hold a tensor named ok");
        assert_eq!(
            m.read("ok"),
            zt.read_all(ok).unwrap()[0],
            "{name}: neighbour bytes"
        );
        let side = m.json("bad.json");
        match kind.as_str() {
            "Data" => {
                let data_path = side["path"].as_str().expect("path").to_string();
                let target = if side["parts"].is_array() {
                    format!("{data_path}/values")
                } else {
                    data_path
                };
                let err = std::fs::read(m.path(&target)).expect_err("bad tensor must not read");
                assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
                // Again: the failure is sticky, not a one-off.
                let err = std::fs::read(m.path(&target)).expect_err("bad tensor must not read");
                assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
                let log = m.log_text();
                assert!(
                    log.contains("\"bad\"") && log.contains(&substring),
                    "{name}: log lacks the reason {substring:?}:\n{log}"
                );
                assert!(m.stat_u64("errors") >= 1, "{name}: errors not counted");
                // Without the log, .ztensor/errors says which tensor and why.
                let listed = String::from_utf8(m.read(".ztensor/errors")).unwrap();
                let hit = listed.lines().any(|l| {
                    let e: serde_json::Value = serde_json::from_str(l).unwrap();
                    e["tensor"] == "bad"
                        && e["error"].as_str().is_some_and(|w| w.contains(&substring))
                });
                assert!(hit, "{name}: .ztensor/errors lacks it:\n{listed}");
                let copied = support::copies_whole(&m.path(".ztensor/errors"));
                assert_eq!(String::from_utf8_lossy(&copied), listed, "{name}");
            }
            "Unsupported" => {
                assert_eq!(side["supported"], false, "{name}");
                let why = side["unsupported_reason"].as_str().unwrap_or_default();
                assert!(
                    why.contains(&substring),
                    "{name}: reason {why:?} lacks {substring:?}"
                );
                let e = std::fs::metadata(m.path("bad")).unwrap_err();
                assert_eq!(
                    e.raw_os_error(),
                    Some(libc::ENOENT),
                    "{name}: an unsupported tensor must have no data file ({e})"
                );
            }
            _ => {
                // Unknown checksum algorithm: served, and said to be unverified.
                let expect = zt.read_all(zt.catalog().get("bad").unwrap()).unwrap();
                assert_eq!(m.read("bad"), expect[0], "{name}");
                assert!(
                    m.log_text().contains("unknown algorithm"),
                    "{name}: log: {}",
                    m.log_text()
                );
            }
        }
        // Still alive and serving.
        assert_eq!(
            m.read("ok"),
            zt.read_all(ok).unwrap()[0],
            "{name}: neighbour after the fault"
        );
        assert!(m.is_mounted());
        m.unmount_ok();
    }
}

#[test]
fn missing_and_unreadable_files_fail_clearly() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let missing = m.scratch_path("nope.zt");
    let r = m.run(&missing, &[]);
    assert!(
        !r.ok() && r.stderr.contains("nope.zt") && r.stderr.lines().count() == 1,
        "{r:?}"
    );
    // A directory is not a file.
    let dir = m.scratch_path("adir.zt");
    std::fs::create_dir(&dir).unwrap();
    let r = run_with_timeout(
        std::process::Command::new(support::bin())
            .arg(&dir)
            .arg(&m.mp),
        Duration::from_secs(5),
    );
    assert!(!r.ok() && r.stderr.contains("adir.zt"), "{r:?}");
    assert!(!m.is_mounted());
}

#[test]
fn a_file_without_read_permission_fails_clearly() {
    use std::os::unix::fs::PermissionsExt;
    let Some(m) = Mount::scratch() else { return };
    let zt = m.scratch_path("secret.zt");
    let mut w = ztensor_mount::formats::zt_v01::writer::Writer::create(&zt).unwrap();
    w.add(
        "a",
        ztensor_mount::formats::zt_v01::DType::Uint8,
        &[1],
        &[1],
        &Default::default(),
    )
    .unwrap();
    w.finish().unwrap();
    std::fs::set_permissions(&zt, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Root reads anything: run the daemon as nobody then (setpriv, util-linux).
    // SAFETY: geteuid takes nothing and cannot fail.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        for p in [m.dir.path(), m.mp.as_path()] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut c = std::process::Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            support::bin(),
        ]);
        c
    } else {
        std::fs::set_permissions(&zt, std::fs::Permissions::from_mode(0o000)).unwrap();
        std::process::Command::new(support::bin())
    };
    let r = run_with_timeout(cmd.arg(&zt).arg(&m.mp), Duration::from_secs(5));
    assert!(!r.ok(), "{r:?}");
    assert!(
        r.stderr.contains("secret.zt") && r.stderr.contains("Permission denied"),
        "{r:?}"
    );
    assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
    assert!(!m.is_mounted());
}

/// A safetensors file of `n` one-byte tensors (`layer.K.weight`).
/// Runs `cmd` to its end: (its wait status, its stderr, its peak RSS in
/// bytes, from the rusage wait4 gives, which Child::wait does not).
fn run_measured(cmd: &mut std::process::Command) -> (i32, String, u64) {
    // Reaped by wait4 below.
    #[allow(clippy::zombie_processes)]
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stderr = child.stderr.unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet waited for; both pointers
    // are to live locals of the right types.
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(got, pid, "wait4: {}", std::io::Error::last_os_error());
    (status, text, ru.ru_maxrss as u64 * 1024)
}

fn many_tensor_safetensors(path: &Path, n: usize) -> u64 {
    safetensors_of_bytes(path, n, |k| format!("layer.{k}.weight"))
}

/// A safetensors file of `n` one-byte U8 tensors, tensor k named
/// `name(k)` and holding k % 256: the length of its header.
fn safetensors_of_bytes(path: &Path, n: usize, name: impl Fn(usize) -> String) -> u64 {
    let mut header = String::with_capacity(n * 72);
    header.push('{');
    for k in 0..n {
        if k > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            r#""{}":{{"dtype":"U8","shape":[1],"data_offsets":[{k},{}]}}"#,
            name(k),
            k + 1
        ));
    }
    header.push('}');
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend((0..n).map(|k| k as u8));
    std::fs::write(path, &b).unwrap();
    header.len() as u64
}

/// `--index-memory` bounds what a file's index takes in memory, counted
/// as it is parsed: a safetensors header of 120 000 tensors (9 MB) under a
/// 16 MiB limit is refused in one line, and the refusing process peaks
/// within the limit plus its header and the binary's own; with room to
/// mount, the daemon's peak stays within what the limit counts for it.
#[test]
fn index_memory_bounds_a_large_safetensors_header() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let path = m.scratch_path("many.safetensors");
    let n = 120_000;
    let header = many_tensor_safetensors(&path, n);
    // Refused: its peak (ru_maxrss of the command, which parses the index
    // before it forks) is the limit's, not the index's.
    let limit: u64 = 16 << 20;
    let (status, text, peak) = run_measured(
        std::process::Command::new(support::bin())
            .arg(&path)
            .arg(&m.mp)
            .args(["--index-memory", "16M"]),
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 1,
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].contains("many.safetensors") && lines[0].contains("--index-memory"),
        "{text}"
    );
    assert!(!m.is_mounted());
    eprintln!(
        "refused under --index-memory 16M: peak {} MiB ({n} tensors, header {} MiB)",
        peak >> 20,
        header >> 20
    );
    assert!(
        peak <= limit + header + (48 << 20),
        "peak {peak} bytes refusing a {header}-byte header under a {limit}-byte limit"
    );

    // Mounted with room: what the measure counts bounds the daemon.
    let opened = ztensor_mount::formats::open(&path, Default::default()).unwrap();
    let cost = ztensor_mount::catalog::cost::catalog_cost(&opened.catalog);
    drop(opened);
    m.mount(&path, &[]);
    let pid = m.pid.expect("daemon pid");
    assert_eq!(m.read("layer.7.weight"), [7]);
    assert_eq!(
        m.read(&format!("layer.{}.weight", n - 1)),
        [((n - 1) % 256) as u8]
    );
    let hwm = support::status_kib(pid, "VmHWM:").unwrap() * 1024;
    eprintln!(
        "mounted: daemon peak {} MiB, the index counted as {} MiB",
        hwm >> 20,
        cost >> 20
    );
    assert!(
        hwm <= cost + header + (48 << 20),
        "daemon peak {hwm} bytes for an index counted as {cost}"
    );
    m.unmount_ok();
}

/// With long names, what the measure counts for an index still bounds the
/// daemon, `.ztensor/index.json` read whole included: 20 000 tensors of
/// 1000-byte names (each name is held many times over: the catalog, the
/// tree, the views, the sidecars, the index's text).
#[test]
fn index_memory_bounds_an_index_of_long_names_read_whole() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let path = m.scratch_path("long.safetensors");
    let n = 20_000;
    safetensors_of_bytes(&path, n, |k| format!("{k:05}.{}", "y".repeat(994)));
    let opened = ztensor_mount::formats::open(&path, Default::default()).unwrap();
    let cost = ztensor_mount::catalog::cost::catalog_cost(&opened.catalog);
    drop(opened);
    let limit = (cost + cost / 4).to_string();
    m.mount(&path, &["--cache-size", "1M", "--index-memory", &limit]);
    let pid = m.pid.expect("daemon pid");
    let listed = std::io::copy(
        &mut std::fs::File::open(m.path(".ztensor/index.json")).unwrap(),
        &mut std::io::sink(),
    )
    .unwrap();
    assert!(listed >= 1000 * n as u64, "index.json of {listed} bytes");
    // Past 255 bytes a name's file is named by an escape the index gives.
    let index = m.json(".ztensor/index.json");
    let seventh = &index["tensors"][7];
    assert_eq!(seventh["name"], format!("{:05}.{}", 7, "y".repeat(994)));
    assert_eq!(m.read(seventh["path"].as_str().unwrap()), [7]);
    let hwm = support::status_kib(pid, "VmHWM:").unwrap() * 1024;
    eprintln!(
        "{n} tensors of 1000-byte names: daemon peak {} MiB, the index counted as {} MiB",
        hwm >> 20,
        cost >> 20
    );
    assert!(
        hwm <= cost + (1 << 20) + (64 << 20),
        "daemon peak {hwm} bytes for an index counted as {cost}"
    );
    m.unmount_ok();
}

/// `--index-memory` bounds a GGUF header of many small values: a token
/// list of a million empty strings (8 MB in the file) was counted at 48
/// bytes a value where it takes about 110 at mount (the crate's value and
/// the JSON value of the index), so a limit the count allowed let the
/// mounting command peak at 2.5 times it. Mounted under exactly the limit
/// it counts, the command's peak and the daemon's stay within it plus the
/// file and the binary's own.
#[test]
fn index_memory_bounds_a_gguf_header_of_many_values() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let path = m.scratch_path("tokens.gguf");
    let n: u64 = 1_000_000;
    // GGUF v3, 1 tensor, 1 key: an array (9) of n strings (8), all empty;
    // then the tensor info "a", F32 [4] at 0, padding to 32, its data.
    let mut bytes = b"GGUF".to_vec();
    for v in [
        3u32.to_le_bytes().to_vec(),
        1u64.to_le_bytes().to_vec(),
        1u64.to_le_bytes().to_vec(),
    ] {
        bytes.extend(v);
    }
    let key = "tokenizer.ggml.tokens";
    bytes.extend((key.len() as u64).to_le_bytes());
    bytes.extend(key.as_bytes());
    bytes.extend(9u32.to_le_bytes());
    bytes.extend(8u32.to_le_bytes());
    bytes.extend(n.to_le_bytes());
    bytes.resize(bytes.len() + 8 * n as usize, 0);
    bytes.extend(1u64.to_le_bytes());
    bytes.extend(b"a");
    bytes.extend(1u32.to_le_bytes());
    bytes.extend(4u64.to_le_bytes());
    bytes.extend(0u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.resize(bytes.len().next_multiple_of(32) + 16, 0);
    let file = bytes.len() as u64;
    std::fs::write(&path, &bytes).unwrap();
    drop(bytes);
    // What the limit counts, from the refusal under a limit of 1 byte
    // (to a tenth of its unit, taken up to the next tenth).
    let r = m.run(&path, &["--index-memory", "1"]);
    assert!(!r.ok(), "mounted under --index-memory 1");
    let cost = r
        .stderr
        .split("would take about ")
        .nth(1)
        .and_then(at_most)
        .unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(cost >= n * 100, "{n} values counted as {cost} bytes");
    let (status, text, peak) = run_measured(
        std::process::Command::new(support::bin())
            .arg(&path)
            .arg(&m.mp)
            .arg("--log-file")
            .arg(&m.log)
            .args(["--cache-size", "1M", "--index-memory", &cost.to_string()]),
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{text}"
    );
    let daemon = support::daemon_pids(&m.mp).into_iter().max();
    m.pid = daemon;
    // The index lists every value ("", at least 3 bytes each). Counted,
    // not parsed: this test process's own peak is what a later spawn of
    // another test measures (a vfork child's maxrss is its parent's).
    let listed = std::io::copy(
        &mut std::fs::File::open(m.path(".ztensor/index.json")).unwrap(),
        &mut std::io::sink(),
    )
    .unwrap();
    assert!(listed >= 3 * n, "index.json of {listed} bytes");
    assert_eq!(m.read("a"), [0; 16]);
    let hwm = support::status_kib(daemon.expect("daemon pid"), "VmHWM:").unwrap() * 1024;
    eprintln!(
        "{n} values counted as {} MiB: the command peaked at {} MiB, the daemon at {} MiB",
        cost >> 20,
        peak >> 20,
        hwm >> 20
    );
    let bound = cost + file + (48 << 20);
    assert!(
        peak <= bound,
        "the command peaked at {peak} bytes, over {bound}"
    );
    assert!(
        hwm <= bound,
        "the daemon peaked at {hwm} bytes, over {bound}"
    );
    m.unmount_ok();
}

/// The bytes a message's `N.N MiB` (or KiB, GiB) stands for, taken up to
/// the next tenth of its unit: no fewer than the count it rounds.
fn at_most(said: &str) -> Option<u64> {
    let mut words = said.split(' ');
    let tenths = (words.next()?.parse::<f64>().ok()? * 10.0).floor() as u64 + 1;
    let unit: u64 = match words.next()? {
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    Some(tenths * unit / 10)
}
