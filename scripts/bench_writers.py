#!/usr/bin/env python3
"""Writes the benchmark's files with the formats' own reference writers, from
.npy files (float32, read through np.load(mmap_mode="r"), so memory stays
small). Run by scripts/bench.py; fails loudly when a writer is missing.

Usage: bench_writers.py FORMAT OUT NAME=NPY [NAME=NPY ...]
  FORMAT: zt2 (ztensor 2.x, raw), zt2-zstd (ztensor 2.x,
          encoding zt.zstd-seekable/1, canonical=False),
          safetensors (safetensors.numpy.save_file),
          gguf (gguf.GGUFWriter, F32 tensors)
The ztensor 2.x package is the one first on PYTHONPATH (.venv/ztensor/2).
"""

import os
import sys

import numpy as np

SEEKABLE = "zt.zstd-seekable/1"


def load(specs):
    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            sys.exit(f"bench_writers: expected NAME=NPY, got {spec!r}")
        a = np.load(path, mmap_mode="r")
        if a.dtype != np.dtype("<f4"):
            sys.exit(f"bench_writers: {path}: float32 only, got {a.dtype}")
        out.append((name, a))
    return out


def need(module, why):
    try:
        return __import__(module)
    except ImportError as e:
        sys.exit(f"bench_writers: cannot import {module} ({why}): {e}; "
                 "scripts/setup.sh installs it into .venv")


def write_zt2(out, tensors, zstd):
    ztensor = need("ztensor", "zTensor v2 writer")
    version = getattr(ztensor, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version
            version = dist_version("ztensor")
        except Exception:
            version = "?"
    if not hasattr(ztensor, "Writer") or not str(version).startswith("2"):
        sys.exit(f"bench_writers: ztensor {version} from {ztensor.__file__} is not 2.x: "
                 "put .venv/ztensor/2 first on PYTHONPATH")
    # The canonical form wants objects added in name order and no encoding.
    w = ztensor.Writer(out, canonical=not zstd)
    for name, a in sorted(tensors, key=lambda t: t[0]):
        w.add(name, a.reshape(-1).view(np.uint8), list(a.shape), "f32",
              encoding=SEEKABLE if zstd else None)
    w.finish()


def write_safetensors(out, tensors):
    need("safetensors", "safetensors writer")
    from safetensors.numpy import save_file
    save_file(dict(tensors), out)


def write_gguf(out, tensors):
    gguf = need("gguf", "GGUF writer")
    w = gguf.GGUFWriter(out, arch="llama")
    for name, a in tensors:
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    fmt, out, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
    tensors = load(specs)
    tmp = f"{out}.partial"
    if os.path.exists(tmp):
        os.unlink(tmp)
    if fmt in ("zt2", "zt2-zstd"):
        write_zt2(tmp, tensors, fmt == "zt2-zstd")
    elif fmt == "safetensors":
        write_safetensors(tmp, tensors)
    elif fmt == "gguf":
        write_gguf(tmp, tensors)
    else:
        sys.exit(f"bench_writers: unknown format {fmt!r}")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
