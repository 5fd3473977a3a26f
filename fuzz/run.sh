#!/usr/bin/env bash
# Runs one fuzz target for SECONDS (default 1800) from the committed seeds.
# Usage: fuzz/run.sh index|data_path|zt_v1|zt_v2_seek|formats|deathtensors [SECONDS]
set -euo pipefail
cd "$(dirname "$0")"
target=$1; secs=${2:-1800}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
mkdir -p "corpus/$target"
cp -n seeds/"$target"/* "corpus/$target/" 2>/dev/null || true
# cargo-fuzz needs nightly flags; the stable toolchain accepts them with RUSTC_BOOTSTRAP.
RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$target" "corpus/$target" -- \
  -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1
