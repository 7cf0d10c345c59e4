#!/usr/bin/env bash
# Writes the demo's EndpointSlices (Service demo/web, port http) into DIR/web.yaml, unless
# the file is there already: three pods, one slice each (each demo pod has its own port).
# Edit the file (or write a new one beside it and rename it into place): the companion
# pushes the change to Envoy, and traffic moves.
set -euo pipefail
dir="${1:?usage: demo-slices.sh DIR}"
mkdir -p "$dir"
[[ -e "$dir/web.yaml" ]] && exit 0
slice() { # name port ready serving terminating
  cat <<YAML
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-$1
  namespace: demo
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: $2, protocol: TCP}]
endpoints:
- addresses: [127.0.0.1]
  conditions: {ready: $3, serving: $4, terminating: $5}
  zone: zone-a
YAML
}
{
  echo "# pod-a ready; pod-b in preStop (serving, terminating); pod-c not serving yet."
  echo "# Try: set pod-a's ready and serving to false -> traffic moves to pod-b."
  slice pod-a 18081 true true false
  slice pod-b 18082 false true true
  slice pod-c 18083 false false false
} >"$dir/.web.yaml.tmp"
mv "$dir/.web.yaml.tmp" "$dir/web.yaml"
