#!/usr/bin/env bash
# Runs serving-picker's end-to-end checks against several Envoy releases and writes a markdown
# compatibility table (make test-compat, make test-compat-quick):
#
#   scripts/test-compat.sh --full|--quick --out FILE VERSION...
#
# The work is the end-to-end crate's `test-compat` binary (tests/compat/main.rs: which tests,
# which Envoy, module and wasm runtime per release, the table); its doc says what each mode runs.
# The binary is the one the test build of `make unit` and `make integration` makes (cargo
# builds a package's binaries with its integration tests). The command is nextest's own build
# (`cargo test --workspace --no-run`: every test target, so every dev-dependency's features), so
# nothing is rebuilt; `--test e2e` or `cargo run` would resolve fewer features and build again.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(cargo test --workspace --no-run --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "test-compat" and m.get("executable"):
        found = m["executable"]
print(found if "found" in globals() else "")')
[ -x "$bin" ] || { echo "test-compat.sh: the test-compat binary was not built" >&2; exit 1; }
exec "$bin" "$@"
