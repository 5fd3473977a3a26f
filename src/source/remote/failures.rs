//! A client's or server's failure as the one line a user reads, and the
//! kind of failure it is (an object that changed, a refusal, a TLS
//! certificate).

use object_store::GetResult;

use crate::source::error::{FetchError, FetchKind};

use super::one_line;

/// Whether a HEAD failed for want of the method (405), which object_store
/// reports as no such object. Its status is only in the words of a cause
/// (the error type that holds it is private to object_store): its wording
/// in object_store 0.14, which `a_server_without_head_is_asked_for_the_first_byte`
/// in tests/remote.rs checks.
pub(super) fn head_not_allowed(e: &object_store::Error) -> bool {
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

/// Refuses an answer whose body is encoded (`Content-Encoding: gzip`, a
/// server or CDN that compresses what it sends whether asked or not):
/// this client asks for and decodes none, and its bytes are not the
/// object's.
pub(super) fn not_encoded(got: &GetResult, what: &str) -> std::result::Result<(), FetchError> {
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

/// A failed GET as a fetch error: its kind from what the store said (its
/// variant, or the kind a cause carries: the HTTP client's timeout, the
/// Hub's own failures), its line from [`describe`].
pub(super) fn fetch_error(e: &object_store::Error) -> FetchError {
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
pub(super) fn cause_kind(e: &(dyn std::error::Error + 'static)) -> Option<FetchKind> {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<HttpError>()
            && h.kind() == HttpErrorKind::Timeout
        {
            return Some(FetchKind::TimedOut);
        }
        cur = err.source();
    }
    failure_in(e).map(|f| f.kind)
}

/// The first of `e`'s causes that is a [`Failure`](crate::source::http::Failure).
fn failure_in<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a crate::source::http::Failure> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(f) = err.downcast_ref::<crate::source::http::Failure>() {
            return Some(f);
        }
        cur = err.source();
    }
    None
}

/// One line for a failed HEAD or GET.
pub(super) fn describe(e: &object_store::Error) -> String {
    if let Some(tls) = tls_failure(e) {
        return tls;
    }
    // The mount's own words, wherever the client put them (a redirect
    // its policy refused is a cause of the request's error).
    if let Some(f) = failure_in(e) {
        return one_line(f);
    }
    match e {
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
            crate::source::http::CHUNKED.into()
        }
        // "Generic HTTP error: " says nothing its cause does not.
        object_store::Error::Generic { source, .. } if !source.to_string().is_empty() => {
            one_line(with_causes(source.as_ref()))
        }
        other => one_line(with_causes(other)),
    }
}

/// An error's message followed by those of its causes that it does not
/// already carry ("error sending request" says little without the
/// connection's own words).
pub(super) fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
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
pub(super) fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
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
