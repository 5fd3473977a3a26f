//! One reply buffer kept per thread. A read that cannot be served from a
//! mapping or a cached unit as it is (a range across two zstd frames, a
//! view's header and tensor bytes, big-endian elements, a raw read under
//! 128 KiB, a generated file) is copied into a buffer of its own. A fresh
//! buffer per 1 MiB request costs its page faults every time (a quarter
//! of the read on the project's VM: BENCHMARKS.md, the `.npy` view of a
//! zstd tensor), so the worker thread that sent the reply keeps the buffer
//! for its next one.
//!
//! Memory: at most one buffer of at most [`KEEP_MAX`] per thread that
//! served such a read, next to the request buffer each FUSE worker holds.

use std::cell::Cell;

/// Largest buffer kept, whatever `max_read` allows: four default (1 MiB)
/// requests; a larger request's buffer is freed after its reply.
const KEEP_MAX: usize = 4 << 20;

thread_local! {
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// An empty buffer, this thread's spare if it has one.
pub fn take() -> Vec<u8> {
    SPARE.with(|s| s.take())
}

/// Keeps `v` as this thread's spare (the larger of it and the one kept,
/// if not over [`KEEP_MAX`]).
pub fn give_back(mut v: Vec<u8>) {
    if v.capacity() == 0 || v.capacity() > KEEP_MAX {
        return;
    }
    v.clear();
    SPARE.with(|s| {
        let kept = s.take();
        s.set(if v.capacity() >= kept.capacity() {
            v
        } else {
            kept
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_and_a_huge_one_is_not_kept() {
        let mut v = take();
        v.resize(1 << 20, 7);
        let at = v.as_ptr();
        give_back(v);
        let again = take();
        assert_eq!((again.as_ptr(), again.len()), (at, 0));
        assert!(again.capacity() >= 1 << 20);
        give_back(again);

        give_back(vec![0u8; KEEP_MAX + 1]);
        // The 1 MiB one is still the spare, and taken it is gone.
        let kept = take();
        assert_eq!(kept.as_ptr(), at);
        assert_eq!(take().capacity(), 0);
    }
}
