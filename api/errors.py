"""One place maps domain errors and request validation failures to HTTP responses."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from pipeline.errors import MemmillError


def _readable(error: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON: {error.get('ctx', {}).get('error', 'parse error')}"
    if error.get("type") == "extra_forbidden":
        return f"unknown field {where!r}"
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))


def install(app: FastAPI) -> None:
    @app.exception_handler(MemmillError)
    async def _domain(_: Request, exc: MemmillError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"detail": exc.message}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        message = "; ".join(_readable(e) for e in errors[:5])
        return JSONResponse(
            {"detail": message, "errors": [_plain(e) for e in errors[:20]]}, status_code=422
        )


def _plain(error: dict[str, Any]) -> dict[str, Any]:
    return {"loc": list(error.get("loc", ())), "msg": error.get("msg"), "type": error.get("type")}
