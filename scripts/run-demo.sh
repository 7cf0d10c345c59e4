#!/usr/bin/env bash
# The demo: three backends and two Envoys in front of them, one per form of serving-picker:
#   wasm filter (envoy.yaml)          listener 10000, admin 9901
#   native module (envoy-native.yaml) listener 10001, admin 9902
# and the companion chain: slice files (.run/slices/web.yaml) -> serving-picker-conditions
# (xDS on 18000 over mutual TLS, metrics on 9102) -> a plain Envoy with both forms
# (envoy-companion.yaml)
#                                   listener 10002, admin 9903
# Uses `func-e run` when func-e is on PATH, else the Envoy in .venv. func-e runs $ENVOY_VERSION
# when set, else the version in .envoy-version (the Envoy `make test` uses); a full version
# already installed needs no network. func-e stops Envoy with SIGKILL, not a graceful drain:
# under func-e, Ctrl-C ends the demo's Envoys at once (.venv's Envoy gets SIGTERM).
# The native Envoy finds libserving_picker.so through ENVOY_DYNAMIC_MODULES_SEARCH_PATH: the one
# build (target/release), which loads into every Envoy minor it is tested with.
set -euo pipefail
cd "$(dirname "$0")/.."
export ENVOY_DYNAMIC_MODULES_SEARCH_PATH="${ENVOY_DYNAMIC_MODULES_SEARCH_PATH:-$PWD/target/release}"
[[ -f .run/tls/envoy-sds/sds-validation.yaml ]] || {
  echo "run-demo: no demo certificates in .run/tls (make demo-certs)" >&2
  exit 1
}
[[ -f "$ENVOY_DYNAMIC_MODULES_SEARCH_PATH/libserving_picker.so" ]] || {
  echo "run-demo: no libserving_picker.so in $ENVOY_DYNAMIC_MODULES_SEARCH_PATH (make build)" >&2
  exit 1
}
pids=()
stop() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM
# Each process logs to a file of its own under .run/logs, so the screen ends on what to try.
logs=.run/logs
mkdir -p "$logs"
"${DEMO_BACKENDS:-target/debug/demo-backends}" pod-a=18081 pod-b=18082 pod-c=18083 >"$logs/backends.log" 2>&1 &
pids+=($!)
scripts/demo-slices.sh .run/slices
# Over mutual TLS (certificates from `make demo-certs`): Envoy shows the demo client
# certificate, the companion lets in only that identity.
tls=.run/tls/companion
"${SERVING_PICKER_CONDITIONS:-target/release/serving-picker-conditions}" eds \
  --listen 127.0.0.1:18000 --metrics-listen 127.0.0.1:9102 --slices-dir .run/slices \
  --cluster backend=demo/web:http --cluster backend-native=demo/web:http \
  --tls-cert $tls/tls.crt --tls-key $tls/tls.key --client-ca $tls/ca.crt \
  --client-san spiffe://cluster.local/ns/demo/sa/envoy >"$logs/companion.log" 2>&1 &
pids+=($!)
run_envoy() { # log name, config, extra args...
  local log="$logs/$1.log" config="$2"
  shift 2
  if command -v func-e >/dev/null 2>&1; then
    func-e run -c "$config" --concurrency 2 "$@" >"$log" 2>&1 &
  else
    "${ENVOY_BIN:-.venv/bin/envoy}" -c "$config" --concurrency 2 --disable-hot-restart "$@" >"$log" 2>&1 &
  fi
  pids+=($!)
}
# Two Envoys on one machine: the second needs its own base id (shared memory) under func-e.
run_envoy envoy-wasm envoy.yaml --component-log-level wasm:info
run_envoy envoy-native envoy-native.yaml --base-id 1 --component-log-level dynamic_modules:info
run_envoy envoy-companion envoy-companion.yaml --base-id 2 --component-log-level wasm:info
# Prometheus (Debian's, when installed) with the shipped rules, scraping the companion and the
# three Envoys every 5 s: scripts/prometheus.sh, as its test starts it.
prometheus_url=""
if command -v prometheus >/dev/null 2>&1; then
  scripts/prometheus.sh .run/prometheus 127.0.0.1:9090 5s \
    serving-picker-conditions@127.0.0.1:9102/metrics \
    envoy@127.0.0.1:9901/stats/prometheus envoy@127.0.0.1:9902/stats/prometheus \
    envoy@127.0.0.1:9903/stats/prometheus >"$logs/prometheus.log" 2>&1 &
  pids+=($!)
  prometheus_url="http://127.0.0.1:9090/alerts"
fi
# Said once the Envoys answer their admin port (or after 20 s).
for _ in $(seq 100); do
  curl -sf -o /dev/null localhost:9901/ready && curl -sf -o /dev/null localhost:9902/ready &&
    curl -sf -o /dev/null localhost:9903/ready && break
  sleep 0.2
done
cat <<'MSG'
serving-picker demo, both forms in front of the same three pods:
  wasm filter    Envoy on http://127.0.0.1:10000, admin on http://127.0.0.1:9901 (envoy.yaml)
  native module  Envoy on http://127.0.0.1:10001, admin on http://127.0.0.1:9902 (envoy-native.yaml)
  pod-a 18081 ready                 -> takes every new request
  pod-b 18082 serving, terminating  -> only if nothing is ready
  pod-c 18083 not serving           -> never
Try: curl -s localhost:10000/            (answers pod-a, through the wasm filter)
     curl -s localhost:10001/            (answers pod-a, through the native load balancer)
     curl -si localhost:10001/none/      (a cluster with no serving pod: the no-serving 503)
     curl -s -H 'x-gateway-destination-endpoint: 127.0.0.1:18083' localhost:10000/   (still pod-a)
     curl -s localhost:9901/stats | grep serving_picker    (wasmcustom.serving_picker.*)
     curl -s localhost:9902/stats | grep serving_picker    (dynamicmodulescustom.serving_picker.*)
Companion chain: .run/slices/web.yaml -> serving-picker-conditions -> Envoy on :10002
     curl -s localhost:10002/ ; curl -s localhost:10002/native/   (pod-a: wasm / native form)
     edit .run/slices/web.yaml (pod-a ready: false, serving: false) -> both answer pod-b
     curl -s localhost:9102/metrics | grep serving_picker_conditions
     every endpoint serving: false in .run/slices/web.yaml -> the status page shows no_serving,
       ServingPickerServiceWithoutServingEndpoint fires in Prometheus within ~15 s
MSG
cat <<MSG
Status page: http://127.0.0.1:9102/debug/services.html (JSON: /debug/services)
Prometheus:  ${prometheus_url:-not installed (apt-get install prometheus): alerts not evaluated}
Alerts: deploy/monitoring/serving-picker.rules.yaml (docs/runbook.md)
Logs: .run/logs/{backends,companion,envoy-wasm,envoy-native,envoy-companion${prometheus_url:+,prometheus}}.log
Ctrl-C stops everything (under func-e, Envoy gets SIGKILL: no graceful drain).
MSG
wait -n
