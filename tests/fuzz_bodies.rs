//! Every fuzz target's body (`ztensor_mount::fuzzing`, one function per
//! target in `fuzz/fuzz_targets/`) run over that target's seeds in
//! `fuzz/seeds/`: the bodies build with every `cargo test` on the stable
//! toolchain, and each must hold its assertions on its seeds. The fuzz
//! crate itself (libFuzzer, nightly) is built by `fuzz/run.sh`.

use std::path::Path;

use ztensor_mount::fuzzing;

/// A fuzz target's body.
type Body = fn(&[u8]);

const TARGETS: &[(&str, Body)] = &[
    ("index", fuzzing::index),
    ("data_path", fuzzing::data_path),
    ("zt_v1", fuzzing::zt_v1),
    ("zt_v2_seek", fuzzing::zt_v2_seek),
    ("deathtensors", fuzzing::deathtensors),
    ("formats", fuzzing::formats),
];

fn fuzz_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz"))
}

fn run(target: &str) {
    let (_, body) = TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .unwrap_or_else(|| panic!("no body for {target}"));
    let seeds = fuzz_dir().join("seeds").join(target);
    let mut n = 0;
    for e in std::fs::read_dir(&seeds).unwrap_or_else(|e| panic!("{}: {e}", seeds.display())) {
        let path = e.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        body(&bytes);
        // Cut short too: the half that a truncated copy would be.
        body(&bytes[..bytes.len() / 2]);
        n += 1;
    }
    assert!(n > 0, "{target}: no seeds in {}", seeds.display());
}

/// Each target file in `fuzz/fuzz_targets/` calls the body of its name,
/// each is a `[[bin]]` of the fuzz crate, and each has a body here.
#[test]
fn every_fuzz_target_is_a_body_of_the_library() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let mut found = Vec::new();
    for e in std::fs::read_dir(fuzz_dir().join("fuzz_targets")).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let src = std::fs::read_to_string(&path).unwrap();
        assert!(
            src.contains(&format!("ztensor_mount::fuzzing::{name}(data)")),
            "{}: its body must be ztensor_mount::fuzzing::{name}",
            path.display()
        );
        assert!(
            manifest.contains(&format!("path = \"fuzz_targets/{name}.rs\"")),
            "fuzz/Cargo.toml lacks the target {name}"
        );
        assert!(
            TARGETS.iter().any(|(n, _)| *n == name),
            "{name}: not run here"
        );
        found.push(name);
    }
    assert_eq!(found.len(), TARGETS.len(), "{found:?}");
}

#[test]
fn index_seeds() {
    run("index");
}

#[test]
fn data_path_seeds() {
    run("data_path");
}

#[test]
fn zt_v1_seeds() {
    run("zt_v1");
}

#[test]
fn zt_v2_seek_seeds() {
    run("zt_v2_seek");
}

#[test]
fn deathtensors_seeds() {
    run("deathtensors");
}

#[test]
fn formats_seeds() {
    run("formats");
}
