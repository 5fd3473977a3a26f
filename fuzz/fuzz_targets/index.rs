//! The index parser and catalog checks on arbitrary bytes: must return Ok or
//! a one-line Err, never panic, loop or allocate without bound.
//! The body is `ztensor_mount::fuzzing::index`, built and run over the seeds
//! by `tests/fuzz_bodies.rs` on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ztensor_mount::fuzzing::index(data));
