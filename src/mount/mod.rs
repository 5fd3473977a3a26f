//! The mount: tensor catalog -> filesystem tree -> kernel.
//!
//! `tree` lays out paths, `data` serves bytes (over `cache`, `spill`,
//! `window` and `guard`), `fs` answers filesystem calls without knowing fuser, and `fuse`
//! is the thin adapter the kernel talks to.

pub mod cache;
pub mod data;
pub mod filling;
pub mod fs;
pub mod fuse;
pub mod guard;
pub mod prefetch;
pub mod sidecar;
pub mod spill;
pub mod stats;
pub mod tree;
pub mod window;
