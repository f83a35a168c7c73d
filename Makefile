# `make run` opens sbx; `make test` runs the whole suite. Both set everything up first:
# the .venv, the project, a reachable Docker engine, and the offline base image; the tests
# also need PostgreSQL, an OpenSSH server binary, tmux and Docker Compose, which `make test`
# installs, and the service's container image (service-image), which it builds.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup test-setup venv bytecode docker image service-image python-base postgres sshd tmux compose gvisor lint bench clean

run: setup
	$(BIN)/sbx

# The suite on two workers, a test file each at a time (--dist loadfile: a file's module
# fixtures and its sandboxes stay on one worker): most tests wait on the engine, so two
# workers on this project's 2-core machines take about 26 minutes where one took about 49.
# A test isolates itself (its own SBX_HOME, labels, names), so files may run side by side;
# the few marked `alone` assert on what any installation's reap may remove (an untagged
# checkpoint image), so they run afterwards with nothing beside them.
test: setup test-setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q --durations=25 -n 2 --dist loadfile -m "not alone"
	$(BIN)/python -m pytest -q -m alone

setup: venv bytecode docker image

# The project's modules compiled ahead, as pip does for an installed package: the `sbx`
# launcher is imported by every command, and compiling it each time (PYTHONDONTWRITEBYTECODE
# set, say) costs about 2 ms. Python recompiles whatever changed since.
bytecode: venv
	$(BIN)/python -m compileall -q core adapters sandboxer sandboxer_tui profiles

test-setup: postgres sshd tmux compose service-image gvisor

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
	$(BIN)/python -m sandboxer.adapters.docker_image

# The service's container image (Dockerfile, docs/service.md). With the default BASE, a Python
# base made from Debian's packages (python-base) and the dependencies as wheels this host's pip
# builds, so neither a registry nor network in the build is needed; each step is skipped when
# its result is already there. Elsewhere: make service-image BASE=python:3.11-slim.
BASE ?= sandboxer/python-base:bookworm
SERVICE_IMAGE ?= sandboxer/service:latest

service-image: venv docker
	BASE="$(BASE)" SERVICE_IMAGE="$(SERVICE_IMAGE)" PYTHON="$(CURDIR)/$(BIN)/python" \
	  scripts/build-service-image.sh

# Debian bookworm with python3, by debootstrap, imported as sandboxer/python-base:bookworm
python-base: docker
	scripts/build-python-base.sh

sshd:
	scripts/ensure-sshd.sh

tmux:
	scripts/ensure-tmux.sh

compose: docker
	scripts/ensure-compose.sh

# gVisor's runsc registered with the engine, for profiles with `isolation: gvisor`
# (docs/security.md); it tries the flags on the base image, hence `image`.
gvisor: docker image
	scripts/ensure-gvisor.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# Each benchmark writes its results to bench/results/NAME.json (committed), and the README's
# performance table is made from them (scripts/perf_table.py; a test checks they agree).
BENCHES ?= lifecycle oneshot api service mcp e2b_api files proxy terminal pool reap checkpoints delivery metrics tui fleet gvisor scale
bench: setup test-setup
	mkdir -p bench/results
	for b in $(BENCHES); do $(BIN)/python bench/bench_$$b.py --json bench/results/$$b.json || exit 1; done
	$(BIN)/python scripts/perf_table.py --write

clean:
	rm -rf $(VENV) build *.egg-info
