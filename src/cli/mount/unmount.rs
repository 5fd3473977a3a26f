//! `ztensor-mount -u [-z] MOUNTPOINT`, and the unmount of a daemon that
//! stops.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::fail;
use super::table::{mount_at, mount_dev};

/// Unmounts on a signal. Files still open would make a plain unmount fail
/// (EBUSY), so the mount is then detached at once and its readers get two
/// seconds to finish before the connection is aborted: the daemon always
/// exits and no reader is left hanging.
pub(super) fn stop(mp: &Path, dev: Option<&str>) {
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
pub(in crate::cli) fn umount(mp: &Path, lazy: bool) -> std::io::Result<()> {
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
        // Its lines start with its name already.
        let said = said.strip_prefix("fusermount3: ").unwrap_or(said);
        let hint = super::mountpoint::no_user_name(said).unwrap_or_default();
        std::io::Error::other(format!("fusermount3: {said}{hint}"))
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
