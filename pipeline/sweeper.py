"""The sweeper: makes the ledger and the queue agree again after anything went wrong.

- running jobs whose lease expired (worker killed, machine lost) go back to queued, and the
  queue forgets the delivery that worker held (see `Forget`);
- queued jobs that are due and were not enqueued recently are enqueued again (Redis restarted,
  flushed, or the enqueue after commit failed). A job still in Redis is not duplicated: the
  queue refuses a second job with the same id, and the ledger claim skips a job already taken;
- a reindex whose every part has its new vector is finished (see `pipeline.reindex`);
- tenants whose parts changed get their word statistics recounted (see `pipeline.text_stats`);
- tenants whose memory upkeep is due get their runs (see `pipeline.memory.upkeep.schedule`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg

from pipeline import aggregates, jobs, reindex, text_stats
from pipeline.db import Q
from pipeline.fairness import FairQueueing
from pipeline.jobs import Enqueuer, JobRef
from pipeline.memory.upkeep import schedule
from pipeline.settings import Settings

log = logging.getLogger(__name__)

SWEEP_BATCH = 500

# Removes deliveries (queue job ids) from the queue: its entry, its job, its in-progress and
# retry markers. A worker killed mid-job leaves its delivery behind, marked in progress for the
# longest job timeout plus 10 s (arq's rule: 30 minutes with OCR's 1800 s). The queue counted it
# all that time, and when the marker expired a worker ran it again, found it over its one try
# and logged "max retries exceeded" for a job the ledger had long since done. The ledger knows
# which delivery died: the one that claimed the attempt it reclaims, so it is removed at once.
# The worker passes this in (pipeline/ does not know arq's keys).
Forget = Callable[[Sequence[str]], Awaitable[None]]


def dead_deliveries(rows: Sequence[asyncpg.Record]) -> list[str]:
    """The queue job ids of reclaimed or released rows' last attempts: attempt n was claimed
    by the delivery enqueued when the row had n - 1 attempts (`JobRef.queue_job_id`)."""
    return [JobRef(r["id"], r["kind"], r["attempts"] - 1, tenant_id=r["tenant_id"]).queue_job_id
            for r in rows if r["attempts"] > 0]


async def forget_quietly(forget: Forget | None, queue_job_ids: Sequence[str]) -> None:
    """Forget deliveries; a queue that cannot be reached is only logged: the delivery then
    expires on its own, as it did before, and the ledger stays right either way."""
    if forget is None or not queue_job_ids:
        return
    try:
        await forget(queue_job_ids)
    except Exception as exc:  # noqa: BLE001 - Redis down must not stop a sweep or a shutdown
        log.warning("could not remove %d dead deliveries from the queue: %s",
                    len(queue_job_ids), exc)


@dataclass(frozen=True)
class SweepResult:
    reclaimed: int
    reenqueued: int


async def sweep_once(
    pool: asyncpg.Pool, queue: Enqueuer, settings: Settings, *, forget: Forget | None = None
) -> SweepResult:
    async with pool.acquire() as conn, conn.transaction():
        expired = await conn.fetch(Q["jobs.reclaim_expired"], SWEEP_BATCH)
        if expired:
            await conn.execute(Q["jobs.mark_lost_attempts"], [r["id"] for r in expired])
    await forget_quietly(forget, dead_deliveries(expired))
    due = await pool.fetch(Q["jobs.due_unenqueued"], settings.enqueue_grace_s, SWEEP_BATCH)
    # Reclaimed jobs are queued and unenqueued now, so the second query already returns them.
    refs = [JobRef(r["id"], r["kind"], r["attempts"], tenant_id=r["tenant_id"]) for r in due]
    sent = await jobs.enqueue(pool, queue, refs, queue_name=settings.queue_name,
                              fair=FairQueueing.of(settings))
    await reindex.finish_if_complete(pool)
    # Keeps the dashboard's and /metrics' counts current even while no page is open.
    await aggregates.fold(pool)
    await text_stats.refresh_stale(pool, interval_s=settings.text_stats_interval_s)
    await schedule.start_due(pool, queue, settings)
    if expired:
        log.warning("sweeper reclaimed %d jobs whose lease expired", len(expired))
    if sent:
        # Routine while a backlog is older than the grace (the queue refuses the duplicates).
        log.debug("sweeper enqueued %d jobs", sent)
    return SweepResult(reclaimed=len(expired), reenqueued=sent)


async def sweep_forever(
    pool: asyncpg.Pool, queue: Enqueuer, settings: Settings, *, forget: Forget | None = None
) -> None:
    while True:
        try:
            await sweep_once(pool, queue, settings, forget=forget)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("sweep failed, will try again: %s", exc)
        except Exception:
            # The sweeper is what recovers lost work: it must not die. An exception escaping
            # here (asyncpg raises InternalClientError while Postgres restarts) would end the
            # task silently, and this worker would never sweep again.
            log.exception("sweep failed unexpectedly, will try again")
        await asyncio.sleep(settings.sweep_interval_s)
