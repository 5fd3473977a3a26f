//! A remote object (`s3://`, `gs://`, `az://`, `http(s)://`) served as a
//! mapped file. At open the object is pinned (HEAD: size, ETag, version)
//! and backed by a sparse file in the cache directory, named from the URL
//! and the pin, with a bitmap of the blocks present saved beside it. Blocks
//! are fetched on demand with ranged GETs pinned to that ETag/version
//! (`If-Match`): an object that changed fails the read, it never mixes old
//! and new bytes. A fetched block is written into the file and only then
//! marked present, so the mapping (and every zero-copy path over it) holds
//! the object's bytes wherever [`Backing::ensure`] said yes; the file lives
//! in the page cache, so memory stays bounded, and a remount with the same
//! ETag finds its blocks there.
//!
//! The clients are `object_store`'s (credentials and endpoints from the
//! usual environment, retries with backoff, timeouts); they are async, and
//! run on a small tokio runtime of this module's own. Readers wait on a
//! block's flight (one request per cold block, however many wait for it).

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt};

use super::error::{FetchError, FetchKind};
use super::shared::Live;
use super::sums::{Summing, Sums};
use super::{Backing, MappedFile};
use crate::error::{Error, ErrorKind, Result};

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
/// [`Backing::check_present`]).
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

/// How to reach one bucket (or HTTP server); the store itself is made per
/// process, as its connections belong to the runtime.
struct Client {
    url: url::Url,
    opts: Options,
    store: super::shared::PerProcess<Arc<dyn ObjectStore>>,
    /// For a Hugging Face Hub file: the repo and commit its store reads.
    hub: Option<Arc<super::hub::Repo>>,
    /// Where the server redirects the object, asked once after a failure
    /// ([`Client::redirect_of`]).
    redirect: tokio::sync::OnceCell<Option<String>>,
    /// The server the store's builder was given, where it is not the
    /// store's own (`--endpoint`, `AWS_ENDPOINT_URL`, an emulator's):
    /// objects of one name and ETag on two servers are two objects.
    endpoint: std::sync::OnceLock<Option<String>>,
}

/// The settings a store's builder takes from the environment's variables
/// whose names start with `prefix` (but those in `skip`), as
/// `object_store`'s `from_env` reads them, but an empty one left out (it
/// counts as unset) and one holding a control character refused (no HTTP
/// header can carry it; the signer would panic on it).
fn env_config<K: std::str::FromStr>(
    prefix: &str,
    skip: &[&str],
) -> std::result::Result<Vec<(K, String)>, String> {
    let mut out = Vec::new();
    for (k, v) in std::env::vars_os() {
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            continue;
        };
        if !k.starts_with(prefix) || v.is_empty() || skip.contains(&k) {
            continue;
        }
        if v.chars().any(|c| c.is_control() && c != '\t') {
            return Err(format!("{k} holds a control character"));
        }
        if let Ok(key) = k.to_ascii_lowercase().parse::<K>() {
            out.push((key, v.to_string()));
        }
    }
    Ok(out)
}

/// Whether any of the environment variables `names` is set to something.
fn any_set(names: &[&str]) -> bool {
    names
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

impl Client {
    /// Where the server of a plain HTTP(S) object redirects a GET of it,
    /// when it does: object_store's client follows redirects, and its
    /// errors name only the URL asked, so a failure at the target would
    /// read as the first server's. Asked once (redirects not followed),
    /// after a failure; the Hub's and signed URLs' own client names the
    /// URL it failed at itself.
    async fn redirect_of(&self) -> Option<String> {
        let plain = matches!(self.url.scheme(), "http" | "https")
            && self.hub.is_none()
            && !super::signed_url::is_signed(&self.url);
        if !plain {
            return None;
        }
        self.redirect
            .get_or_init(|| super::http::redirect_target(&self.opts, &self.url))
            .await
            .clone()
    }

    /// `why`, a failure of a request for the object, naming where the
    /// server redirects it when it does.
    async fn naming_redirect(&self, why: FetchError) -> FetchError {
        if why.kind == FetchKind::Changed {
            return why;
        }
        match self.redirect_of().await {
            Some(to) => FetchError::new(
                why.kind,
                format!("{} (the server redirects it to {to})", why.message()),
            ),
            None => why,
        }
    }

    fn store(&self) -> std::result::Result<Arc<dyn ObjectStore>, String> {
        self.store.get(|| match &self.hub {
            Some(repo) => repo.store(),
            None => self.build(),
        })
    }

    fn build(&self) -> std::result::Result<Arc<dyn ObjectStore>, String> {
        use object_store::{BackoffConfig, Certificate, ClientOptions, RetryConfig};
        let o = &self.opts;
        let mut client = ClientOptions::new()
            .with_timeout(o.timeout)
            .with_connect_timeout(o.timeout.min(Duration::from_secs(10)))
            .with_allow_http(true);
        // Trusted besides the system's store (which, like curl's and
        // Python's, is SSL_CERT_FILE / SSL_CERT_DIR when either is set).
        if let Some(path) = &o.ca_file {
            let pem =
                std::fs::read(path).map_err(|e| format!("--ca-file {}: {e}", path.display()))?;
            let certs = Certificate::from_pem_bundle(&pem).map_err(|e| {
                format!(
                    "--ca-file {}: not PEM certificates: {}",
                    path.display(),
                    one_line(e)
                )
            })?;
            if certs.is_empty() {
                return Err(format!(
                    "--ca-file {}: holds no PEM certificate",
                    path.display()
                ));
            }
            for c in certs {
                client = client.with_root_certificate(c);
            }
        }
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: FIRST_BACKOFF,
                max_backoff: MAX_BACKOFF,
                base: 2.0,
            },
            max_retries: o.retries,
            retry_timeout: (o.timeout * (o.retries as u32 + 1)).min(Duration::from_secs(300)),
        };
        let url = self.url.as_str();
        let scheme = self.url.scheme().to_ascii_lowercase();
        Ok(match scheme.as_str() {
            "s3" | "s3a" => {
                use object_store::aws::AmazonS3ConfigKey::{Endpoint, S3Endpoint};
                let b = s3_builder(o.endpoint.as_deref())?
                    .with_url(url)
                    .with_client_options(client)
                    .with_retry(retry);
                // The client asks AWS_ENDPOINT_URL_S3's server before the
                // generic one.
                let server = b.get_config_value(&S3Endpoint);
                self.served_by(server.or_else(|| b.get_config_value(&Endpoint)));
                Arc::new(b.build().map_err(one_line)?)
            }
            "gs" => {
                let mut b = env_config("GOOGLE_", &[])?
                    .into_iter()
                    .fold(
                        object_store::gcp::GoogleCloudStorageBuilder::new(),
                        |b, (k, v)| b.with_config(k, v),
                    )
                    .with_url(url)
                    .with_client_options(client)
                    .with_retry(retry);
                // A GCS-compatible server (an emulator): its base URL.
                if let Some(e) = &o.endpoint {
                    b = b.with_base_url(e.trim_end_matches('/'));
                }
                if !any_set(&[
                    "GOOGLE_SERVICE_ACCOUNT",
                    "GOOGLE_SERVICE_ACCOUNT_PATH",
                    "GOOGLE_SERVICE_ACCOUNT_KEY",
                    "GOOGLE_APPLICATION_CREDENTIALS",
                ]) {
                    b = b.with_skip_signature(true);
                }
                use object_store::gcp::GoogleConfigKey::BaseUrl;
                self.served_by(b.get_config_value(&BaseUrl));
                Arc::new(b.build().map_err(one_line)?)
            }
            "http" | "https" if super::signed_url::is_signed(&self.url) => {
                Arc::new(super::http::ReadOnly(super::signed_url::SignedUrl::new(
                    self.url.clone(),
                    key_of(&self.url)?,
                    o,
                )?))
            }
            "http" | "https" => {
                let base = &self.url[..url::Position::BeforePath];
                Arc::new(
                    object_store::http::HttpBuilder::new()
                        .with_url(base)
                        .with_client_options(client)
                        .with_retry(retry)
                        .build()
                        .map_err(one_line)?,
                )
            }
            _ => {
                let mut b = env_config("AZURE_", &[])?
                    .into_iter()
                    .fold(
                        object_store::azure::MicrosoftAzureBuilder::new(),
                        |b, (k, v)| b.with_config(k, v),
                    )
                    .with_url(url)
                    .with_client_options(client)
                    .with_retry(retry);
                if let Some(e) = &o.endpoint {
                    b = b.with_endpoint(e.clone()).with_allow_http(true);
                }
                if !any_set(&[
                    "AZURE_STORAGE_ACCOUNT_KEY",
                    "AZURE_STORAGE_ACCESS_KEY",
                    "AZURE_STORAGE_MASTER_KEY",
                    "AZURE_STORAGE_SAS_KEY",
                    "AZURE_STORAGE_SAS_TOKEN",
                    "AZURE_STORAGE_TOKEN",
                    "AZURE_STORAGE_CLIENT_SECRET",
                    "AZURE_CLIENT_SECRET",
                    "AZURE_STORAGE_USE_EMULATOR",
                ]) {
                    b = b.with_skip_signature(true);
                }
                use object_store::azure::AzureConfigKey::{Endpoint, UseEmulator};
                let emulator = b.get_config_value(&UseEmulator).filter(|v| {
                    ["1", "true", "yes", "on"].contains(&v.trim().to_ascii_lowercase().as_str())
                });
                self.served_by(
                    b.get_config_value(&Endpoint)
                        .or(emulator.map(|_| "emulator".into())),
                );
                Arc::new(b.build().map_err(one_line)?)
            }
        })
    }

    /// Notes the server the store's builder was given (see
    /// [`Client::endpoint`]).
    fn served_by(&self, server: Option<String>) {
        let _ = self.endpoint.set(server.filter(|s| !s.is_empty()));
    }

    /// The server that holds the object where it is not the one its name
    /// says (a Hub mirror, `--endpoint`), for the cache to tell objects of
    /// one name and ETag on two servers apart.
    fn endpoint(&self) -> Option<String> {
        match &self.hub {
            Some(repo) => repo.mirror(),
            None => self.endpoint.get().cloned().flatten(),
        }
    }
}

/// The variables that give an S3 client its keys.
const AWS_KEYS: [&str; 4] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_TOKEN",
];

/// An S3 client's settings: the environment's `AWS_*` variables (as
/// `object_store`'s `from_env` reads them, but empty ones left out), else
/// the AWS CLI's files' (`aws_profile`), `--endpoint` before either. Keys
/// come whole from one place: the environment's when it names them, else
/// the profile's (no token of the one with keys of the other). With keys
/// from neither, the bucket is read anonymously (never from the
/// instance-metadata service, so that a mount off the cloud does not wait
/// on one). A control character in a value is refused here, as no HTTP
/// header can carry it.
fn s3_builder(
    endpoint: Option<&str>,
) -> std::result::Result<object_store::aws::AmazonS3Builder, String> {
    use object_store::aws::AmazonS3Builder;
    let env_keys = any_set(&[
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ]);
    let files = super::aws_profile::load(&|k| std::env::var(k).ok(), !env_keys)?;
    let skip: &[&str] = if env_keys { &[] } else { &AWS_KEYS };
    let mut b = env_config("AWS_", skip)?
        .into_iter()
        .fold(AmazonS3Builder::new(), |b, (k, v)| b.with_config(k, v));
    match files.keys {
        _ if env_keys => {}
        Some(k) => {
            b = b.with_access_key_id(k.id).with_secret_access_key(k.secret);
            if let Some(t) = k.token {
                b = b.with_token(t);
            }
        }
        None => b = b.with_skip_signature(true),
    }
    if let Some(r) = files.region
        && !any_set(&["AWS_REGION", "AWS_DEFAULT_REGION"])
    {
        b = b.with_region(r);
    }
    let env_endpoint = any_set(&["AWS_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"]);
    let endpoint = endpoint
        .map(str::to_string)
        .or(files.endpoint.filter(|_| !env_endpoint));
    if let Some(e) = endpoint {
        // Also as the S3-only endpoint, which the client takes before the
        // generic one: `--endpoint` comes before AWS_ENDPOINT_URL_S3 too.
        let s3_only = object_store::aws::AmazonS3ConfigKey::S3Endpoint;
        b = b
            .with_config(s3_only, e.clone())
            .with_endpoint(e)
            .with_allow_http(true);
    }
    Ok(b)
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
        store: super::shared::PerProcess::new(),
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
    repo: Arc<super::hub::Repo>,
) -> Result<MappedFile> {
    let client = Arc::new(Client {
        url: url.clone(),
        opts: opts.clone(),
        store: super::shared::PerProcess::new(),
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
    // A signed URL's query is a credential: never in a log line or a message.
    let label = match (&client.hub, &typed) {
        (Some(repo), _) => repo.label(&url),
        (None, Some(t)) => t.label.clone(),
        (None, None) => without_queries(url.as_str()),
    };
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
    let rt = runtime().map_err(|e| fail(&label, format!("cannot start the I/O runtime: {e}")))?;
    let store = client.store().map_err(|e| fail(&label, e))?;
    // Whether the pin came from a GET's answer (a signed URL's store asks
    // no HEAD; a server without HEAD): every GET of this server then
    // carries what pinned it.
    let by_get = super::signed_url::is_signed(&url) && client.hub.is_none();
    let (meta, by_get) = {
        let (key, client) = (key.clone(), client.clone());
        rt.block_on(async move {
            let pinned = match store.head(&key).await {
                // A web server without HEAD: its first byte says the same.
                Err(e) if head_not_allowed(&e) => {
                    first_byte(&*store, &key).await.map(|m| (m, true))
                }
                other => other.map(|m| (m, by_get)),
            };
            match pinned {
                Ok(p) => Ok(p),
                Err(e) => Err(client.naming_redirect(refused(&e)).await),
            }
        })
    }
    .map_err(|e| fail(&label, e.message()))?;
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
    let identity = match super::signed_url::is_signed(&url) {
        true => super::signed_url::identity(&url),
        false => label.clone(),
    };
    let identity = match client.endpoint() {
        Some(server) => format!("{identity} from {server}"),
        None => identity,
    };
    let cache = Cache::open(opts, (&label, &identity), pin.as_deref(), meta.size)?;
    if cache.block != opts.block_size {
        log::info!(
            "{label}: its cache file holds blocks of {} bytes, so it is fetched in those, not \
             in -o block_size's {} (which applies to objects not in the cache)",
            cache.block,
            opts.block_size
        );
    }
    let words = cache.present.len();
    let present = match cache.live {
        Some(live) => Bits::Shared(live),
        None => Bits::Own(cache.present.iter().map(|&w| AtomicU64::new(w)).collect()),
    };
    let obj = Arc::new_cyclic(|me| Object {
        me: me.clone(),
        client: client.clone(),
        url: url.clone(),
        typed: typed.clone(),
        label: label.clone(),
        key,
        size: meta.size,
        etag: meta.e_tag.clone(),
        etag_on_gets: by_get && meta.e_tag.is_some(),
        version: meta.version.clone(),
        modified,
        block: cache.block,
        file: cache.file.try_clone().ok(),
        present,
        bitmap: cache.bitmap.map(Mutex::new),
        sums: cache.sums,
        key_sum: cache.key,
        checked: (0..words).map(|_| AtomicU64::new(0)).collect(),
        path: cache.path.clone(),
        flights: Mutex::new(HashMap::new()),
        broken: OnceLock::new(),
        next_seq: AtomicU64::new(u64::MAX),
        ahead_end: AtomicU64::new(u64::MAX),
        advised: AtomicU64::new(0),
        requests: Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS)),
        dirty: AtomicU64::new(0),
        committed: Mutex::new(Instant::now()),
        last_arrival: Mutex::new(Instant::now()),
        committer: AtomicU32::new(0),
        commit_failed: AtomicBool::new(false),
        whole: tokio::sync::Mutex::new(false),
    });
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
        meta.size,
        pin.as_deref().unwrap_or("nothing"),
        cache.path.display(),
        obj.blocks()
    );
    // The URL stands for its path (messages, a shard's name beside it).
    MappedFile::with_backing(Path::new(&label), label.clone(), cache.file, obj)
}

/// Whether a HEAD failed for want of the method (405), which object_store
/// reports as no such object. Its status is only in the words of a cause
/// (the error type that holds it is private to object_store): its wording
/// in object_store 0.14, which `a_server_without_head_is_asked_for_the_first_byte`
/// in tests/remote.rs checks.
fn head_not_allowed(e: &object_store::Error) -> bool {
    let object_store::Error::NotFound { source, .. } = e else {
        return false;
    };
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(err) = cur {
        if err.to_string().contains("status code: 405") {
            return true;
        }
        cur = err.source();
    }
    false
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

/// A failed GET as a fetch error: its kind from what the store said (its
/// variant, or the kind a cause carries: the HTTP client's timeout, the
/// Hub's own failures), its line from [`describe`].
/// Refuses an answer whose body is encoded (`Content-Encoding: gzip`, a
/// server or CDN that compresses what it sends whether asked or not):
/// this client asks for and decodes none, and its bytes are not the
/// object's.
fn not_encoded(got: &GetResult, what: &str) -> std::result::Result<(), FetchError> {
    match got
        .attributes
        .get(&object_store::Attribute::ContentEncoding)
    {
        Some(e) if !e.trim().eq_ignore_ascii_case("identity") => Err(FetchError::failed(format!(
            "{what}: the server sent them encoded (Content-Encoding: {}), which this \
             client neither asks for nor decodes",
            e.as_ref()
        ))),
        _ => Ok(()),
    }
}

fn refused(e: &object_store::Error) -> FetchError {
    let kind = match e {
        object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. } => {
            FetchKind::Changed
        }
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => FetchKind::Denied,
        e => cause_kind(e).unwrap_or(FetchKind::Failed),
    };
    FetchError::new(kind, describe(e))
}

/// The kind the first cause of `e` that has one says: the HTTP client
/// gave up waiting (after its retries), or a store of http.rs said why.
fn cause_kind(e: &(dyn std::error::Error + 'static)) -> Option<FetchKind> {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<HttpError>()
            && h.kind() == HttpErrorKind::Timeout
        {
            return Some(FetchKind::TimedOut);
        }
        if let Some(f) = err.downcast_ref::<super::http::Failure>() {
            return Some(f.kind);
        }
        cur = err.source();
    }
    None
}

/// One line for a failed HEAD or GET.
fn describe(e: &object_store::Error) -> String {
    if let Some(tls) = tls_failure(e) {
        return tls;
    }
    match e {
        // The stores of http.rs (the Hub, a signed URL) say what happened
        // in their own words.
        object_store::Error::Generic { source, .. } if source.is::<super::http::Failure>() => {
            one_line(source)
        }
        object_store::Error::NotFound { .. } => "no such object (or bucket)".into(),
        object_store::Error::PermissionDenied { source, .. } => {
            format!("access denied: {}", one_line(source))
        }
        object_store::Error::Unauthenticated { source, .. } => {
            format!(
                "not authenticated (check the credentials): {}",
                one_line(source)
            )
        }
        // object_store's HTTP client takes a ranged answer's length from
        // its Content-Length, which a chunked answer has not.
        other if other.to_string().contains("Content-Length Header missing") => {
            "the server sends its answers without a Content-Length (chunked), which this \
             client needs to take a range: serve the file from a server that gives it (an \
             object store, nginx, caddy)"
                .into()
        }
        other => one_line(with_causes(other)),
    }
}

/// An error's message followed by those of its causes that it does not
/// already carry ("error sending request" says little without the
/// connection's own words).
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let m = err.to_string();
        if !m.is_empty() && !text.contains(&m) {
            text.push_str(": ");
            text.push_str(&m);
        }
        cur = err.source();
    }
    text
}

/// A TLS failure somewhere in `e`'s chain of causes, named as what it is
/// (the client's own words bury it under "error sending request").
fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::CertificateError as C;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut found = None;
    while let Some(err) = cur {
        // An I/O error hides the error it wraps from `source()`.
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        if let Some(t) = err
            .downcast_ref::<rustls::Error>()
            .or_else(|| inner.and_then(|i| i.downcast_ref::<rustls::Error>()))
        {
            found = Some(t);
            break;
        }
        cur = inner.or_else(|| err.source());
    }
    const TRUST: &str = "trust its CA with --ca-file FILE (when mounting) or \
                         SSL_CERT_FILE=FILE, or add it to the system's trust store";
    Some(match found? {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => format!(
                "TLS: the server's certificate is signed by an unknown authority \
                 (self-signed or a private CA): {TRUST}"
            ),
            C::Expired | C::ExpiredContext { .. } => {
                "TLS: the server's certificate has expired".to_string()
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "TLS: the server's certificate is not valid yet (check this machine's clock)"
                    .to_string()
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                "TLS: the server's certificate is for another host name than the URL's".to_string()
            }
            C::Revoked => "TLS: the server's certificate is revoked".to_string(),
            other => format!("TLS: the server's certificate is refused: {other:?}"),
        },
        other => format!("TLS handshake failed (is the server speaking HTTPS?): {other}"),
    })
}

/// A cache file opened for an object, with its saved bitmap and the
/// bitmap shared with the other mounts that have it open.
struct Cache {
    path: PathBuf,
    file: File,
    present: Vec<u64>,
    bitmap: Option<File>,
    live: Option<Live>,
    sums: Sums,
    /// What its name is made from, as a number: seeds its blocks' sums.
    key: u64,
    /// Bytes per block: `-o block_size`, or the size of the blocks the
    /// shared cache file already holds (see [`kept_block`]).
    block: u64,
}

/// The most blocks an object's cache tracks: its table (a sum of 8 bytes
/// and two bits a block, in memory or mapped) stays within 34 MiB, and a
/// size a server made up is refused before anything is sized by it. With
/// the default 4 MiB block that is 16 TiB, past any file of weights.
const MAX_BLOCKS: u64 = 1 << 22;

const BITMAP_MAGIC: &[u8; 8] = b"ZTRBLK1\n";
/// Magic, block size, object size.
const BITMAP_HEADER: u64 = 24;

/// How long a mount waits for another to finish setting up the cache
/// file they share.
const SETUP_WAIT: Duration = Duration::from_secs(10);

/// An object's cache files: `NAME.data` (the bytes), `NAME.blocks` (the
/// durable bitmap), `NAME.live` (the bitmap every mount of it shares),
/// `NAME.sums` (each block's XXH3-64, see [`Sums`]).
struct Names {
    /// What the name is made from, as a number.
    key: u64,
    dir: PathBuf,
    name: String,
    data: PathBuf,
    blocks: PathBuf,
    live: PathBuf,
    sums: PathBuf,
}

fn flock(f: &File, op: libc::c_int) -> bool {
    // SAFETY: flock on our own descriptor.
    unsafe { libc::flock(f.as_raw_fd(), op) == 0 }
}

impl Cache {
    /// Opens the cache file of an object. Every mount of it holds a shared
    /// lock on the file while mounted (eviction takes only files no one
    /// holds); the first, alone with an exclusive lock for the while,
    /// checks and sizes the files before any other maps them.
    /// `pin` names the object's bytes (`None`: nothing does, so its file
    /// is private and not kept).
    /// The cache of the object `identity` names (its URL; of a signed URL,
    /// see [`super::signed_url::identity`]) pinned to `pin`, `size` bytes;
    /// `label` names it in messages.
    fn open(
        opts: &Options,
        (label, identity): (&str, &str),
        pin: Option<&str>,
        size: u64,
    ) -> Result<Cache> {
        let blocks = size.div_ceil(opts.block_size);
        if blocks > MAX_BLOCKS {
            return Err(fail(
                label,
                format!(
                    "the server gives its size as {size} bytes: more than the cache tracks \
                     ({MAX_BLOCKS} blocks of {} bytes, {} bytes; a larger -o block_size \
                     tracks more)",
                    opts.block_size,
                    MAX_BLOCKS.saturating_mul(opts.block_size)
                ),
            ));
        }
        let words = blocks.div_ceil(64) as usize;
        let io = |what: &str, e: std::io::Error| fail(label, format!("cache: {what}: {e}"));
        let folder = super::shared::cache_folder(&opts.cache_dir).map_err(|e| {
            io(
                &opts.cache_dir.join("ztensor-remote").display().to_string(),
                e,
            )
        })?;
        let dir = match &folder {
            Ok(dir) => dir.clone(),
            Err(_) => opts.cache_dir.join("ztensor-remote"),
        };
        let pin = pin.unwrap_or_default();
        let h = xxhash_rust::xxh3::xxh3_128(format!("{identity}\0{pin}\0{size}").as_bytes());
        let name = format!("{h:032x}");
        let n = Names {
            key: h as u64,
            data: dir.join(format!("{name}.data")),
            blocks: dir.join(format!("{name}.blocks")),
            live: dir.join(format!("{name}.live")),
            sums: dir.join(format!("{name}.sums")),
            dir,
            name,
        };
        if pin.is_empty() {
            return Self::private(opts, label, (size, words), &n, "nothing names its bytes");
        }
        if let Err(why) = &folder {
            log::warn!("{label}: the shared cache is not used: {why}");
            return Self::private(opts, label, (size, words), &n, "its folder is not trusted");
        }
        // Not through a link: a link would have the mount write elsewhere.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&n.data)
            .map_err(|e| format!("{}: {e}", n.data.display()))
            .and_then(|f| {
                super::shared::trusted_file(&f)
                    .map(|()| f)
                    .map_err(|why| format!("{}: {why}", n.data.display()))
            });
        let file = match file {
            Ok(f) => f,
            Err(why) => {
                log::warn!("{label}: the shared cache file is not used: {why}");
                return Self::private(opts, label, (size, words), &n, "it cannot be trusted");
            }
        };
        if flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            return match Self::first(opts, label, size, &n, file) {
                Ok(c) => {
                    evict(&n.dir, opts.disk_cache_size, &n.name);
                    Ok(c)
                }
                // Its bitmap or sums cannot be made (a directory in their
                // place, a folder made immutable): the bytes are fetched
                // all the same, into a file of this mount's own.
                Err(e) => {
                    log::warn!("{e}");
                    Self::private(opts, label, (size, words), &n, "its files cannot be set up")
                }
            };
        }
        // Another mount has it: wait for its setup (its exclusive lock, held
        // for moments), then share. A lock held longer is not a setup (an
        // older version held it while mounted): a private file then.
        let until = Instant::now() + SETUP_WAIT;
        while !flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
            if Instant::now() >= until {
                return Self::private(
                    opts,
                    label,
                    (size, words),
                    &n,
                    "another mount holds it alone",
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        match Self::join(opts, size, &n, file) {
            Ok(c) => {
                // Each mount brings the cache within its bound, a second
                // one of an object as the first did.
                evict(&n.dir, opts.disk_cache_size, &n.name);
                Ok(c)
            }
            Err(e) => Self::private(opts, label, (size, words), &n, &e.to_string()),
        }
    }

    /// A cache file of this mount's own (not kept), for when the shared
    /// one cannot be used.
    fn private(
        opts: &Options,
        label: &str,
        (size, words): (u64, usize),
        n: &Names,
        why: &str,
    ) -> Result<Cache> {
        let io = |what: &str, e: std::io::Error| fail(label, format!("cache: {what}: {e}"));
        log::info!(
            "{label}: cannot share its cache file with another mount ({why}); using a private one"
        );
        // In the cache directory itself: `n.dir` may be another user's.
        let file = tempfile::tempfile_in(&opts.cache_dir).map_err(|e| io("temporary file", e))?;
        file.set_len(size)
            .map_err(|e| io("sizing the cache file", e))?;
        Ok(Cache {
            path: opts.cache_dir.join("(private)"),
            file,
            present: vec![0; words],
            bitmap: None,
            live: None,
            sums: Sums::own(size.div_ceil(opts.block_size)),
            key: n.key,
            block: opts.block_size,
        })
    }

    /// Joins the mounts that have the cache file open: its size and live
    /// bitmap are theirs.
    /// Fetches in the blocks they fetch in, whatever `-o block_size`.
    fn join(opts: &Options, size: u64, n: &Names, file: File) -> std::io::Result<Cache> {
        if file.metadata()?.len() != size {
            return Err(std::io::Error::other("the cache file has another size"));
        }
        let block = super::shared::live_layout(&n.live)
            .filter(|&(block, s, _)| s == size && valid_block(block, size))
            .map_or(opts.block_size, |(block, ..)| block);
        let words = bitmap_words(size, block);
        let (live, _) = Live::open(&n.live, block, size, words, false)?;
        let present = live.iter().map(|w| w.load(Acquire)).collect();
        let bitmap = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&n.blocks)?;
        let sums = Sums::join(&n.sums, size.div_ceil(block))?;
        Ok(Cache {
            path: n.data.clone(),
            file,
            present,
            bitmap: Some(bitmap),
            live: Some(live),
            sums,
            key: n.key,
            block,
        })
    }

    /// The first mount of the cache file (no other has it open): what is
    /// present is what the live bitmap says when it is of this boot (a
    /// mount killed with SIGKILL loses nothing it had fetched), else what
    /// the durable one says; blocks that are holes are not believed.
    fn first(opts: &Options, label: &str, size: u64, n: &Names, file: File) -> Result<Cache> {
        let sized = file.metadata().is_ok_and(|m| m.len() == size);
        let block = kept_block(n, size)
            .filter(|_| sized)
            .unwrap_or(opts.block_size);
        let words = bitmap_words(size, block);
        let io = |what: &str, e: std::io::Error| fail(label, format!("cache: {what}: {e}"));
        let (live, kept) = match Live::open(&n.live, block, size, words, true) {
            Ok((l, kept)) => (Some(l), kept.filter(|_| sized)),
            Err(e) => {
                log::warn!("{label}: the cache cannot be shared with other mounts: {e}");
                (None, None)
            }
        };
        let from_live = kept.is_some();
        let saved = kept.or_else(|| load_bitmap(&n.blocks, block, size, words).filter(|_| sized));
        if saved.is_none()
            && let Some(why) = not_kept(&n.blocks, &file, block, size)
        {
            log::info!(
                "{label}: the cache file's blocks are not kept ({why}); they will be fetched again"
            );
        }
        let blocks = size.div_ceil(block);
        let sums = Sums::saved(&n.sums, blocks);
        let saved = match (saved, &sums) {
            (Some(bits), None) if bits.iter().any(|&w| w != 0) => {
                log::info!(
                    "{label}: the cache file's block sums are missing or not of its size \
                     (written by an older version, or damaged): its blocks will be fetched again"
                );
                None
            }
            (saved, _) => saved,
        };
        let kept_sums = saved.as_ref().and(sums);
        let present = match saved {
            Some(mut bits) => {
                let dropped = drop_holes(&file, &mut bits, block, size);
                if dropped > 0 {
                    log::warn!(
                        "{label}: the cache's bitmap claimed {dropped} blocks whose bytes are \
                         not on disk; they will be fetched again"
                    );
                }
                bits
            }
            None => {
                // Stale or new: start empty.
                file.set_len(0)
                    .map_err(|e| io(&format!("clearing {}", n.data.display()), e))?;
                vec![0; words]
            }
        };
        file.set_len(size)
            .map_err(|e| io(&format!("sizing {}", n.data.display()), e))?;
        if let Some(l) = &live {
            l.store(&present);
        }
        // Bits from the live bitmap may be of bytes not yet on disk: the
        // durable bitmap claims them only once they are.
        if from_live {
            file.sync_data()
                .map_err(|e| io(&format!("syncing {}", n.data.display()), e))?;
        }
        let sums = Sums::first(&n.sums, blocks, kept_sums)
            .map_err(|e| io(&n.sums.display().to_string(), e))?;
        let bitmap = write_bitmap(&n.blocks, block, size, &present)
            .map_err(|e| io(&n.blocks.display().to_string(), e))?;
        // Setup done: other mounts may join.
        flock(&file, libc::LOCK_SH);
        Ok(Cache {
            path: n.data.clone(),
            file,
            present,
            bitmap: Some(bitmap),
            live,
            sums,
            key: n.key,
            block,
        })
    }
}

/// Writes the durable bitmap at `path` (header and `words`); the file,
/// open for the commits that follow.
fn write_bitmap(path: &Path, block: u64, size: u64, words: &[u64]) -> std::io::Result<File> {
    // A new file renamed into place: a mount still holding the old one
    // (its cache file deleted since) saves its blocks there, not here.
    let tmp = super::shared::new_beside(path)?;
    let mut head = Vec::with_capacity(BITMAP_HEADER as usize);
    head.extend_from_slice(BITMAP_MAGIC);
    head.extend_from_slice(&block.to_le_bytes());
    head.extend_from_slice(&size.to_le_bytes());
    let words_bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let f = tmp.as_file();
    f.set_len(BITMAP_HEADER + words_bytes.len() as u64)?;
    f.write_all_at(&head, 0)?;
    f.write_all_at(&words_bytes, BITMAP_HEADER)?;
    tmp.persist(path).map_err(|e| e.error)
}

fn load_bitmap(path: &Path, block: u64, size: u64, words: usize) -> Option<Vec<u64>> {
    let b = super::shared::read_exact_file(path, BITMAP_HEADER + words as u64 * 8)?;
    if bitmap_layout(&b)? != (block, size) {
        return None;
    }
    let rest = b.get(BITMAP_HEADER as usize..)?;
    if rest.len() != words * 8 {
        return None;
    }
    Some(
        rest.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect(),
    )
}

/// The block size and object size a saved bitmap's header names, when it
/// is one (its magic).
fn bitmap_layout(b: &[u8]) -> Option<(u64, u64)> {
    let head = b.get(..BITMAP_HEADER as usize)?;
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
    (&head[..8] == BITMAP_MAGIC).then(|| (word(8), word(16)))
}

/// Why the blocks of a cache file that held some are not believed, when
/// neither bitmap was: its size, or the saved bitmap's layout.
fn not_kept(blocks: &Path, data: &File, block: u64, size: u64) -> Option<String> {
    let len = data.metadata().ok()?.len();
    if len == 0 {
        return None;
    }
    if len != size {
        return Some(format!(
            "the cache file is {len} bytes, not the object's {size}"
        ));
    }
    let Some(head) = super::shared::read_head::<{ BITMAP_HEADER as usize }>(blocks) else {
        return Some("its saved bitmap is missing or cannot be read".into());
    };
    match bitmap_layout(&head) {
        // Blocks of another size are fetched in that size (kept_block):
        // this bitmap claimed none.
        Some((kept, s)) if kept != block && s == size && valid_block(kept, size) => None,
        _ => Some("its saved bitmap is damaged or of another version".into()),
    }
}

/// The size of the blocks an object's cache file holds, when its live
/// bitmap (of this boot) or its saved one is of this object's size and
/// claims a block. A mount fetches that object in those blocks, whatever
/// its `-o block_size`: a remount, or a mount beside others, then fetches
/// nothing the file has. (Sums and bitmaps are per block: converting a
/// cache to another block size would read it all again to check it.)
fn kept_block(n: &Names, size: u64) -> Option<u64> {
    let live = super::shared::live_layout(&n.live);
    if let Some((block, s, any)) = live
        && s == size
        && valid_block(block, size)
    {
        return any.then_some(block);
    }
    let head = super::shared::read_head::<{ BITMAP_HEADER as usize }>(&n.blocks)?;
    let (block, s) = bitmap_layout(&head)?;
    if s != size || !valid_block(block, size) {
        return None;
    }
    load_bitmap(&n.blocks, block, size, bitmap_words(size, block))?
        .iter()
        .any(|&w| w != 0)
        .then_some(block)
}

/// Words of a bitmap of an object of `size` bytes in blocks of `block`.
fn bitmap_words(size: u64, block: u64) -> usize {
    size.div_ceil(block).div_ceil(64) as usize
}

/// Whether `-o block_size` may be `block`: a multiple of 64 KiB (so of
/// any page size) from 64 KiB to 256 MiB.
pub fn block_size_allowed(block: u64) -> bool {
    (64 << 10..=256 << 20).contains(&block) && block.is_multiple_of(64 << 10)
}

/// Whether an object of `size` bytes may be cached in blocks of `block`.
fn valid_block(block: u64, size: u64) -> bool {
    block_size_allowed(block) && size.div_ceil(block) <= MAX_BLOCKS
}

/// Deletes the least recently used cache files (not `keep`, not in use)
/// until the rest take at most `budget` bytes on disk.
fn evict(dir: &Path, budget: u64, keep: &str) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(i64, u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "data").then_some(())?;
            let m = e.metadata().ok()?;
            let used = p
                .with_extension("blocks")
                .metadata()
                .map_or(m.mtime(), |b| b.mtime());
            Some((used, m.blocks() * 512, p))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    if total <= budget {
        return;
    }
    files.sort();
    for (_, bytes, p) in files {
        if total <= budget {
            break;
        }
        if p.file_stem().is_some_and(|s| s == keep) {
            continue;
        }
        let Ok(f) = File::open(&p) else { continue };
        // SAFETY: flock on our own descriptor; a file another mount holds
        // is skipped.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        let _ = std::fs::remove_file(p.with_extension("blocks"));
        let _ = std::fs::remove_file(p.with_extension("live"));
        let _ = std::fs::remove_file(p.with_extension("sums"));
        if std::fs::remove_file(&p).is_ok() {
            log::info!(
                "remote cache: removed {} ({bytes} bytes) to stay within the disk cache size",
                p.display()
            );
            total = total.saturating_sub(bytes);
        }
    }
}

/// A request under way for some blocks; its readers wait here.
#[derive(Default)]
struct Flight {
    done: Mutex<Option<std::result::Result<(), FetchError>>>,
    cv: Condvar,
}

impl Flight {
    /// Ends the flight with `r`, unless it ended already (a block that
    /// arrived keeps its success when a later block of its request fails).
    fn finish(&self, r: std::result::Result<(), FetchError>) {
        let mut g = self.done.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(r);
        }
        drop(g);
        self.cv.notify_all();
    }

    fn wait(&self, until: Instant) -> std::result::Result<(), FetchError> {
        let mut g = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            let now = Instant::now();
            if now >= until {
                return Err(FetchError::new(
                    FetchKind::TimedOut,
                    "no answer from the server in time",
                ));
            }
            g = self
                .cv
                .wait_timeout(g, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Which blocks of a cache file are present: this process's own view (a
/// private file), or the view every mount of the file shares.
enum Bits {
    Own(Vec<AtomicU64>),
    Shared(Live),
}

impl std::ops::Deref for Bits {
    type Target = [AtomicU64];

    fn deref(&self) -> &[AtomicU64] {
        match self {
            Bits::Own(v) => v,
            Bits::Shared(l) => l,
        }
    }
}

/// A pinned remote object and its cache file.
pub struct Object {
    me: Weak<Object>,
    client: Arc<Client>,
    url: url::Url,
    /// Its URL and key as typed, for an object store's.
    typed: Option<Typed>,
    label: String,
    key: Key,
    size: u64,
    etag: Option<String>,
    /// The ETag was pinned from a GET's answer: every answer must carry it
    /// (one without it is not this object; a server whose HEAD alone gives
    /// an ETag is held to its Last-Modified instead).
    etag_on_gets: bool,
    version: Option<String>,
    /// Its Last-Modified (seconds) at mount, if the server gave one: what
    /// each answer without an ETag to compare must still say.
    modified: Option<i64>,
    block: u64,
    /// The cache file, written with pwrite.
    file: Option<File>,
    /// The blocks present in the cache file (shared with the other mounts
    /// of the object that use it).
    present: Bits,
    /// The saved bitmap (none for a private cache file).
    bitmap: Option<Mutex<File>>,
    /// Each block's XXH3-64 as fetched (shared like `present`), seeded
    /// with its number and `key_sum` (the cache file's name).
    sums: Sums,
    key_sum: u64,
    /// The blocks this process fetched, or found to match their sums:
    /// only those are read (a block present but not checked is checked
    /// first, and fetched again if it fails).
    checked: Vec<AtomicU64>,
    /// The cache file's path, for messages.
    path: PathBuf,
    flights: Mutex<HashMap<u64, Arc<Flight>>>,
    /// Why the object's bytes can no longer be served (its kind says
    /// whether because it changed).
    broken: OnceLock<FetchError>,
    /// The block after the last one a reader asked for (read-ahead).
    next_seq: AtomicU64,
    /// Where reads ahead stop (a block number; the object's end unless a
    /// reader said otherwise, see [`Backing::read_ahead_until`]).
    ahead_end: AtomicU64,
    /// The block after the last one of the cache file that the kernel was
    /// asked to read ahead for a sequential reader (see [`Object::advise`]).
    advised: AtomicU64,
    requests: Arc<tokio::sync::Semaphore>,
    /// Blocks fetched since the bitmap was last committed.
    dirty: AtomicU64,
    /// When the bitmap was last committed; held while committing.
    committed: Mutex<Instant>,
    /// When the last block arrived (see [`Object::commit_when_due`]).
    last_arrival: Mutex<Instant>,
    /// The process whose task waits to commit, or commits (one at a
    /// time; 0: none). A process id, as a fork keeps the value and none of
    /// the parent's tasks (the runtime is dropped before it).
    committer: AtomicU32,
    /// A commit failed (said once).
    commit_failed: AtomicBool,
    /// For a server that ignores Range: the one fetch of the whole object.
    /// Held while it runs; true once it succeeded.
    whole: tokio::sync::Mutex<bool>,
}

impl Object {
    fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block)
    }

    fn has(&self, b: u64) -> bool {
        self.present
            .get((b / 64) as usize)
            .is_some_and(|w| w.load(Acquire) & (1 << (b % 64)) != 0)
    }

    /// Marks `blocks` present (their bytes are in the cache file). The
    /// saved bitmap learns of them later, in [`Object::commit`], once
    /// their bytes are on disk.
    fn mark(&self, blocks: Range<u64>) {
        let n = blocks.end - blocks.start;
        for b in blocks {
            if let Some(w) = self.present.get((b / 64) as usize) {
                w.fetch_or(1 << (b % 64), Release);
            }
        }
        // After the bits: a commit that counts these sees them.
        self.dirty.fetch_add(n, SeqCst);
    }

    /// Asks the kernel to read block `b` of the cache file into the page
    /// cache (a hint: nothing waits for it).
    fn advise_block(&self, b: u64) {
        let Some(f) = &self.file else { return };
        let at = b * self.block;
        let len = ((b + 1) * self.block).min(self.size).saturating_sub(at);
        if let (Ok(at), Ok(len)) = (libc::off_t::try_from(at), libc::off_t::try_from(len)) {
            // SAFETY: posix_fadvise on our own descriptor; a hint, its
            // failure changes nothing.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), at, len, libc::POSIX_FADV_WILLNEED) };
        }
    }

    /// Whether this process fetched block `b` or has checked it.
    fn checked(&self, b: u64) -> bool {
        self.checked
            .get((b / 64) as usize)
            .is_some_and(|w| w.load(Acquire) & (1 << (b % 64)) != 0)
    }

    /// Whether block `b` is present and may be read: this process fetched
    /// it or has checked it against its sum. A block present that fails
    /// its check is marked missing (for every mount of the cache file),
    /// to be fetched again.
    fn usable(&self, b: u64) -> bool {
        if !self.has(b) {
            return false;
        }
        if self.checked(b) {
            return true;
        }
        let (start, end) = (b * self.block, ((b + 1) * self.block).min(self.size));
        let why = match (&self.file, self.sums.get(b)) {
            (Some(f), Some(sum)) => {
                match super::sums::holds(f, self.key_sum, (b, self.block, self.size), sum) {
                    Ok(true) => {
                        self.set_checked(b);
                        return true;
                    }
                    Ok(false) => "its bytes do not match their sum as fetched (XXH3)".to_string(),
                    Err(e) => format!("cannot read it: {e}"),
                }
            }
            _ => "no file or sum to check it against".to_string(),
        };
        log::warn!(
            "{}: bytes {start}..{end} of the cache file {}: {why}; fetching them again",
            self.label,
            self.path.display()
        );
        BAD_BLOCKS.fetch_add(1, Relaxed);
        if let Some(w) = self.present.get((b / 64) as usize) {
            w.fetch_and(!(1 << (b % 64)), Release);
        }
        false
    }

    /// Marks `blocks` missing (for every mount of the cache file), and
    /// not checked: an answer whose bytes turned out not to be those
    /// asked for.
    fn unmark(&self, blocks: Range<u64>) {
        for b in blocks {
            let bit = !(1u64 << (b % 64));
            if let Some(w) = self.present.get((b / 64) as usize) {
                w.fetch_and(bit, Release);
            }
            if let Some(w) = self.checked.get((b / 64) as usize) {
                w.fetch_and(bit, Release);
            }
        }
    }

    fn set_checked(&self, b: u64) {
        if let Some(w) = self.checked.get((b / 64) as usize) {
            w.fetch_or(1 << (b % 64), Release);
        }
    }

    /// Block `b`'s bytes are all in the cache file, hashing to `sum`:
    /// marks it present and lets its readers go on, while the rest of its
    /// request is under way.
    fn arrived(&self, b: u64, sum: u64) {
        self.fetched(b, sum);
        self.mark(b..b + 1);
        self.to_commit();
        let f = self
            .flights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&b);
        if let Some(f) = f {
            f.finish(Ok(()));
        }
    }

    /// Records the sum of block `b`, just written by this process, before
    /// it is marked present.
    fn fetched(&self, b: u64, sum: u64) {
        self.sums.set(b, sum);
        self.set_checked(b);
    }

    /// Blocks just marked present: the saved bitmap is to learn of them,
    /// by the one committer task of this object, started here if none is.
    /// The committer and `dirty` are read and written in one order
    /// (`SeqCst`) here, in [`Object::mark`] and in the task: an arrival
    /// that finds the task there is seen by it before it ends.
    fn to_commit(&self) {
        if self.bitmap.is_none() || self.file.is_none() {
            return;
        }
        *self.last_arrival.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let pid = std::process::id();
        let now = self.committer.load(SeqCst);
        if now == pid
            || self
                .committer
                .compare_exchange(now, pid, SeqCst, SeqCst)
                .is_err()
        {
            return;
        }
        match runtime() {
            Ok(rt) => drop(rt.spawn(Object::commit_when_due(self.me.clone(), pid))),
            Err(e) => {
                log::debug!("{}: no runtime to commit on: {e}", self.label);
                self.committer.store(0, SeqCst);
            }
        }
    }

    /// When the next commit is due: once fetching paused for
    /// [`COMMIT_QUIET`], or [`COMMIT_EVERY`] after the last while it goes
    /// on.
    fn commit_at(&self) -> Instant {
        let quiet = *self.last_arrival.lock().unwrap_or_else(|p| p.into_inner()) + COMMIT_QUIET;
        let every = *self.committed.lock().unwrap_or_else(|p| p.into_inner()) + COMMIT_EVERY;
        quiet.min(every)
    }

    /// Waits until a commit is due, commits (its fdatasync on a blocking
    /// thread), and goes on while blocks arrived meanwhile. Not under
    /// every few blocks of a read that fetches: each fdatasync made the
    /// kernel write the cache file out under the writes of the fetch, and
    /// halved a cold read on a disk slower than the network (BENCHMARKS.md,
    /// "Remote reads").
    /// It holds the object only to commit: one no longer used is dropped
    /// (and commits then) without waiting for it.
    async fn commit_when_due(me: Weak<Object>, pid: u32) {
        loop {
            let Some(at) = me.upgrade().map(|o| o.commit_at()) else {
                return;
            };
            if Instant::now() < at {
                tokio::time::sleep_until(at.into()).await;
                continue;
            }
            let Some(o) = me.upgrade() else { return };
            let saved = tokio::task::spawn_blocking({
                let o = o.clone();
                move || o.commit()
            })
            .await;
            if !saved.unwrap_or(false) {
                // Logged; tried again after a while (a disk error may
                // pass), not at once.
                drop(o);
                tokio::time::sleep(COMMIT_EVERY).await;
                continue;
            }
            o.committer.store(0, SeqCst);
            // Blocks that arrived during the commit found the task still
            // there: it goes on for them, unless another took over.
            if o.dirty.load(SeqCst) == 0
                || o.committer
                    .compare_exchange(0, pid, SeqCst, SeqCst)
                    .is_err()
            {
                return;
            }
        }
    }

    /// Saves the bitmap of the blocks present, after their bytes reached
    /// the disk (see [`commit`]).
    /// True when it saved them.
    fn commit(&self) -> bool {
        let Some(bm) = &self.bitmap else { return false };
        let Some(data) = &self.file else { return false };
        let mut at = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        // Taken before the data is synced: every bit in it is of a block
        // whose bytes were written before the sync.
        let dirty = self.dirty.load(Acquire);
        let words: Vec<u64> = self.present.iter().map(|w| w.load(Acquire)).collect();
        let bits = bm.lock().unwrap_or_else(|p| p.into_inner());
        let files = Files {
            data,
            sums: &self.sums,
            bits: &bits,
        };
        let saved = match commit(&files, &words) {
            Ok(()) => {
                self.dirty.fetch_sub(dirty, Relaxed);
                true
            }
            Err(e) => {
                // Tried again every 30 s: said once, then in the debug log.
                let level = match self.commit_failed.swap(true, Relaxed) {
                    false => log::Level::Warn,
                    true => log::Level::Debug,
                };
                log::log!(
                    level,
                    "{}: cannot save the cache's block bitmap (the blocks will be fetched again \
                     after a restart): {e}",
                    self.label
                );
                false
            }
        };
        *at = Instant::now();
        saved
    }

    /// How long a reader waits for a flight before giving up: every retry
    /// at its time limit, with backoff, and a margin.
    fn patience(&self) -> Duration {
        let o = &self.client.opts;
        o.timeout * (o.retries as u32 + 2) + Duration::from_secs(5 * (o.retries as u64 + 1))
    }

    /// Starts requests for `blocks` (each led by this call: its flights are
    /// in the map), split into `pieces` requests.
    fn launch(&self, run: Range<u64>, pieces: u64, flights: Vec<Arc<Flight>>) {
        let n = run.end - run.start;
        let pieces = pieces.clamp(1, n.max(1));
        let per = n.div_ceil(pieces);
        let mut at = run.start;
        let mut fl = flights.into_iter();
        // This process's runtime (a daemon forks after open).
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(e) => {
                // Its readers add the label (see `Object::ensure_once`).
                let why = FetchError::failed(format!("cannot start the I/O runtime: {e}"));
                let mut map = self.flights.lock().unwrap_or_else(|p| p.into_inner());
                for b in run {
                    map.remove(&b);
                }
                for f in fl {
                    f.finish(Err(why.clone()));
                }
                return;
            }
        };
        while at < run.end {
            let end = (at + per).min(run.end);
            let mine: Vec<Arc<Flight>> = fl.by_ref().take((end - at) as usize).collect();
            let Some(me) = self.me.upgrade() else { return };
            let blocks = at..end;
            rt.spawn(async move {
                // Held until the blocks are marked present (or failed):
                // another mount of the object waits for them, then has them.
                // Each block's readers go on as soon as it arrived
                // ([`Object::arrived`]); the rest end here.
                let (r, _held) = me.fetch_locked(blocks.clone()).await;
                if let Err(why) = &r {
                    log::debug!("{}: blocks {blocks:?}: {why}", me.label);
                }
                {
                    let mut map = me.flights.lock().unwrap_or_else(|p| p.into_inner());
                    for (b, f) in blocks.zip(&mine) {
                        if map.get(&b).is_some_and(|m| Arc::ptr_eq(m, f)) {
                            map.remove(&b);
                        }
                    }
                }
                for f in mine {
                    f.finish(r.clone());
                }
            });
            at = end;
        }
    }

    /// [`Object::fetch`] under the lock of `blocks` that every mount of
    /// the cache file takes, of only those still missing once it is held
    /// (another mount may have fetched them meanwhile). The lock comes
    /// back, for the caller to hold until it has marked them present.
    async fn fetch_locked(
        &self,
        blocks: Range<u64>,
    ) -> (std::result::Result<(), FetchError>, Option<File>) {
        let Bits::Shared(live) = &self.present else {
            return (self.fetch(blocks).await, None);
        };
        let path = live.path().to_path_buf();
        let run = blocks.clone();
        // Free, as it is unless another mount fetches them: taken here, at
        // once; else waited for on a blocking thread.
        let held = match super::shared::lock_range(&path, run.clone(), false) {
            Ok(None) => {
                tokio::task::spawn_blocking(move || super::shared::lock_range(&path, run, true))
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|r| r)
            }
            got => got,
        };
        let held = match held {
            Ok(f) => f,
            // Without the lock the blocks are fetched all the same: it
            // only saves a fetch another mount makes.
            Err(e) => {
                log::debug!("{}: cannot lock blocks {blocks:?}: {e}", self.label);
                None
            }
        };
        let missing: Vec<u64> = blocks.filter(|&b| !self.has(b)).collect();
        let (Some(&first), Some(&last)) = (missing.first(), missing.last()) else {
            return (Ok(()), held);
        };
        (self.fetch(first..last + 1).await, held)
    }

    /// Fetches `blocks` into the cache file. object_store's own stores
    /// resume a body cut short themselves, within `--remote-retries`; the
    /// Hub's does not, so for it a body that fails (reset, cut, stalled)
    /// is asked for again here, from the first block it did not fill, with
    /// the same backoff as its requests.
    async fn fetch(&self, blocks: Range<u64>) -> std::result::Result<(), FetchError> {
        let tries = match self.client.hub {
            Some(_) => self.client.opts.retries + 1,
            None => 1,
        };
        let (mut from, mut attempt) = (blocks.start, 0);
        loop {
            attempt += 1;
            let mut in_body = false;
            match self.fetch_once(from..blocks.end, &mut in_body).await {
                Err(e) if in_body && attempt < tries && e.kind != FetchKind::NoSpace => {
                    log::info!("{}: {}; asking again", self.label, e.message());
                    tokio::time::sleep(backoff(attempt)).await;
                    match (from..blocks.end).find(|&b| !self.has(b)) {
                        Some(b) => from = b,
                        None => return Ok(()),
                    }
                }
                done => return done,
            }
        }
    }

    /// One GET of `blocks`; `in_body` is set once its answer was taken and
    /// its body is being read.
    async fn fetch_once(
        &self,
        blocks: Range<u64>,
        in_body: &mut bool,
    ) -> std::result::Result<(), FetchError> {
        let start = blocks.start * self.block;
        let end = (blocks.end * self.block).min(self.size);
        let what = format!("bytes {start}..{end}");
        if let Some(why) = self.broken.get() {
            return Err(why.clone());
        }
        let _permit = self
            .requests
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| FetchError::failed(format!("{what}: {e}")))?;
        let store = self.client.store().map_err(FetchError::failed)?;
        let opts = GetOptions {
            if_match: self.if_match(),
            version: self.version.clone(),
            range: Some(GetRange::Bounded(start..end)),
            ..Default::default()
        };
        REQUESTS.fetch_add(1, Relaxed);
        let got = store.get_opts(&self.key, opts).await;
        let got = match got {
            Ok(g) => g,
            // A 200 with the whole object for a ranged GET (a plain web
            // server such as `python3 -m http.server`).
            Err(object_store::Error::NotSupported { .. }) => {
                drop(_permit);
                return self.fetch_whole().await;
            }
            Err(e) => return Err(self.refused(&e, &what).await),
        };
        self.same_object(&got.meta)?;
        if got.range != (start..end) {
            return Err(FetchError::failed(format!(
                "{what}: the server sent bytes {:?}",
                got.range
            )));
        }
        not_encoded(&got, &what)?;
        let file = self.file.as_ref().ok_or_else(|| {
            FetchError::failed(format!("{what}: the cache file cannot be written"))
        })?;
        // Each piece of the body goes into the cache file as it arrives:
        // collecting the block first would cost a copy and a fresh buffer
        // per block. A block is marked present once all of it is written
        // (its readers go on then, before the rest of the request), so a
        // body cut short leaves no block believed that it did not fill.
        let mut body = got.into_stream();
        *in_body = true;
        let mut at = start;
        let mut sum = Summing::new(self.key_sum, blocks.start, self.block, self.size);
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| refused(&e).context(&what))?;
            if at + piece.len() as u64 > end {
                // Not the bytes asked for: none of what it sent is kept.
                self.unmark(blocks.clone());
                return Err(FetchError::failed(format!(
                    "{what}: the server sent more than {} bytes",
                    end - start
                )));
            }
            file.write_all_at(&piece, at).map_err(|e| {
                FetchError::write(&e, format!("{what}: cannot write the cache file: {e}"))
            })?;
            sum.feed(at, &piece, |b, crc| self.arrived(b, crc));
            at += piece.len() as u64;
            FETCHED.fetch_add(piece.len() as u64, Relaxed);
        }
        if at != end {
            return Err(FetchError::failed(format!(
                "{what}: the server sent {} bytes, not {}",
                at - start,
                end - start
            )));
        }
        Ok(())
    }

    /// The whole object, fetched once into the cache file, for a server
    /// that ignores Range requests: within [`Options::whole_max`], else
    /// one line saying what to do instead. Once it succeeded, or was
    /// refused for its size, every caller gets that outcome; a fetch that
    /// failed is tried again by the next caller.
    async fn fetch_whole(&self) -> std::result::Result<(), FetchError> {
        let mut done = self.whole.lock().await;
        if *done {
            return Ok(());
        }
        let max = self.client.opts.whole_max;
        let r = if self.size > max {
            let msg = format!(
                "the server ignores Range requests (it answers a request for part of the \
                 object with all of it), so the object would have to be fetched whole, and its \
                 {} bytes are over --index-memory ({max} bytes): serve it from a server that \
                 honours Range (an object store, nginx, caddy), raise --index-memory, or \
                 download it and mount the local copy",
                self.size
            );
            // Every later read fails the same way, at once; said once.
            let whole = format!("{}: {msg}", self.label);
            if self.broken.set(FetchError::failed(whole.clone())).is_ok() {
                log::error!("{whole}");
            }
            Err(FetchError::failed(msg))
        } else {
            log::info!(
                "{}: the server ignores Range requests; fetching all {} bytes once",
                self.label,
                self.size
            );
            let r = self.get_whole().await;
            if r.is_ok() {
                self.mark(0..self.blocks());
                self.to_commit();
            }
            r
        };
        // A failure (a full disk, a server that did not answer) is tried
        // again by the next read.
        *done = r.is_ok();
        r
    }

    /// A failed GET of `what`: an object no longer the one pinned (gone,
    /// another ETag) marks it changed for good; any other failure is this
    /// request's (naming where the server redirects it, when it does).
    async fn refused(&self, e: &object_store::Error, what: &str) -> FetchError {
        let f = refused(e);
        if f.kind == FetchKind::Changed {
            self.changed(f.message())
        } else {
            self.client.naming_redirect(f).await.context(what)
        }
    }

    async fn get_whole(&self) -> std::result::Result<(), FetchError> {
        let what = format!("all {} bytes", self.size);
        let _permit = self
            .requests
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| FetchError::failed(format!("{what}: {e}")))?;
        let store = self.client.store().map_err(FetchError::failed)?;
        let opts = GetOptions {
            if_match: self.if_match(),
            version: self.version.clone(),
            ..Default::default()
        };
        REQUESTS.fetch_add(1, Relaxed);
        let got = match store.get_opts(&self.key, opts).await {
            Ok(g) => g,
            Err(e) => return Err(self.refused(&e, &what).await),
        };
        self.same_object(&got.meta)?;
        not_encoded(&got, &what)?;
        let file = self.file.as_ref().ok_or_else(|| {
            FetchError::failed(format!("{what}: the cache file cannot be written"))
        })?;
        let mut body = got.into_stream();
        let mut at = 0u64;
        // Marked present at the end, all at once (see `fetch_whole`).
        let mut sum = Summing::new(self.key_sum, 0, self.block, self.size);
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| refused(&e).context(&what))?;
            if at + piece.len() as u64 > self.size {
                return Err(FetchError::failed(format!("{what}: the server sent more")));
            }
            file.write_all_at(&piece, at).map_err(|e| {
                FetchError::write(&e, format!("{what}: cannot write the cache file: {e}"))
            })?;
            sum.feed(at, &piece, |b, crc| self.fetched(b, crc));
            at += piece.len() as u64;
            FETCHED.fetch_add(piece.len() as u64, Relaxed);
        }
        if at != self.size {
            return Err(FetchError::failed(format!(
                "{what}: the server sent {at} bytes"
            )));
        }
        Ok(())
    }

    /// The `If-Match` of a GET: the pinned ETag, but a weak one (`W/"…"`),
    /// which never matches there (RFC 9110 compares strongly: a strict
    /// server answers 412 to every GET). Every answer's ETag is compared
    /// with the pinned one all the same ([`Object::same_object`]).
    fn if_match(&self) -> Option<String> {
        self.etag.clone().filter(|e| !e.starts_with("W/"))
    }

    /// Whether an answer is of the object pinned at mount: its size, and
    /// its ETag, or where the mount or the answer has none, its
    /// Last-Modified where both have one (a server without ETags, or
    /// without them on its ranged answers, may ignore `If-Match`).
    fn same_object(&self, meta: &object_store::ObjectMeta) -> std::result::Result<(), FetchError> {
        let moved = match (&self.etag, &meta.e_tag) {
            (Some(pinned), Some(now)) => pinned != now,
            (Some(_), None) if self.etag_on_gets => true,
            _ => {
                let now = meta.last_modified.timestamp();
                self.modified.is_some_and(|m| now != 0 && m != now)
            }
        };
        if meta.size == self.size && !moved {
            return Ok(());
        }
        let etag = meta.e_tag.as_deref().unwrap_or("none");
        let modified = match meta.last_modified.timestamp() {
            0 => String::new(),
            _ => format!(", last modified {}", meta.last_modified),
        };
        let pinned_modified = match (&self.etag, self.modified) {
            (None, Some(m)) => chrono::DateTime::from_timestamp(m, 0)
                .map_or(String::new(), |t| format!(", last modified {t}")),
            _ => String::new(),
        };
        Err(self.changed(&format!(
            "pinned at {} bytes, ETag {}{pinned_modified}; the server now says {} bytes, ETag \
             {etag}{modified}",
            self.size,
            self.etag.as_deref().unwrap_or("none"),
            meta.size
        )))
    }

    /// Marks the object changed since it was pinned (logged once).
    fn changed(&self, why: &str) -> FetchError {
        self.broken
            .get_or_init(|| {
                let msg = format!(
                    "{}: the object changed since mount ({why}); refusing to serve its bytes",
                    self.label
                );
                log::error!("{msg}");
                FetchError::new(FetchKind::Changed, msg)
            })
            .clone()
    }
}

impl Backing for Object {
    fn ensure(&self, ranges: &[(u64, u64)], index: bool) -> std::result::Result<(), FetchError> {
        match self.ensure_once(ranges, index) {
            // A reader that joined a request another started (a read-ahead
            // under a fault that has since cleared) asks once for itself.
            Err(Waited::Joined(_)) if self.broken.get().is_none() => {
                self.ensure_once(ranges, index).map_err(Waited::into_error)
            }
            r => r.map_err(Waited::into_error),
        }
    }

    fn present(&self, off: u64, len: u64) -> u64 {
        let usable = |b| self.has(b) && self.checked(b);
        present_run(usable, self.block, self.size, off, len)
    }

    fn check_present(&self) {
        let todo: Vec<u64> = (0..self.blocks())
            .filter(|&b| self.has(b) && !self.checked(b))
            .collect();
        // A remount's first open of the view waits for this, and the cache
        // file's pages are likely gone: the disk is the bound. One thread
        // asks the kernel for the blocks ahead (as `warm` does for a file
        // passed through), and several check them as they come.
        let next = AtomicUsize::new(0);
        let work = || {
            while let Some(&b) = todo.get(next.fetch_add(1, Relaxed)) {
                self.usable(b);
            }
        };
        std::thread::scope(|s| {
            if !todo.is_empty() {
                s.spawn(|| todo.iter().for_each(|&b| self.advise_block(b)));
            }
            for _ in 1..CHECKERS.min(todo.len()) {
                s.spawn(work);
            }
            work();
        });
    }

    fn broken(&self) -> Option<FetchError> {
        self.broken.get().cloned()
    }

    fn read_ahead_until(&self, end: u64) {
        self.ahead_end.store(end.div_ceil(self.block), Relaxed);
    }

    fn sibling(&self, name: &str) -> Result<MappedFile> {
        if let Some(repo) = &self.client.hub {
            return super::hub::sibling(repo, &self.url, name);
        }
        let url = sibling_url(&self.url, name)
            .ok_or_else(|| fail(&self.label, format!("sibling {name:?}: not beside it")))?;
        let typed = self.typed.as_ref().map(|t| t.sibling(name));
        open_with(self.client.clone(), url, typed)
    }
}

/// The URL of the file `name` beside the one at `url`: its last segment
/// replaced by `name` as one segment, percent-encoded. (`Url::join` would
/// read a `?` or `#` in a name as a query or fragment, and `%2e%2e` as
/// `..`: another file.)
pub(super) fn sibling_url(url: &url::Url, name: &str) -> Option<url::Url> {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    u.path_segments_mut().ok()?.pop().push(name);
    Some(u)
}

/// Why an `ensure` failed: a request it started, or one it joined.
enum Waited {
    Led(FetchError),
    Joined(FetchError),
}

impl Waited {
    fn into_error(self) -> FetchError {
        match self {
            Waited::Led(e) | Waited::Joined(e) => e,
        }
    }
}

impl Object {
    /// Asks the kernel to read the present blocks of `blocks` (those ahead
    /// of a sequential reader) from the cache file into the page cache, in
    /// the background, so that the reader finds them there rather than
    /// waiting for the disk a fault at a time. Each block is asked for
    /// once per pass of a reader.
    fn advise(&self, blocks: Range<u64>) {
        let Some(file) = &self.file else { return };
        let from = self.advised.load(Relaxed);
        // Going on from the last advice, or starting over elsewhere.
        let start = if (blocks.start..=blocks.end).contains(&from) {
            from
        } else {
            blocks.start
        };
        if start >= blocks.end {
            return;
        }
        self.advised.store(blocks.end, Relaxed);
        let mut b = start;
        while b < blocks.end {
            if !self.has(b) {
                b += 1;
                continue;
            }
            let run = b;
            while b < blocks.end && self.has(b) {
                b += 1;
            }
            let at = run * self.block;
            let len = (b * self.block).min(self.size).saturating_sub(at);
            let (Ok(at), Ok(len)) = (libc::off_t::try_from(at), libc::off_t::try_from(len)) else {
                return;
            };
            // SAFETY: posix_fadvise on our own descriptor; a hint, its
            // failure changes nothing.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), at, len, libc::POSIX_FADV_WILLNEED) };
        }
    }

    /// Fetches the missing blocks of `ranges` (joining requests under way
    /// for any of them), and starts read-ahead for a sequential reader.
    fn ensure_once(&self, ranges: &[(u64, u64)], index: bool) -> std::result::Result<(), Waited> {
        if let Some(why) = self.broken.get() {
            return Err(Waited::Led(why.clone()));
        }
        let mut wanted: Vec<u64> = Vec::new();
        for &(off, len) in ranges {
            let end = off.saturating_add(len).min(self.size);
            if off >= end {
                continue;
            }
            wanted.extend(off / self.block..end.div_ceil(self.block));
        }
        wanted.sort_unstable();
        wanted.dedup();
        // Read-ahead for a reader going on from where the last one ended
        // (or reading that block again), whether or not its own blocks are
        // here already: the blocks after them are fetched while it reads.
        let mut ahead = Vec::new();
        if !index && let (Some(&first), Some(&last)) = (wanted.first(), wanted.last()) {
            let seq = self.next_seq.swap(last + 1, Relaxed);
            if first <= seq && seq <= last + 1 {
                let until = (last + 1 + self.client.opts.read_ahead)
                    .min(self.blocks())
                    .min(self.ahead_end.load(Relaxed));
                ahead.extend((last + 1..until).filter(|&b| !self.has(b)));
                self.advise(last + 1..until);
            }
        }
        wanted.retain(|&b| !self.usable(b));
        if wanted.is_empty() && ahead.is_empty() {
            return Ok(());
        }
        let mut waits = Vec::new();
        let mut led: Vec<(u64, Arc<Flight>)> = Vec::new();
        let mut led_ahead: Vec<(u64, Arc<Flight>)> = Vec::new();
        {
            let mut map = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            for (list, mine, wait) in [(&wanted, &mut led, true), (&ahead, &mut led_ahead, false)] {
                for &b in list {
                    // Fetched while we looked.
                    if self.usable(b) {
                        continue;
                    }
                    match map.get(&b) {
                        Some(f) => {
                            if wait {
                                waits.push((f.clone(), false));
                            }
                        }
                        None => {
                            let f = Arc::new(Flight::default());
                            map.insert(b, f.clone());
                            if wait {
                                waits.push((f.clone(), true));
                            }
                            mine.push((b, f));
                        }
                    }
                }
            }
        }
        // Blocks ahead are one request each: with a store's time to first
        // byte, the requests in flight are what bounds a sequential read.
        for (list, pieces) in [
            (led, if index { 1 } else { PARALLEL }),
            (led_ahead, u64::MAX),
        ] {
            // Contiguous runs, each fetched by up to `pieces` requests.
            let mut i = 0;
            while i < list.len() {
                let mut j = i + 1;
                while j < list.len() && list[j].0 == list[j - 1].0 + 1 {
                    j += 1;
                }
                let run = list[i].0..list[j - 1].0 + 1;
                let flights = list[i..j].iter().map(|(_, f)| f.clone()).collect();
                self.launch(run, pieces, flights);
                i = j;
            }
        }
        let until = Instant::now() + self.patience();
        for (f, led) in waits {
            f.wait(until).map_err(|why| {
                // A change of the object names it already (see `changed`).
                let e = why.without_context(&self.label).context(&self.label);
                if led {
                    Waited::Led(e)
                } else {
                    Waited::Joined(e)
                }
            })?;
        }
        Ok(())
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        // What was fetched is known after a restart only once committed.
        if self.dirty.load(Relaxed) > 0 {
            self.commit();
        }
    }
}

/// GET requests sent, and bytes written into cache files, by this process.
static REQUESTS: AtomicU64 = AtomicU64::new(0);
static FETCHED: AtomicU64 = AtomicU64::new(0);
/// Blocks of cache files that failed their check, by this process.
static BAD_BLOCKS: AtomicU64 = AtomicU64::new(0);

/// What the remote objects of this process have fetched and hold, for
/// `.ztensor/stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    /// GET requests sent (retries by the client not counted apart).
    pub requests: u64,
    /// Bytes fetched into cache files.
    pub fetched_bytes: u64,
    /// Bytes of the objects open now that are in their cache files.
    pub cached_bytes: u64,
    /// Total size of the objects open now.
    pub object_bytes: u64,
    /// Blocks of cache files that failed their check and were fetched
    /// again.
    pub bad_blocks: u64,
}

pub fn counters() -> Counters {
    let live = live_objects();
    let mut c = Counters {
        requests: REQUESTS.load(Relaxed),
        fetched_bytes: FETCHED.load(Relaxed),
        bad_blocks: BAD_BLOCKS.load(Relaxed),
        ..Counters::default()
    };
    for o in live {
        c.object_bytes += o.size;
        c.cached_bytes += (0..o.blocks())
            .filter(|&b| o.has(b))
            .map(|b| ((b + 1) * o.block).min(o.size) - b * o.block)
            .sum::<u64>();
    }
    c
}

/// Every object opened in this process, for [`commit_all`].
static LIVE: Mutex<Vec<Weak<Object>>> = Mutex::new(Vec::new());

/// The objects of this process still open (the list loses the others).
fn live_objects() -> Vec<Arc<Object>> {
    let mut l = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    l.retain(|w| w.strong_count() > 0);
    l.iter().filter_map(Weak::upgrade).collect()
}

/// Starts a committer for every object with blocks the saved bitmap has
/// not learnt of: in a forked child, whose parent's committers did not
/// cross the fork (its runtime was dropped before it).
pub fn after_fork() {
    for o in live_objects() {
        if o.dirty.load(SeqCst) > 0 {
            o.to_commit();
        }
    }
}

/// Commits the bitmap of every object still open: for a process about to
/// exit, whose objects may never be dropped.
pub fn commit_all() {
    for o in live_objects() {
        if o.dirty.load(Relaxed) > 0 {
            o.commit();
        }
    }
}

/// The saved bitmap is committed once fetching paused this long, and at
/// least this often while it goes on: one fdatasync per 30 s of a long
/// fetch rather than one under every few blocks of it. A machine that
/// crashes in between loses the record of what was fetched since the last
/// commit (fetched again after the reboot), never the truth of what is
/// there; a daemon killed keeps it all (the live bitmap, in the page
/// cache).
const COMMIT_QUIET: Duration = Duration::from_secs(1);
const COMMIT_EVERY: Duration = Duration::from_secs(30);

/// What a commit does to the disk, in order.
trait Disk {
    /// The cache file's bytes and their sums, to the disk.
    fn sync_data(&self) -> std::io::Result<()>;
    /// The bitmap's words, written.
    fn write_bits(&self, bytes: &[u8]) -> std::io::Result<()>;
    /// The bitmap, to the disk.
    fn sync_bits(&self) -> std::io::Result<()>;
}

struct Files<'a> {
    data: &'a File,
    sums: &'a Sums,
    bits: &'a File,
}

impl Disk for Files<'_> {
    fn sync_data(&self) -> std::io::Result<()> {
        self.data.sync_data()?;
        self.sums.sync()
    }

    fn write_bits(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.bits.write_all_at(bytes, BITMAP_HEADER)
    }

    fn sync_bits(&self) -> std::io::Result<()> {
        self.bits.sync_data()
    }
}

/// Saves `words`, a bitmap of blocks whose bytes were written to the cache
/// file, so that no bit reaches the disk before its block's bytes: after a
/// crash (of the machine, not only of the daemon) the bitmap may lack
/// blocks that are there, never claim ones that are not. The bytes are
/// synced first (one fdatasync for every block since the last commit);
/// a failed sync writes no bit.
fn commit(disk: &impl Disk, words: &[u64]) -> std::io::Result<()> {
    disk.sync_data()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    disk.write_bits(&bytes)?;
    disk.sync_bits()
}

/// How many bytes from `off` on (at most `len`, within `size`) lie in
/// blocks of `block` bytes that `has`.
fn present_run(has: impl Fn(u64) -> bool, block: u64, size: u64, off: u64, len: u64) -> u64 {
    let end = off.saturating_add(len).min(size);
    if off >= end {
        return 0;
    }
    let first_missing = (off / block..end.div_ceil(block)).find(|&b| !has(b));
    first_missing.map_or(end, |b| (b * block).max(off)) - off
}

/// Clears from `present` each block of `file` that is not all data on
/// disk (a hole in it): what a bitmap saved by a version that did not sync
/// first, or a file system that lost the bytes, may claim. Holes are what
/// a lost write leaves in a file grown by `set_len`; a file system that
/// cannot tell holes says none, and one that stores zeros as holes costs
/// those blocks a fetch again.
fn drop_holes(file: &File, present: &mut [u64], block: u64, size: u64) -> u64 {
    let fd = file.as_raw_fd();
    let mut dropped = 0;
    for (wi, w) in present.iter_mut().enumerate() {
        let mut bits = *w;
        while bits != 0 {
            let bit = bits.trailing_zeros() as u64;
            bits &= bits - 1;
            let b = wi as u64 * 64 + bit;
            let (start, end) = (b * block, ((b + 1) * block).min(size));
            if start >= size {
                *w &= !(1 << bit);
                dropped += 1;
                continue;
            }
            let Ok(at) = libc::off_t::try_from(start) else {
                continue;
            };
            // SAFETY: lseek on our own descriptor; the offset is left
            // wherever, as every read and write here is positioned.
            let hole = unsafe { libc::lseek(fd, at, libc::SEEK_HOLE) };
            if hole >= 0 && (hole as u64) < end {
                *w &= !(1 << bit);
                dropped += 1;
            }
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn urls_in_messages_lose_their_query() {
        assert_eq!(
            without_queries(
                "error sending request for url (https://cdn.example/x/y?Expires=1&Signature=S,T): \
                 timed out; see http://a/b?c https://d/e"
            ),
            "error sending request for url (https://cdn.example/x/y?…): timed out; see \
             http://a/b?… https://d/e"
        );
        assert_eq!(without_queries("no URL?here"), "no URL?here");
        assert_eq!(
            without_queries("builder error for url (ftp://h/y?X-Amz-Signature=S): not allowed"),
            "builder error for url (ftp://h/y?…): not allowed"
        );
        assert_eq!(without_queries("a ://b?c"), "a ://b?c");
    }

    #[test]
    fn a_sibling_is_one_segment_beside_the_file() {
        let u = url::Url::parse("https://h/a/b/model.safetensors.index.json?x=1").unwrap();
        let s = |n: &str| sibling_url(&u, n).unwrap().to_string();
        assert_eq!(s("m-1.safetensors"), "https://h/a/b/m-1.safetensors");
        assert_eq!(s("m?x#y"), "https://h/a/b/m%3Fx%23y");
        assert_eq!(s("%2e%2e"), "https://h/a/b/%252e%252e");
    }

    /// Records what a commit does, failing the step named.
    struct Recorder {
        steps: RefCell<Vec<&'static str>>,
        fail: Option<&'static str>,
    }

    impl Recorder {
        fn step(&self, s: &'static str) -> std::io::Result<()> {
            self.steps.borrow_mut().push(s);
            if self.fail == Some(s) {
                return Err(std::io::Error::other("injected"));
            }
            Ok(())
        }
    }

    impl Disk for Recorder {
        fn sync_data(&self) -> std::io::Result<()> {
            self.step("sync data")
        }
        fn write_bits(&self, _: &[u8]) -> std::io::Result<()> {
            self.step("write bits")
        }
        fn sync_bits(&self) -> std::io::Result<()> {
            self.step("sync bits")
        }
    }

    #[test]
    fn a_get_error_keeps_the_kind_its_store_gave_it_and_its_words() {
        let hub = |kind| object_store::Error::Generic {
            store: super::super::hub::STORE,
            source: Box::new(super::super::http::Failure::new(kind, "no answer in time")),
        };
        let e = refused(&hub(FetchKind::TimedOut));
        assert_eq!(e.kind, FetchKind::TimedOut);
        assert_eq!(e.message(), "no answer in time");
        assert_eq!(refused(&hub(FetchKind::Denied)).kind, FetchKind::Denied);
        let denied = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "403".into(),
        };
        assert_eq!(refused(&denied).kind, FetchKind::Denied);
        let gone = object_store::Error::NotFound {
            path: "k".into(),
            source: "404".into(),
        };
        assert_eq!(refused(&gone).kind, FetchKind::Changed);
        let other = object_store::Error::Generic {
            store: "S3",
            source: "the server answered 500".into(),
        };
        assert_eq!(refused(&other).kind, FetchKind::Failed);
    }

    #[test]
    fn a_commit_syncs_the_bytes_before_any_bit_is_written() {
        let r = Recorder {
            steps: RefCell::new(Vec::new()),
            fail: None,
        };
        commit(&r, &[1]).unwrap();
        assert_eq!(*r.steps.borrow(), ["sync data", "write bits", "sync bits"]);
        let r = Recorder {
            steps: RefCell::new(Vec::new()),
            fail: Some("sync data"),
        };
        assert!(commit(&r, &[1]).is_err());
        assert_eq!(*r.steps.borrow(), ["sync data"], "a bit written unsynced");
    }

    #[test]
    fn only_the_run_of_present_blocks_from_an_offset_counts() {
        // Blocks of 10 bytes in 45: 0, 1 and 3 present.
        let has = |b: u64| [0, 1, 3].contains(&b);
        let run = |off, len| present_run(has, 10, 45, off, len);
        assert_eq!(run(0, 100), 20, "up to the missing block 2");
        assert_eq!(run(5, 10), 10);
        assert_eq!(run(15, 10), 5);
        assert_eq!(run(20, 5), 0);
        assert_eq!(
            run(30, 100),
            10,
            "block 3, then 4 (the last, short) is missing"
        );
        assert_eq!(run(45, 10), 0);
        let all = |_| true;
        assert_eq!(present_run(all, 10, 45, 31, 100), 14, "clipped to the size");
    }

    fn opts(dir: &Path) -> Options {
        Options {
            cache_dir: dir.to_path_buf(),
            block_size: 64 << 10,
            ..Options::default()
        }
    }

    #[test]
    fn a_saved_bitmap_claiming_a_block_that_is_a_hole_is_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        let size = 5 * (64 << 10) + 100;
        let o = opts(dir.path());
        let c = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
        // Blocks 0 and 2 written; the bitmap claims 0, 1, 2 and 5 (the
        // last), as one saved out of order might after a crash.
        c.file.write_all_at(&[7u8; 64 << 10], 0).unwrap();
        c.file
            .write_all_at(&[9u8; 64 << 10], 2 * (64 << 10))
            .unwrap();
        let bits = c.bitmap.as_ref().unwrap();
        bits.write_all_at(&0b100111u64.to_le_bytes(), BITMAP_HEADER)
            .unwrap();
        drop(c);
        // As after a reboot: the live bitmap is not believed (it is of
        // another boot), the saved one is read.
        let forget_live = || {
            for e in std::fs::read_dir(dir.path().join("ztensor-remote")).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "live") {
                    std::fs::remove_file(p).unwrap();
                }
            }
        };
        forget_live();
        let c = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
        assert_eq!(c.present, vec![0b101], "only the blocks with bytes");
        // And what was believed is what is saved.
        drop(c);
        forget_live();
        let c = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
        assert_eq!(c.present, vec![0b101]);
    }

    #[test]
    fn a_second_open_shares_the_first_ones_live_bitmap_and_a_reopen_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let size = 5 * (64 << 10) + 100;
        let o = opts(dir.path());
        let a = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
        let b = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
        assert_eq!(a.path, b.path, "one cache file, not a private one");
        let (la, lb) = (a.live.as_ref().unwrap(), b.live.as_ref().unwrap());
        // A block written and marked by one is present for the other.
        a.file.write_all_at(&[7u8; 64 << 10], 64 << 10).unwrap();
        la[0].fetch_or(0b10, Release);
        assert_eq!(lb[0].load(Acquire), 0b10);
        // Both gone without a commit (as after SIGKILL): the next open
        // still has the block.
        drop((a, b));
        let c = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
        assert_eq!(c.present, vec![0b10]);
    }
}
