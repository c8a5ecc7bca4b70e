"""Builds the FastAPI app; nothing else. State lives on `app.state`, set by the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from arq import create_pool as create_arq_pool
from arq.connections import RedisSettings
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api import docs, errors, mcp, metrics, openapi
from api.access_log import AccessLog
from api.auth import Authenticate
from api.dashboard import pages, render
from api.limits import BodySizeLimit
from api.rate_limit import RateLimit
from api.routes import (
    audit,
    context,
    dead_letters,
    health,
    items,
    jobs,
    keys,
    memories,
    profiles,
    queues,
    relations,
    search,
    sessions,
    tenants,
    transfer,
    upkeep,
    usage,
    webhooks,
)
from pipeline.db import create_pool
from pipeline.key_cache import KeyCache
from pipeline.providers.embeddings import QueryCache, get_embedder
from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings, get_settings

log = logging.getLogger(__name__)


async def _warm_up(warm: Callable[[], Awaitable[object]]) -> None:
    """Load the query model; a failure is one line, not a traceback: searches then fall back to
    full text with a warning, and the workers, which need the model, say why they cannot start."""
    try:
        await warm()
    except Exception as exc:  # noqa: BLE001 - any failure leaves the API serving without it
        log.warning("the embedding model did not load (%s: %s); hybrid and semantic searches "
                    "fall back to full text", type(exc).__name__, exc)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.database_url is None or settings.redis_url is None:
            raise RuntimeError(
                "MEMMILL_DATABASE_URL and MEMMILL_REDIS_URL must be set (memmill up sets both)"
            )
        app.state.pool = await create_pool(
            settings.database_url,
            min_size=settings.db_pool_min_size,
            max_size=settings.db_pool_max_size,
            ef_search=settings.hnsw_ef_search,
        )
        # Searches get their own connections, which plan generically (see pipeline/search.py).
        app.state.search_pool = await create_pool(
            settings.database_url,
            min_size=settings.db_pool_min_size,
            max_size=settings.db_pool_max_size,
            ef_search=settings.hnsw_ef_search,
            generic_plans=True,
        )
        app.state.queue = await create_arq_pool(
            RedisSettings.from_dsn(settings.redis_url), default_queue_name=settings.queue_name,
            **ARQ_CODEC,  # JSON: what the API enqueues can never be a pickle
        )
        # A query is one text: one model copy serves them, unless the operator chose otherwise.
        # Beside busy workers, one thread answered in 15 ms where two, waiting on each other,
        # took 60 ms and up to half a second.
        embedder = get_embedder(
            settings.model_copy(update={"embedding_threads": settings.embedding_threads or 1}))
        app.state.query_cache = QueryCache(embedder)
        app.state.key_cache = KeyCache(settings.database_url, ttl_s=settings.auth_cache_seconds)
        listening = asyncio.create_task(app.state.key_cache.run())
        # Load the model in the background so the first search does not pay for it.
        warm = getattr(embedder, "warm_up", None)
        warming = asyncio.create_task(_warm_up(warm)) if warm else None
        app.state.live = pages.live_snapshots(settings, app.state.pool)
        try:
            async with mcp.sessions(app, max_request_bytes=settings.max_request_bytes):
                yield
        finally:
            await app.state.live.close()
            if warming is not None and not warming.done():
                warming.cancel()
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening
            await app.state.queue.aclose()
            await app.state.search_pool.close()
            await app.state.pool.close()

    app = FastAPI(
        title="memmill",
        version="0.1.0",
        lifespan=lifespan,
        description="Memory and ingestion backend for AI agents.",
        docs_url=None,  # FastAPI's pages load from a CDN: `api.docs` serves its own
        redoc_url=None,
    )
    app.state.settings = settings
    errors.install(app)
    for module in (health, items, jobs, dead_letters, queues, search, memories, relations,
                   profiles, sessions, context, tenants, keys, audit, webhooks, usage,
                   transfer, upkeep):
        app.include_router(module.router)
    app.include_router(pages.router)
    app.include_router(metrics.router)
    # MCP over streamable HTTP (api/mcp.py); like the dashboard, not in the OpenAPI
    # document, and like /v1/, behind the key that Authenticate checks first.
    app.add_route(mcp.PATH, mcp.Endpoint(), include_in_schema=False)
    app.mount("/dashboard/static", StaticFiles(directory=render.HERE / "static"),
              name="dashboard-static")
    openapi.install(app)
    docs.install(app)
    bulk = {path: settings.max_bulk_request_bytes for path in items.BULK_PATHS}
    bulk[transfer.IMPORT_PATH] = settings.max_import_request_bytes
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes, larger=bulk)
    # Right after the key: a tenant over its requests a minute is refused before its body.
    app.add_middleware(RateLimit)
    # Added last, so it runs first: the key is checked before the size, and both before a body.
    app.add_middleware(Authenticate)
    # Outermost: it also logs the 401s and 413s the middlewares above answer themselves.
    app.add_middleware(AccessLog)
    app.add_middleware(metrics.RequestMetrics)
    return app
