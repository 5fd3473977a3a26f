//! Chunked datasets: the chunk index (version 1 B-tree, single chunk,
//! implicit, fixed array) read into a checked list, and the producer that
//! assembles the dataset from its chunks (inflating and unshuffling them)
//! into the buffer the mount's cache gives it.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;

use super::header::{Filter, Index};
use super::read::{Cur, H5, Res, lookup3};

/// Largest chunk (decoded) a dataset may have: the producer holds one
/// chunk's stored and decoded bytes besides the output.
pub const MAX_CHUNK: u64 = 16 << 20;
/// Chunks one dataset may have.
pub const MAX_CHUNKS: u64 = 1 << 20;

/// One stored chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Its cell in the chunk grid, row-major.
    pub cell: u64,
    /// Absolute file position and stored size.
    pub at: u64,
    pub size: u64,
    /// Filters skipped for this chunk (bit i: filter i).
    pub mask: u32,
}

/// The geometry of a chunked dataset.
#[derive(Debug, Clone)]
pub struct Grid {
    pub shape: Vec<u64>,
    pub chunk: Vec<u64>,
    pub elem: u64,
    /// Chunks along each dimension.
    pub cells: Vec<u64>,
    /// Chunks along each dimension of the maximum extent: the grid that
    /// fixed and extensible array indexes number their entries on (an
    /// unlimited dimension counts its current chunks).
    pub max_cells: Vec<u64>,
    /// The one unlimited dimension, if any: extensible arrays number
    /// chunks with it first.
    pub unlimited: Option<usize>,
}

impl Grid {
    /// Checks the chunk dimensions (the layout's, whose last is the element
    /// size) against the dataspace.
    pub fn new(shape: &[u64], dims: &[u64], elem: u64, max: Option<&[u64]>) -> Res<Grid> {
        if shape.is_empty() {
            return Err("a chunked scalar".into());
        }
        if dims.len() != shape.len() + 1 {
            return Err(format!(
                "chunks of {} dimensions for a dataset of {}",
                dims.len().saturating_sub(1),
                shape.len()
            ));
        }
        let chunk = dims[..shape.len()].to_vec();
        if chunk.contains(&0) {
            return Err("a chunk dimension of 0".into());
        }
        let bytes = chunk
            .iter()
            .try_fold(elem, |a, &d| a.checked_mul(d))
            .filter(|&b| b <= MAX_CHUNK)
            .ok_or_else(|| format!("chunks {chunk:?} are over the {MAX_CHUNK}-byte limit"))?;
        let _ = bytes;
        let cells: Vec<u64> = shape
            .iter()
            .zip(&chunk)
            .map(|(s, c)| s.div_ceil(*c))
            .collect();
        let n = cells.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        if n.is_none_or(|n| n > MAX_CHUNKS) {
            return Err(format!("more than {MAX_CHUNKS} chunks"));
        }
        let max = max.filter(|m| m.len() == shape.len());
        let mut unlimited = None;
        let mut max_cells = cells.clone();
        if let Some(m) = max {
            for (d, &x) in m.iter().enumerate() {
                if x == u64::MAX {
                    if unlimited.replace(d).is_some() {
                        unlimited = None;
                        break;
                    }
                } else if x < shape[d] {
                    return Err(format!("dimension {d} is over its maximum {x}"));
                } else {
                    max_cells[d] = x.div_ceil(chunk[d]);
                }
            }
        }
        Ok(Grid {
            shape: shape.to_vec(),
            chunk,
            elem,
            cells,
            max_cells,
            unlimited,
        })
    }

    pub fn ncells(&self) -> u64 {
        self.cells.iter().product()
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk.iter().product::<u64>() * self.elem
    }

    /// Entries of an array index (its grid of maximum extent), bounded.
    fn max_ncells(&self) -> Res<u64> {
        self.max_cells
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= MAX_CHUNKS)
            .ok_or_else(|| format!("an index of more than {MAX_CHUNKS} entries"))
    }

    /// The cell (row-major on the current grid) of entry `idx` of an array
    /// index numbered on the maximum grid, the unlimited dimension first
    /// when `swizzled`; `None` for an entry outside the current extent.
    fn cell_of_entry(&self, idx: u64, swizzled: bool) -> Option<u64> {
        let rank = self.cells.len();
        let mut order: Vec<usize> = (0..rank).collect();
        if let (true, Some(u)) = (swizzled, self.unlimited) {
            order.retain(|&d| d != u);
            order.insert(0, u);
        }
        let mut scaled = vec![0u64; rank];
        let mut rest = idx;
        for &d in order.iter().rev() {
            let n = self.max_cells[d].max(1);
            scaled[d] = rest % n;
            rest /= n;
        }
        if rest != 0 {
            return None;
        }
        let mut cell = 0u64;
        for (&s, &n) in scaled.iter().zip(&self.cells) {
            if s >= n {
                return None;
            }
            cell = cell * n + s;
        }
        Some(cell)
    }

    /// The cell of a chunk starting at element `offsets`.
    fn cell_of(&self, offsets: &[u64]) -> Res<u64> {
        let mut cell = 0u64;
        for ((&o, &c), (&s, &n)) in offsets
            .iter()
            .zip(&self.chunk)
            .zip(self.shape.iter().zip(&self.cells))
        {
            if o % c != 0 || o >= s {
                return Err(format!(
                    "a chunk at {offsets:?} is not on the chunk grid inside the dataset"
                ));
            }
            cell = cell * n + o / c;
        }
        Ok(cell)
    }
}

/// Reads the chunk index into the list of stored chunks, each checked to be
/// on the grid, once, and inside the file.
pub fn list(f: &H5, index: &Index, g: &Grid, filtered: bool) -> Res<Vec<Chunk>> {
    let cb = g.chunk_bytes();
    let mut out = Vec::new();
    match *index {
        Index::Other(what) => {
            return Err(format!("its chunks are indexed by {what}, not read here"));
        }
        Index::Single {
            addr,
            filtered: fsize,
        } => {
            if g.ncells() != 1 {
                return Err("a single-chunk index for a dataset of several chunks".into());
            }
            if !f.undefined(addr) {
                let (size, mask) = fsize.unwrap_or((cb, 0));
                out.push(Chunk {
                    cell: 0,
                    at: addr,
                    size,
                    mask,
                });
            }
        }
        Index::Implicit { addr } => {
            if filtered {
                return Err("an implicit chunk index with filters".into());
            }
            if !f.undefined(addr) {
                for cell in 0..g.ncells() {
                    let at = cell
                        .checked_mul(cb)
                        .and_then(|o| o.checked_add(addr))
                        .ok_or("chunk address overflows")?;
                    out.push(Chunk {
                        cell,
                        at,
                        size: cb,
                        mask: 0,
                    });
                }
            }
        }
        Index::BTreeV1 { addr } => {
            if !f.undefined(addr) {
                let mut seen = HashSet::new();
                btree(f, addr, g, 0, &mut out, &mut seen)?;
            }
        }
        Index::FixedArray { addr } => {
            if !f.undefined(addr) {
                fixed_array(f, addr, g, filtered, &mut out)?;
            }
        }
        Index::ExtensibleArray { addr } => {
            if g.unlimited.is_none() {
                return Err("an extensible array index without one unlimited dimension".into());
            }
            if !f.undefined(addr) {
                extensible_array(f, addr, g, filtered, &mut out)?;
            }
        }
    }
    let mut cells = HashSet::with_capacity(out.len());
    for ch in &mut out {
        if ch.cell >= g.ncells() || !cells.insert(ch.cell) {
            return Err(format!(
                "the chunk index names cell {} twice or outside the grid",
                ch.cell
            ));
        }
        if !filtered && ch.size != cb {
            return Err(format!(
                "an unfiltered chunk of {} bytes where chunks are {cb} bytes",
                ch.size
            ));
        }
        if ch.size > 2 * MAX_CHUNK + 4096 {
            return Err(format!("a chunk stored in {} bytes", ch.size));
        }
        let pos = f.pos(ch.at, ch.size, "chunk")?;
        ch.at = pos as u64;
    }
    out.sort_by_key(|c| c.cell);
    Ok(out)
}

fn btree(
    f: &H5,
    addr: u64,
    g: &Grid,
    depth: usize,
    out: &mut Vec<Chunk>,
    seen: &mut HashSet<u64>,
) -> Res<()> {
    if depth > 32 || !seen.insert(addr) || seen.len() as u64 > g.ncells() + 64 {
        return Err(format!(
            "chunk B-tree node at {addr:#x} is reached twice, too deep or too often"
        ));
    }
    let mut c = f.at(addr, "chunk B-tree node")?;
    c.tag(b"TREE", "chunk B-tree node")?;
    let kind = c.u8("chunk B-tree node")?;
    if kind != 1 {
        return Err(format!(
            "B-tree node at {addr:#x}: type {kind} in a chunk index"
        ));
    }
    let level = c.u8("chunk B-tree node")?;
    let n = c.u16("chunk B-tree node")?;
    c.addr("chunk B-tree node")?;
    c.addr("chunk B-tree node")?;
    let rank = g.shape.len();
    let mut offsets = vec![0u64; rank];
    for _ in 0..n {
        let size = u64::from(c.u32("chunk key")?);
        let mask = c.u32("chunk key")?;
        for o in offsets.iter_mut() {
            *o = c.uint(8, "chunk key")?;
        }
        c.uint(8, "chunk key")?; // the element-size dimension: 0
        let child = c.addr("chunk B-tree child")?;
        if level == 0 {
            if out.len() as u64 >= g.ncells() {
                return Err("the chunk B-tree lists more chunks than the grid has cells".into());
            }
            out.push(Chunk {
                cell: g.cell_of(&offsets)?,
                at: child,
                size,
                mask,
            });
        } else {
            btree(f, child, g, depth + 1, out, seen)?;
        }
    }
    Ok(())
}

fn fixed_array(f: &H5, addr: u64, g: &Grid, filtered: bool, out: &mut Vec<Chunk>) -> Res<()> {
    let o = f.o;
    let head_len = 4 + 1 + 1 + 1 + 1 + f.l + o + 4;
    let head = f.slice(addr, head_len as u64, "fixed array header")?;
    sum_ok(head, "fixed array header")?;
    let mut c = Cur::new(head, o, f.l);
    c.tag(b"FAHD", "fixed array header")?;
    c.skip(1, "fixed array header")?;
    let client = c.u8("fixed array header")?;
    let entry = c.u8("fixed array header")? as u64;
    let bits = c.u8("fixed array header")?;
    let n = c.len("fixed array header")?;
    let dblk = c.addr("fixed array header")?;
    let want_entry = if filtered { o as u64 + 4 + 1 } else { o as u64 };
    if client != u8::from(filtered)
        || entry < want_entry
        || entry > o as u64 + 4 + 8
        || n != g.max_ncells()?
        || bits > 32
    {
        return Err(format!(
            "fixed array header at {addr:#x} disagrees with its dataset (client {client}, \
             entry {entry} bytes, {n} entries for {} chunks, page bits {bits})",
            g.max_ncells()?
        ));
    }
    if f.undefined(dblk) {
        return Ok(());
    }
    let page = 1u64 << bits;
    let paged = n > page;
    let npages = n.div_ceil(page);
    let bitmap = if paged { npages.div_ceil(8) } else { 0 };
    let prefix = 4 + 1 + 1 + o as u64 + bitmap;
    let mut pc = f.at(dblk, "fixed array data block")?;
    pc.tag(b"FADB", "fixed array data block")?;
    pc.skip(2, "fixed array data block")?;
    if pc.addr("fixed array data block")? != addr {
        return Err("a fixed array data block names another header".into());
    }
    let bm = pc
        .bytes(bitmap as usize, "fixed array data block")?
        .to_vec();
    let ctx = Entries {
        o,
        l: f.l,
        entry,
        filtered,
        undef: super::read::undefined(o),
        g,
        swizzled: false,
    };
    if !paged {
        // Prefix and elements share one checksum.
        let len = prefix + n * entry + 4;
        let whole = f.slice(dblk, len, "fixed array data block")?;
        sum_ok(whole, "fixed array data block")?;
        return ctx.read(&whole[prefix as usize..whole.len() - 4], 0, n, out);
    }
    sum_ok(
        f.slice(dblk, prefix + 4, "fixed array data block")?,
        "fixed array data block",
    )?;
    let mut at = dblk
        .checked_add(prefix + 4)
        .ok_or("fixed array overflows")?;
    for p in 0..npages {
        let first = p * page;
        let count = page.min(n - first);
        let len = count * entry + 4;
        if bm[(p / 8) as usize] & (0x80 >> (p % 8)) != 0 {
            let run = f.slice(at, len, "fixed array page")?;
            sum_ok(run, "fixed array page")?;
            ctx.read(&run[..run.len() - 4], first, count, out)?;
        }
        at = at.checked_add(len).ok_or("fixed array overflows")?;
    }
    Ok(())
}

/// How the entries of a fixed or extensible array are stored.
struct Entries<'g> {
    o: usize,
    l: usize,
    /// Bytes of one entry: an address, and for filtered chunks the stored
    /// size and the filter mask.
    entry: u64,
    filtered: bool,
    undef: u64,
    g: &'g Grid,
    /// Entries numbered with the unlimited dimension first.
    swizzled: bool,
}

impl Entries<'_> {
    /// `count` entries from entry `first`; those outside the current extent
    /// or never written are left out.
    fn read(&self, run: &[u8], first: u64, count: u64, out: &mut Vec<Chunk>) -> Res<()> {
        let o = self.o;
        let mut c = Cur::new(run, o, self.l);
        for i in 0..count {
            let a = c.addr("chunk index entry")?;
            let (size, mask) = if self.filtered {
                let s = c.uint(self.entry as usize - o - 4, "chunk index entry")?;
                (s, c.u32("chunk index entry")?)
            } else {
                c.skip(self.entry as usize - o, "chunk index entry")?;
                (self.g.chunk_bytes(), 0)
            };
            let cell = self.g.cell_of_entry(first + i, self.swizzled);
            if let (false, Some(cell)) = (a == self.undef, cell) {
                out.push(Chunk {
                    cell,
                    at: a,
                    size,
                    mask,
                });
            }
        }
        Ok(())
    }
}

/// An extensible array (the index of a dataset with one unlimited
/// dimension): header, index block (its first entries, the data blocks of
/// the first super blocks, the addresses of the other super blocks), super
/// blocks, data blocks. Paged data blocks (from about 131 000 chunks with
/// libhdf5's defaults) are not read.
fn extensible_array(f: &H5, addr: u64, g: &Grid, filtered: bool, out: &mut Vec<Chunk>) -> Res<()> {
    let (o, l) = (f.o, f.l);
    let EaHeader {
        entry,
        max_bits,
        idx_elmts,
        dmin,
        smin,
        page_bits,
        iblock,
    } = ea_header(f, addr, filtered)?;
    let n = g.max_ncells()?;
    if f.undefined(iblock) || n == 0 {
        return Ok(());
    }
    let nsblks = u64::from(1 + max_bits - dmin.ilog2());
    let iblock_nsblks = 2 * u64::from(smin.ilog2());
    let ndblk_addrs = 2 * (smin - 1);
    let nsblk_addrs = nsblks.saturating_sub(iblock_nsblks);
    let ctx = Entries {
        o,
        l,
        entry,
        filtered,
        undef: super::read::undefined(o),
        g,
        swizzled: true,
    };
    // The index block.
    let ib_len = (6 + o as u64)
        .checked_add(idx_elmts * entry)
        .and_then(|x| x.checked_add((ndblk_addrs + nsblk_addrs) * o as u64 + 4))
        .ok_or("extensible array index block overflows")?;
    let ib = f.slice(iblock, ib_len, "extensible array index block")?;
    sum_ok(ib, "extensible array index block")?;
    let mut c = Cur::new(ib, o, l);
    c.tag(b"EAIB", "extensible array index block")?;
    c.skip(2, "extensible array index block")?;
    if c.addr("extensible array index block")? != addr {
        return Err("an extensible array index block names another header".into());
    }
    let first = c.bytes((idx_elmts * entry) as usize, "extensible array index block")?;
    ctx.read(first, 0, idx_elmts.min(n), out)?;
    let mut dblks = Vec::new();
    for _ in 0..ndblk_addrs {
        dblks.push(c.addr("extensible array index block")?);
    }
    let mut sblks = Vec::new();
    for _ in 0..nsblk_addrs {
        sblks.push(c.addr("extensible array index block")?);
    }
    // The super blocks, while they hold entries the dataset has.
    let off_size = max_bits.div_ceil(8) as usize;
    let page = 1u64 << page_bits;
    let (mut start, mut start_dblk) = (idx_elmts, 0u64);
    let mut u = 0u64;
    while start < n && u < nsblks {
        let nd = 1u64 << (u / 2);
        let ne = dmin << u.div_ceil(2);
        if ne > page {
            return Err("paged extensible array data blocks are not read here".into());
        }
        let addrs: Vec<u64> = if u < iblock_nsblks {
            (0..nd)
                .map(|k| {
                    dblks
                        .get((start_dblk + k) as usize)
                        .copied()
                        .unwrap_or(ctx.undef)
                })
                .collect()
        } else {
            let sa = sblks[(u - iblock_nsblks) as usize];
            if f.undefined(sa) {
                vec![ctx.undef; nd as usize]
            } else {
                let sb = ea_block(f, sa, addr, off_size, nd * o as u64, b"EASB")?;
                let mut c = Cur::new(sb, o, l);
                (0..nd)
                    .map(|_| c.addr("extensible array super block"))
                    .collect::<Res<_>>()?
            }
        };
        for (k, da) in addrs.into_iter().enumerate() {
            let at = start + k as u64 * ne;
            if at >= n {
                break;
            }
            if da == ctx.undef {
                continue;
            }
            let run = ea_block(f, da, addr, off_size, ne * entry, b"EADB")?;
            ctx.read(run, at, ne.min(n - at), out)?;
        }
        start = start.saturating_add(nd.saturating_mul(ne));
        start_dblk += nd;
        u += 1;
    }
    Ok(())
}

/// The fields of an extensible array's header that its blocks need.
struct EaHeader {
    /// Bytes of one entry (a chunk's address, and for filtered chunks its
    /// size and filter mask).
    entry: u64,
    /// Bits of the largest index.
    max_bits: u32,
    /// Entries in the index block itself.
    idx_elmts: u64,
    /// Entries of the smallest data block, and data blocks of the smallest
    /// super block (powers of two).
    dmin: u64,
    smin: u64,
    /// Entries of a data block page, as a power of two.
    page_bits: u32,
    /// The index block's address.
    iblock: u64,
}

/// The extensible array header at `addr` (see [`extensible_array`]), once
/// its checksum holds and its fields are ones this reader follows.
fn ea_header(f: &H5, addr: u64, filtered: bool) -> Res<EaHeader> {
    let (o, l) = (f.o, f.l);
    let head_len = 12 + 6 * l + o + 4;
    let head = f.slice(addr, head_len as u64, "extensible array header")?;
    sum_ok(head, "extensible array header")?;
    let mut c = Cur::new(head, o, l);
    c.tag(b"EAHD", "extensible array header")?;
    c.skip(1, "extensible array header")?;
    let client = c.u8("extensible array header")?;
    let entry = u64::from(c.u8("extensible array header")?);
    let max_bits = u32::from(c.u8("extensible array header")?);
    let idx_elmts = u64::from(c.u8("extensible array header")?);
    let dmin = u64::from(c.u8("extensible array header")?);
    let smin = u64::from(c.u8("extensible array header")?);
    let page_bits = u32::from(c.u8("extensible array header")?);
    for _ in 0..6 {
        c.len("extensible array header")?;
    }
    let iblock = c.addr("extensible array header")?;
    let want_entry = if filtered { o as u64 + 5 } else { o as u64 };
    let ok = client == u8::from(filtered)
        && (want_entry..=o as u64 + 12).contains(&entry)
        && dmin.is_power_of_two()
        && smin.is_power_of_two()
        && (1..=64).contains(&max_bits)
        && dmin.ilog2() <= max_bits
        && page_bits <= 32;
    if !ok {
        return Err(format!(
            "extensible array header at {addr:#x} is not one this reader can follow (client \
             {client}, entry {entry} bytes, {max_bits} bits, blocks from {dmin}, super blocks \
             from {smin}, pages of 2^{page_bits})"
        ));
    }
    Ok(EaHeader {
        entry,
        max_bits,
        idx_elmts,
        dmin,
        smin,
        page_bits,
        iblock,
    })
}

/// The body (`body` bytes) of an extensible array's super block
/// (`EASB`) or data block (`EADB`) at `at`, once its checksum, signature
/// and header address (`header`) are checked: what follows the block's
/// offset field (`off_size` bytes).
fn ea_block<'a>(
    f: &H5<'a>,
    at: u64,
    header: u64,
    off_size: usize,
    body: u64,
    tag: &[u8; 4],
) -> Res<&'a [u8]> {
    let what = if tag == b"EASB" {
        "extensible array super block"
    } else {
        "extensible array data block"
    };
    let len = (6 + f.o as u64 + off_size as u64)
        .checked_add(body)
        .and_then(|x| x.checked_add(4))
        .ok_or_else(|| format!("{what} overflows"))?;
    let block = f.slice(at, len, what)?;
    sum_ok(block, what)?;
    let mut c = Cur::new(block, f.o, f.l);
    c.tag(tag, what)?;
    c.skip(2, what)?;
    if c.addr(what)? != header {
        return Err(format!("an {what} names another header"));
    }
    c.skip(off_size, what)?;
    c.bytes(body as usize, what)
}

fn sum_ok(whole: &[u8], what: &str) -> Res<()> {
    let (data, sum) = whole.split_at(whole.len() - 4);
    if lookup3(data) != u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]]) {
        return Err(format!("{what}: checksum mismatch"));
    }
    Ok(())
}

/// The filters a pipeline may hold here: deflate (1) and shuffle (2).
pub fn check_filters(filters: &[Filter], elem: u64) -> Result<(), String> {
    for fl in filters {
        match fl.id {
            1 => {}
            2 => {
                if fl.values.first().is_some_and(|&v| u64::from(v) != elem) {
                    return Err(format!(
                        "a shuffle filter for {}-byte elements on {elem}-byte ones",
                        fl.values[0]
                    ));
                }
            }
            3 => return Err("the fletcher32 filter is not read here".into()),
            4 => return Err("the szip filter is not read here".into()),
            id => {
                return Err(format!(
                    "filter {id} is not read here (deflate and shuffle are)"
                ));
            }
        }
    }
    Ok(())
}

/// Everything the producer needs, owned.
pub struct Assembly {
    pub file: std::sync::Arc<std::fs::File>,
    pub grid: Grid,
    pub chunks: Vec<Chunk>,
    pub filters: Vec<Filter>,
    pub nbytes: u64,
}

impl Assembly {
    /// Appends the dataset's `nbytes` (row-major) to `out`, whose capacity
    /// is at least that; never-written chunks are zeros.
    pub fn produce(&self, out: &mut Vec<u8>) -> Result<(), String> {
        let n = usize::try_from(self.nbytes).map_err(|_| "too large".to_string())?;
        if out.capacity() < n {
            return Err(format!(
                "{n} bytes to make, over the room given ({} bytes)",
                out.capacity()
            ));
        }
        out.clear();
        out.resize(n, 0);
        let cb = self.grid.chunk_bytes() as usize;
        let mut stored = Vec::new();
        let mut decoded = vec![0u8; cb];
        let mut spare = Vec::new();
        for ch in &self.chunks {
            stored.resize(ch.size as usize, 0);
            self.file
                .read_exact_at(&mut stored, ch.at)
                .map_err(|e| format!("chunk {} at byte {}: cannot read it: {e}", ch.cell, ch.at))?;
            self.decode(ch, &stored, &mut decoded, &mut spare)
                .map_err(|e| format!("chunk {} at byte {}: {e}", ch.cell, ch.at))?;
            self.place(ch.cell, &decoded, out);
        }
        Ok(())
    }

    /// The bytes of one band of chunks (those of one index along the first
    /// dimension), at most this many: what [`Assembly::stream`] holds.
    pub const MAX_BAND: u64 = 32 << 20;

    /// Bytes of the largest band: rows of one chunk's height, whole.
    pub fn band_bytes(&self) -> u64 {
        let g = &self.grid;
        g.shape[1..]
            .iter()
            .fold(g.chunk[0].min(g.shape[0]) * g.elem, |a, &d| {
                a.saturating_mul(d)
            })
    }

    /// Makes the dataset's bytes (row-major) band by band, each band of
    /// chunks assembled in a buffer of its own and handed to `emit`: at
    /// most [`Assembly::MAX_BAND`] bytes held, for a spill.
    pub fn stream(&self, emit: &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), String> {
        let g = &self.grid;
        if self.band_bytes() > Self::MAX_BAND {
            return Err(format!(
                "a band of its chunks takes {} bytes, over {}",
                self.band_bytes(),
                Self::MAX_BAND
            ));
        }
        let per_band: u64 = g.cells[1..].iter().product();
        let row_bytes: u64 = g.shape[1..].iter().product::<u64>() * g.elem;
        let mut order: Vec<usize> = (0..self.chunks.len()).collect();
        order.sort_unstable_by_key(|&i| self.chunks[i].cell);
        let cb = g.chunk_bytes() as usize;
        let (mut stored, mut decoded, mut spare) = (Vec::new(), vec![0u8; cb], Vec::new());
        let mut band = Vec::new();
        let mut next = order.iter().peekable();
        for b in 0..g.cells[0] {
            let first_row = b * g.chunk[0];
            let rows = g.chunk[0].min(g.shape[0] - first_row);
            band.clear();
            band.resize((rows * row_bytes) as usize, 0);
            while let Some(&&i) = next.peek() {
                let ch = &self.chunks[i];
                if ch.cell / per_band.max(1) != b {
                    break;
                }
                next.next();
                stored.resize(ch.size as usize, 0);
                self.file.read_exact_at(&mut stored, ch.at).map_err(|e| {
                    format!("chunk {} at byte {}: cannot read it: {e}", ch.cell, ch.at)
                })?;
                self.decode(ch, &stored, &mut decoded, &mut spare)
                    .map_err(|e| format!("chunk {} at byte {}: {e}", ch.cell, ch.at))?;
                self.place_at(ch.cell, &decoded, &mut band, first_row * row_bytes);
            }
            emit(&band)?;
        }
        Ok(())
    }

    /// The chunk's decoded bytes, exactly `decoded.len()` of them.
    fn decode(
        &self,
        ch: &Chunk,
        stored: &[u8],
        decoded: &mut [u8],
        spare: &mut Vec<u8>,
    ) -> Result<(), String> {
        // The pipeline in reverse: the last filter applied is undone first.
        let active: Vec<&Filter> = self
            .filters
            .iter()
            .enumerate()
            .filter(|(i, _)| ch.mask & (1 << i) == 0)
            .map(|(_, f)| f)
            .rev()
            .collect();
        let mut cur: Vec<u8> = Vec::new();
        let mut have_cur = false;
        for fl in active {
            let input: &[u8] = if have_cur { &cur } else { stored };
            match fl.id {
                1 => {
                    inflate(input, decoded)?;
                    cur.clear();
                    cur.extend_from_slice(decoded);
                }
                2 => {
                    if input.len() != decoded.len() {
                        return Err(format!(
                            "{} bytes to unshuffle, {} expected",
                            input.len(),
                            decoded.len()
                        ));
                    }
                    spare.clear();
                    spare.resize(input.len(), 0);
                    unshuffle(input, spare, self.grid.elem as usize);
                    cur.clear();
                    cur.extend_from_slice(spare);
                }
                id => return Err(format!("filter {id} is not read here")),
            }
            have_cur = true;
        }
        let last: &[u8] = if have_cur { &cur } else { stored };
        if last.len() != decoded.len() {
            return Err(format!(
                "{} bytes decoded, the chunk holds {}",
                last.len(),
                decoded.len()
            ));
        }
        decoded.copy_from_slice(last);
        Ok(())
    }

    /// Copies the part of chunk `cell` inside the dataset into `out`.
    fn place(&self, cell: u64, chunk: &[u8], out: &mut [u8]) {
        self.place_at(cell, chunk, out, 0);
    }

    /// Copies the part of chunk `cell` inside the dataset into `out`, which
    /// holds the dataset's bytes from `base` on.
    fn place_at(&self, cell: u64, chunk: &[u8], out: &mut [u8], base: u64) {
        let g = &self.grid;
        let rank = g.shape.len();
        // The chunk's first element, per dimension.
        let mut start = vec![0u64; rank];
        let mut rest = cell;
        for d in (0..rank).rev() {
            start[d] = (rest % g.cells[d]) * g.chunk[d];
            rest /= g.cells[d];
        }
        // Extent of the chunk inside the dataset.
        let ext: Vec<u64> = (0..rank)
            .map(|d| g.chunk[d].min(g.shape[d] - start[d]))
            .collect();
        let row = (ext[rank - 1] * g.elem) as usize;
        // Walk every row (all dims but the last) of the inside part.
        let mut idx = vec![0u64; rank - 1];
        loop {
            let (mut src, mut dst) = (0u64, 0u64);
            for d in 0..rank - 1 {
                src = src * g.chunk[d] + idx[d];
                dst = dst * g.shape[d] + start[d] + idx[d];
            }
            src = (src * g.chunk[rank - 1]) * g.elem;
            dst = (dst * g.shape[rank - 1] + start[rank - 1]) * g.elem;
            let (s, t) = (src as usize, (dst - base) as usize);
            out[t..t + row].copy_from_slice(&chunk[s..s + row]);
            // Next row index.
            let mut d = rank - 1;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < ext[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

/// Inflates one zlib stream into exactly `out`: more or fewer bytes, or a
/// stream that does not end, is an error. Never writes past `out`.
fn inflate(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    use flate2::{Decompress, FlushDecompress, Status};
    let mut d = Decompress::new(true);
    let mut probe = [0u8; 1];
    loop {
        let (i, o) = (d.total_in() as usize, d.total_out() as usize);
        let full = o == out.len();
        let dst: &mut [u8] = if full { &mut probe } else { &mut out[o..] };
        let st = d
            .decompress(&input[i..], dst, FlushDecompress::None)
            .map_err(|e| format!("deflate: {e}"))?;
        if full && d.total_out() as usize > o {
            return Err(format!(
                "deflate: inflates to more than the chunk's {} bytes",
                out.len()
            ));
        }
        if st == Status::StreamEnd {
            break;
        }
        if d.total_out() as usize == o && d.total_in() as usize == i {
            return Err("deflate: the stream is cut short or corrupt".into());
        }
    }
    if d.total_out() as usize != out.len() {
        return Err(format!(
            "deflate: {} bytes where the chunk holds {}",
            d.total_out(),
            out.len()
        ));
    }
    Ok(())
}

/// Undoes HDF5's shuffle: byte b of element i was stored at b*n + i.
fn unshuffle(input: &[u8], out: &mut [u8], es: usize) {
    if es <= 1 {
        out.copy_from_slice(input);
        return;
    }
    let n = input.len() / es;
    for b in 0..es {
        let plane = &input[b * n..(b + 1) * n];
        for (i, &x) in plane.iter().enumerate() {
            out[i * es + b] = x;
        }
    }
    let tail = n * es;
    out[tail..].copy_from_slice(&input[tail..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unshuffle_inverts_shuffle() {
        let data: Vec<u8> = (0..23).collect();
        let es = 4;
        let n = data.len() / es;
        let mut shuffled = vec![0u8; data.len()];
        for i in 0..n {
            for b in 0..es {
                shuffled[b * n + i] = data[i * es + b];
            }
        }
        shuffled[n * es..].copy_from_slice(&data[n * es..]);
        let mut back = vec![0u8; data.len()];
        unshuffle(&shuffled, &mut back, es);
        assert_eq!(back, data);
    }

    #[test]
    fn inflate_refuses_more_than_its_room() {
        use std::io::Write;
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&[7u8; 1000]).unwrap();
        let z = e.finish().unwrap();
        let mut exact = vec![0u8; 1000];
        inflate(&z, &mut exact).unwrap();
        assert!(exact.iter().all(|&b| b == 7));
        let mut small = vec![0u8; 999];
        assert!(inflate(&z, &mut small).is_err());
        let mut big = vec![0u8; 1001];
        assert!(inflate(&z, &mut big).is_err());
        assert!(inflate(&z[..z.len() / 2], &mut exact).is_err());
    }
}
