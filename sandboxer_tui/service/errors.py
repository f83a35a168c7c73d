"""The one mapping from sbx's errors to HTTP: the CLI's body, `{"error": {"code", "kind",
"message"}}`, with the status its kind means. The remote client maps the body back to the
same `sandboxer.Error` class (by kind) and message."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from sandboxer.core.rules.errors import classify, one_line

STATUS = {"bad_input": 400, "not_found": 404, "conflict": 409, "quota_exceeded": 429,
          "unavailable": 503, "unauthorized": 401, "failed": 500}


def error_body(exc: BaseException) -> dict[str, Any]:
    code, kind = classify(exc)
    body = {"code": int(code), "kind": kind,
            "message": one_line(exc)}
    problems = getattr(exc, "problems", None)
    if problems and len(problems) > 1:
        body["problems"] = list(problems)
    return {"error": body}


def status_of(exc: BaseException) -> int:
    from sandboxer.core.lifecycle.idempotency import KeyReused

    if isinstance(exc, KeyReused):
        return 422  # the key was first used with another request
    return STATUS[classify(exc)[1]]


def error_response(exc: BaseException) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=status_of(exc))


def refusal(status: int, kind: str, message: str, **headers: str) -> JSONResponse:
    """401, 403 and 422 of the service itself; nothing was done. A 401 is the client's
    Unauthorized (exit 5: the key is at fault); the others exit 2."""
    from sandboxer.core.rules.errors import Unauthorized

    code = Unauthorized.exit_code if status == 401 else 2
    return JSONResponse({"error": {"code": int(code), "kind": kind, "message": message}},
                        status_code=status, headers=headers or None)
