//! The serving core: a catalog's exposed bytes, read, decoded and checked
//! on demand. Knows the catalog and the source files, never a format, and
//! nothing of filesystems: the mount (`crate::mount`) and `cat` both read
//! through it.
//!
//! `data` serves a part's bytes over `cache` (decoded units in memory),
//! `spill` (units too big for it, decoded to `--cache-dir`), `window` (the
//! source's mapping), `guard` (a source changed or faulted since mount) and
//! `prefetch` (read-ahead); `filling` lets readers wait on bytes still being
//! decoded; `deadline` runs what a reader asks of `--cache-dir` on a thread
//! of its own, waiting a bounded time; `error` is a failed read and its
//! errno; `stats` the counters.

pub mod cache;
pub mod data;
pub mod deadline;
pub mod decoded_disk;
pub mod error;
pub mod filling;
pub mod guard;
mod inotify;
mod lazy_table;
pub mod prefetch;
pub mod spill;
pub mod stats;
#[cfg(test)]
pub(crate) mod testing;
pub mod window;

/// Locks `m`. Poisoning only means another reader panicked mid-update of
/// plain data; the structures stay usable, so keep serving.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
