#!/usr/bin/env bash
# `make build`'s native artefacts for this machine (x86_64), each built once and renamed into
# place (never overwrite a .so that an Envoy may have loaded):
# - the native module (NATIVE_SO) for glibc NATIVE_GLIBC and newer, linked by zig
#   (cargo-zigbuild);
# - the companion (CONDITIONS_BIN) as one static binary (musl, zig): it runs on any Linux and is
#   what the FROM scratch image holds, so the binary the tests run is the one that ships.
# Without zig (offline, NATIVE_ZIG=0, another architecture, or a failed zig build) each falls
# back to cargo's own build, for this machine's glibc (`make images` refuses the dynamic
# companion). Environment (the Makefile sets it): TARGET, NATIVE_SO, CONDITIONS_BIN,
# NATIVE_GLIBC, NATIVE_TRIPLE, COMPANION_TRIPLE, NATIVE_ZIG, VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${TARGET:?}" "${NATIVE_SO:?}" "${CONDITIONS_BIN:?}" "${NATIVE_GLIBC:?}" "${NATIVE_TRIPLE:?}" \
  "${COMPANION_TRIPLE:?}"
NATIVE_ZIG=${NATIVE_ZIG:-1}
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"

# publish FROM TO: copies FROM to TO, renamed into place.
publish() {
  cp "$1" "$2.tmp" && mv "$2.tmp" "$2"
}

native_cargo() {
  cargo build --release -p serving-picker-native
}

# The companion for this machine's glibc (profile `companion`: Cargo.toml).
companion_cargo() {
  cargo build --profile companion -p serving-picker-conditions &&
    publish "$TARGET/companion/serving-picker-conditions" "$CONDITIONS_BIN"
}

native_zig() {
  if cargo zigbuild --release --target "$NATIVE_TRIPLE.$NATIVE_GLIBC" -p serving-picker-native; then
    publish "$TARGET/$NATIVE_TRIPLE/release/libserving_picker.so" "$NATIVE_SO"
    echo "native module linked for glibc $NATIVE_GLIBC+ (cargo-zigbuild)"
  else
    echo "cargo-zigbuild failed: the native module is cargo's, for this machine's glibc"
    native_cargo
  fi
}

companion_zig() {
  if { rustup target list --installed | grep -qx "$COMPANION_TRIPLE" || rustup target add "$COMPANION_TRIPLE"; } &&
    cargo zigbuild --profile companion --target "$COMPANION_TRIPLE" -p serving-picker-conditions &&
    publish "$TARGET/$COMPANION_TRIPLE/companion/serving-picker-conditions" "$CONDITIONS_BIN"; then
    echo "companion linked static (musl, cargo-zigbuild)"
  else
    echo "static companion build failed: cargo's, for this machine's glibc"
    companion_cargo
  fi
}

if [ "$NATIVE_ZIG" = 1 ] && [ "$(uname -m)" = x86_64 ] && VENV=$VENV scripts/zig-tools.sh; then
  native_zig
  companion_zig
else
  echo "cargo-zigbuild unavailable: the native module and the companion are cargo's, for this machine's glibc"
  native_cargo
  companion_cargo
fi
glibc=$(objdump -T "$NATIVE_SO" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1 || true)
echo "built $NATIVE_SO (highest glibc symbol: $glibc) and $CONDITIONS_BIN ($(file -b "$CONDITIONS_BIN" | cut -d, -f4 | sed 's/^ //'))"
