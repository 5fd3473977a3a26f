//! One hostile file through the pipeline (`formats::open` and the data
//! layer) and a real mount, held to its exact outcome ([`Want`]); every
//! tensor served is compared with the bytes the format's own reader gave
//! (`expected`). Used by the npz and ONNX hostile tests, whose cases are
//! written by Python with the format's own library.

use std::collections::BTreeMap;
use std::path::Path;

use ztensor_mount::formats::{self, Limits};

/// What a hostile file must give, exactly.
#[derive(Debug, Clone, Copy)]
pub enum Want {
    /// Opens; every tensor is served with the bytes the format's reader
    /// gave.
    Served,
    /// Refused at open and at mount: one line starting with the file and
    /// containing these words.
    Refused(&'static str),
    /// Opens; this tensor is listed, not served, its reason containing
    /// these words; every other tensor is served right.
    Listed(&'static str, &'static str),
    /// Opens; reading this tensor fails (the data layer's reason contains
    /// these words; through the mount, EIO); every other tensor is served
    /// right.
    Eio(&'static str, &'static str),
}

/// Checks the file at `path` (`what` names the case) against `want`;
/// `expected` maps a tensor's name to the little-endian bytes the format's
/// own reader gave for it. `m`: the mount to try it through, if FUSE is
/// here. Returns what went wrong.
pub fn check(
    m: Option<&mut super::Mount>,
    path: &Path,
    what: &str,
    want: Want,
    expected: &BTreeMap<String, Vec<u8>>,
) -> Result<(), String> {
    let label = path.display().to_string();
    let mut wrong = Vec::new();
    let mut served = Vec::new();
    let one_line = |line: &str, words: &str| {
        line.starts_with(&label) && !line.contains('\n') && line.contains(words)
    };
    match (formats::open(path, Limits::default()), want) {
        (Err(e), Want::Refused(words)) => {
            let line = e.to_string();
            if !one_line(&line, words) {
                return Err(format!(
                    "{what}: refused as {line:?}, want one line with {words:?}"
                ));
            }
        }
        (Err(e), w) => return Err(format!("{what}: refused ({e}), want {w:?}")),
        (Ok(_), Want::Refused(words)) => {
            return Err(format!("{what}: opened, want refused with {words:?}"));
        }
        (Ok(o), want) => {
            let dir = tempfile::tempdir().unwrap();
            let names: Vec<String> = o.catalog.tensors.iter().map(|t| t.name.clone()).collect();
            let reasons: Vec<Option<String>> = o
                .catalog
                .tensors
                .iter()
                .map(|t| t.parts.as_ref().err().cloned())
                .collect();
            let data = super::data::serve(o, dir.path(), 64 << 20);
            for (ti, name) in names.iter().enumerate() {
                let got = super::data::read_whole(&data, ti, 0, 1 << 20);
                match want {
                    Want::Listed(n, words) if n == name => match &reasons[ti] {
                        Some(why) if why.contains(words) => {}
                        other => wrong.push(format!(
                            "{what}: {name:?} is {other:?}, want listed with {words:?}"
                        )),
                    },
                    Want::Eio(n, words) if n == name => match got {
                        Err(why) if why.contains(words) && !why.contains('\n') => {}
                        other => wrong.push(format!(
                            "{what}: {name:?} read as {:?}, want failing with {words:?}",
                            other.map(|b| b.len())
                        )),
                    },
                    _ => match (got, expected.get(name)) {
                        (Ok(b), Some(e)) if &b == e => served.push(name.clone()),
                        (got, e) => wrong.push(format!(
                            "{what}: {name:?} read as {got:?}, the format's reader gave {e:?}"
                        )),
                    },
                }
            }
            // Whatever the format's reader read is served (or is the bad one).
            for name in expected.keys() {
                let bad = match want {
                    Want::Listed(n, _) | Want::Eio(n, _) => n == name,
                    _ => false,
                };
                if !bad && !names.contains(name) {
                    wrong.push(format!(
                        "{what}: {name:?} is read by the format's reader but not here"
                    ));
                }
            }
        }
    }
    let Some(m) = m else {
        return if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        };
    };
    let r = m.run(path, &[]);
    if !r.ok() {
        let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.is_empty()).collect();
        return match want {
            Want::Refused(words)
                if lines.len() == 1 && lines[0].contains(&label) && lines[0].contains(words) =>
            {
                Ok(())
            }
            w => Err(format!(
                "{what}: mount refused with {:?}, want {w:?}",
                r.stderr
            )),
        };
    }
    if let Want::Refused(words) = want {
        wrong.push(format!("{what}: mounted, want refused with {words:?}"));
    }
    let index = m.index();
    for t in index["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let rel = t["path"].as_str().unwrap_or("");
        let got = std::fs::read(m.path(rel));
        match want {
            Want::Listed(n, words) if n == name => {
                let why = t["unsupported_reason"].as_str().unwrap_or("");
                let file = !rel.is_empty() && std::fs::metadata(m.path(rel)).is_ok();
                if t["supported"] != false || !why.contains(words) || file {
                    wrong.push(format!("{what}: {name:?} not listed with {words:?}: {t}"));
                }
            }
            Want::Eio(n, _) if n == name => {
                if got.as_ref().map_err(|e| e.raw_os_error()).err() != Some(Some(libc::EIO)) {
                    wrong.push(format!("{what}: {name:?} read as {got:?}, want EIO"));
                }
            }
            _ => match (got, expected.get(name)) {
                (Ok(b), Some(e)) if &b == e => {}
                (got, e) => wrong.push(format!(
                    "{what}: {name:?} at {rel:?} read as {got:?}, the format's reader gave {e:?}"
                )),
            },
        }
        // No path leaves the mount.
        let real = m.path(rel);
        if !rel.is_empty() && !real.starts_with(&m.mp) || rel.split('/').any(|c| c == "..") {
            wrong.push(format!("{what}: {name:?} is at {rel:?}"));
        }
    }
    m.unmount_ok();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Lowercase hex as the writer scripts give bytes.
pub fn unhex(s: &str) -> Vec<u8> {
    super::data::hex_decode(s)
}

/// What the format's own reader (numpy, onnx) did with a case, as its
/// writer script recorded it: `{"error": ...}` when it refused the file,
/// else `{"members": {name: {"hex": ...} or {"error": ...}}}`.
#[derive(Debug, Clone, Copy)]
pub enum Reader {
    /// Every tensor reads.
    Reads,
    /// This tensor fails (or is not a numeric array) with these words; the
    /// others read.
    Fails(&'static str, &'static str),
    /// Every tensor fails with these words.
    AllFail(&'static str),
    /// The whole file is refused with these words.
    Refuses(&'static str),
}

/// Runs every case of a writer script's `cases.json` (`[{"what", "file",
/// "<reader>": record}]`): the reader's record must be `want(what).1`, and
/// the mount's outcome `want(what).0`, its served bytes the reader's.
pub fn run_cases(cases: &serde_json::Value, reader: &str, want: fn(&str) -> (Want, Reader)) {
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let mut m = super::Mount::scratch();
    let mut wrong = Vec::new();
    for c in cases {
        let what = c["what"].as_str().unwrap();
        let path = Path::new(c["file"].as_str().unwrap());
        let (want, did) = want(what);
        let rec = &c[reader];
        let members = rec["members"].as_object();
        let as_said = match (did, members) {
            (Reader::Refuses(words), None) => rec["error"].as_str().unwrap().contains(words),
            (Reader::Reads, Some(ms)) => ms.values().all(|v| v.get("hex").is_some()),
            (Reader::AllFail(words), Some(ms)) => ms
                .values()
                .all(|v| v["error"].as_str().is_some_and(|e| e.contains(words))),
            (Reader::Fails(bad, words), Some(ms)) => {
                ms.contains_key(bad)
                    && ms.iter().all(|(k, v)| {
                        if k == bad {
                            v["error"].as_str().is_some_and(|e| e.contains(words))
                        } else {
                            v.get("hex").is_some()
                        }
                    })
            }
            _ => false,
        };
        if !as_said {
            wrong.push(format!("{what}: {reader} gave {rec}, want {did:?}"));
        }
        let expected: BTreeMap<String, Vec<u8>> = members
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), unhex(v["hex"].as_str()?))))
            .collect();
        if let Err(e) = check(m.as_mut(), path, what, want, &expected) {
            wrong.push(e);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases wrong:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}
