//! Opens a fuzzed file through the mount's data layer (the code behind every
//! read) and reads ranges of every part of every tensor, with a tiny cache so
//! frames, whole-blob and spill plans all run. Input: 8 bytes of read plan,
//! then the file.
//! The body is `ztensor_mount::fuzzing::data_path`, built and run over the seeds
//! by `tests/fuzz_bodies.rs` on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ztensor_mount::fuzzing::data_path(data));
