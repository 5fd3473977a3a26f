//! How a blob is read: its plan (raw, frame by frame, one unit in the
//! cache, a spill), made once from its frame table or a walk of its
//! frames.

use std::sync::Arc;

use crate::catalog::{Check, Codec, FrameTable};
use crate::codec::zstd as zstd_blob;
use crate::codec::zstd::Frame;
use crate::serve::cache::Buf;
use crate::serve::error::ReadError;

use super::{Data, Plan, Served, list_cost};

/// Whether a computed blob's checks can run over its pieces as its reader
/// streams them (see [`Data::computed_spill`]).
pub(super) fn streamable(b: &crate::catalog::Blob) -> bool {
    b.checks.iter().all(|c| {
        matches!(
            c,
            Check::BoolBytes | Check::Decoded(_) | Check::ZeroLastNibble
        )
    })
}

/// A blob decoded as one unit lives in the cache if it takes at most half.
pub(super) fn whole_or_spill(decoded: u64, limit: u64, one_frame: bool) -> Plan {
    if decoded <= limit / 2 {
        Plan::Whole { one_frame }
    } else {
        Plan::Spill { one_frame }
    }
}

pub(super) fn frame_at(frames: &[Frame], at: u64) -> usize {
    frames
        .partition_point(|f| f.d_start + f.d_len <= at)
        .min(frames.len().saturating_sub(1))
}

impl Data {
    pub(super) fn plan(&self, s: &Served, bi: usize) -> Result<&Plan, ReadError> {
        // A plan made by walking the blob reads all of it: fetched first,
        // outside the once-only plan (a failed fetch fails this read only).
        if self.states[bi].plan.get().is_none()
            && !matches!(&self.blob(bi).codec, Codec::Zstd { frames: Some(_) })
        {
            self.ensure_blob(s, bi)?;
        }
        self.states[bi]
            .plan
            .get_or_init(|| self.make_plan(s, bi))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Frames as the format recorded them, when their list fits in a
    /// quarter of the cache: no walk over the blob.
    pub(super) fn recorded_frames(&self, bi: usize) -> Option<Plan> {
        let b = self.blob(bi);
        let Codec::Zstd {
            frames: Some(table),
        } = &b.codec
        else {
            return None;
        };
        let limit = self.cache.limit();
        if !(2..=zstd_blob::MAX_FRAMES).contains(&table.len()) {
            return None;
        }
        // A frame list is kept while the file is mounted: it is counted in
        // the cache (`Cache::hold`) before it is built.
        let cost = list_cost(table.len());
        if !self.cache.hold(cost) {
            return None;
        }
        let frames = match table {
            FrameTable::Uniform {
                decoded,
                compressed,
            } if *decoded <= limit / 4 => {
                zstd_blob::frames_from_table(*decoded, compressed, b.len, b.decoded_len)
            }
            FrameTable::Listed(sizes) => zstd_blob::frames_from_list(sizes, b.len, b.decoded_len)
                .filter(|f| f.iter().all(|f| f.d_len <= limit / 4)),
            FrameTable::Uniform { .. } => None,
        };
        match frames {
            Some(frames) => Some(Plan::Frames(frames)),
            None => {
                self.cache.unhold(cost);
                None
            }
        }
    }

    pub(super) fn make_plan(&self, s: &Served, bi: usize) -> Result<Plan, ReadError> {
        if let Some(plan) = self.recorded_frames(bi) {
            return Ok(plan);
        }
        self.ensure_blob(s, bi)?;
        let decoded = self.blob(bi).decoded_len;
        let limit = self.cache.limit();
        let span = self.span(s, bi);
        let blob = span.bytes();
        // A table that cannot be held, or that does not agree with the
        // blob, leaves it to the walk below, which counts the frames there
        // are. One frame that says it holds the whole blob: nothing to walk
        // (a walk touches every block header of the blob). The decoder
        // checks the rest: that the frame ends the blob and decodes to
        // exactly that size.
        if zstd_blob::first_frame_size(blob) == Some(decoded) {
            s.guard.verdict()?;
            return Ok(whole_or_spill(decoded, limit, true));
        }
        // One frame that does not declare its size (a streaming writer's:
        // ztensor 1.x, deathtensors): one walk over its block headers says
        // so, and makes it a single frame for trust, like the one above.
        if zstd_blob::is_one_frame(blob) {
            span.release_all();
            s.guard.verdict()?;
            return Ok(whole_or_spill(decoded, limit, true));
        }
        // Counted before the list is built: a blob of a million tiny
        // frames gets no list it cannot keep.
        let count = zstd_blob::count_frames(blob).map_err(|why| self.fail(bi, why));
        let held = match count {
            Ok(Some(n)) if n > 1 => {
                let cost = list_cost(n);
                let held = self.cache.hold(cost).then_some(cost);
                if held.is_none() {
                    log::info!(
                        "{}",
                        self.fail(bi, format!("the list of its {n} zstd frames ({cost} bytes) does not fit in a quarter of the cache: decoded as one stream"))
                    );
                }
                held
            }
            _ => None,
        };
        let frames = match (&count, held) {
            (Ok(Some(n)), _) if *n == 1 || held.is_some() => {
                // Exactly as long as counted.
                zstd_blob::scan_frames_sized(blob, *n).map_err(|why| self.fail(bi, why))
            }
            _ => Ok(None),
        };
        // The walks touched a page per block header across the blob.
        span.release_all();
        let plan = self.plan_from_walk(s, bi, count, frames);
        if let Some(cost) = held
            && !matches!(plan, Ok(Plan::Frames(_)))
        {
            self.cache.unhold(cost);
        }
        plan
    }

    pub(super) fn plan_from_walk(
        &self,
        s: &Served,
        bi: usize,
        count: Result<Option<usize>, ReadError>,
        frames: Result<Option<Vec<Frame>>, ReadError>,
    ) -> Result<Plan, ReadError> {
        let decoded = self.blob(bi).decoded_len;
        let limit = self.cache.limit();
        s.guard.verdict()?;
        count?;
        let frames = frames?;
        let one_frame = frames.as_ref().is_some_and(|f| f.len() == 1);
        if let Some(frames) = frames {
            let total = frames.last().map_or(0, |f| f.d_start + f.d_len);
            if total != decoded {
                return Err(self.fail(
                    bi,
                    if total > decoded {
                        format!("zstd data decodes to more than the expected {decoded} bytes (its frame headers declare {total})")
                    } else {
                        format!("zstd data decodes to only {total} bytes, expected {decoded} (per its frame headers)")
                    },
                ));
            }
            if frames.len() > 1 && frames.iter().all(|f| f.d_len <= limit / 4) {
                return Ok(Plan::Frames(frames));
            }
        }
        Ok(whole_or_spill(decoded, limit, one_frame))
    }

    /// The cached unit holding decoded bytes `[at, at+n)`, if one does.
    pub(super) fn unit_containing(
        &self,
        s: &Served,
        bi: usize,
        plan: &Plan,
        at: u64,
        n: u64,
    ) -> Result<Option<(Arc<Buf>, usize)>, ReadError> {
        match plan {
            Plan::Frames(frames) => {
                let k = frame_at(frames, at);
                let f = frames[k];
                if at + n > f.d_start + f.d_len {
                    return Ok(None);
                }
                let buf = self.frame(s, bi, k, &f)?;
                Ok(Some((buf, (at - f.d_start) as usize)))
            }
            Plan::Whole { one_frame } => {
                let buf = self.whole(s, bi, *one_frame)?;
                buf.range(at as usize, n as usize)
                    .map_err(|why| self.unit_error(s, bi, why))?;
                Ok(Some((buf, at as usize)))
            }
            Plan::Spill { .. } => Ok(None),
        }
    }
}
