"""Writes zTensor v2 files with the real Python package (`ztensor` 2.x) and
what a reader must find in them.

Usage: write_zt2.py OUTDIR

Writes OUTDIR/{plain,zstd,profiles,appended}.zt and OUTDIR/expected.json:
{"<file>": [{"name", "part", "dtype", "shape", "hex", "sha256"}]}, where
`hex` is the little-endian element bytes numpy gives for the data written
and `sha256` the digest of the bytes the package itself reads back for that
part (`part` is null for a dense tensor's one part).
"""

import hashlib
import json
import os
import sys

import ml_dtypes
import numpy as np
import ztensor

SEEKABLE = "zt.zstd-seekable/1"
rng = np.random.default_rng(7)


def dense_cases():
    """(name, v2 dtype, logical type, little-endian bytes, shape)."""
    out = []
    for dt, np_dt in [
        ("f64", "<f8"), ("f32", "<f4"), ("f16", "<f2"),
        ("i64", "<i8"), ("i32", "<i4"), ("i16", "<i2"), ("i8", "|i1"),
        ("u64", "<u8"), ("u32", "<u4"), ("u16", "<u2"), ("u8", "|u1"),
    ]:
        a = (rng.standard_normal((3, 5)) * 100).astype(np_dt)
        out.append((f"t_{dt}", dt, None, a.tobytes(), [3, 5]))
    bf = rng.standard_normal((4, 3)).astype(ml_dtypes.bfloat16)
    out.append(("t_bf16", "bf16", None, bf.view("<u2").tobytes(), [4, 3]))
    out.append(("t_bool", "u8", "bool",
                rng.integers(0, 2, 17).astype("|u1").tobytes(), [17]))
    for lt, mdt in [("f8_e4m3fn", ml_dtypes.float8_e4m3fn),
                    ("f8_e5m2", ml_dtypes.float8_e5m2),
                    ("f8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
                    ("f8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz),
                    ("f8_e8m0", ml_dtypes.float8_e8m0fnu)]:
        a = np.abs(rng.standard_normal(9)).astype(mdt)
        out.append((f"t_{lt}", "u8", lt, a.view("|u1").tobytes(), [9]))
    # f4: 7 elements packed low nibble first, the odd high nibble zero.
    codes = rng.integers(0, 16, 7).astype(np.uint8)
    packed = np.zeros(4, np.uint8)
    for i, c in enumerate(codes):
        packed[i // 2] |= c << (4 * (i % 2))
    out.append(("t_f4_e2m1", "u8", "f4_e2m1", packed.tobytes(), [7]))
    c64 = (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype("<c8")
    out.append(("t_complex64", "f32", "complex64", c64.tobytes(), [6]))
    c128 = (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype("<c16")
    out.append(("t_complex128", "f64", "complex128", c128.tobytes(), [2, 2]))
    out.append(("t_scalar", "f32", None, np.array(3.5, "<f4").tobytes(), []))
    out.append(("t_empty", "f32", None, b"", [0, 4]))
    big = np.arange(600_000, dtype="<u4") * 2654435761 % 1000
    out.append(("t_big", "u32", None, big.astype("<u4").tobytes(), [600_000]))
    return out


def expect(entries, path):
    """Adds the package's own read-back digest to each expectation."""
    src = ztensor.open(path)
    for e in entries:
        t = src[e["name"]]
        if e["part"] is not None:
            t = t[e["part"]]
        e["sha256"] = hashlib.sha256(t.tobytes()).hexdigest()
    src.close()
    return entries


def entry(name, part, dtype, data, shape):
    return {"name": name, "part": part, "dtype": dtype, "shape": shape,
            "hex": data.hex()}


def write_dense(path, cases, encoding=None, **opts):
    w = ztensor.Writer(path, **opts)
    # Canonical form wants objects added in name order.
    for name, dt, lt, data, shape in sorted(cases):
        w.add(name, data, shape, dt, logical=lt, encoding=encoding)
    w.set_attributes({"writer": "tests/python/write_zt2.py", "n": len(cases)})
    w.finish()
    return [entry(n, None, lt or dt, d, s) for n, dt, lt, d, s in cases]


def write_profiles(path):
    w = ztensor.Writer(path, canonical=False)
    ents = []
    # CSR 3x4: rows [0:2], [2:2], [2:3]
    indptr = np.array([0, 2, 2, 3], "<u4").tobytes()
    indices = np.array([0, 3, 1], "<u4").tobytes()
    values = np.array([1.5, -2.0, 4.25], "<f4").tobytes()
    w.add_object("csr", [3, 4], {
        "indptr": {"dtype": "u32", "data": indptr},
        "indices": {"dtype": "u32", "data": indices, "encoding": SEEKABLE},
        "values": {"dtype": "f32", "data": values},
    }, layout="zt.sparse_csr/1")
    ents += [entry("csr", "indptr", "u32", indptr, [4]),
             entry("csr", "indices", "u32", indices, [3]),
             entry("csr", "values", "f32", values, [3])]
    # COO 2-D, structure of arrays
    coords = np.array([0, 1, 2, 3, 0, 2], "<u8").tobytes()
    cvals = np.array([7, 8, 9], "<i2").tobytes()
    w.add_object("coo", [3, 4], {
        "coords": {"dtype": "u64", "data": coords},
        "values": {"dtype": "i16", "data": cvals},
    }, layout="zt.sparse_coo/1")
    ents += [entry("coo", "coords", "u64", coords, [2, 3]),
             entry("coo", "values", "i16", cvals, [3])]
    # MXFP4: 2 x 64 elements, blocks of 32 along the last axis
    mxd = rng.integers(0, 256, 64).astype("|u1").tobytes()
    mxs = rng.integers(100, 140, 4).astype("|u1").tobytes()
    w.add_object("mx", [2, 64], {
        "data": {"dtype": "u8", "logical": "f4_e2m1", "data": mxd},
        "scales": {"dtype": "u8", "logical": "f8_e8m0", "data": mxs},
    }, layout="zt.mx/1", attributes={"block_size": 32, "scale_form": "e8m0_exponent"})
    ents += [entry("mx", "data", "f4_e2m1", mxd, [128]),
             entry("mx", "scales", "f8_e8m0", mxs, [4])]
    # GGUF q8_0: 64 elements in 2 blocks of 34 bytes
    gd = rng.integers(0, 256, 68).astype("|u1").tobytes()
    w.add_object("gguf", [2, 32], {"data": {"dtype": "u8", "data": gd}},
                 layout="gguf.q8_0/1",
                 attributes={"elems_per_block": 32, "block_bytes": 34})
    ents.append(entry("gguf", "data", "u8", gd, [68]))
    # Affine int4 (bias 8): [4, 64], groups of 32 along axis 1, u32 words
    qd = rng.integers(0, 2**32, 32, dtype=np.uint64).astype("<u4").tobytes()
    qs = rng.standard_normal(8).astype("<f4").tobytes()
    w.add_object("q4", [4, 64], {
        "data": {"dtype": "u32", "data": qd},
        "scales": {"dtype": "f32", "data": qs},
    }, layout="zt.quant_group/1", attributes={
        "bits": 4, "group_size": 32, "axis": 1,
        "packing": {"word": "u32", "order": "lsb_first", "per_word": 8},
        "scale_form": "f32_factors",
        "zero_point": {"form": "implied", "value": 8},
    })
    ents += [entry("q4", "data", "u32", qd, [32]),
             entry("q4", "scales", "f32", qs, [8])]
    w.finish()
    return ents


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cases = dense_cases()
    expected = {}
    p = os.path.join(out, "plain.zt")
    expected["plain.zt"] = expect(write_dense(p, cases), p)
    p = os.path.join(out, "zstd.zt")
    nonempty = [c for c in cases if c[3]]
    expected["zstd.zt"] = expect(
        write_dense(p, nonempty, encoding=SEEKABLE, canonical=False), p)
    p = os.path.join(out, "profiles.zt")
    expected["profiles.zt"] = expect(write_profiles(p), p)
    # An appended generation: a second manifest and footer at the end; the
    # last one wins and names both tensors.
    p = os.path.join(out, "appended.zt")
    first = write_dense(p, cases[:2], canonical=False)
    w = ztensor.Writer(p, canonical=False, append=True)
    extra = np.arange(10, dtype="<i4").tobytes()
    w.add("added_later", extra, [10], "i32")
    w.finish()
    expected["appended.zt"] = expect(first + [entry("added_later", None, "i32", extra, [10])], p)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main()
