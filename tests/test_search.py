"""Search: the ranking arithmetic from a table of cases, BM25 full text, filters against
exact filtering on real data, grouping, access tracking and tenant isolation, all through the
real API and a real worker."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import numpy as np
import pytest
import uvicorn

from pipeline import search as search_module
from pipeline import tenants, text_stats
from pipeline.db import Q, create_pool
from pipeline.providers.embeddings import QueryCache, get_embedder
from pipeline.search import (
    FILTER_CHECKED,
    FILTER_LISTED,
    SearchFilters,
    SearchParams,
    filtered_items,
    fts_postings,
    tags_predicate,
)
from pipeline.settings import Settings
from tests.conftest import TEMPLATE, drain, free_port, plan_nodes

# --- The ranking arithmetic (migration 0005's SQL functions), from tables of cases.

ALPHA, K = 0.7, 60.0
FUSED_CASES: list[tuple[str, tuple[Any, ...], float]] = [
    # name, (fusion, alpha, k, vec, vec_max, vec_rank, vec_n, fts, fts_max, fts_rank, fts_n)
    ("score: best on both sides", ("score", ALPHA, K, 0.8, 0.8, 1, 50, 12.0, 12.0, 1, 40), 1.0),
    ("score: each side over its best",
     ("score", ALPHA, K, 0.4, 0.8, 9, 50, 3.0, 12.0, 20, 40), 0.7 * 0.5 + 0.3 * 0.25),
    ("score: no full-text match adds 0",
     ("score", ALPHA, K, 0.8, 0.8, 1, 50, None, 12.0, None, 40), 0.7),
    ("score: no vector adds 0",
     ("score", ALPHA, K, None, 0.8, None, 50, 12.0, 12.0, 1, 40), 0.3),
    ("score: a negative cosine counts 0",
     ("score", ALPHA, K, -0.2, 0.8, 50, 50, 6.0, 12.0, 2, 40), 0.3 * 0.5),
    ("score: no full text at all (semantic)",
     ("score", 1.0, K, 0.6, 0.8, 3, 50, None, None, None, 0), 0.75),
    ("rrf: first on both sides", ("rrf", ALPHA, K, 0.8, 0.8, 1, 50, 9.0, 9.0, 1, 40), 1.0),
    ("rrf: missing from full text takes its list's length + 1",
     ("rrf", ALPHA, K, 0.8, 0.8, 1, 50, None, 9.0, None, 40),
     61 * (0.7 / 61 + 0.3 / (60 + 41))),
    ("rrf: missing from vectors", ("rrf", 0.5, 10.0, None, None, None, 0, 9.0, 9.0, 3, 5),
     11 * (0.5 / 11 + 0.5 / 13)),
]


@pytest.mark.parametrize(("name", "args", "expected"), FUSED_CASES,
                         ids=[c[0] for c in FUSED_CASES])
async def test_search_fused(world: World, name: str, args: tuple[Any, ...],
                            expected: float) -> None:
    got = await world.pool.fetchval(
        "SELECT search_fused($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)", *args)
    assert got == pytest.approx(expected), name
    assert 0.0 <= got <= 1.0


FINAL_CASES: list[tuple[str, tuple[float, float, float, float, int], float]] = [
    # name, (fused, blend, age_days, half_life_days, access_count)
    ("no blend: relevance alone", (0.8, 0.0, 400.0, 30.0, 99), 0.8),
    ("fresh and unused", (0.8, 0.1, 0.0, 30.0, 0), 0.9 * 0.8 + 0.1 * 0.5),
    ("one half-life old", (0.8, 0.1, 30.0, 30.0, 0), 0.9 * 0.8 + 0.1 * 0.25),
    ("a future timestamp counts as fresh", (0.8, 0.1, -5.0, 30.0, 0), 0.9 * 0.8 + 0.1 * 0.5),
    ("used ten times", (0.5, 0.2, 0.0, 30.0, 10),
     0.8 * 0.5 + 0.2 * (0.5 + 0.5 * (1 - math.exp(-1)))),
    ("blend 1: signals alone", (0.0, 1.0, 0.0, 30.0, 0), 0.5),
]


@pytest.mark.parametrize(("name", "args", "expected"), FINAL_CASES,
                         ids=[c[0] for c in FINAL_CASES])
async def test_search_final(world: World, name: str,
                            args: tuple[float, float, float, float, int],
                            expected: float) -> None:
    got = await world.pool.fetchval("SELECT search_final($1, $2, $3, $4, $5)", *args)
    assert got == pytest.approx(expected), name


async def test_a_near_tie_in_relevance_is_broken_by_use_but_a_clear_lead_is_not(
    world: World,
) -> None:
    """The default blend (0.1) lets recency and use break near ties, never reorder clear
    relevance: at 0.3 a few accesses had outranked several places of relevance."""
    async def final(fused: float, uses: int) -> float:
        return await world.pool.fetchval("SELECT search_final($1, 0.1, 0, 30, $2)", fused,
                                         uses)

    assert await final(0.80, 5) > await final(0.81, 0)
    assert await final(0.90, 0) > await final(0.80, 1000)


TAG_PREDICATES = [
    ({"lang": ["en"]}, '$."lang" == "en"'),
    ({"lang": ["en", "fr"], "team": ["core"]},
     '($."lang" == "en" || $."lang" == "fr") && $."team" == "core"'),
    ({'a"b': ['x" || $.c == "y']}, r'$."a\"b" == "x\" || $.c == \"y"'),
    ({"back\\slash": ["é\n"]}, '$."back\\\\slash" == "é\\n"'),
]


@pytest.mark.parametrize(("tags", "predicate"), TAG_PREDICATES)
async def test_tag_filters_become_a_jsonpath_that_quotes_everything(
    world: World, tags: dict[str, list[str]], predicate: str
) -> None:
    pool = world.pool
    assert tags_predicate(tags) == predicate
    # Postgres reads it, and a tag map with exactly those values passes it.
    sample = {key: values[-1] for key, values in tags.items()}
    assert await pool.fetchval("SELECT $1::jsonb @@ $2::jsonpath", sample, predicate)
    assert not await pool.fetchval("SELECT $1::jsonb @@ $2::jsonpath", {}, predicate)


POSTINGS_CASES: list[tuple[str, dict[str, Any], int]] = [
    # name, search params, postings the full-text side may read (of 1000, 5 per result)
    ("full text alone reads the whole budget", {"mode": "fts"}, 1000),
    ("a hybrid page of 10 parts reads 5 per result", {}, 50),
    ("a page's offset does not count", {"offset": 90}, 50),
    ("a result that is an item counts twice", {"group_by": "item"}, 100),
    ("a page of 100 items reads the whole budget", {"limit": 100, "group_by": "item"}, 1000),
    ("never more than the whole budget", {"limit": 300, "group_by": "item"}, 1000),
]


@pytest.mark.parametrize(("name", "options", "expected"), POSTINGS_CASES,
                         ids=[case[0] for case in POSTINGS_CASES])
def test_a_hybrid_search_reads_postings_in_proportion_to_its_page(
    name: str, options: dict[str, Any], expected: int
) -> None:
    settings = Settings(fts_candidate_postings=1000, hybrid_postings_per_result=5)
    params = SearchParams(query="q", **options)
    assert fts_postings(params, params.mode, settings) == expected


async def test_full_text_candidates_hold_the_rarest_words_within_the_budget(
    world: World,
) -> None:
    """The words "bread" and "glacier" are in six parts each, and of two words as rare the
    first by name comes first: a budget of six postings admits bread's alone (and so does
    one: always at least one word that occurs), twelve both, a thousand also "note", in
    every part."""

    async def topics(budget: int, query: str = "glaciers of note and bread") -> set[str]:
        settings = world.settings.model_copy(update={"fts_candidate_postings": budget})
        params = SearchParams(query=query, mode="fts", limit=50)
        outcome = await search_module.search(
            world.pool, QueryCache(get_embedder(settings)), settings,
            tenant_id=world.tenant_id, params=params, filter_pool=world.pool)
        return {r["item"]["id"].split("/")[0] for r in outcome.results}

    assert await topics(1) == await topics(6) == {"bread"}
    # A word no part holds is no rarest word: the rarest that occurs still comes along.
    assert await topics(1, "glaciers of note and bread with zyzzyvas") == {"bread"}
    assert await topics(12) == {"bread", "glacier"}
    assert await topics(1000) == set(TOPICS)  # "note" is in every part


async def test_a_hybrid_search_whose_rarest_word_is_too_common_reads_its_two_rarest_together(
    world: World,
) -> None:
    """"glacier" is in six parts, "rise" in twelve (the bread and the volcano notes), and no
    part holds both. With a budget of five postings, a hybrid search's full-text side reads
    only the parts holding both words (none), while a search on full text alone still reads
    the rarest word's six; with a budget of six, the rarest word fits and is read alone.
    Counted as the rows that pass the full-text side's word condition, in the generic plan the
    API's search pool runs; the hybrid search still finds the glaciers, by their vectors."""
    query = "glaciers rise"
    vector = await QueryCache(get_embedder(world.settings)).embed_query(query)

    async def postings_read(mode: str, budget: int) -> int:
        settings = world.settings.model_copy(update={"hybrid_postings_per_result": budget,
                                                     "fts_candidate_postings": budget})
        params = SearchParams(query=query, mode=mode, limit=1)  # a page of one part
        args = search_module.hybrid_args(world.tenant_id, query, vector, mode, 0.7, params,
                                         settings, search_module.FILTER_NONE, None)
        async with world.pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            plan = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + Q["search.hybrid"], *args)
        # The node that applies the word condition: the heap scan behind the word index,
        # or, in this small table, the join over a scan of every part.
        (reader,) = [n for n in plan_nodes(plan if isinstance(plan, list) else json.loads(plan))
                     if any("tenant_lexemes" in n.get(f, "")
                            for f in ("Recheck Cond", "Join Filter", "Filter"))]
        return int(reader["Actual Rows"])

    assert await postings_read("hybrid", 5) == 0
    assert await postings_read("fts", 5) == 6
    assert await postings_read("hybrid", 6) == 6
    settings = world.settings.model_copy(update={"hybrid_postings_per_result": 1})
    outcome = await search_module.search(
        world.pool, QueryCache(get_embedder(settings)), settings, tenant_id=world.tenant_id,
        params=SearchParams(query=query, limit=3), filter_pool=world.pool)
    assert outcome.results[0]["item"]["id"].startswith("glacier/")


async def test_bm25_terms_saturate_and_normalize_length(world: World) -> None:
    async def weight(text: str, word: str) -> float:
        return await world.pool.fetchval(
            "SELECT -(bm25_terms(to_tsvector('english', $1)) <#>"
            " ('{' || lexeme_dim($2) || ':1}/268435456')::sparsevec)", text, word)

    once, twice = await weight("glacier ice", "glacier"), await weight("glacier glacier", "glacier")
    assert 0 < once < twice < 2 * once  # more occurrences weigh more, but less than linearly
    long_text = "glacier " + " ".join(f"word{i}" for i in range(300))
    assert await weight(long_text, "glacier") < once  # the same word counts less in a long part
    assert await weight("glacier ice", "volcano") == 0


async def test_full_text_index_keys_are_tenant_and_word(world: World) -> None:
    """Migration 0007 keys the GIN index by "tenant lexeme", so one tenant's postings of a word
    are a list of their own; the tenant, a number, ends at the first space, so no lexeme can
    make one tenant's key equal another's."""
    keys = await world.pool.fetchval(
        "SELECT tenant_lexemes(7, to_tsvector('english', $1))",
        "O'Brien's glaciers melted; e-mail naïve 7 0")
    lexemes = await world.pool.fetchval(
        "SELECT array_agg(lexeme) FROM unnest(to_tsvector('english', $1))",
        "O'Brien's glaciers melted; e-mail naïve 7 0")
    assert sorted(keys) == sorted(f"7 {lexeme}" for lexeme in lexemes)
    assert "7 glacier" in keys and "7 0" in keys and "70" not in " ".join(keys)


async def test_full_text_candidates_are_read_through_the_tenant_word_index(
    world: World,
) -> None:
    """The search statement's condition must be the index's own expression, or Postgres reads
    every part of the tenant instead; and the tenant must not be an index condition beside
    it, or the plan ANDs the few postings of the keys with a bitmap of every part of the
    tenant (10 ms at 100k parts). Checked on the statement's generic plan, as the API's
    search pool runs it, with a second tenant of a realistic size: 20,000 parts written,
    counted by ANALYZE, and rolled back with the transaction."""
    async with world.pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        try:
            other = await conn.fetchval(
                "INSERT INTO tenants (name) VALUES ('plan-check') RETURNING id")
            await conn.execute("INSERT INTO items (tenant_id, id, content_hash)"
                               " VALUES ($1, 'bulk', 'h')", other)
            await conn.execute(
                "INSERT INTO parts (tenant_id, item_id, version, position, text, content_hash)"
                " SELECT $1, 'bulk', 1, n, 'word' || n % 500 || ' term' || n % 37 || ' common',"
                " 'h' FROM generate_series(1, 20000) n", other)
            # As autovacuum would: move the new rows' keys from GIN's pending list into the
            # index proper (the planner prices a long pending list as a read of all of it).
            await conn.execute("SELECT gin_clean_pending_list('parts_tenant_lexemes')")
            await conn.execute("ANALYZE parts")
            types = ", ".join(f"{t.schema}.{t.name}" for t in
                              (await conn.prepare(Q["search.hybrid"])).get_parameters())
            await conn.execute(f"PREPARE plan_check ({types}) AS {Q['search.hybrid']}")
            try:
                await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                nulls = ", ".join(["NULL"] * types.count(","))
                plan = await conn.fetchval(
                    f"EXPLAIN (FORMAT JSON) EXECUTE plan_check (NULL, {nulls})")
            finally:
                await conn.execute("DEALLOCATE plan_check")
        finally:
            await transaction.rollback()
    nodes = plan_nodes(plan if isinstance(plan, list) else json.loads(plan))
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes}
    assert ("Bitmap Index Scan", "parts_tenant_lexemes") in scans, scans
    assert ("BitmapAnd", None) not in scans, scans
    assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "parts"
                   for n in nodes), scans


# --- Through the API, on real data processed by a real worker.

TOPICS = {
    "glacier": "Glaciers carve valleys as the ice flows downhill under its own weight.",
    "volcano": "Volcanoes erupt when magma rises through cracks in the crust.",
    "bread": "Sourdough bread rises because wild yeast ferments the dough.",
    "tide": "The moon's gravity pulls the oceans and raises the tides twice a day.",
    "bee": "Honey bees dance to tell each other where the flowers are.",
    "comet": "A comet's tail points away from the sun, pushed by the solar wind.",
}


@dataclass
class World:
    """One corpus for the read-only tests of this module: ingesting it through a real worker
    takes seconds, so it is built once, in a database of its own."""

    settings: Settings
    pool: asyncpg.Pool
    api_url: str
    tenant_id: int
    http: httpx.AsyncClient
    items: dict[str, dict[str, Any]]


OLD = datetime(2020, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
async def world(pg_admin_dsn: str, template_dsn: str, redis_url: str,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    from api.main import create_app

    name = f"t_search_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(pg_admin_dsn)
    await conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    await conn.close()
    settings = Settings(
        database_url=pg_admin_dsn.replace("/postgres?", f"/{name}?"), redis_url=redis_url,
        data_dir=tmp_path_factory.mktemp("search"), db_pool_max_size=5,
        queue_name=f"memmill:test:{uuid.uuid4().hex[:10]}")
    assert settings.database_url
    pool = await create_pool(settings.database_url, max_size=5)
    tenant_id = await tenants.ensure_tenant(pool, "default")
    key = tenants.new_key()
    await tenants.add_key(pool, tenant_id, key)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    api_url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {key}"}) as http:
        items = await _ingest_corpus(http, settings, pool, tenant_id)
        yield World(settings, pool, api_url, tenant_id, http, items)
    server.should_exit = True
    await task
    await pool.close()
    conn = await asyncpg.connect(pg_admin_dsn)
    await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    await conn.close()


async def _ingest_corpus(http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
                         tenant_id: int) -> dict[str, dict[str, Any]]:
    """36 items: six topics in six variants, tagged by topic, shard and language, of two
    kinds, the bee notes made long ago; processed by a real worker, words counted."""
    items: dict[str, dict[str, Any]] = {}
    for t, (topic, text) in enumerate(TOPICS.items()):
        for v in range(6):
            item_id = f"{topic}/{v}"
            items[item_id] = {
                "id": item_id,
                "content": f"{text} Variant {v} of note {topic}.",
                "tags": {"topic": topic, "shard": f"s{(t * 6 + v) % 9}",
                         "lang": "en" if v % 2 else "fr"},
            }
    r = await http.post("/v1/items/batch", json={"items": list(items.values())})
    assert r.status_code == 202, r.text
    assert not r.json()["refused"]
    await drain(settings, pool)
    await pool.execute("UPDATE items SET kind = 'note' WHERE id LIKE '%/1' OR id LIKE '%/3'")
    await pool.execute("UPDATE items SET created_at = $1, updated_at = $1 WHERE id LIKE 'bee/%'",
                       OLD)
    await text_stats.refresh(pool, tenant_id)
    return items


async def search(http: httpx.AsyncClient, query: str, **options: Any) -> list[dict[str, Any]]:
    r = await http.post("/v1/search", json={"query": query, "track": False, **options})
    assert r.status_code == 200, r.text
    return r.json()["results"]


async def test_full_text_ranks_by_bm25_with_every_word_optional(world: World) -> None:
    http = world.http
    # No part has "unicorn": an AND of every word (websearch_to_tsquery) would find nothing.
    hits = await search(http, "glaciers and unicorns", mode="fts")
    assert hits and {h["item"]["id"].split("/")[0] for h in hits} == {"glacier"}
    # "note" and "variant" are in every part, "bread" in six: the rare word decides.
    hits = await search(http, "variant note about bread", mode="fts", limit=6)
    assert {h["item"]["id"].split("/")[0] for h in hits} == {"bread"}
    top = hits[0]
    assert top["scores"]["fts"] == pytest.approx(max(h["scores"]["fts"] for h in hits))
    assert top["scores"]["fts_rank"] is not None
    assert top["scores"]["vector"] is None and top["scores"]["vector_rank"] is None
    assert "<<bread>>" in top["snippet"].lower()
    # Only stop words: nothing to look for, no error.
    assert await search(http, "the and of", mode="fts") == []


async def test_hybrid_explains_every_result(world: World) -> None:
    http = world.http
    hits = await search(http, "why does dough rise", limit=10)
    assert hits[0]["item"]["id"].startswith("bread/")
    finals = [h["scores"]["final"] for h in hits]
    assert finals == sorted(finals, reverse=True)
    for hit in hits:
        scores = hit["scores"]
        assert 0 <= scores["fused"] <= 1 and 0 <= scores["final"] <= 1
        assert scores["vector_rank"] is not None  # every candidate is scored on both sides
        assert (scores["fts"] is None) == (scores["fts_rank"] is None)
    assert hits[0]["item"]["tags"]["topic"] == "bread" and hits[0]["item"]["version"] == 1
    rrf = await search(http, "why does dough rise", fusion="rrf", limit=3)
    assert rrf[0]["item"]["id"].startswith("bread/")


async def test_pages_and_grouping_by_item(world: World) -> None:
    http = world.http
    everything = await search(http, "ice and magma", limit=20)
    page = await search(http, "ice and magma", limit=5, offset=5)
    assert [h["part_id"] for h in page] == [h["part_id"] for h in everything[5:10]]
    by_item = await search(http, "ice and magma", limit=50, group_by="item")
    ids = [h["item"]["id"] for h in by_item]
    assert len(ids) == len(set(ids)) == len(world.items)


@pytest.mark.parametrize("blend", [0.0, 0.1, 0.5, 1.0])
async def test_a_page_is_the_head_of_the_whole_ranking_whatever_the_blend(
    world: World, blend: float,
) -> None:
    """Only the candidates that recency and use could lift onto the page get their item looked
    up; leaving the others out must never change a page, however far the blend lets the
    signals move a score (use varies here from item to item)."""
    pool, http = world.pool, world.http
    before = await pool.fetch("SELECT id, access_count FROM items WHERE tenant_id = $1",
                              world.tenant_id)
    await pool.execute("UPDATE items SET access_count = hashtext(id) & 63 WHERE tenant_id = $1",
                       world.tenant_id)
    try:
        for group_by in ("part", "item"):
            options = {"blend": blend, "group_by": group_by}
            whole = await search(http, "ice and magma", limit=100, **options)
            assert len(whole) > 10
            for limit, offset in [(1, 0), (3, 0), (5, 5), (4, 17)]:
                page = await search(http, "ice and magma", limit=limit, offset=offset,
                                    **options)
                assert [h["part_id"] for h in page] == [
                    h["part_id"] for h in whole[offset:offset + limit]]
    finally:
        await pool.execute(
            "UPDATE items i SET access_count = b.n FROM unnest($1::text[], $2::bigint[]) b(id, n)"
            " WHERE i.tenant_id = $3 AND i.id = b.id",
            [r["id"] for r in before], [r["access_count"] for r in before], world.tenant_id)


def _family(hits: list[dict[str, Any]]) -> set[str]:
    return {h["item"]["id"] for h in hits}


FILTERS: list[tuple[str, dict[str, Any]]] = [
    ("one tag", {"tags": {"topic": "tide"}}),
    ("tag any of", {"tags": {"shard": ["s1", "s4"]}}),
    ("two tags", {"tags": {"lang": "en", "shard": ["s0", "s2", "s3", "s5"]}}),
    ("kind", {"kinds": ["note"]}),
    ("item ids", {"item_ids": ["bee/2", "comet/5", "no/such"]}),
    ("system and missing tag", {"tags": {"nope": "x"}}),
    ("kind and tag", {"kinds": ["text"], "tags": {"topic": ["bee", "comet"]}}),
    ("valid only", {"valid_only": True}),
]


def _expected(items: dict[str, dict[str, Any]], kinds: dict[str, str],
              filters: dict[str, Any]) -> set[str]:
    def passes(item: dict[str, Any]) -> bool:
        for key, wanted in filters.get("tags", {}).items():
            options = wanted if isinstance(wanted, list) else [wanted]
            if item["tags"].get(key) not in options:
                return False
        if "kinds" in filters and kinds[item["id"]] not in filters["kinds"]:
            return False
        return "item_ids" not in filters or item["id"] in filters["item_ids"]

    return {i for i, item in items.items() if passes(item)}


@pytest.mark.parametrize("exact", [2000, 0], ids=["exact", "checked"])
@pytest.mark.parametrize(("name", "filters"), FILTERS, ids=[f[0] for f in FILTERS])
async def test_filters_match_exact_filtering(
    world: World, name: str, filters: dict[str, Any], exact: int
) -> None:
    """Each filter in each mode returns exactly the parts that pass it, ranked as exact
    filtering ranks them: whether the search ranks the passing parts one by one ("exact":
    those of the listed items, or those carrying the tags) or checks each vector candidate
    during the index scan ("checked")."""
    settings = world.settings
    # The app holds this very settings object.
    saved = settings.search_exact_items, settings.search_exact_parts
    settings.search_exact_items = settings.search_exact_parts = exact
    try:
        await _check_filter(world, name, filters, exact)
    finally:
        settings.search_exact_items, settings.search_exact_parts = saved


async def _check_filter(world: World, name: str, filters: dict[str, Any],
                        exact: int) -> None:
    http, pool, settings = world.http, world.pool, world.settings
    kinds = {r["id"]: r["kind"] for r in await pool.fetch("SELECT id, kind FROM items")}
    allowed = _expected(world.items, kinds, filters)
    query = "ice valleys and ocean tides"
    for mode in ("semantic", "hybrid", "fts"):
        hits = await search(http, query, mode=mode, limit=100, filters=filters)
        assert _family(hits) <= allowed, (name, mode)
        if mode != "fts":  # every part has a vector, so these see every allowed part
            assert _family(hits) == allowed, (name, mode)
    # The semantic ranking (relevance alone: blend 0) is exact filtering's: the nearest
    # allowed parts, by numpy.
    hits = await search(http, query, mode="semantic", limit=10, filters=filters, blend=0)
    vector = await QueryCache(get_embedder(settings)).embed_query(query)
    rows = await pool.fetch("SELECT id, embedding FROM parts WHERE item_id = ANY($1::text[])",
                            sorted(allowed))
    distances = {r["id"]: 1 - float(np.dot(r["embedding"].to_numpy(), vector)) for r in rows}
    exact = sorted(distances, key=distances.__getitem__)[:10]
    found = [h["part_id"] for h in hits]
    if exact:  # the passing parts are ranked one by one: exact by construction
        assert found == exact, name
    else:  # the index scan is approximate; the issue asks for Recall@10 >= 0.95
        assert len(set(found) & set(exact)) >= 0.95 * len(exact), name


async def test_filter_by_time_ranges(world: World) -> None:
    cut = (OLD + timedelta(days=1)).isoformat()
    before = await search(world.http, "flowers", limit=100, filters={"created_before": cut})
    after = await search(world.http, "flowers", limit=100, filters={"updated_after": cut})
    assert {h["item"]["id"].split("/")[0] for h in before} == {"bee"}
    assert after and "bee" not in {h["item"]["id"].split("/")[0] for h in after}


async def test_search_counts_accesses_unless_told_not_to(world: World) -> None:
    http, pool = world.http, world.pool
    counts = "SELECT id, access_count FROM items WHERE id LIKE 'comet/%'"
    before = dict(await pool.fetch(counts))
    r = await http.post("/v1/search", json={"query": "comet tail", "limit": 3,
                                             "filters": {"tags": {"topic": "comet"}},
                                             "track": False})
    assert r.status_code == 200
    await asyncio.sleep(0.3)
    assert dict(await pool.fetch(counts)) == before
    r = await http.post("/v1/search", json={"query": "comet tail", "limit": 3,
                                             "filters": {"tags": {"topic": "comet"}}})
    returned = {h["item"]["id"] for h in r.json()["results"]}
    assert len(returned) == 3
    expected = {i: n + (i in returned) for i, n in before.items()}
    for _ in range(50):  # the touch runs after the response
        if dict(await pool.fetch(counts)) == expected:
            break
        await asyncio.sleep(0.05)
    assert dict(await pool.fetch(counts)) == expected


async def test_no_search_reaches_another_tenant(world: World) -> None:
    """The other tenant stores the very same text under the same ids; whatever it searches
    for, with whatever filter, it gets only its own parts, and the first tenant's word
    statistics do not leak into its scores."""
    other_id = await tenants.ensure_tenant(world.pool, "other")
    key = tenants.new_key()
    await tenants.add_key(world.pool, other_id, key)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=world.api_url, headers=headers, timeout=60) as other:
        for mode in ("hybrid", "fts", "semantic"):
            hits = await search(other, TOPICS["glacier"], mode=mode)
            assert hits == [], mode
        hits = await search(other, TOPICS["glacier"],
                            filters={"item_ids": ["glacier/0"], "tags": {"topic": "glacier"}})
        assert hits == []
    mine = await search(world.http, TOPICS["glacier"], filters={"item_ids": ["glacier/0"]})
    assert mine and _family(mine) == {"glacier/0"}


async def test_a_filter_is_ranked_exactly_up_to_a_bound_that_grows_with_the_tenant(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str], settings: Settings
) -> None:
    """Up to max(MEMMILL_SEARCH_EXACT_ITEMS, 8·√parts) passing items, the filter's items are
    listed and their parts ranked exactly; past it, or with the setting at 0, each HNSW
    candidate is checked (test_filters_match_exact_filtering checks both give the same)."""
    tenant_id = tenant[0]
    async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        for n in range(4):
            r = await http.post("/v1/items", json={"id": f"f{n}", "content": f"Tide log {n}.",
                                                   "tags": {"team": "sea"}})
            assert r.status_code == 202, r.text
        await drain(settings, pool)
        await text_stats.refresh(pool, tenant_id)  # 4 parts: 8·√4 = 16 items
        sea = SearchFilters(tags={"team": "sea"})
        mode, listed = await filtered_items(pool, tenant_id, sea, 1)
        assert mode == FILTER_LISTED and sorted(listed or []) == [f"f{n}" for n in range(4)]
        assert await filtered_items(pool, tenant_id, sea, 0) == (FILTER_CHECKED, None)
        assert await filtered_items(pool, tenant_id, SearchFilters(tags={"team": "x"}), 1) == (
            FILTER_LISTED, [])
        # With no parts counted the bound is the setting alone.
        await pool.execute("UPDATE text_stats SET parts = 0 WHERE tenant_id = $1", tenant_id)
        assert await filtered_items(pool, tenant_id, sea, 3) == (FILTER_CHECKED, None)
        assert (await filtered_items(pool, tenant_id, sea, 4))[0] == FILTER_LISTED
        r = await http.post("/v1/search", json={"query": "tide log", "track": False,
                                                 "filters": {"tags": {"team": "sea"}}})
        assert r.status_code == 200 and len(r.json()["results"]) == 4


async def test_word_statistics_follow_changes(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str], settings: Settings
) -> None:
    tenant_id = tenant[0]
    async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        for n, text in enumerate(["A glacier.", "Glacier ice.", "Sea ice."]):
            r = await http.post("/v1/items", json={"id": f"n{n}", "content": text})
            assert r.status_code == 202
        await drain(settings, pool)
        assert await text_stats.refresh_stale(pool, interval_s=0) == [tenant_id]
        assert await text_stats.refresh_stale(pool, interval_s=0) == []  # nothing new since
        glacier = ("SELECT parts FROM lexeme_stats WHERE tenant_id = $1"
                   " AND lexeme = 'glacier'")
        assert await pool.fetchval(glacier, tenant_id) == 2
        r = await http.post("/v1/items", json={"id": "n3", "content": "A new glacier."})
        await drain(settings, pool)
        shown = (await http.get("/v1/jobs/stats")).json()["text_stats"]
        assert shown["parts"] == 3 and shown["fresh"] is False
        assert await text_stats.refresh_stale(pool, interval_s=3600) == []  # too recent
        assert await text_stats.refresh_stale(pool, interval_s=0) == [tenant_id]
        shown = (await http.get("/v1/jobs/stats")).json()["text_stats"]
        assert shown["parts"] == 4 and shown["fresh"] is True
    assert await pool.fetchval(glacier, tenant_id) == 3
    assert await pool.fetchval("SELECT parts FROM text_stats WHERE tenant_id = $1",
                               tenant_id) == 4


async def test_snippets_highlight_the_match_wherever_it_lies(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str], settings: Settings
) -> None:
    """ts_headline first gets only the stretch around where a query lexeme first appears in
    the text; when that stretch holds no match (the word is capitalized, or the lexeme first
    appears inside another word), the snippet still comes from the whole part."""
    filler = "The quiet harbour town keeps its boats painted blue every spring. " * 7
    texts = {
        "late": filler + "Far out, a glacier calves into the bay.",
        "capitalized": filler + "Sourdough bread rises slowly overnight.",
        "inside": "Understudied harbours. " + filler + "Two studies measured the tides.",
    }
    async with httpx.AsyncClient(base_url=api_url, timeout=60,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        for item_id, text in texts.items():
            r = await http.post("/v1/items", json={"id": item_id, "content": text})
            assert r.status_code == 202, r.text
        await drain(settings, pool)
        await text_stats.refresh(pool, tenant[0])
        for query, item_id, marked in [("glacier", "late", "<<glacier>>"),
                                       ("sourdough", "capitalized", "<<Sourdough>>"),
                                       ("studies", "inside", "<<studies>>")]:
            hits = await search(http, query, mode="fts")
            assert [h["item"]["id"] for h in hits] == [item_id], query
            assert len(texts[item_id]) > 400
            assert marked in hits[0]["snippet"], (query, hits[0]["snippet"])
            assert len(hits[0]["snippet"]) < 300


def test_settings_reject_an_unknown_fusion() -> None:
    with pytest.raises(ValueError, match="search_fusion"):
        Settings(search_fusion="sum")  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["hybrid_postings_per_result", "fts_candidate_postings"])
def test_settings_reject_a_postings_budget_below_one(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Settings(**{field: 0})
