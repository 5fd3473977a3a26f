//! Dense link storage: a group's links kept as objects in a fractal heap,
//! found through the version 2 B-tree that indexes them by name.
//!
//! The heap's direct blocks are found by walking its indirect blocks (the
//! doubling table); each B-tree record holds a heap ID, the object's
//! offset and length in the heap's address space, which must fall inside
//! one direct block. Filtered heaps and huge or tiny objects are refused.

use super::read::{Cur, H5, Res, lookup3};

/// Direct blocks one heap may have, and B-tree nodes one index may have.
const MAX_BLOCKS: usize = 1 << 16;
const MAX_NODES: usize = 1 << 16;
/// Bytes of one v2 B-tree node (libhdf5 writes 512), and records one index
/// may hold.
const MAX_NODE: u64 = 1 << 20;
const MAX_RECORDS: u64 = 1 << 20;

struct Heap {
    id_len: usize,
    off_size: usize,
    len_size: usize,
    /// (heap offset, absolute file position, size) of each direct block.
    blocks: Vec<(u64, usize, u64)>,
    /// Blocks visited, direct and indirect (a forged heap may name one
    /// block from many places).
    visits: usize,
}

fn bytes_for_bits(bits: u32) -> usize {
    bits.div_ceil(8) as usize
}

fn log2(n: u64) -> u32 {
    63 - n.max(1).leading_zeros()
}

fn sum_ok(whole: &[u8], what: &str) -> Res<()> {
    let (data, sum) = whole.split_at(whole.len() - 4);
    if lookup3(data) != u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]]) {
        return Err(format!("{what}: checksum mismatch"));
    }
    Ok(())
}

fn heap(f: &H5, addr: u64) -> Res<Heap> {
    let (o, l) = (f.o, f.l);
    let mut c = f.at(addr, "fractal heap")?;
    c.tag(b"FRHP", "fractal heap")?;
    let version = c.u8("fractal heap")?;
    if version != 0 {
        return Err(format!("fractal heap version {version}"));
    }
    let id_len = c.u16("fractal heap")? as usize;
    let filters_len = c.u16("fractal heap")?;
    c.u8("fractal heap")?; // flags: direct block checksums are not checked
    c.u32("fractal heap")?; // max managed object size
    c.len("fractal heap")?;
    c.addr("fractal heap")?;
    c.len("fractal heap")?;
    c.addr("fractal heap")?;
    for _ in 0..8 {
        c.len("fractal heap")?;
    }
    let width = u64::from(c.u16("fractal heap")?);
    let start = c.len("fractal heap")?;
    let max_direct = c.len("fractal heap")?;
    let max_bits = u32::from(c.u16("fractal heap")?);
    c.u16("fractal heap")?; // starting rows of the root indirect block
    let root = c.addr("fractal heap")?;
    let rows = u64::from(c.u16("fractal heap")?);
    if filters_len != 0 {
        return Err("a filtered fractal heap is not read here".into());
    }
    let end = c.pos;
    c.skip(4, "fractal heap")?;
    sum_ok(
        f.slice(addr, end as u64 + 4, "fractal heap")?,
        "fractal heap",
    )?;
    let pow2 = |n: u64| n != 0 && n & (n - 1) == 0;
    if !pow2(width)
        || !pow2(start)
        || !pow2(max_direct)
        || max_direct < start
        || !(1..=64).contains(&max_bits)
        || !(2..=64).contains(&id_len)
        || rows > 64
    {
        return Err(format!(
            "fractal heap at {addr:#x}: table width {width}, block sizes {start}..{max_direct}, \
             {max_bits} address bits, heap IDs of {id_len} bytes, {rows} rows"
        ));
    }
    let off_size = bytes_for_bits(max_bits);
    let len_size = bytes_for_bits(log2(max_direct))
        .max(1)
        .min(id_len.saturating_sub(1 + off_size));
    let mut h = Heap {
        id_len,
        off_size,
        len_size,
        blocks: Vec::new(),
        visits: 0,
    };
    let t = Table {
        width,
        start,
        max_direct,
        o,
        l,
    };
    if !f.undefined(root) {
        if rows == 0 {
            direct(f, &t, &mut h, root, 0, start)?;
        } else {
            indirect(f, &t, &mut h, root, 0, rows, 0)?;
        }
    }
    h.blocks.sort_by_key(|b| b.0);
    Ok(h)
}

struct Table {
    width: u64,
    start: u64,
    max_direct: u64,
    o: usize,
    l: usize,
}

impl Table {
    fn row_size(&self, r: u64) -> Option<u64> {
        if r < 2 {
            Some(self.start)
        } else {
            self.start.checked_shl((r - 1) as u32)
        }
    }
}

fn direct(f: &H5, t: &Table, h: &mut Heap, addr: u64, off: u64, size: u64) -> Res<()> {
    h.visits += 1;
    if h.visits > MAX_BLOCKS {
        return Err("a fractal heap with too many blocks".into());
    }
    let mut c = f.span(addr, size, "fractal heap direct block")?;
    c.tag(b"FHDB", "fractal heap direct block")?;
    c.skip(1 + t.o, "fractal heap direct block")?;
    let got = c.uint(h.off_size, "fractal heap direct block")?;
    if got != off {
        return Err(format!(
            "fractal heap direct block at {addr:#x} says offset {got}, {off} expected"
        ));
    }
    let pos = f.pos(addr, size, "fractal heap direct block")?;
    h.blocks.push((off, pos, size));
    Ok(())
}

fn indirect(
    f: &H5,
    t: &Table,
    h: &mut Heap,
    addr: u64,
    off: u64,
    rows: u64,
    depth: u32,
) -> Res<()> {
    h.visits += 1;
    if depth > 16 || h.visits > MAX_BLOCKS {
        return Err("fractal heap indirect blocks nest too deep or are too many".into());
    }
    let max_drows = u64::from(log2(t.max_direct) - log2(t.start)) + 2;
    let nd = rows.min(max_drows) * t.width;
    let ni = rows.saturating_sub(max_drows) * t.width;
    let mut c = f.at(addr, "fractal heap indirect block")?;
    c.tag(b"FHIB", "fractal heap indirect block")?;
    c.skip(1 + t.o, "fractal heap indirect block")?;
    let got = c.uint(h.off_size, "fractal heap indirect block")?;
    if got != off {
        return Err(format!(
            "fractal heap indirect block at {addr:#x} says offset {got}, {off} expected"
        ));
    }
    let mut children = Vec::new();
    for _ in 0..nd + ni {
        children.push(c.addr("fractal heap indirect block")?);
    }
    let len = c.pos as u64 + 4;
    sum_ok(
        f.slice(addr, len, "fractal heap indirect block")?,
        "fractal heap indirect block",
    )?;
    let _ = t.l;
    let mut at = off;
    for r in 0..rows {
        let size = t.row_size(r).ok_or("fractal heap rows overflow")?;
        for col in 0..t.width {
            let child = children[(r * t.width + col) as usize];
            if !f.undefined(child) {
                if size <= t.max_direct {
                    direct(f, t, h, child, at, size)?;
                } else {
                    // An indirect block of `size` bytes has the rows
                    // whose blocks add up to it.
                    let unit = t
                        .start
                        .checked_mul(t.width)
                        .ok_or("fractal heap table overflows")?;
                    let sub = log2(size)
                        .checked_sub(log2(unit))
                        .filter(|_| size.is_power_of_two() && size >= unit)
                        .ok_or("fractal heap block sizes do not add up")?;
                    let sub = u64::from(sub) + 1;
                    indirect(f, t, h, child, at, sub, depth + 1)?;
                }
            }
            at = at
                .checked_add(size)
                .ok_or("fractal heap offsets overflow")?;
        }
    }
    Ok(())
}

impl Heap {
    /// The bytes of the managed object a heap ID names.
    fn object<'a>(&self, f: &H5<'a>, id: &[u8]) -> Res<&'a [u8]> {
        let kind = (id[0] >> 4) & 3;
        if id[0] >> 6 != 0 || kind != 0 {
            return Err("a fractal heap object that is not a managed one (huge or tiny)".into());
        }
        let mut c = Cur::new(&id[1..], 8, 8);
        let off = c.uint(self.off_size, "heap ID")?;
        let len = c.uint(self.len_size, "heap ID")?;
        let i = self.blocks.partition_point(|b| b.0 <= off);
        let (boff, pos, size) = *i
            .checked_sub(1)
            .and_then(|i| self.blocks.get(i))
            .ok_or_else(|| format!("heap ID offset {off} is in no direct block"))?;
        let rel = off - boff;
        if rel.checked_add(len).is_none_or(|e| e > size) {
            return Err(format!("heap object {off}+{len} runs past its block"));
        }
        Ok(&f.data[pos + rel as usize..pos + (rel + len) as usize])
    }
}

/// The link messages of a group in dense storage.
pub fn links<'a>(f: &H5<'a>, heap_addr: u64, btree: u64) -> Res<Vec<&'a [u8]>> {
    let h = heap(f, heap_addr)?;
    let mut c = f.at(btree, "v2 B-tree")?;
    c.tag(b"BTHD", "v2 B-tree")?;
    c.skip(1, "v2 B-tree")?;
    let kind = c.u8("v2 B-tree")?;
    let node = u64::from(c.u32("v2 B-tree")?);
    let rec = u64::from(c.u16("v2 B-tree")?);
    let depth = c.u16("v2 B-tree")?;
    c.skip(2, "v2 B-tree")?;
    let root = c.addr("v2 B-tree")?;
    let root_n = u64::from(c.u16("v2 B-tree")?);
    let total = c.len("v2 B-tree")?;
    let end = c.pos as u64;
    sum_ok(f.slice(btree, end + 4, "v2 B-tree")?, "v2 B-tree")?;
    if kind != 5
        || rec != 4 + h.id_len as u64
        || !(32..=MAX_NODE).contains(&node)
        || depth > 16
        || total > MAX_RECORDS
    {
        return Err(format!(
            "v2 B-tree at {btree:#x}: type {kind}, {rec}-byte records, {node}-byte nodes, depth {depth}"
        ));
    }
    // Records per node, and the widths of child counts, per depth.
    let leaf_max = (node - 10) / rec;
    let width = |n: u64| (log2(n) / 8 + 1) as usize;
    let nrec_size = width(leaf_max);
    let mut cum = vec![(leaf_max, 0usize)]; // (cumulative max records, its width)
    for d in 1..=u64::from(depth) {
        let ptr = f.o as u64
            + nrec_size as u64
            + if d > 1 {
                cum[d as usize - 1].1 as u64
            } else {
                0
            };
        let max = node
            .checked_sub(10 + ptr)
            .ok_or("v2 B-tree nodes too small")?
            / (rec + ptr);
        let c = max
            .saturating_add(1)
            .saturating_mul(cum[d as usize - 1].0)
            .saturating_add(max);
        cum.push((c, width(c)));
    }
    let mut out = Vec::new();
    let mut nodes = 0usize;
    if !f.undefined(root) && root_n > 0 {
        let b = Tree {
            f,
            h: &h,
            node,
            rec,
            nrec_size,
            cum: &cum,
        };
        b.node(root, depth, root_n, &mut out, &mut nodes)?;
    }
    if out.len() as u64 != total {
        return Err(format!(
            "v2 B-tree at {btree:#x} holds {} records, its header says {total}",
            out.len()
        ));
    }
    Ok(out)
}

struct Tree<'a, 'b> {
    f: &'b H5<'a>,
    h: &'b Heap,
    node: u64,
    rec: u64,
    nrec_size: usize,
    cum: &'b [(u64, usize)],
}

impl<'a> Tree<'a, '_> {
    fn node(
        &self,
        addr: u64,
        depth: u16,
        n: u64,
        out: &mut Vec<&'a [u8]>,
        nodes: &mut usize,
    ) -> Res<()> {
        *nodes += 1;
        if *nodes > MAX_NODES {
            return Err("a v2 B-tree with too many nodes".into());
        }
        let whole = self.f.slice(addr, self.node, "v2 B-tree node")?;
        let mut c = Cur::new(whole, self.f.o, self.f.l);
        c.tag(if depth == 0 { b"BTLF" } else { b"BTIN" }, "v2 B-tree node")?;
        c.skip(2, "v2 B-tree node")?;
        let mut recs = Vec::new();
        for _ in 0..n {
            let r = c.bytes(self.rec as usize, "v2 B-tree records")?;
            recs.push(&r[4..]);
        }
        let mut kids = Vec::new();
        if depth > 0 {
            for _ in 0..=n {
                let a = c.addr("v2 B-tree child")?;
                let k = c.uint(self.nrec_size, "v2 B-tree child")?;
                if depth > 1 {
                    c.uint(self.cum[depth as usize - 1].1, "v2 B-tree child")?;
                }
                kids.push((a, k));
            }
        }
        let end = c.pos;
        sum_ok(&whole[..end + 4], "v2 B-tree node")?;
        for id in recs {
            if out.len() as u64 >= MAX_RECORDS {
                return Err("a v2 B-tree with too many records".into());
            }
            out.push(self.h.object(self.f, id)?);
        }
        for (a, k) in kids {
            self.node(a, depth - 1, k, out, nodes)?;
        }
        Ok(())
    }
}
