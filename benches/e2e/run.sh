#!/usr/bin/env bash
# End-to-end benchmark: the same front Envoy (--concurrency 1) in three forms,
#   plain           no wasm filter
#   noop            the no-op Rust wasm filter (benches/noop-filter): the floor any wasm filter pays
#   serving-picker  our module, refresh_interval_ms 1000, polling its own admin through envoy_admin
# driven by wrk against a backend Envoy with three direct_response listeners.
#
# Rounds are interleaved (plain, noop, serving-picker, plain, ...), each round a fresh front
# Envoy; the table shows the median of the rounds for each config.
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
#   NOOP_WASM            no-op module                       (default benches/noop-filter/target/wasm32-wasip1/release/noop_filter.wasm)
#   BENCH_DURATION       wrk duration of a measured run     (default 10s)
#   BENCH_WARMUP         wrk warm-up before each run        (default 2s)
#   BENCH_CONNECTIONS    wrk connections                    (default 32)
#   BENCH_THREADS        wrk threads                        (default 1)
#   BENCH_ROUNDS         rounds of the three configs        (default 3)
#   BENCH_WORKDIR        generated configs, logs, raw output (default .run/bench-e2e)
#   BENCH_NOISY_PCT      "other" load (share of one core) above which a run is marked noisy (default 15)
#
# Per run it prints req/s, p50/p99 latency, the front's CPU us per request and the CPU use of
# front, backend, wrk and "other" (everything else on the machine, steal included) over the
# measured window. The machine is shared: runs with other load are marked '*', and a second
# table with the medians of the quiet runs only is printed when there are any.
# Exit status: non-zero if a config fails validation, an Envoy fails, or the serving-picker
# runs saw any non-2xx response or socket error.
# Ports: 127.0.0.1:21000 front listener, 21901 front admin, 21900 backend admin,
#        21081-21083 backends.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$ROOT" "$1" ;; esac; }

ENVOY_BIN="$(abspath "${ENVOY_BIN:-.venv/bin/envoy}")"
SP_WASM="$(abspath "${SERVING_PICKER_WASM:-target/serving_picker.wasm}")"
NOOP_WASM="$(abspath "${NOOP_WASM:-benches/noop-filter/target/wasm32-wasip1/release/noop_filter.wasm}")"
DURATION="${BENCH_DURATION:-10s}"
WARMUP="${BENCH_WARMUP:-2s}"
CONNS="${BENCH_CONNECTIONS:-32}"
THREADS="${BENCH_THREADS:-1}"
ROUNDS="${BENCH_ROUNDS:-3}"
WORK="$(abspath "${BENCH_WORKDIR:-.run/bench-e2e}")"

FRONT_PORT=21000
FRONT_ADMIN=21901
BACKEND_ADMIN=21900
BACKEND_PORTS=(21081 21082 21083)
CONFIGS=(plain noop serving-picker)

die() { echo "bench-e2e: $*" >&2; exit 1; }

# ---------------------------------------------------------------- prerequisites
need_apt() { # command package
  command -v "$1" >/dev/null 2>&1 || (apt-get update && apt-get install -y "$2")
  command -v "$1" >/dev/null 2>&1 || die "$1 not found and could not be installed"
}
need_apt wrk wrk
need_apt curl curl
[[ -x "$ENVOY_BIN" ]] || die "envoy not found at $ENVOY_BIN (run 'make envoy' or set ENVOY_BIN)"
[[ -f "$NOOP_WASM" ]] || die "no-op module not found at $NOOP_WASM (cargo build --release --target wasm32-wasip1 --manifest-path benches/noop-filter/Cargo.toml)"
[[ -f "$SP_WASM" ]] || die "serving-picker module not found at $SP_WASM (run 'make build' or set SERVING_PICKER_WASM)"

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

# wasm_filter NAME MODULE CONFIG_JSON  (empty CONFIG_JSON: no configuration)
wasm_filter() {
  cat <<EOF
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: $1
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
}

# front_config CONFIG -> yaml on stdout. Only the http_filters differ between the three; the
# clusters (backend with override_host + round_robin fallback, envoy_admin) are the same.
front_config() {
  local filters=""
  case "$1" in
    plain) ;;
    noop) filters="$(wasm_filter noop_filter "$NOOP_WASM" "")" ;;
    serving-picker) filters="$(wasm_filter serving_picker "$SP_WASM" '{"refresh_interval_ms": 1000}')" ;;
    *) die "unknown config $1" ;;
  esac
  cat <<EOF
# Front Envoy, config "$1" (generated by benches/e2e/run.sh).
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: $FRONT_ADMIN}}
static_resources:
  listeners:
  - name: main
    address: {socket_address: {address: 127.0.0.1, port_value: $FRONT_PORT}}
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
        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $FRONT_ADMIN}}}
EOF
}

for c in "${CONFIGS[@]}"; do
  front_config "$c" >"$WORK/front-$c.yaml"
done

echo "== validating configs"
for f in backend.yaml front-plain.yaml front-noop.yaml front-serving-picker.yaml; do
  if ! "$ENVOY_BIN" --mode validate -c "$WORK/$f" --disable-hot-restart -l warn >"$WORK/validate-$f.out" 2>&1; then
    cat "$WORK/validate-$f.out" >&2
    die "$f failed validation"
  fi
  echo "   $f OK"
done

# ---------------------------------------------------------------- wrk output parsing
# to_us VALUE_WITH_UNIT -> microseconds
to_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
    if (u == "us") f = 1; else if (u == "ms") f = 1000; else if (u == "s") f = 1000000;
    else if (u == "m") f = 60000000; else f = -1
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
echo "== wrk -t$THREADS -c$CONNS -d$DURATION (warm-up $WARMUP), $ROUNDS rounds, interleaved"
ROW='%-16s %5s %10s %9s %9s %11s %6s %8s %5s %6s %7s\n'
# front/backend/wrk/other: CPU used over the measured window, 100% = one core; other = the rest
# of the machine (other people's processes, steal), '*' when above BENCH_NOISY_PCT (default 15).
printf "$ROW" config round "req/s" "p50 us" "p99 us" "cpu us/req" front backend wrk other non2xx

RAW="$WORK/raw.tsv"
: >"$RAW"
for round in $(seq 1 "$ROUNDS"); do
  for c in "${CONFIGS[@]}"; do
    name="front-$c-r$round"
    start_envoy "$name" "$WORK/front-$c.yaml" "${PIN_FRONT[@]+"${PIN_FRONT[@]}"}"
    fpid=$STARTED_PID
    wait_ready "$FRONT_ADMIN" "$fpid" "$name"
    [[ "$(curl -s --max-time 2 -o /dev/null -w '%{http_code}' "$URL")" == 200 ]] \
      || die "$c: front Envoy does not proxy to the backend (see $WORK/$name.log)"
    "${PIN_OTHER[@]+"${PIN_OTHER[@]}"}" "${WRK[@]}" -d"$WARMUP" "$URL" >"$WORK/$name.warmup.txt" 2>&1
    curl -s --max-time 2 "http://127.0.0.1:$FRONT_ADMIN/stats" >"$WORK/$name.stats0.txt" || true
    rq0="$(stat_value "$FRONT_ADMIN" http.ingress.downstream_rq_completed)"
    ok0="$(stat_value "$FRONT_ADMIN" http.ingress.downstream_rq_2xx)"
    t0="$(cpu_ticks "$fpid")"
    b0="$(cpu_ticks "$BACKEND_PID")"
    children_ticks k0
    m0="$(machine_busy_ticks)"
    w0="$(date +%s%N)"
    "${PIN_OTHER[@]+"${PIN_OTHER[@]}"}" "${WRK[@]}" -d"$DURATION" "$URL" >"$WORK/$name.wrk.txt" 2>&1
    kill -0 "$fpid" 2>/dev/null || { tail -n 30 "$WORK/$name.log" >&2 || true; die "$c: front Envoy died during the run"; }
    t1="$(cpu_ticks "$fpid")"
    b1="$(cpu_ticks "$BACKEND_PID")"
    children_ticks k1
    m1="$(machine_busy_ticks)"
    w1="$(date +%s%N)"
    rq1="$(stat_value "$FRONT_ADMIN" http.ingress.downstream_rq_completed)"
    ok1="$(stat_value "$FRONT_ADMIN" http.ingress.downstream_rq_2xx)"
    curl -s --max-time 2 "http://127.0.0.1:$FRONT_ADMIN/stats" >"$WORK/$name.stats.txt" || true
    curl -s --max-time 2 "http://127.0.0.1:$FRONT_ADMIN/clusters" >"$WORK/$name.clusters.txt" || true
    stop_envoy "$fpid"

    parsed="$(parse_wrk "$WORK/$name.wrk.txt")"
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
      "$front_cpu" "$backend_cpu" "$wrk_cpu" "${other_cpu%\*}" "$noisy" >>"$RAW"
    printf "$ROW" "$c" "$round" "$rps" "$p50" "$p99" "$cpu_us_req" "$front_cpu" "$backend_cpu" "$wrk_cpu" "$other_cpu" "$non2xx"
  done
done

# ---------------------------------------------------------------- summary
median() { # column config quiet_only -> median of that column over the rounds
  awk -F'\t' -v col="$1" -v c="$2" -v q="$3" '$1 == c && (q == 0 || $16 == 0) { print $col }' "$RAW" | sort -g \
    | awk '{ v[NR] = $1 } END { if (NR == 0) print "NaN"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# results_table QUIET_ONLY TITLE
results_table() {
  local c
  declare -A RPS P50 P99 CPU
  for c in "${CONFIGS[@]}"; do
    RPS[$c]="$(median 3 "$c" "$1")"
    P50[$c]="$(median 4 "$c" "$1")"
    P99[$c]="$(median 5 "$c" "$1")"
    CPU[$c]="$(median 6 "$c" "$1")"
  done
  echo "== $2"
  printf '%-16s %8s %9s %9s %9s %9s %12s %11s %12s\n' config "req/s" "p50 us" "p99 us" "vs plain" "vs noop" "p50-noop us" "cpu us/req" "cpu-noop us"
  for c in "${CONFIGS[@]}"; do
    awk -v c="$c" -v r="${RPS[$c]}" -v p50="${P50[$c]}" -v p99="${P99[$c]}" -v cpu="${CPU[$c]}" \
        -v rp="${RPS[plain]}" -v rn="${RPS[noop]}" -v pn="${P50[noop]}" -v cn="${CPU[noop]}" 'BEGIN {
      printf "%-16s %8.0f %9.1f %9.1f %9.3f %9.3f %+12.1f %11.2f %+12.2f\n", c, r, p50, p99, r / rp, r / rn, p50 - pn, cpu, cpu - cn
    }'
  done
}

size_of() { stat -c %s "$1"; }
SUMMARY="$WORK/summary.txt"
{
  echo
  results_table 0 "e2e results: median of $ROUNDS rounds, wrk -t$THREADS -c$CONNS -d$DURATION, $PINNING"
  echo "(cpu us/req: the front Envoy's CPU time per request over the measured window; cpu-noop: the"
  echo " filter's own cost above the no-op filter's, less sensitive to load on the machine than req/s)"
  nn="$(awk -F'\t' '$16 == 1' "$RAW" | wc -l)"
  if [[ "$nn" -gt 0 ]]; then
    echo "NOTE: $nn of $((ROUNDS * ${#CONFIGS[@]})) runs had other load above ${NOISY_PCT}% of a core (marked '*' above):"
    echo "      the machine was busy; numbers are noisy. Rerun when it is quiet, or raise BENCH_ROUNDS."
    quiet_all=1
    for c in "${CONFIGS[@]}"; do
      awk -F'\t' -v c="$c" '$1 == c && $16 == 0 { n++ } END { exit n == 0 }' "$RAW" || quiet_all=0
    done
    if [[ "$quiet_all" == 1 ]]; then
      echo
      results_table 1 "the same, quiet runs only (median of the runs not marked '*')"
    else
      echo "      (some config has no quiet run, so there is no quiet-only table)"
    fi
  fi
  echo
  echo "wasm module sizes: noop $(size_of "$NOOP_WASM") bytes ($NOOP_WASM)"
  echo "                   serving-picker $(size_of "$SP_WASM") bytes ($SP_WASM)"
  if cmp -s "$NOOP_WASM" "$SP_WASM"; then
    echo "NOTE: the serving-picker slot holds the same module as noop (harness test run)"
  fi
  echo
  awk -F'\t' '$1 == "serving-picker" { reqs += $7; bad += $8; sock += $9; erq += $10; eok += $11 }
    END {
      printf "check serving-picker: wrk non-2xx/3xx %d of %d (fraction %.6f), socket errors %d; ", bad, reqs, (reqs ? bad / reqs : 0), sock
      printf "envoy non-2xx %d of %d (fraction %.6f)\n", erq - eok, erq, (erq ? (erq - eok) / erq : 0)
    }' "$RAW"
  last="$WORK/front-serving-picker-r$ROUNDS.stats.txt"
  if grep -q '^wasmcustom\.' "$last" 2>/dev/null; then
    awk -F'\t' -v r="$ROUNDS" '$1 == "serving-picker" && $2 == r { print $10 }' "$RAW" >"$WORK/last-rq.txt"
    echo "check serving-picker: filter stats in the last round, over the measured window (and since start):"
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
  echo "check serving-picker: requests per backend host in the last round:"
  grep -E '^backend::127\.0\.0\.1:[0-9]+::rq_total::' "$WORK/front-serving-picker-r$ROUNDS.clusters.txt" 2>/dev/null \
    | sed 's/^/    /' || echo "    (not available)"
  echo
  echo "raw rounds: $RAW; configs, logs and wrk output: $WORK"
} | tee "$SUMMARY"

awk -F'\t' '$1 == "serving-picker" { bad += $8 + $9 + ($10 - $11) } END { exit bad > 0 }' "$RAW" \
  || die "serving-picker run had non-2xx responses or socket errors"
