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
#   <file>.cdx.json                                             the CycloneDX SBOM of each file
#                                                               above but the per-minor names
#                                                               (scripts/sbom.py)
#   images/<name>-<v>.oci.tar                                   the images (scripts/images.sh)
#   images.txt                                                  <name> <tag> <digest>, one per tag
#   sboms.txt                                                   <name> <image digest> <sbom tag>
#                                                               <sbom digest>, one per image
#   manifests/{deploy,examples}/                                the manifests, images pinned by digest
#   SHA256SUMS                                                  of every file above
#
# The native image is tagged <v> and, for each minor, <v>-envoy<minor>: one digest.
# With REGISTRY set, pushes each image as <REGISTRY>/<name>:<tag> (digests kept) and checks that
# the registry serves the digest the archive holds; then each image's SBOMs (one per platform) as
# an OCI artifact whose subject is the image, tagged <REGISTRY>/<name>:sha256-<image digest hex>.sbom. REGISTRY_TLS_VERIFY=false for a plain-HTTP
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
# The commit the artefacts name (the Makefile builds them with it) and the images' revision label.
REVISION=$(scripts/version.sh commit)
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

# sbom FILE PACKAGE TARGET TYPE DESCRIPTION: $DIST/FILE.cdx.json, what cargo builds into FILE.
sbom() {
  python3 scripts/sbom.py bom --file "$DIST/$1" --package "$2" --target "$3" --type "$4" \
    --description "$5" --version "$VERSION" --commit "$REVISION" --source "$SOURCE" -o "$DIST/$1.cdx.json" >/dev/null
}
for arch in amd64 arm64; do
  cpu=$([ $arch = amd64 ] && echo x86_64 || echo aarch64)
  sbom "serving-picker-conditions-$VERSION-linux-$arch" serving-picker-conditions "$cpu-unknown-linux-musl" \
    application "serving-picker's conditions companion (EDS server, Envoy Gateway extension hook), linux/$arch"
  sbom "libserving_picker-$VERSION-linux-$arch.so" serving-picker-native "$cpu-unknown-linux-gnu" \
    library "serving-picker's Envoy dynamic-module load-balancing policy, linux/$arch"
done
sbom "serving_picker-$VERSION.wasm" serving-picker-wasm wasm32-wasip1 library "serving-picker's proxy-wasm filter"

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

# Each image's SBOMs as one OCI artifact (scripts/sbom.py artifact), its subject the image.
SBOM_LAYOUT=$DIST/.sbom-oci
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
: >"$DIST/sboms.txt"
for name in serving-picker-conditions serving-picker-native serving-picker-wasm; do
  archive=$DIST/images/$name-$VERSION.oci.tar
  digest=$(archive_digest "$archive")
  case $name in
    serving-picker-conditions) files=("serving-picker-conditions-$VERSION-linux-amd64.cdx.json=linux/amd64"
      "serving-picker-conditions-$VERSION-linux-arm64.cdx.json=linux/arm64") ;;
    serving-picker-native) files=("libserving_picker-$VERSION-linux-amd64.so.cdx.json=linux/amd64"
      "libserving_picker-$VERSION-linux-arm64.so.cdx.json=linux/arm64") ;;
    serving-picker-wasm) files=("serving_picker-$VERSION.wasm.cdx.json=linux/amd64") ;;
  esac
  tar -xOf "$archive" index.json >"$DIST/.index.json"
  tag=sha256-${digest#sha256:}.sbom
  sbom_digest=$(cd "$DIST" && python3 "$ROOT/scripts/sbom.py" artifact --layout "$SBOM_LAYOUT" --tag "$tag" \
    --subject-index .index.json --created "$CREATED" "${files[@]}")
  echo "$name $digest $tag $sbom_digest" >>"$DIST/sboms.txt"
done
rm -f "$DIST/.index.json"

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
  while read -r name digest tag sbom_digest; do
    skopeo copy --quiet --preserve-digests --dest-tls-verify="$TLS_VERIFY" \
      "oci:$SBOM_LAYOUT:$tag" "docker://$REGISTRY/$name:$tag"
    served=sha256:$(skopeo inspect --raw --tls-verify="$TLS_VERIFY" "docker://$REGISTRY/$name:$tag" | sha256sum | cut -d' ' -f1)
    if [ "$served" != "$sbom_digest" ]; then
      echo "release: $REGISTRY/$name:$tag is $served in the registry, $sbom_digest in the layout" >&2
      exit 1
    fi
    echo "release: pushed $REGISTRY/$name:$tag@$sbom_digest (the SBOMs of $name@$digest)"
  done <"$DIST/sboms.txt"
fi
rm -rf "$SBOM_LAYOUT"

python3 scripts/render-manifests.py "$DIST/images.txt" "$PREFIX" "$VERSION" "$DIST/manifests" deploy examples

(cd "$DIST" && find . -type f ! -name SHA256SUMS ! -path './.*' | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release: $VERSION ($REVISION) in $DIST:"
sed 's/^/  /' "$DIST/images.txt"
