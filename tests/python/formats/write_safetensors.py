"""Writes safetensors files with the safetensors package (numpy API): one
plain file, and a sharded set with a Hugging Face index JSON."""
import json
import os

import numpy as np
from safetensors.numpy import save_file

import common


def write(out):
    arrs = common.arrays()
    exp = {}
    save_file(arrs, os.path.join(out, "plain.safetensors"), metadata={"format": "np", "who": "test"})
    exp["plain.safetensors"] = {k: common.entry(v) for k, v in arrs.items()}
    # A sharded set in the HF layout: model-0000i-of-00003.safetensors + index.
    names = sorted(arrs)
    shards = [names[0::3], names[1::3], names[2::3]]
    d = os.path.join(out, "sharded")
    os.makedirs(d, exist_ok=True)
    weight_map, total = {}, 0
    for i, group in enumerate(shards):
        f = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: arrs[k] for k in group}, os.path.join(d, f), metadata={"format": "np"})
        for k in group:
            weight_map[k] = f
            total += arrs[k].nbytes
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    exp["sharded"] = {k: common.entry(v) for k, v in arrs.items()}
    return exp


if __name__ == "__main__":
    common.main(write)
