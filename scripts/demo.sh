#!/usr/bin/env bash
# Sets up this machine, builds ztensor-mount, mounts the bundled example
# model and shows it: ls -l, a sidecar, and a tensor read with numpy.
# The mount stays up; the last line says how to unmount it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
source scripts/setup.sh
cargo build --release --quiet
bin="$root/target/release/ztensor-mount"
mnt=${1:-/tmp/ztensor-demo}
mkdir -p "$mnt"
# A mount left by an earlier run (alive or dead) is replaced.
"$bin" -u "$mnt" 2>/dev/null || true
"$bin" examples/model.zt "$mnt"

set -x
ls -l "$mnt" "$mnt/enc/layer0/attn"
cat "$mnt/enc/layer0/attn/q.bias.json"
{ set +x; } 2>/dev/null
"$root/.venv/bin/python" - "$mnt" <<'PY'
import json, sys
import numpy as np
mnt = sys.argv[1]
for name in ["embed.weight", "enc/layer0/mlp/w1", "norm.scale"]:
    meta = json.load(open(f"{mnt}/{name}.json"))
    a = np.fromfile(f"{mnt}/{name}", dtype=meta["numpy_dtype"]).reshape(meta["shape"])
    print(f"{name}: {meta['encoding']}, {meta['data_endianness']}-endian on disk -> {a.dtype} {a.shape}, first row {a.reshape(-1)[:4]}")
PY
echo "mounted on $mnt; unmount with: $bin -u $mnt"
