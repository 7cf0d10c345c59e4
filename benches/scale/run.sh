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
#   1. without the filter: RSS and request latency at steady state, the repeated changes' reference
#      (below);
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
#      - ~10 more refreshes, RSS again (growth);
#      - repeated changes: the main thread's CPU per change-driven refresh (the figure of "a refresh
#        of 10,000 hosts costs under 50 ms of the main thread"), per kind of change: "all clusters"
#        (the 1% step above: every EDS file changes) and, with more than one cluster, "one
#        cluster" (10% of one cluster's pods become serving+terminating and as many new not-ready
#        ones appear, one EDS file: one Deployment's rolling update; the i-th change takes
#        cluster i). Per kind, no requests running:
#        . steady windows: after a (periodic) full refresh ends, [a, m] of min(K x GAP, PERIODIC-3)
#          s holds change-gate polls only: the main thread's steady rate; then [m, b] holds the
#          next periodic full refresh (nothing changed): its cost net of that rate;
#        . the phase: K changes, each renamed into place no sooner than GAP s after the previous
#          one and 0.3 s after the filter logged the refresh that saw it (the debug line
#          "refresh: N clusters, B admin bytes, U us in the VM, M ms end to end", read from the
#          log file: no admin call inside the windows, one /stats answer costs the main thread
#          ~10 ms at 10,000 hosts); then snapshot.hosts must be the expected count;
#        . main-thread CPU = utime+stime ticks (1/100 s; schedstat ns beside) of the thread
#          named "envoy", sampled at the window edges: per change = (phase ticks - steady rate
#          x phase seconds) / K; a full refresh in the phase that changed nothing (a periodic
#          one: narrowed refreshes do not restart that timer) is shown, and taken out in a
#          second figure. Also: rename -> published latency (the refresh line's timestamp),
#          the refresh lines' VM us, admin bytes, narrowing, the other threads' CPU (a worker
#          holding the lease does the VM work there), raw ticks and seconds;
#        . the reference: the no-filter Envoy (step 1) gets the same changes (the 1% step, then
#          each kind; the EDS files are put back afterwards): Envoy's own main-thread cost of
#          taking the EDS files in, to set against the filter run's figure.
# One table of figures, a column per scenario. Exit status non-zero when the filter never
# reaches the expected host count (first load, after the change or the repeated changes), or
# validation fails.
#
# Environment (optional): ENVOY_BIN, SERVING_PICKER_WASM, SCALE_SCENARIOS ("1x3 1x10000 100x100"),
# SCALE_WORKDIR (.run/bench-scale), SCALE_FULL_TIMEOUT_S (120), SCALE_LOAD_RATE (100 req/s),
# SCALE_LOAD_SECONDS (5), SCALE_REFRESHES (10), SCALE_CHANGES (K, 5 repeated changes per kind; 0
# skips them), SCALE_CHANGE_GAP_S (GAP, 2 s at least between them), SCALE_PERIODIC_S (PERIODIC,
# 10: the filter's full_refresh_interval_ms in s, which places the steady windows).
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
CHANGES="${SCALE_CHANGES:-5}"
GAP_S="${SCALE_CHANGE_GAP_S:-2}"
PERIODIC_S="${SCALE_PERIODIC_S:-10}" # the filter's full_refresh_interval_ms (default 10000), in s
[[ "$CHANGES" =~ ^[0-9]+$ && "$GAP_S" =~ ^[0-9]+$ && "$PERIODIC_S" =~ ^[0-9]+$ ]] ||
  { echo "bench-scale: SCALE_CHANGES, SCALE_CHANGE_GAP_S, SCALE_PERIODIC_S must be whole numbers" >&2; exit 1; }
GAP_MS=$(( GAP_S * 1000 ))
SETTLE_MS=300 # after the refresh line of a change, before the next change / the end sample
# the change-free windows: as long as the phase's planned K x GAP, but ending before the next
# periodic full refresh (the window starts right after one)
BASE_S=$(( CHANGES * GAP_S < PERIODIC_S - 3 ? CHANGES * GAP_S : PERIODIC_S - 3 ))
(( BASE_S >= 2 )) || BASE_S=2
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
sleep_until() { # epoch ms
  local d=$(( $1 - $(now_ms) ))
  (( d > 0 )) && sleep "$(( d / 1000 )).$(printf '%03d' $(( d % 1000 )))"
  return 0
}
max() { (( $1 > $2 )) && echo "$1" || echo "$2"; }
cpu_sample() { python3 "$PY" cpu "$ENVOY_PID" >"$1"; } # FILE
cpuwin() { python3 "$PY" cpuwin "$1" "$2"; }            # A B -> the main thread's CPU between
# full refreshes so far (polls that were not change-gate skips)
fulls_of() { echo $(( $(stat_of "$1" snapshot.refresh_ok) - $(stat_of "$1" snapshot.refresh_skipped_unchanged) )); }
# sum of update_success over the svc-* clusters: one per EDS file Envoy took in
update_success_sum() {
  admin '/stats?filter=%5Ecluster%5C.svc-%5B%5E.%5D%2A%5C.update_success%24' | awk -F': ' '{ s += $2 } END { print s + 0 }'
}

# The kinds of repeated change: "all" (a 1% rolling-update step in every cluster: every EDS file
# changes), "one" (10% of one cluster's pods, one EDS file: one Deployment's rolling update; the
# I-th change takes cluster I) when there is more than one cluster.
kinds_of() { if (( $1 > 1 )); then echo "all one"; else echo "all"; fi; }
change_args() { case "$1" in all) echo "0.01" ;; one) echo "0.1 --only $2" ;; esac; } # KIND I

# ref_changes KIND (no filter, the reference): a change-free window, then CHANGES changes of KIND
# GAP_S apart, the same as the filter run makes later (same state, same seeds): Envoy's own
# main-thread cost of taking the EDS files in.
ref_changes() {
  local kind="$1" pre="$sd/ref-$1" i t_ren="" eh2 eps2 fl ad files nf=0 u0 u1
  u0="$(update_success_sum)"
  cpu_sample "$pre-a.json"
  sleep "$BASE_S"
  cpu_sample "$pre-m.json"
  for (( i = 1; i <= CHANGES; i++ )); do
    [[ -n "$t_ren" ]] && sleep_until $(( t_ren + GAP_MS ))
    read -r eh2 eps2 fl ad files t_ren < <(python3 "$PY" change "$sd" $(change_args "$kind" "$i"))
    [[ -n "${t_ren:-}" ]] || die "[$name] writing the changed EDS files failed"
    nf=$(( nf + files ))
  done
  sleep_until $(( t_ren + GAP_MS ))
  cpu_sample "$pre-b.json"
  u1="$(update_success_sum)"
  put "ref.$kind.idle" "$(cpuwin "$pre-a.json" "$pre-m.json")"
  put "ref.$kind.phase" "$(cpuwin "$pre-m.json" "$pre-b.json")"
  put "ref.$kind.files" "$nf"
  put "ref.$kind.updates" "$(( u1 - u0 ))"
  say "[$name] no filter, $CHANGES x '$kind': $nf EDS files, update_success +$(( u1 - u0 ))"
}

# rep_kind KIND (with the filter): the steady windows, then the phase of CHANGES changes.
#   Steady: wait for a full refresh (a periodic one) to end, then [a, m] of BASE_S s holds gate
#   polls only (the rate subtracted below), [m2, b] one periodic full refresh (no change) and gate
#   polls. /stats is read only outside the windows (one answer costs the main thread ~10 ms at
#   10,000 hosts).
#   Phase [p0, p1]: change i renamed, wait for the filter's refresh line of it in the log (no admin
#   call), next change no sooner than GAP_S after the rename and SETTLE_MS after that line;
#   p1 likewise after the last. Then snapshot.hosts must be the expected count.
rep_kind() {
  local kind="$1" pre="$sd/rep-$1" s f0 deadline t_full_end="" i t_ren="" t_seen=0 eh2="" eps2 fl ad files
  local trens=() fallback=0 off_rep off_phase nf=0 nfl=0 nad=0 s_a s_m s_b s_p0 s_p1 h
  off_rep="$(stat -c %s "$log")"
  s="$(stats)"
  f0="$(fulls_of "$s")"
  # The filter spaces periodic full refreshes to 50 times their duration (at least PERIODIC_S).
  deadline=$(( $(now_ms) + (3 * PERIODIC_S + 60) * 1000 ))
  while (( $(now_ms) < deadline )); do
    sleep 0.2
    s="$(stats)"
    if (( $(fulls_of "$s") > f0 )); then t_full_end="$(now_ms)"; break; fi
  done
  if [[ -z "$t_full_end" ]]; then
    say "[$name] '$kind': no full refresh within $(( 3 * PERIODIC_S + 60 )) s (SCALE_PERIODIC_S?); steady windows unchecked"
    t_full_end="$(now_ms)"
  fi
  sleep 0.2
  s_a="$(stats)"
  cpu_sample "$pre-a.json"
  sleep "$BASE_S"
  cpu_sample "$pre-m.json"
  s_m="$(stats)"
  cpu_sample "$pre-m2.json"
  # The next periodic full refresh, then time for it to end (Envoy renders ~0.5 s at 10k hosts).
  python3 "$PY" waitlog "$log" "$(stat -c %s "$log")" "$(now_ms)" $(( 3 * PERIODIC_S + 60 )) --periodic >/dev/null \
    || say "[$name] '$kind': no periodic full refresh seen; its window is a steady one"
  sleep 2.5
  cpu_sample "$pre-b.json"
  s_b="$(stats)"

  off_phase="$(stat -c %s "$log")"
  s_p0="$(stats)"
  cpu_sample "$pre-p0.json"
  for (( i = 1; i <= CHANGES; i++ )); do
    [[ -n "$t_ren" ]] && sleep_until "$(max $(( t_ren + GAP_MS )) $(( t_seen + SETTLE_MS )))"
    read -r eh2 eps2 fl ad files t_ren < <(python3 "$PY" change "$sd" $(change_args "$kind" "$i"))
    [[ -n "${t_ren:-}" ]] || die "[$name] writing the changed EDS files failed"
    trens+=("$t_ren")
    nf=$(( nf + files )); nfl=$(( nfl + fl )); nad=$(( nad + ad ))
    if python3 "$PY" waitlog "$log" "$off_phase" "$t_ren" "$FULL_TIMEOUT_S" >/dev/null; then
      t_seen="$(now_ms)"
    else # no refresh line: wait on the gauge instead (admin calls inside the phase: marked)
      fallback=$(( fallback + 1 ))
      wait_hosts "$eh2" "$FULL_TIMEOUT_S" || true
      t_seen="$(now_ms)"
    fi
  done
  sleep_until "$(max $(( t_ren + GAP_MS )) $(( t_seen + SETTLE_MS )))"
  cpu_sample "$pre-p1.json"
  s_p1="$(stats)"
  h="$(stat_of "$s_p1" snapshot.hosts)"
  if [[ "$h" != "$eh2" ]] && ! wait_hosts "$eh2" "$FULL_TIMEOUT_S"; then
    FAILED=1
    say "[$name] FAILED: after $CHANGES x '$kind' snapshot.hosts never reached $eh2 (now $(stat_of "$(stats)" snapshot.hosts))"
  fi
  sleep 0.3 # log flush
  put "rep.$kind.k" "$CHANGES"
  put "rep.$kind.files" "$nf"; put "rep.$kind.flipped" "$nfl"; put "rep.$kind.added" "$nad"
  put "rep.$kind.expect_hosts" "$eh2"; put "rep.$kind.hosts_at_end" "${h:-0}"
  put "rep.$kind.hosts_late" "$([[ "$h" == "$eh2" ]] && echo false || echo true)"
  put "rep.$kind.fallback_waits" "$fallback"
  put "rep.$kind.trens" "[$(IFS=,; echo "${trens[*]}")]"
  put "rep.$kind.base" "$(cpuwin "$pre-a.json" "$pre-m.json")"
  put "rep.$kind.periodic" "$(cpuwin "$pre-m2.json" "$pre-b.json")"
  put "rep.$kind.phase" "$(cpuwin "$pre-p0.json" "$pre-p1.json")"
  put "rep.$kind.stats" "{\"a\":$(gauges_json "$s_a"),\"m\":$(gauges_json "$s_m"),\"b\":$(gauges_json "$s_b"),\"p0\":$(gauges_json "$s_p0"),\"p1\":$(gauges_json "$s_p1")}"
  put "rep.$kind.log" "$(python3 "$PY" logscan "$log" "$off_rep" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"refreshes": d["refreshes"], "fulls": d["fulls"]}))')"
  say "[$name] $CHANGES x '$kind' ($nf EDS files): $(python3 "$PY" repsummary "$kv" "$kind")"
}

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
  local kind
  if (( CHANGES > 0 )); then
    # the same changes as the filter run below (the 1% step first), then the files put back
    cp -a "$sd/eds" "$sd/eds.orig"
    cp "$sd/state.json" "$sd/state.orig.json"
    python3 "$PY" change "$sd" 0.01 >/dev/null
    sleep "$GAP_S"
    for kind in $(kinds_of "$nc"); do ref_changes "$kind"; done
  fi
  stop_envoy "$ENVOY_PID"
  if (( CHANGES > 0 )); then
    rm -rf "$sd/eds"
    mv "$sd/eds.orig" "$sd/eds"
    mv "$sd/state.orig.json" "$sd/state.json"
  fi

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

  # ---- repeated changes, one phase per kind: the main thread's CPU per change-driven refresh
  if (( CHANGES > 0 )); then
    for kind in $(kinds_of "$nc"); do rep_kind "$kind"; done
  fi
  put errors.rep "$(stat_of "$(stats)" snapshot.refresh_error)"

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
