"""Writes HDF5 files with h5py for tests/format_hdf5.rs.

Usage: write_hdf5.py DIR. Writes DIR/default.h5 (h5py's default libver:
superblock v0, symbol-table groups, version 1 object headers) and
DIR/latest.h5 (libver="latest": superblock v3, link messages, version 2
object headers, fixed-array chunk indexes), the same datasets in each, and
DIR/expected.json: file -> tensor path -> {sha256 of the array's
little-endian C-order bytes, numpy dtype (little-endian), shape, the HDF5
layout, hex of the bytes when small}; and the attributes written.
"""
import hashlib
import json
import os
import sys
import zlib

import h5py
import numpy as np

NUMERIC = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8"]


def arrays():
    """(path, array, create_dataset options) for every dataset written."""
    rng = np.random.default_rng(16)
    out = []
    for order, grp in (("<", "le"), (">", "be")):
        for code in NUMERIC:
            dt = np.dtype(order + code)
            if dt.kind == "f":
                a = rng.standard_normal((3, 4)).astype(dt)
            else:
                info = np.iinfo(dt)
                a = rng.integers(info.min, info.max, size=(3, 4), dtype=dt.newbyteorder("="), endpoint=True).astype(dt)
            out.append((f"{grp}/{code}", a, {}))
    out.append(("bool", rng.integers(0, 2, size=(7,)).astype(bool), {}))
    out.append(("scalar", np.array(-1.25, dtype="<f8"), {}))
    out.append(("empty", np.zeros((0, 3), dtype="<f4"), {}))
    out.append(("a/b/c/deep", np.arange(6, dtype="<i4").reshape(2, 3), {}))
    out.append(("a/b/mid", np.arange(5, dtype="<u2"), {}))
    for i in range(12):
        out.append((f"many/d{i:02}", np.full((i + 1,), i, dtype="<i2"), {}))
    big = np.arange(10000, dtype="<f4").reshape(100, 100)
    out.append(("layout/contiguous", big, {}))
    out.append(("layout/compact", np.arange(20, dtype="<i8"), {"layout": "compact"}))
    out.append(("layout/chunked", big + 1, {"chunks": (30, 40)}))
    out.append(("layout/chunked_rows", big + 2, {"chunks": (10, 100)}))
    out.append(("layout/gzip", big * 2, {"chunks": (16, 16), "compression": "gzip"}))
    out.append(("layout/gzip_shuffle", (big * 3).astype(">i4"),
                {"chunks": (17, 23), "compression": "gzip", "compression_opts": 9, "shuffle": True}))
    out.append(("layout/ragged", np.arange(7 * 11 * 5, dtype="<f8").reshape(7, 11, 5),
                {"chunks": (3, 4, 2)}))
    out.append(("layout/single_chunk", np.arange(12, dtype="<u4").reshape(3, 4),
                {"chunks": (3, 4), "compression": "gzip"}))
    out.append(("layout/bool_gzip", (np.arange(999) % 3 == 0), {"chunks": (100,), "compression": "gzip"}))
    out.append(("layout/unwritten", None, {"shape": (4, 5), "dtype": "<f4"}))
    # Resizable: an extensible array index under libver="latest" (300
    # chunks reach its super blocks), a v1 B-tree otherwise.
    out.append(("resizable/rows", np.arange(300 * 7, dtype="<f4").reshape(300, 7),
                {"chunks": (1, 7), "maxshape": (None, 7)}))
    out.append(("resizable/gzip", np.arange(50 * 5, dtype=">i8").reshape(50, 5),
                {"chunks": (4, 5), "maxshape": (None, 5), "compression": "gzip"}))
    out.append(("resizable/second_dim", np.arange(6 * 40, dtype="<u2").reshape(6, 40),
                {"chunks": (4, 8), "maxshape": (6, None)}))
    out.append(("resizable/bounded", np.arange(100, dtype="<i4").reshape(10, 10),
                {"chunks": (3, 4), "maxshape": (20, 30)}))
    out.append(("resizable/grown", "grown", {}))
    out.append(("layout/unwritten_chunked", None, {"shape": (40, 50), "dtype": "<i2", "chunks": (8, 8)}))
    return out


def entry(a, layout):
    le = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
    raw = np.ascontiguousarray(le).tobytes()
    e = {
        "sha256": hashlib.sha256(raw).hexdigest(),
        "numpy_dtype": le.dtype.str,
        "shape": list(a.shape),
        "layout": layout,
    }
    if len(raw) <= 256:
        e["hex"] = raw.hex()
    return e


def write(path, libver):
    exp = {}
    with h5py.File(path, "w", libver=libver) as f:
        f.attrs["title"] = "ztensor-mount test"
        f.attrs["version"] = np.int32(3)
        f.attrs["scale"] = 0.5
        f.attrs["sizes"] = np.array([1, 2, 3], dtype="<i8")
        for name, a, opts in arrays():
            if opts.get("layout") == "compact":
                # h5py's high-level API has no compact layout: the low-level one.
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_layout(h5py.h5d.COMPACT)
                space = h5py.h5s.create_simple(a.shape)
                tid = h5py.h5t.py_create(a.dtype)
                f.require_group(os.path.dirname(name))
                dsid = h5py.h5d.create(f.id, name.encode(), tid, space, dcpl=dcpl)
                dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, a)
                d = f[name]
            elif isinstance(a, str) and a == "grown":
                # Grown after it was written, partly written again: the
                # chunks between were never written (zeros).
                first = np.arange(30, dtype="<i2").reshape(10, 3)
                d = f.create_dataset(name, data=first, chunks=(4, 3), maxshape=(None, 3))
                d.resize((25, 3))
                d[20:25] = np.full((5, 3), 7, dtype="<i2")
                a = np.zeros((25, 3), dtype="<i2")
                a[:10] = first
                a[20:] = 7
            elif a is None:
                d = f.create_dataset(name, **opts)
                a = np.zeros(opts["shape"], dtype=opts["dtype"])
            else:
                d = f.create_dataset(name, data=a, **opts)
            layout = d.id.get_create_plist().get_layout()
            layout = {h5py.h5d.COMPACT: "compact", h5py.h5d.CONTIGUOUS: "contiguous",
                      h5py.h5d.CHUNKED: "chunked"}[layout]
            exp[name] = entry(a, layout)
        f["layout/contiguous"].attrs["units"] = "m/s"
        f["layout/contiguous"].attrs["count"] = np.uint16(7)
        # Byte strings that are not UTF-8 (one with a NUL inside).
        f["layout/contiguous"].attrs["bytes"] = np.bytes_(b"\xff\x00a")
        f["layout/contiguous"].attrs["latin"] = np.bytes_(b"caf\xe9")
        # Links not followed (no tensor each): soft links, in the root and
        # in a group (symbol-table entries of cache type 2 under the
        # default libver), and an external link.
        f["soft_link"] = h5py.SoftLink("/layout/contiguous")
        f["layout/soft_link"] = h5py.SoftLink("/layout/contiguous")
        f["external_link"] = h5py.ExternalLink("other.h5", "/y")
    return exp


def hostile(out):
    """Small files the hostile tests forge further (tests/format_hdf5.rs)."""
    os.makedirs(out, exist_ok=True)
    with h5py.File(os.path.join(out, "contig.h5"), "w") as f:
        f["x"] = np.arange(100 * 100, dtype="<f4").reshape(100, 100)
        f["ok"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "chunked.h5"), "w") as f:
        f.create_dataset("x", data=np.arange(64 * 64, dtype="<i4").reshape(64, 64),
                         chunks=(32, 32), compression="gzip", shuffle=True)
        f["ok"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "plain_chunks.h5"), "w") as f:
        f.create_dataset("x", data=np.arange(64 * 64, dtype="<i4").reshape(64, 64), chunks=(32, 32))
        f["ok"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "bool.h5"), "w") as f:
        f["b"] = np.array([True, False, True, True])
        f["ok"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "bomb.h5"), "w") as f:
        d = f.create_dataset("bomb", shape=(64, 64), dtype="<f4", chunks=(64, 64), compression="gzip")
        # 64 MiB of zeros in a chunk that holds 16 KiB.
        d.id.write_direct_chunk((0, 0), zlib.compress(bytes(64 << 20), 9), 0)
        g = f.create_dataset("garbage", shape=(8, 8), dtype="<f4", chunks=(8, 8), compression="gzip")
        g.id.write_direct_chunk((0, 0), b"\x78\x9c" + bytes(range(200)), 0)
        s = f.create_dataset("short", shape=(8, 8), dtype="<f4", chunks=(8, 8), compression="gzip")
        s.id.write_direct_chunk((0, 0), zlib.compress(bytes(100)), 0)
        f["ok"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "cycle.h5"), "w") as f:
        f["a/x"] = np.arange(3, dtype="<i4")
        f["a/loop"] = f["a"]  # a hard link to its own parent
        f["ok"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "cycle_latest.h5"), "w", libver="latest") as f:
        f["a/x"] = np.arange(3, dtype="<i4")
        f["a/loop"] = f["a"]
        f["ok"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "latest.h5"), "w", libver="latest") as f:
        f.create_dataset("x", data=np.arange(64 * 64, dtype="<i4").reshape(64, 64),
                         chunks=(16, 16), compression="gzip")
        f["named_link"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "resizable.h5"), "w", libver="latest") as f:
        f.create_dataset("x", data=np.arange(300 * 7, dtype="<f4").reshape(300, 7),
                         chunks=(1, 7), maxshape=(None, 7))
        f["ok"] = np.arange(6, dtype="<i2")
    with h5py.File(os.path.join(out, "deep.h5"), "w") as f:
        f["/".join(["g"] * 70) + "/x"] = np.arange(3, dtype="<i4")
    with h5py.File(os.path.join(out, "dag.h5"), "w") as f:
        # g0 -> g1 -> ... -> g24, two links each time: 2^24 paths to "x".
        groups = [f.create_group(f"g{i}") for i in range(25)]
        groups[-1]["x"] = np.arange(3, dtype="<i4")
        for a, b in zip(groups, groups[1:]):
            a["l"] = b
            a["r"] = b
    with h5py.File(os.path.join(out, "shared.h5"), "w") as f:
        f["x"] = np.arange(5, dtype="<i4")
        for i in range(50):
            f[f"alias/{i}"] = f["x"]
    with h5py.File(os.path.join(out, "dots.h5"), "w") as f:
        # ".." is a name like any to HDF5 ("." is the group itself).
        f.create_dataset("..", data=np.arange(3, dtype="<i4") + 10)
        f.create_group("x").create_dataset("..", data=np.arange(3, dtype="<i4") + 20)
    with h5py.File(os.path.join(out, "strings.h5"), "w") as f:
        f["s"] = np.array([b"abc", b"de"], dtype="S3")
        f["c"] = np.array([1 + 2j], dtype="<c8")
        f["ok"] = np.arange(6, dtype="<i2")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    expected = {
        "default.h5": write(os.path.join(out, "default.h5"), "earliest"),
        "latest.h5": write(os.path.join(out, "latest.h5"), "latest"),
    }
    hostile(os.path.join(out, "hostile"))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
