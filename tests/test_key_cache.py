"""The API's cache of checked keys (pipeline/key_cache.py), through the real app: a cached key
skips the database, yet a revoked or deleted key stops working as soon as the change is
heard, and without a listener nothing is served from the cache."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import httpx
import pytest
from pydantic import ValidationError

from pipeline import tenants
from pipeline.key_cache import APPLICATION_NAME, KeyCache
from pipeline.settings import Settings


@pytest.fixture
async def http(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as client:
        yield client


async def status(http: httpx.AsyncClient, key: str) -> int:
    r = await http.get("/v1/jobs/stats", headers={"Authorization": f"Bearer {key}"})
    return r.status_code


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.05)
    return False


async def listener_pid(pool: asyncpg.Pool) -> int | None:
    return await pool.fetchval("SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                               APPLICATION_NAME)


async def test_a_cached_key_skips_the_database_until_a_change_is_heard(
    http: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    tenant_id, key = tenant
    assert await eventually(lambda: _is_not_none(listener_pid(pool)))
    assert await status(http, key) == 200  # checked in the database, then cached
    # Revoked behind the listener's back (the trigger off): the cached key still works,
    # so the request did not check it in the database.
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("ALTER TABLE api_keys DISABLE TRIGGER api_keys_changed")
        await conn.execute("UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1",
                           tenant_id)
        await conn.execute("ALTER TABLE api_keys ENABLE TRIGGER api_keys_changed")
    assert await status(http, key) == 200
    # The same revocation heard: refused at once.
    await pool.execute("UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1", tenant_id)
    assert await eventually(lambda: _equals(status(http, key), 401), timeout_s=2)


async def test_a_deleted_tenants_key_stops_working(
    http: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str]
) -> None:
    assert await eventually(lambda: _is_not_none(listener_pid(pool)))
    assert await status(http, other_tenant[1]) == 200
    await pool.execute("DELETE FROM tenants WHERE id = $1", other_tenant[0])  # keys cascade
    assert await eventually(lambda: _equals(status(http, other_tenant[1]), 401), timeout_s=2)
    assert await status(http, tenant[1]) == 200


async def test_without_a_listener_every_key_is_checked_and_it_listens_again(
    http: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    tenant_id, key = tenant
    assert await eventually(lambda: _is_not_none(listener_pid(pool)))
    assert await status(http, key) == 200
    first = await listener_pid(pool)
    # The listener's connection dies, and a revocation happens while nobody listens: the
    # cache must not answer for the key any more.
    await pool.execute("SELECT pg_terminate_backend($1)", first)
    await pool.execute("UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1", tenant_id)
    assert await eventually(lambda: _equals(status(http, key), 401), timeout_s=2)
    # It listens again on a new connection, and the revoked key stays refused.
    assert await eventually(lambda: _differs(listener_pid(pool), first))
    assert await status(http, key) == 401


async def test_a_check_that_began_before_a_change_is_not_cached(settings: Settings) -> None:
    """A key read as valid just before its revocation was heard must not be stored after it."""
    assert settings.database_url
    cache = KeyCache(settings.database_url, ttl_s=60, retry_s=0.05)
    running = asyncio.create_task(cache.run())
    try:
        assert await eventually(lambda: _true(cache.listening))
        began = cache.generation
        conn = await asyncpg.connect(settings.database_url)
        try:
            await conn.execute("UPDATE api_keys SET revoked_at = now() WHERE false")
            assert await eventually(lambda: _true(cache.generation != began), timeout_s=2)
        finally:
            await conn.close()
        cache.put(b"key", 7, began)
        assert cache.get(b"key") is None
        cache.put(b"key", 7, cache.generation)
        assert cache.get(b"key") == 7
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert not cache.listening and cache.get(b"key") is None


def test_a_cache_of_zero_seconds_never_listens_nor_answers() -> None:
    cache = KeyCache("postgresql://unused", ttl_s=0)
    asyncio.run(cache.run())  # returns at once: nothing to listen for
    cache.put(tenants.hash_key("k" * 20), 1, cache.generation)
    assert cache.get(tenants.hash_key("k" * 20)) is None


async def _is_not_none(value: Awaitable[object]) -> bool:
    return await value is not None


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def _differs(value: Awaitable[object], old: object) -> bool:
    found = await value
    return found is not None and found != old


async def _true(value: bool) -> bool:
    return value


def test_a_negative_cache_time_is_refused_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMMILL_AUTH_CACHE_SECONDS", "-1")
    with pytest.raises(ValidationError, match="auth_cache_seconds"):
        Settings()
