//! The fuzz seeds (`fuzz/seeds/`) against an oracle that is not this
//! project: each seed is opened the way the `formats` fuzz body opens it
//! (`formats::open`, then the mount's data layer reads every part of every
//! tensor), and what the library serves is compared with what the format's
//! own reader gives for the same file (`tests/python/seed_oracle.py`):
//! safetensors, gguf, h5py, numpy (npz), onnx, deathtensors, ztensor 0.1.4
//! (zTensor v0.1) and ztensor 1.x (zTensor v1). The `.pt` seeds are the
//! fixtures torch wrote (`tests/fixtures/pt/`), compared with the digests
//! recorded from torch when they were made: torch is too big for the venv.
//!
//! For a seed the reader accepts: the same tensor names; every tensor the
//! library serves has the reader's shape, element size and, per part, the
//! sha256 of the reader's little-endian C-order bytes; a tensor the library
//! lists as unsupported (or fails to read) is one the reader cannot give as
//! a plain array either (in the hostile v0.1 corpus the library may refuse
//! more than the reader: each case is printed). A v0.1 seed the reader
//! refuses only for want of `layout` is read by it again with `layout:
//! "dense"` added. For a seed the reader refuses, the library refuses
//! it too or serves none of it, unless the refusal is one of the documented
//! ways the library is more lenient ([`LENIENT`]).
//!
//! Left out: `zt_v2_seek` seeds are seek-table fragments, not files (no
//! reader takes them); `data_path` seeds are the `index` seeds behind an
//! 8-byte read plan (checked here), so they are compared once.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use support::python::Python;
use ztensor_mount::formats::{self, Limits};
use ztensor_mount::serve::data::{Data, DataOptions, PROGRESSIVE_MIN};
use ztensor_mount::serve::stats::Stats;

fn seeds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds")
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Whether a seed of `formats/` is a copy of a zTensor or deathtensors
/// file whose reader checks it where it comes from: the `index`, `zt_v1`
/// and `deathtensors` seeds (here), the v2 corpus (`tests/zt_v2_corpus.rs`).
fn is_copy_checked_elsewhere(seed: &Path) -> bool {
    if !matches!(
        seed.extension().and_then(|e| e.to_str()),
        Some("zt" | "deathtensors")
    ) {
        return false;
    }
    let bytes = std::fs::read(seed).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let homes = [
        seeds_dir().join("index"),
        seeds_dir().join("zt_v1"),
        seeds_dir().join("deathtensors"),
        root.join("tests/zt_v2/corpus/valid"),
        root.join("tests/zt_v2/corpus/reject"),
    ];
    let same = homes
        .iter()
        .flat_map(|d| files_in(d))
        .any(|p| std::fs::read(p).is_ok_and(|b| b == bytes));
    assert!(same, "{}: a copy of no checked file", seed.display());
    true
}

/// Which reader of `seed_oracle.py` reads a seed of `formats/`.
fn reader_of(path: &Path) -> Option<&'static str> {
    match path.extension()?.to_str()? {
        "safetensors" => Some("safetensors"),
        "gguf" => Some("gguf"),
        "h5" => Some("hdf5"),
        "npz" => Some("npz"),
        "onnx" => Some("onnx"),
        _ => None,
    }
}

/// The documented ways the library reads a file its format's reader
/// refuses: (reader, what the refusal says, where it is documented).
const LENIENT: &[(&str, &str, &str)] = &[
    (
        "zt01",
        "missing field `layout`",
        "docs/library.md: an entry without `layout` is dense",
    ),
    (
        "zt01",
        "unknown variant `complex64`",
        "docs/library.md: an unknown dtype makes that tensor unsupported, not the file bad",
    ),
    (
        "zt01",
        "unknown variant `lz4`",
        "docs/library.md: an unknown encoding makes that tensor unsupported, not the file bad",
    ),
    (
        "zt01",
        "unknown variant `blocked`",
        "docs/library.md: an unknown layout makes that tensor unsupported, not the file bad",
    ),
    (
        "zt01",
        "unknown variant `sparse`",
        "docs/library.md: this project's sparse form (`layout: \"sparse\"`)",
    ),
];

struct LibPart {
    name: String,
    shape: Vec<u64>,
    itemsize: u64,
    /// sha256 of the bytes served, or why the read failed.
    sha256: Result<String, String>,
}

struct LibTensor {
    dtype: String,
    shape: Vec<u64>,
    /// The parts, or why the tensor is unsupported.
    parts: Result<Vec<LibPart>, String>,
}

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// What the library serves for the file at `path`: every tensor by name,
/// each part read whole through the data layer; or why it refused the file.
fn library(path: &Path) -> Result<BTreeMap<String, LibTensor>, String> {
    let limits = Limits {
        index_memory: 64 << 20,
    };
    let opened = formats::open(path, limits).map_err(|e| e.to_string())?;
    let cache = tempfile::tempdir().unwrap();
    let opts = DataOptions {
        cache_size: 16 << 20,
        cache_dir: cache.path().to_path_buf(),
        verify_raw: true,
        progressive_min: PROGRESSIVE_MIN,
    };
    let d = Data::new(
        opened.catalog,
        opened.sources,
        opts,
        Arc::new(Stats::default()),
    )
    .map_err(|e| format!("data layer: {e}"))?;
    let mut out = BTreeMap::new();
    for (ti, t) in d.catalog().tensors.iter().enumerate() {
        let parts = t.parts.clone().map(|ps| {
            ps.iter()
                .enumerate()
                .map(|(pi, p)| {
                    let mut buf = Vec::new();
                    let read = loop {
                        let off = buf.len() as u64;
                        if off >= p.nbytes {
                            break Ok(sha256(&buf));
                        }
                        match d.read(ti, pi, off, (p.nbytes - off).min(1 << 20)) {
                            Ok(b) if b.is_empty() => break Err(format!("short at {off}")),
                            Ok(b) => buf.extend_from_slice(&b),
                            Err(e) => break Err(e.to_string()),
                        }
                    };
                    LibPart {
                        name: p.name.clone(),
                        shape: p.shape.clone(),
                        itemsize: p.dtype.size(),
                        sha256: read,
                    }
                })
                .collect()
        });
        let prev = out.insert(
            t.name.clone(),
            LibTensor {
                dtype: t.dtype.clone(),
                shape: t.shape.clone(),
                parts,
            },
        );
        assert!(
            prev.is_none(),
            "{}: two tensors named {}",
            path.display(),
            t.name
        );
    }
    Ok(out)
}

/// What one seed came to, for the summary.
#[derive(Default)]
struct Tally {
    seeds: usize,
    both_read: usize,
    tensors_equal: usize,
    unsupported_both: usize,
    both_refuse: usize,
    /// Seeds only the library reads, each with where that is documented.
    lenient: Vec<String>,
    /// Files or tensors of a hostile corpus that only the library refuses
    /// (refusing is always allowed there), each with its reason.
    stricter: Vec<String>,
}

fn shape_of(j: &Json) -> Option<Vec<u64>> {
    j.as_array()
        .map(|a| a.iter().map(|d| d.as_u64().unwrap()).collect())
}

/// Compares the library with the reader's answer `theirs` for one seed,
/// adding what disagrees to `findings`.
fn compare(
    kind: &str,
    path: &Path,
    theirs: &Json,
    hostile: bool,
    tally: &mut Tally,
    findings: &mut Vec<String>,
) {
    let seed = path.strip_prefix(seeds_dir()).unwrap_or(path).display();
    let ours = library(path);
    tally.seeds += 1;
    if let Some(why) = theirs.get("refused").and_then(Json::as_str) {
        let Ok(ours) = ours else {
            tally.both_refuse += 1;
            return;
        };
        let served: Vec<&String> = ours
            .iter()
            .filter(|(_, t)| {
                t.parts
                    .as_ref()
                    .is_ok_and(|ps| ps.iter().any(|p| p.sha256.is_ok()))
            })
            .map(|(n, _)| n)
            .collect();
        if served.is_empty() {
            tally.both_refuse += 1;
        } else if let Some((_, _, doc)) = LENIENT
            .iter()
            .find(|(k, says, _)| *k == kind && why.contains(says))
        {
            tally.lenient.push(format!("{seed} ({doc})"));
        } else {
            findings.push(format!(
                "{seed}: the reader refuses it ({why}); the library serves {served:?}"
            ));
        }
        return;
    }
    let theirs = theirs["tensors"].as_array().unwrap();
    let ours = match ours {
        Ok(o) => o,
        Err(e) if hostile => {
            tally.stricter.push(format!("{seed}: {e}"));
            return;
        }
        Err(e) => {
            findings.push(format!(
                "{seed}: the library refuses it ({e}); the reader gives {} tensors",
                theirs.len()
            ));
            return;
        }
    };
    tally.both_read += 1;
    let names: Vec<&str> = theirs.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    let ours_names: Vec<&str> = ours.keys().map(String::as_str).collect();
    if sorted != ours_names {
        findings.push(format!(
            "{seed}: the library lists {ours_names:?}, the reader {sorted:?}"
        ));
    }
    for t in theirs {
        let name = t["name"].as_str().unwrap();
        let Some(o) = ours.get(name) else { continue };
        let at = format!("{seed}: {name}");
        if let Some(why) = t.get("unreadable").and_then(Json::as_str) {
            // The reader cannot give it as a plain array: the library must
            // not serve it either.
            match &o.parts {
                Err(_) => tally.unsupported_both += 1,
                Ok(ps) if ps.iter().all(|p| p.sha256.is_err()) => tally.unsupported_both += 1,
                Ok(_) => findings.push(format!(
                    "{at}: the reader cannot read it ({why}); the library serves it"
                )),
            }
            continue;
        }
        let parts = match &o.parts {
            Ok(ps) => ps,
            Err(why) if hostile => {
                tally.stricter.push(format!("{at}: unsupported: {why}"));
                continue;
            }
            Err(why) => {
                findings.push(format!(
                    "{at}: listed as unsupported ({why}); the reader gives it as {}",
                    t["dtype"]
                ));
                continue;
            }
        };
        let mut ok = true;
        if shape_of(&t["shape"]).as_ref() != Some(&o.shape) {
            findings.push(format!(
                "{at}: shape {:?} ({}), the reader's {} ({})",
                o.shape, o.dtype, t["shape"], t["dtype"]
            ));
            ok = false;
        }
        let tparts = t["parts"].as_object().unwrap();
        let pnames: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        let mut tnames: Vec<&str> = tparts.keys().map(String::as_str).collect();
        let mut sorted_ours = pnames.clone();
        sorted_ours.sort_unstable();
        tnames.sort_unstable();
        if sorted_ours != tnames {
            findings.push(format!(
                "{at}: parts {pnames:?}, the reader's components {tnames:?}"
            ));
            continue;
        }
        for p in parts {
            let tp = &tparts[&p.name];
            let pat = format!("{at}/{}", p.name);
            match &p.sha256 {
                Err(e) if hostile => {
                    tally.stricter.push(format!("{pat}: read fails: {e}"));
                    ok = false;
                }
                Err(e) => {
                    findings.push(format!(
                        "{pat}: the library fails to read it ({e}); the reader gives it"
                    ));
                    ok = false;
                }
                Ok(h) if h.as_str() != tp["sha256"].as_str().unwrap() => {
                    findings.push(format!(
                        "{pat}: other bytes than the reader's ({} {:?}, the reader's {} {})",
                        o.dtype, p.shape, t["dtype"], tp["shape"]
                    ));
                    ok = false;
                }
                Ok(_) => {}
            }
            // An element size of 1 from the reader is raw bytes (GGUF's
            // quantized blocks, a zTensor v1 component read raw).
            let item = tp["itemsize"].as_u64().unwrap();
            if item > 1 && item != p.itemsize {
                findings.push(format!(
                    "{pat}: elements of {} bytes, the reader's of {item}",
                    p.itemsize
                ));
                ok = false;
            }
        }
        if ok {
            tally.tensors_equal += 1;
        }
    }
}

/// Runs `seed_oracle.py KIND PATHS...` and returns its answer by path.
fn oracle(python: &Python, kind: &str, paths: &[PathBuf]) -> serde_json::Map<String, Json> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/seed_oracle.py");
    let out = python
        .cmd()
        .arg(&script)
        .arg(kind)
        .args(paths)
        .output()
        .unwrap_or_else(|e| panic!("run seed_oracle.py: {e}"));
    assert!(
        out.status.success(),
        "seed_oracle.py {kind} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout) {
        Ok(Json::Object(m)) => m,
        other => panic!("seed_oracle.py {kind}: not a JSON object: {other:?}"),
    }
}

fn check(python: &Python, kind: &str, paths: &[PathBuf], findings: &mut Vec<String>) -> Tally {
    assert!(!paths.is_empty(), "{kind}: no seeds");
    let answers = oracle(python, kind, paths);
    let pairs: Vec<(PathBuf, Json)> = paths
        .iter()
        .map(|p| (p.clone(), answer(&answers, p)))
        .collect();
    tally(kind, &pairs, findings)
}

fn answer(answers: &serde_json::Map<String, Json>, p: &Path) -> Json {
    answers
        .get(p.to_str().unwrap())
        .unwrap_or_else(|| panic!("no answer for {}", p.display()))
        .clone()
}

/// Compares each seed with the reader's answer beside it; prints the tally.
fn tally(kind: &str, pairs: &[(PathBuf, Json)], findings: &mut Vec<String>) -> Tally {
    let mut tally = Tally::default();
    for (p, theirs) in pairs {
        // The v0.1 seeds are the hostile corpus (and the example model).
        compare(kind, p, theirs, kind == "zt01", &mut tally, findings);
    }
    eprintln!(
        "{kind}: {} seeds: {} read by both ({} tensors equal, {} unsupported by both), \
         {} refused by both, {} read only by the library (documented)",
        tally.seeds,
        tally.both_read,
        tally.tensors_equal,
        tally.unsupported_both,
        tally.both_refuse,
        tally.lenient.len()
    );
    for l in &tally.lenient {
        eprintln!("  read only by the library: {l}");
    }
    for l in &tally.stricter {
        eprintln!("  refused only by the library: {l}");
    }
    tally
}

/// `file` (zTensor v0.1) with `layout: "dense"` added to every index entry
/// that has none, the blobs untouched: what the reference reader reads in
/// place of a file it refuses only for the missing field. `None` when the
/// index is not a CBOR array of maps.
fn with_layout(file: &[u8]) -> Option<Vec<u8>> {
    use ciborium::Value;
    let n = u64::from_le_bytes(file.get(file.len().checked_sub(8)?..)?.try_into().ok()?);
    let start = (file.len() as u64 - 8).checked_sub(n)? as usize;
    let mut index: Value = ciborium::from_reader(&file[start..file.len() - 8]).ok()?;
    for entry in index.as_array_mut()? {
        let map = entry.as_map_mut()?;
        if !map.iter().any(|(k, _)| k.as_text() == Some("layout")) {
            map.push((Value::Text("layout".into()), Value::Text("dense".into())));
        }
    }
    let mut out = file[..start].to_vec();
    let mut cbor = Vec::new();
    ciborium::into_writer(&index, &mut cbor).ok()?;
    out.extend_from_slice(&cbor);
    out.extend_from_slice(&(cbor.len() as u64).to_le_bytes());
    Some(out)
}

fn main_python() -> Option<Python> {
    Python::from_env().require(
        "Python with numpy, safetensors, gguf, h5py, onnx, deathtensors and ztensor==0.1.4 \
         (scripts/setup.sh)",
        "import importlib.metadata as m, numpy, safetensors, gguf, h5py, onnx, deathtensors; \
         print(m.version('ztensor'))",
        |v| support::python::version_is("ztensor", "0.1.4", v),
    )
}

#[test]
fn foreign_format_seeds_match_their_readers() {
    let Some(python) = main_python() else { return };
    let mut findings = Vec::new();
    let all = files_in(&seeds_dir().join("formats"));
    let mut by_kind: BTreeMap<&str, Vec<PathBuf>> = BTreeMap::new();
    for p in &all {
        if let Some(k) = reader_of(p) {
            by_kind.entry(k).or_default().push(p.clone());
        } else if is_copy_checked_elsewhere(p) {
            continue;
        } else {
            assert_eq!(
                p.extension().and_then(|e| e.to_str()),
                Some("pt"),
                "{}: which reader?",
                p.display()
            );
        }
    }
    for (kind, paths) in &by_kind {
        let t = check(&python, kind, paths, &mut findings);
        assert_eq!(t.both_read, t.seeds, "{kind}: every seed is a valid file");
    }
    let dt = files_in(&seeds_dir().join("deathtensors"));
    check(&python, "deathtensors", &dt, &mut findings);
    assert!(findings.is_empty(), "findings:\n{}", findings.join("\n"));
}

#[test]
fn zt_v01_seeds_match_the_reference_reader() {
    let Some(python) = main_python() else { return };
    let index = files_in(&seeds_dir().join("index"));
    // The data_path seeds are these files behind 8 bytes of read plan.
    for p in files_in(&seeds_dir().join("data_path")) {
        let twin = seeds_dir().join("index").join(p.file_name().unwrap());
        let (a, b) = (std::fs::read(&p).unwrap(), std::fs::read(&twin));
        assert!(
            b.is_ok_and(|b| a.len() >= 8 && a[8..] == b[..]),
            "{}: not an index seed behind a read plan; compare it here",
            p.display()
        );
    }
    let answers = oracle(&python, "zt01", &index);
    // A seed the reader refuses only for want of `layout` (which the
    // library reads as dense): the reader reads it again with the field
    // added, and its answer stands for the seed's.
    let patched_dir = tempfile::tempdir().unwrap();
    let mut patched = BTreeMap::new();
    for p in &index {
        let refusal = answer(&answers, p);
        let why = refusal.get("refused").and_then(Json::as_str).unwrap_or("");
        if why.contains("missing field `layout`")
            && let Some(bytes) = with_layout(&std::fs::read(p).unwrap())
        {
            let q = patched_dir.path().join(p.file_name().unwrap());
            std::fs::write(&q, bytes).unwrap();
            patched.insert(p.clone(), q);
        }
    }
    let qs: Vec<PathBuf> = patched.values().cloned().collect();
    let again = oracle(&python, "zt01", &qs);
    let pairs: Vec<(PathBuf, Json)> = index
        .iter()
        .map(|p| match patched.get(p) {
            Some(q) => (p.clone(), answer(&again, q)),
            None => (p.clone(), answer(&answers, p)),
        })
        .collect();
    eprintln!(
        "zt01: {} seeds read again with `layout: \"dense\"` added",
        qs.len()
    );
    let mut findings = Vec::new();
    let t = tally("zt01", &pairs, &mut findings);
    assert!(
        t.both_read > 0,
        "the reference reader reads none of the seeds"
    );
    assert!(findings.is_empty(), "findings:\n{}", findings.join("\n"));
}

#[test]
fn zt_v1_seeds_match_the_ztensor_1_package() {
    let Some(python) = Python::ztensor(1).require(
        "ztensor 1.x in .venv/ztensor/1 (scripts/setup.sh)",
        "import importlib.metadata as m, ztensor; print(m.version('ztensor'))",
        |v| {
            if v.starts_with("1.") {
                Ok(())
            } else {
                Err(format!("it has ztensor {v}, expected 1.x"))
            }
        },
    ) else {
        return;
    };
    let mut findings = Vec::new();
    let paths = files_in(&seeds_dir().join("zt_v1"));
    let t = check(&python, "zt1", &paths, &mut findings);
    assert_eq!(
        t.both_read, t.seeds,
        "every zt_v1 seed is a file the package wrote"
    );
    assert!(findings.is_empty(), "findings:\n{}", findings.join("\n"));
}

/// The `.pt` seeds are fixtures of `tests/fixtures/pt/`, whose manifest
/// holds what torch gave for each tensor when they were written (torch is
/// not in the venv): every tensor's shape and the sha256 of its bytes.
#[test]
fn pt_seeds_match_what_torch_recorded() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt");
    let manifest: Json =
        serde_json::from_slice(&std::fs::read(fixtures.join("manifest.json")).unwrap()).unwrap();
    let mut findings = Vec::new();
    let mut n = 0;
    for p in files_in(&seeds_dir().join("formats")) {
        if p.extension().and_then(|e| e.to_str()) != Some("pt") {
            continue;
        }
        let file = p.file_name().unwrap().to_str().unwrap();
        let fixture = file.strip_prefix("torch_").unwrap_or(file);
        assert_eq!(
            std::fs::read(&p).unwrap(),
            std::fs::read(fixtures.join(fixture)).unwrap(),
            "{file}: not the fixture {fixture} whose values torch recorded"
        );
        let recorded = manifest["files"][fixture]["tensors"]
            .as_object()
            .unwrap_or_else(|| panic!("manifest.json has no {fixture}"));
        let ours = library(&p).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut theirs: Vec<&str> = recorded.keys().map(String::as_str).collect();
        theirs.sort_unstable();
        let names: Vec<&str> = ours.keys().map(String::as_str).collect();
        if names != theirs {
            findings.push(format!("{file}: tensors {names:?}, torch's {theirs:?}"));
        }
        for (name, r) in recorded {
            let Some(o) = ours.get(name) else { continue };
            let parts = o.parts.as_ref().map_err(Clone::clone);
            let got = parts.and_then(|ps| match &ps[..] {
                [one] => one.sha256.clone(),
                _ => Err(format!("{} parts", ps.len())),
            });
            if shape_of(&r["shape"]).as_ref() != Some(&o.shape)
                || got.as_deref() != Ok(r["sha256"].as_str().unwrap())
            {
                findings.push(format!(
                    "{file}: {name}: shape {:?}, {got:?}; torch recorded {} {}",
                    o.shape, r["shape"], r["sha256"]
                ));
            }
            n += 1;
        }
    }
    assert!(n > 0, "no .pt seeds");
    eprintln!("pt: {n} tensors compared with torch's record");
    assert!(findings.is_empty(), "findings:\n{}", findings.join("\n"));
}
