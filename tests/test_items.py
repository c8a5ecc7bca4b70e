"""Versions and idempotence of puts, and what a duplicate delivery of a job does."""

from __future__ import annotations

import asyncpg
import httpx

from pipeline.queue_codec import ARQ_CODEC
from pipeline.settings import Settings
from tests.conftest import drain


async def _put(http: httpx.AsyncClient, **body: object) -> dict:
    r = await http.post("/v1/items", json=body)
    assert r.status_code == 202, r.text
    return r.json()


async def test_versions_follow_content_and_tags(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        first = await _put(http, id="doc", content="Tides follow the moon.", tags={"a": "1"})
        await drain(settings, pool)

        same = await _put(http, id="doc", content="Tides follow the moon.", tags={"a": "1"})
        assert same["change"] == "unchanged" and same["jobs"] == []
        assert same["item"]["version"] == 1

        retagged = await _put(http, id="doc", content="Tides follow the moon.", tags={"a": "2"})
        assert retagged["change"] == "metadata" and retagged["jobs"] == []
        assert retagged["item"]["version"] == 2 and retagged["item"]["status"] == "ready"

        changed = await _put(http, id="doc", content="Tides follow the moon and the sun.")
        assert changed["change"] == "content" and len(changed["jobs"]) == 3
        assert changed["item"]["version"] == 3 and changed["item"]["status"] == "pending"
        await drain(settings, pool)

        item = (await http.get("/v1/items/doc")).json()
    assert item["status"] == "ready" and item["summary"] == "Tides follow the moon and the sun."
    assert item["tags"] == {}
    archived = await pool.fetch("SELECT version, tags FROM item_versions ORDER BY version")
    assert [(r["version"], r["tags"]) for r in archived] == [(1, {"a": "1"}), (2, {"a": "2"})]
    parts = await pool.fetch("SELECT version, text, embedding IS NOT NULL AS e FROM parts")
    assert [(r["version"], r["text"], r["e"]) for r in parts] == [
        (3, "Tides follow the moon and the sun.", True)]
    assert first["item"]["version"] == 1


async def test_identical_content_is_embedded_once(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        for n in range(3):
            await _put(http, id=f"copy-{n}", content="The same sentence in three items.")
        await drain(settings, pool)
    assert await pool.fetchval("SELECT count(*) FROM embedding_cache") == 1
    assert await pool.fetchval("SELECT count(*) FROM parts WHERE embedding IS NOT NULL") == 3


async def test_a_job_delivered_twice_has_one_effect(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """Two deliveries of the same analyze job at the same moment: one claims it, the other
    finds nothing to claim; the parts exist once."""
    from arq import create_pool
    from arq.connections import RedisSettings

    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        body = await _put(http, id="twice", content="Once is enough.\n\nReally, once.")
    analyze = next(j for j in body["jobs"] if j["kind"] == "analyze")
    queue = await create_pool(RedisSettings.from_dsn(settings.redis_url), **ARQ_CODEC)
    try:
        # A second copy of the same job under another queue id, as a lost-and-found re-enqueue
        # racing the original would produce.
        await queue.enqueue_job("analyze", analyze["id"], _job_id=f"{analyze['id']}:dup",
                                _queue_name=settings.queue_name)
    finally:
        await queue.aclose()
    await drain(settings, pool)
    outcomes = await pool.fetch(
        "SELECT outcome FROM job_attempts WHERE job_id = $1", analyze["id"])
    assert [r["outcome"] for r in outcomes] == ["done"]
    assert await pool.fetchval("SELECT count(*) FROM parts WHERE item_id = 'twice'") == 1
    assert await pool.fetchval("SELECT status FROM items WHERE id = 'twice'") == "ready"
