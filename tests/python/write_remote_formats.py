"""Writes, into the folder given, files of the formats ztensor-compat reads
and the sharded sets, each larger than a 64 KiB block, so that a remote
mount of them has blocks it has not fetched at open:

  stored.npz, deflated.npz   numpy.savez / savez_compressed
  model.pt                   a torch-layout zip (data.pkl, one stored and one
                             deflated storage), pickled without torch
  model.onnx                 onnx: a raw_data and a float_data initializer
  model.gguf                 gguf-py: a 50 000-token header and tensors
  split/m-0000N-of-00003.gguf  a GGUF split set
  hf/                        a Hugging Face sharded safetensors set whose
                             index names a fourth shard that is missing
  dt/sharded.deathtensors    a deathtensors sharded set
  model.h5                   h5py (contiguous, and chunked gzip+shuffle)
"""
import collections
import io
import json
import os
import pickle
import sys
import types
import zipfile

import numpy as np


def arrays(seed):
    rng = np.random.default_rng(seed)
    return {
        "big": rng.standard_normal((300, 400)).astype("<f4"),
        "ints": rng.integers(-1000, 1000, size=(50000,)).astype("<i8"),
        "small": np.arange(7, dtype="<i4"),
    }


def write_npz(out):
    a = arrays(1)
    np.savez(os.path.join(out, "stored.npz"), **a)
    np.savez_compressed(os.path.join(out, "deflated.npz"), **a)


def write_pt(out):
    """torch.save's layout, with the pickle torch writes, made by the pickle
    module with stand-ins for the two torch names it refers to."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    class FloatStorage:
        pass

    FloatStorage.__module__ = "torch"
    FloatStorage.__qualname__ = "FloatStorage"

    def _rebuild_tensor_v2(*args):
        raise RuntimeError("never called")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    torch.FloatStorage = FloatStorage
    torch._utils = utils
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    sys.modules["torch"] = torch
    sys.modules["torch._utils"] = utils

    class Storage:
        def __init__(self, key, n):
            self.key, self.n = key, n

    class Tensor:
        def __init__(self, storage, shape):
            self.storage, self.shape = storage, shape

        def __reduce__(self):
            stride = tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
            return (_rebuild_tensor_v2,
                    (self.storage, 0, tuple(self.shape), stride, False,
                     collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Storage):
                return ("storage", FloatStorage, obj.key, "cpu", obj.n)
            return None

    rng = np.random.default_rng(2)
    w = rng.standard_normal((200, 300)).astype("<f4")
    v = rng.standard_normal((250, 300)).astype("<f4")
    state = collections.OrderedDict(
        w=Tensor(Storage("0", w.size), w.shape),
        v=Tensor(Storage("1", v.size), v.shape))
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(state)
    # Gone again, lest another writer take them for torch.
    del sys.modules["torch"], sys.modules["torch._utils"]
    with zipfile.ZipFile(os.path.join(out, "model.pt"), "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", w.tobytes())
        z.writestr(zipfile.ZipInfo("archive/data/1"), v.tobytes(),
                   compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("archive/version", "3\n")


def write_onnx(out):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    raw = rng.standard_normal((300, 300)).astype("<f4")
    typed = rng.standard_normal((100, 100)).astype("<f4")
    inits = [numpy_helper.from_array(raw, name="raw"),
             helper.make_tensor("typed", TensorProto.FLOAT, list(typed.shape),
                                typed.ravel().tolist())]
    graph = helper.make_graph([], "g", [], [], initializer=inits)
    onnx.save(helper.make_model(graph), os.path.join(out, "model.onnx"))


def gguf_file(path, tensors, kv, split=None):
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    for k, (typ, v) in kv.items():
        getattr(w, "add_" + typ)(k, v)
    if split:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
        w.add_int32("split.tensors.count", split[2])
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(out):
    a = arrays(4)
    kv = {"tokenizer.ggml.tokens": ("array", [f"token{i}" for i in range(50000)]),
          "test.u32": ("uint32", 7)}
    gguf_file(os.path.join(out, "model.gguf"), a, kv)
    d = os.path.join(out, "split")
    os.makedirs(d, exist_ok=True)
    names = sorted(a)
    for i, name in enumerate(names):
        gguf_file(os.path.join(d, f"m-{i + 1:05d}-of-{len(names):05d}.gguf"),
                  {name: a[name]}, kv if i == 0 else {},
                  split=(i, len(names), len(names)))


def write_hf(out):
    from safetensors.numpy import save_file
    a = arrays(5)
    d = os.path.join(out, "hf")
    os.makedirs(d, exist_ok=True)
    weight_map = {}
    for i, name in enumerate(sorted(a)):
        f = f"model-{i + 1:05d}-of-00004.safetensors"
        save_file({name: a[name]}, os.path.join(d, f))
        weight_map[name] = f
    # Named by the index, never written: its tensor fails, the rest serve.
    weight_map["lost"] = "model-00004-of-00004.safetensors"
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, fh, indent=2)


def write_dt(out):
    import deathtensors as dt
    a = arrays(6)
    given = {k: ({"<f4": "F32", "<i8": "I64", "<i4": "I32"}[v.dtype.str], list(v.shape),
                 v.tobytes()) for k, v in a.items()}
    d = os.path.join(out, "dt")
    os.makedirs(d, exist_ok=True)
    dt.save_sharded(os.path.join(d, "sharded.deathtensors"), given, max_shard_bytes=200_000)


def write_h5(out):
    import h5py
    rng = np.random.default_rng(7)
    with h5py.File(os.path.join(out, "model.h5"), "w") as f:
        f["x"] = np.arange(10, dtype="<f4")
        f["layers/0/weight"] = rng.standard_normal((256, 256)).astype("<f4")
        f.create_dataset("layers/0/packed", data=rng.integers(0, 9, (128, 300)).astype(">i2"),
                         chunks=(32, 100), compression="gzip", shuffle=True)


if __name__ == "__main__":
    out = sys.argv[1]
    for w in [write_npz, write_pt, write_onnx, write_gguf, write_hf, write_dt, write_h5]:
        w(out)
    print("OK")
