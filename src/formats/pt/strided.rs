//! A strided tensor (transposed, sliced with a step) gathered into C
//! order from its storage in the open file.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::catalog::Producer;

/// Bytes read from a storage at a time while gathering.
const WINDOW: u64 = 1 << 20;

/// What gathering a strided tensor needs.
#[derive(Debug, Clone)]
pub(super) struct Gather {
    /// The storage's (offset, length) in the file.
    pub(super) storage: (u64, u64),
    pub(super) es: u64,
    /// In elements, as the strides.
    pub(super) offset: u64,
    pub(super) shape: Vec<u64>,
    pub(super) stride: Vec<u64>,
    pub(super) nbytes: u64,
}

pub(super) fn gatherer(file: std::fs::File, g: Gather) -> Producer {
    let (file, g) = (Arc::new(file), Arc::new(g));
    let (f2, g2) = (file.clone(), g.clone());
    let stream: Option<Arc<crate::catalog::StreamFn>> = (band_row(&g) <= MAX_BAND).then(|| {
        Arc::new(
            move |emit: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>| {
                gather_stream(&f2, &g2, MAX_BAND, emit)
            },
        ) as Arc<crate::catalog::StreamFn>
    });
    Producer {
        name: "torch strides",
        stream,
        produce: Arc::new(move |out: &mut Vec<u8>| gather(&file, &g, out)),
    }
}

/// Most bytes of C-order output gathered at once for a spill.
const MAX_BAND: u64 = 32 << 20;

/// Bytes of one index of the first dimension (the whole tensor for a
/// 0-d one).
fn band_row(g: &Gather) -> u64 {
    g.shape
        .iter()
        .skip(1)
        .fold(g.es, |a, &d| a.saturating_mul(d))
}

/// Gathers the tensor in bands of whole indices of its first dimension
/// (at most `max_band` bytes each, or one index, in C order) and hands
/// each on: for a tensor too big for the cache, whose bands go to a spill
/// file.
pub(super) fn gather_stream(
    file: &std::fs::File,
    g: &Gather,
    max_band: u64,
    emit: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    let row = band_row(g);
    let Some((&rows, _)) = g.shape.split_first() else {
        let mut one = Vec::with_capacity(g.nbytes as usize);
        gather(file, g, &mut one)?;
        return emit(&one);
    };
    if g.nbytes == 0 {
        return Ok(());
    }
    let per = (max_band / row.max(1)).clamp(1, rows);
    let mut band = Vec::with_capacity((per * row) as usize);
    let mut i0 = 0;
    while i0 < rows {
        let k = per.min(rows - i0);
        let mut shape = g.shape.clone();
        shape[0] = k;
        let part = Gather {
            storage: g.storage,
            es: g.es,
            offset: g.offset + i0 * g.stride[0],
            shape,
            stride: g.stride.clone(),
            nbytes: k * row,
        };
        band.clear();
        gather(file, &part, &mut band)?;
        emit(&band)?;
        i0 += k;
    }
    Ok(())
}

/// Writes the tensor's elements in C order into `out`, visiting them in
/// the order of their place in the storage (dimensions by falling stride),
/// so the storage is read forward through one window.
pub(super) fn gather(
    file: &std::fs::File,
    g: &Gather,
    out: &mut Vec<u8>,
) -> std::result::Result<(), String> {
    let n = usize::try_from(g.nbytes).map_err(|_| "too large".to_string())?;
    if out.capacity() < n {
        return Err(format!(
            "{n} bytes to gather, over the room given ({} bytes)",
            out.capacity()
        ));
    }
    out.clear();
    out.resize(n, 0);
    if n == 0 {
        return Ok(());
    }
    let nd = g.shape.len();
    // Elements between neighbours along each dimension in the output.
    let mut cstride = vec![1u64; nd];
    for d in (0..nd.saturating_sub(1)).rev() {
        cstride[d] = cstride[d + 1] * g.shape[d + 1];
    }
    // Dimensions of one element never move (their stride may be anything).
    let mut order: Vec<usize> = (0..nd).filter(|&d| g.shape[d] > 1).collect();
    order.sort_by(|&a, &b| g.stride[b].cmp(&g.stride[a]).then(a.cmp(&b)));
    let es = g.es as usize;
    let (base, slen) = g.storage;
    let mut window: Vec<u8> = Vec::new();
    let mut wstart = u64::MAX;
    let mut idx = vec![0u64; nd];
    let (mut s, mut o) = (g.offset, 0u64);
    loop {
        let at = s * g.es;
        if at < wstart || at + g.es > wstart + window.len() as u64 {
            let len = WINDOW.max(g.es).min(slen - at);
            window.resize(len as usize, 0);
            file.read_exact_at(&mut window, base + at)
                .map_err(|e| format!("reading its storage: {e}"))?;
            wstart = at;
        }
        let w = (at - wstart) as usize;
        let dst = (o * g.es) as usize;
        out[dst..dst + es].copy_from_slice(&window[w..w + es]);
        // Next index, the last dimension of `order` fastest.
        let mut k = order.len();
        loop {
            if k == 0 {
                return Ok(());
            }
            k -= 1;
            let d = order[k];
            idx[d] += 1;
            s += g.stride[d];
            o += cstride[d];
            if idx[d] < g.shape[d] {
                break;
            }
            s -= g.stride[d] * g.shape[d];
            o -= cstride[d] * g.shape[d];
            idx[d] = 0;
        }
    }
}

// ---------------------------------------------------------------------------
