use super::pickle::py_repr;
use super::strided::{gather, gather_stream};
use super::*;

#[test]
fn contiguity_ignores_unit_dimensions() {
    assert!(is_contiguous(&[3, 4], &[4, 1]));
    assert!(is_contiguous(&[1, 4], &[99, 1]));
    assert!(is_contiguous(&[], &[]));
    assert!(!is_contiguous(&[4, 3], &[1, 4]));
    assert!(!is_contiguous(&[5], &[2]));
}

#[test]
fn hostile_pickles_are_errors_not_panics() {
    for p in [
        &b""[..],
        b"\x80\x02",
        b"0.",
        b"t.",
        b"h\x05.",
        b"X\xff\xff\xff\xff",
        b"\x80\x02]q\x00(h\x00h\x00e.",
    ] {
        let mut vm = Vm::new(p, 1 << 20);
        let r = vm.run();
        if let Ok(v) = r {
            // A cycle is an error; anything else may be empty.
            let (mut out, mut budget) = (Vec::new(), 1000);
            let _ = vm.collect(&v, String::new(), 0, &mut budget, &mut out);
            assert!(out.is_empty());
        }
    }
}

#[test]
fn a_self_containing_list_stops_at_the_depth_limit() {
    // [] memo 0, then append memo 0 to itself: a cycle.
    let mut vm = Vm::new(b"]q\x00h\x00a.", 1 << 20);
    let v = vm.run().unwrap();
    let (mut out, mut budget) = (Vec::new(), u64::MAX);
    assert!(
        vm.collect(&v, String::new(), 0, &mut budget, &mut out)
            .is_err()
    );
}

#[test]
fn gathering_follows_strides_and_ignores_unit_dimensions() {
    // A 2x3 transposed from a 3x2 storage, with a unit dimension of
    // absurd stride in front.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("storage");
    let storage: Vec<u8> = (0..6u8).collect();
    std::fs::write(&path, &storage).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let g = Gather {
        storage: (0, 6),
        es: 1,
        offset: 0,
        shape: vec![1, 2, 3],
        stride: vec![u64::MAX, 1, 2],
        nbytes: 6,
    };
    let mut out = Vec::with_capacity(6);
    gather(&file, &g, &mut out).unwrap();
    assert_eq!(out, [0, 2, 4, 1, 3, 5]);
}

#[test]
fn gathering_in_bands_gives_the_same_bytes() {
    // A 4x3x2 tensor strided out of a 2x3x4 storage (axes reversed).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("storage");
    let storage: Vec<u8> = (0..24u8).collect();
    std::fs::write(&path, &storage).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let g = Gather {
        storage: (0, 24),
        es: 1,
        offset: 0,
        shape: vec![4, 3, 2],
        stride: vec![1, 4, 12],
        nbytes: 24,
    };
    let mut whole = Vec::with_capacity(24);
    gather(&file, &g, &mut whole).unwrap();
    for band in [1, 6, 7, 13, 24, 1000] {
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        gather_stream(&file, &g, band, &mut |b| {
            sizes.push(b.len());
            got.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(got, whole, "bands of {band}");
        assert!(
            sizes.iter().all(|&n| n <= band.max(6) as usize),
            "{sizes:?}"
        );
    }
    // A 0-d tensor: one band of one element.
    let scalar = Gather {
        storage: (0, 24),
        es: 2,
        offset: 5,
        shape: vec![],
        stride: vec![],
        nbytes: 2,
    };
    let mut got = Vec::new();
    gather_stream(&file, &scalar, 1, &mut |b| {
        got.extend_from_slice(b);
        Ok(())
    })
    .unwrap();
    assert_eq!(got, [10, 11]);
}

#[test]
fn an_overlong_name_is_an_error() {
    let mut p = b"}X".to_vec();
    p.extend_from_slice(&70_000u32.to_le_bytes());
    p.extend(std::iter::repeat_n(b'k', 70_000));
    p.extend_from_slice(b"}s.");
    let mut vm = Vm::new(&p, 1 << 20);
    let v = vm.run().unwrap();
    let (mut out, mut budget) = (Vec::new(), 1000);
    let e = vm
        .collect(&v, String::new(), 0, &mut budget, &mut out)
        .unwrap_err();
    assert!(e.contains("tensor name over"), "{e}");
}

#[test]
fn strings_in_tuple_keys_are_shown_as_python_shows_them() {
    assert_eq!(py_repr("a"), "'a'");
    assert_eq!(py_repr("a'b"), "\"a'b\"");
    assert_eq!(py_repr("a'b\""), "'a\\'b\"'");
    assert_eq!(py_repr("c\\d\te\u{1}"), "'c\\\\d\\te\\x01'");
}

#[test]
fn every_dict_key_names_its_tensors() {
    // {"ok": t, (1, 2): t, None: t, 1.5: t, True: t, 7: t}, each t a
    // float32 [2] of storage "0": torch.load keeps every key.
    let mut t = b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage".to_vec();
    t.extend_from_slice(b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu");
    t.extend_from_slice(b"K\x10tQK\x00K\x02\x85K\x01\x85tR");
    let mut p = b"}(".to_vec();
    let float = [&b"G"[..], &1.5f64.to_be_bytes()].concat();
    let keys: [&[u8]; 6] = [
        b"X\x02\x00\x00\x00ok",
        b"K\x01K\x02\x86",
        b"N",
        &float,
        b"\x88",
        b"K\x07",
    ];
    for k in keys {
        p.extend_from_slice(k);
        p.extend_from_slice(&t);
    }
    p.extend_from_slice(b"u.");
    let mut vm = Vm::new(&p, 1 << 20);
    let v = vm.run().unwrap();
    let (mut out, mut budget) = (Vec::new(), 1000);
    vm.collect(&v, String::new(), 0, &mut budget, &mut out)
        .unwrap();
    let names: Vec<_> = out.iter().map(|(n, t)| (n.as_str(), t.is_ok())).collect();
    let want = ["ok", "(1, 2)", "None", "#3", "#4", "7"];
    assert_eq!(names, want.map(|n| (n, true)));
}

#[test]
fn a_doubling_structure_runs_out_of_budget() {
    // L0 = [], then 60 times: L = [L, L] (memo 0 each time).
    let mut p = b"]q\x00".to_vec();
    for _ in 0..60 {
        p.extend_from_slice(b"(h\x00h\x00lq\x00");
    }
    p.push(b'.');
    let mut vm = Vm::new(&p, 1 << 20);
    let v = vm.run().unwrap();
    let (mut out, mut budget) = (Vec::new(), 1_000_000);
    let e = vm
        .collect(&v, String::new(), 0, &mut budget, &mut out)
        .unwrap_err();
    assert!(e.contains("too many values"), "{e}");
}
