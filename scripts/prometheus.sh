#!/usr/bin/env bash
# Debian's Prometheus (`apt-get install prometheus`) with serving-picker's rules loaded, scraping
# the given targets: the demo (`make run`) and its test (tests/e2e/companion/prometheus.rs) start
# it through this script, so both run the same configuration.
#   scripts/prometheus.sh DIR LISTEN INTERVAL JOB@HOST:PORT/PATH...
# writes DIR/prometheus.yml (scrape and evaluation every INTERVAL, the rules of
# deploy/monitoring/serving-picker.rules.yaml), keeps its data in DIR/data, and runs Prometheus
# in the foreground on LISTEN (its UI and HTTP API: http://LISTEN/alerts, /api/v1/alerts).
set -euo pipefail
[[ $# -ge 4 ]] || { echo "usage: $0 DIR LISTEN INTERVAL JOB@HOST:PORT/PATH..." >&2; exit 2; }
dir="$1" listen="$2" interval="$3"
shift 3
command -v prometheus >/dev/null || { echo "prometheus not found: apt-get install prometheus" >&2; exit 1; }
rules="$(cd "$(dirname "$0")/.." && pwd)/deploy/monitoring/serving-picker.rules.yaml"
mkdir -p "$dir/data"
{
  echo "# Written by scripts/prometheus.sh."
  echo "global:"
  echo "  scrape_interval: $interval"
  echo "  scrape_timeout: $interval"
  echo "  evaluation_interval: $interval"
  echo "rule_files:"
  echo "- $rules"
  echo "scrape_configs:"
  n=0
  for t in "$@"; do
    job="${t%%@*}" rest="${t#*@}"
    addr="${rest%%/*}" path="/${rest#*/}"
    [[ "$job" != "$t" && "$addr" != "$rest" ]] || { echo "target $t: expected JOB@HOST:PORT/PATH" >&2; exit 2; }
    n=$((n + 1))
    echo "- job_name: $job-$n"
    echo "  metrics_path: $path"
    echo "  static_configs:"
    echo "  - targets: ['$addr']"
    echo "    labels: {job: '$job'}"
  done
} >"$dir/prometheus.yml"
exec prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
  --storage.tsdb.retention.time=1d --web.listen-address="$listen"
