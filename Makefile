# Kiln developer targets. `make help` lists them.
VENV   ?= .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
STAMP  := $(VENV)/.kiln-installed

SHELL  := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
QUIET  := 2>&1 | { grep -v "is ignored: it is neither" || true; }
# The machine's environment sets PYTHONDONTWRITEBYTECODE=1, and uv installs no bytecode: every
# Python process (a test run starts hundreds: `kiln` commands, gateways, workers) compiled each
# module it imports from source again, about 1.5 s of CPU a `kiln` command. Recipes write
# bytecode once, beside the sources (ignored by git), and read it from then on.
unexport PYTHONDONTWRITEBYTECODE

.DEFAULT_GOAL := help
.PHONY: help setup browser promtool proto up test test-unit test-integration test-e2e test-deploy lint bench-cold-start bench-embeddings bench-lora bench-import bench-tensor bench-tensor-latency bench-loop-stalls bench-console bench-shadow bench-tracing bench-batches bench-overload bench-soak

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

setup: $(STAMP) ## Create .venv with everything locked in uv.lock (+ torch 2.13.0 CPU for model import)

$(STAMP): uv.lock pyproject.toml platform/pyproject.toml runtimes/pyproject.toml console/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "uv==0.13.9" $(QUIET)
	$(PY) -m pip install -q --disable-pip-version-check "torch==2.13.0" $(QUIET)
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync -q --frozen --inexact --all-packages --extra import
	touch $@

browser: ## Debian's Chromium for the console's browser tests (Playwright drives it; it downloads none)
	@command -v chromium >/dev/null || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; }

promtool: ## Debian's Prometheus for promtool (tests check and unit-test the generated SLO rules)
	@command -v promtool >/dev/null || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }

up: setup ## Run Kiln locally on the embedded defaults (imports the bundled models on first run)
	$(VENV)/bin/kiln up

test: setup browser promtool ## Run the test suite (a crash, even at exit, prints every thread's stack)
	PYTHONFAULTHANDLER=1 $(VENV)/bin/pytest --durations=25

test-unit: setup ## Only tests/unit (seconds)
	PYTHONFAULTHANDLER=1 $(VENV)/bin/pytest -m unit

test-integration: setup promtool ## Only tests/integration (real PostgreSQL and workers)
	PYTHONFAULTHANDLER=1 $(VENV)/bin/pytest -m integration

test-e2e: setup browser ## Only tests/e2e (real `kiln up`, the SDKs, Chromium)
	PYTHONFAULTHANDLER=1 $(VENV)/bin/pytest -m e2e

test-deploy: setup ## Only tests/deploy (terraform and manifests, offline)
	PYTHONFAULTHANDLER=1 $(VENV)/bin/pytest -m deploy

GATEWAY := platform/src/kiln_platform/gateway
proto: setup ## Write gateway/predict_v2.binpb, the descriptor of OIP's gRPC service (from its .proto)
	$(PY) -m grpc_tools.protoc -I $(GATEWAY) --descriptor_set_out=$(GATEWAY)/predict_v2.binpb predict_v2.proto

# mypy's cache outside the work tree, so a fresh clone (CI's) reuses it: an entry whose file's
# path or mtime differs is checked against the source's hash, not trusted (~50 s a run saved)
MYPY_CACHE_DIR ?= $(HOME)/.cache/kiln/mypy

lint: setup ## ruff + mypy (sources and tests)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	MYPY_CACHE_DIR=$(MYPY_CACHE_DIR) $(VENV)/bin/mypy platform/src runtimes/src console/src tests

bench-overload: setup ## A burst of 10x capacity for 30 s: shed latency, admitted p99 vs deadline, recovery (docs/benchmarks.md)
	$(PY) bench/overload.py

bench-soak: setup ## An hour of mixed traffic: RSS, fds, DB connections and p99 growth (docs/reliability.md)
	$(PY) bench/soak.py --duration-s 3600 --warmup-s 300 --sample-s 30 --rate 10

bench-console: setup ## Console pages' p95 with 1M usage rows and 1,000 tenants (docs/benchmarks.md)
	$(PY) bench/console.py --loads 50

bench-cold-start: setup ## First request to a pool scaled to zero vs a new ONNX Runtime session in-process (docs/benchmarks.md)
	$(PY) bench/cold_start.py --rounds 7

bench-lora: setup ## Chat with three LoRA adapters and the base model mixed vs the base model alone (docs/benchmarks.md)
	$(PY) bench/lora_serving.py --rounds 3 --duration 20

bench-import: setup ## Import time of the SmolLM2 GGUF, and serving it imported vs bundled (docs/benchmarks.md)
	$(PY) bench/import_model.py --rounds 4 --duration 20

bench-tracing: setup ## Embeddings throughput, tracing off and on at 1%, vs HEAD with tracing compiled out (docs/benchmarks.md)
	$(PY) bench/tracing.py --rounds 24 --duration 6 --warmup 2

bench-shadow: setup ## Client latency p99 with shadow traffic at 20% on vs off, same run (docs/benchmarks.md)
	$(PY) bench/shadow.py --rounds 6

bench-batches: setup ## A 10,000-line batch beside interactive embeddings: their p99 and the idle capacity it fills (docs/benchmarks.md)
	$(PY) bench/batches.py --rounds 3

bench-embeddings: setup ## Kiln vs in-process ONNX Runtime, all-MiniLM-L6-v2 (see docs/benchmarks.md)
	$(PY) bench/embeddings.py

bench-tensor: setup ## Kiln /v2 vs in-process ONNX Runtime, transformer encoder, a dedicated compute core (docs/benchmarks.md)
	$(PY) bench/tensor.py --model encoder --duration 10 --items 32 --max-batch-size 32 \
		--worker-threads 1 --worker-concurrency 1 --worker-prefetch --compute-cores 1

bench-tensor-latency: setup ## p99 under open-loop load vs the bound and an ideal queue, same configuration
	$(PY) bench/tensor_latency.py --model encoder --items 32 --max-batch-size 32 \
		--worker-threads 1 --worker-concurrency 1 --worker-prefetch --compute-cores 1

bench-loop-stalls: setup ## How long decoding and tokenizing a limit-sized body holds the event loop (docs/benchmarks.md)
	$(PY) bench/loop_stalls.py
