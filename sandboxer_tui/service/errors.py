"""The one mapping from sbx's errors to HTTP: the CLI's body, `{"error": {"code", "kind",
"message"}}`, with the status its kind means. The remote client maps the body back to the
same `sandboxer.Error` class (by kind) and message. `install` puts the app's handlers on."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from sandboxer.core.rules.errors import ExitCode, SbxError, classify, one_line
from sandboxer_tui.service.auth import Refused

log = logging.getLogger("sbx.serve")

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
    from sandboxer.service import KeyReused

    if isinstance(exc, KeyReused):
        return 422  # the key was first used with another request
    return STATUS[classify(exc)[1]]


def error_response(exc: BaseException) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=status_of(exc))


def refusal(status: int, kind: str, message: str, **headers: str) -> JSONResponse:
    """401, 403 and 422 of the service itself; nothing was done. A 401 is the client's
    Unauthorized (exit 5: the key is at fault); the others exit 2."""
    from sandboxer.core.rules.errors import Unauthorized

    code = Unauthorized.exit_code if status == 401 else ExitCode.BAD_INPUT
    return JSONResponse({"error": {"code": int(code), "kind": kind, "message": message}},
                        status_code=status, headers=headers or None)


def logged_path(request: Request) -> str:
    """The request's path as the log shows it: a preview link's token (a credential,
    docs/security.md "Preview links") is left out."""
    path = request.url.path
    if path.startswith("/v1/previews/"):
        rest = path[len("/v1/previews/"):].partition("/")[2]
        return f"/v1/previews/(link)/{rest}"
    return path


def install(app: FastAPI) -> None:
    """The app's error handlers: every error leaves as the body above."""
    @app.exception_handler(SbxError)
    async def sbx_error(request: Request, exc: SbxError) -> JSONResponse:
        from sandboxer.core.rules.errors import database_cause

        cause = database_cause(exc)
        if cause is not None:  # the body says one line; the statement stays in this log
            log.warning("%s %s: %s", request.method, logged_path(request), exc,
                        exc_info=(type(cause), cause, cause.__traceback__))
        return error_response(exc)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        if exc.status == 401:
            return refusal(401, "unauthorized", str(exc), **{"WWW-Authenticate": "Bearer"})
        return refusal(403, "forbidden", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        from sandboxer.core.rules.errors import plain_problems

        problems = plain_problems([{**e, "loc": e["loc"][:1]} if e["type"] == "json_invalid"
                                   else e for e in exc.errors()])
        return JSONResponse({"error": {"code": int(ExitCode.BAD_INPUT), "kind": "bad_input",
                                       "message": "; ".join(problems)[:2000],
                                       "problems": problems[:50]}}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "bad_input"}.get(exc.status_code, "bad_input")
        code = ExitCode.NOT_FOUND if exc.status_code == 404 else ExitCode.BAD_INPUT
        return JSONResponse({"error": {"code": int(code), "kind": kind,
                                       "message": str(exc.detail)}},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, logged_path(request))
        return JSONResponse({"error": {"code": int(ExitCode.FAILED), "kind": "failed",
                                       "message": f"the service failed ({type(exc).__name__}); "
                                                  "its log says more"}}, status_code=500)
