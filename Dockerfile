# `sbx serve` as a container (docs/service.md, "Running it as a container"):
#   docker build -t sandboxer/service .     # from the official python:3.11-slim, wheels from PyPI
#   make service-image                      # offline: a Debian-made base and the host's wheels
# It drives the engine whose socket is mounted at /var/run/docker.sock (or DOCKER_HOST).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
# service-image/wheels (filled by `make service-image`, empty in the repository) is looked at
# first; with --build-arg PIP_NO_INDEX=1 it is all pip sees, so the build needs no network.
ARG PIP_NO_INDEX
ENV PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/sbx
COPY service-image/wheels/ /wheels/
COPY pyproject.toml scripts/service-requirements.py /src/
# the dependencies in a layer of their own, which a change of the source leaves cached
RUN python3 /src/service-requirements.py /src/pyproject.toml > /tmp/requirements.txt \
 && /opt/sbx/bin/pip install -q -r /tmp/requirements.txt
COPY README.md /src/
COPY core /src/core
COPY adapters /src/adapters
COPY sandboxer /src/sandboxer
COPY sandboxer_tui /src/sandboxer_tui
COPY profiles /src/profiles
# the project as a wheel (not editable), then installed from it
RUN /opt/sbx/bin/pip wheel -q --no-deps --wheel-dir /tmp/dist /src \
 && /opt/sbx/bin/pip install -q --no-deps /tmp/dist/sandboxer-*.whl

FROM ${BASE}
# A user of its own (not root). The engine's socket belongs to its host's docker group: give
# the container that group's id at run time (--group-add "$(stat -c %g /var/run/docker.sock)").
RUN useradd --user-group --uid 10001 --home-dir /home/sbx --create-home \
      --shell /usr/sbin/nologin sbx \
 && mkdir -p /var/lib/sbx && chown sbx:sbx /var/lib/sbx
COPY --from=build /opt/sbx /opt/sbx
ENV PATH=/opt/sbx/bin:$PATH SBX_HOME=/var/lib/sbx PYTHONUNBUFFERED=1
# the database, the installation id, the keys' hashes and checkpoint archives
VOLUME /var/lib/sbx
USER sbx
WORKDIR /home/sbx
EXPOSE 8765
ENTRYPOINT ["sbx", "serve"]
# beyond loopback: the service refuses to start until a key exists (sbx api-keys create)
CMD ["--listen", "0.0.0.0:8765"]
