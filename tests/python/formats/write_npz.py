"""Writes npz files with numpy.savez (stored members) and
numpy.savez_compressed (deflated members)."""
import os

import numpy as np

import common


def write(out):
    arrs = common.arrays()
    np.savez(os.path.join(out, "stored.npz"), **arrs)
    np.savez_compressed(os.path.join(out, "deflated.npz"), **arrs)
    e = {k: common.entry(v) for k, v in arrs.items()}
    return {"stored.npz": e, "deflated.npz": e}


if __name__ == "__main__":
    common.main(write)
