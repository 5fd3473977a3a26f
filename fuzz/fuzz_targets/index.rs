//! The index parser and catalog checks on arbitrary bytes: must return Ok or
//! a one-line Err, never panic, loop or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztensor_mount::formats::zt_v01::Catalog;

fuzz_target!(|data: &[u8]| {
    match Catalog::parse(data, "fuzz.zt") {
        Ok(cat) => {
            // Touch what the mount would: every tensor's description.
            for t in &cat.tensors {
                if let Ok(l) = &t.layout {
                    assert!(l.parts.iter().all(|p| !p.name.is_empty() || l.parts.len() == 1));
                }
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
});
