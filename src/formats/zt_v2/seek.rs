//! The seek table of a `zt.zstd-seekable/1` part: the zstd seekable
//! format's skippable frame at the end of the stored bytes, which lists
//! each frame's stored and decoded size.
//!
//! The `ztensor` crate parses this table only inside its whole-part decode
//! (which allocates `decoded_length` up front), and never hands the frame
//! list out, so it is parsed here, from the mapping, with every number
//! checked before it is used: the mount serves such a part frame by frame
//! from this list.

/// zstd skippable frame magic used by the seekable format.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
/// The seekable format's footer magic.
const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;
/// Footer: frame count (u32), descriptor (u8), magic (u32).
const FOOTER: usize = 9;
/// Skippable frame header: magic (u32), content length (u32).
const HEADER: usize = 8;
/// Most decoded bytes one frame may hold (profile rule).
pub const MAX_FRAME_DECODED: u64 = 16 << 20;
/// Most frames a part may have: the list is kept while the file is mounted
/// (the same bound the mount uses for frames it discovers itself).
pub const MAX_FRAMES: u64 = crate::codec::zstd::MAX_FRAMES as u64;

/// A checked seek table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeekTable {
    /// `(stored, decoded)` bytes of each frame, in order.
    pub frames: Vec<(u64, u64)>,
    /// Bytes the frames take: where the seek table starts in the stored
    /// bytes (the sum of the stored sizes).
    pub frames_len: u64,
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| "seek table is cut short".to_string())
}

/// Parses and checks the seek table at the end of `stored`, a part's
/// stored bytes, against the part's `decoded_length`. Every frame is
/// non-empty both ways, decodes to at most 16 MiB, all but the last decode
/// to the same size, the stored sizes add up to exactly the bytes before
/// the table and the decoded sizes to exactly `decoded_length`. Does not
/// look at the frames themselves (see [`check_frame_headers`]).
pub fn parse(stored: &[u8], decoded_length: u64) -> Result<SeekTable, String> {
    let n = stored.len();
    if n < HEADER + FOOTER {
        return Err(format!(
            "zstd-seekable stream of {n} bytes is too short for a seek table"
        ));
    }
    if u32_at(stored, n - 4)? != SEEKABLE_MAGIC {
        return Err("zstd-seekable stream has no seek table (footer magic missing)".into());
    }
    let descriptor = stored[n - 5];
    if descriptor & 0x7f != 0 {
        return Err(format!(
            "seek table descriptor {descriptor:#04x} has reserved bits set"
        ));
    }
    let entry = if descriptor & 0x80 != 0 { 12u64 } else { 8u64 };
    let count = u64::from(u32_at(stored, n - 9)?);
    if count > MAX_FRAMES {
        return Err(format!(
            "seek table lists {count} frames, more than the {MAX_FRAMES} allowed"
        ));
    }
    // count <= 2^20, entry <= 12: no overflow.
    let content = count * entry + FOOTER as u64;
    let table = content + HEADER as u64;
    if table > n as u64 {
        return Err(format!(
            "seek table of {count} frames ({table} bytes) is larger than the {n}-byte stream"
        ));
    }
    let start = n - table as usize;
    if u32_at(stored, start)? != SKIPPABLE_MAGIC {
        return Err("seek table does not start with a skippable frame".into());
    }
    if u64::from(u32_at(stored, start + 4)?) != content {
        return Err("seek table's frame length disagrees with its frame count".into());
    }
    let mut frames = Vec::with_capacity(count as usize);
    let (mut total_c, mut total_d) = (0u64, 0u64);
    let mut at = start + HEADER;
    for k in 0..count {
        let c = u64::from(u32_at(stored, at)?);
        let d = u64::from(u32_at(stored, at + 4)?);
        at += entry as usize;
        if c == 0 || d == 0 {
            return Err(format!(
                "seek table frame {k} is empty ({c} stored, {d} decoded bytes)"
            ));
        }
        if d > MAX_FRAME_DECODED {
            return Err(format!(
                "seek table frame {k} decodes to {d} bytes, more than 16 MiB"
            ));
        }
        // Each term < 2^32 and count <= 2^20: cannot overflow, but say so.
        total_c = total_c.checked_add(c).ok_or("seek table sizes overflow")?;
        total_d = total_d.checked_add(d).ok_or("seek table sizes overflow")?;
        frames.push((c, d));
    }
    if let Some(((_, first), middle)) = frames.split_last().and_then(|(_, init)| init.split_first())
        && let Some(k) = middle.iter().position(|&(_, d)| d != *first)
    {
        return Err(format!(
            "seek table frame {} decodes to a different size than frame 0 (only the last may)",
            k + 1
        ));
    }
    if let (Some(&(_, first)), Some(&(_, last))) = (frames.first(), frames.last())
        && last > first
    {
        return Err("seek table's last frame decodes to more than the others".into());
    }
    if total_c != start as u64 {
        return Err(format!(
            "seek table frames take {total_c} bytes, but {start} bytes precede the table"
        ));
    }
    if total_d != decoded_length {
        return Err(format!(
            "seek table frames decode to {total_d} bytes, the part's decoded_length is {decoded_length}"
        ));
    }
    Ok(SeekTable {
        frames,
        frames_len: total_c,
    })
}

/// Checks that each frame of a parsed table starts with a zstd frame header
/// that carries a content checksum (the profile requires one): reads one
/// header per frame. Each frame's contents are checked when it is decoded.
pub fn check_frame_headers(stored: &[u8], table: &SeekTable) -> Result<(), String> {
    let mut at = 0u64;
    for (k, &(c, _)) in table.frames.iter().enumerate() {
        let frame = usize::try_from(at)
            .ok()
            .and_then(|a| stored.get(a..))
            .unwrap_or_default();
        match crate::codec::zstd::frame_has_checksum(frame) {
            Some(true) => {}
            Some(false) => {
                return Err(format!(
                    "zstd frame {k} carries no content checksum (zt.zstd-seekable/1 requires one)"
                ));
            }
            None => return Err(format!("seek table frame {k} is not a zstd frame")),
        }
        at += c;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[(u32, u32)], frames_len: usize) -> Vec<u8> {
        let mut out = vec![0u8; frames_len];
        out.extend(SKIPPABLE_MAGIC.to_le_bytes());
        out.extend(((entries.len() * 8 + 9) as u32).to_le_bytes());
        for (c, d) in entries {
            out.extend(c.to_le_bytes());
            out.extend(d.to_le_bytes());
        }
        out.extend((entries.len() as u32).to_le_bytes());
        out.push(0);
        out.extend(SEEKABLE_MAGIC.to_le_bytes());
        out
    }

    #[test]
    fn a_good_table_parses() {
        let b = table(&[(10, 100), (10, 100), (5, 40)], 25);
        let t = parse(&b, 240).unwrap();
        assert_eq!(t.frames, vec![(10, 100), (10, 100), (5, 40)]);
        assert_eq!(t.frames_len, 25);
    }

    #[test]
    fn an_empty_table_is_an_empty_part() {
        let b = table(&[], 0);
        assert_eq!(parse(&b, 0).unwrap().frames, vec![]);
        assert!(parse(&b, 1).is_err());
    }

    #[test]
    fn lies_are_refused() {
        // sums that do not match
        assert!(parse(&table(&[(10, 100)], 11), 100).is_err());
        assert!(parse(&table(&[(10, 100)], 10), 101).is_err());
        // unequal non-final frames
        assert!(parse(&table(&[(10, 100), (10, 90), (5, 40)], 25), 230).is_err());
        // a frame over 16 MiB
        assert!(parse(&table(&[(10, 17 << 20)], 10), 17 << 20).is_err());
        // empty frames
        assert!(parse(&table(&[(0, 100)], 0), 100).is_err());
        // count larger than the stream
        let mut b = table(&[(10, 100)], 10);
        let n = b.len();
        b[n - 9..n - 5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&b, 100).is_err());
        // truncations never panic
        let b = table(&[(10, 100), (10, 100)], 20);
        for cut in 0..b.len() {
            let _ = parse(&b[cut..], 200);
            let _ = parse(&b[..cut], 200);
        }
    }
}
