"""Per-tenant quotas and the rate limit, through the real API over HTTP: each limit refuses
with a 429 that names it, with `Retry-After`, before anything is written; `GET /v1/usage`
follows puts and deletes exactly; the request window admits exactly the limit, per tenant,
never limits an operator's key, and steps aside when Redis does not answer; the operator's
limits routes validate what they are given. The maintained usage equals a recount through
a workload, and a check reads neither the ledger nor the items."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from pipeline import quotas, tenants
from pipeline.db import Q
from pipeline.errors import BadInput, NotFound, QuotaExceeded
from pipeline.settings import Settings
from tests.conftest import plan_nodes, serving

TABLES = ("items", "sources", "item_versions", "jobs", "memories", "memory_history", "events",
          "sessions", "operations")
U1 = {"user_id": "u1"}


def client(api_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {key}"},
                             timeout=60)


@pytest.fixture
async def operator_key(pool: asyncpg.Pool, tenant: tuple[int, str]) -> str:
    """An operator's key of the default tenant: it sets limits, and is never rate limited."""
    key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], key, name="ops", role="operator")
    return key


@pytest.fixture
async def ops(api_url: str, operator_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client(api_url, operator_key) as c:
        yield c


async def set_limits(ops: httpx.AsyncClient, tenant_id: int, **limits: int | None
                     ) -> dict[str, Any]:
    r = await ops.put(f"/v1/tenants/{tenant_id}/limits", json=limits)
    assert r.status_code == 200, r.text
    return r.json()


async def stored(pool: asyncpg.Pool, tenant_id: int) -> dict[str, int]:
    """How many rows of each table the tenant has: what a refused write must leave as it was."""
    return {t: await pool.fetchval(f"SELECT count(*) FROM {t} WHERE tenant_id = $1", tenant_id)
            for t in TABLES}


def assert_refused(r: httpx.Response, limit: str, *, limit_value: int, used: int,
                   adding: int) -> dict[str, Any]:
    assert r.status_code == 429, r.text
    body = r.json()
    assert {k: body[k] for k in ("limit", "limit_value", "used", "adding")} == {
        "limit": limit, "limit_value": limit_value, "used": used, "adding": adding}, body
    assert f"{limit} (limit {limit_value}, used {used}" in body["detail"], body
    assert int(r.headers["Retry-After"]) == body["retry_after_s"] >= 1
    return body


async def usage(c: httpx.AsyncClient) -> dict[str, Any]:
    r = await c.get("/v1/usage")
    assert r.status_code == 200, r.text
    return r.json()


def used(body: dict[str, Any]) -> dict[str, int | None]:
    return {name: entry["used"] for name, entry in body.items()}


async def put(c: httpx.AsyncClient, item_id: str, content: str, **extra: Any) -> httpx.Response:
    return await c.post("/v1/items", json={"id": item_id, "content": content, **extra})


async def add_memory(c: httpx.AsyncClient, content: str) -> httpx.Response:
    return await c.post("/v1/memories", json={"scope": U1, "type": "fact", "content": content})


async def write_events(c: httpx.AsyncClient, session: str, *contents: str) -> httpx.Response:
    return await c.post(f"/v1/sessions/{session}/events", json={"scope": U1, "events": [
        {"event_id": f"e{i}", "role": "user", "content": text}
        for i, text in enumerate(contents)]})


async def queued_jobs(pool: asyncpg.Pool, tenant_id: int) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM jobs WHERE tenant_id = $1 AND status IN ('waiting', 'queued', "
        "'running')", tenant_id)


def state_args(tenant_id: int, *, everything: bool = True) -> tuple[Any, ...]:
    """The arguments of `quotas.state`: no defaults, nothing added, all usage or none."""
    return (tenant_id, None, None, None, None, None, 0, 0, 0, 0, everything,
            quotas.FOLD_AFTER_ROWS + 1)


async def recount(pool: asyncpg.Pool, tenant_id: int) -> dict[str, int]:
    row = await pool.fetchrow("SELECT items, memories, bytes FROM tenant_usage_counted "
                              "WHERE tenant_id = $1", tenant_id)
    return dict(row) if row else {"items": 0, "memories": 0, "bytes": 0}


# --- usage --------------------------------------------------------------------------------


async def test_usage_follows_puts_and_deletes(
    http: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    tenant_id = tenant[0]
    empty = await usage(http)
    assert used(empty) == {"requests_per_minute": None, "items": 0, "memories": 0, "bytes": 0,
                           "jobs": 0}
    assert all(e["limit"] is None and e["remaining"] is None for e in empty.values())

    assert (await put(http, "a", "x" * 100)).status_code == 202
    assert (await put(http, "b", "é" * 50)).status_code == 202  # 100 bytes in UTF-8
    r = await http.post("/v1/items/upload", files=[("file", ("c.txt", b"y" * 300, "text/plain"))])
    assert r.status_code == 202 and r.json()["accepted"], r.text
    assert (await add_memory(http, "Ana drinks green tea.")).status_code == 201  # 21 bytes
    assert (await write_events(http, "s1", "hello", "there")).status_code == 202  # 10 bytes
    now = await usage(http)
    assert used(now) == {"requests_per_minute": None, "items": 3, "memories": 1,
                         "bytes": 100 + 100 + 300 + 21 + 10,
                         "jobs": await queued_jobs(pool, tenant_id)}
    assert now["jobs"]["used"] == 3 + 3 + 4 + 1 + 2

    # A new version keeps the old source: both count. Tags alone copy the source.
    assert (await put(http, "a", "z" * 40)).status_code == 202
    assert (await put(http, "b", "é" * 50, tags={"k": "v"})).status_code == 202
    assert used(await usage(http))["bytes"] == 531 + 40 + 100
    # Reverting drops the newer version's source; deleting drops the item with its sources.
    assert (await http.delete("/v1/items/a")).status_code == 200
    assert (await http.delete("/v1/items/c.txt")).status_code == 200
    after = used(await usage(http))
    assert (after["items"], after["bytes"]) == (2, 100 + 100 + 100 + 21 + 10)
    memory = (await http.get("/v1/memories", params=U1)).json()["data"][0]
    r = await http.patch(f"/v1/memories/{memory['id']}", json={
        "scope": U1, "expected_version": 1, "content": "Ana drinks tea."})  # 15 bytes
    assert r.status_code == 200, r.text
    assert used(await usage(http))["bytes"] == 100 + 100 + 100 + 15 + 10
    r = await http.delete(f"/v1/memories/{memory['id']}", params=U1)
    assert r.status_code == 204, r.text
    assert (await http.delete("/v1/sessions/s1", params=U1)).status_code == 200
    final = used(await usage(http))
    assert (final["items"], final["memories"], final["bytes"]) == (2, 0, 300)
    assert {k: final[k] for k in ("items", "memories", "bytes")} == await recount(pool, tenant_id)
    assert final["jobs"] == await queued_jobs(pool, tenant_id)


async def test_usage_answers_every_key_of_the_tenant(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str], other_tenant: tuple[int, str],
    ops: httpx.AsyncClient,
) -> None:
    reader = tenants.new_key()
    await tenants.add_key(pool, tenant[0], reader, name="reader", role="read")
    await set_limits(ops, tenant[0], items=10)
    async with client(api_url, tenant[1]) as a, client(api_url, reader) as r, \
            client(api_url, other_tenant[1]) as b:
        assert (await put(a, "one", "text")).status_code == 202
        for c in (a, r, ops):
            body = await usage(c)
            assert body["items"] == {"limit": 10, "used": 1, "remaining": 9}
        # Another tenant sees its own, with the installation's default: no limit.
        assert (await usage(b))["items"] == {"limit": None, "used": 0, "remaining": None}


# --- each limit: 429, Retry-After, the body naming it, nothing written --------------------


async def test_items_limit(
    http: httpx.AsyncClient, ops: httpx.AsyncClient, pool: asyncpg.Pool,
    tenant: tuple[int, str],
) -> None:
    tenant_id = tenant[0]
    await set_limits(ops, tenant_id, items=2)
    assert (await put(http, "a", "first")).status_code == 202
    assert (await put(http, "b", "second")).status_code == 202
    before = await stored(pool, tenant_id)

    body = assert_refused(await put(http, "c", "third"), "items", limit_value=2, used=2,
                          adding=1)
    assert body["retry_after_s"] == 60
    r = await http.post("/v1/items/batch", json={"items": [
        {"id": "d", "content": "x"}, {"id": "e", "uri": "https://example.org/e.html"}]})
    assert_refused(r, "items", limit_value=2, used=2, adding=2)
    r = await http.post("/v1/items", json={"id": "f", "uri": "https://example.org/f.pdf"})
    assert_refused(r, "items", limit_value=2, used=2, adding=1)
    r = await http.post("/v1/items/upload", files=[("file", ("g.txt", b"file", "text/plain"))])
    assert_refused(r, "items", limit_value=2, used=2, adding=1)
    assert await stored(pool, tenant_id) == before

    # What adds no item still passes: new content, new tags, the same again, a delete.
    assert (await put(http, "a", "first, changed")).json()["change"] == "content"
    assert (await put(http, "b", "second", tags={"k": "v"})).json()["change"] == "metadata"
    assert (await put(http, "b", "second", tags={"k": "v"})).json()["change"] == "unchanged"
    r = await http.post("/v1/items/batch", json={"items": [
        {"id": "a", "content": "first, changed"}, {"id": "b", "content": "second again"}]})
    assert r.status_code == 202 and len(r.json()["accepted"]) == 2, r.text
    assert (await http.delete("/v1/items/b", params={"purge": "true"})).status_code == 200
    assert (await put(http, "c", "third")).status_code == 202  # a place is free again


async def test_bytes_limit(
    http: httpx.AsyncClient, ops: httpx.AsyncClient, pool: asyncpg.Pool,
    tenant: tuple[int, str],
) -> None:
    tenant_id = tenant[0]
    await set_limits(ops, tenant_id, bytes=100)
    assert (await put(http, "a", "x" * 60)).status_code == 202
    before = await stored(pool, tenant_id)
    assert_refused(await put(http, "b", "y" * 41), "bytes", limit_value=100, used=60, adding=41)
    r = await http.post("/v1/items/upload", files=[("file", ("c.bin", b"\x00" * 50, None))])
    assert_refused(r, "bytes", limit_value=100, used=60, adding=50)
    assert_refused(await add_memory(http, "m" * 41), "bytes", limit_value=100, used=60,
                   adding=41)
    assert_refused(await write_events(http, "s1", "e" * 30, "f" * 11), "bytes",
                   limit_value=100, used=60, adding=41)
    assert await stored(pool, tenant_id) == before
    assert (await put(http, "b", "y" * 40)).status_code == 202  # exactly up to the limit
    assert used(await usage(http))["bytes"] == 100


async def test_memories_limit(
    http: httpx.AsyncClient, ops: httpx.AsyncClient, pool: asyncpg.Pool,
    tenant: tuple[int, str],
) -> None:
    tenant_id = tenant[0]
    await set_limits(ops, tenant_id, memories=1)
    first = await add_memory(http, "Ana drinks green tea.")
    assert first.status_code == 201, first.text
    before = await stored(pool, tenant_id)
    assert_refused(await add_memory(http, "Ana lives in Porto."), "memories", limit_value=1,
                   used=1, adding=1)
    assert await stored(pool, tenant_id) == before
    # An edit adds no memory; after a delete there is room again.
    memory = first.json()["memory"]
    r = await http.patch(f"/v1/memories/{memory['id']}", json={
        "scope": U1, "expected_version": 1, "content": "Ana drinks black tea."})
    assert r.status_code == 200, r.text
    r = await http.delete(f"/v1/memories/{memory['id']}", params=U1)
    assert r.status_code == 204, r.text
    assert (await add_memory(http, "Ana lives in Porto.")).status_code == 201


async def test_jobs_limit(
    http: httpx.AsyncClient, ops: httpx.AsyncClient, pool: asyncpg.Pool,
    tenant: tuple[int, str],
) -> None:
    """No worker runs here, so every job a write queues stays queued (or waiting)."""
    tenant_id = tenant[0]
    await set_limits(ops, tenant_id, jobs=4)
    put_a = await put(http, "a", "some text")  # analyze, summarize, embed
    assert put_a.status_code == 202
    before = await stored(pool, tenant_id)
    body = assert_refused(await put(http, "b", "more text"), "jobs", limit_value=4, used=3,
                          adding=3)
    assert body["retry_after_s"] == 30
    assert_refused(await write_events(http, "s1", "hello"), "jobs", limit_value=4, used=3,
                   adding=2)
    assert await stored(pool, tenant_id) == before
    assert (await add_memory(http, "Ana drinks green tea.")).status_code == 201  # 4 of 4
    assert_refused(await add_memory(http, "Ana lives in Porto."), "jobs", limit_value=4,
                   used=4, adding=1)
    # A put of what is already there queues nothing, so it passes at the limit.
    assert (await put(http, "a", "some text")).json()["change"] == "unchanged"
    # Jobs that leave the queue make room (cancelling analyze cancels the embed after it).
    for job in put_a.json()["jobs"]:
        if job["kind"] != "embed":
            r = await http.post(f"/v1/jobs/{job['id']}/cancel")
            assert r.status_code == 200, r.text
    assert used(await usage(http))["jobs"] == 1 == await queued_jobs(pool, tenant_id)
    assert (await put(http, "b", "more text")).status_code == 202


async def test_a_limit_of_another_tenant_or_kind_does_not_apply(
    api_url: str, ops: httpx.AsyncClient, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    await set_limits(ops, tenant[0], items=0, memories=5)
    async with client(api_url, tenant[1]) as a, client(api_url, other_tenant[1]) as b:
        assert_refused(await put(a, "x", "text"), "items", limit_value=0, used=0, adding=1)
        assert (await put(b, "x", "text")).status_code == 202
        assert (await add_memory(a, "Ana drinks green tea.")).status_code == 201


async def test_installation_defaults_apply_where_a_tenant_has_none(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str], operator_key: str,
) -> None:
    hosted = settings.model_copy(update={"default_limit_items": 1,
                                         "default_limit_requests_per_minute": 1000})
    async with serving(hosted) as url, client(url, tenant[1]) as a, \
            client(url, other_tenant[1]) as b, client(url, operator_key) as o:
        assert (await put(a, "one", "text")).status_code == 202
        assert_refused(await put(a, "two", "text"), "items", limit_value=1, used=1, adding=1)
        limits = await set_limits(o, tenant[0], items=5)
        assert limits["limits"]["items"] == 5 and limits["limits"]["requests_per_minute"] is None
        assert limits["effective"] == {"requests_per_minute": 1000, "items": 5,
                                       "memories": None, "bytes": None, "jobs": None}
        assert (await put(a, "two", "text")).status_code == 202
        assert (await put(b, "one", "text")).status_code == 202
        assert_refused(await put(b, "two", "text"), "items", limit_value=1, used=1, adding=1)
        assert (await usage(b))["requests_per_minute"]["limit"] == 1000


# --- requests a minute ----------------------------------------------------------------------


async def test_rate_limit_refuses_exactly_the_excess(
    api_url: str, ops: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    await set_limits(ops, tenant[0], requests_per_minute=120)
    gate = asyncio.Semaphore(16)

    async def call(c: httpx.AsyncClient) -> httpx.Response:
        async with gate:
            return await c.get("/v1/memory-types")

    async with client(api_url, tenant[1]) as a, client(api_url, other_tenant[1]) as b:
        answers = await asyncio.gather(*(call(a) for _ in range(300)))
        statuses = [r.status_code for r in answers]
        assert (statuses.count(200), statuses.count(429)) == (120, 180)
        for r in answers:
            if r.status_code == 429:
                body = r.json()
                assert body["limit"] == "requests_per_minute" and body["limit_value"] == 120
                assert body["used"] == 120 and body["adding"] == 1
                assert 1 <= int(r.headers["Retry-After"]) == body["retry_after_s"] <= 60
        # A refused write is refused before its body is read: nothing is written.
        before = await stored(pool, tenant[0])
        r = await put(a, "refused", "text")
        assert r.status_code == 429 and r.json()["limit"] == "requests_per_minute"
        assert await stored(pool, tenant[0]) == before
        # Another tenant, and an operator's key of this one, are not held back.
        other = await asyncio.gather(*(call(b) for _ in range(150)))
        assert {r.status_code for r in other} == {200}
        mine = await asyncio.gather(*(call(ops) for _ in range(20)))
        assert {r.status_code for r in mine} == {200}
        # The operator's key reads the tenant's window: full, and its own requests not in it.
        assert (await usage(ops))["requests_per_minute"] == {"limit": 120, "used": 120,
                                                             "remaining": 0}
    assert await pool.fetchval("SELECT count(*) FROM items WHERE id = 'refused'") == 0


async def test_redis_down_serves_and_warns_once(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str], operator_key: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    from memmill.embedded import start_valkey

    (tmp_path / "valkey-down").mkdir()
    valkey = start_valkey(tmp_path / "valkey-down")
    stopped = False
    try:
        private = settings.model_copy(update={"redis_url": valkey.connection_url})
        async with serving(private) as url, client(url, tenant[1]) as a, \
                client(url, operator_key) as o:
            await set_limits(o, tenant[0], requests_per_minute=3)
            statuses = [(await a.get("/v1/memory-types")).status_code for _ in range(4)]
            assert statuses == [200, 200, 200, 429]
            valkey.stop()
            stopped = True
            with caplog.at_level(logging.WARNING, logger="api.rate_limit"):
                for _ in range(5):
                    assert (await a.get("/v1/memory-types")).status_code == 200
                    await asyncio.sleep(0.3)  # past the pause after a failure, to try again
                assert (await put(a, "served", "while Redis is down")).status_code == 202
                body = await usage(a)
            assert body["requests_per_minute"] == {"limit": 3, "used": None, "remaining": None}
            warnings = [r for r in caplog.records if r.name == "api.rate_limit"]
            assert len(warnings) == 1, [r.getMessage() for r in warnings]
            assert "Redis does not answer" in warnings[0].getMessage()
    finally:
        if not stopped:
            valkey.stop()


# --- the operator's limits routes ---------------------------------------------------------


async def test_limits_routes_validate(
    ops: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    tenant_id = tenant[0]
    path = f"/v1/tenants/{tenant_id}/limits"
    empty = (await ops.get(path)).json()
    assert empty == {"tenant_id": tenant_id, "limits": dict.fromkeys(quotas.LIMITS),
                     "effective": dict.fromkeys(quotas.LIMITS), "updated_at": None}
    assert (await ops.get("/v1/tenants/999999/limits")).status_code == 404
    assert (await ops.put("/v1/tenants/999999/limits", json={"items": 1})).status_code == 404
    for bad in ({"items": -1}, {"items": "10"}, {"items": 2.5}, {"items": True},
                {"items": 2**63}, {"rows": 1}, [1]):
        r = await ops.put(path, json=bad)
        assert r.status_code == 422, (bad, r.text)
    for bad_path in ("/v1/tenants/0/limits", "/v1/tenants/abc/limits",
                     f"/v1/tenants/{2**63}/limits"):
        assert (await ops.get(bad_path)).status_code == 422, bad_path
    assert await pool.fetchval("SELECT count(*) FROM tenant_limits") == 0

    set_ = await set_limits(ops, tenant_id, items=10, bytes=0, jobs=10.0)
    assert set_["limits"] == {"requests_per_minute": None, "items": 10, "memories": None,
                              "bytes": 0, "jobs": 10}
    assert set_["updated_at"] is not None
    assert (await ops.get(path)).json() == set_
    # A PUT replaces them all: what it leaves out goes back to the default.
    assert (await set_limits(ops, tenant_id, memories=3))["limits"] == {
        "requests_per_minute": None, "items": None, "memories": 3, "bytes": None, "jobs": None}
    audit = await pool.fetch("SELECT action, target, filter FROM audit_log "
                             "WHERE action = 'tenant.limits' ORDER BY id")
    assert [(a["target"], a["filter"]["memories"]) for a in audit] == [
        (str(tenant_id), None), (str(tenant_id), 3)]


async def test_set_limits_for_the_cli(pool: asyncpg.Pool, tenant: tuple[int, str]) -> None:
    tenant_id = tenant[0]
    assert await quotas.set_limits(pool, tenant_id, items=100) == quotas.Limits(items=100)
    # Only the limits named change.
    assert await quotas.set_limits(pool, tenant_id, jobs=5, requests_per_minute=60) == \
        quotas.Limits(items=100, jobs=5, requests_per_minute=60)
    assert await quotas.set_limits(pool, tenant_id, items=None) == \
        quotas.Limits(jobs=5, requests_per_minute=60)
    with pytest.raises(BadInput, match="unknown limits"):
        await quotas.set_limits(pool, tenant_id, rows=1)
    for bad in (-1, 2**63, True, 1.5, "3"):
        with pytest.raises(BadInput, match="whole number"):
            await quotas.set_limits(pool, tenant_id, items=bad)  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        await quotas.set_limits(pool, 999999, items=1)
    with pytest.raises(QuotaExceeded) as refused:
        await quotas.check(pool, tenant_id, jobs=6)
    assert refused.value.fields == {"limit": "jobs", "limit_value": 5, "used": 0, "adding": 6,
                                    "retry_after_s": 30}
    await quotas.check(pool, tenant_id, jobs=5, items=10**9)  # items: back to no limit


# --- the maintained usage --------------------------------------------------------------------


async def test_maintained_usage_equals_a_recount(
    pool: asyncpg.Pool, tenant: tuple[int, str], other_tenant: tuple[int, str],
    http: httpx.AsyncClient,
) -> None:
    """Through puts, versions, reverts, purges, batch and upload, memories added, edited and
    deleted, events and a session deleted, a source that grows when its document is fetched,
    a tenant deleted and a TRUNCATE: usage read before a fold, and the folded table after,
    equal what a count finds."""
    a, b = tenant[0], other_tenant[0]
    for i in range(5):
        assert (await put(http, f"doc{i}", f"text number {i} " * (i + 1))).status_code == 202
    await put(http, "doc1", "changed")
    await put(http, "doc2", "text number 2 " * 3, tags={"t": "1"})
    await http.delete("/v1/items/doc1")
    await http.delete("/v1/items/doc3", params={"purge": "true"})
    await http.post("/v1/items/batch", json={"items": [{"id": f"b{i}", "content": "b" * i}
                                                       for i in range(1, 30)]})
    await http.post("/v1/items/upload", files=[("file", (f"f{i}", b"\x01" * i * 7, None))
                                               for i in range(1, 4)])
    ids = [(await add_memory(http, f"memory {i}")).json()["memory"]["id"] for i in range(4)]
    await http.patch(f"/v1/memories/{ids[0]}", json={"scope": U1, "expected_version": 1,
                                                     "content": "a much longer memory now"})
    await http.delete(f"/v1/memories/{ids[1]}", params=U1)
    await write_events(http, "s1", "one", "two", "three")
    await write_events(http, "s2", "four")
    await http.delete("/v1/sessions/s1", params=U1)
    await pool.execute("UPDATE sources SET byte_size = byte_size + 1000 WHERE tenant_id = $1 "
                       "AND item_id = 'f1'", a)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO items (tenant_id, id, content_hash) VALUES ($1, 'x', 'h')",
                           b)
    assert await pool.fetchval("SELECT count(*) FROM tenant_usage_deltas") > 0
    for tenant_id in (a, b):  # read as a check reads, unfolded deltas and all
        found = await pool.fetchrow(Q["quotas.state"], *state_args(tenant_id))
        assert dict(zip(("items", "memories", "bytes"), found["stored"][:3], strict=True)) == \
            await recount(pool, tenant_id)
    assert await pool.fetchval("SELECT fold_tenant_usage()")
    assert await pool.fetchval("SELECT count(*) FROM tenant_usage_deltas") == 0
    folded = {r["tenant_id"]: dict(r) for r in await pool.fetch("SELECT * FROM tenant_usage")}
    counted = {r["tenant_id"]: dict(r) for r in await pool.fetch(
        "SELECT * FROM tenant_usage_counted")}
    assert folded == counted and set(folded) == {a, b}

    await pool.execute("DELETE FROM tenants WHERE id = $1", b)
    await pool.fetchval("SELECT fold_tenant_usage()")
    assert [r["tenant_id"] for r in await pool.fetch("SELECT tenant_id FROM tenant_usage")] == [a]
    await pool.execute("TRUNCATE memories CASCADE")
    assert (await quotas.usage(pool, a))[1].memories == 0
    assert {r["tenant_id"]: dict(r) for r in await pool.fetch("SELECT * FROM tenant_usage")} == \
        {r["tenant_id"]: dict(r) for r in await pool.fetch("SELECT * FROM tenant_usage_counted")}


async def test_checks_fold_a_tenants_deltas_and_writers_never_wait_on_each_other(
    pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    tenant_id = tenant[0]
    # With no limit at all (a self-hosted installation), the writes' checks fold all the same,
    # so the deltas never pile up.
    for i in range(quotas.FOLD_AFTER_ROWS + 1):
        await pool.execute("INSERT INTO items (tenant_id, id, content_hash) VALUES ($1, $2, 'h')",
                           tenant_id, f"i{i}")
    await quotas.check(pool, tenant_id, items=1)
    assert await pool.fetchval("SELECT count(*) FROM tenant_usage_deltas") == 0
    assert (await quotas.usage(pool, tenant_id))[1].items == quotas.FOLD_AFTER_ROWS + 1
    # Job count deltas, as a busy ledger leaves them between the sweeper's folds (here with no
    # worker to fold them): a check of jobs folds them once there are too many to read.
    await quotas.set_limits(pool, tenant_id, jobs=10)
    await pool.execute(
        "INSERT INTO job_count_deltas (tenant_id, kind, status, n) "
        "SELECT $1, 'embed', 'queued', CASE WHEN g % 2 = 0 THEN 1 ELSE -1 END "
        "FROM generate_series(1, $2) g", tenant_id, quotas.JOB_FOLD_AFTER_ROWS + 2)
    await quotas.check(pool, tenant_id, items=1)  # adds no job: the ledger is not read
    assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") > 0
    await quotas.check(pool, tenant_id, jobs=10)
    assert await pool.fetchval("SELECT count(*) FROM job_count_deltas") == 0

    # Two writers of one tenant, both inside their transactions: neither waits for the other
    # (a lock wait would fail at once), and a fold meanwhile neither waits nor loses them.
    first, second = await pool.acquire(), await pool.acquire()
    try:
        t1, t2 = first.transaction(), second.transaction()
        await t1.start()
        await t2.start()
        for conn, item_id in ((first, "w1"), (second, "w2")):
            await conn.execute("SET LOCAL lock_timeout = '50ms'")
            await conn.execute("INSERT INTO items (tenant_id, id, content_hash) "
                               "VALUES ($1, $2, 'h')", tenant_id, item_id)
            await conn.execute("INSERT INTO sources (tenant_id, item_id, version, byte_size) "
                               "VALUES ($1, $2, 1, 10)", tenant_id, item_id)
        assert await pool.fetchval("SELECT fold_tenant_usage()")
        await t1.commit()
        await t2.commit()
    finally:
        await pool.release(first)
        await pool.release(second)
    assert (await quotas.usage(pool, tenant_id))[1].items == quotas.FOLD_AFTER_ROWS + 3
    assert (await quotas.usage(pool, tenant_id))[1].bytes == 20


async def test_a_check_reads_neither_items_nor_jobs(
    pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """A tenant of 5,000 items and 20,000 jobs: the statements of a check read the folded
    rows and the tenant's deltas through their indexes, never the items or the ledger."""
    tenant_id = tenant[0]
    await pool.execute(
        "INSERT INTO items (tenant_id, id, content_hash) "
        "SELECT $1, 'i' || g, 'h' FROM generate_series(1, 5000) g", tenant_id)
    await pool.execute(
        "INSERT INTO jobs (tenant_id, kind, status, max_attempts) "
        "SELECT $1, 'embed', CASE WHEN g % 4 = 0 THEN 'queued' ELSE 'done' END, 5 "
        "FROM generate_series(1, 20000) g", tenant_id)
    await pool.execute("SELECT fold_job_aggregates(), fold_tenant_usage()")
    await pool.execute("ANALYZE")
    found = (await quotas.usage(pool, tenant_id))[1]
    assert (found.items, found.jobs) == (5000, 5000)
    plan = await pool.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {Q['quotas.state']}",
                               *state_args(tenant_id))
    read = {n.get("Relation Name") for n in plan_nodes(plan)} - {None}
    assert read == {"tenant_limits", "tenant_usage", "tenant_usage_deltas", "job_counts",
                    "job_count_deltas"}, read
    # With no limit that applies (here: nothing added), only the limits are read.
    plan = await pool.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {Q['quotas.state']}",
                               *state_args(tenant_id, everything=False))
    ran = {n.get("Relation Name") for n in plan_nodes(plan) if n["Actual Loops"]} - {None}
    assert ran == {"tenant_limits", "tenant_usage_deltas"}, ran  # the deltas: to count them
    await quotas.set_limits(pool, tenant_id, jobs=5000)
    with pytest.raises(QuotaExceeded):
        await quotas.check(pool, tenant_id, jobs=1)
