#!/usr/bin/env bash
# scripts/set-version.sh X.Y.Z: moves the one version everywhere it is written: Cargo.toml
# ([workspace.package], which every crate inherits), Cargo.lock, and the image tags in deploy/,
# examples/ and packaging/. tests/e2e/companion/release.rs fails when any of them disagree.
set -euo pipefail
new=${1:?usage: scripts/set-version.sh X.Y.Z}
[[ $new =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || { echo "set-version: $new is not a semantic version" >&2; exit 1; }
cd "$(dirname "$0")/.."
old=$(scripts/version.sh)
sed -i '/^\[workspace\.package\]/,/^\[/s/^version = ".*"$/version = "'"$new"'"/' Cargo.toml
cargo update --workspace --offline --quiet
grep -rlE "registry\.example\.com/serving-picker[a-z-]*:$old" deploy examples packaging | while read -r f; do
  sed -i -E "s#(registry\.example\.com/serving-picker[a-z-]*):$old#\1:$new#g" "$f"
done
echo "set-version: $old -> $new (Cargo.toml, Cargo.lock, image tags); add its CHANGELOG.md section"
