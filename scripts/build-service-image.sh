#!/usr/bin/env bash
# The service's image (Dockerfile) from the current source. With the default base, the one
# made from Debian's packages (scripts/build-python-base.sh), the build needs no registry and
# no network: the dependencies are wheels built here, by this host's pip, into
# service-image/wheels, and the build runs with --network none. With another BASE (an official
# Python image), the engine pulls it and pip in the build reaches PyPI, as a plain
# `docker build` would.
#   BASE=...           the base image (default sandboxer/python-base:bookworm)
#   SERVICE_IMAGE=...  the tag to build (default sandboxer/service:latest)
#   PYTHON=...         the Python whose pip makes the wheels (default python3)
set -euo pipefail

cd "$(dirname "$0")/.."
LOCAL_BASE=sandboxer/python-base:bookworm
BASE="${BASE:-$LOCAL_BASE}"
SERVICE_IMAGE="${SERVICE_IMAGE:-sandboxer/service:latest}"
PYTHON="${PYTHON:-python3}"
WHEELS=service-image/wheels

say() { echo "build-service-image: $*" >&2; }

if [ "$BASE" != "$LOCAL_BASE" ]; then
  exec docker build --build-arg BASE="$BASE" -t "$SERVICE_IMAGE" .
fi

scripts/build-python-base.sh "$BASE"

# Wheels only work in the image's Python if they were made for its version
host_version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
base_version="$(docker run --rm --network none "$BASE" \
  python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$host_version" != "$base_version" ]; then
  say "$PYTHON is Python $host_version but $BASE has $base_version: its wheels would not fit."
  say "Set PYTHON to a Python $base_version (or build from an official image: BASE=python:$host_version-slim)."
  exit 1
fi

# service-image/wheels is made again only when the requirements or the Python change
requirements="$("$PYTHON" scripts/service-requirements.py --build)"
stamp="$(printf '%s\n%s\n' "$host_version" "$requirements" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$WHEELS/.stamp" 2>/dev/null)" != "$stamp" ]; then
  say "building the dependencies' wheels into $WHEELS with $PYTHON's pip..."
  find "$WHEELS" -maxdepth 1 -name '*.whl' -delete
  printf '%s\n' "$requirements" >"$WHEELS/requirements.txt"
  "$PYTHON" -m pip wheel -q --disable-pip-version-check --wheel-dir "$WHEELS" \
    -r "$WHEELS/requirements.txt"
  echo "$stamp" >"$WHEELS/.stamp"
fi

# The legacy builder runs each step on the engine's default bridge, which an engine may lack
# (`docker0`); the build needs no network, so it gets none.
previous="$(docker image inspect -f '{{.Id}}' "$SERVICE_IMAGE" 2>/dev/null || true)"
docker build --network none --build-arg BASE="$BASE" --build-arg PIP_NO_INDEX=1 \
  -t "$SERVICE_IMAGE" .
# The image this build replaced, now without a tag, is this script's own: remove it by id
# rather than leave a copy of the installation behind after each change of the source.
current="$(docker image inspect -f '{{.Id}}' "$SERVICE_IMAGE")"
if [ -n "$previous" ] && [ "$previous" != "$current" ] \
    && [ "$(docker image inspect -f '{{len .RepoTags}}' "$previous" 2>/dev/null)" = 0 ]; then
  docker rmi "$previous" >/dev/null 2>&1 || true
fi
