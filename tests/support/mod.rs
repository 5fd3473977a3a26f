//! Harness for the real-mount tests: runs the built `ztensor-mount` binary
//! against a FUSE mountpoint in a temporary directory and always tears the
//! mount down again, even when the test panics.
//!
//! Rule for environments without FUSE (no /dev/fuse, no fusermount3): with
//! `CI=true` the test fails with a clear message, otherwise it prints a
//! "skipping: ..." note to stderr and returns early. No test is `#[ignore]`d.
#![allow(dead_code)]

pub mod data;
pub mod hostile;
pub mod python;
pub mod server;

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

/// The daemon binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ztensor-mount")
}

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Applies the skip rule: `Ok` when the requirement is met; otherwise panics
/// under CI or prints a skip note and returns `false`.
pub fn require(what: &str, check: Result<(), String>) -> bool {
    match check {
        Ok(()) => true,
        Err(why) if in_ci() => panic!("{what} is required when CI=true, but: {why}"),
        Err(why) => {
            // Straight to fd 2, past libtest's capture, so the skip shows.
            let _ = writeln!(std::io::stderr(), "skipping: {what} unavailable: {why}");
            false
        }
    }
}

fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            std::fs::metadata(d.join(prog)).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
    })
}

/// Whether FUSE mounts can be made here: `/dev/fuse` opens read-write and
/// `fusermount3` is installed (needed to unmount as a non-root user).
pub fn fuse_available() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| format!("cannot open /dev/fuse: {e}"))?;
    if !on_path("fusermount3") {
        return Err("fusermount3 is not on PATH".into());
    }
    Ok(())
}

/// Result of running the binary.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.status.success()
    }
}

/// Runs `cmd` to completion, killing it after `limit`. Panics on timeout.
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Run {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    Run {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
        elapsed,
    }
}

/// Unescapes the octal escapes of /proc/self/mounts (`\040` for a space...).
fn unescape_mounts(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The /proc/self/mounts line (device, fstype, options) of `mp`, if mounted.
pub fn mount_entry(mp: &Path) -> Option<(String, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let want = mp.to_string_lossy();
    text.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() >= 4 && unescape_mounts(f[1]) == want)
            .then(|| (unescape_mounts(f[0]), f[2].to_string(), f[3].to_string()))
    })
}

pub fn is_mounted(mp: &Path) -> bool {
    mount_entry(mp).is_some()
}

/// Polls `cond` every 10 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `/proc/PID/status` field in KiB (`field` with its colon, e.g.
/// `"VmRSS:"`), or `None` when the process or the field is not there.
pub fn status_kib(pid: i32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Pids of ztensor-mount processes serving `mp` (found by command line;
/// `-u` runs are left out).
pub fn daemon_pids(mp: &Path) -> Vec<i32> {
    let want = mp.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // comm first: reading another process's cmdline takes its mm lock,
        // which can block behind a process stuck on a FUSE request.
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != "ztensor-mount" {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_ours = args.first().is_some_and(|a| a.ends_with("ztensor-mount"));
        if is_ours
            && args.contains(&want)
            && !args.iter().any(|a| a == "-u" || a == "--unmount")
            && !is_zombie(pid)
        {
            pids.push(pid);
        }
    }
    pids
}

/// When `pid` started, in clock ticks since boot (0 if unknown).
fn start_time(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command: state is field 3, starttime 22.
            let rest = s.rsplit_once(')')?.1;
            rest.split_whitespace().nth(19)?.parse().ok()
        })
        .unwrap_or(0)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

pub fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid)
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill takes two integers and touches no memory of ours; a pid
    // that is gone gives ESRCH, which a test that signals ignores.
    unsafe {
        libc::kill(pid, sig);
    }
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the tests that hold it one at a time. Tests that unmount on purpose
/// (signals, `-u`) take it first: a child spawned by another test thread
/// briefly inherits copies of this process's open files (between fork and
/// exec), and an unmount in that window fails with EBUSY.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temporary directory with a mountpoint `mnt/`, a log file path and room
/// for the .zt files of a test. Whatever gets mounted on `mnt/` is unmounted
/// when this is dropped, and any daemon left serving it is killed.
pub struct Mount {
    pub dir: tempfile::TempDir,
    pub mp: PathBuf,
    pub log: PathBuf,
    /// The daemon's pid, once known (recorded after a successful mount).
    pub pid: Option<i32>,
}

impl Mount {
    /// A fresh scratch directory, or `None` (test skipped) when FUSE is not
    /// usable here and CI is not set.
    pub fn scratch() -> Option<Mount> {
        if !require("FUSE", fuse_available()) {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("zt-mount-test.")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().canonicalize().unwrap();
        let mp = root.join("mnt");
        std::fs::create_dir(&mp).unwrap();
        Some(Mount {
            log: root.join("daemon.log"),
            dir,
            mp,
            pid: None,
        })
    }

    /// A path inside the scratch directory (outside the mount).
    pub fn scratch_path(&self, name: &str) -> PathBuf {
        self.dir.path().canonicalize().unwrap().join(name)
    }

    /// Runs the binary as `ztensor-mount FILE MP --log-file LOG ARGS...`.
    pub fn run(&mut self, file: &Path, args: &[&str]) -> Run {
        self.run_under(&[], file, args)
    }

    /// [`Mount::run`] under `wrapper`, a command that runs the rest of its
    /// command line (e.g. `prlimit --nofile=64`).
    pub fn run_under(&mut self, wrapper: &[&str], file: &Path, args: &[&str]) -> Run {
        let mut cmd = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut c = Command::new(program);
                c.args(wrapper_args).arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        cmd.arg(file)
            .arg(&self.mp)
            .arg("--log-file")
            .arg(&self.log)
            .args(args);
        let r = run_with_timeout(&mut cmd, Duration::from_secs(20));
        if r.ok() {
            // The newest: a daemon unmounted just before may still be exiting.
            self.pid = daemon_pids(&self.mp)
                .into_iter()
                .max_by_key(|&p| start_time(p));
        }
        r
    }

    /// Mounts `file` with `args`; panics with the daemon's words on failure.
    pub fn mount(&mut self, file: &Path, args: &[&str]) {
        let r = self.run(file, args);
        assert!(
            r.ok(),
            "mounting {} failed ({}): {}{}\nlog: {}",
            file.display(),
            r.status,
            r.stderr,
            r.stdout,
            self.log_text()
        );
    }

    /// scratch() + writes a file with `write` + mount(); `None` if skipped.
    pub fn with(args: &[&str], write: impl FnOnce(&Path)) -> Option<Mount> {
        let mut m = Mount::scratch()?;
        let zt = m.scratch_path("test.zt");
        write(&zt);
        m.mount(&zt, args);
        Some(m)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mp.join(rel)
    }

    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.path(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }

    pub fn json(&self, rel: &str) -> Json {
        serde_json::from_slice(&self.read(rel)).unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"))
    }

    pub fn stats(&self) -> Json {
        self.json(".ztensor/stats")
    }

    pub fn stat_u64(&self, key: &str) -> u64 {
        self.stats()[key]
            .as_u64()
            .unwrap_or_else(|| panic!("stats has no number {key:?}"))
    }

    /// Waits until no backing file is being filled, no clone's pages are
    /// being read in, and the daemon has heard of every close (the kernel
    /// says so after `close` returns; an inode with a handle the daemon
    /// serves is not passed through).
    pub fn settled(&self) {
        assert!(
            wait_until(Duration::from_secs(30), || {
                let s = self.stats();
                s["backing_filling"] == 0
                    && s["open_files_served"] == 0
                    && s["backing_warming"] == 0
            }),
            "backing files still filling: {}",
            self.stats()
        );
    }

    /// Waits until the write-behind has dealt with `n` served bytes since
    /// mount (written them into backing files, or left them to the fill),
    /// and says how many it left.
    pub fn written_behind(&self, n: u64) -> u64 {
        let done = || {
            let s = self.stats();
            let n = |k: &str| s[k].as_u64().unwrap_or(0);
            (
                n("write_behind_bytes") + n("write_behind_skipped_bytes"),
                n("write_behind_skipped_bytes"),
            )
        };
        assert!(
            wait_until(Duration::from_secs(30), || done().0 >= n),
            "{n} served bytes not written behind: {}",
            self.stats()
        );
        done().1
    }

    pub fn index(&self) -> Json {
        self.json(".ztensor/index.json")
    }

    pub fn is_mounted(&self) -> bool {
        is_mounted(&self.mp)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Unmounts with the daemon's own `-u`; returns that run. After a
    /// successful unmount, waits (up to 5 s) for the daemon to exit: fuser
    /// 0.18 unmounts the mountpoint *path* once more as its session ends
    /// (its `is_mounted` check is inverted, fixed upstream in fuser PR #703),
    /// which would take down a new mount made there in the meantime.
    pub fn unmount(&self) -> Run {
        let r = run_with_timeout(
            Command::new(bin()).arg("-u").arg(&self.mp),
            Duration::from_secs(20),
        );
        if r.ok()
            && let Some(pid) = self.pid
        {
            wait_until(Duration::from_secs(5), || !alive(pid));
        }
        r
    }

    /// `unmount()`, asserting that it worked and that nothing is left.
    /// "Busy" is retried for up to 2 s: tests run on threads of one
    /// process, and a sibling test's child holds copies of all our open
    /// files between its fork and its exec, a file we just closed among
    /// them. A file really left open still fails, with its holder named.
    pub fn unmount_ok(&self) {
        let start = Instant::now();
        let mut r = self.unmount();
        while !r.ok() && r.stderr.contains("busy") && start.elapsed() < Duration::from_secs(2) {
            eprintln!(
                "{} busy, again in 20 ms; open there: {:?}",
                self.mp.display(),
                holders(&self.mp)
            );
            std::thread::sleep(Duration::from_millis(20));
            r = self.unmount();
        }
        assert!(
            r.ok(),
            "-u {} failed: {r:?}; open there: {:?}",
            self.mp.display(),
            holders(&self.mp)
        );
        assert!(!self.is_mounted(), "still mounted after -u");
    }

    /// Best-effort teardown; safe to call more than once.
    pub fn cleanup(&mut self) {
        for attempt in 0..3 {
            if !self.is_mounted() {
                break;
            }
            let _ = match attempt {
                0 => Command::new(bin())
                    .arg("-u")
                    .arg(&self.mp)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status(),
                1 => Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.mp)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status(),
                _ => Command::new("umount")
                    .arg("-l")
                    .arg(&self.mp)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status(),
            };
        }
        let mut pids = daemon_pids(&self.mp);
        pids.extend(self.pid);
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            // An unmounted daemon exits by itself; give it a moment.
            if !wait_until(Duration::from_secs(3), || !alive(pid)) {
                signal(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What the daemon said is often why: CI keeps nothing else.
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "{} ({}mounted); the last lines of its daemon's log:",
                self.mp.display(),
                if self.is_mounted() { "" } else { "no longer " }
            );
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
        }
        self.cleanup();
        if self.is_mounted() {
            // A leaked mount fails the test (unless it is failing already:
            // a panic while panicking would abort the whole run).
            let msg = format!(
                "{} is still mounted after every way to unmount it",
                self.mp.display()
            );
            if std::thread::panicking() {
                eprintln!("error: {msg}");
            } else {
                panic!("{msg}");
            }
        }
    }
}

/// Deterministic pseudo-random numbers (splitmix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// `n` bytes that compress a few times over but never repeat exactly.
pub fn compressible(seed: u64, n: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let x = r.next_u64();
        for k in 0..8 {
            // 16 symbols: about 2x compression.
            out.push(((x >> (k * 4)) & 0x0f) as u8 + b'a');
        }
    }
    out.truncate(n);
    out
}

/// `n` elements of `es` bytes; every byte of an element differs from its
/// neighbours, so a missing or doubled byte swap shows.
pub fn pattern(es: usize, n: usize, salt: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * es);
    for i in 0..n {
        for b in 0..es {
            out.push((i * 31 + b * 7 + 1) as u8 ^ salt);
        }
    }
    out
}

/// zTensor writer options for a tensor in one zstd frame at `level`.
pub fn one_frame_options(level: i32) -> ztensor_mount::formats::zt_v01::writer::Options {
    use ztensor_mount::formats::zt_v01::writer::{Compression, Options};
    Options {
        compression: Compression::Zstd {
            level,
            frame_size: 0,
        },
        ..Options::default()
    }
}

/// The numpy type string for a dtype, written out here rather than taken
/// from the daemon, so tests check the sidecars against an independent table.
pub fn numpy(d: ztensor_mount::formats::zt_v01::DType) -> &'static str {
    use ztensor_mount::formats::zt_v01::DType;
    match d {
        DType::Float64 => "<f8",
        DType::Float32 => "<f4",
        DType::Float16 => "<f2",
        DType::BFloat16 => "<u2",
        DType::Int64 => "<i8",
        DType::Int32 => "<i4",
        DType::Int16 => "<i2",
        DType::Int8 => "|i1",
        DType::Uint64 => "<u8",
        DType::Uint32 => "<u4",
        DType::Uint16 => "<u2",
        DType::Uint8 => "|u1",
        DType::Bool => "|b1",
        DType::Float8E4M3Fn
        | DType::Float8E5M2
        | DType::Float8E4M3Fnuz
        | DType::Float8E5M2Fnuz
        | DType::Float8E8M0Fnu
        | DType::Float4E2M1FnX2 => "|u1",
        DType::Complex64 => "<c8",
        DType::Complex128 => "<c16",
    }
}

/// Processes with a file open under `dir`, as "pid (comm): path".
pub fn holders(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && target.starts_with(dir)
            {
                out.push(format!("{pid} ({}): {}", comm.trim(), target.display()));
            }
        }
    }
    out
}

/// A tmpfs mounted for one test, unmounted however the test ends.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let r = run_with_timeout(
            Command::new("mount").args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                dir.to_str().unwrap(),
            ]),
            Duration::from_secs(10),
        );
        if !r.ok() {
            return Err(format!("mount -t tmpfs: {}", r.stderr.trim()));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    /// A tmpfs of `size` at `dir` for a `--cache-dir`, or `None` (test
    /// skipped) when one cannot be mounted and CI is not set.
    pub fn cache_dir(dir: &Path, size: &str) -> Option<Tmpfs> {
        match Tmpfs::mount(dir, size) {
            Ok(t) => Some(t),
            Err(why) => {
                require("a tmpfs for --cache-dir", Err(why));
                None
            }
        }
    }

    pub fn resize(&self, size: &str) {
        let r = run_with_timeout(
            Command::new("mount").args([
                "-o",
                &format!("remount,size={size}"),
                self.0.to_str().unwrap(),
            ]),
            Duration::from_secs(10),
        );
        assert!(r.ok(), "remount: {}", r.stderr);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A copy of `path` as the copiers the kernel feeds through its page cache
/// make it (`sendfile`, as Python's `shutil.copyfile` does after an
/// `fstat`), and a stat-then-read one (`tar`, `rsync`); asserts that both
/// get every byte a `pread` of the same open file reads, and that the
/// sizes reported are those texts'. Returns the bytes.
pub fn copies_whole(path: &Path) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let shown = std::fs::metadata(path).unwrap().len();
    let f = std::fs::File::open(path).unwrap();
    let mut read = vec![0; shown as usize + 1];
    let n = f.read_at(&mut read, 0).unwrap();
    read.truncate(n);
    assert_eq!(
        shown,
        n as u64,
        "{}: stat, then open and read",
        path.display()
    );
    drop(f);
    let f = std::fs::File::open(path).unwrap();
    let size = f.metadata().unwrap().len();
    let out = tempfile::tempfile().unwrap();
    loop {
        // SAFETY: both descriptors are open files owned for the call; a
        // null offset uses and moves the input file's own.
        let n = unsafe {
            libc::sendfile(
                out.as_raw_fd(),
                f.as_raw_fd(),
                std::ptr::null_mut(),
                1 << 20,
            )
        };
        assert!(
            n >= 0,
            "{}: sendfile: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        if n == 0 {
            break;
        }
    }
    let mut again = vec![0; size as usize + 1];
    let n = f.read_at(&mut again, 0).unwrap();
    again.truncate(n);
    let mut copied = vec![0; again.len()];
    out.read_at(&mut copied, 0).unwrap();
    assert_eq!(
        size,
        again.len() as u64,
        "{}: open, then fstat",
        path.display()
    );
    assert_eq!(copied, again, "{}: sendfile vs read", path.display());
    again
}
