//! Hides the query of a URL argument (a signed URL's signature) in the
//! process's command line. `ps` and `/proc/PID/cmdline`, which every user
//! may read, show a process's argument area as it is now, and the daemon
//! keeps the mount command's for as long as the mount lives. The arguments
//! are parsed (into owned strings) before this runs; their bytes in that
//! area are then masked in place.

/// Masks, with `*`, what follows the `?` of each `http(s)://` argument.
/// Must run before any thread starts (see the SAFETY comment).
pub fn hide_url_queries() {
    let Some((start, end)) = arg_area() else {
        return;
    };
    // SAFETY: [start, end) is this process's argument area, which the
    // kernel laid out at exec at the top of the main thread's stack,
    // readable and writable for the life of the process (`arg_area`
    // checks start < end). Nothing else touches it now: no Rust value
    // refers into it (clap and std::env::args made owned copies), the
    // standard library only keeps the raw argv pointer for later calls of
    // std::env::args, and no other thread runs yet.
    let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    for arg in area.split_mut(|&b| b == 0) {
        mask_query(arg);
    }
}

/// Masks the query of `arg` if it is an `http(s)://` URL.
fn mask_query(arg: &mut [u8]) {
    let lower = arg.to_ascii_lowercase();
    if !(lower.starts_with(b"http://") || lower.starts_with(b"https://")) {
        return;
    }
    if let Some(q) = arg.iter().position(|&b| b == b'?') {
        arg[q + 1..].fill(b'*');
    }
}

/// The argument area's bounds, from fields 48 and 49 of /proc/self/stat
/// (counted after the command name, which may hold spaces and parentheses).
fn arg_area() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(48 - 3);
    let start: usize = fields.next()?.parse().ok()?;
    let end: usize = fields.next()?.parse().ok()?;
    (start != 0 && start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_urls_query_is_masked() {
        let mut a = b"https://h/m.bin?X-Amz-Signature=ab".to_vec();
        mask_query(&mut a);
        let query = "X-Amz-Signature=ab".len();
        assert_eq!(
            a,
            format!("https://h/m.bin?{}", "*".repeat(query)).as_bytes()
        );
        for plain in [&b"/data/m.zt?x"[..], b"s3://b/k?v=1", b"https://h/m.bin"] {
            let mut b = plain.to_vec();
            mask_query(&mut b);
            assert_eq!(b, plain);
        }
    }

    #[test]
    fn the_argument_area_is_found() {
        let (start, end) = arg_area().expect("fields 48 and 49 of /proc/self/stat");
        assert!(end - start >= std::env::args().map(|a| a.len() + 1).sum::<usize>());
    }
}
