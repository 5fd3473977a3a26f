//! The mount: catalog -> filesystem tree -> kernel. Knows the catalog and
//! the source files, never a format.
//!
//! `tree` lays out paths, `data` serves bytes (over `cache`, `spill`,
//! `window` and `guard`), `fs` answers filesystem calls without knowing
//! fuser, and `fuse` is the thin adapter the kernel talks to.

pub mod backing;
pub mod cache;
pub mod data;
pub mod error;
pub mod filling;
pub mod fs;
pub mod fuse;
pub mod guard;
mod lazy_table;
pub mod prefetch;
pub mod sidecar;
pub mod spill;
pub mod stats;
#[cfg(test)]
mod testing;
pub mod tree;
pub mod window;

/// Locks `m`. Poisoning only means another reader panicked mid-update of
/// plain data; the structures stay usable, so keep serving.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
