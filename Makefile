# `make run` opens sbx; `make test` runs the whole suite. Both set everything up first:
# the .venv, the project, a reachable Docker engine, and the offline base image; the tests
# also need PostgreSQL, an OpenSSH server binary, tmux and Docker Compose, which `make test`
# installs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup test-setup venv launcher bytecode docker image postgres sshd tmux compose lint bench clean

run: setup
	$(BIN)/sbx

test: setup test-setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

setup: venv launcher bytecode docker image

# The compiled launcher (sandboxer_tui/launcher.c) in place of the Python `sbx` script pip
# wrote: a command that `sbx server` runs then starts no interpreter of its own (about 10 ms
# a command). Without a C compiler the Python launcher stays; it does the same work.
launcher: venv
	scripts/build-launcher.sh "$(BIN)/sbx" "$(CURDIR)/$(BIN)/python"

# The project's modules compiled ahead, as pip does for an installed package: the `sbx`
# launcher is imported by every command, and compiling it each time (PYTHONDONTWRITEBYTECODE
# set, say) costs about 2 ms. Python recompiles whatever changed since.
bytecode: venv
	$(BIN)/python -m compileall -q core adapters sandboxer_tui profiles

test-setup: postgres sshd tmux compose

venv: $(STAMP)

# The editable install in setuptools' compat mode: a plain path entry in site-packages,
# where the default mode's import hook costs every `sbx` start about 8 ms. A setuptools
# without compat mode gets the default one.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]' --config-settings editable_mode=compat \
	  || $(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

docker:
	scripts/ensure-docker.sh

postgres:
	scripts/ensure-postgres.sh

image: venv docker
	$(BIN)/python -m adapters.docker_image

sshd:
	scripts/ensure-sshd.sh

tmux:
	scripts/ensure-tmux.sh

compose: docker
	scripts/ensure-compose.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: setup test-setup
	for b in lifecycle reap checkpoints delivery metrics tui fleet; do $(BIN)/python bench/bench_$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
