//! What a catalog takes in memory once the mount has laid it out: the
//! catalog itself (names, shapes, blobs, parts, sidecar fields) and what
//! the tree, the sidecars and the views make of each tensor. Every format
//! is held to `--index-memory` with this one measure: after its module
//! has built the catalog ([`check`]), and while it parses where the index
//! can be large (a safetensors header is charged entry by entry).
//!
//! The figures are upper estimates, measured with `.ztensor/index.json`
//! read (its text is made whole while it is open): the daemon of a mount
//! of 120 000 safetensors tensors of 8-byte names peaked at 3.4 KiB per
//! tensor, of 150 000 of 200-byte names at 5.2 KiB, of 100 000 of
//! 500-byte names at 7.9 KiB, of 30 000 of 2000-byte names at 18.4 KiB:
//! about 3.5 KiB and 9 bytes per byte of a name (the catalog, the tree,
//! the views' mirrors and sidecars, the index's text), which the estimate
//! exceeds (`tests/mount_hostile.rs`,
//! `index_memory_bounds_a_large_safetensors_header` and
//! `index_memory_bounds_an_index_of_long_names_read_whole`).

use super::{Catalog, Json, JsonMap, Meta, Tensor};

/// One tensor, beyond its strings and fields: its catalog entry and blob,
/// its tree nodes (data file and sidecar), placement, and view entries.
pub const TENSOR_COST: u64 = 3584;
/// One more part of a tensor (a file, a sidecar and a blob).
pub const PART_COST: u64 = 512;
/// A directory a `/` in a name may make (a node, its table, its name).
pub const DIR_COST: u64 = 512;
/// The least a string or a JSON value takes (an allocation and its slot).
const SMALL: u64 = 32;

/// Times a name's bytes are held: the catalog, the tree, the views'
/// mirrors, the sidecars, `.ztensor/index.json`'s text (measured: 8.7).
const NAME_COPIES: u64 = 9;

/// What a name takes: its bytes (at least a small allocation), held
/// [`NAME_COPIES`] times over, and a directory for each `/`.
pub fn name_cost(name: &str) -> u64 {
    let slashes = name.bytes().filter(|&b| b == b'/').count() as u64;
    (name.len() as u64)
        .max(SMALL)
        .saturating_mul(NAME_COPIES)
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
            "its index of {} tensors would take about {} in memory (catalog, tree and views), \
             more than the {} allowed (--index-memory)",
            c.tensors.len(),
            crate::size::bytes(cost),
            crate::size::bytes(limit)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_grow_with_what_is_held() {
        assert_eq!(name_cost("a"), NAME_COPIES * SMALL);
        assert_eq!(name_cost("a/b"), NAME_COPIES * SMALL + DIR_COST);
        let small = serde_json::json!({"k": 1});
        let big = serde_json::json!({"k": "x".repeat(1000)});
        assert!(json_cost(&big) >= json_cost(&small) + 1000);
        assert!(json_cost(&serde_json::json!([1, 2, 3])) >= 3 * SMALL);
    }
}
