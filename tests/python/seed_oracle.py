#!/usr/bin/env python3
"""Reads fuzz seeds with each format's own reader, for tests/fuzz_seed_oracle.rs.

Usage: seed_oracle.py KIND FILE...

KIND names the reader: safetensors (safetensors.numpy.load_file), gguf
(gguf.GGUFReader), hdf5 (h5py), npz (numpy.load, no pickles), onnx
(onnx.load and onnx.numpy_helper.to_array over the graph's initializers),
deathtensors (deathtensors.open with verify=True, or open_sharded for
an index; get_bytes), zt01 (the
ztensor 0.1.x package's Reader.read_tensor), zt1 (the ztensor 1.x
package's Reader, every component of every object read raw).

Prints one JSON object: {FILE: {"refused": why} | {"tensors": [TENSOR]}},
where TENSOR is {"name", "dtype", "shape", "parts": {PART: {"shape",
"itemsize", "sha256"}}} or {"name", "unreadable": why} for a tensor the
file lists but the reader cannot give as a plain array. "sha256" is the
digest of the part's elements, little-endian, C order. A dense tensor has
one part named "" (a file in the mount); a sparse or quantized zTensor v1
object a part per component (its directory's files).
"""
import hashlib
import json
import subprocess
import sys

import numpy as np


def le_bytes(a):
    """The elements of `a`, C order, little-endian."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.tobytes()


def digest(b):
    return hashlib.sha256(b).hexdigest()


def dense(name, arr, dtype=None):
    """A tensor of one part from a numpy array (refused if it is not a plain
    array of fixed-size elements)."""
    if arr.dtype.hasobject or arr.dtype.kind in "OUSV" or arr.dtype.fields:
        return {"name": name, "unreadable": f"numpy dtype {arr.dtype.str} is not plain elements"}
    return {
        "name": name,
        "dtype": dtype or arr.dtype.str,
        "shape": list(arr.shape),
        "parts": {"": {"shape": list(arr.shape), "itemsize": arr.dtype.itemsize,
                       "sha256": digest(le_bytes(arr))}},
    }


def read_safetensors(path):
    from safetensors.numpy import load_file
    return [dense(k, v) for k, v in load_file(path).items()]


def read_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)
    out = []
    for t in r.tensors:
        # GGUF's dims run fastest first; the array's shape is C order.
        shape = [int(d) for d in reversed(list(t.shape))]
        raw = np.ascontiguousarray(t.data).tobytes()
        if t.tensor_type.name in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"):
            item = t.data.dtype.itemsize
        else:
            # Quantized blocks: compared as their raw bytes.
            item = 1
        assert len(raw) == int(t.n_bytes), (t.name, len(raw), t.n_bytes)
        out.append({"name": t.name, "dtype": t.tensor_type.name, "shape": shape,
                    "parts": {"": {"shape": shape if item > 1 else None, "itemsize": item,
                                   "sha256": digest(raw)}}})
    return out


def read_hdf5(path):
    import h5py
    out = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset):
                return
            try:
                arr = obj[()]
            except Exception as e:  # noqa: BLE001 - the reader's refusal
                out.append({"name": name, "unreadable": f"{type(e).__name__}: {e}"})
                return
            out.append(dense(name, np.asarray(arr)))
        f.visititems(visit)
    return out


def read_npz(path):
    out = []
    with np.load(path, allow_pickle=False) as z:
        for k in z.files:
            try:
                out.append(dense(k, z[k]))
            except ValueError as e:
                out.append({"name": k, "unreadable": str(e)})
    return out


def read_onnx(path):
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    out = []
    for init in m.graph.initializer:
        try:
            arr = numpy_helper.to_array(init)
        except Exception as e:  # noqa: BLE001
            out.append({"name": init.name, "unreadable": f"{type(e).__name__}: {e}"})
            continue
        out.append(dense(init.name, arr, onnx.TensorProto.DataType.Name(init.data_type)))
    for s in m.graph.sparse_initializer:
        out.append({"name": s.values.name, "unreadable": "sparse initializer"})
    return out


def read_deathtensors(path):
    import deathtensors as dt
    out = []
    # A sharded model's index is read with its shards (none beside a seed).
    try:
        reader = dt.open_sharded(path, verify=True)
    except dt.DeathTensorsError as e:
        if "is not a sharded deathtensors index" not in str(e):
            raise
        reader = dt.open(path, verify=True)
    with reader as f:
        for k in f.keys():
            info = f.info(k)
            data = bytes(f.get_bytes(k))
            item = np.dtype(info["numpy_dtype"]).itemsize
            out.append({"name": k, "dtype": info["dtype"], "shape": list(info["shape"]),
                        "parts": {"": {"shape": list(info["shape"]), "itemsize": item,
                                       "sha256": digest(data)}}})
    return out


def read_zt01(path):
    import ztensor
    out = []
    with ztensor.Reader(path) as r:
        for name in r.get_tensor_names():
            try:
                # Copied while the view lives: the package's view hands
                # numpy a pointer into memory it frees with the view.
                view = r.read_tensor(name)
                arr = np.array(view, copy=True)
                del view
            except Exception as e:  # noqa: BLE001 - the reader's refusal
                out.append({"name": name, "unreadable": f"{type(e).__name__}: {e}"})
                continue
            out.append(dense(name, arr))
    return out


def read_zt1(path):
    import ztensor
    r = ztensor.Reader(path)
    out = []
    for name in r.keys():
        meta = r.metadata(name)
        comps = list(meta.components) if hasattr(meta, "components") else ["data"]
        parts = {}
        for comp in comps:
            buf, _ = r._inner._read_component_raw(name, comp)
            m = memoryview(buf)
            part = "" if comp == "data" and meta.format == "dense" else comp
            parts[part] = {"shape": list(m.shape) if m.ndim else [], "itemsize": m.itemsize,
                           "sha256": digest(bytes(m.cast("B")))}
        out.append({"name": name, "dtype": str(meta.dtype), "shape": list(meta.shape),
                    "parts": parts})
    return out


READERS = {
    "safetensors": read_safetensors,
    "gguf": read_gguf,
    "hdf5": read_hdf5,
    "npz": read_npz,
    "onnx": read_onnx,
    "deathtensors": read_deathtensors,
    "zt01": read_zt01,
    "zt1": read_zt1,
}


def main():
    kind, paths = sys.argv[1], sys.argv[2:]
    if kind == "zt01":
        # The 0.1.4 package aborts the process on some inputs (a name
        # holding NUL panics in its FFI): each file is read in a child.
        result = {}
        for p in paths:
            r = subprocess.run([sys.executable, __file__, "zt01-one", p],
                               capture_output=True, text=True)
            if r.returncode == 0:
                result.update(json.loads(r.stdout))
            else:
                err = [line for line in r.stderr.splitlines() if line.strip()]
                result[p] = {"refused": f"the reader aborted ({r.returncode}): "
                                        + (err[0] if err else "")[:200]}
        json.dump(result, sys.stdout)
        return
    read = READERS["zt01" if kind == "zt01-one" else kind]
    result = {}
    for p in paths:
        try:
            result[p] = {"tensors": read(p)}
        except Exception as e:  # noqa: BLE001 - the reader refuses the file
            result[p] = {"refused": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
