"""Scheduled upkeep: each tenant's consolidation on its policy's cron schedule and a prune
every day, started by the sweeper that every worker runs.

A tenant gets its schedule row the first time a sweep sees it (its first runs are due at the
next scheduled times, not at once). A sweep claims a due row by moving its times forward
with a compare and set, so of several workers sweeping at once exactly one starts the runs."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import asyncpg

from pipeline import jobs
from pipeline.db import Q
from pipeline.jobs import Enqueuer
from pipeline.memory import policy
from pipeline.memory.upkeep import runs
from pipeline.settings import Settings

log = logging.getLogger(__name__)

PRUNE_EVERY = timedelta(days=1)
BATCH = 100


async def start_due(pool: asyncpg.Pool, queue: Enqueuer, settings: Settings) -> int:
    """Start the runs that are due; returns how many started."""
    now = datetime.now(UTC)
    for row in await pool.fetch(Q["upkeep.unscheduled"], BATCH):
        rules = await policy.load(pool, row["id"], settings)
        await pool.execute(Q["upkeep.schedule_insert"], row["id"], rules.next_run(now),
                           now + PRUNE_EVERY)
    started = 0
    for due in await pool.fetch(Q["upkeep.due"], BATCH):
        tenant_id = due["tenant_id"]
        rules = await policy.load(pool, tenant_id, settings)
        consolidate = due["next_consolidation"] <= now
        prune = due["next_prune"] <= now
        next_consolidation = rules.next_run(now) if consolidate else due["next_consolidation"]
        next_prune = now + PRUNE_EVERY if prune else due["next_prune"]
        async with pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(Q["upkeep.claim_due"], tenant_id, due["next_consolidation"],
                                   due["next_prune"], next_consolidation, next_prune) is None:
                continue  # another worker claimed it
            if not due["has_memories"]:
                continue
            steps = [*(["prune"] if prune else []), *(runs.CONSOLIDATION if consolidate else [])]
            try:
                async with conn.transaction():
                    run_id, refs = await runs.start(
                        conn, tenant_id=tenant_id, steps=steps, dry_run=False, scope={},
                        options={}, trigger="schedule", key_id=None, settings=settings)
            except runs.RunGoing as going:
                # Its turn passes: the next one comes on the schedule.
                log.info("tenant %s: upkeep run %s still going; the scheduled run is skipped",
                         tenant_id, going.run_id)
                continue
        await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
        log.info("tenant %s: scheduled upkeep run %s (%s)", tenant_id, run_id, ", ".join(steps))
        started += 1
    return started
