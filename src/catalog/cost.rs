//! What a catalog takes in memory once the mount has laid it out: the
//! catalog itself (names, shapes, blobs, parts, sidecar fields) and what
//! the tree, the sidecars and the views make of each tensor. Every format
//! is held to `--index-memory` with this one measure: after its module
//! has built the catalog ([`check`]), and while it parses where the index
//! can be large (a safetensors header is charged entry by entry).
//!
//! The figures are upper estimates, measured: the daemon of a mount of
//! 120 000 one-byte safetensors tensors peaked at about 3.4 KiB per tensor
//! (the parsed header and the catalog at once, then the tree and views),
//! which the estimate exceeds (`tests/mount_hostile.rs`,
//! `index_memory_bounds_a_large_safetensors_header`).

use super::{Catalog, Json, JsonMap, Meta, Tensor};

/// One tensor, beyond its strings and fields: its catalog entry and blob,
/// its tree nodes (data file and sidecar), placement, and view entries.
pub const TENSOR_COST: u64 = 3072;
/// One more part of a tensor (a file, a sidecar and a blob).
pub const PART_COST: u64 = 512;
/// A directory a `/` in a name may make (a node, its table, its name).
pub const DIR_COST: u64 = 512;
/// The least a string or a JSON value takes (an allocation and its slot).
const SMALL: u64 = 32;

/// What a name takes: its bytes (at least a small allocation), held
/// several times over (catalog, tree, the views' mirrors), and a directory
/// for each `/`.
pub fn name_cost(name: &str) -> u64 {
    let slashes = name.bytes().filter(|&b| b == b'/').count() as u64;
    (name.len() as u64)
        .max(SMALL)
        .saturating_mul(3)
        .saturating_add(slashes.saturating_mul(DIR_COST))
}

/// What a JSON value takes decoded (serde_json with ordered maps): a slot
/// per value, the bytes of each string and key, an entry per map key.
pub fn json_cost(v: &Json) -> u64 {
    match v {
        Json::String(s) => SMALL.saturating_add(s.len() as u64),
        Json::Array(a) => a.iter().fold(SMALL.saturating_mul(2), |n, x| {
            n.saturating_add(json_cost(x))
        }),
        Json::Object(m) => SMALL.saturating_mul(2).saturating_add(map_cost(m)),
        _ => SMALL,
    }
}

/// What the entries of a JSON map take.
pub fn map_cost(m: &JsonMap) -> u64 {
    m.iter().fold(0u64, |n, (k, x)| {
        n.saturating_add(3 * SMALL + k.len() as u64)
            .saturating_add(json_cost(x))
    })
}

/// What a tensor's or part's own fields take: their text.
pub fn meta_cost(m: &Meta) -> u64 {
    SMALL.saturating_add(m.text_len() as u64)
}

/// What one tensor of a catalog takes once laid out.
pub fn tensor_cost(t: &Tensor) -> u64 {
    let meta = meta_cost(&t.meta);
    let parts = t.parts.as_ref().map_or_else(
        |why| why.len() as u64,
        |ps| {
            ps.iter().fold(0u64, |n, p| {
                let pmeta = meta_cost(&p.meta);
                n.saturating_add(PART_COST)
                    .saturating_add(name_cost(&p.name))
                    .saturating_add(8 * p.shape.len() as u64)
                    .saturating_add(pmeta)
            })
        },
    );
    TENSOR_COST
        .saturating_add(name_cost(&t.name))
        .saturating_add(8 * t.shape.len() as u64)
        .saturating_add((t.dtype.len() + t.layout.len() + t.encoding.len()) as u64)
        .saturating_add(meta)
        .saturating_add(parts)
}

/// What the whole catalog takes once laid out.
pub fn catalog_cost(c: &Catalog) -> u64 {
    let attrs = map_cost(&c.attributes);
    c.tensors
        .iter()
        .fold(attrs, |n, t| n.saturating_add(tensor_cost(t)))
}

/// Refuses a catalog that would take more than `limit` bytes once laid
/// out: the message, for one line naming the file.
pub fn check(c: &Catalog, limit: u64) -> Result<(), String> {
    let cost = catalog_cost(c);
    if cost > limit {
        return Err(format!(
            "its index of {} tensors would take about {cost} bytes in memory (catalog, tree and \
             views), more than the {limit} allowed (--index-memory)",
            c.tensors.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_grow_with_what_is_held() {
        assert_eq!(name_cost("a"), 3 * SMALL);
        assert_eq!(name_cost("a/b"), 3 * SMALL + DIR_COST);
        let small = serde_json::json!({"k": 1});
        let big = serde_json::json!({"k": "x".repeat(1000)});
        assert!(json_cost(&big) >= json_cost(&small) + 1000);
        assert!(json_cost(&serde_json::json!([1, 2, 3])) >= 3 * SMALL);
    }
}
