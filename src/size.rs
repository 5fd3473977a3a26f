//! Byte counts as a user reads them in a message: `32 bytes`, `64 MiB`,
//! `1.5 GiB`, in the binary units the size options take (`--cache-size
//! 512M` is 512 MiB).

const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];

/// `n` in the largest unit it reaches: whole where it is a whole number
/// of that unit (a limit the user gave as `64M` reads `64 MiB`), else to
/// one decimal.
pub fn bytes(n: u64) -> String {
    if n == 1 {
        return "1 byte".into();
    }
    let mut unit = 0;
    while unit + 1 < UNITS.len() && n >= 1 << (10 * (unit + 1)) {
        unit += 1;
    }
    let scale = 1u64 << (10 * unit);
    if n.is_multiple_of(scale) {
        format!("{} {}", n / scale, UNITS[unit])
    } else {
        format!("{:.1} {}", n as f64 / scale as f64, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn counts_read_in_their_largest_unit() {
        assert_eq!(bytes(0), "0 bytes");
        assert_eq!(bytes(1), "1 byte");
        assert_eq!(bytes(1023), "1023 bytes");
        assert_eq!(bytes(1024), "1 KiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(64 << 20), "64 MiB");
        assert_eq!(bytes((1 << 30) + (1 << 29)), "1.5 GiB");
        assert_eq!(bytes(3 << 40), "3 TiB");
        assert_eq!(bytes(u64::MAX), "16777216.0 TiB");
    }
}
