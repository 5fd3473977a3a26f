//! The checks a blob (or a whole source file) must pass before any of its
//! bytes is served: digests of the stored or decoded bytes, and the value
//! rules of some element types.

use crate::catalog::{Blob, Catalog, Check, Checksum, Codec, Verdict};
use crate::codec::digest::Hasher;
use crate::serve::error::ReadError;
use crate::serve::guard::Guard;
use crate::source::{MappedFile, Span};

/// Bytes hashed between two hand-backs of the mapping.
const CHUNK: usize = 8 << 20;

#[derive(Debug, Clone)]
pub enum Failed {
    /// A digest does not match.
    Mismatch(String),
    /// The bytes break a rule of their type, or do not decode.
    Data(String),
    /// A failure that names its file and blob already (the guard's, when
    /// the file changed, or the data layer's): given as it is.
    Whole(ReadError),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Mismatch(w) | Failed::Data(w) => f.write_str(w),
            Failed::Whole(e) => e.fmt(f),
        }
    }
}

/// Whether the blob's checks, which run before its first byte is served,
/// vouch for all of its bytes (a digest this reader can compute).
pub fn vouched(b: &Blob) -> bool {
    b.checks.iter().any(|c| match c {
        Check::Stored(d) | Check::Decoded(d) => d.algorithm().is_some(),
        _ => false,
    })
}

/// Runs the checks of blob `b`, stored at `span`, that can be run over
/// its stored bytes: its stored digests, and for a raw blob all of them.
/// A zstd blob's checks of its decoded bytes are run by the data layer as
/// it decodes ([`Decoded`]), and a computed blob's as it is made
/// ([`produced`]).
pub fn stored(b: &Blob, span: &Span, guard: &Guard) -> Result<(), Failed> {
    let raw = matches!(b.codec, Codec::Raw);
    let mut stored: Vec<_> = b
        .checks
        .iter()
        .filter_map(|c| match c {
            Check::Stored(d) => hasher(d, &b.label),
            _ => None,
        })
        .collect();
    let mut decoded = raw.then(|| Decoded::new(b)).flatten();
    if stored.is_empty() && decoded.is_none() || matches!(b.codec, Codec::Computed(_)) {
        return Ok(());
    }
    for chunk in span.bytes().chunks(CHUNK) {
        for (_, h) in stored.iter_mut() {
            h.update(chunk);
        }
        if let Some(d) = decoded.as_mut() {
            d.feed(chunk);
        }
        span.release(chunk);
    }
    guard.verdict().map_err(Failed::Whole)?;
    for (want, h) in stored {
        judge(&want, h, "stored bytes")?;
    }
    decoded.map_or(Ok(()), Decoded::finish)
}

/// The checks of a blob's decoded bytes, fed those bytes in order.
pub struct Decoded {
    digests: Vec<(Checksum, Hasher)>,
    rules: Rules,
}

impl Decoded {
    /// `None` when the blob has no check of its decoded bytes.
    pub fn new(b: &Blob) -> Option<Decoded> {
        let mut d = Decoded {
            digests: Vec::new(),
            rules: Rules::default(),
        };
        for c in &b.checks {
            match *c {
                Check::Decoded(ref x) => d.digests.extend(hasher(x, &b.label)),
                Check::BoolBytes => d.rules.bool_bytes = true,
                Check::ZeroLastNibble => d.rules.zero_last_nibble = true,
                // A raw blob's bytes are all fed here, before any is served
                // (a stored npz member: its header, then a bool tensor).
                Check::BoolBytesIn { start, len } if matches!(b.codec, Codec::Raw) => {
                    d.rules.bools_in.push((start, len))
                }
                // Else checked per part, as its range is first read.
                Check::Stored(_) | Check::BoolBytesIn { .. } => {}
            }
        }
        (!d.digests.is_empty() || d.rules.any()).then_some(d)
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        for (_, h) in self.digests.iter_mut() {
            h.update(chunk);
        }
        self.rules.feed(chunk);
    }

    pub fn finish(self) -> Result<(), Failed> {
        for (want, h) in self.digests {
            judge(&want, h, "decoded bytes")?;
        }
        self.rules.verdict()
    }
}

/// Runs the checks of a computed blob over the bytes it produced (it has
/// no stored bytes of its own: a stored digest is taken as over them).
pub fn produced(b: &Blob, bytes: &[u8]) -> Result<(), Failed> {
    for c in &b.checks {
        if let Check::Stored(d) = c
            && let Some((want, mut h)) = hasher(d, &b.label)
        {
            h.update(bytes);
            judge(&want, h, "decoded bytes")?;
        }
    }
    let Some(mut d) = Decoded::new(b) else {
        return Ok(());
    };
    d.feed(bytes);
    d.finish()
}

/// The digest's hasher, or `None` (with a warning) for an algorithm this
/// reader does not know: such data is served unverified.
fn hasher(d: &Checksum, label: &str) -> Option<(Checksum, Hasher)> {
    match d.algorithm() {
        Some(algo) => Some((d.clone(), Hasher::new(algo))),
        None => {
            log::warn!("{label}: checksum {d} uses an unknown algorithm; served unverified");
            None
        }
    }
}

fn judge(want: &Checksum, h: Hasher, over: &str) -> Result<(), Failed> {
    match want.judge(h.finish()) {
        Verdict::Mismatch { expected, actual } => Err(Failed::Mismatch(format!(
            "checksum mismatch over the {over}: the file says {expected}, the bytes have {actual}"
        ))),
        _ => Ok(()),
    }
}

/// Value rules checked over the decoded bytes as they pass.
#[derive(Default)]
struct Rules {
    bool_bytes: bool,
    /// Ranges (start, length) of bool elements within the bytes.
    bools_in: Vec<(u64, u64)>,
    zero_last_nibble: bool,
    /// Offset of the first byte that is neither 0 nor 1.
    bad_bool: Option<u64>,
    seen: u64,
    last: Option<u8>,
}

impl Rules {
    fn any(&self) -> bool {
        self.bool_bytes || self.zero_last_nibble || !self.bools_in.is_empty()
    }

    fn feed(&mut self, chunk: &[u8]) {
        if self.bool_bytes
            && self.bad_bool.is_none()
            && let Some(i) = chunk.iter().position(|&b| b > 1)
        {
            self.bad_bool = Some(self.seen + i as u64);
        }
        let (c0, c1) = (self.seen, self.seen + chunk.len() as u64);
        for &(start, len) in &self.bools_in {
            let (a, b) = (start.max(c0), start.saturating_add(len).min(c1));
            if self.bad_bool.is_some() || a >= b {
                continue;
            }
            let bytes = &chunk[(a - c0) as usize..(b - c0) as usize];
            if let Some(i) = bytes.iter().position(|&x| x > 1) {
                // Counted from the start of its bool elements.
                self.bad_bool = Some(a - start + i as u64);
            }
        }
        self.seen += chunk.len() as u64;
        if let Some(&b) = chunk.last() {
            self.last = Some(b);
        }
    }

    fn verdict(&self) -> Result<(), Failed> {
        if let Some(at) = self.bad_bool {
            return Err(Failed::Data(format!(
                "bool element {at} is neither 0 nor 1"
            )));
        }
        if self.zero_last_nibble && self.last.is_some_and(|b| b >> 4 != 0) {
            return Err(Failed::Data(
                "the unused high nibble of the last byte of packed 4-bit elements is not zero"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The checks of source file `i` as a whole: the size and digest the
/// catalog says it must have (a shard table does).
pub fn source(catalog: &Catalog, i: usize, file: &MappedFile, guard: &Guard) -> Result<(), String> {
    let Some(r) = catalog.sources.get(i) else {
        return Ok(());
    };
    if let Some(size) = r.size
        && size != file.len()
    {
        return Err(format!(
            "{}: is {} bytes, {} says it must be {size}",
            file.label(),
            file.len(),
            catalog.label
        ));
    }
    let Some(d) = &r.digest else {
        return Ok(());
    };
    let (at, len) = r.digest_span.unwrap_or((0, file.len()));
    let Some(covered) = at
        .checked_add(len)
        .filter(|&end| end <= file.len())
        .map(|end| &file.bytes()[at as usize..end as usize])
    else {
        return Err(format!(
            "{}: its digest covers bytes [{at}, {at}+{len}), past its end ({} bytes)",
            file.label(),
            file.len()
        ));
    };
    let Some(algo) = d.algorithm() else {
        log::warn!(
            "{}: digest {d} uses an unknown algorithm; served unverified",
            file.label()
        );
        return Ok(());
    };
    log::info!(
        "{}: checking its digest ({len} bytes) before serving it",
        file.label()
    );
    let mut h = Hasher::new(algo);
    for chunk in covered.chunks(CHUNK) {
        h.update(chunk);
        file.release(chunk);
    }
    guard.check()?;
    match d.judge(h.finish()) {
        Verdict::Mismatch { expected, actual } => Err(format!(
            "{}: checksum mismatch: {} says {expected}, the file has {actual}",
            file.label(),
            catalog.label
        )),
        _ => Ok(()),
    }
}
