#!/usr/bin/env bash
# Makes zig and cargo-zigbuild (PyPI `ziglang`, `cargo-zigbuild`) available in VENV/bin (default
# .venv), installing them there under the venv's lock when missing; fails when they cannot be had
# (offline). The callers put VENV/bin first on PATH. zig's linker links the native module for an
# older glibc and the companion static (musl), and the aarch64 builds (`make build`, `make
# build-cross`).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
command -v cargo-zigbuild >/dev/null && exit 0
[ -x "$VENV/bin/pip" ] || exit 1
flock "$VENV.lock" "$VENV/bin/pip" install --quiet --disable-pip-version-check ziglang cargo-zigbuild \
  >/dev/null 2>&1 || exit 1
command -v cargo-zigbuild >/dev/null
