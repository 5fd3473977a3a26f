//! Digests as formats write them: `crc32c:0x1234ABCD`, `sha256:<64 hex
//! digits>`, `xxh3:<16 hex digits>` (XXH3-64), and the CRC-32 of a ZIP
//! member (`crc32:0x1234ABCD`, ISO-HDLC, as zlib computes it). Which bytes one covers
//! (stored or decoded) is the catalog's business (`catalog::Check`).

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checksum {
    Crc32c(u32),
    /// The CRC-32 a ZIP archive records for a member.
    Crc32(u32),
    Sha256([u8; 32]),
    Xxh3(u64),
    /// An algorithm this reader does not know: reported as unverifiable.
    Unknown(String),
}

/// What a verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No checksum in the metadata.
    Absent,
    Verified,
    /// The algorithm is unknown; nothing was checked.
    Unverifiable(String),
    Mismatch {
        expected: String,
        actual: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Crc32c,
    Crc32,
    Sha256,
    Xxh3,
}

impl Checksum {
    /// Parses the metadata string. A known algorithm with a malformed value
    /// is an error; an unknown algorithm is not.
    pub fn parse(text: &str) -> Result<Checksum, String> {
        let Some((algo, value)) = text.split_once(':') else {
            return Ok(Checksum::Unknown(text.to_string()));
        };
        match algo.to_ascii_lowercase().as_str() {
            "crc32c" => {
                let hex = value
                    .strip_prefix("0x")
                    .or_else(|| value.strip_prefix("0X"))
                    .unwrap_or(value);
                // Digits only: from_str_radix would also take a '+' sign.
                if hex.is_empty() || hex.len() > 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("malformed crc32c checksum {text:?}"));
                }
                u32::from_str_radix(hex, 16)
                    .map(Checksum::Crc32c)
                    .map_err(|_| format!("malformed crc32c checksum {text:?}"))
            }
            "sha256" => {
                let mut out = [0u8; 32];
                if value.len() != 64 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "malformed sha256 checksum {text:?} (want 64 hex digits)"
                    ));
                }
                for (i, o) in out.iter_mut().enumerate() {
                    *o = u8::from_str_radix(&value[2 * i..2 * i + 2], 16)
                        .map_err(|_| format!("malformed sha256 checksum {text:?}"))?;
                }
                Ok(Checksum::Sha256(out))
            }
            "xxh3" => {
                if value.len() != 16 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "malformed xxh3 checksum {text:?} (want 16 hex digits)"
                    ));
                }
                u64::from_str_radix(value, 16)
                    .map(Checksum::Xxh3)
                    .map_err(|_| format!("malformed xxh3 checksum {text:?}"))
            }
            _ => Ok(Checksum::Unknown(text.to_string())),
        }
    }

    /// Checks `bytes` against this checksum.
    pub fn verify(&self, bytes: &[u8]) -> Verdict {
        match self.algorithm() {
            Some(algo) => self.judge(compute(algo, bytes)),
            None => Verdict::Unverifiable(self.to_string()),
        }
    }

    /// Compares a computed checksum with this expected one.
    pub fn judge(&self, actual: Checksum) -> Verdict {
        if &actual == self {
            Verdict::Verified
        } else {
            Verdict::Mismatch {
                expected: self.to_string(),
                actual: actual.to_string(),
            }
        }
    }

    /// The algorithm, if this reader knows it.
    pub fn algorithm(&self) -> Option<Algorithm> {
        match self {
            Checksum::Crc32c(_) => Some(Algorithm::Crc32c),
            Checksum::Crc32(_) => Some(Algorithm::Crc32),
            Checksum::Sha256(_) => Some(Algorithm::Sha256),
            Checksum::Xxh3(_) => Some(Algorithm::Xxh3),
            Checksum::Unknown(_) => None,
        }
    }
}

/// Computes a checksum of `bytes`.
pub fn compute(algo: Algorithm, bytes: &[u8]) -> Checksum {
    match algo {
        Algorithm::Crc32c => Checksum::Crc32c(crc32c::crc32c(bytes)),
        Algorithm::Crc32 => {
            let mut c = flate2::Crc::new();
            c.update(bytes);
            Checksum::Crc32(c.sum())
        }
        Algorithm::Sha256 => Checksum::Sha256(Sha256::digest(bytes).into()),
        Algorithm::Xxh3 => Checksum::Xxh3(xxhash_rust::xxh3::xxh3_64(bytes)),
    }
}

/// Incremental form, for writers that stream.
pub enum Hasher {
    Crc32c(u32),
    Crc32(flate2::Crc),
    Sha256(Box<Sha256>),
    Xxh3(Box<xxhash_rust::xxh3::Xxh3>),
}

impl Hasher {
    pub fn new(algo: Algorithm) -> Hasher {
        match algo {
            Algorithm::Crc32c => Hasher::Crc32c(0),
            Algorithm::Crc32 => Hasher::Crc32(flate2::Crc::new()),
            Algorithm::Sha256 => Hasher::Sha256(Box::default()),
            Algorithm::Xxh3 => Hasher::Xxh3(Box::default()),
        }
    }
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Crc32c(c) => *c = crc32c::crc32c_append(*c, bytes),
            Hasher::Crc32(c) => c.update(bytes),
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::Xxh3(h) => h.update(bytes),
        }
    }
    pub fn finish(self) -> Checksum {
        match self {
            Hasher::Crc32c(c) => Checksum::Crc32c(c),
            Hasher::Crc32(c) => Checksum::Crc32(c.sum()),
            Hasher::Sha256(h) => Checksum::Sha256(h.finalize().into()),
            Hasher::Xxh3(h) => Checksum::Xxh3(h.digest()),
        }
    }
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Checksum::Crc32c(v) => write!(f, "crc32c:0x{v:08X}"),
            Checksum::Crc32(v) => write!(f, "crc32:0x{v:08X}"),
            Checksum::Sha256(d) => {
                f.write_str("sha256:")?;
                for b in d {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
            Checksum::Xxh3(v) => write!(f, "xxh3:{v:016x}"),
            Checksum::Unknown(t) => f.write_str(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print_round_trip() {
        let c = compute(Algorithm::Sha256, b"abc");
        assert_eq!(Checksum::parse(&c.to_string()), Ok(c.clone()));
        assert_eq!(c.verify(b"abc"), Verdict::Verified);
        assert!(matches!(c.verify(b"abd"), Verdict::Mismatch { .. }));
        let k = compute(Algorithm::Crc32c, b"abc");
        assert_eq!(Checksum::parse(&k.to_string()), Ok(k.clone()));
        assert_eq!(
            Checksum::parse("crc32c:0xzz"),
            Err("malformed crc32c checksum \"crc32c:0xzz\"".into())
        );
        assert_eq!(
            Checksum::parse("md5:00").map(|c| c.verify(b"")),
            Ok(Verdict::Unverifiable("md5:00".into()))
        );
    }

    #[test]
    fn crc32_is_zips() {
        // zlib.crc32(b"123456789") == 0xCBF43926
        assert_eq!(
            compute(Algorithm::Crc32, b"123456789"),
            Checksum::Crc32(0xCBF4_3926)
        );
    }

    #[test]
    fn streaming_matches_one_shot() {
        for algo in [
            Algorithm::Crc32c,
            Algorithm::Crc32,
            Algorithm::Sha256,
            Algorithm::Xxh3,
        ] {
            let mut h = Hasher::new(algo);
            h.update(b"hello ");
            h.update(b"world");
            assert_eq!(h.finish(), compute(algo, b"hello world"));
        }
    }
}
