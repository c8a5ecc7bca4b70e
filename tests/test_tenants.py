"""Tenant isolation, tested rather than assumed: one tenant's items, jobs, search results and
embeddings are invisible to another, and the same item id means two separate items."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from pipeline import reindex, tenants
from pipeline.db import Q
from pipeline.settings import Settings
from tests.conftest import drain

ITEM_ID = "notes/shared-id"
A_TEXT = (
    "Quokkas on Rottnest Island juggle marmalade jars beneath the aurora while a bassoon "
    "quartet tunes up. The marmalade is bitter Seville orange, boiled twice."
)
B_TEXT = (
    "Glaciers in Patagonia calve icebergs into turquoise lakes. Hikers cross the moraine "
    "with crampons and watch condors circle over the granite spires."
)
MODES = ("hybrid", "fts", "semantic")


def client(api_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


@pytest.fixture
async def clients(
    api_url: str, tenant: tuple[int, str], other_tenant: tuple[int, str]
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    assert tenant[0] != other_tenant[0]
    async with client(api_url, tenant[1]) as a, client(api_url, other_tenant[1]) as b:
        yield a, b


async def put(http: httpx.AsyncClient, item_id: str, text: str, **extra: Any) -> dict[str, Any]:
    r = await http.post("/v1/items", json={"id": item_id, "content": text, **extra})
    assert r.status_code == 202, r.text
    return r.json()


async def search(http: httpx.AsyncClient, query: str, mode: str) -> list[dict[str, Any]]:
    r = await http.post("/v1/search", json={"query": query, "mode": mode})
    assert r.status_code == 200, r.text
    return r.json()["results"]


async def item_rows(pool: asyncpg.Pool, tenant_id: int) -> dict[str, Any]:
    """Everything stored for one tenant, to check that another tenant's writes left it alone."""
    out: dict[str, Any] = {}
    for table, order in (
        ("items", "id"),
        ("item_versions", "item_id, version"),
        ("sources", "item_id, version"),
        ("parts", "id"),
        ("jobs", "id"),
        ("embedding_cache", "content_hash"),
    ):
        rows = await pool.fetch(
            f"SELECT * FROM {table} WHERE tenant_id = $1 ORDER BY {order}", tenant_id
        )
        out[table] = [dict(r) for r in rows]
    return out


async def test_one_tenant_cannot_see_or_touch_anothers_item(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
    settings: Settings,
    pool: asyncpg.Pool,
    tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    a, b = clients
    put_a = await put(a, ITEM_ID, A_TEXT, title="Quokka notes", tags={"owner": "a"})
    a_job_ids = [j["id"] for j in put_a["jobs"]]
    assert len(a_job_ids) == 3
    await drain(settings, pool)

    a_item = (await a.get(f"/v1/items/{ITEM_ID}")).json()
    assert a_item["status"] == "ready" and a_item["version"] == 1
    assert "marmalade" in a_item["summary"]
    # A's own searches find the item in every mode, so an empty result for B means something.
    for mode in MODES:
        assert [r["item"]["id"] for r in await search(a, A_TEXT, mode)] == [ITEM_ID], mode
    a_before = await item_rows(pool, tenant[0])
    assert a_before["parts"] and all(p["embedding"] is not None for p in a_before["parts"])

    # B sees nothing of A's: not the item, not its jobs, not a search result.
    r = await b.get(f"/v1/items/{ITEM_ID}")
    assert r.status_code == 404, r.text
    assert ITEM_ID in r.json()["detail"]
    for job_id in a_job_ids:
        r = await b.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 404, r.text
        assert (await a.get(f"/v1/jobs/{job_id}")).status_code == 200
    for mode in MODES:
        assert await search(b, A_TEXT, mode) == [], mode
        assert await search(b, "marmalade quokkas", mode) == [], mode

    # The same id under B is B's own new item, and A's item is left exactly as it was.
    put_b = await put(b, ITEM_ID, B_TEXT, tags={"owner": "b"})
    assert put_b["change"] == "created"
    assert put_b["item"]["version"] == 1 and put_b["item"]["status"] == "pending"
    assert put_b["item"]["tags"] == {"owner": "b"} and put_b["item"]["title"] is None
    assert {j["kind"] for j in put_b["jobs"]} == {"analyze", "summarize", "embed"}
    assert not {j["id"] for j in put_b["jobs"]} & set(a_job_ids)
    await drain(settings, pool)

    b_item = (await b.get(f"/v1/items/{ITEM_ID}")).json()
    assert b_item["status"] == "ready" and b_item["version"] == 1
    assert "Glaciers" in b_item["summary"] and "marmalade" not in b_item["summary"]
    assert {j["id"] for j in b_item["jobs"]} == {j["id"] for j in put_b["jobs"]}

    a_after = (await a.get(f"/v1/items/{ITEM_ID}")).json()
    assert a_after == {
        **a_item,
        "accessed_at": a_after["accessed_at"],
        "access_count": a_after["access_count"],
    }
    assert {j["id"] for j in a_after["jobs"]} == set(a_job_ids)
    a_rows = await item_rows(pool, tenant[0])
    for row in a_rows["items"] + a_before["items"]:  # A's own searches count as accesses
        del row["accessed_at"], row["access_count"]
    assert a_rows == a_before
    assert await pool.fetchval("SELECT count(*) FROM item_versions") == 0

    # Now both have an item with that id; whatever each searches for, it gets only its own.
    for mode in MODES:
        for query in (A_TEXT, B_TEXT):
            for http, own, other in ((a, "marmalade", "Glaciers"), (b, "Glaciers", "marmalade")):
                hits = await search(http, query, mode)
                assert [r["item"]["id"] for r in hits] in ([], [ITEM_ID]), mode
                assert all(own in r["text"] and other not in r["text"] for r in hits), mode
        assert len(await search(a, A_TEXT, mode)) == len(await search(b, B_TEXT, mode)) == 1
    assert await search(a, "glaciers icebergs moraine", "fts") == []
    assert await search(b, "marmalade quokkas", "fts") == []

    # B's writes carry B's tenant id, and B's parts are B's text.
    b_rows = await item_rows(pool, other_tenant[0])
    assert [r["id"] for r in b_rows["items"]] == [ITEM_ID]
    assert [s["content"] for s in b_rows["sources"]] == [B_TEXT]
    assert b_rows["parts"] and all("Glaciers" in p["text"] for p in b_rows["parts"])


async def test_the_same_content_is_embedded_separately_per_tenant(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
    settings: Settings,
    pool: asyncpg.Pool,
    tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    a, b = clients
    await put(a, "a/one", A_TEXT)
    await drain(settings, pool)
    await put(b, "b/one", A_TEXT)  # the same text, after A's vectors are already cached
    await drain(settings, pool)

    cache = await pool.fetch(
        "SELECT tenant_id, model, content_hash, embedding FROM embedding_cache "
        "ORDER BY tenant_id, content_hash"
    )
    by_tenant: dict[int, dict[str, Any]] = {}
    for row in cache:
        assert row["model"] == reindex.model_key(settings)
        by_tenant.setdefault(row["tenant_id"], {})[row["content_hash"]] = row["embedding"]
    assert set(by_tenant) == {tenant[0], other_tenant[0]}
    part_hashes = {
        t: set(
            await pool.fetchval("SELECT array_agg(content_hash) FROM parts WHERE tenant_id = $1", t)
        )
        for t in by_tenant
    }
    # Each tenant has its own cache rows, one per distinct part, for the same content.
    assert set(by_tenant[tenant[0]]) == part_hashes[tenant[0]]
    assert set(by_tenant[other_tenant[0]]) == part_hashes[other_tenant[0]]
    assert set(by_tenant[tenant[0]]) == set(by_tenant[other_tenant[0]])
    assert len(cache) == 2 * len(by_tenant[tenant[0]])
    # Both tenants' parts are embedded, and a second tenant's copy did not borrow A's row.
    assert await pool.fetchval("SELECT count(*) FROM parts WHERE embedding IS NULL") == 0
    for t in by_tenant:
        assert await pool.fetchval(
            "SELECT count(*) FROM parts p JOIN embedding_cache c USING (tenant_id, content_hash) "
            "WHERE p.tenant_id = $1",
            t,
        ) == len(part_hashes[t])


async def test_job_stats_show_a_tenant_its_own_numbers_and_an_operator_the_rest(
    api_url: str,
    settings: Settings,
    pool: asyncpg.Pool,
    tenant: tuple[int, str],
    other_tenant: tuple[int, str],
) -> None:
    operator_key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], operator_key, name="ops", role="operator")
    # A live worker, written as its heartbeat writes it.
    await pool.execute(Q["workers.heartbeat"], "stats-host:4242:abcdef", "stats-host", 4242,
                       settings.queue_name)
    async with client(api_url, tenant[1]) as a, client(api_url, other_tenant[1]) as b, \
            client(api_url, operator_key) as op:
        await put(a, "mine", A_TEXT)
        for n in range(2):
            await put(b, f"theirs/{n}", f"{B_TEXT} Day {n}.")
        mine, theirs, ops = [(await http.get("/v1/jobs/stats")).json() for http in (a, b, op)]
        schema = (await a.get("/openapi.json")).json()["components"]["schemas"]["JobStats"]

    # Each tenant counts its own jobs only: analyze and summarize due, embed waiting on analyze.
    assert mine["by_status"] == {"queued": 2, "waiting": 1}
    assert mine["by_kind"] == {"analyze": {"queued": 1}, "summarize": {"queued": 1},
                               "embed": {"waiting": 1}}
    assert (mine["due"], theirs["due"]) == (2, 4)
    assert theirs["by_status"] == {"queued": 4, "waiting": 2}
    assert mine["oldest_queued_age_s"] is not None and mine["workers_alive"] == 1
    # Nothing about the installation: no workers, hosts or pids, no depth of the whole queue.
    for figures in (mine, theirs):
        assert figures["queue_depth"] is None and figures["workers"] is None
        assert "stats-host" not in json.dumps(figures)

    # An operator's key sees its own tenant's numbers, and the rest.
    assert {k: ops[k] for k in ("by_status", "by_kind", "due")} == \
        {k: mine[k] for k in ("by_status", "by_kind", "due")}
    assert ops["queue_depth"] == 6  # every tenant's deliveries: 2 of A's, 4 of B's
    assert [(w["id"], w["hostname"], w["pid"]) for w in ops["workers"]] == [
        ("stats-host:4242:abcdef", "stats-host", 4242)]
    assert ops["workers"][0]["last_seen_at"]
    # The document says which fields only an operator gets.
    for field in ("queue_depth", "workers"):
        assert "operator keys only" in schema["properties"][field]["description"]
