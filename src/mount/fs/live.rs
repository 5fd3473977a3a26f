//! The texts of live generated files (`.ztensor/stats`, `.ztensor/errors`),
//! which change all the time.
//!
//! Such a file cannot report size 0, as `/proc`'s files do: the kernel
//! splices a FUSE file through its page cache, which stops at the size
//! the last stat reported, so `sendfile`, `splice`, Python's
//! `shutil.copyfile` and `tar` would copy nothing. It reports the size of
//! a text, and the next open serves that same text: a copy that stats, then
//! opens and reads (`tar`, `rsync`), or opens, then stats and splices
//! (`shutil.copyfile`), gets every byte. The kernel keeps no attributes of
//! these files (TTL 0), so each stat asks again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Errno, Ino, Text};

/// How long a text stays the one stats report and an open takes: ample
/// for a stat beside an open, short beside a poll's period.
const REUSE: Duration = Duration::from_millis(500);

/// Who asks for a live file's text.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Asker {
    Stat,
    Open,
}

/// The latest text of each live file.
#[derive(Default)]
pub(super) struct Live {
    latest: Mutex<HashMap<Ino, Latest>>,
}

struct Latest {
    made: Instant,
    text: Text,
    /// An open took it: the next open makes a new one, so that a poller's
    /// `open, fstat, read, close` sees fresh figures at every round.
    opened: bool,
}

impl Live {
    /// The text `asker` gets of live file `ino`: the latest one while it is
    /// recent (for an open, unless an open already took it), else a new
    /// one from `render`.
    pub(super) fn text(
        &self,
        ino: Ino,
        asker: Asker,
        render: impl FnOnce() -> Result<Text, Errno>,
    ) -> Result<Text, Errno> {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = latest.get_mut(&ino)
            && l.made.elapsed() < REUSE
            && !(asker == Asker::Open && l.opened)
        {
            l.opened |= asker == Asker::Open;
            return Ok(l.text.clone());
        }
        let text = render()?;
        let opened = asker == Asker::Open;
        latest.insert(
            ino,
            Latest {
                made: Instant::now(),
                text: text.clone(),
                opened,
            },
        );
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

    fn renderer() -> (Arc<AtomicU8>, impl Fn() -> Result<Text, Errno>) {
        let n = Arc::new(AtomicU8::new(0));
        let m = n.clone();
        (n, move || Ok(Arc::new(vec![m.fetch_add(1, Relaxed); 3])))
    }

    #[test]
    fn a_stat_then_an_open_then_a_stat_see_one_text() {
        let live = Live::default();
        let (_, r) = renderer();
        let a = live.text(1, Asker::Stat, &r).unwrap();
        let b = live.text(1, Asker::Open, &r).unwrap();
        let c = live.text(1, Asker::Stat, &r).unwrap();
        assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&b, &c));
    }

    #[test]
    fn each_open_of_a_poll_gets_a_new_text_and_its_fstat_sees_it() {
        let live = Live::default();
        let (n, r) = renderer();
        for round in 0..3u8 {
            let opened = live.text(1, Asker::Open, &r).unwrap();
            let stat = live.text(1, Asker::Stat, &r).unwrap();
            assert!(Arc::ptr_eq(&opened, &stat));
            assert_eq!(opened[0], round);
        }
        assert_eq!(n.load(Relaxed), 3);
    }

    #[test]
    fn files_have_their_own_texts_and_an_old_text_is_made_again() {
        let live = Live::default();
        let (n, r) = renderer();
        live.text(1, Asker::Stat, &r).unwrap();
        live.text(2, Asker::Stat, &r).unwrap();
        assert_eq!(n.load(Relaxed), 2);
        live.latest.lock().unwrap().get_mut(&1).unwrap().made -= REUSE;
        assert_eq!(live.text(1, Asker::Stat, &r).unwrap()[0], 2);
        assert_eq!(live.text(2, Asker::Stat, &r).unwrap()[0], 1);
    }

    #[test]
    fn a_failed_render_is_the_askers_error() {
        let live = Live::default();
        assert_eq!(
            live.text(1, Asker::Open, || Err(libc::ENOMEM)),
            Err(libc::ENOMEM)
        );
    }
}
