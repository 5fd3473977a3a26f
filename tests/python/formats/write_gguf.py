"""Writes GGUF files with gguf-py's GGUFWriter: float and integer tensors,
Q8_0 and Q4_0 tensors quantized with gguf.quants, metadata of every kind
(a large token array included), and a split set as llama.cpp's gguf-split
names it."""
import hashlib
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

import common


def write_file(path, tensors, kv, split=None, endian=gguf.GGUFEndian.LITTLE):
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    for k, (typ, v) in kv.items():
        getattr(w, "add_" + typ)(k, v)
    if split:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
        w.add_int32("split.tensors.count", split[2])
    for name, (arr, qtype) in tensors.items():
        if qtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write(out):
    rng = np.random.default_rng(3)
    arrs = common.arrays()
    tensors, exp = {}, {}
    for k in ["f32", "f16", "i8", "i16", "i32", "f64", "i64"]:
        tensors[k] = (arrs[k], None)
        exp[k] = common.entry(arrs[k])
    bf = rng.standard_normal((4, 8)).astype("<f4")
    bfq = quants.quantize(bf, Q.BF16)
    tensors["bf16"] = (bfq, Q.BF16)
    exp["bf16"] = dict(common.entry(bfq), dtype="bfloat16", shape=[4, 8])
    for qt in [Q.Q8_0, Q.Q4_0]:
        w = rng.standard_normal((4, 64)).astype("<f4")
        q = quants.quantize(w, qt)
        name = "w_" + qt.name.lower()
        tensors[name] = (q, qt)
        exp[name] = {
            "sha256": hashlib.sha256(q.tobytes()).hexdigest(),
            "dtype": "uint8",
            "shape": [q.size],
            "logical_shape": [4, 64],
            "ggml_type": qt.name,
        }
    tokens = [f"tok{i}" for i in range(50000)]
    kv = {
        "test.u32": ("uint32", 7),
        "test.i32": ("int32", -7),
        "test.f32": ("float32", 0.5),
        "test.bool": ("bool", True),
        "test.str": ("string", "hello"),
        "test.arr": ("array", [1, 2, 3]),
        "tokenizer.ggml.tokens": ("array", tokens),
    }
    write_file(os.path.join(out, "model.gguf"), tensors, kv)
    # A split set of three files.
    names = sorted(tensors)
    groups = [names[0::3], names[1::3], names[2::3]]
    d = os.path.join(out, "split")
    os.makedirs(d, exist_ok=True)
    for i, g in enumerate(groups):
        write_file(
            os.path.join(d, f"m-{i + 1:05d}-of-{len(groups):05d}.gguf"),
            {k: tensors[k] for k in g},
            kv if i == 0 else {},
            split=(i, len(groups), len(names)),
        )
    # A big-endian file, as gguf-py writes one on request (not read).
    big = {"f32": (np.arange(6, dtype=np.float32), None)}
    write_file(os.path.join(out, "big_endian.gguf"), big, {}, endian=gguf.GGUFEndian.BIG)
    return {"model.gguf": exp, "split": exp}


if __name__ == "__main__":
    common.main(write)
