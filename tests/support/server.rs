//! The tests' local servers (`tests/python/range_server.py`,
//! `tls_server.py`, `fake_hub.py`, moto, Python's `http.server`): each
//! prints `PORT N` once it listens on 127.0.0.1, and stops when its stdin
//! closes. [`Server`]'s drop closes it (and kills the process), however
//! the test ends.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

pub struct Server {
    pub child: Child,
    pub port: u16,
    /// A directory the server uses (its config, a recording), gone with it.
    pub dir: Option<tempfile::TempDir>,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Runs `cmd` and waits for its `PORT N` line.
    pub fn spawn(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{cmd:?} said {line:?}"));
        Server {
            child,
            port,
            dir: None,
        }
    }

    /// `py tests/python/SCRIPT` with `args`, started.
    pub fn script(mut py: Command, script: &str, args: &[&std::ffi::OsStr]) -> Server {
        py.arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/python")
                .join(script),
        );
        py.args(args);
        Server::spawn(py)
    }
}
