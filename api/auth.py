"""The API key of every `/v1/` and `/mcp` request is checked before anything reads its body.

FastAPI reads and parses a request's body before it solves the route's dependencies, so a key
checked by a dependency came after a 94 MB body without a key had been parsed in full (5 s and
half a gigabyte for a 401). This middleware runs first: a request without a valid key gets its
401 from the headers alone, and a key whose role may not make the request (api/roles.py) its
403; the routes read who it is from the scope. `/mcp` (api/mcp.py) takes any valid
key: each of its tool calls is an API request of its own, checked here for its role."""

from __future__ import annotations

import logging

import asyncpg
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api import roles
from pipeline import tenants
from pipeline.errors import MemmillError

log = logging.getLogger(__name__)

PRINCIPAL = "memmill.principal"
PROTECTED_PREFIX = "/v1/"
MCP_PATH = "/mcp"
DATABASE_DOWN = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


def protected(path: str) -> bool:
    return path.startswith(PROTECTED_PREFIX) or path == MCP_PATH or path.startswith(
        MCP_PATH + "/")


def key_from(headers: Headers) -> str | None:
    """`Authorization: Bearer <key>`, else `X-API-Key: <key>`."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, value = authorization.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None
    return headers.get("x-api-key")


class Authenticate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not protected(scope["path"]):
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        try:
            principal = await tenants.authenticate(
                state.pool, key_from(Headers(scope=scope)), state.key_cache)
        except MemmillError as exc:
            response = JSONResponse({"detail": exc.message}, status_code=exc.status_code,
                                    headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        except DATABASE_DOWN as exc:
            log.warning("cannot check an API key: the database is unavailable: %s", exc)
            response = JSONResponse({"detail": "the database is unavailable; try again shortly"},
                                    status_code=503, headers={"Retry-After": "5"})
            await response(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if not principal.may(roles.role_needed(method, path)):
            response = JSONResponse({"detail": roles.refusal(method, path, principal.role)},
                                    status_code=403)
            await response(scope, receive, send)
            return
        scope[PRINCIPAL] = principal
        await self.app(scope, receive, send)
