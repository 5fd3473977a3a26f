//! The mount: catalog -> filesystem tree -> kernel. Knows the catalog and
//! the serving core (`crate::serve`), never a format.
//!
//! `tree` lays out paths, `sidecar` renders the JSON beside each tensor,
//! `backing` gives the kernel files it reads itself (FUSE passthrough),
//! `warmer` reads the pages of clones among them in while the mount idles,
//! `write_behind` writes served bytes into backing files when a core is
//! free, `activity` tells whether reads are being served (fills wait
//! for it), `priority` puts work in the schedulers' idle classes, `fs`
//! answers filesystem calls without knowing fuser, and `fuse` is the
//! thin adapter the kernel talks to.

mod activity;
pub mod backing;
pub mod fs;
pub mod fuse;
mod priority;
pub mod sidecar;
pub(crate) mod staging;
pub mod tree;
mod waiting;
mod warmer;
mod write_behind;

pub(crate) use crate::serve::lock;
