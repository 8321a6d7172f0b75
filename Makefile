# Every target builds its own virtual environment from the project's files.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint typecheck unit demo bench bench-smoke reproduce clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## The main job: a short simulated run of two tenants through the core policies.
demo: $(STAMP)
	$(BIN)/fairpool demo

## The fast test tier: lint, format, type-check the core, unit and property tests.
test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

## Micro-benchmarks; results land in bench/results/.
bench: $(STAMP)
	$(BIN)/python bench/bench_radix.py
	$(BIN)/python bench/bench_routing.py
	$(BIN)/python bench/bench_sim.py

## The benchmarks at toy size, so they cannot rot; records nothing.
bench-smoke: $(STAMP)
	$(BIN)/python bench/bench_radix.py --quick > /dev/null
	$(BIN)/python bench/bench_routing.py --quick > /dev/null
	$(BIN)/python bench/bench_sim.py --quick > /dev/null
	@echo "bench-smoke: ok"

## The VTC and DLPM papers' headline results, re-run: docs/results.md and docs/img/results-*.png.
reproduce: $(STAMP)
	$(BIN)/python -m fairpool.sim.reproduce

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
