"""Corpus statistics: in how many parts of a tenant each word occurs (BM25's idf), and how
many parts carry each tag (how a search applies a tag filter, see search.sql).

A word's weight in a query (its idf) depends on how rare it is in the tenant's parts. Counting
that on every write would make every ingest transaction update the same rows for common words;
counting it on every query would scan the corpus. So the sweeper recounts a tenant in the
background (one `ts_stat` pass, about 0.4 s per 10k parts) when its parts changed and its last
count is older than `MEMMILL_TEXT_STATS_INTERVAL_S` and 20 times what that count took. Until
the first count every word weighs the same, and a word new since the last count is taken as
the rarest: both cost ranking quality for a few seconds, never correctness.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import asyncpg

from pipeline.db import Q

log = logging.getLogger(__name__)

# Each recount joins two sets of up to a row per word or per item. Planned from statistics
# taken while the tenant was small (a bulk load commits before the next ANALYZE counts it, and
# the sweeper recounts at once; a worker's prepared statement may also run a generic plan),
# such a join looked tiny: a nested loop, which at 100k parts compared 45k items with 33k
# counts for 15 minutes, where a hash join takes 0.1 s. These statements never want a nested
# loop but for a LATERAL call, which has no other way.
RECOUNT_SETTINGS = "SET LOCAL enable_nestloop = off"


async def refresh(pool: asyncpg.Pool, tenant_id: int) -> int | None:
    """Recount one tenant; returns its part count, or None if another process is at it."""
    started = time.perf_counter()
    async with pool.acquire() as conn, conn.transaction():
        if not await conn.fetchval(Q["text_stats.try_lock_tenant"], tenant_id):
            return None
        await conn.execute(RECOUNT_SETTINGS)
        await conn.execute(Q["text_stats.refresh_lexemes"], tenant_id)
        await conn.execute(Q["text_stats.refresh_tags"], tenant_id)
        parts: int = await conn.fetchval(Q["text_stats.record_refresh"], tenant_id)
    log.info("text statistics of tenant %d: %d parts recounted in %.2f s",
             tenant_id, parts, time.perf_counter() - started)
    return parts


async def refresh_stale(pool: asyncpg.Pool, *, interval_s: float) -> list[int]:
    """Recount every tenant whose parts changed since a count older than `interval_s`."""
    tenants = [r["id"] for r in await pool.fetch(Q["text_stats.stale_tenants"], interval_s)]
    return [t for t in tenants if await refresh(pool, t) is not None]


async def state(pool: asyncpg.Pool, tenant_id: int) -> dict[str, Any]:
    """Parts counted at the last recount, when, and whether no part arrived since."""
    return dict(await pool.fetchrow(Q["text_stats.state"], tenant_id))
