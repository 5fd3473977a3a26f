//! Requests the mount does not serve get the errno a read-only file system
//! gives, and no log line: Python's open() asks TCGETS of every file it
//! opens, which fuser's default answer logged as "[Not Implemented]".
//! Through a real mount, with the daemon's log file read after.

mod support;

use std::path::Path;

use support::Mount;
use support::python::Python;
use ztensor_mount::formats::zt_v01::DType;
use ztensor_mount::formats::zt_v01::writer::{Options, Writer};

fn write(path: &Path) {
    let mut w = Writer::create(path).unwrap();
    let a = support::compressible(1, 100_000);
    w.add(
        "a",
        DType::Uint8,
        &[a.len() as u64],
        &a,
        &Options::default(),
    )
    .unwrap();
    let z = support::one_frame_options(1);
    w.add("dir/z", DType::Uint8, &[a.len() as u64], &a, &z)
        .unwrap();
    w.finish().unwrap();
}

/// Each request, its expected answer, asked from Python (the standard
/// library only), several times over.
const PROBE: &str = r#"
import errno, fcntl, os, select, struct, sys, termios
m = sys.argv[1]
def fails(want, f, *a):
    try:
        f(*a)
    except OSError as e:
        assert e.errno == want, (f, a, e)
        return
    raise AssertionError(f"{f.__name__}{a} did not fail")
for _ in range(5):
    for rel in ["a", "dir/z", "a.json", ".ztensor/stats", ".npy/a.npy"]:
        p = f"{m}/{rel}"
        with open(p, encoding="latin-1") as f:  # text mode: isatty() asks TCGETS
            f.read(10)
        with open(p, "rb") as f:
            f.read()
        fd = os.open(p, os.O_RDONLY)
        try:
            assert not os.isatty(fd)
            fails(errno.ENOTTY, fcntl.ioctl, fd, termios.TCGETS, bytes(64))
            size = os.fstat(fd).st_size
            if size > 0:
                assert os.lseek(fd, 0, os.SEEK_DATA) == 0
                assert os.lseek(fd, 0, os.SEEK_HOLE) == size
            os.fsync(fd)
            os.fdatasync(fd)
            p_ = select.poll(); p_.register(fd, select.POLLIN)
            assert p_.poll(0)[0][1] & select.POLLIN
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_SH)
            fails(errno.EBADF, os.posix_fallocate, fd, 0, 10)
        finally:
            os.close(fd)
        fails(errno.EROFS, os.open, p, os.O_WRONLY)
        fails(errno.EROFS, os.truncate, p, 0)
        fails(errno.EROFS, os.chmod, p, 0o600)
        fails(errno.EROFS, os.utime, p)
        fails(errno.EROFS, os.unlink, p)
        fails(errno.EROFS, os.rename, p, p + ".x")
        fails(errno.EROFS, os.link, p, p + ".x")
        fails(errno.EROFS, os.setxattr, p, "user.x", b"1")
        fails(errno.EROFS, os.removexattr, p, "user.x")
    fails(errno.EROFS, os.mkdir, f"{m}/new")
    fails(errno.EROFS, os.rmdir, f"{m}/dir")
    fails(errno.EROFS, os.symlink, "a", f"{m}/l")
    fails(errno.EROFS, os.mknod, f"{m}/n")
    fails(errno.EROFS, open, f"{m}/created", "w")
    d = os.open(m, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(d)
    os.close(d)
print("OK")
"#;

#[test]
fn unserved_requests_get_their_errno_and_leave_no_log_line() {
    let Some(py) = Python::from_env().require("python3 (set ZT_PYTHON)", "print(1)", |_| Ok(()))
    else {
        return;
    };
    for mode in ["--direct-io", "--page-cache"] {
        let Some(m) = Mount::with(&[mode], write) else {
            return;
        };
        let script = m.scratch_path("probe.py");
        std::fs::write(&script, PROBE).unwrap();
        py.run_ok(
            &[script.as_os_str(), m.mp.as_os_str()],
            std::time::Duration::from_secs(60),
            &format!("the probe ({mode})"),
        );
        m.unmount_ok();
        let log = m.log_text();
        assert!(
            !log.contains("Not Implemented") && !log.contains("WARN"),
            "{mode}: the log has lines of unserved requests:\n{log}"
        );
    }
}
