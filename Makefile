# `make run` opens sbx; `make test` runs the whole suite. Both set everything up first:
# the .venv, the project, a reachable Docker engine, and the offline base image.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup venv docker image postgres sshd lint bench clean

run: setup
	$(BIN)/sbx

test: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

setup: venv docker image postgres sshd

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

docker:
	scripts/ensure-docker.sh

postgres:
	scripts/ensure-postgres.sh

image: venv docker
	$(BIN)/python -m adapters.docker_image

sshd:
	scripts/ensure-sshd.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: setup
	for b in lifecycle reap checkpoints delivery metrics; do $(BIN)/python bench/bench_$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
