//! The repo's commit and files at a revision (`/api/models/…/revision/…`),
//! and the choice of the weights to mount when no file is named.

use std::path::Path;

use reqwest::header::LOCATION;

use super::answer::{self, Answer};
use super::endpoint::{Fail, Hub, refusal, with_token};
use super::record::load_record;
use super::spec::{Spec, api_kind, plain_path};
use crate::source::http;
use crate::source::http::{Who, header, one_line_err, send};
use crate::source::remote::Options;

/// What the Hub says of a revision: its commit and the repo's files.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct RepoInfo {
    pub(super) commit: String,
    /// Every file of the repo at that commit, with its size when known.
    pub(super) files: Vec<(String, Option<u64>)>,
}

/// Whether `s` names a commit as the Hub does (hex, at least 7 digits).
fn is_commit(s: &str) -> bool {
    s.len() >= 7 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// A revision's record as an earlier mount saved it, if it names a
/// commit (a record damaged or written by hand is not believed), less any
/// file name that is no file's path or repeats one.
pub(super) fn recorded_info(path: &Path) -> Option<RepoInfo> {
    let mut info = load_record::<RepoInfo>(path).filter(|i| is_commit(&i.commit))?;
    // Names that are no file's path are left out, as from the Hub's list.
    keep_plain_and_first(&mut info.files);
    Some(info)
}

/// The revision an answer of the API gives, its files (in the order
/// listed) less those whose name is no file's path or repeats one.
pub(super) fn parse_info(answer: Answer) -> std::result::Result<RepoInfo, Fail> {
    let commit = match answer.sha {
        Some(sha) if is_commit(&sha) => sha,
        Some(sha) => {
            let shown: String = sha.chars().take(80).collect();
            return Err(format!(
                "the Hub's answer gives as its commit (\"sha\") {shown:?}, which is not a \
                 commit's name (hex)"
            ));
        }
        None => return Err("the Hub's answer names no commit (\"sha\")".into()),
    };
    let mut files = answer.files;
    let (odd, first) = keep_plain_and_first(&mut files);
    if let Some(first) = first {
        log::warn!(
            "the Hub lists {odd} file name(s) that are not a file's path (a control \
             character, an empty, . or .. segment) or repeat an earlier one, left out: \
             first {first:?}"
        );
    }
    Ok(RepoInfo { commit, files })
}

/// Keeps in `files` each name that is a file's path, the first time it is
/// listed, in order; how many were left out, and the first of them. By a
/// sort of positions (4 bytes a file), not a set of the names.
fn keep_plain_and_first(files: &mut Vec<(String, Option<u64>)>) -> (usize, Option<String>) {
    let mut by_name: Vec<u32> = (0..files.len() as u32).collect();
    // Stable: of a name listed more than once, its first place comes first.
    by_name.sort_by(|&a, &b| files[a as usize].0.cmp(&files[b as usize].0));
    let mut keep = vec![true; files.len()];
    for w in by_name.windows(2) {
        if files[w[0] as usize].0 == files[w[1] as usize].0 {
            keep[w[1] as usize] = false;
        }
    }
    for (i, (name, _)) in files.iter().enumerate() {
        keep[i] &= plain_path(name);
    }
    let odd = keep.iter().filter(|k| !**k).count();
    let first = keep.iter().position(|k| !k).map(|i| files[i].0.clone());
    let mut i = 0;
    files.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    (odd, first)
}

/// Asks the Hub for `spec`'s revision.
pub(super) async fn fetch_info(
    hub: &Hub,
    spec: &Spec,
    opts: &Options,
) -> std::result::Result<RepoInfo, Fail> {
    let client = http::client(opts, http::Redirects::None)?;
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
    parse_info(answer::parse(&body, opts.whole_max)?)
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
pub(super) fn choose(spec: &Spec, info: &RepoInfo) -> std::result::Result<String, Fail> {
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
pub(super) fn folder_of(path: &str) -> &str {
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
