//! The view table (`views::VIEWS`, `src/views/mod.rs`) enumerated. Every
//! view has: a name `--views` takes and a hidden top directory, neither
//! shared with another view; a test through a real mount against a library
//! that reads it (`tests/views.rs`); a row in the benchmark's views
//! section (`scripts/bench.py`); and its section in `docs/views.md`. A view
//! added to the table without them fails here.

use std::collections::HashSet;
use std::path::Path;

use ztensor_mount::views::{VIEWS, Views};

fn text(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_view_has_its_own_name_and_hidden_directory() {
    let mut names = HashSet::new();
    let mut dirs = HashSet::new();
    for r in VIEWS {
        assert!(names.insert(r.name), "two views are named {:?}", r.name);
        assert!(dirs.insert(r.dir), "two views use {:?}", r.dir);
        assert!(
            r.dir.starts_with('.') && r.dir.len() > 1 && !r.dir.contains('/'),
            "view {:?}: its directory {:?} is not one hidden name",
            r.name,
            r.dir
        );
        assert!(
            !matches!(r.name, "all" | "none") && !r.name.contains([',', '+', ' ']),
            "view {:?}: --views could not name it",
            r.name
        );
        assert!(
            (r.path_of)(r.dir, "a/b").starts_with(&format!("{}/", r.dir)),
            "view {:?}: a tensor's place in it is outside its directory",
            r.name
        );
    }
}

#[test]
fn views_selects_each_view_by_its_name_alone() {
    for (id, r) in VIEWS.iter().enumerate() {
        let v = Views::parse(r.name).unwrap();
        for other in 0..VIEWS.len() {
            assert_eq!(v.has(other), other == id, "--views {}", r.name);
        }
    }
    let all = Views::parse("all").unwrap();
    assert!((0..VIEWS.len()).all(|id| all.has(id)));
    assert_eq!(all, Views::ALL);
    assert_eq!(Views::parse("none").unwrap(), Views::NONE);
    for mixed in ["none,npy", "npy,none", "all,none", "zarr,all"] {
        let err = Views::parse(mixed).unwrap_err();
        assert!(err.contains("all and none stand alone"), "{mixed}: {err}");
    }
    for empty in ["", ",,", " "] {
        let err = Views::parse(empty).unwrap_err();
        assert!(err.contains("give none for no views"), "{empty:?}: {err}");
    }
    let err = Views::parse("tiff").unwrap_err();
    for r in VIEWS {
        assert!(
            err.contains(r.name),
            "the refusal names {:?}: {err}",
            r.name
        );
    }
}

#[test]
fn every_view_is_tested_through_a_mount_benchmarked_and_documented() {
    let tests = text("tests/views.rs");
    let bench = text("scripts/bench.py");
    let docs = text("docs/views.md");
    for r in VIEWS {
        assert!(
            tests.contains(&format!("\"{}/", r.dir)) || tests.contains(&format!("\"{}\"", r.dir)),
            "view {:?}: no test in tests/views.rs reads {}",
            r.name,
            r.dir
        );
        assert!(
            bench.contains(&format!("\"{}/", r.dir)),
            "view {:?}: scripts/bench.py's views section does not read {}",
            r.name,
            r.dir
        );
        assert!(
            docs.contains(&format!("## `{}", r.dir)),
            "view {:?}: docs/views.md has no section for {}",
            r.name,
            r.dir
        );
    }
}
