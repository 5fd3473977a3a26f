//! The mount command's two processes once it forks. The daemon lets go of
//! what it inherited from its caller; the command waits for the daemon's
//! word, and an exit signal it gets meanwhile (Ctrl-C, `timeout`'s
//! SIGTERM) ends the mount too, so that an interrupted command leaves no
//! mount behind while its caller takes it for failed.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Descriptors open when the program started, other than 0-2: its
/// caller's, inherited without close-on-exec (a lock a script holds, the
/// write end of a pipe it reads).
static INHERITED: OnceLock<Vec<libc::c_int>> = OnceLock::new();

/// Notes the descriptors the caller left open. Called first thing, before
/// the program opens any of its own.
pub fn note_inherited() {
    INHERITED.get_or_init(|| {
        let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
            return Vec::new();
        };
        let listed: Vec<libc::c_int> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd > 2)
            .collect();
        // The listing's own descriptor, closed by now, is not inherited.
        listed
            .into_iter()
            // SAFETY: F_GETFD only reads the descriptor's flags; a closed
            // number answers -1.
            .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1)
            .collect()
    });
}

/// In the daemon: closes what the caller left open, so that a lock it
/// holds is let go of and a pipe it reads ends when the command does.
pub fn close_inherited() {
    for &fd in INHERITED.get().map_or(&[][..], Vec::as_slice) {
        // SAFETY: each number was open before the program opened anything,
        // and nothing in it owns or closes an inherited descriptor (a
        // source named `/dev/fd/N` is opened anew), so these numbers are
        // still the caller's and no descriptor of the program's is closed.
        unsafe { libc::close(fd) };
    }
}

/// The signals that end a mount command: SIGINT, SIGTERM, SIGHUP.
pub fn exit_signals() -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid value, emptied at once; each
    // call gets a pointer to it, live for the call, and real signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Blocks the exit signals in this thread (and the threads and the
/// process it starts): they wait, pending, for whoever reads them.
pub fn block_exit_signals() -> libc::sigset_t {
    let set = exit_signals();
    // SAFETY: `set` is an initialized set, live for the call; no old mask
    // is asked for.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    set
}

/// The command's end of the pipe from the daemon, and the exit signals the
/// command receives while it waits (blocked before the fork).
pub struct FromDaemon {
    pipe: File,
    signals: Option<OwnedFd>,
    daemon: libc::pid_t,
    mountpoint: PathBuf,
}

impl FromDaemon {
    pub fn new(pipe: File, daemon: libc::pid_t, mountpoint: &Path) -> FromDaemon {
        let set = exit_signals();
        // SAFETY: `set` is an initialized set, live for the call; the
        // descriptor returned, when not -1, is fresh and owned here only.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        // SAFETY: as above: a fresh descriptor, wrapped once.
        let signals = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        if signals.is_none() {
            // Unread, they would be ignored: they end the command as before.
            // SAFETY: `set` is initialized and live for the call.
            unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
        }
        FromDaemon {
            pipe,
            signals,
            daemon,
            mountpoint: mountpoint.to_path_buf(),
        }
    }

    /// One line from the daemon, or what it wrote before closing the pipe.
    pub fn read_line(&mut self) -> String {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while self.readable(-1) {
            match self.pipe.read(&mut byte) {
                Ok(1) if byte[0] != b'\n' => buf.push(byte[0]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// What more the daemon says within `ms` milliseconds (its reason, when
    /// it failed after mounting).
    pub fn read_rest(&mut self, ms: i32) -> String {
        let mut out = Vec::new();
        while self.readable(ms) {
            let mut buf = [0u8; 512];
            match self.pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Waits up to `ms` (-1: for ever) for the pipe to be readable (or
    /// closed); an exit signal meanwhile ends the mount and the command.
    fn readable(&mut self, ms: i32) -> bool {
        let mut fds = [self.pipe.as_raw_fd(), self.signal_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two pollfds, live for the call; a -1 descriptor is
        // skipped by poll.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if n > 0 && fds[1].revents & libc::POLLIN != 0 {
            let sig = self.take_signal();
            self.interrupted(sig);
        }
        n > 0
    }

    fn signal_fd(&self) -> libc::c_int {
        self.signals.as_ref().map_or(-1, |s| s.as_raw_fd())
    }

    /// The signal waiting on the signal descriptor.
    fn take_signal(&self) -> libc::c_int {
        // SAFETY: an all-zero signalfd_siginfo is a valid value; read
        // writes at most its size into it.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: as above; `info` lives through the call.
        let got = unsafe {
            libc::read(
                self.signal_fd(),
                (&raw mut info).cast::<libc::c_void>(),
                size,
            )
        };
        match got {
            n if n as usize == size => info.ssi_signo as libc::c_int,
            _ => libc::SIGTERM,
        }
    }

    /// Ends the mount the daemon makes or has made, then the command, as
    /// the signal would have. The daemon takes SIGTERM as its own: once
    /// mounted, it unmounts and exits (a mount still being made is
    /// unmounted as soon as it exists). One still there 5 s later, or a
    /// second signal, kills it.
    fn interrupted(&mut self, sig: libc::c_int) -> ! {
        // SAFETY: kill sends a signal to our own child; it touches no
        // memory.
        unsafe { libc::kill(self.daemon, libc::SIGTERM) };
        if !self.daemon_exits_within(5000) {
            // SAFETY: as above.
            unsafe { libc::kill(self.daemon, libc::SIGKILL) };
            let _ = self.daemon_exits_within(5000);
            // A mount left by the daemon killed is its: the mountpoint was
            // no mount when checked, and locked until the daemon mounted.
            if super::mount::mount_at(&self.mountpoint)
                .is_some_and(|(_, fstype)| fstype == "fuse.ztensor-mount")
            {
                let _ = super::mount::umount(&self.mountpoint, true);
            }
        }
        let name = match sig {
            libc::SIGINT => "SIGINT",
            libc::SIGHUP => "SIGHUP",
            _ => "SIGTERM",
        };
        eprintln!(
            "ztensor-mount: interrupted by {name}: nothing is mounted on {}",
            self.mountpoint.display()
        );
        std::process::exit(128 + sig)
    }

    /// Whether the daemon exits within `ms` (a multiple of 10); a second
    /// exit signal cuts the wait short.
    fn daemon_exits_within(&mut self, ms: i32) -> bool {
        // SAFETY: pidfd_open takes a pid and flags and returns a fresh
        // descriptor or -1; it touches no memory.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.daemon, 0) };
        // SAFETY: a fresh descriptor (when not -1), wrapped once.
        let pidfd = libc::c_int::try_from(pidfd)
            .ok()
            .filter(|&fd| fd >= 0)
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
        // Without pidfd_open (Linux before 5.3), asked every 10 ms.
        let (fd, step) = match &pidfd {
            Some(p) => (p.as_raw_fd(), ms),
            None => (-1, 10),
        };
        let mut left = ms;
        while left > 0 {
            let mut fds = [fd, self.signal_fd()].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            // SAFETY: two pollfds, live for the call; -1 is skipped.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, step) };
            if n > 0 && fds[1].revents & libc::POLLIN != 0 {
                self.take_signal();
                return self.reaped();
            }
            if self.reaped() {
                return true;
            }
            left -= step;
        }
        false
    }

    /// Whether the daemon has exited (and is reaped).
    fn reaped(&self) -> bool {
        let mut status = 0;
        // SAFETY: waitpid of our own child writes one c_int we own.
        unsafe { libc::waitpid(self.daemon, &mut status, libc::WNOHANG) == self.daemon }
    }
}
