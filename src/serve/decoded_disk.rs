//! The disk that decoded files under `--cache-dir` take together, held
//! within `--decoded-cache-size`: spills (the data layer's, see
//! [`super::spill`]) and filled backing files (the mount's) share the one
//! bound, whichever made them. A spill that a backing file adopts is
//! counted once, as a spill.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub struct DecodedDisk {
    limit: AtomicU64,
    /// Bytes of the spills held now.
    spills: AtomicU64,
    /// Bytes of the filled backing files, as the mount counts them.
    filled: AtomicU64,
}

impl Default for DecodedDisk {
    fn default() -> Self {
        DecodedDisk {
            limit: AtomicU64::new(u64::MAX),
            spills: AtomicU64::new(0),
            filled: AtomicU64::new(0),
        }
    }
}

impl DecodedDisk {
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Relaxed);
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    /// Bytes of the spills held now.
    pub fn spills(&self) -> u64 {
        self.spills.load(Relaxed)
    }

    /// The mount's count of its filled backing files' bytes.
    pub fn set_filled(&self, bytes: u64) {
        self.filled.store(bytes, Relaxed);
    }

    /// Both kinds of file together.
    pub fn used(&self) -> u64 {
        self.spills().saturating_add(self.filled.load(Relaxed))
    }

    /// A spill's `len` bytes, when they fit beside what is held: given
    /// back when the charge is dropped (with the spill, its file gone).
    pub fn charge_spill(self: &Arc<Self>, len: u64) -> Option<SpillCharge> {
        let filled = self.filled.load(Relaxed);
        let limit = self.limit();
        self.spills
            .fetch_update(Relaxed, Relaxed, |s| {
                let total = s.checked_add(filled)?.checked_add(len)?;
                (total <= limit).then_some(s + len)
            })
            .ok()?;
        Some(SpillCharge {
            disk: self.clone(),
            len,
        })
    }
}

/// A spill's share of the bound, given back when dropped.
pub struct SpillCharge {
    disk: Arc<DecodedDisk>,
    len: u64,
}

impl Drop for SpillCharge {
    fn drop(&mut self) {
        let _ = self
            .disk
            .spills
            .fetch_update(Relaxed, Relaxed, |s| Some(s.saturating_sub(self.len)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spills_and_filled_files_share_the_bound_and_a_charge_goes_with_its_spill() {
        let d = Arc::new(DecodedDisk::default());
        d.set_limit(10);
        d.set_filled(4);
        let a = d.charge_spill(5).expect("4 + 5 fit in 10");
        assert!(d.charge_spill(2).is_none(), "4 + 5 + 2 do not");
        assert_eq!(d.used(), 9);
        drop(a);
        assert_eq!(d.spills(), 0);
        assert!(d.charge_spill(6).is_some());
        assert!(d.charge_spill(u64::MAX).is_none());
    }
}
