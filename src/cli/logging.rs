//! Where log lines go: stderr in the foreground; in the background a
//! `--log-file`, or syslog (facility daemon) when none is given.

use std::ffi::CString;
use std::io::Write;
use std::path::Path;

use log::{LevelFilter, Log, Metadata, Record};

fn level(debug: bool) -> LevelFilter {
    if debug {
        LevelFilter::Debug
    } else {
        LevelFilter::Info
    }
}

fn builder(debug: bool) -> env_logger::Builder {
    let mut b = env_logger::Builder::new();
    b.filter_level(level(debug));
    // RUST_LOG refines the default (e.g. RUST_LOG=fuser=debug).
    if let Ok(spec) = std::env::var("RUST_LOG") {
        b.parse_filters(&spec);
    }
    b
}

/// Where syslog listens.
pub const SYSLOG_SOCKET: &str = "/dev/log";

/// Whether syslog is listening here (a container or chroot may have none,
/// and then syslog(3) drops every line).
pub fn syslog_available() -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(SYSLOG_SOCKET).is_ok_and(|m| m.file_type().is_socket())
}

/// The log file of a background mount when there is no syslog:
/// `/var/log/ztensor-mount.log` for root, else
/// `$XDG_STATE_HOME/ztensor-mount.log` (`~/.local/state/…`), its folder
/// made if missing; where that cannot be written,
/// `$TMPDIR/ztensor-mount-UID.log`, or where that name is taken by
/// another user's file or a link (any user may put one there), a new file
/// `$TMPDIR/ztensor-mount-UID-XXXXXX.log` of this user's own.
pub fn default_log_file() -> std::path::PathBuf {
    use std::path::PathBuf;
    // SAFETY: getuid takes nothing, touches no memory of ours and cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = if uid == 0 {
        Some(PathBuf::from("/var/log"))
    } else if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        Some(PathBuf::from(d))
    } else {
        std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".local/state"))
    };
    let writable =
        |d: &PathBuf| std::fs::create_dir_all(d).is_ok() && tempfile::tempfile_in(d).is_ok();
    if let Some(d) = dir.filter(writable) {
        return d.join("ztensor-mount.log");
    }
    let tmp = std::env::temp_dir();
    let named = tmp.join(format!("ztensor-mount-{uid}.log"));
    if open_log(&named).is_ok() {
        return named;
    }
    tempfile::Builder::new()
        .prefix(&format!("ztensor-mount-{uid}-"))
        .suffix(".log")
        .tempfile_in(&tmp)
        .ok()
        .and_then(|f| f.keep().ok())
        .map_or(named, |(_, path)| path)
}

/// Opens the log file at `path` to append to it. In a folder any user may
/// write (`/tmp`), only a file of this user's own, not through a link, and
/// made readable by this user alone: another user could have put a link
/// there (the daemon would append its lines to a file the link names) or
/// a file of theirs (and read every line).
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shared = path
        .parent()
        .map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        })
        .and_then(|d| std::fs::metadata(d).ok())
        .is_some_and(|m| m.mode() & 0o002 != 0);
    let mut o = std::fs::OpenOptions::new();
    o.create(true).append(true);
    // Non-blocking: a FIFO nobody reads fails to open (ENXIO) instead of
    // hanging the daemon and the command waiting for it, and a reader that
    // stops reading loses lines instead of stalling every request that
    // logs (and a signal's unmount, which logs first). A regular file is
    // written as ever.
    let mut flags = libc::O_NONBLOCK;
    if shared {
        flags |= libc::O_NOFOLLOW;
        o.mode(0o600);
    }
    let f = o
        .custom_flags(flags)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) if shared => {
                std::io::Error::other("a link, in a folder every user may write: not followed")
            }
            _ => e,
        })?;
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    let owner = f.metadata()?.uid();
    if shared && owner != me {
        return Err(std::io::Error::other(format!(
            "another user's file (uid {owner}), in a folder every user may write"
        )));
    }
    Ok(f)
}

pub fn to_stderr(debug: bool) {
    let _ = builder(debug).try_init();
}

/// A background mount's log lines from before its daemon's log is open:
/// what the formats and sources say while the file is opened (a shard that
/// cannot be used, the commit a Hub revision names). They are kept, up to
/// [`HELD_MAX`] of them, and written to the daemon's log once it is open
/// (`log` takes one logger per process, so this one stays and forwards).
struct Relay {
    state: std::sync::Mutex<Relayed>,
}

enum Relayed {
    Held(Vec<HeldLine>, usize),
    To(Box<dyn Log>),
}

/// A line held, with the time it was logged: written later, it still
/// says when it happened (a mount that waited 10 s for its cache file
/// shows the wait).
struct HeldLine {
    at: std::time::SystemTime,
    level: log::Level,
    target: String,
    line: String,
}

/// Lines held before the daemon's log is open; more are counted, not kept.
const HELD_MAX: usize = 1000;

static RELAY: std::sync::OnceLock<&'static Relay> = std::sync::OnceLock::new();

thread_local! {
    /// When the record this thread is writing was logged, where that was
    /// before now (a held line); the log file's lines carry it.
    static LOGGED_AT: std::cell::Cell<Option<std::time::SystemTime>> =
        const { std::cell::Cell::new(None) };
    /// Set while this thread is inside the relay: a line logged from there
    /// (by a panic in a logger, through the panic hook) is dropped rather
    /// than waiting forever for the lock this thread holds.
    static IN_RELAY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Sets this thread's [`LOGGED_AT`] until dropped (also when a logger
/// panics): the lines after it carry their own time.
struct LoggedAt;

impl LoggedAt {
    fn set(at: std::time::SystemTime) -> LoggedAt {
        LOGGED_AT.set(Some(at));
        LoggedAt
    }
}

impl Drop for LoggedAt {
    fn drop(&mut self) {
        LOGGED_AT.set(None);
    }
}

/// Marks this thread as inside the relay until dropped (also when a panic
/// unwinds through it); `None` when it already was.
struct Inside;

impl Inside {
    fn enter() -> Option<Inside> {
        if IN_RELAY.replace(true) {
            // Already inside: no guard, whose drop would clear the mark
            // the outer call still needs.
            return None;
        }
        Some(Inside)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        IN_RELAY.set(false);
    }
}

/// Whether `r` is fuser's error for a reply it could not send, for the
/// cause whose words follow its own (`"No such file"`, `"Bad address"`).
fn reply_failed(r: &Record, cause: &str) -> bool {
    r.level() == log::Level::Error
        && r.target().starts_with("fuser")
        && r.args()
            .to_string()
            .strip_prefix("Failed to send FUSE reply: ")
            .is_some_and(|rest| rest.starts_with(cause))
}

/// Whether `r` is fuser's error for a reply to a request the kernel had
/// already dropped (its reader interrupted, or the mount detached while it
/// was served): no error of the daemon's, so logged at debug level.
fn dropped_reply(r: &Record) -> bool {
    reply_failed(r, "No such file")
}

/// Whether `r` is fuser's error for a reply whose bytes the kernel could
/// not copy (`EFAULT`): a reply sent from the mounted file's mapping
/// after a truncation took its pages away. fuser's words name neither the
/// file nor the cause.
fn vanished_reply(r: &Record) -> bool {
    reply_failed(r, "Bad address")
}

impl Log for Relay {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        if dropped_reply(r) {
            if log::Level::Debug <= log::max_level() {
                self.log(
                    &Record::builder()
                        .level(log::Level::Debug)
                        .args(*r.args())
                        .target(r.target())
                        .build(),
                );
            }
            return;
        }
        if vanished_reply(r) {
            self.log(
                &Record::builder()
                    .level(log::Level::Error)
                    .args(format_args!(
                        "a reply could not be sent: the pages of the mounted file it was \
                         read from were gone (the file cut short under the mount?); its \
                         reader got EIO"
                    ))
                    .target("ztensor_mount")
                    .build(),
            );
            return;
        }
        let Some(_inside) = Inside::enter() else {
            return;
        };
        match &mut *self.state.lock().unwrap_or_else(|e| e.into_inner()) {
            Relayed::To(to) => to.log(r),
            Relayed::Held(held, _) if held.len() < HELD_MAX => held.push(HeldLine {
                at: std::time::SystemTime::now(),
                level: r.level(),
                target: r.target().to_string(),
                line: r.args().to_string(),
            }),
            Relayed::Held(_, dropped) => *dropped += 1,
        }
    }
    fn flush(&self) {
        let Some(_inside) = Inside::enter() else {
            return;
        };
        if let Relayed::To(to) = &*self.state.lock().unwrap_or_else(|e| e.into_inner()) {
            to.flush();
        }
    }
}

/// Most lines of a panic's backtrace logged.
const TRACE_LINES: usize = 60;

/// Sends a background daemon's panics to its log: its stderr goes nowhere,
/// and a panic on a serving thread ends the session (the mount goes away),
/// so without this the log would say only that it unmounted. The message,
/// thread and place make one line; the backtrace follows a line per
/// record (a syslog message or a FIFO write holds one line well).
pub fn log_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        let place = info
            .location()
            .map_or_else(String::new, |l| format!(" at {l}"));
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        log::error!("panic on thread {name}{place}: {what}");
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        for line in trace.lines().take(TRACE_LINES) {
            log::error!("  {line}");
        }
        log::logger().flush();
        default(info);
    }));
}

/// Holds the log lines of a background mount until [`to_file`] or
/// [`to_syslog`] opens its log.
pub fn hold(debug: bool) {
    let relay: &'static Relay = Box::leak(Box::new(Relay {
        state: std::sync::Mutex::new(Relayed::Held(Vec::new(), 0)),
    }));
    if log::set_logger(relay).is_ok() {
        log::set_max_level(builder(debug).build().filter());
        let _ = RELAY.set(relay);
    }
}

/// Makes `to` (passing lines up to `max`) this process's logger: behind
/// the relay, after writing what it held, when [`hold`] installed one.
fn install(to: Box<dyn Log>, max: LevelFilter) {
    let Some(relay) = RELAY.get() else {
        if log::set_boxed_logger(to).is_ok() {
            log::set_max_level(max);
        }
        return;
    };
    let mut state = relay.state.lock().unwrap_or_else(|e| e.into_inner());
    let emit = |level: log::Level, target: &str, args: std::fmt::Arguments| {
        let r = Record::builder()
            .level(level)
            .target(target)
            .args(args)
            .build();
        if to.enabled(r.metadata()) {
            to.log(&r);
        }
    };
    if let Relayed::Held(held, dropped) = &*state {
        for h in held {
            let _at = LoggedAt::set(h.at);
            emit(h.level, &h.target, format_args!("{}", h.line));
        }
        if *dropped > 0 {
            let said = format!("{dropped} more lines from before the mount were dropped");
            emit(log::Level::Warn, "ztensor_mount", format_args!("{said}"));
        }
    }
    *state = Relayed::To(to);
    log::set_max_level(max);
}

pub fn to_file(path: &Path, debug: bool) -> std::io::Result<()> {
    let f = open_log(path)?;
    let to: Box<dyn Write + Send> = if f.metadata()?.is_file() {
        Box::new(Lines {
            out: f,
            torn: false,
        })
    } else {
        Box::new(Records(f))
    };
    let mut b = builder(debug);
    b.target(env_logger::Target::Pipe(to));
    b.format(|buf, r| {
        let when = match LOGGED_AT.get() {
            Some(at) => stamp(at),
            None => buf.timestamp_millis().to_string(),
        };
        writeln!(
            buf,
            "{when} [{}] {}: {}",
            std::process::id(),
            r.level(),
            super::one_line(r.args())
        )
    });
    let logger = b.build();
    let max = logger.filter();
    install(Box::new(logger), max);
    Ok(())
}

/// `at` as the log file's lines give a time (RFC 3339, UTC, milliseconds).
fn stamp(at: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at)
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// A regular file's writer, a record at a time: a record the file took
/// only part of (a full disk) is ended by a newline before the next one
/// that is written, so that no line ever holds parts of two records. A
/// record that cannot be written is dropped; the daemon serves on.
struct Lines<W: Write> {
    out: W,
    /// The last record was cut short.
    torn: bool,
}

impl<W: Write> Lines<W> {
    /// Writes as much of `buf` as the file takes; how much that was.
    fn put(&mut self, buf: &[u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            match self.out.write(&buf[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        done
    }
}

impl<W: Write> Write for Lines<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.torn {
            if self.put(b"\n") != 1 {
                return Ok(buf.len());
            }
            self.torn = false;
        }
        let done = self.put(buf);
        self.torn = done > 0 && done < buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A FIFO's (or other non-file's) writer: one write(2) per record, cut to
/// PIPE_BUF bytes, which a pipe takes whole or not at all, so a reader that
/// falls behind loses whole lines and never gets parts of two glued.
struct Records(std::fs::File);

impl Write for Records {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        const PIPE_BUF: usize = 4096;
        if buf.len() <= PIPE_BUF {
            let _ = self.0.write(buf);
        } else {
            let mut cut = buf[..PIPE_BUF - 1].to_vec();
            cut.push(b'\n');
            let _ = self.0.write(&cut);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Syslog;

impl Log for Syslog {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let prio = match r.level() {
            log::Level::Error => libc::LOG_ERR,
            log::Level::Warn => libc::LOG_WARNING,
            log::Level::Info => libc::LOG_INFO,
            _ => libc::LOG_DEBUG,
        };
        // NUL too is written as %00: one record, one line, whole.
        if let Ok(msg) = CString::new(super::one_line(r.args())) {
            // SAFETY: a constant "%s" format with one argument, a NUL-ended
            // string that lives through the call (so `%` in a message is
            // printed, never read as a directive); syslog(3) is thread-safe.
            unsafe { libc::syslog(prio, c"%s".as_ptr(), msg.as_ptr()) };
        }
    }
    fn flush(&self) {}
}

pub fn to_syslog(debug: bool) {
    // SAFETY: openlog keeps the ident pointer for later syslog calls: a
    // C string literal, which lives as long as the process.
    unsafe { libc::openlog(c"ztensor-mount".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    install(Box::new(Syslog), level(debug));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    #[test]
    fn a_log_file_in_a_folder_every_user_may_write_is_this_users_own_and_no_link() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        // Made fresh: readable by this user alone.
        let mine = dir.path().join("mine.log");
        open_log(&mine).unwrap();
        assert_eq!(std::fs::metadata(&mine).unwrap().mode() & 0o777, 0o600);
        // A link another user put there is not followed.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = dir.path().join("link.log");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = open_log(&link).unwrap_err();
        assert!(e.to_string().contains("a link"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // Another user's file (the tests run as root, who may give it away).
        let theirs = dir.path().join("theirs.log");
        std::fs::write(&theirs, b"").unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = open_log(&theirs).unwrap_err();
        assert!(
            e.to_string().contains("another user's file (uid 65534)"),
            "{e}"
        );
        // In a folder of this user's own, a link is the user's to make.
        let own = tempfile::tempdir().unwrap();
        let link = own.path().join("link.log");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        open_log(&link).unwrap();
    }

    /// A logger that logs again through the relay from inside it, as the
    /// panic hook does for a panic inside a logger.
    struct Reenter(&'static Relay, AtomicUsize);

    impl Log for Reenter {
        fn enabled(&self, _: &Metadata) -> bool {
            true
        }
        fn log(&self, r: &Record) {
            self.1.fetch_add(1, Relaxed);
            self.0.log(r);
            self.0.flush();
        }
        fn flush(&self) {}
    }

    /// A file that holds `room` more bytes, then says it is full.
    struct Disk {
        bytes: Vec<u8>,
        room: usize,
    }

    impl Write for Disk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.room);
            if n == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            self.bytes.extend_from_slice(&buf[..n]);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_record_cut_short_by_a_full_disk_does_not_glue_the_next_to_it() {
        let mut w = Lines {
            out: Disk {
                bytes: Vec::new(),
                room: 15,
            },
            torn: false,
        };
        w.write_all(b"first record\n").unwrap();
        // Two bytes of it fit; then nothing, not even the newline.
        w.write_all(b"second record\n").unwrap();
        w.write_all(b"third record\n").unwrap();
        w.out.room = 100;
        w.write_all(b"fourth record\n").unwrap();
        let text = String::from_utf8(w.out.bytes).unwrap();
        assert_eq!(text, "first record\nse\nfourth record\n");
    }

    #[test]
    fn a_line_logged_from_inside_the_relay_is_dropped_not_waited_for() {
        log::set_max_level(LevelFilter::Error);
        let relay: &'static Relay = Box::leak(Box::new(Relay {
            state: std::sync::Mutex::new(Relayed::Held(Vec::new(), 0)),
        }));
        let to: &'static Reenter = Box::leak(Box::new(Reenter(relay, AtomicUsize::new(0))));
        struct Forward(&'static Reenter);
        impl Log for Forward {
            fn enabled(&self, m: &Metadata) -> bool {
                self.0.enabled(m)
            }
            fn log(&self, r: &Record) {
                self.0.log(r)
            }
            fn flush(&self) {}
        }
        *relay.state.lock().unwrap() = Relayed::To(Box::new(Forward(to)));
        let line = Record::builder()
            .level(log::Level::Error)
            .args(format_args!("a panic"))
            .build();
        relay.log(&line);
        // Written once; the nested line was dropped, and the thread may log
        // again afterwards.
        assert_eq!(to.1.load(Relaxed), 1);
        relay.log(&line);
        assert_eq!(to.1.load(Relaxed), 2);
    }

    #[test]
    fn fusers_error_for_a_dropped_request_is_not_an_error() {
        struct Levels(std::sync::Mutex<Vec<log::Level>>);
        impl Log for &'static Levels {
            fn enabled(&self, _: &Metadata) -> bool {
                true
            }
            fn log(&self, r: &Record) {
                self.0.lock().unwrap().push(r.level());
            }
            fn flush(&self) {}
        }
        log::set_max_level(LevelFilter::Error);
        let seen: &'static Levels = Box::leak(Box::new(Levels(Default::default())));
        let relay = Relay {
            state: std::sync::Mutex::new(Relayed::To(Box::new(seen))),
        };
        let fuser = |msg: std::fmt::Arguments| {
            relay.log(
                &Record::builder()
                    .level(log::Level::Error)
                    .target("fuser::reply")
                    .args(msg)
                    .build(),
            )
        };
        fuser(format_args!(
            "Failed to send FUSE reply: No such file or directory (os error 2)"
        ));
        assert!(seen.0.lock().unwrap().is_empty());
        fuser(format_args!(
            "Failed to send FUSE reply: Bad file descriptor (os error 9)"
        ));
        assert_eq!(*seen.0.lock().unwrap(), [log::Level::Error]);
        // A reply whose pages a truncation took is said in our words.
        assert!(vanished_reply(
            &Record::builder()
                .level(log::Level::Error)
                .target("fuser::reply")
                .args(format_args!(
                    "Failed to send FUSE reply: Bad address (os error 14)"
                ))
                .build()
        ));
        fuser(format_args!(
            "Failed to send FUSE reply: Bad address (os error 14)"
        ));
        assert_eq!(*seen.0.lock().unwrap(), [log::Level::Error; 2]);
    }
}
