//! Large replies straight from a file's mapping whose bytes start at the
//! start of a page go out from a buffer half a page in.
//!
//! The kernel copies a reply into the reader's buffer. That copy runs at a
//! third of its speed when the reader's buffer lies a little ahead of the
//! reply's bytes in their place in a 4 KiB page (4K aliasing: each load
//! seems to depend on a store just made). Readers' large buffers start a
//! few bytes past a page (`malloc` maps them: 16 bytes in with glibc), and
//! a tensor stored on a page boundary (every tensor `ztensor` 2.x writes)
//! is answered from the file's mapping at the start of a page, so every
//! large reply of such a tensor met that case. One more copy, to a buffer
//! half a page off, is cheaper than the aliased one: a whole-model load of
//! page-aligned tensors took about 8% less time (BENCHMARKS.md, "4K
//! aliasing").
//! Replies from the daemon's own buffers are not staged: where those lie
//! in the page does not follow the file, and a 1 MiB-frame tensor's first
//! read, bound by the decode on every core, has no time for the copy.
//!
//! The copy is the caller's, and checked: made here, a copy from a
//! mapping whose page is gone meets the SIGBUS handler's zero page, where
//! the kernel's own copy would have failed.

use std::cell::Cell;

/// Replies shorter than this go out as they are: the copy would cost more
/// than the alias.
const MIN: usize = 64 << 10;
/// Nor are longer ones staged: the buffer each thread keeps stays this
/// small whatever `max_read` allows (four default requests).
const MAX: usize = 4 << 20;
/// Bytes starting this far before a page's start or less...
const BEFORE: usize = 256;
/// ...or less than this far past it are staged: readers' buffers start
/// within 64 bytes past a page, and their copy aliases when they lie up to
/// a few hundred bytes ahead of the reply's bytes.
const AFTER: usize = 64;
const PAGE: usize = 4096;

thread_local! {
    /// Each thread that answers the kernel keeps one buffer of its largest
    /// staged reply (at most [`MAX`] and a page).
    static STAGE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// A reply's bytes copied half a page into this thread's buffer, which
/// goes back to the thread when dropped.
pub struct Staged {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl std::ops::Deref for Staged {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        STAGE.with(|s| s.set(std::mem::take(&mut self.buf)));
    }
}

/// `None` when `bytes` go out as they are; else a buffer half a page off
/// that `copy` filled with them, or `copy`'s error.
pub fn stage<E>(
    bytes: &[u8],
    copy: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<Option<Staged>, E> {
    if !aliases(bytes) {
        return Ok(None);
    }
    let mut buf = STAGE.with(|s| s.take());
    let need = bytes.len() + PAGE;
    if buf.len() < need {
        buf.resize(need, 0);
    }
    let base = buf.as_ptr() as usize % PAGE;
    let start = (PAGE / 2 + PAGE - base) % PAGE;
    let mut staged = Staged {
        buf,
        start,
        len: bytes.len(),
    };
    // A failed copy drops `staged`: the buffer goes back all the same.
    copy(&mut staged.buf[start..start + bytes.len()])?;
    Ok(Some(staged))
}

fn aliases(bytes: &[u8]) -> bool {
    let at = bytes.as_ptr() as usize % PAGE;
    (MIN..=MAX).contains(&bytes.len()) && !(AFTER..PAGE - BEFORE).contains(&at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer whose byte `at` lies `off` bytes past a page's start.
    fn placed(len: usize, off: usize) -> (Vec<u8>, usize) {
        let v: Vec<u8> = (0..len + 2 * PAGE).map(|i| (i * 7 % 251) as u8).collect();
        let at = (off + PAGE - v.as_ptr() as usize % PAGE) % PAGE;
        (v, at)
    }

    /// Where in the page the reply of `len` bytes placed `off` into a page
    /// goes out from.
    fn sent_from(len: usize, off: usize) -> usize {
        let (v, at) = placed(len, off);
        let bytes = &v[at..at + len];
        let copy = |out: &mut [u8]| -> Result<(), ()> {
            out.copy_from_slice(bytes);
            Ok(())
        };
        match stage(bytes, copy).unwrap() {
            Some(s) => {
                assert!(s[..] == bytes[..]);
                s.as_ptr() as usize % PAGE
            }
            None => off,
        }
    }

    #[test]
    fn a_large_reply_at_a_page_start_goes_out_half_a_page_off() {
        assert_eq!(sent_from(1 << 20, 0), PAGE / 2);
        assert_eq!(sent_from(1 << 20, 16), PAGE / 2);
        assert_eq!(sent_from(1 << 20, PAGE - 64), PAGE / 2);
        assert_eq!(sent_from(MAX, PAGE - BEFORE), PAGE / 2);
    }

    #[test]
    fn other_replies_go_out_as_they_are() {
        assert_eq!(sent_from(1 << 20, 64), 64, "64 bytes in: no alias");
        assert_eq!(sent_from(1 << 20, 1024), 1024);
        assert_eq!(sent_from(1 << 20, PAGE - BEFORE - 1), PAGE - BEFORE - 1);
        assert_eq!(sent_from(MIN - 1, 0), 0, "small replies");
        assert_eq!(sent_from(MAX + 1, 0), 0, "replies past what is kept");
    }

    #[test]
    fn a_copy_that_fails_sends_nothing_and_keeps_the_buffer() {
        let (v, at) = placed(1 << 20, 0);
        let bytes = &v[at..at + (1 << 20)];
        let r = stage(bytes, |_| Err("the page was gone"));
        assert_eq!(r.err(), Some("the page was gone"));
        // The buffer came back to the thread for the next reply.
        assert!(STAGE.with(|s| {
            let b = s.take();
            let kept = b.len() > 1 << 20;
            s.set(b);
            kept
        }));
    }
}
