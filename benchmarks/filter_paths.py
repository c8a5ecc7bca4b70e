"""Filtered search: ranking a filter's parts exactly against checking HNSW candidates.

A tag filter that few parts pass is searched by reading those parts from the index of the
tags they carry (migration 0008) and ranking them one by one; a broad one by scanning the
HNSW index and checking each candidate's tags (pipeline/search.py, sql/queries/search.sql).
The first reads every part that passes, the second about (candidates / share that passes)
index entries, so where one overtakes the other depends on the corpus size. This prints, for
each size and each share of items a tag filter keeps (shards s00..s{share-1} of
benchmarks/search_latency.py's corpus: SciFact parts repeated with real vectors), the p50 of
the search function (hybrid, limit 10, query embeddings cached) down each path, forced with
MEMMILL_SEARCH_EXACT_PARTS, then with the default settings, and the path the default bound,
max(MEMMILL_SEARCH_EXACT_PARTS, 16·√parts) parts, picks from the tag statistics.

    .venv/bin/python benchmarks/filter_paths.py [--sizes 100000] [--shares 1,3,10,30]
        [--queries 60] [--port 8795]
"""

from __future__ import annotations

import os
import sys

# As in search_latency.py: the repository root first, so `benchmarks.*` imports and this
# folder's queue.py does not shadow the standard library's.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = os.path.dirname(os.path.abspath(sys.path[0]))

import argparse
import asyncio
import json
import signal
import tempfile
import time
from pathlib import Path

import asyncpg
import numpy as np

from benchmarks.ingest import start_memmill, wait_for_api
from benchmarks.search_latency import grow, load_queries, load_scifact, refresh_text_stats
from pipeline import db
from pipeline import search as search_mod
from pipeline.providers.embeddings import QueryCache, get_embedder
from pipeline.reindex import model_key
from pipeline.settings import Settings

ROUNDS = 2  # passes over the queries per path; the first one only warms the buffers


async def p50_ms(filters: search_mod.SearchFilters, settings: Settings,
                 search_pool: asyncpg.Pool, pool: asyncpg.Pool, cache: QueryCache, tenant: int,
                 queries: list[str]) -> float:
    """The search function's median time over the queries with this filter."""
    latencies: list[float] = []
    for round_ in range(ROUNDS):
        for query in queries:
            params = search_mod.SearchParams(query=query, filters=filters)
            started = time.perf_counter()
            await search_mod.search(search_pool, cache, settings, tenant_id=tenant,
                                    params=params, filter_pool=pool)
            if round_:
                latencies.append((time.perf_counter() - started) * 1000)
    return float(np.percentile(latencies, 50))


async def benchmark(args: argparse.Namespace, dsn: str) -> None:
    settings = Settings()
    embedder = get_embedder(settings)
    await embedder.warm_up()
    queries = load_queries(args.queries)
    cache = QueryCache(embedder, size=1024)
    for query in queries:
        await cache.embed_query(query)
    corpus = load_scifact()
    pool = await db.create_pool(dsn, min_size=1, max_size=2)
    search_pool = await db.create_pool(dsn, min_size=1, max_size=2, generic_plans=True,
                                       ef_search=settings.hnsw_ef_search)
    tenant = await pool.fetchval("SELECT id FROM tenants WHERE name = $1", settings.default_tenant)
    await pool.execute("UPDATE embedding_index SET model = $1", model_key(settings))
    have = 0
    try:
        for size in args.sizes:
            print(f"\nloading {size - have:,} parts (to {size:,})…", flush=True)
            await grow(dsn, corpus, tenant, have, size)
            have = size
            await refresh_text_stats(pool, tenant)
            print(f"{size:,} parts\n"
                  f"{'share':>6} {'items':>7} {'parts':>7} {'exact ms':>9} {'checked ms':>11}"
                  f" {'default ms':>11}  default picks", flush=True)
            stored = await pool.fetchval("SELECT parts FROM text_stats WHERE tenant_id = $1",
                                         tenant)
            bound = max(settings.search_exact_parts, round(16 * stored ** 0.5))  # as SQL
            for share in args.shares:
                tags = {"shard": [f"s{i:02d}" for i in range(share)]}
                items = await pool.fetchval(
                    "SELECT count(*) FROM items WHERE tenant_id = $1 AND tags @@ $2::jsonpath",
                    tenant, search_mod.tags_predicate(tags))
                parts = await pool.fetchval(
                    "SELECT count(*) FROM parts WHERE tenant_tags @@ $1::jsonpath",
                    search_mod.tags_predicate(tags, tenant))
                estimate = await pool.fetchval("SELECT search_tag_estimate($1, $2::jsonb)",
                                               tenant, tags)
                timed = [await p50_ms(search_mod.SearchFilters(tags=tags), forced, search_pool,
                                      pool, cache, tenant, queries)
                         for forced in (Settings(search_exact_parts=10**9),
                                        Settings(search_exact_parts=0), settings)]
                picks = "exact" if estimate <= bound and parts <= bound else "checked"
                print(f"{share:>5}% {items:>7,} {parts:>7,} {timed[0]:>9.2f} {timed[1]:>11.2f}"
                      f" {timed[2]:>11.2f}  {picks} (bound {bound:,})", flush=True)
    finally:
        await pool.close()
        await search_pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000",
                        help="comma-separated part counts, measured in increasing order")
    parser.add_argument("--shares", default="1,3,10,30",
                        help="comma-separated percentages of items the filter keeps")
    parser.add_argument("--queries", type=int, default=60, help="SciFact test queries to use")
    parser.add_argument("--port", type=int, default=8795)
    args = parser.parse_args()
    args.sizes = sorted({int(s) for s in args.sizes.split(",")})
    args.shares = [int(s) for s in args.shares.split(",")]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with tempfile.TemporaryDirectory(prefix="memmill-filters-") as tmp:
        data_dir = Path(tmp)
        up = start_memmill(data_dir, args.port, 1)
        try:
            wait_for_api(f"http://127.0.0.1:{args.port}", data_dir)
            dsn = json.loads((data_dir / "runtime.json").read_text())["database_url"]
            asyncio.run(benchmark(args, dsn))
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(timeout=60)


if __name__ == "__main__":
    main()
