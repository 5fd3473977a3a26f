//! The files `huggingface_hub` has downloaded already (`hf_hub_download`,
//! `snapshot_download`, `transformers`), in its cache's layout:
//! `HUB_CACHE/models--ORG--REPO/snapshots/COMMIT/PATH`, a link to the
//! file's blob, and `refs/REVISION`, the commit a revision was last
//! resolved to. A Hub mount reads such a file where it is instead of
//! fetching it again (see `hub::open_file`). Only reads: this module never
//! writes into that cache.

use std::path::{Component, Path, PathBuf};

/// `huggingface_hub`'s cache directory, as it finds it: `HF_HUB_CACHE`
/// (or the older `HUGGINGFACE_HUB_CACHE`), else `HF_HOME/hub`, else
/// `${XDG_CACHE_HOME:-~/.cache}/huggingface/hub`.
pub fn dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("HF_HUB_CACHE").or_else(|| env("HUGGINGFACE_HUB_CACHE")) {
        return Some(d);
    }
    Some(home(&env)?.join("hub"))
}

/// `huggingface_hub`'s home (its cache and token are in it): `HF_HOME`,
/// else `${XDG_CACHE_HOME:-~/.cache}/huggingface`; `env` looks a variable
/// up as a path, `None` where it is unset.
pub fn home(env: &dyn Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    env("HF_HOME").or_else(|| {
        env("XDG_CACHE_HOME")
            .or_else(|| env("HOME").map(|h| h.join(".cache")))
            .map(|c| c.join("huggingface"))
    })
}

/// The folder of `repo` (`ORG/REPO`, `datasets/ORG/REPO`, `spaces/…`):
/// `models--ORG--REPO`, `datasets--ORG--REPO`, ….
fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    let (kind, name) = match repo.split_once('/') {
        Some((k @ ("datasets" | "spaces"), rest)) => (k, rest),
        _ => ("models", repo),
    };
    cache.join(format!("{kind}--{}", name.replace('/', "--")))
}

/// `path` as a relative path of plain names, or `None` (a path from the
/// Hub's listing must not climb out of the snapshot).
fn plain(path: &str) -> Option<&Path> {
    let p = Path::new(path);
    p.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(p)
}

/// The cached file `path` of `repo` at `commit`, if the cache has it (a
/// regular file, through its link).
pub fn file(cache: &Path, repo: &str, commit: &str, path: &str) -> Option<(PathBuf, u64)> {
    let p = repo_dir(cache, repo)
        .join("snapshots")
        .join(plain(commit)?)
        .join(plain(path)?);
    let meta = std::fs::metadata(&p).ok()?;
    meta.is_file().then_some((p, meta.len()))
}

/// The commit `revision` was last resolved to by `huggingface_hub`
/// (`refs/REVISION`), or the revision itself when it is a commit the
/// cache has a snapshot of.
pub fn commit(cache: &Path, repo: &str, revision: &str) -> Option<String> {
    let dir = repo_dir(cache, repo);
    let is_commit = |c: &str| c.len() == 40 && c.chars().all(|c| c.is_ascii_hexdigit());
    if is_commit(revision) && dir.join("snapshots").join(revision).is_dir() {
        return Some(revision.to_string());
    }
    let c = super::read_small(&dir.join("refs").join(plain(revision)?), 1024).ok()?;
    let c = String::from_utf8_lossy(&c);
    let c = c.trim();
    (is_commit(c) && dir.join("snapshots").join(c).is_dir()).then(|| c.to_string())
}

/// Most files listed of one snapshot (a repo on the Hub has far fewer).
const MAX_FILES: usize = 100_000;

/// The files of the snapshot of `repo` at `commit`, with their sizes,
/// sorted: what the cache holds of that commit. `huggingface_hub` makes
/// its folders as folders and its files as links to blobs: a link to a
/// folder is not followed (it could loop).
pub fn files(cache: &Path, repo: &str, commit: &str) -> Vec<(String, Option<u64>)> {
    let Some(c) = plain(commit) else {
        return Vec::new();
    };
    let root = repo_dir(cache, repo).join("snapshots").join(c);
    let mut out = Vec::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            if out.len() >= MAX_FILES {
                log::warn!(
                    "{}: more than {MAX_FILES} files; the rest are not listed",
                    root.display()
                );
                out.sort();
                return out;
            }
            let name = format!("{rel}{}", e.file_name().to_string_lossy());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(format!("{name}/"));
            } else if let Ok(m) = std::fs::metadata(e.path())
                && m.is_file()
            {
                out.push((name, Some(m.len())));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache as `huggingface_hub` lays it out: a blob, a snapshot link
    /// to it, and a ref.
    fn cache() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let repo = d.path().join("models--org--repo");
        let commit = "a".repeat(40);
        let snap = repo.join("snapshots").join(&commit);
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(snap.join("sub")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("blobs/e1"), b"12345").unwrap();
        std::os::unix::fs::symlink("../../blobs/e1", snap.join("model.safetensors")).unwrap();
        std::fs::write(snap.join("sub/x.bin"), b"xy").unwrap();
        std::fs::write(repo.join("refs/main"), format!("{commit}\n")).unwrap();
        d
    }

    #[test]
    fn a_cached_file_is_found_through_its_link_with_its_size() {
        let d = cache();
        let c = "a".repeat(40);
        let (p, n) = file(d.path(), "org/repo", &c, "model.safetensors").unwrap();
        assert_eq!(n, 5);
        assert!(p.ends_with("model.safetensors"));
        assert_eq!(file(d.path(), "org/repo", &c, "sub/x.bin").unwrap().1, 2);
        assert_eq!(file(d.path(), "org/repo", &c, "nope"), None);
        assert_eq!(file(d.path(), "org/other", &c, "model.safetensors"), None);
        assert_eq!(file(d.path(), "org/repo", &c, "sub"), None);
        // Nothing outside the snapshot, whatever the listing says.
        assert_eq!(file(d.path(), "org/repo", &c, "../../blobs/e1"), None);
        assert_eq!(file(d.path(), "org/repo", "../..", "blobs/e1"), None);
    }

    #[test]
    fn a_revision_is_its_ref_or_a_commit_with_a_snapshot() {
        let d = cache();
        let c = "a".repeat(40);
        assert_eq!(commit(d.path(), "org/repo", "main"), Some(c.clone()));
        assert_eq!(commit(d.path(), "org/repo", &c), Some(c.clone()));
        assert_eq!(commit(d.path(), "org/repo", &"b".repeat(40)), None);
        assert_eq!(commit(d.path(), "org/repo", "dev"), None);
        assert_eq!(commit(d.path(), "org/repo", "../refs/main"), None);
    }

    #[test]
    fn a_snapshot_lists_its_files_with_sizes() {
        let d = cache();
        let got = files(d.path(), "org/repo", &"a".repeat(40));
        assert_eq!(
            got,
            vec![
                ("model.safetensors".to_string(), Some(5)),
                ("sub/x.bin".to_string(), Some(2))
            ]
        );
    }

    #[test]
    fn links_to_folders_are_not_followed_and_a_ref_must_be_small_and_regular() {
        let d = cache();
        let c = "a".repeat(40);
        let snap = d.path().join("models--org--repo/snapshots").join(&c);
        std::os::unix::fs::symlink(".", snap.join("loop")).unwrap();
        std::os::unix::fs::symlink("..", snap.join("sub/up")).unwrap();
        let names: Vec<String> = files(d.path(), "org/repo", &c)
            .into_iter()
            .map(|f| f.0)
            .collect();
        assert_eq!(names, vec!["model.safetensors", "sub/x.bin"]);
        let refs = d.path().join("models--org--repo/refs");
        std::os::unix::fs::symlink("/dev/zero", refs.join("zero")).unwrap();
        assert_eq!(commit(d.path(), "org/repo", "zero"), None);
    }

    #[test]
    fn datasets_and_spaces_have_folders_of_their_kind() {
        let c = Path::new("/c");
        assert_eq!(repo_dir(c, "org/r"), Path::new("/c/models--org--r"));
        assert_eq!(
            repo_dir(c, "datasets/org/r"),
            Path::new("/c/datasets--org--r")
        );
        assert_eq!(repo_dir(c, "spaces/org/r"), Path::new("/c/spaces--org--r"));
    }
}
