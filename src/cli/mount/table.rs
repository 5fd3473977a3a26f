//! The mount table (`/proc/self/mountinfo`): where a mountpoint is mounted,
//! and by which device.

use std::path::Path;

/// The mount's device ("0:53") from /proc/self/mountinfo: a stat of the
/// mountpoint would wait for the very daemon that is not serving yet.
pub(super) fn mount_dev(mountpoint: &Path) -> Option<String> {
    mount_at(mountpoint).map(|(dev, _)| dev)
}

/// The device and type of the last mount on `mountpoint`.
pub(in crate::cli) fn mount_at(mountpoint: &Path) -> Option<(String, String)> {
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    find_mount(&info, mountpoint.as_os_str().as_encoded_bytes())
}

/// The device and type of the last mount on `mountpoint` in mountinfo
/// text, whose paths escape space, tab, newline and backslash as octal
/// (`\040`).
fn find_mount(info: &[u8], mountpoint: &[u8]) -> Option<(String, String)> {
    info.split(|&b| b == b'\n').rev().find_map(|l| {
        let f: Vec<&[u8]> = l.split(|&b| b == b' ').collect();
        let fstype = f.iter().skip_while(|x| **x != b"-").nth(1)?;
        (f.len() > 4 && unescape_octal(f[4]) == mountpoint).then(|| {
            (
                String::from_utf8_lossy(f[2]).into_owned(),
                String::from_utf8_lossy(fstype).into_owned(),
            )
        })
    })
}

fn unescape_octal(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let digits = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match digits {
            Some(d) => {
                let v = d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        let info = b"22 1 0:21 / /proc rw - proc proc rw\n\
            90 30 0:53 / /mnt/my\\040model\\011x\\134y rw - fuse.ztensor-mount z ro\n\
            91 30 0:54 / /mnt/my rw - fuse.ztensor-mount z ro\n";
        let dev = |mp: &[u8]| find_mount(info, mp).map(|(d, _)| d);
        assert_eq!(dev(b"/mnt/my model\tx\\y").as_deref(), Some("0:53"));
        assert_eq!(dev(b"/mnt/my").as_deref(), Some("0:54"));
        assert_eq!(dev(b"/mnt/my\\040model"), None);
        assert_eq!(
            find_mount(info, b"/proc").map(|(_, t)| t).as_deref(),
            Some("proc")
        );
        assert_eq!(unescape_octal(b"a\\09b\\"), b"a\\09b\\".to_vec());
    }
}
