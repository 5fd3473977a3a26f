//! Sharded sets mounted as one tree: a Hugging Face
//! `*.safetensors.index.json` (`weight_map`: tensor name → shard file beside
//! it), and GGUF split files (`NAME-00001-of-0000N.gguf`, whose headers say
//! `split.count`).
//!
//! Each shard is read on its own (by [`super::safetensors`] or
//! [`super::gguf`]) and joined by [`super::shard_set`], whose rules (a
//! missing or refused shard, a tensor a shard lacks, a name two shards
//! hold) are those of every sharded format.

use std::path::{Path, PathBuf};

use super::shard_set::{self, Duplicates, Set, ShardResult};
use super::{Limits, Opened, gguf, safetensors};
use crate::catalog::{Catalog, Json, cost};
use crate::error::{Error, ErrorKind, Result};
use crate::size;
use crate::source::MappedFile;

/// Largest index JSON read (a real one is well under a few MB).
pub(crate) const MAX_INDEX: u64 = 64 << 20;

/// Most bytes an index's JSON takes in memory parsed, per byte of text (a
/// `"name":"shard",` entry of 26 bytes is two strings and a map slot, some
/// 100 bytes).
const JSON_EXPANSION: u64 = 8;

/// Whether `bytes` are a Hugging Face sharded-safetensors index: a JSON
/// object (checked cheaply here: `{` first, and a `weight_map` key).
pub fn is_hf_index(bytes: &[u8]) -> bool {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    start.is_some_and(|i| bytes[i] == b'{')
        && (bytes.len() as u64) <= MAX_INDEX
        && bytes.windows(12).any(|w| w == b"\"weight_map\"")
}

/// A directory: the one `*.safetensors.index.json` in it.
pub fn open_dir(dir: &Path, limits: Limits) -> Result<Opened> {
    let label = dir.display().to_string();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::new(ErrorKind::Io, &label, None, format!("cannot list: {e}")))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".safetensors.index.json"))
        })
        .collect();
    found.sort();
    match found.as_slice() {
        [one] => open_hf_index(MappedFile::open(one)?, limits),
        [] => Err(Error::new(
            ErrorKind::NotZtensor,
            &label,
            None,
            "a directory, and no *.safetensors.index.json in it to mount",
        )),
        many => Err(Error::new(
            ErrorKind::NotSupported,
            &label,
            None,
            format!(
                "a directory with {} *.safetensors.index.json files; name the one to mount",
                many.len()
            ),
        )),
    }
}

/// The set an HF index names.
pub fn open_hf_index(index: MappedFile, limits: Limits) -> Result<Opened> {
    let label = index.label().to_string();
    let bad = |m: String| Error::new(ErrorKind::Index, &label, None, m);
    if index.len() > MAX_INDEX {
        return Err(bad(format!(
            "index of {} bytes is too big (the most read is {MAX_INDEX})",
            index.len()
        )));
    }
    // Held to --index-memory before it is parsed, then before the set is
    // laid out: a 39 MB index of 1.5 million tensors took 1.8 GB and 39 s
    // to be refused under a 60 MiB limit, once all was built.
    let parsed = index.len().saturating_mul(JSON_EXPANSION);
    if parsed > limits.index_memory {
        return Err(bad(format!(
            "an index of {} would take about {} in memory parsed, more than the {} allowed \
             (--index-memory)",
            size::bytes(index.len()),
            size::bytes(parsed),
            size::bytes(limits.index_memory)
        )));
    }
    let json: Json = serde_json::from_slice(index.bytes())
        .map_err(|e| bad(format!("index is not valid JSON: {e}")))?;
    let Some(map) = json.get("weight_map").and_then(Json::as_object) else {
        return Err(bad("index has no \"weight_map\" object".into()));
    };
    let laid_out = map
        .keys()
        .map(|t| cost::name_cost(t).saturating_add(cost::TENSOR_COST))
        .fold(0u64, u64::saturating_add);
    if laid_out > limits.index_memory {
        return Err(bad(format!(
            "its index of {} tensors would take about {} in memory (catalog, tree and views), \
             more than the {} allowed (--index-memory)",
            map.len(),
            size::bytes(laid_out),
            size::bytes(limits.index_memory)
        )));
    }
    let dir = index
        .path()
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    // Shards in the order first named, each with the tensors it holds.
    let mut shards: Vec<(String, Vec<String>)> = Vec::new();
    // Each shard's place in `shards`: a set of many shards (or of one
    // shard of many tensors) is joined in linear time.
    let mut shard_at: std::collections::HashMap<&str, usize> = Default::default();
    for (tensor, file) in map {
        let Some(file) = file.as_str() else {
            return Err(bad(format!("weight_map[{tensor:?}] is not a file name")));
        };
        // `./NAME` is NAME to loaders, which join it to the index's folder.
        let given = file;
        let file = file.strip_prefix("./").unwrap_or(file);
        if !shard_set::name_ok(file) {
            return Err(bad(format!(
                "weight_map[{tensor:?}] names {given:?}, not {}",
                shard_set::PLAIN_NAME
            )));
        }
        match shard_at.get(file) {
            Some(&i) => shards[i].1.push(tensor.clone()),
            None => {
                shard_at.insert(file, shards.len());
                shards.push((file.to_string(), vec![tensor.clone()]));
            }
        }
    }
    shard_set::check_count(&label, shards.len())?;
    let mut set = Set::new("safetensors (sharded)", &label, Duplicates::List);
    if let Some(meta) = json.get("metadata") {
        set.attributes().insert("metadata".into(), meta.clone());
    }
    set.attributes().insert(
        "shards".into(),
        shards
            .iter()
            .map(|(f, _)| f.as_str())
            .collect::<Vec<_>>()
            .into(),
    );
    let opened = shard_set::open_each(&shards, |(file, _)| {
        open_shard(&index, file, Shard::Safetensors, limits)
    });
    for ((file, wanted), shard) in shards.iter().zip(opened) {
        set.add(&dir.join(file), shard, Some(wanted));
    }
    set.finish()
}

/// A GGUF file, or the split set whose first file it is.
pub fn open_gguf(src: MappedFile, limits: Limits) -> Result<Opened> {
    let (catalog, src) = gguf::open(src, limits)?;
    if gguf_split_count(&catalog) > 1 {
        return open_gguf_split(catalog, src, limits);
    }
    Ok(Opened {
        catalog,
        sources: vec![Some(src)],
    })
}

/// `split.count` of a GGUF header, 0 if it has none.
pub fn gguf_split_count(c: &Catalog) -> u64 {
    c.attributes
        .get("split.count")
        .and_then(Json::as_u64)
        .unwrap_or(0)
}

/// A GGUF split set from its first file, already read as `first`: the
/// others are named as llama.cpp's gguf-split names them.
pub fn open_gguf_split(first: Catalog, src: MappedFile, limits: Limits) -> Result<Opened> {
    let label = src.label().to_string();
    let bad = |m: String| Error::new(ErrorKind::Index, &label, None, m);
    let count = gguf_split_count(&first);
    let no = first.attributes.get("split.no").and_then(Json::as_u64);
    if no != Some(0) {
        return Err(bad(format!(
            "a GGUF split file (split.no {}, of {count}): mount the first one",
            no.map_or("missing".to_string(), |n| n.to_string())
        )));
    }
    let name = src
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let suffix = format!("-00001-of-{count:05}.gguf");
    let Some(stem) = name.strip_suffix(&suffix) else {
        return Err(bad(format!(
            "a GGUF split of {count} files whose name does not end in {suffix:?}, \
             so its siblings cannot be named"
        )));
    };
    shard_set::check_count(
        &label,
        usize::try_from(count)
            .unwrap_or(usize::MAX)
            .saturating_sub(1),
    )?;
    let dir = src.path().parent().unwrap_or(Path::new(".")).to_path_buf();
    let mut set = Set::new("GGUF (split)", &label, Duplicates::List);
    *set.attributes() = first.attributes.clone();
    let first_path = src.path().to_path_buf();
    // The others beside the first however it was opened (a file, a
    // remote object).
    let numbers: Vec<u64> = (2..=count).collect();
    let others = shard_set::open_each(&numbers, |&i| {
        let name = format!("{stem}-{i:05}-of-{count:05}.gguf");
        let path = dir.join(&name);
        let shard = open_shard(&src, &name, Shard::Gguf, limits).and_then(|(c, s)| {
            let n = c.attributes.get("split.no").and_then(Json::as_u64);
            if n == Some(i - 1) && gguf_split_count(&c) == count {
                Ok((c, s))
            } else {
                Err(format!(
                    "{}: its header says split {} of {}, expected {} of {count}",
                    s.label(),
                    n.map_or("?".into(), |n| (n + 1).to_string()),
                    gguf_split_count(&c),
                    i
                ))
            }
        });
        (path, shard)
    });
    set.add(&first_path, Ok((first, src)), None);
    for (path, shard) in others {
        set.add(&path, shard, None);
    }
    set.finish()
}

/// What a shard of a set must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shard {
    Safetensors,
    Gguf,
}

/// The shard named `name` beside `beside`, read on its own, or why it
/// cannot be.
fn open_shard(beside: &MappedFile, name: &str, kind: Shard, limits: Limits) -> ShardResult {
    let src = beside.sibling(name).map_err(|e| e.to_string())?;
    super::prepare(&src, limits).map_err(|e| e.to_string())?;
    let bytes = src.bytes();
    match kind {
        Shard::Safetensors if safetensors::looks_like(bytes) => {
            let label = src.label().to_string();
            let mut o = safetensors::open(src, limits).map_err(|e| e.to_string())?;
            let catalog = std::mem::take(&mut o.catalog);
            let src = o.sources.pop().flatten().ok_or(label)?;
            Ok((catalog, src))
        }
        Shard::Gguf if gguf::looks_like(bytes) => {
            gguf::open(src, limits).map_err(|e| e.to_string())
        }
        Shard::Safetensors => Err(format!("{}: not a safetensors file", src.label())),
        Shard::Gguf => Err(format!("{}: not a {} file", src.label(), gguf::NAME)),
    }
}
