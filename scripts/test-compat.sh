#!/usr/bin/env bash
# Runs serving-picker's end-to-end checks against several Envoy releases and writes a markdown
# compatibility table (make test-compat, make test-compat-quick):
#
#   scripts/test-compat.sh --full|--quick --out FILE VERSION...
#
# The work is the end-to-end crate's `test-compat` binary (tests/compat/main.rs: which tests,
# which Envoy, module and wasm runtime per release, the table); its doc says what each mode runs.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run -q -p serving-picker-e2e --bin test-compat -- "$@"
