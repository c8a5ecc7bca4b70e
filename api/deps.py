"""Every request dependency as an `Annotated` alias. State lives on `app.state`, set by the
lifespan in `api.main`, never in module globals. The accessors are `async def` although they
only read an attribute: FastAPI runs a plain `def` dependency in its thread pool, a hop to
another thread and back for every dependency of every request."""

from __future__ import annotations

from typing import Annotated

import asyncpg
from arq.connections import ArqRedis
from fastapi import Depends, Request

from api.auth import PRINCIPAL
from pipeline.providers.embeddings import QueryCache
from pipeline.settings import Settings
from pipeline.tenants import Principal


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


SettingsDep = Annotated[Settings, Depends(_settings)]
PoolDep = Annotated[asyncpg.Pool, Depends(_pool)]
SearchPoolDep = Annotated[asyncpg.Pool, Depends(_search_pool)]
QueueDep = Annotated[ArqRedis, Depends(_queue)]
QueryCacheDep = Annotated[QueryCache, Depends(_query_cache)]


async def _current_principal(request: Request) -> Principal:
    # Set by `api.auth.Authenticate` for every /v1/ path, before the body was read.
    return request.scope[PRINCIPAL]


CurrentPrincipal = Annotated[Principal, Depends(_current_principal)]


async def _current_tenant(principal: CurrentPrincipal) -> int:
    return principal.tenant_id


CurrentTenant = Annotated[int, Depends(_current_tenant)]
