use super::*;
use crate::mount::tree::{META_DIR, ROOT};
use crate::serve::data::{DataOptions, PROGRESSIVE_MIN};

fn fs_of(dir: &std::path::Path) -> TensorFs {
    fs_with(dir, 0)
}

/// "w" and `more` tensors of one byte.
fn fs_with(dir: &std::path::Path, more: usize) -> TensorFs {
    let names: Vec<String> = (0..more).map(|i| format!("t{i}")).collect();
    let mut tensors: Vec<(&str, &[u8])> = vec![("w", &[1, 2, 3, 4])];
    tensors.extend(names.iter().map(|n| (n.as_str(), &[7u8][..])));
    fs_of_tensors(dir, &tensors)
}

/// The fs of `tensors`, with every view.
fn fs_of_tensors(dir: &std::path::Path, tensors: &[(&str, &[u8])]) -> TensorFs {
    let (catalog, files) = crate::serve::testing::catalog_of(dir, tensors);
    let opts = FsOptions {
        data: DataOptions {
            cache_size: 8 << 20,
            cache_dir: dir.to_path_buf(),
            verify_raw: true,
            progressive_min: PROGRESSIVE_MIN,
        },
        direct_io: true,
        views: Views::ALL,
        xattrs: true,
        backing: BackingOptions::off(),
    };
    TensorFs::new(catalog, files, opts).unwrap()
}

#[test]
fn only_a_view_file_of_one_tensor_counts_as_that_tensors_file() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_of_tensors(dir.path(), &[("w", &[1, 2, 3, 4])]);
    let content = |dir: &str, name: &str| {
        let top = fs.lookup(ROOT, OsStr::new(dir)).unwrap().ino;
        let ino = fs.lookup(top, OsStr::new(name)).unwrap().ino;
        match &fs.tree.node(ino).unwrap().kind {
            NodeKind::File(c) => c.clone(),
            other => panic!("{other:?}"),
        }
    };
    let npy = content(".npy", "w.npy");
    assert_eq!(fs.one_part(&npy), Some((0, 0, 128)));
    // The model's file, though it holds one tensor: served, cached and
    // described as a model (no tensor xattrs), as with more tensors.
    let model = content(".safetensors", "model.safetensors");
    assert_eq!(fs.one_part(&model), None);
}

/// A view's file put together from a header and tensors reads the
/// same whatever the offsets and sizes of its reads: within one
/// tensor, across several, from the header on, past the end.
#[test]
fn a_composed_view_reads_alike_at_every_offset_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<Vec<u8>> = [3usize, 0, 8, 1, 16, 5]
        .iter()
        .enumerate()
        .map(|(t, &n)| (0..n).map(|i| (t * 40 + i) as u8).collect())
        .collect();
    let names = ["a", "b", "c", "d", "e", "f"];
    let tensors: Vec<(&str, &[u8])> = names
        .iter()
        .copied()
        .zip(bytes.iter().map(|b| &b[..]))
        .collect();
    let fs = fs_of_tensors(dir.path(), &tensors);
    let top = fs.lookup(ROOT, OsStr::new(".safetensors")).unwrap().ino;
    let ino = fs.lookup(top, OsStr::new("model.safetensors")).unwrap().ino;
    let (fh, _) = fs.open(ino, false).unwrap();
    let whole = fs.read(ino, fh, 0, 1 << 20).unwrap().to_vec();
    let data: Vec<u8> = bytes.concat();
    assert!(whole.ends_with(&data), "{whole:?}");
    for size in 1..=whole.len() as u32 + 2 {
        for off in 0..=whole.len() {
            let got = fs.read(ino, fh, off as u64, size).unwrap();
            let end = (off + size as usize).min(whole.len());
            assert_eq!(&*got, &whole[off..end], "{size} bytes at {off}");
        }
    }
}

#[test]
fn a_tensor_whose_place_in_a_view_is_taken_is_not_in_that_view() {
    let dir = tempfile::tempdir().unwrap();
    // `.npy/x.npy` is x's file, so "x.npy/y" has no directory there;
    // in `.zarr` the array `x` and the group `x.npy` do not meet.
    let fs = fs_of_tensors(dir.path(), &[("x", &[1]), ("x.npy/y", &[2])]);
    let npy = fs.lookup(ROOT, OsStr::new(".npy")).unwrap().ino;
    let x = fs.lookup(npy, OsStr::new("x.npy")).unwrap();
    assert_eq!(x.kind, Kind::File);
    assert_eq!(x.size, 128 + 1);
    let zarr = fs.lookup(ROOT, OsStr::new(".zarr")).unwrap().ino;
    let group = fs.lookup(zarr, OsStr::new("x.npy")).unwrap().ino;
    assert!(fs.lookup(group, OsStr::new("y")).is_ok());
    let npy_bit = 1 << 0;
    let zarr_bit = 1 << 1;
    assert_eq!(
        fs.tree.views_of(0) & (npy_bit | zarr_bit),
        npy_bit | zarr_bit
    );
    assert_eq!(fs.tree.views_of(1) & (npy_bit | zarr_bit), zarr_bit);
}

#[test]
fn the_views_mirrors_are_laid_out_at_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_with(dir.path(), 2);
    let main = fs.tree.main_len();
    assert!(!fs.tree.mirrors_laid_out());
    let w = fs.lookup(ROOT, OsStr::new("w")).unwrap();
    assert_eq!(w.size, 4);
    assert!(!fs.tree.mirrors_laid_out());
    // A view's directory is stat'ed with its entries counted.
    let npy = fs
        .lookup(ROOT, OsStr::new(crate::views::npy::VIEW.dir))
        .unwrap();
    assert!(fs.tree.mirrors_laid_out());
    assert_eq!(fs.tree.main_len(), main);
    let w_npy = fs.lookup(npy.ino, OsStr::new("w.npy")).unwrap();
    assert!(w_npy.ino as usize > main);
    assert_eq!(w_npy.size, 128 + 4);
    let mut names = Vec::new();
    fs.readdir(npy.ino, 0, |_, _, _, n| {
        names.push(n.to_string());
        false
    })
    .unwrap();
    assert_eq!(names, [".", "..", "w.npy", "t0.npy", "t1.npy"]);
    let zarr = fs
        .lookup(ROOT, OsStr::new(crate::views::zarr::VIEW.dir))
        .unwrap();
    let array = fs.lookup(zarr.ino, OsStr::new("t1")).unwrap();
    assert_eq!(fs.tree.path(array.ino), ".zarr/t1");
    // Laid out by `views_layout` first: the same inodes.
    let dir2 = tempfile::tempdir().unwrap();
    let other = fs_with(dir2.path(), 2);
    (other.views_layout())();
    assert!(other.tree.mirrors_laid_out());
    let npy2 = other
        .lookup(ROOT, OsStr::new(crate::views::npy::VIEW.dir))
        .unwrap();
    assert_eq!(
        other.lookup(npy2.ino, OsStr::new("w.npy")).unwrap().ino,
        w_npy.ino
    );
    assert_eq!(other.tree.len(), fs.tree.len());
}

#[test]
fn open_handles_of_a_generated_file_share_one_render() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_of(dir.path());
    let meta = fs.lookup(ROOT, OsStr::new(META_DIR)).unwrap().ino;
    let index = fs.lookup(meta, OsStr::new("index.json")).unwrap().ino;
    let (a, _) = fs.open(index, false).unwrap();
    let (b, _) = fs.open(index, false).unwrap();
    let held = |fh| fs.handles.lock().unwrap()[&fh].1.clone();
    assert!(Arc::ptr_eq(&held(a), &held(b)), "two renders for two opens");
    assert_eq!(&*fs.read(index, a, 0, 1 << 20).unwrap(), &*held(a));
    fs.release(a);
    assert_eq!(fs.shared.lock().unwrap().len(), 1, "b still open");
    fs.release(b);
    assert!(fs.shared.lock().unwrap().is_empty(), "nothing left open");
    // Stats change: each open renders its own.
    let stats = fs.lookup(meta, OsStr::new("stats")).unwrap().ino;
    let (c, _) = fs.open(stats, false).unwrap();
    let (d, _) = fs.open(stats, false).unwrap();
    assert!(!Arc::ptr_eq(&held(c), &held(d)));
}

#[test]
fn a_text_too_big_to_allocate_is_enomem_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let fs = fs_of(dir.path());
    // Found without a stat, which would count its size.
    let w_json = fs.tree.lookup(ROOT, "w.json").unwrap();
    // As if its counted size were beyond any allocation.
    fs.sizes[(w_json - 1) as usize].set(u64::MAX).unwrap();
    assert_eq!(fs.open(w_json, false).unwrap_err(), libc::ENOMEM);
    assert!(matches!(fs.read(w_json, 12345, 0, 10), Err(libc::ENOMEM)));
}

#[test]
fn first_opens_at_once_share_one_text_and_sizes_match_it() {
    let dir = tempfile::tempdir().unwrap();
    // Enough tensors that a render takes a while: opens overlap.
    let fs = fs_with(dir.path(), 20_000);
    let meta = fs.lookup(ROOT, OsStr::new(META_DIR)).unwrap().ino;
    let index = fs.lookup(meta, OsStr::new("index.json")).unwrap().ino;
    let before = fs.renders.load(Relaxed);
    let start = std::sync::Barrier::new(8);
    let texts: Vec<Text> = std::thread::scope(|s| {
        let opens: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    fs.open(index, false).unwrap().0
                })
            })
            .collect();
        let fhs: Vec<u64> = opens.into_iter().map(|h| h.join().unwrap()).collect();
        let held = fs.handles.lock().unwrap();
        fhs.iter().map(|fh| held[fh].1.clone()).collect()
    });
    assert!(texts.iter().all(|t| Arc::ptr_eq(t, &texts[0])));
    assert_eq!(fs.renders.load(Relaxed) - before, 1, "renders for 8 opens");
    // Made at its counted size: no spare capacity.
    assert_eq!(texts[0].capacity(), texts[0].len());
    // The size a stat gives (counted, never kept) is the text's length,
    // for index.json and for sidecars.
    let w_json = fs.lookup(ROOT, OsStr::new("w.json")).unwrap().ino;
    for ino in [index, w_json] {
        let size = fs.getattr(ino).unwrap().size;
        let (fh, _) = fs.open(ino, false).unwrap();
        let text = fs.read(ino, fh, 0, 1 << 24).unwrap();
        assert_eq!(size, text.len() as u64);
        assert!(serde_json::from_slice::<serde_json::Value>(&text).is_ok());
    }
}

/// A reply staged half a page in is copied by the daemon, not by the
/// kernel: where the page it copies from is gone (the file cut short
/// between the read's checks and the copy), the copy meets the SIGBUS
/// handler's zero page, and the guard fails it instead of sending zeros.
#[test]
fn a_staged_reply_from_a_file_cut_short_fails_instead_of_sending_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251 + 1) as u8).collect();
    let fs = fs_of_tensors(dir.path(), &[("z", &data)]);
    let z = fs.lookup(ROOT, OsStr::new("z")).unwrap().ino;
    let (fh, _) = fs.open(z, false).unwrap();
    let served = fs.read(z, fh, 0, 1 << 20).unwrap();
    assert!(served.mapped());
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("data"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let staged = crate::mount::staging::stage(&served, |out| served.copy_checked(out));
    assert_eq!(staged.err(), Some(libc::ESTALE));
}

/// A source whose bytes are present, recording whether each `ensure`
/// asked as an index read does (no read-ahead) or as a reader's.
#[derive(Default)]
struct Recording(Mutex<Vec<bool>>);

impl crate::source::Backing for Recording {
    fn ensure(&self, _: &[(u64, u64)], index: bool) -> Result<(), crate::source::FetchError> {
        self.0.lock().unwrap().push(index);
        Ok(())
    }
    fn present(&self, _: u64, len: u64) -> u64 {
        len
    }
    fn check_present(&self) {}
    fn broken(&self) -> Option<crate::source::FetchError> {
        None
    }
    fn sibling(&self, name: &str) -> crate::error::Result<MappedFile> {
        panic!("no sibling {name}")
    }
    fn read_ahead_until(&self, _: u64) {}
}

#[test]
fn the_safetensors_view_reads_a_remote_files_header_as_an_index_starting_no_read_ahead() {
    // Read as a reader's, the header's read from the start set a remote
    // object's read-ahead going: a mount of one safetensors file fetched
    // 8 blocks more than its index before anything was read.
    let dir = tempfile::tempdir().unwrap();
    let (catalog, files) = crate::serve::testing::catalog_of(dir.path(), &[("w", &[1, 2, 3, 4])]);
    let path = files[0].as_ref().unwrap().path().to_path_buf();
    let rec = Arc::new(Recording::default());
    let remote = MappedFile::with_backing(
        &path,
        "http://127.0.0.1/data".into(),
        std::fs::File::open(&path).unwrap(),
        rec.clone(),
    )
    .unwrap();
    make_views(&catalog, &[Some(remote)], Views::ALL);
    let asked = rec.0.lock().unwrap().clone();
    assert!(!asked.is_empty(), "the view read no header");
    assert!(asked.iter().all(|&index| index), "{asked:?}");
}
