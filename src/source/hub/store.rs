//! A repo's files as an object store: each file resolved to where its
//! bytes are (a signed CDN URL), pinned to the commit, fetched with
//! ranged GETs and resolved again when the signature expires.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use object_store::path::Path as Key;
use object_store::{GetResult, ObjectMeta, ObjectStore};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, LOCATION};

use super::endpoint::{DEFAULT_ENDPOINT, Hub, refusal, refusal_kind, with_token};
use super::record::{load_record, record_path, save_record};
use super::spec::percent_decode;
use crate::source::http::{Failure, Who, header, send};
use crate::source::remote::Options;
use crate::source::{FetchKind, hf_cache, http, remote};

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
    pub(super) repo: String,
    pub(super) commit: String,
    pub(super) opts: Options,
    /// Where each file's bytes are (its signed CDN URL), by path.
    locations: Mutex<HashMap<String, (url::Url, Resolved)>>,
    /// The files of the mounted file's folder at the commit (its siblings),
    /// with their sizes where known.
    pub(super) files: HashMap<String, Option<u64>>,
    /// `huggingface_hub`'s cache, where a file it downloaded is read from.
    hf_cache: Option<PathBuf>,
    /// The HTTP client every file of the repo fetches with, and the
    /// process it was made in (its connections belong to that process's
    /// runtime): one pool of connections to the Hub and the CDN for all
    /// the shards of a set, not a client (and a TLS set-up) each.
    client: crate::source::shared::PerProcess<reqwest::Client>,
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
    /// The repo `name` at `commit`, of the Hub `hub`, whose files (the
    /// mounted file's siblings) are `files`.
    pub(super) fn new(
        hub: Hub,
        (name, commit): (String, String),
        opts: &Options,
        files: HashMap<String, Option<u64>>,
    ) -> Repo {
        Repo {
            hub,
            repo: name,
            commit,
            opts: opts.clone(),
            locations: Mutex::new(HashMap::new()),
            files,
            hf_cache: hf_cache::dir(),
            client: crate::source::shared::PerProcess::new(),
            cdn_etags: Mutex::default(),
        }
    }

    /// This process's HTTP client for the repo's files, made at its first
    /// use in the process.
    fn client(&self) -> std::result::Result<reqwest::Client, String> {
        self.client
            .get(|| http::client(&self.opts, http::Redirects::None))
    }

    /// The path of the file a resolve URL names.
    pub(super) fn path_of(&self, url: &url::Url) -> Option<String> {
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

    pub(super) fn resolve_url(&self, path: &str) -> url::Url {
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
    pub(super) fn hf_cached(&self, path: &str) -> Option<PathBuf> {
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

/// The Hub as an object store of one commit: a key is a resolve URL's
/// path, `ORG/REPO/resolve/COMMIT/PATH`. Only reads are offered.
#[derive(Debug)]
struct HubStore {
    pub(super) repo: Arc<Repo>,
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

    /// The CDN that answered from `url`, named; None for the Hub itself.
    fn cdn_of(&self, url: &url::Url) -> Option<String> {
        let host = url.host_str()?;
        (!self.repo.hub.is_hub_host(url)).then(|| Who::Cdn(host).to_string())
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
            let why = match self.cdn_of(r.url()) {
                Some(cdn) => format!("{cdn} answered {s}"),
                None => refusal(&self.repo.hub, s, r.headers(), "at that commit"),
            };
            return Err(store_error(Failure::new(refusal_kind(s, r.headers()), why)));
        };
        let (bytes, total) = got?;
        if let Some(etag) = header(r.headers(), "etag") {
            self.same_cdn_etag(key, r.url(), etag)?;
        }
        // The commit's file cannot change: the servers disagree (a CDN's
        // object is named by its hash), which is no change since mount.
        if total != file.size {
            let who = self
                .cdn_of(r.url())
                .unwrap_or_else(|| "the Hub's download".into());
            return Err(store_error(Failure::new(
                FetchKind::Failed,
                format!(
                    "{who} sends the file as {total} bytes, where the Hub gives its size as {} \
                     (X-Linked-Size)",
                    file.size
                ),
            )));
        }
        Ok(http::get_result(STORE, r, self.meta(key, file), bytes))
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
