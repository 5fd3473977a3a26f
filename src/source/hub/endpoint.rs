//! The Hub a mount asks: its endpoint (`HF_ENDPOINT`), the token sent to
//! it alone, and its refusals in one line each.

use std::path::PathBuf;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use crate::source::http::header;
use crate::source::{FetchKind, hf_cache};

/// The Hub's own address, `huggingface_hub`'s default endpoint.
pub(super) const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How to reach the Hub, from the environment `huggingface_hub` reads.
#[derive(Debug, Clone)]
pub struct Hub {
    pub(super) endpoint: url::Url,
    pub(super) token: Option<String>,
    /// Why the token file there is could not be read, for a refusal that
    /// wanted a token (a warning at mount would be lost in the background).
    unread_token: Option<String>,
    pub(super) offline: bool,
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
    match crate::source::read_small(&path, 64 << 10) {
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
    pub(super) fn from_env() -> std::result::Result<Hub, String> {
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
    pub(super) fn url<'a>(&self, segments: impl IntoIterator<Item = &'a str>) -> url::Url {
        let mut u = self.endpoint.clone();
        if let Ok(mut p) = u.path_segments_mut() {
            p.pop_if_empty().extend(segments);
        }
        u
    }

    /// Whether `u` is on the Hub's own host (the token may go there).
    pub(super) fn is_hub_host(&self, u: &url::Url) -> bool {
        u.scheme() == self.endpoint.scheme()
            && u.host_str() == self.endpoint.host_str()
            && u.port_or_known_default() == self.endpoint.port_or_known_default()
    }
}

/// A failed exchange with the Hub, as one line (the caller names the
/// repo, revision or file).
pub(super) type Fail = String;

/// The one line for an answer the Hub gives to say no: its
/// `X-Error-Code`, else the status.
pub(super) fn refusal(hub: &Hub, status: StatusCode, h: &HeaderMap, what: &str) -> String {
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

/// The kind of a refusal: credentials the Hub or the CDN will not take.
/// The kind of a refusal. The commit was resolved at mount, so a repo,
/// revision or file the Hub no longer knows is gone since (as a deleted
/// object is for a store: `Changed`), though it answers 401 for a repo it
/// hides as for one it deleted; what needs a token it will not take is
/// `Denied`.
pub(super) fn refusal_kind(status: StatusCode, h: &HeaderMap) -> FetchKind {
    match (header(h, "x-error-code"), status.as_u16()) {
        (Some("RepoNotFound" | "RevisionNotFound" | "EntryNotFound"), _) | (_, 404) => {
            FetchKind::Changed
        }
        (Some("GatedRepo"), _) | (_, 401) | (_, 403) => FetchKind::Denied,
        _ => FetchKind::Failed,
    }
}

pub(super) fn with_token(hub: &Hub, b: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    match &hub.token {
        Some(t) => b.bearer_auth(t),
        None => b,
    }
}
