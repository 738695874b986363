# envforge: the README's commands. `make demo` and `make test` set everything up themselves.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export ENVFORGE_DATA_DIR ?= $(CURDIR)/.envforge
export DAGSTER_HOME ?= $(ENVFORGE_DATA_DIR)/dagster
# the slowest tests are printed so CI time can be seen where it goes (CI must stay under 50 min)
PYTEST_ARGS ?= --durations=40

.PHONY: setup venv engine base-image demo fleet-demo test lint bench-sandbox bench-dedup bench-rollout bench-observe bench-fleet bench-gate bench-strength bench-candidate bench-client ui mlflow-ui lock clean

## setup: venv + package, host packages, Docker engine, sandbox base image (idempotent)
setup: venv engine base-image

venv: $(STAMP)
$(STAMP): pyproject.toml clients/python/pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e clients/python -e '.[dev,fleet]'
	@touch $(STAMP)

engine:
	@platform/deploy/host-packages.sh
	@platform/deploy/docker-engine.sh

base-image: venv engine
	@$(BIN)/envforge images base

## demo: the main job on the bundled examples
demo: setup
	$(BIN)/envforge demo

## fleet-demo: a Ray head + 2 worker nodes on this machine, each with its own dockerd; a rollout batch and a
## gate across them, one worker killed mid-batch (docs/fleet.md)
fleet-demo: setup
	$(BIN)/envforge fleet demo

## test: the whole test suite (Docker tests are real and run here)
test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## lint: ruff (lint + format check), the import-linter layer contracts, mypy against tools/mypy-baseline.json
lint: venv
	$(BIN)/ruff check platform/envforge tools
	$(BIN)/ruff format --check platform/envforge tools
	$(BIN)/lint-imports --no-cache
	$(BIN)/python tools/mypy_baseline.py

## bench-sandbox: sandbox runtime benchmark (JSON on stdout)
bench-sandbox: setup
	$(BIN)/python bench/sandbox.py

## bench-rollout: rollout scheduler benchmark, replay policy at 1/8/16/32 concurrent vs sequential cold (JSON)
bench-rollout: setup
	$(BIN)/python bench/rollout.py

## bench-observe: metrics + tracing on vs off, interleaved rollout runs; BASE=<rev> adds that revision's code (JSON)
bench-observe: setup
	$(BIN)/python bench/observe_overhead.py $(if $(BASE),--base-rev $(BASE))

## bench-gate: the default flakiness gate vs the full-suite gate on ledger, geokit and the flaky examples (JSON)
bench-gate: setup
	$(BIN)/python bench/gate.py

## bench-strength: verifier strength (mutants of the reference) on the ledger tasks: mutants and seconds per task,
## score distribution (PNG), gate cost with and without mutation, vs grading every mutant serially (JSON)
bench-strength: setup
	$(BIN)/python bench/strength.py

## bench-candidate: seconds per history candidate (ingest + gate), the #30 cost cuts against the code path as it was,
## interleaved pairs, with a verdict comparison; SOURCE=<a history source folder> [PAIRS=2] (JSON)
bench-candidate: setup
	$(BIN)/python bench/candidate_cost.py --source $(or $(SOURCE),$(error SOURCE=<a history source folder> is required)) --pairs $(or $(PAIRS),2)

## bench-dedup: MinHash/LSH benchmark vs datasketch, and 100k x 1M decontamination (JSON on stdout)
bench-dedup: venv
	$(BIN)/python bench/dedup.py

## bench-fleet: fleet dispatch overhead, 1 vs 2 nodes, recovery after a node kill, image transfer vs build,
## per-sandbox footprint and the capacity model (JSON)
bench-fleet: setup
	$(BIN)/python bench/fleet.py

## bench-client: what a trainer's venv pays: the envforge-client package (its own venv) vs the full
## platform, install size of the dependency closure and import time (JSON)
bench-client: venv
	$(BIN)/python bench/client_footprint.py

## ui: the Dagster UI on http://127.0.0.1:3000
ui: venv
	@mkdir -p $(DAGSTER_HOME) && cp -n platform/deploy/dagster.yaml $(DAGSTER_HOME)/dagster.yaml 2>/dev/null || true
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

## mlflow-ui: the MLflow UI on http://127.0.0.1:5000
mlflow-ui: venv
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$(ENVFORGE_DATA_DIR)/mlflow.db \
	  --default-artifact-root file://$(ENVFORGE_DATA_DIR)/mlartifacts --host 127.0.0.1 --port 5000

## verl-venv: verl 0.9.1 in its own venv (.venv-verl, its own pins in tools/verl/), built once; test_verl.py uses it
verl-venv: venv
	$(BIN)/python tools/trainer_venv.py verl

## verifiers-venv: verifiers 0.4 + envforge-client[verifiers] in .venv-verifiers/ (their own pins; built once,
## rebuilt when its requirements change; tests/service/test_verifiers_adapter.py builds it too)
verifiers-venv: venv
	$(BIN)/python tools/trainer_venv.py verifiers

## lock: refresh constraints.txt from the current venv
lock: venv
	$(BIN)/pip freeze --exclude-editable | sed 's/+cpu$$//' > constraints.txt

clean:
	rm -rf $(ENVFORGE_DATA_DIR)
