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
    /// Finished spills dropped to make room (disk or descriptors) for others.
    pub spill_evictions: AtomicU64,
    /// Spills that waited for room that spills other readers held.
    pub spill_room_waits: AtomicU64,
    /// Opens answered with a backing file: the kernel reads those itself,
    /// and `reads` does not count their reads.
    pub passthrough_opens: AtomicU64,
    /// Opens the daemon serves (each read one of `reads`).
    pub fuse_opens: AtomicU64,
    /// Backing files filled under `--cache-dir`, and their bytes.
    pub backing_files: AtomicU64,
    pub backing_bytes: AtomicU64,
    /// Raw tensors given a backing file by cloning their range.
    pub backing_clones: AtomicU64,
    /// Backing files that are the file a tensor was decoded into: nothing
    /// copied.
    pub backing_decoded: AtomicU64,
    /// Filled backing files dropped to make room for others.
    pub backing_evictions: AtomicU64,
    /// Served bytes written into backing files after their replies, with
    /// CPU nothing else wanted, and those left to the fill (no CPU to
    /// spare before the cache let them go, or the file closed first).
    pub write_behind_bytes: AtomicU64,
    pub write_behind_skipped_bytes: AtomicU64,
    /// 1 when the kernel takes backing files (passthrough), else 0.
    pub passthrough: AtomicU64,
    /// Reads waiting now for a decode another thread runs (answered off
    /// the FUSE workers), and all such reads since mount.
    pub reads_waiting: AtomicU64,
    pub reads_waited: AtomicU64,
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

    /// The counters and gauges, and `more` (gauges of other parts).
    pub fn render(&self, g: &Gauges, more: &[(&str, u64)]) -> Vec<u8> {
        // A remote file's objects: requests, bytes fetched, bytes held.
        let remote = crate::source::remote::counters();
        let mut v = json!({
            "bytes_served": self.bytes_served.load(Relaxed),
            "reads": self.reads.load(Relaxed),
            "reads_waiting": self.reads_waiting.load(Relaxed),
            "reads_waited": self.reads_waited.load(Relaxed),
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
            "spill_evictions": self.spill_evictions.load(Relaxed),
            "spill_room_waits": self.spill_room_waits.load(Relaxed),
            "passthrough": self.passthrough.load(Relaxed) == 1,
            "passthrough_opens": self.passthrough_opens.load(Relaxed),
            "fuse_opens": self.fuse_opens.load(Relaxed),
            "backing_files": self.backing_files.load(Relaxed),
            "backing_bytes": self.backing_bytes.load(Relaxed),
            "backing_evictions": self.backing_evictions.load(Relaxed),
            "backing_clones": self.backing_clones.load(Relaxed),
            "backing_decoded": self.backing_decoded.load(Relaxed),
            "write_behind_bytes": self.write_behind_bytes.load(Relaxed),
            "write_behind_skipped_bytes": self.write_behind_skipped_bytes.load(Relaxed),
            "remote_requests": remote.requests,
            "remote_fetched_bytes": remote.fetched_bytes,
            "remote_cached_bytes": remote.cached_bytes,
            "remote_object_bytes": remote.object_bytes,
            "remote_bad_blocks": remote.bad_blocks,
        });
        for (k, n) in more {
            v[*k] = json!(n);
        }
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        out
    }
}
