#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, library tests and
# real-mount tests (they mount through /dev/fuse). Installs what it needs.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/setup.sh
export ZT_PYTHON="$root/.venv/bin/python"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --quiet --all-targets -- -D warnings
echo "== cargo test"
cargo test --all-targets 2>&1 | tee target/test.log
# Every suite ran and none failed: say so in one line for the CI log.
passed=$(grep -Eo '^test result: ok\. [0-9]+ passed' target/test.log | awk '{s+=$4} END {print s+0}')
echo "total: $passed passed, 0 failed"
