//! The mountpoint, checked and locked before anything is opened, and what
//! to say when FUSE cannot be used.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::table::mount_at;

/// What to do when mounting failed for want of `/dev/fuse`.
pub(super) fn fuse_hint(e: &std::io::Error) -> String {
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
    if let Some(hint) = no_user_name(&e.to_string()) {
        return hint;
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

/// What to do where fusermount3 said it cannot name the user: a uid with
/// no passwd entry (a container run with `--user 12345`), which it refuses
/// to mount or unmount for.
pub(super) fn no_user_name(said: &str) -> Option<String> {
    said.contains("could not determine username").then(|| {
        // SAFETY: getuid takes nothing, touches no memory and cannot fail.
        let uid = unsafe { libc::getuid() };
        format!(
            " (fusermount3 mounts only for a user with a passwd entry, and uid {uid} has \
             none: add one, or mount as root)"
        )
    })
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

pub(super) fn check_mountpoint(p: &Path) -> Result<PathBuf, String> {
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
pub(super) fn lock_mountpoint(p: &Path) -> Result<Option<File>, String> {
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
pub(super) fn under(path: &Path, dir: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path)
        .ok()
        .filter(|p| p.starts_with(dir))
}

/// Whether `p` holds an autofs trigger (systemd's `x-systemd.automount`),
/// which a mount goes on top of: opening it would start that mount.
pub(super) fn automount_trigger(p: &Path) -> bool {
    mount_at(p).is_some_and(|(_, fstype)| fstype == "autofs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusermount3_without_a_user_name_is_told_what_to_do() {
        let hint = no_user_name("fusermount3: could not determine username").unwrap();
        assert!(
            hint.contains("passwd entry") && hint.contains("mount as root"),
            "{hint}"
        );
        assert_eq!(
            no_user_name("fusermount3: mount failed: Permission denied"),
            None
        );
    }
}
