//! Fetching an object's blocks: the ranged GETs that bring a run of
//! blocks into its cache file, pinned to what was opened (`If-Match`),
//! and the flights readers of those blocks wait on.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::source::error::{FetchError, FetchKind};
use crate::source::sums::Summing;

use super::failures::{fetch_error, not_encoded};
use super::object::{Bits, FETCHED, Object, REQUESTS};
use super::{backoff, runtime};

/// A request under way for some blocks; its readers wait here.
#[derive(Default)]
pub(super) struct Flight {
    pub(super) done: Mutex<Option<std::result::Result<(), FetchError>>>,
    pub(super) cv: Condvar,
}

impl Flight {
    /// Ends the flight with `r`, unless it ended already (a block that
    /// arrived keeps its success when a later block of its request fails).
    pub(super) fn finish(&self, r: std::result::Result<(), FetchError>) {
        let mut g = self.done.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(r);
        }
        drop(g);
        self.cv.notify_all();
    }

    pub(super) fn wait(&self, until: Instant) -> std::result::Result<(), FetchError> {
        let mut g = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            let now = Instant::now();
            if now >= until {
                return Err(FetchError::new(
                    FetchKind::TimedOut,
                    "no answer from the server in time",
                ));
            }
            g = self
                .cv
                .wait_timeout(g, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Object {
    /// How long a reader waits for a flight before giving up: every retry
    /// at its time limit, with backoff, and a margin.
    pub(super) fn patience(&self) -> Duration {
        let o = &self.client.opts;
        o.timeout * (o.retries as u32 + 2) + Duration::from_secs(5 * (o.retries as u64 + 1))
    }

    /// Starts requests for `blocks` (each led by this call: its flights are
    /// in the map), split into `pieces` requests.
    pub(super) fn launch(&self, run: Range<u64>, pieces: u64, flights: Vec<Arc<Flight>>) {
        let n = run.end - run.start;
        let pieces = pieces.clamp(1, n.max(1));
        let per = n.div_ceil(pieces);
        let mut at = run.start;
        let mut fl = flights.into_iter();
        // This process's runtime (a daemon forks after open).
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(e) => {
                // Its readers add the label (see `Object::ensure_once`).
                let why = FetchError::failed(format!("cannot start the I/O runtime: {e}"));
                let mut map = self.flights.lock().unwrap_or_else(|p| p.into_inner());
                for b in run {
                    map.remove(&b);
                }
                for f in fl {
                    f.finish(Err(why.clone()));
                }
                return;
            }
        };
        while at < run.end {
            let end = (at + per).min(run.end);
            let mine: Vec<Arc<Flight>> = fl.by_ref().take((end - at) as usize).collect();
            let Some(me) = self.me.upgrade() else { return };
            let blocks = at..end;
            rt.spawn(async move {
                // Held until the blocks are marked present (or failed):
                // another mount of the object waits for them, then has them.
                // Each block's readers go on as soon as it arrived
                // ([`Object::arrived`]); the rest end here.
                let (r, _held) = me.fetch_locked(blocks.clone()).await;
                if let Err(why) = &r {
                    log::debug!("{}: blocks {blocks:?}: {why}", me.label);
                }
                {
                    let mut map = me.flights.lock().unwrap_or_else(|p| p.into_inner());
                    for (b, f) in blocks.zip(&mine) {
                        if map.get(&b).is_some_and(|m| Arc::ptr_eq(m, f)) {
                            map.remove(&b);
                        }
                    }
                }
                for f in mine {
                    f.finish(r.clone());
                }
            });
            at = end;
        }
    }

    /// [`Object::fetch`] under the lock of `blocks` that every mount of
    /// the cache file takes, of only those still missing once it is held
    /// (another mount may have fetched them meanwhile). The lock comes
    /// back, for the caller to hold until it has marked them present.
    pub(super) async fn fetch_locked(
        &self,
        blocks: Range<u64>,
    ) -> (std::result::Result<(), FetchError>, Option<File>) {
        let Bits::Shared(live) = &self.present else {
            return (self.fetch(blocks).await, None);
        };
        let path = live.path().to_path_buf();
        let run = blocks.clone();
        // Free, as it is unless another mount fetches them: taken here, at
        // once; else waited for on a blocking thread.
        let held = match crate::source::shared::lock_range(&path, run.clone(), false) {
            Ok(None) => tokio::task::spawn_blocking(move || {
                crate::source::shared::lock_range(&path, run, true)
            })
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r),
            got => got,
        };
        let held = match held {
            Ok(f) => f,
            // Without the lock the blocks are fetched all the same: it
            // only saves a fetch another mount makes.
            Err(e) => {
                log::debug!("{}: cannot lock blocks {blocks:?}: {e}", self.label);
                None
            }
        };
        let missing: Vec<u64> = blocks.filter(|&b| !self.has(b)).collect();
        let (Some(&first), Some(&last)) = (missing.first(), missing.last()) else {
            return (Ok(()), held);
        };
        (self.fetch(first..last + 1).await, held)
    }

    /// Fetches `blocks` into the cache file. object_store's own stores
    /// resume a body cut short themselves, within `--remote-retries`; the
    /// Hub's does not, so for it a body that fails (reset, cut, stalled)
    /// is asked for again here, from the first block it did not fill, with
    /// the same backoff as its requests.
    pub(super) async fn fetch(&self, blocks: Range<u64>) -> std::result::Result<(), FetchError> {
        let tries = match self.client.hub {
            Some(_) => self.client.opts.retries + 1,
            None => 1,
        };
        let (mut from, mut attempt) = (blocks.start, 0);
        loop {
            attempt += 1;
            let mut in_body = false;
            match self.fetch_once(from..blocks.end, &mut in_body).await {
                Err(e) if in_body && attempt < tries && e.kind != FetchKind::NoSpace => {
                    log::info!("{}: {}; asking again", self.label, e.message());
                    tokio::time::sleep(backoff(attempt)).await;
                    match (from..blocks.end).find(|&b| !self.has(b)) {
                        Some(b) => from = b,
                        None => return Ok(()),
                    }
                }
                done => return done,
            }
        }
    }

    /// One GET of `blocks`; `in_body` is set once its answer was taken and
    /// its body is being read.
    pub(super) async fn fetch_once(
        &self,
        blocks: Range<u64>,
        in_body: &mut bool,
    ) -> std::result::Result<(), FetchError> {
        let start = blocks.start * self.block;
        let end = (blocks.end * self.block).min(self.size);
        let what = format!("bytes {start}..{end}");
        if let Some(why) = self.broken.get() {
            return Err(why.clone());
        }
        let _permit = self
            .requests
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| FetchError::failed(format!("{what}: {e}")))?;
        let store = self.client.store().map_err(FetchError::failed)?;
        let opts = GetOptions {
            if_match: self.if_match(),
            version: self.version.clone(),
            range: Some(GetRange::Bounded(start..end)),
            ..Default::default()
        };
        REQUESTS.fetch_add(1, Relaxed);
        let got = store.get_opts(&self.key, opts).await;
        let got = match got {
            Ok(g) => g,
            // A 200 with the whole object for a ranged GET (a plain web
            // server such as `python3 -m http.server`).
            Err(object_store::Error::NotSupported { .. }) => {
                drop(_permit);
                return self.fetch_whole().await;
            }
            Err(e) => return Err(self.refused(&e, &what).await),
        };
        self.same_object(&got.meta)?;
        if got.range != (start..end) {
            return Err(FetchError::failed(format!(
                "{what}: the server sent bytes {:?}",
                got.range
            )));
        }
        not_encoded(&got, &what)?;
        let file = self.file.as_ref().ok_or_else(|| {
            FetchError::failed(format!("{what}: the cache file cannot be written"))
        })?;
        // Each piece of the body goes into the cache file as it arrives:
        // collecting the block first would cost a copy and a fresh buffer
        // per block. A block is marked present once all of it is written
        // (its readers go on then, before the rest of the request), so a
        // body cut short leaves no block believed that it did not fill.
        let mut body = got.into_stream();
        *in_body = true;
        let mut at = start;
        let mut sum = Summing::new(self.key_sum, blocks.start, self.block, self.size);
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| fetch_error(&e).context(&what))?;
            if at + piece.len() as u64 > end {
                // Not the bytes asked for: none of what it sent is kept.
                self.unmark(blocks.clone());
                return Err(FetchError::failed(format!(
                    "{what}: the server sent more than {} bytes",
                    end - start
                )));
            }
            file.write_all_at(&piece, at).map_err(|e| {
                FetchError::write(&e, format!("{what}: cannot write the cache file: {e}"))
            })?;
            // Counted before a block it completes lets its readers go: a
            // reader that then looks at `.ztensor/stats` sees its bytes.
            FETCHED.fetch_add(piece.len() as u64, Relaxed);
            sum.feed(at, &piece, |b, crc| self.arrived(b, crc));
            at += piece.len() as u64;
        }
        if at != end {
            return Err(FetchError::failed(format!(
                "{what}: the server sent {} bytes, not {}",
                at - start,
                end - start
            )));
        }
        Ok(())
    }

    /// The whole object, fetched once into the cache file, for a server
    /// that ignores Range requests: within [`Options::whole_max`](super::Options::whole_max), else
    /// one line saying what to do instead. Once it succeeded, or was
    /// refused for its size, every caller gets that outcome; a fetch that
    /// failed is tried again by the next caller.
    pub(super) async fn fetch_whole(&self) -> std::result::Result<(), FetchError> {
        let mut done = self.whole.lock().await;
        if *done {
            return Ok(());
        }
        let max = self.client.opts.whole_max;
        let r = if self.size > max {
            let msg = format!(
                "the server ignores Range requests (it answers a request for part of the \
                 object with all of it), so the object would have to be fetched whole, and its \
                 {} are over the {} --index-memory allows: serve it from a server that honours \
                 Range (an object store, nginx, caddy), raise --index-memory, or download it \
                 and mount the local copy",
                crate::size::bytes(self.size),
                crate::size::bytes(max)
            );
            // Every later read fails the same way, at once; said once.
            let whole = format!("{}: {msg}", self.label);
            if self.broken.set(FetchError::failed(whole.clone())).is_ok() {
                log::error!("{whole}");
            }
            Err(FetchError::failed(msg))
        } else {
            log::info!(
                "{}: the server ignores Range requests; fetching all {} bytes once",
                self.label,
                self.size
            );
            let r = self.get_whole().await;
            if r.is_ok() {
                self.mark(0..self.blocks());
                self.to_commit();
            }
            r
        };
        // A failure (a full disk, a server that did not answer) is tried
        // again by the next read.
        *done = r.is_ok();
        r
    }

    /// A failed GET of `what`: an object no longer the one pinned (gone,
    /// another ETag) marks it changed for good; any other failure is this
    /// request's (naming where the server redirects it, when it does).
    pub(super) async fn refused(&self, e: &object_store::Error, what: &str) -> FetchError {
        let f = fetch_error(e);
        if f.kind == FetchKind::Changed {
            self.changed(f.message())
        } else {
            self.client.naming_redirect(f).await.context(what)
        }
    }

    pub(super) async fn get_whole(&self) -> std::result::Result<(), FetchError> {
        let what = format!("all {} bytes", self.size);
        let _permit = self
            .requests
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| FetchError::failed(format!("{what}: {e}")))?;
        let store = self.client.store().map_err(FetchError::failed)?;
        let opts = GetOptions {
            if_match: self.if_match(),
            version: self.version.clone(),
            ..Default::default()
        };
        REQUESTS.fetch_add(1, Relaxed);
        let got = match store.get_opts(&self.key, opts).await {
            Ok(g) => g,
            Err(e) => return Err(self.refused(&e, &what).await),
        };
        self.same_object(&got.meta)?;
        not_encoded(&got, &what)?;
        let file = self.file.as_ref().ok_or_else(|| {
            FetchError::failed(format!("{what}: the cache file cannot be written"))
        })?;
        let mut body = got.into_stream();
        let mut at = 0u64;
        // Marked present at the end, all at once (see `fetch_whole`).
        let mut sum = Summing::new(self.key_sum, 0, self.block, self.size);
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| fetch_error(&e).context(&what))?;
            if at + piece.len() as u64 > self.size {
                return Err(FetchError::failed(format!("{what}: the server sent more")));
            }
            file.write_all_at(&piece, at).map_err(|e| {
                FetchError::write(&e, format!("{what}: cannot write the cache file: {e}"))
            })?;
            FETCHED.fetch_add(piece.len() as u64, Relaxed);
            sum.feed(at, &piece, |b, crc| self.fetched(b, crc));
            at += piece.len() as u64;
        }
        if at != self.size {
            return Err(FetchError::failed(format!(
                "{what}: the server sent {at} bytes"
            )));
        }
        Ok(())
    }

    /// The `If-Match` of a GET: the pinned ETag, but a weak one (`W/"…"`),
    /// which never matches there (RFC 9110 compares strongly: a strict
    /// server answers 412 to every GET). Every answer's ETag is compared
    /// with the pinned one all the same ([`Object::same_object`]).
    pub(super) fn if_match(&self) -> Option<String> {
        self.etag.clone().filter(|e| !e.starts_with("W/"))
    }

    /// Whether an answer is of the object pinned at mount: its size, and
    /// its ETag, or where the mount or the answer has none, its
    /// Last-Modified where both have one (a server without ETags, or
    /// without them on its ranged answers, may ignore `If-Match`). Once a
    /// GET's answer carried the ETag (in this mount or another of its cache
    /// files), one without it is another object.
    pub(super) fn same_object(
        &self,
        meta: &object_store::ObjectMeta,
    ) -> std::result::Result<(), FetchError> {
        // Why an answer without the ETag is another object's, when it is.
        let mut dropped = String::new();
        let moved = match (&self.etag, &meta.e_tag) {
            (Some(pinned), Some(now)) => {
                if pinned == now {
                    self.etag_seen_on_get.saw();
                }
                pinned != now
            }
            (Some(_), None) if self.etag_on_gets || self.etag_seen_on_get.seen() => {
                dropped =
                    format!(
                    "; the object's answers carried its ETag before{}, and one without it is \
                     taken as another object's (a server that drops the ETag may ignore If-Match)",
                    self.etag_seen_on_get.path().map_or(String::new(), |p| format!(
                        " (recorded in {}: delete the object's files there to mount it afresh)",
                        p.display()
                    ))
                );
                true
            }
            _ => {
                let now = meta.last_modified.timestamp();
                self.modified.is_some_and(|m| now != 0 && m != now)
            }
        };
        if meta.size == self.size && !moved {
            return Ok(());
        }
        let etag = meta.e_tag.as_deref().unwrap_or("none");
        let modified = match meta.last_modified.timestamp() {
            0 => String::new(),
            _ => format!(", last modified {}", meta.last_modified),
        };
        let pinned_modified = match (&self.etag, self.modified) {
            (None, Some(m)) => chrono::DateTime::from_timestamp(m, 0)
                .map_or(String::new(), |t| format!(", last modified {t}")),
            _ => String::new(),
        };
        Err(self.changed(&format!(
            "pinned at {} bytes, ETag {}{pinned_modified}; the server now says {} bytes, ETag \
             {etag}{modified}{dropped}",
            self.size,
            self.etag.as_deref().unwrap_or("none"),
            meta.size
        )))
    }

    /// Marks the object changed since it was pinned (logged once).
    pub(super) fn changed(&self, why: &str) -> FetchError {
        self.broken
            .get_or_init(|| {
                let msg = format!(
                    "{}: the object changed since mount ({why}); refusing to serve its bytes",
                    self.label
                );
                log::error!("{msg}");
                FetchError::new(FetchKind::Changed, msg)
            })
            .clone()
    }
}
