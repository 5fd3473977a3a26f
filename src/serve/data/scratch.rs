//! One reply buffer kept per thread. A read that cannot be served from a
//! mapping or a cached unit as it is (a range across two zstd frames, a
//! view's header and tensor bytes, big-endian elements, a raw read under
//! 128 KiB, a generated file) is copied into a buffer of its own. A fresh
//! buffer per 1 MiB request costs its page faults every time (a quarter
//! of a second read of a zstd tensor's `.npy` view, in a profile on the
//! project's 2-core VM), so the worker thread that sent the reply keeps the buffer
//! for its next one.
//!
//! A reply's buffer that outlives the reply (kept to be written into a
//! backing file later, by another thread) comes back to a small pool
//! shared by all threads, which a thread without a spare takes from; one
//! let go unwritten (the write-behind's queue full) comes back to the
//! thread that let it go, the worker about to need one. Each buffer freed
//! instead made a worker's next reply a new one: in a zstd model's first
//! load on two busy cores, most of the daemon's page faults, and a load
//! 1.35x as long (2.35 s against 1.75 s).
//!
//! Memory: at most one buffer of at most [`KEEP_MAX`] per thread that
//! served such a read, and [`POOL_MAX`] in the pool, next to the request
//! buffer each FUSE worker holds.

use std::cell::Cell;
use std::sync::Mutex;

/// Largest buffer kept, whatever `max_read` allows: four default (1 MiB)
/// requests; a larger request's buffer is freed after its reply.
const KEEP_MAX: usize = 4 << 20;

/// Most buffers in the shared pool.
const POOL_MAX: usize = 4;

thread_local! {
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// An empty buffer: this thread's spare if it has one, else one from the
/// pool if it has one.
pub fn take() -> Vec<u8> {
    let v = SPARE.with(|s| s.take());
    if v.capacity() > 0 {
        return v;
    }
    crate::serve::lock(&POOL).pop().unwrap_or_default()
}

/// Keeps `v` as this thread's spare (the larger of it and the one kept,
/// if not over [`KEEP_MAX`]); the other goes to the pool if it has room.
pub fn give_back(mut v: Vec<u8>) {
    if v.capacity() == 0 || v.capacity() > KEEP_MAX {
        return;
    }
    v.clear();
    let other = SPARE.with(|s| {
        let kept = s.take();
        let (keep, other) = if v.capacity() >= kept.capacity() {
            (v, kept)
        } else {
            (kept, v)
        };
        s.set(keep);
        other
    });
    if other.capacity() > 0 {
        let mut pool = crate::serve::lock(&POOL);
        if pool.len() < POOL_MAX {
            pool.push(other);
        }
    }
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
        // The 1 MiB one is still the spare, and taken it is gone (the
        // next take may find a buffer another test's thread gave to the
        // shared pool, never this one).
        let kept = take();
        assert_eq!(kept.as_ptr(), at);
        let next = take();
        assert!(next.capacity() == 0 || next.as_ptr() != at);
    }
}
