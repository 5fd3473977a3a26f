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

use std::cell::RefCell;

/// Replies shorter than this go out as they are: the copy would cost more
/// than the alias.
const MIN: usize = 64 << 10;
/// Bytes starting this far before a page's start or less...
const BEFORE: usize = 256;
/// ...or less than this far past it are staged: readers' buffers start
/// within 64 bytes past a page, and their copy aliases when they lie up to
/// a few hundred bytes ahead of the reply's bytes.
const AFTER: usize = 64;
const PAGE: usize = 4096;

thread_local! {
    /// Each thread that answers the kernel keeps one buffer of its largest
    /// staged reply (1 MiB + a page, with 1 MiB requests).
    static STAGE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Calls `send` with `bytes`, or with a copy of them half a page off when
/// they are large and start near a page's start.
pub fn send(bytes: &[u8], send: impl FnOnce(&[u8])) {
    if !aliases(bytes) {
        return send(bytes);
    }
    STAGE.with(|s| match s.try_borrow_mut() {
        Ok(mut v) => send(stage(&mut v, bytes)),
        Err(_) => send(bytes),
    })
}

fn aliases(bytes: &[u8]) -> bool {
    let at = bytes.as_ptr() as usize % PAGE;
    bytes.len() >= MIN && !(AFTER..=PAGE - BEFORE).contains(&at)
}

/// Copies `bytes` into `v` at half a page past one of its pages.
fn stage<'a>(v: &'a mut Vec<u8>, bytes: &[u8]) -> &'a [u8] {
    let need = bytes.len() + PAGE;
    if v.len() < need {
        v.resize(need, 0);
    }
    let base = v.as_ptr() as usize % PAGE;
    let start = (PAGE / 2 + PAGE - base) % PAGE;
    let out = &mut v[start..start + bytes.len()];
    out.copy_from_slice(bytes);
    out
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

    fn sent_from(len: usize, off: usize) -> usize {
        let (v, at) = placed(len, off);
        let bytes = &v[at..at + len];
        let mut from = usize::MAX;
        send(bytes, |b| {
            assert_eq!(b, bytes);
            from = b.as_ptr() as usize % PAGE;
        });
        from
    }

    #[test]
    fn a_large_reply_at_a_page_start_goes_out_half_a_page_off() {
        assert_eq!(sent_from(1 << 20, 0), PAGE / 2);
        assert_eq!(sent_from(1 << 20, 16), PAGE / 2);
        assert_eq!(sent_from(1 << 20, PAGE - 64), PAGE / 2);
    }

    #[test]
    fn other_replies_go_out_as_they_are() {
        assert_eq!(sent_from(1 << 20, 64), 64, "64 bytes in: no alias");
        assert_eq!(sent_from(1 << 20, 1024), 1024);
        assert_eq!(sent_from(MIN - 1, 0), 0, "small replies");
    }
}
