"""Running the service: its sockets (loopback TCP by default, a unix socket of mode 0600 on
request), the checks before it starts, uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import stat
import sys
from dataclasses import dataclass
from datetime import timedelta

from sandboxer.core.rules.errors import BadInput, Conflict

DEFAULT_PORT = 8765
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a name: it may resolve to anything

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """HOST:PORT ([::1]:PORT for IPv6); BadInput otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadInput(f"bad --listen {text!r}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return Listen(host, int(port))


def tcp_socket(listen: Listen) -> socket.socket:
    try:
        infos = socket.getaddrinfo(listen.host, listen.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BadInput(f"bad --listen host {listen.host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise Conflict(f"cannot listen on {listen.host}:{listen.port}: "
                       f"{exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def unix_socket(path: str) -> socket.socket:
    """A unix socket at `path`, mode 0600 from its first moment. A stale socket left by a
    dead service is replaced; a live one, or a file that is not a socket, is refused."""
    path = os.path.abspath(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise BadInput(f"--socket {path}: exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nothing answers there: left by a service that died
        else:
            raise Conflict(f"--socket {path}: another service listens there")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise BadInput(f"--socket {path}: cannot listen there: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """Stops on SIGTERM or SIGINT and exits 0, as `sbx reap --every` does (uvicorn
        raises the signal again once it has shut down, which would end the process by it)."""

        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    return Server


def uvicorn_config(app, *, graceful_shutdown_s: int = 5):
    """The one uvicorn configuration, the service's limits included (limits.py, settings
    read now): `sbx serve` and the tests' live service both run on it."""
    import uvicorn

    from sandboxer.core.rules import settings
    from sandboxer_tui.service.limits import KEEP_ALIVE_S, protocol

    return uvicorn.Config(
        app, log_level="warning", lifespan="on", ws="websockets-sansio", access_log=False,
        http=protocol(settings.serve_header_timeout().total_seconds()),
        timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=graceful_shutdown_s,
        proxy_headers=False, server_header=False)


def serve(listen: str | None, socket_path: str | None, reap_every: timedelta | None,
          evidence_key: str | None = None) -> None:
    """Run until SIGINT or SIGTERM, on uvloop where it is installed (the `service` extra
    has it): its event loop in C took about a fifth less of the service's CPU per proxied
    request than asyncio's (bench/bench_proxy.py); without it, on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(listen, socket_path, reap_every, evidence_key))
    else:
        uvloop.run(_serve(listen, socket_path, reap_every, evidence_key))


async def _serve(listen_text: str | None, socket_path: str | None,
                 reap_every: timedelta | None, evidence_key: str | None = None) -> None:
    from sandboxer.core.rules import settings

    _Server = _server_class()
    from sandboxer.service import ServiceClient
    from sandboxer_tui.service.app import build_app

    if listen_text is not None:
        listen = parse_listen(listen_text)
    else:  # loopback by default; only the socket when just --socket is given
        listen = None if socket_path else parse_listen(DEFAULT_LISTEN)
    bound: str | None = None  # the socket file this service made (and removes)
    actor = settings.actor()
    # The core on uvicorn's own loop: no hop to a core thread and back on every call
    # (docs/design.md, "The library").
    client = ServiceClient.on_running_loop(actor=actor)
    sockets: list[socket.socket] = []
    try:
        await client.ready()  # the database answers and is migrated before anyone calls
        if listen is not None and not listen.loopback and await client.usable_api_keys() == 0:
            raise BadInput(f"listening on {listen.host} (beyond loopback) needs an API key: "
                           "make one first with `sbx api-keys create --scope ...`")
        if listen is not None:
            sockets.append(tcp_socket(listen))
        if socket_path is not None:
            socket_path = os.path.abspath(socket_path)
            sockets.append(unix_socket(socket_path))
            bound = socket_path
        app = build_app(client, actor=actor, socket_path=socket_path, reap_every=reap_every,
                        evidence_key=evidence_key)
        server = _Server(uvicorn_config(app))
        where = [listen.url] if listen else []
        where += [f"unix://{socket_path}"] if socket_path else []
        timer = (f"reaper every {int(reap_every.total_seconds())}s" if reap_every
                 else "no reaper")
        print(f"sbx serve: listening on {' and '.join(where)}; {timer}", file=sys.stderr,
              flush=True)
        logging.basicConfig(level=logging.WARNING, format="sbx serve: %(message)s")
        await server.serve(sockets=sockets)
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        if bound is not None:
            with contextlib.suppress(OSError):
                os.unlink(bound)
        await client.close()
