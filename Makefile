# FedReID / FedFR on Flower. `make install` once, then `make demo` or `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.install-stamp

.PHONY: install demo demo-fedfr flwr-demo test test-profile test-fast lint bench soak clean help

help:
	@echo "make install   create $(VENV) and install the project (torch, flwr, ...) from pyproject.toml"
	@echo "make demo      a whole FedReID federation on this machine (4 sites, synthetic data, CPU)"
	@echo "make demo-fedfr  FedFR: pretrain + federation + generic/personalised evaluation (CPU)"
	@echo "make flwr-demo the demo through \`flwr run .\` on Flower's local simulation SuperLink (docs/cli.md#flwr-run)"
	@echo "make test      the test suite"
	@echo "make test-profile  the suite, its 20 slowest tests and how many federations it started"
	@echo "make test-fast the tests without real processes (pytest -m \"not e2e\"): the fast loop"
	@echo "make bench     benchmarks (JSON on stdout)"
	@echo "make study-NAME  a study of conf/study/NAME.yaml (variants x seeds, tables and plots)"
	@echo "make soak      reliability soak: 50 rounds, a site killed every 10 (about 40 min)"
	@echo "make compose-demo  the demo in docker compose, nothing but Docker needed; make compose-down removes it"
	@echo "make compose-up / compose-down   your deployment in docker compose (GPU=1 for CUDA)"

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

demo: install
	$(BIN)/fedsim --out runs/demo

# `flwr run .` as Flower users start an app: the demo on Flower's local simulation SuperLink, which
# runs the app in this environment (no `uv sync` of its dependencies per run) on ports of its own
flwr-demo: install
	FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=39191 \
	FLWR_LOCAL_CONTROL_API_PORT=39193 PATH="$(abspath $(BIN)):$$PATH" \
	$(BIN)/flwr run . --stream --run-config 'experiment="demo"' --federation-config 'num-supernodes=4'

# the suite on TEST_WORKERS pytest workers (pytest-xdist), a test module's tests on one worker (its
# module-scoped federations start once); real-process tests spend much of their time waiting on
# Flower's polling, so two workers fit two cores (more overload the cores and the memory, and the
# real-process tests' time bounds are then missed); the modules go to the workers in the order
# tests/conftest.py gives them (the longest first), not xdist's (most tests first)
TEST_WORKERS ?= 2
TEST_DIST = -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
test: install
	$(BIN)/python -m pytest -q $(TEST_DIST)

# the suite as `make test` runs it, then its 20 slowest tests and the number of federations started
test-profile: install
	$(BIN)/python -m pytest -q $(TEST_DIST) --durations=20 --count-launches

test-fast: install  ## everything but tests/e2e/ (real Flower processes, Ray, docker)
	$(BIN)/python -m pytest -q -m "not e2e"

lint: install  ## ruff (rules in pyproject.toml), ruff format, and the layering contracts of pyproject.toml (import-linter)
	$(BIN)/ruff check client server common tests benchmarks .ci
	$(BIN)/ruff format --check client server common tests benchmarks .ci
	$(BIN)/lint-imports

bench: install
	$(BIN)/python benchmarks/round_overhead.py
	$(BIN)/python benchmarks/reid_metric.py
	$(BIN)/python benchmarks/verification.py
	$(BIN)/python benchmarks/server_memory.py

soak: install
	$(BIN)/python benchmarks/soak.py

study-%: install  ## a named study (conf/study/<name>.yaml): make study-fedreid-ablation
	$(BIN)/fedstudy $*

clean:
	rm -rf runs .pytest_cache

# docker-compose: one coordinator + four sites (docker/compose.yaml); no Docker engine runs in CI
include docker/compose.mk

demo-fedfr: install  ## FedFR: pretrain, federated rounds with real processes, generic + personalised evaluation
	$(BIN)/fedsim experiment=fedfr-demo --out runs/fedfr-demo
