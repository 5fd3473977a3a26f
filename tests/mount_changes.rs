//! The backing file changes under a live mount. The daemon serves the file it
//! opened: deleting it or replacing it by rename changes nothing for readers;
//! truncating it or writing it in place makes the bytes it can no longer
//! vouch for fail with ESTALE (the file changed under the mount, as a
//! network filesystem says), and the daemon stays up.

mod support;

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use support::{Mount, pattern};
use ztensor_mount::formats::zt_v01::writer::{Compression, Options, Writer};
use ztensor_mount::formats::zt_v01::{Algorithm, DType};

const N: usize = 1 << 20;

/// A raw tensor of 4 MiB and a zstd one, so a truncation leaves the tail of
/// the raw blob and all of the zstd blob gone.
fn write(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let a = pattern(4, N, 1);
    let z = pattern(4, N / 4, 2);
    let mut w = Writer::create(path).unwrap();
    w.add("a", DType::Float32, &[N as u64], &a, &Options::default())
        .unwrap();
    let zopts = Options {
        compression: Compression::Zstd {
            level: 1,
            frame_size: 64 << 10,
        },
        checksum: Some(Algorithm::Crc32c),
        ..Options::default()
    };
    w.add("z", DType::Float32, &[(N / 4) as u64], &z, &zopts)
        .unwrap();
    w.finish().unwrap();
    (a, z)
}

fn read_range(m: &Mount, rel: &str, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(m.path(rel))?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, off)?;
    Ok(buf)
}

/// A scratch mount of a file written by [`write`] under `name`, with
/// `opts`, its tensor `a` read once: the mount, the file, `a`'s bytes.
fn mounted(name: &str, opts: &[&str]) -> Option<(Mount, std::path::PathBuf, Vec<u8>)> {
    let mut m = Mount::scratch()?;
    let zt = m.scratch_path(name);
    let (a, _) = write(&zt);
    m.mount(&zt, opts);
    assert_eq!(read_range(&m, "a", 0, 4096).unwrap(), &a[..4096]);
    Some((m, zt, a))
}

/// Writes 4 KiB of tensor `a`'s bytes in place, then sets the mtime back
/// to `mtime`, as `rsync --inplace` or `cp -p` over the file would.
fn write_keeping_mtime(zt: &Path, mtime: std::time::SystemTime) {
    let f = std::fs::OpenOptions::new().write(true).open(zt).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x55; 4096], 64 + 8192).unwrap();
    f.set_modified(mtime).unwrap();
}

fn stale(r: std::io::Result<Vec<u8>>, what: &str) {
    match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{what}: {e}"),
        Ok(_) => panic!("{what}: read succeeded after the file changed"),
    }
}

#[test]
fn truncation_gives_estale_not_a_crash() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("t.zt");
    let (a, _) = write(&zt);
    m.mount(&zt, &[]);
    assert_eq!(read_range(&m, "a", 0, 4096).unwrap(), &a[..4096]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&zt)
        .unwrap()
        .set_len(64 + 4096)
        .unwrap();
    // Bytes never read before must come from the file, which no longer has them.
    stale(
        read_range(&m, "a", (a.len() - 8192) as u64, 4096),
        "tail of a",
    );
    stale(read_range(&m, "z", 0, 4096), "z");
    assert!(
        m.log_text().contains("file changed since mount"),
        "{}",
        m.log_text()
    );
    // The daemon survived: its own files still answer.
    assert!(m.stat_u64("errors") >= 2);
    assert!(m.is_mounted());
}

#[test]
fn writing_in_place_gives_estale() {
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("w.zt");
    let (a, _) = write(&zt);
    m.mount(&zt, &[]);
    assert_eq!(read_range(&m, "a", 0, 4096).unwrap(), &a[..4096]);
    // Same size, different bytes in the middle of the raw blob. The
    // kernel stamps mtime with a coarse clock: a write in the tick the file
    // was made in leaves it as it was, so write until the mtime moves.
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let before = mtime(&zt);
    let moved = support::wait_until(std::time::Duration::from_secs(5), || {
        let mut f = std::fs::OpenOptions::new().write(true).open(&zt).unwrap();
        f.seek(SeekFrom::Start(64 + 2 * 4096 * 100)).unwrap();
        f.write_all(&[0x55; 4096]).unwrap();
        drop(f);
        mtime(&zt) != before
    });
    assert!(moved, "the write did not change the file's mtime");
    stale(
        read_range(&m, "a", 2 * 4096 * 100, 4096),
        "overwritten range",
    );
    stale(read_range(&m, "z", 0, 100), "z after the write");
    assert!(
        m.log_text().contains("modified since mount"),
        "{}",
        m.log_text()
    );
    assert!(m.is_mounted());
}

#[test]
fn deleting_or_replacing_keeps_serving_the_opened_file() {
    for replace in [false, true] {
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        let zt = m.scratch_path("d.zt");
        let (a, z) = write(&zt);
        m.mount(&zt, &[]);
        if replace {
            let other = m.scratch_path("other.zt");
            let mut w = Writer::create(&other).unwrap();
            w.add("a", DType::Uint8, &[3], &[9, 9, 9], &Options::default())
                .unwrap();
            w.finish().unwrap();
            std::fs::rename(&other, &zt).unwrap();
        } else {
            std::fs::remove_file(&zt).unwrap();
        }
        assert_eq!(m.read("a"), a, "replace={replace}");
        assert_eq!(m.read("z"), z, "replace={replace}");
        assert_eq!(m.stat_u64("errors"), 0);
    }
}

/// A hard link moves the ctime and the link count but no byte: the check
/// after it takes that ctime for the link's, and only that one. A write
/// whose mtime is set back afterwards moves the ctime again, with the
/// same link count: `ESTALE`, not the bytes as the file now holds them.
#[test]
fn a_write_with_its_mtime_set_back_after_a_hard_link_gives_estale() {
    use std::os::unix::fs::MetadataExt;
    let Some(mut m) = Mount::scratch() else {
        return;
    };
    let zt = m.scratch_path("l.zt");
    let (a, _) = write(&zt);
    m.mount(&zt, &[]);
    assert_eq!(read_range(&m, "a", 0, 4096).unwrap(), &a[..4096]);
    std::fs::hard_link(&zt, m.scratch_path("l2.zt")).unwrap();
    assert_eq!(read_range(&m, "a", 4096, 4096).unwrap(), &a[4096..8192]);
    let linked = std::fs::metadata(&zt).unwrap();
    let ctime = |md: &std::fs::Metadata| (md.ctime(), md.ctime_nsec());
    // The kernel stamps the ctime with a coarse clock: write until it moves.
    let moved = support::wait_until(std::time::Duration::from_secs(5), || {
        write_keeping_mtime(&zt, linked.modified().unwrap());
        let now = std::fs::metadata(&zt).unwrap();
        assert_eq!(now.modified().unwrap(), linked.modified().unwrap());
        ctime(&now) != ctime(&linked)
    });
    assert!(moved, "the write did not change the file's ctime");
    stale(
        read_range(&m, "a", 8192, 4096),
        "the range written after the link",
    );
    assert!(
        m.log_text().contains("modified since mount"),
        "{}",
        m.log_text()
    );
    m.unmount_ok();
}

/// A hard link made first (a backup tool's snapshot), then a write in
/// place with its mtime set back, and no read in between: the link's
/// change of the link count must not excuse the write's change of the
/// ctime. The kernel's notice of the write says it.
#[test]
fn a_write_with_its_mtime_set_back_after_a_link_and_no_read_between_gives_estale() {
    let Some((m, zt, _)) = mounted("l.zt", &[]) else {
        return;
    };
    std::fs::hard_link(&zt, m.scratch_path("snapshot.zt")).unwrap();
    write_keeping_mtime(&zt, std::fs::metadata(&zt).unwrap().modified().unwrap());
    stale(
        read_range(&m, "a", 8192, 4096),
        "the range written after the link",
    );
    m.unmount_ok();
}

/// A file moved aside (`mv model model.bak`) changes no byte, though the
/// rename moves its ctime: it is still served, and so is the file after
/// another is renamed into its place.
#[test]
fn a_file_moved_aside_is_still_served() {
    let Some((m, zt, a)) = mounted("m.zt", &[]) else {
        return;
    };
    std::fs::rename(&zt, m.scratch_path("m.zt.bak")).unwrap();
    assert_eq!(read_range(&m, "a", 4096, 4096).unwrap(), &a[4096..8192]);
    write(&m.scratch_path("new.zt"));
    std::fs::rename(m.scratch_path("new.zt"), &zt).unwrap();
    assert_eq!(read_range(&m, "a", 8192, 4096).unwrap(), &a[8192..12288]);
    assert!(!m.log_text().contains("modified"), "{}", m.log_text());
    m.unmount_ok();
}

/// A reader holding a mapping from before the change keeps what it read:
/// an open made after the change fails with ESTALE, rather than dropping
/// the inode's page cache under that mapping (its next touch of a page
/// would then be refused: SIGBUS on bytes it had read).
#[test]
fn a_mapping_held_across_a_change_keeps_its_bytes_when_another_opens_the_file() {
    let Some((m, zt, a)) = mounted("h.zt", &["--no-passthrough"]) else {
        return;
    };
    let f = std::fs::File::open(m.path("a")).unwrap();
    // SAFETY: a read-only map of a file of the mount, which nothing
    // writes; read while mapped.
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    assert!(map[..] == a[..], "read through the mapping");
    let f2 = std::fs::OpenOptions::new().write(true).open(&zt).unwrap();
    f2.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f2);
    let e = std::fs::File::open(m.path("a")).expect_err("an open after the change");
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    assert!(map[..] == a[..], "the held mapping after another open");
    drop(map);
    drop(f);
    m.unmount_ok();
}

/// Where an open keeps the kernel's page cache (`--page-cache`; a decoded
/// tensor without passthrough), a read of cached pages never reaches the
/// daemon: the open itself checks the file, so a file written in place
/// gives `ESTALE` at the next open, not the bytes cached before.
#[test]
fn an_open_that_keeps_the_page_cache_gives_estale_once_the_file_changed() {
    for (opts, name) in [
        (&["--page-cache"][..], "a"),
        (&["--no-passthrough"][..], "z"),
        (&["--page-cache", "--no-passthrough"][..], "a"),
    ] {
        let Some(mut m) = Mount::scratch() else {
            return;
        };
        let zt = m.scratch_path("k.zt");
        let (a, z) = write(&zt);
        m.mount(&zt, opts);
        let want = if name == "a" { &a } else { &z };
        assert_eq!(&m.read(name), want, "{opts:?}");
        assert_eq!(&m.read(name), want, "{opts:?}: from the page cache");
        let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        let before = mtime(&zt);
        let moved = support::wait_until(std::time::Duration::from_secs(5), || {
            let f = std::fs::OpenOptions::new().write(true).open(&zt).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, &[0x55; 4096], 64 + 8192).unwrap();
            drop(f);
            mtime(&zt) != before
        });
        assert!(moved, "the write did not change the file's mtime");
        let e = std::fs::File::open(m.path(name)).expect_err("an open after the change");
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{opts:?}: {e}");
        assert!(
            m.log_text().contains("modified since mount"),
            "{}",
            m.log_text()
        );
        // Counted and listed as a failed read is.
        assert!(m.stat_u64("errors") > 0, "{opts:?}: {}", m.stats());
        let listed = std::fs::read_to_string(m.path(".ztensor/errors")).unwrap();
        assert!(
            listed.contains(&format!("\"tensor\":\"{name}\"")),
            "{opts:?}: {listed}"
        );
        m.unmount_ok();
    }
}
