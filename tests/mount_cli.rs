//! The mount command as a user runs it: background mode returns only once
//! mounted, failures are one clear line and leave no mount, signals and
//! `-u` unmount, a killed daemon's mount can be cleared, `-o` lists work.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{Mount, Run, alive, bin, daemon_pids, is_mounted, signal, wait_until};
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{Algorithm, DType};

fn payload() -> Vec<u8> {
    (0..4096u32).flat_map(|i| (i * 3).to_le_bytes()).collect()
}

/// A small valid file: a raw and a zstd tensor.
fn write_small(path: &Path) {
    let mut w = Writer::create(path).unwrap();
    w.add("w", DType::Uint32, &[4096], &payload(), &Options::default())
        .unwrap();
    let z = Options {
        compression: Compression::zstd(),
        ..Options::default()
    };
    w.add("z", DType::Uint32, &[4096], &payload(), &z).unwrap();
    w.finish().unwrap();
}

fn scratch_with_file() -> Option<(Mount, PathBuf)> {
    let m = Mount::scratch()?;
    let zt = m.scratch_path("test.zt");
    write_small(&zt);
    Some((m, zt))
}

/// A failed run: non-zero exit, one line on stderr, no panic text.
fn assert_clean_failure(r: &Run, what: &str) -> String {
    assert!(!r.ok(), "{what}: succeeded: {r:?}");
    let err = r.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "{what}: want one line, got {err:?}");
    assert!(err.starts_with("ztensor-mount: "), "{what}: {err:?}");
    assert!(!err.contains("panicked"), "{what}: {err:?}");
    assert!(!r.stderr.contains("RUST_BACKTRACE"), "{what}: {err:?}");
    err.to_string()
}

/// How many mounts sit on `mp` (a stack counts each).
fn mounts_on(mp: &Path) -> usize {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some(mp.to_str().unwrap()))
        .count()
}

fn assert_not_mounted(m: &Mount, what: &str) {
    assert!(
        !m.is_mounted(),
        "{what}: left a mount on {}",
        m.mp.display()
    );
    // Give a failed daemon a moment to go away, then insist it did.
    let gone = wait_until(Duration::from_secs(3), || daemon_pids(&m.mp).is_empty());
    assert!(
        gone,
        "{what}: daemon still running: {:?}",
        daemon_pids(&m.mp)
    );
}

#[test]
fn background_mode_returns_only_once_mounted() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    for round in 0..3 {
        let r = m.run(&zt, &[]);
        assert!(r.ok(), "round {round}: {r:?}");
        assert!(r.stderr.is_empty() && r.stdout.is_empty(), "{r:?}");
        // No waiting: the mount must already be there and serve.
        assert!(m.is_mounted(), "round {round}: not mounted after exit 0");
        assert!(std::fs::read(m.path("w")).unwrap() == payload());
        assert!(std::fs::read(m.path("z")).unwrap() == payload());
        let pid = m.pid.expect("daemon pid");
        // Detached: the daemon leads its own session.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        assert_eq!(fields[3], pid.to_string(), "session id of the daemon");
        m.unmount_ok();
        assert!(wait_until(Duration::from_secs(5), || !alive(pid)));
    }
    let log = m.log_text();
    assert!(log.matches(": mounted ").count() >= 3, "log: {log}");
    assert!(log.contains("2 tensors"), "log: {log}");
}

#[test]
fn bad_files_fail_fast_with_one_line_and_no_mount() {
    let _one_at_a_time = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let text = m.scratch_path("notes.txt");
    std::fs::write(&text, "hello, this is not a tensor file\n").unwrap();
    let empty = m.scratch_path("empty.zt");
    std::fs::write(&empty, b"").unwrap();
    let magic_only = m.scratch_path("magic_only.zt");
    std::fs::write(&magic_only, b"ZTEN0001\x00\x00\x00\x00\x00\x00\x00\x00").unwrap();
    let truncated = m.scratch_path("truncated.zt");
    write_small(&truncated);
    let full = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &full[..full.len() - 5]).unwrap();
    let missing = m.scratch_path("missing.zt");
    let dir = m.scratch_path("a_directory");
    std::fs::create_dir(&dir).unwrap();
    for file in [&text, &empty, &magic_only, &truncated, &missing, &dir] {
        let r = m.run(file, &[]);
        let what = file.display().to_string();
        let err = assert_clean_failure(&r, &what);
        assert_eq!(r.status.code(), Some(1), "{what}: exit code");
        assert!(
            r.elapsed < Duration::from_secs(5),
            "{what}: took {:?}",
            r.elapsed
        );
        let base = file.file_name().unwrap().to_str().unwrap();
        assert!(
            err.contains(base),
            "{what}: message does not name it: {err}"
        );
        assert_not_mounted(&m, &what);
    }
}

/// A newline in the file's path (any control character) is written as
/// `%0A`, as the tree writes one in a name: the refusal stays one line,
/// and so does each record of the log.
#[test]
fn a_newline_in_the_files_path_keeps_the_error_and_the_log_on_one_line() {
    let _one_at_a_time = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let bad = m.scratch_path("bad\nname.zt");
    std::fs::write(&bad, b"").unwrap();
    let err = assert_clean_failure(&m.run(&bad, &[]), "a newline");
    assert!(err.contains("bad%0Aname.zt"), "{err}");
    let good = m.scratch_path("good\nmodel.zt");
    write_small(&good);
    let r = m.run(&good, &[]);
    assert!(r.ok(), "{r:?}");
    m.unmount_ok();
    let text = m.log_text();
    assert!(text.contains("good%0Amodel.zt"), "{text}");
    assert!(!text.contains("ERROR"), "a mount that worked: {text}");
    assert!(
        text.lines().all(|l| l.starts_with("20")),
        "a record over two lines: {text}"
    );
}

#[test]
fn missing_or_unusable_mountpoint_fails_clearly() {
    let _one_at_a_time = support::serial();
    let Some((m, zt)) = scratch_with_file() else {
        return;
    };
    let run = |mp: &Path| {
        support::run_with_timeout(
            Command::new(bin()).arg(&zt).arg(mp),
            Duration::from_secs(10),
        )
    };
    let nowhere = m.scratch_path("no/such/dir");
    let r = run(&nowhere);
    let err = assert_clean_failure(&r, "missing mountpoint");
    assert!(
        err.contains("no/such/dir") && err.contains("mountpoint"),
        "{err}"
    );
    let file = m.scratch_path("plain_file");
    std::fs::write(&file, b"x").unwrap();
    let r = run(&file);
    let err = assert_clean_failure(&r, "file as mountpoint");
    assert!(err.contains("not a directory"), "{err}");
    assert!(!is_mounted(&file) && !is_mounted(&nowhere));
}

#[test]
fn mounting_twice_on_one_mountpoint_fails_and_keeps_the_first() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    m.mount(&zt, &[]);
    let first = m.pid;
    let r = support::run_with_timeout(
        Command::new(bin()).arg(&zt).arg(&m.mp),
        Duration::from_secs(10),
    );
    let err = assert_clean_failure(&r, "second mount");
    assert!(err.contains("already a mount point"), "{err}");
    assert_eq!(mounts_on(&m.mp), 1, "exactly one mount on the mountpoint");
    assert_eq!(daemon_pids(&m.mp), first.into_iter().collect::<Vec<_>>());
    assert!(std::fs::read(m.path("w")).unwrap() == payload());
}

/// Options of remote sources given with a local file draw a warning each
/// (they are ignored), and so does a cache larger than the machine; the
/// mount goes on.
#[test]
fn options_that_cannot_apply_are_warned_of() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    let r = m.run(
        &zt,
        &[
            "--revision",
            "v1",
            "--endpoint",
            "http://127.0.0.1:1",
            "--ca-file",
            "/x.pem",
        ],
    );
    assert!(r.ok(), "{r:?}");
    for option in ["--revision", "--endpoint", "--ca-file"] {
        let warning = format!(
            "ztensor-mount: warning: {option} is for a URL; {} is a local file",
            zt.display()
        );
        assert!(r.stderr.contains(&warning), "{option}: {}", r.stderr);
    }
    assert!(std::fs::read(m.path("w")).unwrap() == payload());
    m.unmount_ok();
    // A cache larger than the machine: warned of, and mounted.
    let r = m.run(&zt, &["--cache-size", "64T"]);
    assert!(r.ok(), "{r:?}");
    assert!(
        r.stderr
            .contains("warning: --cache-size 70368744177664 is more than this machine's memory"),
        "{}",
        r.stderr
    );
    m.unmount_ok();
}

/// Two mounts on one mountpoint at once: one mounts, the other is refused
/// (both used to find it free and stack two mounts there).
#[test]
fn two_mounts_at_once_on_one_mountpoint_leave_one() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    for round in 0..4 {
        let at_once = |_| {
            let (zt, mp, log) = (zt.clone(), m.mp.clone(), m.log.clone());
            std::thread::spawn(move || {
                support::run_with_timeout(
                    Command::new(bin())
                        .arg(&zt)
                        .arg(&mp)
                        .arg("--log-file")
                        .arg(&log),
                    Duration::from_secs(20),
                )
            })
        };
        let runs: Vec<Run> = (0..2)
            .map(at_once)
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let (ok, refused): (Vec<&Run>, Vec<&Run>) = runs.iter().partition(|r| r.ok());
        assert_eq!((ok.len(), refused.len()), (1, 1), "round {round}: {runs:?}");
        let err = assert_clean_failure(refused[0], "the mount beside another");
        assert!(
            err.contains(
                "another process holds a lock on it (another ztensor-mount mounting there?)"
            ) || err.contains("already a mount point"),
            "round {round}: {err}"
        );
        assert_eq!(
            mounts_on(&m.mp),
            1,
            "round {round}: one mount on the mountpoint"
        );
        assert!(std::fs::read(m.path("w")).unwrap() == payload());
        m.pid = daemon_pids(&m.mp).into_iter().next();
        m.unmount_ok();
    }
}

#[test]
fn unusable_cache_dir_or_log_file_fails_clearly() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    let missing = m.scratch_path("no_cache_here");
    let file = m.scratch_path("cache_is_a_file");
    std::fs::write(&file, b"x").unwrap();
    for dir in [&missing, &file] {
        let r = m.run(&zt, &["--cache-dir", dir.to_str().unwrap()]);
        let err = assert_clean_failure(&r, "bad cache dir");
        assert!(
            err.contains("cache directory") && err.contains(dir.to_str().unwrap()),
            "{err}"
        );
        assert_not_mounted(&m, "bad cache dir");
    }
    // The mountpoint, or a folder in it: hidden by the mount, which would
    // wait on itself for every file made there.
    let inside = m.mp.join("sub");
    std::fs::create_dir(&inside).unwrap();
    for dir in [m.mp.clone(), inside.clone()] {
        let r = m.run(&zt, &["--cache-dir", dir.to_str().unwrap()]);
        let err = assert_clean_failure(&r, "cache dir in the mountpoint");
        let said = format!(
            "ztensor-mount: cache directory {} is inside the mountpoint {}, which the mount \
             hides (choose another with --cache-dir)",
            dir.display(),
            m.mp.display()
        );
        assert_eq!(err, said);
        assert_not_mounted(&m, "cache dir in the mountpoint");
    }
    std::fs::remove_dir(&inside).unwrap();
    // The same through -o.
    let r = m.run(&zt, &["-o", &format!("cache_dir={}", missing.display())]);
    assert!(assert_clean_failure(&r, "-o cache_dir").contains("cache directory"));
    assert_not_mounted(&m, "-o cache_dir");
    // A log file that cannot be opened.
    let r = support::run_with_timeout(
        Command::new(bin())
            .arg(&zt)
            .arg(&m.mp)
            .args(["--log-file", "/nonexistent/dir/zt.log"]),
        Duration::from_secs(10),
    );
    let err = assert_clean_failure(&r, "bad log file");
    assert!(err.contains("/nonexistent/dir/zt.log"), "{err}");
    assert_not_mounted(&m, "bad log file");
    // A log file in the mountpoint: hidden by the mount.
    let hidden = m.mp.join("zt.log");
    let r = support::run_with_timeout(
        Command::new(bin())
            .arg(&zt)
            .arg(&m.mp)
            .arg("--log-file")
            .arg(&hidden),
        Duration::from_secs(10),
    );
    let err = assert_clean_failure(&r, "log file in the mountpoint");
    assert_eq!(
        err,
        format!(
            "ztensor-mount: log file {} is inside the mountpoint {}, which the mount hides",
            hidden.display(),
            m.mp.display()
        )
    );
    assert_not_mounted(&m, "log file in the mountpoint");
    // FIFOs nobody writes or reads: refused at once, not waited on.
    let fifo = m.scratch_path("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let r = support::run_with_timeout(
        Command::new(bin())
            .arg(&zt)
            .arg(&m.mp)
            .arg("--log-file")
            .arg(&fifo),
        Duration::from_secs(10),
    );
    let err = assert_clean_failure(&r, "a FIFO as log file");
    assert!(err.contains("log file") && err.contains("fifo"), "{err}");
    assert_not_mounted(&m, "a FIFO as log file");
    for args in [&[][..], &["info"], &["cat"]] {
        let mut cmd = Command::new(bin());
        cmd.args(args).arg(&fifo);
        if args.is_empty() {
            cmd.arg(&m.mp);
        } else if args == ["cat"] {
            cmd.arg("w");
        }
        let r = support::run_with_timeout(&mut cmd, Duration::from_secs(10));
        assert_eq!(r.status.code(), Some(1), "{args:?}: {r:?}");
        let err = r.stderr.trim_end();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("not a regular file"), "{args:?}: {err}");
    }
    assert_not_mounted(&m, "a FIFO as the .zt");
    // Empty paths are usage errors, not the current directory.
    for (o, why) in [
        ("cache_dir=", "is empty"),
        ("log_file=", "is empty"),
        ("allow_other,allow_root", "cannot be used together"),
        ("read_ahead_kb=4294967295", "at most"),
    ] {
        let r = support::run_with_timeout(
            Command::new(bin()).arg(&zt).arg(&m.mp).args(["-o", o]),
            Duration::from_secs(10),
        );
        assert_eq!(r.status.code(), Some(2), "-o {o}: {r:?}");
        assert!(r.stderr.contains(why), "-o {o}: {r:?}");
    }
    assert_not_mounted(&m, "empty paths");
}

#[test]
fn sigterm_sigint_and_sighup_each_unmount() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    for (sig, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        m.mount(&zt, &[]);
        let pid = m.pid.expect("daemon pid");
        assert!(std::fs::read(m.path("z")).unwrap() == payload());
        signal(pid, sig);
        let gone = wait_until(Duration::from_secs(5), || !m.is_mounted() && !alive(pid));
        assert!(
            gone,
            "{name}: mounted={} alive={} log:\n{}",
            m.is_mounted(),
            alive(pid),
            m.log_text()
        );
        assert!(
            m.log_text().contains(&format!("signal {sig}")),
            "{name}: {}",
            m.log_text()
        );
        // The mountpoint is an ordinary empty directory again.
        assert_eq!(std::fs::read_dir(&m.mp).unwrap().count(), 0, "{name}");
    }
}

#[test]
fn a_mountpoint_with_a_space_and_a_tab_is_tuned_and_unmounted_like_any() {
    // /proc/self/mountinfo escapes such paths (\040, \011): the daemon must
    // still find its mount's device, for its readahead and for aborting the
    // connection when a signal finds files open.
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    let mp = m.scratch_path("my model\tdir");
    std::fs::create_dir(&mp).unwrap();
    m.mp = mp;
    m.mount(&zt, &[]);
    assert!(m.read("w") == payload());
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(&m.mp).unwrap().dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let ra = std::fs::read_to_string(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"))
            .unwrap();
        assert_eq!(ra.trim(), "4096", "log:\n{}", m.log_text());
    }
    let pid = m.pid.expect("daemon pid");
    let f = std::fs::File::open(m.path("w")).unwrap();
    signal(pid, libc::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(pid) && !m.is_mounted()),
        "log:\n{}",
        m.log_text()
    );
    assert!(
        m.log_text().contains("aborting the connection"),
        "{}",
        m.log_text()
    );
    drop(f);
}

#[test]
fn dash_u_refuses_a_busy_mount_and_dash_u_dash_z_detaches_it() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    m.mount(&zt, &["--direct-io"]);
    let pid = m.pid.expect("daemon pid");
    let f = std::fs::File::open(m.path("z")).unwrap();
    let r = support::run_with_timeout(
        Command::new(bin()).arg("-u").arg(&m.mp),
        Duration::from_secs(10),
    );
    let err = assert_clean_failure(&r, "-u of a busy mount");
    assert!(err.contains("busy") && err.contains("-u -z"), "{err}");
    assert!(m.is_mounted(), "a refused -u unmounted it");
    // fusermount3's spelling, flags before the path.
    let r = support::run_with_timeout(
        Command::new(bin()).args(["-u", "-z"]).arg(&m.mp),
        Duration::from_secs(10),
    );
    assert!(r.ok(), "-u -z: {r:?}");
    assert!(!m.is_mounted(), "still mounted after -u -z");
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 4096).unwrap();
    assert!(
        buf == payload()[4096..8192],
        "the detached file read wrong bytes"
    );
    drop(f);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(pid)),
        "daemon outlived its detached mount; log:\n{}",
        m.log_text()
    );
    // -z without -u is a usage error, not a mount.
    let r = support::run_with_timeout(
        Command::new(bin()).arg("-z").arg(&zt).arg(&m.mp),
        Duration::from_secs(10),
    );
    let err = assert_clean_failure(&r, "-z without -u");
    assert!(err.contains("-u"), "{err}");
    assert!(!m.is_mounted());
}

#[test]
fn a_signal_to_a_detached_daemon_leaves_a_newer_mount_at_its_path_alone() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    m.mount(&zt, &["--direct-io"]);
    let old = m.pid.expect("daemon pid");
    let f = std::fs::File::open(m.path("z")).unwrap();
    let r = support::run_with_timeout(
        Command::new(bin()).args(["-u", "-z"]).arg(&m.mp),
        Duration::from_secs(10),
    );
    assert!(r.ok(), "-u -z: {r:?}");
    // The detached daemon lives on for its open file; a new mount takes
    // the path.
    m.mount(&zt, &[]);
    let new = m.pid.expect("new daemon pid");
    assert_ne!(old, new);
    signal(old, libc::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(old)),
        "the detached daemon outlived SIGTERM; log:\n{}",
        m.log_text()
    );
    assert!(
        m.is_mounted() && alive(new),
        "the old daemon's signal took down the new mount; log:\n{}",
        m.log_text()
    );
    assert!(std::fs::read(m.path("z")).unwrap() == payload());
    drop(f);
}

#[test]
fn a_signal_while_a_file_is_open_detaches_then_the_daemon_exits() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    m.mount(&zt, &["--direct-io"]);
    let pid = m.pid.expect("daemon pid");
    let f = std::fs::File::open(m.path("z")).unwrap();
    signal(pid, libc::SIGTERM);
    // The busy mount is detached from the tree at once...
    assert!(
        wait_until(Duration::from_secs(5), || !m.is_mounted()),
        "still mounted after SIGTERM with an open file; log:\n{}",
        m.log_text()
    );
    // ...while the open file keeps reading right for a moment (direct I/O:
    // from the daemon, not the page cache)...
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 8192).unwrap();
    assert!(buf == payload()[8192..12288]);
    // ...and a reader that never closes does not keep the daemon alive.
    assert!(
        wait_until(Duration::from_secs(10), || !alive(pid)),
        "daemon outlived SIGTERM with a file held open; log:\n{}",
        m.log_text()
    );
    let e = f.read_exact_at(&mut buf, 0).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
        "read after the daemon left: {e}"
    );
    assert!(m.log_text().contains("signal 15"), "{}", m.log_text());
}

#[test]
fn dash_u_unmounts_and_rejects_what_is_not_mounted() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    m.mount(&zt, &[]);
    let pid = m.pid.expect("daemon pid");
    // A link to the mount point is not followed, and -u says so.
    let link = m.scratch_path("link");
    std::os::unix::fs::symlink(&m.mp, &link).unwrap();
    let r = support::run_with_timeout(
        Command::new(bin()).arg("-u").arg(&link),
        Duration::from_secs(10),
    );
    let err = assert_clean_failure(&r, "-u of a link to the mount point");
    assert_eq!(
        err,
        format!(
            "ztensor-mount: cannot unmount {}: Invalid argument (os error 22) (a symbolic link to \
             {}: give the mount point itself)",
            link.display(),
            m.mp.display()
        )
    );
    assert!(m.is_mounted());
    // The type findmnt -t and umount -t go by, on both mount paths
    // (mount(2) as root here, fusermount3 otherwise).
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mp = m.mp.to_str().unwrap().to_owned();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mp.as_str()))
        .expect("the mount in mountinfo");
    assert!(line.contains(" - fuse.ztensor-mount "), "{line}");
    // A daemon keeps no directory of its caller busy.
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap(),
        Path::new("/")
    );
    m.unmount_ok();
    assert!(
        wait_until(Duration::from_secs(5), || !alive(pid)),
        "daemon stays"
    );
    assert!(m.log_text().contains("unmounted"), "{}", m.log_text());
    // Nothing mounted now: -u says so.
    let r = m.unmount();
    let err = assert_clean_failure(&r, "-u of a plain directory");
    assert!(err.contains("not a mount point"), "{err}");
    let r = support::run_with_timeout(
        Command::new(bin()).arg("-u").arg(m.scratch_path("absent")),
        Duration::from_secs(10),
    );
    assert_clean_failure(&r, "-u of a missing path");
    // -u without its path asks for the mount point, not for a FILE.
    for args in [&["-u"][..], &["-uz"], &["--unmount", "--lazy"]] {
        let r = support::run_with_timeout(Command::new(bin()).args(args), Duration::from_secs(10));
        assert_eq!(r.status.code(), Some(2), "{args:?}: {r:?}");
        assert_eq!(
            r.stderr.trim_end(),
            "ztensor-mount: -u needs the mount point: ztensor-mount -u [-z] MOUNTPOINT",
            "{args:?}"
        );
    }
    // Another kind of mount (as root, umount2 would take it): left alone.
    if !require_root() {
        return;
    }
    let tmp = m.scratch_path("tmpfs");
    std::fs::create_dir(&tmp).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&tmp)
        .status()
        .unwrap();
    assert!(mounted.success());
    let r = support::run_with_timeout(
        Command::new(bin()).arg("-u").arg(&tmp),
        Duration::from_secs(10),
    );
    let still = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(&format!(" {} ", tmp.display()));
    let _ = Command::new("umount").arg(&tmp).status();
    let err = assert_clean_failure(&r, "-u of a tmpfs");
    let said = format!(
        "ztensor-mount: cannot unmount {}: it is a tmpfs mount, not a FUSE one (unmount it \
         with umount)",
        tmp.display()
    );
    assert_eq!(err, said);
    assert!(still, "-u unmounted a tmpfs");
}

#[test]
fn dash_u_clears_the_mount_of_a_killed_daemon() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    m.mount(&zt, &[]);
    let pid = m.pid.expect("daemon pid");
    signal(pid, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(5), || !alive(pid)));
    // The dead mount stays: the kernel answers ENOTCONN (or ECONNABORTED,
    // depending on how far the connection's teardown got).
    assert!(m.is_mounted(), "a SIGKILLed daemon cannot unmount");
    let e = std::fs::metadata(m.path("w")).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
        "{e}"
    );
    // Mounting over it is refused, saying how to clear it (as a dead mount
    // when the kernel must ask the daemon, or as a mount point when it still
    // holds the root's attributes).
    let r = support::run_with_timeout(
        Command::new(bin()).arg(&zt).arg(&m.mp),
        Duration::from_secs(10),
    );
    let err = assert_clean_failure(&r, "a mount over a dead mount");
    assert!(
        (err.contains("daemon died") || err.contains("already a mount point"))
            && err.contains("ztensor-mount -u"),
        "{err}"
    );
    // -u of a dead mount works.
    m.unmount_ok();
    // And the mountpoint can be used again.
    m.mount(&zt, &[]);
    assert!(std::fs::read(m.path("z")).unwrap() == payload());
}

#[test]
fn dash_o_lists_and_flags_end_to_end() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    m.mount(&zt, &["-o", "ro,nosuid,cache_size=8M"]);
    assert_eq!(m.stat_u64("cache_limit"), 8 << 20);
    m.unmount_ok();

    // Repeated -o, dashes for underscores, generic flags ignored, owner set.
    m.mount(
        &zt,
        &[
            "-o",
            "nodev,noatime,x-systemd.automount,uid=1234,gid=4321",
            "-o",
            "cache-size=3M,threads=3,direct_io",
        ],
    );
    assert_eq!(m.stat_u64("cache_limit"), 3 << 20);
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(m.path("w")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 4321));
    assert!(std::fs::read(m.path("z")).unwrap() == payload());
    m.unmount_ok();

    // The long flag and -o together: the flag comes last and wins.
    m.mount(&zt, &["-o", "cache_size=8M", "--cache-size", "2M"]);
    assert_eq!(m.stat_u64("cache_limit"), 2 << 20);
    m.unmount_ok();

    for (args, needle) in [
        (vec!["-o", "bogus"], "bogus"),
        (vec!["-o", "cache_size=lots"], "lots"),
        (vec!["-o", "uid=me"], "uid"),
        (vec!["-o", "cache_size"], "cache_size"),
        (vec!["--cache-size", "512K"], "at least 1M"),
        (
            vec!["--index-memory", "0"],
            "index memory must be more than 0",
        ),
        (vec!["--threads", "x"], "threads"),
        (
            vec!["--threads", "0"],
            "threads must be from 1 to 64, not 0",
        ),
        (vec!["-o", "threads=100000"], "not 100000"),
        (
            vec!["-o", "max_read=4G"],
            "max_read=4G: must be a size from 4K to 16M",
        ),
    ] {
        let r = m.run(&zt, &args);
        assert!(!r.ok(), "{args:?}: accepted");
        assert_eq!(r.status.code(), Some(2), "{args:?}: usage errors exit 2");
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{args:?}: {}", r.stderr);
        assert_not_mounted(&m, &format!("{args:?}"));
    }
}

#[test]
fn an_index_over_its_memory_limit_is_refused_with_one_line() {
    let _one_at_a_time = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    // 2000 tensors: about 3 MiB decoded by the mount's own estimate.
    let zt = m.scratch_path("many.zt");
    let mut w = Writer::create(&zt).unwrap();
    for i in 0..2000 {
        w.add(
            &format!("t{i}"),
            DType::Uint8,
            &[4],
            &[1, 2, 3, 4],
            &Options::default(),
        )
        .unwrap();
    }
    w.finish().unwrap();
    for args in [
        &["--index-memory", "1M"][..],
        &["-o", "index_memory=1M"][..],
    ] {
        let r = m.run(&zt, args);
        let err = assert_clean_failure(&r, &format!("{args:?}"));
        assert_eq!(r.status.code(), Some(1), "{args:?}");
        assert!(
            err.contains("many.zt")
                && err.contains("the index would take about")
                && err.contains("(2000 entries, ")
                && err.contains("more than the 1 MiB allowed (--index-memory)"),
            "{args:?}: {err}"
        );
        assert_not_mounted(&m, &format!("{args:?}"));
    }
    m.mount(&zt, &["--index-memory", "16M"]);
    // The tensors and sidecars, .ztensor, and the three views' directories.
    assert_eq!(std::fs::read_dir(&m.mp).unwrap().count(), 4000 + 4);
    m.unmount_ok();
}

/// Kills a foreground daemon that a failing test left behind.
struct Fg(Child);

impl Drop for Fg {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn foreground_mode_serves_until_sigterm() {
    let _one_at_a_time = support::serial();
    let Some((m, zt)) = scratch_with_file() else {
        return;
    };
    // Its stderr to a file: a pipe nobody reads until the end could fill
    // up and stall the daemon (say, under RUST_LOG=debug).
    let err_path = m.scratch_path("fg.stderr");
    let mut fg = Fg(Command::new(bin())
        .arg(&zt)
        .arg(&m.mp)
        .arg("-f")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap());
    assert!(
        wait_until(Duration::from_secs(10), || m.is_mounted()),
        "foreground mount never appeared"
    );
    assert!(std::fs::read(m.path("w")).unwrap() == payload());
    assert!(fg.0.try_wait().unwrap().is_none(), "-f must not return");
    signal(fg.0.id() as i32, libc::SIGTERM);
    assert!(wait_until(Duration::from_secs(5), || fg
        .0
        .try_wait()
        .unwrap()
        .is_some()));
    let status = fg.0.wait().unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert!(!m.is_mounted());
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        err.contains("] mounted "),
        "foreground logs to stderr: {err}"
    );
}

#[test]
fn checksum_failures_are_eio_and_logged_unless_unverified() {
    let _one_at_a_time = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("bad.zt");
    let mut w = Writer::create(&zt).unwrap();
    let opts = Options {
        checksum: Some(Algorithm::Crc32c),
        ..Options::default()
    };
    w.add("good", DType::Uint32, &[4096], &payload(), &opts)
        .unwrap();
    w.add("rotten", DType::Uint32, &[4096], &payload(), &opts)
        .unwrap();
    w.finish().unwrap();
    // Flip one byte of the second blob.
    let off = {
        let f = ztensor_mount::formats::zt_v01::ZtFile::open(&zt).unwrap();
        f.catalog().get("rotten").unwrap().offset as usize
    };
    let mut bytes = std::fs::read(&zt).unwrap();
    bytes[off + 100] ^= 0xff;
    std::fs::write(&zt, &bytes).unwrap();

    m.mount(&zt, &[]);
    assert!(std::fs::read(m.path("good")).unwrap() == payload());
    let e = std::fs::read(m.path("rotten")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let st = m.stats();
    assert_eq!(st["checksum_failures"], 1, "{st}");
    assert!(st["errors"].as_u64().unwrap() >= 1, "{st}");
    let log = m.log_text();
    assert!(
        log.contains("rotten") && log.contains("checksum mismatch"),
        "log: {log}"
    );
    m.unmount_ok();

    // --no-verify-raw serves the bytes as stored.
    m.mount(&zt, &["--no-verify-raw"]);
    let got = std::fs::read(m.path("rotten")).unwrap();
    assert_eq!(got.len(), payload().len());
    assert_ne!(got, payload());
    assert_eq!(m.stat_u64("errors"), 0);
}

/// fuser 0.18 unmounts the mountpoint path once more as a session ends; an
/// old daemon doing that would take down a new mount made on the same
/// directory right after `-u`. The daemon exits before fuser can.
#[test]
fn a_remount_right_after_unmount_survives_the_old_daemon() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    // Every CPU busy beside the test, so that the old daemon's exit lags
    // the new mount (as on a loaded machine, where this was seen to fail).
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        for _ in 0..cpus {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        let rounds = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            remount_rounds(&mut m, &zt, 20)
        }));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Err(p) = rounds {
            std::panic::resume_unwind(p);
        }
    });
    assert!(
        !m.log_text().contains("Failed to umount"),
        "fuser's second unmount ran:\n{}",
        m.log_text()
    );
}

/// Mounts, unmounts and mounts again at once, `rounds` times: the old
/// daemon, exiting, must never take the new mount down.
fn remount_rounds(m: &mut Mount, zt: &Path, rounds: usize) {
    for round in 0..rounds {
        m.mount(zt, &[]);
        let old = m.pid.expect("daemon pid");
        let r = support::run_with_timeout(
            Command::new(bin()).arg("-u").arg(&m.mp),
            Duration::from_secs(10),
        );
        assert!(r.ok(), "round {round}: -u: {r:?}");
        // No waiting for the old daemon: remount at once.
        m.mount(zt, &[]);
        assert!(
            wait_until(Duration::from_secs(10), || !alive(old)),
            "round {round}: old daemon stays"
        );
        assert!(
            m.is_mounted(),
            "round {round}: the new mount was taken down"
        );
        assert_eq!(
            std::fs::read(m.path("w")).unwrap(),
            payload(),
            "round {round}"
        );
        m.unmount_ok();
    }
}

/// Root, for tests that act as another user or call mount(8); a failure
/// under CI like any missing requirement.
fn require_root() -> bool {
    support::require(
        "root",
        // SAFETY: geteuid takes nothing and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            Ok(())
        } else {
            Err("not running as root".into())
        },
    )
}

/// `prog args...` as the unprivileged user nobody (65534).
fn as_nobody(prog: &Path, args: &[&std::ffi::OsStr]) -> Run {
    support::run_with_timeout(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(prog)
            .args(args),
        Duration::from_secs(20),
    )
}

#[test]
fn other_users_are_kept_out_unless_allowed() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    if !require_root() {
        return;
    }
    // The scratch directory is private; another user must reach the
    // mountpoint, and run a copy of the binary (the build may sit under a
    // private home).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let own_bin = m.scratch_path("ztensor-mount");
    std::fs::copy(bin(), &own_bin).unwrap();
    let w = m.path("w");
    let want = m.scratch_path("w.bytes");
    std::fs::write(&want, payload()).unwrap();
    for (args, others_read) in [
        (&[][..], false),
        (&["--allow-root"], false),
        (&["--allow-other"], true),
    ] {
        m.mount(&zt, args);
        let r = as_nobody(Path::new("cmp"), &[w.as_os_str(), want.as_os_str()]);
        assert_eq!(r.ok(), others_read, "{args:?}: {r:?}");
        if !others_read {
            assert!(r.stderr.contains("Permission denied"), "{args:?}: {r:?}");
        }
        // The owner (root here) reads in every case.
        assert!(m.read("w") == payload(), "{args:?}");
        if args.is_empty() {
            // Another user's -u goes through fusermount3, which refuses it.
            let r = as_nobody(&own_bin, &["-u".as_ref(), m.mp.as_os_str()]);
            let err = assert_clean_failure(&r, "-u by another user");
            assert!(err.contains("mounted by another user"), "{err}");
            assert!(m.is_mounted());
        }
        m.unmount_ok();
    }
}

#[test]
fn auto_unmount_clears_the_mount_when_the_daemon_is_killed() {
    let _one_at_a_time = support::serial();
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    m.mount(&zt, &["--auto-unmount"]);
    let pid = m.pid.expect("daemon pid");
    assert!(m.read("w") == payload());
    signal(pid, libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || !m.is_mounted()),
        "a killed daemon's mount stayed despite --auto-unmount"
    );
}

#[test]
fn mount_8_takes_an_fstab_line() {
    let _one_at_a_time = support::serial();
    let Some((m, zt)) = scratch_with_file() else {
        return;
    };
    if !require_root() {
        return;
    }
    // `mount -t fuse PROG#SRC`: the form that needs no ztensor-mount on
    // the default PATH; mount.fuse3 calls `PROG SRC DIR -o OPTIONS`.
    let r = support::run_with_timeout(
        Command::new("mount")
            .args(["-t", "fuse"])
            .arg(format!("{}#{}", bin(), zt.display()))
            .arg(&m.mp)
            .args([
                "-o",
                "ro,nosuid,nodev,noatime,allow_other,cache_size=64M,x-systemd.automount,nofail",
            ]),
        Duration::from_secs(20),
    );
    assert!(r.ok(), "mount(8): {r:?}");
    assert!(m.is_mounted());
    assert!(m.read("w") == payload());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mp = m.mp.to_str().unwrap();
    assert!(
        info.lines()
            .any(|l| l.split(' ').nth(4) == Some(mp) && l.contains(" - fuse.ztensor-mount ")),
        "{info}"
    );
    m.unmount_ok();
}

/// A safetensors file of `n` tensors of 16 bytes: its tree takes the
/// daemon a while to build, time in which a signal finds the command
/// waiting.
fn write_many(path: &Path, n: usize) {
    let mut header = String::from("{");
    for i in 0..n {
        let comma = if i == 0 { "" } else { "," };
        let (a, b) = (16 * i, 16 * i + 16);
        header +=
            &format!(r#"{comma}"t{i}":{{"dtype":"F32","shape":[4],"data_offsets":[{a},{b}]}}"#);
    }
    header += "}";
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + 16 * n, 0);
    std::fs::write(path, bytes).unwrap();
}

/// The daemon the mount command `pid` forked, once it has its own session
/// (after that, a signal to the command's group no longer reaches it).
fn forked_daemon(pid: u32) -> Option<i32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    let daemon: i32 = children.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{daemon}/stat")).ok()?;
    let session: i32 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    (session == daemon).then_some(daemon)
}

/// Ctrl-C (SIGINT to the command's process group) or `timeout`'s SIGTERM
/// while the command waits for its daemon ends the mount as well: the
/// command says so and exits 128 + the signal, and no mount or daemon is
/// left (the daemon, in a session of its own, once went on to mount).
#[test]
fn an_interrupted_mount_command_leaves_no_mount() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let _one_at_a_time = support::serial();
    let Some(m) = Mount::scratch() else {
        return;
    };
    let file = m.scratch_path("many.safetensors");
    write_many(&file, 100_000);
    for (sig, name, to_group) in [
        (libc::SIGINT, "SIGINT", true),
        (libc::SIGTERM, "SIGTERM", false),
    ] {
        let mut cmd = Command::new(bin());
        cmd.arg(&file)
            .arg(&m.mp)
            .arg("--log-file")
            .arg(&m.log)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut command = cmd.spawn().unwrap();
        let mut daemon = None;
        let forked = wait_until(Duration::from_secs(20), || {
            daemon = forked_daemon(command.id());
            daemon.is_some() || matches!(command.try_wait(), Ok(Some(_)))
        });
        let daemon = daemon.unwrap_or_else(|| {
            panic!(
                "{name}: no daemon forked (forked={forked}): {:?}",
                command.try_wait()
            )
        });
        let target = if to_group {
            -(command.id() as i32)
        } else {
            command.id() as i32
        };
        signal(target, sig);
        let ended = wait_until(Duration::from_secs(20), || {
            matches!(command.try_wait(), Ok(Some(_)))
        });
        if !ended {
            let _ = command.kill();
        }
        let status = command.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(command.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert_eq!(
            (status.code(), status.signal()),
            (Some(128 + sig), None),
            "{name}: {err}"
        );
        assert_eq!(
            err,
            format!(
                "ztensor-mount: interrupted by {name}: nothing is mounted on {}\n",
                m.mp.display()
            )
        );
        let gone = wait_until(Duration::from_secs(10), || {
            !m.is_mounted() && !alive(daemon)
        });
        assert!(
            gone,
            "{name}: mounted={} daemon alive={}\nlog:\n{}",
            m.is_mounted(),
            alive(daemon),
            m.log_text()
        );
    }
}

/// The daemon keeps none of the descriptors its caller left open: a lock
/// a script holds on one is let go of when the command returns, and a
/// pipe the caller reads ends.
#[test]
fn the_daemon_keeps_no_descriptor_its_caller_left_open() {
    let Some((mut m, zt)) = scratch_with_file() else {
        return;
    };
    let held = m.scratch_path("held-by-the-caller");
    let r = m.run_under(
        &[
            "sh",
            "-c",
            r#"exec 9>>"$0"; exec "$@""#,
            held.to_str().unwrap(),
        ],
        &zt,
        &[],
    );
    assert!(r.ok(), "{r:?}\n{}", m.log_text());
    let pid = m.pid.expect("daemon pid");
    let open: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect();
    assert!(!open.contains(&held), "the daemon holds {held:?}: {open:?}");
    assert_eq!(m.read("z"), payload());
}

/// Under a small open-file limit the command returns as soon as the mount
/// serves (it waited 10 s where the daemon had no descriptor left to
/// count its threads with), and a read whose spill file cannot be made
/// fails with EMFILE and a log line saying to raise the limit, never EIO
/// or wrong bytes; with one more descriptor the same read succeeds.
#[test]
fn under_a_small_open_file_limit_reads_fail_with_emfile_or_succeed() {
    let _one_at_a_time = support::serial();
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("big.zt");
    let big = support::compressible(7, 8 << 20);
    let mut w = Writer::create(&zt).unwrap();
    // One frame, over half the cache: decoded into a spill file.
    let z = support::one_frame_options(3);
    w.add("big", DType::Uint8, &[big.len() as u64], &big, &z)
        .unwrap();
    w.finish().unwrap();
    let cache_dir = m.scratch_path("cache");
    std::fs::create_dir(&cache_dir).unwrap();
    let args = [
        "--cache-size",
        "4M",
        "--cache-dir",
        cache_dir.to_str().unwrap(),
    ];
    let (mut refused, mut served) = (0, 0);
    for limit in 10..=24 {
        let nofile = format!("--nofile={limit}:{limit}");
        let r = m.run_under(&["prlimit", &nofile], &zt, &args);
        assert!(r.elapsed < Duration::from_secs(5), "limit {limit}: {r:?}");
        if !r.ok() {
            continue;
        }
        match std::fs::read(m.path("big")) {
            Ok(bytes) => {
                assert!(bytes == big, "limit {limit}: wrong bytes");
                served += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "limit {limit}: {e}");
                assert!(
                    m.log_text().contains(
                        "Too many open files (os error 24) (raise the open-file limit: ulimit -n)"
                    ),
                    "limit {limit}: {}",
                    m.log_text()
                );
                assert_eq!(
                    served, 0,
                    "limit {limit}: failed after a smaller one served"
                );
                refused += 1;
            }
        }
        m.unmount_ok();
    }
    assert!(
        refused > 0 && served > 0,
        "refused {refused}, served {served}"
    );
}
