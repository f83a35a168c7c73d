"""The library client a command uses: of the service under `SBX_URL` (or `sbx --url`, as
DOCKER_HOST makes docker a client of another engine; `SBX_TOKEN` is its API key), else of
the local inventory."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandboxer import AsyncSandboxer, Sandboxer


def service_url() -> str | None:
    """The service the CLI talks to (`SBX_URL`), if any."""
    from sandboxer.core.rules.settings import service_url as url

    return url()


def client() -> Sandboxer:
    """A `sandboxer.Sandboxer` for this command."""
    from sandboxer import Sandboxer

    url = service_url()
    if url:
        from sandboxer.core.rules.settings import service_token

        return Sandboxer(url=url, token=service_token())
    return Sandboxer()


def async_client() -> AsyncSandboxer:
    """A `sandboxer.AsyncSandboxer` for a long-running command (`reap --every`,
    `metrics --all --follow`)."""
    from sandboxer import AsyncSandboxer

    url = service_url()
    if url:
        from sandboxer.core.rules.settings import service_token

        return AsyncSandboxer(url=url, token=service_token())
    return AsyncSandboxer()
