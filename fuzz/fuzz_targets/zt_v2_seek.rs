//! The zTensor v2 `zt.zstd-seekable/1` seek-table parser on arbitrary
//! bytes: the first 8 bytes are the part's declared `decoded_length`, the
//! rest its stored bytes. It must never panic, and a table it accepts must
//! add up: stored sizes to the bytes before the table, decoded sizes to
//! the declared length, every frame within the 16 MiB rule. Each accepted
//! table is then walked the way the open path walks it (frame headers, and
//! the element reader the sparse checks use).
//! The body is `ztensor_mount::fuzzing::zt_v2_seek`, built and run over the seeds
//! by `tests/fuzz_bodies.rs` on the stable toolchain.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ztensor_mount::fuzzing::zt_v2_seek(data));
