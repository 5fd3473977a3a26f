//! Bounded reads of the file's bytes, and the superblock.
//!
//! Every address, size and count taken from the file goes through these:
//! an address is relative to the superblock's base address and must lie,
//! with the bytes read at it, inside the file; a size must not overflow.

/// A problem with the file's structure, as a phrase for the one line.
pub type Res<T> = std::result::Result<T, String>;

/// HDF5's signature, at 0 or a power of two from 512.
pub const MAGIC: &[u8; 8] = b"\x89HDF\r\n\x1a\n";

/// The file, with the sizes its superblock sets.
#[derive(Clone, Copy)]
pub struct H5<'a> {
    pub data: &'a [u8],
    /// Absolute position of address 0.
    pub base: u64,
    /// Bytes of an address ("size of offsets").
    pub o: usize,
    /// Bytes of a length ("size of lengths").
    pub l: usize,
}

impl<'a> H5<'a> {
    /// The absolute position of `addr`, checked to have `len` bytes after it
    /// inside the file.
    pub fn pos(&self, addr: u64, len: u64, what: &str) -> Res<usize> {
        let abs = self
            .base
            .checked_add(addr)
            .ok_or_else(|| format!("{what}: address {addr:#x} overflows"))?;
        match abs.checked_add(len) {
            Some(end) if end <= self.data.len() as u64 => Ok(abs as usize),
            _ => Err(format!(
                "{what}: {len} bytes at address {addr:#x} lie past the end of the file ({} bytes)",
                self.data.len()
            )),
        }
    }

    /// The `len` bytes at `addr`.
    pub fn slice(&self, addr: u64, len: u64, what: &str) -> Res<&'a [u8]> {
        let p = self.pos(addr, len, what)?;
        Ok(&self.data[p..p + len as usize])
    }

    /// A cursor over everything from `addr` to the end of the file.
    pub fn at(&self, addr: u64, what: &str) -> Res<Cur<'a>> {
        let p = self.pos(addr, 0, what)?;
        Ok(Cur {
            b: &self.data[p..],
            pos: 0,
            o: self.o,
            l: self.l,
        })
    }

    /// A cursor over exactly `len` bytes at `addr`.
    pub fn span(&self, addr: u64, len: u64, what: &str) -> Res<Cur<'a>> {
        Ok(Cur {
            b: self.slice(addr, len, what)?,
            pos: 0,
            o: self.o,
            l: self.l,
        })
    }

    pub fn undefined(&self, addr: u64) -> bool {
        addr == undefined(self.o)
    }

    /// The absolute file offset of `addr` (already checked by `pos`).
    pub fn absolute(&self, addr: u64) -> u64 {
        self.base + addr
    }
}

/// The all-ones address of `o` bytes.
pub fn undefined(o: usize) -> u64 {
    if o >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * o)) - 1
    }
}

/// Little-endian reads over a slice; reading past it is an error naming
/// `what`.
#[derive(Clone)]
pub struct Cur<'a> {
    pub b: &'a [u8],
    pub pos: usize,
    pub o: usize,
    pub l: usize,
}

impl<'a> Cur<'a> {
    pub fn new(b: &'a [u8], o: usize, l: usize) -> Cur<'a> {
        Cur { b, pos: 0, o, l }
    }

    pub fn left(&self) -> usize {
        self.b.len() - self.pos
    }

    pub fn bytes(&mut self, n: usize, what: &str) -> Res<&'a [u8]> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.b.len() => {
                let s = &self.b[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => Err(format!(
                "{what}: cut short ({n} bytes wanted, {} left)",
                self.left()
            )),
        }
    }

    pub fn skip(&mut self, n: usize, what: &str) -> Res<()> {
        self.bytes(n, what).map(|_| ())
    }

    pub fn uint(&mut self, n: usize, what: &str) -> Res<u64> {
        let s = self.bytes(n, what)?;
        if n > 8 {
            return Err(format!("{what}: a {n}-byte number"));
        }
        Ok(s.iter().rev().fold(0u64, |v, &x| (v << 8) | u64::from(x)))
    }

    pub fn u8(&mut self, what: &str) -> Res<u8> {
        Ok(self.bytes(1, what)?[0])
    }

    pub fn u16(&mut self, what: &str) -> Res<u16> {
        Ok(self.uint(2, what)? as u16)
    }

    pub fn u32(&mut self, what: &str) -> Res<u32> {
        Ok(self.uint(4, what)? as u32)
    }

    /// An address ("size of offsets" bytes).
    pub fn addr(&mut self, what: &str) -> Res<u64> {
        self.uint(self.o, what)
    }

    /// A length ("size of lengths" bytes).
    pub fn len(&mut self, what: &str) -> Res<u64> {
        self.uint(self.l, what)
    }

    pub fn tag(&mut self, sig: &[u8; 4], what: &str) -> Res<()> {
        let got = self.bytes(4, what)?;
        if got != sig {
            return Err(format!(
                "{what}: signature {:?} expected, found {:?}",
                String::from_utf8_lossy(sig),
                String::from_utf8_lossy(got)
            ));
        }
        Ok(())
    }
}

/// What the superblock says.
pub struct Superblock {
    /// Absolute position of the superblock (the base address is relative
    /// to nothing else in the files h5py writes).
    pub base: u64,
    pub o: usize,
    pub l: usize,
    /// The root group: its object header, and for v0/v1 the symbol table
    /// its entry caches (B-tree, local heap), used when its header has none.
    pub root: u64,
    pub root_cache: Option<(u64, u64)>,
}

/// Finds and reads the superblock (versions 0 to 3).
pub fn superblock(data: &[u8]) -> Res<Superblock> {
    let mut at = 0usize;
    let start = loop {
        if data.get(at..at + 8) == Some(&MAGIC[..]) {
            break at;
        }
        at = if at == 0 { 512 } else { at.saturating_mul(2) };
        if at >= data.len() {
            return Err("no HDF5 signature found".into());
        }
    };
    let mut c = Cur::new(&data[start + 8..], 8, 8);
    let version = c.u8("superblock")?;
    let sizes = |o: u8, l: u8| -> Res<(usize, usize)> {
        let ok = |n: u8| matches!(n, 2 | 4 | 8);
        if ok(o) && ok(l) {
            Ok((o as usize, l as usize))
        } else {
            Err(format!(
                "superblock: size of offsets {o} or of lengths {l} is not 2, 4 or 8"
            ))
        }
    };
    match version {
        0 | 1 => {
            c.skip(3, "superblock")?; // free space, root table, reserved
            c.skip(1, "superblock")?; // shared header version
            let (o, l) = sizes(c.u8("superblock")?, c.u8("superblock")?)?;
            c.skip(1 + 2 + 2 + 4, "superblock")?;
            if version == 1 {
                c.skip(4, "superblock")?;
            }
            c.o = o;
            c.l = l;
            let base = c.addr("superblock base address")?;
            for what in [
                "free-space address",
                "end-of-file address",
                "driver address",
            ] {
                c.addr(what)?;
            }
            // The root group's symbol table entry.
            c.addr("root entry")?;
            let root = c.addr("root entry")?;
            let cache = c.u32("root entry")?;
            c.skip(4, "root entry")?;
            let scratch = c.bytes(16, "root entry")?;
            let root_cache = (cache == 1).then(|| {
                let mut s = Cur::new(scratch, o, l);
                let bt = s.addr("root entry").unwrap_or(u64::MAX);
                let heap = s.addr("root entry").unwrap_or(u64::MAX);
                (bt, heap)
            });
            Ok(Superblock {
                base: base
                    .checked_add(start as u64)
                    .ok_or("superblock: bad base")?,
                o,
                l,
                root,
                root_cache,
            })
        }
        2 | 3 => {
            let (o, l) = sizes(c.u8("superblock")?, c.u8("superblock")?)?;
            c.skip(1, "superblock")?; // flags
            c.o = o;
            c.l = l;
            let base = c.addr("superblock base address")?;
            c.addr("superblock extension address")?;
            c.addr("end-of-file address")?;
            let root = c.addr("root group address")?;
            let end = 8 + c.pos;
            let sum = c.u32("superblock checksum")?;
            if lookup3(&data[start..start + end]) != sum {
                return Err("superblock: checksum mismatch".into());
            }
            Ok(Superblock {
                base: base
                    .checked_add(start as u64)
                    .ok_or("superblock: bad base")?,
                o,
                l,
                root,
                root_cache: None,
            })
        }
        v => Err(format!(
            "superblock version {v} is not one HDF5 defines (0 to 3)"
        )),
    }
}

/// Bob Jenkins' lookup3 `hashlittle` with seed 0: the checksum of every
/// version 2 structure. Hand-written (a dozen lines) rather than a crate:
/// no maintained crate offers exactly this variant.
pub fn lookup3(k: &[u8]) -> u32 {
    let rot = |x: u32, n: u32| x.rotate_left(n);
    let mut a: u32 = 0xdead_beef_u32.wrapping_add(k.len() as u32);
    let (mut b, mut c) = (a, a);
    let word = |s: &[u8]| -> u32 {
        let mut w = [0u8; 4];
        w[..s.len()].copy_from_slice(s);
        u32::from_le_bytes(w)
    };
    let mut rest = k;
    while rest.len() > 12 {
        a = a.wrapping_add(word(&rest[0..4]));
        b = b.wrapping_add(word(&rest[4..8]));
        c = c.wrapping_add(word(&rest[8..12]));
        a = a.wrapping_sub(c);
        a ^= rot(c, 4);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= rot(a, 6);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= rot(b, 8);
        b = b.wrapping_add(a);
        a = a.wrapping_sub(c);
        a ^= rot(c, 16);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= rot(a, 19);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= rot(b, 4);
        b = b.wrapping_add(a);
        rest = &rest[12..];
    }
    if rest.is_empty() {
        return c;
    }
    a = a.wrapping_add(word(&rest[..rest.len().min(4)]));
    if rest.len() > 4 {
        b = b.wrapping_add(word(&rest[4..rest.len().min(8)]));
    }
    if rest.len() > 8 {
        c = c.wrapping_add(word(&rest[8..]));
    }
    c ^= b;
    c = c.wrapping_sub(rot(b, 14));
    a ^= c;
    a = a.wrapping_sub(rot(c, 11));
    b ^= a;
    b = b.wrapping_sub(rot(a, 25));
    c ^= b;
    c = c.wrapping_sub(rot(b, 16));
    a ^= c;
    a = a.wrapping_sub(rot(c, 4));
    b ^= a;
    b = b.wrapping_sub(rot(a, 14));
    c ^= b;
    c = c.wrapping_sub(rot(b, 24));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup3_matches_its_published_vectors() {
        // From the self-test in Bob Jenkins' lookup3.c (seed 0).
        assert_eq!(lookup3(b""), 0xdead_beef);
        assert_eq!(lookup3(b"Four score and seven years ago"), 0x1777_0551);
    }

    #[test]
    fn cursor_reads_stop_at_the_end() {
        let mut c = Cur::new(&[1, 2, 3], 8, 8);
        assert_eq!(c.u16("x").unwrap(), 0x0201);
        assert!(c.u16("x").is_err());
        assert!(c.addr("x").is_err());
        let f = H5 {
            data: &[0u8; 16],
            base: 0,
            o: 8,
            l: 8,
        };
        assert!(f.pos(8, 8, "x").is_ok());
        assert!(f.pos(9, 8, "x").is_err());
        assert!(f.pos(u64::MAX, 1, "x").is_err());
        assert_eq!(undefined(4), 0xffff_ffff);
    }
}
