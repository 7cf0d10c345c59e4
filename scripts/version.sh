#!/usr/bin/env bash
# Prints a field of Cargo.toml's [workspace.package]: the version (default), or `repository`;
# or `commit`: the git commit of the tree, `-dirty` when tracked files have changes (the build
# identity the artefacts carry, serving_picker_core::build_info, and the images' revision label).
# The one version of everything: the crates, `--version`, image tags and labels, manifests.
set -euo pipefail
field=${1:-version}
cd "$(dirname "$0")/.."
if [ "$field" = commit ]; then
  commit=$(git rev-parse HEAD)
  git diff --quiet HEAD -- || commit="$commit-dirty"
  echo "$commit"
  exit 0
fi
value=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^'"$field"' = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$value" ] || { echo "version.sh: no $field in Cargo.toml [workspace.package]" >&2; exit 1; }
echo "$value"
