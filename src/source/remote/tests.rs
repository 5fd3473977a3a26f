use std::cell::RefCell;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering::{Acquire, Release};

use crate::source::error::FetchKind;

use super::cache::{BITMAP_HEADER, Cache, Disk, commit, present_run};
use super::failures::fetch_error;
use super::object::sibling_url;
use super::{Options, without_queries};

#[test]
fn urls_in_messages_lose_their_query() {
    assert_eq!(
        without_queries(
            "error sending request for url (https://cdn.example/x/y?Expires=1&Signature=S,T): \
             timed out; see http://a/b?c https://d/e"
        ),
        "error sending request for url (https://cdn.example/x/y?…): timed out; see \
         http://a/b?… https://d/e"
    );
    assert_eq!(without_queries("no URL?here"), "no URL?here");
    assert_eq!(
        without_queries("builder error for url (ftp://h/y?X-Amz-Signature=S): not allowed"),
        "builder error for url (ftp://h/y?…): not allowed"
    );
    assert_eq!(without_queries("a ://b?c"), "a ://b?c");
}

#[test]
fn a_sibling_is_one_segment_beside_the_file() {
    let u = url::Url::parse("https://h/a/b/model.safetensors.index.json?x=1").unwrap();
    let s = |n: &str| sibling_url(&u, n).unwrap().to_string();
    assert_eq!(s("m-1.safetensors"), "https://h/a/b/m-1.safetensors");
    assert_eq!(s("m?x#y"), "https://h/a/b/m%3Fx%23y");
    assert_eq!(s("%2e%2e"), "https://h/a/b/%252e%252e");
}

/// Records what a commit does, failing the step named.
struct Recorder {
    steps: RefCell<Vec<&'static str>>,
    fail: Option<&'static str>,
}

impl Recorder {
    fn step(&self, s: &'static str) -> std::io::Result<()> {
        self.steps.borrow_mut().push(s);
        if self.fail == Some(s) {
            return Err(std::io::Error::other("injected"));
        }
        Ok(())
    }
}

impl Disk for Recorder {
    fn sync_data(&self) -> std::io::Result<()> {
        self.step("sync data")
    }
    fn write_bits(&self, _: &[u8]) -> std::io::Result<()> {
        self.step("write bits")
    }
    fn sync_bits(&self) -> std::io::Result<()> {
        self.step("sync bits")
    }
}

#[test]
fn a_get_error_keeps_the_kind_its_store_gave_it_and_its_words() {
    let hub = |kind| object_store::Error::Generic {
        store: crate::source::hub::STORE,
        source: Box::new(crate::source::http::Failure::new(kind, "no answer in time")),
    };
    let e = fetch_error(&hub(FetchKind::TimedOut));
    assert_eq!(e.kind, FetchKind::TimedOut);
    assert_eq!(e.message(), "no answer in time");
    assert_eq!(fetch_error(&hub(FetchKind::Denied)).kind, FetchKind::Denied);
    let denied = object_store::Error::PermissionDenied {
        path: "k".into(),
        source: "403".into(),
    };
    assert_eq!(fetch_error(&denied).kind, FetchKind::Denied);
    let gone = object_store::Error::NotFound {
        path: "k".into(),
        source: "404".into(),
    };
    assert_eq!(fetch_error(&gone).kind, FetchKind::Changed);
    let other = object_store::Error::Generic {
        store: "S3",
        source: "the server answered 500".into(),
    };
    assert_eq!(fetch_error(&other).kind, FetchKind::Failed);
}

#[test]
fn a_commit_syncs_the_bytes_before_any_bit_is_written() {
    let r = Recorder {
        steps: RefCell::new(Vec::new()),
        fail: None,
    };
    commit(&r, &[1]).unwrap();
    assert_eq!(*r.steps.borrow(), ["sync data", "write bits", "sync bits"]);
    let r = Recorder {
        steps: RefCell::new(Vec::new()),
        fail: Some("sync data"),
    };
    assert!(commit(&r, &[1]).is_err());
    assert_eq!(*r.steps.borrow(), ["sync data"], "a bit written unsynced");
}

#[test]
fn only_the_run_of_present_blocks_from_an_offset_counts() {
    // Blocks of 10 bytes in 45: 0, 1 and 3 present.
    let has = |b: u64| [0, 1, 3].contains(&b);
    let run = |off, len| present_run(has, 10, 45, off, len);
    assert_eq!(run(0, 100), 20, "up to the missing block 2");
    assert_eq!(run(5, 10), 10);
    assert_eq!(run(15, 10), 5);
    assert_eq!(run(20, 5), 0);
    assert_eq!(
        run(30, 100),
        10,
        "block 3, then 4 (the last, short) is missing"
    );
    assert_eq!(run(45, 10), 0);
    let all = |_| true;
    assert_eq!(present_run(all, 10, 45, 31, 100), 14, "clipped to the size");
}

fn opts(dir: &Path) -> Options {
    Options {
        cache_dir: dir.to_path_buf(),
        block_size: 64 << 10,
        ..Options::default()
    }
}

#[test]
fn a_saved_bitmap_claiming_a_block_that_is_a_hole_is_not_believed() {
    let dir = tempfile::tempdir().unwrap();
    let size = 5 * (64 << 10) + 100;
    let o = opts(dir.path());
    let c = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
    // Blocks 0 and 2 written; the bitmap claims 0, 1, 2 and 5 (the
    // last), as one saved out of order might after a crash.
    c.file.write_all_at(&[7u8; 64 << 10], 0).unwrap();
    c.file
        .write_all_at(&[9u8; 64 << 10], 2 * (64 << 10))
        .unwrap();
    let bits = c.bitmap.as_ref().unwrap();
    bits.write_all_at(&0b100111u64.to_le_bytes(), BITMAP_HEADER)
        .unwrap();
    drop(c);
    // As after a reboot: the live bitmap is not believed (it is of
    // another boot), the saved one is read.
    let forget_live = || {
        for e in std::fs::read_dir(dir.path().join("ztensor-remote")).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "live") {
                std::fs::remove_file(p).unwrap();
            }
        }
    };
    forget_live();
    let c = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
    assert_eq!(c.present, vec![0b101], "only the blocks with bytes");
    // And what was believed is what is saved.
    drop(c);
    forget_live();
    let c = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
    assert_eq!(c.present, vec![0b101]);
}

#[test]
fn a_second_open_shares_the_first_ones_live_bitmap_and_a_reopen_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let size = 5 * (64 << 10) + 100;
    let o = opts(dir.path());
    let a = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
    let b = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
    assert_eq!(a.path, b.path, "one cache file, not a private one");
    let (la, lb) = (a.live.as_ref().unwrap(), b.live.as_ref().unwrap());
    // A block written and marked by one is present for the other.
    a.file.write_all_at(&[7u8; 64 << 10], 64 << 10).unwrap();
    la[0].fetch_or(0b10, Release);
    assert_eq!(lb[0].load(Acquire), 0b10);
    // Both gone without a commit (as after SIGKILL): the next open
    // still has the block.
    drop((a, b));
    let c = Cache::open(&o, ("http://h/x", "http://h/x"), Some("e1"), size).unwrap();
    assert_eq!(c.present, vec![0b10]);
}
