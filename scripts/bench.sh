#!/usr/bin/env bash
# The benchmark: builds the release binary, installs what it needs (fuse3,
# the .venv with numpy and the formats' writers: ztensor 2.x, safetensors,
# gguf; zstd), then runs scripts/bench.py, which writes its
# own files under /var/tmp/ztbench, mounts them and prints one table of
# figures measured side by side against reading the same bytes without the
# mount. Options go to bench.py: --quick (small files), --keep (keep the
# files for the next run), --regen, --runs N, --only SECTIONS (raw, memmap,
# zstd, ttfb, random, many, rss, v2, formats, writers, views, model, remote,
# hub, passthrough, reflink),
# --workdir DIR. With CARGO_TARGET_DIR set, the binaries are built and run
# from there.
#
#   bash scripts/bench.sh            # full run (1-2 GiB files, about 25 GiB in all; ~20 minutes)
#   bash scripts/bench.sh --quick    # small sizes, to try it out
#   bash scripts/bench.sh --only remote   # the raw tensor over HTTP (needs curl)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
source scripts/setup.sh --test
missing=()
command -v zstd >/dev/null 2>&1 || missing+=(zstd)
command -v fincore >/dev/null 2>&1 || missing+=(util-linux)
command -v pgrep >/dev/null 2>&1 || missing+=(procps)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v mkfs.xfs >/dev/null 2>&1 || missing+=(xfsprogs)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench: installing ${missing[*]}"
  apt_install "${missing[@]}"
fi
cargo build --release --quiet --bins --example bench_many
exec "$root/.venv/bin/python" "$root/scripts/bench.py" "$@"
