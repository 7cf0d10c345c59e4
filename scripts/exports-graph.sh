#!/usr/bin/env bash
# The reachability graph wasm-metadce keeps: the outside world reaches these exports, and
# nothing else. Usage: exports-graph.sh EXPORT... > graph.json
set -euo pipefail
reaches=()
nodes=()
for e in "$@"; do
  reaches+=("\"e_$e\"")
  nodes+=("{\"name\": \"e_$e\", \"export\": \"$e\"}")
done
(IFS=,; printf '[{"name": "outside", "root": true, "reaches": [%s]}, %s]\n' "${reaches[*]}" "${nodes[*]}")
