#!/usr/bin/env python3
"""Write a reference .zt file with the ztensor 0.1.4 Python package.

Usage: write_reference.py OUT.zt
Also writes OUT.zt.expected.json: [{name, dtype, shape, data_hex}], where
data_hex is the little-endian element bytes (row-major).

The 0.1.4 Python API only writes dense, raw, little-endian tensors without
checksums or custom fields, so those features are not covered here.
"""
import json
import sys

import numpy as np
from ml_dtypes import bfloat16  # dependency of ztensor 0.1.4

import ztensor
from ztensor import ffi, lib

TENSORS = {
    "f32_2x3": np.arange(6, dtype="<f4").reshape(2, 3),
    "f64": np.arange(3, dtype="<f8") / 4,
    "f16": np.arange(4, dtype="<f2") / 2,
    "bf16": (np.arange(4) / 4).astype(bfloat16),
    "i64": np.arange(-2, 3, dtype="<i8"),
    "i32": np.arange(-3, 3, dtype="<i4").reshape(3, 2),
    "i16": np.arange(-2, 2, dtype="<i2"),
    "i8": np.arange(-4, 4, dtype="i1"),
    "u64": np.arange(3, dtype="<u8") << 40,
    "u32": np.arange(4, dtype="<u4") * 70000,
    "u16": np.arange(5, dtype="<u2") * 300,
    "u8": np.arange(7, dtype="u1"),
    "bool": np.array([True, False, True]),
    "empty_0x3": np.zeros((0, 3), dtype="<i4"),
    "nd_2x1x2x2": np.arange(8, dtype="<f4").reshape(2, 1, 2, 2),
}
# Writer.add_tensor turns 0-d arrays into shape [1] (np.ascontiguousarray),
# so the scalar is added through the raw FFI call to get shape [].
SCALAR_NAME, SCALAR = "scalar_f32", np.array(3.5, dtype="<f4")


def main(out):
    with ztensor.Writer(out) as w:
        for name, arr in TENSORS.items():
            w.add_tensor(name, arr)
        data = SCALAR.tobytes()
        status = lib.ztensor_writer_add_tensor(
            w._ptr, SCALAR_NAME.encode(), ffi.NULL, 0, b"float32",
            ffi.from_buffer("unsigned char[]", data), len(data))
        if status != 0:
            raise ztensor.ZTensorError(ffi.string(lib.ztensor_last_error_message()).decode())

    expected = [
        {"name": name, "dtype": ztensor.DTYPE_NP_TO_ZT[arr.dtype],
         "shape": list(arr.shape), "data_hex": arr.tobytes().hex()}
        for name, arr in [*TENSORS.items(), (SCALAR_NAME, SCALAR)]
    ]
    with open(out + ".expected.json", "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.zt")
    main(sys.argv[1])
