//! The deathtensors prefix/header parser on arbitrary bytes: must return Ok
//! or a one-line Err, never panic, loop or allocate without bound; what it
//! accepts must be consistent with the file it came from.
//! The body is `ztensor_mount::fuzzing::deathtensors`, built and run over the seeds
//! by `tests/fuzz_bodies.rs` on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ztensor_mount::fuzzing::deathtensors(data));
