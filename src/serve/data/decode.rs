//! Decoding: frames into the cache (read ahead of in-order readers),
//! whole units, computed blobs, and one frame decoded as it is read.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::catalog::Producer;
use crate::codec::zstd as zstd_blob;
use crate::codec::zstd::Frame;
use crate::serve::cache::Buf;
use crate::serve::error::{Kind, ReadError};
use crate::serve::filling::Writer;
use crate::serve::guard::Guard;
use crate::serve::stats::Stats;

use super::plan::frame_at;
use super::{
    Data, Discard, PREFETCH_DEPTH, PROGRESSIVE_STEP, Plan, STEP_REACH, Served, Slot, checks,
    lower_priority,
};

impl Data {
    /// Copies decoded bytes `[at, at+out.len())` into `out`.
    pub(super) fn fetch(
        &self,
        s: &Served,
        bi: usize,
        plan: &Plan,
        at: u64,
        out: &mut [u8],
    ) -> Result<(), ReadError> {
        match plan {
            Plan::Frames(frames) => {
                let mut pos = at;
                let mut done = 0usize;
                let mut k = frame_at(frames, at);
                while done < out.len() {
                    let f = frames[k];
                    let buf = self.frame(s, bi, k, &f)?;
                    let from = (pos - f.d_start) as usize;
                    let n = (buf.len() - from).min(out.len() - done);
                    let bytes = buf
                        .range(from, n)
                        .map_err(|why| self.unit_error(s, bi, why))?;
                    out[done..done + n].copy_from_slice(bytes);
                    done += n;
                    pos += n as u64;
                    k += 1;
                }
                Ok(())
            }
            Plan::Whole { one_frame } => {
                let buf = self.whole(s, bi, *one_frame)?;
                let bytes = buf
                    .range(at as usize, out.len())
                    .map_err(|why| self.unit_error(s, bi, why))?;
                out.copy_from_slice(bytes);
                Ok(())
            }
            Plan::Spill { one_frame } => self
                .spill(s, bi, *one_frame)?
                .read(at, out)
                .map_err(|why| self.unit_error(s, bi, why)),
        }
    }

    pub(super) fn frame(
        &self,
        s: &Served,
        bi: usize,
        k: usize,
        f: &Frame,
    ) -> Result<Arc<Buf>, ReadError> {
        let out = self.decode_frame(s, bi, k, f);
        s.guard.verdict()?;
        self.read_ahead(bi, k);
        out.map_err(|why| self.fail(bi, why.context(format_args!("frame {k}"))))
    }

    /// Frame `k` of blob `bi`, from the cache or decoded into it.
    pub(super) fn decode_frame(
        &self,
        s: &Served,
        bi: usize,
        k: usize,
        f: &Frame,
    ) -> Result<Arc<Buf>, ReadError> {
        let b = self.blob(bi);
        s.file.ensure(b.offset + f.c_start, f.c_len)?;
        let src = s.file.range(b.offset + f.c_start, f.c_len);
        self.cache
            .get((bi as u32, k as u32), f.d_len, |dst| {
                let r = zstd_blob::decode_frame(src, dst, f.d_len as usize);
                s.file.release(src);
                r
            })
            .map_err(ReadError::from)
    }

    /// After frame `k` of a tensor read in order, queues decodes of the
    /// next frames so they are ready (or under way) when the reader gets
    /// there. Random readers get no read-ahead.
    pub(super) fn read_ahead(&self, bi: usize, k: usize) {
        let st = &self.states[bi];
        let prev = st.last_frame.swap(k, Relaxed);
        if prev != k && prev.wrapping_add(1) != k {
            // A jump: what was queued ahead of the old position says
            // nothing about this one (a new pass starts at frame 0).
            st.ahead.store(k, Relaxed);
            return;
        }
        let Some(Ok(Plan::Frames(frames))) = st.plan.get() else {
            return;
        };
        let biggest = frames.iter().map(|f| f.d_len).max().unwrap_or(1).max(1);
        // Never let read-ahead take more than a quarter of the cache.
        let depth = (self.cache.limit() / 4 / biggest).min(PREFETCH_DEPTH) as usize;
        let last = (k + depth).min(frames.len() - 1);
        // Frames queued by the previous read of this pass are not queued
        // again. A mark outside this reader's window is another pass's (an
        // earlier full read, another reader): start from here.
        let mark = st.ahead.load(Relaxed);
        let first = if (k..=last).contains(&mark) {
            mark + 1
        } else {
            k + 1
        };
        let mut reached = first.saturating_sub(1);
        for j in first..=last {
            if !self.cache.has((bi as u32, j as u32)) {
                let me = self.me.clone();
                let queued = self.prefetcher.submit(Box::new(move || {
                    if let Some(data) = me.upgrade() {
                        data.prefetch(bi, j);
                    }
                }));
                // A full queue: the next read tries these again.
                if !queued {
                    break;
                }
            }
            reached = j;
        }
        st.ahead.store(reached, Relaxed);
    }

    pub(super) fn prefetch(&self, bi: usize, k: usize) {
        // Queued twice, or already picked up by a reader: nothing to do, and
        // no waiting for someone else's decode.
        if self.cache.has((bi as u32, k as u32)) {
            return;
        }
        let Some(Ok(Plan::Frames(frames))) = self.states[bi].plan.get() else {
            return;
        };
        let (Some(f), Some(Some(s))) = (frames.get(k), self.files.get(self.blob(bi).source)) else {
            return;
        };
        // Errors surface when a reader asks for this frame itself.
        let _ = self.decode_frame(s, bi, k, f);
    }

    /// A unit that failed while a reader waited for it: the file changing
    /// under the mount is said as such, anything else names the tensor.
    pub(super) fn unit_error(&self, s: &Served, bi: usize, why: impl Into<ReadError>) -> ReadError {
        match s.guard.verdict() {
            Err(changed) => changed,
            Ok(()) => self.fail(bi, why),
        }
    }

    pub(super) fn whole(
        &self,
        s: &Served,
        bi: usize,
        one_frame: bool,
    ) -> Result<Arc<Buf>, ReadError> {
        let decoded = self.blob(bi).decoded_len;
        self.ensure_blob(s, bi)?;
        let span = self.span(s, bi);
        let src = span.bytes();
        let key = (bi as u32, 0);
        // Big units are decoded on a thread of their own into a buffer
        // faulted in ahead of it; their bytes are published as they come
        // only when nothing checks them at the end ([`Data::trusted_early`]),
        // else all at once when the stream has been checked to its end.
        let out = if decoded >= self.opts.progressive_min {
            let early = self.trusted_early(bi, src, one_frame);
            self.cache.get_filling(
                key,
                decoded,
                || self.unit_file(decoded),
                |buf| self.start_decoder(bi, buf, early),
            )
        } else {
            self.cache.get(key, decoded, |dst| {
                let r = zstd_blob::decode_to_vec(src, dst, decoded as usize);
                span.release(src);
                r
            })
        };
        s.guard.verdict()?;
        out.map_err(|why| self.fail(bi, why))
    }

    /// A computed blob, made whole into the cache (once, whoever asks),
    /// its checks run over it before anyone is served.
    /// The refusal of computed blob `bi`, made whole by `p`, for being over
    /// half the cache.
    pub(super) fn too_large(&self, bi: usize, p: &Producer) -> ReadError {
        let why = format!(
            "its {} bytes are made whole by the {} reader, and that exceeds half the cache ({} \
             bytes): mount with a larger --cache-size",
            self.blob(bi).decoded_len,
            p.name,
            self.cache.limit()
        );
        self.fail(bi, ReadError::new(Kind::TooLarge, why))
    }

    pub(super) fn computed(
        &self,
        s: &Served,
        bi: usize,
        p: &Producer,
    ) -> Result<Arc<Buf>, ReadError> {
        let b = self.blob(bi);
        let limit = self.cache.limit();
        self.ensure_blob(s, bi)?;
        if b.decoded_len > limit / 2 {
            return Err(self.too_large(bi, p));
        }
        let out = self.cache.get((bi as u32, 0), b.decoded_len, |dst| {
            dst.clear();
            (p.produce)(dst)?;
            if dst.len() as u64 != b.decoded_len {
                return Err(format!(
                    "the {} reader made {} bytes, expected {}",
                    p.name,
                    dst.len(),
                    b.decoded_len
                ));
            }
            if let Err(f) = checks::produced(b, dst) {
                if let checks::Failed::Mismatch(_) = f {
                    Stats::add(&self.stats.checksum_failures, 1);
                }
                return Err(f.to_string());
            }
            Ok(())
        });
        s.guard.verdict()?;
        out.map_err(|why| self.fail(bi, why))
    }

    /// Whether bytes of `src` may be served before its frame has ended. The
    /// end of a zstd frame is where zstd checks its own content checksum; a
    /// blob is trusted early if its checks (done before any byte is served)
    /// vouched for its bytes, or if it is one frame without a checksum.
    /// (A blob whose first frame declares the whole size is served from that
    /// frame only: anything after it fails before the last byte is out.)
    pub(super) fn trusted_early(&self, bi: usize, src: &[u8], one_frame: bool) -> bool {
        checks::vouched(self.blob(bi))
            || (one_frame && zstd_blob::frame_has_checksum(src) == Some(false))
    }

    /// Decodes a filling unit on a thread of its own, one per core at most;
    /// past that the reader that asked decodes it on its own thread.
    pub(super) fn start_decoder(&self, bi: usize, buf: Arc<Buf>, early: bool) {
        // A thread at low priority faults the buffer in ahead of the decoder,
        // wherever that runs: the decoder is the bound, and on two cores it
        // must not share its core with the faulting. It holds the buffer
        // weakly between pieces, so an evicted unit is let go of at once.
        let weak = Arc::downgrade(&buf);
        let _ = std::thread::Builder::new()
            .name("zt-populate".into())
            .spawn(move || {
                lower_priority();
                let mut at = 0;
                while let Some(b) = weak.upgrade()
                    && let Some(f) = b.filling()
                    && f.populate_step(&mut at)
                {}
            });
        if self.decoders.fetch_add(1, Relaxed) < self.max_decoders
            && let Some(me) = self.me.upgrade()
        {
            let b = buf.clone();
            let spawned = std::thread::Builder::new()
                .name("zt-decode".into())
                .spawn(move || {
                    let _slot = Slot(&me.decoders);
                    me.decode_filling(bi, &b, early);
                });
            if spawned.is_ok() {
                return;
            }
        }
        self.decoders.fetch_sub(1, Relaxed);
        self.decode_filling(bi, &buf, early);
    }

    pub(super) fn decode_filling(&self, bi: usize, buf: &Arc<Buf>, early: bool) {
        let Some(Some(s)) = self.files.get(self.blob(bi).source) else {
            return;
        };
        let Some(mut w) = buf.filling().and_then(|f| f.writer()) else {
            return;
        };
        // Whatever happens below, even a panic, a failed unit leaves the
        // cache, so the next reader starts again (and fails again, with the
        // reason) instead of finding a dead one.
        let mut discard = Discard {
            cache: &self.cache,
            key: (bi as u32, 0),
            buf,
            armed: true,
        };
        let span = self.span(s, bi);
        let r = self.decode_progressively(&s.guard, span.reader(), &mut w, buf.len(), early);
        // The plan and the trust check read the frame header through the
        // mapping; let go of it with the rest.
        span.release_all();
        if r.is_ok() {
            Stats::add(&self.stats.decompressed_bytes, buf.len() as u64);
            discard.armed = false;
        }
        // Out of the cache before readers hear of the failure.
        drop(discard);
        w.finish(r.map_err(|e| e.to_string()));
    }

    /// Decodes `src` straight into `w`, claiming each step's reach first
    /// (see [`Writer::claim`]). With `early`, what is there is
    /// published after each step, the last byte only
    /// once the stream has been checked to its end, so a reader of the
    /// whole tensor never gets all of a blob that fails after it; without,
    /// nothing is published before that end (a frame checksum covers it).
    ///
    /// The buffer is faulted in ahead by the populate thread
    /// ([`Data::start_decoder`]), not here: on two cores, faulting from both
    /// threads at once slowed the decoder more than it saved (measured on
    /// the project's 2-core VM).
    pub(super) fn decode_progressively(
        &self,
        guard: &Guard,
        src: zstd_blob::Source<'_>,
        w: &mut Writer,
        len: usize,
        early: bool,
    ) -> Result<(), ReadError> {
        // SAFETY: the writer's buffer is `len` bytes, lives as long as `w`
        // (which outlives the decoder), and only this decoder writes it, at
        // or past what was committed.
        let mut dec = unsafe { zstd_blob::DirectDecoder::new(src, w.as_mut_ptr(), len) }?;
        while dec.produced() < len {
            w.claim(dec.produced() + PROGRESSIVE_STEP + STEP_REACH);
            let stepped = dec.step_output(PROGRESSIVE_STEP);
            // Bytes decoded from a file that changed are not published; and
            // a change explains a failed step (a short read) best.
            guard.check()?;
            stepped?;
            if early {
                w.commit_to(dec.produced().min(len.saturating_sub(1)));
            }
        }
        dec.finish()?;
        w.commit_to(len);
        Ok(())
    }
}
