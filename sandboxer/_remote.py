"""The remote transport: the library as a client of `sbx serve` (docs/service.md), over httpx.

It implements the transport contract (`sandboxer._transport.Transport`) as `LocalTransport`
does and returns the same dicts, so the handles, records and errors are the same: an error body `{"error": {"code", "kind", "message"}}` becomes the
`sandboxer.Error` class of its kind with its message. The async API sends its requests on
the caller's own loop (an httpx client for each loop it is used on: a hop to a thread and
back costs about a millisecond a request, bench/bench_service.py); the sync API sends them
on a loop and a thread of the transport's own (the core loop of `sandboxer._local`), where
streams run too, whichever API reads them: a stream the caller leaves unfinished is then
never closed on a loop that has gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import urllib.parse
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sandboxer.core.rules.errors import (
    BadInput,
    Conflict,
    NotFound,
    OperationFailed,
    QuotaExceeded,
    SbxError,
    Unauthorized,
    Unavailable,
)

if TYPE_CHECKING:
    import httpx

    from sandboxer._local import CoreLoop
    from sandboxer._transport import Transport, Watch
    from sandboxer.core.rules.profiles import Profile

T = TypeVar("T")
KINDS: dict[str, type[SbxError]] = {c.kind: c for c in (
    OperationFailed, BadInput, NotFound, Conflict, QuotaExceeded, Unavailable, Unauthorized)}
CODES: dict[int, type[SbxError]] = {int(c.exit_code): c for c in (
    OperationFailed, BadInput, NotFound, Conflict, Unavailable)}
SSE = "text/event-stream"
FOLLOW_RETRIES = 5  # a followed stream that drops reconnects this many times in a row
STREAM_SLOT_WAIT_S = 30.0  # a stream refused for the service's stream caps (429) is asked
# again, at its Retry-After, for this long: nothing ran, and slots free as streams end
DOWNLOAD_CHUNK = 1024 * 1024  # a download's body is handed on in pieces of at most this


def error_from(status: int, body: Any, url: str) -> SbxError:
    """The library's error for an HTTP error answer of the service."""
    detail = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(detail, Mapping) and isinstance(detail.get("message"), str):
        cls = KINDS.get(detail.get("kind")) or CODES.get(detail.get("code")) or OperationFailed
        message = detail["message"]
        if cls is Unauthorized:  # say whose key, and where it comes from
            message = f"the sbx service at {url} refused the API key (SBX_TOKEN): {message}"
        error = cls(message)
        if detail.get("problems"):
            error.problems = list(detail["problems"])
        return error
    if status in (502, 503, 504):
        return Unavailable(f"the sbx service at {url} answered {status}")
    return OperationFailed(f"the sbx service at {url} answered {status}")


def _slot_wait(response: httpx.Response, error: SbxError, give_up: float | None) -> float | None:
    """Seconds to wait before asking again for a stream the service refused because its
    stream caps were reached (429 `unavailable`, Retry-After), or None to raise `error`: any
    other answer, or STREAM_SLOT_WAIT_S has passed since the first refusal."""
    if response.status_code != 429 or type(error) is not Unavailable:
        return None
    now = asyncio.get_running_loop().time()
    if give_up is not None and now >= give_up:
        return None
    try:
        after = float(response.headers.get("Retry-After", "1"))
    except ValueError:  # an HTTP date: the service sends seconds
        after = 1.0
    pause = min(max(after, 0.05), 5.0) if math.isfinite(after) else 1.0
    return pause if give_up is None else min(pause, give_up - now)


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


class RemoteTransport:
    """A service at `url` (`http://HOST:PORT`, `https://...`, or `unix:///PATH` for its
    socket), with the API key `token` (sent as `Authorization: Bearer`)."""

    def __init__(self, url: str, *, token: str | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "unix://")):
            raise BadInput(f"bad service URL {url!r}: http://HOST:PORT, https://... or "
                           "unix:///PATH")
        self.url = url.rstrip("/")
        self.token = token
        self._core: CoreLoop | None = None
        self._http: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()  # one per loop it is used on
        self._closed = False
        self._served: dict[str, dict[str, Any]] = {}  # profiles read from the service

    # -- running on the transport's loop ----------------------------------------------------

    @property
    def core(self) -> CoreLoop:
        if self._closed:
            raise Conflict("this Sandboxer is closed")
        if self._core is None:
            from sandboxer._local import CoreLoop

            self._core = CoreLoop("sbx-remote")
        return self._core

    def _client(self) -> httpx.AsyncClient:
        if self._closed:
            raise Conflict("this Sandboxer is closed")
        loop = asyncio.get_running_loop()
        http = self._http.get(loop)
        if http is None:
            import httpx

            headers = {"User-Agent": "sandboxer"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            timeout = httpx.Timeout(connect=10.0, read=None, write=120.0, pool=None)
            if self.url.startswith("unix://"):
                http = httpx.AsyncClient(
                    base_url="http://sbx", headers=headers, timeout=timeout,
                    transport=_own_users_socket(self.url[len("unix://"):], self.url))
            elif _loopback(self.url):
                # given a transport, httpx reads no proxy from the environment (HTTP_PROXY,
                # ALL_PROXY): the key goes straight to this machine's service
                http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout,
                                         transport=httpx.AsyncHTTPTransport())
            else:
                http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)
            self._http[loop] = http
        return http

    async def _on_core(self, make: Callable[[], Awaitable[T]]) -> T:
        core = self.core
        if core.here():
            return await make()
        return await asyncio.wrap_future(core.submit(make()))

    def call_blocking(self, awaitable: Awaitable[T]) -> T:
        """Run `awaitable` on the transport's loop and wait for it (the sync API)."""
        try:
            core = self.core
        except BaseException:
            if hasattr(awaitable, "close"):
                awaitable.close()
            raise
        if core.here():
            raise RuntimeError("the sync sandboxer API was called from its own loop; use "
                               "the AsyncSandboxer there")

        async def run() -> T:
            return await awaitable

        future = core.submit(run())
        try:
            return future.result()
        except BaseException:
            # interrupted (Ctrl-C): stop it on the loop too, so that a call still waiting
            # there (for a stream's slot) never runs after its caller has gone
            future.cancel()
            raise

    async def close(self) -> None:
        if self._closed:
            return
        here = self._http.pop(asyncio.get_running_loop(), None)
        if here is not None:
            with contextlib.suppress(Exception):
                await here.aclose()
        self.close_blocking()

    def close_blocking(self) -> None:
        """Closes the clients of the core loop; one on another loop is left to the
        collector (it can only be closed on its own loop)."""
        if self._closed:
            return
        if self._core is not None:
            http = self._http.pop(self._core.loop, None)
            if http is not None:
                with contextlib.suppress(Exception):
                    self._core.submit(http.aclose()).result()
        self._http.clear()
        self._closed = True
        if self._core is not None:
            self._core.stop()

    # -- requests ---------------------------------------------------------------------------

    def _unreachable(self, exc: Exception) -> Unavailable:
        return Unavailable(f"cannot reach the sbx service at {self.url}: "
                           f"{' '.join(str(exc).split()) or type(exc).__name__}")

    async def _send(self, method: str, path: str, *, json_body: Any = None,
                    params: Mapping[str, Any] | None = None,
                    headers: Mapping[str, str] | None = None,
                    content: Any = None) -> httpx.Response:
        import httpx

        async def go() -> httpx.Response:
            try:
                response = await self._client().request(
                    method, path, json=json_body, params=_params(params), headers=headers,
                    content=content)
            except httpx.HTTPError as exc:
                raise self._unreachable(exc) from None
            if response.status_code >= 400:
                raise error_from(response.status_code, _json_or_none(response), self.url)
            return response

        return await go()  # on the caller's loop (the sync API's is the core loop)

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self._send(method, path, **kwargs)).json()

    def _events(self, method: str, path: str, *, json_body: Any = None,
                params: Mapping[str, Any] | None = None,
                resume: bool = False) -> AsyncIterator[tuple[str, Any, str]]:
        """(event, data, id) of a server-sent event stream, on the transport's loop. With
        `resume`, a dropped stream reconnects from the last id it saw (Last-Event-ID)."""
        async def source() -> AsyncIterator[tuple[str, Any, str]]:
            import httpx
            from httpx_sse import aconnect_sse

            last_id: str | None = None
            failures = 0
            loop = asyncio.get_running_loop()
            give_up: float | None = None  # when a stream refused for want of a slot stops asking
            while True:
                headers = {"Accept": SSE}
                if last_id is not None:
                    headers["Last-Event-ID"] = last_id
                try:
                    async with aconnect_sse(self._client(), method, path, json=json_body,
                                            params=_params(params), headers=headers) as events:
                        response = events.response
                        if response.status_code >= 400:
                            await response.aread()
                            error = error_from(response.status_code, _json_or_none(response),
                                               self.url)
                            pause = _slot_wait(response, error, give_up)
                            if pause is None:
                                raise error
                            if give_up is None:
                                give_up = loop.time() + STREAM_SLOT_WAIT_S
                            await asyncio.sleep(pause)
                            continue
                        give_up = None  # open: a later reconnect that is refused waits anew
                        async for item in events.aiter_sse():
                            failures = 0
                            if item.id:
                                last_id = item.id
                            if item.event == "error":
                                raise error_from(500, item.json(), self.url)
                            yield item.event, item.json() if item.data else None, item.id
                except (httpx.HTTPError, OSError) as exc:
                    failures += 1
                    if not resume or failures > FOLLOW_RETRIES:
                        raise self._unreachable(exc) from None
                    await asyncio.sleep(min(2.0 ** failures / 4, 5.0))
                    continue
                if not resume:
                    return
                raise Unavailable(f"the sbx service at {self.url} ended the stream")

        return self._stream(source)

    async def _stream(self, make: Callable[[], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Items of the async iterator `make()` runs on the transport's loop, one hop each."""
        agen = await self._on_core(_async(make))
        try:
            while True:
                try:
                    item = await self._on_core(agen.__anext__)
                except StopAsyncIteration:
                    return
                yield item
        finally:
            with contextlib.suppress(Exception):
                await self._on_core(agen.aclose)

    # -- sandboxes --------------------------------------------------------------------------

    def _profile_ref(self, profile: str | Profile | Mapping[str, Any]) -> str | dict[str, Any]:
        """A name the service knows; a profile read from the service, unchanged, by its
        name; anything else as a document (which only an admin key may send)."""
        if isinstance(profile, str):
            return profile
        if isinstance(profile, Mapping):
            return dict(profile)
        from sandboxer.core.rules.profiles import dump

        doc = dump(profile)
        return profile.name if self._served.get(profile.name) == doc else doc

    async def create(self, profile: str | Profile, *, ttl: timedelta | None, name: str | None,
                     labels: Mapping[str, str] | None, owner: str | None,
                     task: str | None,
                     volumes: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        return await self._create(profile, ttl=ttl, name=name, labels=labels, owner=owner,
                                  task=task, headers=None, volumes=volumes)

    async def _create(self, profile: str | Profile, *, ttl: timedelta | None,
                      name: str | None, labels: Mapping[str, str] | None, owner: str | None,
                      task: str | None, headers: Mapping[str, str] | None,
                      volumes: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
        body = {"profile": self._profile_ref(profile), "ttl": _seconds(ttl), "name": name,
                "labels": dict(labels) if labels else None, "owner": owner, "task": task}
        if volumes:
            body["volumes"] = [dict(v) for v in volumes]
        return await self._json("POST", "/v1/sandboxes", json_body=body, headers=headers)

    async def get(self, ref: str, *, with_profile: bool = False) -> dict[str, Any]:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}",
                                params={"with_profile": with_profile or None})

    async def destroy(self, ref: str) -> tuple[dict[str, Any], bool]:
        view = await self._json("DELETE", f"/v1/sandboxes/{_seg(ref)}")
        return view, not view.pop("already_destroyed", False)

    async def destroy_many(self, refs: Sequence[str]) -> dict[str, list[Any]]:
        return await self._json("POST", "/v1/sandboxes/destroy", json_body={"refs": list(refs)})

    async def exec(self, ref: str, argv: Sequence[str], timeout: timedelta | None, *,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None, stdin: bytes | None = None) -> dict[str, Any]:
        """The whole output, as in process: read from the stream form, since the JSON reply
        keeps only the first part of a large output (docs/service.md, "Limits")."""
        chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        ended: dict[str, Any] = {}
        async for stream, data in self.exec_stream(ref, argv, timeout, env=env, cwd=cwd,
                                                   user=user, stdin=stdin):
            if stream == "exit":
                ended = data
            else:
                chunks[stream].append(data)
        return {**ended, **{stream: b"".join(parts) for stream, parts in chunks.items()}}

    async def exec_stream(self, ref: str, argv: Sequence[str], timeout: timedelta | None, *,
                          env: Mapping[str, str] | None = None, cwd: str | None = None,
                          user: str | None = None, stdin: bytes | None = None,
                          ) -> AsyncIterator[tuple[str, Any]]:
        """stdin travels in the JSON body as base64, so the service's body limit caps it
        (SBX_SERVE_MAX_BODY); a larger input goes in as a file, or to a process's stdin."""
        from sandboxer._records import output_bytes

        body: dict[str, Any] = {"argv": list(argv), "timeout": _seconds(timeout)}
        if env:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        if user is not None:
            body["user"] = user
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin).decode()
        async for event, data, _ in self._events(
                "POST", f"/v1/sandboxes/{_seg(ref)}/exec", json_body=body):
            if event in ("stdout", "stderr"):
                yield event, output_bytes(data["data"])
            elif event == "exit":
                yield "exit", data
                return

    async def logs(self, ref: str, *, follow: bool, tail: int | None) -> AsyncIterator[bytes]:
        from sandboxer._records import output_bytes

        async for event, data, _ in self._events(
                "GET", f"/v1/sandboxes/{_seg(ref)}/logs",
                params={"follow": follow or None, "tail": tail}):
            if event == "log":
                yield output_bytes(data["data"])
            elif event == "end":
                return

    # -- files ----------------------------------------------------------------------------

    async def write_file(self, ref: str, path: str, data: AsyncIterator[bytes], *,
                         mode: int | None = None) -> dict[str, Any]:
        """The bytes go as the request's body, chunk by chunk as `data` gives them."""
        return await self._json("PUT", f"/v1/sandboxes/{_seg(ref)}/files",
                                params={"path": path, "mode": _mode(mode)},
                                content=_body(data),
                                headers={"Content-Type": "application/octet-stream"})

    def read_file(self, ref: str, path: str) -> AsyncIterator[bytes]:
        return self._download(f"/v1/sandboxes/{_seg(ref)}/files", {"path": path})

    async def put_tree(self, ref: str, path: str, tar: AsyncIterator[bytes]) -> dict[str, Any]:
        return await self._json("PUT", f"/v1/sandboxes/{_seg(ref)}/files/tree",
                                params={"path": path}, content=_body(tar),
                                headers={"Content-Type": "application/x-tar"})

    def get_tree(self, ref: str, path: str) -> AsyncIterator[bytes]:
        return self._download(f"/v1/sandboxes/{_seg(ref)}/files/tree", {"path": path})

    async def list_files(self, ref: str, path: str, depth: int) -> list[dict[str, Any]]:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/files/list",
                                params={"path": path, "depth": depth})

    async def stat_file(self, ref: str, path: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/files/stat",
                                params={"path": path})

    async def remove_file(self, ref: str, path: str, *, recursive: bool) -> None:
        await self._send("DELETE", f"/v1/sandboxes/{_seg(ref)}/files",
                         params={"path": path, "recursive": recursive or None})

    async def make_dir(self, ref: str, path: str, *, parents: bool) -> None:
        await self._send("POST", f"/v1/sandboxes/{_seg(ref)}/files/mkdir",
                         json_body={"path": path, "parents": parents})

    async def rename_file(self, ref: str, src: str, dst: str) -> None:
        await self._send("POST", f"/v1/sandboxes/{_seg(ref)}/files/rename",
                         json_body={"src": src, "dst": dst})

    def _download(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[bytes]:
        """A streamed GET's body, in chunks of up to DOWNLOAD_CHUNK, on the transport's
        loop (one hop a chunk); an error answer is the library's error."""
        async def source() -> AsyncIterator[bytes]:
            import httpx

            try:
                async with self._client().stream("GET", path, params=_params(params)) as reply:
                    if reply.status_code >= 400:
                        await reply.aread()
                        raise error_from(reply.status_code, _json_or_none(reply), self.url)
                    async for chunk in reply.aiter_bytes(DOWNLOAD_CHUNK):
                        yield chunk
            except httpx.HTTPError as exc:
                raise self._unreachable(exc) from None

        return self._stream(source)

    # -- terminals: one WebSocket a session (docs/terminals-and-ports.md) -------------------

    def _pty_sockets(self) -> dict[str, _PtySocket]:
        found = self.__dict__.get("_ptys")
        if found is None:
            found = self.__dict__["_ptys"] = {}
        return found

    async def _pty_connect(self, ref: str, session: str | None = None,
                           offset: int | None = None, output: bool = True) -> Any:
        """A WebSocket to `/v1/sandboxes/{ref}/pty` (with `session`: that terminal's, its
        output from `offset`, or from now); the service's refusal as the library's error."""
        import socket

        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        query = urllib.parse.urlencode({k: v for k, v in (
            ("session", session), ("offset", offset),
            ("output", None if output else "false")) if v is not None})
        path = f"/v1/sandboxes/{_seg(ref)}/pty" + (f"?{query}" if query else "")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        options: dict[str, Any] = {"additional_headers": headers, "compression": None,
                                   "user_agent_header": "sandboxer", "open_timeout": 30,
                                   "max_size": 2 ** 22}
        try:
            if self.url.startswith("unix://"):
                from sandboxer.core.rules.peercred import peer_uid_pid

                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(self.url[len("unix://"):])
                    uid = peer_uid_pid(sock)[0]
                except OSError:
                    sock.close()
                    raise
                if uid != os.geteuid():
                    sock.close()
                    raise Unavailable(f"{self.url} is a socket of another user (uid {uid}), "
                                      "not an sbx service of yours: nothing was sent to it")
                return await connect("ws://sbx" + path, sock=sock, **options)
            base = "ws" + self.url[len("http"):]
            if _loopback(self.url):
                options["proxy"] = None
            return await connect(base + path, **options)
        except InvalidStatus as exc:
            body = None
            with contextlib.suppress(Exception):
                body = json.loads(exc.response.body or b"")
            raise error_from(exc.response.status_code, body, self.url) from None
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise self._unreachable(exc) from None

    async def open_pty(self, ref: str, argv: Sequence[str] | None, *, cols: int = 80,
                       rows: int = 24, env: Mapping[str, str] | None = None,
                       cwd: str | None = None) -> dict[str, Any]:
        ws = await self._pty_connect(ref)
        try:
            await ws.send(json.dumps({"argv": None if argv is None else list(argv),
                                      "cols": cols, "rows": rows, "env": dict(env or {}),
                                      "cwd": cwd}))
            said = await _pty_control(ws, self.url)
        except BaseException:
            await ws.close()
            raise
        self._pty_sockets()[said["session"]] = _PtySocket(ws, int(said["offset"]))
        return said["terminal"]

    async def _pty_socket(self, ref: str, session: str) -> _PtySocket:
        sock = self._pty_sockets().get(session)
        if sock is None or sock.dropped:
            ws = await self._pty_connect(ref, session, output=False)  # for input only
            said = await _pty_control(ws, self.url)
            view = said.get("terminal") or {}
            if view.get("running") is False:
                await ws.close()
                raise Conflict(f"terminal {session} has ended (exit code "
                               f"{view.get('exit_code')})")
            sock = self._pty_sockets()[session] = _PtySocket(ws, int(said["offset"]))
        return sock

    async def get_pty(self, ref: str, session: str) -> dict[str, Any]:
        sock = self._pty_sockets().get(session)
        if sock is not None and sock.view is not None:
            return sock.view
        ws = await self._pty_connect(ref, session)
        try:
            return (await _pty_control(ws, self.url))["terminal"]
        finally:
            await ws.close()

    async def pty_output(self, ref: str, session: str,
                         offset: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Binary frames are the output, in order from the offset the service said
        (`{"offset": n}` before any gap); `{"exit": code}` ends it. A connection that drops
        raises Unavailable: read again from the offset reached (`attach`)."""
        from websockets.exceptions import ConnectionClosed

        sockets = self._pty_sockets()
        sock = sockets.get(session)
        if sock is None or sock.dropped or sock.offset != offset or sock.reading:
            ws = await self._pty_connect(ref, session, offset)  # this reader's own
            said = await _pty_control(ws, self.url)
            sock = _PtySocket(ws, int(said["offset"]))
            if session not in sockets or sockets[session].dropped:
                sockets[session] = sock  # keystrokes go on it too
        sock.reading = True
        try:
            while True:
                try:
                    message = await sock.ws.recv()
                except ConnectionClosed as exc:
                    sock.dropped = True
                    if exc.rcvd is not None and exc.rcvd.code >= 4000:
                        raise _closed_error(exc.rcvd.code, exc.rcvd.reason) from None
                    raise Unavailable(f"the terminal's connection to {self.url} dropped at "
                                      f"offset {sock.offset}: attach to read on from there"
                                      ) from None
                if isinstance(message, bytes):
                    yield {"offset": sock.offset, "data": message}
                    sock.offset += len(message)
                    continue
                said = _pty_said(message, self.url)
                if "offset" in said:
                    sock.offset = int(said["offset"])
                if "exit" in said:
                    if sockets.get(session) is sock:
                        sockets.pop(session, None)
                    sock.dropped = True
                    await sock.ws.close()
                    yield {"exit": said["exit"]}
                    return
        finally:
            sock.reading = False
            if sockets.get(session) is not sock:
                await sock.ws.close()  # only this reader's
            else:
                sock.offset = -1  # output not read is on it: no later reader takes it

    async def write_pty(self, ref: str, session: str, data: bytes) -> None:
        await self._pty_send(ref, session, bytes(data))

    async def resize_pty(self, ref: str, session: str, cols: int, rows: int) -> None:
        await self._pty_send(ref, session, json.dumps({"resize": [cols, rows]}))

    async def close_pty(self, ref: str, session: str) -> None:
        with contextlib.suppress(Unavailable):
            await self._pty_send(ref, session, json.dumps({"close": True}))

    async def _pty_send(self, ref: str, session: str, message: bytes | str) -> None:
        from websockets.exceptions import ConnectionClosed

        for again in (True, False):  # a connection found closed is made again, once
            sock = await self._pty_socket(ref, session)
            try:
                await sock.ws.send(message)
                return
            except ConnectionClosed:
                sock.dropped = True
                if not again:
                    raise Unavailable(f"the terminal's connection to {self.url} dropped: "
                                      "attach to go on") from None

    # -- processes --------------------------------------------------------------------------

    async def start_process(self, ref: str, argv: Sequence[str], *,
                            env: Mapping[str, str] | None = None, cwd: str | None = None,
                            user: str | None = None, stdin: bool = False) -> dict[str, Any]:
        return await self._json("POST", f"/v1/sandboxes/{_seg(ref)}/processes", json_body={
            "argv": list(argv), "env": dict(env) if env else None, "cwd": cwd, "user": user,
            "stdin": stdin})

    async def list_processes(self, ref: str) -> list[dict[str, Any]]:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/processes")

    async def get_process(self, ref: str, pid: int) -> dict[str, Any]:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/processes/{int(pid)}")

    async def wait_process(self, ref: str, pid: int,
                           timeout: timedelta | None) -> dict[str, Any]:
        return await self._json("POST", f"/v1/sandboxes/{_seg(ref)}/processes/{int(pid)}/wait",
                                params={"timeout": _seconds(timeout)})

    async def signal_process(self, ref: str, pid: int, signal: int) -> dict[str, Any]:
        return await self._json(
            "POST", f"/v1/sandboxes/{_seg(ref)}/processes/{int(pid)}/signal",
            json_body={"signal": int(signal)})

    async def write_process_stdin(self, ref: str, pid: int, data: bytes) -> None:
        await self._send("POST", f"/v1/sandboxes/{_seg(ref)}/processes/{int(pid)}/stdin",
                         content=bytes(data),
                         headers={"Content-Type": "application/octet-stream"})

    async def close_process_stdin(self, ref: str, pid: int) -> None:
        await self._send("DELETE", f"/v1/sandboxes/{_seg(ref)}/processes/{int(pid)}/stdin")

    async def process_output(self, ref: str, pid: int, *, stdout_offset: int = 0,
                             stderr_offset: int = 0,
                             follow: bool = False) -> AsyncIterator[dict[str, Any]]:
        """Server-sent `stdout`/`stderr` events (each with the chunk's offset), then `exit`;
        a followed stream that drops resumes where it was (its id is the next offsets)."""
        from sandboxer._records import output_bytes

        async for event, data, _ in self._events(
                "GET", f"/v1/sandboxes/{_seg(ref)}/processes/{int(pid)}/output",
                resume=follow, params={"stdout_offset": stdout_offset or None,
                                       "stderr_offset": stderr_offset or None,
                                       "follow": follow or None}):
            if event in ("stdout", "stderr"):
                yield {"stream": event, "offset": data["offset"],
                       "data": output_bytes(data["data"])}
            elif event == "exit":
                yield {"exit": data}
                return

    # -- ports ------------------------------------------------------------------------------

    async def port_urls(self, ref: str) -> list[dict[str, Any]]:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/ports")

    async def port_url(self, ref: str, port: int) -> dict[str, Any]:
        """`GET .../ports?port=N`: that one port (404 when it is not published); the path
        `.../ports/N/...` is the service's proxy to it."""
        views = await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/ports",
                                 params={"port": port})
        return views[0]

    async def expose_port(self, ref: str, port: int) -> dict[str, Any]:
        return await self._json("POST", f"/v1/sandboxes/{_seg(ref)}/ports/{_seg(str(port))}")

    async def extend(self, ref: str, by: timedelta) -> tuple[dict[str, Any], bool]:
        view = await self._json("POST", f"/v1/sandboxes/{_seg(ref)}/extend",
                                json_body={"by": by.total_seconds()})
        return view, bool(view.pop("capped", False))

    async def touch(self, ref: str) -> dict[str, Any]:
        return await self._json("POST", f"/v1/sandboxes/{_seg(ref)}/touch")

    async def pause(self, ref: str) -> dict[str, Any]:
        return await self._json("POST", f"/v1/sandboxes/{_seg(ref)}/pause")

    async def resume(self, ref: str) -> dict[str, Any]:
        return await self._json("POST", f"/v1/sandboxes/{_seg(ref)}/resume")

    async def metrics(self, ref: str) -> dict[str, Any] | None:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/metrics")

    async def follow_metrics(self, ref: str) -> AsyncIterator[dict[str, Any]]:
        async for event, data, _ in self._events("GET", f"/v1/sandboxes/{_seg(ref)}/metrics",
                                                 params={"follow": True}):
            if event == "sample":
                yield data

    async def follow_all_metrics(self, every: timedelta | None = None,
                                 ) -> AsyncIterator[dict[str, Any]]:
        """The service follows every running sandbox (it looks for new ones every `every`,
        at least 1s there) and streams their samples."""
        async for event, data, _ in self._events("GET", "/v1/metrics/samples", params={
                "follow": True, "every": _seconds(every)}):
            if event == "sample":
                yield data

    async def recent_metrics(self, since: datetime | timedelta) -> list[dict[str, Any]]:
        return await self._json("GET", "/v1/metrics/samples", params={"since": _since(since)})

    async def metric_history(self, ref: str) -> list[dict[str, Any]]:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/metrics/history")

    async def evidence(self, ref: str, signed: bool = False) -> dict[str, Any]:
        return await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/evidence",
                                params={"signed": True} if signed else None)

    # -- events -----------------------------------------------------------------------------

    async def events(self, sandbox: str | None, since: datetime | timedelta | None,
                     after: int | None) -> list[dict[str, Any]]:
        return await self._json("GET", "/v1/events", params={
            "sandbox": sandbox, "since": _since(since), "after": after})

    async def follow_events(self, sandbox: str | None, after: int | None,
                            every: float) -> AsyncIterator[dict[str, Any]]:
        async for _, data, _ in self._events("GET", "/v1/events", resume=True,
                                             params={"sandbox": sandbox, "after": after}):
            yield data

    async def verify_events(self) -> dict[str, Any]:
        return await self._json("GET", "/v1/events/verify")

    async def deliver_events(self) -> list[dict[str, Any]]:
        return await self._json("POST", "/v1/events/deliver")

    async def undelivered(self) -> list[dict[str, Any]]:
        return await self._json("GET", "/v1/events/undelivered")

    async def redeliver(self, event_ids: Sequence[int] | None) -> list[dict[str, Any]]:
        return await self._json("POST", "/v1/events/redeliver", json_body={
            "event_ids": list(event_ids) if event_ids else None})

    # -- the reaper -------------------------------------------------------------------------

    async def reap(self, *, dry_run: bool, orphans: bool, reap: bool = True,
                   timeout: timedelta | None = None) -> dict[str, Any]:
        if not reap:
            return await self._json("POST", "/v1/reconcile", json_body={"dry_run": dry_run})
        return await self._json("POST", "/v1/reap", json_body={
            "dry_run": dry_run, "orphans": orphans, "timeout": _seconds(timeout)})

    # -- checkpoints ------------------------------------------------------------------------

    async def snapshot(self, ref: str, name: str | None) -> dict[str, Any]:
        return await self._json("POST", f"/v1/sandboxes/{_seg(ref)}/snapshot",
                                json_body={"name": name})

    async def checkpoint(self, ref: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/checkpoints/{_seg(ref)}")

    async def checkpoints(self, sandbox: str | None) -> list[dict[str, Any]]:
        return await self._json("GET", "/v1/checkpoints", params={"sandbox": sandbox})

    async def restore(self, ref: str, *, ttl: timedelta | None, name: str | None,
                      labels: Mapping[str, str] | None, owner: str | None, task: str | None,
                      profile: str | None) -> dict[str, Any]:
        return await self._json("POST", f"/v1/checkpoints/{_seg(ref)}/restore", json_body={
            "ttl": _seconds(ttl), "name": name, "labels": dict(labels) if labels else None,
            "owner": owner, "task": task, "profile": profile})

    async def remove_checkpoint(self, ref: str) -> dict[str, Any]:
        return await self._json("DELETE", f"/v1/checkpoints/{_seg(ref)}")

    async def prune_checkpoints(self) -> list[str]:
        return (await self._json("POST", "/v1/checkpoints/prune"))["removed"]

    async def export_checkpoint(self, ref: str, path: str) -> dict[str, Any]:
        """The archive, written here (mode 0600) as the service made it there."""
        response = await self._send("GET", f"/v1/checkpoints/{_seg(ref)}/archive")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(response.content)
        return await self.checkpoint(ref)

    async def import_checkpoint(self, path: str, name: str | None) -> dict[str, Any]:
        try:
            with open(path, "rb") as archive:
                data = archive.read()
        except OSError as exc:
            raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
        return await self._json("POST", "/v1/checkpoints/import", params={"name": name},
                                content=data, headers={"Content-Type": "application/gzip"})

    # -- volumes (sandboxer_tui/service/routes/volumes.py) -----------------------------------

    async def create_volume(self, name: str, *, backend: str | None,
                            labels: Mapping[str, str] | None, ttl: timedelta | None,
                            shared: bool, owner: str | None) -> dict[str, Any]:
        return await self._json("POST", "/v1/volumes", json_body={
            "name": name, "backend": backend, "labels": dict(labels) if labels else None,
            "ttl": _seconds(ttl), "shared": shared, "owner": owner})

    async def volumes(self) -> list[dict[str, Any]]:
        return await self._json("GET", "/v1/volumes")

    async def volume(self, ref: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/volumes/{_seg(ref)}")

    async def remove_volume(self, ref: str) -> dict[str, Any]:
        return await self._json("DELETE", f"/v1/volumes/{_seg(ref)}")

    async def put_volume_tree(self, ref: str, path: str,
                              tar: AsyncIterator[bytes]) -> dict[str, Any]:
        return await self._json("PUT", f"/v1/volumes/{_seg(ref)}/files/tree",
                                params={"path": path}, content=_body(tar),
                                headers={"Content-Type": "application/x-tar"})

    def get_volume_tree(self, ref: str, path: str) -> AsyncIterator[bytes]:
        return self._download(f"/v1/volumes/{_seg(ref)}/files/tree", {"path": path})

    # -- profiles, health, the store --------------------------------------------------------

    async def profiles(self) -> list[dict[str, Any]]:
        return await self._json("GET", "/v1/profiles")

    async def profile(self, name: str) -> Profile:
        from sandboxer.core.rules.profiles import Profile, dump

        doc = await self._json("GET", f"/v1/profiles/{_seg(name)}")
        doc.pop("source", None)
        profile = Profile.model_validate(doc)
        self._served[profile.name] = dump(profile)
        return profile

    async def check_profile(self, profile: Profile | Mapping[str, Any]) -> Profile:
        from sandboxer.core.rules.profiles import Profile, dump

        doc = dump(profile) if isinstance(profile, Profile) else dict(profile)
        answer = await self._json("POST", "/v1/profiles/validate", json_body=doc)
        return Profile.model_validate(answer["profile"])

    async def doctor(self) -> dict[str, Any]:
        return await self._json("GET", "/v1/doctor")

    # -- watching, backends, origin, shell --------------------------------------------------

    def watch(self, include_destroyed: bool) -> Watch:
        return RemoteWatch(self, include_destroyed)

    async def backends(self, names: Sequence[str] | None, *, check: bool,
                       timeout: float) -> list[dict[str, Any]]:
        """As the service reaches them. `shell` is never among the capabilities here: the
        shell runs on the service's host (see shell_command)."""
        docs = await self._json("GET", "/v1/backends", params={
            "name": list(names) if names else None, "check": check, "timeout": timeout})
        for doc in docs:
            doc["capabilities"] = [c for c in doc["capabilities"] if c != "shell"]
        return docs

    async def origin(self, ref: str) -> str | None:
        return (await self._json("GET", f"/v1/sandboxes/{_seg(ref)}/origin"))["restored_from"]

    async def shell_command(self, ref: str) -> list[str]:
        """Refused: this is a command line to hand this host's terminal to on the engine's
        host (`docker exec -it`); through the service a terminal is `Sandbox.pty()` (its
        WebSocket), which `sbx shell` uses."""
        from sandboxer.core.lifecycle.backends import require_running_for_shell

        view = await self.get(ref)
        require_running_for_shell(view)
        raise Conflict(f"sandbox {view['id']} runs on the service at {self.url}: an "
                       "interactive shell needs a terminal on the service's host (run sbx "
                       "there, without SBX_URL); through the service, `sbx shell` and "
                       "Sandbox.pty() open a terminal")

    async def copy_database(self, target_url: str) -> dict[str, Any]:
        raise BadInput("sbx db copy runs where the database is: on the service's host, "
                       "without SBX_URL")

    # -- for the service --------------------------------------------------------------------

    def acting_as(self, actor: str, tenant: str | None = None) -> Transport:
        raise BadInput("a client of a service acts as its API key's owner; make a key for "
                       f"{actor!r} (sbx api-keys create --owner) and use it")

    async def list_page(self, *, state: str | None, backend: str | None,
                        labels: Mapping[str, str] | None, include_destroyed: bool,
                        limit: int | None, cursor: str | None,
                        ) -> tuple[list[dict[str, Any]], str | None]:
        page = await self._json("GET", "/v1/sandboxes", params={
            "state": state, "backend": backend,
            "label": [f"{k}={v}" for k, v in (labels or {}).items()] or None,
            "include_destroyed": include_destroyed or None, "limit": limit, "cursor": cursor})
        return page["items"], page["next_cursor"]

    async def create_idempotent(self, key: str, caller: str, profile: str | Profile, *,
                                ttl: timedelta | None, name: str | None,
                                labels: Mapping[str, str] | None, owner: str | None,
                                task: str | None) -> dict[str, Any]:
        """`caller` is the service's to say: the API key this client sends."""
        return await self._create(profile, ttl=ttl, name=name, labels=labels, owner=owner,
                                  task=task, headers={"Idempotency-Key": key})

    async def create_api_key(self, scope: str, owner: str | None,
                             quotas: Mapping[str, Any] | None = None,
                             ) -> tuple[dict[str, Any], str]:
        made = await self._json("POST", "/v1/api-keys", json_body={
            "scope": scope, "owner": owner, **(quotas or {})})
        return made["key"], made["token"]

    async def api_keys(self) -> list[dict[str, Any]]:
        return await self._json("GET", "/v1/api-keys")

    async def revoke_api_key(self, key_id: str) -> dict[str, Any]:
        return await self._json("DELETE", f"/v1/api-keys/{_seg(key_id)}")

    async def authenticate(self, token: str) -> dict[str, Any] | None:
        raise BadInput("keys are checked by the service that holds them")

    async def usable_api_keys(self) -> int:
        return sum(1 for k in await self.api_keys() if k["revoked_at"] is None)

    async def sandbox_counts(self) -> list[dict[str, Any]]:
        counts: dict[tuple[str, str], int] = {}
        for view in await self.list(state=None, backend=None, labels=None,
                                    include_destroyed=True):
            key = (view["state"], view["backend"])
            counts[key] = counts.get(key, 0) + 1
        return [{"state": s, "backend": b, "count": n} for (s, b), n in counts.items()]

    async def ready(self) -> dict[str, Any]:
        return await self._json("GET", "/readyz")

    async def current_metrics(self, timeout: timedelta | None = None) -> list[dict[str, Any]]:
        raise BadInput("every sandbox's metrics at once are the service's own: scrape its "
                       "/metrics (Prometheus text), or run sbx metrics --all there")

    async def mark_traffic(self, ref: str) -> None:
        raise BadInput("traffic through a proxy is recorded by the service that holds the "
                       "sandbox: reach its port through that service's proxy")

    async def record_port_link(self, ref: str, port: int, expires_at: datetime) -> None:
        raise BadInput("a preview link is made by the service that holds the sandbox: POST "
                       "/v1/sandboxes/{ref}/ports/{port}/links there")

    async def record_mcp_call(self, tool: str, ref: str | None) -> None:
        raise BadInput("an MCP call is recorded by the service that holds the sandbox: use "
                       "its /mcp")

    # -- warm pools -------------------------------------------------------------------------

    async def pools(self) -> list[dict[str, Any]]:
        return await self._json("GET", "/v1/pools")

    async def set_pool_size(self, profile: str, size: int) -> dict[str, Any]:
        return await self._json("PUT", f"/v1/pools/{_seg(profile)}", json_body={"size": size})

    async def drain_pool(self, profile: str) -> dict[str, Any]:
        return await self._json("POST", f"/v1/pools/{_seg(profile)}/drain")

    async def list_json(self, *, state: str | None, backend: str | None,
                        labels: Mapping[str, str] | None, include_destroyed: bool) -> bytes:
        from sandboxer.core.rules.views import encode_list

        return encode_list(await self.list(state=state, backend=backend, labels=labels,
                                          include_destroyed=include_destroyed))

    # `list` comes last: a method of that name hides the builtin from the annotations below it
    # (for a type checker), so none is below it.

    async def list(self, *, state: str | None, backend: str | None,
                   labels: Mapping[str, str] | None,
                   include_destroyed: bool) -> list[dict[str, Any]]:
        """Every sandbox in one answer: `limit=all`, which the service streams
        (docs/service.md), rather than a request per page."""
        page = await self._json("GET", "/v1/sandboxes", params={
            "state": state, "backend": backend,
            "label": [f"{k}={v}" for k, v in (labels or {}).items()] or None,
            "include_destroyed": include_destroyed or None, "limit": "all"})
        return page["items"]


class RemoteWatch:
    """A watch over the service: each read asks `/v1/inventory/changes` for what changed
    since the position of its previous answer, so a look sends only the records that
    changed (docs/service.md, "Watching the inventory"); an answer with `reset` holds every
    sandbox, and is diffed here by the watch rule of sandboxer.core.follow.watch."""

    def __init__(self, transport: RemoteTransport, include_destroyed: bool) -> None:
        self._transport = transport
        self.include_destroyed = include_destroyed
        self._rows: dict[str, dict[str, Any]] = {}
        self._position: str | None = None
        self._shown: bool | None = None  # include_destroyed of the position

    async def read(self) -> dict[str, Any]:
        from sandboxer.core.follow.watch import diff_rows

        include = bool(self.include_destroyed)
        since = self._position if include == self._shown else None
        response = await self._transport._send(
            "GET", "/v1/inventory/changes",
            params={"include_destroyed": include or None, "since": since})
        answer = response.json()
        self._position, self._shown = answer["position"], include
        if answer["reset"]:
            delta, self._rows = diff_rows(self._rows, answer["changed"])
            return {"added": delta.added, "changed": delta.changed, "removed": delta.removed}
        added, changed, removed = [], [], []
        for row in answer["changed"]:
            old = self._rows.get(row["id"])
            self._rows[row["id"]] = row
            if old is None:
                added.append(row)
            elif old != row:
                changed.append(row)
        for sandbox_id in answer["removed"]:
            if self._rows.pop(sandbox_id, None) is not None:
                removed.append(sandbox_id)
        return {"added": added, "changed": changed, "removed": removed}

    async def close(self) -> None:
        """Nothing is held open between reads."""


class _PtySocket:
    """One terminal's WebSocket, and the offset of the next byte it brings."""

    def __init__(self, ws: Any, offset: int) -> None:
        self.ws, self.offset = ws, offset
        self.dropped = False
        self.reading = False
        self.view: dict[str, Any] | None = None


def _pty_said(message: str | bytes, url: str) -> dict[str, Any]:
    try:
        said = json.loads(message)
    except ValueError:
        said = None
    if not isinstance(said, dict):
        raise OperationFailed(f"the sbx service at {url} sent a terminal message that is "
                              "not a JSON object")
    if "error" in said:
        raise error_from(400, said, url)
    return said


async def _pty_control(ws: Any, url: str) -> dict[str, Any]:
    """The service's first message on a terminal's WebSocket: `{"session", "offset",
    "terminal"}`, or an error."""
    from websockets.exceptions import ConnectionClosed

    try:
        message = await ws.recv()
    except ConnectionClosed as exc:
        if exc.rcvd is not None and exc.rcvd.code >= 4000:
            raise _closed_error(exc.rcvd.code, exc.rcvd.reason) from None
        raise Unavailable(f"the sbx service at {url} closed the terminal's connection") from None
    said = _pty_said(message, url)
    if "session" not in said:
        raise OperationFailed(f"the sbx service at {url} did not open a terminal")
    return said


def _closed_error(code: int, reason: str) -> SbxError:
    """A WebSocket closed with 4000 + an HTTP status: the error of that status."""
    status = code - 4000
    cls = {400: BadInput, 404: NotFound, 409: Conflict, 503: Unavailable}.get(status,
                                                                           OperationFailed)
    return cls(reason or f"the terminal was refused ({status})")


def _loopback(url: str) -> bool:
    """Whether `url`'s host is this machine (127.0.0.0/8, ::1, localhost, 0.0.0.0): never
    reached through a proxy, which would see the key and could answer for the service."""
    import ipaddress

    host = (urllib.parse.urlsplit(url).hostname or "").rstrip(".")
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1
    return address.is_loopback or address.is_unspecified


def _own_users_socket(path: str, url: str) -> httpx.AsyncHTTPTransport:
    """A transport to the service's unix socket that sends nothing to a listener of another
    user (SO_PEERCRED, checked on each connection before a byte is sent): whoever bound the
    path first would get the key and every request. Unavailable (exit 5) names the uid."""
    import httpcore
    import httpx

    from sandboxer.core.rules.peercred import peer_uid_pid

    class OwnUserOnly(httpcore.AnyIOBackend):
        async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                      socket_options: Any = None) -> httpcore.AsyncNetworkStream:
            stream = await super().connect_unix_socket(path, timeout=timeout,
                                                       socket_options=socket_options)
            uid = peer_uid_pid(stream.get_extra_info("socket"))[0]
            if uid != os.geteuid():
                await stream.aclose()
                raise Unavailable(f"{url} is a socket of another user (uid {uid}), not an sbx "
                                  "service of yours: nothing was sent to it")
            return stream

    transport = httpx.AsyncHTTPTransport(uds=path)
    transport._pool._network_backend = OwnUserOnly()  # httpx has no option for it
    return transport


def _seg(text: str) -> str:
    return urllib.parse.quote(str(text), safe="")


def _params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    out = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else value
    return out


def _since(since: datetime | timedelta | None) -> str | None:
    if since is None:
        return None
    if isinstance(since, timedelta):
        return f"{max(1, int(since.total_seconds()))}s"
    return since.isoformat()


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (ValueError, json.JSONDecodeError):
        return None


def _async(make: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    async def run() -> T:
        return make()

    return run


def _mode(mode: int | None) -> str | None:
    """A file's permission bits as the service's query takes them: octal digits."""
    return None if mode is None else format(int(mode), "o")


async def _body(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A request body from an async iterator (httpx wants an async iterable of bytes)."""
    async for chunk in chunks:
        if chunk:
            yield bytes(chunk)
