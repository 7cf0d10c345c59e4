#!/usr/bin/env bash
# Scale benchmark: the snapshot refresh in real Envoy (1.40, V8, --concurrency 2) with many
# endpoints. Scenarios (clusters x hosts): 1x3 (baseline), 1x10000, 100x100.
#
# Per scenario, benches/scale/scale.py generates EDS files (one watched directory per cluster,
# endpoints 127.1.x.y:8080 that nothing listens on, EndpointSlice metadata ~90% ready, ~5%
# serving+terminating, ~5% not serving, zones a/b/c as localities, weights 1/2/5) and two
# bootstraps that differ only in the wasm filter (plugin config {"refresh_interval_ms": 1000}):
#   clusters   envoy_admin (STATIC, this Envoy's admin), real_backend (STATIC, override_host,
#              -> a direct_response listener of the same Envoy), svc-N (EDS from a watched file,
#              override_host with round_robin fallback, outlier_detection as in envoy.yaml)
#   routes     /c/<cluster>/ -> that cluster (routing check), / -> real_backend (latency)
# Both are checked with `envoy --mode validate` first. Then:
#   1. without the filter: RSS and request latency at steady state (the reference);
#   2. with the filter (-l info --component-log-level wasm:debug):
#      - start -> /ready, then /ready -> the first snapshot with every expected host
#        (polling /stats snapshot.hosts), the debug log's figures of that refresh, the gauges;
#      - a routing check: requests to the first EDS cluster must be overridden to a ready host;
#      - ~10 unchanged polls (mostly change-gate skips): refresh_busy_us each time (the last full
#        refresh's), CPU of Envoy's threads;
#      - the two admin URLs curled here (bytes, time_total: Envoy's own rendering on its main
#        thread), 3 times each, median;
#      - request latency during unchanged refreshes (paced keep-alive GETs to real_backend);
#      - a 1% rolling-update step (per cluster: 1% of the ready pods become serving+terminating
#        and as many new not-ready pods appear; every EDS file renamed into place), with requests
#        running: rename -> snapshot with the new host count, the debug log's refresh figures;
#      - ~10 more refreshes, RSS again (growth).
# One table of figures, a column per scenario. Exit status non-zero when the filter never
# reaches the expected host count (first load or after the change), or validation fails.
#
# Environment (optional): ENVOY_BIN, SERVING_PICKER_WASM, SCALE_SCENARIOS ("1x3 1x10000 100x100"),
# SCALE_WORKDIR (.run/bench-scale), SCALE_FULL_TIMEOUT_S (120), SCALE_LOAD_RATE (100 req/s),
# SCALE_LOAD_SECONDS (5), SCALE_REFRESHES (10).
# Ports: 127.0.0.1:22000 listener, 22001 admin, 22081 the direct_response backend listener.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$ROOT" "$1" ;; esac; }

ENVOY_BIN="$(abspath "${ENVOY_BIN:-.venv/bin/envoy}")"
SP_WASM="$(abspath "${SERVING_PICKER_WASM:-target/serving_picker.wasm}")"
SCENARIOS="${SCALE_SCENARIOS:-1x3 1x10000 100x100}"
WORK="$(abspath "${SCALE_WORKDIR:-.run/bench-scale}")"
FULL_TIMEOUT_S="${SCALE_FULL_TIMEOUT_S:-120}"
LOAD_RATE="${SCALE_LOAD_RATE:-100}"
LOAD_SECONDS="${SCALE_LOAD_SECONDS:-5}"
REFRESHES="${SCALE_REFRESHES:-10}"
PLUGIN_CONFIG='{"refresh_interval_ms": 1000}'
PY="$ROOT/benches/scale/scale.py"

LISTEN=22000
ADMIN=22001
BACKEND=22081
DUMP_PATH='/config_dump?include_eds&mask=static_endpoint_configs,dynamic_endpoint_configs'
CLUSTERS_PATH='/clusters?format=json'

die() { echo "bench-scale: $*" >&2; exit 1; }
say() { echo "bench-scale: $*" >&2; }

command -v curl >/dev/null || die "curl not found"
command -v python3 >/dev/null || die "python3 not found"
[[ -x "$ENVOY_BIN" ]] || die "envoy not found at $ENVOY_BIN (run 'make envoy' or set ENVOY_BIN)"
[[ -f "$SP_WASM" ]] || die "serving-picker module not found at $SP_WASM (run 'make build')"
for p in "$LISTEN" "$ADMIN" "$BACKEND"; do
  if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$p/"; then
    die "port $p is already in use (a previous run still going?)"
  fi
done

rm -rf "$WORK"
mkdir -p "$WORK"

# ---------------------------------------------------------------- process handling
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]+"${PIDS[@]}"}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]+"${PIDS[@]}"}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

forget_pid() {
  local p rest=()
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do [[ "$p" == "$1" ]] || rest+=("$p"); done
  PIDS=("${rest[@]+"${rest[@]}"}")
}

# start_envoy DIR NAME: the bootstrap DIR/bootstrap-NAME.json; sets ENVOY_PID
start_envoy() {
  "$ENVOY_BIN" -c "$1/bootstrap-$2.json" --concurrency 2 --disable-hot-restart \
    -l info --component-log-level wasm:debug \
    --log-path "$1/envoy-$2.log" --file-flush-interval-msec 100 \
    </dev/null >"$1/envoy-$2.out" 2>&1 &
  ENVOY_PID=$!
  PIDS+=("$ENVOY_PID")
}

stop_envoy() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  forget_pid "$1"
}

now_ms() { date +%s%3N; }
rss_kb() { ps -o rss= -p "$1" | tr -d ' '; }
admin() { curl -s --max-time 10 "http://127.0.0.1:$ADMIN$1" || true; }
# The filter's stats as "name value" lines (prefix wasmcustom.serving_picker. dropped).
stats() { admin '/stats?filter=serving_picker' | sed -n 's/^wasmcustom\.serving_picker\.\([^:]*\): \(.*\)$/\1 \2/p'; }
stat_of() { awk -v k="$2" '$1 == k { print $2; found = 1 } END { if (!found) print 0 }' <<<"$1"; }
gauges_json() { # stats text -> JSON of the figures we report
  local s="$1"
  printf '{"hosts":%s,"clusters":%s,"bytes":%s,"refresh_busy_us":%s,"admin_bytes":%s,"refresh_ok":%s,"skipped":%s,"refresh_error":%s,"published":%s}' \
    "$(stat_of "$s" snapshot.hosts)" "$(stat_of "$s" snapshot.clusters)" "$(stat_of "$s" snapshot.bytes)" \
    "$(stat_of "$s" snapshot.refresh_busy_us)" "$(stat_of "$s" snapshot.admin_bytes)" \
    "$(stat_of "$s" snapshot.refresh_ok)" "$(stat_of "$s" snapshot.refresh_skipped_unchanged)" "$(stat_of "$s" snapshot.refresh_error)" "$(stat_of "$s" snapshot.published)"
}

wait_ready() { # pid log
  local deadline=$(( $(now_ms) + 60000 ))
  while (( $(now_ms) < deadline )); do
    kill -0 "$1" 2>/dev/null || { tail -n 30 "$2" >&2 || true; die "Envoy exited during startup"; }
    [[ "$(curl -s --max-time 1 "http://127.0.0.1:$ADMIN/ready" || true)" == LIVE* ]] && return 0
    sleep 0.02
  done
  tail -n 30 "$2" >&2 || true
  die "Envoy not ready after 60s"
}

# wait_hosts N TIMEOUT_S: polls snapshot.hosts until it is N; 0 on success.
wait_hosts() {
  local deadline=$(( $(now_ms) + $2 * 1000 )) h
  while (( $(now_ms) < deadline )); do
    kill -0 "$ENVOY_PID" 2>/dev/null || return 1
    h="$(stat_of "$(stats)" snapshot.hosts)"
    [[ "$h" == "$1" ]] && return 0
    sleep 0.02
  done
  return 1
}

# wait_refreshes N: waits for N more refresh_ok; the refresh_busy_us after each into BUSY (a JSON list).
wait_refreshes() {
  local want="$1" s ok prev seen=0 busy=() deadline=$(( $(now_ms) + ($1 * 3 + 10) * 1000 ))
  prev="$(stat_of "$(stats)" snapshot.refresh_ok)"
  while (( seen < want && $(now_ms) < deadline )); do
    sleep 0.1
    s="$(stats)"
    ok="$(stat_of "$s" snapshot.refresh_ok)"
    if (( ok > prev )); then
      busy+=("$(stat_of "$s" snapshot.refresh_busy_us)")
      seen=$(( seen + ok - prev ))
      prev="$ok"
    fi
  done
  BUSY="[$(IFS=,; echo "${busy[*]-}")]"
}

curl_time() { # path -> "bytes ms"
  curl -s -o /dev/null --max-time 30 -w '%{size_download} %{time_total}\n' "http://127.0.0.1:$ADMIN$1" |
    awk '{ printf "%d %.1f\n", $1, $2 * 1000 }'
}
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# admin_curls PREFIX: each admin URL 3 times; PREFIX.dump_bytes, PREFIX.dump_ms, ... into the results
admin_curls() {
  local d1=() c1=() r i
  for i in 1 2 3; do
    r="$(curl_time "$DUMP_PATH")"; d1+=("$r")
    r="$(curl_time "$CLUSTERS_PATH")"; c1+=("$r")
  done
  put "$1.dump_bytes" "$(printf '%s\n' "${d1[@]}" | awk '{ print $1 }' | median)"
  put "$1.dump_ms" "$(printf '%s\n' "${d1[@]}" | awk '{ print $2 }' | median)"
  put "$1.clusters_bytes" "$(printf '%s\n' "${c1[@]}" | awk '{ print $1 }' | median)"
  put "$1.clusters_ms" "$(printf '%s\n' "${c1[@]}" | awk '{ print $2 }' | median)"
  put "$1.raw" "\"dump: ${d1[*]}; clusters: ${c1[*]}\""
}

FAILED=0
RESULTS=()

run_scenario() {
  local name="$1" nc="${1%x*}" nh="${1#*x}"
  local sd="$WORK/$name" kv
  mkdir -p "$sd"
  kv="$sd/results.kv"
  put() { printf '%s\t%s\n' "$1" "$2" >>"$kv"; }
  put scenario "\"$name\""
  put nclusters "$nc"
  put nhosts "$nh"
  put loadavg "\"$(cut -d' ' -f1-3 /proc/loadavg)\""
  RESULTS+=("$sd/result.json")

  say "[$name] generating $nc x $nh endpoints"
  local ec eh eps edsb
  read -r ec eh eps edsb < <(python3 "$PY" gen "$sd" "$nc" "$nh" "$LISTEN" "$ADMIN" "$BACKEND" "$SP_WASM" "$PLUGIN_CONFIG")
  [[ -n "${edsb:-}" ]] || die "[$name] generating the EDS files failed"
  put expect_clusters "$ec"; put expect_hosts "$eh"; put endpoints "$eps"; put eds_bytes "$edsb"
  local first
  first="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["first_cluster"])' "$sd/expected.json")"

  local b
  for b in filter nofilter; do
    "$ENVOY_BIN" --mode validate -c "$sd/bootstrap-$b.json" --disable-hot-restart -l warning \
      >"$sd/validate-$b.out" 2>&1 || { cat "$sd/validate-$b.out" >&2; die "[$name] bootstrap-$b.json does not validate"; }
  done
  say "[$name] bootstraps validate; $eps endpoints, expecting $eh hosts in $ec clusters"

  # ---- reference: no filter
  start_envoy "$sd" nofilter
  wait_ready "$ENVOY_PID" "$sd/envoy-nofilter.log"
  sleep 2
  put rss.nofilter "$(rss_kb "$ENVOY_PID")"
  admin_curls curl_nofilter
  python3 "$PY" load "$LISTEN" /lat "$LOAD_RATE" "$LOAD_SECONDS" 8 "$sd/lat-nofilter.json"
  put lat.nofilter "$(cat "$sd/lat-nofilter.json")"
  stop_envoy "$ENVOY_PID"

  # ---- with the filter
  local log="$sd/envoy-filter.log" t0 t_ready t_full s
  t0="$(now_ms)"
  start_envoy "$sd" filter
  wait_ready "$ENVOY_PID" "$log"
  t_ready="$(now_ms)"
  put rss.ready "$(rss_kb "$ENVOY_PID")"
  put hosts_at_ready "$(stat_of "$(stats)" snapshot.hosts)"
  put start_to_ready_ms "$(( t_ready - t0 ))"
  say "[$name] ready after $(( t_ready - t0 )) ms; waiting for $eh hosts in the snapshot"
  if ! wait_hosts "$eh" "$FULL_TIMEOUT_S"; then
    FAILED=1
    say "[$name] FAILED: snapshot.hosts never reached $eh (now $(stat_of "$(stats)" snapshot.hosts)); log tail:"
    grep -E 'serving_picker|wasm' "$log" | tail -n 20 >&2 || true
    put g_end "$(gauges_json "$(stats)")"
    put first "$(python3 "$PY" logscan "$log")"
    stop_envoy "$ENVOY_PID"
    python3 "$PY" assemble "$kv" >"$sd/result.json"
    return 0
  fi
  t_full="$(now_ms)"
  put ready_to_full_ms "$(( t_full - t_ready ))"
  put rss.full "$(rss_kb "$ENVOY_PID")"
  put g_first "$(gauges_json "$(stats)")"
  sleep 0.3 # log flush
  put first "$(python3 "$PY" logscan "$log")"
  say "[$name] full snapshot $(( t_full - t_ready )) ms after ready"

  # ---- unchanged refreshes
  python3 "$PY" cpu "$ENVOY_PID" >"$sd/cpu-a.json"
  local off_steady
  off_steady="$(stat -c %s "$log")"
  wait_refreshes "$REFRESHES"
  python3 "$PY" cpu "$ENVOY_PID" >"$sd/cpu-b.json"
  put steady_busy "$BUSY"
  put cpu_steady "$(python3 "$PY" cpudiff "$sd/cpu-a.json" "$sd/cpu-b.json")"
  put rss.steady "$(rss_kb "$ENVOY_PID")"
  put steady_log "$(python3 "$PY" logscan "$log" "$off_steady")"
  put errors.steady "$(stat_of "$(stats)" snapshot.refresh_error)"
  say "[$name] steady refreshes busy_us: $BUSY"

  # ---- admin output, rendered by Envoy's main thread
  admin_curls curl
  admin "$DUMP_PATH" >"$sd/config_dump.json"
  admin "$CLUSTERS_PATH" >"$sd/clusters.json"
  put errors.curls "$(stat_of "$(stats)" snapshot.refresh_error)"

  # ---- request latency during unchanged refreshes
  python3 "$PY" load "$LISTEN" /lat "$LOAD_RATE" "$LOAD_SECONDS" 8 "$sd/lat-steady.json"
  put lat.steady "$(cat "$sd/lat-steady.json")"

  # ---- a 1% rolling-update step, requests running
  local off_change load_pid eh2 eps2 flipped added files t_ren t_snap
  off_change="$(stat -c %s "$log")"
  python3 "$PY" load "$LISTEN" /lat "$LOAD_RATE" "$(( LOAD_SECONDS + 4 ))" 8 "$sd/lat-change.json" &
  load_pid=$!
  PIDS+=("$load_pid")
  sleep 1.5
  read -r eh2 eps2 flipped added files t_ren < <(python3 "$PY" change "$sd" 0.01)
  [[ -n "${t_ren:-}" ]] || die "[$name] writing the changed EDS files failed"
  put change.flipped "$flipped"; put change.added "$added"; put change.files "$files"
  put change.expect_hosts "$eh2"
  say "[$name] 1% change renamed ($flipped flipped, $added added in $files files); waiting for $eh2 hosts"
  if wait_hosts "$eh2" "$FULL_TIMEOUT_S"; then
    t_snap="$(now_ms)"
    put change.to_snapshot_ms "$(( t_snap - t_ren ))"
  else
    FAILED=1
    say "[$name] FAILED: after the change snapshot.hosts never reached $eh2 (now $(stat_of "$(stats)" snapshot.hosts))"
  fi
  wait "$load_pid" || true
  forget_pid "$load_pid"
  put lat.change "$(cat "$sd/lat-change.json")"
  sleep 0.3
  put change.refreshes "$(python3 "$PY" logscan "$log" "$off_change" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["refreshes"]))')"

  put errors.change "$(stat_of "$(stats)" snapshot.refresh_error)"

  # ---- more refreshes: memory growth (RSS after each block of REFRESHES)
  local rss_series=() after=() blk
  for blk in 1 2 3; do
    wait_refreshes "$REFRESHES"
    after+=("${BUSY:1:${#BUSY}-2}")
    rss_series+=("$(rss_kb "$ENVOY_PID")")
  done
  put after_busy "[$(IFS=,; echo "${after[*]}" | sed 's/,,*/,/g; s/^,//; s/,$//')]"
  put rss.end "${rss_series[0]}"
  put rss.series "[$(IFS=,; echo "${rss_series[*]}")]"
  put errors.after "$(stat_of "$(stats)" snapshot.refresh_error)"

  # ---- routing check, last: nothing listens on 127.1.x.y, so these end in 503 after the pick
  # (the access log shows the override and the host tried); the connect failures make outlier
  # detection eject a host for 10s, which would otherwise change the snapshot mid-measurement.
  local i
  for i in 1 2 3 4 5 6; do
    curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$LISTEN/c/$first/check-$i" || true
  done
  sleep 0.5
  put routing "$(python3 "$PY" routecheck "$sd" "/c/$first/check-")"
  put g_end "$(gauges_json "$(stats)")"

  # leader thread (the log's [tid] -> the thread's name) and the filter's warnings
  local scan leader_tid leader_name nleaders
  scan="$(python3 "$PY" logscan "$log")"
  leader_tid="$(python3 -c 'import json,sys; l=json.loads(sys.argv[1])["leaders"]; print(l[-1]["tid"] if l else "")' "$scan")"
  nleaders="$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])["leaders"]))' "$scan")"
  leader_name="$(cat "/proc/$ENVOY_PID/task/$leader_tid/comm" 2>/dev/null || echo "?")"
  [[ "$leader_name" == envoy ]] && leader_name="envoy (main thread)"
  put leader "\"$leader_name, $nleaders election(s)\""
  put warnings "$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["warnings"]))' "$scan")"
  stop_envoy "$ENVOY_PID"
  python3 "$PY" assemble "$kv" >"$sd/result.json"
  say "[$name] done"
}

say "machine: $(nproc) cores, loadavg $(cut -d' ' -f1-3 /proc/loadavg); $("$ENVOY_BIN" --version 2>/dev/null | grep -o 'version: [^ ]*' || true)"
for sc in $SCENARIOS; do
  [[ "$sc" =~ ^[0-9]+x[0-9]+$ ]] || die "bad scenario '$sc' (want CLUSTERSxHOSTS)"
  run_scenario "$sc"
done

echo
echo "serving-picker snapshot refresh at scale (Envoy --concurrency 2, refresh_interval_ms 1000, admin_timeout_ms 1000 default)"
echo "latency: GET / -> real_backend through the filter, $LOAD_RATE req/s over 8 keep-alive connections"
python3 "$PY" table "${RESULTS[@]}"
echo
for r in "${RESULTS[@]}"; do
  python3 - "$r" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
w = r.get("warnings") or []
print("%s: %d filter warning/error line(s)%s" % (r["scenario"], len(w), ":" if w else ""))
for line in w[:8]:
    print("   ", line)
EOF
done
say "loadavg at the end: $(cut -d' ' -f1-3 /proc/loadavg); raw files in $WORK"
if (( FAILED )); then
  die "the filter did not reach the expected host count in at least one scenario"
fi
