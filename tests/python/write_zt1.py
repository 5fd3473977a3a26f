#!/usr/bin/env python3
"""Write zTensor v1 files with the ztensor 1.x Python package (1.2.3).

Usage: write_zt1.py OUT_DIR
Writes OUT_DIR/all.zt and OUT_DIR/all.zt.expected.json:

  {"package": "<version>",
   "tensors": [{"name", "format", "dtype", "numpy_dtype", "shape",
                "parts": [{"name", "shape", "hex", "sha256"}]}]}

A dense tensor has one part named "" (the tensor's file); a sparse or
quantized one a part per component (the files of its directory). "hex" is
the little-endian element bytes we wrote; "sha256" is the digest of what the
package itself reads back (it must equal sha256(hex), checked here too).
"numpy_dtype" is the numpy type string the exposed file must be read with.

Covered: the 13 storage dtypes raw and zstd, with no checksum, crc32c and
sha256; the logical types f8_e4m3fn, f8_e5m2, f8_e4m3fnuz, f8_e5m2fnuz,
complex64 and complex128 (written through ztensor.Tensor(type=...), the only
way the package writes them); empty and 0-d tensors; sparse_csr, sparse_coo
and quantized_group objects with attributes. The package has no API for
file-level attributes or big-endian data (v1 is little-endian only).
"""
import hashlib
import importlib.metadata
import json
import os
import sys

import ml_dtypes
import numpy as np

import ztensor

rng = np.random.default_rng(7)

# (name suffix, numpy array): the 13 storage dtypes.
STORAGE = {
    "f64": (np.arange(300, dtype="<f8") / 8).reshape(3, 100),
    "f32": np.arange(6, dtype="<f4").reshape(2, 3),
    "f16": np.arange(400, dtype="<f2") / 2,
    "bf16": (np.arange(64) / 4).astype(ml_dtypes.bfloat16).reshape(8, 8),
    "i64": np.arange(-50, 50, dtype="<i8"),
    "i32": np.arange(-3, 3, dtype="<i4").reshape(3, 2),
    "i16": np.arange(-200, 200, dtype="<i2"),
    "i8": np.arange(-128, 128, dtype="i1").reshape(16, 16),
    "u64": np.arange(30, dtype="<u8") << 40,
    "u32": rng.integers(0, 2**32, size=257, dtype="<u4"),
    "u16": np.arange(5, dtype="<u2") * 300,
    "u8": rng.integers(0, 256, size=(4, 5, 6), dtype="u1"),
    "bool": rng.integers(0, 2, size=99).astype(bool),
}

NUMPY = {
    "f64": "<f8", "f32": "<f4", "f16": "<f2", "bf16": "<u2",
    "i64": "<i8", "i32": "<i4", "i16": "<i2", "i8": "|i1",
    "u64": "<u8", "u32": "<u4", "u16": "<u2", "u8": "|u1", "bool": "|b1",
}


def le_bytes(arr):
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.tobytes()


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "all.zt")
    expected = []  # (name, format, dtype, numpy_dtype, shape, [(part, shape, bytes)])

    with ztensor.Writer(path) as w:
        # Every storage dtype: raw, then zstd with each checksum.
        for i, (dt, arr) in enumerate(STORAGE.items()):
            for mode, compress, checksum in [
                ("raw", False, "none"),
                ("raw_crc", False, "crc32c"),
                ("zstd", True, ["crc32c", "sha256", "none"][i % 3]),
                ("zstd_sha", 3, "sha256"),
            ]:
                name = f"{dt}/{mode}"
                w.write_numpy(name, arr, compress=compress, checksum=checksum)
                expected.append((name, "dense", dt, NUMPY[dt], list(arr.shape),
                                 [("", list(arr.shape), le_bytes(arr))]))

        # Logical types: stored as u8 (FP8) or as f32/f64 pairs (complex).
        for t, mlt in [("f8_e4m3fn", ml_dtypes.float8_e4m3fn),
                       ("f8_e5m2", ml_dtypes.float8_e5m2),
                       ("f8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
                       ("f8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz)]:
            vals = (np.arange(-16, 16) / 4).astype(mlt).reshape(4, 8)
            stored = vals.view(np.uint8)
            for compress, checksum in [(False, "none"), (True, "sha256")]:
                name = f"{t}/{'zstd' if compress else 'raw'}"
                w.write(name, ztensor.Tensor({"data": stored}, type=t),
                        compress=compress, checksum=checksum)
                expected.append((name, "dense", t, "|u1", [4, 8],
                                 [("", [4, 8], le_bytes(stored))]))
        for t, ct, st in [("complex64", "<c8", "<f4"), ("complex128", "<c16", "<f8")]:
            vals = (np.arange(10) + 1j * np.arange(10)[::-1]).astype(ct)
            stored = vals.view(st)
            for compress, checksum in [(False, "crc32c"), (True, "none")]:
                name = f"{t}/{'zstd' if compress else 'raw'}"
                w.write(name, ztensor.Tensor({"data": stored}, shape=[10], type=t),
                        compress=compress, checksum=checksum)
                expected.append((name, "dense", t, ct, [10],
                                 [("", [10], le_bytes(vals))]))

        # Edge shapes.
        for name, arr in [("empty_0x3", np.zeros((0, 3), dtype="<i4")),
                          ("scalar_f64", np.array(3.5, dtype="<f8"))]:
            w.write(name, ztensor.Tensor({"data": arr}))
            expected.append((name, "dense", "f64" if arr.dtype == np.float64 else "i32",
                             "<f8" if arr.dtype == np.float64 else "<i4", list(arr.shape),
                             [("", list(arr.shape), le_bytes(arr))]))

        # Sparse: CSR of a 4x5 matrix, COO of a 3x4x5 array.
        values = np.array([1.5, -2, 3, 4.25, 5], dtype="<f4")
        indices = np.array([0, 3, 1, 4, 2], dtype="<u8")
        indptr = np.array([0, 2, 2, 4, 5], dtype="<u8")
        for compress, checksum in [(False, "none"), (True, "crc32c")]:
            name = f"csr/{'zstd' if compress else 'raw'}"
            w.write(name, ztensor.Tensor(
                {"values": values, "indices": indices, "indptr": indptr},
                shape=[4, 5], format="sparse_csr", attributes={"note": "csr"}),
                compress=compress, checksum=checksum)
            expected.append((name, "sparse_csr", "f32", None, [4, 5], [
                ("values", [5], le_bytes(values)),
                ("indices", [5], le_bytes(indices)),
                ("indptr", [5], le_bytes(indptr))]))
        cvals = np.array([7, 8, 9], dtype="<i8")
        coords = np.array([0, 1, 2, 3, 0, 1, 4, 0, 2], dtype="<u8")  # SoA: dims x nnz
        for compress, checksum in [(False, "sha256"), (True, "none")]:
            name = f"coo/{'zstd' if compress else 'raw'}"
            w.write(name, ztensor.Tensor({"values": cvals, "coords": coords},
                                         shape=[3, 4, 5], format="sparse_coo"),
                    compress=compress, checksum=checksum)
            expected.append((name, "sparse_coo", "i64", None, [3, 4, 5], [
                ("values", [3], le_bytes(cvals)),
                ("coords", [3, 3], le_bytes(coords))]))

        # Quantized group: a component per file, flat.
        packed = rng.integers(-2**31, 2**31, size=64, dtype="<i4")
        scales = (np.arange(8) / 8).astype("<f2")
        zeros = np.arange(8, dtype="<f2")
        w.write("q4", ztensor.Tensor(
            {"packed_weight": packed, "scales": scales, "zeros": zeros},
            shape=[16, 32], format="quantized_group",
            attributes={"bits": 4, "group_size": 64, "packing": "8_per_i32"}),
            compress=True, checksum="crc32c")
        expected.append(("q4", "quantized_group", "i32", None, [16, 32], [
            ("packed_weight", [64], le_bytes(packed)),
            ("scales", [8], le_bytes(scales)),
            ("zeros", [8], le_bytes(zeros))]))

    # The package's own read-back of every component.
    r = ztensor.Reader(path)
    out = []
    for name, fmt, dtype, npdt, shape, parts in expected:
        meta = r.metadata(name)
        assert meta.format == fmt, (name, meta.format)
        jparts = []
        for part, pshape, data in parts:
            comp = "data" if part == "" else part
            buf, _ = r._inner._read_component_raw(name, comp)
            back = bytes(memoryview(buf).cast("B"))
            assert back == data, f"{name}/{comp}: the package reads back other bytes"
            jparts.append({"name": part, "shape": pshape, "hex": data.hex(),
                           "sha256": hashlib.sha256(back).hexdigest()})
        out.append({"name": name, "format": fmt, "dtype": dtype, "numpy_dtype": npdt,
                    "shape": shape, "parts": jparts})
    with open(path + ".expected.json", "w") as f:
        json.dump({"package": importlib.metadata.version("ztensor"), "tensors": out}, f,
                  indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    main(sys.argv[1])
