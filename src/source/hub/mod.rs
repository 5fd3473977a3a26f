//! `hf://ORG/REPO[@REVISION][/PATH]`: a file of a Hugging Face Hub repo,
//! served as a remote object (see [`super::remote`]: the same block cache,
//! pinning and fetching). This module speaks the Hub's protocol as
//! `huggingface_hub` does:
//!
//! - the endpoint is `HF_ENDPOINT` (default `https://huggingface.co`), the
//!   token `HF_TOKEN`, else the file `huggingface-cli login` writes
//!   (`HF_TOKEN_PATH`, else `$HF_HOME/token`, default
//!   `~/.cache/huggingface/token`), sent to the endpoint's host only;
//! - `GET /api/models/ORG/REPO/revision/REV?blobs=true` gives the commit
//!   the revision names and the repo's files, resolved once at mount: every
//!   byte comes from that commit;
//! - `HEAD /ORG/REPO/resolve/COMMIT/PATH` gives a file's size and ETag
//!   (`X-Linked-Size`, `X-Linked-Etag` on the redirect of a large file) and
//!   where its bytes are (`Location`, a signed URL on a CDN host); ranged
//!   GETs go there, and a 403 from it (the signature expired) resolves the
//!   file again;
//! - 429 and 5xx answers are retried with backoff.
//!
//! What a mount learned (the commit of a revision, a file's size and ETag)
//! is recorded under the cache directory, so that with `HF_HUB_OFFLINE=1`
//! a remount serves what the cache holds without asking the Hub.

use std::sync::Arc;

use serde_json::Value;

use super::MappedFile;
use super::hf_cache;
use super::remote::{self, Options};
use crate::error::{Error, ErrorKind, Result};

mod answer;
mod endpoint;
mod info;
mod record;
mod spec;
mod store;

use endpoint::Hub;
use info::{RepoInfo, choose, fetch_info, folder_of, recorded_info};
use record::{record_path, save_record};
pub use spec::is_hub;
use spec::{Spec, parse};
pub use store::{Repo, STORE};

fn fail(label: &str, why: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, label, None, why.to_string())
}

/// The commit and files of `spec`'s revision: asked of the Hub (and
/// recorded), or, offline, as recorded by an earlier mount.
fn repo_info(hub: &Hub, spec: &Spec, opts: &Options, label: &str) -> Result<RepoInfo> {
    let record = record_path(
        opts,
        "rev",
        &[hub.endpoint.as_str(), &spec.repo, &spec.revision],
    );
    if hub.offline {
        return recorded_info(&record)
            .or_else(|| offline_info(spec))
            .ok_or_else(|| {
                let why = match std::fs::symlink_metadata(&record) {
                    Ok(_) => format!(
                        "offline (HF_HUB_OFFLINE is set), the record of this revision ({}) \
                         cannot be read or is damaged, and huggingface_hub's cache does not \
                         have it",
                        record.display()
                    ),
                    Err(_) => "offline (HF_HUB_OFFLINE is set), and neither a mount with this \
                               cache directory nor huggingface_hub's cache resolved this \
                               revision before"
                        .into(),
                };
                fail(label, why)
            });
    }
    let rt =
        remote::runtime().map_err(|e| fail(label, format!("cannot start the I/O runtime: {e}")))?;
    let info = rt
        .block_on(fetch_info(hub, spec, opts))
        .map_err(|e| fail(label, e))?;
    save_record(&record, &info);
    // The commit names itself: an offline remount by the commit the log
    // and the index name finds it too.
    if spec.revision != info.commit {
        let by_commit = [hub.endpoint.as_str(), &spec.repo, &info.commit];
        save_record(&record_path(opts, "rev", &by_commit), &info);
    }
    Ok(info)
}

/// The commit and files of `spec`'s revision as `huggingface_hub`'s cache
/// knows them: its ref, and what its snapshot holds.
fn offline_info(spec: &Spec) -> Option<RepoInfo> {
    let cache = hf_cache::dir()?;
    let commit = hf_cache::commit(&cache, &spec.repo, &spec.revision)?;
    let files = hf_cache::files(&cache, &spec.repo, &commit);
    Some(RepoInfo { commit, files })
}

/// The most of a repo's other files `.ztensor/index.json` names: a
/// dataset repo may hold millions, and the list is held for as long as the
/// mount runs (within `--index-memory`, with the catalog).
const OTHER_FILES_LISTED: usize = 10_000;

/// What `.ztensor/index.json` says of a Hub file (under `attributes`).
fn describe(hub: &Hub, spec: &Spec, info: &RepoInfo, path: &str) -> Value {
    let (listed, unlisted) = other_files(info, path);
    let mut about = serde_json::json!({
        "endpoint": hub.endpoint.as_str(),
        "repo": spec.repo,
        "revision": spec.revision,
        "commit": info.commit,
        "path": path,
        "other_files": listed,
    });
    if unlisted > 0 {
        about["other_files_not_listed"] = unlisted.into();
    }
    about
}

/// The repo's files but `path`: the first [`OTHER_FILES_LISTED`], and how
/// many more there are.
fn other_files<'a>(info: &'a RepoInfo, path: &str) -> (Vec<&'a str>, usize) {
    let others = info
        .files
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != path);
    let listed: Vec<&str> = others.clone().take(OTHER_FILES_LISTED).collect();
    let unlisted = others.count() - listed.len();
    (listed, unlisted)
}

/// Opens the file of `repo` that resolve URL `url` names: read where it is
/// when `huggingface_hub` has downloaded it already (see
/// [`Repo::hf_cached`]), else fetched as a remote object.
pub(super) fn open_file(repo: &Arc<Repo>, url: url::Url) -> Result<MappedFile> {
    if let Some(local) = repo.path_of(&url).and_then(|p| repo.hf_cached(&p)) {
        let label = repo.label(&url);
        match MappedFile::open(&local) {
            Ok(f) => {
                log::info!(
                    "{label}: read from huggingface_hub's cache, {} (nothing fetched)",
                    local.display()
                );
                let siblings = Arc::new(CachedSiblings {
                    repo: repo.clone(),
                    url,
                });
                return Ok(f.relabel(label, siblings));
            }
            Err(e) => log::warn!("{label}: fetched: {e}"),
        }
    }
    remote::open_hub(url, &repo.opts, repo.clone())
}

/// The siblings of a file read from `huggingface_hub`'s cache: each read
/// from there too where it is, else fetched.
struct CachedSiblings {
    repo: Arc<Repo>,
    url: url::Url,
}

impl super::Siblings for CachedSiblings {
    fn sibling(&self, name: &str) -> Result<MappedFile> {
        sibling(&self.repo, &self.url, name)
    }
}

/// Opens the file `name` beside the one at resolve URL `url` of `repo`:
/// from `huggingface_hub`'s cache where it is, else fetched.
pub(super) fn sibling(repo: &Arc<Repo>, url: &url::Url, name: &str) -> Result<MappedFile> {
    let url = remote::sibling_url(url, name)
        .ok_or_else(|| fail(&repo.label(url), format!("sibling {name:?}: not beside it")))?;
    open_file(repo, url)
}

/// Opens `arg` (`hf://ORG/REPO[@REVISION][/PATH]`): resolves the revision
/// to a commit, picks the file, and opens it as a remote object. Also
/// gives what index.json should say of it.
pub fn open(arg: &str, opts: &Options) -> Result<(MappedFile, Value)> {
    let spec = parse(arg, opts.revision.as_deref()).map_err(|e| fail(arg, e))?;
    let label = format!("hf://{}@{}", spec.repo, spec.revision);
    let hub = Hub::from_env().map_err(|e| fail(&label, e))?;
    let info = repo_info(&hub, &spec, opts, &label)?;
    let path = match &spec.path {
        Some(p) => {
            if !info.files.is_empty() && !info.files.iter().any(|(n, _)| n == p) {
                return Err(fail(
                    &format!("{label}/{p}"),
                    format!("no such file at commit {}", info.commit),
                ));
            }
            p.clone()
        }
        None => choose(&spec, &info).map_err(|e| fail(&label, e))?,
    };
    log::info!(
        "{label}: revision {} is commit {}; mounting {path} (the repo has {} other files{})",
        spec.revision,
        info.commit,
        info.files.len().saturating_sub(1),
        if hub.offline { "; offline" } else { "" }
    );
    let about = describe(&hub, &spec, &info, &path);
    // Only the mounted file's folder: its siblings (shards, external data)
    // are beside it, and a dataset repo may list millions.
    let files = info
        .files
        .into_iter()
        .filter(|(n, _)| folder_of(n) == folder_of(&path))
        .collect();
    let repo = Arc::new(Repo::new(
        hub,
        (spec.repo.clone(), info.commit.clone()),
        opts,
        files,
    ));
    let url = repo.resolve_url(&path);
    let file = open_file(&repo, url)?;
    Ok((file, about))
}

#[cfg(test)]
mod tests;
