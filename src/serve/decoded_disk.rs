//! The disk that decoded files under `--cache-dir` take together, held
//! within `--decoded-cache-size`: spills (the data layer's, see
//! [`super::spill`]) and filled backing files (the mount's) share the one
//! bound, whichever made them. A spill that a backing file adopts is
//! counted once, as a spill. (A unit decoded into a file while it is
//! served is the memory cache's, within `--cache-size`, until a backing
//! file adopts it.) Each charge is checked against both kinds at once,
//! so fills and spills made side by side cannot pass the bound together.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use super::lock;

pub struct DecodedDisk {
    limit: AtomicU64,
    used: Mutex<Used>,
}

#[derive(Default, Clone, Copy)]
struct Used {
    /// Bytes of the spills held now.
    spills: u64,
    /// Bytes of the filled backing files, as the mount charged them.
    filled: u64,
    /// Charges and releases so far: a spill short of room waits while the
    /// room is moving (see `Data::charge_for_spill`).
    changes: u64,
}

impl Default for DecodedDisk {
    fn default() -> Self {
        DecodedDisk {
            limit: AtomicU64::new(u64::MAX),
            used: Mutex::default(),
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

    fn used_now(&self) -> Used {
        *lock(&self.used)
    }

    /// Bytes of the spills held now.
    pub fn spills(&self) -> u64 {
        self.used_now().spills
    }

    /// How many times a charge was taken or given back.
    pub fn changes(&self) -> u64 {
        self.used_now().changes
    }

    /// Both kinds of file together.
    pub fn used(&self) -> u64 {
        let u = self.used_now();
        u.spills.saturating_add(u.filled)
    }

    /// Adds `len` to the count `pick` chooses when the total stays within
    /// the bound.
    fn charge(&self, len: u64, pick: fn(&mut Used) -> &mut u64) -> bool {
        let mut u = lock(&self.used);
        let total = u.spills.saturating_add(u.filled).saturating_add(len);
        if total > self.limit() {
            return false;
        }
        *pick(&mut u) += len;
        u.changes += 1;
        true
    }

    fn release(&self, len: u64, pick: fn(&mut Used) -> &mut u64) {
        let mut u = lock(&self.used);
        let n = pick(&mut u);
        *n = n.saturating_sub(len);
        u.changes += 1;
    }

    /// A filled backing file's `len` bytes, when they fit beside what is
    /// held; given back by [`DecodedDisk::release_filled`].
    pub fn charge_filled(&self, len: u64) -> bool {
        self.charge(len, |u| &mut u.filled)
    }

    pub fn release_filled(&self, len: u64) {
        self.release(len, |u| &mut u.filled);
    }

    /// A spill's `len` bytes, when they fit beside what is held: given
    /// back when the charge is dropped (with the spill, or when it fails).
    pub fn charge_spill(self: &Arc<Self>, len: u64) -> Option<SpillCharge> {
        self.charge(len, |u| &mut u.spills).then(|| SpillCharge {
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
        self.disk.release(self.len, |u| &mut u.spills);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spills_and_filled_files_share_the_bound_and_a_charge_goes_with_its_spill() {
        let d = Arc::new(DecodedDisk::default());
        d.set_limit(10);
        assert!(d.charge_filled(4));
        let a = d.charge_spill(5).expect("4 + 5 fit in 10");
        assert!(d.charge_spill(2).is_none(), "4 + 5 + 2 do not");
        assert!(!d.charge_filled(2), "nor as a filled file");
        assert_eq!(d.used(), 9);
        drop(a);
        assert_eq!(d.spills(), 0);
        d.release_filled(4);
        assert_eq!(d.used(), 0);
        assert!(d.charge_spill(10).is_some());
        assert!(d.charge_spill(u64::MAX).is_none());
    }
}
