"""`python -m sandboxer.adapters.docker_image`: build the offline base image if it is missing."""

from __future__ import annotations

import sys

import docker
from docker import errors as docker_errors

from sandboxer.adapters.base import AdapterError
from sandboxer.adapters.docker import BASE_IMAGE, build_base_image, engine_tls, engine_url


def main() -> int:
    try:
        tls = engine_tls(engine_url())  # the same TLS rule as sbx's own client
    except AdapterError as exc:
        print(exc, file=sys.stderr)
        return 2
    api = docker.APIClient(base_url=engine_url(), version="auto", tls=tls or False)
    try:
        api.inspect_image(BASE_IMAGE)
        return 0
    except docker_errors.ImageNotFound:
        pass
    build_base_image(api)
    print(f"built {BASE_IMAGE} from the host's busybox", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
