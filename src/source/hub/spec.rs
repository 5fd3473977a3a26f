//! The `hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]` argument,
//! parsed into the repo, the revision and the file.

/// Whether `arg` names a Hub file (`hf://…`).
pub fn is_hub(arg: &str) -> bool {
    arg.get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("hf://"))
}

/// What `hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]` asks for.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Spec {
    /// `ORG/REPO` for a model; `datasets/ORG/REPO` or `spaces/ORG/REPO`
    /// (as the Hub's file URLs and `huggingface_hub`'s HfFileSystem name
    /// them).
    pub(super) repo: String,
    pub(super) revision: String,
    pub(super) path: Option<String>,
}

const USAGE: &str = "expected hf://[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]";

/// The repo types besides models, as a repo's name starts (`datasets/`)
/// and as the API names them (`/api/datasets/...`).
const KINDS: [&str; 2] = ["datasets", "spaces"];

/// The API's name for `repo`'s type, and its `ORG/REPO`.
pub(super) fn api_kind(repo: &str) -> (&str, &str) {
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
pub(super) fn plain_path(p: &str) -> bool {
    !p.chars().any(char::is_control) && p.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

/// Parses `arg`; `revision` is `--revision`, which must agree with an
/// `@REVISION` in the URL.
pub(super) fn parse(arg: &str, revision: Option<&str>) -> std::result::Result<Spec, String> {
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

/// `s` with its `%XX` escapes decoded (a `+` stays a `+`, as in a path).
pub(super) fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}
