#!/usr/bin/env bash
# `make release VERSION=x.y.z [REGISTRY=host/path]`: writes $DIST (default dist/) from the staged
# artefacts (make stage):
#
#   serving-picker-conditions-<v>-linux-{amd64,arm64}         the companion, static
#   libserving_picker-<v>-linux-{amd64,arm64}.so                the native module, for every
#                                                               tested Envoy minor
#   libserving_picker-<v>-envoy<minor>-linux-{amd64,arm64}.so   the same file under the names of
#                                                               each minor (ENVOY_MINORS)
#   serving_picker-<v>.wasm                                     the wasm module
#   images/<name>-<v>.oci.tar                                   the images (scripts/images.sh)
#   images.txt                                                  <name> <tag> <digest>, one per tag
#   manifests/{deploy,examples}/                                the manifests, images pinned by digest
#   SHA256SUMS                                                  of every file above
#
# The native image is tagged <v> and, for each minor, <v>-envoy<minor>: one digest.
# With REGISTRY set, pushes each image as <REGISTRY>/<name>:<tag> (digests kept) and checks that
# the registry serves the digest the archive holds. REGISTRY_TLS_VERIFY=false for a plain-HTTP
# registry (the loopback one of scripts/check-release.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

STAGE=${STAGE:?STAGE is not set (make stage)}
DIST=${DIST:-$ROOT/dist}
CARGO_VERSION=$(scripts/version.sh)
VERSION=${VERSION:-$CARGO_VERSION}
if [ "$VERSION" != "$CARGO_VERSION" ]; then
  echo "release: VERSION=$VERSION but Cargo.toml says $CARGO_VERSION: run scripts/set-version.sh $VERSION and commit first" >&2
  exit 1
fi
REGISTRY=${REGISTRY:-}
PREFIX=${REGISTRY:-registry.example.com}
TLS_VERIFY=${REGISTRY_TLS_VERIFY:-true}
REVISION=$(git rev-parse HEAD)
git diff --quiet HEAD -- 2>/dev/null || REVISION="$REVISION-dirty"
export VERSION REVISION
export SOURCE=${SOURCE:-$(scripts/version.sh repository)}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
ENVOY_MINORS=${ENVOY_MINORS:-$(cat "$STAGE/envoy-minors" 2>/dev/null)}
[ -n "$ENVOY_MINORS" ] || { echo "release: no Envoy minors (ENVOY_MINORS or $STAGE/envoy-minors)" >&2; exit 1; }
export ENVOY_MINORS

rm -rf "$DIST"
mkdir -p "$DIST/images"
for arch in amd64 arm64; do
  cp "$STAGE/linux-$arch/serving-picker-conditions" "$DIST/serving-picker-conditions-$VERSION-linux-$arch"
  cp "$STAGE/linux-$arch/libserving_picker.so" "$DIST/libserving_picker-$VERSION-linux-$arch.so"
  for minor in $ENVOY_MINORS; do
    cp "$STAGE/linux-$arch/libserving_picker.so" "$DIST/libserving_picker-$VERSION-envoy$minor-linux-$arch.so"
  done
done
cp "$STAGE/wasm/serving_picker.wasm" "$DIST/serving_picker-$VERSION.wasm"

scripts/images.sh "$STAGE" "$DIST/images"

# The digest of an archive's one image (an index or a manifest): what the registry serves.
archive_digest() {
  tar -xOf "$1" index.json | python3 -c 'import json,sys; m=json.load(sys.stdin)["manifests"]; assert len(m)==1, m; print(m[0]["digest"])'
}
: >"$DIST/images.txt"
for archive in "$DIST"/images/*.oci.tar; do
  name=$(basename "$archive" .oci.tar)
  final=$DIST/images/$name-$VERSION.oci.tar
  mv "$archive" "$final"
  digest=$(archive_digest "$final")
  echo "$name $VERSION $digest" >>"$DIST/images.txt"
  if [ "$name" = serving-picker-native ]; then
    for minor in $ENVOY_MINORS; do echo "$name $VERSION-envoy$minor $digest" >>"$DIST/images.txt"; done
  fi
done
sort -o "$DIST/images.txt" "$DIST/images.txt"

if [ -n "$REGISTRY" ]; then
  while read -r name tag digest; do
    skopeo copy --quiet --all --preserve-digests --dest-tls-verify="$TLS_VERIFY" \
      "oci-archive:$DIST/images/$name-$VERSION.oci.tar" "docker://$REGISTRY/$name:$tag"
    served=sha256:$(skopeo inspect --raw --tls-verify="$TLS_VERIFY" "docker://$REGISTRY/$name:$tag" | sha256sum | cut -d' ' -f1)
    if [ "$served" != "$digest" ]; then
      echo "release: $REGISTRY/$name:$tag is $served in the registry, $digest in the archive" >&2
      exit 1
    fi
    echo "release: pushed $REGISTRY/$name:$tag@$digest"
  done <"$DIST/images.txt"
fi

python3 scripts/render-manifests.py "$DIST/images.txt" "$PREFIX" "$VERSION" "$DIST/manifests" deploy examples

(cd "$DIST" && find . -type f ! -name SHA256SUMS ! -path './.*' | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release: $VERSION ($REVISION) in $DIST:"
sed 's/^/  /' "$DIST/images.txt"
