"""The wire: E2B's REST error body, and the Connect protocol as the SDK's envd client speaks it
(JSON codec, no compression): a unary call is a JSON body answered by a JSON body, or by an
HTTP error status with `{"code": "not_found", "message": ...}`; a server-streaming call sends
one enveloped message (flags byte, 4-byte big-endian length, JSON) and reads enveloped
messages ending with an end-of-stream envelope (flag 0x02) that carries an error, if any."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

from sandboxer.core.rules.errors import CapabilityNotSupported, classify, one_line

END_STREAM = 0x02
STREAM_TYPE = "application/connect+json"

# Connect's codes, and the HTTP status of a unary call's error (connectrpc.com/docs/protocol)
HTTP_OF = {"canceled": 499, "unknown": 500, "invalid_argument": 400,
           "deadline_exceeded": 504, "not_found": 404, "already_exists": 409,
           "permission_denied": 403, "resource_exhausted": 429,
           "failed_precondition": 412, "aborted": 409, "out_of_range": 400,
           "unimplemented": 501, "internal": 500, "unavailable": 503, "data_loss": 500,
           "unauthenticated": 401}
# sbx's kinds of error (core/rules/errors.py) as Connect codes
CODE_OF_KIND = {"bad_input": "invalid_argument", "not_found": "not_found",
                "conflict": "failed_precondition", "unauthorized": "unauthenticated",
                "quota_exceeded": "resource_exhausted", "unavailable": "unavailable",
                "failed": "internal"}


class Reply(Exception):
    """A control-plane answer other than success: status and E2B's `{"code", "message"}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RpcError(Exception):
    """An envd call's error: a Connect code and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def unimplemented(feature: str) -> str:
    return (f"{feature} is not implemented by sbx's E2B API (docs/e2b-api.md lists what "
            "is)")


def rpc_error_of(exc: BaseException) -> RpcError:
    """An sbx error (or anything else) as a Connect error, its message one line."""
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, CapabilityNotSupported):  # the backend's lack, named: not a conflict
        return RpcError("unimplemented", one_line(exc))
    _, kind = classify(exc)
    return RpcError(CODE_OF_KIND.get(kind, "internal"), one_line(exc))


def reply_of(exc: BaseException) -> Reply:
    """An sbx error as a control-plane answer: the status its kind means."""
    if isinstance(exc, Reply):
        return exc
    if isinstance(exc, RpcError):
        return Reply(HTTP_OF.get(exc.code, 500), exc.message)
    if isinstance(exc, CapabilityNotSupported):  # the backend's lack, named: not a conflict
        return Reply(501, one_line(exc))
    from sandboxer.core.rules.errors import SbxError

    if not isinstance(exc, SbxError):
        raise exc
    _, kind = classify(exc)
    status = {"bad_input": 400, "not_found": 404, "conflict": 409, "quota_exceeded": 429,
              "unavailable": 503, "unauthorized": 401}.get(kind, 500)
    return Reply(status, one_line(exc))


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_of_stream(error: RpcError | None) -> bytes:
    body = {} if error is None else {"error": {"code": error.code, "message": error.message}}
    return envelope(body, END_STREAM)


def first_envelope(body: bytes) -> dict[str, Any]:
    """The one message of a server-streaming call's request."""
    if len(body) < 5:
        raise RpcError("invalid_argument", "the request carries no enveloped message")
    flags, length = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise RpcError("unimplemented", unimplemented("a compressed request"))
    return parse(body[5:5 + length])


async def envelopes(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """A client stream's messages as they arrive, to its end-of-stream envelope (or the
    body's end)."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if len(buffer) < 5 + length:
                break
            data = bytes(buffer[5:5 + length])
            del buffer[:5 + length]
            if flags & END_STREAM:
                return
            if flags & 0x01:
                raise RpcError("unimplemented", unimplemented("a compressed request"))
            yield parse(data)
    if buffer:
        raise RpcError("invalid_argument", "the request ends inside a message")


def parse(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RpcError("invalid_argument", "the request is not JSON") from None
    if not isinstance(doc, dict):
        raise RpcError("invalid_argument", "the request is not a JSON object")
    return doc


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise RpcError("invalid_argument", "bytes must be base64 text")
    try:
        return base64.b64decode(text, validate=False)
    except ValueError:
        raise RpcError("invalid_argument", "bytes must be base64 text") from None


async def read_body(receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def body_chunks(receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message.get("body"):
            yield message["body"]
        if not message.get("more_body"):
            return


async def send_json(send, status: int, payload: Any, headers: dict[str, str] | None = None,
                    ) -> None:
    data = b"" if payload is None else json.dumps(payload).encode()
    out = [(b"content-type", b"application/json")] if payload is not None else []
    out += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": data})


async def send_rpc_error(send, error: RpcError) -> None:
    await send_json(send, HTTP_OF.get(error.code, 500),
                    {"code": error.code, "message": error.message})


async def gunzip(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A gzip-encoded body (`Content-Encoding: gzip`) as its bytes, as they come."""
    import zlib

    inflate = zlib.decompressobj(wbits=31)
    try:
        async for chunk in chunks:
            if out := inflate.decompress(chunk):
                yield out
        if out := inflate.flush():
            yield out
    except zlib.error:
        raise RpcError("invalid_argument", "the body is not gzip") from None


def multipart_files(kind: str, body: bytes) -> list[tuple[str, bytes]]:
    """The files of a multipart/form-data body: (its file name, which the SDK sets to the
    path in the sandbox; its bytes), in order."""
    import re

    match = re.search(r'boundary="?([^";]+)"?', kind)
    if match is None:
        raise RpcError("invalid_argument", "the multipart body names no boundary")
    delimiter = b"--" + match.group(1).encode()
    files = []
    for part in body.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break
        head, _, data = part.partition(b"\r\n\r\n")
        if data.endswith(b"\r\n"):
            data = data[:-2]
        name = re.search(rb'filename="([^"]*)"', head)
        if name is None:
            raise RpcError("invalid_argument", "a part of the multipart body is not a file")
        files.append((name.group(1).decode(), data))
    if not files:
        raise RpcError("invalid_argument", "the multipart body holds no file")
    return files
