//! Which format a file is, from its first bytes, never from its name: the
//! table of every format this version reads ([`FORMATS`]), in the order
//! they are tried, and what a file of no format looks like.
//!
//! A format is one entry here and one module: how its bytes are
//! recognised, what a remote object of it must have present before it is
//! read ([`super::fetch`]), and how it is read into the common catalog.

use super::{Limits, Opened, common, fetch, sharded};
use super::{deathtensors, gguf, hdf5, npz, onnx, pt, safetensors, zt_v01, zt_v1, zt_v2};
use crate::error::Result;
use crate::source::MappedFile;

/// One format this version reads.
pub struct Format {
    /// As users name it (`--help`, messages).
    pub name: &'static str,
    /// How `--help` and refusals list it ("safetensors (and sharded
    /// sets)"); empty where another entry's line covers it.
    pub listed: &'static str,
    /// Whether a file's first bytes are of this format (given that no
    /// format before it in [`FORMATS`] took them).
    pub looks_like: fn(&[u8]) -> bool,
    /// Makes present what reading a remote object of this format touches
    /// at open (the object's first and last bytes already are).
    pub fetch_index: fn(&MappedFile, Limits) -> Result<()>,
    /// Reads a file of this format, prepared, into the common catalog.
    pub open: fn(MappedFile, Limits) -> Result<Opened>,
}

impl std::fmt::Debug for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Format({})", self.name)
    }
}

impl PartialEq for Format {
    fn eq(&self, other: &Format) -> bool {
        self.name == other.name
    }
}

/// Every format read, in the order they are tried: a Hugging Face index
/// (JSON naming `weight_map`), the formats with a magic, then those
/// recognised by their structure (safetensors' header length and `{`;
/// ONNX, whose protobuf has no magic, last of all).
pub static FORMATS: &[Format] = &[
    Format {
        name: "Hugging Face safetensors index",
        listed: "",
        looks_like: sharded::is_hf_index,
        fetch_index: fetch::json_index,
        open: sharded::open_hf_index,
    },
    Format {
        name: "zTensor v0.1",
        listed: "zTensor v0.1",
        looks_like: |b| b.starts_with(zt_v01::MAGIC),
        fetch_index: fetch::zt_v01,
        open: zt_v01::open,
    },
    Format {
        name: "zTensor v1",
        listed: "zTensor v1",
        looks_like: |b| b.starts_with(zt_v1::MAGIC),
        fetch_index: fetch::zt_v1,
        open: zt_v1::open,
    },
    Format {
        name: "zTensor v2",
        listed: "zTensor v2",
        looks_like: |b| b.starts_with(zt_v2::MAGIC),
        fetch_index: fetch::zt_v2,
        open: zt_v2::open,
    },
    Format {
        name: "deathtensors",
        listed: "deathtensors (and sharded sets)",
        looks_like: |b| b.starts_with(deathtensors::MAGIC),
        fetch_index: fetch::deathtensors,
        open: deathtensors::open,
    },
    Format {
        name: gguf::NAME,
        listed: "GGUF (and split files)",
        looks_like: gguf::looks_like,
        fetch_index: fetch::gguf,
        open: sharded::open_gguf,
    },
    Format {
        name: "HDF5",
        listed: "HDF5",
        looks_like: |b| b.starts_with(hdf5::MAGIC),
        fetch_index: |src, limits| fetch::whole(src, limits, "an HDF5 file"),
        open: hdf5::open,
    },
    Format {
        name: "PyTorch .pt",
        listed: "PyTorch .pt",
        looks_like: pt::looks_like,
        fetch_index: fetch::zip,
        open: pt::open,
    },
    Format {
        name: "npz",
        listed: "npz",
        // Any other ZIP archive: npz's reader says what is wrong with it.
        looks_like: common::is_zip,
        fetch_index: fetch::zip,
        open: npz::open,
    },
    Format {
        name: "safetensors",
        listed: "safetensors (and sharded sets)",
        looks_like: safetensors::looks_like,
        fetch_index: fetch::safetensors,
        open: safetensors::open,
    },
    Format {
        name: "ONNX",
        listed: "ONNX",
        looks_like: onnx::looks_like,
        fetch_index: |src, limits| fetch::whole(src, limits, "an ONNX model"),
        open: onnx::open,
    },
];

/// Files recognised by their first bytes that this version does not read:
/// what the refusal calls them.
const NOT_READ: &[(&[u8], &str)] = &[
    (
        pt::LEGACY_MAGIC,
        "a PyTorch file in torch.save's legacy format (_use_new_zipfile_serialization=False, \
         or torch before 1.6; save it again with torch.save's default zip format)",
    ),
    (b"\x93NUMPY", "a numpy .npy file"),
];

/// What a file's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Detected {
    Format(&'static Format),
    /// A format this version recognises but does not read.
    Known(&'static str),
    Unknown,
}

impl Detected {
    /// The format's name, if it is one this version reads.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Detected::Format(f) => Some(f.name),
            _ => None,
        }
    }
}

/// Recognises a file by its first bytes.
pub fn detect(bytes: &[u8]) -> Detected {
    // Their magics are no format's, so the order against the table does
    // not matter.
    if let Some((_, name)) = NOT_READ.iter().find(|(m, _)| bytes.starts_with(m)) {
        return Detected::Known(name);
    }
    match FORMATS.iter().find(|f| (f.looks_like)(bytes)) {
        Some(f) => Detected::Format(f),
        None => Detected::Unknown,
    }
}

/// The formats this version reads, for refusals (`--help` says the same in
/// words of its own, which a test holds to this list).
pub fn reads() -> String {
    let listed: Vec<&str> = FORMATS
        .iter()
        .map(|f| f.listed)
        .filter(|l| !l.is_empty())
        .collect();
    listed.join(", ")
}

/// Whether `head` opens an HTML page (`<!DOCTYPE html` or `<html`, any
/// case, after white space).
fn looks_like_html(head: &[u8]) -> bool {
    let t = head.trim_ascii_start().to_ascii_lowercase();
    t.starts_with(b"<!doctype html") || t.starts_with(b"<html")
}

/// The size a Git LFS pointer file names (`version
/// https://git-lfs.github.com/spec/v1`, then `oid` and `size` lines),
/// where `bytes` are one: what a repo cloned without git-lfs holds in place
/// of each large file.
fn lfs_pointer(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes.get(..bytes.len().min(1024))?).ok()?;
    text.starts_with("version https://git-lfs.github.com/spec/")
        .then(|| {
            text.lines()
                .find_map(|l| l.strip_prefix("size "))
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                .unwrap_or("unknown")
                .to_string()
        })
}

/// What a file of no known format looks like, from its first bytes.
pub fn describe_unknown(bytes: &[u8]) -> String {
    const SHOWN: usize = 16;
    let head = &bytes[..bytes.len().min(SHOWN)];
    let more = if bytes.len() > SHOWN { "..." } else { "" };
    let known = [
        (&b"\x1f\x8b"[..], "a gzip stream: decompress it first"),
        (
            &b"\x28\xb5\x2f\xfd"[..],
            "a zstd stream: decompress it first",
        ),
        (&b"\xfd7zXZ\x00"[..], "an xz stream: decompress it first"),
        (&b"BZh"[..], "a bzip2 stream: decompress it first"),
        (&b"\x7fELF"[..], "an ELF executable"),
    ];
    if bytes.is_empty() {
        return "the file is empty".into();
    }
    if let Some((_, what)) = known.iter().find(|(m, _)| bytes.starts_with(m)) {
        return format!("it looks like {what}");
    }
    if bytes.starts_with(b"ZTEN") {
        let magic = String::from_utf8_lossy(&bytes[..bytes.len().min(8)]);
        return format!(
            "it starts like a zTensor file, but {magic:?} is no version this build reads \
             (\"ZTEN0001\": v0.1, \"ZTEN1000\": v1; v2 starts with \"\\x89ZT2\")"
        );
    }
    if let Some(size) = lfs_pointer(bytes) {
        return format!(
            "it is a Git LFS pointer to a file of {size} bytes, not the file itself (a repo \
             cloned without git-lfs): fetch it with git lfs pull, or mount hf://ORG/REPO \
             from the Hub"
        );
    }
    if looks_like_html(head) {
        return format!(
            "it is an HTML page, not tensor data (an error or login page saved in place of \
             the file?): {:?}{more}",
            String::from_utf8_lossy(head)
        );
    }
    match std::str::from_utf8(head) {
        Ok(t)
            if t.chars()
                .all(|c| !c.is_control() || c.is_ascii_whitespace()) =>
        {
            // JSON here has no "weight_map" (else it was an index); say
            // so, for an index that lost it or a config named by mistake.
            let hint = if t.trim_start().starts_with('{') {
                " (JSON without the \"weight_map\" that a Hugging Face index of shards has)"
            } else {
                ""
            };
            format!("it starts with text: {t:?}{more}{hint}")
        }
        _ => {
            let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
            format!("its first bytes are {}{more}", hex.join(" "))
        }
    }
}
