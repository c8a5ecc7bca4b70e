"""Parts carry their item's tags (migration 0008): kept in step by triggers, keyed by tenant,
counted in tag statistics, and used by a tag filter to pick how it searches."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from pipeline import search as search_module
from pipeline import text_stats
from pipeline.db import MIGRATIONS_DIR, Q, create_pool, migrate, migration_files
from pipeline.providers.embeddings import QueryCache, get_embedder
from pipeline.search import SearchFilters, SearchParams, tags_predicate
from pipeline.settings import Settings
from tests.conftest import drain, plan_nodes


@pytest.fixture
async def client(api_url: str, tenant: tuple[int, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        yield http


async def put(http: httpx.AsyncClient, item_id: str, content: str, tags: dict[str, str]) -> None:
    r = await http.post("/v1/items", json={"id": item_id, "content": content, "tags": tags})
    assert r.status_code == 202, r.text


async def part_tags(pool: asyncpg.Pool, tenant_id: int, item_id: str) -> list[Any]:
    return [r["tenant_tags"] for r in await pool.fetch(
        "SELECT tenant_tags FROM parts WHERE tenant_id = $1 AND item_id = $2 ORDER BY position",
        tenant_id, item_id)]


async def test_parts_carry_their_items_tags_through_every_change(
    client: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str], settings: Settings
) -> None:
    """Written parts take the item's tags, a change of tags alone
    passes to the parts it keeps, and so does a revert to the previous version."""
    tenant_id = tenant[0]
    long_text = " ".join(f"Tide table entry {n} for the northern harbour." for n in range(400))
    await put(client, "log", long_text, {"team": "sea"})
    await drain(settings, pool)

    async def item_tags() -> dict[str, str]:
        return await pool.fetchval("SELECT tags FROM items WHERE tenant_id = $1 AND id = 'log'",
                                   tenant_id)

    first = await item_tags()
    assert first == {"team": "sea"}
    tags = await part_tags(pool, tenant_id, "log")
    assert len(tags) > 1 and tags == [{str(tenant_id): first}] * len(tags)
    ids = await pool.fetch("SELECT id FROM parts WHERE tenant_id = $1", tenant_id)

    await put(client, "log", long_text, {"team": "land"})  # same text: a new version, same parts
    await drain(settings, pool)
    second = await item_tags()
    assert second["team"] == "land"
    assert await pool.fetch("SELECT id FROM parts WHERE tenant_id = $1", tenant_id) == ids
    assert await part_tags(pool, tenant_id, "log") == [{str(tenant_id): second}] * len(tags)

    r = await client.delete("/v1/items/log")  # back to the first version's tags
    assert r.status_code == 200 and r.json()["outcome"] == "reverted", r.text
    assert await part_tags(pool, tenant_id, "log") == [{str(tenant_id): first}] * len(tags)


async def test_a_tag_filter_finds_only_its_tenants_parts(
    api_url: str, client: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str],
    other_tenant: tuple[int, str], settings: Settings
) -> None:
    """Two tenants store the same text under the same tag: the tags index keys each tenant's
    parts apart, and a tag filter, down either path, returns the searching tenant's alone."""
    async with httpx.AsyncClient(base_url=api_url, timeout=60, headers={
            "Authorization": f"Bearer {other_tenant[1]}"}) as other:
        for http in (client, other):
            for n in range(3):
                await put(http, f"d{n}", f"Harbour crane {n} lifts steel beams.", {"site": "dock"})
    await drain(settings, pool)
    for tenant_id, _ in (tenant, other_tenant):
        predicate = tags_predicate({"site": "dock"}, tenant_id)
        rows = await pool.fetch("SELECT DISTINCT tenant_id FROM parts WHERE tenant_tags @@ $1",
                                predicate)
        assert [r["tenant_id"] for r in rows] == [tenant_id]
    mine = {r["id"] for r in await pool.fetch("SELECT id FROM parts WHERE tenant_id = $1",
                                              tenant[0])}
    for exact_parts in (2000, 0):
        settings.search_exact_parts = exact_parts  # the app holds this very object
        for mode in ("hybrid", "fts", "semantic"):
            r = await client.post("/v1/search", json={
                "query": "harbour crane steel", "mode": mode, "track": False,
                "filters": {"tags": {"site": "dock"}}})
            assert r.status_code == 200, r.text
            found = {h["part_id"] for h in r.json()["results"]}
            assert found == mine, (exact_parts, mode)


@pytest.fixture
async def harbour(client: httpx.AsyncClient, pool: asyncpg.Pool, tenant: tuple[int, str],
                  settings: Settings) -> AsyncIterator[int]:
    """Twelve one-part items: six on the dock, four in the yard, two at sea; words counted."""
    places = ["dock"] * 6 + ["yard"] * 4 + ["sea"] * 2
    for n, place in enumerate(places):
        await put(client, f"h{n}", f"Harbour note {n}: cranes, ropes and tides at the {place}.",
                  {"place": place})
    await drain(settings, pool)
    await text_stats.refresh(pool, tenant[0])
    yield tenant[0]


async def run(pool: asyncpg.Pool, settings: Settings, tenant_id: int, tags: dict[str, Any],
              **overrides: int) -> search_module.SearchOutcome:
    """The search function with a generic-plan pool, as the API runs it."""
    search_pool = await create_pool(pool_dsn(settings), max_size=1, generic_plans=True)
    try:
        return await search_module.search(
            search_pool, QueryCache(get_embedder(settings)),
            settings.model_copy(update=overrides), tenant_id=tenant_id,
            params=SearchParams(query="cranes and ropes", mode="semantic", limit=100,
                                filters=SearchFilters(tags=tags)),
            filter_pool=pool)
    finally:
        await search_pool.close()


def pool_dsn(settings: Settings) -> str:
    assert settings.database_url
    return settings.database_url


async def test_a_tag_filter_ranks_its_parts_exactly_while_few_pass(
    harbour: int, pool: asyncpg.Pool, settings: Settings
) -> None:
    """Exact up to max(MEMMILL_SEARCH_EXACT_PARTS, 16·√parts) passing parts by the tag
    statistics and by the parts read; past the bound either way, or with the setting at 0,
    the HNSW scan checks each candidate's tags. Both ways return the same parts."""
    tenant_id = harbour
    dock = {"place": "dock"}
    paths = {}
    # 12 parts counted: 16·√12 = 55, so the setting decides only above that.
    paths["bound from the tenant's size"] = await run(pool, settings, tenant_id, dock,
                                                      search_exact_parts=1)
    paths["setting 0"] = await run(pool, settings, tenant_id, dock, search_exact_parts=0)
    await pool.execute("UPDATE text_stats SET parts = 0 WHERE tenant_id = $1", tenant_id)
    paths["6 parts, bound 6"] = await run(pool, settings, tenant_id, dock, search_exact_parts=6)
    paths["6 parts, bound 5"] = await run(pool, settings, tenant_id, dock, search_exact_parts=5)
    paths["any of 10, bound 9"] = await run(pool, settings, tenant_id,
                                            {"place": ["dock", "yard"]}, search_exact_parts=9)
    # Statistics that have not seen the tag yet say 0: the parts read past the bound decide.
    await pool.execute("DELETE FROM tag_stats WHERE tenant_id = $1", tenant_id)
    paths["no statistics, bound 5"] = await run(pool, settings, tenant_id, dock,
                                                search_exact_parts=5)
    paths["no statistics, bound 6"] = await run(pool, settings, tenant_id, dock,
                                                search_exact_parts=6)
    assert {name: o.filter_path for name, o in paths.items()} == {
        "bound from the tenant's size": "exact", "setting 0": "checked",
        "6 parts, bound 6": "exact", "6 parts, bound 5": "checked",
        "any of 10, bound 9": "checked",
        "no statistics, bound 5": "checked", "no statistics, bound 6": "exact"}
    dock_parts = {r["id"] for r in await pool.fetch(
        "SELECT p.id FROM parts p JOIN items i ON i.tenant_id = p.tenant_id AND i.id = p.item_id"
        " WHERE p.tenant_id = $1 AND i.tags ->> 'place' = 'dock'", tenant_id)}
    for name, outcome in paths.items():
        found = {r["part_id"] for r in outcome.results}
        assert found == dock_parts or name == "any of 10, bound 9", name
    nobody = await run(pool, settings, tenant_id, {"place": "moon"})
    assert nobody.results == [] and nobody.filter_path is None


async def test_tag_statistics_follow_retags_and_deletions(
    harbour: int, client: httpx.AsyncClient, pool: asyncpg.Pool, settings: Settings
) -> None:
    """tag_stats counts the parts of each tag; a retag or a deletion marks the tenant for a
    recount, which brings the counts up to date."""
    tenant_id = harbour

    async def counts() -> dict[tuple[str, str], int]:
        rows = await pool.fetch("SELECT key, value, parts FROM tag_stats WHERE tenant_id = $1"
                                " AND key NOT LIKE '\\_%'", tenant_id)
        return {(r["key"], r["value"]): r["parts"] for r in rows}

    async def stale() -> bool:
        # Due at once: no wait after the last recount, whatever it took.
        await pool.execute("UPDATE text_stats SET refresh_s = 0 WHERE tenant_id = $1", tenant_id)
        return tenant_id in [r["id"] for r in await pool.fetch(Q["text_stats.stale_tenants"], 0)]

    assert await counts() == {("place", "dock"): 6, ("place", "yard"): 4, ("place", "sea"): 2}
    assert await pool.fetchval("SELECT search_tag_estimate($1, $2)", tenant_id,
                               {"place": ["dock", "sea", "moon"]}) == 8
    assert await pool.fetchval("SELECT search_tag_estimate($1, $2)", tenant_id,
                               {"place": ["dock"], "crew": ["a"]}) == 0
    assert not await stale()
    text = "Harbour note 0: cranes, ropes and tides at the dock."
    await put(client, "h0", text, {"place": "sea"})  # a change of tags alone
    await drain(settings, pool)
    assert await stale()
    await text_stats.refresh(pool, tenant_id)
    assert not await stale()
    assert await counts() == {("place", "dock"): 5, ("place", "yard"): 4, ("place", "sea"): 3}
    r = await client.delete("/v1/items/h1", params={"purge": "true"})
    assert r.status_code == 200, r.text
    assert await stale()
    await text_stats.refresh(pool, tenant_id)
    assert not await stale()
    assert await counts() == {("place", "dock"): 4, ("place", "yard"): 4, ("place", "sea"): 3}


async def test_the_migration_gives_stored_parts_their_tags(
    pg_admin_dsn: str, tmp_path: Path
) -> None:
    """A database with parts from before migration 0008 gets them tagged, keyed by tenant,
    with the vector index rebuilt, and later writes keep them in step."""
    name = f"t_tags_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    dsn = pg_admin_dsn.replace("/postgres?", f"/{name}?")
    try:
        before = tmp_path / "before"
        before.mkdir()
        for path in migration_files():
            if path.name < "0008":
                shutil.copy(path, before / path.name)
        await migrate(dsn, directory=before)
        conn = await asyncpg.connect(dsn)
        try:
            tenant_id = await conn.fetchval("INSERT INTO tenants (name) VALUES ('t') RETURNING id")
            await conn.execute(
                "INSERT INTO items (tenant_id, id, tags, content_hash) VALUES"
                " ($1, 'a', '{\"team\": \"sea\"}', 'x'), ($1, 'b', '{}', 'y')", tenant_id)
            vector = "[" + ",".join(["0.05"] * 384) + "]"
            await conn.execute(
                "INSERT INTO parts (tenant_id, item_id, version, position, text, content_hash,"
                " embedding) SELECT $1, i, 1, n, 'text ' || n, 'h', $2::vector"
                " FROM unnest(ARRAY['a', 'a', 'b']) WITH ORDINALITY u (i, n)",
                tenant_id, vector)
            assert await migrate(dsn, directory=MIGRATIONS_DIR) == [
                p.name for p in migration_files() if p.name >= "0008"]
            rows = await conn.fetch("SELECT item_id, tenant_tags::text FROM parts ORDER BY id")
            assert [tuple(r) for r in rows] == [
                ("a", f'{{"{tenant_id}": {{"team": "sea"}}}}'),
                ("a", f'{{"{tenant_id}": {{"team": "sea"}}}}'), ("b", f'{{"{tenant_id}": {{}}}}')]
            indexes = {r["indexname"] for r in await conn.fetch(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'parts'")}
            assert {"parts_embedding", "parts_tenant_tags"} <= indexes
            await conn.execute("UPDATE items SET tags = '{\"team\": \"land\"}' WHERE id = 'b'")
            assert await conn.fetchval(
                "SELECT tenant_tags -> $1::text FROM parts WHERE item_id = 'b'",
                str(tenant_id)) == '{"team": "land"}'
        finally:
            await conn.close()
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


def test_settings_refuse_a_negative_exact_parts_bound() -> None:
    with pytest.raises(ValueError, match="search_exact_parts"):
        Settings(search_exact_parts=-1)


def test_tag_predicates_under_a_tenant_key_quote_everything() -> None:
    assert tags_predicate({"team": ["a", 'b"'], "x y": "1"}, 42) == (
        '($."42"."team" == "a" || $."42"."team" == "b\\"") && $."42"."x y" == "1"')


def _joins_of_two_relations(plan: Any) -> list[str]:
    """The nested loops of a plan whose inner side is not a function call (a LATERAL
    jsonb_each_text has no way to be joined but a nested loop)."""
    return [n["Node Type"] for n in plan_nodes(plan) if n["Node Type"] == "Nested Loop"
            and not any(c["Node Type"] in ("Function Scan", "Memoize")
                        for c in n.get("Plans", []))]


async def test_recounts_never_join_by_nested_loop_in_a_plan_made_while_the_tenant_was_small(
    pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """Planned from statistics of a small tenant (the sweeper recounts as soon as a bulk load
    commits, before ANALYZE has counted it), a recount joined the items with their part counts
    by a nested loop, which took 15 minutes once the tenant held 100k parts (see
    text_stats.RECOUNT_SETTINGS). Here the generic plans are made on an empty tenant: without
    the recount's settings that is a nested loop, with them a hash join."""
    tenant_id = tenant[0]
    await pool.execute("ANALYZE items; ANALYZE parts; ANALYZE lexeme_stats; ANALYZE tag_stats")

    async def nested_loops(name: str, settings: str | None) -> list[str]:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            if settings:
                await conn.execute(settings)
            await conn.execute(f"PREPARE recount (bigint) AS {Q[name]}")
            try:
                plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE recount ({tenant_id})")
            finally:
                await conn.execute("DEALLOCATE recount")
        return _joins_of_two_relations(plan if isinstance(plan, list) else json.loads(plan))

    assert await nested_loops("text_stats.refresh_tags", None)  # the hazard, as it was
    for name in ("text_stats.refresh_lexemes", "text_stats.refresh_tags",
                 "text_stats.record_refresh"):
        assert await nested_loops(name, text_stats.RECOUNT_SETTINGS) == [], name
