//! The zTensor v1 manifest parser and catalog checks on arbitrary bytes:
//! must return Ok or a one-line Err, never panic, loop or allocate without
//! bound; an Ok catalog must only point inside the file.
//! The body is `ztensor_mount::fuzzing::zt_v1`, built and run over the seeds
//! by `tests/fuzz_bodies.rs` on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ztensor_mount::fuzzing::zt_v1(data));
