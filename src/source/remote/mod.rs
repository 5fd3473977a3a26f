//! A remote object (`s3://`, `gs://`, `az://`, `http(s)://`) served as a
//! mapped file. At open the object is pinned (HEAD: size, ETag, version)
//! and backed by a sparse file in the cache directory, named from the URL
//! and the pin, with a bitmap of the blocks present saved beside it. Blocks
//! are fetched on demand with ranged GETs pinned to that ETag/version
//! (`If-Match`): an object that changed fails the read, it never mixes old
//! and new bytes. A fetched block is written into the file and only then
//! marked present, so the mapping (and every zero-copy path over it) holds
//! the object's bytes wherever [`Backing::ensure`](crate::source::Backing::ensure) said yes; the file lives
//! in the page cache, so memory stays bounded, and a remount with the same
//! ETag finds its blocks there.
//!
//! The clients are `object_store`'s (credentials and endpoints from the
//! usual environment, retries with backoff, timeouts); they are async, and
//! run on a small tokio runtime of this module's own. Readers wait on a
//! block's flight (one request per cold block, however many wait for it).
//!
//! Here: the URL, its options and the open. `client` reaches the store,
//! `object` serves the mapping and tracks its blocks, `fetch` brings
//! blocks in, `cache` keeps the files under `--cache-dir`, `failures`
//! words what went wrong.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

use super::MappedFile;
use crate::error::{Error, ErrorKind, Result};

mod cache;
mod client;
mod failures;
mod fetch;
mod object;
#[cfg(test)]
mod tests;

use cache::Cache;
use client::Client;
use failures::fetch_error;
use failures::head_not_allowed;
use object::LIVE;
use object::Object;
use object::Pinned;

pub use cache::block_size_allowed;
pub(in crate::source) use object::sibling_url;
pub use object::{Counters, after_fork, commit_all, counters};

/// Where and how remote objects are fetched.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the cache files go (under `ztensor-remote/`).
    pub cache_dir: PathBuf,
    /// Bytes fetched per block (a multiple of the page size).
    pub block_size: u64,
    /// Most bytes the cache files may take on disk; older files (not in
    /// use) are deleted at open until the rest fits.
    pub disk_cache_size: u64,
    /// An S3-compatible server's endpoint (`http://host:port`).
    pub endpoint: Option<String>,
    /// One request's time limit (connect to last byte).
    pub timeout: Duration,
    /// Retries of a failed request (with backoff) before the read fails.
    pub retries: usize,
    /// Blocks fetched ahead of a sequential reader.
    pub read_ahead: u64,
    /// Largest object fetched whole from a server that ignores Range
    /// requests (`--index-memory`); a larger one is refused.
    pub whole_max: u64,
    /// PEM certificates (a CA, or a server's own) trusted besides the
    /// system's (`--ca-file`).
    pub ca_file: Option<PathBuf>,
    /// For an `hf://` URL: the revision (`--revision`), unless the URL
    /// names one.
    pub revision: Option<String>,
}

/// Default block: 4 MiB (see BENCHMARKS.md, remote reads): large enough
/// that a request's round trip is small next to its transfer, small enough
/// that a reader in the middle of a tensor waits for little it did not ask.
pub const DEFAULT_BLOCK: u64 = 4 << 20;

impl Default for Options {
    fn default() -> Self {
        Options {
            cache_dir: PathBuf::from("/var/tmp"),
            block_size: DEFAULT_BLOCK,
            disk_cache_size: 16 << 30,
            endpoint: None,
            timeout: Duration::from_secs(30),
            retries: 3,
            read_ahead: DEFAULT_READ_AHEAD,
            whole_max: 1 << 30,
            ca_file: None,
            revision: None,
        }
    }
}

/// Default read-ahead: 8 blocks (32 MiB of 4 MiB blocks), each its own
/// request. With the bench's server answering 20 ms late, 8 in flight ran
/// at 1.0-1.4x of curl making 4 at a time, 4 at 0.8x (BENCHMARKS.md).
pub const DEFAULT_READ_AHEAD: u64 = 8;

/// Requests in flight at once, per object: the read-ahead's and the
/// reader's own.
const MAX_REQUESTS: usize = 12;
/// A multi-block range is fetched as at most this many parallel requests.
const PARALLEL: u64 = 4;
/// Threads checking a cache file's blocks at once (see
/// [`Backing::check_present`](crate::source::Backing::check_present)).
const CHECKERS: usize = 4;

const SCHEMES: &[&str] = &[
    "s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss", "http", "https",
];

/// For an object store's URL (`s3://BUCKET/KEY`, `gs://`, `az://`, ...),
/// the key as it was typed: stores take any bytes in a key, as the AWS
/// CLI does, where a URL parser would cut it at `#` or `?`, resolve `.`
/// and `..` and decode `%2F`, and so name another object.
fn typed_key(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if !SCHEMES.contains(&scheme.as_str()) || matches!(scheme.as_str(), "http" | "https") {
        return None;
    }
    Some(rest.split_once('/').map_or("", |(_, key)| key))
}

/// An object store's key as typed, as the store's client will send it; an
/// error for one it cannot send as it is.
fn store_key(key: &str) -> std::result::Result<Key, String> {
    if key.is_empty() {
        return Err("the URL names no object (no key after the bucket)".into());
    }
    if key.ends_with('/') {
        return Err("the URL names no object (it ends in /)".into());
    }
    let sendable = !key.starts_with('/')
        && key
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..");
    match Key::parse(key) {
        Ok(k) if sendable => Ok(k),
        _ => Err(format!(
            "the key {key:?} has an empty, `.` or `..` segment or a control character, \
             which this client cannot ask the store for as it is"
        )),
    }
}

/// Whether `arg` is a URL this module opens (rather than a path).
pub fn is_url(arg: &str) -> bool {
    arg.split_once("://")
        .is_some_and(|(s, _)| SCHEMES.contains(&s.to_ascii_lowercase().as_str()))
}

/// `text` with the query of each URL in it replaced by `?…`. The HTTP
/// client names the URL a request failed on, and a CDN's URL carries its
/// signature in the query: a log line must not hand out the file (a gated
/// repo's included) to whoever reads the log.
pub(super) fn without_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    // Any scheme: a redirect may point elsewhere than http(s) (the client
    // then names that URL, query and all, in its error).
    while let Some(i) = url_start(rest) {
        let end = rest[i..]
            .find(|c: char| c.is_whitespace() || matches!(c, ')' | '"' | '\'' | '>'))
            .map_or(rest.len(), |e| i + e);
        let url = &rest[i..end];
        out.push_str(&rest[..i]);
        match url.find('?') {
            Some(q) => {
                out.push_str(&url[..q]);
                out.push_str("?…");
            }
            None => out.push_str(url),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where the first URL in `text` starts: the scheme before its first
/// `://` (letters, digits, `+`, `-`, `.`, starting with a letter).
fn url_start(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = text[from..].find("://").map(|k| from + k) {
        let scheme = text[..k]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |p| p + 1);
        let first = text[scheme..k].find(|c: char| c.is_ascii_alphabetic());
        if let Some(f) = first.filter(|_| k > scheme) {
            return Some(scheme + f);
        }
        from = k + 3;
    }
    None
}

fn fail(label: &str, why: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, label, None, one_line(why))
}

/// An error from a client or server as one line, with the query of any
/// URL in it left out (see [`without_queries`]).
fn one_line(why: impl std::fmt::Display) -> String {
    let s = without_queries(&why.to_string());
    let s: Vec<&str> = s.split_whitespace().collect();
    let mut s = s.join(" ");
    if s.len() > 400 {
        let mut end = 400;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// The runtime the clients run on, with the process it belongs to.
static RT: Mutex<Option<(u32, tokio::runtime::Runtime)>> = Mutex::new(None);

/// Stops the runtime, waiting for its threads and for any blocking task
/// still running (a cache bitmap being saved), so that a fork that follows
/// copies a process of one thread and no lock held by another. The next
/// use makes a new one.
pub fn before_fork() {
    let old = RT.lock().unwrap_or_else(|p| p.into_inner()).take();
    drop(old);
}

/// The runtime the clients run on, made again in a forked child (a fork
/// keeps none of the parent's threads).
pub(super) fn runtime() -> std::io::Result<tokio::runtime::Handle> {
    let mut rt = RT.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some((p, r)) = rt.as_ref()
        && *p == pid
    {
        return Ok(r.handle().clone());
    }
    if let Some((_, old)) = rt.take() {
        // The parent's: its threads are not in this process; dropping it
        // would wait for them.
        std::mem::forget(old);
    }
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("zt-remote")
        .enable_all()
        .build()?;
    let h = r.handle().clone();
    *rt = Some((pid, r));
    Ok(h)
}

/// The key of the object at `url` in its store.
fn key_of(url: &url::Url) -> std::result::Result<Key, String> {
    // The bucket or container is the URL's host (an HTTP server's base is
    // its origin); the key is the path, percent-decoded.
    let path = url.path().trim_start_matches('/');
    if path.is_empty() || path.ends_with('/') {
        return Err("the URL names no object (it ends in /)".into());
    }
    Key::from_url_path(path).map_err(one_line)
}

/// The wait before a first retry, doubled for each one after, up to
/// [`MAX_BACKOFF`]: object_store's clients are given this schedule, and
/// the requests this module and the stores of http.rs retry themselves
/// keep it ([`backoff`]).
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The wait before retry `n` (1 for the first).
pub(super) fn backoff(n: usize) -> Duration {
    (FIRST_BACKOFF * (1 << n.saturating_sub(1).min(6))).min(MAX_BACKOFF)
}

/// The longest URL the HTTP client sends (its `Uri` holds a length in
/// 16 bits); a longer one would fail at the first request in the client's
/// words ("Parsed Url is not a valid Uri").
const MAX_URL: usize = u16::MAX as usize - 1;

/// Opens the object at `url`: pins it (HEAD) and maps its cache file.
pub fn open(url: &str, opts: &Options) -> Result<MappedFile> {
    let parsed = url::Url::parse(url)
        .map_err(|e| fail(&without_queries(url), format!("not a valid URL: {e}")))?;
    no_credentials(url, &parsed)?;
    if parsed.as_str().len() > MAX_URL {
        return Err(fail(
            &without_queries(url),
            format!(
                "the URL is {} bytes long; an HTTP request can carry at most {MAX_URL}",
                parsed.as_str().len()
            ),
        ));
    }
    let client = Arc::new(Client {
        url: parsed.clone(),
        opts: opts.clone(),
        store: crate::source::shared::PerProcess::new(),
        redirect: tokio::sync::OnceCell::new(),
        hub: None,
        endpoint: std::sync::OnceLock::new(),
    });
    let typed = typed_key(url).map(|k| Typed {
        label: url.to_string(),
        key: k.to_string(),
    });
    open_with(client, parsed, typed)
}

/// Refuses a URL that holds a user name or password, named without them:
/// this client does not send them, and the URL is the mount's label, in
/// the log, the index and the mount table (which every user reads).
fn no_credentials(url: &str, parsed: &url::Url) -> Result<()> {
    const WHY: &str = "a user name or password in the URL is not sent by this client (and \
                       would show in the mount table)";
    // A bucket name has no `@`; Azure's `container@account` has, but no
    // `:` before it (a password).
    let authority = url
        .split_once("://")
        .map_or("", |(_, rest)| rest.split('/').next().unwrap_or(""));
    let in_bucket = match authority.rsplit_once('@') {
        None => false,
        Some((user, _)) => matches!(parsed.scheme(), "s3" | "s3a" | "gs") || user.contains(':'),
    };
    let store = typed_key(url).is_some();
    if store && in_bucket {
        return Err(fail(
            &format!("{}://…", parsed.scheme()),
            format!("{WHY}; give the store's credentials in its variables or files instead"),
        ));
    }
    if !store && (!parsed.username().is_empty() || parsed.password().is_some()) {
        let mut shown = parsed.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        return Err(fail(
            &without_queries(shown.as_str()),
            format!("{WHY}; give the server's credentials in a signed URL's query instead"),
        ));
    }
    Ok(())
}

/// Opens the file of a Hub repo whose resolve URL is `url`, fetched
/// through `repo`'s store.
pub(super) fn open_hub(
    url: url::Url,
    opts: &Options,
    repo: Arc<crate::source::hub::Repo>,
) -> Result<MappedFile> {
    let client = Arc::new(Client {
        url: url.clone(),
        opts: opts.clone(),
        store: crate::source::shared::PerProcess::new(),
        redirect: tokio::sync::OnceCell::new(),
        hub: Some(repo),
        endpoint: std::sync::OnceLock::new(),
    });
    open_with(client, url, None)
}

/// An object store's URL as typed and its key ([`typed_key`]): what the
/// object is called and asked for, rather than what a URL parser makes of
/// it.
#[derive(Clone)]
struct Typed {
    label: String,
    key: String,
}

impl Typed {
    /// The object `name` beside this one.
    fn sibling(&self, name: &str) -> Typed {
        let key = match self.key.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/{name}"),
            None => name.to_string(),
        };
        let base = self.label.len() - self.key.len();
        Typed {
            label: format!("{}{key}", &self.label[..base]),
            key,
        }
    }
}

fn open_with(client: Arc<Client>, url: url::Url, typed: Option<Typed>) -> Result<MappedFile> {
    let label = label_of(&client, &url, typed.as_ref());
    let opts = &client.opts;
    if opts.block_size == 0 || !opts.block_size.is_multiple_of(super::page_size() as u64) {
        return Err(fail(
            &label,
            format!(
                "block size {} is not a multiple of the page size",
                opts.block_size
            ),
        ));
    }
    let key = match &typed {
        Some(t) => store_key(&t.key),
        None => key_of(&url),
    }
    .map_err(|e| fail(&label, e))?;
    let (meta, by_get) = pin(&client, &url, &key).map_err(|e| fail(&label, e))?;
    // What names this object's bytes: its ETag, its version, else its
    // Last-Modified (`object_store` gives the epoch for none at all).
    let modified = Some(meta.last_modified.timestamp()).filter(|&t| t != 0);
    let pin = meta
        .e_tag
        .clone()
        .or_else(|| meta.version.clone())
        .or_else(|| modified.map(|t| format!("lm{t}")));
    if pin.is_none() {
        log::warn!(
            "{label}: the server gives neither an ETag nor a Last-Modified: a change of the \
             object while mounted cannot be seen, and its cache file is not kept"
        );
    }
    let identity = cache_identity(&client, &url, &label);
    let cache = Cache::open(opts, (&label, &identity), pin.as_deref(), meta.size)?;
    if cache.block != opts.block_size {
        log::info!(
            "{label}: its cache file holds blocks of {} bytes, so it is fetched in those, not \
             in -o block_size's {} (which applies to objects not in the cache)",
            cache.block,
            opts.block_size
        );
    }
    let path = cache.path.clone();
    let pinned = Pinned {
        key,
        etag_on_gets: by_get && meta.e_tag.is_some(),
        meta,
        modified,
    };
    let (obj, file) = Object::new(client, url, typed, label.clone(), pinned, cache);
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Arc::downgrade(&obj));
    let have = obj
        .present
        .iter()
        .map(|w| w.load(Relaxed).count_ones() as u64)
        .sum::<u64>();
    log::info!(
        "{label}: {} bytes, pinned to {}; cache file {} ({have} of {} blocks present)",
        obj.size,
        pin.as_deref().unwrap_or("nothing"),
        path.display(),
        obj.blocks()
    );
    // The URL stands for its path (messages, a shard's name beside it).
    MappedFile::with_backing(Path::new(&label), label.clone(), file, obj)
}

/// How messages and logs name the object: a signed URL's query is a
/// credential, never in a log line or a message.
fn label_of(client: &Client, url: &url::Url, typed: Option<&Typed>) -> String {
    match (&client.hub, typed) {
        (Some(repo), _) => repo.label(url),
        (None, Some(t)) => t.label.clone(),
        (None, None) => without_queries(url.as_str()),
    }
}

/// The object's size and validators (a HEAD), and whether they came from
/// a GET's answer: a signed URL's store asks no HEAD, and a server without
/// HEAD is asked for its first byte; every GET of such a server then
/// carries what pinned it.
fn pin(
    client: &Arc<Client>,
    url: &url::Url,
    key: &Key,
) -> std::result::Result<(object_store::ObjectMeta, bool), String> {
    let rt = runtime().map_err(|e| format!("cannot start the I/O runtime: {e}"))?;
    let store = client.store()?;
    let by_get = crate::source::signed_url::is_signed(url) && client.hub.is_none();
    let (key, client) = (key.clone(), client.clone());
    rt.block_on(async move {
        let pinned = match store.head(&key).await {
            // A web server without HEAD: its first byte says the same.
            Err(e) if head_not_allowed(&e) => first_byte(&*store, &key).await.map(|m| (m, true)),
            other => other.map(|m| (m, by_get)),
        };
        match pinned {
            Ok(p) => Ok(p),
            Err(e) => Err(client.naming_redirect(fetch_error(&e)).await),
        }
    })
    .map_err(|e| e.message().to_string())
}

/// What the cache file is named from: the object's URL (a signed URL's
/// without its signature) and the server it came from.
fn cache_identity(client: &Client, url: &url::Url, label: &str) -> String {
    let identity = match crate::source::signed_url::is_signed(url) {
        true => crate::source::signed_url::identity(url),
        false => label.to_string(),
    };
    match client.endpoint() {
        Some(server) => format!("{identity} from {server}"),
        None => identity,
    }
}

/// What a HEAD would say of the object at `key`, from a GET of its first
/// byte: its size (from Content-Range) and validators.
async fn first_byte(
    store: &dyn ObjectStore,
    key: &Key,
) -> std::result::Result<object_store::ObjectMeta, object_store::Error> {
    let opts = GetOptions {
        range: Some(GetRange::Bounded(0..1)),
        ..Default::default()
    };
    match store.get_opts(key, opts).await {
        // A server that ignores Range too: its 200's headers pin it (the
        // body is not read; reads fetch the object whole).
        Err(object_store::Error::NotSupported { .. }) => store
            .get_opts(key, GetOptions::default())
            .await
            .map(|got| got.meta),
        got => got.map(|got| got.meta),
    }
}
