//! The mount: catalog -> filesystem tree -> kernel. Knows the catalog and
//! the serving core (`crate::serve`), never a format.
//!
//! `tree` lays out paths, `sidecar` renders the JSON beside each tensor,
//! `backing` gives the kernel files it reads itself (FUSE passthrough),
//! `warmer` reads the pages of clones among them in while the mount idles,
//! `fs` answers filesystem calls without knowing fuser, and `fuse` is the
//! thin adapter the kernel talks to.

pub mod backing;
pub mod fs;
pub mod fuse;
pub mod sidecar;
pub mod tree;
mod warmer;

pub(crate) use crate::serve::lock;
