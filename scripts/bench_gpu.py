#!/usr/bin/env python3
"""GPU load through the mount: `safetensors.torch.load_file(PATH,
device="cuda")` of a float16 model, from the file itself and through the
mount's `.safetensors/model.safetensors` view of that file and of the same
tensors packed with `pack --zstd`. Prints one table (medians of --runs
samples, each with its ratio to the load from the file) and checks that
every load gave the file's tensors, bit for bit.

It builds nothing: BIN is an already-built ztensor-mount. It needs root
(FUSE passthrough) and /dev/fuse. Without torch or CUDA (a machine without a
GPU) it loads with safetensors.numpy instead, which checks the script, not
the GPU path.

    python3 scripts/bench_gpu.py --bin target/release/ztensor-mount \\
        --work /var/tmp/ztgpu --gib 3 --runs 5 [--cold] [--out results.md]
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

try:
    import torch
    import safetensors.torch as st_torch

    CUDA = torch.cuda.is_available()
except ImportError:
    torch = None
    CUDA = False
import safetensors.numpy as st_numpy


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


MOUNT_OPTS = []


def model_specs(gib):
    """A decoder-like float16 model of about gib GiB: per layer four square
    projections (4096 x 4096) and two norm vectors."""
    per_layer = 4 * 4096 * 4096 * 2
    layers = max(1, round(gib * 2**30 / per_layer))
    specs = []
    for i in range(layers):
        for p in ("q", "k", "v", "o"):
            specs.append((f"layers.{i}.attn.{p}.weight", (4096, 4096)))
        for n in ("in_norm", "post_norm"):
            specs.append((f"layers.{i}.{n}.weight", (4096,)))
    return specs


def make_model(work, gib, bin_):
    st = work / "model.safetensors"
    zt = work / "model_zstd.zt"
    if st.exists() and zt.exists():
        return st, zt
    rng = np.random.default_rng(7)
    tensors = {}
    for name, shape in model_specs(gib):
        tensors[name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
    log(f"writing {st} ({sum(t.nbytes for t in tensors.values()) / 2**30:.2f} GiB)")
    st_numpy.save_file(tensors, str(st))
    npy = work / "npy"
    npy.mkdir(exist_ok=True)
    args = []
    for i, (name, t) in enumerate(tensors.items()):
        p = npy / f"{i}.npy"
        np.save(p, t)
        args.append(f"{name}={p}")
    log(f"packing {zt} (pack --zstd, 1 MiB frames)")
    subprocess.run([bin_, "pack", zt, *args, "--zstd", "--force"], check=True)
    for p in npy.iterdir():
        p.unlink()
    npy.rmdir()
    return st, zt


class Mount:
    def __init__(self, bin_, src, mp, opts=()):
        self.bin, self.mp = bin_, mp
        mp.mkdir(parents=True, exist_ok=True)
        log_file = mp.parent / f"{mp.name}.log"
        subprocess.run([bin_, src, mp, "--log-file", log_file, *opts], check=True)
        self.view = mp / ".safetensors" / "model.safetensors"

    def close(self):
        for _ in range(100):
            if subprocess.run([self.bin, "-u", self.mp]).returncode == 0:
                return
            time.sleep(0.1)  # a reader still closing its file
        subprocess.run(["umount", "-l", self.mp])


@contextlib.contextmanager
def mounted(bin_, src, mp, opts=()):
    m = Mount(bin_, src, mp, (*opts, *MOUNT_OPTS))
    try:
        yield m
    finally:
        m.close()


STATS = ("fuse_opens", "passthrough_opens", "backing_files", "backing_bytes_now",
         "backing_filling", "decompressions", "bytes_served")


def stats(m):
    import json
    s = json.loads((m.mp / ".ztensor" / "stats").read_text())
    return {k: s.get(k) for k in STATS}


def settle(m, limit=60.0):
    """Seconds until the mount fills no backing file (at most limit)."""
    t0 = time.perf_counter()
    while stats(m)["backing_filling"] and time.perf_counter() - t0 < limit:
        time.sleep(0.05)
    return time.perf_counter() - t0


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def loader():
    if CUDA:
        def load(p):
            out = st_torch.load_file(str(p), device="cuda")
            torch.cuda.synchronize()
            return out
        return load, 'safetensors.torch.load_file(..., device="cuda")'
    return (lambda p: st_numpy.load_file(str(p))), "safetensors.numpy.load_file (no GPU here)"


def timed(load, path):
    t0 = time.perf_counter()
    out = load(path)
    return time.perf_counter() - t0, out


def same(a, b):
    if a.keys() != b.keys():
        return False
    if CUDA:
        return all(torch.equal(a[k], b[k]) for k in a)
    return all(np.array_equal(a[k], b[k]) for k in a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default="/var/tmp/ztgpu")
    ap.add_argument("--gib", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--mount-opt", action="append", default=[],
                    help="an option for every mount (repeatable), e.g. --mount-opt=--debug")
    ap.add_argument("--cold", action="store_true",
                    help="also load with the page cache dropped before each sample (root)")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    bin_ = str(Path(a.bin).resolve())
    MOUNT_OPTS.extend(a.mount_opt)
    st, zt = make_model(work, a.gib, bin_)
    load, what = loader()
    log(f"loader: {what}")
    if CUDA:
        log(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    # Warm: CUDA's context and allocator, and both files' page cache.
    for p in (st, zt):
        subprocess.run(["cat", p], stdout=subprocess.DEVNULL, check=True)
    _, ref = timed(load, st)
    rows = {k: [] for k in (
        "file", "view of the safetensors file", "same, --no-passthrough",
        "view of the pack --zstd file, first load (fresh mount)",
        "same, second load (same mount)",
        "same, third load, once no backing file is being filled")}
    cold = {k: [] for k in ("file, cold", "view of the safetensors file, cold",
                            "view of the pack --zstd file, cold (fresh mount)")}
    wrong = []
    for i in range(a.runs):
        if a.cold:  # the last run's cold loads dropped the page cache
            for p in (st, zt):
                subprocess.run(["cat", p], stdout=subprocess.DEVNULL, check=True)
        t, out = timed(load, st)
        rows["file"].append(t)
        del out
        for key, opts in (("view of the safetensors file", ()),
                          ("same, --no-passthrough", ("--no-passthrough",))):
            with mounted(bin_, st, work / f"mnt-st-{i}", opts) as m:
                t, out = timed(load, m.view)
                rows[key].append(t)
                if not same(ref, out):
                    wrong.append(key)
                del out
        with mounted(bin_, zt, work / f"mnt-zt-{i}") as m:
            for key in ("view of the pack --zstd file, first load (fresh mount)",
                        "same, second load (same mount)",
                        "same, third load, once no backing file is being filled"):
                if key.startswith("same, third"):
                    waited = settle(m)
                    log(f"fills done {waited:.2f} s after the second load")
                t, out = timed(load, m.view)
                rows[key].append(t)
                if not same(ref, out):
                    wrong.append(key)
                del out
                log(f"{key}: {t:.3f} s; stats {stats(m)}")
        if a.cold:
            for key, src in zip(cold, (None, st, zt)):
                drop_caches()
                if src is None:
                    t, out = timed(load, st)
                else:
                    with mounted(bin_, src, work / f"mnt-cold-{i}") as m:
                        drop_caches()
                        t, out = timed(load, m.view)
                cold[key].append(t)
                if not same(ref, out):
                    wrong.append(key)
                del out
        log(f"run {i + 1}/{a.runs}: " + ", ".join(
            f"{v[-1]:.3f}" for v in (*rows.values(), *cold.values()) if v))
    size = st.stat().st_size
    lines = [f"`{what}` of a {size / 2**30:.2f} GiB float16 model "
             f"({len(ref)} tensors), page cache hot, median of {a.runs}",
             "(cold rows: the page cache dropped before each, against the file cold)",
             "", "| load | s | GB/s | vs the file |", "|---|---|---|---|"]
    for table in (rows, cold):
        if not all(table.values()):
            continue
        base = statistics.median(next(iter(table.values())))
        for key, ts in table.items():
            m = statistics.median(ts)
            lines.append(f"| {key} | {m:.3f} | {size / m / 1e9:.2f} | {base / m:.2f}x |")
    lines.append("")
    lines.append("bytes: " + ("all loads equal the file's tensors" if not wrong
                              else "WRONG in " + ", ".join(sorted(set(wrong)))))
    text = "\n".join(lines)
    print(text, flush=True)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
