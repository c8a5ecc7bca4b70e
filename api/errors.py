"""One place maps domain errors and request validation failures to HTTP responses."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from pipeline.errors import MemmillError


def _readable(error: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON: {error.get('ctx', {}).get('error', 'parse error')}"
    if error.get("type") == "extra_forbidden":
        return f"unknown field {where!r}"
    if not where and error.get("type") == "missing":
        return "the body is missing: send a JSON object with Content-Type: application/json"
    if not where and error.get("type") in ("model_attributes_type", "model_type", "dict_type"):
        return "the body must be a JSON object, sent with Content-Type: application/json"
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))


def _domain_response(exc: MemmillError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    return JSONResponse({"detail": exc.message}, status_code=exc.status_code, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(MemmillError)
    async def _domain(_: Request, exc: MemmillError) -> JSONResponse:
        return _domain_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        message = "; ".join(_readable(e) for e in errors[:5])
        return JSONResponse(
            {"detail": message, "errors": [_plain(e) for e in errors[:20]]}, status_code=422
        )

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        # FastAPI reports a body that is not UTF-8 as a bare 400 "error parsing the body".
        if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
            return JSONResponse(
                {"detail": f"the body is not valid JSON: it is not UTF-8 ({exc.__cause__.reason})"},
                status_code=422,
            )
        return await http_exception_handler(request, exc)


def _plain(error: dict[str, Any]) -> dict[str, Any]:
    return {"loc": list(error.get("loc", ())), "msg": error.get("msg"), "type": error.get("type")}
