//! The HTTP requests this crate makes itself rather than through an
//! `object_store` client: the Hub's ([`super::hub`]) and those of a URL
//! asked exactly as given ([`super::signed_url`]), which object_store's
//! HTTP store cannot make (it builds each URL from a base and a key, and
//! drops the query). One retry loop, one client set-up, one way to read a
//! ranged answer, and [`ReadOnly`], which makes a reader an object store.

use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, GetResult, GetResultPayload, ObjectMeta, ObjectStore};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use super::FetchKind;
use super::remote::{self, Options};

/// A failed exchange with a server: its one line, and its kind
/// (a reader's errno; `remote/failures.rs` finds it among a store error's causes).
#[derive(Debug)]
pub struct Failure {
    pub kind: FetchKind,
    msg: String,
}

impl Failure {
    pub(super) fn new(kind: FetchKind, msg: impl Into<String>) -> Failure {
        Failure {
            kind,
            msg: msg.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Failure {}

impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.msg
    }
}

/// Who a request goes to, as messages name it.
#[derive(Clone, Copy)]
pub(super) enum Who<'a> {
    /// The Hub, asked with a token or not.
    Hub { token: bool },
    /// A CDN, by its host.
    Cdn(&'a str),
    /// The server of a URL given as it is, by its host.
    Server(&'a str),
}

impl std::fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Who::Hub { .. } => f.write_str("the Hub"),
            Who::Cdn(host) => write!(f, "the CDN at {host}"),
            Who::Server(host) => write!(f, "the server at {host}"),
        }
    }
}

/// A request, retried with backoff while the answer is 429 (rate
/// limited), a 5xx, or no answer at all; any other answer is the caller's
/// to read. `what` names the file in the log.
pub(super) async fn send(
    opts: &Options,
    (what, who): (&str, Who<'_>),
    make: impl Fn() -> reqwest::RequestBuilder,
) -> std::result::Result<reqwest::Response, Failure> {
    let mut last = String::new();
    let mut late = false;
    let mut limited = 0;
    for attempt in 0..=opts.retries {
        if attempt > 0 {
            tokio::time::sleep(remote::backoff(attempt)).await;
        }
        match make().send().await {
            Ok(r) if r.status() == StatusCode::TOO_MANY_REQUESTS => {
                limited += 1;
                if limited == 1 {
                    log::warn!("{what}: rate limited by {who} (429); backing off");
                }
                last = format!("rate limited by {who} (429)");
            }
            Ok(r) if r.status().is_server_error() => {
                last = format!("{who} answered {}", r.status());
                late = false;
            }
            Ok(r) => return Ok(r),
            // A request that cannot be made (a redirect to another scheme)
            // fails the same way every time.
            Err(e) if e.is_builder() => {
                return Err(Failure::new(FetchKind::Failed, one_line_err(&e)));
            }
            Err(e) => {
                last = one_line_err(&e);
                late = e.is_timeout();
            }
        }
    }
    let kind = if late && limited == 0 {
        FetchKind::TimedOut
    } else {
        FetchKind::Failed
    };
    let msg = if limited > 0 {
        let hint = match who {
            Who::Hub { token: false } => " (a token raises the Hub's limits)",
            Who::Hub { token: true } | Who::Cdn(_) | Who::Server(_) => "",
        };
        format!(
            "{last} after {} tries; try again later{hint}",
            opts.retries + 1
        )
    } else {
        format!("{last} (after {} tries)", opts.retries + 1)
    };
    Err(Failure::new(kind, msg))
}

/// A client error as one line, any URL in it without its query.
pub(super) fn one_line_err(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s = format!("{s}: {m}");
        }
        cur = c.source();
    }
    if e.is_timeout() {
        s = format!("no answer in time ({s})");
    }
    remote::without_queries(&s.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Where a GET of `url`'s first byte is redirected (its `Location`, made
/// absolute, without its query), when the server answers with a redirect;
/// asked within 5 s, as it only names a failure.
pub(super) async fn redirect_target(opts: &Options, url: &url::Url) -> Option<String> {
    let answer = client(opts, Redirects::None)
        .ok()?
        .get(url.clone())
        .header(reqwest::header::RANGE, "bytes=0-0")
        .timeout(opts.timeout.min(Duration::from_secs(5)))
        .send()
        .await
        .ok()?;
    if !answer.status().is_redirection() {
        return None;
    }
    let to = url.join(header(answer.headers(), "location")?).ok()?;
    Some(remote::without_queries(to.as_str()))
}

/// A header's value, if it is text.
pub(super) fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Which redirects a client follows (at most 5 in a row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Redirects {
    /// None: the Hub's are read, never followed (a CDN URL is taken from
    /// `Location` and asked without the token).
    None,
    /// To any host: a signed URL carries its credential in itself.
    Any,
    /// To the same scheme, host and port only: a store that signs its
    /// requests sends credentials in headers, and reqwest drops only
    /// `Authorization` on a redirect to another host (S3's
    /// `X-Amz-Security-Token` would go there).
    SameHost,
}

/// An HTTP client for one process's requests (its connections belong to
/// the runtime of that process).
pub(super) fn client(opts: &Options, redirects: Redirects) -> Result<reqwest::Client, String> {
    builder(opts, redirects)?
        .build()
        .map_err(|e| one_line_err(&e))
}

/// [`client`]'s builder.
pub(super) fn builder(
    opts: &Options,
    redirects: Redirects,
) -> Result<reqwest::ClientBuilder, String> {
    let policy = match redirects {
        Redirects::None => reqwest::redirect::Policy::none(),
        Redirects::Any => reqwest::redirect::Policy::limited(5),
        Redirects::SameHost => reqwest::redirect::Policy::custom(same_host),
    };
    // No Referer: after a redirect it would carry the URL before it, query
    // (a signature) and all, to the next host.
    let mut b = reqwest::Client::builder()
        .redirect(policy)
        .referer(false)
        .timeout(opts.timeout)
        .connect_timeout(opts.timeout.min(Duration::from_secs(10)))
        .user_agent(concat!("ztensor-mount/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &opts.ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("--ca-file {}: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("--ca-file {}: not PEM certificates: {e}", path.display()))?;
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    Ok(b)
}

/// Follows a redirect within the first request's scheme, host and port;
/// fails one elsewhere, naming where (without its query).
fn same_host(a: reqwest::redirect::Attempt) -> reqwest::redirect::Action {
    let origin = |u: &url::Url| {
        (
            u.scheme().to_string(),
            u.host_str().map(str::to_string),
            u.port_or_known_default(),
        )
    };
    let same = a.previous().first().map(origin) == Some(origin(a.url()));
    if a.previous().len() > 5 {
        a.error("more than 5 redirects")
    } else if same {
        a.follow()
    } else {
        let to = remote::without_queries(a.url().as_str());
        a.error(Failure::new(
            FetchKind::Denied,
            format!(
                "the server redirects to {to}, another host, where the request's \
                 credentials would go: not followed"
            ),
        ))
    }
}

/// `bytes A-B/TOTAL` as (A..B+1, TOTAL).
pub(super) fn parse_content_range(s: &str) -> Option<(Range<u64>, u64)> {
    let (range, total) = s.strip_prefix("bytes ")?.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let (a, b, total): (u64, u64, u64) = (a.parse().ok()?, b.parse().ok()?, total.parse().ok()?);
    (a <= b && b < total).then_some((a..b + 1, total))
}

/// A failure as the error of the store named `store`; its kind goes with
/// it (`remote/failures.rs` finds it among the error's causes).
pub(super) fn store_error(store: &'static str, f: Failure) -> object_store::Error {
    object_store::Error::Generic {
        store,
        source: Box::new(f),
    }
}

/// The body of an answer as a GET's stream of pieces; a piece that fails
/// fails the stream with its kind (a timeout is one).
pub(super) fn body(
    store: &'static str,
    r: reqwest::Response,
) -> BoxStream<'static, object_store::Result<Bytes>> {
    Box::pin(futures_util::stream::unfold(Some(r), move |r| async move {
        let mut r = r?;
        match r.chunk().await {
            Ok(Some(b)) => Some((Ok(b), Some(r))),
            Ok(None) => None,
            Err(e) => {
                let kind = match e.is_timeout() {
                    true => FetchKind::TimedOut,
                    false => FetchKind::Failed,
                };
                let f = Failure::new(kind, one_line_err(&e));
                Some((Err(store_error(store, f)), None))
            }
        }
    }))
}

/// What a store that only reads does. [`ReadOnly`] makes it an object
/// store.
#[async_trait]
pub(super) trait Reader:
    std::fmt::Display + std::fmt::Debug + Send + Sync + 'static
{
    /// The store's name in errors.
    const NAME: &'static str;
    /// What a HEAD says of the object at `key`.
    async fn head(&self, key: &Key) -> object_store::Result<ObjectMeta>;
    /// A GET of `range` of it (all of it if none), `If-Match` if given.
    async fn get(
        &self,
        key: &Key,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> object_store::Result<GetResult>;
}

/// A GET of a non-empty `range`'s `Range` header.
pub(super) fn range_header(r: &Range<u64>) -> String {
    format!("bytes={}-{}", r.start, r.end.saturating_sub(1).max(r.start))
}

/// Why a ranged answer without a Content-Length is refused.
pub(super) const CHUNKED: &str = "the server sends its answers without a Content-Length \
     (chunked), which this client needs to take a range: serve the file from a server that \
     gives it (an object store, nginx, caddy)";

/// The bytes a successful answer carries and the object's size: a 206's
/// from its Content-Range, if it has a Content-Length; a 200 to a ranged
/// GET is a server that ignores Range (NotSupported); a 200 to a whole GET
/// is `whole` bytes. None for any other status, which the caller words.
pub(super) fn extent(
    store: &'static str,
    r: &reqwest::Response,
    ranged: bool,
    whole: Option<u64>,
) -> Option<object_store::Result<(Range<u64>, u64)>> {
    let fail = |m: String| store_error(store, Failure::new(FetchKind::Failed, m));
    Some(match r.status() {
        // Chunked, a body that breaks its framing hands over the next
        // chunk's header as data before it fails, and the blocks it
        // filled would be served and kept: one that says its length
        // cannot (HTTP/2 frames every body).
        StatusCode::PARTIAL_CONTENT
            if r.version() <= reqwest::Version::HTTP_11 && r.content_length().is_none() =>
        {
            Err(fail(CHUNKED.into()))
        }
        StatusCode::PARTIAL_CONTENT => {
            let cr = header(r.headers(), "content-range").unwrap_or("");
            parse_content_range(cr).ok_or_else(|| fail(format!("a 206 with Content-Range {cr:?}")))
        }
        StatusCode::OK if ranged => Err(object_store::Error::NotSupported {
            source: "the server ignored the Range request".into(),
        }),
        StatusCode::OK => whole
            .map(|n| (0..n, n))
            .ok_or_else(|| fail("a 200 without Content-Length".into())),
        _ => return None,
    })
}

/// A GET's answer as object_store gives it: `bytes` of the object whose
/// `meta` it carries, its body as the stream, and its `Content-Encoding`
/// (as object_store's own stores give it: `remote` refuses a body that
/// is encoded).
pub(super) fn get_result(
    store: &'static str,
    r: reqwest::Response,
    meta: ObjectMeta,
    bytes: Range<u64>,
) -> GetResult {
    let mut attributes = object_store::Attributes::new();
    if let Some(e) = r.headers().get(reqwest::header::CONTENT_ENCODING) {
        let e = String::from_utf8_lossy(e.as_bytes()).into_owned();
        attributes.insert(object_store::Attribute::ContentEncoding, e.into());
    }
    GetResult {
        payload: GetResultPayload::Stream(body(store, r)),
        meta,
        range: bytes,
        attributes,
        extensions: Default::default(),
    }
}

/// A [`Reader`] as an object store: every other operation is refused.
#[derive(Debug)]
pub(super) struct ReadOnly<R>(pub R);

impl<R: Reader> std::fmt::Display for ReadOnly<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

fn not_offered<R: Reader>(op: &str) -> object_store::Error {
    object_store::Error::NotImplemented {
        operation: op.into(),
        implementer: R::NAME.into(),
    }
}

#[async_trait]
impl<R: Reader> ObjectStore for ReadOnly<R> {
    async fn put_opts(
        &self,
        _: &Key,
        _: object_store::PutPayload,
        _: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        Err(not_offered::<R>("put"))
    }

    async fn put_multipart_opts(
        &self,
        _: &Key,
        _: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        Err(not_offered::<R>("put_multipart"))
    }

    async fn get_opts(&self, key: &Key, o: GetOptions) -> object_store::Result<GetResult> {
        if o.head {
            let meta = self.0.head(key).await?;
            return Ok(GetResult {
                payload: GetResultPayload::Stream(Box::pin(futures_util::stream::empty())),
                range: 0..meta.size,
                meta,
                attributes: Default::default(),
                extensions: Default::default(),
            });
        }
        let range = match o.range {
            Some(GetRange::Bounded(r)) => Some(r),
            None => None,
            Some(_) => return Err(not_offered::<R>("get with an open range")),
        };
        self.0.get(key, range, o.if_match.as_deref()).await
    }

    fn delete_stream(
        &self,
        _: BoxStream<'static, object_store::Result<Key>>,
    ) -> BoxStream<'static, object_store::Result<Key>> {
        Box::pin(futures_util::stream::once(async {
            Err(not_offered::<R>("delete"))
        }))
    }

    fn list(&self, _: Option<&Key>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        Box::pin(futures_util::stream::once(async {
            Err(not_offered::<R>("list"))
        }))
    }

    async fn list_with_delimiter(
        &self,
        _: Option<&Key>,
    ) -> object_store::Result<object_store::ListResult> {
        Err(not_offered::<R>("list"))
    }

    async fn copy_opts(
        &self,
        _: &Key,
        _: &Key,
        _: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        Err(not_offered::<R>("copy"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0..10, 100)));
        assert_eq!(parse_content_range("bytes 5-4/100"), None);
        assert_eq!(parse_content_range("bytes 0-100/100"), None);
        assert_eq!(parse_content_range("bytes */100"), None);
    }
}
