//! The zTensor v2 `zt.zstd-seekable/1` seek-table parser on arbitrary
//! bytes: the first 8 bytes are the part's declared `decoded_length`, the
//! rest its stored bytes. It must never panic, and a table it accepts must
//! add up: stored sizes to the bytes before the table, decoded sizes to
//! the declared length, every frame within the 16 MiB rule. Each accepted
//! table is then walked the way the open path walks it (frame headers, and
//! the element reader the sparse checks use).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ztensor_mount::formats::zt_v2::{check, seek};

fuzz_target!(|data: &[u8]| {
    let Some((head, stored)) = data.split_first_chunk::<8>() else {
        return;
    };
    let decoded = u64::from_le_bytes(*head) % (1 << 26);
    if let Ok(t) = seek::parse(stored, decoded) {
        assert_eq!(t.frames.iter().map(|f| f.0).sum::<u64>(), t.frames_len);
        assert_eq!(t.frames.iter().map(|f| f.1).sum::<u64>(), decoded);
        assert!(t.frames_len <= stored.len() as u64);
        assert!(t.frames.iter().all(|&(c, d)| c > 0 && d > 0 && d <= seek::MAX_FRAME_DECODED));
        if seek::check_frame_headers(stored, &t).is_ok() {
            let mut e = check::Elements::zstd(stored, &t.frames, 4);
            let mut n = 0u64;
            while let Ok(Some(_)) = e.next_elem() {
                n += 1;
            }
            assert!(n <= decoded / 4);
        }
    }
});
