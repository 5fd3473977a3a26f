use super::*;

#[test]
fn files_being_written_count_as_taking_their_room() {
    // Two files of 45% of the free space each: one fits the rule (at
    // most three quarters of what is free), two do not, although the
    // first, sized but not written yet, takes no disk so far.
    let dir = tempfile::tempdir().unwrap();
    let free = crate::serve::spill::free_bytes(dir.path()).unwrap();
    let len = free / 100 * 45;
    let opts = BackingOptions {
        enabled: true,
        dir: dir.path().to_path_buf(),
        limit: u64::MAX,
    };
    let b = Backings::new(opts, Arc::new(Stats::default()), Arc::default());
    let key = |tensor| Content::Part { tensor, part: 0 };
    assert!(b.reserve(&key(0), len).is_some());
    assert!(b.reserve(&key(1), len).is_none());
    // Half as much fits beside it.
    assert!(b.reserve(&key(2), len / 3).is_some());
}

#[test]
fn past_the_most_files_the_least_recently_opened_idle_one_goes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BackingOptions {
        enabled: true,
        dir: dir.path().to_path_buf(),
        limit: u64::MAX,
    };
    let b = Backings::new(opts, Arc::new(Stats::default()), Arc::default());
    b.set_max_files(2);
    let key = |tensor| Content::Part { tensor, part: 0 };
    for t in 0..2 {
        let f = b.reserve(&key(t), 10).unwrap();
        b.publish(key(t), f, None, 10, &Arc::default());
    }
    // Tensor 1 held open, tensor 0 idle: 0 makes room for 2.
    let one = b.ready(&key(1)).unwrap();
    b.opened(&one);
    assert!(b.reserve(&key(2), 10).is_some());
    assert!(b.ready(&key(0)).is_none());
    assert_eq!(b.stats.backing_evictions.load(Relaxed), 1);
    // Tensor 1 open, 2 being filled: nothing can go, no file for 3.
    assert!(b.reserve(&key(3), 10).is_none());
    assert!(b.ready(&key(1)).is_some());
}

#[test]
fn written_ranges_merge_and_cover() {
    let mut w = Written::default();
    w.add(10, 20);
    w.add(30, 40);
    assert!(w.covers(10, 20) && w.covers(12, 18) && w.covers(30, 40));
    assert!(!w.covers(5, 15) && !w.covers(15, 35) && !w.covers(0, 1));
    // Touching and overlapping ranges join; one inside changes nothing.
    w.add(20, 30);
    assert!(w.covers(10, 40));
    w.add(5, 12);
    w.add(35, 50);
    w.add(15, 16);
    assert_eq!(w.ranges.iter().collect::<Vec<_>>(), vec![(&5, &50)]);
    // A range over several joins them all.
    w.add(60, 70);
    w.add(80, 90);
    w.add(55, 85);
    assert_eq!(
        w.ranges.iter().collect::<Vec<_>>(),
        vec![(&5, &50), (&55, &90)]
    );
    assert!(!w.covers(49, 56));
}

#[test]
fn page_cache_behind_a_reader_goes_past_what_is_not_written() {
    const MIB: u64 = 1 << 20;
    let p = Arc::new(Partial::new(
        tempfile::tempfile().unwrap(),
        64 * MIB,
        Written::default(),
    ));
    // Written: all but [3 MiB, 4 MiB), which the write-behind skipped.
    lock(&p.written).add(0, 3 * MIB);
    lock(&p.written).add(4 * MIB, 20 * MIB);
    let t = p.through();
    // Less than a step behind: nothing yet.
    let no = (0, 0);
    assert_eq!(t.behind(2 * MIB, no), vec![]);
    // Up to the margin behind, in whole steps: what is written of it.
    assert_eq!(
        t.behind(12 * MIB, no),
        vec![(0, 3 * MIB), (4 * MIB, 10 * MIB)]
    );
    // Each range once; the next step after it.
    assert_eq!(t.behind(12 * MIB, no), vec![]);
    assert_eq!(t.behind(14 * MIB, no), vec![(10 * MIB, 12 * MIB)]);
    // A file decoded whole is written where the caller says.
    assert_eq!(
        t.behind(18 * MIB, (0, 18 * MIB)),
        vec![(12 * MIB, 16 * MIB)]
    );
}
