//! The command line: `ztensor-mount FILE MOUNTPOINT` mounts; `pack`, `info`
//! and `cat` make and inspect files; `-u MOUNTPOINT` unmounts.

mod cat;
mod cmdline;
mod detach;
mod info;
mod logging;
mod mount;
mod npy;
pub mod options;
mod pack;
mod prefault;
mod prefetch;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::catalog::Algorithm;

/// Mount a file of tensors as a read-only directory: each tensor a file of
/// its little-endian bytes, with .npy, zarr and safetensors views.
///
/// Reads zTensor v0.1, zTensor v1, zTensor v2, safetensors (and sharded
/// sets), GGUF (and split files), deathtensors (and sharded sets), npz,
/// PyTorch .pt, ONNX and HDF5, from a local path or a URL.
#[derive(Parser, Debug)]
#[command(
    name = "ztensor-mount",
    version,
    override_usage = "ztensor-mount [OPTIONS] FILE MOUNTPOINT\n       ztensor-mount -u [-z] MOUNTPOINT",
    after_help = "Other commands: ztensor-mount pack|info|cat|prefetch --help"
)]
struct MountCli {
    /// The file to serve, a path or a URL (s3://, gs://, az://, http(s)://,
    /// or hf://ORG/REPO[@REVISION][/PATH] for a Hugging Face Hub repo)
    /// (with -u: the mount point).
    file: PathBuf,
    /// An existing directory to mount on.
    #[arg(required_unless_present = "unmount")]
    mountpoint: Option<PathBuf>,
    /// Unmount MOUNTPOINT (also a mount whose daemon died) and exit.
    // A flag taking the path as the positional, as in fusermount3, so that
    // `-u -z MP` and `-uz MP` parse.
    #[arg(short = 'u', long = "unmount", conflicts_with = "mountpoint")]
    unmount: bool,
    /// With -u: detach a busy mount now; it goes away when its files close.
    #[arg(short = 'z', long)]
    lazy: bool,
    /// Stay attached and log to stderr.
    #[arg(short, long)]
    foreground: bool,
    /// Mount options, comma separated, as mount(8) passes them (repeatable).
    #[arg(short = 'o', value_name = "OPT[,OPT...]")]
    options: Vec<String>,
    /// Let other users read the mount (needs user_allow_other in /etc/fuse.conf for non-root).
    #[arg(long)]
    allow_other: bool,
    /// Let root read the mount too.
    #[arg(long)]
    allow_root: bool,
    /// Unmount automatically when the daemon dies (implies --allow-root;
    /// for non-root, needs user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    auto_unmount: bool,
    /// Bytes of decoded data (zstd, deflate, HDF5 chunks, gathered parts) kept in memory
    /// (e.g. 512M, 2G). Default: 1/8 of RAM, 256M..4G.
    #[arg(long, value_name = "SIZE")]
    cache_size: Option<String>,
    /// Most memory the file's index may take decoded (e.g. 2G); a file
    /// needing more is refused. Default: 1G, about 250 000 tensors.
    #[arg(long, value_name = "SIZE")]
    index_memory: Option<String>,
    /// Where decoded tensors and the kernel's backing files go (unlinked, gone at
    /// exit) and, for a URL, the block cache kept across mounts (ztensor-remote/,
    /// bounded by --disk-cache-size). Default: /var/tmp.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// FUSE worker threads. Default: 2 per core, 2..16.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Serve tensor data with direct I/O (the default where the kernel
    /// allows mmap of such files; see docs/serving.md).
    #[arg(long, overrides_with = "page_cache")]
    direct_io: bool,
    /// Serve tensor data through the kernel page cache, kept across opens.
    #[arg(long, overrides_with = "direct_io")]
    page_cache: bool,
    /// Serve every file through the daemon: no FUSE passthrough, even
    /// where the kernel and root would allow it.
    #[arg(long)]
    no_passthrough: bool,
    /// Most disk the decoded copies under --cache-dir take together beyond
    /// the cache (whose entries a large frame is decoded into may be files
    /// there too): the files the kernel reads directly and the tensors too
    /// big for the cache (e.g. 20G). Default: half of its free space.
    #[arg(long, value_name = "SIZE")]
    decoded_cache_size: Option<String>,
    /// Do not verify raw tensors' checksums before serving them.
    #[arg(long)]
    no_verify_raw: bool,
    /// Give tensor files `user.ztensor.*` extended attributes. Off by
    /// default: with xattrs answered, `ls -l` makes two round trips to the
    /// daemon per file (about 10x slower on large trees).
    #[arg(long, overrides_with = "no_xattrs")]
    xattrs: bool,
    /// Answer no extended attributes (the default).
    #[arg(long, overrides_with = "xattrs")]
    no_xattrs: bool,
    /// Owner reported for every file (default: the mounting user).
    #[arg(long)]
    uid: Option<u32>,
    /// Group reported for every file.
    #[arg(long)]
    gid: Option<u32>,
    /// Log debug messages.
    #[arg(long)]
    debug: bool,
    /// In the background, log here instead of syslog.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    #[arg(long, value_name = "LIST", help = VIEWS_HELP.as_str())]
    views: Option<String>,
    /// For an s3://, gs:// or az:// FILE: the compatible server or emulator to use
    /// (e.g. http://127.0.0.1:9000).
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// For a remote FILE: most disk the cache files in --cache-dir may take. Default: 16G.
    #[arg(long, value_name = "SIZE")]
    disk_cache_size: Option<String>,
    /// For an https:// FILE: PEM certificates (a private CA) trusted besides the system's.
    #[arg(long, value_name = "PEM")]
    ca_file: Option<PathBuf>,
    /// For an hf:// FILE: the branch, tag or commit (as @REVISION in the URL). Default: main.
    #[arg(long, value_name = "REV")]
    revision: Option<String>,
}

/// The whole command line as clap describes it: the mount's arguments and
/// options, and the other commands as its subcommands. The manual page
/// (docs/man/ztensor-mount.1, tests/man_page.rs) is rendered from it.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    ToolCli::command()
        .get_subcommands()
        .fold(MountCli::command(), |c, sub| c.subcommand(sub.clone()))
}

#[derive(Parser, Debug)]
#[command(name = "ztensor-mount")]
struct ToolCli {
    #[command(subcommand)]
    cmd: Tool,
}

#[derive(Subcommand, Debug)]
enum Tool {
    /// Write a .zt file from .npy arrays.
    Pack {
        /// Output file (written to OUT.partial, then renamed).
        out: PathBuf,
        /// NAME=PATH.npy, optionally NAME=PATH.npy:DTYPE to relabel the elements (e.g. :bfloat16 for uint16 data).
        #[arg(required = true)]
        inputs: Vec<String>,
        /// Compress with zstd, at level 3 or --zstd=LEVEL.
        #[arg(
            long,
            value_name = "LEVEL",
            num_args = 0..=1,
            require_equals = true,
            default_missing_value = "3"
        )]
        zstd: Option<i32>,
        /// Decoded bytes per zstd frame (0: one frame per tensor). Default 1M.
        #[arg(long, value_name = "SIZE")]
        frame_size: Option<String>,
        /// Add a checksum to every tensor.
        #[arg(long, value_name = "ALGO", value_parser = ["crc32c", "sha256"])]
        checksum: Option<String>,
        /// Store multi-byte elements big-endian (raw tensors only: the
        /// reference package reads zstd tensors as little-endian whatever
        /// their data_endianness says).
        #[arg(long, conflicts_with = "zstd")]
        big_endian: bool,
        /// Replace OUT if it exists.
        #[arg(long)]
        force: bool,
    },
    /// List the tensors of a tensor file (any format read; a path or a URL).
    Info {
        /// A path, or a URL (s3://, gs://, az://, http(s)://, hf://).
        file: PathBuf,
        /// For an s3://, gs:// or az:// FILE: the compatible server or emulator to use.
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// For a remote FILE: where its block cache is (shared with mounts
        /// of the same object). Default: /var/tmp, as for a mount.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// The catalog as JSON (the sidecars' fields, without `views`).
        #[arg(long)]
        json: bool,
    },
    /// Write one tensor's little-endian bytes to stdout.
    Cat {
        /// A path, or a URL (s3://, gs://, az://, http(s)://, hf://).
        file: PathBuf,
        /// For an s3://, gs:// or az:// FILE: the compatible server or emulator to use.
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// For a remote FILE: where its block cache is (shared with mounts
        /// of the same object). Default: /var/tmp, as for a mount.
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        tensor: String,
        /// For a sparse tensor: indptr, indices or values.
        #[arg(long)]
        part: Option<String>,
    },
    /// Bring tensors of a live mount into its caches (decoded, fetched),
    /// by reading them through it; a progress bar on a terminal.
    Prefetch {
        /// Where the file is mounted.
        mountpoint: PathBuf,
        /// Tensors to bring in, by name or path; a directory stands for
        /// every tensor under it. Default: all.
        tensors: Vec<String>,
        /// Files read at once (1 to 64).
        #[arg(long, short = 'j', value_name = "N", default_value_t = 4,
              value_parser = clap::value_parser!(u16).range(1..=64))]
        jobs: u16,
    },
}

/// `--views`'s help: the views of the table, so a view added there is
/// named here.
static VIEWS_HELP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let names: Vec<&str> = crate::views::VIEWS.iter().map(|r| r.name).collect();
    format!(
        "Views to make, of {} (or all, none). Default: all.",
        names.join(", ")
    )
});

/// The variables that name files the remote sources read (credentials,
/// tokens, caches), as other tools read them.
const PATH_VARS: [&str; 7] = [
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_TOKEN_PATH",
    "XDG_CACHE_HOME",
];

/// Makes the relative paths of [`PATH_VARS`] absolute, from the directory
/// the command was run in: the daemon runs from `/` and reads them again.
fn absolute_path_vars() {
    for k in PATH_VARS {
        let Some(v) = std::env::var_os(k).filter(|v| !v.is_empty()) else {
            continue;
        };
        let p = std::path::Path::new(&v);
        if p.is_relative()
            && let Ok(abs) = std::path::absolute(p)
        {
            // SAFETY: called first thing in `main`, before this process
            // starts any thread, so nothing reads the environment meanwhile.
            unsafe { std::env::set_var(k, abs) };
        }
    }
}

/// `msg` as one line a user reads: a control character in it (a newline
/// in a file's path) written as `%XX`, as the tree writes one in a name,
/// so that one error or log record is one line.
pub(crate) fn one_line(msg: impl std::fmt::Display) -> String {
    crate::mount::tree::printable(&msg.to_string()).into_owned()
}
/// Whether `arg` is a cluster of short flags holding `-FLAG` (`-u`,
/// `-uz`), not the value of an `-o` written onto it (`-ouid=1000`).
fn short_flag(arg: &str, flag: char) -> bool {
    arg.strip_prefix('-')
        .filter(|flags| !flags.starts_with('-'))
        .is_some_and(|flags| flags.chars().take_while(|&c| c != 'o').any(|c| c == flag))
}

const LAZY_WITHOUT_U: &str = "-z/--lazy goes with -u: ztensor-mount -u -z MOUNTPOINT";

pub fn main() -> ExitCode {
    // First: what the caller left open, before any descriptor of ours.
    detach::note_inherited();
    absolute_path_vars();
    let args: Vec<String> = std::env::args().collect();
    if matches!(
        args.get(1).map(String::as_str),
        Some("pack" | "info" | "cat" | "prefetch")
    ) {
        return tool(ToolCli::parse());
    }
    let given =
        |long: &str, short: char| args[1..].iter().any(|a| a == long || short_flag(a, short));
    let cli = match MountCli::try_parse() {
        Ok(cli) => cli,
        // clap names the positional FILE, which -u takes as the mountpoint.
        Err(e)
            if e.kind() == clap::error::ErrorKind::MissingRequiredArgument
                && (given("--unmount", 'u') || given("--lazy", 'z')) =>
        {
            if given("--unmount", 'u') {
                eprintln!(
                    "ztensor-mount: -u needs the mount point: ztensor-mount -u [-z] MOUNTPOINT"
                );
            } else {
                eprintln!("ztensor-mount: {LAZY_WITHOUT_U}");
            }
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    // Before any thread: the daemon keeps this process's command line.
    cmdline::hide_url_queries();
    if cli.lazy && !cli.unmount {
        // clap's `requires` counts a flag's default as present.
        eprintln!("ztensor-mount: {LAZY_WITHOUT_U}");
        return ExitCode::from(2);
    }
    if cli.unmount {
        return mount::unmount(&cli.file, cli.lazy);
    }
    let s = match settings(&cli) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ztensor-mount: {}", one_line(e));
            return ExitCode::from(2);
        }
    };
    match &cli.mountpoint {
        Some(m) => mount::run(&cli.file, m, s),
        None => ExitCode::from(2),
    }
}

/// The mount's settings: the defaults, then each `-o` option in order,
/// then the flags; checked, with paths made absolute.
fn settings(cli: &MountCli) -> Result<options::Settings, String> {
    let mut s = options::Settings::default();
    for o in &cli.options {
        options::apply_o(&mut s, o)?;
    }
    apply_flags(&mut s, cli)?;
    // Absolute before the daemon leaves the caller's directory.
    for (key, p) in [
        ("cache_dir", Some(&mut s.cache_dir)),
        ("log_file", s.log_file.as_mut()),
    ] {
        let Some(p) = p else { continue };
        if p.as_os_str().is_empty() {
            return Err(format!("{key} is empty"));
        }
        *p = std::path::absolute(&*p).map_err(|e| format!("{key} {}: {e}", p.display()))?;
    }
    s.remote.cache_dir = s.cache_dir.clone();
    // An object a server will not serve by ranges is fetched whole,
    // within the bound of what is read whole at open.
    s.remote.whole_max = s.index_memory;
    if let Some(ca) = s.remote.ca_file.as_mut() {
        *ca = std::path::absolute(&*ca).map_err(|e| format!("ca_file {}: {e}", ca.display()))?;
    }
    if s.allow_other && s.allow_root {
        return Err("allow_other and allow_root cannot be used together".into());
    }
    if s.read_ahead_kb > MAX_READ_AHEAD_KB {
        return Err(format!(
            "read_ahead_kb must be at most {MAX_READ_AHEAD_KB} (1 GiB), not {}",
            s.read_ahead_kb
        ));
    }
    if s.cache_size < 1 << 20 {
        return Err("cache size must be at least 1M".into());
    }
    // No index fits in none; a small limit is a file's own refusal, which
    // names what its index would take.
    if s.index_memory == 0 {
        return Err("index memory must be more than 0".into());
    }
    if !options::THREADS_RANGE.contains(&s.threads) {
        return Err(format!(
            "threads must be from {} to {}, not {}",
            options::THREADS_RANGE.start(),
            options::THREADS_RANGE.end(),
            s.threads
        ));
    }
    Ok(s)
}

/// The command line's flags, over what the defaults and `-o` gave.
fn apply_flags(s: &mut options::Settings, cli: &MountCli) -> Result<(), String> {
    s.foreground |= cli.foreground;
    s.allow_other |= cli.allow_other;
    s.allow_root |= cli.allow_root;
    s.auto_unmount |= cli.auto_unmount;
    if cli.direct_io {
        s.direct_io = true;
    }
    if cli.page_cache {
        s.direct_io = false;
    }
    s.verify_raw &= !cli.no_verify_raw;
    s.passthrough &= !cli.no_passthrough;
    if let Some(v) = &cli.decoded_cache_size {
        s.decoded_cache_size = Some(options::parse_size(v)?);
    }
    if cli.xattrs {
        s.xattrs = true;
    }
    if cli.no_xattrs {
        s.xattrs = false;
    }
    s.debug |= cli.debug;
    if let Some(v) = &cli.cache_size {
        s.cache_size = options::parse_size(v)?;
    }
    if let Some(v) = &cli.index_memory {
        s.index_memory = options::parse_size(v)?;
    }
    if let Some(v) = &cli.cache_dir {
        s.cache_dir = v.clone();
    }
    if let Some(v) = &cli.views {
        s.views = crate::views::Views::parse(v)?;
    }
    if let Some(v) = &cli.endpoint {
        s.remote.endpoint = Some(v.clone());
    }
    if let Some(v) = &cli.disk_cache_size {
        s.remote.disk_cache_size = options::parse_size(v)?;
    }
    if let Some(v) = &cli.ca_file {
        s.remote.ca_file = Some(v.clone());
    }
    if let Some(v) = &cli.revision {
        s.remote.revision = Some(v.clone());
    }
    if let Some(v) = cli.threads {
        s.threads = v;
    }
    if cli.uid.is_some() {
        s.uid = cli.uid;
    }
    if cli.gid.is_some() {
        s.gid = cli.gid;
    }
    if cli.log_file.is_some() {
        s.log_file = cli.log_file.clone();
    }
    Ok(())
}

/// How `info` and `cat` fetch `file`: the mount's defaults, cache
/// directory included, so that the blocks they fetch (an index, a tensor)
/// are there for a mount of the same object, and theirs for the next run.
/// A look at a remote file should not need a writable `/var/tmp`: when the
/// default cache directory cannot be written, the temporary directory
/// (`$TMPDIR`, else `/tmp`) stands in, with a warning. One given with
/// `--cache-dir` is used as given, or refused (said here: `None`).
fn remote_options(
    file: &Path,
    endpoint: Option<String>,
    dir: Option<PathBuf>,
) -> Option<crate::source::RemoteOptions> {
    match fetch_options(file, endpoint, dir) {
        Ok(r) => Some(r),
        Err(why) => {
            eprintln!("ztensor-mount: {}", one_line(why));
            None
        }
    }
}

fn fetch_options(
    file: &Path,
    endpoint: Option<String>,
    dir: Option<PathBuf>,
) -> Result<crate::source::RemoteOptions, String> {
    let d = crate::source::RemoteOptions::default();
    let remote = crate::source::is_remote(&file.to_string_lossy());
    let cache_dir = match dir {
        Some(dir) if remote => {
            writable_cache_dir(&dir).map_err(|why| format!("{why} ({CHOOSE_CACHE_DIR})"))?;
            dir
        }
        Some(dir) => dir,
        None if remote => match writable_cache_dir(&d.cache_dir) {
            Ok(()) => d.cache_dir.clone(),
            Err(why) => {
                let tmp = std::env::temp_dir();
                writable_cache_dir(&tmp).map_err(|_| format!("{why} ({CHOOSE_CACHE_DIR})"))?;
                eprintln!(
                    "ztensor-mount: warning: {why}; fetching into {} instead (a cache directory \
                     is chosen with --cache-dir)",
                    tmp.display()
                );
                tmp
            }
        },
        None => d.cache_dir.clone(),
    };
    Ok(crate::source::RemoteOptions {
        endpoint,
        cache_dir,
        ..d
    })
}

/// Whether a file can be made in `dir`, the cache directory; why not.
/// A directory that exists but takes no files (`/proc`, `/sys`) answers
/// ENOENT to the file made in it, which would read as if the directory
/// were missing, so the message says which of the two it is.
fn writable_cache_dir(dir: &Path) -> Result<(), String> {
    let Err(e) = tempfile::tempfile_in(dir) else {
        return Ok(());
    };
    let what = match std::fs::metadata(dir) {
        Err(_) => "does not exist",
        Ok(m) if !m.is_dir() => "is not a directory",
        Ok(_) if e.kind() == std::io::ErrorKind::NotFound => "takes no new files",
        Ok(_) => "is not writable",
    };
    Err(format!("cache directory {} {what}: {e}", dir.display()))
}

/// What a refusal of the cache directory adds.
const CHOOSE_CACHE_DIR: &str = "choose another with --cache-dir";

/// The largest readahead `-o read_ahead_kb` sets on the mount's bdi.
const MAX_READ_AHEAD_KB: u32 = 1 << 20;

fn tool(cli: ToolCli) -> ExitCode {
    // `info | head`: end quietly on a closed pipe, as other Unix tools do.
    // SAFETY: sets the default action, installing no handler of ours; no
    // memory is passed.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    match cli.cmd {
        Tool::Pack {
            out,
            inputs,
            zstd,
            frame_size,
            checksum,
            big_endian,
            force,
        } => {
            let frame_size = match frame_size.as_deref().map(options::parse_size).transpose() {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("ztensor-mount pack: {}", one_line(e));
                    return ExitCode::from(2);
                }
            };
            let checksum = checksum.map(|c| {
                if c == "sha256" {
                    Algorithm::Sha256
                } else {
                    Algorithm::Crc32c
                }
            });
            pack::run(pack::PackArgs {
                out,
                inputs,
                zstd,
                frame_size,
                checksum,
                big_endian,
                force,
            })
        }
        Tool::Info {
            file,
            json,
            endpoint,
            cache_dir,
        } => {
            let Some(remote) = remote_options(&file, endpoint, cache_dir) else {
                return ExitCode::from(1);
            };
            let code = info::run(&file, json, &remote);
            // A remote object's fetched blocks, saved: a read-ahead still
            // under way may hold it past its last use.
            crate::source::before_exit();
            code
        }
        Tool::Cat {
            file,
            tensor,
            part,
            endpoint,
            cache_dir,
        } => {
            let Some(remote) = remote_options(&file, endpoint, cache_dir) else {
                return ExitCode::from(1);
            };
            let code = cat::run(&file, &tensor, part.as_deref(), &remote);
            crate::source::before_exit();
            code
        }
        Tool::Prefetch {
            mountpoint,
            tensors,
            jobs,
        } => prefetch::run(&mountpoint, &tensors, jobs.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::{MountCli, ToolCli, short_flag, writable_cache_dir};
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<MountCli, clap::Error> {
        MountCli::try_parse_from(std::iter::once("ztensor-mount").chain(args.iter().copied()))
    }

    #[test]
    fn help_names_every_format_the_program_reads() {
        use clap::CommandFactory;
        let help = MountCli::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for format in crate::formats::FORMATS.iter().map(|f| f.listed) {
            assert!(
                help.contains(format),
                "--help does not name {format:?}: {help}"
            );
        }
    }

    #[test]
    fn unmount_takes_its_flags_in_any_order_as_fusermount3_does() {
        for (args, lazy) in [
            (&["-u", "/mnt/m"][..], false),
            (&["-u", "-z", "/mnt/m"], true),
            (&["-uz", "/mnt/m"], true),
            (&["-z", "-u", "/mnt/m"], true),
            (&["-u", "/mnt/m", "-z"], true),
            (&["--unmount", "--lazy", "/mnt/m"], true),
        ] {
            let cli = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert!(cli.unmount, "{args:?}");
            assert_eq!(cli.file.to_str(), Some("/mnt/m"), "{args:?}");
            assert_eq!(cli.lazy, lazy, "{args:?}");
        }
    }

    #[test]
    fn prefetch_reads_1_to_64_files_at_once() {
        let jobs = |j: &str| ToolCli::try_parse_from(["ztensor-mount", "prefetch", "/m", "-j", j]);
        for bad in ["0", "65", "-1"] {
            assert!(jobs(bad).is_err(), "-j {bad}");
        }
        for good in ["1", "64"] {
            assert!(jobs(good).is_ok(), "-j {good}");
        }
    }

    #[test]
    fn dash_u_is_told_from_an_o_value_written_onto_its_flag() {
        for (arg, u) in [
            ("-u", true),
            ("-uz", true),
            ("-zu", true),
            ("-ouid=1000", false),
        ] {
            assert_eq!(short_flag(arg, 'u'), u, "{arg}");
        }
        assert!(!short_flag("--uid", 'u'));
        assert!(!short_flag("-oauto_unmount", 'u'));
    }

    #[test]
    fn unmount_takes_one_path_and_a_mount_takes_two() {
        assert!(parse(&["-u"]).is_err());
        assert!(parse(&["-u", "a.zt", "/mnt/m"]).is_err());
        assert!(parse(&["a.zt"]).is_err());
        let cli = parse(&["a.zt", "/mnt/m"]).expect("a mount");
        assert!(!cli.unmount);
        assert_eq!(
            cli.mountpoint
                .and_then(|m| m.to_str().map(String::from))
                .as_deref(),
            Some("/mnt/m")
        );
    }

    #[test]
    fn a_cache_dir_refused_says_whether_it_is_missing_or_takes_no_files() {
        let why = |d: &str| writable_cache_dir(std::path::Path::new(d)).unwrap_err();
        assert!(why("/proc").starts_with("cache directory /proc takes no new files: "));
        assert!(
            why("/nonexistent/x").starts_with("cache directory /nonexistent/x does not exist: ")
        );
        let file = tempfile::NamedTempFile::new().expect("a temporary file");
        let file = file.path().display().to_string();
        assert!(why(&file).starts_with(&format!("cache directory {file} is not a directory: ")));
        assert_eq!(writable_cache_dir(&std::env::temp_dir()), Ok(()));
    }
}
