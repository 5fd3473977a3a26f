//! ztensor-mount: serve a tensor file as a read-only directory.
//!
//! Data flows one way: file bytes (`source`) -> a format module (`formats`)
//! -> the common catalog (`catalog`) -> the serving core (`serve`) ->
//! filesystem tree and kernel (`mount`). Encodings shared by formats live in `codec`; files computed
//! from the catalog for other libraries (`.npy`, zarr, safetensors) in
//! `views`.

pub mod catalog;
pub mod cli;
pub mod codec;
pub mod error;
pub mod formats;
pub mod fuzzing;
pub mod mount;
pub mod serve;
pub mod sigbus;
pub mod size;
pub mod source;
pub mod views;
