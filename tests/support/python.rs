//! The Python side of the interop tests: which interpreter, whether it has
//! the packages a test needs (with the skip rule of [`super::require`]),
//! and running a writer script from `tests/python/`.
//!
//! The interpreter is `$ZT_PYTHON`, else `$ZT_VENV/bin/python3`, else
//! `.venv/bin/python3` in the crate.
//! The ztensor 1.x and 2.x packages live beside the venv's own: the venv is
//! `$ZT_VENV` (default `.venv` in the crate), run with
//! `PYTHONPATH=$ZT_VENV/ztensor/<major>`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A Python interpreter, with the `PYTHONPATH` it runs under, if any.
#[derive(Clone, Debug)]
pub struct Python {
    exe: PathBuf,
    path: Option<PathBuf>,
}

impl Python {
    /// `$ZT_PYTHON`, else `$ZT_VENV/bin/python3`, else `.venv/bin/python3`
    /// in the crate.
    pub fn from_env() -> Python {
        let exe = std::env::var_os("ZT_PYTHON")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("ZT_VENV").map(|v| PathBuf::from(v).join("bin/python3")))
            .unwrap_or_else(|| manifest_dir().join(".venv/bin/python3"));
        Python { exe, path: None }
    }

    /// `$ZT_VENV/bin/python3` (default venv `.venv` in the crate) with
    /// `PYTHONPATH=$ZT_VENV/ztensor/<major>`, where the ztensor `major`.x
    /// package is installed.
    pub fn ztensor(major: u32) -> Python {
        let venv = std::env::var_os("ZT_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| manifest_dir().join(".venv"));
        Python {
            exe: venv.join("bin/python3"),
            path: Some(venv.join(format!("ztensor/{major}"))),
        }
    }

    pub fn exe(&self) -> &Path {
        &self.exe
    }

    /// A command running this interpreter.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.exe);
        if let Some(p) = &self.path {
            c.env("PYTHONPATH", p);
        }
        c
    }

    /// Runs `-c code`: what it printed (trimmed), or why it could not run
    /// (the last line it wrote to stderr when it failed).
    pub fn probe(&self, code: &str) -> Result<String, String> {
        let exe = self.exe.display();
        let out = self
            .cmd()
            .args(["-c", code])
            .output()
            .map_err(|e| format!("cannot run {exe}: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("(no message)")
                .trim();
            return Err(format!("{exe}: {code:?} failed: {last}"));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The skip rule ([`super::require`]) over [`Python::probe`]: `self`
    /// when `code` runs and `accept` takes what it printed; `None` when the
    /// test is skipped (it panics instead under `CI=true`). `what` names
    /// the requirement and how to meet it.
    pub fn require(
        self,
        what: &str,
        code: &str,
        accept: impl FnOnce(&str) -> Result<(), String>,
    ) -> Option<Python> {
        let check = self
            .probe(code)
            .and_then(|out| accept(&out).map_err(|why| format!("{}: {why}", self.exe.display())));
        super::require(what, check).then_some(self)
    }

    /// Runs this interpreter with `args`, killed after `limit`; panics
    /// with its output (as `what` failed) unless it exits 0 and its
    /// output ends with "OK".
    pub fn run_ok(&self, args: &[&std::ffi::OsStr], limit: std::time::Duration, what: &str) {
        let r = super::run_with_timeout(self.cmd().args(args), limit);
        assert!(
            r.ok() && r.stdout.trim_end().ends_with("OK"),
            "{what} failed ({}):\n{}\n{}",
            r.status,
            r.stdout,
            r.stderr
        );
    }

    /// Runs `tests/python/<script> ARG`; panics with its stderr if it fails.
    pub fn run_script(&self, script: &str, arg: &Path) {
        let path = manifest_dir().join("tests/python").join(script);
        assert!(
            path.is_file(),
            "{} is missing; it is part of this test",
            path.display()
        );
        let out = self
            .cmd()
            .arg(&path)
            .arg(arg)
            .output()
            .unwrap_or_else(|e| panic!("run {script}: {e}"));
        assert!(
            out.status.success(),
            "{script} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `tests/python/<script> DIR` into a fresh directory and reads
    /// the `expected.json` it writes there.
    pub fn write_into_tempdir(&self, script: &str) -> (tempfile::TempDir, Json) {
        let dir = tempfile::tempdir().unwrap();
        self.run_script(script, dir.path());
        let expected = read_json(&dir.path().join("expected.json"));
        (dir, expected)
    }
}

/// `Ok` when `version` is `want`.
pub fn version_is(package: &str, want: &str, version: &str) -> Result<(), String> {
    if version == want {
        Ok(())
    } else {
        Err(format!("it has {package} {version}, expected {want}"))
    }
}

/// A JSON file a writer script made; panics naming it if it is missing or
/// not JSON.
pub fn read_json(path: &Path) -> Json {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("{} not written: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}
