//! `hf://ORG/REPO[@REVISION][/PATH]`: a file of a Hugging Face Hub repo,
//! served as a remote object (see [`super::remote`]: the same block cache,
//! pinning and fetching). This module speaks the Hub's protocol as
//! `huggingface_hub` does:
//!
//! - the endpoint is `HF_ENDPOINT` (default `https://huggingface.co`), the
//!   token `HF_TOKEN`, else the file `huggingface-cli login` writes
//!   (`HF_TOKEN_PATH`, else `$HF_HOME/token`, default
//!   `~/.cache/huggingface/token`), sent to the endpoint's host only;
//! - `GET /api/models/ORG/REPO/revision/REV?blobs=true` gives the commit
//!   the revision names and the repo's files, resolved once at mount: every
//!   byte comes from that commit;
//! - `HEAD /ORG/REPO/resolve/COMMIT/PATH` gives a file's size and ETag
//!   (`X-Linked-Size`, `X-Linked-Etag` on the redirect of a large file) and
//!   where its bytes are (`Location`, a signed URL on a CDN host); ranged
//!   GETs go there, and a 403 from it (the signature expired) resolves the
//!   file again;
//! - 429 and 5xx answers are retried with backoff.
//!
//! What a mount learned (the commit of a revision, a file's size and ETag)
//! is recorded under the cache directory, so that with `HF_HUB_OFFLINE=1`
//! a remount serves what the cache holds without asking the Hub.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use object_store::path::Path as Key;
use object_store::{GetResult, ObjectMeta, ObjectStore};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, LOCATION};
use serde_json::Value;

use super::hf_cache;
use super::http::{self, Failure, Who, header, one_line_err, send};
use super::remote::{self, Options};
use super::{FetchKind, MappedFile};
use crate::error::{Error, ErrorKind, Result};

/// Whether `arg` names a Hub file (`hf://…`).
pub fn is_hub(arg: &str) -> bool {
    arg.get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("hf://"))
}

/// What `hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]` asks for.
#[derive(Debug, Clone, PartialEq)]
struct Spec {
    /// `ORG/REPO` for a model; `datasets/ORG/REPO` or `spaces/ORG/REPO`
    /// (as the Hub's file URLs and `huggingface_hub`'s HfFileSystem name
    /// them).
    repo: String,
    revision: String,
    path: Option<String>,
}

const USAGE: &str = "expected hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]";

/// The repo types besides models, as a repo's name starts (`datasets/`)
/// and as the API names them (`/api/datasets/...`).
const KINDS: [&str; 2] = ["datasets", "spaces"];

/// The API's name for `repo`'s type, and its `ORG/REPO`.
fn api_kind(repo: &str) -> (&str, &str) {
    match repo.split_once('/') {
        Some((k, rest)) if KINDS.contains(&k) => (k, rest),
        _ => ("models", repo),
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Whether `p` names a file of a repo as itself: no empty, `.` or `..`
/// segment, no control character. A URL parser resolves dot segments and
/// drops tabs and newlines, so such a name would fetch another file.
fn plain_path(p: &str) -> bool {
    !p.chars().any(char::is_control) && p.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

/// Parses `arg`; `revision` is `--revision`, which must agree with an
/// `@REVISION` in the URL.
fn parse(arg: &str, revision: Option<&str>) -> std::result::Result<Spec, String> {
    let rest = arg.get(5..).unwrap_or("");
    let (kind, rest) = match rest.split_once('/') {
        Some((k, rest)) if KINDS.contains(&k) => (Some(k), rest),
        _ => (None, rest),
    };
    let mut parts = rest.splitn(3, '/');
    let org = parts.next().unwrap_or("");
    let name_rev = parts.next().unwrap_or("");
    let path = parts.next().filter(|p| !p.is_empty());
    // A revision with a `/` (refs/pr/3) is percent-encoded in the URL
    // (refs%2Fpr%2F3), as huggingface_hub's HfFileSystem writes it.
    let (name, at) = match name_rev.split_once('@') {
        Some((n, r)) => (n, Some(percent_decode(r))),
        None => (name_rev, None),
    };
    let at = at.as_deref();
    if !valid_name(org) || !valid_name(name) {
        return Err(USAGE.into());
    }
    if at == Some("") {
        return Err(format!("{USAGE}: the revision after @ is empty"));
    }
    let revision = match (at, revision) {
        (Some(a), Some(r)) if a != r => {
            return Err(format!(
                "the URL names revision {a:?} and --revision {r:?}; give one"
            ));
        }
        (Some(a), _) => a.to_string(),
        (None, Some("")) => return Err(format!("{USAGE}: --revision is empty")),
        (None, Some(r)) => r.to_string(),
        (None, None) => "main".to_string(),
    };
    // A dot segment would be dropped from the API's URL (asking of another
    // revision, or of none); git refuses such names, and control bytes.
    if !plain_path(&revision) {
        return Err(format!(
            "{USAGE}: {revision:?} is not a revision (a branch, tag or commit)"
        ));
    }
    if let Some(p) = path
        && !plain_path(p)
    {
        return Err(format!("{USAGE}: {p:?} is not a file's path in a repo"));
    }
    Ok(Spec {
        repo: match kind {
            Some(k) => format!("{k}/{org}/{name}"),
            None => format!("{org}/{name}"),
        },
        revision,
        path: path.map(str::to_string),
    })
}

/// The Hub's own address, `huggingface_hub`'s default endpoint.
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How to reach the Hub, from the environment `huggingface_hub` reads.
#[derive(Debug, Clone)]
pub struct Hub {
    endpoint: url::Url,
    token: Option<String>,
    /// Why the token file there is could not be read, for a refusal that
    /// wanted a token (a warning at mount would be lost in the background).
    unread_token: Option<String>,
    offline: bool,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Where `huggingface-cli login` keeps the token.
fn token_file() -> Option<PathBuf> {
    if let Some(p) = env("HF_TOKEN_PATH") {
        return Some(PathBuf::from(p));
    }
    let home = hf_cache::home(&|k| env(k).map(PathBuf::from))?;
    Some(home.join("token"))
}

/// The token in the file `huggingface-cli login` writes, trimmed; an
/// error saying why when the file is there and cannot be read.
fn token_from_file() -> Option<std::result::Result<String, String>> {
    let path = token_file()?;
    match super::read_small(&path, 64 << 10) {
        Ok(t) => Some(String::from_utf8_lossy(&t).trim().to_string())
            .filter(|t| !t.is_empty())
            .map(Ok),
        // No login: no token, and nothing to say.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(Err(format!(
            "the token file {} cannot be read: {e}",
            path.display()
        ))),
    }
}

impl Hub {
    fn from_env() -> std::result::Result<Hub, String> {
        let ep = env("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let endpoint = url::Url::parse(ep.trim_end_matches('/'))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| format!("HF_ENDPOINT {ep:?} is not an http(s) URL"))?;
        // Trimmed, as huggingface_hub does: a token pasted with its newline
        // is not a header value.
        let token = env("HF_TOKEN")
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .map(Ok)
            .or_else(token_from_file)
            .transpose();
        let (token, unread_token) = match token {
            Ok(t) => (t, None),
            Err(why) => (None, Some(why)),
        };
        // No HTTP header can carry a control character: said here, by
        // name, not by the client at the first request.
        if token
            .as_deref()
            .is_some_and(|t| t.chars().any(char::is_control))
        {
            return Err(match env("HF_TOKEN") {
                Some(_) => "HF_TOKEN holds a control character".to_string(),
                None => format!(
                    "the token file {} holds a control character",
                    token_file().map_or(String::new(), |p| p.display().to_string())
                ),
            });
        }
        let offline = env("HF_HUB_OFFLINE")
            .is_some_and(|v| ["1", "on", "yes", "true"].contains(&v.to_ascii_lowercase().as_str()));
        Ok(Hub {
            endpoint,
            token,
            unread_token,
            offline,
        })
    }

    /// `ENDPOINT/SEGMENTS…`, each segment percent-encoded.
    fn url<'a>(&self, segments: impl IntoIterator<Item = &'a str>) -> url::Url {
        let mut u = self.endpoint.clone();
        if let Ok(mut p) = u.path_segments_mut() {
            p.pop_if_empty().extend(segments);
        }
        u
    }

    /// Whether `u` is on the Hub's own host (the token may go there).
    fn is_hub_host(&self, u: &url::Url) -> bool {
        u.scheme() == self.endpoint.scheme()
            && u.host_str() == self.endpoint.host_str()
            && u.port_or_known_default() == self.endpoint.port_or_known_default()
    }
}

/// A failed exchange with the Hub, as one line (the caller names the
/// repo, revision or file).
type Fail = String;

/// The one line for an answer the Hub gives to say no: its
/// `X-Error-Code`, else the status.
fn refusal(hub: &Hub, status: StatusCode, h: &HeaderMap, what: &str) -> String {
    let code = header(h, "x-error-code").unwrap_or("");
    let token = hub.token.is_some();
    let why = match (code, status.as_u16()) {
        ("GatedRepo", _) if !token => "the repo is gated: its files need a token \
             (HF_TOKEN, or `huggingface-cli login`) of an account that accepted its conditions"
            .into(),
        ("GatedRepo", _) => "the repo is gated, and the token's account has not been \
             granted access (accept its conditions on the Hub)"
            .into(),
        ("RepoNotFound", _) | (_, 401) if !token => {
            "no such repo (or it is private: give a token with HF_TOKEN or `huggingface-cli login`)"
                .into()
        }
        ("RepoNotFound", _) | (_, 401) => "no such repo, or the token cannot see it".into(),
        ("RevisionNotFound", _) => "no such revision (branch, tag or commit)".into(),
        ("EntryNotFound", _) => format!("no such file {what}"),
        (_, 403) => "access denied by the Hub (403)".into(),
        _ => format!("the Hub answered {status}"),
    };
    match &hub.unread_token {
        Some(unread)
            if matches!(status.as_u16(), 401 | 403)
                || matches!(code, "GatedRepo" | "RepoNotFound") =>
        {
            format!("{why} ({unread})")
        }
        _ => why,
    }
}

/// What the Hub says of a revision: its commit and the repo's files.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RepoInfo {
    commit: String,
    /// Every file of the repo at that commit, with its size when known.
    files: Vec<(String, Option<u64>)>,
}

/// Whether `s` names a commit as the Hub does (hex, at least 7 digits).
fn is_commit(s: &str) -> bool {
    s.len() >= 7 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// A revision's record as an earlier mount saved it, if it names a
/// commit (a record damaged or written by hand is not believed), less any
/// file name that is no file's path or repeats one.
fn recorded_info(path: &Path) -> Option<RepoInfo> {
    let mut info = load_record::<RepoInfo>(path).filter(|i| is_commit(&i.commit))?;
    // Names that are no file's path are left out, as from the Hub's list.
    let mut seen = std::collections::HashSet::new();
    info.files
        .retain(|(n, _)| plain_path(n) && seen.insert(n.clone()));
    Some(info)
}

fn parse_info(v: &Value) -> std::result::Result<RepoInfo, Fail> {
    let commit = v["sha"]
        .as_str()
        .filter(|s| is_commit(s))
        .ok_or("the Hub's answer names no commit (\"sha\")")?
        .to_string();
    let mut files: Vec<(String, Option<u64>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut odd = Vec::new();
    for s in v["siblings"].as_array().map_or(&[][..], |a| a.as_slice()) {
        let Some(name) = s["rfilename"].as_str() else {
            continue;
        };
        if !plain_path(name) || !seen.insert(name) {
            odd.push(name);
            continue;
        }
        let size = s["lfs"]["size"].as_u64().or_else(|| s["size"].as_u64());
        files.push((name.to_string(), size));
    }
    if let Some(first) = odd.first() {
        log::warn!(
            "the Hub lists {} file name(s) that are not a file's path (a control \
             character, an empty, . or .. segment) or repeat an earlier one, left out: \
             first {first:?}",
            odd.len()
        );
    }
    Ok(RepoInfo { commit, files })
}

/// Asks the Hub for `spec`'s revision.
async fn fetch_info(hub: &Hub, spec: &Spec, opts: &Options) -> std::result::Result<RepoInfo, Fail> {
    let client = http::client(opts, false)?;
    let (kind, repo) = api_kind(&spec.repo);
    let (org, name) = repo.split_once('/').unwrap_or((repo, ""));
    let mut url = hub.url(["api", kind, org, name, "revision", &spec.revision]);
    url.set_query(Some("blobs=true"));
    let mut hops = 0;
    let r = loop {
        let who = Who::Hub {
            token: hub.token.is_some(),
        };
        let r = send(opts, (&spec.repo, who), || {
            with_token(hub, client.get(url.clone()))
        })
        .await?;
        // A renamed repo: the Hub answers its old name with a redirect to
        // the new one, on its own host, which huggingface_hub follows (the
        // token may go there; it goes to no other host).
        let next = r
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| url.join(l.to_str().ok()?).ok())
            .filter(|n| r.status().is_redirection() && hub.is_hub_host(n));
        match next {
            Some(mut next) if hops < 5 => {
                log::info!(
                    "{}: the Hub sends the repo's API to {}",
                    spec.repo,
                    next.path()
                );
                // The file list's sizes, asked again if the target lacks it.
                if !next.query_pairs().any(|(k, _)| k == "blobs") {
                    next.query_pairs_mut().append_pair("blobs", "true");
                }
                url = next;
                hops += 1;
            }
            _ => break r,
        }
    };
    if r.status().is_redirection()
        && let Some(to) = header(r.headers(), LOCATION.as_str())
    {
        if hops >= 5 {
            return Err("the Hub redirected the repo more than 5 times".into());
        }
        // Another host: not followed, as the token would go there. Shown
        // without what may be a secret (a query, a fragment, a user).
        let Ok(mut to) = url.join(to) else {
            return Err("the Hub redirects the repo to an address that is not a URL".into());
        };
        to.set_query(None);
        to.set_fragment(None);
        let _ = to.set_username("");
        let _ = to.set_password(None);
        let shown: String = to.as_str().chars().take(200).collect();
        return Err(format!(
            "the Hub redirects the repo to {shown:?}, another host, which is not followed \
             (a token goes to the Hub's host alone; set HF_ENDPOINT to use that one)"
        ));
    }
    if !r.status().is_success() {
        return Err(refusal(hub, r.status(), r.headers(), ""));
    }
    let body = read_bounded(r, API_MAX).await?;
    let v: Value =
        serde_json::from_slice(&body).map_err(|e| format!("the Hub's answer is not JSON: {e}"))?;
    parse_info(&v)
}

/// The most the API's answer may take: it lists every file, and a repo of
/// 100 000 files is some 20 MB.
const API_MAX: usize = 64 << 20;

/// A body of at most `max` bytes (a larger one is refused, not read).
async fn read_bounded(mut r: reqwest::Response, max: usize) -> std::result::Result<Vec<u8>, Fail> {
    let mut body = Vec::new();
    while let Some(piece) = r.chunk().await.map_err(|e| one_line_err(&e))? {
        if body.len() + piece.len() > max {
            return Err(format!("the Hub's answer is over {} MiB", max >> 20));
        }
        body.extend_from_slice(&piece);
    }
    Ok(body)
}

fn with_token(hub: &Hub, b: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    match &hub.token {
        Some(t) => b.bearer_auth(t),
        None => b,
    }
}

/// Extensions of the files a mount reads.
const MOUNTABLE: &[&str] = &[
    ".safetensors",
    ".gguf",
    ".zt",
    ".npz",
    ".onnx",
    ".h5",
    ".hdf5",
    ".pt",
    ".pth",
    ".dt",
];

/// The file to mount when the URL names none: the safetensors index, else
/// the one safetensors file, else the one file of another format; those
/// at the repo's top first (what loaders read), then, where its top has
/// none, those of the one folder that has weights (a folder is one part
/// of a diffusers pipeline); else one line listing the candidates, the
/// top's first, then each folder's.
fn choose(spec: &Spec, info: &RepoInfo) -> std::result::Result<String, Fail> {
    let names: Vec<&str> = info.files.iter().map(|(n, _)| n.as_str()).collect();
    let mut folders: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for n in &names {
        folders
            .entry(n.rsplit_once('/').map_or("", |(d, _)| d))
            .or_default()
            .push(n);
    }
    let (top_pick, top) = weights_among(&folders.remove("").unwrap_or_default());
    if let Some(p) = top_pick {
        return Ok(p.to_string());
    }
    let mut in_folders = Vec::new();
    for files in folders.values() {
        match weights_among(files) {
            (Some(p), _) => in_folders.push(p),
            (None, several) => in_folders.extend(several),
        }
    }
    if let (true, [one]) = (top.is_empty(), in_folders.as_slice()) {
        return Ok(one.to_string());
    }
    let candidates = [top, in_folders].concat();
    if candidates.is_empty() {
        return Err(format!(
            "the repo has no weights file the mount reads (of {} file{}); name one as \
             hf://{}@{}/PATH",
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            spec.repo,
            spec.revision
        ));
    }
    let list: Vec<String> = candidates
        .iter()
        .map(|c| format!("hf://{}@{}/{c}", spec.repo, spec.revision))
        .collect();
    Err(format!(
        "the repo has several weights files; name one: {}",
        list.join(" ")
    ))
}

/// The folder of a repo's file (`""` at its top).
fn folder_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

/// Among the files of one folder, the weights file to mount
/// (`model.safetensors.index.json`, else the one safetensors index, else
/// the one safetensors file, else the one file of another format), or the
/// candidates of the first kind there are several of.
fn weights_among<'a>(names: &[&'a str]) -> (Option<&'a str>, Vec<&'a str>) {
    let of = |pred: &dyn Fn(&str) -> bool| -> Vec<&'a str> {
        names.iter().copied().filter(|n| pred(n)).collect()
    };
    let kinds = [
        of(&|n| n.rsplit('/').next() == Some("model.safetensors.index.json")),
        of(&|n| n.ends_with(".safetensors.index.json")),
        of(&|n| n.ends_with(".safetensors")),
        of(&|n| MOUNTABLE.iter().any(|e| n.ends_with(e))),
    ];
    for kind in kinds {
        match kind.as_slice() {
            [] => continue,
            [one] => return (Some(*one), Vec::new()),
            _ => return (None, kind),
        }
    }
    (None, Vec::new())
}

/// Where the facts a mount learned from the Hub are kept for an offline
/// remount: a small JSON file per revision and per file resolved.
fn record_path(opts: &Options, kind: &str, parts: &[&str]) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_128(parts.join("\0").as_bytes());
    opts.cache_dir
        .join("ztensor-remote")
        .join("hub")
        .join(format!("{kind}-{h:032x}.json"))
}

fn save_record(path: &Path, v: &impl serde::Serialize) {
    // Written whole then renamed: a reader sees the old record or the new.
    let r = (|| -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let cache_dir = dir
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("."));
        super::shared::cache_folder(cache_dir)?.map_err(std::io::Error::other)?;
        super::shared::made_folder(dir.to_path_buf())?.map_err(std::io::Error::other)?;
        let tmp = tempfile::NamedTempFile::new_in(dir)?;
        serde_json::to_writer(&tmp, v)?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    })();
    if let Err(e) = r {
        log::warn!(
            "cannot record {} for an offline remount: {e}",
            path.display()
        );
    }
}

/// A record, from a folder whose files may be trusted (see
/// [`super::shared::trusted`]).
fn load_record<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let dir = path.parent()?;
    super::shared::trusted(dir.parent()?).ok()?;
    super::shared::trusted(dir).ok()?;
    serde_json::from_slice(&super::read_small(path, RECORD_MAX).ok()?).ok()
}

/// The most a record holds (a revision's file list; far more than any).
const RECORD_MAX: u64 = 64 << 20;

/// A file's size and ETag, as the Hub said at resolve.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Resolved {
    size: u64,
    etag: String,
}

/// One commit of one repo, as the objects of a mount see it (shared by the
/// mount's files, and by the processes it forks: no connection in it).
#[derive(Debug)]
pub struct Repo {
    hub: Hub,
    repo: String,
    commit: String,
    opts: Options,
    /// Where each file's bytes are (its signed CDN URL), by path.
    locations: Mutex<HashMap<String, (url::Url, Resolved)>>,
    /// The files of the mounted file's folder at the commit (its siblings),
    /// with their sizes where known.
    files: HashMap<String, Option<u64>>,
    /// `huggingface_hub`'s cache, where a file it downloaded is read from.
    hf_cache: Option<PathBuf>,
    /// The HTTP client every file of the repo fetches with, and the
    /// process it was made in (its connections belong to that process's
    /// runtime): one pool of connections to the Hub and the CDN for all
    /// the shards of a set, not a client (and a TLS set-up) each.
    client: super::shared::PerProcess<reqwest::Client>,
    /// For each file, the CDN URL its bytes now come from (without its
    /// query) and the ETag the CDN first gave there. The Hub's
    /// `X-Linked-Etag` names the file, but the bytes come from the CDN: an
    /// answer there under another ETag (its object replaced) is not mixed
    /// with those fetched. A file resolved again to another place starts
    /// a new pin: an ETag is a validator of the server that gives it, and
    /// another CDN (a region, the Xet bridge) may give the same bytes
    /// another; the Hub's `X-Linked-Etag` is compared then. Kept in the
    /// repo, which the daemon inherits at its fork, so the answers the
    /// mount command had are pinned too.
    cdn_etags: Mutex<HashMap<String, (String, String)>>,
}

impl Repo {
    /// This process's HTTP client for the repo's files, made at its first
    /// use in the process.
    fn client(&self) -> std::result::Result<reqwest::Client, String> {
        self.client.get(|| http::client(&self.opts, false))
    }

    /// The path of the file a resolve URL names.
    fn path_of(&self, url: &url::Url) -> Option<String> {
        let base = self
            .hub
            .url(self.repo.split('/').chain(["resolve", &self.commit]));
        let rest = url.path().strip_prefix(base.path())?.strip_prefix('/')?;
        let decoded = percent_decode(rest);
        (!decoded.is_empty()).then_some(decoded)
    }

    /// How messages name the object at `url`: `hf://ORG/REPO@COMMIT/PATH`.
    pub fn label(&self, url: &url::Url) -> String {
        match self.path_of(url) {
            Some(p) => format!("hf://{}@{}/{p}", self.repo, self.commit),
            None => url.to_string(),
        }
    }

    /// The Hub's endpoint where it is not `huggingface.co` (`HF_ENDPOINT`, a
    /// mirror): a mirror may serve other bytes under the same ETag.
    pub fn mirror(&self) -> Option<String> {
        let e = self.hub.endpoint.as_str().trim_end_matches('/');
        (e != DEFAULT_ENDPOINT).then(|| e.to_string())
    }

    fn resolve_url(&self, path: &str) -> url::Url {
        self.hub.url(
            self.repo
                .split('/')
                .chain(["resolve", &self.commit])
                .chain(path.split('/')),
        )
    }

    fn record(&self, path: &str) -> PathBuf {
        record_path(
            &self.opts,
            "file",
            &[self.hub.endpoint.as_str(), &self.repo, &self.commit, path],
        )
    }

    /// The file `path` in `huggingface_hub`'s cache, when it holds it at
    /// this commit with the size the Hub lists (a file of another size is
    /// fetched, and the log says why).
    fn hf_cached(&self, path: &str) -> Option<PathBuf> {
        let cache = self.hf_cache.as_ref()?;
        let (found, size) = hf_cache::file(cache, &self.repo, &self.commit, path)?;
        match self.files.get(path) {
            Some(Some(listed)) if *listed == size => Some(found),
            listed => {
                let listed = match listed {
                    Some(Some(n)) => format!("the Hub lists {n}"),
                    _ => "the Hub lists no size for it".into(),
                };
                log::warn!(
                    "hf://{}@{}/{path}: {} holds {size} bytes, {listed}; fetched instead",
                    self.repo,
                    self.commit,
                    found.display(),
                );
                None
            }
        }
    }

    /// The store for this process's requests.
    pub fn store(self: &Arc<Self>) -> std::result::Result<Arc<dyn ObjectStore>, String> {
        Ok(Arc::new(http::ReadOnly(HubStore {
            repo: self.clone(),
            client: self.client()?,
            resolving: tokio::sync::Mutex::new(()),
        })))
    }
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// The Hub as an object store of one commit: a key is a resolve URL's
/// path, `ORG/REPO/resolve/COMMIT/PATH`. Only reads are offered.
#[derive(Debug)]
struct HubStore {
    repo: Arc<Repo>,
    client: reqwest::Client,
    /// Held while a file is resolved again: the requests that found its
    /// signed URL expired together make one resolve, not one each.
    resolving: tokio::sync::Mutex<()>,
}

impl std::fmt::Display for HubStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HubStore({}@{})", self.repo.repo, self.repo.commit)
    }
}

/// The `store` of this module's errors (remote/failures.rs shows their text alone).
pub const STORE: &str = "Hugging Face Hub";

fn generic(msg: impl Into<String>) -> object_store::Error {
    store_error(Failure::new(FetchKind::Failed, msg))
}

/// A failure as the store's error; its kind goes with it.
fn store_error(f: Failure) -> object_store::Error {
    http::store_error(STORE, f)
}

/// The kind of a refusal: credentials the Hub or the CDN will not take.
/// The kind of a refusal. The commit was resolved at mount, so a repo,
/// revision or file the Hub no longer knows is gone since (as a deleted
/// object is for a store: `Changed`), though it answers 401 for a repo it
/// hides as for one it deleted; what needs a token it will not take is
/// `Denied`.
fn refusal_kind(status: StatusCode, h: &HeaderMap) -> FetchKind {
    match (header(h, "x-error-code"), status.as_u16()) {
        (Some("RepoNotFound" | "RevisionNotFound" | "EntryNotFound"), _) | (_, 404) => {
            FetchKind::Changed
        }
        (Some("GatedRepo"), _) | (_, 401) | (_, 403) => FetchKind::Denied,
        _ => FetchKind::Failed,
    }
}

impl HubStore {
    /// The file a key names (the key is a resolve URL's path).
    fn path(&self, key: &Key) -> object_store::Result<String> {
        let marker = format!("{}/resolve/{}/", self.repo.repo, self.repo.commit);
        key.as_ref()
            .split_once(&marker)
            .map(|(_, p)| p.to_string())
            .filter(|p| !p.is_empty())
            .ok_or_else(|| generic(format!("{key} is not a file of {}", self.repo.repo)))
    }

    /// HEAD of the file's resolve URL: its size and ETag, and where its
    /// bytes are (a relative redirect, as for a renamed repo, is followed
    /// on the Hub's host).
    async fn resolve(&self, path: &str) -> object_store::Result<Resolved> {
        let repo = &self.repo;
        if repo.hub.offline {
            let record = repo.record(path);
            return load_record(&record).ok_or_else(|| {
                generic(match std::fs::symlink_metadata(&record) {
                    Ok(_) => format!(
                        "offline (HF_HUB_OFFLINE is set), and the record of {path} ({}) cannot \
                         be read or is damaged",
                        record.display()
                    ),
                    Err(_) => format!(
                        "offline (HF_HUB_OFFLINE is set), and {path} was never resolved with \
                         this cache directory"
                    ),
                })
            });
        }
        let mut url = repo.resolve_url(path);
        for _ in 0..5 {
            let who = Who::Hub {
                token: repo.hub.token.is_some(),
            };
            let r = send(&repo.opts, (path, who), || {
                with_token(&repo.hub, self.client.head(url.clone()))
                    .header("Accept-Encoding", "identity")
            })
            .await
            .map_err(store_error)?;
            let h = r.headers();
            let status = r.status();
            let location = header(h, LOCATION.as_str()).map(|l| {
                url.join(l).map_err(|e| {
                    // Its query may be a signature; a server's text, cut short.
                    let shown: String = remote::without_queries(l).chars().take(200).collect();
                    format!("the Hub's redirect goes to {shown:?}, which is not a URL ({e})")
                })
            });
            if status.is_redirection()
                && let Some(Ok(to)) = &location
                && repo.hub.is_hub_host(to)
                && header(h, "x-linked-size").is_none()
            {
                url = to.clone();
                continue;
            }
            let (at, res) = resolved(repo, status, h, &url, location)?;
            save_record(&repo.record(path), &res);
            repo.locations
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(path.to_string(), (at, res.clone()));
            return Ok(res);
        }
        Err(generic("the Hub redirected more than 5 times"))
    }

    /// Where the file's bytes are, and its size and ETag, once resolved.
    fn location(&self, path: &str) -> Option<(url::Url, Resolved)> {
        self.repo
            .locations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            .cloned()
    }

    fn meta(&self, key: &Key, r: &Resolved) -> ObjectMeta {
        ObjectMeta {
            location: key.clone(),
            last_modified: chrono::DateTime::UNIX_EPOCH,
            size: r.size,
            e_tag: Some(r.etag.clone()),
            version: None,
        }
    }

    /// A GET of `range` (all of it if none) of the file's bytes; a signed
    /// URL that has expired (403 from the CDN) is resolved again.
    async fn get_range(
        &self,
        key: &Key,
        range: Option<Range<u64>>,
    ) -> object_store::Result<GetResult> {
        let path = self.path(key)?;
        for _ in 0..3 {
            if self.repo.hub.offline {
                return Err(generic(format!(
                    "offline (HF_HUB_OFFLINE is set), and bytes of {path} the read needs are \
                     not in the cache"
                )));
            }
            let (at, resolved) = match self.location(&path) {
                Some(known) => known,
                None => {
                    let _one = self.resolving.lock().await;
                    match self.location(&path) {
                        // Resolved by another request while this one waited.
                        Some(known) => known,
                        None => {
                            self.resolve(&path).await?;
                            self.location(&path)
                                .ok_or_else(|| generic("the file was resolved nowhere"))?
                        }
                    }
                }
            };
            let on_hub = self.repo.hub.is_hub_host(&at);
            let who = match on_hub {
                true => Who::Hub {
                    token: self.repo.hub.token.is_some(),
                },
                false => Who::Cdn(at.host_str().unwrap_or("?")),
            };
            let r = send(&self.repo.opts, (&path, who), || {
                let mut b = self.client.get(at.clone());
                if on_hub {
                    b = with_token(&self.repo.hub, b);
                }
                if let Some(r) = &range {
                    b = b.header("Range", http::range_header(r));
                }
                b
            })
            .await
            .map_err(store_error)?;
            let status = r.status();
            if status == StatusCode::FORBIDDEN && !on_hub {
                let mut map = self
                    .repo
                    .locations
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                // Unless another request has resolved it again already.
                if map.get(&path).is_some_and(|(u, _)| *u == at) {
                    log::info!("{path}: the signed URL was refused (expired?); resolving it again");
                    map.remove(&path);
                }
                continue;
            }
            return self.answer(key, r, range, &resolved);
        }
        Err(store_error(Failure::new(
            FetchKind::Denied,
            format!("{path}: the CDN refused its freshly signed URL three times"),
        )))
    }

    /// Pins the CDN's ETag for `key`'s file at its first answer from the
    /// place `at`; a later answer there under another is the file changed.
    fn same_cdn_etag(&self, key: &Key, at: &url::Url, etag: &str) -> object_store::Result<()> {
        let path = self.path(key)?;
        let mut place = at.clone();
        place.set_query(None);
        let mut pinned = self
            .repo
            .cdn_etags
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (pin_place, first) = pinned
            .entry(path)
            .or_insert_with(|| (place.to_string(), etag.to_string()));
        if *pin_place != place.as_str() {
            *pin_place = place.to_string();
            *first = etag.to_string();
        } else if first != etag {
            return Err(store_error(Failure::new(
                FetchKind::Changed,
                format!("the CDN now gives ETag {etag} where it gave {first}"),
            )));
        }
        Ok(())
    }

    fn answer(
        &self,
        key: &Key,
        r: reqwest::Response,
        range: Option<Range<u64>>,
        file: &Resolved,
    ) -> object_store::Result<GetResult> {
        let Some(got) = http::extent(STORE, &r, range.is_some(), Some(file.size)) else {
            // The Hub's error codes are the Hub's; a CDN's answer is named
            // as the CDN's.
            let s = r.status();
            let why = match r.url().host_str() {
                Some(host) if !self.repo.hub.is_hub_host(r.url()) => {
                    format!("{} answered {s}", Who::Cdn(host))
                }
                _ => refusal(&self.repo.hub, s, r.headers(), "at that commit"),
            };
            return Err(store_error(Failure::new(refusal_kind(s, r.headers()), why)));
        };
        let (bytes, total) = got?;
        if let Some(etag) = header(r.headers(), "etag") {
            self.same_cdn_etag(key, r.url(), etag)?;
        }
        let mut meta = self.meta(key, file);
        // A size that differs is the caller's to see (it refuses the bytes).
        meta.size = total;
        Ok(http::get_result(STORE, r, meta, bytes))
    }
}

/// What the final answer to a resolve says: where the bytes are (the
/// redirect's target, else the URL asked) and the file's size and ETag.
fn resolved(
    repo: &Repo,
    status: StatusCode,
    h: &HeaderMap,
    url: &url::Url,
    location: Option<std::result::Result<url::Url, String>>,
) -> object_store::Result<(url::Url, Resolved)> {
    if !(status.is_success() || status.is_redirection()) {
        let what = format!("at commit {}", repo.commit);
        let why = refusal(&repo.hub, status, h, &what);
        return Err(store_error(Failure::new(refusal_kind(status, h), why)));
    }
    if let Some(c) = header(h, "x-repo-commit")
        && c != repo.commit
    {
        return Err(generic(format!(
            "the Hub resolved commit {} to {c}",
            repo.commit
        )));
    }
    // A large file's size and ETag are on the redirect (X-Linked-*); a
    // small one's on the answer that carries it.
    let size = header(h, "x-linked-size")
        .or_else(|| {
            status
                .is_success()
                .then(|| header(h, "content-length"))
                .flatten()
        })
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| generic("the Hub's answer gives no size"))?;
    let etag = header(h, "x-linked-etag")
        .or_else(|| header(h, "etag"))
        .map(|e| e.trim_start_matches("W/").to_string())
        .ok_or_else(|| generic("the Hub's answer gives no ETag"))?;
    let at = if status.is_redirection() {
        match location {
            Some(Ok(to)) => to,
            Some(Err(why)) => return Err(generic(why)),
            None => return Err(generic("the Hub's redirect has no Location")),
        }
    } else {
        url.clone()
    };
    Ok((at, Resolved { size, etag }))
}

#[async_trait]
impl http::Reader for HubStore {
    const NAME: &'static str = STORE;

    async fn head(&self, key: &Key) -> object_store::Result<ObjectMeta> {
        let r = self.resolve(&self.path(key)?).await?;
        Ok(self.meta(key, &r))
    }

    /// The commit pins the bytes: If-Match is not needed (and a CDN's ETag
    /// is not the Hub's).
    async fn get(
        &self,
        key: &Key,
        range: Option<Range<u64>>,
        _: Option<&str>,
    ) -> object_store::Result<GetResult> {
        self.get_range(key, range).await
    }
}

fn fail(label: &str, why: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, label, None, why.to_string())
}

/// The commit and files of `spec`'s revision: asked of the Hub (and
/// recorded), or, offline, as recorded by an earlier mount.
fn repo_info(hub: &Hub, spec: &Spec, opts: &Options, label: &str) -> Result<RepoInfo> {
    let record = record_path(
        opts,
        "rev",
        &[hub.endpoint.as_str(), &spec.repo, &spec.revision],
    );
    if hub.offline {
        return recorded_info(&record)
            .or_else(|| offline_info(spec))
            .ok_or_else(|| {
                let why = match std::fs::symlink_metadata(&record) {
                    Ok(_) => format!(
                        "offline (HF_HUB_OFFLINE is set), the record of this revision ({}) \
                         cannot be read or is damaged, and huggingface_hub's cache does not \
                         have it",
                        record.display()
                    ),
                    Err(_) => "offline (HF_HUB_OFFLINE is set), and neither a mount with this \
                               cache directory nor huggingface_hub's cache resolved this \
                               revision before"
                        .into(),
                };
                fail(label, why)
            });
    }
    let rt =
        remote::runtime().map_err(|e| fail(label, format!("cannot start the I/O runtime: {e}")))?;
    let info = rt
        .block_on(fetch_info(hub, spec, opts))
        .map_err(|e| fail(label, e))?;
    save_record(&record, &info);
    // The commit names itself: an offline remount by the commit the log
    // and the index name finds it too.
    if spec.revision != info.commit {
        let by_commit = [hub.endpoint.as_str(), &spec.repo, &info.commit];
        save_record(&record_path(opts, "rev", &by_commit), &info);
    }
    Ok(info)
}

/// The commit and files of `spec`'s revision as `huggingface_hub`'s cache
/// knows them: its ref, and what its snapshot holds.
fn offline_info(spec: &Spec) -> Option<RepoInfo> {
    let cache = hf_cache::dir()?;
    let commit = hf_cache::commit(&cache, &spec.repo, &spec.revision)?;
    let files = hf_cache::files(&cache, &spec.repo, &commit);
    Some(RepoInfo { commit, files })
}

/// The most of a repo's other files `.ztensor/index.json` names: a
/// dataset repo may hold millions, and the list is held for as long as the
/// mount runs (within `--index-memory`, with the catalog).
const OTHER_FILES_LISTED: usize = 10_000;

/// What `.ztensor/index.json` says of a Hub file (under `attributes`).
fn describe(hub: &Hub, spec: &Spec, info: &RepoInfo, path: &str) -> Value {
    let (listed, unlisted) = other_files(info, path);
    let mut about = serde_json::json!({
        "endpoint": hub.endpoint.as_str(),
        "repo": spec.repo,
        "revision": spec.revision,
        "commit": info.commit,
        "path": path,
        "other_files": listed,
    });
    if unlisted > 0 {
        about["other_files_not_listed"] = unlisted.into();
    }
    about
}

/// The repo's files but `path`: the first [`OTHER_FILES_LISTED`], and how
/// many more there are.
fn other_files<'a>(info: &'a RepoInfo, path: &str) -> (Vec<&'a str>, usize) {
    let others = info
        .files
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != path);
    let listed: Vec<&str> = others.clone().take(OTHER_FILES_LISTED).collect();
    let unlisted = others.count() - listed.len();
    (listed, unlisted)
}

/// Opens the file of `repo` that resolve URL `url` names: read where it is
/// when `huggingface_hub` has downloaded it already (see
/// [`Repo::hf_cached`]), else fetched as a remote object.
pub(super) fn open_file(repo: &Arc<Repo>, url: url::Url) -> Result<MappedFile> {
    if let Some(local) = repo.path_of(&url).and_then(|p| repo.hf_cached(&p)) {
        let label = repo.label(&url);
        match MappedFile::open(&local) {
            Ok(f) => {
                log::info!(
                    "{label}: read from huggingface_hub's cache, {} (nothing fetched)",
                    local.display()
                );
                let siblings = Arc::new(CachedSiblings {
                    repo: repo.clone(),
                    url,
                });
                return Ok(f.relabel(label, siblings));
            }
            Err(e) => log::warn!("{label}: fetched: {e}"),
        }
    }
    remote::open_hub(url, &repo.opts, repo.clone())
}

/// The siblings of a file read from `huggingface_hub`'s cache: each read
/// from there too where it is, else fetched.
struct CachedSiblings {
    repo: Arc<Repo>,
    url: url::Url,
}

impl super::Siblings for CachedSiblings {
    fn sibling(&self, name: &str) -> Result<MappedFile> {
        sibling(&self.repo, &self.url, name)
    }
}

/// Opens the file `name` beside the one at resolve URL `url` of `repo`:
/// from `huggingface_hub`'s cache where it is, else fetched.
pub(super) fn sibling(repo: &Arc<Repo>, url: &url::Url, name: &str) -> Result<MappedFile> {
    let url = remote::sibling_url(url, name)
        .ok_or_else(|| fail(&repo.label(url), format!("sibling {name:?}: not beside it")))?;
    open_file(repo, url)
}

/// Opens `arg` (`hf://ORG/REPO[@REVISION][/PATH]`): resolves the revision
/// to a commit, picks the file, and opens it as a remote object. Also
/// gives what index.json should say of it.
pub fn open(arg: &str, opts: &Options) -> Result<(MappedFile, Value)> {
    let spec = parse(arg, opts.revision.as_deref()).map_err(|e| fail(arg, e))?;
    let label = format!("hf://{}@{}", spec.repo, spec.revision);
    let hub = Hub::from_env().map_err(|e| fail(&label, e))?;
    let info = repo_info(&hub, &spec, opts, &label)?;
    let path = match &spec.path {
        Some(p) => {
            if !info.files.is_empty() && !info.files.iter().any(|(n, _)| n == p) {
                return Err(fail(
                    &format!("{label}/{p}"),
                    format!("no such file at commit {}", info.commit),
                ));
            }
            p.clone()
        }
        None => choose(&spec, &info).map_err(|e| fail(&label, e))?,
    };
    log::info!(
        "{label}: revision {} is commit {}; mounting {path} (the repo has {} other files{})",
        spec.revision,
        info.commit,
        info.files.len().saturating_sub(1),
        if hub.offline { "; offline" } else { "" }
    );
    let about = describe(&hub, &spec, &info, &path);
    let repo = Arc::new(Repo {
        hub,
        repo: spec.repo.clone(),
        commit: info.commit.clone(),
        opts: opts.clone(),
        locations: Mutex::new(HashMap::new()),
        // Only the mounted file's folder: its siblings (shards, external
        // data) are beside it, and a dataset repo may list millions.
        files: info
            .files
            .into_iter()
            .filter(|(n, _)| folder_of(n) == folder_of(&path))
            .collect(),
        hf_cache: hf_cache::dir(),
        client: super::shared::PerProcess::new(),
        cdn_etags: Mutex::default(),
    });
    let url = repo.resolve_url(&path);
    let file = open_file(&repo, url)?;
    Ok((file, about))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_revision_is_refused_however_it_is_given() {
        assert!(
            parse("hf://o/r@", None)
                .unwrap_err()
                .contains("the revision after @ is empty")
        );
        assert!(
            parse("hf://o/r", Some(""))
                .unwrap_err()
                .contains("--revision is empty")
        );
        assert_eq!(parse("hf://o/r", Some("v1")).unwrap().revision, "v1");
        assert_eq!(parse("hf://o/r", None).unwrap().revision, "main");
    }

    #[test]
    fn a_refusal_at_read_time_is_gone_denied_or_failed() {
        let kind = |status: u16, code: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(c) = code {
                h.insert("x-error-code", c.parse().unwrap());
            }
            refusal_kind(StatusCode::from_u16(status).unwrap(), &h)
        };
        // The commit was resolved at mount: what the Hub no longer knows
        // is gone since.
        assert_eq!(kind(401, Some("RepoNotFound")), FetchKind::Changed);
        assert_eq!(kind(404, Some("RevisionNotFound")), FetchKind::Changed);
        assert_eq!(kind(404, Some("EntryNotFound")), FetchKind::Changed);
        assert_eq!(kind(404, None), FetchKind::Changed);
        assert_eq!(kind(401, Some("GatedRepo")), FetchKind::Denied);
        assert_eq!(kind(403, Some("GatedRepo")), FetchKind::Denied);
        assert_eq!(kind(401, None), FetchKind::Denied);
        assert_eq!(kind(403, None), FetchKind::Denied);
        assert_eq!(kind(500, None), FetchKind::Failed);
    }

    #[test]
    fn urls_parse_into_repo_revision_and_path() {
        let p = |a: &str| parse(a, None);
        assert_eq!(
            p("hf://org/repo").unwrap(),
            Spec {
                repo: "org/repo".into(),
                revision: "main".into(),
                path: None
            }
        );
        let s = p("hf://o-1/r.x@v1.0/sub/m.safetensors").unwrap();
        assert_eq!(s.repo, "o-1/r.x");
        assert_eq!(s.revision, "v1.0");
        assert_eq!(s.path.as_deref(), Some("sub/m.safetensors"));
        assert_eq!(parse("hf://o/r", Some("dev")).unwrap().revision, "dev");
        assert!(parse("hf://o/r@a", Some("b")).is_err());
        assert_eq!(parse("hf://o/r@a", Some("a")).unwrap().revision, "a");
        let pr = p("hf://o/r@refs%2Fpr%2F3/m.safetensors").unwrap();
        assert_eq!(pr.revision, "refs/pr/3");
        assert_eq!(pr.path.as_deref(), Some("m.safetensors"));
        let pr = parse("hf://o/r@refs%2Fpr%2F3", Some("refs/pr/3")).unwrap();
        assert_eq!(pr.revision, "refs/pr/3");
        let d = p("hf://datasets/o/d@v2/t.safetensors").unwrap();
        assert_eq!(
            (d.repo.as_str(), d.revision.as_str()),
            ("datasets/o/d", "v2")
        );
        assert_eq!(api_kind(&d.repo), ("datasets", "o/d"));
        assert_eq!(api_kind("o/r"), ("models", "o/r"));
        assert_eq!(p("hf://spaces/o/s").unwrap().repo, "spaces/o/s");
        for bad in [
            "hf://",
            "hf://datasets/o",
            "hf://o",
            "hf://o/",
            "hf://o/r@",
            "hf://o/r/../x",
            "hf://o/r//x",
            "hf://o/r/m\n.safetensors",
            "hf://o/r@..",
            "hf://o/r@%2e%2e",
            "hf://o/r@.",
            "hf://o/r@refs%2F..%2Fx",
            "hf://o/r@a%00b",
            "hf://o/r/\x1b[31mm.safetensors",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(is_hub("HF://o/r"));
        assert!(!is_hub("hf:/o/r"));
    }

    fn info(files: &[&str]) -> RepoInfo {
        RepoInfo {
            commit: "abc1234".into(),
            files: files.iter().map(|f| (f.to_string(), None)).collect(),
        }
    }

    #[test]
    fn names_the_hub_lists_that_are_not_a_files_path_once_are_left_out() {
        let v = serde_json::json!({"sha": "abc1234", "siblings": [
            {"rfilename": "model.safetensors", "size": 8},
            {"rfilename": "model\n.safetensors"},
            {"rfilename": "a/../../secret/model.safetensors"},
            {"rfilename": "\u{1b}]0;title\u{7}x.gguf"},
            {"rfilename": "sub//x.gguf"},
            {"rfilename": "model.safetensors", "size": 9},
            {"rfilename": "sub/x.gguf"},
        ]});
        let files = parse_info(&v).unwrap().files;
        assert_eq!(
            files,
            [
                ("model.safetensors".to_string(), Some(8)),
                ("sub/x.gguf".to_string(), None)
            ]
        );
    }

    #[test]
    fn a_repo_of_many_files_lists_the_first_of_its_others_and_counts_the_rest() {
        let names: Vec<String> = (0..OTHER_FILES_LISTED + 5)
            .map(|i| format!("f{i}"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let many = info(&names);
        let (listed, unlisted) = other_files(&many, "f3");
        assert_eq!((listed.len(), unlisted), (OTHER_FILES_LISTED, 4));
        assert!(!listed.contains(&"f3"));
        let two = info(&["a", "b"]);
        assert_eq!(other_files(&two, "a"), (vec!["b"], 0));
    }

    #[test]
    fn the_weights_are_the_index_else_the_one_file() {
        let spec = parse("hf://o/r", None).unwrap();
        let c = |f: &[&str]| choose(&spec, &info(f));
        assert_eq!(
            c(&[
                "config.json",
                "model.safetensors.index.json",
                "a.safetensors",
                "b.safetensors"
            ])
            .unwrap(),
            "model.safetensors.index.json"
        );
        assert_eq!(
            c(&["config.json", "model.safetensors"]).unwrap(),
            "model.safetensors"
        );
        assert_eq!(c(&["README.md", "m.Q4.gguf"]).unwrap(), "m.Q4.gguf");
        assert_eq!(
            c(&["m.Q4.gguf", "m.Q8.gguf"]).unwrap_err(),
            "the repo has several weights files; name one: hf://o/r@main/m.Q4.gguf \
             hf://o/r@main/m.Q8.gguf"
        );
        assert!(c(&["README.md"]).unwrap_err().contains("no weights file"));
        // The repo's top first: a folder's set is another model's part.
        assert_eq!(
            c(&[
                "model.safetensors",
                "text_encoder_2/model.safetensors.index.json",
                "text_encoder_2/model-00001-of-00002.safetensors",
            ])
            .unwrap(),
            "model.safetensors"
        );
        assert_eq!(
            c(&["onnx/model.onnx", "model.safetensors"]).unwrap(),
            "model.safetensors"
        );
        // Only folders: their one set.
        assert_eq!(
            c(&["README.md", "unet/diffusion_pytorch_model.safetensors"]).unwrap(),
            "unet/diffusion_pytorch_model.safetensors"
        );
        // Several at the top: those, then each folder's, by name.
        assert_eq!(
            c(&[
                "flux1-dev.safetensors",
                "ae.safetensors",
                "transformer/diffusion_pytorch_model.safetensors.index.json",
                "text_encoder_2/model.safetensors.index.json",
            ])
            .unwrap_err(),
            "the repo has several weights files; name one: \
             hf://o/r@main/flux1-dev.safetensors hf://o/r@main/ae.safetensors \
             hf://o/r@main/text_encoder_2/model.safetensors.index.json \
             hf://o/r@main/transformer/diffusion_pytorch_model.safetensors.index.json"
        );
    }
}
