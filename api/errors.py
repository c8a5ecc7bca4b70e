"""One place maps domain errors and request validation failures to HTTP responses."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from api.dashboard import errors as dashboard_errors
from pipeline.errors import MemmillError, QuotaExceeded


def _encodable(text: str) -> str:
    """A response is sent as UTF-8: a lone surrogate echoed from the request (a tag key, an
    id) is escaped, or answering a bad request would itself fail with a 500."""
    return text.encode("utf-8", "backslashreplace").decode()


def _place(part: object) -> str:
    text = str(part)
    return text if text.isprintable() else repr(text)


def _readable(error: dict[str, Any]) -> str:
    loc = [p for p in error.get("loc", ()) if p != "body"]
    where = ".".join(_place(p) for p in loc)
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON: {error.get('ctx', {}).get('error', 'parse error')}"
    if error.get("type") == "extra_forbidden":
        return f"unknown field {'.'.join(str(p) for p in loc)!r}"
    if not where and error.get("type") == "missing":
        return "the body is missing: send a JSON object with Content-Type: application/json"
    if not where and error.get("type") in ("model_attributes_type", "model_type", "dict_type"):
        return "the body must be a JSON object, sent with Content-Type: application/json"
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))


def _domain_response(exc: MemmillError) -> JSONResponse:
    if exc.status_code == 422:
        # The same shape as a request validation failure; the rule broken is not one field's.
        return _validation_problem(exc.message, [{"loc": [], "msg": _encodable(exc.message),
                                                  "type": "bad_input"}])
    if isinstance(exc, QuotaExceeded):
        return quota_response(exc)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    return JSONResponse({"detail": _encodable(exc.message)}, status_code=exc.status_code,
                        headers=headers)


def quota_response(exc: QuotaExceeded) -> JSONResponse:
    """A 429 names the limit with its value and use, and says when to come back, in the body
    and as `Retry-After`. The rate limiter (api/rate_limit.py), which answers before any
    route runs, sends the same."""
    return JSONResponse({"detail": _encodable(exc.message), **exc.fields}, status_code=429,
                        headers={"Retry-After": str(exc.retry_after_s)})


def _validation_problem(detail: str, errors: list[dict[str, Any]]) -> JSONResponse:
    """Every 422 has this one shape, `api.schemas.ValidationProblem`, as the document says."""
    return JSONResponse({"detail": _encodable(detail), "errors": errors}, status_code=422)


def install(app: FastAPI) -> None:
    @app.exception_handler(MemmillError)
    async def _domain(request: Request, exc: MemmillError) -> Response:
        if dashboard_errors.is_dashboard(request):
            return await dashboard_errors.page(request, exc.status_code, exc.message, exc)
        return _domain_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        errors = list(exc.errors())
        message = "; ".join(_readable(e) for e in errors[:5])
        if dashboard_errors.is_dashboard(request):
            return await dashboard_errors.page(request, 422, message)
        return _validation_problem(message, [_plain(e) for e in errors[:20]])

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        # FastAPI and Starlette answer a body they cannot parse (not UTF-8, JSON nested past
        # the parser's depth, a broken multipart form) with a bare 400 "error parsing the
        # body": it is bad input like any other, so a 422 of the same shape.
        if exc.status_code == 400:
            message = _unparsable(exc)
            return _validation_problem(message, [{"loc": ["body"], "msg": message,
                                                  "type": "body_unparsable"}])
        if dashboard_errors.is_dashboard(request):
            return await dashboard_errors.page(request, exc.status_code, str(exc.detail))
        return await http_exception_handler(request, exc)


def _unparsable(exc: HTTPException) -> str:
    if isinstance(exc.__cause__, UnicodeDecodeError):
        return f"the body is not valid JSON: it is not UTF-8 ({exc.__cause__.reason})"
    if isinstance(exc.__cause__, RecursionError):
        return "the body is not valid JSON: it is nested too deeply"
    return f"the body could not be read: {exc.detail}"


def _plain(error: dict[str, Any]) -> dict[str, Any]:
    loc = [p if isinstance(p, int) else _encodable(str(p)) for p in error.get("loc", ())]
    return {"loc": loc, "msg": _encodable(str(error.get("msg"))), "type": error.get("type")}
