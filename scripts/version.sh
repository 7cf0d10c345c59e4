#!/usr/bin/env bash
# Prints a field of Cargo.toml's [workspace.package]: the version (default), or `repository`.
# The one version of everything: the crates, `--version`, image tags and labels, manifests.
set -euo pipefail
field=${1:-version}
cd "$(dirname "$0")/.."
value=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^'"$field"' = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$value" ] || { echo "version.sh: no $field in Cargo.toml [workspace.package]" >&2; exit 1; }
echo "$value"
