"""Requests a minute per tenant, counted in Redis before anything reads a request's body.

The middleware runs right after `api.auth.Authenticate`, which put the key's principal in the
scope: a request over its tenant's limit gets its 429 from the headers alone. Only `/v1/`
requests with a principal count; an operator's key is never limited (it acts for the
installation, and must be able to fix a tenant that is being refused).

The count is a sliding window of 60 s, kept as a sorted set per tenant
(`{queue_name}:rate:{tenant_id}`, the time of each request admitted): a request is admitted
while fewer than the limit were admitted in the last 60 s. Unlike fixed windows, which admit
twice the limit across a minute's boundary, it is exact, and a refusal says to the
millisecond when the oldest request leaves the window (`Retry-After`, rounded up). The price
is a set of up to `limit` entries per tenant that made requests in the last minute (some 60
bytes each, removed 60 s after the tenant's last request). One Lua script reads and adds, so
API processes running side by side never both take the last place, on Redis's clock, so they
need no synchronized clocks. A refused request is not counted: a client that keeps retrying
is admitted again as soon as the window allows.

Redis is the queue's fast lane, not a gate: when it does not answer within
`REDIS_TIMEOUT_S`, the request is served unlimited, the limiter leaves Redis alone for
`SKIP_AFTER_FAILURE_S`, and a warning is logged at most once a minute. Each tenant's limit is
read from Postgres at most every `LIMITS_TTL_S` per process (the route that sets it clears
the process's own copy at once).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from typing import Any

import asyncpg
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import PRINCIPAL, PROTECTED_PREFIX
from api.errors import quota_response
from pipeline import quotas
from pipeline.errors import QuotaExceeded
from pipeline.quotas import rate_key, tenant_redis_keys
from pipeline.settings import Settings

__all__ = ["Limiter", "RateLimit", "limiter_of", "tenant_redis_keys"]

log = logging.getLogger(__name__)

WINDOW_MS = 60_000
# Long enough that a busy event loop is not taken for a dead Redis (0.25 s was, on a loaded
# machine); a refused connection fails at once, and after a failure only one request a
# second waits for Redis again.
REDIS_TIMEOUT_S = 2.0
SKIP_AFTER_FAILURE_S = 1.0
WARN_EVERY_S = 60.0
LIMITS_TTL_S = 5.0
REDIS_DOWN = (RedisError, OSError, asyncio.TimeoutError)
DATABASE_DOWN = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)

# KEYS[1]: the tenant's window. ARGV: the limit (-1: count only), the window in ms, a member
# unique to this request. Returns {admitted (1/0), requests in the window, ms until a place
# frees (0 when admitted)}.
WINDOW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local used = redis.call('ZCARD', KEYS[1])
if limit < 0 then
    return {1, used, 0}
end
if used < limit then
    redis.call('ZADD', KEYS[1], now, ARGV[3])
    redis.call('PEXPIRE', KEYS[1], window)
    return {1, used + 1, 0}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = window
if oldest[2] then
    wait = tonumber(oldest[2]) + window - now
end
return {0, used, wait}
"""


class Limiter:
    """The request windows in Redis and each tenant's limit, for one API process: kept on
    `app.state` (see `limiter_of`), shared by the middleware and `GET /v1/usage`."""

    def __init__(self, pool: asyncpg.Pool, queue: Any, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self._script = queue.register_script(WINDOW_LUA)
        self._limits: dict[int, tuple[float, int | None]] = {}
        self._skip_until = 0.0
        self._warned_at: float | None = None

    async def requests_per_minute(self, tenant_id: int) -> int | None:
        """The tenant's limit (None: unlimited), read again every `LIMITS_TTL_S`. When the
        database does not answer, the last one read (or none): the request goes on to meet
        the database's own 503 where it needs it."""
        now = time.monotonic()
        cached = self._limits.get(tenant_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            applying = await quotas.limits(self.pool, tenant_id, self.settings)
        except DATABASE_DOWN:
            return cached[1] if cached is not None else None
        self._limits[tenant_id] = (now + LIMITS_TTL_S, applying.requests_per_minute)
        return applying.requests_per_minute

    def forget(self, tenant_id: int) -> None:
        """The tenant's limits changed: read them again on its next request."""
        self._limits.pop(tenant_id, None)

    async def admit(self, tenant_id: int, limit: int) -> QuotaExceeded | None:
        """Count the request, or the refusal to answer it with."""
        result = await self._window(tenant_id, limit)
        if result is None or result[0]:
            return None
        used, wait_ms = int(result[1]), int(result[2])
        return QuotaExceeded(
            "requests_per_minute", limit_value=limit, used=used, adding=1,
            retry_after_s=math.ceil(wait_ms / 1000),
            message=f"tenant rate limit exceeded: requests_per_minute (limit {limit}, used "
                    f"{used} in the last 60 s, adding 1)")

    async def requests_now(self, tenant_id: int) -> int | None:
        """Requests admitted in the last 60 s; None when Redis does not answer."""
        result = await self._window(tenant_id, -1)
        return None if result is None else int(result[1])

    async def _window(self, tenant_id: int, limit: int) -> list[int] | None:
        started = time.monotonic()
        if started < self._skip_until:
            return None
        try:
            return await asyncio.wait_for(
                self._script(keys=[rate_key(self.settings.queue_name, tenant_id)],
                             args=[limit, WINDOW_MS, secrets.token_hex(8)]),
                REDIS_TIMEOUT_S)
        except REDIS_DOWN as exc:
            self._skip_until = time.monotonic() + SKIP_AFTER_FAILURE_S
            if self._warned_at is None or started - self._warned_at >= WARN_EVERY_S:
                self._warned_at = started
                why = (f"no answer within {REDIS_TIMEOUT_S:g} s"
                       if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}")
                log.warning("rate limits are not enforced: Redis does not answer (%s); "
                            "requests are served unlimited until it does", why)
            return None


def limiter_of(state: Any) -> Limiter:
    """The process's limiter, made on first use (the pool and queue exist once the app's
    lifespan has started)."""
    limiter = getattr(state, "rate_limiter", None)
    if limiter is None:
        limiter = state.rate_limiter = Limiter(state.pool, state.queue, state.settings)
    return limiter


class RateLimit:
    """Pure ASGI, added just inside `Authenticate`, so a refused request's body is never read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get(PRINCIPAL) if scope["type"] == "http" else None
        if (principal is None or principal.operator
                or not scope["path"].startswith(PROTECTED_PREFIX)):
            await self.app(scope, receive, send)
            return
        limiter = limiter_of(scope["app"].state)
        limit = await limiter.requests_per_minute(principal.tenant_id)
        if limit is not None:
            refusal = await limiter.admit(principal.tenant_id, limit)
            if refusal is not None:
                await quota_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
