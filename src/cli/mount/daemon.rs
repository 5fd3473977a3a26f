//! The daemon: the fork that mounts and serves, and how it tells the
//! command it forked from that the mount works (or why not).

use std::fs::File;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};

use super::fail;
use super::mountpoint::fuse_hint;
use super::table::mount_dev;
use super::tuning::{
    backing_files_max, fs_options, fuse_config, no_passthrough, tune_malloc, usable_threads,
    workers,
};
use super::unmount::{stop, umount};
use crate::cli::detach::FromDaemon;
use crate::cli::options::Settings;
use crate::cli::{detach, logging};
use crate::formats::Opened;
use crate::mount::fs::TensorFs;
use crate::mount::fuse::Adapter;

pub(super) fn daemonize(
    opened: Opened,
    mountpoint: &Path,
    s: &Settings,
    lock: Option<File>,
) -> ExitCode {
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

/// Mounts and serves until unmounted or signalled. `ready` gets "mounted
/// DEV" once the mount exists, then the reason if serving it fails; or the
/// reason it could not mount. (Written to a command that may have gone:
/// SIGPIPE is ignored, as Rust sets it.)
pub(super) fn serve(
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
    // Why it cannot mount: the command that waits prints it, and the log
    // says it too, where a mount made by fstab or a service loses the
    // command's stderr (in the foreground stderr is the log).
    let refuse = |msg: &str| {
        if waiting {
            log::error!("{msg}");
        }
        report(msg)
    };
    let sigset = detach::block_exit_signals();
    let remote = opened.sources.iter().flatten().any(|f| f.is_remote());
    let label = opened.catalog.label.clone();
    let count = opened.catalog.len();
    let (fs, time) = match filesystem(opened, s) {
        Ok(made) => made,
        Err(msg) => {
            refuse(&msg);
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
    let threads = usable_threads(s.threads);
    let session = match fuser::Session::new(adapter, mountpoint, &fuse_config(s, &label, threads)) {
        Ok(sess) => sess,
        Err(e) => {
            // fusermount3's own words end with a newline.
            let msg = format!(
                "cannot mount {label} on {}: {}{}",
                mountpoint.display(),
                e.to_string().trim_end(),
                fuse_hint(&e)
            );
            refuse(&msg);
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
        refuse(&msg);
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
        threads,
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
    let prefault = crate::cli::prefault::start();
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
