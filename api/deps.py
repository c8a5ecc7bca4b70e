"""Every request dependency as an `Annotated` alias. State lives on `app.state`, set by the
lifespan in `api.main`, never in module globals."""

from __future__ import annotations

from typing import Annotated

import asyncpg
from arq.connections import ArqRedis
from fastapi import Depends, Header, Request

from pipeline import tenants
from pipeline.providers.embeddings import QueryCache
from pipeline.settings import Settings


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _pool(request: Request) -> asyncpg.Pool:
    return request.app.state.pool


def _queue(request: Request) -> ArqRedis:
    return request.app.state.queue


def _query_cache(request: Request) -> QueryCache:
    return request.app.state.query_cache


SettingsDep = Annotated[Settings, Depends(_settings)]
PoolDep = Annotated[asyncpg.Pool, Depends(_pool)]
QueueDep = Annotated[ArqRedis, Depends(_queue)]
QueryCacheDep = Annotated[QueryCache, Depends(_query_cache)]


async def _current_tenant(
    pool: PoolDep,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> int:
    key = x_api_key
    if authorization:
        scheme, _, value = authorization.partition(" ")
        key = value.strip() if scheme.lower() == "bearer" else None
    return await tenants.authenticate(pool, key)


CurrentTenant = Annotated[int, Depends(_current_tenant)]
