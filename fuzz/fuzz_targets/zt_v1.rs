//! The zTensor v1 manifest parser and catalog checks on arbitrary bytes:
//! must return Ok or a one-line Err, never panic, loop or allocate without
//! bound; an Ok catalog must only point inside the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use ztensor_mount::catalog::PartMap;
use ztensor_mount::formats::{Limits, zt_v1};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        index_memory: 64 << 20,
    };
    match zt_v1::catalog(data, "fuzz.zt", Path::new("fuzz.zt"), limits) {
        Ok(cat) => {
            for b in &cat.blobs {
                assert!(b.offset.checked_add(b.len).is_some_and(|e| e <= data.len() as u64));
            }
            for t in &cat.tensors {
                // What the sidecar shows must serialize.
                let _ = serde_json::to_string(&t.meta);
                if let Ok(parts) = &t.parts {
                    for p in parts {
                        let b = &cat.blobs[p.blob];
                        assert_eq!(p.map, PartMap::Contiguous { start: 0 });
                        assert_eq!(p.nbytes, b.decoded_len, "{}", t.name);
                        assert!(t.directory || p.name.is_empty());
                        assert!(!p.name.contains('/'));
                    }
                }
            }
            let _ = serde_json::to_string(&cat.attributes);
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
});
