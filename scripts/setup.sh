#!/usr/bin/env bash
# Installs what ztensor-mount needs on a Debian machine, idempotently:
# fuse3 (fusermount3 and the kernel device), and a Python venv in .venv with
# numpy and the reference Python package for the interop tests.
# Sourced by demo.sh and test.sh; safe to run alone.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v fusermount3 >/dev/null 2>&1; then
  echo "setup: installing fuse3"
  apt_install fuse3
fi
if [ ! -e /dev/fuse ]; then
  echo "setup: /dev/fuse is missing (in a container, run it with --device /dev/fuse)" >&2
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust 1.88 or newer (https://rustup.rs)" >&2
  exit 1
fi
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "setup: installing python3-venv"
  apt_install python3-venv
fi
venv="$root/.venv"
if ! "$venv/bin/python" -c 'import numpy, ztensor' >/dev/null 2>&1; then
  echo "setup: creating $venv (numpy, ztensor==0.1.4)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check numpy 'ztensor==0.1.4'
fi
