#!/usr/bin/env bash
# Sets up this machine, builds ztensor-mount and installs it on PATH
# (/usr/local/bin, as root or through sudo; else ~/.local/bin) with its
# manual pages (docs/man/ into the share/man/man1 beside it), mounts the
# bundled example model and shows it: ls -l, a sidecar, a tensor read with
# numpy, and the views (np.load, TensorStore, zarr, safetensors).
# The mount stays up; the last line says how to unmount it. It installs
# only what the demo uses (scripts/setup.sh --demo); scripts/test.sh adds
# what the tests need.
#
#   bash scripts/demo.sh [MOUNTPOINT]     default /tmp/ztensor-demo
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
source scripts/setup.sh --demo
cargo build --release --quiet
built="$root/target/release/ztensor-mount"
if [ "$(id -u)" = 0 ] || command -v sudo >/dev/null 2>&1; then
  dest=/usr/local/bin
  as_root install -m 0755 "$built" "$dest/ztensor-mount"
  as_root install -D -m 0644 -t /usr/local/share/man/man1 docs/man/*.1
else
  dest="$HOME/.local/bin"
  mkdir -p "$dest"
  install -m 0755 "$built" "$dest/ztensor-mount"
  install -D -m 0644 -t "$HOME/.local/share/man/man1" docs/man/*.1
fi
bin="$dest/ztensor-mount"
echo "installed $bin (man ztensor-mount)"
case ":$PATH:" in *":$dest:"*) ;; *) echo "note: $dest is not on your PATH" ;; esac
# Only a ztensor-mount mount whose daemon died is replaced; any other mount
# there is left alone, and another directory is used (and named).
mnt=$(bash scripts/demo_mountpoint.sh "${1:-/tmp/ztensor-demo}" "$bin")
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
    # read() raises where a read fails; np.fromfile would return zeros.
    with open(f"{mnt}/{name}", "rb") as f:
        a = np.frombuffer(f.read(), dtype=meta["numpy_dtype"]).reshape(meta["shape"])
    print(f"{name}: {meta['encoding']}, {meta['data_endianness']}-endian on disk -> {a.dtype} {a.shape}, first row {a.reshape(-1)[:4]}")
# The views: each library opens a tensor by its path alone.
import tensorstore as ts, zarr
from safetensors.numpy import load_file
print("np.load:    ", np.load(f"{mnt}/.npy/embed.weight.npy").shape)
print("TensorStore:", ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{mnt}/.zarr/embed.weight/"}}, read=True).result().shape)
print("zarr:       ", zarr.open_array(f"{mnt}/.zarr/embed.weight", mode="r").shape)
print("safetensors:", sorted(load_file(f"{mnt}/.safetensors/model.safetensors"))[:3], "...")
PY
echo "mounted on $mnt; unmount with: $bin -u $mnt"
