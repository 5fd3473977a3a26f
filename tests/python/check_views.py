"""Reads every view of a mounted model with the library it is made for and
compares it with the tensor's own file (np.fromfile with the sidecar's
numpy_dtype and shape).

usage: check_views.py MOUNT EXPECT.json
EXPECT: {"npy": N, "zarr": N, "tensorstore": N, "safetensors": N, "xattr": N}
the least number of tensors each reader must have checked. Prints OK.
"""
import json
import os
import sys

import numpy as np

mount, expect = sys.argv[1], json.load(open(sys.argv[2]))
index = json.load(open(os.path.join(mount, ".ztensor/index.json")))
counts = {k: 0 for k in ("npy", "zarr", "tensorstore", "safetensors", "xattr")}


def raw(t):
    a = np.fromfile(os.path.join(mount, t["path"]), dtype=t["numpy_dtype"])
    return a.reshape(t["shape"])


def same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    assert a.tobytes() == b.tobytes(), f"{what}: bytes differ"


# numpy holds at most 64 dimensions: a tensor of more is checked by the
# caller (it has no .npy or .zarr view).
dense = [
    t
    for t in index["tensors"]
    if t.get("supported") and "numpy_dtype" in t and len(t["shape"]) <= 64
]
for t in dense:
    views = t.get("views", {})
    want = raw(t)
    if "npy" in views:
        p = os.path.join(mount, views["npy"])
        a = np.load(p)
        m = np.load(p, mmap_mode="r")
        same(a.view(want.dtype) if a.dtype.kind == "V" else a, want, f"np.load {t['name']}")
        same(np.array(m).view(want.dtype) if m.dtype.kind == "V" else m, want, f"mmap {t['name']}")
        counts["npy"] += 1
    if "zarr" in views and t["dtype"] not in ("bfloat16",) and not t["dtype"].startswith("float8"):
        import zarr

        z = zarr.open_array(os.path.join(mount, views["zarr"]), mode="r")
        got = z[...]
        same(got.view(want.dtype) if got.dtype != want.dtype else got, want, f"zarr {t['name']}")
        counts["zarr"] += 1
    if "zarr" in views:
        import tensorstore as ts

        # A kvstore by path, not a file:// URL, which would decode the
        # tree's %-escapes (views.md).
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.join(mount, views["zarr"]) + "/"}}
        got = ts.open(spec, read=True).result().read().result()
        assert got.tobytes() == want.tobytes(), f"tensorstore {t['name']}: bytes differ"
        assert list(got.shape) == list(want.shape), f"tensorstore {t['name']}: shape"
        counts["tensorstore"] += 1
    attrs = {k: os.getxattr(os.path.join(mount, t["path"]), k).decode() for k in os.listxattr(os.path.join(mount, t["path"]))}
    assert attrs.get("user.ztensor.numpy_dtype") == t["numpy_dtype"], attrs
    assert json.loads(attrs["user.ztensor.shape"]) == t["shape"], attrs
    assert attrs.get("user.ztensor.format") == index["format"], attrs
    counts["xattr"] += 1

st = os.path.join(mount, ".safetensors/model.safetensors")
if os.path.exists(st):
    from safetensors import safe_open

    by_name = {t["name"]: t for t in dense}
    with safe_open(st, "np") as f:
        keys = list(f.keys())
        for k in keys:
            got, want = f.get_tensor(k), raw(by_name[k])
            assert got.tobytes() == want.tobytes(), f"safetensors {k}: bytes differ"
            assert list(got.shape) == list(want.shape), f"safetensors {k}: shape"
            counts["safetensors"] += 1
    from safetensors.numpy import load_file

    assert set(load_file(st)) == set(keys)

if os.path.isdir(os.path.join(mount, ".zarr")):
    import zarr

    g = zarr.open_group(os.path.join(mount, ".zarr"), mode="r")
    # Listing loads every member, and zarr-python has no bfloat16 or float8.
    lacking = [t for t in dense if t["dtype"] == "bfloat16" or t["dtype"].startswith("float8")]
    if not lacking:
        assert len(list(g.keys())) > 0, "the zarr group lists nothing"

for k, n in expect.items():
    assert counts[k] >= n, f"{k}: checked {counts[k]} tensors, expected at least {n}: {counts}"
print(json.dumps(counts))
print("OK")
