//! The demo's choice of mountpoint (`scripts/demo_mountpoint.sh`): a free
//! directory is used; a ztensor-mount mount whose daemon died is cleared
//! and reused; any other mount there (here a live one) is left alone and
//! another directory is used and named. Through real mounts.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{Mount, Run, alive, run_with_timeout, wait_until};
use ztensor_mount::formats::zt_v01::DType;
use ztensor_mount::formats::zt_v01::writer::{Options, Writer};

fn pick(dir: &Path) -> (Run, PathBuf) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo_mountpoint.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(script).arg(dir).arg(support::bin());
    let r = run_with_timeout(&mut cmd, Duration::from_secs(30));
    assert!(r.ok(), "{r:?}");
    let chosen = PathBuf::from(r.stdout.trim_end());
    (r, chosen)
}

fn write(path: &Path) {
    let mut w = Writer::create(path).unwrap();
    w.add("a", DType::Uint8, &[4], &[1, 2, 3, 4], &Options::default())
        .unwrap();
    w.finish().unwrap();
}

#[test]
fn the_demo_replaces_only_a_dead_mount_of_its_own() {
    let _serial = support::serial();
    let Some(mut m) = Mount::with(&[], write) else {
        return;
    };
    // A free directory (not there yet): itself, made.
    let free = m.scratch_path("free");
    let (_, chosen) = pick(&free);
    assert_eq!(chosen, free);
    assert!(free.is_dir());

    // A live mount: left alone; another directory, named.
    let (r, chosen) = pick(&m.mp);
    assert_ne!(chosen, m.mp);
    assert!(chosen.is_dir(), "{}", chosen.display());
    assert!(r.stderr.contains("not touching"), "{}", r.stderr);
    assert!(r.stderr.contains(chosen.to_str().unwrap()), "{}", r.stderr);
    assert!(m.is_mounted());
    assert_eq!(m.read("a"), [1, 2, 3, 4], "the live mount still serves");

    // The same mount with its daemon killed: cleared and reused.
    let pid = m.pid.expect("the daemon's pid");
    support::signal(pid, libc::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || !alive(pid)));
    let (r, chosen) = pick(&m.mp);
    assert_eq!(chosen, m.mp, "{}", r.stderr);
    assert!(r.stderr.contains("cleared the dead"), "{}", r.stderr);
    assert!(!m.is_mounted(), "the dead mount is still there");
    m.pid = None;
}
