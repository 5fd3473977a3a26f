//! `ztensor-mount info FILE.zt [--json]`

use std::path::Path;
use std::process::ExitCode;

use crate::format::ZtFile;
use crate::mount::sidecar;
use crate::mount::tree::Tree;

pub fn run(path: &Path, json: bool) -> ExitCode {
    let zt = match ZtFile::open(path) {
        Ok(zt) => zt,
        Err(e) => {
            eprintln!("ztensor-mount: {e}");
            return ExitCode::from(1);
        }
    };
    let cat = zt.catalog();
    // The same placements the mount would use, so paths agree.
    let tree = Tree::build(cat);
    if json {
        let all: Vec<_> = cat
            .tensors
            .iter()
            .zip(&tree.placements)
            .map(|(t, p)| sidecar::tensor_sidecar(t, p))
            .collect();
        print!("{}", String::from_utf8_lossy(&sidecar::render(&all)));
        return ExitCode::SUCCESS;
    }
    println!("{}: {} tensors", zt.label(), cat.len());
    println!(
        "{:<40} {:<9} {:<18} {:<7} {:<8} {:>14} {:>14}  NOTE",
        "NAME", "DTYPE", "SHAPE", "LAYOUT", "ENCODING", "SIZE", "NBYTES"
    );
    for t in &cat.tensors {
        let shape = format!("{:?}", t.shape);
        let (nbytes, note) = match &t.layout {
            Ok(l) => (
                l.parts.iter().map(|p| p.nbytes).sum::<u64>().to_string(),
                t.checksum
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
            ),
            Err(why) => ("-".into(), format!("unsupported: {why}")),
        };
        println!(
            "{:<40} {:<9} {:<18} {:<7} {:<8} {:>14} {:>14}  {}",
            t.name, t.dtype_name, shape, t.layout_name, t.encoding_name, t.size, nbytes, note
        );
    }
    ExitCode::SUCCESS
}
