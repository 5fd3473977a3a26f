//! `ztensor-mount FILE MOUNTPOINT`: checks everything it can up front, forks,
//! and returns only when the child has mounted (or says why it could not).

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use fuser::{Config, MountOption, SessionACL};

use super::detach::{self, FromDaemon};
use super::logging;
use super::options::Settings;
use crate::formats::{self, Limits, Opened};
use crate::mount::backing::BackingOptions;
use crate::mount::fs::{FsOptions, TensorFs};
use crate::mount::fuse::Adapter;
use crate::serve::data::{DataOptions, PROGRESSIVE_MIN};
use crate::serve::spill;

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    let msg = msg.to_string();
    // Out of descriptors (EMFILE), most likely a sharded set of many shards
    // under a low limit: say which limit.
    let hint = if msg.ends_with("(os error 24)") {
        format!(
            " (this process may hold {} open files: raise the limit with ulimit -n)",
            open_file_limit()
        )
    } else {
        String::new()
    };
    eprintln!("ztensor-mount: {msg}{hint}");
    ExitCode::from(1)
}

pub fn run(file: &Path, mountpoint: &Path, mut s: Settings) -> ExitCode {
    // Before any source is opened: a sharded set holds its shards open.
    open_file_limit();
    if s.foreground {
        logging::to_stderr(s.debug);
    } else {
        logging::hold(s.debug);
    }
    // Errors must be findable: without syslog, a file in a known place
    // (said once the mount is up).
    let defaulted_log = !s.foreground && s.log_file.is_none() && !logging::syslog_available();
    if defaulted_log {
        s.log_file = Some(logging::default_log_file());
    }
    let remote = crate::source::is_remote(&file.to_string_lossy());
    // Absolute (the daemon leaves the working directory), but with its
    // links kept: a link's siblings (shards, external data) are those
    // beside it, as for every loader, not beside its target (a Hugging
    // Face cache's snapshot is links into a folder of blobs).
    let file = match std::fs::metadata(file).and_then(|_| std::path::absolute(file)) {
        _ if remote => file.to_path_buf(),
        Ok(p) => p,
        Err(e) => return fail(format!("{}: {e}", file.display())),
    };
    // Checked again once no other mount of ours is under way there: two
    // at once would both find it free.
    let (mountpoint, lock) = match check_mountpoint(mountpoint)
        .and_then(|p| Ok((lock_mountpoint(&p)?, p)))
        .and_then(|(lock, p)| Ok((check_mountpoint(&p)?, lock)))
    {
        Ok(checked) => checked,
        Err(e) => return fail(e),
    };
    // Files made there once mounted would be asked of this very mount,
    // whose workers would wait on themselves.
    if let Some(dir) = under(&s.cache_dir, &mountpoint) {
        return fail(format!(
            "cache directory {} is inside the mountpoint {}, which the mount hides ({})",
            dir.display(),
            mountpoint.display(),
            super::CHOOSE_CACHE_DIR
        ));
    }
    // The log would go under the mount, hidden from whoever looks for it.
    if let Some(log) = &s.log_file
        && log.parent().and_then(|d| under(d, &mountpoint)).is_some()
    {
        return fail(format!(
            "log file {} is inside the mountpoint {}, which the mount hides",
            log.display(),
            mountpoint.display()
        ));
    }
    warn_of_options_that_cannot_apply(&file, &s, remote);
    if !automount_trigger(&mountpoint)
        && std::fs::read_dir(&mountpoint).is_ok_and(|mut d| d.next().is_some())
    {
        eprintln!(
            "ztensor-mount: warning: {} is not empty; its contents are hidden while mounted",
            mountpoint.display()
        );
    }
    if let Err(e) = super::writable_cache_dir(&s.cache_dir) {
        return fail(format!("{e} ({})", super::CHOOSE_CACHE_DIR));
    }
    let limits = Limits {
        index_memory: s.index_memory,
    };
    let started = std::time::Instant::now();
    let prefault = super::prefault::start();
    let opened = formats::open_arg(&file.to_string_lossy(), limits, &s.remote);
    // Before a fork, which must copy a process of one thread.
    prefault.stop();
    let opened = match opened {
        Ok(opened) => opened,
        Err(e) => return fail(e),
    };
    log::debug!(
        "{}: {} tensors indexed in {:?}",
        opened.catalog.label,
        opened.catalog.len(),
        started.elapsed()
    );
    if s.foreground {
        let code = serve(opened, &mountpoint, &s, None, lock);
        crate::source::before_exit();
        return code;
    }
    let code = daemonize(opened, &mountpoint, &s, lock);
    if code == ExitCode::SUCCESS
        && defaulted_log
        && let Some(p) = &s.log_file
    {
        eprintln!(
            "ztensor-mount: no syslog here ({} is not a socket); logging to {}",
            logging::SYSLOG_SOCKET,
            p.display()
        );
    }
    code
}

/// What to do when mounting failed for want of `/dev/fuse`.
fn fuse_hint(e: &std::io::Error) -> String {
    let dev = Path::new("/dev/fuse");
    let Ok(meta) = std::fs::metadata(dev) else {
        return " (/dev/fuse is missing: load the fuse module with modprobe fuse, or in a \
                container pass --device /dev/fuse)"
            .into();
    };
    let cannot_open = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .is_err();
    // The mount opens /dev/fuse itself, then lets fusermount3 mount for a
    // user other than root: without the first it cannot reach the second.
    if cannot_open {
        return format!(
            " (/dev/fuse is mode {:04o} here, closed to this user: make it 0666 as udev \
             does (chmod 0666 /dev/fuse), or mount as root)",
            meta.permissions().mode() & 0o7777
        );
    }
    let denied = matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
        || e.kind() == std::io::ErrorKind::PermissionDenied;
    match fusermount3() {
        _ if !denied => String::new(),
        None => " (a user other than root mounts through fusermount3: install fuse3)".into(),
        Some(path) if !setuid_root(&path) => format!(
            " ({} is not setuid root, which it must be to mount for a user other than root)",
            path.display()
        ),
        Some(_) => String::new(),
    }
}

/// fusermount3 as the PATH finds it.
fn fusermount3() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("fusermount3"))
        .find(|p| p.is_file())
}

fn setuid_root(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.uid() == 0 && m.permissions().mode() & 0o4000 != 0)
}

fn check_mountpoint(p: &Path) -> Result<PathBuf, String> {
    let why = |p: &Path, e: std::io::Error| {
        let hint = match e.raw_os_error() {
            Some(libc::ENOTCONN | libc::ECONNABORTED) => format!(
                " (a mount whose daemon died: ztensor-mount -u {})",
                p.display()
            ),
            _ => String::new(),
        };
        format!("mountpoint {}: {e}{hint}", p.display())
    };
    let abs = std::fs::canonicalize(p).map_err(|e| why(p, e))?;
    let meta = std::fs::metadata(&abs).map_err(|e| why(&abs, e))?;
    if !meta.is_dir() {
        return Err(format!("mountpoint {}: not a directory", abs.display()));
    }
    if let Some(parent) = abs.parent()
        && let Ok(pm) = std::fs::metadata(parent)
        && (pm.dev() != meta.dev() || pm.ino() == meta.ino())
        && abs != Path::new("/")
        // systemd's x-systemd.automount puts an autofs trigger there first
        // and mounts on top of it when the path is used.
        && !automount_trigger(&abs)
    {
        return Err(format!(
            "mountpoint {}: already a mount point (unmount it first: ztensor-mount -u {})",
            abs.display(),
            abs.display()
        ));
    }
    Ok(abs)
}

/// Takes the lock that one mount at a time holds on the directory at `p`
/// from its check until its mount exists (an exclusive `flock` of the
/// directory under the mount; `None` where it cannot be opened or locked
/// at all, as on a filesystem without locks), or says that another
/// ztensor-mount holds it.
fn lock_mountpoint(p: &Path) -> Result<Option<File>, String> {
    // An open of an automount trigger would start the mount systemd is
    // making with this very command.
    if automount_trigger(p) {
        return Ok(None);
    }
    let Ok(dir) = File::open(p) else {
        return Ok(None);
    };
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(dir));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EWOULDBLOCK) => Err(format!(
            "mountpoint {}: another process holds a lock on it (another ztensor-mount \
             mounting there?)",
            p.display()
        )),
        _ => Ok(None),
    }
}

/// `path` as the kernel resolves it, when that is `dir` or inside it.
fn under(path: &Path, dir: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path)
        .ok()
        .filter(|p| p.starts_with(dir))
}

/// Warns of options that cannot do what they say here: a cache larger
/// than the machine, a URL's options given with a local file.
fn warn_of_options_that_cannot_apply(file: &Path, s: &Settings, remote: bool) {
    if let Some(total) = super::options::physical_memory()
        && s.cache_size > total
    {
        eprintln!(
            "ztensor-mount: warning: --cache-size {} is more than this machine's memory ({total} \
             bytes): the daemon may run out of memory before the cache is full",
            s.cache_size
        );
    }
    if remote {
        return;
    }
    for (given, option) in [
        (s.remote.revision.is_some(), "--revision"),
        (s.remote.endpoint.is_some(), "--endpoint"),
        (s.remote.ca_file.is_some(), "--ca-file"),
    ] {
        if given {
            eprintln!(
                "ztensor-mount: warning: {option} is for a URL; {} is a local file",
                file.display()
            );
        }
    }
}

/// Whether `p` holds an autofs trigger (systemd's `x-systemd.automount`),
/// which a mount goes on top of: opening it would start that mount.
fn automount_trigger(p: &Path) -> bool {
    mount_at(p).is_some_and(|(_, fstype)| fstype == "autofs")
}

fn daemonize(opened: Opened, mountpoint: &Path, s: &Settings, lock: Option<File>) -> ExitCode {
    // The fork must copy a process of one thread (see below).
    crate::source::before_fork();
    // Held for the command to read (see `FromDaemon`); the daemon blocks
    // them anyway, for its signal thread.
    detach::block_exit_signals();
    let mut fds = [0; 2];
    // SAFETY: `fds` is the two c_ints pipe2 writes on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return fail(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors come fresh from the pipe2 that just
    // succeeded; nothing else owns them, and each is wrapped once.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: this thread is the process's only one here (the threads
    // started before are the remote runtime's, stopped above and made anew
    // per process, and the heap's prefault thread, joined once the index
    // was read), so no lock is held by a thread the child lacks, and the
    // child may run any code.
    match unsafe { libc::fork() } {
        -1 => fail(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(rd);
            // SAFETY: takes nothing and touches no memory; a fresh child
            // leads no process group, so it cannot fail with EPERM.
            unsafe { libc::setsid() };
            detach::close_inherited();
            // As daemons do: hold no directory of the caller's busy (paths
            // were made absolute before the fork).
            let _ = std::env::set_current_dir("/");
            match &s.log_file {
                Some(p) => {
                    if let Err(e) = logging::to_file(p, s.debug) {
                        let _ = File::from(wr).write_all(
                            format!("cannot open log file {}: {e}\n", p.display()).as_bytes(),
                        );
                        std::process::exit(1);
                    }
                }
                None => logging::to_syslog(s.debug),
            }
            detach_stdio();
            crate::source::after_fork();
            let code = serve(opened, mountpoint, s, Some(File::from(wr)), lock);
            crate::source::before_exit();
            std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
        }
        daemon => {
            drop(wr);
            // This process only waits and exits: freeing the catalog here
            // would touch every page of it, copying each from the child it
            // now shares them with (half a second for 10^5 tensors).
            std::mem::forget(opened);
            let mut rd = FromDaemon::new(File::from(rd), daemon, mountpoint);
            let msg = rd.read_line();
            match msg.trim().split_once(' ') {
                // Mounted; live once all the daemon's serving threads have
                // started (starting one can still fail, a pids limit say)
                // and a stat is answered. The stat is made here, not by the
                // daemon: a daemon thread waiting on its own mount could
                // keep it from ever exiting.
                Some(("mounted", dev)) => {
                    let not_served = |why: &dyn std::fmt::Display| {
                        format!(
                            "the mount on {} is not served: {why} (see syslog or --log-file)",
                            mountpoint.display()
                        )
                    };
                    match rd.read_line().trim() {
                        // The stat is answered by this mount, not by the
                        // directory under it once it went away.
                        "serving" => match std::fs::metadata(mountpoint) {
                            Ok(_)
                                if dev == "-" || mount_dev(mountpoint).as_deref() == Some(dev) =>
                            {
                                ExitCode::SUCCESS
                            }
                            Ok(_) => {
                                not_live(mountpoint, dev, &mut rd, not_served(&"it went away"))
                            }
                            Err(e) => not_live(mountpoint, dev, &mut rd, not_served(&e)),
                        },
                        "" => not_live(mountpoint, dev, &mut rd, not_served(&"the daemon exited")),
                        why => not_live(mountpoint, dev, &mut rd, why.to_string()),
                    }
                }
                _ if msg.trim().is_empty() => fail(
                    "the mount daemon exited before the mount was ready (see syslog or --log-file)",
                ),
                _ => fail(msg.trim()),
            }
        }
    }
}

/// The mount exists but is not served: says why (the daemon's own reason
/// when it gives one in time), and takes the mount down (lazily) if it is
/// still the one the daemon made.
fn not_live(mountpoint: &Path, dev: &str, rd: &mut FromDaemon, why: String) -> ExitCode {
    let more = rd.read_rest(2000);
    if mount_dev(mountpoint).as_deref() == Some(dev) {
        let _ = umount(mountpoint, true);
    }
    fail(match more.trim() {
        "" => why,
        more => more.to_string(),
    })
}

fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: `null` is open. std keeps 0-2 open from the start (it
            // opens /dev/null over any missing), so no OwnedFd here holds
            // those numbers; dup2 replaces each at once, and std's stdio
            // handles use them only by number.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Why the kernel will not be asked for passthrough, when it will not: it
/// was turned off, or the daemon lacks CAP_SYS_ADMIN, which registering a
/// backing file needs.
fn no_passthrough(s: &Settings) -> Option<String> {
    if !s.passthrough {
        return Some("passthrough is off (--no-passthrough)".into());
    }
    if !has_sys_admin() {
        return Some("passthrough needs CAP_SYS_ADMIN (mount as root)".into());
    }
    None
}

/// linux/capability.h.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether this process holds CAP_SYS_ADMIN (bit 21 of `CapEff` in
/// /proc/self/status).
fn has_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// For a mount of a remote object: allocations from this size on get a
/// mapping of their own (above the HTTP client's largest receive buffer,
/// hyper's 408 KiB), and a heap keeps up to this much free memory at its
/// top (the buffers of the requests in flight, freed and taken again).
const REMOTE_MMAP_THRESHOLD: libc::c_int = 512 << 10;
const REMOTE_TRIM_THRESHOLD: libc::c_int = 32 << 20;

/// Mounts and serves until unmounted or signalled. `ready` gets "mounted
/// DEV" once the mount exists, then the reason if serving it fails; or the
/// reason it could not mount. (Written to a command that may have gone:
/// SIGPIPE is ignored, as Rust sets it.)
fn serve(
    opened: Opened,
    mountpoint: &Path,
    s: &Settings,
    ready: Option<File>,
    lock: Option<File>,
) -> ExitCode {
    let waiting = ready.is_some();
    // In the foreground the default hook's stderr is the log already.
    if waiting {
        logging::log_panics();
    }
    let ready = Arc::new(Mutex::new(ready));
    let report = |msg: &str| tell(&ready, msg);
    let sigset = detach::block_exit_signals();
    let remote = opened.sources.iter().flatten().any(|f| f.is_remote());
    let label = opened.catalog.label.clone();
    let count = opened.catalog.len();
    let (fs, time) = match filesystem(opened, s) {
        Ok(made) => made,
        Err(msg) => {
            report(&msg);
            return fail(msg);
        }
    };
    tune_malloc(remote);
    // SAFETY: getuid and getgid take nothing, touch no memory of ours and
    // cannot fail.
    let uid = s.uid.unwrap_or_else(|| unsafe { libc::getuid() });
    let gid = s.gid.unwrap_or_else(|| unsafe { libc::getgid() });
    // Set once mounted: a copy of the session's /dev/fuse descriptor. The
    // session is over for good (and the daemon may exit at once, before
    // fuser unmounts the mountpoint *path*, where a new mount may sit by
    // now) when the kernel has disconnected it: it does so when it
    // unmounts, and the descriptor then polls POLLERR. The mountpoint or
    // its device number cannot tell: a new mount there may even reuse the
    // device number the old one freed.
    let connection: Arc<OnceLock<OwnedFd>> = Arc::default();
    let unmounted = {
        let connection = connection.clone();
        Box::new(move || connection.get().is_none_or(disconnected))
    };
    let filled = fs.filled_hook();
    let behind = fs.behind_hook();
    let views_layout = fs.views_layout();
    let adapter = Adapter::new(fs, uid, gid, time, s.max_read, unmounted, no_passthrough(s));
    let session = match fuser::Session::new(adapter, mountpoint, &fuse_config(s, &label)) {
        Ok(sess) => sess,
        Err(e) => {
            let msg = format!(
                "cannot mount {label} on {}: {e}{}",
                mountpoint.display(),
                fuse_hint(&e)
            );
            report(&msg);
            return fail(msg);
        }
    };
    // Mounted: a mount that comes next finds it so (the caller, which
    // shares the lock, lets go of it when it returns).
    drop(lock);
    crate::mount::fuse::drop_cache_when_filled(&filled, &behind, session.notifier());
    match std::os::fd::AsFd::as_fd(&session).try_clone_to_owned() {
        Ok(fd) => {
            let _ = connection.set(fd);
        }
        Err(e) => log::warn!(
            "cannot keep a copy of the FUSE descriptor ({e}): at exit, the mount is unmounted by its path"
        ),
    }
    let dev = mount_dev(mountpoint);
    if let Some(dev) = &dev {
        tune_bdi(dev, s.read_ahead_kb);
    }
    log::info!(
        "mounted {label} ({count} {}) on {}",
        if count == 1 { "tensor" } else { "tensors" },
        mountpoint.display()
    );

    let dev_seen = dev.clone().unwrap_or_else(|| "-".into());
    let waiter = unmount_on_signal(sigset, mountpoint.to_path_buf(), dev);
    // Dropping the session (on return) unmounts.
    let no_thread = |e: std::io::Error| {
        let msg = format!("{label}: cannot start a thread: {e}");
        report(&msg);
        fail(msg)
    };
    if let Err(e) = waiter {
        return no_thread(e);
    }
    report(&format!("mounted {dev_seen}\n"));
    // run() below starts the workers; it returns an error if one cannot
    // start, with the others already answering.
    let ended = Arc::new(AtomicBool::new(false));
    let watcher = when_serving(
        s.threads,
        ended.clone(),
        waiting.then(|| ready.clone()),
        views_layout,
    );
    if let Err(e) = watcher {
        return no_thread(e);
    }
    let run = session.run();
    ended.store(true, Relaxed);
    if let Err(e) = run {
        log::error!("session ended: {e}");
        report(&format!(
            "cannot serve {label} on {}: {e}",
            mountpoint.display()
        ));
        return ExitCode::from(1);
    }
    log::info!("unmounted {}", mountpoint.display());
    ExitCode::SUCCESS
}

/// The filesystem of what was opened, and the time its files show (the
/// source's modification time); or why it cannot be made.
fn filesystem(opened: Opened, s: &Settings) -> Result<(TensorFs, std::time::SystemTime), String> {
    let label = opened.catalog.label.clone();
    let time = opened
        .sources
        .first()
        .and_then(|f| f.as_ref())
        .and_then(|f| f.opened().modified().ok())
        .unwrap_or(std::time::UNIX_EPOCH);
    let started = std::time::Instant::now();
    let prefault = super::prefault::start();
    let fs = TensorFs::new(opened.catalog, opened.sources, fs_options(s));
    prefault.stop();
    let fs = fs.map_err(|e| format!("{label}: {e}"))?;
    fs.limit_files(backing_files_max());
    log::debug!(
        "{label}: tree and views laid out in {:?}",
        started.elapsed()
    );
    Ok((fs, time))
}

/// Sets malloc for the daemon's allocations. Decoded frames are large and
/// short-lived: malloc gives each its own mapping and returns it on free,
/// so freed frames never linger in per-thread heaps and memory tracks the
/// cache's own count. A remote object's HTTP client receives into buffers
/// of up to about 400 KiB, one new one per piece of a body: those are kept
/// below the threshold and the heaps keep what they free, so that they are
/// reused rather than mapped anew (each page of a new mapping is a page
/// fault, and new memory on the project's VM: 40% of the fetch threads'
/// time on a cold read over loopback went to those faults).
fn tune_malloc(remote: bool) {
    let (mmap_at, trim_at) = if remote {
        (REMOTE_MMAP_THRESHOLD, REMOTE_TRIM_THRESHOLD)
    } else {
        (128 << 10, 128 << 10)
    };
    // SAFETY: sets tunables under malloc's own lock (glibc's mallopt is
    // thread-safe); no memory of ours is passed.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, mmap_at);
        libc::mallopt(libc::M_TRIM_THRESHOLD, trim_at);
    }
}

/// Descriptors kept for the daemon's later use (the FUSE device, a remote
/// object's sockets, the log), besides those open once the filesystem is
/// made (its sources: a sharded set holds each shard open), before any go
/// to backing files and spills.
const OWN_FILES: usize = 64;

/// Backing files at most at once: half of the descriptors past those open
/// now and [`OWN_FILES`] (spills get half as many; see
/// `TensorFs::limit_files`). Says so at mount when the limit leaves few.
fn backing_files_max() -> usize {
    let limit = open_file_limit();
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let max = limit.saturating_sub(open + OWN_FILES) / 2;
    if max < 64 {
        log::warn!(
            "the open-file limit is {limit}, {open} open: backing files at most {max} at once, \
             spills at most {} (raise the limit with ulimit -n for more)",
            (max / 2).max(1)
        );
    }
    max
}

/// How many descriptors the daemon may hold, its soft limit first raised
/// to the hard one (as a daemon holding a file per backed tensor should:
/// the soft limit is often 1024 where the hard one is far higher).
fn open_file_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the one struct we pass it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the one struct we pass it; raising the
        // soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}

/// The filesystem's options, from the command line's.
fn fs_options(s: &Settings) -> FsOptions {
    FsOptions {
        data: DataOptions {
            cache_size: s.cache_size,
            cache_dir: s.cache_dir.clone(),
            verify_raw: s.verify_raw,
            progressive_min: PROGRESSIVE_MIN,
        },
        direct_io: s.direct_io,
        views: s.views,
        xattrs: s.xattrs,
        backing: BackingOptions {
            enabled: s.passthrough,
            dir: s.cache_dir.clone(),
            limit: s
                .decoded_cache_size
                .unwrap_or_else(|| spill::free_bytes(&s.cache_dir).map_or(u64::MAX, |f| f / 2)),
        },
    }
}

/// The FUSE session's mount options, access and threads.
fn fuse_config(s: &Settings, label: &str) -> Config {
    let mut mount_options = vec![
        MountOption::FSName(label.to_string()),
        MountOption::Subtype("ztensor-mount".into()),
        // fuser's own mount(2) path leaves Subtype to fusermount3 and mounts
        // plain "fuse"; the kernel takes the subtype as an option, so the
        // type reads fuse.ztensor-mount either way (findmnt -t, umount -t).
        MountOption::CUSTOM("subtype=ztensor-mount".into()),
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        MountOption::DefaultPermissions,
    ];
    if s.auto_unmount {
        mount_options.push(MountOption::AutoUnmount);
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = if s.allow_other {
        SessionACL::All
    } else if s.allow_root || s.auto_unmount {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(s.threads);
    config.clone_fd = s.threads > 1;
    config
}

/// A thread that waits for an exit signal (blocked in `sigset`) and
/// unmounts `mp` (of device `dev`) when one comes.
fn unmount_on_signal(
    sigset: libc::sigset_t,
    mp: PathBuf,
    dev: Option<String>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `sigset` is an initialized set (moved into this
            // thread) and `sig` a live c_int the call writes.
            if unsafe { libc::sigwait(&sigset, &mut sig) } == 0 {
                log::info!("signal {sig}: unmounting {}", mp.display());
                stop(&mp, dev.as_deref());
            }
        })
}

/// A thread that says "serving" down `pipe` (when a command waits on it)
/// once all `n` workers have started, then lays out the views'
/// directories (the mount is live without them: the first lookup in one
/// would otherwise lay them out); nothing once `ended`.
fn when_serving(
    n: usize,
    ended: Arc<AtomicBool>,
    pipe: Option<Arc<Mutex<Option<File>>>>,
    views_layout: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ready".into())
        .spawn(move || {
            // Without /proc to count them, or if they take implausibly
            // long, say so anyway rather than keep the command waiting.
            let start = std::time::Instant::now();
            while let Some(pipe) = pipe.as_ref().filter(|_| !ended.load(Relaxed)) {
                if workers().is_none_or(|w| w >= n)
                    || start.elapsed() > std::time::Duration::from_secs(10)
                {
                    tell(pipe, "serving\n");
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            if !ended.load(Relaxed) {
                views_layout();
            }
        })
}

/// Whether the kernel has disconnected the FUSE connection of `fd` (it
/// polls POLLERR then; an error of poll itself counts as not).
fn disconnected(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd, a descriptor this process owns, no wait.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return r == 1 && p.revents & libc::POLLERR != 0;
    }
}

/// Writes `msg` to the waiting command, if there is one.
fn tell(ready: &Mutex<Option<File>>, msg: &str) {
    if let Some(f) = ready.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        let _ = f.write_all(msg.as_bytes());
    }
}

/// How many of fuser's worker threads ("fuser-N") this process has.
fn workers() -> Option<usize> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut n = 0;
    for t in tasks.flatten() {
        // A name that cannot be read (no descriptor left under a small
        // `ulimit -n`) leaves the count unknown, not short.
        if std::fs::read(t.path().join("comm"))
            .ok()?
            .starts_with(b"fuser-")
        {
            n += 1;
        }
    }
    Some(n)
}

/// The mount's device ("0:53") from /proc/self/mountinfo: a stat of the
/// mountpoint would wait for the very daemon that is not serving yet.
fn mount_dev(mountpoint: &Path) -> Option<String> {
    mount_at(mountpoint).map(|(dev, _)| dev)
}

/// The device and type of the last mount on `mountpoint`.
pub(super) fn mount_at(mountpoint: &Path) -> Option<(String, String)> {
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    find_mount(&info, mountpoint.as_os_str().as_encoded_bytes())
}

/// The device and type of the last mount on `mountpoint` in mountinfo
/// text, whose paths escape space, tab, newline and backslash as octal
/// (`\040`).
fn find_mount(info: &[u8], mountpoint: &[u8]) -> Option<(String, String)> {
    info.split(|&b| b == b'\n').rev().find_map(|l| {
        let f: Vec<&[u8]> = l.split(|&b| b == b' ').collect();
        let fstype = f.iter().skip_while(|x| **x != b"-").nth(1)?;
        (f.len() > 4 && unescape_octal(f[4]) == mountpoint).then(|| {
            (
                String::from_utf8_lossy(f[2]).into_owned(),
                String::from_utf8_lossy(fstype).into_owned(),
            )
        })
    })
}

fn unescape_octal(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let digits = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match digits {
            Some(d) => {
                let v = d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

/// Raises the mount's own readahead (the kernel's default is 128 KiB).
fn tune_bdi(dev: &str, kb: u32) {
    if kb == 0 {
        return;
    }
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => log::debug!("{path} = {kb}"),
        // Only root may write it: other users' mounts keep the kernel's
        // readahead (128 KiB), which matters only in page-cache mode.
        Err(e) => log::info!("readahead stays at the kernel's default: cannot set {path}: {e}"),
    }
}

/// Unmounts on a signal. Files still open would make a plain unmount fail
/// (EBUSY), so the mount is then detached at once and its readers get two
/// seconds to finish before the connection is aborted: the daemon always
/// exits and no reader is left hanging.
fn stop(mp: &Path, dev: Option<&str>) {
    // Unmounts go by path: if this mount was detached (-u -z) and another
    // now sits at the path, that one is not ours to take down.
    if dev.is_some() && mount_dev(mp).as_deref() != dev {
        log::info!(
            "{} is no longer this daemon's mount (detached); not unmounting it",
            mp.display()
        );
    } else {
        match umount(mp, false) {
            Ok(()) => return,
            Err(e) => log::info!("{}: {e}; detaching it", mp.display()),
        }
        if let Err(e) = umount(mp, true) {
            log::error!("cannot detach {}: {e}", mp.display());
        }
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    // Still here: some reader holds a file open.
    abort_and_exit(mp, dev);
}

/// Aborts the connection (readers get ENOTCONN, none hang) and exits.
fn abort_and_exit(mp: &Path, dev: Option<&str>) -> ! {
    if let Some(minor) = dev.and_then(|d| d.split(':').nth(1)) {
        let abort = format!("/sys/fs/fuse/connections/{minor}/abort");
        log::warn!(
            "files are still open on {}; aborting the connection",
            mp.display()
        );
        let _ = std::fs::write(abort, "1");
    }
    // The abort file exists only where fusectl is mounted, and only root may
    // write it. Exiting closes /dev/fuse, which aborts the connection too.
    std::thread::sleep(std::time::Duration::from_millis(500));
    log::warn!("exiting with files still open on {}", mp.display());
    crate::source::before_exit();
    std::process::exit(0);
}

/// The type of the mount on `mp` when it is not a FUSE one, which `-u`
/// leaves alone (as root, umount2 would unmount anything). Its folder is
/// resolved, not the mount itself: a stat of it could wait on a daemon
/// that does not answer.
fn other_than_fuse(mp: &Path) -> Option<String> {
    let abs = std::path::absolute(mp).ok()?;
    let real = match (abs.parent(), abs.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir).ok()?.join(name),
        // `..`, `/`: no name to keep out of the resolving.
        _ => std::fs::canonicalize(&abs).ok()?,
    };
    let (_, fstype) = mount_at(&real)?;
    let fuse = fstype == "fuse" || fstype == "fuseblk" || fstype.starts_with("fuse.");
    (!fuse).then_some(fstype)
}

/// umount2, or fusermount3 for users without CAP_SYS_ADMIN. A link in
/// the mountpoint's place is not followed (`-u` checked what is there).
pub(super) fn umount(mp: &Path, lazy: bool) -> std::io::Result<()> {
    let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a NUL-ended path that lives through the call, which
    // only reads it.
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    let out = std::process::Command::new("fusermount3")
        .arg(if lazy { "-uz" } else { "-u" })
        .arg(mp)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "fusermount3 (which unmounts for users other than root; package fuse3): {e}"
                ),
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    // Its one line, as an errno where it names one, so callers (and their
    // hints) see the same errors as from umount2.
    let said = String::from_utf8_lossy(&out.stderr);
    let said = said.lines().next().unwrap_or("").trim();
    Err(if said.contains("Device or resource busy") {
        std::io::Error::from_raw_os_error(libc::EBUSY)
    } else if said.contains("Invalid argument") || said.contains("not found in") {
        // fusermount3 says the same of a mount that is not the caller's.
        let abs: PathBuf = std::path::absolute(mp)
            .unwrap_or_else(|_| mp.to_path_buf())
            .components()
            .collect();
        if mount_dev(&abs).is_some() {
            std::io::Error::from_raw_os_error(libc::EPERM)
        } else {
            std::io::Error::from_raw_os_error(libc::EINVAL)
        }
    } else if said.is_empty() {
        std::io::Error::other(format!("fusermount3 failed ({})", out.status))
    } else {
        std::io::Error::other(format!("fusermount3: {said}"))
    })
}

/// `ztensor-mount -u [-z] MOUNTPOINT`: unmounts, also a mount whose
/// daemon died; `-z` (`--lazy`) detaches a busy one.
pub fn unmount(mountpoint: &Path, lazy: bool) -> ExitCode {
    if let Some(fstype) = other_than_fuse(mountpoint) {
        return fail(format!(
            "cannot unmount {}: it is a {fstype} mount, not a FUSE one (unmount it with umount)",
            mountpoint.display()
        ));
    }
    match umount(mountpoint, lazy) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A link is not followed: a mount at its target stays.
            let link = std::fs::read_link(mountpoint).ok();
            let through_link = link.map(|to| {
                format!(
                    " (a symbolic link to {}: give the mount point itself)",
                    to.display()
                )
            });
            let hint = match e.raw_os_error() {
                Some(libc::EINVAL) if through_link.is_some() => {
                    through_link.as_deref().unwrap_or("")
                }
                Some(libc::EINVAL) => " (not a mount point)",
                Some(libc::EPERM) => " (mounted by another user, or not a FUSE mount)",
                Some(libc::EBUSY) => {
                    " (busy: close the files open there, or detach it now with -u -z)"
                }
                _ => "",
            };
            fail(format!(
                "cannot unmount {}: {e}{hint}",
                mountpoint.display()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        let info = b"22 1 0:21 / /proc rw - proc proc rw\n\
            90 30 0:53 / /mnt/my\\040model\\011x\\134y rw - fuse.ztensor-mount z ro\n\
            91 30 0:54 / /mnt/my rw - fuse.ztensor-mount z ro\n";
        let dev = |mp: &[u8]| find_mount(info, mp).map(|(d, _)| d);
        assert_eq!(dev(b"/mnt/my model\tx\\y").as_deref(), Some("0:53"));
        assert_eq!(dev(b"/mnt/my").as_deref(), Some("0:54"));
        assert_eq!(dev(b"/mnt/my\\040model"), None);
        assert_eq!(
            find_mount(info, b"/proc").map(|(_, t)| t).as_deref(),
            Some("proc")
        );
        assert_eq!(unescape_octal(b"a\\09b\\"), b"a\\09b\\".to_vec());
    }
}
