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
use object_store::{GetOptions, GetRange, GetResult, GetResultPayload, ObjectMeta};
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

/// One URL, asked as given (see the module's comment).
#[derive(Debug)]
pub(super) struct SignedUrl {
    url: url::Url,
    client: reqwest::Client,
    opts: Options,
}

impl std::fmt::Display for SignedUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SignedUrl({})", without_queries(self.url.as_str()))
    }
}

fn fail(kind: FetchKind, msg: impl Into<String>) -> object_store::Error {
    http::store_error(STORE, Failure::new(kind, msg))
}

impl SignedUrl {
    pub(super) fn new(url: url::Url, opts: &Options) -> Result<SignedUrl, String> {
        Ok(SignedUrl {
            url,
            client: http::client(opts, true)?,
            opts: opts.clone(),
        })
    }

    fn host(&self) -> &str {
        self.url.host_str().unwrap_or("?")
    }

    /// A GET of `range` (all of it if none), with `If-Match` if given.
    async fn get(
        &self,
        key: &Key,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> object_store::Result<GetResult> {
        let label = without_queries(self.url.as_str());
        let r = http::send(&self.opts, (&label, Who::Server(self.host())), || {
            let mut b = self
                .client
                .get(self.url.clone())
                .header("Accept-Encoding", "identity");
            if let Some(r) = &range {
                b = b.header("Range", format!("bytes={}-{}", r.start, r.end - 1));
            }
            if let Some(tag) = if_match {
                b = b.header("If-Match", tag);
            }
            b
        })
        .await
        .map_err(|f| http::store_error(STORE, f))?;
        let (bytes, size) = self.extent(&r, range.is_some())?;
        let h = r.headers();
        let last_modified = header(h, "last-modified")
            .and_then(|t| chrono::DateTime::parse_from_rfc2822(t).ok())
            .map(|t| t.to_utc())
            .unwrap_or(chrono::DateTime::UNIX_EPOCH);
        let meta = ObjectMeta {
            location: key.clone(),
            last_modified,
            size,
            e_tag: header(h, "etag").map(str::to_string),
            version: None,
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(http::body(STORE, r)),
            meta,
            range: bytes,
            attributes: Default::default(),
            extensions: Default::default(),
        })
    }

    /// The bytes an answer carries and the object's size, or why there
    /// are none.
    fn extent(
        &self,
        r: &reqwest::Response,
        ranged: bool,
    ) -> object_store::Result<(Range<u64>, u64)> {
        let status = r.status();
        let h = r.headers();
        let length = || header(h, "content-length").and_then(|l| l.parse::<u64>().ok());
        match status {
            StatusCode::PARTIAL_CONTENT => {
                let cr = header(h, "content-range").unwrap_or("");
                http::parse_content_range(cr).ok_or_else(|| {
                    fail(
                        FetchKind::Failed,
                        format!("a 206 with Content-Range {cr:?}"),
                    )
                })
            }
            StatusCode::OK if ranged => Err(object_store::Error::NotSupported {
                source: "the server ignored the Range request".into(),
            }),
            StatusCode::OK => length()
                .map(|n| (0..n, n))
                .ok_or_else(|| fail(FetchKind::Failed, "a 200 without Content-Length")),
            // The first byte of an empty object.
            StatusCode::RANGE_NOT_SATISFIABLE
                if header(h, "content-range") == Some("bytes */0") =>
            {
                Ok((0..0, 0))
            }
            StatusCode::PRECONDITION_FAILED => {
                Err(fail(FetchKind::Changed, "the object changed (412)"))
            }
            StatusCode::NOT_FOUND => Err(fail(
                FetchKind::Changed,
                format!("{} answered 404: no such object", Who::Server(self.host())),
            )),
            StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => Err(fail(
                FetchKind::Denied,
                format!(
                    "{} refused the URL ({status}): its signature may have expired; mount a \
                     freshly signed URL",
                    Who::Server(self.host())
                ),
            )),
            s => Err(fail(
                FetchKind::Failed,
                format!("{} answered {s}", Who::Server(self.host())),
            )),
        }
    }
}

#[async_trait]
impl http::Reader for SignedUrl {
    const NAME: &'static str = STORE;

    async fn get_opts(&self, key: &Key, o: GetOptions) -> object_store::Result<GetResult> {
        if o.head {
            // Signed for GET alone: its first byte says what HEAD would.
            let mut first = self.get(key, Some(0..1), None).await?;
            first.payload = GetResultPayload::Stream(Box::pin(futures_util::stream::empty()));
            first.range = 0..first.meta.size;
            return Ok(first);
        }
        let range = match o.range {
            Some(GetRange::Bounded(r)) => Some(r),
            None => None,
            Some(_) => {
                return Err(object_store::Error::NotImplemented {
                    operation: "get with an open range".into(),
                    implementer: STORE.into(),
                });
            }
        };
        self.get(key, range, o.if_match.as_deref()).await
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
}
