//! ztensor-mount: serve a zTensor file as a read-only directory.
//!
//! Data flows one way: file bytes -> index -> tensor catalog (`format`) ->
//! filesystem tree -> kernel (`mount`).

pub mod cli;
pub mod format;
pub mod mount;
