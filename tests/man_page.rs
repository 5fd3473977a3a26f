//! The manual pages in docs/man/ are the command line's own help
//! (`ztensor-mount --help` and each command's), rendered by clap_mangen,
//! the mount's followed by the sections below that the help has no room
//! for. This test renders them again and fails when a committed page
//! differs: `ZT_BLESS=1 cargo test --test man_page` writes them.

use std::path::Path;

/// What `man ztensor-mount` says beyond the options: how the command ends,
/// what it reads from the environment, where its files are. The details
/// are in the docs named under SEE ALSO.
const EXTRA: &str = r#".SH "EXIT STATUS"
Without \fB\-f\fR the command returns once the mount works, or fails.
.TP
\fB0\fR
The mount is live: every serving thread has started and a stat of the
mountpoint has been answered. With \fB\-u\fR: the kernel has let go of it.
.TP
\fB1\fR
One line on stderr says why: a file it cannot read or serve, a missing or
already mounted mountpoint, a cache directory it cannot write, no
permission.
.TP
\fB2\fR
A command line it cannot take: an unknown option, a bad size or thread
count.
.TP
\fB128\fR+\fIN\fR
Interrupted by signal \fIN\fR (130 for SIGINT) before it returned; nothing
is left mounted.
.SH ENVIRONMENT
.TP
\fBHF_TOKEN\fR, \fBHF_HOME\fR, \fBHF_ENDPOINT\fR, \fBHF_HUB_OFFLINE\fR, \fBHF_HUB_CACHE\fR
For an \fBhf://\fR file, as \fBhuggingface_hub\fR reads them: the token
(else \fI$HF_HOME/token\fR), the Hub's address, a mount from the cache alone.
.TP
\fBAWS_*\fR, \fBGOOGLE_APPLICATION_CREDENTIALS\fR, \fBAZURE_STORAGE_*\fR
Credentials and regions for \fBs3://\fR, \fBgs://\fR and \fBaz://\fR files.
.TP
\fBHTTPS_PROXY\fR, \fBNO_PROXY\fR, \fBSSL_CERT_FILE\fR, \fBSSL_CERT_DIR\fR
Proxies and trusted certificates for remote files.
.TP
\fBRUST_LOG\fR
Refines \fB\-\-debug\fR logging (e.g. \fBRUST_LOG=fuser=debug\fR).
.SH FILES
.TP
\fIMOUNTPOINT\fR/.ztensor/
\fBindex.json\fR (every tensor with its path and sidecar fields),
\fBstats\fR (live counters), \fBerrors\fR (each tensor whose reads failed,
and why).
.TP
\fICACHE_DIR\fR/ztensor\-remote/
The block cache of remote files, kept across mounts and shared between
them (\fB\-\-cache\-dir\fR, default \fI/var/tmp\fR).
.TP
\fI/var/log/ztensor\-mount.log\fR, \fI~/.local/state/ztensor\-mount.log\fR
A background mount's log where no syslog listens (root, others).
.SH "SEE ALSO"
\fBfusermount3\fR(1), \fBmount\fR(8), \fBfstab\fR(5).
The repository's README.md and docs/: options.md (every option, fstab,
signals, logging), tree.md (the files a mount shows), serving.md,
integrity.md (what is checked, and the errors a read returns), remote.md.
"#;

/// The mount's page, and one for each other command (as `git` has
/// git-commit(1)), by file name.
fn render() -> Vec<(String, Vec<u8>)> {
    let cmd = ztensor_mount::cli::command().disable_help_subcommand(true);
    let mut pages = vec![("ztensor-mount.1".to_string(), mount_page(cmd.clone()))];
    for sub in cmd.get_subcommands() {
        // clap takes a name of 'static life (its `string` feature is off).
        let name: &'static str = format!("ztensor-mount-{}", sub.get_name()).leak();
        let sub = sub
            .clone()
            .name(name)
            .bin_name(format!("ztensor-mount {}", sub.get_name()));
        let mut page = Vec::new();
        clap_mangen::Man::new(sub).render(&mut page).unwrap();
        pages.push((format!("{name}.1"), page));
    }
    pages
}

fn mount_page(cmd: clap::Command) -> Vec<u8> {
    let man = clap_mangen::Man::new(cmd);
    let mut page = Vec::new();
    man.render_title(&mut page).unwrap();
    man.render_name_section(&mut page).unwrap();
    // clap_mangen's synopsis lists every option; the help's usage is
    // what a reader needs.
    page.extend_from_slice(SYNOPSIS.as_bytes());
    man.render_description_section(&mut page).unwrap();
    man.render_options_section(&mut page).unwrap();
    man.render_subcommands_section(&mut page).unwrap();
    page.extend_from_slice(EXTRA.as_bytes());
    man.render_version_section(&mut page).unwrap();
    page
}

const SYNOPSIS: &str = r#".SH SYNOPSIS
\fBztensor\-mount\fR [\fIOPTIONS\fR] \fIFILE\fR \fIMOUNTPOINT\fR
.br
\fBztensor\-mount \-u\fR [\fB\-z\fR] \fIMOUNTPOINT\fR
.br
\fBztensor\-mount\fR \fBpack\fR|\fBinfo\fR|\fBcat\fR|\fBprefetch\fR ...
"#;

#[test]
fn the_manual_page_is_the_help_as_it_is() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/man");
    let pages = render();
    if std::env::var_os("ZT_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, page) in &pages {
            std::fs::write(dir.join(name), page).unwrap();
        }
    }
    let mut committed: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()))
        .into_iter()
        .flatten()
        .collect();
    committed.sort();
    let mut names: Vec<String> = pages.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    assert_eq!(committed, names, "the pages in {}", dir.display());
    for (name, page) in &pages {
        assert!(
            std::fs::read(dir.join(name)).unwrap_or_default() == *page,
            "docs/man/{name} is not the help as it is: run ZT_BLESS=1 cargo test --test man_page"
        );
    }
}
