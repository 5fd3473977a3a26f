//! Counters behind `.ztensor/stats`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde_json::json;

#[derive(Default)]
pub struct Stats {
    pub bytes_served: AtomicU64,
    pub reads: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub decompressions: AtomicU64,
    pub decompressed_bytes: AtomicU64,
    pub evictions: AtomicU64,
    pub errors: AtomicU64,
    pub checksum_failures: AtomicU64,
    pub spilled_tensors: AtomicU64,
    pub spilled_bytes: AtomicU64,
}

/// Cache gauges, read at render time.
pub struct Gauges {
    pub cache_bytes: u64,
    pub cache_peak_bytes: u64,
    pub cache_limit: u64,
    pub cache_entries: u64,
    pub inflight_decodes: u64,
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub fn render(&self, g: &Gauges) -> Vec<u8> {
        // A remote file's objects: requests, bytes fetched, bytes held.
        let remote = crate::source::remote::counters();
        let v = json!({
            "bytes_served": self.bytes_served.load(Relaxed),
            "reads": self.reads.load(Relaxed),
            "cache_bytes": g.cache_bytes,
            "cache_peak_bytes": g.cache_peak_bytes,
            "cache_limit": g.cache_limit,
            "cache_entries": g.cache_entries,
            "inflight_decodes": g.inflight_decodes,
            "cache_hits": self.cache_hits.load(Relaxed),
            "cache_misses": self.cache_misses.load(Relaxed),
            "decompressions": self.decompressions.load(Relaxed),
            "decompressed_bytes": self.decompressed_bytes.load(Relaxed),
            "evictions": self.evictions.load(Relaxed),
            "errors": self.errors.load(Relaxed),
            "checksum_failures": self.checksum_failures.load(Relaxed),
            "spilled_tensors": self.spilled_tensors.load(Relaxed),
            "spilled_bytes": self.spilled_bytes.load(Relaxed),
            "remote_requests": remote.requests,
            "remote_fetched_bytes": remote.fetched_bytes,
            "remote_cached_bytes": remote.cached_bytes,
            "remote_object_bytes": remote.object_bytes,
        });
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        out
    }
}
