//! `ztensor-mount prefetch MOUNTPOINT [TENSOR...]`: brings tensors into a
//! live mount's caches before they are needed, by reading each one's files
//! through the mount, several at a time. The daemon does the work it would
//! do for any reader: a compressed tensor is decoded into its cache (or
//! spill file), a remote object's blocks are fetched into the disk cache,
//! all within the mount's own bounds. A terminal gets a progress bar
//! (bytes, rate, ETA); otherwise one line at the end.

use std::fs::File;
use std::io::{IsTerminal, Read};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

/// Bytes asked of the mount per read (its largest request is 4 MiB).
const CHUNK: usize = 4 << 20;

/// One file to read: the tensor it belongs to, its path in the mount and
/// its size.
struct Item {
    tensor: String,
    path: PathBuf,
    bytes: u64,
}

pub fn run(mountpoint: &Path, wanted: &[String], jobs: usize) -> ExitCode {
    match prefetch(mountpoint, wanted, jobs) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ztensor-mount prefetch: {}", super::one_line(e));
            ExitCode::from(1)
        }
    }
}

fn read_json(path: &Path, mp: &Path) -> Result<Json, String> {
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "{} is not a ztensor-mount mount ({}: {e})",
            mp.display(),
            path.display()
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: not JSON: {e}", path.display()))
}

/// The files of the tensors chosen: all, or those named (a tensor's name
/// or path, or a directory of the tree, which stands for every tensor in
/// it). A name that matches nothing is an error.
struct Chosen {
    items: Vec<Item>,
    tensors: usize,
    /// Tensors chosen that the mount does not serve.
    unsupported: usize,
    /// Decoded bytes of the compressed tensors chosen.
    decoded: u64,
}

fn choose(index: &Json, mp: &Path, wanted: &[String]) -> Result<Chosen, String> {
    let tensors = index["tensors"]
        .as_array()
        .ok_or_else(|| format!("{}: .ztensor/index.json lists no tensors", mp.display()))?;
    // An empty argument (`prefetch M "$UNSET"`) is a mistake, not a
    // request for the whole mount, which may be many gigabytes.
    if wanted.iter().any(|w| w.is_empty()) {
        return Err(format!(
            "{}: an empty name names no tensor (to prefetch every tensor, name none)",
            mp.display()
        ));
    }
    let mut hit = vec![false; wanted.len()];
    // A path through the mount (`/mnt/m/layer0`, `../w`, as a shell
    // completes it) is the path in the mount it names, as the kernel
    // resolves it (`..`, links); a plain name is only ever a name.
    let mount = std::fs::canonicalize(mp).ok();
    let inside: Vec<Option<String>> = wanted
        .iter()
        .map(|w| {
            let through = w.starts_with('/') || w.starts_with("./") || w.starts_with("../");
            let at = std::fs::canonicalize(w).ok().filter(|_| through)?;
            let rel = at.strip_prefix(mount.as_ref()?).ok()?;
            Some(rel.to_string_lossy().into_owned())
        })
        .collect();
    let mut c = Chosen {
        items: Vec::new(),
        tensors: 0,
        unsupported: 0,
        decoded: 0,
    };
    for t in tensors {
        let name = t["name"].as_str().unwrap_or_default();
        let path = t["path"].as_str().unwrap_or_default();
        let mut chosen = wanted.is_empty();
        for (i, w) in wanted.iter().enumerate() {
            let names = |w: &str| {
                let w = w.trim_end_matches('/');
                let under = |p: &str| {
                    !w.is_empty() && p.strip_prefix(w).is_some_and(|rest| rest.starts_with('/'))
                };
                name == w || path == w || under(path) || w.is_empty()
            };
            if names(w) || inside[i].as_deref().is_some_and(names) {
                hit[i] = true;
                chosen = true;
            }
        }
        if !chosen {
            continue;
        }
        if t["supported"] != Json::Bool(true) || path.is_empty() {
            c.unsupported += 1;
            continue;
        }
        c.tensors += 1;
        if t["encoding"].as_str().is_some_and(|e| e != "raw") {
            c.decoded += t["nbytes"].as_u64().unwrap_or(0);
        }
        let files: Vec<(&str, u64)> = match t["parts"].as_array() {
            Some(parts) => parts
                .iter()
                .filter_map(|p| Some((p["path"].as_str()?, p["nbytes"].as_u64()?)))
                .collect(),
            None => vec![(path, t["nbytes"].as_u64().unwrap_or(0))],
        };
        for (p, bytes) in files {
            c.items.push(Item {
                tensor: name.to_string(),
                path: mp.join(p),
                bytes,
            });
        }
    }
    if let Some(i) = hit.iter().position(|h| !h) {
        return Err(format!(
            "{}: no tensor or directory {:?} (names and paths are in .ztensor/index.json)",
            mp.display(),
            wanted[i]
        ));
    }
    Ok(c)
}

fn prefetch(mp: &Path, wanted: &[String], jobs: usize) -> Result<bool, String> {
    let index = read_json(&mp.join(".ztensor/index.json"), mp)?;
    let Chosen {
        items,
        tensors,
        unsupported,
        decoded,
    } = choose(&index, mp, wanted)?;
    let total: u64 = items.iter().map(|i| i.bytes).sum();
    let stats_before = read_json(&mp.join(".ztensor/stats"), mp).ok();
    // Decoded bytes stay only while they fit the mount's cache.
    if let Some(limit) = stats_before
        .as_ref()
        .and_then(|s| s["cache_limit"].as_u64())
        && decoded > limit
    {
        eprintln!(
            "ztensor-mount prefetch: note: the {decoded} decoded bytes of the compressed \
             tensors chosen are more than the mount's cache holds ({limit} bytes, \
             --cache-size): the ones read last stay decoded"
        );
    }

    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(total);
        let style = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        b.set_style(style);
        b.enable_steady_tick(Duration::from_millis(200));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };

    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    // (tensor, why) of each file that failed: a tensor of several parts
    // may fail in more than one.
    let failed: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let jobs = jobs.clamp(1, 64).min(items.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(item) = items.get(i) else { break };
                    bar.set_message(item.tensor.clone());
                    if let Err(e) = read_all(&item.path, &mut buf, |n| {
                        done.fetch_add(n, Relaxed);
                        bar.inc(n);
                    }) {
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((item.tensor.clone(), format!("{}: {e}", item.tensor)));
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let bytes = done.load(Relaxed);
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    // Those that failed were not prefetched: they are counted apart.
    let failed_tensors = tensors_failed(&failed);
    let read = match failed_tensors {
        0 => format!("{tensors} tensors"),
        n => format!("{} of {tensors} tensors", tensors.saturating_sub(n)),
    };
    let mut line = format!(
        "prefetched {read} ({}) from {} in {secs:.1} s ({}/s)",
        crate::size::bytes(bytes),
        mp.display(),
        crate::size::bytes((bytes as f64 / secs.max(1e-3)) as u64),
    );
    if let (Some(before), Ok(after)) = (stats_before, read_json(&mp.join(".ztensor/stats"), mp)) {
        let delta = |k: &str| {
            after[k]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(before[k].as_u64().unwrap_or(0))
        };
        // The mount's counters, which its own work meanwhile (the fill of
        // a backing file behind earlier reads) moves too: said as the
        // mount's, not as the prefetch's.
        let (decoded, fetched) = (delta("decompressed_bytes"), delta("remote_fetched_bytes"));
        let done: Vec<String> = [("decoded", decoded), ("fetched", fetched)]
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(what, n)| format!("{what} {}", crate::size::bytes(*n)))
            .collect();
        if !done.is_empty() {
            line.push_str(&format!("; the mount {} meanwhile", done.join(" and ")));
        }
    }
    if unsupported > 0 {
        line.push_str(&format!("; {unsupported} unsupported tensors skipped"));
    }
    if failed_tensors > 0 {
        line.push_str(&format!("; {failed_tensors} failed"));
    }
    println!("{line}");
    for (_, why) in &failed {
        eprintln!("ztensor-mount prefetch: {}", super::one_line(why));
    }
    Ok(failed.is_empty())
}

/// The tensors among files that failed, `(tensor, why)` each: a tensor
/// of several parts (a sparse tensor's) counts once.
fn tensors_failed(failed: &[(String, String)]) -> usize {
    failed
        .iter()
        .map(|(t, _)| t)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// Reads `path` to its end, telling `progress` of each piece.
fn read_all(path: &Path, buf: &mut [u8], mut progress: impl FnMut(u64)) -> std::io::Result<()> {
    let mut f = File::open(path)?;
    // SAFETY: an advice on our own open descriptor; its result is only a hint.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    loop {
        match f.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => progress(n as u64),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> Json {
        serde_json::json!({"tensors": [
            {"name": "a", "path": "a", "supported": true, "nbytes": 8},
            {"name": "enc/x", "path": "enc/x", "supported": true, "nbytes": 4},
            {"name": "enc/y", "path": "enc/y", "supported": false},
            {"name": "sp", "path": "sp", "supported": true, "nbytes": 12, "parts": [
                {"path": "sp/indptr", "nbytes": 4}, {"path": "sp/values", "nbytes": 8}]},
        ]})
    }

    #[test]
    fn a_tensor_whose_parts_both_fail_counts_as_one_failed_tensor() {
        let why = |t: &str, p: &str| (t.to_string(), format!("{t}: {p}: Input/output error"));
        let failed = [
            why("sp", "sp/indptr"),
            why("sp", "sp/values"),
            why("a", "a"),
        ];
        assert_eq!(tensors_failed(&failed[..2]), 1);
        assert_eq!(tensors_failed(&failed), 2);
        assert_eq!(tensors_failed(&[]), 0);
    }

    #[test]
    fn a_directory_chooses_every_tensor_under_it_and_an_unknown_name_is_refused() {
        let mp = Path::new("/m");
        let all = choose(&index(), mp, &[]).unwrap();
        assert_eq!(all.items.len(), 4, "a, enc/x and the two parts of sp");
        assert_eq!((all.tensors, all.unsupported), (3, 1));
        let enc = choose(&index(), mp, &["enc/".into()]).unwrap().items;
        assert_eq!(enc.len(), 1);
        assert_eq!(enc[0].path, Path::new("/m/enc/x"));
        let sp = choose(&index(), mp, &["sp".into()]).unwrap().items;
        assert_eq!(sp.iter().map(|i| i.bytes).sum::<u64>(), 12);
        let e = choose(&index(), mp, &["a".into(), "nope".into()])
            .err()
            .unwrap();
        assert!(e.contains("\"nope\""), "{e}");
        let e = choose(&index(), mp, &["a".into(), "".into()])
            .err()
            .unwrap();
        assert_eq!(
            e,
            "/m: an empty name names no tensor (to prefetch every tensor, name none)"
        );
        // A path through the mount names the same, as the kernel resolves
        // it; one that leaves the mount names nothing in it.
        let dir = tempfile::tempdir().unwrap();
        let mp = dir.path().join("m");
        std::fs::create_dir_all(mp.join("enc")).unwrap();
        let path = |p: &Path| p.to_str().unwrap().to_string();
        let through = choose(&index(), &mp, &[path(&mp.join("enc"))])
            .unwrap()
            .items;
        assert_eq!(through.len(), 1);
        assert_eq!(through[0].path, mp.join("enc/x"));
        let up = choose(&index(), &mp, &[path(&mp.join("enc/.."))]).unwrap();
        assert_eq!(up.items.len(), 4, "the mount's root: every tensor");
        let out = choose(&index(), &mp, &[path(&mp.join(".."))])
            .err()
            .unwrap();
        assert!(out.contains("no tensor or directory"), "{out}");
    }
}
