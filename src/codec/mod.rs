//! Encodings shared by formats: how stored bytes become decoded bytes
//! (`zstd`), and the digests that vouch for either (`digest`).

pub mod digest;
pub mod read_ahead;
pub mod zstd;
