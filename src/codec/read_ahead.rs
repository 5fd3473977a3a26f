//! A byte range of a file read front to back in pieces, on a thread of its
//! own, up to two pieces ahead of its consumer.
//!
//! A one-frame zstd blob is decoded by one thread, and that thread is the
//! bound: the copy of each compressed piece out of the page cache (`pread`)
//! was a tenth of its time (BENCHMARKS.md). Read here, that copy runs on
//! another core while the decoder works on the piece before.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Pieces read ahead of the one in use: enough to cover the time a read
/// takes to start, few enough to stay in the cache.
const AHEAD: usize = 2;

/// Pieces of `[offset, offset + len)` of a file, in order.
pub struct ReadAhead {
    pieces: Receiver<io::Result<Vec<u8>>>,
    /// Used pieces back to the reading thread, to be filled again.
    spent: SyncSender<Vec<u8>>,
}

impl ReadAhead {
    /// Starts reading `len` bytes at `offset` of `file` in pieces of
    /// `piece` bytes (the last one shorter). `None` when no thread can be
    /// started or the file cannot be shared with one: the caller reads
    /// the pieces itself.
    pub fn start(file: &File, offset: u64, len: usize, piece: usize) -> Option<ReadAhead> {
        let file = file.try_clone().ok()?;
        let (give, pieces) = sync_channel(AHEAD);
        let (spent, back) = sync_channel(AHEAD + 1);
        std::thread::Builder::new()
            .name("zt-read-ahead".into())
            .spawn(move || read_pieces(&file, offset, len, piece.max(1), &give, &back))
            .ok()?;
        Some(ReadAhead { pieces, spent })
    }

    /// The next piece; an error where reading it failed (a short read is
    /// `UnexpectedEof`), and nothing after an error or the last piece.
    pub fn next(&self) -> Option<io::Result<Vec<u8>>> {
        self.pieces.recv().ok()
    }

    /// Gives a used piece back, so its memory is filled again rather than
    /// a new buffer's faulted in.
    pub fn give_back(&self, piece: Vec<u8>) {
        let _ = self.spent.try_send(piece);
    }
}

/// The reading thread: ends after the last piece, after an error, or as
/// soon as the consumer is gone.
fn read_pieces(
    file: &File,
    offset: u64,
    len: usize,
    piece: usize,
    give: &SyncSender<io::Result<Vec<u8>>>,
    back: &Receiver<Vec<u8>>,
) {
    let mut at = 0;
    while at < len {
        let n = piece.min(len - at);
        let mut buf = back.try_recv().unwrap_or_default();
        buf.resize(n, 0);
        let read = file.read_exact_at(&mut buf, offset + at as u64);
        let failed = read.is_err();
        if give.send(read.map(|()| buf)).is_err() || failed {
            return;
        }
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn gives_the_range_in_order_in_pieces() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let f = file_of(&bytes);
        let r = ReadAhead::start(&f, 100, 9_000, 1_000).unwrap();
        let mut got = Vec::new();
        while let Some(p) = r.next() {
            let p = p.unwrap();
            got.extend_from_slice(&p);
            r.give_back(p);
        }
        assert_eq!(got, &bytes[100..9_100]);
    }

    #[test]
    fn a_range_past_the_end_gives_what_is_there_then_a_short_read() {
        let f = file_of(&[7u8; 2_500]);
        let r = ReadAhead::start(&f, 0, 4_000, 1_000).unwrap();
        for _ in 0..2 {
            assert_eq!(r.next().unwrap().unwrap(), vec![7u8; 1_000]);
        }
        let e = r.next().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(r.next().is_none());
    }

    #[test]
    fn the_thread_lets_go_of_the_file_when_its_consumer_is_gone() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[1u8; 64_000]).unwrap();
        let path = f.path().to_path_buf();
        let opens = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|p| *p == path)
                .count()
        };
        let r = ReadAhead::start(f.as_file(), 0, 64_000, 10).unwrap();
        assert!(r.next().is_some());
        assert_eq!(opens(), 2, "the file and the thread's copy of it");
        drop(r);
        // The thread's next send fails; it returns, closing its copy.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while opens() > 1 && std::time::Instant::now() < until {
            std::thread::yield_now();
        }
        assert_eq!(opens(), 1);
    }
}
