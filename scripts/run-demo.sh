#!/usr/bin/env bash
# The demo: three backends and Envoy with serving-picker (envoy.yaml).
# Uses `func-e run` when func-e is on PATH, else the Envoy in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/demo-backends.py pod-a=18081 pod-b=18082 pod-c=18083 &
backends=$!
trap 'kill $backends 2>/dev/null || true' EXIT
cat <<'MSG'
serving-picker demo: Envoy on http://127.0.0.1:10000, admin on http://127.0.0.1:9901
  pod-a 18081 ready                 -> takes every new request
  pod-b 18082 serving, terminating  -> only if nothing is ready
  pod-c 18083 not serving           -> never
Try: curl -s localhost:10000/            (answers pod-a)
     curl -s -H 'x-gateway-destination-endpoint: 127.0.0.1:18083' localhost:10000/   (still pod-a)
     curl -s localhost:9901/stats | grep serving_picker
Ctrl-C stops everything.
MSG
if command -v func-e >/dev/null 2>&1; then
  func-e run -c envoy.yaml --concurrency 2 --component-log-level wasm:info
else
  "${ENVOY_BIN:-.venv/bin/envoy}" -c envoy.yaml --concurrency 2 --disable-hot-restart --component-log-level wasm:info
fi
