//! What the daemon is tuned by: passthrough or not, memory, open files,
//! worker threads, and the filesystem's and FUSE's options.

use fuser::{Config, MountOption, SessionACL};

use crate::cli::options::Settings;
use crate::mount::backing::BackingOptions;
use crate::mount::fs::FsOptions;
use crate::serve::data::{DataOptions, PROGRESSIVE_MIN};
use crate::serve::spill;

/// Why the kernel will not be asked for passthrough, when it will not: it
/// was turned off, or the daemon lacks CAP_SYS_ADMIN, which registering a
/// backing file needs.
pub(super) fn no_passthrough(s: &Settings) -> Option<String> {
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

/// Sets malloc for the daemon's allocations. Decoded frames are large and
/// short-lived: malloc gives each its own mapping and returns it on free,
/// so freed frames never linger in per-thread heaps and memory tracks the
/// cache's own count. A remote object's HTTP client receives into buffers
/// of up to about 400 KiB, one new one per piece of a body: those are kept
/// below the threshold and the heaps keep what they free, so that they are
/// reused rather than mapped anew (each page of a new mapping is a page
/// fault, and new memory on the project's VM: 40% of the fetch threads'
/// time on a cold read over loopback went to those faults).
pub(super) fn tune_malloc(remote: bool) {
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
pub(super) fn backing_files_max() -> usize {
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
pub(super) fn open_file_limit() -> usize {
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
pub(super) fn fs_options(s: &Settings) -> FsOptions {
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

/// The worker threads the session can have of the `wanted`: each beyond
/// the first holds a descriptor of its own (a clone of the session's), and
/// under a small open-file limit the clones would fail after the mount was
/// said to work, ending the session. A few descriptors are kept for the
/// session's own and the daemon's files meanwhile.
pub(super) fn usable_threads(wanted: usize) -> usize {
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let spare = open_file_limit().saturating_sub(open + 6);
    let threads = wanted.min(spare.max(1));
    if threads < wanted {
        log::warn!(
            "{threads} worker threads, not {wanted}: the open-file limit leaves no \
             descriptors for more (raise it with ulimit -n)"
        );
    }
    threads
}

/// The FUSE session's mount options, access and `threads` worker threads.
pub(super) fn fuse_config(s: &Settings, label: &str, threads: usize) -> Config {
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
    config.n_threads = Some(threads);
    config.clone_fd = threads > 1;
    config
}

/// How many of fuser's worker threads ("fuser-N") this process has.
pub(super) fn workers() -> Option<usize> {
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
