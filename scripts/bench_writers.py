#!/usr/bin/env python3
"""Writes the benchmark's files with the formats' own reference writers, from
.npy files (float32, read through np.load(mmap_mode="r"), so memory stays
small). Run by scripts/bench.py; fails loudly when a writer is missing.

Usage: bench_writers.py FORMAT OUT NAME=NPY [NAME=NPY ...]
  FORMAT: zt2 (ztensor 2.x, raw), zt2-zstd (ztensor 2.x,
          encoding zt.zstd-seekable/1, canonical=False),
          zt1 / zt1-zstd (ztensor 1.x, write_numpy; compress=True: one frame),
          dt (deathtensors.save, plain), npz (numpy.savez), onnx (the tensors
          as initializers, onnx.numpy_helper.from_array, onnx.save),
          safetensors (safetensors.numpy.save_file),
          gguf (gguf.GGUFWriter, F32 tensors), hdf5 (h5py, one contiguous
          dataset per tensor),
          dt-zstd (deathtensors.save(compress=True): the whole data blob
          one zstd stream), dt-zstandard and dt-zstdcli (the same file with
          that stream made by Python zstandard's one-shot compress, or by
          the zstd CLI, both level 3: the deathtensors header says only
          "one zstd stream", so any writer's frame fits; deathtensors' own
          reader checks the file),
          pt (torch.save of a dict of the tensors when torch is installed;
          else torch.save's zip layout written here: see write_pt)
The ztensor 2.x (1.x) package is the one first on PYTHONPATH (.venv/ztensor/2, /1).
"""

import os
import subprocess
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


def write_npz(out, tensors):
    with open(out, "wb") as fh:  # savez adds ".npz" to a name without it
        np.savez(fh, **{name: np.ascontiguousarray(a) for name, a in tensors})


def write_hdf5(out, tensors):
    h5py = need("h5py", "HDF5 writer")
    with h5py.File(out, "w") as f:  # contiguous datasets, h5py's default
        for name, a in tensors:
            f.create_dataset(name, data=np.ascontiguousarray(a))


def write_onnx(out, tensors):
    onnx = need("onnx", "ONNX writer")
    from onnx import helper, numpy_helper
    inits = [numpy_helper.from_array(np.ascontiguousarray(a), name) for name, a in tensors]
    graph = helper.make_graph([], "weights", [], [], initializer=inits)
    onnx.save(helper.make_model(graph), out)


def write_zt1(out, tensors, compress):
    ztensor = need("ztensor", "zTensor v1 writer")
    if not hasattr(ztensor.Writer, "write_numpy"):
        sys.exit(f"bench_writers: {ztensor.__file__} is not ztensor 1.x: "
                 "put .venv/ztensor/1 first on PYTHONPATH")
    with ztensor.Writer(out) as w:
        for name, a in tensors:
            w.write_numpy(name, np.ascontiguousarray(a), compress=compress, checksum="none")


def write_dt(out, tensors, compress):
    dt = need("deathtensors", "deathtensors writer")
    dt.save(out, {name: np.ascontiguousarray(a) for name, a in tensors}, compress=compress)


def reblob_dt(out, tensors, how):
    """A plain deathtensors file from its own writer, its data blob then
    replaced by one zstd stream from another writer and flag bit0 set."""
    plain = f"{out}.plain"
    write_dt(plain, tensors, compress=False)
    with open(plain, "rb") as fh:
        head = fh.read(24)
        if head[:8] != b"DTLEGION":
            sys.exit(f"bench_writers: {plain}: not a deathtensors file")
        flags = int.from_bytes(head[12:16], "little")
        hlen = int.from_bytes(head[16:24], "little")
        if flags != 0:
            sys.exit(f"bench_writers: {plain}: flags {flags}, expected a plain file")
        start = 24 + (hlen + 7) // 8 * 8
        fh.seek(0)
        lead = bytearray(fh.read(start))
    lead[12:16] = (1).to_bytes(4, "little")
    if how == "zstandard":
        zstandard = need("zstandard", "Python zstandard")
        with open(plain, "rb") as fh:
            fh.seek(start)
            stream = zstandard.ZstdCompressor(level=3).compress(fh.read())
    else:  # the zstd CLI, on the blob as a file of its own (the frame records its size)
        blob = f"{out}.blob"
        with open(plain, "rb") as fh, open(blob, "wb") as dst:
            fh.seek(start)
            while b := fh.read(16 << 20):
                dst.write(b)
        stream = subprocess.run(["zstd", "-3", "-q", "-c", blob], check=True,
                                capture_output=True).stdout
        os.unlink(blob)
    os.unlink(plain)
    with open(out, "wb") as fh:
        fh.write(lead)
        fh.write(stream)
    dt = need("deathtensors", "deathtensors reader")
    f = dt.open(out)
    for name, a in tensors:
        if not np.array_equal(f.get_tensor(name, framework="numpy"), a):
            sys.exit(f"bench_writers: {out}: deathtensors reads {name} back wrong")


def write_pt(out, tensors):
    """torch.save({name: tensor}) with torch; without it (torch is too big
    for the benchmark's venv), the same archive torch 2.x writes, member
    for member: ARCHIVE/data.pkl (protocol 2: an OrderedDict of
    torch._utils._rebuild_tensor_v2 calls on persistent storage ids),
    .format_version, .storage_alignment, byteorder, data/N (stored, each
    starting on a multiple of 64 bytes, padded by an extra field as torch
    pads it), version and .data/serialization_id, as in the torch-made
    fixtures of tests/fixtures/pt (scripts/make_pt_fixtures.py)."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.save({name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in tensors}, out)
        return
    import collections
    import io
    import pickle
    import types
    import zipfile

    # Stand-ins with torch's names, so that pickle writes the globals torch
    # writes (this process never imports torch).
    mod, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    class FloatStorage:
        pass

    def _rebuild_tensor_v2(*args):
        raise RuntimeError("never called")

    FloatStorage.__module__, FloatStorage.__qualname__ = "torch", "FloatStorage"
    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    mod.FloatStorage, utils._rebuild_tensor_v2, mod._utils = FloatStorage, _rebuild_tensor_v2, utils
    sys.modules["torch"], sys.modules["torch._utils"] = mod, utils

    class Storage:
        def __init__(self, key, numel):
            self.key, self.numel = key, numel

    class Tensor:
        def __init__(self, key, a):
            self.storage, self.shape = Storage(key, a.size), tuple(a.shape)

        def __reduce__(self):
            stride, acc = [], 1
            for d in reversed(self.shape):
                stride.insert(0, acc)
                acc *= d
            return (_rebuild_tensor_v2, (self.storage, 0, self.shape, tuple(stride), False,
                                         collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Storage):
                return ("storage", FloatStorage, obj.key, "cpu", obj.numel)
            return None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(collections.OrderedDict(
        (name, Tensor(str(i), a)) for i, (name, a) in enumerate(tensors)))
    root = os.path.splitext(os.path.basename(out.removesuffix(".partial")))[0]
    with open(out, "wb") as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as z:
        def member(name, data=None, array=None):
            info = zipfile.ZipInfo(f"{root}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            n = len(data) if array is None else array.nbytes
            # The data starts after the 30-byte local header, the name and
            # the extra field ("FB", its length, padding): on 64 bytes.
            start = fh.tell() + 30 + len(info.filename.encode()) + 4
            if n * 1.05 > zipfile.ZIP64_LIMIT:
                start += 20  # zipfile's own zip64 extra field comes first
            pad = -start % 64
            info.extra = b"FB" + pad.to_bytes(2, "little") + b"Z" * pad
            info.file_size = n
            with z.open(info, "w") as w:
                if array is None:
                    w.write(data)
                else:
                    flat = array.reshape(-1)
                    step = (16 << 20) // 4
                    for i in range(0, flat.size, step):
                        w.write(np.ascontiguousarray(flat[i:i + step]).tobytes())

        member("data.pkl", buf.getvalue())
        member(".format_version", b"1")
        member(".storage_alignment", b"64")
        member("byteorder", b"little")
        for i, (_, a) in enumerate(tensors):
            member(f"data/{i}", array=a)
        member("version", b"3\n")
        member(".data/serialization_id", b"0" * 40)


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
    elif fmt in ("zt1", "zt1-zstd"):
        write_zt1(tmp, tensors, fmt == "zt1-zstd")
    elif fmt == "dt":
        write_dt(tmp, tensors, compress=False)
    elif fmt == "npz":
        write_npz(tmp, tensors)
    elif fmt == "onnx":
        write_onnx(tmp, tensors)
    elif fmt == "hdf5":
        write_hdf5(tmp, tensors)
    elif fmt == "dt-zstd":
        write_dt(tmp, tensors, compress=True)
    elif fmt in ("dt-zstandard", "dt-zstdcli"):
        reblob_dt(tmp, tensors, fmt[3:])
    elif fmt == "safetensors":
        write_safetensors(tmp, tensors)
    elif fmt == "gguf":
        write_gguf(tmp, tensors)
    elif fmt == "pt":
        write_pt(tmp, tensors)
    else:
        sys.exit(f"bench_writers: unknown format {fmt!r}")
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
