"""`python -m adapters.docker_image`: build the offline base image if it is missing."""

from __future__ import annotations

import sys

import docker
from docker import errors as docker_errors

from adapters.docker import BASE_IMAGE, build_base_image, engine_url


def main() -> int:
    api = docker.APIClient(base_url=engine_url(), version="auto")
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
