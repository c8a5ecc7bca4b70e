"""The key is checked before a body is read, on every /v1/ route: a client without a key
cannot make the API buffer or parse a large body, and an operator's key is told apart."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import asyncpg
import httpx
import pytest

from pipeline import tenants

DECLARED_BYTES = 90_000_000  # under the bulk limit (100 MB), so only the key can refuse it


async def send_head_only(api_url: str, path: str, headers: dict[str, str]) -> tuple[int, float]:
    """Declare a 90 MB JSON body, send 1 KB of it, and wait for the answer: a server that
    read the body first would wait for the other 89.99 MB and never answer."""
    url = urlsplit(api_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    started = time.monotonic()
    head = [f"POST {path} HTTP/1.1", f"Host: {url.netloc}", "Content-Type: application/json",
            f"Content-Length: {DECLARED_BYTES}", *(f"{k}: {v}" for k, v in headers.items())]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + b'{"items": [' + b" " * 1000)
    await writer.drain()
    try:
        status_line = await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()
    return int(status_line.split()[1]), time.monotonic() - started


@pytest.mark.parametrize("path", ["/v1/items/batch", "/v1/items/upload", "/v1/items",
                                  "/v1/search", "/v1/dead-letters/replay"])
async def test_a_request_without_a_valid_key_is_refused_before_its_body(
    api_url: str, tenant: tuple[int, str], path: str
) -> None:
    status, _ = await send_head_only(api_url, path, {})
    assert status == 401
    status, _ = await send_head_only(api_url, path, {"Authorization": "Bearer mm_not_a_key_at_all"})
    assert status == 401
    status, _ = await send_head_only(api_url, path, {"X-API-Key": "mm_not_a_key_at_all_either"})
    assert status == 401


async def test_with_a_valid_key_the_declared_size_is_checked_before_the_body(
    api_url: str, tenant: tuple[int, str]
) -> None:
    # /v1/items allows 4 MB: a declared 90 MB is refused from the headers.
    status, _ = await send_head_only(api_url, "/v1/items", {"Authorization": f"Bearer {tenant[1]}"})
    assert status == 413


async def test_health_answers_while_unauthenticated_bodies_wait(
    api_url: str, tenant: tuple[int, str]
) -> None:
    pending = [asyncio.create_task(send_head_only(api_url, "/v1/items/batch", {}))
               for _ in range(4)]
    async with httpx.AsyncClient(base_url=api_url, timeout=10) as http:
        assert (await http.get("/healthz")).status_code == 200
    assert [status for status, _ in await asyncio.gather(*pending)] == [401] * 4


async def test_unknown_v1_paths_need_a_key_too(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url, timeout=10) as http:
        r = await http.get("/v1/no-such-thing")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert "API key" in r.json()["detail"]


async def test_the_principal_says_whose_key_and_whether_an_operator(
    pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    tenant_id, key = tenant
    plain = await tenants.authenticate(pool, key)
    assert (plain.tenant_id, plain.operator) == (tenant_id, False)
    operator_key = tenants.new_key()
    assert await tenants.add_key(pool, tenant_id, operator_key, name="ops", role="operator")
    operator = await tenants.authenticate(pool, operator_key)
    assert (operator.tenant_id, operator.operator) == (tenant_id, True)
    assert operator.key_id != plain.key_id
