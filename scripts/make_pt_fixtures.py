#!/usr/bin/env python3
"""Writes the PyTorch `.pt` fixtures of tests/format_pt.rs with torch itself.

Run with a Python that has torch and numpy (not the CI venv: torch is too
big for it), from the repository root:

    python3 -m venv /var/tmp/torchvenv
    /var/tmp/torchvenv/bin/pip install torch numpy
    /var/tmp/torchvenv/bin/python scripts/make_pt_fixtures.py [OUT_DIR]

OUT_DIR defaults to tests/fixtures/pt. For each fixture FILE.pt it writes
FILE/NAME.bin, the tensor's elements as torch holds them logically
(little-endian, C order, made contiguous first), and one manifest.json
naming every tensor with its torch dtype, shape, byte size, sha256, and
whether torch stores it contiguously and at a nonzero storage offset. The
test reads only these files: it needs no torch.
"""

import hashlib
import json
import os
import shutil
import sys

import numpy as np
import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "fixtures", "pt")


def exposed(t):
    """The bytes a reader must give: the logical elements, C order, LE."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.to(torch.uint8).numpy().tobytes()
    return flat.view(torch.uint8).numpy().tobytes()


def dtypes():
    g = torch.Generator().manual_seed(16)
    r = lambda *s: torch.randn(*s, generator=g)
    return {
        "f32": r(3, 4),
        "f16": r(5).half(),
        "bf16": r(2, 3).bfloat16(),
        "f64": r(4).double(),
        "i8": torch.tensor([-128, -1, 0, 1, 127], dtype=torch.int8),
        "i16": torch.tensor([[-32768, 2], [3, 32767]], dtype=torch.int16),
        "i32": torch.arange(-3, 3, dtype=torch.int32),
        "i64": torch.tensor([-(2**63), 2**63 - 1, 7], dtype=torch.int64),
        "u8": torch.tensor([0, 1, 254, 255], dtype=torch.uint8),
        "bool": torch.tensor([[True, False, True], [False, False, True]]),
        "c64": torch.complex(r(3), r(3)),
        "c128": torch.complex(r(2), r(2)).to(torch.complex128),
        # Saved through _rebuild_tensor_v3 on an untyped storage.
        "u16": torch.tensor([0, 1, 65535], dtype=torch.uint16),
        "u32": torch.tensor([0, 2**32 - 1], dtype=torch.uint32),
        "u64": torch.tensor([0, 2**63 + 5], dtype=torch.uint64),
        "f8_e4m3fn": r(4).to(torch.float8_e4m3fn),
        "f8_e5m2": r(4).to(torch.float8_e5m2),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "model": {"layers": {"0": {"weight": r(2, 2)}}},
        "model.layers.1.bias": r(2),
    }


def shared():
    base = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    return {
        "base": base,
        # Rows 2..4: contiguous, storage offset 8 elements into base's storage.
        "rows": base[2:5],
        "last": base[5],
        # The same tensor object under a second name (tied weights): the
        # pickle refers back to the first.
        "tied": base,
    }


def strided():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return {
        "plain": torch.arange(5, dtype=torch.int32),
        "transposed": base.t(),
        "every_other": torch.arange(10, dtype=torch.int64)[::2],
        "column": base[:, 1],
    }


def module():
    torch.manual_seed(16)
    m = torch.nn.Sequential(
        torch.nn.Embedding(5, 4),
        torch.nn.Linear(4, 3),
        torch.nn.LayerNorm(3),
    )
    return m.state_dict()


FIXTURES = {
    "dtypes": (dtypes, {}),
    "shared": (shared, {}),
    "strided": (strided, {}),
    "module": (module, {}),
    "legacy": (lambda: {"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor([7])},
               {"_use_new_zipfile_serialization": False}),
}


def flatten(prefix, obj, out):
    """The names our reader gives: nested dict keys joined with '.'."""
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    else:
        for k, v in obj.items():
            flatten(f"{prefix}.{k}" if prefix else k, v, out)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    manifest = {"torch": torch.__version__, "numpy": np.__version__, "files": {}}
    for stem, (make, kwargs) in FIXTURES.items():
        obj = make()
        path = os.path.join(OUT, f"{stem}.pt")
        torch.save(obj, path, **kwargs)
        # What torch reads back is what we expect.
        back = torch.load(path, weights_only=True)
        want = flatten("", obj, {})
        got = flatten("", back, {})
        assert sorted(want) == sorted(got), (stem, sorted(want), sorted(got))
        folder = os.path.join(OUT, stem)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        tensors = {}
        for name, t in want.items():
            assert exposed(t) == exposed(got[name]), name
            b = exposed(t)
            with open(os.path.join(folder, f"{name}.bin"), "wb") as f:
                f.write(b)
            tensors[name] = {
                "dtype": str(t.dtype),
                "shape": list(t.shape),
                "nbytes": len(b),
                "sha256": hashlib.sha256(b).hexdigest(),
                "contiguous": t.is_contiguous(),
                "storage_offset": t.storage_offset(),
            }
        manifest["files"][f"{stem}.pt"] = {"tensors": tensors, "torch.save": kwargs}
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(
        os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(OUT) for n in ns
    )
    print(f"wrote {OUT}: {total} bytes")


if __name__ == "__main__":
    main()
