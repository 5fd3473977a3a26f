//! The deathtensors prefix/header parser on arbitrary bytes: must return Ok
//! or a one-line Err, never panic, loop or allocate without bound; what it
//! accepts must be consistent with the file it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztensor_mount::formats::Limits;
use ztensor_mount::formats::deathtensors::parse;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        index_memory: 64 << 20,
    };
    match parse(data, "fuzz.deathtensors", limits) {
        Ok(p) => {
            let len = data.len() as u64;
            assert!(p.data_start + p.stored_len <= len);
            for t in &p.tensors {
                assert!(t.start <= t.end && t.end <= p.decoded_len);
                if !p.compressed() {
                    assert!(t.end <= p.stored_len);
                }
            }
            if let Some((_, (at, n))) = p.footer {
                assert_eq!(at + n + 32, len);
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
});
