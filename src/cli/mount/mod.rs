//! `ztensor-mount FILE MOUNTPOINT`: checks everything it can up front, forks,
//! and returns only when the child has mounted (or says why it could not).

use std::path::Path;
use std::process::ExitCode;

use super::logging;
use super::options::Settings;
use crate::formats::{self, Limits};

mod daemon;
mod mountpoint;
mod table;
mod tuning;
mod unmount;

use daemon::{daemonize, serve};
use mountpoint::{automount_trigger, check_mountpoint, lock_mountpoint, under};
pub(super) use table::mount_at;
use tuning::open_file_limit;
pub(super) use unmount::umount;
pub use unmount::unmount;

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
    eprintln!("ztensor-mount: {}{hint}", crate::cli::one_line(msg));
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
