"""Writes a small GGUF file (float tensors, with gguf's GGUFWriter) and a
zstd-compressed deathtensors file (with deathtensors' own writer), for the
views test: OUT_DIR/model.gguf, OUT_DIR/model.deathtensors."""
import os
import sys

import deathtensors as dt
import gguf
import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(5)
w = gguf.GGUFWriter(os.path.join(out, "model.gguf"), "llama")
w.add_tensor("tok_embd.weight", rng.standard_normal((8, 16)).astype("<f4"))
w.add_tensor("norm.weight", rng.standard_normal(16).astype("<f2"))
w.add_tensor("pos", np.arange(12, dtype="<i4").reshape(3, 4))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
given = {
    "w": ("F32", [4, 5], rng.standard_normal(20).astype("<f4").tobytes()),
    "b": ("BF16", [7], rng.integers(0, 2**16, 7, dtype="<u2").tobytes()),
    "mask": ("BOOL", [3], bytes([0, 1, 1])),
    "step": ("I64", [], np.int64(9).tobytes()),
}
dt.save(os.path.join(out, "model.deathtensors"), given, compress=True, checksum=True)
print("OK")
