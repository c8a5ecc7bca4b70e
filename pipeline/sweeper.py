"""The sweeper: makes the ledger and the queue agree again after anything went wrong.

- running jobs whose lease expired (worker killed, machine lost) go back to queued;
- queued jobs that are due and were not enqueued recently are enqueued again (Redis restarted,
  flushed, or the enqueue after commit failed). A job still in Redis is not duplicated: the
  queue refuses a second job with the same id, and the ledger claim skips a job already taken;
- a reindex whose every part has its new vector is finished (see `pipeline.reindex`);
- tenants whose parts changed get their word statistics recounted (see `pipeline.text_stats`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import asyncpg

from pipeline import jobs, reindex, text_stats
from pipeline.db import Q
from pipeline.jobs import Enqueuer, JobRef
from pipeline.settings import Settings

log = logging.getLogger(__name__)

SWEEP_BATCH = 500


@dataclass(frozen=True)
class SweepResult:
    reclaimed: int
    reenqueued: int


async def sweep_once(pool: asyncpg.Pool, queue: Enqueuer, settings: Settings) -> SweepResult:
    async with pool.acquire() as conn, conn.transaction():
        expired = await conn.fetch(Q["jobs.reclaim_expired"], SWEEP_BATCH)
        if expired:
            await conn.execute(Q["jobs.mark_lost_attempts"], [r["id"] for r in expired])
    due = await pool.fetch(Q["jobs.due_unenqueued"], settings.enqueue_grace_s, SWEEP_BATCH)
    # Reclaimed jobs are queued and unenqueued now, so the second query already returns them.
    refs = [JobRef(r["id"], r["kind"], r["attempts"]) for r in due]
    sent = await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name)
    await reindex.finish_if_complete(pool)
    await text_stats.refresh_stale(pool, interval_s=settings.text_stats_interval_s)
    if expired:
        log.warning("sweeper reclaimed %d jobs whose lease expired", len(expired))
    if sent:
        log.info("sweeper enqueued %d jobs", sent)
    return SweepResult(reclaimed=len(expired), reenqueued=sent)


async def sweep_forever(pool: asyncpg.Pool, queue: Enqueuer, settings: Settings) -> None:
    while True:
        try:
            await sweep_once(pool, queue, settings)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("sweep failed, will try again: %s", exc)
        except Exception:
            # The sweeper is what recovers lost work: it must not die. An exception escaping
            # here (asyncpg raises InternalClientError while Postgres restarts) would end the
            # task silently, and this worker would never sweep again.
            log.exception("sweep failed unexpectedly, will try again")
        await asyncio.sleep(settings.sweep_interval_s)
