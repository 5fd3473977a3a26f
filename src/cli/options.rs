//! Mount settings from the command line and fstab-style `-o` lists.

use std::path::PathBuf;

/// Everything the mount needs to know, after flags and `-o` are merged.
#[derive(Debug, Clone)]
pub struct Settings {
    pub foreground: bool,
    pub allow_other: bool,
    pub allow_root: bool,
    pub auto_unmount: bool,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub cache_size: u64,
    /// Most memory the decoded index may take.
    pub index_memory: u64,
    pub cache_dir: PathBuf,
    pub threads: usize,
    pub direct_io: bool,
    pub verify_raw: bool,
    pub debug: bool,
    pub log_file: Option<PathBuf>,
    /// Kernel readahead for the mount, in KiB (0 leaves the kernel default).
    pub read_ahead_kb: u32,
    /// Largest read request, in bytes.
    pub max_read: u32,
    pub views: crate::views::Views,
    /// How a remote FILE (a URL) is fetched; its `cache_dir` is set from
    /// the one above.
    pub remote: crate::source::RemoteOptions,
    /// Answer `user.ztensor.*` extended attributes.
    pub xattrs: bool,
    /// Let the kernel read backed files itself (FUSE passthrough).
    pub passthrough: bool,
    /// Most disk the decoded backing files may take; `None`: half of
    /// `cache_dir`'s free space at mount.
    pub decoded_cache_size: Option<u64>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            foreground: false,
            allow_other: false,
            allow_root: false,
            auto_unmount: false,
            uid: None,
            gid: None,
            cache_size: default_cache_size(),
            index_memory: crate::formats::zt_v01::index::DEFAULT_INDEX_MEMORY,
            cache_dir: PathBuf::from("/var/tmp"),
            threads: default_threads(),
            direct_io: true,
            verify_raw: true,
            debug: false,
            log_file: None,
            read_ahead_kb: 4096,
            max_read: default_max_read(),
            views: crate::views::Views::ALL,
            remote: crate::source::RemoteOptions::default(),
            xattrs: false,
            passthrough: true,
            decoded_cache_size: None,
        }
    }
}

/// Read requests as large as the kernel lets a FUSE mount have
/// (`fs.fuse.max_pages_limit`, 256 pages unless raised), up to 4 MiB: each
/// request costs a round trip, so fewer cost less (one read() of a whole
/// raw tensor: 0.68x of a direct read with 4 MiB requests, 0.66x with
/// 1 MiB ones, in BENCHMARKS.md's table).
pub fn default_max_read() -> u32 {
    // SAFETY: sysconf takes a constant and touches no memory of ours; a
    // failure (-1) is caught by the max.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let pages = std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(256);
    (pages * page).clamp(128 << 10, 4 << 20) as u32
}

/// This machine's physical memory, in bytes, when the system says.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf takes a constant and touches no memory of ours; a
    // failure (-1) is caught below.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
}

/// An eighth of physical memory, between 256 MiB and 4 GiB.
pub fn default_cache_size() -> u64 {
    let ram = physical_memory().unwrap_or(2 << 30);
    (ram / 8).clamp(256 << 20, 4 << 30)
}

/// Two workers per core, at least 2 and at most 16.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get() * 2)
        .clamp(2, 16)
}

/// Parses `512K`, `256M`, `1G`, `2GiB`, `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?} (use e.g. 512M or 2G)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("invalid size {s:?} (use e.g. 512M or 2G)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// What the kernel and fuser accept as the largest request.
const MAX_READ_RANGE: std::ops::RangeInclusive<u32> = 4096..=16 << 20;
/// Worker threads: each holds a `/dev/fuse` clone and a request buffer.
pub const THREADS_RANGE: std::ops::RangeInclusive<usize> = 1..=64;

fn parse_num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("-o {key}={v}: not a number"))
}

/// Applies one `-o` list (`a,b=c,...`) as `mount -t fuse.ztensor-mount`
/// passes it. Generic mount flags are accepted and ignored.
pub fn apply_o(s: &mut Settings, list: &str) -> Result<(), String> {
    for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        let (key, val) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let need = || val.ok_or_else(|| format!("-o {key} needs a value ({key}=...)"));
        // `debug=0` must not turn debug on: a flag takes no value.
        let flag = || match val {
            None => Ok(true),
            Some(v) => Err(format!(
                "-o {key}={v}: {key} is a flag and takes no value (leave it out for the default)"
            )),
        };
        match key.replace('-', "_").as_str() {
            "ro" | "rw" | "dev" | "nodev" | "suid" | "nosuid" | "exec" | "noexec" | "auto"
            | "noauto" | "user" | "nouser" | "users" | "owner" | "group" | "defaults"
            | "_netdev" | "nofail" | "sync" | "async" | "dirsync" | "silent" | "loud"
            | "symfollow" | "nosymfollow" | "lazytime" | "nolazytime" => {}
            // Common in FUSE fstab lines: permissions are always checked by
            // the kernel; fuse3 ignores nonempty; the name and type shown
            // are the .zt's path and fuse.ztensor-mount.
            "default_permissions" | "nonempty" | "fsname" | "subtype" => {}
            // Access times: files keep the .zt's mtime, and nothing is written.
            "atime" | "noatime" | "relatime" | "norelatime" | "strictatime" | "nostrictatime"
            | "diratime" | "nodiratime" => {}
            k if k.starts_with("x_") || key.starts_with("x-") || k.starts_with("comment") => {}
            "allow_other" => s.allow_other = flag()?,
            "allow_root" => s.allow_root = flag()?,
            "auto_unmount" => s.auto_unmount = flag()?,
            "uid" => s.uid = Some(parse_num(key, need()?)?),
            "gid" => s.gid = Some(parse_num(key, need()?)?),
            "cache_size" => s.cache_size = parse_size(need()?)?,
            "index_memory" => s.index_memory = parse_size(need()?)?,
            "cache_dir" => s.cache_dir = PathBuf::from(need()?),
            "threads" => s.threads = parse_num(key, need()?)?,
            "direct_io" => s.direct_io = flag()?,
            "page_cache" => s.direct_io = !flag()?,
            "no_verify_raw" => s.verify_raw = !flag()?,
            "xattrs" => s.xattrs = flag()?,
            "no_xattrs" => s.xattrs = !flag()?,
            "passthrough" => s.passthrough = flag()?,
            "no_passthrough" => s.passthrough = !flag()?,
            "decoded_cache_size" => s.decoded_cache_size = Some(parse_size(need()?)?),
            "debug" => s.debug = flag()?,
            "foreground" => s.foreground = flag()?,
            "log_file" => s.log_file = Some(PathBuf::from(need()?)),
            // Commas separate mount options: views are joined by '+'.
            "views" => s.views = crate::views::Views::parse(&need()?.replace('+', ","))?,
            "read_ahead_kb" => s.read_ahead_kb = parse_num(key, need()?)?,
            "endpoint" => s.remote.endpoint = Some(need()?.to_string()),
            "block_size" => {
                let v = need()?;
                s.remote.block_size = parse_size(v)
                    .ok()
                    .filter(|&n| crate::source::remote::block_size_allowed(n))
                    .ok_or_else(|| {
                        format!("-o block_size={v}: must be a multiple of 64K from 64K to 256M")
                    })?;
            }
            "disk_cache_size" => s.remote.disk_cache_size = parse_size(need()?)?,
            "remote_timeout" => {
                let secs: f64 = parse_num(key, need()?)?;
                if !(0.1..=3600.0).contains(&secs) {
                    return Err(format!(
                        "-o remote_timeout: {secs} is not from 0.1 to 3600 seconds"
                    ));
                }
                s.remote.timeout = std::time::Duration::from_secs_f64(secs);
            }
            "remote_retries" => s.remote.retries = parse_num(key, need()?)?,
            "remote_read_ahead" => s.remote.read_ahead = parse_num(key, need()?)?,
            "ca_file" => s.remote.ca_file = Some(PathBuf::from(need()?)),
            "revision" => s.remote.revision = Some(need()?.to_string()),
            "max_read" => {
                let v = need()?;
                s.max_read = parse_size(v)
                    .ok()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| MAX_READ_RANGE.contains(n))
                    .ok_or_else(|| format!("-o max_read={v}: must be a size from 4K to 16M"))?;
            }
            _ => return Err(format!("unknown mount option {opt:?}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn an_o_flag_given_a_value_is_refused_not_turned_on() {
        for o in ["debug=0", "foreground=no", "xattrs=0", "no_passthrough=1"] {
            let mut s = Settings::default();
            let err = apply_o(&mut s, o).unwrap_err();
            assert!(err.contains("is a flag and takes no value"), "{o}: {err}");
            assert!(
                !s.debug && !s.foreground && !s.xattrs && s.passthrough,
                "{o}"
            );
        }
        let mut s = Settings::default();
        apply_o(&mut s, "debug,page_cache").unwrap();
        assert!(s.debug && !s.direct_io);
    }

    #[test]
    fn o_lists_like_mount_passes_them() {
        let mut s = Settings::default();
        apply_o(
            &mut s,
            "ro,nosuid,nodev,x-systemd.automount,allow_other,uid=1000,gid=100,cache_size=64M",
        )
        .unwrap();
        assert!(s.allow_other);
        assert_eq!(
            (s.uid, s.gid, s.cache_size),
            (Some(1000), Some(100), 64 << 20)
        );
        apply_o(&mut s, "cache-dir=/tmp,threads=3,page_cache").unwrap();
        assert_eq!((s.threads, s.direct_io), (3, false));
        apply_o(&mut s, "direct_io").unwrap();
        assert!(s.direct_io);
        assert!(!s.xattrs, "xattrs are off unless asked for");
        apply_o(&mut s, "xattrs").unwrap();
        assert!(s.xattrs);
        apply_o(&mut s, "no_xattrs").unwrap();
        assert!(!s.xattrs);
        assert!(apply_o(&mut s, "bogus").unwrap_err().contains("bogus"));
        assert!(apply_o(&mut s, "uid=x").is_err());
        apply_o(&mut s, "max_read=2M").unwrap();
        assert_eq!(s.max_read, 2 << 20);
        for bad in ["max_read=4G", "max_read=5G", "max_read=17M", "max_read=1K"] {
            let e = apply_o(&mut s, bad).unwrap_err();
            assert!(e.contains("4K to 16M"), "{bad}: {e}");
        }
        assert_eq!(s.max_read, 2 << 20);
    }

    #[test]
    fn remote_options() {
        let mut s = Settings::default();
        apply_o(
            &mut s,
            "endpoint=http://127.0.0.1:9000,block_size=1M,remote_timeout=2.5,remote_retries=1,disk_cache_size=2G,remote_read_ahead=3",
        )
        .unwrap();
        let r = &s.remote;
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!((r.block_size, r.retries, r.read_ahead), (1 << 20, 1, 3));
        assert_eq!(r.disk_cache_size, 2 << 30);
        assert_eq!(r.timeout, std::time::Duration::from_millis(2500));
        for bad in [
            "block_size=3K",
            "block_size=1G",
            "remote_timeout=0",
            "endpoint",
        ] {
            assert!(apply_o(&mut s, bad).is_err(), "{bad}");
        }
        assert!(crate::source::remote::is_url("S3://b/k.zt"));
        assert!(crate::source::remote::is_url("https://h/k.zt"));
        assert!(!crate::source::remote::is_url("/data/k.zt"));
        assert!(!crate::source::remote::is_url("file://k.zt"));
    }

    #[test]
    fn generic_flags_an_fstab_line_may_carry_are_accepted() {
        let before = format!("{:?}", Settings::default());
        let mut s = Settings::default();
        apply_o(
            &mut s,
            "defaults,nodiratime,strictatime,norelatime,lazytime,noexec,nofail,_netdev,users,owner",
        )
        .unwrap();
        assert_eq!(format!("{s:?}"), before, "they change nothing");
    }
}
