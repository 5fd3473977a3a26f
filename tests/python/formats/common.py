"""Shared by the writers: the arrays they write, and the expected JSON.

expected.json maps file name -> tensor name -> {sha256 of the array's
little-endian C-order bytes, numpy dtype, shape}; or for a block-quantized
GGUF tensor the sha256 of its stored blocks as the writer produced them.
"""
import hashlib
import json
import os
import sys

import numpy as np


def arrays(rng_seed=7):
    rng = np.random.default_rng(rng_seed)
    return {
        "f32": rng.standard_normal((3, 5)).astype("<f4"),
        "f64": rng.standard_normal((4,)).astype("<f8"),
        "f16": rng.standard_normal((2, 3, 2)).astype("<f2"),
        "i64": rng.integers(-(2**40), 2**40, size=(7,)).astype("<i8"),
        "i32": rng.integers(-1000, 1000, size=(2, 2)).astype("<i4"),
        "i16": rng.integers(-300, 300, size=(5,)).astype("<i2"),
        "i8": rng.integers(-100, 100, size=(9,)).astype("i1"),
        "u8": rng.integers(0, 255, size=(4, 4)).astype("u1"),
        "u16": rng.integers(0, 60000, size=(3,)).astype("<u2"),
        "u32": rng.integers(0, 2**31, size=(3,)).astype("<u4"),
        "u64": rng.integers(0, 2**62, size=(2,)).astype("<u8"),
        "bool": rng.integers(0, 2, size=(6,)).astype("bool"),
        "scalar": np.array(2.5, dtype="<f4"),
        "empty": np.zeros((0, 3), dtype="<f4"),
    }


def entry(a, dtype=None):
    a = np.array(a, order="C")
    le = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
    return {
        "sha256": hashlib.sha256(le.tobytes()).hexdigest(),
        "dtype": dtype or a.dtype.name,
        "shape": list(a.shape),
    }


def main(write):
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    expected = write(out)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
