"""The library client a CLI command uses. `sbx server`'s spare child may have made one ahead,
with its database open and its engine reached, before the command arrived. With `SBX_URL`
(or `sbx --url`), every command is a client of that service instead, as DOCKER_HOST makes
docker one of another engine; `SBX_TOKEN` is its API key."""

from __future__ import annotations

import os
from typing import Any


def service_url() -> str | None:
    """The service the CLI talks to (`SBX_URL`), if any."""
    return os.environ.get("SBX_URL") or None


def take_client() -> Any:
    """A `sandboxer.Sandboxer` for this command."""
    from sandboxer import Sandboxer

    url = service_url()
    if url:
        return Sandboxer(url=url, token=os.environ.get("SBX_TOKEN") or None)
    return Sandboxer()


def take_async_client() -> Any:
    """A `sandboxer.AsyncSandboxer` for a long-running command (`reap --every`, `metrics
    --all`), of the service too under `SBX_URL`."""
    from sandboxer import AsyncSandboxer

    url = service_url()
    if url:
        return AsyncSandboxer(url=url, token=os.environ.get("SBX_TOKEN") or None)
    return AsyncSandboxer()
