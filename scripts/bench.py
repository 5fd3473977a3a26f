#!/usr/bin/env python3
"""ztensor-mount benchmark: builds realistic .zt files, warms the page cache,
measures the mount side by side with the same bytes read without it, and
prints one table (medians of --runs samples, each with its ratio to its
baseline). Run through scripts/bench.sh, which builds and installs what this
needs.

Conventions (see BENCHMARKS.md):
- "cold" = a fresh mount (the FUSE file's page cache is empty) while the
  backing .zt is hot in the page cache; only the mount's cache is dropped,
  by remounting, never the system's.
- sequential reads on both sides are `dd bs=1M iflag=skip_bytes,count_bytes
  of=/dev/null`, timed from process start to exit; the baseline reads the
  tensor's byte range of the .zt (offset and size from `info --json`).
- zstd baselines are `zstd -d -c -q BLOB > /dev/null` of the tensor's blob
  (the same bytes, extracted once to a file kept hot).
- sections v2, formats and model read files written by the formats' own
  writers (scripts/bench_writers.py: ztensor 2.x from .venv/ztensor/2,
  safetensors.numpy.save_file, gguf.GGUFWriter) besides our `pack`; a
  missing writer fails the run. views reads .npy/, .zarr/ and .safetensors/
  against the tensor's own file, each through a fresh mount.
- remote: raw.zt's tensor mounted as http://127.0.0.1:PORT/raw.zt from the
  tests' Range server (4 MiB blocks); its baselines are curl fetching the
  same blocks 4 at a time (to /dev/null, and into files on this disk, as
  the mount keeps them), curl of the same 4 KiB, and dd of the .zt with
  its pages evicted (the second read comes from the cache file on disk);
  the .safetensors view of a remote safetensors file read after a remount
  is against dd of a copy curl downloaded when the cache was filled.
- hub: the same tensor mounted as hf://bench/raw/raw.zt from the tests'
  stand-in Hub (tests/python/fake_hub.py: the API, resolve's 302 to a
  signed URL on a second host name, Range there); baselines are curl of the
  same blocks from that signed URL, 4 at a time, on loopback and with each
  data request answered 20 ms late; and two mounts of it with one cache
  dir read at once, against one mount alone, with the bytes the stand-in
  sent over the object's size.
- model: the whole model read by 4 reader threads taking the next tensor in
  turn (one preadv of the whole tensor each), against the same threads
  reading the file's ranges directly (raw) or running `zstd -d` of each
  blob (compressed).
- reflink: the v2 raw model on a new XFS (reflink) in an image file under
  the work dir, loop-mounted with direct I/O, and --cache-dir on it, so
  that raw tensors can be backed by clones of their ranges; the same
  readers on that file are the baseline, hot and with its pages dropped.
"""

import argparse
import concurrent.futures
import contextlib
import ctypes
import http.client
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# The binaries cargo built: under CARGO_TARGET_DIR when it is set, as cargo
# itself puts them there.
TARGET = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
BIN = TARGET / "release/ztensor-mount"
MANY_BIN = TARGET / "release/examples/bench_many"
MiB = 1 << 20
GiB = 1 << 30
FORMAT_VERSION = 1  # bump when the generated files change

SIZES = {
    # raw float32 tensor; zstd float32 and bfloat16 tensors; the big
    # multi-frame zstd tensor (time to first byte, 8 readers); small tensors.
    "full": dict(raw=1 * GiB, z=256 * MiB, bf16=256 * MiB, big=1 * GiB,
                 many=100_000, random_reads=20_000, rss_cache="256M",
                 pt_n=16, pt_tensor=64 * MiB),
    "quick": dict(raw=64 * MiB, z=32 * MiB, bf16=32 * MiB, big=128 * MiB,
                  many=5_000, random_reads=2_000, rss_cache="32M",
                  pt_n=4, pt_tensor=8 * MiB),
}
# The files of the v2, formats and model sections, made by the formats' own
# writers (scripts/bench_writers.py): the v2 tensor (raw and seekable zstd;
# the values of "big", which zstd_frames.zt holds too), the safetensors and
# GGUF tensor, and the whole model (model_n float32 tensors from model_min
# to model_max bytes, model bytes in all).
MORE_SIZES = {
    "full": dict(v2=SIZES["full"]["big"], fmt=1 * GiB, model=2 * GiB, model_n=300,
                 model_min=64 << 10, model_max=64 * MiB, model_readers=4, frame=256 * MiB),
    "quick": dict(v2=SIZES["quick"]["big"], fmt=64 * MiB, model=128 * MiB, model_n=300,
                  model_min=16 << 10, model_max=4 * MiB, model_readers=4, frame=32 * MiB),
}
WRITERS = ROOT / "scripts/bench_writers.py"


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], **kw)
    if r.returncode != 0:
        err = r.stderr if isinstance(r.stderr, str) else ""
        raise BenchError(f"{' '.join(map(str, cmd))} exited {r.returncode}: {err.strip()}")
    return r


def median(xs):
    return statistics.median(xs)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PAGE = os.sysconf("SC_PAGESIZE")


@contextlib.contextmanager
def mapped(path, off, n):
    """A read-only shared mapping of the pages holding [off, off+n) of
    path: (address, length)."""
    start = off // PAGE * PAGE
    length = off + n - start
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, length, 1, 1, fd, start)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise BenchError(f"mmap of {path}: errno {ctypes.get_errno()}")
        try:
            yield addr, length
        finally:
            _libc.munmap(addr, length)
    finally:
        os.close(fd)


def resident_fraction(path, off, n):
    """Share of the pages of [off, off+n) of path in the page cache (mincore)."""
    if off + n - off // PAGE * PAGE <= 0:
        return 1.0
    with mapped(path, off, n) as (addr, length):
        vec = (ctypes.c_ubyte * ((length + PAGE - 1) // PAGE))()
        if _libc.mincore(addr, length, vec) != 0:
            raise BenchError(f"mincore of {path}: errno {ctypes.get_errno()}")
        return float((np.frombuffer(vec, np.uint8) & 1).mean())


def large_folio_share(path, off, n):
    """Share of the cached pages of [off, off+n) of path that are part of a
    large folio (/proc/kpageflags: compound head or tail), or None when
    /proc/self/pagemap gives no frame numbers (not root)."""
    with mapped(path, off, n) as (addr, length):
        pages = length // PAGE
        view = (ctypes.c_ubyte * length).from_address(addr)
        for i in range(0, length, PAGE):
            view[i]  # map every page (they are cached already)
        try:
            pm = open("/proc/self/pagemap", "rb")
            kf = open("/proc/kpageflags", "rb")
        except OSError:
            return None
        with pm, kf:
            pm.seek(addr // PAGE * 8)
            entries = np.frombuffer(pm.read(pages * 8), np.uint64)
            pfns = entries & np.uint64((1 << 55) - 1)
            if not pfns.any():
                return None
            large = 0
            for pfn in pfns:
                kf.seek(int(pfn) * 8)
                flags = int.from_bytes(kf.read(8), "little")
                large += bool(flags & ((1 << 15) | (1 << 16)))
            return large / pages


def drop_inodes():
    """Drops the kernel's unused dentries and inodes (not the page cache's
    data): True when done, False without the right to."""
    try:
        run(["sync"])
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("2")
        return True
    except OSError:
        return False


class Hot:
    """Makes byte ranges of the backing files hot right before a timed sample.

    This VM reclaims page cache it sees idle for a few seconds (DAMON
    "pageout" scheme, /sys/kernel/mm/damon/admin), so one warm-up at the start
    is not enough: every sample first reads its range and checks with mincore
    that all of it is resident."""

    def __init__(self):
        self.min_seen = 1.0
        self.rewarms = 0

    def __call__(self, path, off=0, n=None):
        if n is None:
            n = os.path.getsize(path) - off
        buf = bytearray(4 * MiB)
        for attempt in range(5):
            with open(path, "rb", buffering=0) as fh:
                fh.seek(off)
                left = n
                while left > 0:
                    got = fh.readinto(memoryview(buf)[:min(left, len(buf))])
                    if not got:
                        break
                    left -= got
            frac = resident_fraction(path, off, n)
            self.min_seen = min(self.min_seen, frac)
            if frac >= 0.999:
                return
            self.rewarms += 1
        log(f"WARNING: only {frac:.1%} of {path} [{off}, +{n}) stays in the page cache")


# ---------------------------------------------------------------- files


def write_normal_npy(path, nelem, seed, sigma=0.02, as_bf16=False):
    """float32 N(0, sigma) weights (or their top 16 bits as uint16 for
    bfloat16), written chunk by chunk so memory stays small."""
    rng = np.random.default_rng(seed)
    dtype = "<u2" if as_bf16 else "<f4"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(nelem,))
    chunk = 16 * MiB
    for start in range(0, nelem, chunk):
        n = min(chunk, nelem - start)
        x = rng.standard_normal(n, dtype=np.float32)
        x *= np.float32(sigma)
        if as_bf16:
            out[start:start + n] = (x.view("<u4") >> 16).astype("<u2")
        else:
            out[start:start + n] = x
    out.flush()
    del out


class Files:
    """The benchmark's .zt files under WORK, reused when the manifest matches."""

    def __init__(self, work, sizes, regen, many_only=False):
        self.work = work
        self.sizes = sizes
        # Only the many section runs: only its file is made (the others
        # take minutes and gigabytes).
        self.many_only = many_only
        self.raw = work / "raw.zt"          # w: raw float32
        self.raw_crc = work / "raw_crc32c.zt"  # w: the same, with a crc32c checksum
        self.zframes = work / "zstd_frames.zt"  # f32, bf16, big: 1 MiB frames
        self.zsingle = work / "zstd_single.zt"  # f32, bf16: one frame each
        self.many = work / "many.zt"
        self.blobs = work / "blobs"
        # A many-only run records its one file apart, so that it does not
        # make the next full run think every file is stale.
        self.manifest = work / ("manifest-many.json" if many_only else "manifest.json")
        # Files follow the writer: regenerate them when its source changes.
        writer = {p: subprocess.run(["git", "-C", ROOT, "hash-object", p], capture_output=True,
                                    text=True).stdout.strip()
                  for p in ("src/format/writer.rs", "examples/bench_many.rs")}
        want = dict(sizes, version=FORMAT_VERSION, writer=writer)
        if many_only:
            want["many_only"] = True
        if not regen and self.manifest.exists():
            try:
                have = json.loads(self.manifest.read_text())
            except ValueError:
                have = None
            if have == want and all(p.exists() for p in self.all()):
                log(f"reusing files in {work}")
                self.load_info()
                return
        self.generate()
        self.manifest.write_text(json.dumps(want))
        self.load_info()

    def all(self):
        if self.many_only:
            return [self.many]
        return [self.raw, self.raw_crc, self.zframes, self.zsingle, self.many]

    def generate(self):
        s = self.sizes
        self.manifest.unlink(missing_ok=True)
        if self.many_only:
            log(f"writing {s['many']} small tensors with examples/bench_many")
            run([MANY_BIN, self.many, s["many"]], capture_output=True, text=True)
            return
        src = self.work / "src"
        src.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        log("generating float32 N(0, 0.02) weights and bfloat16 (top 16 bits)")
        big, z, bf = src / "big_f32.npy", src / "z_f32.npy", src / "bf16.npy"
        write_normal_npy(big, s["big"] // 4, seed=1)
        write_normal_npy(z, s["z"] // 4, seed=2)
        write_normal_npy(bf, s["bf16"] // 2, seed=3, as_bf16=True)
        raw_src = big if s["raw"] == s["big"] else src / "raw_f32.npy"
        if raw_src != big:
            write_normal_npy(raw_src, s["raw"] // 4, seed=1)
        log("packing raw.zt, raw_crc32c.zt, zstd_frames.zt, zstd_single.zt")
        # --force: files of an older writer (or sizes) are there to replace.
        run([BIN, "pack", self.raw, f"w={raw_src}", "--force"], capture_output=True, text=True)
        run([BIN, "pack", self.raw_crc, f"w={raw_src}", "--checksum", "crc32c", "--force"],
            capture_output=True, text=True)
        run([BIN, "pack", self.zframes, f"f32={z}", f"bf16={bf}:bfloat16", f"big={big}",
             "--zstd", "--force"], capture_output=True, text=True)
        run([BIN, "pack", self.zsingle, f"f32={z}", f"bf16={bf}:bfloat16", "--zstd",
             "--frame-size", "0", "--force"], capture_output=True, text=True)
        log(f"writing {s['many']} small tensors with examples/bench_many")
        run([MANY_BIN, self.many, s["many"]], capture_output=True, text=True)
        shutil.rmtree(src)
        log(f"files ready in {time.perf_counter() - t0:.1f} s")

    def load_info(self):
        self.info = {}
        if self.many_only:
            return
        for f in [self.raw, self.raw_crc, self.zframes, self.zsingle]:
            out = run([BIN, "info", f, "--json"], capture_output=True, text=True).stdout
            self.info[f] = {t["name"]: t for t in json.loads(out)}
        self.blobs.mkdir(exist_ok=True)
        # The zstd blobs as .zst files, for the `zstd -d` baseline.
        for f in [self.zframes, self.zsingle]:
            for name, t in self.info[f].items():
                out = self.blob(f, name)
                if out.exists() and out.stat().st_size == t["size"]:
                    continue
                with open(f, "rb") as src, open(out, "wb") as dst:
                    src.seek(t["offset"])
                    left = t["size"]
                    while left:
                        b = src.read(min(left, 16 * MiB))
                        dst.write(b)
                        left -= len(b)

    def blob(self, f, name):
        return self.blobs / f"{f.stem}-{name}.zst"

    def tensor(self, f, name):
        return self.info[f][name]

    def warm(self):
        """Reads every file once so the backing bytes are in the page cache."""
        blobs = sorted(self.blobs.iterdir()) if self.blobs.exists() else []
        paths = self.all() + blobs
        for p in paths:
            with open(p, "rb", buffering=0) as fh:
                buf = bytearray(4 * MiB)
                while fh.readinto(buf):
                    pass
        res = run(["fincore", "-b", "-n", "-o", "RES,SIZE", *paths],
                  capture_output=True, text=True).stdout.split()
        res = [int(x) for x in res]
        resident, size = sum(res[0::2]), sum(res[1::2])
        log(f"page cache warm: {resident / MiB:.0f} of {size / MiB:.0f} MiB resident")
        if resident < 0.99 * size:
            log("WARNING: backing files are not fully in the page cache")


def blob_range(t):
    """(offset, stored length) of a one-blob tensor's bytes in its file, from
    its `info --json` entry: `offset`/`size` (zTensor v0.1) or the one part's
    `blob` (the other formats)."""
    if "offset" in t and "size" in t:
        return t["offset"], t["size"]
    parts = t.get("parts") or {}
    if len(parts) != 1:
        raise BenchError(f"{t['name']}: expected one part, got {sorted(parts)}")
    (part,) = parts.values()
    off, n = part["blob"]
    return off, n


def model_sizes(n, total, lo, hi, seed=5):
    """n tensor sizes (bytes, multiples of 4 KiB) from lo to hi, spread
    log-uniformly and bent (x ** p) so that they add up to about total."""
    if not n * lo <= total <= n * hi:
        raise BenchError(f"model: {n} tensors of {lo}..{hi} bytes cannot add up to {total}")
    x = np.random.default_rng(seed).uniform(0, 1, n)
    x[0], x[1] = 1.0, 0.0  # the largest and the smallest are there

    def sizes(p):
        return lo * (hi / lo) ** (x ** p)

    a, b = 1e-3, 1e3  # sum(sizes(p)) falls as p grows
    for _ in range(100):
        mid = (a * b) ** 0.5
        if sizes(mid).sum() > total:
            a = mid
        else:
            b = mid
    return [int(v) // 4096 * 4096 for v in sizes(a)]


def model_names(n):
    projs = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
             "post_attention_layernorm", "mlp.router"]
    return [f"model.layers.{i // len(projs)}.{projs[i % len(projs)]}.weight"
            for i in range(n)]


class More:
    """The files of the v2, formats, views and model sections, made the first
    time a section needs them, by the formats' reference writers
    (scripts/bench_writers.py: ztensor 2.x, safetensors, gguf) and our
    `pack`; reused while their recipe is unchanged (made.json)."""

    def __init__(self, work, sizes, regen):
        self.work, self.sizes, self.regen = work, sizes, regen
        self.manifest = work / "made.json"
        self.blobs = work / "blobs-more"
        self.infos = {}
        self.built = set()  # keys made by this run (--regen makes each once)
        self._recipe = None

    @property
    def recipe(self):
        """What the files follow: our formats code (pack), the writer script
        and the reference packages' versions (missing ones fail here)."""
        if self._recipe is None:
            git = lambda *a: subprocess.run(["git", "-C", ROOT, *a], capture_output=True,
                                            text=True).stdout.strip()
            self._recipe = dict(version=FORMAT_VERSION,
                                formats=git("rev-parse", "HEAD:src/formats"),
                                writers=git("hash-object", WRITERS),
                                packages=self.package_versions())
        return self._recipe

    @staticmethod
    def zt2_path():
        """The folder of the ztensor 2.x package (put first on PYTHONPATH)."""
        d = Path(sys.prefix) / "ztensor" / "2"
        if not (d / "ztensor").is_dir():
            raise BenchError(f"ztensor 2.x is missing: no {d}/ztensor (scripts/setup.sh "
                             "installs it: pip install --target .venv/ztensor/2 'ztensor>=2,<3')")
        return d

    def package_versions(self):
        from importlib.metadata import PackageNotFoundError, version
        out = {}
        for pkg in ("safetensors", "gguf", "numpy"):
            try:
                out[pkg] = version(pkg)
            except PackageNotFoundError:
                raise BenchError(f"the {pkg} package is missing from {sys.prefix} "
                                 "(scripts/setup.sh installs it)")
        dist = sorted(self.zt2_path().glob("ztensor-*.dist-info"))
        out["ztensor2"] = dist[-1].name if dist else "?"
        return out

    def writer(self, fmt, out, specs):
        """Runs scripts/bench_writers.py FORMAT OUT NAME=NPY...; the ztensor
        2.x formats with .venv/ztensor/2 first on PYTHONPATH."""
        env = dict(os.environ)
        first = {"zt2": self.zt2_path(), "zt1": Path(sys.prefix) / "ztensor" / "1"}.get(fmt[:3])
        if first is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(first)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        run([sys.executable, WRITERS, fmt, out, *specs], capture_output=True, text=True,
            env=env)

    def made(self, key, paths, build, **params):
        """paths, built by build() unless made.json says they were made with
        the same recipe and params (and they all exist)."""
        want = dict(self.recipe, **params, paths=[str(p) for p in paths])
        try:
            have = json.loads(self.manifest.read_text())
        except (OSError, ValueError):
            have = {}
        if ((key in self.built or not self.regen) and have.get(key) == want
                and all(p.exists() for p in paths)):
            return paths
        have.pop(key, None)
        self.manifest.write_text(json.dumps(have))
        # Made anew: `pack` refuses to replace a file it did not just write.
        for p in paths:
            p.unlink(missing_ok=True)
        t0 = time.perf_counter()
        build()
        for p in paths:
            if not p.exists():
                raise BenchError(f"{key}: the writer made no {p}")
            self.infos.pop(p, None)
            for b in self.blobs.glob(f"{p.stem}-*.zst"):  # blobs of the old file
                b.unlink()
        self.built.add(key)
        have[key] = want
        self.manifest.write_text(json.dumps(have))
        log(f"{key}: files made in {time.perf_counter() - t0:.1f} s")
        return paths

    def info(self, path):
        if path not in self.infos:
            out = run([BIN, "info", path, "--json"], capture_output=True, text=True).stdout
            self.infos[path] = {t["name"]: t for t in json.loads(out)}
        return self.infos[path]

    def blob_file(self, path, name, where=None):
        """The stored bytes of tensor name of path (or the range where) as a
        file of its own (for `zstd -d`), extracted once."""
        t = self.info(path)[name]
        off, n = where or blob_range(t)
        self.blobs.mkdir(exist_ok=True)
        out = self.blobs / f"{path.stem}-{t['path'].replace('/', '_')}.zst"
        if out.exists() and out.stat().st_size == n:
            return out
        with open(path, "rb") as src, open(f"{out}.partial", "wb") as dst:
            src.seek(off)
            left = n
            while left:
                b = src.read(min(left, 16 * MiB))
                if not b:
                    raise BenchError(f"{path}: short blob {name}")
                dst.write(b)
                left -= len(b)
        os.replace(f"{out}.partial", out)
        return out

    def single(self):
        """The v2 tensor "w" raw and seekable zstd (ztensor 2.x), and the same
        float32 values as safetensors and GGUF files (one tensor "w")."""
        s = self.sizes
        paths = [self.work / "v2_raw.zt", self.work / "v2_zstd.zt",
                 self.work / "fmt.safetensors", self.work / "fmt.gguf"]

        def build():
            src = self.work / "src-more"
            src.mkdir(exist_ok=True)
            try:
                done = {}
                for label, nbytes in (("v2", s["v2"]), ("fmt", s["fmt"])):
                    if nbytes not in done:
                        done[nbytes] = src / f"w-{nbytes}.npy"
                        log(f"writing {nbytes / MiB:.0f} MiB of float32 N(0, 0.02) weights")
                        write_normal_npy(done[nbytes], nbytes // 4, seed=1)
                v2, fmt = f"w={done[s['v2']]}", f"w={done[s['fmt']]}"
                log("writing v2_raw.zt and v2_zstd.zt (ztensor 2.x), fmt.safetensors "
                    "(safetensors.numpy.save_file), fmt.gguf (gguf.GGUFWriter)")
                self.writer("zt2", paths[0], [v2])
                self.writer("zt2-zstd", paths[1], [v2])
                self.writer("safetensors", paths[2], [fmt])
                self.writer("gguf", paths[3], [fmt])
            finally:
                shutil.rmtree(src, ignore_errors=True)

        return self.made("single", paths, build, v2=s["v2"], fmt=s["fmt"])

    WRITER_FRAMES = {
        "pack --zstd --frame-size 0 (ours)": ("ours.zt", None),
        "ztensor 1.x (write_numpy compress=True)": ("zt1.zt", "zt1-zstd"),
        "deathtensors 0.3 (save compress=True, whole-blob stream)":
            ("dt.deathtensors", "dt-zstd"),
        "Python zstandard one-shot compress (in a deathtensors file)":
            ("dt_zstandard.deathtensors", "dt-zstandard"),
        "zstd CLI, zstd -3 FILE (in a deathtensors file)":
            ("dt_zstdcli.deathtensors", "dt-zstdcli"),
    }

    def frames(self):
        """One float32 tensor "w" (the same values in each) stored as a
        single zstd frame by each writer the mount reads. Returns
        ({label: path}, the values' .npy)."""
        s = self.sizes
        labels = {k: self.work / f"frame_{f}" for k, (f, _) in self.WRITER_FRAMES.items()}
        npy = self.work / f"frame-w-{s['frame']}.npy"

        def build():
            log(f"frames: writing {s['frame'] / MiB:.0f} MiB of float32 N(0, 0.02) weights")
            write_normal_npy(npy, s["frame"] // 4, seed=3)
            for label, (_, fmt) in self.WRITER_FRAMES.items():
                log(f"frames: {label}")
                if fmt is None:
                    run([BIN, "pack", labels[label], f"w={npy}", "--zstd", "--frame-size",
                         "0"], capture_output=True, text=True)
                else:
                    self.writer(fmt, labels[label], [f"w={npy}"])

        self.made("frames", [*labels.values(), npy], build, frame=s["frame"])
        return labels, npy

    def stream_range(self, path, name="w"):
        """(offset, stored length) of tensor name's bytes in path: for a
        compressed deathtensors file, its whole data blob (one stream)."""
        t = self.info(path)[name]
        if "components" in t:  # zTensor v1
            c = t["components"]["data"]
            return c["offset"], c["length"]
        if path.suffix == ".deathtensors":
            with open(path, "rb") as fh:
                head = fh.read(24)
            flags = int.from_bytes(head[12:16], "little")
            start = 24 + (int.from_bytes(head[16:24], "little") + 7) // 8 * 8
            if flags & 1:
                return start, path.stat().st_size - start - (32 if flags & 2 else 0)
            a, b = t["data_offsets"]
            return start + a, b - a
        return blob_range(t)

    FORMATS_MORE = {
        "zTensor v1 (ztensor 1.x write_numpy)": ("fmt_v1.zt", "zt1"),
        "deathtensors (deathtensors.save)": ("fmt.deathtensors", "dt"),
        "npz (numpy.savez)": ("fmt.npz", "npz"),
        "ONNX (onnx.save, one initializer)": ("fmt.onnx", "onnx"),
        "HDF5 (h5py, one contiguous dataset)": ("fmt.h5", "hdf5"),
        # torch.save itself where torch is installed; else its zip layout,
        # written by bench_writers.py (torch is too big for the venv).
        "PyTorch .pt (torch.save's zip layout)": ("fmt.pt", "pt"),
    }

    def formats_more(self):
        """Tensor "w" of single()'s safetensors and GGUF files (the same
        values) as zTensor v1, deathtensors, npz, ONNX, HDF5 and .pt files, by
        their own writers (.pt: see FORMATS_MORE). Returns {label: path}."""
        s = self.sizes
        labels = {k: self.work / f for k, (f, _) in self.FORMATS_MORE.items()}

        def build():
            npy = self.work / "fmt-w.npy"
            try:
                log(f"writing {s['fmt'] / MiB:.0f} MiB of float32 N(0, 0.02) weights")
                write_normal_npy(npy, s["fmt"] // 4, seed=1)
                for label, (_, fmt) in self.FORMATS_MORE.items():
                    log(f"formats: {label}")
                    self.writer(fmt, labels[label], [f"w={npy}"])
            finally:
                npy.unlink(missing_ok=True)

        self.made("formats_more", list(labels.values()), build, fmt=s["fmt"])
        return labels

    def model(self):
        """The whole model in five files: .zt v0.1 raw and zstd (our pack),
        v2 raw and seekable zstd (ztensor 2.x), safetensors. Returns
        {label: path}."""
        s = self.sizes
        labels = {
            "zt v0.1 raw (pack)": self.work / "model_v01_raw.zt",
            "zt v0.1 zstd (pack --zstd)": self.work / "model_v01_zstd.zt",
            "zt v2 raw (ztensor 2.x)": self.work / "model_v2_raw.zt",
            "zt v2 seekable zstd (ztensor 2.x)": self.work / "model_v2_zstd.zt",
            "safetensors (save_file)": self.work / "model.safetensors",
        }
        p = list(labels.values())
        sizes = model_sizes(s["model_n"], s["model"], s["model_min"], s["model_max"])
        names = model_names(len(sizes))

        def build():
            src = self.work / "src-model"
            src.mkdir(exist_ok=True)
            try:
                log(f"model: writing {len(sizes)} float32 tensors, "
                    f"{sum(sizes) / MiB:.0f} MiB ({min(sizes) >> 10} KiB .. "
                    f"{max(sizes) / MiB:.0f} MiB)")
                specs = []
                for i, (name, n) in enumerate(zip(names, sizes)):
                    f = src / f"{i:04d}.npy"
                    write_normal_npy(f, n // 4, seed=100 + i)
                    specs.append(f"{name}={f}")
                log("model: pack, pack --zstd, ztensor 2.x raw and zstd, safetensors")
                run([BIN, "pack", p[0], *specs], capture_output=True, text=True)
                run([BIN, "pack", p[1], *specs, "--zstd"], capture_output=True, text=True)
                self.writer("zt2", p[2], specs)
                self.writer("zt2-zstd", p[3], specs)
                self.writer("safetensors", p[4], specs)
            finally:
                shutil.rmtree(src, ignore_errors=True)

        self.made("model", p, build, model=s["model"], n=s["model_n"], lo=s["model_min"],
                  hi=s["model_max"])
        return labels


# ---------------------------------------------------------------- mounts


class Mount:
    def __init__(self, mp, pid, ready_s, logfile):
        self.mp, self.pid, self.ready_s, self.log = mp, pid, ready_s, logfile

    def stats(self):
        with open(self.mp / ".ztensor/stats") as f:
            return json.load(f)

    def status(self):
        """/proc/PID/status memory fields, in bytes."""
        out = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[k] = int(v.split()[0]) * 1024
        return out


class Mounter:
    def __init__(self, work):
        self.work = work
        self.seq = 0
        self.active = set()
        (work / "logs").mkdir(exist_ok=True)
        self.cleanup_stale()

    def mounts_under_work(self):
        with open("/proc/self/mounts") as f:
            mps = [line.split()[1] for line in f]
        prefix = str(self.work) + "/"
        return [m for m in mps if m.startswith(prefix)]

    def cleanup_stale(self):
        for mp in self.mounts_under_work():
            log(f"unmounting a stale mount {mp}")
            subprocess.run([BIN, "-u", mp])

    def find_pid(self, mp):
        pat = rf"^\S*ztensor-mount \S+ {re.escape(str(mp))}( |$)"
        for _ in range(50):
            r = subprocess.run(["pgrep", "-f", pat], capture_output=True, text=True, timeout=30)
            pids = [int(p) for p in r.stdout.split()]
            if len(pids) == 1:
                return pids[0]
            time.sleep(0.01)
        raise BenchError(f"cannot find the daemon of {mp}: pgrep found {r.stdout.split()}")

    @contextlib.contextmanager
    def mount(self, zt, opts=(), tag="m"):
        self.seq += 1
        mp = self.work / f"mnt-{tag}-{self.seq}"
        mp.mkdir(exist_ok=True)
        logfile = self.work / "logs" / f"{tag}-{self.seq}.log"
        cmd = [BIN, zt, mp, "--log-file", logfile, *opts]
        t0 = time.perf_counter()
        run(cmd, capture_output=True, text=True)
        self.active.add(mp)
        pid = None
        try:
            os.stat(mp)  # the first request: the mount answers
            ready = time.perf_counter() - t0
            pid = self.find_pid(mp)
            yield Mount(mp, pid, ready, logfile)
        finally:
            self.unmount(mp, pid)

    def unmount(self, mp, pid):
        for attempt in range(50):
            r = subprocess.run([BIN, "-u", mp], capture_output=True, text=True)
            if r.returncode == 0 or str(mp) not in self.mounts_under_work():
                break
            time.sleep(0.1)  # EBUSY: a reader is still closing
        else:
            log(f"WARNING: {mp} would not unmount; detaching it lazily")
            subprocess.run(["umount", "-l", mp])
        self.active.discard(mp)
        # Let the daemon finish before anything else runs: what it does as
        # it exits (a remote cache file synced before its bitmap is saved)
        # would otherwise share the disk with the next sample.
        if pid:
            t0 = time.perf_counter()
            while os.path.exists(f"/proc/{pid}") and time.perf_counter() - t0 < 60:
                time.sleep(0.01)
            took = time.perf_counter() - t0
            if os.path.exists(f"/proc/{pid}"):
                log(f"WARNING: daemon {pid} of {mp} still running 60 s after unmount")
            elif took > 3:
                log(f"daemon {pid} of {mp} exited {took:.1f} s after unmount")
        with contextlib.suppress(OSError):
            mp.rmdir()

    def unmount_all(self):
        for mp in list(self.active):
            self.unmount(mp, None)


# ---------------------------------------------------------------- measures


def dd(path, off, n, bs="1M"):
    """Seconds for dd to read [off, off+n) of path (process start to exit)."""
    t0 = time.perf_counter()
    run(["dd", f"if={path}", "of=/dev/null", f"bs={bs}", "iflag=skip_bytes,count_bytes",
         f"skip={off}", f"count={n}", "status=none"], capture_output=True, text=True)
    return time.perf_counter() - t0


def read_whole(path, off, buf):
    """Seconds to read len(buf) bytes at off into buf with as few read()
    calls as the kernel allows (one, normally): what np.fromfile and
    readinto do. buf is reused, so no fresh memory is timed."""
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        got = 0
        while got < len(buf):
            k = os.preadv(fd, [view[got:]], off + got)
            if k <= 0:
                raise BenchError(f"short read at {got} of {path}")
            got += k
        return time.perf_counter() - t0
    finally:
        os.close(fd)


MAX_PAGES = "/proc/sys/fs/fuse/max_pages_limit"


class MaxPages:
    """Raises fs.fuse.max_pages_limit for a block (4 MiB requests), and puts
    it back. None when it cannot (not root, old kernel)."""

    def __init__(self, pages):
        self.pages, self.old = pages, None

    def __enter__(self):
        try:
            with open(MAX_PAGES) as fh:
                self.old = fh.read().strip()
            with open(MAX_PAGES, "w") as fh:
                fh.write(str(self.pages))
            return self
        except OSError:
            self.old = None
            return None

    def __exit__(self, *exc):
        if self.old is not None:
            with open(MAX_PAGES, "w") as fh:
                fh.write(self.old)


def zstd_d(blob):
    t0 = time.perf_counter()
    run(["zstd", "-d", "-c", "-q", blob], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    return time.perf_counter() - t0


def zstd_d_at_once(blob, k):
    """Seconds for k `zstd -d` of blob started at once to all finish."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["zstd", "-d", "-c", "-q", blob], stdout=subprocess.DEVNULL)
             for _ in range(k)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise BenchError(f"zstd -d of {blob} exited {codes}")
    return time.perf_counter() - t0


def memmap_sum(path, offset, n):
    t0 = time.perf_counter()
    m = np.memmap(path, dtype="<f4", mode="r", offset=offset, shape=(n,))
    s = float(m.sum())
    dt = time.perf_counter() - t0
    m._mmap.close()
    del m
    return dt, s


@contextlib.contextmanager
def reflink_fs(work, size):
    """A new XFS with reflink, `size` bytes, in an image file under work,
    loop-mounted with direct I/O (a read of it is a read of the disk, not
    of the image's page cache); taken down after, whatever happens."""
    img, mp = work / "reflink.img", work / "reflink"
    img.unlink(missing_ok=True)
    with open(img, "wb") as f:
        f.truncate(size)
    try:
        run(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", img], capture_output=True, text=True)
        dev = run(["losetup", "--direct-io=on", "-f", "--show", img], capture_output=True,
                  text=True).stdout.strip()
        try:
            mp.mkdir(exist_ok=True)
            run(["mount", dev, mp], capture_output=True, text=True)
            try:
                yield mp
            finally:
                subprocess.run(["umount", mp])
        finally:
            subprocess.run(["losetup", "-d", dev])
    finally:
        img.unlink(missing_ok=True)


def timed(fn):
    """Seconds fn() takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def pread_loop(path, offsets, base=0):
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for off in offsets:
            if len(os.pread(fd, 4096, base + off)) != 4096:
                raise BenchError(f"short read at {off} of {path}")
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def fresh_memory(huge):
    """GB/s writing 1 GiB of newly allocated memory (np.ones), in small pages
    or (huge=True) transparent huge pages: after a 3 s pause, and at once
    after freeing the same amount. A VM with free page reporting hands memory
    freed for a few seconds back to the host, and touching it again is then
    slower (much slower in huge pages); every cold page-cache read (fresh
    page cache) and every new decode buffer pays that price."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _set_madvise_hugepage
    was = _set_madvise_hugepage(huge)

    def touch():
        t0 = time.perf_counter()
        a = np.ones(GiB // 4, np.float32)
        dt = time.perf_counter() - t0
        del a
        return GiB / dt / 1e9

    try:
        touch()
        time.sleep(3)
        returned = touch()
        reused = touch()
        return returned, reused
    finally:
        _set_madvise_hugepage(was)


def busy_processes():
    """Other heavy work on this shared machine (builds, tests, fuzzers)."""
    r = subprocess.run(["pgrep", "-f", "fuzz/target|fuzz/artifacts|cargo-fuzz|cargo test|"
                        "cargo build|cargo clippy|rustc"], capture_output=True, text=True,
                       timeout=30)
    return r.stdout.split()


def bdi_read_ahead_kb(mp):
    dev = os.stat(mp).st_dev
    p = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
    try:
        return int(p.read_text())
    except OSError:
        return None


# The latency of the second remote row: an object store's time to first
# byte is tens of milliseconds (S3: 10-30 ms).
REMOTE_LATENCY_MS = 20


@contextlib.contextmanager
def test_server(script, *args):
    """One of the tests' servers (tests/python/SCRIPT ARGS...) on
    127.0.0.1: its port. It serves until its stdin closes."""
    proc = subprocess.Popen([sys.executable, ROOT / "tests/python" / script, *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            raise BenchError(f"{script} said {line!r}")
        yield int(line[1])
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fake_hub(config, latency_ms=0):
    """The tests' stand-in Hub (tests/python/fake_hub.py) with the repos of
    config, each CDN data request answered latency_ms late; HF_ENDPOINT set
    to it meanwhile (the mounts started inherit it): its port."""
    path = Path(tempfile.mkdtemp()) / "hub.json"
    path.write_text(json.dumps(config))
    old = {k: os.environ.get(k)
           for k in ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE")}
    try:
        with test_server("fake_hub.py", path, latency_ms) as port:
            os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{port}"
            os.environ.pop("HF_TOKEN", None)
            os.environ.pop("HF_HUB_OFFLINE", None)
            # Not this user's huggingface_hub cache: every byte is fetched.
            os.environ["HF_HUB_CACHE"] = str(path.parent / "no-hf-cache")
            yield port
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(path.parent, ignore_errors=True)


def hub_get(port, path):
    """A control or API answer of the stand-in Hub (or of the Range
    server), as JSON (or the Location of a redirect)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("HEAD" if "/resolve/" in path else "GET", path)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    if "/resolve/" in path:
        return r.getheader("Location")
    return json.loads(body) if body[:1] in (b"{", b"[") else body


def range_server(folder, latency_ms=0):
    """The tests' Range server (tests/python/range_server.py) over folder,
    answering each data request latency_ms late: its port."""
    return test_server("range_server.py", folder, latency_ms)


def curl_ranges(url, ranges, parallel, into=None):
    """Seconds for curl to fetch ranges [(start, end)) of url to /dev/null
    (or each into a file of its own in folder `into`), parallel ranged GETs
    at a time (process start to exit)."""
    def out(i):
        return "/dev/null" if into is None else str(Path(into) / f"block.{i}")
    # "next" ends one URL's options.
    cfg = "\nnext\n".join(f'url = "{url}"\nrange = "{a}-{b - 1}"\noutput = "{out(i)}"'
                           for i, (a, b) in enumerate(ranges))
    t0 = time.perf_counter()
    r = subprocess.run(["curl", "-s", "-f", "--parallel", "--parallel-max", str(parallel),
                        "-K", "-"], input=cfg, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise BenchError(f"curl of {url} exited {r.returncode}: {r.stderr.strip()}")
    return dt


def curl_download(url, path):
    """curl fetches url whole into path (one GET), as a user downloads a
    file before reading it."""
    r = subprocess.run(["curl", "-s", "-f", "-o", str(path), url], capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError(f"curl of {url} exited {r.returncode}: {r.stderr.strip()}")


def one_file(paths):
    """The one path of an iterable of them."""
    found = list(paths)
    if len(found) != 1:
        raise BenchError(f"expected one file, found {found}")
    return found[0]


def drop_file_pages(*paths):
    """Evicts the files' pages from the page cache (POSIX_FADV_DONTNEED,
    after a sync), so that the next read comes from the disk."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class Bench:
    def __init__(self, args):
        self.args = args
        self.mode = "quick" if args.quick else "full"
        self.sizes = SIZES[self.mode]
        self.runs = args.runs or (3 if args.quick else 5)
        self.work = Path(args.workdir).resolve() / self.mode
        self.work.mkdir(parents=True, exist_ok=True)
        self.mounter = Mounter(self.work)
        self.rows = []
        self.notes = []
        self.raw_samples = {}
        self.hot = Hot()

    # rows -----------------------------------------------------------

    def row(self, metric, mount, base, ratio, target, ok, unit, samples=None):
        r = dict(metric=metric, mount=mount, baseline=base, ratio=ratio, target=target,
                 ok=ok, unit=unit)
        self.rows.append(r)
        # A row that continues the one above ("  same, ...") is keyed under
        # it, so that two sections' continuations do not share a key.
        key = metric
        if metric.startswith("  "):
            head = next((x["metric"] for x in reversed(self.rows[:-1])
                         if not x["metric"].startswith("  ")), "")
            key = f"{head} / {metric.strip()}"
        self.raw_samples[key] = samples
        log(f"  {metric}: {fmt_val(mount, unit)} vs {fmt_val(base, unit)}"
            + (f" = {ratio:.2f}x" if ratio is not None else ""))

    def throughput_row(self, metric, nbytes, mount_times, base_times, min_ratio, base_name):
        m, b = median(mount_times), median(base_times)
        ratio = b / m
        ok = None if min_ratio is None else ratio >= min_ratio
        target = "-" if min_ratio is None else f">= {min_ratio:.2f}x"
        self.row(metric, nbytes / m / 1e9, nbytes / b / 1e9, ratio, target, ok, "GB/s",
                 dict(mount_s=mount_times, baseline_s=base_times, baseline=base_name))

    def note(self, text):
        self.notes.append(text)
        log("  note: " + text)

    # sections -------------------------------------------------------

    def raw_sequential(self, zt, mode_label, opts, cold_target, second_target, name="w"):
        t = self.files.tensor(zt, name)
        off, n = t["offset"], t["nbytes"]
        cold, second, third, base = [], [], [], []
        for _ in range(self.runs):
            self.hot(zt, off, n)
            base.append(dd(zt, off, n))
            with self.mounter.mount(zt, opts, tag="raw") as m:
                p = m.mp / t["path"]
                self.hot(zt, off, n)
                cold.append(dd(p, 0, n))
                second.append(dd(p, 0, n))
                third.append(dd(p, 0, n))
                st = m.stats()
                ra = bdi_read_ahead_kb(m.mp)
            self.hot(zt, off, n)
            base.append(dd(zt, off, n))
        avg = st["bytes_served"] / max(1, st["reads"])
        self.note(f"raw {mode_label}: {st['reads']} read requests for 3 reads of "
                  f"{n / MiB:.0f} MiB (average {avg / 1024:.0f} KiB), bdi read_ahead_kb={ra}")
        what = f"dd bs=1M of the .zt range"
        self.throughput_row(f"raw seq read, cold (fresh mount), {mode_label}", n, cold, base,
                            cold_target, what)
        self.throughput_row(f"raw seq read, second read, {mode_label}", n, second, base,
                            second_target, what)
        self.throughput_row(f"raw seq read, third read, {mode_label}", n, third, base, None, what)

    def detect_modes(self):
        """Mount options for each cache mode, and which one a plain mount uses
        (found by behaviour: after a read through a default mount, are the
        mounted file's pages in the page cache?)."""
        helptext = run([BIN, "--help"], capture_output=True, text=True).stdout
        has_page_cache_flag = "--page-cache" in helptext
        f = self.files
        with self.mounter.mount(f.raw, [], tag="detect") as m:
            dd(m.mp / "w", 0, MiB)
            cached = resident_fraction(m.mp / "w", 0, MiB)
        self.default_mode = "page-cache" if cached > 0.5 else "direct-io"
        self.mode_opts = {
            "page-cache": ["--page-cache"] if has_page_cache_flag else [],
            "direct-io": ["--direct-io"],
        }
        if not has_page_cache_flag and self.default_mode != "page-cache":
            raise BenchError("the default mount bypasses the page cache and there is no "
                             "--page-cache flag: cannot measure page-cache mode")
        log(f"default mount: {self.default_mode} mode; options {self.mode_opts}")

    def mode_label(self, mode):
        flag = " ".join(self.mode_opts[mode]) or "no flag"
        return f"{mode} ({'default' if mode == self.default_mode else flag})"

    def section_raw(self):
        log("raw sequential reads, page-cache mode and direct-io mode")
        f = self.files
        for mode, second_target in (("page-cache", 0.95), ("direct-io", 0.4)):
            self.raw_sequential(f.raw, self.mode_label(mode), self.mode_opts[mode], 0.4,
                                second_target)
        self.backing_second_read()
        # The same bytes with a crc32c checksum: the default mount verifies
        # it before the first byte (once per mount).
        t = f.tensor(f.raw_crc, "w")
        off, n = t["offset"], t["nbytes"]
        cold, base = [], []
        for _ in range(self.runs):
            c, b, _ = self.cold_sample(f.raw_crc, off, n, lambda p, o: dd(p, o, n), "crc")
            cold.append(c)
            base.append(b)
        self.throughput_row(f"raw seq read, cold, crc32c tensor (verified first), "
                            f"{self.mode_label(self.default_mode)}", n, cold,
                            base, None, "dd bs=1M of the .zt range")
        self.raw_whole_reads()

    def backing_second_read(self):
        """What the kernel does with page cache it has just created, on the
        backing disk: the tensor's range of the .zt dropped from the page
        cache, read once from disk, then read again (the page-cache mode's
        "second read"), against the same range hot. Printed with the share of
        each page cache held in large folios, which is what differs."""
        f = self.files
        t = f.tensor(f.raw, "w")
        off, n = t["offset"], t["nbytes"]
        second, base = [], []
        for _ in range(self.runs):
            self.hot(f.raw, off, n)
            base.append(dd(f.raw, off, n))
            fd = os.open(f.raw, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            dd(f.raw, off, n)  # from disk: new page cache, read once
            second.append(dd(f.raw, off, n))
        probe = min(64 * MiB, n)
        zt_share = large_folio_share(f.raw, off, probe)
        with self.mounter.mount(f.raw, self.mode_opts["page-cache"], tag="folios") as m:
            dd(m.mp / "w", 0, probe)
            mount_share = large_folio_share(m.mp / "w", 0, probe)
        self.hot(f.raw, off, n)
        if zt_share is None or mount_share is None:
            self.note("large folios: not measured (/proc/kpageflags needs root)")
        else:
            self.note(f"large folios: after one read, {zt_share:.0%} of the .zt's page cache "
                      f"(backing disk) and {mount_share:.0%} of a mounted file's "
                      f"(--page-cache) are in large folios (first {probe // MiB} MiB, "
                      f"/proc/kpageflags)")
        self.throughput_row("backing disk: second read of the .zt range just read from disk "
                            "(what page-cache mode's second read is held to)", n, second, base,
                            None, "dd bs=1M of the .zt range, hot")

    def cold_sample(self, zt, off, n, read, tag):
        """read(path, offset) of tensor "w"'s bytes [off, off+n) of the .zt,
        then of the tensor through a fresh default mount: (mount seconds,
        baseline seconds, the mount's stats)."""
        self.hot(zt, off, n)
        base = read(zt, off)
        with self.mounter.mount(zt, [], tag=tag) as m:
            self.hot(zt, off, n)
            got = read(m.mp / "w", 0)
            st = m.stats()
        return got, base, st

    def raw_whole_reads(self):
        """The whole tensor in one read() (np.fromfile, readinto), default
        mount; then dd bs=1M and the one read again with 4 MiB requests
        (fs.fuse.max_pages_limit raised for these rows only)."""
        f = self.files
        t = f.tensor(f.raw, "w")
        off, n = t["offset"], t["nbytes"]
        buf = bytearray(n)
        buf[:] = b"\1" * n  # fault it in once, outside the timings
        label = self.mode_label(self.default_mode)

        def cold_rows(with_dd):
            whole, base_whole, dd1, base_dd = [], [], [], []
            for _ in range(self.runs):
                c, b, st = self.cold_sample(f.raw, off, n,
                                            lambda p, o: read_whole(p, o, buf), "whole")
                whole.append(c)
                base_whole.append(b)
                if with_dd:
                    c, b, st = self.cold_sample(f.raw, off, n, lambda p, o: dd(p, o, n), "dd")
                    dd1.append(c)
                    base_dd.append(b)
            return whole, base_whole, dd1, base_dd, st

        whole, base_whole, _, _, _ = cold_rows(False)
        self.throughput_row(f"raw, one read() of the whole tensor, cold, {label}", n, whole,
                            base_whole, None, "the same read() of the .zt range")
        with MaxPages(1024) as mp:
            if mp is None:
                self.note(f"4 MiB requests not measured: cannot write {MAX_PAGES} (not root?)")
                return
            whole, base_whole, dd1, base_dd, st = cold_rows(True)
        avg = st["bytes_served"] / max(1, st["reads"])
        self.note(f"4 MiB requests: {MAX_PAGES} set to 1024 for two rows and restored; "
                  f"dd bs=1M made {st['reads']} requests (average {avg / 1024:.0f} KiB)")
        self.throughput_row(f"raw seq read (dd bs=1M), cold, 4 MiB requests allowed, {label}",
                            n, dd1, base_dd, None, "dd bs=1M of the .zt range")
        self.throughput_row(f"raw, one read() of the whole tensor, cold, 4 MiB requests, "
                            f"{label}", n, whole, base_whole, None,
                            "the same read() of the .zt range")

    def section_memmap(self):
        log("np.memmap sum")
        f = self.files
        t = f.tensor(f.raw, "w")
        off, n = t["offset"], t["nbytes"] // 4
        mt, bt, nt = [], [], []
        for _ in range(self.runs):
            self.hot(f.raw, off, n * 4)
            dt, sb = memmap_sum(f.raw, off, n)
            bt.append(dt)
            with self.mounter.mount(f.raw, [], tag="mm") as m:
                self.hot(f.raw, off, n * 4)
                dt, sm = memmap_sum(m.mp / "w", 0, n)
                mt.append(dt)
            # The tensor's .npy view on the FUSE path (--cache-dir on this
            # disk: no clone), read once first, as a loader would again.
            with self.mounter.mount(f.raw, [], tag="mm") as m:
                npy = m.mp / ".npy" / "w.npy"
                np.load(npy, mmap_mode="r").sum()
                self.hot(f.raw, off, n * 4)
                t0 = time.perf_counter()
                sv = float(np.load(npy, mmap_mode="r").sum())
                nt.append(time.perf_counter() - t0)
            if sm != sb or sv != sb:
                raise BenchError(f"memmap sums differ: mount {sm}, .npy view {sv}, direct {sb}")
        self.throughput_row(f"np.memmap(...).sum(), cold (fresh mount), "
                            f"{self.mode_label(self.default_mode)}", n * 4, mt, bt, None,
                            "np.memmap of the .zt at the tensor's offset")
        self.throughput_row("np.load(.npy view, mmap_mode='r').sum() after a first read, FUSE "
                            f"path, {self.mode_label(self.default_mode)}", n * 4, nt, bt, 0.5,
                            "np.memmap of the .zt at the tensor's offset")

    def check_zstd_bytes(self, m, zt, name):
        """4 KiB at a random place of the mounted tensor == zstd -d of the blob."""
        t = self.files.tensor(zt, name)
        rng = np.random.default_rng(7)
        off = int(rng.integers(0, t["nbytes"] - 4096))
        with open(m.mp / t["path"], "rb") as fh:
            fh.seek(off)
            got = fh.read(4096)
        dec = subprocess.Popen(["zstd", "-d", "-c", "-q", self.files.blob(zt, name)],
                               stdout=subprocess.PIPE)
        skipped = 0
        want = b""
        while skipped + len(want) < off + 4096:
            chunk = dec.stdout.read(MiB)
            if not chunk:
                break
            if skipped + len(chunk) <= off:
                skipped += len(chunk)
                continue
            want += chunk
        dec.kill()
        dec.wait()
        start = off - skipped
        if got != want[start:start + 4096]:
            raise BenchError(f"{zt.name}:{name}: mounted bytes at {off} differ from zstd -d")

    def section_zstd(self):
        log("zstd tensors: first and second read vs zstd -d")
        f = self.files
        # Issue 24's targets: 1 MiB frames >= 1.6x of single-thread
        # `zstd -d` (the decode on both cores), one frame >= 1.0x.
        cases = [
            (f.zframes, "f32", "float32, 1 MiB frames", 1.6),
            (f.zsingle, "f32", "float32, one frame", 1.0),
            (f.zframes, "bf16", "bfloat16, 1 MiB frames", 1.6),
            (f.zsingle, "bf16", "bfloat16, one frame", 1.0),
        ]
        other = "direct-io" if self.default_mode == "page-cache" else "page-cache"
        for zt, name, label, target in cases:
            t = f.tensor(zt, name)
            n = t["nbytes"]
            blob = f.blob(zt, name)
            first, second, ofirst, osecond, base, many = [], [], [], [], [], []
            cores = os.cpu_count() or 1
            for i in range(self.runs):
                self.hot(blob)
                base.append(zstd_d(blob))
                if target > 1:
                    many.append(zstd_d_at_once(blob, cores))
                modes = [(self.mode_opts[self.default_mode], first, second),
                         (self.mode_opts[other], ofirst, osecond)]
                # Alternate which mode goes first: the second mount of a
                # sample reuses memory the first just freed, which on this
                # kind of VM is several times faster to touch than memory
                # idle for a few seconds (see the "machine" note).
                if i % 2:
                    modes.reverse()
                for opts, a, b in modes:
                    with self.mounter.mount(zt, opts, tag="z") as m:
                        p = m.mp / t["path"]
                        self.hot(zt, t["offset"], t["size"])
                        a.append(dd(p, 0, n))
                        b.append(dd(p, 0, n))
                        if i == 0 and a is first:
                            self.check_zstd_bytes(m, zt, name)
                            st = m.stats()
                self.hot(blob)
                base.append(zstd_d(blob))
            self.note(f"zstd {label}: compressed {t['size'] / MiB:.1f} MiB -> {n / MiB:.0f} MiB "
                      f"(ratio {t['size'] / n:.3f}); {st['decompressions']} decodes, "
                      f"{st['reads']} read requests")
            what = "zstd -d -c of the blob > /dev/null"
            dl, ol = self.mode_label(self.default_mode), self.mode_label(other)
            self.throughput_row(f"zstd {label}: first read (fresh mount), {dl}", n, first, base,
                                target, what)
            if many:
                # What the cores give a decode spread over all of them, as
                # the mount's is: the host's ceiling for the row above.
                self.throughput_row(f"  {cores} `zstd -d` of the blob at once (their bytes "
                                    "together), the host's ceiling for the row above", cores * n,
                                    many, [cores * b for b in base], None, what + ", once")
            self.throughput_row(f"zstd {label}: second read, {dl}", n, second, base, None, what)
            self.throughput_row(f"zstd {label}: first read, {ol}", n, ofirst, base, None, what)
            self.throughput_row(f"zstd {label}: second read, {ol}", n, osecond, base, None, what)

    def section_ttfb(self):
        log("time to first byte: 4 KiB in the middle of the big multi-frame tensor")
        f = self.files
        t = f.tensor(f.zframes, "big")
        off = t["nbytes"] // 2
        times, mounts = [], []
        for _ in range(max(self.runs, 5)):
            with self.mounter.mount(f.zframes, [], tag="ttfb") as m:
                self.hot(f.zframes, t["offset"], t["size"])
                t0 = time.perf_counter()
                fd = os.open(m.mp / t["path"], os.O_RDONLY)
                b = os.pread(fd, 4096, off)
                dt = time.perf_counter() - t0
                os.close(fd)
                if len(b) != 4096:
                    raise BenchError("short read in the ttfb test")
                st = m.stats()
                mounts.append(m.ready_s)
            times.append(dt)
        self.note(f"ttfb: {st['decompressions']} decode(s) of "
                  f"{st['decompressed_bytes'] / MiB:.1f} MiB for one 4 KiB read")
        ms = median(times) * 1e3
        self.row(f"time to first byte, 4 KiB at the middle of a "
                 f"{t['nbytes'] / GiB:.2g} GiB multi-frame zstd tensor (open+pread)",
                 ms, None, None, "<= 20 ms", ms <= 20, "ms", dict(s=times))

    def section_remote(self):
        """raw.zt's tensor over HTTP (the tests' Range server on 127.0.0.1),
        default 4 MiB blocks and read-ahead: the first sequential read
        against curl fetching the same blocks with 4 ranged GETs at a time
        (issue 28's yardstick; the mount has its reader's block and up to 8
        ahead in flight); time to a first byte in the middle; a second
        read from the disk cache (remounted, the cache file's pages
        evicted) against dd of the .zt from disk; the daemon's peak RSS.
        The first read and curl are timed again with the server answering
        each request LATENCY_MS late, as an object store's time to first
        byte does. And the model's safetensors file over HTTP, its cache
        file complete: dd of its .safetensors view after a remount, the
        cache file's pages evicted, against dd of a copy curl downloaded as
        the cache was filled (as recently written to this disk), and of the
        served file, both evicted."""
        f = self.files
        t = f.tensor(f.raw, "w")
        off, n = t["offset"], t["nbytes"]
        size = f.raw.stat().st_size
        block, parallel = 4 * MiB, 4
        log(f"remote: a {n / MiB:.0f} MiB raw tensor over HTTP, {block // MiB} MiB blocks")
        served = self.work / "remote-served"
        served.mkdir(exist_ok=True)
        # A hard link: the server serves nothing that resolves outside
        # its folder.
        link = served / "raw.zt"
        link.unlink(missing_ok=True)
        os.link(f.raw, link)
        st_file = self.more.model()["safetensors (save_file)"]
        st_link = served / "model.safetensors"
        st_link.unlink(missing_ok=True)
        os.link(st_file, st_link)
        st_size = st_file.stat().st_size
        st_cache = self.work / "remote-cache-st"
        view_second, view_disk, view_download = [], [], []
        cache = self.work / "remote-cache"
        # The blocks the mount fetches for the tensor: those covering it.
        ranges = [(a, min(a + block, size)) for a in range(off // block * block, off + n, block)]
        cold, curl, ttfb, curl_small, second, disk, rss = [], [], [], [], [], [], []
        # curl keeping what it fetched, as the mount keeps its cache file:
        # each block into a file on this disk.
        curl_kept, kept = [], self.work / "remote-curl-kept"
        # The same bytes read from the cache file itself: the disk's speed
        # for that file (where its blocks landed), apart from the .zt's.
        cache_disk, view_cache_disk = [], []

        def fresh():
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir()
            return ["--cache-dir", cache, "-o", f"block_size={block // MiB}M"]

        with range_server(served) as port:
            url = f"http://127.0.0.1:{port}/raw.zt"
            for _ in range(self.runs):
                self.hot(f.raw)
                curl.append(curl_ranges(url, ranges, parallel))
                shutil.rmtree(kept, ignore_errors=True)
                kept.mkdir()
                self.hot(f.raw)
                curl_kept.append(curl_ranges(url, ranges, parallel, into=kept))
                shutil.rmtree(kept, ignore_errors=True)
                opts = fresh()
                with self.mounter.mount(url, opts, tag="remote") as m:
                    self.hot(f.raw)
                    cold.append(dd(m.mp / t["path"], 0, n))
                    rss.append(m.status()["VmHWM"])
                drop_file_pages(*cache.rglob("*.data"))
                with self.mounter.mount(url, opts, tag="remote") as m:
                    second.append(dd(m.mp / t["path"], 0, n))
                drop_file_pages(f.raw)
                disk.append(dd(f.raw, off, n))
                cache_file = one_file(cache.rglob("*.data"))
                drop_file_pages(cache_file)
                cache_disk.append(dd(cache_file, off, n))
                # A first byte in the middle, on a fresh cache.
                self.hot(f.raw)
                mid = n // 2 // 4096 * 4096
                with self.mounter.mount(url, fresh(), tag="remote") as m:
                    t0 = time.perf_counter()
                    fd = os.open(m.mp / t["path"], os.O_RDONLY)
                    got = os.pread(fd, 4096, mid)
                    ttfb.append(time.perf_counter() - t0)
                    os.close(fd)
                    if len(got) != 4096:
                        raise BenchError("short read in the remote ttfb test")
                curl_small.append(curl_ranges(url, [(off + mid, off + mid + 4096)], 1))
            # The same tensor through a signed URL (asked as given, pinned
            # by a GET of its first byte), against curl of that URL.
            signed_link = served / "raw_signed.zt"
            signed_link.unlink(missing_ok=True)
            os.link(f.raw, signed_link)
            hub_get(port, "/__sign?path=/raw_signed.zt&sig=bench")  # a control GET
            signed_url = f"http://127.0.0.1:{port}/raw_signed.zt?sig=bench"
            signed_cold, signed_curl = self.cold_against_curl(
                signed_url, signed_url, ranges, parallel, fresh, t["path"], n, "remote")
            # The safetensors file fetched whole once, then its view read
            # after each remount from the cache file on disk.
            st_url = f"http://127.0.0.1:{port}/model.safetensors"
            shutil.rmtree(st_cache, ignore_errors=True)
            st_cache.mkdir()
            st_opts = ["--cache-dir", st_cache, "-o", f"block_size={block // MiB}M"]
            view = Path(".safetensors") / "model.safetensors"
            # The download the mount saves a user: the file fetched whole
            # by curl, written to this disk as the cache file is, and as
            # recently (this VM's disk reads what was just written up to
            # 3x slower than what was written minutes before).
            download = self.work / "remote-download.safetensors"
            with self.mounter.mount(st_url, st_opts, tag="remote-st") as m:
                dd(m.mp / view, 0, st_size)
            curl_download(st_url, download)
            for i in range(self.runs):
                # Turn about which goes first: this disk's speed comes in
                # bursts, and the first read after a pause often gets one.
                if i % 2:
                    drop_file_pages(st_file, download)
                    view_disk.append(dd(st_file, 0, st_size))
                    view_download.append(dd(download, 0, st_size))
                drop_file_pages(*st_cache.rglob("*.data"))
                with self.mounter.mount(st_url, st_opts, tag="remote-st") as m:
                    view_second.append(dd(m.mp / view, 0, st_size))
                    opens = m.stats().get("passthrough_opens", 0)
                if i % 2 == 0:
                    drop_file_pages(st_file, download)
                    view_download.append(dd(download, 0, st_size))
                    view_disk.append(dd(st_file, 0, st_size))
                st_cache_file = one_file(st_cache.rglob("*.data"))
                drop_file_pages(st_cache_file)
                view_cache_disk.append(dd(st_cache_file, 0, st_size))
            self.note(f"remote: safetensors view after remount, {opens} passthrough open(s)")
        shutil.rmtree(st_cache, ignore_errors=True)
        download.unlink(missing_ok=True)
        with range_server(served, REMOTE_LATENCY_MS) as port:
            url = f"http://127.0.0.1:{port}/raw.zt"
            slow_cold, slow_curl = self.cold_against_curl(
                url, url, ranges, parallel, fresh, t["path"], n, "remote")
        shutil.rmtree(cache, ignore_errors=True)
        what = f"curl, ranged GETs of one {block // MiB} MiB block, {parallel} at a time"
        self.throughput_row(f"remote seq read, cold (fresh cache), {n / GiB:.2g} GiB over "
                            f"HTTP on loopback", n, cold, curl, 0.8, what)
        self.throughput_row("  same, against curl keeping the blocks (each into a file on "
                            "this disk, as the mount keeps them in its cache file)", n, cold,
                            curl_kept, None, what + ", each into a file")
        self.throughput_row("  same, through a signed URL (a query the server checks; "
                            "no HEAD)", n, signed_cold, signed_curl, 0.8,
                            what + ", of the signed URL")
        self.throughput_row(f"remote seq read, cold, the server answering each request "
                            f"{REMOTE_LATENCY_MS} ms late (a store's time to first byte)",
                            n, slow_cold, slow_curl, 0.8, what)
        self.row("remote time to first byte, 4 KiB at the middle (fresh mount and cache; "
                 "open+pread), against curl of those 4 KiB",
                 median(ttfb) * 1e3, median(curl_small) * 1e3,
                 median(curl_small) / median(ttfb), "-", None, "ms",
                 dict(s=ttfb, curl_s=curl_small))
        self.throughput_row("remote second read, from the disk cache (remount, the cache "
                            "file's pages evicted)", n, second, disk, None,
                            "dd of the .zt range, its pages evicted")
        self.throughput_row("  same, against dd of the cache file's range (the same bytes "
                            "where they landed on this disk), its pages evicted", n, second,
                            cache_disk, 0.8, "dd of the cache file's range, its pages evicted")
        self.row("remote daemon peak RSS over the cold read", median(rss) / MiB, None, None,
                 "-", None, "MiB", dict(bytes=rss))
        self.throughput_row(f"remote .safetensors view of a {st_size / GiB:.2g} GiB safetensors "
                            "file, cache complete: read after a remount, the cache file's "
                            "pages evicted, against dd of the file curl downloaded as the "
                            "cache was filled", st_size, view_second, view_download, 0.8,
                            "dd of the download, its pages evicted")
        self.throughput_row("  same, against dd of the served file (written long before), its "
                            "pages evicted", st_size, view_second, view_disk, None,
                            "dd of the file, its pages evicted")
        self.throughput_row("  same, against dd of the cache file (the same bytes where they "
                            "landed on this disk), its pages evicted", st_size, view_second,
                            view_cache_disk, 0.8, "dd of the cache file, its pages evicted")

    def cold_against_curl(self, url, curl_url, ranges, parallel, opts, path, n, tag):
        """self.runs rounds of curl fetching `ranges` of curl_url, then a
        fresh mount of url (opts() gives its options) read cold: the two
        lists of seconds. The source's pages are made hot before each."""
        cold, curl = [], []
        for _ in range(self.runs):
            self.hot(self.files.raw)
            curl.append(curl_ranges(curl_url, ranges, parallel))
            with self.mounter.mount(url, opts(), tag=tag) as m:
                self.hot(self.files.raw)
                cold.append(dd(m.mp / path, 0, n))
        return cold, curl

    def section_hub(self):
        """raw.zt's tensor as hf://bench/raw/raw.zt from the stand-in Hub,
        default blocks and read-ahead: the first sequential read against curl
        fetching the same blocks from the signed CDN URL 4 at a time, on
        loopback and with each data request answered REMOTE_LATENCY_MS late;
        then two mounts of it with one cache dir read at once, against one
        mount alone, and the bytes the CDN sent over the object's size; and
        the file read from huggingface_hub's cache (hub_from_hf_cache)."""
        f = self.files
        t = f.tensor(f.raw, "w")
        off, n = t["offset"], t["nbytes"]
        size = f.raw.stat().st_size
        block, parallel = 4 * MiB, 4
        commit = "b" * 40
        config = {"repos": {"bench/raw": {"refs": {"main": commit},
                                          "commits": {commit: {"raw.zt": str(f.raw)}}}}}
        url = "hf://bench/raw/raw.zt"
        cache = self.work / "hub-cache"
        ranges = [(a, min(a + block, size)) for a in range(off // block * block, off + n, block)]
        log(f"hub: a {n / MiB:.0f} MiB raw tensor from the stand-in Hub")

        def fresh():
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir()
            return ["--cache-dir", cache]

        rows = {}
        for latency in (0, REMOTE_LATENCY_MS):
            with fake_hub(config, latency) as port:
                signed = hub_get(port, f"/bench/raw/resolve/{commit}/raw.zt")
                cold, curl = self.cold_against_curl(
                    url, signed, ranges, parallel, fresh, t["path"], n, "hub")
                if latency == 0:
                    one, two, sent = cold, [], []
                    for _ in range(self.runs):
                        opts = fresh()
                        hub_get(port, "/__reset")
                        with self.mounter.mount(url, opts, tag="hub") as a, \
                                self.mounter.mount(url, opts, tag="hub") as b:
                            self.hot(f.raw)
                            t0 = time.perf_counter()
                            with concurrent.futures.ThreadPoolExecutor(2) as ex:
                                list(ex.map(lambda mp: dd(mp / t["path"], 0, n), [a.mp, b.mp]))
                            two.append(time.perf_counter() - t0)
                        sent.append(hub_get(port, "/__stats")["cdn_bytes"])
                    local, cached, asked = self.hub_from_hf_cache(url, commit, t, fresh)
            rows[latency] = (cold, curl)
        shutil.rmtree(cache, ignore_errors=True)
        what = f"curl of the signed URL, ranged GETs of one {block // MiB} MiB block, " \
               f"{parallel} at a time"
        cold, curl = rows[0]
        self.throughput_row(f"hub seq read, cold (fresh cache), {n / GiB:.2g} GiB on loopback",
                            n, cold, curl, 0.8, what)
        cold, curl = rows[REMOTE_LATENCY_MS]
        self.throughput_row(f"hub seq read, cold, the CDN answering each request "
                            f"{REMOTE_LATENCY_MS} ms late", n, cold, curl, 0.8, what)
        self.throughput_row("hub: two mounts, one cache dir, reading it at once (time for "
                            "both) against one mount alone", n, two, one, 0.8,
                            "one mount's cold read")
        self.throughput_row("hub: the file in huggingface_hub's cache, read there (a local "
                            "file: nothing fetched), seq read", n, cached, local, None,
                            "dd of the .zt's range")
        self.note(f"hub from huggingface_hub's cache: {max(asked)} remote request(s) per mount")
        self.row("hub: bytes the CDN sent for the two mounts, over the object's size",
                 median(sent) / size, 1.0, size / median(sent), "<= 1.0", median(sent) <= size,
                 "x", dict(bytes=sent, size=size))

    def hub_from_hf_cache(self, url, commit, t, fresh):
        """The Hub file as huggingface_hub lays it out once downloaded (a
        snapshot link to it, in a cache of its own): dd of the
        tensor through a mount of url, and of the same range of the .zt,
        with the remote requests each mount made."""
        f = self.files
        off, n = t["offset"], t["nbytes"]
        hf = self.work / "hf-hub-cache"
        snap = hf / "models--bench--raw" / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        link = snap / "raw.zt"
        link.unlink(missing_ok=True)
        link.symlink_to(f.raw)
        local, cached, asked = [], [], []
        before = os.environ.get("HF_HUB_CACHE")
        os.environ["HF_HUB_CACHE"] = str(hf)
        try:
            for _ in range(self.runs):
                self.hot(f.raw, off, n)
                local.append(dd(f.raw, off, n))
                with self.mounter.mount(url, fresh(), tag="hub") as m:
                    self.hot(f.raw, off, n)
                    cached.append(dd(m.mp / t["path"], 0, n))
                    asked.append(m.stats().get("remote_requests", 0))
        finally:
            os.environ.pop("HF_HUB_CACHE", None)
            if before is not None:
                os.environ["HF_HUB_CACHE"] = before
            shutil.rmtree(hf, ignore_errors=True)
        return local, cached, asked

    def section_random(self):
        log("random 4 KiB reads")
        f = self.files
        t = f.tensor(f.raw, "w")
        nreads = self.sizes["random_reads"]
        rng = np.random.default_rng(11)
        offsets = [int(x) * 4096 for x in rng.integers(0, t["nbytes"] // 4096, nreads)]
        mt, bt = [], []
        for _ in range(self.runs):
            self.hot(f.raw, t["offset"], t["size"])
            bt.append(pread_loop(f.raw, offsets, t["offset"]))
            with self.mounter.mount(f.raw, [], tag="rand") as m:
                self.hot(f.raw, t["offset"], t["size"])
                mt.append(pread_loop(m.mp / "w", offsets))
                st = m.stats()
        self.note(f"random reads: {st['reads']} requests, {st['bytes_served'] / MiB:.1f} MiB "
                  f"served for {nreads} reads of 4 KiB")
        m, b = median(mt), median(bt)
        self.row(f"random 4 KiB pread, cold (fresh mount), {nreads} reads, "
                 f"{self.mode_label(self.default_mode)}", nreads / m / 1e3,
                 nreads / b / 1e3, b / m, "-", None, "k reads/s",
                 dict(mount_s=mt, baseline_s=bt, baseline="os.pread of the .zt"))

    def ls_baseline(self, names):
        """A directory on the backing disk holding the same names (empty files)."""
        d = self.work / "ls_baseline"
        marker = d / ".count"
        if not (marker.exists() and marker.read_text() == str(len(names))):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            for name in names:
                open(d / name, "wb").close()
            marker.write_text(str(len(names)))
        return d

    def section_many(self):
        n = self.sizes["many"]
        log(f"{n} small tensors: mount, ls -l, RSS")
        f = self.files
        mount_s, ls_s, ls2_s, rss_m, rss_l, hwm, base_s = [], [], [], [], [], [], []
        cold_base_s, xattr_s = [], []
        env = dict(os.environ, LC_ALL="C")
        basedir = None
        for i in range(self.runs):
            self.hot(f.many)
            with self.mounter.mount(f.many, [], tag="many") as m:
                mount_s.append(m.ready_s)
                rss_m.append(m.status()["VmRSS"])
                t0 = time.perf_counter()
                run(["ls", "-l", m.mp], stdout=subprocess.DEVNULL, env=env)
                ls_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                out = run(["ls", "-l", m.mp], stdout=subprocess.PIPE, env=env).stdout
                ls2_s.append(time.perf_counter() - t0)
                lines = out.count(b"\n")
                if lines != 2 * n + 1:
                    raise BenchError(f"ls -l printed {lines} lines, expected {2 * n + 1}")
                s = m.status()
                rss_l.append(s["VmRSS"])
                hwm.append(s["VmHWM"])
                if basedir is None:
                    basedir = self.ls_baseline(os.listdir(m.mp))
            with self.mounter.mount(f.many, ["--xattrs"], tag="many-xattrs") as m:
                t0 = time.perf_counter()
                run(["ls", "-l", m.mp], stdout=subprocess.DEVNULL, env=env)
                xattr_s.append(time.perf_counter() - t0)
            run(["ls", "-l", basedir], stdout=subprocess.DEVNULL, env=env)  # warm
            t0 = time.perf_counter()
            run(["ls", "-l", basedir], stdout=subprocess.DEVNULL, env=env)
            base_s.append(time.perf_counter() - t0)
            # The fair match for a fresh mount, whose inodes the kernel has
            # never built: the same directory with its inodes and dentries
            # dropped first (its blocks stay in the page cache).
            if drop_inodes():
                t0 = time.perf_counter()
                run(["ls", "-l", basedir], stdout=subprocess.DEVNULL, env=env)
                cold_base_s.append(time.perf_counter() - t0)
        mt = median(mount_s)
        self.row(f"mount, {n} tensors (command + first stat)", mt, None, None, "<= 0.5 s",
                 mt <= 0.5, "s", dict(s=mount_s))
        lt, bt = median(ls_s), median(base_s)
        base_what = "ls -l of the same names as empty files on the backing disk (cached)"
        self.row(f"ls -l, {n} tensors ({2 * n} entries), fresh mount", lt, bt, bt / lt,
                 "<= 2 s", lt <= 2.0, "s", dict(s=ls_s, baseline_s=base_s, baseline=base_what))
        xt = median(xattr_s)
        self.row("ls -l, fresh mount, with --xattrs (two xattr round trips per file)", xt, bt,
                 bt / xt, "-", None, "s", dict(s=xattr_s, baseline_s=base_s, baseline=base_what))
        if cold_base_s:
            cb = median(cold_base_s)
            self.row("ls -l, fresh mount, against the backing disk's listing with its "
                     "inodes dropped first", lt, cb, cb / lt, "-", None, "s",
                     dict(s=ls_s, baseline_s=cold_base_s,
                          baseline="ls -l of the same names on the backing disk, after "
                                   "echo 2 > /proc/sys/vm/drop_caches"))
        else:
            self.note("ls -l with the backing disk's inodes dropped: not measured "
                      "(/proc/sys/vm/drop_caches needs root)")
        l2 = median(ls2_s)
        self.row("ls -l again (dentries and attributes cached)", l2, bt, bt / l2, "-",
                 None, "s", dict(s=ls2_s, baseline_s=base_s, baseline=base_what))
        self.row(f"daemon VmRSS after mount, {n} tensors", median(rss_m) / MiB, None, None,
                 "-", None, "MiB", dict(bytes=rss_m))
        self.row(f"daemon VmRSS after 2x ls -l (VmHWM {median(hwm) / MiB:.0f} MiB)",
                 median(rss_l) / MiB, None, None, "-", None, "MiB", dict(bytes=rss_l, hwm=hwm))

    def section_rss(self):
        cache = self.sizes["rss_cache"]
        log(f"peak daemon RSS, 8 readers streaming zstd tensors, --cache-size {cache}")
        f = self.files
        big = f.tensor(f.zframes, "big")
        seg = big["nbytes"] // 6 // 4096 * 4096
        readers = [(big["path"], k * seg, seg) for k in range(6)]
        for name in ("f32", "bf16"):
            t = f.tensor(f.zframes, name)
            readers.append((t["path"], 0, t["nbytes"]))
        total = sum(r[2] for r in readers)
        limit = self._size(cache)
        hwms, anons, files, walls = [], [], [], []
        for _ in range(self.runs):
            with self.mounter.mount(f.zframes, ["--cache-size", cache], tag="rss") as m:
                self.hot(f.zframes)
                t0 = time.perf_counter()
                procs = [subprocess.Popen(
                    ["dd", f"if={m.mp / p}", "of=/dev/null", "bs=1M",
                     "iflag=skip_bytes,count_bytes", f"skip={o}", f"count={n}", "status=none"],
                    stderr=subprocess.PIPE) for p, o, n in readers]
                peak_anon = peak_file = 0
                try:
                    while any(p.poll() is None for p in procs):
                        s = m.status()
                        peak_anon = max(peak_anon, s["RssAnon"])
                        peak_file = max(peak_file, s["RssFile"])
                        if time.perf_counter() - t0 > 600:
                            raise BenchError("8 readers did not finish in 10 minutes")
                        time.sleep(0.005)
                finally:
                    for p in procs:
                        if p.poll() is None:
                            p.kill()
                        p.wait()
                walls.append(time.perf_counter() - t0)
                bad = [p.stderr.read().decode() for p in procs if p.returncode != 0]
                if bad:
                    raise BenchError(f"readers failed: {bad}")
                s = m.status()
                st = m.stats()
                hwms.append(s["VmHWM"])
                anons.append(peak_anon)
                files.append(peak_file)
            if st["cache_peak_bytes"] > limit:
                raise BenchError(f"cache peak {st['cache_peak_bytes']} > limit {limit}")
        self.note(f"8 readers: {total / MiB:.0f} MiB decoded in {median(walls):.2f} s "
                  f"({total / median(walls) / 1e9:.2f} GB/s); cache peak "
                  f"{st['cache_peak_bytes'] / MiB:.0f} MiB, {st['evictions']} evictions; "
                  f"peak RssFile (mmap of the .zt) {median(files) / MiB:.0f} MiB")
        cap = limit + 64 * MiB
        hw = median(hwms)
        self.row(f"peak daemon RSS (VmHWM), 8 zstd readers, --cache-size {cache}", hw / MiB,
                 None, None, f"<= {cap / MiB:.0f} MiB", hw <= cap, "MiB", dict(bytes=hwms))
        an = median(anons)
        self.row(f"  same, anonymous memory only (peak RssAnon, sampled every 5 ms)", an / MiB,
                 None, None, f"<= {cap / MiB:.0f} MiB", an <= cap, "MiB", dict(bytes=anons))

    # v2, formats, views, model ------------------------------------------

    def cold_dd(self, path, rel, off, n, opts=(), tag="c"):
        """dd of path's bytes [off, off+n), then dd of the mounted file rel
        through a fresh mount (the backing range hot before each):
        (mount seconds, baseline seconds)."""
        self.hot(path, off, n)
        base = dd(path, off, n)
        with self.mounter.mount(path, list(opts), tag=tag) as m:
            self.hot(path, off, n)
            got = dd(m.mp / rel, 0, n)
        return got, base

    def first_byte(self, path, off):
        """Seconds to open path and pread 4 KiB at off."""
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            b = os.pread(fd, 4096, off)
            dt = time.perf_counter() - t0
        finally:
            os.close(fd)
        if len(b) != 4096:
            raise BenchError(f"short read at {off} of {path}")
        return dt

    @staticmethod
    def same_bytes(a, a_off, b, b_off, n, what):
        """The n bytes at a_off of file a equal those at b_off of file b."""
        with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
            fa.seek(a_off)
            fb.seek(b_off)
            left = n
            while left:
                k = min(left, 4 * MiB)
                x, y = fa.read(k), fb.read(k)
                if x != y or len(x) != k:
                    raise BenchError(f"{what}: bytes differ near {n - left} of {n}")
                left -= k

    @staticmethod
    def zstd_frames(blob):
        """(zstd frames, skippable frames) of a .zst file (zstd -lv)."""
        out = run(["zstd", "-lv", blob], capture_output=True, text=True).stdout
        z = re.search(r"# Zstandard Frames: (\d+)", out)
        sk = re.search(r"# Skippable Frames: (\d+)", out)
        return int(z.group(1)) if z else None, int(sk.group(1)) if sk else 0

    @staticmethod
    def zstd_d_equals(blob, path, off, n, what):
        """zstd -d of blob (skippable frames included) gives exactly the n
        bytes at off of path."""
        dec = subprocess.Popen(["zstd", "-d", "-c", "-q", blob], stdout=subprocess.PIPE)
        try:
            with open(path, "rb", buffering=0) as fh:
                fh.seek(off)
                got = 0
                while True:
                    x = dec.stdout.read(4 * MiB)
                    if not x:
                        break
                    if fh.read(len(x)) != x:
                        raise BenchError(f"{what}: zstd -d differs near byte {got}")
                    got += len(x)
        finally:
            dec.stdout.close()
            rc = dec.wait()
        if rc != 0 or got != n:
            raise BenchError(f"{what}: zstd -d exited {rc} after {got} of {n} bytes")

    def section_v2(self):
        log("zTensor v2 (ztensor 2.x): raw and seekable zstd first reads, time to first byte")
        more = self.more
        raw, z = more.single()[:2]
        label = self.mode_label(self.default_mode)
        t = more.info(raw)["w"]
        off, n = blob_range(t)
        if n != t["nbytes"] or t["encoding"] != "raw":
            raise BenchError(f"{raw}: w is not a raw blob of {t['nbytes']} bytes")
        cold, noverify, ttfb_raw, base = [], [], [], []
        for _ in range(self.runs):
            c, b = self.cold_dd(raw, t["path"], off, n, tag="v2raw")
            cold.append(c)
            base.append(b)
            c, b = self.cold_dd(raw, t["path"], off, n, ["--no-verify-raw"], tag="v2raw")
            noverify.append(c)
            base.append(b)
            with self.mounter.mount(raw, [], tag="v2ttfb") as m:
                self.hot(raw, off, n)
                ttfb_raw.append(self.first_byte(m.mp / t["path"], n // 2))
        digest = t["parts"]["data"].get("digest", "none")
        what = "dd bs=1M of the blob's range of the .zt"
        self.throughput_row(f"zTensor v2 (ztensor 2.x), raw f32 {n / MiB:.0f} MiB: seq read, "
                            f"cold (fresh mount, {digest.split(':')[0]} verified first), "
                            f"{label}", n, cold, base, 0.4, what)
        self.throughput_row("zTensor v2, raw f32: seq read, cold, --no-verify-raw", n, noverify,
                            base, None, what)
        ms = median(ttfb_raw) * 1e3
        self.row(f"zTensor v2, raw f32: time to first byte, 4 KiB at the middle (open+pread), "
                 f"fresh mount", ms, None, None, "-", None, "ms", dict(s=ttfb_raw))

        tz = more.info(z)["w"]
        part = tz["parts"]["data"]
        zoff, zn = blob_range(tz)
        nbytes = tz["nbytes"]
        blob = more.blob_file(z, "w")
        frames, skippable = self.zstd_frames(blob)
        if not skippable:
            raise BenchError(f"{blob}: no skippable (seek table) frame")
        # The baseline must decode what the mount serves: zstd -d skips the
        # seek table frame and gives the raw file's bytes.
        self.zstd_d_equals(blob, raw, off, n, "v2 seekable blob")
        # The same values in zTensor v0.1 (pack --zstd, 1 MiB frames, no
        # digest of the decoded bytes): what the v2 digest costs.
        f = self.files
        tb = f.tensor(f.zframes, "big")
        if tb["nbytes"] != nbytes:
            raise BenchError(f"zstd_frames.zt:big has {tb['nbytes']} bytes, v2 {nbytes}")
        cache = self.sizes["rss_cache"]
        first, second, ttfb, zbase, v01, small = [], [], [], [], [], []
        rng = np.random.default_rng(7)
        for i in range(self.runs):
            self.hot(blob)
            zbase.append(zstd_d(blob))
            with self.mounter.mount(z, [], tag="v2z") as m:
                p = m.mp / tz["path"]
                self.hot(z, zoff, zn)
                first.append(dd(p, 0, nbytes))
                second.append(dd(p, 0, nbytes))
                if i == 0:
                    k = int(rng.integers(0, nbytes - 4096))
                    self.same_bytes(p, k, raw, off + k, 4096, "v2 zstd through the mount")
                st = m.stats()
            with self.mounter.mount(f.zframes, [], tag="v2v01") as m:
                p = m.mp / tb["path"]
                self.hot(f.zframes, tb["offset"], tb["size"])
                v01.append(dd(p, 0, nbytes))
                if i == 0:
                    k = int(rng.integers(0, nbytes - 4096))
                    self.same_bytes(p, k, raw, off + k, 4096, "zstd_frames.zt:big (v2's values)")
            with self.mounter.mount(z, ["--cache-size", cache], tag="v2zsmall") as m:
                self.hot(z, zoff, zn)
                small.append(dd(m.mp / tz["path"], 0, nbytes))
                st_small = m.stats()
            with self.mounter.mount(z, [], tag="v2zttfb") as m:
                self.hot(z, zoff, zn)
                ttfb.append(self.first_byte(m.mp / tz["path"], nbytes // 2))
                st_ttfb = m.stats()
            self.hot(blob)
            zbase.append(zstd_d(blob))
        self.note(f"v2 seekable zstd: {zn / MiB:.1f} MiB stored (ratio {zn / nbytes:.3f}) in "
                  f"{frames} zstd frames of {nbytes / frames / MiB:.2g} MiB and {skippable} "
                  f"skippable frame (seek table; zstd -d skips it, checked); digest "
                  f"{part.get('digest', 'none').split(':')[0]}; first read: "
                  f"{st['decompressions']} decodes, {st['reads']} read requests; time to first "
                  f"byte: {st_ttfb['decompressions']} decodes of "
                  f"{st_ttfb['decompressed_bytes'] / MiB:.1f} MiB before the 4 KiB; with "
                  f"--cache-size {cache}: {st_small['decompressions']} decodes of "
                  f"{st_small['decompressed_bytes'] / MiB:.0f} MiB, "
                  f"{st_small['evictions']} evictions")
        what = "zstd -d -c of the blob > /dev/null (one thread)"
        m_, b_ = median(first), median(zbase)
        self.row(f"zTensor v2 seekable zstd f32 {nbytes / MiB:.0f} MiB ({frames} frames): first "
                 f"read (fresh mount), {label}", nbytes / m_ / 1e9, nbytes / b_ / 1e9, b_ / m_,
                 ">= 1.00x (issue 19: 1.60x)", b_ / m_ >= 1.0, "GB/s",
                 dict(mount_s=first, baseline_s=zbase, baseline=what))
        self.throughput_row(f"zTensor v2 seekable zstd f32: second read, {label}", nbytes,
                            second, zbase, None, what)
        self.throughput_row(f"zTensor v2 seekable zstd f32: first read, --cache-size {cache} "
                            f"(smaller than the tensor), {label}", nbytes, small, zbase, None,
                            what)
        self.throughput_row(f"  v2 first read against v0.1's of the same values "
                            f"(zstd_frames.zt:big, pack --zstd, no decoded digest), same run",
                            nbytes, first, v01, None, "first read of zstd_frames.zt:big, "
                            "fresh mount")
        ms = median(ttfb) * 1e3
        bms = median(zbase) * 1e3
        self.row(f"zTensor v2 seekable zstd f32: time to first byte, 4 KiB at the middle "
                 f"(open+pread), fresh mount; baseline: zstd -d of the whole blob", ms, bms,
                 bms / ms, "-", None, "ms", dict(s=ttfb, baseline_s=zbase, baseline=what))

    def section_writers(self):
        log("one zstd frame from each writer: first read vs zstd -d, time to first byte")
        more = self.more
        labels, npy = more.frames()
        data_off = np.load(npy, mmap_mode="r").offset
        dl = self.mode_label(self.default_mode)
        rng = np.random.default_rng(11)
        for label, path in labels.items():
            t = more.info(path)["w"]
            n = t["nbytes"]
            where = more.stream_range(path)
            blob = more.blob_file(path, "w", where)
            frames, skippable = self.zstd_frames(blob)
            if frames != 1 or skippable:
                raise BenchError(f"{path.name}: {frames} frames, {skippable} skippable; "
                                 "expected one frame")
            first, ttfb, base = [], [], []
            for i in range(self.runs):
                self.hot(blob)
                base.append(zstd_d(blob))
                with self.mounter.mount(path, [], tag="wf") as m:
                    self.hot(path, *where)
                    first.append(dd(m.mp / t["path"], 0, n))
                    if i == 0:
                        k = int(rng.integers(0, n - 4096))
                        self.same_bytes(m.mp / t["path"], k, npy, data_off + k, 4096, label)
                        st = m.stats()
                with self.mounter.mount(path, [], tag="wft") as m:
                    self.hot(path, *where)
                    ttfb.append(self.first_byte(m.mp / t["path"], 0))
                self.hot(blob)
                base.append(zstd_d(blob))
            self.note(f"one frame, {label}: {where[1] / MiB:.1f} MiB -> {n / MiB:.0f} MiB; "
                      f"first read: {st['decompressions']} decodes, {st['reads']} read requests")
            what = "zstd -d -c of the frame > /dev/null"
            self.throughput_row(f"one zstd frame, {label}: first read (fresh mount), {dl}", n,
                                first, base, 1.0, what)
            ms, whole = median(ttfb) * 1e3, median(first) * 1e3
            self.row(f"  time to the first 4 KiB (open+pread at 0, fresh mount); baseline: "
                     f"the first read of the whole frame", ms, whole, whole / ms,
                     "< whole frame", ms < whole / 4, "ms",
                     dict(s=ttfb, baseline_s=first, baseline="first read of the whole tensor"))

    def section_formats(self):
        log("safetensors, GGUF, zTensor v1, deathtensors, npz, ONNX, HDF5, .pt: raw "
            "first read vs dd, beside the .zt")
        f, more = self.files, self.more
        _, _, st_file, gguf_file = more.single()
        self.check_foreign_offsets(st_file, gguf_file)
        cases = [(".zt v0.1 (pack)", f.raw, f.tensor(f.raw, "w")),
                 ("safetensors (safetensors.numpy.save_file)", st_file,
                  more.info(st_file)["w"]),
                 ("GGUF (gguf.GGUFWriter, F32)", gguf_file, more.info(gguf_file)["w"])]
        ranges = {label: blob_range(t) for label, _, t in cases}
        for label, path in more.formats_more().items():
            t = more.info(path)["w"]
            if t["encoding"] != "raw":
                raise BenchError(f"{path.name}: w is {t['encoding']}, not raw")
            cases.append((label, path, t))
            ranges[label] = more.stream_range(path)
        for label, path, t in cases[3:]:
            off, n = ranges[label]
            if n != t["nbytes"]:
                raise BenchError(f"{path.name}: w stored in {n} bytes, not {t['nbytes']}")
            with open(path, "rb") as fh:  # the values single() wrote: the same as GGUF's
                fh.seek(off)
                head = fh.read(4096)
            g_off = ranges[cases[2][0]][0]
            with open(gguf_file, "rb") as fh:
                fh.seek(g_off)
                if fh.read(4096) != head:
                    raise BenchError(f"{path.name}: w's bytes at {off} differ from GGUF's")
        times = {c[0]: ([], []) for c in cases}
        for i in range(self.runs):
            order = cases[i % len(cases):] + cases[:i % len(cases)]
            for label, path, t in order:
                off, n = ranges[label]
                c, b = self.cold_dd(path, t["path"], off, n, tag="fmt")
                times[label][0].append(c)
                times[label][1].append(b)
        dl = self.mode_label(self.default_mode)
        ratios = {}
        for label, path, t in cases:
            n = t["nbytes"]
            mt, bt = times[label]
            ratios[label] = median(bt) / median(mt)
            self.throughput_row(f"{label}, raw f32 {n / MiB:.0f} MiB at offset "
                                f"{ranges[label][0]}: seq read, cold (fresh mount), {dl}", n,
                                mt, bt, 0.4, "dd bs=1M of the tensor's range of the file")
        zt = ratios[cases[0][0]]
        for label, _, _ in cases[1:]:
            r = ratios[label]
            self.row(f"  {label.split(' (')[0]} row's ratio / the .zt row's ratio (same run)",
                     r, zt, r / zt, ">= 0.90x", r / zt >= 0.9, "x", None)

    def check_foreign_offsets(self, st_file, gguf_file):
        """The tensor offsets `info --json` gives, computed again from the
        formats' headers (safetensors' JSON header; gguf.GGUFReader)."""
        with open(st_file, "rb") as fh:
            hlen = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(hlen))
        a, b = header["w"]["data_offsets"]
        want = {st_file: (8 + hlen + a, b - a)}
        try:
            import gguf
        except ImportError as e:
            raise BenchError(f"the gguf package is missing ({e}): scripts/setup.sh installs it")
        r = gguf.GGUFReader(gguf_file)
        (gt,) = [t for t in r.tensors if t.name == "w"]
        want[gguf_file] = (int(gt.data_offset), int(gt.n_bytes))
        del r
        for path, (off, n) in want.items():
            got = blob_range(self.more.info(path)["w"])
            if got != (off, n):
                raise BenchError(f"{path.name}: info --json gives [{got[0]}, +{got[1]}), the "
                                 f"header [{off}, +{n})")

    def view_ranges(self, m, t):
        """{view: (path in the mount, offset of the tensor's bytes in it)}
        for tensor t: its own file, its .npy, its zarr chunk, its range in
        .safetensors/model.safetensors. The bytes at each are checked against
        the tensor file's (4 KiB at a random place)."""
        rel = t["path"]
        out = {"tensor file": (rel, 0)}
        npy = f".npy/{rel}.npy"
        with open(m.mp / npy, "rb") as fh:
            head = fh.read(12)
        if head[:6] != b"\x93NUMPY":
            raise BenchError(f"{npy}: not a .npy file")
        if head[6] == 1:
            data = 10 + int.from_bytes(head[8:10], "little")
        else:
            data = 12 + int.from_bytes(head[8:12], "little")
        out[".npy"] = (npy, data)
        arr = json.loads((m.mp / f".zarr/{rel}/zarr.json").read_text())
        chunk = f".zarr/{rel}/c/" + "/".join("0" * len(arr["shape"]))
        if os.path.getsize(m.mp / chunk) != t["nbytes"]:
            raise BenchError(f"{chunk}: {os.path.getsize(m.mp / chunk)} bytes, not the "
                             f"tensor's {t['nbytes']} (a codec?)")
        out[".zarr chunk"] = (chunk, 0)
        st = ".safetensors/model.safetensors"
        with open(m.mp / st, "rb") as fh:
            hlen = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(hlen))
        a, b = header[t["name"]]["data_offsets"]
        if b - a != t["nbytes"]:
            raise BenchError(f"{st}: {t['name']} has {b - a} bytes, not {t['nbytes']}")
        out[".safetensors range"] = (st, 8 + hlen + a)
        k = int(np.random.default_rng(3).integers(0, t["nbytes"] - 4096)) // 4 * 4
        for v, (p, o) in out.items():
            self.same_bytes(m.mp / p, o + k, m.mp / rel, k, 4096, f"view {v} of {rel}")
        return out

    # passthrough ----------------------------------------------------

    def pt_files(self):
        """The passthrough section's files: a safetensors model written by
        safetensors.numpy (pt_n float32 tensors of pt_tensor bytes), the
        same values as one .npy file per tensor, and a `pack --zstd` file
        of them (1 MiB frames)."""
        d = self.work / "passthrough"
        n, size = self.sizes["pt_n"], self.sizes["pt_tensor"]
        st, zt = d / "model.safetensors", d / "model_zstd.zt"
        npys = [d / f"t{i}.npy" for i in range(n)]
        want = dict(n=n, size=size, version=1)
        manifest = d / "manifest.json"
        if not (manifest.exists() and json.loads(manifest.read_text()) == want
                and st.exists() and zt.exists() and all(p.exists() for p in npys)):
            import safetensors.numpy
            d.mkdir(exist_ok=True)
            tensors = {}
            for i, p in enumerate(npys):
                write_normal_npy(p, size // 4, seed=100 + i)
                tensors[f"layer{i}.weight"] = np.load(p)
            safetensors.numpy.save_file(tensors, st)
            del tensors
            run([BIN, "pack", zt, *[f"layer{i}.weight={p}" for i, p in enumerate(npys)],
                 "--zstd"], capture_output=True, text=True)
            manifest.write_text(json.dumps(want))
        return st, zt, npys

    @staticmethod
    def settled(m):
        """Waits until the mount fills no backing file, reads no clone's
        pages in, and has heard of every close (an inode the daemon still
        serves is not passed through)."""
        for _ in range(6000):
            s = m.stats()
            if (s.get("backing_filling", 0) == 0 and s.get("open_files_served", 0) == 0
                    and s.get("backing_warming", 0) == 0):
                return s
            time.sleep(0.005)
        raise BenchError("backing files still filling (or clones read in) after 30 s")

    @staticmethod
    def drop_pages(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def section_passthrough(self):
        import safetensors.numpy
        log("passthrough: loaders through the mount against the same loader on the file")
        st, zt, npys = self.pt_files()
        total = st.stat().st_size
        view = ".safetensors/model.safetensors"
        load = lambda p: safetensors.numpy.load_file(str(p))

        hot, base, cold, cold_base, off_t = [], [], [], [], []
        for _ in range(self.runs):
            self.hot(st)
            base.append(timed(lambda: load(st)))
            with self.mounter.mount(st, [], tag="pt") as m:
                self.hot(st)
                hot.append(timed(lambda: load(m.mp / view)))
                self.drop_pages(st)
                cold.append(timed(lambda: load(m.mp / view)))
                stats = m.stats()
            with self.mounter.mount(st, ["--no-passthrough"], tag="pt-off") as m:
                self.hot(st)
                off_t.append(timed(lambda: load(m.mp / view)))
            self.drop_pages(st)
            cold_base.append(timed(lambda: load(st)))
        self.note(f"passthrough: safetensors view, {stats['passthrough_opens']} passthrough "
                  f"opens, {stats['bytes_served']} bytes served by the daemon")
        what = "safetensors.numpy.load_file of the file"
        self.throughput_row("safetensors.numpy.load_file of the .safetensors view of a "
                            "safetensors file (passthrough, hot)", total, hot, base, 0.9, what)
        self.throughput_row("  same, --no-passthrough (the daemon serves it)", total, off_t,
                            base, None, what)
        self.throughput_row("  same, cold (the file's pages dropped before each sample, both)",
                            total, cold, cold_base, 1.0, what + ", cold")

        # A zstd tensor after its first read: its backing file against a
        # raw file of the same values.
        name, raw_npy = "layer0.weight", npys[0]
        # The baseline reads a file of the tensor's bytes alone, from 0 as
        # the mounted tensor file is read: on this host the kernel's copy
        # into the reader's buffer runs at a third of its speed when the
        # file offset and the buffer share their place in a 4 KiB page
        # (4K aliasing), so a baseline read at another offset (the .npy's
        # 128) would not be the same work.
        raw_bin = raw_npy.with_suffix(".bin")
        if not raw_bin.exists() or raw_bin.stat().st_size != self.sizes["pt_tensor"]:
            np.load(raw_npy).tofile(raw_bin)
        buf = bytearray(self.sizes["pt_tensor"])
        second, base_read, mm, base_mm, first = [], [], [], [], []
        for _ in range(self.runs):
            self.hot(raw_bin)
            base_read.append(timed(lambda: self.read_into(raw_bin, 0, len(buf), buf)))
            self.hot(raw_npy)
            base_mm.append(timed(lambda: np.load(raw_npy, mmap_mode="r").sum()))
            with self.mounter.mount(zt, [], tag="ptz") as m:
                self.hot(zt)
                p = m.mp / name
                first.append(timed(lambda: self.read_into(p, 0, len(buf), buf)))
                np.load(m.mp / ".npy" / f"{name}.npy", mmap_mode="r").sum()
                self.settled(m)
                second.append(timed(lambda: self.read_into(p, 0, len(buf), buf)))
                mm.append(timed(lambda: np.load(m.mp / ".npy" / f"{name}.npy",
                                                mmap_mode="r").sum()))
                stats = m.stats()
        self.note(f"passthrough: zstd tensor, {stats['backing_files']} backing files "
                  f"({stats['backing_bytes']} bytes), {stats['passthrough_opens']} passthrough opens")
        size = len(buf)
        self.throughput_row(f"zstd tensor (pack --zstd, 1 MiB frames) {size / MiB:.0f} MiB, "
                            "first readinto (the daemon decodes; the fill follows the close)",
                            size, first, base_read, None,
                            "readinto of a file of the same bytes alone, from 0")
        self.throughput_row("  same, second readinto (backing file)", size, second, base_read,
                            0.9, "readinto of a file of the same bytes alone, from 0")
        self.throughput_row("  np.load(.npy view, mmap_mode='r').sum() after the first read",
                            size, mm, base_mm, 0.9, "the same on a .npy file of the same values")

        # The whole zstd model through its safetensors view, after a first
        # load: loaded again at once (while its fill may still run), then
        # once the fill is done.
        zfirst, zagain, zsecond = [], [], []
        for _ in range(self.runs):
            with self.mounter.mount(zt, [], tag="ptzv") as m:
                self.hot(zt)
                zfirst.append(timed(lambda: load(m.mp / view)))
                zagain.append(timed(lambda: load(m.mp / view)))
                self.settled(m)
                zsecond.append(timed(lambda: load(m.mp / view)))
        self.throughput_row("safetensors.numpy.load_file of the .safetensors view of the "
                            "pack --zstd model, first load", total, zfirst, base, None,
                            "safetensors.numpy.load_file of the raw safetensors file")
        self.throughput_row("  same, loaded again at once (served while the fill runs, "
                            "unless the first load wrote nearly all)", total, zagain, base,
                            None, "safetensors.numpy.load_file of the raw safetensors file")
        self.throughput_row("  same, second load (backing file)", total, zsecond, base, 0.9,
                            "safetensors.numpy.load_file of the raw safetensors file")

    def section_views(self):
        log("views: .npy, zarr chunk and .safetensors against the tensor's own file")
        f = self.files
        cases = [("raw f32 (raw.zt)", f.raw, "w"),
                 ("zstd f32, 1 MiB frames (zstd_frames.zt)", f.zframes, "f32")]
        dl = self.mode_label(self.default_mode)
        for label, zt, name in cases:
            t = f.tensor(zt, name)
            n = t["nbytes"]
            with self.mounter.mount(zt, [], tag="views") as m:
                views = self.view_ranges(m, t)
            times = {v: [] for v in views}
            for i in range(self.runs):
                order = list(views)
                order = order[i % len(order):] + order[:i % len(order)]
                for v in order:
                    p, o = views[v]
                    with self.mounter.mount(zt, [], tag="view") as m:
                        self.hot(zt, t["offset"], t["size"])
                        times[v].append(dd(m.mp / p, o, n))
            base = times.pop("tensor file")
            for v, mt in times.items():
                self.throughput_row(f"view {v} of {label} {n / MiB:.0f} MiB: the tensor's bytes, "
                                    f"cold (fresh mount), {dl}", n, mt, base, 0.95,
                                    "the tensor's own file, same dd, fresh mount")

    def hot_load(self, jobs, read):
        """One hot sample: the median of three loads in a row. A hot load
        takes about 0.2 s, and one in three or so took three times that on
        this VM, which one sample on either side of a row would carry."""
        return median([self.load(jobs, read) for _ in range(3)])

    def load(self, jobs, read, poll=None):
        """Runs read(job, buf) for every job on the section's reader threads,
        each taking the next job in order (as a loader's pool does); calls
        poll() every 5 ms meanwhile. Seconds."""
        nxt = [0]
        lock = threading.Lock()
        errors = []

        def worker(buf):
            while not errors:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= len(jobs):
                    return
                try:
                    read(jobs[i], buf)
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(e)

        threads = [threading.Thread(target=worker, args=(b,)) for b in self.model_bufs]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            if poll:
                poll()
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        for th in threads:
            th.join()
        if errors:
            raise BenchError(f"model load: {errors[0]}")
        return dt

    @staticmethod
    def read_into(path, off, n, buf, shift=0):
        """Reads [off, off+n) of path into buf[shift:]. With shift = off %
        4096 a read at an offset into buf lines up in the page as a read
        from 0 into buf does: on this host the kernel's copy runs at a third
        of its speed when file offset and buffer share their place in a
        4 KiB page (4K aliasing), so both sides of a row must line up alike."""
        view = memoryview(buf)[shift:]
        fd = os.open(path, os.O_RDONLY)
        try:
            got = 0
            while got < n:
                k = os.preadv(fd, [view[got:n]], off + got)
                if k <= 0:
                    raise BenchError(f"short read at {got} of {n} of {path}")
                got += k
        finally:
            os.close(fd)

    def section_model(self):
        s = self.more.sizes
        readers = s["model_readers"]
        cache = self.sizes["rss_cache"]
        cap = self._size(cache) + 64 * MiB
        models = self.more.model()
        log(f"whole model: {s['model_n']} tensors read whole by {readers} readers, through "
            f"the mount (--cache-size {cache}) and directly")
        ref_label = next(iter(models))
        ref = self.more.info(models[ref_label])
        biggest = max(t["nbytes"] for t in ref.values())
        self.model_bufs = [bytearray(biggest + 4096) for _ in range(readers)]
        for b in self.model_bufs:
            b[:] = b"\1" * len(b)  # faulted in once, outside the timings
        dl = self.mode_label(self.default_mode)
        raw_bt = None  # the raw v0.1 model's baseline: a zstd model's second load is held to it
        for label, path in models.items():
            info = self.more.info(path)
            if sorted(info) != sorted(ref):
                raise BenchError(f"{path.name}: tensors differ from {models[ref_label].name}")
            jobs = [(t["name"], t["path"], *blob_range(t), t["nbytes"]) for t in info.values()]
            zstd = any(t["encoding"] != "raw" for t in info.values())
            total = sum(j[4] for j in jobs)
            blobs = {j[0]: self.more.blob_file(path, j[0]) for j in jobs} if zstd else {}
            mt, bt, serial, hwm, anon, again = [], [], [], [], [], []

            def direct(job, buf):
                name, _, off, stored, n = job
                if zstd:
                    run(["zstd", "-d", "-c", "-q", blobs[name]], stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE, text=True)
                else:
                    self.read_into(path, off, n, buf, shift=off % 4096)

            def warm():
                self.hot(path)
                for b in blobs.values():
                    self.hot(b)

            for i in range(self.runs):
                warm()
                # The zstd baseline (4 workers running zstd -d) is not a
                # hot load: one sample each.
                bt.append(self.load(jobs, direct) if zstd else self.hot_load(jobs, direct))
                if zstd:
                    warm()
                    t0 = time.perf_counter()
                    for j in jobs:
                        direct(j, None)
                    serial.append(time.perf_counter() - t0)
                with self.mounter.mount(path, ["--cache-size", cache], tag="model") as m:
                    self.hot(path)
                    peak = [0]

                    def poll():
                        peak[0] = max(peak[0], m.status()["RssAnon"])

                    mt.append(self.load(
                        jobs, lambda job, buf: self.read_into(m.mp / job[1], 0, job[4], buf),
                        poll))
                    st = m.stats()
                    hwm.append(m.status()["VmHWM"])
                    anon.append(peak[0])
                    if zstd:
                        # Decoded tensors are backed once filled: the second load.
                        self.settled(m)
                        again.append(self.hot_load(
                            jobs, lambda job, buf: self.read_into(m.mp / job[1], 0, job[4], buf)))
                        st = m.stats()
                    if i == 0:
                        small = min(jobs, key=lambda j: j[4])
                        big = max(jobs, key=lambda j: j[4])
                        for j in (small, big):
                            r = ref[j[0]]
                            self.same_bytes(m.mp / j[1], 0, models[ref_label],
                                            blob_range(r)[0], j[4], f"{path.name}:{j[0]}")
            sizes = [j[4] for j in jobs]
            if zstd:
                # What the baseline pays that a decoder in a loader would
                # not: one zstd process per blob.
                smallest = blobs[min(jobs, key=lambda j: j[3])[0]]
                self.hot(smallest)
                spawn = median([zstd_d(smallest) for _ in range(20)])
                self.note(f"model {label}: the zstd -d baseline starts {len(jobs)} processes; "
                          f"one on the smallest blob ({smallest.stat().st_size >> 10} KiB) "
                          f"takes {spawn * 1e3:.1f} ms, {len(jobs) * spawn:.2f} s in all of "
                          f"the serial baseline's {median(serial):.2f} s")
            self.note(f"model {label}: {len(jobs)} tensors, {total / MiB:.0f} MiB decoded "
                      f"({min(sizes) >> 10} KiB .. {max(sizes) / MiB:.0f} MiB), stored "
                      f"{sum(j[3] for j in jobs) / MiB:.0f} MiB; mount: {st['reads']} read "
                      f"requests, {st.get('decompressions', 0)} decodes, cache peak "
                      f"{st.get('cache_peak_bytes', 0) / MiB:.0f} MiB, peak RssAnon "
                      f"{median(anon) / MiB:.0f} MiB")
            # Issue 24's targets: a zstd model's first load against zstd -d
            # run one tensor after another (the parallel row is for
            # information); a raw model 0.9x where its tensors are backed
            # files (passed through), else 0.6x (the FUSE path).
            if zstd:
                what = f"{readers} workers running zstd -d -c of each blob > /dev/null"
                target = None
                path_note = ""
            else:
                what = f"{readers} readers reading each tensor's range of the file (preadv)"
                backed = st.get("passthrough_opens", 0) >= len(jobs)
                target = 0.9 if backed else 0.6
                path_note = ", passed through" if backed else ", FUSE path"
            self.throughput_row(f"whole model, {label}: {len(jobs)} tensors read whole by "
                                f"{readers} readers, cold (fresh mount), {dl}{path_note}",
                                total, mt, bt, target, what)
            if serial:
                self.throughput_row("  same, against one zstd -d after another (one thread)",
                                    total, mt, serial, 1.3,
                                    "zstd -d -c of each blob in turn > /dev/null")
            if not zstd and raw_bt is None:
                raw_bt = bt
            if again and raw_bt:
                # Three second loads per mount (see above); the first load
                # passed nothing through.
                each = st.get("passthrough_opens", 0) // 3
                self.throughput_row(f"  same, second load in that mount ({each} opens passed "
                                    "through in each)", total, again, raw_bt, 0.9,
                                    f"{readers} readers reading each tensor's range of the raw "
                                    "v0.1 model (preadv)")
            hw = median(hwm)
            self.row(f"  peak daemon RSS (VmHWM) in that load, --cache-size {cache}", hw / MiB,
                     None, None, f"<= {cap / MiB:.0f} MiB", hw <= cap, "MiB",
                     dict(bytes=hwm, rss_anon=anon))
        self.model_bufs = None
        self.random_peeks(models["zt v0.1 zstd (pack --zstd)"])

    def random_peeks(self, path):
        """Many threads reading 64 KiB at random offsets of random tensors
        of a zstd model, a small cache: the served path with passthrough
        (which must not cost these peeks a backing file each) against the
        same mount with --no-passthrough."""
        threads, per, cache = 48, 20, "8M"
        names = [t["path"] for t in self.more.info(path).values()]
        rng = np.random.default_rng(29)
        picks = [[(names[int(rng.integers(len(names)))], float(rng.random()))
                  for _ in range(per)] for _ in range(threads)]

        def peeks(mp):
            def one(todo):
                for name, at in todo:
                    fd = os.open(mp / name, os.O_RDONLY)
                    try:
                        n = os.fstat(fd).st_size
                        os.pread(fd, 64 << 10, int(at * max(1, n - (64 << 10))) // 4096 * 4096)
                    finally:
                        os.close(fd)
            ts = [threading.Thread(target=one, args=(todo,)) for todo in picks]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return time.perf_counter() - t0

        log(f"random peeks: {threads} threads x {per} reads of 64 KiB, --cache-size {cache}")
        on, off = [], []
        for _ in range(self.runs):
            self.hot(path)
            for opts, into in (([], on), (["--no-passthrough"], off)):
                with self.mounter.mount(path, ["--cache-size", cache, *opts], tag="peek") as m:
                    into.append(peeks(m.mp))
        n = threads * per
        self.row(f"random 64 KiB peeks at the zstd model's tensors, {threads} threads x {per} "
                 f"(open, pread, close), --cache-size {cache}, fresh mount, passthrough",
                 n / median(on) / 1e3, n / median(off) / 1e3, median(off) / median(on), "-",
                 None, "k reads/s", dict(mount_s=on, baseline_s=off,
                                          baseline="the same mount with --no-passthrough"))

    def section_reflink(self):
        """Raw tensors backed by clones of their ranges (FICLONERANGE): the
        ztensor 2.x raw model (every tensor on a 4 KiB block) and
        --cache-dir on one loop-mounted XFS, against the same readers on
        that file. A clone shares the source's disk blocks, not its page
        cache: the daemon serves a tensor's first load from the source's
        pages, makes the clone at its close and reads the clone's pages in
        while it serves nothing; later opens are passed through."""
        s = self.more.sizes
        readers = s["model_readers"]
        label = "zt v2 raw (ztensor 2.x)"
        model = self.more.model()[label]
        info = self.more.info(model)
        jobs = [(t["name"], t["path"], *blob_range(t), t["nbytes"]) for t in info.values()]
        total = sum(j[4] for j in jobs)
        big = max(jobs, key=lambda j: j[4])
        self.model_bufs = [bytearray(big[4] + 4096) for _ in range(readers)]
        for b in self.model_bufs:
            b[:] = b"\1" * len(b)  # faulted in once, outside the timings
        log(f"reflink: {label} and --cache-dir on a loop-mounted XFS")

        with reflink_fs(self.work, model.stat().st_size + 512 * MiB) as fs:
            src = fs / model.name
            run(["cp", "--reflink=never", model, src])
            os.sync()
            cache = fs / "cache"
            cache.mkdir()
            opts = ["--cache-dir", cache]

            def direct(job, buf):
                self.read_into(src, job[2], job[4], buf, shift=job[2] % 4096)

            def through(m):
                return lambda job, buf: self.read_into(m.mp / job[1], 0, job[4], buf)

            hot_b, cold_b, first, second, cold, settle = [], [], [], [], [], []
            for i in range(self.runs):
                self.hot(src)
                hot_b.append(self.hot_load(jobs, direct))
                with self.mounter.mount(src, opts, tag="rl") as m:
                    self.hot(src)
                    first.append(self.load(jobs, through(m)))
                    settle.append(timed(lambda: self.settled(m)))
                    second.append(self.hot_load(jobs, through(m)))
                    st = m.stats()
                    if i == 0:
                        self.same_bytes(m.mp / big[1], 0, model, big[2], big[4],
                                        f"{src.name}:{big[0]} (clone)")
                with self.mounter.mount(src, opts, tag="rl") as m:
                    self.drop_pages(src)
                    cold.append(self.load(jobs, through(m)))
                self.drop_pages(src)
                cold_b.append(self.load(jobs, direct))
            # One tensor: readinto, and np.load(mmap_mode="r") of its .npy
            # view (its header fills a page: a file of the header and a
            # clone backs it), each after a first read of that file.
            buf = self.model_bufs[0]
            n, off = big[4], big[2]
            npy = lambda m: m.mp / ".npy" / f"{big[1]}.npy"
            read_t, read_b, mm, mm_b = [], [], [], []
            for _ in range(self.runs):
                self.hot(src)
                read_b.append(timed(lambda: self.read_into(src, off, n, buf, shift=off % 4096)))
                mm_b.append(memmap_sum(src, off, n // 4)[0])
                with self.mounter.mount(src, opts, tag="rl1") as m:
                    self.read_into(m.mp / big[1], 0, n, buf)
                    np.load(npy(m), mmap_mode="r").sum()
                    self.settled(m)
                    read_t.append(timed(lambda: self.read_into(m.mp / big[1], 0, n, buf)))
                    mm.append(timed(lambda: np.load(npy(m), mmap_mode="r").sum()))
                    st1 = m.stats()
        self.model_bufs = None
        self.note(f"reflink: {label}, {len(jobs)} tensors: {st.get('backing_clones', 0)} clones, "
                  f"{st.get('fuse_opens', 0)} opens served and {st.get('passthrough_opens', 0)} "
                  f"passed through over the first load and three second loads; the clones' pages read in "
                  f"{median(settle):.2f} s after the first; one tensor of {n / MiB:.0f} MiB: "
                  f"{st1.get('backing_clones', 0)} clones (its file, its .npy view), "
                  f"{st1.get('passthrough_opens', 0)} passthrough opens")
        if st1.get("passthrough_opens", 0) < 2:
            raise BenchError(f"reflink: {st1.get('passthrough_opens', 0)} of one tensor's file's "
                             "and its .npy view's opens were passed through")
        if st.get("passthrough_opens", 0) < 3 * len(jobs):
            raise BenchError(f"reflink: {st.get('passthrough_opens', 0)} of the three second "
                             f"loads' {3 * len(jobs)} opens were passed through")
        what = f"{readers} readers reading each tensor's range of the file (preadv)"
        self.throughput_row(f"whole model, {label}, --cache-dir sharing blocks: {len(jobs)} "
                            f"tensors read whole by {readers} readers, first load (fresh mount, "
                            "the daemon serves it, FUSE path)", total, first, hot_b, 0.6, what)
        self.throughput_row("  same, second load, once the clones' pages are read in (passed "
                            "through)", total, second, hot_b, 0.9, what)
        self.throughput_row("  same, cold: a fresh mount with the file's pages dropped, against "
                            "the file cold", total, cold, cold_b, 1.0, what + ", cold")
        self.throughput_row(f"one tensor of it, {n / MiB:.0f} MiB, backed by its clone: readinto "
                            "after a first read", n, read_t, read_b, 0.9,
                            "readinto of its range of the file")
        self.throughput_row("  np.load(.npy view, mmap_mode='r').sum() after a first read of "
                            "the view, backed by its header and a clone", n, mm, mm_b, 0.9,
                            "np.memmap of its range of the file, .sum()")

    @staticmethod
    def _size(s):
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)

    # driver ---------------------------------------------------------

    def machine(self):
        mem = int(open("/proc/meminfo").read().split()[1]) * 1024
        cpu = "?"
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        try:
            mpl = open("/proc/sys/fs/fuse/max_pages_limit").read().strip()
        except OSError:
            mpl = "?"
        zv = subprocess.run(["zstd", "--version"], capture_output=True, text=True).stdout
        zv = re.search(r"v[\d.]+", zv)
        git = lambda *a: subprocess.run(["git", "-C", ROOT, *a], capture_output=True,
                                        text=True).stdout.strip()
        dirty = git("status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock")
        return dict(nproc=os.cpu_count(), ram_gib=round(mem / GiB, 1), cpu=cpu,
                    kernel=platform.release(), max_pages_limit=mpl,
                    zstd=zv.group(0) if zv else "?",
                    commit=git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else ""))

    def run(self):
        sections = {
            "raw": self.section_raw,
            "memmap": self.section_memmap,
            "zstd": self.section_zstd,
            "ttfb": self.section_ttfb,
            "random": self.section_random,
            "many": self.section_many,
            "rss": self.section_rss,
            "v2": self.section_v2,
            "formats": self.section_formats,
            "writers": self.section_writers,
            "views": self.section_views,
            "model": self.section_model,
            "remote": self.section_remote,
            "hub": self.section_hub,
            "passthrough": self.section_passthrough,
            "reflink": self.section_reflink,
        }
        only = self.args.only.split(",") if self.args.only else list(sections)
        for s in only:
            if s not in sections:
                raise BenchError(f"--only: unknown section {s!r} (one of {', '.join(sections)})")
        mach = self.machine()
        log(f"{self.mode} run, {self.runs} runs per figure, work dir {self.work}; machine {mach}")
        if self.args.wait_quiet:
            deadline = time.time() + 60 * self.args.wait_quiet
            while busy_processes() and time.time() < deadline:
                log(f"waiting for {len(busy_processes())} cargo/fuzzer processes to finish")
                time.sleep(30)
        if busy_processes():
            log(f"WARNING: {len(busy_processes())} fuzzer/cargo processes are running: "
                "figures will be distorted")
        self.files = Files(self.work, self.sizes, self.args.regen, many_only=only == ["many"])
        # The writers' files only for the sections that read them.
        if {"v2", "formats", "writers", "views", "model", "remote", "reflink"} & set(only):
            self.more = More(self.work, MORE_SIZES[self.mode], self.args.regen)
        self.files.warm()
        if not self.files.many_only:  # the many section mounts with defaults only
            self.detect_modes()
        fm = fresh_memory(False), fresh_memory(True)
        t0 = time.perf_counter()
        noisy = []
        current = [None]
        stop = threading.Event()

        def watch():  # other heavy work on the machine, every 5 s
            while not stop.wait(5):
                if current[0] and current[0] not in noisy and busy_processes():
                    noisy.append(current[0])

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for s in only:
            current[0] = s
            if busy_processes() and s not in noisy:
                noisy.append(s)
            sections[s]()
        stop.set()
        watcher.join()
        if noisy:
            self.notes.append(f"WARNING: cargo/fuzzer processes ran during: {', '.join(noisy)}")
        fm2 = fresh_memory(False), fresh_memory(True)
        for k, pages in enumerate(("small", "huge")):
            self.notes.append(
                f"machine: first write to 1 GiB of new memory in {pages} pages: "
                f"{fm[k][0]:.2f} / {fm2[k][0]:.2f} GB/s (before / after the run) when it was "
                f"freed 3 s earlier, {fm[k][1]:.2f} / {fm2[k][1]:.2f} GB/s when freed just "
                f"before (free page reporting returns idle guest memory to the host)")
        elapsed = time.perf_counter() - t0
        self.notes.append(f"page cache: before every sample its byte range of the backing file "
                          f"was read and checked with mincore; lowest residency seen "
                          f"{self.hot.min_seen:.1%}, {self.hot.rewarms} re-reads needed")
        self.print_table(mach, elapsed)
        out = self.work / "results.json"
        out.write_text(json.dumps(dict(machine=mach, mode=self.mode, runs=self.runs,
                                       rows=self.rows, notes=self.notes,
                                       samples=self.raw_samples), indent=1))
        log(f"samples and notes: {out}")

    def print_table(self, mach, elapsed):
        hdr = ["metric", "mount", "baseline", "ratio", "target", "result"]
        lines = []
        for r in self.rows:
            lines.append([
                r["metric"],
                fmt_val(r["mount"], r["unit"]),
                fmt_val(r["baseline"], r["unit"]),
                "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
                r["target"],
                {True: "PASS", False: "MISS", None: "info"}[r["ok"]],
            ])
        widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(hdr)]

        def fmt(cells):
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

        print(f"ztensor-mount benchmark ({self.mode}; median of {self.runs}; raw, memmap "
              f"and zstd baselines of {2 * self.runs}, taken around each round; "
              f"{mach['nproc']} cores, {mach['ram_gib']} GiB, Linux {mach['kernel']}, "
              f"max_pages_limit {mach['max_pages_limit']}, zstd {mach['zstd']}; "
              f"commit {mach['commit']}; {elapsed:.0f} s)")
        print(fmt(hdr))
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for l in lines:
            print(fmt(l))
        print("- baselines: raw = `dd bs=1M iflag=skip_bytes,count_bytes` of the tensor's byte "
              "range of the .zt (the same dd command reads the mounted file); memmap = "
              "np.memmap of the .zt at the tensor's offset; zstd = `zstd -d -c -q BLOB > "
              "/dev/null` of the tensor's blob; random = os.pread of the .zt; ls = `ls -l` of a "
              "directory of the same names (empty files) on the backing disk; views = the "
              "tensor's own file through a fresh mount; whole model = the same reader "
              "threads on the file's ranges (raw) or running `zstd -d` of each blob; remote = "
              "curl of the same blocks, 4 ranged GETs at a time (or of the same 4 KiB), and dd "
              "of the .zt with its pages evicted for the second read. ratio = "
              "baseline time / mount time (higher is better)")
        for n in self.notes:
            print(f"- {n}")
        sys.stdout.flush()


def fmt_val(v, unit):
    if v is None:
        return "-"
    if unit == "GB/s":
        return f"{v:.2f} GB/s"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "s":
        return f"{v:.3f} s"
    if unit == "MiB":
        return f"{v:.0f} MiB"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v:.1f} {unit}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small files (64 MiB raw, 32 MiB zstd, 5000 tensors), 3 runs")
    ap.add_argument("--workdir", default="/var/tmp/ztbench",
                    help="where files and mountpoints go (default /var/tmp/ztbench)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the generated files for the next run (they are reused "
                         "when the sizes match)")
    ap.add_argument("--regen", action="store_true", help="regenerate the files")
    ap.add_argument("--runs", type=int, help="samples per figure (default 5, quick 3)")
    ap.add_argument("--wait-quiet", type=float, metavar="MINUTES",
                    help="first wait up to MINUTES for cargo/fuzzer processes to finish")
    ap.add_argument("--only", help="comma-separated sections: raw,memmap,zstd,ttfb,random,"
                                   "many,rss,v2,formats,views,model,remote,hub,passthrough")
    args = ap.parse_args()
    if args.runs is not None and args.runs < (1 if args.quick else 3):
        ap.error("--runs must be at least 3 (figures are medians); --quick allows 1, "
                 "to try a section out")
    for tool in ("dd", "zstd", "fincore", "pgrep", "ls", "curl"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is missing (scripts/bench.sh installs it)")
    if not BIN.exists() or not MANY_BIN.exists():
        sys.exit("bench: build first: cargo build --release --bins --example bench_many")

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    bench = Bench(args)
    code = 0
    try:
        bench.run()
    except BenchError as e:
        log(f"FAILED: {e}")
        code = 1
    except KeyboardInterrupt:
        log("interrupted")
        code = 130
    finally:
        bench.mounter.unmount_all()
        if not args.keep and code == 0 and not bench.mounter.mounts_under_work():
            for p in bench.work.iterdir():
                if p.name not in ("results.json", "logs"):
                    if p.is_dir():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        p.unlink(missing_ok=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
