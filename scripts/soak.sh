#!/usr/bin/env bash
# Rolling-update soak (tests/e2e/both/soak.rs, module both::soak): a steady load through a real Envoy
# while the endpoints walk through a one-replica StatefulSet update and a
# 3-replica Deployment rolling update, with serving_picker.wasm and without it
# (a control plane that only publishes ready endpoints). Prints the per-phase
# tables and the summary: requests and failures with and without the module.
#
# Knobs (environment): SOAK_PHASE_MS (>= 1000, default 1000), SOAK_RATE
# (requests/s in total over 8 keep-alive clients, default 800), ENVOY_BIN,
# SERVING_PICKER_WASM. Takes about 40 s (both walks run side by side; set
# SOAK_THREADS=1 to run them one after the other, about 55 s).
set -euo pipefail
cd "$(dirname "$0")/.."
make --no-print-directory build envoy >/dev/null
export ENVOY_BIN="${ENVOY_BIN:-$PWD/.venv/bin/envoy}"
export SERVING_PICKER_WASM="${SERVING_PICKER_WASM:-$PWD/target/serving_picker.wasm}"
out="$(mktemp -t serving-picker-soak.XXXXXX)"
trap 'rm -f "$out"' EXIT
status=0
cargo test -p serving-picker-e2e --test e2e both::soak:: -- --nocapture --test-threads "${SOAK_THREADS:-2}" 2>&1 \
  | grep -v '^\[20' | tee "$out" || status=$?
echo
echo "=== soak summary ==="
grep -m1 '^soak-summary | walk' "$out" | sed 's/^soak-summary | //' || true
grep '^soak-summary |' "$out" | grep -v '^soak-summary | walk' | sed 's/^soak-summary | //' || true
exit "$status"
