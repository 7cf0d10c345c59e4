#!/usr/bin/env bash
# End-to-end benchmark: the same front Envoy (--concurrency 1) in four forms,
#   plain           no filter: the override_host policy without a header falls back to round
#                   robin (plain round robin for every request)
#   native          serving-picker's native form: no filter, the cluster's load balancer is the
#                   dynamic module (libserving_picker.so, SERVING_PICKER_NATIVE)
#   noop            the no-op Rust wasm filter (benches/noop-filter): the floor any wasm filter pays
#   serving-picker  the wasm form, refresh_interval_ms 1000, polling its own admin through envoy_admin
# driven by wrk against a backend Envoy with three direct_response listeners.
#
# It answers four questions:
#   T1  does serving-picker (wasm) keep at least 0.95 of the no-op filter's throughput?
#   T2  does it add under 10 us at p50 over the no-op filter?
#   T3  does the native form keep at least 0.97 of plain round robin's throughput?
#   T4  does it add under 2 us at p50 over plain (interleaved c1 phase)?
#
# Rounds are interleaved: each round runs the three configs, each on a fresh front Envoy. Odd
# rounds go plain, noop, serving-picker; even rounds the other way round, so that a steady drift
# of the machine's speed within a round favours neither side of a pair over the rounds.
# Each front Envoy gets two measured phases, one after the other:
#   throughput  wrk -c$BENCH_CONNECTIONS after a warm-up: req/s and CPU per request with the front
#               saturated. Its p50 is mostly queueing (connections / throughput), not the filter's
#               added latency.
#   latency     wrk -t1 -c1 (closed loop, one request in flight): p50/p99 of one request's trip
#               through the front, where the filter's added time shows up directly. wrk records
#               latency per microsecond and prints two decimals ("85.00us", "1.23ms"), so below
#               1 ms its percentiles are exact to 1 us: fine for a 10 us question.
# The summary has, per phase, the median of each config's runs (as before); then figures paired
# within a round (serving-picker / noop req/s, serving-picker - noop p50, ...), computed from runs
# of the SAME round and only then summarised by median and min..max over the rounds. The VM's
# speed drifts by more than the filter's cost between rounds, so a ratio of two medians of
# independent runs mixes that drift in; a paired figure cancels most of it. A final "targets"
# block prints T1 and T2 from the paired figures. They are figures, not asserts: a missed target
# never changes the exit status.
#
# CPU layout on the 2-core machine (when taskset exists): the front Envoy, the thing measured,
# has core 0 to itself; the backend Envoy and wrk share core 1. Both of those do less work per
# request than the proxying front, so the front stays the bottleneck; the front's own CPU time
# per request (from /proc, over the measured window only) is reported as well, which is less
# sensitive to that sharing than req/s.
#
# Environment (all optional):
#   ENVOY_BIN            envoy binary                       (default .venv/bin/envoy)
#   SERVING_PICKER_WASM  serving-picker module              (default target/serving_picker.wasm)
#   SERVING_PICKER_NATIVE the native module                 (default target/release/libserving_picker.so)
#   NOOP_WASM            no-op module                       (default benches/noop-filter/target/wasm32-wasip1/release/noop_filter.wasm)
#   BENCH_DURATION       wrk duration of a throughput run   (default 10s)
#   BENCH_WARMUP         wrk warm-up before each run        (default 2s)
#   BENCH_CONNECTIONS    wrk connections, throughput phase  (default 32)
#   BENCH_THREADS        wrk threads, throughput phase      (default 1)
#   BENCH_LAT_DURATION   wrk -t1 -c1 duration, latency phase (default 5s)
#   BENCH_ROUNDS         rounds of the configs              (default 3)
#   BENCH_CONFIGS        the configs measured               (default "plain native noop serving-picker")
#   BENCH_WORKDIR        generated configs, logs, raw output (default .run/bench-e2e)
#   BENCH_NOISY_PCT      "other" load (share of one core) above which a run is marked noisy (default 15)
#   BENCH_PROBE, BENCH_PROBE_PATH, BENCH_STACK, BENCH_DECOMPOSE  diagnostic configs, described below
#   BENCH_IL_LAPS, BENCH_IL_WARMUP, BENCH_IL_CONFIGS, LATENCY_CLIENT  the interleaved c1 phase
#   BENCH_SHARED_REPS, BENCH_SHARED_DURATION  the shared-core throughput phase (interleaved fronts)
#
# Per run it prints req/s, p50/p99 latency, the front's CPU us per request and the CPU use of
# front, backend, wrk and "other" (everything else on the machine, steal included) over the
# measured window. The machine is shared: runs with other load are marked '*', and a second
# table with the medians of the quiet runs only (quiet rounds only, for paired figures) is
# printed when there are any.
# Exit status: non-zero if a config fails validation, an Envoy fails, or any measured run (any
# config, either phase) saw a non-2xx response or socket error: a baseline answering errors
# would make the ratios meaningless. Never because a target is missed.
# Ports: 127.0.0.1:21000 front listener, 21901 front admin, 21900 backend admin,
#        21081-21083 backends, 21010+ / 21910+ the interleaved phase's fronts / their admins.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$ROOT" "$1" ;; esac; }

ENVOY_BIN="$(abspath "${ENVOY_BIN:-.venv/bin/envoy}")"
SP_WASM="$(abspath "${SERVING_PICKER_WASM:-target/serving_picker.wasm}")"
SP_NATIVE="$(abspath "${SERVING_PICKER_NATIVE:-target/release/libserving_picker.so}")"
NOOP_WASM="$(abspath "${NOOP_WASM:-benches/noop-filter/target/wasm32-wasip1/release/noop_filter.wasm}")"
DURATION="${BENCH_DURATION:-10s}"
WARMUP="${BENCH_WARMUP:-2s}"
CONNS="${BENCH_CONNECTIONS:-32}"
THREADS="${BENCH_THREADS:-1}"
LAT_DURATION="${BENCH_LAT_DURATION:-5s}"
SP_CONFIG="${BENCH_SP_CONFIG:-{\"refresh_interval_ms\": 1000\}}"
ROUNDS="${BENCH_ROUNDS:-3}"
WORK="$(abspath "${BENCH_WORKDIR:-.run/bench-e2e}")"

FRONT_PORT=21000
FRONT_ADMIN=21901
BACKEND_ADMIN=21900
BACKEND_PORTS=(21081 21082 21083)
# native sits next to plain (its pair), noop next to serving-picker (theirs). BENCH_CONFIGS: a
# subset in that order (e.g. "plain native" for T3 alone; figures of absent configs print n/a).
read -r -a CONFIGS <<<"${BENCH_CONFIGS:-plain native noop serving-picker}"
# The host-call probe (BENCH_PROBE=N, off by default): two more configs, the no-op filter making N
# `xds.cluster_name` reads or N header replaces per request (serving-picker makes one of each), so
# that the cost of one call stands out of the noise: (cpu us/req - noop's) / N, paired per round.
PROBE="${BENCH_PROBE:-0}"
# The property probe-property and override-read read (dotted path): another one prices the
# property read itself against xds.cluster_name, e.g. plugin_name.
PROBE_PATH="${BENCH_PROBE_PATH:-xds.cluster_name}"
[[ "$PROBE_PATH" =~ ^[a-z_]+(\.[a-z_]+)*$ ]] || { echo "bench-e2e: BENCH_PROBE_PATH must be a dotted property path" >&2; exit 1; }
# The filter-stack probe (BENCH_STACK=N, default 1): N copies of each wasm filter in the chain, so
# that the per-request cost of one copy, (cpu us/req - plain's) / N, stands out of the noise. The
# override LB policy still acts once per request: this costs the filter itself, not Envoy's part.
STACK="${BENCH_STACK:-1}"
[[ "$STACK" =~ ^[1-9][0-9]*$ ]] || { echo "bench-e2e: BENCH_STACK must be a positive number" >&2; exit 1; }
[[ "$PROBE" =~ ^[0-9]+$ ]] || { echo "bench-e2e: BENCH_PROBE must be a whole number" >&2; exit 1; }
(( PROBE == 0 )) || CONFIGS+=(probe-property probe-replace)
# The override decomposition (BENCH_DECOMPOSE=1, off by default): where serving-picker's cost over
# the no-op goes. Two more configs, both sending a 3-address override list like serving-picker's,
# rotated per request (OVERRIDE_ROTATIONS):
#   override-client  plain Envoy (no wasm), the client sends the header: Envoy's own part, the
#                    override LB policy reading the list and the longer request upstream
#   override-header  the no-op filter sets the header once per request: that, plus the header
#                    write and the route match Envoy repeats after a wasm filter changes headers
#   override-read    override-header plus one xds.cluster_name read: the two host calls
#                    serving-picker makes, without its logic
#   override-state   the no-op filter writes the list to filter state, a native header_mutation
#                    filter after it sets the header from there: no route re-match (Envoy repeats
#                    the match only after a wasm filter's header change)
# serving-picker - override-header is then the filter's own decision (cluster name read, lookup).
DECOMPOSE="${BENCH_DECOMPOSE:-0}"
# The interleaved c1 phase (after the rounds): one front Envoy per config, all up at once on core
# 0, and benches/latency-client sending one request at a time to each in turn, BENCH_IL_LAPS laps
# after BENCH_IL_WARMUP. Drift between separate runs is larger than the filter's cost; here it
# hits every config alike, so the paired per-lap difference to noop measures the added latency.
IL_LAPS="${BENCH_IL_LAPS:-20000}"
IL_WARMUP="${BENCH_IL_WARMUP:-2000}"
LATENCY_CLIENT="$(abspath "${LATENCY_CLIENT:-benches/latency-client/target/release/latency_client}")"
# The shared-core throughput phase (after the interleaved one, on the same side-by-side fronts):
# BENCH_SHARED_REPS repetitions of BENCH_SHARED_DURATION in which every front is saturated at the
# same time by its own wrk -c$BENCH_CONNECTIONS, all fronts on one core. The kernel gives each
# the same share of that core, so the cheaper config serves more requests in it: the per-rep
# ratio (native / plain, serving-picker / noop) is the inverse ratio of CPU per request, measured
# at the same instants. The VM's speed drifts by 20% and more between the rounds' runs minutes
# apart, and even between neighbouring 3 s runs; here the drift hits both sides alike.
SHARED_REPS="${BENCH_SHARED_REPS:-8}"
SHARED_DURATION="${BENCH_SHARED_DURATION:-5s}"
[[ "$SHARED_REPS" =~ ^[0-9]+$ ]] || { echo "bench-e2e: BENCH_SHARED_REPS must be a whole number" >&2; exit 1; }
[[ "$IL_LAPS" =~ ^[0-9]+$ && "$IL_WARMUP" =~ ^[0-9]+$ ]] || { echo "bench-e2e: BENCH_IL_LAPS and BENCH_IL_WARMUP must be whole numbers" >&2; exit 1; }
[[ "$DECOMPOSE" =~ ^[01]$ ]] || { echo "bench-e2e: BENCH_DECOMPOSE must be 0 or 1" >&2; exit 1; }
OVERRIDE_HEADER=x-gateway-destination-endpoint
OVERRIDE_VALUE="127.0.0.1:21081,127.0.0.1:21082,127.0.0.1:21083"
# The list rotated by one address per request, as serving-picker rotates its picks, so that every
# config spreads its requests over the same three backends.
OVERRIDE_ROTATIONS=("$OVERRIDE_VALUE" "127.0.0.1:21082,127.0.0.1:21083,127.0.0.1:21081" "127.0.0.1:21083,127.0.0.1:21081,127.0.0.1:21082")
(( DECOMPOSE == 0 )) || CONFIGS+=(override-client override-header override-read override-state)
# The targets (printed against the paired figures; never asserted).
T1_MIN_RATIO=0.95 # serving-picker / noop req/s, throughput phase
T2_MAX_US=10      # serving-picker - noop p50 us, latency phase
T3_MIN_RATIO=0.97 # native / plain req/s, throughput phase
T4_MAX_US=2       # native - plain p50 us, interleaved c1 phase
STATS_SETTLE=0.5  # seconds; more than one serving-picker tick (see the run loop)

die() { echo "bench-e2e: $*" >&2; exit 1; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS must be a positive integer, not '$ROUNDS'"

# ---------------------------------------------------------------- prerequisites
need_apt() { # command package
  command -v "$1" >/dev/null 2>&1 || (apt-get update && apt-get install -y "$2")
  command -v "$1" >/dev/null 2>&1 || die "$1 not found and could not be installed"
}
need_apt wrk wrk
need_apt curl curl
[[ -x "$ENVOY_BIN" ]] || die "envoy not found at $ENVOY_BIN (run 'make envoy' or set ENVOY_BIN)"
[[ -f "$NOOP_WASM" ]] || die "no-op module not found at $NOOP_WASM (cargo build --release --target wasm32-wasip1 --manifest-path benches/noop-filter/Cargo.toml)"
(( IL_LAPS == 0 )) || [[ -x "$LATENCY_CLIENT" ]] || die "latency client not found at $LATENCY_CLIENT (cargo build --release --manifest-path benches/latency-client/Cargo.toml, or BENCH_IL_LAPS=0)"
[[ -f "$SP_WASM" ]] || die "serving-picker module not found at $SP_WASM (run 'make build' or set SERVING_PICKER_WASM)"
[[ -f "$SP_NATIVE" ]] || die "native module not found at $SP_NATIVE (run 'make build' or set SERVING_PICKER_NATIVE)"

for p in "$FRONT_PORT" "$FRONT_ADMIN" "$BACKEND_ADMIN" "${BACKEND_PORTS[@]}"; do
  if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$p/"; then
    die "port $p is already in use (a previous run still going?)"
  fi
done

if command -v taskset >/dev/null 2>&1 && [[ "$(nproc)" -ge 2 ]]; then
  PIN_FRONT=(taskset -c 0)
  PIN_OTHER=(taskset -c 1)
  PINNING="front Envoy on core 0; backend Envoy and wrk on core 1"
else
  PIN_FRONT=()
  PIN_OTHER=()
  PINNING="no pinning (taskset missing or fewer than 2 cores)"
fi

rm -rf "$WORK"
mkdir -p "$WORK"
# Every front Envoy loads its module at start: copy both now so that a rebuild while the benchmark
# runs (make build elsewhere) cannot put two different modules into one run's rounds.
SP_WASM_SRC="$SP_WASM"
NOOP_WASM_SRC="$NOOP_WASM"
cp "$SP_WASM_SRC" "$WORK/serving_picker.wasm"
cp "$NOOP_WASM_SRC" "$WORK/noop_filter.wasm"
SP_WASM="$WORK/serving_picker.wasm"
NOOP_WASM="$WORK/noop_filter.wasm"
# The native module likewise; every Envoy (validate too) finds lib<name>.so here.
SP_NATIVE_SRC="$SP_NATIVE"
mkdir -p "$WORK/native"
cp "$SP_NATIVE_SRC" "$WORK/native/libserving_picker.so"
SP_NATIVE="$WORK/native/libserving_picker.so"
export ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$WORK/native"

# ---------------------------------------------------------------- process handling
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_envoy NAME CONFIG PIN... ; sets STARTED_PID
start_envoy() {
  local name="$1" config="$2"
  shift 2
  "$@" "$ENVOY_BIN" -c "$config" --concurrency 1 --disable-hot-restart -l warn \
    --log-path "$WORK/$name.log" </dev/null >>"$WORK/$name.out" 2>&1 &
  STARTED_PID=$!
  PIDS+=("$STARTED_PID")
}

stop_envoy() {
  local pid="$1" p rest=()
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  for p in "${PIDS[@]}"; do [[ "$p" == "$pid" ]] || rest+=("$p"); done
  PIDS=("${rest[@]+"${rest[@]}"}")
}

wait_ready() { # admin_port pid name
  local i
  for i in $(seq 1 200); do
    if ! kill -0 "$2" 2>/dev/null; then
      tail -n 30 "$WORK/$3.log" "$WORK/$3.out" >&2 || true
      die "$3 exited during startup"
    fi
    if [[ "$(curl -s --max-time 1 "http://127.0.0.1:$1/ready" || true)" == LIVE* ]]; then
      return 0
    fi
    sleep 0.05
  done
  die "$3 not ready after 10s"
}

# CPU time (user+system) of a process, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
CLK_TCK="$(getconf CLK_TCK)"
# Busy time of the whole machine (all cores, steal included), in clock ticks.
machine_busy_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
# CPU time of this shell's reaped children (bash `times`, second line), in clock ticks; into
# variable $1. `times` must run in this shell, not in a $(...) subshell, to see them.
children_ticks() {
  times >"$WORK/times.txt"
  printf -v "$1" '%s' "$(children_ticks_parse <"$WORK/times.txt")"
}
children_ticks_parse() {
  awk -v hz="$CLK_TCK" 'NR == 2 {
    s = 0
    for (i = 1; i <= 2; i++) { v = $i; m = v; sub(/m.*/, "", m); sub(/^[0-9]+m/, "", v); sub(/s$/, "", v); s += m * 60 + v }
    printf "%d\n", s * hz + 0.5 }'
}
pct() { awk -v t="$1" -v hz="$CLK_TCK" -v ns="$2" 'BEGIN { printf "%.0f%%", 100 * t / hz / (ns / 1e9) }'; }
# A round whose other load (CPU used by anything but the front, the backend and wrk, steal
# included) is above this share of one core is marked noisy.
NOISY_PCT="${BENCH_NOISY_PCT:-15}"

# ---------------------------------------------------------------- configs
cat >"$WORK/backend.yaml" <<EOF
# Backend: three direct_response listeners.
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: $BACKEND_ADMIN}}
static_resources:
  listeners:
EOF
for p in "${BACKEND_PORTS[@]}"; do
  cat >>"$WORK/backend.yaml" <<EOF
  - name: backend_$p
    address: {socket_address: {address: 127.0.0.1, port_value: $p}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend_$p
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "ok $p\n"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
EOF
done

# wasm_filter NAME MODULE CONFIG_JSON  (empty CONFIG_JSON: no configuration): BENCH_STACK copies
# of the filter in the chain, each its own plugin (root_id) on the one VM.
wasm_filter() {
  local i
  for (( i = 1; i <= STACK; i++ )); do
    cat <<EOF
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: $1
                root_id: "copy$i"
                vm_config:
                  runtime: envoy.wasm.runtime.v8
                  code: {local: {filename: "$2"}}
EOF
    if [[ -n "$3" ]]; then
      cat <<EOF
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '$3'
EOF
    fi
  done
}

# header_from_state: a native filter setting the override header from the filter state the no-op
# probe wrote (wasm.sp_override), after removing whatever the client sent.
header_from_state() {
  cat <<EOF
          - name: envoy.filters.http.header_mutation
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations:
                - remove: $OVERRIDE_HEADER
                - append:
                    header: {key: $OVERRIDE_HEADER, value: "%FILTER_STATE(wasm.sp_override:PLAIN)%"}
                    append_action: OVERWRITE_IF_EXISTS_OR_ADD
EOF
}

# lb_policy_yaml CONFIG: the backend cluster's load balancer (the native module for native, else
# override_host with its round-robin fallback).
lb_policy_yaml() {
  if [[ "$1" == native ]]; then
    cat <<EOF
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.dynamic_modules
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.dynamic_modules.v3.DynamicModulesLoadBalancerConfig
            dynamic_module_config: {name: serving_picker}
            lb_policy_name: serving_picker
            lb_policy_config:
              "@type": type.googleapis.com/google.protobuf.StringValue
              value: '{}'
EOF
    return
  fi
  cat <<EOF
    common_lb_config:
      override_host_status: {statuses: [UNKNOWN, HEALTHY, DEGRADED, DRAINING]}
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - header: x-gateway-destination-endpoint
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin
EOF
}

# front_config CONFIG [PORT ADMIN_PORT] -> yaml on stdout. Only the http_filters differ between the three; the
# clusters (backend with override_host + round_robin fallback, envoy_admin) are the same.
front_config() {
  local filters="" port="${2:-$FRONT_PORT}" admin="${3:-$FRONT_ADMIN}"
  case "$1" in
    plain | native) ;;
    noop) filters="$(wasm_filter noop_filter "$NOOP_WASM" "")" ;;
    serving-picker) filters="$(wasm_filter serving_picker "$SP_WASM" "$SP_CONFIG")" ;;
    probe-property) filters="$(wasm_filter noop_filter "$NOOP_WASM" "{\"probe_property\": $PROBE, \"probe_path\": \"$PROBE_PATH\"}")" ;;
    probe-replace) filters="$(wasm_filter noop_filter "$NOOP_WASM" "{\"probe_replace\": $PROBE}")" ;;
    override-client) ;;
    override-header) filters="$(wasm_filter noop_filter "$NOOP_WASM" "{\"probe_override\": \"$OVERRIDE_VALUE\"}")" ;;
    override-read) filters="$(wasm_filter noop_filter "$NOOP_WASM" "{\"probe_property\": 1, \"probe_path\": \"$PROBE_PATH\", \"probe_override\": \"$OVERRIDE_VALUE\"}")" ;;
    override-state) filters="$(wasm_filter noop_filter "$NOOP_WASM" "{\"probe_state\": 1, \"probe_override\": \"$OVERRIDE_VALUE\"}")
$(header_from_state)" ;;
    *) die "unknown config $1" ;;
  esac
  cat <<EOF
# Front Envoy, config "$1" (generated by benches/e2e/run.sh).
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: $admin}}
static_resources:
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: $port}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: backend}
          http_filters:
EOF
  [[ -z "$filters" ]] || printf '%s\n' "$filters"
  cat <<EOF
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 1s
$(lb_policy_yaml "$1")
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
EOF
  local p
  for p in "${BACKEND_PORTS[@]}"; do
    cat <<EOF
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $p}}}
          metadata: {filter_metadata: {k8s.endpointslice: {ready: true, serving: true, terminating: false}}}
EOF
  done
  cat <<EOF
  - name: envoy_admin
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: envoy_admin
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $admin}}}
EOF
}

for c in "${CONFIGS[@]}"; do
  front_config "$c" >"$WORK/front-$c.yaml"
done
# wrk sends override-client's header from a script, a different rotation on each request.
# The requests are built in init(), once wrk knows the Host header.
{
  echo "local requests = {}"
  echo "function init(args)"
  for v in "${OVERRIDE_ROTATIONS[@]}"; do
    echo "  table.insert(requests, wrk.format(nil, nil, {[\"$OVERRIDE_HEADER\"] = \"$v\"}))"
  done
  echo "end"
  echo "local n = 0"
  echo "request = function() n = n % #requests + 1; return requests[n] end"
} >"$WORK/override-client.lua"
# The interleaved phase's fronts, side by side: noop first (the baseline), then the others
# (BENCH_IL_CONFIGS: a subset, e.g. "serving-picker" for the two of T2 alone).
IL_CONFIGS=(noop)
for c in ${BENCH_IL_CONFIGS:-${CONFIGS[*]}}; do
  [[ " ${CONFIGS[*]} " == *" $c "* ]] || die "BENCH_IL_CONFIGS: unknown config $c (have: ${CONFIGS[*]})"
  [[ "$c" == noop ]] || IL_CONFIGS+=("$c")
done
for i in "${!IL_CONFIGS[@]}"; do
  front_config "${IL_CONFIGS[i]}" $((21010 + i)) $((21910 + i)) >"$WORK/front-il-${IL_CONFIGS[i]}.yaml"
done

echo "== validating configs"
for f in backend.yaml "${CONFIGS[@]/#/front-}"; do
  f="${f%.yaml}.yaml"
  if ! "$ENVOY_BIN" --mode validate -c "$WORK/$f" --disable-hot-restart -l warn >"$WORK/validate-$f.out" 2>&1; then
    cat "$WORK/validate-$f.out" >&2
    die "$f failed validation"
  fi
  echo "   $f OK"
done

# ---------------------------------------------------------------- wrk output parsing
# to_us VALUE_WITH_UNIT -> microseconds. wrk prints times as "%.2f" plus a unit (us below 1 ms,
# then ms, s, m, h): "85.00us", "1.23ms". Anything else gives NaN rather than a wrong number.
to_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
    if (u == "us") f = 1; else if (u == "ms") f = 1000; else if (u == "s") f = 1000000;
    else if (u == "m") f = 60000000; else if (u == "h") f = 3600000000; else f = -1
    if (f < 0) { print "NaN" } else { printf "%.1f\n", n * f }
  }'
}

# parse_wrk FILE -> "rps p50_us p99_us requests non2xx3xx socket_errors"
parse_wrk() {
  local f="$1" rps p50 p99 reqs non2xx sockerr
  rps="$(awk '/^Requests\/sec:/ { print $2 }' "$f")"
  p50="$(to_us "$(awk '$1 == "50%" { print $2 }' "$f")")"
  p99="$(to_us "$(awk '$1 == "99%" { print $2 }' "$f")")"
  reqs="$(awk '/requests in/ { print $1 }' "$f")"
  non2xx="$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$f")"
  sockerr="$(awk '/Socket errors:/ { s = 0; for (i = 3; i <= NF; i += 2) { x = $(i+1); gsub(/,/, "", x); s += x } print s }' "$f")"
  [[ -n "$rps" && -n "$reqs" ]] || { cat "$f" >&2; die "could not parse wrk output $f"; }
  echo "$rps $p50 $p99 $reqs ${non2xx:-0} ${sockerr:-0}"
}

stat_value() { # admin_port stat_name -> value or empty
  curl -s --max-time 2 -G --data-urlencode "filter=^$2\$" "http://127.0.0.1:$1/stats" | awk -F': ' -v n="$2" '$1 == n { print $2 }'
}

# ---------------------------------------------------------------- run
echo "== starting backend Envoy ($PINNING)"
start_envoy backend "$WORK/backend.yaml" "${PIN_OTHER[@]+"${PIN_OTHER[@]}"}"
BACKEND_PID=$STARTED_PID
wait_ready "$BACKEND_ADMIN" "$BACKEND_PID" backend
for p in "${BACKEND_PORTS[@]}"; do
  [[ "$(curl -s --max-time 2 "http://127.0.0.1:$p/")" == "ok $p" ]] || die "backend $p does not answer"
done

URL="http://127.0.0.1:$FRONT_PORT/"
WRK=(wrk -t"$THREADS" -c"$CONNS" --latency)
# One connection, one request in flight: latency is the trip through the front, not a queue.
WRK_LAT=(wrk -t1 -c1 --latency)
LOAD="c$CONNS"
echo "== $ROUNDS rounds, interleaved (order reversed in even rounds); per front Envoy:"
echo "   throughput: wrk -t$THREADS -c$CONNS -d$DURATION after a warm-up of $WARMUP"
echo "   latency:    wrk -t1 -c1 -d$LAT_DURATION, right after, on the same Envoy"
ROW='%-16s %5s %4s %10s %9s %9s %11s %6s %8s %5s %6s %7s\n'
# front/backend/wrk/other: CPU used over the measured window, 100% = one core; other = the rest
# of the machine (other people's processes, steal), '*' when above BENCH_NOISY_PCT (default 15).
printf "$ROW" config round load "req/s" "p50 us" "p99 us" "cpu us/req" front backend wrk other non2xx

# One line per measured run, tab-separated: config round req/s p50 p99 cpu_us_req wrk_requests
# wrk_non2xx3xx wrk_socket_errors envoy_rq_completed envoy_rq_2xx front% backend% wrk% other% noisy
RAW="$WORK/raw.tsv"             # throughput phase
RAW_LAT="$WORK/raw-latency.tsv" # latency phase
: >"$RAW"
: >"$RAW_LAT"

# measure CONFIG ROUND LOAD FRONT_PID WRK_OUT RAW_FILE WRK_COMMAND...: one measured wrk run
# against the running front Envoy; appends a line to RAW_FILE and prints a row.
measure() {
  local c="$1" round="$2" load="$3" fpid="$4" out="$5" raw="$6"
  shift 6
  local rq0 ok0 t0 b0 k0 m0 w0 rq1 ok1 t1 b1 k1 m1 w1 parsed rps p50 p99 reqs non2xx sockerr
  local env_rq env_ok ns other_t front_cpu backend_cpu wrk_cpu other_cpu noisy cpu_us_req
  rq0="$(stat_value "$FRONT_ADMIN" http.ingress.downstream_rq_completed)"
  ok0="$(stat_value "$FRONT_ADMIN" http.ingress.downstream_rq_2xx)"
  t0="$(cpu_ticks "$fpid")"
  b0="$(cpu_ticks "$BACKEND_PID")"
  children_ticks k0
  m0="$(machine_busy_ticks)"
  w0="$(date +%s%N)"
  "${PIN_OTHER[@]+"${PIN_OTHER[@]}"}" "$@" "$URL" >"$out" 2>&1
  kill -0 "$fpid" 2>/dev/null || { tail -n 30 "$WORK/front-$c-r$round.log" >&2 || true; die "$c: front Envoy died during the $load run"; }
  t1="$(cpu_ticks "$fpid")"
  b1="$(cpu_ticks "$BACKEND_PID")"
  children_ticks k1
  m1="$(machine_busy_ticks)"
  w1="$(date +%s%N)"
  rq1="$(stat_value "$FRONT_ADMIN" http.ingress.downstream_rq_completed)"
  ok1="$(stat_value "$FRONT_ADMIN" http.ingress.downstream_rq_2xx)"

  parsed="$(parse_wrk "$out")"
  read -r rps p50 p99 reqs non2xx sockerr <<<"$parsed"
  # Envoy's own count over the measured window: requests completed and those answered 2xx.
  env_rq=$(( ${rq1:-0} - ${rq0:-0} ))
  env_ok=$(( ${ok1:-0} - ${ok0:-0} ))
  # CPU utilisation over the measured window, 100% = one core.
  ns=$((w1 - w0))
  other_t=$(( (m1 - m0) - (t1 - t0) - (b1 - b0) - (k1 - k0) ))
  (( other_t >= 0 )) || other_t=0
  front_cpu="$(pct $((t1 - t0)) $ns)"
  backend_cpu="$(pct $((b1 - b0)) $ns)"
  wrk_cpu="$(pct $((k1 - k0)) $ns)"
  other_cpu="$(pct $other_t $ns)"
  noisy=0
  [[ "${other_cpu%\%}" -le "$NOISY_PCT" ]] || { noisy=1; other_cpu="$other_cpu*"; }
  cpu_us_req="$(awk -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v n="$reqs" 'BEGIN { printf "%.2f", (n > 0) ? t * 1e6 / hz / n : 0 }')"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$c" "$round" "$rps" "$p50" "$p99" "$cpu_us_req" "$reqs" "$non2xx" "$sockerr" "$env_rq" "$env_ok" \
    "$front_cpu" "$backend_cpu" "$wrk_cpu" "${other_cpu%\*}" "$noisy" >>"$raw"
  printf "$ROW" "$c" "$round" "$load" "$rps" "$p50" "$p99" "$cpu_us_req" "$front_cpu" "$backend_cpu" "$wrk_cpu" "$other_cpu" "$non2xx"
}

for round in $(seq 1 "$ROUNDS"); do
  # Odd rounds plain, noop, serving-picker; even rounds the reverse. noop stays in the middle, next
  # to both configs it is paired with, and a drift within a round hits each side of a pair alike
  # over two rounds instead of always favouring the config that runs first.
  order=("${CONFIGS[@]}")
  if (( round % 2 == 0 )); then
    order=()
    for (( i = ${#CONFIGS[@]} - 1; i >= 0; i-- )); do order+=("${CONFIGS[i]}"); done
  fi
  for c in "${order[@]}"; do
    name="front-$c-r$round"
    # Only override-client sends the override header itself.
    client_header=()
    [[ "$c" != override-client ]] || client_header=(-s "$WORK/override-client.lua")
    start_envoy "$name" "$WORK/front-$c.yaml" "${PIN_FRONT[@]+"${PIN_FRONT[@]}"}"
    fpid=$STARTED_PID
    wait_ready "$FRONT_ADMIN" "$fpid" "$name"
    [[ "$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "$URL")" == 200 ]] \
      || die "$c: front Envoy does not proxy to the backend (see $WORK/$name.log)"
    "${PIN_OTHER[@]+"${PIN_OTHER[@]}"}" "${WRK[@]}" "${client_header[@]+"${client_header[@]}"}" -d"$WARMUP" "$URL" >"$WORK/$name.warmup.txt" 2>&1
    # serving-picker hands its request counters to Envoy once per tick (250 ms at
    # refresh_interval_ms 1000), so /stats lags by up to a tick of traffic: wait one out, idle,
    # before each /stats snapshot so the window's counter deltas match its requests. Outside the
    # measured windows, and the same for every config.
    sleep "$STATS_SETTLE"
    curl -s --max-time 2 "http://127.0.0.1:$FRONT_ADMIN/stats" >"$WORK/$name.stats0.txt" || true
    measure "$c" "$round" "$LOAD" "$fpid" "$WORK/$name.wrk.txt" "$RAW" "${WRK[@]}" "${client_header[@]+"${client_header[@]}"}" -d"$DURATION"
    # The filter's stats over the throughput window (the checks in the summary read these).
    sleep "$STATS_SETTLE"
    curl -s --max-time 2 "http://127.0.0.1:$FRONT_ADMIN/stats" >"$WORK/$name.stats.txt" || true
    curl -s --max-time 2 "http://127.0.0.1:$FRONT_ADMIN/clusters" >"$WORK/$name.clusters.txt" || true
    # Latency phase on the same, already warm Envoy: it is paired with the other configs of this
    # round like the throughput run, and needs no Envoy start or warm-up of its own.
    measure "$c" "$round" c1 "$fpid" "$WORK/$name.lat.txt" "$RAW_LAT" "${WRK_LAT[@]}" "${client_header[@]+"${client_header[@]}"}" -d"$LAT_DURATION"
    stop_envoy "$fpid"
  done
done

# ---------------------------------------------------------------- interleaved c1
RAW_IL="$WORK/raw-interleaved.tsv"
: >"$RAW_IL"
if (( IL_LAPS > 0 )); then
  echo "== interleaved c1: ${IL_CONFIGS[*]} side by side (front Envoys on core 0), $IL_LAPS laps after $IL_WARMUP"
  IL_PIDS=()
  IL_TARGETS=()
  for i in "${!IL_CONFIGS[@]}"; do
    c="${IL_CONFIGS[i]}"
    start_envoy "front-il-$c" "$WORK/front-il-$c.yaml" "${PIN_FRONT[@]+"${PIN_FRONT[@]}"}"
    IL_PIDS+=("$STARTED_PID")
    wait_ready $((21910 + i)) "$STARTED_PID" "front-il-$c"
    target="$c=127.0.0.1:$((21010 + i))"
    if [[ "$c" == override-client ]]; then
      for v in "${OVERRIDE_ROTATIONS[@]}"; do target+="|$OVERRIDE_HEADER: $v"; done
    fi
    IL_TARGETS+=("$target")
  done
  # serving-picker serves from its snapshot only once the first refresh is published.
  sleep 2
  declare -a IL_T0
  for i in "${!IL_PIDS[@]}"; do IL_T0[i]="$(cpu_ticks "${IL_PIDS[i]}")"; done
  "${PIN_OTHER[@]+"${PIN_OTHER[@]}"}" "$LATENCY_CLIENT" "$IL_WARMUP" "$IL_LAPS" "${IL_TARGETS[@]}" >"$WORK/interleaved.out" 2>&1 \
    || { cat "$WORK/interleaved.out" >&2; die "interleaved c1: the latency client failed"; }
  # Front CPU per request over the whole client run (warm-up laps included), one column more.
  for i in "${!IL_PIDS[@]}"; do
    t1="$(cpu_ticks "${IL_PIDS[i]}")"
    awk -F'\t' -v c="${IL_CONFIGS[i]}" -v t=$((t1 - IL_T0[i])) -v hz="$CLK_TCK" -v n=$((IL_LAPS + IL_WARMUP)) \
      '$1 == c { printf "%s\t%.2f\n", $0, t * 1e6 / hz / n }' "$WORK/interleaved.out" >>"$RAW_IL"
  done
fi

# ---------------------------------------------------------------- shared-core throughput
# One line per front and rep: config rep req/s cpu_us_req non2xx socket_errors
RAW_SHARED="$WORK/raw-shared.tsv"
: >"$RAW_SHARED"
if (( IL_LAPS > 0 && SHARED_REPS > 0 )); then
  echo "== shared core: ${IL_CONFIGS[*]} on core 0 at once, each driven by its own wrk -c$CONNS, $SHARED_REPS x $SHARED_DURATION"
  for rep in $(seq 1 "$SHARED_REPS"); do
    declare -a SH_T0 SH_WRK
    for i in "${!IL_CONFIGS[@]}"; do SH_T0[i]="$(cpu_ticks "${IL_PIDS[i]}")"; done
    for i in "${!IL_CONFIGS[@]}"; do
      c="${IL_CONFIGS[i]}"
      client_header=()
      [[ "$c" != override-client ]] || client_header=(-s "$WORK/override-client.lua")
      "${PIN_OTHER[@]+"${PIN_OTHER[@]}"}" "${WRK[@]}" "${client_header[@]+"${client_header[@]}"}" -d"$SHARED_DURATION" \
        "http://127.0.0.1:$((21010 + i))/" >"$WORK/shared-$c-$rep.txt" 2>&1 &
      SH_WRK[i]=$!
    done
    for i in "${!IL_CONFIGS[@]}"; do wait "${SH_WRK[i]}" || true; done
    for i in "${!IL_CONFIGS[@]}"; do
      c="${IL_CONFIGS[i]}"
      t1="$(cpu_ticks "${IL_PIDS[i]}")"
      read -r rps p50 p99 reqs non2xx sockerr <<<"$(parse_wrk "$WORK/shared-$c-$rep.txt")"
      awk -v c="$c" -v rep="$rep" -v rps="$rps" -v t=$((t1 - SH_T0[i])) -v hz="$CLK_TCK" -v n="$reqs" -v e="$non2xx" -v s="$sockerr" \
        'BEGIN { printf "%s\t%s\t%s\t%.2f\t%s\t%s\n", c, rep, rps, (n > 0) ? t * 1e6 / hz / n : 0, e, s }' >>"$RAW_SHARED"
    done
  done
fi
if (( IL_LAPS > 0 )); then
  for pid in "${IL_PIDS[@]}"; do stop_envoy "$pid"; done
fi

# interleaved_block: the interleaved c1 phase's table and T2 from it.
interleaved_block() {
  echo "== interleaved c1: $IL_LAPS laps, one request at a time to each front in turn; diff = the median of"
  echo "   the per-lap differences to noop, with its 95% confidence interval (order statistics)"
  printf '%-16s %7s %8s %8s %8s %8s %10s %18s %11s %9s\n' config n "p50 us" "p90 us" "p99 us" "mean us" "diff us" "95% CI" "cpu us/req" "cpu-noop"
  awk -F'\t' 'NR == 1 { base = $11 } { printf "%-16s %7d %8.1f %8.1f %8.1f %8.1f %10s %18s %11.2f %+9.2f\n", $1, $2, $3, $4, $5, $6, $7, "[" $8 ".." $9 "]", $11, $11 - base }' "$RAW_IL"
  awk -F'\t' -v lim="$T2_MAX_US" '$1 == "serving-picker" {
    verdict = ($7 + 0 < lim + 0) ? "met" : "MISSED"
    if ($9 + 0 < lim + 0) verdict = verdict ", whole interval below"
    else if ($8 + 0 >= lim + 0) verdict = verdict ", whole interval above"
    printf "T2 interleaved c1 p50  serving-picker - noop   %+.1f us [%s..%s]  target < %s us: %s\n", $7, $8, $9, lim, verdict
  }' "$RAW_IL"
  # T4: native against plain, both as differences to noop in the same laps (the client pairs each
  # config with the first, noop): native - plain = the difference of those two medians.
  awk -F'\t' -v lim="$T4_MAX_US" '$1 == "plain" { p = $7; p50p = $3; hp = 1 } $1 == "native" { n = $7; p50n = $3; hn = 1 }
    END {
      if (!(hp && hn)) exit
      d = n - p
      printf "T4 interleaved c1 p50  native - plain          %+.1f us (native %+.1f, plain %+.1f vs noop; p50 %.1f vs %.1f us)  target < %s us: %s\n", d, n, p, p50n, p50p, lim, (d < lim + 0) ? "met" : "MISSED"
    }' "$RAW_IL"
}

# shared_block: the shared-core phase's per-rep figures, with T3 and T1 from them.
shared_block() {
  echo "== shared core: $SHARED_REPS reps of $SHARED_DURATION, all fronts saturated at once on one core; per-rep"
  echo "   figures of fronts measured at the same instants, their median and min..max"
  printf '%-45s %9s %20s   %s\n' figure median "min..max" "each rep"
  local pair a b col op fmt label target tname
  for pair in "native plain 3 / %.3f req/s T3 $T3_MIN_RATIO" "native plain 4 - %+.2f cpu_us/req - -" \
              "serving-picker noop 3 / %.3f req/s T1 $T1_MIN_RATIO" "serving-picker noop 4 - %+.2f cpu_us/req - -"; do
    read -r a b col op fmt label tname target <<<"$pair"
    awk -F'\t' -v a="$a" -v b="$b" -v col="$col" -v op="$op" -v fmt="$fmt" -v label="$label" \
        -v tname="$tname" -v target="$target" -v load="c$CONNS" '
      $1 == a { va[$2] = $col } $1 == b { vb[$2] = $col }
      END {
        n = 0
        for (r = 1; (r in va) || (r in vb); r++) if ((r in va) && (r in vb) && vb[r] + 0 != 0) {
          n++; v[n] = (op == "/") ? va[r] / vb[r] : va[r] - vb[r]; all = all sprintf(" " fmt, v[n])
        }
        if (n == 0) exit
        for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
        m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        name = sprintf("%-4s %-11s %s %s %s", load, label, a, op, b)
        printf "%-45s " fmt " %20s  %s\n", name, m, sprintf(fmt ".." fmt, v[1], v[n]), all
        if (tname != "-") {
          k = 0; for (i = 1; i <= n; i++) if (v[i] >= target + 0) k++
          printf "%-45s " fmt " [" fmt ".." fmt "]  target >= %s: %s (%d of %d reps)\n", tname " shared " name, m, v[1], v[n], target, (m >= target + 0) ? "met" : "MISSED", k, n
        }
      }' "$RAW_SHARED"
  done
}

# ---------------------------------------------------------------- summary
median() { # file column config quiet_only -> median of that column over the rounds
  awk -F'\t' -v col="$2" -v c="$3" -v q="$4" '$1 == c && (q == 0 || $16 == 0) { print $col }' "$1" | sort -g \
    | awk '{ v[NR] = $1 } END { if (NR == 0) print "NaN"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# results_table FILE QUIET_ONLY TITLE: each config's medians, then ratios and differences of
# those medians. Runs of different rounds meet here; the paired table below does not mix them.
results_table() {
  local c
  declare -A RPS P50 P99 CPU
  for c in "${CONFIGS[@]}"; do
    RPS[$c]="$(median "$1" 3 "$c" "$2")"
    P50[$c]="$(median "$1" 4 "$c" "$2")"
    P99[$c]="$(median "$1" 5 "$c" "$2")"
    CPU[$c]="$(median "$1" 6 "$c" "$2")"
  done
  echo "== $3"
  printf '%-16s %8s %9s %9s %9s %9s %12s %11s %12s\n' config "req/s" "p50 us" "p99 us" "vs plain" "vs noop" "p50-noop us" "cpu us/req" "cpu-noop us"
  for c in "${CONFIGS[@]}"; do
    awk -v c="$c" -v r="${RPS[$c]}" -v p50="${P50[$c]}" -v p99="${P99[$c]}" -v cpu="${CPU[$c]}" \
        -v rp="${RPS[plain]:-0}" -v rn="${RPS[noop]:-0}" -v pn="${P50[noop]:-0}" -v cn="${CPU[noop]:-0}" 'BEGIN {
      # (a config left out by BENCH_CONFIGS: its ratios print as 0)
      printf "%-16s %8.0f %9.1f %9.1f %9.3f %9.3f %+12.1f %11.2f %+12.2f\n", c, r, p50, p99, (rp + 0 ? r / rp : 0), (rn + 0 ? r / rn : 0), p50 - pn, cpu, cpu - cn
    }'
  done
}
# phase_tables FILE TITLE: the medians table, and when some runs were noisy, a note and the same
# table over the quiet runs only (if every config has one).
phase_tables() {
  local c nn quiet_all
  results_table "$1" 0 "$2"
  nn="$(awk -F'\t' '$16 == 1' "$1" | wc -l)"
  if [[ "$nn" -gt 0 ]]; then
    echo "NOTE: $nn of $((ROUNDS * ${#CONFIGS[@]})) runs had other load above ${NOISY_PCT}% of a core (marked '*' above):"
    echo "      the machine was busy; numbers are noisy. Rerun when it is quiet, or raise BENCH_ROUNDS."
    quiet_all=1
    for c in "${CONFIGS[@]}"; do
      awk -F'\t' -v c="$c" '$1 == c && $16 == 0 { n++ } END { exit n == 0 }' "$1" || quiet_all=0
    done
    if [[ "$quiet_all" == 1 ]]; then
      echo
      results_table "$1" 1 "the same, quiet runs only (median of the runs not marked '*')"
    else
      echo "      (some config has no quiet run, so there is no quiet-only table)"
    fi
  fi
}

# paired_values FILE COLUMN OP A B QUIET_ONLY -> one figure per round, in round order, from config
# A's and config B's runs of that same round: OP "/" gives A/B, "-" gives A-B. QUIET_ONLY 1 keeps
# only the rounds in which no run of FILE was noisy.
paired_values() {
  awk -F'\t' -v col="$2" -v op="$3" -v a="$4" -v b="$5" -v q="$6" '
    { v[$1, $2] = $col; if ($16 == 1) noisy[$2] = 1; if ($2 + 0 > n) n = $2 + 0 }
    END {
      for (r = 1; r <= n; r++) {
        if (!((a, r) in v) || !((b, r) in v) || (q == 1 && (r in noisy))) continue
        x = v[a, r]; y = v[b, r]
        if (x == "NaN" || y == "NaN" || (op == "/" && y + 0 == 0)) print "NaN"
        else if (op == "/") print x / y
        else print x - y
      }
    }' "$1"
}
# spread FORMAT -> "median min..max per-round" of the figures on stdin (in the order given), each
# printed with FORMAT; NaN figures (an unparsable run) are shown as n/a and left out of the median.
spread() {
  awk -v fmt="$1" '
    NF && $1 == "NaN" { all = all " n/a" }
    NF && $1 != "NaN" { n++; v[n] = $1 + 0; all = all sprintf(" " fmt, $1) }
    END {
      if (n == 0) { print "n/a n/a"; exit }
      for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
      m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      printf fmt " " fmt ".." fmt "%s\n", m, v[1], v[n], all
    }'
}
# paired_row LABEL FORMAT FILE COLUMN OP A B QUIET_ONLY
paired_row() {
  local label="$1" fmt="$2" med range rest
  shift 2
  read -r med range rest <<<"$(paired_values "$@" | spread "$fmt")"
  printf '%-44s %9s %20s   %s\n' "$label" "$med" "$range" "$rest"
}
# figure LOAD METRIC PAIR -> an aligned label for a paired figure
figure() { printf '%-4s %-11s %s' "$1" "$2" "$3"; }
# paired_table QUIET_ONLY TITLE
paired_table() {
  echo "== $2"
  printf '%-44s %9s %20s   %s\n' figure median "min..max" "each round, in order"
  paired_row "$(figure "$LOAD" req/s "serving-picker / noop")" %.3f "$RAW" 3 / serving-picker noop "$1"
  paired_row "$(figure "$LOAD" req/s "noop / plain")" %.3f "$RAW" 3 / noop plain "$1"
  paired_row "$(figure "$LOAD" "cpu us/req" "serving-picker - noop")" %+.2f "$RAW" 6 - serving-picker noop "$1"
  paired_row "$(figure "$LOAD" "cpu us/req" "noop - plain")" %+.2f "$RAW" 6 - noop plain "$1"
  paired_row "$(figure "$LOAD" "cpu ratio" "noop / serving-picker")" %.3f "$RAW" 6 / noop serving-picker "$1"
  paired_row "$(figure c1 "p50 us" "serving-picker - noop")" %+.1f "$RAW_LAT" 4 - serving-picker noop "$1"
  paired_row "$(figure c1 "p50 us" "noop - plain")" %+.1f "$RAW_LAT" 4 - noop plain "$1"
  paired_row "$(figure c1 "p99 us" "serving-picker - noop")" %+.1f "$RAW_LAT" 5 - serving-picker noop "$1"
  paired_row "$(figure c1 "cpu us/req" "serving-picker - noop")" %+.2f "$RAW_LAT" 6 - serving-picker noop "$1"
  paired_row "$(figure "$LOAD" req/s "native / plain")" %.3f "$RAW" 3 / native plain "$1"
  paired_row "$(figure "$LOAD" "cpu us/req" "native - plain")" %+.2f "$RAW" 6 - native plain "$1"
  paired_row "$(figure c1 "p50 us" "native - plain")" %+.1f "$RAW_LAT" 4 - native plain "$1"
  paired_row "$(figure c1 "cpu us/req" "native - plain")" %+.2f "$RAW_LAT" 6 - native plain "$1"
}
# quiet_rounds FILE -> how many rounds had no noisy run in FILE
quiet_rounds() {
  awk -F'\t' '{ r[$2] = 1; if ($16 == 1) noisy[$2] = 1 } END { n = 0; for (x in r) if (!(x in noisy)) n++; print n }' "$1"
}
# target_line LABEL UNIT VALUES_FORMAT CMP LIMIT FILE COLUMN OP A B QUIET_ONLY: the median of a
# paired figure against its target, and in how many rounds the figure alone was on the right side.
target_line() {
  local label="$1" unit="$2" fmt="$3" cmp="$4" limit="$5" vals med range rest
  shift 5
  vals="$(paired_values "$@")"
  read -r med range rest <<<"$(spread "$fmt" <<<"$vals")"
  awk -v label="$label" -v unit="$unit" -v med="$med" -v range="$range" -v cmp="$cmp" -v lim="$limit" -v vals="${vals//$'\n'/ }" 'BEGIN {
    n = split(vals, v, " "); k = 0; m = 0
    for (i = 1; i <= n; i++) if (v[i] != "" && v[i] != "NaN") { m++; if ((cmp == ">=" && v[i] + 0 >= lim + 0) || (cmp == "<" && v[i] + 0 < lim + 0)) k++ }
    if (med == "n/a") verdict = "n/a"
    else verdict = ((cmp == ">=" && med + 0 >= lim + 0) || (cmp == "<" && med + 0 < lim + 0)) ? "met" : "MISSED"
    printf "%-45s %12s [%s]  target %s %s%s: %s (%d of %d rounds)\n", label, med unit, range, cmp, lim, unit, verdict, k, m
  }'
}
# targets_block QUIET_ONLY TITLE
targets_block() {
  echo "== $2"
  target_line "T1 $(figure "$LOAD" req/s "serving-picker / noop")" "" %.3f ">=" "$T1_MIN_RATIO" "$RAW" 3 / serving-picker noop "$1"
  target_line "T2 $(figure c1 "p50 us" "serving-picker - noop")" " us" %+.1f "<" "$T2_MAX_US" "$RAW_LAT" 4 - serving-picker noop "$1"
  target_line "T3 $(figure "$LOAD" req/s "native / plain")" "" %.3f ">=" "$T3_MIN_RATIO" "$RAW" 3 / native plain "$1"
  local med range rest
  # The req/s ratio a front saturated on its own core would give (requests per CPU second): a
  # cross-check of T1 that holds when other load kept the front below its core.
  read -r med range rest <<<"$(paired_values "$RAW" 6 / noop serving-picker "$1" | spread %.3f)"
  printf '%-45s %12s [%s]\n' "   $(figure "$LOAD" "cpu ratio" "noop / serving-picker")" "$med" "$range"
  read -r med range rest <<<"$(paired_values "$RAW" 6 - serving-picker noop "$1" | spread %+.2f)"
  printf '%-45s %12s [%s]\n' "   $(figure "$LOAD" "cpu us/req" "serving-picker - noop")" "$med us" "$range"
}

# probe_block: the per-call cost of the two host calls serving-picker makes on every request.
probe_block() {
  echo "== host-call probe: the no-op filter making $PROBE calls per request; cost of one call ="
  echo "   (its cpu us/req - the plain no-op's) / $PROBE, paired per round [min..max]"
  local p label med range rest
  for p in property replace; do
    case "$p" in
      property) label="get_property $PROBE_PATH" ;;
      replace) label="replace_header_map_value" ;;
    esac
    read -r med range rest <<<"$(paired_values "$RAW" 6 - "probe-$p" noop 0 \
      | awk -v n="$PROBE" '$1 == "NaN" { print; next } { print $1 / n }' | spread %.3f)"
    printf '%-45s %12s [%s]\n' "   $(figure "$LOAD" "us/call" "$label")" "$med us" "$range"
  done
}

# stack_block: with BENCH_STACK copies of each filter, the per-request cost of one copy.
stack_block() {
  echo "== filter-stack probe: $STACK copies of each wasm filter in the chain; cost of one copy ="
  echo "   (cpu us/req difference) / $STACK, paired per round [min..max]"
  local a b med range rest
  for pair in "serving-picker noop" "noop plain"; do
    read -r a b <<<"$pair"
    read -r med range rest <<<"$(paired_values "$RAW" 6 - "$a" "$b" 0 \
      | awk -v n="$STACK" '$1 == "NaN" { print; next } { print $1 / n }' | spread %+.2f)"
    printf '%-45s %12s [%s]\n' "   $(figure "$LOAD" "us/copy" "$a - $b")" "$med us" "$range"
  done
}

# decompose_block: serving-picker's cost over the no-op, split into Envoy's part of the override,
# the header write (with the repeated route match), and the filter's own decision.
decompose_block() {
  echo "== override decomposition: cpu us/req differences, paired per round [min..max]"
  local a b label med range rest
  for row in "override-client plain Envoy: override LB + longer request (client-sent header)" \
             "override-header noop header set once by a wasm filter (write, route re-match, LB)" \
             "override-state noop header from filter state by a native filter (no route re-match)" \
             "serving-picker override-header the filter's own decision (cluster name read, lookup)" \
             "override-read override-header one $PROBE_PATH read, once per request" \
             "serving-picker override-read serving-picker's own logic (table lookup, its SDK dispatch)" \
             "serving-picker noop all of serving-picker over the no-op"; do
    read -r a b label <<<"$row"
    read -r med range rest <<<"$(paired_values "$RAW" 6 - "$a" "$b" 0 | spread %+.2f)"
    printf '%-34s %-62s %9s [%s]\n' "   $a - $b" "$label" "$med us" "$range"
  done
  read -r med range rest <<<"$(paired_values "$RAW" 6 / noop override-header 0 | spread %.3f)"
  printf '%-97s %9s [%s]\n' "   cpu ratio noop / override-header: the best any filter setting this header could keep" "$med" "$range"
}

size_of() { stat -c %s "$1"; }
SUMMARY="$WORK/summary.txt"
{
  echo
  phase_tables "$RAW" "throughput phase: median of $ROUNDS rounds, wrk -t$THREADS -c$CONNS -d$DURATION, $PINNING"
  echo "(cpu us/req: the front Envoy's CPU time per request over the measured window; cpu-noop: the"
  echo " filter's own cost above the no-op filter's, less sensitive to load on the machine than req/s."
  echo " p50 here is mostly queueing at $CONNS connections; the latency phase below has the added latency)"
  echo
  phase_tables "$RAW_LAT" "latency phase: median of $ROUNDS rounds, wrk -t1 -c1 -d$LAT_DURATION (one request in flight), same Envoys"
  echo
  paired_table 0 "paired per round: figures from the runs of the same round, then their median and min..max over $ROUNDS rounds"
  # A round counts as quiet only if none of its runs in that phase was noisy.
  qt="$(quiet_rounds "$RAW")"
  ql="$(quiet_rounds "$RAW_LAT")"
  if [[ "$qt" -lt "$ROUNDS" || "$ql" -lt "$ROUNDS" ]]; then
    echo "NOTE: quiet rounds: $qt of $ROUNDS (throughput), $ql of $ROUNDS (latency); rounds with a run marked '*' are noisy."
    if [[ "$qt" -gt 0 || "$ql" -gt 0 ]]; then
      echo
      paired_table 1 "the same, quiet rounds only"
    fi
  fi
  echo
  targets_block 0 "targets: medians of the paired figures over $ROUNDS rounds [min..max]; figures, not asserts"
  # req/s measures the front only while the front is the bottleneck: say so when it was not.
  low="$(awk -F'\t' '{ v = $12; sub(/%$/, "", v); if (v + 0 < 90) n++ } END { print n + 0 }' "$RAW")"
  if [[ "$low" -gt 0 ]]; then
    echo "NOTE: in $low of $((ROUNDS * ${#CONFIGS[@]})) throughput runs the front Envoy used under 90% of its core: something else"
    echo "      (other load, the backend or wrk) limited req/s there, so the T1 ratio is diluted; the cpu ratio is the cross-check."
  fi
  if [[ "$qt" -lt "$ROUNDS" || "$ql" -lt "$ROUNDS" ]] && [[ "$qt" -gt 0 || "$ql" -gt 0 ]]; then
    targets_block 1 "targets, quiet rounds only ($qt throughput, $ql latency)"
  fi
  (( PROBE == 0 )) || { echo; probe_block; }
  (( STACK == 1 )) || { echo; stack_block; }
  (( DECOMPOSE == 0 )) || { echo; decompose_block; }
  [[ ! -s "$RAW_IL" ]] || { echo; interleaved_block; }
  [[ ! -s "$RAW_SHARED" ]] || { echo; shared_block; }
  echo
  echo "wasm module sizes: noop $(size_of "$NOOP_WASM") bytes (copied at start from $NOOP_WASM_SRC)"
  echo "                   serving-picker $(size_of "$SP_WASM") bytes (copied at start from $SP_WASM_SRC)"
  echo "native module: $(size_of "$SP_NATIVE") bytes (copied at start from $SP_NATIVE_SRC)"
  f="$WORK/front-native-r$ROUNDS.stats.txt"
  if [[ -f "$f" ]]; then
    echo "check native: module stats after the last round's throughput window:"
    grep '^dynamicmodulescustom\.' "$f" | sed 's/^/    /' || echo "    (none)"
  fi
  if cmp -s "$NOOP_WASM" "$SP_WASM"; then
    echo "NOTE: the serving-picker slot holds the same module as noop (harness test run)"
  fi
  echo
  for f in "$RAW" "$RAW_LAT"; do
    if [[ "$f" == "$RAW" ]]; then phase="$LOAD"; else phase=c1; fi
    awk -F'\t' -v ph="$phase" '$1 == "serving-picker" { reqs += $7; bad += $8; sock += $9; erq += $10; eok += $11 }
      END {
        printf "check serving-picker %s: wrk non-2xx/3xx %d of %d (fraction %.6f), socket errors %d; ", ph, bad, reqs, (reqs ? bad / reqs : 0), sock
        printf "envoy non-2xx %d of %d (fraction %.6f)\n", erq - eok, erq, (erq ? (erq - eok) / erq : 0)
      }' "$f"
  done
  last="$WORK/front-serving-picker-r$ROUNDS.stats.txt"
  if grep -q '^wasmcustom\.' "$last" 2>/dev/null; then
    awk -F'\t' -v r="$ROUNDS" '$1 == "serving-picker" && $2 == r { print $10 }' "$RAW" >"$WORK/last-rq.txt"
    echo "check serving-picker: filter stats in the last round, over the throughput window (and since start):"
    awk -F': ' -v rq="$(cat "$WORK/last-rq.txt")" '
      FNR == NR { if ($1 ~ /^wasmcustom\./) before[$1] = $2; next }
      $1 ~ /^wasmcustom\./ {
        d = $2 - before[$1]
        if ($1 ~ /\.snapshot\.(bytes|clusters|hosts)$/) printf "    %-58s %10s (gauge)\n", $1, $2
        else printf "    %-58s %10d (%d since start)%s\n", $1, d, $2, ($1 ~ /pick\.ready$/ && rq > 0) ? sprintf(", %.4f of the %d requests", d / rq, rq) : ""
      }' "$WORK/front-serving-picker-r$ROUNDS.stats0.txt" "$last"
  else
    echo "check serving-picker: no wasmcustom.* stats (wasmcustom.serving_picker.pick.ready absent)"
  fi
  echo "check serving-picker: requests per backend host in the last round (throughput phase):"
  grep -E '^backend::127\.0\.0\.1:[0-9]+::rq_total::' "$WORK/front-serving-picker-r$ROUNDS.clusters.txt" 2>/dev/null \
    | sed 's/^/    /' || echo "    (not available)"
  echo
  echo "raw rounds: $RAW (throughput), $RAW_LAT (latency), $RAW_SHARED (shared core); configs, logs and wrk output: $WORK"
} | tee "$SUMMARY"

# Any config, either phase: errors in a baseline run would make its figures, and the ratios
# against it, meaningless, so they fail the benchmark as they do for serving-picker.
for f in "$RAW" "$RAW_LAT"; do
  bad="$(awk -F'\t' '{ n = $8 + $9 + ($10 - $11); if (n > 0) printf "%s%s round %s: %d", (s++ ? ", " : ""), $1, $2, n }' "$f")"
  [[ -z "$bad" ]] || die "non-2xx responses or socket errors in $f: $bad"
done
bad="$(awk -F'\t' '{ n = $5 + $6; if (n > 0) printf "%s%s rep %s: %d", (s++ ? ", " : ""), $1, $2, n }' "$RAW_SHARED")"
[[ -z "$bad" ]] || die "non-2xx responses or socket errors in $RAW_SHARED: $bad"
