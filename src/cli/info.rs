//! `ztensor-mount info FILE [--json]`

use std::path::Path;
use std::process::ExitCode;

use crate::formats::{self, Limits};
use crate::mount::sidecar;
use crate::mount::tree::Tree;
use crate::views::Views;

pub fn run(path: &Path, json: bool, remote: &crate::source::RemoteOptions) -> ExitCode {
    let cat = match formats::open_arg(&path.to_string_lossy(), Limits::default(), remote) {
        Ok(opened) => opened.catalog,
        Err(e) => {
            eprintln!("ztensor-mount: {}", super::one_line(e));
            return ExitCode::from(1);
        }
    };
    // The same placements the mount would use, so paths agree.
    let cat = std::sync::Arc::new(cat);
    let tree = Tree::build(cat.clone(), Views::NONE);
    if json {
        let paths: Vec<String> = (0..cat.len()).map(|i| tree.path_of(i)).collect();
        let all: Vec<_> = cat
            .tensors
            .iter()
            .zip(&tree.placements)
            .zip(&paths)
            .enumerate()
            .map(|(i, ((t, p), path))| sidecar::tensor_sidecar(&cat, t, path, p, tree.views_of(i)))
            .collect();
        print!("{}", String::from_utf8_lossy(&sidecar::render(&all)));
        return ExitCode::SUCCESS;
    }
    let n = cat.len();
    let noun = if n == 1 { "tensor" } else { "tensors" };
    println!("{}: {}, {n} {noun}", cat.label, cat.format);
    println!(
        "{:<40} {:<9} {:<18} {:<7} {:<8} {:>14} {:>14}  NOTE",
        "NAME", "DTYPE", "SHAPE", "LAYOUT", "ENCODING", "SIZE", "NBYTES"
    );
    for t in &cat.tensors {
        let shape = format!("{:?}", t.shape);
        let stored: u64 = t.parts.as_ref().map_or(0, |ps| {
            ps.iter()
                .map(|p| cat.blobs.get(p.blob).map_or(0, |b| b.len))
                .sum()
        });
        let (nbytes, note) = match (&t.parts, t.nbytes()) {
            (Ok(_), Some(n)) => (n.to_string(), checksums(&cat, t)),
            (Err(why), _) => ("-".into(), format!("unsupported: {why}")),
            _ => ("-".into(), String::new()),
        };
        println!(
            "{:<40} {:<9} {:<18} {:<7} {:<8} {:>14} {:>14}  {}",
            crate::mount::tree::printable(&t.name),
            crate::mount::tree::printable(&t.dtype),
            shape,
            crate::mount::tree::printable(&t.layout),
            crate::mount::tree::printable(&t.encoding),
            stored,
            nbytes,
            crate::mount::tree::printable(&note)
        );
    }
    ExitCode::SUCCESS
}

/// The digests recorded for a tensor's blobs.
fn checksums(cat: &crate::catalog::Catalog, t: &crate::catalog::Tensor) -> String {
    use crate::catalog::Check;
    let Ok(parts) = &t.parts else {
        return String::new();
    };
    let mut out: Vec<String> = Vec::new();
    for p in parts {
        for c in cat.blobs.get(p.blob).map_or(&[][..], |b| &b.checks[..]) {
            if let Check::Stored(d) | Check::Decoded(d) = c {
                out.push(d.to_string());
            }
        }
    }
    out.dedup();
    out.join(" ")
}
