//! An `http(s)://` URL with a query, asked exactly as given: a presigned
//! URL (S3's `X-Amz-Signature`, GCS's `X-Goog-Signature`, an Azure SAS)
//! or any link whose query the server checks. object_store's HTTP store
//! builds each request from a base URL and a key and drops the query, so
//! the server refused every request. A presigned URL is signed for GET
//! alone (S3 answers HEAD with 403), so the object's size and validators
//! come from a GET of its first byte. Its signature cannot be renewed
//! here: once it expires, a read of bytes not yet in the cache fails
//! (EACCES) and the log says why; what is cached stays readable.

use std::ops::Range;

use async_trait::async_trait;
use object_store::path::Path as Key;
use object_store::{GetResult, ObjectMeta};
use reqwest::StatusCode;

use super::FetchKind;
use super::http::{self, Failure, Who, header};
use super::remote::{Options, without_queries};

/// The store's name in errors.
const STORE: &str = "signed URL";

/// Whether `url` is one this module asks as given: http(s) with a query.
pub(super) fn is_signed(url: &url::Url) -> bool {
    matches!(url.scheme(), "http" | "https") && url.query().is_some_and(|q| !q.is_empty())
}

/// Whether a query parameter is part of a signature rather than of what
/// names the object: S3's and GCS's (V4 and V2), and an Azure SAS's.
fn signs(name: &str) -> bool {
    const SAS: [&str; 15] = [
        "sv", "ss", "srt", "sp", "se", "st", "spr", "sig", "sr", "si", "skoid", "sktid", "skt",
        "ske", "sks",
    ];
    let lower = name.to_ascii_lowercase();
    lower.starts_with("x-amz-")
        || lower.starts_with("x-goog-")
        || ["awsaccesskeyid", "googleaccessid", "signature", "expires"].contains(&lower.as_str())
        || SAS.contains(&name)
}

/// What names the object a signed URL fetches, for its cache file: the
/// URL without the signature's parameters (which change each time it is
/// signed again), and with the others (`?id=2` is another object than
/// `?id=1`), in order.
pub(super) fn identity(url: &url::Url) -> String {
    let mut kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !signs(k))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    kept.sort();
    let mut u = url.clone();
    u.set_query(None);
    if !kept.is_empty() {
        u.query_pairs_mut().extend_pairs(kept);
    }
    u.to_string()
}

/// One URL, asked as given (see the module's comment).
pub(super) struct SignedUrl {
    url: url::Url,
    /// The key of the one object the URL signs.
    key: Key,
    client: reqwest::Client,
    opts: Options,
}

/// Without the query: it is a credential.
impl std::fmt::Display for SignedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SignedUrl({})", without_queries(self.url.as_str()))
    }
}

impl std::fmt::Debug for SignedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

fn fail(kind: FetchKind, msg: impl Into<String>) -> object_store::Error {
    http::store_error(STORE, Failure::new(kind, msg))
}

impl SignedUrl {
    pub(super) fn new(url: url::Url, key: Key, opts: &Options) -> Result<SignedUrl, String> {
        Ok(SignedUrl {
            url,
            key,
            client: http::client(opts, http::Redirects::Any)?,
            opts: opts.clone(),
        })
    }

    fn host(&self) -> &str {
        self.url.host_str().unwrap_or("?")
    }

    /// A GET of the URL, of `range` if given, with `If-Match` if given.
    /// Only the object it signs can be asked: the files beside it (a set's
    /// shards) would need signatures of their own.
    async fn send(
        &self,
        key: &Key,
        range: Option<&Range<u64>>,
        if_match: Option<&str>,
    ) -> object_store::Result<reqwest::Response> {
        if *key != self.key {
            return Err(fail(
                FetchKind::Denied,
                "a signed URL signs one object: the files beside it cannot be fetched with it \
                 (mount a sharded set from s3://, gs:// or az:// with credentials)",
            ));
        }
        let label = without_queries(self.url.as_str());
        http::send(&self.opts, (&label, Who::Server(self.host())), || {
            let mut b = self
                .client
                .get(self.url.clone())
                .header("Accept-Encoding", "identity");
            if let Some(r) = range {
                b = b.header("Range", http::range_header(r));
            }
            if let Some(tag) = if_match {
                b = b.header("If-Match", tag);
            }
            b
        })
        .await
        .map_err(|f| http::store_error(STORE, f))
    }

    /// What an answer says of the object: its size (`size`) and validators.
    fn meta(&self, key: &Key, r: &reqwest::Response, size: u64) -> ObjectMeta {
        let h = r.headers();
        ObjectMeta {
            location: key.clone(),
            last_modified: header(h, "last-modified")
                .and_then(|t| chrono::DateTime::parse_from_rfc2822(t).ok())
                .map_or(chrono::DateTime::UNIX_EPOCH, |t| t.to_utc()),
            size,
            e_tag: header(h, "etag").map(str::to_string),
            version: None,
        }
    }

    /// Why an answer that carries no bytes carries none.
    fn refusal(&self, r: &reqwest::Response) -> object_store::Error {
        let server = Who::Server(self.host());
        match r.status() {
            StatusCode::PRECONDITION_FAILED => fail(FetchKind::Changed, "the object changed (412)"),
            StatusCode::NOT_FOUND => fail(
                FetchKind::Changed,
                format!("{server} answered 404: no such object"),
            ),
            s @ (StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED) => fail(
                FetchKind::Denied,
                format!(
                    "{server} refused the URL ({s}): its signature may have expired; mount a \
                     freshly signed URL"
                ),
            ),
            s => fail(FetchKind::Failed, format!("{server} answered {s}")),
        }
    }
}

fn content_length(r: &reqwest::Response) -> Option<u64> {
    header(r.headers(), "content-length").and_then(|l| l.parse().ok())
}

#[async_trait]
impl http::Reader for SignedUrl {
    const NAME: &'static str = STORE;

    /// Signed for GET alone: the first byte's answer says what HEAD would
    /// (a 200 from a server that ignores Range, its whole length; a 416
    /// with `bytes */0`, an empty object).
    async fn head(&self, key: &Key) -> object_store::Result<ObjectMeta> {
        let r = self.send(key, Some(&(0..1)), None).await?;
        let empty = r.status() == StatusCode::RANGE_NOT_SATISFIABLE
            && header(r.headers(), "content-range") == Some("bytes */0");
        let size = match http::extent(STORE, &r, false, content_length(&r)) {
            _ if empty => 0,
            Some(got) => got?.1,
            None => return Err(self.refusal(&r)),
        };
        Ok(self.meta(key, &r, size))
    }

    async fn get(
        &self,
        key: &Key,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> object_store::Result<GetResult> {
        let r = self.send(key, range.as_ref(), if_match).await?;
        let Some(got) = http::extent(STORE, &r, range.is_some(), content_length(&r)) else {
            return Err(self.refusal(&r));
        };
        let (bytes, size) = got?;
        let meta = self.meta(key, &r, size);
        Ok(http::get_result(STORE, r, meta, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_with_a_query_are_asked_as_given() {
        let signed = |u: &str| is_signed(&url::Url::parse(u).unwrap());
        assert!(signed(
            "https://b.s3.amazonaws.com/m.safetensors?X-Amz-Signature=ab"
        ));
        assert!(signed("http://127.0.0.1:8000/m.zt?sig=1"));
        assert!(!signed("https://example.com/m.zt"));
        assert!(!signed("https://example.com/m.zt?"));
        assert!(!signed("s3://bucket/m.zt?versionId=1"));
    }

    #[test]
    fn a_cache_is_named_by_what_names_the_object_not_by_its_signature() {
        let id = |u: &str| identity(&url::Url::parse(u).unwrap());
        let s3 = "https://b.s3.amazonaws.com/m.bin?X-Amz-Algorithm=AWS4-HMAC-SHA256&\
                  X-Amz-Credential=AK%2F20261129%2Fus-east-1%2Fs3%2Faws4_request&\
                  X-Amz-Date=20261129T024215Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&\
                  X-Amz-Signature=72bc";
        assert_eq!(id(s3), "https://b.s3.amazonaws.com/m.bin");
        let sas = "https://a.blob.core.windows.net/c/m.bin?sv=2022-11-02&sr=b&sp=r&\
                   se=2026-12-01T00%3A00%3A00Z&sig=abc%3D";
        assert_eq!(id(sas), "https://a.blob.core.windows.net/c/m.bin");
        assert_eq!(
            id("http://h/get?sig=1&id=2&a=b"),
            "http://h/get?a=b&id=2",
            "the object's own parameters stay, in order"
        );
        assert_ne!(id("http://h/get?id=1&sig=x"), id("http://h/get?id=2&sig=x"));
    }
}
