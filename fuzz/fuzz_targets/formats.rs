//! Any bytes as a file through `formats::open` (detection, then every
//! format's catalog: zTensor v0.1, our HDF5 reader with its chunk
//! assembly, our `.pt` pickle evaluator, and all ztensor-compat reads),
//! then every tensor read through the data layer: Ok, a one-line Err, or a
//! failed read; never a panic, a hang or an unbounded allocation.
//! The body is `ztensor_mount::fuzzing::formats`, built and run over the seeds
//! by `tests/fuzz_bodies.rs` on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ztensor_mount::fuzzing::formats(data));
