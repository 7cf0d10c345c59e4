#!/usr/bin/env python3
"""Copies the CRDs serving-picker's shipped objects are checked against (platforms/crds/) from a
local clone of each platform's repository at a release tag. Each file starts with a comment
naming repo@tag:path and the commit.

usage: platform-crds.py PLATFORM GIT_DIR TAG OUT_ROOT
PLATFORM: envoy-gateway | istio | cert-manager | prometheus-operator
"""
import subprocess
import sys

import yaml

SOURCES = {
    "envoy-gateway": ("envoyproxy/gateway", [
        ("charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_envoyproxies.yaml", None),
        ("charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_envoypatchpolicies.yaml", None),
        ("charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_envoyextensionpolicies.yaml", None),
        ("charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_backendtrafficpolicies.yaml", None),
        ("charts/gateway-helm/charts/crds/crds/gatewayapi-crds.yaml",
         {"GatewayClass", "Gateway", "HTTPRoute", "ReferenceGrant"}),
    ]),
    "istio": ("istio/istio", [
        ("manifests/charts/base/files/crd-all.gen.yaml",
         {"WasmPlugin", "EnvoyFilter", "VirtualService", "DestinationRule"}),
    ]),
    "prometheus-operator": ("prometheus-operator/prometheus-operator", [
        ("example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml", None),
        ("example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml", None),
    ]),
    "cert-manager": ("cert-manager/cert-manager", [
        ("deploy/crds/cert-manager.io_certificates.yaml", None),
        ("deploy/crds/cert-manager.io_issuers.yaml", None),
        ("deploy/crds/cert-manager.io_clusterissuers.yaml", None),
    ]),
}


def git(git_dir, *args):
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True,
                          capture_output=True, text=True).stdout


def main():
    platform, git_dir, tag, out_root = sys.argv[1:]
    repo, files = SOURCES[platform]
    commit = git(git_dir, "rev-parse", f"{tag}^{{commit}}").strip()
    out = f"{out_root}/{platform}/{tag}"
    subprocess.run(["mkdir", "-p", out], check=True)
    for path, kinds in files:
        text = git(git_dir, "show", f"{tag}:{path}")
        for doc in yaml.safe_load_all(text):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            kind = doc["spec"]["names"]["kind"]
            if kinds is not None and kind not in kinds:
                continue
            with open(f"{out}/{kind}.yaml", "w") as f:
                f.write(f"# {repo}@{tag}:{path} (commit {commit}), the {kind} CRD as released.\n")
                yaml.safe_dump(doc, f, sort_keys=False, width=1000)
            print(f"{out}/{kind}.yaml")


if __name__ == "__main__":
    main()
