"""Every request dependency as an `Annotated` alias. State lives on `app.state`, set by the
lifespan in `api.main`, never in module globals. The accessors are `async def` although they
only read an attribute: FastAPI runs a plain `def` dependency in its thread pool, a hop to
another thread and back for every dependency of every request."""

from __future__ import annotations

from typing import Annotated

import asyncpg
from arq.connections import ArqRedis
from fastapi import Depends, Header, Request

from pipeline import tenants
from pipeline.key_cache import KeyCache
from pipeline.providers.embeddings import QueryCache
from pipeline.settings import Settings


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _pool(request: Request) -> asyncpg.Pool:
    return request.app.state.pool


async def _search_pool(request: Request) -> asyncpg.Pool:
    return request.app.state.search_pool


async def _queue(request: Request) -> ArqRedis:
    return request.app.state.queue


async def _query_cache(request: Request) -> QueryCache:
    return request.app.state.query_cache


async def _key_cache(request: Request) -> KeyCache:
    return request.app.state.key_cache


SettingsDep = Annotated[Settings, Depends(_settings)]
PoolDep = Annotated[asyncpg.Pool, Depends(_pool)]
SearchPoolDep = Annotated[asyncpg.Pool, Depends(_search_pool)]
QueueDep = Annotated[ArqRedis, Depends(_queue)]
QueryCacheDep = Annotated[QueryCache, Depends(_query_cache)]
KeyCacheDep = Annotated[KeyCache, Depends(_key_cache)]


def _key(authorization: str | None, x_api_key: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None
    return x_api_key


async def _current_tenant(
    pool: PoolDep,
    keys: KeyCacheDep,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> int:
    return await tenants.authenticate(pool, _key(authorization, x_api_key), keys)


async def authenticate_request(request: Request) -> int:
    """The same check as `CurrentTenant`, for code that runs before dependencies are solved
    (a body that is not valid JSON is rejected before any dependency runs)."""
    headers = request.headers
    return await tenants.authenticate(
        request.app.state.pool, _key(headers.get("authorization"), headers.get("x-api-key")),
        request.app.state.key_cache,
    )


CurrentTenant = Annotated[int, Depends(_current_tenant)]
