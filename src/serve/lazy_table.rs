//! One value per index, each made (as `T::default()`) on first use, in
//! chunks.
//!
//! Why: the serving core keeps some state per blob and per tensor, and a
//! mount of 10^5 tensors that reads a handful of them would otherwise
//! write every entry at mount (16 MB of new memory for the blob states
//! alone, each page of which costs a page fault). A chunk of entries is
//! made when one of them is first asked for.

use std::sync::OnceLock;

/// Entries per chunk: small enough that a read of one tensor makes little,
/// large enough that the chunk table itself is small.
const CHUNK: usize = 64;

pub struct LazyTable<T> {
    len: usize,
    chunks: Box<[OnceLock<Box<[T]>>]>,
}

impl<T: Default> LazyTable<T> {
    pub fn new(len: usize) -> LazyTable<T> {
        let chunks = (0..len.div_ceil(CHUNK)).map(|_| OnceLock::new()).collect();
        LazyTable { len, chunks }
    }

    /// Entry `i`, made now with its chunk if it was not yet; None past
    /// the end.
    pub fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        let c = i / CHUNK;
        let chunk = self.chunks.get(c)?.get_or_init(|| {
            let n = CHUNK.min(self.len - c * CHUNK);
            (0..n).map(|_| T::default()).collect()
        });
        chunk.get(i % CHUNK)
    }

    /// The entries made so far, with their indexes (an entry never made
    /// holds its default).
    pub fn made(&self) -> impl Iterator<Item = (usize, &T)> {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| {
            chunk
                .get()
                .into_iter()
                .flat_map(move |es| es.iter().enumerate().map(move |(k, e)| (c * CHUNK + k, e)))
        })
    }
}

impl<T: Default> std::ops::Index<usize> for LazyTable<T> {
    type Output = T;

    /// Entry `i`; past the end it panics, as a slice does (callers index
    /// with a blob or tensor number the catalog gave them).
    fn index(&self, i: usize) -> &T {
        match self.get(i) {
            Some(e) => e,
            None => panic!("index {i} past the end of a table of {}", self.len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    #[test]
    fn entries_are_made_by_the_chunk_on_first_use() {
        let t: LazyTable<AtomicUsize> = LazyTable::new(2 * CHUNK + 3);
        assert_eq!(t.made().count(), 0);
        t[CHUNK + 1].store(7, Relaxed);
        assert_eq!(t[CHUNK + 1].load(Relaxed), 7);
        let made: Vec<usize> = t.made().map(|(i, _)| i).collect();
        assert_eq!(made, (CHUNK..2 * CHUNK).collect::<Vec<_>>());
        // The last chunk holds only what is left.
        assert_eq!(t[2 * CHUNK + 2].load(Relaxed), 0);
        assert_eq!(t.made().count(), CHUNK + 3);
        assert!(t.get(2 * CHUNK + 3).is_none());
    }

    #[test]
    fn an_empty_table_has_no_entries() {
        let t: LazyTable<AtomicUsize> = LazyTable::new(0);
        assert!(t.get(0).is_none());
        assert_eq!(t.made().count(), 0);
    }
}
