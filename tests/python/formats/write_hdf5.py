"""Writes an HDF5 file with h5py: contiguous datasets, and chunked ones
(plain, deflate-compressed, shuffled+compressed), one in a group."""
import os

import h5py
import numpy as np

import common


def write(out):
    arrs = common.arrays()
    exp = {}
    with h5py.File(os.path.join(out, "data.h5"), "w") as f:
        for k in ["f32", "f64", "i32", "u8", "i64", "f16"]:
            f.create_dataset(k, data=arrs[k])
            exp[k] = common.entry(arrs[k])
        big = np.arange(10000, dtype="<f4").reshape(100, 100)
        f.create_dataset("chunked", data=big, chunks=(30, 40))
        f.create_dataset("gzip", data=big * 2, chunks=(16, 16), compression="gzip")
        f.create_dataset("shuffled", data=big.astype("<i4"), chunks=(50, 50),
                         compression="gzip", shuffle=True)
        g = f.create_group("group")
        g.create_dataset("inner", data=arrs["i16"])
        exp["chunked"] = common.entry(big)
        exp["gzip"] = common.entry(big * 2)
        exp["shuffled"] = common.entry(big.astype("<i4"))
        exp["group/inner"] = common.entry(arrs["i16"])
    return {"data.h5": exp}


if __name__ == "__main__":
    common.main(write)
