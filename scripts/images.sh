#!/usr/bin/env bash
# Builds serving-picker's images as OCI archives, from artefacts already built and staged:
#
#   $STAGE/linux-<arch>/serving-picker-conditions   (static, per arch)
#   $STAGE/linux-<arch>/libserving_picker.so        (per arch: one build for every Envoy minor)
#   $STAGE/wasm/serving_picker.wasm
#   $STAGE/envoy-minors                             the Envoy minors the native module is tested with
#
# and writes to $OUT:
#   serving-picker-conditions.oci.tar   index: linux/amd64 + linux/arm64
#   serving-picker-native.oci.tar       index: linux/amd64 + linux/arm64
#   serving-picker-wasm.oci.tar         one manifest (the compat Wasm image)
#
# Environment: VERSION, REVISION, SOURCE (labels), SOURCE_DATE_EPOCH (every timestamp in the
# images: the same inputs give the same digests), ARCHES (default "amd64 arm64"),
# ENVOY_MINORS (default: $STAGE/envoy-minors; the native image's label lists them).
# buildah with the vfs driver and chroot isolation, in a private store under $OUT: no daemon,
# no root-owned state, nothing pulled (every image is FROM scratch).
set -euo pipefail

STAGE=${1:?usage: images.sh STAGE_DIR OUT_DIR}
OUT=${2:?usage: images.sh STAGE_DIR OUT_DIR}
: "${VERSION:?VERSION is not set}" "${REVISION:?REVISION is not set}" "${SOURCE:?SOURCE is not set}"
: "${SOURCE_DATE_EPOCH:?SOURCE_DATE_EPOCH is not set}"
ARCHES=${ARCHES:-amd64 arm64}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PACKAGING=$ROOT/packaging

command -v buildah >/dev/null || { echo "images.sh: buildah not found (apt-get install buildah)" >&2; exit 1; }
mkdir -p "$OUT"
STORE=$(mktemp -d "$OUT/.buildah.XXXXXX")
B=(buildah --storage-driver vfs --root "$STORE/root" --runroot "$STORE/run")
cleanup() {
  "${B[@]}" rm --all >/dev/null 2>&1 || true
  "${B[@]}" rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$STORE"
}
trap cleanup EXIT

ARGS=(--isolation chroot --timestamp "$SOURCE_DATE_EPOCH" --quiet
  --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "SOURCE=$SOURCE")

# The artefacts an image takes must be what a cluster can run: the companion static (no
# program interpreter), each .so built for its arch.
elf_machine() { readelf -h "$1" | sed -n 's/^ *Machine: *//p'; }
want_machine() { case $1 in amd64) echo "Advanced Micro Devices X86-64" ;; arm64) echo AArch64 ;; esac; }
check_elf() { # file arch
  [ -f "$1" ] || { echo "images.sh: $1 missing (make build build-cross)" >&2; exit 1; }
  local m; m=$(elf_machine "$1")
  [ "$m" = "$(want_machine "$2")" ] || { echo "images.sh: $1 is $m, not $2" >&2; exit 1; }
}

# name, Containerfile, context, platforms..., extra build args after "--"
multiarch() {
  local name=$1 file=$2 ctx=$3; shift 3
  local extra=()
  while [ $# -gt 0 ]; do extra+=("$1"); shift; done
  "${B[@]}" manifest create "$name" >/dev/null
  for arch in $ARCHES; do
    "${B[@]}" bud "${ARGS[@]}" "${extra[@]}" --platform "linux/$arch" --manifest "$name" \
      -f "$file" "$ctx" >/dev/null
  done
  rm -f "$OUT/$name.oci.tar"
  "${B[@]}" manifest push --quiet --all "$name" "oci-archive:$OUT/$name.oci.tar" >/dev/null
  echo "images.sh: $OUT/$name.oci.tar ($(echo $ARCHES | sed 's/\([a-z0-9]*\)/linux\/\1/g'))"
}

for arch in $ARCHES; do
  bin=$STAGE/linux-$arch/serving-picker-conditions
  check_elf "$bin" "$arch"
  if readelf -l "$bin" | grep -q 'Requesting program interpreter'; then
    echo "images.sh: $bin is dynamically linked; the image is FROM scratch and needs it static" >&2
    exit 1
  fi
done
multiarch serving-picker-conditions "$PACKAGING/companion.Containerfile" "$STAGE"

minors=${ENVOY_MINORS:-$(cat "$STAGE/envoy-minors" 2>/dev/null)}
[ -n "$minors" ] || { echo "images.sh: no Envoy minors (ENVOY_MINORS or $STAGE/envoy-minors)" >&2; exit 1; }
for arch in $ARCHES; do check_elf "$STAGE/linux-$arch/libserving_picker.so" "$arch"; done
multiarch serving-picker-native "$PACKAGING/native.Containerfile" "$STAGE" \
  --build-arg "ENVOY_MINORS=$(echo $minors)"

wasm=$STAGE/wasm/serving_picker.wasm
[ "$(head -c 4 "$wasm" | od -An -tx1 | tr -d ' ')" = 0061736d ] || { echo "images.sh: $wasm is not a wasm module" >&2; exit 1; }
"${B[@]}" bud "${ARGS[@]}" --platform linux/amd64 -t serving-picker-wasm \
  -f "$PACKAGING/wasm.Containerfile" "$STAGE/wasm" >/dev/null
rm -f "$OUT/serving-picker-wasm.oci.tar"
"${B[@]}" push --quiet serving-picker-wasm "oci-archive:$OUT/serving-picker-wasm.oci.tar" >/dev/null
echo "images.sh: $OUT/serving-picker-wasm.oci.tar (one manifest: plugin.wasm)"
