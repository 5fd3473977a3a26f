//! What a mount learned of the Hub, recorded under the cache directory
//! for an offline remount (`HF_HUB_OFFLINE=1`).

use std::path::{Path, PathBuf};

use crate::source::remote::Options;

/// Where the facts a mount learned from the Hub are kept for an offline
/// remount: a small JSON file per revision and per file resolved.
pub(super) fn record_path(opts: &Options, kind: &str, parts: &[&str]) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_128(parts.join("\0").as_bytes());
    opts.cache_dir
        .join("ztensor-remote")
        .join("hub")
        .join(format!("{kind}-{h:032x}.json"))
}

pub(super) fn save_record(path: &Path, v: &impl serde::Serialize) {
    // Written whole then renamed: a reader sees the old record or the new.
    let r = (|| -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let cache_dir = dir
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("."));
        crate::source::shared::cache_folder(cache_dir)?.map_err(std::io::Error::other)?;
        crate::source::shared::made_folder(dir.to_path_buf())?.map_err(std::io::Error::other)?;
        let tmp = tempfile::NamedTempFile::new_in(dir)?;
        serde_json::to_writer(&tmp, v)?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    })();
    if let Err(e) = r {
        log::warn!(
            "cannot record {} for an offline remount: {e}",
            path.display()
        );
    }
}

/// A record, from a folder whose files may be trusted (see
/// [`crate::source::shared::trusted`]).
pub(super) fn load_record<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let dir = path.parent()?;
    crate::source::shared::trusted(dir.parent()?).ok()?;
    crate::source::shared::trusted(dir).ok()?;
    serde_json::from_slice(&crate::source::read_small(path, RECORD_MAX).ok()?).ok()
}

/// The most a record holds (a revision's file list; far more than any).
const RECORD_MAX: u64 = 64 << 20;
