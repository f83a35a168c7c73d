"""`sbx serve`: the library over HTTP (sandboxer_tui/service), which loads only here."""

from __future__ import annotations

import click

from sandboxer.core.rules.errors import BadInput
from sandboxer_tui.cli.clients import service_url
from sandboxer_tui.cli.output import command


@click.command("serve")
@click.option("--listen", metavar="HOST:PORT",
              help="Where to listen (default 127.0.0.1:8765, loopback only; beyond loopback "
                   "needs an API key to exist). Without it, --socket alone listens only there.")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), metavar="PATH",
              help="Also (or only) a unix socket, mode 0600; requests there need no key.")
@click.option("--reap-every", "reap_every", default="30s", show_default=True, metavar="DUR",
              help="Reconcile, reap and deliver events this often ('0' for never).")
@click.option("--evidence-key", "evidence_key", type=click.Path(dir_okay=False),
              metavar="PATH", help="Sign evidence on request (GET .../evidence?signed=true) "
                                   "with this ed25519 private key (sbx keys generate).")
@command
def serve_command(listen: str | None, socket_path: str | None, reap_every: str,
                  evidence_key: str | None = None) -> None:
    """The library over HTTP, with API keys, streams and metrics (docs/service.md)."""
    from sandboxer.core.rules.durations import parse_duration

    if service_url():
        raise BadInput("sbx serve runs the service itself: unset SBX_URL (or drop --url)")
    every = None if reap_every.strip() == "0" else parse_duration(reap_every, "--reap-every")
    try:  # fastapi and uvicorn load only here
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        from sandboxer.core.rules.errors import Unavailable

        raise Unavailable(f"sbx serve needs {exc.name}: pip install 'sandboxer[service]'"
                          ) from None
    if evidence_key is not None:
        import os

        from sandboxer.evidence import check_signing_key

        evidence_key = os.path.abspath(evidence_key)
        check_signing_key(evidence_key)  # a bad key file is said now (exit 2), not at a request
    from sandboxer_tui.service.server import serve

    serve(listen, socket_path, every, evidence_key)
