"""Writes deathtensors files with the real writer (deathtensors==0.3.0)
and, for each, what it was given.

Usage: write_deathtensors.py OUT_DIR

Writes into OUT_DIR: plain, zstd, checksum, zstd_checksum (one file each,
`<name>.deathtensors`) and a sharded model (`sharded.deathtensors`, the
index, and its shards beside it), plus `expected.json`:
{"files": {name: {"path", "global_metadata", "tensors": [{name, dtype,
shape, metadata, data_hex}]}}}. Tensors are given to the writer as
(dtype, shape, bytes) tuples, which its API takes for every one of its 15
dtypes without torch or numpy.
"""
import json
import os
import random
import sys

import deathtensors as dt

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2,
         "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
         "F64": 8, "C64": 8, "C128": 16}


def tensors(seed):
    rng = random.Random(seed)
    out = {}
    shapes = [[3], [2, 3], [5], [1, 7], [4, 1, 2]]
    for i, name in enumerate(SIZES):
        shape = shapes[i % len(shapes)]
        n = 1
        for d in shape:
            n *= d
        if name == "BOOL":
            data = bytes(rng.randrange(2) for _ in range(n))
        else:
            data = bytes(rng.randrange(256) for _ in range(n * SIZES[name]))
        out["t_" + name.lower()] = (name, shape, data)
    # A scalar, an empty tensor and a larger one (several zstd blocks).
    out["scalar"] = ("F64", [], rng.randbytes(8))
    out["empty"] = ("F32", [0, 4], b"")
    big = bytes(rng.randrange(4) for _ in range(300_000))
    out["big.weight"] = ("U16", [150_000], big)
    return out


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    given = tensors(7)
    metadata = {"t_f32": {"layer": "fc1", "init": "kaiming"},
                "big.weight": {"note": "ünïcode"}}
    gmd = {"model": "interop", "license": "MIT"}
    files = {}
    for name, compress, checksum in [("plain", False, False),
                                     ("zstd", True, False),
                                     ("checksum", False, True),
                                     ("zstd_checksum", True, True)]:
        path = os.path.join(out, name + ".deathtensors")
        dt.save(path, given, metadata=metadata, global_metadata=gmd,
                checksum=checksum, compress=compress)
        files[name] = path
    sharded = os.path.join(out, "sharded.deathtensors")
    shards = dt.save_sharded(sharded, given, max_shard_bytes=200,
                             metadata=metadata, global_metadata=gmd)
    files["sharded"] = sharded
    # The writer's own reader agrees with what it was given.
    with dt.open(files["zstd_checksum"], verify=True) as f:
        for k, (_, _, data) in given.items():
            assert f.get_bytes(k) == data, k
    expected = {"shards": [os.path.basename(s) for s in shards], "files": {}}
    for name, path in files.items():
        expected["files"][name] = {
            "path": path,
            "global_metadata": gmd,
            "tensors": [{"name": k, "dtype": d, "shape": s,
                         "metadata": metadata.get(k, {}), "data_hex": b.hex()}
                        for k, (d, s, b) in given.items()],
        }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
